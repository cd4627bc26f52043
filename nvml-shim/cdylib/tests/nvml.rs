//! Flyt's `libnvidia-ml.so.1` driven by a C program built against NVIDIA's `nvml.h`, beside Flyt's
//! `libcuda.so.1`, against the emulated device.

#![allow(clippy::tests_outside_test_module, reason = "an integration test file is its own test crate")]

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use flyt_test_support::{Server, artifact, exported_functions, run_with_timeout, scratch_dir, shim_lib_dir};

fn build(name: &str) -> Option<(PathBuf, PathBuf)> {
    build_program(name, "nvml_queries")
}

/// Compiles `tests/c/{program}.c` against NVIDIA's headers and Flyt's libraries.
fn build_program(name: &str, program_name: &str) -> Option<(PathBuf, PathBuf)> {
    let Some(cuda) = std::env::var_os("FLYT_CUDA_HOME").map(PathBuf::from) else {
        eprintln!("skipped: FLYT_CUDA_HOME is not set (tools/test sets it)");
        return None;
    };
    let scratch = scratch_dir(name);
    let lib = shim_lib_dir();
    let program = scratch.join(program_name);
    let source = format!("{}/tests/c/{program_name}.c", env!("CARGO_MANIFEST_DIR"));
    let status = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Werror", "-O1", "-D_DEFAULT_SOURCE"])
        .arg(format!("-I{}", cuda.join("include").display()))
        .arg(&source)
        .arg("-o")
        .arg(&program)
        .arg(format!("-L{}", lib.display()))
        .args(["-l:libnvidia-ml.so.1", "-l:libcuda.so.1", "-ldl"])
        .status()
        .expect("a C compiler (cc) is needed for this test");
    assert!(status.success(), "compiling {source}");
    Some((program, scratch))
}

#[test]
fn nvml_answers_agree_with_the_driver_and_invent_nothing() {
    let Some((program, scratch)) = build("nvml-queries") else { return };
    let server = Server::start(&["--device", "emulated", "--listen", "127.0.0.1:0"], &scratch);
    let (code, stdout, stderr) = run_with_timeout(
        Command::new(&program).env("LD_LIBRARY_PATH", shim_lib_dir()).env("FLYT_SERVER", &server.addresses[0]),
        Duration::from_secs(60),
    );
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("PASSED: 0 failure(s)"), "{stdout}\n{stderr}");
    assert!(stderr.contains("nvmlDeviceGetTemperature is not supported through Flyt"), "{stderr}");
}

#[test]
fn the_process_list_is_the_tenants() {
    let Some((program, scratch)) = build("nvml-tenant") else { return };
    let server = Server::start(&["--device", "emulated", "--listen", "127.0.0.1:0"], &scratch);
    let peer_bytes = 24u64 << 20;
    // Another app of the tenant, holding memory on the same server.
    let mut peer = Command::new(&program)
        .args(["hold", &peer_bytes.to_string()])
        .env("LD_LIBRARY_PATH", shim_lib_dir())
        .env("FLYT_SERVER", &server.addresses[0])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the peer");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(peer.stdout.take().expect("peer stdout")), &mut line).expect("peer output");
    assert_eq!(line.trim(), "held");
    let (code, stdout, stderr) = run_with_timeout(
        Command::new(&program)
            .env("LD_LIBRARY_PATH", shim_lib_dir())
            .env("FLYT_SERVER", &server.addresses[0])
            .env("FLYT_TEST_PEER_PID", peer.id().to_string())
            .env("FLYT_TEST_PEER_BYTES", peer_bytes.to_string()),
        Duration::from_secs(60),
    );
    drop(peer.stdin.take());
    assert!(peer.wait().expect("peer exit").success());
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("PASSED: 0 failure(s)"), "{stdout}\n{stderr}");
}

