//! TLS for the data plane's TCP sessions. rustls runs the handshake (TLS 1.3 only: both ends
//! are Flyt) and keeps the traffic secrets for key updates (its kernel-connection API); the
//! records after the handshake are sealed and opened here, with ring's AEAD for the suite that
//! was negotiated, so the work can be spread over threads: one rustls connection serves both
//! directions under `&mut`, and one thread doing every record and every copy held bulk copies
//! to 40% of plain TCP.
//!
//! The session reads and writes one end of a Unix socket pair ([`crate::Link::Secured`]) as it
//! would any socket, so the client's and the server's code paths (and the server's hand-over
//! of a session to its worker process) stay what they are over plain TCP. Each direction has
//! two threads: an intake that reads (the session's bytes straight into the records' places,
//! or the peer's records) and does its share of each batch's crypto, and an output thread
//! that does the rest and writes on. Small batches (a call's message) skip the hand-over when
//! nothing is on its way. Each direction blocks only on its own sockets, so a session that
//! does not read never stops the other direction.

use std::io::{self, IoSlice};
use std::net::{Shutdown, TcpStream};
use std::ops::Range;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use rustls;
use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::kernel::KernelConnection;
use rustls::pki_types::ServerName;
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncodeError, UnbufferedStatus};
use rustls::{ClientConfig, ConnectionTrafficSecrets, ContentType, ServerConfig, SupportedCipherSuite, Tls13CipherSuite};

/// The first byte of a TLS handshake record: how a server tells a TLS client from a plain one.
pub const HANDSHAKE_RECORD: u8 = 22;
/// Bytes the receiving intake reads from the TCP socket at a time.
const INBOUND: usize = 1 << 20;
/// Most plaintext bytes in one record (RFC 8446, 5.1).
const MAX_PLAINTEXT: usize = 1 << 14;
/// Most bytes of a TLS 1.3 record's protected payload (RFC 8446, 5.2).
const MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 256;
const RECORD_HEADER: usize = 5;
/// Handshake message types seen after the handshake.
const KEY_UPDATE: u8 = 24;
const NEW_SESSION_TICKET: u8 = 4;
/// Socket-pair buffers: large enough that a bulk copy moves in big pieces.
const LOCAL_BUFFER: usize = 4 << 20;

fn read_pem(path: &std::path::Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|error| format!("{}: {error}", path.display()))
}

/// The certificates of a PEM file (at least one).
pub fn certificates(path: &std::path::Path) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, String> {
    use rustls::pki_types::pem::PemObject;
    let pem = read_pem(path)?;
    let certificates: Vec<_> = rustls::pki_types::CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|error| format!("{}: {error}", path.display()))?;
    if certificates.is_empty() {
        return Err(format!("{} holds no PEM certificate", path.display()));
    }
    Ok(certificates)
}

/// The private key of a PEM file.
pub fn private_key(path: &std::path::Path) -> Result<rustls::pki_types::PrivateKeyDer<'static>, String> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::PrivateKeyDer::from_pem_slice(&read_pem(path)?).map_err(|_| format!("{} holds no PEM private key", path.display()))
}

/// The CA certificates of a PEM file, as trust roots.
pub fn roots(ca_file: &std::path::Path) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for certificate in certificates(ca_file)? {
        roots.add(certificate).map_err(|error| format!("{}: {error}", ca_file.display()))?;
    }
    Ok(roots)
}

/// The crypto every Flyt TLS session uses (ring), whatever other providers the process has.
/// AES-128-GCM comes first (TLS 1.3's mandatory suite; a quarter fewer AES rounds than
/// AES-256 per byte of a bulk copy); the others stay for peers that want them.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites.sort_by_key(|suite| suite.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    Arc::new(provider)
}

/// A client's TLS: servers must show a certificate signed by the CA in `ca_file` (PEM).
pub fn client_config(ca_file: &std::path::Path) -> Result<Arc<ClientConfig>, String> {
    client_config_trusting(roots(ca_file)?)
}

/// A client's TLS that trusts servers certified by `roots`.
pub fn client_config_trusting(roots: rustls::RootCertStore) -> Result<Arc<ClientConfig>, String> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|error| error.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    // Records after the handshake are sealed here, from the secrets rustls hands over; a
    // session is never resumed (each is one long connection).
    config.enable_secret_extraction = true;
    config.resumption = rustls::client::Resumption::disabled();
    Ok(Arc::new(config))
}

/// A server's TLS: its certificate chain and key (PEM). Clients prove themselves with their
/// session token, inside the TLS session.
pub fn server_config(cert_file: &std::path::Path, key_file: &std::path::Path) -> Result<Arc<ServerConfig>, String> {
    let key = private_key(key_file)?;
    server_config_showing(certificates(cert_file)?, key).map_err(|error| format!("{}: {error}", cert_file.display()))
}

/// A server's TLS that shows `chain`, signing with `key`.
pub fn server_config_showing(
    chain: Vec<rustls::pki_types::CertificateDer<'static>>,
    key: rustls::pki_types::PrivateKeyDer<'static>,
) -> Result<Arc<ServerConfig>, String> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|error| error.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|error| error.to_string())?;
    config.enable_secret_extraction = true;
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

/// The name a `host:port` address's certificate must carry: its host.
pub fn server_name(address: &str) -> Result<ServerName<'static>, String> {
    let host = match address.rsplit_once(':') {
        Some((host, _port)) => host.trim_start_matches('[').trim_end_matches(']'),
        None => address,
    };
    ServerName::try_from(host.to_string()).map_err(|error| format!("`{host}` cannot be checked against a certificate: {error}"))
}

/// Runs a TLS handshake as the client over `tcp` (blocking, within `timeout`), then starts the
/// two record threads; returns the session's end.
pub fn connect(config: Arc<ClientConfig>, name: ServerName<'static>, tcp: TcpStream, timeout: Duration) -> Result<UnixStream, String> {
    let connection = UnbufferedClientConnection::new(config, name).map_err(|error| error.to_string())?;
    start(connection, tcp, timeout, None)
}

/// Runs a TLS handshake as the server over `tcp` (blocking, within `timeout`), then starts the
/// two record threads; returns the session's end.
pub fn accept(config: Arc<ServerConfig>, tcp: TcpStream, timeout: Duration) -> Result<UnixStream, String> {
    let connection = UnbufferedServerConnection::new(config).map_err(|error| error.to_string())?;
    start(connection, tcp, timeout, None)
}

/// A connection whose handshake is running: the client's or the server's side.
trait Handshake: Sized {
    type Data;
    fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data>;
    fn into_kernel(self) -> Result<(rustls::ExtractedSecrets, Kernel), rustls::Error>;
}

