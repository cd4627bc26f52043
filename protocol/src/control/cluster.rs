//! The cluster manager's services: one per kind of caller, all on the same listener (the auth
//! handshake names the service). Node managers call [`ClusterNode`], client managers call
//! [`ClusterClient`], `flytctl` calls [`ClusterAdmin`] on the owner-only admin socket.
//!
//! Units: compute units are SMs; memory in the control plane is in MiB (as in Flyt's
//! `vm_required_resources`); GPU totals are in bytes as the driver reports them.

use serde::{Deserialize, Serialize};

use super::rpc_server::SnapshotInfo;
use crate::handshake::ClientIdentity;

/// Flyt's per-VM requirement (`vm_required_resources`): what a client VM gets when it asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmRequirement {
    /// The VM's (client host's) address; the key.
    pub vm_ip: String,
    /// The physical host the VM runs on: placement prefers a GPU node with this `host_ip`.
    pub host_ip: String,
    /// SMs.
    pub compute_units: u32,
    /// Device memory in MiB.
    pub memory: u64,
    /// How many GPUs, each a slice of `compute_units` SMs and `memory` MiB, all on one node
    /// unless `spread`.
    #[serde(default = "one_gpu")]
    pub gpus: u32,
    /// The GPUs may be placed across nodes when no one node has them all (`flytctl vm add
    /// --spread`): one server per node, each in its own address window, the app connected to
    /// all of them.
    #[serde(default)]
    pub spread: bool,
}

fn one_gpu() -> u32 {
    1
}

/// One GPU as its node manager discovered it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// CUDA ordinal on its node (what `flyt-rpc-server --gpu` takes).
    pub index: u32,
    /// Driver UUID, or a made-up one for emulated GPUs.
    pub uuid: String,
    pub name: String,
    /// Total device memory in bytes.
    pub memory_bytes: u64,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Served by `flyt-rpc-server --device emulated` (no real GPU).
    pub emulated: bool,
    /// The other GPUs of its node it reaches peer to peer, and how: placement puts a
    /// several-GPU allocation on GPUs joined by NVLink first.
    #[serde(default)]
    pub links: Vec<GpuLink>,
}

/// A peer-to-peer path from one GPU to another of its node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuLink {
    /// The other GPU's CUDA ordinal.
    pub to: u32,
    pub kind: GpuLinkKind,
}

/// How two GPUs reach each other, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum GpuLinkKind {
    NvLink,
    Pcie,
}

/// A GPU as the cluster manager stores it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuRecord {
    pub node_id: String,
    pub gpu: GpuInfo,
}

/// An rpc-server as its node manager sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerReport {
    pub allocation_id: String,
    pub gpu: u32,
    /// The allocation's other GPUs this server serves after `gpu`, each a slice of the same size.
    #[serde(default)]
    pub extra_gpus: Vec<u32>,
    pub pid: u32,
    /// Where clients connect (`host:port` first, then `unix:/path` when offered).
    pub addresses: Vec<String>,
    pub memory_quota_bytes: u64,
    pub sm_percentage: u32,
    /// Live sessions, from the server's control socket (0 when it did not answer).
    pub sessions: u32,
    /// Device memory its sessions hold, in bytes.
    pub memory_used_bytes: u64,
    /// Where it serves Prometheus metrics (`host:port`), when it does.
    #[serde(default)]
    pub metrics: Option<String>,
}

/// What a node manager sends when it (re)connects.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRegistration {
    pub node_id: String,
    /// The address clients and VMs know this host by (matched against `VmRequirement::host_ip`).
    pub host_ip: String,
    /// `/proc/sys/kernel/random/boot_id`: a client with the same one shares this kernel.
    pub boot_id: String,
    /// Where the node manager serves [`super::node::NodeManagerControl`] (`host:port`).
    pub control_address: String,
    pub gpus: Vec<GpuInfo>,
    /// rpc-servers it runs now (after a restart of either side).
    pub servers: Vec<ServerReport>,
}

/// The cluster manager's answer to a registration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterReply {
    /// Reported servers whose allocation the cluster does not know (or that run where the
    /// allocation is not): stop them.
    pub stop: Vec<super::node::ServerRef>,
    /// How often to send heartbeats, in milliseconds.
    pub heartbeat_interval_ms: u64,
}

