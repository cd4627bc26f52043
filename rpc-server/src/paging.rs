//! Oversubscription (`docs/design/paging.md`): a server whose sessions together may hold more
//! device memory than its share of the GPU (`--oversubscribe`) keeps only some of them resident;
//! an idle session's allocations are paged out to host memory (its worker's pool of host memory
//! pinned ahead, `crate::page_pool`, and past it a memfd: tmpfs pages) and their
//! physical memory released, their addresses kept, so every pointer its app holds stays valid.
//! Its next request pages it back in first.
//!
//! - [`Residency`]: each session's resident bytes, last activity and paging counters, in words
//!   at the end of the tenant page (`budget.rs`) that the listener and every worker map.
//! - [`Pager`] (worker): the gate a session's requests pass through (paging in first), the page
//!   out the listener asks for, and the bounded wait for device memory.
//! - [`PagedBudget`] (worker): the session's budget, which also claims resident bytes.
//! - [`Coordinator`] (listener): picks whom to page out when a session needs memory.

use std::io::{BufReader, BufWriter};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use flyt_protocol::frame::encode_into;
use flyt_protocol::worker::FromWorker;

use crate::activity::{KINDS, Work};
use crate::backend::Device;
use crate::budget::{BUDGET_SLOTS, MemoryBudget, SharedBudget};
use crate::page_pool::{Held, HostPool, Piece, Place};

const CAPACITY: usize = 0;
const RESIDENT_TOTAL: usize = 1;
/// Host memory the workers' paging pools may pin, all together (`--page-host-budget`), and what
/// they pin.
const PINNED_LIMIT: usize = 2;
const PINNED_TOTAL: usize = 3;
/// Counts steps of page-outs under way (any slot's): a session waiting for memory waits on
/// while it moves (`Pager::claim`).
const PAGE_OUT_PROGRESS: usize = 4;
/// Host budget page-outs are short of: pools of resident sessions lend theirs (`page_pool`).
const PINNED_SHORT: usize = 5;
const GLOBAL: usize = 6;
// Per slot, in this order.
const RESIDENT: usize = 0;
const LAST_ACTIVE: usize = 1;
const RESIDENT_SINCE: usize = 2;
const FLAGS: usize = 3;
const PAGED_OUT_BYTES: usize = 4;
const PAGED_IN_BYTES: usize = 5;
const PAUSED_MS: usize = 6;
const PAGE_OUTS: usize = 7;
/// Bytes this slot's paging pool pins (in `PINNED_TOTAL` too).
const PINNED: usize = 8;
/// Of those, the bytes no paged-out session's bytes are in: what the pool could lend.
const LENDABLE: usize = 9;
const FIELDS: usize = 10;
/// Words of the tenant page that paging uses.
pub const PAGING_WORDS: usize = GLOBAL + BUDGET_SLOTS * FIELDS;

/// The session could be paged out (nothing holds it, see `Session::page_blocker`).
const PAGEABLE: u64 = 1;
/// The session's memory is paged out now.
const PAGED: u64 = 2;

/// Milliseconds of the system's monotonic clock (the same in every process), from 1.
pub fn now_ms() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC exists on every Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    u64::try_from(now.tv_sec).unwrap_or(0) * 1000 + u64::try_from(now.tv_nsec).unwrap_or(0) / 1_000_000 + 1
}

/// One slot's paging words (or, from the listener, any slot's).
pub struct Residency<'a> {
    words: &'a [AtomicU64],
    slot: usize,
}

/// What the listener reads of a slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotView {
    pub slot: usize,
    pub resident: u64,
    pub last_active_ms: u64,
    pub resident_since_ms: u64,
    pub pageable: bool,
    pub paged: bool,
    pub paged_out_bytes: u64,
    pub paged_in_bytes: u64,
    pub paused_ms: u64,
    pub page_outs: u64,
    /// Host memory its worker pins ahead for its page-outs (`crate::page_pool`).
    pub pinned: u64,
}

impl<'a> Residency<'a> {
    pub fn new(words: &'a [AtomicU64], slot: usize) -> Self {
        Self { words, slot: slot.min(BUDGET_SLOTS - 1) }
    }

    fn field(&self, field: usize) -> &AtomicU64 {
        &self.words[GLOBAL + self.slot * FIELDS + field]
    }

    /// Device memory the sessions may keep resident together (0: paging off, no limit).
    pub fn capacity(&self) -> u64 {
        self.words[CAPACITY].load(Ordering::Acquire)
    }

    pub fn set_capacity(&self, bytes: u64) {
        self.words[CAPACITY].store(bytes, Ordering::Release);
    }

    /// Bytes resident, all sessions together.
    pub fn resident_total(&self) -> u64 {
        self.words[RESIDENT_TOTAL].load(Ordering::Acquire)
    }

    /// Takes `bytes` of resident memory for this slot if they fit the capacity.
    pub fn claim(&self, bytes: u64) -> bool {
        let capacity = self.capacity();
        let limit = (capacity != 0).then_some(capacity);
        if !crate::budget::reserve_within(&self.words[RESIDENT_TOTAL], limit, bytes) {
            return false;
        }
        if self.field(RESIDENT).fetch_add(bytes, Ordering::AcqRel) == 0 {
            self.field(RESIDENT_SINCE).store(now_ms(), Ordering::Release);
        }
        true
    }