/// The client's and the server's connections run their handshakes alike; only the kernel's side
/// differs.
macro_rules! handshake_sides {
    ($($connection:ty, $data:ty => $side:ident;)*) => {$(
        impl Handshake for $connection {
            type Data = $data;
            fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data> {
                self.process_tls_records(incoming)
            }
            fn into_kernel(self) -> Result<(rustls::ExtractedSecrets, Kernel), rustls::Error> {
                self.dangerous_into_kernel_connection().map(|(secrets, kernel)| (secrets, Kernel::$side(kernel)))
            }
        }
    )*};
}

handshake_sides! {
    UnbufferedClientConnection, ClientConnectionData => Client;
    UnbufferedServerConnection, ServerConnectionData => Server;
}

/// What rustls keeps of a connection after its handshake: the traffic secrets' next generation.
enum Kernel {
    Client(KernelConnection<ClientConnectionData>),
    Server(KernelConnection<ServerConnectionData>),
}

impl Kernel {
    fn suite(&self) -> SupportedCipherSuite {
        match self {
            Self::Client(kernel) => kernel.negotiated_cipher_suite(),
            Self::Server(kernel) => kernel.negotiated_cipher_suite(),
        }
    }

    fn next_secrets(&mut self, sending: bool) -> Result<ConnectionTrafficSecrets, rustls::Error> {
        let updated = match (self, sending) {
            (Self::Client(kernel), true) => kernel.update_tx_secret(),
            (Self::Client(kernel), false) => kernel.update_rx_secret(),
            (Self::Server(kernel), true) => kernel.update_tx_secret(),
            (Self::Server(kernel), false) => kernel.update_rx_secret(),
        };
        updated.map(|(_sequence, secrets)| secrets)
    }
}

/// The session's first bytes and the peer's records read during the handshake.
struct Handshaken {
    secrets: rustls::ExtractedSecrets,
    kernel: Kernel,
    /// Records the peer sent right after its last handshake message, read with it.
    records: Vec<u8>,
    /// Plaintext rustls opened before handing over.
    plaintext: Vec<u8>,
}

fn handshake(mut connection: impl Handshake, tcp: &mut TcpStream, timeout: Duration) -> Result<Handshaken, String> {
    use std::io::{Read, Write};
    let deadline = Instant::now() + timeout;
    let mut incoming = vec![0u8; 16 << 10];
    let mut filled = 0;
    let mut outgoing = vec![0u8; 16 << 10];
    let mut queued = 0;
    let mut plaintext = Vec::new();
    loop {
        if Instant::now() > deadline {
            return Err(format!("no TLS handshake within {timeout:?}"));
        }
        let UnbufferedStatus { mut discard, state } = connection.process(&mut incoming[..filled]);
        let state = match state {
            Ok(state) => state,
            Err(error) => {
                // Tell the peer why (rustls queues the alert), then go.
                if let UnbufferedStatus { state: Ok(ConnectionState::EncodeTlsData(mut alert)), .. } = connection.process(&mut [])
                    && let Ok(written) = alert.encode(&mut outgoing)
                {
                    let _ = tcp.write_all(&outgoing[..written]);
                }
                return Err(error.to_string());
            }
        };
        match state {
            ConnectionState::EncodeTlsData(mut encoding) => loop {
                match encoding.encode(&mut outgoing[queued..]) {
                    Ok(written) => {
                        queued += written;
                        break;
                    }
                    Err(EncodeError::InsufficientSize(size)) => outgoing.resize(queued + size.required_size, 0),
                    Err(error) => return Err(error.to_string()),
                }
            },
            ConnectionState::TransmitTlsData(transmitting) => {
                tcp.write_all(&outgoing[..queued]).map_err(|error| error.to_string())?;
                queued = 0;
                transmitting.done();
            }
            ConnectionState::BlockedHandshake => {
                if filled == incoming.len() {
                    incoming.resize(incoming.len() * 2, 0);
                }
                match tcp.read(&mut incoming[filled..]) {
                    Ok(0) => return Err("the peer closed the connection during the TLS handshake".into()),
                    Ok(read) => filled += read,
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                    Err(error) => return Err(error.to_string()),
                }
            }
            ConnectionState::ReadTraffic(mut reading) => {
                while let Some(record) = reading.next_record() {
                    let record = record.map_err(|error| error.to_string())?;
                    plaintext.extend_from_slice(record.payload);
                    discard += record.discard;
                }
            }
            ConnectionState::WriteTraffic(_) => {
                incoming.copy_within(discard..filled, 0);
                incoming.truncate(filled - discard);
                break;
            }
            ConnectionState::PeerClosed | ConnectionState::Closed => {
                return Err("the peer closed the connection during the TLS handshake".into());
            }
            _ => return Err("an unexpected TLS state during the handshake (early data?)".into()),
        }
        incoming.copy_within(discard..filled, 0);
        filled -= discard;
    }
    let (secrets, kernel) = connection.into_kernel().map_err(|error| error.to_string())?;
    Ok(Handshaken { secrets, kernel, records: incoming, plaintext })
}

fn invalid(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}

/// One direction's record protection (RFC 8446, 5.2): the suite's AEAD keyed for the current
/// traffic secret. A record's nonce is the IV with its number XORed into the end; the header
/// is the associated data; the plaintext is followed by its content type.
struct Protection {
    key: ring::aead::LessSafeKey,
    iv: [u8; ring::aead::NONCE_LEN],
}

impl Protection {
    fn new(suite: &Tls13CipherSuite, secrets: ConnectionTrafficSecrets) -> io::Result<Self> {
        let (key, iv) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv }
            | ConnectionTrafficSecrets::Aes256Gcm { key, iv }
            | ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (key, iv),
            _ => return Err(invalid(format!("TLS suite {:?} is not supported for the data plane", suite.common.suite))),
        };
        let algorithm = match suite.common.suite {
            rustls::CipherSuite::TLS13_AES_128_GCM_SHA256 => &ring::aead::AES_128_GCM,
            rustls::CipherSuite::TLS13_AES_256_GCM_SHA384 => &ring::aead::AES_256_GCM,
            rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256 => &ring::aead::CHACHA20_POLY1305,
            other => return Err(invalid(format!("TLS suite {other:?} is not supported for the data plane"))),
        };
        let key = ring::aead::UnboundKey::new(algorithm, key.as_ref()).map_err(|_| invalid("a TLS key of the wrong length"))?;
        let iv = iv.as_ref().try_into().map_err(|_| invalid("a TLS IV of the wrong length"))?;
        Ok(Self { key: ring::aead::LessSafeKey::new(key), iv })
    }

    fn nonce(&self, sequence: u64) -> ring::aead::Nonce {
        let mut nonce = self.iv;
        for (byte, number) in nonce[4..].iter_mut().zip(sequence.to_be_bytes()) {
            *byte ^= number;
        }
        ring::aead::Nonce::assume_unique_for_key(nonce)
    }

    /// Seals the `length` plaintext bytes at `record[RECORD_HEADER..]` in place; the record's
    /// length as sent.
    fn seal(&self, record: &mut [u8], typ: ContentType, length: usize, sequence: u64) -> io::Result<usize> {
        let protected = length + 1 + TAG;
        let header = [u8::from(ContentType::ApplicationData), 3, 3, (protected >> 8) as u8, protected as u8];
        record[..RECORD_HEADER].copy_from_slice(&header);
        record[RECORD_HEADER + length] = u8::from(typ);
        let (body, rest) = record[RECORD_HEADER..].split_at_mut(length + 1);
        let tag = self
            .key
            .seal_in_place_separate_tag(self.nonce(sequence), ring::aead::Aad::from(header), body)
            .map_err(|_| invalid("TLS sealing failed"))?;
        rest[..TAG].copy_from_slice(tag.as_ref());
        Ok(RECORD_HEADER + protected)
    }

    /// Opens the whole record (header and protected body) in place: its content type and where
    /// its plaintext lies in `record`.
    fn open(&self, record: &mut [u8], sequence: u64) -> io::Result<(u8, Range<usize>)> {
        let (header, body) = record.split_at_mut(RECORD_HEADER);
        let opened = self
            .key
            .open_in_place(self.nonce(sequence), ring::aead::Aad::from(&*header), body)
            .map_err(|_| invalid("a TLS record failed authentication"))?;
        // The content type is the last non-zero byte; zeros after it are padding.
        let Some(end) = opened.iter().rposition(|&byte| byte != 0) else {
            return Err(invalid("a TLS record without a content type"));
        };
        if end > MAX_PLAINTEXT {
            return Err(invalid("a TLS record over the size limit"));
        }
        Ok((opened[end], RECORD_HEADER..RECORD_HEADER + end))
    }
}

