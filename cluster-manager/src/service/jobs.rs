//! Batch jobs' GPUs (Slurm's `--flyt-gpus`, `docs/design/slurm.md`): a job on a node is a
//! tenant of its own, `job-<id>@<node>`, standing where a VM's ip stands. Its requirement is
//! stored when the job starts and removed, with its allocation, when it ends; in between it
//! is an allocation like any other (listed, metered, moved), whose lease the node's client
//! manager renews. Nothing fits: refused at once, since the scheduler queues jobs itself (and
//! knows the free capacity through `flytctl slurm sync`).

use std::{sync::Arc, time::Instant};

use flyt_protocol::{
    control::cluster::{AllocateRequest, ControlError, JobAllocateRequest, JobGrant, NodeHealth, VmRequirement, job_of_tenant, job_tenant},
    jobs::MAX_JOB_GPUS,
};

use super::{Cluster, store_error};
use crate::{model::Model, store::Store};

const MIB: u64 = 1 << 20;

/// The slice size of a whole GPU for a job of `gpus` GPUs: the smallest of the `gpus` largest
/// GPUs with nothing allocated on one node (an up, undrained one; on the job's own host
/// first), so placement finds them.
pub fn whole_gpu_shape(model: &Model, gpus: u32, host_ip: &str) -> Result<(u32, u64), ControlError> {
    let mut best: Option<(bool, u32, u64)> = None;
    for (node_id, node) in &model.nodes {
        if node.record.health != NodeHealth::Up || node.record.drained {
            continue;
        }
        let mut free: Vec<(u32, u64)> = node
            .gpus
            .iter()
            .filter(|gpu| model.gpu_used(node_id, gpu.index, None).2 == 0)
            .map(|gpu| (gpu.sm_count, gpu.memory_bytes / MIB))
            .collect();
        let Some(wanted) = usize::try_from(gpus).ok().filter(|wanted| *wanted >= 1 && free.len() >= *wanted) else { continue };
        free.sort_unstable_by(|a, b| b.cmp(a));
        let chosen = &free[..wanted];
        let units = chosen.iter().map(|(units, _)| *units).min().unwrap_or(0);
        let memory = chosen.iter().map(|(_, memory)| *memory).min().unwrap_or(0);
        if units == 0 || memory == 0 {
            continue;
        }
        let candidate = (node.record.host_ip == host_ip, units, memory);
        if best.is_none_or(|current| candidate > current) {
            best = Some(candidate);
        }
    }
    best.map(|(_, units, memory)| (units, memory)).ok_or_else(|| {
        ControlError::NoCapacity(format!(
            "the job needs {gpus} whole GPU(s) of one node, and no up, undrained node has {gpus} GPU(s) with nothing allocated"
        ))
    })
}

/// `job_capacity`: how many slices of `compute_units` SMs and `memory` MiB (0 and 0: whole
/// GPUs) the jobs of client manager `vm_ip`'s node may hold now, on up, undrained nodes: what is
/// free plus what its own jobs hold (those stay counted while they run, as a kubelet expects).
/// Every node's jobs see the same free GPUs: the count is what one node could get, not a share.
pub fn job_capacity(model: &Model, vm_ip: &str, compute_units: u32, memory: u64) -> u32 {
    let own_job = |tenant: &str| job_of_tenant(tenant).is_some_and(|(_, node)| node == vm_ip);
    let mut slices: u64 = 0;
    for (node_id, node) in &model.nodes {
        if node.record.health != NodeHealth::Up || node.record.drained {
            continue;
        }
        for gpu in &node.gpus {
            let holders: Vec<_> =
                model.allocations.values().filter(|allocation| crate::model::holds_gpu(allocation, node_id, gpu.index)).collect();
            if compute_units == 0 {
                slices += u64::from(holders.iter().all(|allocation| own_job(&allocation.vm_ip)));
                continue;
            }
            let (mut used_units, mut used_memory, _) = model.gpu_used(node_id, gpu.index, None);
            for allocation in holders.iter().filter(|allocation| own_job(&allocation.vm_ip)) {
                // Two slices on a GPU both servers of a move of one of its GPUs serve.
                let slices = crate::model::slices_on(allocation, node_id, gpu.index);
                used_units = used_units.saturating_sub(allocation.compute_units * slices);
                used_memory = used_memory.saturating_sub(allocation.memory * u64::from(slices));
            }
            let by_units = gpu.sm_count.saturating_sub(used_units) / compute_units;
            let by_memory = (gpu.memory_bytes / MIB).saturating_sub(used_memory) / memory;
            slices += u64::from(by_units).min(by_memory);
        }
    }
    u32::try_from(slices).unwrap_or(u32::MAX)
}

