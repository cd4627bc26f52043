//! A TCP session's client coming back after its connection broke (`docs/design/reconnect.md`), at
//! the protocol level: a claim must carry the session's secret (a wrong one, or a session that
//! does not exist, is refused and leaves the session alone); the right one gets the session back
//! with the count of bytes the server received, and calls go on; a client that does not come back
//! within the grace period ends its session.

#![allow(clippy::tests_outside_test_module, reason = "an integration test file is its own test crate")]

use std::net::TcpStream;
use std::time::Duration;

use flyt_protocol::frame::{FrameLimits, HEADER_LEN, read_message, read_value, write_frame, write_value};
use flyt_protocol::handshake::{Hello, HelloReply, Reattach, SessionInfo};
use flyt_protocol::ops::{Op, Request, decode_reply, req};
use flyt_test_support::{Server, scratch_dir};

mod raw;
use raw::identity;

/// One connection of a session, counting the session's bytes each way after the handshake.
struct Counted {
    stream: TcpStream,
    sent: u64,
    received: u64,
    seq: u32,
}

impl Counted {
    fn call<O: Op>(&mut self, request: O) -> Result<O::Reply, flyt_protocol::CudaError> {
        let request: Request = request.into();
        let mut message = Vec::new();
        request.encode(&mut message);
        self.seq += 1;
        write_frame(&mut self.stream, self.seq, &message, &[]).expect("send");
        self.sent += (HEADER_LEN + message.len()) as u64;
        let mut reply = Vec::new();
        let header = read_message(&mut self.stream, &FrameLimits::default(), &mut reply).expect("reply");
        assert_eq!((header.seq, header.bulk_len), (self.seq, 0));
        self.received += (HEADER_LEN + reply.len()) as u64;
        decode_reply::<O::Reply>(&reply).expect("decodable").result
    }
}

fn connect(address: &str) -> TcpStream {
    let stream = TcpStream::connect(address).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    stream
}

fn open(address: &str) -> (Counted, SessionInfo) {
    let mut stream = connect(address);
    write_value(&mut stream, 0, &Hello::new(None, identity("reattach-test"), None)).unwrap();
    match read_value::<HelloReply>(&mut stream, &FrameLimits::default()).unwrap().1 {
        HelloReply::Accepted(info) => (Counted { stream, sent: 0, received: 0, seq: 0 }, info),
        other => panic!("session refused: {other:?}"),
    }
}

fn reattach(address: &str, session_id: u64, secret: [u8; 32], received: u64) -> (TcpStream, HelloReply) {
    let mut stream = connect(address);
    let hello = Hello { reattach: Some(Reattach { session_id, secret, received }), ..Hello::new(None, identity("reattach-test"), None) };
    write_value(&mut stream, 0, &hello).unwrap();
    let reply = read_value::<HelloReply>(&mut stream, &FrameLimits::default()).expect("an answer").1;
    (stream, reply)
}

#[test]
fn a_returning_client_must_prove_it_owns_the_session() {
    let scratch = scratch_dir("reattach-claims");
    let server = Server::start(&["--device", "emulated", "--listen", "127.0.0.1:0", "--reconnect-grace-ms", "1500"], &scratch);
    let address = &server.addresses[0];
    let (mut first, info) = open(address);
    let secret = info.resume_secret.expect("a TCP session gets a secret to come back with");
    let ptr = first.call(req::Malloc { size: 4096 }).unwrap().ptr;

    // A wrong secret, and a session that does not exist: refused alike, the session untouched.
    for (session_id, claimed) in [(info.session_id, [0u8; 32]), (info.session_id + 100, secret)] {
        match reattach(address, session_id, claimed, first.received).1 {
            HelloReply::Refused { reason, .. } => assert!(reason.contains("no session"), "{reason}"),
            other => panic!("a claim without the session's secret got {other:?}"),
        }
    }
    first.call(req::MemGetInfo {}).expect("the session still answers on its connection");

    // The connection breaks; the client comes back with the session's secret.
    drop(first.stream);
    let (stream, reply) = reattach(address, info.session_id, secret, first.received);
    let HelloReply::Reattached { received } = reply else { panic!("the owner was refused: {reply:?}") };
    assert_eq!(received, first.sent, "the server received every byte the client sent");
    let mut again = Counted { stream, ..first };
    again.call(req::Free { ptr }).expect("the allocation made before the break is still the session's");
    assert!(server.wait_for_log("the client came back: the session goes on", Duration::from_secs(5)), "{}", server.log_text());

    // It breaks again and nobody comes back: the session ends after the grace period.
    drop(again.stream);
    assert!(server.wait_for_log("the client did not come back within the grace period", Duration::from_secs(10)), "{}", server.log_text());
    assert!(server.wait_for_log("session 1 closed", Duration::from_secs(10)), "{}", server.log_text());
    match reattach(address, info.session_id, secret, again.received).1 {
        HelloReply::Refused { reason, .. } => assert!(reason.contains("no session"), "{reason}"),
        other => panic!("an ended session came back: {other:?}"),
    }
}
