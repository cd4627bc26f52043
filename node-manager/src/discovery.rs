//! Which GPUs this node offers: the CUDA driver's, or the config's emulated ones.

use flyt_protocol::control::cluster::{GpuInfo, GpuLink, GpuLinkKind};

use crate::{config::NodeManagerConfig, cuda_probe, servers::DeviceKind};

/// Why discovery failed.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum DiscoveryError {
    /// `device = "cuda"` but the CUDA driver cannot be used: {0}
    DriverUnavailable(cuda_probe::ProbeError),
    /// `device = "cuda"` but the driver sees no GPU
    NoGpu,
    /// `device = "emulated"` but `emulated_gpus` is empty
    NoEmulatedGpu,
    /// unknown device `{0}`: use `auto`, `cuda` or `emulated`
    UnknownDevice(String),
}

fn emulated(config: &NodeManagerConfig) -> Result<Vec<GpuInfo>, DiscoveryError> {
    if config.emulated_gpus.is_empty() {
        return Err(DiscoveryError::NoEmulatedGpu);
    }
    Ok(config
        .emulated_gpus
        .iter()
        .enumerate()
        .map(|(index, gpu)| GpuInfo {
            index: u32::try_from(index).unwrap_or(u32::MAX),
            uuid: format!("EMU-{}-{index}", config.node_id),
            name: gpu.name.clone(),
            memory_bytes: gpu.memory_mib.saturating_mul(1 << 20),
            sm_count: gpu.sm_count,
            emulated: true,
            links: gpu.nvlink.iter().map(|to| GpuLink { to: *to, kind: GpuLinkKind::NvLink }).collect(),
        })
        .collect())
}

/// The GPUs to offer and how their servers run.
pub fn discover(config: &NodeManagerConfig) -> Result<(DeviceKind, Vec<GpuInfo>), DiscoveryError> {
    match config.device.as_str() {
        "emulated" => Ok((DeviceKind::Emulated, emulated(config)?)),
        "cuda" => match cuda_probe::probe(&config.cuda_library) {
            Ok(gpus) if gpus.is_empty() => Err(DiscoveryError::NoGpu),
            Ok(gpus) => Ok((DeviceKind::Cuda, gpus)),
            Err(error) => Err(DiscoveryError::DriverUnavailable(error)),
        },
        "auto" => match cuda_probe::probe(&config.cuda_library) {
            Ok(gpus) if !gpus.is_empty() => Ok((DeviceKind::Cuda, gpus)),
            Ok(_) => {
                tracing::warn!("the CUDA driver sees no GPU: offering the emulated GPUs of the config (no kernels run)");
                Ok((DeviceKind::Emulated, emulated(config)?))
            }
            Err(error) => {
                tracing::warn!(%error, "no usable CUDA driver on this host: offering the emulated GPUs of the config (no kernels run)");
                Ok((DeviceKind::Emulated, emulated(config)?))
            }
        },
        other => Err(DiscoveryError::UnknownDevice(other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EmulatedGpu;

    #[test]
    fn emulated_gpus_report_the_nvlinks_their_config_names() {
        let gpu = |nvlink: Vec<u32>| EmulatedGpu { name: "E".into(), memory_mib: 1024, sm_count: 8, nvlink };
        let config = NodeManagerConfig {
            device: "emulated".into(),
            emulated_gpus: vec![gpu(vec![1]), gpu(vec![0]), gpu(Vec::new())],
            ..NodeManagerConfig::default()
        };
        let (_, gpus) = discover(&config).unwrap();
        assert_eq!(gpus[0].links, vec![GpuLink { to: 1, kind: GpuLinkKind::NvLink }]);
        assert_eq!(gpus[1].links, vec![GpuLink { to: 0, kind: GpuLinkKind::NvLink }]);
        assert!(gpus[2].links.is_empty());
    }
}
