//! Device memory, copies, memsets and pinned host memory, through the process's `flyt-client`
//! session: the same paths (range checks, the shared-memory channel, queued memsets and
//! host-to-device copies) the runtime front uses.

use std::ffi::{c_uchar, c_uint, c_ushort, c_void};

use flyt_client::client::Client;
use flyt_client::host_files::Unmappable;
use flyt_client::transfer::{self, Direction, Mode};
use flyt_protocol::ops::req;

use super::session::{client, resolve_stream, run, session_client};
use crate::CUresult;
use crate::ffi::{DriverResult, non_null, write_out};
use crate::generated::types::{CUcontext, CUdeviceptr, CUmemcpyAttributes, CUpointer_attribute, CUstream};

/// `CU_MEMHOSTALLOC_PORTABLE | DEVICEMAP | WRITECOMBINED`.
const HOST_ALLOC_FLAGS: c_uint = 0x7;

pub unsafe fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    run(|| {
        non_null([dptr.cast()])?;
        if bytesize == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let client = client()?;
        let size = bytesize as u64;
        let allocate = || client.call(req::Malloc { size }).map(|reply| reply.ptr);
        let ptr = client
            .place_allocation(size, allocate, |ptr| client.call(req::Free { ptr }).map(drop))
            .map_err(super::session::driver_error)?;
        client.mark_legacy_ipc(ptr);
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(dptr, ptr) }
    })
}

pub unsafe fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    run(|| {
        let client = client()?;
        if dptr == 0 {
            return Ok(());
        }
        // Freed by its own server, whichever device is current (a session spread over nodes).
        client.on_pointer_server(dptr, || free_device_memory(client, dptr))
    })
}

fn free_device_memory(client: &flyt_client::client::Client, dptr: CUdeviceptr) -> DriverResult {
    if client.host_allocation(dptr as usize).is_some_and(|host| host.managed) {
        return flyt_client::managed::free(client, dptr).map_err(super::session::driver_error);
    }
    if client.mirrors().holds_allocation(dptr) {
        // Inside a mirror's device memory (mapped memory, or managed memory freed already, in
        // a block others still use): no allocation of the app's, and the server must not free
        // the block.
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    if client.forget_allocation(dptr).is_err() {
        // Not an allocation of this process's: graph memory is freed outside its graph too
        // (after a launch), which the server knows; anything else it refuses.
        return client.call(req::Free { ptr: dptr }).map(|_| ()).map_err(super::session::driver_error);
    }
    sync_memops().remove(&dptr);
    client.call(req::Free { ptr: dptr }).map(|_| ()).map_err(super::session::driver_error)
}

pub unsafe fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    run(|| {
        non_null([free.cast(), total.cast()])?;
        let reply = client()?.call(req::MemGetInfo {}).map_err(super::session::driver_error)?;
        // SAFETY: both checked non-NULL; the caller's out-pointers.
        unsafe {
            write_out(free, reply.free as usize)?;
            write_out(total, reply.total as usize)
        }
    })
}

/// A copy between the addresses the caller gave, `declared` being what the entry point's name says
/// (None for `cuMemcpy`, which goes by the pointers: unified addressing).
///
/// # Safety
/// The host side is valid for `count` bytes (for an asynchronous copy into host memory, until the
/// caller synchronizes), per the driver API's contract.
unsafe fn memcpy(dst: u64, src: u64, count: usize, declared: Option<Direction>, stream: CUstream, mode: Mode, ptds: bool) -> DriverResult {
    let client = client()?;
    let stream = resolve_stream(client, stream, ptds)?;
    if count == 0 {
        return Ok(());
    }
    if dst == 0 || src == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let found = transfer::classify(client, dst, src);
    let direction = match declared {
        None => found,
        // The device side the name promises must be device memory the session knows, or host
        // memory kernels use at its address (mapped or managed: unified addressing, as natively),
        // copied as the host memory it is; a host side that is device memory would be read or
        // written as host memory: refused.
        Some(declared) if declared == found || transfer::declared_fits(client, declared, found, dst, src) => found,
        Some(_) => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    };
    // SAFETY: forwarded contract.
    unsafe { transfer::copy(client, dst as usize as *mut c_void, src as usize as *const c_void, count, direction, stream, mode) }
        .map_err(super::session::driver_error)
}

