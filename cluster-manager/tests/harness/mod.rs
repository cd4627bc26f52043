//! A whole cluster of real processes on loopback for the tests: a cluster manager (embedded or
//! MongoDB store), node managers with emulated GPUs, client managers, the rpc-servers they
//! start, and apps (`flyt-client-manager locate --hold-seconds N`).
//!
//! Every wait is bounded; every process is stopped (by pid) when the cluster is dropped, and the
//! daemon logs are printed when a test fails.

use std::{
    collections::BTreeSet,
    fs,
    io::{BufRead, BufReader, Read, Write},
    net::TcpListener,
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use flyt_protocol::{
    device::attr,
    frame::{FrameLimits, read_value, write_value},
    handshake::{ClientIdentity, Hello, HelloReply},
};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};
pub use serde_json::Value;

pub const MIB: u64 = 1 << 20;

fn bin_dir() -> PathBuf {
    match std::env::var_os("FLYT_BIN_DIR") {
        Some(dir) => PathBuf::from(dir),
        // Another crate's tests (the Kubernetes device plugin's) find the daemons beside themselves.
        None => option_env!("CARGO_BIN_EXE_flyt-cluster-manager")
            .map_or_else(flyt_test_support::profile_dir, |exe| Path::new(exe).parent().unwrap().to_path_buf()),
    }
}

