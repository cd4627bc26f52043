//! The node manager's service, called by the cluster manager to start, resize and stop
//! rpc-servers.

use serde::{Deserialize, Serialize};

use super::{
    cluster::{ControlError, RestartReport, ServerReport},
    rpc_server::{SessionStatus, SnapshotInfo},
};

/// Bytes of one `snapshot_chunk` answer: well under the control plane's frame limit.
pub const SNAPSHOT_CHUNK_BYTES: u64 = 2 << 20;

/// What to start for one allocation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerSpec {
    pub allocation_id: String,
    pub gpu: u32,
    /// The allocation's other GPUs on this node, served after `gpu` by the same server.
    #[serde(default)]
    pub extra_gpus: Vec<u32>,
    /// Exact per-session device memory quota, in MiB.
    pub memory: u64,
    /// MPS active-thread percentage, 1..=100.
    pub sm_percentage: u32,
    /// The server's `--address-window` (0 to [`super::cluster::MAX_ADDRESS_WINDOW`]): each node
    /// of an allocation spread over nodes has its own, so the app sees disjoint addresses.
    #[serde(default)]
    pub address_window: u32,
}

/// An allocation's rpc-server on a node: on GPU `gpu`, or (`None`) whichever it runs (all of them
/// for a stop). An allocation has one server, and two on one node while it moves between that
/// node's GPUs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerRef {
    pub allocation_id: String,
    pub gpu: Option<u32>,
    /// The GPUs it serves after `gpu`, when they tell it apart: a move of one GPU of an
    /// allocation runs a second server on the node with the same first GPU.
    #[serde(default)]
    pub extra_gpus: Option<Vec<u32>>,
}

impl ServerRef {
    pub fn new(allocation_id: &str, gpu: Option<u32>) -> Self {
        Self { allocation_id: allocation_id.to_string(), gpu, extra_gpus: None }
    }

    /// The server of exactly GPUs `gpu` then `extra_gpus`.
    pub fn of_set(allocation_id: &str, gpu: u32, extra_gpus: &[u32]) -> Self {
        Self { allocation_id: allocation_id.to_string(), gpu: Some(gpu), extra_gpus: Some(extra_gpus.to_vec()) }
    }
}

impl std::fmt::Display for ServerRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.gpu, &self.extra_gpus) {
            (Some(gpu), Some(extra)) if !extra.is_empty() => {
                let rest: Vec<String> = extra.iter().map(u32::to_string).collect();
                write!(f, "{} (GPUs {gpu},{})", self.allocation_id, rest.join(","))
            }
            (Some(gpu), _) => write!(f, "{} (GPU {gpu})", self.allocation_id),
            (None, _) => f.write_str(&self.allocation_id),
        }
    }
}

/// A session's snapshot written on a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionSnapshot {
    /// The folder on the node holding its file.
    pub dir: String,
    pub info: SnapshotInfo,
}

/// A piece of a snapshot file, for another node manager.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotChunk {
    /// The whole file's length, so the reader knows when it has it all.
    pub total: u64,
    pub bytes: Vec<u8>,
}

/// A snapshot copied from another node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchedSnapshot {
    /// The folder on this node now holding its file.
    pub dir: String,
    pub bytes: u64,
    pub took_us: u64,
}

/// What the cluster manager may ask of a node manager.
#[tarpc::service]
pub trait NodeManagerControl {
    /// Starts the allocation's rpc-server on the spec's GPU and waits until it listens
    /// (idempotent: an already running server for the allocation on that GPU is reported as is;
    /// one on another GPU of the node keeps running beside it, for a move between them).
    async fn start_server(spec: ServerSpec) -> Result<ServerReport, ControlError>;
    /// Changes a running server's quota and/or SM share.
    async fn resize_server(allocation_id: String, memory: Option<u64>, sm_percentage: Option<u32>) -> Result<ServerReport, ControlError>;
    /// Stops a server, or every server of the allocation (idempotent: an unknown one is already
    /// stopped).
    async fn stop_server(server: ServerRef) -> Result<(), ControlError>;
    /// The servers it runs now.
    async fn list_servers() -> Vec<ServerReport>;
    /// The live sessions of an allocation's server.
    async fn list_sessions(server: ServerRef) -> Result<Vec<SessionStatus>, ControlError>;
    /// Pauses a session of an allocation's server and writes its snapshot into `dir` on this
    /// host (`None`: this node's snapshot folder for the allocation); the app stays paused until
    /// `release_session`. `on_device`: the device memory stays on the GPU for a server of this
    /// host to copy GPU to GPU (`RpcServerControl::checkpoint_on_device`).
    async fn checkpoint_session(
        server: ServerRef,
        session_id: u64,
        dir: Option<String>,
        timeout_ms: u64,
        on_device: bool,
    ) -> Result<SessionSnapshot, ControlError>;
    /// Copies snapshot `name` of an allocation from the node manager at `from` (its control
    /// address) into this node's snapshot folder for the allocation, in chunks.
    async fn fetch_snapshot(allocation_id: String, from: String, name: String) -> Result<FetchedSnapshot, ControlError>;
    /// Bytes `offset..offset + len` (at most [`SNAPSHOT_CHUNK_BYTES`]) of snapshot `name` in this
    /// node's snapshot folder for the allocation: what `fetch_snapshot` on another node reads.
    async fn snapshot_chunk(allocation_id: String, name: String, offset: u64, len: u64) -> Result<SnapshotChunk, ControlError>;
    /// Restores snapshot `name` from folder `dir` on this host into the allocation's server,
    /// where it waits for its app.
    async fn restore_snapshot(server: ServerRef, dir: String, name: String) -> Result<(), ControlError>;
    /// Ends a checkpoint's pause: the app reconnects to `to`, or goes on here without it.
    async fn release_session(server: ServerRef, session_id: u64, to: Option<String>) -> Result<(), ControlError>;
    /// Removes this node's snapshot folder for the allocation (idempotent).
    async fn discard_snapshots(allocation_id: String) -> Result<(), ControlError>;
    /// Replaces the allocation's rpc-server with a fresh process on the same addresses, its
    /// sessions checkpointed into this node's snapshot folder and continued there; when a
    /// session cannot be checkpointed, every app goes on at the old server, untouched.
    async fn restart_server(allocation_id: String, timeout_ms: u64) -> Result<RestartReport, ControlError>;
}
