//! The control socket: the node manager that spawned this server asks for status, resizes the
//! slice, or stops the server (`flyt_protocol::control::rpc_server::RpcServerControl`), over the
//! same authenticated tarpc transport as every other control connection.

use std::sync::Arc;

use anyhow::Context;
use flyt_daemon_kit::auth::ClusterKey;
use flyt_daemon_kit::rpc::{ControlListener, Endpoint, accept_loop, serve_connection};
use flyt_protocol::control::auth::ServiceName;
use flyt_protocol::control::rpc_server::{RpcServerControl, RpcServerStatus, SnapshotInfo};
use tarpc::context::Context as CallContext;

/// What the control socket controls: the listening server (the listener implements it; this module
/// knows nothing else of it).
pub trait Controlled: Send + Sync + 'static {
    /// The slice and its sessions now.
    fn status(&self) -> RpcServerStatus;
    /// Changes the memory quota and/or SM share; the status after the change, or why not.
    fn resize(self: Arc<Self>, memory_quota: Option<u64>, sm_percentage: Option<u32>) -> Result<RpcServerStatus, String>;
    /// Pauses a session and writes its snapshot (blocks until written or refused).
    fn checkpoint(self: Arc<Self>, session_id: u64, dir: String, timeout_ms: u64, on_device: bool) -> Result<SnapshotInfo, String>;
    /// Restores a snapshot into a worker that waits for its app (blocks until restored).
    fn restore(self: Arc<Self>, dir: String, name: String) -> Result<(), String>;
    /// Ends a checkpoint's pause: the app moves to `to` or goes on here.
    fn release(self: Arc<Self>, session_id: u64, to: Option<String>) -> Result<(), String>;
}

/// Runs a blocking call of the server off the control runtime's only thread.
async fn blocking<T: Send + 'static>(call: impl FnOnce() -> Result<T, String> + Send + 'static) -> Result<T, String> {
    tokio::task::spawn_blocking(call).await.unwrap_or_else(|error| Err(format!("the call failed: {error}")))
}

#[derive(Clone)]
struct ControlHandler {
    server: Arc<dyn Controlled>,
}

impl RpcServerControl for ControlHandler {
    async fn status(self, _: CallContext) -> RpcServerStatus {
        self.server.status()
    }

    async fn resize(self, _: CallContext, memory_quota: Option<u64>, sm_percentage: Option<u32>) -> Result<RpcServerStatus, String> {
        self.server.clone().resize(memory_quota, sm_percentage)
    }

    async fn checkpoint(self, _: CallContext, session_id: u64, dir: String, timeout_ms: u64) -> Result<SnapshotInfo, String> {
        let server = self.server.clone();
        blocking(move || server.checkpoint(session_id, dir, timeout_ms, false)).await
    }

    async fn checkpoint_on_device(self, _: CallContext, session_id: u64, dir: String, timeout_ms: u64) -> Result<SnapshotInfo, String> {
        let server = self.server.clone();
        blocking(move || server.checkpoint(session_id, dir, timeout_ms, true)).await
    }

    async fn restore(self, _: CallContext, dir: String, name: String) -> Result<(), String> {
        let server = self.server.clone();
        blocking(move || server.restore(dir, name)).await
    }

    async fn release(self, _: CallContext, session_id: u64, to: Option<String>) -> Result<(), String> {
        let server = self.server.clone();
        blocking(move || server.release(session_id, to)).await
    }

    async fn shutdown(self, _: CallContext, grace_seconds: u32) {
        tracing::info!(grace_seconds, "shutdown requested on the control socket");
        // Answer first, then stop the process the way SIGTERM does.
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_secs(u64::from(grace_seconds)));
            let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGTERM);
        });
    }
}

/// Starts serving the control socket on a thread of its own; callers authenticate with the cluster
/// key in `cluster_key_file`.
pub fn start(server: Arc<dyn Controlled>, endpoint: &str, cluster_key_file: Option<&std::path::Path>) -> anyhow::Result<()> {
    let endpoint = Endpoint::parse(endpoint).map_err(|error| anyhow::anyhow!("--control: {error}"))?;
    let path = cluster_key_file.context("--control needs --cluster-key-file")?;
    let key = ClusterKey::load(path).map_err(|error| anyhow::anyhow!("{}: {error}", path.display()))?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("control runtime")?;
    let listener = runtime.block_on(ControlListener::bind(&endpoint, 0o600)).map_err(|error| anyhow::anyhow!("{error}"))?;
    std::thread::Builder::new().name("flyt-control".into()).spawn(move || {
        runtime.block_on(accept_loop(listener, key, vec![ServiceName::RpcServerControl], move |_, stream| {
            let handler = ControlHandler { server: server.clone() };
            async move { serve_connection(stream, handler.serve()).await }
        }));
    })?;
    Ok(())
}
