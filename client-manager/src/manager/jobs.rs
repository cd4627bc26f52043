//! Batch jobs' GPUs on this node (`docs/design/slurm.md`): the scheduler's plugin asks on the
//! job socket, as root (or a `job_uids` user, by the kernel's credentials), "GPUs of this
//! shape for job X" when a step of the job starts and "job X ended" when the job ends. Each
//! job is a tenant of its own at the cluster manager, `job-<id>@<vm_ip>`; this client manager
//! renews its lease with the node's (so a node that dies takes its jobs' GPUs with it after the
//! lease and idle grace) and retries releases the cluster manager did not hear.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::{Duration, Instant},
};

use flyt_daemon_kit::host::{self, unix_now};
use flyt_protocol::{
    control::cluster::{AllocationClients, ClientManagerReport, ClusterClientClient, JobAllocateRequest, JobGrant, job_tenant},
    handshake::ClientIdentity,
    jobs::{CONTAINER_JOB_BASE, JOB_LIMITS, JobReply, JobRequest, JobShape},
    token::{self, SessionClaims},
};
use tokio::{net::UnixStream, sync::Mutex};

use super::ClientManager;

/// A job's token opens sessions for as long as its allocation exists: the allocation (and its
/// server, which checks the token's allocation id) goes when the job ends.
const JOB_TOKEN_SECONDS: u64 = 366 * 24 * 3600;
/// How long a release waits for the cluster manager before it is left to the retries.
const RELEASE_WAIT: Duration = Duration::from_secs(5);

/// One job's allocation on this node.
#[derive(Clone, Debug)]
struct JobEntry {
    grant: JobGrant,
    /// Who the cluster manager is told uses it (the scheduler's step daemon that asked).
    client: ClientIdentity,
    /// The reply every step of the job gets.
    reply: JobReply,
}

/// The jobs of this node.
#[derive(Default)]
pub struct Jobs {
    jobs: Mutex<BTreeMap<u32, JobEntry>>,
    /// Jobs that ended while the cluster manager did not answer: released at the next heartbeat.
    releases_pending: Mutex<BTreeSet<u32>>,
    /// Job requests in flight per job, so two steps of one job starting at once ask once.
    placing: Mutex<BTreeMap<u32, Arc<Mutex<()>>>>,
}

impl ClientManager {
    /// Serves one connection on the job socket: one request, one reply.
    pub async fn serve_job(self: Arc<Self>, stream: UnixStream) {
        super::serve_one_request(stream, &JOB_LIMITS, "job", |request, uid, peer_pid| self.answer_job(request, uid, peer_pid)).await;
    }

    /// A job request's reply: only root and `job_uids` may ask.
    async fn answer_job(&self, request: JobRequest, uid: Option<u32>, peer_pid: Option<u32>) -> JobReply {
        if !uid.is_some_and(|uid| uid == 0 || self.config.job_uids.contains(&uid)) {
            tracing::warn!(?uid, ?peer_pid, "job request refused: only root and job_uids may ask");
            JobReply::Refused { reason: format!("user {uid:?} may not ask for jobs' GPUs: only root and job_uids may") }
        } else {
            match request {
                JobRequest::Allocate { job, shape } => self.allocate_job(job, shape, peer_pid.unwrap_or(0)).await,
                JobRequest::Release { job } => self.release_job(job).await,
                JobRequest::Capacity { shape } => self.job_capacity(shape).await,
            }
        }
    }