impl<S: Store> Cluster<S> {
    /// `allocate_job`: the job's requirement (stored when new), then its allocation as for a VM.
    pub(super) async fn allocate_job(self: Arc<Self>, request: JobAllocateRequest, deadline: Instant) -> Result<JobGrant, ControlError> {
        if request.vm_ip.is_empty() || job_of_tenant(&request.vm_ip).is_some() {
            return Err(ControlError::Invalid(format!("{:?} is not a client manager's key", request.vm_ip)));
        }
        if request.gpus == 0 || request.gpus > MAX_JOB_GPUS || (request.compute_units == 0) != (request.memory == 0) {
            return Err(ControlError::Invalid(format!(
                "a job asks for 1 to {MAX_JOB_GPUS} GPUs, each with both SMs and memory (or neither: whole GPUs)"
            )));
        }
        let tenant = job_tenant(request.job, &request.vm_ip);
        let vm_lock = self.vm_lock(&tenant);
        {
            // Only while no step of the job is being placed: a second step waits, then finds it.
            let _placing = vm_lock.lock().await;
            let mut model = self.model.lock().await;
            if !model.vms.contains_key(&tenant) {
                let host_ip = model.vms.get(&request.vm_ip).map_or_else(|| request.vm_ip.clone(), |vm| vm.host_ip.clone());
                let (compute_units, memory) = if request.compute_units == 0 {
                    whole_gpu_shape(&model, request.gpus, &host_ip)?
                } else {
                    (request.compute_units, request.memory)
                };
                // On one node: Slurm placed the job on one.
                let requirement =
                    VmRequirement { vm_ip: tenant.clone(), host_ip, compute_units, memory, gpus: request.gpus, spread: false };
                // Refused now when nothing fits (no requirement left behind).
                model.placement(&requirement, &[])?;
                self.store.put_vm(&requirement).await.map_err(store_error)?;
                tracing::info!(tenant = %tenant, compute_units, memory_mib = memory, gpus = request.gpus, "job requirement set");
                model.vms.insert(tenant.clone(), requirement);
                // The job's lease starts now, so the reaper leaves the requirement alone until
                // its allocation exists.
                model.client_managers.insert(tenant.clone(), Instant::now());
            }
        }
        let placed = self.clone().allocate(AllocateRequest { vm_ip: tenant.clone(), client: request.client }, deadline).await;
        let grant = match placed {
            Ok(grant) => grant,
            Err(error) => {
                let _placing = vm_lock.lock().await;
                let mut model = self.model.lock().await;
                if model.allocation_for_vm(&tenant).is_none() && model.vms.remove(&tenant).is_some() {
                    self.store.remove_vm(&tenant).await.map_err(store_error)?;
                }
                return Err(error);
            }
        };
        let model = self.model.lock().await;
        let (Some(requirement), Some(allocation)) = (model.vms.get(&tenant), model.allocations.get(&grant.allocation_id)) else {
            return Err(ControlError::Spawn(format!("job {} ended while its GPUs were being placed", request.job)));
        };
        let mut gpus = vec![allocation.gpu];
        gpus.extend(&allocation.extra_gpus);
        Ok(JobGrant { requirement: requirement.clone(), node_id: allocation.node_id.clone(), gpus, grant })
    }

    /// Removes the requirements of jobs that ended unheard (their node or client manager died):
    /// no allocation left (released as idle or with its node), no lease, nothing under way.
    pub(super) async fn forget_ended_jobs_locked(&self, model: &mut Model) {
        let ended: Vec<String> = model
            .vms
            .keys()
            .filter(|tenant| job_of_tenant(tenant).is_some())
            .filter(|tenant| !model.client_managers.contains_key(*tenant) && model.allocation_for_vm(tenant).is_none())
            .filter(|tenant| !self.vm_busy(tenant))
            .cloned()
            .collect();
        for tenant in ended {
            match self.store.remove_vm(&tenant).await {
                Ok(_) => {
                    model.vms.remove(&tenant);
                    self.forget_vm_lock(&tenant);
                    tracing::info!(tenant = %tenant, "job requirement removed: the job's allocation and lease are gone");
                }
                Err(error) => tracing::error!(%error, tenant = %tenant, "cannot remove an ended job's requirement"),
            }
        }
    }

    /// `release_job`: the job's allocation (its server stopped) and requirement go.
    pub(super) async fn release_job(self: Arc<Self>, vm_ip: String, job: u32) -> Result<Option<String>, ControlError> {
        let tenant = job_tenant(job, &vm_ip);
        let released = {
            let vm_lock = self.vm_lock(&tenant);
            let _one_at_a_time = vm_lock.lock().await;
            let mut model = self.model.lock().await;
            let allocation = model.allocation_for_vm(&tenant).map(|allocation| allocation.id.clone());
            if let Some(id) = &allocation {
                self.release_locked(&mut model, id, "its job ended").await?;
            }
            if model.vms.remove(&tenant).is_some() {
                self.store.remove_vm(&tenant).await.map_err(store_error)?;
                tracing::info!(tenant = %tenant, "job requirement removed");
            }
            model.client_managers.remove(&tenant);
            allocation
        };
        self.forget_vm_lock(&tenant);
        Ok(released)
    }

