//! Shaped copies (`cuMemcpy2D`, `cuMemcpy3D`, copies to and from arrays) over the same bulk
//! paths as 1D copies. Device-side boxes (pitched memory, arrays) are copied by the server's
//! driver in one call; a host side travels packed: the box is cut into row-aligned pieces of at
//! most one chunk (a staging slot over shared memory), each itself a box the server copies with
//! one driver call, so a pitched or 3D copy costs what a 1D copy of its bytes costs. Host memory
//! inside the shared-memory segment (pinned blocks) is copied by DMA in place, pitch and all.

use std::collections::VecDeque;
use std::sync::Arc;

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{BoxSize, Copy3d, CopySide, Pos3, ShapedCopy, decode_reply, rep, req};

use crate::client::Client;
use crate::conn::{HostDestination, ReplySlot};
use crate::shm::{Channel, HeldSlot, SLOT};
use crate::transfer::Mode;

/// One side of a shaped copy as the app gave it.
#[derive(Clone, Copy, Debug)]
pub enum Side {
    /// Device memory from `ptr`: rows `pitch` bytes apart, slices `pitch * height`.
    Device { ptr: u64, pitch: u64, height: u64 },
    /// An array (the client's id).
    Array { array: u64 },
    /// Host memory from `ptr`, laid out likewise.
    Host { ptr: *mut u8, pitch: u64, height: u64 },
}

impl Side {
    fn is_host(&self) -> bool {
        matches!(self, Self::Host { .. })
    }
}

/// A whole shaped copy: a box of `width` bytes x `height` rows x `depth` slices.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub src: Side,
    pub src_pos: Pos3,
    pub dst: Side,
    pub dst_pos: Pos3,
    pub width: u64,
    pub height: u64,
    pub depth: u64,
}

impl Shape {
    fn size(&self) -> BoxSize {
        BoxSize { width: self.width, height: self.height, depth: self.depth }
    }
}

/// Device-to-host pieces in flight at once over a socket.
const WINDOW: usize = 8;

fn add(pos: Pos3, offset: Pos3) -> Pos3 {
    Pos3 { x: pos.x + offset.x, y: pos.y + offset.y, z: pos.z + offset.z }
}

/// A piece of a box: its offset in the box and its own extent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Piece {
    offset: Pos3,
    width: u64,
    height: u64,
    depth: u64,
}

impl Piece {
    fn len(&self) -> u64 {
        self.width * self.height * self.depth
    }
}

/// Cuts a box into row-aligned pieces of at most `chunk` bytes: whole slices when a slice fits,
/// else runs of rows in one slice, else parts of one row.
fn pieces(width: u64, height: u64, depth: u64, chunk: u64) -> Vec<Piece> {
    let mut out = Vec::new();
    if width == 0 || height == 0 || depth == 0 {
        return out;
    }
    let rows = chunk / width;
    if rows == 0 {
        for z in 0..depth {
            for y in 0..height {
                let mut x = 0;
                while x < width {
                    let part = chunk.min(width - x);
                    out.push(Piece { offset: Pos3 { x, y, z }, width: part, height: 1, depth: 1 });
                    x += part;
                }
            }
        }
    } else if rows >= height {
        let slices = rows / height;
        let mut z = 0;
        while z < depth {
            let count = slices.min(depth - z);
            out.push(Piece { offset: Pos3 { x: 0, y: 0, z }, width, height, depth: count });
            z += count;
        }
    } else {
        for z in 0..depth {
            let mut y = 0;
            while y < height {
                let count = rows.min(height - y);
                out.push(Piece { offset: Pos3 { x: 0, y, z }, width, height: count, depth: 1 });
                y += count;
            }
        }
    }
    out
}

/// The address of row `(y, z)` of a host side, `x` bytes in.
fn host_row(ptr: *mut u8, pitch: u64, height: u64, pos: Pos3) -> *mut u8 {
    ptr.wrapping_add(((pos.z * height + pos.y) * pitch + pos.x) as usize)
}

