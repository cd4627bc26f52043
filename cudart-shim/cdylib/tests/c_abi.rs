//! An unmodified C program, built against the real CUDA 13 headers and linked with our
//! `libcudart.so.13`, drives a real `flyt-rpc-server` on the emulated device.

#![allow(clippy::tests_outside_test_module, reason = "an integration test crate: every function in it is a test")]

use std::process::Command;
use std::time::Duration;

use flyt_test_support::{Interactive, Server, compile_c, run_with_timeout, scratch_dir, shim_lib_dir};

fn build_program(scratch: &std::path::Path) -> std::path::PathBuf {
    let lib_dir = shim_lib_dir();
    let program = scratch.join("emulated_abi");
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/emulated_abi.c");
    compile_c(&source, &program, &lib_dir, &["-lpthread"]);
    program
}

fn run_program(program: &std::path::Path, server: &str) -> (i32, String, String) {
    run_program_with(program, server, "auto")
}

fn run_program_with(program: &std::path::Path, server: &str, shm: &str) -> (i32, String, String) {
    run_with_timeout(
        Command::new(program).env("LD_LIBRARY_PATH", shim_lib_dir()).env("FLYT_SERVER", server).env("FLYT_SHM", shm),
        Duration::from_secs(120),
    )
}

/// `tests/c/lost_server.c` built in `scratch` and started against `server` (`FLYT_SERVER`) with
/// `env`, its "ready" line read: it holds a session until told to call again.
fn start_lost_server(scratch: &std::path::Path, server: &str, env: &[(&str, &str)]) -> Interactive {
    let lib_dir = shim_lib_dir();
    let program = scratch.join("lost_server");
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/lost_server.c");
    compile_c(&source, &program, &lib_dir, &[]);
    let mut app =
        Interactive::spawn(Command::new(&program).env("LD_LIBRARY_PATH", &lib_dir).env("FLYT_SERVER", server).envs(env.iter().copied()));
    assert_eq!(app.read_line().trim(), "ready");
    app
}

fn flyt_segments() -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with("flyt-"))
                .collect()
        })
        .unwrap_or_default()
}

/// The same program over the Unix socket and TCP, each with the socket alone (`FLYT_SHM=off`)
/// and with the shared-memory channel required (`FLYT_SHM=on`: a memfd over the Unix socket, a
/// /dev/shm file for TCP on this host).
#[test]
fn c_program_runs_through_the_shim_over_every_transport() {
    let scratch = scratch_dir("c-abi");
    let program = build_program(&scratch);
    let socket = format!("unix:{}", scratch.join("flyt.sock").display());
    let server = Server::start(&["--device", "emulated", "--listen", "127.0.0.1:0", "--listen", &socket], &scratch);
    let mut sessions = 0;
    for address in &server.addresses {
        for shm in ["off", "on"] {
            let (code, stdout, stderr) = run_program_with(&program, address, shm);
            assert_eq!(code, 0, "over {address} with FLYT_SHM={shm}:\n{stdout}\n{stderr}");
            assert!(stdout.contains("PASSED: 0 failure(s)"), "{stdout}");
            // The unsupported call said so, once, naming the function.
            assert_eq!(stderr.matches("cudaImportExternalMemory is not supported").count(), 1, "{stderr}");
            sessions += 1;
        }
    }
    assert!(server.wait_for_log(&format!("session {sessions} closed"), Duration::from_secs(10)), "{}", server.log_text());
    let log = server.log_text();
    assert!(log.contains("program=emulated_abi"));
    assert_eq!(log.matches("shared-memory channel open").count(), 2, "{log}");
    assert!(flyt_segments().is_empty(), "segments left behind: {:?}", flyt_segments());
}

/// `kill -9` of an app that holds a segment leaves nothing behind, and the server goes on.
#[test]
fn a_killed_app_leaves_no_segment_and_no_session() {
    let scratch = scratch_dir("killed-app");
    let socket = format!("unix:{}", scratch.join("flyt.sock").display());
    let server = Server::start(&["--device", "emulated", "--listen", "127.0.0.1:0", "--listen", &socket], &scratch);
    for (number, address) in server.addresses.iter().enumerate() {
        start_lost_server(&scratch, address, &[("FLYT_SHM", "on")]).kill();
        let session = number + 1;
        assert!(server.wait_for_log(&format!("session {session} closed"), Duration::from_secs(10)), "{}", server.log_text());
    }
    assert_eq!(server.log_text().matches("shared-memory channel open").count(), 2);
    assert!(flyt_segments().is_empty(), "segments left behind: {:?}", flyt_segments());
    // The server still serves.
    let (code, stdout, _) = run_program(&build_program(&scratch), &server.addresses[1]);
    assert_eq!(code, 0, "{stdout}");
}

#[test]
fn an_unreachable_server_is_a_cuda_error_not_a_hang() {
    let scratch = scratch_dir("no-server");
    let program = build_program(&scratch);
    let missing = format!("unix:{}", scratch.join("nobody-here.sock").display());
    let (code, stdout, stderr) = run_program(&program, &missing);
    assert_eq!(code, 1, "{stdout}");
    // No server to reach is no device, as a machine without a GPU answers (the driver decides).
    assert!(stdout.contains("cudaGetDeviceCount -> cudaErrorNoDevice"), "{stdout}");
    assert_eq!(stderr.matches("flyt: cannot connect to").count(), 1, "one line, once: {stderr}");
}

