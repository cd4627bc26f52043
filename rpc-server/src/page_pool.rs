//! Host memory for paging (`docs/design/paging.md`), pinned ahead of need: one memory file per
//! server, cut in chunks (256 MiB by default). The listener makes it and fills its pages in the
//! background up to the host budget (`--page-host-budget`); every worker maps it and pins
//! (registers) the filled chunks in a background thread of its own, while it waits for a session
//! or serves one. A page-out then copies into chunks it takes (device to pinned host memory at
//! the copy engines' speed) and its page-in copies back and gives them to the next page-out:
//! nothing is allocated or pinned while a request waits. Past the pool, paged memory goes to a
//! memory file of its own (`crate::paging`).
//!
//! The file starts with a header of words every process maps: the chunk size, the chunks the
//! file holds, how many the listener means to fill and has filled, and each chunk's owner (the
//! budget slot + 1 of the worker whose paged-out session holds it, 0 when free). A dead worker's
//! chunks go back (`reclaim`).

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::backend::Device;

/// Chunk size unless `--page-chunk` says otherwise.
pub const DEFAULT_CHUNK: u64 = 256 << 20;
/// The header: words, then the chunks from here (2 MiB: huge-page aligned).
const HEADER: u64 = 2 << 20;
const MAGIC: u64 = u64::from_le_bytes(*b"flytpool");
const W_MAGIC: usize = 0;
const W_CHUNK: usize = 1;
const W_CHUNKS: usize = 2;
/// Chunks the listener fills; `UNKNOWN` until it knows the device's share (the first worker).
const W_TARGET: usize = 3;
const W_FILLED: usize = 4;
const OWNERS: usize = 8;
/// Most chunks one pool holds (2 TiB of 8 MiB chunks, 64 TiB of 256 MiB ones).
pub const MAX_CHUNKS: usize = HEADER as usize / 8 - OWNERS;
const UNKNOWN: u64 = u64::MAX;
/// Most threads filling the pool at once.
const FILL_THREADS: usize = 8;
/// How often a worker looks for chunks filled since.
const POLL: Duration = Duration::from_millis(20);

/// One process's view of the server's paging pool.
pub struct HostPool {
    file: std::fs::File,
    header: memmap2::MmapRaw,
    /// The chunks, mapped (workers only).
    data: Option<memmap2::MmapRaw>,
    chunk: u64,
    chunks: usize,
    /// Chunks pinned in this process: always the first ones.
    pinned: AtomicUsize,
    /// Bytes pinned ahead by this process (the emulated device's "pinned" memory too).
    pinned_bytes: AtomicU64,
    /// Which pinning thread is current (a device reset starts another); held while pinning.
    pinning: std::sync::Mutex<u64>,
}

fn map_header(file: &std::fs::File) -> Result<memmap2::MmapRaw, String> {
    memmap2::MmapOptions::new().len(HEADER as usize).map_raw(file).map_err(|error| format!("mapping the paging pool: {error}"))
}

