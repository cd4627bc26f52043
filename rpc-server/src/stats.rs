//! Per-session counters for the metrics endpoint, in a shared memory page the listener creates
//! and every worker maps (like the budget page): each worker counts into its own slot with
//! relaxed atomics, and the listener reads every slot when scraped. A slot's counts are folded
//! into the listener's retired totals when its worker exits, so the sums only grow.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use flyt_protocol::ops::OPS;

use crate::budget::BUDGET_SLOTS;

/// Upper bounds (seconds) of the call-latency histogram's buckets; the last bucket is +Inf.
pub const LATENCY_BOUNDS: [f64; 14] = [1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0];

/// Which way a copy went and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Copied {
    HostToDeviceSocket,
    HostToDeviceShm,
    DeviceToHostSocket,
    DeviceToHostShm,
}

impl Copied {
    pub const ALL: [Copied; 4] = [Self::HostToDeviceSocket, Self::HostToDeviceShm, Self::DeviceToHostSocket, Self::DeviceToHostShm];

    /// `(direction, path)` labels.
    pub fn labels(self) -> (&'static str, &'static str) {
        match self {
            Self::HostToDeviceSocket => ("h2d", "socket"),
            Self::HostToDeviceShm => ("h2d", "shm"),
            Self::DeviceToHostSocket => ("d2h", "socket"),
            Self::DeviceToHostShm => ("d2h", "shm"),
        }
    }
}

// One slot: calls per op, errors per op, kernels, bytes per `Copied`, latency buckets (+Inf
// included), latency count, latency sum in nanoseconds, bytes striped copies' compression kept
// off the wire.
const CALLS: usize = 0;
const ERRORS: usize = OPS.len();
const KERNELS: usize = 2 * OPS.len();
const BYTES: usize = KERNELS + 1;
const BUCKETS: usize = BYTES + Copied::ALL.len();
const LATENCY_COUNT: usize = BUCKETS + LATENCY_BOUNDS.len() + 1;
const LATENCY_SUM_NS: usize = LATENCY_COUNT + 1;
const COMPRESSION_SAVED: usize = LATENCY_SUM_NS + 1;
const SLOT_WORDS: usize = COMPRESSION_SAVED + 1;

fn op_index(id: u16) -> Option<usize> {
    OPS.binary_search_by_key(&id, |op| op.id).ok()
}

/// The page: `BUDGET_SLOTS` slots of `SLOT_WORDS` counters.
pub struct StatsPage {
    map: memmap2::MmapMut,
}

impl StatsPage {
    /// Creates the page (in the listener) and returns it with the descriptor workers inherit.
    pub fn create() -> std::io::Result<(std::os::fd::OwnedFd, Self)> {
        let fd = nix::sys::memfd::memfd_create(c"flyt-stats", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)?;
        let file = std::fs::File::from(fd);
        file.set_len((BUDGET_SLOTS * SLOT_WORDS * 8) as u64)?;
        let page = Self::map(&file)?;
        Ok((file.into(), page))
    }

    /// Maps an existing page (in a worker).
    pub fn map(file: &std::fs::File) -> std::io::Result<Self> {
        // SAFETY: the memfd is private to this server's processes, sized in `create`, and only
        // ever accessed through atomics (see `words`).
        let map = unsafe { memmap2::MmapOptions::new().len(BUDGET_SLOTS * SLOT_WORDS * 8).map_mut(file)? };
        Ok(Self { map })
    }

    fn slot(&self, slot: usize) -> &[AtomicU64] {
        // SAFETY: the mapping holds BUDGET_SLOTS * SLOT_WORDS words, page-aligned, alive as long
        // as `self`; `AtomicU64` has the layout of `u64`, and every access in every process goes
        // through these atomics. Out-of-range slots get an empty slice.
        let all = unsafe { std::slice::from_raw_parts(self.map.as_ptr().cast::<AtomicU64>(), BUDGET_SLOTS * SLOT_WORDS) };
        all.get(slot * SLOT_WORDS..(slot + 1) * SLOT_WORDS).unwrap_or(&[])
    }

    /// The counts of one slot.
    pub fn read(&self, slot: usize) -> Counts {
        let words: Vec<u64> = self.slot(slot).iter().map(|word| word.load(Ordering::Relaxed)).collect();
        Counts(if words.len() == SLOT_WORDS { words } else { vec![0; SLOT_WORDS] })
    }

    /// Reads a slot and zeroes it (its worker is gone).
    pub fn take(&self, slot: usize) -> Counts {
        let words: Vec<u64> = self.slot(slot).iter().map(|word| word.swap(0, Ordering::Relaxed)).collect();
        Counts(if words.len() == SLOT_WORDS { words } else { vec![0; SLOT_WORDS] })
    }
}

