//! Host memory for paging (`docs/design/paging.md`), pinned ahead of need: each worker keeps a
//! pool of pinned host memory in chunks (256 MiB by default, `--page-chunk`) as large as its
//! session's allocations, grown (and shrunk) by a background thread of its own as the session
//! allocates and frees, within the host budget all workers share (`--page-host-budget`, words of
//! the tenant page: `Residency::reserve_pinned`). A page-out then copies device memory into the
//! chunks (DMA at the copy engines' speed) and its page-in copies back from them: nothing is
//! allocated or pinned while a request waits. Past the pool, paged memory goes to a memory file
//! (`crate::paging`).
//!
//! The pool is the worker's own, not shared with other workers: pinned host memory is mapped for
//! the worker's kernels (unified addressing), so memory holding one tenant's bytes is never
//! pinned in another tenant's process.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::backend::Device;
use crate::budget::SharedBudget;
use crate::paging::Residency;

/// Chunk size unless `--page-chunk` says otherwise.
pub const DEFAULT_CHUNK: u64 = 256 << 20;
/// How long the pool's thread sleeps when nothing changed (or the host budget had no room).
const IDLE: Duration = Duration::from_millis(200);

/// One chunk: anonymous memory of this process, registered with the device.
struct Chunk {
    map: memmap2::MmapMut,
    /// Registered with the device now (a device reset takes registrations away).
    registered: bool,
}

impl Chunk {
    fn ptr(&mut self) -> *mut u8 {
        self.map.as_mut_ptr()
    }
}

#[derive(Default)]
struct State {
    chunks: Vec<Chunk>,
    /// The first chunks hold a paged-out session's bytes: never released meanwhile.
    held: usize,
    /// Pinning failed (not a lack of budget): the pool grows no more.
    broken: bool,
}

/// A worker's pool of pinned host memory for paging.
pub struct HostPool {
    chunk: u64,
    budget: Arc<SharedBudget>,
    state: Mutex<State>,
    /// Bytes the session's allocations hold: the pool grows (or shrinks) toward them.
    wanted: AtomicU64,
    /// A device reset took the registrations: register every chunk again.
    reset: AtomicBool,
    changed: Condvar,
    /// Registrations made (pinning), for the log and the tests.
    pinned_total: AtomicU64,
}

/// The chunks a page-out copies into, held until its page-in gives them back.
pub struct Held {
    /// Each chunk's memory, in order.
    pub ptrs: Vec<usize>,
}