    /// Drops an ended job's lock (one per job would pile up), unless someone holds it.
    fn forget_vm_lock(&self, tenant: &str) {
        let mut locks = self.vm_locks.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if locks.get(tenant).is_some_and(|lock| Arc::strong_count(lock) == 1) {
            locks.remove(tenant);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use flyt_protocol::control::cluster::{GpuInfo, NodeRecord};

    use super::*;
    use crate::model::NodeEntry;

    fn gpu(index: u32, sm_count: u32, memory_mib: u64) -> GpuInfo {
        GpuInfo {
            index,
            uuid: format!("GPU-{index}"),
            name: "g".into(),
            memory_bytes: memory_mib * MIB,
            sm_count,
            emulated: true,
            links: Vec::new(),
        }
    }

    fn model_with(gpus: Vec<GpuInfo>) -> Model {
        let mut model = Model::default();
        let record = NodeRecord {
            node_id: "n1".into(),
            host_ip: "10.0.0.1".into(),
            boot_id: "b".into(),
            control_address: "127.0.0.1:1".into(),
            health: NodeHealth::Up,
            drained: false,
            registered_at: 0,
        };
        model.nodes.insert("n1".into(), NodeEntry { record, gpus, last_heartbeat: Instant::now(), down_since: None });
        model
    }

    #[test]
    fn a_whole_gpu_is_the_size_of_free_gpus_of_one_node() {
        let model = model_with(vec![gpu(0, 40, 4096), gpu(1, 80, 8192)]);
        assert_eq!(whole_gpu_shape(&model, 1, "10.0.0.1").unwrap(), (80, 8192));
        assert_eq!(whole_gpu_shape(&model, 2, "10.0.0.1").unwrap(), (40, 4096));
        let error = whole_gpu_shape(&model, 3, "10.0.0.1").unwrap_err().to_string();
        assert!(error.contains("3 GPU(s) with nothing allocated"), "{error}");
    }

    #[test]
    fn job_capacity_counts_free_slices_and_the_nodes_own_jobs() {
        use flyt_protocol::control::cluster::AllocationRecord;
        let mut model = model_with(vec![gpu(0, 40, 4096), gpu(1, 80, 8192)]);
        assert_eq!(job_capacity(&model, "10.0.0.5", 0, 0), 2);
        assert_eq!(job_capacity(&model, "10.0.0.5", 20, 1024), 2 + 4);
        // Memory bounds the slices as well as SMs.
        assert_eq!(job_capacity(&model, "10.0.0.5", 10, 4096), 1 + 2);
        let held = |id: &str, tenant: &str, gpu: u32, compute_units: u32, memory: u64| AllocationRecord {
            id: id.into(),
            vm_ip: tenant.into(),
            node_id: "n1".into(),
            gpu,
            compute_units,
            memory,
            state: flyt_protocol::control::cluster::AllocationState::Running,
            ..AllocationRecord::default()
        };
        // A VM's slice on GPU 1: that GPU is no longer whole, and holds fewer slices.
        model.allocations.insert("a".into(), held("a", "10.0.0.9", 1, 40, 1024));
        assert_eq!(job_capacity(&model, "10.0.0.5", 0, 0), 1);
        assert_eq!(job_capacity(&model, "10.0.0.5", 20, 1024), 2 + 2);
        // This node's job on GPU 0 still counts for this node, not for another one.
        model.allocations.insert("b".into(), held("b", "job-100000000@10.0.0.5", 0, 40, 4096));
        assert_eq!(job_capacity(&model, "10.0.0.5", 0, 0), 1);
        assert_eq!(job_capacity(&model, "10.0.0.6", 0, 0), 0);
        assert_eq!(job_capacity(&model, "10.0.0.5", 20, 1024), 2 + 2);
        assert_eq!(job_capacity(&model, "10.0.0.6", 20, 1024), 2);
        // A drained node offers nothing.
        model.nodes.get_mut("n1").unwrap().record.drained = true;
        assert_eq!(job_capacity(&model, "10.0.0.5", 20, 1024), 0);
    }

    #[test]
    fn tenants_name_the_job_and_the_node() {
        assert_eq!(job_tenant(12, "10.0.0.5"), "job-12@10.0.0.5");
        assert_eq!(job_of_tenant("job-12@10.0.0.5"), Some((12, "10.0.0.5")));
        assert_eq!(job_of_tenant("10.0.0.5"), None);
        assert_eq!(job_of_tenant("job-x@10.0.0.5"), None);
    }
}
