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

fn run(command: &str, config: &MpsConfig) -> Result<(), MpsError> {
    let output = Command::new(command).envs(environment(config)).output().map_err(|error| MpsError::Run(command.to_string(), error))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
        return Err(MpsError::Failed(command.to_string(), output.status, stderr));
    }
    Ok(())
}

/// Starts the MPS control daemon (the script is idempotent: a running daemon is kept).
pub fn start(config: &MpsConfig) -> Result<(), MpsError> {
    run(&config.start_command, config)
}

/// Stops the MPS control daemon.
pub fn stop(config: &MpsConfig) -> Result<(), MpsError> {
    run(&config.stop_command, config)
}
