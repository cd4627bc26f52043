//! The server's side of striped bulk copies (`flyt_protocol::stripes`): the session's data
//! connections, each served by a thread of its own that reads a host-to-device chunk straight into
//! a staging buffer the session thread handed it, or writes a device-to-host chunk as soon as its
//! device copy into staging is done. The session thread keeps the copy in its stream's order: it
//! queues each chunk's device copy as the chunk lands (host to device), or queues every chunk's
//! copy into staging in order and replies once all were written (device to host), with a few
//! chunks in flight at once so the network and the PCIe copies overlap.
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
    BLOCKS_AHEAD, CHUNK_HEADER_LEN, ChunkHeader, Compressor, Decompressor, SECRET_LEN, StripeJoin, StripeReply, block_pool, chunks,
    secrets_equal,
};

use crate::backend::Device;
use crate::transport::Connection;

/// How long a data connection may keep the session waiting for a chunk's next bytes, or for room
/// to write them, before the copy fails.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Most data connections a session may open.
pub const MAX_LINKS: usize = 16;
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
    /// Read the chunk at `offset` of `transfer` into `staging` (its first `len` bytes).
    Receive { transfer: u64, offset: u64, len: u64, staging: D::Staging },
    /// Read and drop the chunk (its copy was refused).
    Discard { transfer: u64, offset: u64, len: u64 },
    /// Write the chunk once its device copy is done; with `compress`, as LZ4 when that is smaller.
    Send { transfer: u64, offset: u64, len: u64, copy: D::PendingCopy, compress: bool },
}

enum Done<D: Device> {
    Received { offset: u64, len: u64, staging: D::Staging },
    Handled,
    Failed(CudaError, String),
}