    /// Gives back up to `bytes` of this slot's resident memory; returns what it gave.
    pub fn unclaim(&self, bytes: u64) -> u64 {
        let given = self
            .field(RESIDENT)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| Some(held - held.min(bytes)))
            .map_or(0, |held| held.min(bytes));
        self.words[RESIDENT_TOTAL].fetch_sub(given, Ordering::AcqRel);
        given
    }

    /// The host memory all paging pools may pin together.
    pub fn set_pinned_limit(&self, bytes: u64) {
        self.words[PINNED_LIMIT].store(bytes, Ordering::Release);
    }

    /// What all paging pools pin now.
    pub fn pinned_total(&self) -> u64 {
        self.words[PINNED_TOTAL].load(Ordering::Acquire)
    }

    /// Takes `bytes` of the host budget for this slot's paging pool, if they fit.
    pub fn reserve_pinned(&self, bytes: u64) -> bool {
        let limit = self.words[PINNED_LIMIT].load(Ordering::Acquire);
        if !crate::budget::reserve_within(&self.words[PINNED_TOTAL], Some(limit), bytes) {
            return false;
        }
        self.field(PINNED).fetch_add(bytes, Ordering::AcqRel);
        true
    }

    /// Gives back up to `bytes` of this slot's share of the host budget.
    pub fn release_pinned(&self, bytes: u64) {
        let given = self
            .field(PINNED)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| Some(held - held.min(bytes)))
            .map_or(0, |held| held.min(bytes));
        self.words[PINNED_TOTAL].fetch_sub(given, Ordering::AcqRel);
    }

    /// A page-out's pool is `bytes` short of the host budget: pools of resident sessions may
    /// lend theirs.
    pub fn ask_pinned(&self, bytes: u64) {
        self.words[PINNED_SHORT].fetch_add(bytes, Ordering::AcqRel);
    }

    /// This slot's pool could lend `bytes` (its chunks no paged-out bytes are in).
    pub fn set_lendable(&self, bytes: u64) {
        self.field(LENDABLE).store(bytes, Ordering::Release);
    }

    /// What the other slots' pools could lend, all together.
    pub fn lendable_elsewhere(&self) -> u64 {
        (0..BUDGET_SLOTS)
            .filter(|slot| *slot != self.slot)
            .map(|slot| self.words[GLOBAL + slot * FIELDS + LENDABLE].load(Ordering::Acquire))
            .sum()
    }

    /// Budget page-outs are short of now (0: nobody waits for a loan).
    pub fn pinned_short(&self) -> u64 {
        self.words[PINNED_SHORT].load(Ordering::Acquire)
    }

    /// `bytes` of what page-outs were short of are settled: lent, or no longer waited for.
    pub fn settle_pinned_short(&self, bytes: u64) {
        let _ = self.words[PINNED_SHORT].fetch_update(Ordering::AcqRel, Ordering::Acquire, |short| Some(short.saturating_sub(bytes)));
    }

    /// A page-out under way took a step (its start, a batch of chunks pinned, a batch of bytes
    /// copied, its end).
    pub fn mark_progress(&self) {
        self.words[PAGE_OUT_PROGRESS].fetch_add(1, Ordering::AcqRel);
    }

    /// Steps page-outs took, all slots together (only changes matter).
    pub fn progress(&self) -> u64 {
        self.words[PAGE_OUT_PROGRESS].load(Ordering::Acquire)
    }

    /// The session made a request now.
    pub fn touch(&self) {
        self.field(LAST_ACTIVE).store(now_ms(), Ordering::Release);
    }

    pub fn set_pageable(&self, pageable: bool) {
        // Read first: most requests change nothing, and a read leaves the line shared.
        if (self.field(FLAGS).load(Ordering::Acquire) & PAGEABLE != 0) == pageable {
            return;
        }
        if pageable {
            self.field(FLAGS).fetch_or(PAGEABLE, Ordering::AcqRel);
        } else {
            self.field(FLAGS).fetch_and(!PAGEABLE, Ordering::AcqRel);
        }
    }

    fn paged_out(&self, bytes: u64) {
        self.unclaim(bytes);
        self.field(FLAGS).fetch_or(PAGED, Ordering::AcqRel);
        self.field(PAGED_OUT_BYTES).fetch_add(bytes, Ordering::AcqRel);
        self.field(PAGE_OUTS).fetch_add(1, Ordering::AcqRel);
    }

    fn paged_in(&self, bytes: u64, paused: Duration) {
        self.field(FLAGS).fetch_and(!PAGED, Ordering::AcqRel);
        self.field(PAGED_IN_BYTES).fetch_add(bytes, Ordering::AcqRel);
        self.field(PAUSED_MS).fetch_add(paused.as_millis() as u64, Ordering::AcqRel);
        self.field(RESIDENT_SINCE).store(now_ms(), Ordering::Release);
    }

    pub fn view(&self) -> SlotView {
        let flags = self.field(FLAGS).load(Ordering::Acquire);
        SlotView {
            slot: self.slot,
            resident: self.field(RESIDENT).load(Ordering::Acquire),
            last_active_ms: self.field(LAST_ACTIVE).load(Ordering::Acquire),
            resident_since_ms: self.field(RESIDENT_SINCE).load(Ordering::Acquire),
            pageable: flags & PAGEABLE != 0,
            paged: flags & PAGED != 0,
            paged_out_bytes: self.field(PAGED_OUT_BYTES).load(Ordering::Acquire),
            paged_in_bytes: self.field(PAGED_IN_BYTES).load(Ordering::Acquire),
            paused_ms: self.field(PAUSED_MS).load(Ordering::Acquire),
            page_outs: self.field(PAGE_OUTS).load(Ordering::Acquire),
            pinned: self.field(PINNED).load(Ordering::Acquire),
        }
    }

    /// A dead worker's slot: its resident bytes go back, its words are cleared for the next.
    pub fn reclaim(&self) {
        let held = self.field(RESIDENT).swap(0, Ordering::AcqRel);
        self.words[RESIDENT_TOTAL].fetch_sub(held, Ordering::AcqRel);
        // A dead worker's pinned memory went with its process.
        let pinned = self.field(PINNED).swap(0, Ordering::AcqRel);
        self.words[PINNED_TOTAL].fetch_sub(pinned, Ordering::AcqRel);
        for field in 1..FIELDS {
            self.field(field).store(0, Ordering::Release);
        }
    }
}

/// Paging's settings (the server's `--idle-page-out-ms`, `--resident-min-ms`, `--page-wait-ms`).
#[derive(Clone, Copy, Debug)]
pub struct PagingSettings {
    /// A session with no request for this long (and no work queued) may be paged out.
    pub idle: Duration,
    /// A session paged in (or started) stays resident at least this long: no thrashing.
    pub resident_min: Duration,
    /// How long a request waits for device memory with no page-out making progress before it
    /// fails with out-of-memory (in all, at most `MOST_WAITS` times this).
    pub wait: Duration,
}

/// A request waits for memory at most this many times `PagingSettings::wait` in all, however
/// page-outs progress (others may take the memory they free).
const MOST_WAITS: u32 = 10;

/// How often a waiting session asks the listener again (sessions may have become idle since).
const ASK_AGAIN: Duration = Duration::from_millis(20);

/// A session's allocations paged out: their bytes, in allocation order (`page_pool::layout`),
/// first in the pool's chunks, the rest in a memory file.
struct PagedOut {
    /// The pool's chunks it holds, in order (pinned ahead: DMA at the copy engines' speed).
    chunks: Held,
    /// The bytes past the chunks (tmpfs pages), copied through windows pinned for the copy or
    /// through staging.
    file: Option<std::fs::File>,
    allocations: Vec<(u64, u64)>,
    bytes: u64,
    since: Instant,
}

/// What the session's thread last told the pager (under the gate).
#[derive(Default)]
pub struct Gate {
    paged: Option<PagedOut>,
    /// The session's allocations (`cuMemAlloc`'s), and the range map's version they are from.
    allocations: Vec<(u64, u64)>,
    /// Their bytes in all.
    allocated: u64,
    version: Option<u64>,
    /// Why the session cannot be paged out, if anything holds it.
    blocker: Option<String>,
}

impl Gate {
    /// Records the session's allocations as of range-map `version`, unless already known.
    pub fn set_allocations(&mut self, version: u64, allocations: impl FnOnce() -> Vec<(u64, u64)>) {
        if self.version != Some(version) {
            self.allocations = allocations();
            self.allocated = self.allocations.iter().map(|(_, len)| len).sum();
            self.version = Some(version);
        }
    }

    pub fn set_blocker(&mut self, blocker: Option<String>) {
        self.blocker = blocker;
    }
}

/// A worker's side of paging: see the module's documentation.
pub struct Pager {
    budget: Arc<SharedBudget>,
    listener: OwnedFd,
    settings: PagingSettings,
    copy_chunk: u64,
    session_id: std::sync::atomic::AtomicU64,
    gate: Mutex<Gate>,
    /// The worker's pool of host memory pinned ahead for page-outs.
    pool: OnceLock<Arc<HostPool>>,
}

impl Pager {
    /// `listener`: a descriptor of the worker's channel to the listener.
    pub fn new(budget: Arc<SharedBudget>, listener: OwnedFd, settings: PagingSettings, copy_chunk: u64) -> Self {
        Self { budget, listener, settings, copy_chunk, session_id: AtomicU64::new(0), gate: Mutex::default(), pool: OnceLock::new() }
    }

    /// Starts the worker's paging pool (chunks of `chunk` bytes), pinned ahead as the session
    /// allocates, within the host budget; page-outs copy into it first.
    pub fn start_pool<D: Device>(&self, device: Arc<D>, chunk: u64) {
        match HostPool::new(self.budget.clone(), chunk) {
            Ok(pool) => {
                let pool = Arc::new(pool);
                pool.start(device);
                let _ = self.pool.set(pool);
            }
            Err(reason) => tracing::warn!(%reason, "no paging pool: paged memory goes to memory files"),
        }
    }

    /// A pool whose thread was not started: only a page-out grows it (`HostPool::fill`).
    #[cfg(test)]
    fn attach_pool(&self, pool: Arc<HostPool>) {
        let _ = self.pool.set(pool);
    }

    /// The worker's paging pool, if started.
    pub fn pool(&self) -> Option<&Arc<HostPool>> {
        self.pool.get()
    }

    /// After a device reset, whose context took the pool's registrations: pins it again.
    pub fn pin_pool_again(&self) {
        if let Some(pool) = self.pool.get() {
            pool.pin_again();
        }
    }

    /// Names the session in the log lines.
    pub fn set_session(&self, session_id: u64) {
        self.session_id.store(session_id, Ordering::Release);
    }

