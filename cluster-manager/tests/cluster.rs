//! The control plane end to end: a cluster manager, node managers (emulated devices), client
//! managers and real `flyt-rpc-server`s, all separate processes on loopback
//! (`harness`), what survives what (`recovery`): crashes at every step of placement,
//! resize and release on both stores, a node manager killed mid-start, a cluster manager away
//! or stopped, a node manager restarted; allocations moved between nodes with a running
//! app (`migration`); and a VM's GPUs spread over nodes (`spread`).
//!
//! Binaries: the Flyt binaries are looked up next to this package's `flyt-cluster-manager`
//! (so build them first: `cargo build -p flyt-cluster-manager -p flyt-node-manager
//! -p flyt-client-manager -p flytctl -p flyt-rpc-server`), or in `FLYT_BIN_DIR`;
//! `FLYT_RPC_SERVER_BIN` overrides the rpc-server alone. The MongoDB variants run against
//! `FLYT_TEST_MONGODB_URI` (`tools/test` starts `.ci/mongo-test-server`) and are skipped with a
//! notice when it is unset.

#[cfg(test)]
mod harness;
#[cfg(test)]
mod migration;
#[cfg(test)]
mod recovery;
#[cfg(test)]
mod spread;

#[cfg(test)]
mod tests {
    use std::{
        fs,
        process::Command,
        time::{Duration, Instant},
    };

    use nix::sys::signal::Signal;

    use crate::harness::{Cluster, MIB, Options, binary, pid_alive, scrape, series_value, session_view, signal, wait_until};

    const IDLE_GRACE_SECONDS: u64 = 3;
    const NODE_TIMEOUT_MS: u64 = 3000;
    const NODE_GRACE_SECONDS: u64 = 3;

    /// Mutual TLS between every daemon: a node manager and a client manager of the cluster's CA
    /// work as over plain TCP; a client manager without TLS is refused, with a reason that says so
    /// on both ends. flytctl from another host works over TLS with a certificate of the
    /// cluster's CA, and is refused without TLS or with another CA's.
    #[test]
    fn tls_on_every_tcp_hop_and_plain_peers_refused() {
        let mut cluster = Cluster::new(Options { tls: true, request_timeout_seconds: 3, ..Options::default() });
        cluster.start_node("node-a", "127.0.0.1", 40, 4096);
        wait_until("the node registered over TLS", Duration::from_secs(15), || {
            (cluster.node_health("node-a").as_deref() == Some("Up")).then_some(())
        });
        cluster.flytctl_ok(&["vm", "add", "10.0.0.1", "--host-ip", "127.0.0.1", "--compute-units", "10", "--memory-mib", "512"]);
        let vm = cluster.start_client_manager("10.0.0.1");
        let (granted, _) = cluster.locate(&vm, 0);
        assert!(granted["token"].is_string() && granted["address"].is_string(), "{granted}");
        // The app is told the cluster's CA: its TCP session to the server (started with the node's
        // certificate) must use TLS.
        assert!(granted["tls_ca"].as_str().unwrap().ends_with("tls/ca.pem"), "{granted}");
        let server = cluster.allocation_of("10.0.0.1").unwrap();
        assert!(
            cluster.log("node-a").contains("--tls-cert")
                || fs::read_to_string(format!("/proc/{}/cmdline", server["pid"])).unwrap().contains("--tls-cert"),
            "{server}"
        );
        assert!(cluster.log("cluster-manager").contains("TLS on every TCP connection"));

        cluster.flytctl_ok(&["vm", "add", "10.0.0.2", "--host-ip", "127.0.0.1", "--compute-units", "10", "--memory-mib", "512"]);
        let plain = cluster.start_client_manager_with("10.0.0.2", &[("FLYT_CLIENT_MANAGER_TLS_CA_FILE", String::new())]);
        let (refused, _) = cluster.locate(&plain, 0);
        assert!(refused["refused"].is_string(), "{refused}");
        let log = cluster.log("client-manager-10.0.0.2");
        assert!(log.contains("requires TLS"), "{log}");
        let log = cluster.log("cluster-manager");
        assert!(log.contains("a plain-TCP client"), "{log}");

        // flytctl from another host: the admin API over mutual TLS on the cluster manager's port.
        let (code, stdout, stderr) = cluster.remote_flytctl(Some(&cluster.path("tls")), &["list-servernodes", "--json"]);
        assert!(code == 0 && stdout.contains("node-a"), "exit {code}: {stdout}{stderr}");
        let (code, stdout, stderr) = cluster.remote_flytctl(Some(&cluster.path("tls")), &["vm", "list"]);
        assert!(code == 0 && stdout.contains("10.0.0.2"), "exit {code}: {stdout}{stderr}");
        let (code, _, stderr) = cluster.remote_flytctl(None, &["status"]);
        assert!(code == 2 && stderr.contains("never goes over plain TCP"), "exit {code}: {stderr}");
        let stranger = cluster.path("stranger-tls");
        flyt_daemon_kit::tls::generate(&stranger, &["127.0.0.1".into()]).unwrap();
        let (code, _, stderr) = cluster.remote_flytctl(Some(&stranger), &["status"]);
        assert!(code == 3 && stderr.contains("certificate"), "exit {code}: {stderr}");
        // ... and the cluster manager says whom it refused, and why.
        wait_until("the refusal in the cluster manager's log", Duration::from_secs(5), || {
            cluster.log("cluster-manager").lines().any(|line| line.contains("refused: TLS handshake failed")).then_some(())
        });
    }

