//! Threads that wait on the GPU so the session's reader never does: a blocking wait
//! (stream/event/device synchronize, a device-to-host copy) is handed to an idle waiter, or a new
//! one, so a synchronizing call from one app thread never stalls another thread's calls.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Job = Box<dyn FnOnce() + Send>;

/// Beyond this many waiting threads a wait runs on the reader itself (it still completes).
const MAX_WAITERS: usize = 256;
/// An idle waiter exits after this long.
const IDLE_EXIT: Duration = Duration::from_secs(30);

/// Longest nap between polls once a wait has outlasted its spin: bounds the extra latency of a
/// long wait while costing a sleeping waiter about a thousand wake-ups a second at most.
const MAX_NAP: Duration = Duration::from_millis(1);

/// Waits until `done()` holds without burning a core: polls for the spin budget (short waits
/// then cost no wake-up), then sleeps between polls, the nap doubling from 20 us up to 1 ms.
/// CUDA's own blocking calls spin for as long as the GPU works (a whole core for a 2 s kernel),
/// so the server polls queries instead and calls the blocking function only once it returns at
/// once.
pub fn wait_until(mut done: impl FnMut() -> bool) {
    let spin_until = std::time::Instant::now() + flyt_ring::spin_budget();
    while std::time::Instant::now() < spin_until {
        if done() {
            return;
        }
        std::hint::spin_loop();
    }
    let mut nap = Duration::from_micros(20);
    while !done() {
        std::thread::sleep(nap);
        nap = (nap * 2).min(MAX_NAP);
    }
}

/// A pool of waiter threads.
pub struct Waiters {
    sender: mpsc::Sender<Job>,
    receiver: Arc<Mutex<mpsc::Receiver<Job>>>,
    /// Waiters blocked in `recv` and not yet promised a job.
    idle: Arc<AtomicUsize>,
    live: Arc<AtomicUsize>,
    bind: Arc<dyn Fn() + Send + Sync>,
    /// Bumped when the device's context changes (a reset): each waiter binds again before its
    /// next job.
    context_epoch: Arc<AtomicU64>,
}

fn take_one(counter: &AtomicUsize) -> bool {
    counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok()
}

impl Waiters {
    /// `bind` runs first on every new waiter thread (it makes the device current there).
    pub fn new(bind: Arc<dyn Fn() + Send + Sync>) -> Self {
        let (sender, receiver) = mpsc::channel();
        Self {
            sender,
            receiver: Arc::new(Mutex::new(receiver)),
            idle: Arc::new(AtomicUsize::new(0)),
            live: Arc::new(AtomicUsize::new(0)),
            bind,
            context_epoch: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Whether no waiter has a job (waiting at most `limit` for the busy ones to finish).
    pub fn wait_idle(&self, limit: Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        let idle = || self.live.load(Ordering::Acquire) <= self.idle.load(Ordering::Acquire);
        let mut nap = Duration::from_micros(20);
        while !idle() {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(MAX_NAP);
        }
        true
    }

    /// The device's context was made anew: every waiter binds again before its next job.
    pub fn rebind(&self) {
        self.context_epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// Runs `job` on a waiter that is free now: an idle one, or a new one, so a job never queues
    /// behind another job's wait.
    pub fn run(&self, job: impl FnOnce() + Send + 'static) {
        if !take_one(&self.idle) {
            if self.live.load(Ordering::Acquire) >= MAX_WAITERS {
                job();
                return;
            }
            self.spawn();
        }
        if let Err(mpsc::SendError(job)) = self.sender.send(Box::new(job)) {
            job();
        }
    }

    fn spawn(&self) {
        let (receiver, idle, live, bind) = (self.receiver.clone(), self.idle.clone(), self.live.clone(), self.bind.clone());
        let context_epoch = self.context_epoch.clone();
        live.fetch_add(1, Ordering::AcqRel);
        let spawned = std::thread::Builder::new().name("flyt-waiter".into()).spawn(move || {
            let mut bound_epoch = context_epoch.load(Ordering::Acquire);
            bind();
            loop {
                // An idle waiter polls for new work before it sleeps (see `flyt_ring::spin_budget`).
                let spin_until = std::time::Instant::now() + flyt_ring::spin_budget();
                let mut next = Err(RecvTimeoutError::Timeout);
                while std::time::Instant::now() < spin_until {
                    match receiver.lock().unwrap_or_else(std::sync::PoisonError::into_inner).try_recv() {
                        Ok(job) => {
                            next = Ok(job);
                            break;
                        }
                        Err(mpsc::TryRecvError::Disconnected) => {
                            next = Err(RecvTimeoutError::Disconnected);
                            break;
                        }
                        Err(mpsc::TryRecvError::Empty) => std::hint::spin_loop(),
                    }
                }
                if matches!(next, Err(RecvTimeoutError::Timeout)) {
                    next = receiver.lock().unwrap_or_else(std::sync::PoisonError::into_inner).recv_timeout(IDLE_EXIT);
                }
                match next {
                    Ok(job) => {
                        let epoch = context_epoch.load(Ordering::Acquire);
                        if epoch != bound_epoch {
                            bound_epoch = epoch;
                            bind();
                        }
                        job();
                        idle.fetch_add(1, Ordering::AcqRel);
                    }
                    // Leave only if no job was promised to this idle thread meanwhile.
                    Err(RecvTimeoutError::Timeout) if take_one(&idle) => break,
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            live.fetch_sub(1, Ordering::AcqRel);
        });
        if spawned.is_err() {
            // No thread: the job will be picked by an existing waiter when one frees up.
            self.live.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!("could not start a waiter thread");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Instant;

    use super::*;

    #[test]
    fn a_blocked_job_never_delays_the_next() {
        let waiters = Waiters::new(Arc::new(|| {}));
        let (release, blocked) = mpsc::channel::<()>();
        let (done, finished) = mpsc::channel();
        waiters.run(move || {
            let _ = blocked.recv();
        });
        let started = Instant::now();
        waiters.run(move || done.send(()).unwrap());
        finished.recv_timeout(Duration::from_secs(5)).expect("second job ran while the first was blocked");
        assert!(started.elapsed() < Duration::from_secs(5));
        release.send(()).unwrap();
    }
}