pub fn binary(name: &str) -> PathBuf {
    let path = if name == "flyt-rpc-server" {
        std::env::var_os("FLYT_RPC_SERVER_BIN").map(PathBuf::from).unwrap_or_else(|| bin_dir().join(name))
    } else {
        bin_dir().join(name)
    };
    assert!(
        path.exists(),
        "{} is missing: build it first (cargo build -p flyt-cluster-manager -p flyt-node-manager -p flyt-client-manager -p flytctl -p flyt-rpc-server) or set FLYT_BIN_DIR / FLYT_RPC_SERVER_BIN",
        path.display()
    );
    path
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Flyt's library folder at `dir/lib` (links to the libraries this build made) and the C
/// program `source` built against it as `dir/app`: what a scheduler's job runs through Flyt.
#[allow(dead_code, reason = "the scheduler tests use it (slurm, and the device plugin's kubelet), the cluster test does not")]
pub fn flyt_lib_and_app(dir: &Path, source: &Path) -> (PathBuf, PathBuf) {
    let lib = dir.join("lib");
    fs::create_dir_all(&lib).unwrap();
    for (built, name) in
        [("libcudart.so", "libcudart.so.13"), ("libflyt_libcuda.so", "libcuda.so.1"), ("libflyt_nvml_lib.so", "libnvidia-ml.so.1")]
    {
        std::os::unix::fs::symlink(flyt_test_support::artifact(built), lib.join(name)).unwrap();
    }
    let app = dir.join("app");
    let status = Command::new("cc")
        .arg("-O1")
        .arg(source)
        .arg("-o")
        .arg(&app)
        .arg(format!("-L{}", lib.display()))
        .arg("-l:libcuda.so.1")
        .status()
        .unwrap();
    assert!(status.success(), "cc {} failed", source.display());
    (lib, app)
}

pub fn wait_until<T>(what: &str, timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub use flyt_test_support::{scrape_metrics as scrape, series_value};

/// Kills the cluster manager, starts one that dies at `point` of the move `flytctl migrate ARGS`
/// asks for, and starts a plain one after it died there.
pub fn crash_mid_move(cluster: &mut Cluster, point: &str, args: &[&str]) {
    cluster.cluster_manager().kill();
    cluster.start_cluster_manager_with(&[("FLYT_FAILPOINT", point.to_string())]);
    let mut all = vec!["migrate"];
    all.extend_from_slice(args);
    let (code, _, stderr) = cluster.flytctl(&all);
    assert_eq!(code, 3, "{point}: the cluster manager should have died during the move: {stderr}");
    assert!(cluster.cluster_manager().wait_exit(Duration::from_secs(10)).is_some(), "{point}");
    assert!(cluster.log("cluster-manager").contains(&format!("fail point {point} reached")), "{point}");
    cluster.start_cluster_manager();
}

pub fn pid_alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

pub fn signal(pid: u32, signal: Signal) {
    let _ = kill(Pid::from_raw(i32::try_from(pid).unwrap()), signal);
}

/// A daemon started by the test, with its log file.
pub struct Daemon {
    child: Child,
    pub ready_line: String,
}

impl Daemon {
    fn start(name: &str, program: &Path, envs: &[(String, String)], dir: &Path) -> Self {
        let log = dir.join(format!("{name}.log"));
        let mut child = Command::new(program)
            .envs(envs.iter().map(|(key, value)| (key.as_str(), value.as_str())))
            .env("FLYT_LOG", "info")
            .env("FLYT_RPC_WARM_WORKERS", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(fs::OpenOptions::new().create(true).append(true).open(&log).unwrap())
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {}: {error}", program.display()));
        let stdout = child.stdout.take().unwrap();
        let (sender, receiver) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(line)) = lines.next() {
                let _ = sender.send(line);
            }
            for _ in lines {}
        });
        let ready_line = receiver
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("{name} printed no ready line; its log:\n{}", fs::read_to_string(&log).unwrap_or_default()));
        Self { child, ready_line }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The `metrics:<host:port>` its ready line names.
    pub fn metrics_address(&self) -> String {
        let token = self.ready_line.split_whitespace().find_map(|token| token.strip_prefix("metrics:"));
        token.unwrap_or_else(|| panic!("no metrics address in: {}", self.ready_line)).to_string()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits (bounded) for the process to end by itself; its exit status.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    fn terminate(&mut self) {
        signal(self.pid(), Signal::SIGCONT);
        signal(self.pid(), Signal::SIGTERM);
        if self.wait_exit(Duration::from_secs(15)).is_none() {
            self.kill();
        }
    }
}

/// Where the cluster manager keeps its state.
#[derive(Clone, Debug)]
pub enum StoreKind {
    Embedded,
    /// A MongoDB-protocol server at this URI (a database of the test's own is used).
    Mongo(String),
}

impl StoreKind {
    /// The MongoDB store of `FLYT_TEST_MONGODB_URI`, or `None` (with a notice) when it is unset.
    pub fn mongo_from_env(test: &str) -> Option<Self> {
        match std::env::var("FLYT_TEST_MONGODB_URI") {
            Ok(uri) if !uri.is_empty() => Some(Self::Mongo(uri)),
            _ => {
                eprintln!("SKIPPED {test}: FLYT_TEST_MONGODB_URI is unset; run `.ci/mongo-test-server` and export the URI it prints");
                None
            }
        }
    }
}

/// Timeouts of one cluster, short so tests stay quick.
#[derive(Clone, Debug)]
pub struct Options {
    pub store: StoreKind,
    pub heartbeat_ms: u64,
    pub node_timeout_ms: u64,
    pub node_grace_seconds: u64,
    pub client_timeout_ms: u64,
    pub idle_grace_seconds: u64,
    pub request_timeout_seconds: u64,
    /// TLS on every TCP hop between the daemons (files made with the cluster).
    pub tls: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            store: StoreKind::Embedded,
            heartbeat_ms: 200,
            node_timeout_ms: 2000,
            node_grace_seconds: 60,
            client_timeout_ms: 2000,
            idle_grace_seconds: 2,
            request_timeout_seconds: 30,
            tls: false,
        }
    }
}

