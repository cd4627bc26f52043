//! The client manager's work: answer locate requests, track client processes, hold the lease.
//!
//! Apps ride out a cluster manager that is away (a restart, a crash): a request for the VM's
//! allocation it already knows is answered from memory when the cluster manager cannot be
//! reached within [`KNOWN_ALLOCATION_WAIT`] (the rpc-server checks tokens offline, and this
//! host holds the cluster key that signs them); a request that needs a new placement waits for
//! the cluster manager to come back, up to `request_timeout_seconds`, saying so in the log. A
//! cluster manager that is connected but slow (a server start, a stall) is waited for.

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use flyt_daemon_kit::{
    auth::ClusterKey,
    host::{process_alive, process_start_time, unix_now},
    rpc::{self, Endpoint},
};
use flyt_protocol::{
    control::{
        auth::ServiceName,
        cluster::{AllocateRequest, AllocationClients, ClientManagerReport, ClusterClientClient, Grant, VmMode},
    },
    frame::{FrameHeader, FrameLimits, HEADER_LEN, decode_exact, write_value},
    handshake::ClientIdentity,
    locate::{LocateReply, LocateRequest},
    token::{self, SessionClaims},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::UnixStream,
    sync::Mutex,
};

use crate::config::ClientManagerConfig;

mod jobs;

/// A locate request is a few hundred bytes; anything near this is not a shim.
const LOCATE_LIMITS: FrameLimits = FrameLimits { max_message: 64 * 1024, max_bulk: 0 };
/// How long a connected app has to send its request.
const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a request for a known allocation tries to reach the cluster manager before it is
/// answered from memory.
pub const KNOWN_ALLOCATION_WAIT: Duration = Duration::from_secs(2);
/// First and longest pause between attempts to reach a cluster manager that is away.
const RETRY_PAUSE: Duration = Duration::from_millis(200);
const RETRY_PAUSE_MAX: Duration = Duration::from_secs(1);
/// A remembered token with less life left than this is replaced by a fresh one.
const TOKEN_MARGIN_SECONDS: u64 = 60;

/// The VM's allocation as the cluster manager last granted it.
#[derive(Clone, Debug)]
struct KnownGrant {
    grant: Grant,
    /// Unix seconds when it came (its token's lifetime is `token_expires_at - received_at`).
    received_at: u64,
}

/// Why asking the cluster manager gave no grant.
enum AskError {
    /// It did not answer (down, restarting, stalled): worth waiting for.
    Unreachable(String),
    /// It answered no; the reason is for the app.
    Refused(String),
}

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
    /// The VM's allocation, served from memory while the cluster manager is away.
    known: Mutex<Option<KnownGrant>>,
    /// Apps' requests answered: with a grant from the cluster manager, with the remembered
    /// grant while it was away, and refused.
    pub granted: AtomicU64,
    pub granted_from_memory: AtomicU64,
    pub refused: AtomicU64,
    /// Batch jobs' allocations on this node (the job socket).
    jobs: jobs::Jobs,
}

impl ClientManager {
    pub fn new(config: ClientManagerConfig, cluster: Endpoint, key: ClusterKey) -> Arc<Self> {
        Arc::new(Self {
            config,
            cluster,
            key,
            connection: Mutex::new(None),
            clients: Mutex::new(BTreeMap::new()),
            known: Mutex::new(None),
            granted: AtomicU64::new(0),
            granted_from_memory: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            jobs: jobs::Jobs::default(),
        })
    }

    /// The connection to the cluster manager (made when there is none), and whether it is new.
    async fn cluster_client(&self, limit: Duration) -> Result<(ClusterClientClient, bool), String> {
        let mut connection = self.connection.lock().await;
        if let Some(client) = connection.as_ref() {
            return Ok((client.clone(), false));
        }
        let limit = limit.min(rpc::CONNECT_TIMEOUT);
        let stream =
            rpc::connect_within(&self.cluster, &self.key, ServiceName::ClusterClient, limit).await.map_err(|error| error.to_string())?;
        let client = ClusterClientClient::new(tarpc::client::Config::default(), rpc::transport(stream)).spawn();
        *connection = Some(client.clone());
        Ok((client, true))
    }

    async fn drop_connection(&self) {
        *self.connection.lock().await = None;
    }

    /// One request to the cluster manager: connecting (and proving the key) within
    /// `connect_limit`, then waiting for the answer until `deadline`. Only a cluster manager
    /// that cannot be reached (connection refused, reset or not completed in time) is
    /// `Unreachable`; one that is merely slow (a server start) is waited for.
    async fn ask(&self, client: &ClientIdentity, connect_limit: Duration, deadline: Instant) -> Result<Grant, AskError> {
        let request = AllocateRequest { vm_ip: self.config.vm_ip.clone(), client: client.clone() };
        loop {
            let (connection, fresh) = match tokio::time::timeout(connect_limit, self.cluster_client(connect_limit)).await {
                Ok(Ok(connection)) => connection,
                Ok(Err(reason)) => return Err(AskError::Unreachable(reason)),
                Err(_) => return Err(AskError::Unreachable(format!("no connection within {:.1} s", connect_limit.as_secs_f64()))),
            };
            let mut context = tarpc::context::current();
            context.deadline = deadline;
            return match connection.allocate(context, request.clone()).await {
                Ok(Ok(grant)) => Ok(grant),
                Ok(Err(error)) => Err(AskError::Refused(error.to_string())),
                Err(tarpc::client::RpcError::DeadlineExceeded) => Err(AskError::Refused(format!(
                    "the cluster manager at {} did not place this app within {} s (request_timeout_seconds)",
                    self.cluster, self.config.request_timeout_seconds
                ))),
                Err(error) => {
                    self.drop_connection().await;
                    // A connection that outlived a restart of the cluster manager fails at
                    // once: only a new one says whether the cluster manager is there.
                    if !fresh {
                        continue;
                    }
                    Err(AskError::Unreachable(error.to_string()))
                }
            };
        }
    }

