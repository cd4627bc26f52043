//! `flytctl migrate`, `flytctl checkpoint` and `flytctl restart-server` with an app running through
//! the cluster: a driver-API program through Flyt's `libcuda.so.1`
//! (`cuda-shim/cdylib/tests/c/migrate_loop.c`) that asks its client manager for its GPU, keeps
//! device memory, a stream and an event, and checks every round that its memory holds what it wrote
//! the round before; its pointers must be the same at its end as at its start. The emulated device
//! places each worker's memory at addresses of its own, so the pointers survive only if the move
//! put the memory back where it was.
//!
//! Skipped (with a line saying so) when `FLYT_CUDA_HOME` is not set; `tools/test` sets it.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use crate::harness::{Cluster, Options, Value, binary, crash_mid_move, pid_alive, scrape, series_value, wait_until};

const VM: &str = "10.0.0.1";

/// The app, killed if the test ends before it does.
struct App(Option<Child>);

impl App {
    fn start(program: &Path, lib: &Path, client_manager: &Path, rounds: u32) -> Self {
        let child = Command::new(program)
            .args([rounds.to_string(), "10".into()])
            .env("LD_LIBRARY_PATH", lib)
            .env("FLYT_CLIENT_MANAGER_SOCKET", client_manager)
            .env_remove("FLYT_SERVER")
            .env_remove("FLYT_TOKEN")
            // Moves between nodes cannot carry the shared-memory channel (it needs one host):
            // the session uses its socket.
            .env("FLYT_SHM", "off")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the app");
        Self(Some(child))
    }

    /// Waits for the app's end: it must pass, with the same pointers at its end as at its start.
    fn finish(mut self) {
        let output = self.0.take().unwrap().wait_with_output().expect("the app's output");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success() && stdout.contains("PASSED: 0 failure(s)"), "the app failed:\n{stdout}\n{stderr}");
        let pointers: Vec<&str> = stdout.lines().filter(|line| line.starts_with("pointers:")).collect();
        assert!(pointers.len() == 2 && pointers[0] == pointers[1], "the app's pointers changed:\n{stdout}");
    }
}

