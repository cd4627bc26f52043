//! TLS for the data plane's TCP sessions. After the handshake, a pump thread owns the TLS state
//! and the TCP socket and moves bytes between it and one end of a Unix socket pair; the session
//! reads and writes the other end ([`crate::Link::Secured`]) as it would any socket, so the
//! client's and the server's code paths (and the server's hand-over of a session to its worker
//! process) stay what they are over plain TCP.
//!
//! The pump never blocks on either side: both sockets are non-blocking and polled, plaintext
//! bound for the session waits in a bounded buffer, and the session's bytes are read only while
//! what was encrypted before and not yet sent stays under a bound. A stuck reader on one side therefore never stops the
//! other direction (each end may be writing while the other waits for it to read).

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use rustls;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, Connection, ServerConfig, ServerConnection};

/// The first byte of a TLS handshake record: how a server tells a TLS client from a plain one.
pub const HANDSHAKE_RECORD: u8 = 22;
/// Plaintext held for the session before the pump stops reading the TCP side.
const LOCAL_BACKLOG: usize = 4 << 20;
/// Bytes read from the session at a time.
const CHUNK: usize = 256 << 10;
/// Bytes read from the TCP socket at a time.
const INBOUND: usize = 1 << 20;
/// Encrypted bytes the pump lets queue for the TCP socket before it stops reading the session:
/// enough that encryption overlaps sending.
const TCP_BACKLOG: usize = 4 << 20;

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
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A client's TLS: servers must show a certificate signed by the CA in `ca_file` (PEM).
pub fn client_config(ca_file: &std::path::Path) -> Result<Arc<ClientConfig>, String> {
    let roots = roots(ca_file)?;
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| error.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// A server's TLS: its certificate chain and key (PEM). Clients prove themselves with their
/// session token, inside the TLS session.
pub fn server_config(cert_file: &std::path::Path, key_file: &std::path::Path) -> Result<Arc<ServerConfig>, String> {
    let key = private_key(key_file)?;
    let config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| error.to_string())?
        .with_no_client_auth()
        .with_single_cert(certificates(cert_file)?, key)
        .map_err(|error| format!("{}: {error}", cert_file.display()))?;
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
/// pump; returns the session's end.
pub fn connect(config: Arc<ClientConfig>, name: ServerName<'static>, tcp: TcpStream, timeout: Duration) -> Result<UnixStream, String> {
    let connection = ClientConnection::new(config, name).map_err(|error| error.to_string())?;
    start(Connection::Client(connection), tcp, timeout)
}

/// Runs a TLS handshake as the server over `tcp` (blocking, within `timeout`), then starts the
/// pump; returns the session's end.
pub fn accept(config: Arc<ServerConfig>, tcp: TcpStream, timeout: Duration) -> Result<UnixStream, String> {
    let connection = ServerConnection::new(config).map_err(|error| error.to_string())?;
    start(Connection::Server(connection), tcp, timeout)
}

fn start(mut tls: Connection, mut tcp: TcpStream, timeout: Duration) -> Result<UnixStream, String> {
    tcp.set_read_timeout(Some(timeout)).map_err(|error| error.to_string())?;
    tcp.set_write_timeout(Some(timeout)).map_err(|error| error.to_string())?;
    let deadline = Instant::now() + timeout;
    while tls.is_handshaking() {
        if Instant::now() > deadline {
            return Err(format!("no TLS handshake within {timeout:?}"));
        }
        tls.complete_io(&mut tcp).map_err(|error| error.to_string())?;
    }
    // The pump bounds what it queues itself (one chunk of the session's bytes at a time, taken
    // only once the last is sent); rustls's own 64 KiB limit would cut a chunk short.
    tls.set_buffer_limit(None);
    let (session, pumped) = UnixStream::pair().map_err(|error| error.to_string())?;
    for socket in [tcp.as_raw_fd(), pumped.as_raw_fd()] {
        set_nonblocking(socket).map_err(|error| error.to_string())?;
    }
    std::thread::Builder::new()
        .name("flyt-tls".into())
        .spawn(move || {
            if let Err(error) = Pump::new(tls, tcp, pumped).run() {
                log_end(&error);
            }
        })
        .map_err(|error| format!("no TLS thread: {error}"))?;
    Ok(session)
}

fn log_end(error: &io::Error) {
    // A library in the app's process prints nothing on an ordinary end; a broken session shows
    // itself to the session's reader (its socket ends).
    if std::env::var_os("FLYT_TLS_DEBUG").is_some() {
        eprintln!("flyt: TLS session ended: {error}");
    }
}

fn set_nonblocking(fd: i32) -> io::Result<()> {
    // SAFETY: `fd` is an open socket of the caller; F_GETFL/F_SETFL only change its flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn would_block(error: &io::Error) -> bool {
    matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted)
}

