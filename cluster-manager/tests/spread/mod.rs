//! A VM of two GPUs on two nodes of one GPU each (issue 45, `flytctl vm add --gpus 2 --spread`):
//! refused with the reason without `--spread`; with it, one rpc-server per node, the second in
//! address window 1, the grant naming both servers in order; a driver-API program through the
//! client manager sees two devices with disjoint allocations and copies between them; the
//! listings and metrics show both GPUs; moves and resizes are refused with the reason; removing
//! the VM stops both servers. A spread placement survives a cluster manager crash at each step.
//! And a VM of two GPUs on one node moves whole to another node's two, or one of its GPUs to a
//! third GPU of its node.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command},
    time::Duration,
};

use crate::harness::{Cluster, Options, crash_mid_move, scrape, series_value, wait_until};

const VM: &str = "10.0.0.1";

fn add_vm(cluster: &Cluster, spread: bool) -> String {
    let mut args = vec!["vm", "add", VM, "--host-ip", "127.0.0.1", "--compute-units", "20", "--memory-mib", "1024", "--gpus", "2"];
    if spread {
        args.push("--spread");
    }
    cluster.flytctl_ok(&args)
}

/// A driver-API app on both GPUs (`migrate_two_devices.c`) of the VM whose client manager is at
/// `socket`, built in the cluster's folder `dir` and paused where it waits for a move (its marker
/// file); `None`, with a line saying so, without `FLYT_CUDA_HOME`.
fn paused_app(cluster: &Cluster, socket: &Path, dir: &str) -> Option<(Child, PathBuf)> {
    let Some(cuda) = std::env::var_os("FLYT_CUDA_HOME").map(PathBuf::from) else {
        eprintln!("the driver-API app part is skipped: FLYT_CUDA_HOME is not set (tools/test sets it)");
        return None;
    };
    let scratch = cluster.path(dir);
    fs::create_dir_all(&scratch).unwrap();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cuda-shim/cdylib/tests/c/migrate_two_devices.c");
    let (program, lib) = flyt_test_support::driver_program(&source, &cuda, &scratch);
    let marker = scratch.join("marker");
    let app = Command::new(&program)
        .arg(&marker)
        .env("LD_LIBRARY_PATH", &lib)
        .env("FLYT_CLIENT_MANAGER_SOCKET", socket)
        .env_remove("FLYT_SERVER")
        .env_remove("FLYT_TOKEN")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the app's allocations on both GPUs", Duration::from_secs(30), || marker.exists().then_some(()));
    Some((app, marker))
}

/// Lets the paused app go on after the move: it passes at `place`, its pointers as they were and
/// every byte on device 0 kept.
fn app_goes_on(app: Child, marker: &Path, place: &str) {
    fs::write(marker.with_extension("next"), b"").unwrap();
    let output = app.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("PASSED: 0 failure(s)"),
        "the app goes on at {place}:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let pointers: Vec<&str> = stdout.lines().filter(|line| line.starts_with("pointers:")).collect();
    assert!(pointers.len() == 2 && pointers[0] == pointers[1], "the app's pointers changed:\n{stdout}");
    assert!(stdout.contains("every byte on device 0 (read from device 1): yes"), "{stdout}");
}

/// A cluster of two nodes of one GPU each (40 SMs, 4 GiB), both up.
fn two_nodes() -> Cluster {
    let mut cluster = Cluster::new(Options::default());
    cluster.start_node("node-a", "127.0.0.1", 40, 4096);
    cluster.start_node("node-b", "127.0.0.2", 40, 4096);
    cluster.wait_node_up("node-a");
    cluster.wait_node_up("node-b");
    cluster
}

fn cmdline(pid: u64) -> String {
    fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default().replace('\0', " ")
}

