//! The server's side of striped bulk copies (`flyt_protocol::stripes`): the session's data
//! connections, each served by a thread of its own that reads whichever host-to-device chunk its
//! connection brings next straight into a staging buffer the session thread handed it, or writes
//! a device-to-host chunk as soon as its device copy into staging is done. The session thread
//! keeps the copy in its stream's order: it queues each chunk's device copy as the chunk lands
//! (host to device, until every connection ended its share), or queues every chunk's copy into
//! staging in order, each for the connection with the fewest chunks to write, and replies once
//! all were written (device to host), with a few chunks in flight at once so the network and the
//! PCIe copies overlap.
//!
//! Data connections join through the listener (their hello carries `Hello::stripe`, checked like
//! a session's: token, TLS), which hands them to the session's worker; the worker admits one only
//! with the session's secret. A data connection that breaks, stalls past `IO_TIMEOUT` or sends a
//! chunk other than the one expected fails the copy and ends striping for the session (all its data
//! connections are closed, so the client goes back to the main connection): it never hangs the
//! session nor reaches another one.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::frame::write_value;
use flyt_protocol::stripes::{
    BLOCKS_AHEAD, CHUNK_HEADER_LEN, ChunkHeader, Compressor, Decompressor, MAX_LINKS, SECRET_LEN, StripeJoin, StripeReply, block_pool,
    chunks, secrets_equal,
};

use crate::backend::Device;
use crate::transport::Connection;

/// How long a data connection may keep the session waiting for a chunk's next bytes, or for room
/// to write them, before the copy fails.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Smallest chunk a client may ask for (smaller ones would only cost headers).
const MIN_CHUNK: u64 = 64 << 10;
/// How long a data connection's thread polls a chunk's device-to-host copy before it naps: a
/// 4 MiB chunk copies in about 80 us at PCIe 5 speed, and the shortest nap lasts about 60 us
/// (the kernel's timer slack), so napping from the start left the socket idle between chunks
/// (64 MiB copies over a Unix socket, 4 connections: 13.4 GB/s napping, 14.8 polling; H200
/// host, 2026-11-29).
const POLL_COPY: Duration = Duration::from_millis(1);

/// A striped copy as its request names it: the device side (already where the session keeps
/// it), its length, chunk size and id.
#[derive(Clone, Copy, Debug)]
pub struct StripedCopy {
    pub device: u64,
    pub len: u64,
    pub chunk: u64,
    pub transfer: u64,
}

enum Job<D: Device> {
    /// Read the connection's next chunk of `transfer` into `staging`, or the end of its share
    /// (`staging` `None`: only the end is due, every chunk has landed).
    Receive { transfer: u64, staging: Option<D::Staging> },
    /// Read the connection's next chunk of `transfer` and drop it (its copy was refused), or the
    /// end of its share.
    Discard { transfer: u64 },
    /// Write the chunk once its device copy is done; with `compress`, as LZ4 when that is smaller.
    Send { transfer: u64, offset: u64, len: u64, copy: D::PendingCopy, compress: bool },
}

enum Done<D: Device> {
    Received {
        offset: u64,
        len: u64,
        staging: D::Staging,
    },
    /// A chunk read and dropped (its copy was refused).
    Dropped {
        offset: u64,
        len: u64,
    },
    /// The connection's share of the copy has ended (its end was read, now or before).
    Ended,
    Handled,
    Failed(CudaError, String),
    /// The link's threads ended (said once, after their last answer).
    Gone,
}

/// A link's answer, named by the link's id (a link that joined again has a new one, so what
/// the old one still said is told apart).
struct Answered<D: Device> {
    link: u64,
    done: Done<D>,
}

struct Link<D: Device> {
    id: u64,
    jobs: Sender<Job<D>>,
    socket: Connection,
    timing: Arc<LinkTiming>,
}

/// The session's data connections by index, and where all their answers come.
struct Links<D: Device> {
    joined: Vec<Option<Link<D>>>,
    answers: Receiver<Answered<D>>,
    answer: Sender<Answered<D>>,
    next_id: u64,
}

/// `FLYT_RPC_STRIPE_TRACE=1`: each striped copy logs where its time went (the dealing thread
/// waiting for the links, taking staging, queueing device copies; each link's threads busy and
/// idle), to find what holds a copy under the link's speed.
fn tracing_copies() -> bool {
    static TRACE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TRACE.get_or_init(|| std::env::var("FLYT_RPC_STRIPE_TRACE").is_ok_and(|value| value == "1"))
}

/// A link's time since the last traced copy, in nanoseconds (counted only while tracing).
#[derive(Default)]
struct LinkTiming {
    /// Its first thread waiting for a job.
    idle: AtomicU64,
    /// Its first thread running jobs (reading chunks, waiting for device copies, coding).
    working: AtomicU64,
    /// Its second thread decoding and writing.
    finishing: AtomicU64,
}