/// Copies a piece's rows between a host side and a packed buffer (`pack`: host to buffer).
///
/// # Safety
/// The host side is valid for the piece's rows and `packed` for `piece.len()` bytes; they do not
/// overlap.
unsafe fn move_rows(host: (*mut u8, u64, u64), at: Pos3, piece: Piece, packed: *mut u8, pack: bool) {
    let (ptr, pitch, height) = host;
    let width = piece.width as usize;
    for z in 0..piece.depth {
        for y in 0..piece.height {
            let row = host_row(ptr, pitch, height, add(at, Pos3 { x: piece.offset.x, y: piece.offset.y + y, z: piece.offset.z + z }));
            let buffer = packed.wrapping_add(((z * piece.height + y) * piece.width) as usize);
            // SAFETY: per this function's contract, both rows are valid and apart.
            unsafe {
                if pack {
                    std::ptr::copy_nonoverlapping(row, buffer, width);
                } else {
                    std::ptr::copy_nonoverlapping(buffer, row, width);
                }
            }
        }
    }
}

impl Client {
    /// Checks a device or array side of `shape` here, so a bad box fails at the call.
    fn check_side(&self, side: Side, pos: Pos3, shape: &Shape) -> CudaResult<()> {
        let size = shape.size();
        match side {
            Side::Device { ptr, pitch, height } => {
                let (start, len) = size.pitched_span(pos, pitch, height).ok_or(CudaError::INVALID_VALUE)?;
                let first = ptr.checked_add(start).ok_or(CudaError::INVALID_VALUE)?;
                // Mirrored managed memory is device memory to copies (`transfer::classify`).
                if self.managed.device_backed(first, len) {
                    return Ok(());
                }
                self.check_device_range(first, len)
            }
            Side::Array { array } => {
                let desc = self.array_desc(array)?;
                if !size.fits_array(pos, &desc) {
                    return Err(CudaError::INVALID_VALUE);
                }
                if desc.is_mapped_later() && self.info.emulated {
                    // Its device maps no memory into such an array: refused at the call, as the
                    // server would refuse it at the next synchronization.
                    crate::diagnostics::once(
                        "emulated-sparse-copy",
                        "flyt: a copy to or from a sparse or deferred-mapping array: the server's emulated device maps no memory into one (returning CUDA_ERROR_NOT_SUPPORTED)",
                    );
                    return Err(CudaError::NOT_SUPPORTED);
                }
                Ok(())
            }
            Side::Host { pitch, height, .. } => size.pitched_span(pos, pitch, height).map(drop).ok_or(CudaError::INVALID_VALUE),
        }
    }
}

/// A device or array side on the wire.
fn wire_side(side: Side) -> CopySide {
    match side {
        Side::Device { ptr, pitch, height } => CopySide::Device { ptr, pitch, height },
        Side::Array { array } => CopySide::Array { array },
        Side::Host { pitch, height, .. } => CopySide::Host { pitch, height },
    }
}

