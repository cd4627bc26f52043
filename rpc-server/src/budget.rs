//! The tenant page: what the sessions of one rpc-server (one allocation, one tenant) share across
//! their worker processes. The listener creates it and every worker maps it; each worker writes
//! only its own slot, so the listener can take back what a dead worker held.
//!
//! - **Memory budget:** one quota for all sessions together, and the bytes each holds.
//! - **Owners:** the app process each session serves, for NVML's process list.
//! - **Activity:** when each session had kernels or copies queued and not yet seen done, for
//!   NVML's utilization (see [`crate::activity`]).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::activity::{KINDS, WINDOW_TICKS, Work};

/// What a session may allocate, and what it tells the tenant's other sessions.
pub trait MemoryBudget: Send + Sync {
    /// Reserves `bytes`, or says no if that would pass the quota.
    fn try_reserve(&self, bytes: u64) -> bool;
    fn release(&self, bytes: u64);
    /// The quota in bytes, if there is one.
    fn limit(&self) -> Option<u64>;
    /// Bytes reserved by all sessions together.
    fn used(&self) -> u64;
    /// Names the app process this worker's session serves.
    fn set_owner(&self, app_pid: u32);
    /// The app processes of the tenant's live sessions with the device memory each holds.
    fn processes(&self) -> Vec<(u32, u64)>;
    /// This session has had `work` queued since `tick` (0: no longer).
    fn set_active_since(&self, work: Work, tick: u64);
    /// This session had `work` queued through the ticks `from..=to`.
    fn mark_active(&self, work: Work, from: u64, to: u64);
    /// Per kind of work, the ticks of the window ending at `now` in which any of the tenant's
    /// sessions had such work queued (0 to `WINDOW_TICKS`).
    fn active_ticks(&self, now: u64) -> [u32; KINDS];
    /// The device refused `bytes` that the budget had room for (its contexts and the driver's
    /// own memory are not counted): frees at least that much by paging idle sessions out,
    /// waiting as a reservation does; `false` when nothing could be freed (paging off).
    fn make_room(&self, _bytes: u64) -> bool {
        false
    }
}

/// Adds `bytes` to `used` unless that passes `limit`; exact under concurrency.
pub fn reserve_within(used: &AtomicU64, limit: Option<u64>, bytes: u64) -> bool {
    used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |current| {
        let next = current.checked_add(bytes)?;
        match limit {
            Some(limit) if next > limit => None,
            _ => Some(next),
        }
    })
    .is_ok()
}

/// The page shared by the listener and its workers, `AtomicU64` words:
/// `[limit, used, held per slot.., owner per slot.., active-since per slot and kind..,
/// ring per kind..]`. `limit == u64::MAX` means no quota; an owner or active-since of 0, none.
/// A ring holds, per tick of the window, the tick's number when some session was active in it.
pub struct SharedBudget {
    map: memmap2::MmapMut,
    slot: usize,
}

/// Sessions that can hold memory at once (one slot per live worker).
pub const BUDGET_SLOTS: usize = 500;
const HELD: usize = 2;
const OWNERS: usize = HELD + BUDGET_SLOTS;
const ACTIVE_SINCE: usize = OWNERS + BUDGET_SLOTS;
const RINGS: usize = ACTIVE_SINCE + BUDGET_SLOTS * KINDS;
const PAGING: usize = RINGS + KINDS * WINDOW_TICKS as usize;
/// The paging words (`crate::paging::Residency` lays them out) end the page.
const PAGE_WORDS: usize = PAGING + crate::paging::PAGING_WORDS;
const NO_LIMIT: u64 = u64::MAX;

impl SharedBudget {
    /// Creates the page (in the listener) and returns it with the descriptor workers inherit.
    pub fn create(limit: Option<u64>) -> std::io::Result<(std::os::fd::OwnedFd, Self)> {
        let fd = nix::sys::memfd::memfd_create(c"flyt-budget", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)?;
        let file = std::fs::File::from(fd);
        file.set_len((PAGE_WORDS * 8) as u64)?;
        let budget = Self::map(&file, 0)?;
        budget.words()[0].store(limit.unwrap_or(NO_LIMIT), Ordering::Release);
        Ok((file.into(), budget))
    }

