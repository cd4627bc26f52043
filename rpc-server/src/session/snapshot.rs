//! Checkpoint and restore: a session written to one file and made again in another worker (on
//! this server or another), with every pointer, stream, event, module and kernel its app holds
//! valid as before. Device memory comes back at its old addresses (`Device::restore_allocations`,
//! stream-ordered allocations of pools too, and the app's own reservations and mappings);
//! streams, events, modules, pools, arrays, physical allocations, graphs and executable graphs
//! are the client's own ids, mapped to new driver objects; texture and surface objects come back
//! under their handles. What cannot be made again that way (IPC, graph memory, a VM's ivshmem
//! region...) makes the checkpoint fail with the reason, before the app has paused for long.
//!
//! The pause: the control thread asks (`MoveControl::ask`) and sends `Notice::Pause`; the client
//! answers with `Pause` after its last request and holds new calls; that op reaches the session
//! in order, so everything before it is drained and in the snapshot. The session then waits for
//! the decision: move (the client reconnects elsewhere with the snapshot's name) or stay.
//!
//! A session of several GPUs (one server's) is recorded device by device: each allocation,
//! stream, event and module with the device it was made on ([`Owners`]), made again on the same
//! device index at the destination (at the same addresses: unified addressing keeps the app's
//! pointers valid), the peer access it enabled enabled again, and the device current at the pause
//! current again (the client's connection names it as the last `SetDevice` it sent).
//!
//! A module the app used on several GPUs is loaded on each: its variables there (one copy per
//! GPU, each known to the app by its own address) are recorded and made again per device too.
//!
//! File: `FLYTSNP5`, the manifest's length (8 bytes, little-endian) and the manifest, then each
//! allocation's bytes, each mapping's bytes and each module variable's bytes in manifest order
//! (a module's own device first, then its loads elsewhere), then the arrays' bytes
//! (`ArraysState`).

use std::collections::HashMap;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use flyt_protocol::CudaError;
use flyt_protocol::control::rpc_server::SnapshotInfo;
use flyt_protocol::device::attr;
use flyt_protocol::handshake::Notice;
use serde::{Deserialize, Serialize};

use super::{Kernel, LoadedModule, Session};
use crate::backend::Device;
use crate::budget::MemoryBudget;
use crate::memory::RangeKind;
use crate::shm::Segment;

const MAGIC: &[u8; 8] = b"FLYTSNP5";
/// Largest manifest read back (module images are in it).
const MAX_MANIFEST: u64 = 4 << 30;
/// `cudaEventInterprocess`.
const EVENT_INTERPROCESS: u32 = 0x4;
/// How long a written session waits for `release` before it goes on where it is.
const DECISION_TIMEOUT: Duration = Duration::from_secs(600);

/// The device each of a session's allocations, streams and events was made on, and the peer
/// access the app enabled: what a session of several GPUs needs to be made again device by device.
#[derive(Default)]
pub(super) struct Owners {
    allocations: HashMap<u64, usize>,
    streams: HashMap<u64, usize>,
    events: HashMap<u64, usize>,
    /// (from, to) -> flags, as enabled in `from`'s context.
    peers: std::collections::BTreeMap<(usize, usize), u32>,
}

impl Owners {
    pub(super) fn allocated(&mut self, ptr: u64, device: usize) {
        self.allocations.insert(ptr, device);
    }

    pub(super) fn stream_made(&mut self, id: u64, device: usize) {
        self.streams.insert(id, device);
    }

    pub(super) fn event_made(&mut self, id: u64, device: usize) {
        self.events.insert(id, device);
    }

    pub(super) fn peer_access(&mut self, from: usize, to: usize, enable: bool, flags: u32) {
        match enable {
            true => self.peers.insert((from, to), flags),
            false => self.peers.remove(&(from, to)),
        };
    }

    /// `ptr` is no longer the allocation recorded (freed, or reused by a pool).
    pub(super) fn freed(&mut self, ptr: u64) {
        self.allocations.remove(&ptr);
    }

    /// A device reset: the session's allocations are gone, and the peer access the device's
    /// context enabled went with the context.
    pub(super) fn reset(&mut self, device: usize) {
        self.allocations.clear();
        self.peers.retain(|(from, _), _| *from != device);
    }

    /// The device of `ptr`, made by `malloc` or a pitched allocation; `None` for memory made
    /// otherwise (a pool's stream-ordered allocation), whose device is not recorded.
    fn allocation(&self, ptr: u64) -> Option<usize> {
        self.allocations.get(&ptr).copied()
    }
}

/// A kernel by name: its index and the attributes the app set.
type KernelState = (String, u32, Vec<(u32, i32)>);

/// A module variable the app asked for: name, address, size.
type VariableState = (String, u64, u64);

#[derive(Serialize, Deserialize)]
struct ModuleState {
    id: u32,
    /// The session device it was loaded on (loads on other devices are made again when used).
    device: u32,
    image: Vec<u8>,
    functions: Vec<KernelState>,
    /// Variables the app asked for (their bytes follow in the file).
    variables: Vec<VariableState>,
    /// Its loads on the session's other devices: the device and the variables the app asked
    /// for there (their bytes follow this module's own).
    elsewhere: Vec<(u32, Vec<VariableState>)>,
}

impl ModuleState {
    /// Every variable with the device it lives on, in file order.
    fn variables_by_device(&self) -> impl Iterator<Item = (u32, &VariableState)> {
        let own = self.variables.iter().map(|variable| (self.device, variable));
        own.chain(self.elsewhere.iter().flat_map(|(device, variables)| variables.iter().map(move |variable| (*device, variable))))
    }
}

/// The session's shared-memory segment: the app offers the same one again when it reconnects,
/// and its pinned blocks are pinned again where they were.
#[derive(Serialize, Deserialize)]
struct SegmentState {
    size: u64,
    staging: u64,
    /// Offset, length and the app's address the block is mapped at for the device (0: pinned
    /// for copies only).
    blocks: Vec<(u64, u64, u64)>,
}