    /// The job's allocation on this node: the one it has, or a new one from the cluster manager.
    async fn allocate_job(&self, job: u32, shape: JobShape, pid: u32) -> JobReply {
        let lock = self.jobs.placing.lock().await.entry(job).or_default().clone();
        let _one_at_a_time = lock.lock().await;
        if let Some(entry) = self.jobs.jobs.lock().await.get(&job) {
            return entry.reply.clone();
        }
        if self.jobs.releases_pending.lock().await.contains(&job) {
            return JobReply::Refused { reason: format!("job {job} already ended on this node") };
        }
        let client = ClientIdentity { hostname: host::hostname(), pid, program: job_label(job), boot_id: host::boot_id() };
        let request = JobAllocateRequest {
            vm_ip: self.config.vm_ip.clone(),
            job,
            gpus: shape.gpus,
            compute_units: shape.compute_units,
            memory: shape.memory_mib,
            client: client.clone(),
        };
        let deadline = Instant::now() + Duration::from_secs(self.config.request_timeout_seconds);
        let answer = self.call_cluster(deadline, |connection, context| {
            let request = request.clone();
            async move { connection.allocate_job(context, request).await }
        });
        let answer = answer.await;
        if !matches!(answer, Ok(Ok(_))) {
            self.jobs.placing.lock().await.remove(&job);
        }
        let grant = match answer {
            Ok(Ok(grant)) => grant,
            Ok(Err(error)) => {
                self.refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(job, %error, "job refused");
                return JobReply::Refused { reason: error.to_string() };
            }
            Err(reason) => {
                self.refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(job, %reason, "job refused: the cluster manager did not answer");
                return JobReply::Refused { reason };
            }
        };
        let claims = SessionClaims { allocation: grant.grant.allocation_id.clone(), expires_at: unix_now() + JOB_TOKEN_SECONDS };
        let token = match token::issue(self.key.as_bytes(), &claims) {
            Ok(token) => token,
            Err(error) => return JobReply::Refused { reason: format!("cannot sign the job's token: {error}") },
        };
        let reply = JobReply::Granted {
            allocation_id: grant.grant.allocation_id.clone(),
            tenant: grant.requirement.vm_ip.clone(),
            address: grant.grant.address.clone(),
            token,
            tls_ca: self.config.tls.ca_file.clone(),
            node_id: grant.node_id.clone(),
            gpus: grant.gpus.clone(),
            compute_units: grant.requirement.compute_units,
            memory_mib: grant.requirement.memory,
        };
        self.granted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(job, allocation = %grant.grant.allocation_id, address = %grant.grant.address, node = %grant.node_id, gpus = ?grant.gpus, "job placed");
        self.jobs.jobs.lock().await.insert(job, JobEntry { grant, client, reply: reply.clone() });
        reply
    }

    /// The job ended: its allocation goes now, or at a later heartbeat when the cluster manager
    /// does not answer now.
    async fn release_job(&self, job: u32) -> JobReply {
        // After a placement of the job under way (a scancel while its step starts): what it got goes.
        let lock = self.jobs.placing.lock().await.entry(job).or_default().clone();
        let _one_at_a_time = lock.lock().await;
        let known = self.jobs.jobs.lock().await.remove(&job).map(|entry| entry.grant.grant.allocation_id);
        self.jobs.placing.lock().await.remove(&job);
        match self.release_at_cluster(job, Instant::now() + RELEASE_WAIT).await {
            Ok(released) => {
                tracing::info!(job, allocation = ?released, "job ended: released");
                JobReply::Released { allocation_id: released.or(known) }
            }
            Err(reason) => {
                tracing::warn!(job, %reason, "job ended, but the cluster manager did not hear it: retrying at each heartbeat");
                self.jobs.releases_pending.lock().await.insert(job);
                JobReply::Released { allocation_id: known }
            }
        }
    }

    /// How many slices of `shape`'s size this node's jobs may hold now (the cluster manager's count).
    async fn job_capacity(&self, shape: JobShape) -> JobReply {
        let vm_ip = self.config.vm_ip.clone();
        let deadline = Instant::now() + Duration::from_secs(self.config.request_timeout_seconds);
        let answer = self
            .call_cluster(deadline, |connection, context| {
                let vm_ip = vm_ip.clone();
                async move { connection.job_capacity(context, vm_ip, shape.compute_units, shape.memory_mib).await }
            })
            .await;
        match answer {
            Ok(Ok(slices)) => JobReply::Capacity { slices },
            Ok(Err(error)) => JobReply::Refused { reason: error.to_string() },
            Err(reason) => JobReply::Refused { reason },
        }
    }