macro_rules! copies {
    ($($name:ident ($dst:ident : $dst_ty:ty, $src:ident : $src_ty:ty $(, $stream:ident)?) => $direction:expr, $mode:ident, $ptds:literal;)*) => {$(
        pub unsafe fn $name($dst: $dst_ty, $src: $src_ty, byte_count: usize $(, $stream: CUstream)?) -> CUresult {
            #[allow(unused_mut, unused_assignments, reason = "the synchronous forms have no stream")]
            let mut stream: CUstream = std::ptr::null_mut();
            $(stream = $stream;)?
            // SAFETY: the caller's buffers, per the driver API's contract for this function.
            run(|| unsafe { memcpy($dst as usize as u64, $src as usize as u64, byte_count, $direction, stream, Mode::$mode, $ptds) })
        }
    )*};
}

copies! {
    cuMemcpyHtoD_v2(dst_device: CUdeviceptr, src_host: *const c_void) => Some(Direction::HostToDevice), Synchronous, false;
    cuMemcpyHtoD_v2_ptds(dst_device: CUdeviceptr, src_host: *const c_void) => Some(Direction::HostToDevice), Synchronous, true;
    cuMemcpyDtoH_v2(dst_host: *mut c_void, src_device: CUdeviceptr) => Some(Direction::DeviceToHost), Synchronous, false;
    cuMemcpyDtoH_v2_ptds(dst_host: *mut c_void, src_device: CUdeviceptr) => Some(Direction::DeviceToHost), Synchronous, true;
    cuMemcpyDtoD_v2(dst_device: CUdeviceptr, src_device: CUdeviceptr) => Some(Direction::DeviceToDevice), Synchronous, false;
    cuMemcpyDtoD_v2_ptds(dst_device: CUdeviceptr, src_device: CUdeviceptr) => Some(Direction::DeviceToDevice), Synchronous, true;
    cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr) => None, Synchronous, false;
    cuMemcpy_ptds(dst: CUdeviceptr, src: CUdeviceptr) => None, Synchronous, true;
    cuMemcpyHtoDAsync_v2(dst_device: CUdeviceptr, src_host: *const c_void, h_stream) => Some(Direction::HostToDevice), Asynchronous, false;
    cuMemcpyHtoDAsync_v2_ptsz(dst_device: CUdeviceptr, src_host: *const c_void, h_stream) => Some(Direction::HostToDevice), Asynchronous, true;
    cuMemcpyDtoHAsync_v2(dst_host: *mut c_void, src_device: CUdeviceptr, h_stream) => Some(Direction::DeviceToHost), Asynchronous, false;
    cuMemcpyDtoHAsync_v2_ptsz(dst_host: *mut c_void, src_device: CUdeviceptr, h_stream) => Some(Direction::DeviceToHost), Asynchronous, true;
    cuMemcpyDtoDAsync_v2(dst_device: CUdeviceptr, src_device: CUdeviceptr, h_stream) => Some(Direction::DeviceToDevice), Asynchronous, false;
    cuMemcpyDtoDAsync_v2_ptsz(dst_device: CUdeviceptr, src_device: CUdeviceptr, h_stream) => Some(Direction::DeviceToDevice), Asynchronous, true;
    cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, h_stream) => None, Asynchronous, false;
    cuMemcpyAsync_ptsz(dst: CUdeviceptr, src: CUdeviceptr, h_stream) => None, Asynchronous, true;
}

/// `CUmemcpyAttributes` (cuda.h 12.8+; opaque in the generated types).
#[repr(C)]
pub struct MemcpyAttributes {
    src_access_order: c_uint,
    src_loc_hint: [u32; 2],
    dst_loc_hint: [u32; 2],
    flags: c_uint,
}

/// `CU_MEMCPY_SRC_ACCESS_ORDER_STREAM`, `_DURING_API_CALL`, `_ANY`.
const ACCESS_ORDER_STREAM: c_uint = 1;
pub(super) const ACCESS_ORDER_DURING_CALL: c_uint = 2;
const ACCESS_ORDER_ANY: c_uint = 3;
/// `CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE`, a hint.
const MEMCPY_FLAGS: c_uint = 0x1;

/// Whether a batch copy's source access order and flags are ones the driver takes.
pub(super) fn valid_batch_attributes(src_access_order: c_uint, flags: c_uint) -> bool {
    matches!(src_access_order, ACCESS_ORDER_STREAM | ACCESS_ORDER_DURING_CALL | ACCESS_ORDER_ANY) && flags & !MEMCPY_FLAGS == 0
}