#[derive(Serialize, Deserialize)]
struct Manifest {
    /// Compute capability: a snapshot restores on the same GPU family (major) only.
    capability: (i32, i32),
    emulated: bool,
    /// The session's GPUs: the destination serves as many, in the same order.
    devices: u32,
    /// The device current on the session thread at the pause (the client's last `SetDevice`).
    current_device: u32,
    allocations: Vec<(u64, u64)>,
    /// The device of each allocation, in `allocations`' order.
    allocation_devices: Vec<u32>,
    modules: Vec<ModuleState>,
    /// Stream id, flags, priority, device.
    streams: Vec<(u64, u32, i32, u32)>,
    /// Event id, flags, device.
    events: Vec<(u64, u32, u32)>,
    /// Peer access enabled: from the context of device `.0` to the memory of device `.1`, flags.
    peers: Vec<(u32, u32, u32)>,
    may_print: bool,
    segment: Option<SegmentState>,
    pools: super::pools::PoolsState,
    arrays: super::arrays::ArraysState,
    vmm: super::vmm::VmmState,
    graphs: super::graphs::GraphsState,
    /// Device memory left on the GPU for a worker there: the file then holds no allocation bytes.
    handover: Option<HandoverState>,
}

/// A paused session's device memory handed to a worker on the same GPU.
#[derive(Serialize, Deserialize)]
struct HandoverState {
    /// Driver allocations: address, length, CUDA IPC handle (64 bytes).
    ipc: Vec<(u64, u64, Vec<u8>)>,
    /// Physical memory (start, length, bytes of the app's) whose descriptors the paused worker
    /// gives, in this order, to whoever connects to `socket`.
    spans: Vec<(u64, u64, u64)>,
    socket: Option<String>,
}

/// The paused worker's side of a handover: a socket beside the snapshot that gives the
/// descriptors of its physical allocations to the worker restoring it; closed and removed (the
/// descriptors too) when dropped, once the session's fate is decided.
struct HandoverSocket {
    path: PathBuf,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The longest socket path `sockaddr_un` takes (108 bytes with its NUL).
const SOCKET_PATH_MAX: usize = 107;

/// A path to bind or connect the socket at `path` by: `path` itself, or, when it is longer than
/// a socket address holds (a deep snapshot folder), the same file through a descriptor of its
/// folder (`/proc/self/fd/N/NAME`), which is held open beside it.
fn socket_address(path: &Path) -> Result<(PathBuf, Option<std::fs::File>), String> {
    if path.as_os_str().len() <= SOCKET_PATH_MAX {
        return Ok((path.to_path_buf(), None));
    }
    let (folder, name) = match (path.parent(), path.file_name()) {
        (Some(folder), Some(name)) => (folder, name),
        _ => return Err(format!("{}: not a file's path", path.display())),
    };
    let folder = std::fs::File::open(folder).map_err(|error| format!("{}: {error}", folder.display()))?;
    let short = Path::new("/proc/self/fd").join(std::os::fd::AsRawFd::as_raw_fd(&folder).to_string()).join(name);
    Ok((short, Some(folder)))
}

impl HandoverSocket {
    fn serve(path: PathBuf, fds: Vec<std::os::fd::OwnedFd>) -> Result<Self, String> {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::remove_file(&path);
        let (address, _folder) = socket_address(&path)?;
        let listener = std::os::unix::net::UnixListener::bind(&address).map_err(|error| format!("{}: {error}", path.display()))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(|error| format!("{}: {error}", path.display()))?;
        listener.set_nonblocking(true).map_err(|error| error.to_string())?;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("flyt-handover".into())
            .spawn(move || {
                while !stopped.load(std::sync::atomic::Ordering::Acquire) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            if let Err(error) = send_descriptors(&stream, &fds) {
                                tracing::warn!(%error, "handing device memory over failed");
                            }
                        }
                        Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(5)),
                        Err(error) => {
                            tracing::warn!(%error, "the handover socket failed");
                            return;
                        }
                    }
                }
            })
            .map_err(|error| format!("no handover thread: {error}"))?;
        Ok(Self { path, stop, thread: Some(thread) })
    }
}

impl Drop for HandoverSocket {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Descriptors per message (the kernel takes at most 253).
const FDS_PER_MESSAGE: usize = 200;

fn send_descriptors(stream: &std::os::unix::net::UnixStream, fds: &[std::os::fd::OwnedFd]) -> Result<(), String> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    use std::os::fd::AsRawFd;
    stream.set_nonblocking(false).map_err(|error| error.to_string())?;
    for chunk in fds.chunks(FDS_PER_MESSAGE) {
        let raw: Vec<_> = chunk.iter().map(AsRawFd::as_raw_fd).collect();
        let byte = [b'H'];
        sendmsg::<()>(stream.as_raw_fd(), &[std::io::IoSlice::new(&byte)], &[ControlMessage::ScmRights(&raw)], MsgFlags::empty(), None)
            .map_err(|error| error.to_string())?;
    }
    Ok(())
}

/// Takes `count` descriptors from the paused worker's handover socket at `path`.
fn receive_descriptors(path: &str, count: usize) -> Result<Vec<std::os::fd::OwnedFd>, String> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    use std::os::fd::{AsRawFd, FromRawFd};
    let (address, _folder) = socket_address(Path::new(path))?;
    let stream =
        std::os::unix::net::UnixStream::connect(&address).map_err(|error| format!("the paused session's handover at {path}: {error}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(30))).map_err(|error| error.to_string())?;
    let mut fds = Vec::with_capacity(count);
    while fds.len() < count {
        let mut byte = [0u8; 1];
        let mut space = nix::cmsg_space!([std::os::fd::RawFd; FDS_PER_MESSAGE]);
        let mut iov = [std::io::IoSliceMut::new(&mut byte)];
        let message = recvmsg::<()>(stream.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
            .map_err(|error| format!("the paused session's handover: {error}"))?;
        if message.bytes == 0 {
            return Err(format!("the paused session handed over {} of {count} descriptors", fds.len()));
        }
        for cmsg in message.cmsgs().map_err(|error| error.to_string())? {
            if let ControlMessageOwned::ScmRights(raw) = cmsg {
                // SAFETY: SCM_RIGHTS just installed these descriptors in this process.
                fds.extend(raw.into_iter().map(|fd| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }));
            }
        }
    }
    Ok(fds)
}

/// The device ranges whose bytes follow the manifest, in file order: allocations (unless handed
/// over on the GPU), then each module's variables.
fn manifest_ranges(manifest: &Manifest) -> Vec<(u64, u64)> {
    let variables =
        manifest.modules.iter().flat_map(|module| module.variables_by_device().map(|(_, (_, address, size))| (*address, *size)));
    // Allocations and mappings handed over on the GPU are not in the file.
    let moved = match manifest.handover {
        Some(_) => Vec::new(),
        None => manifest.allocations.iter().copied().chain(manifest.vmm.mapped()).collect(),
    };
    moved.into_iter().chain(variables).collect()
}

/// A snapshot name: 32 hex digits from the system's random source.
fn new_name() -> Result<String, String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut bytes))
        .map_err(|error| format!("no random name: {error}"))?;
    Ok(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}

