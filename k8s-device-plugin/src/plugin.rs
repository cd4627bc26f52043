//! The plugin's work: serving `DevicePlugin` on its socket in the kubelet's device plugin
//! folder, registering with the kubelet (again whenever the kubelet restarts), keeping the
//! advertised devices in step with the Flyt cluster's capacity, placing each container's
//! allocation at `Allocate`, and giving allocations back when their pods are gone.
//!
//! Kubernetes tells a device plugin nothing when a pod ends, so the release is a reconcile, as
//! production plugins do: every `reconcile` period the plugin lists the kubelet's pod resources
//! (`pod-resources/kubelet.sock`, v1 `List`) and releases each container's job whose devices
//! no pod holds any more (after a grace, since the kubelet records a container's devices just
//! after `Allocate`). A device handed out again is released first at its next `Allocate`.

use std::{
    collections::{BTreeMap, BTreeSet},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    pin::Pin,
    sync::Arc,
    time::{Duration, Instant},
};

use flyt_protocol::jobs::{JobReply, JobRequest, JobShape};
use hyper_util::rt::TokioIo;
use tokio::{
    net::{UnixListener, UnixStream},
    sync::{Mutex, mpsc, watch},
};
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tonic::{
    Request, Response, Status,
    transport::{Channel, Endpoint, Server, Uri},
};

use crate::{
    api::{
        deviceplugin::{
            self, AllocateRequest, AllocateResponse, ContainerPreferredAllocationResponse, Device, DevicePluginOptions, Empty,
            ListAndWatchResponse, PreStartContainerRequest, PreStartContainerResponse, PreferredAllocationRequest,
            PreferredAllocationResponse, RegisterRequest,
            device_plugin_server::{DevicePlugin, DevicePluginServer},
            registration_client::RegistrationClient,
        },
        podresources::{ListPodResourcesRequest, pod_resources_lister_client::PodResourcesListerClient},
    },
    devices::{self, Layout, RESOURCE},
};

/// How long one question to the client manager or the kubelet may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the plugin checks that the kubelet and its own socket are still the ones it registered with.
const WATCH_PERIOD: Duration = Duration::from_millis(500);

/// After a start, jobs of device numbers below this (or the advertised ones) that no pod holds
/// are released.
const SWEEP_FLOOR: u32 = 64;

/// The plugin's settings (`flyt-device-plugin --help`).
#[derive(Clone, Debug)]
pub struct Config {
    /// The kubelet's device plugin folder (`kubelet.sock` and the plugins' sockets).
    pub kubelet_dir: PathBuf,
    /// The plugin's socket name in that folder.
    pub socket_name: String,
    /// The kubelet's pod resources socket (for the release reconcile); missing: no reconcile.
    pub pod_resources_socket: PathBuf,
    /// The node's client manager's job socket.
    pub job_socket: PathBuf,
    /// The size of one device: SMs and MiB of one GPU each (0 and 0: whole GPUs).
    pub shape: JobShape,
    pub layout: Layout,
    /// How often the cluster's capacity is asked.
    pub poll: Duration,
    /// How often pod resources are compared with the containers' jobs.
    pub reconcile: Duration,
    /// How long a container's job is kept before its devices must show in pod resources.
    pub release_grace: Duration,
}

/// One container's job.
#[derive(Clone, Debug)]
struct Held {
    devices: BTreeSet<u32>,
    allocation_id: String,
    since: Instant,
}

/// What the advertised list is now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Advertised {
    devices: Vec<u32>,
    healthy: bool,
}

/// The plugin's state, shared by its loops and the gRPC service.
pub struct Plugin {
    config: Config,
    /// Containers' jobs by job number.
    held: Mutex<BTreeMap<u32, Held>>,
    advertised: watch::Sender<Advertised>,
    /// The last capacity the client manager gave (`None`: none yet, or it failed last).
    slices: std::sync::Mutex<Option<u32>>,
}

