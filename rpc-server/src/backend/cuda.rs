//! The CUDA backend: the driver API through cudarc, loaded at run time, so the server builds and
//! starts on machines without CUDA and says clearly when no driver is there.
//!
//! All `unsafe` in the server lives here, at the driver's FFI edge.

use std::ffi::{CString, c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use cudarc::driver::{result, sys};
use flyt_cuda_sys::DriverTable;
use flyt_cuda_sys::types::{CUDA_BATCH_MEM_OP_NODE_PARAMS, CUDA_MEMCPY3D, CUgraphExecUpdateResultInfo};
use flyt_protocol::CudaError;
use flyt_protocol::device::{DeviceInfo, LAST_ATTRIBUTE, PeerLink};
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{
    ArrayDesc, Copy3d, DecompressOp, Dim3, FuncAttributes, JitOption, LaunchAttribute, LinkOutcome, Memset2d, NodeCopy, NodeCopySide,
    ParamInfo, Pos3, SparseProperties, StreamMemOp, TensorMapLayout, TensorMapParams, TextureDesc, ViewDesc, mem_op, node_type,
};

use super::{
    AddedNode, ArrayMapWork, ArrayRef, Capture, CaptureInto, Device, EdgeData, ExecUpdate, Extent, KernelRead, LaunchShape, NodeRead,
    NodeWork, Side, TexResource,
};
use crate::host_calls::HostCallSite;

/// `CU_STREAM_CAPTURE_MODE_RELAXED`: the server's own allocations while the app captures.
const CAPTURE_MODE_RELAXED: u32 = 2;

/// Physical memory mapped for a while (`CudaDevice::map_anywhere`): unmapped, its addresses
/// freed and its handle released when dropped.
struct TemporaryMapping {
    at: sys::CUdeviceptr,
    len: usize,
    handle: sys::CUmemGenericAllocationHandle,
    mapped: bool,
}

impl Drop for TemporaryMapping {
    fn drop(&mut self) {
        // SAFETY: what `map_anywhere` made, undone once; no copy uses it any more (the owner
        // synchronized or failed first).
        unsafe {
            if self.mapped {
                sys::cuMemUnmap(self.at, self.len);
            }
            if self.at != 0 {
                sys::cuMemAddressFree(self.at, self.len);
            }
            sys::cuMemRelease(self.handle);
        }
    }
}

/// A descriptor of physical allocation `handle`, which this worker made with a POSIX descriptor
/// as its shareable handle type; the memory lives while the descriptor does.
fn export_descriptor(handle: sys::CUmemGenericAllocationHandle) -> CudaResult<std::os::fd::OwnedFd> {
    let mut fd: std::ffi::c_int = -1;
    // SAFETY: valid out-pointer for the descriptor; the driver checks the handle and its type.
    check(unsafe {
        sys::cuMemExportToShareableHandle(
            (&raw mut fd).cast(),
            handle,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
        .result()
    })?;
    // SAFETY: the driver just made this descriptor for us; nothing else owns it.
    Ok(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// A driver handle that may cross threads. CUDA driver handles are opaque pointers into the
/// driver, which documents its API as thread-safe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Handle<T>(pub(super) T);

impl<T> Handle<T> {
    pub(super) fn new(handle: T) -> Self {
        Self(handle)
    }
}
// SAFETY: the wrapped values are CUDA driver handles (CUstream, CUevent, CUfunction, CUmodule);
// the driver API is thread-safe and the handles carry no thread affinity once a context is
// current on the calling thread (every thread that uses them calls `bind_thread` first).
unsafe impl<T> Send for Handle<T> {}
// SAFETY: as above; sharing a handle only shares the pointer value.
unsafe impl<T> Sync for Handle<T> {}

pub(super) fn check(result: Result<(), result::DriverError>) -> CudaResult<()> {
    result.map_err(driver_error)
}

fn driver_error(error: result::DriverError) -> CudaError {
    CudaError::from_driver(error.0 as u32)
}

/// The driver exports the server cannot do without: `CudaDevice::open` fails, naming the first one
/// missing, where the driver lacks one (the others are `None` in the table and answer
/// CUDA_ERROR_NOT_SUPPORTED).
const REQUIRED: &[&str] = &[
    "cuDeviceGetAttribute",
    "cuFuncGetAttribute",
    "cuFuncSetAttribute",
    "cuCtxGetLimit",
    "cuCtxSetLimit",
    "cuFuncGetParamInfo",
    "cuLinkCreate_v2",
    "cuLinkAddData_v2",
    "cuLinkComplete",
    "cuLinkDestroy",
    "cuModuleGetFunctionCount",
    "cuModuleEnumerateFunctions",
    "cuFuncGetName",
    "cuDeviceGetTexture1DLinearMaxWidth",
    "cuDeviceGetHostAtomicCapabilities",
    "cuDeviceGetP2PAtomicCapabilities",
];

/// The generated table of NVIDIA's driver (`flyt-cuda-sys`), resolved once from cudarc's library:
/// the entry points cudarc lacks or types with Rust enums, taken with the header's C signatures,
/// enums as `unsigned`, so a value this build does not know (a new attribute, a new error code)
/// stays a number.
pub(super) fn driver_table() -> &'static DriverTable {
    static TABLE: OnceLock<DriverTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        // SAFETY: `culib` was probed by `is_culib_present` before (in `CudaDevice::open`, the only
        // way to a `CudaDevice`): NVIDIA's driver, whose exports have the generated signatures.
        unsafe { DriverTable::resolve(sys::culib()) }
    })
}

/// Fails with the first of `names` the driver lacks.
pub(super) fn require(table: &DriverTable, names: &[&str]) -> Result<(), String> {
    let missing = table.missing();
    match names.iter().find(|name| missing.contains(name)) {
        Some(name) => Err(format!("{name}: the driver lacks it")),
        None => Ok(()),
    }
}

/// An entry point of the driver table, or "not supported" from a driver without it.
pub(super) fn entry<F>(entry: Option<F>) -> CudaResult<F> {
    entry.ok_or(CudaError::NOT_SUPPORTED)
}

pub(super) fn raw_check(code: u32) -> CudaResult<()> {
    if code == 0 { Ok(()) } else { Err(CudaError::from_driver(code)) }
}

/// A `CUtensorMap`'s storage: 128 bytes, 128-byte aligned as `cuda.h` declares it (the generated
/// type is opaque: the driver alone reads and writes it).
#[repr(C, align(128))]
struct TensorMap([u8; 128]);

/// One `CUstreamBatchMemOpParams`'s storage (a 48-byte union, opaque in the generated types),
/// written field by field.
type MemOpParams = [u64; 6];

/// One side of a `CUDA_MEMCPY3D` as the server names it (the driver's memory type as a number).
fn node_copy_side(
    memory_type: c_uint,
    host: *const c_void,
    device: u64,
    (x, y, z): (usize, usize, usize),
    (pitch, height): (usize, usize),
) -> CudaResult<NodeCopySide> {
    if memory_type == MEMORY_ARRAY {
        return Err(CudaError::NOT_SUPPORTED);
    }
    let ptr = if memory_type == 1 { host as u64 } else { device };
    Ok(NodeCopySide { memory_type, ptr, pos: Pos3 { x: x as u64, y: y as u64, z: z as u64 }, pitch: pitch as u64, height: height as u64 })
}

/// A batch memory operation node's parameters over `array` (which must outlive their use).
fn batch_node_params(context: sys::CUcontext, array: &mut [MemOpParams]) -> CudaResult<CUDA_BATCH_MEM_OP_NODE_PARAMS> {
    let count = c_uint::try_from(array.len()).map_err(|_| CudaError::INVALID_VALUE)?;
    Ok(CUDA_BATCH_MEM_OP_NODE_PARAMS { ctx: context.cast(), count, paramArray: array.as_mut_ptr().cast(), flags: 0 })
}

/// `CU_MEMORYTYPE_ARRAY`.
const MEMORY_ARRAY: c_uint = 3;

/// The largest `CUjitInputType` (`CU_JIT_INPUT_NVVM`).
const JIT_INPUT_LAST: u32 = 5;

/// A JIT link. The driver keeps pointers to the option arrays and log buffers for the link's
/// life, so they live here, beside it; so do the inputs, which the driver may read until the
/// link completes.
pub struct CudaLink {
    state: Handle<sys::CUlinkState>,
    /// Never read here: held for the driver, which keeps pointers into it.
    _options: Box<[c_int]>,
    /// Option values, pointer-sized (the driver writes the wall time and log sizes back).
    values: Box<[usize]>,
    info_log: Box<[u8]>,
    error_log: Box<[u8]>,
    inputs: Vec<Box<[u8]>>,
}

impl CudaLink {
    fn outcome(&self, code: u32) -> LinkOutcome {
        let log = |buffer: &[u8]| {
            std::ffi::CStr::from_bytes_until_nul(buffer).map(|text| text.to_string_lossy().into_owned()).unwrap_or_default()
        };
        // The driver writes the wall time as a float into its slot's low bytes.
        let wall_time_ms = f32::from_bits(self.values.first().map_or(0, |value| *value as u32));
        LinkOutcome {
            error: (code != 0).then(|| CudaError::from_driver(code)),
            info_log: log(&self.info_log),
            error_log: log(&self.error_log),
            wall_time_ms,
        }
    }
}

impl Drop for CudaLink {
    fn drop(&mut self) {
        // SAFETY: the state came from cuLinkCreate and is destroyed once, here.
        unsafe { driver_call!(driver_table(), cuLinkDestroy(self.state.0.cast())) };
    }
}

/// Option ids and values for the driver, as two parallel arrays.
fn jit_arrays(options: &[JitOption]) -> (Vec<c_int>, Vec<usize>) {
    options.iter().map(|option| (option.option as c_int, option.value as usize)).unzip()
}

/// Pinned staging buffers: host-to-device chunks are read from the socket straight into one,
/// device-to-host chunks are copied into one and sent from it. A slot is reusable once its
/// event has fired and nobody holds it. The memory is the pool's own, pinned with
/// `cuMemHostRegister`, so a context reset unpins it without freeing it: the pool pins it again
/// and makes new events (`remake`).
struct StagingPool {
    /// Every slot's bytes, one after another, in huge pages where the kernel gives them; never
    /// unmapped while the process runs.
    memory: crate::page_pool::HostMemory,
    slots: Vec<Slot>,
    state: Mutex<Vec<bool>>,
    /// How many of `state`'s flags are set (changed under its lock): waiting takers spin on
    /// this rather than on the lock the links take and give slots back under.
    in_use: AtomicUsize,
    freed: Condvar,
    /// The first pinning's outcome: its failure (logged once, as it happens) is every take's.
    pinned: CudaResult<()>,
}

struct Slot {
    ptr: *mut u8,
    capacity: usize,
    /// One event per GPU of the session (an event is recorded only on streams of its own
    /// context), the one of the last copy's stream recorded after it; replaced after a reset.
    events: Vec<AtomicPtr<sys::CUevent_st>>,
    /// Which of `events` the last copy recorded.
    last: AtomicUsize,
}

impl Slot {
    /// The event of the slot's last copy.
    fn event(&self) -> sys::CUevent {
        self.events[self.last.load(Ordering::Acquire).min(self.events.len() - 1)].load(Ordering::Acquire)
    }

    /// Records the slot's last copy, queued on `stream` of GPU `gpu`.
    ///
    /// # Safety
    /// `stream` is a live stream of GPU `gpu`'s context (or NULL with that context current).
    unsafe fn record_after(&self, stream: sys::CUstream, gpu: usize) -> CudaResult<()> {
        let gpu = gpu.min(self.events.len() - 1);
        // SAFETY: the event was created in the pool for that GPU's context, like the stream.
        check(unsafe { result::event::record(self.events[gpu].load(Ordering::Acquire), stream) })?;
        self.last.store(gpu, Ordering::Release);
        Ok(())
    }
}

// SAFETY: `ptr` points into the pool's pinned mapping, alive for the process's life; a slot's
// bytes are touched only by the holder of its `held` flag (see `StagingPool::take`).
unsafe impl Send for Slot {}
// SAFETY: as above.
unsafe impl Sync for Slot {}
/// A staging slot taken from the pool.
pub struct Staging {
    pool: Arc<StagingPool>,
    index: usize,
    len: usize,
}

impl Staging {
    fn slot(&self) -> &Slot {
        &self.pool.slots[self.index]
    }

    /// The slot's bytes once its device-to-host copy is done (read only).
    fn filled(&self) -> &[u8] {
        let slot = &self.pool.slots[self.index];
        // SAFETY: as in `bytes`; the copy that wrote them has finished (its event was waited).
        unsafe { std::slice::from_raw_parts(slot.ptr, self.len) }
    }

    fn bytes(&mut self) -> &mut [u8] {
        let slot = &self.pool.slots[self.index];
        // SAFETY: the slot's memory is `capacity` bytes of pinned host memory allocated in
        // `StagingPool::new`, `len <= capacity` (checked in `take`), and this `Staging` holds the
        // slot exclusively until it is dropped; the device copy that may still read or write it
        // was waited for in `take` (its event) before the slot was handed out.
        unsafe { std::slice::from_raw_parts_mut(slot.ptr, self.len) }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let mut held = self.pool.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        held[self.index] = false;
        self.pool.in_use.fetch_sub(1, Ordering::Release);
        self.pool.freed.notify_one();
    }
}

impl StagingPool {
    /// Slots with an event for each of `contexts` (the session's GPUs'), pinned before the worker
    /// calls itself ready (40-80 ms of its start on an H200 host): pinned beside a session's
    /// first calls, they slowed apps started one right after another (a child's first CUDA IPC
    /// open over a Unix socket, H200 2026-11-29: 1.9-2.4 ms pinned before, 44-70 ms beside).
    fn pinned(slots: usize, capacity: usize, contexts: &[sys::CUcontext]) -> CudaResult<Arc<Self>> {
        let mut pool = Self::new(slots, capacity, contexts.len())?;
        pool.pinned =
            pool.pin(contexts, 0).inspect_err(|error| tracing::warn!(%error, "pinning the staging memory failed: bulk copies fail"));
        Ok(Arc::new(pool))
    }

    fn ready(&self) -> CudaResult<()> {
        self.pinned
    }

    /// The slots, not yet pinned, with room for an event in each of `gpus` contexts.
    fn new(slots: usize, capacity: usize, gpus: usize) -> CudaResult<Self> {
        let total = slots.checked_mul(capacity).ok_or(CudaError::INVALID_VALUE)?;
        let memory = crate::page_pool::HostMemory::populated(total.max(1)).map_err(|error| {
            tracing::warn!(%error, "no memory for the staging slots");
            CudaError::MEMORY_ALLOCATION
        })?;
        let base = memory.as_ptr();
        let made = (0..slots)
            .map(|index| Slot {
                ptr: base.wrapping_add(index * capacity),
                capacity,
                events: (0..gpus).map(|_| AtomicPtr::new(std::ptr::null_mut())).collect(),
                last: AtomicUsize::new(0),
            })
            .collect();
        Ok(Self {
            memory,
            state: Mutex::new(vec![false; slots]),
            in_use: AtomicUsize::new(0),
            slots: made,
            freed: Condvar::new(),
            pinned: Ok(()),
        })
    }

    /// Pins the memory and gives every slot new events, one in each of `contexts` (at start,
    /// and after a context reset, which unpinned the one and destroyed the others); leaves
    /// `contexts[current]` current.
    fn pin(&self, contexts: &[sys::CUcontext], current: usize) -> CudaResult<()> {
        if self.slots.is_empty() {
            return Ok(());
        }
        // Pinning needs a context current on this thread (it may be a thread of its own).
        // SAFETY: a primary context of the session, retained and never released.
        check(unsafe { result::ctx::set_current(contexts[current.min(contexts.len() - 1)]) })?;
        // SAFETY: a context is current on this thread; the mapping stays for the process's
        // life. CU_MEMHOSTREGISTER_PORTABLE, as `host_register` pins: every context of the
        // process sees it pinned. Still pinned (another GPU's context kept it) is fine.
        let pinned = check(unsafe { sys::cuMemHostRegister_v2(self.memory.as_ptr().cast(), self.memory.len(), 0x01).result() });
        if pinned.is_err() && pinned != Err(CudaError::HOST_MEMORY_ALREADY_REGISTERED) {
            return pinned;
        }
        for (gpu, context) in contexts.iter().enumerate() {
            // SAFETY: a primary context of the session, retained and never released.
            check(unsafe { result::ctx::set_current(*context) })?;
            for slot in &self.slots {
                let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map_err(driver_error)?;
                slot.events[gpu].store(event, Ordering::Release);
            }
        }
        // SAFETY: as above.
        check(unsafe { result::ctx::set_current(contexts[current.min(contexts.len() - 1)]) })
    }

    /// After a context reset: pins the memory again with new events. Refused while a slot is
    /// held, as its holder may still use the old event.
    fn remake(&self, contexts: &[sys::CUcontext], current: usize) -> CudaResult<()> {
        self.ready()?;
        let held = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if held.iter().any(|taken| *taken) {
            return Err(CudaError::NOT_PERMITTED);
        }
        let pinned = self.pin(contexts, current);
        drop(held);
        pinned
    }

    /// Takes a free slot whose last copy is done, waiting if every slot is busy.
    fn take(self: &Arc<Self>, len: usize) -> CudaResult<Staging> {
        if self.slots.is_empty() || len > self.slots[0].capacity {
            return Err(CudaError::INVALID_VALUE);
        }
        self.ready()?;
        let mut held = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        loop {
            // Prefer a slot whose copy already finished; otherwise wait on the first free one.
            // Lowest index first: the slots used last stay warm in the CPU's cache.
            let mut first_free = None;
            let mut ready = None;
            for index in (0..held.len()).filter(|index| !held[*index]) {
                first_free.get_or_insert(index);
                // SAFETY: the event was created in `new` and is never destroyed.
                if unsafe { result::event::query(self.slots[index].event()) }.is_ok() {
                    ready = Some(index);
                    break;
                }
            }
            if let Some(index) = ready.or(first_free) {
                held[index] = true;
                self.in_use.fetch_add(1, Ordering::Release);
                drop(held);
                // Made first, so that a failed wait below gives the slot back as it drops.
                let staging = Staging { pool: self.clone(), index, len };
                // SAFETY: as above; waiting for the slot's last copy before its bytes are reused.
                check(unsafe { result::event::synchronize(self.slots[index].event()) })?;
                return Ok(staging);
            }
            // Every slot is on its way to the client: poll briefly (a slot frees up every few
            // hundred microseconds during a large copy) before sleeping.
            drop(held);
            let spin_until = std::time::Instant::now() + flyt_ring::spin_budget();
            while std::time::Instant::now() < spin_until {
                if self.in_use.load(Ordering::Acquire) < self.slots.len() {
                    break;
                }
                std::hint::spin_loop();
            }
            held = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if held.iter().all(|taken| *taken) {
                held = self.freed.wait(held).unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        }
    }
}

/// A device-to-host copy in flight into a staging slot.
pub struct PendingCopy {
    staging: Staging,
}

/// One GPU of the session, through its primary context.
struct Gpu {
    ordinal: c_int,
    device: sys::CUdevice,
    /// The primary context, retained (again after a reset).
    context: AtomicPtr<sys::CUctx_st>,
}

/// The session's GPUs, one driver for all of them (as in an app's own process): the current one
/// (`select_device`) is the one whose primary context is current on the session's thread, so
/// every driver call below acts on it, as the app's call would on its current device.
pub struct CudaDevice {
    gpus: Vec<Gpu>,
    current: AtomicUsize,
    /// The generated driver table (`flyt-cuda-sys`), for what cudarc lacks.
    driver: &'static DriverTable,
    staging: Arc<StagingPool>,
    /// Memory of a moved session, mapped at its old addresses.
    restored: std::sync::Mutex<super::cuda_restore::RestoredMemory>,
    /// The server pages: `malloc` makes memory in addresses this worker holds, so a page-out
    /// can release the memory and keep the addresses (`docs/design/paging.md`).
    keep_addresses: bool,
    /// The session's allocations made so (`keep_addresses`).
    own: std::sync::Mutex<super::vmm_malloc::OwnMemory>,
    /// Each GPU's NVLinks: from the listener's probe, which asks NVML once for every worker
    /// (loading and starting NVML took 77-91 ms of a worker's start on an H200), or asked of NVML
    /// as the device opens when the worker was started without them.
    nvlinks: Vec<Vec<flyt_protocol::device::NvLinkEnd>>,
}

// SAFETY: `context` is the device's primary context, which any thread may make current; the
// other fields are plain data, atomics or `Send + Sync` already.
unsafe impl Send for CudaDevice {}
// SAFETY: as above; the driver API is thread-safe.
unsafe impl Sync for CudaDevice {}

impl CudaDevice {
    /// Maps physical allocation `handle` (of `len` bytes; taken over, released with the
    /// mapping) at addresses the driver picks, readable and writable by this device.
    fn map_anywhere(&self, handle: sys::CUmemGenericAllocationHandle, len: u64) -> CudaResult<TemporaryMapping> {
        let mut mapping = TemporaryMapping { at: 0, len: len as usize, handle, mapped: false };
        let access = sys::CUmemAccessDesc { location: self.location(), flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
        // SAFETY: valid out-pointer; the reservation is `len` bytes, the handle's size; the
        // mapping covers it whole. What is done is undone when `mapping` drops.
        unsafe {
            check(sys::cuMemAddressReserve(&mut mapping.at, mapping.len, 0, 0, 0).result())?;
            check(sys::cuMemMap(mapping.at, mapping.len, 0, handle, 0).result())?;
            mapping.mapped = true;
            check(sys::cuMemSetAccess(mapping.at, mapping.len, &access, 1).result())?;
        }
        Ok(mapping)
    }

    /// A copy of `len` bytes at `ptr` in new physical memory, for a worker on this GPU: its
    /// descriptor keeps it alive (its handle here is released).
    fn copy_for_move(&self, ptr: u64, len: u64) -> CudaResult<super::MovedSpan> {
        let prop = self.allocation_prop(1)?;
        let page = self.mem_granularity(false, false)?.max(1);
        let size = len.div_ceil(page) * page;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer and a complete properties struct.
        check(unsafe { sys::cuMemCreate(&mut handle, size as usize, &prop, 0).result() })?;
        let copy = self.map_anywhere(handle, size)?;
        self.copy_dtod(copy.at, ptr, len, self.null_stream())?;
        self.synchronize()?;
        Ok(super::MovedSpan { start: ptr, len: size, copy_len: len, fd: export_descriptor(handle)? })
    }

    /// The session's device as a memory location.
    fn location(&self) -> sys::CUmemLocation {
        sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: self.gpu().device }
    }

    /// While the server pages: the session's allocations are made in addresses this worker holds
    /// (`malloc`), which a page-out keeps and a page-in maps again.
    pub fn keep_allocation_addresses(mut self, keep: bool) -> Self {
        self.keep_addresses = keep;
        self
    }

    /// Runs `work` on the session's own memory (`keep_addresses`) with the driver's primitives:
    /// memory of the current GPU, shareable as a descriptor (a move on this GPU hands it over
    /// as it hands restored memory), accessible as `access` says.
    fn with_own_memory<T>(
        &self,
        work: impl FnOnce(&mut super::vmm_malloc::OwnMemory, &mut super::cuda_restore::CudaVmm<'_>) -> T,
    ) -> Result<T, String> {
        let prop = self.allocation_prop(1).map_err(|error| error.to_string())?;
        let access = self.access();
        let mut driver = super::cuda_restore::CudaVmm::new(&prop, &access)?;
        let mut own = self.own.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        Ok(work(&mut own, &mut driver))
    }

    fn own_memory(&self) -> std::sync::MutexGuard<'_, super::vmm_malloc::OwnMemory> {
        self.own.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Who may use memory of the current GPU mapped here: the GPU itself and every session GPU
    /// with a peer path to it (as after `cuCtxEnablePeerAccess`: VMM mappings are not reached
    /// through peer access, only through their access list).
    fn access(&self) -> Vec<sys::CUmemAccessDesc> {
        let read_write = |location| sys::CUmemAccessDesc { location, flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
        let here = self.gpu().device;
        let mut access = vec![read_write(self.location())];
        for gpu in self.gpus.iter().filter(|gpu| gpu.device != here) {
            let mut can: c_int = 0;
            // SAFETY: valid out-pointer; both devices came from cuDeviceGet.
            let code = unsafe { sys::cuDeviceCanAccessPeer(&mut can, gpu.device, here) };
            if code == sys::CUresult::CUDA_SUCCESS && can == 1 {
                access.push(read_write(sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: gpu.device }));
            }
        }
        access
    }

    /// Properties of pinned memory on the session's device; `handle_types`: none or a POSIX file
    /// descriptor (what apps that may share memory ask for).
    fn allocation_prop(&self, handle_types: u32) -> CudaResult<sys::CUmemAllocationProp> {
        use sys::CUmemAllocationHandleType as Types;
        let requested = match handle_types {
            0 => Types::CU_MEM_HANDLE_TYPE_NONE,
            1 => Types::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            _ => return Err(CudaError::NOT_SUPPORTED),
        };
        Ok(sys::CUmemAllocationProp {
            type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: requested,
            location: self.location(),
            win32HandleMetaData: std::ptr::null_mut(),
            allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
                compressionType: 0,
                gpuDirectRDMACapable: 0,
                usage: 0,
                reserved: [0; 4],
            },
        })
    }

    /// Opens GPUs `ordinals` (the first current); `Err` says in words why not (no driver, no such GPU...).
    /// `nvlinks`: the GPUs' NVLinks as the listener's probe found them (`probe_nvlinks`); without
    /// them the worker asks NVML itself.
    pub fn open(
        ordinals: &[u32],
        staging_slots: usize,
        copy_chunk: usize,
        nvlinks: Option<Vec<Vec<flyt_protocol::device::NvLinkEnd>>>,
    ) -> Result<Self, String> {
        // SAFETY: probing only tries to dlopen libcuda; cudarc's other entry points panic when the
        // library is missing, so nothing else is called before this check passes.
        if !unsafe { sys::is_culib_present() } {
            return Err("no CUDA driver (libcuda.so.1 not found): use --device emulated on machines without a GPU".into());
        }
        let started = std::time::Instant::now();
        let driver = driver_table();
        require(driver, REQUIRED)?;
        require(driver, super::cuda_arrays::REQUIRED)?;
        result::init().map_err(|error| format!("cuInit failed: {error}"))?;
        let initialized = started.elapsed();
        let count = result::device::get_count().map_err(|error| format!("cuDeviceGetCount: {error}"))?;
        if ordinals.is_empty() {
            return Err("no GPU named".into());
        }
        let mut gpus = Vec::with_capacity(ordinals.len());
        for (index, ordinal) in ordinals.iter().enumerate() {
            let ordinal = c_int::try_from(*ordinal).map_err(|_| "GPU ordinal too large".to_string())?;
            if ordinal >= count {
                return Err(format!("GPU {ordinal} does not exist ({count} visible)"));
            }
            if ordinals[..index].contains(&(ordinal as u32)) {
                return Err(format!("GPU {ordinal} named twice"));
            }
            let device = result::device::get(ordinal).map_err(|error| format!("cuDeviceGet: {error}"))?;
            // SAFETY: `device` was returned by cuDeviceGet above.
            let context = unsafe { result::primary_ctx::retain(device) }.map_err(|error| format!("cuDevicePrimaryCtxRetain: {error}"))?;
            gpus.push(Gpu { ordinal, device, context: AtomicPtr::new(context) });
        }
        // SAFETY: the first GPU's primary context, just retained.
        unsafe { result::ctx::set_current(gpus[0].context.load(Ordering::Acquire)) }
            .map_err(|error| format!("cuCtxSetCurrent: {error}"))?;
        let contexts: Vec<sys::CUcontext> = gpus.iter().map(|gpu| gpu.context.load(Ordering::Acquire)).collect();
        let contexts_ready = started.elapsed();
        let staging = StagingPool::pinned(staging_slots, copy_chunk, &contexts).map_err(|error| format!("pinned staging: {error}"))?;
        let pinned = started.elapsed();
        let nvlinks = nvlinks
            .unwrap_or_else(|| super::nvlinks::session_nvlinks(&gpus.iter().map(|gpu| pci_address_of(gpu.device)).collect::<Vec<_>>()));
        let opened = Self {
            gpus,
            current: AtomicUsize::new(0),
            driver,
            staging,
            restored: std::sync::Mutex::default(),
            keep_addresses: false,
            own: std::sync::Mutex::default(),
            nvlinks,
        };
        // How long a worker takes to become ready bounds how fast back-to-back apps start.
        let ms = |elapsed: std::time::Duration| elapsed.as_micros() as f64 / 1e3;
        tracing::info!(
            init_ms = ms(initialized),
            contexts_ms = ms(contexts_ready - initialized),
            staging_ms = ms(pinned - contexts_ready),
            "device open"
        );
        Ok(opened)
    }

    /// The current GPU.
    fn gpu(&self) -> &Gpu {
        &self.gpus[self.current.load(Ordering::Relaxed).min(self.gpus.len() - 1)]
    }

    /// The GPU whose context `stream` belongs to: the current one for the legacy stream (and for
    /// a stream of a green context).
    fn stream_gpu(&self, stream: Handle<sys::CUstream>) -> usize {
        let current = self.current.load(Ordering::Relaxed);
        if self.gpus.len() == 1 || stream.0.is_null() {
            return current;
        }
        let mut context: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the stream is one of the session's, alive.
        if unsafe { sys::cuStreamGetCtx(stream.0, &mut context) } != sys::CUresult::CUDA_SUCCESS {
            return current;
        }
        self.gpus.iter().position(|gpu| gpu.context.load(Ordering::Acquire) == context).unwrap_or(current)
    }

    /// The device's primary context, current on the session's threads.
    pub(super) fn primary_context(&self) -> sys::CUcontext {
        self.gpu().context.load(Ordering::Acquire)
    }

    pub(super) fn device(&self) -> sys::CUdevice {
        self.gpu().device
    }

    fn attribute(&self, attribute: u32) -> Option<i32> {
        self.attribute_of(self.gpu().device, attribute)
    }

    fn attribute_of(&self, device: sys::CUdevice, attribute: u32) -> Option<i32> {
        let mut value: c_int = 0;
        let attribute = c_int::try_from(attribute).ok()?;
        // SAFETY: `value` is a valid out-pointer; an unknown attribute is an error code, not UB.
        let code = unsafe { driver_call!(self.driver, cuDeviceGetAttribute(&mut value, attribute as c_uint, device)) };
        (code == 0).then_some(value)
    }

    fn info_of(&self, gpu: &Gpu) -> DeviceInfo {
        let name = result::device::get_name(gpu.device).unwrap_or_else(|_| format!("GPU {}", gpu.ordinal));
        let uuid = result::device::get_uuid(gpu.device).map(|uuid| uuid.bytes.map(|b| b as u8)).unwrap_or([0; 16]);
        let mut luid = [0 as std::ffi::c_char; 8];
        let mut luid_device_node_mask: c_uint = 0;
        // SAFETY: valid out-pointers of the documented sizes; failure (no LUID on Linux) leaves
        // them zeroed, as the runtime reports.
        let _ = unsafe { sys::cuDeviceGetLuid(luid.as_mut_ptr(), &mut luid_device_node_mask, gpu.device) };
        // SAFETY: `gpu.device` came from cuDeviceGet.
        let total_mem = unsafe { result::device::total_mem(gpu.device) }.unwrap_or(0) as u64;
        let attributes = (1..=LAST_ATTRIBUTE).filter_map(|id| Some((id, self.attribute_of(gpu.device, id)?))).collect();
        DeviceInfo { name, uuid, luid: luid.map(|b| b as u8), luid_device_node_mask, total_mem, attributes }
    }
}

fn stream_ptr(stream: Handle<sys::CUstream>) -> sys::CUstream {
    stream.0
}

impl Device for CudaDevice {
    type Stream = Handle<sys::CUstream>;
    type Event = Handle<sys::CUevent>;
    type Module = Handle<sys::CUmodule>;
    type Link = CudaLink;
    type Function = Handle<sys::CUfunction>;
    type Staging = Staging;
    type PendingCopy = PendingCopy;
    type Graph = Handle<sys::CUgraph>;
    type GraphNode = Handle<sys::CUgraphNode>;
    type GraphExec = Handle<sys::CUgraphExec>;
    type MemHandle = u64;
    type MemPool = Handle<sys::CUmemoryPool>;
    type Array = Handle<sys::CUarray>;
    type Mipmap = Handle<sys::CUmipmappedArray>;
    type Resource = super::cuda_green::RawResource;
    type ResourceDesc = Handle<sys::CUdevResourceDesc>;
    type GreenCtx = super::cuda_green::GreenHandle;

    fn info(&self) -> DeviceInfo {
        self.info_of(self.gpu())
    }

    fn device_count(&self) -> usize {
        self.gpus.len()
    }

    fn current_device(&self) -> usize {
        self.current.load(Ordering::Relaxed)
    }

    fn select_device(&self, index: usize) -> CudaResult<()> {
        let gpu = self.gpus.get(index).ok_or(CudaError::INVALID_DEVICE)?;
        // SAFETY: that GPU's primary context, retained in `open` (or `reset`) and never released.
        check(unsafe { result::ctx::set_current(gpu.context.load(Ordering::Acquire)) })?;
        self.current.store(index, Ordering::Relaxed);
        Ok(())
    }

    fn infos(&self) -> Vec<DeviceInfo> {
        self.gpus.iter().map(|gpu| self.info_of(gpu)).collect()
    }

    fn peer_links(&self) -> Vec<PeerLink> {
        let mut links = Vec::new();
        for (from, a) in self.gpus.iter().enumerate() {
            for (to, b) in self.gpus.iter().enumerate().filter(|(to, _)| *to != from) {
                let p2p = |attribute: sys::CUdevice_P2PAttribute| {
                    let mut value: c_int = 0;
                    // SAFETY: valid out-pointer; both devices came from cuDeviceGet.
                    let code = unsafe { sys::cuDeviceGetP2PAttribute(&mut value, attribute, a.device, b.device) };
                    if code == sys::CUresult::CUDA_SUCCESS { value } else { 0 }
                };
                use sys::CUdevice_P2PAttribute as P2p;
                links.push(PeerLink {
                    from: from as u32,
                    to: to as u32,
                    access_supported: p2p(P2p::CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED),
                    performance_rank: p2p(P2p::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK),
                    native_atomics: p2p(P2p::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED),
                    array_access: p2p(P2p::CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED),
                });
            }
        }
        links
    }

    fn nvlinks(&self) -> Vec<Vec<flyt_protocol::device::NvLinkEnd>> {
        self.nvlinks.clone()
    }

    fn stream_device(&self, stream: Self::Stream) -> usize {
        self.stream_gpu(stream)
    }

    fn event_create_on(&self, device: usize, flags: u32) -> CudaResult<Self::Event> {
        let current = self.current_device();
        if device == current {
            return self.event_create(flags);
        }
        let gpu = self.gpus.get(device).ok_or(CudaError::INVALID_DEVICE)?;
        // SAFETY: primary contexts of the session, retained and never released; the current one
        // is made current again before returning.
        unsafe {
            check(result::ctx::set_current(gpu.context.load(Ordering::Acquire)))?;
            let made = self.event_create(flags);
            check(result::ctx::set_current(self.gpus[current].context.load(Ordering::Acquire)))?;
            made
        }
    }

    fn peer_access(&self, peer: usize, enable: bool, flags: u32) -> CudaResult<()> {
        let peer = self.gpus.get(peer).ok_or(CudaError::INVALID_DEVICE)?;
        let context = peer.context.load(Ordering::Acquire);
        // SAFETY: the peer GPU's primary context, retained and never released; the current
        // context is the current GPU's (the session's thread).
        check(unsafe {
            if enable { sys::cuCtxEnablePeerAccess(context, flags).result() } else { sys::cuCtxDisablePeerAccess(context).result() }
        })
    }

    fn driver_version(&self) -> i32 {
        let mut version: c_int = 0;
        // SAFETY: valid out-pointer.
        let _ = unsafe { sys::cuDriverGetVersion(&mut version) };
        version
    }

    fn emulated(&self) -> bool {
        false
    }

    fn bind_thread(&self) -> CudaResult<()> {
        // SAFETY: the primary context, retained in `open` (or `reset`) and never released.
        check(unsafe { result::ctx::set_current(self.gpu().context.load(Ordering::Acquire)) })
    }

    fn null_stream(&self) -> Self::Stream {
        Handle(std::ptr::null_mut())
    }

    fn malloc(&self, size: u64) -> CudaResult<u64> {
        if self.keep_addresses {
            return self.with_own_memory(|own, driver| own.allocate(driver, size)).unwrap_or_else(|reason| {
                tracing::warn!(%reason, "no device memory for an allocation");
                Err(CudaError::MEMORY_ALLOCATION)
            });
        }
        let size = usize::try_from(size).map_err(|_| CudaError::MEMORY_ALLOCATION)?;
        // SAFETY: a context is current on this thread (bound at start).
        unsafe { result::malloc_sync(size) }.map_err(driver_error)
    }

    fn free(&self, ptr: u64) -> CudaResult<()> {
        if self.own_memory().contains(ptr) {
            // As cuMemFree: the device's work is done first (the freed room may be given out
            // again at once).
            check(result::ctx::synchronize())?;
            let freed = self.with_own_memory(|own, driver| own.free(driver, ptr)).map_err(|reason| {
                tracing::warn!(%reason, ptr = format_args!("{ptr:#x}"), "freeing an allocation");
                CudaError::UNKNOWN
            })?;
            return freed.unwrap_or(Err(CudaError::INVALID_VALUE));
        }
        if let Some(code) = self.restored.lock().unwrap_or_else(std::sync::PoisonError::into_inner).free(ptr) {
            return check(code.result());
        }
        // SAFETY: `ptr` is the start of an allocation of this session (checked in the range map).
        check(unsafe { result::free_sync(ptr) })
    }

    fn export_for_move(&self, allocations: &[(u64, u64)]) -> CudaResult<super::MovedMemory> {
        let restored = self.restored.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let own = self.own_memory();
        let mut moved = super::MovedMemory::default();
        let mut exported = std::collections::HashSet::new();
        for &(ptr, len) in allocations {
            // The session's own memory (the server pages): a span with its handle, as restored
            // memory is; several packed allocations share one.
            let own_span = match own.span_of(ptr) {
                Some(span) => match span.handle {
                    Some(handle) => Some((span.start, span.len, handle)),
                    None => {
                        tracing::warn!(ptr = format_args!("{ptr:#x}"), "memory paged out cannot be exported");
                        return Err(CudaError::NOT_READY);
                    }
                },
                None => None,
            };
            match own_span.or_else(|| restored.span_of(ptr)) {
                Some((start, span_len, handle)) => {
                    if exported.insert(start) {
                        let fd = export_descriptor(handle)?;
                        moved.spans.push(super::MovedSpan { start, len: span_len, copy_len: span_len, fd });
                    }
                }
                None => match self.ipc_mem_handle(ptr) {
                    Ok(handle) => moved.ipc.push((ptr, len, handle)),
                    // Memory the driver shares by no IPC handle (a pool's) goes over in a copy.
                    Err(_) => moved.spans.push(self.copy_for_move(ptr, len)?),
                },
            }
        }
        Ok(moved)
    }

    fn import_for_move(&self, moved: super::MovedMemory) -> Result<(), String> {
        let null = self.null_stream();
        let mut opened = Vec::new();
        let mut mapped = Vec::new();
        let outcome = (|| {
            for (ptr, len, handle) in &moved.ipc {
                // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: the source may sit on a peer GPU.
                let (source, available) =
                    self.ipc_open_mem(handle, 1).map_err(|error| format!("opening the allocation at {ptr:#x}: {error}"))?;
                opened.push(source);
                if available < *len {
                    return Err(format!("the allocation at {ptr:#x} holds {available} bytes, not {len}"));
                }
                self.copy_dtod(*ptr, source, *len, null).map_err(|error| format!("copying {len} bytes to {ptr:#x}: {error}"))?;
            }
            for span in &moved.spans {
                let start = span.start;
                let mut handle: sys::CUmemGenericAllocationHandle = 0;
                // SAFETY: valid out-pointer; the descriptor came from the source worker's export.
                check(unsafe {
                    sys::cuMemImportFromShareableHandle(
                        &mut handle,
                        std::os::fd::AsRawFd::as_raw_fd(&span.fd) as usize as *mut std::ffi::c_void,
                        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                    )
                    .result()
                })
                .map_err(|error| format!("importing the memory at {start:#x}: {error}"))?;
                let source = self.map_anywhere(handle, span.len).map_err(|error| format!("mapping the memory at {start:#x}: {error}"))?;
                let at = source.at;
                mapped.push(source);
                self.copy_dtod(start, at, span.copy_len, null)
                    .map_err(|error| format!("copying {} bytes to {start:#x}: {error}", span.copy_len))?;
            }
            self.synchronize().map_err(|error| format!("copying the moved memory: {error}"))
        })();
        for source in opened {
            let _ = self.ipc_close_mem(source);
        }
        // The copies from the mappings are done (or failed): they go.
        drop(mapped);
        outcome
    }

    fn page_out(&self, allocations: &[(u64, u64)]) -> Result<(), (String, bool)> {
        // The caller saved the bytes after a synchronize. The session's own memory (all of it
        // while the server pages) releases its physical memory, its reservations staying.
        let (own, others): (Vec<_>, Vec<_>) = allocations.iter().copied().partition(|(ptr, _)| self.own_memory().contains(*ptr));
        let mut failed = Vec::new();
        let mut released = false;
        if !own.is_empty() {
            match self.with_own_memory(|memory, driver| memory.page_out(driver, &own)) {
                Ok(out) => {
                    released |= out.released;
                    failed.extend(out.failed);
                }
                Err(reason) => failed.push(reason),
            }
        }
        // Other memory: a restored span's goes with its last allocation, its addresses held
        // already; the driver's own is freed, then its addresses are held in reservations of this
        // worker's (which the driver may refuse: it keeps freed addresses for its allocator).
        for &(ptr, len) in &others {
            let unmapped = self.restored.lock().unwrap_or_else(std::sync::PoisonError::into_inner).unmap(ptr);
            let freed = match unmapped {
                Some(code) => check(code.result()),
                // SAFETY: `ptr` is the start of an allocation of this session (its range map).
                None => check(unsafe { result::free_sync(ptr) }),
            };
            match freed {
                Ok(()) => released = true,
                Err(error) => failed.push(format!("releasing {len} bytes at {ptr:#x}: {error}")),
            }
        }
        if !others.is_empty() {
            // Nothing of the session's allocates until its page-in, which says if they are taken.
            let held = self
                .allocation_prop(1)
                .map_err(|error| error.to_string())
                .and_then(|prop| self.restored.lock().unwrap_or_else(std::sync::PoisonError::into_inner).hold(&others, &prop));
            if let Err(reason) = held {
                tracing::warn!(%reason, "paged-out addresses not all held");
            }
        }
        if failed.is_empty() { Ok(()) } else { Err((failed.join("; "), released)) }
    }

    fn page_groups(&self, allocations: &[(u64, u64)]) -> Vec<Vec<(u64, u64)>> {
        // Each span of the session's own memory on its own; other memory by the spans a restore
        // maps.
        let (mut groups, others) = self.own_memory().groups(allocations);
        if others.is_empty() {
            return groups;
        }
        let restored =
            self.allocation_prop(1).map_err(|error| error.to_string()).and_then(|prop| super::cuda_restore::span_groups(&others, &prop));
        groups.extend(restored.unwrap_or_else(|reason| {
            tracing::debug!(%reason, "paged memory mapped back in one piece");
            vec![others]
        }));
        groups
    }

    fn page_in(&self, allocations: &[(u64, u64)]) -> Result<(), String> {
        let (own, others): (Vec<_>, Vec<_>) = allocations.iter().copied().partition(|(ptr, _)| self.own_memory().contains(*ptr));
        if !own.is_empty() {
            self.with_own_memory(|memory, driver| memory.page_in(driver, &own))??;
        }
        if others.is_empty() {
            return Ok(());
        }
        let restored = self.restore_allocations(&others, &[]);
        if restored.is_err() && !own.is_empty() {
            // Nothing of this page-in stays mapped.
            let _ = self.with_own_memory(|memory, driver| memory.page_out(driver, &own));
        }
        restored
    }

    fn restore_allocations(&self, allocations: &[(u64, u64)], reservations: &[(u64, u64)]) -> Result<(), String> {
        // Shareable as a descriptor, so a later move on this GPU can hand the memory over. A
        // session of several GPUs: every session GPU with a peer path may use it (peer access
        // does not reach VMM mappings; the session enables it again where the app had).
        let prop = self.allocation_prop(1).map_err(|error| error.to_string())?;
        let access = self.access();
        self.restored.lock().unwrap_or_else(std::sync::PoisonError::into_inner).restore(allocations, reservations, &prop, &access)
    }

    fn mem_get_info(&self) -> CudaResult<(u64, u64)> {
        result::mem_get_info().map(|(free, total)| (free as u64, total as u64)).map_err(driver_error)
    }

    fn staging(&self, len: usize) -> CudaResult<Staging> {
        self.staging.take(len)
    }

    fn staging_bytes(staging: &mut Staging) -> &mut [u8] {
        staging.bytes()
    }

    fn shorten_staging(staging: &mut Staging, len: usize) {
        staging.len = staging.len.min(len);
    }

    fn copy_htod(&self, dst: u64, src: Staging, stream: Self::Stream) -> CudaResult<()> {
        let slot = src.slot();
        // SAFETY: `dst..dst+len` was validated against the session's allocations; the source is
        // the held staging slot of `len` bytes; recording the slot's event after the copy keeps
        // the slot from being reused (`StagingPool::take` waits on it) before the DMA is done.
        unsafe {
            check(sys::cuMemcpyHtoDAsync_v2(dst, slot.ptr as *const c_void, src.len, stream_ptr(stream)).result())?;
            slot.record_after(stream_ptr(stream), self.stream_gpu(stream))
        }
    }

    fn start_dtoh(&self, src: u64, dst: Staging, stream: Self::Stream) -> CudaResult<PendingCopy> {
        let slot = dst.slot();
        // SAFETY: `src..src+len` was validated against the session's ranges; the destination is
        // the held staging slot, which stays held until `finish_dtoh` has waited for the event.
        unsafe {
            check(sys::cuMemcpyDtoHAsync_v2(slot.ptr as *mut c_void, src, dst.len, stream_ptr(stream)).result())?;
            slot.record_after(stream_ptr(stream), self.stream_gpu(stream))?;
        }
        Ok(PendingCopy { staging: dst })
    }

    fn dtoh_done(&self, pending: &PendingCopy) -> bool {
        // SAFETY: the event was created with the pool and recorded after the copy in `start_dtoh`.
        check(unsafe { result::event::query(pending.staging.slot().event()) }) != Err(CudaError::NOT_READY)
    }

    fn dtoh_bytes<'a>(&self, pending: &'a PendingCopy) -> CudaResult<&'a [u8]> {
        // SAFETY: as in `dtoh_done`; a finished event returns at once (and flushes nothing else).
        check(unsafe { result::event::synchronize(pending.staging.slot().event()) })?;
        Ok(pending.staging.filled())
    }

    fn copy_dtod(&self, dst: u64, src: u64, len: u64, stream: Self::Stream) -> CudaResult<()> {
        let len = usize::try_from(len).map_err(|_| CudaError::INVALID_VALUE)?;
        // SAFETY: both ranges were validated against the session's ranges.
        check(unsafe { result::memcpy_dtod_async(dst, src, len, stream_ptr(stream)) })
    }

    /// Pinned host memory mapped for the device (`CU_MEMHOSTALLOC_PORTABLE | DEVICEMAP`), named
    /// by its device pointer.
    fn graph_staging_alloc(&self, len: u64) -> CudaResult<(u64, *mut u8)> {
        let len = usize::try_from(len).map_err(|_| CudaError::MEMORY_ALLOCATION)?;
        let mut host: *mut c_void = std::ptr::null_mut();
        // Made while the app captures (a captured host copy), whose global mode forbids pinned
        // allocations on this thread: the allocation is the server's, outside the app's graph.
        let app_mode = self.exchange_capture_mode(CAPTURE_MODE_RELAXED)?;
        // SAFETY: an allocation into a local out-variable.
        let allocated = check(unsafe { sys::cuMemHostAlloc(&mut host, len, 0x01 | 0x02).result() });
        self.exchange_capture_mode(app_mode)?;
        allocated?;
        let mut device_pointer: sys::CUdeviceptr = 0;
        // SAFETY: `host` was just allocated mapped; a query into a local out-variable.
        let mapped = check(unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device_pointer, host, 0).result() });
        if let Err(error) = mapped {
            // SAFETY: `host` came from cuMemHostAlloc above and nothing names it.
            let _ = unsafe { sys::cuMemFreeHost(host).result() };
            return Err(error);
        }
        Ok((device_pointer, host.cast()))
    }

    fn graph_staging_free(&self, address: u64) -> CudaResult<()> {
        let mut host: *mut c_void = std::ptr::null_mut();
        // SAFETY: a query into a local out-variable (the driver checks `address`).
        check(unsafe {
            sys::cuPointerGetAttribute((&raw mut host).cast(), sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_HOST_POINTER, address)
                .result()
        })?;
        // A launch of an executable graph destroyed since may still copy through it, on any of
        // the session's GPUs: their work ends first (the session's read-ahead answers host
        // calls meanwhile).
        for gpu in &self.gpus {
            let context = gpu.context.load(Ordering::Acquire);
            // SAFETY: the session's primary contexts, retained while it lives; each pushed
            // context is popped again, so the current one stays current.
            let synchronized = unsafe {
                check(sys::cuCtxPushCurrent_v2(context).result()).and_then(|()| {
                    let synchronized = check(sys::cuCtxSynchronize().result());
                    let mut popped: sys::CUcontext = std::ptr::null_mut();
                    let _ = sys::cuCtxPopCurrent_v2(&mut popped);
                    synchronized
                })
            };
            if let Err(error) = synchronized {
                tracing::warn!(%error, "synchronizing before freeing a graph copy's staging");
            }
        }
        let app_mode = self.exchange_capture_mode(CAPTURE_MODE_RELAXED)?;
        // SAFETY: no graph or executable graph that names it is left, and the device's work is
        // done (or failed, and runs no more).
        let freed = check(unsafe { sys::cuMemFreeHost(host).result() });
        self.exchange_capture_mode(app_mode)?;
        freed
    }

    unsafe fn host_register(&self, ptr: *mut u8, len: usize, mapped: bool) -> CudaResult<()> {
        // CU_MEMHOSTREGISTER_PORTABLE (usable from any context of this process), and DEVICEMAP.
        let flags = if mapped { 0x01 | 0x02 } else { 0x01 };
        // SAFETY: the caller guarantees the range is mapped for as long as it is registered.
        check(unsafe { sys::cuMemHostRegister_v2(ptr.cast(), len, flags).result() })
    }

    fn host_device_pointer(&self, ptr: *mut u8) -> CudaResult<u64> {
        let mut device_pointer: sys::CUdeviceptr = 0;
        // SAFETY: a query into a local out-variable; the driver checks `ptr` is registered.
        check(unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device_pointer, ptr.cast(), 0).result() })?;
        Ok(device_pointer)
    }

    unsafe fn host_unregister(&self, ptr: *mut u8) -> CudaResult<()> {
        // SAFETY: the caller guarantees `ptr` was registered.
        check(unsafe { sys::cuMemHostUnregister(ptr.cast()).result() })
    }

    unsafe fn copy_from_host(&self, dst: u64, src: *const u8, len: usize, stream: Self::Stream) -> CudaResult<()> {
        // SAFETY: `dst` was validated against the session's ranges; the caller guarantees the
        // source is registered host memory mapped while the DMA runs.
        check(unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, stream.0).result() })
    }

    unsafe fn copy_to_host(&self, dst: *mut u8, src: u64, len: usize, stream: Self::Stream) -> CudaResult<()> {
        // SAFETY: `src` was validated against the session's ranges; the caller guarantees the
        // destination is registered host memory mapped while the DMA runs.
        check(unsafe { sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, len, stream.0).result() })
    }

    fn memset(&self, dst: u64, pattern: u32, width: u8, len: u64, stream: Self::Stream) -> CudaResult<()> {
        let len = usize::try_from(len).map_err(|_| CudaError::INVALID_VALUE)?;
        let stream = stream_ptr(stream);
        // SAFETY: the range was validated against the session's ranges, and `dst` and `len` are
        // multiples of the element width (checked by the session).
        check(unsafe {
            match width {
                1 => result::memset_d8_async(dst, pattern as u8, len, stream),
                2 => sys::cuMemsetD16Async(dst, pattern as u16, len / 2, stream).result(),
                _ => sys::cuMemsetD32Async(dst, pattern, len / 4, stream).result(),
            }
        })
    }

    unsafe fn memset_mapped_host(&self, dst: u64, pattern: u32, width: u8, len: u64, stream: Self::Stream) -> CudaResult<()> {
        // Unified addressing: the driver's memset takes mapped host memory at its host address.
        self.memset(dst, pattern, width, len, stream)
    }

    fn load_module(&self, image: &[u8]) -> CudaResult<Self::Module> {
        // The driver parses the fatbinary in place: give it 8-byte alignment.
        let mut aligned = vec![0u64; image.len().div_ceil(8)];
        for (word, chunk) in aligned.iter_mut().zip(image.chunks(8)) {
            let mut bytes = [0u8; 8];
            bytes[..chunk.len()].copy_from_slice(chunk);
            *word = u64::from_ne_bytes(bytes);
        }
        // SAFETY: `aligned` holds the whole image; the driver copies what it keeps.
        unsafe { result::module::load_data(aligned.as_ptr().cast()) }.map(Handle).map_err(driver_error)
    }

    fn function(&self, module: &Self::Module, name: &str) -> CudaResult<(Self::Function, Vec<ParamInfo>)> {
        let name = CString::new(name).map_err(|_| CudaError::INVALID_DEVICE_FUNCTION)?;
        // SAFETY: `module` is a loaded module of this session.
        let function = unsafe { result::module::get_function(module.0, name) }.map_err(driver_error)?;
        let mut params = Vec::new();
        // cuFuncGetParamCount is newer than driver 580's API level: ask by index until it fails.
        for index in 0.. {
            let (mut offset, mut size) = (0usize, 0usize);
            // SAFETY: valid out-pointers; an index past the last parameter is an error code.
            let code = unsafe { driver_call!(self.driver, cuFuncGetParamInfo(function.cast(), index, &mut offset, &mut size)) };
            if code != 0 {
                break;
            }
            let offset = u32::try_from(offset).map_err(|_| CudaError::INVALID_VALUE)?;
            let size = u32::try_from(size).map_err(|_| CudaError::INVALID_VALUE)?;
            params.push(ParamInfo { offset, size });
        }
        Ok((Handle(function), params))
    }

    fn function_names(&self, module: &Self::Module) -> CudaResult<Vec<String>> {
        let mut count: c_uint = 0;
        // SAFETY: `module` is a loaded module of this session; valid out-pointer.
        raw_check(unsafe { driver_call!(self.driver, cuModuleGetFunctionCount(&mut count, module.0.cast())) })?;
        let mut functions: Vec<sys::CUfunction> = vec![std::ptr::null_mut(); count as usize];
        // SAFETY: room for `count` handles, as asked.
        raw_check(unsafe { driver_call!(self.driver, cuModuleEnumerateFunctions(functions.as_mut_ptr().cast(), count, module.0.cast())) })?;
        functions
            .into_iter()
            .map(|function| {
                let mut name: *const c_char = std::ptr::null();
                // SAFETY: a function of the loaded module; valid out-pointer.
                raw_check(unsafe { driver_call!(self.driver, cuFuncGetName(&mut name, function.cast())) })?;
                if name.is_null() {
                    return Err(CudaError::UNKNOWN);
                }
                // SAFETY: the driver's NUL-terminated name, alive while the module is loaded.
                Ok(unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy().into_owned())
            })
            .collect()
    }

    fn variable(&self, module: &Self::Module, name: &str) -> CudaResult<(u64, u64, bool)> {
        let name = CString::new(name).map_err(|_| CudaError::INVALID_SYMBOL)?;
        let (mut address, mut size): (sys::CUdeviceptr, usize) = (0, 0);
        // SAFETY: `module` is loaded; valid out-pointers.
        check(unsafe { sys::cuModuleGetGlobal_v2(&mut address, &mut size, module.0, name.as_ptr()).result() })?;
        let mut managed: c_uint = 0;
        // SAFETY: a valid out-pointer of the attribute's type; the address is the module's.
        let asked = unsafe {
            sys::cuPointerGetAttribute((&raw mut managed).cast(), sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED, address)
        };
        Ok((address, size as u64, asked == sys::cudaError_enum::CUDA_SUCCESS && managed != 0))
    }

    fn unload_module(&self, module: Self::Module) -> CudaResult<()> {
        // SAFETY: the session removed the module from its map, so nothing launches from it again.
        check(unsafe { result::module::unload(module.0) })
    }

    fn link_create(&self, options: &[JitOption], info_log: usize, error_log: usize) -> CudaResult<CudaLink> {
        let mut info_log = vec![0u8; info_log.max(1)].into_boxed_slice();
        let mut error_log = vec![0u8; error_log.max(1)].into_boxed_slice();
        // The server's own options first (the wall time's slot is read back by position), then
        // the app's.
        let own = [
            (JitOption::WALL_TIME, 0),
            (JitOption::INFO_LOG_BUFFER, info_log.as_mut_ptr() as usize),
            (JitOption::INFO_LOG_BUFFER_SIZE_BYTES, info_log.len()),
            (JitOption::ERROR_LOG_BUFFER, error_log.as_mut_ptr() as usize),
            (JitOption::ERROR_LOG_BUFFER_SIZE_BYTES, error_log.len()),
        ];
        let (mut ids, mut values) = jit_arrays(&own.map(|(option, value)| JitOption { option, value: value as u64 }));
        let (app_ids, app_values) = jit_arrays(options);
        ids.extend(app_ids);
        values.extend(app_values);
        let (mut ids, mut values) = (ids.into_boxed_slice(), values.into_boxed_slice());
        let mut state: sys::CUlinkState = std::ptr::null_mut();
        let count = c_uint::try_from(ids.len()).map_err(|_| CudaError::INVALID_VALUE)?;
        // SAFETY: `ids` and `values` have `count` entries and, like the log buffers they point
        // at, are boxed and kept in the returned link for its whole life, as cuLinkCreate requires.
        let code = unsafe {
            driver_call!(self.driver, cuLinkCreate_v2(count, ids.as_mut_ptr().cast(), values.as_mut_ptr().cast(), (&raw mut state).cast()))
        };
        raw_check(code)?;
        Ok(CudaLink { state: Handle(state), _options: ids, values, info_log, error_log, inputs: Vec::new() })
    }

    fn link_add(&self, link: &mut CudaLink, kind: u32, name: &str, data: Vec<u8>, options: &[JitOption]) -> LinkOutcome {
        let refused = |error| LinkOutcome { error: Some(error), ..link.outcome(0) };
        if kind > JIT_INPUT_LAST {
            return refused(CudaError::INVALID_VALUE);
        }
        let Ok(name) = CString::new(name) else { return refused(CudaError::INVALID_VALUE) };
        let (mut ids, mut values) = jit_arrays(options);
        let Ok(count) = c_uint::try_from(ids.len()) else { return refused(CudaError::INVALID_VALUE) };
        let mut input = data.into_boxed_slice();
        // SAFETY: the link is live; `input` is kept in the link until it is destroyed; `name`
        // and the option arrays (`count` entries) outlive the call.
        let code = unsafe {
            driver_call!(
                self.driver,
                cuLinkAddData_v2(
                    link.state.0.cast(),
                    kind,
                    input.as_mut_ptr().cast(),
                    input.len(),
                    name.as_ptr(),
                    count,
                    ids.as_mut_ptr().cast(),
                    values.as_mut_ptr().cast(),
                )
            )
        };
        link.inputs.push(input);
        link.outcome(code)
    }

    fn link_complete(&self, link: &mut CudaLink) -> (LinkOutcome, Vec<u8>) {
        let (mut cubin, mut size): (*mut c_void, usize) = (std::ptr::null_mut(), 0);
        // SAFETY: the link is live; valid out-pointers.
        let code = unsafe { driver_call!(self.driver, cuLinkComplete(link.state.0.cast(), &mut cubin, &mut size)) };
        let bytes = if code == 0 && !cubin.is_null() {
            // SAFETY: on success the driver hands out `size` bytes that live as long as the link.
            unsafe { std::slice::from_raw_parts(cubin.cast::<u8>(), size) }.to_vec()
        } else {
            Vec::new()
        };
        (link.outcome(code), bytes)
    }

    fn launch(&self, function: Self::Function, shape: LaunchShape<'_>, stream: Self::Stream, args: &mut [u8]) -> CudaResult<()> {
        let LaunchShape { grid, block, shared_mem, attributes } = shape;
        let mut size = args.len();
        // CU_LAUNCH_PARAM_BUFFER_POINTER / _SIZE / _END: the driver takes the packed argument
        // buffer as it is, laid out by cuFuncGetParamInfo.
        let mut extra: [*mut c_void; 5] = [
            std::ptr::without_provenance_mut(1),
            args.as_mut_ptr().cast(),
            std::ptr::without_provenance_mut(2),
            (&raw mut size).cast(),
            std::ptr::null_mut(),
        ];
        let extra_ptr = if args.is_empty() { std::ptr::null_mut() } else { extra.as_mut_ptr() };
        if attributes.is_empty() {
            flyt_ring::timeline::mark(flyt_ring::timeline::Stage::DriverLaunch);
            // SAFETY: `function` belongs to a loaded module; `args` has exactly the layout's size
            // (checked by the session), and `extra` and `size` outlive the call, which copies them.
            let launched = check(unsafe {
                sys::cuLaunchKernel(
                    function.0,
                    grid.x,
                    grid.y,
                    grid.z,
                    block.x,
                    block.y,
                    block.z,
                    shared_mem,
                    stream_ptr(stream),
                    std::ptr::null_mut(),
                    extra_ptr,
                )
                .result()
            });
            flyt_ring::timeline::mark(flyt_ring::timeline::Stage::DriverLaunched);
            return launched;
        }
        let mut attributes = launch_attributes(attributes)?;
        let config = launch_config(shape, stream_ptr(stream), &mut attributes)?;
        // SAFETY: as above; `config` points at `attributes`, which outlive the call.
        check(unsafe { sys::cuLaunchKernelEx(&config, function.0, std::ptr::null_mut(), extra_ptr).result() })
    }

    fn texture_1d_linear_max_width(&self, format: u32, channels: u32) -> CudaResult<u64> {
        let mut width = 0usize;
        // SAFETY: valid out-pointer; the format and channel count are plain values the driver checks.
        raw_check(unsafe {
            driver_call!(self.driver, cuDeviceGetTexture1DLinearMaxWidth(&mut width, format, channels, self.gpu().device))
        })?;
        Ok(width as u64)
    }

    fn atomic_capabilities(&self, operations: &[u32], peer: bool) -> CudaResult<Vec<u32>> {
        let count = c_uint::try_from(operations.len()).map_err(|_| CudaError::INVALID_VALUE)?;
        let mut capabilities = vec![0; operations.len()];
        // SAFETY: both arrays hold `count` entries; the operations are plain values the driver checks.
        let code = unsafe {
            if peer {
                driver_call!(
                    self.driver,
                    cuDeviceGetP2PAtomicCapabilities(
                        capabilities.as_mut_ptr(),
                        operations.as_ptr(),
                        count,
                        self.gpu().device,
                        self.gpu().device,
                    )
                )
            } else {
                driver_call!(
                    self.driver,
                    cuDeviceGetHostAtomicCapabilities(capabilities.as_mut_ptr(), operations.as_ptr(), count, self.gpu().device)
                )
            }
        };
        raw_check(code)?;
        Ok(capabilities)
    }

    fn available_dynamic_smem(&self, function: Self::Function, num_blocks: i32, block_size: i32) -> CudaResult<u64> {
        let mut bytes = 0usize;
        // SAFETY: `function` belongs to a loaded module; valid out-pointer.
        check(unsafe { sys::cuOccupancyAvailableDynamicSMemPerBlock(&mut bytes, function.0, num_blocks, block_size).result() })?;
        Ok(bytes as u64)
    }

    fn occupancy_max_active_clusters(&self, function: Self::Function, shape: LaunchShape<'_>) -> CudaResult<i32> {
        cluster_occupancy(function, shape, sys::cuOccupancyMaxActiveClusters)
    }

    fn func_attributes(&self, function: Self::Function) -> CudaResult<FuncAttributes> {
        let get = |attribute: c_int| -> CudaResult<i32> {
            let mut value = 0;
            // SAFETY: valid out-pointer; `function` belongs to a loaded module.
            raw_check(unsafe { driver_call!(self.driver, cuFuncGetAttribute(&mut value, attribute as c_uint, function.0.cast())) })?;
            Ok(value)
        };
        let size = |attribute| get(attribute).map(|value| u64::try_from(value).unwrap_or(0));
        Ok(FuncAttributes {
            max_threads_per_block: get(0)?,
            shared_size_bytes: size(1)?,
            const_size_bytes: size(2)?,
            local_size_bytes: size(3)?,
            num_regs: get(4)?,
            ptx_version: get(5)?,
            binary_version: get(6)?,
            cache_mode_ca: get(7)?,
            max_dynamic_shared_size_bytes: get(8)?,
            preferred_shmem_carveout: get(9)?,
            cluster_dim_must_be_set: get(10).unwrap_or(0),
            required_cluster_width: get(11).unwrap_or(0),
            required_cluster_height: get(12).unwrap_or(0),
            required_cluster_depth: get(13).unwrap_or(0),
            non_portable_cluster_size_allowed: get(14).unwrap_or(0),
            cluster_scheduling_policy_preference: get(15).unwrap_or(0),
        })
    }

    fn func_set_attribute(&self, function: Self::Function, attribute: u32, value: i32) -> CudaResult<()> {
        let attribute = c_int::try_from(attribute).map_err(|_| CudaError::INVALID_VALUE)?;
        // SAFETY: `function` belongs to a loaded module; the runtime's cudaFuncAttribute numbers
        // are the driver's CUfunction_attribute numbers, and unknown ones are an error code.
        raw_check(unsafe { driver_call!(self.driver, cuFuncSetAttribute(function.0.cast(), attribute as c_uint, value)) })
    }

    fn occupancy(&self, function: Self::Function, block_size: i32, dynamic_shared_mem: u64, flags: u32) -> CudaResult<i32> {
        let dynamic_shared_mem = usize::try_from(dynamic_shared_mem).map_err(|_| CudaError::INVALID_VALUE)?;
        let mut blocks = 0;
        // SAFETY: valid out-pointer; `function` belongs to a loaded module.
        check(unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&mut blocks, function.0, block_size, dynamic_shared_mem, flags)
                .result()
        })?;
        Ok(blocks)
    }

    fn stream_create(&self, flags: u32, priority: i32) -> CudaResult<Self::Stream> {
        let mut stream = std::ptr::null_mut();
        // SAFETY: valid out-pointer; cudaStreamNonBlocking equals CU_STREAM_NON_BLOCKING.
        check(unsafe { sys::cuStreamCreateWithPriority(&mut stream, flags, priority).result() })?;
        Ok(Handle(stream))
    }

    fn stream_priority_range(&self) -> CudaResult<(i32, i32)> {
        result::stream::get_priority_range().map_err(driver_error)
    }

    fn stream_destroy(&self, stream: Self::Stream) -> CudaResult<()> {
        // SAFETY: the session removed the stream from its map before destroying it.
        check(unsafe { result::stream::destroy(stream.0) })
    }

    fn stream_query(&self, stream: Self::Stream) -> CudaResult<()> {
        // SAFETY: the stream is the null stream or one of the session's streams.
        check(unsafe { sys::cuStreamQuery(stream.0).result() })
    }

    fn stream_wait_event(&self, stream: Self::Stream, event: Self::Event, flags: u32) -> CudaResult<()> {
        // SAFETY: both handles belong to the session.
        check(unsafe { sys::cuStreamWaitEvent(stream.0, event.0, flags).result() })
    }

    fn event_create(&self, flags: u32) -> CudaResult<Self::Event> {
        let mut event = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the runtime's event flags equal the driver's.
        check(unsafe { sys::cuEventCreate(&mut event, flags).result() })?;
        Ok(Handle(event))
    }

    fn event_record(&self, event: Self::Event, stream: Self::Stream, flags: u32) -> CudaResult<()> {
        // SAFETY: both handles belong to the session.
        check(unsafe { sys::cuEventRecordWithFlags(event.0, stream.0, flags).result() })
    }

    fn event_query(&self, event: Self::Event) -> CudaResult<()> {
        // SAFETY: the event belongs to the session.
        check(unsafe { sys::cuEventQuery(event.0).result() })
    }

    fn event_synchronize(&self, event: Self::Event) -> CudaResult<()> {
        // SAFETY: the event belongs to the session.
        check(unsafe { result::event::synchronize(event.0) })
    }

    fn event_elapsed(&self, start: Self::Event, end: Self::Event) -> CudaResult<f32> {
        let mut milliseconds = 0.0;
        // SAFETY: valid out-pointer; both events belong to the session.
        check(unsafe { sys::cuEventElapsedTime_v2(&mut milliseconds, start.0, end.0).result() })?;
        Ok(milliseconds)
    }

    fn event_destroy(&self, event: Self::Event) -> CudaResult<()> {
        // SAFETY: the session removed the event from its map before destroying it.
        check(unsafe { result::event::destroy(event.0) })
    }

    fn synchronize(&self) -> CudaResult<()> {
        check(result::ctx::synchronize())
    }

    fn reset(&self) -> CudaResult<()> {
        // SAFETY: the session waited for its work and drops every handle it held on this
        // context; the staging slots are all free (checked again by `remake`).
        check(unsafe { sys::cuDevicePrimaryCtxReset_v2(self.gpu().device).result() })?;
        // A reset leaves the context inactive until it is retained again; the count it had is
        // kept, so this one more is never released (the process holds it until it exits).
        // SAFETY: `self.gpu().device` came from cuDeviceGet.
        let context = unsafe { result::primary_ctx::retain(self.gpu().device) }.map_err(driver_error)?;
        self.gpu().context.store(context, Ordering::Release);
        self.bind_thread()?;
        let contexts: Vec<sys::CUcontext> = self.gpus.iter().map(|gpu| gpu.context.load(Ordering::Acquire)).collect();
        self.staging.remake(&contexts, self.current_device())
    }

    fn func_set_cache_config(&self, function: Self::Function, config: u32) -> CudaResult<()> {
        // SAFETY: `function` belongs to a loaded module; the value is a checked CUfunc_cache.
        check(unsafe { sys::cuFuncSetCacheConfig(function.0, func_cache(config)?).result() })
    }

    fn set_cache_config(&self, config: u32) -> CudaResult<()> {
        // SAFETY: the worker's context is current on this thread; the value is checked.
        check(unsafe { sys::cuCtxSetCacheConfig(func_cache(config)?).result() })
    }

    fn cache_config(&self) -> CudaResult<u32> {
        let mut config = sys::CUfunc_cache::CU_FUNC_CACHE_PREFER_NONE;
        // SAFETY: a valid out-pointer; the worker's context is current.
        check(unsafe { sys::cuCtxGetCacheConfig(&mut config).result() })?;
        Ok(config as u32)
    }

    fn profiler(&self, start: bool) -> CudaResult<()> {
        // SAFETY: no arguments; a profiler attached to this process (nsys, ncu) sees the range.
        check(unsafe { if start { sys::cuProfilerStart() } else { sys::cuProfilerStop() }.result() })
    }

    fn reset_persisting_l2_cache(&self) -> CudaResult<()> {
        // SAFETY: no arguments; the worker's context is current.
        check(unsafe { sys::cuCtxResetPersistingL2Cache().result() })
    }

    fn set_limit(&self, limit: u32, value: u64) -> CudaResult<()> {
        let limit = c_int::try_from(limit).map_err(|_| CudaError::INVALID_VALUE)?;
        let value = usize::try_from(value).map_err(|_| CudaError::INVALID_VALUE)?;
        // SAFETY: cudaLimit numbers equal CUlimit numbers; unknown ones are an error code.
        raw_check(unsafe { driver_call!(self.driver, cuCtxSetLimit(limit as c_uint, value)) })
    }

    fn get_limit(&self, limit: u32) -> CudaResult<u64> {
        let limit = c_int::try_from(limit).map_err(|_| CudaError::INVALID_VALUE)?;
        let mut value = 0usize;
        // SAFETY: valid out-pointer; unknown limits are an error code.
        raw_check(unsafe { driver_call!(self.driver, cuCtxGetLimit(&mut value, limit as c_uint)) })?;
        Ok(value as u64)
    }

    fn capture_begin(&self, stream: Self::Stream, mode: u32, into: Option<CaptureInto<'_, Self>>) -> CudaResult<()> {
        let mode = capture_mode(mode)?;
        let Some(into) = into else {
            // SAFETY: the stream is the null stream or one of the session's.
            return check(unsafe { sys::cuStreamBeginCapture_v2(stream.0, mode).result() });
        };
        if into.data.is_some_and(|data| data.len() != into.dependencies.len()) {
            return Err(CudaError::INVALID_VALUE);
        }
        let nodes: Vec<sys::CUgraphNode> = into.dependencies.iter().map(|node| node.0).collect();
        let data = into.data.map(driver_edge_data);
        let data_ptr = data.as_ref().map_or(std::ptr::null(), |data| data.as_ptr());
        // SAFETY: the session's stream, graph and nodes of that graph; NULL (plain full
        // dependencies) or as many edge data entries as nodes (checked above).
        check(unsafe { sys::cuStreamBeginCaptureToGraph(stream.0, into.graph.0, nodes.as_ptr(), data_ptr, nodes.len(), mode).result() })
    }

    fn capture_dependencies(
        &self,
        stream: Self::Stream,
        nodes: &[Self::GraphNode],
        data: Option<&[EdgeData]>,
        set: bool,
    ) -> CudaResult<()> {
        if data.is_some_and(|data| data.len() != nodes.len()) {
            return Err(CudaError::INVALID_VALUE);
        }
        let mut nodes: Vec<sys::CUgraphNode> = nodes.iter().map(|node| node.0).collect();
        let data = data.map(driver_edge_data);
        let data_ptr = data.as_ref().map_or(std::ptr::null(), |data| data.as_ptr());
        // CU_STREAM_SET_CAPTURE_DEPENDENCIES (1) or CU_STREAM_ADD_CAPTURE_DEPENDENCIES (0).
        // SAFETY: the session's capturing stream and nodes of its graph; NULL (plain full
        // dependencies) or as many edge data entries as nodes (checked above).
        check(unsafe {
            sys::cuStreamUpdateCaptureDependencies_v2(stream.0, nodes.as_mut_ptr(), data_ptr, nodes.len(), u32::from(set)).result()
        })
    }

    fn capture_end(&self, stream: Self::Stream) -> CudaResult<Self::Graph> {
        let mut graph = std::ptr::null_mut();
        // SAFETY: as above; valid out-pointer.
        check(unsafe { sys::cuStreamEndCapture(stream.0, &mut graph).result() })?;
        Ok(Handle(graph))
    }

    fn capture_info(&self, stream: Self::Stream) -> CudaResult<Capture<Self>> {
        let mut status = 0u32;
        let mut id = 0u64;
        let mut graph = std::ptr::null_mut();
        let mut dependencies: *const sys::CUgraphNode = std::ptr::null();
        let mut edges: *const sys::CUgraphEdgeData = std::ptr::null();
        let mut count = 0usize;
        // SAFETY: valid out-pointers; the status is written as the C enum's 32-bit value and read
        // as a number, so a status this build does not know is no invalid Rust enum. The edge
        // data is asked for too: without it the driver refuses (LOSSY_QUERY) a capture whose
        // dependencies carry some.
        check(unsafe {
            sys::cuStreamGetCaptureInfo_v3(
                stream.0,
                (&raw mut status).cast(),
                &mut id,
                &mut graph,
                &mut dependencies,
                &mut edges,
                &mut count,
            )
            .result()
        })?;
        let dependencies = if dependencies.is_null() || count == 0 {
            Vec::new()
        } else {
            // SAFETY: the driver's array of `count` nodes, valid until the next call on the stream.
            unsafe { std::slice::from_raw_parts(dependencies, count) }.iter().map(|node| Handle(*node)).collect()
        };
        let data = if edges.is_null() || count == 0 {
            Vec::new()
        } else {
            // SAFETY: the driver's array of `count` edge data entries, parallel to the nodes and
            // valid as long.
            unsafe { std::slice::from_raw_parts(edges, count) }.iter().map(|edge| [edge.from_port, edge.to_port, edge.type_]).collect()
        };
        Ok(Capture { status, id, graph: (!graph.is_null()).then_some(Handle(graph)), dependencies, data })
    }

    fn capturing(&self, stream: Self::Stream) -> bool {
        let mut status = 0u32;
        // SAFETY: valid out-pointer, written as the enum's 32-bit value (see `capture_info`).
        let code = unsafe { sys::cuStreamIsCapturing(stream.0, (&raw mut status).cast()) };
        code != sys::CUresult::CUDA_SUCCESS || status != 0
    }

    fn exchange_capture_mode(&self, mode: u32) -> CudaResult<u32> {
        capture_mode(mode)?;
        let mut value = mode;
        // SAFETY: an in/out mode of the enum's 32-bit size, checked to be a valid mode on the
        // way in and read back as a number.
        check(unsafe { sys::cuThreadExchangeStreamCaptureMode((&raw mut value).cast()).result() })?;
        Ok(value)
    }

    fn graph_create(&self) -> CudaResult<Self::Graph> {
        let mut graph = std::ptr::null_mut();
        // SAFETY: valid out-pointer; flags must be 0.
        check(unsafe { sys::cuGraphCreate(&mut graph, 0).result() })?;
        Ok(Handle(graph))
    }

    fn graph_destroy(&self, graph: Self::Graph) -> CudaResult<()> {
        // SAFETY: a graph of the session's, forgotten by it now.
        check(unsafe { sys::cuGraphDestroy(graph.0).result() })
    }

    fn graph_add_node(
        &self,
        graph: Self::Graph,
        dependencies: &[Self::GraphNode],
        work: NodeWork<'_, Self>,
    ) -> CudaResult<AddedNode<Self>> {
        let mut node = std::ptr::null_mut();
        let (mut ptr, mut bodies) = (0, Vec::new());
        // No dependencies is a NULL array, as the driver documents it (not an empty slice's
        // dangling pointer).
        let deps = if dependencies.is_empty() { std::ptr::null() } else { dependencies.as_ptr().cast::<sys::CUgraphNode>() };
        let count = dependencies.len();
        let context = self.gpu().context.load(Ordering::Acquire);
        // SAFETY: (every arm) `graph` and the dependencies are the session's, of that graph
        // (`Handle` is a transparent newtype, so the slice is an array of `CUgraphNode`); the
        // parameter structs live across the call, which copies them; device ranges were
        // checked by the session.
        let code = unsafe {
            match work {
                NodeWork::Empty => sys::cuGraphAddEmptyNode(&mut node, graph.0, deps, count),
                NodeWork::Kernel { function, grid, block, shared_mem, args } => {
                    let mut packed = PackedArgs::new(args);
                    let params = kernel_params(function, grid, block, shared_mem, &mut packed);
                    sys::cuGraphAddKernelNode_v2(&mut node, graph.0, deps, count, &params)
                }
                NodeWork::Memcpy(copy) => sys::cuGraphAddMemcpyNode(&mut node, graph.0, deps, count, &memcpy_params(&copy), context),
                NodeWork::Memset(set) => sys::cuGraphAddMemsetNode(&mut node, graph.0, deps, count, &memset_params(&set), context),
                NodeWork::Child(child) => sys::cuGraphAddChildGraphNode(&mut node, graph.0, deps, count, child.0),
                NodeWork::EventRecord(event) => sys::cuGraphAddEventRecordNode(&mut node, graph.0, deps, count, event.0),
                NodeWork::EventWait(event) => sys::cuGraphAddEventWaitNode(&mut node, graph.0, deps, count, event.0),
                NodeWork::Host(site) => sys::cuGraphAddHostNode(&mut node, graph.0, deps, count, &host_params(site)),
                NodeWork::MemAlloc { size, access } => {
                    let access = match access {
                        Some(flags) => Some(sys::CUmemAccessDesc { location: self.location(), flags: access_flags(flags)? }),
                        None => None,
                    };
                    let mut params: sys::CUDA_MEM_ALLOC_NODE_PARAMS = std::mem::zeroed();
                    params.poolProps.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
                    params.poolProps.location = self.location();
                    params.bytesize = usize::try_from(size).map_err(|_| CudaError::INVALID_VALUE)?;
                    if let Some(desc) = access.as_ref() {
                        params.accessDescs = desc;
                        params.accessDescCount = 1;
                    }
                    let code = sys::cuGraphAddMemAllocNode(&mut node, graph.0, deps, count, &mut params);
                    ptr = params.dptr;
                    code
                }
                NodeWork::MemFree(dptr) => sys::cuGraphAddMemFreeNode(&mut node, graph.0, deps, count, dptr),
                NodeWork::Conditional { handle, kind, size } => {
                    let mut params: sys::CUgraphNodeParams = std::mem::zeroed();
                    params.type_ = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL;
                    let conditional = &mut params.__bindgen_anon_1.conditional;
                    conditional.handle = handle;
                    conditional.type_ = match kind {
                        0 => sys::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_IF,
                        1 => sys::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_WHILE,
                        2 => sys::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_SWITCH,
                        _ => return Err(CudaError::INVALID_VALUE),
                    };
                    conditional.size = size;
                    conditional.ctx = context;
                    let code = sys::cuGraphAddNode_v2(&mut node, graph.0, deps, std::ptr::null(), count, &mut params);
                    let made = params.__bindgen_anon_1.conditional.phGraph_out;
                    if code == sys::CUresult::CUDA_SUCCESS && !made.is_null() {
                        // The driver's array of `size` body graphs, valid as long as the node.
                        bodies = std::slice::from_raw_parts(made, size as usize).iter().map(|graph| Handle(*graph)).collect();
                    }
                    code
                }
                NodeWork::BatchMemOp(ops) => {
                    let add = self.driver.cuGraphAddBatchMemOpNode.ok_or(CudaError::NOT_SUPPORTED)?;
                    let mut array: Vec<MemOpParams> = ops.iter().map(StreamMemOp::driver_words).collect();
                    let params = batch_node_params(context, &mut array)?;
                    raw_check(add((&raw mut node).cast(), graph.0.cast(), deps.cast(), count, &params).0)?;
                    sys::CUresult::CUDA_SUCCESS
                }
            }
        };
        check(code.result())?;
        Ok(AddedNode { node: Handle(node), ptr, bodies })
    }

    fn graph_conditional_handle(&self, graph: Self::Graph, default_value: u32, flags: u32) -> CudaResult<u64> {
        let mut handle = 0;
        let context = self.gpu().context.load(Ordering::Acquire);
        // SAFETY: the session's graph in the device's context; valid out-pointer.
        check(unsafe { sys::cuGraphConditionalHandleCreate(&mut handle, graph.0, context, default_value, flags).result() })?;
        Ok(handle)
    }

    fn graph_node_links(&self, node: Self::GraphNode, dependents: bool) -> CudaResult<Vec<(Self::GraphNode, EdgeData)>> {
        let list = |nodes: *mut sys::CUgraphNode, data: *mut sys::CUgraphEdgeData, count: &mut usize| {
            // SAFETY: the session's node; the arrays are NULL (count only) or have room for `count`.
            unsafe {
                if dependents {
                    sys::cuGraphNodeGetDependentNodes_v2(node.0, nodes, data, count)
                } else {
                    sys::cuGraphNodeGetDependencies_v2(node.0, nodes, data, count)
                }
            }
        };
        let mut count = 0usize;
        check(list(std::ptr::null_mut(), std::ptr::null_mut(), &mut count).result())?;
        let mut nodes = vec![std::ptr::null_mut(); count];
        let mut data = vec![edge_data_zero(); count];
        if count > 0 {
            check(list(nodes.as_mut_ptr(), data.as_mut_ptr(), &mut count).result())?;
        }
        Ok(nodes.into_iter().zip(data).take(count).map(|(node, data)| (Handle(node), [data.from_port, data.to_port, data.type_])).collect())
    }

    fn graph_all_edges(&self, graph: Self::Graph) -> CudaResult<Vec<(Self::GraphNode, Self::GraphNode, EdgeData)>> {
        let mut count = 0usize;
        let (none, null): (*mut sys::CUgraphNode, sys::CUgraphNode) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: the session's graph; NULL arrays ask for the count.
        check(unsafe { sys::cuGraphGetEdges_v2(graph.0, none, none, std::ptr::null_mut(), &mut count).result() })?;
        let (mut from, mut to, mut data) = (vec![null; count], vec![null; count], vec![edge_data_zero(); count]);
        if count > 0 {
            // SAFETY: three arrays with room for `count` entries.
            check(unsafe { sys::cuGraphGetEdges_v2(graph.0, from.as_mut_ptr(), to.as_mut_ptr(), data.as_mut_ptr(), &mut count).result() })?;
        }
        Ok((0..count.min(from.len()))
            .map(|i| (Handle(from[i]), Handle(to[i]), [data[i].from_port, data[i].to_port, data[i].type_]))
            .collect())
    }

    fn graph_node_enabled(&self, exec: Self::GraphExec, node: Self::GraphNode, set: Option<bool>) -> CudaResult<bool> {
        if let Some(enable) = set {
            // SAFETY: the session's executable graph and node.
            check(unsafe { sys::cuGraphNodeSetEnabled(exec.0, node.0, u32::from(enable)).result() })?;
        }
        let mut enabled = 0;
        // SAFETY: as above; valid out-pointer.
        check(unsafe { sys::cuGraphNodeGetEnabled(exec.0, node.0, &mut enabled).result() })?;
        Ok(enabled != 0)
    }

    fn graph_node_kind(&self, node: Self::GraphNode) -> CudaResult<u32> {
        let mut kind = 0u32;
        // SAFETY: the session's node; the type is read as the enum's number.
        check(unsafe { sys::cuGraphNodeGetType(node.0, (&raw mut kind).cast()).result() })?;
        Ok(kind)
    }

    fn graph_node_event(&self, node: Self::GraphNode) -> CudaResult<Self::Event> {
        let kind = self.graph_node_kind(node)?;
        let mut event = std::ptr::null_mut();
        // SAFETY: the session's node of the type asked; valid out-pointer.
        let code = unsafe {
            match kind {
                7 => sys::cuGraphEventRecordNodeGetEvent(node.0, &mut event),
                6 => sys::cuGraphEventWaitNodeGetEvent(node.0, &mut event),
                _ => return Err(CudaError::INVALID_VALUE),
            }
        };
        check(code.result())?;
        Ok(Handle(event))
    }

    fn graph_mem_attribute(&self, attribute: u32, set: Option<u64>) -> CudaResult<u64> {
        use sys::CUgraphMem_attribute as Attr;
        let attr = match attribute {
            0 => Attr::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT,
            1 => Attr::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH,
            2 => Attr::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT,
            3 => Attr::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH,
            _ => return Err(CudaError::INVALID_VALUE),
        };
        if let Some(mut value) = set {
            // SAFETY: a 64-bit value, as every graph memory attribute is; the driver checks
            // which ones may be set (only the high watermarks, reset with 0).
            check(unsafe { sys::cuDeviceSetGraphMemAttribute(self.gpu().device, attr, (&raw mut value).cast()).result() })?;
        }
        let mut value = 0u64;
        // SAFETY: a 64-bit out-value.
        check(unsafe { sys::cuDeviceGetGraphMemAttribute(self.gpu().device, attr, (&raw mut value).cast()).result() })?;
        Ok(value)
    }

    fn graph_mem_trim(&self) -> CudaResult<()> {
        // SAFETY: the session's device.
        check(unsafe { sys::cuDeviceGraphMemTrim(self.gpu().device).result() })
    }

    fn graph_node_read(&self, node: Self::GraphNode) -> CudaResult<NodeRead> {
        match self.graph_node_kind(node)? {
            node_type::MEMCPY => {
                let read = self.driver.cuGraphMemcpyNodeGetParams.ok_or(CudaError::NOT_SUPPORTED)?;
                // SAFETY: all-zero is a valid `CUDA_MEMCPY3D` (integers and null pointers).
                let mut raw: CUDA_MEMCPY3D = unsafe { std::mem::zeroed() };
                // SAFETY: a copy node of the session's; valid out-pointer of the C struct's layout,
                // whose memory types are plain numbers (not trusted as an enum).
                raw_check(unsafe { read(node.0.cast(), &mut raw) }.0)?;
                let src = node_copy_side(
                    raw.srcMemoryType,
                    raw.srcHost,
                    raw.srcDevice,
                    (raw.srcXInBytes, raw.srcY, raw.srcZ),
                    (raw.srcPitch, raw.srcHeight),
                )?;
                let dst = node_copy_side(
                    raw.dstMemoryType,
                    raw.dstHost,
                    raw.dstDevice,
                    (raw.dstXInBytes, raw.dstY, raw.dstZ),
                    (raw.dstPitch, raw.dstHeight),
                )?;
                Ok(NodeRead::Memcpy(NodeCopy {
                    src,
                    dst,
                    width: raw.WidthInBytes as u64,
                    height: raw.Height as u64,
                    depth: raw.Depth as u64,
                }))
            }
            node_type::MEMSET => {
                // SAFETY: an all-zero struct of integers is valid.
                let mut params: sys::CUDA_MEMSET_NODE_PARAMS = unsafe { std::mem::zeroed() };
                // SAFETY: a memset node of the session's; valid out-pointer.
                check(unsafe { sys::cuGraphMemsetNodeGetParams(node.0, &mut params).result() })?;
                Ok(NodeRead::Memset(Memset2d {
                    dst: params.dst,
                    pitch: params.pitch as u64,
                    value: params.value,
                    element_size: u8::try_from(params.elementSize).map_err(|_| CudaError::UNKNOWN)?,
                    width: params.width as u64,
                    height: params.height as u64,
                }))
            }
            node_type::HOST => {
                let mut params = sys::CUDA_HOST_NODE_PARAMS { fn_: None, userData: std::ptr::null_mut() };
                // SAFETY: a host node of the session's; valid out-pointer.
                check(unsafe { sys::cuGraphHostNodeGetParams(node.0, &mut params).result() })?;
                // Every host node the session made runs a site through `run_host_call`.
                let ours =
                    params.fn_.is_some_and(|function| std::ptr::fn_addr_eq(function, run_host_call as unsafe extern "C" fn(*mut c_void)));
                Ok(NodeRead::Host(if ours { params.userData as usize } else { 0 }))
            }
            node_type::BATCH_MEM_OP => {
                let read = self.driver.cuGraphBatchMemOpNodeGetParams.ok_or(CudaError::NOT_SUPPORTED)?;
                let mut params =
                    CUDA_BATCH_MEM_OP_NODE_PARAMS { ctx: std::ptr::null_mut(), count: 0, paramArray: std::ptr::null_mut(), flags: 0 };
                // SAFETY: a batch memory operation node of the session's; valid out-pointer.
                raw_check(unsafe { read(node.0.cast(), &mut params) }.0)?;
                if params.paramArray.is_null() || params.count as usize > mem_op::MAX_BATCH {
                    return Err(CudaError::UNKNOWN);
                }
                // SAFETY: the driver's array of `count` operations, owned by the node and valid
                // until its parameters change (the session's thread does that, not meanwhile).
                let array = unsafe { std::slice::from_raw_parts(params.paramArray.cast::<MemOpParams>(), params.count as usize) };
                Ok(NodeRead::BatchMemOp(array.iter().map(StreamMemOp::from_driver_words).collect()))
            }
            _ => Err(CudaError::INVALID_VALUE),
        }
    }

    fn graph_kernel_node_read(
        &self,
        node: Self::GraphNode,
        layout: &dyn Fn(Self::Function) -> Option<Vec<ParamInfo>>,
    ) -> CudaResult<KernelRead<Self>> {
        // SAFETY: an all-zero struct of integers and pointers is valid.
        let mut params: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
        // SAFETY: a node of the session's; valid out-pointer. The arrays it points to belong to
        // the node, which outlives this call.
        check(unsafe { sys::cuGraphKernelNodeGetParams_v2(node.0, &mut params).result() })?;
        let function = Handle(params.func);
        let layout = if params.func.is_null() { None } else { layout(function) };
        let layout = layout.ok_or(CudaError::INVALID_DEVICE_FUNCTION)?;
        let len = layout.iter().map(|param| param.offset as usize + param.size as usize).max().unwrap_or(0);
        let mut args = vec![0u8; len];
        if !params.extra.is_null() {
            let (mut buffer, mut size): (*const u8, usize) = (std::ptr::null(), 0);
            // SAFETY: the node's `extra` array: key/value pairs up to CU_LAUNCH_PARAM_END, the
            // buffer pointer's value `size` readable bytes (the node's copy of the arguments).
            unsafe {
                for pair in 0..4 {
                    let key = *params.extra.add(2 * pair) as usize;
                    match key {
                        0 => break,
                        1 => buffer = (*params.extra.add(2 * pair + 1)).cast(),
                        2 => size = *(*params.extra.add(2 * pair + 1)).cast::<usize>(),
                        _ => return Err(CudaError::NOT_SUPPORTED),
                    }
                }
                if buffer.is_null() || size < len {
                    return Err(CudaError::NOT_SUPPORTED);
                }
                std::ptr::copy_nonoverlapping(buffer, args.as_mut_ptr(), len);
            }
        } else if !layout.is_empty() {
            if params.kernelParams.is_null() {
                return Err(CudaError::NOT_SUPPORTED);
            }
            for (index, param) in layout.iter().enumerate() {
                let at = param.offset as usize;
                // SAFETY: the node's `kernelParams` has one pointer per parameter of its kernel,
                // each to `param.size` bytes of the node's copy of that argument.
                unsafe {
                    let value = (*params.kernelParams.add(index)).cast::<u8>();
                    std::ptr::copy_nonoverlapping(value, args[at..at + param.size as usize].as_mut_ptr(), param.size as usize);
                }
            }
        }
        Ok(KernelRead {
            function,
            grid: Dim3 { x: params.gridDimX, y: params.gridDimY, z: params.gridDimZ },
            block: Dim3 { x: params.blockDimX, y: params.blockDimY, z: params.blockDimZ },
            shared_mem: params.sharedMemBytes,
            args,
        })
    }

    fn graph_kernel_node_attribute(&self, node: Self::GraphNode, attribute: u32, set: Option<&[u8; 64]>) -> CudaResult<[u8; 64]> {
        let (set_attribute, get_attribute) = match (self.driver.cuGraphKernelNodeSetAttribute, self.driver.cuGraphKernelNodeGetAttribute) {
            (Some(set), Some(get)) => (set, get),
            _ => return Err(CudaError::NOT_SUPPORTED),
        };
        if let Some(value) = set {
            // SAFETY: a node of the session's; a 64-byte value the session checked.
            raw_check(unsafe { set_attribute(node.0.cast(), attribute, value.as_ptr().cast()) }.0)?;
        }
        let mut value = [0u8; 64];
        // SAFETY: as above; the driver writes at most a `CUkernelNodeAttrValue` (64 bytes).
        raw_check(unsafe { get_attribute(node.0.cast(), attribute, value.as_mut_ptr().cast()) }.0)?;
        Ok(value)
    }

    fn graph_kernel_node_copy_attributes(&self, dst: Self::GraphNode, src: Self::GraphNode) -> CudaResult<()> {
        // SAFETY: two nodes of the session's.
        check(unsafe { sys::cuGraphKernelNodeCopyAttributes(dst.0, src.0).result() })
    }

    fn graph_node_set(&self, exec: Option<Self::GraphExec>, node: Self::GraphNode, work: NodeWork<'_, Self>) -> CudaResult<()> {
        let context = self.gpu().context.load(Ordering::Acquire);
        // SAFETY: (every arm) the node and executable graph are the session's; parameter
        // structs outlive the call, which copies them; device ranges were checked.
        let code = unsafe {
            match (exec, work) {
                (_, NodeWork::Empty) => return Err(CudaError::INVALID_VALUE),
                (exec, NodeWork::Kernel { function, grid, block, shared_mem, args }) => {
                    let mut packed = PackedArgs::new(args);
                    let params = kernel_params(function, grid, block, shared_mem, &mut packed);
                    match exec {
                        Some(exec) => sys::cuGraphExecKernelNodeSetParams_v2(exec.0, node.0, &params),
                        None => sys::cuGraphKernelNodeSetParams_v2(node.0, &params),
                    }
                }
                (Some(exec), NodeWork::Memcpy(copy)) => sys::cuGraphExecMemcpyNodeSetParams(exec.0, node.0, &memcpy_params(&copy), context),
                (None, NodeWork::Memcpy(copy)) => sys::cuGraphMemcpyNodeSetParams(node.0, &memcpy_params(&copy)),
                (Some(exec), NodeWork::Memset(set)) => sys::cuGraphExecMemsetNodeSetParams(exec.0, node.0, &memset_params(&set), context),
                (None, NodeWork::Memset(set)) => sys::cuGraphMemsetNodeSetParams(node.0, &memset_params(&set)),
                (Some(exec), NodeWork::Child(child)) => sys::cuGraphExecChildGraphNodeSetParams(exec.0, node.0, child.0),
                // A child graph node's graph is changed through the graph it returns, not set.
                (None, NodeWork::Child(_)) => return Err(CudaError::INVALID_VALUE),
                (Some(exec), NodeWork::EventRecord(event)) => sys::cuGraphExecEventRecordNodeSetEvent(exec.0, node.0, event.0),
                (None, NodeWork::EventRecord(event)) => sys::cuGraphEventRecordNodeSetEvent(node.0, event.0),
                (Some(exec), NodeWork::EventWait(event)) => sys::cuGraphExecEventWaitNodeSetEvent(exec.0, node.0, event.0),
                (None, NodeWork::EventWait(event)) => sys::cuGraphEventWaitNodeSetEvent(node.0, event.0),
                (Some(exec), NodeWork::Host(site)) => sys::cuGraphExecHostNodeSetParams(exec.0, node.0, &host_params(site)),
                (None, NodeWork::Host(site)) => sys::cuGraphHostNodeSetParams(node.0, &host_params(site)),
                // Memory and conditional nodes take no new parameters, as natively.
                (_, NodeWork::MemAlloc { .. } | NodeWork::MemFree(_) | NodeWork::Conditional { .. }) => {
                    return Err(CudaError::INVALID_VALUE);
                }
                (exec, NodeWork::BatchMemOp(ops)) => {
                    let mut array: Vec<MemOpParams> = ops.iter().map(StreamMemOp::driver_words).collect();
                    let params = batch_node_params(context, &mut array)?;
                    raw_check(match exec {
                        Some(exec) => {
                            self.driver.cuGraphExecBatchMemOpNodeSetParams.ok_or(CudaError::NOT_SUPPORTED)?(
                                exec.0.cast(),
                                node.0.cast(),
                                &params,
                            )
                            .0
                        }
                        None => self.driver.cuGraphBatchMemOpNodeSetParams.ok_or(CudaError::NOT_SUPPORTED)?(node.0.cast(), &params).0,
                    })?;
                    sys::CUresult::CUDA_SUCCESS
                }
            }
        };
        check(code.result())
    }

    fn graph_destroy_node(&self, node: Self::GraphNode) -> CudaResult<()> {
        // SAFETY: a node of the session's, forgotten by it now.
        check(unsafe { sys::cuGraphDestroyNode(node.0).result() })
    }

    fn graph_edges(
        &self,
        graph: Self::Graph,
        from: &[Self::GraphNode],
        to: &[Self::GraphNode],
        data: Option<&[EdgeData]>,
        remove: bool,
    ) -> CudaResult<()> {
        if from.len() != to.len() || data.is_some_and(|data| data.len() != from.len()) {
            return Err(CudaError::INVALID_VALUE);
        }
        if from.is_empty() {
            return Ok(());
        }
        let (from_ptr, to_ptr) = (from.as_ptr().cast::<sys::CUgraphNode>(), to.as_ptr().cast::<sys::CUgraphNode>());
        let data = data.map(driver_edge_data);
        let data_ptr = data.as_ref().map_or(std::ptr::null(), |data| data.as_ptr());
        // SAFETY: two arrays of `from.len()` nodes of the session's graph, and NULL (plain full
        // dependencies) or as many edge data entries.
        let code = unsafe {
            if remove {
                sys::cuGraphRemoveDependencies_v2(graph.0, from_ptr, to_ptr, data_ptr, from.len())
            } else {
                sys::cuGraphAddDependencies_v2(graph.0, from_ptr, to_ptr, data_ptr, from.len())
            }
        };
        check(code.result())
    }

    fn graph_nodes(&self, graph: Self::Graph, roots: bool) -> CudaResult<Vec<(Self::GraphNode, u32)>> {
        let list = |nodes: *mut sys::CUgraphNode, count: &mut usize| {
            // SAFETY: `nodes` is NULL (count only) or has room for `count` nodes.
            unsafe { if roots { sys::cuGraphGetRootNodes(graph.0, nodes, count) } else { sys::cuGraphGetNodes(graph.0, nodes, count) } }
        };
        let mut count = 0usize;
        check(list(std::ptr::null_mut(), &mut count).result())?;
        if count == 0 {
            return Ok(Vec::new());
        }
        let mut nodes = vec![std::ptr::null_mut(); count];
        check(list(nodes.as_mut_ptr(), &mut count).result())?;
        nodes.truncate(count);
        nodes
            .into_iter()
            .map(|node| {
                let mut kind = 0u32;
                // SAFETY: a node the driver just listed; the type is read as the enum's number.
                check(unsafe { sys::cuGraphNodeGetType(node, (&raw mut kind).cast()).result() })?;
                Ok((Handle(node), kind))
            })
            .collect()
    }

    fn graph_child(&self, node: Self::GraphNode) -> CudaResult<Self::Graph> {
        let mut graph = std::ptr::null_mut();
        // SAFETY: a child-graph node of the session's; valid out-pointer.
        check(unsafe { sys::cuGraphChildGraphNodeGetGraph(node.0, &mut graph).result() })?;
        Ok(Handle(graph))
    }

    fn graph_clone(&self, graph: Self::Graph) -> CudaResult<Self::Graph> {
        let mut clone = std::ptr::null_mut();
        // SAFETY: a graph of the session's; valid out-pointer.
        check(unsafe { sys::cuGraphClone(&mut clone, graph.0).result() })?;
        Ok(Handle(clone))
    }

    fn graph_node_in_clone(&self, node: Self::GraphNode, clone: Self::Graph) -> CudaResult<Self::GraphNode> {
        let mut found = std::ptr::null_mut();
        // SAFETY: a node of the graph `clone` was cloned from; valid out-pointer.
        check(unsafe { sys::cuGraphNodeFindInClone(&mut found, node.0, clone.0).result() })?;
        Ok(Handle(found))
    }

    fn graph_instantiate(&self, graph: Self::Graph, flags: u64) -> CudaResult<Self::GraphExec> {
        let mut exec = std::ptr::null_mut();
        // SAFETY: a graph of the session's; unknown flags are an error code.
        check(unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph.0, flags).result() })?;
        Ok(Handle(exec))
    }

    fn graph_launch(&self, exec: Self::GraphExec, stream: Self::Stream) -> CudaResult<()> {
        // SAFETY: the session's executable graph and stream.
        check(unsafe { sys::cuGraphLaunch(exec.0, stream.0).result() })
    }

    fn graph_upload(&self, exec: Self::GraphExec, stream: Self::Stream) -> CudaResult<()> {
        // SAFETY: as above.
        check(unsafe { sys::cuGraphUpload(exec.0, stream.0).result() })
    }

    fn graph_exec_destroy(&self, exec: Self::GraphExec) -> CudaResult<()> {
        // SAFETY: the session's executable graph, forgotten by it now.
        check(unsafe { sys::cuGraphExecDestroy(exec.0).result() })
    }

    fn graph_exec_update(&self, exec: Self::GraphExec, graph: Self::Graph) -> ExecUpdate<Self> {
        // The generated struct: its result is read as a number, not as a Rust enum.
        let mut info = CUgraphExecUpdateResultInfo { result: 0, errorNode: std::ptr::null_mut(), errorFromNode: std::ptr::null_mut() };
        // SAFETY: the session's executable graph and graph; a valid out-pointer of the C struct.
        let code = unsafe { sys::cuGraphExecUpdate_v2(exec.0, graph.0, (&raw mut info).cast()) };
        ExecUpdate {
            result: check(code.result()),
            status: info.result,
            error_node: (!info.errorNode.is_null()).then_some(Handle(info.errorNode.cast())),
        }
    }

    fn graph_dot(&self, graph: Self::Graph, flags: u32) -> CudaResult<String> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!("flyt-graph-{}-{}.dot", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
        let c_path = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| CudaError::INVALID_VALUE)?;
        // SAFETY: a graph of the session's; a NUL-terminated path this process owns.
        let written = check(unsafe { sys::cuGraphDebugDotPrint(graph.0, c_path.as_ptr(), flags).result() });
        let text = written.and_then(|()| std::fs::read_to_string(&path).map_err(|_| CudaError::OPERATING_SYSTEM));
        let _ = std::fs::remove_file(&path);
        text
    }

    fn mem_granularity(&self, recommended: bool, host: bool) -> CudaResult<u64> {
        let option = if recommended {
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
        } else {
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM
        };
        let mut prop = self.allocation_prop(0)?;
        if host {
            let node = self.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID as u32).unwrap_or(-1).max(0);
            prop.location = sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA, id: node };
        }
        let mut granularity = 0usize;
        // SAFETY: valid out-pointer and a complete properties struct.
        check(unsafe { sys::cuMemGetAllocationGranularity(&mut granularity, &prop, option).result() })?;
        Ok(granularity as u64)
    }

    fn mem_address_reserve(&self, size: u64, alignment: u64, addr: u64) -> CudaResult<u64> {
        let mut ptr = 0;
        // SAFETY: valid out-pointer; the driver checks size, alignment and the hint.
        check(unsafe { sys::cuMemAddressReserve(&mut ptr, size as usize, alignment as usize, addr, 0).result() })?;
        Ok(ptr)
    }

    fn mem_address_free(&self, ptr: u64, size: u64) -> CudaResult<()> {
        if self.restored.lock().unwrap_or_else(std::sync::PoisonError::into_inner).forget_reservation(ptr, size) {
            // Inside a larger reservation of the restore's, which holds the addresses on.
            return Ok(());
        }
        // SAFETY: a whole reservation of the session's with nothing mapped (checked by it).
        check(unsafe { sys::cuMemAddressFree(ptr, size as usize).result() })
    }

    fn mem_create(&self, size: u64, handle_types: u32, usage: u32) -> CudaResult<u64> {
        let mut prop = self.allocation_prop(handle_types)?;
        prop.allocFlags.usage = u16::try_from(usage).map_err(|_| CudaError::INVALID_VALUE)?;
        let mut handle = 0;
        // SAFETY: valid out-pointer and a complete properties struct.
        check(unsafe { sys::cuMemCreate(&mut handle, size as usize, &prop, 0).result() })?;
        Ok(handle)
    }

    fn mem_release(&self, handle: u64) -> CudaResult<()> {
        // SAFETY: a handle of the session's, released once (the session forgets it).
        check(unsafe { sys::cuMemRelease(handle).result() })
    }

    fn mem_map(&self, ptr: u64, size: u64, offset: u64, handle: u64) -> CudaResult<()> {
        // SAFETY: inside a reservation of the session's, over nothing mapped, within the
        // handle's size (all checked by the session).
        check(unsafe { sys::cuMemMap(ptr, size as usize, offset as usize, handle, 0).result() })
    }

    fn mem_unmap(&self, ptr: u64, size: u64) -> CudaResult<()> {
        // SAFETY: whole mappings of the session's.
        check(unsafe { sys::cuMemUnmap(ptr, size as usize).result() })
    }

    fn mem_set_access(&self, ptr: u64, size: u64, flags: u32) -> CudaResult<()> {
        let desc = sys::CUmemAccessDesc { location: self.location(), flags: access_flags(flags)? };
        // SAFETY: mapped ranges of the session's; one descriptor.
        check(unsafe { sys::cuMemSetAccess(ptr, size as usize, &desc, 1).result() })
    }

    fn mem_export(&self, handle: u64) -> CudaResult<std::os::fd::OwnedFd> {
        let mut fd: c_int = -1;
        // SAFETY: a handle of the session's; for a POSIX descriptor the driver writes an `int`
        // through the out-pointer.
        check(unsafe {
            sys::cuMemExportToShareableHandle(
                (&raw mut fd).cast(),
                handle,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
            .result()
        })?;
        if fd < 0 {
            return Err(CudaError::UNKNOWN);
        }
        // SAFETY: the driver just opened `fd` for this process; nothing else owns it.
        Ok(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
    }

    fn mem_import(&self, fd: std::os::fd::BorrowedFd<'_>, _size: u64) -> CudaResult<u64> {
        let mut handle = 0;
        let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
        // SAFETY: valid out-pointer; a POSIX descriptor travels as the pointer's value, and the
        // driver only reads it (the descriptor stays ours).
        check(unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut handle,
                raw as usize as *mut c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
            .result()
        })?;
        Ok(handle)
    }

    fn default_pool(&self) -> CudaResult<Self::MemPool> {
        self.default_pool_of(self.current.load(Ordering::Relaxed))
    }

    fn default_pool_of(&self, device: usize) -> CudaResult<Self::MemPool> {
        let gpu = self.gpus.get(device).ok_or(CudaError::INVALID_DEVICE)?;
        let mut pool = std::ptr::null_mut();
        // SAFETY: valid out-pointer; one of the session's devices.
        check(unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, gpu.device).result() })?;
        Ok(Handle(pool))
    }

    fn pool_create(&self, handle_types: u32) -> CudaResult<Self::MemPool> {
        use sys::CUmemAllocationHandleType as Types;
        // SAFETY: all-zero pool properties are valid (no handle types, no size limit); type,
        // location and handle types are set below.
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location = self.location();
        props.handleTypes = match handle_types {
            0 => Types::CU_MEM_HANDLE_TYPE_NONE,
            1 => Types::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            _ => return Err(CudaError::NOT_SUPPORTED),
        };
        let mut pool = std::ptr::null_mut();
        // SAFETY: valid out-pointer and properties.
        check(unsafe { sys::cuMemPoolCreate(&mut pool, &props).result() })?;
        Ok(Handle(pool))
    }

    fn pool_destroy(&self, pool: Self::MemPool) -> CudaResult<()> {
        // SAFETY: a pool the session created, forgotten by it now.
        check(unsafe { sys::cuMemPoolDestroy(pool.0).result() })
    }

    fn set_current_pool(&self, pool: Self::MemPool) -> CudaResult<()> {
        // SAFETY: the session's device and one of its pools.
        check(unsafe { sys::cuDeviceSetMemPool(self.gpu().device, pool.0).result() })
    }

    fn alloc_async(&self, size: u64, pool: Self::MemPool, stream: Self::Stream) -> CudaResult<u64> {
        let mut ptr = 0;
        // SAFETY: valid out-pointer; the session's pool and stream.
        check(unsafe { sys::cuMemAllocFromPoolAsync(&mut ptr, size as usize, pool.0, stream.0).result() })?;
        Ok(ptr)
    }

    fn free_async(&self, ptr: u64, stream: Self::Stream) -> CudaResult<()> {
        let own = self.own_memory().contains(ptr);
        let mut restored = self.restored.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if own || restored.span_of(ptr).is_some() {
            // A pool allocation that moved here is restored memory now, and while the server
            // pages a `cuMemAlloc` allocation is memory of its own. Freeing it now keeps stream
            // order: its span stays mapped until its last allocation goes, and that waits for
            // the device. A capture would need a free node for it, which the driver makes only
            // for its own pools' memory.
            let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
            // SAFETY: one of the session's streams; valid out-pointer.
            check(unsafe { sys::cuStreamIsCapturing(stream.0, &mut status).result() })?;
            if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
                tracing::warn!(ptr, "a stream-ordered free of memory the server maps itself cannot be captured");
                return Err(CudaError::STREAM_CAPTURE_UNSUPPORTED);
            }
            if own {
                drop(restored);
                return self.free(ptr);
            }
            return restored.free(ptr).map_or(Ok(()), |code| check(code.result()));
        }
        drop(restored);
        // SAFETY: an allocation of the session's (checked), freed once.
        check(unsafe { sys::cuMemFreeAsync(ptr, stream.0).result() })
    }

    fn pool_attribute(&self, pool: Self::MemPool, attribute: u32, set: Option<u64>) -> CudaResult<u64> {
        use sys::CUmemPool_attribute as Attribute;
        let (id, narrow) = match attribute {
            1 => (Attribute::CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, true),
            2 => (Attribute::CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, true),
            3 => (Attribute::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, true),
            4 => (Attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, false),
            5 => (Attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, false),
            6 => (Attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, false),
            7 => (Attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT, false),
            8 => (Attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH, false),
            _ => return Err(CudaError::INVALID_VALUE),
        };
        // Integer attributes are 32 bits wide, the sizes 64.
        let mut value = [0u8; 8];
        if let Some(set) = set {
            if narrow {
                value[..4].copy_from_slice(&u32::try_from(set).map_err(|_| CudaError::INVALID_VALUE)?.to_ne_bytes());
            } else {
                value = set.to_ne_bytes();
            }
            // SAFETY: the pool is the session's; `value` holds the attribute's width.
            check(unsafe { sys::cuMemPoolSetAttribute(pool.0, id, value.as_mut_ptr().cast()).result() })?;
        }
        let mut read = [0u8; 8];
        // SAFETY: as above, for reading.
        check(unsafe { sys::cuMemPoolGetAttribute(pool.0, id, read.as_mut_ptr().cast()).result() })?;
        Ok(if narrow { u64::from(u32::from_ne_bytes([read[0], read[1], read[2], read[3]])) } else { u64::from_ne_bytes(read) })
    }

    fn pool_trim(&self, pool: Self::MemPool, keep: u64) -> CudaResult<()> {
        // SAFETY: the session's pool.
        check(unsafe { sys::cuMemPoolTrimTo(pool.0, keep as usize).result() })
    }

    fn pool_export(&self, pool: Self::MemPool) -> CudaResult<std::os::fd::OwnedFd> {
        let mut fd: c_int = -1;
        // SAFETY: a pool of the session's made with the POSIX handle type (checked); for a POSIX
        // descriptor the driver writes an `int` through the out-pointer.
        check(unsafe {
            sys::cuMemPoolExportToShareableHandle(
                (&raw mut fd).cast(),
                pool.0,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
            .result()
        })?;
        if fd < 0 {
            return Err(CudaError::UNKNOWN);
        }
        // SAFETY: the driver just opened `fd` for this process; nothing else owns it.
        Ok(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
    }

    fn pool_import(&self, fd: std::os::fd::BorrowedFd<'_>) -> CudaResult<Self::MemPool> {
        let mut pool = std::ptr::null_mut();
        let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
        // SAFETY: valid out-pointer; a POSIX descriptor travels as the pointer's value, and the
        // driver only reads it (the descriptor stays ours).
        check(unsafe {
            sys::cuMemPoolImportFromShareableHandle(
                &mut pool,
                raw as usize as *mut c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
            .result()
        })?;
        Ok(Handle(pool))
    }

    fn pool_export_pointer(&self, ptr: u64) -> CudaResult<[u8; 64]> {
        let mut data = sys::CUmemPoolPtrExportData { reserved: [0; 64] };
        // SAFETY: the start of a live allocation of a shareable pool of the session's (checked);
        // valid out-pointer.
        check(unsafe { sys::cuMemPoolExportPointer(&mut data, ptr).result() })?;
        Ok(data.reserved)
    }

    fn pool_import_pointer(&self, pool: Self::MemPool, data: &[u8; 64], _size: u64) -> CudaResult<u64> {
        let mut share = sys::CUmemPoolPtrExportData { reserved: *data };
        let mut ptr = 0;
        // SAFETY: a pool the session imported; export data its exporter's driver made for an
        // allocation of that pool (served by the exporting worker, never the app's bytes);
        // valid out-pointers.
        check(unsafe { sys::cuMemPoolImportPointer(&mut ptr, pool.0, &mut share).result() })?;
        Ok(ptr)
    }

    fn ipc_mem_handle(&self, ptr: u64) -> CudaResult<[u8; 64]> {
        // The driver has no legacy IPC handle for memory mapped through VMM.
        if self.own_memory().holds(ptr) {
            tracing::warn!(
                ptr = format_args!("{ptr:#x}"),
                "cuIpcGetMemHandle: not supported while the server pages (--oversubscribe): the session's memory is mapped by the server itself, which the driver exports by no IPC handle"
            );
            return Err(CudaError::NOT_SUPPORTED);
        }
        if self.restored.lock().unwrap_or_else(std::sync::PoisonError::into_inner).span_of(ptr).is_some() {
            tracing::warn!(
                ptr = format_args!("{ptr:#x}"),
                "cuIpcGetMemHandle: not supported for memory of a session that moved here (mapped by the server itself)"
            );
            return Err(CudaError::NOT_SUPPORTED);
        }
        let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: `ptr` lies in an allocation of the session (checked); valid out-pointer.
        check(unsafe { sys::cuIpcGetMemHandle(&mut handle, ptr).result() })?;
        Ok(handle.reserved.map(|byte| byte as u8))
    }

    fn ipc_open_mem(&self, handle: &[u8; 64], flags: u32) -> CudaResult<(u64, u64)> {
        let handle = sys::CUipcMemHandle { reserved: handle.map(|byte| byte as std::ffi::c_char) };
        let mut ptr = 0;
        // SAFETY: valid out-pointer; the driver checks the handle's bytes.
        check(unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, handle, flags).result() })?;
        let (mut base, mut size) = (0u64, 0usize);
        // SAFETY: `ptr` was just mapped; valid out-pointers.
        let range = check(unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr).result() });
        match range {
            Ok(()) => Ok((ptr, size as u64 - (ptr - base))),
            Err(error) => {
                // SAFETY: the mapping opened above, closed once.
                let _ = unsafe { sys::cuIpcCloseMemHandle(ptr) };
                Err(error)
            }
        }
    }

    fn ipc_close_mem(&self, ptr: u64) -> CudaResult<()> {
        // SAFETY: a mapping this session opened (checked), closed once.
        check(unsafe { sys::cuIpcCloseMemHandle(ptr).result() })
    }

    fn ipc_event_handle(&self, event: Self::Event) -> CudaResult<[u8; 64]> {
        let mut handle = sys::CUipcEventHandle { reserved: [0; 64] };
        // SAFETY: an event of the session; valid out-pointer.
        check(unsafe { sys::cuIpcGetEventHandle(&mut handle, event.0).result() })?;
        Ok(handle.reserved.map(|byte| byte as u8))
    }

    fn ipc_open_event(&self, handle: &[u8; 64]) -> CudaResult<Self::Event> {
        let handle = sys::CUipcEventHandle { reserved: handle.map(|byte| byte as std::ffi::c_char) };
        let mut event = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the driver checks the handle's bytes.
        check(unsafe { sys::cuIpcOpenEventHandle(&mut event, handle).result() })?;
        Ok(Handle(event))
    }

    fn stream_attribute(&self, stream: Self::Stream, attribute: u32, set: Option<&[u8; 64]>) -> CudaResult<[u8; 64]> {
        self.attribute_of_stream(stream_ptr(stream), attribute, set)
    }

    unsafe fn stream_mem_ops(&self, stream: Self::Stream, ops: &[StreamMemOp]) -> CudaResult<()> {
        let batch = self.driver.cuStreamBatchMemOp_v2.ok_or(CudaError::NOT_SUPPORTED)?;
        let mut params: Vec<MemOpParams> = ops.iter().map(StreamMemOp::driver_words).collect();
        let count = c_uint::try_from(params.len()).map_err(|_| CudaError::INVALID_VALUE)?;
        // SAFETY: the session's stream; `params` holds `count` well-formed operations whose
        // addresses the caller guarantees are the session's device memory or mapped host memory.
        raw_check(unsafe { batch(stream.0.cast(), count, params.as_mut_ptr().cast(), 0) }.0)
    }

    fn tensor_map_encode(&self, encode: &TensorMapParams) -> CudaResult<[u8; 128]> {
        let mut map = TensorMap([0; 128]);
        let rank = encode.rank;
        let rank_len = rank as usize;
        // Counts the session checked with `global_span`; the element strides are checked here.
        if encode.element_strides.len() != rank_len {
            return Err(CudaError::INVALID_VALUE);
        }
        let address = encode.address as *mut c_void;
        let (dims, strides, element_strides) = (encode.dims.as_ptr(), encode.strides.as_ptr(), encode.element_strides.as_ptr());
        let (kind, interleave, swizzle, l2, oob) =
            (encode.data_type, encode.interleave, encode.swizzle, encode.l2_promotion, encode.oob_fill);
        let code = match &encode.layout {
            TensorMapLayout::Tiled { box_dim } => {
                let call = self.driver.cuTensorMapEncodeTiled.ok_or(CudaError::NOT_SUPPORTED)?;
                if box_dim.len() != rank_len {
                    return Err(CudaError::INVALID_VALUE);
                }
                // SAFETY: every array holds the count the driver reads for `rank`; the address
                // lies in the session's device memory, which the driver only records.
                unsafe {
                    call(
                        (&raw mut map).cast(),
                        kind,
                        rank,
                        address,
                        dims,
                        strides,
                        box_dim.as_ptr(),
                        element_strides,
                        interleave,
                        swizzle,
                        l2,
                        oob,
                    )
                }
            }
            TensorMapLayout::Im2col { lower_corner, upper_corner, channels_per_pixel, pixels_per_column } => {
                let call = self.driver.cuTensorMapEncodeIm2col.ok_or(CudaError::NOT_SUPPORTED)?;
                let corners = rank_len.checked_sub(2).ok_or(CudaError::INVALID_VALUE)?;
                if lower_corner.len() != corners || upper_corner.len() != corners {
                    return Err(CudaError::INVALID_VALUE);
                }
                // SAFETY: as above; the corners hold `rank - 2` entries each.
                unsafe {
                    call(
                        (&raw mut map).cast(),
                        kind,
                        rank,
                        address,
                        dims,
                        strides,
                        lower_corner.as_ptr(),
                        upper_corner.as_ptr(),
                        *channels_per_pixel,
                        *pixels_per_column,
                        element_strides,
                        interleave,
                        swizzle,
                        l2,
                        oob,
                    )
                }
            }
            TensorMapLayout::Im2colWide { lower_corner_width, upper_corner_width, channels_per_pixel, pixels_per_column, mode } => {
                let call = self.driver.cuTensorMapEncodeIm2colWide.ok_or(CudaError::NOT_SUPPORTED)?;
                // SAFETY: as above.
                unsafe {
                    call(
                        (&raw mut map).cast(),
                        kind,
                        rank,
                        address,
                        dims,
                        strides,
                        *lower_corner_width,
                        *upper_corner_width,
                        *channels_per_pixel,
                        *pixels_per_column,
                        element_strides,
                        interleave,
                        *mode,
                        swizzle,
                        l2,
                        oob,
                    )
                }
            }
        };
        raw_check(code.0)?;
        Ok(map.0)
    }

    fn tensor_map_replace_address(&self, map: &[u8; 128], address: u64) -> CudaResult<[u8; 128]> {
        let replace = self.driver.cuTensorMapReplaceAddress.ok_or(CudaError::NOT_SUPPORTED)?;
        let mut map = TensorMap(*map);
        // SAFETY: a 128-byte, 128-byte-aligned map of ours; the address lies in the session's
        // device memory.
        raw_check(unsafe { replace((&raw mut map).cast(), address as *mut c_void) }.0)?;
        Ok(map.0)
    }

    fn context_event(&self, event: Self::Event, wait: bool) -> CudaResult<()> {
        let context = self.gpu().context.load(Ordering::Acquire);
        // SAFETY: the session's primary context and one of its events.
        check(unsafe {
            if wait { sys::cuCtxWaitEvent(context, event.0).result() } else { sys::cuCtxRecordEvent(context, event.0).result() }
        })
    }

    fn pool_access(&self, pool: Self::MemPool, set: Option<u32>) -> CudaResult<u32> {
        use sys::CUmemAccess_flags as Access;
        if let Some(flags) = set {
            let flags = match flags {
                0 => Access::CU_MEM_ACCESS_FLAGS_PROT_NONE,
                1 => Access::CU_MEM_ACCESS_FLAGS_PROT_READ,
                3 => Access::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
                _ => return Err(CudaError::INVALID_VALUE),
            };
            let desc = sys::CUmemAccessDesc { location: self.location(), flags };
            // SAFETY: one of the session's pools; one descriptor.
            check(unsafe { sys::cuMemPoolSetAccess(pool.0, &desc, 1).result() })?;
        }
        let get = self.driver.cuMemPoolGetAccess.ok_or(CudaError::NOT_SUPPORTED)?;
        let mut flags: c_uint = 0;
        let mut location = self.location();
        // SAFETY: valid out-pointer and location; one of the session's pools.
        raw_check(unsafe { get(&mut flags, pool.0.cast(), (&raw mut location).cast()) }.0)?;
        Ok(flags)
    }

    fn occupancy_max_potential_cluster_size(&self, function: Self::Function, shape: LaunchShape<'_>) -> CudaResult<i32> {
        cluster_occupancy(function, shape, sys::cuOccupancyMaxPotentialClusterSize)
    }

    fn dev_resource(&self, green: Option<Self::GreenCtx>, kind: u32) -> CudaResult<Self::Resource> {
        self.green_resource(green, kind)
    }

    fn resource_facts(resource: &Self::Resource) -> flyt_protocol::ops::DevResource {
        super::cuda_green::resource_facts(resource)
    }

    fn sm_resource_split(
        &self,
        input: &Self::Resource,
        groups: Option<u32>,
        flags: u32,
        min_count: u32,
    ) -> CudaResult<super::SmSplit<Self>> {
        self.split_resource(input, groups, flags, min_count)
    }

    fn resource_desc(&self, resources: &[Self::Resource]) -> CudaResult<Self::ResourceDesc> {
        self.describe_resources(resources).map(Handle)
    }

    fn green_create(&self, desc: Self::ResourceDesc, flags: u32) -> CudaResult<Self::GreenCtx> {
        self.new_green(desc.0, flags)
    }

    fn green_stream_create(&self, green: Self::GreenCtx, flags: u32, priority: i32) -> CudaResult<Self::Stream> {
        self.new_green_stream(green, flags, priority)
    }

    fn green_event(&self, green: Self::GreenCtx, event: Self::Event, wait: bool) -> CudaResult<()> {
        self.green_event_op(green, event.0, wait)
    }

    fn green_destroy(&self, green: Self::GreenCtx) -> CudaResult<()> {
        self.drop_green(green)
    }

    fn malloc_pitch(&self, width: u64, height: u64, element_size: u32) -> CudaResult<(u64, u64)> {
        if !self.keep_addresses {
            return self.pitch_alloc(width, height, element_size);
        }
        // The server pages: the rows go in the session's own memory, at the pitch the driver
        // gives for this width (asked with one row, freed at once).
        let (row, pitch) = self.pitch_alloc(width, 1, element_size)?;
        // SAFETY: the row allocated just above, used by nothing.
        check(unsafe { result::free_sync(row) })?;
        self.malloc(pitch.checked_mul(height).ok_or(CudaError::MEMORY_ALLOCATION)?).map(|ptr| (ptr, pitch))
    }

    fn memset_2d(&self, set: &Memset2d, stream: Self::Stream) -> CudaResult<()> {
        self.set_2d(set, stream_ptr(stream))
    }

    unsafe fn copy_shaped(&self, src: Side<Self>, dst: Side<Self>, extent: Extent, stream: Self::Stream) -> CudaResult<()> {
        // SAFETY: forwarded contract.
        unsafe { self.shaped(src, dst, extent, stream_ptr(stream)) }
    }

    fn copy_staged_to_shaped(&self, dst: Side<Self>, extent: Extent, src: Staging, stream: Self::Stream) -> CudaResult<()> {
        let slot = src.slot();
        let host = Side::Host { ptr: slot.ptr, pitch: extent.width, height: extent.height };
        // SAFETY: the source is the held staging slot (pinned, mapped for the process's life),
        // packed rows of the box; recording the slot's event after the copy keeps the slot from
        // being reused before the DMA is done, as in `copy_htod`.
        unsafe {
            self.shaped(host, dst, extent, stream_ptr(stream))?;
            slot.record_after(stream_ptr(stream), self.stream_gpu(stream))
        }
    }

    fn start_shaped_to_staged(&self, src: Side<Self>, extent: Extent, dst: Staging, stream: Self::Stream) -> CudaResult<PendingCopy> {
        let slot = dst.slot();
        let host = Side::Host { ptr: slot.ptr, pitch: extent.width, height: extent.height };
        // SAFETY: as in `start_dtoh`: the held staging slot stays held until the event was waited.
        unsafe {
            self.shaped(src, host, extent, stream_ptr(stream))?;
            slot.record_after(stream_ptr(stream), self.stream_gpu(stream))?;
        }
        Ok(PendingCopy { staging: dst })
    }

    fn array_create(&self, desc: &ArrayDesc) -> CudaResult<Self::Array> {
        self.new_array(desc)
    }

    fn array_destroy(&self, array: Self::Array) -> CudaResult<()> {
        self.destroy_array(array)
    }

    fn mipmap_create(&self, desc: &ArrayDesc, levels: u32) -> CudaResult<Self::Mipmap> {
        self.new_mipmap(desc, levels)
    }

    fn mipmap_level(&self, mipmap: Self::Mipmap, level: u32) -> CudaResult<Self::Array> {
        self.level(mipmap, level)
    }

    fn mipmap_destroy(&self, mipmap: Self::Mipmap) -> CudaResult<()> {
        self.destroy_mipmap(mipmap)
    }

    fn tex_create(&self, resource: TexResource<Self>, texture: &TextureDesc, view: Option<&ViewDesc>) -> CudaResult<u64> {
        self.new_texture(resource, texture, view)
    }

    fn surf_create(&self, array: Self::Array) -> CudaResult<u64> {
        self.new_surface(array)
    }

    fn object_destroy(&self, handle: u64, surface: bool) -> CudaResult<()> {
        self.destroy_object(handle, surface)
    }

    fn array_plane(&self, array: Self::Array, _desc: &ArrayDesc, plane: u32) -> CudaResult<(Self::Array, ArrayDesc)> {
        self.plane(array, plane)
    }

    fn sparse_properties(&self, target: ArrayRef<Self>, _desc: &ArrayDesc, _levels: u32) -> CudaResult<SparseProperties> {
        self.sparse_of(target)
    }

    fn memory_requirements(&self, target: ArrayRef<Self>, _desc: &ArrayDesc, _levels: u32) -> CudaResult<(u64, u64)> {
        self.requirements_of(target, self.gpu().device)
    }

    fn map_arrays(&self, maps: &[ArrayMapWork<Self>], stream: Self::Stream) -> CudaResult<()> {
        self.map_array_work(maps, stream.0, self.gpu().device)
    }

    fn batch_decompress(&self, ops: &[DecompressOp], stream: Self::Stream) -> Result<(), (CudaError, Option<u64>)> {
        self.decompress(ops, stream.0)
    }

    fn launch_host_call(&self, stream: Self::Stream, site: &Arc<HostCallSite>, kept: bool) -> CudaResult<()> {
        if kept {
            let params = host_params(site);
            // SAFETY: the session's stream; the session keeps the site alive (it may become a
            // captured graph's node and run many times).
            return check(unsafe { sys::cuLaunchHostFunc(stream.0, params.fn_, params.userData).result() });
        }
        let user_data = Arc::into_raw(site.clone());
        // SAFETY: the stream is the session's; the callback takes back the reference passed
        // here (`run_host_call_once`), so the site lives until it has run.
        let code = unsafe { sys::cuLaunchHostFunc(stream.0, Some(run_host_call_once), user_data.cast_mut().cast()) };
        if code != sys::CUresult::CUDA_SUCCESS {
            // SAFETY: the driver refused the call, so the reference was not handed over.
            drop(unsafe { Arc::from_raw(user_data) });
        }
        check(code.result())
    }
}