struct Link<D: Device> {
    jobs: Sender<Job<D>>,
    done: Receiver<Done<D>>,
    socket: Connection,
    timing: Arc<LinkTiming>,
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
    links: Mutex<Vec<Option<Link<D>>>>,
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
        Self {
            secret,
            device,
            links: Mutex::new(Vec::new()),
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

    fn links(&self) -> std::sync::MutexGuard<'_, Vec<Option<Link<D>>>> {
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
        if links.get(index).is_some_and(Option::is_some) {
            // A resumable session's client joins again after a cut its server may not have
            // noticed on an idle link: the new connection replaces the old, whose thread ends.
            if !self.broken_copies_come_again() {
                return refuse(socket, &format!("data connection {index} has joined already"));
            }
            if let Some(old) = links[index].take() {
                old.socket.shutdown();
            }
        }
        let (reader, writer) =
            (socket.try_clone().map_err(|error| error.to_string())?, socket.try_clone().map_err(|error| error.to_string())?);
        let _ = reader.set_read_timeout(Some(IO_TIMEOUT));
        set_write_timeout(&writer, IO_TIMEOUT);
        let (jobs, job_queue) = channel();
        let (done_sender, done) = channel();
        let (device, closing, stats) = (self.device.clone(), self.closing.clone(), self.stats.clone());
        let timing = Arc::new(LinkTiming::default());
        let link_timing = timing.clone();
        std::thread::Builder::new()
            .name(format!("flyt-stripe-{index}"))
            .spawn(move || {
                let ends =
                    LinkEnds { jobs: &job_queue, done: &done_sender, closing: &closing, stats: stats.as_deref(), timing: &link_timing };
                serve_link(&*device, reader, writer, ends);
            })
            .map_err(|error| error.to_string())?;
        write_value(&mut answer, 0, &StripeReply::Joined).map_err(|error| error.to_string())?;
        if links.len() <= index {
            links.resize_with(index + 1, || None);
        }
        links[index] = Some(Link { jobs, done, socket, timing });
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

    /// Shuts every link's socket: their threads' reads and writes end at once.
    fn shut_down(links: &[Option<Link<D>>]) {
        for link in links.iter().flatten() {
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

    /// Chunks of a device-to-host copy in flight: two per connection. Each holds a staging slot
    /// until it is coded or written, and a link gives it back by itself, so taking one for the
    /// next chunk waits for the links, never for this thread.
    fn send_window(count: usize) -> usize {
        (count * 2).max(1)
    }

    /// Receives a host-to-device copy of `len` bytes for `dst` (checked by the session, or
    /// `refused` with that error: its chunks are then read and dropped, keeping the streams in
    /// step) and queues each chunk's device copy on `stream` as it lands.
    pub fn receive(&self, copy: StripedCopy, stream: D::Stream, copy_chunk: u64, refused: Option<CudaError>) -> CudaResult<()> {
        let StripedCopy { device: dst, len, chunk, transfer } = copy;
        let mut links = self.links();
        let count = match self.check_chunking(&mut links, len, chunk, copy_chunk) {
            Ok(count) => count,
            Err(error) => return Err(refused.unwrap_or(error)),
        };
        // After a failure the chunks are still read (and dropped), keeping the streams in step.
        let job = |offset: u64, piece: u64, outcome: &mut CudaResult<()>| {
            Some(match (outcome.is_ok(), usize::try_from(piece)) {
                (true, Ok(piece_len)) => match self.device.staging(piece_len) {
                    Ok(staging) => Job::Receive { transfer, offset, len: piece, staging },
                    Err(error) => {
                        *outcome = Err(error);
                        Job::Discard { transfer, offset, len: piece }
                    }
                },
                _ => Job::Discard { transfer, offset, len: piece },
            })
        };
        let landed = |done: Done<D>, outcome: &mut CudaResult<()>| {
            if let Done::Received { offset, len, mut staging } = done {
                debug_assert!(D::staging_bytes(&mut staging).len() as u64 == len);
                if outcome.is_ok() {
                    *outcome = self.device.copy_htod(dst + offset, staging, stream);
                }
            }
        };
        let dealing = Dealing { len, chunk, count, window: self.window(count), way: "host to device" };
        Self::deal(links, dealing, refused.map_or(Ok(()), Err), job, landed)
    }

    /// Sends a device-to-host copy of `len` bytes from `src` (checked by the session) on
    /// `stream`: each chunk's device copy into staging is queued in order, and a link writes it
    /// once it is done. Returns once every chunk was written (or the copy failed: the client
    /// stops waiting for the rest when the reply says so).
    pub fn send(&self, copy: StripedCopy, stream: D::Stream, copy_chunk: u64, compress: bool) -> CudaResult<()> {
        let StripedCopy { device: src, len, chunk, transfer } = copy;
        let mut links = self.links();
        let count = self.check_chunking(&mut links, len, chunk, copy_chunk)?;
        let job = |offset: u64, piece: u64, outcome: &mut CudaResult<()>| {
            if outcome.is_err() {
                return None;
            }
            let started = usize::try_from(piece)
                .map_err(|_| CudaError::INVALID_VALUE)
                .and_then(|piece_len| self.device.staging(piece_len))
                .and_then(|staging| self.device.start_dtoh(src + offset, staging, stream));
            match started {
                Ok(copy) => Some(Job::Send { transfer, offset, len: piece, copy, compress }),
                Err(error) => {
                    *outcome = Err(error);
                    None
                }
            }
        };
        let dealing = Dealing { len, chunk, count, window: Self::send_window(count), way: "device to host" };
        Self::deal(links, dealing, Ok(()), job, |_, _| {})
    }

    /// Deals a copy's chunks round-robin over the links, at most `window` in flight: `job` makes
    /// each chunk's job (`None`: no more), `landed` takes each answer that is not a failure. A
    /// link that fails (`DEVICES_UNAVAILABLE`) or ends closes them all: striping ends.
    fn deal(
        mut links: std::sync::MutexGuard<'_, Vec<Option<Link<D>>>>,
        Dealing { len, chunk, count, window, way }: Dealing,
        mut outcome: CudaResult<()>,
        mut job: impl FnMut(u64, u64, &mut CudaResult<()>) -> Option<Job<D>>,
        mut landed: impl FnMut(Done<D>, &mut CudaResult<()>),
    ) -> CudaResult<()> {
        let mut in_flight = std::collections::VecDeque::new();
        let mut broken = None;
        let trace = tracing_copies().then(|| (Instant::now(), DealTiming::default()));
        let timing = trace.as_ref().map(|(_, timing)| timing);
        let mut finish = |index: usize, links: &[Option<Link<D>>], outcome: &mut CudaResult<()>, broken: &mut Option<String>| {
            let Some(link) = &links[index] else { return };
            let asked = timing.map(|_| Instant::now());
            let answer = link.done.recv();
            if let Some((timing, asked)) = timing.zip(asked) {
                count_since(&timing.waiting, asked);
            }
            match answer {
                Ok(Done::Failed(error, reason)) => {
                    *outcome = outcome.and(Err(error));
                    if error == CudaError::DEVICES_UNAVAILABLE {
                        broken.get_or_insert(reason);
                        // The other links' threads may wait for chunks that will not come.
                        Self::shut_down(links);
                    }
                }
                Ok(done) => {
                    let started = timing.map(|_| Instant::now());
                    landed(done, outcome);
                    if let Some((timing, started)) = timing.zip(started) {
                        count_since(&timing.landing, started);
                    }
                }
                Err(_) => {
                    *outcome = outcome.and(Err(CudaError::DEVICES_UNAVAILABLE));
                    broken.get_or_insert_with(|| "a data connection's thread ended".into());
                    Self::shut_down(links);
                }
            }
        };
        for (number, (offset, piece)) in chunks(len, chunk, count).into_iter().enumerate() {
            let index = number % count;
            if in_flight.len() >= window {
                let oldest = in_flight.pop_front().unwrap_or(index);
                finish(oldest, &links, &mut outcome, &mut broken);
            }
            if broken.is_some() {
                break;
            }
            let started = timing.map(|_| Instant::now());
            let made = job(offset, piece, &mut outcome);
            if let Some((timing, started)) = timing.zip(started) {
                count_since(&timing.making, started);
            }
            let Some(job) = made else { break };
            let Some(link) = &links[index] else { break };
            if link.jobs.send(job).is_err() {
                outcome = outcome.and(Err(CudaError::DEVICES_UNAVAILABLE));
                broken = Some("a data connection's thread ended".into());
                break;
            }
            in_flight.push_back(index);
        }
        for index in in_flight {
            finish(index, &links, &mut outcome, &mut broken);
        }
        if let Some((started, timing)) = &trace {
            timing.log(way, len, count, *started, &links);
        }
        if let Some(reason) = broken {
            Self::break_all(&mut links, &reason);
        }
        outcome
    }
}

/// How a copy is dealt: its length, chunk, the links it uses and the chunks in flight at most.
struct Dealing {
    len: u64,
    chunk: u64,
    count: usize,
    window: usize,
    way: &'static str,
}

/// The dealing thread's time in one traced copy, in nanoseconds.
#[derive(Default)]
struct DealTiming {
    /// Waiting for the links' answers, in order.
    waiting: AtomicU64,
    /// Queueing the device copies of chunks that landed.
    landing: AtomicU64,
    /// Making jobs: taking staging (which waits for its last device copy), queueing device copies.
    making: AtomicU64,
}

impl DealTiming {
    fn log<D: Device>(&self, way: &str, len: u64, count: usize, started: Instant, links: &[Option<Link<D>>]) {
        let micros = |counter: &AtomicU64| counter.swap(0, Ordering::Relaxed) / 1000;
        let per_link = |pick: fn(&LinkTiming) -> &AtomicU64| {
            links.iter().flatten().map(|link| micros(pick(&link.timing)).to_string()).collect::<Vec<_>>().join(",")
        };
        tracing::info!(
            way,
            len,
            connections = count,
            total_us = started.elapsed().as_micros() as u64,
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
        for link in self.links().drain(..).flatten() {
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
    jobs: &'a Receiver<Job<D>>,
    done: &'a Sender<Done<D>>,
    closing: &'a AtomicBool,
    stats: Option<&'a crate::stats::SlotStats>,
    timing: &'a LinkTiming,
}

fn serve_link<D: Device>(device: &D, mut reader: Connection, writer: Connection, ends: LinkEnds<'_, D>) {
    let LinkEnds { jobs, done, closing, stats, timing } = ends;
    let trace = tracing_copies();
    if let Err(error) = device.bind_thread() {
        tracing::warn!(%error, "a data connection's thread could not bind the device");
    }
    let (answers, finishing) = std::sync::mpsc::sync_channel::<Answer<D>>(BLOCKS_AHEAD);
    let (return_block, spare_blocks) = block_pool();
    let finisher = Finisher { device, writer, done, return_block: return_block.clone(), stats, timing: trace.then_some(timing) };
    std::thread::scope(|scope| {
        let started = std::thread::Builder::new().name("flyt-stripe-finish".into()).spawn_scoped(scope, move || finisher.run(&finishing));
        if let Err(error) = started {
            tracing::warn!(%error, "a data connection's second thread could not start");
            return;
        }
        let mut failed: Option<String> = None;
        let mut buffers = Buffers { scratch: Vec::new(), compressor: Compressor::default(), spare_blocks, return_block };
        loop {
            let asked = trace.then(Instant::now);
            let Ok(job) = jobs.recv() else { break };
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
    done: &'a Sender<Done<D>>,
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
            if self.done.send(finished).is_err() {
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

/// Reads the header of the chunk expected next and checks it is that chunk (raw or compressed).
fn expect_header(reader: &mut Connection, transfer: u64, offset: u64, len: u64) -> Result<ChunkHeader, String> {
    let mut bytes = [0u8; CHUNK_HEADER_LEN];
    reader.read_exact(&mut bytes).map_err(|error| format!("reading a chunk header: {error}"))?;
    match ChunkHeader::decode(&bytes) {
        Some(header) if (header.transfer, header.offset, header.len) == (transfer, offset, len) => Ok(header),
        Some(header) => Err(format!("chunk {header:?} where chunk {offset} of copy {transfer} ({len} bytes) was due")),
        None => Err("no chunk header where one was due".into()),
    }
}

/// A link thread's buffers: its scratch bytes, its compressor, and the blocks its second thread
/// is done with (compressed chunks are read or coded into them).
struct Buffers {
    scratch: Vec<u8>,
    compressor: Compressor,
    spare_blocks: Receiver<Vec<u8>>,
    return_block: Sender<Vec<u8>>,
}

fn run_job<D: Device>(device: &D, reader: &mut Connection, job: Job<D>, buffers: &mut Buffers, closing: &AtomicBool) -> Answer<D> {
    let lost = |reason: String| Answer::Now(Done::Failed(CudaError::DEVICES_UNAVAILABLE, reason));
    match job {
        Job::Receive { transfer, offset, len, mut staging } => {
            let header = match expect_header(reader, transfer, offset, len) {
                Ok(header) => header,
                Err(reason) => return lost(reason),
            };
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
            let Some(target) = usize::try_from(len).ok().and_then(|len| bytes.get_mut(..len)) else {
                return lost("a chunk larger than its staging".into());
            };
            match reader.read_exact(target) {
                Ok(()) => Answer::Now(Done::Received { offset, len, staging }),
                Err(error) => lost(format!("reading a chunk: {error}")),
            }
        }
        Job::Discard { transfer, offset, len } => {
            let header = match expect_header(reader, transfer, offset, len) {
                Ok(header) => header,
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
            Answer::Now(Done::Handled)
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
