//! The cluster manager's services: [`ClusterNode`], [`ClusterClient`] and [`ClusterAdmin`],
//! all on one [`Cluster`], plus the lease reaper.
//!
//! Every state change is written to the store while the model lock is held, so the store sees
//! changes in the model's order. Node manager calls (seconds long) happen outside the lock.
//! Handlers that change state run detached ([`flyt_daemon_kit::rpc::detached`]): a caller that
//! gives up does not leave a change half made.
//!
//! # Crash safety
//!
//! Placement, resize and release are small state machines whose every state is stored before
//! the side effect it leads to, and whose every side effect is idempotent on the node manager
//! (start reports a server it already runs, resize sets absolute values, stop of an unknown
//! server succeeds). A cluster manager killed between any two steps finds the step in its
//! store after the restart, and the node's reports drive it on:
//!
//! | stored | the node reports the server | the node does not |
//! | --- | --- | --- |
//! | `Starting` | adopted: `Running` with its address | started again (idempotent), or released when the node refuses |
//! | `Running` + `pending_resize` | resized again, then committed | released after two reports without it |
//! | `Running`, size differs from the server's | the server is resized back to the stored size | |
//! | `Running` + `pending_move` `Copying` | rolled back: paused apps go on at the source, the target's server is stopped | |
//! | `Running` + `pending_move` `Switching` | finished: paused apps are sent to the target, the source's server is stopped | |
//! | nothing (released, or never stored) | told to stop | |
//!
//! All steps on one VM's allocation hold that VM's lock; a node report never changes an
//! allocation whose VM lock is held (a step is under way) and schedules the missing steps
//! ([`Cluster::settle_in_background`]) for the others.
//!
//! # Liveness
//!
//! A node silent for `node_timeout_ms` is marked down; its allocations are released only
//! `node_grace_seconds` later, so a node manager that restarts in time adopts its servers and
//! their apps carry on. The reaper notices when this process itself did not run for a while
//! (SIGSTOP, a paused VM, a starved host: a jump of the monotonic clock between its ticks) and
//! then restarts every lease instead of blaming the nodes for its own silence.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    sync::{Arc, Mutex as StdMutex},
    time::{Duration, Instant},
};

use flyt_daemon_kit::{
    auth::{ClusterKey, random_nonce},
    failpoint,
    host::unix_now,
    rpc::{self, Endpoint, detached},
};
use flyt_protocol::handshake::ClientIdentity;
use flyt_protocol::{
    control::{
        auth::ServiceName,
        cluster::{
            AfterCheckpoint, AllocateRequest, AllocationRecord, AllocationState, CheckpointReport, ClientHeartbeatReply,
            ClientManagerReport, ClusterAdmin, ClusterClient, ClusterNode, ClusterStatus, ControlError, Grant, JobAllocateRequest,
            JobGrant, MoveReport, NodeHealth, NodeHeartbeat, NodeHeartbeatReply, NodeRecord, NodeRegistration, NodeView, RegisterReply,
            RestartReport, ServerReport, SliceSize, VmRequirement, VmView,
        },
        node::{NodeManagerControlClient, ServerRef, ServerSpec},
    },
    token::{self, SessionClaims},
};
use tarpc::context::Context;
use tokio::sync::Mutex;

use crate::{
    config::ClusterManagerConfig,
    metrics::{AllocatedGpuUse, ClusterMetrics, GpuUse, Snapshot},
    model::{Model, NodeEntry, Part, add_client, data_address, refresh_idle, sm_percentage},
    store::Store,
};

mod jobs;
mod moves;

/// Node reports in a row that must lack a running allocation's server before it is released.
const MISSING_REPORTS_BEFORE_RELEASE: u32 = 2;
/// Deadline of calls to node managers other than starting a server.
const NODE_CALL_TIMEOUT: Duration = Duration::from_secs(15);
/// A gap this long between two lease checks means this process was not running (stopped,
/// paused or starved): leases restart instead of expiring.
pub const STALL_THRESHOLD: Duration = Duration::from_secs(1);
const MIB: u64 = 1 << 20;

/// The cluster manager: model, store and connections to node managers.
pub struct Cluster<S> {
    model: Mutex<Model>,
    store: S,
    key: ClusterKey,
    config: ClusterManagerConfig,
    started: Instant,
    /// One lock per VM, held by every step on the VM's allocation, so two requests from one VM
    /// never start two servers and node reports never change an allocation mid-step.
    vm_locks: StdMutex<HashMap<String, Arc<Mutex<()>>>>,
    /// Allocations with a background step scheduled (one at a time each).
    scheduled: StdMutex<HashSet<String>>,
    /// Per allocation, the pid of the rpc-server a restart replaced, until a node report names
    /// the new one: a report the node made before the restart may arrive after it, and must not
    /// put the old server back.
    replaced_pids: StdMutex<HashMap<String, u32>>,
    node_clients: Mutex<HashMap<String, (String, NodeManagerControlClient)>>,
    metrics: Arc<ClusterMetrics>,
}

/// A handle that serves the three services.
pub struct ClusterService<S>(pub Arc<Cluster<S>>);

impl<S> Clone for ClusterService<S> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<S: Store> ClusterService<S> {
    /// A move of a whole allocation (`index` `None`) or of one of its GPUs, detached from the
    /// caller, counted done or refused.
    async fn counted_move(
        &self,
        target: String,
        to_node: String,
        to_gpu: Option<u32>,
        index: Option<u32>,
        timeout_ms: u64,
    ) -> Result<MoveReport, ControlError> {
        let moved = detached(self.0.clone().migrate(target, to_node, to_gpu, index, timeout_ms)).await.unwrap_or_else(|| Err(cancelled()));
        let metrics = &self.0.metrics;
        ClusterMetrics::count(if moved.is_ok() { &metrics.moves_done } else { &metrics.moves_refused });
        moved
    }
}

fn store_error(error: crate::store::StoreError) -> ControlError {
    ControlError::Store(error.to_string())
}

fn new_allocation_id() -> String {
    let nonce = random_nonce().unwrap_or_else(|_| {
        let mut fallback = [0u8; 32];
        fallback[..8].copy_from_slice(&unix_now().to_le_bytes());
        fallback
    });
    let suffix: String = nonce[..5].iter().map(|byte| format!("{byte:02x}")).collect();
    format!("alloc-{suffix}")
}

/// What a step does when the node manager cannot be reached.
/// A placement whose node does not answer is asked again after this, then twice as long each
/// time up to `PLACEMENT_RETRY_MAX`.
const PLACEMENT_RETRY_FIRST: Duration = Duration::from_millis(100);
const PLACEMENT_RETRY_MAX: Duration = Duration::from_secs(1);
/// The app's answer leaves this long before its request's deadline, so it arrives in time.
const PLACEMENT_ANSWER_MARGIN: Duration = Duration::from_millis(500);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WhenUnreachable {
    /// An app (or admin) waits: give up now, releasing a placement that never started.
    GiveUp,
    /// A background step: leave the stored state; the node's next report schedules it again.
    Retry,
}

/// A step a node report found missing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Finish a start or a resize left under way.
    Settle,
    /// The server's slice differs from the stored one: set it back.
    Repair,
}

/// An allocation with no step left under way.
fn settled(allocation: &AllocationRecord) -> bool {
    allocation.state == AllocationState::Running && allocation.pending_resize.is_none() && allocation.pending_move.is_none()
}

/// What each node of `allocation` starts for it, its first node first: one server per node, a
/// spread allocation's further nodes each in its own address window.
fn server_specs(allocation: &AllocationRecord) -> Vec<(String, ServerSpec)> {
    let first = ServerSpec {
        allocation_id: allocation.id.clone(),
        gpu: allocation.gpu,
        extra_gpus: allocation.extra_gpus.clone(),
        memory: allocation.memory,
        sm_percentage: allocation.sm_percentage,
        address_window: 0,
    };
    let further = allocation.further.iter().map(|share| {
        let spec = ServerSpec {
            allocation_id: allocation.id.clone(),
            gpu: share.gpu,
            extra_gpus: share.extra_gpus.clone(),
            memory: allocation.memory,
            sm_percentage: share.sm_percentage,
            address_window: share.address_window,
        };
        (share.node_id.clone(), spec)
    });
    std::iter::once((allocation.node_id.clone(), first)).chain(further).collect()
}

