//! Memory: allocations, copies in every direction, memsets, symbols and pointer attributes.
//!
//! Device pointers are the server's real device addresses; the shim keeps the app's ranges so
//! it can refuse a bad pointer at once (`cudaErrorInvalidValue`, never a device fault), tell
//! host from device pointers for `cudaMemcpyDefault`, and answer `cudaPointerGetAttributes`.
//! Copies larger than the server's chunk travel as several frames, so a large copy never holds
//! up another thread's small calls for more than a chunk.

use std::alloc::Layout;
use std::ffi::{c_int, c_uint, c_void};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{decode_reply, rep, req};

use super::streams::stream_id;
use super::{call, post};
use crate::client::{Client, HostAllocation, client};
use crate::conn::{HostDestination, ReplySlot};
use crate::ffi::{cudaMemcpyKind, cudaStream_t, host_slice, write_out};
use crate::props::{cudaPointerAttributes, memory_type};
use crate::registry::variable_by_host;
use crate::shm::{Channel, SLOT};

const HOST_TO_HOST: cudaMemcpyKind = 0;
const HOST_TO_DEVICE: cudaMemcpyKind = 1;
const DEVICE_TO_HOST: cudaMemcpyKind = 2;
const DEVICE_TO_DEVICE: cudaMemcpyKind = 3;
const DEFAULT: cudaMemcpyKind = 4;
/// Pinned host memory is page aligned, like the driver's.
const HOST_ALIGNMENT: usize = 4096;
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

fn host_layout(size: usize) -> CudaResult<Layout> {
    Layout::from_size_align(size.max(1), HOST_ALIGNMENT).map_err(|_| CudaError::MEMORY_ALLOCATION)
}

fn host_alloc(out: *mut *mut c_void, size: usize, flags: c_uint) -> CudaResult<()> {
    if out.is_null() || flags & !HOST_ALLOC_FLAGS != 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    let client = client()?;
    let (ptr, segment_offset) = match segment_block(client, size) {
        Some((offset, ptr)) => (ptr, Some(offset)),
        None => {
            let layout = host_layout(size)?;
            // SAFETY: the layout has a non-zero size.
            let ptr = unsafe { std::alloc::alloc(layout) };
            if ptr.is_null() {
                return Err(CudaError::MEMORY_ALLOCATION);
            }
            (ptr, None)
        }
    };
    client
        .host_allocations
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(ptr as usize, HostAllocation { len: size.max(1), flags, segment_offset, registered: false });
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(out, ptr.cast()) }
}

/// A block of the shared-memory segment, pinned on the server, when the channel is up and has
/// room; otherwise pinned memory is ordinary memory copied through the socket or the staging
/// slots.
fn segment_block(client: &Client, size: usize) -> Option<(usize, *mut u8)> {
    let channel = client.shm.as_ref()?;
    let (offset, len) = channel.allocate(size)?;
    match call(client, req::ShmRegister { offset: offset as u64, len: len as u64 }) {
        Ok(_) => Some((offset, channel.ptr(offset))),
        Err(_) => {
            channel.release(offset, len);
            None
        }
    }
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
    let client = client()?;
    let allocation = {
        let mut allocations = client.host_allocations.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Registered app memory is the app's to free, not ours.
        if allocations.get(&(ptr as usize)).is_none_or(|allocation| allocation.registered) {
            return Err(CudaError::INVALID_VALUE);
        }
        allocations.remove(&(ptr as usize))
    };
    let allocation = allocation.ok_or(CudaError::INVALID_VALUE)?;
    if let (Some(offset), Some(channel)) = (allocation.segment_offset, client.shm.as_ref()) {
        post(client, req::ShmUnregister { offset: offset as u64 })?;
        channel.release(offset, allocation.len.div_ceil(4096) * 4096);
        return Ok(());
    }
    // SAFETY: `ptr` was returned by `std::alloc::alloc` with this very layout in `host_alloc`
    // (the map holds exactly the pointers it gave out) and is removed from the map, so it is
    // freed once.
    unsafe { std::alloc::dealloc(ptr.cast(), host_layout(allocation.len)?) };
    Ok(())
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

/// Where a copy happens, once the pointers are classified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    HostToHost,
    HostToDevice,
    DeviceToHost,
    DeviceToDevice,
}