    pub fn residency(&self) -> Residency<'_> {
        Residency::new(self.budget.paging_words(), self.budget.slot())
    }

    /// Claims `bytes` of resident device memory, asking the listener to page idle sessions out
    /// while they do not fit; `false` once `settings.wait` has passed with no page-out making
    /// progress (a slow page-out under way, through a memory file say, is waited for), or
    /// `MOST_WAITS` times that in all.
    pub fn claim(&self, bytes: u64) -> bool {
        let residency = self.residency();
        if residency.claim(bytes) {
            return true;
        }
        let capacity = residency.capacity();
        if bytes > capacity {
            return false;
        }
        self.wait_for_page_outs(|| (residency.resident_total() + bytes).saturating_sub(capacity).max(1), || residency.claim(bytes))
    }

    /// Asks the listener for page-outs of `short()` bytes (again every `ASK_AGAIN`) until
    /// `done()`; `false` once `settings.wait` passed with no page-out progressing, or
    /// `MOST_WAITS` times that in all.
    fn wait_for_page_outs(&self, short: impl Fn() -> u64, done: impl Fn() -> bool) -> bool {
        let residency = self.residency();
        let started = Instant::now();
        let most = started + self.settings.wait * MOST_WAITS;
        let (mut progress, mut quiet_since) = (residency.progress(), started);
        let mut asked: Option<Instant> = None;
        loop {
            let now = Instant::now();
            if asked.is_none_or(|at| now.duration_since(at) >= ASK_AGAIN) {
                let mut message = Vec::new();
                encode_into(&FromWorker::NeedMemory { bytes: short() }, &mut message);
                let _ = nix::sys::socket::send(self.listener.as_raw_fd(), &message, nix::sys::socket::MsgFlags::empty());
                asked = Some(now);
            }
            std::thread::sleep(Duration::from_millis(1));
            if done() {
                return true;
            }
            let now = Instant::now();
            let seen = residency.progress();
            if seen != progress {
                (progress, quiet_since) = (seen, now);
            }
            if now.duration_since(quiet_since) >= self.settings.wait || now >= most {
                return false;
            }
        }
    }

    /// Asks the listener to page idle sessions out until `bytes` more than now are free,
    /// though the resident count says they fit: the device refused them (its contexts, the
    /// driver's and other processes' memory are outside the count). `true` once resident bytes
    /// fell by `bytes`; bounded as [`Self::claim`].
    pub fn make_room(&self, bytes: u64) -> bool {
        let residency = self.residency();
        let target = residency.resident_total().saturating_sub(bytes);
        self.wait_for_page_outs(|| bytes, || residency.resident_total() <= target)
    }

    fn lock(&self) -> MutexGuard<'_, Gate> {
        self.gate.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Taken by the session's thread around each request: pages the session in first when it
    /// is out (the client hears `Alive` from `outbox` meanwhile). `Err` (the session stays out):
    /// no device memory became free within the wait.
    pub fn enter<D: Device>(&self, device: &D, outbox: &crate::transport::Outbox) -> Result<MutexGuard<'_, Gate>, String> {
        let mut gate = self.lock();
        if gate.paged.is_some() {
            outbox.awaiting(|| self.page_in(&mut gate, device))?;
        }
        // No page-out while the gate is held; `leave` marks the request's end as the activity.
        Ok(gate)
    }

    /// After a request: whether the session may now be paged out, and when it was last active.
    pub fn leave(&self, gate: MutexGuard<'_, Gate>) {
        if let Some(pool) = self.pool.get() {
            pool.want(gate.allocated);
        }
        let residency = self.residency();
        residency.set_pageable(gate.blocker.is_none() && self.only_allocations(&gate));
        residency.touch();
    }

    /// Whether all the device memory the session holds (its quota's count) is `cuMemAlloc`
    /// allocations, the only memory paged: pools, arrays, VMM and graph memory are not yet.
    fn only_allocations(&self, gate: &Gate) -> bool {
        self.budget.slot_used(self.budget.slot()) == gate.allocated
    }

    fn page_in<D: Device>(&self, gate: &mut Gate, device: &D) -> Result<(), String> {
        let Some(paged) = gate.paged.take() else { return Ok(()) };
        let session_id = self.session_id.load(Ordering::Acquire);
        let started = Instant::now();
        if !self.claim(paged.bytes) {
            let (waited, quiet) = (started.elapsed().as_millis(), self.settings.wait.as_millis());
            tracing::warn!(
                session_id,
                bytes = paged.bytes,
                waited_ms = waited as u64,
                "session not paged in: no device memory freed in time"
            );
            let reason = format!(
                "paging the session in needs {} bytes of device memory; none came free within {waited} ms ({quiet} ms with no page-out progressing)",
                paged.bytes
            );
            gate.paged = Some(paged);
            return Err(reason);
        }
        let waited = started.elapsed();
        let pool = self.pool.get();
        let pieces = crate::page_pool::layout(&paged.allocations, pool.map_or(1, |pool| pool.chunk()), paged.chunks.ptrs.len());
        let mut mapped: Vec<(u64, u64)> = Vec::with_capacity(paged.allocations.len());
        let mut times = PhaseTimes::default();
        let restored = (|| {
            // Each group's copies run while the next group is mapped.
            let streams = CopyStreams::new(device);
            let by_allocation = pieces_by_allocation(&pieces, paged.allocations.len());
            let index_of: std::collections::HashMap<u64, usize> =
                paged.allocations.iter().enumerate().map(|(index, (ptr, _))| (*ptr, index)).collect();
            let copies_started = Instant::now();
            for group in device.page_groups(&paged.allocations) {
                let mapping = Instant::now();
                if let Err(refused) = device.page_in(&group) {
                    // The device had less room than the resident count says: free the group's
                    // bytes elsewhere, then map it again.
                    let group_bytes = group.iter().map(|(_, len)| *len).sum();
                    if !self.make_room(group_bytes) {
                        return Err(refused);
                    }
                    device.page_in(&group)?;
                }
                times.map += mapping.elapsed();
                mapped.extend_from_slice(&group);
                for (ptr, _) in &group {
                    let index = index_of.get(ptr).ok_or_else(|| format!("{ptr:#x} was not paged out"))?;
                    queue_pool_copies(device, &paged.chunks, by_allocation[*index], false, &streams)?;
                }
            }
            device.synchronize().map_err(|error| format!("copying paged memory back: {error}"))?;
            times.copy = copies_started.elapsed().saturating_sub(times.map);
            drop(streams);
            if let Some(file) = &paged.file {
                let file_started = Instant::now();
                copy_file(device, file, 0, &file_ranges(&pieces), false, self.copy_chunk)?;
                device.synchronize().map_err(|error| format!("copying paged memory back: {error}"))?;
                times.file = file_started.elapsed();
            }
            Ok::<(), String>(())
        })();
        if let Err(reason) = restored {
            // Released or never mapped: the bytes stay saved for the next try.
            let _ = device.synchronize();
            let _ = device.page_out(&mapped);
            self.residency().unclaim(paged.bytes);
            tracing::error!(session_id, %reason, "session not paged in");
            gate.paged = Some(paged);
            return Err(reason);
        }
        let paused = paged.since.elapsed();
        let pooled = (paged.chunks.ptrs.len() as u64 * pool.map_or(0, |pool| pool.chunk())).min(paged.bytes);
        if let Some(pool) = pool {
            pool.give_back();
        }
        self.residency().paged_in(paged.bytes, paused);
        let took = started.elapsed();
        let paging = took.saturating_sub(waited);
        tracing::info!(
            session_id,
            bytes = paged.bytes,
            pooled_bytes = pooled,
            file_bytes = paged.bytes - pooled,
            wait_ms = millis(waited),
            map_ms = millis(times.map),
            copy_ms = millis(times.copy),
            file_ms = millis(times.file),
            page_in_ms = millis(paging),
            gbps = %rate(paged.bytes, paging),
            paused_ms = millis(paused),
            took_ms = millis(took),
            "session {session_id} paged in"
        );
        Ok(())
    }

    /// Pages the session out if it is idle and nothing holds it (the listener asked, for
    /// `reason`): `Ok(Some(bytes))` when it did, `Ok(None)` when it is busy or was recently
    /// paged in, `Err` when it cannot be paged (logged by the caller).
    pub fn page_out<D: Device>(&self, device: &D, reason: &str) -> Result<Option<u64>, String> {
        // A request under way holds the gate: the session is busy.
        let Ok(mut gate) = self.gate.try_lock() else { return Ok(None) };
        let outcome = self.page_out_locked(&mut gate, device, reason);
        if outcome.is_err() {
            // Not chosen again until its next request says otherwise.
            self.residency().set_pageable(false);
        }
        outcome
    }

    fn page_out_locked<D: Device>(&self, gate: &mut Gate, device: &D, reason: &str) -> Result<Option<u64>, String> {
        if gate.paged.is_some() {
            return Ok(None);
        }
        if let Some(blocker) = &gate.blocker {
            return Err(blocker.clone());
        }
        let residency = self.residency();
        let view = residency.view();
        let now = now_ms();
        let slot = self.budget.slot();
        if now.saturating_sub(view.last_active_ms) < self.settings.idle.as_millis() as u64
            || now.saturating_sub(view.resident_since_ms) < self.settings.resident_min.as_millis() as u64
            || self.budget.busy(slot)
        {
            return Ok(None);
        }
        let (allocations, bytes) = (gate.allocations.clone(), gate.allocated);
        if bytes == 0 {
            return Ok(None);
        }
        if !self.only_allocations(gate) {
            return Err("it holds device memory other than cuMemAlloc allocations (pools, arrays, VMM or graph memory)".into());
        }
        device.bind_thread().map_err(|error| format!("binding the device: {error}"))?;
        // Sessions waiting for memory wait on while this page-out moves (`claim`).
        residency.mark_progress();
        let started = Instant::now();
        device.synchronize().map_err(|error| format!("the session's work failed: {error}"))?;
        let mut times = PhaseTimes { sync: started.elapsed(), ..PhaseTimes::default() };
        let pool = self.pool.get();
        let wanted = |pool: &Arc<HostPool>| usize::try_from(bytes.div_ceil(pool.chunk())).unwrap_or(usize::MAX);
        if let Some(pool) = pool {
            // A pool behind its session (it allocated just now) grows here, as the host budget
            // allows: pinning is far faster than copying through a memory file.
            let pinning = Instant::now();
            pool.fill(device, wanted(pool), || residency.mark_progress());
            times.pin = pinning.elapsed();
        }
        let chunks = pool.map_or(Held { ptrs: Vec::new() }, |pool| pool.hold(wanted(pool)));
        let chunk = pool.map_or(1, |pool| pool.chunk());
        let pooled = (chunks.ptrs.len() as u64 * chunk).min(bytes);
        let pieces = crate::page_pool::layout(&allocations, chunk, chunks.ptrs.len());
        let copied = (|| {
            if !chunks.ptrs.is_empty() {
                let copying = Instant::now();
                let streams = CopyStreams::new(device);
                queue_pool_copies(device, &chunks, &pieces, true, &streams)?;
                device.synchronize().map_err(|error| format!("copying paged memory: {error}"))?;
                times.copy = copying.elapsed();
                residency.mark_progress();
            }
            if pooled == bytes {
                return Ok(None);
            }
            let copying = Instant::now();
            let file = paging_file(bytes - pooled)?;
            // In batches of about a chunk, each a step of progress for those waiting.
            let mut at = 0;
            let step = pool.map_or(crate::page_pool::DEFAULT_CHUNK, |pool| pool.chunk());
            for batch in batches(&file_ranges(&pieces), step) {
                copy_file(device, &file, at, batch, true, self.copy_chunk)?;
                device.synchronize().map_err(|error| format!("copying paged memory: {error}"))?;
                at += batch.iter().map(|(_, len)| len).sum::<u64>();
                residency.mark_progress();
            }
            times.file = copying.elapsed();
            Ok::<_, String>(Some(file))
        })();
        let give_back = |pool: Option<&Arc<HostPool>>| {
            // No copy may still write into them.
            let _ = device.synchronize();
            if let Some(pool) = pool {
                pool.give_back();
            }
        };
        let file = match copied {
            Ok(file) => file,
            Err(reason) => {
                give_back(pool);
                return Err(reason);
            }
        };
        let releasing = Instant::now();
        match device.page_out(&allocations) {
            Ok(()) => {}
            // Once released, even in part, the memory is out: its bytes are saved, and the next
            // request pages it in (or fails with a clear error if it cannot).
            Err((reason, true)) => {
                tracing::error!(session_id = self.session_id.load(Ordering::Acquire), %reason, "paging out failed part way");
            }
            Err((reason, false)) => {
                give_back(pool);
                return Err(reason);
            }
        }
        times.release = releasing.elapsed();
        residency.paged_out(bytes);
        residency.mark_progress();
        gate.paged = Some(PagedOut { chunks, file, allocations, bytes, since: Instant::now() });
        let session_id = self.session_id.load(Ordering::Acquire);
        tracing::info!(
            session_id,
            bytes,
            pooled_bytes = pooled,
            file_bytes = bytes - pooled,
            sync_ms = millis(times.sync),
            pin_ms = millis(times.pin),
            copy_ms = millis(times.copy),
            file_ms = millis(times.file),
            release_ms = millis(times.release),
            gbps = %rate(bytes, times.copy + times.file),
            took_ms = millis(started.elapsed()),
            %reason,
            "session {session_id} paged out"
        );
        Ok(Some(bytes))
    }
}

