//! Shareable handles of physical allocations between workers (`cuMemExportToShareableHandle` with
//! a POSIX file descriptor, as NCCL and PyTorch share memory between processes on one GPU).
//!
//! The driver's descriptor never leaves the server: a tenant holding a descriptor of the
//! driver's device files could talk to the driver past Flyt. The exporting worker keeps the
//! descriptor, under a random token, and serves it on an abstract Unix socket of its own; what the
//! app gets (`Shareable`) names that socket and the token. A worker importing it (any rpc-server
//! on the host) connects, presents the token and receives the descriptor with `SCM_RIGHTS`.
//! Holding the token is the capability, as holding the descriptor is natively. An export lives
//! until the exporter releases the allocation or its session ends (the worker exits).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};

const MAGIC: &[u8; 8] = b"FLYTSHR1";
const TOKEN_LEN: usize = 16;
/// Longest socket name a shareable may carry (`flyt-vmm-PID-NONCE` is far shorter).
const MAX_NAME: usize = 64;
const NAME_PREFIX: &str = "flyt-vmm-";
/// How long either side waits for the other on the socket.
const PEER_TIMEOUT: Duration = Duration::from_secs(2);

type Token = [u8; TOKEN_LEN];

struct Export {
    fd: OwnedFd,
    size: u64,
    /// The exporting app's id of the allocation, so releasing it revokes the export.
    handle: u64,
}

/// This worker's exports and the socket that serves them (started with the first export).
#[derive(Default)]
pub struct Exports {
    table: Arc<Mutex<HashMap<Token, Export>>>,
    socket_name: OnceLock<String>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn random_token() -> io::Result<Token> {
    let mut token = [0; TOKEN_LEN];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut token)?;
    Ok(token)
}

/// What the exporter hands out: the socket's name and the token.
fn encode(name: &str, token: &Token) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAGIC.len() + TOKEN_LEN + 1 + name.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(token);
    out.push(name.len() as u8);
    out.extend_from_slice(name.as_bytes());
    out
}

/// The socket name and token of a shareable from a client (hostile input: checked).
fn decode(shareable: &[u8]) -> Option<(&str, Token)> {
    let rest = shareable.strip_prefix(MAGIC.as_slice())?;
    let (token, rest) = rest.split_at_checked(TOKEN_LEN)?;
    let (&len, name) = rest.split_first()?;
    let name = std::str::from_utf8(name).ok().filter(|name| name.len() == usize::from(len) && name.len() <= MAX_NAME)?;
    name.starts_with(NAME_PREFIX).then_some((name, token.try_into().ok()?))
}

impl Exports {
    /// Keeps `fd` (the driver's descriptor of the app's allocation `handle`, `size` bytes) for
    /// importers; what the app is to hold.
    pub fn publish(&self, handle: u64, fd: OwnedFd, size: u64) -> io::Result<Vec<u8>> {
        let name = self.socket()?;
        let token = random_token()?;
        lock(&self.table).insert(token, Export { fd, size, handle });
        Ok(encode(name, &token))
    }

    /// Ends every export of `handle` (the app released it): no one can import it any more.
    pub fn revoke(&self, handle: u64) {
        lock(&self.table).retain(|_, export| export.handle != handle);
    }

    /// Whether any allocation of this session is exported (others may have imported it).
    pub fn any(&self) -> bool {
        !lock(&self.table).is_empty()
    }

    /// The serving socket's name, bound (and its thread started) on first use.
    fn socket(&self) -> io::Result<&str> {
        if let Some(name) = self.socket_name.get() {
            return Ok(name);
        }
        let nonce = random_token()?;
        let name = format!("{NAME_PREFIX}{}-{:016x}", std::process::id(), u64::from_le_bytes(nonce[..8].try_into().unwrap_or_default()));
        let listener = UnixListener::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes())?)?;
        let table = self.table.clone();
        std::thread::Builder::new().name("flyt-exports".into()).spawn(move || {
            for stream in listener.incoming().flatten() {
                if let Err(error) = serve_one(stream, &table) {
                    tracing::debug!(%error, "a shareable handle request failed");
                }
            }
        })?;
        Ok(self.socket_name.get_or_init(|| name))
    }
}

