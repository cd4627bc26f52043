//! `flytctl session ...`: one rpc-server's sessions through its control socket (the node
//! manager's own channel, proven with the cluster key): list them, checkpoint one, restore a
//! snapshot, and move a session from one server to another (checkpoint, restore on the target,
//! release to it; if the target cannot take it, the app goes on where it was).

use std::time::{Duration, Instant};

use clap::Subcommand;
use flyt_daemon_kit::auth::ClusterKey;
use flyt_daemon_kit::rpc::{self, Endpoint};
use flyt_protocol::control::auth::ServiceName;
use flyt_protocol::control::rpc_server::{RpcServerControlClient, SNAPSHOT_SUFFIX, SnapshotInfo};

#[derive(Subcommand)]
pub enum SessionCommand {
    /// A session token for apps that reach an rpc-server directly (`FLYT_TOKEN`), signed with
    /// the cluster key; the servers of allocation ALLOCATION (or any, for `any`) accept it.
    Token {
        #[arg(long, default_value = "any")]
        allocation: String,
        /// Hours until it expires.
        #[arg(long, default_value_t = 24)]
        hours: u64,
    },
    /// The server's live sessions.
    List {
        /// The rpc-server's control socket (`unix:/path` or `host:port`).
        #[arg(long)]
        control: String,
    },
    /// Pause a session's app, drain its GPU work and write its snapshot into DIR (on the
    /// server's host); the app stays paused until `release`.
    Checkpoint {
        #[arg(long)]
        control: String,
        session: u64,
        /// Folder for the snapshot (absolute, on the server's host).
        #[arg(long)]
        to: String,
        /// Give up (the app going on) if the app makes no CUDA call within this many ms.
        #[arg(long, default_value_t = 30_000)]
        timeout_ms: u64,
        /// End the pause at once: the app goes on here (the snapshot is a backup).
        #[arg(long, conflicts_with = "stop")]
        resume: bool,
        /// End the session here: the app reconnects to this server's address and waits until a
        /// server there has the snapshot (this one restarted with `--snapshot-dir DIR`, say).
        #[arg(long)]
        stop: bool,
    },
    /// Restore snapshot NAME from DIR into a worker that waits for its app to reconnect.
    Restore {
        #[arg(long)]
        control: String,
        #[arg(long)]
        dir: String,
        name: String,
    },
    /// End a checkpoint's pause: the app goes on here, or reconnects to `--to`.
    Release {
        #[arg(long)]
        control: String,
        session: u64,
        /// The data-plane address the app continues at (empty: this server).
        #[arg(long)]
        to: Option<String>,
    },
    /// Move a session to another rpc-server: checkpoint into DIR (a folder both servers read),
    /// restore on the target, release the app to the target's ADDRESS. If the target cannot
    /// take it, the app goes on where it was.
    Migrate {
        /// The source server's control socket.
        #[arg(long)]
        control: String,
        session: u64,
        /// The target server's control socket.
        #[arg(long)]
        to_control: String,
        /// The target's data-plane address, as the app reaches it (`host:port` or `unix:/path`).
        #[arg(long)]
        to: String,
        #[arg(long)]
        dir: String,
        #[arg(long, default_value_t = 30_000)]
        timeout_ms: u64,
        /// How device memory travels: `device` (GPU to GPU: both servers on one GPU or peers),
        /// `file` (through the snapshot), `auto` (the GPU when it can, twice, else the file).
        #[arg(long, value_enum, default_value_t = CopyVia::Auto)]
        copy: CopyVia,
    },
}

/// How a move carries device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CopyVia {
    Auto,
    Device,
    File,
}

/// Connects to an rpc-server's control socket.
async fn connect(control: &str, key: &ClusterKey, timeout: Duration) -> Result<RpcServerControlClient, String> {
    let endpoint = Endpoint::parse(control).map_err(|error| format!("--control {control}: {error}"))?;
    let stream = rpc::connect_within(&endpoint, key, ServiceName::RpcServerControl, timeout)
        .await
        .map_err(|error| format!("rpc-server control {control}: {error}"))?;
    Ok(RpcServerControlClient::new(tarpc::client::Config::default(), rpc::transport(stream)).spawn())
}

/// A context whose deadline covers long calls (a checkpoint writes gigabytes).
fn long_call() -> tarpc::context::Context {
    rpc::deadline(Duration::from_secs(1800))
}

fn failed(control: &str, error: tarpc::client::RpcError) -> String {
    format!("rpc-server control {control}: {error}")
}

pub(crate) fn print_snapshot(info: &SnapshotInfo, json: bool) {
    if json {
        println!("{}", serde_json::to_string_pretty(info).unwrap_or_default());
    } else {
        println!(
            "session {} checkpointed: snapshot {} ({} bytes, {} of device memory); drained in {:.1} ms, written in {:.1} ms",
            info.session_id,
            info.name,
            info.bytes,
            info.device_bytes,
            info.drain_us as f64 / 1e3,
            info.write_us as f64 / 1e3
        );
    }
}

