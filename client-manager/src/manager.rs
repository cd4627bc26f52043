//! The client manager's work: answer locate requests, track client processes, hold the lease.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use flyt_daemon_kit::{
    auth::ClusterKey,
    host::{process_alive, process_start_time},
    rpc::{self, Endpoint},
};
use flyt_protocol::{
    control::{
        auth::ServiceName,
        cluster::{AllocateRequest, AllocationClients, ClientManagerReport, ClusterClientClient, Grant},
    },
    frame::{FrameHeader, FrameLimits, HEADER_LEN, decode_exact, write_value},
    handshake::ClientIdentity,
    locate::{LocateReply, LocateRequest},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::UnixStream,
    sync::Mutex,
};

use crate::config::ClientManagerConfig;

/// A locate request is a few hundred bytes; anything near this is not a shim.
const LOCATE_LIMITS: FrameLimits = FrameLimits { max_message: 64 * 1024, max_bulk: 0 };
/// How long a connected app has to send its request.
const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// One app process using an allocation.
#[derive(Clone, Debug)]
struct TrackedClient {
    identity: ClientIdentity,
    start_time: Option<u64>,
}

/// The client manager.
pub struct ClientManager {
    config: ClientManagerConfig,
    cluster: Endpoint,
    key: ClusterKey,
    connection: Mutex<Option<ClusterClientClient>>,
    /// Clients per allocation id.
    clients: Mutex<BTreeMap<String, Vec<TrackedClient>>>,
}

impl ClientManager {
    pub fn new(config: ClientManagerConfig, cluster: Endpoint, key: ClusterKey) -> Arc<Self> {
        Arc::new(Self { config, cluster, key, connection: Mutex::new(None), clients: Mutex::new(BTreeMap::new()) })
    }

    async fn cluster_client(&self) -> Result<ClusterClientClient, String> {
        let mut connection = self.connection.lock().await;
        if let Some(client) = connection.as_ref() {
            return Ok(client.clone());
        }
        let stream = rpc::connect(&self.cluster, &self.key, ServiceName::ClusterClient).await.map_err(|error| error.to_string())?;
        let client = ClusterClientClient::new(tarpc::client::Config::default(), rpc::transport(stream)).spawn();
        *connection = Some(client.clone());
        Ok(client)
    }

    async fn drop_connection(&self) {
        *self.connection.lock().await = None;
    }

    /// Asks the cluster manager for this VM's slice on behalf of `client`.
    async fn allocate(&self, client: ClientIdentity) -> Result<Grant, String> {
        let request = AllocateRequest { vm_ip: self.config.vm_ip.clone(), client };
        let deadline = rpc::deadline(Duration::from_secs(self.config.request_timeout_seconds));
        let unreachable = |reason: String| {
            format!("cannot reach the Flyt cluster manager at {}: {reason}; is flyt-cluster-manager running?", self.cluster)
        };
        let client = self.cluster_client().await.map_err(unreachable)?;
        match client.allocate(deadline, request).await {
            Ok(Ok(grant)) => Ok(grant),
            Ok(Err(error)) => Err(error.to_string()),
            Err(error) => {
                self.drop_connection().await;
                Err(unreachable(error.to_string()))
            }
        }
    }

    /// Serves one app connection: one request, one reply.
    pub async fn serve_app(self: Arc<Self>, mut stream: UnixStream) {
        let credentials = stream.peer_cred().ok();
        let uid = credentials.map(|credentials| credentials.uid());
        let peer_pid = credentials.and_then(|credentials| credentials.pid()).and_then(|pid| u32::try_from(pid).ok());
        let request = match tokio::time::timeout(REQUEST_READ_TIMEOUT, read_request(&mut stream)).await {
            Ok(Ok(request)) => request,
            Ok(Err(reason)) => {
                tracing::warn!(?uid, ?peer_pid, %reason, "bad locate request; closing");
                return;
            }
            Err(_) => {
                tracing::warn!(?uid, ?peer_pid, "no locate request within the timeout; closing");
                return;
            }
        };
        let reply = self.answer(request, uid, peer_pid).await;
        let mut bytes = Vec::new();
        if write_value(&mut bytes, 0, &reply).is_ok() {
            let _ = stream.write_all(&bytes).await;
            let _ = stream.shutdown().await;
        }
    }

