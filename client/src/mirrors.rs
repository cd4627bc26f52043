//! `__managed__` variables. The server's driver places a module's managed variable at an address
//! of its own process, and device code names that address; host code reaches the variable through
//! the pointer the driver API returns for it. So the app gets a mirror: private pages mapped at the
//! same address in this process, kept coherent at the points where CUDA's own managed memory must
//! be coherent for a program without concurrent access:
//!
//! - before a kernel or graph launch, bytes the host changed since the last exchange are sent
//!   (compared against a snapshot of what both sides last agreed on);
//! - after a synchronizing call that follows a launch or memset (a device, stream or event
//!   synchronize or a successful query, until a device synchronize), the device's bytes are
//!   fetched and those that changed on the device replace the mirror's, so host writes made
//!   meanwhile to other bytes survive.
//!
//! Copies to and from the variable's address reach the mirror, as host memory (the runtime's
//! symbol copies included); a memset or a stream memory operation is done on the device and
//! fetched at the next sync (host changes are sent before stream memory operations too).
//!
//! Mapped pinned memory (`cuMemHostAlloc` with `CU_MEMHOSTALLOC_DEVICEMAP`, as cuDNN asks for it)
//! and managed allocations (`cuMemAllocManaged`, `managed.rs`) are mirrored the same way when
//! they cannot be blocks of the shared-memory segment (the GPU on another host): device memory on
//! the server, whose address is the pointer the app gets for both sides, with the mirror's pages
//! at that address here ([`Client::mirror_alloc`]). Kernels and the host see each other's writes
//! at launches and synchronizations, not while a kernel runs: a kernel that waits for the host to
//! write the memory meanwhile waits forever. Copies take mirrored managed memory as device memory
//! (the host's changes sent first, the device's fetched at the next sync point); memsets of any
//! mirror send the host's changes first.
//!
//! Cost: an exchange compares page by page against the snapshot and sends only runs of changed
//! pages, in pieces of the connection's copy chunk; a fetch reads the device's bytes piece by
//! piece (nothing is fetched unless device work may have written since the last fetch) and writes
//! only the bytes the device changed. The snapshot (as large as the mirror) goes when it is freed.
//!
//! A mirror with device memory of its own takes whole 2 MiB chunks; managed allocations up to
//! 1 MiB share such blocks (whole pages each, first fit), so many small ones do not take 2 MiB of
//! device memory each. A block goes with its last allocation; `cuMemFree` of any other address
//! inside a block is refused in the front, so the server never frees a block under live memory.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::req;

use crate::client::{Client, HostAllocation};
use crate::conn::HostDestination;

const PAGE: u64 = 4096;

/// `CU_STREAM_NON_BLOCKING`: the mirrors' stream waits for no other stream's work.
const NON_BLOCKING: u32 = 1;

struct Mirror {
    module: u32,
    address: u64,
    /// What host and device last agreed the variable holds.
    snapshot: Vec<u8>,
    /// Mapped pinned memory rather than a module's variable.
    allocation: Option<MirroredAllocation>,
}

/// The device memory behind mirrored mapped or managed memory, and the mirror's pages.
struct MirroredAllocation {
    /// What `Malloc` returned (the mirror starts at its first 2 MiB boundary).
    device_base: u64,
    /// Bytes of the mirror's mapping at the mirror's address.
    mapped_len: usize,
    /// Managed memory (freed with `cuMemFree`), not mapped pinned memory (`cuMemFreeHost`).
    managed: bool,
    /// A block small managed allocations share: each one's offset and length (whole pages). The
    /// block goes when its last allocation is freed. `None`: one allocation, at the start.
    pieces: Option<BTreeMap<usize, usize>>,
}

/// Managed allocations up to this size share 2 MiB blocks (a block each would take 2 MiB of
/// device memory per allocation).
const SHARED_MAX: usize = (CHUNK / 2) as usize;

