//! Shareable handles between workers: physical allocations (`cuMemExportToShareableHandle` with
//! a POSIX file descriptor, as NCCL and PyTorch share memory between processes on one GPU), memory
//! pools (`cuMemPoolExportToShareableHandle`) and their allocations (`cuMemPoolExportPointer`).
//!
//! The driver's descriptor never leaves the server: a tenant holding a descriptor of the
//! driver's device files could talk to the driver past Flyt. The exporting worker keeps the
//! descriptor, under a random token, and serves it on an abstract Unix socket of its own; what the
//! app gets (`Shareable`) names that socket and the token. A worker importing it (any rpc-server
//! on the host) connects, presents the token and receives the descriptor with `SCM_RIGHTS`.
//! Holding the token is the capability, as holding the descriptor is natively. An export lives
//! until the exporter releases the allocation (or destroys the pool) or its session ends (the
//! worker exits).
//!
//! The same socket takes descriptors the other way (`flyt_protocol::deposit`): the session's app
//! hands its worker a file it maps itself, under a one-use ticket the worker issued.
//!
//! A pool allocation's export data (the driver's 64 bytes) stays in the exporting worker too,
//! under a token of its own: the app's `CUmemPoolPtrExportData` holds that token. An importer
//! asks for it with a token of the allocation's pool besides (natively, export data is of use
//! only with the pool it came from, imported), and gets the driver's bytes and the allocation's
//! size. Exporting one allocation again gives the same data, as the driver's data is the same.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use flyt_protocol::deposit;
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};

const MAGIC: &[u8; 8] = b"FLYTSHR1";
/// What a pool allocation's export data (the app's 64 bytes) opens with.
const POINTER_MAGIC: &[u8; 8] = b"FLYTPTR1";
/// `CUmemPoolPtrExportData`'s size.
pub const EXPORT_DATA_LEN: usize = 64;
const TOKEN_LEN: usize = deposit::TOKEN_LEN;
/// Longest socket name a shareable may carry (`flyt-vmm-PID-NONCE` is far shorter).
const MAX_NAME: usize = 64;
/// Every exporting worker's socket (physical allocations and pools alike).
const NAME_PREFIX: &str = deposit::SOCKET_PREFIX;
/// Tickets for deposits a worker keeps at most: an app registers one file at a time, so older
/// unused ones are dropped.
const MAX_TICKETS: usize = 8;
/// How long either side waits for the other on the socket.
const PEER_TIMEOUT: Duration = Duration::from_secs(2);
/// An importer's request: the token, the kind it expects, and (for a pool allocation) a token of
/// its pool's.
const REQUEST_LEN: usize = deposit::REQUEST_LEN;
/// The exporter's answer: whether it shares it, the size, and a pool allocation's export data
/// (zeros otherwise); a descriptor rides along with `SCM_RIGHTS`.
const REPLY_LEN: usize = 1 + 8 + EXPORT_DATA_LEN;

type Token = [u8; TOKEN_LEN];

/// What an export shares, as its importer asks for it: a token of one kind opens no other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A physical allocation's descriptor (`cuMemCreate`).
    Physical = 1,
    /// A memory pool's descriptor.
    Pool = 2,
    /// A pool allocation's export data.
    PoolPointer = 3,
}

enum Shared {
    /// The driver's descriptor of a physical allocation or a pool.
    Descriptor(OwnedFd),
    /// The driver's export data of the pool allocation at `ptr`.
    Pointer { data: [u8; EXPORT_DATA_LEN], ptr: u64 },
}

struct Export {
    kind: Kind,
    shared: Shared,
    /// The allocation's size (0 for a pool).
    size: u64,
    /// The exporting app's id of what it belongs to (the physical allocation, or the pool of a
    /// pool or pool allocation), so releasing it revokes the export.
    owner: u64,
}

/// Deposit tickets issued to the session's app, oldest first, each with the descriptor once
/// deposited.
type Tickets = VecDeque<(Token, Option<OwnedFd>)>;