/// Any shaped copy (synchronous ones end as [`crate::transfer::copy`]'s do).
///
/// # Safety
/// Host sides are valid for the box they describe, as the CUDA contract requires; for an
/// asynchronous copy they stay valid until the app synchronizes.
pub unsafe fn copy(client: &Client, shape: Shape, stream: u64, mode: Mode) -> CudaResult<()> {
    client.check_side(shape.src, shape.src_pos, &shape)?;
    client.check_side(shape.dst, shape.dst_pos, &shape)?;
    if shape.width == 0 || shape.height == 0 || shape.depth == 0 {
        return Ok(());
    }
    if client.spread()
        // SAFETY: forwarded contract.
        && let Some(outcome) = unsafe { across_servers(client, shape, stream) }
    {
        return outcome;
    }
    if let Some((copy, to_host)) = host_device_copy(&shape)
        && crate::transfer::captured_host_copy(client, copy, to_host, stream)?
    {
        return Ok(());
    }
    // Mirrored managed memory on a device side: the host's changes go first, and the device's
    // bytes reach the mirror at the next sync point (`transfer::copy`).
    let managed = |side: Side| matches!(side, Side::Device { ptr, .. } if client.managed.device_backed(ptr, 1));
    let managed_dst = managed(shape.dst);
    if managed(shape.src) || managed_dst {
        client.send_host_changes()?;
    }
    if managed_dst {
        client.mirrors.note_device_write();
    }
    match (shape.src, shape.dst) {
        (Side::Host { ptr: src, pitch: src_pitch, height: src_height }, Side::Host { ptr: dst, pitch: dst_pitch, height: dst_height }) => {
            // After the stream's earlier work, on the CPU, row by row.
            client.sync_stream(stream)?;
            let piece = Piece { offset: Pos3::default(), width: shape.width, height: 1, depth: 1 };
            for z in 0..shape.depth {
                for y in 0..shape.height {
                    let at = Pos3 { x: 0, y, z };
                    let from = host_row(src, src_pitch, src_height, add(shape.src_pos, at));
                    // SAFETY: both rows lie in the app's host boxes (this function's contract);
                    // `move_rows` of one row with the source as the packed buffer.
                    unsafe { move_rows((dst, dst_pitch, dst_height), add(shape.dst_pos, at), piece, from, false) };
                }
            }
            Ok(())
        }
        (src, dst) if !src.is_host() && !dst.is_host() => {
            let copy = ShapedCopy {
                src: wire_side(src),
                src_pos: shape.src_pos,
                dst: wire_side(dst),
                dst_pos: shape.dst_pos,
                width: shape.width,
                height: shape.height,
                depth: shape.depth,
            };
            client.post(req::MemcpyShaped { copy, stream })?;
            if managed_dst && mode == Mode::Synchronous {
                // The host reads managed memory once a synchronous copy returns.
                client.sync_stream(stream)?;
            }
            Ok(())
        }
        (Side::Host { ptr, pitch, height }, _) => {
            // SAFETY: forwarded contract.
            unsafe { to_device(client, shape, (ptr, pitch, height), stream, mode) }
        }
        (_, Side::Host { ptr, pitch, height }) => {
            // SAFETY: forwarded contract.
            unsafe { to_host(client, shape, (ptr, pitch, height), stream, mode) }
        }
        _ => Err(CudaError::INVALID_VALUE),
    }
}

/// A shaped copy in a session spread over several servers that is not the thread's server's
/// alone (as `transfer::copy_across_servers` does for flat copies; `None`: it is): device memory
/// of two servers goes through a packed host box, first out of the source's server, then into the
/// destination's; memory of one other server is copied there. Either after the stream's earlier
/// work, and done on return. Arrays are the thread's server's.
///
/// # Safety
/// As [`copy`].
unsafe fn across_servers(client: &Client, shape: Shape, stream: u64) -> Option<CudaResult<()>> {
    let here = crate::devices::thread_device();
    // The session device a side's memory is on (host memory: none).
    let device_of = |side: Side| match side {
        Side::Device { ptr, .. } => client.ranges.device_of(ptr),
        Side::Array { .. } => Some(here),
        Side::Host { .. } => None,
    };
    let (src, dst) = (device_of(shape.src), device_of(shape.dst));
    let elsewhere = |device: &u32| client.node_of(*device) != client.node_of(here);
    let run_on = |device: u32, shape: Shape| {
        crate::devices::with_thread_device(device, || {
            // SAFETY: forwarded contract; synchronous, so the host side is done with here.
            unsafe { copy(client, shape, 0, Mode::Synchronous) }
        })
    };
    match (src, dst) {
        (Some(from), Some(to)) if client.node_of(from) != client.node_of(to) => Some((|| {
            client.sync_stream(stream)?;
            let len = shape.width.checked_mul(shape.height).and_then(|len| len.checked_mul(shape.depth)).ok_or(CudaError::INVALID_VALUE)?;
            let mut staging = vec![0u8; usize::try_from(len).map_err(|_| CudaError::INVALID_VALUE)?];
            let host = Side::Host { ptr: staging.as_mut_ptr(), pitch: shape.width, height: shape.height };
            run_on(from, Shape { dst: host, dst_pos: Pos3::default(), ..shape })?;
            run_on(to, Shape { src: host, src_pos: Pos3::default(), ..shape })
        })()),
        (from, to) => {
            let device = to.or(from).filter(elsewhere)?;
            Some(client.sync_stream(stream).and_then(|()| run_on(device, shape)))
        }
    }
}