/// Text naming `allocation`'s nodes (`a and b`, `a, b and c`).
fn node_list(allocation: &AllocationRecord) -> String {
    let nodes = allocation.nodes();
    match nodes.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => nodes.join(""),
    }
}

impl<S: Store> Cluster<S> {
    /// Starts from what the store holds.
    pub async fn open(
        store: S,
        key: ClusterKey,
        config: ClusterManagerConfig,
        metrics: Arc<ClusterMetrics>,
    ) -> Result<Arc<Self>, crate::store::StoreError> {
        let state = store.load().await?;
        let model = Model::from_stored(state, Instant::now());
        let unsettled: Vec<&str> =
            model.allocations.values().filter(|allocation| !settled(allocation)).map(|allocation| allocation.id.as_str()).collect();
        tracing::info!(
            store = %store.describe(),
            vms = model.vms.len(),
            nodes = model.nodes.len(),
            allocations = model.allocations.len(),
            ?unsettled,
            "state loaded"
        );
        if !unsettled.is_empty() {
            tracing::info!(
                allocations = ?unsettled,
                "steps left under way by the previous run are finished as their nodes report in"
            );
        }
        Ok(Arc::new(Self {
            model: Mutex::new(model),
            store,
            key,
            config,
            started: Instant::now(),
            vm_locks: StdMutex::new(HashMap::new()),
            scheduled: StdMutex::new(HashSet::new()),
            replaced_pids: StdMutex::new(HashMap::new()),
            node_clients: Mutex::new(HashMap::new()),
            metrics,
        }))
    }

    fn vm_lock(&self, vm_ip: &str) -> Arc<Mutex<()>> {
        let mut locks = self.vm_locks.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        locks.entry(vm_ip.to_string()).or_default().clone()
    }

    /// Whether a step on `vm_ip`'s allocation is under way now.
    fn vm_busy(&self, vm_ip: &str) -> bool {
        self.vm_lock(vm_ip).try_lock().is_err()
    }

    fn heartbeat_interval_ms(&self) -> u64 {
        self.config.leases.heartbeat_interval_ms
    }

    /// A connected client for node `node_id` (reused; dropped on failure by [`Self::node_call_failed`]).
    async fn node_client(&self, node_id: &str, address: &str) -> Result<NodeManagerControlClient, ControlError> {
        let mut clients = self.node_clients.lock().await;
        if let Some((known_address, client)) = clients.get(node_id)
            && known_address == address
        {
            return Ok(client.clone());
        }
        let endpoint = Endpoint::parse(address)
            .map_err(|error| ControlError::NodeUnreachable { node: node_id.to_string(), reason: error.to_string() })?;
        let stream = rpc::connect(&endpoint, &self.key, ServiceName::NodeManager)
            .await
            .map_err(|error| ControlError::NodeUnreachable { node: node_id.to_string(), reason: error.to_string() })?;
        let client = NodeManagerControlClient::new(tarpc::client::Config::default(), rpc::transport(stream)).spawn();
        clients.insert(node_id.to_string(), (address.to_string(), client.clone()));
        Ok(client)
    }

    async fn node_call_failed(&self, node_id: &str, address: &str, error: &tarpc::client::RpcError) -> ControlError {
        ClusterMetrics::count(&self.metrics.node_call_failures);
        self.node_clients.lock().await.remove(node_id);
        ControlError::NodeUnreachable { node: node_id.to_string(), reason: format!("its node manager at {address}: {error}") }
    }

    async fn node_address(&self, node_id: &str) -> Result<String, ControlError> {
        let model = self.model.lock().await;
        model
            .nodes
            .get(node_id)
            .map(|node| node.record.control_address.clone())
            .ok_or_else(|| ControlError::UnknownNode(node_id.to_string()))
    }

    async fn start_on_node(&self, node_id: &str, spec: ServerSpec) -> Result<ServerReport, ControlError> {
        let address = self.node_address(node_id).await?;
        let client = self.node_client(node_id, &address).await?;
        let timeout = Duration::from_secs(self.config.allocations.start_timeout_seconds);
        match client.start_server(rpc::deadline(timeout), spec).await {
            Ok(result) => result,
            Err(error) => Err(self.node_call_failed(node_id, &address, &error).await),
        }
    }

    async fn resize_on_node(
        &self,
        node_id: &str,
        allocation_id: &str,
        memory: u64,
        sm_percentage: u32,
    ) -> Result<ServerReport, ControlError> {
        let address = self.node_address(node_id).await?;
        let client = self.node_client(node_id, &address).await?;
        let call = client.resize_server(rpc::deadline(NODE_CALL_TIMEOUT), allocation_id.to_string(), Some(memory), Some(sm_percentage));
        match call.await {
            Ok(result) => result,
            Err(error) => Err(self.node_call_failed(node_id, &address, &error).await),
        }
    }

    /// Asks a node manager to stop an allocation's server on GPU `gpu` (`None`: every server of
    /// it there); failures are logged (the node's next report lists the server, and the reply
    /// tells it to stop).
    async fn stop_on_node(&self, node_id: &str, allocation_id: &str, gpu: Option<u32>) {
        self.stop_server_on_node(node_id, ServerRef::new(allocation_id, gpu)).await;
    }

    /// Stops the allocation's server(s) `server` names on `node_id`, best effort.
    async fn stop_server_on_node(&self, node_id: &str, server: ServerRef) {
        let allocation_id = server.allocation_id.clone();
        let result = async {
            let address = self.node_address(node_id).await?;
            let client = self.node_client(node_id, &address).await?;
            match client.stop_server(rpc::deadline(NODE_CALL_TIMEOUT), server).await {
                Ok(result) => result,
                Err(error) => Err(self.node_call_failed(node_id, &address, &error).await),
            }
        }
        .await;
        if let Err(error) = result {
            tracing::warn!(node = node_id, allocation = %allocation_id, %error, "could not stop the rpc-server now; the node's next report will");
        }
    }

    /// Removes an allocation from model and store, and stops its server in the background.
    /// The record goes first: a crash after it leaves a server no allocation owns, which the
    /// node's next report is told to stop.
    async fn release_locked(self: &Arc<Self>, model: &mut Model, allocation_id: &str, reason: &str) -> Result<(), ControlError> {
        let Some(allocation) = model.allocations.get(allocation_id).cloned() else { return Ok(()) };
        failpoint::hit("release.begin");
        self.store.remove_allocation(allocation_id).await.map_err(store_error)?;
        model.allocations.remove(allocation_id);
        let further_key = format!("{allocation_id}@");
        model.missing_reports.retain(|key, _| key != allocation_id && !key.starts_with(&further_key));
        model.granted.remove(allocation_id);
        tracing::info!(allocation = allocation_id, vm = %allocation.vm_ip, node = %allocation.node_id, reason, "allocation released");
        failpoint::hit("release.removed");
        // Every node of a spread allocation, and both ends of a move under way, run a server of it.
        for node_id in allocation.nodes() {
            let down = model.nodes.get(&node_id).is_none_or(|node| node.record.health == NodeHealth::Down);
            if !down {
                let (cluster, id) = (self.clone(), allocation_id.to_string());
                tokio::spawn(async move { cluster.stop_on_node(&node_id, &id, None).await });
            }
        }
        Ok(())
    }

