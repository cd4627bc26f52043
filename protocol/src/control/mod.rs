//! Control-plane services (tarpc traits) between the Flyt daemons and `flytctl`.
//!
//! Each service is a `#[tarpc::service]` trait here; the daemon that serves it holds the impl.
//! Every connection first passes the [`auth`] handshake.

pub mod auth;
pub mod cluster;
pub mod node;
pub mod rpc_server;