/// Adds the time since `since` to `counter`.
fn count_since(counter: &AtomicU64, since: Instant) {
    counter.fetch_add(u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
}

/// A session's data connections.
pub struct Stripes<D: Device> {
    secret: [u8; SECRET_LEN],
    device: Arc<D>,
    /// By index; a copy uses them only when every index below the count has joined.
    links: Mutex<Links<D>>,
    /// Set when the session ends: link threads waiting on a device copy give up.
    closing: Arc<AtomicBool>,
    /// Where the bytes compression saved are counted.
    stats: Option<Arc<crate::stats::SlotStats>>,
    /// Chunks of a host-to-device copy in flight at most: three quarters of the device's staging
    /// slots. Each holds one until the session thread queues its device copy, so the session
    /// thread takes the next slot only once fewer are in flight (or it would wait for a slot only
    /// it can free); the spare quarter are slots whose last device copy is done, so taking one
    /// does not wait for the copy just queued (on an H200, a window of all 8 slots ran at a third
    /// of the speed of 8 out of 16).
    window: usize,
    /// The session's client sends a host-to-device copy again over its main connection when a
    /// data connection broke under it (a resumable session, `crate::reconnect`): not an error.
    resent_when_broken: AtomicBool,
}

/// A session's secret for its data connections.
pub fn random_secret() -> std::io::Result<[u8; SECRET_LEN]> {
    let mut secret = [0u8; SECRET_LEN];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut secret)?;
    Ok(secret)
}

/// `SO_SNDTIMEO`: a client that stops reading a device-to-host chunk fails the copy.
fn set_write_timeout(socket: &Connection, timeout: Duration) {
    let value = libc::timeval { tv_sec: timeout.as_secs() as libc::time_t, tv_usec: 0 };
    // SAFETY: setsockopt on a descriptor the connection owns, with a `timeval` it reads during the call.
    unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            std::ptr::addr_of!(value).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        );
    }
}

impl<D: Device> Stripes<D> {
    /// `staging_slots`: the device's pinned staging buffers (`--staging-slots`).
    pub fn new(device: Arc<D>, secret: [u8; SECRET_LEN], stats: Option<Arc<crate::stats::SlotStats>>, staging_slots: usize) -> Self {
        // The session's other copies may hold slots too, but their holders free them on their own.
        let window = (staging_slots - staging_slots / 4).max(1);
        let (answer, answers) = channel();
        Self {
            secret,
            device,
            links: Mutex::new(Links { joined: Vec::new(), answers, answer, next_id: 0 }),
            closing: Arc::new(AtomicBool::new(false)),
            stats,
            window,
            resent_when_broken: AtomicBool::new(false),
        }
    }

    /// The client sends copies a broken data connection interrupted again (a resumable session).
    pub fn resend_broken_copies(&self) {
        self.resent_when_broken.store(true, Ordering::Relaxed);
    }

    /// Whether a copy a broken data connection interrupted comes again from the client.
    pub fn broken_copies_come_again(&self) -> bool {
        self.resent_when_broken.load(Ordering::Relaxed)
    }