    async fn release_at_cluster(&self, job: u32, deadline: Instant) -> Result<Option<String>, String> {
        let vm_ip = self.config.vm_ip.clone();
        let answer = self
            .call_cluster(deadline, |connection, context| {
                let vm_ip = vm_ip.clone();
                async move { connection.release_job(context, vm_ip, job).await }
            })
            .await?;
        answer.map_err(|error| error.to_string())
    }

    /// One call to the cluster manager until `deadline`, on a new connection when the kept one
    /// outlived a restart of the cluster manager.
    async fn call_cluster<T, F, Fut>(&self, deadline: Instant, call: F) -> Result<T, String>
    where
        F: Fn(ClusterClientClient, tarpc::context::Context) -> Fut,
        Fut: std::future::Future<Output = Result<T, tarpc::client::RpcError>>,
    {
        for attempt in 0..2 {
            let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
            let (connection, fresh) = match tokio::time::timeout(left, self.cluster_client(left)).await {
                Ok(Ok(connection)) => connection,
                Ok(Err(reason)) => return Err(format!("the cluster manager at {} cannot be reached: {reason}", self.cluster)),
                Err(_) => return Err(format!("the cluster manager at {} cannot be reached in time", self.cluster)),
            };
            let mut context = tarpc::context::current();
            context.deadline = deadline;
            match call(connection, context).await {
                Ok(value) => return Ok(value),
                Err(tarpc::client::RpcError::DeadlineExceeded) => {
                    return Err(format!("the cluster manager at {} did not answer within request_timeout_seconds", self.cluster));
                }
                Err(error) => {
                    self.drop_connection().await;
                    if fresh || attempt == 1 {
                        return Err(format!("the cluster manager at {}: {error}", self.cluster));
                    }
                }
            }
        }
        Err(format!("the cluster manager at {} cannot be reached", self.cluster))
    }

    /// Renews each job's lease (its allocation in use by the job) and retries releases left
    /// pending; run with the node's own heartbeat.
    pub(super) async fn job_heartbeats(&self, connection: &ClusterClientClient, limit: Duration) {
        let pending: Vec<u32> = self.jobs.releases_pending.lock().await.iter().copied().collect();
        for job in pending {
            if let Ok(released) = self.release_at_cluster(job, Instant::now() + limit).await {
                tracing::info!(job, allocation = ?released, "released the ended job's allocation");
                self.jobs.releases_pending.lock().await.remove(&job);
            }
        }
        let jobs: Vec<(u32, JobEntry)> = self.jobs.jobs.lock().await.iter().map(|(job, entry)| (*job, entry.clone())).collect();
        for (job, entry) in jobs {
            let allocation_id = entry.grant.grant.allocation_id.clone();
            let report = ClientManagerReport {
                vm_ip: job_tenant(job, &self.config.vm_ip),
                allocations: vec![AllocationClients { allocation_id: allocation_id.clone(), clients: vec![entry.client.clone()] }],
            };
            match connection.heartbeat(flyt_daemon_kit::rpc::deadline(limit), report).await {
                Ok(Ok(reply)) if reply.gone.contains(&allocation_id) => {
                    tracing::warn!(job, allocation = %allocation_id, "the cluster released this job's allocation");
                    let mut jobs = self.jobs.jobs.lock().await;
                    if jobs.get(&job).is_some_and(|kept| kept.grant.grant.allocation_id == allocation_id) {
                        jobs.remove(&job);
                    }
                }
                Ok(Ok(_)) => {}
                Ok(Err(error)) => tracing::warn!(job, "the cluster manager refused a job's heartbeat: {error}"),
                Err(error) => {
                    tracing::debug!(job, "no answer to a job's heartbeat: {error}");
                    return;
                }
            }
        }
    }
}

/// Who a job's client is, as `flytctl list-virt-servers` shows it.
fn job_label(job: u32) -> String {
    match job.checked_sub(CONTAINER_JOB_BASE) {
        Some(device) => format!("kubernetes container (device {device})"),
        None => format!("slurm job {job}"),
    }
}
