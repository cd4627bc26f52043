//! The shim's one question to its local client manager (Unix socket, data-plane framing, one
//! request and one reply): "which server do I use, with which token?". It uses the data-plane
//! framing rather than tarpc so the shim, loaded into every CUDA app, carries no async runtime.

use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

use crate::frame::{FrameError, FrameLimits};
use crate::handshake::ClientIdentity;

/// The environment variable that names the client manager's socket, for the client manager
/// itself (its `socket` setting), the shim in every app and `flyt run`.
pub const SOCKET_ENV: &str = "FLYT_CLIENT_MANAGER_SOCKET";
/// Where the client manager listens unless [`SOCKET_ENV`] says otherwise.
pub const DEFAULT_SOCKET: &str = "/run/flyt/client-manager.sock";
/// What a client accepts as the reply: a few hundred bytes, never bulk data.
pub const REPLY_LIMITS: FrameLimits = FrameLimits { max_message: 64 << 10, max_bulk: 0 };

/// The shim's request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocateRequest {
    pub client: ClientIdentity,
}

/// The client manager's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LocateReply {
    /// Connect here (`host:port` or `unix:/path`) and present `token`; a tenant spread over
    /// nodes is given each of its servers, comma-separated, its devices numbered in that order.
    Server {
        address: String,
        token: String,
        /// The server shares this host, so the shared-memory channel may be offered.
        same_host: bool,
        /// This host is a VM on the server's GPU host: the VM's ivshmem region may carry the
        /// bulk data (Flyt's shared-mem mode); `false` in RPC-only mode.
        ivshmem: bool,
        /// The cluster's CA (a PEM file on this host) when the cluster runs TLS: a TCP session
        /// must use TLS and check the server's certificate against it. Empty: plain TCP.
        tls_ca: String,
    },
    /// No GPU for this client; `reason` says what is missing and is shown to the user.
    Refused { reason: String },
}

/// The whole exchange from the client's side, over a connected stream: sends `request`, reads
/// the one reply. Timeouts are the stream's (set them before calling).
pub fn ask(stream: &mut (impl Read + Write), request: &LocateRequest) -> Result<LocateReply, FrameError> {
    crate::frame::ask(stream, request, &REPLY_LIMITS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{read_value, write_value};

    /// A stream whose reads come from `input` and whose writes are kept.
    struct Scripted {
        input: std::io::Cursor<Vec<u8>>,
        written: Vec<u8>,
    }

    impl Read for Scripted {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.input.read(buf)
        }
    }

    impl Write for Scripted {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.written.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn request() -> LocateRequest {
        LocateRequest { client: ClientIdentity { hostname: "h".into(), pid: 7, program: "p".into(), boot_id: "b".into() } }
    }

    #[test]
    fn ask_sends_the_request_and_returns_the_reply() {
        let reply = LocateReply::Refused { reason: "no slice".into() };
        let mut input = Vec::new();
        write_value(&mut input, 0, &reply).unwrap();
        let mut stream = Scripted { input: std::io::Cursor::new(input), written: Vec::new() };
        assert_eq!(ask(&mut stream, &request()).unwrap(), reply);
        let (_, sent): (u32, LocateRequest) = read_value(&mut stream.written.as_slice(), &REPLY_LIMITS).unwrap();
        assert_eq!(sent, request());
    }

    #[test]
    fn a_closed_connection_is_an_error_not_a_reply() {
        let mut stream = Scripted { input: std::io::Cursor::new(Vec::new()), written: Vec::new() };
        assert!(matches!(ask(&mut stream, &request()), Err(FrameError::Closed)));
    }
}
