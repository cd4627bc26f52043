//! What the plugin tells the kubelet, without I/O: device ids, the advertised list, the
//! preferred allocation, and a container's environment, mounts and annotations.
//!
//! A device is one slice the node's jobs could get (`flyt-gpu-<n>`); it is not bound to a
//! physical GPU until a container gets it: Flyt's GPUs are network-attached, and the cluster
//! manager places each container's allocation (a several-GPU one on NVLink peers first).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use flyt_protocol::jobs::JobReply;

use crate::api::deviceplugin::{ContainerAllocateResponse, Mount};

/// The resource pods ask for.
pub const RESOURCE: &str = "flyt.dev/gpu";
/// Device ids are this and a number.
pub const DEVICE_PREFIX: &str = "flyt-gpu-";
/// The most devices one node advertises.
pub const MAX_DEVICES: u32 = 1024;
/// A container's job number is this plus its lowest device number (Slurm's job ids never
/// reach it); the kubelet never gives one device to two running containers, so live containers
/// never share a job.
pub const JOB_BASE: u32 = flyt_protocol::jobs::CONTAINER_JOB_BASE;
/// Where the cluster's CA goes in the container when the cluster runs TLS.
pub const CONTAINER_CA: &str = "/etc/flyt/ca.pem";

/// The id of device `index`.
pub fn device_id(index: u32) -> String {
    format!("{DEVICE_PREFIX}{index}")
}

/// The number of a device id this plugin advertises; `None` for anything else.
pub fn device_index(id: &str) -> Option<u32> {
    let digits = id.strip_prefix(DEVICE_PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|byte| byte.is_ascii_digit()) || (digits.len() > 1 && digits.starts_with('0')) {
        return None;
    }
    digits.parse().ok().filter(|index| *index < MAX_DEVICES)
}

/// The job number of a container holding `devices` (not empty).
pub fn job_of(devices: &BTreeSet<u32>) -> Option<u32> {
    devices.first().map(|lowest| JOB_BASE + lowest)
}

/// The device numbers to advertise when the node's jobs could get `slices` slices and
/// containers hold `held`: every held one (a running container's devices stay listed), then
/// the lowest free numbers, `slices` in all (never fewer than the held ones).
pub fn advertised(slices: u32, held: &BTreeSet<u32>) -> Vec<u32> {
    let total = usize::try_from(slices.min(MAX_DEVICES)).unwrap_or(0).max(held.len());
    let mut list: BTreeSet<u32> = held.clone();
    let mut next = 0;
    while list.len() < total && next < MAX_DEVICES {
        list.insert(next);
        next += 1;
    }
    list.into_iter().collect()
}

/// The preferred devices for one container: those it must have, then the lowest numbers
/// available, `size` in all. Low numbers first keep the list compact: when the cluster's
/// capacity drops, the highest free numbers are the ones that leave it.
pub fn preferred(available: &[String], must_include: &[String], size: usize) -> Vec<String> {
    let mut chosen: Vec<String> = Vec::new();
    for id in must_include {
        if !chosen.contains(id) {
            chosen.push(id.clone());
        }
    }
    let mut rest: Vec<(u32, &String)> =
        available.iter().filter(|id| !chosen.contains(id)).filter_map(|id| device_index(id).map(|index| (index, id))).collect();
    rest.sort_unstable();
    for (_, id) in rest {
        if chosen.len() >= size {
            break;
        }
        chosen.push(id.clone());
    }
    chosen
}

/// Where Flyt's files are on the node and in the container.
#[derive(Clone, Debug)]
pub struct Layout {
    /// Flyt's library folder on the node (`libcuda.so.1`, `libcudart.so.13`, `libnvidia-ml.so.1`).
    pub host_lib_dir: String,
    /// Where it is mounted in the container (read-only).
    pub container_lib_dir: String,
}

/// The container's part of `Allocate`'s answer for its job's grant: what
/// `flyt env --server ADDRESS --token TOKEN` prints (Flyt's libraries on the library path,
/// Triton pointed at them, the server and token, the CA in a TLS cluster), the library folder
/// (and the CA) mounted read-only, and annotations naming the allocation.
pub fn container_response(layout: &Layout, reply: &JobReply) -> Option<ContainerAllocateResponse> {
    let JobReply::Granted { allocation_id, tenant, address, token, tls_ca, node_id, gpus, compute_units, memory_mib } = reply else {
        return None;
    };
    let mut envs = BTreeMap::from([
        ("LD_LIBRARY_PATH".to_string(), layout.container_lib_dir.clone()),
        ("TRITON_LIBCUDA_PATH".to_string(), layout.container_lib_dir.clone()),
        ("FLYT_SERVER".to_string(), address.clone()),
        ("FLYT_TOKEN".to_string(), token.clone()),
    ]);
    let mut mounts =
        vec![Mount { container_path: layout.container_lib_dir.clone(), host_path: layout.host_lib_dir.clone(), read_only: true }];
    if !tls_ca.is_empty() {
        envs.insert("FLYT_TLS_CA".into(), CONTAINER_CA.into());
        mounts.push(Mount { container_path: CONTAINER_CA.into(), host_path: tls_ca.clone(), read_only: true });
    }
    let gpu_list: Vec<String> = gpus.iter().map(u32::to_string).collect();
    let annotations = BTreeMap::from([
        ("flyt.dev/allocation".to_string(), allocation_id.clone()),
        ("flyt.dev/tenant".to_string(), tenant.clone()),
        (
            "flyt.dev/gpus".to_string(),
            format!("{node_id} GPU {}: {} GPU(s) of {compute_units} SMs and {memory_mib} MiB", gpu_list.join(","), gpus.len()),
        ),
    ]);
    Some(ContainerAllocateResponse {
        envs: envs.into_iter().collect(),
        mounts,
        devices: Vec::new(),
        annotations: annotations.into_iter().collect(),
        cdi_devices: Vec::new(),
    })
}

