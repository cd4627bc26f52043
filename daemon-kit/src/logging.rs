//! Logging for every daemon: `tracing` to stderr, filtered by `FLYT_LOG` (or `RUST_LOG`),
//! e.g. `FLYT_LOG=debug` or `FLYT_LOG=flyt_cluster_manager=debug,info`.

use tracing_subscriber::{EnvFilter, fmt};

/// Installs the global subscriber. `default_filter` applies when no env filter is set.
/// Calling it twice is harmless (the second call does nothing).
///
/// tarpc's own per-request spans (trace ids, deadlines) are left out below `warn` unless the
/// filter names tarpc: a line names its connection's peer and service through the span
/// [`crate::rpc::accept_loop`] opens, which is what an operator reads.
pub fn init(default_filter: &str) {
    let spec = std::env::var("FLYT_LOG").ok().or_else(|| std::env::var("RUST_LOG").ok()).unwrap_or_else(|| default_filter.to_string());
    let spec = if spec.contains("tarpc") { spec } else { format!("{spec},tarpc=warn") };
    let filter = EnvFilter::try_new(&spec).unwrap_or_else(|_| EnvFilter::new(format!("{default_filter},tarpc=warn")));
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(colour).with_target(false).try_init();
}
