//! Striped bulk copies (`flyt_protocol::stripes`): over a socket, a copy of `FLYT_STRIPE_MIN`
//! bytes or more (1 MiB) sends its request on the session's connection and its bytes in chunks
//! over extra data connections to the same server, each chunk on whichever connection is free
//! first, so one TCP stream (one core's worth of kernel copying on each side) no longer caps the
//! copy, nor does the slowest of the connections.
//!
//! - The data connections open at the first such copy (`FLYT_STRIPES` of them: default 4, over TCP
//!   and over a Unix socket alike; 0 turns striping off; never over the shared-memory channel), each
//!   connected and authenticated as the session's own connection (TLS, token) and presenting the
//!   session's secret from the handshake.
//! - Host to device: one sender thread per data connection takes the copy's next chunk when it
//!   is free and writes it straight from the app's buffer (compressed ones from the block its
//!   coding thread made while it wrote the one before, taken as the coder is free: a compressed
//!   copy goes to both, an uncompressed one to the sender alone, one hand-over fewer before its
//!   first byte moves), then the end of its share; the call returns at the server's reply, sent
//!   once every chunk landed: bytes written into a socket may still be lost with it, and the app
//!   may reuse its buffer as soon as the call returns. The request and the copy's handing to
//!   every connection happen under one lock, so every data connection carries copies in the
//!   order the server meets the requests.
//! - Device to host: one reader thread per data connection reads chunks straight into the app's
//!   buffer by the copy they name (a compressed chunk is decoded there by the connection's
//!   decoding thread while the reader reads on); the call returns once the reply and every byte
//!   are in.
//! - A data connection that fails fails the copy under way (bounded by `IO_TIMEOUT` of no
//!   progress) and ends striping for the session: later copies go over the main connection. In a
//!   session whose main connection resumes (`crate::reconnect`), the copy is sent again whole over
//!   the main connection instead, and the data connections join again at the next large copy.
//! - Compression (`FLYT_STRIPE_LZ4`: `auto`, the default, `on` or `off`): with `auto`, a TCP
//!   session whose raw copies run slower than the codecs could keep up with
//!   ([`COMPRESSION_CEILING_PER_CONNECTION`]) tries both and keeps the faster: each way's goodput
//!   (the app's bytes per second of whole copies of several chunks, round trips included, as the
//!   app sees them) is smoothed, and one copy in [`PROBE_EVERY`] goes the other way to measure it
//!   again (a link's rate, the data's compressibility and the CPUs change). Over a Unix socket
//!   (the same host) and a fast link nothing is compressed: there a compressed probe only cost
//!   (7-14 ms of a 16 MiB copy on an H200 host, 2026-11-29). Each chunk LZ4 does not shrink by a
//!   sixteenth goes raw. The server counts the bytes saved (`stripe_compression_saved_bytes`).

use std::collections::HashMap;
use std::io::{IoSlice, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, SyncSender, channel, sync_channel};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::frame::{FrameLimits, read_value, write_value};
use flyt_protocol::handshake::SessionInfo;
use flyt_protocol::ops::{decode_reply, rep, req};
use flyt_protocol::stripes::{
    BLOCKS_AHEAD, CHUNK_HEADER_LEN, ChunkHeader, Compressor, Decompressor, SECRET_LEN, StripeJoin, StripeReply, block_pool, chunks,
};

use crate::client::Client;
use crate::conn::Wire;

/// How long a copy waits for a data connection that makes no progress mid-chunk.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a chunk's write may make no progress. The server reads a copy's chunks only when its
/// session thread reaches the copy's request, which may wait behind a long device wait (a
/// striped device-to-host copy after a long kernel), so this is long; a connection that breaks
/// fails at once, and a dead one (another link failed) within a second.
const WRITE_STALL: Duration = Duration::from_secs(600);
/// Copies below this go over the main connection (`FLYT_STRIPE_MIN`), over TCP. A copy of one
/// chunk crosses one data connection, a hop more than the main one: over a Unix socket 1 MiB
/// copies ran 1.5-1.7x slower striped than inline (H200 host, 2026-11-29), so there only copies
/// of several chunks are striped ([`DEFAULT_MIN_UNIX`]).
const DEFAULT_MIN: u64 = 1 << 20;
/// The same over a Unix socket.
const DEFAULT_MIN_UNIX: u64 = 4 << 20;
/// Chunk size (`FLYT_STRIPE_CHUNK`, at most the server's copy chunk).
const DEFAULT_CHUNK: u64 = 4 << 20;
/// With compression chosen automatically, one copy in this many goes the way not chosen.
const PROBE_EVERY: u64 = 8;
/// Raw goodput per data connection from which compression cannot win: each side codes or
/// decodes a connection's chunks on about one core, at 0.3-1 GB/s (float planes, 2026-11-29).
const COMPRESSION_CEILING_PER_CONNECTION: u64 = 1_000_000_000;
/// Copies of fewer chunks than this are not timed for the choice (a round trip dwarfs them).
const TIMED_CHUNKS: u64 = 4;

/// When chunks go compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lz4 {
    /// The faster of the two as measured.
    Auto,
    On,
    Off,
}

impl Lz4 {
    /// As asked (`FLYT_STRIPE_LZ4`); `auto` over a Unix socket is off (the peer is on this host).
    fn for_socket(tcp: bool) -> Self {
        match Self::from_env() {
            Self::Auto if !tcp => Self::Off,
            asked => asked,
        }
    }

    fn from_env() -> Self {
        match std::env::var("FLYT_STRIPE_LZ4").as_deref().map(str::trim) {
            Ok("on" | "1") => Self::On,
            Ok("off" | "0") => Self::Off,
            _ => Self::Auto,
        }
    }
}

fn env_bytes(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    let value = value.trim();
    let (digits, shift) = match value.as_bytes().last()? {
        b'K' | b'k' => (&value[..value.len() - 1], 10),
        b'M' | b'm' => (&value[..value.len() - 1], 20),
        b'G' | b'g' => (&value[..value.len() - 1], 30),
        _ => (value, 0),
    };
    digits.parse::<u64>().ok().map(|number| number << shift)
}

/// How a session stripes, decided at its handshake.
pub struct Stripes {
    /// `None`: the session stripes nothing.
    plan: Option<Plan>,
    set: Mutex<Opened>,
    reopened: AtomicU32,
    /// Which session the data connections join, and where (a move changes both).
    joining: Mutex<Joining>,
    /// Bumped by each move: a set opened before it belongs to the last server.
    generation: AtomicU64,
}

/// A data connection's claim: the session's id and secret, at its server (`None`: the first).
#[derive(Clone)]
struct Joining {
    session_id: u64,
    secret: [u8; SECRET_LEN],
    address: Option<String>,
}