/// A node manager's periodic report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeHeartbeat {
    pub node_id: String,
    pub boot_id: String,
    pub servers: Vec<ServerReport>,
}

/// The cluster manager's answer to a node heartbeat.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeHeartbeatReply {
    /// Carry on; stop these servers, whose allocations the cluster no longer holds.
    Ok { stop: Vec<super::node::ServerRef> },
    /// The cluster manager does not know this node (or its boot changed): register again.
    RegisterAgain,
}

/// Where an allocation is in its life. Each state is stored before the step it leads to, so a
/// cluster manager that dies at any point finds, after its restart, what it was doing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum AllocationState {
    /// Placed and stored; its node manager is asked to start the rpc-server. Starting is
    /// idempotent on the node, so a restarted cluster manager finishes the step (the node
    /// reports the server it already runs, or starts it) or, when the node refuses, releases
    /// the allocation.
    #[default]
    Starting,
    /// Its rpc-server is listening.
    Running,
}

/// The size of a slice, as a resize asks for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SliceSize {
    /// SMs.
    pub compute_units: u32,
    /// Device memory in MiB.
    pub memory: u64,
    /// MPS active-thread percentage derived from `compute_units`.
    pub sm_percentage: u32,
}

/// One GPU slice given to one VM, served by one rpc-server. `Default` is a record just placed:
/// `Starting`, with no server, client, session or pending step yet.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationRecord {
    pub id: String,
    pub vm_ip: String,
    pub node_id: String,
    pub gpu: u32,
    /// The allocation's other GPUs on its node, each a slice of the same size: its server
    /// serves `gpu` first, then these, to each session as its devices in that order.
    #[serde(default)]
    pub extra_gpus: Vec<u32>,
    /// SMs of the slice.
    pub compute_units: u32,
    /// Device memory of the slice, in MiB (the rpc-server's exact quota).
    pub memory: u64,
    /// MPS active-thread percentage derived from `compute_units`.
    pub sm_percentage: u32,
    pub state: AllocationState,
    pub addresses: Vec<String>,
    pub pid: u32,
    /// Clients the VM's client manager reports.
    pub clients: Vec<ClientIdentity>,
    /// rpc-server sessions at the last node heartbeat.
    pub sessions: u32,
    /// Unix seconds.
    pub created_at: u64,
    /// Unix seconds since when it has had no client and no session; `None` while in use.
    pub idle_since: Option<u64>,
    /// A resize stored before its node is asked (the GPU keeps room for the larger of the two
    /// sizes meanwhile); cleared when it is committed or rolled back. A restarted cluster
    /// manager finishes it (resizing is idempotent on the node).
    #[serde(default)]
    pub pending_resize: Option<SliceSize>,
    /// Where its rpc-server serves Prometheus metrics (`host:port`), as last reported.
    #[serde(default)]
    pub metrics: Option<String>,
    /// A move to another node stored before its first step (the GPUs of both ends keep room
    /// for the slice meanwhile); cleared when it is finished or rolled back. A restarted
    /// cluster manager rolls a move back while it is `Copying` and finishes it once `Switching`.
    #[serde(default)]
    pub pending_move: Option<PendingMove>,
    /// A spread allocation's servers on further nodes, in the order the app numbers their
    /// devices (after those of `node_id`'s server); empty for an allocation on one node.
    #[serde(default)]
    pub further: Vec<NodeShare>,
}

/// The highest `flyt-rpc-server --address-window`: a spread allocation has at most this many
/// nodes plus one.
pub const MAX_ADDRESS_WINDOW: u32 = 4;

/// One GPU of an allocation, in the order its apps number them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatedGpu {
    pub node_id: String,
    pub index: u32,
}

impl AllocationRecord {
    /// Every GPU of the allocation, in the order its apps number them: its first node's server's
    /// (`gpu`, then `extra_gpus`), then each further node's.
    pub fn all_gpus(&self) -> Vec<AllocatedGpu> {
        let first = std::iter::once(self.gpu)
            .chain(self.extra_gpus.iter().copied())
            .map(|index| AllocatedGpu { node_id: self.node_id.clone(), index });
        let further = self.further.iter().flat_map(|share| {
            std::iter::once(share.gpu)
                .chain(share.extra_gpus.iter().copied())
                .map(|index| AllocatedGpu { node_id: share.node_id.clone(), index })
        });
        first.chain(further).collect()
    }

