//! A session's byte stream that outlives its TCP connection (`docs/design/reconnect.md`).
//!
//! Each side counts the bytes it has received and keeps the last bytes it has written (up to a
//! limit). When the connection breaks (an error or an end of stream on either half), the side
//! that notices first stops both halves, gets a new connection through its [`Reattach`] (the
//! client dials and proves it owns the session, the server waits for that within its grace
//! period), and the two sides trade their received counts: each sends again exactly what the
//! other has not received, and the stream goes on where it was, byte for byte. The session's
//! frames above never see the break, so no request runs twice and no reply is lost.
//!
//! Bytes are counted once a system call has taken them (a write) or given them (a read), under
//! the half's lock, and a recovery holds both halves' locks while it reads the counts, so the
//! counts it trades are exact.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::Link;

/// How a side gets a new connection to its peer.
pub trait Reattach: Send + Sync {
    /// A new connection, handshaken, and how many bytes of this side's stream the peer has
    /// received; `received` is how many of the peer's this side has. `Err`: the stream ends, for
    /// that reason (the peer is gone, or did not come back in time). `ended()` turns true when
    /// the stream was closed meanwhile: give up then.
    fn reattach(&self, received: u64, ended: &dyn Fn() -> bool) -> Result<(Link, u64), String>;
}

/// Bytes written that a side keeps for its peer by default: what the two kernels' socket
/// buffers (and anything between) may hold unread when the connection breaks.
pub const DEFAULT_KEPT: usize = 32 << 20;

struct ReadSide {
    link: Link,
    generation: u64,
    received: u64,
}

struct WriteSide {
    link: Link,
    generation: u64,
    /// The last bytes written, up to `Stream::kept`.
    log: VecDeque<u8>,
    /// Bytes written since the stream began (`log` holds the last of them).
    written: u64,
}

impl WriteSide {
    /// Keeps the first `taken` bytes of `bufs`, which a write just took.
    fn keep(&mut self, bufs: &[IoSlice<'_>], taken: usize, limit: usize) {
        let mut left = taken;
        for buf in bufs {
            if left == 0 {
                break;
            }
            let part = &buf[..buf.len().min(left)];
            self.log.extend(part);
            left -= part.len();
        }
        self.written += taken as u64;
        if self.log.len() > limit {
            let surplus = self.log.len() - limit;
            self.log.drain(..surplus);
        }
    }
}

struct Status {
    /// The generation of the newest connection: recoveries of older ones have been done.
    generation: u64,
    /// A handle on the newest connection and its generation, to break it from outside either half.
    socket: Option<(u64, Link)>,
    closed: Option<String>,
}

struct Stream {
    read: Mutex<ReadSide>,
    write: Mutex<WriteSide>,
    /// Held by the one recovery under way.
    recovering: Mutex<()>,
    status: Mutex<Status>,
    reattach: Box<dyn Reattach>,
    kept: usize,
    /// The first connection, kept open for `as_fd` (what a caller watches or shuts down before
    /// any break).
    first: Link,
    tcp: bool,
    secured: bool,
    recoveries: AtomicU64,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn ended(reason: &str) -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, reason.to_string())
}

/// Whether an error only says "not now" (the caller tries again), not "broken".
fn transient(error: &io::Error) -> bool {
    matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted | io::ErrorKind::TimedOut)
}

