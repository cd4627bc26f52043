//! The rpc-server's control socket (Unix, owner-only), used by the node manager that spawned it.

use serde::{Deserialize, Serialize};

use crate::handshake::ClientIdentity;

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
}