impl Plugin {
    pub fn new(config: Config) -> Arc<Self> {
        Arc::new(Self {
            config,
            held: Mutex::new(BTreeMap::new()),
            advertised: watch::Sender::new(Advertised::default()),
            slices: std::sync::Mutex::new(None),
        })
    }

    /// Runs the plugin until the process ends: the capacity poll, the reconcile, and the
    /// registration loop (serve, register, wait for a kubelet restart, again).
    pub async fn run(self: Arc<Self>) -> anyhow::Result<()> {
        tokio::spawn(self.clone().poll_capacity());
        tokio::spawn(self.clone().reconcile_loop());
        loop {
            self.clone().serve_and_register().await?;
        }
    }

    fn plugin_socket(&self) -> PathBuf {
        self.config.kubelet_dir.join(&self.config.socket_name)
    }

    /// Serves on a fresh socket, registers, and returns once the kubelet restarted (its socket
    /// re-created, or the plugin's own socket removed, which a starting kubelet does).
    async fn serve_and_register(self: Arc<Self>) -> anyhow::Result<()> {
        let socket = self.plugin_socket();
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).map_err(|error| anyhow::anyhow!("cannot listen on {}: {error}", socket.display()))?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let service = DevicePluginServer::new(Service(self.clone()));
        let mut server = tokio::spawn(Server::builder().add_service(service).serve_with_incoming_shutdown(
            tokio_stream::wrappers::UnixListenerStream::new(listener),
            async {
                let _ = stopped.await;
            },
        ));
        let kubelet_socket = self.config.kubelet_dir.join(deviceplugin::KUBELET_SOCKET);
        let kubelet = loop {
            match self.register(&kubelet_socket).await {
                Ok(()) => break inode(&kubelet_socket),
                Err(reason) => {
                    tracing::warn!(socket = %kubelet_socket.display(), %reason, "registration with the kubelet failed; trying again in 2 s");
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
            if inode(&socket).is_none() {
                break None;
            }
        };
        if kubelet.is_some() {
            tracing::info!(resource = RESOURCE, socket = %socket.display(), "registered with the kubelet");
        }
        let own = inode(&socket);
        while kubelet.is_some() && inode(&kubelet_socket) == kubelet && inode(&socket) == own {
            tokio::time::sleep(WATCH_PERIOD).await;
        }
        tracing::info!("the kubelet restarted (its socket or ours changed): serving and registering again");
        let _ = stop.send(());
        // Open ListAndWatch streams never end by themselves: what a short wait leaves is cut.
        if tokio::time::timeout(Duration::from_secs(2), &mut server).await.is_err() {
            server.abort();
        }
        Ok(())
    }

    async fn register(&self, kubelet_socket: &Path) -> Result<(), String> {
        let channel = unix_channel(kubelet_socket).await?;
        let request = RegisterRequest {
            version: deviceplugin::VERSION.into(),
            endpoint: self.config.socket_name.clone(),
            resource_name: RESOURCE.into(),
            options: Some(options()),
        };
        let mut client = RegistrationClient::new(channel);
        match tokio::time::timeout(ASK_TIMEOUT, client.register(request)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(status)) => Err(format!("the kubelet refused: {}", status.message())),
            Err(_) => Err("the kubelet did not answer".into()),
        }
    }

    /// Asks the client manager for the capacity every `poll` and updates the advertised list.
    async fn poll_capacity(self: Arc<Self>) {
        let mut failing = false;
        loop {
            let answer = self.ask(JobRequest::Capacity { shape: self.config.shape }).await;
            let slices = match answer {
                Ok(JobReply::Capacity { slices }) => Some(slices),
                // Said once per outage, not at every poll.
                Ok(other) if !failing => {
                    tracing::warn!(?other, "the client manager gave no capacity: the devices are unhealthy until it does");
                    None
                }
                Err(reason) if !failing => {
                    tracing::warn!(%reason, "the client manager cannot be asked: the devices are unhealthy until it can");
                    None
                }
                Ok(_) | Err(_) => None,
            };
            if failing && slices.is_some() {
                tracing::info!("the client manager answers again: the devices are healthy");
            }
            failing = slices.is_none();
            *self.slices.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = slices;
            self.refresh().await;
            tokio::time::sleep(self.config.poll).await;
        }
    }