/// A `CUfunc_cache` from its number; anything else is `INVALID_VALUE`, as the driver answers.
fn func_cache(config: u32) -> CudaResult<sys::CUfunc_cache> {
    use sys::CUfunc_cache as Cache;
    Ok(match config {
        0 => Cache::CU_FUNC_CACHE_PREFER_NONE,
        1 => Cache::CU_FUNC_CACHE_PREFER_SHARED,
        2 => Cache::CU_FUNC_CACHE_PREFER_L1,
        3 => Cache::CU_FUNC_CACHE_PREFER_EQUAL,
        _ => return Err(CudaError::INVALID_VALUE),
    })
}

/// The driver's form of the launch attributes Flyt forwards; any other id is refused.
fn launch_attributes(attributes: &[LaunchAttribute]) -> CudaResult<Vec<sys::CUlaunchAttribute>> {
    use sys::CUlaunchAttributeID as Id;
    attributes
        .iter()
        .map(|attribute| {
            let id = match attribute.id {
                2 => Id::CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
                3 => Id::CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY,
                4 => Id::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
                5 => Id::CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
                6 => Id::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                8 => Id::CU_LAUNCH_ATTRIBUTE_PRIORITY,
                9 => Id::CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP,
                10 => Id::CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN,
                11 => Id::CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION,
                14 => Id::CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                _ => return Err(CudaError::NOT_SUPPORTED),
            };
            // SAFETY: the attribute is plain data (an enum with a valid variant set below, padding
            // and a union of plain values): all-zero bytes are a valid value of each field.
            let mut driver: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            driver.id = id;
            // SAFETY: the union is at least 16 bytes long (64 in CUDA 13); the forwarded
            // attributes keep their whole value in its first 16 bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(attribute.value.as_ptr().cast::<u8>(), (&raw mut driver.value).cast::<u8>(), 16);
            }
            Ok(driver)
        })
        .collect()
}

