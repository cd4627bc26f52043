//! `flyt-rpc-server`: see the crate documentation.

use clap::{Parser, Subcommand};
use flyt_rpc_server::{config::ServerArgs, listener, worker};

#[derive(Parser)]
#[command(name = "flyt-rpc-server", version, about = "Serves one GPU slice to remote CUDA apps")]
struct Cli {
    #[command(subcommand)]
    command: Option<Mode>,
    #[command(flatten)]
    server: ServerArgs,
}

#[derive(Subcommand)]
enum Mode {
    /// Internal: a worker process started by the listener.
    #[command(hide = true)]
    Worker(worker::WorkerArgs),
    /// Internal: prints the UUIDs of `--gpu` as this environment's driver numbers them.
    #[command(hide = true)]
    GpuUuids(flyt_rpc_server::visible::ProbeArgs),
}

fn main() {
    let cli = Cli::parse();
    let filter = || tracing_subscriber::EnvFilter::try_from_env("FLYT_LOG").unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    match cli.command {
        Some(Mode::Worker(args)) => {
            // A worker's standard output and error belong to its app (what the kernels print);
            // its own log lines go to the original standard error.
            let (capture, log) = match flyt_rpc_server::output::Capture::install() {
                Ok((capture, log)) => (Some(capture), Some(log)),
                Err(error) => {
                    eprintln!("flyt-rpc-server worker: device output will not reach the app: {error}");
                    (None, None)
                }
            };
            let builder = tracing_subscriber::fmt().with_env_filter(filter()).with_ansi(ansi);
            match log {
                Some(log) => builder.with_writer(std::sync::Mutex::new(log)).init(),
                None => builder.with_writer(std::io::stderr).init(),
            }
            // Before the driver loads: its reservations go above the window's.
            if let Err(reason) = flyt_rpc_server::address_space::reserve_window() {
                tracing::warn!(%reason, "address window");
            }
            std::process::exit(worker::run(&args, capture))
        }
        Some(Mode::GpuUuids(args)) => match flyt_rpc_server::visible::probe(&args) {
            Ok(probed) => {
                for line in probed.lines() {
                    println!("{line}");
                }
            }
            Err(error) => {
                eprintln!("flyt-rpc-server gpu-uuids: {error}");
                std::process::exit(1);
            }
        },
        None => {
            tracing_subscriber::fmt().with_env_filter(filter()).with_writer(std::io::stderr).with_ansi(ansi).init();
            flyt_rpc_server::address_space::set_window_for_workers(cli.server.address_window, cli.server.emulated_fixed_base);
            if let Err(error) = listener::run(cli.server) {
                eprintln!("flyt-rpc-server: {error:#}");
                std::process::exit(1);
            }
        }
    }
}