    async fn answer(&self, request: LocateRequest, uid: Option<u32>, peer_pid: Option<u32>) -> LocateReply {
        if !self.config.allowed_uids.is_empty() && !uid.is_some_and(|uid| self.config.allowed_uids.contains(&uid)) {
            tracing::warn!(?uid, "locate refused: uid not in allowed_uids");
            return LocateReply::Refused {
                reason: format!("user {uid:?} may not use Flyt GPUs on this host: ask the admin to add it to allowed_uids"),
            };
        }
        let mut identity = request.client;
        // The kernel's word, not the app's: the pid is what gets watched, and what the token is for.
        if let Some(pid) = peer_pid {
            if identity.pid != pid {
                tracing::debug!(claimed = identity.pid, actual = pid, "locate request with a different pid; using the kernel's");
            }
            identity.pid = pid;
        }
        match self.allocate(identity.clone()).await {
            Ok(grant) => {
                tracing::info!(pid = identity.pid, program = %identity.program, allocation = %grant.allocation_id, address = %grant.address, "client placed");
                self.track(&grant.allocation_id, identity).await;
                LocateReply::Server { address: grant.address, token: grant.token, same_host: grant.same_host }
            }
            Err(reason) => {
                tracing::warn!(pid = identity.pid, %reason, "client refused");
                LocateReply::Refused { reason }
            }
        }
    }

    async fn track(&self, allocation_id: &str, identity: ClientIdentity) {
        let start_time = process_start_time(identity.pid);
        let mut clients = self.clients.lock().await;
        let list = clients.entry(allocation_id.to_string()).or_default();
        if !list.iter().any(|known| known.identity.pid == identity.pid && known.start_time == start_time) {
            list.push(TrackedClient { identity, start_time });
        }
    }

    /// Drops clients whose process exited; true when any did.
    async fn prune_exited(&self) -> bool {
        let mut clients = self.clients.lock().await;
        let mut changed = false;
        for (allocation, list) in clients.iter_mut() {
            list.retain(|client| {
                let alive = process_alive(client.identity.pid, client.start_time);
                if !alive {
                    tracing::info!(pid = client.identity.pid, program = %client.identity.program, %allocation, "client exited");
                    changed = true;
                }
                alive
            });
        }
        changed
    }

    async fn report(&self) -> ClientManagerReport {
        let clients = self.clients.lock().await;
        ClientManagerReport {
            vm_ip: self.config.vm_ip.clone(),
            allocations: clients
                .iter()
                .map(|(id, list)| AllocationClients {
                    allocation_id: id.clone(),
                    clients: list.iter().map(|client| client.identity.clone()).collect(),
                })
                .collect(),
        }
    }

    /// Watches client processes and renews the lease, for as long as the process runs.
    pub async fn keep_lease(self: Arc<Self>) {
        let check = Duration::from_millis(self.config.client_check_ms.clamp(20, 10_000));
        let mut interval = Duration::from_secs(1);
        let mut last_heartbeat: Option<Instant> = None;
        let mut reported_unreachable = false;
        loop {
            tokio::time::sleep(check).await;
            let exited = self.prune_exited().await;
            if !exited && last_heartbeat.is_some_and(|last| last.elapsed() < interval) {
                continue;
            }
            last_heartbeat = Some(Instant::now());
            let report = self.report().await;
            let client = match self.cluster_client().await {
                Ok(client) => client,
                Err(reason) => {
                    if !reported_unreachable {
                        tracing::warn!(%reason, cluster_manager = %self.cluster, "cannot reach the cluster manager; retrying");
                        reported_unreachable = true;
                    }
                    continue;
                }
            };
            match client.heartbeat(rpc::deadline((interval * 2).max(Duration::from_secs(2))), report).await {
                Ok(Ok(reply)) => {
                    reported_unreachable = false;
                    interval = Duration::from_millis(reply.heartbeat_interval_ms.clamp(100, 60_000));
                    if !reply.gone.is_empty() {
                        let mut clients = self.clients.lock().await;
                        for id in &reply.gone {
                            tracing::info!(allocation = %id, "the cluster released this allocation");
                            clients.remove(id);
                        }
                    }
                }
                Ok(Err(error)) => tracing::warn!(%error, "heartbeat refused"),
                Err(error) => {
                    tracing::warn!(%error, "heartbeat failed; reconnecting");
                    self.drop_connection().await;
                }
            }
        }
    }
}

async fn read_request(stream: &mut UnixStream) -> Result<LocateRequest, String> {
    let mut header = [0u8; HEADER_LEN];
    stream.read_exact(&mut header).await.map_err(|error| error.to_string())?;
    let header = FrameHeader::decode(&header, &LOCATE_LIMITS).map_err(|error| error.to_string())?;
    let mut message = vec![0u8; header.message_len as usize];
    stream.read_exact(&mut message).await.map_err(|error| error.to_string())?;
    decode_exact(&message).map_err(|error| error.to_string())
}
