//! Two single-producer, single-consumer byte rings in a shared-memory segment, one per
//! direction, carrying the same frames the socket would. A side that waits spins first (replies
//! to small calls arrive within microseconds) and then sleeps, so an idle session costs no CPU:
//! on a futex when both sides share a kernel ([`Wake::Futex`]), or, when they do not (a virtual
//! machine's guest and its host share only the memory of an ivshmem device), in `poll` on the
//! session's socket, which the writer rings with one byte ([`Wake::Doorbell`]). The socket the
//! session was opened on stays open and tells each side when the other is gone: a ring is never
//! the only thing standing between an app and a hang.
//!
//! Layout at the ring area's start (`AREA_HEADER` bytes): the client-to-server header at 0 and
//! the server-to-client header at `AREA_HEADER / 2`; then `capacity` bytes of client-to-server
//! data, then `capacity` bytes of server-to-client data. Data travels as records, each starting
//! on a cache line with a 16-byte header (a stamp that marks it complete, then its length): the
//! reader polls the next record's stamp, so a small message costs one cache-line transfer
//! between cores. Everything the peer writes is checked before use: a corrupted ring is an I/O
//! error, never an out-of-bounds access.
#![allow(
    clippy::cast_possible_truncation,
    reason = "Flyt runs on 64-bit Linux only: sizes and addresses cross the wire as u64 and fit usize"
)]

mod link;
pub mod region;
pub mod resume;
pub mod serial;
pub mod timeline;
pub mod tls;

pub use link::Link;

use std::io::{self, Read, Write};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Whether the peer of socket `socket` has hung up (closed, reset, shut its end down), without
/// waiting or reading anything.
pub fn peer_hung_up(socket: std::os::fd::BorrowedFd<'_>) -> bool {
    use std::os::fd::AsRawFd;
    let mut poll = libc::pollfd { fd: socket.as_raw_fd(), events: libc::POLLRDHUP, revents: 0 };
    // SAFETY: one valid pollfd, no timeout.
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    ready > 0 && poll.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR | libc::POLLNVAL) != 0
}

/// How long a waiting thread should spin before it sleeps. A wake-up costs tens to hundreds of
/// microseconds on the virtual machines GPUs are lent in (measured: a 64 MiB copy took ~0.3 ms
/// longer than its DMA when the waiting threads slept), and CUDA itself spins while it waits when
/// cores are plentiful: so spin for 20 ms on hosts with 8 or more cores, and only briefly on
/// small ones, where a spinning thread would take a core from the app. `FLYT_SPIN_US` overrides.
pub fn spin_budget() -> Duration {
    static BUDGET: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *BUDGET.get_or_init(|| {
        if let Some(micros) = std::env::var("FLYT_SPIN_US").ok().and_then(|value| value.trim().parse::<u64>().ok()) {
            return Duration::from_micros(micros);
        }
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        if cores >= 8 { Duration::from_millis(20) } else { Duration::from_micros(100) }
    })
}

/// How long a bulk copy's data-connection thread polls its queue for the next copy before it
/// sleeps: back-to-back copies (a model's tensors, a copy loop) come within a millisecond, and
/// every connection's thread woken from sleep delays that copy's first bytes by a wake-up; a
/// millisecond of polling per copy is little beside a copy's milliseconds, where the full budget
/// would hold a core per connection. Not at all where the budget is under a millisecond (hosts
/// of few cores, or `FLYT_SPIN_US`): there several such threads would take the app's cores.
pub fn data_thread_spin() -> Duration {
    let millisecond = Duration::from_millis(1);
    if spin_budget() >= millisecond { millisecond } else { Duration::ZERO }
}

/// Receives from `queue`, polling it for `spin` before sleeping on it.
pub fn recv_spinning<T>(queue: &std::sync::mpsc::Receiver<T>, spin: Duration) -> Result<T, std::sync::mpsc::RecvError> {
    let mut spinning = SpinDeadline::after(spin);
    loop {
        match queue.try_recv() {
            Ok(value) => return Ok(value),
            Err(std::sync::mpsc::TryRecvError::Disconnected) => return Err(std::sync::mpsc::RecvError),
            Err(std::sync::mpsc::TryRecvError::Empty) if spinning.keep_spinning() => std::hint::spin_loop(),
            Err(std::sync::mpsc::TryRecvError::Empty) => return queue.recv(),
        }
    }
}