/// Runs one `session` command; `Err` is the message to print.
pub async fn run(command: &SessionCommand, key: &ClusterKey, timeout: Duration, json: bool) -> Result<(), String> {
    match command {
        SessionCommand::Token { allocation, hours } => {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs());
            let claims = flyt_protocol::token::SessionClaims { allocation: allocation.clone(), expires_at: now + hours * 3600 };
            let token = flyt_protocol::token::issue(key.as_bytes(), &claims).map_err(|error| format!("no token: {error}"))?;
            println!("{token}");
            Ok(())
        }
        SessionCommand::List { control } => {
            let client = connect(control, key, timeout).await?;
            let status = client.status(rpc::deadline(timeout)).await.map_err(|error| failed(control, error))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&status.sessions).unwrap_or_default());
                return Ok(());
            }
            let mut table = comfy_table::Table::new();
            table.load_preset(comfy_table::presets::UTF8_FULL_CONDENSED).set_header(["SESSION", "PROGRAM", "PID", "HOST", "MEMORY"]);
            for session in status.sessions {
                table.add_row([
                    session.session_id.to_string(),
                    session.client.program,
                    session.client.pid.to_string(),
                    session.client.hostname,
                    session.memory_used.to_string(),
                ]);
            }
            println!("{table}");
            Ok(())
        }
        SessionCommand::Checkpoint { control, session, to, timeout_ms, resume, stop } => {
            let client = connect(control, key, timeout).await?;
            let info =
                client.checkpoint(long_call(), *session, to.clone(), *timeout_ms).await.map_err(|error| failed(control, error))??;
            print_snapshot(&info, json);
            if *resume || *stop {
                let to = stop.then(String::new);
                client.release(rpc::deadline(timeout), *session, to).await.map_err(|error| failed(control, error))??;
            }
            Ok(())
        }
        SessionCommand::Restore { control, dir, name } => {
            let client = connect(control, key, timeout).await?;
            client.restore(long_call(), dir.clone(), name.clone()).await.map_err(|error| failed(control, error))??;
            if !json {
                println!("snapshot {name} restored; it waits for its app");
            }
            Ok(())
        }
        SessionCommand::Release { control, session, to } => {
            let client = connect(control, key, timeout).await?;
            client.release(rpc::deadline(timeout), *session, to.clone()).await.map_err(|error| failed(control, error))?
        }
        SessionCommand::Migrate { control, session, to_control, to, dir, timeout_ms, copy } => {
            let started = Instant::now();
            let source = connect(control, key, timeout).await?;
            let target = connect(to_control, key, timeout).await?;
            let snapshot_file = |name: &str| std::path::Path::new(dir).join(format!("{name}{SNAPSHOT_SUFFIX}"));
            // GPU to GPU first when allowed; a device or target that cannot (another GPU, the
            // emulated device) leaves the app going on, and the file carries it instead.
            // Twice on the GPU: a target worker whose driver already holds part of the app's
            // addresses refuses, and the next worker's layout differs (the file costs seconds).
            let attempts: &[bool] = match copy {
                CopyVia::Auto => &[true, true, false],
                CopyVia::Device => &[true],
                CopyVia::File => &[false],
            };
            let mut last_error = String::new();
            let mut moved = None;
            for (attempt, &on_device) in attempts.iter().enumerate() {
                let last = attempt + 1 == attempts.len();
                let checkpoint = if on_device {
                    source.checkpoint_on_device(long_call(), *session, dir.clone(), *timeout_ms).await
                } else {
                    source.checkpoint(long_call(), *session, dir.clone(), *timeout_ms).await
                };
                let info = match checkpoint.map_err(|error| failed(control, error))? {
                    Ok(info) => info,
                    Err(reason) if !last => {
                        last_error = reason;
                        continue;
                    }
                    Err(reason) => return Err(reason),
                };
                let restore_started = Instant::now();
                let restored = target.restore(long_call(), dir.clone(), info.name.clone()).await.map_err(|error| failed(to_control, error));
                let restore_ms = restore_started.elapsed().as_secs_f64() * 1e3;
                match restored.and_then(|restored| restored) {
                    Ok(()) => {
                        moved = Some((info, restore_ms, on_device));
                        break;
                    }
                    Err(reason) => {
                        // The target cannot take it: the app goes on where it was.
                        let _ = std::fs::remove_file(snapshot_file(&info.name));
                        source.release(rpc::deadline(timeout), *session, None).await.map_err(|error| failed(control, error))??;
                        last_error = reason;
                    }
                }
            }
            let Some((info, restore_ms, on_device)) = moved else {
                return Err(format!("session {session} stays where it was: {last_error}"));
            };
            source.release(rpc::deadline(timeout), *session, Some(to.clone())).await.map_err(|error| failed(control, error))??;
            let total_ms = started.elapsed().as_secs_f64() * 1e3;
            if json {
                let report = serde_json::json!({
                    "snapshot": info, "restore_ms": restore_ms, "total_ms": total_ms, "to": to,
                    "copy": if on_device { "device" } else { "file" },
                });
                println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
            } else {
                println!(
                    "session {session} moved to {to}: {} bytes of device memory ({}); drain {:.1} ms, snapshot {:.1} ms, restore {restore_ms:.1} ms, total {total_ms:.1} ms",
                    info.device_bytes,
                    if on_device { "GPU to GPU" } else { "through the snapshot file" },
                    info.drain_us as f64 / 1e3,
                    info.write_us as f64 / 1e3
                );
            }
            Ok(())
        }
    }
}
