//! The rpc-server's control socket (Unix, owner-only), used by the node manager that spawned it.

use serde::{Deserialize, Serialize};

use crate::handshake::ClientIdentity;

/// Why an rpc-server refused a call about a session it no longer has (it ended: its app exited,
/// or its client's reconnect grace ran out).
pub fn session_ended(session_id: u64) -> String {
    format!("no session {session_id} on this server (it ended)")
}

/// Whether a refusal (as passed on by a node manager, with words before it) says the session
/// had ended ([`session_ended`]): a move then has nothing of it to move.
pub fn says_session_ended(reason: &str, session_id: u64) -> bool {
    reason.ends_with(&session_ended(session_id))
}

/// One live session on an rpc-server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionStatus {
    pub session_id: u64,
    pub client: ClientIdentity,
    /// Process id of the worker that runs this session's GPU work.
    pub worker_pid: u32,
    /// Device memory the session holds now, in bytes.
    pub memory_used: u64,
    /// Unix seconds when the session started.
    pub started_at: u64,
}

/// An rpc-server's settings and sessions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RpcServerStatus {
    pub pid: u32,
    /// The allocation this server serves, when started by a node manager.
    pub allocation: Option<String>,
    /// `cuda` or `emulated`.
    pub backend: String,
    /// CUDA ordinal of the GPU.
    pub gpu: u32,
    /// Addresses it listens on, as given to `--listen` (ports resolved).
    pub listen: Vec<String>,
    /// Device memory each session may use, in bytes.
    pub memory_quota: u64,
    /// SM share in percent (MPS active-thread percentage).
    pub sm_percentage: u32,
    /// SMs a session sees (`multiProcessorCount`).
    pub sm_count: u32,
    pub sessions: Vec<SessionStatus>,
    /// Where its Prometheus metrics are served (`host:port`), when they are.
    #[serde(default)]
    pub metrics: Option<String>,
}

/// A snapshot's file in its folder is its name with this suffix.
pub const SNAPSHOT_SUFFIX: &str = ".flyt-snapshot";

/// A session's snapshot, written by `checkpoint`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    pub session_id: u64,
    /// The snapshot's name: its file in the snapshot folder is `<name>` and `SNAPSHOT_SUFFIX`, and the
    /// app presents the name when it reconnects.
    pub name: String,
    /// Bytes of the snapshot file, and of device memory in it.
    pub bytes: u64,
    pub device_bytes: u64,
    /// From the pause request to the app's last call drained (the app holds new calls from
    /// then on), and the snapshot's writing after it, in microseconds.
    pub drain_us: u64,
    pub write_us: u64,
}

/// What the node manager may ask of an rpc-server.
#[tarpc::service]
pub trait RpcServerControl {
    /// Settings and live sessions.
    async fn status() -> RpcServerStatus;
    /// Changes the slice. A new memory quota applies at once to every session (a session already
    /// above it keeps what it has but cannot allocate more); a new SM share applies to sessions
    /// that start afterwards, and running sessions are told their new limits.
    async fn resize(memory_quota: Option<u64>, sm_percentage: Option<u32>) -> Result<RpcServerStatus, String>;
    /// Stops accepting sessions and ends running ones after `grace_seconds`, then exits.
    async fn shutdown(grace_seconds: u32);
    /// Pauses session `session_id`'s app after its current call, drains its GPU work and writes
    /// its snapshot into folder `dir` on this host. The app stays paused, the session still
    /// held here, until `release`. Fails, the app going on, when the session holds what cannot
    /// move (the reason says what) or its app makes no call within `timeout_ms`.
    async fn checkpoint(session_id: u64, dir: String, timeout_ms: u64) -> Result<SnapshotInfo, String>;
    /// `checkpoint` for a move to a server on this host (this GPU or another it reaches peer to
    /// peer): the snapshot file holds no device
    /// memory; the paused session hands its allocations over on the device (CUDA IPC handles,
    /// and descriptors of its physical memory through a socket beside the snapshot), and the
    /// restoring worker copies them GPU to GPU. Fails on a device that cannot share memory
    /// between processes (the emulated one): a file checkpoint then does.
    async fn checkpoint_on_device(session_id: u64, dir: String, timeout_ms: u64) -> Result<SnapshotInfo, String>;
    /// Restores snapshot `name` from folder `dir` into a worker that waits for its app to
    /// reconnect (`Hello::resume`); fails when the snapshot cannot live here (no room, another
    /// GPU family, an address this device cannot give back).
    async fn restore(dir: String, name: String) -> Result<(), String>;
    /// Ends a paused session's pause: with `to`, the app reconnects to that address (or, when
    /// empty, to this server again) to continue from its snapshot and the session ends here;
    /// without it, the session goes on here.
    async fn release(session_id: u64, to: Option<String>) -> Result<(), String>;
}