/// Writes every slice (blocking), as `Write::write_all_vectored` would.
fn write_all_slices(link: &mut Link, mut slices: &mut [IoSlice<'_>]) -> io::Result<()> {
    IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        match link.write_vectored(slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => IoSlice::advance_slices(&mut slices, written),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// Makes a resumable stream over `link` (a socket just past the session's handshake); its
/// reading and writing halves, and a handle for the session's watchers. `kept`: the bytes written
/// kept for the peer.
pub fn resumable(link: Link, reattach: Box<dyn Reattach>, kept: usize) -> io::Result<(Link, Link, Handle)> {
    let (tcp, secured) = (link.is_tcp(), link.is_secured());
    let stream = Arc::new(Stream {
        read: Mutex::new(ReadSide { link: link.try_clone()?, generation: 0, received: 0 }),
        write: Mutex::new(WriteSide { link: link.try_clone()?, generation: 0, log: VecDeque::new(), written: 0 }),
        recovering: Mutex::new(()),
        status: Mutex::new(Status { generation: 0, socket: Some((0, link.try_clone()?)), closed: None }),
        reattach,
        kept,
        first: link,
        tcp,
        secured,
        recoveries: AtomicU64::new(0),
    });
    Ok((
        Link::ResumeIn(Half(stream.clone(), std::marker::PhantomData)),
        Link::ResumeOut(Half(stream.clone(), std::marker::PhantomData)),
        Handle(stream),
    ))
}

impl Stream {
    /// After a failure on connection `generation`: returns once a newer connection carries the
    /// stream (this thread made it, or another did), `Err` once the stream has ended.
    fn recover(&self, generation: u64) -> io::Result<()> {
        let _one = lock(&self.recovering);
        {
            let status = lock(&self.status);
            if let Some(reason) = &status.closed {
                return Err(ended(reason));
            }
            if status.generation != generation {
                return Ok(());
            }
            // Both halves stop using the broken connection (a blocked read or write returns).
            if let Some((_, socket)) = &status.socket {
                socket.shutdown();
            }
        }
        let mut read = lock(&self.read);
        let closed = || lock(&self.status).closed.is_some();
        let (link, peer_received) = match self.reattach.reattach(read.received, &closed) {
            Ok(attached) => attached,
            Err(reason) => {
                self.close(&reason);
                return Err(ended(&reason));
            }
        };
        let next = generation + 1;
        let clones = link.try_clone().and_then(|reader| Ok((reader, link.try_clone()?)));
        let (reader, watched) = match clones {
            Ok(clones) => clones,
            Err(error) => {
                let reason = format!("the new connection could not be shared: {error}");
                self.close(&reason);
                return Err(ended(&reason));
            }
        };
        (read.link, read.generation) = (reader, next);
        drop(read);
        lock(&self.status).socket = Some((next, watched));
        // The peer reads again meanwhile (its own recovery let its reader go before sending), so
        // two large sends again never wait for each other.
        let mut write = lock(&self.write);
        let oldest = write.written - write.log.len() as u64;
        if peer_received < oldest || peer_received > write.written {
            let reason =
                format!("the peer has received {peer_received} bytes, and only bytes {oldest}..{} are kept to send again", write.written);
            drop(write);
            self.close(&reason);
            return Err(ended(&reason));
        }
        let from = usize::try_from(peer_received - oldest).unwrap_or(usize::MAX);
        let (front, back) = write.log.as_slices();
        let (front, back) = if from <= front.len() { (&front[from..], back) } else { (&[][..], &back[from - front.len()..]) };
        let mut again = link;
        // A failure here is the new connection's: the next write or read recovers it, and the
        // bytes are still kept.
        let _ = write_all_slices(&mut again, &mut [IoSlice::new(front), IoSlice::new(back)]);
        (write.link, write.generation) = (again, next);
        drop(write);
        lock(&self.status).generation = next;
        self.recoveries.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Ends the stream for good: every read and write from now on fails with `reason`.
    fn close(&self, reason: &str) {
        let mut status = lock(&self.status);
        status.closed.get_or_insert_with(|| reason.to_string());
        if let Some((_, socket)) = &status.socket {
            socket.shutdown();
        }
    }
}

/// One half of a resumable stream; `K` says which.
pub struct Half<K>(Arc<Stream>, std::marker::PhantomData<K>);

/// Marks the reading half.
pub struct Reading;
/// Marks the writing half.
pub struct Writing;

/// The reading half (`Link::ResumeIn`).
pub type Reader = Half<Reading>;

/// The writing half (`Link::ResumeOut`).
pub type Writer = Half<Writing>;

/// What either half tells of the stream they share.
impl<K> Half<K> {
    pub(crate) fn stream_is_tcp(&self) -> bool {
        self.0.tcp
    }

    pub(crate) fn stream_is_secured(&self) -> bool {
        self.0.secured
    }

    pub(crate) fn first_fd(&self) -> BorrowedFd<'_> {
        self.0.first.as_fd()
    }

    pub(crate) fn close(&self) {
        self.0.close("the connection was shut down");
    }

    pub(crate) fn handle(&self) -> Handle {
        Handle(self.0.clone())
    }
}

impl Reader {
    pub(crate) fn read_with(&self, buf: &mut [u8], nonblocking: bool) -> io::Result<usize> {
        loop {
            let generation = {
                let mut side = lock(&self.0.read);
                let outcome = if nonblocking { side.link.read_nonblocking(buf) } else { side.link.read(buf) };
                match outcome {
                    Ok(read) if read > 0 || buf.is_empty() => {
                        side.received += read as u64;
                        return Ok(read);
                    }
                    Err(error) if transient(&error) => return Err(error),
                    // An end of stream or an error: the connection broke.
                    _ => side.generation,
                }
            };
            self.0.recover(generation)?;
        }
    }
}

impl Writer {
    pub(crate) fn write_with(&self, bufs: &[IoSlice<'_>], nonblocking: bool) -> io::Result<usize> {
        let total: usize = bufs.iter().map(|buf| buf.len()).sum();
        loop {
            let generation = {
                let mut side = lock(&self.0.write);
                let outcome = if nonblocking { side.link.write_vectored_nonblocking(bufs) } else { side.link.write_vectored(bufs) };
                match outcome {
                    Ok(written) if written > 0 || total == 0 => {
                        side.keep(bufs, written, self.0.kept);
                        return Ok(written);
                    }
                    Err(error) if transient(&error) => return Err(error),
                    _ => side.generation,
                }
            };
            self.0.recover(generation)?;
        }
    }

    /// Waits up to `timeout` until the connection can take more bytes (or breaks).
    pub(crate) fn wait_writable(&self, timeout: Duration) {
        // Held while polling: a recovery breaks the connection before it takes this lock, so the
        // poll returns at once then.
        let side = lock(&self.0.write);
        side.link.wait_writable(timeout);
    }
}

impl Read for Reader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_with(buf, false)
    }
}

impl Write for Writer {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_with(&[IoSlice::new(buf)], false)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.write_with(bufs, false)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What the session's watchers hold of a resumable stream.
#[derive(Clone)]
pub struct Handle(Arc<Stream>);

impl Handle {
    /// Ends the stream for good (`reason` is what later reads and writes fail with).
    pub fn close(&self, reason: &str) {
        self.0.close(reason);
    }

    /// The generation of the current connection (for `break_connection`).
    pub fn connection(&self) -> u64 {
        lock(&self.0.status).socket.as_ref().map_or(0, |(generation, _)| *generation)
    }

    /// Breaks connection `generation` if it is still the current one (a silent one, or one a
    /// returning peer replaces): the halves recover onto a new one. A newer one is left alone.
    pub fn break_connection(&self, generation: u64) {
        if let Some((current, socket)) = &lock(&self.0.status).socket
            && *current == generation
        {
            socket.shutdown();
        }
    }

    /// Why the stream ended, once it has.
    pub fn ended(&self) -> Option<String> {
        lock(&self.0.status).closed.clone()
    }

    /// Whether the connection broke and the stream waits for its peer to come back.
    pub fn recovering(&self) -> bool {
        self.0.recovering.try_lock().is_err()
    }

    /// How many times the stream moved to a new connection.
    pub fn recoveries(&self) -> u64 {
        self.0.recoveries.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;
    use std::sync::mpsc::{Receiver, Sender, channel};

    use super::*;

    /// One end of a test's connections: new ones come from the test through a channel, with the
    /// peer's received count (the handshake a real side makes is its `Reattach`'s business).
    struct Pipe {
        fresh: Mutex<Receiver<Link>>,
        told: Sender<u64>,
        hears: Mutex<Receiver<u64>>,
    }

    impl Reattach for Pipe {
        fn reattach(&self, received: u64, _ended: &dyn Fn() -> bool) -> Result<(Link, u64), String> {
            let link = lock(&self.fresh).recv_timeout(Duration::from_secs(10)).map_err(|_| "no new connection".to_string())?;
            self.told.send(received).map_err(|_| "peer gone".to_string())?;
            let peer = lock(&self.hears).recv_timeout(Duration::from_secs(10)).map_err(|_| "peer silent".to_string())?;
            Ok((link, peer))
        }
    }

    #[test]
    fn bytes_cross_breaks_exactly_once_in_order() {
        let (a, b) = UnixStream::pair().unwrap();
        let (to_a, fresh_a) = channel();
        let (to_b, fresh_b) = channel();
        let (a_tells, b_hears) = channel();
        let (b_tells, a_hears) = channel();
        let pipe_a = Pipe { fresh: Mutex::new(fresh_a), told: a_tells, hears: Mutex::new(a_hears) };
        let pipe_b = Pipe { fresh: Mutex::new(fresh_b), told: b_tells, hears: Mutex::new(b_hears) };
        let (mut a_in, mut a_out, a_handle) = resumable(Link::Unix(a), Box::new(pipe_a), 1 << 20).unwrap();
        let (mut b_in, mut b_out, _b_handle) = resumable(Link::Unix(b), Box::new(pipe_b), 1 << 20).unwrap();
        const LEN: usize = 4 << 20;
        let pattern = |offset: usize| (offset.wrapping_mul(31) ^ (offset >> 9)) as u8;
        // Breaks while both directions carry data: new pairs are handed to both sides each time.
        let breaker = std::thread::spawn(move || {
            for _ in 0..20 {
                std::thread::sleep(Duration::from_millis(15));
                let (x, y) = UnixStream::pair().unwrap();
                to_a.send(Link::Unix(x)).unwrap();
                to_b.send(Link::Unix(y)).unwrap();
                a_handle.break_connection(a_handle.connection());
            }
            a_handle.recoveries()
        });
        let writer = |mut out: Link| {
            std::thread::spawn(move || {
                let data: Vec<u8> = (0..LEN).map(pattern).collect();
                for piece in data.chunks(4093) {
                    out.write_all(piece).unwrap();
                    std::thread::sleep(Duration::from_micros(100));
                }
                out
            })
        };
        let reader = |mut input: Link| {
            std::thread::spawn(move || {
                let mut got = vec![0u8; LEN];
                input.read_exact(&mut got).unwrap();
                assert!(got.iter().enumerate().all(|(offset, byte)| *byte == pattern(offset)), "a byte lost, repeated or changed");
                input
            })
        };
        let (wa, wb) = (writer(a_out), writer(b_out));
        let (ra, rb) = (reader(a_in), reader(b_in));
        a_out = wa.join().unwrap();
        b_out = wb.join().unwrap();
        a_in = ra.join().unwrap();
        b_in = rb.join().unwrap();
        let recoveries = breaker.join().unwrap();
        assert!(recoveries >= 3, "only {recoveries} break(s) happened while data flowed");
        drop((a_in, a_out, b_in, b_out));
    }

    #[test]
    fn a_peer_missing_more_than_is_kept_ends_the_stream() {
        /// Comes back at once, its peer having received nothing.
        struct Forgetful(Mutex<Option<UnixStream>>);
        impl Reattach for Forgetful {
            fn reattach(&self, _received: u64, _ended: &dyn Fn() -> bool) -> Result<(Link, u64), String> {
                let (ours, theirs) = UnixStream::pair().map_err(|error| error.to_string())?;
                *lock(&self.0) = Some(theirs);
                Ok((Link::Unix(ours), 0))
            }
        }
        let (a, b) = UnixStream::pair().unwrap();
        let (_input, mut out, handle) = resumable(Link::Unix(a), Box::new(Forgetful(Mutex::new(None))), 16).unwrap();
        out.write_all(&[7u8; 64]).unwrap();
        drop(b);
        handle.break_connection(handle.connection());
        let error = out.write(&[1]).unwrap_err();
        assert!(error.to_string().contains("only bytes 48..64 are kept"), "{error}");
    }

    #[test]
    fn a_peer_that_does_not_come_back_ends_the_stream_with_the_reason() {
        struct Gone;
        impl Reattach for Gone {
            fn reattach(&self, _received: u64, _ended: &dyn Fn() -> bool) -> Result<(Link, u64), String> {
                Err("the server refused: no session 7".into())
            }
        }
        let (a, b) = UnixStream::pair().unwrap();
        let (mut input, _out, handle) = resumable(Link::Unix(a), Box::new(Gone), 1 << 20).unwrap();
        drop(b);
        let error = input.read(&mut [0u8; 8]).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ConnectionAborted);
        assert!(error.to_string().contains("no session 7"), "{error}");
        assert_eq!(handle.ended().as_deref(), Some("the server refused: no session 7"));
    }
}
