//! A client that speaks the data-plane wire protocol directly, for the server's tests.

#![allow(dead_code, reason = "each test crate that includes this module uses part of it")]

use std::os::unix::net::UnixStream;
use std::time::Duration;

use flyt_protocol::CudaError;
use flyt_protocol::frame::{FrameLimits, read_message, read_value, write_frame, write_value};
use flyt_protocol::handshake::{ClientIdentity, Hello, HelloReply, SessionInfo};
use flyt_protocol::ops::{Op, Request, decode_reply, req};
use flyt_test_support::{Server, scratch_dir};

/// A client that speaks the wire protocol directly.
pub struct RawSession {
    pub stream: UnixStream,
    pub info: SessionInfo,
    pub seq: u32,
}

pub fn identity(program: &str) -> ClientIdentity {
    ClientIdentity { hostname: "test".into(), pid: std::process::id(), program: program.into(), boot_id: String::new() }
}

pub fn hello_reply(socket: &str, hello: &Hello) -> (UnixStream, HelloReply) {
    let mut stream = UnixStream::connect(socket.trim_start_matches("unix:")).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write_value(&mut stream, 0, hello).unwrap();
    let (_, reply) = read_value::<HelloReply>(&mut stream, &FrameLimits::default()).expect("hello reply");
    (stream, reply)
}

impl RawSession {
    pub fn open(socket: &str, token: Option<String>) -> Result<Self, (u32, String)> {
        let (stream, reply) = hello_reply(socket, &Hello::new(token, identity("raw-test"), None));
        match reply {
            HelloReply::Accepted(info) => Ok(Self { stream, info, seq: 1 }),
            HelloReply::Refused { error, reason } => Err((error, reason)),
            HelloReply::Reattached { .. } => Err((0, "a reattachment nobody asked for".into())),
        }
    }

    pub fn send(&mut self, request: &Request, bulk: &[u8]) -> u32 {
        let seq = self.seq;
        self.seq += 1;
        let mut message = Vec::new();
        request.encode(&mut message);
        write_frame(&mut self.stream, seq, &message, bulk).expect("send");
        seq
    }

    /// Sends a request and reads its reply (with any bulk bytes).
    pub fn call<O: Op>(&mut self, request: O) -> (Result<O::Reply, CudaError>, Vec<u8>) {
        let (reply, bulk) = self.call_with_deferred(request);
        (reply.result, bulk)
    }

    pub fn call_with_deferred<O: Op>(&mut self, request: O) -> (flyt_protocol::ops::Reply<O::Reply>, Vec<u8>) {
        self.call_with_bulk(request, &[])
    }

    /// Sends a request with bulk bytes and reads its reply (with any bulk bytes).
    pub fn call_with_bulk<O: Op>(&mut self, request: O, bulk_in: &[u8]) -> (flyt_protocol::ops::Reply<O::Reply>, Vec<u8>) {
        let seq = self.send(&request.into(), bulk_in);
        let mut message = Vec::new();
        let mut header = read_message(&mut self.stream, &FrameLimits::default(), &mut message).expect("reply");
        // The server's `Notice::Alive` (sequence 0) while a request waits long (for memory, say).
        while header.seq == 0 && seq != 0 && header.bulk_len == 0 {
            header = read_message(&mut self.stream, &FrameLimits::default(), &mut message).expect("reply");
        }
        assert_eq!(header.seq, seq);
        let mut bulk = vec![0u8; usize::try_from(header.bulk_len).expect("a bulk length that fits in memory")];
        flyt_protocol::frame::read_full(&mut self.stream, &mut bulk, false).unwrap();
        (decode_reply::<O::Reply>(&message).expect("decodable reply"), bulk)
    }

    /// Allocates, writes and reads back: proves the session works.
    pub fn round_trip(&mut self, pattern: u8) {
        let ptr = self.call(req::Malloc { size: 4096 }).0.expect("malloc").ptr;
        self.send(&req::MemcpyHtoD { dst: ptr, stream: 0 }.into(), &[pattern; 4096]);
        let (result, bytes) = self.call(req::MemcpyDtoH { src: ptr, len: 4096, stream: 0, blocking: true });
        result.expect("copy back");
        assert_eq!(bytes, vec![pattern; 4096]);
        self.call(req::Free { ptr }).0.expect("free");
    }

    /// `true` once the server has closed this connection.
    pub fn closed_by_server(&mut self) -> bool {
        let mut message = Vec::new();
        matches!(
            read_message(&mut self.stream, &FrameLimits::default(), &mut message),
            Err(flyt_protocol::frame::FrameError::Closed | flyt_protocol::frame::FrameError::Io(_))
        )
    }
}

pub fn emulated_server(name: &str, extra: &[&str]) -> (Server, String) {
    let scratch = scratch_dir(name);
    let socket = format!("unix:{}", scratch.join("flyt.sock").display());
    let mut args = vec!["--device", "emulated", "--listen", socket.as_str(), "--warm-workers", "1"];
    args.extend_from_slice(extra);
    (Server::start(&args, &scratch), socket)
}