#[test]
fn without_a_reachable_server_nvml_init_says_no_driver() {
    let Some((program, _scratch)) = build("nvml-no-server") else { return };
    let (code, stdout, stderr) = run_with_timeout(
        Command::new(&program).env("LD_LIBRARY_PATH", shim_lib_dir()).env("FLYT_SERVER", "unix:/nonexistent/flyt.sock"),
        Duration::from_secs(60),
    );
    assert_ne!(code, 0);
    // nvmlInit_v2 failed with NVML_ERROR_DRIVER_NOT_LOADED (9) where the program expects success.
    assert!(stdout.contains("nvmlInit_v2() = 9, expected 0"), "{stdout}\n{stderr}");
}

#[test]
fn every_function_pytorch_looks_up_and_every_refused_one_is_exported() {
    // PyTorch's DriverAPI asserts on a missing NVML symbol, so refused functions are exported too.
    let exported = exported_functions(&artifact("libflyt_nvml_lib.so"));
    let pytorch = [
        "nvmlInit_v2",
        "nvmlDeviceGetHandleByPciBusId_v2",
        "nvmlDeviceGetNvLinkRemoteDeviceType",
        "nvmlDeviceGetNvLinkRemotePciInfo_v2",
        // NCCL's.
        "nvmlDeviceGetNvLinkRemotePciInfo",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetNvLinkCapability",
        "nvmlDeviceGetFieldValues",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlSystemGetCudaDriverVersion_v2",
        "nvmlDeviceGetCount_v2",
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetUUID",
    ];
    let missing: Vec<&str> = pytorch.iter().chain(flyt_nvml::UNSUPPORTED).copied().filter(|name| !exported.contains(*name)).collect();
    assert!(missing.is_empty(), "not exported: {missing:?}");
}

/// Runs `nvml_nvlinks` against an emulated server with `gpus`, expecting `topology` (see the
/// program), with `CUDA_VISIBLE_DEVICES` set when `visible` is.
fn nvlinks_as_nccl_reads_them(name: &str, gpus: &str, visible: Option<&str>, topology: &str) -> Option<String> {
    let (program, scratch) = build_program(name, "nvml_nvlinks")?;
    let server = Server::start(&["--device", "emulated", "--gpu", gpus, "--listen", "127.0.0.1:0"], &scratch);
    let mut command = Command::new(&program);
    command.arg(topology).env("LD_LIBRARY_PATH", shim_lib_dir()).env("FLYT_SERVER", &server.addresses[0]);
    if let Some(visible) = visible {
        command.env("CUDA_VISIBLE_DEVICES", visible);
    }
    let (code, stdout, stderr) = run_with_timeout(&mut command, Duration::from_secs(60));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("PASSED: 0 failure(s)"), "{stdout}\n{stderr}");
    Some(stdout)
}

#[test]
fn two_devices_show_the_emulated_nvlinks_between_them() {
    // The emulated device joins each pair of its GPUs by two links.
    let Some(stdout) = nvlinks_as_nccl_reads_them("nvml-nvlinks-two", "0,1", None, "11;00") else { return };
    assert!(stdout.contains("device 0: 2 links; 2 to device 1; 0 to a switch"), "{stdout}");
    assert!(stdout.contains("device 1: 2 links; 2 to device 0; 0 to a switch"), "{stdout}");
}

#[test]
fn a_link_to_a_device_the_app_does_not_see_is_inactive() {
    // Server devices 0 and 2 as the app's 0 and 1: the links to server device 1 show as down.
    let Some(stdout) = nvlinks_as_nccl_reads_them("nvml-nvlinks-hidden", "0,1,2", Some("0,2"), "--11;00--") else { return };
    assert!(stdout.contains("device 0: 4 links; 2 to device 1; 0 to a switch"), "{stdout}");
}

#[test]
fn a_lone_device_has_no_nvlink() {
    let Some(stdout) = nvlinks_as_nccl_reads_them("nvml-nvlinks-one", "0", None, "") else { return };
    assert!(stdout.contains("device 0: 0 links; 0 to a switch"), "{stdout}");
}
