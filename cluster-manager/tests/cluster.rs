//! The control plane end to end: a cluster manager, two node managers (emulated devices),
//! client managers and real `flyt-rpc-server`s, all separate processes on loopback.
//!
//! Binaries: the Flyt binaries are looked up next to this package's `flyt-cluster-manager`
//! (so build them first: `cargo build -p flyt-cluster-manager -p flyt-node-manager
//! -p flyt-client-manager -p flytctl -p flyt-rpc-server`), or in `FLYT_BIN_DIR`;
//! `FLYT_RPC_SERVER_BIN` overrides the rpc-server alone.
//!
//! Every wait is bounded; every process is stopped (by pid) when the test ends, and the daemon
//! logs are printed when it fails.

#[cfg(test)]
mod tests {
    use std::{
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
    use serde_json::Value;

    const MIB: u64 = 1 << 20;
    const IDLE_GRACE_SECONDS: u64 = 3;
    const NODE_TIMEOUT_MS: u64 = 3000;

    fn bin_dir() -> PathBuf {
        match std::env::var_os("FLYT_BIN_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => Path::new(env!("CARGO_BIN_EXE_flyt-cluster-manager")).parent().unwrap().to_path_buf(),
        }
    }

    fn binary(name: &str) -> PathBuf {
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

    fn wait_until<T>(what: &str, timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(value) = probe() {
                return value;
            }
            assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn pid_alive(pid: u32) -> bool {
        fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|stat| stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
            .unwrap_or(false)
    }

    fn signal(pid: u32, signal: Signal) {
        let _ = kill(Pid::from_raw(i32::try_from(pid).unwrap()), signal);
    }

    /// A daemon started by the test, with its log file.
    struct Daemon {
        child: Child,
        ready_line: String,
    }

    impl Daemon {
        fn start(name: &str, program: &Path, envs: &[(String, String)], args: &[&str], dir: &Path) -> Self {
            let log = dir.join(format!("{name}.log"));
            let mut child = Command::new(program)
                .args(args)
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

        fn pid(&self) -> u32 {
            self.child.id()
        }

        fn kill(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }

        fn terminate(&mut self) {
            signal(self.pid(), Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            self.kill();
        }
    }

    /// The whole cluster; dropping it stops everything it started.
    struct Cluster {
        dir: tempfile::TempDir,
        key_file: PathBuf,
        cluster_port: u16,
        cluster_manager: Option<Daemon>,
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
            // rpc-servers left by a killed node manager: stop them by their recorded pids.
            for (node, _) in &self.nodes {
                let servers = self.dir.path().join(node).join("servers");
                for entry in fs::read_dir(&servers).into_iter().flatten().flatten() {
                    let record: Option<Value> = fs::read(entry.path()).ok().and_then(|bytes| serde_json::from_slice(&bytes).ok());
                    if let Some(pid) = record.and_then(|record| record["pid"].as_u64()) {
                        signal(u32::try_from(pid).unwrap(), Signal::SIGKILL);
                    }
                }
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

    fn env(pairs: &[(&str, String)]) -> Vec<(String, String)> {
        pairs.iter().map(|(key, value)| (key.to_string(), value.clone())).collect()
    }

    impl Cluster {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let key_file = dir.path().join("cluster.key");
            fs::write(&key_file, "test-cluster-key-0123456789abcdef\n").unwrap();
            fs::set_permissions(&key_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
            let mut cluster = Self {
                dir,
                key_file,
                cluster_port: free_port(),
                cluster_manager: None,
                nodes: Vec::new(),
                client_managers: Vec::new(),
                clients: Vec::new(),
            };
            cluster.start_cluster_manager();
            cluster
        }

        fn path(&self, name: &str) -> PathBuf {
            self.dir.path().join(name)
        }

        fn start_cluster_manager(&mut self) {
            let envs = env(&[
                ("FLYT_CLUSTER_MANAGER_LISTEN", format!("127.0.0.1:{}", self.cluster_port)),
                ("FLYT_CLUSTER_MANAGER_ADMIN_SOCKET", self.path("admin.sock").display().to_string()),
                ("FLYT_CLUSTER_MANAGER_CLUSTER_KEY_FILE", self.key_file.display().to_string()),
                ("FLYT_CLUSTER_MANAGER_STATE_DIR", self.path("cluster-manager").display().to_string()),
                ("FLYT_CLUSTER_MANAGER_LEASES_HEARTBEAT_INTERVAL_MS", "200".into()),
                ("FLYT_CLUSTER_MANAGER_LEASES_NODE_TIMEOUT_MS", NODE_TIMEOUT_MS.to_string()),
                ("FLYT_CLUSTER_MANAGER_LEASES_CLIENT_TIMEOUT_MS", "3000".into()),
                ("FLYT_CLUSTER_MANAGER_ALLOCATIONS_IDLE_GRACE_SECONDS", IDLE_GRACE_SECONDS.to_string()),
            ]);
            let daemon = Daemon::start("cluster-manager", &binary("flyt-cluster-manager"), &envs, &[], self.dir.path());
            assert!(daemon.ready_line.starts_with("flyt-cluster-manager listening on 127.0.0.1:"), "{}", daemon.ready_line);
            self.cluster_manager = Some(daemon);
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
                (
                    "FLYT_NODE_MANAGER_EMULATED_GPUS",
                    format!("[{{ name = \"Emulated {node}\", memory_mib = {memory_mib}, sm_count = {sms} }}]"),
                ),
                ("FLYT_NODE_MANAGER_RPC_SERVER_BINARY", binary("flyt-rpc-server").display().to_string()),
                ("FLYT_NODE_MANAGER_RPC_SERVER_LISTEN_HOST", "127.0.0.1".into()),
                ("FLYT_NODE_MANAGER_RPC_SERVER_SOCKET_DIR", String::new()),
                ("FLYT_NODE_MANAGER_RPC_SERVER_STOP_GRACE_SECONDS", "0".into()),
            ])
        }

        fn start_node(&mut self, node: &str, host_ip: &str, sms: u32, memory_mib: u64) {
            let envs = self.node_env(node, host_ip, sms, memory_mib);
            let daemon = Daemon::start(node, &binary("flyt-node-manager"), &envs, &[], self.dir.path());
            match self.nodes.iter_mut().find(|(name, _)| name == node) {
                Some(entry) => entry.1 = Some(daemon),
                None => self.nodes.push((node.to_string(), Some(daemon))),
            }
        }

        fn node(&mut self, node: &str) -> &mut Daemon {
            self.nodes.iter_mut().find(|(name, _)| name == node).and_then(|(_, daemon)| daemon.as_mut()).unwrap()
        }

        /// Starts the client manager of VM `vm_ip`; returns its socket.
        fn start_client_manager(&mut self, vm_ip: &str) -> PathBuf {
            let socket = self.path(&format!("client-manager-{vm_ip}.sock"));
            let envs = env(&[
                ("FLYT_CLIENT_MANAGER_VM_IP", vm_ip.into()),
                ("FLYT_CLIENT_MANAGER_CLUSTER_MANAGER", format!("127.0.0.1:{}", self.cluster_port)),
                ("FLYT_CLIENT_MANAGER_CLUSTER_KEY_FILE", self.key_file.display().to_string()),
                ("FLYT_CLIENT_MANAGER_SOCKET", socket.display().to_string()),
                ("FLYT_CLIENT_MANAGER_CLIENT_CHECK_MS", "100".into()),
            ]);
            let daemon = Daemon::start(&format!("client-manager-{vm_ip}"), &binary("flyt-client-manager"), &envs, &[], self.dir.path());
            self.client_managers.push(daemon);
            socket
        }

        /// Runs flytctl; returns (exit code, stdout, stderr).
        fn flytctl(&self, args: &[&str]) -> (i32, String, String) {
            let output = Command::new(binary("flytctl"))
                .args(args)
                .env("FLYTCTL_ADMIN_SOCKET", self.path("admin.sock"))
                .env("FLYTCTL_CLUSTER_KEY_FILE", &self.key_file)
                .env("FLYTCTL_TIMEOUT_SECONDS", "20")
                .output()
                .unwrap();
            (
                output.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&output.stdout).into_owned(),
                String::from_utf8_lossy(&output.stderr).into_owned(),
            )
        }

        fn flytctl_ok(&self, args: &[&str]) -> String {
            let (code, stdout, stderr) = self.flytctl(args);
            assert_eq!(code, 0, "flytctl {args:?} failed: {stderr}");
            stdout
        }

        fn json(&self, args: &[&str]) -> Value {
            let mut all = args.to_vec();
            all.push("--json");
            serde_json::from_str(&self.flytctl_ok(&all)).unwrap()
        }

        fn allocations(&self) -> Vec<Value> {
            self.json(&["list-virt-servers"]).as_array().unwrap().clone()
        }

        fn allocation_of(&self, vm_ip: &str) -> Option<Value> {
            self.allocations().into_iter().find(|allocation| allocation["vm_ip"] == vm_ip)
        }

        fn node_health(&self, node: &str) -> Option<String> {
            self.json(&["list-servernodes"])
                .as_array()
                .unwrap()
                .iter()
                .find(|view| view["node"]["node_id"] == node)
                .map(|view| view["node"]["health"].as_str().unwrap().to_string())
        }

        /// Asks a client manager as an app would; the client stays alive for `hold_seconds`.
        /// Returns its reply and the client's pid.
        fn locate(&mut self, socket: &Path, hold_seconds: u64) -> (Value, u32) {
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
            let line = receiver.recv_timeout(Duration::from_secs(30)).expect("locate printed nothing");
            self.clients.push(child);
            (serde_json::from_str(&line).unwrap_or_else(|_| panic!("locate printed {line:?}")), pid)
        }
    }

    /// Opens a data-plane session with the token, as the shim would, and returns the device's
    /// (total memory, SM count).
    fn session_view(reply: &Value) -> (u64, i32) {
        let address = reply["address"].as_str().unwrap();
        let mut stream: Box<dyn ReadWrite> = match address.strip_prefix("unix:") {
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
                (device.total_mem, device.attribute(attr::MULTIPROCESSOR_COUNT).unwrap_or(-1))
            }
            HelloReply::Refused { reason, .. } => panic!("session refused: {reason}"),
        }
    }

    trait ReadWrite: Read + Write {}
    impl<T: Read + Write> ReadWrite for T {}

    #[test]
    fn placement_quotas_change_config_deaths_idle_release_and_restart() {
        let mut cluster = Cluster::new();
        // node-a: the host of VM 10.0.0.2; node-b: the host of VM 10.0.0.1.
        cluster.start_node("node-a", "127.0.0.1", 40, 4096);
        cluster.start_node("node-b", "127.0.0.2", 80, 8192);
        wait_until("both nodes registered", Duration::from_secs(15), || {
            (cluster.node_health("node-a").as_deref() == Some("Up") && cluster.node_health("node-b").as_deref() == Some("Up")).then_some(())
        });

        // --- authentication: a connection without the cluster key is refused.
        let wrong_key = cluster.path("wrong.key");
        fs::write(&wrong_key, "not-the-cluster-key-0123456789").unwrap();
        let output = Command::new(binary("flytctl"))
            .args(["status", "--socket"])
            .arg(cluster.path("admin.sock"))
            .arg("--cluster-key-file")
            .arg(&wrong_key)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.code() == Some(2) && stderr.contains("refused the cluster key"), "{stderr}");
        let (code, _, stderr) = cluster.flytctl(&["vm", "remove", "10.9.9.9"]);
        assert!(code == 1 && stderr.contains("unknown VM 10.9.9.9"), "{stderr}");

        // --- placement: each VM lands on its own host; what cannot fit is refused with a reason.
        cluster.flytctl_ok(&["vm", "add", "10.0.0.1", "--host-ip", "127.0.0.2", "--compute-units", "20", "--memory-mib", "1024"]);
        cluster.flytctl_ok(&["vm", "add", "10.0.0.2", "--host-ip", "127.0.0.1", "--compute-units", "30", "--memory-mib", "2048"]);
        let vm1 = cluster.start_client_manager("10.0.0.1");
        let vm2 = cluster.start_client_manager("10.0.0.2");
        let vm3 = cluster.start_client_manager("10.0.0.3");
        let (reply1, client1) = cluster.locate(&vm1, 600);
        assert!(reply1["token"].is_string(), "{reply1}");
        let (reply2, _client2) = cluster.locate(&vm2, 600);
        let first = cluster.allocation_of("10.0.0.1").unwrap();
        assert_eq!((first["node_id"].as_str(), first["sm_percentage"].as_u64()), (Some("node-b"), Some(25)));
        let second = cluster.allocation_of("10.0.0.2").unwrap();
        assert_eq!((second["node_id"].as_str(), second["sm_percentage"].as_u64()), (Some("node-a"), Some(75)));
        let (refused, _) = cluster.locate(&vm3, 0);
        assert!(refused["refused"].as_str().unwrap().contains("unknown VM 10.0.0.3"), "{refused}");
        cluster.flytctl_ok(&["vm", "add", "10.0.0.3", "--host-ip", "127.0.0.9", "--compute-units", "90", "--memory-mib", "1024"]);
        let (refused, _) = cluster.locate(&vm3, 0);
        let reason = refused["refused"].as_str().unwrap();
        assert!(reason.contains("needs 90 SMs") && reason.contains("short by"), "{reason}");

        // --- quotas: a session sees exactly its slice.
        assert_eq!(session_view(&reply1), (1024 * MIB, 20));
        assert_eq!(session_view(&reply2), (2048 * MIB, 30));

        // --- change-config: applied to the running server, refused when the GPU cannot hold it.
        let changed = cluster.json(&["change-config", "10.0.0.1", "--compute-units", "40", "--memory-mib", "2048"]);
        assert_eq!((changed["compute_units"].as_u64(), changed["sm_percentage"].as_u64()), (Some(40), Some(50)));
        assert_eq!(session_view(&reply1), (2048 * MIB, 40));
        let (code, _, stderr) = cluster.flytctl(&["change-config", "10.0.0.2", "--compute-units", "41"]);
        assert_eq!(code, 1, "{stderr}");
        assert!(stderr.contains("no GPU can hold this slice"), "{stderr}");
        let (code, _, stderr) = cluster.flytctl(&["change-config", "10.9.9.9", "--memory-mib", "1"]);
        assert!(code == 1 && stderr.contains("unknown allocation or VM 10.9.9.9"), "{stderr}");

        // --- client death: noticed within seconds, then the idle allocation is released.
        let server_pid = u32::try_from(first["pid"].as_u64().unwrap()).unwrap();
        signal(client1, Signal::SIGKILL);
        wait_until("the dead client is dropped", Duration::from_secs(5), || {
            cluster.allocation_of("10.0.0.1").and_then(|allocation| allocation["clients"].as_array().unwrap().is_empty().then_some(()))
        });
        let noticed = Instant::now();
        wait_until("the idle allocation is released", Duration::from_secs(IDLE_GRACE_SECONDS + 5), || {
            cluster.allocation_of("10.0.0.1").is_none().then_some(())
        });
        assert!(noticed.elapsed() >= Duration::from_secs(IDLE_GRACE_SECONDS - 1), "released before the grace period");
        wait_until("its rpc-server stops", Duration::from_secs(10), || (!pid_alive(server_pid)).then_some(()));

        // --- idle release: a client that exits at once; the allocation outlives it by the grace period.
        let (reply, _) = cluster.locate(&vm1, 0);
        assert!(reply["address"].is_string(), "{reply}");
        std::thread::sleep(Duration::from_millis(1000));
        assert!(cluster.allocation_of("10.0.0.1").is_some(), "released before the grace period");
        wait_until("the idle allocation is released", Duration::from_secs(IDLE_GRACE_SECONDS + 5), || {
            cluster.allocation_of("10.0.0.1").is_none().then_some(())
        });

        // --- node death: its allocations are released; the VM is placed elsewhere; the restarted
        // node manager stops the server it left behind.
        let (_, _) = cluster.locate(&vm1, 600);
        let on_b = cluster.allocation_of("10.0.0.1").unwrap();
        assert_eq!(on_b["node_id"], "node-b");
        let orphan = u32::try_from(on_b["pid"].as_u64().unwrap()).unwrap();
        // Free node-a for VM 10.0.0.1's 40 SMs.
        cluster.flytctl_ok(&["vm", "remove", "10.0.0.2"]);
        cluster.node("node-b").kill();
        wait_until("node-b is down", Duration::from_millis(NODE_TIMEOUT_MS) + Duration::from_secs(5), || {
            (cluster.node_health("node-b").as_deref() == Some("Down")).then_some(())
        });
        assert!(cluster.allocation_of("10.0.0.1").is_none(), "the dead node's allocation is still held");
        let (reply, _) = cluster.locate(&vm1, 600);
        assert!(reply["address"].is_string(), "{reply}");
        assert_eq!(cluster.allocation_of("10.0.0.1").unwrap()["node_id"], "node-a");
        assert!(pid_alive(orphan));
        cluster.start_node("node-b", "127.0.0.2", 80, 8192);
        wait_until("the restarted node-b stops its orphan", Duration::from_secs(15), || (!pid_alive(orphan)).then_some(()));
        assert_eq!(cluster.node_health("node-b").as_deref(), Some("Up"));

        // --- drain: a drained node gets no new allocation.
        cluster.flytctl_ok(&["drain", "node-b"]);
        cluster.flytctl_ok(&["vm", "add", "10.0.0.2", "--host-ip", "127.0.0.2", "--compute-units", "10", "--memory-mib", "512"]);
        let (refused, _) = cluster.locate(&vm2, 0);
        assert!(refused["refused"].as_str().unwrap().contains("no GPU can hold"), "{refused}");
        cluster.flytctl_ok(&["undrain", "node-b"]);

        // --- cluster-manager restart: nothing is lost, the running server is re-adopted.
        let before = cluster.allocation_of("10.0.0.1").unwrap();
        cluster.cluster_manager.as_mut().unwrap().kill();
        let (code, _, stderr) = cluster.flytctl(&["status"]);
        assert!(code == 3 && stderr.contains("Is flyt-cluster-manager running?"), "{code} {stderr}");
        cluster.start_cluster_manager();
        let after = cluster.allocation_of("10.0.0.1").expect("allocation lost in the restart");
        assert_eq!((&after["id"], &after["pid"], &after["addresses"]), (&before["id"], &before["pid"], &before["addresses"]));
        // Longer than a node lease: the nodes and the client manager have reported in again.
        std::thread::sleep(Duration::from_millis(NODE_TIMEOUT_MS + 1000));
        let after = cluster.allocation_of("10.0.0.1").expect("allocation released after the restart");
        assert_eq!(after["id"], before["id"]);
        assert!(!after["clients"].as_array().unwrap().is_empty(), "the client manager did not report its client again");
        assert_eq!(cluster.node_health("node-a").as_deref(), Some("Up"));
        let (reply, _) = cluster.locate(&vm1, 0);
        assert!(pid_alive(u32::try_from(before["pid"].as_u64().unwrap()).unwrap()));
        assert_eq!(session_view(&reply), (2048 * MIB, 40));
        let status = cluster.json(&["status"]);
        assert_eq!((status["nodes_up"].as_u64(), status["allocations"].as_u64()), (Some(2), Some(1)));

        // --- rpc-server death: the node's next heartbeat omits it; its allocation is released.
        signal(u32::try_from(before["pid"].as_u64().unwrap()).unwrap(), Signal::SIGKILL);
        wait_until("the dead server's allocation is released", Duration::from_secs(5), || {
            cluster.allocation_of("10.0.0.1").is_none().then_some(())
        });
        let (reply, _) = cluster.locate(&vm1, 0);
        assert!(reply["address"].is_string(), "a new server is started on the next request: {reply}");
    }
}
