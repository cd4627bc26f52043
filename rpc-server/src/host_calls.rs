//! The app's host functions in stream order (`cuLaunchHostFunc`, `cuStreamAddCallback`, graph host
//! nodes). The function lives in the app's process, so when a stream reaches one, the driver's
//! callback thread here tells the client (`Notice::HostCall`) and holds the stream until the
//! client says the function returned (`HostCallDone`). Device-to-host copies that finished
//! before are sent first, so the function sees their bytes, as natively. The driver's callback
//! thread may make no CUDA call, so an announcer thread of the session sends (checking which
//! copies are done is one).
//!
//! A graph's copy between device memory and the app's host memory runs the same way: the graph
//! copies between the device and staging memory of this process, and a host node beside that
//! copy sends the staged bytes to the client (`Notice::HostCopyOut`) or asks it for them
//! (`Notice::HostCopyIn`, answered by `HostCopyDone` with the bytes), holding the stream until
//! the client has written or read the app's memory.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use flyt_protocol::handshake::Notice;
use flyt_protocol::ops::HostBox;

use crate::transport::Outbox;

/// What the announcer thread tells the client.
enum Announce {
    Call {
        call: u64,
        run: u64,
    },
    /// A device-to-host copy's bytes for the app's `host` memory.
    CopyOut {
        run: u64,
        host: HostBox,
        bytes: Vec<u8>,
    },
    /// A host-to-device copy wants the app's `host` bytes.
    CopyIn {
        run: u64,
        host: HostBox,
    },
}

/// The announcer thread's queue.
type Announcer = Mutex<Sender<Announce>>;