    /// The nodes running one of its servers, its first node first (both ends of a move under
    /// way included).
    pub fn nodes(&self) -> Vec<String> {
        let mut nodes = vec![self.node_id.clone()];
        for node in self
            .further
            .iter()
            .map(|share| &share.node_id)
            .chain(self.pending_move.iter().flat_map(|pending| [&pending.from_node, &pending.to_node]))
        {
            if !nodes.contains(node) {
                nodes.push(node.clone());
            }
        }
        nodes
    }

    /// Spread over several nodes.
    pub fn is_spread(&self) -> bool {
        !self.further.is_empty()
    }
}

/// A spread allocation's server on one further node: its GPUs there (each a slice of the
/// allocation's size) and what its node manager last reported of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeShare {
    pub node_id: String,
    pub gpu: u32,
    #[serde(default)]
    pub extra_gpus: Vec<u32>,
    /// MPS active-thread percentage of the slice on this node's GPUs.
    pub sm_percentage: u32,
    /// Its server's `--address-window` (1 and up: the first node's server has window 0), so its
    /// device addresses never meet another node's in the app.
    pub address_window: u32,
    /// Empty until its server listens.
    #[serde(default)]
    pub addresses: Vec<String>,
    /// 0 until its server runs.
    #[serde(default)]
    pub pid: u32,
    #[serde(default)]
    pub sessions: u32,
    #[serde(default)]
    pub metrics: Option<String>,
}

/// Where a move between nodes stands; each phase is stored before the steps it leads to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MovePhase {
    /// The target's rpc-server is started and the sessions are checkpointed and restored
    /// there; the record still names the source, where the apps are (paused at most). Rolled
    /// back after a crash or a refusal: the paused apps go on at the source, the target's
    /// server is stopped.
    Copying,
    /// Every session was restored on the target and the record names the target (new apps
    /// are sent there); the apps are released to it and the source's server is stopped.
    /// Finished after a crash.
    Switching,
}

/// A move of an allocation's rpc-server, with its apps, from one GPU to another node's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingMove {
    pub from_node: String,
    pub from_gpu: u32,
    pub to_node: String,
    pub to_gpu: u32,
    /// The slice's MPS active-thread percentage on the target GPU (same SMs, another GPU).
    pub to_sm_percentage: u32,
    pub phase: MovePhase,
    /// An allocation of several GPUs: its other GPUs at the source, and those its server at the
    /// target serves after `to_gpu` (each end holds room on all of them until the move is over).
    #[serde(default)]
    pub from_extra_gpus: Vec<u32>,
    #[serde(default)]
    pub to_extra_gpus: Vec<u32>,
}

impl PendingMove {
    /// Whether GPU `gpu` of node `node_id` runs one of the move's two servers.
    pub fn involves(&self, node_id: &str, gpu: u32) -> bool {
        (self.from_node == node_id && self.from_gpu == gpu) || (self.to_node == node_id && self.to_gpu == gpu)
    }
}

/// One session that moved with its allocation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MovedSession {
    pub snapshot: SnapshotInfo,
    /// Copying the snapshot file from the source node to the target node (0 on one host), and
    /// restoring it on the target, in microseconds.
    pub transfer_us: u64,
    pub restore_us: u64,
    /// The data-plane address its app was sent to.
    pub to: String,
    /// Its device memory went GPU to GPU on one host (the snapshot file held none of it).
    #[serde(default)]
    pub gpu_to_gpu: bool,
}

/// What `migrate` did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveReport {
    /// The allocation as stored after the move (same id, new node, GPU and addresses).
    pub allocation: AllocationRecord,
    pub from_node: String,
    pub from_gpu: u32,
    /// The GPUs the source's server served after `from_gpu` (an allocation of several GPUs).
    #[serde(default)]
    pub from_extra_gpus: Vec<u32>,
    pub sessions: Vec<MovedSession>,
    /// Sessions opened on the source while the move ran that could not follow (with why):
    /// they ended with the source's server.
    pub left_behind: Vec<String>,
    /// From the request to the source's server stopped, in microseconds.
    pub total_us: u64,
}