/// The data connections, as far as they were opened.
enum Opened {
    NotYet,
    Open(Arc<Set>),
    /// They could not be opened: copies go over the main connection.
    GaveUp,
}

/// How many times a resumable session opens its data connections again after they broke.
const REOPENINGS: u32 = 1000;

struct Plan {
    count: Count,
    min: u64,
    chunk: u64,
    lz4: Lz4,
}

/// How many data connections a session opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Count {
    /// As asked (`FLYT_STRIPES`).
    Fixed(usize),
    /// From the speed of the link the first one leaves by, at most this many (`FLYT_STRIPES_MAX`).
    FromLink(usize),
}

/// Data connections where the link's speed is unknown (loopback, a virtual interface, a Unix
/// socket): over loopback and a Unix socket 4 moved 13.0-17.2 GB/s, 2 moved 7.4-9.6 (64 MiB and
/// 1 GiB copies, H200 host, 2026-11-29, `benchmarks/remote_copy.sh`).
const DEFAULT_COUNT: usize = 4;
/// The most a known link's speed opens (`FLYT_STRIPES_MAX`): 8 connections carried 21-32 GB/s
/// over loopback (H200 host, 2026-11-29), a 200 Gb/s NIC's 25 GB/s.
const DEFAULT_COUNT_CAP: usize = 8;
/// What one data connection carries (a core at each end copying through the kernel): 3.6-4.5 GB/s
/// over TCP loopback on an H200 host (2026-11-29); a link faster than this gets more of them.
const PER_CONNECTION: u64 = 3_000_000_000;

impl Count {
    /// From `FLYT_STRIPES` (a count) and `FLYT_STRIPES_MAX` (a cap on the link's choice).
    fn from_env() -> Self {
        let number = |name: &str| std::env::var(name).ok().and_then(|value| value.trim().parse::<usize>().ok());
        match number("FLYT_STRIPES") {
            Some(count) => Self::Fixed(count.min(flyt_protocol::stripes::MAX_LINKS)),
            None => Self::FromLink(number("FLYT_STRIPES_MAX").unwrap_or(DEFAULT_COUNT_CAP).clamp(1, flyt_protocol::stripes::MAX_LINKS)),
        }
    }

    /// The count for a link of `speed` bytes per second (`None`: unknown).
    fn for_link(self, speed: Option<u64>) -> usize {
        match self {
            Self::Fixed(count) => count,
            Self::FromLink(cap) => match speed {
                Some(speed) => usize::try_from(speed.div_ceil(PER_CONNECTION)).unwrap_or(cap).clamp(1, cap),
                None => DEFAULT_COUNT.min(cap),
            },
        }
    }
}

/// The speed in bytes per second of the network interface holding `socket`'s local address, as
/// the kernel reports it (`/sys/class/net/NAME/speed`, Mb/s); `None` where it knows none (a Unix
/// socket, loopback, a virtual interface: a veth pair, as a Kubernetes pod has, says 10 Gb/s
/// whatever carries it).
fn interface_speed(socket: std::os::fd::BorrowedFd<'_>) -> Option<u64> {
    let name = interface_of(socket)?;
    let device = std::fs::canonicalize(format!("/sys/class/net/{name}")).ok()?;
    if device.starts_with("/sys/devices/virtual") {
        return None;
    }
    let megabits: i64 = std::fs::read_to_string(format!("/sys/class/net/{name}/speed")).ok()?.trim().parse().ok()?;
    u64::try_from(megabits).ok().filter(|&megabits| megabits > 0).map(|megabits| megabits * 125_000)
}

fn ip_of(address: &nix::sys::socket::SockaddrStorage) -> Option<std::net::IpAddr> {
    address
        .as_sockaddr_in()
        .map(|v4| std::net::IpAddr::V4(v4.ip()))
        .or_else(|| address.as_sockaddr_in6().map(|v6| std::net::IpAddr::V6(v6.ip())))
}

/// The name of the interface holding `socket`'s local address (not loopback's).
fn interface_of(socket: std::os::fd::BorrowedFd<'_>) -> Option<String> {
    let local: nix::sys::socket::SockaddrStorage = nix::sys::socket::getsockname(std::os::fd::AsRawFd::as_raw_fd(&socket)).ok()?;
    let ip = ip_of(&local).filter(|ip| !ip.is_loopback())?;
    let interface = nix::ifaddrs::getifaddrs().ok()?.find(|entry| entry.address.as_ref().and_then(ip_of) == Some(ip))?;
    Some(interface.interface_name)
}

impl Plan {
    /// A copy's chunk: compressed ones go in halves, so the link waits less for the first chunk's
    /// coding and the last one's decoding (over a 1 GB/s link, 2 MiB chunks ran 1-2% faster than
    /// 4 MiB ones on an H200 host, 2026-11-29); raw ones in whole chunks, fewer per copy.
    fn chunk_for(&self, compressed: bool) -> u64 {
        if compressed { (self.chunk / 2).max(64 << 10) } else { self.chunk }
    }
}

impl Stripes {
    /// Whether `set` is still the session's server's (no move since it opened).
    fn current(&self, set: &Set) -> bool {
        self.generation.load(Ordering::Acquire) == set.generation
    }

    /// From the handshake: the server's secret, the transport (`tcp`) and whether bulk bytes
    /// have another way (the shared-memory channel) or data connections cannot be had (a VM's
    /// serial port): then nothing is striped.
    pub fn new(info: &SessionInfo, tcp: bool, not_here: bool) -> Self {
        let count = Count::from_env();
        let plan = info.stripe_secret.filter(|_| count != Count::Fixed(0) && !not_here).map(|_| Plan {
            count,
            min: env_bytes("FLYT_STRIPE_MIN").unwrap_or(if tcp { DEFAULT_MIN } else { DEFAULT_MIN_UNIX }).max(64 << 10),
            chunk: env_bytes("FLYT_STRIPE_CHUNK").unwrap_or(DEFAULT_CHUNK).clamp(64 << 10, info.copy_chunk.max(64 << 10)),
            lz4: Lz4::for_socket(tcp),
        });
        let joining = Joining { session_id: info.session_id, secret: info.stripe_secret.unwrap_or_default(), address: None };
        Self {
            plan,
            set: Mutex::new(Opened::NotYet),
            reopened: AtomicU32::new(0),
            joining: Mutex::new(joining),
            generation: AtomicU64::new(0),
        }
    }