/// Looks between two clock reads of a [`SpinDeadline`].
const LOOKS_PER_CLOCK_READ: u32 = 16;

/// The end of a spin-wait that reads the clock only on every 16th look: a clock read costs 20-50
/// ns on the GPU VMs, as much as the poll it guards, and whatever a look costs is added to the
/// latency of the reply being waited for. The deadline is seen at most 15 looks late.
pub struct SpinDeadline {
    until: Instant,
    looks: u32,
    passed: bool,
}

impl SpinDeadline {
    pub fn new(until: Instant) -> Self {
        Self { until, looks: 0, passed: false }
    }

    pub fn after(budget: Duration) -> Self {
        Self::new(Instant::now() + budget)
    }

    /// `true` while the deadline has not been seen to pass (the first look reads the clock).
    pub fn keep_spinning(&mut self) -> bool {
        if !self.passed && self.looks.is_multiple_of(LOOKS_PER_CLOCK_READ) {
            self.passed = Instant::now() >= self.until;
        }
        self.looks = self.looks.wrapping_add(1);
        !self.passed
    }
}

/// Bytes of the area that hold the two headers.
pub const AREA_HEADER: usize = 4096;

/// Bytes the whole ring area takes for a given ring capacity.
pub fn area_len(capacity: usize) -> usize {
    AREA_HEADER + 2 * capacity
}

/// Records start on cache-line boundaries, so a small message travels with its header in one
/// line: the reader's poll brings the whole message across cores in one transfer.
const RECORD_ALIGN: u64 = 64;
/// A record's header: its stamp (written last) and its payload's length.
const RECORD_HEADER: u64 = 16;
/// Mixed into every stamp so that leftover payload bytes of an earlier lap cannot pass for the
/// stamp of a record that is not there yet (a stamp is never zero: positions stay below 2^63).
const STAMP_KEY: u64 = 0x9E37_79B9_7F4A_7C15 | (1 << 63);

/// The stamp that says "the record at `position` is complete".
fn stamp(position: u64) -> u64 {
    (position + 1) ^ STAMP_KEY
}

/// The stamp a complete record at `position` carries, for tests and fuzzing that write records
/// the way a peer would.
pub fn stamp_for_tests(position: u64) -> u64 {
    stamp(position)
}

/// Bytes a record with `payload` bytes takes in the ring.
fn record_len(payload: u64) -> u64 {
    (RECORD_HEADER + payload).div_ceil(RECORD_ALIGN) * RECORD_ALIGN
}

#[repr(C, align(64))]
struct Line<T>(T);

/// One direction's counters, each on its own cache line. The producer does not publish a head
/// counter: the reader polls the stamp of the next record instead (one cache-line transfer per
/// small message instead of three), and the producer reads `tail` only when the free space it
/// last saw runs out.
#[repr(C)]
struct Header {
    /// Bytes ever consumed, whole records (consumer).
    tail: Line<AtomicU64>,
    /// Bumped on every write: the futex the consumer sleeps on.
    written: Line<AtomicU32>,
    /// Bumped on every read: the futex the producer sleeps on when the ring is full.
    read: Line<AtomicU32>,
    consumer_asleep: Line<AtomicU32>,
    producer_asleep: Line<AtomicU32>,
    /// Set by a side that leaves on purpose.
    closed: Line<AtomicU32>,
}

const _: () = assert!(size_of::<Header>() <= AREA_HEADER / 2);

/// How a side that sleeps is woken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// A futex on the ring's counters: both sides run on one kernel.
    Futex,
    /// One byte on the session's socket, after which the socket carries nothing else: the sides
    /// run on different kernels (a guest and its host), which share no futex. A writer waiting
    /// for room naps instead (a full ring is rare, and its doorbell would share the socket with
    /// the reader's).
    Doorbell,
}

/// The one byte a doorbell is; any other byte on the socket of a ring session is not this
/// session's.
const DOORBELL: u8 = b'w';

/// How long a writer waiting for room naps between looks, under [`Wake::Doorbell`].
const ROOM_NAP: Duration = Duration::from_micros(200);

/// Which end of the pair this process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Client,
    Server,
}

struct Ring {
    header: *const Header,
    data: *mut u8,
    capacity: u64,
}

impl Ring {
    fn header(&self) -> &Header {
        // SAFETY: `header` points at a `Header`-sized, 64-aligned part of the mapping that lives
        // as long as the `Pair` (see `Pair::new`); every field is an atomic.
        unsafe { &*self.header }
    }