/// What becomes of the apps after `checkpoint`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AfterCheckpoint {
    /// They go on where they are (the snapshots are backups).
    Resume,
    /// Their sessions end: each app reconnects to its server's address and waits until a server
    /// there restores its snapshot.
    Stop,
}

/// What `checkpoint` did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointReport {
    pub allocation_id: String,
    pub node_id: String,
    /// The folder on that node holding the snapshots.
    pub dir: String,
    pub snapshots: Vec<SnapshotInfo>,
    /// Sessions that could not be checkpointed (their apps go on), with why.
    pub failed: Vec<(u64, String)>,
}

/// What `restart_server` did: the allocation's rpc-server replaced by a fresh process (of the
/// binary its node manager runs now) on the same addresses, its apps carried over.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartReport {
    pub allocation_id: String,
    /// Filled in by the cluster manager (empty in a node manager's answer).
    pub node_id: String,
    pub old_pid: u32,
    pub new_pid: u32,
    /// Where the new server listens: the old server's addresses.
    pub addresses: Vec<String>,
    /// One snapshot per app carried over; each app reconnected (or reconnects) to the new server
    /// with its name.
    pub sessions: Vec<SnapshotInfo>,
    /// From the request to the new server listening, in microseconds.
    pub total_us: u64,
}

/// The client manager asks for the VM's GPU slice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocateRequest {
    pub vm_ip: String,
    /// The app asking (its pid as the kernel reports it, not as it claims).
    pub client: ClientIdentity,
}

/// A client manager asks for a batch job's GPUs on its node (Slurm's `--flyt-gpus`): the
/// cluster manager keeps them as the requirement of tenant [`job_tenant`]`(job, vm_ip)` until
/// [`ClusterClient::release_job`]. `compute_units` and `memory` 0: whole GPUs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobAllocateRequest {
    /// The client manager's own key (its node).
    pub vm_ip: String,
    pub job: u32,
    pub gpus: u32,
    pub compute_units: u32,
    pub memory: u64,
    /// The process asking for the job (the scheduler's step daemon).
    pub client: ClientIdentity,
}

/// A job's allocation: the grant, and what it holds (sizes resolved for whole GPUs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobGrant {
    pub grant: Grant,
    pub requirement: VmRequirement,
    pub node_id: String,
    /// Its GPUs on that node, the first one first.
    pub gpus: Vec<u32>,
}

/// The tenant key of batch job `job` on the node of client manager `vm_ip`: it stands where a
/// VM's ip stands (requirements, allocations, `flytctl list-virt-servers`).
pub fn job_tenant(job: u32, vm_ip: &str) -> String {
    format!("job-{job}@{vm_ip}")
}

/// The job and node of a [`job_tenant`] key; `None` for a VM's ip.
pub fn job_of_tenant(tenant: &str) -> Option<(u32, &str)> {
    let (job, node) = tenant.strip_prefix("job-")?.split_once('@')?;
    Some((job.parse().ok()?, node))
}

/// Where the client goes, with which token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub allocation_id: String,
    /// The address to connect to (a Unix socket when on the same host and offered); for an
    /// allocation spread over nodes, every server's, comma-separated, in the order the app
    /// numbers their devices (as `FLYT_SERVER=a,b`; the token opens a session on each).
    pub address: String,
    pub token: String,
    /// Unix seconds when the token stops opening sessions.
    pub token_expires_at: u64,
    /// Client and server share a kernel: the shared-memory channel may be offered.
    pub same_host: bool,
    /// How the VM reaches its slice: through its ivshmem region when it runs on the
    /// allocation's GPU host, else over the network only.
    pub mode: VmMode,
}

/// How a VM reaches its GPU slice (Flyt's two modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum VmMode {
    /// The VM runs on the allocation's GPU host: calls over the network (TCP to its host),
    /// bulk data through the VM's ivshmem region.
    SharedMemory,
    /// The VM runs elsewhere: every byte over the network.
    RpcOnly,
}

impl VmMode {
    /// The mode of a VM on host `vm_host` served from a node on host `node_host`.
    pub fn between(vm_host: &str, node_host: &str) -> Self {
        if !vm_host.is_empty() && vm_host == node_host { Self::SharedMemory } else { Self::RpcOnly }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::SharedMemory => "shared-mem",
            Self::RpcOnly => "rpc-only",
        }
    }
}

