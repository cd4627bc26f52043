//! Two single-producer, single-consumer byte rings in a shared-memory segment, one per
//! direction, carrying the same frames the socket would. A side that waits spins first (replies
//! to small calls arrive within microseconds) and then sleeps on a futex, so an idle session costs
//! no CPU. The socket the session was opened on stays open and tells each side when the other
//! is gone: a ring is never the only thing standing between an app and a hang.
//!
//! Layout at the ring area's start (`AREA_HEADER` bytes): the client-to-server header at 0 and
//! the server-to-client header at `AREA_HEADER / 2`; then `capacity` bytes of client-to-server
//! data, then `capacity` bytes of server-to-client data. Every counter the peer writes is checked
//! before use: a corrupted ring is an I/O error, never an out-of-bounds access.
#![allow(
    clippy::cast_possible_truncation,
    reason = "Flyt runs on 64-bit Linux only: sizes and addresses cross the wire as u64 and fit usize"
)]

mod link;

pub use link::Link;

use std::io::{self, Read, Write};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

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

/// Bytes of the area that hold the two headers.
pub const AREA_HEADER: usize = 4096;

/// Bytes the whole ring area takes for a given ring capacity.
pub fn area_len(capacity: usize) -> usize {
    AREA_HEADER + 2 * capacity
}

#[repr(C, align(64))]
struct Line<T>(T);

/// One direction's counters, each on its own cache line.
#[repr(C)]
struct Header {
    /// Bytes ever written (producer).
    head: Line<AtomicU64>,
    /// Bytes ever read (consumer).
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
}

/// Both rings of a session, as seen from one side.
pub struct Pair {
    outgoing: Ring,
    incoming: Ring,
    liveness: RawFd,
    spin: Duration,
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
    /// aligned, mapped for as long as the `Pair` and its halves live; `capacity` is a power of
    /// two; `liveness` is the session's socket, open as long as the pair lives.
    pub unsafe fn new(base: *mut u8, capacity: usize, side: Side, liveness: RawFd, spin: Duration) -> Self {
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
        Self { outgoing, incoming, liveness, spin }
    }

    /// The reading and writing halves.
    pub fn split(self) -> (RingReader, RingWriter) {
        let pair = Arc::new(self);
        (RingReader(pair.clone()), RingWriter(pair))
    }

    /// `false` once the peer closed its rings or its socket is gone.
    fn peer_alive(&self, ring: &Ring) -> bool {
        if ring.header().closed.0.load(Ordering::Acquire) != 0 {
            return false;
        }
        let mut poll = libc::pollfd { fd: self.liveness, events: libc::POLLRDHUP, revents: 0 };
        // SAFETY: one valid pollfd, no timeout.
        let ready = unsafe { libc::poll(&mut poll, 1, 0) };
        !(ready > 0 && poll.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR | libc::POLLNVAL) != 0)
    }

    /// Waits until `ready()` holds; `false` if the peer went away first.
    fn wait(&self, ring: &Ring, ready: impl Fn() -> bool, sequence: &AtomicU32, asleep: &AtomicU32) -> bool {
        let spin_until = Instant::now() + self.spin;
        while Instant::now() < spin_until {
            if ready() {
                return true;
            }
            std::hint::spin_loop();
        }
        loop {
            let seen = sequence.load(Ordering::Acquire);
            asleep.store(1, Ordering::SeqCst);
            if ready() {
                asleep.store(0, Ordering::SeqCst);
                return true;
            }
            futex_wait(sequence, seen, NAP);
            asleep.store(0, Ordering::SeqCst);
            if ready() {
                return true;
            }
            if !self.peer_alive(ring) {
                return false;
            }
        }
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
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

/// The reading half (one consumer).
pub struct RingReader(Arc<Pair>);
/// The writing half (one producer).
pub struct RingWriter(Arc<Pair>);

impl RingReader {
    /// Reads what is there without waiting: `WouldBlock` when the ring is empty.
    pub fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_from_ring(buf, false)
    }

    fn read_from_ring(&mut self, buf: &mut [u8], wait: bool) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let pair = &*self.0;
        let ring = &pair.incoming;
        let header = ring.header();
        let tail = header.tail.0.load(Ordering::Relaxed);
        let available = || header.head.0.load(Ordering::Acquire).wrapping_sub(tail);
        if available() == 0 {
            if !wait {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            if !pair.wait(ring, || available() != 0, &header.written.0, &header.consumer_asleep.0) {
                return Ok(0);
            }
        }
        let available = available();
        if available > ring.capacity {
            return Err(corrupted());
        }
        let count = usize::try_from(available).unwrap_or(usize::MAX).min(buf.len());
        let start = usize::try_from(tail % ring.capacity).map_err(|_| corrupted())?;
        let first = count.min(ring.capacity as usize - start);
        // SAFETY: `start + first <= capacity` and `count - first <= capacity`: both copies stay
        // inside the ring's data area, which only the producer writes, and only beyond `head`,
        // which is past what we read (checked `available <= capacity` above).
        unsafe {
            std::ptr::copy_nonoverlapping(ring.data.add(start), buf.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(ring.data, buf.as_mut_ptr().add(first), count - first);
        }
        header.tail.0.store(tail + count as u64, Ordering::Release);
        header.read.0.fetch_add(1, Ordering::SeqCst);
        if header.producer_asleep.0.load(Ordering::SeqCst) != 0 {
            futex_wake(&header.read.0);
        }
        Ok(count)
    }
}

impl Read for RingReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_from_ring(buf, true)
    }
}