struct Pump {
    tls: Connection,
    tcp: TcpStream,
    local: UnixStream,
    /// Plaintext from the peer, not yet taken by the session.
    to_local: Vec<u8>,
    sent_to_local: usize,
    chunk: Vec<u8>,
    /// The peer closed: once `to_local` is delivered, the session sees the end.
    peer_done: bool,
    /// The session closed its writing side: the peer was told (close_notify).
    session_done: bool,
    /// The session was given the peer's end.
    local_shut: bool,
    /// Polls do not sleep until then (see `run`).
    spin_until: Instant,
    /// Bytes read from the TCP socket, `inbound_start..inbound_end` not yet given to rustls.
    inbound: Vec<u8>,
    inbound_start: usize,
    inbound_end: usize,
    /// Bytes handed to TLS and not yet seen written to the TCP socket (an estimate: records add
    /// a few bytes each).
    tcp_backlog: usize,
}

impl Pump {
    fn new(tls: Connection, tcp: TcpStream, local: UnixStream) -> Self {
        Self {
            tls,
            tcp,
            local,
            to_local: Vec::new(),
            sent_to_local: 0,
            chunk: vec![0; CHUNK],
            peer_done: false,
            session_done: false,
            local_shut: false,
            spin_until: Instant::now(),
            inbound: vec![0; INBOUND],
            inbound_start: 0,
            inbound_end: 0,
            tcp_backlog: 0,
        }
    }

    fn run(mut self) -> io::Result<()> {
        self.take_plaintext()?;
        self.flush_local()?;
        loop {
            // Bytes read while the session's backlog was full go first, once it has room (no
            // poll would wake the pump for them: they are no longer in the socket).
            if self.inbound_start < self.inbound_end && !self.peer_done && self.to_local.len() - self.sent_to_local < LOCAL_BACKLOG {
                self.decrypt_inbound()?;
                self.flush_local()?;
                continue;
            }
            let read_tcp =
                !self.peer_done && self.inbound_start == self.inbound_end && self.to_local.len() - self.sent_to_local < LOCAL_BACKLOG;
            let read_local = !self.session_done && self.tcp_backlog < TCP_BACKLOG;
            let mut polls = [
                libc::pollfd {
                    fd: self.tcp.as_raw_fd(),
                    events: (if read_tcp { libc::POLLIN } else { 0 }) | (if self.tls.wants_write() { libc::POLLOUT } else { 0 }),
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.local.as_raw_fd(),
                    events: (if read_local { libc::POLLIN } else { 0 })
                        | (if self.sent_to_local < self.to_local.len() { libc::POLLOUT } else { 0 }),
                    revents: 0,
                },
            ];
            // While the session is busy its next message is microseconds away: poll without
            // sleeping for the spin budget after the last activity (a sleeping pump's wake-up,
            // paid on both ends and both ways, would be most of a round trip), then block.
            let ready = loop {
                let timeout = if Instant::now() < self.spin_until { 0 } else { -1 };
                // SAFETY: two valid pollfds on sockets this pump owns.
                let ready = unsafe { libc::poll(polls.as_mut_ptr(), 2, timeout) };
                if ready != 0 {
                    break ready;
                }
                std::hint::spin_loop();
            };
            if ready < 0 {
                let error = io::Error::last_os_error();
                if error.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(error);
            }
            self.spin_until = Instant::now() + crate::spin_budget();
            let (tcp_events, local_events) = (polls[0].revents, polls[1].revents);
            if tcp_events & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 && read_tcp {
                self.take_from_peer()?;
            }
            if local_events & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 && read_local && !self.take_from_session()? {
                // The session is done writing: the peer is told; its bytes still flow back.
                self.session_done = true;
                self.tls.send_close_notify();
            }
            self.flush_tcp()?;
            self.flush_local()?;
            if self.peer_done && !self.local_shut && self.sent_to_local == self.to_local.len() {
                let _ = self.local.shutdown(std::net::Shutdown::Write);
                self.local_shut = true;
            }
            if self.local_shut && self.session_done && !self.tls.wants_write() {
                return Ok(());
            }
        }
    }