/// The clients of one allocation, as a client manager sees them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationClients {
    pub allocation_id: String,
    pub clients: Vec<ClientIdentity>,
}

/// A client manager's periodic report: its lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientManagerReport {
    pub vm_ip: String,
    pub allocations: Vec<AllocationClients>,
}

/// The cluster manager's answer to a client manager's heartbeat.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientHeartbeatReply {
    /// Reported allocations that no longer exist: forget them (the next request gets a new one).
    pub gone: Vec<String>,
    /// How often to send heartbeats, in milliseconds.
    pub heartbeat_interval_ms: u64,
}

/// Whether a node answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeHealth {
    Up,
    /// Its lease ran out. Its allocations are kept for the node grace period (their servers may
    /// still serve apps; a node manager that returns in time adopts them), then released.
    Down,
}

/// A node as the cluster manager stores it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub node_id: String,
    pub host_ip: String,
    pub boot_id: String,
    pub control_address: String,
    pub health: NodeHealth,
    /// Drained nodes get no new allocations; running ones stay.
    pub drained: bool,
    /// Unix seconds of the last registration.
    pub registered_at: u64,
}

/// One GPU with what is given out of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuUsage {
    pub gpu: GpuInfo,
    pub allocated_compute_units: u32,
    /// MiB.
    pub allocated_memory: u64,
    pub allocations: u32,
}

/// A node for `flytctl list-servernodes`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeView {
    pub node: NodeRecord,
    pub gpus: Vec<GpuUsage>,
    /// Milliseconds since its last heartbeat, as this cluster manager saw it.
    pub last_heartbeat_ms: u64,
}

/// A VM for `flytctl list-vms`: its requirement and the allocation serving it, if any.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmView {
    pub requirement: VmRequirement,
    pub allocation: Option<AllocationRecord>,
    /// The mode the allocation gives the VM (`None` without one).
    pub mode: Option<VmMode>,
    /// Its client manager heartbeats now.
    pub client_manager_connected: bool,
}

/// `flytctl status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub version: String,
    /// `embedded:<path>` or `mongodb`.
    pub store: String,
    pub uptime_seconds: u64,
    pub nodes_up: u32,
    pub nodes_down: u32,
    pub nodes_drained: u32,
    pub gpus: u32,
    pub total_compute_units: u64,
    pub free_compute_units: u64,
    /// MiB.
    pub total_memory: u64,
    /// MiB.
    pub free_memory: u64,
    pub vms: u32,
    pub allocations: u32,
    pub client_managers: u32,
}

/// Why a control call failed. Each message says what to do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error, displaydoc::Display)]
pub enum ControlError {
    /// unknown VM {0}: add its requirement with `flytctl vm add {0} --host-ip ... --compute-units ... --memory-mib ...`
    UnknownVm(String),
    /// unknown node {0}: `flytctl list-servernodes` shows the registered nodes
    UnknownNode(String),
    /// unknown allocation or VM {0}: `flytctl list-virt-servers` shows the running ones
    UnknownAllocation(String),
    /// no GPU can hold this slice: {0}
    NoCapacity(String),
    /// node {node} did not answer: {reason}
    NodeUnreachable { node: String, reason: String },
    /// the rpc-server could not be started: {0}
    Spawn(String),
    /// the rpc-server refused: {0}
    Server(String),
    /// the cluster store failed: {0}
    Store(String),
    /// invalid request: {0}
    Invalid(String),
    /// target full: {0}
    TargetFull(String),
    /// the allocation stays where it was, its apps running there: {0}
    MoveFailed(String),
}

/// Calls node managers make.
#[tarpc::service]
pub trait ClusterNode {
    /// Announces the node, its GPUs and the rpc-servers it runs; the reply says which to stop.
    async fn register(registration: NodeRegistration) -> Result<RegisterReply, ControlError>;
    /// Renews the node's lease and reports its servers' usage.
    async fn heartbeat(heartbeat: NodeHeartbeat) -> Result<NodeHeartbeatReply, ControlError>;
}

