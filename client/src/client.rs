//! The session: opened on the first CUDA call that needs the server, then shared by every thread
//! of the app. Holds what the shim answers locally: device properties, the app's device
//! allocations (to validate pointers and infer copy directions), pinned host allocations, and
//! stream and event handles.

use std::collections::{BTreeMap, HashMap};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::frame::{FrameLimits, read_value, write_value};
use flyt_protocol::handshake::{ClientIdentity, Hello, HelloReply, SessionInfo, ShmOffer};
use flyt_protocol::locate::{LocateReply, LocateRequest};
use flyt_protocol::ops::{Op, OpClass, decode_reply, req};

use crate::IdMap;
use crate::conn::{Conn, HostDestination, Wire};
use crate::ranges::DeviceRanges;

use crate::shm;

/// Where the shim asks for its server when `FLYT_SERVER` is not set.
pub const DEFAULT_CLIENT_MANAGER_SOCKET: &str = "/run/flyt/client-manager.sock";
/// How long connecting and the handshake may take before the app gets an error.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(120);

/// Stream ids the shim hands out (as `cudaStream_t` values), far from the special handles
/// `cudaStreamLegacy` (1) and `cudaStreamPerThread` (2).
pub const STREAM_ID_BASE: u64 = 0x5_0000_0000;
/// Event ids, in a range of their own so a stream passed as an event is caught.
pub const EVENT_ID_BASE: u64 = 0xE_0000_0000;

/// A `cudaMallocHost`/`cudaHostAlloc` allocation.
pub struct HostAllocation {
    pub len: usize,
    pub flags: u32,
    /// Where it lives in the shared-memory segment (pinned on the server), if it does.
    pub segment_offset: Option<usize>,
    /// The app's own memory, registered with `cudaHostRegister` (never freed by the shim).
    pub registered: bool,
    /// Kernels may use it at its host address (a block the server mapped at that address).
    pub device_mapped: bool,
    /// Managed memory (`cuMemAllocManaged`): a mapped block freed with `cuMemFree`.
    pub managed: bool,
}

/// What a pointer into pinned or registered host memory belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostRange {
    pub start: usize,
    pub len: usize,
    pub flags: u32,
    /// Kernels may use the range at its host address.
    pub device_mapped: bool,
    /// Managed memory.
    pub managed: bool,
}

/// A stream the app created.
#[derive(Clone, Copy)]
pub struct StreamInfo {
    pub flags: u32,
    pub priority: i32,
}

/// A server of a session spread over several nodes (`FLYT_SERVER=a,b`), past the first: its
/// connection and the session devices it serves.
pub(crate) struct Node {
    conn: Arc<Conn>,
    address: String,
    /// The session index of its first device (its devices follow the earlier servers').
    first_device: u32,
}

/// The live session.
pub struct Client {
    /// The connection to the (first) server: the one a session on one server has.
    conn: Arc<Conn>,
    /// The first server's address (for a spread session's messages).
    address: String,
    /// The further servers of a session spread over several nodes; empty on one server, where
    /// every request takes `conn` without a look at the device.
    nodes: Vec<Node>,
    /// In a spread session, the session device each stream and event was made on (its server
    /// holds it): calls naming one go there.
    handle_devices: Mutex<IdMap<u64, u32>>,
    pub(crate) info: SessionInfo,
    /// Device ranges the app may copy to or from: allocations and module variables.
    pub(crate) ranges: DeviceRanges,
    pub(crate) host_allocations: Mutex<BTreeMap<usize, HostAllocation>>,
    pub(crate) streams: Mutex<IdMap<u64, StreamInfo>>,
    pub(crate) events: Mutex<IdMap<u64, u32>>,
    next_stream: AtomicU64,
    next_event: AtomicU64,
    /// Bumped by `cudaDeviceReset`, which destroys every per-thread default stream.
    pub(crate) reset_generation: AtomicU64,
    /// The shared-memory channel, when the server shares this host.
    pub(crate) shm: Option<crate::shm::Channel>,
    /// `(least, greatest)` stream priority, asked of the server once.
    pub(crate) priority_range: OnceLock<(i32, i32)>,
    /// Graphs, captures and host functions.
    pub(crate) graphs: crate::graphs::Graphs,
    /// Virtual memory management.
    pub(crate) vmm: crate::vmm::Vmm,
    /// Arrays and mipmapped arrays.
    pub(crate) arrays: crate::arrays::Arrays,
    /// CUDA IPC mappings this process opened.
    pub(crate) ipc: crate::ipc::Ipc,
    /// Managed allocations and the advice given for them.
    pub(crate) managed: crate::managed::Managed,
    /// Mirrors of `__managed__` variables.
    pub(crate) mirrors: crate::mirrors::Mirrors,
    /// Resource descriptors and green contexts.
    pub(crate) greens: crate::green::Greens,
    /// The session's devices the app sees (`CUDA_VISIBLE_DEVICES`), as server indices in the
    /// app's order: the app's device `i` is the server's `visible[i]`.
    visible: Vec<u32>,
    /// Data connections for large copies over a socket (`stripes.rs`).
    pub(crate) stripes: crate::stripes::Stripes,
    /// Context limits learned, by `(device, limit)` (`device_limit`).
    limits: Mutex<HashMap<(u32, u32), u64>>,
    /// Streams known to have finished their work, with the connection's frame count then
    /// (`stream_finished`).
    finished_streams: Mutex<IdMap<u64, u64>>,
}

/// `CU_LIMIT_STACK_SIZE`: the driver raises it by itself when a launch needs a larger stack.
const LIMIT_STACK_SIZE: u32 = 0;

static CLIENT: OnceLock<Result<Client, CudaError>> = OnceLock::new();

/// The session, opened on first use. A failure is permanent for the process, as CUDA's own
/// initialization errors are, and its one-line reason was printed when it happened.
pub fn client() -> CudaResult<&'static Client> {
    let client = CLIENT.get_or_init(open);
    match client {
        Ok(client) => {
            // Attached before any thread that got the session sends work (a load once set).
            client.attach_all();
            Ok(client)
        }
        Err(error) => Err(*error),
    }
}

impl crate::conn::SessionLink for Client {
    fn host_job(&self, job: crate::graphs::HostJob, origin: u32) {
        self.host_call_arrived(job, origin);
    }

    fn capture_mode(&self) -> Option<u32> {
        self.capture_mode_for_thread()
    }

    fn host_functions_pending(&self) -> bool {
        self.graphs.host_functions_pending()
    }

    fn over_budget(&self, bytes: u64) {
        over_budget(bytes);
    }

    fn reconnect(&self, address: Option<&str>, snapshot: &str) -> Result<(Wire, Wire), String> {
        if self.spread() {
            // Which of its servers moved is not known here, nor do the others pause with it.
            return Err("a session spread over several servers cannot move yet".into());
        }
        let (reader, writer, info, address) = reconnect(address, snapshot, self.shm.as_ref())?;
        // The data connections join the new server's session (a move over TCP keeps striping).
        self.stripes.moved(&info, &address);
        Ok((reader, writer))
    }
}

/// The session if one is open; never opens one.
pub fn existing_client() -> Option<&'static Client> {
    let client = CLIENT.get().and_then(|client| client.as_ref().ok())?;
    client.attach_all();
    Some(client)
}

/// What the driver front does when the server says the tenant holds `bytes` over its quota.
static OVER_BUDGET: OnceLock<fn(u64)> = OnceLock::new();