    /// Recomputes the advertised list from the last capacity and the held devices.
    async fn refresh(&self) {
        let held: BTreeSet<u32> = self.held.lock().await.values().flat_map(|held| held.devices.iter().copied()).collect();
        let slices = *self.slices.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        self.advertised.send_if_modified(|current| {
            let next = match slices {
                Some(slices) => Advertised { devices: devices::advertised(slices, &held), healthy: true },
                // Unknown capacity: the same devices, none handed out.
                None => Advertised {
                    devices: devices::advertised(0, &held)
                        .into_iter()
                        .chain(current.devices.iter().copied())
                        .collect::<BTreeSet<_>>()
                        .into_iter()
                        .collect(),
                    healthy: false,
                },
            };
            if *current == next {
                return false;
            }
            tracing::info!(devices = next.devices.len(), healthy = next.healthy, "advertised devices changed");
            *current = next;
            true
        });
    }

    /// Every `reconcile`: releases the jobs of containers the kubelet no longer lists.
    async fn reconcile_loop(self: Arc<Self>) {
        let mut swept = false;
        loop {
            tokio::time::sleep(self.config.reconcile).await;
            if !self.config.pod_resources_socket.exists() {
                continue;
            }
            match self.in_use().await {
                Ok(in_use) => {
                    // Once the capacity is known, so the advertised numbers are too.
                    let capacity_known = self.slices.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).is_some();
                    if !swept && capacity_known {
                        self.adopt_and_sweep(&in_use).await;
                        swept = true;
                    }
                    self.release_unused(&in_use).await;
                }
                Err(reason) => tracing::warn!(%reason, "cannot list the kubelet's pod resources; releases wait"),
            }
        }
    }

    /// The device sets of running containers, from the kubelet's pod resources.
    async fn in_use(&self) -> Result<Vec<BTreeSet<u32>>, String> {
        let channel = unix_channel(&self.config.pod_resources_socket).await?;
        let mut client = PodResourcesListerClient::new(channel);
        let listed = match tokio::time::timeout(ASK_TIMEOUT, client.list(ListPodResourcesRequest {})).await {
            Ok(Ok(listed)) => listed.into_inner(),
            Ok(Err(status)) => return Err(format!("List failed: {}", status.message())),
            Err(_) => return Err("the kubelet did not answer List".into()),
        };
        Ok(listed
            .pod_resources
            .iter()
            .flat_map(|pod| &pod.containers)
            .flat_map(|container| &container.devices)
            .filter(|devices| devices.resource_name == RESOURCE)
            .map(|devices| devices.device_ids.iter().filter_map(|id| devices::device_index(id)).collect::<BTreeSet<u32>>())
            .filter(|set| !set.is_empty())
            .collect())
    }

    /// After a start: running containers' jobs are taken back into the list, and any other job
    /// a previous run may have left at the client manager (one per device number) is released.
    async fn adopt_and_sweep(&self, in_use: &[BTreeSet<u32>]) {
        let mut live: BTreeSet<u32> = BTreeSet::new();
        {
            let mut held = self.held.lock().await;
            for devices in in_use {
                let Some(job) = devices::job_of(devices) else { continue };
                live.insert(job);
                held.entry(job).or_insert_with(|| Held { devices: devices.clone(), allocation_id: String::new(), since: Instant::now() });
            }
            live.extend(held.keys().copied());
        }
        // The numbers a previous run could have handed out: those advertised now, and at least
        // the first SWEEP_FLOOR (its capacity may have been higher).
        let top = self.advertised.borrow().devices.iter().copied().max().map_or(0, |top| top + 1).max(SWEEP_FLOOR);
        for job in (0..top).map(|index| devices::JOB_BASE + index).filter(|job| !live.contains(job)) {
            if let Ok(JobReply::Released { allocation_id: Some(id) }) = self.ask(JobRequest::Release { job }).await {
                tracing::info!(job, allocation = %id, "released a job a previous run left");
            }
        }
        self.refresh().await;
    }

    async fn release_unused(&self, in_use: &[BTreeSet<u32>]) {
        let used: BTreeSet<u32> = in_use.iter().flatten().copied().collect();
        let gone: Vec<u32> = self
            .held
            .lock()
            .await
            .iter()
            .filter(|(_, held)| held.since.elapsed() >= self.config.release_grace && held.devices.is_disjoint(&used))
            .map(|(job, _)| *job)
            .collect();
        for job in gone {
            self.release(job, "its pod is gone").await;
        }
        self.refresh().await;
    }

    /// Gives job `job`'s allocation back; forgets it once the client manager answered.
    async fn release(&self, job: u32, why: &str) {
        let known = self.held.lock().await.get(&job).map(|held| held.allocation_id.clone());
        match self.ask(JobRequest::Release { job }).await {
            Ok(JobReply::Released { allocation_id }) => {
                tracing::info!(job, allocation = ?allocation_id.or(known), why, "released");
                self.held.lock().await.remove(&job);
            }
            Ok(other) => tracing::warn!(job, ?other, "the client manager did not release; trying again at the next reconcile"),
            Err(reason) => tracing::warn!(job, %reason, "cannot release now; trying again at the next reconcile"),
        }
    }

    /// One container: its earlier holders released, then its own job placed.
    async fn allocate_container(&self, ids: &[String]) -> Result<(u32, JobReply), Status> {
        let mut wanted = BTreeSet::new();
        for id in ids {
            let index = devices::device_index(id).ok_or_else(|| Status::invalid_argument(format!("{id:?} is not a {RESOURCE} device")))?;
            wanted.insert(index);
        }
        let job = devices::job_of(&wanted).ok_or_else(|| Status::invalid_argument("a container asked for no devices"))?;
        let gpus = u32::try_from(wanted.len()).map_err(|_| Status::invalid_argument("too many devices"))?;
        if gpus > flyt_protocol::jobs::MAX_JOB_GPUS {
            return Err(Status::invalid_argument(format!(
                "{gpus} devices: a container may have at most {}",
                flyt_protocol::jobs::MAX_JOB_GPUS
            )));
        }
        // The kubelet hands out only devices no running container holds: whatever job held
        // these devices before belongs to a container that is gone.
        let stale: Vec<u32> =
            self.held.lock().await.iter().filter(|(_, held)| !held.devices.is_disjoint(&wanted)).map(|(job, _)| *job).collect();
        for old in stale.iter().copied().chain(std::iter::once(job)) {
            match self.ask(JobRequest::Release { job: old }).await {
                Ok(JobReply::Released { .. }) => {
                    self.held.lock().await.remove(&old);
                }
                Ok(other) => return Err(Status::unavailable(format!("cannot release the devices' earlier job {old}: {other:?}"))),
                Err(reason) => return Err(Status::unavailable(format!("the node's client manager: {reason}"))),
            }
        }
        let shape = JobShape { gpus, ..self.config.shape };
        let reply = self
            .ask(JobRequest::Allocate { job, shape })
            .await
            .map_err(|reason| Status::unavailable(format!("the node's client manager: {reason}")))?;
        match &reply {
            JobReply::Granted { allocation_id, .. } => {
                tracing::info!(job, allocation = %allocation_id, devices = ?ids, "container's allocation placed");
                let held = Held { devices: wanted, allocation_id: allocation_id.clone(), since: Instant::now() };
                self.held.lock().await.insert(job, held);
                Ok((job, reply))
            }
            JobReply::Refused { reason } => Err(Status::resource_exhausted(format!("no Flyt GPUs for the container: {reason}"))),
            other => Err(Status::internal(format!("the client manager answered {other:?}"))),
        }
    }

    /// One request on the job socket (blocking I/O on a blocking thread, bounded).
    async fn ask(&self, request: JobRequest) -> Result<JobReply, String> {
        let socket = self.config.job_socket.clone();
        let asked = tokio::task::spawn_blocking(move || {
            let mut stream = std::os::unix::net::UnixStream::connect(&socket).map_err(|error| format!("{}: {error}", socket.display()))?;
            stream.set_read_timeout(Some(ASK_TIMEOUT)).map_err(|error| error.to_string())?;
            stream.set_write_timeout(Some(ASK_TIMEOUT)).map_err(|error| error.to_string())?;
            flyt_protocol::jobs::ask(&mut stream, &request).map_err(|error| format!("{}: {error}", socket.display()))
        });
        asked.await.map_err(|error| format!("the request's thread failed: {error}"))?
    }
}

