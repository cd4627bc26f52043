//! Checkpoint, restore and live migration of a running app's session between rpc-servers,
//! driven through their control sockets with `flytctl session ...`. The app (a driver-API
//! program through Flyt's libcuda.so.1) keeps device memory of several sizes, a stream and an
//! event, and checks every round that its memory still holds what it wrote the round before; its
//! pointers must be the same at the end as at the start. The servers run the emulated device,
//! whose workers each place memory at addresses of their own (as a GPU's do), so the pointers
//! survive only if the restore put the memory back where it was.
//!
//! Skipped (with a line saying so) when `FLYT_CUDA_HOME` is not set; `tools/test` sets it.

#![allow(clippy::tests_outside_test_module, reason = "an integration test file is its own test crate")]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flyt_test_support::{Server, artifact, driver_program, run_with_timeout, scratch_dir};

const KEY: &str = "migration test cluster key, long enough";

struct Setup {
    scratch: PathBuf,
    program: PathBuf,
    lib: PathBuf,
    key: PathBuf,
    token: String,
}

fn set_up(name: &str) -> Option<Setup> {
    set_up_with(name, "migrate_loop.c")
}

/// The scratch folder, the driver program built from `tests/c/<source>` and a session token.
fn set_up_with(name: &str, source: &str) -> Option<Setup> {
    let Some(cuda) = std::env::var_os("FLYT_CUDA_HOME").map(PathBuf::from) else {
        eprintln!("skipped: FLYT_CUDA_HOME is not set (tools/test sets it)");
        return None;
    };
    let scratch = scratch_dir(name);
    let source = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c")).join(source);
    let (program, lib) = driver_program(&source, &cuda, &scratch);
    let key = scratch.join("cluster.key");
    std::fs::write(&key, KEY).unwrap();
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let claims = flyt_protocol::token::SessionClaims { allocation: "any".into(), expires_at: u64::MAX };
    let token = flyt_protocol::token::issue(KEY.as_bytes(), &claims).unwrap();
    Some(Setup { scratch, program, lib, key, token })
}

/// A server with a control socket, listening on a Unix socket and on TCP.
struct Node {
    server: Server,
    control: String,
    unix: String,
    tcp: String,
}

fn start_node(setup: &Setup, name: &str, extra: &[&str]) -> Node {
    let dir = setup.scratch.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let unix = format!("unix:{}", dir.join("data.sock").display());
    let control = format!("unix:{}", dir.join("control.sock").display());
    let key = setup.key.display().to_string();
    let mut args =
        vec!["--device", "emulated", "--listen", &unix, "--listen", "127.0.0.1:0", "--cluster-key-file", &key, "--control", &control];
    args.extend_from_slice(extra);
    let server = Server::start(&args, &dir);
    let tcp = server.addresses.iter().find(|address| !address.starts_with("unix:")).cloned().expect("a TCP address");
    Node { server, control, unix, tcp }
}

fn flytctl(setup: &Setup, args: &[&str]) -> (i32, String, String) {
    let mut command = Command::new(artifact("flytctl"));
    command.arg("--cluster-key-file").arg(&setup.key).args(args);
    run_with_timeout(&mut command, Duration::from_secs(120))
}

/// `flytctl session migrate` of `session` from the server at `control` to `to_control`, the app
/// to reconnect at `to`, with snapshots in `dir` and `extra` options.
fn migrate(setup: &Setup, control: &str, session: &str, to_control: &str, to: &str, dir: &Path, extra: &[&str]) -> (i32, String, String) {
    let dir = dir.display().to_string();
    let mut args = vec!["session", "migrate", "--control", control, session, "--to-control", to_control, "--to", to, "--dir", &dir];
    args.extend_from_slice(extra);
    flytctl(setup, &args)
}