/// This worker's exports and the socket that serves them (started with the first export or
/// ticket).
#[derive(Default)]
pub struct Exports {
    table: Arc<Mutex<HashMap<Token, Export>>>,
    tickets: Arc<Mutex<Tickets>>,
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

/// The app's export data of a pool allocation: the magic and the token, zeros after.
fn encode_pointer(token: &Token) -> [u8; EXPORT_DATA_LEN] {
    let mut out = [0; EXPORT_DATA_LEN];
    out[..POINTER_MAGIC.len()].copy_from_slice(POINTER_MAGIC);
    out[POINTER_MAGIC.len()..POINTER_MAGIC.len() + TOKEN_LEN].copy_from_slice(token);
    out
}

/// The token of export data from a client (hostile input: the exact length, the magic and the
/// zeros after the token are checked).
fn decode_pointer(data: &[u8]) -> Option<Token> {
    let rest = data.strip_prefix(POINTER_MAGIC.as_slice()).filter(|_| data.len() == EXPORT_DATA_LEN)?;
    let (token, padding) = rest.split_at_checked(TOKEN_LEN)?;
    padding.iter().all(|byte| *byte == 0).then_some(token.try_into().ok()?)
}

impl Exports {
    /// Keeps `fd` (the driver's descriptor of the app's physical allocation or pool `owner`,
    /// `size` bytes for an allocation) for importers; what the app is to hold.
    pub fn publish(&self, kind: Kind, owner: u64, fd: OwnedFd, size: u64) -> io::Result<Vec<u8>> {
        let name = self.socket()?;
        let token = random_token()?;
        lock(&self.table).insert(token, Export { kind, shared: Shared::Descriptor(fd), size, owner });
        Ok(encode(name, &token))
    }

    /// Keeps the driver's export `data` of the allocation at `ptr` (`size` bytes) of the app's
    /// pool `pool` for importers holding a token of that pool; the export data the app is to
    /// hold (the same for every export of one allocation).
    pub fn publish_pointer(&self, pool: u64, ptr: u64, data: [u8; EXPORT_DATA_LEN], size: u64) -> io::Result<[u8; EXPORT_DATA_LEN]> {
        self.socket()?;
        let mut table = lock(&self.table);
        let known = table.iter().find(|(_, export)| matches!(export.shared, Shared::Pointer { ptr: at, .. } if at == ptr));
        if let Some((token, _)) = known {
            return Ok(encode_pointer(token));
        }
        let token = random_token()?;
        table.insert(token, Export { kind: Kind::PoolPointer, shared: Shared::Pointer { data, ptr }, size, owner: pool });
        Ok(encode_pointer(&token))
    }

    /// Ends every export of `owner` (the app released the allocation or destroyed the pool, with
    /// its allocations' exports): no one can import it any more.
    pub fn revoke(&self, owner: u64) {
        lock(&self.table).retain(|_, export| export.owner != owner);
    }

    /// Ends the export of the pool allocation at `ptr` (the app freed it).
    pub fn revoke_pointer(&self, ptr: u64) {
        lock(&self.table).retain(|_, export| !matches!(export.shared, Shared::Pointer { ptr: at, .. } if at == ptr));
    }

    /// Ends every export (the device reset: what they shared is gone).
    pub fn clear(&self) {
        lock(&self.table).clear();
    }

    /// Whether anything of this session is exported (others may have imported it).
    pub fn any(&self) -> bool {
        !lock(&self.table).is_empty()
    }

    /// A one-use ticket for the app to deposit a descriptor with: the socket's name and the token.
    pub fn ticket(&self) -> io::Result<(String, Token)> {
        let name = self.socket()?.to_owned();
        let token = random_token()?;
        let mut tickets = lock(&self.tickets);
        if tickets.len() >= MAX_TICKETS {
            tickets.pop_front();
        }
        tickets.push_back((token, None));
        Ok((name, token))
    }

    /// The descriptor deposited under `token`, which is used up.
    pub fn take_deposit(&self, token: &Token) -> Option<OwnedFd> {
        let mut tickets = lock(&self.tickets);
        let index = tickets.iter().position(|(issued, fd)| issued == token && fd.is_some())?;
        tickets.remove(index)?.1
    }

