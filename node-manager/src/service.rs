//! [`NodeManagerControl`], served to the cluster manager.

use std::sync::Arc;

use flyt_daemon_kit::rpc::detached;
use flyt_protocol::control::{
    cluster::{ControlError, RestartReport, ServerReport},
    node::{FetchedSnapshot, NodeManagerControl, ServerRef, ServerSpec, SessionSnapshot, SnapshotChunk},
    rpc_server::SessionStatus,
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
        detached(async move {
            let name = self.0.name_of(&ServerRef::new(&allocation_id, None)).await?;
            self.0.resize(&name, memory, sm_percentage).await
        })
        .await
        .unwrap_or_else(|| Err(cancelled()))
    }

    async fn stop_server(self, _: Context, server: ServerRef) -> Result<(), ControlError> {
        detached(async move { self.0.stop_server(&server).await }).await.unwrap_or_else(|| Err(cancelled()))
    }

    async fn list_servers(self, _: Context) -> Vec<ServerReport> {
        self.0.reports().await
    }

    async fn list_sessions(self, _: Context, server: ServerRef) -> Result<Vec<SessionStatus>, ControlError> {
        self.0.sessions(&self.0.name_of(&server).await?).await
    }

    async fn checkpoint_session(
        self,
        _: Context,
        server: ServerRef,
        session_id: u64,
        dir: Option<String>,
        timeout_ms: u64,
        on_device: bool,
    ) -> Result<SessionSnapshot, ControlError> {
        // Detached: the app is paused until someone releases it; the answer must not be lost
        // to a caller that gave up waiting halfway.
        detached(async move {
            let name = self.0.name_of(&server).await?;
            let dir = match dir {
                Some(dir) => std::path::PathBuf::from(dir),
                None => self.0.snapshots().prepare(&server.allocation_id)?,
            };
            let info = self.0.checkpoint(&name, session_id, &dir, timeout_ms, on_device).await?;
            Ok(SessionSnapshot { dir: dir.display().to_string(), info })
        })
        .await
        .unwrap_or_else(|| Err(cancelled()))
    }

    async fn fetch_snapshot(self, _: Context, allocation_id: String, from: String, name: String) -> Result<FetchedSnapshot, ControlError> {
        detached(async move { self.0.snapshots().fetch(self.0.key(), &allocation_id, &from, &name).await })
            .await
            .unwrap_or_else(|| Err(cancelled()))
    }

    async fn snapshot_chunk(
        self,
        _: Context,
        allocation_id: String,
        name: String,
        offset: u64,
        len: u64,
    ) -> Result<SnapshotChunk, ControlError> {
        self.0.snapshots().chunk(&allocation_id, &name, offset, len).await
    }

    async fn restore_snapshot(self, _: Context, server: ServerRef, dir: String, name: String) -> Result<(), ControlError> {
        detached(async move { self.0.restore(&self.0.name_of(&server).await?, &dir, &name).await })
            .await
            .unwrap_or_else(|| Err(cancelled()))
    }

    async fn release_session(self, _: Context, server: ServerRef, session_id: u64, to: Option<String>) -> Result<(), ControlError> {
        detached(async move { self.0.release(&self.0.name_of(&server).await?, session_id, to).await })
            .await
            .unwrap_or_else(|| Err(cancelled()))
    }

    async fn discard_snapshots(self, _: Context, allocation_id: String) -> Result<(), ControlError> {
        self.0.snapshots().discard(&allocation_id)
    }

    async fn restart_server(self, _: Context, allocation_id: String, timeout_ms: u64) -> Result<RestartReport, ControlError> {
        // Detached: apps are paused and released along the way; a caller that gives up must
        // not leave them without a server.
        detached(async move { self.0.restart(&self.0.name_of(&ServerRef::new(&allocation_id, None)).await?, timeout_ms).await })
            .await
            .unwrap_or_else(|| Err(cancelled()))
    }
}