    /// The stamp word of the record at `position` (a multiple of `RECORD_ALIGN`).
    fn stamp_at(&self, position: u64) -> &AtomicU64 {
        let offset = (position % self.capacity) as usize;
        // SAFETY: `offset` is a multiple of 64 below `capacity` (a power of two >= 64), so the
        // word lies inside the data area, 8-aligned; it is only accessed atomically.
        unsafe { &*self.data.add(offset).cast::<AtomicU64>() }
    }

    /// Copies `len` bytes out of the ring from `offset` (wrapping at its end).
    ///
    /// # Safety
    /// `offset < capacity`, `len <= capacity`, `out` valid for `len` bytes.
    unsafe fn copy_out(&self, offset: u64, out: *mut u8, len: usize) {
        let first = len.min((self.capacity - offset) as usize);
        // SAFETY: per the caller, both pieces stay inside the data area and `out`.
        unsafe {
            std::ptr::copy_nonoverlapping(self.data.add(offset as usize), out, first);
            std::ptr::copy_nonoverlapping(self.data, out.add(first), len - first);
        }
    }

    /// Copies `bytes` into the ring from `offset` (wrapping at its end).
    ///
    /// # Safety
    /// `offset < capacity`, `bytes.len() <= capacity`, and the range is free (read by the peer).
    unsafe fn copy_in(&self, offset: u64, bytes: &[u8]) {
        let first = bytes.len().min((self.capacity - offset) as usize);
        // SAFETY: per the caller, both pieces stay inside the data area.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.data.add(offset as usize), first);
            std::ptr::copy_nonoverlapping(bytes.as_ptr().add(first), self.data, bytes.len() - first);
        }
    }
}

/// Both rings of a session, as seen from one side.
pub struct Pair {
    outgoing: Ring,
    incoming: Ring,
    liveness: RawFd,
    spin: Duration,
    wake: Wake,
    /// Set when the session moved on and the area belongs to the rings of its next connection:
    /// this pair then leaves it as it is when dropped.
    retired: std::sync::atomic::AtomicBool,
}

// SAFETY: the rings live in shared memory accessed only through atomics and the single producer
// / single consumer discipline: one `RingWriter` and one `RingReader` exist per pair (created
// together in `Pair::split`), each used behind the caller's own lock.
unsafe impl Send for Pair {}
// SAFETY: as above.
unsafe impl Sync for Pair {}

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let timeout = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(1),
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: FUTEX_WAIT on a valid, aligned u32 of a shared mapping (not FUTEX_PRIVATE: the
    // peer is another process); the kernel only reads the word and the timeout.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, &raw const timeout);
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a valid, aligned u32 of a shared mapping.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, 1);
    }
}

/// How long a sleeper sleeps before it looks at the socket again.
const NAP: Duration = Duration::from_millis(50);

impl Pair {
    /// Sets up the pair over the ring area at `base`.
    ///
    /// # Safety
    /// `base` points at `area_len(capacity)` bytes of memory shared with the peer, 64-byte
    /// aligned and mapped for as long as the `Pair` and its halves live; `capacity` is a power of
    /// two of at least 4096; `liveness` is the session's socket, open as long as the pair lives.
    /// The area should be all zero before either side first uses it (a leftover stamp reads as
    /// a record); whatever a peer writes there, this side gets data or errors, never an access
    /// outside the area. Both sides must use the same `wake`.
    pub unsafe fn new(base: *mut u8, capacity: usize, side: Side, liveness: RawFd, spin: Duration, wake: Wake) -> Self {
        let ring = |header_at: usize, data_at: usize| Ring {
            header: base.wrapping_add(header_at).cast(),
            data: base.wrapping_add(data_at),
            capacity: capacity as u64,
        };
        let to_server = ring(0, AREA_HEADER);
        let to_client = ring(AREA_HEADER / 2, AREA_HEADER + capacity);
        let (outgoing, incoming) = match side {
            Side::Client => (to_server, to_client),
            Side::Server => (to_client, to_server),
        };
        Self { outgoing, incoming, liveness, spin, wake, retired: std::sync::atomic::AtomicBool::new(false) }
    }

    /// The reading and writing halves.
    pub fn split(self) -> (RingReader, RingWriter) {
        let pair = Arc::new(self);
        (RingReader { pair: pair.clone(), next: 0, record: None }, RingWriter { pair, head: 0, tail_seen: 0 })
    }

