//! Copies in every direction, memsets and pinned host memory, over the socket or the
//! shared-memory channel. The driver front checks its ABI's arguments (kinds, flags, handles),
//! resolves the stream and classifies the pointers; what happens then is here.
//!
//! Copies larger than the server's chunk travel as several frames, so a large copy never holds
//! up another thread's small calls for more than a chunk.

use std::alloc::Layout;
use std::ffi::c_void;

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{Copy3d, HostCopy, capture_status, decode_reply, rep, req};

use crate::client::{Client, HostAllocation};
use crate::conn::{HostDestination, ReplySlot};
use crate::host_files::{self, Unmappable};
use crate::shm::{Channel, HeldSlot, SLOT};

/// Pinned host memory is page aligned, like the driver's.
const HOST_ALIGNMENT: usize = 4096;

fn host_layout(size: usize) -> CudaResult<Layout> {
    Layout::from_size_align(size.max(1), HOST_ALIGNMENT).map_err(|_| CudaError::MEMORY_ALLOCATION)
}

/// `CU_MEMHOSTALLOC_DEVICEMAP` (`cudaHostAllocMapped`): kernels will use the memory in place.
pub const HOST_ALLOC_DEVICEMAP: u32 = 0x2;

/// Pinned host memory of `size` bytes (`flags` as the front checked them): a block of the
/// shared-memory segment when the channel has room, else page-aligned process memory. A block
/// the server could map at its address here is mapped memory, as under unified addressing
/// natively: kernels use it at its host address. `CU_MEMHOSTALLOC_DEVICEMAP` asks for exactly
/// that ([`mapped_block`]).
pub fn host_alloc(client: &Client, size: usize, flags: u32) -> CudaResult<*mut u8> {
    if flags & HOST_ALLOC_DEVICEMAP != 0 {
        return mapped_block(client, size, flags, false);
    }
    let (ptr, segment_offset, device_mapped) = match segment_block(client, size) {
        Some(block) => (block.ptr, Some(block.offset), block.device_mapped),
        None => {
            let layout = host_layout(size)?;
            // SAFETY: the layout has a non-zero size.
            let ptr = unsafe { std::alloc::alloc(layout) };
            if ptr.is_null() {
                return Err(CudaError::MEMORY_ALLOCATION);
            }
            (ptr, None, false)
        }
    };
    client
        .host_allocations
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(ptr as usize, HostAllocation { len: size.max(1), flags, segment_offset, registered: false, device_mapped, managed: false });
    Ok(ptr)
}

/// Host memory kernels use at its address here: a segment block the server mapped at that address,
/// recorded as mapped pinned memory or as managed memory (`managed`, `flags` its attach flags).
/// Where no such block can be had (no channel: the GPU is on another host, or the address is
/// taken in the server), mapped pinned memory is mirrored device memory (`mirrors.rs`) and
/// managed memory fails with `NOT_SUPPORTED` (`managed::alloc` mirrors it then, recording it as
/// managed); `MEMORY_ALLOCATION` when the segment is full.
pub(crate) fn mapped_block(client: &Client, size: usize, flags: u32, managed: bool) -> CudaResult<*mut u8> {
    let unmapped = |client: &Client| if managed { Err(CudaError::NOT_SUPPORTED) } else { client.mirror_alloc(size, flags, false) };
    if client.shm.is_none() {
        return unmapped(client);
    }
    let block = segment_block(client, size).ok_or(CudaError::MEMORY_ALLOCATION)?;
    if !block.device_mapped {
        release_block(client, block.offset, block.len)?;
        return unmapped(client);
    }
    let allocation =
        HostAllocation { len: size.max(1), flags, segment_offset: Some(block.offset), registered: false, device_mapped: true, managed };
    client.host_allocations.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(block.ptr as usize, allocation);
    Ok(block.ptr)
}

/// A block of the segment, pinned on the server.
struct SegmentBlock {
    offset: usize,
    len: usize,
    ptr: *mut u8,
    device_mapped: bool,
}