    /// A grant of `allocation` for an app on the kernel `client_boot_id`: its server's address,
    /// or a spread allocation's servers' addresses, comma-separated, in the order the app
    /// numbers their devices (each a Unix socket when the app shares that node's kernel).
    fn grant(&self, model: &Model, allocation: &AllocationRecord, client_boot_id: &str) -> Result<Grant, ControlError> {
        let shares_kernel = |node_id: &str| {
            let node_boot_id = model.nodes.get(node_id).map(|node| node.record.boot_id.as_str()).unwrap_or("");
            !client_boot_id.is_empty() && node_boot_id == client_boot_id
        };
        let same_host = shares_kernel(&allocation.node_id);
        let mut addresses = vec![
            data_address(&allocation.addresses, same_host)
                .ok_or_else(|| ControlError::Spawn(format!("allocation {} has no address", allocation.id)))?,
        ];
        for share in &allocation.further {
            addresses.push(data_address(&share.addresses, shares_kernel(&share.node_id)).ok_or_else(|| {
                ControlError::Spawn(format!("allocation {}'s server on {} has no address", allocation.id, share.node_id))
            })?);
        }
        let address = addresses.join(",");
        let expires_at = unix_now() + self.config.allocations.token_ttl_seconds;
        let token = token::issue(self.key.as_bytes(), &SessionClaims { allocation: allocation.id.clone(), expires_at })
            .map_err(|error| ControlError::Invalid(error.to_string()))?;
        let mode = model.vm_mode(&allocation.vm_ip, allocation);
        Ok(Grant { allocation_id: allocation.id.clone(), address, token, token_expires_at: expires_at, same_host, mode })
    }

    /// A new `Starting` allocation of `vm` on `parts` (placement's: one node, or several for a
    /// spread allocation), stored before any node hears of it (whatever happens next, a restart
    /// finds it); its id.
    async fn new_allocation(
        &self,
        model: &mut Model,
        vm: &VmRequirement,
        parts: &[Part],
        client: &ClientIdentity,
        now: u64,
    ) -> Result<String, ControlError> {
        let allocation = model.new_record(new_allocation_id(), vm, parts, client, now)?;
        self.store.put_allocation(&allocation).await.map_err(store_error)?;
        let gpus: Vec<String> = allocation.all_gpus().iter().map(|gpu| format!("{}/{}", gpu.node_id, gpu.index)).collect();
        tracing::info!(allocation = %allocation.id, vm = %vm.vm_ip, node = %allocation.node_id, gpus = ?gpus, compute_units = vm.compute_units, memory_mib = vm.memory, "placing");
        let id = allocation.id.clone();
        model.allocations.insert(id.clone(), allocation);
        Ok(id)
    }

