//! What every daemon's `main` does the same way: its exit status and error line, its runtime,
//! TLS, printing the effective config, and waiting for SIGTERM or SIGINT.

use std::{fmt::Display, process::ExitCode};

use serde::Serialize;

/// The exit status of a daemon's run: an error is printed as `program: error` on stderr (with
/// `{:#}`, anyhow's whole chain of causes on one line, without a backtrace).
pub fn exit_code<E: Display>(program: &str, result: Result<(), E>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{program}: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// The daemons' runtime: two workers are plenty for control traffic.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()
}

/// Installs `[tls]` for this process (see [`crate::tls::install`]) and says so in the log;
/// returns whether TLS is on.
pub fn install_tls(config: &crate::tls::TlsConfig) -> Result<bool, crate::tls::TlsError> {
    let on = crate::tls::install(config)?;
    if on {
        tracing::info!(ca = %config.ca_file, "TLS on every TCP connection");
    }
    Ok(on)
}

/// `--print-config`: the effective config as TOML on stdout.
pub fn print_config<T: Serialize>(config: &T) -> Result<(), toml::ser::Error> {
    print!("{}", toml::to_string(config)?);
    Ok(())
}

/// Returns at the first SIGTERM or SIGINT, having logged which.
pub async fn shutdown_signal() -> std::io::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = terminate.recv() => tracing::info!("SIGTERM: stopping"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
    }
    Ok(())
}