impl HostPool {
    /// A worker's pool, empty; `start` grows it.
    pub fn new(budget: Arc<SharedBudget>, chunk: u64) -> Result<Self, String> {
        if chunk == 0 || !chunk.is_multiple_of(4096) || usize::try_from(chunk).is_err() {
            return Err(format!("paging chunk of {chunk} bytes: not a whole number of 4 KiB pages"));
        }
        Ok(Self {
            chunk,
            budget,
            state: Mutex::default(),
            wanted: AtomicU64::new(0),
            reset: AtomicBool::new(false),
            changed: Condvar::new(),
            pinned_total: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn residency(&self) -> Residency<'_> {
        Residency::new(self.budget.paging_words(), self.budget.slot())
    }

    pub fn chunk(&self) -> u64 {
        self.chunk
    }

    /// Chunks in the pool now.
    pub fn chunks(&self) -> usize {
        self.lock().chunks.len()
    }

    /// Bytes pinned in the pool now.
    pub fn bytes(&self) -> u64 {
        self.chunks() as u64 * self.chunk
    }

    /// Registrations (chunks pinned) ever made.
    pub fn pinned_total(&self) -> u64 {
        self.pinned_total.load(Ordering::Acquire)
    }

    /// The session's allocations hold `bytes` now: the pool follows, in the background.
    pub fn want(&self, bytes: u64) {
        if self.wanted.swap(bytes, Ordering::AcqRel) != bytes {
            self.changed.notify_all();
        }
    }

    /// After a device reset, whose context took the registrations: the chunks are pinned again
    /// in the background (copies meanwhile still work, at pageable memory's speed).
    pub fn pin_again(&self) {
        self.reset.store(true, Ordering::Release);
        self.changed.notify_all();
    }

    /// Starts the pool's thread, which keeps it as large as the session's allocations.
    pub fn start<D: Device>(self: &Arc<Self>, device: Arc<D>) {
        let pool = Arc::downgrade(self);
        let spawned = std::thread::Builder::new().name("flyt-page-pool".into()).spawn(move || {
            if let Err(error) = device.bind_thread() {
                tracing::warn!(%error, "paging pool off: no device on its thread");
                return;
            }
            // Ends with the pager (the session's end); a worker serves one session.
            while let Some(pool) = pool.upgrade() {
                pool.follow(&*device);
                let state = pool.lock();
                let _ = pool.changed.wait_timeout(state, IDLE);
            }
        });
        if let Err(error) = spawned {
            tracing::warn!(%error, "no thread for the paging pool: paged memory goes to memory files");
        }
    }

    /// One round of the pool's thread: registers again after a reset, then grows toward the
    /// session's allocations (as the host budget allows) or shrinks to them.
    fn follow<D: Device>(&self, device: &D) {
        if self.reset.swap(false, Ordering::AcqRel) {
            // The reset's context is made current here too, as the session's other threads do.
            if let Err(error) = device.bind_thread() {
                tracing::warn!(%error, "paging pool not pinned again after a device reset");
            }
            self.register_again(device);
        }
        let started = Instant::now();
        let mut grown = 0usize;
        loop {
            let target = usize::try_from(self.wanted.load(Ordering::Acquire).div_ceil(self.chunk)).unwrap_or(usize::MAX);
            let (have, held, broken) = {
                let state = self.lock();
                (state.chunks.len(), state.held, state.broken)
            };
            if have < target && !broken {
                if !self.grow(device) {
                    break;
                }
                grown += 1;
            } else if have > target.max(held) {
                self.shrink(device);
            } else {
                break;
            }
        }
        if grown > 0 {
            tracing::info!(
                chunks = grown,
                bytes = grown as u64 * self.chunk,
                pool_bytes = self.bytes(),
                took_ms = started.elapsed().as_millis() as u64,
                "paging pool pinned ahead"
            );
        }
    }

    /// Adds a chunk: budget, memory, pinning. `false` when it cannot (now, or ever).
    fn grow<D: Device>(&self, device: &D) -> bool {
        if !self.residency().reserve_pinned(self.chunk) {
            return false;
        }
        let made = anonymous_chunk(self.chunk as usize).and_then(|mut map| {
            // SAFETY: the chunk's memory stays mapped while registered: `shrink` unregisters it
            // before the mapping goes.
            unsafe { device.host_register(map.as_mut_ptr(), map.len(), false) }
                .map_err(|error| format!("pinning the paging pool: {error}"))
                .map(|()| map)
        });
        match made {
            Ok(map) => {
                self.pinned_total.fetch_add(1, Ordering::AcqRel);
                self.lock().chunks.push(Chunk { map, registered: true });
                true
            }
            Err(reason) => {
                self.residency().release_pinned(self.chunk);
                tracing::warn!(%reason, pool_bytes = self.bytes(), "paging pool grows no more: past it, paged memory goes to memory files");
                self.lock().broken = true;
                false
            }
        }
    }

    /// Releases the last chunk, if no paged-out bytes are in it.
    fn shrink<D: Device>(&self, device: &D) {
        let chunk = {
            let mut state = self.lock();
            if state.chunks.len() <= state.held {
                return;
            }
            state.chunks.pop()
        };
        if let Some(chunk) = chunk {
            self.release(device, chunk);
        }
    }

    fn release<D: Device>(&self, device: &D, mut chunk: Chunk) {
        if chunk.registered {
            // SAFETY: registered by `grow` (or `register_again`); no copy uses it (not held).
            let _ = unsafe { device.host_unregister(chunk.ptr()) };
        }
        drop(chunk);
        self.residency().release_pinned(self.chunk);
    }

    fn register_again<D: Device>(&self, device: &D) {
        let mut state = self.lock();
        for chunk in &mut state.chunks {
            let ptr = chunk.ptr();
            // SAFETY: the chunk stays mapped while the pool holds it.
            chunk.registered = match unsafe { device.host_register(ptr, self.chunk as usize, false) } {
                Ok(()) | Err(flyt_protocol::CudaError::HOST_MEMORY_ALREADY_REGISTERED) => true,
                Err(error) => {
                    tracing::warn!(%error, "a paging chunk not pinned again after a device reset");
                    false
                }
            };
        }
    }

    /// Takes up to `wanted` chunks for a page-out: the pool's first ones, each time the same.
    pub fn hold(&self, wanted: usize) -> Held {
        let mut state = self.lock();
        let count = wanted.min(state.chunks.len());
        state.held = count;
        Held { ptrs: state.chunks[..count].iter_mut().map(|chunk| chunk.ptr() as usize).collect() }
    }

    /// The page-in is done (or the page-out failed): the chunks are free again.
    pub fn give_back(&self) {
        self.lock().held = 0;
        self.changed.notify_all();
    }
}

/// `len` bytes of this process's memory, in huge pages where the kernel gives them (fewer pages
/// to pin and map), every page in place before it is pinned.
fn anonymous_chunk(len: usize) -> Result<memmap2::MmapMut, String> {
    let mut map = memmap2::MmapOptions::new().len(len).map_anon().map_err(|error| format!("host memory for the paging pool: {error}"))?;
    let _ = map.advise(memmap2::Advice::HugePage);
    if map.advise(memmap2::Advice::PopulateWrite).is_err() {
        // Before Linux 5.14: a write to each page puts it in place.
        for page in map.chunks_mut(4096) {
            page[0] = 0;
        }
    }
    Ok(map)
}

/// Where a piece of paged memory lies on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// In a held chunk (its index among them), at an offset.
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

/// Lays `allocations` (start, length) out one after the other: the first `chunks * chunk` bytes
/// in the chunks in order, the rest in a file from offset 0; no piece crosses a chunk.
pub fn layout(allocations: &[(u64, u64)], chunk: u64, chunks: usize) -> Vec<Piece> {
    let pooled = chunks as u64 * chunk;
    let mut pieces = Vec::new();
    let mut at = 0u64;
    for (allocation, &(ptr, len)) in allocations.iter().enumerate() {
        let mut done = 0u64;
        while done < len {
            let (place, room) = if at < pooled {
                let offset = at % chunk;
                (Place::Chunk { index: (at / chunk) as usize, offset }, chunk - offset)
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
        let pieces = layout(&[(0x1000_0000, 3 * MIB / 2), (0x2000_0000, 2 * MIB)], MIB, 2);
        let expect = |allocation, device, len, place| Piece { allocation, device, len, place };
        assert_eq!(
            pieces,
            vec![
                expect(0, 0x1000_0000, MIB, Place::Chunk { index: 0, offset: 0 }),
                expect(0, 0x1000_0000 + MIB, MIB / 2, Place::Chunk { index: 1, offset: 0 }),
                expect(1, 0x2000_0000, MIB / 2, Place::Chunk { index: 1, offset: MIB / 2 }),
                expect(1, 0x2000_0000 + MIB / 2, 3 * MIB / 2, Place::File { offset: 0 }),
            ]
        );
        assert_eq!(layout(&[(0x1000, 10)], MIB, 0), vec![expect(0, 0x1000, 10, Place::File { offset: 0 })]);
    }

    fn wait_for(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn pools_follow_their_sessions_within_the_host_budget_and_keep_held_chunks() {
        let (fd, _listener_page) = SharedBudget::create(None).unwrap();
        let file = std::fs::File::from(fd);
        let (first, second) = (Arc::new(SharedBudget::map(&file, 1).unwrap()), Arc::new(SharedBudget::map(&file, 2).unwrap()));
        Residency::new(first.paging_words(), 0).set_pinned_limit(6 * MIB);
        assert!(HostPool::new(first.clone(), 1000).is_err(), "a chunk of no whole pages");
        let device = Arc::new(EmulatedDevice::new(EmulatedConfig { memory: 8 * MIB, sms: 1, host_gpus: vec![0] }));
        let (a, b) = (Arc::new(HostPool::new(first.clone(), MIB).unwrap()), Arc::new(HostPool::new(second.clone(), MIB).unwrap()));
        a.start(device.clone());
        b.start(device.clone());
        // A session of 3.5 MiB: four chunks, pinned ahead, counted in the host budget.
        a.want(3 * MIB + MIB / 2);
        wait_for("a's pool", || a.chunks() == 4);
        assert_eq!(device.registered_bytes(), 4 * MIB);
        assert_eq!(Residency::new(first.paging_words(), 0).pinned_total(), 4 * MIB);
        // Another of 4 MiB gets what the budget has left: 2 MiB.
        b.want(4 * MIB);
        wait_for("b's pool", || b.chunks() == 2);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(b.chunks(), 2, "never past the host budget");
        // Held chunks stay while the session frees memory; the same ones each page-out.
        let held = a.hold(3);
        assert_eq!(held.ptrs.len(), 3);
        a.want(MIB);
        wait_for("a shrinks to what it holds", || a.chunks() == 3);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(a.chunks(), 3, "held chunks are never released");
        a.give_back();
        wait_for("a shrinks to its session", || a.chunks() == 1);
        // The budget a freed, b takes.
        wait_for("b grows into the freed budget", || b.chunks() == 4);
        assert_eq!(a.hold(5).ptrs, vec![held.ptrs[0]], "the same first chunk");
        a.give_back();
        let pinned = a.pinned_total() + b.pinned_total();
        assert_eq!(pinned, 8, "4 + 4 chunks pinned in all, none twice");
        assert_eq!(device.registered_bytes(), 5 * MIB);
        // A device reset: registered again, nothing else.
        let registrations = device.registrations();
        b.pin_again();
        wait_for("b pinned again", || device.registrations() == registrations + 4);
        // Sessions that free their memory give the budget back.
        a.want(0);
        b.want(0);
        wait_for("pools emptied", || a.chunks() + b.chunks() == 0);
        assert_eq!(Residency::new(first.paging_words(), 0).pinned_total(), 0);
        assert_eq!(device.registered_bytes(), 0);
    }
}
