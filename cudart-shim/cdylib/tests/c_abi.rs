//! An unmodified C program, built against the real CUDA 13 headers and linked with our
//! `libcudart.so.13`, drives a real `flyt-rpc-server` on the emulated device.

use std::process::Command;
use std::time::Duration;

use flyt_test_support::{Server, compile_c, run_with_timeout, scratch_dir, shim_lib_dir};

fn build_program(scratch: &std::path::Path) -> std::path::PathBuf {
    let lib_dir = shim_lib_dir();
    let program = scratch.join("emulated_abi");
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/emulated_abi.c");
    compile_c(&source, &program, &lib_dir, &["-lpthread"]);
    program
}

fn run_program(program: &std::path::Path, server: &str) -> (i32, String, String) {
    run_with_timeout(
        Command::new(program).env("LD_LIBRARY_PATH", shim_lib_dir()).env("FLYT_SERVER", server),
        Duration::from_secs(120),
    )
}

#[test]
fn c_program_runs_through_the_shim_over_unix_and_tcp() {
    let scratch = scratch_dir("c-abi");
    let program = build_program(&scratch);
    let socket = format!("unix:{}", scratch.join("flyt.sock").display());
    let server = Server::start(&["--device", "emulated", "--listen", "127.0.0.1:0", "--listen", &socket], &scratch);
    for address in &server.addresses {
        let (code, stdout, stderr) = run_program(&program, address);
        assert_eq!(code, 0, "over {address}:\n{stdout}\n{stderr}");
        assert!(stdout.contains("PASSED: 0 failure(s)"), "{stdout}");
        // The unsupported call said so, once, naming the function.
        assert_eq!(stderr.matches("cudaGraphCreate is not supported").count(), 1, "{stderr}");
    }
    // Every session was served by the server and ended cleanly.
    assert!(server.wait_for_log("session 2 closed", Duration::from_secs(10)), "{}", server.log_text());
    assert!(server.log_text().contains("program=emulated_abi"));
}

#[test]
fn an_unreachable_server_is_a_cuda_error_not_a_hang() {
    let scratch = scratch_dir("no-server");
    let program = build_program(&scratch);
    let missing = format!("unix:{}", scratch.join("nobody-here.sock").display());
    let (code, stdout, stderr) = run_program(&program, &missing);
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("cudaGetDeviceCount -> cudaErrorDevicesUnavailable"), "{stdout}");
    assert_eq!(stderr.matches("flyt: cannot connect to").count(), 1, "one line, once: {stderr}");
}

#[test]
fn a_lost_server_fails_every_call_at_once() {
    use std::io::{BufRead, BufReader, Write};
    let scratch = scratch_dir("lost-server");
    let lib_dir = shim_lib_dir();
    let program = scratch.join("lost_server");
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/lost_server.c");
    compile_c(&source, &program, &lib_dir, &[]);
    let socket = format!("unix:{}", scratch.join("flyt.sock").display());
    let server = Server::start(&["--device", "emulated", "--listen", &socket], &scratch);
    let mut child = Command::new(&program)
        .env("LD_LIBRARY_PATH", &lib_dir)
        .env("FLYT_SERVER", &socket)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
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
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    line.clear();
    stdout.read_line(&mut line).unwrap();
    let status = child.wait().unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "calls after the loss must not hang");
    assert!(status.success());
    assert_eq!(
        line.trim(),
        "cudaErrorDevicesUnavailable cudaErrorDevicesUnavailable cudaErrorDevicesUnavailable cudaErrorDevicesUnavailable"
    );
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(stderr.matches("lost the connection to the GPU server").count(), 1, "{stderr}");
}