/// The whole cluster; dropping it stops everything it started.
pub struct Cluster {
    dir: tempfile::TempDir,
    key_file: PathBuf,
    cluster_port: u16,
    options: Options,
    database: String,
    pub cluster_manager: Option<Daemon>,
    nodes: Vec<(String, Option<Daemon>)>,
    client_managers: Vec<Daemon>,
    clients: Vec<Child>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for client in &mut self.clients {
            let _ = client.kill();
            let _ = client.wait();
        }
        for daemon in self.client_managers.iter_mut().chain(self.nodes.iter_mut().filter_map(|(_, daemon)| daemon.as_mut())) {
            daemon.terminate();
        }
        // rpc-servers left by a killed node manager, recorded or not.
        for (pid, _) in self.rpc_servers() {
            signal(pid, Signal::SIGKILL);
        }
        if let Some(daemon) = &mut self.cluster_manager {
            daemon.terminate();
        }
        if std::thread::panicking() {
            let mut logs: Vec<PathBuf> = fs::read_dir(self.dir.path()).unwrap().flatten().map(|entry| entry.path()).collect();
            for node in self.nodes.iter().map(|(node, _)| node) {
                logs.extend(
                    fs::read_dir(self.dir.path().join(node).join("servers")).into_iter().flatten().flatten().map(|entry| entry.path()),
                );
            }
            for log in logs.into_iter().filter(|path| path.extension().is_some_and(|extension| extension == "log")) {
                eprintln!("===== {} =====\n{}", log.display(), fs::read_to_string(&log).unwrap_or_default());
            }
        }
    }
}

pub fn env(pairs: &[(&str, String)]) -> Vec<(String, String)> {
    pairs.iter().map(|(key, value)| (key.to_string(), value.clone())).collect()
}

/// An app asking its client manager for a GPU, not answered yet.
pub struct PendingLocate {
    receiver: mpsc::Receiver<String>,
    pub pid: u32,
}

impl PendingLocate {
    /// The client manager's answer (JSON), waiting at most `timeout`.
    pub fn answer(self, timeout: Duration) -> Value {
        let line = self.receiver.recv_timeout(timeout).unwrap_or_else(|_| panic!("locate printed nothing within {timeout:?}"));
        serde_json::from_str(&line).unwrap_or_else(|_| panic!("locate printed {line:?}"))
    }

    /// Whether the answer has come (without consuming it).
    pub fn answered_within(&self, timeout: Duration) -> Option<String> {
        self.receiver.recv_timeout(timeout).ok()
    }
}

impl Cluster {
    pub fn new(options: Options) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let key_file = dir.path().join("cluster.key");
        fs::write(&key_file, "test-cluster-key-0123456789abcdef\n").unwrap();
        fs::set_permissions(&key_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        let mut cluster = Self {
            dir,
            key_file,
            cluster_port: free_port(),
            options,
            database: format!("flyt_cluster_test_{}_{nanos}", std::process::id()),
            cluster_manager: None,
            nodes: Vec::new(),
            client_managers: Vec::new(),
            clients: Vec::new(),
        };
        if cluster.options.tls {
            flyt_daemon_kit::tls::generate(&cluster.path("tls"), &["127.0.0.1".into(), "127.0.0.2".into(), "localhost".into()]).unwrap();
        }
        cluster.start_cluster_manager();
        cluster
    }