/// Whether `path` is a folder holding Flyt's driver library.
pub fn is_lib_dir(path: &Path) -> bool {
    path.join("libcuda.so.1").exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_ids_round_trip_and_strangers_are_refused() {
        assert_eq!(device_id(3), "flyt-gpu-3");
        assert_eq!(device_index("flyt-gpu-3"), Some(3));
        assert_eq!(device_index("flyt-gpu-0"), Some(0));
        for stranger in ["flyt-gpu-", "flyt-gpu-03", "flyt-gpu-x", "gpu-1", "flyt-gpu-1024", "flyt-gpu-+1", "flyt-gpu-99999999999"] {
            assert_eq!(device_index(stranger), None, "{stranger}");
        }
        assert_eq!(job_of(&BTreeSet::from([4, 2])), Some(JOB_BASE + 2));
        assert_eq!(job_of(&BTreeSet::new()), None);
    }

    #[test]
    fn the_list_keeps_held_devices_and_fills_with_the_lowest_free_ones() {
        assert_eq!(advertised(3, &BTreeSet::new()), vec![0, 1, 2]);
        assert_eq!(advertised(3, &BTreeSet::from([5])), vec![0, 1, 5]);
        // Capacity below what containers hold: the held ones stay.
        assert_eq!(advertised(1, &BTreeSet::from([2, 7])), vec![2, 7]);
        assert_eq!(advertised(0, &BTreeSet::new()), Vec::<u32>::new());
        assert_eq!(advertised(u32::MAX, &BTreeSet::new()).len(), MAX_DEVICES as usize);
    }

    #[test]
    fn the_preference_is_what_must_be_then_the_lowest_numbers() {
        let ids = |list: &[u32]| list.iter().map(|index| device_id(*index)).collect::<Vec<_>>();
        assert_eq!(preferred(&ids(&[3, 1, 10, 2]), &[], 2), ids(&[1, 2]));
        assert_eq!(preferred(&ids(&[3, 1, 10, 2]), &ids(&[10]), 2), ids(&[10, 1]));
        assert_eq!(preferred(&ids(&[3, 1]), &[], 5), ids(&[1, 3]));
        // Ids this plugin never made are not preferred.
        assert_eq!(preferred(&["other".to_string(), device_id(4)], &[], 2), ids(&[4]));
    }

    #[test]
    fn a_grant_becomes_the_environment_mounts_and_annotations() {
        let layout = Layout { host_lib_dir: "/opt/flyt/lib".into(), container_lib_dir: "/flyt/lib".into() };
        let mut reply = JobReply::Granted {
            allocation_id: "a1".into(),
            tenant: "job-100000002@10.0.0.5".into(),
            address: "10.0.0.9:7000".into(),
            token: "tok".into(),
            tls_ca: String::new(),
            node_id: "node-a".into(),
            gpus: vec![0, 1],
            compute_units: 40,
            memory_mib: 4096,
        };
        let response = container_response(&layout, &reply).unwrap();
        assert_eq!(response.envs["LD_LIBRARY_PATH"], "/flyt/lib");
        assert_eq!(response.envs["TRITON_LIBCUDA_PATH"], "/flyt/lib");
        assert_eq!(response.envs["FLYT_SERVER"], "10.0.0.9:7000");
        assert_eq!(response.envs["FLYT_TOKEN"], "tok");
        assert!(!response.envs.contains_key("FLYT_TLS_CA"));
        assert_eq!(response.mounts, vec![Mount { container_path: "/flyt/lib".into(), host_path: "/opt/flyt/lib".into(), read_only: true }]);
        assert_eq!(response.annotations["flyt.dev/allocation"], "a1");
        assert_eq!(response.annotations["flyt.dev/gpus"], "node-a GPU 0,1: 2 GPU(s) of 40 SMs and 4096 MiB");
        if let JobReply::Granted { tls_ca, .. } = &mut reply {
            *tls_ca = "/etc/flyt/tls/ca.pem".into();
        }
        let response = container_response(&layout, &reply).unwrap();
        assert_eq!(response.envs["FLYT_TLS_CA"], CONTAINER_CA);
        assert!(response.mounts.iter().any(|mount| mount.host_path == "/etc/flyt/tls/ca.pem" && mount.read_only));
        assert!(container_response(&layout, &JobReply::Refused { reason: "no".into() }).is_none());
    }
}
