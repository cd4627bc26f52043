//! Virtual memory management for a session (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`...):
//! physical allocations under client-chosen ids, counted in the quota; every range checked
//! against the session's own reservations and mappings before the driver sees it, so a tenant can
//! map, unmap or free only what it made.
//!
//! A session moves with all of it: its reservations are held at their addresses where it goes
//! (`Device::restore_allocations`), each physical allocation is made again (one the app released
//! but still maps, too, for as long as it is mapped), each mapping is made at its address with
//! its offset and access, and the mapped bytes travel like allocations' bytes.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::AsFd;

use flyt_protocol::CudaError;
use flyt_protocol::ops::{mem_usage, rep, req};
use serde::{Deserialize, Serialize};

use super::{MAX_HANDLES, Responder, Session};
use crate::backend::Device;
use crate::memory::RangeKind;
use crate::shareable::{Exports, Kind};

/// A physical allocation: its size, the shareable handle types and usage (`CU_MEM_CREATE_USAGE_*`)
/// it was made with; `imported` from another session's export (in that session's quota, not this
/// one's).
#[derive(Clone, Copy, Serialize, Deserialize)]
struct Physical {
    size: u64,
    handle_types: u32,
    usage: u32,
    imported: bool,
}

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`, the one shareable handle type served.
const POSIX_FD: u32 = 0x1;

/// One mapping: its length, and what it maps (the app's id of the physical allocation, which it
/// may have released since) from which offset, with the access last set.
#[derive(Clone, Copy, Serialize, Deserialize)]
struct Mapping {
    len: u64,
    physical: u64,
    of: Physical,
    offset: u64,
    access: Option<u32>,
}

/// The session's reservations, physical allocations and mappings.
pub struct VmmTable<D: Device> {
    reservations: BTreeMap<u64, u64>,
    handles: HashMap<u64, (D::MemHandle, Physical)>,
    mappings: BTreeMap<u64, Mapping>,
    exports: Exports,
}

impl<D: Device> VmmTable<D> {
    /// The worker's socket for descriptors, which also takes the app's deposits (one socket per
    /// worker serves both).
    pub(super) fn socket(&self) -> &Exports {
        &self.exports
    }
}

impl<D: Device> Default for VmmTable<D> {
    fn default() -> Self {
        Self { reservations: BTreeMap::new(), handles: HashMap::new(), mappings: BTreeMap::new(), exports: Exports::default() }
    }
}

/// The session's virtual memory in a snapshot; the mapped bytes are in the file with the
/// allocations' (`mapped`).
#[derive(Default, Serialize, Deserialize)]
pub(super) struct VmmState {
    /// Start and length.
    reservations: Vec<(u64, u64)>,
    /// The app's id of each physical allocation it holds.
    handles: Vec<(u64, Physical)>,
    /// By start.
    mappings: Vec<(u64, Mapping)>,
}

impl VmmState {
    pub(super) fn reservations(&self) -> &[(u64, u64)] {
        &self.reservations
    }

    /// The mapped ranges (start, length), whose bytes move.
    pub(super) fn mapped(&self) -> Vec<(u64, u64)> {
        self.mappings.iter().map(|(start, mapping)| (*start, mapping.len)).collect()
    }

    /// The bytes of physical allocations the app holds (the quota's share).
    pub(super) fn charged(&self) -> u64 {
        self.handles.iter().filter(|(_, physical)| !physical.imported).map(|(_, physical)| physical.size).sum()
    }
}

impl<D: Device> VmmTable<D> {
    /// How many reservations and physical allocations the app holds.
    pub(super) fn held(&self) -> usize {
        self.reservations.len() + self.handles.len()
    }

    /// Why the session cannot move, if shared memory holds it: allocations of other sessions it
    /// imported, or its own that others may have imported (neither would follow it).
    pub(super) fn move_blocker(&self) -> Option<String> {
        let imported = self.handles.values().filter(|(_, physical)| physical.imported).count();
        if imported > 0 {
            return Some(format!("it holds {imported} physical allocation(s) imported from other processes"));
        }
        self.exports.any().then(|| "it exported physical allocations other processes may have imported".to_string())
    }

    pub(super) fn state(&self) -> VmmState {
        let mut handles: Vec<_> = self.handles.iter().map(|(id, (_, physical))| (*id, *physical)).collect();
        handles.sort_unstable_by_key(|(id, _)| *id);
        VmmState {
            reservations: self.reservations.iter().map(|(start, len)| (*start, *len)).collect(),
            handles,
            mappings: self.mappings.iter().map(|(start, mapping)| (*start, *mapping)).collect(),
        }
    }

    /// Makes the physical allocations and mappings of `state` again on `device`, whose
    /// `restore_allocations` holds the reservations; the mapped bytes are copied after. A worker
    /// whose restore fails exits, and the driver frees what it made.
    pub(super) fn restore(device: &D, state: VmmState) -> Result<Self, String> {
        let mut table = Self { reservations: state.reservations.iter().copied().collect(), ..Self::default() };
        let create = |id: u64, physical: Physical| {
            device
                .mem_create(physical.size, physical.handle_types, physical.usage)
                .map_err(|error| format!("physical allocation {id}: {error}"))
        };
        for &(id, physical) in &state.handles {
            table.handles.insert(id, (create(id, physical)?, physical));
        }
        // Physical allocations the app released but still maps: made for their mappings only.
        let mut unheld: HashMap<u64, D::MemHandle> = HashMap::new();
        for &(start, mapping) in &state.mappings {
            let handle = match (table.handles.get(&mapping.physical), unheld.get(&mapping.physical)) {
                (Some((handle, _)), _) | (None, Some(handle)) => *handle,
                (None, None) => *unheld.entry(mapping.physical).or_insert(create(mapping.physical, mapping.of)?),
            };
            device.mem_map(start, mapping.len, mapping.offset, handle).map_err(|error| format!("the mapping at {start:#x}: {error}"))?;
            table.mappings.insert(start, mapping);
            if let Some(flags) = mapping.access {
                device
                    .mem_set_access(start, mapping.len, flags)
                    .map_err(|error| format!("access to the mapping at {start:#x}: {error}"))?;
            }
        }
        // Mapped, their memory stays until unmapped, as where the app made them.
        for handle in unheld.into_values() {
            let _ = device.mem_release(handle);
        }
        Ok(table)
    }

    /// A physical allocation the app holds that was made as a tile pool (sparse arrays' tiles
    /// are mapped onto it): its handle and size.
    pub(super) fn tile_pool(&self, id: u64) -> Option<(D::MemHandle, u64)> {
        let (handle, physical) = self.handles.get(&id)?;
        (physical.usage & mem_usage::TILE_POOL != 0 && !physical.imported).then_some((*handle, physical.size))
    }

    /// The mapped ranges, for the session's range map.
    pub(super) fn mapped(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.mappings.iter().map(|(start, mapping)| (*start, mapping.len))
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
        self.exports.clear();
        self.handles.drain().filter(|(_, (_, physical))| !physical.imported).map(|(_, (_, physical))| physical.size).sum()
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
        reply.send(self.device.mem_granularity(request.recommended, request.host).map(|granularity| rep::MemGranularity { granularity }));
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
                || request.usage & !mem_usage::ALL != 0
                || self.vmm.handles.contains_key(&request.handle)
                || self.vmm.handles.len() >= MAX_HANDLES
            {
                return Err(CudaError::INVALID_VALUE);
            }
            if !self.budget.try_reserve(request.size) {
                return Err(CudaError::MEMORY_ALLOCATION);
            }
            match self.device.mem_create(request.size, request.handle_types, request.usage) {
                Ok(handle) => {
                    let physical =
                        Physical { size: request.size, handle_types: request.handle_types, usage: request.usage, imported: false };
                    self.vmm.handles.insert(request.handle, (handle, physical));
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
            Some((handle, physical)) => self.device.mem_release(handle).map(|()| {
                self.vmm.exports.revoke(request.handle);
                if !physical.imported {
                    self.budget.release(physical.size);
                }
                rep::MemRelease {}
            }),
            None => Err(CudaError::INVALID_VALUE),
        };
        reply.send(result);
    }

    pub(super) fn vmm_export(&mut self, request: req::MemExport, reply: Responder<rep::MemExport>) {
        let result = (|| {
            let (handle, physical) = *self.vmm.handles.get(&request.handle).ok_or(CudaError::INVALID_VALUE)?;
            // Made without the POSIX handle type (or imported: its exporter shares it).
            if physical.handle_types & POSIX_FD == 0 || physical.imported {
                return Err(CudaError::INVALID_VALUE);
            }
            let fd = self.device.mem_export(handle)?;
            let shareable = self
                .vmm
                .exports
                .publish(Kind::Physical, request.handle, fd, physical.size)
                .map_err(crate::shareable::unserved("allocation"))?;
            Ok(rep::MemExport { shareable })
        })();
        reply.send(result);
    }

    pub(super) fn vmm_import(&mut self, request: req::MemImport, reply: Responder<rep::MemImport>) {
        let result = (|| {
            if request.handle == 0 || self.vmm.handles.contains_key(&request.handle) || self.vmm.handles.len() >= MAX_HANDLES {
                return Err(CudaError::INVALID_VALUE);
            }
            let (fd, size) = crate::shareable::fetch(&request.shareable).ok_or(CudaError::INVALID_VALUE)?;
            let handle = self.device.mem_import(fd.as_fd(), size)?;
            let physical = Physical { size, handle_types: POSIX_FD, usage: 0, imported: true };
            self.vmm.handles.insert(request.handle, (handle, physical));
            Ok(rep::MemImport { size })
        })();
        reply.send(result);
    }

    pub(super) fn vmm_map(&mut self, request: req::MemMap, reply: Responder<rep::MemMap>) {
        let result = (|| {
            let (handle, physical) = *self.vmm.handles.get(&request.handle).ok_or(CudaError::INVALID_VALUE)?;
            let within = request.offset.checked_add(request.size).is_some_and(|end| end <= physical.size);
            if request.size == 0
                || !within
                || !self.vmm.reserved(request.ptr, request.size)
                || self.vmm.overlapping(request.ptr, request.size).next().is_some()
            {
                return Err(CudaError::INVALID_VALUE);
            }
            self.device.mem_map(request.ptr, request.size, request.offset, handle)?;
            let mapping = Mapping { len: request.size, physical: request.handle, of: physical, offset: request.offset, access: None };
            self.vmm.mappings.insert(request.ptr, mapping);
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
            self.device.mem_set_access(request.ptr, request.size, request.flags).map(|()| {
                // Whole mappings, the first at `ptr`.
                for mapping in self.vmm.mappings.range_mut(request.ptr..request.ptr + request.size).map(|(_, mapping)| mapping) {
                    mapping.access = Some(request.flags);
                }
                rep::MemSetAccess {}
            })
        } else {
            Err(CudaError::INVALID_VALUE)
        };
        reply.send(result);
    }
}