    /// The `[tls]` settings of a daemon whose variables start with `prefix`, when TLS is on.
    fn tls_env(&self, prefix: &str) -> Vec<(String, String)> {
        if !self.options.tls {
            return Vec::new();
        }
        [("CA_FILE", flyt_daemon_kit::tls::CA_CERT), ("CERT_FILE", flyt_daemon_kit::tls::CERT), ("KEY_FILE", flyt_daemon_kit::tls::KEY)]
            .into_iter()
            .map(|(key, file)| (format!("{prefix}_TLS_{key}"), self.path("tls").join(file).display().to_string()))
            .collect()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The cluster manager's TCP address (node and client managers; flytctl from other hosts).
    pub fn cluster_address(&self) -> String {
        format!("127.0.0.1:{}", self.cluster_port)
    }

    /// flytctl from "another host": to the cluster manager's TCP address, with `tls` (a folder
    /// made by `tls-init`, or none), never through the admin socket.
    pub fn remote_flytctl(&self, tls: Option<&std::path::Path>, args: &[&str]) -> (i32, String, String) {
        let mut settings = vec![
            ("FLYTCTL_ADMIN_SOCKET", self.path("no-such-admin.sock").into_os_string()),
            ("FLYTCTL_CLUSTER_MANAGER", self.cluster_address().into()),
        ];
        if let Some(dir) = tls {
            settings.extend([
                ("FLYTCTL_TLS_CA", dir.join(flyt_daemon_kit::tls::CA_CERT).into_os_string()),
                ("FLYTCTL_TLS_CERT", dir.join(flyt_daemon_kit::tls::CERT).into_os_string()),
                ("FLYTCTL_TLS_KEY", dir.join(flyt_daemon_kit::tls::KEY).into_os_string()),
            ]);
        }
        self.flytctl_with(&settings, args)
    }

    pub fn start_cluster_manager(&mut self) {
        self.start_cluster_manager_with(&[]);
    }

    /// Starts the cluster manager with extra environment (e.g. `FLYT_FAILPOINT`).
    pub fn start_cluster_manager_with(&mut self, extra: &[(&str, String)]) {
        let options = &self.options;
        let mut envs = env(&[
            ("FLYT_CLUSTER_MANAGER_LISTEN", format!("127.0.0.1:{}", self.cluster_port)),
            ("FLYT_CLUSTER_MANAGER_ADMIN_SOCKET", self.path("admin.sock").display().to_string()),
            ("FLYT_CLUSTER_MANAGER_CLUSTER_KEY_FILE", self.key_file.display().to_string()),
            ("FLYT_CLUSTER_MANAGER_STATE_DIR", self.path("cluster-manager").display().to_string()),
            ("FLYT_CLUSTER_MANAGER_LEASES_HEARTBEAT_INTERVAL_MS", options.heartbeat_ms.to_string()),
            ("FLYT_CLUSTER_MANAGER_LEASES_NODE_TIMEOUT_MS", options.node_timeout_ms.to_string()),
            ("FLYT_CLUSTER_MANAGER_LEASES_NODE_GRACE_SECONDS", options.node_grace_seconds.to_string()),
            ("FLYT_CLUSTER_MANAGER_LEASES_CLIENT_TIMEOUT_MS", options.client_timeout_ms.to_string()),
            ("FLYT_CLUSTER_MANAGER_ALLOCATIONS_IDLE_GRACE_SECONDS", options.idle_grace_seconds.to_string()),
            ("FLYT_CLUSTER_MANAGER_METRICS_LISTEN", "127.0.0.1:0".into()),
        ]);
        if let StoreKind::Mongo(uri) = &options.store {
            envs.extend(env(&[
                ("FLYT_CLUSTER_MANAGER_STORE_URI", uri.clone()),
                ("FLYT_CLUSTER_MANAGER_STORE_DATABASE", self.database.clone()),
            ]));
        }
        envs.extend(self.tls_env("FLYT_CLUSTER_MANAGER"));
        if options.tls {
            envs.extend(env(&[("FLYT_CLUSTER_MANAGER_ADMIN_OVER_TCP", "true".into())]));
        }
        envs.extend(env(extra));
        let daemon = Daemon::start("cluster-manager", &binary("flyt-cluster-manager"), &envs, self.dir.path());
        assert!(daemon.ready_line.starts_with("flyt-cluster-manager listening on 127.0.0.1:"), "{}", daemon.ready_line);
        self.cluster_manager = Some(daemon);
    }

    pub fn cluster_manager(&mut self) -> &mut Daemon {
        self.cluster_manager.as_mut().expect("a cluster manager was started")
    }

    pub fn log(&self, name: &str) -> String {
        fs::read_to_string(self.path(&format!("{name}.log"))).unwrap_or_default()
    }

    fn node_env(&self, node: &str, host_ip: &str, sms: u32, memory_mib: u64) -> Vec<(String, String)> {
        env(&[
            ("FLYT_NODE_MANAGER_NODE_ID", node.into()),
            ("FLYT_NODE_MANAGER_CLUSTER_MANAGER", format!("127.0.0.1:{}", self.cluster_port)),
            ("FLYT_NODE_MANAGER_HOST_IP", host_ip.into()),
            ("FLYT_NODE_MANAGER_ADVERTISE_HOST", "127.0.0.1".into()),
            ("FLYT_NODE_MANAGER_CONTROL_LISTEN", "127.0.0.1:0".into()),
            ("FLYT_NODE_MANAGER_CLUSTER_KEY_FILE", self.key_file.display().to_string()),
            ("FLYT_NODE_MANAGER_STATE_DIR", self.path(node).display().to_string()),
            ("FLYT_NODE_MANAGER_DEVICE", "emulated".into()),
            ("FLYT_NODE_MANAGER_EMULATED_GPUS", format!("[{{ name = \"Emulated {node}\", memory_mib = {memory_mib}, sm_count = {sms} }}]")),
            ("FLYT_NODE_MANAGER_RPC_SERVER_BINARY", binary("flyt-rpc-server").display().to_string()),
            ("FLYT_NODE_MANAGER_RPC_SERVER_LISTEN_HOST", "127.0.0.1".into()),
            ("FLYT_NODE_MANAGER_RPC_SERVER_SOCKET_DIR", String::new()),
            ("FLYT_NODE_MANAGER_RPC_SERVER_STOP_GRACE_SECONDS", "0".into()),
            ("FLYT_NODE_MANAGER_RPC_SERVER_METRICS_HOST", "127.0.0.1".into()),
            ("FLYT_NODE_MANAGER_METRICS_LISTEN", "127.0.0.1:0".into()),
        ])
    }

    pub fn start_node(&mut self, node: &str, host_ip: &str, sms: u32, memory_mib: u64) {
        self.start_node_with(node, host_ip, sms, memory_mib, &[]);
    }

    /// Starts a node manager with extra environment (e.g. `FLYT_FAILPOINT`).
    pub fn start_node_with(&mut self, node: &str, host_ip: &str, sms: u32, memory_mib: u64, extra: &[(&str, String)]) {
        let mut envs = self.node_env(node, host_ip, sms, memory_mib);
        envs.extend(self.tls_env("FLYT_NODE_MANAGER"));
        envs.extend(env(extra));
        let daemon = Daemon::start(node, &binary("flyt-node-manager"), &envs, self.dir.path());
        match self.nodes.iter_mut().find(|(name, _)| name == node) {
            Some(entry) => entry.1 = Some(daemon),
            None => self.nodes.push((node.to_string(), Some(daemon))),
        }
    }

    pub fn node(&mut self, node: &str) -> &mut Daemon {
        self.nodes.iter_mut().find(|(name, _)| name == node).and_then(|(_, daemon)| daemon.as_mut()).unwrap()
    }

    /// The metrics address of the client manager whose socket is `socket`.
    pub fn client_manager_metrics(&self, socket: &Path) -> String {
        let daemon = self.client_managers.iter().find(|daemon| {
            daemon.ready_line.ends_with(&format!("unix:{}", socket.display()))
                || daemon.ready_line.contains(&format!("unix:{} ", socket.display()))
        });
        daemon.expect("a client manager on this socket").metrics_address()
    }

    /// Starts the client manager of VM `vm_ip`; returns its socket.
    pub fn start_client_manager(&mut self, vm_ip: &str) -> PathBuf {
        self.start_client_manager_with(vm_ip, &[])
    }

    /// Starts the client manager of VM `vm_ip` with extra environment; returns its socket.
    pub fn start_client_manager_with(&mut self, vm_ip: &str, extra: &[(&str, String)]) -> PathBuf {
        let socket = self.path(&format!("client-manager-{vm_ip}.sock"));
        let mut envs = env(&[
            ("FLYT_CLIENT_MANAGER_VM_IP", vm_ip.into()),
            ("FLYT_CLIENT_MANAGER_CLUSTER_MANAGER", format!("127.0.0.1:{}", self.cluster_port)),
            ("FLYT_CLIENT_MANAGER_CLUSTER_KEY_FILE", self.key_file.display().to_string()),
            ("FLYT_CLIENT_MANAGER_SOCKET", socket.display().to_string()),
            ("FLYT_CLIENT_MANAGER_CLIENT_CHECK_MS", "100".into()),
            ("FLYT_CLIENT_MANAGER_REQUEST_TIMEOUT_SECONDS", self.options.request_timeout_seconds.to_string()),
            ("FLYT_CLIENT_MANAGER_METRICS_LISTEN", "127.0.0.1:0".into()),
        ]);
        envs.extend(self.tls_env("FLYT_CLIENT_MANAGER"));
        envs.extend(env(extra));
        let daemon = Daemon::start(&format!("client-manager-{vm_ip}"), &binary("flyt-client-manager"), &envs, self.dir.path());
        self.client_managers.push(daemon);
        socket
    }

    /// Kills (SIGKILL) the client manager whose socket is `socket`, as a node that dies would.
    #[allow(dead_code, reason = "the Slurm test binary uses it; the cluster one does not")]
    pub fn kill_client_manager(&mut self, socket: &Path) {
        let named = format!("unix:{}", socket.display());
        let daemon = self.client_managers.iter_mut().find(|daemon| daemon.ready_line.split_whitespace().any(|word| word == named));
        daemon.expect("a client manager on this socket").kill();
    }

    /// Runs flytctl through the admin socket; returns (exit code, stdout, stderr).
    pub fn flytctl(&self, args: &[&str]) -> (i32, String, String) {
        self.flytctl_with(&[("FLYTCTL_ADMIN_SOCKET", self.path("admin.sock").into_os_string())], args)
    }

    /// flytctl with the cluster's key, a 20 s limit and `settings` (environment variables).
    fn flytctl_with(&self, settings: &[(&str, std::ffi::OsString)], args: &[&str]) -> (i32, String, String) {
        let output = Command::new(binary("flytctl"))
            .args(args)
            .env("FLYTCTL_CLUSTER_KEY_FILE", &self.key_file)
            .env("FLYTCTL_TIMEOUT_SECONDS", "20")
            .envs(settings.iter().map(|(name, value)| (name, value)))
            .output()
            .unwrap();
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    pub fn flytctl_ok(&self, args: &[&str]) -> String {
        let (code, stdout, stderr) = self.flytctl(args);
        assert_eq!(code, 0, "flytctl {args:?} failed: {stderr}");
        stdout
    }

    pub fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        serde_json::from_str(&self.flytctl_ok(&all)).unwrap()
    }

    pub fn allocations(&self) -> Vec<Value> {
        self.json(&["list-virt-servers"]).as_array().unwrap().clone()
    }

    pub fn allocation_of(&self, vm_ip: &str) -> Option<Value> {
        self.allocations().into_iter().find(|allocation| allocation["vm_ip"] == vm_ip)
    }

    pub fn node_health(&self, node: &str) -> Option<String> {
        self.json(&["list-servernodes"])
            .as_array()
            .unwrap()
            .iter()
            .find(|view| view["node"]["node_id"] == node)
            .map(|view| view["node"]["health"].as_str().unwrap().to_string())
    }

    pub fn wait_node_up(&self, node: &str) {
        wait_until(&format!("{node} registered"), Duration::from_secs(15), || {
            (self.node_health(node).as_deref() == Some("Up")).then_some(())
        });
    }

    /// An app asks its client manager for a GPU and stays alive `hold_seconds` afterwards; its
    /// answer is read later.
    pub fn start_locate(&mut self, socket: &Path, hold_seconds: u64) -> PendingLocate {
        let mut child = Command::new(binary("flyt-client-manager"))
            .args(["locate", "--socket"])
            .arg(socket)
            .args(["--hold-seconds", &hold_seconds.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut stdout = child.stdout.take().unwrap();
        let (sender, receiver) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let mut byte = [0u8; 1];
            while stdout.read(&mut byte).is_ok_and(|read| read == 1) && byte[0] != b'\n' {
                line.push(char::from(byte[0]));
            }
            let _ = sender.send(line);
        });
        self.clients.push(child);
        PendingLocate { receiver, pid }
    }

    /// Asks a client manager as an app would; the client stays alive for `hold_seconds`.
    /// Returns its reply and the client's pid.
    pub fn locate(&mut self, socket: &Path, hold_seconds: u64) -> (Value, u32) {
        let pending = self.start_locate(socket, hold_seconds);
        let pid = pending.pid;
        (pending.answer(Duration::from_secs(30)), pid)
    }

    /// Ends every app the test started.
    pub fn kill_apps(&mut self) {
        for client in &mut self.clients {
            let _ = client.kill();
            let _ = client.wait();
        }
        self.clients.clear();
    }

    /// How many times `needle` occurs in daemon `name`'s log.
    pub fn log_count(&self, name: &str, needle: &str) -> usize {
        self.log(name).matches(needle).count()
    }

    /// The rpc-servers of this cluster (pid, allocation), whoever started them: processes whose
    /// `--control` socket lies in this cluster's folder.
    pub fn rpc_servers(&self) -> Vec<(u32, String)> {
        let prefix = format!("unix:{}/", self.dir.path().display());
        let mut found = Vec::new();
        for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
            let Ok(command_line) = fs::read(entry.path().join("cmdline")) else { continue };
            let arguments: Vec<String> =
                command_line.split(|byte| *byte == 0).map(|argument| String::from_utf8_lossy(argument).into_owned()).collect();
            let Some(position) = arguments.iter().position(|argument| argument == "--control") else { continue };
            let Some(control) = arguments.get(position + 1).and_then(|control| control.strip_prefix(&prefix)) else { continue };
            let id = control.rsplit('/').next().unwrap_or_default().trim_end_matches(".control.sock").to_string();
            if pid_alive(pid) {
                found.push((pid, id));
            }
        }
        found.sort();
        found
    }

