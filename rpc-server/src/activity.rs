//! Utilization as NVML reports it, measured by the server: the share of the last second in which
//! the tenant had kernels (NVML's `gpu`) or copies and memsets (its `memory`) queued on the GPU
//! and not yet seen done. NVIDIA's NVML cannot tell tenants apart under MPS (it books every
//! client's work to the MPS server's process), so each session keeps this account itself.
//!
//! A session's work counts from its submission until the server sees it done: a stream or device
//! synchronize, a stream or event query answering ready, an event synchronize, a device-to-host
//! copy delivered. Work the app never waits for counts until the next such sighting, so the
//! figure is an upper bound of the time kernels ran. The sightings cost nothing extra: the server
//! makes them anyway, and no query is added (a query would also change when device `printf`
//! output is flushed). Each session writes its stretches into the tenant page
//! ([`crate::budget`]), where the union over the tenant's sessions is read in ticks of 10 ms.

use std::sync::Arc;

use crate::budget::MemoryBudget;

/// What was queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    Kernels = 0,
    Copies = 1,
}

pub const KINDS: usize = 2;

impl Work {
    pub const ALL: [Work; KINDS] = [Work::Kernels, Work::Copies];
}

/// Ticks in the window utilization is read over: one second.
pub const WINDOW_TICKS: u64 = 100;

/// The current tick of `CLOCK_MONOTONIC_COARSE` (10 ms each, one clock for all the host's
/// processes), counted from 1 so that 0 can mean "none". The coarse clock (the kernel's last
/// timer tick, 1-4 ms old) is read without the time-stamp counter: this runs twice on every
/// launch + synchronize, where a fine clock read costs 20-50 ns on the GPU VMs.
pub fn tick_now() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC_COARSE exists on every Linux since 2.6.32.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut now) };
    u64::try_from(now.tv_sec).unwrap_or(0) * 100 + u64::try_from(now.tv_nsec).unwrap_or(0) / 10_000_000 + 1
}

/// Percentages of the window in which the tenant had `[kernels, copies]` queued.
pub fn utilization(board: &dyn MemoryBudget) -> [u32; KINDS] {
    board.active_ticks(tick_now()).map(|ticks| (u64::from(ticks) * 100 / WINDOW_TICKS) as u32)
}

#[derive(Default)]
struct Queued {
    /// Submissions so far: a wait covers the stream only if none came after it began.
    submits: u64,
    kinds: [bool; KINDS],
}

/// Where a wait began: the streams it covers and their submissions at that moment. A wait on one
/// stream (the common case, on every synchronize) allocates nothing.
#[derive(Debug, Default)]
pub enum Mark {
    #[default]
    Nothing,
    One((u64, u64)),
    Many(Vec<(u64, u64)>),
}

impl Mark {
    fn covered(&self) -> &[(u64, u64)] {
        match self {
            Mark::Nothing => &[],
            Mark::One(pair) => std::slice::from_ref(pair),
            Mark::Many(pairs) => pairs,
        }
    }
}

/// One session's queued work, per stream, not yet seen done.
pub struct Activity {
    board: Arc<dyn MemoryBudget>,
    streams: crate::session::IdMap<u64, Queued>,
    /// Per kind, the tick since which some stream has had such work queued.
    since: [Option<u64>; KINDS],
    /// The app's events: the stream and submissions each was last recorded behind.
    events: crate::session::IdMap<u64, (u64, u64)>,
}

impl Activity {
    pub fn new(board: Arc<dyn MemoryBudget>) -> Self {
        Self { board, streams: Default::default(), since: [None; KINDS], events: Default::default() }
    }

    /// `work` was queued on `stream`.
    pub fn queued(&mut self, stream: u64, work: Work) {
        let queued = self.streams.entry(stream).or_default();
        queued.submits += 1;
        queued.kinds[work as usize] = true;
        if self.since[work as usize].is_none() {
            let now = tick_now();
            self.since[work as usize] = Some(now);
            self.board.set_active_since(work, now);
        }
    }

    /// A wait for what `stream` has queued so far.
    pub fn mark(&self, stream: u64) -> Mark {
        self.streams.get(&stream).map_or(Mark::Nothing, |queued| Mark::One((stream, queued.submits)))
    }

