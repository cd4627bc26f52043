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
//!
//! Chunks are made several at once, each on a thread of its own (`pin_threads`): one thread
//! pinned at about 1.8 GB/s on an H200 host, as the kernel allocates, zeroes and maps each page
//! on the faulting thread. Each chunk is anonymous memory aligned to 2 MiB and advised for huge
//! pages (fewer pages to fault, pin and map), populated before it is registered. A page-out
//! whose session's pool has not caught up yet grows it on the spot (`HostPool::fill`) rather
//! than write a memory file, which copies far slower than pinning.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::backend::Device;
use crate::budget::SharedBudget;
use crate::paging::Residency;

/// Chunk size unless `--page-chunk` says otherwise.
pub const DEFAULT_CHUNK: u64 = 256 << 20;
/// How long the pool's thread sleeps when nothing changed (or the host budget had no room); it
/// also looks for page-outs short of budget this often (`lend`).
const IDLE: Duration = Duration::from_millis(100);
/// How long a page-out's `fill`, short of budget, waits with no chunk gained for other pools to
/// lend theirs.
const LEND_WAIT: Duration = Duration::from_secs(1);
/// At most this many threads make chunks at once.
const PIN_THREADS_MAX: usize = 8;
/// Transparent huge pages' size on x86-64 and (by default) aarch64.
const HUGE_PAGE: usize = 2 << 20;

/// Threads that make a pool's chunks at once: half the host's cores, at most `PIN_THREADS_MAX`
/// (the sessions' own threads keep the rest).
fn pin_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |cores| (cores.get() / 2).clamp(1, PIN_THREADS_MAX))
}

/// One chunk: anonymous memory of this process, registered with the device.
struct Chunk {
    memory: HostMemory,
    /// Registered with the device now (a device reset takes registrations away).
    registered: bool,
}

impl Chunk {
    fn ptr(&mut self) -> *mut u8 {
        self.memory.as_ptr()
    }
}

/// Anonymous memory of this process (unmapped when dropped), every page in place: the paging
/// pool's chunks and the CUDA backend's staging slots.
pub(crate) struct HostMemory {
    addr: usize,
    len: usize,
}