    /// Decrypts what the peer sent into `to_local`.
    /// Reads what the peer sent in large pieces (rustls reads at most a record, in 4 KiB steps,
    /// per call: a system call each) and decrypts it, up to the session's backlog; what is left
    /// waits in `inbound` for the session to take its plaintext.
    fn take_from_peer(&mut self) -> io::Result<()> {
        loop {
            if self.inbound_start == self.inbound_end {
                match self.tcp.read(&mut self.inbound) {
                    Ok(0) => {
                        self.peer_done = true;
                        return Ok(());
                    }
                    Ok(read) => (self.inbound_start, self.inbound_end) = (0, read),
                    Err(error) if would_block(&error) => return Ok(()),
                    Err(error) => return Err(error),
                }
            }
            self.decrypt_inbound()?;
            if self.peer_done || self.inbound_start < self.inbound_end {
                // The end, or the session's backlog is full: the rest waits.
                return Ok(());
            }
        }
    }

    /// Hands the bytes in `inbound` to rustls, a record at a time, queueing their plaintext.
    fn decrypt_inbound(&mut self) -> io::Result<()> {
        while self.inbound_start < self.inbound_end && !self.peer_done && self.to_local.len() - self.sent_to_local < LOCAL_BACKLOG {
            let mut pending = &self.inbound[self.inbound_start..self.inbound_end];
            let fed = self.tls.read_tls(&mut pending)?;
            if fed == 0 {
                // rustls reads nothing more after the peer's close_notify.
                self.peer_done = true;
            }
            self.inbound_start += fed;
            self.take_plaintext()?;
        }
        Ok(())
    }

    /// Decrypts what rustls holds and queues the plaintext for the session. Also run once before
    /// the first poll: the records that ended the handshake may have carried the session's first
    /// message (a client writes its hello right after its Finished), already read from the socket.
    fn take_plaintext(&mut self) -> io::Result<()> {
        if let Err(error) = self.tls.process_new_packets() {
            // Tell the peer why before going (the alert is queued by rustls).
            let _ = self.flush_tcp();
            return Err(io::Error::new(io::ErrorKind::InvalidData, error));
        }
        loop {
            match self.tls.reader().read(&mut self.chunk) {
                Ok(0) => {
                    self.peer_done = true;
                    return Ok(());
                }
                Ok(read) => self.to_local.extend_from_slice(&self.chunk[..read]),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(error) => return Err(error),
            }
        }
    }

    /// Encrypts what the session wrote; `false` once the session closed its end.
    fn take_from_session(&mut self) -> io::Result<bool> {
        match self.local.read(&mut self.chunk) {
            Ok(0) => Ok(false),
            Ok(read) => {
                self.tls.writer().write_all(&self.chunk[..read])?;
                self.tcp_backlog += read;
                Ok(true)
            }
            Err(error) if would_block(&error) => Ok(true),
            Err(error) => Err(error),
        }
    }

    fn flush_tcp(&mut self) -> io::Result<()> {
        while self.tls.wants_write() {
            match self.tls.write_tls(&mut self.tcp) {
                Ok(written) => self.tcp_backlog = self.tcp_backlog.saturating_sub(written),
                Err(error) if would_block(&error) => break,
                Err(error) => return Err(error),
            }
        }
        if !self.tls.wants_write() {
            self.tcp_backlog = 0;
        }
        Ok(())
    }

    fn flush_local(&mut self) -> io::Result<()> {
        while self.sent_to_local < self.to_local.len() {
            match self.local.write(&self.to_local[self.sent_to_local..]) {
                Ok(written) => self.sent_to_local += written,
                Err(error) if would_block(&error) => break,
                Err(error) => return Err(error),
            }
        }
        if self.sent_to_local == self.to_local.len() {
            self.to_local.clear();
            self.sent_to_local = 0;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

    use super::*;

    fn configs() -> (Arc<ClientConfig>, Arc<ServerConfig>) {
        let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let der = CertificateDer::from(certified.cert.der().to_vec());
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der.clone()).unwrap();
        let client = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let server = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![der], key)
            .unwrap();
        (Arc::new(client), Arc::new(server))
    }

    /// A TLS session over loopback TCP: the client's end, and the server's (or why each failed).
    fn handshake(client: Arc<ClientConfig>, server: Arc<ServerConfig>) -> (Result<UnixStream, String>, Result<UnixStream, String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let accepted = std::thread::spawn(move || {
            let (tcp, _) = listener.accept().unwrap();
            accept(server, tcp, Duration::from_secs(5))
        });
        let tcp = TcpStream::connect(address).unwrap();
        let connected = connect(client, ServerName::try_from("localhost").unwrap(), tcp, Duration::from_secs(5));
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

    /// A session that reads slowly, in small pieces: the pump holds what it read from the socket
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
}