    fn links(&self) -> std::sync::MutexGuard<'_, Links<D>> {
        self.links.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Admits a data connection that presented `join` (the worker checked it names this
    /// session), or refuses it with the reason; either way the connection is answered.
    pub fn join(&self, join: &StripeJoin, socket: Connection) -> Result<(), String> {
        let mut answer = socket.try_clone().map_err(|error| error.to_string())?;
        if !secrets_equal(&join.secret, &self.secret) {
            return refuse(socket, "wrong stripe secret");
        }
        let index = join.index as usize;
        if index >= MAX_LINKS {
            return refuse(socket, &format!("data connection {index} is past the limit of {MAX_LINKS}"));
        }
        // Taken only between copies (a copy holds the links throughout).
        let mut links = self.links();
        if links.joined.get(index).is_some_and(Option::is_some) {
            // A resumable session's client joins again after a cut its server may not have
            // noticed on an idle link: the new connection replaces the old, whose thread ends.
            if !self.broken_copies_come_again() {
                return refuse(socket, &format!("data connection {index} has joined already"));
            }
            if let Some(old) = links.joined[index].take() {
                old.socket.shutdown();
            }
        }
        let (reader, writer) =
            (socket.try_clone().map_err(|error| error.to_string())?, socket.try_clone().map_err(|error| error.to_string())?);
        let _ = reader.set_read_timeout(Some(IO_TIMEOUT));
        set_write_timeout(&writer, IO_TIMEOUT);
        let (jobs, job_queue) = channel();
        let id = links.next_id;
        links.next_id += 1;
        let done = links.answer.clone();
        let (device, closing, stats) = (self.device.clone(), self.closing.clone(), self.stats.clone());
        let timing = Arc::new(LinkTiming::default());
        let link_timing = timing.clone();
        std::thread::Builder::new()
            .name(format!("flyt-stripe-{index}"))
            .spawn(move || {
                let ends = LinkEnds { id, jobs: &job_queue, done: &done, closing: &closing, stats: stats.as_deref(), timing: &link_timing };
                serve_link(&*device, reader, writer, ends);
                let _ = done.send(Answered { link: id, done: Done::Gone });
            })
            .map_err(|error| error.to_string())?;
        write_value(&mut answer, 0, &StripeReply::Joined).map_err(|error| error.to_string())?;
        if links.joined.len() <= index {
            links.joined.resize_with(index + 1, || None);
        }
        links.joined[index] = Some(Link { id, jobs, socket, timing });
        Ok(())
    }

    /// Closes every data connection (the client sees them end and copies over the main one).
    fn break_all(links: &mut Vec<Option<Link<D>>>, reason: &str) {
        if links.iter().any(Option::is_some) {
            tracing::warn!(%reason, "striping ends for this session");
        }
        for link in links.drain(..).flatten() {
            link.socket.shutdown();
        }
    }

    /// The joined links in order, as many as are consecutive from 0.
    fn usable(links: &[Option<Link<D>>]) -> usize {
        links.iter().take_while(|link| link.is_some()).count()
    }

    /// Checks a striped copy's chunking; a bad one leaves the data streams out of step, so
    /// striping ends.
    fn check_chunking(&self, links: &mut Vec<Option<Link<D>>>, len: u64, chunk: u64, copy_chunk: u64) -> CudaResult<usize> {
        let count = Self::usable(links);
        if count == 0 {
            return Err(CudaError::NOT_SUPPORTED);
        }
        if len == 0 || !(MIN_CHUNK..=copy_chunk).contains(&chunk) {
            Self::break_all(links, "a striped copy with a bad chunk size");
            return Err(CudaError::INVALID_VALUE);
        }
        Ok(count)
    }

    /// Chunks of a host-to-device copy in flight: two per connection (each reads one while the
    /// next waits its turn), within the staging slots (see `window`).
    fn window(&self, count: usize) -> usize {
        (count * 2).min(self.window).max(1)
    }

    /// Receives a host-to-device copy of `len` bytes for `dst` (checked by the session, or
    /// `refused` with that error: its chunks are then read and dropped, keeping the streams in
    /// step) and queues each chunk's device copy on `stream` as it lands, whichever connection
    /// brought it, until every connection has ended its share.
    pub fn receive(&self, copy: StripedCopy, stream: D::Stream, copy_chunk: u64, refused: Option<CudaError>) -> CudaResult<()> {
        let StripedCopy { device: dst, len, chunk, transfer } = copy;
        let mut links = self.links();
        let count = match self.check_chunking(&mut links.joined, len, chunk, copy_chunk) {
            Ok(count) => count,
            Err(error) => return Err(refused.unwrap_or(error)),
        };
        let plan = chunks(len, chunk, count);
        let biggest = plan.iter().map(|&(_, piece)| piece).max().unwrap_or(0);
        // The chunks still due, by offset: each lands once, as the plan cut it.
        let mut due: crate::session::IdMap<u64, u64> = plan.into_iter().collect();
        let mut ended = vec![false; count];
        let window = self.window(count);
        let mut dealer = Dealer::new(&links, count, "host to device", len, refused.map_or(Ok(()), Err));
        loop {
            // Each connection whose share goes on reads with a job in hand (two at most).
            while dealer.broken.is_none() && dealer.in_flight < window {
                let Some(index) = dealer.freest(|index| !ended[index]) else { break };
                let started = dealer.timing.as_ref().map(|_| Instant::now());
                let job = if due.is_empty() {
                    Job::Receive { transfer, staging: None }
                } else if dealer.outcome.is_ok() {
                    match usize::try_from(biggest).map_err(|_| CudaError::INVALID_VALUE).and_then(|bytes| self.device.staging(bytes)) {
                        Ok(staging) => Job::Receive { transfer, staging: Some(staging) },
                        Err(error) => {
                            dealer.outcome = Err(error);
                            Job::Discard { transfer }
                        }
                    }
                } else {
                    Job::Discard { transfer }
                };
                if let Some((timing, started)) = dealer.timing.as_ref().zip(started) {
                    count_since(&timing.making, started);
                }
                if !dealer.give(index, job) {
                    break;
                }
            }
            let Some((index, done)) = dealer.next() else { break };
            let (offset, piece, staging) = match done {
                Done::Received { offset, len, staging } => (offset, len, Some(staging)),
                Done::Dropped { offset, len } => (offset, len, None),
                Done::Ended => {
                    ended[index] = true;
                    continue;
                }
                _ => continue,
            };
            if due.remove(&offset) != Some(piece) {
                dealer.lose(format!("a chunk at {offset} ({piece} bytes) that copy {transfer} does not have due"));
            } else if let Some(staging) = staging.filter(|_| dealer.outcome.is_ok()) {
                let started = dealer.timing.as_ref().map(|_| Instant::now());
                dealer.outcome = self.device.copy_htod(dst + offset, staging, stream);
                if let Some((timing, started)) = dealer.timing.as_ref().zip(started) {
                    count_since(&timing.landing, started);
                }
            }
        }
        // Every share ended: a chunk that never came leaves the streams in doubt.
        if dealer.broken.is_none() && !due.is_empty() {
            dealer.lose(format!("copy {transfer} ended with {} of its chunks not sent", due.len()));
        }
        let settled = dealer.finish();
        Self::settle(&mut links, settled)
    }

    /// Sends a device-to-host copy of `len` bytes from `src` (checked by the session) on
    /// `stream`: each chunk's device copy into staging is queued in order, for the connection
    /// with the fewest chunks to write, which writes it once it is done. Returns once every
    /// chunk was written (or the copy failed: the client stops waiting for the rest when the
    /// reply says so).
    pub fn send(&self, copy: StripedCopy, stream: D::Stream, copy_chunk: u64, compress: bool) -> CudaResult<()> {
        let StripedCopy { device: src, len, chunk, transfer } = copy;
        let mut links = self.links();
        let count = self.check_chunking(&mut links.joined, len, chunk, copy_chunk)?;
        let mut plan = chunks(len, chunk, count).into_iter();
        let mut dealer = Dealer::new(&links, count, "device to host", len, Ok(()));
        loop {
            while dealer.broken.is_none() && dealer.outcome.is_ok() {
                let Some(index) = dealer.freest(|_| true) else { break };
                let Some((offset, piece)) = plan.next() else { break };
                let started = dealer.timing.as_ref().map(|_| Instant::now());
                let copied = usize::try_from(piece)
                    .map_err(|_| CudaError::INVALID_VALUE)
                    .and_then(|piece_len| self.device.staging(piece_len))
                    .and_then(|staging| self.device.start_dtoh(src + offset, staging, stream));
                if let Some((timing, started)) = dealer.timing.as_ref().zip(started) {
                    count_since(&timing.making, started);
                }
                match copied {
                    Ok(copy) => {
                        if !dealer.give(index, Job::Send { transfer, offset, len: piece, copy, compress }) {
                            break;
                        }
                    }
                    Err(error) => dealer.outcome = Err(error),
                }
            }
            if dealer.next().is_none() {
                break;
            }
        }
        let settled = dealer.finish();
        Self::settle(&mut links, settled)
    }

    /// A copy's outcome; striping ends when the copy broke (`broken`, why).
    fn settle(links: &mut Links<D>, (outcome, broken): (CudaResult<()>, Option<String>)) -> CudaResult<()> {
        if let Some(reason) = broken {
            Self::break_all(&mut links.joined, &reason);
        }
        outcome
    }
}

/// Most jobs a link holds at once: one it works on, the next waiting (a link with none left idle
/// between chunks; with more, a slow link would sit on chunks a faster one could take).
const JOBS_PER_LINK: usize = 2;

/// The session thread's side of one striped copy: the links' jobs in flight and the copy's
/// outcome. A link that fails (`DEVICES_UNAVAILABLE`), ends, or sends what the copy does not have
/// due closes them all: striping ends once the copy's answers are all in.
struct Dealer<'a, D: Device> {
    links: &'a [Option<Link<D>>],
    answers: &'a Receiver<Answered<D>>,
    count: usize,
    /// Jobs given to each link and not yet answered.
    outstanding: Vec<usize>,
    in_flight: usize,
    outcome: CudaResult<()>,
    broken: Option<String>,
    timing: Option<DealTiming>,
    way: &'static str,
    len: u64,
}