/// Classifies a copy. Pointers the session knows as device memory are device memory whatever
/// the declared kind says (as with unified addressing), so a device address is never read or
/// written as host memory.
fn direction(client: &Client, dst: u64, src: u64, kind: cudaMemcpyKind) -> CudaResult<Direction> {
    let (dst_device, src_device) = (client.is_device_pointer(dst), client.is_device_pointer(src));
    let direction = match (dst_device, src_device) {
        (false, false) => Direction::HostToHost,
        (true, false) => Direction::HostToDevice,
        (false, true) => Direction::DeviceToHost,
        (true, true) => Direction::DeviceToDevice,
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

/// How a copy relates to the host.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `cudaMemcpy`: returns when the copy is done (host-to-device: once the device has it).
    Synchronous,
    /// `cudaMemcpyAsync`: returns at once; device-to-host bytes land by the next sync point.
    Asynchronous,
}

/// Any copy, once the stream is resolved.
///
/// # Safety
/// The host side (`dst` or `src`, per the direction) is valid for `count` bytes, as the CUDA
/// contract requires; for an asynchronous device-to-host copy it stays valid until the app
/// synchronizes.
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
    let (dst_address, src_address, len) = (dst as u64, src as u64, count as u64);
    let chunk = client.info.copy_chunk.max(4096);
    match direction(client, dst_address, src_address, kind)? {
        Direction::HostToHost => {
            // Ordered after the app's earlier device-to-host copies only by a synchronize, as in
            // CUDA: a host-to-host copy is immediate.
            // SAFETY: both are host buffers of `count` bytes per this function's contract;
            // `copy` allows overlap.
            unsafe { std::ptr::copy(src.cast::<u8>(), dst.cast::<u8>(), count) };
            Ok(())
        }
        Direction::HostToDevice => {
            client.check_device_range(dst_address, len)?;
            if let Some(channel) = &client.shm {
                // SAFETY: forwarded contract.
                return unsafe { shm_to_device(client, channel, dst_address, src.cast(), count, stream, mode) };
            }
            // SAFETY: the source is a host buffer of `count` bytes per this function's contract.
            let bytes = unsafe { host_slice(src, count)? };
            for (index, piece) in bytes.chunks(usize::try_from(chunk).unwrap_or(usize::MAX)).enumerate() {
                let request = req::MemcpyHtoD { dst: dst_address + index as u64 * chunk, stream };
                client.conn.send_async(&request.into(), piece)?;
            }
            if mode == Mode::Synchronous {
                // cudaMemcpy reports errors of earlier work, and the copy is done when it returns.
                call(client, req::StreamSynchronize { stream })?;
            }
            Ok(())
        }
        Direction::DeviceToHost => {
            client.check_device_range(src_address, len)?;
            if let Some(channel) = &client.shm {
                // SAFETY: forwarded contract.
                return unsafe { shm_to_host(client, channel, dst.cast(), src_address, count, stream, mode) };
            }
            // Into pageable memory even cudaMemcpyAsync returns only once the copy is done (CUDA
            // documents it); into pinned or registered memory it returns at once and the bytes
            // land before the next synchronizing call returns.
            let waited = mode == Mode::Synchronous || client.host_allocation(dst as usize).is_none();
            let mut slots = Vec::new();
            let mut offset = 0u64;
            while offset < len {
                let piece = chunk.min(len - offset);
                let piece_len = usize::try_from(piece).map_err(|_| CudaError::INVALID_VALUE)?;
                // SAFETY: `dst + offset .. + piece` lies inside the app's `count`-byte host buffer,
                // which stays valid until this copy completes (we wait below, or the app syncs).
                let destination = unsafe { HostDestination::new(dst.cast::<u8>().add(offset as usize), piece_len) };
                let last = offset + piece == len;
                let request =
                    req::MemcpyDtoH { src: src_address + offset, len: piece, stream, blocking: last && mode == Mode::Synchronous };
                if waited {
                    slots.push(client.conn.send_for_reply(&request.into(), Some(destination))?);
                } else {
                    client.conn.send_detached(&request.into(), destination)?;
                }
                offset += piece;
            }
            client.conn.flush()?;
            let mut outcome = Ok(());
            let mut deferred = None;
            for slot in slots {
                let reply = slot.wait().and_then(|message| decode_reply::<rep::MemcpyDtoH>(&message).map_err(|_| CudaError::UNKNOWN));
                match reply {
                    Ok(reply) => {
                        deferred = deferred.or(reply.deferred);
                        if let Err(error) = reply.result {
                            outcome = outcome.and(Err(error));
                        }
                    }
                    Err(error) => outcome = outcome.and(Err(error)),
                }
            }
            outcome?;
            match deferred.or_else(|| client.conn.take_deferred()) {
                Some(error) if mode == Mode::Synchronous => Err(error),
                Some(error) => {
                    // Not a sync point: the error waits for the next one.
                    client.conn.defer(error);
                    Ok(())
                }
                None => Ok(()),
            }
        }
        Direction::DeviceToDevice => {
            client.check_device_range(src_address, len)?;
            client.check_device_range(dst_address, len)?;
            post(client, req::MemcpyDtoD { dst: dst_address, src: src_address, len, stream })
        }
    }
}

/// Checks a fence reply (a staging slot's copy is done).
fn fence_result(fence: &ReplySlot) -> CudaResult<()> {
    let message = fence.wait()?;
    decode_reply::<rep::ShmFence>(&message).map_err(|_| CudaError::UNKNOWN)?.result.map(|_| ())
}

