//! flyt-cluster-manager: inventory, placement, allocations, leases and the admin API.
//!
//! `flyt-cluster-manager [--config FILE]`; every setting also comes from the environment
//! (`FLYT_CLUSTER_MANAGER_*`, see `configs/cluster-manager.toml`). When ready it prints one line
//! on stdout: `flyt-cluster-manager listening on <tcp address> unix:<admin socket>`, then
//! ` metrics:<host:port>` when metrics are served.
#![forbid(unsafe_code)]

mod config;
mod metrics;
mod model;
mod service;
mod store;

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context as _;
use clap::Parser;
use flyt_daemon_kit::{
    auth::ClusterKey,
    rpc::{self, ControlListener, Endpoint},
};
use flyt_protocol::control::{
    auth::ServiceName,
    cluster::{ClusterAdmin, ClusterClient, ClusterNode},
};

use crate::{
    config::{ClusterManagerConfig, ENV_PREFIX},
    metrics::{ClusterMetrics, TimedStore},
    service::{Cluster, ClusterService},
    store::{Store, embedded::EmbeddedStore, mongo::MongoStore},
};

/// How often leases and idle allocations are checked.
const REAP_PERIOD: Duration = Duration::from_millis(250);

#[derive(Parser)]
#[command(version, about = "Flyt cluster manager: places GPU slices and keeps the cluster's state")]
struct Args {
    /// TOML config file; settings missing from it take their defaults, and FLYT_CLUSTER_MANAGER_* variables override both.
    #[arg(long, env = "FLYT_CLUSTER_MANAGER_CONFIG")]
    config: Option<PathBuf>,
    /// Print the effective config (defaults, file and environment merged) and exit.
    #[arg(long)]
    print_config: bool,
}

fn main() -> std::process::ExitCode {
    flyt_daemon_kit::daemon::exit_code("flyt-cluster-manager", run_main())
}

fn run_main() -> anyhow::Result<()> {
    let args = Args::parse();
    flyt_daemon_kit::logging::init("info");
    let config: ClusterManagerConfig = flyt_daemon_kit::config::load(args.config.as_deref(), ENV_PREFIX, std::env::vars())?;
    if args.print_config {
        return Ok(flyt_daemon_kit::daemon::print_config(&config)?);
    }
    if !flyt_daemon_kit::daemon::install_tls(&config.tls)? && config.admin_over_tcp {
        anyhow::bail!("admin_over_tcp needs [tls] (ca_file, cert_file, key_file): the admin API never goes over plain TCP");
    }
    let runtime = flyt_daemon_kit::daemon::runtime()?;
    runtime.block_on(async {
        let key = ClusterKey::load(config.cluster_key_file.as_ref())?;
        let metrics = Arc::new(ClusterMetrics::default());
        if config.store.uri.is_empty() {
            let path = PathBuf::from(&config.state_dir).join("cluster-state.json");
            serve(TimedStore::new(EmbeddedStore::open(&path)?, metrics.clone()), key, config, metrics).await
        } else {
            let store = MongoStore::connect(&config.store.uri, &config.store.database).await?;
            serve(TimedStore::new(store, metrics.clone()), key, config, metrics).await
        }
    })
}

async fn serve<S: Store>(store: S, key: ClusterKey, config: ClusterManagerConfig, metrics: Arc<ClusterMetrics>) -> anyhow::Result<()> {
    let tcp_endpoint = Endpoint::parse(&config.listen).context("setting `listen`")?;
    let admin_endpoint = Endpoint::Unix(PathBuf::from(&config.admin_socket));
    let tcp = ControlListener::bind(&tcp_endpoint, 0o600).await?;
    let admin = ControlListener::bind(&admin_endpoint, 0o600).await?;
    let mut ready_line = format!("flyt-cluster-manager listening on {} {}", tcp.local_endpoint(), admin.local_endpoint());
    let cluster: Arc<Cluster<S>> = Cluster::open(store, key.clone(), config.clone(), metrics.clone()).await?;
    let service = ClusterService(cluster.clone());
    if !config.metrics_listen.is_empty() {
        let (shared, runtime) = (cluster.clone(), tokio::runtime::Handle::current());
        let bound = flyt_daemon_kit::metrics::serve(&config.metrics_listen, "flyt-metrics", move || {
            crate::metrics::render(&metrics, &runtime.block_on(shared.snapshot()))
        })
        .context("setting `metrics_listen`")?;
        ready_line.push_str(&format!(" metrics:{bound}"));
    }

    let shared = service.clone();
    let mut tcp_services = vec![ServiceName::ClusterNode, ServiceName::ClusterClient];
    if config.admin_over_tcp {
        tcp_services.push(ServiceName::ClusterAdmin);
    }
    let tcp_task = tokio::spawn(rpc::accept_loop(tcp, key.clone(), tcp_services, move |name, stream| {
        let service = shared.clone();
        async move {
            match name {
                ServiceName::ClusterNode => rpc::serve_connection(stream, ClusterNode::serve(service)).await,
                ServiceName::ClusterClient => rpc::serve_connection(stream, ClusterClient::serve(service)).await,
                ServiceName::ClusterAdmin => rpc::serve_connection(stream, ClusterAdmin::serve(service)).await,
                // accept_loop admits only the services listed.
                ServiceName::NodeManager | ServiceName::RpcServerControl => {}
            }
        }
    }));
    let shared = service.clone();
    let admin_task = tokio::spawn(rpc::accept_loop(admin, key, vec![ServiceName::ClusterAdmin], move |_, stream| {
        let service = shared.clone();
        async move { rpc::serve_connection(stream, ClusterAdmin::serve(service)).await }
    }));
    tokio::spawn(service::reap_forever(cluster, REAP_PERIOD));

    // Scripts and tests wait for this line (ports resolved) before they connect.
    println!("{ready_line}");
    Ok(wait_for_signal(tcp_task, admin_task, &admin_endpoint).await?)
}

async fn wait_for_signal(
    tcp_task: tokio::task::JoinHandle<()>,
    admin_task: tokio::task::JoinHandle<()>,
    admin_endpoint: &Endpoint,
) -> std::io::Result<()> {
    flyt_daemon_kit::daemon::shutdown_signal().await?;
    tcp_task.abort();
    admin_task.abort();
    if let Endpoint::Unix(path) = admin_endpoint {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}