    /// The serving socket's name, bound (and its thread started) on first use.
    fn socket(&self) -> io::Result<&str> {
        if let Some(name) = self.socket_name.get() {
            return Ok(name);
        }
        let nonce = random_token()?;
        let name = format!("{NAME_PREFIX}{}-{:016x}", std::process::id(), u64::from_le_bytes(nonce[..8].try_into().unwrap_or_default()));
        let listener = UnixListener::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes())?)?;
        let (table, tickets) = (self.table.clone(), self.tickets.clone());
        std::thread::Builder::new().name("flyt-exports".into()).spawn(move || {
            for stream in listener.incoming().flatten() {
                if let Err(error) = serve_one(stream, &table, &tickets) {
                    tracing::debug!(%error, "a shareable handle request failed");
                }
            }
        })?;
        Ok(self.socket_name.get_or_init(|| name))
    }
}

/// Whether `request` names a live export of the kind it expects, and for a pool allocation, a
/// live export of its pool besides: that export, or `None`.
fn find<'a>(table: &'a HashMap<Token, Export>, request: &[u8; REQUEST_LEN]) -> Option<&'a Export> {
    let (token, rest) = request.split_at(TOKEN_LEN);
    let (kind, pool_token) = rest.split_first()?;
    let export = table.get(token).filter(|export| export.kind as u8 == *kind)?;
    if export.kind == Kind::PoolPointer {
        let pool = table.get(pool_token).filter(|pool| pool.kind == Kind::Pool)?;
        (pool.owner == export.owner).then_some(())?;
    }
    Some(export)
}

/// Answers one importer (the export's size, its data or descriptor, or a refusal for anything
/// that is not a live export of the kind asked for) or one deposit (kept if its ticket is
/// waiting for one).
fn serve_one(stream: UnixStream, table: &Mutex<HashMap<Token, Export>>, tickets: &Mutex<Tickets>) -> io::Result<()> {
    stream.set_read_timeout(Some(PEER_TIMEOUT))?;
    stream.set_write_timeout(Some(PEER_TIMEOUT))?;
    let (request, fd) = read_request(&stream)?;
    if request[TOKEN_LEN] == deposit::KIND {
        return accept_deposit(stream, &request, fd, tickets);
    }
    drop(fd);
    serve_export(stream, &request, table)
}

/// What an export that could not be served (no socket, no randomness) is to the app: the OS
/// failure it is, logged as the export of `what`.
pub fn unserved(what: &'static str) -> impl FnOnce(io::Error) -> flyt_protocol::CudaError {
    move |error| {
        tracing::warn!(%error, "could not serve an exported {what}");
        flyt_protocol::CudaError::OPERATING_SYSTEM
    }
}

/// Receives one message into `buf` from the socket `socket`, and the first descriptor that came
/// with it (`SCM_RIGHTS`, close-on-exec; any others are closed): the byte count and that
/// descriptor.
pub(crate) fn receive_with_fd(socket: impl AsFd, buf: &mut [u8]) -> nix::Result<(usize, Option<OwnedFd>)> {
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let mut iov = [io::IoSliceMut::new(buf)];
    let message = recvmsg::<()>(socket.as_fd().as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)?;
    let mut fd = None;
    for cmsg in message.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            for raw in fds {
                // SAFETY: SCM_RIGHTS just installed `raw` in this process; nothing else owns it
                // (extra descriptors are closed when dropped).
                let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                fd.get_or_insert(owned);
            }
        }
    }
    Ok((message.bytes, fd))
}

/// The request's bytes and the descriptor that rode along, if any.
fn read_request(stream: &UnixStream) -> io::Result<([u8; REQUEST_LEN], Option<OwnedFd>)> {
    let mut request = [0; REQUEST_LEN];
    let (received, fd) = receive_with_fd(stream, &mut request)?;
    // The request is sent in one piece; a short one is no request.
    if received != REQUEST_LEN {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a request of {received} bytes")));
    }
    Ok((request, fd))
}