    /// Starts a new placement's server while the app waits (until `deadline`, its request's). A
    /// node that does not answer (its node manager restarting, say) is asked again, backing
    /// off; once it has not answered for `node_timeout_ms`, another node that fits takes the
    /// placement. Only when the deadline comes is the app told, with the node named.
    async fn start_placed(self: &Arc<Self>, first: String, request: &AllocateRequest, deadline: Instant) -> Result<String, ControlError> {
        let node_timeout = Duration::from_millis(self.config.leases.node_timeout_ms);
        let mut id = first;
        let mut pause = PLACEMENT_RETRY_FIRST;
        let mut failing_since: Option<Instant> = None;
        let mut avoid: Vec<String> = Vec::new();
        loop {
            let error = match self.settle_locked(&id, WhenUnreachable::Retry).await {
                Ok(()) => return Ok(id),
                Err(error @ ControlError::NodeUnreachable { .. }) => error,
                Err(other) => return Err(other),
            };
            let Some(first_node) = self.model.lock().await.allocations.get(&id).map(|allocation| allocation.node_id.clone()) else {
                return Err(error);
            };
            // A spread allocation's silent node may be a further one: the error names it.
            let node = match &error {
                ControlError::NodeUnreachable { node, .. } if !node.is_empty() => node.clone(),
                _ => first_node,
            };
            if Instant::now() + pause + PLACEMENT_ANSWER_MARGIN >= deadline {
                tracing::warn!(allocation = %id, node = %node, %error, "the node did not answer while the app waited: giving up");
                let mut model = self.model.lock().await;
                self.release_locked(&mut model, &id, "its node did not answer").await?;
                return Err(error);
            }
            let since = *failing_since.get_or_insert_with(|| {
                tracing::warn!(allocation = %id, node = %node, %error, "the node does not answer: asking again until it does, while the app waits");
                Instant::now()
            });
            if since.elapsed() >= node_timeout && !avoid.contains(&node) {
                avoid.push(node.clone());
                let mut model = self.model.lock().await;
                let vm = model.vms.get(&request.vm_ip).cloned().ok_or_else(|| ControlError::UnknownVm(request.vm_ip.clone()))?;
                match model.placement(&vm, &avoid) {
                    Ok(parts) => {
                        let to: Vec<&str> = parts.iter().map(|part| part.node_id.as_str()).collect();
                        tracing::warn!(allocation = %id, node = %node, ?to, "the node did not answer within node_timeout_ms: placing the app on other nodes");
                        self.release_locked(&mut model, &id, "its node did not answer").await?;
                        id = self.new_allocation(&mut model, &vm, &parts, &request.client, unix_now()).await?;
                        failing_since = None;
                        pause = PLACEMENT_RETRY_FIRST;
                        continue;
                    }
                    Err(_) => tracing::info!(allocation = %id, node = %node, "no other node fits: waiting for this one"),
                }
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(PLACEMENT_RETRY_MAX);
        }
    }

    async fn allocate(self: Arc<Self>, request: AllocateRequest, deadline: Instant) -> Result<Grant, ControlError> {
        let vm_lock = self.vm_lock(&request.vm_ip);
        let _one_at_a_time = vm_lock.lock().await;
        let now = unix_now();
        // A step a crash left under way (or a background step that could not reach the node)
        // is finished before the app is answered.
        let unsettled = {
            let mut model = self.model.lock().await;
            model.client_managers.insert(request.vm_ip.clone(), Instant::now());
            if !model.vms.contains_key(&request.vm_ip) {
                return Err(ControlError::UnknownVm(request.vm_ip.clone()));
            }
            model.allocation_for_vm(&request.vm_ip).filter(|allocation| !settled(allocation)).map(|allocation| allocation.id.clone())
        };
        if let Some(id) = unsettled {
            tracing::info!(allocation = %id, vm = %request.vm_ip, "finishing a step left under way before answering the VM");
            if let Err(error) = self.settle_locked(&id, WhenUnreachable::GiveUp).await {
                // A placement whose node refused was released: place the VM afresh below.
                if self.model.lock().await.allocations.contains_key(&id) {
                    return Err(error);
                }
            }
        }
        let mut pause = PLACEMENT_RETRY_FIRST;
        let mut waiting = false;
        let allocation_id = loop {
            let mut model = self.model.lock().await;
            let vm = model.vms.get(&request.vm_ip).cloned().ok_or_else(|| ControlError::UnknownVm(request.vm_ip.clone()))?;
            if let Some(existing) = model.allocation_for_vm(&vm.vm_ip).map(|allocation| allocation.id.clone()) {
                let mut allocation = model.allocations[&existing].clone();
                add_client(&mut allocation, &request.client, now);
                self.store.put_allocation(&allocation).await.map_err(store_error)?;
                let grant = self.grant(&model, &allocation, &request.client.boot_id);
                model.granted.insert(existing.clone(), Instant::now());
                model.allocations.insert(existing, allocation);
                return grant;
            }
            match model.placement(&vm, &[]) {
                Ok(parts) => break self.new_allocation(&mut model, &vm, &parts, &request.client, now).await?,
                // Nothing fits while a node is down but within its grace: it may come back
                // (a node manager restarting), so the app waits for it, as for a node that
                // does not answer a start.
                Err(error @ ControlError::NoCapacity(_)) => {
                    let grace = Duration::from_secs(self.config.leases.node_grace_seconds);
                    let down: Vec<String> = model
                        .nodes
                        .iter()
                        .filter(|(_, node)| {
                            node.record.health == NodeHealth::Down && node.down_since.is_some_and(|since| since.elapsed() < grace)
                        })
                        .map(|(id, _)| id.clone())
                        .collect();
                    if down.is_empty() {
                        return Err(error);
                    }
                    if Instant::now() + pause + PLACEMENT_ANSWER_MARGIN >= deadline {
                        return Err(ControlError::NodeUnreachable {
                            node: down.join(", "),
                            reason: format!("it sends no heartbeat, and nothing else fits ({error})"),
                        });
                    }
                    if !waiting {
                        waiting = true;
                        tracing::warn!(vm = %vm.vm_ip, nodes = ?down, %error, "nothing fits while nodes are down: waiting for them, while the app waits");
                    }
                }
                Err(error) => return Err(error),
            }
            drop(model);
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(PLACEMENT_RETRY_MAX);
        };
        failpoint::hit("place.stored_starting");
        let allocation_id = self.start_placed(allocation_id, &request, deadline).await?;
        let mut model = self.model.lock().await;
        let allocation = model
            .allocations
            .get(&allocation_id)
            .ok_or_else(|| ControlError::Spawn(format!("allocation {allocation_id} was released while its server started")))?;
        let grant = self.grant(&model, allocation, &request.client.boot_id);
        model.granted.insert(allocation_id, Instant::now());
        grant
    }

    /// Finishes whatever step `id` has under way; the caller holds the VM's lock. A `Starting`
    /// allocation gets its server (the node's start is idempotent: a server it already runs,
    /// or is still starting, is reported as is) and becomes `Running`, or is released when the
    /// node refuses. A pending resize is applied again and committed, or rolled back when the
    /// node refuses. A move left `Copying` is rolled back, one left `Switching` finished.
    async fn settle_locked(self: &Arc<Self>, id: &str, unreachable: WhenUnreachable) -> Result<(), ControlError> {
        let Some(allocation) = self.model.lock().await.allocations.get(id).cloned() else { return Ok(()) };
        if allocation.pending_move.is_some() {
            self.settle_move_locked(id).await?;
        }
        let Some(allocation) = self.model.lock().await.allocations.get(id).cloned() else { return Ok(()) };
        if allocation.state == AllocationState::Starting {
            // Each node's server (one, or one per node of a spread allocation): starting is
            // idempotent on the node, so servers started before a failure are reported again.
            let mut reports = Vec::with_capacity(1 + allocation.further.len());
            for (node_id, spec) in server_specs(&allocation) {
                match self.start_on_node(&node_id, spec).await {
                    Ok(report) => {
                        reports.push((node_id, report));
                        if reports.len() == 1 && !allocation.further.is_empty() {
                            failpoint::hit("place.first_started");
                        }
                    }
                    Err(error @ ControlError::NodeUnreachable { .. }) if unreachable == WhenUnreachable::Retry => {
                        tracing::warn!(allocation = id, node = %node_id, %error, "cannot start the server now; trying again at the node's next report");
                        return Err(error);
                    }
                    Err(error) => {
                        tracing::warn!(allocation = id, node = %node_id, %error, "server start failed");
                        let mut model = self.model.lock().await;
                        self.release_locked(&mut model, id, "its server did not start").await?;
                        return Err(error);
                    }
                }
            }
            failpoint::hit("place.node_started");
            self.record_running(id, &reports).await?;
        }
        let Some(allocation) = self.model.lock().await.allocations.get(id).cloned() else { return Ok(()) };
        if let Some(size) = allocation.pending_resize {
            match self.resize_on_node(&allocation.node_id, id, size.memory, size.sm_percentage).await {
                Ok(_) => {
                    failpoint::hit("resize.node_resized");
                    self.commit_resize(id, size).await?;
                }
                Err(error @ ControlError::NodeUnreachable { .. }) if unreachable == WhenUnreachable::Retry => return Err(error),
                Err(error) => {
                    self.roll_back_resize(id, &error).await?;
                    return Err(error);
                }
            }
        }
        Ok(())
    }

    /// An allocation whose servers all started (`reports`: each node's, its first node's
    /// first) becomes `Running`; one released meanwhile has its servers stopped (nothing runs
    /// untracked).
    async fn record_running(self: &Arc<Self>, id: &str, reports: &[(String, ServerReport)]) -> Result<(), ControlError> {
        let mut model = self.model.lock().await;
        let Some(mut allocation) = model.allocations.get(id).cloned() else {
            drop(model);
            for (node_id, report) in reports {
                self.stop_on_node(node_id, id, Some(report.gpu)).await;
            }
            return Err(ControlError::Spawn(format!("allocation {id} was released while its server started")));
        };
        let Some((_, report)) = reports.first() else { return Err(ControlError::Spawn(format!("allocation {id} has no server"))) };
        for (node_id, further) in &reports[1..] {
            if let Some(share) = allocation.further.iter_mut().find(|share| &share.node_id == node_id) {
                share.addresses = further.addresses.clone();
                share.pid = further.pid;
            }
        }
        allocation.state = AllocationState::Running;
        allocation.addresses = report.addresses.clone();
        allocation.pid = report.pid;
        refresh_idle(&mut allocation, unix_now());
        self.store.put_allocation(&allocation).await.map_err(store_error)?;
        tracing::info!(allocation = id, node = %allocation.node_id, pid = report.pid, addresses = ?report.addresses, "allocation running");
        model.allocations.insert(id.to_string(), allocation);
        failpoint::hit("place.stored_running");
        Ok(())
    }

    /// The VM keeps the new size for its next allocation too: its requirement is written before
    /// the allocation's commit, so a crash between the two is finished by resizing again.
    async fn commit_resize(&self, id: &str, size: SliceSize) -> Result<AllocationRecord, ControlError> {
        let mut model = self.model.lock().await;
        let mut allocation = model.allocations.get(id).cloned().ok_or_else(|| ControlError::UnknownAllocation(id.to_string()))?;
        if let Some(mut vm) = model.vms.get(&allocation.vm_ip).cloned() {
            vm.compute_units = size.compute_units;
            vm.memory = size.memory;
            self.store.put_vm(&vm).await.map_err(store_error)?;
            model.vms.insert(vm.vm_ip.clone(), vm);
        }
        failpoint::hit("resize.vm_updated");
        allocation.compute_units = size.compute_units;
        allocation.memory = size.memory;
        allocation.sm_percentage = size.sm_percentage;
        allocation.pending_resize = None;
        self.store.put_allocation(&allocation).await.map_err(store_error)?;
        model.allocations.insert(id.to_string(), allocation.clone());
        tracing::info!(
            allocation = id,
            compute_units = size.compute_units,
            memory_mib = size.memory,
            sm_percentage = size.sm_percentage,
            "allocation resized"
        );
        Ok(allocation)
    }

    /// Forgets a resize the node refused; a server that applied it anyway is set back to the
    /// stored size at the node's next report.
    async fn roll_back_resize(&self, id: &str, why: &ControlError) -> Result<(), ControlError> {
        let mut model = self.model.lock().await;
        let Some(mut allocation) = model.allocations.get(id).cloned() else { return Ok(()) };
        allocation.pending_resize = None;
        self.store.put_allocation(&allocation).await.map_err(store_error)?;
        model.allocations.insert(id.to_string(), allocation);
        tracing::warn!(allocation = id, error = %why, "resize rolled back");
        Ok(())
    }

    /// Runs a step a node report found missing, under the VM's lock.
    async fn settle_in_background(self: Arc<Self>, id: String, step: Step) {
        let vm_ip = self.model.lock().await.allocations.get(&id).map(|allocation| allocation.vm_ip.clone());
        if let Some(vm_ip) = vm_ip {
            let vm_lock = self.vm_lock(&vm_ip);
            let _one_at_a_time = vm_lock.lock().await;
            let result = match step {
                Step::Settle => self.settle_locked(&id, WhenUnreachable::Retry).await,
                Step::Repair => self.repair_locked(&id).await,
            };
            if let Err(error) = result {
                tracing::warn!(allocation = %id, ?step, %error, "background step failed");
            }
        }
        self.scheduled.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(&id);
    }

    /// Sets a server's slice back to the stored one.
    async fn repair_locked(&self, id: &str) -> Result<(), ControlError> {
        let Some(allocation) = self.model.lock().await.allocations.get(id).cloned() else { return Ok(()) };
        if !settled(&allocation) {
            return Ok(());
        }
        tracing::info!(
            allocation = id,
            memory_mib = allocation.memory,
            sm_percentage = allocation.sm_percentage,
            "the server's slice differs from the stored one; setting it back"
        );
        self.resize_on_node(&allocation.node_id, id, allocation.memory, allocation.sm_percentage).await.map(|_| ())
    }

    fn schedule(self: &Arc<Self>, steps: Vec<(String, Step)>) {
        for (id, step) in steps {
            let fresh = self.scheduled.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(id.clone());
            if fresh {
                tokio::spawn(self.clone().settle_in_background(id, step));
            }
        }
    }

    /// Applies a node's server list: updates usage, adopts servers of allocations left
    /// `Starting`, releases allocations whose server is gone, and returns the servers to stop
    /// (no allocation, or one placed on another node or GPU) with the steps to schedule.
    async fn reconcile_servers(
        self: &Arc<Self>,
        model: &mut Model,
        node_id: &str,
        servers: &[ServerReport],
    ) -> Result<(Vec<ServerRef>, Vec<(String, Step)>), ControlError> {
        let now = unix_now();
        // Each allocation's server on its own GPU (a move between this node's GPUs runs two).
        let reported: BTreeSet<(&str, u32)> = servers.iter().map(|server| (server.allocation_id.as_str(), server.gpu)).collect();
        let mut stop = Vec::new();
        let mut steps = Vec::new();
        for server in servers {
            let Some(allocation) = model.allocations.get(&server.allocation_id) else {
                stop.push(ServerRef::new(&server.allocation_id, Some(server.gpu)));
                continue;
            };
            if let Some(at) = allocation.further.iter().position(|share| share.node_id == node_id && share.gpu == server.gpu) {
                // A spread allocation's server on a further node: its usage, and where it
                // listens unless a step under way owns the allocation.
                let mut updated = allocation.clone();
                let share = &mut updated.further[at];
                if !self.vm_busy(&allocation.vm_ip) {
                    share.pid = server.pid;
                    share.addresses = server.addresses.clone();
                    if updated.state == AllocationState::Starting {
                        steps.push((updated.id.clone(), Step::Settle));
                    }
                }
                let share = &mut updated.further[at];
                share.sessions = server.sessions;
                share.metrics.clone_from(&server.metrics);
                if &updated != allocation {
                    self.store.put_allocation(&updated).await.map_err(store_error)?;
                    model.allocations.insert(updated.id.clone(), updated);
                }
                continue;
            }
            // A server of another GPU set with the same first GPU: the old end of a move of one
            // of the allocation's GPUs (stopped by its whole set, the new one staying).
            let other_set = allocation.node_id == node_id && allocation.gpu == server.gpu && allocation.extra_gpus != server.extra_gpus;
            if allocation.node_id != node_id || allocation.gpu != server.gpu || other_set {
                // The other end of a move under way keeps its server until the move is over.
                if !allocation.pending_move.as_ref().is_some_and(|pending| pending.involves(node_id, server.gpu)) {
                    stop.push(if other_set {
                        ServerRef::of_set(&server.allocation_id, server.gpu, &server.extra_gpus)
                    } else {
                        ServerRef::new(&server.allocation_id, Some(server.gpu))
                    });
                }
                continue;
            }
            {
                let mut replaced = self.replaced_pids.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                match replaced.get(&server.allocation_id) {
                    // Made before the restart: it says nothing of the server now running.
                    Some(old) if *old == server.pid => continue,
                    Some(_) if server.pid == allocation.pid => {
                        replaced.remove(&server.allocation_id);
                    }
                    _ => {}
                }
            }
            let mut updated = allocation.clone();
            // A step under way owns the allocation's state; the report only updates usage.
            if !self.vm_busy(&allocation.vm_ip) {
                if updated.state == AllocationState::Starting && updated.further.iter().all(|share| share.pid != 0) {
                    tracing::info!(allocation = %updated.id, node = node_id, pid = server.pid, "adopting the server the node runs for an allocation left starting");
                    updated.state = AllocationState::Running;
                } else if updated.state == AllocationState::Starting {
                    // A spread allocation runs once every node's server does: start the rest.
                    steps.push((updated.id.clone(), Step::Settle));
                }
                updated.pid = server.pid;
                updated.addresses = server.addresses.clone();
                if updated.pending_resize.is_some() || updated.pending_move.is_some() {
                    steps.push((updated.id.clone(), Step::Settle));
                } else if server.memory_quota_bytes != updated.memory.saturating_mul(MIB) || server.sm_percentage != updated.sm_percentage {
                    steps.push((updated.id.clone(), Step::Repair));
                }
            }
            updated.sessions = server.sessions;
            updated.metrics.clone_from(&server.metrics);
            refresh_idle(&mut updated, now);
            if &updated != allocation {
                self.store.put_allocation(&updated).await.map_err(store_error)?;
                model.allocations.insert(updated.id.clone(), updated);
            }
        }
        // Allocations left starting whose server the node does not run: start it (again).
        for allocation in model.allocations.values() {
            let mut servers_here = std::iter::once((allocation.node_id.as_str(), allocation.gpu))
                .chain(allocation.further.iter().map(|share| (share.node_id.as_str(), share.gpu)))
                .filter(|(node, _)| *node == node_id);
            if allocation.state == AllocationState::Starting
                && servers_here.any(|(_, gpu)| !reported.contains(&(allocation.id.as_str(), gpu)))
                && !self.vm_busy(&allocation.vm_ip)
            {
                steps.push((allocation.id.clone(), Step::Settle));
            }
        }
        let mut vanished = Vec::new();
        // (allocation, its server's GPU here, the key its misses are counted under): a spread
        // allocation's further servers count apart from its first.
        let running_here: Vec<(String, u32, String)> = model
            .allocations
            .values()
            // A move under way owns the allocation's servers until it is over.
            .filter(|allocation| allocation.state == AllocationState::Running && allocation.pending_move.is_none())
            .flat_map(|allocation| {
                let first = (allocation.node_id == node_id).then(|| (allocation.id.clone(), allocation.gpu, allocation.id.clone()));
                let further = allocation
                    .further
                    .iter()
                    .filter(|share| share.node_id == node_id)
                    .map(|share| (allocation.id.clone(), share.gpu, format!("{}@{node_id}", allocation.id)));
                first.into_iter().chain(further).collect::<Vec<_>>()
            })
            .collect();
        for (id, gpu, key) in running_here {
            if reported.contains(&(id.as_str(), gpu)) {
                model.missing_reports.remove(&key);
                continue;
            }
            // A report built just before a server start finished lacks that server: only a
            // second report without it means the server is gone.
            let misses = model.missing_reports.entry(key.clone()).or_insert(0);
            *misses += 1;
            if *misses >= MISSING_REPORTS_BEFORE_RELEASE {
                model.missing_reports.remove(&key);
                if !vanished.contains(&id) {
                    vanished.push(id);
                }
            }
        }
        for id in vanished {
            tracing::warn!(allocation = %id, node = node_id, "the node no longer runs this allocation's rpc-server");
            self.release_locked(model, &id, "its rpc-server exited").await?;
        }
        Ok((stop, steps))
    }

    async fn register(self: Arc<Self>, registration: NodeRegistration) -> Result<RegisterReply, ControlError> {
        if registration.node_id.is_empty() {
            return Err(ControlError::Invalid("node_id is empty".into()));
        }
        let mut model = self.model.lock().await;
        let previous = model.nodes.get(&registration.node_id).map(|node| (node.record.drained, node.record.health));
        let drained = previous.is_some_and(|(drained, _)| drained);
        let record = NodeRecord {
            node_id: registration.node_id.clone(),
            host_ip: registration.host_ip.clone(),
            boot_id: registration.boot_id.clone(),
            control_address: registration.control_address.clone(),
            health: NodeHealth::Up,
            drained,
            registered_at: unix_now(),
        };
        self.store.put_node(&record).await.map_err(store_error)?;
        self.store.put_gpus(&record.node_id, &registration.gpus).await.map_err(store_error)?;
        let kept = model.allocations.values().filter(|allocation| allocation.node_id == registration.node_id).count();
        let grace = Duration::from_secs(self.config.leases.node_grace_seconds);
        let down_for = model.nodes.get(&registration.node_id).and_then(|node| node.down_since).map(|since| since.elapsed());
        if previous.is_some_and(|(_, health)| health == NodeHealth::Down) {
            // Back in time: its allocations were kept; back late: they were released already.
            let message = if down_for.is_some_and(|down| down < grace) {
                "node is back within its grace period"
            } else {
                "node is back after its grace period ran out: its allocations were released"
            };
            tracing::info!(node = %record.node_id, control = %record.control_address, servers = registration.servers.len(), allocations_kept = kept, down_s = down_for.map_or(0, |down| down.as_secs()), "{message}");
        } else {
            tracing::info!(node = %record.node_id, host_ip = %record.host_ip, control = %record.control_address, gpus = registration.gpus.len(), servers = registration.servers.len(), "node registered");
        }
        model.nodes.insert(
            record.node_id.clone(),
            NodeEntry { record, gpus: registration.gpus.clone(), last_heartbeat: Instant::now(), down_since: None },
        );
        // A (re)registered node manager may have a new control connection: reconnect lazily.
        self.node_clients.lock().await.remove(&registration.node_id);
        let (stop, steps) = self.reconcile_servers(&mut model, &registration.node_id, &registration.servers).await?;
        drop(model);
        self.schedule(steps);
        if !stop.is_empty() {
            tracing::info!(node = %registration.node_id, ?stop, "asking the node to stop servers no allocation owns");
        }
        Ok(RegisterReply { stop, heartbeat_interval_ms: self.heartbeat_interval_ms() })
    }

    async fn node_heartbeat(self: Arc<Self>, heartbeat: NodeHeartbeat) -> Result<NodeHeartbeatReply, ControlError> {
        let mut model = self.model.lock().await;
        let Some(node) = model.nodes.get_mut(&heartbeat.node_id) else { return Ok(NodeHeartbeatReply::RegisterAgain) };
        if node.record.boot_id != heartbeat.boot_id || node.record.health == NodeHealth::Down {
            return Ok(NodeHeartbeatReply::RegisterAgain);
        }
        node.last_heartbeat = Instant::now();
        let (stop, steps) = self.reconcile_servers(&mut model, &heartbeat.node_id, &heartbeat.servers).await?;
        drop(model);
        self.schedule(steps);
        if !stop.is_empty() {
            tracing::info!(node = %heartbeat.node_id, ?stop, "asking the node to stop servers no allocation owns");
        }
        Ok(NodeHeartbeatReply::Ok { stop })
    }

    async fn client_heartbeat(self: Arc<Self>, report: ClientManagerReport) -> Result<ClientHeartbeatReply, ControlError> {
        let now = unix_now();
        let mut model = self.model.lock().await;
        model.client_managers.insert(report.vm_ip.clone(), Instant::now());
        let mut gone = Vec::new();
        let mut reported = BTreeSet::new();
        for entry in &report.allocations {
            match model.allocations.get(&entry.allocation_id) {
                Some(allocation) if allocation.vm_ip == report.vm_ip => {
                    reported.insert(entry.allocation_id.clone());
                    let mut updated = allocation.clone();
                    updated.clients = entry.clients.clone();
                    refresh_idle(&mut updated, now);
                    if &updated != allocation {
                        self.store.put_allocation(&updated).await.map_err(store_error)?;
                        model.allocations.insert(updated.id.clone(), updated);
                    }
                }
                _ => gone.push(entry.allocation_id.clone()),
            }
        }
        // Allocations of this VM its client manager does not mention have no client it knows of,
        // unless granted so recently that the report was built before the grant arrived.
        let recent = Duration::from_millis(self.heartbeat_interval_ms().saturating_mul(2));
        let unmentioned = model.allocation_ids(|allocation| {
            allocation.vm_ip == report.vm_ip
                && allocation.state == AllocationState::Running
                && !reported.contains(&allocation.id)
                && !allocation.clients.is_empty()
                && model.granted.get(&allocation.id).is_none_or(|at| at.elapsed() > recent)
        });
        for id in unmentioned {
            if let Some(mut updated) = model.allocations.get(&id).cloned() {
                updated.clients.clear();
                refresh_idle(&mut updated, now);
                self.store.put_allocation(&updated).await.map_err(store_error)?;
                model.allocations.insert(id, updated);
            }
        }
        Ok(ClientHeartbeatReply { gone, heartbeat_interval_ms: self.heartbeat_interval_ms() })
    }

    async fn release(self: Arc<Self>, vm_ip: String, allocation_id: String) -> Result<(), ControlError> {
        let mut model = self.model.lock().await;
        match model.allocations.get(&allocation_id) {
            Some(allocation) if allocation.vm_ip == vm_ip => {
                self.release_locked(&mut model, &allocation_id, "released by its client manager").await
            }
            _ => Err(ControlError::UnknownAllocation(allocation_id)),
        }
    }

    /// Restarts every lease after this process itself did not run for `stalled`: the nodes and
    /// client managers were silent because nobody listened, not because they died.
    fn restart_leases(&self, model: &mut Model, now: Instant, stalled: Duration) {
        for node in model.nodes.values_mut() {
            node.last_heartbeat = now;
            if let Some(since) = &mut node.down_since {
                *since += stalled;
            }
        }
        for last in model.client_managers.values_mut() {
            *last = now;
        }
        model.leases_restarted = Some(now);
        tracing::warn!(
            "this cluster manager did not run for {:.1} s (stopped, paused or starved): its own silence is not held against anyone; nodes and client managers have {} ms to report again",
            stalled.as_secs_f64(),
            self.config.leases.node_timeout_ms.max(self.config.leases.client_timeout_ms)
        );
    }

    /// One pass of lease and idle checks.
    pub async fn reap(self: &Arc<Self>) {
        let node_timeout = Duration::from_millis(self.config.leases.node_timeout_ms);
        let node_grace = Duration::from_secs(self.config.leases.node_grace_seconds);
        let client_timeout = Duration::from_millis(self.config.leases.client_timeout_ms);
        let mut model = self.model.lock().await;
        // Measured with the lock held, right before the leases are judged: a stall anywhere
        // since the last pass (this one's wait for the lock included) shows here.
        let now = Instant::now();
        let gap = model.last_reap.map_or(Duration::ZERO, |last| now.saturating_duration_since(last));
        model.last_reap = Some(now);
        if gap > STALL_THRESHOLD {
            self.restart_leases(&mut model, now, gap);
        }
        let silent = model
            .node_ids(|node| node.record.health == NodeHealth::Up && now.saturating_duration_since(node.last_heartbeat) > node_timeout);
        for node_id in silent {
            let kept = model.allocation_ids(|allocation| allocation.node_id == node_id);
            let Some(node) = model.nodes.get_mut(&node_id) else { continue };
            node.record.health = NodeHealth::Down;
            node.down_since = Some(now);
            let record = node.record.clone();
            if let Err(error) = self.store.put_node(&record).await {
                tracing::error!(%error, "cannot record a node as down");
            }
            tracing::warn!(
                node = %node_id,
                control = %record.control_address,
                allocations = ?kept,
                "node sent no heartbeat for {} ms: marked down; its allocations are kept for {} s in case its node manager comes back",
                self.config.leases.node_timeout_ms,
                self.config.leases.node_grace_seconds
            );
        }
        let lost = model.node_ids(|node| node.down_since.is_some_and(|since| now.saturating_duration_since(since) >= node_grace));
        for node_id in lost {
            // A spread allocation goes with any of its nodes: its apps need every one.
            let ids = model.allocation_ids(|allocation| {
                allocation.node_id == node_id || allocation.further.iter().any(|share| share.node_id == node_id)
            });
            for id in ids {
                if let Err(error) = self.release_locked(&mut model, &id, "its node has been down for longer than node_grace_seconds").await
                {
                    tracing::error!(%error, "cannot release an allocation");
                }
            }
        }
        let unix = unix_now();
        for vm_ip in model.expire_client_managers(now, client_timeout) {
            tracing::warn!(vm = %vm_ip, "client manager sent no heartbeat for {} ms: its clients are forgotten", self.config.leases.client_timeout_ms);
            let ids = model.allocation_ids(|allocation| allocation.vm_ip == vm_ip);
            for id in ids {
                if let Some(mut allocation) = model.allocations.get(&id).cloned() {
                    allocation.clients.clear();
                    refresh_idle(&mut allocation, unix);
                    if let Err(error) = self.store.put_allocation(&allocation).await {
                        tracing::error!(%error, "cannot record an allocation's clients");
                    }
                    model.allocations.insert(id, allocation);
                }
            }
        }
        // What this process heard before a restart or a stall may be stale: client managers get a
        // lease's time to report their clients before anything is released as idle.
        let heard_enough = model.leases_restarted.is_none_or(|since| now.saturating_duration_since(since) > client_timeout);
        let grace = self.config.allocations.idle_grace_seconds;
        let idle = model.allocation_ids(|allocation| {
            heard_enough
                && allocation.idle_since.is_some_and(|since| unix.saturating_sub(since) >= grace)
                && !self.vm_busy(&allocation.vm_ip)
        });
        for id in idle {
            if let Err(error) = self.release_locked(&mut model, &id, "idle past the grace period").await {
                tracing::error!(%error, "cannot release an idle allocation");
            }
        }
        self.forget_ended_jobs_locked(&mut model).await;
    }

    async fn change_config(
        self: Arc<Self>,
        target: String,
        compute_units: Option<u32>,
        memory: Option<u64>,
    ) -> Result<AllocationRecord, ControlError> {
        if compute_units.is_none() && memory.is_none() {
            return Err(ControlError::Invalid("give --compute-units and/or --memory-mib".into()));
        }
        let (id, vm_ip) = {
            let model = self.model.lock().await;
            let allocation = model.find_allocation(&target).ok_or_else(|| ControlError::UnknownAllocation(target.clone()))?;
            (allocation.id.clone(), allocation.vm_ip.clone())
        };
        let vm_lock = self.vm_lock(&vm_ip);
        let _one_at_a_time = vm_lock.lock().await;
        let unsettled = self.model.lock().await.allocations.get(&id).is_some_and(|allocation| !settled(allocation));
        if unsettled {
            self.settle_locked(&id, WhenUnreachable::Retry).await?;
        }
        let size = {
            let mut model = self.model.lock().await;
            let mut allocation = model.running(&id, &target)?.clone();
            if allocation.is_spread() {
                return Err(ControlError::Invalid(format!(
                    "allocation {id} is spread over nodes {} (--spread): resizing it is not supported yet (each node's server would have to change together, or be rolled back together); remove and add the VM with the new size to place it again",
                    node_list(&allocation)
                )));
            }
            let units = compute_units.unwrap_or(allocation.compute_units);
            let memory_mib = memory.unwrap_or(allocation.memory);
            model.check_resize(&allocation, units, memory_mib)?;
            let sm_count = model
                .nodes
                .get(&allocation.node_id)
                .and_then(|node| node.gpus.iter().find(|gpu| gpu.index == allocation.gpu))
                .map_or(0, |gpu| gpu.sm_count);
            let size = SliceSize { compute_units: units, memory: memory_mib, sm_percentage: sm_percentage(units, sm_count) };
            // Stored before the node hears of it: a restart finishes it.
            allocation.pending_resize = Some(size);
            self.store.put_allocation(&allocation).await.map_err(store_error)?;
            model.allocations.insert(id.clone(), allocation);
            size
        };
        failpoint::hit("resize.stored_pending");
        let node_id = self.model.lock().await.allocations.get(&id).map(|allocation| allocation.node_id.clone()).unwrap_or_default();
        match self.resize_on_node(&node_id, &id, size.memory, size.sm_percentage).await {
            Ok(_) => {
                failpoint::hit("resize.node_resized");
                self.commit_resize(&id, size).await
            }
            Err(error) => {
                self.roll_back_resize(&id, &error).await?;
                Err(error)
            }
        }
    }

    /// What the metrics show of the model now.
    pub async fn snapshot(&self) -> Snapshot {
        let status = self.status().await;
        let model = self.model.lock().await;
        let mut snapshot = Snapshot {
            nodes_up: u64::from(status.nodes_up),
            nodes_down: u64::from(status.nodes_down),
            nodes_drained: u64::from(status.nodes_drained),
            gpus: u64::from(status.gpus),
            compute_units_total: status.total_compute_units,
            compute_units_free: status.free_compute_units,
            memory_total_bytes: status.total_memory * MIB,
            memory_free_bytes: status.free_memory * MIB,
            vms: u64::from(status.vms),
            client_managers: u64::from(status.client_managers),
            ..Snapshot::default()
        };
        for node in model.nodes.values().filter(|node| node.record.health == NodeHealth::Up) {
            for gpu in &node.gpus {
                let (units, memory, _) = model.gpu_used(&node.record.node_id, gpu.index, None);
                snapshot.gpus_used.push(GpuUse {
                    node: node.record.node_id.clone(),
                    gpu: gpu.index,
                    compute_units_total: u64::from(gpu.sm_count),
                    compute_units_allocated: u64::from(units),
                    memory_total_bytes: gpu.memory_bytes,
                    memory_allocated_bytes: memory.saturating_mul(MIB),
                });
            }
        }
        for allocation in model.allocations.values() {
            for (device, placed) in allocation.all_gpus().into_iter().enumerate() {
                snapshot.allocated_gpus.push(AllocatedGpuUse {
                    allocation: allocation.id.clone(),
                    vm: allocation.vm_ip.clone(),
                    device,
                    node: placed.node_id,
                    gpu: placed.index,
                    compute_units: u64::from(allocation.compute_units),
                    memory_bytes: allocation.memory.saturating_mul(MIB),
                });
            }
            match allocation.state {
                AllocationState::Starting => snapshot.allocations_starting += 1,
                AllocationState::Running => snapshot.allocations_running += 1,
            }
            if allocation.pending_resize.is_some() {
                snapshot.allocations_resizing += 1;
            }
            if allocation.pending_move.is_some() {
                snapshot.allocations_moving += 1;
            }
        }
        snapshot
    }

    async fn status(&self) -> ClusterStatus {
        let model = self.model.lock().await;
        let mut status = ClusterStatus {
            version: env!("CARGO_PKG_VERSION").to_string(),
            store: self.store.describe(),
            uptime_seconds: self.started.elapsed().as_secs(),
            nodes_up: 0,
            nodes_down: 0,
            nodes_drained: 0,
            gpus: 0,
            total_compute_units: 0,
            free_compute_units: 0,
            total_memory: 0,
            free_memory: 0,
            vms: u32::try_from(model.vms.len()).unwrap_or(u32::MAX),
            allocations: u32::try_from(model.allocations.len()).unwrap_or(u32::MAX),
            client_managers: u32::try_from(model.client_managers.len()).unwrap_or(u32::MAX),
        };
        for node in model.nodes.values() {
            match node.record.health {
                NodeHealth::Up => status.nodes_up += 1,
                NodeHealth::Down => status.nodes_down += 1,
            }
            if node.record.drained {
                status.nodes_drained += 1;
            }
            if node.record.health != NodeHealth::Up {
                continue;
            }
            for gpu in &node.gpus {
                let (units, memory, _) = model.gpu_used(&node.record.node_id, gpu.index, None);
                status.gpus += 1;
                status.total_compute_units += u64::from(gpu.sm_count);
                status.free_compute_units += u64::from(gpu.sm_count.saturating_sub(units));
                status.total_memory += gpu.memory_bytes >> 20;
                status.free_memory += (gpu.memory_bytes >> 20).saturating_sub(memory);
            }
        }
        status
    }
}

/// Runs the reaper every `period` until the process ends.
pub async fn reap_forever<S: Store>(cluster: Arc<Cluster<S>>, period: Duration) {
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        cluster.reap().await;
    }
}

