//! flyt-client-manager: runs on each client host or VM. Answers the shim's "which server, with
//! which token?" on a Unix socket, asks the cluster manager for the VM's slice, watches the
//! client processes and holds the lease.
//!
//! `flyt-client-manager [--config FILE]` runs the daemon (settings also from `FLYT_CLIENT_MANAGER_*`,
//! see `configs/client-manager.toml`); when ready it prints
//! `flyt-client-manager listening on unix:<socket>`, then ` metrics:<host:port>` when metrics
//! are served and ` jobs:unix:<path>` when the job socket is open (`job_socket`).
//! `flyt-client-manager locate` asks a running one as the shim would and prints the answer.
#![forbid(unsafe_code)]

mod config;
mod manager;

use std::{io::Write as _, os::unix::net::UnixStream, path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use flyt_daemon_kit::{auth::ClusterKey, host, rpc::Endpoint};
use flyt_protocol::{
    handshake::ClientIdentity,
    locate::{self, LocateReply, LocateRequest},
};

use crate::{
    config::{ClientManagerConfig, ENV_PREFIX},
    manager::ClientManager,
};

#[derive(Parser)]
#[command(version, about = "Flyt client manager: finds GPU servers for the CUDA apps of this host")]
struct Args {
    /// TOML config file; settings missing from it take their defaults, and FLYT_CLIENT_MANAGER_* variables override both.
    #[arg(long, env = "FLYT_CLIENT_MANAGER_CONFIG")]
    config: Option<PathBuf>,
    /// Print the effective config (defaults, file and environment merged) and exit.
    #[arg(long)]
    print_config: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Ask the running client manager for a server, as the shim does, and print the answer as JSON.
    Locate {
        /// The client manager's socket.
        #[arg(long, env = locate::SOCKET_ENV, default_value = locate::DEFAULT_SOCKET)]
        socket: PathBuf,
        /// Stay alive this long afterwards, as an app holding the allocation would.
        #[arg(long, default_value_t = 0)]
        hold_seconds: u64,
    },
}

fn main() -> std::process::ExitCode {
    flyt_daemon_kit::daemon::exit_code("flyt-client-manager", run_main())
}

fn run_main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(Command::Locate { socket, hold_seconds }) = args.command {
        return locate(&socket, hold_seconds);
    }
    flyt_daemon_kit::logging::init("info");
    let mut config: ClientManagerConfig = flyt_daemon_kit::config::load(args.config.as_deref(), ENV_PREFIX, std::env::vars())?;
    if config.vm_ip.is_empty() {
        config.vm_ip = host::route_address(&config.cluster_manager).unwrap_or_else(|| "127.0.0.1".into());
    }
    if args.print_config {
        return Ok(flyt_daemon_kit::daemon::print_config(&config)?);
    }
    flyt_daemon_kit::daemon::install_tls(&config.tls)?;
    let runtime = flyt_daemon_kit::daemon::runtime()?;
    runtime.block_on(run(config))
}

async fn run(config: ClientManagerConfig) -> anyhow::Result<()> {
    let key = ClusterKey::load(config.cluster_key_file.as_ref())?;
    let cluster = Endpoint::parse(&config.cluster_manager).context("setting `cluster_manager`")?;
    let socket = PathBuf::from(&config.socket);
    let listener = flyt_daemon_kit::rpc::bind_unix(&socket, config.socket_mode)
        .with_context(|| format!("cannot listen on {} (setting `socket`)", socket.display()))?;
    tracing::info!(vm_ip = %config.vm_ip, cluster_manager = %cluster, socket = %socket.display(), "client manager ready");
    let metrics_listen = config.metrics_listen.clone();
    let job_socket = (!config.job_socket.is_empty()).then(|| PathBuf::from(&config.job_socket));
    // Root only, unless other users are allowed (each request is checked by its credentials).
    let job_socket_mode = if config.job_uids.is_empty() { 0o600 } else { 0o666 };
    let job_listener = match &job_socket {
        Some(path) => Some(
            flyt_daemon_kit::rpc::bind_unix(path, job_socket_mode)
                .with_context(|| format!("cannot listen on {} (setting `job_socket`)", path.display()))?,
        ),
        None => None,
    };
    let manager = ClientManager::new(config, cluster, key);
    tokio::spawn(manager.clone().keep_lease());
    let mut ready_line = format!("flyt-client-manager listening on unix:{}", socket.display());
    if !metrics_listen.is_empty() {
        let (shared, runtime) = (manager.clone(), tokio::runtime::Handle::current());
        let bound = flyt_daemon_kit::metrics::serve(&metrics_listen, "flyt-metrics", move || runtime.block_on(shared.metrics()))
            .context("setting `metrics_listen`")?;
        ready_line.push_str(&format!(" metrics:{bound}"));
    }
    let jobs_accept =
        job_listener.map(|listener| accept_forever(listener, manager.clone(), "accept failed on the job socket", ClientManager::serve_job));
    let accept = accept_forever(listener, manager, "accept failed", ClientManager::serve_app);
    if let Some(path) = &job_socket {
        ready_line.push_str(&format!(" jobs:unix:{}", path.display()));
    }
    println!("{ready_line}");
    flyt_daemon_kit::daemon::shutdown_signal().await?;
    accept.abort();
    let _ = std::fs::remove_file(&socket);
    if let (Some(task), Some(path)) = (jobs_accept, &job_socket) {
        task.abort();
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// Hands each connection to `listener` to `serve` (on its own task) until the task returned is
/// aborted; a failed accept is logged as `failure` and retried shortly.
fn accept_forever<Serve, Served>(
    listener: tokio::net::UnixListener,
    manager: Arc<ClientManager>,
    failure: &'static str,
    serve: Serve,
) -> tokio::task::JoinHandle<()>
where
    Serve: Fn(Arc<ClientManager>, tokio::net::UnixStream) -> Served + Send + 'static,
    Served: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    tokio::spawn(serve(manager.clone(), stream));
                }
                Err(error) => {
                    tracing::warn!(%error, "{failure}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    })
}

/// `flyt-client-manager locate`: the shim's request from the command line.
fn locate(socket: &std::path::Path, hold_seconds: u64) -> anyhow::Result<()> {
    let mut stream = UnixStream::connect(socket).with_context(|| {
        format!("cannot reach the client manager at {}: is flyt-client-manager running? (FLYT_CLIENT_MANAGER_SOCKET)", socket.display())
    })?;
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    let client = ClientIdentity {
        hostname: host::hostname(),
        pid: std::process::id(),
        program: "flyt-client-manager-locate".into(),
        boot_id: host::boot_id(),
    };
    let reply = locate::ask(&mut stream, &LocateRequest { client })?;
    let json = match &reply {
        LocateReply::Server { address, token, same_host, ivshmem, tls_ca } => {
            serde_json::json!({ "address": address, "token": token, "same_host": same_host, "ivshmem": ivshmem, "tls_ca": tls_ca })
        }
        LocateReply::Refused { reason } => serde_json::json!({ "refused": reason }),
    };
    let mut stdout = std::io::stdout();
    writeln!(stdout, "{json}")?;
    stdout.flush()?;
    std::thread::sleep(Duration::from_secs(hold_seconds));
    match reply {
        LocateReply::Server { .. } => Ok(()),
        LocateReply::Refused { reason } => anyhow::bail!("refused: {reason}"),
    }
}