/// Where a page-out's or page-in's time went (the log line's phases).
#[derive(Default)]
struct PhaseTimes {
    /// Waiting for the session's own work (page-out).
    sync: Duration,
    /// Growing the pool to the session's memory (page-out; nothing when it was pinned ahead).
    pin: Duration,
    /// Mapping device memory again (page-in), all groups together.
    map: Duration,
    /// Copies with the pool's chunks (on a page-in, beyond the mapping they overlap).
    copy: Duration,
    /// Copies with the memory file past the pool.
    file: Duration,
    /// Releasing the device memory (page-out).
    release: Duration,
}

fn millis(time: Duration) -> u64 {
    time.as_millis() as u64
}

/// `bytes` in `time`, in GB/s (10^9 bytes), for the log.
fn rate(bytes: u64, time: Duration) -> String {
    let seconds = time.as_secs_f64();
    if seconds <= 0.0 { "-".into() } else { format!("{:.1}", bytes as f64 / seconds / 1e9) }
}

/// Streams paging copies run on: several, so the copy engines always have the next copy queued.
const COPY_STREAMS: usize = 4;

/// Streams made for one page-out or page-in (the null stream if none can be made), destroyed at
/// the end (the caller synchronized).
struct CopyStreams<'a, D: Device> {
    device: &'a D,
    made: Vec<D::Stream>,
    next: std::cell::Cell<usize>,
}

impl<'a, D: Device> CopyStreams<'a, D> {
    fn new(device: &'a D) -> Self {
        // CU_STREAM_NON_BLOCKING: no implicit waits with the legacy stream.
        let made = (0..COPY_STREAMS).map_while(|_| device.stream_create(1, 0).ok()).collect();
        Self { device, made, next: std::cell::Cell::new(0) }
    }

    /// The next stream, round robin.
    fn next(&self) -> D::Stream {
        if self.made.is_empty() {
            return self.device.null_stream();
        }
        let index = self.next.get();
        self.next.set(index + 1);
        self.made[index % self.made.len()]
    }
}

impl<D: Device> Drop for CopyStreams<'_, D> {
    fn drop(&mut self) {
        for stream in self.made.drain(..) {
            let _ = self.device.stream_destroy(stream);
        }
    }
}

/// Each allocation's pieces (`layout` keeps them together, in allocation order).
fn pieces_by_allocation(pieces: &[Piece], allocations: usize) -> Vec<&[Piece]> {
    let mut by_allocation: Vec<&[Piece]> = vec![&[]; allocations];
    let mut start = 0;
    while start < pieces.len() {
        let allocation = pieces[start].allocation;
        let end = start + pieces[start..].iter().take_while(|piece| piece.allocation == allocation).count();
        if let Some(slot) = by_allocation.get_mut(allocation) {
            *slot = &pieces[start..end];
        }
        start = end;
    }
    by_allocation
}

/// Queues the copies of `pieces` that lie in the held chunks, to (`to_host`) or from them,
/// spread over `streams`; the caller synchronizes.
fn queue_pool_copies<D: Device>(
    device: &D,
    chunks: &Held,
    pieces: &[Piece],
    to_host: bool,
    streams: &CopyStreams<'_, D>,
) -> Result<(), String> {
    for piece in pieces {
        let Place::Chunk { index, offset } = piece.place else { continue };
        let chunk = *chunks.ptrs.get(index).ok_or_else(|| format!("chunk {index} is not held"))? as *mut u8;
        let host = chunk.wrapping_add(offset as usize);
        let len = piece.len as usize;
        // SAFETY: `layout` keeps each piece inside its chunk, which the pool keeps mapped (and
        // pinned) while it is held, until given back after the copies are synchronized; the
        // device range lies in one of the session's allocations.
        let queued = unsafe {
            if to_host {
                device.copy_to_host(host, piece.device, len, streams.next())
            } else {
                device.copy_from_host(piece.device, host, len, streams.next())
            }
        };
        queued.map_err(|error| format!("copying {len} bytes at {:#x}: {error}", piece.device))?;
    }
    Ok(())
}