fn cancelled() -> ControlError {
    ControlError::Invalid("the cluster manager is shutting down".into())
}

impl<S: Store> ClusterNode for ClusterService<S> {
    async fn register(self, _: Context, registration: NodeRegistration) -> Result<RegisterReply, ControlError> {
        detached(self.0.register(registration)).await.unwrap_or_else(|| Err(cancelled()))
    }

    async fn heartbeat(self, _: Context, heartbeat: NodeHeartbeat) -> Result<NodeHeartbeatReply, ControlError> {
        detached(self.0.node_heartbeat(heartbeat)).await.unwrap_or_else(|| Err(cancelled()))
    }
}

impl<S: Store> ClusterClient for ClusterService<S> {
    async fn allocate(self, context: Context, request: AllocateRequest) -> Result<Grant, ControlError> {
        let metrics = self.0.metrics.clone();
        let granted = detached(self.0.allocate(request, context.deadline)).await.unwrap_or_else(|| Err(cancelled()));
        ClusterMetrics::count(if granted.is_ok() { &metrics.placements_granted } else { &metrics.placements_refused });
        granted
    }

    async fn heartbeat(self, _: Context, report: ClientManagerReport) -> Result<ClientHeartbeatReply, ControlError> {
        detached(self.0.client_heartbeat(report)).await.unwrap_or_else(|| Err(cancelled()))
    }