/// A block of the shared-memory segment, pinned on the server, when the channel is up and has
/// room; otherwise pinned memory is ordinary memory copied through the socket or the staging
/// slots.
fn segment_block(client: &Client, size: usize) -> Option<SegmentBlock> {
    let channel = client.shm.as_ref()?;
    let (offset, len) = channel.allocate(size)?;
    let ptr = channel.ptr(offset);
    match client.call(req::ShmRegister { offset: offset as u64, len: len as u64, mapped_at: ptr as u64 }) {
        // The server maps the block at our address or not at all.
        Ok(reply) => Some(SegmentBlock { offset, len, ptr, device_mapped: reply.device_pointer == ptr as u64 }),
        Err(_) => {
            channel.release(offset, len);
            None
        }
    }
}

/// Unpins the segment block of a host allocation of `len` bytes at `offset`.
pub(crate) fn release_allocation_block(client: &Client, offset: usize, len: usize) -> CudaResult<()> {
    release_block(client, offset, len.div_ceil(HOST_ALIGNMENT) * HOST_ALIGNMENT)
}

/// Unpins a segment block and gives it back to the channel.
fn release_block(client: &Client, offset: usize, len: usize) -> CudaResult<()> {
    client.post(req::ShmUnregister { offset: offset as u64 })?;
    if let Some(channel) = client.shm.as_ref() {
        channel.release(offset, len);
    }
    Ok(())
}

/// Where a copy goes by its pointers alone: memory the session knows as device memory is device
/// memory, and so is managed memory mirrored over device memory (`mirrors.rs`: the device holds
/// its latest bytes once the host's changes are sent); anything else host memory (unified
/// addressing).
pub fn classify(client: &Client, dst: u64, src: u64) -> Direction {
    let device = |ptr: u64| client.is_device_pointer(ptr) || client.managed.device_backed(ptr, 1);
    match (device(dst), device(src)) {
        (false, false) => Direction::HostToHost,
        (true, false) => Direction::HostToDevice,
        (false, true) => Direction::DeviceToHost,
        (true, true) => Direction::DeviceToDevice,
    }
}

/// Whether a copy whose entry point declares `declared` may go as `found` (what its pointers are):
/// each side the name calls device memory that is host memory here must be host memory kernels
/// use at its address (mapped or managed), which CUDA accepts there under unified addressing.
pub fn declared_fits(client: &Client, declared: Direction, found: Direction, dst: u64, src: u64) -> bool {
    let (declared_dst, declared_src) = declared.device_sides();
    let (found_dst, found_src) = found.device_sides();
    // Managed memory is both: mirrored, it is copied as the device memory it is (`classify`).
    let fits = |declared: bool, found: bool, ptr: u64| {
        declared == found
            || (declared && !found && client.host_allocation(ptr as usize).is_some_and(|host| host.device_mapped))
            || (!declared && found && client.managed.device_backed(ptr, 1))
    };
    fits(declared_dst, found_dst, dst) && fits(declared_src, found_src, src)
}

/// Fills `len` bytes at device address `dst` (device memory or mapped host memory) on `stream` with elements `width` bytes wide (1, 2
/// or 4), each the low `width` bytes of `pattern`, after checking the range. Queued: its errors
/// arrive at the next synchronizing call.
pub fn memset(client: &Client, dst: u64, pattern: u32, width: u8, len: u64, stream: u64) -> CudaResult<()> {
    if len == 0 {
        return Ok(());
    }
    client.check_device_accessible(dst, len)?;
    if client.mirrors.holds_allocation(dst) {
        // Host changes to the mirror first, or a later exchange would overwrite what this writes.
        client.send_host_changes()?;
    }
    client.mirrors.note_device_write();
    if let Some(outcome) = client.on_other_server(dst, stream, |stream| client.post(req::Memset { dst, pattern, width, len, stream })) {
        return outcome;
    }
    client.post(req::Memset { dst, pattern, width, len, stream })
}

