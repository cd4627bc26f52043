//! Session set-up: the first frame a client sends and the server's answer.

use serde::{Deserialize, Serialize};

use crate::device::DeviceInfo;

/// Bytes that open every `Hello`, so a stray connection is refused at once.
pub const MAGIC: [u8; 4] = *b"FLYT";
/// Bumped whenever a message or the op table changes incompatibly.
pub const PROTOCOL_VERSION: u32 = 34;
/// The CUDA runtime ABI the shim implements.
pub const CUDA_ABI_MAJOR: u32 = 13;
/// `cudaRuntimeGetVersion` of the runtime the shim stands in for (CUDA 13.0).
pub const RUNTIME_VERSION: i32 = 13000;

/// Who is asking: for logs, placement and same-host detection.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientIdentity {
    pub hostname: String,
    pub pid: u32,
    pub program: String,
    /// `/proc/sys/kernel/random/boot_id`: equal on both ends means the same kernel, so memory
    /// can be shared.
    pub boot_id: String,
}

/// A shared-memory segment the client offers for bulk data (same host only).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShmOffer {
    /// A path both sides can open (`/dev/shm/...` or a configured shared file), or empty when the
    /// segment (a memfd) follows the hello over the Unix socket as an `SCM_RIGHTS` descriptor
    /// carried by one byte.
    pub path: String,
    /// Bytes in the segment.
    pub size: u64,
    /// The first `staging` bytes are the staging area for pageable copies; the server pins them
    /// for the whole session.
    pub staging: u64,
    /// Capacity of each of the two message rings at the start of the segment (see `flyt-ring`),
    /// or 0 to keep small messages on the socket.
    pub rings: u64,
    /// The segment is a slot of a virtual machine's ivshmem region on the server's host (the
    /// client runs in the guest), not a file of the client's own.
    pub region: Option<RegionClaim>,
}

/// A guest's claim on a slot of its VM's ivshmem region (`flyt_ring::region`): the region's name
/// on the host, its secret (read from the region's header, which only that VM and the host see),
/// and where the slot starts in the region. The segment is `size` bytes from there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionClaim {
    pub name: String,
    pub token: String,
    pub offset: u64,
}

/// The client's first frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub magic: [u8; 4],
    pub protocol_version: u32,
    pub cuda_abi_major: u32,
    /// Session token from the cluster manager; `None` in direct mode without a cluster key.
    pub token: Option<String>,
    pub client: ClientIdentity,
    pub shm: Option<ShmOffer>,
    /// A moved session's snapshot to continue (`Notice::Moved`): the server restores it, or
    /// finds it restored already, instead of starting an empty session.
    pub resume: Option<String>,
    /// A data connection of an open session (striped bulk copies, `crate::stripes`), not a
    /// session of its own.
    pub stripe: Option<crate::stripes::StripeJoin>,
    /// The session's connection broke and its client comes back to it (`docs/design/reconnect.md`):
    /// not a session of its own.
    pub reattach: Option<Reattach>,
}

/// A client coming back to its session after its TCP connection broke: it proves it owns the
/// session with the secret the server gave at the first handshake (`SessionInfo::resume_secret`)
/// and says how many bytes of the session's stream from the server it has received, so the server
/// sends the rest again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reattach {
    pub session_id: u64,
    pub secret: [u8; crate::stripes::SECRET_LEN],
    pub received: u64,
}

impl Hello {
    /// A hello for this build's protocol.
    pub fn new(token: Option<String>, client: ClientIdentity, shm: Option<ShmOffer>) -> Self {
        Self {
            magic: MAGIC,
            protocol_version: PROTOCOL_VERSION,
            cuda_abi_major: CUDA_ABI_MAJOR,
            token,
            client,
            shm,
            resume: None,
            stripe: None,
            reattach: None,
        }
    }
}

