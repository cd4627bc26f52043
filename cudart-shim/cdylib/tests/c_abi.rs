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
