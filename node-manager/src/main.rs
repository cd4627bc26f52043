//! flyt-node-manager: runs on each GPU host. Discovers its GPUs, starts MPS when configured,
//! registers with the cluster manager and keeps its lease, and spawns, resizes and stops one
//! rpc-server per allocation.
//!
//! `flyt-node-manager [--config FILE]`; every setting also comes from the environment
//! (`FLYT_NODE_MANAGER_*`, see `configs/node-manager.toml`). When ready it prints one line on
//! stdout: `flyt-node-manager listening on <control address>`, then ` metrics:<host:port>` when
//! metrics are served.
// The CUDA driver probe is FFI; `cuda_probe` alone may use unsafe, with SAFETY comments.
#![deny(unsafe_code)]

mod cluster_link;
mod config;
#[allow(unsafe_code, reason = "the CUDA driver is C: loading it and calling its queries is FFI")]
mod cuda_probe;
mod discovery;
mod metrics;
mod mps;
mod regions;
mod servers;
mod service;
mod snapshots;

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::Context as _;
use clap::Parser;
use flyt_daemon_kit::{
    auth::ClusterKey,
    host,
    rpc::{self, ControlListener, Endpoint},
};
use flyt_protocol::control::{auth::ServiceName, node::NodeManagerControl};

use crate::{
    cluster_link::NodeIdentity,
    config::{ENV_PREFIX, NodeManagerConfig},
    servers::{LaunchSettings, ServerManager},
    service::NodeService,
};

#[derive(Parser)]
#[command(version, about = "Flyt node manager: offers this host's GPUs to the cluster")]
struct Args {
    /// TOML config file; settings missing from it take their defaults, and FLYT_NODE_MANAGER_* variables override both.
    #[arg(long, env = "FLYT_NODE_MANAGER_CONFIG")]
    config: Option<PathBuf>,
    /// Print the effective config (defaults, file and environment merged) and exit.
    #[arg(long)]
    print_config: bool,
}

fn absolute(path: &str) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| PathBuf::from(path))
}

fn main() -> std::process::ExitCode {
    flyt_daemon_kit::daemon::exit_code("flyt-node-manager", run_main())
}

fn run_main() -> anyhow::Result<()> {
    let args = Args::parse();
    flyt_daemon_kit::logging::init("info");
    let mut config: NodeManagerConfig = flyt_daemon_kit::config::load(args.config.as_deref(), ENV_PREFIX, std::env::vars())?;
    if config.node_id.is_empty() {
        config.node_id = host::hostname();
    }
    if config.host_ip.is_empty() {
        config.host_ip = host::route_address(&config.cluster_manager).unwrap_or_else(|| "127.0.0.1".into());
    }
    if config.advertise_host.is_empty() {
        config.advertise_host = config.host_ip.clone();
    }
    if args.print_config {
        return Ok(flyt_daemon_kit::daemon::print_config(&config)?);
    }
    flyt_daemon_kit::daemon::install_tls(&config.tls)?;
    let runtime = flyt_daemon_kit::daemon::runtime()?;
    runtime.block_on(run(config))
}