#[test]
fn a_vm_of_two_gpus_spreads_over_two_nodes_only_when_allowed() {
    let mut cluster = two_nodes();

    // Without --spread: no node has two GPUs, and the refusal says that spreading would do.
    add_vm(&cluster, false);
    let socket = cluster.start_client_manager(VM);
    let (refused, _) = cluster.locate(&socket, 0);
    let reason = refused["refused"].as_str().unwrap_or_default().to_string();
    assert!(reason.contains("needs 2 GPUs of one node with 20 SMs and 1024 MiB each"), "{refused}");
    assert!(reason.contains("2 nodes have them together, but VM 10.0.0.1 is not allowed to spread over nodes"), "{refused}");
    assert!(reason.contains("--gpus 2 --spread"), "{refused}");
    assert!(cluster.allocation_of(VM).is_none());
    // A driver-API program (when the toolkit's cuda.h is at hand) is told the same, on stderr.
    let program = match std::env::var_os("FLYT_CUDA_HOME").map(PathBuf::from) {
        Some(cuda) => Some(build_two_nodes_program(&cuda, &cluster.path("program"))),
        None => {
            eprintln!("the driver-API program parts are skipped: FLYT_CUDA_HOME is not set (tools/test sets it)");
            None
        }
    };
    if let Some(program) = &program {
        let (code, stdout, stderr) = run_through_client_manager(program, &socket);
        assert!(
            code != 0 && stderr.contains("flyt: no GPU for this client") && stderr.contains("not allowed to spread"),
            "exit {code}:\n{stdout}\n{stderr}"
        );
    }

    // With it: both nodes, the VM's own host (node-a) first.
    let added = add_vm(&cluster, true);
    assert!(added.contains("2 GPUs of 20 SMs and 1024 MiB each, across nodes if no one node has them"), "{added}");
    let listed = cluster.flytctl_ok(&["vm", "list"]);
    assert!(listed.contains("2 (spread)"), "{listed}");
    let (granted, _) = cluster.locate(&socket, 0);
    assert!(granted["token"].is_string(), "{granted}");
    let allocation = cluster.allocation_of(VM).unwrap();
    assert_eq!((allocation["node_id"].as_str(), allocation["gpu"].as_u64()), (Some("node-a"), Some(0)), "{allocation}");
    let further = &allocation["further"];
    assert_eq!(further.as_array().map(Vec::len), Some(1), "{allocation}");
    assert_eq!((further[0]["node_id"].as_str(), further[0]["address_window"].as_u64()), (Some("node-b"), Some(1)), "{allocation}");
    // The grant names both servers, in the order the app numbers their devices.
    let first_address = allocation["addresses"][0].as_str().unwrap().to_string();
    let second_address = further[0]["addresses"][0].as_str().unwrap().to_string();
    assert_eq!(granted["address"].as_str(), Some(format!("{first_address},{second_address}").as_str()), "{granted}");
    // Each node's server: its own GPU, the second in address window 1, the first in the default.
    let (first_pid, second_pid) = (allocation["pid"].as_u64().unwrap(), further[0]["pid"].as_u64().unwrap());
    let (first_line, second_line) = (cmdline(first_pid), cmdline(second_pid));
    assert!(first_line.contains("--gpu 0") && !first_line.contains("--address-window"), "{first_line}");
    assert!(second_line.contains("--gpu 0") && second_line.contains("--address-window 1"), "{second_line}");
    assert!(first_line.contains(&format!("--allocation {}", allocation["id"].as_str().unwrap())), "{first_line}");
    assert!(second_line.contains(&format!("--allocation {}", allocation["id"].as_str().unwrap())), "{second_line}");

    // Listings: both GPUs, in order, with their UUIDs and slices.
    let table = cluster.flytctl_ok(&["list-vms", "--wide"]);
    let uuid_of = |node: &str| -> String {
        let nodes = cluster.json(&["list-servernodes"]);
        let view = nodes.as_array().unwrap().iter().find(|view| view["node"]["node_id"] == node).unwrap().clone();
        view["gpus"][0]["gpu"]["uuid"].as_str().unwrap().to_string()
    };
    for line in [format!("0: node-a/0 {} 20 SMs 1024 MiB", uuid_of("node-a")), format!("1: node-b/0 {} 20 SMs 1024 MiB", uuid_of("node-b"))]
    {
        assert!(table.contains(&line), "missing '{line}':\n{table}");
    }
    let table = cluster.flytctl_ok(&["list-virt-servers"]);
    assert!(table.contains("node-a/0 + node-b/0"), "{table}");
    assert!(table.contains(&format!("{first_pid} + {second_pid}")), "{table}");
    // Each node counts the slice on its GPU.
    let nodes = cluster.json(&["list-servernodes"]);
    for view in nodes.as_array().unwrap() {
        assert_eq!(view["gpus"][0]["allocated_compute_units"].as_u64(), Some(20), "{view}");
        assert_eq!(view["gpus"][0]["allocations"].as_u64(), Some(1), "{view}");
    }

    // Metrics per GPU: the cluster manager's, device by device, and each node manager's.
    let id = allocation["id"].as_str().unwrap().to_string();
    let text = scrape(&cluster.cluster_manager().metrics_address());
    for (device, node) in [(0, "node-a"), (1, "node-b")] {
        let series = format!(
            "flyt_cluster_allocation_gpu_compute_units{{allocation=\"{id}\",vm=\"{VM}\",device=\"{device}\",node=\"{node}\",gpu=\"0\"}}"
        );
        assert_eq!(series_value(&text, &series), Some(20.0), "no {series} in:\n{text}");
        let series = format!("flyt_cluster_gpu_compute_units{{node=\"{node}\",gpu=\"0\",state=\"allocated\"}}");
        assert_eq!(series_value(&text, &series), Some(20.0), "no {series} in:\n{text}");
    }
    for node in ["node-a", "node-b"] {
        let text = scrape(&cluster.node(node).metrics_address());
        let series = format!("flyt_node_slice_sms{{node=\"{node}\",gpu=\"0\",allocation=\"{id}\"}}");
        assert_eq!(series_value(&text, &series), Some(20.0), "no {series} in:\n{text}");
    }

    // A driver-API program through the client manager: two devices, disjoint allocations in
    // the two windows, copies between them staged through the app.
    if let Some(program) = &program {
        let (code, stdout, stderr) = run_through_client_manager(program, &socket);
        assert_eq!(code, 0, "{stdout}\n{stderr}");
        for line in [
            "devices: 2",
            "two identities: yes",
            "no peer path between the servers' GPUs: yes",
            "allocations named by their devices: yes",
            "disjoint addresses: yes",
            "each server's addresses in its window: yes",
            "peer copy from device 0 to device 1: yes",
            "copy back from device 1 to device 0: yes",
            "PASSED: 0 failure(s)",
        ] {
            assert!(stdout.contains(line), "missing '{line}':\n{stdout}\n{stderr}");
        }
    }

    // Moves, resizes, checkpoints and restarts of a spread allocation are refused with the reason.
    let (code, _, stderr) = cluster.flytctl(&["migrate", VM, "--to", "node-b"]);
    assert!(
        code == 1 && stderr.contains("is spread over nodes node-a and node-b (--spread): moving it is not supported yet"),
        "exit {code}: {stderr}"
    );
    let (code, _, stderr) = cluster.flytctl(&["migrate", VM, "--gpu", "1", "--to", "node-a/0"]);
    assert!(code == 1 && stderr.contains("is spread over nodes") && stderr.contains("moving it is not supported"), "exit {code}: {stderr}");
    let (code, _, stderr) = cluster.flytctl(&["change-config", VM, "--compute-units", "10"]);
    assert!(code == 1 && stderr.contains("resizing it is not supported yet"), "exit {code}: {stderr}");
    let (code, _, stderr) = cluster.flytctl(&["checkpoint", VM, "--to", "/tmp/nowhere"]);
    assert!(code == 1 && stderr.contains("checkpointing it is not supported yet"), "exit {code}: {stderr}");
    let (code, _, stderr) = cluster.flytctl(&["restart-server", VM]);
    assert!(code == 1 && stderr.contains("restarting its servers is not supported yet"), "exit {code}: {stderr}");

    // Removing the VM stops the servers on both nodes.
    cluster.flytctl_ok(&["vm", "remove", VM]);
    wait_until("both servers stopped", Duration::from_secs(20), || cluster.rpc_servers().is_empty().then_some(()));
}