/// The id of the one session on `node`, once there is one.
fn session_on(setup: &Setup, node: &Node) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, out, err) = flytctl(setup, &["--json", "session", "list", "--control", &node.control]);
        assert_eq!(code, 0, "session list: {err}");
        let sessions: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        if let Some(id) = sessions.as_array().and_then(|list| list.first()).and_then(|session| session["session_id"].as_u64()) {
            return id.to_string();
        }
        assert!(Instant::now() < deadline, "no session appeared on {}; its log:\n{}", node.control, node.server.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How the app reaches its server's memory.
#[derive(Clone, Copy)]
enum Channel {
    /// Everything over the socket (`FLYT_SHM=off`), pageable host buffers.
    Socket,
    /// The shared-memory channel (required), page-locked host buffers and a mapped host page
    /// the device reads: the segment must follow the session.
    SharedMemory,
}

fn start_app(setup: &Setup, server: &str, rounds: u32, channel: Channel) -> Child {
    let (shm, pinned) = match channel {
        Channel::Socket => ("off", "0"),
        Channel::SharedMemory => ("on", "1"),
    };
    spawn_app(setup, server, &[&rounds.to_string(), "10", "0", pinned], shm)
}

fn spawn_app(setup: &Setup, server: &str, args: &[&str], shm: &str) -> Child {
    Command::new(&setup.program)
        .args(args)
        .env("LD_LIBRARY_PATH", &setup.lib)
        .env("FLYT_SERVER", server)
        .env("FLYT_TOKEN", &setup.token)
        .env("FLYT_SHM", shm)
        .env("FLYT_SHM_SIZE", (256u64 << 20).to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the app")
}

/// Waits for the app; its pointer lines must match and it must pass.
fn finish_app(app: Child) -> String {
    let output = app.wait_with_output().expect("app output");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success() && stdout.contains("PASSED: 0 failure(s)"), "app failed:\n{stdout}\n{stderr}");
    let pointers: Vec<&str> = stdout.lines().filter(|line| line.starts_with("pointers:")).collect();
    assert_eq!(pointers.len(), 2, "{stdout}");
    assert_eq!(pointers[0], pointers[1], "the app's pointers changed:\n{stdout}");
    // The data connections a move leaves behind close with their server: nothing for the app.
    assert!(!stderr.contains("a data connection failed"), "the app was told of a left-behind data connection:\n{stderr}");
    stdout
}

fn snapshots(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|entries| entries.count()).unwrap_or(0)
}

/// Removes a folder when dropped, a failed test's too (other tests look for leftovers in /dev/shm).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Moves the app's session A -> B over TCP, B -> A over the Unix socket, twice; the app must
/// pass with the same pointers.
fn four_moves(name: &str, channel: Channel) {
    let Some(setup) = set_up(name) else { return };
    let a = start_node(&setup, "a", &[]);
    let b = start_node(&setup, "b", &[]);
    // Snapshots of the shared-memory run go to memory (tmpfs), where the device copies straight
    // into the file's pinned pages; the other run's go through staging buffers to a disk folder.
    let dir = match channel {
        Channel::Socket => setup.scratch.join("snapshots"),
        Channel::SharedMemory => PathBuf::from(format!("/dev/shm/migration-test-snapshots-{}", std::process::id())),
    };
    let _cleanup = RemoveOnDrop(dir.clone());
    let app = start_app(&setup, &a.unix, 400, channel);
    let mut here = &a;
    for (hop, (to, address)) in [(&b, &b.tcp), (&a, &a.unix), (&b, &b.tcp), (&a, &a.unix)].into_iter().enumerate() {
        let session = session_on(&setup, here);
        let (code, out, err) = migrate(&setup, &here.control, &session, &to.control, address, &dir, &[]);
        if code != 0 {
            // Both servers' logs: a failed move is decided by their order of events.
            panic!("move {hop} of session {session}: {out}{err}\n--- a ---\n{}\n--- b ---\n{}", a.server.log_text(), b.server.log_text());
        }
        assert!(out.contains(&format!("moved to {address}")), "{out}");
        here = to;
    }
    let stdout = finish_app(app);
    assert_eq!(snapshots(&dir), 0, "each snapshot is removed once its app is back");
    assert!(b.server.log_text().contains("session restored"));
    if matches!(channel, Channel::Socket) {
        // Its striped copies (8 MiB) go on over data connections joined at the server it moved to.
        assert!(b.server.log_text().contains("data connection joined"), "{}", b.server.log_text());
    }
    if matches!(channel, Channel::SharedMemory) {
        assert!(stdout.contains(" mapped "), "the mapped page's device pointer is printed: {stdout}");
        for node in [&a, &b] {
            let log = node.server.log_text();
            assert!(log.contains("shared-memory channel open"), "{log}");
            assert!(log.contains("copied straight into the snapshot file"), "tmpfs snapshots are written by the device: {log}");
        }
    }
}