impl<'a, D: Device> Dealer<'a, D> {
    fn new(links: &'a Links<D>, count: usize, way: &'static str, len: u64, outcome: CudaResult<()>) -> Self {
        Self {
            links: &links.joined[..count],
            answers: &links.answers,
            count,
            outstanding: vec![0; count],
            in_flight: 0,
            outcome,
            broken: None,
            timing: tracing_copies().then(DealTiming::start),
            way,
            len,
        }
    }

    /// The link with the fewest jobs, below `JOBS_PER_LINK`, among those `open` names.
    fn freest(&self, open: impl Fn(usize) -> bool) -> Option<usize> {
        (0..self.count).filter(|&index| open(index) && self.outstanding[index] < JOBS_PER_LINK).min_by_key(|&index| self.outstanding[index])
    }

    fn give(&mut self, index: usize, job: Job<D>) -> bool {
        let sent = self.links[index].as_ref().is_some_and(|link| link.jobs.send(job).is_ok());
        if sent {
            self.outstanding[index] += 1;
            self.in_flight += 1;
        } else {
            self.lose("a data connection's thread ended".into());
        }
        sent
    }

    /// The copy cannot go on: striping ends, and the links' sockets shut so their threads stop
    /// waiting for bytes that will not come and answer at once.
    fn lose(&mut self, reason: String) {
        self.outcome = self.outcome.and(Err(CudaError::DEVICES_UNAVAILABLE));
        if self.broken.is_none() {
            self.broken = Some(reason);
            for link in self.links.iter().flatten() {
                link.socket.shutdown();
            }
        }
    }

