//! Between an rpc-server's listener and its worker processes (one `SOCK_SEQPACKET` message each;
//! the session's socket travels beside `Serve` as an `SCM_RIGHTS` descriptor).

use serde::{Deserialize, Serialize};

use crate::control::rpc_server::SnapshotInfo;

use crate::handshake::Hello;

/// Listener to worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ToWorker {
    /// Serve the session whose socket comes with this message; the worker sends the `HelloReply`.
    Serve { session_id: u64, hello: Box<Hello>, tcp: bool, peer: String, secured: bool },
    /// The allocation was resized: tell the client its new limits.
    Limits,
    /// Pause the session's app, drain its work and write its snapshot into folder `dir`
    /// (answered with `Checkpointed`); give up when the app makes no call within `timeout_ms`.
    /// With `on_device`, the allocations' bytes stay on the GPU, handed to a worker on the same
    /// GPU that restores the snapshot (a move on one node), instead of going into the file.
    Checkpoint { dir: String, timeout_ms: u64, on_device: bool },
    /// End the pause after `Checkpoint`: the app moves to `to` (`Some`, empty for this server
    /// again) or goes on here (`None`).
    Release { to: Option<String> },
    /// (To a warm worker.) Restore the snapshot in file `path`, answer `Restored`, then wait for
    /// the `Serve` of its app.
    Restore { path: String },
    /// A data connection claims to belong to the session (`crate::stripes`); its socket comes
    /// with this message. The worker checks the secret and answers the connection.
    Stripe { join: crate::stripes::StripeJoin, tcp: bool, secured: bool },
    /// (Paging, `docs/design/paging.md`.) Page the session out if it is idle and pageable: its
    /// allocations' bytes to host memory, their physical memory released, their addresses kept.
    /// `reason` is logged. Not answered: the budget page shows what was freed.
    PageOut { reason: String },
    /// A client comes back to the session after its TCP connection broke; its socket comes with
    /// this message. The worker checks the secret, answers the connection and goes on over it.
    Reattach { reattach: crate::handshake::Reattach, tcp: bool, secured: bool },
}

/// Worker to listener.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FromWorker {
    /// The device is open and the worker waits for a session.
    Ready { pid: u32, total_mem: u64, sm_count: u32 },
    /// The device could not be opened; the worker exits.
    Failed { reason: String },
    /// The answer to `Checkpoint`.
    Checkpointed(Result<SnapshotInfo, String>),
    /// The answer to `Restore`; after a failure the worker exits.
    Restored(Result<(), String>),
    /// (Paging.) The session needs `bytes` more of device memory than is free: the listener's
    /// coordinator pages idle sessions out. Not answered; the worker watches the budget page.
    NeedMemory { bytes: u64 },
}