/// `driver_two_nodes.c` built against Flyt's `libcuda.so.1`: the program and its lib folder.
fn build_two_nodes_program(cuda: &Path, scratch: &Path) -> (PathBuf, PathBuf) {
    fs::create_dir_all(scratch).unwrap();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cuda-shim/cdylib/tests/c/driver_two_nodes.c");
    flyt_test_support::driver_program(&source, cuda, scratch)
}

/// Runs `program` as an app of the VM whose client manager listens on `socket` (no
/// `FLYT_SERVER`: the client manager says where): exit code, stdout, stderr.
fn run_through_client_manager((program, lib): &(PathBuf, PathBuf), socket: &Path) -> (i32, String, String) {
    flyt_test_support::run_with_timeout(
        Command::new(program)
            .env("LD_LIBRARY_PATH", lib)
            .env("FLYT_CLIENT_MANAGER_SOCKET", socket)
            .env_remove("FLYT_SERVER")
            .env_remove("FLYT_TOKEN")
            .env_remove("CUDA_VISIBLE_DEVICES"),
        Duration::from_secs(60),
    )
}

/// The cluster manager killed at every step of a spread placement (stored, the first node's
/// server started, both started, recorded running): once it is back, the app that asked gets
/// both servers, each node runs exactly the allocation's server, and nothing else runs. Then
/// the further node's server dies: the allocation is released, the first node's server stopped.
#[test]
fn a_spread_placement_survives_a_cluster_manager_crash_at_every_step() {
    use std::os::unix::process::ExitStatusExt;

    let mut cluster = two_nodes();
    add_vm(&cluster, true);
    let socket = cluster.start_client_manager(VM);
    for point in ["place.stored_starting", "place.first_started", "place.node_started", "place.stored_running"] {
        cluster.cluster_manager().kill();
        cluster.start_cluster_manager_with(&[("FLYT_FAILPOINT", point.to_string())]);
        let app = cluster.start_locate(&socket, 600);
        let status = cluster.cluster_manager().wait_exit(Duration::from_secs(20));
        let status = status.unwrap_or_else(|| panic!("the cluster manager never reached {point}"));
        assert_eq!(status.signal(), Some(9), "{point}: {status:?}");
        cluster.start_cluster_manager();
        let reply = app.answer(Duration::from_secs(30));
        let addresses: Vec<&str> = reply["address"].as_str().unwrap_or_default().split(',').collect();
        assert_eq!(addresses.len(), 2, "{point}: {reply}");
        // Every allocation running, each of its servers alive and no other server running.
        let allocations = cluster.wait_settled(point);
        assert_eq!(allocations.len(), 1, "{point}");
        let further = &allocations[0]["further"][0];
        assert_eq!(further["node_id"], "node-b", "{point}: {}", allocations[0]);
        assert_eq!(addresses[1], further["addresses"][0].as_str().unwrap(), "{point}");
        assert_eq!(cluster.rpc_servers().len(), 2, "{point}: one server per node");
        // Between scenarios: the VM's allocation given back, every server stopped, and the
        // client manager no longer remembering it (it would serve it while the next armed
        // cluster manager is away).
        cluster.kill_apps();
        let log = format!("client-manager-{VM}");
        let released_before = cluster.log_count(&log, "the cluster released this allocation");
        cluster.flytctl_ok(&["vm", "remove", VM]);
        add_vm(&cluster, true);
        wait_until(&format!("{point}: every rpc-server stops"), Duration::from_secs(15), || cluster.rpc_servers().is_empty().then_some(()));
        wait_until(&format!("{point}: the client manager forgets the allocation"), Duration::from_secs(10), || {
            (cluster.log_count(&log, "the cluster released this allocation") > released_before).then_some(())
        });
    }

    // The further node's server dies: the app cannot use the allocation, so it goes, with the
    // first node's server.
    let (reply, _) = cluster.locate(&socket, 600);
    assert!(reply["address"].as_str().unwrap_or_default().contains(','), "{reply}");
    let allocation = cluster.wait_settled("a fresh spread allocation").remove(0);
    let further_pid = allocation["further"][0]["pid"].as_u64().unwrap();
    crate::harness::signal(u32::try_from(further_pid).unwrap(), nix::sys::signal::Signal::SIGKILL);
    wait_until("the allocation is released and node-a's server stopped", Duration::from_secs(30), || {
        (cluster.allocation_of(VM).is_none() && cluster.rpc_servers().is_empty()).then_some(())
    });
    assert!(cluster.log("cluster-manager").contains("the node no longer runs this allocation's rpc-server"));
}