impl Drop for App {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// An rpc-server that gives every session 4 MiB whatever its node manager asks: a node whose
/// servers cannot restore the app's memory.
fn small_server(cluster: &Cluster) -> PathBuf {
    let path = cluster.path("small-rpc-server");
    let script = format!(
        "#!/bin/sh\nprevious=\nfor argument in \"$@\"; do\n  shift\n  if [ \"$previous\" = --memory-quota ]; then argument=4194304; fi\n  set -- \"$@\" \"$argument\"\n  previous=$argument\ndone\nexec '{}' \"$@\"\n",
        binary("flyt-rpc-server").display()
    );
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// VM `VM` (20 SMs, 1 GiB, on a host with no GPU node), its client manager, a client holding its
/// allocation for the whole test (the app alone would leave it idle between its end and the next
/// step), and `migrate_loop` running `rounds` rounds through it. The client manager's socket and
/// the app.
fn vm_running_app(cluster: &mut Cluster, cuda: &Path, rounds: u32) -> (PathBuf, App) {
    cluster.flytctl_ok(&["vm", "add", VM, "--host-ip", "192.0.2.10", "--compute-units", "20", "--memory-mib", "1024"]);
    let socket = cluster.start_client_manager(VM);
    let (holder, _) = cluster.locate(&socket, 600);
    assert!(holder["address"].is_string(), "{holder}");
    let scratch = cluster.path("app");
    std::fs::create_dir_all(&scratch).unwrap();
    let source = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../cuda-shim/cdylib/tests/c/migrate_loop.c"));
    let (program, lib) = flyt_test_support::driver_program(source, cuda, &scratch);
    let app = App::start(&program, &lib, &socket, rounds);
    (socket, app)
}

fn number(value: &Value) -> u64 {
    value.as_u64().unwrap_or_else(|| panic!("not a number: {value}"))
}

/// The VM's allocation once its server reports `sessions` sessions.
fn with_sessions(cluster: &Cluster, node: &str, sessions: u64) -> Value {
    wait_until(&format!("{sessions} session(s) on {node}"), Duration::from_secs(30), || {
        cluster.allocation_of(VM).filter(|allocation| allocation["node_id"] == node && allocation["sessions"] == sessions)
    })
}

/// A refused move: exit 1 with `message` in one line (returned), and the allocation as it was.
fn refused(cluster: &Cluster, args: &[&str], message: &str, before: &Value) -> String {
    let mut all = vec!["migrate"];
    all.extend_from_slice(args);
    let (code, stdout, stderr) = cluster.flytctl(&all);
    assert!(code == 1 && stderr.contains(message), "flytctl {all:?}: exit {code}, expected {message:?}: {stdout}{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    let now = cluster.allocation_of(VM).expect("the allocation");
    assert_eq!((&now["id"], &now["node_id"], &now["pid"]), (&before["id"], &before["node_id"], &before["pid"]), "{all:?}");
    assert!(now["pending_move"].is_null(), "{now}");
    eprintln!("flytctl {}: {stderr}", all.join(" "));
    stderr
}

/// A running app moves from node-a to node-b (another host: the snapshot streams between the
/// node managers) and on to node-e (node-b's host: no copy); moves to a full, unknown, drained
/// or refusing node, or of an unknown allocation, fail with one line and leave it running where
/// it was; `flytctl checkpoint` writes its snapshot and lets it go on; a cluster manager that
/// dies mid-move rolls the move back (before the switch) or finishes it (after), the app going
/// on either way.
#[test]
fn a_running_app_moves_with_its_allocation_and_failed_moves_leave_it_running() {
    let Some(cuda) = flyt_test_support::toolkit_from("FLYT_CUDA_HOME") else { return };
    let mut cluster = Cluster::new(Options::default());
    cluster.start_node("node-a", "127.0.0.1", 40, 4096);
    cluster.start_node("node-b", "127.0.0.2", 80, 8192);
    // Too few SMs for the VM's 20.
    cluster.start_node("node-c", "127.0.0.3", 10, 8192);
    let small = small_server(&cluster).display().to_string();
    cluster.start_node_with("node-d", "127.0.0.4", 80, 8192, &[("FLYT_NODE_MANAGER_RPC_SERVER_BINARY", small)]);
    // On node-b's host: a move between them passes its snapshots through node-b's folder.
    cluster.start_node("node-e", "127.0.0.2", 80, 8192);
    for node in ["node-a", "node-b", "node-c", "node-d", "node-e"] {
        cluster.wait_node_up(node);
    }
    // On a host with no GPU node: the fullest GPU that fits it is node-a's.
    let (socket, app) = vm_running_app(&mut cluster, &cuda, 400);
    let before = with_sessions(&cluster, "node-a", 1);
    let id = before["id"].as_str().unwrap().to_string();

    // --- refusals: one line each, and the app goes on where it was.
    refused(&cluster, &[VM, "--to", "node-c"], "target full: node-c GPU 0 has 10 SMs and 8192 MiB free", &before);
    refused(&cluster, &[VM, "--to", "node-z"], "unknown node node-z", &before);
    refused(&cluster, &["10.9.9.9", "--to", "node-b"], "unknown allocation or VM 10.9.9.9", &before);
    refused(&cluster, &[VM, "--to", "node-b/3"], "node node-b has no GPU 3", &before);
    cluster.flytctl_ok(&["drain", "node-b"]);
    refused(&cluster, &[VM, "--to", "node-b"], "node node-b is drained", &before);
    cluster.flytctl_ok(&["undrain", "node-b"]);
    // node-d starts its server but cannot restore the app's 9 MiB in 4: the app was paused and
    // checkpointed, and goes on at node-a; node-d's server is gone.
    let stderr = refused(
        &cluster,
        &[VM, "--to", "node-d"],
        "the allocation stays where it was, its apps running there: node-d refused to restore session",
        &before,
    );
    assert!(stderr.contains("quota"), "{stderr}");
    wait_until("node-d's server stops", Duration::from_secs(10), || {
        (cluster.rpc_servers() == vec![(u32::try_from(number(&before["pid"])).unwrap(), id.clone())]).then_some(())
    });
    with_sessions(&cluster, "node-a", 1);

    // --- the move: same allocation, node-b's server, the old one gone, new apps sent there.
    let (code, stdout, stderr) = cluster.flytctl(&["migrate", &id, "--to", "node-b"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    eprintln!("flytctl migrate {id} --to node-b:\n{stdout}");
    let after = cluster.allocation_of(VM).expect("the allocation after the move");
    let address = after["addresses"][0].as_str().unwrap().to_string();
    assert!(stdout.contains(&format!("moved to {address}: snapshot ")), "{stdout}");
    assert!(stdout.contains(&format!("allocation {id} moved from node-a/0 to node-b/0 with 1 app in ")), "{stdout}");
    assert_eq!((after["id"].as_str(), after["node_id"].as_str(), number(&after["sm_percentage"])), (Some(id.as_str()), Some("node-b"), 25));
    assert!(after["pending_move"].is_null() && after["pid"] != before["pid"], "{after}");
    assert!(!pid_alive(u32::try_from(number(&before["pid"])).unwrap()), "the old server still runs");
    assert_eq!(cluster.rpc_servers(), vec![(u32::try_from(number(&after["pid"])).unwrap(), id.clone())]);
    let (located, _) = cluster.locate(&socket, 0);
    assert_eq!(located["address"].as_str(), Some(address.as_str()), "{located}");
    let table = cluster.flytctl_ok(&["list-allocations"]);
    assert!(table.contains("node-b/0"), "{table}");
    with_sessions(&cluster, "node-b", 1);

    // --- checkpoint: a snapshot file in the folder, and the app goes on.
    let snapshots = cluster.path("snapshots");
    let folder = snapshots.display().to_string();
    let (code, stdout, stderr) = cluster.flytctl(&["checkpoint", VM, "--to", &folder]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    eprintln!("flytctl checkpoint {VM} --to {folder}:\n{stdout}");
    assert!(stdout.contains(&format!("allocation {id}: 1 snapshot(s) in {folder} on node-b; the apps go on")), "{stdout}");
    let files: Vec<String> =
        std::fs::read_dir(&snapshots).unwrap().map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(files.len() == 1 && files[0].ends_with(".flyt-snapshot") && stdout.contains(&files[0][..32]), "{files:?} {stdout}");
    let (code, _, stderr) = cluster.flytctl(&["checkpoint", "10.9.9.9", "--to", &folder]);
    assert!(code == 1 && stderr.contains("unknown allocation or VM 10.9.9.9"), "{stderr}");
    let (code, _, stderr) = cluster.flytctl(&["checkpoint", VM, "--to", "snapshots"]);
    assert!(code == 1 && stderr.contains("must be an absolute path"), "{stderr}");
    let text = scrape(&cluster.cluster_manager().metrics_address());
    assert_eq!(series_value(&text, "flyt_cluster_moves_total{outcome=\"moved\"}"), Some(1.0), "{text}");
    assert_eq!(series_value(&text, "flyt_cluster_moves_total{outcome=\"refused\"}"), Some(6.0), "{text}");

    // --- to another node of the same host: no copy between node managers.
    let (code, stdout, stderr) = cluster.flytctl(&["migrate", VM, "--to", "node-e"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains(", copy 0.0 ms, ") && stdout.contains("from node-b/0 to node-e/0 with 1 app"), "{stdout}");
    with_sessions(&cluster, "node-e", 1);

    // --- the cluster manager dies after the app's session was restored on node-a but before
    // the switch: the move is rolled back and the app goes on at node-e.
    crash_mid_move(&mut cluster, "move.copied", &[VM, "--to", "node-a"]);
    let settled = cluster.wait_settled("rolled back");
    assert_eq!(settled[0]["node_id"], "node-e", "{settled:?}");
    with_sessions(&cluster, "node-e", 1);
    // ... dies after the switch: the move is finished and the app goes on at node-a.
    crash_mid_move(&mut cluster, "move.switched", &[VM, "--to", "node-a"]);
    let settled = cluster.wait_settled("finished");
    assert_eq!((settled[0]["node_id"].as_str(), settled[0]["id"].as_str()), (Some("node-a"), Some(id.as_str())), "{settled:?}");
    with_sessions(&cluster, "node-a", 1);
    app.finish();
    let log = cluster.log("cluster-manager");
    assert!(log.contains("rolling back a move left under way") && log.contains("finishing a move left under way"), "{log}");
}

/// `flytctl restart-server`: the allocation's rpc-server is replaced by a fresh process on the
/// same addresses, twice, and the running app goes on at each new one with its pointers as they
/// were; a restart of an unknown allocation fails with one line.
#[test]
fn a_restarted_rpc_server_keeps_its_addresses_and_its_running_app() {
    let Some(cuda) = flyt_test_support::toolkit_from("FLYT_CUDA_HOME") else { return };
    let mut cluster = Cluster::new(Options::default());
    cluster.start_node("node-a", "127.0.0.1", 40, 4096);
    cluster.wait_node_up("node-a");
    let (socket, app) = vm_running_app(&mut cluster, &cuda, 300);
    let mut before = with_sessions(&cluster, "node-a", 1);
    let id = before["id"].as_str().unwrap().to_string();

    let (code, _, stderr) = cluster.flytctl(&["restart-server", "10.9.9.9"]);
    assert!(code == 1 && stderr.contains("unknown allocation or VM 10.9.9.9"), "exit {code}: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");

    // Twice: the second restart's old server was itself given the first one's snapshots.
    for target in [id.as_str(), VM] {
        let old_pid = number(&before["pid"]);
        let (code, stdout, stderr) = cluster.flytctl(&["restart-server", target]);
        assert_eq!(code, 0, "{stdout}{stderr}");
        eprintln!("flytctl restart-server {target}:\n{stdout}");
        let after = cluster.allocation_of(VM).expect("the allocation after the restart");
        let new_pid = number(&after["pid"]);
        assert_ne!(new_pid, old_pid, "{after}");
        assert!(
            stdout.contains(&format!("allocation {id}: rpc-server restarted (pid {old_pid} -> {new_pid}) with 1 app carried over in ")),
            "{stdout}"
        );
        assert!(stdout.contains("session ") && stdout.contains(" carried over: snapshot "), "{stdout}");
        assert_eq!(
            (&after["id"], &after["node_id"], &after["addresses"]),
            (&before["id"], &before["node_id"], &before["addresses"]),
            "{after}"
        );
        assert!(!pid_alive(u32::try_from(old_pid).unwrap()), "the old server still runs");
        assert_eq!(cluster.rpc_servers(), vec![(u32::try_from(new_pid).unwrap(), id.clone())]);
        let (located, _) = cluster.locate(&socket, 0);
        assert_eq!(located["address"], before["addresses"][0], "{located}");
        // The app is back on the new server, and node reports leave the allocation as it is.
        before = wait_until("the app back on the new server", Duration::from_secs(30), || {
            cluster.allocation_of(VM).filter(|allocation| number(&allocation["pid"]) == new_pid && allocation["sessions"] == 1)
        });
    }
    app.finish();
}

/// A node with two GPUs: the running app's allocation moves to the other GPU of its node and
/// back (`--to node` picks the GPU it does not run on), one server at a time outside a move; its
/// current GPU, and a node of one GPU it runs on, are refused with one line.
#[test]
fn an_allocation_moves_between_the_gpus_of_its_node() {
    let Some(cuda) = flyt_test_support::toolkit_from("FLYT_CUDA_HOME") else { return };
    let mut cluster = Cluster::new(Options::default());
    let two_gpus =
        "[{ name = \"Emulated A0\", memory_mib = 4096, sm_count = 40 }, { name = \"Emulated A1\", memory_mib = 4096, sm_count = 40 }]";
    cluster.start_node_with("node-a", "127.0.0.1", 40, 4096, &[("FLYT_NODE_MANAGER_EMULATED_GPUS", two_gpus.to_string())]);
    cluster.wait_node_up("node-a");
    let (socket, app) = vm_running_app(&mut cluster, &cuda, 400);
    let mut before = with_sessions(&cluster, "node-a", 1);
    let id = before["id"].as_str().unwrap().to_string();

    for round in 0..2 {
        let (from, to) = (number(&before["gpu"]), 1 - number(&before["gpu"]));
        refused(&cluster, &[VM, "--to", &format!("node-a/{from}")], &format!("already runs on node-a/{from}"), &before);
        // The first move names the GPU, the second lets placement pick the other one.
        let target = if round == 0 { format!("node-a/{to}") } else { "node-a".to_string() };
        let (code, stdout, stderr) = cluster.flytctl(&["migrate", &id, "--to", &target]);
        assert_eq!(code, 0, "{stdout}{stderr}");
        eprintln!("flytctl migrate {id} --to {target}:\n{stdout}");
        assert!(stdout.contains(&format!("allocation {id} moved from node-a/{from} to node-a/{to} with 1 app in ")), "{stdout}");
        let after = cluster.allocation_of(VM).expect("the allocation after the move");
        assert_eq!((after["node_id"].as_str(), number(&after["gpu"])), (Some("node-a"), to), "{after}");
        assert!(after["pending_move"].is_null() && after["pid"] != before["pid"], "{after}");
        assert!(!pid_alive(u32::try_from(number(&before["pid"])).unwrap()), "the old server still runs");
        // One server again, under the name its node gave it beside the old one.
        let servers = cluster.rpc_servers();
        assert_eq!(servers.len(), 1, "{servers:?}");
        assert_eq!(servers[0].0, u32::try_from(number(&after["pid"])).unwrap(), "{servers:?}");
        assert!(servers[0].1 == id || servers[0].1 == format!("{id}~gpu{to}"), "{servers:?}");
        let (located, _) = cluster.locate(&socket, 0);
        assert_eq!(located["address"], after["addresses"][0], "{located}");
        before = wait_until("the app on the new server", Duration::from_secs(30), || {
            cluster.allocation_of(VM).filter(|allocation| allocation["pid"] == after["pid"] && allocation["sessions"] == 1)
        });
    }
    app.finish();
    // One host: each move tried GPU to GPU first, which the emulated device refuses.
    let log = cluster.log("cluster-manager");
    assert_eq!(log.matches("not GPU to GPU; through the snapshot file").count(), 2, "{log}");
}