/// A batch's optional out-parameter for the index of the failing copy: `usize::MAX` (no copy
/// failed, or the batch as a whole) until a copy fails.
pub(super) struct FailIndex(*mut usize);

impl FailIndex {
    /// # Safety
    /// `out` is NULL or the caller's writable out-pointer.
    pub(super) unsafe fn new(out: *mut usize) -> Self {
        let index = Self(out);
        index.set(usize::MAX);
        index
    }

    pub(super) fn set(&self, index: usize) {
        if !self.0.is_null() {
            // SAFETY: non-NULL; the caller's out-pointer (see `new`).
            unsafe { self.0.write(index) };
        }
    }
}

/// `cuMemcpyBatchAsync*`: the copies one after the other on `stream` (the batch runs in stream
/// order; the driver may order copies within it as it likes, so this order is one it could
/// choose). A host source whose attributes say it may be gone once the call returns
/// (`DURING_API_CALL`) is read before the call returns. On a failure, `fail_idx` names the copy.
///
/// # Safety
/// The arrays hold `count` (`num_attrs`) elements and every host side is valid for its size,
/// per the driver API's contract.
#[expect(clippy::too_many_arguments, reason = "the driver's batch copy, with the stream's resolution")]
unsafe fn memcpy_batch(
    dsts: *const CUdeviceptr,
    srcs: *const CUdeviceptr,
    sizes: *const usize,
    count: usize,
    attrs: *const MemcpyAttributes,
    attrs_idxs: *const usize,
    num_attrs: usize,
    fail_idx: *mut usize,
    stream: CUstream,
    ptds: bool,
) -> DriverResult {
    // SAFETY: the caller's optional out-pointer.
    let fail_idx = unsafe { FailIndex::new(fail_idx) };
    non_null([dsts.cast(), srcs.cast(), sizes.cast(), attrs.cast(), attrs_idxs.cast()])?;
    let client = client()?;
    // The legacy NULL stream (id 0 on the wire) is refused, as the driver documents.
    let legacy = super::session::is_legacy_stream(client, stream, ptds)?;
    if count == 0 || num_attrs == 0 || num_attrs > count || legacy {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's arrays of `count` and `num_attrs` elements.
    let (dsts, srcs, sizes, attrs, starts) = unsafe {
        (
            std::slice::from_raw_parts(dsts, count),
            std::slice::from_raw_parts(srcs, count),
            std::slice::from_raw_parts(sizes, count),
            std::slice::from_raw_parts(attrs, num_attrs),
            std::slice::from_raw_parts(attrs_idxs, num_attrs),
        )
    };
    let ordered =
        starts.first() == Some(&0) && starts.windows(2).all(|pair| pair[0] < pair[1]) && starts.iter().all(|&start| start < count);
    if !ordered || !attrs.iter().all(|attr| valid_batch_attributes(attr.src_access_order, attr.flags)) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    for (index, ((&dst, &src), &size)) in dsts.iter().zip(srcs).zip(sizes).enumerate() {
        let attr = &attrs[starts.partition_point(|&start| start <= index) - 1];
        let read_now = attr.src_access_order == ACCESS_ORDER_DURING_CALL && !client.is_device_pointer(src);
        let mode = if read_now { Mode::Synchronous } else { Mode::Asynchronous };
        // SAFETY: forwarded contract.
        if let Err(error) = unsafe { memcpy(dst, src, size, None, stream, mode, ptds) } {
            fail_idx.set(index);
            return Err(error);
        }
    }
    Ok(())
}

macro_rules! batch_copies {
    ($($name:ident ($($fail_idx:ident)?) => $ptds:literal;)*) => {$(
        #[allow(clippy::too_many_arguments, reason = "the driver's signature")]
        pub unsafe fn $name(
            dsts: *mut CUdeviceptr,
            srcs: *mut CUdeviceptr,
            sizes: *mut usize,
            count: usize,
            attrs: *mut CUmemcpyAttributes,
            attrs_idxs: *mut usize,
            num_attrs: usize,
            $($fail_idx: *mut usize,)?
            h_stream: CUstream,
        ) -> CUresult {
            #[allow(unused_mut, unused_assignments, reason = "only the first version reports the failing copy")]
            let mut fail_idx: *mut usize = std::ptr::null_mut();
            $(fail_idx = $fail_idx;)?
            // SAFETY: the caller's arrays, per the driver API's contract.
            run(|| unsafe { memcpy_batch(dsts, srcs, sizes, count, attrs.cast(), attrs_idxs, num_attrs, fail_idx, h_stream, $ptds) })
        }
    )*};
}

batch_copies! {
    cuMemcpyBatchAsync(fail_idx) => false;
    cuMemcpyBatchAsync_ptsz(fail_idx) => true;
    cuMemcpyBatchAsync_v2() => false;
    cuMemcpyBatchAsync_v2_ptsz() => true;
}

/// `cuMemcpyPeer*`: a device-to-device copy (destroyed or unknown contexts are refused as the
/// driver refuses them), which the client stages through this process when the two devices are
/// GPUs of two servers (a session spread over nodes: `flyt_client::transfer`).
#[expect(clippy::too_many_arguments, reason = "the driver's peer copy, its mode and the stream's resolution")]
fn memcpy_peer(
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    count: usize,
    stream: CUstream,
    mode: Mode,
    ptds: bool,
) -> DriverResult {
    let contexts = &crate::driver::driver().contexts;
    crate::driver::driver().session()?;
    contexts.lookup(dst_ctx)?.usable()?;
    contexts.lookup(src_ctx)?.usable()?;
    // SAFETY: both sides are device memory (checked by `memcpy` as the declared direction); no
    // host buffer is touched.
    unsafe { memcpy(dst, src, count, Some(Direction::DeviceToDevice), stream, mode, ptds) }
}

per_thread_twins! {
    cuMemcpyPeer, cuMemcpyPeer_ptds
        (
            dst_device: CUdeviceptr,
            dst_context: CUcontext,
            src_device: CUdeviceptr,
            src_context: CUcontext,
            byte_count: usize,
        )
        |per_thread| run(|| memcpy_peer(dst_device, dst_context, src_device, src_context, byte_count, std::ptr::null_mut(), Mode::Synchronous, per_thread))
}

per_thread_twins! {
    cuMemcpyPeerAsync, cuMemcpyPeerAsync_ptsz
        (
            dst_device: CUdeviceptr,
            dst_context: CUcontext,
            src_device: CUdeviceptr,
            src_context: CUcontext,
            byte_count: usize,
            h_stream: CUstream,
        )
        |per_thread| run(|| memcpy_peer(dst_device, dst_context, src_device, src_context, byte_count, h_stream, Mode::Asynchronous, per_thread))
}

/// A memset of `n` elements of `width` bytes, each the low `width` bytes of `pattern`. The
/// synchronous forms are asynchronous for device memory but wait when the target is (mapped)
/// pinned host memory, as the driver documents.
fn memset(dst: CUdeviceptr, pattern: u32, width: usize, n: usize, stream: CUstream, synchronous: bool, ptds: bool) -> DriverResult {
    let client = client()?;
    let stream = resolve_stream(client, stream, ptds)?;
    // The driver requires 2- and 4-byte memsets to be aligned to their width.
    if !dst.is_multiple_of(width as u64) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let len = n.checked_mul(width).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)? as u64;
    transfer::memset(client, dst, pattern, width as u8, len, stream).map_err(super::session::driver_error)?;
    if synchronous && len > 0 && !client.is_device_pointer(dst) {
        client.call(req::StreamSynchronize { stream }).map_err(super::session::driver_error)?;
    }
    Ok(())
}

