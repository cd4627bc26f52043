//! The byte stream between a shim and its rpc-server: a TCP or Unix socket, a VM guest's serial
//! port (through a socket pair), or one half of the
//! shared-memory rings (holding the socket open to tell when the peer is gone). Both ends use this
//! one type.

use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use crate::{RingReader, RingWriter};

/// A data-plane connection.
pub enum Link {
    Tcp(TcpStream),
    Unix(UnixStream),
    /// TCP under TLS: the local end of a socket pair whose other end a pump thread encrypts to
    /// and decrypts from the TCP socket (`crate::tls`). Read and written as a Unix socket; a TCP
    /// session in every other respect (the peer is remote).
    Secured(UnixStream),
    /// A VM guest's virtio-serial port to its host's server: the local end of a socket pair whose
    /// other end pump threads connect to the port (`crate::serial`). Read and written as a Unix
    /// socket; the peer runs on another kernel (no descriptor passing, no shared futex).
    Serial(UnixStream),
    /// The rings' reading half; the socket stays open to tell when the peer is gone.
    RingIn(RingReader, Arc<Link>),
    /// The rings' writing half.
    RingOut(RingWriter, Arc<Link>),
    /// The reading half of a TCP session's stream that outlives its connection (`crate::resume`).
    ResumeIn(crate::resume::Reader),
    /// Its writing half.
    ResumeOut(crate::resume::Writer),
}

fn wrong_half() -> io::Error {
    io::Error::other("wrong half of the shared-memory rings")
}

impl Link {
    /// Rebuilds a socket from a descriptor (one passed between processes).
    pub fn from_fd(fd: OwnedFd, tcp: bool) -> Self {
        if tcp { Self::Tcp(TcpStream::from(fd)) } else { Self::Unix(UnixStream::from(fd)) }
    }

    /// Rebuilds the local end of a TLS pump from a descriptor (one passed between processes).
    pub fn secured_from_fd(fd: OwnedFd) -> Self {
        Self::Secured(UnixStream::from(fd))
    }

    /// Whether this is the local end of a TLS pump.
    pub fn is_secured(&self) -> bool {
        match self {
            Self::Secured(_) => true,
            Self::Tcp(_) | Self::Unix(_) | Self::Serial(_) => false,
            Self::RingIn(_, socket) | Self::RingOut(_, socket) => socket.is_secured(),
            Self::ResumeIn(reader) => reader.stream_is_secured(),
            Self::ResumeOut(writer) => writer.stream_is_secured(),
        }
    }