/// What the two directions share: key updates go through rustls's kernel connection, and the
/// opener tells the sealer when the peer asked for one.
struct Shared {
    kernel: Mutex<Kernel>,
    suite: &'static Tls13CipherSuite,
    peer_asked_update: AtomicBool,
}

impl Shared {
    fn next_protection(&self, sending: bool) -> io::Result<Arc<Protection>> {
        let mut kernel = self.kernel.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let secrets = kernel.next_secrets(sending).map_err(|error| invalid(error.to_string()))?;
        Ok(Arc::new(Protection::new(self.suite, secrets)?))
    }
}

/// `key_update_after`: records sealed under one key before it is replaced (tests set it low;
/// otherwise the suite's confidentiality limit, halved for margin).
fn start(connection: impl Handshake, mut tcp: TcpStream, timeout: Duration, key_update_after: Option<u64>) -> Result<UnixStream, String> {
    tcp.set_read_timeout(Some(timeout)).map_err(|error| error.to_string())?;
    tcp.set_write_timeout(Some(timeout)).map_err(|error| error.to_string())?;
    let handshaken = handshake(connection, &mut tcp, timeout)?;
    tcp.set_read_timeout(None).map_err(|error| error.to_string())?;
    tcp.set_write_timeout(None).map_err(|error| error.to_string())?;
    let Some(suite) = handshaken.kernel.suite().tls13() else {
        return Err("the peer did not negotiate TLS 1.3".into());
    };
    let (sent, received) = (handshaken.secrets.tx, handshaken.secrets.rx);
    let sealing = Arc::new(Protection::new(suite, sent.1).map_err(|error| error.to_string())?);
    let opening = Arc::new(Protection::new(suite, received.1).map_err(|error| error.to_string())?);
    let shared = Arc::new(Shared { kernel: Mutex::new(handshaken.kernel), suite, peer_asked_update: AtomicBool::new(false) });

    let (session, pumped) = UnixStream::pair().map_err(|error| error.to_string())?;
    for socket in [&session, &pumped] {
        enlarge_buffers(socket.as_raw_fd());
    }
    let sockets = || -> Result<Sockets, String> {
        Ok(Sockets {
            tcp: tcp.try_clone().map_err(|error| format!("TCP socket: {error}"))?,
            local: pumped.try_clone().map_err(|error| format!("socket pair: {error}"))?,
        })
    };
    let outbound = Arc::new(Line::default());
    let inbound = Arc::new(Line::default());
    let seal_intake = SealIntake {
        sockets: sockets()?,
        protection: sealing,
        sequence: sent.0,
        key_update_after: key_update_after.unwrap_or(suite.common.confidentiality_limit / 2).max(1),
        shared: shared.clone(),
        line: outbound.clone(),
        share: Share::new(),
    };
    let seal_output = Output { sockets: sockets()?, line: outbound, sealing: true };
    let mut first = inbound.buffer();
    let Some(early_records) = first.get_mut(..handshaken.records.len()) else {
        return Err("the peer sent too much during the TLS handshake".into());
    };
    early_records.copy_from_slice(&handshaken.records);
    let open_intake = OpenIntake {
        sockets: sockets()?,
        protection: opening,
        sequence: received.0,
        shared,
        line: inbound.clone(),
        share: Share::new(),
        buffer: first,
        filled: handshaken.records.len(),
        early: handshaken.plaintext,
    };
    let open_output = Output { sockets: Sockets { tcp, local: pumped }, line: inbound, sealing: false };
    spawn("flyt-tls-seal", seal_intake.sockets.clone_for_errors()?, move || seal_intake.run())?;
    spawn("flyt-tls-send", seal_output.sockets.clone_for_errors()?, move || seal_output.run())?;
    spawn("flyt-tls-open", open_intake.sockets.clone_for_errors()?, move || open_intake.run())?;
    spawn("flyt-tls-deliver", open_output.sockets.clone_for_errors()?, move || open_output.run())?;
    Ok(session)
}

/// A record thread's two sockets: the peer's TCP connection and the session's end.
struct Sockets {
    tcp: TcpStream,
    local: UnixStream,
}

impl Sockets {
    fn clone_for_errors(&self) -> Result<Self, String> {
        Ok(Self {
            tcp: self.tcp.try_clone().map_err(|error| error.to_string())?,
            local: self.local.try_clone().map_err(|error| error.to_string())?,
        })
    }
}

fn spawn(name: &str, sockets: Sockets, run: impl FnOnce() -> io::Result<()> + Send + 'static) -> Result<(), String> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            if let Err(error) = run() {
                log_end(&error);
                // The other threads and the session see the end too.
                let _ = sockets.tcp.shutdown(Shutdown::Both);
                let _ = sockets.local.shutdown(Shutdown::Both);
            }
        })
        .map(drop)
        .map_err(|error| format!("no TLS thread: {error}"))
}

fn log_end(error: &io::Error) {
    // A library in the app's process prints nothing on an ordinary end; a broken session shows
    // itself to the session's reader (its socket ends).
    if std::env::var_os("FLYT_TLS_DEBUG").is_some() {
        eprintln!("flyt: TLS session ended: {error}");
    }
}

