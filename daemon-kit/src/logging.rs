//! Logging for every daemon: `tracing` to stderr, filtered by `FLYT_LOG` (or `RUST_LOG`),
//! e.g. `FLYT_LOG=debug` or `FLYT_LOG=flyt_cluster_manager=debug,info`.

use tracing_subscriber::{EnvFilter, fmt};

/// Installs the global subscriber. `default_filter` applies when no env filter is set.
/// Calling it twice is harmless (the second call does nothing).
pub fn init(default_filter: &str) {
    let filter = std::env::var("FLYT_LOG")
        .ok()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .and_then(|spec| EnvFilter::try_new(spec).ok())
        .unwrap_or_else(|| EnvFilter::new(default_filter));
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(colour).with_target(false).try_init();
}