/// The device ranges of the pieces that lie in the memory file, in its order.
fn file_ranges(pieces: &[Piece]) -> Vec<(u64, u64)> {
    pieces.iter().filter(|piece| matches!(piece.place, Place::File { .. })).map(|piece| (piece.device, piece.len)).collect()
}

/// `ranges` in consecutive batches of at least `bytes` each (the last may be less), in order.
fn batches(ranges: &[(u64, u64)], bytes: u64) -> Vec<&[(u64, u64)]> {
    let mut batches = Vec::new();
    let (mut start, mut sum) = (0, 0);
    for (index, (_, len)) in ranges.iter().enumerate() {
        sum += len;
        if sum >= bytes {
            batches.push(&ranges[start..=index]);
            (start, sum) = (index + 1, 0);
        }
    }
    if start < ranges.len() {
        batches.push(&ranges[start..]);
    }
    batches
}

/// Copies `ranges` to (`to_host`) or from `file`, laid out one after the other from offset `at`:
/// through windows of it pinned for the copy where the device can, else through staging.
fn copy_file<D: Device>(
    device: &D,
    file: &std::fs::File,
    at: u64,
    ranges: &[(u64, u64)],
    to_host: bool,
    copy_chunk: u64,
) -> Result<(), String> {
    if ranges.is_empty() || crate::session::copy_direct(device, file, at, ranges, to_host)? {
        return Ok(());
    }
    std::io::Seek::seek(&mut &*file, std::io::SeekFrom::Start(at)).map_err(|error| format!("seeking in paged memory: {error}"))?;
    if to_host {
        let mut out = BufWriter::with_capacity(1 << 20, file);
        for &(ptr, len) in ranges {
            crate::session::read_device(device, copy_chunk, ptr, len, &mut out)?;
        }
        std::io::Write::flush(&mut out).map_err(|error| format!("writing paged memory: {error}"))
    } else {
        let mut input = BufReader::with_capacity(1 << 20, file);
        for &(ptr, len) in ranges {
            crate::session::write_device(device, copy_chunk, ptr, len, &mut input)?;
        }
        Ok(())
    }
}

/// Host memory left free when a page-out writes a memory file: the server, its workers and the
/// apps on this host need some (the kernel's OOM killer would end a worker, and its session).
const HOST_MEMORY_RESERVE: u64 = 2 << 30;

/// Bytes of host memory a memory file may still take: available memory and free swap (tmpfs
/// pages swap), from `/proc/meminfo`; `None` where it cannot be read.
fn host_memory_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib << 10)
    };
    Some(field("MemAvailable:")? + field("SwapFree:").unwrap_or(0))
}