    /// `false` once the peer closed its rings or its socket is gone.
    fn peer_alive(&self, ring: &Ring) -> bool {
        if ring.header().closed.0.load(Ordering::Acquire) != 0 {
            return false;
        }
        // SAFETY: the pair's liveness socket is open for as long as the pair lives.
        !peer_hung_up(unsafe { std::os::fd::BorrowedFd::borrow_raw(self.liveness) })
    }

    /// Waits until `ready()` holds; `false` if the peer went away first. `sequence` and `asleep`
    /// are the counter and flag of what is awaited: a record (`written`, `consumer_asleep`) or
    /// room (`read`, `producer_asleep`).
    fn wait(&self, ring: &Ring, ready: impl Fn() -> bool, sequence: &AtomicU32, asleep: &AtomicU32) -> bool {
        let mut spinning = SpinDeadline::after(self.spin);
        while spinning.keep_spinning() {
            if ready() {
                return true;
            }
            std::hint::spin_loop();
        }
        let awaiting_record = std::ptr::eq(sequence, &ring.header().written.0);
        loop {
            let seen = sequence.load(Ordering::Acquire);
            asleep.store(1, Ordering::SeqCst);
            if ready() {
                asleep.store(0, Ordering::SeqCst);
                return true;
            }
            match self.wake {
                Wake::Futex => futex_wait(sequence, seen, NAP),
                Wake::Doorbell if awaiting_record => {
                    if !self.await_doorbell() {
                        return false;
                    }
                }
                Wake::Doorbell => std::thread::sleep(ROOM_NAP),
            }
            asleep.store(0, Ordering::SeqCst);
            if ready() {
                return true;
            }
            if !self.peer_alive(ring) {
                return false;
            }
        }
    }

    /// Sleeps until the socket has a doorbell byte (or the peer hangs up, or a nap passes) and
    /// drains what is there: the bytes carry no meaning beyond "look at the ring". `false` when
    /// something other than doorbells arrived: the stream no longer belongs to this session (a
    /// VM guest's serial port, say, opened by a new program after this session's app exited,
    /// which nothing told the host), so the session ends rather than swallow the newcomer's bytes.
    fn await_doorbell(&self) -> bool {
        let mut poll = libc::pollfd { fd: self.liveness, events: libc::POLLIN | libc::POLLRDHUP, revents: 0 };
        // SAFETY: one valid pollfd; the timeout is a plain number of milliseconds.
        let ready = unsafe { libc::poll(&mut poll, 1, NAP.as_millis() as libc::c_int) };
        if ready > 0 && poll.revents & libc::POLLIN != 0 {
            let mut bytes = [0u8; 64];
            loop {
                // SAFETY: reads into a local buffer of the given length, without blocking.
                let read = unsafe { libc::recv(self.liveness, bytes.as_mut_ptr().cast(), bytes.len(), libc::MSG_DONTWAIT) };
                let Ok(read @ 1..) = usize::try_from(read) else { break };
                if bytes[..read].iter().any(|&byte| byte != DOORBELL) {
                    return false;
                }
            }
        }
        true
    }

    /// Wakes the peer's sleeping reader after a record was published.
    fn ring_doorbell(&self, ring: &Ring) {
        match self.wake {
            Wake::Futex => futex_wake(&ring.header().written.0),
            Wake::Doorbell => {
                // A full socket already holds doorbells the reader has not drained; a broken
                // one is the peer's death, which the reader's checks report.
                // SAFETY: sends one byte from a local buffer, without blocking or SIGPIPE.
                let _ = unsafe { libc::send(self.liveness, [DOORBELL].as_ptr().cast(), 1, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
            }
        }
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        if self.retired.load(Ordering::Acquire) {
            return;
        }
        for ring in [&self.outgoing, &self.incoming] {
            ring.header().closed.0.store(1, Ordering::Release);
            futex_wake(&ring.header().written.0);
            futex_wake(&ring.header().read.0);
        }
    }
}

fn corrupted() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "the shared-memory ring was corrupted by the peer")
}

/// The record being read: where its unread payload starts and how much is left.
struct OpenRecord {
    at: u64,
    left: u64,
}

/// The reading half (one consumer).
pub struct RingReader {
    pair: Arc<Pair>,
    /// Position of the next record to open.
    next: u64,
    record: Option<OpenRecord>,
}

