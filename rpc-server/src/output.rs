//! What the session's kernels print. The CUDA driver writes device `printf` output to the
//! process's standard output and a failed device `assert`'s message to its standard error, at
//! the calls where it flushes the device's printf buffer (synchronizations, blocking copies,
//! teardown). A worker serves one app, so it points its descriptors 1 and 2 at pipes, keeps
//! everything written there, and hands it to the session at those same calls, which send it to
//! the app just before the reply. The worker's own log lines go to the original standard
//! error (`log_writer`), never to the app.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

/// Largest amount kept per stream between flushes (CUDA's default printf FIFO is 1 MiB, the
/// largest settable far more; beyond this the oldest bytes are dropped, with a note).
const MAX_KEPT: usize = 64 << 20;

/// The captured standard output and standard error of this process.
pub struct Capture {
    streams: [Captured; 2],
}

struct Captured {
    pipe: File,
    kept: Mutex<Vec<u8>>,
}

impl Captured {
    /// Moves whatever the pipe holds into `kept`, without blocking.
    fn drain(&self, kept: &mut Vec<u8>) {
        let mut chunk = [0u8; 64 << 10];
        loop {
            match (&self.pipe).read(&mut chunk) {
                Ok(0) => return,
                Ok(read) => {
                    kept.extend_from_slice(&chunk[..read]);
                    if kept.len() > MAX_KEPT {
                        let excess = kept.len() - MAX_KEPT;
                        kept.drain(..excess);
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }
}

fn pipe_nonblocking() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 just created both descriptors; nothing else owns them.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // Only the read end is non-blocking: the driver's writes must never fail with EAGAIN.
    // SAFETY: fcntl on a descriptor this function owns.
    unsafe {
        let flags = libc::fcntl(read.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(read.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
        // A larger pipe means the drain thread wakes less often during a big printf burst.
        libc::fcntl(read.as_raw_fd(), libc::F_SETPIPE_SZ, 1 << 20);
    }
    Ok((read, write))
}

impl Capture {
    /// Points descriptors 1 and 2 at pipes; returns the capture and a handle on the original
    /// standard error for the worker's own logs.
    pub fn install() -> io::Result<(Arc<Self>, File)> {
        // SAFETY: dup of descriptor 2, which the process holds for its whole life.
        let log = unsafe { libc::dup(2) };
        if log < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `dup` just returned this descriptor; nothing else owns it.
        let log = unsafe { File::from_raw_fd(log) };
        // SAFETY: setting FD_CLOEXEC on a descriptor this function owns.
        unsafe { libc::fcntl(log.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
        let mut streams = Vec::with_capacity(2);
        for target in [1, 2] {
            let (read, write) = pipe_nonblocking()?;
            // SAFETY: dup2 onto the standard descriptor; `write` stays owned here and is closed
            // at the end of this iteration, leaving only the standard descriptor on the pipe.
            if unsafe { libc::dup2(write.as_raw_fd(), target) } < 0 {
                return Err(io::Error::last_os_error());
            }
            streams.push(Captured { pipe: File::from(read), kept: Mutex::new(Vec::new()) });
        }
        let [stdout, stderr]: [Captured; 2] = streams.try_into().map_err(|_| io::Error::other("two pipes"))?;
        let capture = Arc::new(Self { streams: [stdout, stderr] });
        let drainer = capture.clone();
        // The driver may print more than a pipe holds while a synchronize is still running (a
        // large printf FIFO): keep the pipes empty so its writes never block.
        std::thread::Builder::new().name("flyt-output".into()).spawn(move || drainer.drain_forever())?;
        Ok((capture, log))
    }

    fn drain_forever(&self) {
        loop {
            let mut polls = [
                libc::pollfd { fd: self.streams[0].pipe.as_raw_fd(), events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: self.streams[1].pipe.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            ];
            // SAFETY: two valid pollfds on descriptors this capture owns.
            let ready = unsafe { libc::poll(polls.as_mut_ptr(), 2, -1) };
            if ready < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                return;
            }
            for (stream, poll) in self.streams.iter().zip(polls) {
                if poll.revents & libc::POLLIN != 0 {
                    let mut kept = stream.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    stream.drain(&mut kept);
                }
            }
        }
    }

    /// Everything printed so far, as `(stdout, stderr)`, taken: C stdio buffers are flushed and
    /// the pipes read dry first, so nothing written before this call is left behind.
    pub fn take(&self) -> (Vec<u8>, Vec<u8>) {
        // SAFETY: fflush(NULL) flushes every C output stream of the process; always allowed.
        unsafe { libc::fflush(std::ptr::null_mut()) };
        let mut taken = self.streams.iter().map(|stream| {
            let mut kept = stream.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            stream.drain(&mut kept);
            std::mem::take(&mut *kept)
        });
        (taken.next().unwrap_or_default(), taken.next().unwrap_or_default())
    }
}