    /// The next answer of a link of this copy that is neither a failure nor the link's end
    /// (those are taken in here); `None` once nothing is in flight.
    fn next(&mut self) -> Option<(usize, Done<D>)> {
        while self.in_flight > 0 {
            let asked = self.timing.as_ref().map(|_| Instant::now());
            let answered = self.answers.recv();
            if let Some((timing, asked)) = self.timing.as_ref().zip(asked) {
                count_since(&timing.waiting, asked);
            }
            // The links' threads each hold a sender until they end, and this one is kept: a
            // closed channel cannot happen, but is no reason to wait.
            let Ok(Answered { link, done }) = answered else {
                self.in_flight = 0;
                self.lose("the data connections' answers ended".into());
                return None;
            };
            // What a link that left (or joined again since) still said.
            let Some(index) = self.links.iter().position(|joined| joined.as_ref().is_some_and(|joined| joined.id == link)) else {
                continue;
            };
            if let Done::Gone = done {
                self.in_flight -= std::mem::take(&mut self.outstanding[index]);
                self.lose("a data connection's thread ended".into());
                continue;
            }
            self.outstanding[index] = self.outstanding[index].saturating_sub(1);
            self.in_flight -= 1;
            match done {
                Done::Failed(error, reason) => {
                    self.outcome = self.outcome.and(Err(error));
                    if error == CudaError::DEVICES_UNAVAILABLE {
                        self.lose(reason);
                    }
                }
                done => return Some((index, done)),
            }
        }
        None
    }

    /// Waits for every answer still due and logs the trace: the copy's outcome, and why it
    /// broke when it did (then striping ends).
    fn finish(mut self) -> (CudaResult<()>, Option<String>) {
        while self.next().is_some() {}
        if let Some(timing) = &self.timing {
            timing.log(self.way, self.len, self.count, self.links);
        }
        (self.outcome, self.broken)
    }
}

/// The dealing thread's time in one traced copy, in nanoseconds, from `started`.
struct DealTiming {
    started: Instant,
    /// Waiting for the links' answers.
    waiting: AtomicU64,
    /// Queueing the device copies of chunks that landed.
    landing: AtomicU64,
    /// Making jobs: taking staging (which waits for its last device copy), queueing device copies.
    making: AtomicU64,
}

impl DealTiming {
    fn start() -> Self {
        Self { started: Instant::now(), waiting: AtomicU64::new(0), landing: AtomicU64::new(0), making: AtomicU64::new(0) }
    }

    fn log<D: Device>(&self, way: &str, len: u64, count: usize, links: &[Option<Link<D>>]) {
        let micros = |counter: &AtomicU64| counter.swap(0, Ordering::Relaxed) / 1000;
        let per_link = |pick: fn(&LinkTiming) -> &AtomicU64| {
            links.iter().flatten().map(|link| micros(pick(&link.timing)).to_string()).collect::<Vec<_>>().join(",")
        };
        tracing::info!(
            way,
            len,
            connections = count,
            total_us = self.started.elapsed().as_micros() as u64,
            waiting_for_links_us = micros(&self.waiting),
            queueing_landed_us = micros(&self.landing),
            making_jobs_us = micros(&self.making),
            links_working_us = %per_link(|timing| &timing.working),
            links_idle_us = %per_link(|timing| &timing.idle),
            links_finishing_us = %per_link(|timing| &timing.finishing),
            "striped copy traced"
        );
    }
}

impl<D: Device> Drop for Stripes<D> {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::Release);
        for link in self.links().joined.drain(..).flatten() {
            link.socket.shutdown();
        }
    }
}