/// Frees pinned host memory [`host_alloc`] gave out. Memory the app registered is the app's to
/// free, not ours: invalid value, as is any other pointer.
pub fn host_free(client: &Client, address: usize) -> CudaResult<()> {
    if let Some(freed) = client.free_mirrored(address as u64, false) {
        return freed;
    }
    let allocation = {
        let mut allocations = client.host_allocations.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if allocations.get(&address).is_none_or(|allocation| allocation.registered || allocation.managed) {
            return Err(CudaError::INVALID_VALUE);
        }
        allocations.remove(&address)
    };
    let allocation = allocation.ok_or(CudaError::INVALID_VALUE)?;
    if let Some(offset) = allocation.segment_offset {
        return release_allocation_block(client, offset, allocation.len);
    }
    // SAFETY: `address` was returned by `std::alloc::alloc` with this very layout in `host_alloc`
    // (the map holds exactly the pointers it gave out) and is removed from the map, so it is
    // freed once.
    unsafe { std::alloc::dealloc(address as *mut u8, host_layout(allocation.len)?) };
    Ok(())
}

/// `CU_MEMHOSTREGISTER_DEVICEMAP` (`cudaHostRegisterMapped`): kernels will use the memory in place.
pub const HOST_REGISTER_DEVICEMAP: u32 = 0x2;

/// Registers the app's own memory (`cudaHostRegister`, `cuMemHostRegister`; `flags` as the front
/// checked them). The GPU is in another process, so for copies nothing is pinned: the range is
/// remembered as registered host memory (so pointer attributes and host flags answer as CUDA
/// does), and copies from or to it go through the channel like any host memory. Mapped for
/// kernels (`CU_MEMHOSTREGISTER_DEVICEMAP`) it must be memory the server can map as well: a
/// shared mapping of a file, over the shared-memory channel ([`host_files`]); anything else is
/// refused with the reason.
pub fn host_register(client: &Client, start: usize, size: usize, flags: u32) -> Result<(), Unmappable> {
    let end = start.checked_add(size).ok_or(CudaError::INVALID_VALUE)?;
    let overlaps = |allocations: &std::collections::BTreeMap<usize, HostAllocation>| {
        allocations.range(..end).next_back().is_some_and(|(begin, allocation)| begin + allocation.len > start)
    };
    if overlaps(&client.host_allocations.lock().unwrap_or_else(std::sync::PoisonError::into_inner)) {
        return Err(CudaError::HOST_MEMORY_ALREADY_REGISTERED.into());
    }
    let device_mapped = flags & HOST_REGISTER_DEVICEMAP != 0;
    if device_mapped {
        host_files::register(client, start, size)?;
    }
    let mut allocations = client.host_allocations.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    // Another thread may have registered the range meanwhile.
    if overlaps(&allocations) {
        drop(allocations);
        if device_mapped {
            host_files::unregister(client, start)?;
        }
        return Err(CudaError::HOST_MEMORY_ALREADY_REGISTERED.into());
    }
    allocations.insert(start, HostAllocation { len: size, flags, segment_offset: None, registered: true, device_mapped, managed: false });
    Ok(())
}

/// Forgets memory [`host_register`] registered, by its start address (and has the server unmap
/// it, if it mapped it for kernels).
pub fn host_unregister(client: &Client, start: usize) -> CudaResult<()> {
    let mut allocations = client.host_allocations.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    match allocations.get(&start) {
        Some(allocation) if allocation.registered => {
            let mapped = allocation.device_mapped;
            allocations.remove(&start);
            drop(allocations);
            if mapped {
                host_files::unregister(client, start)?;
            }
            Ok(())
        }
        _ => Err(CudaError::HOST_MEMORY_NOT_REGISTERED),
    }
}

/// Where a copy happens, once the pointers are classified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    HostToHost,
    HostToDevice,
    DeviceToHost,
    DeviceToDevice,
}

