//! Memory: allocations, copies in every direction, memsets, symbols and pointer attributes.
//!
//! Device pointers are the server's real device addresses; the shim keeps the app's ranges so
//! it can refuse a bad pointer at once (`cudaErrorInvalidValue`, never a device fault), tell
//! host from device pointers for `cudaMemcpyDefault`, and answer `cudaPointerGetAttributes`.
//! Copies larger than the server's chunk travel as several frames, so a large copy never holds
//! up another thread's small calls for more than a chunk.

use std::ffi::{c_int, c_uint, c_void};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::req;

use super::call;
use super::streams::stream_id;
use crate::client::{Client, HostAllocation, client};
use crate::ffi::{cudaMemcpyKind, cudaStream_t, write_out};
use crate::props::{cudaPointerAttributes, memory_type};
use crate::registry::variable_by_host;
use crate::transfer::{self, Direction, Mode};

const HOST_TO_HOST: cudaMemcpyKind = 0;
const HOST_TO_DEVICE: cudaMemcpyKind = 1;
const DEVICE_TO_HOST: cudaMemcpyKind = 2;
const DEVICE_TO_DEVICE: cudaMemcpyKind = 3;
const DEFAULT: cudaMemcpyKind = 4;
/// `cudaHostAllocPortable | Mapped | WriteCombined`.
const HOST_ALLOC_FLAGS: c_uint = 0x7;

pub unsafe fn cudaMalloc(dev_ptr: *mut *mut c_void, size: usize) -> CudaResult<()> {
    if dev_ptr.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let client = client()?;
    let ptr = call(client, req::Malloc { size: size as u64 })?.ptr;
    if ptr != 0 {
        client.add_device_range(ptr, size as u64, true);
    }
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(dev_ptr, ptr as usize as *mut c_void) }
}

pub unsafe fn cudaFree(dev_ptr: *mut c_void) -> CudaResult<()> {
    let client = client()?;
    if dev_ptr.is_null() {
        return Ok(());
    }
    let ptr = dev_ptr as u64;
    client.remove_allocation(ptr)?;
    call(client, req::Free { ptr }).map(|_| ())
}

fn host_alloc(out: *mut *mut c_void, size: usize, flags: c_uint) -> CudaResult<()> {
    if out.is_null() || flags & !HOST_ALLOC_FLAGS != 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    let ptr = transfer::host_alloc(client()?, size, flags)?;
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(out, ptr.cast()) }
}

pub unsafe fn cudaMallocHost(ptr: *mut *mut c_void, size: usize) -> CudaResult<()> {
    host_alloc(ptr, size, 0)
}

