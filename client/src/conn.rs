//! The shim's side of a session's connection.
//!
//! - Asynchronous requests (launches, memsets, host-to-device copies...) are encoded into an
//!   outgoing buffer and written by a flusher thread in batches, so an async call costs an
//!   encode and a lock, not a system call. Over the shared-memory rings (no system call to
//!   save) the calling thread writes them itself, except past `DIRECT_BURST` in a row.
//! - A synchronous call appends its request and flushes the buffer itself, in one write, so
//!   everything sent before it reaches the server first.
//! - The thread that waits for a reply reads it itself: it takes the reading half (if no other
//!   thread holds it), polls it without blocking for the spin budget, then blocks, and hands every
//!   frame that is not its own to its owner (device-to-host bytes straight into the app's
//!   buffer). No thread hop stands between the reply and the app.
//! - Replies nobody waits for (asynchronous device-to-host copies) are read by a receiver
//!   thread while no app thread is reading, so the server never blocks on a full socket; it
//!   sleeps when none are outstanding.
//! - Frames arrive in the order the server sent them, and the server sends a copy's bytes
//!   before answering any call that waits for that copy, so when a synchronizing call returns,
//!   the bytes of the copies it covered are in the app's memory.
//! - A TCP session's connection that breaks is made again underneath (`crate::reconnect`) and the
//!   calls go on; if that fails, or on any other connection, every waiting call and every later
//!   call fails with `cudaErrorDevicesUnavailable`: no hang.

use std::collections::HashMap;
use std::io::{self, IoSlice, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::thread::Thread;
use std::time::{Duration, Instant};

use flyt_protocol::CudaError;
use flyt_protocol::device::DeviceInfo;
use flyt_protocol::error::CudaResult;
use flyt_protocol::frame::{FrameHeader, FrameLimits, HEADER_LEN, read_full};
use flyt_protocol::handshake::Notice;
use flyt_protocol::ops::{Request, decode_reply, rep, req};

/// Bulk bytes above this are written straight from the app's buffer instead of being copied
/// into the outgoing buffer.
const ZERO_COPY_BULK: usize = 64 << 10;
/// The outgoing buffer is written at once (by the caller) when it grows past this.
const FLUSH_AT: usize = 1 << 20;
/// Over the rings, this many asynchronous requests in a row are written by the calling thread;
/// the rest of a longer burst goes through the flusher in batches.
const DIRECT_BURST: usize = 16;
/// How long the flusher keeps looking for more work before it sleeps.
const FLUSHER_SPIN: Duration = Duration::from_micros(100);
/// How long a moved session waits for its last server to close the connection (it frees the
/// session's memory first) before the rings it used start over with the next one.
const PEER_GONE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a resumable connection may stay silent while calls wait before it is broken and
/// made again (a live server sends `Notice::Alive` every second).
const SILENT_BREAK: Duration = Duration::from_secs(4);

/// A socket to the server, or one half of the shared-memory rings.
pub use flyt_ring::Link as Wire;

/// How long calls wait for a server that sends nothing at all (`FLYT_REPLY_TIMEOUT`, seconds;
/// 0: for ever). A live server says it is alive about once a second while replies are due
/// (`Notice::Alive`), however long the GPU work takes, so only a server that stopped (a frozen
/// or unreachable host, a stopped process) runs into it.
fn reply_timeout() -> Option<Duration> {
    static TIMEOUT: OnceLock<Option<Duration>> = OnceLock::new();
    *TIMEOUT.get_or_init(|| {
        let seconds = std::env::var("FLYT_REPLY_TIMEOUT").ok().and_then(|value| value.trim().parse::<u64>().ok()).unwrap_or(30);
        (seconds > 0).then(|| Duration::from_secs(seconds))
    })
}

/// Where the bulk bytes of a device-to-host reply go: an app buffer.
#[derive(Clone, Copy)]
pub struct HostDestination {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the pointer is an app buffer that the CUDA contract keeps valid and untouched by the
// app until the copy completes (the calling thread waits for it, or the app synchronizes before
// reading it); only the receiver thread writes it, once.
unsafe impl Send for HostDestination {}
// SAFETY: as above; the value is only read to find the buffer.
unsafe impl Sync for HostDestination {}

impl HostDestination {
    /// # Safety
    /// `ptr` must be valid for writes of `len` bytes until the reply arrives or the
    /// connection fails, and nothing else may access it meanwhile.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Self {
        Self { ptr, len }
    }
}

/// One expected reply.
pub struct ReplySlot {
    done: AtomicBool,
    reply: Mutex<Option<CudaResult<Vec<u8>>>>,
    waiter: Mutex<Option<Thread>>,
    destination: Option<HostDestination>,
    /// Nobody waits for it (an asynchronous device-to-host copy): its outcome goes to the
    /// connection's deferred error.
    detached: bool,
    conn: Weak<Conn>,
}

impl ReplySlot {
    fn new(conn: &Arc<Conn>, destination: Option<HostDestination>, detached: bool) -> Self {
        Self {
            done: AtomicBool::new(false),
            reply: Mutex::new(None),
            waiter: Mutex::new(None),
            destination,
            detached,
            conn: Arc::downgrade(conn),
        }
    }

    fn complete(&self, reply: CudaResult<Vec<u8>>) {
        flyt_ring::timeline::mark(flyt_ring::timeline::Stage::ReplyRead);
        *self.reply.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(reply);
        self.done.store(true, Ordering::Release);
        self.wake();
    }

    fn wake(&self) {
        if let Some(thread) = self.waiter.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take() {
            thread.unpark();
        }
    }

    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Waits for the reply message (its bytes after the frame header), reading the connection
    /// itself when no other thread is.
    pub fn wait(&self) -> CudaResult<Vec<u8>> {
        if !self.is_done() {
            let started = Instant::now();
            match self.conn.upgrade() {
                Some(conn) => conn.wait_for(self, started),
                None => return Err(CudaError::DEVICES_UNAVAILABLE),
            }
            // A clock read is 20-50 ns on the GPU VMs: only statistics pay for this one.
            if crate::stats::enabled() {
                crate::stats::add_blocked(started.elapsed());
            }
        }
        self.reply.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take().unwrap_or(Err(CudaError::UNKNOWN))
    }
}

/// Sequence numbers are already well spread: hash them as themselves (the pending map is on every
/// synchronous call's path).
#[derive(Clone, Copy, Default)]
struct SeqHasher(u64);

impl std::hash::Hasher for SeqHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0 << 8) | u64::from(*byte);
        }
    }

    fn write_u32(&mut self, value: u32) {
        self.0 = u64::from(value);
    }
}