    /// The session moved to `address` (its handshake there: `info`): later copies open data
    /// connections to that server's session; one that takes none stripes nothing more.
    pub fn moved(&self, info: &SessionInfo, address: &str) {
        let mut opened = lock(&self.set);
        self.generation.fetch_add(1, Ordering::AcqRel);
        match info.stripe_secret {
            Some(secret) => {
                *lock(&self.joining) = Joining { session_id: info.session_id, secret, address: Some(address.to_string()) };
                *opened = Opened::NotYet;
                self.reopened.store(0, Ordering::Relaxed);
            }
            None => *opened = Opened::GaveUp,
        }
    }

    /// The data connections for a copy of `len` bytes, opened at the first; `None`: the copy
    /// goes over the main connection.
    fn for_copy(&self, client: &Client, len: u64) -> Option<(&Plan, Arc<Set>)> {
        let plan = self.plan.as_ref().filter(|plan| len >= plan.min)?;
        let resumes = client.conn().resumes();
        let mut opened = lock(&self.set);
        match &*opened {
            Opened::Open(set) if !set.dead.load(Ordering::Acquire) => return Some((plan, set.clone())),
            // A resumable session's connections broke under a cut: they join again (the server
            // replaces its side), up to a bound.
            Opened::Open(_) if resumes && self.reopened.fetch_add(1, Ordering::Relaxed) < REOPENINGS => {}
            // Said here, not where the set failed: a set a move left behind fails as its server
            // lets the session go, and is never looked at again.
            Opened::Open(set) => {
                if !set.quiet {
                    let reason = lock(&set.failure).clone().unwrap_or_default();
                    crate::diagnostics::once(
                        "stripes-lost",
                        &format!("flyt: a data connection failed ({reason}): bulk copies use one connection"),
                    );
                }
                *opened = Opened::GaveUp;
                return None;
            }
            Opened::GaveUp => return None,
            Opened::NotYet => {}
        }
        let joining = lock(&self.joining).clone();
        let generation = self.generation.load(Ordering::Acquire);
        *opened = match Set::open(plan, &joining, generation, resumes) {
            Ok(set) => Opened::Open(set),
            Err(reason) => {
                crate::diagnostics::once("stripes", &format!("flyt: bulk copies use one connection: {reason}"));
                Opened::GaveUp
            }
        };
        match &*opened {
            Opened::Open(set) => Some((plan, set.clone())),
            _ => None,
        }
    }
}

/// Automatic compression: whether a copy goes compressed, given each way's goodput (0: not
/// timed yet), the raw goodput from which compression cannot win, and whether this copy probes
/// the way not chosen. Raw is timed first; then, on a link slower than `ceiling`, compressed
/// next, then the faster, but a probe goes the other way.
fn choose_compressed(raw: u64, compressed: u64, ceiling: u64, probe: bool) -> bool {
    match (raw, compressed) {
        (0, _) => false,
        (raw, _) if raw >= ceiling => false,
        (_, 0) => true,
        _ => (compressed > raw) != probe,
    }
}

/// A host-to-device copy for the data connections: its chunks, each taken by the first connection
/// free, from the app's buffer, which the calling thread keeps valid until every chunk of the
/// copy and every connection's end of share is answered.
struct Outgoing {
    transfer: u64,
    src: *const u8,
    pieces: Vec<(u64, u64)>,
    /// The next piece to take.
    next: AtomicUsize,
    /// Sent as LZ4 when that shrinks it.
    compress: bool,
    done: Progress,
    trace: Option<Arc<CopyTrace>>,
}

// SAFETY: `src` is the app's source buffer, readable for the copy's length until its calling
// thread has seen every chunk answered (it waits for all of them, see `htod`).
unsafe impl Send for Outgoing {}
// SAFETY: threads only read `src`'s bytes; the rest is shared through an atomic and a lock.
unsafe impl Sync for Outgoing {}

impl Outgoing {
    /// The next chunk no connection has taken yet: its header (raw) and bytes.
    fn take(&self) -> Option<(ChunkHeader, *const u8)> {
        let &(offset, len) = self.pieces.get(self.next.fetch_add(1, Ordering::Relaxed))?;
        // SAFETY: inside the app's source buffer (the plan covers the copy's length once).
        Some((ChunkHeader::raw(self.transfer, offset, len), unsafe { self.src.add(offset as usize) }))
    }

    /// Answers every chunk no connection will take now (`reason`: why).
    fn refuse_rest(&self, reason: &str) {
        while self.take().is_some() {
            self.done.answer(Err(reason.to_string()));
        }
    }
}

/// Where a device-to-host copy's chunks land.
struct Landing {
    ptr: *mut u8,
    len: u64,
    landed: u64,
    /// Chunks being written into the buffer right now: the copy waits for them before it
    /// returns, even when it fails.
    writing: usize,
    failed: bool,
    trace: Option<Arc<CopyTrace>>,
}

// SAFETY: the pointer is the app's destination buffer, writable for `len` bytes while the
// landing is registered; the copy's calling thread removes it only once no chunk is being written.
unsafe impl Send for Landing {}

/// `FLYT_STRIPE_TRACE=1`: each striped copy prints a line on stderr saying when each data
/// connection moved its first and last bytes, the app's side of the server's
/// `FLYT_RPC_STRIPE_TRACE` (how long a copy takes to get going on every connection, and to end).
fn tracing_copies() -> bool {
    static TRACE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TRACE.get_or_init(|| std::env::var("FLYT_STRIPE_TRACE").is_ok_and(|value| value == "1"))
}

/// A traced copy's chunks on each data connection, in microseconds since the copy began.
struct CopyTrace {
    started: Instant,
    /// When the first chunk began moving, plus one (0: none yet).
    first: Vec<AtomicU64>,
    /// When the last chunk was done.
    last: Vec<AtomicU64>,
    /// Time spent moving chunks (writing them, or reading them once their header came).
    busy: Vec<AtomicU64>,
}

impl CopyTrace {
    /// A trace when copies are traced.
    fn new(started: Instant, links: usize) -> Option<Arc<Self>> {
        let counters = || (0..links).map(|_| AtomicU64::new(0)).collect();
        tracing_copies().then(|| Arc::new(Self { started, first: counters(), last: counters(), busy: counters() }))
    }