fn launch_config(
    LaunchShape { grid, block, shared_mem, .. }: LaunchShape<'_>,
    stream: sys::CUstream,
    attributes: &mut [sys::CUlaunchAttribute],
) -> CudaResult<sys::CUlaunchConfig> {
    Ok(sys::CUlaunchConfig {
        gridDimX: grid.x,
        gridDimY: grid.y,
        gridDimZ: grid.z,
        blockDimX: block.x,
        blockDimY: block.y,
        blockDimZ: block.z,
        sharedMemBytes: shared_mem,
        hStream: stream,
        attrs: attributes.as_mut_ptr(),
        numAttrs: c_uint::try_from(attributes.len()).map_err(|_| CudaError::INVALID_VALUE)?,
    })
}

/// One of the driver's cluster occupancy queries (`cuOccupancyMaxActiveClusters`,
/// `cuOccupancyMaxPotentialClusterSize`) for a launch configuration.
fn cluster_occupancy(
    function: Handle<sys::CUfunction>,
    shape: LaunchShape<'_>,
    query: unsafe fn(*mut c_int, sys::CUfunction, *const sys::CUlaunchConfig) -> sys::CUresult,
) -> CudaResult<i32> {
    let mut attributes = launch_attributes(shape.attributes)?;
    let config = launch_config(shape, std::ptr::null_mut(), &mut attributes)?;
    let mut value = 0;
    // SAFETY: `function` belongs to a loaded module; `config` and its attributes outlive the
    // call; valid out-pointer.
    check(unsafe { query(&mut value, function.0, &config).result() })?;
    Ok(value)
}