/// A VM of two GPUs on one node moves whole to another node with two GPUs with room (`flytctl
/// migrate`): a session that made no call is refused with that reason and everything stays where
/// it was; then the allocation moves with a live driver-API app on both GPUs (when the toolkit's
/// cuda.h is at hand; `migrate_two_devices.c`, which checks every byte, pointer and device after
/// the move), its new server serving both GPUs there, the old one stopped, and the VM's next app
/// is sent to the new one. A node of one GPU is refused as too small.
#[test]
fn a_vm_of_two_gpus_moves_whole_to_a_node_with_two() {
    let two_gpus = |name: &str| {
        format!(
            "[{{ name = \"{name} 0\", memory_mib = 4096, sm_count = 40 }}, {{ name = \"{name} 1\", memory_mib = 4096, sm_count = 40 }}]"
        )
    };
    let mut cluster = Cluster::new(Options::default());
    cluster.start_node_with("node-a", "127.0.0.1", 40, 4096, &[("FLYT_NODE_MANAGER_EMULATED_GPUS", two_gpus("A"))]);
    cluster.start_node("node-b", "127.0.0.2", 40, 4096);
    cluster.start_node_with("node-c", "127.0.0.3", 40, 4096, &[("FLYT_NODE_MANAGER_EMULATED_GPUS", two_gpus("C"))]);
    for node in ["node-a", "node-b", "node-c"] {
        cluster.wait_node_up(node);
    }
    add_vm(&cluster, false);
    let socket = cluster.start_client_manager(VM);
    let (reply, _) = cluster.locate(&socket, 600);
    let before = cluster.allocation_of(VM).unwrap();
    assert_eq!(before["node_id"], "node-a", "{before}");

    let (code, _, stderr) = cluster.flytctl(&["migrate", VM, "--to", "node-b"]);
    assert!(code == 1 && stderr.contains("node-b has 1 of the 2 GPUs with room for the slice"), "exit {code}: {stderr}");

    // A session that made no call cannot be checkpointed: nothing moves.
    let stays = |cluster: &Cluster, timeout_ms: &str, reason: &str| {
        let (code, _, stderr) = cluster.flytctl(&["migrate", VM, "--to", "node-c", "--timeout-ms", timeout_ms]);
        assert!(
            code == 1 && stderr.contains(reason) && stderr.contains("stays where it was"),
            "exit {code}: {stderr}\n--- node-a ---\n{}",
            cluster.log("node-a")
        );
        let settled = cluster.wait_settled("the refused move");
        assert_eq!((settled[0]["node_id"].as_str(), &settled[0]["pid"]), (Some("node-a"), &before["pid"]), "{}", settled[0]);
    };
    let (_, session) = crate::harness::open_session(&reply);
    stays(&cluster, "500", "made no CUDA call");
    drop(session);

    // A driver-API app on both GPUs, paused where it waits for the move (its marker file).
    let live_app = paused_app(&cluster, &socket, "two-gpus");

    // It moves (with the app's session when there is one): both GPUs of node-c, one server, the
    // old one stopped.
    let moved = wait_until("the move", Duration::from_secs(40), || {
        let (code, stdout, stderr) = cluster.flytctl(&["migrate", VM, "--to", "node-c"]);
        match code {
            0 => Some(stdout),
            // The dropped session waits out the server's reconnect grace (10 s) for its client,
            // and a move meanwhile is refused at once with the reason.
            _ if stderr.contains("its client's connection broke") => None,
            _ => panic!("exit {code}: {stderr}\n--- node-a ---\n{}\n--- node-c ---\n{}", cluster.log("node-a"), cluster.log("node-c")),
        }
    });
    if let Some((app, marker)) = live_app {
        app_goes_on(app, &marker, "node-c");
    }
    assert!(moved.contains("moved from node-a/") && moved.contains("to node-c/"), "{moved}");
    let after = cluster.wait_settled("the move").remove(0);
    assert_eq!((after["node_id"].as_str(), after["extra_gpus"].as_array().map(Vec::len)), (Some("node-c"), Some(1)), "{after}");
    let gpus = format!("--gpu {},{}", after["gpu"], after["extra_gpus"][0]);
    let line = cmdline(after["pid"].as_u64().unwrap());
    assert!(line.contains(&gpus), "{gpus} not in {line}");
    assert!(!crate::harness::pid_alive(u32::try_from(before["pid"].as_u64().unwrap()).unwrap()), "the old server is stopped");
    for view in cluster.json(&["list-servernodes"]).as_array().unwrap() {
        let held: u64 = view["gpus"].as_array().unwrap().iter().map(|gpu| gpu["allocated_compute_units"].as_u64().unwrap()).sum();
        let expected = if view["node"]["node_id"] == "node-c" { 40 } else { 0 };
        assert_eq!(held, expected, "{view}");
    }
    // The VM's next app goes to the new server.
    let (reply, _) = cluster.locate(&socket, 0);
    assert_eq!(reply["address"], after["addresses"][0], "{reply}");
    assert_eq!(crate::harness::session_view(&reply), (1024 << 20, 20));
}