    fn since(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.started).as_micros()).unwrap_or(u64::MAX)
    }

    /// A chunk on connection `link` that began moving at `began` and is done now.
    fn chunk(&self, link: usize, began: Instant) {
        let (from, to) = (self.since(began), self.since(Instant::now()));
        let (Some(first), Some(last), Some(busy)) = (self.first.get(link), self.last.get(link), self.busy.get(link)) else { return };
        let _ = first.compare_exchange(0, from + 1, Ordering::Relaxed, Ordering::Relaxed);
        last.fetch_max(to, Ordering::Relaxed);
        busy.fetch_add(to - from, Ordering::Relaxed);
    }

    /// The line: the copy's way and length, each connection's first and last chunk and busy
    /// time, and `marks`, the calling thread's steps.
    fn report(&self, way: &str, len: u64, marks: &[(&str, Instant)]) {
        let per_link = |counters: &[AtomicU64], less: u64| {
            counters.iter().map(|counter| counter.load(Ordering::Relaxed).saturating_sub(less).to_string()).collect::<Vec<_>>().join(",")
        };
        let steps: String = marks.iter().map(|(name, at)| format!(" {name}_us={}", self.since(*at))).collect();
        eprintln!(
            "flyt: striped copy traced way={way} len={len} connections={} first_chunk_us={} last_chunk_done_us={} busy_us={}{steps}",
            self.first.len(),
            per_link(&self.first, 1),
            per_link(&self.last, 0),
            per_link(&self.busy, 0),
        );
    }
}

/// Chunks answered of one copy, for its calling thread to wait on: how many, and the first
/// failure.
#[derive(Default)]
struct Progress {
    state: Mutex<(usize, Option<String>)>,
    changed: Condvar,
}

impl Progress {
    fn answer(&self, outcome: Result<(), String>) {
        let mut state = lock(&self.state);
        state.0 += 1;
        if let Err(failure) = outcome {
            state.1.get_or_insert(failure);
        }
        self.changed.notify_all();
    }
}

/// A data connection's two queues of host-to-device copies, fed in the same order: every copy
/// for its sender, and the compressed ones also for its coder, which codes their chunks ahead.
struct Outlet {
    sender: Sender<Arc<Outgoing>>,
    coder: Sender<Arc<Outgoing>>,
}

struct Set {
    /// The `Stripes::generation` it was opened in (its server's).
    generation: u64,
    outlets: Vec<Outlet>,
    sockets: Vec<Wire>,
    /// Held from a host-to-device request to its last chunk's queueing.
    order: Mutex<()>,
    next_transfer: AtomicU64,
    landings: Mutex<HashMap<u64, Landing>>,
    landed: Condvar,
    dead: AtomicBool,
    /// Why it died (the first reason).
    failure: Mutex<Option<String>>,
    /// Smoothed goodput, bytes per second, of raw and of compressed copies (0: none timed yet).
    goodput: [AtomicU64; 2],
    /// Striped copies begun (for the probes of the way not chosen).
    copies: AtomicU64,
    /// A resumable session's: a broken connection is not news to the app (the copy goes again
    /// and the connections join again).
    quiet: bool,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Opens one data connection and has it admitted.
fn join(joining: &Joining, index: usize) -> Result<Wire, String> {
    let (mut wire, mut hello) = crate::client::connect_again(joining.address.as_deref())?;
    hello.stripe = Some(StripeJoin { session_id: joining.session_id, secret: joining.secret, index: index as u32 });
    wire.set_read_timeout(Some(IO_TIMEOUT)).map_err(|error| error.to_string())?;
    write_value(&mut wire, 0, &hello).map_err(|error| format!("data connection {index}: {error}"))?;
    match read_value::<StripeReply>(&mut wire, &FrameLimits { max_message: 64 << 10, max_bulk: 0 }) {
        Ok((_, StripeReply::Joined)) => Ok(wire),
        Ok((_, StripeReply::Refused { reason, .. })) => Err(format!("data connection {index} refused: {reason}")),
        Err(error) => Err(format!("data connection {index}: {error}")),
    }
}

impl Set {
    fn open(plan: &Plan, joining: &Joining, generation: u64, quiet: bool) -> Result<Arc<Self>, String> {
        // The first connection's link decides how many more.
        let first = join(joining, 0)?;
        let count = plan.count.for_link(interface_speed(std::os::fd::AsFd::as_fd(&first))).max(1);
        let wires = std::iter::once(Ok(first)).chain((1..count).map(|index| join(joining, index))).collect::<Result<Vec<_>, _>>()?;
        let mut outlets = Vec::new();
        let mut receivers = Vec::new();
        let mut sockets = Vec::new();
        for wire in wires {
            let (sender, queue) = channel();
            let (coder, coding_queue) = channel();
            outlets.push(Outlet { sender, coder });
            let reader = wire.try_clone().map_err(|error| error.to_string())?;
            let writer = wire.try_clone().map_err(|error| error.to_string())?;
            // Short: a stalled write looks at the set's health each time (see `write_all`).
            set_write_timeout(&writer, Duration::from_secs(1));
            receivers.push((queue, coding_queue, reader, writer));
            sockets.push(wire);
        }
        let set = Arc::new(Self {
            generation,
            outlets,
            sockets,
            order: Mutex::new(()),
            next_transfer: AtomicU64::new(1),
            landings: Mutex::new(HashMap::new()),
            landed: Condvar::new(),
            dead: AtomicBool::new(false),
            failure: Mutex::new(None),
            goodput: [AtomicU64::new(0), AtomicU64::new(0)],
            copies: AtomicU64::new(0),
            quiet,
        });
        for (index, (queue, coding_queue, reader, writer)) in receivers.into_iter().enumerate() {
            let (to_write, coded) = sync_channel::<Coded>(BLOCKS_AHEAD);
            let (return_coded, spare_coded) = block_pool();
            let coding = Arc::downgrade(&set);
            std::thread::Builder::new()
                .name(format!("flyt-stripe-code-{index}"))
                .spawn(move || code_loop(&coding, &coding_queue, &to_write, &spare_coded))
                .map_err(|error| error.to_string())?;
            let sending = Arc::downgrade(&set);
            let sender = SenderEnds { link: index, coded, return_coded };
            std::thread::Builder::new()
                .name(format!("flyt-stripe-out-{index}"))
                .spawn(move || send_loop(&sending, writer, &queue, &sender))
                .map_err(|error| error.to_string())?;
            let (to_decode, decoding) = sync_channel::<Compressed>(BLOCKS_AHEAD);
            let (return_block, spare_blocks) = block_pool();
            let decoding_set = Arc::downgrade(&set);
            std::thread::Builder::new()
                .name(format!("flyt-stripe-decode-{index}"))
                .spawn(move || decode_loop(&decoding_set, &decoding, &return_block))
                .map_err(|error| error.to_string())?;
            let receiving = Arc::downgrade(&set);
            let decoder = Decoder { to_decode, spare_blocks };
            std::thread::Builder::new()
                .name(format!("flyt-stripe-in-{index}"))
                .spawn(move || receive_loop(&receiving, index, reader, &decoder))
                .map_err(|error| error.to_string())?;
        }
        Ok(set)
    }