fn options() -> DevicePluginOptions {
    DevicePluginOptions { pre_start_required: false, get_preferred_allocation_available: true }
}

/// A file's identity (device and inode), to see it re-created; `None` when missing.
fn inode(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|metadata| (metadata.dev(), metadata.ino()))
}

/// A gRPC channel over a Unix socket (the kubelet's sockets), connected within the ask timeout.
pub async fn unix_channel(path: &Path) -> Result<Channel, String> {
    let path = path.to_path_buf();
    let endpoint = Endpoint::try_from("http://kubelet.invalid").map_err(|error| error.to_string())?.connect_timeout(ASK_TIMEOUT);
    let connect = endpoint.connect_with_connector(tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move { UnixStream::connect(path).await.map(TokioIo::new) }
    }));
    match tokio::time::timeout(ASK_TIMEOUT, connect).await {
        Ok(Ok(channel)) => Ok(channel),
        Ok(Err(error)) => Err(format!("cannot connect: {error}")),
        Err(_) => Err("cannot connect in time".into()),
    }
}

/// The `DevicePlugin` service the kubelet calls.
struct Service(Arc<Plugin>);

type DeviceStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Service {
    type ListAndWatchStream = DeviceStream;

    async fn get_device_plugin_options(&self, _: Request<Empty>) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    async fn list_and_watch(&self, _: Request<Empty>) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let mut changes = self.0.advertised.subscribe();
        let (sender, receiver) = mpsc::channel(4);
        tokio::spawn(async move {
            loop {
                let now = changes.borrow_and_update().clone();
                let health = if now.healthy { deviceplugin::HEALTHY } else { deviceplugin::UNHEALTHY };
                let list = now
                    .devices
                    .iter()
                    .map(|index| Device { id: devices::device_id(*index), health: health.into(), topology: None })
                    .collect();
                if sender.send(Ok(ListAndWatchResponse { devices: list })).await.is_err() || changes.changed().await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let container_responses = request
            .into_inner()
            .container_requests
            .iter()
            .map(|wanted| {
                let size = usize::try_from(wanted.allocation_size).unwrap_or(0);
                ContainerPreferredAllocationResponse {
                    device_i_ds: devices::preferred(&wanted.available_device_i_ds, &wanted.must_include_device_i_ds, size),
                }
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse { container_responses }))
    }

    async fn allocate(&self, request: Request<AllocateRequest>) -> Result<Response<AllocateResponse>, Status> {
        let mut granted: Vec<u32> = Vec::new();
        let mut container_responses = Vec::new();
        for container in &request.into_inner().container_requests {
            let answer = self.0.allocate_container(&container.devices_ids).await.and_then(|(job, reply)| {
                granted.push(job);
                devices::container_response(&self.0.config.layout, &reply).ok_or_else(|| Status::internal("no grant"))
            });
            match answer {
                Ok(response) => container_responses.push(response),
                Err(status) => {
                    // The whole request fails (the kubelet's rule): what it got so far goes back.
                    for job in granted {
                        self.0.release(job, "its Allocate failed").await;
                    }
                    self.0.refresh().await;
                    tracing::warn!(reason = %status.message(), "Allocate refused");
                    return Err(status);
                }
            }
        }
        self.0.refresh().await;
        Ok(Response::new(AllocateResponse { container_responses }))
    }

    async fn pre_start_container(&self, _: Request<PreStartContainerRequest>) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}