/// Whether `name` can be a snapshot's name (so it names a file in the folder and nothing else).
pub fn valid_name(name: &str) -> bool {
    name.len() == 32 && name.bytes().all(|byte| byte.is_ascii_hexdigit())
}

/// The file of snapshot `name` in `dir`.
pub fn path_of(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}{}", flyt_protocol::control::rpc_server::SNAPSHOT_SUFFIX))
}

/// The pause and move of one session, shared between the worker's command thread and the
/// session's reader.
#[derive(Default)]
pub struct MoveControl {
    state: Mutex<MoveState>,
    changed: Condvar,
}

#[derive(Default)]
struct MoveState {
    /// The folder of a checkpoint asked for and not yet over, when it was asked, and whether
    /// the device memory stays on the GPU for a worker there (`checkpoint_on_device`).
    asked: Option<(PathBuf, Instant, bool)>,
    /// The session took the request up (the client's `Pause` arrived).
    taken: bool,
    written: Option<Result<SnapshotInfo, String>>,
    /// `Some(to)` once released: `to` as `release` gave it.
    decision: Option<Option<String>>,
}

impl MoveControl {
    fn lock(&self) -> std::sync::MutexGuard<'_, MoveState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Asks the session to checkpoint into `dir` and waits for the snapshot; gives up (the app
    /// goes on) when the app makes no call within `timeout`.
    pub fn checkpoint(
        &self,
        outbox: &crate::transport::Outbox,
        dir: PathBuf,
        timeout: Duration,
        on_device: bool,
    ) -> Result<SnapshotInfo, String> {
        let mut state = self.lock();
        // A checkpoint just released (the app going on after a refused move, say) ends first.
        let settle = Instant::now() + Duration::from_secs(10);
        while state.asked.is_some() && state.decision.is_some() && Instant::now() < settle {
            state = self.changed.wait_timeout(state, Duration::from_millis(50)).unwrap_or_else(|e| e.into_inner()).0;
        }
        if state.asked.is_some() {
            return Err("a checkpoint of this session is already under way".into());
        }
        *state = MoveState { asked: Some((dir, Instant::now(), on_device)), ..MoveState::default() };
        outbox.send_notice(&Notice::Pause);
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(written) = state.written.take() {
                if written.is_err() {
                    state.asked = None;
                }
                return written;
            }
            let now = Instant::now();
            if !state.taken && now >= deadline {
                state.asked = None;
                drop(state);
                outbox.send_notice(&Notice::Resumed);
                return Err(format!("the app made no CUDA call within {} ms; it goes on where it was", timeout.as_millis()));
            }
            let wait = if state.taken { Duration::from_secs(1) } else { deadline - now };
            state = self.changed.wait_timeout(state, wait).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Decides a written session's fate; `Err` when none waits for it.
    pub fn release(&self, to: Option<String>) -> Result<(), String> {
        let mut state = self.lock();
        if state.asked.is_none() || state.decision.is_some() {
            return Err("the session is not paused by a checkpoint".into());
        }
        state.decision = Some(to);
        self.changed.notify_all();
        Ok(())
    }
}

/// Copies device memory `[ptr, ptr + len)` into `out` through staging buffers.
pub(crate) fn read_device<D: Device>(device: &D, chunk: u64, ptr: u64, len: u64, out: &mut impl Write) -> Result<(), String> {
    let mut done = 0;
    while done < len {
        let step = (len - done).min(chunk) as usize;
        let staging = device.staging(step).map_err(|error| format!("staging: {error}"))?;
        let pending =
            device.start_dtoh(ptr + done, staging, device.null_stream()).map_err(|error| format!("reading device memory: {error}"))?;
        while !device.dtoh_done(&pending) {
            std::hint::spin_loop();
        }
        let bytes = device.dtoh_bytes(&pending).map_err(|error| format!("reading device memory: {error}"))?;
        out.write_all(bytes).map_err(|error| format!("writing the snapshot: {error}"))?;
        done += step as u64;
    }
    Ok(())
}

/// Copies `len` bytes from `input` to device memory at `ptr` through staging buffers.
pub(crate) fn write_device<D: Device>(device: &D, chunk: u64, ptr: u64, len: u64, input: &mut impl Read) -> Result<(), String> {
    let mut done = 0;
    while done < len {
        let step = (len - done).min(chunk) as usize;
        let mut staging = device.staging(step).map_err(|error| format!("staging: {error}"))?;
        input.read_exact(&mut D::staging_bytes(&mut staging)[..step]).map_err(|error| format!("reading the snapshot: {error}"))?;
        device.copy_htod(ptr + done, staging, device.null_stream()).map_err(|error| format!("writing device memory: {error}"))?;
        done += step as u64;
    }
    Ok(())
}

/// Bytes of a snapshot file pinned at once while device memory is copied straight into or out of it.
const DIRECT_WINDOW: u64 = 1 << 30;

/// Copies device `ranges` (address, length) to or from `file` from byte `data_at` on, in order,
/// with no staging copy: the file's pages are mapped and pinned one window at a time and the
/// GPU's copy engines move the bytes. For files in memory (tmpfs, as /dev/shm) only, which the
/// driver can pin; `Ok(false)` when the first window cannot be pinned and nothing was copied
/// (the caller then copies through staging).
pub(crate) fn copy_direct<D: Device>(
    device: &D,
    file: &std::fs::File,
    data_at: u64,
    ranges: &[(u64, u64)],
    to_file: bool,
) -> Result<bool, String> {
    if !flyt_ring::region::pinnable(file).unwrap_or(false) {
        return Ok(false);
    }
    let total: u64 = ranges.iter().map(|(_, len)| len).sum();
    if total == 0 {
        return Ok(true);
    }
    let end = data_at + total;
    let len = usize::try_from(end).map_err(|_| "snapshot too large".to_string())?;
    let map = memmap2::MmapOptions::new().len(len).map_raw(file).map_err(|error| format!("mapping the snapshot: {error}"))?;
    let page = 4096;
    let (mut window, mut next) = (data_at / page * page, ranges.iter().copied());
    let mut at = data_at;
    let mut pending: Option<(u64, u64)> = None;
    let mut first = true;
    while window < end {
        let window_end = (window + DIRECT_WINDOW).min(end);
        let pinned = map.as_mut_ptr().wrapping_add(window as usize);
        let pinned_len = (window_end - window) as usize;
        // SAFETY: the window lies inside the mapping, which outlives its pinning (unpinned below).
        if let Err(error) = unsafe { device.host_register(pinned, pinned_len, false) } {
            if first {
                return Ok(false);
            }
            return Err(format!("pinning the snapshot file: {error}"));
        }
        first = false;
        let copied = (|| {
            while at < window_end {
                let (ptr, left) = match pending.take() {
                    Some(piece) => piece,
                    None => match next.next() {
                        Some(range) => range,
                        None => break,
                    },
                };
                let step = left.min(window_end - at);
                let host = map.as_mut_ptr().wrapping_add(at as usize);
                // SAFETY: `host..host + step` lies in the pinned window; the device range is one of
                // the session's own allocations or variables.
                unsafe {
                    if to_file {
                        device.copy_to_host(host, ptr, step as usize, device.null_stream())
                    } else {
                        device.copy_from_host(ptr, host, step as usize, device.null_stream())
                    }
                }
                .map_err(|error| format!("copying {step} bytes at {ptr:#x}: {error}"))?;
                at += step;
                if step < left {
                    pending = Some((ptr + step, left - step));
                }
            }
            device.synchronize().map_err(|error| format!("copying device memory: {error}"))
        })();
        // SAFETY: registered above; the copies that used it are done (or failed).
        let _ = unsafe { device.host_unregister(pinned) };
        copied?;
        window = window_end;
    }
    Ok(true)
}

fn capability<D: Device>(device: &D) -> (i32, i32) {
    let info = device.info();
    (info.attribute(attr::COMPUTE_CAPABILITY_MAJOR).unwrap_or(0), info.attribute(attr::COMPUTE_CAPABILITY_MINOR).unwrap_or(0))
}

/// A session's state made again in this worker, waiting for its app (`Session::adopt`).
pub struct Restored<D: Device> {
    allocations: Vec<(u64, u64)>,
    modules: HashMap<u32, LoadedModule<D>>,
    /// Modules' loads on the session's other devices that hold variables the app knows.
    elsewhere: Vec<((u32, usize), LoadedModule<D>)>,
    streams: Vec<(u64, D::Stream, u32, i32)>,
    events: Vec<(u64, D::Event, u32)>,
    may_print: bool,
    segment: Option<SegmentState>,
    /// App address, length and address here of each module variable.
    moved_variables: Vec<(u64, u64, u64)>,
    pools: super::pools::PoolTable<D>,
    arrays: super::arrays::ArrayTable<D>,
    vmm: super::vmm::VmmTable<D>,
    graphs: super::graphs::GraphTable<D>,
    /// The device current at the pause: the client's connection names it as its last `SetDevice`.
    current_device: usize,
    owners: Owners,
}

impl<D: Device> Restored<D> {
    /// Takes the segment the app offered again back as the session's: the same size, its blocks
    /// pinned again, each mapped block at the app's address of it (kernels use those pointers).
    /// `Err` says why the session cannot continue with it.
    pub fn reattach_segment(&self, segment: Option<&mut Segment>, device: &D) -> Result<(), String> {
        match (&self.segment, segment) {
            (None, None) => Ok(()),
            (None, Some(_)) => Err("the app offered a shared-memory segment its session did not have".into()),
            (Some(_), None) => {
                Err("the session's shared-memory segment did not come back (the app must reconnect from the same host)".into())
            }
            (Some(state), Some(segment)) => {
                if segment.size() != state.size || segment.staging() != state.staging {
                    return Err(format!(
                        "the app offered a segment of {} bytes ({} staging), not the session's {} ({})",
                        segment.size(),
                        segment.staging(),
                        state.size,
                        state.staging
                    ));
                }
                for &(offset, len, mapped_at) in &state.blocks {
                    let pinned = super::pin_block(segment, device, offset, len, (mapped_at != 0).then_some(mapped_at))
                        .map_err(|error| format!("pinning {len} bytes at offset {offset} again: {error}"))?;
                    if pinned != mapped_at {
                        return Err(format!("the app's mapped host memory at {mapped_at:#x} cannot be mapped there on this server"));
                    }
                }
                Ok(())
            }
        }
    }
}

/// Restores the snapshot at `path` on `device`, charging its memory to `budget`.
pub fn restore<D: Device>(device: &D, budget: &dyn MemoryBudget, path: &Path, chunk: u64) -> Result<Restored<D>, String> {
    let file = std::fs::File::open(path).map_err(|error| format!("{}: {error}", path.display()))?;
    let mut input = BufReader::with_capacity(8 << 20, file);
    let mut magic = [0u8; 8];
    let mut len = [0u8; 8];
    input.read_exact(&mut magic).and_then(|()| input.read_exact(&mut len)).map_err(|error| format!("{}: {error}", path.display()))?;
    if &magic != MAGIC {
        return Err(format!("{} is not a Flyt snapshot", path.display()));
    }
    let len = u64::from_le_bytes(len);
    if len > MAX_MANIFEST {
        return Err(format!("{}: manifest of {len} bytes", path.display()));
    }
    let mut bytes = vec![0u8; len as usize];
    input.read_exact(&mut bytes).map_err(|error| format!("{}: {error}", path.display()))?;
    let mut manifest: Manifest = flyt_protocol::frame::decode_exact(&bytes).map_err(|error| format!("{}: {error}", path.display()))?;
    drop(bytes);
    let here = capability(device);
    if manifest.emulated != device.emulated() || manifest.capability.0 != here.0 {
        return Err(format!(
            "the snapshot is of a compute capability {}.{} {}device; this one is {}.{}{}",
            manifest.capability.0,
            manifest.capability.1,
            if manifest.emulated { "emulated " } else { "" },
            here.0,
            here.1,
            if device.emulated() { " (emulated)" } else { "" }
        ));
    }
    let total: u64 = manifest.allocations.iter().map(|(_, len)| len).sum::<u64>()
        + super::arrays::state_bytes(&manifest.arrays)
        + manifest.vmm.charged();
    if !budget.try_reserve(total) {
        return Err(format!("its {total} bytes of device memory exceed what this server's quota has free"));
    }
    // The allocations at their addresses first, and the addresses the app knows its variables by
    // (held, so no allocation takes them): a fresh worker's driver places modules' variables
    // where it likes, and the session then sends the app's addresses there (`MovedVariables`).
    if manifest.devices as usize != device.device_count() {
        return Err(format!(
            "the session had {} GPU(s); this server's sessions have {} (a move keeps the number and order of GPUs)",
            manifest.devices,
            device.device_count()
        ));
    }
    let devices = manifest.devices as usize;
    if manifest.allocation_devices.len() != manifest.allocations.len()
        || manifest.current_device >= manifest.devices
        || manifest
            .modules
            .iter()
            .flat_map(|module| module.elsewhere.iter().map(|(device, _)| *device).chain([module.device]))
            .chain(manifest.allocation_devices.iter().copied())
            .any(|d| d >= manifest.devices)
        || manifest.streams.iter().map(|stream| stream.3).chain(manifest.events.iter().map(|event| event.2)).any(|d| d >= manifest.devices)
        || manifest.peers.iter().any(|&(from, to, _)| from >= manifest.devices || to >= manifest.devices)
    {
        return Err(format!("{}: a device index outside the session's {devices} GPU(s)", path.display()));
    }
    let select = |index: u32| device.select_device(index as usize).map_err(|error| format!("selecting the session's GPU {index}: {error}"));
    // Device by device, each its allocations and the addresses its modules' variables had; the
    // app's reservations (VMM) with the first (a session of several GPUs moves without any).
    for index in 0..manifest.devices {
        let held = manifest
            .modules
            .iter()
            .flat_map(|module| module.variables_by_device())
            .filter(|(device, _)| *device == index)
            .map(|(_, (_, address, size))| (*address, *size));
        let own = manifest.allocations.iter().zip(&manifest.allocation_devices).filter(|(_, d)| **d == index).map(|(range, _)| *range);
        let reserved: Vec<_> = own.chain(held).collect();
        let reservations = if index == 0 { manifest.vmm.reservations() } else { &[] };
        if devices > 1 && reserved.is_empty() && reservations.is_empty() {
            continue;
        }
        select(index)?;
        device.restore_allocations(&reserved, reservations)?;
    }
    select(0)?;
    let mapped = manifest.vmm.mapped();
    let vmm = super::vmm::VmmTable::restore(device, std::mem::take(&mut manifest.vmm))?;
    let mut modules = HashMap::new();
    let mut moved_variables = Vec::new();
    let mut variables_here = Vec::new();
    let mut elsewhere = Vec::new();
    for state in manifest.modules {
        select(state.device)?;
        let module = device.load_module(&state.image).map_err(|error| format!("module {} does not load here: {error}", state.id))?;
        let count = state.functions.iter().map(|(_, index, _)| *index as usize + 1).max().unwrap_or(0);
        let mut functions: Vec<_> = (0..count).map(|_| Err(CudaError::INVALID_DEVICE_FUNCTION)).collect();
        let mut function_names = HashMap::new();
        for (name, index, attributes_set) in state.functions {
            functions[index as usize] = device.function(&module, &name).and_then(|(function, params)| {
                for (attribute, value) in &attributes_set {
                    device.func_set_attribute(function, *attribute, *value)?;
                }
                Ok(Kernel { attributes_set, ..Kernel::new(function, params) })
            });
            function_names.insert(name, index);
        }
        for (name, address, size) in &state.variables {
            let (here, here_size, _) = device.variable(&module, name).map_err(|error| format!("module variable {name}: {error}"))?;
            if here_size != *size {
                return Err(format!("module variable {name} has {here_size} bytes here, not {size}"));
            }
            moved_variables.push((*address, *size, here));
            variables_here.push((here, *size));
        }
        let loaded = LoadedModule {
            module,
            device: state.device as usize,
            image: Arc::new(state.image),
            functions,
            function_names,
            variables: state.variables,
        };
        // Its loads on other devices, with the variables the app knows there.
        for (index, variables) in state.elsewhere {
            select(index)?;
            let mut load = super::load_elsewhere(device, &loaded, index as usize)
                .map_err(|error| format!("module {} does not load on GPU {index}: {error}", state.id))?;
            for (name, address, size) in &variables {
                let (here, here_size, _) =
                    device.variable(&load.module, name).map_err(|error| format!("module variable {name}: {error}"))?;
                if here_size != *size {
                    return Err(format!("module variable {name} has {here_size} bytes here, not {size}"));
                }
                moved_variables.push((*address, *size, here));
                variables_here.push((here, *size));
            }
            load.variables = variables;
            elsewhere.push(((state.id, index as usize), load));
        }
        modules.insert(state.id, loaded);
    }
    let ranges: Vec<_> = match &manifest.handover {
        None => manifest.allocations.iter().copied().chain(mapped).chain(variables_here).collect(),
        Some(handover) => {
            let spans = match &handover.socket {
                Some(socket) => receive_descriptors(socket, handover.spans.len())?,
                None => Vec::new(),
            };
            let mut ipc = Vec::with_capacity(handover.ipc.len());
            for (ptr, len, handle) in &handover.ipc {
                let handle = <[u8; 64]>::try_from(handle.as_slice()).map_err(|_| format!("a bad IPC handle for {ptr:#x}"))?;
                ipc.push((*ptr, *len, handle));
            }
            let spans = handover
                .spans
                .iter()
                .zip(spans)
                .map(|(&(start, len, copy_len), fd)| crate::backend::MovedSpan { start, len, copy_len, fd })
                .collect();
            let started = Instant::now();
            device.import_for_move(crate::backend::MovedMemory { ipc, spans })?;
            tracing::info!(took_us = started.elapsed().as_micros() as u64, "device memory copied from the paused session, GPU to GPU");
            variables_here
        }
    };
    let data_at = (MAGIC.len() + 8) as u64 + len;
    let writable = std::fs::File::options().read(true).write(true).open(path).map_err(|error| format!("{}: {error}", path.display()))?;
    if copy_direct(device, &writable, data_at, &ranges, false)? {
        let arrays_at = data_at + ranges.iter().map(|(_, len)| len).sum::<u64>();
        std::io::Seek::seek(&mut input, std::io::SeekFrom::Start(arrays_at)).map_err(|error| format!("{}: {error}", path.display()))?;
    } else {
        for &(ptr, len) in &ranges {
            write_device(device, chunk, ptr, len, &mut input)?;
        }
    }
    select(0)?;
    let pools = super::pools::PoolTable::restore(device, manifest.pools)?;
    let arrays = super::arrays::ArrayTable::restore(device, manifest.arrays, chunk, &mut input)?;
    let mut owners = Owners::default();
    for (&(ptr, _), &index) in manifest.allocations.iter().zip(&manifest.allocation_devices) {
        owners.allocated(ptr, index as usize);
    }
    let mut streams = Vec::new();
    for (id, flags, priority, index) in manifest.streams {
        select(index)?;
        streams.push((id, device.stream_create(flags, priority).map_err(|error| format!("stream: {error}"))?, flags, priority));
        owners.stream_made(id, index as usize);
    }
    let mut events = Vec::new();
    for (id, flags, index) in manifest.events {
        select(index)?;
        events.push((id, device.event_create(flags).map_err(|error| format!("event: {error}"))?, flags));
        owners.event_made(id, index as usize);
    }
    for (from, to, flags) in manifest.peers {
        select(from)?;
        device.peer_access(to as usize, true, flags).map_err(|error| format!("peer access from GPU {from} to GPU {to}: {error}"))?;
        owners.peer_access(from as usize, to as usize, true, flags);
    }
    select(0)?;
    let kernel = |function: flyt_protocol::ops::FunctionRef| {
        let kernel = modules.get(&function.module)?.functions.get(function.index as usize)?.as_ref().ok()?;
        Some((kernel.function, kernel.args_len))
    };
    let event = |id: u64| events.iter().find(|(known, _, _)| *known == id).map(|(_, event, _)| *event);
    let resolve = super::graphs::Resolve { kernel: &kernel, event: &event };
    let graphs = super::graphs::GraphTable::restore(device, manifest.graphs, crate::host_calls::HostCalls::unlinked(), &resolve)?;
    for index in 0..manifest.devices {
        select(index)?;
        device.synchronize().map_err(|error| format!("restoring device memory on GPU {index}: {error}"))?;
    }
    // The first device until the session takes over (a segment's blocks are pinned as a fresh
    // session pins them); `adopt` makes the paused one current again.
    select(0)?;
    Ok(Restored {
        current_device: manifest.current_device as usize,
        owners,
        allocations: manifest.allocations,
        modules,
        elsewhere,
        streams,
        events,
        may_print: manifest.may_print,
        segment: manifest.segment,
        moved_variables,
        pools,
        arrays,
        vmm,
        graphs,
    })
}

impl<D: Device> Session<D> {
    /// Takes over a restored session's state (before the first request).
    pub fn adopt(&mut self, restored: Restored<D>) {
        for (ptr, len) in restored.allocations {
            self.ranges.insert(ptr, len, RangeKind::Allocation);
        }
        for (id, loaded) in restored.modules {
            for (_, address, size) in &loaded.variables {
                self.ranges.insert(*address, *size, RangeKind::Variable);
            }
            self.modules.insert(id, loaded);
        }
        for (key, loaded) in restored.elsewhere {
            for (_, address, size) in &loaded.variables {
                self.ranges.insert(*address, *size, RangeKind::Variable);
            }
            self.elsewhere.insert(key, loaded);
        }
        for (id, stream, flags, priority) in restored.streams {
            self.streams.insert(id, stream);
            self.stream_params.insert(id, (flags, priority));
        }
        for (id, event, flags) in restored.events {
            self.events.insert(id, event);
            self.event_flags.insert(id, flags);
        }
        self.may_print = restored.may_print;
        self.pools = restored.pools;
        self.arrays = restored.arrays;
        for (start, len) in restored.vmm.mapped() {
            self.ranges.insert(start, len, RangeKind::Mapping);
        }
        self.vmm = restored.vmm;
        // Host nodes of the graphs made again announce through this session's connection.
        restored.graphs.host_calls.link_as(&self.graphs.host_calls);
        self.graphs = restored.graphs;
        for (app_address, len, here) in restored.moved_variables {
            self.moved_variables.insert(app_address, len, here);
        }
        self.owners = restored.owners;
        if let Err(error) = self.device.select_device(restored.current_device) {
            tracing::error!(%error, device = restored.current_device, "the restored session's current GPU cannot be made current");
        }
    }