/// Sends a fence for `stream` and returns its reply slot (answered when the stream's queued work
/// is done).
fn fence(client: &Client, stream: u64) -> CudaResult<std::sync::Arc<ReplySlot>> {
    let fence = client.conn.send_for_reply(&req::ShmFence { stream }.into(), None)?;
    client.conn.flush()?;
    Ok(fence)
}

/// Host to device through the shared-memory channel: DMA straight from a pinned block, or
/// pageable memory copied into staging slots (on several threads) while earlier slots' DMA runs.
///
/// # Safety
/// `src` is readable for `count` bytes until this returns.
unsafe fn shm_to_device(
    client: &Client,
    channel: &Channel,
    dst: u64,
    src: *const u8,
    count: usize,
    stream: u64,
    mode: Mode,
) -> CudaResult<()> {
    if let Some(offset) = channel.offset_of(src as usize, count) {
        post(client, req::ShmCopyHtoD { dst, offset: offset as u64, len: count as u64, stream })?;
    } else {
        let mut done = 0;
        while done < count {
            let piece = SLOT.min(count - done);
            let slot = channel.take_slot()?;
            // SAFETY: the slot is `SLOT` bytes of the segment held by this copy alone; the
            // source range is inside the app's buffer per this function's contract.
            unsafe { channel.copy(channel.ptr(slot.offset), src.add(done), piece) };
            let request = req::ShmCopyHtoD { dst: dst + done as u64, offset: slot.offset as u64, len: piece as u64, stream };
            let sent = post(client, request).and_then(|()| fence(client, stream));
            match sent {
                Ok(fence) => channel.give_back(slot.index, Some(fence)),
                Err(error) => {
                    channel.give_back(slot.index, None);
                    return Err(error);
                }
            }
            done += piece;
        }
    }
    if mode == Mode::Synchronous {
        call(client, req::StreamSynchronize { stream })?;
    } else {
        client.conn.flush()?;
    }
    Ok(())
}

/// Device to host through the shared-memory channel: DMA straight into a pinned block, or into
/// staging slots that are copied out (on several threads) while later slots' DMA runs.
///
/// # Safety
/// `dst` is writable for `count` bytes until this returns (or, for a pinned block copied
/// asynchronously, until the app synchronizes).
unsafe fn shm_to_host(client: &Client, channel: &Channel, dst: *mut u8, src: u64, count: usize, stream: u64, mode: Mode) -> CudaResult<()> {
    if let Some(offset) = channel.offset_of(dst as usize, count) {
        post(client, req::ShmCopyDtoH { src, offset: offset as u64, len: count as u64, stream })?;
        return match mode {
            Mode::Synchronous => call(client, req::StreamSynchronize { stream }).map(|_| ()),
            Mode::Asynchronous => client.conn.flush(),
        };
    }
    let mut in_flight = std::collections::VecDeque::new();
    // Copies a landed slot out to the app and frees it.
    let finish = |(slot, offset, len, fence): (crate::shm::HeldSlot, usize, usize, std::sync::Arc<ReplySlot>)| {
        let landed = fence_result(&fence);
        if landed.is_ok() {
            // SAFETY: the fence says the DMA into the slot is done; the destination range lies
            // in the app's buffer per this function's contract.
            unsafe { channel.copy(dst.add(offset), channel.ptr(slot.offset), len) };
        }
        channel.give_back(slot.index, None);
        landed
    };
    let mut outcome = Ok(());
    let mut done = 0;
    while done < count && outcome.is_ok() {
        let slot = match channel.try_take_slot() {
            Some(slot) => slot?,
            None => match in_flight.pop_front() {
                Some(oldest) => {
                    outcome = finish(oldest);
                    continue;
                }
                None => channel.take_slot()?,
            },
        };
        let piece = SLOT.min(count - done);
        let request = req::ShmCopyDtoH { src: src + done as u64, offset: slot.offset as u64, len: piece as u64, stream };
        match post(client, request).and_then(|()| fence(client, stream)) {
            Ok(fence) => in_flight.push_back((slot, done, piece, fence)),
            Err(error) => {
                channel.give_back(slot.index, None);
                outcome = Err(error);
            }
        }
        done += piece;
    }
    for entry in in_flight {
        let landed = finish(entry);
        outcome = outcome.and(landed);
    }
    outcome?;
    if mode == Mode::Synchronous {
        // Deliver errors of earlier asynchronous work and flush device printf output, as a
        // synchronous copy does (the stream is idle: the fences above said so).
        call(client, req::StreamSynchronize { stream })?;
    }
    Ok(())
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
    let dst = dev_ptr as u64;
    client.check_device_range(dst, count as u64)?;
    // cudaMemset writes the low byte of `value`, as CUDA does.
    post(client, req::Memset { dst, value: value as u8, len: count as u64, stream })
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
