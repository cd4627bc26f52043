//! Stream-ordered allocation and memory pools for a session: pools under client-chosen ids
//! (`DEFAULT_POOL` is the first device's default, `default_pool_of` names each other device's,
//! each device with its own current pool), allocations counted in the quota from the
//! allocation to the free and checked like any other. A session moves with its pools: each is
//! made again with the attributes, access and handle types the app set, and the pools' live
//! allocations come back at their addresses with the session's other allocations (the device
//! frees those in stream order too).
//!
//! Pools made with a POSIX file descriptor handle type are shared between sessions (of any
//! rpc-server of the host) as physical allocations are (`crate::shareable`): the driver's
//! descriptor of an exported pool, and its export data of each exported allocation, stay in this
//! worker, served by token to the worker of a session that imported the pool. An importing
//! session holds the imported pool (it allocates nothing) and the allocations it imported from
//! it: device ranges of their own kind (`RangeKind::Imported`), copyable and usable by kernels
//! until the app frees them, in the exporter's quota, not this session's. A session that
//! exported or imported pools cannot move.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::AsFd;

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{DEFAULT_POOL, default_pool_device, default_pool_of, rep, req};

use serde::{Deserialize, Serialize};

use super::{MAX_HANDLES, Responder, Session};
use crate::backend::Device;
use crate::memory::RangeKind;
use crate::shareable::{EXPORT_DATA_LEN, Exports, Kind};

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`, the one shareable handle type served.
const POSIX_FD: u32 = 0x1;

/// Pool attributes an app may set (reuse policies and the release threshold): the ones a moved
/// pool gets again.
const SETTABLE_ATTRIBUTES: std::ops::RangeInclusive<u32> = 1..=4;

/// What the app set on one pool.
#[derive(Clone, Default, Serialize, Deserialize)]
struct PoolSettings {
    attributes: BTreeMap<u32, u64>,
    access: Option<u32>,
    /// The shareable handle types it was made with.
    handle_types: u32,
}

/// Another session's pool allocation this one imported.
struct Import {
    size: u64,
    /// The app's export data it was imported with: importing it again gives the same memory.
    data: [u8; EXPORT_DATA_LEN],
    /// Its imports not yet freed.
    refs: u32,
}

/// The session's pools and which one each device allocates from.
pub struct PoolTable<D: Device> {
    pools: HashMap<u64, D::MemPool>,
    settings: HashMap<u64, PoolSettings>,
    /// The first device's current pool.
    current: u64,
    /// The current pools of the other devices, where set (else their default pools). A session
    /// of several devices does not move, so a snapshot has none.
    current_elsewhere: HashMap<usize, u64>,
    /// Live allocations of pools made with a shareable handle type: address to the pool and the
    /// size, for their exports.
    shareable: HashMap<u64, (u64, u64)>,
    /// Pools imported from other sessions: what their exporter gave (naming its worker and the
    /// export), to ask it for the pools' allocations.
    imported: HashMap<u64, Vec<u8>>,
    /// Other sessions' pool allocations this one imported, by address here.
    imports: HashMap<u64, Import>,
    /// This session's exported pools and pool allocations.
    exports: Exports,
}

impl<D: Device> Default for PoolTable<D> {
    fn default() -> Self {
        Self {
            pools: HashMap::new(),
            settings: HashMap::new(),
            current: DEFAULT_POOL,
            current_elsewhere: HashMap::new(),
            shareable: HashMap::new(),
            imported: HashMap::new(),
            imports: HashMap::new(),
            exports: Exports::default(),
        }
    }
}

/// The session's pools in a snapshot: each pool's id (the default one too, when the app named
/// it) and settings, and the current pool.
#[derive(Serialize, Deserialize)]
pub(super) struct PoolsState {
    pools: Vec<(u64, PoolSettings)>,
    current: u64,
}

impl<D: Device> PoolTable<D> {
    /// Device `device`'s current pool.
    fn current_of(&self, device: usize) -> u64 {
        match device {
            0 => self.current,
            _ => self.current_elsewhere.get(&device).copied().unwrap_or(default_pool_of(device as u32)),
        }
    }

    fn set_current_of(&mut self, device: usize, pool: u64) {
        match device {
            0 => self.current = pool,
            _ => {
                self.current_elsewhere.insert(device, pool);
            }
        }
    }

    /// Why the session cannot move, if shared pools hold it: pools or allocations of other
    /// sessions it imported, or its own that others may have imported (neither would follow it).
    pub(super) fn move_blocker(&self) -> Option<String> {
        if !self.imports.is_empty() {
            return Some(format!("it holds {} memory pool allocation(s) imported from other processes", self.imports.len()));
        }
        if !self.imported.is_empty() {
            return Some(format!("it holds {} memory pool(s) imported from other processes", self.imported.len()));
        }
        self.exports.any().then(|| "it exported memory pools other processes may have imported".to_string())
    }

    /// Whether the app made or chose pools (a session of several GPUs moves without any yet).
    pub(super) fn in_use(&self) -> bool {
        !self.pools.is_empty() || self.current != DEFAULT_POOL || !self.current_elsewhere.is_empty()
    }

    pub(super) fn state(&self) -> PoolsState {
        let mut pools: Vec<_> = self.pools.keys().map(|id| (*id, self.settings.get(id).cloned().unwrap_or_default())).collect();
        pools.sort_unstable_by_key(|(id, _)| *id);
        PoolsState { pools, current: self.current }
    }

    /// Makes the pools of `state` again on `device` (a fresh worker's; one whose restore fails
    /// exits, and the driver frees what it made).
    pub(super) fn restore(device: &D, state: PoolsState) -> Result<Self, String> {
        let mut table = Self { current: state.current, ..Self::default() };
        for (id, settings) in state.pools {
            let pool = match id {
                DEFAULT_POOL => device.default_pool(),
                _ => device.pool_create(settings.handle_types),
            }
            .map_err(|error| format!("memory pool {id}: {error}"))?;
            table.pools.insert(id, pool);
            for (&attribute, &value) in &settings.attributes {
                device
                    .pool_attribute(pool, attribute, Some(value))
                    .map_err(|error| format!("memory pool {id}'s attribute {attribute}: {error}"))?;
            }
            if let Some(flags) = settings.access {
                device.pool_access(pool, Some(flags)).map_err(|error| format!("memory pool {id}'s access: {error}"))?;
            }
            table.settings.insert(id, settings);
        }
        if table.current != DEFAULT_POOL {
            let pool = *table.pools.get(&table.current).ok_or("the current memory pool is not among the session's")?;
            device.set_current_pool(pool).map_err(|error| format!("the current memory pool: {error}"))?;
        }
        Ok(table)
    }
}

impl<D: Device> Session<D> {
    /// The id pool id 0 stands for: the current device's current pool.
    fn pool_id(&self, id: u64) -> u64 {
        if id == 0 { self.pools.current_of(self.device.current_device()) } else { id }
    }

    /// A pool by id; a device's default pool is looked up on first use.
    fn pool(&mut self, id: u64) -> Result<D::MemPool, CudaError> {
        let id = self.pool_id(id);
        if let Some(pool) = self.pools.pools.get(&id) {
            return Ok(*pool);
        }
        let device = default_pool_device(id).map(|device| device as usize).filter(|device| *device < self.device.device_count());
        let Some(device) = device else {
            return Err(CudaError::INVALID_VALUE);
        };
        let pool = self.device.default_pool_of(device)?;
        self.pools.pools.insert(id, pool);
        Ok(pool)
    }

    /// Destroys the pools the session created or imported, frees what it imported from them
    /// and ends its exports (it ends, or the device resets).
    pub(super) fn release_pools(&mut self) {
        for (ptr, import) in self.pools.imports.drain() {
            self.ranges.remove_within(ptr, import.size, RangeKind::Imported);
            let _ = self.device.free(ptr);
        }
        for (id, pool) in self.pools.pools.drain() {
            if default_pool_device(id).is_none() {
                let _ = self.device.pool_destroy(pool);
            }
        }
        self.pools.exports.clear();
        self.pools.shareable.clear();
        self.pools.imported.clear();
        self.pools.settings.clear();
        self.pools.current = DEFAULT_POOL;
        self.pools.current_elsewhere.clear();
    }

    /// `cuMemFree` (`stream` `None`) or `cuMemFreeAsync` of an allocation the session imported
    /// from another session's pool: one reference fewer, freed on the device with the last. `None`
    /// for any other pointer.
    pub(super) fn free_pool_import(&mut self, ptr: u64, stream: Option<D::Stream>) -> Option<CudaResult<()>> {
        let import = self.pools.imports.get_mut(&ptr)?;
        if import.refs > 1 {
            import.refs -= 1;
            return Some(Ok(()));
        }
        let result = match stream {
            Some(stream) => self.device.free_async(ptr, stream),
            None => self.device.free(ptr),
        };
        if result.is_ok() {
            let size = import.size;
            self.pools.imports.remove(&ptr);
            self.ranges.remove_within(ptr, size, RangeKind::Imported);
        }
        Some(result)
    }

    /// Forgets the allocation at `ptr`, freed by the app, as a pool allocation others may import.
    pub(super) fn forget_pool_allocation(&mut self, ptr: u64) {
        if self.pools.shareable.remove(&ptr).is_some() {
            self.pools.exports.revoke_pointer(ptr);
        }
    }

    pub(super) fn pool_alloc_async(&mut self, request: req::MemAllocAsync, reply: Responder<rep::MemAllocAsync>) {
        let result = (|| {
            if request.size == 0 {
                return Ok(rep::MemAllocAsync { ptr: 0 });
            }
            let stream = self.stream(request.stream)?;
            // Without a pool, the current pool of the stream's device, as the driver takes it.
            let id = if request.pool == 0 { self.pools.current_of(self.device.stream_device(stream)) } else { request.pool };
            let pool = self.pool(id)?;
            // An imported pool makes no allocations, as natively.
            if self.pools.imported.contains_key(&id) {
                return Err(CudaError::INVALID_VALUE);
            }
            if !self.budget.try_reserve(request.size) {
                return Err(CudaError::MEMORY_ALLOCATION);
            }
            match self.device.alloc_async(request.size, pool, stream) {
                Ok(ptr) if self.record_captured_allocation(stream, ptr, request.size) => Ok(rep::MemAllocAsync { ptr }),
                Ok(ptr) => {
                    self.ranges.insert(ptr, request.size, RangeKind::Allocation);
                    // Not recorded: a pool's memory (an earlier owner at this address is stale).
                    self.owners.freed(ptr);
                    if self.pools.settings.get(&id).is_some_and(|settings| settings.handle_types & POSIX_FD != 0) {
                        self.pools.shareable.insert(ptr, (id, request.size));
                    }
                    Ok(rep::MemAllocAsync { ptr })
                }
                Err(error) => {
                    self.budget.release(request.size);
                    Err(error)
                }
            }
        })();
        reply.send(result);
    }

    pub(super) fn pool_free_async(&mut self, request: req::MemFreeAsync, reply: Responder<rep::MemFreeAsync>) {
        let result = self.stream(request.stream).and_then(|stream| {
            if let Some(freed) = self.free_pool_import(request.ptr, Some(stream)) {
                return freed;
            }
            // Graph memory, freed in a capture (a free node) or in stream order after a launch:
            // each launch allocates it again at its address, so it stays known until its graph goes.
            if self.ranges.kind_at(request.ptr) == Some(RangeKind::GraphMemory) && self.graphs.is_graph_memory(request.ptr) {
                return self.device.free_graph_memory_async(request.ptr, stream);
            }
            let len = self.ranges.remove_allocation(request.ptr)?;
            self.budget.release(len);
            self.forget_pool_allocation(request.ptr);
            self.device.free_async(request.ptr, stream)
        });
        reply.send(result.map(|()| rep::MemFreeAsync {}));
    }

    pub(super) fn pool_attribute(&mut self, request: req::MemPoolAttribute, reply: Responder<rep::MemPoolAttribute>) {
        let id = self.pool_id(request.pool);
        let result = self.pool(id).and_then(|pool| self.device.pool_attribute(pool, request.attribute, request.value));
        if let (Ok(_), Some(value)) = (&result, request.value)
            && SETTABLE_ATTRIBUTES.contains(&request.attribute)
        {
            self.pools.settings.entry(id).or_default().attributes.insert(request.attribute, value);
        }
        reply.send(result.map(|value| rep::MemPoolAttribute { value }));
    }

    pub(super) fn pool_trim(&mut self, request: req::MemPoolTrim, reply: Responder<rep::MemPoolTrim>) {
        let result = self.pool(request.pool).and_then(|pool| self.device.pool_trim(pool, request.keep));
        reply.send(result.map(|()| rep::MemPoolTrim {}));
    }

    /// Whether `pool` is a fresh id for a pool of the app's.
    fn new_pool_id(&self, pool: u64) -> bool {
        pool > DEFAULT_POOL
            && default_pool_device(pool).is_none()
            && !self.pools.pools.contains_key(&pool)
            && self.pools.pools.len() < MAX_HANDLES
    }

    pub(super) fn pool_create(&mut self, request: req::MemPoolCreate, reply: Responder<rep::MemPoolCreate>) {
        // No handle type, or a POSIX file descriptor (the client refuses the others first).
        let result = if !self.new_pool_id(request.pool) || request.handle_types & !POSIX_FD != 0 {
            Err(CudaError::INVALID_VALUE)
        } else {
            self.device.pool_create(request.handle_types).map(|pool| {
                self.pools.pools.insert(request.pool, pool);
                if request.handle_types != 0 {
                    self.pools.settings.entry(request.pool).or_default().handle_types = request.handle_types;
                }
                rep::MemPoolCreate {}
            })
        };
        reply.send(result);
    }

    pub(super) fn pool_destroy(&mut self, request: req::MemPoolDestroy, reply: Responder<rep::MemPoolDestroy>) {
        let result = match self.pools.pools.get(&request.pool) {
            Some(pool) if default_pool_device(request.pool).is_none() => {
                let pool = *pool;
                self.device.pool_destroy(pool).map(|()| {
                    self.pools.pools.remove(&request.pool);
                    self.pools.settings.remove(&request.pool);
                    // Its exports end (its allocations' too); what was imported from it stays
                    // until freed, as the driver keeps a pool until its allocations are gone.
                    self.pools.exports.revoke(request.pool);
                    self.pools.shareable.retain(|_, (pool, _)| *pool != request.pool);
                    self.pools.imported.remove(&request.pool);
                    // Its device goes back to its default pool, as the driver does.
                    if self.pools.current == request.pool {
                        self.pools.current = DEFAULT_POOL;
                    }
                    self.pools.current_elsewhere.retain(|_, current| *current != request.pool);
                    rep::MemPoolDestroy {}
                })
            }
            _ => Err(CudaError::INVALID_VALUE),
        };
        reply.send(result);
    }

    /// The current device's current pool, set first with `set` (0: its default pool).
    pub(super) fn pool_current(&mut self, request: req::DeviceMemPool, reply: Responder<rep::DeviceMemPool>) {
        let device = self.device.current_device();
        let result = (|| {
            if let Some(id) = request.set {
                let id = if id == 0 { default_pool_of(device as u32) } else { id };
                // An imported pool makes no allocations: it cannot be the device's pool.
                if self.pools.imported.contains_key(&id) {
                    return Err(CudaError::INVALID_VALUE);
                }
                let pool = self.pool(id)?;
                // The driver refuses another device's pool.
                self.device.set_current_pool(pool)?;
                self.pools.set_current_of(device, id);
            }
            Ok(rep::DeviceMemPool { pool: self.pools.current_of(device) })
        })();
        reply.send(result);
    }

    /// `cuMemPoolSetAccess`/`GetAccess` for the current device (the client makes the location's
    /// device current for it): the pool's own, or a peer given access to the pool's memory.
    pub(super) fn pool_access(&mut self, request: req::MemPoolAccess, reply: Responder<rep::MemPoolAccess>) {
        let id = self.pool_id(request.pool);
        let result = self.pool(id).and_then(|pool| self.device.pool_access(pool, request.set));
        // A moved pool gets its own device's access again (a session with peers does not move).
        if let (Ok(_), Some(flags), 0) = (&result, request.set, self.device.current_device()) {
            self.pools.settings.entry(id).or_default().access = Some(flags);
        }
        reply.send(result.map(|flags| rep::MemPoolAccess { flags }));
    }
}

impl<D: Device> Session<D> {
    /// `cuMemPoolExportToShareableHandle` of a pool of the app's made with the POSIX handle type.
    pub(super) fn pool_export(&mut self, request: req::MemPoolExport, reply: Responder<rep::MemPoolExport>) {
        let result = (|| {
            let pool = *self.pools.pools.get(&request.pool).ok_or(CudaError::INVALID_VALUE)?;
            let handle_types = self.pools.settings.get(&request.pool).map_or(0, |settings| settings.handle_types);
            // Made without the handle type (the default pool too), or imported: its exporter
            // shares it.
            if handle_types & POSIX_FD == 0 || self.pools.imported.contains_key(&request.pool) {
                tracing::debug!(pool = request.pool, "export refused: the pool was not made with a POSIX file descriptor handle type");
                return Err(CudaError::INVALID_VALUE);
            }
            let fd = self.device.pool_export(pool)?;
            let shareable =
                self.pools.exports.publish(Kind::Pool, request.pool, fd, 0).map_err(crate::shareable::unserved("memory pool"))?;
            Ok(rep::MemPoolExport { shareable })
        })();
        reply.send(result);
    }

    /// `cuMemPoolImportFromShareableHandle` of another session's live export, under the app's
    /// new id.
    pub(super) fn pool_import(&mut self, request: req::MemPoolImport, reply: Responder<rep::MemPoolImport>) {
        let result = (|| {
            if !self.new_pool_id(request.pool) {
                return Err(CudaError::INVALID_VALUE);
            }
            let Some(fd) = crate::shareable::fetch_pool(&request.shareable) else {
                tracing::debug!("pool import refused: not a live export of a memory pool");
                return Err(CudaError::INVALID_VALUE);
            };
            let pool = self.device.pool_import(fd.as_fd())?;
            self.pools.pools.insert(request.pool, pool);
            self.pools.settings.entry(request.pool).or_default().handle_types = POSIX_FD;
            self.pools.imported.insert(request.pool, request.shareable);
            Ok(rep::MemPoolImport {})
        })();
        reply.send(result);
    }

    /// `cuMemPoolExportPointer` of the start of a live allocation of a pool of the app's made with
    /// the POSIX handle type (exported yet or not, as natively).
    pub(super) fn pool_export_pointer(&mut self, request: req::MemPoolExportPointer, reply: Responder<rep::MemPoolExportPointer>) {
        let result = (|| {
            let Some(&(pool, size)) = self.pools.shareable.get(&request.ptr) else {
                tracing::debug!(ptr = request.ptr, "pointer export refused: not the start of a live allocation of a shareable pool");
                return Err(CudaError::INVALID_VALUE);
            };
            let driver_data = self.device.pool_export_pointer(request.ptr)?;
            let data = self
                .pools
                .exports
                .publish_pointer(pool, request.ptr, driver_data, size)
                .map_err(crate::shareable::unserved("pool allocation"))?;
            Ok(rep::MemPoolExportPointer { data: data.to_vec() })
        })();
        reply.send(result);
    }

    /// `cuMemPoolImportPointer` of export data of an allocation of the pool `request.pool` was
    /// imported from, while its exporter serves it: a device range of this session's, in the
    /// exporter's quota. Importing it again gives the same address, one more reference.
    pub(super) fn pool_import_pointer(&mut self, request: req::MemPoolImportPointer, reply: Responder<rep::MemPoolImportPointer>) {
        let result = (|| {
            let shareable = self.pools.imported.get(&request.pool).ok_or_else(|| {
                tracing::debug!(pool = request.pool, "pointer import refused: not an imported pool");
                CudaError::INVALID_VALUE
            })?;
            if !crate::shareable::is_export_data(&request.data) {
                tracing::debug!("pointer import refused: not export data Flyt made");
                return Err(CudaError::INVALID_VALUE);
            }
            if let Some((ptr, import)) = self.pools.imports.iter_mut().find(|(_, import)| import.data[..] == request.data[..]) {
                import.refs += 1;
                return Ok(rep::MemPoolImportPointer { ptr: *ptr, size: import.size });
            }
            if self.pools.imports.len() >= MAX_HANDLES {
                return Err(CudaError::INVALID_VALUE);
            }
            let Some((driver_data, size)) = crate::shareable::fetch_pointer(shareable, &request.data) else {
                tracing::debug!("pointer import refused: not a live export of an allocation of this pool");
                return Err(CudaError::INVALID_VALUE);
            };
            let pool = *self.pools.pools.get(&request.pool).ok_or(CudaError::INVALID_VALUE)?;
            let ptr = self.device.pool_import_pointer(pool, &driver_data, size)?;
            let data = request.data.as_slice().try_into().map_err(|_| CudaError::INVALID_VALUE)?;
            self.ranges.insert(ptr, size, RangeKind::Imported);
            self.pools.imports.insert(ptr, Import { size, data, refs: 1 });
            Ok(rep::MemPoolImportPointer { ptr, size })
        })();
        reply.send(result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::emulated::EmulatedDevice;

    fn memfd() -> std::os::fd::OwnedFd {
        nix::sys::memfd::memfd_create("flyt-test-pool", nix::sys::memfd::MFdFlags::MFD_CLOEXEC).expect("memfd")
    }

    #[test]
    fn shared_pools_keep_their_session_from_moving_and_say_why() {
        let mut table = PoolTable::<EmulatedDevice>::default();
        assert_eq!(table.move_blocker(), None);
        table.exports.publish(Kind::Pool, 2, memfd(), 0).expect("publish");
        assert_eq!(table.move_blocker().as_deref(), Some("it exported memory pools other processes may have imported"));
        table.exports.revoke(2);
        assert_eq!(table.move_blocker(), None, "an export its pool's destruction ended holds nothing");
        table.imported.insert(3, Vec::new());
        assert_eq!(table.move_blocker().as_deref(), Some("it holds 1 memory pool(s) imported from other processes"));
        table.imports.insert(0x1000, Import { size: 4096, data: [0; EXPORT_DATA_LEN], refs: 1 });
        assert_eq!(table.move_blocker().as_deref(), Some("it holds 1 memory pool allocation(s) imported from other processes"));
    }
}
