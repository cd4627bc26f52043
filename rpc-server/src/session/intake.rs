//! The session's incoming frames. The session's thread reads them itself; but a driver call it
//! makes may wait for the device (`cuMemFree` synchronizes, a copy on the legacy stream waits
//! for every blocking stream), while a stream the device waits for is held by one of the app's
//! host functions until the client's `HostCallDone`, which sits unread behind that call: the
//! driver and the app would wait for each other forever. So once a host call has waited a while
//! for its answer, a read-ahead thread takes the reader whenever the session's thread is busy,
//! answers `HostCallDone` (and `HostCopyDone`, with its bytes) at once and queues every other
//! frame, in order, for the session.

use std::collections::VecDeque;
use std::io::{BufReader, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use flyt_protocol::frame::{FrameError, FrameHeader, FrameLimits, read_full, read_message};
use flyt_protocol::ops::Request;

use crate::host_calls::HostCalls;
use crate::transport::Connection;

/// How long a host call waits for its answer before the read-ahead thread looks for it.
const PATIENCE: Duration = Duration::from_millis(2);
/// Frames queued ahead at most; past it the read-ahead waits for the session's thread.
const MAX_AHEAD: usize = 4096;
/// Bulk bytes held ahead at most; a frame with more is left for the session's thread to read.
const MAX_AHEAD_BYTES: u64 = 64 << 20;
/// How long a worker outlives its client while the session's thread is held in the driver.
const ORPHAN_GRACE: Duration = Duration::from_secs(10);

/// A connection read that spins for the ring or socket's spin budget before it blocks.
pub(super) struct SpinningReader(pub(super) Connection);

impl Read for SpinningReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut spinning = flyt_ring::SpinDeadline::after(flyt_ring::spin_budget());
        loop {
            match self.0.read_nonblocking(buf) {
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock && spinning.keep_spinning() => {
                    std::hint::spin_loop();
                }
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                    return self.0.read(buf);
                }
                Ok(0) if buf.is_empty() => return Ok(0),
                outcome => return outcome,
            }
        }
    }
}

/// A frame read ahead: its bulk bytes with it, or still in the stream (`None`: a large one,
/// after which nothing more is read ahead until the session has taken it).
enum Ahead {
    Frame { header: FrameHeader, message: Vec<u8>, bulk: Option<Vec<u8>> },
    Failed(FrameError),
}

pub(super) struct Reading {
    reader: BufReader<SpinningReader>,
    ahead: VecDeque<Ahead>,
    ahead_bytes: u64,
    /// The last frame queued left its bulk in the stream.
    bulk_in_stream: bool,
}

/// The session's side of its connection's incoming half.
pub(super) struct Intake {
    reading: Mutex<Reading>,
    limits: FrameLimits,
    /// The session's thread wants the reader: the read-ahead lets go of it.
    session_waits: AtomicBool,
    read_ahead_started: AtomicBool,
    /// The session's thread has returned: the watch ends.
    ended: AtomicBool,
}

/// The next frame for the session: its header is in `message`'s companion, its bulk either in
/// `bulk` or still to be read from the reader the guard holds.
pub(super) struct Next<'a> {
    pub header: FrameHeader,
    pub bulk: Option<Vec<u8>>,
    /// Held while the bulk is still in the stream (the handler reads it through it).
    pub guard: Option<MutexGuard<'a, Reading>>,
}

impl<'a> Next<'a> {
    /// Where the handler reads the frame's bulk bytes from. A bulk still in the stream holds
    /// the reader until its last byte is read (`BulkSource::release`), not until the handler
    /// returns: the handler's driver calls after it may wait for a host function whose answer
    /// the read-ahead must be free to read.
    pub fn into_bulk(self) -> Box<dyn BulkSource + 'a> {
        match (self.guard, self.bulk) {
            (Some(guard), None) => Box::new(Held(Some(guard))),
            (_, Some(bytes)) => Box::new(std::io::Cursor::new(bytes)),
            (None, None) => Box::new(std::io::empty()),
        }
    }
}

/// A frame's bulk bytes, and a way to let the reader go once they have all been read.
pub trait BulkSource: Read {
    fn release(&mut self) {}
}