    /// The invariant every crash must end in: each allocation `Running` with no step under way
    /// and a live server of its own, and no rpc-server that no allocation owns. Waits (bounded)
    /// for the cluster to get there.
    pub fn wait_settled(&self, what: &str) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let allocations = self.allocations();
            // By allocation id: a server started beside another of its allocation on the node (a
            // move there) keeps its name `ID~gpuN` after the other stops.
            let servers: BTreeSet<(u32, String)> = self
                .rpc_servers()
                .into_iter()
                .map(|(pid, name)| (pid, name.split_once('~').map_or(name.as_str(), |(id, _)| id).to_string()))
                .collect();
            // Each allocation's server, and a spread allocation's on its further nodes.
            let owned: BTreeSet<(u32, String)> = allocations
                .iter()
                .flat_map(|allocation| {
                    let id = allocation["id"].as_str().unwrap().to_string();
                    let further = allocation["further"].as_array().cloned().unwrap_or_default();
                    std::iter::once(allocation["pid"].as_u64().unwrap())
                        .chain(further.iter().map(|share| share["pid"].as_u64().unwrap()))
                        .map(move |pid| (u32::try_from(pid).unwrap(), id.clone()))
                        .collect::<Vec<_>>()
                })
                .collect();
            let settled = allocations.iter().all(|allocation| {
                allocation["state"] == "Running" && allocation["pending_resize"].is_null() && allocation["pending_move"].is_null()
            });
            if settled && servers == owned {
                return allocations;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: the cluster did not settle within 20 s: allocations {allocations:?}; rpc-servers running {servers:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Opens a data-plane session with the token, as the shim would, and returns the device's
/// (total memory, SM count) and the open connection.
pub fn open_session(reply: &Value) -> ((u64, i32), Box<dyn ReadWrite + Send>) {
    let address = reply["address"].as_str().unwrap_or_else(|| panic!("no address in {reply}"));
    let mut stream: Box<dyn ReadWrite + Send> = match address.strip_prefix("unix:") {
        Some(path) => Box::new(UnixStream::connect(path).unwrap()),
        None => Box::new(std::net::TcpStream::connect(address).unwrap()),
    };
    let client =
        ClientIdentity { hostname: "test".into(), pid: std::process::id(), program: "cluster-test".into(), boot_id: String::new() };
    let hello = Hello::new(Some(reply["token"].as_str().unwrap().to_string()), client, None);
    write_value(&mut stream, 1, &hello).unwrap();
    let (_, answer): (u32, HelloReply) = read_value(&mut stream, &FrameLimits::default()).unwrap();
    match answer {
        HelloReply::Accepted(info) => {
            let device = &info.devices[0];
            ((device.total_mem, device.attribute(attr::MULTIPROCESSOR_COUNT).unwrap_or(-1)), stream)
        }
        HelloReply::Refused { reason, .. } => panic!("session refused: {reason}"),
        HelloReply::Reattached { .. } => panic!("a reattachment nobody asked for"),
    }
}

/// [`open_session`], closed at once: what the app's slice looks like.
pub fn session_view(reply: &Value) -> (u64, i32) {
    open_session(reply).0
}

pub trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}