    /// Whether this copy's chunks go compressed.
    /// Whether this copy's chunks go compressed (each still raw when LZ4 does not shrink it).
    fn compress(&self, plan: &Plan) -> bool {
        match plan.lz4 {
            Lz4::On => true,
            Lz4::Off => false,
            Lz4::Auto => {
                let [raw, compressed] = [0, 1].map(|way| self.goodput[way].load(Ordering::Relaxed));
                let probe = self.copies.fetch_add(1, Ordering::Relaxed) % PROBE_EVERY == PROBE_EVERY - 1;
                let ceiling = COMPRESSION_CEILING_PER_CONNECTION.saturating_mul(self.outlets.len() as u64);
                choose_compressed(raw, compressed, ceiling, probe)
            }
        }
    }

    /// A successful copy of `len` bytes in `took`, `compressed` or not: that way's goodput.
    fn timed(&self, plan: &Plan, len: u64, compressed: bool, took: Duration) {
        if plan.lz4 != Lz4::Auto || len < TIMED_CHUNKS * plan.chunk {
            return;
        }
        let rate = (len as f64 / took.as_secs_f64().max(1e-6)) as u64;
        let slot = &self.goodput[usize::from(compressed)];
        let old = slot.load(Ordering::Relaxed);
        slot.store(if old == 0 { rate } else { (old * 3 + rate) / 4 }, Ordering::Relaxed);
    }

    /// Ends striping: every copy under way fails, later ones use the main connection.
    fn fail(&self, reason: &str) {
        if !self.dead.swap(true, Ordering::AcqRel) {
            lock(&self.failure).get_or_insert_with(|| reason.to_string());
            for socket in &self.sockets {
                socket.shutdown();
            }
        }
        for landing in lock(&self.landings).values_mut() {
            landing.failed = true;
        }
        self.landed.notify_all();
    }
}

fn set_write_timeout(wire: &Wire, timeout: Duration) {
    let value = libc::timeval { tv_sec: timeout.as_secs() as libc::time_t, tv_usec: 0 };
    // SAFETY: setsockopt on a descriptor the wire owns, with a `timeval` read during the call.
    unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(wire),
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            std::ptr::addr_of!(value).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        );
    }
}

