//! The cluster manager's settings. Every key has a default and an environment override
//! `FLYT_CLUSTER_MANAGER_<TABLE>_<KEY>` (`configs/cluster-manager.toml` documents each).

use serde::{Deserialize, Serialize};

/// Prefix of every environment override.
pub const ENV_PREFIX: &str = "FLYT_CLUSTER_MANAGER";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterManagerConfig {
    /// TCP address for node managers and client managers.
    pub listen: String,
    /// Unix socket for `flytctl` (owner-only).
    pub admin_socket: String,
    /// Also serve `flytctl` on `listen`, for administration from other hosts; needs `[tls]`
    /// (the admin API never goes over plain TCP).
    pub admin_over_tcp: bool,
    /// File holding the cluster key shared by every daemon of the cluster.
    pub cluster_key_file: String,
    /// Where the embedded store keeps its file.
    pub state_dir: String,
    /// `host:port` for Prometheus metrics at `/metrics`; empty: none.
    pub metrics_listen: String,
    pub store: StoreConfig,
    pub leases: LeaseConfig,
    pub allocations: AllocationConfig,
    /// TLS on the TCP listener (node managers, client managers) and on connections to node managers.
    pub tls: flyt_daemon_kit::tls::TlsConfig,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// Empty: the embedded store under `state_dir`. `mongodb://...`: MongoDB.
    pub uri: String,
    /// MongoDB database name.
    pub database: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LeaseConfig {
    /// How often node managers and client managers report.
    pub heartbeat_interval_ms: u64,
    /// A node manager silent this long is marked down (it gets no new allocations).
    pub node_timeout_ms: u64,
    /// A node down this long loses its allocations (they are released). A node manager that
    /// comes back sooner adopts its running rpc-servers and their apps carry on.
    pub node_grace_seconds: u64,
    /// A client manager silent this long has lost its clients (its allocations become idle).
    pub client_timeout_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AllocationConfig {
    /// An allocation with no client and no session for this long is released.
    pub idle_grace_seconds: u64,
    /// Lifetime of the session tokens handed to clients.
    pub token_ttl_seconds: u64,
    /// How long a node manager may take to start an rpc-server.
    pub start_timeout_seconds: u64,
}

impl Default for ClusterManagerConfig {
    fn default() -> Self {
        Self {
            listen: "0.0.0.0:7070".into(),
            admin_socket: "/run/flyt/admin.sock".into(),
            admin_over_tcp: false,
            cluster_key_file: "/etc/flyt/cluster.key".into(),
            state_dir: "/var/lib/flyt/cluster-manager".into(),
            metrics_listen: String::new(),
            store: StoreConfig::default(),
            leases: LeaseConfig::default(),
            allocations: AllocationConfig::default(),
            tls: flyt_daemon_kit::tls::TlsConfig::default(),
        }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self { uri: String::new(), database: "flyt".into() }
    }
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self { heartbeat_interval_ms: 1000, node_timeout_ms: 5000, node_grace_seconds: 60, client_timeout_ms: 5000 }
    }
}

impl Default for AllocationConfig {
    fn default() -> Self {
        Self { idle_grace_seconds: 60, token_ttl_seconds: 3600, start_timeout_seconds: 60 }
    }
}

flyt_daemon_kit::example_config_test!(ClusterManagerConfig, "cluster-manager.toml");