#[test]
fn a_running_app_moves_between_servers_and_keeps_its_pointers_and_memory() {
    four_moves("migration", Channel::Socket);
}

#[test]
fn a_shared_memory_session_moves_with_its_segment_pinned_blocks_and_mapped_page() {
    four_moves("migration-shm", Channel::SharedMemory);
}

#[test]
fn a_move_the_target_cannot_take_leaves_the_app_where_it_was() {
    let Some(setup) = set_up("migration-refused") else { return };
    let a = start_node(&setup, "a", &[]);
    // Too small for the app's memory.
    let small = start_node(&setup, "small", &["--memory-quota", "4MiB"]);
    let dir = setup.scratch.join("snapshots");
    let app = start_app(&setup, &a.unix, 150, Channel::Socket);
    let session = session_on(&setup, &a);
    let (code, out, err) = migrate(&setup, &a.control, &session, &small.control, &small.unix, &dir, &[]);
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("stays where it was") && err.contains("quota"), "{err}");
    // GPU to GPU only: the emulated device shares no memory between workers.
    let (code, out, err) = migrate(&setup, &a.control, &session, &small.control, &small.unix, &dir, &["--copy", "device"]);
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("cannot be handed over on this GPU"), "{err}");
    // Unknown sessions and unreachable targets are clear errors too.
    let (code, _, err) = flytctl(&setup, &["session", "checkpoint", "--control", &a.control, "999", "--to", &dir.display().to_string()]);
    assert_ne!(code, 0);
    assert!(err.contains("no session 999"), "{err}");
    let missing = format!("unix:{}", setup.scratch.join("nobody.sock").display());
    let (code, _, err) = migrate(&setup, &a.control, &session, &missing, "127.0.0.1:1", &dir, &[]);
    assert_ne!(code, 0);
    assert!(err.contains("nobody.sock"), "{err}");
    finish_app(app);
    assert_eq!(session_count(&setup, &small), 0);
}

