//! `flytctl migrate`, `flytctl checkpoint` and `flytctl restart-server`: an allocation's apps
//! moved to another node, checkpointed where they are, or carried over to a fresh rpc-server. The cluster manager drives the node managers; flytctl asks
//! and prints what was done.

use std::time::Duration;

use flyt_protocol::control::cluster::{AfterCheckpoint, CheckpointReport, MoveReport, RestartReport};

use crate::sessions::print_snapshot;

/// How long flytctl waits for a move or a checkpoint: device memory by the tens of GiB may have
/// to be written and copied.
pub const LONG_CALL: Duration = Duration::from_secs(1800);

/// Where `--to` of `migrate` points: a node, and a GPU there or the one placement picks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Destination {
    pub node: String,
    pub gpu: Option<u32>,
}

/// Parses `NODE` or `NODE/GPU`.
pub fn parse_destination(text: &str) -> Result<Destination, String> {
    let (node, gpu) = match text.rsplit_once('/') {
        Some((node, gpu)) => {
            let gpu = gpu.parse::<u32>().map_err(|_| format!("`{text}`: the GPU after `/` must be a number (NODE or NODE/GPU)"))?;
            (node, Some(gpu))
        }
        None => (text, None),
    };
    if node.is_empty() {
        return Err(format!("`{text}`: name a node (NODE or NODE/GPU; `flytctl list-servernodes` shows them)"));
    }
    Ok(Destination { node: node.to_string(), gpu })
}

fn milliseconds(micros: u64) -> f64 {
    micros as f64 / 1e3
}

/// One line per moved session, one for the allocation, and one per session left behind.
pub fn print_move(report: &MoveReport) {
    for session in &report.sessions {
        let snapshot = &session.snapshot;
        let copy = if session.gpu_to_gpu {
            format!("{} of device memory GPU to GPU in the restore", snapshot.device_bytes)
        } else {
            format!("copy {:.1} ms", milliseconds(session.transfer_us))
        };
        println!(
            "session {} moved to {}: snapshot {} bytes ({} of device memory); drain {:.1} ms, write {:.1} ms, {copy}, restore {:.1} ms",
            snapshot.session_id,
            session.to,
            snapshot.bytes,
            snapshot.device_bytes,
            milliseconds(snapshot.drain_us),
            milliseconds(snapshot.write_us),
            milliseconds(session.restore_us)
        );
    }
    for reason in &report.left_behind {
        println!("left behind (ended with the old server): {reason}");
    }
    let allocation = &report.allocation;
    let sessions = apps(report.sessions.len());
    // An allocation of several GPUs moved whole: its new server's GPUs, the first first.
    let to_gpus: Vec<String> =
        std::iter::once(allocation.gpu).chain(allocation.extra_gpus.iter().copied()).map(|gpu| gpu.to_string()).collect();
    let from_gpus: Vec<String> =
        std::iter::once(report.from_gpu).chain(report.from_extra_gpus.iter().copied()).map(|gpu| gpu.to_string()).collect();
    println!(
        "allocation {} moved from {}/{} to {}/{} with {sessions} in {:.1} ms; it is served at {}",
        allocation.id,
        report.from_node,
        from_gpus.join(","),
        allocation.node_id,
        to_gpus.join(","),
        milliseconds(report.total_us),
        allocation.addresses.join(" ")
    );
}

fn apps(count: usize) -> String {
    match count {
        0 => "no running app".to_string(),
        1 => "1 app".to_string(),
        count => format!("{count} apps"),
    }
}

/// A summary line, then one line per session carried over.
pub fn print_restart(report: &RestartReport) {
    println!(
        "allocation {}: rpc-server restarted (pid {} -> {}) with {} carried over in {:.1} ms; it is served at {}",
        report.allocation_id,
        report.old_pid,
        report.new_pid,
        apps(report.sessions.len()),
        milliseconds(report.total_us),
        report.addresses.join(" ")
    );
    for snapshot in &report.sessions {
        println!(
            "session {} carried over: snapshot {} ({} bytes, {} of device memory); drain {:.1} ms, write {:.1} ms",
            snapshot.session_id,
            snapshot.name,
            snapshot.bytes,
            snapshot.device_bytes,
            milliseconds(snapshot.drain_us),
            milliseconds(snapshot.write_us)
        );
    }
}

/// One line per snapshot and per session that could not be checkpointed, then a summary.
pub fn print_checkpoint(report: &CheckpointReport, after: AfterCheckpoint) {
    for snapshot in &report.snapshots {
        print_snapshot(snapshot, false);
    }
    for (session, reason) in &report.failed {
        println!("session {session} not checkpointed (its app goes on): {reason}");
    }
    let then = match after {
        AfterCheckpoint::Resume => "the apps go on",
        AfterCheckpoint::Stop => {
            "their sessions ended: each app waits at its server's address until a server there restores its snapshot (flytctl session restore)"
        }
    };
    println!("allocation {}: {} snapshot(s) in {} on {}; {then}", report.allocation_id, report.snapshots.len(), report.dir, report.node_id);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_are_a_node_and_maybe_a_gpu() {
        assert_eq!(parse_destination("node-b"), Ok(Destination { node: "node-b".into(), gpu: None }));
        assert_eq!(parse_destination("gpu-host.example/3"), Ok(Destination { node: "gpu-host.example".into(), gpu: Some(3) }));
        assert!(parse_destination("node-b/x").unwrap_err().contains("must be a number"));
        assert!(parse_destination("/1").unwrap_err().contains("name a node"));
    }
}