    /// Maps an existing page (in a worker) and uses `slot` for this worker's share.
    pub fn map(file: &std::fs::File, slot: usize) -> std::io::Result<Self> {
        if slot >= BUDGET_SLOTS {
            return Err(std::io::Error::other("budget slot out of range"));
        }
        // SAFETY: the memfd is private to this server's processes, sized above to PAGE_WORDS
        // words, and only ever accessed through atomics (see `words`), so concurrent writers in
        // other processes are not a data race on this mapping.
        let map = unsafe { memmap2::MmapOptions::new().len(PAGE_WORDS * 8).map_mut(file)? };
        Ok(Self { map, slot })
    }

    fn words(&self) -> &[AtomicU64] {
        // SAFETY: the mapping is PAGE_WORDS * 8 bytes, page-aligned (so 8-aligned), lives as long
        // as `self`, and `AtomicU64` has the size and alignment of `u64`; every access to it, in
        // every process, goes through these atomics.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().cast::<AtomicU64>(), PAGE_WORDS) }
    }

    fn active_since_word(&self, slot: usize, work: Work) -> &AtomicU64 {
        &self.words()[ACTIVE_SINCE + slot * KINDS + work as usize]
    }

    fn ring(&self, work: Work) -> &[AtomicU64] {
        let start = RINGS + work as usize * WINDOW_TICKS as usize;
        &self.words()[start..start + WINDOW_TICKS as usize]
    }

    /// Changes the quota for every session (a session above it keeps what it has).
    pub fn set_limit(&self, limit: Option<u64>) {
        self.words()[0].store(limit.unwrap_or(NO_LIMIT), Ordering::Release);
    }

    /// Bytes a worker's slot holds.
    pub fn slot_used(&self, slot: usize) -> u64 {
        self.words().get(HELD + slot).map_or(0, |word| word.load(Ordering::Acquire))
    }

    /// Takes back what a dead worker held, and forgets its app and its activity.
    pub fn reclaim(&self, slot: usize) {
        if slot >= BUDGET_SLOTS {
            return;
        }
        let words = self.words();
        let held = words[HELD + slot].swap(0, Ordering::AcqRel);
        words[1].fetch_sub(held, Ordering::AcqRel);
        words[OWNERS + slot].store(0, Ordering::Release);
        for work in Work::ALL {
            self.active_since_word(slot, work).store(0, Ordering::Release);
        }
        crate::paging::Residency::new(self.paging_words(), slot).reclaim();
    }

    /// The words of device residency (oversubscription's paging), shared like the rest.
    pub fn paging_words(&self) -> &[AtomicU64] {
        &self.words()[PAGING..]
    }

    /// The slot this mapping writes (its worker's).
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Whether a slot's session has kernels or copies queued and not yet seen done.
    pub fn busy(&self, slot: usize) -> bool {
        slot < BUDGET_SLOTS && Work::ALL.iter().any(|work| self.active_since_word(slot, *work).load(Ordering::Acquire) != 0)
    }
}

impl MemoryBudget for SharedBudget {
    fn try_reserve(&self, bytes: u64) -> bool {
        let words = self.words();
        if !reserve_within(&words[1], self.limit(), bytes) {
            return false;
        }
        words[HELD + self.slot].fetch_add(bytes, Ordering::AcqRel);
        true
    }

    fn release(&self, bytes: u64) {
        let words = self.words();
        words[HELD + self.slot].fetch_sub(bytes, Ordering::AcqRel);
        words[1].fetch_sub(bytes, Ordering::AcqRel);
    }

    fn limit(&self) -> Option<u64> {
        match self.words()[0].load(Ordering::Acquire) {
            NO_LIMIT => None,
            limit => Some(limit),
        }
    }

    fn used(&self) -> u64 {
        self.words()[1].load(Ordering::Acquire)
    }

    fn set_owner(&self, app_pid: u32) {
        self.words()[OWNERS + self.slot].store(u64::from(app_pid), Ordering::Release);
    }

    fn processes(&self) -> Vec<(u32, u64)> {
        let words = self.words();
        (0..BUDGET_SLOTS)
            .filter_map(|slot| {
                let pid = u32::try_from(words[OWNERS + slot].load(Ordering::Acquire)).ok().filter(|pid| *pid != 0)?;
                Some((pid, words[HELD + slot].load(Ordering::Acquire)))
            })
            .collect()
    }

    fn set_active_since(&self, work: Work, tick: u64) {
        self.active_since_word(self.slot, work).store(tick, Ordering::Release);
    }