/// A `CUmemAccess_flags` from its number.
fn access_flags(flags: u32) -> CudaResult<sys::CUmemAccess_flags> {
    use sys::CUmemAccess_flags as Access;
    Ok(match flags {
        0 => Access::CU_MEM_ACCESS_FLAGS_PROT_NONE,
        1 => Access::CU_MEM_ACCESS_FLAGS_PROT_READ,
        3 => Access::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        _ => return Err(CudaError::INVALID_VALUE),
    })
}

/// The driver's `CUgraphEdgeData` for ports and types (reserved bytes zero).
fn driver_edge_data(data: &[EdgeData]) -> Vec<sys::CUgraphEdgeData> {
    data.iter()
        .map(|[from_port, to_port, type_]| sys::CUgraphEdgeData {
            from_port: *from_port,
            to_port: *to_port,
            type_: *type_,
            reserved: [0; 5],
        })
        .collect()
}

/// An all-zero `CUgraphEdgeData` (a full dependency), to be filled in by the driver.
fn edge_data_zero() -> sys::CUgraphEdgeData {
    sys::CUgraphEdgeData { from_port: 0, to_port: 0, type_: 0, reserved: [0; 5] }
}

/// A `CUstreamCaptureMode` from its number: global, thread-local or relaxed.
fn capture_mode(mode: u32) -> CudaResult<sys::CUstreamCaptureMode> {
    use sys::CUstreamCaptureMode as Mode;
    Ok(match mode {
        0 => Mode::CU_STREAM_CAPTURE_MODE_GLOBAL,
        1 => Mode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        2 => Mode::CU_STREAM_CAPTURE_MODE_RELAXED,
        _ => return Err(CudaError::INVALID_VALUE),
    })
}

