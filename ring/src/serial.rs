//! A virtio-serial port as a session's control path: a VM guest reaches its host's rpc-server
//! with no IP between them (QEMU connects the port, `-device virtserialport`, straight to the
//! server's Unix socket). A port is a character device, not a socket, so the session reads and
//! writes one end of a Unix socket pair ([`crate::Link::Serial`]) and two pump threads move the
//! bytes between the other end and the port. Doorbells ([`crate::Wake::Doorbell`]) travel the same
//! way. A port carries one session per connection QEMU makes, and the host learns of no exit in
//! the guest: a program that opens the port after another one's session finds that session
//! still owning the stream. Its hello ends it (the server takes anything but doorbells on a ring
//! session's stream as the end), the server closes the connection, QEMU connects the port again
//! (its chardev's `reconnect=SECONDS`), and the client says hello once more. Concurrent sessions
//! each need a port of their own (a port opens exclusively: a busy one is refused).

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::Path;

/// Opens the port at `path` (for example `/dev/virtio-ports/flyt.0`) and starts its pumps: the
/// session's end of the socket pair.
pub fn open_port(path: &Path) -> io::Result<UnixStream> {
    let port = File::options().read(true).write(true).open(path)?;
    // A port whose host end is not connected reports a hang-up. What is written to it then is
    // not lost: QEMU delivers it once it connects again, where it would land in the middle of
    // the next session's stream. So nothing is written until the host is there.
    let mut poll = libc::pollfd { fd: std::os::fd::AsRawFd::as_raw_fd(&port), events: libc::POLLOUT, revents: 0 };
    // SAFETY: one valid pollfd on the port this function holds open; no timeout.
    if unsafe { libc::poll(&mut poll, 1, 0) } > 0 && poll.revents & libc::POLLHUP != 0 {
        return Err(io::Error::new(io::ErrorKind::NotConnected, "its host end is not connected"));
    }
    let (session, pump_end) = UnixStream::pair()?;
    let port_in = port.try_clone()?;
    let pump_in = pump_end.try_clone()?;
    spawn("flyt-serial-in", port_in, pump_in, copy)?;
    spawn("flyt-serial-out", port, pump_end, |port, socket| copy(socket, port))?;
    Ok(session)
}

/// Runs one direction until either side ends, then shuts the socket pair down so the session
/// (and the other pump, which then ends too) sees the end at once.
fn spawn(
    name: &str,
    port: File,
    socket: UnixStream,
    pump: impl FnOnce(&mut File, &mut UnixStream) -> io::Result<()> + Send + 'static,
) -> io::Result<()> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let (mut port, mut socket) = (port, socket);
            let _ = pump(&mut port, &mut socket);
            let _ = socket.shutdown(Shutdown::Both);
        })
        .map(drop)
}

/// Copies until the source ends (a port reads 0 bytes when the host end closed); a short read is
/// passed on at once (a reply must not wait for a full buffer).
fn copy(from: &mut impl Read, to: &mut impl Write) -> io::Result<()> {
    let mut buffer = vec![0u8; 64 << 10];
    loop {
        let read = match from.read(&mut buffer) {
            Ok(0) => return Ok(()),
            Ok(read) => read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        to.write_all(&buffer[..read])?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FIFO opened read-write stands in for a port whose host echoes: what the session writes
    /// comes back to it through both pumps.
    #[test]
    fn a_port_carries_both_directions() {
        let dir = std::env::temp_dir().join(format!("flyt-serial-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let fifo = dir.join("port");
        let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: mkfifo on a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let mut session = open_port(&fifo).expect("open the port");
        session.write_all(b"hello through the port").expect("write");
        let mut echoed = [0u8; 22];
        session.read_exact(&mut echoed).expect("echo");
        assert_eq!(&echoed, b"hello through the port");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