/// Waits (at most a minute) for `path` to appear.
fn wait_for_file(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !path.exists() {
        assert!(Instant::now() < deadline, "{} did not appear", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A session holding a green context is not checkpointed (its SM partition cannot be made again
/// on a target yet), with the reason, and the app goes on; once it destroyed the green context,
/// the session is checkpointed (and goes on).
#[test]
fn a_session_with_a_green_context_does_not_move_until_it_is_destroyed() {
    let Some(setup) = set_up_with("migration-green", "driver_green.c") else { return };
    let a = start_node(&setup, "a", &[]);
    let dir = setup.scratch.join("snapshots");
    let dir_arg = dir.display().to_string();
    let marker = setup.scratch.join("green-marker");
    let marker_arg = marker.display().to_string();
    let app = spawn_app(&setup, &a.unix, &["hold", &marker_arg], "off");
    wait_for_file(&marker);
    let session = session_on(&setup, &a);
    let (code, out, err) = flytctl(&setup, &["session", "checkpoint", "--control", &a.control, &session, "--to", &dir_arg]);
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("cannot move") && err.contains("green context"), "{err}");
    std::fs::write(marker.with_extension("next"), b"").unwrap();
    wait_for_file(&marker.with_extension("freed"));
    let (code, out, err) = flytctl(&setup, &["session", "checkpoint", "--control", &a.control, &session, "--to", &dir_arg, "--resume"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("checkpointed"), "{out}");
    std::fs::write(marker.with_extension("end"), b"").unwrap();
    let output = app.wait_with_output().expect("app output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success() && stdout.contains("PASSED: 0 failure(s)"), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
}

fn session_count(setup: &Setup, node: &Node) -> usize {
    let (_, out, _) = flytctl(setup, &["--json", "session", "list", "--control", &node.control]);
    serde_json::from_str::<serde_json::Value>(&out).ok().and_then(|list| list.as_array().map(Vec::len)).unwrap_or(0)
}

#[test]
fn a_checkpoint_survives_its_server_and_a_fresh_server_continues_the_app() {
    let Some(setup) = set_up("migration-restart") else { return };
    let dir = setup.scratch.join("snapshots");
    let dir_arg = dir.display().to_string();
    let mut first = start_node(&setup, "first", &[]);
    let socket = first.unix.clone();
    // Over shared memory: the fresh server takes the app's segment back too.
    let app = start_app(&setup, &socket, 150, Channel::SharedMemory);
    let session = session_on(&setup, &first);
    let (code, out, err) = flytctl(&setup, &["session", "checkpoint", "--control", &first.control, &session, "--to", &dir_arg, "--stop"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("checkpointed"), "{out}");
    assert_eq!(snapshots(&dir), 1);
    first.server.kill();
    // The app waits (its calls held) until a server at its address has its snapshot.
    std::thread::sleep(Duration::from_millis(500));
    let _ = std::fs::remove_file(socket.trim_start_matches("unix:"));
    let fresh_dir = setup.scratch.join("first-again");
    std::fs::create_dir_all(&fresh_dir).unwrap();
    let control = format!("unix:{}", fresh_dir.join("control.sock").display());
    let key = setup.key.display().to_string();
    let fresh = Server::start(
        &["--device", "emulated", "--listen", &socket, "--cluster-key-file", &key, "--control", &control, "--snapshot-dir", &dir_arg],
        &fresh_dir,
    );
    finish_app(app);
    assert!(fresh.log_text().contains("session restored"), "{}", fresh.log_text());
    assert_eq!(snapshots(&dir), 0);
}

#[test]
fn pools_arrays_and_texture_objects_move_with_their_session() {
    let Some((stdout, restored_on_b)) = moved_three_times("migration-objects", "migrate_objects.c") else { return };
    assert!(stdout.contains(" objects "), "{stdout}");
    assert!(restored_on_b);
}

/// Sparse arrays do not move yet (what is mapped into them is the driver's to know): a move of a
/// session holding one is refused with that reason, and the app goes on where it was.
#[test]
fn a_session_with_a_sparse_array_stays_where_it_is_and_says_why() {
    let Some(setup) = set_up_with("migration-sparse", "migrate_objects.c") else { return };
    let a = start_node(&setup, "a", &[]);
    let b = start_node(&setup, "b", &[]);
    let dir = setup.scratch.join("snapshots");
    // Rounds enough that the app still runs when the move asks it to pause, on a loaded machine.
    let app = spawn_app(&setup, &a.unix, &["500", "10", "sparse"], "off");
    let session = session_on(&setup, &a);
    let (code, out, err) = migrate(&setup, &a.control, &session, &b.control, &b.unix, &dir, &[]);
    assert_ne!(code, 0, "{out}");
    assert!(
        err.contains("1 sparse or deferred-mapping CUDA array(s), whose mappings do not move yet"),
        "{err}\n--- a ---\n{}",
        a.server.log_text()
    );
    finish_app(app);
    assert_eq!(session_count(&setup, &b), 0);
}

#[test]
fn graphs_and_executable_graphs_move_with_their_session() {
    let Some((_, restored_on_b)) = moved_three_times("migration-graphs", "migrate_graphs.c") else { return };
    assert!(restored_on_b);
}

/// Runs the driver-API program `source` (300 rounds, 10 ms apart) on server a and moves it
/// a -> b over TCP, b -> a and a -> b over Unix sockets (each move must succeed); its output once
/// it passed with the same pointers, and whether server b logged a restore. `None`: skipped.
fn moved_three_times(name: &str, source: &str) -> Option<(String, bool)> {
    let setup = set_up_with(name, source)?;
    let a = start_node(&setup, "a", &[]);
    let b = start_node(&setup, "b", &[]);
    let dir = setup.scratch.join("snapshots");
    let app = spawn_app(&setup, &a.unix, &["300", "10"], "off");
    let mut here = &a;
    for (hop, (to, address)) in [(&b, &b.tcp), (&a, &a.unix), (&b, &b.unix)].into_iter().enumerate() {
        let session = session_on(&setup, here);
        let (code, out, err) = migrate(&setup, &here.control, &session, &to.control, address, &dir, &[]);
        if code != 0 {
            // Both servers' logs: a failed move is decided by their order of events.
            panic!("move {hop} of session {session}: {out}{err}\n--- a ---\n{}\n--- b ---\n{}", a.server.log_text(), b.server.log_text());
        }
        here = to;
    }
    let stdout = finish_app(app);
    Some((stdout, b.server.log_text().contains("session restored")))
}

/// What of a session of two GPUs cannot move yet is named: a stream-ordered allocation holds
/// this one, so the move is refused with that reason and the app goes on where it was.
#[test]
fn a_session_of_two_gpus_holding_pool_memory_stays_and_says_why() {
    let Some(setup) = set_up_with("migration-two-gpus-pool", "migrate_two_devices.c") else { return };
    let a = start_node(&setup, "a", &["--gpu", "0,1"]);
    let b = start_node(&setup, "b", &["--gpu", "0,1"]);
    let dir = setup.scratch.join("snapshots");
    let marker = setup.scratch.join("pool-marker");
    let app = spawn_app(&setup, &a.unix, &[&marker.display().to_string(), "pool"], "off");
    wait_for_file(&marker);
    let session = session_on(&setup, &a);
    let (code, out, err) = migrate(&setup, &a.control, &session, &b.control, &b.unix, &dir, &[]);
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("the session cannot move") && err.contains("is a memory pool's"), "{err}");
    std::fs::write(marker.with_extension("next"), b"").unwrap();
    let output = app.wait_with_output().expect("app output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success() && stdout.contains("PASSED: 0 failure(s)"), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(!b.server.log_text().contains("session restored"));
}

/// A session of two GPUs (both servers `--gpu 0,1`) moves while its app runs, over the socket
/// and over the shared-memory channel: memory, streams and events of each device come back on
/// that device at the same addresses, the peer access the app enabled is enabled again, and the
/// device current at the pause stays current (`tests/c/migrate_two_devices.c` checks each);
/// then it moves back. A server of one GPU refuses it, with the reason, and it stays.
#[test]
fn a_session_of_two_gpus_moves_with_each_device_s_memory_streams_and_events() {
    for (name, shm) in [("migration-two-gpus", "off"), ("migration-two-gpus-shm", "on")] {
        let Some(setup) = set_up_with(name, "migrate_two_devices.c") else { return };
        let a = start_node(&setup, "a", &["--gpu", "0,1"]);
        let b = start_node(&setup, "b", &["--gpu", "0,1"]);
        let one = start_node(&setup, "one", &[]);
        let dir = setup.scratch.join("snapshots");
        let marker = setup.scratch.join("two-gpus-marker");
        let mut app = spawn_app(&setup, &a.unix, &[&marker.display().to_string()], shm);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !marker.exists() {
            if app.try_wait().unwrap().is_some() || Instant::now() > deadline {
                let _ = app.kill();
                let output = app.wait_with_output().unwrap();
                panic!(
                    "the app did not reach its move:\n{}\n{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let session = session_on(&setup, &a);
        let (code, out, err) = migrate(&setup, &a.control, &session, &one.control, &one.unix, &dir, &[]);
        assert_ne!(code, 0, "a server of one GPU takes no session of two: {out}");
        assert!(err.contains("stays where it was") && err.contains("2 GPU(s)"), "{err}");
        let (code, out, err) = migrate(&setup, &a.control, &session, &b.control, &b.tcp, &dir, &[]);
        if code != 0 {
            panic!("move of session {session}: {out}{err}\n--- a ---\n{}\n--- b ---\n{}", a.server.log_text(), b.server.log_text());
        }
        assert!(out.contains(&format!("moved to {}", b.tcp)), "{out}");
        let session = session_on(&setup, &b);
        let (code, out, err) = migrate(&setup, &b.control, &session, &a.control, &a.unix, &dir, &[]);
        if code != 0 {
            panic!("move back of session {session}: {out}{err}\n--- a ---\n{}\n--- b ---\n{}", a.server.log_text(), b.server.log_text());
        }
        std::fs::write(marker.with_extension("next"), b"").unwrap();
        let output = app.wait_with_output().expect("app output");
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success() && stdout.contains("PASSED: 0 failure(s)"), "app failed:\n{stdout}\n{stderr}");
        let pointers: Vec<&str> = stdout.lines().filter(|line| line.starts_with("pointers:")).collect();
        assert_eq!(pointers.len(), 2, "{stdout}");
        assert_eq!(pointers[0], pointers[1], "the app's pointers changed:\n{stdout}");
        for check in ["every byte on device 0", "every byte on device 1", "DEVICE_ORDINAL: yes", "device 1 is still current: yes"] {
            assert!(stdout.contains(check), "{check}:\n{stdout}");
        }
        assert!(!stdout.contains(": no"), "{stdout}");
        for node in [&a, &b] {
            assert!(node.server.log_text().contains("session restored"), "{}", node.server.log_text());
        }
        assert_eq!(snapshots(&dir), 0, "each snapshot is removed once its app is back");
    }
}
