//! Starting and stopping the MPS control daemon through the scripts in `mps/`.

use std::process::Command;

use crate::config::MpsConfig;

/// Why an MPS script failed.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum MpsError {
    /// cannot run {0}: {1} (set [mps] start_command / stop_command)
    Run(String, std::io::Error),
    /// {0} failed ({1}): {2}
    Failed(String, std::process::ExitStatus, String),
}

/// The environment the MPS daemon and its clients (rpc-servers) share.
pub fn environment(config: &MpsConfig) -> Vec<(String, String)> {
    vec![
        ("CUDA_MPS_PIPE_DIRECTORY".to_string(), config.pipe_directory.clone()),
        ("CUDA_MPS_LOG_DIRECTORY".to_string(), config.log_directory.clone()),
    ]
}

/// Runs a script; returns what it wrote on stderr.
fn run(command: &str, config: &MpsConfig) -> Result<String, MpsError> {
    // A script just written can be "busy" for a moment: a process forked elsewhere in this one
    // may still hold it open for writing until it execs. That passes; other errors do not.
    let mut attempt = 0;
    let output = loop {
        match Command::new(command).envs(environment(config)).output() {
            Err(error) if error.kind() == std::io::ErrorKind::ExecutableFileBusy && attempt < 10 => {
                attempt += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            result => break result.map_err(|error| MpsError::Run(command.to_string(), error))?,
        }
    };
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
    if !output.status.success() {
        return Err(MpsError::Failed(command.to_string(), output.status, stderr));
    }
    Ok(stderr)
}

/// Starts the MPS control daemon unless it runs (the script is idempotent). Returns whether it
/// had to start one.
pub fn start(config: &MpsConfig) -> Result<bool, MpsError> {
    Ok(!run(&config.start_command, config)?.contains("already running"))
}

/// Stops the MPS control daemon.
pub fn stop(config: &MpsConfig) -> Result<(), MpsError> {
    run(&config.stop_command, config).map(|_| ())
}

/// How often the MPS control daemon is checked (and restarted if it died: rpc-servers started
/// afterwards need it, and a fatal fault under MPS can take it down).
const WATCH_PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

/// Keeps the MPS control daemon running for as long as the node manager runs; `up` says whether
/// it ran at the last check (for the metrics).
pub async fn watch(config: MpsConfig, up: std::sync::Arc<std::sync::atomic::AtomicBool>) {
    loop {
        tokio::time::sleep(WATCH_PERIOD).await;
        let checked = config.clone();
        let running = match tokio::task::spawn_blocking(move || start(&checked)).await {
            Ok(Ok(true)) => {
                tracing::warn!(pipe_directory = %config.pipe_directory, "the MPS control daemon had stopped: restarted it");
                true
            }
            Ok(Ok(false)) => true,
            Ok(Err(error)) => {
                tracing::error!(%error, "the MPS control daemon is down and could not be restarted");
                false
            }
            Err(error) => {
                tracing::error!(%error, "the MPS check did not run");
                false
            }
        };
        up.store(running, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn script(folder: &std::path::Path, name: &str, body: &str) -> String {
        let path = folder.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path.display().to_string()
    }

    #[test]
    fn start_reports_whether_it_started_a_daemon_and_failures_carry_stderr() {
        let folder = tempfile::tempdir().unwrap();
        let mut config = MpsConfig {
            start_command: script(
                folder.path(),
                "running",
                "echo \"flyt-mps-start: MPS control daemon already running ($CUDA_MPS_PIPE_DIRECTORY)\" >&2",
            ),
            stop_command: script(folder.path(), "stop", "exit 0"),
            pipe_directory: "/tmp/pipes".into(),
            ..MpsConfig::default()
        };
        assert!(!start(&config).unwrap());
        config.start_command = script(folder.path(), "started", "echo 'flyt-mps-start: MPS control daemon started' >&2");
        assert!(start(&config).unwrap());
        config.start_command = script(folder.path(), "broken", "echo 'nvidia-cuda-mps-control not found' >&2; exit 1");
        let error = start(&config).unwrap_err().to_string();
        assert!(error.contains("not found"), "{error}");
        assert!(stop(&config).is_ok());
        config.start_command = folder.path().join("missing").display().to_string();
        assert!(matches!(start(&config), Err(MpsError::Run(..))));
    }
}