/// A kernel's packed arguments as `CU_LAUNCH_PARAM_BUFFER_POINTER`/`_SIZE` want them.
struct PackedArgs {
    size: usize,
    extra: [*mut c_void; 5],
}

impl PackedArgs {
    fn new(args: &mut [u8]) -> Box<Self> {
        let mut packed = Box::new(Self { size: args.len(), extra: [std::ptr::null_mut(); 5] });
        let size_ptr = (&raw mut packed.size).cast();
        packed.extra = [
            std::ptr::without_provenance_mut(1),
            args.as_mut_ptr().cast(),
            std::ptr::without_provenance_mut(2),
            size_ptr,
            std::ptr::null_mut(),
        ];
        packed
    }

    fn extra(&mut self) -> *mut *mut c_void {
        if self.size == 0 { std::ptr::null_mut() } else { self.extra.as_mut_ptr() }
    }
}

fn kernel_params(
    function: Handle<sys::CUfunction>,
    grid: Dim3,
    block: Dim3,
    shared_mem: u32,
    args: &mut PackedArgs,
) -> sys::CUDA_KERNEL_NODE_PARAMS_v2_st {
    sys::CUDA_KERNEL_NODE_PARAMS_v2_st {
        func: function.0,
        gridDimX: grid.x,
        gridDimY: grid.y,
        gridDimZ: grid.z,
        blockDimX: block.x,
        blockDimY: block.y,
        blockDimZ: block.z,
        sharedMemBytes: shared_mem,
        kernelParams: std::ptr::null_mut(),
        extra: args.extra(),
        kern: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
    }
}