impl BulkSource for std::io::Cursor<Vec<u8>> {}
impl BulkSource for std::io::Empty {}

/// The reader itself, held while a frame's bulk is read from the stream.
struct Held<'a>(Option<MutexGuard<'a, Reading>>);

impl Read for Held<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match &mut self.0 {
            Some(reading) => reading.reader.read(buf),
            None => Ok(0),
        }
    }
}

impl BulkSource for Held<'_> {
    fn release(&mut self) {
        self.0 = None;
    }
}

impl Intake {
    pub fn new(connection: Connection, limits: FrameLimits, outbox: Arc<crate::transport::Outbox>) -> Arc<Self> {
        let socket = connection.as_fd().try_clone_to_owned();
        // A resumable stream's client is gone only once it has not come back in time.
        let resumable = connection.resume_handle();
        let intake = Arc::new(Self {
            reading: Mutex::new(Reading {
                reader: BufReader::with_capacity(256 << 10, SpinningReader(connection)),
                ahead: VecDeque::new(),
                ahead_bytes: 0,
                bulk_in_stream: false,
            }),
            limits,
            session_waits: AtomicBool::new(false),
            read_ahead_started: AtomicBool::new(false),
            ended: AtomicBool::new(false),
        });
        match socket {
            Ok(socket) => {
                let watched = intake.clone();
                let spawned = std::thread::Builder::new()
                    .name("flyt-client-watch".into())
                    .stack_size(64 << 10)
                    .spawn(move || watched.watch_client(&socket, resumable.as_ref(), &outbox));
                if let Err(error) = spawned {
                    tracing::warn!(%error, "no client watch: a worker held in the driver outlives its client");
                }
            }
            Err(error) => tracing::warn!(%error, "no client watch: a worker held in the driver outlives its client"),
        }
        intake
    }

    /// The session's thread is done with the connection.
    pub fn end(&self) {
        self.ended.store(true, Ordering::Relaxed);
    }

