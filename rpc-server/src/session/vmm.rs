//! Virtual memory management for a session (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`...):
//! physical allocations under client-chosen ids, counted in the quota; every range checked
//! against the session's own reservations and mappings before the driver sees it, so a tenant can
//! map, unmap or free only what it made.

use std::collections::{BTreeMap, HashMap};

use flyt_protocol::CudaError;
use flyt_protocol::ops::{rep, req};

use super::{MAX_HANDLES, Responder, Session};
use crate::backend::Device;
use crate::memory::RangeKind;

/// One mapping: its length.
#[derive(Clone, Copy)]
struct Mapping {
    len: u64,
}

/// The session's reservations, physical allocations and mappings.
pub struct VmmTable<D: Device> {
    reservations: BTreeMap<u64, u64>,
    handles: HashMap<u64, (D::MemHandle, u64)>,
    mappings: BTreeMap<u64, Mapping>,
}

impl<D: Device> Default for VmmTable<D> {
    fn default() -> Self {
        Self { reservations: BTreeMap::new(), handles: HashMap::new(), mappings: BTreeMap::new() }
    }
}

impl<D: Device> VmmTable<D> {
    /// Why the session cannot move, if virtual memory management holds it.
    pub(super) fn move_blocker(&self) -> Option<String> {
        (!self.reservations.is_empty() || !self.handles.is_empty()).then(|| {
            format!(
                "it holds {} address reservation(s) and {} physical allocation(s) of its own (cuMemCreate)",
                self.reservations.len(),
                self.handles.len()
            )
        })
    }

    /// Whether `[ptr, ptr + len)` lies inside one reservation.
    fn reserved(&self, ptr: u64, len: u64) -> bool {
        let Some(end) = ptr.checked_add(len) else { return false };
        self.reservations.range(..=ptr).next_back().is_some_and(|(start, size)| end <= start + size)
    }

    /// The mappings that overlap `[ptr, ptr + len)`.
    fn overlapping(&self, ptr: u64, len: u64) -> impl Iterator<Item = (u64, Mapping)> + '_ {
        let end = ptr.saturating_add(len);
        let before = self.mappings.range(..ptr).next_back().filter(|(start, mapping)| **start + mapping.len > ptr);
        before.into_iter().chain(self.mappings.range(ptr..end)).map(|(start, mapping)| (*start, *mapping))
    }

    /// Whether `[ptr, ptr + len)` is exactly a run of whole, adjacent mappings.
    fn whole_mappings(&self, ptr: u64, len: u64) -> bool {
        let mut at = ptr;
        for (start, mapping) in self.overlapping(ptr, len) {
            if start != at {
                return false;
            }
            at = start + mapping.len;
        }
        at == ptr.saturating_add(len) && len > 0
    }

    /// Forgets everything (once released); the bytes to give back to the quota.
    fn forget(&mut self) -> u64 {
        self.reservations.clear();
        self.mappings.clear();
        self.handles.drain().map(|(_, (_, size))| size).sum()
    }
}

impl<D: Device> Session<D> {
    /// Unmaps, releases and frees everything the session made (it ends).
    pub(super) fn release_vmm(&mut self) {
        let mappings: Vec<(u64, Mapping)> = self.vmm.mappings.iter().map(|(start, mapping)| (*start, *mapping)).collect();
        for (start, mapping) in mappings {
            let _ = self.device.mem_unmap(start, mapping.len);
            self.ranges.remove_within(start, mapping.len, RangeKind::Mapping);
        }
        for (handle, _) in self.vmm.handles.values() {
            let _ = self.device.mem_release(*handle);
        }
        for (start, size) in &self.vmm.reservations {
            let _ = self.device.mem_address_free(*start, *size);
        }
        let bytes = self.vmm.forget();
        self.budget.release(bytes);
    }

    pub(super) fn vmm_granularity(&mut self, request: req::MemGranularity, reply: Responder<rep::MemGranularity>) {
        reply.send(self.device.mem_granularity(request.recommended).map(|granularity| rep::MemGranularity { granularity }));
    }

    pub(super) fn vmm_address_reserve(&mut self, request: req::MemAddressReserve, reply: Responder<rep::MemAddressReserve>) {
        let result = if request.size == 0 || self.vmm.reservations.len() >= MAX_HANDLES {
            Err(CudaError::INVALID_VALUE)
        } else {
            self.device.mem_address_reserve(request.size, request.alignment, request.addr).map(|ptr| {
                self.vmm.reservations.insert(ptr, request.size);
                rep::MemAddressReserve { ptr }
            })
        };
        reply.send(result);
    }