    fn mark_active(&self, work: Work, from: u64, to: u64) {
        let ring = self.ring(work);
        // Only the window's ticks can still be read; a later tick in a word wins, so a slow
        // writer cannot wipe another session's newer mark.
        for tick in from.max(to.saturating_sub(WINDOW_TICKS - 1))..=to {
            let word = &ring[(tick % WINDOW_TICKS) as usize];
            // Most stretches end in a tick some wait already marked: a load leaves the shared
            // line unowned, where a read-modify-write would take it from the other sessions.
            if word.load(Ordering::Acquire) < tick {
                word.fetch_max(tick, Ordering::AcqRel);
            }
        }
    }

    fn active_ticks(&self, now: u64) -> [u32; KINDS] {
        let first = now.saturating_sub(WINDOW_TICKS - 1);
        Work::ALL.map(|work| {
            let mut active = [false; WINDOW_TICKS as usize];
            for word in self.ring(work) {
                let tick = word.load(Ordering::Acquire);
                if (first..=now).contains(&tick) {
                    active[(tick - first) as usize] = true;
                }
            }
            for slot in 0..BUDGET_SLOTS {
                let since = self.active_since_word(slot, work).load(Ordering::Acquire);
                if since != 0 && since <= now {
                    active[(since.max(first) - first) as usize..].fill(true);
                }
            }
            active.iter().filter(|active| **active).count() as u32
        })
    }
}

#[cfg(test)]
mod shared_tests {
    use super::*;

    /// A tenant's page with a quota of 100 bytes: the listener's end, and the ends of workers 1
    /// and `second`.
    fn listener_and_workers(second: usize) -> (SharedBudget, SharedBudget, SharedBudget) {
        let (fd, listener) = SharedBudget::create(Some(100)).unwrap();
        let file = std::fs::File::from(fd);
        (listener, SharedBudget::map(&file, 1).unwrap(), SharedBudget::map(&file, second).unwrap())
    }

    #[test]
    fn workers_share_one_quota_and_dead_workers_are_reclaimed() {
        let (listener, first, second) = listener_and_workers(2);
        assert!(first.try_reserve(70));
        assert!(!second.try_reserve(31));
        assert!(second.try_reserve(30));
        assert_eq!(listener.used(), 100);
        listener.reclaim(1);
        assert_eq!(listener.used(), 30);
        assert!(second.try_reserve(70));
        listener.set_limit(Some(50));
        assert!(!second.try_reserve(1));
        assert_eq!(second.limit(), Some(50));
    }

    #[test]
    fn the_tenants_processes_are_its_live_sessions_apps() {
        let (listener, first, second) = listener_and_workers(7);
        assert!(first.try_reserve(40));
        first.set_owner(4242);
        second.set_owner(77);
        let mut processes = listener.processes();
        processes.sort_unstable();
        assert_eq!(processes, vec![(77, 0), (4242, 40)]);
        listener.reclaim(1);
        assert_eq!(second.processes(), vec![(77, 0)]);
    }

    #[test]
    fn activity_is_the_union_of_the_sessions_over_the_window() {
        let (listener, first, second) = listener_and_workers(2);
        // Closed stretches 1000..=1019 and 1010..=1029 overlap: 30 ticks, not 40.
        first.mark_active(Work::Kernels, 1000, 1019);
        second.mark_active(Work::Kernels, 1010, 1029);
        assert_eq!(listener.active_ticks(1099), [30, 0]);
        // A stretch still open counts up to now; one from before the window counts from its start.
        second.set_active_since(Work::Copies, 1090);
        assert_eq!(listener.active_ticks(1099), [30, 10]);
        first.set_active_since(Work::Copies, 5);
        assert_eq!(listener.active_ticks(1099), [30, 100]);
        // Ticks that left the window no longer count, whatever the ring still holds.
        first.set_active_since(Work::Copies, 0);
        second.set_active_since(Work::Copies, 0);
        assert_eq!(listener.active_ticks(1119), [10, 0]);
        // A dead worker's open stretch ends with it.
        second.set_active_since(Work::Kernels, 1115);
        assert_eq!(listener.active_ticks(1119), [15, 0]);
        listener.reclaim(2);
        assert_eq!(listener.active_ticks(1119), [10, 0]);
    }
}