    /// Tells a waiting client, about once a second, that the server is alive (`Outbox::keep_alive`),
    /// and ends the worker when its client has gone and the session's thread has not noticed within
    /// `ORPHAN_GRACE`: it is held in the driver (a kernel that never ends, a wait on something
    /// only the app would have done), and the GPU memory it holds would stay taken from every
    /// other tenant. A reading session thread sees the end of the connection at once.
    fn watch_client(&self, socket: &OwnedFd, resumable: Option<&flyt_ring::resume::Handle>, outbox: &crate::transport::Outbox) {
        let mut gone_since: Option<Instant> = None;
        let mut frames_seen = 0;
        while !self.ended.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_secs(1));
            outbox.keep_alive(&mut frames_seen);
            let hung_up = match resumable {
                Some(stream) => stream.ended().is_some(),
                None => flyt_ring::peer_hung_up(socket.as_fd()),
            };
            if !hung_up {
                gone_since = None;
                continue;
            }
            let since = *gone_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= ORPHAN_GRACE && !self.ended.load(Ordering::Relaxed) {
                tracing::error!(
                    grace_s = ORPHAN_GRACE.as_secs(),
                    "the client is gone and the session's thread is held in the driver: ending the worker so its GPU memory goes back"
                );
                // SAFETY: _exit ends the process at once; no Rust state is touched after it. The
                // driver's exit handlers could wait for the very work that holds the session.
                unsafe { libc::_exit(3) };
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Reading> {
        self.reading.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The session's next frame, its message in `message`.
    pub fn next(&self, message: &mut Vec<u8>) -> Result<Next<'_>, FrameError> {
        self.session_waits.store(true, Ordering::Relaxed);
        let mut reading = self.lock();
        self.session_waits.store(false, Ordering::Relaxed);
        match reading.ahead.pop_front() {
            Some(Ahead::Failed(error)) => Err(error),
            Some(Ahead::Frame { header, message: bytes, bulk }) => {
                *message = bytes;
                if let Some(bytes) = &bulk {
                    reading.ahead_bytes -= bytes.len() as u64;
                }
                if bulk.is_none() && header.bulk_len != 0 {
                    // The large frame the read-ahead stopped at: its bulk follows in the stream.
                    reading.bulk_in_stream = false;
                    return Ok(Next { header, bulk: None, guard: Some(reading) });
                }
                Ok(Next { header, bulk, guard: None })
            }
            None => {
                let header = read_message(&mut reading.reader, &self.limits, message)?;
                let guard = (header.bulk_len != 0).then_some(reading);
                Ok(Next { header, bulk: None, guard })
            }
        }
    }

    /// Starts the read-ahead thread for a session that has reached host functions (once).
    pub fn start_read_ahead(self: &Arc<Self>, calls: Arc<HostCalls>, stats: Option<Arc<crate::stats::SlotStats>>) {
        // Checked before every frame once host functions are in use: a load, not a swap.
        if self.read_ahead_started.load(Ordering::Relaxed) || self.read_ahead_started.swap(true, Ordering::Relaxed) {
            return;
        }
        let intake = self.clone();
        let spawned = std::thread::Builder::new().name("flyt-read-ahead".into()).spawn(move || intake.read_ahead(&calls, stats.as_deref()));
        if let Err(error) = spawned {
            tracing::warn!(%error, "no read-ahead thread: a host function waiting behind a device-wide wait may hang");
        }
    }

    fn read_ahead(&self, calls: &HostCalls, stats: Option<&crate::stats::SlotStats>) {
        let mut message = Vec::new();
        while calls.wait_unanswered(PATIENCE) {
            // The session's thread holds the reader while it reads: then it will see the answer.
            let guard = if self.session_waits.load(Ordering::Relaxed) { None } else { self.reading.try_lock().ok() };
            let Some(mut reading) = guard else {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            };
            if reading.bulk_in_stream || reading.ahead.len() >= MAX_AHEAD {
                drop(reading);
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            let header = match read_message(&mut reading.reader, &self.limits, &mut message) {
                Ok(header) => header,
                Err(error) => {
                    // Nobody will answer the host calls any more: let their streams go, so a
                    // session thread waiting behind them returns and sees the end too.
                    calls.close();
                    reading.ahead.push_back(Ahead::Failed(error));
                    return;
                }
            };
            if header.bulk_len == 0
                && let Ok(Request::HostCallDone(done)) = Request::decode(&message)
            {
                if let Some(stats) = stats {
                    stats.call(Request::HostCallDone(done.clone()).info().id);
                }
                // A run nobody waits for is the client's mistake; the session's own handling
                // would refuse it, and a no-reply op has nobody to tell.
                if calls.done(done.run).is_err() {
                    tracing::debug!(run = done.run, "HostCallDone for no waiting run");
                }
                continue;
            }
            // A host-to-device graph copy's bytes, which its held stream waits for.
            if header.bulk_len != 0
                && let Ok(Request::HostCopyDone(done)) = Request::decode(&message)
                && calls.bytes_wanted(done.run).is_some_and(|len| len as u64 == header.bulk_len)
            {
                let mut bytes = vec![0u8; header.bulk_len as usize];
                if let Err(error) = read_full(&mut reading.reader, &mut bytes, false) {
                    calls.close();
                    reading.ahead.push_back(Ahead::Failed(error));
                    return;
                }
                if calls.copy_done(done.run, bytes).is_err() {
                    tracing::debug!(run = done.run, "HostCopyDone for no waiting run");
                }
                continue;
            }
            let bulk = if header.bulk_len == 0 {
                Some(Vec::new())
            } else if reading.ahead_bytes + header.bulk_len <= MAX_AHEAD_BYTES {
                let mut bytes = vec![0u8; header.bulk_len as usize];
                if let Err(error) = read_full(&mut reading.reader, &mut bytes, false) {
                    reading.ahead.push_back(Ahead::Failed(error));
                    return;
                }
                reading.ahead_bytes += header.bulk_len;
                Some(bytes)
            } else {
                reading.bulk_in_stream = true;
                None
            };
            reading.ahead.push_back(Ahead::Frame { header, message: std::mem::take(&mut message), bulk });
        }
    }
}