/// Installs the over-budget handler (once; later calls keep the first).
pub fn on_over_budget(handler: fn(u64)) {
    let _ = OVER_BUDGET.set(handler);
}

/// The server's over-budget notice, read by whichever thread read the connection: the handler
/// must not block it (the driver front hands the notice to a thread of its own).
fn over_budget(bytes: u64) {
    match OVER_BUDGET.get() {
        Some(handler) => handler(bytes),
        None => crate::diagnostics::once(
            "over-budget",
            &format!("flyt: the slice's memory quota is now {bytes} bytes below what the tenant holds"),
        ),
    }
}

fn identity() -> ClientIdentity {
    let read = |path: &str| std::fs::read_to_string(path).map(|text| text.trim().to_string()).unwrap_or_default();
    let program = std::env::current_exe()
        .ok()
        .and_then(|path| path.file_name().map(|name| name.to_string_lossy().into_owned()))
        .unwrap_or_else(|| read("/proc/self/comm"));
    ClientIdentity {
        hostname: read("/proc/sys/kernel/hostname"),
        pid: std::process::id(),
        program,
        boot_id: read("/proc/sys/kernel/random/boot_id"),
    }
}

/// Connects to the server; over TCP with `tls_ca`, through TLS checked against that CA. In a VM,
/// `serial:PORT` is a virtio-serial port its host connects to the server's Unix socket.
pub(crate) fn connect_wire(address: &str, tls_ca: Option<&str>) -> Result<Wire, String> {
    connect_wire_within(address, tls_ca, CONNECT_TIMEOUT, HANDSHAKE_TIMEOUT)
}

/// [`connect_wire`] with its own limits on the TCP connect and the TLS handshake (a broken
/// session's connection made again within its window, `crate::reconnect`).
pub(crate) fn connect_wire_within(address: &str, tls_ca: Option<&str>, connect: Duration, handshake: Duration) -> Result<Wire, String> {
    if let Some(path) = address.strip_prefix("unix:") {
        return UnixStream::connect(path).map(Wire::Unix).map_err(|error| format!("cannot connect to {path}: {error}"));
    }
    if let Some(port) = address.strip_prefix("serial:") {
        return flyt_ring::serial::open_port(std::path::Path::new(port))
            .map(Wire::Serial)
            .map_err(|error| format!("cannot open the serial port {port}: {error}"));
    }
    let address = address.strip_prefix("tcp:").unwrap_or(address);
    let targets = address.to_socket_addrs().map_err(|error| format!("bad server address '{address}': {error}"))?;
    let mut last = format!("'{address}' resolves to no address");
    for target in targets {
        match TcpStream::connect_timeout(&target, connect) {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                set_keepalive(&stream);
                let Some(ca) = tls_ca else { return Ok(Wire::Tcp(stream)) };
                let config = flyt_ring::tls::client_config(std::path::Path::new(ca)).map_err(|error| format!("FLYT_TLS_CA: {error}"))?;
                let name = flyt_ring::tls::server_name(address)?;
                let local = flyt_ring::tls::connect(config, name, stream, handshake).map_err(|error| {
                    format!("TLS with {address} failed: {error} (does the server use TLS, with a certificate from this CA?)")
                })?;
                return Ok(Wire::Secured(local));
            }
            Err(error) => last = format!("cannot connect to {target}: {error}"),
        }
    }
    Err(last)
}

/// A dead server is noticed within seconds, even with no request in flight.
fn set_keepalive(stream: &TcpStream) {
    use std::os::fd::AsRawFd;
    let fd = stream.as_raw_fd();
    for (level, option, value) in [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 5),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3),
    ] {
        let value: libc::c_int = value;
        // SAFETY: `fd` is an open socket owned by `stream`; the option value is a live c_int of
        // the size passed.
        unsafe {
            libc::setsockopt(fd, level, option, (&raw const value).cast(), size_of::<libc::c_int>() as libc::socklen_t);
        }
    }
}

/// Asks the local client manager which server to use: its address, the session token, and the
/// cluster's CA when TCP sessions must use TLS.
/// Where the session goes: the server's address, its token, the cluster's CA, and whether this
/// host (a VM) may use its ivshmem region with that server.
type Located = (String, Option<String>, Option<String>, bool);

fn locate(identity: &ClientIdentity) -> Result<Located, String> {
    let socket = std::env::var("FLYT_CLIENT_MANAGER_SOCKET").unwrap_or_else(|_| DEFAULT_CLIENT_MANAGER_SOCKET.into());
    let mut stream = UnixStream::connect(&socket).map_err(|error| {
        format!("no FLYT_SERVER set and no client manager at {socket} ({error}): set FLYT_SERVER=host:port or start flyt-client-manager")
    })?;
    let _ = stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT));
    write_value(&mut stream, 1, &LocateRequest { client: identity.clone() }).map_err(|error| format!("client manager: {error}"))?;
    let limits = FrameLimits { max_message: 64 << 10, max_bulk: 0 };
    match read_value::<LocateReply>(&mut stream, &limits) {
        Ok((_, LocateReply::Server { address, token, tls_ca, ivshmem, .. })) => {
            Ok((address, Some(token), (!tls_ca.is_empty()).then_some(tls_ca), ivshmem))
        }
        Ok((_, LocateReply::Refused { reason })) => Err(format!("no GPU for this client: {reason}")),
        Err(error) => Err(format!("client manager at {socket}: {error}")),
    }
}

/// Where the session was opened, to continue it after a move.
struct Origin {
    address: String,
    token: Option<String>,
    tls_ca: Option<String>,
    identity: ClientIdentity,
}

static ORIGIN: OnceLock<Origin> = OnceLock::new();

/// A new connection to the session's server (`address`, or the first one's) made as the
/// session's own was (TLS), and a hello with its token and identity: for the session's data
/// connections (`stripes.rs`).
pub(crate) fn connect_again(address: Option<&str>) -> Result<(Wire, Hello), String> {
    let origin = ORIGIN.get().ok_or("the session has not opened")?;
    let wire = connect_wire(address.unwrap_or(&origin.address), origin.tls_ca.as_deref())?;
    Ok((wire, Hello::new(origin.token.clone(), origin.identity.clone(), None)))
}

/// How long a moved session tries to reach its new server (`FLYT_RESUME_TIMEOUT`, seconds): a
/// server restarting from its checkpoint may take a while.
fn resume_timeout() -> Duration {
    let seconds = std::env::var("FLYT_RESUME_TIMEOUT").ok().and_then(|value| value.parse().ok()).unwrap_or(600);
    Duration::from_secs(seconds)
}