impl Direction {
    /// Whether `(dst, src)` are device memory.
    pub fn device_sides(self) -> (bool, bool) {
        match self {
            Direction::HostToHost => (false, false),
            Direction::HostToDevice => (true, false),
            Direction::DeviceToHost => (false, true),
            Direction::DeviceToDevice => (true, true),
        }
    }
}

/// How a copy relates to the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `cudaMemcpy`: returns when the copy is done (host-to-device: once the device has it).
    Synchronous,
    /// `cudaMemcpyAsync`: returns at once; device-to-host bytes land by the next sync point.
    Asynchronous,
}

/// Any copy, once the front has resolved the stream and classified the pointers (see
/// [`classify`]). A synchronous copy ends with a stream synchronize, so it reports errors of
/// earlier work as the other sync points do.
///
/// # Safety
/// The host side (`dst` or `src`, per the direction) is valid for `count` bytes, as the CUDA
/// contract requires; for an asynchronous device-to-host copy it stays valid until the app
/// synchronizes.
pub unsafe fn copy(
    client: &Client,
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    direction: Direction,
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
    if client.spread()
        // SAFETY: forwarded contract.
        && let Some(outcome) = unsafe { copy_across_servers(client, dst, src, count, direction, stream) }
    {
        return outcome;
    }
    client.managed.check_copy_side(dst_address, len)?;
    client.managed.check_copy_side(src_address, len)?;
    // Mirrored managed memory is copied on the device (`classify`): the host's changes go first,
    // and the device's bytes reach the mirror at the next sync point.
    let (managed_dst, managed_src) = (client.managed.device_backed(dst_address, len), client.managed.device_backed(src_address, len));
    if managed_dst || managed_src {
        client.send_host_changes()?;
    }
    if managed_dst {
        client.mirrors.note_device_write();
    }
    let check_device_range = |ptr: u64, managed: bool| if managed { Ok(()) } else { client.check_device_range(ptr, len) };
    let chunk = client.info.copy_chunk.max(4096);
    // A copy between host and device memory: its device side checked, and recorded by a capture
    // in progress instead of run.
    let device_side = match direction {
        Direction::HostToDevice => Some((dst_address, managed_dst, false)),
        Direction::DeviceToHost => Some((src_address, managed_src, true)),
        Direction::HostToHost | Direction::DeviceToDevice => None,
    };
    if let Some((address, managed, to_host)) = device_side {
        check_device_range(address, managed)?;
        if captured_host_copy(client, Copy3d::flat(dst_address, src_address, len), to_host, stream)? {
            return Ok(());
        }
    }
    match direction {
        Direction::HostToHost => {
            // Stream-ordered and synchronous with the host, as in CUDA: the stream's earlier
            // work (a kernel writing mapped memory, a device-to-host copy into the source) is
            // done first, then the CPU copies.
            client.sync_stream(stream)?;
            // SAFETY: both are host buffers of `count` bytes per this function's contract;
            // `copy` allows overlap.
            unsafe { std::ptr::copy(src.cast::<u8>(), dst.cast::<u8>(), count) };
            Ok(())
        }
        Direction::HostToDevice => {
            if let Some(channel) = client.channel() {
                // SAFETY: forwarded contract.
                unsafe { shm_to_device(client, channel, dst_address, src.cast(), count, stream, mode) }?;
                if managed_dst && mode == Mode::Synchronous {
                    // Mirrored managed memory beside the channel (the server could not map a
                    // block at its address): the host reads it once the copy returns.
                    client.pull_mirrors(false)?;
                }
                return Ok(());
            }
            if mode == Mode::Asynchronous && client.graphs.host_functions_pending() && client.host_allocation(src as usize).is_some() {
                client.graphs.wait_for_host_functions();
            }
            // SAFETY: forwarded contract.
            if let Some(striped) = unsafe { crate::stripes::htod(client, dst_address, src.cast(), len, stream) } {
                striped?;
                if mode == Mode::Synchronous {
                    client.sync_stream(stream)?;
                }
                return Ok(());
            }
            // SAFETY: `src` is non-NULL (checked above) and a host buffer of `count` bytes per this
            // function's contract.
            let bytes = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), count) };
            for (index, piece) in bytes.chunks(usize::try_from(chunk).unwrap_or(usize::MAX)).enumerate() {
                let request = req::MemcpyHtoD { dst: dst_address + index as u64 * chunk, stream };
                client.conn().send_async(&request.into(), piece)?;
            }
            if mode == Mode::Synchronous {
                // cudaMemcpy reports errors of earlier work, and the copy is done when it returns.
                client.sync_stream(stream)?;
            }
            Ok(())
        }
        Direction::DeviceToHost => {
            if let Some(channel) = client.channel() {
                // SAFETY: forwarded contract.
                return unsafe { shm_to_host(client, channel, dst.cast(), src_address, count, stream, mode) };
            }
            // Into pageable memory even cudaMemcpyAsync returns only once the copy is done (CUDA
            // documents it); into pinned or registered memory it returns at once and the bytes
            // land before the next synchronizing call returns.
            let waited = mode == Mode::Synchronous || client.host_allocation(dst as usize).is_none();
            // Striped only when the call waits anyway: an asynchronous copy into pinned memory
            // keeps returning at once.
            let striped = if waited {
                // SAFETY: forwarded contract; the call waits for the bytes.
                unsafe { crate::stripes::dtoh(client, dst.cast(), src_address, len, stream, mode == Mode::Synchronous) }
            } else {
                None
            };
            if let Some(striped) = striped {
                return dtoh_done(client, mode, striped?);
            }
            let mut slots = Vec::new();
            // The frame count once the last piece was queued (see `Client::synchronize_stream`).
            let mut last_mark = None;
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
                if waited && last {
                    let (slot, mark) = client.conn().send_for_reply_marked(&request.into(), Some(destination))?;
                    slots.push(slot);
                    last_mark = Some(mark);
                } else if waited {
                    slots.push(client.conn().send_for_reply(&request.into(), Some(destination))?);
                } else {
                    client.conn().send_detached(&request.into(), destination)?;
                }
                offset += piece;
            }
            client.conn().flush()?;
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
            if let Some(mark) = last_mark {
                client.note_stream_finished(stream, mark);
            }
            dtoh_done(client, mode, deferred)
        }
        Direction::DeviceToDevice => {
            check_device_range(src_address, managed_src)?;
            check_device_range(dst_address, managed_dst)?;
            client.post(req::MemcpyDtoD { dst: dst_address, src: src_address, len, stream })?;
            if managed_dst && mode == Mode::Synchronous {
                // The host reads managed memory once a synchronous copy returns.
                client.sync_stream(stream)?;
            }
            Ok(())
        }
    }
}