/// A free place of `need` bytes among `pieces` of a block of `len` bytes: first fit.
fn free_place(pieces: &BTreeMap<usize, usize>, len: usize, need: usize) -> Option<usize> {
    let mut cursor = 0;
    for (&offset, &piece) in pieces {
        if offset - cursor >= need {
            return Some(cursor);
        }
        cursor = offset + piece;
    }
    (len - cursor >= need).then_some(cursor)
}

/// Mirrored mapped memory takes whole 2 MiB chunks: no other device range shares them, so the
/// chunks this process reserves for device ranges (`ranges.rs`) never meet the mirror's pages.
const CHUNK: u64 = 2 << 20;

fn round_up(value: u64, align: u64) -> Option<u64> {
    value.checked_add(align - 1).map(|value| value / align * align)
}

/// Maps `len` bytes of private memory at exactly `address`; false if anything is there already.
fn map_pages(address: u64, len: usize) -> bool {
    // SAFETY: a private anonymous mapping at an address the kernel checks is free
    // (MAP_FIXED_NOREPLACE never replaces an existing mapping).
    let mapped = unsafe {
        libc::mmap(
            address as usize as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if mapped as usize as u64 == address {
        return true;
    }
    if mapped != libc::MAP_FAILED {
        // SAFETY: the mapping just made (an old kernel placed it elsewhere).
        unsafe { libc::munmap(mapped, len) };
    }
    false
}

fn unmap_pages(allocation: &MirroredAllocation, address: u64) {
    // SAFETY: the mirror's own mapping, made by `map_pages`, unmapped once, when the mirror goes.
    unsafe { libc::munmap(address as usize as *mut libc::c_void, allocation.mapped_len) };
}

#[derive(Default)]
struct State {
    mirrors: Vec<Mirror>,
    /// Pages mapped for mirrors (variables may share a page).
    pages: BTreeSet<u64>,
    /// The streams exchanges run on, one per session device (the server's index), each made at
    /// the device's first: a memset must run on a stream of its memory's device.
    streams: Vec<(u32, u64)>,
    /// Where one piece of a mirror's device bytes is read to be compared with its snapshot.
    /// Reused, at most one copy chunk long.
    scratch: Vec<u8>,
}

#[derive(Default)]
pub struct Mirrors {
    state: Mutex<State>,
    /// Whether any mirror exists (the launch and sync paths check only this when none does).
    any: AtomicBool,
    /// The device may have written a mirrored variable since the last fetch.
    device_dirty: AtomicBool,
}

/// The bytes that changed on the device since the last exchange: `(offset, device's byte)`.
fn device_changes<'a>(snapshot: &'a [u8], device: &'a [u8]) -> impl Iterator<Item = (usize, u8)> + 'a {
    snapshot.iter().zip(device).enumerate().filter(|(_, (agreed, theirs))| agreed != theirs).map(|(offset, (_, theirs))| (offset, *theirs))
}

/// The runs of whole pages (the last one possibly short) at `current` that differ from
/// `snapshot`, which takes their bytes.
///
/// # Safety
/// `current` is readable for `snapshot.len()` bytes. It is read as raw memory, a page at a time,
/// and what was read is what the snapshot keeps (the app's threads may be writing meanwhile).
unsafe fn take_changed_pages(current: *const u8, snapshot: &mut [u8]) -> Vec<std::ops::Range<usize>> {
    let len = snapshot.len();
    let mut page = [0u8; PAGE as usize];
    let mut runs = Vec::new();
    let mut run_start = None;
    for offset in (0..len).step_by(PAGE as usize) {
        let end = (offset + PAGE as usize).min(len);
        let read = &mut page[..end - offset];
        // SAFETY: `offset..end` lies inside the `len` readable bytes (this function's contract).
        unsafe { std::ptr::copy_nonoverlapping(current.add(offset), read.as_mut_ptr(), read.len()) };
        if *read != snapshot[offset..end] {
            snapshot[offset..end].copy_from_slice(read);
            run_start.get_or_insert(offset);
        } else if let Some(start) = run_start.take() {
            runs.push(start..offset);
        }
    }
    if let Some(start) = run_start {
        runs.push(start..len);
    }
    runs
}

impl Mirrors {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a mirror with device memory of its own (mapped or managed) holds `ptr`.
    pub fn holds_allocation(&self, ptr: u64) -> bool {
        self.any.load(Ordering::Relaxed)
            && self.lock().mirrors.iter().any(|mirror| {
                mirror.allocation.as_ref().is_some_and(|allocation| ptr.wrapping_sub(mirror.address) < allocation.mapped_len as u64)
            })
    }

    /// Whether a launch or memset may have changed a mirrored variable on the device.
    pub fn note_device_write(&self) {
        if self.any.load(Ordering::Relaxed) {
            self.device_dirty.store(true, Ordering::Release);
        }
    }

    /// Forgets the mirrors of an unloaded module (their pages stay mapped: the app may still hold
    /// pointers into them, as natively it holds pointers into freed managed memory).
    pub fn forget_module(&self, client: &Client, module: u32) {
        let mut state = self.lock();
        let (gone, kept): (Vec<Mirror>, Vec<Mirror>) =
            std::mem::take(&mut state.mirrors).into_iter().partition(|m| m.module == module && m.allocation.is_none());
        state.mirrors = kept;
        self.any.store(!state.mirrors.is_empty(), Ordering::Relaxed);
        drop(state);
        forget_ranges(client, &gone);
    }

    /// Forgets every mirror (a device reset: modules are loaded again and variables may move;
    /// mapped memory goes with the context, as natively).
    pub fn forget_all(&self, client: &Client) {
        let mut state = self.lock();
        let gone = std::mem::take(&mut state.mirrors);
        state.streams.clear();
        self.any.store(false, Ordering::Relaxed);
        drop(state);
        for mirror in &gone {
            if let Some(allocation) = &mirror.allocation {
                unmap_pages(allocation, mirror.address);
            }
        }
        forget_ranges(client, &gone);
    }
}

fn forget_ranges(client: &Client, gone: &[Mirror]) {
    let mut allocations = client.host_allocations.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for mirror in gone {
        allocations.remove(&(mirror.address as usize));
        client.managed.forget_mirror(mirror.address);
    }
}

impl Client {
    /// The mirrors' stream, made at first use.
    fn mirror_stream(&self, state: &mut State) -> CudaResult<u64> {
        let device = crate::devices::thread_device();
        if let Some(&(_, stream)) = state.streams.iter().find(|(of, _)| *of == device) {
            return Ok(stream);
        }
        let stream = self.new_stream_id();
        self.post(req::StreamCreate { stream, flags: NON_BLOCKING, priority: 0 })?;
        state.streams.push((device, stream));
        Ok(stream)
    }

    /// Sets up the mirror of module `module`'s managed variable at `address` (`size` bytes) and
    /// fills it from the device. Fails with `NOT_SUPPORTED` when the address is taken here.
    pub fn mirror_variable(&self, module: u32, address: u64, size: u64) -> CudaResult<()> {
        let mut state = self.mirrors.lock();
        if state.mirrors.iter().any(|mirror| mirror.address == address) {
            return Ok(());
        }
        let len = usize::try_from(size).map_err(|_| CudaError::INVALID_VALUE)?;
        let end = address.checked_add(size.max(1)).ok_or(CudaError::INVALID_VALUE)?;
        let first = address / PAGE * PAGE;
        for page in (first..end).step_by(PAGE as usize) {
            if state.pages.contains(&page) {
                continue;
            }
            if !map_pages(page, PAGE as usize) {
                crate::diagnostics::once(
                    "managed-variable-address",
                    &format!(
                        "flyt: a __managed__ variable's address {address:#x} is taken in this process: it cannot be mirrored (returning CUDA_ERROR_NOT_SUPPORTED)"
                    ),
                );
                return Err(CudaError::NOT_SUPPORTED);
            }
            state.pages.insert(page);
        }
        let stream = self.mirror_stream(&mut state)?;
        let mut snapshot = vec![0u8; len];
        self.read_variable(address, &mut snapshot, stream)?;
        // SAFETY: the mirror's pages were mapped above, writable, for `len` bytes at `address`.
        unsafe { std::ptr::copy_nonoverlapping(snapshot.as_ptr(), address as usize as *mut u8, len) };
        state.mirrors.push(Mirror { module, address, snapshot, allocation: None });
        self.mirrors.any.store(true, Ordering::Relaxed);
        drop(state);
        self.host_allocations.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(
            address as usize,
            HostAllocation { len: len.max(1), flags: 0, segment_offset: None, registered: false, device_mapped: true, managed: true },
        );
        self.managed.add_mirror(address, size);
        Ok(())
    }

    /// Mapped pinned memory (or, `managed`, managed memory) of `size` bytes without the
    /// shared-memory channel (see the module's comment): device memory in whole 2 MiB chunks,
    /// zeroed, with the mirror's pages at its address. A place where this process has memory
    /// already is kept aside while another is tried, as for any device allocation
    /// (`client::place_off_host`).
    /// Managed allocations of at most [`SHARED_MAX`] bytes take whole pages of shared blocks.
    pub fn mirror_alloc(&self, size: usize, flags: u32, managed: bool) -> CudaResult<*mut u8> {
        let shared = managed && size <= SHARED_MAX;
        let address = match shared.then(|| self.place_in_shared_block(size)).flatten() {
            Some(address) => address,
            None => self.new_mirrored_block(size, managed, shared)?,
        };
        if managed {
            crate::diagnostics::once(
                "mirrored-managed-memory",
                "flyt: managed memory without the shared-memory channel: kernels and the host see each other's writes at launches, copies and synchronizations only (concurrentManagedAccess reads 0)",
            );
        } else {
            crate::diagnostics::once(
                "mirrored-mapped-memory",
                "flyt: mapped host memory without the shared-memory channel: kernels and the host see each other's writes at launches and synchronizations only",
            );
        }
        self.host_allocations.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(
            address as usize,
            HostAllocation { len: size.max(1), flags, segment_offset: None, registered: false, device_mapped: true, managed },
        );
        Ok(address as usize as *mut u8)
    }

    /// Whole pages for `size` bytes in a shared block with room, zeroed; `None` if none has room.
    fn place_in_shared_block(&self, size: usize) -> Option<u64> {
        let need = round_up(size.max(1) as u64, PAGE)? as usize;
        let mut state = self.mirrors.lock();
        for mirror in state.mirrors.iter_mut() {
            let Some(allocation) = mirror.allocation.as_mut() else { continue };
            let mapped_len = allocation.mapped_len;
            let Some(pieces) = allocation.pieces.as_mut() else { continue };
            let Some(offset) = free_place(pieces, mapped_len, need) else { continue };
            pieces.insert(offset, need);
            let address = mirror.address + offset as u64;
            // A freed allocation's bytes may be there: zeroed as a host write (sent at the next
            // exchange), as a new block is zero.
            // SAFETY: inside the block's mapping, which lives while the block is listed.
            unsafe { std::ptr::write_bytes(address as usize as *mut u8, 0, need) };
            return Some(address);
        }
        None
    }

    /// A new mirrored block for `size` bytes (`shared`: a 2 MiB block small managed allocations
    /// share, this one at its start): its address.
    fn new_mirrored_block(&self, size: usize, managed: bool, shared: bool) -> CudaResult<u64> {
        let mapped = round_up(size.max(1) as u64, CHUNK).ok_or(CudaError::MEMORY_ALLOCATION)?;
        let mapped_len = usize::try_from(mapped).map_err(|_| CudaError::MEMORY_ALLOCATION)?;
        let (device_base, address) = crate::client::place_off_host(
            || self.chunk_aligned_allocation(mapped),
            |(_, address)| map_pages(address, mapped_len),
            |(_, address)| address,
            |(device_base, _)| {
                let _ = self.call_plain(req::Free { ptr: device_base });
            },
        )?;
        let pieces = shared.then(|| BTreeMap::from([(0, round_up(size.max(1) as u64, PAGE).unwrap_or(PAGE) as usize)]));
        let allocation = MirroredAllocation { device_base, mapped_len, managed, pieces };
        let mut state = self.mirrors.lock();
        // The mirror's pages are zero: so is the device's side, from the start.
        let zeroed = self.mirror_stream(&mut state).and_then(|stream| {
            self.post(req::Memset { dst: address, pattern: 0, width: 1, len: mapped, stream })?;
            self.call_plain(req::StreamSynchronize { stream }).map(drop)
        });
        if let Err(error) = zeroed {
            drop(state);
            unmap_pages(&allocation, address);
            let _ = self.call_plain(req::Free { ptr: device_base });
            return Err(error);
        }
        // A shared block's snapshot covers all of it: later allocations use the rest.
        let snapshot = vec![0; if shared { mapped_len } else { size }];
        state.mirrors.push(Mirror { module: 0, address, snapshot, allocation: Some(allocation) });
        self.mirrors.any.store(true, Ordering::Relaxed);
        Ok(address)
    }

    /// Device memory of `len` bytes (whole chunks) starting on a chunk boundary: the allocation's
    /// own start and that boundary.
    fn chunk_aligned_allocation(&self, len: u64) -> CudaResult<(u64, u64)> {
        let ptr = self.call_plain(req::Malloc { size: len })?.ptr;
        if ptr.is_multiple_of(CHUNK) {
            return Ok((ptr, ptr));
        }
        self.call_plain(req::Free { ptr })?;
        let ptr = self.call_plain(req::Malloc { size: len + CHUNK })?.ptr;
        Ok((ptr, round_up(ptr, CHUNK).ok_or(CudaError::MEMORY_ALLOCATION)?))
    }

    /// Frees mapped (or, `managed`, managed) memory [`Client::mirror_alloc`] made at `address`;
    /// `None` if there is none there. Its snapshot goes with it.
    pub fn free_mirrored(&self, address: u64, managed: bool) -> Option<CudaResult<()>> {
        let mut state = self.mirrors.lock();
        let index = state.mirrors.iter().position(|mirror| {
            mirror.allocation.as_ref().is_some_and(|allocation| {
                allocation.managed == managed
                    && match &allocation.pieces {
                        None => mirror.address == address,
                        Some(pieces) => address
                            .checked_sub(mirror.address)
                            .is_some_and(|offset| pieces.contains_key(&usize::try_from(offset).unwrap_or(usize::MAX))),
                    }
            })
        })?;
        let mirror = &mut state.mirrors[index];
        if let Some(pieces) = mirror.allocation.as_mut().and_then(|allocation| allocation.pieces.as_mut()) {
            pieces.remove(&((address - mirror.address) as usize));
            if !pieces.is_empty() {
                // The block stays for its other allocations.
                drop(state);
                self.host_allocations.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&(address as usize));
                return Some(Ok(()));
            }
        }
        let block = mirror.address;
        let mirror = state.mirrors.swap_remove(index);
        self.mirrors.any.store(!state.mirrors.is_empty(), Ordering::Relaxed);
        drop(state);
        self.host_allocations.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&(address as usize));
        let allocation = mirror.allocation?;
        unmap_pages(&allocation, block);
        Some(self.call_plain(req::Free { ptr: allocation.device_base }).map(drop))
    }

    /// The most bytes one exchange message carries.
    fn mirror_chunk(&self) -> usize {
        usize::try_from(self.info.copy_chunk.max(PAGE)).unwrap_or(PAGE as usize)
    }

    /// Reads `bytes.len()` bytes of the device at `address` on the mirrors' stream, a copy chunk
    /// at a time.
    fn read_variable(&self, address: u64, bytes: &mut [u8], stream: u64) -> CudaResult<()> {
        let chunk = self.mirror_chunk();
        for (index, piece) in bytes.chunks_mut(chunk).enumerate() {
            // SAFETY: `piece` is ours and outlives the call, which waits for the copy.
            let destination = unsafe { HostDestination::new(piece.as_mut_ptr(), piece.len()) };
            let request = req::MemcpyDtoH { src: address + (index * chunk) as u64, len: piece.len() as u64, stream, blocking: true };
            self.call_into(request, destination)?;
        }
        Ok(())
    }

    /// Sends the pages of every mirror the host changed since the last exchange (runs of changed
    /// pages, a copy chunk at a time) and waits until the device has them. The snapshot takes the
    /// bytes sent. True if anything was sent.
    fn send_host_changes_locked(&self, state: &mut State) -> CudaResult<bool> {
        let stream = self.mirror_stream(state)?;
        // On the mirrors' stream's server, whichever device is current (a spread session).
        self.on_handle_server(stream, || self.send_host_changes_on(state, stream))
    }

    fn send_host_changes_on(&self, state: &mut State, stream: u64) -> CudaResult<bool> {
        let chunk = self.mirror_chunk();
        let mut sent = false;
        for mirror in state.mirrors.iter_mut() {
            // SAFETY: the mirror's pages stay mapped while it is listed, `snapshot.len()` bytes
            // from its address.
            let runs = unsafe { take_changed_pages(mirror.address as usize as *const u8, &mut mirror.snapshot) };
            for run in runs {
                for (index, piece) in mirror.snapshot[run.clone()].chunks(chunk).enumerate() {
                    let dst = mirror.address + (run.start + index * chunk) as u64;
                    self.conn().send_async(&req::MemcpyHtoD { dst, stream }.into(), piece)?;
                }
                sent = true;
            }
        }
        if sent {
            self.call_plain(req::StreamSynchronize { stream })?;
        }
        Ok(sent)
    }

    /// Before device work that reads or writes mirrored memory other than a launch (a copy, a
    /// memset, a prefetch to the device): sends the host's changes, so the device has them first
    /// and a later exchange cannot overwrite what the work writes.
    pub fn send_host_changes(&self) -> CudaResult<()> {
        if !self.mirrors.any.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.send_host_changes_locked(&mut self.mirrors.lock()).map(drop)
    }

    /// Before a launch: sends the bytes of each variable the host changed, and waits until the
    /// device has them (the launch may run on any stream).
    pub fn push_mirrors(&self) -> CudaResult<()> {
        if !self.mirrors.any.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.send_host_changes_locked(&mut self.mirrors.lock())?;
        self.mirrors.device_dirty.store(true, Ordering::Release);
        Ok(())
    }

    /// After a synchronizing call: fetches the variables the device may have written. Only a
    /// device-wide synchronization (`whole_device`) ends the need: after a stream's or an event's,
    /// other streams' kernels may still write, so the next sync point fetches again.
    pub fn pull_mirrors(&self, whole_device: bool) -> CudaResult<()> {
        let dirty = if whole_device {
            self.mirrors.device_dirty.swap(false, Ordering::AcqRel)
        } else {
            self.mirrors.device_dirty.load(Ordering::Acquire)
        };
        if !dirty {
            return Ok(());
        }
        let mut state = self.mirrors.lock();
        let stream = self.mirror_stream(&mut state)?;
        // On the mirrors' stream's server, whichever device is current (a spread session).
        self.on_handle_server(stream, || self.pull_mirrors_on(&mut state, stream))
    }

    fn pull_mirrors_on(&self, state: &mut State, stream: u64) -> CudaResult<()> {
        let chunk = self.mirror_chunk();
        let State { mirrors, scratch, .. } = state;
        for mirror in mirrors.iter_mut() {
            for (index, agreed) in mirror.snapshot.chunks_mut(chunk).enumerate() {
                let offset = index * chunk;
                scratch.resize(agreed.len(), 0);
                self.read_variable(mirror.address + offset as u64, scratch, stream)?;
                if *scratch == *agreed {
                    continue;
                }
                // Only the device's changes are written: the app's threads may be writing other
                // bytes of the mirror meanwhile, so it is written as raw memory, never borrowed.
                for (at, byte) in device_changes(agreed, scratch) {
                    // SAFETY: inside the mirror, whose pages stay mapped while it is listed.
                    unsafe { (mirror.address as usize as *mut u8).add(offset + at).write(byte) };
                }
                agreed.copy_from_slice(scratch);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a fetch does: the bytes that changed on the device replace the mirror's, and the
    /// snapshot becomes the device's bytes.
    fn merge(mirror: &mut [u8], snapshot: &mut Vec<u8>, device: &[u8]) {
        for (offset, byte) in device_changes(snapshot, device) {
            mirror[offset] = byte;
        }
        *snapshot = device.to_vec();
    }

    #[test]
    fn shared_blocks_place_first_fit_in_whole_pages() {
        let page = PAGE as usize;
        let mut pieces = BTreeMap::new();
        assert_eq!(free_place(&pieces, 4 * page, 4 * page), Some(0));
        assert_eq!(free_place(&pieces, 4 * page, 5 * page), None);
        pieces.insert(0, page);
        pieces.insert(2 * page, page);
        // The hole between the two, then the end.
        assert_eq!(free_place(&pieces, 4 * page, page), Some(page));
        assert_eq!(free_place(&pieces, 4 * page, 2 * page), None);
        pieces.insert(page, page);
        assert_eq!(free_place(&pieces, 4 * page, page), Some(3 * page));
        pieces.insert(3 * page, page);
        assert_eq!(free_place(&pieces, 4 * page, page), None);
    }

    #[test]
    fn only_runs_of_changed_pages_are_taken() {
        let page = PAGE as usize;
        // Five pages and a bit: the last page is short.
        let len = 5 * page + 100;
        let mut host = vec![0u8; len];
        let mut snapshot = host.clone();
        // SAFETY: `host` holds `len` bytes.
        let take = |host: &[u8], snapshot: &mut Vec<u8>| unsafe { take_changed_pages(host.as_ptr(), snapshot) };
        assert!(take(&host, &mut snapshot).is_empty());
        // Pages 1 and 2 (one run), page 4, and the short last page (one run with page 4).
        host[page + 5] = 1;
        host[3 * page - 1] = 2;
        host[4 * page] = 3;
        host[len - 1] = 4;
        assert_eq!(take(&host, &mut snapshot), [page..3 * page, 4 * page..len]);
        assert_eq!(snapshot, host);
        // Nothing changed since: nothing to send.
        assert!(take(&host, &mut snapshot).is_empty());
        host[0] = 9;
        assert_eq!(take(&host, &mut snapshot), vec![std::ops::Range { start: 0, end: page }]);
    }

    #[test]
    fn device_changes_win_and_host_changes_to_other_bytes_survive() {
        let mut snapshot = vec![1, 2, 3, 4];
        // The host wrote byte 0; the device wrote byte 3.
        let mut mirror = vec![9, 2, 3, 4];
        merge(&mut mirror, &mut snapshot, &[1, 2, 3, 7]);
        assert_eq!(mirror, [9, 2, 3, 7]);
        assert_eq!(snapshot, [1, 2, 3, 7]);
        // Both wrote byte 1: the device's write is the later one (the sync follows it).
        let mut mirror = vec![9, 5, 3, 7];
        merge(&mut mirror, &mut snapshot, &[1, 6, 3, 7]);
        assert_eq!(mirror, [9, 6, 3, 7]);
    }
}