async fn run(config: NodeManagerConfig) -> anyhow::Result<()> {
    let key_file = absolute(&config.cluster_key_file);
    let key = ClusterKey::load(&key_file)?;
    let cluster = Endpoint::parse(&config.cluster_manager).context("setting `cluster_manager`")?;
    let (device, gpus) = discovery::discover(&config)?;
    for gpu in &gpus {
        tracing::info!(index = gpu.index, name = %gpu.name, memory_mib = gpu.memory_bytes >> 20, sm_count = gpu.sm_count, emulated = gpu.emulated, "GPU");
    }
    let mut env = Vec::new();
    if config.mps.enabled {
        mps::start(&config.mps)?;
        tracing::info!(pipe_directory = %config.mps.pipe_directory, "MPS control daemon running");
        env.extend(mps::environment(&config.mps));
    }
    // Before any server: a VM's region must exist before the VM boots, and a server before it.
    for line in regions::prepare(&config.rpc_server).map_err(anyhow::Error::msg)? {
        tracing::info!("{line}");
    }
    let state_dir = absolute(&config.state_dir);
    let settings = LaunchSettings {
        binary: config.rpc_server.binary.clone(),
        listen_host: config.rpc_server.listen_host.clone(),
        socket_dir: (!config.rpc_server.socket_dir.is_empty()).then(|| absolute(&config.rpc_server.socket_dir)),
        advertise_host: config.advertise_host.clone(),
        key_file,
        servers_dir: state_dir.join("servers"),
        image_cache_dir: state_dir.join("images"),
        snapshot_dir: if config.snapshot_dir.is_empty() { state_dir.join("snapshots") } else { absolute(&config.snapshot_dir) },
        device,
        gpus: gpus.clone(),
        env,
        start_timeout: Duration::from_secs(config.rpc_server.start_timeout_seconds),
        stop_grace_seconds: config.rpc_server.stop_grace_seconds,
        metrics_host: (!config.rpc_server.metrics_host.is_empty()).then(|| config.rpc_server.metrics_host.clone()),
        ivshmem_dir: (!config.rpc_server.ivshmem_dir.is_empty()).then(|| PathBuf::from(&config.rpc_server.ivshmem_dir)),
        tls: (!config.tls.ca_file.is_empty()).then(|| (absolute(&config.tls.cert_file), absolute(&config.tls.key_file))),
        oversubscribe: (config.rpc_server.oversubscribe > 1.0).then_some(config.rpc_server.oversubscribe),
    };
    let servers = Arc::new(ServerManager::new(settings, key.clone()).with_context(|| format!("state directory {}", state_dir.display()))?);

    let control_endpoint = Endpoint::parse(&config.control_listen).context("setting `control_listen`")?;
    let listener = ControlListener::bind(&control_endpoint, 0o600).await?;
    let control_address = match listener.local_endpoint() {
        Endpoint::Tcp(address) => match address.rsplit_once(':') {
            Some((_, port)) => format!("{}:{port}", bracket(&config.advertise_host)),
            None => address,
        },
        unix => unix.to_string(),
    };
    let service = NodeService(servers.clone());
    let accept = tokio::spawn(rpc::accept_loop(listener, key.clone(), vec![ServiceName::NodeManager], move |_, stream| {
        let service = service.clone();
        async move { rpc::serve_connection(stream, service.serve()).await }
    }));
    let identity = NodeIdentity {
        node_id: config.node_id.clone(),
        host_ip: config.host_ip.clone(),
        boot_id: host::boot_id(),
        control_address: control_address.clone(),
        // An oversubscribed GPU offers the memory its slices may promise (`docs/design/paging.md`).
        gpus: gpus
            .iter()
            .map(|gpu| match config.rpc_server.oversubscribe {
                factor if factor > 1.0 => flyt_protocol::control::cluster::GpuInfo {
                    memory_bytes: crate::servers::promised(gpu.memory_bytes, factor),
                    ..gpu.clone()
                },
                _ => gpu.clone(),
            })
            .collect(),
    };
    let link = tokio::spawn(cluster_link::run(cluster, key, identity, servers.clone()));
    let mps_up = Arc::new(std::sync::atomic::AtomicBool::new(config.mps.enabled));
    let mps_watch = config.mps.enabled.then(|| tokio::spawn(mps::watch(config.mps.clone(), mps_up.clone())));
    let mut ready_line = format!("flyt-node-manager listening on {control_address}");
    if !config.metrics_listen.is_empty() {
        let (node, mps_enabled, servers) = (config.node_id.clone(), config.mps.enabled, servers.clone());
        let runtime = tokio::runtime::Handle::current();
        let bound = flyt_daemon_kit::metrics::serve(&config.metrics_listen, "flyt-metrics", move || {
            let reports = runtime.block_on(servers.reports());
            let mps = mps_enabled.then(|| mps_up.load(std::sync::atomic::Ordering::Relaxed));
            crate::metrics::render(&node, &gpus, &reports, mps)
        })
        .context("setting `metrics_listen`")?;
        ready_line.push_str(&format!(" metrics:{bound}"));
    }
    // Scripts and tests wait for this line.
    println!("{ready_line}");

    flyt_daemon_kit::daemon::shutdown_signal().await?;
    link.abort();
    accept.abort();
    if let Some(watch) = mps_watch {
        watch.abort();
    }
    if config.rpc_server.stop_on_exit {
        servers.stop_all().await;
    } else {
        tracing::info!(servers = ?servers.server_names().await, "leaving rpc-servers running for the next node manager to adopt");
    }
    if config.mps.enabled
        && config.mps.stop_on_exit
        && let Err(error) = mps::stop(&config.mps)
    {
        tracing::warn!(%error, "could not stop the MPS control daemon");
    }
    remove_socket(&control_endpoint);
    Ok(())
}

fn bracket(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') { format!("[{host}]") } else { host.to_string() }
}

fn remove_socket(endpoint: &Endpoint) {
    if let Endpoint::Unix(path) = endpoint {
        let _ = std::fs::remove_file(Path::new(path));
    }
}
