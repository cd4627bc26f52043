//! The node manager's settings. Every key has a default and an environment override
//! `FLYT_NODE_MANAGER_<TABLE>_<KEY>` (`configs/node-manager.toml` documents each).

use serde::{Deserialize, Serialize};

/// Prefix of every environment override.
pub const ENV_PREFIX: &str = "FLYT_NODE_MANAGER";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeManagerConfig {
    /// This node's name in the cluster; empty: the host name.
    pub node_id: String,
    /// The cluster manager's TCP address.
    pub cluster_manager: String,
    /// The address clients and VMs know this host by (matched against a VM's `host_ip`);
    /// empty: the local address of the route to the cluster manager.
    pub host_ip: String,
    /// Host put into the addresses given out (node control, rpc-servers); empty: `host_ip`.
    pub advertise_host: String,
    /// Where the cluster manager reaches this node manager (port 0: any free port).
    pub control_listen: String,
    /// File holding the cluster key.
    pub cluster_key_file: String,
    /// Records of running rpc-servers (pid, control socket) and their logs.
    pub state_dir: String,
    /// Where sessions' snapshots are written and received when allocations move between nodes
    /// (one folder per allocation, removed after the move); empty: `<state_dir>/snapshots`.
    pub snapshot_dir: String,
    /// `auto` (the CUDA driver if it sees a GPU, else emulated), `cuda` or `emulated`.
    pub device: String,
    /// GPUs to report when the device is emulated.
    pub emulated_gpus: Vec<EmulatedGpu>,
    /// Library the CUDA driver is loaded from.
    pub cuda_library: String,
    /// `host:port` for this node's Prometheus metrics at `/metrics`; empty: none.
    pub metrics_listen: String,
    pub rpc_server: RpcServerConfig,
    pub mps: MpsConfig,
    /// TLS on the control listener and on the connection to the cluster manager.
    pub tls: flyt_daemon_kit::tls::TlsConfig,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmulatedGpu {
    pub name: String,
    pub memory_mib: u64,
    pub sm_count: u32,
    /// The other emulated GPUs (by index) this one reaches over NVLink, for testing placement.
    #[serde(default)]
    pub nvlink: Vec<u32>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RpcServerConfig {
    /// The `flyt-rpc-server` binary (a bare name is looked up in PATH).
    pub binary: String,
    /// Host each rpc-server listens on for TCP clients (port chosen by the server).
    pub listen_host: String,
    /// Folder for each server's Unix socket (same-host clients); empty: TCP only.
    pub socket_dir: String,
    /// How long a server may take to print its listening line.
    pub start_timeout_seconds: u64,
    /// Seconds running sessions get to finish when a server is stopped.
    pub stop_grace_seconds: u32,
    /// Stop every rpc-server when the node manager exits on SIGTERM/SIGINT. When false they keep
    /// serving and the next node manager adopts them.
    pub stop_on_exit: bool,
    /// Host each rpc-server serves Prometheus metrics on (`/metrics`, port chosen by the server
    /// and reported to the cluster manager); empty: no metrics.
    pub metrics_host: String,
    /// Folder of this host's VMs' ivshmem regions (`flytctl ivshmem create`), given to each
    /// rpc-server: a guest whose allocation is on this host then moves its bulk data through its
    /// region (shared-mem mode); empty: guests use the network only.
    pub ivshmem_dir: String,
    /// The regions of this host's VMs, made in `ivshmem_dir` at start-up when missing (and kept,
    /// token and all, when present), so each exists before its VM boots.
    pub ivshmem_regions: Vec<IvshmemRegion>,
    /// Oversubscription of each GPU (`docs/design/paging.md`): its slices may promise this many
    /// times its memory, each server paging idle sessions out to host memory (1.0: off).
    pub oversubscribe: f64,
}

/// A VM's ivshmem region, as `flytctl ivshmem create NAME --size --sessions` would make it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IvshmemRegion {
    pub name: String,
    /// A power of two, as a PCI BAR is.
    pub size_mib: u64,
    /// How many of the VM's sessions it serves at once.
    pub sessions: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MpsConfig {
    /// Start the MPS control daemon at start-up (GPU hosts).
    pub enabled: bool,
    /// Command that starts it (`mps/flyt-mps-start`); gets the two directories in its env.
    pub start_command: String,
    /// Command that stops it (`mps/flyt-mps-stop`).
    pub stop_command: String,
    /// `CUDA_MPS_PIPE_DIRECTORY` for the daemon and every rpc-server.
    pub pipe_directory: String,
    /// `CUDA_MPS_LOG_DIRECTORY`.
    pub log_directory: String,
    /// Stop the MPS daemon when the node manager exits.
    pub stop_on_exit: bool,
}

impl Default for NodeManagerConfig {
    fn default() -> Self {
        Self {
            node_id: String::new(),
            cluster_manager: "127.0.0.1:7070".into(),
            host_ip: String::new(),
            advertise_host: String::new(),
            control_listen: "0.0.0.0:7071".into(),
            cluster_key_file: "/etc/flyt/cluster.key".into(),
            state_dir: "/var/lib/flyt/node-manager".into(),
            snapshot_dir: String::new(),
            device: "auto".into(),
            emulated_gpus: vec![EmulatedGpu { name: "Flyt Emulated GPU".into(), memory_mib: 16_384, sm_count: 80, nvlink: Vec::new() }],
            cuda_library: "libcuda.so.1".into(),
            metrics_listen: String::new(),
            rpc_server: RpcServerConfig::default(),
            mps: MpsConfig::default(),
            tls: flyt_daemon_kit::tls::TlsConfig::default(),
        }
    }
}

impl Default for RpcServerConfig {
    fn default() -> Self {
        Self {
            binary: "flyt-rpc-server".into(),
            listen_host: "0.0.0.0".into(),
            socket_dir: "/run/flyt/servers".into(),
            start_timeout_seconds: 30,
            stop_grace_seconds: 2,
            stop_on_exit: true,
            metrics_host: String::new(),
            ivshmem_dir: String::new(),
            ivshmem_regions: Vec::new(),
            oversubscribe: 1.0,
        }
    }
}

impl Default for MpsConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            start_command: "/usr/lib/flyt/mps/flyt-mps-start".into(),
            stop_command: "/usr/lib/flyt/mps/flyt-mps-stop".into(),
            pipe_directory: "/run/flyt/mps".into(),
            log_directory: "/var/log/flyt/mps".into(),
            stop_on_exit: true,
        }
    }
}

flyt_daemon_kit::example_config_test!(NodeManagerConfig, "node-manager.toml");

#[cfg(test)]
mod tests {
    use super::*;

    /// A host's VM regions can be declared from the environment too (a TOML array of tables).
    #[test]
    fn ivshmem_regions_come_from_the_environment() {
        let env = [(
            "FLYT_NODE_MANAGER_RPC_SERVER_IVSHMEM_REGIONS".to_string(),
            r#"[{ name = "vm1", size_mib = 4096, sessions = 8 }]"#.to_string(),
        )];
        let config: NodeManagerConfig = flyt_daemon_kit::config::load(None, ENV_PREFIX, env).unwrap();
        assert_eq!(config.rpc_server.ivshmem_regions, vec![IvshmemRegion { name: "vm1".into(), size_mib: 4096, sessions: 8 }]);
        let bad = [("FLYT_NODE_MANAGER_RPC_SERVER_IVSHMEM_REGIONS".to_string(), r#"[{ name = "vm1", size = 4096 }]"#.to_string())];
        assert!(flyt_daemon_kit::config::load::<NodeManagerConfig>(None, ENV_PREFIX, bad).is_err());
    }
}