/// One attempt to continue snapshot `snapshot` at `address`, with the session's shared-memory
/// segment if it has one: the connection's two halves.
fn resume_at(origin: &Origin, address: &str, snapshot: &str, channel: Option<&shm::Channel>) -> Result<(Wire, Wire, SessionInfo), String> {
    let mut wire = connect_wire(address, origin.tls_ca.as_deref())?;
    wire.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(|error| error.to_string())?;
    let offer = channel.map(|channel| channel.offer_again(matches!(wire, Wire::Unix(_)))).transpose()?;
    let hello = Hello { resume: Some(snapshot.to_string()), ..Hello::new(origin.token.clone(), origin.identity.clone(), offer.clone()) };
    if let Some(channel) = channel {
        channel.clear_rings();
    }
    write_value(&mut wire, 0, &hello).map_err(|error| format!("server {address}: {error}"))?;
    if let (Some(channel), Some(offer), Wire::Unix(socket)) = (channel, &offer, &wire)
        && offer.path.is_empty()
    {
        shm::send_descriptor(socket, channel.file()).map_err(|error| format!("sending the segment to {address}: {error}"))?;
    }
    let limits = FrameLimits { max_message: 16 << 20, max_bulk: 0 };
    let info = match read_value::<HelloReply>(&mut wire, &limits) {
        Ok((_, HelloReply::Accepted(info))) => info,
        Ok((_, HelloReply::Refused { reason, .. })) => return Err(format!("{address} refused: {reason}")),
        Ok((_, HelloReply::Reattached { .. })) => return Err(format!("{address} answered a session it was not asked for")),
        Err(error) => return Err(format!("{address}: {error}")),
    };
    if channel.is_some() && !info.shm_accepted {
        return Err(format!("{address} did not take the session's shared memory back"));
    }
    wire.set_read_timeout(None).map_err(|error| error.to_string())?;
    match channel.filter(|_| info.rings) {
        Some(channel) => {
            let fd = std::os::fd::AsRawFd::as_raw_fd(&wire);
            // SAFETY: `fd` is the new connection's socket, which both ring halves keep open (they
            // hold the `Arc` below) for as long as they are used.
            let (ring_in, ring_out) = unsafe { channel.rings(channel.ring_capacity(), fd) };
            let socket = Arc::new(wire);
            Ok((Wire::RingIn(ring_in, socket.clone()), Wire::RingOut(ring_out, socket), info))
        }
        None => {
            let (reader, writer) =
                crate::reconnect::halves(wire, &info, address, origin.tls_ca.as_deref(), &hello).map_err(|error| error.to_string())?;
            Ok((reader, writer, info))
        }
    }
}