fn memcpy_params(copy: &Copy3d) -> sys::CUDA_MEMCPY3D {
    sys::CUDA_MEMCPY3D {
        srcXInBytes: 0,
        srcY: 0,
        srcZ: 0,
        srcLOD: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: copy.src,
        srcArray: std::ptr::null_mut(),
        reserved0: std::ptr::null_mut(),
        srcPitch: copy.src_pitch as usize,
        srcHeight: copy.src_height as usize,
        dstXInBytes: 0,
        dstY: 0,
        dstZ: 0,
        dstLOD: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: copy.dst,
        dstArray: std::ptr::null_mut(),
        reserved1: std::ptr::null_mut(),
        dstPitch: copy.dst_pitch as usize,
        dstHeight: copy.dst_height as usize,
        WidthInBytes: copy.width as usize,
        Height: copy.height as usize,
        Depth: copy.depth as usize,
    }
}

fn memset_params(set: &Memset2d) -> sys::CUDA_MEMSET_NODE_PARAMS {
    sys::CUDA_MEMSET_NODE_PARAMS {
        dst: set.dst,
        pitch: set.pitch as usize,
        value: set.value,
        elementSize: u32::from(set.element_size),
        width: set.width as usize,
        height: set.height as usize,
    }
}

fn host_params(site: &Arc<HostCallSite>) -> sys::CUDA_HOST_NODE_PARAMS {
    // The session keeps every graph node's site alive while any graph may run it.
    sys::CUDA_HOST_NODE_PARAMS { fn_: Some(run_host_call), userData: Arc::as_ptr(site).cast_mut().cast() }
}