/// Keeps a deposited descriptor under its ticket, if the ticket was issued and has none yet.
fn accept_deposit(mut stream: UnixStream, request: &[u8; REQUEST_LEN], fd: Option<OwnedFd>, tickets: &Mutex<Tickets>) -> io::Result<()> {
    let token = &request[..TOKEN_LEN];
    let mut accepted = 0;
    if let Some(fd) = fd {
        let mut tickets = lock(tickets);
        if let Some((_, slot)) = tickets.iter_mut().find(|(issued, slot)| issued.as_slice() == token && slot.is_none()) {
            *slot = Some(fd);
            accepted = deposit::ACCEPTED;
        }
    }
    stream.write_all(&[accepted])
}

fn serve_export(mut stream: UnixStream, request: &[u8; REQUEST_LEN], table: &Mutex<HashMap<Token, Export>>) -> io::Result<()> {
    let table = lock(table);
    let mut reply = [0u8; REPLY_LEN];
    let Some(export) = find(&table, request) else {
        return stream.write_all(&reply);
    };
    reply[0] = 1;
    reply[1..9].copy_from_slice(&export.size.to_le_bytes());
    match &export.shared {
        Shared::Pointer { data, .. } => {
            reply[9..].copy_from_slice(data);
            stream.write_all(&reply)
        }
        Shared::Descriptor(fd) => {
            let fds = [fd.as_raw_fd()];
            let rights = [ControlMessage::ScmRights(&fds)];
            sendmsg::<()>(stream.as_raw_fd(), &[io::IoSlice::new(&reply)], &rights, MsgFlags::MSG_NOSIGNAL, None)?;
            Ok(())
        }
    }
}

/// What an exporter answered.
struct Fetched {
    fd: Option<OwnedFd>,
    size: u64,
    data: [u8; EXPORT_DATA_LEN],
}

/// Asks the worker serving `name` for the export `token` of `kind` (`pool`: a token of its pool,
/// for a pool allocation). `None` for anything that is not a live export of that kind.
fn ask(name: &str, token: &Token, kind: Kind, pool: &Token) -> Option<Fetched> {
    let mut stream = UnixStream::connect_addr(&SocketAddr::from_abstract_name(name.as_bytes()).ok()?).ok()?;
    stream.set_read_timeout(Some(PEER_TIMEOUT)).ok()?;
    stream.set_write_timeout(Some(PEER_TIMEOUT)).ok()?;
    let mut request = [0u8; REQUEST_LEN];
    request[..TOKEN_LEN].copy_from_slice(token);
    request[TOKEN_LEN] = kind as u8;
    request[TOKEN_LEN + 1..].copy_from_slice(pool);
    stream.write_all(&request).ok()?;
    let mut reply = [0u8; REPLY_LEN];
    let (received, fd) = receive_with_fd(&stream, &mut reply).ok()?;
    if received != REPLY_LEN || reply[0] != 1 {
        return None;
    }
    let size = u64::from_le_bytes(reply[1..9].try_into().ok()?);
    Some(Fetched { fd, size, data: reply[9..].try_into().ok()? })
}

/// Fetches the descriptor a physical allocation's shareable names from its exporter: the
/// descriptor and the allocation's size. `None` for anything that is not a live export.
pub fn fetch(shareable: &[u8]) -> Option<(OwnedFd, u64)> {
    let (name, token) = decode(shareable)?;
    let fetched = ask(name, &token, Kind::Physical, &[0; TOKEN_LEN])?;
    if fetched.size == 0 {
        return None;
    }
    Some((fetched.fd?, fetched.size))
}

/// Fetches the descriptor a pool's shareable names from its exporter. `None` for anything that is
/// not a live export of a pool.
pub fn fetch_pool(shareable: &[u8]) -> Option<OwnedFd> {
    let (name, token) = decode(shareable)?;
    ask(name, &token, Kind::Pool, &[0; TOKEN_LEN])?.fd
}

