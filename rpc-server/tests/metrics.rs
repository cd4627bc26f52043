//! `--metrics-listen`: a scrape shows a session's calls, errors, copies and memory, and the
//! counts stay after the session ends.

#![allow(clippy::tests_outside_test_module, reason = "an integration test crate: every function in it is a test")]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use flyt_protocol::frame::{FrameLimits, read_message, read_value, write_frame, write_value};
use flyt_protocol::handshake::{ClientIdentity, Hello, HelloReply};
use flyt_protocol::ops::{Request, decode_reply, rep, req};
use flyt_test_support::{Server, scrape_metrics as scrape, scratch_dir, series_value as value};

fn post(stream: &mut UnixStream, seq: u32, request: Request, bulk: &[u8]) {
    let mut message = Vec::new();
    request.encode(&mut message);
    write_frame(stream, seq, &message, bulk).unwrap();
}

fn call(stream: &mut UnixStream, seq: u32, request: Request, bulk: &[u8]) -> Vec<u8> {
    post(stream, seq, request, bulk);
    let mut message = Vec::new();
    let header = read_message(stream, &FrameLimits::default(), &mut message).unwrap();
    let mut bytes = vec![0u8; usize::try_from(header.bulk_len).unwrap()];
    stream.read_exact(&mut bytes).unwrap();
    message
}

#[test]
fn a_scrape_shows_what_sessions_did_and_keeps_it_after_they_end() {
    let scratch = scratch_dir("metrics");
    let free_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let socket = format!("unix:{}", scratch.join("data.sock").display());
    let server = Server::start(
        &[
            "--device",
            "emulated",
            "--listen",
            &socket,
            "--memory-quota",
            "64MiB",
            "--allocation",
            "alloc-9",
            "--metrics-listen",
            &free_port,
        ],
        &scratch,
    );
    assert!(server.wait_for_log("metrics on http://", Duration::from_secs(10)), "{}", server.log_text());

    let mut stream = UnixStream::connect(socket.trim_start_matches("unix:")).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let identity = ClientIdentity { program: "metrics-test".into(), ..ClientIdentity::default() };
    write_value(&mut stream, 0, &Hello::new(None, identity, None)).unwrap();
    assert!(matches!(read_value::<HelloReply>(&mut stream, &FrameLimits::default()).unwrap().1, HelloReply::Accepted(_)));

    let reply = call(&mut stream, 1, req::Malloc { size: 1 << 20 }.into(), &[]);
    let ptr = decode_reply::<rep::Malloc>(&reply).unwrap().result.unwrap().ptr;
    post(&mut stream, 2, req::MemcpyHtoD { dst: ptr, stream: 0 }.into(), &[7u8; 4096]);
    call(&mut stream, 3, req::MemcpyDtoH { src: ptr, len: 4096, stream: 0, blocking: true }.into(), &[]);
    let refused = call(&mut stream, 4, req::Free { ptr: ptr + 8 }.into(), &[]);
    assert!(decode_reply::<rep::Free>(&refused).unwrap().result.is_err());

    let text = scrape(&free_port);
    let series = |name: &str, labels: &str| value(&text, &format!("flyt_rpc_{name}{{allocation=\"alloc-9\"{labels}}}"));
    assert_eq!(series("sessions", ""), Some(1.0), "{text}");
    assert_eq!(series("memory_used_bytes", ""), Some(f64::from(1 << 20)), "{text}");
    assert_eq!(series("memory_quota_bytes", ""), Some(f64::from(64 << 20)), "{text}");
    assert_eq!(series("calls_total", ",op=\"Malloc\""), Some(1.0), "{text}");
    assert_eq!(series("errors_total", ",op=\"Free\""), Some(1.0), "{text}");
    assert_eq!(series("errors_total", ",op=\"Malloc\""), None, "{text}");
    assert_eq!(series("copied_bytes_total", ",direction=\"h2d\",path=\"socket\""), Some(4096.0), "{text}");
    assert_eq!(series("copied_bytes_total", ",direction=\"d2h\",path=\"socket\""), Some(4096.0), "{text}");
    assert!(value(&text, "flyt_rpc_call_duration_seconds_count{allocation=\"alloc-9\"}").is_some_and(|count| count >= 3.0), "{text}");

    // The Grafana dashboard in configs/ asks only for series this endpoint serves.
    let names = flyt_test_support::dashboard_series(&["flyt_rpc_"]);
    assert!(names.len() >= 7, "{names:?}");
    for name in names {
        assert!(flyt_test_support::serves(&text, &name), "the dashboard asks for {name}, which is not served:\n{text}");
    }

    // The session ends: its counts stay, its memory and the session gauge go.
    drop(stream);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = scrape(&free_port);
        if value(&text, "flyt_rpc_sessions{allocation=\"alloc-9\"}") == Some(0.0) || std::time::Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let series = |name: &str, labels: &str| value(&text, &format!("flyt_rpc_{name}{{allocation=\"alloc-9\"{labels}}}"));
    assert_eq!(series("sessions", ""), Some(0.0), "{text}");
    assert_eq!(series("memory_used_bytes", ""), Some(0.0), "{text}");
    assert_eq!(series("calls_total", ",op=\"Malloc\""), Some(1.0), "{text}");
    assert_eq!(series("copied_bytes_total", ",direction=\"h2d\",path=\"socket\""), Some(4096.0), "{text}");

    let mut other = std::net::TcpStream::connect(&free_port).unwrap();
    other.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut response = String::new();
    other.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.0 404"), "{response}");
}