/// What a job gave: its answer, a compressed chunk read and still to decode, or a chunk to
/// write.
enum Answer<D: Device> {
    Now(Done<D>),
    Decode { header: ChunkHeader, block: Vec<u8>, staging: D::Staging },
    Write { header: ChunkHeader, payload: Payload<D> },
}

/// A chunk's bytes to write: compressed into a block (its staging already given back), or the
/// device copy's own.
enum Payload<D: Device> {
    Coded(Vec<u8>),
    Staged(D::PendingCopy),
}

/// One data connection's threads: this one runs the session thread's jobs in order (reads chunks,
/// waits for device copies, compresses), its second thread decodes what it read and writes what
/// it coded, answering each job once and in order. A thread that stopped reading to decode would
/// stop its connection (flow control), one that stopped writing to compress would leave it idle,
/// and connections moving in step would leave the link idle while they all work. After a failure
/// the rest are refused (the session thread then ends striping).
/// What a link's threads share with the session: its jobs in, its answers out, whether the
/// session is closing, its statistics and its timing.
struct LinkEnds<'a, D: Device> {
    id: u64,
    jobs: &'a Receiver<Job<D>>,
    done: &'a Sender<Answered<D>>,
    closing: &'a AtomicBool,
    stats: Option<&'a crate::stats::SlotStats>,
    timing: &'a LinkTiming,
}

fn serve_link<D: Device>(device: &D, mut reader: Connection, writer: Connection, ends: LinkEnds<'_, D>) {
    let LinkEnds { id, jobs, done, closing, stats, timing } = ends;
    let trace = tracing_copies();
    if let Err(error) = device.bind_thread() {
        tracing::warn!(%error, "a data connection's thread could not bind the device");
    }
    let (answers, finishing) = std::sync::mpsc::sync_channel::<Answer<D>>(BLOCKS_AHEAD);
    let (return_block, spare_blocks) = block_pool();
    let finisher = Finisher { device, writer, id, done, return_block: return_block.clone(), stats, timing: trace.then_some(timing) };
    std::thread::scope(|scope| {
        let started = std::thread::Builder::new().name("flyt-stripe-finish".into()).spawn_scoped(scope, move || finisher.run(&finishing));
        if let Err(error) = started {
            tracing::warn!(%error, "a data connection's second thread could not start");
            return;
        }
        let mut failed: Option<String> = None;
        let mut buffers = Buffers { scratch: Vec::new(), compressor: Compressor::default(), spare_blocks, return_block, ended: None };
        // A copy's first job comes while the link polls, not after a wake-up.
        let spin = flyt_ring::data_thread_spin();
        loop {
            let asked = trace.then(Instant::now);
            let Ok(job) = flyt_ring::recv_spinning(jobs, spin) else { break };
            if let Some(asked) = asked {
                count_since(&timing.idle, asked);
            }
            let started = trace.then(Instant::now);
            let answer = match failed.clone() {
                Some(reason) => Answer::Now(Done::Failed(CudaError::DEVICES_UNAVAILABLE, reason)),
                None => run_job(device, &mut reader, job, &mut buffers, closing),
            };
            if let Some(started) = started {
                count_since(&timing.working, started);
            }
            if let Answer::Now(Done::Failed(CudaError::DEVICES_UNAVAILABLE, reason)) = &answer {
                failed.get_or_insert_with(|| reason.clone());
            }
            if answers.send(answer).is_err() {
                return;
            }
        }
    });
}

/// A data connection's second thread: decodes each compressed chunk read into its staging,
/// writes each chunk to send, and passes every answer on, in order.
struct Finisher<'a, D: Device> {
    device: &'a D,
    writer: Connection,
    /// The link's id, on each answer.
    id: u64,
    done: &'a Sender<Answered<D>>,
    return_block: Sender<Vec<u8>>,
    stats: Option<&'a crate::stats::SlotStats>,
    /// Where its busy time goes while copies are traced.
    timing: Option<&'a LinkTiming>,
}