/// The writing half (one producer).
pub struct RingWriter {
    pair: Arc<Pair>,
    /// Position of the next record to write.
    head: u64,
    /// The consumer's `tail` as last read: what is known to be free without looking again.
    tail_seen: u64,
}

impl RingReader {
    /// Gives the ring area up without closing it (see `Pair::retired`): both halves stop
    /// touching it once dropped.
    pub fn retire(&self) {
        self.pair.retired.store(true, Ordering::Release);
    }
}

impl RingReader {
    /// Reads what is there without waiting: `WouldBlock` when the ring is empty.
    pub fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_from_ring(buf, false)
    }

    /// Whether the record at `next` is complete.
    fn next_ready(&self) -> bool {
        self.pair.incoming.stamp_at(self.next).load(Ordering::Acquire) == stamp(self.next)
    }

    /// Opens the record at `next` if it is complete.
    fn open(&mut self) -> io::Result<bool> {
        if self.record.is_some() {
            return Ok(true);
        }
        if !self.next_ready() {
            return Ok(false);
        }
        let ring = &self.pair.incoming;
        let mut len = [0u8; 8];
        // SAFETY: the length word follows the stamp inside the same aligned line of the data area.
        unsafe { ring.copy_out((self.next + 8) % ring.capacity, len.as_mut_ptr(), 8) };
        let len = u64::from_le_bytes(len);
        // Compared before any arithmetic: a length near 2^64 must not wrap into a small record.
        if len == 0 || len > ring.capacity - RECORD_HEADER {
            return Err(corrupted());
        }
        self.record = Some(OpenRecord { at: self.next + RECORD_HEADER, left: len });
        Ok(true)
    }

    fn read_from_ring(&mut self, buf: &mut [u8], wait: bool) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if !self.open()? {
            if !wait {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let pair = &*self.pair;
            let header = pair.incoming.header();
            let (ring, next) = (&pair.incoming, self.next);
            let ready = || ring.stamp_at(next).load(Ordering::Acquire) == stamp(next);
            if !pair.wait(ring, ready, &header.written.0, &header.consumer_asleep.0) {
                return Ok(0);
            }
            self.open()?;
        }
        // Copy from as many complete records as the buffer takes.
        let mut count = 0;
        let mut finished_any = false;
        while let Some(record) = self.record.as_mut() {
            let ring = &self.pair.incoming;
            let take = usize::try_from(record.left).unwrap_or(usize::MAX).min(buf.len() - count);
            // SAFETY: the record was checked to fit the ring (`len <= capacity - RECORD_HEADER`),
            // so `take <= left <= capacity`; `buf[count..]` holds `take` bytes.
            unsafe { ring.copy_out(record.at % ring.capacity, buf.as_mut_ptr().add(count), take) };
            count += take;
            record.at += take as u64;
            record.left -= take as u64;
            if record.left != 0 {
                break;
            }
            let len = record.at - self.next - RECORD_HEADER;
            self.next += record_len(len);
            self.record = None;
            finished_any = true;
            if count == buf.len() || !self.open()? {
                break;
            }
        }
        if finished_any {
            let header = self.pair.incoming.header();
            header.tail.0.store(self.next, Ordering::Release);
            header.read.0.fetch_add(1, Ordering::SeqCst);
            if self.pair.wake == Wake::Futex && header.producer_asleep.0.load(Ordering::SeqCst) != 0 {
                futex_wake(&header.read.0);
            }
        }
        Ok(count)
    }
}

impl Read for RingReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_from_ring(buf, true)
    }
}

impl RingWriter {
    /// As [`RingReader::retire`].
    pub fn retire(&self) {
        self.pair.retired.store(true, Ordering::Release);
    }

    /// Bytes free for the next record, reading the consumer's `tail` again only when what was
    /// seen last does not cover `wanted` (each read of it is a cache-line transfer).
    fn free(&mut self, wanted: u64) -> io::Result<u64> {
        let ring = &self.pair.outgoing;
        let mut free = ring.capacity - (self.head - self.tail_seen);
        if free < wanted {
            let tail = ring.header().tail.0.load(Ordering::Acquire);
            if tail > self.head || self.head - tail > ring.capacity || !tail.is_multiple_of(RECORD_ALIGN) {
                return Err(corrupted());
            }
            self.tail_seen = tail;
            free = ring.capacity - (self.head - tail);
        }
        Ok(free)
    }