    /// Why this session cannot be made again elsewhere, if anything holds it.
    pub(super) fn move_blocker(&self) -> Option<String> {
        if self.shm.as_ref().is_some_and(Segment::is_region) {
            return Some("its app uses a VM's ivshmem region, which cannot move yet".into());
        }
        if self.shm.as_ref().is_some_and(Segment::has_files) {
            return Some("its app registered shared file mappings of its own, which the server maps from their descriptors".into());
        }
        if self.events.len() != self.event_flags.len() {
            return Some("it opened IPC event handles of other processes".into());
        }
        if self.event_flags.values().any(|flags| flags & EVENT_INTERPROCESS != 0) {
            return Some("it has interprocess events other processes may have opened".into());
        }
        if !self.links.is_empty() {
            return Some(format!("{} JIT link(s) are under way", self.links.len()));
        }
        if self.device.device_count() > 1
            && let Some(reason) = self.several_devices_blocker()
        {
            return Some(reason);
        }
        self.graphs
            .move_blocker()
            .or_else(|| self.ipc.move_blocker())
            .or_else(|| self.vmm.move_blocker())
            .or_else(|| self.pools.move_blocker())
            .or_else(|| self.tensor_maps.move_blocker())
            .or_else(|| self.arrays.move_blocker())
            .or_else(|| self.green.move_blocker())
    }

