//! Handing a file descriptor to the session's worker on the same host: the app's own shared file
//! mappings (a `/dev/shm` file NCCL maps in every rank) are registered as mapped host memory by
//! mapping the same file in the worker, at the app's address.
//!
//! The worker hands out a one-use ticket (`ShmFileTicket`): the name of its abstract Unix socket
//! and a random token. The app connects there and sends [`request`] with the descriptor riding
//! along as `SCM_RIGHTS`; the worker answers one byte ([`ACCEPTED`] or 0) and keeps the
//! descriptor under the token until the app's `ShmRegisterFile` names it. The descriptor carries
//! only the access the app itself had, and the worker never opens a path the app names.

/// The bytes of a ticket's token.
pub const TOKEN_LEN: usize = 16;
/// A request on a worker's socket: a token, a kind byte and a second token (zeros here).
pub const REQUEST_LEN: usize = 2 * TOKEN_LEN + 1;
/// The kind byte of a deposit (the socket also serves shareable handles, kinds 1 to 3).
pub const KIND: u8 = 4;
/// The worker's one-byte answer when it kept the descriptor.
pub const ACCEPTED: u8 = 1;
/// What every worker's socket name starts with.
pub const SOCKET_PREFIX: &str = "flyt-vmm-";

/// A deposit request for `token`.
pub fn request(token: &[u8; TOKEN_LEN]) -> [u8; REQUEST_LEN] {
    let mut out = [0; REQUEST_LEN];
    out[..TOKEN_LEN].copy_from_slice(token);
    out[TOKEN_LEN] = KIND;
    out
}