    /// A wait for what every stream `covers` accepts has queued so far (all of them for a device
    /// synchronize; the blocking ones for a wait on the legacy stream). Only streams with work
    /// queued are looked at, and one of them allocates nothing.
    pub fn mark_where(&self, covers: impl Fn(u64) -> bool) -> Mark {
        let mut covered = self.streams.iter().filter(|(stream, _)| covers(**stream)).map(|(stream, queued)| (*stream, queued.submits));
        match (covered.next(), covered.next()) {
            (None, _) => Mark::Nothing,
            (Some(pair), None) => Mark::One(pair),
            (Some(first), Some(second)) => Mark::Many([first, second].into_iter().chain(covered).collect()),
        }
    }

    /// The wait that began at `mark` ended well: what it covered is done.
    pub fn done(&mut self, mark: &Mark) {
        if matches!(mark, Mark::Nothing) {
            return;
        }
        for (stream, submits) in mark.covered() {
            if self.streams.get(stream).is_some_and(|queued| queued.submits == *submits) {
                self.streams.remove(stream);
            }
        }
        self.settle();
    }

    pub fn event_recorded(&mut self, event: u64, stream: u64) {
        let submits = self.streams.get(&stream).map_or(0, |queued| queued.submits);
        self.events.insert(event, (stream, submits));
    }

    /// A wait for `event`: the work queued before its record.
    pub fn event_mark(&self, event: u64) -> Mark {
        self.events.get(&event).map_or(Mark::Nothing, |pair| Mark::One(*pair))
    }

    pub fn event_destroyed(&mut self, event: u64) {
        self.events.remove(&event);
    }

    /// The stream is gone; its work is no longer followed.
    pub fn stream_destroyed(&mut self, stream: u64) {
        self.streams.remove(&stream);
        self.settle();
    }

    /// Nothing is queued any more (a device reset, the session's end).
    pub fn forget_all(&mut self) {
        self.streams.clear();
        self.events.clear();
        self.settle();
    }

    /// Ends the stretch of each kind no stream has queued any more.
    fn settle(&mut self) {
        for work in Work::ALL {
            if let Some(since) = self.since[work as usize]
                && !self.streams.values().any(|queued| queued.kinds[work as usize])
            {
                self.board.mark_active(work, since, tick_now());
                self.board.set_active_since(work, 0);
                self.since[work as usize] = None;
            }
        }
    }
}

impl Drop for Activity {
    fn drop(&mut self) {
        self.forget_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::SharedBudget;

    fn activity() -> (Arc<SharedBudget>, Activity) {
        let (fd, _) = SharedBudget::create(None).unwrap();
        let board = Arc::new(SharedBudget::map(&std::fs::File::from(fd), 3).unwrap());
        (board.clone(), Activity::new(board))
    }

    #[test]
    fn queued_work_is_active_until_a_wait_covers_all_of_it() {
        let (board, mut activity) = activity();
        assert_eq!(board.active_ticks(tick_now()), [0, 0]);
        activity.queued(5, Work::Kernels);
        let before_more = activity.mark(5);
        activity.queued(5, Work::Kernels);
        activity.queued(9, Work::Copies);
        assert_eq!(board.active_ticks(tick_now()).map(|ticks| ticks >= 1), [true, true]);
        // A wait that began before the second launch does not cover it.
        activity.done(&before_more);
        assert!(activity.since[Work::Kernels as usize].is_some());
        activity.done(&activity.mark(5));
        assert!(activity.since[Work::Kernels as usize].is_none());
        assert!(activity.since[Work::Copies as usize].is_some());
        // An event recorded behind the copy covers it.
        activity.event_recorded(1, 9);
        activity.done(&activity.event_mark(1));
        assert_eq!(activity.since, [None, None]);
        // The stretches stay in the window after they end.
        assert_eq!(board.active_ticks(tick_now()).map(|ticks| ticks >= 1), [true, true]);
        assert_eq!(board.active_ticks(tick_now() + 2 * WINDOW_TICKS), [0, 0]);
    }

    #[test]
    fn a_device_wait_covers_every_stream_and_the_end_closes_what_is_open() {
        let (board, mut activity) = activity();
        activity.queued(1, Work::Kernels);
        activity.queued(2, Work::Kernels);
        activity.done(&activity.mark_where(|_| true));
        assert_eq!(activity.since, [None, None]);
        activity.queued(3, Work::Copies);
        drop(activity);
        assert_eq!(board.active_ticks(tick_now() + WINDOW_TICKS / 2).map(|ticks| ticks >= 1), [true, true]);
        let later = tick_now() + WINDOW_TICKS + 1;
        assert_eq!(board.active_ticks(later), [0, 0]);
    }
}