    async fn release(self, _: Context, vm_ip: String, allocation_id: String) -> Result<(), ControlError> {
        detached(self.0.release(vm_ip, allocation_id)).await.unwrap_or_else(|| Err(cancelled()))
    }

    async fn allocate_job(self, context: Context, request: JobAllocateRequest) -> Result<JobGrant, ControlError> {
        detached(self.0.allocate_job(request, context.deadline)).await.unwrap_or_else(|| Err(cancelled()))
    }

    async fn release_job(self, _: Context, vm_ip: String, job: u32) -> Result<Option<String>, ControlError> {
        detached(self.0.release_job(vm_ip, job)).await.unwrap_or_else(|| Err(cancelled()))
    }

    async fn job_capacity(self, _: Context, vm_ip: String, compute_units: u32, memory: u64) -> Result<u32, ControlError> {
        if (compute_units == 0) != (memory == 0) {
            return Err(ControlError::Invalid("a slice names both SMs and memory (or neither: whole GPUs)".into()));
        }
        Ok(jobs::job_capacity(&*self.0.model.lock().await, &vm_ip, compute_units, memory))
    }
}

impl<S: Store> ClusterAdmin for ClusterService<S> {
    async fn status(self, _: Context) -> ClusterStatus {
        self.0.status().await
    }