/// A copy between host and device memory as one `Copy3d`, positions folded into the
/// addresses (a capture records it as a graph's host copy); `true`: device to host.
fn host_device_copy(shape: &Shape) -> Option<(Copy3d, bool)> {
    let flat = |side: Side, pos: Pos3| -> Option<(u64, u64, u64)> {
        let (ptr, pitch, height) = match side {
            Side::Device { ptr, pitch, height } => (ptr, pitch, height),
            Side::Host { ptr, pitch, height } => (ptr as u64, pitch, height),
            Side::Array { .. } => return None,
        };
        let (start, _) = shape.size().pitched_span(pos, pitch, height)?;
        Some((ptr.checked_add(start)?, pitch, height))
    };
    let to_host = match (shape.src, shape.dst) {
        (Side::Device { .. }, Side::Host { .. }) => true,
        (Side::Host { .. }, Side::Device { .. }) => false,
        _ => return None,
    };
    let (src, src_pitch, src_height) = flat(shape.src, shape.src_pos)?;
    let (dst, dst_pitch, dst_height) = flat(shape.dst, shape.dst_pos)?;
    let copy =
        Copy3d { src, src_pitch, src_height, dst, dst_pitch, dst_height, width: shape.width, height: shape.height, depth: shape.depth };
    Some((copy, to_host))
}

/// The wire description of a piece whose host side is packed (or in the segment at its own
/// layout, `host_layout`).
fn piece_copy(shape: &Shape, piece: Piece, to_host: bool, host_layout: Option<(u64, u64)>) -> ShapedCopy {
    let (pitch, height) = host_layout.unwrap_or((piece.width, piece.height));
    let host = CopySide::Host { pitch, height };
    let (src, src_pos, dst, dst_pos) = if to_host {
        (wire_side(shape.src), add(shape.src_pos, piece.offset), host, Pos3::default())
    } else {
        (host, Pos3::default(), wire_side(shape.dst), add(shape.dst_pos, piece.offset))
    };
    ShapedCopy { src, src_pos, dst, dst_pos, width: piece.width, height: piece.height, depth: piece.depth }
}

/// Queues the whole copy by DMA in place when the host box lies in the segment (pinned memory),
/// at its own pitch; `false` when it does not.
fn in_place(client: &Client, channel: &Channel, shape: &Shape, host: (*mut u8, u64, u64), to_host: bool, stream: u64) -> CudaResult<bool> {
    let (ptr, pitch, height) = host;
    let whole = Piece { offset: Pos3::default(), width: shape.width, height: shape.height, depth: shape.depth };
    let copy = piece_copy(shape, whole, to_host, Some((pitch, height)));
    let pos = if to_host { shape.dst_pos } else { shape.src_pos };
    let Some((start, len)) = shape.size().pitched_span(pos, pitch, height) else { return Ok(false) };
    let Some(offset) = channel.offset_of(ptr as usize + start as usize, len as usize) else { return Ok(false) };
    client.post(req::ShmCopyShaped { copy, offset: offset as u64, stream })?;
    Ok(true)
}

