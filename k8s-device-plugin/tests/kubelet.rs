//! The device plugin against a test kubelet speaking the real protocol (the vendored
//! `v1beta1` device plugin API and the v1 pod resources API, served and called with tonic),
//! over a Flyt cluster of real processes (`harness`: a cluster manager with its embedded store,
//! node managers with emulated GPUs, the node's client manager with its job socket):
//!
//! - the plugin registers (version, its socket, `flyt.dev/gpu`, GetPreferredAllocation on);
//! - ListAndWatch advertises one device per GPU the node's jobs could get, and a new message
//!   when the cluster's capacity changes (a node joins, is drained, undrained);
//! - GetPreferredAllocation prefers what must be, then the lowest numbers;
//! - Allocate places the container's allocation and returns the environment and mounts that
//!   run a CUDA program through Flyt (run here with exactly those variables); one that does not
//!   fit fails with the cluster's reason and leaves nothing behind; a device handed out again
//!   gets a fresh allocation, the stale one given back;
//! - a container's allocation stays while the kubelet's pod resources list it and goes once
//!   they do not (the reconcile);
//! - a kubelet restart (its socket re-created, the plugin's removed) makes the plugin serve and
//!   register again;
//! - with `--slice`, a device is a slice (four of a 40-SM GPU at 10 SMs); a request whose second
//!   container cannot be placed fails whole, the first's allocation given back; a restarted
//!   plugin keeps a running container's allocation and releases the one a gone pod left; with
//!   the client manager gone, the devices stay listed, unhealthy.

#[cfg(test)]
#[path = "../../cluster-manager/tests/harness/mod.rs"]
#[allow(dead_code, unused_imports, reason = "the harness serves several test binaries; this one uses part of it")]
mod harness;

#[cfg(test)]
mod tests {
    use std::{
        collections::HashMap,
        fs,
        path::{Path, PathBuf},
        process::{Child, Command, Stdio},
        sync::{Arc, Mutex},
        time::{Duration, Instant},
    };

