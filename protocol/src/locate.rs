//! The shim's one question to its local client manager (Unix socket, data-plane framing, one
//! request and one reply): "which server do I use, with which token?". It uses the data-plane
//! framing rather than tarpc so the shim, loaded into every CUDA app, carries no async runtime.

use serde::{Deserialize, Serialize};

use crate::handshake::ClientIdentity;

/// The shim's request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocateRequest {
    pub client: ClientIdentity,
}

/// The client manager's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LocateReply {
    /// Connect here (`host:port` or `unix:/path`) and present `token`.
    Server {
        address: String,
        token: String,
        /// The server shares this host, so the shared-memory channel may be offered.
        same_host: bool,
    },
    /// No GPU for this client; `reason` says what is missing and is shown to the user.
    Refused { reason: String },
}