    /// A VM of two GPUs: placed on the node that has two with room, served by one rpc-server
    /// started with both (`--gpu 0,1`), listed with both; a VM of three on a two-GPU node is
    /// refused with what is missing, and a move of the pair to a node of one GPU is refused with
    /// the reason.
    #[test]
    fn a_vm_of_two_gpus_gets_one_server_with_both() {
        let mut cluster = Cluster::new(Options::default());
        let gpus =
            "[{ name = \"Emulated 0\", memory_mib = 4096, sm_count = 40 }, { name = \"Emulated 1\", memory_mib = 4096, sm_count = 40 }]";
        cluster.start_node_with("node-a", "127.0.0.1", 40, 4096, &[("FLYT_NODE_MANAGER_EMULATED_GPUS", gpus.to_string())]);
        cluster.start_node("node-b", "127.0.0.2", 80, 8192);
        wait_until("both nodes registered", Duration::from_secs(15), || {
            (cluster.node_health("node-a").as_deref() == Some("Up") && cluster.node_health("node-b").as_deref() == Some("Up")).then_some(())
        });
        let added = cluster.flytctl_ok(&[
            "vm",
            "add",
            "10.0.0.1",
            "--host-ip",
            "127.0.0.2",
            "--compute-units",
            "20",
            "--memory-mib",
            "1024",
            "--gpus",
            "2",
        ]);
        assert!(added.contains("2 GPUs of 20 SMs and 1024 MiB each"), "{added}");
        let listed = cluster.flytctl_ok(&["vm", "list"]);
        assert!(listed.lines().any(|line| line.contains("10.0.0.1") && line.contains(" 2 ")), "{listed}");
        let vm = cluster.start_client_manager("10.0.0.1");
        let (granted, _) = cluster.locate(&vm, 0);
        assert!(granted["token"].is_string(), "{granted}");
        // node-b is the VM's host but has one GPU: node-a, both of its GPUs.
        let allocation = cluster.allocation_of("10.0.0.1").unwrap();
        assert_eq!(allocation["node_id"], "node-a", "{allocation}");
        let mut gpus: Vec<u64> = vec![allocation["gpu"].as_u64().unwrap()];
        gpus.extend(allocation["extra_gpus"].as_array().unwrap().iter().map(|gpu| gpu.as_u64().unwrap()));
        gpus.sort_unstable();
        assert_eq!(gpus, vec![0, 1], "{allocation}");
        let cmdline = fs::read_to_string(format!("/proc/{}/cmdline", allocation["pid"])).unwrap().replace('\0', " ");
        assert!(cmdline.contains(&format!("--gpu {},{}", allocation["gpu"], allocation["extra_gpus"][0])), "{cmdline}");
        let table = cluster.flytctl_ok(&["list-allocations"]);
        assert!(table.contains(&format!("node-a/{},{}", allocation["gpu"], allocation["extra_gpus"][0])), "{table}");
        // Three GPUs fit no node.
        cluster.flytctl_ok(&[
            "vm",
            "add",
            "10.0.0.2",
            "--host-ip",
            "127.0.0.1",
            "--compute-units",
            "10",
            "--memory-mib",
            "512",
            "--gpus",
            "3",
        ]);
        let other = cluster.start_client_manager("10.0.0.2");
        let (refused, _) = cluster.locate(&other, 0);
        let reason = refused["refused"].as_str().unwrap_or_default().to_string();
        assert!(reason.contains("needs 3 GPUs of one node"), "{refused}");
        // Moving an allocation of several GPUs to a node with fewer is refused with the reason
        // (`spread::a_vm_of_two_gpus_moves_whole_to_a_node_with_two` moves one).
        let (code, _, stderr) = cluster.flytctl(&["migrate", "10.0.0.1", "--to", "node-b"]);
        assert!(code != 0 && stderr.contains("node-b has 1 of the 2 GPUs with room for the slice"), "exit {code}: {stderr}");
    }