/// Host to device or array.
///
/// # Safety
/// As [`copy`].
unsafe fn to_device(client: &Client, shape: Shape, host: (*mut u8, u64, u64), stream: u64, mode: Mode) -> CudaResult<()> {
    if let Some(channel) = client.channel() {
        if !in_place(client, channel, &shape, host, false, stream)? {
            for piece in pieces(shape.width, shape.height, shape.depth, SLOT as u64) {
                let slot = channel.take_slot()?;
                // SAFETY: the slot is `SLOT` bytes of the segment held by this copy alone and the
                // piece is at most that; the host rows are the app's (this function's contract).
                unsafe { move_rows(host, shape.src_pos, piece, channel.ptr(slot.offset), true) };
                let copy = piece_copy(&shape, piece, false, None);
                let sent =
                    client.post(req::ShmCopyShaped { copy, offset: slot.offset as u64, stream }).and_then(|()| fence(client, stream));
                match sent {
                    Ok(fence) => channel.give_back(slot.index, Some(fence)),
                    Err(error) => {
                        channel.give_back(slot.index, None);
                        return Err(error);
                    }
                }
            }
        }
    } else {
        if mode == Mode::Asynchronous && client.graphs.host_functions_pending() && client.host_allocation(host.0 as usize).is_some() {
            // Pinned memory is read when the copy runs, after host functions queued before it.
            client.graphs.wait_for_host_functions();
        }
        let chunk = client.info.copy_chunk.max(4096);
        for piece in pieces(shape.width, shape.height, shape.depth, chunk) {
            let mut packed = vec![0u8; piece.len() as usize];
            // SAFETY: `packed` holds the piece; the host rows are the app's.
            unsafe { move_rows(host, shape.src_pos, piece, packed.as_mut_ptr(), true) };
            let request = req::MemcpyHtoShaped { copy: piece_copy(&shape, piece, false, None), stream };
            client.conn().send_async(&request.into(), &packed)?;
        }
    }
    match mode {
        Mode::Synchronous => client.sync_stream(stream),
        Mode::Asynchronous => client.conn().flush(),
    }
}

/// Sends a fence for `stream` and returns its reply slot (answered when the stream's queued work
/// is done).
fn fence(client: &Client, stream: u64) -> CudaResult<Arc<ReplySlot>> {
    let fence = client.conn().send_for_reply(&req::ShmFence { stream }.into(), None)?;
    client.conn().flush()?;
    Ok(fence)
}