macro_rules! memsets {
    ($($name:ident ($value:ident : $ty:ty $(, $stream:ident)?) => $width:literal, $ptds:literal;)*) => {$(
        pub unsafe fn $name(dst_device: CUdeviceptr, $value: $ty, n: usize $(, $stream: CUstream)?) -> CUresult {
            #[allow(unused_mut, unused_assignments, reason = "the synchronous forms have no stream")]
            let (mut stream, mut synchronous): (CUstream, bool) = (std::ptr::null_mut(), true);
            $((stream, synchronous) = ($stream, false);)?
            run(|| memset(dst_device, u32::from($value), $width, n, stream, synchronous, $ptds))
        }
    )*};
}

memsets! {
    cuMemsetD8_v2(uc: c_uchar) => 1, false;
    cuMemsetD8_v2_ptds(uc: c_uchar) => 1, true;
    cuMemsetD16_v2(us: c_ushort) => 2, false;
    cuMemsetD16_v2_ptds(us: c_ushort) => 2, true;
    cuMemsetD32_v2(ui: c_uint) => 4, false;
    cuMemsetD32_v2_ptds(ui: c_uint) => 4, true;
    cuMemsetD8Async(uc: c_uchar, h_stream) => 1, false;
    cuMemsetD8Async_ptsz(uc: c_uchar, h_stream) => 1, true;
    cuMemsetD16Async(us: c_ushort, h_stream) => 2, false;
    cuMemsetD16Async_ptsz(us: c_ushort, h_stream) => 2, true;
    cuMemsetD32Async(ui: c_uint, h_stream) => 4, false;
    cuMemsetD32Async_ptsz(ui: c_uint, h_stream) => 4, true;
}