    pub(super) fn vmm_address_free(&mut self, request: req::MemAddressFree, reply: Responder<rep::MemAddressFree>) {
        let whole = self.vmm.reservations.get(&request.ptr) == Some(&request.size);
        let result = if !whole || self.vmm.overlapping(request.ptr, request.size).next().is_some() {
            Err(CudaError::INVALID_VALUE)
        } else {
            self.device.mem_address_free(request.ptr, request.size).map(|()| {
                self.vmm.reservations.remove(&request.ptr);
                rep::MemAddressFree {}
            })
        };
        reply.send(result);
    }

    pub(super) fn vmm_create(&mut self, request: req::MemCreate, reply: Responder<rep::MemCreate>) {
        let result = (|| {
            if request.handle == 0
                || request.size == 0
                || self.vmm.handles.contains_key(&request.handle)
                || self.vmm.handles.len() >= MAX_HANDLES
            {
                return Err(CudaError::INVALID_VALUE);
            }
            if !self.budget.try_reserve(request.size) {
                return Err(CudaError::MEMORY_ALLOCATION);
            }
            match self.device.mem_create(request.size, request.handle_types) {
                Ok(handle) => {
                    self.vmm.handles.insert(request.handle, (handle, request.size));
                    Ok(rep::MemCreate {})
                }
                Err(error) => {
                    self.budget.release(request.size);
                    Err(error)
                }
            }
        })();
        reply.send(result);
    }

    pub(super) fn vmm_release(&mut self, request: req::MemRelease, reply: Responder<rep::MemRelease>) {
        let result = match self.vmm.handles.remove(&request.handle) {
            // Still mapped, the driver keeps the memory until it is unmapped; the quota counts it
            // from creation to release.
            Some((handle, size)) => self.device.mem_release(handle).map(|()| {
                self.budget.release(size);
                rep::MemRelease {}
            }),
            None => Err(CudaError::INVALID_VALUE),
        };
        reply.send(result);
    }

    pub(super) fn vmm_map(&mut self, request: req::MemMap, reply: Responder<rep::MemMap>) {
        let result = (|| {
            let (handle, size) = *self.vmm.handles.get(&request.handle).ok_or(CudaError::INVALID_VALUE)?;
            let within = request.offset.checked_add(request.size).is_some_and(|end| end <= size);
            if request.size == 0
                || !within
                || !self.vmm.reserved(request.ptr, request.size)
                || self.vmm.overlapping(request.ptr, request.size).next().is_some()
            {
                return Err(CudaError::INVALID_VALUE);
            }
            self.device.mem_map(request.ptr, request.size, request.offset, handle)?;
            self.vmm.mappings.insert(request.ptr, Mapping { len: request.size });
            self.ranges.insert(request.ptr, request.size, RangeKind::Mapping);
            Ok(rep::MemMap {})
        })();
        reply.send(result);
    }

    pub(super) fn vmm_unmap(&mut self, request: req::MemUnmap, reply: Responder<rep::MemUnmap>) {
        let result = if self.vmm.whole_mappings(request.ptr, request.size) {
            // Mapping by mapping, so each one is forgotten once the driver has unmapped it.
            let doomed: Vec<(u64, Mapping)> = self.vmm.overlapping(request.ptr, request.size).collect();
            doomed
                .into_iter()
                .try_for_each(|(start, mapping)| {
                    self.device.mem_unmap(start, mapping.len)?;
                    self.vmm.mappings.remove(&start);
                    self.ranges.remove_within(start, mapping.len, RangeKind::Mapping);
                    Ok(())
                })
                .map(|()| rep::MemUnmap {})
        } else {
            Err(CudaError::INVALID_VALUE)
        };
        reply.send(result);
    }

    pub(super) fn vmm_set_access(&mut self, request: req::MemSetAccess, reply: Responder<rep::MemSetAccess>) {
        let result = if self.vmm.whole_mappings(request.ptr, request.size) {
            self.device.mem_set_access(request.ptr, request.size, request.flags).map(|()| rep::MemSetAccess {})
        } else {
            Err(CudaError::INVALID_VALUE)
        };
        reply.send(result);
    }
}
