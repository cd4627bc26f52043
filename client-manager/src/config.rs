//! The client manager's settings. Every key has a default and an environment override
//! `FLYT_CLIENT_MANAGER_<KEY>` (`configs/client-manager.toml` documents each).
//!
//! `socket`'s override, `FLYT_CLIENT_MANAGER_SOCKET`, is the very variable the shim reads in
//! an app's environment: one name, one meaning, one default (`/run/flyt/client-manager.sock`).

use serde::{Deserialize, Serialize};

/// Prefix of every environment override.
pub const ENV_PREFIX: &str = "FLYT_CLIENT_MANAGER";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientManagerConfig {
    /// This VM's (client host's) identity in the cluster: its key in `vm_required_resources`.
    /// Empty: the local address of the route to the cluster manager.
    pub vm_ip: String,
    /// The cluster manager's TCP address.
    pub cluster_manager: String,
    /// File holding the cluster key.
    pub cluster_key_file: String,
    /// The Unix socket apps (the shim) ask.
    pub socket: String,
    /// Its permissions: apps run as any local user, so everyone may connect by default.
    pub socket_mode: u32,
    /// Local users allowed to get a GPU (by uid); empty: every user.
    pub allowed_uids: Vec<u32>,
    /// How long an app's request may wait for placement and server start, and for a cluster
    /// manager that is away (restarting) to come back. A VM whose allocation is known gets it
    /// from memory after a short wait instead.
    pub request_timeout_seconds: u64,
    /// How often client processes are checked for exit.
    pub client_check_ms: u64,
    /// `host:port` for Prometheus metrics at `/metrics`; empty: none.
    pub metrics_listen: String,
    /// TLS on the connection to the cluster manager.
    pub tls: flyt_daemon_kit::tls::TlsConfig,
    /// The Unix socket a batch scheduler's plugin asks for its jobs' GPUs (Slurm's SPANK
    /// plugin, `docs/design/slurm.md`; it asks `/run/flyt/client-manager-jobs.sock` unless told
    /// otherwise); empty: none, the default, so only nodes of a cluster that runs jobs open it.
    pub job_socket: String,
    /// Local users (uids) besides root allowed to ask there (the scheduler's own user).
    pub job_uids: Vec<u32>,
}

impl Default for ClientManagerConfig {
    fn default() -> Self {
        Self {
            vm_ip: String::new(),
            cluster_manager: "127.0.0.1:7070".into(),
            cluster_key_file: "/etc/flyt/cluster.key".into(),
            socket: flyt_protocol::locate::DEFAULT_SOCKET.into(),
            socket_mode: 0o666,
            allowed_uids: Vec::new(),
            request_timeout_seconds: 60,
            client_check_ms: 250,
            metrics_listen: String::new(),
            tls: flyt_daemon_kit::tls::TlsConfig::default(),
            job_socket: String::new(),
            job_uids: Vec::new(),
        }
    }
}

flyt_daemon_kit::example_config_test!(ClientManagerConfig, "client-manager.toml");