/// A memory file of `len` bytes for paged-out memory (tmpfs pages: host memory, swappable);
/// refused, with the reason, when the host does not have that much memory to spare (writing it
/// anyway would have the kernel kill a worker: another session).
fn paging_file(len: u64) -> Result<std::fs::File, String> {
    if let Some(available) = host_memory_available()
        && available < len.saturating_add(HOST_MEMORY_RESERVE)
    {
        return Err(format!(
            "the host has {} MiB of memory (and swap) to spare, fewer than the {} MiB this page-out needs and {} MiB kept free",
            available >> 20,
            len >> 20,
            HOST_MEMORY_RESERVE >> 20
        ));
    }
    let fd = nix::sys::memfd::memfd_create(c"flyt-paged", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
        .map_err(|error| format!("no memory file for paged memory: {error}"))?;
    let file = std::fs::File::from(fd);
    file.set_len(len).map_err(|error| format!("sizing paged memory: {error}"))?;
    Ok(file)
}

/// The session's budget when paging is on: the tenant's quota as before, and resident bytes
/// within the device's share, waiting (bounded) for idle sessions to be paged out.
pub struct PagedBudget {
    shared: Arc<SharedBudget>,
    pager: Arc<Pager>,
}

impl PagedBudget {
    pub fn new(shared: Arc<SharedBudget>, pager: Arc<Pager>) -> Self {
        Self { shared, pager }
    }
}

impl MemoryBudget for PagedBudget {
    fn try_reserve(&self, bytes: u64) -> bool {
        if !self.shared.try_reserve(bytes) {
            return false;
        }
        if self.pager.claim(bytes) {
            return true;
        }
        self.shared.release(bytes);
        false
    }

    fn release(&self, bytes: u64) {
        self.shared.release(bytes);
        self.pager.residency().unclaim(bytes);
    }

    fn make_room(&self, bytes: u64) -> bool {
        self.pager.make_room(bytes)
    }

    fn limit(&self) -> Option<u64> {
        self.shared.limit()
    }

    fn used(&self) -> u64 {
        self.shared.used()
    }

    fn set_owner(&self, app_pid: u32) {
        self.shared.set_owner(app_pid);
    }

    fn processes(&self) -> Vec<(u32, u64)> {
        self.shared.processes()
    }

    fn set_active_since(&self, work: Work, tick: u64) {
        self.shared.set_active_since(work, tick);
    }

    fn mark_active(&self, work: Work, from: u64, to: u64) {
        self.shared.mark_active(work, from, to);
    }

    fn active_ticks(&self, now: u64) -> [u32; KINDS] {
        self.shared.active_ticks(now)
    }
}

/// The listener's side: decides whom to page out.
pub struct Coordinator {
    pub settings: PagingSettings,
    /// Device memory per byte of quota: the server's share of the GPU is its quota divided by it.
    oversubscribe: f64,
    /// Host memory the workers' paging pools may pin, all together (`--page-host-budget`).
    host_budget: u64,
    /// When each slot was last asked, so a slow page-out is not asked again at once.
    asked: Mutex<std::collections::HashMap<usize, Instant>>,
}

/// How long a slot asked to page out is left alone before it may be asked again.
const ASKED_GRACE: Duration = Duration::from_millis(50);

impl Coordinator {
    pub fn new(settings: PagingSettings, oversubscribe: f64, host_budget: u64) -> Self {
        Self { settings, oversubscribe, host_budget, asked: Mutex::default() }
    }

    /// Sets the resident capacity from the device memory a worker reported (its slice): the
    /// quota divided by the oversubscription, at most the device's.
    pub fn set_capacity(&self, budget: &SharedBudget, device_bytes: u64) {
        let share = budget.limit().map_or(device_bytes, |quota| (quota as f64 / self.oversubscribe) as u64);
        let capacity = share.min(device_bytes).max(1);
        let residency = Residency::new(budget.paging_words(), 0);
        residency.set_pinned_limit(self.host_budget);
        if residency.capacity() != capacity {
            tracing::info!(
                capacity,
                oversubscribe = self.oversubscribe,
                host_budget = self.host_budget,
                "paging on: device memory resident at once"
            );
            residency.set_capacity(capacity);
        }
    }

    /// The slots to page out so that `bytes` more fit, among `live` (slot, session id), for
    /// `requester`: idle, pageable, past their minimum residency, least recently active first.
    pub fn victims(&self, budget: &SharedBudget, requester: usize, bytes: u64, live: &[usize]) -> Vec<usize> {
        let now = now_ms();
        let views: Vec<SlotView> =
            live.iter().filter(|slot| !budget.busy(**slot)).map(|slot| Residency::new(budget.paging_words(), *slot).view()).collect();
        let mut asked = self.asked.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let instant = Instant::now();
        asked.retain(|_, at| instant.duration_since(*at) < ASKED_GRACE);
        let chosen = choose(&views, requester, bytes, now, &self.settings, |slot| asked.contains_key(&slot));
        for slot in &chosen {
            asked.insert(*slot, instant);
        }
        chosen
    }
}

/// The victims among `views`: see [`Coordinator::victims`]; `recently_asked` ones are left
/// out, but count as memory on its way.
fn choose(
    views: &[SlotView],
    requester: usize,
    bytes: u64,
    now: u64,
    settings: &PagingSettings,
    recently_asked: impl Fn(usize) -> bool,
) -> Vec<usize> {
    let idle = settings.idle.as_millis() as u64;
    let resident_min = settings.resident_min.as_millis() as u64;
    let mut candidates: Vec<&SlotView> = views
        .iter()
        .filter(|view| {
            view.slot != requester
                && view.resident > 0
                && view.pageable
                && !view.paged
                && now.saturating_sub(view.last_active_ms) >= idle
                && now.saturating_sub(view.resident_since_ms) >= resident_min
        })
        .collect();
    candidates.sort_by_key(|view| view.last_active_ms);
    let mut freed: u64 = 0;
    let mut chosen = Vec::new();
    for view in candidates {
        if freed >= bytes {
            break;
        }
        freed += view.resident;
        if !recently_asked(view.slot) {
            chosen.push(view.slot);
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> PagingSettings {
        PagingSettings { idle: Duration::from_millis(100), resident_min: Duration::from_millis(1000), wait: Duration::from_secs(1) }
    }

    fn view(slot: usize, resident: u64, last_active_ms: u64) -> SlotView {
        SlotView { slot, resident, last_active_ms, resident_since_ms: 1, pageable: true, ..SlotView::default() }
    }

    #[test]
    fn the_least_recently_active_idle_sessions_go_first_and_only_as_many_as_needed() {
        let views = [view(1, 40, 5000), view(2, 40, 3000), view(3, 40, 4000), view(4, 40, 9950)];
        // 50 bytes short: the two idle longest (2, then 3); 4 is not idle yet (50 ms).
        assert_eq!(choose(&views, 9, 50, 10_000, &settings(), |_| false), vec![2, 3]);
        assert_eq!(choose(&views, 9, 40, 10_000, &settings(), |_| false), vec![2]);
        // The requester itself is never chosen.
        assert_eq!(choose(&views, 2, 40, 10_000, &settings(), |_| false), vec![3]);
        // A slot already asked counts as on its way.
        assert_eq!(choose(&views, 9, 50, 10_000, &settings(), |slot| slot == 2), vec![3]);
    }

    #[test]
    fn unpageable_paged_and_recently_paged_in_sessions_are_never_chosen() {
        let mut blocked = view(1, 40, 1000);
        blocked.pageable = false;
        let mut paged = view(2, 0, 1000);
        paged.paged = true;
        let mut fresh = view(3, 40, 1000);
        fresh.resident_since_ms = 9500;
        assert!(choose(&[blocked, paged, fresh], 9, 10, 10_000, &settings(), |_| false).is_empty());
    }

    /// The mechanism on the emulated device: the bytes leave its memory and come back at the
    /// same address; the residency count follows; the pool's chunks hold what fits them, a
    /// memory file the rest, and are given back and taken again, pinned once.
    #[test]
    fn a_paged_out_sessions_bytes_leave_the_device_and_come_back_at_their_address() {
        // No host budget (all through the file), a pool smaller than the session, one that
        // holds it.
        // The driver's cuMemAlloc memory (paging's own memory not made), and memory made in
        // addresses the worker reserves, as a paging server makes it.
        for keep_addresses in [false, true] {
            for pool_chunks in [0, 2, 8] {
                page_out_and_in(pool_chunks, keep_addresses);
            }
        }
    }

    #[test]
    fn a_memory_file_larger_than_the_host_can_spare_is_refused() {
        let available = host_memory_available().expect("/proc/meminfo");
        let refused = paging_file(available + (1 << 30)).expect_err("more than the host has");
        assert!(refused.contains("to spare"), "{refused}");
        assert!(paging_file(1 << 20).is_ok());
    }

    fn page_out_and_in(pool_chunks: u64, keep_addresses: bool) {
        use crate::backend::emulated::{EmulatedConfig, EmulatedDevice};
        const MIB: u64 = 1 << 20;
        // Two allocations, one not a whole number of chunks: 4 MiB + 12 KiB in all.
        let lens = [3 * MIB, MIB + (12 << 10)];
        let total: u64 = lens.iter().sum();
        let device = Arc::new(
            EmulatedDevice::new(EmulatedConfig { memory: 8 * MIB, sms: 1, host_gpus: vec![0] }).keep_allocation_addresses(keep_addresses),
        );
        let (_listener_page, budget) = tenant_page(3);
        budget.paging_words()[CAPACITY].store(8 * MIB, Ordering::Release);
        let (ours, _listener) = std::os::unix::net::UnixDatagram::pair().unwrap();
        let (app, _app_end) = std::os::unix::net::UnixStream::pair().unwrap();
        let outbox = crate::transport::Outbox::new(crate::transport::Connection::Unix(app), None, None);
        let settings = PagingSettings { idle: Duration::ZERO, resident_min: Duration::ZERO, wait: Duration::from_millis(100) };
        let pager = Arc::new(Pager::new(budget.clone(), ours.into(), settings, MIB));
        // The host budget all pools share: this worker's pool pins what it allows, ahead.
        Residency::new(budget.paging_words(), 0).set_pinned_limit(pool_chunks * MIB);
        pager.start_pool(device.clone(), MIB);
        let quota = PagedBudget::new(budget.clone(), pager.clone());
        assert!(quota.try_reserve(total));
        let pattern =
            |round: u64, which: usize| -> Vec<u8> { (0..lens[which]).map(|i| ((i + round * 7 + which as u64) % 251) as u8).collect() };
        let allocations = session_allocations(&device, &pager, &outbox, &lens, |which| pattern(0, which));

        let free = |device: &EmulatedDevice| device.mem_get_info().unwrap().0;
        let pool = pager.pool().expect("a pool").clone();
        // Pinned ahead, as the session's memory (5 chunks) allows the budget.
        let chunks = pool_chunks.min(total.div_ceil(MIB)) as usize;
        let deadline = Instant::now() + Duration::from_secs(10);
        while pool.chunks() < chunks {
            assert!(Instant::now() < deadline, "pool not pinned ahead");
            std::thread::sleep(Duration::from_millis(2));
        }
        let (registered, pinned_ahead) = (device.registrations(), device.registered_bytes());
        assert_eq!(pinned_ahead, chunks as u64 * MIB);
        assert_eq!(pager.residency().pinned_total(), pinned_ahead, "counted in the host budget");
        // Memory made in reserved addresses takes whole pages (2 MiB here): 4 MiB and a page of
        // packed small allocations.
        let device_bytes = if keep_addresses { 6 * MIB } else { total };
        assert_eq!(device.own_memory_bytes(), if keep_addresses { (device_bytes, device_bytes) } else { (0, 0) });
        for round in 0..3u64 {
            write_patterns(&device, &allocations, |which| pattern(round, which));
            let before = free(&device);
            assert_eq!(pager.page_out(&*device, "test"), Ok(Some(total)));
            assert_eq!(free(&device) - before, device_bytes, "the bytes left the device's memory");
            if keep_addresses {
                assert_eq!(device.own_memory_bytes(), (device_bytes, 0), "the addresses stay reserved");
            }
            assert_eq!(pager.residency().resident_total(), 0);
            assert!(pager.residency().view().paged);
            assert_eq!(pager.page_out(&*device, "again"), Ok(None), "already out");
            assert_eq!(device.registered_bytes(), pinned_ahead, "nothing left pinned but the pool");
            assert_eq!(pool.chunks(), chunks);
            if chunks as u64 * MIB >= total {
                assert_eq!(device.registrations(), registered, "nothing pinned for the page-out");
            }

            // The next request pages it in: the same addresses, the same bytes.
            let gate = pager.enter(&*device, &outbox).unwrap();
            for (which, &(ptr, len)) in allocations.iter().enumerate() {
                let mut back = Vec::new();
                crate::session::read_device(&*device, MIB, ptr, len, &mut back).unwrap();
                assert!(back == pattern(round, which), "allocation {which}'s bytes in round {round}");
            }
            assert_eq!(free(&device), before);
            assert_eq!((pool.chunks(), device.registered_bytes()), (chunks, pinned_ahead), "the same chunks, kept pinned");
            if chunks as u64 * MIB >= total {
                assert_eq!(device.registrations(), registered, "nothing pinned for the page-in");
            }
            let view = pager.residency().view();
            let turns = round + 1;
            assert_eq!(
                (view.resident, view.paged, view.paged_out_bytes, view.paged_in_bytes, view.page_outs),
                (total, false, turns * total, turns * total, turns)
            );
            pager.leave(gate);
        }

        // A blocked session is refused, whatever it holds.
        let mut gate = pager.enter(&*device, &outbox).unwrap();
        gate.set_blocker(Some("a stream capture is under way".into()));
        pager.leave(gate);
        assert_eq!(pager.page_out(&*device, "test"), Err("a stream capture is under way".into()));
        assert!(!pager.residency().view().pageable);
    }

    /// A page-in that maps its first group and cannot map the next releases what it mapped and
    /// keeps the session out, its bytes still in its pool's chunks, for the next request.
    #[test]
    fn a_page_in_that_fails_part_way_keeps_the_session_out_with_its_bytes() {
        // The driver's memory, and memory made in reserved addresses (the first allocation
        // packed in a page of 2 MiB, the second in 4 MiB: the blocker leaves room for the first).
        page_in_fails_part_way(false, "do not fit");
        page_in_fails_part_way(true, "device memory mapped at");
    }

    fn page_in_fails_part_way(keep_addresses: bool, refusal: &str) {
        use crate::backend::emulated::{EmulatedConfig, EmulatedDevice};
        const MIB: u64 = 1 << 20;
        let lens = [MIB, 3 * MIB];
        let total: u64 = lens.iter().sum();
        let device = Arc::new(
            EmulatedDevice::new(EmulatedConfig { memory: 8 * MIB, sms: 1, host_gpus: vec![0] }).keep_allocation_addresses(keep_addresses),
        );
        let (_listener_page, budget) = tenant_page(4);
        // Residency allows more than the device holds: something else takes its memory meanwhile.
        budget.paging_words()[CAPACITY].store(16 * MIB, Ordering::Release);
        Residency::new(budget.paging_words(), 0).set_pinned_limit(8 * MIB);
        let (ours, _listener) = std::os::unix::net::UnixDatagram::pair().unwrap();
        let (app, _app_end) = std::os::unix::net::UnixStream::pair().unwrap();
        let outbox = crate::transport::Outbox::new(crate::transport::Connection::Unix(app), None, None);
        let settings = PagingSettings { idle: Duration::ZERO, resident_min: Duration::ZERO, wait: Duration::from_millis(100) };
        let pager = Arc::new(Pager::new(budget.clone(), ours.into(), settings, MIB));
        pager.start_pool(device.clone(), MIB);
        assert!(PagedBudget::new(budget.clone(), pager.clone()).try_reserve(total));
        let pattern = |which: usize| -> Vec<u8> { (0..lens[which]).map(|i| ((i * 13 + which as u64) % 241) as u8).collect() };
        let allocations = session_allocations(&device, &pager, &outbox, &lens, pattern);
        let pool = pager.pool().unwrap().clone();
        let deadline = Instant::now() + Duration::from_secs(10);
        while pool.chunks() < 4 {
            assert!(Instant::now() < deadline, "pool not pinned ahead");
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(pager.page_out(&*device, "test"), Ok(Some(total)));
        // 6 MiB of the device taken: the first allocation (1 MiB) maps again, the second cannot.
        let blocker = device.malloc(6 * MIB).unwrap();
        let free = device.mem_get_info().unwrap().0;
        let refused = pager.enter(&*device, &outbox).err().expect("not paged in");
        assert!(refused.contains(refusal), "{refused}");
        assert_eq!(device.mem_get_info().unwrap().0, free, "what it mapped, released again");
        assert!(pager.residency().view().paged);
        assert_eq!(pager.residency().resident_total(), 0, "its residency given back");
        // Room again: the next request pages it in, every byte as it was.
        device.free(blocker).unwrap();
        assert_paged_in_with_patterns(&device, &pager, &outbox, &allocations, pattern);
        assert!(!pager.residency().view().paged);
    }

    /// The driver's allocator keeps the addresses of freed `cuMemAlloc` memory for itself (three
    /// PyTorch tenants on an H200): memory from it cannot come back where it was after a
    /// page-out, while memory the worker makes in addresses it reserves (a paging server's) does,
    /// small allocations packed, every byte where it was.
    #[test]
    fn allocations_come_back_at_their_addresses_where_the_driver_keeps_freed_ones() {
        use crate::backend::emulated::{EmulatedConfig, EmulatedDevice};
        const MIB: u64 = 1 << 20;
        let lens = [4, 4096, 3 * MIB, 100_000];
        let total: u64 = lens.iter().sum();
        for keep_addresses in [false, true] {
            let config = EmulatedConfig { memory: 8 * MIB, sms: 1, host_gpus: vec![0] };
            let device = Arc::new(EmulatedDevice::new(config).driver_keeps_freed_addresses(true).keep_allocation_addresses(keep_addresses));
            let (_listener_page, budget) = tenant_page(5);
            budget.paging_words()[CAPACITY].store(8 * MIB, Ordering::Release);
            let (app, _app_end) = std::os::unix::net::UnixStream::pair().unwrap();
            let outbox = crate::transport::Outbox::new(crate::transport::Connection::Unix(app), None, None);
            let (pager, _listener) = pager_of_slot(&budget, Duration::from_millis(100));
            assert!(PagedBudget::new(budget.clone(), pager.clone()).try_reserve(total));
            let pattern = |which: usize| -> Vec<u8> { (0..lens[which]).map(|i| ((i * 7 + which as u64) % 253) as u8).collect() };
            let allocations = session_allocations(&device, &pager, &outbox, &lens, pattern);
            assert_eq!(pager.page_out(&*device, "test"), Ok(Some(total)));
            // Meanwhile the driver gives out memory of its own: where it kept freed addresses.
            let (other, _) = device.graph_staging_alloc(MIB).unwrap();
            let entered = pager.enter(&*device, &outbox);
            if !keep_addresses {
                assert_eq!(other, allocations[0].0, "the driver gave the session's first address away");
                let refused = entered.err().expect("no page-in where the addresses are taken");
                assert!(refused.contains("are taken"), "{refused}");
                continue;
            }
            assert!(allocations.iter().all(|(ptr, len)| other + MIB <= *ptr || ptr + len <= other), "not in the session's addresses");
            let gate = entered.expect("paged in");
            assert_patterns(&device, &allocations, pattern);
            pager.leave(gate);
            // The small ones share a page: two spans of memory in all (one packed, one large).
            assert_eq!(device.own_memory_bytes(), (6 * MIB, 6 * MIB));
            for (ptr, _) in &allocations {
                device.free(*ptr).unwrap();
            }
            assert_eq!(device.own_memory_bytes(), (0, 0), "freed with their reservations");
        }
    }

    /// An allocation of each of `lens` on `device`, each filled with `pattern(which)`, then given
    /// to `pager` as the session's (as the session's first op does).
    fn session_allocations(
        device: &crate::backend::emulated::EmulatedDevice,
        pager: &Pager,
        outbox: &crate::transport::Outbox,
        lens: &[u64],
        pattern: impl Fn(usize) -> Vec<u8>,
    ) -> Vec<(u64, u64)> {
        let allocations: Vec<(u64, u64)> = lens.iter().map(|len| (device.malloc(*len).unwrap(), *len)).collect();
        write_patterns(device, &allocations, pattern);
        let mut gate = pager.enter(device, outbox).unwrap();
        gate.set_allocations(1, || allocations.clone());
        gate.set_blocker(None);
        pager.leave(gate);
        allocations
    }

    fn write_patterns(device: &crate::backend::emulated::EmulatedDevice, allocations: &[(u64, u64)], pattern: impl Fn(usize) -> Vec<u8>) {
        for (which, &(ptr, len)) in allocations.iter().enumerate() {
            crate::session::write_device(device, 1 << 20, ptr, len, &mut pattern(which).as_slice()).unwrap();
        }
    }

    /// Pages the session in through `pager` and checks every byte of `allocations` is `pattern`'s.
    fn assert_paged_in_with_patterns(
        device: &crate::backend::emulated::EmulatedDevice,
        pager: &Pager,
        outbox: &crate::transport::Outbox,
        allocations: &[(u64, u64)],
        pattern: impl Fn(usize) -> Vec<u8>,
    ) {
        let gate = pager.enter(device, outbox).unwrap();
        assert_patterns(device, allocations, pattern);
        pager.leave(gate);
    }

    fn assert_patterns(device: &crate::backend::emulated::EmulatedDevice, allocations: &[(u64, u64)], pattern: impl Fn(usize) -> Vec<u8>) {
        for (which, &(ptr, len)) in allocations.iter().enumerate() {
            let mut back = Vec::new();
            crate::session::read_device(device, 1 << 20, ptr, len, &mut back).unwrap();
            assert!(back == pattern(which), "allocation {which}'s bytes");
        }
    }

    /// A tenant page without a limit (the listener's view, kept alive) and worker slot `slot`'s.
    fn tenant_page(slot: usize) -> (SharedBudget, Arc<SharedBudget>) {
        let (fd, listener_page) = SharedBudget::create(None).unwrap();
        (listener_page, Arc::new(SharedBudget::map(&std::fs::File::from(fd), slot).unwrap()))
    }

    fn pager_of_slot(budget: &Arc<SharedBudget>, wait: Duration) -> (Arc<Pager>, std::os::unix::net::UnixDatagram) {
        let (ours, listener) = std::os::unix::net::UnixDatagram::pair().unwrap();
        listener.set_nonblocking(true).unwrap();
        let settings = PagingSettings { idle: Duration::ZERO, resident_min: Duration::ZERO, wait };
        (Arc::new(Pager::new(budget.clone(), ours.into(), settings, 1 << 20)), listener)
    }

    /// The pager of worker slot 5 (see [`tenant_page`], [`pager_of_slot`]) where `capacity` bytes
    /// may be resident, `held` of them by worker slot 6.
    fn crowded_pager(
        capacity: u64,
        held: u64,
        wait: Duration,
    ) -> (SharedBudget, Arc<SharedBudget>, Arc<Pager>, std::os::unix::net::UnixDatagram) {
        let (listener_page, budget) = tenant_page(5);
        let other = Residency::new(budget.paging_words(), 6);
        other.set_capacity(capacity);
        assert!(other.claim(held));
        let (pager, listener) = pager_of_slot(&budget, wait);
        (listener_page, budget, pager, listener)
    }

    /// A device that refuses memory the resident count has room for: `make_room` asks the
    /// listener for that many bytes though they "fit", returns once another session's page-out
    /// freed them, and fails after the wait when none does.
    #[test]
    fn making_room_asks_for_a_page_out_the_count_did_not_call_for() {
        let wait = Duration::from_millis(150);
        let (_listener_page, budget, pager, listener) = crowded_pager(1000, 300, wait);
        let other = Residency::new(budget.paging_words(), 6);
        assert!(pager.claim(100), "the count has room");
        // Nobody pages out: refused after the wait, having asked for the bytes.
        let started = Instant::now();
        assert!(!pager.make_room(200));
        assert!(started.elapsed() >= wait, "{:?}", started.elapsed());
        let mut message = [0u8; 256];
        let len = listener.recv(&mut message).expect("the listener was asked");
        match flyt_protocol::frame::decode_exact::<FromWorker>(&message[..len]) {
            Ok(FromWorker::NeedMemory { bytes }) => assert_eq!(bytes, 200),
            other => panic!("asked {other:?}"),
        }
        // The other session goes out: room made.
        let made = std::thread::scope(|scope| {
            scope.spawn(|| {
                std::thread::sleep(Duration::from_millis(40));
                other.unclaim(300);
                other.mark_progress();
            });
            pager.make_room(200)
        });
        assert!(made);
        assert_eq!(pager.residency().view().resident, 100, "its own claim stays");
    }

    /// A claim waits while page-outs progress (however long they take), fails after the wait
    /// with none progressing, and after `MOST_WAITS` waits in all when progress frees nothing.
    #[test]
    fn a_claim_waits_while_page_outs_progress_and_no_longer() {
        let wait = Duration::from_millis(150);
        let (_listener_page, budget, pager, _listener) = crowded_pager(100, 100, wait);
        let other = Residency::new(budget.paging_words(), 6);
        // Nothing progresses: out after the wait.
        let started = Instant::now();
        assert!(!pager.claim(40));
        let waited = started.elapsed();
        assert!(waited >= wait && waited < wait * 3, "{waited:?}");
        // A page-out taking four times the wait, a step every 50 ms: the claim waits for it.
        let started = Instant::now();
        let claimed = std::thread::scope(|scope| {
            scope.spawn(|| {
                let other = Residency::new(budget.paging_words(), 6);
                for _ in 0..12 {
                    other.mark_progress();
                    std::thread::sleep(Duration::from_millis(50));
                }
                other.unclaim(100);
                other.mark_progress();
            });
            pager.claim(40)
        });
        let waited = started.elapsed();
        assert!(claimed, "the slow page-out's memory, claimed after {waited:?}");
        assert!(waited >= Duration::from_millis(550), "{waited:?}");
        assert_eq!(pager.residency().view().resident, 40);
        // Progress that never frees enough: out after MOST_WAITS waits in all.
        assert!(other.claim(60));
        let stop = std::sync::atomic::AtomicBool::new(false);
        let started = Instant::now();
        let claimed = std::thread::scope(|scope| {
            scope.spawn(|| {
                while !stop.load(Ordering::Acquire) {
                    other.mark_progress();
                    std::thread::sleep(Duration::from_millis(20));
                }
            });
            let claimed = pager.claim(40);
            stop.store(true, Ordering::Release);
            claimed
        });
        let waited = started.elapsed();
        assert!(!claimed);
        assert!(waited >= wait * MOST_WAITS && waited < wait * (MOST_WAITS + 3), "{waited:?}");
    }

    /// A page-out that comes before its pool's thread caught up with the session grows the pool
    /// on the spot (as the host budget allows) instead of writing a memory file.
    #[test]
    fn a_page_out_fills_a_pool_that_is_behind_instead_of_writing_a_file() {
        use crate::backend::emulated::{EmulatedConfig, EmulatedDevice};
        const MIB: u64 = 1 << 20;
        let lens = [3 * MIB, MIB + (12 << 10)];
        let total: u64 = lens.iter().sum();
        let device = Arc::new(EmulatedDevice::new(EmulatedConfig { memory: 8 * MIB, sms: 1, host_gpus: vec![0] }));
        let (_listener_page, budget) = tenant_page(7);
        budget.paging_words()[CAPACITY].store(8 * MIB, Ordering::Release);
        Residency::new(budget.paging_words(), 0).set_pinned_limit(16 * MIB);
        let (pager, _listener) = pager_of_slot(&budget, Duration::from_millis(100));
        let pool = Arc::new(HostPool::new(budget.clone(), MIB).unwrap());
        pager.attach_pool(pool.clone());
        assert!(PagedBudget::new(budget.clone(), pager.clone()).try_reserve(total));
        let pattern = |which: usize| -> Vec<u8> { (0..lens[which]).map(|i| ((i * 7 + which as u64) % 253) as u8).collect() };
        let (app, _app_end) = std::os::unix::net::UnixStream::pair().unwrap();
        let outbox = crate::transport::Outbox::new(crate::transport::Connection::Unix(app), None, None);
        let allocations = session_allocations(&device, &pager, &outbox, &lens, pattern);
        assert_eq!(pool.chunks(), 0, "nothing pinned ahead");
        let progress = pager.residency().progress();
        assert_eq!(pager.page_out(&*device, "test"), Ok(Some(total)));
        assert_eq!(pool.chunks(), 5, "grown for the page-out");
        assert_eq!(device.registered_bytes(), 5 * MIB);
        // Its start, the pool's batches, the copy, its end.
        assert!(pager.residency().progress() >= progress + 4);
        assert_paged_in_with_patterns(&device, &pager, &outbox, &allocations, pattern);
    }

    #[test]
    fn batches_are_at_least_the_step_and_keep_the_order() {
        let ranges = [(0, 3), (10, 1), (20, 1), (30, 5), (40, 1)];
        assert_eq!(batches(&ranges, 2), vec![&ranges[0..1], &ranges[1..3], &ranges[3..4], &ranges[4..]]);
        assert_eq!(batches(&ranges, 100), vec![&ranges[..]]);
        assert!(batches(&[], 1).is_empty());
    }

    #[test]
    fn claims_stay_within_the_capacity_and_a_dead_slot_gives_its_bytes_back() {
        let (_fd, page) = SharedBudget::create(None).unwrap();
        let words = page.paging_words();
        let (first, second) = (Residency::new(words, 1), Residency::new(words, 2));
        assert!(first.claim(1 << 40), "no capacity: no limit");
        first.unclaim(1 << 40);
        first.set_capacity(100);
        assert!(first.claim(60));
        assert!(!second.claim(41));
        assert!(second.claim(40));
        assert_eq!(first.unclaim(100), 60, "only what the slot holds");
        assert_eq!(first.resident_total(), 40);
        second.field(PINNED).store(7, Ordering::Release);
        words[PINNED_TOTAL].store(9, Ordering::Release);
        second.reclaim();
        assert_eq!(first.resident_total(), 0);
        assert_eq!(words[PINNED_TOTAL].load(Ordering::Acquire), 2, "a dead worker's pinned bytes go back");
        assert_eq!(second.view(), SlotView { slot: 2, ..SlotView::default() });
    }
}
