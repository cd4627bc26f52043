//! Control-plane services (tarpc traits) between the Flyt daemons and `flytctl`.
//!
//! Each service is a `#[tarpc::service]` trait here; the daemon that serves it holds the impl.

pub mod rpc_server;