/// How many staged pieces of a copy between two servers are in flight at once: the source's
/// device-to-host pieces travel while earlier ones go on to the destination.
const STAGED_PIECES_IN_FLIGHT: usize = 4;

/// A copy in a session spread over several servers (GPUs on several nodes) that is not the
/// thread's server's alone; `None` for one that is (it goes on as on one server).
///
/// - Device memory of two servers: staged through this process (`staged_copy`), never refused.
/// - Device memory of one other server than the thread's (whose server holds `stream`): after
///   `stream`'s earlier work, the copy runs on that server's NULL stream and returns once done,
///   asynchronous variants too, so the stream's later work sees it (documented in
///   `docs/design/multi-gpu.md`).
///
/// # Safety
/// As [`copy`].
unsafe fn copy_across_servers(
    client: &Client,
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    direction: Direction,
    stream: u64,
) -> Option<CudaResult<()>> {
    let (dst_on_device, src_on_device) = direction.device_sides();
    let dst_device = dst_on_device.then(|| client.ranges.device_of(dst as u64)).flatten();
    let src_device = src_on_device.then(|| client.ranges.device_of(src as u64)).flatten();
    let here = client.node_of(crate::devices::thread_device());
    match (dst_device, src_device) {
        (Some(to), Some(from)) if client.node_of(to) != client.node_of(from) => {
            Some(staged_copy(client, dst as u64, to, src as u64, from, count as u64, stream))
        }
        (to, from) => {
            let device = to.or(from).filter(|device| client.node_of(*device) != here)?;
            Some(client.sync_stream(stream).and_then(|()| {
                crate::devices::with_thread_device(device, || {
                    // SAFETY: forwarded contract; synchronous, so the host side is done with here.
                    unsafe { copy(client, dst, src, count, direction, 0, Mode::Synchronous) }
                })
            }))
        }
    }
}