    async fn list_vms(self, _: Context) -> Vec<VmView> {
        let model = self.0.model.lock().await;
        model
            .vms
            .values()
            .map(|vm| VmView {
                requirement: vm.clone(),
                allocation: model.allocation_for_vm(&vm.vm_ip).cloned(),
                mode: model.allocation_for_vm(&vm.vm_ip).map(|allocation| model.vm_mode(&vm.vm_ip, allocation)),
                client_manager_connected: model.client_managers.contains_key(&vm.vm_ip),
            })
            .collect()
    }

    async fn add_vm(self, _: Context, requirement: VmRequirement) -> Result<(), ControlError> {
        if requirement.vm_ip.is_empty() || requirement.compute_units == 0 || requirement.memory == 0 {
            return Err(ControlError::Invalid("a VM needs an ip, compute units above 0 and memory above 0".into()));
        }
        let cluster = self.0.clone();
        detached(async move {
            let mut model = cluster.model.lock().await;
            cluster.store.put_vm(&requirement).await.map_err(store_error)?;
            tracing::info!(vm = %requirement.vm_ip, host_ip = %requirement.host_ip, compute_units = requirement.compute_units, memory_mib = requirement.memory, gpus = requirement.gpus, spread = requirement.spread, "VM requirement set");
            model.vms.insert(requirement.vm_ip.clone(), requirement);
            Ok(())
        })
        .await
        .unwrap_or_else(|| Err(cancelled()))
    }