/// Issue 45, one GPU of an allocation (`flytctl migrate VM --gpu INDEX --to NODE/GPU`): a VM of
/// two GPUs on a node of three (of 40 SMs each, the slice 20: each GPU that stays has room for
/// the second slice the new server holds during the move). Refused with the reason: an index
/// out of range, a GPU the allocation has, a GPU without room (a fourth of 10 SMs). Then GPU
/// index 1 moves to the third GPU with a live driver-API app on both GPUs (when the toolkit's
/// cuda.h is at hand; `migrate_two_devices.c` checks every byte, pointer and device after the
/// move): the new server serves the first GPU and the third, in that order, the old one is
/// stopped, `flytctl list-vms` lists the new GPU at index 1, the old GPU's slice is free. A
/// cluster manager that dies mid-move rolls it back (before the switch) or finishes it (after,
/// moving index 1 back), the app going on either way, and the VM's next app is sent to the
/// newest server.
#[test]
fn one_gpu_of_a_vm_of_two_moves_to_a_third_gpu_of_its_node() {
    let gpus = "[{ name = \"A 0\", memory_mib = 4096, sm_count = 40 }, { name = \"A 1\", memory_mib = 4096, sm_count = 40 }, \
                { name = \"A 2\", memory_mib = 4096, sm_count = 40 }, { name = \"A small\", memory_mib = 4096, sm_count = 10 }]";
    let mut cluster = Cluster::new(Options::default());
    cluster.start_node_with("node-a", "127.0.0.1", 40, 4096, &[("FLYT_NODE_MANAGER_EMULATED_GPUS", gpus.to_string())]);
    cluster.start_node("node-b", "127.0.0.2", 40, 4096);
    cluster.wait_node_up("node-a");
    cluster.wait_node_up("node-b");
    add_vm(&cluster, false);
    let socket = cluster.start_client_manager(VM);
    let _ = cluster.locate(&socket, 600);
    let before = cluster.allocation_of(VM).unwrap();
    assert_eq!((before["node_id"].as_str(), before["extra_gpus"].as_array().map(Vec::len)), (Some("node-a"), Some(1)), "{before}");
    let (first, second) = (before["gpu"].as_u64().unwrap(), before["extra_gpus"][0].as_u64().unwrap());
    let third = (0..3).find(|gpu| ![first, second].contains(gpu)).unwrap();
    let (first, second, third) = (first.to_string(), second.to_string(), third.to_string());

    let refused = |args: &[&str], reason: &str| {
        let mut all = vec!["migrate", VM];
        all.extend_from_slice(args);
        let (code, _, stderr) = cluster.flytctl(&all);
        assert!(code == 1 && stderr.contains(reason), "{args:?}: exit {code}: {stderr}");
    };
    refused(&["--gpu", "2", "--to", &format!("node-a/{third}")], "there is no GPU at index 2 (0 to 1)");
    refused(&["--gpu", "1", "--to", &format!("node-a/{first}")], &format!("GPU {first} of node-a is already in allocation"));
    refused(&["--gpu", "1", "--to", "node-a/3"], "target full: node-a GPU 3 has 10 SMs and 4096 MiB free");
    refused(&["--gpu", "1", "--to", "node-b/0"], "moves to another GPU of that node only");
    let settled = cluster.wait_settled("the refused moves");
    assert_eq!(settled[0]["pid"], before["pid"], "{}", settled[0]);

    // A driver-API app on both GPUs, paused where it waits for the move (its marker file).
    let live_app = paused_app(&cluster, &socket, "one-gpu");

    // A cluster manager that dies once the session is restored on the new server, before the
    // switch: the move is rolled back, the old server and set stay.
    crash_mid_move(&mut cluster, "move.copied", &[VM, "--gpu", "1", "--to", &format!("node-a/{third}")]);
    let settled = cluster.wait_settled("the rolled-back move").remove(0);
    assert_eq!((&settled["pid"], settled["extra_gpus"][0].to_string()), (&before["pid"], second.clone()), "{settled}");

    let (code, moved, stderr) = cluster.flytctl(&["migrate", VM, "--gpu", "1", "--to", &format!("node-a/{third}")]);
    assert!(code == 0, "exit {code}: {stderr}\n--- node-a ---\n{}", cluster.log("node-a"));
    assert!(moved.contains(&format!("moved from node-a/{first},{second} to node-a/{first},{third} with ")), "{moved}");
    if live_app.is_some() {
        assert!(moved.contains("with 1 app in "), "{moved}");
    }
    let after = cluster.wait_settled("the move").remove(0);
    assert_eq!(
        (after["node_id"].as_str(), after["gpu"].to_string(), after["extra_gpus"][0].to_string()),
        (Some("node-a"), first.clone(), third.clone()),
        "{after}"
    );
    assert_ne!(after["pid"], before["pid"]);
    let line = cmdline(after["pid"].as_u64().unwrap());
    assert!(line.contains(&format!("--gpu {first},{third}")), "{line}");
    assert!(!crate::harness::pid_alive(u32::try_from(before["pid"].as_u64().unwrap()).unwrap()), "the old server is stopped");
    let listed = cluster.flytctl_ok(&["list-vms"]);
    assert!(listed.contains(&format!("1: node-a/{third} ")) && !listed.contains(&format!("1: node-a/{second} ")), "{listed}");
    // One slice on each GPU of the new set, none left on the old GPU.
    let held = |cluster: &mut Cluster, gpu: &str| {
        let nodes = cluster.json(&["list-servernodes"]);
        let view = nodes.as_array().unwrap().iter().find(|view| view["node"]["node_id"] == "node-a").unwrap().clone();
        let usage =
            view["gpus"].as_array().unwrap().iter().find(|usage| usage["gpu"]["index"].as_u64() == gpu.parse().ok()).unwrap().clone();
        (usage["allocated_compute_units"].as_u64().unwrap(), usage["allocations"].as_u64().unwrap())
    };
    assert_eq!((held(&mut cluster, &first), held(&mut cluster, &third), held(&mut cluster, &second)), ((20, 1), (20, 1), (0, 0)));

    // One that dies after the switch of a move back (index 1 to the old GPU): the move is
    // finished, the app going on at the newest server.
    crash_mid_move(&mut cluster, "move.switched", &[VM, "--gpu", "1", "--to", &format!("node-a/{second}")]);
    let back = cluster.wait_settled("the finished move").remove(0);
    assert_eq!((back["gpu"].to_string(), back["extra_gpus"][0].to_string()), (first.clone(), second.clone()), "{back}");
    assert!(!crate::harness::pid_alive(u32::try_from(after["pid"].as_u64().unwrap()).unwrap()), "the moved-from server is stopped");
    assert_eq!((held(&mut cluster, &first), held(&mut cluster, &second), held(&mut cluster, &third)), ((20, 1), (20, 1), (0, 0)));
    assert!(cluster.log("cluster-manager").contains("finishing a move left under way"));

    if let Some((app, marker)) = live_app {
        app_goes_on(app, &marker, "the new server");
    }
    // The VM's next app goes to the newest server.
    let (reply, _) = cluster.locate(&socket, 0);
    assert_eq!(reply["address"], back["addresses"][0], "{reply}");
}