impl HostPool {
    /// The listener's pool: `budget` bytes at most, in chunks of `chunk`; nothing filled yet.
    /// `None` when the budget holds no whole chunk.
    pub fn create(budget: u64, chunk: u64) -> Result<Option<Self>, String> {
        if chunk == 0 || !chunk.is_multiple_of(4096) {
            return Err(format!("paging chunk of {chunk} bytes: not a whole number of 4 KiB pages"));
        }
        let chunks = usize::try_from(budget / chunk).unwrap_or(usize::MAX).min(MAX_CHUNKS);
        if chunks == 0 {
            return Ok(None);
        }
        let fd = nix::sys::memfd::memfd_create(c"flyt-page-pool", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
            .map_err(|error| format!("no memory file for the paging pool: {error}"))?;
        let file = std::fs::File::from(fd);
        // Sparse: pages come as the filler (or a copy) writes them.
        file.set_len(HEADER + chunks as u64 * chunk).map_err(|error| format!("sizing the paging pool: {error}"))?;
        let pool = Self::with_header(file, map_header, None, chunk, chunks)?;
        let words = pool.words();
        words[W_CHUNK].store(chunk, Ordering::Release);
        words[W_CHUNKS].store(chunks as u64, Ordering::Release);
        words[W_TARGET].store(UNKNOWN, Ordering::Release);
        words[W_MAGIC].store(MAGIC, Ordering::Release);
        Ok(Some(pool))
    }

    fn with_header(
        file: std::fs::File,
        map: impl Fn(&std::fs::File) -> Result<memmap2::MmapRaw, String>,
        data: Option<memmap2::MmapRaw>,
        chunk: u64,
        chunks: usize,
    ) -> Result<Self, String> {
        let header = map(&file)?;
        Ok(Self {
            file,
            header,
            data,
            chunk,
            chunks,
            pinned: AtomicUsize::new(0),
            pinned_bytes: AtomicU64::new(0),
            pinning: std::sync::Mutex::new(0),
        })
    }

    /// A worker's view of the listener's pool (its memory file), with the chunks mapped.
    pub fn open(file: std::fs::File) -> Result<Self, String> {
        let header = map_header(&file)?;
        // SAFETY: the header is HEADER bytes of shared memory, aligned to a page; its words are
        // only ever used as atomics, by every process that maps them.
        let words = unsafe { std::slice::from_raw_parts(header.as_ptr().cast::<AtomicU64>(), HEADER as usize / 8) };
        let (chunk, chunks) = (words[W_CHUNK].load(Ordering::Acquire), words[W_CHUNKS].load(Ordering::Acquire));
        let length = file.metadata().map_err(|error| format!("the paging pool: {error}"))?.len();
        let chunks = usize::try_from(chunks).ok().filter(|chunks| *chunks <= MAX_CHUNKS);
        let Some(chunks) = chunks
            .filter(|chunks| words[W_MAGIC].load(Ordering::Acquire) == MAGIC && chunk > 0 && length == HEADER + *chunks as u64 * chunk)
        else {
            return Err("the paging pool's header does not describe its file".into());
        };
        let data = memmap2::MmapOptions::new()
            .offset(HEADER)
            .len(usize::try_from(chunks as u64 * chunk).map_err(|_| "paging pool too large")?)
            .map_raw(&file)
            .map_err(|error| format!("mapping the paging pool's chunks: {error}"))?;
        drop(header);
        Self::with_header(file, map_header, Some(data), chunk, chunks)
    }

    fn words(&self) -> &[AtomicU64] {
        // SAFETY: as in `open`: HEADER bytes of page-aligned shared memory, used as atomics only.
        unsafe { std::slice::from_raw_parts(self.header.as_ptr().cast::<AtomicU64>(), HEADER as usize / 8) }
    }

    fn owner(&self, index: usize) -> &AtomicU64 {
        &self.words()[OWNERS + index]
    }

    pub fn chunk(&self) -> u64 {
        self.chunk
    }

    /// Chunks the file holds (the host budget's).
    pub fn chunks(&self) -> usize {
        self.chunks
    }

    /// Another descriptor of the pool's memory file.
    pub fn try_clone_file(&self) -> std::io::Result<std::fs::File> {
        self.file.try_clone()
    }

    /// The descriptor workers get.
    pub fn fd(&self) -> std::os::fd::RawFd {
        self.file.as_raw_fd()
    }

    /// Chunks filled (host memory allocated) so far.
    pub fn filled(&self) -> usize {
        self.words()[W_FILLED].load(Ordering::Acquire) as usize
    }

    /// Chunks pinned in this process.
    pub fn pinned(&self) -> usize {
        self.pinned.load(Ordering::Acquire)
    }

    /// Bytes this process pinned ahead (chunks registered with the device).
    pub fn pinned_bytes(&self) -> u64 {
        self.pinned_bytes.load(Ordering::Acquire)
    }

    /// Chunks no paged-out session holds.
    pub fn free_chunks(&self) -> usize {
        (0..self.chunks).filter(|index| self.owner(*index).load(Ordering::Acquire) == 0).count()
    }

    /// Chunks the worker in `slot` holds.
    pub fn held_by(&self, slot: usize) -> usize {
        let mark = slot as u64 + 1;
        (0..self.chunks).filter(|index| self.owner(*index).load(Ordering::Acquire) == mark).count()
    }

    /// The listener fills (allocates the pages of) as many whole chunks as `bytes` holds, at most
    /// the pool, on a thread of its own; once only.
    pub fn fill(self: &Arc<Self>, bytes: u64) {
        let target = usize::try_from(bytes / self.chunk).unwrap_or(usize::MAX).min(self.chunks);
        if self.words()[W_TARGET].compare_exchange(UNKNOWN, target as u64, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return;
        }
        let pool = self.clone();
        let spawned = std::thread::Builder::new().name("flyt-page-pool".into()).spawn(move || {
            let started = Instant::now();
            // The kernel zeroes every page: a few threads at once, a batch of chunks at a time,
            // so workers can pin the first chunks while the rest fill.
            let threads = std::thread::available_parallelism().map_or(1, |cores| (cores.get() / 2).clamp(1, FILL_THREADS));
            for batch in (0..target).step_by(threads) {
                let end = (batch + threads).min(target);
                let shared: &HostPool = &pool;
                let failed = std::thread::scope(|scope| {
                    let filling: Vec<_> = (batch..end).map(|index| scope.spawn(move || shared.allocate_chunk(index))).collect();
                    filling
                        .into_iter()
                        .filter_map(|thread| thread.join().unwrap_or_else(|_| Err("the filling thread panicked".into())).err())
                        .next()
                });
                if let Some(reason) = failed {
                    tracing::warn!(%reason, chunks = batch, "paging pool stopped short: past it, paged memory goes to memory files");
                    pool.words()[W_TARGET].store(batch as u64, Ordering::Release);
                    return;
                }
                pool.words()[W_FILLED].store(end as u64, Ordering::Release);
            }
            tracing::info!(
                chunks = target,
                chunk_bytes = pool.chunk,
                bytes = target as u64 * pool.chunk,
                took_ms = started.elapsed().as_millis() as u64,
                "paging pool filled: host memory ready for paged-out sessions"
            );
        });
        if let Err(error) = spawned {
            tracing::warn!(%error, "no thread to fill the paging pool: paged memory goes to memory files");
            self.words()[W_TARGET].store(0, Ordering::Release);
        }
    }

    /// Allocates chunk `index`'s pages (zeroed) in the memory file.
    fn allocate_chunk(&self, index: usize) -> Result<(), String> {
        let (offset, len) = ((HEADER + index as u64 * self.chunk) as libc::off_t, self.chunk as libc::off_t);
        // SAFETY: fallocate on this process's own memory file; it allocates the range's pages,
        // nothing else.
        if unsafe { libc::fallocate(self.fd(), 0, offset, len) } != 0 {
            return Err(format!("allocating chunk {index}: {}", std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// A worker pins the chunks with `device` as the listener fills them, on a thread of its own,
    /// until the pool's target is reached (or pinning fails: the chunks pinned so far serve).
    pub fn pin_in_background<D: Device>(self: &Arc<Self>, device: Arc<D>) {
        let generation = *self.lock_pinning();
        self.spawn_pinning(device, generation);
    }

    /// After a device reset (the registrations went with the context): pins every chunk again,
    /// in the background; until then page-outs use the chunks pinned again so far.
    pub fn pin_again_in_background<D: Device>(self: &Arc<Self>, device: Arc<D>) {
        let generation = {
            let mut current = self.lock_pinning();
            *current += 1;
            self.pinned.store(0, Ordering::Release);
            self.pinned_bytes.store(0, Ordering::Release);
            *current
        };
        self.spawn_pinning(device, generation);
    }

    fn lock_pinning(&self) -> std::sync::MutexGuard<'_, u64> {
        self.pinning.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn spawn_pinning<D: Device>(self: &Arc<Self>, device: Arc<D>, generation: u64) {
        let pool = self.clone();
        let spawned = std::thread::Builder::new().name("flyt-page-pin".into()).spawn(move || {
            if let Err(error) = device.bind_thread() {
                tracing::warn!(%error, "paging pool not pinned: no device on its thread");
                return;
            }
            let started = Instant::now();
            loop {
                let filled = pool.filled();
                while pool.pinned() < filled {
                    match pool.pin_next(&*device, generation) {
                        Ok(true) => {}
                        // A newer thread pins now (a device reset).
                        Ok(false) => return,
                        Err(reason) => {
                            tracing::warn!(%reason, chunks = pool.pinned(), "paging pool pinned in part");
                            return;
                        }
                    }
                }
                let target = pool.words()[W_TARGET].load(Ordering::Acquire);
                if target != UNKNOWN && pool.pinned() as u64 >= target {
                    if target > 0 {
                        tracing::info!(
                            chunks = target,
                            bytes = pool.pinned_bytes(),
                            took_ms = started.elapsed().as_millis() as u64,
                            "paging pool pinned in this worker"
                        );
                    }
                    return;
                }
                std::thread::sleep(POLL);
            }
        });
        if let Err(error) = spawned {
            tracing::warn!(%error, "no thread to pin the paging pool: paged memory goes to memory files");
        }
    }

    /// Pins the next chunk (mapped, filled) in this process; `Ok(false)` when `generation` is
    /// no longer the current pinning.
    fn pin_next<D: Device>(&self, device: &D, generation: u64) -> Result<bool, String> {
        let current = self.lock_pinning();
        if *current != generation {
            return Ok(false);
        }
        let index = self.pinned();
        let Some(ptr) = self.chunk_ptr(index) else { return Err("no chunks mapped".into()) };
        // SAFETY: the chunk lies in `data`, mapped for as long as this pool lives; the pool lives
        // until the worker exits (its pages are never unmapped while registered).
        match unsafe { device.host_register(ptr, self.chunk as usize, false) } {
            // Still registered across a reset: as good.
            Ok(()) | Err(flyt_protocol::CudaError::HOST_MEMORY_ALREADY_REGISTERED) => {}
            Err(error) => return Err(format!("pinning chunk {index}: {error}")),
        }
        self.pinned_bytes.fetch_add(self.chunk, Ordering::AcqRel);
        self.pinned.store(index + 1, Ordering::Release);
        drop(current);
        Ok(true)
    }

    /// The chunk's memory in this process.
    pub fn chunk_ptr(&self, index: usize) -> Option<*mut u8> {
        let data = self.data.as_ref()?;
        (index < self.chunks).then(|| data.as_mut_ptr().wrapping_add(index * self.chunk as usize))
    }

    /// Takes up to `wanted` free chunks, among those pinned here, for the worker in `slot`; the
    /// same ones first each time (their pages are already in place).
    pub fn take(&self, slot: usize, wanted: usize) -> Vec<usize> {
        let mark = slot as u64 + 1;
        let mut taken = Vec::with_capacity(wanted.min(self.chunks));
        for index in 0..self.pinned() {
            if taken.len() == wanted {
                break;
            }
            if self.owner(index).compare_exchange(0, mark, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                taken.push(index);
            }
        }
        taken
    }

    /// Gives `chunks` that the worker in `slot` took back to the pool.
    pub fn give_back(&self, slot: usize, chunks: &[usize]) {
        let mark = slot as u64 + 1;
        for &index in chunks {
            if index < self.chunks {
                let _ = self.owner(index).compare_exchange(mark, 0, Ordering::AcqRel, Ordering::Acquire);
            }
        }
    }

    /// A dead worker's chunks go back (the listener, once its process is gone).
    pub fn reclaim(&self, slot: usize) -> usize {
        let mark = slot as u64 + 1;
        (0..self.chunks).filter(|index| self.owner(*index).compare_exchange(mark, 0, Ordering::AcqRel, Ordering::Acquire).is_ok()).count()
    }
}

/// Where a piece of paged memory lies on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// In a pool chunk, at an offset.
    Chunk { index: usize, offset: u64 },
    /// In the session's own memory file, at an offset.
    File { offset: u64 },
}

/// A run of device bytes and where they go on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Which allocation (its index in the list laid out).
    pub allocation: usize,
    pub device: u64,
    pub len: u64,
    pub place: Place,
}

/// Lays `allocations` (start, length) out one after the other: the first `chunks.len() * chunk`
/// bytes in `chunks` in order, the rest in a file from offset 0; no piece crosses a chunk.
pub fn layout(allocations: &[(u64, u64)], chunk: u64, chunks: &[usize]) -> Vec<Piece> {
    let pooled = chunks.len() as u64 * chunk;
    let mut pieces = Vec::new();
    let mut at = 0u64;
    for (allocation, &(ptr, len)) in allocations.iter().enumerate() {
        let mut done = 0u64;
        while done < len {
            let (place, room) = if at < pooled {
                let offset = at % chunk;
                (Place::Chunk { index: chunks[(at / chunk) as usize], offset }, chunk - offset)
            } else {
                (Place::File { offset: at - pooled }, len - done)
            };
            let step = room.min(len - done);
            pieces.push(Piece { allocation, device: ptr + done, len: step, place });
            done += step;
            at += step;
        }
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::emulated::{EmulatedConfig, EmulatedDevice};

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_layout_fills_the_chunks_in_order_then_the_file() {
        let chunks = [7, 2];
        let pieces = layout(&[(0x1000_0000, 3 * MIB / 2), (0x2000_0000, 2 * MIB)], MIB, &chunks);
        let expect = |allocation, device, len, place| Piece { allocation, device, len, place };
        assert_eq!(
            pieces,
            vec![
                expect(0, 0x1000_0000, MIB, Place::Chunk { index: 7, offset: 0 }),
                expect(0, 0x1000_0000 + MIB, MIB / 2, Place::Chunk { index: 2, offset: 0 }),
                expect(1, 0x2000_0000, MIB / 2, Place::Chunk { index: 2, offset: MIB / 2 }),
                expect(1, 0x2000_0000 + MIB / 2, 3 * MIB / 2, Place::File { offset: 0 }),
            ]
        );
        assert_eq!(layout(&[(0x1000, 10)], MIB, &[]), vec![expect(0, 0x1000, 10, Place::File { offset: 0 })]);
    }

    /// A pool as a worker sees it, filled and pinned on the emulated device (whose "pinned"
    /// memory is plain memory, counted).
    fn pinned_pool(budget: u64, fill: u64) -> (Arc<HostPool>, Arc<HostPool>, Arc<EmulatedDevice>) {
        let listener = Arc::new(HostPool::create(budget, MIB).unwrap().expect("a pool"));
        let file = listener.try_clone_file().unwrap();
        let worker = Arc::new(HostPool::open(file).unwrap());
        let device = Arc::new(EmulatedDevice::new(EmulatedConfig { memory: 8 * MIB, sms: 1, host_gpus: vec![0] }));
        worker.pin_in_background(device.clone());
        listener.fill(fill);
        let deadline = Instant::now() + Duration::from_secs(10);
        while worker.pinned() < listener.words()[W_TARGET].load(Ordering::Acquire) as usize || listener.filled() == 0 {
            assert!(Instant::now() < deadline, "pool not pinned");
            std::thread::sleep(Duration::from_millis(5));
        }
        (listener, worker, device)
    }

    #[test]
    fn the_pool_stays_within_its_budget_and_its_target_and_reuses_its_chunks() {
        // No whole chunk in the budget: no pool.
        assert!(HostPool::create(MIB - 1, MIB).unwrap().is_none());
        assert!(HostPool::create(4 * MIB, 1000).is_err(), "a chunk of no whole pages");
        // Budget 5 chunks, target 4.5 MiB: 4 chunks filled and pinned, never the fifth.
        let (listener, worker, device) = pinned_pool(5 * MIB + 17, 4 * MIB + MIB / 2);
        assert_eq!((listener.chunks(), listener.filled(), worker.pinned()), (5, 4, 4));
        assert_eq!(worker.pinned_bytes(), 4 * MIB);
        assert_eq!(device.registered_bytes(), 4 * MIB, "what the device counts as pinned");
        // Taken chunks are the worker's until given back, whoever asks.
        let first = worker.take(3, 3);
        assert_eq!(first, vec![0, 1, 2]);
        assert_eq!(worker.take(4, 9), vec![3], "only pinned chunks, only free ones");
        assert_eq!((listener.held_by(3), listener.held_by(4), listener.free_chunks()), (3, 1, 1));
        worker.give_back(4, &first);
        assert_eq!(listener.held_by(3), 3, "not another slot's to give back");
        worker.give_back(3, &first);
        assert_eq!(worker.take(5, 2), vec![0, 1], "the same chunks again");
        // A dead worker's chunks go back.
        assert_eq!(listener.reclaim(5), 2);
        assert_eq!(listener.reclaim(4), 1);
        assert_eq!(listener.free_chunks(), 5);
        // The target is set once.
        listener.fill(5 * MIB);
        assert_eq!(listener.words()[W_TARGET].load(Ordering::Acquire), 4);
        // Chunks are distinct memory of the mapping.
        let (a, b) = (worker.chunk_ptr(0).unwrap(), worker.chunk_ptr(1).unwrap());
        assert_eq!(b as usize - a as usize, MIB as usize);
        assert!(worker.chunk_ptr(5).is_none());
    }

    #[test]
    fn after_a_device_reset_the_chunks_are_pinned_again() {
        let (_listener, worker, device) = pinned_pool(4 * MIB, 4 * MIB);
        let before = device.registrations();
        worker.pin_again_in_background(device.clone());
        let deadline = Instant::now() + Duration::from_secs(10);
        while worker.pinned() < 4 {
            assert!(Instant::now() < deadline, "pool not pinned again");
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(device.registrations(), before + 4, "each chunk registered again");
        assert_eq!(worker.pinned_bytes(), 4 * MIB);
    }

    #[test]
    fn a_worker_refuses_a_file_that_is_not_a_pool() {
        let fd = nix::sys::memfd::memfd_create(c"not-a-pool", nix::sys::memfd::MFdFlags::MFD_CLOEXEC).unwrap();
        let file = std::fs::File::from(fd);
        file.set_len(HEADER + MIB).unwrap();
        assert!(HostPool::open(file).is_err());
    }
}
