//! Virtual memory management on the client side: physical allocations are named by ids this
//! process chooses (the app's `CUmemGenericAllocationHandle`s), with the properties and the
//! references the driver keeps for them; mappings are device ranges the app may copy to once
//! they are made, and their access flags are answered here.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{capture_status, req};

use crate::client::Client;

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`, the one shareable handle type served.
pub const POSIX_FD: u32 = 0x1;

/// A physical allocation: its size, requested handle types, usage (`CU_MEM_CREATE_USAGE_*`),
/// and references (its creation, and each `cuMemRetainAllocationHandle`).
#[derive(Clone, Copy)]
pub struct Physical {
    pub size: u64,
    pub handle_types: u32,
    pub usage: u32,
    refs: u32,
}

/// One mapping: its length, the allocation's id and the access flags set for it.
#[derive(Clone, Copy)]
struct Mapping {
    len: u64,
    handle: u64,
    access: u32,
}

#[derive(Default)]
pub struct Vmm {
    next_id: AtomicU64,
    physical: Mutex<HashMap<u64, Physical>>,
    mappings: Mutex<BTreeMap<u64, Mapping>>,
    /// Address reservations (start to size), reserved in this process too.
    reservations: Mutex<BTreeMap<u64, u64>>,
    /// Pools made with a shareable handle type, and pools imported from other processes.
    shared_pools: Mutex<HashMap<u64, SharedPool>>,
    /// Each device's current pool (by the session's index; absent until set: its default
    /// pool), as the session's replies say.
    current_pools: Mutex<HashMap<u32, u64>>,
}

/// A pool that takes part in sharing between processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedPool {
    /// Made with `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`: it can be exported.
    Exportable,
    /// Imported from another process: allocations of that process can be imported from it, and
    /// it makes none of its own.
    Imported,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Client {
    /// With `host`: of pinned memory on the GPU host's NUMA node nearest the device.
    pub fn mem_granularity(&self, recommended: bool, host: bool) -> CudaResult<u64> {
        self.call(req::MemGranularity { recommended, host }).map(|reply| reply.granularity)
    }

    pub fn mem_address_reserve(&self, size: u64, alignment: u64, addr: u64) -> CudaResult<u64> {
        let ptr = self.call(req::MemAddressReserve { size, alignment, addr })?.ptr;
        self.ranges.reserve_addresses(ptr, size);
        lock(&self.vmm.reservations).insert(ptr, size);
        Ok(ptr)
    }

    pub fn mem_address_free(&self, ptr: u64, size: u64) -> CudaResult<()> {
        self.call(req::MemAddressFree { ptr, size })?;
        if lock(&self.vmm.reservations).remove(&ptr).is_some() {
            self.ranges.free_addresses(ptr, size);
        }
        Ok(())
    }

    /// A new physical allocation; its id (never 0).
    pub fn mem_create(&self, size: u64, handle_types: u32, usage: u32) -> CudaResult<u64> {
        let handle = self.vmm.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        self.call(req::MemCreate { handle, size, handle_types, usage })?;
        lock(&self.vmm.physical).insert(handle, Physical { size, handle_types, usage, refs: 1 });
        Ok(handle)
    }

    pub fn mem_physical(&self, handle: u64) -> Option<Physical> {
        lock(&self.vmm.physical).get(&handle).copied()
    }

    /// Drops a reference; the last one releases the allocation in the server.
    pub fn mem_release(&self, handle: u64) -> CudaResult<()> {
        {
            let mut physical = lock(&self.vmm.physical);
            let entry = physical.get_mut(&handle).ok_or(CudaError::INVALID_VALUE)?;
            if entry.refs > 1 {
                entry.refs -= 1;
                return Ok(());
            }
            physical.remove(&handle);
        }
        self.call(req::MemRelease { handle }).map(drop)
    }

    /// `cuMemExportToShareableHandle`: what the app is to hold, opaque here (only a server can
    /// use it: `mem_import`).
    pub fn mem_export(&self, handle: u64) -> CudaResult<Vec<u8>> {
        if !lock(&self.vmm.physical).contains_key(&handle) {
            return Err(CudaError::INVALID_VALUE);
        }
        self.call(req::MemExport { handle }).map(|reply| reply.shareable)
    }

    /// `cuMemImportFromShareableHandle` of what another process's `mem_export` gave: the
    /// allocation's id in this process.
    pub fn mem_import(&self, shareable: Vec<u8>) -> CudaResult<u64> {
        let handle = self.vmm.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let size = self.call(req::MemImport { handle, shareable })?.size;
        // The driver reports no requested handle types for an imported allocation (H100, driver
        // 580).
        lock(&self.vmm.physical).insert(handle, Physical { size, handle_types: 0, usage: 0, refs: 1 });
        Ok(handle)
    }

    pub fn mem_map(&self, ptr: u64, size: u64, offset: u64, handle: u64) -> CudaResult<()> {
        if !lock(&self.vmm.physical).contains_key(&handle) {
            return Err(CudaError::INVALID_VALUE);
        }
        self.call(req::MemMap { ptr, size, offset, handle })?;
        lock(&self.vmm.mappings).insert(ptr, Mapping { len: size, handle, access: 0 });
        self.ranges.add_mapping(ptr, size);
        Ok(())
    }

    pub fn mem_unmap(&self, ptr: u64, size: u64) -> CudaResult<()> {
        self.call(req::MemUnmap { ptr, size })?;
        lock(&self.vmm.mappings).retain(|start, _| *start < ptr || *start >= ptr.saturating_add(size));
        self.ranges.remove_mappings(ptr, size);
        Ok(())
    }

    pub fn mem_set_access(&self, ptr: u64, size: u64, flags: u32) -> CudaResult<()> {
        self.call(req::MemSetAccess { ptr, size, flags })?;
        let end = ptr.saturating_add(size);
        for (_, mapping) in lock(&self.vmm.mappings).range_mut(..end).filter(|(start, mapping)| **start + mapping.len > ptr) {
            mapping.access = flags;
        }
        Ok(())
    }

    /// The mapping holding `addr`: `(allocation id, access flags)`.
    fn mapping_at(&self, addr: u64) -> Option<(u64, u32)> {
        let mappings = lock(&self.vmm.mappings);
        let (start, mapping) = mappings.range(..=addr).next_back()?;
        (addr - start < mapping.len).then_some((mapping.handle, mapping.access))
    }

    pub fn mem_access(&self, addr: u64) -> CudaResult<u32> {
        self.mapping_at(addr).map(|(_, access)| access).ok_or(CudaError::INVALID_VALUE)
    }

    /// `cuMemRetainAllocationHandle`: the allocation mapped at `addr`, with one more reference.
    pub fn mem_retain(&self, addr: u64) -> CudaResult<u64> {
        let (handle, _) = self.mapping_at(addr).ok_or(CudaError::INVALID_VALUE)?;
        let mut physical = lock(&self.vmm.physical);
        let entry = physical.get_mut(&handle).ok_or(CudaError::INVALID_VALUE)?;
        entry.refs += 1;
        Ok(handle)
    }

    /// Forgets what a device reset took with the context (pools too: the session destroys them).
    pub fn forget_vmm(&self) {
        lock(&self.vmm.physical).clear();
        lock(&self.vmm.mappings).clear();
        lock(&self.vmm.shared_pools).clear();
        lock(&self.vmm.current_pools).clear();
        for (start, size) in std::mem::take(&mut *lock(&self.vmm.reservations)) {
            self.ranges.free_addresses(start, size);
        }
    }
}

/// Ids of pools the app creates (the default pool is `DEFAULT_POOL`, below them).
static NEXT_POOL: AtomicU64 = AtomicU64::new(flyt_protocol::ops::DEFAULT_POOL + 1);

impl Client {
    /// `cuMemAllocAsync` (`pool` 0: the device's current pool) / `cuMemAllocFromPoolAsync`.
    pub fn alloc_async(&self, size: u64, stream: u64, pool: u64) -> CudaResult<u64> {
        let allocate = || self.call(req::MemAllocAsync { size, stream, pool }).map(|reply| reply.ptr);
        let ptr = self.place_allocation(size, allocate, |ptr| self.post(req::MemFreeAsync { ptr, stream }))?;
        if ptr != 0 && self.graphs.any_capture() && self.capture_info(stream).is_ok_and(|info| info.status != capture_status::NONE) {
            self.graphs.note_memory(ptr);
        }
        if ptr != 0 {
            let pool = if pool == 0 { self.current_pool() } else { pool };
            self.ranges.set_pool(ptr, pool);
        }
        Ok(ptr)
    }

    /// The calling thread's device's current pool, as this process last heard.
    fn current_pool(&self) -> u64 {
        let device = crate::devices::thread_device();
        lock(&self.vmm.current_pools).get(&device).copied().unwrap_or(flyt_protocol::ops::default_pool_of(device))
    }

    /// The pool the allocation starting at `start` came from (own or imported), if any.
    pub fn allocation_pool(&self, start: u64) -> Option<u64> {
        self.ranges.pool(start)
    }

    /// `cuMemFreeAsync`: the pointer is the app's no more from here on.
    pub fn free_async(&self, ptr: u64, stream: u64) -> CudaResult<()> {
        if ptr == 0 {
            return Ok(());
        }
        if self.forget_allocation(ptr).is_err() && !self.graphs.is_memory(ptr) {
            // Graph memory is freed outside its graph too (in stream order after each launch);
            // anything else unknown here is refused as the driver refuses it.
            return Err(CudaError::INVALID_VALUE);
        }
        self.post(req::MemFreeAsync { ptr, stream })
    }

    /// Forgets the allocation at `ptr` as `cuMemFree` and `cuMemFreeAsync` do: an imported pool
    /// allocation imported more than once stays (one reference fewer).
    pub fn forget_allocation(&self, ptr: u64) -> CudaResult<()> {
        if self.ranges.drop_import(ptr) {
            return Ok(());
        }
        self.ranges.remove_allocation(ptr)
    }

    pub fn pool_attribute(&self, pool: u64, attribute: u32, value: Option<u64>) -> CudaResult<u64> {
        self.call(req::MemPoolAttribute { pool, attribute, value }).map(|reply| reply.value)
    }

    pub fn pool_trim(&self, pool: u64, keep: u64) -> CudaResult<()> {
        self.call(req::MemPoolTrim { pool, keep }).map(drop)
    }

    /// A new pool of pinned memory on the session's device, shareable through `handle_types`
    /// (none, or `POSIX_FD`); its id.
    pub fn pool_create(&self, handle_types: u32) -> CudaResult<u64> {
        let pool = NEXT_POOL.fetch_add(1, Ordering::Relaxed);
        self.call(req::MemPoolCreate { pool, handle_types })?;
        if handle_types & POSIX_FD != 0 {
            lock(&self.vmm.shared_pools).insert(pool, SharedPool::Exportable);
        }
        Ok(pool)
    }

    pub fn pool_destroy(&self, pool: u64) -> CudaResult<()> {
        self.call(req::MemPoolDestroy { pool })?;
        lock(&self.vmm.shared_pools).remove(&pool);
        // Its device goes back to its default pool, as the session does.
        lock(&self.vmm.current_pools).retain(|_, current| *current != pool);
        Ok(())
    }

    /// How `pool` takes part in sharing between processes, if it does.
    pub fn shared_pool(&self, pool: u64) -> Option<SharedPool> {
        lock(&self.vmm.shared_pools).get(&pool).copied()
    }

    /// The shareable handle types of `pool`'s allocations (`CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES`).
    pub fn pool_handle_types(&self, pool: u64) -> u32 {
        if self.shared_pool(pool).is_some() { POSIX_FD } else { 0 }
    }

    /// `cuMemPoolExportToShareableHandle`: what the app is to hold, opaque here (only a server
    /// can use it: `pool_import`).
    pub fn pool_export(&self, pool: u64) -> CudaResult<Vec<u8>> {
        if self.shared_pool(pool) != Some(SharedPool::Exportable) {
            return Err(CudaError::INVALID_VALUE);
        }
        self.call(req::MemPoolExport { pool }).map(|reply| reply.shareable)
    }

    /// `cuMemPoolImportFromShareableHandle` of what another process's `pool_export` gave: the
    /// pool's id in this process.
    pub fn pool_import(&self, shareable: Vec<u8>) -> CudaResult<u64> {
        let pool = NEXT_POOL.fetch_add(1, Ordering::Relaxed);
        self.call(req::MemPoolImport { pool, shareable })?;
        lock(&self.vmm.shared_pools).insert(pool, SharedPool::Imported);
        Ok(pool)
    }

    /// `cuMemPoolExportPointer` of the start of an allocation of an exportable pool: the 64 bytes
    /// of `CUmemPoolPtrExportData`, opaque here.
    pub fn pool_export_pointer(&self, ptr: u64) -> CudaResult<[u8; 64]> {
        let data = self.call(req::MemPoolExportPointer { ptr })?.data;
        data.try_into().map_err(|_| CudaError::UNKNOWN)
    }

    /// `cuMemPoolImportPointer` of another process's export data from the pool it imported:
    /// the memory's address here, a device range until freed (`cuMemFree`, `cuMemFreeAsync`).
    pub fn pool_import_pointer(&self, pool: u64, data: [u8; 64]) -> CudaResult<u64> {
        if self.shared_pool(pool) != Some(SharedPool::Imported) {
            return Err(CudaError::INVALID_VALUE);
        }
        let reply = self.call(req::MemPoolImportPointer { pool, data: data.to_vec() })?;
        self.ranges.add_imported(reply.ptr, reply.size, pool);
        Ok(reply.ptr)
    }

    /// The calling thread's device's current pool, after making it `set` if given.
    pub fn device_pool(&self, set: Option<u64>) -> CudaResult<u64> {
        let pool = self.call(req::DeviceMemPool { set })?.pool;
        lock(&self.vmm.current_pools).insert(crate::devices::thread_device(), pool);
        Ok(pool)
    }
}