fn host_alloc(pp: *mut *mut c_void, bytesize: usize, flags: c_uint) -> DriverResult {
    non_null([pp.cast()])?;
    if flags & !HOST_ALLOC_FLAGS != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // Mapped memory is shared pages when the GPU's server is on this host, mirrored device
    // memory otherwise (`flyt_client::mirrors`).
    let ptr = transfer::host_alloc(client()?, bytesize, flags).map_err(super::session::driver_error)?;
    // SAFETY: checked non-NULL; the caller's out-pointer.
    unsafe { write_out(pp, ptr.cast()) }
}

pub unsafe fn cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, flags: c_uint) -> CUresult {
    run(|| host_alloc(pp, bytesize, flags))
}

pub unsafe fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) -> CUresult {
    run(|| host_alloc(pp, bytesize, 0))
}

pub unsafe fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    run(|| transfer::host_free(client()?, p as usize).map_err(super::session::driver_error))
}

/// `CUpointer_attribute` values answered for pointers the session knows.
mod pointer_attribute {
    pub const CONTEXT: u32 = 1;
    pub const MEMORY_TYPE: u32 = 2;
    pub const DEVICE_POINTER: u32 = 3;
    pub const HOST_POINTER: u32 = 4;
    pub const SYNC_MEMOPS: u32 = 6;
    pub const BUFFER_ID: u32 = 7;
    pub const IS_MANAGED: u32 = 8;
    pub const DEVICE_ORDINAL: u32 = 9;
    pub const IS_LEGACY_CUDA_IPC_CAPABLE: u32 = 10;
    pub const RANGE_START_ADDR: u32 = 11;
    pub const RANGE_SIZE: u32 = 12;
    pub const MAPPED: u32 = 13;
    pub const ALLOWED_HANDLE_TYPES: u32 = 14;
    pub const IS_GPU_DIRECT_RDMA_CAPABLE: u32 = 15;
    pub const ACCESS_FLAGS: u32 = 16;
    pub const MEMPOOL_HANDLE: u32 = 17;
    /// The last attribute driver 580 (CUDA 13.0) knows, `IS_HW_DECOMPRESS_CAPABLE`. Newer
    /// runtimes ask for later ones (CUDA 13.5's `cudaPointerGetAttributes` asks for 22,
    /// `LOCALITY_DOMAIN_ORDINAL`), and take the 13.0 driver's `CUDA_ERROR_INVALID_VALUE` for them
    /// as "not known here" (measured on an H100 with driver 580.159.04).
    pub const LAST_KNOWN: u32 = 21;
}

/// `CU_POINTER_ACCESS_FLAG_READWRITE`.
const ACCESS_READ_WRITE: c_uint = 3;

/// `CU_MEMORYTYPE_HOST` and `CU_MEMORYTYPE_DEVICE`.
const MEMORYTYPE_HOST: c_uint = 1;
const MEMORYTYPE_DEVICE: c_uint = 2;

/// What the session knows of an address.
#[derive(Clone, Copy)]
struct Known {
    start: u64,
    len: u64,
    /// Where it lives: device memory, or pinned or registered host memory.
    device: bool,
    /// Kernels may use it at this same address (device memory, or mapped host memory).
    device_accessible: bool,
    /// Managed memory, with its buffer id.
    managed: Option<u64>,
    /// Memory `cuIpcGetMemHandle` exports (from `cuMemAlloc` or `cuMemAllocPitch`).
    legacy_ipc: bool,
    /// The app's device it lives on (device memory; 0 otherwise).
    ordinal: i32,
}