/// A device-to-device copy between GPUs of two servers (two nodes), staged through this process:
/// after `stream`'s earlier work, pieces of the server's copy chunk come from the source server
/// (device to host, a few in flight) and each goes on to the destination server (host to
/// device) as soon as it has landed, so both links carry bytes at once. Returns once the
/// destination has every byte, asynchronous forms too (no stream of one server can wait for
/// another's work).
fn staged_copy(client: &Client, dst: u64, dst_device: u32, src: u64, src_device: u32, len: u64, stream: u64) -> CudaResult<()> {
    client.check_device_range(src, len)?;
    client.check_device_range(dst, len)?;
    client.sync_stream(stream)?;
    let chunk = client.info.copy_chunk.clamp(4096, 64 << 20);
    let piece_len = usize::try_from(chunk).map_err(|_| CudaError::INVALID_VALUE)?;
    let pieces = usize::try_from(len.div_ceil(chunk)).map_err(|_| CudaError::INVALID_VALUE)?;
    let slots = pieces.min(STAGED_PIECES_IN_FLIGHT);
    let mut staging = vec![0u8; piece_len * slots];
    let base = staging.as_mut_ptr();
    let (from, to) = (client.conn_of(src_device), client.conn_of(dst_device));
    let mut in_flight = std::collections::VecDeque::new();
    let mut free_slots: Vec<usize> = (0..slots).collect();
    let mut next = 0u64;
    let mut outcome = Ok(());
    loop {
        while outcome.is_ok() && next < len {
            let Some(slot) = free_slots.pop() else { break };
            let piece = chunk.min(len - next);
            // SAFETY: slot `slot` of `staging` holds `piece` bytes; no other piece uses it until
            // this one's reply was read, and `staging` outlives every piece in flight (each is
            // waited for below, whatever the outcome).
            let destination = unsafe { HostDestination::new(base.add(slot * piece_len), piece as usize) };
            let request = req::MemcpyDtoH { src: src + next, len: piece, stream: 0, blocking: false };
            match crate::devices::with_thread_device(src_device, || from.send_for_reply(&request.into(), Some(destination))) {
                Ok(reply) => in_flight.push_back((next, piece as usize, slot, reply)),
                Err(error) => outcome = Err(error),
            }
            next += piece;
        }
        if let Err(error) = from.flush() {
            outcome = outcome.and(Err(error));
        }
        let Some((offset, piece, slot, reply)) = in_flight.pop_front() else { break };
        let landed = reply.wait().and_then(|message| {
            let reply = decode_reply::<rep::MemcpyDtoH>(&message).map_err(|_| CudaError::UNKNOWN)?;
            reply.result?;
            reply.deferred.map_or(Ok(()), Err)
        });
        outcome = outcome.and(landed);
        if outcome.is_ok() {
            // SAFETY: the piece's reply was read: its bytes landed in its slot, which nothing
            // else writes until the slot is handed out again.
            let bytes = unsafe { std::slice::from_raw_parts(base.add(slot * piece_len), piece) };
            let request = req::MemcpyHtoD { dst: dst + offset, stream: 0 };
            outcome = crate::devices::with_thread_device(dst_device, || to.send_async(&request.into(), bytes));
        }
        free_slots.push(slot);
    }
    outcome?;
    // Asynchronous forms too: the app's later work may be on any stream of the destination's
    // server, which only a wait here orders after the pieces.
    crate::devices::with_thread_device(dst_device, || client.sync_stream(0))
}