type PendingMap = HashMap<u32, Arc<ReplySlot>, std::hash::BuildHasherDefault<SeqHasher>>;

struct Outgoing {
    buf: Vec<u8>,
    next_seq: u32,
    /// The server asked for a pause (a checkpoint or a move): new requests wait until it is over.
    paused: bool,
    /// The `Pause` is owed until the host functions streams will reach have returned: the
    /// server drains the session's work before it writes it, and a host function's end is the
    /// client's answer, which must reach it first.
    pause_owed: bool,
    /// The device the server runs the next request on: the last `SetDevice` sent (the session
    /// starts on its first device).
    device: u32,
    /// The session devices this connection's server serves: `first_device..first_device +
    /// device_count` (every device for a session on one server; one server's share of a session
    /// spread over several, `FLYT_SERVER=a,b`). `SetDevice` names the server's own index.
    first_device: u32,
    device_count: u32,
    /// The capture interaction mode last sent (`CaptureMode`) while a capture was active;
    /// `UNSENT` when none is (the next capture's requests send theirs).
    capture_mode: u32,
    /// Frames queued since the connection opened: a mark of "nothing sent since" (see
    /// [`Conn::send_for_reply_marked`]).
    frames: u64,
}

/// `Outgoing::capture_mode` before any is sent.
const UNSENT: u32 = u32::MAX;

struct WireHalf {
    wire: Wire,
    /// The batch being written, swapped with the outgoing buffer so appends never wait for a
    /// write to finish.
    batch: Vec<u8>,
}

/// The reading half and what has been read from it but not yet handled.
struct Inbound {
    wire: Wire,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    message: Vec<u8>,
}

impl Inbound {
    fn new(wire: Wire) -> Self {
        Self { wire, buf: vec![0u8; 256 << 10].into_boxed_slice(), start: 0, end: 0, message: Vec::with_capacity(4096) }
    }

    fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Reads more bytes into the buffer; without `wait`, `Ok(false)` when none have arrived.
    fn fill(&mut self, wait: bool) -> io::Result<bool> {
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        } else if self.end == self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        let target = &mut self.buf[self.end..];
        let read = if wait { self.wire.read(target) } else { self.wire.read_nonblocking(target) };
        match read {
            Ok(0) => Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(read) => {
                self.end += read;
                Ok(true)
            }
            Err(error) if !wait && error.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Fills `out` from the buffer, then straight from the wire.
    fn read_exact(&mut self, out: &mut [u8]) -> io::Result<()> {
        let from_buffer = self.buffered().min(out.len());
        out[..from_buffer].copy_from_slice(&self.buf[self.start..self.start + from_buffer]);
        self.start += from_buffer;
        read_full(&mut self.wire, &mut out[from_buffer..], false).map_err(io::Error::other)
    }

    /// Reads and drops `len` bytes.
    fn skip(&mut self, mut len: u64) -> io::Result<()> {
        while len > 0 {
            if self.buffered() == 0 {
                self.fill(true)?;
            }
            let step = usize::try_from(len).unwrap_or(usize::MAX).min(self.buffered());
            self.start += step;
            len -= step as u64;
        }
        Ok(())
    }
}

/// A live connection.
/// What the connection hands to, and asks of, the session it carries. The session is made after
/// its connection and attaches itself once made (`Conn::attach`): the connection never reaches up
/// into the session's module.
pub trait SessionLink: Send + Sync {
    /// A host function, or a graph's host copy, the server's stream reached; `origin`: the first
    /// session device of the server that asked (its answer goes back there).
    fn host_job(&self, job: crate::graphs::HostJob, origin: u32);
    /// Whether host functions that streams will reach have yet to return.
    fn host_functions_pending(&self) -> bool;
    /// The server says the tenant holds `bytes` over its quota.
    fn over_budget(&self, bytes: u64);
    /// The session moved: both halves of a connection to `address` (the same server when
    /// `None`), the session resumed there from `snapshot`.
    fn reconnect(&self, address: Option<&str>, snapshot: &str) -> Result<(Wire, Wire), String>;
    /// The capture interaction mode the calling thread's requests run in while a capture is
    /// active; `None` while none is.
    fn capture_mode(&self) -> Option<u32>;
}

pub struct Conn {
    /// The session this connection carries, once it is made.
    session: OnceLock<&'static dyn SessionLink>,
    writer: Mutex<WireHalf>,
    outgoing: Mutex<Outgoing>,
    /// Signalled when a pause ends (with `outgoing`).
    resumed: Condvar,
    pending: Mutex<PendingMap>,
    /// The reading half: held by whichever thread reads (a waiting app thread, or the receiver).
    inbound: Mutex<Inbound>,
    /// Replies nobody waits for that are still to come, and expected notices (host functions
    /// streams will reach): the receiver reads while any are.
    detached: AtomicUsize,
    /// Threads asleep waiting for a reply another thread reads (woken when it stops reading).
    parked: AtomicUsize,
    receiver_wanted: Mutex<bool>,
    receiver_wake: Condvar,
    /// The first failure of an asynchronous copy (its own or a deferred one it carried back),
    /// reported at the next synchronizing call.
    deferred: Mutex<Option<CudaError>>,
    failure: OnceLock<String>,
    server: String,
    /// The first session device this connection's server serves (0 but in a spread session).
    first_device: AtomicU32,
    flush_wanted: AtomicBool,
    /// The shared-memory rings: writing costs no system call, so an asynchronous request is
    /// written by the calling thread itself when the writing half is free (no hand-off to the
    /// flusher, whose wake-up and lock traffic cost more than the write).
    writes_directly: AtomicBool,
    /// Asynchronous requests since the last synchronous one: past `DIRECT_BURST` of them, a
    /// burst is under way and the flusher batches it (the server reads one large record
    /// faster than many small ones).
    async_run: AtomicUsize,
    flusher_asleep: Mutex<bool>,
    flusher_wake: Condvar,
    /// The session's devices as the server last described them after a resize.
    pub resized_devices: Mutex<Option<Vec<DeviceInfo>>>,
    /// Frames read from the server so far: the watchdog tells a silent server by it.
    frames_read: AtomicU64,
    /// The connection's socket, shut down by the watchdog to wake whatever waits on it.
    socket: Option<OwnedFd>,
    /// A TCP session's resumable stream (`crate::reconnect`): ended with the connection's
    /// failure, broken by the watchdog when it goes silent.
    resume: Mutex<Option<flyt_ring::resume::Handle>>,
}

fn put_header(buf: &mut [u8], header: FrameHeader) {
    buf[..HEADER_LEN].copy_from_slice(&header.encode());
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Writes what the session's kernels printed where the app's own output goes: through C stdio,
/// as the CUDA driver does, so it keeps its place among the app's `printf`s.
fn write_device_output(out: &[u8], err: &[u8]) {
    unsafe extern "C" {
        static mut stdout: *mut libc::FILE;
        static mut stderr: *mut libc::FILE;
    }
    // SAFETY: glibc's `stdout`/`stderr` are initialized before any code of the process runs and
    // are only read here; `fwrite` locks the stream itself; the byte slices are valid.
    unsafe {
        for (bytes, stream) in [(out, std::ptr::addr_of!(stdout).read()), (err, std::ptr::addr_of!(stderr).read())] {
            if !bytes.is_empty() && !stream.is_null() {
                libc::fwrite(bytes.as_ptr().cast(), 1, bytes.len(), stream);
                libc::fflush(stream);
            }
        }
    }
}

impl Conn {
    /// Starts the receiver and flusher threads on a handshaken connection's two halves.
    pub fn start(reader: Wire, wire: Wire, server: String) -> io::Result<Arc<Self>> {
        let writes_directly = matches!(wire, Wire::RingOut(..));
        let socket = wire.as_fd().try_clone_to_owned().ok();
        let resume = wire.resume_handle();
        let conn = Arc::new(Self {
            session: OnceLock::new(),
            writer: Mutex::new(WireHalf { wire, batch: Vec::with_capacity(64 << 10) }),
            outgoing: Mutex::new(Outgoing {
                buf: Vec::with_capacity(64 << 10),
                next_seq: 1,
                paused: false,
                pause_owed: false,
                device: 0,
                first_device: 0,
                device_count: u32::MAX,
                capture_mode: UNSENT,
                frames: 0,
            }),
            resumed: Condvar::new(),
            pending: Mutex::new(PendingMap::default()),
            inbound: Mutex::new(Inbound::new(reader)),
            detached: AtomicUsize::new(0),
            parked: AtomicUsize::new(0),
            receiver_wanted: Mutex::new(false),
            receiver_wake: Condvar::new(),
            deferred: Mutex::new(None),
            failure: OnceLock::new(),
            server,
            first_device: AtomicU32::new(0),
            flush_wanted: AtomicBool::new(false),
            writes_directly: AtomicBool::new(writes_directly),
            async_run: AtomicUsize::new(0),
            flusher_asleep: Mutex::new(false),
            flusher_wake: Condvar::new(),
            resized_devices: Mutex::new(None),
            frames_read: AtomicU64::new(0),
            socket,
            resume: Mutex::new(resume),
        });
        if let Some(timeout) = reply_timeout() {
            let watched = Arc::downgrade(&conn);
            std::thread::Builder::new().name("flyt-watchdog".into()).stack_size(64 << 10).spawn(move || watchdog(&watched, timeout))?;
        }
        let receiver = Arc::downgrade(&conn);
        std::thread::Builder::new().name("flyt-receiver".into()).spawn(move || receive_loop(&receiver))?;
        let flusher = conn.clone();
        std::thread::Builder::new().name("flyt-flusher".into()).spawn(move || flusher.flush_loop())?;
        Ok(conn)
    }

    /// Makes this the connection of session devices `first..first + count` (a session spread
    /// over several servers), before any request goes out.
    pub fn serve_devices(&self, first: u32, count: u32) {
        self.first_device.store(first, Ordering::Relaxed);
        let mut out = lock(&self.outgoing);
        out.first_device = first;
        out.device_count = count;
    }

    /// The server's address, for messages.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Attaches the session this connection carries (once; notices that need it fail before).
    pub fn attach(&self, session: &'static dyn SessionLink) {
        if self.session.get().is_none() {
            let _ = self.session.set(session);
        }
    }

    /// Whether host functions that streams will reach have yet to return.
    fn host_functions_pending(&self) -> bool {
        self.session.get().is_some_and(|session| session.host_functions_pending())
    }

    /// Hands a host job to the session.
    fn host_job(&self, job: crate::graphs::HostJob) -> Result<(), String> {
        let _ = self.detached.fetch_update(Ordering::AcqRel, Ordering::Acquire, |count| Some(count.saturating_sub(1)));
        match self.session.get() {
            Some(session) => {
                session.host_job(job, self.first_device.load(Ordering::Relaxed));
                Ok(())
            }
            None => Err("a host function call before the session opened".into()),
        }
    }

    fn check_alive(&self) -> CudaResult<()> {
        match self.failure.get() {
            Some(_) => Err(CudaError::DEVICES_UNAVAILABLE),
            None => Ok(()),
        }
    }

    /// Marks the connection dead, tells the user once, and fails every waiting call.
    fn fail(&self, reason: String) {
        if let Some(stream) = &*lock(&self.resume) {
            stream.close(&reason);
        }
        if self.failure.set(reason.clone()).is_ok() {
            crate::diagnostics::once("connection", &format!("flyt: lost the connection to the GPU server {}: {reason}", self.server));
        }
        let slots: Vec<_> = lock(&self.pending).drain().collect();
        for (_, slot) in slots {
            slot.complete(Err(CudaError::DEVICES_UNAVAILABLE));
        }
        if let Ok(writer) = self.writer.try_lock() {
            writer.wire.shutdown();
        }
        self.wake_receiver();
    }

    /// Whether this connection comes back after it breaks (`crate::reconnect`).
    pub fn resumes(&self) -> bool {
        lock(&self.resume).is_some()
    }

    /// The app is exiting: a server that keeps sessions for returning connections ends this one
    /// now (`req::Goodbye`) instead of waiting for it. Waits for nothing; later failures are not
    /// reported.
    pub fn goodbye(&self) {
        let Some(stream) = lock(&self.resume).clone() else { return };
        if self.failure.get().is_some() {
            return;
        }
        {
            let mut out = lock(&self.outgoing);
            if out.paused {
                return;
            }
            Self::enqueue_anywhere(&mut out, &req::Goodbye {}.into(), &[]);
        }
        // The server closes the connection next: nobody is to be told.
        let _ = self.failure.set("the app is exiting".into());
        // The flusher may hold the writing half a moment; a writer stuck for longer is not waited for.
        let deadline = Instant::now() + Duration::from_millis(200);
        loop {
            if let Ok(writer) = self.writer.try_lock() {
                let _ = self.write_locked(writer, &[]);
                break;
            }
            if Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        stream.close("the app is exiting");
    }

    /// The first failure of an asynchronous copy since the last call, taken.
    pub fn take_deferred(&self) -> Option<CudaError> {
        lock(&self.deferred).take()
    }

    /// Notices that will come unasked (host functions a stream will reach): the receiver reads
    /// until they have, even while no app thread calls CUDA (an app may wait for a host
    /// function's effect without a CUDA call).
    pub fn expect_notices(&self, count: usize) {
        self.detached.fetch_add(count, Ordering::AcqRel);
        self.wake_receiver();
    }

    /// Keeps an error for the next synchronizing call (the first one wins, as in CUDA).
    pub fn defer(&self, error: CudaError) {
        lock(&self.deferred).get_or_insert(error);
    }

    /// The outgoing buffer once no pause holds new requests (a checkpoint or a move of the
    /// session: the app's calls wait, as if the GPU were busy, and go on afterwards).
    fn unpaused(&self) -> CudaResult<std::sync::MutexGuard<'_, Outgoing>> {
        let mut out = lock(&self.outgoing);
        while out.paused {
            self.check_alive()?;
            out = self.resumed.wait_timeout(out, Duration::from_millis(100)).unwrap_or_else(|e| e.into_inner()).0;
        }
        self.check_alive()?;
        Ok(out)
    }

    /// The server's `Notice::Pause`: the last request goes out (`Pause`), new ones wait, and the
    /// receiver reads until the server says how the pause ends.
    fn pause(&self) {
        let mut out = lock(&self.outgoing);
        if !out.paused {
            if self.host_functions_pending() {
                out.pause_owed = true;
            } else {
                Self::enqueue_anywhere(&mut out, &req::Pause {}.into(), &[]);
            }
            out.paused = true;
            self.detached.fetch_add(1, Ordering::AcqRel);
        }
        drop(out);
        self.wake_flusher();
        self.wake_receiver();
    }

    /// The pause is over (`Notice::Resumed`, or the session continues on its new server).
    fn resume(&self) {
        let mut out = lock(&self.outgoing);
        out.pause_owed = false;
        if out.paused {
            out.paused = false;
            self.detached.fetch_sub(1, Ordering::AcqRel);
        }
        drop(out);
        self.resumed.notify_all();
    }

    /// The session moved: continues it on `address` (the same server when `None`) from its
    /// snapshot, swapping both halves of the connection.
    fn moved(&self, inbound: &mut Inbound, address: Option<String>, snapshot: &str) -> Result<(), String> {
        // The rings live in the session's segment, which the next server takes over: the last
        // one must be gone (its socket closed) before they start over.
        if matches!(inbound.wire, Wire::RingIn(..)) {
            if !inbound.wire.wait_peer_gone(PEER_GONE_TIMEOUT) {
                return Err(format!(
                    "the GPU server {} did not let go of the session within {} s",
                    self.server,
                    PEER_GONE_TIMEOUT.as_secs()
                ));
            }
            // Dropping these halves later must not mark the next connection's rings closed.
            inbound.wire.retire_rings();
        }
        let session = self.session.get().ok_or("a move before the session opened")?;
        // The last server's stream must not come back to it.
        if let Some(stream) = lock(&self.resume).take() {
            stream.close("the session moved");
        }
        let (reader, writer) = session.reconnect(address.as_deref(), snapshot)?;
        *lock(&self.resume) = writer.resume_handle();
        self.writes_directly.store(matches!(writer, Wire::RingOut(..)), Ordering::Relaxed);
        inbound.wire = reader;
        (inbound.start, inbound.end) = (0, 0);
        lock(&self.writer).wire = writer;
        self.resume();
        Ok(())
    }

    /// Appends one frame to the outgoing buffer, after a `SetDevice` when the calling thread's
    /// device is not the one the server runs requests on; returns the request's sequence number.
    fn enqueue(&self, out: &mut Outgoing, request: &Request, bulk: &[u8]) -> u32 {
        self.follow_thread(out);
        let seq = out.next_seq;
        // Sequence 0 is reserved for server notices.
        out.next_seq = out.next_seq.wrapping_add(1).max(1);
        Self::put(out, seq, request, bulk);
        seq
    }

    /// Appends what the server must know of the calling thread before its request: its device
    /// and, while a capture is active, its capture interaction mode (the server's session thread
    /// makes every app thread's calls).
    fn follow_thread(&self, out: &mut Outgoing) {
        Self::follow_thread_device(out);
        match self.session.get().and_then(|session| session.capture_mode()) {
            None => out.capture_mode = UNSENT,
            Some(mode) if mode != out.capture_mode => {
                out.capture_mode = mode;
                Self::put(out, 0, &req::CaptureMode { mode }.into(), &[]);
            }
            Some(_) => {}
        }
    }

    /// Appends a `SetDevice` when the calling thread's device is not the one the server runs
    /// requests on.
    fn follow_thread_device(out: &mut Outgoing) {
        // The server's own index; a device of another server (a request about the session, sent
        // here whatever the thread's device) leaves the server's device as it was.
        let device = crate::devices::thread_device().wrapping_sub(out.first_device);
        if device != out.device && device < out.device_count {
            out.device = device;
            // Sequence 0: a frame no reply answers (its failure is the deferred error), which
            // leaves the numbers the caller registered its reply under as they were.
            Self::put(out, 0, &req::SetDevice { index: device }.into(), &[]);
        }
    }

    /// Appends one frame whatever the thread's device (a message about the session itself, or
    /// the answer to one the server sent, which names what it answers).
    fn enqueue_anywhere(out: &mut Outgoing, request: &Request, bulk: &[u8]) {
        let seq = out.next_seq;
        out.next_seq = out.next_seq.wrapping_add(1).max(1);
        Self::put(out, seq, request, bulk);
    }

    fn put(out: &mut Outgoing, seq: u32, request: &Request, bulk: &[u8]) {
        out.frames += 1;
        let start = out.buf.len();
        out.buf.resize(start + HEADER_LEN, 0);
        request.encode(&mut out.buf);
        let message_len = u32::try_from(out.buf.len() - start - HEADER_LEN).unwrap_or(u32::MAX);
        put_header(&mut out.buf[start..], FrameHeader { message_len, seq, bulk_len: bulk.len() as u64 });
        out.buf.extend_from_slice(bulk);
    }

    /// Writes everything queued so far (and `tail`, straight from its buffer) in order.
    fn write_batch(&self, tail: &[u8]) -> CudaResult<()> {
        self.write_locked(lock(&self.writer), tail)
    }

    /// `write_batch` with the writing half already held.
    fn write_locked(&self, mut writer: std::sync::MutexGuard<'_, WireHalf>, tail: &[u8]) -> CudaResult<()> {
        let writer = &mut *writer;
        {
            let mut out = lock(&self.outgoing);
            std::mem::swap(&mut out.buf, &mut writer.batch);
        }
        if writer.batch.is_empty() && tail.is_empty() {
            return Ok(());
        }
        let result = self.write_all(&mut writer.wire, &mut [IoSlice::new(&writer.batch), IoSlice::new(tail)]);
        writer.batch.clear();
        match result {
            Ok(()) => Ok(()),
            Err(error) => {
                self.fail(format!("send failed: {error}"));
                Err(CudaError::DEVICES_UNAVAILABLE)
            }
        }
    }

    /// Writes every slice. When the socket is full, the server may itself be stuck writing a
    /// reply nobody is reading yet (the thread that will wait for it may be queued behind this
    /// write), so the receiver is asked to read before this thread waits for room.
    fn write_all(&self, wire: &mut Wire, mut slices: &mut [IoSlice<'_>]) -> io::Result<()> {
        IoSlice::advance_slices(&mut slices, 0);
        while !slices.is_empty() {
            match wire.write_vectored_nonblocking(slices) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(written) => IoSlice::advance_slices(&mut slices, written),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    if !lock(&self.pending).is_empty() {
                        self.wake_receiver();
                    }
                    wire.wait_writable(Duration::from_millis(50));
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Sends everything queued now, from the calling thread.
    pub fn flush(&self) -> CudaResult<()> {
        self.check_alive()?;
        self.write_batch(&[])
    }

    /// Queues an asynchronous request (no reply expected).
    /// Sends a host function's end (`HostCallDone`) even during a pause, and the owed `Pause`
    /// after the last one. `returned` counts the function as returned, in the same hold of the
    /// outgoing buffer as the enqueue, so a `Pause` is never queued between the two (the
    /// server would then drain before this end, which it must wait for).
    pub fn send_host_call_done(self: &Arc<Self>, request: &Request, bulk: &[u8], returned: impl FnOnce()) -> CudaResult<()> {
        self.check_alive()?;
        {
            let mut out = lock(&self.outgoing);
            Self::enqueue_anywhere(&mut out, request, bulk);
            returned();
            if out.pause_owed && !self.host_functions_pending() {
                out.pause_owed = false;
                Self::enqueue_anywhere(&mut out, &req::Pause {}.into(), &[]);
            }
        }
        self.flush()
    }

    pub fn send_async(self: &Arc<Self>, request: &Request, bulk: &[u8]) -> CudaResult<()> {
        if bulk.len() > ZERO_COPY_BULK {
            self.check_alive()?;
            return self.send_with_bulk(request, bulk, None).map(|_| ());
        }
        self.send_async_with(request, bulk, || {})
    }

    /// `send_async` (small bulk only) that runs `enqueued` in the same hold of the outgoing
    /// buffer as the request is queued: host functions a launch adds count as pending only once
    /// the launch is queued, so a pause never waits for a launch it holds back.
    pub fn send_async_with(self: &Arc<Self>, request: &Request, bulk: &[u8], enqueued: impl FnOnce()) -> CudaResult<()> {
        self.check_alive()?;
        let queued = {
            let mut out = self.unpaused()?;
            self.enqueue(&mut out, request, bulk);
            enqueued();
            out.buf.len()
        };
        if queued >= FLUSH_AT {
            self.flush()
        } else if self.writes_directly.load(Ordering::Relaxed)
            && self.async_run.fetch_add(1, Ordering::Relaxed) < DIRECT_BURST
            && let Ok(writer) = self.writer.try_lock()
        {
            let written = self.write_locked(writer, &[]);
            flyt_ring::timeline::mark(flyt_ring::timeline::Stage::Posted);
            written
        } else {
            self.wake_flusher();
            Ok(())
        }
    }

    fn register(self: &Arc<Self>, out: &Outgoing, destination: Option<HostDestination>, detached: bool) -> Arc<ReplySlot> {
        let slot = Arc::new(ReplySlot::new(self, destination, detached));
        if detached {
            self.detached.fetch_add(1, Ordering::AcqRel);
        }
        // Registered before the bytes can reach the server: the reply may come back at once.
        lock(&self.pending).insert(out.next_seq, slot.clone());
        slot
    }

    /// Sends a request whose reply will be collected through the returned slot.
    pub fn send_for_reply(self: &Arc<Self>, request: &Request, destination: Option<HostDestination>) -> CudaResult<Arc<ReplySlot>> {
        self.send_for_reply_marked(request, destination).map(|(slot, _)| slot)
    }

    /// [`Conn::send_for_reply`], with the number of frames queued once this request was: while
    /// [`Conn::frames_sent`] still answers it, nothing was sent after the request.
    pub fn send_for_reply_marked(
        self: &Arc<Self>,
        request: &Request,
        destination: Option<HostDestination>,
    ) -> CudaResult<(Arc<ReplySlot>, u64)> {
        self.check_alive()?;
        if self.async_run.load(Ordering::Relaxed) != 0 {
            self.async_run.store(0, Ordering::Relaxed);
        }
        let mut out = self.unpaused()?;
        let slot = self.register(&out, destination, false);
        self.enqueue(&mut out, request, &[]);
        Ok((slot, out.frames))
    }

    /// Handles what the server sent unasked (a pause, new limits) without waiting, for a call
    /// answered without a round trip: an app that only polls such calls still hears of them.
    pub fn read_arrived(&self) -> CudaResult<()> {
        // Another thread reading handles them.
        let Ok(mut inbound) = self.inbound.try_lock() else { return Ok(()) };
        let outcome = loop {
            match self.read_frame(&mut inbound, false) {
                Ok(true) => {}
                Ok(false) => break Ok(()),
                Err(reason) => break Err(reason),
            }
        };
        drop(inbound);
        if let Err(reason) = outcome {
            self.fail(reason);
            return Err(CudaError::DEVICES_UNAVAILABLE);
        }
        self.hand_over();
        Ok(())
    }

    /// Queues `request` (no bulk) if `still()` holds once no pause holds requests, checked under
    /// the same hold of the outgoing buffer; `Ok(None)` when it did not hold. A reply slot when
    /// `reply`. For requests tied to something a move replaces (a striped copy's data
    /// connections): a pause that ends in a move makes `still()` false before requests go on.
    pub fn send_if(
        self: &Arc<Self>,
        request: &Request,
        reply: bool,
        still: impl Fn() -> bool,
    ) -> CudaResult<Option<Option<Arc<ReplySlot>>>> {
        self.check_alive()?;
        let mut out = self.unpaused()?;
        if !still() {
            return Ok(None);
        }
        let slot = reply.then(|| self.register(&out, None, false));
        self.enqueue(&mut out, request, &[]);
        drop(out);
        self.flush()?;
        Ok(Some(slot))
    }

    /// Frames queued so far (see [`Conn::send_for_reply_marked`]).
    pub fn frames_sent(&self) -> u64 {
        lock(&self.outgoing).frames
    }

    /// Sends an asynchronous device-to-host copy: its bytes land in `destination` whenever its
    /// reply is read (always before the reply to any later call that waits for the copy), and a
    /// failure becomes the deferred error.
    pub fn send_detached(self: &Arc<Self>, request: &Request, destination: HostDestination) -> CudaResult<()> {
        self.check_alive()?;
        let mut out = self.unpaused()?;
        self.register(&out, Some(destination), true);
        self.enqueue(&mut out, request, &[]);
        Ok(())
    }

    /// Sends a request with a large bulk payload written straight from `bulk`; the call returns
    /// once the kernel has the bytes, so the app may reuse its buffer.
    pub fn send_with_bulk(self: &Arc<Self>, request: &Request, bulk: &[u8], reply: Option<()>) -> CudaResult<Option<Arc<ReplySlot>>> {
        self.check_alive()?;
        // The writing half is taken only once no pause holds requests (the pause's own request
        // needs it), and the pause is checked again under both locks.
        let mut writer = loop {
            drop(self.unpaused()?);
            let writer = lock(&self.writer);
            if !lock(&self.outgoing).paused {
                break writer;
            }
        };
        let writer = &mut *writer;
        let slot;
        {
            let mut out = lock(&self.outgoing);
            slot = reply.map(|()| self.register(&out, None, false));
            // Header and message now, bulk bytes straight from the app's buffer after them.
            self.follow_thread(&mut out);
            let start = out.buf.len();
            let seq = self.enqueue(&mut out, request, &[]);
            let message_len = u32::try_from(out.buf.len() - start - HEADER_LEN).unwrap_or(u32::MAX);
            put_header(&mut out.buf[start..], FrameHeader { message_len, seq, bulk_len: bulk.len() as u64 });
            std::mem::swap(&mut out.buf, &mut writer.batch);
        }
        let result = self.write_all(&mut writer.wire, &mut [IoSlice::new(&writer.batch), IoSlice::new(bulk)]);
        writer.batch.clear();
        match result {
            Ok(()) => Ok(slot),
            Err(error) => {
                self.fail(format!("send failed: {error}"));
                Err(CudaError::DEVICES_UNAVAILABLE)
            }
        }
    }

    /// Sends a request and waits for its reply message.
    pub fn call(self: &Arc<Self>, request: &Request) -> CudaResult<Vec<u8>> {
        use flyt_ring::timeline::{Stage, mark};
        mark(Stage::CallEnter);
        let slot = self.send_for_reply(request, None)?;
        self.flush()?;
        mark(Stage::CallSent);
        let reply = slot.wait();
        mark(Stage::CallReturn);
        reply
    }

    /// Waits until `slot` is answered: reads the connection for everyone while no other thread
    /// does, otherwise lets the reader hand the reply over.
    fn wait_for(&self, slot: &ReplySlot, started: Instant) {
        let spin_until = started + flyt_ring::spin_budget();
        while !slot.is_done() {
            if let Ok(mut inbound) = self.inbound.try_lock() {
                let outcome = self.read_until(&mut inbound, || slot.is_done(), spin_until);
                drop(inbound);
                if let Err(reason) = outcome {
                    self.fail(reason);
                }
                self.hand_over();
                return;
            }
            if Instant::now() < spin_until {
                std::hint::spin_loop();
                continue;
            }
            // Another thread reads and will complete our slot, or hand the reading over.
            *lock(&slot.waiter) = Some(std::thread::current());
            if slot.is_done() || self.failure.get().is_some() {
                break;
            }
            self.parked.fetch_add(1, Ordering::SeqCst);
            // Pairs with the fence in `hand_over`: either the reader sees this thread parked, or
            // this thread sees the reading half free.
            std::sync::atomic::fence(Ordering::SeqCst);
            if let Ok(inbound) = self.inbound.try_lock() {
                drop(inbound);
                self.parked.fetch_sub(1, Ordering::SeqCst);
                continue;
            }
            std::thread::park_timeout(Duration::from_millis(50));
            self.parked.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// After a thread stops reading: wakes the threads still waiting (one of them takes over)
    /// and the receiver if copies nobody waits for are outstanding.
    fn hand_over(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst) > 0 {
            let waiting: Vec<_> = lock(&self.pending).values().filter(|slot| !slot.detached).cloned().collect();
            for slot in waiting {
                slot.wake();
            }
        }
        if self.detached.load(Ordering::Acquire) > 0 {
            self.wake_receiver();
        }
    }

    fn wake_receiver(&self) {
        *lock(&self.receiver_wanted) = true;
        self.receiver_wake.notify_one();
    }

    /// Reads and handles frames until `done()`; polls without blocking until `spin_until`, then
    /// blocks. `Err` is the connection's failure.
    fn read_until(&self, inbound: &mut Inbound, done: impl Fn() -> bool, spin_until: Instant) -> Result<(), String> {
        let mut spinning = flyt_ring::SpinDeadline::new(spin_until);
        while !done() {
            if self.failure.get().is_some() {
                return Ok(());
            }
            let wait = !spinning.keep_spinning();
            if !self.read_frame(inbound, wait)? {
                std::hint::spin_loop();
            }
        }
        Ok(())
    }

    /// Reads one frame and hands it to its owner; without `wait`, `Ok(false)` if none has
    /// started to arrive.
    fn read_frame(&self, inbound: &mut Inbound, wait: bool) -> Result<bool, String> {
        let limits = FrameLimits::default();
        if inbound.buffered() == 0 && !inbound.fill(wait).map_err(|error| error.to_string())? {
            return Ok(false);
        }
        // A frame has started: the rest is on its way, so wait for it.
        while inbound.buffered() < HEADER_LEN {
            inbound.fill(true).map_err(|error| error.to_string())?;
        }
        let header_bytes: [u8; HEADER_LEN] =
            inbound.buf[inbound.start..inbound.start + HEADER_LEN].try_into().map_err(|_| "short header".to_string())?;
        let header = FrameHeader::decode(&header_bytes, &limits).map_err(|error| error.to_string())?;
        inbound.start += HEADER_LEN;
        self.frames_read.fetch_add(1, Ordering::Relaxed);
        let mut message = std::mem::take(&mut inbound.message);
        message.clear();
        message.resize(header.message_len as usize, 0);
        inbound.read_exact(&mut message).map_err(|error| error.to_string())?;
        let outcome = self.dispatch(inbound, header, &message);
        inbound.message = message;
        outcome.map(|()| true)
    }

    fn dispatch(&self, inbound: &mut Inbound, header: FrameHeader, message: &[u8]) -> Result<(), String> {
        if header.seq == 0 {
            let notice = flyt_protocol::frame::decode_exact::<Notice>(message);
            // A graph's device-to-host copy brings the app's bytes; other notices bring none.
            let mut bytes = Vec::new();
            if matches!(notice, Ok(Notice::HostCopyOut { host, .. }) if host.width.checked_mul(host.rows).and_then(|n| n.checked_mul(host.depth)) == Some(header.bulk_len))
            {
                bytes.resize(usize::try_from(header.bulk_len).map_err(|_| "a host copy too large".to_string())?, 0);
                inbound.read_exact(&mut bytes).map_err(|_| "connection ended inside a notice".to_string())?;
            } else {
                inbound.skip(header.bulk_len).map_err(|_| "connection ended inside a notice".to_string())?;
            }
            match notice {
                Ok(Notice::Limits { devices }) => *lock(&self.resized_devices) = Some(devices),
                Ok(Notice::Output { stdout, stderr }) => write_device_output(&stdout, &stderr),
                Ok(Notice::Pause) => self.pause(),
                Ok(Notice::Resumed) => self.resume(),
                Ok(Notice::OverBudget { bytes }) => match self.session.get() {
                    Some(session) => session.over_budget(bytes),
                    None => crate::diagnostics::once(
                        "over-budget",
                        &format!("flyt: the slice's memory quota is now {bytes} bytes below what the tenant holds"),
                    ),
                },
                Ok(Notice::Alive) => {}
                Ok(Notice::Moved { address, snapshot }) => self.moved(inbound, address, &snapshot)?,
                Ok(Notice::HostCall { call, run }) => self.host_job(crate::graphs::HostJob::Call { call, run })?,
                Ok(Notice::HostCopyOut { run, host }) => self.host_job(crate::graphs::HostJob::CopyOut { run, host, bytes })?,
                Ok(Notice::HostCopyIn { run, host }) => self.host_job(crate::graphs::HostJob::CopyIn { run, host })?,
                Err(error) => return Err(format!("undecodable notice: {error}")),
            }
            return Ok(());
        }
        let Some(slot) = lock(&self.pending).remove(&header.seq) else {
            return Err(format!("reply to unknown request {}", header.seq));
        };
        if header.bulk_len > 0 {
            let Some(destination) = slot.destination.filter(|d| d.len as u64 == header.bulk_len) else {
                return Err(format!("reply {} carries {} unexpected bytes", header.seq, header.bulk_len));
            };
            // SAFETY: the destination is the app's buffer of exactly `bulk_len` bytes, kept
            // valid and exclusive for this copy (see `HostDestination::new`).
            let target = unsafe { std::slice::from_raw_parts_mut(destination.ptr, destination.len) };
            if let Err(error) = inbound.read_exact(target) {
                slot.complete(Err(CudaError::DEVICES_UNAVAILABLE));
                return Err(error.to_string());
            }
        }
        if slot.detached {
            let outcome = decode_reply::<rep::MemcpyDtoH>(message).map_err(|_| CudaError::UNKNOWN);
            let error = match outcome {
                Ok(reply) => reply.result.err().or(reply.deferred),
                Err(error) => Some(error),
            };
            if let Some(error) = error {
                lock(&self.deferred).get_or_insert(error);
            }
            self.detached.fetch_sub(1, Ordering::AcqRel);
            slot.complete(Ok(Vec::new()));
        } else {
            slot.complete(Ok(message.to_vec()));
        }
        Ok(())
    }

    fn wake_flusher(&self) {
        if self.flush_wanted.swap(true, Ordering::AcqRel) {
            return;
        }
        let asleep = lock(&self.flusher_asleep);
        if *asleep {
            self.flusher_wake.notify_one();
        }
    }

    fn flush_loop(self: Arc<Self>) {
        loop {
            if self.failure.get().is_some() {
                return;
            }
            // Spin briefly: during a burst of launches the next one is microseconds away, and
            // a flusher that is awake costs the app no wake-up call.
            let spin_until = Instant::now() + FLUSHER_SPIN;
            while !self.flush_wanted.load(Ordering::Acquire) && Instant::now() < spin_until {
                std::hint::spin_loop();
            }
            if !self.flush_wanted.load(Ordering::Acquire) {
                let mut asleep = lock(&self.flusher_asleep);
                *asleep = true;
                while !self.flush_wanted.load(Ordering::Acquire) && self.failure.get().is_none() {
                    asleep = self.flusher_wake.wait_timeout(asleep, Duration::from_millis(200)).unwrap_or_else(|e| e.into_inner()).0;
                }
                *asleep = false;
            }
            self.flush_wanted.store(false, Ordering::Release);
            if self.write_batch(&[]).is_err() {
                return;
            }
        }
    }
}

/// The receiver: reads while replies nobody waits for are outstanding and no app thread is
/// reading; sleeps otherwise. Holds only a weak reference, so a dropped connection ends it.
fn receive_loop(conn: &Weak<Conn>) {
    loop {
        let Some(conn) = conn.upgrade() else { return };
        if conn.failure.get().is_some() {
            return;
        }
        // Asked to read (a writer found the socket full while replies were outstanding): read
        // until every outstanding reply is in. Otherwise read only for copies nobody waits for.
        let asked = std::mem::take(&mut *lock(&conn.receiver_wanted));
        if conn.detached.load(Ordering::Acquire) == 0 && !asked {
            let wanted = lock(&conn.receiver_wanted);
            if !*wanted {
                drop(conn.receiver_wake.wait_timeout(wanted, Duration::from_millis(200)).unwrap_or_else(|e| e.into_inner()).0);
            }
            continue;
        }
        let mut inbound = lock(&conn.inbound);
        let done = || {
            let unasked_done = conn.detached.load(Ordering::Acquire) == 0;
            if asked { unasked_done && lock(&conn.pending).is_empty() } else { unasked_done }
        };
        let outcome = conn.read_until(&mut inbound, done, Instant::now() + flyt_ring::spin_budget());
        drop(inbound);
        if let Err(reason) = outcome {
            conn.fail(reason);
        }
        conn.hand_over();
    }
}

/// Fails the connection when replies are due and the server has sent nothing for `timeout`:
/// every waiting call returns `CUDA_ERROR_DEVICE_UNAVAILABLE` with one line saying why, rather
/// than waiting for ever. Shutting the socket down wakes the threads blocked on it (a ring's
/// reader sees its peer gone).
fn watchdog(conn: &Weak<Conn>, timeout: Duration) {
    let tick = Duration::from_secs(1).min(timeout);
    let mut seen = 0;
    let mut silent_since: Option<Instant> = None;
    loop {
        std::thread::sleep(tick);
        let Some(conn) = conn.upgrade() else { return };
        if conn.failure.get().is_some() {
            return;
        }
        let read = conn.frames_read.load(Ordering::Relaxed);
        let waiting = lock(&conn.pending).len();
        if read != seen || waiting == 0 {
            seen = read;
            silent_since = None;
            continue;
        }
        let since = *silent_since.get_or_insert_with(Instant::now);
        // A live server says it is alive every second while calls wait: a resumable connection
        // this silent is broken somewhere on the way (a path that died without a reset, a rebound
        // address), and a new one may bring the session back before the timeout.
        if since.elapsed() >= SILENT_BREAK
            && since.elapsed() < SILENT_BREAK + tick
            && let Some(stream) = &*lock(&conn.resume)
        {
            stream.break_connection(stream.connection());
        }
        if since.elapsed() + tick > timeout {
            conn.fail(format!("it sent nothing for {} s while {waiting} call(s) waited for it (FLYT_REPLY_TIMEOUT)", timeout.as_secs()));
            if let Some(socket) = &conn.socket {
                // SAFETY: shutdown on a descriptor this connection owns a duplicate of.
                unsafe { libc::shutdown(socket.as_raw_fd(), libc::SHUT_RDWR) };
            }
            return;
        }
    }
}