/// Host calls announced to the client and those it has answered.
#[derive(Default)]
struct Runs {
    /// Each announced run and when it was announced.
    waiting: HashMap<u64, Instant>,
    finished: HashSet<u64>,
    /// Runs of host-to-device copies that wait for the app's bytes (how many), and the bytes
    /// once they came.
    wanted: HashMap<u64, usize>,
    arrived: HashMap<u64, Vec<u8>>,
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
            let (announce, requests) = channel::<Announce>();
            let spawned = std::thread::Builder::new().name("flyt-host-calls".into()).spawn(move || {
                bind();
                for request in requests {
                    outbox.send_ready();
                    match request {
                        Announce::Call { call, run } => outbox.send_notice(&Notice::HostCall { call, run }),
                        Announce::CopyOut { run, host, bytes } => outbox.send_notice_with(&Notice::HostCopyOut { run, host }, &bytes),
                        Announce::CopyIn { run, host } => outbox.send_notice(&Notice::HostCopyIn { run, host }),
                    }
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

    /// Tells the client `what` (made for the run's number) and returns when it has answered (or
    /// the session ended); the bytes a host-to-device copy's answer brought, if any.
    fn run(&self, wanted: Option<usize>, what: impl FnOnce(u64) -> Announce) -> Option<Vec<u8>> {
        let run = self.next_run.fetch_add(1, Ordering::Relaxed);
        {
            let mut runs = self.runs();
            runs.waiting.insert(run, Instant::now());
            if let Some(len) = wanted {
                runs.wanted.insert(run, len);
            }
        }
        self.announced.notify_all();
        let sent = self
            .announcer()
            .is_some_and(|announce| announce.lock().unwrap_or_else(std::sync::PoisonError::into_inner).send(what(run)).is_ok());
        let mut runs = self.runs();
        if sent {
            while !runs.finished.remove(&run) && !self.closed.load(Ordering::Acquire) {
                runs = self.wake.wait(runs).unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        }
        runs.waiting.remove(&run);
        runs.wanted.remove(&run);
        runs.arrived.remove(&run)
    }

    /// The client's `HostCallDone`; a run that is not waiting is refused.
    pub fn done(&self, run: u64) -> flyt_protocol::error::CudaResult<()> {
        self.finish(run, None)
    }

    /// The client's `HostCopyDone` with the app's bytes: refused for a run that waits for no
    /// bytes or for other than as many as its copy takes.
    pub fn copy_done(&self, run: u64, bytes: Vec<u8>) -> flyt_protocol::error::CudaResult<()> {
        self.finish(run, Some(bytes))
    }

    fn finish(&self, run: u64, bytes: Option<Vec<u8>>) -> flyt_protocol::error::CudaResult<()> {
        let mut runs = self.runs();
        let expected = runs.wanted.get(&run).copied();
        // A copy's run answered without bytes (the client could not read them) leaves its
        // staging as it was; bytes come only for a copy's run, as many as it takes.
        let fits = match (&bytes, expected) {
            (None, _) => true,
            (Some(bytes), Some(len)) => bytes.len() == len,
            (Some(_), None) => false,
        };
        if !fits || !runs.waiting.contains_key(&run) || !runs.finished.insert(run) {
            return Err(flyt_protocol::CudaError::INVALID_VALUE);
        }
        if let Some(bytes) = bytes {
            runs.arrived.insert(run, bytes);
        }
        drop(runs);
        self.wake.notify_all();
        Ok(())
    }

    /// How many bytes run `run` waits for (a host-to-device copy's), if it waits for any.
    pub fn bytes_wanted(&self, run: u64) -> Option<usize> {
        self.runs().wanted.get(&run).copied()
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

/// Staging memory of this process a graph's host copy goes through, `len` bytes at `host`.
pub struct Staging {
    pub host: *mut u8,
    pub len: usize,
}

// SAFETY: the staging memory is this process's own and lives as long as the session's graph
// table holds it (never freed while a graph that names it can run); only the host node of its
// copy touches it from the host, while its stream is held, after or before the device's copy.
unsafe impl Send for Staging {}
// SAFETY: as for `Send`: one host node at a time reads or writes it.
unsafe impl Sync for Staging {}

/// A graph's copy between the device and the app's host memory, as its host node runs it.
pub struct StagedCopy {
    pub staging: Staging,
    pub host: HostBox,
    /// Device to host: the staged bytes go to the app; else the app's bytes come to staging.
    pub to_host: bool,
}

/// One host function as a stream or graph node names it: what the driver's callback gets.
pub struct HostCallSite {
    pub call: u64,
    calls: Arc<HostCalls>,
    /// The host half of a graph's host copy, instead of an app function.
    pub copy: Option<StagedCopy>,
}

impl HostCallSite {
    pub fn new(call: u64, calls: &Arc<HostCalls>) -> Arc<Self> {
        calls.used.store(true, Ordering::Relaxed);
        Arc::new(Self { call, calls: calls.clone(), copy: None })
    }

    /// The host half of a graph's copy with the app's host memory.
    pub fn for_copy(copy: StagedCopy, calls: &Arc<HostCalls>) -> Arc<Self> {
        calls.used.store(true, Ordering::Relaxed);
        Arc::new(Self { call: 0, calls: calls.clone(), copy: Some(copy) })
    }

    /// Runs it (from the driver's callback thread, or the emulated device's).
    pub fn run(&self) {
        let Some(copy) = &self.copy else {
            self.calls.run(None, |run| Announce::Call { call: self.call, run });
            return;
        };
        let (staging, len) = (copy.staging.host, copy.staging.len);
        if copy.to_host {
            // SAFETY: the staging memory holds `len` bytes (see `Staging`); the device's copy
            // into it is done, as this host node follows it, and nothing else writes it now.
            let bytes = unsafe { std::slice::from_raw_parts(staging, len) }.to_vec();
            self.calls.run(None, |run| Announce::CopyOut { run, host: copy.host, bytes });
        } else if let Some(bytes) = self.calls.run(Some(len), |run| Announce::CopyIn { run, host: copy.host }) {
            // SAFETY: as above; the device's copy out of staging follows this node, and
            // `finish` took only `len` bytes.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), staging, len.min(bytes.len())) };
        }
    }

    /// Whether it is the host half of a graph's host copy (the emulated device waits for it).
    pub fn is_copy(&self) -> bool {
        self.copy.is_some()
    }
}