/// A graph host node's callback.
unsafe extern "C" fn run_host_call(user_data: *mut c_void) {
    // SAFETY: the `HostCallSite` of `host_params`, kept alive by the session.
    let site = unsafe { &*user_data.cast::<HostCallSite>() };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| site.run()));
}

/// `cuLaunchHostFunc`'s callback: runs once and drops its reference.
unsafe extern "C" fn run_host_call_once(user_data: *mut c_void) {
    // SAFETY: the reference `launch_host_call` handed over with `Arc::into_raw`.
    let site = unsafe { Arc::from_raw(user_data.cast::<HostCallSite>()) };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| site.run()));
}

/// A GPU's PCI address, by which NVML knows it.
fn pci_address_of(device: sys::CUdevice) -> super::nvlinks::PciAddress {
    use flyt_protocol::device::attr;
    let attribute = |id: u32| {
        let mut value: c_int = -1;
        // SAFETY: `value` is a valid out-pointer and `device` came from cuDeviceGet; an unknown
        // attribute is an error code (the address then reads 0 there).
        let _ = unsafe { driver_call!(driver_table(), cuDeviceGetAttribute(&mut value, id as c_uint, device)) };
        value
    };
    super::nvlinks::pci_address(attribute(attr::PCI_DOMAIN_ID), attribute(attr::PCI_BUS_ID), attribute(attr::PCI_DEVICE_ID))
}