/// A worker's own slot.
pub struct SlotStats {
    page: StatsPage,
    slot: usize,
}

impl std::fmt::Debug for SlotStats {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "SlotStats {{ slot: {} }}", self.slot)
    }
}

impl SlotStats {
    pub fn new(page: StatsPage, slot: usize) -> Self {
        Self { page, slot }
    }

    fn add(&self, word: usize, value: u64) {
        if let Some(word) = self.page.slot(self.slot).get(word) {
            word.fetch_add(value, Ordering::Relaxed);
        }
    }

    /// A request of op `id` arrived.
    pub fn call(&self, id: u16) {
        if let Some(index) = op_index(id) {
            self.add(CALLS + index, 1);
        }
    }

    /// Op `id` failed (its reply or its deferred error).
    pub fn error(&self, id: u16) {
        if let Some(index) = op_index(id) {
            self.add(ERRORS + index, 1);
        }
    }

    pub fn kernel(&self) {
        self.add(KERNELS, 1);
    }

    pub fn copied(&self, how: Copied, bytes: u64) {
        self.add(BYTES + how as usize, bytes);
    }

    /// A striped copy's chunk crossed the network as LZ4, `bytes` smaller than raw.
    pub fn compression_saved(&self, bytes: u64) {
        self.add(COMPRESSION_SAVED, bytes);
    }

    /// How long the server took to answer a call that has a reply.
    pub fn latency(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        let bucket = LATENCY_BOUNDS.iter().position(|bound| seconds <= *bound).unwrap_or(LATENCY_BOUNDS.len());
        self.add(BUCKETS + bucket, 1);
        self.add(LATENCY_COUNT, 1);
        self.add(LATENCY_SUM_NS, u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
    }
}

/// A snapshot of counters (one slot, or sums).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counts(Vec<u64>);

impl Default for Counts {
    fn default() -> Self {
        Self(vec![0; SLOT_WORDS])
    }
}

impl Counts {
    pub fn add(&mut self, other: &Counts) {
        for (sum, value) in self.0.iter_mut().zip(&other.0) {
            *sum = sum.wrapping_add(*value);
        }
    }

    /// `(op name, calls, errors)` for every op called at least once.
    pub fn ops(&self) -> impl Iterator<Item = (&'static str, u64, u64)> + '_ {
        OPS.iter()
            .enumerate()
            .map(|(index, op)| (op.name, self.0[CALLS + index], self.0[ERRORS + index]))
            .filter(|(_, calls, _)| *calls > 0)
    }

    pub fn kernels(&self) -> u64 {
        self.0[KERNELS]
    }

    pub fn copied(&self, how: Copied) -> u64 {
        self.0[BYTES + how as usize]
    }

    pub fn compression_saved(&self) -> u64 {
        self.0[COMPRESSION_SAVED]
    }

    /// Per-bucket counts (the last one is +Inf), the count and the sum in seconds.
    pub fn latency(&self) -> (Vec<u64>, u64, f64) {
        let buckets = self.0[BUCKETS..BUCKETS + LATENCY_BOUNDS.len() + 1].to_vec();
        (buckets, self.0[LATENCY_COUNT], self.0[LATENCY_SUM_NS] as f64 / 1e9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_counts_into_its_slot_and_a_retired_slot_starts_again_from_zero() {
        let (fd, listener) = StatsPage::create().unwrap();
        let worker = SlotStats::new(StatsPage::map(&std::fs::File::from(fd)).unwrap(), 3);
        let malloc = OPS.iter().find(|op| op.name == "Malloc").unwrap().id;
        worker.call(malloc);
        worker.call(malloc);
        worker.error(malloc);
        worker.kernel();
        worker.copied(Copied::DeviceToHostShm, 4096);
        worker.latency(Duration::from_micros(3));
        worker.latency(Duration::from_secs(100));
        let counts = listener.read(3);
        assert_eq!(counts.ops().collect::<Vec<_>>(), vec![("Malloc", 2, 1)]);
        assert_eq!((counts.kernels(), counts.copied(Copied::DeviceToHostShm), counts.copied(Copied::HostToDeviceShm)), (1, 4096, 0));
        let (buckets, count, sum) = counts.latency();
        assert_eq!((buckets[2], buckets[LATENCY_BOUNDS.len()], count), (1, 1, 2));
        assert!((sum - 100.000_003).abs() < 1e-6);
        assert_eq!(listener.read(2), Counts::default());
        assert_eq!(listener.take(3), counts);
        assert_eq!(listener.read(3), Counts::default());
    }
}
