//! The node's lease: register with the cluster manager, then heartbeat; reconnect and register
//! again whenever the connection or the cluster manager's memory of this node is lost.

use std::{sync::Arc, time::Duration};

use flyt_daemon_kit::{
    auth::ClusterKey,
    rpc::{self, Endpoint},
};
use flyt_protocol::control::{
    auth::ServiceName,
    cluster::{ClusterNodeClient, GpuInfo, NodeHeartbeat, NodeHeartbeatReply, NodeRegistration},
    node::ServerRef,
};

use crate::servers::ServerManager;

/// Who this node is.
#[derive(Clone, Debug)]
pub struct NodeIdentity {
    pub node_id: String,
    pub host_ip: String,
    pub boot_id: String,
    pub control_address: String,
    pub gpus: Vec<GpuInfo>,
}

/// Longest wait between two connection attempts: a cluster manager back from a restart or a
/// stall hears from this node well within its node timeout.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

fn stop_in_background(servers: &Arc<ServerManager>, stop: Vec<ServerRef>) {
    for server in stop {
        let servers = servers.clone();
        tracing::info!(server = %server, "no allocation of the cluster runs this server: stopping it");
        tokio::spawn(async move { servers.stop_server(&server).await });
    }
}

/// Keeps the node registered for as long as the process runs.
pub async fn run(cluster: Endpoint, key: ClusterKey, identity: NodeIdentity, servers: Arc<ServerManager>) {
    let mut backoff = Duration::from_millis(100);
    let mut reported_unreachable = false;
    loop {
        let stream = match rpc::connect(&cluster, &key, ServiceName::ClusterNode).await {
            Ok(stream) => stream,
            Err(error) => {
                if !reported_unreachable {
                    tracing::warn!(
                        "cannot reach the cluster manager at {cluster}: {error}; retrying every {MAX_BACKOFF:?} (running servers keep serving)"
                    );
                    reported_unreachable = true;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        reported_unreachable = false;
        backoff = Duration::from_millis(100);
        let client = ClusterNodeClient::new(tarpc::client::Config::default(), rpc::transport(stream)).spawn();
        'registered: loop {
            let registration = NodeRegistration {
                node_id: identity.node_id.clone(),
                host_ip: identity.host_ip.clone(),
                boot_id: identity.boot_id.clone(),
                control_address: identity.control_address.clone(),
                gpus: identity.gpus.clone(),
                servers: servers.reports().await,
            };
            let reply = match client.register(rpc::deadline(Duration::from_secs(10)), registration).await {
                Ok(Ok(reply)) => reply,
                Ok(Err(error)) => {
                    tracing::error!("the cluster manager at {cluster} refused the registration: {error}");
                    tokio::time::sleep(MAX_BACKOFF).await;
                    break 'registered;
                }
                Err(error) => {
                    tracing::warn!("registration with the cluster manager at {cluster} failed ({error}); reconnecting");
                    break 'registered;
                }
            };
            tracing::info!(cluster_manager = %cluster, gpus = identity.gpus.len(), "registered");
            stop_in_background(&servers, reply.stop);
            let interval = Duration::from_millis(reply.heartbeat_interval_ms.clamp(100, 60_000));
            loop {
                tokio::time::sleep(interval).await;
                let heartbeat = NodeHeartbeat {
                    node_id: identity.node_id.clone(),
                    boot_id: identity.boot_id.clone(),
                    servers: servers.reports().await,
                };
                // A heartbeat later than two intervals is as good as lost.
                match client.heartbeat(rpc::deadline((interval * 2).max(Duration::from_secs(2))), heartbeat).await {
                    Ok(Ok(NodeHeartbeatReply::Ok { stop })) => stop_in_background(&servers, stop),
                    Ok(Ok(NodeHeartbeatReply::RegisterAgain)) => {
                        tracing::info!("the cluster manager at {cluster} asks this node to register again");
                        continue 'registered;
                    }
                    Ok(Err(error)) => tracing::warn!("the cluster manager at {cluster} refused a heartbeat: {error}"),
                    Err(error) => {
                        tracing::warn!("no answer to a heartbeat from the cluster manager at {cluster} ({error}); reconnecting");
                        break 'registered;
                    }
                }
            }
        }
    }
}