impl<D: Device> Finisher<'_, D> {
    fn run(mut self, answers: &Receiver<Answer<D>>) {
        if let Err(error) = self.device.bind_thread() {
            tracing::warn!(%error, "a data connection's second thread could not bind the device");
        }
        let mut decompressor = Decompressor::default();
        let mut failed: Option<String> = None;
        while let Ok(answer) = answers.recv() {
            let finished = match answer {
                Answer::Now(finished) => finished,
                Answer::Decode { block, .. } | Answer::Write { payload: Payload::Coded(block), .. } if failed.is_some() => {
                    let _ = self.return_block.send(block);
                    Done::Failed(CudaError::DEVICES_UNAVAILABLE, failed.clone().unwrap_or_default())
                }
                Answer::Write { .. } if failed.is_some() => {
                    Done::Failed(CudaError::DEVICES_UNAVAILABLE, failed.clone().unwrap_or_default())
                }
                Answer::Decode { header, block, staging } => {
                    let started = self.timing.map(|timing| (timing, Instant::now()));
                    let decoded = self.decode(&mut decompressor, header, block, staging);
                    started.inspect(|(timing, at)| count_since(&timing.finishing, *at));
                    decoded
                }
                Answer::Write { header, payload } => {
                    let started = self.timing.map(|timing| (timing, Instant::now()));
                    let written = self.write(header, payload);
                    started.inspect(|(timing, at)| count_since(&timing.finishing, *at));
                    written
                }
            };
            if let Done::Failed(CudaError::DEVICES_UNAVAILABLE, reason) = &finished {
                failed.get_or_insert_with(|| reason.clone());
            }
            if self.done.send(Answered { link: self.id, done: finished }).is_err() {
                return;
            }
        }
    }

    fn saved(&self, header: &ChunkHeader) {
        if let Some(stats) = self.stats {
            stats.compression_saved(header.len - header.wire_len);
        }
    }

    fn decode(&self, decompressor: &mut Decompressor, header: ChunkHeader, block: Vec<u8>, mut staging: D::Staging) -> Done<D> {
        let bytes = D::staging_bytes(&mut staging);
        let decoded = match usize::try_from(header.len).ok().and_then(|len| bytes.get_mut(..len)) {
            Some(target) => decompressor.decompress(&header, &block, target),
            None => Err("a chunk larger than its staging".into()),
        };
        let _ = self.return_block.send(block);
        match decoded {
            Ok(()) => {
                self.saved(&header);
                // Fits: it decoded into the first `len` bytes.
                D::shorten_staging(&mut staging, header.len as usize);
                Done::Received { offset: header.offset, len: header.len, staging }
            }
            Err(reason) => Done::Failed(CudaError::DEVICES_UNAVAILABLE, reason),
        }
    }

    fn write(&mut self, header: ChunkHeader, payload: Payload<D>) -> Done<D> {
        let bytes = match &payload {
            Payload::Coded(block) => Ok(&block[..]),
            // Done already (the job waited for it): this returns at once.
            Payload::Staged(copy) => self.device.dtoh_bytes(copy),
        };
        let written = match bytes {
            Ok(payload) => {
                let encoded = header.encode();
                let mut slices = [std::io::IoSlice::new(&encoded), std::io::IoSlice::new(payload)];
                write_all_vectored(&mut self.writer, &mut slices).map_err(|error| format!("writing a chunk: {error}"))
            }
            Err(error) => return Done::Failed(error, "device copy failed".into()),
        };
        if let Payload::Coded(block) = payload {
            let _ = self.return_block.send(block);
        }
        match written {
            Ok(()) => {
                self.saved(&header);
                Done::Handled
            }
            Err(reason) => Done::Failed(CudaError::DEVICES_UNAVAILABLE, reason),
        }
    }
}

/// Reads the next header of copy `transfer`: a chunk of it (raw or compressed), or `None` at the
/// end of this connection's share (then noted in `ended`).
fn next_chunk_header(reader: &mut Connection, transfer: u64, ended: &mut Option<u64>) -> Result<Option<ChunkHeader>, String> {
    let mut bytes = [0u8; CHUNK_HEADER_LEN];
    reader.read_exact(&mut bytes).map_err(|error| format!("reading a chunk header: {error}"))?;
    match ChunkHeader::decode(&bytes) {
        Some(header) if header.transfer == transfer && header.ends_share() => {
            *ended = Some(transfer);
            Ok(None)
        }
        Some(header) if header.transfer == transfer => Ok(Some(header)),
        Some(header) => Err(format!("chunk {header:?} where one of copy {transfer} was due")),
        None => Err("no chunk header where one was due".into()),
    }
}

/// A link thread's buffers: its scratch bytes, its compressor, and the blocks its second thread
/// is done with (compressed chunks are read or coded into them); and the last copy whose share
/// on this connection ended (its later jobs are answered at once).
struct Buffers {
    scratch: Vec<u8>,
    compressor: Compressor,
    spare_blocks: Receiver<Vec<u8>>,
    return_block: Sender<Vec<u8>>,
    ended: Option<u64>,
}