    /// Writes one record holding as much of `bufs` as fits (waiting for room for at least one
    /// byte) and publishes it; returns the bytes taken.
    fn write_record(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let total: u64 = bufs.iter().map(|buf| buf.len() as u64).sum();
        if total == 0 {
            return Ok(0);
        }
        let smallest = record_len(1);
        let mut free = self.free(record_len(total))?;
        if free < smallest {
            let pair = self.pair.clone();
            let ring = &pair.outgoing;
            let header = ring.header();
            let head = self.head;
            let room = || ring.capacity - (head - header.tail.0.load(Ordering::Acquire)) >= smallest;
            if !pair.wait(ring, room, &header.read.0, &header.producer_asleep.0) {
                return Err(io::ErrorKind::BrokenPipe.into());
            }
            free = self.free(record_len(total))?;
        }
        let payload = total.min(free / RECORD_ALIGN * RECORD_ALIGN - RECORD_HEADER);
        let ring = &self.pair.outgoing;
        let mut at = self.head + RECORD_HEADER;
        let mut left = payload;
        for buf in bufs {
            if left == 0 {
                break;
            }
            let piece = &buf[..usize::try_from(left).unwrap_or(usize::MAX).min(buf.len())];
            // SAFETY: the record fits the free part of the ring (`record_len(payload) <= free`),
            // so every piece lies in space the consumer has finished with.
            unsafe { ring.copy_in(at % ring.capacity, piece) };
            at += piece.len() as u64;
            left -= piece.len() as u64;
        }
        // SAFETY: the length word shares the record's first, free, aligned line.
        unsafe { ring.copy_in((self.head + 8) % ring.capacity, &payload.to_le_bytes()) };
        ring.stamp_at(self.head).store(stamp(self.head), Ordering::Release);
        self.head += record_len(payload);
        let header = ring.header();
        // A full barrier between publishing the stamp and looking at `consumer_asleep` (the
        // consumer sets that flag, then looks at the stamp): one of the two sees the other.
        header.written.0.fetch_add(1, Ordering::SeqCst);
        if header.consumer_asleep.0.load(Ordering::SeqCst) != 0 {
            self.pair.ring_doorbell(ring);
        }
        Ok(payload as usize)
    }
}

