//! The control socket the node manager uses: status, live resize (seen by running sessions at
//! once), refusal of unauthenticated peers.

#![allow(clippy::tests_outside_test_module, reason = "an integration test crate: every function in it is a test")]

use std::os::unix::net::UnixStream;
use std::time::Duration;

use flyt_daemon_kit::auth::ClusterKey;
use flyt_daemon_kit::rpc::{Endpoint, connect, deadline, transport};
use flyt_protocol::control::auth::ServiceName;
use flyt_protocol::control::rpc_server::RpcServerControlClient;
use flyt_protocol::frame::{FrameLimits, read_message, read_value, write_frame, write_value};
use flyt_protocol::handshake::{ClientIdentity, Hello, HelloReply, Notice};
use flyt_protocol::ops::{Request, decode_reply, rep, req};
use flyt_test_support::{Server, scratch_dir};

const KEY: &str = "control-socket test key, long enough";

fn start() -> (Server, String, std::path::PathBuf, std::path::PathBuf) {
    flyt_test_support::controlled_server(&scratch_dir("control"), KEY, "64MiB", &["--sm-percentage", "50"])
}

fn open_session(socket: &str) -> UnixStream {
    let token = flyt_protocol::token::issue(
        KEY.as_bytes(),
        &flyt_protocol::token::SessionClaims { allocation: "any".into(), expires_at: u64::MAX },
    )
    .unwrap();
    let mut stream = UnixStream::connect(socket.trim_start_matches("unix:")).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let identity = ClientIdentity { program: "control-test".into(), ..ClientIdentity::default() };
    write_value(&mut stream, 0, &Hello::new(Some(token), identity, None)).unwrap();
    match read_value::<HelloReply>(&mut stream, &FrameLimits::default()).unwrap().1 {
        HelloReply::Accepted(info) => {
            assert_eq!(info.devices[0].total_mem, 64 << 20);
            assert_eq!(info.devices[0].attribute(flyt_protocol::device::attr::MULTIPROCESSOR_COUNT), Some(66));
        }
        refused => panic!("{refused:?}"),
    }
    stream
}

#[tokio::test]
async fn status_and_live_resize_through_the_control_socket() {
    let (server, socket, control, key) = start();
    // The session holds 48 MiB of its 64 MiB quota.
    let mut session = std::thread::spawn(move || {
        let mut session = open_session(&socket);
        let mut request = Vec::new();
        Request::from(req::Malloc { size: 48 << 20 }).encode(&mut request);
        write_frame(&mut session, 1, &request, &[]).unwrap();
        let mut message = Vec::new();
        read_message(&mut session, &FrameLimits::default(), &mut message).unwrap();
        decode_reply::<rep::Malloc>(&message).unwrap().result.expect("48 MiB within the quota");
        session
    })
    .join()
    .unwrap();
    let key = ClusterKey::load(&key).unwrap();
    let stream = connect(&Endpoint::Unix(control.clone()), &key, ServiceName::RpcServerControl).await.expect("authenticated");
    let client = RpcServerControlClient::new(tarpc::client::Config::default(), transport(stream)).spawn();

    let status = client.status(deadline(Duration::from_secs(5))).await.unwrap();
    assert_eq!((status.memory_quota, status.sm_percentage, status.backend.as_str()), (64 << 20, 50, "emulated"));
    assert_eq!(status.sessions.len(), 1);
    assert_eq!(status.sessions[0].client.program, "control-test");

    let resized = client.resize(deadline(Duration::from_secs(5)), Some(32 << 20), Some(25)).await.unwrap().unwrap();
    assert_eq!((resized.memory_quota, resized.sm_percentage), (32 << 20, 25));
    assert!(client.resize(deadline(Duration::from_secs(5)), None, Some(0)).await.unwrap().is_err(), "0% is refused");

    // The running session is told, and the new quota holds at once.
    let seen = std::thread::spawn(move || {
        let mut message = Vec::new();
        let header = read_message(&mut session, &FrameLimits::default(), &mut message).unwrap();
        assert_eq!(header.seq, 0, "a notice");
        let Notice::Limits { devices } = flyt_protocol::frame::decode_exact(&message).unwrap() else { panic!("expected a limits notice") };
        // 48 MiB held under 32 MiB: the session is told it is 16 MiB over.
        let header = read_message(&mut session, &FrameLimits::default(), &mut message).unwrap();
        assert_eq!(header.seq, 0, "a notice");
        let over = flyt_protocol::frame::decode_exact::<Notice>(&message).unwrap();
        let mut request = Vec::new();
        Request::from(req::Malloc { size: 4 << 20 }).encode(&mut request);
        write_frame(&mut session, 2, &request, &[]).unwrap();
        read_message(&mut session, &FrameLimits::default(), &mut message).unwrap();
        (devices[0].total_mem, over, decode_reply::<rep::Malloc>(&message).unwrap().result)
    })
    .join()
    .unwrap();
    assert_eq!(seen.0, 32 << 20);
    assert_eq!(seen.1, Notice::OverBudget { bytes: 16 << 20 });
    assert_eq!(seen.2, Err(flyt_protocol::CudaError::MEMORY_ALLOCATION));

    // Without the key, the control socket says nothing.
    let stranger = ClusterKey::from_bytes(b"not the cluster key, but long enough").unwrap();
    assert!(connect(&Endpoint::Unix(control), &stranger, ServiceName::RpcServerControl).await.is_err());
    assert!(server.wait_for_log("does not match the cluster key", Duration::from_secs(5)), "{}", server.log_text());
}