/// The NVLinks of GPUs `ordinals` (as this process's driver numbers them; after
/// [`probe_uuid_names`] found them) as a session of those GPUs, in that order, sees them: asked of
/// NVML once by the listener's probe, so the workers need not load it.
pub fn probe_nvlinks(ordinals: &[u32]) -> Vec<Vec<flyt_protocol::device::NvLinkEnd>> {
    let addresses: Vec<super::nvlinks::PciAddress> = ordinals
        .iter()
        .map(|ordinal| match c_int::try_from(*ordinal).ok().and_then(|ordinal| result::device::get(ordinal).ok()) {
            Some(device) => pci_address_of(device),
            None => super::nvlinks::pci_address(-1, -1, -1),
        })
        .collect();
    super::nvlinks::session_nvlinks(&addresses)
}

/// The UUID names (`GPU-...`, or `MIG-...` for a MIG instance) of GPUs `ordinals` as this
/// process's driver numbers them, for the listener's probe (`crate::visible`). No context is made.
pub fn probe_uuid_names(ordinals: &[u32]) -> Result<Vec<String>, String> {
    // SAFETY: probing only tries to dlopen libcuda (see `CudaDevice::open`).
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver (libcuda.so.1 not found): use --device emulated on machines without a GPU".into());
    }
    result::init().map_err(|error| format!("cuInit failed: {error}"))?;
    let count = result::device::get_count().map_err(|error| format!("cuDeviceGetCount: {error}"))?;
    // The first UUID call names a MIG instance by its parent GPU's UUID, the second by its own:
    // where they differ the device is a MIG instance, which CUDA_VISIBLE_DEVICES names `MIG-`.
    let parent_uuid = driver_table().cuDeviceGetUuid;
    let mut names = Vec::with_capacity(ordinals.len());
    for ordinal in ordinals {
        let ordinal = c_int::try_from(*ordinal).map_err(|_| "GPU ordinal too large".to_string())?;
        if ordinal >= count {
            return Err(format!("GPU {ordinal} does not exist ({count} visible)"));
        }
        let device = result::device::get(ordinal).map_err(|error| format!("cuDeviceGet: {error}"))?;
        let own = result::device::get_uuid(device).map_err(|error| format!("cuDeviceGetUuid_v2: {error}"))?.bytes.map(|b| b as u8);
        let mig = parent_uuid.is_some_and(|get| {
            // SAFETY: all-zero is a valid CUuuid; valid out-pointer and device.
            let mut parent: flyt_cuda_sys::types::CUuuid = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            unsafe { get(&mut parent, device).0 == 0 && parent.bytes.map(|b| b as u8) != own }
        });
        names.push(crate::visible::uuid_name(&own, mig));
    }
    Ok(names)
}