/// Calls client managers make.
#[tarpc::service]
pub trait ClusterClient {
    /// The VM's slice (placed and started when it has none), with a fresh token.
    async fn allocate(request: AllocateRequest) -> Result<Grant, ControlError>;
    /// Renews the client manager's lease and reports the clients of its allocations.
    async fn heartbeat(report: ClientManagerReport) -> Result<ClientHeartbeatReply, ControlError>;
    /// Gives an allocation back now.
    async fn release(vm_ip: String, allocation_id: String) -> Result<(), ControlError>;
    /// A batch job's GPUs on the client manager's node (the ones it has when it has them),
    /// placed now or refused now: a scheduler queues jobs itself.
    async fn allocate_job(request: JobAllocateRequest) -> Result<JobGrant, ControlError>;
    /// Job `job` on `vm_ip`'s node ended: its allocation and requirement go; the id of the
    /// allocation it had, if any.
    async fn release_job(vm_ip: String, job: u32) -> Result<Option<String>, ControlError>;
    /// How many slices of `compute_units` SMs and `memory` MiB (0 and 0: whole GPUs) the jobs
    /// of `vm_ip`'s node may hold now: those free on up, undrained nodes plus those its jobs
    /// hold (Kubernetes' device plugin advertises this count, `docs/kubernetes.md`).
    async fn job_capacity(vm_ip: String, compute_units: u32, memory: u64) -> Result<u32, ControlError>;
}

/// Calls `flytctl` makes.
#[tarpc::service]
pub trait ClusterAdmin {
    async fn status() -> ClusterStatus;
    async fn list_vms() -> Vec<VmView>;
    /// Adds or replaces a VM's requirement (a running allocation keeps its size until changed).
    async fn add_vm(requirement: VmRequirement) -> Result<(), ControlError>;
    /// Removes a VM's requirement and releases its allocation.
    async fn remove_vm(vm_ip: String) -> Result<(), ControlError>;
    async fn list_nodes() -> Vec<NodeView>;
    async fn list_allocations() -> Vec<AllocationRecord>;
    /// Resizes a running allocation (by allocation id or VM ip) on its GPU.
    async fn change_config(target: String, compute_units: Option<u32>, memory: Option<u64>) -> Result<AllocationRecord, ControlError>;
    /// Drains (no new allocations) or undrains a node.
    async fn set_drained(node_id: String, drained: bool) -> Result<NodeRecord, ControlError>;
    /// Moves a running allocation (by allocation id or VM ip), its apps included, to node
    /// `to_node` (GPU `to_gpu`, or the one placement picks there; an allocation of several GPUs
    /// to as many GPUs of another node, `to_gpu` first): same id, size and tokens.
    /// Each app is paused for at most `timeout_ms` waiting for its next CUDA call.
    async fn migrate(target: String, to_node: String, to_gpu: Option<u32>, timeout_ms: u64) -> Result<MoveReport, ControlError>;
    /// Moves one GPU of a running allocation of several GPUs (by allocation id or VM ip): its
    /// GPU at `index` is replaced by GPU `to_gpu` of node `to_node` (its own node; `None`: the
    /// one placement picks there), the others kept at their indices; its apps move with it
    /// to a new server of that set (see `docs/design/multi-gpu.md`, "Moves").
    async fn migrate_one_gpu(
        target: String,
        index: u32,
        to_node: String,
        to_gpu: Option<u32>,
        timeout_ms: u64,
    ) -> Result<MoveReport, ControlError>;
    /// Checkpoints every session of a running allocation into folder `dir` on its node, then
    /// lets the apps go on or stops their sessions.
    async fn checkpoint(target: String, dir: String, timeout_ms: u64, after: AfterCheckpoint) -> Result<CheckpointReport, ControlError>;
    /// Replaces a running allocation's (by allocation id or VM ip) rpc-server with a fresh
    /// process on the same addresses (an upgrade of the rpc-server binary, say); its apps pause,
    /// are checkpointed and go on at the new server with every pointer as it was. Each app is
    /// paused for at most `timeout_ms` waiting for its next CUDA call; if one does not pause,
    /// all go on at the old server, which keeps running.
    async fn restart_server(target: String, timeout_ms: u64) -> Result<RestartReport, ControlError>;
}