    /// A second handle on the same socket (one reads, the other writes).
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(match self {
            Self::Tcp(stream) => Self::Tcp(stream.try_clone()?),
            Self::Unix(stream) => Self::Unix(stream.try_clone()?),
            Self::Secured(stream) => Self::Secured(stream.try_clone()?),
            Self::Serial(stream) => Self::Serial(stream.try_clone()?),
            Self::RingIn(..) | Self::RingOut(..) | Self::ResumeIn(..) | Self::ResumeOut(..) => {
                return Err(io::Error::other("ring and resumable halves are not cloned"));
            }
        })
    }

    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Self::Tcp(stream) => stream.set_read_timeout(timeout),
            Self::Unix(stream) | Self::Secured(stream) | Self::Serial(stream) => stream.set_read_timeout(timeout),
            Self::RingIn(_, socket) | Self::RingOut(_, socket) => socket.set_read_timeout(timeout),
            // The stream waits for its connection's return itself.
            Self::ResumeIn(_) | Self::ResumeOut(_) => Ok(()),
        }
    }

    /// Whether the peer is remote (another host or kernel): TCP, or a guest's serial port.
    pub fn is_tcp(&self) -> bool {
        match self {
            Self::Tcp(_) | Self::Secured(_) | Self::Serial(_) => true,
            Self::Unix(_) => false,
            Self::RingIn(_, socket) | Self::RingOut(_, socket) => socket.is_tcp(),
            Self::ResumeIn(reader) => reader.stream_is_tcp(),
            Self::ResumeOut(writer) => writer.stream_is_tcp(),
        }
    }

    /// Reads what has arrived without waiting: `WouldBlock` when nothing has.
    pub fn read_nonblocking(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::RingIn(reader, _) => reader.try_read(buf),
            Self::ResumeIn(reader) => reader.read_with(buf, true),
            Self::RingOut(..) | Self::ResumeOut(..) => Err(wrong_half()),
            Self::Tcp(_) | Self::Unix(_) | Self::Secured(_) | Self::Serial(_) => {
                // SAFETY: `buf` is valid for writes of its length; the descriptor is this
                // link's open socket.
                let read = unsafe { libc::recv(self.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
                usize::try_from(read).map_err(|_| io::Error::last_os_error())
            }
        }
    }

    /// Writes what fits without waiting: `WouldBlock` when a socket's buffer is full. The rings
    /// wait as usual (their messages are small; bulk data goes through the segment).
    pub fn write_vectored_nonblocking(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Self::Tcp(_) | Self::Unix(_) | Self::Secured(_) | Self::Serial(_) => {
                self.send_vectored(bufs, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
            }
            Self::ResumeOut(writer) => writer.write_with(bufs, true),
            _ => self.write_vectored(bufs),
        }
    }

    /// Waits up to `timeout` until a socket can take more bytes.
    pub fn wait_writable(&self, timeout: Duration) {
        if let Self::ResumeOut(writer) = self {
            return writer.wait_writable(timeout);
        }
        let mut poll = libc::pollfd { fd: self.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
        let millis = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one valid pollfd on this link's open socket.
        unsafe { libc::poll(&mut poll, 1, millis) };
    }

    fn send_vectored(&mut self, bufs: &[IoSlice<'_>], flags: libc::c_int) -> io::Result<usize> {
        // SAFETY: `msghdr` is plain data; all-zero is a valid empty header.
        let mut header: libc::msghdr = unsafe { std::mem::zeroed() };
        header.msg_iov = bufs.as_ptr().cast_mut().cast();
        header.msg_iovlen = bufs.len().min(1024);
        // SAFETY: `IoSlice` is ABI-compatible with `iovec` (documented by std); the slices
        // outlive the call; the descriptor is this link's open socket.
        let sent = unsafe { libc::sendmsg(self.as_raw_fd(), &header, flags) };
        usize::try_from(sent).map_err(|_| io::Error::last_os_error())
    }

    /// Waits up to `timeout` for the peer to close the socket, discarding what it still sends
    /// (a ring doorbell); whether it did.
    pub fn wait_peer_gone(&self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let mut scrap = [0u8; 256];
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            let mut poll = libc::pollfd { fd: self.as_raw_fd(), events: libc::POLLIN | libc::POLLRDHUP, revents: 0 };
            let millis = libc::c_int::try_from(left.as_millis()).unwrap_or(libc::c_int::MAX).max(1);
            // SAFETY: one valid pollfd on this link's open socket.
            if unsafe { libc::poll(&mut poll, 1, millis) } <= 0 {
                continue;
            }
            // SAFETY: `scrap` is valid for writes of its length; the descriptor is this link's
            // open socket.
            let read = unsafe { libc::recv(self.as_raw_fd(), scrap.as_mut_ptr().cast(), scrap.len(), libc::MSG_DONTWAIT) };
            match read {
                0 => return true,
                n if n > 0 => {}
                _ => match io::Error::last_os_error().kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => {}
                    _ => return true,
                },
            }
        }
    }

    /// For a ring half: leaves the ring area as it is when the pair is dropped, for the rings of
    /// the session's next connection over the same segment.
    pub fn retire_rings(&self) {
        match self {
            Self::RingIn(reader, _) => reader.retire(),
            Self::RingOut(writer, _) => writer.retire(),
            Self::Tcp(_) | Self::Unix(_) | Self::Secured(_) | Self::Serial(_) | Self::ResumeIn(_) | Self::ResumeOut(_) => {}
        }
    }

    /// The handle on a resumable stream's half (`crate::resume`), for the session's watchers.
    pub fn resume_handle(&self) -> Option<crate::resume::Handle> {
        match self {
            Self::ResumeIn(reader) => Some(reader.handle()),
            Self::ResumeOut(writer) => Some(writer.handle()),
            _ => None,
        }
    }

    /// Shuts the socket down both ways (the peer sees the end at once).
    pub fn shutdown(&self) {
        match self {
            Self::Tcp(stream) => drop(stream.shutdown(std::net::Shutdown::Both)),
            Self::Unix(stream) | Self::Secured(stream) | Self::Serial(stream) => drop(stream.shutdown(std::net::Shutdown::Both)),
            Self::RingIn(_, socket) | Self::RingOut(_, socket) => socket.shutdown(),
            // A resumable stream ends for good.
            Self::ResumeIn(reader) => reader.close(),
            Self::ResumeOut(writer) => writer.close(),
        }
    }
}

impl AsFd for Link {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Self::Tcp(stream) => stream.as_fd(),
            Self::Unix(stream) | Self::Secured(stream) | Self::Serial(stream) => stream.as_fd(),
            Self::RingIn(_, socket) | Self::RingOut(_, socket) => socket.as_fd(),
            // The first connection's socket (the current one changes after a break).
            Self::ResumeIn(reader) => reader.first_fd(),
            Self::ResumeOut(writer) => writer.first_fd(),
        }
    }
}

impl AsRawFd for Link {
    fn as_raw_fd(&self) -> RawFd {
        self.as_fd().as_raw_fd()
    }
}

impl Read for Link {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Tcp(stream) => stream.read(buf),
            Self::Unix(stream) | Self::Secured(stream) | Self::Serial(stream) => stream.read(buf),
            Self::RingIn(reader, _) => reader.read(buf),
            Self::ResumeIn(reader) => reader.read_with(buf, false),
            Self::RingOut(..) | Self::ResumeOut(..) => Err(wrong_half()),
        }
    }
}

impl Write for Link {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    /// Sockets are written with `sendmsg(MSG_NOSIGNAL)`: a peer that went away must be an error,
    /// never a SIGPIPE (the shim lives in someone else's process).
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Self::RingOut(writer, _) => return writer.write_vectored(bufs),
            Self::ResumeOut(writer) => return writer.write_with(bufs, false),
            Self::RingIn(..) | Self::ResumeIn(..) => return Err(wrong_half()),
            Self::Tcp(_) | Self::Unix(_) | Self::Secured(_) | Self::Serial(_) => {}
        }
        self.send_vectored(bufs, libc::MSG_NOSIGNAL)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