    use flyt_k8s_device_plugin::{
        api::{
            deviceplugin::{
                AllocateRequest, ContainerAllocateRequest, ContainerAllocateResponse, ContainerPreferredAllocationRequest, Empty,
                ListAndWatchResponse, PreferredAllocationRequest, RegisterRequest,
                device_plugin_client::DevicePluginClient,
                registration_server::{Registration, RegistrationServer},
            },
            podresources::{
                AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices, ContainerResources, GetPodResourcesRequest,
                GetPodResourcesResponse, ListPodResourcesRequest, ListPodResourcesResponse, PodResources,
                pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer},
            },
        },
        plugin::unix_channel,
    };
    use flyt_test_support::run_with_timeout;
    use tokio::{
        net::UnixListener,
        runtime::Runtime,
        sync::{mpsc, oneshot},
    };
    use tokio_stream::{StreamExt, wrappers::UnixListenerStream};
    use tonic::{
        Request, Response, Status, Streaming,
        transport::{Server, server::Router},
    };

    use crate::harness::{Cluster, Options, wait_until};

    const SUM: &str = "sum of 1024 values read back: 524800";
    const SOCKET_NAME: &str = "flyt-gpu.sock";
    const FIRST_TENANT: &str = "job-100000000@127.0.0.1";

    /// The kubelet's registration service: each request goes to the test.
    struct TestRegistration(mpsc::UnboundedSender<RegisterRequest>);

    #[tonic::async_trait]
    impl Registration for TestRegistration {
        async fn register(
            &self,
            request: Request<RegisterRequest>,
        ) -> Result<Response<flyt_k8s_device_plugin::api::deviceplugin::Empty>, Status> {
            let _ = self.0.send(request.into_inner());
            Ok(Response::new(Empty {}))
        }
    }

    /// The kubelet's pod resources: what the test says the pods hold.
    #[derive(Clone, Default)]
    struct TestPodResources(Arc<Mutex<Vec<PodResources>>>);

    #[tonic::async_trait]
    impl PodResourcesLister for TestPodResources {
        async fn list(&self, _: Request<ListPodResourcesRequest>) -> Result<Response<ListPodResourcesResponse>, Status> {
            Ok(Response::new(ListPodResourcesResponse { pod_resources: self.0.lock().unwrap().clone() }))
        }
        async fn get_allocatable_resources(
            &self,
            _: Request<AllocatableResourcesRequest>,
        ) -> Result<Response<AllocatableResourcesResponse>, Status> {
            Err(Status::unimplemented("not in the test kubelet"))
        }
        async fn get(&self, _: Request<GetPodResourcesRequest>) -> Result<Response<GetPodResourcesResponse>, Status> {
            Err(Status::unimplemented("not in the test kubelet"))
        }
    }

    impl TestPodResources {
        /// One pod whose containers hold these devices (none: no pod).
        fn set(&self, containers: &[&[&str]]) {
            let containers: Vec<ContainerResources> = containers
                .iter()
                .enumerate()
                .map(|(index, devices)| ContainerResources {
                    name: format!("app-{index}"),
                    devices: vec![ContainerDevices {
                        resource_name: "flyt.dev/gpu".into(),
                        device_ids: devices.iter().map(|id| id.to_string()).collect(),
                        topology: None,
                    }],
                    ..Default::default()
                })
                .collect();
            let pods = if containers.is_empty() {
                Vec::new()
            } else {
                vec![PodResources { name: "cuda-app".into(), namespace: "default".into(), containers, ..Default::default() }]
            };
            *self.0.lock().unwrap() = pods;
        }
    }

    /// Serves `router` on a fresh Unix socket at `path` until the sender is used or dropped.
    fn serve(runtime: &Runtime, path: &Path, router: Router) -> oneshot::Sender<()> {
        let _ = fs::remove_file(path);
        let listener = runtime.block_on(async { UnixListener::bind(path) }).unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        runtime.spawn(router.serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
            let _ = stopped.await;
        }));
        stop
    }

    fn registration(sender: &mpsc::UnboundedSender<RegisterRequest>) -> Router {
        Server::builder().add_service(RegistrationServer::new(TestRegistration(sender.clone())))
    }

    /// The test kubelet's registration side.
    struct TestKubelet {
        dir: PathBuf,
        registrations: mpsc::UnboundedReceiver<RegisterRequest>,
        sender: mpsc::UnboundedSender<RegisterRequest>,
        stop: Option<oneshot::Sender<()>>,
    }

    impl TestKubelet {
        fn start(runtime: &Runtime, dir: &Path) -> Self {
            fs::create_dir_all(dir).unwrap();
            let (sender, registrations) = mpsc::unbounded_channel();
            let stop = serve(runtime, &dir.join("kubelet.sock"), registration(&sender));
            Self { dir: dir.to_path_buf(), registrations, sender, stop: Some(stop) }
        }

        /// As a restarting kubelet does: its socket goes and comes back, plugins' sockets are removed.
        fn restart(&mut self, runtime: &Runtime) {
            let _ = self.stop.take().map(|stop| stop.send(()));
            for entry in fs::read_dir(&self.dir).unwrap().flatten() {
                fs::remove_file(entry.path()).unwrap();
            }
            self.stop = Some(serve(runtime, &self.dir.join("kubelet.sock"), registration(&self.sender)));
        }

        fn next_registration(&mut self, runtime: &Runtime, within: Duration) -> RegisterRequest {
            runtime
                .block_on(async { tokio::time::timeout(within, self.registrations.recv()).await })
                .unwrap_or_else(|_| panic!("no registration within {within:?}"))
                .unwrap()
        }
    }

    /// The plugin process; stopped (and its log shown on failure) when dropped.
    struct PluginProcess {
        child: Child,
        log: PathBuf,
    }

    impl Drop for PluginProcess {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
            if std::thread::panicking() {
                eprintln!("===== flyt-device-plugin =====\n{}", fs::read_to_string(&self.log).unwrap_or_default());
            }
        }
    }

    fn device_ids(list: &ListAndWatchResponse) -> Vec<(String, String)> {
        list.devices.iter().map(|device| (device.id.clone(), device.health.clone())).collect()
    }

    fn healthy(ids: &[&str]) -> Vec<(String, String)> {
        ids.iter().map(|id| (id.to_string(), "Healthy".to_string())).collect()
    }

    /// Reads ListAndWatch messages until one lists `wanted`; panics after `within`.
    fn wait_list(runtime: &Runtime, stream: &mut Streaming<ListAndWatchResponse>, wanted: &[(String, String)], within: Duration) {
        let deadline = Instant::now() + within;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match runtime.block_on(async { tokio::time::timeout(left, stream.next()).await }) {
                Ok(Some(Ok(list))) => {
                    let ids = device_ids(&list);
                    if ids == wanted {
                        return;
                    }
                    seen.push(ids);
                }
                other => panic!("ListAndWatch never listed {wanted:?} (saw {seen:?}); then {other:?}"),
            }
        }
    }

    fn allocate(
        runtime: &Runtime,
        client: &mut DevicePluginClient<tonic::transport::Channel>,
        ids: &[&str],
    ) -> Result<ContainerAllocateResponse, Status> {
        let request = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest { devices_ids: ids.iter().map(|id| id.to_string()).collect() }],
        };
        let reply = runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(90), client.allocate(request)).await })
            .expect("Allocate answered in time")?;
        let mut responses = reply.into_inner().container_responses;
        assert_eq!(responses.len(), 1);
        Ok(responses.remove(0))
    }

    /// The tenants of containers' jobs and their allocation ids, as `flytctl list-virt-servers` shows them.
    fn container_allocations(cluster: &Cluster) -> Vec<(String, String)> {
        cluster
            .allocations()
            .iter()
            .filter(|allocation| allocation["vm_ip"].as_str().is_some_and(|tenant| tenant.starts_with("job-1000000")))
            .map(|allocation| (allocation["vm_ip"].as_str().unwrap().to_string(), allocation["id"].as_str().unwrap().to_string()))
            .collect()
    }

    /// Runs the CUDA program as the container would: only `response`'s variables, its mounts'
    /// host paths standing for their container paths (there is no container here).
    fn run_in_container(app: &Path, response: &ContainerAllocateResponse) -> String {
        for mount in &response.mounts {
            assert_eq!(mount.host_path, mount.container_path, "the test maps mounts one to one");
            assert!(mount.read_only, "{mount:?}");
            assert!(Path::new(&mount.host_path).join("libcuda.so.1").exists(), "{mount:?}");
        }
        let envs: HashMap<&String, &String> = response.envs.iter().collect();
        let (code, out, err) = run_with_timeout(Command::new(app).env_clear().envs(envs).arg("0"), Duration::from_secs(60));
        assert_eq!(code, 0, "the app failed:\n{out}\n{err}");
        out
    }

    /// A Flyt cluster of one node (`node-a`: one emulated GPU of 40 SMs and 4096 MiB) with its
    /// client manager's job socket, Flyt's library folder, a CUDA program built against it, and
    /// the test kubelet (registration and pod resources).
    struct Bed {
        cluster: Cluster,
        job_socket: PathBuf,
        lib: PathBuf,
        app: PathBuf,
        plugins: PathBuf,
        pod_resources: PathBuf,
        pods: TestPodResources,
        kubelet: TestKubelet,
        _pod_resources_server: oneshot::Sender<()>,
    }

    impl Bed {
        fn new(runtime: &Runtime) -> Self {
            let mut cluster = Cluster::new(Options::default());
            cluster.start_node("node-a", "127.0.0.1", 40, 4096);
            cluster.wait_node_up("node-a");
            let job_socket = cluster.path("jobs.sock");
            // The job socket serves root and job_uids: the test's own user, whichever it is.
            let uid = std::os::unix::fs::MetadataExt::uid(&fs::metadata("/proc/self").unwrap());
            cluster.start_client_manager_with(
                "127.0.0.1",
                &[
                    ("FLYT_CLIENT_MANAGER_JOB_SOCKET", job_socket.display().to_string()),
                    ("FLYT_CLIENT_MANAGER_JOB_UIDS", format!("[{uid}]")),
                ],
            );
            let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cluster-manager/tests/slurm/app.c");
            let (lib, app) = crate::harness::flyt_lib_and_app(&cluster.path("k8s"), &source);
            let plugins = cluster.path("device-plugins");
            let kubelet = TestKubelet::start(runtime, &plugins);
            let pods = TestPodResources::default();
            let pod_resources = cluster.path("pod-resources.sock");
            let server = serve(runtime, &pod_resources, Server::builder().add_service(PodResourcesListerServer::new(pods.clone())));
            Self { cluster, job_socket, lib, app, plugins, pod_resources, pods, kubelet, _pod_resources_server: server }
        }

        /// Starts the plugin (quick periods, a 1 s release grace) with `extra` arguments; its log is `name`.log.
        fn start_plugin(&self, name: &str, extra: &[&str]) -> PluginProcess {
            let log = self.cluster.path(&format!("{name}.log"));
            let child = Command::new(env!("CARGO_BIN_EXE_flyt-device-plugin"))
                .arg("--kubelet-dir")
                .arg(&self.plugins)
                .arg("--pod-resources-socket")
                .arg(&self.pod_resources)
                .arg("--job-socket")
                .arg(&self.job_socket)
                .arg("--lib-dir")
                .arg(&self.lib)
                .args(["--poll-ms", "200", "--reconcile-ms", "300", "--release-grace-ms", "1000"])
                .args(extra)
                .env("FLYT_LOG", "info")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(fs::File::create(&log).unwrap())
                .spawn()
                .unwrap();
            PluginProcess { child, log }
        }

        fn connect(&self, runtime: &Runtime) -> DevicePluginClient<tonic::transport::Channel> {
            DevicePluginClient::new(runtime.block_on(unix_channel(&self.plugins.join(SOCKET_NAME))).unwrap())
        }
    }

    #[test]
    fn a_test_kubelet_registers_the_plugin_sees_capacity_and_runs_cuda_through_allocate() {
        let runtime = Runtime::new().unwrap();
        let mut bed = Bed::new(&runtime);
        let _plugin = bed.start_plugin("flyt-device-plugin", &[]);
        let (lib, app, pods) = (bed.lib.clone(), bed.app.clone(), bed.pods.clone());

        // --- Register: the real request's fields.
        let registration = bed.kubelet.next_registration(&runtime, Duration::from_secs(30));
        assert_eq!(registration.version, "v1beta1");
        assert_eq!(registration.resource_name, "flyt.dev/gpu");
        assert_eq!(registration.endpoint, SOCKET_NAME);
        let options = registration.options.expect("options");
        assert!(options.get_preferred_allocation_available && !options.pre_start_required, "{options:?}");
        let mut client = bed.connect(&runtime);
        let options = runtime.block_on(client.get_device_plugin_options(Empty {})).unwrap().into_inner();
        assert!(options.get_preferred_allocation_available, "{options:?}");

        // --- ListAndWatch: one GPU, then two when a node joins, one when it is drained.
        let mut stream = runtime.block_on(client.list_and_watch(Empty {})).unwrap().into_inner();
        wait_list(&runtime, &mut stream, &healthy(&["flyt-gpu-0"]), Duration::from_secs(20));
        bed.cluster.start_node("node-b", "127.0.0.2", 80, 8192);
        bed.cluster.wait_node_up("node-b");
        wait_list(&runtime, &mut stream, &healthy(&["flyt-gpu-0", "flyt-gpu-1"]), Duration::from_secs(20));
        bed.cluster.flytctl_ok(&["drain", "node-b"]);
        wait_list(&runtime, &mut stream, &healthy(&["flyt-gpu-0"]), Duration::from_secs(20));

        // --- GetPreferredAllocation: what must be, then the lowest numbers.
        let ask = |available: &[&str], must: &[&str], size: i32| PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: available.iter().map(|id| id.to_string()).collect(),
                must_include_device_i_ds: must.iter().map(|id| id.to_string()).collect(),
                allocation_size: size,
            }],
        };
        let preferred =
            runtime.block_on(client.get_preferred_allocation(ask(&["flyt-gpu-2", "flyt-gpu-0", "flyt-gpu-1"], &[], 2))).unwrap();
        assert_eq!(preferred.into_inner().container_responses[0].device_i_ds, vec!["flyt-gpu-0", "flyt-gpu-1"]);
        let preferred = runtime
            .block_on(client.get_preferred_allocation(ask(&["flyt-gpu-2", "flyt-gpu-0", "flyt-gpu-1"], &["flyt-gpu-2"], 2)))
            .unwrap();
        assert_eq!(preferred.into_inner().container_responses[0].device_i_ds, vec!["flyt-gpu-2", "flyt-gpu-0"]);

        // --- Allocate: the environment and mounts run a CUDA program through Flyt.
        let response = allocate(&runtime, &mut client, &["flyt-gpu-0"]).unwrap();
        // The kubelet records the container's devices (its pod resources list them).
        pods.set(&[&["flyt-gpu-0"]]);
        assert_eq!(response.envs["LD_LIBRARY_PATH"], lib.display().to_string());
        assert!(!response.envs["FLYT_SERVER"].is_empty() && !response.envs["FLYT_TOKEN"].is_empty(), "{response:?}");
        assert_eq!(response.annotations["flyt.dev/tenant"], FIRST_TENANT);
        assert!(response.annotations["flyt.dev/gpus"].starts_with("node-a GPU 0: 1 GPU(s) of 40 SMs and 4096 MiB"), "{response:?}");
        let first_allocation = response.annotations["flyt.dev/allocation"].clone();
        assert_eq!(container_allocations(&bed.cluster), vec![(FIRST_TENANT.to_string(), first_allocation.clone())]);
        let out = run_in_container(&app, &response);
        assert!(out.contains("device 0: Flyt Emulated Device") && out.contains(SUM) && out.contains("done"), "{out}");
        // Without the returned variables the same program finds no Flyt server.
        let (code, bare, _) =
            run_with_timeout(Command::new(&app).env_clear().env("LD_LIBRARY_PATH", &lib).arg("0"), Duration::from_secs(60));
        assert!(code != 0 || !bare.contains(SUM), "the app ran without the plugin's environment: {bare}");
        // The container's own GPU stays advertised while the cluster has nothing else free.
        let mut fresh = runtime.block_on(bed.connect(&runtime).list_and_watch(Empty {})).unwrap().into_inner();
        wait_list(&runtime, &mut fresh, &healthy(&["flyt-gpu-0"]), Duration::from_secs(10));

        // --- A container the cluster cannot serve (a kubelet acting on an older list): refused
        // with the cluster's reason, nothing left behind.
        let refused = allocate(&runtime, &mut client, &["flyt-gpu-1"]).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused:?}");
        assert!(
            refused.message().contains("no Flyt GPUs for the container") && refused.message().contains("nothing allocated"),
            "{refused:?}"
        );
        assert_eq!(container_allocations(&bed.cluster).len(), 1);
        let unknown = allocate(&runtime, &mut client, &["nvidia.com/gpu-0"]).unwrap_err();
        assert_eq!(unknown.code(), tonic::Code::InvalidArgument, "{unknown:?}");

        // --- Undrained: two again (node-a's GPU is the container's, still counted).
        bed.cluster.flytctl_ok(&["undrain", "node-b"]);
        wait_list(&runtime, &mut stream, &healthy(&["flyt-gpu-0", "flyt-gpu-1"]), Duration::from_secs(20));

        // --- The reconcile: kept while the pod holds the device, released once it does not.
        pods.set(&[&["flyt-gpu-0"]]);
        std::thread::sleep(Duration::from_secs(3));
        assert_eq!(container_allocations(&bed.cluster), vec![(FIRST_TENANT.to_string(), first_allocation.clone())]);
        let gone = Instant::now();
        pods.set(&[]);
        wait_until("the gone pod's allocation released", Duration::from_secs(15), || {
            container_allocations(&bed.cluster).is_empty().then_some(())
        });
        eprintln!("pod gone to release: {:?}", gone.elapsed());

        // --- A device handed out again while its old job is still held: the old one goes first.
        let again = allocate(&runtime, &mut client, &["flyt-gpu-1"]).unwrap();
        let second = again.annotations["flyt.dev/allocation"].clone();
        let third = allocate(&runtime, &mut client, &["flyt-gpu-0", "flyt-gpu-1"])
            .map(|response| response.annotations["flyt.dev/allocation"].clone());
        // Two whole GPUs of one node do not exist here: refused, and the stale job is gone too.
        assert!(third.is_err(), "{third:?}");
        assert!(container_allocations(&bed.cluster).is_empty(), "{:?} (second was {second})", container_allocations(&bed.cluster));
        let fourth = allocate(&runtime, &mut client, &["flyt-gpu-1"]).unwrap();
        assert_ne!(fourth.annotations["flyt.dev/allocation"], second);
        assert_eq!(container_allocations(&bed.cluster).len(), 1);
        assert!(run_in_container(&app, &fourth).contains(SUM));

        // --- The kubelet restarts: the plugin serves and registers again.
        bed.kubelet.restart(&runtime);
        let again = bed.kubelet.next_registration(&runtime, Duration::from_secs(20));
        assert_eq!((again.resource_name.as_str(), again.endpoint.as_str()), ("flyt.dev/gpu", SOCKET_NAME));
        let mut stream = runtime.block_on(bed.connect(&runtime).list_and_watch(Empty {})).unwrap().into_inner();
        wait_list(&runtime, &mut stream, &healthy(&["flyt-gpu-0", "flyt-gpu-1"]), Duration::from_secs(20));
    }

    /// Devices of a slice size, a request with two containers that fails as a whole (what the
    /// first got goes back), and a restarted plugin that keeps a running container's job and
    /// releases the one a gone pod left.
    #[test]
    fn slices_are_devices_a_failed_request_leaves_nothing_and_a_restarted_plugin_keeps_running_containers() {
        let runtime = Runtime::new().unwrap();
        let mut bed = Bed::new(&runtime);
        let plugin = bed.start_plugin("flyt-device-plugin-first", &["--slice", "sms=10,memory=1G"]);
        bed.kubelet.next_registration(&runtime, Duration::from_secs(30));
        let mut client = bed.connect(&runtime);
        let mut stream = runtime.block_on(client.list_and_watch(Empty {})).unwrap().into_inner();
        let four = healthy(&["flyt-gpu-0", "flyt-gpu-1", "flyt-gpu-2", "flyt-gpu-3"]);
        wait_list(&runtime, &mut stream, &four, Duration::from_secs(20));

        // Two containers; the second asks for two GPUs of one node, which node-a does not have.
        let request = AllocateRequest {
            container_requests: vec![
                ContainerAllocateRequest { devices_ids: vec!["flyt-gpu-0".into()] },
                ContainerAllocateRequest { devices_ids: vec!["flyt-gpu-1".into(), "flyt-gpu-2".into()] },
            ],
        };
        let refused = runtime.block_on(client.allocate(request)).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused:?}");
        assert!(container_allocations(&bed.cluster).is_empty(), "{:?}", container_allocations(&bed.cluster));

        // One slice each: a tenth of the SMs, 1 GiB. The kubelet lists the pod's containers.
        bed.pods.set(&[&["flyt-gpu-0"], &["flyt-gpu-1"]]);
        let first = allocate(&runtime, &mut client, &["flyt-gpu-0"]).unwrap();
        assert!(first.annotations["flyt.dev/gpus"].starts_with("node-a GPU 0: 1 GPU(s) of 10 SMs and 1024 MiB"), "{first:?}");
        assert!(run_in_container(&bed.app, &first).contains(SUM));
        let second = allocate(&runtime, &mut client, &["flyt-gpu-1"]).unwrap();
        assert_eq!(container_allocations(&bed.cluster).len(), 2);
        // The containers' own slices are still counted: four devices.
        let mut fresh = runtime.block_on(bed.connect(&runtime).list_and_watch(Empty {})).unwrap().into_inner();
        wait_list(&runtime, &mut fresh, &four, Duration::from_secs(10));
        // The cluster manager names the client a Kubernetes container (the job's heartbeat).
        wait_until("the container named as the allocation's client", Duration::from_secs(10), || {
            let allocation = bed.cluster.allocation_of(FIRST_TENANT)?;
            (allocation["clients"][0]["program"] == "kubernetes container (device 0)").then_some(())
        });

        // The plugin goes away while both containers run; only the first one's pod remains
        // when it comes back.
        drop(plugin);
        bed.pods.set(&[&["flyt-gpu-0"]]);
        let _plugin = bed.start_plugin("flyt-device-plugin-second", &["--slice", "sms=10,memory=1G"]);
        bed.kubelet.next_registration(&runtime, Duration::from_secs(30));
        let kept = first.annotations["flyt.dev/allocation"].clone();
        wait_until("the gone pod's allocation released after the restart", Duration::from_secs(20), || {
            (container_allocations(&bed.cluster) == vec![(FIRST_TENANT.to_string(), kept.clone())]).then_some(())
        });
        assert_ne!(second.annotations["flyt.dev/allocation"], kept);
        // Past the grace, the running container keeps its allocation and its app runs on.
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(container_allocations(&bed.cluster), vec![(FIRST_TENANT.to_string(), kept)]);
        assert!(run_in_container(&bed.app, &first).contains(SUM));
        let mut client = bed.connect(&runtime);
        let mut stream = runtime.block_on(client.list_and_watch(Empty {})).unwrap().into_inner();
        wait_list(&runtime, &mut stream, &four, Duration::from_secs(10));

        // No client manager: the same devices, unhealthy (no new pods), until it is back.
        let manager_socket = bed.cluster.path("client-manager-127.0.0.1.sock");
        bed.cluster.kill_client_manager(&manager_socket);
        let unhealthy: Vec<(String, String)> = four.iter().map(|(id, _)| (id.clone(), "Unhealthy".to_string())).collect();
        wait_list(&runtime, &mut stream, &unhealthy, Duration::from_secs(10));
    }
}