pub unsafe fn cudaHostAlloc(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> CudaResult<()> {
    // Mapped memory would be host memory kernels dereference: the GPU is elsewhere, so refuse it
    // at the call (write-combined memory is only a host-side hint, and portable is what all of
    // Flyt's pinned memory is).
    if flags & 0x2 != 0 && flags & !HOST_ALLOC_FLAGS == 0 {
        return Err(super::unsupported_use("cudaHostAlloc", "cudaHostAllocMapped"));
    }
    host_alloc(ptr, size, flags)
}

pub unsafe fn cudaFreeHost(ptr: *mut c_void) -> CudaResult<()> {
    if ptr.is_null() {
        return Ok(());
    }
    transfer::host_free(client()?, ptr as usize)
}

/// `cudaHostRegisterPortable | Mapped | IoMemory | ReadOnly`.
const HOST_REGISTER_FLAGS: c_uint = 0xf;

/// Registers the app's memory. The GPU is on another machine or process, so nothing is pinned
/// for it: the range is remembered as registered host memory (so `cudaPointerGetAttributes`
/// and `cudaHostGetFlags` answer as CUDA does) and copies from or to it go through the channel
/// like any host memory. Kernels cannot dereference it.
pub unsafe fn cudaHostRegister(ptr: *mut c_void, size: usize, flags: c_uint) -> CudaResult<()> {
    if ptr.is_null() || size == 0 || flags & !HOST_REGISTER_FLAGS != 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    // Mapped (kernels dereference it) and I/O memory (another device's registers) need the GPU
    // in this process; read-only and portable hold for copies as they are.
    for (flag, name) in [(0x2, "cudaHostRegisterMapped"), (0x4, "cudaHostRegisterIoMemory")] {
        if flags & flag != 0 {
            return Err(super::unsupported_use("cudaHostRegister", name));
        }
    }
    let client = client()?;
    let start = ptr as usize;
    let end = start.checked_add(size).ok_or(CudaError::INVALID_VALUE)?;
    let mut allocations = client.host_allocations.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let overlaps = allocations.range(..end).next_back().is_some_and(|(begin, allocation)| begin + allocation.len > start);
    if overlaps {
        return Err(CudaError::HOST_MEMORY_ALREADY_REGISTERED);
    }
    allocations.insert(start, HostAllocation { len: size, flags, segment_offset: None, registered: true });
    Ok(())
}

pub unsafe fn cudaHostUnregister(ptr: *mut c_void) -> CudaResult<()> {
    if ptr.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let client = client()?;
    let mut allocations = client.host_allocations.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    match allocations.get(&(ptr as usize)) {
        Some(allocation) if allocation.registered => {
            allocations.remove(&(ptr as usize));
            Ok(())
        }
        _ => Err(CudaError::HOST_MEMORY_NOT_REGISTERED),
    }
}

pub unsafe fn cudaHostGetFlags(flags: *mut c_uint, ptr: *mut c_void) -> CudaResult<()> {
    let client = client()?;
    let (_, _, found) = client.host_allocation(ptr as usize).ok_or(CudaError::INVALID_VALUE)?;
    // SAFETY: the app's out-pointer.
    unsafe { write_out(flags, found) }
}

/// Classifies a copy. Pointers the session knows as device memory are device memory whatever
/// the declared kind says (as with unified addressing), so a device address is never read or
/// written as host memory.
fn direction(client: &Client, dst: u64, src: u64, kind: cudaMemcpyKind) -> CudaResult<Direction> {
    let direction = transfer::classify(client, dst, src);
    let (dst_device, src_device) = match direction {
        Direction::HostToHost => (false, false),
        Direction::HostToDevice => (true, false),
        Direction::DeviceToHost => (false, true),
        Direction::DeviceToDevice => (true, true),
    };
    match kind {
        DEFAULT | HOST_TO_HOST => Ok(direction),
        // A declared device side that is not device memory is a bad pointer.
        HOST_TO_DEVICE | DEVICE_TO_DEVICE if !dst_device => Err(CudaError::INVALID_VALUE),
        DEVICE_TO_HOST | DEVICE_TO_DEVICE if !src_device => Err(CudaError::INVALID_VALUE),
        HOST_TO_DEVICE | DEVICE_TO_HOST | DEVICE_TO_DEVICE => Ok(direction),
        _ => Err(CudaError::INVALID_MEMCPY_DIRECTION),
    }
}

/// Any copy, once the stream is resolved.
///
/// # Safety
/// As `transfer::copy`.
unsafe fn copy(
    client: &Client,
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: cudaMemcpyKind,
    stream: u64,
    mode: Mode,
) -> CudaResult<()> {
    if count == 0 {
        return Ok(());
    }
    if dst.is_null() || src.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let direction = direction(client, dst as u64, src as u64, kind)?;
    let sync = |stream| call(client, req::StreamSynchronize { stream }).map(|_| ());
    // SAFETY: forwarded contract.
    unsafe { transfer::copy(client, dst, src, count, direction, stream, mode, &sync) }
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
    let client = client()?;
    let stream = stream_id(client, stream, per_thread)?;
    // SAFETY: the caller's buffers, per the CUDA contract of the export that called us.
    unsafe { copy(client, dst, src, count, kind, stream, mode) }
}

pub unsafe fn cudaMemcpy(dst: *mut c_void, src: *const c_void, count: usize, kind: cudaMemcpyKind) -> CudaResult<()> {
    memcpy(dst, src, count, kind, std::ptr::null_mut(), Mode::Synchronous, false)
}

pub unsafe fn cudaMemcpy_ptds(dst: *mut c_void, src: *const c_void, count: usize, kind: cudaMemcpyKind) -> CudaResult<()> {
    memcpy(dst, src, count, kind, std::ptr::null_mut(), Mode::Synchronous, true)
}

pub unsafe fn cudaMemcpyAsync(
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
) -> CudaResult<()> {
    memcpy(dst, src, count, kind, stream, Mode::Asynchronous, false)
}

pub unsafe fn cudaMemcpyAsync_ptsz(
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
) -> CudaResult<()> {
    memcpy(dst, src, count, kind, stream, Mode::Asynchronous, true)
}

fn memset(dev_ptr: *mut c_void, value: c_int, count: usize, stream: cudaStream_t, per_thread: bool) -> CudaResult<()> {
    let client = client()?;
    let stream = stream_id(client, stream, per_thread)?;
    if count == 0 {
        return Ok(());
    }
    // cudaMemset writes the low byte of `value`, as CUDA does.
    transfer::memset(client, dev_ptr as u64, value as u8, count as u64, stream)
}

pub unsafe fn cudaMemset(dev_ptr: *mut c_void, value: c_int, count: usize) -> CudaResult<()> {
    memset(dev_ptr, value, count, std::ptr::null_mut(), false)
}

pub unsafe fn cudaMemset_ptds(dev_ptr: *mut c_void, value: c_int, count: usize) -> CudaResult<()> {
    memset(dev_ptr, value, count, std::ptr::null_mut(), true)
}

pub unsafe fn cudaMemsetAsync(dev_ptr: *mut c_void, value: c_int, count: usize, stream: cudaStream_t) -> CudaResult<()> {
    memset(dev_ptr, value, count, stream, false)
}

pub unsafe fn cudaMemsetAsync_ptsz(dev_ptr: *mut c_void, value: c_int, count: usize, stream: cudaStream_t) -> CudaResult<()> {
    memset(dev_ptr, value, count, stream, true)
}

/// A symbol's device address plus `offset`, with `count` bytes checked against its size.
fn symbol_address(symbol: *const c_void, count: usize, offset: usize) -> CudaResult<u64> {
    let variable = variable_by_host(symbol as usize).ok_or(CudaError::INVALID_SYMBOL)?;
    let end = offset.checked_add(count).ok_or(CudaError::INVALID_VALUE)?;
    if end > variable.size {
        return Err(CudaError::INVALID_VALUE);
    }
    Ok(client()?.variable_address(&variable)? + offset as u64)
}

#[expect(clippy::too_many_arguments, reason = "mirrors the widest CUDA symbol-copy signature")]
fn to_symbol(
    symbol: *const c_void,
    src: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
    mode: Mode,
    per_thread: bool,
) -> CudaResult<()> {
    if !matches!(kind, HOST_TO_DEVICE | DEVICE_TO_DEVICE | DEFAULT) {
        return Err(CudaError::INVALID_MEMCPY_DIRECTION);
    }
    let address = symbol_address(symbol, count, offset)?;
    memcpy(address as usize as *mut c_void, src, count, kind, stream, mode, per_thread)
}

#[expect(clippy::too_many_arguments, reason = "mirrors the widest CUDA symbol-copy signature")]
fn from_symbol(
    dst: *mut c_void,
    symbol: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
    mode: Mode,
    per_thread: bool,
) -> CudaResult<()> {
    if !matches!(kind, DEVICE_TO_HOST | DEVICE_TO_DEVICE | DEFAULT) {
        return Err(CudaError::INVALID_MEMCPY_DIRECTION);
    }
    let address = symbol_address(symbol, count, offset)?;
    memcpy(dst, address as usize as *const c_void, count, kind, stream, mode, per_thread)
}

pub unsafe fn cudaMemcpyToSymbol(
    symbol: *const c_void,
    src: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
) -> CudaResult<()> {
    to_symbol(symbol, src, count, offset, kind, std::ptr::null_mut(), Mode::Synchronous, false)
}

pub unsafe fn cudaMemcpyToSymbol_ptds(
    symbol: *const c_void,
    src: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
) -> CudaResult<()> {
    to_symbol(symbol, src, count, offset, kind, std::ptr::null_mut(), Mode::Synchronous, true)
}

pub unsafe fn cudaMemcpyToSymbolAsync(
    symbol: *const c_void,
    src: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
) -> CudaResult<()> {
    to_symbol(symbol, src, count, offset, kind, stream, Mode::Asynchronous, false)
}

pub unsafe fn cudaMemcpyToSymbolAsync_ptsz(
    symbol: *const c_void,
    src: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
) -> CudaResult<()> {
    to_symbol(symbol, src, count, offset, kind, stream, Mode::Asynchronous, true)
}

pub unsafe fn cudaMemcpyFromSymbol(
    dst: *mut c_void,
    symbol: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
) -> CudaResult<()> {
    from_symbol(dst, symbol, count, offset, kind, std::ptr::null_mut(), Mode::Synchronous, false)
}

pub unsafe fn cudaMemcpyFromSymbol_ptds(
    dst: *mut c_void,
    symbol: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
) -> CudaResult<()> {
    from_symbol(dst, symbol, count, offset, kind, std::ptr::null_mut(), Mode::Synchronous, true)
}

pub unsafe fn cudaMemcpyFromSymbolAsync(
    dst: *mut c_void,
    symbol: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
) -> CudaResult<()> {
    from_symbol(dst, symbol, count, offset, kind, stream, Mode::Asynchronous, false)
}

pub unsafe fn cudaMemcpyFromSymbolAsync_ptsz(
    dst: *mut c_void,
    symbol: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
) -> CudaResult<()> {
    from_symbol(dst, symbol, count, offset, kind, stream, Mode::Asynchronous, true)
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
    let address = ptr as usize;
    let mut value = cudaPointerAttributes {
        memory_type: memory_type::UNREGISTERED,
        device: -2,
        devicePointer: std::ptr::null_mut(),
        hostPointer: std::ptr::null_mut(),
        reserved: [0; 8],
    };
    if let Ok(client) = client() {
        if client.is_device_pointer(address as u64) {
            value.memory_type = memory_type::DEVICE;
            value.device = 0;
            value.devicePointer = ptr.cast_mut();
        } else if client.host_allocation(address).is_some() {
            // Pinned memory on the app's side: the GPU reaches it only through copies.
            value.memory_type = memory_type::HOST;
            value.device = 0;
            value.hostPointer = ptr.cast_mut();
        } else {
            // Unregistered host memory: success with type unregistered, as CUDA 11+ answers.
            value.hostPointer = ptr.cast_mut();
        }
    }
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(attributes, value) }
}