/// Fetches what the app's export `data` of a pool allocation stands for from the exporter of
/// the pool whose shareable is `pool_shareable` (the one the importer imported): the driver's
/// export data and the allocation's size. `None` for data that is not a live export of an
/// allocation of that pool.
pub fn fetch_pointer(pool_shareable: &[u8], data: &[u8]) -> Option<([u8; EXPORT_DATA_LEN], u64)> {
    let (name, pool) = decode(pool_shareable)?;
    let token = decode_pointer(data)?;
    let fetched = ask(name, &token, Kind::PoolPointer, &pool)?;
    (fetched.size > 0).then_some((fetched.data, fetched.size))
}

/// Whether `data` has the form of export data Flyt hands out (the exporter still decides whether
/// it is live).
pub fn is_export_data(data: &[u8]) -> bool {
    decode_pointer(data).is_some()
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
        let shareable = exports.publish(Kind::Physical, 7, memfd(), 4096).expect("publish");
        let (fd, size) = fetch(&shareable).expect("fetched");
        assert_eq!(size, 4096);
        assert_eq!(std::fs::File::from(fd).metadata().expect("fstat").len(), 4096);
        let mut forged = shareable.clone();
        forged[MAGIC.len()] ^= 1;
        assert!(fetch(&forged).is_none(), "a wrong token fetches nothing");
        assert!(fetch_pool(&shareable).is_none(), "a physical allocation's token opens no pool");
        assert!(exports.any());
        exports.revoke(7);
        assert!(!exports.any());
        assert!(fetch(&shareable).is_none(), "a revoked export fetches nothing");
    }

    #[test]
    fn a_pool_allocation_is_fetched_with_a_token_of_its_own_pool_only() {
        let exports = Exports::default();
        let pool = exports.publish(Kind::Pool, 2, memfd(), 0).expect("publish the pool");
        let other_pool = exports.publish(Kind::Pool, 3, memfd(), 0).expect("publish another pool");
        assert!(fetch_pool(&pool).is_some());
        assert!(fetch(&pool).is_none(), "a pool's token opens no physical allocation");
        let data = exports.publish_pointer(2, 0x1000, [5; EXPORT_DATA_LEN], 4096).expect("publish the allocation");
        assert_eq!(exports.publish_pointer(2, 0x1000, [5; EXPORT_DATA_LEN], 4096).expect("again"), data, "one allocation, one export");
        assert_eq!(fetch_pointer(&pool, &data), Some(([5; EXPORT_DATA_LEN], 4096)));
        assert!(fetch_pointer(&other_pool, &data).is_none(), "another pool's token opens no allocation of this one");
        let mut forged = data;
        forged[POINTER_MAGIC.len()] ^= 1;
        assert!(fetch_pointer(&pool, &forged).is_none(), "a wrong token fetches nothing");
        assert!(fetch(&encode(exports.socket().expect("name"), &data[8..24].try_into().expect("token"))).is_none());
        exports.revoke_pointer(0x1000);
        assert!(fetch_pointer(&pool, &data).is_none(), "a freed allocation's export is over");
        let again = exports.publish_pointer(2, 0x2000, [6; EXPORT_DATA_LEN], 8192).expect("publish another");
        exports.revoke(2);
        assert!(fetch_pointer(&pool, &again).is_none() && fetch_pool(&pool).is_none(), "a destroyed pool's exports are over");
        assert!(fetch_pool(&other_pool).is_some());
    }

    #[test]
    fn malformed_shareables_are_refused_without_connecting() {
        for bad in [&b""[..], b"FLYTSHR1", b"FLYTSHR1aaaaaaaaaaaaaaaa\x05other", b"FLYTSHR1aaaaaaaaaaaaaaaa\x20flyt-vmm-"] {
            assert!(decode(bad).is_none(), "{bad:?}");
        }
        assert!(decode(&encode("flyt-vmm-1-2", &[3; TOKEN_LEN])).is_some());
        let data = encode_pointer(&[3; TOKEN_LEN]);
        assert!(is_export_data(&data));
        let mut padded = data;
        padded[40] = 1;
        for bad in [&data[..63], &[0; 64][..], &padded[..], &[data.as_slice(), &[0]].concat()[..]] {
            assert!(!is_export_data(bad), "{bad:?}");
        }
    }
}