impl Write for RingWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_record(&[io::IoSlice::new(buf)])
    }

    /// Writes the slices as one record when they fit, so a frame (header, message) reaches the
    /// reader in one piece rather than as several wake-ups.
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.write_record(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    const CAPACITY: usize = 4096;

    fn pair_over(map: &mut memmap2::MmapMut, socket: RawFd) -> ((RingReader, RingWriter), (RingReader, RingWriter)) {
        let base = map.as_mut_ptr();
        // SAFETY: the map holds `area_len(CAPACITY)` bytes and outlives the rings in each test.
        unsafe {
            (
                Pair::new(base, CAPACITY, Side::Client, socket, Duration::from_micros(50), Wake::Futex).split(),
                Pair::new(base, CAPACITY, Side::Server, socket, Duration::from_micros(50), Wake::Futex).split(),
            )
        }
    }

    /// The client's rings over an area of their own, which the test writes into as a hostile
    /// server would: the area's start (its counters) and the start of its server-to-client data.
    /// The map and the socket's ends come back too: they must outlive the rings.
    fn client_over_open_area() -> (memmap2::MmapMut, [std::os::unix::net::UnixStream; 2], (RingReader, RingWriter), *mut u8, *mut u8) {
        let mut map = memmap2::MmapMut::map_anon(area_len(CAPACITY)).unwrap();
        let (socket, peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let base = map.as_mut_ptr();
        let (client, _server) = pair_over(&mut map, socket.as_raw_fd());
        let to_client = base.wrapping_add(AREA_HEADER + CAPACITY);
        (map, [socket, peer], client, base, to_client)
    }

    #[test]
    fn a_spinning_receive_takes_what_comes_while_it_polls_or_after_and_ends_with_its_senders() {
        let (send, queue) = std::sync::mpsc::channel();
        let sender = std::thread::spawn(move || {
            send.send(1).unwrap();
            // Long after the spin: the receive has gone to sleep on the queue by then.
            std::thread::sleep(Duration::from_millis(50));
            send.send(2).unwrap();
        });
        assert_eq!(recv_spinning(&queue, Duration::from_millis(10)), Ok(1));
        assert_eq!(recv_spinning(&queue, Duration::from_millis(1)), Ok(2));
        sender.join().unwrap();
        assert_eq!(recv_spinning(&queue, Duration::from_millis(1)), Err(std::sync::mpsc::RecvError), "no sender left");
        let spin = data_thread_spin();
        assert!(spin <= spin_budget() && (spin == Duration::ZERO || spin == Duration::from_millis(1)), "{spin:?}");
    }

    #[test]
    fn a_spin_deadline_reads_the_clock_at_the_first_look_and_sees_it_pass_within_16() {
        assert!(!SpinDeadline::new(Instant::now()).keep_spinning(), "a deadline already passed ends the spin at once");
        let mut spinning = SpinDeadline::after(Duration::from_millis(300));
        assert!((0..100).all(|_| spinning.keep_spinning()), "100 looks take far less than 300 ms");
        std::thread::sleep(Duration::from_millis(310));
        let looks_after = (0..=LOOKS_PER_CLOCK_READ).take_while(|_| spinning.keep_spinning()).count();
        assert!(looks_after < LOOKS_PER_CLOCK_READ as usize, "seen {looks_after} looks late");
        assert!(!spinning.keep_spinning(), "a passed deadline stays passed");
    }

    #[test]
    fn frames_cross_in_both_directions_and_wrap() {
        let mut map = memmap2::MmapMut::map_anon(area_len(CAPACITY)).unwrap();
        let (socket, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let ((mut client_in, mut client_out), (mut server_in, mut server_out)) = pair_over(&mut map, socket.as_raw_fd());
        let message: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let expected = message.clone();
        let echo = std::thread::spawn(move || {
            let mut got = vec![0u8; expected.len()];
            server_in.read_exact(&mut got).unwrap();
            assert_eq!(got, expected);
            server_out.write_all(&got).unwrap();
        });
        client_out.write_all(&message[..10]).unwrap();
        let mut rest = [io::IoSlice::new(&message[10..20]), io::IoSlice::new(&message[20..])];
        let mut slices = &mut rest[..];
        while !slices.is_empty() {
            let written = client_out.write_vectored(slices).unwrap();
            io::IoSlice::advance_slices(&mut slices, written);
        }
        let mut back = vec![0u8; message.len()];
        client_in.read_exact(&mut back).unwrap();
        assert_eq!(back, message);
        echo.join().unwrap();
    }

    /// Sides on different kernels: each rings the other's end of the socket, and the readers
    /// (which never spin here) sleep in `poll` on their own end.
    #[test]
    fn doorbells_on_the_socket_wake_sleeping_readers() {
        let mut map = memmap2::MmapMut::map_anon(area_len(CAPACITY)).unwrap();
        let (client_socket, server_socket) = std::os::unix::net::UnixStream::pair().unwrap();
        let base = map.as_mut_ptr();
        // SAFETY: the map holds `area_len(CAPACITY)` bytes and outlives the rings; each socket
        // end outlives its side.
        let ((mut client_in, mut client_out), (mut server_in, mut server_out)) = unsafe {
            (
                Pair::new(base, CAPACITY, Side::Client, client_socket.as_raw_fd(), Duration::ZERO, Wake::Doorbell).split(),
                Pair::new(base, CAPACITY, Side::Server, server_socket.as_raw_fd(), Duration::ZERO, Wake::Doorbell).split(),
            )
        };
        let echo = std::thread::spawn(move || {
            for _ in 0..200 {
                let mut frame = [0u8; 24];
                server_in.read_exact(&mut frame).unwrap();
                server_out.write_all(&frame).unwrap();
            }
            // Larger than the ring: the writer waits for room (naps, no doorbell) while the
            // client drains it.
            let big: Vec<u8> = (0..5 * CAPACITY).map(|i| (i % 253) as u8).collect();
            server_out.write_all(&big).unwrap();
        });
        for round in 0..200u8 {
            let frame = [round; 24];
            client_out.write_all(&frame).unwrap();
            let mut back = [0u8; 24];
            client_in.read_exact(&mut back).unwrap();
            assert_eq!(back, frame);
        }
        let mut big = vec![0u8; 5 * CAPACITY];
        client_in.read_exact(&mut big).unwrap();
        assert!(big.iter().enumerate().all(|(i, &b)| b == (i % 253) as u8));
        echo.join().unwrap();
        // Doorbells rang on the sockets (and nothing else crossed them), all drained or harmless.
        let mut pending = [0u8; 4096];
        client_socket.set_nonblocking(true).unwrap();
        let left = (&client_socket).read(&mut pending).unwrap_or(0);
        assert!(pending[..left].iter().all(|&b| b == b'w'), "only doorbell bytes cross the socket");
    }

    #[test]
    fn a_dead_peer_ends_a_blocked_read() {
        let mut map = memmap2::MmapMut::map_anon(area_len(CAPACITY)).unwrap();
        let (socket, peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let ((mut client_in, _client_out), _server) = pair_over(&mut map, socket.as_raw_fd());
        let started = Instant::now();
        let reader = std::thread::spawn(move || client_in.read(&mut [0u8; 8]).unwrap());
        std::thread::sleep(Duration::from_millis(20));
        drop(peer);
        assert_eq!(reader.join().unwrap(), 0, "end of stream");
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn corrupted_records_and_counters_are_errors() {
        let (_map, _sockets, (mut client_in, mut client_out), base, record) = client_over_open_area();
        // The server-to-client data starts after the client-to-server data: a complete record
        // at position 0 that claims 1 GiB of payload.
        // SAFETY: writing the first record header of the test's own mapping.
        unsafe {
            record.cast::<u64>().write(stamp(0));
            record.add(8).cast::<u64>().write(1 << 30);
        }
        assert_eq!(client_in.read(&mut [0u8; 16]).unwrap_err().kind(), io::ErrorKind::InvalidData);
        // A length that would wrap the record's size around 2^64 (found by fuzzing).
        // SAFETY: as above.
        unsafe { record.add(8).cast::<u64>().write(u64::MAX - 8) };
        assert_eq!(client_in.read(&mut [0u8; 1 << 16]).unwrap_err().kind(), io::ErrorKind::InvalidData);
        // The client-to-server tail sits at 0: claim the server read past what was written.
        client_out.write_all(&[1; 8]).unwrap();
        // SAFETY: writing the tail counter of the test's own mapping.
        unsafe { base.cast::<u64>().write(1 << 20) };
        let large = vec![0u8; CAPACITY];
        assert_eq!(client_out.write(&large).unwrap_err().kind(), io::ErrorKind::InvalidData);
    }

    proptest::proptest! {
        /// Whatever a hostile peer leaves in the ring area (stamps that look right, lengths and
        /// counters that do not), the reader and the writer return data or an error: never a
        /// panic, never a read or write outside the area.
        #[test]
        fn a_scribbled_ring_area_is_data_or_an_error(
            words in proptest::collection::vec(proptest::prelude::any::<u64>(), 64),
            stamped in proptest::collection::vec((0u64..64, 0u64..(2 * CAPACITY as u64)), 0..8),
        ) {
            let (_map, _sockets, (mut client_in, mut client_out), base, to_client) = client_over_open_area();
            // SAFETY: every write stays inside the test's own mapping: the counters at the area's
            // start, and whole 8-byte words of the server-to-client data.
            unsafe {
                for (index, word) in words.iter().enumerate() {
                    to_client.add((index * 61 * 8) % CAPACITY).cast::<u64>().write_unaligned(*word);
                }
                for (record, len) in &stamped {
                    let position = record * RECORD_ALIGN;
                    to_client.add(position as usize).cast::<u64>().write(stamp(position));
                    to_client.add(position as usize + 8).cast::<u64>().write(*len);
                }
                base.cast::<u64>().write(words[0]);
            }
            let mut buf = [0u8; 1000];
            for _ in 0..16 {
                match client_in.try_read(&mut buf) {
                    Ok(read) => proptest::prop_assert!(read <= buf.len()),
                    Err(_) => break,
                }
            }
            for _ in 0..4 {
                if client_out.write(&buf).is_err() {
                    break;
                }
            }
        }
    }

    #[test]
    fn many_small_frames_keep_their_order_across_laps() {
        let mut map = memmap2::MmapMut::map_anon(area_len(CAPACITY)).unwrap();
        let (socket, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let ((_client_in, mut client_out), (mut server_in, _server_out)) = pair_over(&mut map, socket.as_raw_fd());
        let frames = 20_000u32;
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4];
            for expected in 0..frames {
                server_in.read_exact(&mut buf).unwrap();
                assert_eq!(u32::from_le_bytes(buf), expected);
            }
        });
        for frame in 0..frames {
            client_out.write_all(&frame.to_le_bytes()).unwrap();
        }
        reader.join().unwrap();
    }
}
