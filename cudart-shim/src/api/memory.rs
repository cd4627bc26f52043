//! Memory: allocations, copies in every direction, memsets, symbols and pointer attributes,
//! through the driver, which knows the app's device ranges (a bad pointer is refused at once,
//! never a device fault) and carries copies over the socket or the shared-memory channel. What
//! stays here is the runtime's: copy kinds checked against what the pointers are, the flags the
//! runtime names, and registered symbols.

use std::ffi::{c_int, c_uint, c_void};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;

use crate::driver::{CUDA_MEMCPY2D, CUarray, CUdeviceptr, MEMORYTYPE_ARRAY, MEMORYTYPE_UNIFIED, cu_ctx};
use crate::ffi::{cudaMemcpyKind, cudaStream_t, write_out};
use crate::props::{cudaPointerAttributes, memory_type};
use crate::registry::variable_by_host;

const HOST_TO_HOST: cudaMemcpyKind = 0;
const HOST_TO_DEVICE: cudaMemcpyKind = 1;
const DEVICE_TO_HOST: cudaMemcpyKind = 2;
const DEVICE_TO_DEVICE: cudaMemcpyKind = 3;
pub(super) const DEFAULT: cudaMemcpyKind = 4;
/// `cudaHostAllocPortable | Mapped | WriteCombined`.
const HOST_ALLOC_FLAGS: c_uint = 0x7;
/// `cudaHostRegisterPortable | Mapped | IoMemory | ReadOnly`.
const HOST_REGISTER_FLAGS: c_uint = 0xf;
/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE` and `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`.
const POINTER_MEMORY_TYPE: c_int = 2;
const POINTER_DEVICE_ORDINAL: c_int = 9;
/// `CU_POINTER_ATTRIBUTE_DEVICE_POINTER` and `CU_POINTER_ATTRIBUTE_IS_MANAGED`.
const POINTER_DEVICE_POINTER: c_int = 3;
const POINTER_IS_MANAGED: c_int = 8;
/// `CU_MEMORYTYPE_HOST` and `CU_MEMORYTYPE_DEVICE`.
const MEMORYTYPE_HOST: c_uint = 1;
const MEMORYTYPE_DEVICE: c_uint = 2;

/// Whether a copy or memset returns once done, or is queued on its stream.
#[derive(Clone, Copy)]
pub(super) enum Mode {
    Synchronous,
    Asynchronous,
}

pub unsafe fn cudaMalloc(dev_ptr: *mut *mut c_void, size: usize) -> CudaResult<()> {
    if dev_ptr.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    // An empty allocation is NULL and success, as CUDA answers.
    let mut ptr: CUdeviceptr = 0;
    if size > 0 {
        cu_ctx!(cuMemAlloc_v2(&mut ptr, size))?;
    } else {
        crate::driver::ensure_context()?;
    }
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(dev_ptr, ptr as usize as *mut c_void) }
}

pub unsafe fn cudaFree(dev_ptr: *mut c_void) -> CudaResult<()> {
    // `cudaFree(0)` is how apps make the runtime set up its context: it does, and succeeds.
    crate::driver::ensure_context()?;
    if dev_ptr.is_null() {
        return Ok(());
    }
    cu_ctx!(cuMemFree_v2(dev_ptr as CUdeviceptr))
}

fn host_alloc(out: *mut *mut c_void, size: usize, flags: c_uint) -> CudaResult<()> {
    if out.is_null() || flags & !HOST_ALLOC_FLAGS != 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    let mut ptr: *mut c_void = std::ptr::null_mut();
    cu_ctx!(cuMemHostAlloc(&mut ptr, size, flags))?;
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(out, ptr) }
}

pub unsafe fn cudaMallocHost(ptr: *mut *mut c_void, size: usize) -> CudaResult<()> {
    host_alloc(ptr, size, 0)
}

/// Mapped memory (`cudaHostAllocMapped`) is had where the driver can map it (the GPU's server on
/// this host) and refused with the driver's one line elsewhere. Write-combined memory is only a
/// host-side hint, and portable is what all of Flyt's pinned memory is.
pub unsafe fn cudaHostAlloc(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> CudaResult<()> {
    host_alloc(ptr, size, flags)
}

/// The device address of mapped host memory (under unified addressing, its host address).
pub unsafe fn cudaHostGetDevicePointer(device: *mut *mut c_void, host: *mut c_void, flags: c_uint) -> CudaResult<()> {
    if device.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let mut address: CUdeviceptr = 0;
    cu_ctx!(cuMemHostGetDevicePointer_v2(&mut address, host, flags))?;
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(device, address as *mut c_void) }
}

pub unsafe fn cudaFreeHost(ptr: *mut c_void) -> CudaResult<()> {
    if ptr.is_null() {
        return Ok(());
    }
    cu_ctx!(cuMemFreeHost(ptr))
}

/// Registers the app's memory, as the driver API does it (`cuMemHostRegister`: mapped only where
/// the server can map it too, refused with the reason otherwise).
pub unsafe fn cudaHostRegister(ptr: *mut c_void, size: usize, flags: c_uint) -> CudaResult<()> {
    if ptr.is_null() || size == 0 || flags & !HOST_REGISTER_FLAGS != 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    // I/O memory (another device's registers) needs the GPU in this process.
    if flags & 0x4 != 0 {
        return Err(super::unsupported_use("cudaHostRegister", "cudaHostRegisterIoMemory"));
    }
    cu_ctx!(cuMemHostRegister_v2(ptr, size, flags))
}

pub unsafe fn cudaHostUnregister(ptr: *mut c_void) -> CudaResult<()> {
    if ptr.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    cu_ctx!(cuMemHostUnregister(ptr))
}

pub unsafe fn cudaHostGetFlags(flags: *mut c_uint, ptr: *mut c_void) -> CudaResult<()> {
    let mut value = 0;
    cu_ctx!(cuMemHostGetFlags(&mut value, ptr))?;
    // SAFETY: the app's out-pointer.
    unsafe { write_out(flags, value) }
}

/// The driver's memory type of `ptr` (`CU_MEMORYTYPE_*`), or 0 for memory it does not know.
fn memory_type_of(ptr: u64) -> c_uint {
    let mut value: c_uint = 0;
    let data = std::ptr::from_mut(&mut value).cast::<c_void>();
    cu_ctx!(cuPointerGetAttribute(data, POINTER_MEMORY_TYPE.cast_unsigned(), ptr)).map_or(0, |()| value)
}

/// Checks a copy's declared kind. Pointers the driver knows as device memory are device memory
/// whatever the kind says (as with unified addressing: the driver copies by what the pointers
/// are), but a side the kind declares as device memory must be device memory.
fn check_kind(dst: u64, src: u64, kind: cudaMemcpyKind) -> CudaResult<()> {
    check_sides(Some(dst), Some(src), kind)
}

/// [`check_kind`] for copies that may have a CUDA array on either side (`None`): an array is
/// device memory whatever the kind says, as CUDA corrects such a kind silently.
pub(super) fn check_sides(dst: Option<u64>, src: Option<u64>, kind: cudaMemcpyKind) -> CudaResult<()> {
    let device = |ptr: Option<u64>| ptr.is_none_or(|ptr| memory_type_of(ptr) == MEMORYTYPE_DEVICE);
    let ok = match kind {
        DEFAULT | HOST_TO_HOST => true,
        HOST_TO_DEVICE => device(dst),
        DEVICE_TO_HOST => device(src),
        DEVICE_TO_DEVICE => device(dst) && device(src),
        _ => return Err(CudaError::INVALID_MEMCPY_DIRECTION),
    };
    if ok { Ok(()) } else { Err(CudaError::INVALID_VALUE) }
}

fn memcpy(
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
    mode: Mode,
    per_thread: bool,
) -> CudaResult<()> {
    if count == 0 {
        return Ok(());
    }
    if dst.is_null() || src.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let (dst, src) = (dst as u64, src as u64);
    check_kind(dst, src, kind)?;
    match (mode, per_thread) {
        (Mode::Synchronous, false) => cu_ctx!(cuMemcpy(dst, src, count)),
        (Mode::Synchronous, true) => cu_ctx!(cuMemcpy_ptds(dst, src, count)),
        (Mode::Asynchronous, false) => cu_ctx!(cuMemcpyAsync(dst, src, count, stream.cast())),
        (Mode::Asynchronous, true) => cu_ctx!(cuMemcpyAsync_ptsz(dst, src, count, stream.cast())),
    }
}

/// A pitched copy: checked as `cudaMemcpy` checks its kind, then described to the driver with both
/// sides unified (the driver goes by the pointers, as for 1D copies).
#[allow(clippy::too_many_arguments, reason = "cudaMemcpy2D's parameters")]
fn memcpy_2d(
    dst: *mut c_void,
    dpitch: usize,
    src: *const c_void,
    spitch: usize,
    width: usize,
    height: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
    mode: Mode,
    per_thread: bool,
) -> CudaResult<()> {
    if width == 0 || height == 0 {
        return Ok(());
    }
    if dst.is_null() || src.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    if height > 1 && (dpitch < width || spitch < width) {
        return Err(CudaError::INVALID_PITCH_VALUE);
    }
    check_kind(dst as u64, src as u64, kind)?;
    let (dst, src) = (Side2D::Memory { ptr: dst as u64, pitch: dpitch }, Side2D::Memory { ptr: src as u64, pitch: spitch });
    copy_2d(&describe_2d(dst, (0, 0), src, (0, 0), width, height), stream, mode, per_thread)
}

/// One side of a pitched copy: memory the driver tells by its pointer, or a CUDA array.
#[derive(Clone, Copy)]
pub(super) enum Side2D {
    Memory { ptr: u64, pitch: usize },
    Array(CUarray),
}

/// The driver's description of a pitched copy of `height` rows of `width` bytes, each side from
/// its `(x in bytes, y in rows)`.
pub(super) fn describe_2d(
    dst: Side2D,
    dst_at: (usize, usize),
    src: Side2D,
    src_at: (usize, usize),
    width: usize,
    height: usize,
) -> CUDA_MEMCPY2D {
    let (src_memory_type, src_device, src_array, src_pitch) = match src {
        Side2D::Memory { ptr, pitch } => (MEMORYTYPE_UNIFIED, ptr, std::ptr::null_mut(), pitch),
        Side2D::Array(array) => (MEMORYTYPE_ARRAY, 0, array, 0),
    };
    let (dst_memory_type, dst_device, dst_array, dst_pitch) = match dst {
        Side2D::Memory { ptr, pitch } => (MEMORYTYPE_UNIFIED, ptr, std::ptr::null_mut(), pitch),
        Side2D::Array(array) => (MEMORYTYPE_ARRAY, 0, array, 0),
    };
    CUDA_MEMCPY2D {
        srcXInBytes: src_at.0,
        srcY: src_at.1,
        srcMemoryType: src_memory_type,
        srcHost: std::ptr::null(),
        srcDevice: src_device,
        srcArray: src_array.cast(),
        srcPitch: src_pitch,
        dstXInBytes: dst_at.0,
        dstY: dst_at.1,
        dstMemoryType: dst_memory_type,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst_device,
        dstArray: dst_array.cast(),
        dstPitch: dst_pitch,
        WidthInBytes: width,
        Height: height,
    }
}

/// Runs a described pitched copy.
pub(super) fn copy_2d(copy: &CUDA_MEMCPY2D, stream: cudaStream_t, mode: Mode, per_thread: bool) -> CudaResult<()> {
    match (mode, per_thread) {
        (Mode::Synchronous, false) => cu_ctx!(cuMemcpy2DUnaligned_v2(copy)),
        (Mode::Synchronous, true) => cu_ctx!(cuMemcpy2DUnaligned_v2_ptds(copy)),
        (Mode::Asynchronous, false) => cu_ctx!(cuMemcpy2DAsync_v2(copy, stream.cast())),
        (Mode::Asynchronous, true) => cu_ctx!(cuMemcpy2DAsync_v2_ptsz(copy, stream.cast())),
    }
}

stream_entry_points! {
    [cudaMemcpy2D, cudaMemcpy2D_ptds, cudaMemcpy2DAsync, cudaMemcpy2DAsync_ptsz]
    (dst: *mut c_void, dpitch: usize, src: *const c_void, spitch: usize, width: usize, height: usize, kind: cudaMemcpyKind)
    |stream, mode, per_thread| memcpy_2d(dst, dpitch, src, spitch, width, height, kind, stream, mode, per_thread)
}

stream_entry_points! {
    [cudaMemcpy, cudaMemcpy_ptds, cudaMemcpyAsync, cudaMemcpyAsync_ptsz]
    (dst: *mut c_void, src: *const c_void, count: usize, kind: cudaMemcpyKind)
    |stream, mode, per_thread| memcpy(dst, src, count, kind, stream, mode, per_thread)
}

/// `cudaMemset` writes the low byte of `value`, as CUDA does.
fn memset(dev_ptr: *mut c_void, value: c_int, count: usize, stream: cudaStream_t, mode: Mode, per_thread: bool) -> CudaResult<()> {
    if count == 0 {
        return Ok(());
    }
    let (dst, byte) = (dev_ptr as CUdeviceptr, value as u8);
    match (mode, per_thread) {
        (Mode::Synchronous, false) => cu_ctx!(cuMemsetD8_v2(dst, byte, count)),
        (Mode::Synchronous, true) => cu_ctx!(cuMemsetD8_v2_ptds(dst, byte, count)),
        (Mode::Asynchronous, false) => cu_ctx!(cuMemsetD8Async(dst, byte, count, stream.cast())),
        (Mode::Asynchronous, true) => cu_ctx!(cuMemsetD8Async_ptsz(dst, byte, count, stream.cast())),
    }
}

stream_entry_points! {
    [cudaMemset, cudaMemset_ptds, cudaMemsetAsync, cudaMemsetAsync_ptsz]
    (dev_ptr: *mut c_void, value: c_int, count: usize)
    |stream, mode, per_thread| memset(dev_ptr, value, count, stream, mode, per_thread)
}

/// A symbol's device address plus `offset`, with `count` bytes checked against its size.
pub(super) fn symbol_address(symbol: *const c_void, count: usize, offset: usize) -> CudaResult<u64> {
    let variable = variable_by_host(symbol as usize).ok_or(CudaError::INVALID_SYMBOL)?;
    let end = offset.checked_add(count).ok_or(CudaError::INVALID_VALUE)?;
    if end > variable.size {
        return Err(CudaError::INVALID_VALUE);
    }
    Ok(variable.address()? + offset as u64)
}

/// The directions a copy to (`to_symbol`) or from a `__device__` variable may take.
pub(super) fn symbol_direction(to_symbol: bool, kind: cudaMemcpyKind) -> CudaResult<()> {
    let allowed = if to_symbol { HOST_TO_DEVICE } else { DEVICE_TO_HOST };
    if kind == allowed || matches!(kind, DEVICE_TO_DEVICE | DEFAULT) { Ok(()) } else { Err(CudaError::INVALID_MEMCPY_DIRECTION) }
}

/// A copy of `count` bytes between a `__device__` variable (from `offset`) and `other`, to the
/// variable (`to_symbol`) or from it.
#[expect(clippy::too_many_arguments, reason = "the widest CUDA symbol-copy signature plus its direction")]
fn memcpy_symbol(
    to_symbol: bool,
    symbol: *const c_void,
    other: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
    mode: Mode,
    per_thread: bool,
) -> CudaResult<()> {
    symbol_direction(to_symbol, kind)?;
    let address = symbol_address(symbol, count, offset)? as usize as *const c_void;
    let (dst, src) = if to_symbol { (address, other) } else { (other, address) };
    memcpy(dst.cast_mut(), src, count, kind, stream, mode, per_thread)
}

stream_entry_points! {
    [cudaMemcpyToSymbol, cudaMemcpyToSymbol_ptds, cudaMemcpyToSymbolAsync, cudaMemcpyToSymbolAsync_ptsz]
    (symbol: *const c_void, src: *const c_void, count: usize, offset: usize, kind: cudaMemcpyKind)
    |stream, mode, per_thread| memcpy_symbol(true, symbol, src, count, offset, kind, stream, mode, per_thread)
}

stream_entry_points! {
    [cudaMemcpyFromSymbol, cudaMemcpyFromSymbol_ptds, cudaMemcpyFromSymbolAsync, cudaMemcpyFromSymbolAsync_ptsz]
    (dst: *mut c_void, symbol: *const c_void, count: usize, offset: usize, kind: cudaMemcpyKind)
    |stream, mode, per_thread| memcpy_symbol(false, symbol, dst, count, offset, kind, stream, mode, per_thread)
}

pub unsafe fn cudaGetSymbolAddress(dev_ptr: *mut *mut c_void, symbol: *const c_void) -> CudaResult<()> {
    let address = symbol_address(symbol, 0, 0)?;
    // SAFETY: the app's out-pointer.
    unsafe { write_out(dev_ptr, address as usize as *mut c_void) }
}

pub unsafe fn cudaGetSymbolSize(size: *mut usize, symbol: *const c_void) -> CudaResult<()> {
    let variable = variable_by_host(symbol as usize).ok_or(CudaError::INVALID_SYMBOL)?;
    // SAFETY: the app's out-pointer.
    unsafe { write_out(size, variable.size) }
}

pub unsafe fn cudaPointerGetAttributes(attributes: *mut cudaPointerAttributes, ptr: *const c_void) -> CudaResult<()> {
    if attributes.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let mut value = cudaPointerAttributes {
        memory_type: memory_type::UNREGISTERED,
        device: -2,
        devicePointer: std::ptr::null_mut(),
        hostPointer: ptr.cast_mut(),
        reserved: [0; 8],
    };
    let kind = memory_type_of(ptr as u64);
    if kind == MEMORYTYPE_DEVICE || kind == MEMORYTYPE_HOST {
        let mut device: c_int = 0;
        let data = std::ptr::from_mut(&mut device).cast::<c_void>();
        cu_ctx!(cuPointerGetAttribute(data, POINTER_DEVICE_ORDINAL.cast_unsigned(), ptr as u64))?;
        value.device = device;
        if kind == MEMORYTYPE_DEVICE {
            // Managed memory (device memory to the driver) is reached from both sides at one
            // address.
            let mut managed: c_uint = 0;
            let data = std::ptr::from_mut(&mut managed).cast::<c_void>();
            cu_ctx!(cuPointerGetAttribute(data, POINTER_IS_MANAGED.cast_unsigned(), ptr as u64))?;
            value.devicePointer = ptr.cast_mut();
            if managed != 0 {
                value.memory_type = memory_type::MANAGED;
            } else {
                value.memory_type = memory_type::DEVICE;
                value.hostPointer = std::ptr::null_mut();
            }
        } else {
            // Pinned memory: kernels use it at its host address where the driver could map it
            // (no device pointer means the GPU reaches it only through copies).
            value.memory_type = memory_type::HOST;
            let mut device_pointer: CUdeviceptr = 0;
            let data = std::ptr::from_mut(&mut device_pointer).cast::<c_void>();
            if cu_ctx!(cuPointerGetAttribute(data, POINTER_DEVICE_POINTER.cast_unsigned(), ptr as u64)).is_ok() {
                value.devicePointer = device_pointer as *mut c_void;
            }
        }
    }
    // Unregistered host memory: success with type unregistered, as CUDA 11+ answers.
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(attributes, value) }
}
