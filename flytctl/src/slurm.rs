//! `flytctl slurm sync`: Slurm's `flyt` licenses kept in step with the cluster manager, so jobs
//! asking for `--flyt-gpus=N` (which the cluster's cli_filter turns into `--licenses=flyt:N`)
//! queue while Flyt has no GPU for them (`docs/design/slurm.md`).
//!
//! One license is one GPU. The count is the GPUs of up, undrained nodes that no VM's
//! allocation holds: free ones and the ones Slurm's own jobs hold (Slurm counts those as its
//! licenses in use). Slurm 22.05 keeps cluster licenses in slurm.conf (without slurmdbd), so a
//! changed count rewrites its `Licenses=` line and runs `scontrol reconfigure`.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use flyt_protocol::control::cluster::{AllocationRecord, NodeHealth, NodeView, job_of_tenant};

/// GPUs Slurm's jobs may have: on up, undrained nodes, held by no allocation but jobs'.
pub fn slurm_gpus(nodes: &[NodeView], allocations: &[AllocationRecord]) -> u32 {
    let mut held_by_others: BTreeSet<(&str, u32)> = BTreeSet::new();
    for allocation in allocations.iter().filter(|allocation| job_of_tenant(&allocation.vm_ip).is_none()) {
        held_by_others.insert((&allocation.node_id, allocation.gpu));
        for gpu in &allocation.extra_gpus {
            held_by_others.insert((&allocation.node_id, *gpu));
        }
        // A spread allocation's GPUs on its further nodes.
        for share in &allocation.further {
            for gpu in std::iter::once(&share.gpu).chain(&share.extra_gpus) {
                held_by_others.insert((&share.node_id, *gpu));
            }
        }
        if let Some(pending) = &allocation.pending_move {
            held_by_others.insert((&pending.from_node, pending.from_gpu));
            held_by_others.insert((&pending.to_node, pending.to_gpu));
        }
    }
    let usable = nodes
        .iter()
        .filter(|view| view.node.health == NodeHealth::Up && !view.node.drained)
        .flat_map(|view| view.gpus.iter().map(move |usage| (view.node.node_id.as_str(), usage.gpu.index)))
        .filter(|gpu| !held_by_others.contains(gpu))
        .count();
    u32::try_from(usable).unwrap_or(u32::MAX)
}

/// `text` (slurm.conf) with license `name` set to `count` on its `Licenses=` line (the other
/// licenses kept), or such a line added; and the count it had.
pub fn set_license(text: &str, name: &str, count: u32) -> (String, Option<u32>) {
    let mut previous = None;
    let mut found = false;
    let mut lines: Vec<String> = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        let is_licenses = trimmed.len() > 9 && trimmed[..8].eq_ignore_ascii_case("licenses") && trimmed[8..].trim_start().starts_with('=');
        if !is_licenses || found {
            lines.push(line.to_string());
            continue;
        }
        found = true;
        let value = trimmed[8..].trim_start()[1..].trim();
        let mut entries: Vec<String> = Vec::new();
        for entry in value.split(',').map(str::trim).filter(|entry| !entry.is_empty()) {
            let (entry_name, entry_count) = entry.split_once([':', '=']).unwrap_or((entry, "1"));
            if entry_name == name {
                previous = entry_count.parse().ok();
            } else {
                entries.push(entry.to_string());
            }
        }
        entries.push(format!("{name}:{count}"));
        lines.push(format!("Licenses={}", entries.join(",")));
    }
    if !found {
        lines.push(format!("Licenses={name}:{count}"));
    }
    let mut out = lines.join("\n");
    out.push('\n');
    (out, previous)
}

/// Writes `text` to `path` whole (a file beside it renamed over it), keeping its permissions.
fn replace_file(path: &Path, text: &str) -> std::io::Result<()> {
    let temporary = path.with_extension("flyt-sync");
    std::fs::write(&temporary, text)?;
    if let Ok(metadata) = std::fs::metadata(path) {
        std::fs::set_permissions(&temporary, metadata.permissions())?;
    }
    std::fs::rename(&temporary, path)
}

/// Runs scontrol with `args` (SLURM_CONF naming `slurm_conf`), for at most `limit`.
fn scontrol(scontrol: &str, slurm_conf: &Path, args: &[&str], limit: Duration) -> Result<(), String> {
    let mut child = Command::new(scontrol)
        .args(args)
        .env("SLURM_CONF", slurm_conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| format!("cannot run {scontrol}: {error}"))?;
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => {
                let output =
                    child.wait_with_output().map(|output| String::from_utf8_lossy(&output.stderr).into_owned()).unwrap_or_default();
                return Err(format!("{scontrol} {} failed ({status}): {}", args.join(" "), output.trim()));
            }
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{scontrol} {} gave no answer within {} s", args.join(" "), limit.as_secs()));
            }
            Err(error) => return Err(error.to_string()),
        }
    }
}

/// Where the sync writes, and how it tells Slurm.
pub struct Target {
    pub slurm_conf: PathBuf,
    pub license: String,
    pub scontrol: String,
    pub dry_run: bool,
}

