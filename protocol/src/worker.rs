//! Between an rpc-server's listener and its worker processes (one `SOCK_SEQPACKET` message each;
//! the session's socket travels beside `Serve` as an `SCM_RIGHTS` descriptor).

use serde::{Deserialize, Serialize};

use crate::handshake::Hello;

/// Listener to worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ToWorker {
    /// Serve the session whose socket comes with this message; the worker sends the `HelloReply`.
    Serve { session_id: u64, hello: Box<Hello>, tcp: bool, peer: String, secured: bool },
    /// The allocation was resized: tell the client its new limits.
    Limits,
}

/// Worker to listener.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FromWorker {
    /// The device is open and the worker waits for a session.
    Ready { pid: u32, total_mem: u64, sm_count: u32 },
    /// The device could not be opened; the worker exits.
    Failed { reason: String },
}