fn enlarge_buffers(fd: RawFd) {
    let size = LOCAL_BUFFER as libc::c_int;
    for option in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
        // SAFETY: `fd` is a socket the caller owns; the option value is a c_int that outlives
        // the call. The kernel caps it at its maximum; a refusal leaves the default.
        unsafe {
            libc::setsockopt(fd, libc::SOL_SOCKET, option, (&raw const size).cast(), size_of::<libc::c_int>() as libc::socklen_t);
        }
    }
}

/// Reads what is there into `places` (one system call fills them in order): without sleeping
/// while the spin budget after the last bytes lasts (the next message of a busy session is
/// microseconds away, a sleeping thread's wake-up most of a round trip), then blocking.
fn receive(fd: RawFd, places: &mut [io::IoSliceMut<'_>], spin_until: &mut Instant) -> io::Result<usize> {
    loop {
        let flags = if Instant::now() < *spin_until { libc::MSG_DONTWAIT } else { 0 };
        // SAFETY: a zeroed msghdr is valid (no name, no control data).
        let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
        // IoSliceMut is ABI-compatible with iovec on Unix.
        message.msg_iov = places.as_mut_ptr().cast();
        message.msg_iovlen = places.len() as _;
        // SAFETY: `message` points at live, writable slices; `fd` is a socket this thread reads.
        let read = unsafe { libc::recvmsg(fd, &mut message, flags) };
        if read >= 0 {
            *spin_until = Instant::now() + crate::spin_budget();
            return Ok(read as usize);
        }
        let error = io::Error::last_os_error();
        match error.kind() {
            io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            io::ErrorKind::Interrupted => {}
            _ => return Err(error),
        }
    }
}

/// Sends every byte of `pieces` (blocking), without SIGPIPE when the other end is gone.
fn send_all(fd: RawFd, mut pieces: &mut [IoSlice<'_>]) -> io::Result<()> {
    while !pieces.is_empty() {
        let count = pieces.len().min(1024);
        // SAFETY: a zeroed msghdr is valid (no name, no control data).
        let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
        // IoSlice is ABI-compatible with iovec on Unix.
        message.msg_iov = pieces.as_mut_ptr().cast();
        message.msg_iovlen = count as _;
        // SAFETY: `message` points at `count` live slices; the kernel only reads them.
        let sent = unsafe { libc::sendmsg(fd, &message, libc::MSG_NOSIGNAL) };
        if sent < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        IoSlice::advance_slices(&mut pieces, sent as usize);
    }
    Ok(())
}

/// Records on their way: `buffer` holds them; those from `split` on are still to be sealed
/// or opened (by the output thread, with `protection`, numbered from `sequence`); `ready`
/// holds, per record, the bytes to send on.
struct Batch {
    buffer: Vec<u8>,
    records: Vec<Range<usize>>,
    split: usize,
    protection: Arc<Protection>,
    sequence: u64,
    /// Sealing: plaintext lengths; opening: filled in by the output thread.
    ready: Vec<Range<usize>>,
    /// After these records, the end: close_notify sent (sealing) or the session told (opening).
    last: bool,
}

/// Batches between a direction's two threads, and the buffers they come back in.
#[derive(Default)]
struct Line {
    state: Mutex<LineState>,
    changed: std::sync::Condvar,
}

#[derive(Default)]
struct LineState {
    queue: std::collections::VecDeque<Batch>,
    /// Batches handed over and not yet sent on.
    pending: usize,
    spare: Vec<Vec<u8>>,
    broken: bool,
}

/// Batches handed over before the intake waits: enough to keep both threads busy.
const LINE_DEPTH: usize = 4;
/// Bytes of one batch's buffer: a chunk's records with room to spare.
const BATCH_BUFFER: usize = INBOUND + RECORD_HEADER + MAX_CIPHERTEXT;

impl Line {
    fn lock(&self) -> std::sync::MutexGuard<'_, LineState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn buffer(&self) -> Vec<u8> {
        self.lock().spare.pop().unwrap_or_else(|| vec![0; BATCH_BUFFER])
    }

    /// Nothing handed over is still on its way: the intake may send itself, in order.
    fn idle(&self) -> bool {
        self.lock().pending == 0
    }

    /// Queues `batch` for the output thread, waiting while the line is full; says which of the
    /// two threads waited for the other.
    fn hand_over(&self, batch: Batch) -> io::Result<Waiting> {
        let mut state = self.lock();
        let mut waiting = if state.pending == 0 { Waiting::Output } else { Waiting::Neither };
        while state.pending >= LINE_DEPTH && !state.broken {
            waiting = Waiting::Intake;
            state = self.changed.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        if state.broken {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "the TLS output thread ended"));
        }
        state.pending += 1;
        state.queue.push_back(batch);
        self.changed.notify_all();
        Ok(waiting)
    }

    fn take(&self) -> Option<Batch> {
        let mut state = self.lock();
        loop {
            if let Some(batch) = state.queue.pop_front() {
                return Some(batch);
            }
            if state.broken {
                return None;
            }
            state = self.changed.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    fn sent(&self, buffer: Vec<u8>) {
        let mut state = self.lock();
        state.pending -= 1;
        state.spare.push(buffer);
        self.changed.notify_all();
    }

    fn break_off(&self) {
        self.lock().broken = true;
        self.changed.notify_all();
    }
}

/// Which thread of a line had nothing to do at a hand-over.
enum Waiting {
    /// The line was full: the intake waited for the output thread.
    Intake,
    /// Nothing was queued: the output thread had finished everything.
    Output,
    Neither,
}

/// The intake's share of each batch's crypto, in sixteenths. It moves a step toward whichever
/// thread is the slower at each hand-over, so that both stay busy whatever the two sockets'
/// costs (a loopback TCP send also runs the receiver's protocol work; a Unix socket's does not).
struct Share(usize);

impl Share {
    fn new() -> Self {
        Self(8)
    }

    fn of(&self, records: usize) -> usize {
        records * self.0 / 16
    }

    fn follow(&mut self, waiting: Waiting) {
        match waiting {
            Waiting::Intake => self.0 = (self.0 + 1).min(15),
            Waiting::Output => self.0 = (self.0 - 1).max(1),
            Waiting::Neither => {}
        }
    }
}

/// Stops the line when its thread ends, however it ends.
struct Breaks(Arc<Line>);

impl Drop for Breaks {
    fn drop(&mut self) {
        self.0.break_off();
    }
}

/// Records of one batch the intake hands to the output thread when it is at least this big;
/// smaller batches (a call's message) the intake seals or opens and sends itself when nothing
/// is on its way, sparing a thread hand-over on the latency path.
const HAND_OVER_AT: usize = 4;

/// Sending records: the intake reads what the session wrote straight into the records' places
/// and seals its [`Share`] of them; the output thread seals the rest and sends them. Each byte is
/// copied only by the kernel, on its way in and out, and the two threads share the crypto.
struct SealIntake {
    sockets: Sockets,
    protection: Arc<Protection>,
    sequence: u64,
    key_update_after: u64,
    shared: Arc<Shared>,
    line: Arc<Line>,
    share: Share,
}

/// Bytes between records in a sealing batch: header, plaintext, content type, tag.
const SEALED_RECORD: usize = RECORD_HEADER + MAX_PLAINTEXT + 1 + TAG;
const TAG: usize = 16;
/// Records a sealing batch holds (one place is kept for a key update or the close).
const SEAL_SLOTS: usize = BATCH_BUFFER / SEALED_RECORD - 1;

impl SealIntake {
    fn run(mut self) -> io::Result<()> {
        let _breaks = Breaks(self.line.clone());
        let mut spin_until = Instant::now();
        loop {
            let mut buffer = self.line.buffer();
            let mut places: Vec<io::IoSliceMut<'_>> = buffer[SEALED_RECORD..]
                .chunks_mut(SEALED_RECORD)
                .take(SEAL_SLOTS)
                .map(|record| io::IoSliceMut::new(&mut record[RECORD_HEADER..RECORD_HEADER + MAX_PLAINTEXT]))
                .collect();
            let read = receive(self.sockets.local.as_raw_fd(), &mut places, &mut spin_until)?;
            drop(places);
            let mut records = Vec::with_capacity(SEAL_SLOTS + 1);
            let mut ready = Vec::with_capacity(SEAL_SLOTS + 1);
            let last = read == 0;
            if last {
                // The session is done writing: the peer is told; its bytes still flow back.
                buffer[RECORD_HEADER..RECORD_HEADER + 2].copy_from_slice(&[1, 0]);
                let sequence = self.next_sequence();
                let length = self.protection.seal(&mut buffer[..SEALED_RECORD], ContentType::Alert, 2, sequence)?;
                records.push(0..SEALED_RECORD);
                ready.push(0..length);
            } else if self.sequence + SEAL_SLOTS as u64 >= self.key_update_after
                || self.shared.peer_asked_update.swap(false, Ordering::AcqRel)
            {
                // A KeyUpdate (not asking the peer for one back) under the old key, then the new key.
                let message = [KEY_UPDATE, 0, 0, 1, 0];
                buffer[RECORD_HEADER..RECORD_HEADER + message.len()].copy_from_slice(&message);
                let sequence = self.next_sequence();
                let length = self.protection.seal(&mut buffer[..SEALED_RECORD], ContentType::Handshake, message.len(), sequence)?;
                records.push(0..SEALED_RECORD);
                ready.push(0..length);
                self.protection = self.shared.next_protection(true)?;
                self.sequence = 0;
            }
            let first_data = records.len();
            for slot in 0..read.div_ceil(MAX_PLAINTEXT) {
                let at = (slot + 1) * SEALED_RECORD;
                records.push(at..at + SEALED_RECORD);
                ready.push(0..(read - slot * MAX_PLAINTEXT).min(MAX_PLAINTEXT));
            }
            let count = records.len() - first_data;
            let direct = count < HAND_OVER_AT && self.line.idle();
            let split = if direct { records.len() } else { first_data + self.share.of(count) };
            let sequence = self.sequence;
            for index in first_data..split {
                let record = records[index].clone();
                let sealed = self.protection.seal(
                    &mut buffer[record.clone()],
                    ContentType::ApplicationData,
                    ready[index].end,
                    sequence + (index - first_data) as u64,
                )?;
                ready[index] = record.start..record.start + sealed;
            }
            self.sequence += count as u64;
            if direct {
                let mut pieces: Vec<IoSlice<'_>> = ready.iter().map(|range| IoSlice::new(&buffer[range.clone()])).collect();
                send_all(self.sockets.tcp.as_raw_fd(), &mut pieces)?;
                self.line.lock().spare.push(buffer);
                if last {
                    return self.sockets.tcp.shutdown(Shutdown::Write);
                }
                continue;
            }
            let batch = Batch {
                buffer,
                records,
                split,
                protection: self.protection.clone(),
                sequence: sequence + (split - first_data) as u64,
                ready,
                last,
            };
            let waiting = self.line.hand_over(batch)?;
            self.share.follow(waiting);
            if last {
                return Ok(());
            }
        }
    }

    fn next_sequence(&mut self) -> u64 {
        self.sequence += 1;
        self.sequence - 1
    }
}

/// A direction's output thread: finishes a batch's crypto and sends it on, in order.
struct Output {
    sockets: Sockets,
    line: Arc<Line>,
    /// Sealing (to the peer) or opening (to the session).
    sealing: bool,
}

impl Output {
    fn run(self) -> io::Result<()> {
        let _breaks = Breaks(self.line.clone());
        while let Some(mut batch) = self.line.take() {
            for (offset, index) in (batch.split..batch.records.len()).enumerate() {
                let record = batch.records[index].clone();
                let sequence = batch.sequence + offset as u64;
                batch.ready[index] = if self.sealing {
                    let sealed = batch.protection.seal(
                        &mut batch.buffer[record.clone()],
                        ContentType::ApplicationData,
                        batch.ready[index].end,
                        sequence,
                    )?;
                    record.start..record.start + sealed
                } else {
                    let (typ, plaintext) = batch.protection.open(&mut batch.buffer[record.clone()], sequence)?;
                    if typ != u8::from(ContentType::ApplicationData) {
                        return Err(invalid(format!("an unexpected TLS record (content type {typ}) among bulk data")));
                    }
                    record.start + plaintext.start..record.start + plaintext.end
                };
            }
            let fd = if self.sealing { self.sockets.tcp.as_raw_fd() } else { self.sockets.local.as_raw_fd() };
            let mut pieces: Vec<IoSlice<'_>> = batch.ready.iter().map(|range| IoSlice::new(&batch.buffer[range.clone()])).collect();
            send_all(fd, &mut pieces)?;
            drop(pieces);
            let last = batch.last;
            self.line.sent(batch.buffer);
            if last {
                return if self.sealing {
                    self.sockets.tcp.shutdown(Shutdown::Write)
                } else {
                    self.sockets.local.shutdown(Shutdown::Write)
                };
            }
        }
        Ok(())
    }
}

/// Receiving records: the intake reads them from the peer and opens its [`Share`] of each batch
/// (all of it when the batch is small, and every record up to the last small one, which may be
/// a key update or an alert that changes how the rest is read); the output thread opens
/// the rest and writes the plaintext for the session.
struct OpenIntake {
    sockets: Sockets,
    protection: Arc<Protection>,
    sequence: u64,
    shared: Arc<Shared>,
    line: Arc<Line>,
    share: Share,
    /// Records read from the peer, `..filled` not yet handed on.
    buffer: Vec<u8>,
    filled: usize,
    /// Plaintext opened during the handshake, for the session first.
    early: Vec<u8>,
}

/// Records this small (protected bytes) may carry a key update or an alert.
const CONTROL_RECORD: usize = 64;

impl OpenIntake {
    fn run(mut self) -> io::Result<()> {
        let _breaks = Breaks(self.line.clone());
        if !self.early.is_empty() {
            send_all(self.sockets.local.as_raw_fd(), &mut [IoSlice::new(&self.early)])?;
            self.early = Vec::new();
        }
        let mut spin_until = Instant::now();
        loop {
            // The complete records in the buffer.
            let mut records = Vec::new();
            let mut at = 0;
            while let Some(length) = self.complete_record(at)? {
                records.push(at..at + RECORD_HEADER + length);
                at += RECORD_HEADER + length;
            }
            if !records.is_empty() {
                let mut buffer = std::mem::replace(&mut self.buffer, self.line.buffer());
                // The partial record after them starts the next buffer.
                self.buffer[..self.filled - at].copy_from_slice(&buffer[at..self.filled]);
                self.filled -= at;
                if self.open(&mut buffer, records)? {
                    return Ok(());
                }
            }
            let mut place = [io::IoSliceMut::new(&mut self.buffer[self.filled..self.filled + INBOUND])];
            let read = receive(self.sockets.tcp.as_raw_fd(), &mut place, &mut spin_until)?;
            if read == 0 {
                // The peer went without a close_notify: the session sees the end all the same.
                let batch = self.batch(Vec::new(), Vec::new(), 0, Vec::new(), true);
                return self.line.hand_over(batch).map(drop);
            }
            self.filled += read;
        }
    }

    fn batch(&self, buffer: Vec<u8>, records: Vec<Range<usize>>, split: usize, ready: Vec<Range<usize>>, last: bool) -> Batch {
        Batch { buffer, records, split, protection: self.protection.clone(), sequence: self.sequence, ready, last }
    }

    /// Opens the intake's share of `records` and sends or hands on the batch; `true` once the
    /// peer closed.
    fn open(&mut self, buffer: &mut Vec<u8>, records: Vec<Range<usize>>) -> io::Result<bool> {
        let direct = records.len() < HAND_OVER_AT && self.line.idle();
        let last_control = records.iter().rposition(|record| record.len() - RECORD_HEADER <= CONTROL_RECORD);
        let split = if direct { records.len() } else { last_control.map_or(0, |index| index + 1).max(self.share.of(records.len())) };
        let mut ready = vec![0..0; records.len()];
        let mut closed = false;
        for (index, record) in records.iter().enumerate().take(split) {
            let (typ, plaintext) = self.protection.open(&mut buffer[record.clone()], self.sequence)?;
            self.sequence += 1;
            let plaintext = record.start + plaintext.start..record.start + plaintext.end;
            match ContentType::from(typ) {
                ContentType::ApplicationData => ready[index] = plaintext,
                ContentType::Alert => match buffer[plaintext] {
                    [_, 0] => {
                        // close_notify: what came before it is the session's; nothing after.
                        closed = true;
                        ready.truncate(index);
                        break;
                    }
                    [_, description] => return Err(invalid(format!("the peer sent TLS alert {description}"))),
                    _ => return Err(invalid("a malformed TLS alert")),
                },
                ContentType::Handshake => {
                    let message = buffer[plaintext].to_vec();
                    self.handshake_message(&message)?;
                }
                _ => return Err(invalid(format!("an unexpected TLS record (content type {typ})"))),
            }
        }
        if direct || closed {
            let mut pieces: Vec<IoSlice<'_>> = ready.iter().map(|range| IoSlice::new(&buffer[range.clone()])).collect();
            if !self.line.idle() {
                // Batches handed over before the close go first.
                drop(pieces);
                let batch = self.batch(std::mem::take(buffer), records[..ready.len()].to_vec(), ready.len(), ready, closed);
                self.line.hand_over(batch)?;
                return Ok(closed);
            }
            send_all(self.sockets.local.as_raw_fd(), &mut pieces)?;
            drop(pieces);
            self.line.lock().spare.push(std::mem::take(buffer));
            if closed {
                self.sockets.local.shutdown(Shutdown::Write)?;
            }
            return Ok(closed);
        }
        let count = records.len();
        let batch = self.batch(std::mem::take(buffer), records, split, ready, false);
        self.sequence += (count - split) as u64;
        let waiting = self.line.hand_over(batch)?;
        self.share.follow(waiting);
        Ok(false)
    }

    fn complete_record(&self, start: usize) -> io::Result<Option<usize>> {
        record_at(&self.buffer[..self.filled], start)
    }

    /// Acts on handshake messages after the handshake: key updates (and session tickets, which
    /// a Flyt server does not send and a Flyt client would not use).
    fn handshake_message(&mut self, messages: &[u8]) -> io::Result<()> {
        for message in post_handshake(messages)? {
            if let PostHandshake::KeyUpdate { asked } = message {
                self.protection = self.shared.next_protection(false)?;
                self.sequence = 0;
                if asked {
                    self.shared.peer_asked_update.store(true, Ordering::Release);
                }
            }
        }
        Ok(())
    }
}

/// The protected length of the whole record at `start` of `received`, if it has all arrived;
/// an error for a header no Flyt peer sends (TLS 1.3 protects every record as application data).
fn record_at(received: &[u8], start: usize) -> io::Result<Option<usize>> {
    let Some(header) = received.get(start..start + RECORD_HEADER) else {
        return Ok(None);
    };
    let length = u16::from_be_bytes([header[3], header[4]]) as usize;
    if header[0] != u8::from(ContentType::ApplicationData) || !(TAG + 1..=MAX_CIPHERTEXT).contains(&length) {
        return Err(invalid(format!("a malformed TLS record (type {}, {length} bytes)", header[0])));
    }
    Ok((received.len() - start >= RECORD_HEADER + length).then_some(length))
}

/// A handshake message after the handshake.
#[derive(Debug, PartialEq, Eq)]
enum PostHandshake {
    /// The peer's new key starts with its next record; `asked`: it wants ours replaced too.
    KeyUpdate {
        asked: bool,
    },
    SessionTicket,
}

/// The handshake messages of one record's plaintext (RFC 8446, 4: type, 24-bit length, body).
fn post_handshake(mut messages: &[u8]) -> io::Result<Vec<PostHandshake>> {
    let mut parsed = Vec::new();
    while let [typ, a, b, c, rest @ ..] = messages {
        let length = u32::from_be_bytes([0, *a, *b, *c]) as usize;
        let Some(body) = rest.get(..length) else {
            return Err(invalid("a truncated TLS handshake message"));
        };
        parsed.push(match (*typ, body) {
            (KEY_UPDATE, [asked]) if *asked <= 1 => PostHandshake::KeyUpdate { asked: *asked == 1 },
            (NEW_SESSION_TICKET, _) => PostHandshake::SessionTicket,
            _ => return Err(invalid(format!("an unexpected TLS handshake message (type {typ})"))),
        });
        messages = &rest[length..];
    }
    if !messages.is_empty() {
        return Err(invalid("a truncated TLS handshake message"));
    }
    Ok(parsed)
}

/// For the fuzz target `tls_records`: what a peer's bytes reach after the TLS handshake, with a
/// fixed key. Reads `data` as a stream of records and opens each (all fail to authenticate but
/// their parsing is exercised), parses it as post-handshake messages, and seals then opens it
/// (its first byte as the content type), which must give it back.
#[doc(hidden)]
pub fn fuzz_records(data: &[u8]) {
    let suite = match rustls::crypto::ring::cipher_suite::TLS13_AES_256_GCM_SHA384 {
        SupportedCipherSuite::Tls13(suite) => suite,
        _ => return,
    };
    let secrets = ConnectionTrafficSecrets::Aes256Gcm {
        key: rustls::crypto::cipher::AeadKey::from([7; 32]),
        iv: rustls::crypto::cipher::Iv::new([9; 12]),
    };
    let Ok(protection) = Protection::new(suite, secrets) else { return };
    let mut stream = data.to_vec();
    let mut start = 0;
    while let Ok(Some(length)) = record_at(&stream, start) {
        let _ = protection.open(&mut stream[start..start + RECORD_HEADER + length], start as u64);
        start += RECORD_HEADER + length;
    }
    let _ = post_handshake(data);
    if let Some((&typ, plaintext)) = data.split_first()
        && typ != 0
        && plaintext.len() <= MAX_PLAINTEXT
    {
        let mut record = vec![0u8; SEALED_RECORD];
        record[RECORD_HEADER..RECORD_HEADER + plaintext.len()].copy_from_slice(plaintext);
        let sealed = protection.seal(&mut record, ContentType::from(typ), plaintext.len(), 3).expect("sealing");
        let (opened_type, range) = protection.open(&mut record[..sealed], 3).expect("opening what was sealed");
        assert_eq!(opened_type, typ);
        assert_eq!(&record[range], plaintext);
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;

    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

    use super::*;

    fn configs() -> (Arc<ClientConfig>, Arc<ServerConfig>) {
        let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let der = CertificateDer::from(certified.cert.der().to_vec());
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der()));
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der.clone()).unwrap();
        (client_config_trusting(roots).unwrap(), server_config_showing(vec![der], key).unwrap())
    }

    /// A TLS session over loopback TCP: the client's end, and the server's (or why each failed).
    fn handshake(client: Arc<ClientConfig>, server: Arc<ServerConfig>) -> (Result<UnixStream, String>, Result<UnixStream, String>) {
        handshake_updating_keys(client, server, None, None)
    }

    /// [`handshake`], each end replacing its key after the given number of records (`None`: at
    /// the suite's limit).
    fn handshake_updating_keys(
        client: Arc<ClientConfig>,
        server: Arc<ServerConfig>,
        client_updates: Option<u64>,
        server_updates: Option<u64>,
    ) -> (Result<UnixStream, String>, Result<UnixStream, String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let accepted = std::thread::spawn(move || {
            let (tcp, _) = listener.accept().unwrap();
            start(UnbufferedServerConnection::new(server).unwrap(), tcp, Duration::from_secs(5), server_updates)
        });
        let tcp = TcpStream::connect(address).unwrap();
        let connection = UnbufferedClientConnection::new(client, ServerName::try_from("localhost").unwrap()).unwrap();
        let connected = start(connection, tcp, Duration::from_secs(5), client_updates);
        (connected, accepted.join().unwrap())
    }

    /// Both directions at once, far beyond every buffer: each side writes 32 MiB while it reads
    /// what the other writes.
    #[test]
    fn both_directions_flow_at_once_and_the_end_reaches_the_other_side() {
        let (client_config, server_config) = configs();
        let (client, server) = handshake(client_config, server_config);
        let (mut client, mut server) = (client.unwrap(), server.unwrap());
        let payload: Arc<Vec<u8>> = Arc::new((0..32u32 << 20).map(|i| (i % 251) as u8).collect());
        let (mut client_reader, mut server_writer) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        let expected = payload.len();
        let client_reads = std::thread::spawn(move || {
            let mut from_server = vec![0u8; expected];
            client_reader.read_exact(&mut from_server).unwrap();
            from_server
        });
        let sent = payload.clone();
        let server_writes = std::thread::spawn(move || server_writer.write_all(&sent).unwrap());
        let server_reads = std::thread::spawn(move || {
            let mut from_client = Vec::new();
            server.read_to_end(&mut from_client).unwrap();
            from_client
        });
        client.write_all(&payload).unwrap();
        client.shutdown(std::net::Shutdown::Write).unwrap();
        assert!(client_reads.join().unwrap() == *payload, "server to client bytes differ");
        assert!(server_reads.join().unwrap() == *payload, "client to server bytes differ (or the end did not arrive)");
        server_writes.join().unwrap();
    }

    #[test]
    fn a_server_of_another_ca_is_refused() {
        let (client_config, _) = configs();
        let (_, stranger) = configs();
        let refused = handshake(client_config, stranger).0.unwrap_err();
        assert!(refused.contains("certificate"), "{refused}");
    }

    /// A session that reads slowly, in small pieces: the record threads hold what they read from the socket
    /// until the session takes it, and loses nothing.
    #[test]
    fn a_slow_session_gets_every_byte() {
        let (client_config, server_config) = configs();
        let (client, server) = handshake(client_config, server_config);
        let (mut client, mut server) = (client.unwrap(), server.unwrap());
        let payload: Vec<u8> = (0..64u32 << 20).map(|i| (i % 253) as u8).collect();
        let expected = payload.clone();
        let reader = std::thread::spawn(move || {
            let mut got = vec![0u8; expected.len()];
            let mut at = 0;
            while at < got.len() {
                let n = server.read(&mut got[at..(at + 100_000).min(expected.len())]).unwrap();
                assert!(n > 0, "eof at {at}");
                at += n;
                if at % 7 == 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            assert!(got == expected);
        });
        client.write_all(&payload).unwrap();
        reader.join().unwrap();
    }

    /// A TCP connection to a rustls server on its own thread that echoes what it reads (with
    /// rustls's own record layer: the check that ours speaks TLS 1.3 as rustls does), and that
    /// asks for a key update after its first read.
    fn rustls_echo_server(server: Arc<ServerConfig>) -> (TcpStream, std::thread::JoinHandle<usize>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let echo = std::thread::spawn(move || {
            let (tcp, _) = listener.accept().unwrap();
            let mut stream = rustls::StreamOwned::new(rustls::ServerConnection::new(server).unwrap(), tcp);
            let mut buffer = vec![0u8; 1 << 16];
            let mut echoed = 0;
            loop {
                let read = match stream.read(&mut buffer) {
                    Ok(0) => break,
                    Ok(read) => read,
                    Err(error) => panic!("rustls server: {error}"),
                };
                if echoed == 0 {
                    stream.conn.refresh_traffic_keys().unwrap();
                }
                stream.write_all(&buffer[..read]).unwrap();
                echoed += read;
            }
            stream.conn.send_close_notify();
            stream.flush().unwrap();
            echoed
        });
        (TcpStream::connect(address).unwrap(), echo)
    }

    /// Writes `payload` on one thread while reading the echo on this one; what came back.
    fn echo_through(session: UnixStream, payload: Arc<Vec<u8>>) -> Vec<u8> {
        let mut writer = session.try_clone().unwrap();
        let sent = payload.clone();
        let writes = std::thread::spawn(move || {
            writer.write_all(&sent).unwrap();
            writer.shutdown(std::net::Shutdown::Write).unwrap();
        });
        let mut reader = session;
        let mut echoed = Vec::new();
        reader.read_to_end(&mut echoed).unwrap();
        writes.join().unwrap();
        echoed
    }

    /// Our records, key updates included (one every 3 records, and one the peer asks for),
    /// read by rustls, and rustls's read by us.
    #[test]
    fn records_and_key_updates_interoperate_with_rustls() {
        let (client_config, server_config) = configs();
        let (tcp, echo) = rustls_echo_server(server_config);
        let connection = UnbufferedClientConnection::new(client_config, ServerName::try_from("localhost").unwrap()).unwrap();
        let session = start(connection, tcp, Duration::from_secs(5), Some(3)).unwrap();
        let payload: Arc<Vec<u8>> = Arc::new((0..6u32 << 20).map(|i| (i % 241) as u8).collect());
        let echoed = echo_through(session, payload.clone());
        assert_eq!(echo.join().unwrap(), payload.len());
        assert!(echoed == *payload, "the echo differs ({} of {} bytes)", echoed.len(), payload.len());
    }

    /// Two Flyt ends that both replace their keys every few records keep every byte.
    #[test]
    fn key_updates_between_flyt_ends_lose_nothing() {
        let (client_config, server_config) = configs();
        let (client, server) = handshake_updating_keys(client_config, server_config, Some(5), Some(2));
        let mut server = server.unwrap();
        let echo = std::thread::spawn(move || {
            let mut buffer = vec![0u8; 1 << 20];
            loop {
                let read = server.read(&mut buffer).unwrap();
                if read == 0 {
                    break;
                }
                server.write_all(&buffer[..read]).unwrap();
            }
        });
        let payload: Arc<Vec<u8>> = Arc::new((0..24u32 << 20).map(|i| (i % 239) as u8).collect());
        let echoed = echo_through(client.unwrap(), payload.clone());
        echo.join().unwrap();
        assert!(echoed == *payload, "the echo differs ({} of {} bytes)", echoed.len(), payload.len());
    }

    /// A byte changed on the wire: the session ends at the bad record at the latest, and what
    /// it got before is exactly what was sent (never a changed byte).
    #[test]
    fn a_changed_record_ends_the_session_instead_of_reaching_it() {
        let (client_config, server_config) = configs();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let server_address = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (tcp, _) = listener.accept().unwrap();
            let mut session = accept(server_config, tcp, Duration::from_secs(5)).unwrap();
            let mut got = Vec::new();
            let _ = session.read_to_end(&mut got);
            got
        });
        // A proxy that flips one byte 1 MiB after the handshake's first few KiB.
        let proxy = TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy_address = proxy.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut from_client, _) = proxy.accept().unwrap();
            let mut to_server = TcpStream::connect(server_address).unwrap();
            let (mut back_from_server, mut back_to_client) = (to_server.try_clone().unwrap(), from_client.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut back_from_server, &mut back_to_client);
            });
            let mut buffer = vec![0u8; 1 << 16];
            let mut passed = 0usize;
            let flip_at = 1 << 20;
            loop {
                let read = match from_client.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(read) => read,
                };
                if (passed..passed + read).contains(&flip_at) {
                    buffer[flip_at - passed] ^= 0x40;
                }
                passed += read;
                if to_server.write_all(&buffer[..read]).is_err() {
                    break;
                }
            }
            let _ = to_server.shutdown(std::net::Shutdown::Write);
        });
        let tcp = TcpStream::connect(proxy_address).unwrap();
        let mut client = connect(client_config, ServerName::try_from("localhost").unwrap(), tcp, Duration::from_secs(5)).unwrap();
        let payload: Vec<u8> = (0..4u32 << 20).map(|i| (i % 233) as u8).collect();
        let _ = client.write_all(&payload);
        let _ = client.shutdown(std::net::Shutdown::Write);
        let got = server.join().unwrap();
        // Records opened before the bad one may be lost with the session (a batch dies whole),
        // but nothing from the bad record on reaches it.
        assert!(got.len() <= 1 << 20, "the session got {} bytes, past the changed byte", got.len());
        assert!(got[..] == payload[..got.len()], "the session got changed bytes");
    }

    #[test]
    fn post_handshake_messages_parse_or_are_refused() {
        assert_eq!(post_handshake(&[KEY_UPDATE, 0, 0, 1, 1]).unwrap(), [PostHandshake::KeyUpdate { asked: true }]);
        let two = [KEY_UPDATE, 0, 0, 1, 0, NEW_SESSION_TICKET, 0, 0, 2, 9, 9];
        assert_eq!(post_handshake(&two).unwrap(), [PostHandshake::KeyUpdate { asked: false }, PostHandshake::SessionTicket]);
        for refused in [&[KEY_UPDATE, 0, 0, 1, 2][..], &[KEY_UPDATE, 0, 0, 2, 0, 0], &[KEY_UPDATE, 0, 0, 1], &[1, 0, 0, 0], &[KEY_UPDATE]] {
            assert!(post_handshake(refused).is_err(), "{refused:?}");
        }
    }

    #[test]
    fn record_headers_are_checked_before_anything_is_opened() {
        let record = |typ: u8, length: u16| [typ, 3, 3, (length >> 8) as u8, length as u8];
        assert_eq!(record_at(&record(23, 17), 0).unwrap(), None, "the body has not arrived");
        let mut whole = record(23, 17).to_vec();
        whole.extend([0; 17]);
        assert_eq!(record_at(&whole, 0).unwrap(), Some(17));
        assert_eq!(record_at(&whole[..4], 0).unwrap(), None);
        for bad in [record(22, 17), record(23, 16), record(23, (MAX_CIPHERTEXT + 1) as u16), record(21, 100)] {
            assert!(record_at(&bad, 0).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn what_is_sealed_opens_to_the_same_bytes_and_type() {
        for length in [0, 1, 100, MAX_PLAINTEXT] {
            let mut data = vec![u8::from(ContentType::ApplicationData)];
            data.extend((0..length).map(|i| (i % 251) as u8));
            fuzz_records(&data);
        }
        fuzz_records(&[u8::from(ContentType::Alert), 1, 0]);
    }
}