    /// What of a session of several GPUs cannot be made again device by device yet.
    fn several_devices_blocker(&self) -> Option<String> {
        let several = "in a session of several GPUs";
        if let Some((ptr, _)) =
            self.ranges.of_kind(RangeKind::Allocation).into_iter().find(|(ptr, _)| self.owners.allocation(*ptr).is_none())
        {
            return Some(format!("its memory at {ptr:#x} is a memory pool's (stream-ordered allocations {several} do not move yet)"));
        }
        if let Some(id) = self.stream_params.keys().find(|id| !self.owners.streams.contains_key(id)) {
            return Some(format!("its stream {id} belongs to no recorded device (a green context's, say)"));
        }
        if let Some(id) = self.event_flags.keys().find(|id| !self.owners.events.contains_key(id)) {
            return Some(format!("its event {id} belongs to no recorded device"));
        }
        if self.pools.in_use() {
            return Some(format!("it made or chose memory pools (pools {several} do not move yet)"));
        }
        let held = self.vmm.held();
        if held > 0 {
            return Some(format!(
                "it holds {held} virtual memory reservation(s) or physical allocation(s) (VMM {several} does not move yet)"
            ));
        }
        let held = self.arrays.held();
        if held > 0 {
            return Some(format!("it holds {held} CUDA array(s) or texture/surface object(s) (arrays {several} do not move yet)"));
        }
        let held = self.graphs.held();
        if held > 0 {
            return Some(format!("it holds {held} graph(s) or executable graph(s) (graphs {several} do not move yet)"));
        }
        None
    }