    /// Asks the cluster manager for this VM's slice on behalf of `client`. While it cannot be
    /// reached, a known allocation is served from memory and a new one is waited for, up to
    /// `request_timeout_seconds`.
    async fn allocate(&self, client: ClientIdentity) -> Result<Grant, String> {
        let timeout = Duration::from_secs(self.config.request_timeout_seconds);
        let deadline = Instant::now() + timeout;
        let known = self.known.lock().await.clone();
        let mut pause = RETRY_PAUSE;
        let mut waiting_since: Option<Instant> = None;
        loop {
            let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
            let connect_limit = if known.is_some() { KNOWN_ALLOCATION_WAIT.min(left) } else { left.min(rpc::CONNECT_TIMEOUT) };
            let reason = match self.ask(&client, connect_limit, deadline).await {
                Ok(grant) => {
                    if let Some(since) = waiting_since {
                        tracing::info!(
                            pid = client.pid,
                            "the cluster manager at {} is back after {:.1} s",
                            self.cluster,
                            since.elapsed().as_secs_f64()
                        );
                    }
                    *self.known.lock().await = Some(KnownGrant { grant: grant.clone(), received_at: unix_now() });
                    return Ok(grant);
                }
                Err(AskError::Refused(reason)) => return Err(reason),
                Err(AskError::Unreachable(reason)) => reason,
            };
            if let Some(known) = &known {
                return self.grant_from_memory(known, &reason);
            }
            if Instant::now() + pause >= deadline {
                return Err(format!(
                    "the Flyt cluster manager at {} could not be reached for {} s ({reason}): is flyt-cluster-manager running? (the wait is the client manager's request_timeout_seconds)",
                    self.cluster, self.config.request_timeout_seconds
                ));
            }
            if waiting_since.is_none() {
                waiting_since = Some(Instant::now());
                tracing::warn!(
                    pid = client.pid,
                    program = %client.program,
                    "the cluster manager at {} cannot be reached ({reason}); this app waits up to {} s for it to come back and place it",
                    self.cluster,
                    self.config.request_timeout_seconds
                );
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(RETRY_PAUSE_MAX);
        }
    }

    /// The known allocation, with a fresh token when the remembered one is close to expiry.
    fn grant_from_memory(&self, known: &KnownGrant, reason: &str) -> Result<Grant, String> {
        self.granted_from_memory.fetch_add(1, Ordering::Relaxed);
        let now = unix_now();
        let mut grant = known.grant.clone();
        if grant.token_expires_at < now + TOKEN_MARGIN_SECONDS {
            let lifetime = known.grant.token_expires_at.saturating_sub(known.received_at).max(TOKEN_MARGIN_SECONDS);
            let claims = SessionClaims { allocation: grant.allocation_id.clone(), expires_at: now + lifetime };
            grant.token = token::issue(self.key.as_bytes(), &claims).map_err(|error| error.to_string())?;
            grant.token_expires_at = claims.expires_at;
        }
        tracing::warn!(
            allocation = %grant.allocation_id,
            address = %grant.address,
            "the cluster manager at {} does not answer ({reason}); serving this VM's allocation from memory",
            self.cluster
        );
        Ok(grant)
    }

    /// Serves one app connection: one request, one reply.
    pub async fn serve_app(self: Arc<Self>, stream: UnixStream) {
        serve_one_request(stream, &LOCATE_LIMITS, "locate", |request, uid, peer_pid| self.answer(request, uid, peer_pid)).await;
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
        let answer = self.allocate(identity.clone()).await;
        let counter = if answer.is_ok() { &self.granted } else { &self.refused };
        counter.fetch_add(1, Ordering::Relaxed);
        match answer {
            Ok(grant) => {
                tracing::info!(pid = identity.pid, program = %identity.program, allocation = %grant.allocation_id, address = %grant.address, "client placed");
                self.track(&grant.allocation_id, identity).await;
                LocateReply::Server {
                    address: grant.address,
                    token: grant.token,
                    same_host: grant.same_host,
                    ivshmem: grant.mode == VmMode::SharedMemory,
                    tls_ca: self.config.tls.ca_file.clone(),
                }
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

    /// The exposition text of this client manager's metrics.
    pub async fn metrics(&self) -> String {
        use flyt_daemon_kit::metrics::{Registry, Series};
        let vm = || ("vm", self.config.vm_ip.clone());
        let apps = Series::Gauges(
            self.clients
                .lock()
                .await
                .iter()
                .map(|(allocation, list)| (vec![vm(), ("allocation", allocation.clone())], i64::try_from(list.len()).unwrap_or(i64::MAX)))
                .collect(),
        );
        let connected = self.connection.lock().await.is_some();
        let answers = Series::Counters(
            [("granted", &self.granted), ("granted_from_memory", &self.granted_from_memory), ("refused", &self.refused)]
                .into_iter()
                .map(|(outcome, counter)| (vec![vm(), ("outcome", outcome.to_string())], counter.load(Ordering::Relaxed)))
                .collect(),
        );
        let mut registry = Registry::with_prefix("flyt_client");
        registry.register("apps", "App processes using each allocation", apps);
        registry.register(
            "locates",
            "Apps' requests for a GPU, by outcome (granted_from_memory: while the cluster manager was away)",
            answers,
        );
        registry.register(
            "cluster_connected",
            "Whether a connection to the cluster manager is open (1) or not (0)",
            Series::gauge(vec![vm()], u64::from(connected)),
        );
        flyt_daemon_kit::metrics::encode(&registry)
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
            let limit = (interval * 2).max(Duration::from_secs(2));
            let client = match self.cluster_client(limit).await {
                Ok((client, _)) => client,
                Err(reason) => {
                    if !reported_unreachable {
                        tracing::warn!(
                            "cannot reach the cluster manager at {}: {reason}; retrying (apps keep their GPUs, and the VM's allocation is served from memory)",
                            self.cluster
                        );
                        reported_unreachable = true;
                    }
                    continue;
                }
            };
            match client.heartbeat(rpc::deadline(limit), report).await {
                Ok(Ok(reply)) => {
                    if reported_unreachable {
                        tracing::info!("the cluster manager at {} answers again", self.cluster);
                    }
                    reported_unreachable = false;
                    interval = Duration::from_millis(reply.heartbeat_interval_ms.clamp(100, 60_000));
                    if !reply.gone.is_empty() {
                        let mut clients = self.clients.lock().await;
                        let mut known = self.known.lock().await;
                        for id in &reply.gone {
                            tracing::info!(allocation = %id, "the cluster released this allocation");
                            clients.remove(id);
                            if known.as_ref().is_some_and(|known| &known.grant.allocation_id == id) {
                                *known = None;
                            }
                        }
                    }
                }
                Ok(Err(error)) => tracing::warn!("the cluster manager at {} refused a heartbeat: {error}", self.cluster),
                Err(error) => {
                    if !reported_unreachable {
                        tracing::warn!("no answer to a heartbeat from the cluster manager at {} ({error}); reconnecting", self.cluster);
                        reported_unreachable = true;
                    }
                    self.drop_connection().await;
                }
            }
            self.job_heartbeats(&client, limit).await;
        }
    }
}

/// Serves one connection of a local socket (the apps' or the jobs'): one framed request of
/// `limits`, read within `REQUEST_READ_TIMEOUT` (the request first, so a refused caller reads
/// the reason), `answer(request, uid, pid)` of the caller's credentials, one reply. `what` names
/// the request in the log.
async fn serve_one_request<Request, Reply, Answered>(
    mut stream: UnixStream,
    limits: &FrameLimits,
    what: &str,
    answer: impl FnOnce(Request, Option<u32>, Option<u32>) -> Answered,
) where
    Request: serde::de::DeserializeOwned,
    Reply: serde::Serialize,
    Answered: Future<Output = Reply>,
{
    let credentials = stream.peer_cred().ok();
    let uid = credentials.map(|credentials| credentials.uid());
    let peer_pid = credentials.and_then(|credentials| credentials.pid()).and_then(|pid| u32::try_from(pid).ok());
    let request = match tokio::time::timeout(REQUEST_READ_TIMEOUT, read_request(&mut stream, limits)).await {
        Ok(Ok(request)) => request,
        Ok(Err(reason)) => {
            tracing::warn!(?uid, ?peer_pid, %reason, "bad {what} request; closing");
            return;
        }
        Err(_) => {
            tracing::warn!(?uid, ?peer_pid, "no {what} request within the timeout; closing");
            return;
        }
    };
    let reply = answer(request, uid, peer_pid).await;
    let mut bytes = Vec::new();
    if write_value(&mut bytes, 0, &reply).is_ok() {
        let _ = stream.write_all(&bytes).await;
        let _ = stream.shutdown().await;
    }
}

async fn read_request<Request: serde::de::DeserializeOwned>(stream: &mut UnixStream, limits: &FrameLimits) -> Result<Request, String> {
    let mut header = [0u8; HEADER_LEN];
    stream.read_exact(&mut header).await.map_err(|error| error.to_string())?;
    let header = FrameHeader::decode(&header, limits).map_err(|error| error.to_string())?;
    let mut message = vec![0u8; header.message_len as usize];
    stream.read_exact(&mut message).await.map_err(|error| error.to_string())?;
    decode_exact(&message).map_err(|error| error.to_string())
}