    /// The admin API is offered on TCP only with TLS: a cluster manager asked for it without
    /// [tls] does not start, and says why.
    #[test]
    fn admin_over_tcp_without_tls_is_refused_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("cluster.key");
        fs::write(&key, "0123456789abcdef0123456789abcdef").unwrap();
        let output = Command::new(binary("flyt-cluster-manager"))
            .env("FLYT_CLUSTER_MANAGER_ADMIN_OVER_TCP", "true")
            .env("FLYT_CLUSTER_MANAGER_LISTEN", "127.0.0.1:0")
            .env("FLYT_CLUSTER_MANAGER_ADMIN_SOCKET", dir.path().join("admin.sock"))
            .env("FLYT_CLUSTER_MANAGER_CLUSTER_KEY_FILE", &key)
            .env("FLYT_CLUSTER_MANAGER_STATE_DIR", dir.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success() && stderr.contains("admin_over_tcp needs [tls]"), "{stderr}");
    }

    #[test]
    fn placement_quotas_change_config_deaths_idle_release_and_restart() {
        let mut cluster = Cluster::new(Options {
            node_timeout_ms: NODE_TIMEOUT_MS,
            node_grace_seconds: NODE_GRACE_SECONDS,
            client_timeout_ms: 3000,
            idle_grace_seconds: IDLE_GRACE_SECONDS,
            ..Options::default()
        });
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
        // On their own hosts, both VMs are told to use their ivshmem regions (shared-mem mode),
        // and `flytctl list-vms` says so.
        assert_eq!((reply1["ivshmem"].as_bool(), reply2["ivshmem"].as_bool()), (Some(true), Some(true)), "{reply1} {reply2}");
        let (code, stdout, stderr) = cluster.flytctl(&["list-vms", "--json"]);
        assert_eq!(code, 0, "{stderr}");
        let vms: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let mode_of = |ip: &str| vms.as_array().unwrap().iter().find(|vm| vm["requirement"]["vm_ip"] == ip).map(|vm| vm["mode"].clone());
        assert_eq!(mode_of("10.0.0.1"), Some(serde_json::json!("SharedMemory")), "{stdout}");
        let (code, table, _) = cluster.flytctl(&["list-vms"]);
        assert!(code == 0 && table.contains("MODE") && table.contains("shared-mem"), "{table}");
        let (refused, _) = cluster.locate(&vm3, 0);
        assert!(refused["refused"].as_str().unwrap().contains("unknown VM 10.0.0.3"), "{refused}");
        cluster.flytctl_ok(&["vm", "add", "10.0.0.3", "--host-ip", "127.0.0.9", "--compute-units", "90", "--memory-mib", "1024"]);
        let (refused, _) = cluster.locate(&vm3, 0);
        let reason = refused["refused"].as_str().unwrap();
        assert!(reason.contains("needs 90 SMs") && reason.contains("short by"), "{reason}");

        // --- quotas: a session sees exactly its slice.
        assert_eq!(session_view(&reply1), (1024 * MIB, 20));
        assert_eq!(session_view(&reply2), (2048 * MIB, 30));

        // --- metrics: each server's endpoint reaches the cluster manager, and `flytctl top` reads it.
        let metrics = wait_until("the allocation's metrics address", Duration::from_secs(20), || {
            cluster.allocation_of("10.0.0.1")?["metrics"].as_str().map(str::to_string)
        });
        let (code, stdout, stderr) = cluster.flytctl(&["top", "--iterations", "2", "--interval", "0.5", "--json"]);
        assert_eq!(code, 0, "{stderr}");
        let refreshes: Vec<serde_json::Value> = stdout.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
        assert_eq!(refreshes.len(), 2, "{stdout}");
        let rows = refreshes[1]["allocations"].as_array().unwrap();
        let row = rows.iter().find(|row| row["vm"] == "10.0.0.1").unwrap_or_else(|| panic!("{stdout}"));
        assert!(row["calls_per_second"].is_f64() && row["note"].is_null(), "{row} (metrics at {metrics})");
        assert_eq!(row["memory_quota_bytes"].as_u64(), Some(1024 * MIB), "{row}");
        // Prometheus service discovery: the same address, labelled.
        let targets = cluster.json(&["prometheus-targets"]);
        let group =
            targets.as_array().unwrap().iter().find(|group| group["labels"]["vm"] == "10.0.0.1").unwrap_or_else(|| panic!("{targets}"));
        assert_eq!(group["targets"][0].as_str(), Some(metrics.as_str()), "{targets}");
        assert_eq!(group["labels"]["node"], "node-b", "{targets}");
        let (code, _, stderr) = cluster.flytctl(&["top", "--interval", "0"]);
        assert!(code == 2 && stderr.contains("above 0"), "{code} {stderr}");
        // The cluster manager's and each node manager's own endpoints.
        let text = scrape(&cluster.cluster_manager().metrics_address());
        let value = |series: &str| series_value(&text, series).unwrap_or_else(|| panic!("no {series} in:\n{text}"));
        assert_eq!(value("flyt_cluster_nodes{health=\"up\"}"), 2.0);
        assert_eq!(value("flyt_cluster_allocations{state=\"running\"}"), 2.0);
        assert_eq!(value("flyt_cluster_compute_units{state=\"total\"}"), 120.0);
        assert_eq!(value("flyt_cluster_compute_units{state=\"free\"}"), 70.0);
        assert!(value("flyt_cluster_placements_granted_total") >= 2.0, "{text}");
        assert!(value("flyt_cluster_placements_refused_total") >= 2.0, "{text}");
        assert!(value("flyt_cluster_store_duration_seconds_count{op=\"put_allocation\"}") >= 2.0, "{text}");
        let text = scrape(&cluster.node("node-b").metrics_address());
        let value = |series: &str| series_value(&text, series).unwrap_or_else(|| panic!("no {series} in:\n{text}"));
        assert_eq!(value("flyt_node_slices{node=\"node-b\",gpu=\"0\"}"), 1.0);
        assert_eq!(value("flyt_node_sms_allocated{node=\"node-b\",gpu=\"0\"}"), 20.0);
        assert_eq!(value("flyt_node_memory_allocated_bytes{node=\"node-b\",gpu=\"0\"}"), (1024 * MIB) as f64);
        assert!(!text.contains("mps_up"), "no MPS on this node: {text}");
        // The Grafana dashboard in configs/ asks only for manager series these endpoints serve.
        let served = format!("{}\n{text}", scrape(&cluster.cluster_manager().metrics_address()));
        let asked = flyt_test_support::dashboard_series(&["flyt_cluster_", "flyt_node_"]);
        assert!(asked.len() >= 8, "{asked:?}");
        for name in asked {
            assert!(flyt_test_support::serves(&served, &name), "the dashboard asks for {name}, which is not served:\n{served}");
        }
        let text = scrape(&cluster.client_manager_metrics(&vm3));
        let value = |series: &str| series_value(&text, series).unwrap_or_else(|| panic!("no {series} in:\n{text}"));
        assert_eq!(value("flyt_client_locates_total{vm=\"10.0.0.3\",outcome=\"refused\"}"), 2.0);
        assert_eq!(value("flyt_client_cluster_connected{vm=\"10.0.0.3\"}"), 1.0);
        let text = scrape(&cluster.client_manager_metrics(&vm1));
        let value = |series: &str| series_value(&text, series).unwrap_or_else(|| panic!("no {series} in:\n{text}"));
        assert_eq!(value("flyt_client_locates_total{vm=\"10.0.0.1\",outcome=\"granted\"}"), 1.0);
        let allocation = first["id"].as_str().unwrap();
        assert_eq!(value(&format!("flyt_client_apps{{vm=\"10.0.0.1\",allocation=\"{allocation}\"}}")), 1.0);

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
        // Its session outlives it by the server's reconnect grace (a TCP client may come back,
        // `--reconnect-grace-ms`, 10 s by default), then the allocation is idle.
        wait_until("the idle allocation is released", Duration::from_secs(IDLE_GRACE_SECONDS + 10 + 5), || {
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

        // --- node death: its allocations are kept for the node grace period, then released; the
        // VM is placed elsewhere; the restarted node manager stops the server it left behind.
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
        assert!(cluster.allocation_of("10.0.0.1").is_some(), "released before the node grace period");
        wait_until("the lost node's allocation is released", Duration::from_secs(NODE_GRACE_SECONDS + 5), || {
            cluster.allocation_of("10.0.0.1").is_none().then_some(())
        });
        let (reply, _) = cluster.locate(&vm1, 600);
        assert!(reply["address"].is_string(), "{reply}");
        assert_eq!(cluster.allocation_of("10.0.0.1").unwrap()["node_id"], "node-a");
        assert!(pid_alive(orphan));
        cluster.start_node("node-b", "127.0.0.2", 80, 8192);
        wait_until("the restarted node-b stops its orphan", Duration::from_secs(15), || (!pid_alive(orphan)).then_some(()));
        assert_eq!(cluster.node_health("node-b").as_deref(), Some("Up"));
        let log = cluster.log("cluster-manager");
        assert!(log.contains("node is back after its grace period ran out"), "{log}");
        assert!(!log.contains("node is back within its grace period"), "{log}");

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
