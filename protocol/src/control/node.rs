//! The node manager's service, called by the cluster manager to start, resize and stop
//! rpc-servers.

use serde::{Deserialize, Serialize};

use super::cluster::{ControlError, ServerReport};

/// What to start for one allocation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerSpec {
    pub allocation_id: String,
    pub gpu: u32,
    /// Exact per-session device memory quota, in MiB.
    pub memory: u64,
    /// MPS active-thread percentage, 1..=100.
    pub sm_percentage: u32,
}

/// What the cluster manager may ask of a node manager.
#[tarpc::service]
pub trait NodeManagerControl {
    /// Starts the allocation's rpc-server and waits until it listens (idempotent: an already
    /// running server for the allocation is reported as is).
    async fn start_server(spec: ServerSpec) -> Result<ServerReport, ControlError>;
    /// Changes a running server's quota and/or SM share.
    async fn resize_server(allocation_id: String, memory: Option<u64>, sm_percentage: Option<u32>) -> Result<ServerReport, ControlError>;
    /// Stops a server (idempotent: an unknown allocation is already stopped).
    async fn stop_server(allocation_id: String) -> Result<(), ControlError>;
    /// The servers it runs now.
    async fn list_servers() -> Vec<ServerReport>;
}
