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
}

fn main() {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FLYT_LOG").unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cli.command {
        Some(Mode::Worker(args)) => std::process::exit(worker::run(&args)),
        None => {
            if let Err(error) = listener::run(cli.server) {
                eprintln!("flyt-rpc-server: {error:#}");
                std::process::exit(1);
            }
        }
    }
}
