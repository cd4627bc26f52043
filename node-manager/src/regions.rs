//! The ivshmem regions of this host's VMs, declared in the node manager's config: each is made
//! at start-up if it is missing, so it exists before its VM boots (QEMU maps the file when the
//! VM starts), and kept if it exists, so VMs that have it mapped keep working across restarts.

use std::path::Path;

use crate::config::{IvshmemRegion, RpcServerConfig};

/// Makes or keeps every declared region; a line per region for the log. An error names the
/// region and why (a bad size, a folder not in shared memory, a region that exists with another
/// geometry): the node manager does not start on a config it cannot honour.
pub fn prepare(config: &RpcServerConfig) -> Result<Vec<String>, String> {
    if config.ivshmem_regions.is_empty() {
        return Ok(Vec::new());
    }
    if config.ivshmem_dir.is_empty() {
        return Err("rpc_server.ivshmem_regions needs rpc_server.ivshmem_dir (where the regions live)".into());
    }
    let dir = Path::new(&config.ivshmem_dir);
    config.ivshmem_regions.iter().map(|region| prepare_one(dir, region)).collect()
}

fn prepare_one(dir: &Path, region: &IvshmemRegion) -> Result<String, String> {
    let IvshmemRegion { name, size_mib, sessions } = region;
    let size = size_mib.checked_mul(1 << 20).filter(|size| size.is_power_of_two());
    let size = size.ok_or_else(|| format!("ivshmem region {name}: size_mib = {size_mib} is not a power of two (a PCI BAR is)"))?;
    let (path, made) = flyt_ring::region::ensure(dir, name, size, *sessions).map_err(|error| format!("ivshmem region {name}: {error}"))?;
    Ok(format!(
        "ivshmem region {name} {} ({size_mib} MiB, {sessions} sessions); QEMU options: {}",
        if made { "made" } else { "kept" },
        flyt_ring::region::qemu_options(&path, name, size)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &Path, regions: Vec<IvshmemRegion>) -> RpcServerConfig {
        RpcServerConfig { ivshmem_dir: dir.display().to_string(), ivshmem_regions: regions, ..RpcServerConfig::default() }
    }

    fn region(name: &str, size_mib: u64, sessions: u32) -> IvshmemRegion {
        IvshmemRegion { name: name.into(), size_mib, sessions }
    }

    #[test]
    fn declared_regions_are_made_once_and_kept_across_restarts() {
        // In shared memory, where the GPU driver can pin the regions.
        let dir = std::path::PathBuf::from(format!("/dev/shm/node-manager-regions-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let declared = config(&dir, vec![region("vm-a", 256, 2), region("vm-b", 512, 4)]);
        let lines = prepare(&declared).unwrap();
        assert!(lines[0].starts_with("ivshmem region vm-a made (256 MiB, 2 sessions)"), "{lines:?}");
        assert!(lines[1].contains("-device ivshmem-plain,memdev=flyt-vm-b"), "{lines:?}");
        let token = std::fs::read_to_string(dir.join("vm-a.token")).unwrap();

        // The next start keeps them, tokens and all.
        let lines = prepare(&declared).unwrap();
        assert!(lines.iter().all(|line| line.contains(" kept ")), "{lines:?}");
        assert_eq!(std::fs::read_to_string(dir.join("vm-a.token")).unwrap(), token);

        // A region redeclared with another geometry, a size that is no power of two, or regions
        // with no folder: clear errors, nothing changed.
        let error = prepare(&config(&dir, vec![region("vm-a", 256, 1)])).unwrap_err();
        assert!(error.contains("vm-a") && error.contains("while its VM is stopped"), "{error}");
        let error = prepare(&config(&dir, vec![region("vm-c", 300, 1)])).unwrap_err();
        assert!(error.contains("not a power of two"), "{error}");
        assert!(!dir.join("vm-c").exists());
        let no_dir = RpcServerConfig { ivshmem_regions: vec![region("vm-d", 256, 1)], ..RpcServerConfig::default() };
        assert!(prepare(&no_dir).unwrap_err().contains("needs rpc_server.ivshmem_dir"));
        assert_eq!(std::fs::read_to_string(dir.join("vm-a.token")).unwrap(), token);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