#[test]
fn a_lost_server_fails_every_call_at_once() {
    let scratch = scratch_dir("lost-server");
    let socket = format!("unix:{}", scratch.join("flyt.sock").display());
    let server = Server::start(&["--device", "emulated", "--listen", &socket], &scratch);
    let mut app = start_lost_server(&scratch, &socket, &[]);
    // Kill the session's worker: the process that holds the app's GPU state.
    assert!(server.wait_for_log("session 1 opened", Duration::from_secs(10)));
    let worker = server
        .log_text()
        .lines()
        .find(|line| line.contains("session 1 opened"))
        .and_then(|line| line.split("worker=").nth(1).map(|pid| pid.trim().to_string()))
        .unwrap();
    Command::new("kill").args(["-KILL", &worker]).status().unwrap();
    assert!(server.wait_for_log("session 1 closed", Duration::from_secs(10)));
    let started = std::time::Instant::now();
    app.send("go");
    let line = app.read_line();
    let (status, _, stderr) = app.finish();
    assert!(started.elapsed() < Duration::from_secs(5), "calls after the loss must not hang");
    assert!(status.success());
    assert_eq!(
        line.trim(),
        "cudaErrorDevicesUnavailable cudaErrorDevicesUnavailable cudaErrorDevicesUnavailable cudaErrorDevicesUnavailable"
    );
    assert_eq!(stderr.matches("lost the connection to the GPU server").count(), 1, "{stderr}");
}

/// A program that calls Flyt's runtime and Flyt's driver side by side has one session: memory,
/// streams and events made through one API work through the other.
#[test]
fn runtime_and_driver_share_one_session() {
    let scratch = scratch_dir("mixed-apis");
    let program = scratch.join("mixed_apis");
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/mixed_apis.c");
    compile_c(&source, &program, &shim_lib_dir(), &["-l:libcuda.so.1"]);
    let socket = format!("unix:{}", scratch.join("flyt.sock").display());
    let server = Server::start(&["--device", "emulated", "--listen", &socket], &scratch);
    let (code, stdout, stderr) = run_program(&program, &server.addresses[0]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("PASSED: 0 failure(s)"), "{stdout}");
    assert!(server.wait_for_log("session 1 closed", Duration::from_secs(10)), "{}", server.log_text());
    assert!(!server.log_text().contains("session 2"), "one session, not one per library: {}", server.log_text());
}

/// With `--tls-cert`/`--tls-key`, TCP sessions run over TLS checked against the app's
/// `FLYT_TLS_CA`; a plain TCP app is refused with the reason, an app trusting another CA refuses
/// the server, and the Unix socket (same host) needs no TLS.
#[test]
fn tcp_sessions_use_tls_when_the_server_requires_it() {
    let scratch = scratch_dir("c-abi-tls");
    let program = build_program(&scratch);
    let write_pair = |name: &str| {
        let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
        let (cert, key) = (scratch.join(format!("{name}.pem")), scratch.join(format!("{name}.key")));
        std::fs::write(&cert, certified.cert.pem()).unwrap();
        std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
        (cert.display().to_string(), key.display().to_string())
    };
    let (cert, key) = write_pair("server");
    let (stranger, _) = write_pair("stranger");
    let socket = format!("unix:{}", scratch.join("flyt.sock").display());
    let server = Server::start(
        &["--device", "emulated", "--listen", "127.0.0.1:0", "--listen", &socket, "--tls-cert", &cert, "--tls-key", &key],
        &scratch,
    );
    let tcp = server.addresses.iter().find(|address| !address.starts_with("unix:")).unwrap().clone();
    let run = |address: &str, ca: Option<&str>| {
        let mut command = Command::new(&program);
        command.env("LD_LIBRARY_PATH", shim_lib_dir()).env("FLYT_SERVER", address).env("FLYT_SHM", "off").env_remove("FLYT_TLS_CA");
        if let Some(ca) = ca {
            command.env("FLYT_TLS_CA", ca);
        }
        run_with_timeout(&mut command, Duration::from_secs(120))
    };
    let (code, stdout, stderr) = run(&tcp, Some(&cert));
    assert!(code == 0 && stdout.contains("PASSED: 0 failure(s)"), "over TLS:\n{stdout}\n{stderr}\nserver log:\n{}", server.log_text());
    let (code, stdout, stderr) = run(&socket, None);
    assert!(code == 0 && stdout.contains("PASSED: 0 failure(s)"), "over the Unix socket:\n{stdout}\n{stderr}");
    let (code, _, stderr) = run(&tcp, None);
    assert!(code != 0 && stderr.contains("requires TLS"), "plain TCP to a TLS server:\n{stderr}");
    let (code, _, stderr) = run(&tcp, Some(&stranger));
    assert!(code != 0 && stderr.contains("TLS with") && stderr.contains("certificate"), "another CA:\n{stderr}");
    assert!(server.wait_for_log("transport=tls", Duration::from_secs(10)), "{}", server.log_text());
}