fn run_job<D: Device>(device: &D, reader: &mut Connection, job: Job<D>, buffers: &mut Buffers, closing: &AtomicBool) -> Answer<D> {
    let lost = |reason: String| Answer::Now(Done::Failed(CudaError::DEVICES_UNAVAILABLE, reason));
    match job {
        Job::Receive { transfer, .. } | Job::Discard { transfer } if buffers.ended == Some(transfer) => Answer::Now(Done::Ended),
        Job::Receive { transfer, staging } => {
            let header = match next_chunk_header(reader, transfer, &mut buffers.ended) {
                Ok(Some(header)) => header,
                Ok(None) => return Answer::Now(Done::Ended),
                Err(reason) => return lost(reason),
            };
            let Some(mut staging) = staging else { return lost(format!("a chunk past the end of copy {transfer}")) };
            if header.compressed() {
                // Read now, decoded by the connection's second thread (a block it is done with).
                let Ok(mut block) = buffers.spare_blocks.recv() else { return lost("the second thread ended".into()) };
                let Ok(wire_len) = usize::try_from(header.wire_len) else { return lost("a chunk too large".into()) };
                block.resize(wire_len, 0);
                if let Err(error) = reader.read_exact(&mut block) {
                    return lost(format!("reading a chunk: {error}"));
                }
                return Answer::Decode { header, block, staging };
            }
            let bytes = D::staging_bytes(&mut staging);
            let Some(target) = usize::try_from(header.len).ok().and_then(|len| bytes.get_mut(..len)) else {
                return lost("a chunk larger than its staging".into());
            };
            let len = target.len();
            match reader.read_exact(target) {
                Ok(()) => {
                    D::shorten_staging(&mut staging, len);
                    Answer::Now(Done::Received { offset: header.offset, len: header.len, staging })
                }
                Err(error) => lost(format!("reading a chunk: {error}")),
            }
        }
        Job::Discard { transfer } => {
            let header = match next_chunk_header(reader, transfer, &mut buffers.ended) {
                Ok(Some(header)) => header,
                Ok(None) => return Answer::Now(Done::Ended),
                Err(reason) => return lost(reason),
            };
            let mut left = header.wire_len;
            let scratch = &mut buffers.scratch;
            scratch.resize(1 << 20, 0);
            while left > 0 {
                let step = usize::try_from(left).unwrap_or(usize::MAX).min(scratch.len());
                if let Err(error) = reader.read_exact(&mut scratch[..step]) {
                    return lost(format!("reading a chunk: {error}"));
                }
                left -= step as u64;
            }
            Answer::Now(Done::Dropped { offset: header.offset, len: header.len })
        }
        Job::Send { transfer, offset, len, copy, compress } => {
            // The device copy waits for the stream's earlier work, however long it takes: polled
            // (yielding the core) for up to `POLL_COPY`, then with naps.
            let polled_until = std::time::Instant::now() + POLL_COPY;
            let mut nap = Duration::from_micros(50);
            while !device.dtoh_done(&copy) {
                if closing.load(Ordering::Acquire) {
                    return lost("the session ended".into());
                }
                if std::time::Instant::now() < polled_until {
                    std::thread::yield_now();
                    continue;
                }
                std::thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_millis(1));
            }
            let bytes = match device.dtoh_bytes(&copy) {
                Ok(bytes) => bytes,
                Err(error) => return Answer::Now(Done::Failed(error, "device copy failed".into())),
            };
            let mut header = ChunkHeader::raw(transfer, offset, len);
            if !compress {
                return Answer::Write { header, payload: Payload::Staged(copy) };
            }
            // Coded now, written by the connection's second thread while this codes the next;
            // the staging goes back at once (`send` may take it for a later chunk).
            let Ok(mut block) = buffers.spare_blocks.recv() else { return lost("the second thread ended".into()) };
            match buffers.compressor.compress_into(bytes, &mut block) {
                Some(flags) => {
                    (header.wire_len, header.flags) = (block.len() as u64, flags);
                    drop(copy);
                    Answer::Write { header, payload: Payload::Coded(block) }
                }
                None => {
                    let _ = buffers.return_block.send(block);
                    Answer::Write { header, payload: Payload::Staged(copy) }
                }
            }
        }
    }
}

fn write_all_vectored(writer: &mut Connection, mut slices: &mut [std::io::IoSlice<'_>]) -> std::io::Result<()> {
    while !slices.is_empty() {
        match writer.write_vectored(slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(written) => std::io::IoSlice::advance_slices(&mut slices, written),
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// Answers a data connection that cannot join with the reason.
pub fn refuse(mut socket: Connection, reason: &str) -> Result<(), String> {
    let _ = write_value(&mut socket, 0, &StripeReply::Refused { error: CudaError::NOT_PERMITTED.code(), reason: reason.into() });
    Err(reason.into())
}

/// Rebuilds a data connection's socket from the descriptor the listener passed.
pub fn connection_from_fd(fd: OwnedFd, tcp: bool, secured: bool) -> Connection {
    if secured { Connection::secured_from_fd(fd) } else { Connection::from_fd(fd, tcp) }
}
