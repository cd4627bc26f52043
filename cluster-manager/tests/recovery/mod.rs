//! What survives what. Each crash is a fail point (`FLYT_FAILPOINT`): the daemon kills itself
//! with SIGKILL right after the named step, as `kill -9` at that moment would. After each one
//! the daemon is restarted and the cluster must settle by itself: every allocation `Running`
//! with a live server of its own (or released), no rpc-server that no allocation owns, and the
//! VM served again, without an admin.

use std::{
    os::unix::process::ExitStatusExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use nix::sys::signal::Signal;

use crate::harness::{Cluster, MIB, Options, StoreKind, Value, open_session, pid_alive, session_view, signal, wait_until};

const VM: &str = "10.0.0.1";

/// The cluster manager's steps, in the order they happen.
const PLACEMENT_STEPS: [&str; 3] = ["place.stored_starting", "place.node_started", "place.stored_running"];
const RESIZE_STEPS: [&str; 3] = ["resize.stored_pending", "resize.node_resized", "resize.vm_updated"];
const RELEASE_STEPS: [&str; 2] = ["release.begin", "release.removed"];
/// The node manager's start: after the spawn, and after the server listens (both before the
/// server is recorded).
const SPAWN_STEPS: [&str; 2] = ["node.spawned", "node.listening"];

/// One node (80 SMs, 8 GiB) and one VM (20 SMs, 1 GiB) with its client manager.
fn one_node_one_vm(store: StoreKind, node_env: &[(&str, String)]) -> (Cluster, PathBuf) {
    let expected_store = match &store {
        StoreKind::Embedded => "embedded:",
        StoreKind::Mongo(_) => "mongodb:",
    };
    let mut cluster = Cluster::new(Options { store, ..Options::default() });
    let status = cluster.json(&["status"]);
    assert!(status["store"].as_str().unwrap().starts_with(expected_store), "{status}");
    cluster.start_node_with("node-a", "127.0.0.1", 80, 8192, node_env);
    cluster.wait_node_up("node-a");
    cluster.flytctl_ok(&["vm", "add", VM, "--host-ip", "127.0.0.1", "--compute-units", "20", "--memory-mib", "1024"]);
    let socket = cluster.start_client_manager(VM);
    (cluster, socket)
}

/// `one_node_one_vm` whose apps wait at most `request_timeout_seconds` for a placement.
fn one_node_one_vm_with(store: StoreKind, request_timeout_seconds: u64) -> (Cluster, PathBuf) {
    let mut cluster = Cluster::new(Options { store, request_timeout_seconds, ..Options::default() });
    cluster.start_node("node-a", "127.0.0.1", 80, 8192);
    cluster.wait_node_up("node-a");
    cluster.flytctl_ok(&["vm", "add", VM, "--host-ip", "127.0.0.1", "--compute-units", "20", "--memory-mib", "1024"]);
    let socket = cluster.start_client_manager(VM);
    (cluster, socket)
}

/// Replaces the cluster manager by one that dies at `point`.
fn arm_cluster_manager(cluster: &mut Cluster, point: &str) {
    cluster.cluster_manager().kill();
    cluster.start_cluster_manager_with(&[("FLYT_FAILPOINT", point.to_string())]);
}

/// Waits for the armed cluster manager to die at `point`, then starts a plain one.
fn crash_and_restart(cluster: &mut Cluster, point: &str) {
    let status = cluster.cluster_manager().wait_exit(Duration::from_secs(20));
    let status = status.unwrap_or_else(|| panic!("the cluster manager never reached {point}"));
    assert_eq!(status.signal(), Some(9), "{point}: {status:?}");
    assert!(cluster.log("cluster-manager").contains(&format!("fail point {point} reached")), "{point}");
    cluster.start_cluster_manager();
}

/// Releases the VM's allocation (as an admin would between scenarios, not to recover) and
/// waits until its server is gone and the client manager has heard of it.
fn release_everything(cluster: &mut Cluster) {
    cluster.kill_apps();
    let released_before = cluster.log_count(&format!("client-manager-{VM}"), "the cluster released this allocation");
    let had_allocation = cluster.allocation_of(VM).is_some();
    cluster.flytctl_ok(&["vm", "remove", VM]);
    cluster.flytctl_ok(&["vm", "add", VM, "--host-ip", "127.0.0.1", "--compute-units", "20", "--memory-mib", "1024"]);
    wait_until("every rpc-server stops", Duration::from_secs(15), || cluster.rpc_servers().is_empty().then_some(()));
    if had_allocation {
        wait_until("the client manager forgets the allocation", Duration::from_secs(10), || {
            (cluster.log_count(&format!("client-manager-{VM}"), "the cluster released this allocation") > released_before).then_some(())
        });
    }
}

fn allocation(cluster: &Cluster) -> Value {
    cluster.allocation_of(VM).expect("the VM's allocation")
}

fn number(value: &Value) -> u64 {
    value.as_u64().unwrap_or_else(|| panic!("not a number: {value}"))
}

/// The cluster manager killed at every step of a placement, a resize and a release.
fn cluster_manager_crashes(store: StoreKind) {
    let (mut cluster, socket) = one_node_one_vm(store, &[]);

    // Placement: the app that asked gets its GPU once the cluster manager is back.
    for point in PLACEMENT_STEPS {
        arm_cluster_manager(&mut cluster, point);
        let app = cluster.start_locate(&socket, 600);
        crash_and_restart(&mut cluster, point);
        let reply = app.answer(Duration::from_secs(30));
        assert!(reply["address"].is_string(), "{point}: {reply}");
        assert_eq!(session_view(&reply), (1024 * MIB, 20), "{point}");
        assert_eq!(cluster.wait_settled(point).len(), 1, "{point}");
        release_everything(&mut cluster);
    }

    // Resize: the stored intent is finished after the restart; the server, the allocation and
    // the VM's requirement agree on the new size.
    let (reply, _) = cluster.locate(&socket, 600);
    for (point, (units, mib)) in RESIZE_STEPS.into_iter().zip([(40u64, 2048u64), (20, 1024), (60, 3072)]) {
        arm_cluster_manager(&mut cluster, point);
        let (code, _, stderr) =
            cluster.flytctl(&["change-config", VM, "--compute-units", &units.to_string(), "--memory-mib", &mib.to_string()]);
        assert_eq!(code, 3, "{point}: the cluster manager should have died during the call: {stderr}");
        crash_and_restart(&mut cluster, point);
        wait_until(&format!("{point}: the resize is finished"), Duration::from_secs(20), || {
            let allocation = allocation(&cluster);
            (allocation["pending_resize"].is_null()
                && number(&allocation["compute_units"]) == units
                && number(&allocation["memory"]) == mib)
                .then_some(())
        });
        cluster.wait_settled(point);
        assert_eq!(session_view(&reply), (mib * MIB, i32::try_from(units).unwrap()), "{point}: the server's slice");
        let requirement = cluster.json(&["vm", "list"]).as_array().unwrap()[0].clone();
        assert_eq!((number(&requirement["compute_units"]), number(&requirement["memory"])), (units, mib), "{point}");
    }
    cluster.flytctl_ok(&["change-config", VM, "--compute-units", "20", "--memory-mib", "1024"]);
    release_everything(&mut cluster);

    // Release: the allocation of an app that exited goes idle and is released; killed at each
    // step, the restarted cluster manager ends with no allocation and no server.
    for point in RELEASE_STEPS {
        arm_cluster_manager(&mut cluster, point);
        let (reply, _) = cluster.locate(&socket, 0);
        assert!(reply["address"].is_string(), "{point}: {reply}");
        crash_and_restart(&mut cluster, point);
        wait_until(&format!("{point}: the release is finished"), Duration::from_secs(20), || {
            (cluster.allocation_of(VM).is_none() && cluster.rpc_servers().is_empty()).then_some(())
        });
        // The VM gets a GPU again.
        let (reply, _) = cluster.locate(&socket, 600);
        assert_eq!(session_view(&reply), (1024 * MIB, 20), "{point}");
        cluster.wait_settled(point);
        release_everything(&mut cluster);
    }
}

/// The node manager killed mid-start (after the spawn, after the server listens): the app
/// is refused with the reason, the restarted node manager stops the server it never recorded,
/// and the VM's next app gets a GPU.
fn node_manager_crashes(store: StoreKind) {
    let (mut cluster, socket) = one_node_one_vm(store, &[("FLYT_FAILPOINT", SPAWN_STEPS[0].to_string())]);
    for (index, point) in SPAWN_STEPS.into_iter().enumerate() {
        if index > 0 {
            cluster.node("node-a").kill();
            cluster.start_node_with("node-a", "127.0.0.1", 80, 8192, &[("FLYT_FAILPOINT", point.to_string())]);
            cluster.wait_node_up("node-a");
        }
        // The app waits while its node manager dies mid-start and comes back: the cluster
        // manager asks the node again until it answers, within the app's request timeout.
        let pending = cluster.start_locate(&socket, 600);
        let status = cluster.node("node-a").wait_exit(Duration::from_secs(20)).unwrap_or_else(|| panic!("node-a never reached {point}"));
        assert_eq!(status.signal(), Some(9), "{point}: {status:?}");
        assert!(!cluster.rpc_servers().is_empty() || point == SPAWN_STEPS[0], "{point}: the server should outlive its node manager");

        cluster.start_node("node-a", "127.0.0.1", 80, 8192);
        let reply = pending.answer(Duration::from_secs(25));
        assert_eq!(session_view(&reply), (1024 * MIB, 20), "{point}: {reply}");
        cluster.wait_settled(point);
        assert_eq!(cluster.rpc_servers().len(), 1, "{point}: the unrecorded server is stopped, one serves the app");
        release_everything(&mut cluster);
    }
}

/// An app that asks while its node manager is down for 2 s gets its server once the node
/// manager is back; one whose node stays down past the request timeout gets an error naming
/// the node.
fn an_app_waits_out_a_node_manager_restart(store: StoreKind) {
    let (mut cluster, socket) = one_node_one_vm_with(store, 6);
    cluster.node("node-a").kill();
    let started = Instant::now();
    let pending = cluster.start_locate(&socket, 600);
    std::thread::sleep(Duration::from_secs(2));
    assert!(pending.answered_within(Duration::from_millis(10)).is_none(), "answered while the node manager was down");
    cluster.start_node("node-a", "127.0.0.1", 80, 8192);
    let reply = pending.answer(Duration::from_secs(15));
    assert_eq!(session_view(&reply), (1024 * MIB, 20), "{reply}");
    assert!(started.elapsed() < Duration::from_secs(6), "took {:?}", started.elapsed());
    assert!(cluster.log("cluster-manager").contains("the node does not answer: asking again until it does"));
    cluster.wait_settled("after the restart");
    release_everything(&mut cluster);

    cluster.node("node-a").kill();
    let started = Instant::now();
    let (refused, _) = cluster.locate(&socket, 0);
    let reason = refused["refused"].as_str().unwrap_or_else(|| panic!("{refused}"));
    assert!(reason.contains("node-a") && reason.contains("did not answer"), "{reason}");
    assert!(started.elapsed() >= Duration::from_secs(4) && started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    assert!(cluster.allocation_of(VM).is_none(), "the placement that never started is released");
}

/// Each scenario `run(store)` as two tests: on the embedded store, and on MongoDB (skipped, with a
/// line saying so, without `FLYT_TEST_MONGODB_URI`).
macro_rules! on_each_store {
    ($($embedded:ident, $mongodb:ident => $run:ident;)*) => {
        $(
            #[test]
            fn $embedded() {
                $run(StoreKind::Embedded);
            }

            #[test]
            fn $mongodb() {
                if let Some(store) = StoreKind::mongo_from_env(stringify!($mongodb)) {
                    $run(store);
                }
            }
        )*
    };
}

on_each_store! {
    an_app_waits_out_a_node_manager_restart_embedded_store, an_app_waits_out_a_node_manager_restart_mongodb_store
        => an_app_waits_out_a_node_manager_restart;
    cluster_manager_crashes_at_every_step_embedded_store, cluster_manager_crashes_at_every_step_mongodb_store
        => cluster_manager_crashes;
    node_manager_crashes_mid_start_embedded_store, node_manager_crashes_mid_start_mongodb_store => node_manager_crashes;
}

/// A 5 s outage of the cluster manager: the app of a VM whose allocation is known gets it at
/// once; the app of a VM that needs a placement waits, and gets its GPU once the manager is back.
#[test]
fn apps_ride_out_a_cluster_manager_outage() {
    let (mut cluster, known_vm) = one_node_one_vm(StoreKind::Embedded, &[]);
    cluster.flytctl_ok(&["vm", "add", "10.0.0.2", "--host-ip", "127.0.0.1", "--compute-units", "20", "--memory-mib", "1024"]);
    let new_vm = cluster.start_client_manager("10.0.0.2");
    let (first, _) = cluster.locate(&known_vm, 600);

    cluster.cluster_manager().kill();
    let started = Instant::now();
    let (again, _) = cluster.locate(&known_vm, 600);
    assert!(started.elapsed() < Duration::from_secs(2), "a known allocation took {:?}", started.elapsed());
    assert_eq!(again["address"], first["address"], "{again}");
    assert_eq!(session_view(&again), (1024 * MIB, 20));

    let waiting = cluster.start_locate(&new_vm, 600);
    assert!(waiting.answered_within(Duration::from_secs(5)).is_none(), "answered while the cluster manager was down");
    assert!(cluster.log("client-manager-10.0.0.2").contains("waits up to 30 s for it to come back"), "the wait is not logged");
    cluster.start_cluster_manager();
    let reply = waiting.answer(Duration::from_secs(30));
    assert_eq!(session_view(&reply), (1024 * MIB, 20), "{reply}");
    assert_eq!(cluster.wait_settled("after the outage").len(), 2);
}

/// Held sessions on the VM's server, as running apps would have.
fn running_app(cluster: &mut Cluster, socket: &Path) -> (Value, Box<dyn crate::harness::ReadWrite + Send>) {
    let (reply, _) = cluster.locate(socket, 600);
    let (view, session) = open_session(&reply);
    assert_eq!(view, (1024 * MIB, 20));
    wait_until("the node reports the session", Duration::from_secs(10), || {
        cluster.allocation_of(VM).is_some_and(|allocation| number(&allocation["sessions"]) >= 1).then_some(())
    });
    (reply, session)
}

/// A cluster manager stopped (SIGSTOP) for 10 s, far longer than the node timeout and the node
/// grace together, does not hold its own silence against the node: no allocation is lost.
#[test]
fn a_stopped_cluster_manager_loses_no_allocation() {
    let options =
        Options { node_timeout_ms: 2000, node_grace_seconds: 3, client_timeout_ms: 2000, idle_grace_seconds: 3, ..Options::default() };
    let mut cluster = Cluster::new(options);
    cluster.start_node("node-a", "127.0.0.1", 80, 8192);
    cluster.wait_node_up("node-a");
    cluster.flytctl_ok(&["vm", "add", VM, "--host-ip", "127.0.0.1", "--compute-units", "20", "--memory-mib", "1024"]);
    let socket = cluster.start_client_manager(VM);
    let (reply, _session) = running_app(&mut cluster, &socket);
    let before = allocation(&cluster);

    let manager = cluster.cluster_manager().pid();
    signal(manager, Signal::SIGSTOP);
    std::thread::sleep(Duration::from_secs(10));
    signal(manager, Signal::SIGCONT);
    // Longer than node timeout + node grace, and than client timeout + idle grace.
    std::thread::sleep(Duration::from_secs(6));

    let log = cluster.log("cluster-manager");
    assert!(log.contains("did not run for"), "the stall was not noticed:\n{log}");
    assert!(!log.contains("marked down") && !log.contains("allocation released"), "the stall was held against the node:\n{log}");
    let after = allocation(&cluster);
    assert_eq!((&after["id"], &after["pid"]), (&before["id"], &before["pid"]));
    assert_eq!(cluster.node_health("node-a").as_deref(), Some("Up"));
    assert!(number(&after["sessions"]) >= 1, "the running session is gone: {after}");
    assert_eq!(session_view(&reply), (1024 * MIB, 20));
    cluster.wait_settled("after the stall");
}

/// A node manager away for 8 s (longer than the node timeout, shorter than the node grace):
/// its node is marked down, its allocation kept; back, it adopts its server and the app's
/// session carries on.
#[test]
fn a_node_manager_restarted_after_8_s_keeps_its_apps() {
    let (mut cluster, socket) = one_node_one_vm(StoreKind::Embedded, &[]);
    let (reply, _session) = running_app(&mut cluster, &socket);
    let before = allocation(&cluster);
    let server = u32::try_from(number(&before["pid"])).unwrap();

    cluster.node("node-a").kill();
    std::thread::sleep(Duration::from_secs(8));
    assert_eq!(cluster.node_health("node-a").as_deref(), Some("Down"));
    assert!(pid_alive(server), "the rpc-server died with its node manager");
    assert_eq!(allocation(&cluster)["id"], before["id"], "released within the node grace period");

    cluster.start_node("node-a", "127.0.0.1", 80, 8192);
    cluster.wait_node_up("node-a");
    assert!(cluster.log("cluster-manager").contains("back within its grace period"));
    let after = wait_until("the adopted server reports the running session", Duration::from_secs(10), || {
        let allocation = allocation(&cluster);
        (number(&allocation["sessions"]) >= 1).then_some(allocation)
    });
    assert_eq!((&after["id"], &after["pid"]), (&before["id"], &before["pid"]));
    assert_eq!(session_view(&reply), (1024 * MIB, 20));
    cluster.wait_settled("after the node manager's restart");
}