/// What the client may rely on for the whole session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionInfo {
    pub session_id: u64,
    pub server_version: String,
    /// `cudaDriverGetVersion` on the server.
    pub driver_version: i32,
    /// The devices of this session: the GPUs of its allocation on this server, in order.
    pub devices: Vec<DeviceInfo>,
    /// The driver's answers for each ordered pair of those devices (none for one device).
    pub peers: Vec<crate::device::PeerLink>,
    /// Each device's NVLinks (indexed as `devices`), one entry per link the hardware has (none
    /// for a device without NVLink, or where the server's host has no NVML).
    pub nvlinks: Vec<Vec<crate::device::NvLinkEnd>>,
    /// Largest bulk payload per frame the server accepts for copies; bigger copies are chunked.
    pub copy_chunk: u64,
    /// Whether the offered shared-memory segment was accepted.
    pub shm_accepted: bool,
    /// Whether small messages move to the segment's rings after this reply.
    pub rings: bool,
    /// Why an offered segment was not accepted (shown when the user insisted with `FLYT_SHM=on`).
    pub shm_refusal: Option<String>,
    /// `true` when the device cannot run kernels (the emulated device).
    pub emulated: bool,
    /// What a data connection of this session presents (`crate::stripes`); `None` when the
    /// session stripes no copies (the shared-memory channel carries its bulk).
    pub stripe_secret: Option<[u8; crate::stripes::SECRET_LEN]>,
    /// What the client presents to come back to this session after its TCP connection broke
    /// (`Hello::reattach`); `None` when the server keeps no session for a returning client (its
    /// grace period is 0, or the session is not on TCP).
    pub resume_secret: Option<[u8; crate::stripes::SECRET_LEN]>,
}

/// The server's answer to `Hello`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum HelloReply {
    Accepted(SessionInfo),
    /// The session is refused; `error` is the `cudaError_t` the app should see.
    Refused {
        error: u32,
        reason: String,
    },
    /// The answer to `Hello::reattach`: the session goes on over this connection. `received`:
    /// the bytes of the client's stream the server has received; the client sends the rest again.
    Reattached {
        received: u64,
    },
}

/// What the server may tell a client unasked (frames with sequence number 0).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Notice {
    /// The session's slice changed (the allocation was resized): its devices as they are now.
    Limits { devices: Vec<DeviceInfo> },
    /// What the session's kernels printed (device `printf`, a failed device `assert`), sent just
    /// before the reply to the call at which CUDA flushes it (a synchronize, a blocking copy,
    /// teardown), so the app writes it at the same point as natively.
    Output { stdout: Vec<u8>, stderr: Vec<u8> },
    /// A stream reached the app's host function `call` (`cuLaunchHostFunc`, a graph's host
    /// node): the client runs it and answers `HostCallDone { run }`; the stream waits till then.
    HostCall { call: u64, run: u64 },
    /// A graph's device-to-host copy into the app's memory ran (`NodeParams::HostMemcpy`): its
    /// bytes, packed, follow as bulk; the client writes them at `host` and answers
    /// `HostCallDone { run }`, in order with host functions. The stream waits till then.
    HostCopyOut { run: u64, host: crate::ops::HostBox },
    /// A graph's host-to-device copy from the app's memory is about to run: the client reads
    /// `host` and answers `HostCopyDone { run }` with the bytes, packed.
    HostCopyIn { run: u64, host: crate::ops::HostBox },
    /// The session is about to be checkpointed or moved: the client sends `Pause` after its last
    /// request and then holds every new call until `Moved` or `Resumed`.
    Pause,
    /// The session's state now lives in snapshot `snapshot`: the client reconnects to `address`
    /// (`None`: the server it had) with `Hello::resume` and goes on. The old connection ends.
    Moved { address: Option<String>, snapshot: String },
    /// The pause is over and the session goes on here (a checkpoint that stayed, or a move that
    /// did not happen).
    Resumed,
    /// The slice's memory quota was lowered below what the tenant's sessions hold: they hold
    /// `bytes` more than the quota now allows (CUDA's over-budget notification).
    OverBudget { bytes: u64 },
    /// Sent about once a second while replies the client waits for are still to come and
    /// nothing else was sent: the server is alive and the work is long (a kernel, a wait). A
    /// client that hears nothing at all for its reply timeout takes the server for gone.
    Alive,
}