fn known(client: &Client, ptr: u64) -> Option<Known> {
    if let Some((start, len)) = client.device_range(ptr) {
        let legacy_ipc = client.legacy_ipc_capable(ptr);
        let ordinal = client.device_of(ptr).unwrap_or(0) as i32;
        return Some(Known { start, len, device: true, device_accessible: true, managed: None, legacy_ipc, ordinal });
    }
    if let Some((start, len, buffer_id)) = client.managed().holding(ptr, 1) {
        return Some(Known { start, len, device: true, device_accessible: true, managed: Some(buffer_id), legacy_ipc: false, ordinal: 0 });
    }
    client.host_allocation(ptr as usize).map(|host| Known {
        start: host.start as u64,
        len: host.len as u64,
        device: false,
        device_accessible: host.device_mapped,
        managed: None,
        legacy_ipc: false,
        ordinal: 0,
    })
}

/// Writes one attribute of `ptr` to `data`: from what the session knows of it (`found`), or, for
/// memory it does not know, the zero value `cuPointerGetAttributes` gives (`None` when refused).
///
/// # Safety
/// `data` is non-NULL and points at storage of the attribute's documented type.
unsafe fn write_attribute(
    data: *mut c_void,
    attribute: CUpointer_attribute,
    ptr: CUdeviceptr,
    found: Option<Known>,
    several: bool,
) -> DriverResult {
    use pointer_attribute::*;
    if attribute > LAST_KNOWN {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: per this function's contract, `data` holds the type each arm writes.
    unsafe {
        let Some(Known { start, len, device, device_accessible, managed, legacy_ipc, ordinal }) = found else {
            return match attribute {
                CONTEXT | HOST_POINTER | MEMPOOL_HANDLE => write_out(data.cast::<*mut c_void>(), std::ptr::null_mut()),
                DEVICE_POINTER | RANGE_START_ADDR => write_out(data.cast::<CUdeviceptr>(), 0),
                RANGE_SIZE => write_out(data.cast::<usize>(), 0),
                BUFFER_ID | ALLOWED_HANDLE_TYPES => write_out(data.cast::<u64>(), 0),
                MEMORY_TYPE | IS_MANAGED | MAPPED | IS_LEGACY_CUDA_IPC_CAPABLE | IS_GPU_DIRECT_RDMA_CAPABLE | ACCESS_FLAGS => {
                    write_out(data.cast::<c_uint>(), 0)
                }
                DEVICE_ORDINAL => write_out(data.cast::<i32>(), 0),
                _ => Err(crate::diagnostics::unsupported(&format!("cuPointerGetAttributes attribute {attribute}"))),
            };
        };
        match attribute {
            // The device's primary context unless the current context is on that device.
            CONTEXT => {
                let current = crate::context::current_or_primary()?;
                let context = if current.device() == ordinal { current } else { crate::driver::driver().contexts.primary(ordinal)? };
                write_out(data.cast(), context.handle())
            }
            MEMORY_TYPE => write_out(data.cast::<c_uint>(), if device { MEMORYTYPE_DEVICE } else { MEMORYTYPE_HOST }),
            // Unified addressing: mapped host memory has its host address on the device too.
            DEVICE_POINTER if device_accessible => write_out(data.cast::<CUdeviceptr>(), ptr),
            // Managed memory is reached from both sides at one address.
            HOST_POINTER if !device || managed.is_some() => write_out(data.cast::<*mut c_void>(), ptr as usize as *mut c_void),
            // Device memory has no host address, and host memory the server could not map no
            // device one: as the driver answers for unmapped memory, an error when asked alone
            // and NULL among several (how the runtime's cudaPointerGetAttributes asks).
            DEVICE_POINTER | HOST_POINTER if several => write_out(data.cast::<*mut c_void>(), std::ptr::null_mut()),
            DEVICE_POINTER | HOST_POINTER => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
            IS_MANAGED => write_out(data.cast::<c_uint>(), c_uint::from(managed.is_some())),
            MAPPED => write_out(data.cast::<c_uint>(), 1),
            DEVICE_ORDINAL => write_out(data.cast::<i32>(), ordinal),
            RANGE_START_ADDR => write_out(data.cast::<CUdeviceptr>(), start),
            RANGE_SIZE => write_out(data.cast::<usize>(), len as usize),
            BUFFER_ID if managed.is_some() => write_out(data.cast::<u64>(), managed.unwrap_or_default()),
            // Pinned host blocks live in this process, not in the session's device ranges.
            BUFFER_ID if device => write_out(data.cast::<u64>(), client()?.buffer_id(ptr).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?),
            SYNC_MEMOPS => write_out(data.cast::<c_uint>(), c_uint::from(sync_memops().contains(&start))),
            // CUDA IPC works between sessions on one GPU, for the memory the driver exports;
            // GPUDirect RDMA needs a NIC on the GPU's host, which the app does not drive.
            IS_LEGACY_CUDA_IPC_CAPABLE => write_out(data.cast::<c_uint>(), c_uint::from(legacy_ipc)),
            IS_GPU_DIRECT_RDMA_CAPABLE => write_out(data.cast::<c_uint>(), 0),
            // A pool allocation's: its pool, and the handle types it was made with (shareable
            // pools' allocations are exported with cuMemPoolExportPointer).
            ALLOWED_HANDLE_TYPES | MEMPOOL_HANDLE => {
                let client = session_client()?;
                let pool = if device { client.allocation_pool(start) } else { None };
                match attribute {
                    ALLOWED_HANDLE_TYPES => write_out(data.cast::<u64>(), pool.map_or(0, |pool| u64::from(client.pool_handle_types(pool)))),
                    _ => write_out(
                        data.cast::<*mut c_void>(),
                        pool.map_or(std::ptr::null_mut(), |pool| super::pools::pool_handle(pool).cast()),
                    ),
                }
            }
            ACCESS_FLAGS => write_out(data.cast::<c_uint>(), ACCESS_READ_WRITE),
            _ => Err(crate::diagnostics::unsupported(&format!("cuPointerGetAttribute attribute {attribute}"))),
        }
    }
}

/// Allocations (by start) whose `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS` the app set.
fn sync_memops() -> std::sync::MutexGuard<'static, std::collections::BTreeSet<u64>> {
    static SET: std::sync::Mutex<std::collections::BTreeSet<u64>> = std::sync::Mutex::new(std::collections::BTreeSet::new());
    SET.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS`, the one attribute that can be set: Flyt's synchronous
/// copies and memsets always wait for their work, so the setting is recorded and read back.
pub unsafe fn cuPointerSetAttribute(value: *const c_void, attribute: CUpointer_attribute, ptr: CUdeviceptr) -> CUresult {
    run(|| {
        non_null([value.cast()])?;
        let found = known(session_client()?, ptr).filter(|found| found.device).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        if attribute != pointer_attribute::SYNC_MEMOPS {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: checked non-NULL; for this attribute the value is an unsigned int (a boolean).
        let set = unsafe { value.cast::<c_uint>().read_unaligned() } != 0;
        if set {
            sync_memops().insert(found.start);
        } else {
            sync_memops().remove(&found.start);
        }
        Ok(())
    })
}

pub unsafe fn cuPointerGetAttribute(data: *mut c_void, attribute: CUpointer_attribute, ptr: CUdeviceptr) -> CUresult {
    run(|| {
        non_null([data.cast()])?;
        let client = session_client()?;
        // Memory the session does not know is not CUDA memory: invalid value, as the driver says.
        let found = known(client, ptr).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: `data` is non-NULL and, per the driver API's contract, of the attribute's type.
        unsafe { write_attribute(data, attribute, ptr, Some(found), false) }
    })
}

/// Several attributes at once. Unlike the single query, memory the session does not know is no
/// error: its attributes get zero values, as the driver documents.
pub unsafe fn cuPointerGetAttributes(
    num_attributes: c_uint,
    attributes: *mut CUpointer_attribute,
    data: *mut *mut c_void,
    ptr: CUdeviceptr,
) -> CUresult {
    run(|| {
        if num_attributes == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        non_null([attributes.cast(), data.cast()])?;
        let found = known(session_client()?, ptr);
        for index in 0..num_attributes as usize {
            // SAFETY: both arrays have `num_attributes` entries (the driver API's contract).
            let (attribute, slot) = unsafe { (*attributes.add(index), *data.add(index)) };
            non_null([slot.cast()])?;
            // SAFETY: each slot holds the type of its attribute (the driver API's contract).
            unsafe { write_attribute(slot, attribute, ptr, found, true) }?;
        }
        Ok(())
    })
}

/// The allocation holding `dptr`, as the session knows it: answered in the process.
pub unsafe fn cuMemGetAddressRange_v2(pbase: *mut CUdeviceptr, psize: *mut usize, dptr: CUdeviceptr) -> CUresult {
    run(|| {
        let client = client()?;
        let managed = || client.managed().holding(dptr, 1).map(|(start, len, _)| (start, len));
        let (start, len) = client.device_range(dptr).or_else(managed).ok_or(CUresult::CUDA_ERROR_NOT_FOUND)?;
        // Either out-pointer may be NULL: the caller wants only the other.
        if !pbase.is_null() {
            // SAFETY: non-NULL; the caller's out-pointer.
            unsafe { pbase.write(start) };
        }
        if !psize.is_null() {
            // SAFETY: non-NULL; the caller's out-pointer.
            unsafe { psize.write(len as usize) };
        }
        Ok(())
    })
}

/// `CU_MEMHOSTREGISTER_PORTABLE | DEVICEMAP | IOMEMORY | READ_ONLY`.
const HOST_REGISTER_FLAGS: c_uint = 0xf;

/// Registers the app's memory (see `flyt_client::transfer::host_register`): for copies, and
/// mapped for kernels (`DEVICEMAP`) where the server can map it too. What cannot be mapped, and
/// I/O memory (another device's registers, which need the GPU in this process), is refused with
/// one line.
fn host_register(symbol: &str, p: *mut c_void, bytesize: usize, flags: c_uint) -> DriverResult {
    if p.is_null() || bytesize == 0 || flags & !HOST_REGISTER_FLAGS != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let refuse = |what: &str, why: &str| {
        let line = format!("flyt: {symbol} with {what} is not supported through Flyt: {why} (returning CUDA_ERROR_NOT_SUPPORTED)");
        crate::diagnostics::once(&format!("{symbol} {what} {why}"), &line);
        Err(CUresult::CUDA_ERROR_NOT_SUPPORTED)
    };
    if flags & 0x4 != 0 {
        return refuse("CU_MEMHOSTREGISTER_IOMEMORY", "I/O memory needs the GPU in this process");
    }
    match transfer::host_register(client()?, p as usize, bytesize, flags) {
        Ok(()) => Ok(()),
        Err(Unmappable::Refused(why)) => refuse("CU_MEMHOSTREGISTER_DEVICEMAP", why),
        Err(Unmappable::Cuda(error)) => Err(super::session::driver_error(error)),
    }
}

pub unsafe fn cuMemHostRegister(p: *mut c_void, bytesize: usize, flags: c_uint) -> CUresult {
    run(|| host_register("cuMemHostRegister", p, bytesize, flags))
}

pub unsafe fn cuMemHostRegister_v2(p: *mut c_void, bytesize: usize, flags: c_uint) -> CUresult {
    run(|| host_register("cuMemHostRegister", p, bytesize, flags))
}

pub unsafe fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    run(|| {
        non_null([p.cast()])?;
        transfer::host_unregister(client()?, p as usize).map_err(super::session::driver_error)
    })
}

/// The flags pinned or registered host memory was made with.
pub unsafe fn cuMemHostGetFlags(p_flags: *mut c_uint, p: *mut c_void) -> CUresult {
    run(|| {
        non_null([p_flags.cast()])?;
        // Managed memory is no pinned host memory, whatever it is made of here.
        let host = client()?.host_allocation(p as usize).filter(|host| !host.managed).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let flags = host.flags;
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(p_flags, flags) }
    })
}

/// The device address of mapped host memory: under unified addressing its host address. Host
/// memory the server could not map, and memory that is not pinned host memory, have none.
fn host_device_pointer(pdptr: *mut CUdeviceptr, p: *mut c_void, flags: c_uint) -> DriverResult {
    non_null([pdptr.cast()])?;
    if flags != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let host = client()?.host_allocation(p as usize).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if !host.device_mapped || host.managed {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: checked non-NULL; the caller's out-pointer.
    unsafe { write_out(pdptr, p as CUdeviceptr) }
}

pub unsafe fn cuMemHostGetDevicePointer_v2(pdptr: *mut CUdeviceptr, p: *mut c_void, flags: c_uint) -> CUresult {
    run(|| host_device_pointer(pdptr, p, flags))
}