/// Device or array to host. Over a socket the call returns once the bytes are in place, as for
/// pageable memory (also for pinned memory: rows land by unpacking here).
///
/// # Safety
/// As [`copy`].
unsafe fn to_host(client: &Client, shape: Shape, host: (*mut u8, u64, u64), stream: u64, mode: Mode) -> CudaResult<()> {
    if let Some(channel) = client.channel() {
        if in_place(client, channel, &shape, host, true, stream)? {
            return match mode {
                Mode::Synchronous => client.sync_stream(stream),
                Mode::Asynchronous => client.conn().flush(),
            };
        }
        let mut in_flight: VecDeque<(HeldSlot, Piece, Arc<ReplySlot>)> = VecDeque::new();
        let finish = |(slot, piece, fence): (HeldSlot, Piece, Arc<ReplySlot>)| {
            let landed =
                fence.wait().and_then(|message| decode_reply::<rep::ShmFence>(&message).map_err(|_| CudaError::UNKNOWN)?.result.map(drop));
            if landed.is_ok() {
                // SAFETY: the fence says the DMA into the slot is done; the rows are the app's.
                unsafe { move_rows(host, shape.dst_pos, piece, channel.ptr(slot.offset), false) };
            }
            channel.give_back(slot.index, None);
            landed
        };
        let mut outcome = Ok(());
        for piece in pieces(shape.width, shape.height, shape.depth, SLOT as u64) {
            if outcome.is_err() {
                break;
            }
            let slot = loop {
                match channel.try_take_slot() {
                    Some(slot) => break slot,
                    None => match in_flight.pop_front() {
                        Some(oldest) => outcome = outcome.and(finish(oldest)),
                        None => break channel.take_slot(),
                    },
                }
            }?;
            let copy = piece_copy(&shape, piece, true, None);
            match client.post(req::ShmCopyShaped { copy, offset: slot.offset as u64, stream }).and_then(|()| fence(client, stream)) {
                Ok(fence) => in_flight.push_back((slot, piece, fence)),
                Err(error) => {
                    channel.give_back(slot.index, None);
                    outcome = Err(error);
                }
            }
        }
        for entry in in_flight {
            outcome = outcome.and(finish(entry));
        }
        outcome?;
        return if mode == Mode::Synchronous { client.sync_stream(stream) } else { Ok(()) };
    }
    let chunk = client.info.copy_chunk.max(4096);
    let all = pieces(shape.width, shape.height, shape.depth, chunk);
    let last = all.len().saturating_sub(1);
    let mut in_flight: VecDeque<(Vec<u8>, Piece, Arc<ReplySlot>)> = VecDeque::new();
    let mut outcome = Ok(());
    let mut deferred = None;
    let mut finish = |(packed, piece, slot): (Vec<u8>, Piece, Arc<ReplySlot>)| -> CudaResult<()> {
        let reply = slot.wait().and_then(|message| decode_reply::<rep::MemcpyShapedToH>(&message).map_err(|_| CudaError::UNKNOWN))?;
        deferred = deferred.or(reply.deferred);
        reply.result?;
        // SAFETY: the reply's bulk filled `packed`; the rows are the app's.
        unsafe { move_rows(host, shape.dst_pos, piece, packed.as_ptr().cast_mut(), false) };
        Ok(())
    };
    for (index, piece) in all.into_iter().enumerate() {
        if in_flight.len() >= WINDOW
            && let Some(oldest) = in_flight.pop_front()
        {
            outcome = outcome.and(finish(oldest));
        }
        if outcome.is_err() {
            break;
        }
        let mut packed = vec![0u8; piece.len() as usize];
        // SAFETY: `packed` is written only by the receiver, once, for this reply, and outlives it
        // (it is kept in `in_flight` until the reply was waited for).
        let destination = unsafe { HostDestination::new(packed.as_mut_ptr(), packed.len()) };
        let request = req::MemcpyShapedToH {
            copy: piece_copy(&shape, piece, true, None),
            stream,
            blocking: index == last && mode == Mode::Synchronous,
        };
        match client.conn().send_for_reply(&request.into(), Some(destination)) {
            Ok(slot) => in_flight.push_back((packed, piece, slot)),
            Err(error) => outcome = Err(error),
        }
        client.conn().flush()?;
    }
    for entry in in_flight {
        outcome = outcome.and(finish(entry));
    }
    outcome?;
    match mode {
        Mode::Synchronous => deferred.or_else(|| client.conn().take_deferred()).map_or(Ok(()), Err),
        Mode::Asynchronous => {
            if let Some(error) = deferred {
                client.conn().defer(error);
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covered(pieces: &[Piece], width: u64, height: u64, depth: u64) -> Vec<u8> {
        let mut seen = vec![0u8; (width * height * depth) as usize];
        for piece in pieces {
            for z in 0..piece.depth {
                for y in 0..piece.height {
                    for x in 0..piece.width {
                        let (x, y, z) = (piece.offset.x + x, piece.offset.y + y, piece.offset.z + z);
                        seen[((z * height + y) * width + x) as usize] += 1;
                    }
                }
            }
        }
        seen
    }

    #[test]
    fn pieces_cover_every_byte_once_and_fit_the_chunk() {
        for (width, height, depth, chunk) in
            [(10, 7, 3, 64), (10, 7, 3, 5), (10, 7, 3, 1000), (10, 7, 3, 150), (1, 1, 1, 4), (33, 5, 1, 32)]
        {
            let cut = pieces(width, height, depth, chunk);
            assert!(cut.iter().all(|piece| piece.len() <= chunk && piece.len() > 0), "{width}x{height}x{depth} / {chunk}");
            assert!(covered(&cut, width, height, depth).iter().all(|count| *count == 1), "{width}x{height}x{depth} / {chunk}");
        }
        assert!(pieces(0, 3, 3, 64).is_empty());
    }

    #[test]
    fn whole_slices_travel_together_when_they_fit() {
        let cut = pieces(16, 4, 10, 16 * 4 * 3);
        assert_eq!(cut.len(), 4);
        assert_eq!(cut[0], Piece { offset: Pos3::default(), width: 16, height: 4, depth: 3 });
        assert_eq!(cut[3].depth, 1);
    }
}