/// Answers one importer: the export's size and descriptor, or a size of 0 for an unknown token.
fn serve_one(mut stream: UnixStream, table: &Mutex<HashMap<Token, Export>>) -> io::Result<()> {
    stream.set_read_timeout(Some(PEER_TIMEOUT))?;
    stream.set_write_timeout(Some(PEER_TIMEOUT))?;
    let mut token = [0; TOKEN_LEN];
    stream.read_exact(&mut token)?;
    let table = lock(table);
    let Some(export) = table.get(&token) else {
        return stream.write_all(&0u64.to_le_bytes());
    };
    let size = export.size.to_le_bytes();
    let fds = [export.fd.as_raw_fd()];
    sendmsg::<()>(stream.as_raw_fd(), &[io::IoSlice::new(&size)], &[ControlMessage::ScmRights(&fds)], MsgFlags::MSG_NOSIGNAL, None)?;
    Ok(())
}

/// Fetches the descriptor a shareable names from its exporter: the descriptor and the
/// allocation's size. `None` for anything that is not a live export.
pub fn fetch(shareable: &[u8]) -> Option<(OwnedFd, u64)> {
    let (name, token) = decode(shareable)?;
    let mut stream = UnixStream::connect_addr(&SocketAddr::from_abstract_name(name.as_bytes()).ok()?).ok()?;
    stream.set_read_timeout(Some(PEER_TIMEOUT)).ok()?;
    stream.set_write_timeout(Some(PEER_TIMEOUT)).ok()?;
    stream.write_all(&token).ok()?;
    let mut size = [0u8; 8];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let mut iov = [io::IoSliceMut::new(&mut size)];
    let message = recvmsg::<()>(stream.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC).ok()?;
    let received = message.bytes;
    let mut fd = None;
    for cmsg in message.cmsgs().ok()? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            for raw in fds {
                // SAFETY: SCM_RIGHTS just installed `raw` in this process; nothing else owns it.
                let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                fd.get_or_insert(owned);
            }
        }
    }
    let size = u64::from_le_bytes(size);
    if received != 8 || size == 0 {
        return None;
    }
    Some((fd?, size))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memfd() -> OwnedFd {
        let fd = nix::sys::memfd::memfd_create("flyt-test-shareable", nix::sys::memfd::MFdFlags::MFD_CLOEXEC).expect("memfd");
        let file = std::fs::File::from(fd);
        file.set_len(4096).expect("size");
        file.into()
    }

    #[test]
    fn an_export_is_fetched_with_its_token_and_not_after_its_revocation() {
        let exports = Exports::default();
        let shareable = exports.publish(7, memfd(), 4096).expect("publish");
        let (fd, size) = fetch(&shareable).expect("fetched");
        assert_eq!(size, 4096);
        assert_eq!(std::fs::File::from(fd).metadata().expect("fstat").len(), 4096);
        let mut forged = shareable.clone();
        forged[MAGIC.len()] ^= 1;
        assert!(fetch(&forged).is_none(), "a wrong token fetches nothing");
        assert!(exports.any());
        exports.revoke(7);
        assert!(!exports.any());
        assert!(fetch(&shareable).is_none(), "a revoked export fetches nothing");
    }

    #[test]
    fn malformed_shareables_are_refused_without_connecting() {
        for bad in [&b""[..], b"FLYTSHR1", b"FLYTSHR1aaaaaaaaaaaaaaaa\x05other", b"FLYTSHR1aaaaaaaaaaaaaaaa\x20flyt-vmm-"] {
            assert!(decode(bad).is_none(), "{bad:?}");
        }
        assert!(decode(&encode("flyt-vmm-1-2", &[3; TOKEN_LEN])).is_some());
    }
}
