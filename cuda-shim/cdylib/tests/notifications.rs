//! CUDA's async notifications through Flyt: an operator lowers the slice's quota below what the
//! tenant holds (the node manager's resize, through the server's control socket), and the app's
//! registered callbacks hear "over budget" (`tests/c/driver_notifications.c`).

#![allow(clippy::tests_outside_test_module, reason = "an integration test crate: every function in it is a test")]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use flyt_daemon_kit::auth::ClusterKey;
use flyt_daemon_kit::rpc::{Endpoint, connect, deadline, transport};
use flyt_protocol::control::auth::ServiceName;
use flyt_protocol::control::rpc_server::RpcServerControlClient;
use flyt_test_support::{Interactive, driver_program, scratch_dir, toolkit_from};

const KEY: &str = "notification test key, long enough";

/// Lowers the server's memory quota through its control socket, as the node manager does.
fn resize(control: &Path, key: &Path, quota: u64) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    runtime.block_on(async {
        let key = ClusterKey::load(key).expect("the cluster key");
        let stream = connect(&Endpoint::Unix(control.to_path_buf()), &key, ServiceName::RpcServerControl).await.expect("authenticated");
        let client = RpcServerControlClient::new(tarpc::client::Config::default(), transport(stream)).spawn();
        client.resize(deadline(Duration::from_secs(5)), Some(quota), None).await.expect("resize sent").expect("resized");
    });
}

#[test]
fn a_lowered_quota_reaches_the_apps_callbacks() {
    let Some(cuda) = toolkit_from("FLYT_CUDA_HOME") else { return };
    let scratch = scratch_dir("notifications");
    let source = format!("{}/tests/c/driver_notifications.c", env!("CARGO_MANIFEST_DIR"));
    let (program, lib) = driver_program(Path::new(&source), &cuda, &scratch);
    let (_server, socket, control, key) = flyt_test_support::controlled_server(&scratch, KEY, "64MiB", &[]);
    let token = flyt_protocol::token::issue(
        KEY.as_bytes(),
        &flyt_protocol::token::SessionClaims { allocation: "any".into(), expires_at: u64::MAX },
    )
    .unwrap();
    let mut app =
        Interactive::spawn(Command::new(&program).env("LD_LIBRARY_PATH", &lib).env("FLYT_SERVER", &socket).env("FLYT_TOKEN", &token));
    let line = app.read_line();
    assert_eq!(line.trim(), "allocated", "{line}");
    // 48 MiB held under a quota lowered to 32 MiB: 16 MiB over.
    resize(&control, &key, 32 << 20);
    app.send("go");
    let (status, rest, stderr) = app.finish();
    assert!(status.success(), "{rest}\n{stderr}");
    for expected in [
        "quota now 32 MiB",
        "callbacks heard: 1 1",
        "over budget by 16 MiB and 16 MiB",
        "on another thread: yes",
        "registering inside a callback: CUDA_ERROR_NOT_PERMITTED",
        "PASSED: 0 failure(s)",
    ] {
        assert!(rest.contains(expected), "missing '{expected}':\n{rest}\n{stderr}");
    }
}