/// Continues a moved session on `address` (or the server it had): retries until the server
/// there has its snapshot, within `FLYT_RESUME_TIMEOUT`. The new connection's two halves.
fn reconnect(
    address: Option<&str>,
    snapshot: &str,
    channel: Option<&crate::shm::Channel>,
) -> Result<(Wire, Wire, SessionInfo, String), String> {
    let origin = ORIGIN.get().ok_or("a move before the session opened")?;
    let address = address.unwrap_or(&origin.address);
    let deadline = std::time::Instant::now() + resume_timeout();
    let mut told = false;
    loop {
        match resume_at(origin, address, snapshot, channel) {
            Ok((reader, writer, info)) => {
                if told {
                    crate::diagnostics::once("resumed", &format!("flyt: the session goes on at {address}"));
                }
                return Ok((reader, writer, info, address.to_string()));
            }
            Err(reason) if std::time::Instant::now() < deadline => {
                if !told {
                    crate::diagnostics::once(
                        "resuming",
                        &format!("flyt: waiting for the GPU server at {address} to continue this session ({reason})"),
                    );
                    told = true;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(reason) => return Err(format!("the session could not continue at {address}: {reason}")),
        }
    }
}

/// How long a session on a VM's serial port waits for its host to connect the port again.
const SERIAL_RECONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// A serial port carries one session per connection its host makes, and the host learns of no
/// app's exit: an earlier app's session may still own the stream. Its server ends that session
/// on seeing this one's hello (not a doorbell) and closes the connection; QEMU connects the port
/// again (`reconnect=SECONDS`), and the hello goes out once more on the fresh stream.
fn serial_handshake_again(address: &str, hello: &Hello, limits: &FrameLimits) -> Result<(Wire, HelloReply), String> {
    let deadline = std::time::Instant::now() + SERIAL_RECONNECT_TIMEOUT;
    let mut last = String::from("the port did not open again");
    while std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        // The first attempt's pumps may hold the port a moment longer (it opens exclusively).
        let mut wire = match connect_wire(address, None) {
            Ok(wire) => wire,
            Err(reason) => {
                last = reason;
                continue;
            }
        };
        let _ = wire.set_read_timeout(Some(HANDSHAKE_TIMEOUT));
        if let Err(error) = write_value(&mut wire, 0, hello) {
            last = error.to_string();
            continue;
        }
        match read_value::<HelloReply>(&mut wire, limits) {
            Ok((_, reply)) => return Ok((wire, reply)),
            Err(error) => last = error.to_string(),
        }
    }
    Err(format!(
        "nor within {} s on the port again ({last}): does QEMU connect the port again (its chardev's reconnect=1)?",
        SERIAL_RECONNECT_TIMEOUT.as_secs()
    ))
}

fn open() -> Result<Client, CudaError> {
    let client = open_session().map_err(|(error, reason)| {
        crate::diagnostics::once("session", &format!("flyt: {reason}"));
        error
    })?;
    // A server that keeps a TCP session for its returning client ends it at once when the app
    // exits (`Conn::goodbye`), not a grace period later.
    extern "C" fn goodbye_at_exit() {
        let _ = std::panic::catch_unwind(|| {
            if let Some(Ok(client)) = CLIENT.get() {
                client.conn.goodbye();
                for node in &client.nodes {
                    node.conn.goodbye();
                }
            }
        });
    }
    // SAFETY: registering a plain `extern "C" fn()` with atexit is always sound.
    unsafe { libc::atexit(goodbye_at_exit) };
    Ok(client)
}

/// `FLYT_SERVER` (or the client manager's answer) as a list: one server, or a tenant's servers
/// on several nodes separated by commas (`unix:/run/a.sock,10.0.0.2:4000`), whose devices the
/// app sees in that order, server by server.
fn server_list(servers: &str) -> Vec<String> {
    let list: Vec<String> = servers.split(',').map(str::trim).filter(|server| !server.is_empty()).map(String::from).collect();
    if list.is_empty() { vec![servers.to_string()] } else { list }
}

/// The token for each of `count` servers: one token for all (an allocation's servers share its
/// id), or as many comma-separated tokens as servers.
fn server_tokens(token: Option<&str>, count: usize) -> Result<Vec<Option<String>>, String> {
    let Some(token) = token.filter(|token| token.contains(',')) else {
        return Ok(vec![token.map(String::from); count]);
    };
    let tokens: Vec<Option<String>> = token.split(',').map(|token| Some(token.trim().to_string())).collect();
    if tokens.len() != count {
        return Err(format!("FLYT_TOKEN names {} tokens for {count} servers: give one, or one per server", tokens.len()));
    }
    Ok(tokens)
}

/// Opens the session's share on a further server (`address`, a tenant spread over nodes): a
/// plain socket session (the shared-memory channel is the first server's), its connection and
/// what it reports.
fn open_node(
    address: &str,
    token: Option<String>,
    tls_ca: Option<&str>,
    identity: &ClientIdentity,
) -> Result<(Arc<Conn>, SessionInfo), (CudaError, String)> {
    let unavailable = |reason: String| (CudaError::DEVICES_UNAVAILABLE, reason);
    let mut wire = connect_wire(address, tls_ca).map_err(unavailable)?;
    wire.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(|error| unavailable(error.to_string()))?;
    let hello = Hello::new(token, identity.clone(), None);
    write_value(&mut wire, 0, &hello).map_err(|error| unavailable(format!("server {address}: {error}")))?;
    let limits = FrameLimits { max_message: 16 << 20, max_bulk: 0 };
    let info = match read_value::<HelloReply>(&mut wire, &limits) {
        Ok((_, HelloReply::Accepted(info))) => info,
        Ok((_, HelloReply::Refused { error, reason })) => {
            return Err((CudaError::from_code(error), format!("the GPU server {address} refused the session: {reason}")));
        }
        Ok((_, HelloReply::Reattached { .. })) => {
            return Err(unavailable(format!("the server {address} answered a session it was not asked for")));
        }
        Err(error) => return Err(unavailable(format!("server {address} did not complete the handshake: {error}"))),
    };
    if info.devices.is_empty() {
        return Err(unavailable(format!("the server {address} has no device")));
    }
    wire.set_read_timeout(None).map_err(|error| unavailable(error.to_string()))?;
    let (reader, wire) = crate::reconnect::halves(wire, &info, address, tls_ca, &hello).map_err(|error| unavailable(error.to_string()))?;
    let conn = Conn::start(reader, wire, address.to_string())
        .map_err(|error| unavailable(format!("cannot start the session threads for {address}: {error}")))?;
    Ok((conn, info))
}

/// Adds a further server's devices to the session's: numbered after the earlier servers',
/// its peer answers moved with them, and every pair across the two servers no peers (no path
/// between GPUs of two nodes: access, atomics and arrays read 0).
fn join_node(info: &mut SessionInfo, node: SessionInfo) {
    use flyt_protocol::device::{NvLinkEnd, PeerLink};
    let first = info.devices.len() as u32;
    let count = node.devices.len() as u32;
    for earlier in 0..first {
        for later in first..first + count {
            for (from, to) in [(earlier, later), (later, earlier)] {
                info.peers.push(PeerLink { from, to, access_supported: 0, performance_rank: 0, native_atomics: 0, array_access: 0 });
            }
        }
    }
    info.peers.extend(node.peers.into_iter().map(|link| PeerLink { from: link.from + first, to: link.to + first, ..link }));
    // NVLinks name devices of their own server: numbered after the earlier servers' here.
    info.nvlinks.resize(first as usize, Vec::new());
    info.nvlinks.extend(node.nvlinks.into_iter().map(|links| {
        links.into_iter().map(|end| if let NvLinkEnd::Device(far) = end { NvLinkEnd::Device(far + first) } else { end }).collect()
    }));
    info.devices.extend(node.devices);
    // Copies to either server go in pieces both take.
    info.copy_chunk = info.copy_chunk.min(node.copy_chunk);
    info.emulated &= node.emulated;
}

fn open_session() -> Result<Client, (CudaError, String)> {
    let unavailable = |reason: String| (CudaError::DEVICES_UNAVAILABLE, reason);
    let identity = identity();
    // A server named directly may be the VM's host (the region is tried and the server says);
    // the client manager says whether it is (shared-mem mode) or not (RPC-only).
    let (servers, token, cluster_ca, ivshmem) = match std::env::var("FLYT_SERVER") {
        Ok(address) if !address.is_empty() => (address, std::env::var("FLYT_TOKEN").ok(), None, true),
        _ => locate(&identity).map_err(unavailable)?,
    };
    // Several servers (a tenant spread over nodes): the first carries the session as one server
    // does, the others add their devices (`open_node`).
    let servers = server_list(&servers);
    let tokens = server_tokens(token.as_deref(), servers.len()).map_err(unavailable)?;
    let (address, token) = (servers[0].clone(), tokens[0].clone());
    // FLYT_TLS_CA wins over the client manager's word.
    let tls_ca = std::env::var("FLYT_TLS_CA").ok().filter(|ca| !ca.is_empty()).or(cluster_ca);
    let mut wire = connect_wire(&address, tls_ca.as_deref()).map_err(unavailable)?;
    wire.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(|error| unavailable(error.to_string()))?;
    let wanted = shm::Wanted::from_env();
    let offered = match wanted {
        shm::Wanted::Off => None,
        // In a virtual machine given an ivshmem region, the segment is a slot of it; anywhere
        // else (or if the region cannot be used), a file of this process.
        _ => match shm::region_path()
            .filter(|_| ivshmem)
            .and_then(|path| {
                shm::create_in_region(&path)
                    .map_err(|reason| crate::diagnostics::once("ivshmem", &format!("flyt: ivshmem region unused: {reason}")))
                    .ok()
            })
            .map_or_else(|| shm::create(wire.is_tcp()), Ok)
        {
            Ok(offered) => Some(offered),
            Err(reason) if wanted == shm::Wanted::Required => {
                return Err(unavailable(format!("FLYT_SHM=on but no shared-memory segment: {reason}")));
            }
            Err(_) => None,
        },
    };
    let offer = offered.as_ref().map(|offered| ShmOffer {
        path: offered.path().map(|path| path.display().to_string()).unwrap_or_default(),
        size: offered.size as u64,
        staging: offered.staging as u64,
        rings: offered.rings as u64,
        region: offered.claim(),
    });
    let _ = ORIGIN.set(Origin { address: address.clone(), token: token.clone(), tls_ca: tls_ca.clone(), identity: identity.clone() });
    let hello = Hello::new(token, identity.clone(), offer);
    write_value(&mut wire, 0, &hello).map_err(|error| unavailable(format!("server {address}: {error}")))?;
    if let (Some(offered @ shm::Offered { source: shm::Source::Memfd, .. }), Wire::Unix(socket)) = (&offered, &wire) {
        shm::send_descriptor(socket, &offered.file).map_err(|error| unavailable(format!("sending the segment: {error}")))?;
    }
    let limits = FrameLimits { max_message: 16 << 20, max_bulk: 0 };
    let reply = match read_value::<HelloReply>(&mut wire, &limits) {
        Ok((_, reply)) => reply,
        Err(error) if matches!(wire, Wire::Serial(_)) => {
            let (again, reply) = serial_handshake_again(&address, &hello, &limits)
                .map_err(|reason| unavailable(format!("server {address} did not complete the handshake: {error}; {reason}")))?;
            wire = again;
            reply
        }
        Err(error) => return Err(unavailable(format!("server {address} did not complete the handshake: {error}"))),
    };
    let info = match reply {
        HelloReply::Accepted(info) => info,
        HelloReply::Refused { error, reason } => {
            return Err((CudaError::from_code(error), format!("the GPU server {address} refused the session: {reason}")));
        }
        HelloReply::Reattached { .. } => return Err(unavailable(format!("the server {address} answered a session it was not asked for"))),
    };
    wire.set_read_timeout(None).map_err(|error| unavailable(error.to_string()))?;
    let rings = offered.as_ref().filter(|_| info.shm_accepted && info.rings).map(|offered| offered.rings);
    // A VM's serial port carries one session per connection: no data connections there.
    let stripes = crate::stripes::Stripes::new(&info, wire.is_tcp(), info.shm_accepted || matches!(wire, Wire::Serial(_)));
    let shm = match offered {
        Some(offered) if info.shm_accepted => Some(shm::Channel::new(offered)),
        Some(offered) => {
            offered.abandon();
            if wanted == shm::Wanted::Required {
                let reason = info.shm_refusal.clone().unwrap_or_else(|| "the server declined it".into());
                return Err(unavailable(format!("FLYT_SHM=on but the shared-memory channel is not available: {reason}")));
            }
            None
        }
        None => None,
    };
    let (reader, writer) = match (rings, &shm) {
        (Some(capacity), Some(channel)) => {
            let fd = std::os::fd::AsRawFd::as_raw_fd(&wire);
            // SAFETY: `fd` is the session's socket, which the ring halves keep open (both hold
            // the `Arc` below) for as long as they are used.
            let (ring_in, ring_out) = unsafe { channel.rings(capacity, fd) };
            let socket = Arc::new(wire);
            (Wire::RingIn(ring_in, socket.clone()), Wire::RingOut(ring_out, socket))
        }
        _ => crate::reconnect::halves(wire, &info, &address, tls_ca.as_deref(), &hello).map_err(|error| unavailable(error.to_string()))?,
    };
    let conn =
        Conn::start(reader, writer, address.clone()).map_err(|error| unavailable(format!("cannot start the session threads: {error}")))?;
    if info.devices.is_empty() {
        return Err(unavailable("the server has no device".into()));
    }
    let first_devices = info.devices.len() as u32;
    let mut info = info;
    let mut nodes = Vec::new();
    for (address, token) in servers.iter().zip(tokens).skip(1) {
        let (node_conn, node_info) = open_node(address, token, tls_ca.as_deref(), &identity)?;
        let node = Node { conn: node_conn, address: address.clone(), first_device: info.devices.len() as u32 };
        node.conn.serve_devices(node.first_device, node_info.devices.len() as u32);
        join_node(&mut info, node_info);
        nodes.push(node);
    }
    if !nodes.is_empty() {
        conn.serve_devices(0, first_devices);
        crate::registry::spread_over(std::iter::once(conn.clone()).chain(nodes.iter().map(|node| node.conn.clone())).collect());
    }
    let visible = crate::devices::visible_devices(std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(), &info.devices);
    if visible.is_empty() {
        return Err(unavailable(format!(
            "CUDA_VISIBLE_DEVICES={} names none of the session's {} device(s)",
            std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default(),
            info.devices.len()
        )));
    }
    // Threads that name no device use the app's device 0.
    crate::devices::set_default_device(visible[0]);
    Ok(Client {
        visible,
        conn,
        address,
        nodes,
        handle_devices: Mutex::default(),
        info,
        ranges: DeviceRanges::default(),
        host_allocations: Mutex::new(BTreeMap::new()),
        streams: Mutex::default(),
        events: Mutex::default(),
        next_stream: AtomicU64::new(STREAM_ID_BASE),
        next_event: AtomicU64::new(EVENT_ID_BASE),
        reset_generation: AtomicU64::new(0),
        shm,
        priority_range: OnceLock::new(),
        graphs: crate::graphs::Graphs::default(),
        vmm: crate::vmm::Vmm::default(),
        arrays: crate::arrays::Arrays::default(),
        ipc: crate::ipc::Ipc::default(),
        managed: crate::managed::Managed::default(),
        mirrors: crate::mirrors::Mirrors::default(),
        greens: crate::green::Greens::default(),
        stripes,
        limits: Mutex::new(HashMap::new()),
        finished_streams: Mutex::default(),
    })
}

/// Makes a device allocation with `allocate` until `claim` takes its place (it fails where host
/// memory of this process lies at the allocation's `address`). One that lands on host memory is
/// kept aside while another is made (so the server cannot hand the same address back), then freed
/// with `free`. After 8 such landings the allocation fails.
pub(crate) fn place_off_host<T: Copy>(
    mut allocate: impl FnMut() -> CudaResult<T>,
    mut claim: impl FnMut(T) -> bool,
    address: impl Fn(T) -> u64,
    free: impl Fn(T),
) -> CudaResult<T> {
    const TRIES: usize = 8;
    let mut aside = Vec::new();
    let placed = loop {
        let placed = match allocate() {
            Ok(placed) => placed,
            Err(error) => break Err(error),
        };
        if claim(placed) {
            break Ok(placed);
        }
        aside.push(placed);
        if aside.len() == TRIES {
            crate::diagnostics::once(
                "allocation-over-host-memory",
                &format!(
                    "flyt: the GPU server's device addresses kept landing on this process's host memory (last at {:#x}); an allocation failed",
                    address(placed)
                ),
            );
            break Err(CudaError::MEMORY_ALLOCATION);
        }
    };
    for placed in aside {
        free(placed);
    }
    placed
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Client {
    /// Attaches the session to its connections (see [`Conn::attach`]).
    fn attach_all(&'static self) {
        self.conn.attach(self);
        for node in &self.nodes {
            node.conn.attach(self);
        }
    }

    /// The connection the calling thread's requests go to: its device's server. One look at a
    /// length for a session on one server.
    #[inline]
    pub(crate) fn conn(&self) -> &Arc<Conn> {
        if self.nodes.is_empty() { &self.conn } else { self.conn_of(crate::devices::thread_device()) }
    }

    /// Whether the session has one server (not spread over several nodes).
    pub(crate) fn single_server(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The connection of the session device `device` (its server's, in a spread session).
    pub(crate) fn conn_of(&self, device: u32) -> &Arc<Conn> {
        match self.node_of(device) {
            0 => &self.conn,
            node => &self.nodes[node - 1].conn,
        }
    }

    /// Which server serves the session device `device`: 0 the first, `k` the `k`th further one.
    pub(crate) fn node_of(&self, device: u32) -> usize {
        self.nodes.iter().rposition(|node| device >= node.first_device).map_or(0, |position| position + 1)
    }

    /// The address of server `node` (see [`Client::node_of`]).
    pub(crate) fn node_address(&self, node: usize) -> &str {
        match node {
            0 => &self.address,
            node => &self.nodes[node - 1].address,
        }
    }

    /// A session device's index on its own server.
    pub fn local_device(&self, device: u32) -> u32 {
        match self.node_of(device) {
            0 => device,
            node => device - self.nodes[node - 1].first_device,
        }
    }

    /// Whether the session's devices are served by several servers (a tenant on several nodes).
    pub fn spread(&self) -> bool {
        !self.nodes.is_empty()
    }

    /// The shared-memory channel, for a request the calling thread sends now: the first
    /// server's, so none while the thread's device is another server's.
    pub(crate) fn channel(&self) -> Option<&shm::Channel> {
        if self.nodes.is_empty() || self.node_of(crate::devices::thread_device()) == 0 { self.shm.as_ref() } else { None }
    }

    // --- what the driver front asks of the session (its fields are the client's own) ---

    /// Waits for `stream`'s work (a synchronizing call: earlier work's errors arrive here).
    pub fn sync_stream(&self, stream: u64) -> CudaResult<()> {
        self.call(flyt_protocol::ops::req::StreamSynchronize { stream }).map(drop)
    }

    /// `cuStreamSynchronize`. Answered here when the stream's work is known finished and nothing
    /// was sent since (`.item()` is a device-to-host copy into pageable memory, which waits for
    /// the stream, then a synchronize: one round trip, not two): the stream has no work, and
    /// errors of asynchronous copies the client holds are still reported. A sticky error of
    /// another stream's kernel may then come at the next call instead, as it may natively when
    /// it happens a moment later.
    pub fn synchronize_stream(&self, stream: u64) -> CudaResult<()> {
        if self.stream_finished(stream) {
            // A pause the server asked for meanwhile sends a request, which ends the shortcut.
            self.conn().read_arrived()?;
        }
        if self.stream_finished(stream) {
            self.conn().take_deferred().map_or(Ok(()), Err)?;
            return self.pull_mirrors(false);
        }
        let (slot, mark) = self.conn().send_for_reply_marked(&req::StreamSynchronize { stream }.into(), None)?;
        self.conn().flush()?;
        self.reply::<req::StreamSynchronize>(slot.wait())?;
        self.pull_mirrors(false)?;
        self.note_stream_finished(stream, mark);
        Ok(())
    }

    /// A call ordered on `stream` whose reply came, sent when the connection had sent `mark`
    /// frames: the stream's work up to it is done.
    pub(crate) fn note_stream_finished(&self, stream: u64, mark: u64) {
        // Several servers' connections count their own frames.
        if self.spread() {
            return;
        }
        let mut finished = lock(&self.finished_streams);
        finished.retain(|_, at| *at == mark);
        finished.insert(stream, mark);
    }

    /// Whether `stream` finished its work and nothing at all was sent since.
    fn stream_finished(&self, stream: u64) -> bool {
        lock(&self.finished_streams).get(&stream).is_some_and(|mark| *mark == self.conn().frames_sent())
    }

    /// The server's `cudaDriverGetVersion`.
    pub fn driver_version(&self) -> i32 {
        self.info.driver_version
    }

    /// Whether the server's device is the emulated one (kernels cannot run).
    pub fn emulated(&self) -> bool {
        self.info.emulated
    }

    /// Whether the session has the shared-memory channel.
    pub fn has_shared_memory(&self) -> bool {
        self.shm.is_some()
    }

    /// Graphs, captures and host functions.
    pub fn graphs(&self) -> &crate::graphs::Graphs {
        &self.graphs
    }

    /// Managed allocations and the advice given for them.
    pub fn managed(&self) -> &crate::managed::Managed {
        &self.managed
    }

    /// Mirrors of `__managed__` variables, managed memory and mapped memory without the channel.
    pub fn mirrors(&self) -> &crate::mirrors::Mirrors {
        &self.mirrors
    }

    /// Marks the allocation at `ptr` as one `cuIpcGetMemHandle` exports (`cuMemAlloc`'s).
    pub fn mark_legacy_ipc(&self, ptr: u64) {
        self.ranges.mark_legacy_ipc(ptr);
    }

    /// Whether the device range holding `ptr` is one `cuIpcGetMemHandle` exports.
    pub fn legacy_ipc_capable(&self, ptr: u64) -> bool {
        self.ranges.legacy_ipc_capable(ptr)
    }

    /// The app's device the device range holding `ptr` was made on.
    pub fn device_of(&self, ptr: u64) -> Option<usize> {
        self.ranges.device_of(ptr).and_then(|server| self.app_device(server))
    }

    /// The buffer id of the device range holding `ptr` (`CU_POINTER_ATTRIBUTE_BUFFER_ID`).
    pub fn buffer_id(&self, ptr: u64) -> Option<u64> {
        self.ranges.buffer_id(ptr)
    }

    /// Bytes of device memory this process holds.
    pub fn allocated_bytes(&self) -> u64 {
        self.ranges.allocated_bytes()
    }

    /// An event's creation flags, if it is one of the app's.
    pub fn event_flags(&self, event: u64) -> Option<u32> {
        self.events.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&event).copied()
    }

    /// Forgets an app's event; `false` when it was none.
    pub fn forget_event(&self, event: u64) -> bool {
        self.events.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&event).is_some()
    }

    /// A stream's flags and priority as the app created it (the default streams have neither).
    pub fn stream_info(&self, stream: u64) -> StreamInfo {
        self.streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&stream)
            .copied()
            .unwrap_or(StreamInfo { flags: 0, priority: 0 })
    }

    /// Loads a module image now (`lazy`: at the first use of something in it).
    pub fn load_module(&self, image: crate::registry::Image, lazy: bool) -> CudaResult<u32> {
        crate::registry::load(Some(self.conn()), image, lazy)
    }

    /// Unloads a module: its kernels and variables become unusable, its mirrors go.
    pub fn unload_module(&self, id: u32) -> CudaResult<()> {
        crate::registry::unload(Some(self.conn()), Some(&self.ranges), id)?;
        self.mirrors.forget_module(self, id);
        Ok(())
    }

    /// A kernel of a live module by name.
    pub fn function_by_name(&self, module: u32, name: &str) -> CudaResult<Arc<crate::registry::Function>> {
        crate::registry::function_by_name(self.conn(), module, name)
    }

    /// The names of a live module's kernels, in the driver's order.
    pub fn function_names(&self, module: u32) -> CudaResult<Arc<Vec<String>>> {
        crate::registry::function_names(self.conn(), module)
    }

    /// A variable of a live module by name on the calling thread's device: `(address, size,
    /// managed)`; a device variable becomes a range copies may reach.
    pub fn global_by_name(&self, module: u32, name: &str) -> CudaResult<(u64, u64, bool)> {
        crate::registry::global_by_name(self.conn(), &self.ranges, module, name)
    }

    /// The devices the app sees.
    pub fn device_count(&self) -> usize {
        self.visible.len()
    }

    /// The app's device `index` as the session sees it now (its slice, updated when the
    /// allocation is resized).
    pub fn device(&self, index: usize) -> Option<flyt_protocol::device::DeviceInfo> {
        let device = *self.visible.get(index)?;
        let resized = self.conn_of(device).resized_devices.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match resized.as_ref() {
            Some(devices) => devices.get(self.local_device(device) as usize).cloned(),
            None => self.info.devices.get(device as usize).cloned(),
        }
    }

    /// The server's index of the app's device `index`.
    pub fn server_device(&self, index: usize) -> Option<u32> {
        self.visible.get(index).copied()
    }

    /// The app's index of the server's device `server`, if the app sees it.
    pub fn app_device(&self, server: u32) -> Option<usize> {
        self.visible.iter().position(|visible| *visible == server)
    }

    /// Makes the app's device `index` the one the calling thread's requests run on.
    pub fn set_thread_device(&self, index: usize) {
        if let Some(server) = self.server_device(index) {
            crate::devices::set_thread_device(server);
        }
    }

    /// What the driver answers for the app's devices `from` and `to` (`None`: the same device,
    /// or one the app does not see).
    pub fn peer_link(&self, from: usize, to: usize) -> Option<&flyt_protocol::device::PeerLink> {
        let (from, to) = (self.server_device(from)?, self.server_device(to)?);
        self.info.peers.iter().find(|link| link.from == from && link.to == to)
    }

    /// What NVLink `link` of the app's device `device` reaches, in the app's numbering: a device
    /// the app sees is named by its index; one it does not see (`CUDA_VISIBLE_DEVICES`) reads as
    /// an inactive link. `None`: no such device or link.
    pub fn nvlink(&self, device: usize, link: usize) -> Option<flyt_protocol::device::NvLinkEnd> {
        use flyt_protocol::device::NvLinkEnd;
        let server = self.server_device(device)?;
        let end = *self.info.nvlinks.get(server as usize)?.get(link)?;
        Some(match end {
            NvLinkEnd::Device(far) => {
                self.app_device(far).map_or(NvLinkEnd::Inactive, |index| NvLinkEnd::Device(u32::try_from(index).unwrap_or(u32::MAX)))
            }
            other => other,
        })
    }

    /// Records a device allocation (or a module variable when `!freeable`).
    pub fn add_device_range(&self, start: u64, len: u64, freeable: bool) {
        self.ranges.add(start, len, freeable);
    }

    /// Makes a device allocation of `len` bytes with `allocate` at an address no host memory of
    /// this process holds (see `ranges::Reservations`), and records it; see [`place_off_host`].
    pub fn place_allocation(
        &self,
        len: u64,
        allocate: impl FnMut() -> CudaResult<u64>,
        free: impl Fn(u64) -> CudaResult<()>,
    ) -> CudaResult<u64> {
        let mut overlap = None;
        let placed = place_off_host(
            allocate,
            |ptr| {
                if ptr != 0 && overlap.is_none() {
                    overlap = self.overlap_elsewhere(ptr, len);
                }
                ptr == 0 || overlap.is_some() || self.ranges.try_add(ptr, len, true)
            },
            |ptr| ptr,
            |ptr| {
                let _ = free(ptr);
            },
        );
        match (placed, overlap) {
            (Ok(ptr), Some(line)) => {
                // Refused: the allocation goes back to its server.
                let _ = free(ptr);
                crate::diagnostics::once("spread-overlap", &line);
                Err(CudaError::MEMORY_ALLOCATION)
            }
            (placed, _) => placed,
        }
    }

    /// In a spread session, refuses (frees, says why once) an allocation the thread's server made
    /// at `[ptr, ptr + len)` over another server's memory (see [`Client::place_allocation`]).
    pub(crate) fn refuse_overlap(&self, ptr: u64, len: u64) -> CudaResult<()> {
        let Some(line) = self.overlap_elsewhere(ptr, len) else { return Ok(()) };
        let _ = self.call(req::Free { ptr });
        crate::diagnostics::once("spread-overlap", &line);
        Err(CudaError::MEMORY_ALLOCATION)
    }

    /// Runs `queue` (with the stream to queue on) where device memory at `ptr` lives when that is
    /// another server than the thread's, in a spread session: after `stream`'s earlier work, on
    /// that server's NULL stream, done on return (as `transfer::copy_across_servers` copies
    /// there). `None`: the thread's server holds it (or it is no known device memory).
    pub(crate) fn on_other_server(&self, ptr: u64, stream: u64, queue: impl FnOnce(u64) -> CudaResult<()>) -> Option<CudaResult<()>> {
        if !self.spread() {
            return None;
        }
        let device = self.ranges.device_of(ptr).filter(|device| self.node_of(*device) != self.node_of(crate::devices::thread_device()))?;
        Some(self.sync_stream(stream).and_then(|()| {
            crate::devices::with_thread_device(device, || {
                queue(0)?;
                self.sync_stream(0)
            })
        }))
    }

    /// In a spread session, the line refusing an allocation at `[ptr, ptr + len)` of the
    /// thread's device when it overlaps memory of another server's device (their servers do not
    /// keep to address windows of their own, `flyt-rpc-server --address-window`).
    fn overlap_elsewhere(&self, ptr: u64, len: u64) -> Option<String> {
        if self.nodes.is_empty() {
            return None;
        }
        let here = self.node_of(crate::devices::thread_device());
        let (start, other_len, device) = self.ranges.overlapping_elsewhere(ptr, len, |device| self.node_of(device) != here)?;
        Some(format!(
            "flyt: device memory of {} at {ptr:#x} ({len} bytes) overlaps device memory of {} at {start:#x} ({other_len} bytes): one app cannot tell them apart; give each node's server its own --address-window (returning CUDA_ERROR_OUT_OF_MEMORY)",
            self.node_address(here),
            self.node_address(self.node_of(device)),
        ))
    }

    /// Forgets an allocation that starts exactly at `start`.
    pub fn remove_allocation(&self, start: u64) -> CudaResult<()> {
        self.ranges.remove_allocation(start)
    }

    pub fn forget_allocations(&self) {
        self.ranges.forget_allocations();
    }

    /// Resets the session's device (`cuDevicePrimaryCtxReset`, `cudaDeviceReset`): the server waits
    /// for its work and resets the device's context (allocations, streams and events go, limits
    /// return to their defaults); the client forgets them, and per-thread default streams are made
    /// anew. Loaded modules stay, as CUDA's libraries outlive a reset: the server loads them again,
    /// and their variables are looked up anew.
    pub fn device_reset(&self) -> CudaResult<()> {
        self.call(req::DeviceReset {})?;
        // Errors of work queued before the reset went with its context.
        let _ = self.conn().take_deferred();
        self.forget_allocations();
        self.forget_vmm();
        self.forget_arrays();
        self.forget_ipc();
        crate::managed::forget(self);
        self.mirrors.forget_all(self);
        crate::registry::forget_variables(&self.ranges);
        crate::registry::forget_function_settings();
        lock(&self.limits).clear();
        lock(&self.streams).clear();
        lock(&self.events).clear();
        self.reset_generation.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// `cuCtxGetLimit` on the thread's device. Only `cuCtxSetLimit` and a reset change a limit, so
    /// each is asked once (libraries ask on every call of theirs: a round trip each over a
    /// network), except the stack size, which launches may raise.
    pub fn device_limit(&self, limit: u32) -> CudaResult<u64> {
        let key = (crate::devices::thread_device(), limit);
        if let Some(value) = lock(&self.limits).get(&key) {
            return Ok(*value);
        }
        let value = self.call(req::DeviceGetLimit { limit })?.value;
        if limit != LIMIT_STACK_SIZE {
            lock(&self.limits).insert(key, value);
        }
        Ok(value)
    }

    /// `cuCtxSetLimit` on the thread's device. The driver may round the value (the printf FIFO
    /// and heap sizes), so the next get asks again.
    pub fn set_device_limit(&self, limit: u32, value: u64) -> CudaResult<()> {
        let result = self.call(req::DeviceSetLimit { limit, value }).map(|_| ());
        lock(&self.limits).remove(&(crate::devices::thread_device(), limit));
        result
    }

    /// The device range holding `ptr`, as `(start, len)`.
    pub fn device_range(&self, ptr: u64) -> Option<(u64, u64)> {
        self.ranges.find(ptr)
    }

    pub fn is_device_pointer(&self, ptr: u64) -> bool {
        self.ranges.find(ptr).is_some()
    }

    /// Checks that `[ptr, ptr + len)` lies inside one device range.
    pub fn check_device_range(&self, ptr: u64, len: u64) -> CudaResult<()> {
        self.ranges.check(ptr, len)
    }

    /// Checks that kernels and memsets may use `[ptr, ptr + len)`: it lies inside one device range,
    /// or inside one block of pinned host memory the server mapped at this address.
    pub fn check_device_accessible(&self, ptr: u64, len: u64) -> CudaResult<()> {
        if self.ranges.check(ptr, len).is_ok() {
            return Ok(());
        }
        match (self.host_allocation(ptr as usize), usize::try_from(len)) {
            (Some(host), Ok(len))
                if host.device_mapped && (ptr as usize - host.start).checked_add(len).is_some_and(|end| end <= host.len) =>
            {
                Ok(())
            }
            (Some(host), _) if !host.device_mapped => {
                // Natively all pinned memory is mapped (unified addressing); here only blocks
                // of the shared-memory channel are, and mapped memory asked for as such.
                crate::diagnostics::once(
                    "pinned-not-mapped",
                    "flyt: pinned host memory is device-accessible only over the shared-memory channel, or when allocated as mapped memory (CU_MEMHOSTALLOC_DEVICEMAP) (returning CUDA_ERROR_INVALID_VALUE)",
                );
                Err(CudaError::INVALID_VALUE)
            }
            _ => Err(CudaError::INVALID_VALUE),
        }
    }

    /// Sends a request and waits for its reply. At a sync point, a deferred error of an earlier
    /// asynchronous call is returned; the server sent the bytes of every copy the call covers
    /// before its reply, so they have landed.
    pub fn call<O: Op>(&self, request: O) -> CudaResult<O::Reply> {
        let reply = self.call_plain(request)?;
        // A synchronizing call that succeeded: `__managed__` variables the device may have
        // written are fetched (a check of one flag when there are none).
        if O::INFO.class == OpClass::SyncPoint {
            self.pull_mirrors(O::INFO.id == <req::DeviceSynchronize as Op>::INFO.id)?;
        }
        Ok(reply)
    }

    /// [`Client::call`] without the fetch of mirrored variables.
    pub fn call_plain<O: Op>(&self, request: O) -> CudaResult<O::Reply> {
        self.reply::<O>(self.conn().call(&request.into()))
    }

    /// [`Client::call`] for a request whose bulk bytes follow it.
    pub fn call_with_bulk<O: Op>(&self, request: O, bulk: &[u8]) -> CudaResult<O::Reply> {
        let slot = self.conn().send_with_bulk(&request.into(), bulk, Some(()))?.ok_or(CudaError::UNKNOWN)?;
        self.reply::<O>(slot.wait())
    }

    /// [`Client::call`] for a request whose reply's bulk bytes land in `destination`.
    pub fn call_into<O: Op>(&self, request: O, destination: HostDestination) -> CudaResult<O::Reply> {
        let slot = self.conn().send_for_reply(&request.into(), Some(destination))?;
        self.conn().flush()?;
        self.reply::<O>(slot.wait())
    }

    /// Decodes a reply; at a sync point, with any deferred error of an earlier asynchronous call.
    fn reply<O: Op>(&self, message: CudaResult<Vec<u8>>) -> CudaResult<O::Reply> {
        let message = message?;
        let reply = decode_reply::<O::Reply>(&message).map_err(|_| CudaError::UNKNOWN)?;
        if O::INFO.class == OpClass::SyncPoint {
            let fields = reply.result?;
            if let Some(deferred) = reply.deferred.or_else(|| self.conn().take_deferred()) {
                return Err(deferred);
            }
            Ok(fields)
        } else {
            reply.result
        }
    }

    /// Queues an asynchronous request (no round trip; its errors arrive at a sync point).
    pub fn post<O: Op>(&self, request: O) -> CudaResult<()> {
        self.conn().send_async(&request.into(), &[])
    }

    /// The pinned host allocation holding `ptr`, as `(start, len, flags)`.
    pub fn host_allocation(&self, ptr: usize) -> Option<HostRange> {
        let allocations = lock(&self.host_allocations);
        let (start, allocation) = allocations.range(..=ptr).next_back()?;
        (ptr - start < allocation.len).then_some(HostRange {
            start: *start,
            len: allocation.len,
            flags: allocation.flags,
            device_mapped: allocation.device_mapped,
            managed: allocation.managed,
        })
    }

    pub fn new_stream_id(&self) -> u64 {
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        self.note_handle_device(id);
        id
    }

    pub fn new_event_id(&self) -> u64 {
        let id = self.next_event.fetch_add(1, Ordering::Relaxed);
        self.note_handle_device(id);
        id
    }

    /// In a spread session, remembers that a new stream or event is made on the thread's device.
    fn note_handle_device(&self, id: u64) {
        if self.spread() {
            lock(&self.handle_devices).insert(id, crate::devices::thread_device());
        }
    }

    /// The session device a stream or event of the app was made on, in a spread session (`None`:
    /// one server, or a handle of no device, such as the NULL stream: the thread's).
    pub fn handle_device(&self, handle: u64) -> Option<u32> {
        if !self.spread() {
            return None;
        }
        lock(&self.handle_devices).get(&handle).copied()
    }

    /// Runs `call` with the thread's requests going to the server that holds `handle` (a stream or
    /// event), as the driver runs a call naming a stream in the stream's context.
    pub fn on_handle_server<T>(&self, handle: u64, call: impl FnOnce() -> T) -> T {
        match self.handle_device(handle) {
            Some(device) if self.node_of(device) != self.node_of(crate::devices::thread_device()) => {
                crate::devices::with_thread_device(device, call)
            }
            _ => call(),
        }
    }

    /// Runs `call` with the thread's requests going to the server whose device memory holds
    /// `ptr` (a spread session; otherwise, or for other pointers, as they are).
    pub fn on_pointer_server<T>(&self, ptr: u64, call: impl FnOnce() -> T) -> T {
        if !self.spread() {
            return call();
        }
        match self.ranges.device_of(ptr) {
            Some(device) if self.node_of(device) != self.node_of(crate::devices::thread_device()) => {
                crate::devices::with_thread_device(device, call)
            }
            _ => call(),
        }
    }

    /// Whether `a` and `b` (streams or events) are held by different servers of a spread session.
    pub fn on_different_servers(&self, a: u64, b: u64) -> bool {
        let node = |handle| {
            self.handle_device(handle).map_or_else(|| self.node_of(crate::devices::thread_device()), |device| self.node_of(device))
        };
        self.spread() && node(a) != node(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flyt_protocol::device::{DeviceInfo, PeerLink};

    #[test]
    fn flyt_server_names_one_server_or_several() {
        assert_eq!(server_list("unix:/run/a.sock"), vec!["unix:/run/a.sock"]);
        assert_eq!(server_list("unix:/a.sock, 10.0.0.2:4000,"), vec!["unix:/a.sock", "10.0.0.2:4000"]);
        assert_eq!(server_tokens(Some("t"), 2), Ok(vec![Some("t".to_string()), Some("t".to_string())]), "one token for all");
        assert_eq!(server_tokens(None, 2), Ok(vec![None, None]));
        assert_eq!(server_tokens(Some("a,b"), 2), Ok(vec![Some("a".to_string()), Some("b".to_string())]), "one per server");
        assert!(server_tokens(Some("a,b,c"), 2).is_err(), "as many as servers, or one");
    }

    fn session(devices: usize, peers: Vec<PeerLink>, copy_chunk: u64) -> SessionInfo {
        let device =
            DeviceInfo { name: "GPU".into(), uuid: [0; 16], luid: [0; 8], luid_device_node_mask: 0, total_mem: 1, attributes: Vec::new() };
        SessionInfo {
            session_id: 1,
            server_version: String::new(),
            driver_version: 13000,
            devices: vec![device; devices],
            peers,
            nvlinks: vec![vec![flyt_protocol::device::NvLinkEnd::Device(0)]; devices],
            stripe_secret: Default::default(),
            resume_secret: None,
            copy_chunk,
            shm_accepted: false,
            rings: false,
            shm_refusal: None,
            emulated: true,
        }
    }

    /// A second server's devices follow the first's; pairs across the servers are no peers.
    #[test]
    fn a_further_server_numbers_its_devices_after_the_earlier_ones() {
        let link = |from, to| PeerLink { from, to, access_supported: 1, performance_rank: 1, native_atomics: 1, array_access: 1 };
        let mut info = session(2, vec![link(0, 1), link(1, 0)], 8 << 20);
        join_node(&mut info, session(2, vec![link(0, 1), link(1, 0)], 4 << 20));
        assert_eq!(info.devices.len(), 4);
        assert_eq!(info.copy_chunk, 4 << 20, "pieces both servers take");
        use flyt_protocol::device::NvLinkEnd;
        assert_eq!(info.nvlinks[2], vec![NvLinkEnd::Device(2)], "a further server's NVLinks name its devices as renumbered");
        assert_eq!(info.nvlinks[0], vec![NvLinkEnd::Device(0)]);
        let find = |from, to| info.peers.iter().find(|link| link.from == from && link.to == to).cloned();
        assert_eq!(find(0, 1).map(|link| link.access_supported), Some(1), "the first server's own pair");
        assert_eq!(find(2, 3).map(|link| link.access_supported), Some(1), "the second's, renumbered");
        for (from, to) in [(0, 2), (2, 0), (1, 3), (3, 1), (0, 3)] {
            let across = find(from, to).expect("every pair across the servers is answered");
            assert_eq!((across.access_supported, across.native_atomics, across.array_access), (0, 0, 0), "{from}->{to}");
        }
    }
}
