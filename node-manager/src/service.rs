//! [`NodeManagerControl`], served to the cluster manager.

use std::sync::Arc;

use flyt_daemon_kit::rpc::detached;
use flyt_protocol::control::{
    cluster::{ControlError, ServerReport},
    node::{NodeManagerControl, ServerSpec},
};
use tarpc::context::Context;

use crate::servers::ServerManager;

/// The node manager's service: a handle on its servers.
#[derive(Clone)]
pub struct NodeService(pub Arc<ServerManager>);

fn cancelled() -> ControlError {
    ControlError::Invalid("the node manager is shutting down".into())
}

impl NodeManagerControl for NodeService {
    async fn start_server(self, _: Context, spec: ServerSpec) -> Result<ServerReport, ControlError> {
        // Detached: a cluster manager that gives up must not leave a half-started server.
        detached(async move { self.0.start(spec).await }).await.unwrap_or_else(|| Err(cancelled()))
    }

    async fn resize_server(
        self,
        _: Context,
        allocation_id: String,
        memory: Option<u64>,
        sm_percentage: Option<u32>,
    ) -> Result<ServerReport, ControlError> {
        detached(async move { self.0.resize(&allocation_id, memory, sm_percentage).await }).await.unwrap_or_else(|| Err(cancelled()))
    }

    async fn stop_server(self, _: Context, allocation_id: String) -> Result<(), ControlError> {
        detached(async move { self.0.stop(&allocation_id).await }).await.unwrap_or_else(|| Err(cancelled()))
    }

    async fn list_servers(self, _: Context) -> Vec<ServerReport> {
        self.0.reports().await
    }
}
