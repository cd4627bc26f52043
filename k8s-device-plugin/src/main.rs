//! `flyt-device-plugin`: Flyt's Kubernetes device plugin, one per node (a DaemonSet,
//! `deploy/kubernetes/`). It registers `flyt.dev/gpu` with the kubelet and serves the device
//! plugin API until it is stopped; `docs/kubernetes.md` has the design and the setup.
#![forbid(unsafe_code)]

use std::{path::PathBuf, time::Duration};

use anyhow::Context as _;
use clap::Parser;
use flyt_k8s_device_plugin::{
    devices::{self, Layout},
    plugin::{Config, Plugin},
};
use flyt_protocol::jobs::{DEFAULT_JOB_SOCKET, JobShape};

#[derive(Parser, Debug)]
#[command(version, about = "Flyt's Kubernetes device plugin: advertises flyt.dev/gpu and gives each container its Flyt GPUs")]
struct Args {
    /// The kubelet's device plugin folder (its kubelet.sock; the plugin's socket goes there).
    #[arg(long, env = "FLYT_DEVICE_PLUGIN_KUBELET_DIR", default_value = "/var/lib/kubelet/device-plugins")]
    kubelet_dir: PathBuf,
    /// The plugin's socket name in that folder.
    #[arg(long, env = "FLYT_DEVICE_PLUGIN_SOCKET_NAME", default_value = "flyt-gpu.sock")]
    socket_name: String,
    /// The kubelet's pod resources socket, read to give back the GPUs of pods that are gone.
    #[arg(long, env = "FLYT_DEVICE_PLUGIN_POD_RESOURCES", default_value = "/var/lib/kubelet/pod-resources/kubelet.sock")]
    pod_resources_socket: PathBuf,
    /// The node's client manager's job socket (its `job_socket` setting).
    #[arg(long, env = "FLYT_CLIENT_MANAGER_JOB_SOCKET", default_value = DEFAULT_JOB_SOCKET)]
    job_socket: PathBuf,
    /// One device's size: `sms=S,memory=M` (a slice of one GPU), or `whole` for whole GPUs.
    #[arg(long, env = "FLYT_DEVICE_PLUGIN_SLICE", default_value = "whole")]
    slice: String,
    /// Flyt's library folder on the node (libcuda.so.1, libcudart.so.13, libnvidia-ml.so.1).
    #[arg(long, env = "FLYT_DEVICE_PLUGIN_LIB_DIR", default_value = "/opt/flyt/lib")]
    lib_dir: PathBuf,
    /// Where the library folder is mounted in containers (read-only); the node's path when unset.
    #[arg(long, env = "FLYT_DEVICE_PLUGIN_CONTAINER_LIB_DIR")]
    container_lib_dir: Option<String>,
    /// How often the Flyt cluster's capacity is asked, in milliseconds.
    #[arg(long, env = "FLYT_DEVICE_PLUGIN_POLL_MS", default_value_t = 10_000)]
    poll_ms: u64,
    /// How often pods' devices are compared with the containers' allocations, in milliseconds.
    #[arg(long, env = "FLYT_DEVICE_PLUGIN_RECONCILE_MS", default_value_t = 30_000)]
    reconcile_ms: u64,
    /// How long after Allocate a container's devices must show in the pod resources before
    /// its allocation is given back, in milliseconds.
    #[arg(long, env = "FLYT_DEVICE_PLUGIN_RELEASE_GRACE_MS", default_value_t = 120_000)]
    release_grace_ms: u64,
}

/// `whole`, or `sms=S,memory=M` as `--flyt-gpus` takes them after the count.
fn parse_slice(text: &str) -> Result<JobShape, String> {
    if text == "whole" {
        return Ok(JobShape { gpus: 1, compute_units: 0, memory_mib: 0 });
    }
    let shape = JobShape::parse(&format!("1,{text}")).map_err(|reason| format!("--slice {text}: {reason}"))?;
    if shape.whole() {
        return Err(format!("--slice {text}: expected `whole` or sms=S,memory=M"));
    }
    Ok(shape)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("FLYT_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let shape = parse_slice(&args.slice).map_err(anyhow::Error::msg)?;
    if !devices::is_lib_dir(&args.lib_dir) {
        anyhow::bail!("--lib-dir {}: no libcuda.so.1 there (Flyt's library folder, from tools/dist)", args.lib_dir.display());
    }
    std::fs::create_dir_all(&args.kubelet_dir).with_context(|| format!("--kubelet-dir {}", args.kubelet_dir.display()))?;
    let host_lib_dir = args.lib_dir.display().to_string();
    let config = Config {
        kubelet_dir: args.kubelet_dir,
        socket_name: args.socket_name,
        pod_resources_socket: args.pod_resources_socket,
        job_socket: args.job_socket,
        shape,
        layout: Layout { container_lib_dir: args.container_lib_dir.unwrap_or_else(|| host_lib_dir.clone()), host_lib_dir },
        poll: Duration::from_millis(args.poll_ms.max(100)),
        reconcile: Duration::from_millis(args.reconcile_ms.max(100)),
        release_grace: Duration::from_millis(args.release_grace_ms),
    };
    tracing::info!(?config, "flyt-device-plugin starting");
    let plugin = Plugin::new(config);
    tokio::select! {
        result = plugin.run() => result,
        _ = tokio::signal::ctrl_c() => Ok(()),
        _ = terminated() => Ok(()),
    }
}

async fn terminated() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut signal) => {
            signal.recv().await;
        }
        Err(_) => std::future::pending().await,
    }
}