    /// Drains the session's work and writes its snapshot into `dir`.
    fn write_snapshot(&mut self, dir: &Path, asked_at: Instant, on_device: bool) -> Result<(SnapshotInfo, Option<HandoverSocket>), String> {
        if let Some(reason) = self.move_blocker() {
            return Err(format!("the session cannot move: {reason}"));
        }
        self.device.synchronize().map_err(|error| format!("the session's work failed ({error}): it cannot move"))?;
        if self.may_print {
            self.outbox.send_output();
        }
        self.outbox.send_ready();
        if !self.waiters.wait_idle(Duration::from_secs(10)) {
            return Err("a wait of the session did not finish".into());
        }
        let drain_us = asked_at.elapsed().as_micros() as u64;
        let started = Instant::now();
        let allocations = self.ranges.of_kind(RangeKind::Allocation);
        let mut modules = Vec::new();
        let mut ids: Vec<_> = self.modules.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let loaded = &self.modules[&id];
            let mut functions: Vec<_> = loaded
                .function_names
                .iter()
                .map(|(name, index)| {
                    let attributes = loaded
                        .functions
                        .get(*index as usize)
                        .and_then(|kernel| kernel.as_ref().ok())
                        .map(|kernel| kernel.attributes_set.clone());
                    (name.clone(), *index, attributes.unwrap_or_default())
                })
                .collect();
            functions.sort_by_key(|(_, index, _)| *index);
            let device = loaded.device as u32;
            let mut elsewhere: Vec<_> = self
                .elsewhere
                .iter()
                .filter(|((module, _), load)| *module == id && !load.variables.is_empty())
                .map(|((_, index), load)| (*index as u32, load.variables.clone()))
                .collect();
            elsewhere.sort_unstable_by_key(|(index, _)| *index);
            let variables = loaded.variables.clone();
            modules.push(ModuleState { id, device, image: loaded.image.to_vec(), functions, variables, elsewhere });
        }
        let owner = |known: Option<&usize>| known.copied().unwrap_or(0) as u32;
        let mut streams: Vec<_> =
            self.stream_params.iter().map(|(id, (flags, priority))| (*id, *flags, *priority, owner(self.owners.streams.get(id)))).collect();
        streams.sort_unstable();
        let mut events: Vec<_> = self.event_flags.iter().map(|(id, flags)| (*id, *flags, owner(self.owners.events.get(id)))).collect();
        events.sort_unstable();
        let allocation_devices = allocations.iter().map(|(ptr, _)| self.owners.allocation(*ptr).unwrap_or(0) as u32).collect();
        let peers = self.owners.peers.iter().map(|(&(from, to), &flags)| (from as u32, to as u32, flags)).collect();
        let arrays = self.arrays.state();
        let vmm = self.vmm.state();
        let graphs = self.graphs_state().map_err(|reason| format!("the session cannot move: {reason}"))?;
        let device_bytes = allocations.iter().chain(&vmm.mapped()).map(|(_, len)| len).sum::<u64>()
            + modules.iter().flat_map(|module| module.variables.iter().map(|(_, _, size)| size)).sum::<u64>()
            + super::arrays::state_bytes(&arrays);
        let name = new_name()?;
        std::fs::create_dir_all(dir).map_err(|error| format!("{}: {error}", dir.display()))?;
        let path = path_of(dir, &name);
        // Handed over on the GPU: the file keeps the variables' bytes only.
        let moved = match on_device {
            // Its memory would be imported on one GPU of the target: each device's memory by file.
            true if self.device.device_count() > 1 => {
                return Err(
                    "its device memory cannot be handed over on this GPU: a session of several GPUs moves through the snapshot file".into(),
                );
            }
            true => Some(
                self.device
                    .export_for_move(&allocations.iter().copied().chain(vmm.mapped()).collect::<Vec<_>>())
                    .map_err(|error| format!("its device memory cannot be handed over on this GPU: {error}"))?,
            ),
            false => None,
        };
        let socket_path = path.with_extension("handover");
        let handover = moved.as_ref().map(|moved| HandoverState {
            ipc: moved.ipc.iter().map(|(ptr, len, handle)| (*ptr, *len, handle.to_vec())).collect(),
            spans: moved.spans.iter().map(|span| (span.start, span.len, span.copy_len)).collect(),
            socket: (!moved.spans.is_empty()).then(|| socket_path.display().to_string()),
        });
        let manifest = Manifest {
            capability: capability(&*self.device),
            emulated: self.device.emulated(),
            devices: self.device.device_count() as u32,
            current_device: self.device.current_device() as u32,
            allocations,
            allocation_devices,
            modules,
            streams,
            events,
            peers,
            may_print: self.may_print,
            segment: self.shm.as_ref().map(|segment| SegmentState {
                size: segment.size(),
                staging: segment.staging(),
                blocks: segment.blocks().into_iter().map(|(offset, len, alias)| (offset, len, alias.unwrap_or(0))).collect(),
            }),
            pools: self.pools.state(),
            arrays,
            vmm,
            graphs,
            handover,
        };
        let partial = path.with_extension("partial");
        let written: Result<u64, String> = (|| {
            let io = |error: std::io::Error| format!("{}: {error}", partial.display());
            let mut file = std::fs::File::options().read(true).write(true).create(true).truncate(true).open(&partial).map_err(io)?;
            let mut bytes = Vec::new();
            flyt_protocol::frame::encode_into(&manifest, &mut bytes);
            file.write_all(MAGIC).map_err(io)?;
            file.write_all(&(bytes.len() as u64).to_le_bytes()).map_err(io)?;
            file.write_all(&bytes).map_err(io)?;
            let data_at = (MAGIC.len() + 8 + bytes.len()) as u64;
            // Variables that moved before are read where they live now.
            let ranges: Vec<_> = manifest_ranges(&manifest).into_iter().map(|(ptr, len)| (self.moved_variables.here(ptr), len)).collect();
            let file_bytes: u64 = ranges.iter().map(|(_, len)| len).sum();
            file.set_len(data_at + file_bytes).map_err(io)?;
            let chunk = self.config.copy_chunk;
            let direct = copy_direct(&*self.device, &file, data_at, &ranges, true)?;
            if direct {
                tracing::info!(bytes = file_bytes, "device memory copied straight into the snapshot file's pinned pages");
            } else {
                file.set_len(data_at).map_err(io)?;
            }
            let mut out = BufWriter::with_capacity(8 << 20, &mut file);
            let arrays_at = if direct { data_at + file_bytes } else { data_at };
            std::io::Seek::seek(&mut out, std::io::SeekFrom::Start(arrays_at)).map_err(io)?;
            if !direct {
                for &(ptr, len) in &ranges {
                    read_device(&*self.device, chunk, ptr, len, &mut out)?;
                }
            }
            self.arrays.write_bytes(&manifest.arrays, &*self.device, chunk, &mut out)?;
            out.flush().map_err(io)?;
            drop(out);
            file.sync_all().map_err(io)?;
            let bytes = file.metadata().map_err(io)?.len();
            std::fs::rename(&partial, &path).map_err(io)?;
            Ok(bytes)
        })();
        let bytes = written.inspect_err(|_| {
            let _ = std::fs::remove_file(&partial);
        })?;
        let socket = match moved {
            Some(moved) if !moved.spans.is_empty() => {
                let fds = moved.spans.into_iter().map(|span| span.fd).collect();
                Some(HandoverSocket::serve(socket_path, fds).inspect_err(|_| {
                    let _ = std::fs::remove_file(&path);
                })?)
            }
            _ => None,
        };
        let info = SnapshotInfo { session_id: 0, name, bytes, device_bytes, drain_us, write_us: started.elapsed().as_micros() as u64 };
        Ok((info, socket))
    }

