//! The app's host functions in stream order (`cuLaunchHostFunc`, `cuStreamAddCallback`, graph host
//! nodes). The function lives in the app's process, so when a stream reaches one, the driver's
//! callback thread here tells the client (`Notice::HostCall`) and holds the stream until the
//! client says the function returned (`HostCallDone`). Device-to-host copies that finished
//! before are sent first, so the function sees their bytes, as natively. The driver's callback
//! thread may make no CUDA call, so an announcer thread of the session sends (checking which
//! copies are done is one).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use flyt_protocol::handshake::Notice;

use crate::transport::Outbox;

/// The announcer thread's queue: `(call, run)` pairs.
type Announcer = Mutex<Sender<(u64, u64)>>;

/// Host calls announced to the client and those it has answered.
#[derive(Default)]
struct Runs {
    /// Each announced run and when it was announced.
    waiting: HashMap<u64, Instant>,
    finished: HashSet<u64>,
}

type Link = (Arc<Outbox>, Arc<dyn Fn() + Send + Sync>);

/// A session's host calls in progress.
pub struct HostCalls {
    /// Where announcements go, and what makes the device current on the announcer thread: set
    /// later for a restored session's graphs, which are made before its connection.
    link: OnceLock<Link>,
    announce: OnceLock<Option<Announcer>>,
    next_run: AtomicU64,
    runs: Mutex<Runs>,
    wake: Condvar,
    /// Told whenever a run starts waiting or the session ends (`wait_unanswered`).
    announced: Condvar,
    /// A host function has been named to the device (a site made): one may run from now on.
    used: AtomicBool,
    /// The session is ending: nothing will answer any more, so every held stream is let go.
    closed: AtomicBool,
}

impl HostCalls {
    /// `bind` makes the device current on the announcer thread.
    pub fn new(outbox: Arc<Outbox>, bind: Arc<dyn Fn() + Send + Sync>) -> Arc<Self> {
        let calls = Self::unlinked();
        let _ = calls.link.set((outbox, bind));
        calls
    }

    /// Host calls whose session is not connected yet (`link_as` connects them).
    pub fn unlinked() -> Arc<Self> {
        Arc::new(Self {
            link: OnceLock::new(),
            announce: OnceLock::new(),
            next_run: AtomicU64::new(1),
            runs: Mutex::new(Runs::default()),
            wake: Condvar::new(),
            announced: Condvar::new(),
            used: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        })
    }

    /// Announces through the session `other` belongs to (once; a linked one stays as it is).
    pub fn link_as(&self, other: &Self) {
        if let Some(link) = other.link.get() {
            let _ = self.link.set(link.clone());
        }
    }

    /// The announcer thread, started with the session's first host call (most sessions have
    /// none, and a thread's stack takes address space the session's mapped blocks may need).
    fn announcer(&self) -> Option<&Announcer> {
        if let Some(started) = self.announce.get() {
            return started.as_ref();
        }
        // Not before the session is linked (a restored session's graphs run nothing till then).
        let (outbox, bind) = self.link.get()?.clone();
        let started = self.announce.get_or_init(move || {
            let (announce, requests) = channel::<(u64, u64)>();
            let spawned = std::thread::Builder::new().name("flyt-host-calls".into()).spawn(move || {
                bind();
                for (call, run) in requests {
                    outbox.send_ready();
                    outbox.send_notice(&Notice::HostCall { call, run });
                }
            });
            match spawned {
                Ok(_) => Some(Mutex::new(announce)),
                Err(error) => {
                    tracing::error!(%error, "cannot start the host-call thread; host functions will not run");
                    None
                }
            }
        });
        started.as_ref()
    }

    fn runs(&self) -> std::sync::MutexGuard<'_, Runs> {
        self.runs.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs the app's function `call` and returns when it has (or the session ended).
    fn run(&self, call: u64) {
        let run = self.next_run.fetch_add(1, Ordering::Relaxed);
        self.runs().waiting.insert(run, Instant::now());
        self.announced.notify_all();
        let sent = self
            .announcer()
            .is_some_and(|announce| announce.lock().unwrap_or_else(std::sync::PoisonError::into_inner).send((call, run)).is_ok());
        if !sent {
            self.runs().waiting.remove(&run);
            return;
        }
        let mut runs = self.runs();
        while !runs.finished.remove(&run) && !self.closed.load(Ordering::Acquire) {
            runs = self.wake.wait(runs).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        runs.waiting.remove(&run);
    }

    /// The client's `HostCallDone`; a run that is not waiting is refused.
    pub fn done(&self, run: u64) -> flyt_protocol::error::CudaResult<()> {
        let mut runs = self.runs();
        if !runs.waiting.contains_key(&run) || !runs.finished.insert(run) {
            return Err(flyt_protocol::CudaError::INVALID_VALUE);
        }
        drop(runs);
        self.wake.notify_all();
        Ok(())
    }

    /// Lets every held stream go (the session ends).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let _guard = self.runs();
        self.wake.notify_all();
        self.announced.notify_all();
    }

    /// Whether the session has named a host function to the device (one may run from now on).
    pub fn used(&self) -> bool {
        self.used.load(Ordering::Relaxed)
    }

    /// Waits until a host call has waited longer than `patience` for the client's answer
    /// (`true`), or the session ends (`false`). The session's read-ahead helper waits here: an
    /// answer that long in coming may be stuck behind a call that blocks the session's thread.
    pub fn wait_unanswered(&self, patience: Duration) -> bool {
        let mut runs = self.runs();
        loop {
            if self.closed.load(Ordering::Acquire) {
                return false;
            }
            let now = Instant::now();
            let oldest = runs.waiting.iter().filter(|(run, _)| !runs.finished.contains(run)).map(|(_, since)| *since).min();
            runs = match oldest {
                Some(since) if now.duration_since(since) >= patience => return true,
                Some(since) => {
                    self.announced
                        .wait_timeout(runs, patience - now.duration_since(since))
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .0
                }
                None => self.announced.wait(runs).unwrap_or_else(std::sync::PoisonError::into_inner),
            };
        }
    }
}

/// One host function as a stream or graph node names it: what the driver's callback gets.
pub struct HostCallSite {
    pub call: u64,
    calls: Arc<HostCalls>,
}

impl HostCallSite {
    pub fn new(call: u64, calls: &Arc<HostCalls>) -> Arc<Self> {
        calls.used.store(true, Ordering::Relaxed);
        Arc::new(Self { call, calls: calls.clone() })
    }

    /// Runs it (from the driver's callback thread, or the emulated device's).
    pub fn run(&self) {
        self.calls.run(self.call);
    }
}