/// A copy between device memory and the app's host memory on a capturing stream: the capture
/// records it as a node that copies the app's memory each time the graph runs, as natively
/// (the bytes do not travel now). `false` when `stream` is not capturing.
pub fn captured_host_copy(client: &Client, copy: Copy3d, to_host: bool, stream: u64) -> CudaResult<bool> {
    if !client.graphs.any_capture() || client.capture_info(stream)?.status == capture_status::NONE {
        return Ok(false);
    }
    // Pinned memory of the shared-memory segment is mapped in the server: the driver's own
    // capture names it there, which needs no round trip per launch.
    let (host, pitch, height) =
        if to_host { (copy.dst, copy.dst_pitch, copy.dst_height) } else { (copy.src, copy.src_pitch, copy.src_height) };
    if let Some(channel) = client.channel()
        && let Some(span) = copy.span(pitch, height)
        && let (Ok(host), Ok(span)) = (usize::try_from(host), usize::try_from(span))
        && channel.offset_of(host, span).is_some()
    {
        return Ok(false);
    }
    client.ensure_host_runner()?;
    client.call(req::CaptureHostCopy { stream, copy: HostCopy { copy, to_host } })?;
    Ok(true)
}

/// Checks a fence reply (a staging slot's copy is done).
fn fence_result(fence: &ReplySlot) -> CudaResult<()> {
    let message = fence.wait()?;
    decode_reply::<rep::ShmFence>(&message).map_err(|_| CudaError::UNKNOWN)?.result.map(|_| ())
}

/// Sends a fence for `stream` and returns its reply slot (answered when the stream's queued work
/// is done).
fn fence(client: &Client, stream: u64) -> CudaResult<std::sync::Arc<ReplySlot>> {
    let fence = client.conn().send_for_reply(&req::ShmFence { stream }.into(), None)?;
    client.conn().flush()?;
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
        client.post(req::ShmCopyHtoD { dst, offset: offset as u64, len: count as u64, stream })?;
    } else {
        let mut done = 0;
        while done < count {
            let piece = SLOT.min(count - done);
            let slot = channel.take_slot()?;
            // SAFETY: the slot is `SLOT` bytes of the segment held by this copy alone; the
            // source range is inside the app's buffer per this function's contract.
            unsafe { channel.copy(channel.ptr(slot.offset), src.add(done), piece) };
            let request = req::ShmCopyHtoD { dst: dst + done as u64, offset: slot.offset as u64, len: piece as u64, stream };
            let sent = client.post(request).and_then(|()| fence(client, stream));
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
        client.sync_stream(stream)?;
    } else {
        client.conn().flush()?;
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
        client.post(req::ShmCopyDtoH { src, offset: offset as u64, len: count as u64, stream })?;
        return match mode {
            Mode::Synchronous => client.sync_stream(stream),
            Mode::Asynchronous => client.conn().flush(),
        };
    }
    let mut in_flight = std::collections::VecDeque::new();
    // Copies a landed slot out to the app and frees it.
    let finish = |(slot, offset, len, fence): (HeldSlot, usize, usize, std::sync::Arc<ReplySlot>)| {
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
        match client.post(request).and_then(|()| fence(client, stream)) {
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
        client.sync_stream(stream)?;
    }
    Ok(())
}

/// The end of a device-to-host copy whose bytes have landed: a synchronous one reports the
/// deferred error its reply carried (or one the connection holds) and, having waited for the
/// work before it, takes what that work wrote into mirrored memory (`mirrors.rs`); an
/// asynchronous one is no sync point, so its error waits for the next.
fn dtoh_done(client: &Client, mode: Mode, deferred: Option<CudaError>) -> CudaResult<()> {
    match mode {
        Mode::Synchronous => {
            deferred.or_else(|| client.conn().take_deferred()).map_or(Ok(()), Err)?;
            client.pull_mirrors(false)
        }
        Mode::Asynchronous => {
            if let Some(error) = deferred {
                client.conn().defer(error);
            }
            Ok(())
        }
    }
}