    async fn remove_vm(self, _: Context, vm_ip: String) -> Result<(), ControlError> {
        let cluster = self.0.clone();
        detached(async move {
            let mut model = cluster.model.lock().await;
            if !model.vms.contains_key(&vm_ip) {
                return Err(ControlError::UnknownVm(vm_ip));
            }
            if let Some(id) = model.allocation_for_vm(&vm_ip).map(|allocation| allocation.id.clone()) {
                cluster.release_locked(&mut model, &id, "its VM was removed").await?;
            }
            cluster.store.remove_vm(&vm_ip).await.map_err(store_error)?;
            model.vms.remove(&vm_ip);
            tracing::info!(vm = %vm_ip, "VM requirement removed");
            Ok(())
        })
        .await
        .unwrap_or_else(|| Err(cancelled()))
    }

    async fn list_nodes(self, _: Context) -> Vec<NodeView> {
        let model = self.0.model.lock().await;
        let now = Instant::now();
        model.nodes.values().map(|node| model.node_view(node, now)).collect()
    }

    async fn list_allocations(self, _: Context) -> Vec<AllocationRecord> {
        self.0.model.lock().await.allocations.values().cloned().collect()
    }

    async fn change_config(
        self,
        _: Context,
        target: String,
        compute_units: Option<u32>,
        memory: Option<u64>,
    ) -> Result<AllocationRecord, ControlError> {
        detached(self.0.clone().change_config(target, compute_units, memory)).await.unwrap_or_else(|| Err(cancelled()))
    }

    async fn migrate(
        self,
        _: Context,
        target: String,
        to_node: String,
        to_gpu: Option<u32>,
        timeout_ms: u64,
    ) -> Result<MoveReport, ControlError> {
        self.counted_move(target, to_node, to_gpu, None, timeout_ms).await
    }

    async fn migrate_one_gpu(
        self,
        _: Context,
        target: String,
        index: u32,
        to_node: String,
        to_gpu: Option<u32>,
        timeout_ms: u64,
    ) -> Result<MoveReport, ControlError> {
        self.counted_move(target, to_node, to_gpu, Some(index), timeout_ms).await
    }

    async fn checkpoint(
        self,
        _: Context,
        target: String,
        dir: String,
        timeout_ms: u64,
        after: AfterCheckpoint,
    ) -> Result<CheckpointReport, ControlError> {
        detached(self.0.clone().checkpoint(target, dir, timeout_ms, after)).await.unwrap_or_else(|| Err(cancelled()))
    }

    async fn restart_server(self, _: Context, target: String, timeout_ms: u64) -> Result<RestartReport, ControlError> {
        detached(self.0.clone().restart_server(target, timeout_ms)).await.unwrap_or_else(|| Err(cancelled()))
    }

    async fn set_drained(self, _: Context, node_id: String, drained: bool) -> Result<NodeRecord, ControlError> {
        let cluster = self.0.clone();
        detached(async move {
            let mut model = cluster.model.lock().await;
            let node = model.nodes.get_mut(&node_id).ok_or_else(|| ControlError::UnknownNode(node_id.clone()))?;
            let mut record = node.record.clone();
            record.drained = drained;
            cluster.store.put_node(&record).await.map_err(store_error)?;
            node.record = record.clone();
            tracing::info!(node = %node_id, drained, "node drain state changed");
            Ok(record)
        })
        .await
        .unwrap_or_else(|| Err(cancelled()))
    }
}
