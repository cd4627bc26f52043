//! Device-memory budgets: one quota per rpc-server (one allocation), shared by all of its
//! sessions, which run in separate worker processes. The counters live in a shared memory page
//! the listener creates and every worker maps; each worker also keeps its own slot so the
//! listener can take back what a dead worker held.

use std::sync::atomic::{AtomicU64, Ordering};

/// What a session may allocate.
pub trait MemoryBudget: Send + Sync {
    /// Reserves `bytes`, or says no if that would pass the quota.
    fn try_reserve(&self, bytes: u64) -> bool;
    fn release(&self, bytes: u64);
    /// The quota in bytes, if there is one.
    fn limit(&self) -> Option<u64>;
    /// Bytes reserved by all sessions together.
    fn used(&self) -> u64;
}

/// A budget in this process's memory (tests, and a server with a single session).
#[derive(Debug)]
pub struct LocalBudget {
    limit: Option<u64>,
    used: AtomicU64,
}

impl LocalBudget {
    pub fn new(limit: Option<u64>) -> Self {
        Self { limit, used: AtomicU64::new(0) }
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

impl MemoryBudget for LocalBudget {
    fn try_reserve(&self, bytes: u64) -> bool {
        reserve_within(&self.used, self.limit, bytes)
    }

    fn release(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    fn limit(&self) -> Option<u64> {
        self.limit
    }

    fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_stop_exactly_at_the_quota() {
        let budget = LocalBudget::new(Some(100));
        assert!(budget.try_reserve(60));
        assert!(!budget.try_reserve(41));
        assert!(budget.try_reserve(40));
        assert!(!budget.try_reserve(1));
        budget.release(60);
        assert_eq!(budget.used(), 40);
        assert!(LocalBudget::new(None).try_reserve(u64::MAX));
    }
}

/// The budget page shared by the listener and its workers: `[limit, used, slot 0, slot 1...]`,
/// each an `AtomicU64`. `limit == u64::MAX` means no quota.
pub struct SharedBudget {
    map: memmap2::MmapMut,
    slot: usize,
}

/// Sessions that can hold memory at once (one slot per live worker).
pub const BUDGET_SLOTS: usize = 500;
const PAGE_WORDS: usize = 2 + BUDGET_SLOTS;
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

    /// Changes the quota for every session (a session above it keeps what it has).
    pub fn set_limit(&self, limit: Option<u64>) {
        self.words()[0].store(limit.unwrap_or(NO_LIMIT), Ordering::Release);
    }

    /// Bytes a worker's slot holds.
    pub fn slot_used(&self, slot: usize) -> u64 {
        self.words().get(2 + slot).map_or(0, |word| word.load(Ordering::Acquire))
    }

    /// Takes back what a dead worker held.
    pub fn reclaim(&self, slot: usize) {
        if let Some(word) = self.words().get(2 + slot) {
            let held = word.swap(0, Ordering::AcqRel);
            self.words()[1].fetch_sub(held, Ordering::AcqRel);
        }
    }
}

impl MemoryBudget for SharedBudget {
    fn try_reserve(&self, bytes: u64) -> bool {
        let words = self.words();
        if !reserve_within(&words[1], self.limit(), bytes) {
            return false;
        }
        words[2 + self.slot].fetch_add(bytes, Ordering::AcqRel);
        true
    }

    fn release(&self, bytes: u64) {
        let words = self.words();
        words[2 + self.slot].fetch_sub(bytes, Ordering::AcqRel);
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
}

#[cfg(test)]
mod shared_tests {
    use super::*;

    #[test]
    fn workers_share_one_quota_and_dead_workers_are_reclaimed() {
        let (fd, listener) = SharedBudget::create(Some(100)).unwrap();
        let file = std::fs::File::from(fd);
        let first = SharedBudget::map(&file, 1).unwrap();
        let second = SharedBudget::map(&file, 2).unwrap();
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
}