/// Writes every slice; a write that makes no progress for `WRITE_STALL`, or while striping has
/// ended (`dead`), fails.
fn write_all(wire: &mut Wire, mut slices: &mut [IoSlice<'_>], dead: &AtomicBool) -> std::io::Result<()> {
    let mut last_progress = Instant::now();
    while !slices.is_empty() {
        match wire.write_vectored(slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(written) => {
                IoSlice::advance_slices(&mut slices, written);
                last_progress = Instant::now();
            }
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                if dead.load(Ordering::Acquire) || last_progress.elapsed() >= WRITE_STALL {
                    return Err(error);
                }
            }
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// What a data connection's coder hands its sender, for the compressed copy it is writing.
enum Coded {
    /// A chunk taken and coded: compressed into `block` (its header says so), else the app's bytes.
    Chunk { copy: Arc<Outgoing>, header: ChunkHeader, ptr: *const u8, block: Option<Vec<u8>> },
    /// No chunk of the copy is left: the sender ends its share.
    End(Arc<Outgoing>),
}

// SAFETY: `ptr` is inside the copy's source buffer, readable until its chunk is answered (see
// `Outgoing`, which the chunk holds).
unsafe impl Send for Coded {}

/// Answers the rest of a copy's chunks and this connection's end of share with a failure.
fn end_share_failed(copy: &Outgoing) {
    copy.refuse_rest("striping ended");
    copy.done.answer(Err("striping ended".to_string()));
}

/// A data connection's coder: takes chunks of a compressed copy and codes each into a block while
/// its sender writes the one before (a sender that stopped writing to compress would leave its
/// connection idle). Gets only compressed copies, in the order its sender gets them.
fn code_loop(set: &std::sync::Weak<Set>, queue: &Receiver<Arc<Outgoing>>, to_write: &SyncSender<Coded>, spare: &Receiver<Vec<u8>>) {
    let mut compressor = Compressor::default();
    let mut block: Option<Vec<u8>> = None;
    while let Ok(copy) = queue.recv() {
        while let Some((mut header, ptr)) = copy.take() {
            let mut coded = None;
            if set.upgrade().is_some_and(|set| !set.dead.load(Ordering::Acquire)) {
                let mut into = match block.take() {
                    Some(into) => into,
                    None => spare.recv().unwrap_or_default(),
                };
                // SAFETY: see `Outgoing`: readable for `len` bytes until this chunk is answered.
                let bytes = unsafe { std::slice::from_raw_parts(ptr, header.len as usize) };
                match compressor.compress_into(bytes, &mut into) {
                    Some(flags) => {
                        (header.wire_len, header.flags) = (into.len() as u64, flags);
                        coded = Some(into);
                    }
                    None => block = Some(into),
                }
            }
            if to_write.send(Coded::Chunk { copy: copy.clone(), header, ptr, block: coded }).is_err() {
                // The sender is gone: this chunk, the rest and the end are answered here.
                copy.done.answer(Err("striping ended".to_string()));
                break;
            }
        }
        if to_write.send(Coded::End(copy.clone())).is_err() {
            end_share_failed(&copy);
        }
    }
}

/// A data connection's sender's ends: its index, and its coder's output and the way back for
/// the coder's blocks.
struct SenderEnds {
    link: usize,
    coded: Receiver<Coded>,
    return_coded: Sender<Vec<u8>>,
}

/// A data connection's sender: writes each copy's chunks, header first, straight from the app's
/// buffer (an uncompressed copy: it takes them itself, the next each time it is free) or as its
/// coder hands them over (a compressed copy: from the block, or the app's buffer where LZ4 did not
/// shrink the chunk), then the end of its share of the copy.
fn send_loop(set: &std::sync::Weak<Set>, mut writer: Wire, queue: &Receiver<Arc<Outgoing>>, ends: &SenderEnds) {
    let spin = flyt_ring::data_thread_spin();
    while let Ok(copy) = flyt_ring::recv_spinning(queue, spin) {
        let mut write = |header: ChunkHeader, payload: &[u8]| match set.upgrade() {
            Some(live) if !live.dead.load(Ordering::Acquire) => {
                let encoded = header.encode();
                let began = copy.trace.as_ref().map(|_| Instant::now());
                let outcome = write_all(&mut writer, &mut [IoSlice::new(&encoded), IoSlice::new(payload)], &live.dead)
                    .map_err(|error| format!("writing a chunk: {error}"));
                if let (Some(trace), Some(began), false) = (&copy.trace, began, payload.is_empty()) {
                    trace.chunk(ends.link, began);
                }
                if let Err(reason) = &outcome {
                    live.fail(reason);
                }
                outcome
            }
            _ => Err("striping ended".to_string()),
        };
        if !copy.compress {
            while let Some((header, ptr)) = copy.take() {
                // SAFETY: see `Outgoing`: readable for `len` bytes until this chunk is answered.
                let payload = unsafe { std::slice::from_raw_parts(ptr, header.len as usize) };
                copy.done.answer(write(header, payload));
            }
            copy.done.answer(write(ChunkHeader::end(copy.transfer), &[]));
            continue;
        }
        // The coder got this copy just before this queue did, and codes copies in that order.
        loop {
            match ends.coded.recv() {
                Ok(Coded::Chunk { copy: coded_copy, header, ptr, block }) => {
                    debug_assert_eq!(coded_copy.transfer, copy.transfer);
                    let payload = match &block {
                        Some(block) => &block[..],
                        // SAFETY: see `Outgoing`: readable for `len` bytes until this chunk is answered.
                        None => unsafe { std::slice::from_raw_parts(ptr, header.len as usize) },
                    };
                    let outcome = write(header, payload);
                    if let Some(block) = block {
                        let _ = ends.return_coded.send(block);
                    }
                    coded_copy.done.answer(outcome);
                }
                Ok(Coded::End(coded_copy)) => {
                    debug_assert_eq!(coded_copy.transfer, copy.transfer);
                    copy.done.answer(write(ChunkHeader::end(copy.transfer), &[]));
                    break;
                }
                // The coder is gone (it could not be handed the copy): nothing codes the rest.
                Err(_) => {
                    end_share_failed(&copy);
                    break;
                }
            }
        }
    }
}

/// Reads exactly `buf`; `Ok(false)` when the connection was idle (no byte yet) past its timeout.
fn read_exact_or_idle(reader: &mut Wire, buf: &mut [u8], idle_ok: bool) -> std::io::Result<bool> {
    let mut filled = 0;
    let mut last_progress = Instant::now();
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(read) => {
                filled += read;
                last_progress = Instant::now();
            }
            Err(error) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                if filled == 0 && idle_ok {
                    return Ok(false);
                }
                if last_progress.elapsed() >= IO_TIMEOUT {
                    return Err(error);
                }
            }
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(true)
}

/// A compressed chunk read and still to decode into its landing.
struct Compressed {
    header: ChunkHeader,
    block: Vec<u8>,
    target: *mut u8,
}

// SAFETY: `target` is inside a registered landing, writable for `header.len` bytes: the landing's
// `writing` count keeps it (and the app's buffer) in place until the decoding thread counts the chunk.
unsafe impl Send for Compressed {}

/// A reader's way to its decoding thread: chunks to decode, and the blocks it is done with
/// (compressed chunks are read into them).
struct Decoder {
    to_decode: SyncSender<Compressed>,
    spare_blocks: Receiver<Vec<u8>>,
}

/// A data connection's reader: each chunk goes straight into the buffer of the copy it names;
/// one for no copy waiting (a copy that failed and left) is read and dropped. A compressed chunk
/// is decoded by the connection's decoding thread while this one reads the next: a reader that
/// stopped to decode would stop its connection (flow control), and connections moving in step
/// would leave the link idle while they all decode.
fn receive_loop(set: &std::sync::Weak<Set>, link: usize, mut reader: Wire, decoder: &Decoder) {
    let mut scratch = vec![0u8; 1 << 20];
    loop {
        let mut header = [0u8; CHUNK_HEADER_LEN];
        let read = read_exact_or_idle(&mut reader, &mut header, true);
        let Some(set) = set.upgrade() else { return };
        let failure = match read {
            Ok(false) => continue,
            Ok(true) => match ChunkHeader::decode(&header) {
                Some(header) if header.ends_share() => Some("an end of share where a chunk was due".to_string()),
                Some(header) => receive_chunk(&set, link, &mut reader, header, &mut scratch, decoder).err(),
                None => Some("no chunk header where one was due".to_string()),
            },
            Err(error) => Some(format!("reading a chunk header: {error}")),
        };
        if let Some(reason) = failure {
            set.fail(&reason);
            return;
        }
    }
}

/// A data connection's decoding thread: decodes each compressed chunk into its landing and
/// counts it there.
fn decode_loop(set: &std::sync::Weak<Set>, decoding: &Receiver<Compressed>, return_block: &Sender<Vec<u8>>) {
    let mut decompressor = Decompressor::default();
    while let Ok(chunk) = decoding.recv() {
        // SAFETY: see `Compressed`: writable for `len` bytes until counted below; chunks of one
        // copy never overlap.
        let bytes = unsafe { std::slice::from_raw_parts_mut(chunk.target, chunk.header.len as usize) };
        let outcome = decompressor.decompress(&chunk.header, &chunk.block, bytes);
        let _ = return_block.send(chunk.block);
        // The copy's thread holds the set while its landing has chunks being written.
        let Some(set) = set.upgrade() else { continue };
        count_landed(&set, &chunk.header, outcome.is_ok());
        if let Err(reason) = outcome {
            set.fail(&format!("decoding a chunk: {reason}"));
        }
    }
}

/// A chunk written into its landing (or not: `landed` false) is no longer being written.
fn count_landed(set: &Set, header: &ChunkHeader, landed: bool) {
    let mut landings = lock(&set.landings);
    if let Some(landing) = landings.get_mut(&header.transfer) {
        landing.writing -= 1;
        if landed {
            landing.landed += header.len;
        } else {
            landing.failed = true;
        }
    }
    set.landed.notify_all();
}

fn receive_chunk(
    set: &Set,
    link: usize,
    reader: &mut Wire,
    header: ChunkHeader,
    scratch: &mut [u8],
    decoder: &Decoder,
) -> Result<(), String> {
    let began = tracing_copies().then(Instant::now);
    let mut trace = None;
    let target = {
        let mut landings = lock(&set.landings);
        match landings.get_mut(&header.transfer) {
            Some(landing) if header.offset.checked_add(header.len).is_some_and(|end| end <= landing.len) && !landing.failed => {
                landing.writing += 1;
                trace.clone_from(&landing.trace);
                // SAFETY: inside the registered buffer (checked just above).
                Some(unsafe { landing.ptr.add(header.offset as usize) })
            }
            Some(landing) => {
                landing.failed = true;
                None
            }
            None => None,
        }
    };
    let outcome = match target {
        Some(target) if header.compressed() => {
            // Smaller than the chunk, which fits in the app's buffer.
            let block =
                decoder.spare_blocks.recv().map_err(|_| std::io::Error::other("the decoding thread ended")).and_then(|mut block| {
                    block.resize(header.wire_len as usize, 0);
                    read_exact_or_idle(reader, &mut block, false).map(|_| block)
                });
            match block {
                // The decoding thread counts it.
                Ok(block) => {
                    if let (Some(trace), Some(began)) = (&trace, began) {
                        trace.chunk(link, began);
                    }
                    match decoder.to_decode.send(Compressed { header, block, target }) {
                        Ok(()) => return Ok(()),
                        Err(_) => Err(std::io::Error::other("the decoding thread ended")),
                    }
                }
                Err(error) => Err(error),
            }
        }
        Some(target) => {
            // SAFETY: `writing` keeps the landing (and the app's buffer) in place until this chunk
            // is counted; chunks of one copy never overlap.
            let bytes = unsafe { std::slice::from_raw_parts_mut(target, header.len as usize) };
            read_exact_or_idle(reader, bytes, false).map(|_| ())
        }
        None => {
            let mut left = header.wire_len;
            let mut outcome = Ok(());
            while left > 0 && outcome.is_ok() {
                let step = usize::try_from(left).unwrap_or(usize::MAX).min(scratch.len());
                outcome = read_exact_or_idle(reader, &mut scratch[..step], false).map(|_| ());
                left -= step as u64;
            }
            outcome
        }
    };
    if target.is_some() {
        if let (Some(trace), Some(began), true) = (&trace, began, outcome.is_ok()) {
            trace.chunk(link, began);
        }
        count_landed(set, &header, outcome.is_ok());
    }
    outcome.map_err(|error| format!("reading a chunk: {error}"))
}

/// Host to device, striped, when the copy is large enough and the data connections are up;
/// `None`: the caller copies over the main connection. Returns once every byte was written.
///
/// # Safety
/// `src` is readable for `len` bytes until this returns.
pub unsafe fn htod(client: &Client, dst: u64, src: *const u8, len: u64, stream: u64) -> Option<CudaResult<()>> {
    // Data connections join the first server: a session spread over several copies unstriped.
    if !client.single_server() {
        return None;
    }
    let (plan, set) = client.stripes.for_copy(client, len)?;
    // Connections the copy was handed to: each answers every chunk it takes and its end of share.
    let mut handed = 0;
    let compress = set.compress(plan);
    let chunk = plan.chunk_for(compress);
    let pieces = chunks(len, chunk, set.outlets.len());
    let started = Instant::now();
    let (slot, copy) = {
        let _order = lock(&set.order);
        let transfer = set.next_transfer.fetch_add(1, Ordering::Relaxed);
        let request = req::MemcpyHtoDStriped { dst, len, stream, transfer, chunk };
        // A move while the request waited for a pause to end: the data connections are the last
        // server's, so the copy goes over the main connection.
        let slot = match client.conn().send_if(&request.into(), true, || client.stripes.current(&set)) {
            Ok(Some(Some(slot))) => slot,
            Ok(_) => return None,
            Err(error) => return Some(Err(error)),
        };
        let trace = CopyTrace::new(started, set.outlets.len());
        let copy = Arc::new(Outgoing { transfer, src, pieces, next: AtomicUsize::new(0), compress, done: Progress::default(), trace });
        for outlet in &set.outlets {
            // The sender first: a connection whose sender has the copy answers its share, even
            // when its coder could not take the copy (the sender then finds the coder gone).
            if outlet.sender.send(copy.clone()).is_err() {
                set.fail("a sender thread ended");
                break;
            }
            handed += 1;
            if compress && outlet.coder.send(copy.clone()).is_err() {
                set.fail("a coding thread ended");
                break;
            }
        }
        (slot, copy)
    };
    let handed_at = Instant::now();
    // Every chunk is answered (written, or failed within the write timeout) before the app's
    // buffer is let go: by the connections it was handed to, which take them all.
    let answers = if handed == 0 { 0 } else { copy.pieces.len() + handed };
    let mut state = lock(&copy.done.state);
    while state.0 < answers {
        state = copy.done.changed.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner);
    }
    let failed = state.1.is_some() || handed < set.outlets.len();
    drop(state);
    let written_at = Instant::now();
    // Written is not landed: a cut can lose what sat in a socket's buffers, so the server's
    // reply (sent once every chunk landed, or the copy failed) decides.
    let reply = slot.wait().and_then(|message| decode_reply::<rep::MemcpyHtoDStriped>(&message).map_err(|_| CudaError::UNKNOWN));
    if let Some(trace) = &copy.trace {
        trace.report("htod", len, &[("handed", handed_at), ("written", written_at), ("reply", Instant::now())]);
    }
    let again = match reply {
        Ok(reply) => match reply.result {
            Ok(answer) => answer.again,
            Err(error) => return Some(Err(error)),
        },
        Err(error) => return Some(Err(error)),
    };
    if !failed && !again {
        set.timed(plan, len, compress, started.elapsed());
        return Some(Ok(()));
    }
    // A resumable session's server takes the broken copy for one that comes again: the caller
    // copies it whole over the main connection, after the striped request (`crate::reconnect`).
    if client.conn().resumes() {
        return None;
    }
    Some(Err(CudaError::DEVICES_UNAVAILABLE))
}

/// Device to host, striped (see [`htod`]); returns once the reply and every byte are in, with the
/// deferred error the reply carried. `blocking`: a `cudaMemcpy`, as `MemcpyDtoH`'s.
///
/// # Safety
/// `dst` is writable for `len` bytes until this returns, and nothing else touches it meanwhile.
pub unsafe fn dtoh(
    client: &Client,
    dst: *mut u8,
    src: u64,
    len: u64,
    stream: u64,
    blocking: bool,
) -> Option<CudaResult<Option<CudaError>>> {
    // Data connections join the first server: a session spread over several copies unstriped.
    if !client.single_server() {
        return None;
    }
    let (plan, set) = client.stripes.for_copy(client, len)?;
    let transfer = set.next_transfer.fetch_add(1, Ordering::Relaxed);
    let started = Instant::now();
    let trace = CopyTrace::new(started, set.outlets.len());
    lock(&set.landings).insert(transfer, Landing { ptr: dst, len, landed: 0, writing: 0, failed: false, trace: trace.clone() });
    let compress = set.compress(plan);
    let request = req::MemcpyDtoHStriped { src, len, stream, transfer, chunk: plan.chunk_for(compress), blocking, compress };
    // As in `htod`: after a move the copy goes over the main connection.
    let slot = match client.conn().send_if(&request.into(), true, || client.stripes.current(&set)) {
        Ok(Some(Some(slot))) => slot,
        Ok(_) => {
            lock(&set.landings).remove(&transfer);
            return None;
        }
        Err(error) => {
            lock(&set.landings).remove(&transfer);
            return Some(Err(error));
        }
    };
    let sent_at = Instant::now();
    let reply = slot.wait().and_then(|message| decode_reply::<rep::MemcpyDtoHStriped>(&message).map_err(|_| CudaError::UNKNOWN));
    let reply_at = Instant::now();
    let mut landings = lock(&set.landings);
    let earlier = reply.as_ref().ok().and_then(|reply| reply.deferred);
    let mut outcome = match reply {
        Ok(reply) => reply.result.map(|_| reply.deferred),
        Err(error) => Err(error),
    };
    // On success every chunk was written before the reply: wait for the bytes (or for a data
    // connection to fail, or to stall past the timeout). On failure, only for chunks being
    // written into the buffer now.
    let mut last = (0, Instant::now());
    while let Some(landing) = landings.get(&transfer) {
        let complete = landing.landed == len;
        if landing.writing == 0 && (complete || outcome.is_err() || landing.failed) {
            if !complete && outcome.is_ok() {
                outcome = Err(CudaError::DEVICES_UNAVAILABLE);
            }
            break;
        }
        if landing.landed != last.0 {
            last = (landing.landed, Instant::now());
        } else if last.1.elapsed() > IO_TIMEOUT && landing.writing == 0 {
            drop(landings);
            set.fail("no chunk arrived within the timeout");
            landings = lock(&set.landings);
            continue;
        }
        landings = set.landed.wait_timeout(landings, Duration::from_millis(100)).unwrap_or_else(|e| e.into_inner()).0;
    }
    landings.remove(&transfer);
    if outcome.is_ok() {
        set.timed(plan, len, compress, started.elapsed());
    }
    drop(landings);
    if let Some(trace) = &trace {
        trace.report("dtoh", len, &[("sent", sent_at), ("reply", reply_at), ("landed", Instant::now())]);
    }
    // A data connection broke under the copy in a resumable session: the caller copies it whole
    // over the main connection (which carries the app's later calls anyway), keeping the error an
    // earlier asynchronous call left for this reply.
    if outcome.is_err() && set.dead.load(Ordering::Acquire) && client.conn().resumes() {
        if let Some(deferred) = earlier {
            client.conn().defer(deferred);
        }
        return None;
    }
    Some(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_that_shrink_go_compressed_and_others_raw() {
        let weights: Vec<u8> = (0..(1u32 << 19)).flat_map(|i| ((i / 5) as u16 ^ 0x3c00).to_le_bytes()).collect();
        let mut compressor = Compressor::default();
        let (block, flags) = compressor.compress(&weights).map(|(block, flags)| (block.to_vec(), flags)).expect("repetitive bytes shrink");
        let header = ChunkHeader { wire_len: block.len() as u64, flags, ..ChunkHeader::raw(1, 0, weights.len() as u64) };
        let mut back = vec![0u8; weights.len()];
        Decompressor::default().decompress(&header, &block, &mut back).unwrap();
        assert!(back == weights);
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let random: Vec<u8> = (0..1 << 20)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 32) as u8
            })
            .collect();
        assert!(compressor.compress(&random).is_none(), "random bytes go raw");
    }

    #[test]
    fn automatic_compression_measures_both_ways_then_keeps_the_faster_and_probes_the_other() {
        // Nothing timed: raw first, then compressed once each has no figure.
        assert!(!choose_compressed(0, 0, 100, false));
        assert!(choose_compressed(10, 0, 100, false));
        // The faster way, and the other on a probe.
        assert!(choose_compressed(10, 20, 100, false) && !choose_compressed(10, 20, 100, true));
        assert!(!choose_compressed(20, 10, 100, false) && choose_compressed(20, 10, 100, true));
    }

    #[test]
    fn a_link_faster_than_the_codecs_never_tries_compression() {
        for (compressed, probe) in [(0, false), (0, true), (300, false), (300, true)] {
            assert!(!choose_compressed(200, compressed, 100, probe));
        }
        // Slower again (congestion): compression is tried.
        assert!(choose_compressed(90, 0, 100, false));
    }

    #[test]
    fn the_count_follows_the_link_within_the_cap_unless_asked() {
        let link = Count::FromLink(DEFAULT_COUNT_CAP);
        // 10, 25, 100, 200 and 400 Gb/s.
        let counts = [10_000u64, 25_000, 100_000, 200_000, 400_000].map(|megabits| link.for_link(Some(megabits * 125_000)));
        assert_eq!(counts, [1, 2, 5, 8, 8]);
        assert_eq!(link.for_link(Some(1)), 1);
        assert_eq!(link.for_link(None), DEFAULT_COUNT);
        assert_eq!(Count::FromLink(2).for_link(None), 2);
        assert_eq!(Count::Fixed(3).for_link(Some(400_000 * 125_000)), 3);
        assert_eq!(Count::Fixed(0).for_link(None), 0);
    }

    #[test]
    fn sockets_without_a_known_speed_have_none() {
        let (unix, _peer) = std::os::unix::net::UnixStream::pair().expect("a socket pair");
        assert_eq!(interface_speed(std::os::fd::AsFd::as_fd(&unix)), None);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let tcp = std::net::TcpStream::connect(listener.local_addr().expect("its address")).expect("connected");
        assert_eq!(interface_speed(std::os::fd::AsFd::as_fd(&tcp)), None);
    }

    #[test]
    fn a_connection_over_an_interface_finds_it() {
        // Any IPv4 address of this host's other than loopback's (a machine with none skips).
        let Some((name, ip)) = nix::ifaddrs::getifaddrs()
            .expect("the interfaces")
            .filter_map(|entry| Some((entry.interface_name.clone(), ip_of(entry.address.as_ref()?)?)))
            .find(|(_, ip)| ip.is_ipv4() && !ip.is_loopback())
        else {
            return;
        };
        let listener = std::net::TcpListener::bind((ip, 0)).expect("a port on that address");
        let tcp = std::net::TcpStream::connect(listener.local_addr().expect("its address")).expect("connected");
        assert_eq!(interface_of(std::os::fd::AsFd::as_fd(&tcp)), Some(name));
    }

    #[test]
    fn sizes_read_with_suffixes() {
        for (value, expected) in [("4M", 4 << 20), ("192K", 192 << 10), ("1g", 1 << 30), ("12345", 12345)] {
            let name = format!("FLYT_TEST_STRIPE_BYTES_{value}");
            // SAFETY: no other thread of this test reads or writes this variable.
            unsafe { std::env::set_var(&name, value) };
            assert_eq!(env_bytes(&name), Some(expected));
        }
        assert_eq!(env_bytes("FLYT_TEST_STRIPE_BYTES_UNSET"), None);
    }
}