impl HostMemory {
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// `len` bytes at a 2 MiB boundary, advised for huge pages where the kernel gives them
    /// (fewer pages to fault, pin and map), every page in place before it is pinned.
    pub(crate) fn populated(len: usize) -> Result<Self, String> {
        let span = len.checked_add(HUGE_PAGE).ok_or("host memory too large")?;
        // SAFETY: a new private anonymous mapping where the kernel picks; nothing else refers to it.
        let raw = unsafe {
            libc::mmap(std::ptr::null_mut(), span, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        if raw == libc::MAP_FAILED {
            return Err(format!("host memory: {}", std::io::Error::last_os_error()));
        }
        let start = raw as usize;
        let addr = start.next_multiple_of(HUGE_PAGE);
        let (head, tail) = (addr - start, start + span - (addr + len));
        // SAFETY: both ranges lie in the mapping just made, outside the part kept.
        unsafe {
            if head > 0 {
                libc::munmap(start as *mut libc::c_void, head);
            }
            if tail > 0 {
                libc::munmap((addr + len) as *mut libc::c_void, tail);
            }
        }
        let memory = Self { addr, len };
        // SAFETY: advice on memory of this mapping only; no data in it yet.
        let populated = unsafe {
            libc::madvise(addr as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
            libc::madvise(addr as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) == 0
        };
        if !populated {
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::EINVAL) {
                // No memory for it (writing the pages anyway would wake the OOM killer).
                return Err(format!("host memory: {error}"));
            }
            // Before Linux 5.14 (no MADV_POPULATE_WRITE): a write to each page puts it in place.
            for page in (addr..addr + len).step_by(4096) {
                // SAFETY: inside the mapping, which nothing else uses yet.
                unsafe { (page as *mut u8).write_volatile(0) };
            }
        }
        Ok(memory)
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        // SAFETY: the mapping made by `populated`, unregistered (see `HostPool::release`).
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
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
    /// Held while chunks are made or released: the pool's thread and a page-out's `fill` take
    /// turns, a batch at a time.
    growing: Mutex<()>,
    /// Threads that make chunks at once.
    threads: usize,
    /// Time the threads spent populating chunks and registering them since the last log line.
    populate_us: AtomicU64,
    register_us: AtomicU64,
    /// The pool lent its chunks to another worker's page-out: its thread does not grow it again
    /// (its own page-out will, `fill`).
    lent: AtomicBool,
    /// A page-out of this pool's session is under way (from its `fill` to its `hold`): the pool
    /// lends nothing meanwhile.
    paging_out: AtomicBool,
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
            growing: Mutex::new(()),
            threads: pin_threads(),
            populate_us: AtomicU64::new(0),
            register_us: AtomicU64::new(0),
            lent: AtomicBool::new(false),
            paging_out: AtomicBool::new(false),
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
        self.lend(device);
        let started = Instant::now();
        let mut grown = 0usize;
        loop {
            let target = self.target();
            let (have, held, broken) = {
                let state = self.lock();
                (state.chunks.len(), state.held, state.broken)
            };
            if have < target && !broken && !self.lent.load(Ordering::Acquire) {
                let added = self.grow(device, target);
                if added == 0 {
                    break;
                }
                grown += added;
            } else if have > target.max(held) {
                self.shrink(device);
            } else {
                break;
            }
        }
        self.log_grown(grown, started, "paging pool pinned ahead");
    }

    /// When another worker's page-out is short of host budget: releases the chunks no paged-out
    /// bytes are in (up to what it is short of), so that page-out pins them (its bytes then page
    /// in from pinned memory, not a memory file). The pool grows again at its own session's
    /// page-out. A pool as large as its resident session's memory is idle until that page-out;
    /// the bytes of the sessions paged out need host memory now.
    fn lend<D: Device>(&self, device: &D) {
        let residency = self.residency();
        let short = residency.pinned_short();
        if short == 0 || self.paging_out.load(Ordering::Acquire) {
            return;
        }
        let mut lent = 0u64;
        while lent < short && self.shrink(device) {
            lent += self.chunk;
        }
        if lent > 0 {
            residency.settle_pinned_short(lent);
            self.lent.store(true, Ordering::Release);
            tracing::info!(bytes = lent, pool_bytes = self.bytes(), "paging pool lent its host budget to a page-out");
        }
    }

    /// Tells the other workers what this pool could lend (`lend`).
    fn publish(&self) {
        let lendable = {
            let state = self.lock();
            state.chunks.len().saturating_sub(state.held) as u64 * self.chunk
        };
        self.residency().set_lendable(lendable);
    }

    /// Chunks the session's allocations fill now.
    fn target(&self) -> usize {
        usize::try_from(self.wanted.load(Ordering::Acquire).div_ceil(self.chunk)).unwrap_or(usize::MAX)
    }

    fn log_grown(&self, grown: usize, started: Instant, message: &'static str) {
        // Where the time went, all threads' together: the kernel's part, the driver's part.
        let (populate, register) = (self.populate_us.swap(0, Ordering::AcqRel), self.register_us.swap(0, Ordering::AcqRel));
        if grown > 0 {
            let took = started.elapsed();
            let bytes = grown as u64 * self.chunk;
            let gbps = bytes as f64 / took.as_secs_f64().max(1e-9) / 1e9;
            tracing::info!(
                chunks = grown,
                bytes,
                pool_bytes = self.bytes(),
                threads = self.threads,
                took_ms = took.as_millis() as u64,
                gbps = %format!("{gbps:.1}"),
                populate_thread_ms = populate / 1000,
                register_thread_ms = register / 1000,
                "{message}"
            );
        }
    }

    /// Grows the pool to `chunks` chunks now, as the host budget allows (a page-out that came
    /// before the pool's thread caught up with its session), calling `progress` after each batch;
    /// returns the chunks in the pool. When the budget is spent and other pools have chunks to
    /// lend, it asks them (`lend`) and takes what they give, until nothing is left to lend or
    /// nothing came for `LEND_WAIT`. The pool lends nothing from here to the page-out's `hold`.
    pub fn fill<D: Device>(&self, device: &D, chunks: usize, progress: impl Fn()) -> usize {
        self.paging_out.store(true, Ordering::Release);
        // Its own page-out: a pool that lent grows again.
        self.lent.store(false, Ordering::Release);
        let started = Instant::now();
        let (mut grown, mut asked, mut gained) = (0, 0u64, Instant::now());
        loop {
            let (have, broken) = {
                let state = self.lock();
                (state.chunks.len(), state.broken)
            };
            if have >= chunks || broken {
                break;
            }
            let added = self.grow(device, chunks);
            if added > 0 {
                grown += added;
                gained = Instant::now();
                progress();
                continue;
            }
            if asked == 0 {
                if self.residency().lendable_elsewhere() == 0 {
                    // No other pool has chunks to lend: no wait.
                    break;
                }
                asked = (chunks - have) as u64 * self.chunk;
                self.residency().ask_pinned(asked);
            }
            // Nothing more can come: no chunk for a while, or none left to lend anywhere (what was
            // just lent is taken first, above).
            if gained.elapsed() >= LEND_WAIT || self.residency().lendable_elsewhere() == 0 {
                let added = self.grow(device, chunks);
                if added == 0 {
                    break;
                }
                grown += added;
                gained = Instant::now();
                progress();
                continue;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if asked > 0 {
            // Whatever came, the ask ends (lenders settled what they gave).
            self.residency().settle_pinned_short(asked);
        }
        self.log_grown(grown, started, "paging pool pinned for a page-out");
        self.chunks()
    }

    /// Adds chunks toward `target` in all (one batch: at most one per thread), made at once on
    /// threads of their own, each first taken from the host budget. Returns how many it added: 0
    /// when it cannot (now: no budget; or ever: pinning failed, the pool grows no more).
    fn grow<D: Device>(&self, device: &D, target: usize) -> usize {
        let _growing = self.growing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Counted under the lock: another batch (the pool's thread, a page-out) may just have
        // grown it.
        let wanted = target.saturating_sub(self.chunks()).min(self.threads);
        let mut reserved = 0;
        while reserved < wanted && self.residency().reserve_pinned(self.chunk) {
            reserved += 1;
        }
        if reserved == 0 {
            return 0;
        }
        let next = AtomicUsize::new(0);
        let made: Mutex<Vec<Result<Chunk, String>>> = Mutex::new(Vec::with_capacity(reserved));
        let make = || {
            let result = device.bind_thread().map_err(|error| format!("no device on a pinning thread: {error}"));
            while next.fetch_add(1, Ordering::AcqRel) < reserved {
                let chunk = result.clone().and_then(|()| self.make_chunk(device));
                made.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(chunk);
            }
        };
        std::thread::scope(|scope| {
            for _ in 1..reserved {
                if std::thread::Builder::new().name("flyt-page-pin".into()).spawn_scoped(scope, make).is_err() {
                    break;
                }
            }
            // This thread makes chunks too (all of them, if no thread could be started).
            make();
        });
        let mut added = 0;
        let mut failure = None;
        for chunk in made.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner) {
            match chunk {
                Ok(chunk) => {
                    self.pinned_total.fetch_add(1, Ordering::AcqRel);
                    self.lock().chunks.push(chunk);
                    added += 1;
                }
                Err(reason) => failure = Some(reason),
            }
        }
        // What was reserved and not made goes back to the budget.
        self.residency().release_pinned((reserved - added) as u64 * self.chunk);
        self.publish();
        if let Some(reason) = failure {
            tracing::warn!(%reason, pool_bytes = self.bytes(), "paging pool grows no more: past it, paged memory goes to memory files");
            self.lock().broken = true;
        }
        added
    }

    /// One chunk: memory populated (on this thread), then registered.
    fn make_chunk<D: Device>(&self, device: &D) -> Result<Chunk, String> {
        let started = Instant::now();
        let memory = HostMemory::populated(self.chunk as usize)?;
        let populated = Instant::now();
        // SAFETY: the chunk's memory stays mapped while registered: `release` unregisters it
        // before the mapping goes.
        unsafe { device.host_register(memory.addr as *mut u8, memory.len, false) }
            .map_err(|error| format!("pinning the paging pool: {error}"))?;
        self.populate_us.fetch_add(micros(populated - started), Ordering::AcqRel);
        self.register_us.fetch_add(micros(populated.elapsed()), Ordering::AcqRel);
        Ok(Chunk { memory, registered: true })
    }

    /// Releases the last chunk, if no paged-out bytes are in it; `false` when none could go.
    fn shrink<D: Device>(&self, device: &D) -> bool {
        let _growing = self.growing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let chunk = {
            let mut state = self.lock();
            if state.chunks.len() <= state.held {
                return false;
            }
            state.chunks.pop()
        };
        match chunk {
            Some(chunk) => {
                self.release(device, chunk);
                true
            }
            None => false,
        }
    }

    fn release<D: Device>(&self, device: &D, mut chunk: Chunk) {
        if chunk.registered {
            // SAFETY: registered by `grow` (or `register_again`); no copy uses it (not held).
            let _ = unsafe { device.host_unregister(chunk.ptr()) };
        }
        drop(chunk);
        self.residency().release_pinned(self.chunk);
        self.publish();
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
        let held = {
            let mut state = self.lock();
            let count = wanted.min(state.chunks.len());
            state.held = count;
            Held { ptrs: state.chunks[..count].iter_mut().map(|chunk| chunk.ptr() as usize).collect() }
        };
        self.paging_out.store(false, Ordering::Release);
        self.publish();
        held
    }

    /// The page-in is done (or the page-out failed): the chunks are free again.
    pub fn give_back(&self) {
        self.lock().held = 0;
        self.publish();
        self.changed.notify_all();
    }
}

fn micros(time: Duration) -> u64 {
    u64::try_from(time.as_micros()).unwrap_or(u64::MAX)
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
        // A pool counts a chunk gone as it takes it out, then unpins it, then gives back its budget.
        wait_for("every chunk unpinned and its budget back", || {
            device.registered_bytes() == 0 && Residency::new(first.paging_words(), 0).pinned_total() == 0
        });
    }

    /// A page-out before the pool's thread caught up grows the pool on the spot, in batches made
    /// on several threads, each chunk first taken from the host budget: never past it, what was
    /// not made given back, every batch reported.
    #[test]
    fn a_pool_fills_on_the_spot_in_parallel_batches_within_the_host_budget() {
        let (fd, _listener_page) = SharedBudget::create(None).unwrap();
        let file = std::fs::File::from(fd);
        let budget = Arc::new(SharedBudget::map(&file, 1).unwrap());
        Residency::new(budget.paging_words(), 0).set_pinned_limit(7 * MIB);
        let device = EmulatedDevice::new(EmulatedConfig { memory: 8 * MIB, sms: 1, host_gpus: vec![0] });
        let mut pool = HostPool::new(budget.clone(), MIB).unwrap();
        pool.threads = 3;
        let batches = AtomicUsize::new(0);
        // Its thread never started: only `fill` grows it.
        assert_eq!(pool.fill(&device, 5, || _ = batches.fetch_add(1, Ordering::AcqRel)), 5);
        assert_eq!(batches.load(Ordering::Acquire), 2, "3 chunks, then 2");
        assert_eq!((device.registered_bytes(), device.registrations()), (5 * MIB, 5));
        assert_eq!(Residency::new(budget.paging_words(), 0).pinned_total(), 5 * MIB);
        // Each chunk 2 MiB-aligned (huge pages), distinct, and written through.
        let held = pool.hold(5);
        let mut starts = held.ptrs.clone();
        starts.sort_unstable();
        starts.dedup();
        assert_eq!(starts.len(), 5);
        for ptr in &held.ptrs {
            assert_eq!(ptr % HUGE_PAGE, 0);
            // SAFETY: a chunk of the pool, held, a MiB long.
            unsafe { std::ptr::write_bytes(*ptr as *mut u8, 0xa5, MIB as usize) };
        }
        pool.give_back();
        // Past the budget: 7 chunks at most, the rest left to the memory file.
        assert_eq!(pool.fill(&device, 9, || {}), 7);
        assert_eq!(Residency::new(budget.paging_words(), 0).pinned_total(), 7 * MIB);
        assert_eq!(pool.fill(&device, 9, || {}), 7, "nothing more, nothing reserved and left over");
        assert_eq!(Residency::new(budget.paging_words(), 0).pinned_total(), 7 * MIB);
        assert_eq!(pool.pinned_total(), 7);
        // The pool's thread shrinks it to its session's memory, giving the budget back.
        let pool = Arc::new(pool);
        pool.want(2 * MIB);
        pool.start(Arc::new(device));
        wait_for("shrunk to the session", || pool.chunks() == 2);
        assert_eq!(Residency::new(budget.paging_words(), 0).pinned_total(), 2 * MIB);
    }

    /// A page-out short of host budget borrows it from the pool of a resident session (whose
    /// thread lends the chunks no paged-out bytes are in, and grows no more until its own
    /// session's page-out); with nobody to lend, it waits `LEND_WAIT` at most and does without.
    #[test]
    fn a_page_out_short_of_budget_borrows_a_resident_sessions_pool() {
        let (fd, _listener_page) = SharedBudget::create(None).unwrap();
        let file = std::fs::File::from(fd);
        let (first, second) = (Arc::new(SharedBudget::map(&file, 1).unwrap()), Arc::new(SharedBudget::map(&file, 2).unwrap()));
        let words = first.paging_words();
        Residency::new(words, 0).set_pinned_limit(4 * MIB);
        let device = Arc::new(EmulatedDevice::new(EmulatedConfig { memory: 8 * MIB, sms: 1, host_gpus: vec![0] }));
        // The resident session's pool takes the whole budget, ahead.
        let resident = Arc::new(HostPool::new(first.clone(), MIB).unwrap());
        resident.want(4 * MIB);
        resident.start(device.clone());
        wait_for("the resident session's pool", || resident.chunks() == 4);
        // Another session's page-out (its pool's thread not started): it borrows all four.
        let paging = HostPool::new(second.clone(), MIB).unwrap();
        let started = Instant::now();
        assert_eq!(paging.fill(&*device, 3, || {}), 3);
        assert!(started.elapsed() < LEND_WAIT, "lent at once: {:?}", started.elapsed());
        // The lender released what was asked (three chunks), the borrower pinned them.
        assert_eq!(resident.chunks(), 1);
        assert_eq!(Residency::new(words, 0).pinned_total(), 4 * MIB);
        assert_eq!(Residency::new(words, 0).pinned_short(), 0, "the ask settled");
        // The lender does not grow back behind the borrower's back.
        std::thread::sleep(IDLE * 3);
        assert_eq!(resident.chunks(), 1);
        // The borrower's session is paged out (chunks held, never lent): the lender's page-out
        // finds nothing to borrow and does at once with what it has (the rest would go to a
        // memory file).
        let held = paging.hold(3);
        assert_eq!(held.ptrs.len(), 3);
        let started = Instant::now();
        assert_eq!(resident.fill(&*device, 4, || {}), 1);
        assert!(started.elapsed() < LEND_WAIT, "no wait: {:?}", started.elapsed());
        // Chunks to lend, but no lender answers (this pool's thread is not running): it waits
        // `LEND_WAIT` at most.
        paging.give_back();
        let started = Instant::now();
        assert_eq!(resident.fill(&*device, 4, || {}), 1);
        let waited = started.elapsed();
        assert!(waited >= LEND_WAIT && waited < LEND_WAIT * 3, "{waited:?}");
        assert_eq!((paging.chunks(), Residency::new(words, 0).pinned_short()), (3, 0), "the ask withdrawn");
        // Its own page-out cleared its loan: with budget free again it grows back by itself.
        paging.want(0);
        paging.follow(&*device);
        assert_eq!(paging.chunks(), 0, "its session freed its memory");
        wait_for("the lender's pool grows back", || resident.chunks() == 4);
    }
}
