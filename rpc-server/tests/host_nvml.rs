//! The server's reading of its host's NVML (`backend/nvlinks.rs`), against a stand-in
//! `libnvidia-ml.so.1` with a fixed topology (`tests/c/fake_nvml.c`), so it is checked on machines
//! without a GPU: each session GPU's links by index, far ends named as the session may know them
//! (another tenant's GPU left out, switches and unplaceable far ends told apart), and no links at
//! all when NVML fails. NVML is loaded once per process, so each case runs in a child process of
//! this test binary with the stand-in first on its library path.

#![allow(clippy::tests_outside_test_module, reason = "an integration test crate: every function in it is a test")]

use std::path::Path;
use std::process::Command;

use flyt_protocol::device::NvLinkEnd::{self, Device, Inactive, Switch};
use flyt_rpc_server::backend::nvlinks::session_nvlinks;

const A: (u32, u32, u32) = (0, 0x18, 0);
const B: (u32, u32, u32) = (0, 0x2a, 0);
const C: (u32, u32, u32) = (0, 0x3a, 0);

/// Builds the stand-in into `dir` as `libnvidia-ml.so.1`.
fn build_fake(dir: &Path, defines: &[&str]) {
    let source = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/fake_nvml.c");
    let status = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Werror", "-O1", "-shared", "-fPIC"])
        .args(defines)
        .arg(source)
        .arg("-o")
        .arg(dir.join("libnvidia-ml.so.1"))
        .status()
        .expect("a C compiler (cc) is needed for this test");
    assert!(status.success(), "compiling {source}");
}

/// Runs test `name` of this binary again in a child with the stand-in on its library path.
fn in_child(name: &str, defines: &[&str]) {
    let dir = flyt_test_support::scratch_dir(name);
    build_fake(&dir, defines);
    let output = Command::new(std::env::current_exe().expect("this test binary"))
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env("LD_LIBRARY_PATH", &dir)
        .env("FLYT_TEST_FAKE_NVML_CHILD", "1")
        .output()
        .expect("run the child");
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!("{}\n{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success() && text.contains("1 passed"), "{text}");
}

fn is_child() -> bool {
    std::env::var_os("FLYT_TEST_FAKE_NVML_CHILD").is_some()
}

#[test]
fn links_name_session_devices_and_switches_and_hide_other_gpus() {
    if !is_child() {
        return in_child("links_name_session_devices_and_switches_and_hide_other_gpus", &[]);
    }
    let links = session_nvlinks(&[A, B]);
    let mut a: Vec<NvLinkEnd> = vec![Device(1), Device(1), Inactive, Inactive, Switch, Inactive, Inactive, Inactive, Switch];
    a.resize(18, Inactive);
    let mut b: Vec<NvLinkEnd> = vec![Device(0), Device(0)];
    b.resize(18, Inactive);
    assert_eq!(links, vec![a, b], "A: 0-1 to B, 2-3 to C (not the session's), 4 and 8 to switches; as many links as the count field");

    // With C in the session instead of B, B's links are the hidden ones.
    let links = session_nvlinks(&[C, A]);
    assert_eq!(links[1][..4], [Inactive, Inactive, Device(0), Device(0)]);
    assert!(links[0].iter().all(|end| *end == Inactive), "C has no link up");
}

#[test]
fn a_failing_nvml_gives_no_links() {
    if !is_child() {
        return in_child("a_failing_nvml_gives_no_links", &["-DFAIL_INIT"]);
    }
    assert_eq!(session_nvlinks(&[A, B]), vec![Vec::<NvLinkEnd>::new(); 2]);
}
