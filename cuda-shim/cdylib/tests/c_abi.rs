//! A C program `dlopen`s the built `libcuda.so.1` the way NVIDIA's runtime does and checks, for every
//! `cuGetProcAddress_v2` request the real driver answered in the recorded runs, that Flyt answers the same
//! status and resolves the same export.

#![allow(clippy::tests_outside_test_module, reason = "an integration test file is its own test crate")]

use std::process::Command;

use flyt_test_support::{artifact, scratch_dir};

/// The build output: not named `libcuda.so`, so that nothing run by cargo (whose library path includes
/// the target directories) loads it in place of NVIDIA's driver; it is installed as `libcuda.so.1`.
const LIBRARY: &str = "libflyt_libcuda.so";

#[test]
fn proc_address_answers_like_the_real_driver() {
    let dir = scratch_dir("cuda-proc-address");
    let source = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/proc_address.c");
    let program = dir.join("proc_address");
    let status = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Werror", "-O1", source, "-o"])
        .arg(&program)
        .arg("-ldl")
        .status()
        .expect("a C compiler (cc) is needed for this test");
    assert!(status.success(), "compiling {source}");
    let census = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/census-gpa-580.txt");
    let output = Command::new(&program).arg(artifact(LIBRARY)).arg(census).output().expect("run proc_address");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let requests = std::fs::read_to_string(census).expect("census").lines().filter(|l| !l.starts_with('#')).count();
    assert!(requests > 400);
    assert!(stdout.contains(&format!("checked {requests} requests, 0 failures")), "stdout:\n{stdout}");
    assert!(stderr.contains("flyt: no devices: "), "the first device query names why there are none: {stderr}");
}