    /// The client's `Pause`: drains, writes the snapshot asked for and waits for the decision.
    /// `true` when the session moved away and ends here.
    pub(super) fn pause_for_checkpoint(&mut self) -> bool {
        let control = self.moves.clone();
        let (dir, asked_at, on_device) = {
            let mut state = control.lock();
            // A pause the control thread gave up on already (the client was told to resume).
            let Some((dir, asked_at, on_device)) = state.asked.clone() else { return false };
            state.taken = true;
            (dir, asked_at, on_device)
        };
        // The handover of device memory, if any, lives until the decision.
        let (written, _handover) = match self.write_snapshot(&dir, asked_at, on_device) {
            Ok((info, handover)) => (Ok(info), handover),
            Err(reason) => (Err(reason), None),
        };
        let name = written.as_ref().ok().map(|info| info.name.clone());
        if name.is_none() {
            // Before the control thread hears of the failure: a checkpoint it is asked for next
            // (the file after a refused GPU handover) must find its pause after this one's end.
            self.outbox.send_notice(&Notice::Resumed);
        }
        let mut state = control.lock();
        state.written = Some(written);
        control.changed.notify_all();
        let Some(name) = name else { return false };
        let deadline = Instant::now() + DECISION_TIMEOUT;
        while state.decision.is_none() && Instant::now() < deadline {
            state = control.changed.wait_timeout(state, Duration::from_secs(1)).unwrap_or_else(|e| e.into_inner()).0;
        }
        let decision = state.decision.take().flatten();
        // The app hears how this pause ends before another checkpoint may begin (below), so a
        // next pause never reaches it ahead of this one's end.
        let moved = match decision {
            Some(to) => {
                tracing::info!(snapshot = %name, to = %to, "session moved");
                self.outbox.send_notice(&Notice::Moved { address: (!to.is_empty()).then_some(to), snapshot: name });
                true
            }
            None => {
                self.outbox.send_notice(&Notice::Resumed);
                false
            }
        };
        state.asked = None;
        control.changed.notify_all();
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_keep_each_object_s_device_and_the_peer_access_enabled() {
        let mut owners = Owners::default();
        owners.allocated(0x1000, 1);
        owners.allocated(0x2000, 0);
        owners.allocated(0x1000, 0);
        assert_eq!((owners.allocation(0x1000), owners.allocation(0x2000), owners.allocation(0x3000)), (Some(0), Some(0), None));
        owners.peer_access(0, 1, true, 0);
        owners.peer_access(1, 0, true, 0);
        owners.peer_access(1, 2, true, 0);
        owners.peer_access(1, 2, false, 0);
        assert_eq!(owners.peers.keys().copied().collect::<Vec<_>>(), vec![(0, 1), (1, 0)]);
        owners.freed(0x2000);
        assert_eq!(owners.allocation(0x2000), None);
        owners.reset(1);
        assert_eq!(owners.allocation(0x1000), None, "a reset forgets every allocation");
        assert_eq!(owners.peers.keys().copied().collect::<Vec<_>>(), vec![(0, 1)], "a reset of device 1 ends only its own access");
    }

    #[test]
    fn a_socket_beside_a_snapshot_deep_in_folders_is_bound_and_reached() {
        let scratch = tempfile::tempdir().unwrap();
        let folder = scratch.path().join("a-folder-name-long-enough-to-matter").join("snapshots").join("alloc-0123456789abcdef");
        std::fs::create_dir_all(&folder).unwrap();
        let path = folder.join("0123456789abcdef0123456789abcdef.handover");
        assert!(path.as_os_str().len() > SOCKET_PATH_MAX, "{}", path.display());
        let (address, _held) = socket_address(&path).unwrap();
        assert!(address.as_os_str().len() <= SOCKET_PATH_MAX, "{}", address.display());
        let listener = std::os::unix::net::UnixListener::bind(&address).unwrap();
        assert!(path.exists(), "bound at the snapshot's own path");
        let (address, _held) = socket_address(&path).unwrap();
        let _client = std::os::unix::net::UnixStream::connect(&address).unwrap();
        assert!(listener.accept().is_ok());
        let short = scratch.path().join("x.handover");
        assert_eq!(socket_address(&short).unwrap().0, short, "a short path is used as it is");
    }
}