impl Write for RingWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let pair = &*self.0;
        let ring = &pair.outgoing;
        let header = ring.header();
        let head = header.head.0.load(Ordering::Relaxed);
        let free = || ring.capacity.saturating_sub(head.wrapping_sub(header.tail.0.load(Ordering::Acquire)));
        if free() == 0 && !pair.wait(ring, || free() != 0, &header.read.0, &header.producer_asleep.0) {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let used = head.wrapping_sub(header.tail.0.load(Ordering::Acquire));
        if used > ring.capacity {
            return Err(corrupted());
        }
        let count = usize::try_from(ring.capacity - used).unwrap_or(usize::MAX).min(buf.len());
        let start = usize::try_from(head % ring.capacity).map_err(|_| corrupted())?;
        let first = count.min(ring.capacity as usize - start);
        // SAFETY: both copies stay inside the ring's data area (as in `read`), in the part the
        // consumer has already read (`count <= capacity - used`).
        unsafe {
            std::ptr::copy_nonoverlapping(buf.as_ptr(), ring.data.add(start), first);
            std::ptr::copy_nonoverlapping(buf.as_ptr().add(first), ring.data, count - first);
        }
        header.head.0.store(head + count as u64, Ordering::Release);
        header.written.0.fetch_add(1, Ordering::SeqCst);
        if header.consumer_asleep.0.load(Ordering::SeqCst) != 0 {
            futex_wake(&header.written.0);
        }
        Ok(count)
    }

    /// Writes as many whole slices as fit and publishes them at once, so a frame (header,
    /// message) reaches the reader in one piece rather than as several wake-ups.
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let total: usize = bufs.iter().map(|buf| buf.len()).sum();
        let ring = &self.0.outgoing;
        let header = ring.header();
        let head = header.head.0.load(Ordering::Relaxed);
        let used = head.wrapping_sub(header.tail.0.load(Ordering::Acquire));
        if total == 0 || used > ring.capacity || (ring.capacity - used) < total as u64 {
            // Too big for the free space (or nothing to write): fall back to piecewise writes.
            return match bufs.iter().find(|buf| !buf.is_empty()) {
                Some(buf) => self.write(buf),
                None => Ok(0),
            };
        }
        let mut at = head;
        for buf in bufs {
            let start = (at % ring.capacity) as usize;
            let first = buf.len().min(ring.capacity as usize - start);
            // SAFETY: the whole write fits the free part of the ring (checked above); each
            // copy stays inside the data area, wrapping at its end.
            unsafe {
                std::ptr::copy_nonoverlapping(buf.as_ptr(), ring.data.add(start), first);
                std::ptr::copy_nonoverlapping(buf.as_ptr().add(first), ring.data, buf.len() - first);
            }
            at += buf.len() as u64;
        }
        header.head.0.store(at, Ordering::Release);
        header.written.0.fetch_add(1, Ordering::SeqCst);
        if header.consumer_asleep.0.load(Ordering::SeqCst) != 0 {
            futex_wake(&header.written.0);
        }
        Ok(total)
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
                Pair::new(base, CAPACITY, Side::Client, socket, Duration::from_micros(50)).split(),
                Pair::new(base, CAPACITY, Side::Server, socket, Duration::from_micros(50)).split(),
            )
        }
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
    fn corrupted_counters_are_errors() {
        let mut map = memmap2::MmapMut::map_anon(area_len(CAPACITY)).unwrap();
        let (socket, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let base = map.as_mut_ptr();
        let ((mut client_in, _), _) = pair_over(&mut map, socket.as_raw_fd());
        // The server-to-client header sits at AREA_HEADER / 2: claim 1 GiB of data.
        // SAFETY: writing the head counter of the test's own mapping.
        unsafe { base.add(AREA_HEADER / 2).cast::<u64>().write(1 << 30) };
        assert_eq!(client_in.read(&mut [0u8; 16]).unwrap_err().kind(), io::ErrorKind::InvalidData);
    }
}