/// One sync: the count into slurm.conf and Slurm, when it changed; a line saying what it did.
pub fn apply(target: &Target, count: u32) -> Result<String, String> {
    let conf = &target.slurm_conf;
    let text = std::fs::read_to_string(conf).map_err(|error| format!("cannot read {} (--slurm-conf): {error}", conf.display()))?;
    let (updated, previous) = set_license(&text, &target.license, count);
    let name = &target.license;
    if previous == Some(count) {
        return Ok(format!("{name} licenses: {count} (unchanged)"));
    }
    let was = previous.map_or_else(|| "none".to_string(), |previous| previous.to_string());
    if target.dry_run {
        return Ok(format!("{name} licenses: {count} (was {was}; --dry-run: nothing written)"));
    }
    replace_file(conf, &updated).map_err(|error| format!("cannot write {}: {error}", conf.display()))?;
    scontrol(&target.scontrol, conf, &["reconfigure"], Duration::from_secs(30))?;
    Ok(format!("{name} licenses: {count} (was {was}); {} updated and Slurm reconfigured", conf.display()))
}

#[cfg(test)]
mod tests {
    use flyt_protocol::control::cluster::{AllocationState, GpuInfo, GpuUsage, NodeRecord};

    use super::*;

    fn node(id: &str, gpus: u32, health: NodeHealth, drained: bool) -> NodeView {
        NodeView {
            node: NodeRecord {
                node_id: id.into(),
                host_ip: "10.0.0.1".into(),
                boot_id: "b".into(),
                control_address: "127.0.0.1:1".into(),
                health,
                drained,
                registered_at: 0,
            },
            gpus: (0..gpus)
                .map(|index| GpuUsage {
                    gpu: GpuInfo {
                        index,
                        uuid: format!("GPU-{index}"),
                        name: "g".into(),
                        memory_bytes: 1 << 30,
                        sm_count: 40,
                        emulated: true,
                        links: Vec::new(),
                    },
                    allocated_compute_units: 0,
                    allocated_memory: 0,
                    allocations: 0,
                })
                .collect(),
            last_heartbeat_ms: 0,
        }
    }

    fn allocation(tenant: &str, node_id: &str, gpu: u32, extra_gpus: Vec<u32>) -> AllocationRecord {
        AllocationRecord {
            id: format!("alloc-{tenant}"),
            vm_ip: tenant.into(),
            node_id: node_id.into(),
            gpu,
            extra_gpus,
            compute_units: 10,
            memory: 100,
            sm_percentage: 25,
            state: AllocationState::Running,
            pid: 1,
            ..AllocationRecord::default()
        }
    }

    /// Free GPUs and jobs' GPUs count; VMs' GPUs, down and drained nodes do not.
    #[test]
    fn slurm_may_have_the_gpus_no_vm_holds() {
        let nodes = [node("a", 4, NodeHealth::Up, false), node("b", 2, NodeHealth::Down, false), node("c", 2, NodeHealth::Up, true)];
        assert_eq!(slurm_gpus(&nodes, &[]), 4);
        let allocations = [
            allocation("job-7@10.0.0.9", "a", 0, Vec::new()),
            allocation("10.0.0.5", "a", 1, vec![2]),
            allocation("10.0.0.6", "a", 1, Vec::new()),
        ];
        assert_eq!(slurm_gpus(&nodes, &allocations), 2);
        // A spread allocation holds its further nodes' GPUs too.
        let nodes = [node("a", 2, NodeHealth::Up, false), node("d", 2, NodeHealth::Up, false)];
        let mut spread = allocation("10.0.0.7", "a", 0, Vec::new());
        spread.further = vec![flyt_protocol::control::cluster::NodeShare {
            node_id: "d".into(),
            gpu: 1,
            extra_gpus: Vec::new(),
            sm_percentage: 25,
            address_window: 1,
            addresses: Vec::new(),
            pid: 0,
            sessions: 0,
            metrics: None,
        }];
        assert_eq!(slurm_gpus(&nodes, &[spread]), 2);
    }

    #[test]
    fn the_flyt_license_is_set_and_others_are_kept() {
        let (text, previous) = set_license("ClusterName=c\nLicenses=matlab:3,flyt:2\nNodeName=n\n", "flyt", 5);
        assert_eq!(text, "ClusterName=c\nLicenses=matlab:3,flyt:5\nNodeName=n\n");
        assert_eq!(previous, Some(2));
        let (text, previous) = set_license("ClusterName=c\n", "flyt", 0);
        assert_eq!(text, "ClusterName=c\nLicenses=flyt:0\n");
        assert_eq!(previous, None);
        let (text, previous) = set_license("licenses = matlab\n", "flyt", 1);
        assert_eq!(text, "Licenses=matlab,flyt:1\n");
        assert_eq!(previous, None);
        // A commented line is not the setting.
        let (text, _) = set_license("#Licenses=flyt:9\n", "flyt", 1);
        assert_eq!(text, "#Licenses=flyt:9\nLicenses=flyt:1\n");
    }
}
