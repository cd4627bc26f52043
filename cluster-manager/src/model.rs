//! The cluster as the cluster manager sees it, and placement. Pure data: no I/O here, so the
//! rules are unit-tested directly.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use flyt_protocol::{
    control::cluster::{
        AllocationRecord, AllocationState, ControlError, GpuInfo, GpuLinkKind, GpuUsage, MAX_ADDRESS_WINDOW, NodeHealth, NodeRecord,
        NodeShare, NodeView, VmMode, VmRequirement,
    },
    handshake::ClientIdentity,
};

use crate::store::StoredState;

const MIB: u64 = 1 << 20;

/// How well a set of GPUs is joined, better first: its worst pair's path, then the sum over its
/// pairs (0 NVLink, 1 PCIe peer to peer, 2 through host memory).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct SetRank {
    worst: u32,
    total: u32,
}

/// One node's share of a placement: the GPUs its server serves, in order (`--gpu` first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    pub node_id: String,
    pub gpus: Vec<u32>,
}

/// A registered node.
#[derive(Clone, Debug)]
pub struct NodeEntry {
    pub record: NodeRecord,
    pub gpus: Vec<GpuInfo>,
    pub last_heartbeat: Instant,
    /// Since when it is down (its allocations are released a grace period later).
    pub down_since: Option<Instant>,
}

/// Everything the cluster manager knows.
#[derive(Debug, Default)]
pub struct Model {
    pub vms: BTreeMap<String, VmRequirement>,
    pub nodes: BTreeMap<String, NodeEntry>,
    pub allocations: BTreeMap<String, AllocationRecord>,
    /// Client managers (by VM ip) and their last heartbeat.
    pub client_managers: BTreeMap<String, Instant>,
    /// Running allocations missing from their node's consecutive reports, and how many times.
    pub missing_reports: BTreeMap<String, u32>,
    /// When the lease checks last ran: a long gap means this process itself was stalled.
    pub last_reap: Option<Instant>,
    /// When leases last restarted (this process started, or woke from a stall): until client
    /// managers have had a lease's time to report, nothing is released as idle.
    pub leases_restarted: Option<Instant>,
    /// When each allocation was last handed to a client manager (not stored).
    pub granted: BTreeMap<String, Instant>,
}

/// The MPS active-thread percentage that gives `compute_units` of `sm_count` SMs (rounded up,
/// so the slice never gets fewer SMs than asked).
pub fn sm_percentage(compute_units: u32, sm_count: u32) -> u32 {
    if sm_count == 0 {
        return 100;
    }
    (u64::from(compute_units) * 100).div_ceil(u64::from(sm_count)).clamp(1, 100) as u32
}

/// Whether `allocation` holds room on GPU `gpu` of `node_id`: its own GPU, and both ends of a
/// move under way.
pub(crate) fn holds_gpu(allocation: &AllocationRecord, node_id: &str, gpu: u32) -> bool {
    let on = |node: &str, index: u32| node == node_id && index == gpu;
    on(&allocation.node_id, allocation.gpu)
        || (allocation.node_id == node_id && allocation.extra_gpus.contains(&gpu))
        || allocation.further.iter().any(|share| share.node_id == node_id && (share.gpu == gpu || share.extra_gpus.contains(&gpu)))
        || allocation.pending_move.as_ref().is_some_and(|pending| {
            on(&pending.from_node, pending.from_gpu)
                || on(&pending.to_node, pending.to_gpu)
                || (pending.from_node == node_id && pending.from_extra_gpus.contains(&gpu))
                || (pending.to_node == node_id && pending.to_extra_gpus.contains(&gpu))
        })
}

/// How many slices of `allocation` GPU `gpu` of `node_id` holds: one where it holds room
/// ([`holds_gpu`]), two on a GPU both servers of a move of one of its GPUs serve (the GPUs that
/// stay, shared by the old and the new server until the move is over).
pub(crate) fn slices_on(allocation: &AllocationRecord, node_id: &str, gpu: u32) -> u32 {
    if !holds_gpu(allocation, node_id, gpu) {
        return 0;
    }
    let shared = allocation.pending_move.as_ref().is_some_and(|pending| {
        let in_set = |first: u32, extra: &[u32]| first == gpu || extra.contains(&gpu);
        pending.from_node == node_id
            && pending.to_node == node_id
            && in_set(pending.from_gpu, &pending.from_extra_gpus)
            && in_set(pending.to_gpu, &pending.to_extra_gpus)
    });
    if shared { 2 } else { 1 }
}

/// The data-plane address an app reaches a server by, out of the server's `addresses`: its
/// Unix socket when the app shares the server's kernel and one is offered, else TCP.
pub fn data_address(addresses: &[String], same_host: bool) -> Option<String> {
    let unix = addresses.iter().find(|address| address.starts_with("unix:"));
    let tcp = addresses.iter().find(|address| !address.starts_with("unix:"));
    match (same_host, unix, tcp) {
        (true, Some(unix), _) | (_, Some(unix), None) => Some(unix.clone()),
        (_, _, Some(tcp)) => Some(tcp.clone()),
        (_, None, None) => None,
    }
}

/// Marks an allocation idle from `now` when it has no client and no session, busy otherwise.
pub fn refresh_idle(allocation: &mut AllocationRecord, now: u64) {
    if allocation.clients.is_empty() && allocation.sessions == 0 {
        allocation.idle_since.get_or_insert(now);
    } else {
        allocation.idle_since = None;
    }
}

/// Adds `client` to an allocation (one entry per pid and host).
pub fn add_client(allocation: &mut AllocationRecord, client: &ClientIdentity, now: u64) {
    if !allocation.clients.iter().any(|known| known.pid == client.pid && known.hostname == client.hostname) {
        allocation.clients.push(client.clone());
    }
    refresh_idle(allocation, now);
}

impl Model {
    /// The ids of the allocations `pick` picks: a copy, so the model may change while each is
    /// handled.
    pub fn allocation_ids(&self, pick: impl Fn(&AllocationRecord) -> bool) -> Vec<String> {
        self.allocations.values().filter(|allocation| pick(allocation)).map(|allocation| allocation.id.clone()).collect()
    }

    /// The ids of the nodes `pick` picks (a copy, as [`Model::allocation_ids`]).
    pub fn node_ids(&self, pick: impl Fn(&NodeEntry) -> bool) -> Vec<String> {
        self.nodes.values().filter(|node| pick(node)).map(|node| node.record.node_id.clone()).collect()
    }

    /// Allocation `id` (asked for as `target`), once it runs: admin steps (resize, move,
    /// checkpoint, restart) wait until it has started.
    pub fn running(&self, id: &str, target: &str) -> Result<&AllocationRecord, ControlError> {
        let allocation = self.allocations.get(id).ok_or_else(|| ControlError::UnknownAllocation(target.to_string()))?;
        if allocation.state != AllocationState::Running {
            return Err(ControlError::Invalid(format!("allocation {id} is still starting; try again")));
        }
        Ok(allocation)
    }

    /// The model a restarted cluster manager starts from: nodes get a fresh lease (they have a
    /// node timeout to report in before they are declared down) and down nodes a fresh grace
    /// period.
    pub fn from_stored(state: StoredState, now: Instant) -> Self {
        let mut model = Self { last_reap: Some(now), leases_restarted: Some(now), ..Self::default() };
        for vm in state.vm_required_resources {
            model.vms.insert(vm.vm_ip.clone(), vm);
        }
        for record in state.nodes {
            let down_since = (record.health == NodeHealth::Down).then_some(now);
            model.nodes.insert(record.node_id.clone(), NodeEntry { record, gpus: Vec::new(), last_heartbeat: now, down_since });
        }
        for gpu in state.gpus {
            if let Some(node) = model.nodes.get_mut(&gpu.node_id) {
                node.gpus.push(gpu.gpu);
            }
        }
        for allocation in state.allocations {
            model.allocations.insert(allocation.id.clone(), allocation);
        }
        model
    }

    /// SMs, MiB and allocation count given out of one GPU, leaving out `except` (an allocation
    /// being resized). An allocation with a resize under way counts with the larger of its two
    /// sizes, so nothing placed meanwhile can overcommit the GPU whichever way the resize ends;
    /// one with a move under way counts on both GPUs of the move, whichever way it ends, and
    /// twice on a GPU both of its servers serve meanwhile (a move of one of its GPUs).
    pub fn gpu_used(&self, node_id: &str, gpu: u32, except: Option<&str>) -> (u32, u64, u32) {
        self.allocations.values().filter(|allocation| Some(allocation.id.as_str()) != except).fold(
            (0, 0, 0),
            |(units, memory, count), allocation| {
                let slices = slices_on(allocation, node_id, gpu);
                if slices == 0 {
                    return (units, memory, count);
                }
                let pending = allocation.pending_resize.as_ref();
                let held_units = pending.map_or(allocation.compute_units, |size| size.compute_units.max(allocation.compute_units));
                let held_memory = pending.map_or(allocation.memory, |size| size.memory.max(allocation.memory));
                (units + held_units * slices, memory + held_memory * u64::from(slices), count + 1)
            },
        )
    }

    /// The allocation serving `vm_ip`, if any.
    pub fn allocation_for_vm(&self, vm_ip: &str) -> Option<&AllocationRecord> {
        self.allocations.values().find(|allocation| allocation.vm_ip == vm_ip)
    }

    /// How `vm_ip` reaches `allocation`: shared-mem mode when the VM's host is the node's.
    pub fn vm_mode(&self, vm_ip: &str, allocation: &AllocationRecord) -> VmMode {
        let vm_host = self.vms.get(vm_ip).map_or("", |vm| vm.host_ip.as_str());
        let node_host = self.nodes.get(&allocation.node_id).map_or("", |node| node.record.host_ip.as_str());
        VmMode::between(vm_host, node_host)
    }

    /// An allocation by id, or the one serving a VM ip.
    pub fn find_allocation(&self, target: &str) -> Option<&AllocationRecord> {
        self.allocations.get(target).or_else(|| self.allocation_for_vm(target))
    }

    /// Picks a GPU for `vm`: an up, undrained node on the VM's own host first, then any; on
    /// each, the GPU with the least free SMs that still fits (so big slices stay possible).
    /// The error names what is missing.
    #[cfg(test)]
    pub fn place(&self, vm: &VmRequirement) -> Result<(String, u32), ControlError> {
        self.place_avoiding(vm, &[])
    }

    /// `place`, leaving out the nodes in `avoid` (ones that did not answer a start).
    pub fn place_avoiding(&self, vm: &VmRequirement, avoid: &[String]) -> Result<(String, u32), ControlError> {
        let wanted_bytes = vm.memory.saturating_mul(MIB);
        // (another host, the GPU set's links (several-GPU VMs), free SMs, node, first GPU).
        let mut best: Option<(bool, SetRank, u32, &str, u32)> = None;
        let mut closest: Option<(u64, String)> = None;
        let (mut up, mut drained, mut gpus) = (0, 0, 0);
        for (node_id, node) in &self.nodes {
            if node.record.health != NodeHealth::Up || avoid.contains(node_id) {
                continue;
            }
            up += 1;
            if node.record.drained {
                drained += 1;
                continue;
            }
            let other_host = node.record.host_ip != vm.host_ip;
            let fitting = u32::try_from(self.fitting_gpus(vm, node_id).len()).unwrap_or(u32::MAX);
            let on_node = u32::try_from(node.gpus.len()).unwrap_or(u32::MAX);
            if vm.gpus > 1 && fitting < vm.gpus {
                gpus += node.gpus.len();
                if fitting > 0 || on_node >= vm.gpus {
                    let hint = format!("{node_id} has {fitting} of the {} GPUs with room for the slice", vm.gpus);
                    let shortfall = u64::from(vm.gpus - fitting) * 1000;
                    if closest.as_ref().is_none_or(|(best_shortfall, _)| shortfall < *best_shortfall) {
                        closest = Some((shortfall, hint));
                    }
                }
                continue;
            }
            // A several-GPU VM starts from the first GPU of the node's best-joined set.
            let set = (vm.gpus > 1).then(|| self.best_gpu_set(vm, node_id, None)).flatten();
            for gpu in &node.gpus {
                gpus += 1;
                let (used_units, used_memory, _) = self.gpu_used(node_id, gpu.index, None);
                let free_units = gpu.sm_count.saturating_sub(used_units);
                let free_bytes = gpu.memory_bytes.saturating_sub(used_memory.saturating_mul(MIB));
                let in_set = match &set {
                    Some((_, members)) => members.first() == Some(&gpu.index),
                    None => vm.gpus <= 1,
                };
                if in_set && free_units >= vm.compute_units && free_bytes >= wanted_bytes {
                    let rank = set.as_ref().map_or(SetRank::default(), |(rank, _)| *rank);
                    let candidate = (other_host, rank, free_units, node_id.as_str(), gpu.index);
                    if best.is_none_or(|current| candidate < current) {
                        best = Some(candidate);
                    }
                } else if vm.gpus <= 1 {
                    let units_short = vm.compute_units.saturating_sub(free_units);
                    let bytes_short = wanted_bytes.saturating_sub(free_bytes);
                    // Permille of the request missing: the closest miss is the most useful hint.
                    let shortfall = u64::from(units_short) * 1000 / u64::from(vm.compute_units.max(1))
                        + bytes_short.div_ceil(MIB) * 1000 / vm.memory.max(1);
                    if closest.as_ref().is_none_or(|(best_shortfall, _)| shortfall < *best_shortfall) {
                        let mut short = Vec::new();
                        if units_short > 0 {
                            short.push(format!("{units_short} SMs"));
                        }
                        if bytes_short > 0 {
                            short.push(format!("{} MiB", bytes_short.div_ceil(MIB)));
                        }
                        let hint = format!(
                            "{node_id} GPU {} has {free_units} SMs and {} MiB free (short by {})",
                            gpu.index,
                            free_bytes / MIB,
                            short.join(" and ")
                        );
                        closest = Some((shortfall, hint));
                    }
                }
            }
        }
        if let Some((_, _, _, node_id, gpu)) = best {
            return Ok((node_id.to_string(), gpu));
        }
        let need = match vm.gpus {
            0 | 1 => format!("VM {} needs {} SMs and {} MiB on one GPU", vm.vm_ip, vm.compute_units, vm.memory),
            n => format!("VM {} needs {n} GPUs of one node with {} SMs and {} MiB each", vm.vm_ip, vm.compute_units, vm.memory),
        };
        let why = if up == 0 {
            "no node manager is up: start flyt-node-manager on a GPU host".to_string()
        } else if up == drained {
            "every node is drained: `flytctl undrain NODE`".to_string()
        } else if gpus == 0 {
            "the up nodes report no GPU".to_string()
        } else {
            format!("closest: {}", closest.map(|(_, hint)| hint).unwrap_or_default())
        };
        Err(ControlError::NoCapacity(format!("{need}; {why}")))
    }

    /// Where `vm`'s GPUs go, node by node, the server of the first part first. One node when
    /// one has them all (as [`Self::place_avoiding`] picks); else, when the VM allows `spread`,
    /// several ([`Self::place_spread`]). The refusal says what is missing, and, for a VM that
    /// does not allow spreading, whether spreading would have placed it.
    pub fn placement(&self, vm: &VmRequirement, avoid: &[String]) -> Result<Vec<Part>, ControlError> {
        match self.place_avoiding(vm, avoid) {
            Ok((node_id, first)) => {
                let extra = self.extra_gpus(vm, &node_id, first)?;
                Ok(vec![Part { node_id, gpus: std::iter::once(first).chain(extra).collect() }])
            }
            Err(ControlError::NoCapacity(one_node)) if vm.gpus > 1 => match (vm.spread, self.place_spread(vm, avoid)) {
                (true, Ok(parts)) => Ok(parts),
                (true, Err(across)) => Err(ControlError::NoCapacity(format!("{one_node}; across nodes (--spread): {across}"))),
                (false, Ok(parts)) => Err(ControlError::NoCapacity(format!(
                    "{one_node}; {} nodes have them together, but VM {} is not allowed to spread over nodes (`flytctl vm add {} ... --gpus {} --spread`)",
                    parts.len(),
                    vm.vm_ip,
                    vm.vm_ip,
                    vm.gpus
                ))),
                (false, Err(_)) => Err(ControlError::NoCapacity(one_node)),
            },
            Err(error) => Err(error),
        }
    }

    /// `vm`'s GPUs across nodes: the fewest nodes that hold them (the nodes with the most GPUs
    /// with room first, the VM's own host first among equals; the last node gives only the GPUs
    /// still missing, from the node that fits them most tightly), on each node the best-joined
    /// set ([`Self::best_gpu_set`]). The VM's own host's part comes first (it carries the
    /// shared-memory channel), then the larger parts. At most `MAX_ADDRESS_WINDOW + 1` nodes:
    /// each node's server has an address window of its own. The error (plain text) says what
    /// is missing.
    pub fn place_spread(&self, vm: &VmRequirement, avoid: &[String]) -> Result<Vec<Part>, String> {
        let wanted = usize::try_from(vm.gpus).unwrap_or(usize::MAX);
        // (GPUs with room, another host, node).
        let mut candidates: Vec<(usize, bool, &str)> = self
            .nodes
            .iter()
            .filter(|(node_id, node)| node.record.health == NodeHealth::Up && !node.record.drained && !avoid.contains(node_id))
            .map(|(node_id, node)| (self.fitting_gpus(vm, node_id).len(), node.record.host_ip != vm.host_ip, node_id.as_str()))
            .filter(|(fitting, _, _)| *fitting > 0)
            .collect();
        candidates.sort_by_key(|(fitting, other_host, node_id)| (std::cmp::Reverse(*fitting), *other_host, *node_id));
        let total: usize = candidates.iter().map(|(fitting, _, _)| fitting).sum();
        if total < wanted {
            let list: Vec<String> = candidates.iter().map(|(fitting, _, node_id)| format!("{node_id} {fitting}")).collect();
            return Err(format!(
                "the up, undrained nodes have {total} GPUs with room for one of the {} slices ({})",
                vm.gpus,
                if list.is_empty() { "none".to_string() } else { list.join(", ") }
            ));
        }
        // The fewest nodes: those with the most room, until they hold enough.
        let mut nodes = 0;
        let mut held = 0;
        while held < wanted {
            held += candidates[nodes].0;
            nodes += 1;
        }
        let most = usize::try_from(MAX_ADDRESS_WINDOW).unwrap_or(usize::MAX) + 1;
        if nodes > most {
            return Err(format!(
                "the {} GPUs take {nodes} nodes at the fewest; an allocation spans at most {most} nodes (one address window each)",
                vm.gpus
            ));
        }
        let mut shares: Vec<(&str, usize)> = candidates[..nodes - 1].iter().map(|(fitting, _, node_id)| (*node_id, *fitting)).collect();
        let missing = wanted - shares.iter().map(|(_, count)| count).sum::<usize>();
        // The last node: the VM's own host first, then the tightest fit (whole nodes stay free).
        let last = candidates[nodes - 1..]
            .iter()
            .filter(|(fitting, _, _)| *fitting >= missing)
            .min_by_key(|(fitting, other_host, node_id)| (*other_host, *fitting, *node_id))
            .map(|(_, _, node_id)| *node_id)
            .ok_or_else(|| format!("no node has {missing} GPUs with room for VM {}", vm.vm_ip))?;
        shares.push((last, missing));
        let mut parts = Vec::with_capacity(shares.len());
        for (node_id, count) in shares {
            let count_u32 = u32::try_from(count).unwrap_or(u32::MAX);
            let gpus = self.best_set_of(vm, node_id, count_u32, None).map(|(_, members)| members).unwrap_or_default();
            if gpus.len() != count {
                return Err(format!("{node_id} no longer has {count} GPUs with room for VM {}", vm.vm_ip));
            }
            parts.push(Part { node_id: node_id.to_string(), gpus });
        }
        let other_host = |part: &Part| self.nodes.get(&part.node_id).is_none_or(|node| node.record.host_ip != vm.host_ip);
        parts.sort_by_key(|part| (other_host(part), std::cmp::Reverse(part.gpus.len())));
        Ok(parts)
    }

    /// A new `Starting` allocation `id` of `vm` placed on `parts` (at least one): the first
    /// part's server is the allocation's own (`node_id`, `gpu`, `extra_gpus`, address window 0),
    /// each further part's runs in the next address window.
    pub fn new_record(
        &self,
        id: String,
        vm: &VmRequirement,
        parts: &[Part],
        client: &ClientIdentity,
        now: u64,
    ) -> Result<AllocationRecord, ControlError> {
        let percentage = |node_id: &str, gpu: u32| {
            let sm_count =
                self.nodes.get(node_id).and_then(|node| node.gpus.iter().find(|info| info.index == gpu)).map_or(0, |info| info.sm_count);
            sm_percentage(vm.compute_units, sm_count)
        };
        let empty = || ControlError::Invalid(format!("the placement of VM {} names no GPU", vm.vm_ip));
        let (first, further) = parts.split_first().ok_or_else(empty)?;
        let (&gpu, extra_gpus) = first.gpus.split_first().ok_or_else(empty)?;
        let mut shares = Vec::with_capacity(further.len());
        for (part, address_window) in further.iter().zip(1..) {
            let (&gpu, extra_gpus) = part.gpus.split_first().ok_or_else(empty)?;
            shares.push(NodeShare {
                node_id: part.node_id.clone(),
                gpu,
                extra_gpus: extra_gpus.to_vec(),
                sm_percentage: percentage(&part.node_id, gpu),
                address_window,
                addresses: Vec::new(),
                pid: 0,
                sessions: 0,
                metrics: None,
            });
        }
        Ok(AllocationRecord {
            id,
            vm_ip: vm.vm_ip.clone(),
            node_id: first.node_id.clone(),
            gpu,
            extra_gpus: extra_gpus.to_vec(),
            compute_units: vm.compute_units,
            memory: vm.memory,
            sm_percentage: percentage(&first.node_id, gpu),
            state: AllocationState::Starting,
            clients: vec![client.clone()],
            created_at: now,
            further: shares,
            ..AllocationRecord::default()
        })
    }

    /// The GPUs of `node_id` with room for one of `vm`'s slices, the fullest first (so whole GPUs
    /// stay free for larger slices).
    fn fitting_gpus(&self, vm: &VmRequirement, node_id: &str) -> Vec<u32> {
        let Some(node) = self.nodes.get(node_id) else {
            return Vec::new();
        };
        let wanted_bytes = vm.memory.saturating_mul(MIB);
        let mut fitting: Vec<(u32, u32)> = node
            .gpus
            .iter()
            .filter_map(|gpu| {
                let (used_units, used_memory, _) = self.gpu_used(node_id, gpu.index, None);
                let free_units = gpu.sm_count.saturating_sub(used_units);
                let free_bytes = gpu.memory_bytes.saturating_sub(used_memory.saturating_mul(MIB));
                (free_units >= vm.compute_units && free_bytes >= wanted_bytes).then_some((free_units, gpu.index))
            })
            .collect();
        fitting.sort_unstable();
        fitting.into_iter().map(|(_, index)| index).collect()
    }

    /// The other GPUs of a several-GPU allocation of `vm` on `node_id` beside `first` (placement
    /// chose the node because it has them): none for a one-GPU VM.
    pub fn extra_gpus(&self, vm: &VmRequirement, node_id: &str, first: u32) -> Result<Vec<u32>, ControlError> {
        if vm.gpus <= 1 {
            return Ok(Vec::new());
        }
        match self.best_gpu_set(vm, node_id, Some(first)) {
            Some((_, members)) => Ok(members.into_iter().filter(|gpu| *gpu != first).collect()),
            None => Err(ControlError::NoCapacity(format!("{node_id} no longer has {} GPUs with room for VM {}", vm.gpus, vm.vm_ip))),
        }
    }

    /// How GPUs `a` and `b` of `node_id` reach each other: 0 NVLink, 1 PCIe peer to peer, 2 not
    /// peer to peer (through host memory).
    fn link_class(&self, node_id: &str, a: u32, b: u32) -> u32 {
        let kind = |from: u32, to: u32| {
            self.nodes
                .get(node_id)
                .and_then(|node| node.gpus.iter().find(|gpu| gpu.index == from))
                .and_then(|gpu| gpu.links.iter().find(|link| link.to == to))
                .map(|link| link.kind)
        };
        // A path counts as its worse direction.
        match (kind(a, b), kind(b, a)) {
            (Some(GpuLinkKind::NvLink), Some(GpuLinkKind::NvLink)) => 0,
            (Some(_), Some(_)) => 1,
            _ => 2,
        }
    }

    /// The `vm.gpus` GPUs of `node_id` with room for its slices that are best joined (every pair
    /// over NVLink first, then peer to peer over PCIe, then any), containing `first` when given;
    /// ties go to the fullest GPUs (whole GPUs stay free). Greedy from each possible first GPU:
    /// each step adds the GPU whose worst path to the set is best. `None` when too few fit.
    fn best_gpu_set(&self, vm: &VmRequirement, node_id: &str, first: Option<u32>) -> Option<(SetRank, Vec<u32>)> {
        self.best_set_of(vm, node_id, vm.gpus, first)
    }

    /// [`Self::best_gpu_set`] of `count` GPUs (a spread allocation's share of one node).
    fn best_set_of(&self, vm: &VmRequirement, node_id: &str, count: u32, first: Option<u32>) -> Option<(SetRank, Vec<u32>)> {
        let wanted = usize::try_from(count).ok()?;
        let mut fitting = self.fitting_gpus(vm, node_id);
        // `first` was chosen already (its slice may be counted by now): it is in the set.
        let starts: Vec<u32> = match first {
            Some(first) => {
                fitting.retain(|gpu| *gpu != first);
                fitting.push(first);
                vec![first]
            }
            None => fitting.clone(),
        };
        if fitting.len() < wanted {
            return None;
        }
        let mut best: Option<(SetRank, Vec<u32>)> = None;
        for start in starts {
            let mut members = vec![start];
            while members.len() < wanted {
                let worst_to_set = |gpu: u32| members.iter().map(|member| self.link_class(node_id, gpu, *member)).max().unwrap_or(0);
                // `fitting` is fullest first, so `min_by_key` keeps the fullest among equals.
                let next = fitting.iter().copied().filter(|gpu| !members.contains(gpu)).min_by_key(|gpu| worst_to_set(*gpu))?;
                members.push(next);
            }
            let classes: Vec<u32> =
                members.iter().enumerate().flat_map(|(i, a)| members[i + 1..].iter().map(|b| self.link_class(node_id, *a, *b))).collect();
            let rank = SetRank { worst: classes.iter().copied().max().unwrap_or(0), total: classes.iter().sum() };
            if best.as_ref().is_none_or(|(current, _)| rank < *current) {
                best = Some((rank, members));
            }
        }
        best
    }

    /// Checks that `allocation` can grow or shrink to `compute_units` SMs and `memory` MiB on
    /// its GPU.
    pub fn check_resize(&self, allocation: &AllocationRecord, compute_units: u32, memory: u64) -> Result<(), ControlError> {
        if compute_units == 0 || memory == 0 {
            return Err(ControlError::Invalid("compute units and memory must be above 0".into()));
        }
        // Every GPU of the allocation gets the new size.
        for placed in allocation.all_gpus() {
            let (node_id, index) = (&placed.node_id, placed.index);
            let gpu = self
                .nodes
                .get(node_id)
                .and_then(|node| node.gpus.iter().find(|gpu| gpu.index == index))
                .ok_or_else(|| ControlError::UnknownNode(node_id.clone()))?;
            let (used_units, used_memory, _) = self.gpu_used(node_id, index, Some(&allocation.id));
            let free_units = gpu.sm_count.saturating_sub(used_units);
            let free_memory = (gpu.memory_bytes / MIB).saturating_sub(used_memory);
            if compute_units > free_units || memory > free_memory {
                return Err(ControlError::NoCapacity(format!(
                    "{node_id} GPU {index} has {free_units} SMs and {free_memory} MiB available for allocation {} (asked {compute_units} SMs and {memory} MiB)",
                    allocation.id
                )));
            }
        }
        Ok(())
    }

    /// Node `to_node`, if a move may go there: known, up and not drained.
    fn movable_to(&self, to_node: &str) -> Result<&NodeEntry, ControlError> {
        let node = self.nodes.get(to_node).ok_or_else(|| ControlError::UnknownNode(to_node.to_string()))?;
        if node.record.health != NodeHealth::Up {
            return Err(ControlError::NodeUnreachable {
                node: to_node.to_string(),
                reason: "it is marked down (its node manager sends no heartbeat)".into(),
            });
        }
        if node.record.drained {
            return Err(ControlError::Invalid(format!("node {to_node} is drained and takes no allocation (`flytctl undrain {to_node}`)")));
        }
        Ok(node)
    }

    /// Checks that `allocation` can move to node `to_node`: GPU `to_gpu` there, or the GPU
    /// placement would pick (the fullest that holds the slice). Returns that GPU and the
    /// slice's MPS percentage on it (the same SMs of another GPU).
    pub fn check_move(&self, allocation: &AllocationRecord, to_node: &str, to_gpu: Option<u32>) -> Result<(u32, u32), ControlError> {
        let node = self.movable_to(to_node)?;
        if let Some(index) = to_gpu
            && !node.gpus.iter().any(|gpu| gpu.index == index)
        {
            return Err(ControlError::Invalid(format!("node {to_node} has no GPU {index}")));
        }
        // Within its node, an allocation moves to another GPU only.
        let same_node = allocation.node_id == to_node;
        if same_node && (to_gpu == Some(allocation.gpu) || node.gpus.iter().all(|gpu| gpu.index == allocation.gpu)) {
            return Err(ControlError::Invalid(format!("allocation {} already runs on {to_node}/{}", allocation.id, allocation.gpu)));
        }
        let units = allocation.pending_resize.map_or(allocation.compute_units, |size| size.compute_units.max(allocation.compute_units));
        let memory = allocation.pending_resize.map_or(allocation.memory, |size| size.memory.max(allocation.memory));
        let mut best: Option<(u32, u32, u32)> = None;
        let mut closest: Option<(u64, String)> = None;
        let candidates =
            node.gpus.iter().filter(|gpu| to_gpu.is_none_or(|index| gpu.index == index) && !(same_node && gpu.index == allocation.gpu));
        for gpu in candidates {
            let (used_units, used_memory, _) = self.gpu_used(to_node, gpu.index, Some(&allocation.id));
            let free_units = gpu.sm_count.saturating_sub(used_units);
            let free_memory = (gpu.memory_bytes / MIB).saturating_sub(used_memory);
            if free_units >= units && free_memory >= memory {
                if best.is_none_or(|(fewest, _, _)| free_units < fewest) {
                    best = Some((free_units, gpu.index, sm_percentage(units, gpu.sm_count)));
                }
            } else {
                let shortfall = u64::from(units.saturating_sub(free_units)) * 1000 / u64::from(units.max(1))
                    + memory.saturating_sub(free_memory) * 1000 / memory.max(1);
                if closest.as_ref().is_none_or(|(fewest, _)| shortfall < *fewest) {
                    closest = Some((shortfall, format!("{to_node} GPU {} has {free_units} SMs and {free_memory} MiB free", gpu.index)));
                }
            }
        }
        match (best, closest) {
            (Some((_, gpu, percentage)), _) => Ok((gpu, percentage)),
            (None, closest) => Err(ControlError::TargetFull(format!(
                "{}; allocation {} needs {units} SMs and {memory} MiB",
                closest.map_or_else(|| format!("{to_node} reports no GPU"), |(_, hint)| hint),
                allocation.id
            ))),
        }
    }

    /// [`Self::check_move`] for an allocation of several GPUs on one node: as many GPUs of
    /// another node `to_node` with room for its slice, the best-joined set (with `to_gpu` first
    /// when given). Returns them, the new server's first first, and the slice's MPS percentage
    /// there.
    pub fn check_move_set(
        &self,
        allocation: &AllocationRecord,
        to_node: &str,
        to_gpu: Option<u32>,
    ) -> Result<(Vec<u32>, u32), ControlError> {
        let node = self.movable_to(to_node)?;
        let count = allocation.extra_gpus.len() + 1;
        if allocation.node_id == to_node {
            return Err(ControlError::Invalid(format!(
                "allocation {} has {count} GPUs on {to_node}: an allocation of several GPUs moves to another node only (its old and new GPUs would overlap)",
                allocation.id
            )));
        }
        if let Some(index) = to_gpu
            && !node.gpus.iter().any(|gpu| gpu.index == index)
        {
            return Err(ControlError::Invalid(format!("node {to_node} has no GPU {index}")));
        }
        let units = allocation.pending_resize.map_or(allocation.compute_units, |size| size.compute_units.max(allocation.compute_units));
        let memory = allocation.pending_resize.map_or(allocation.memory, |size| size.memory.max(allocation.memory));
        let slice = VmRequirement {
            vm_ip: allocation.vm_ip.clone(),
            host_ip: String::new(),
            compute_units: units,
            memory,
            gpus: u32::try_from(count).unwrap_or(u32::MAX),
            spread: false,
        };
        let fitting = self.fitting_gpus(&slice, to_node);
        let set = match to_gpu {
            Some(index) if !fitting.contains(&index) => None,
            _ => self.best_set_of(&slice, to_node, slice.gpus, to_gpu).map(|(_, members)| members),
        };
        let Some(members) = set.filter(|members| members.len() == count) else {
            let with = to_gpu.map_or_else(String::new, |index| format!(", GPU {index} among them"));
            return Err(ControlError::TargetFull(format!(
                "{to_node} has {} of the {count} GPUs with room for the slice{with}; allocation {} needs {units} SMs and {memory} MiB on each of {count} GPUs",
                fitting.len(),
                allocation.id
            )));
        };
        let sm_count = node.gpus.iter().find(|gpu| gpu.index == members[0]).map_or(0, |gpu| gpu.sm_count);
        Ok((members, sm_percentage(units, sm_count)))
    }

    /// Checks that GPU `index` of `allocation` (one of several, on one node) can be replaced by
    /// GPU `to_gpu` of `to_node` (its own node; `None`: the fullest GPU there with room), the
    /// others kept at their indices. The new set's server runs beside the old one until the
    /// move is over, so each GPU that stays must have room for a second slice. Returns the new
    /// set, its first first, and the slice's MPS percentage on its first GPU.
    pub fn check_move_one_gpu(
        &self,
        allocation: &AllocationRecord,
        index: u32,
        to_node: &str,
        to_gpu: Option<u32>,
    ) -> Result<(Vec<u32>, u32), ControlError> {
        let id = &allocation.id;
        if allocation.is_spread() {
            return Err(ControlError::Invalid(format!(
                "allocation {id} is spread over nodes (--spread): moving one of its GPUs is not supported (its apps hold one session on each node's server)"
            )));
        }
        let old: Vec<u32> = std::iter::once(allocation.gpu).chain(allocation.extra_gpus.iter().copied()).collect();
        let listed = || old.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let at = usize::try_from(index).unwrap_or(usize::MAX);
        if at >= old.len() {
            return Err(ControlError::Invalid(format!(
                "allocation {id} has {} GPU(s) ({}/{}): there is no GPU at index {index} (0 to {})",
                old.len(),
                allocation.node_id,
                listed(),
                old.len() - 1
            )));
        }
        if to_node != allocation.node_id {
            return Err(ControlError::Invalid(format!(
                "allocation {id} runs on {}: one of its GPUs moves to another GPU of that node only; to go to {to_node}, move it whole (`flytctl migrate {} --to {to_node}`)",
                allocation.node_id, allocation.vm_ip
            )));
        }
        let node = self.movable_to(to_node)?;
        if let Some(gpu) = to_gpu {
            if !node.gpus.iter().any(|known| known.index == gpu) {
                return Err(ControlError::Invalid(format!("node {to_node} has no GPU {gpu}")));
            }
            if let Some(held_at) = old.iter().position(|held| *held == gpu) {
                return Err(ControlError::Invalid(format!(
                    "GPU {gpu} of {to_node} is already in allocation {id} (at index {held_at} of {}): name a GPU it does not have",
                    listed()
                )));
            }
        }
        let units = allocation.pending_resize.map_or(allocation.compute_units, |size| size.compute_units.max(allocation.compute_units));
        let memory = allocation.pending_resize.map_or(allocation.memory, |size| size.memory.max(allocation.memory));
        let free = |gpu: &GpuInfo| {
            let (used_units, used_memory, _) = self.gpu_used(to_node, gpu.index, None);
            (gpu.sm_count.saturating_sub(used_units), (gpu.memory_bytes / MIB).saturating_sub(used_memory))
        };
        // The GPUs that stay serve the old and the new server for the move's duration.
        for (stays_at, gpu) in old.iter().enumerate().filter(|(position, _)| *position != at) {
            let Some(info) = node.gpus.iter().find(|known| known.index == *gpu) else {
                return Err(ControlError::Invalid(format!("node {to_node} no longer reports GPU {gpu} of allocation {id}")));
            };
            let (free_units, free_memory) = free(info);
            if free_units < units || free_memory < memory {
                return Err(ControlError::TargetFull(format!(
                    "{to_node} GPU {gpu} (index {stays_at}, which stays) has {free_units} SMs and {free_memory} MiB free; during the move the old and the new server each hold a slice of allocation {id} there, so it needs room for a second slice of {units} SMs and {memory} MiB"
                )));
            }
        }
        // The new GPU: the one named, else the fullest with room (whole GPUs stay free).
        let mut best: Option<(u32, u32)> = None;
        let mut closest: Option<String> = None;
        for gpu in node.gpus.iter().filter(|gpu| !old.contains(&gpu.index) && to_gpu.is_none_or(|named| named == gpu.index)) {
            let (free_units, free_memory) = free(gpu);
            if free_units >= units && free_memory >= memory {
                if best.is_none_or(|(fewest, _)| free_units < fewest) {
                    best = Some((free_units, gpu.index));
                }
            } else if closest.is_none() || to_gpu.is_some() {
                closest = Some(format!("{to_node} GPU {} has {free_units} SMs and {free_memory} MiB free", gpu.index));
            }
        }
        let Some((_, new_gpu)) = best else {
            return Err(ControlError::TargetFull(format!(
                "{}; allocation {id} needs {units} SMs and {memory} MiB on the new GPU",
                closest.unwrap_or_else(|| format!("{to_node} has no GPU beside the allocation's {}", listed()))
            )));
        };
        let mut set = old;
        set[at] = new_gpu;
        let sm_count = node.gpus.iter().find(|gpu| gpu.index == set[0]).map_or(0, |gpu| gpu.sm_count);
        Ok((set, sm_percentage(units, sm_count)))
    }

    /// A node with what is given out of each GPU.
    pub fn node_view(&self, node: &NodeEntry, now: Instant) -> NodeView {
        let gpus = node
            .gpus
            .iter()
            .map(|gpu| {
                let (allocated_compute_units, allocated_memory, allocations) = self.gpu_used(&node.record.node_id, gpu.index, None);
                GpuUsage { gpu: gpu.clone(), allocated_compute_units, allocated_memory, allocations }
            })
            .collect();
        let last_heartbeat_ms = u64::try_from(now.saturating_duration_since(node.last_heartbeat).as_millis()).unwrap_or(u64::MAX);
        NodeView { node: node.record.clone(), gpus, last_heartbeat_ms }
    }

    /// Client managers silent for longer than `timeout`, removed from the lease table.
    pub fn expire_client_managers(&mut self, now: Instant, timeout: Duration) -> Vec<String> {
        let expired: Vec<String> = self
            .client_managers
            .iter()
            .filter(|(_, last)| now.saturating_duration_since(**last) > timeout)
            .map(|(vm_ip, _)| vm_ip.clone())
            .collect();
        for vm_ip in &expired {
            self.client_managers.remove(vm_ip);
        }
        expired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, host_ip: &str, gpus: &[(u32, u64)]) -> NodeEntry {
        NodeEntry {
            record: NodeRecord {
                node_id: id.into(),
                host_ip: host_ip.into(),
                boot_id: format!("boot-{id}"),
                control_address: "127.0.0.1:1".into(),
                health: NodeHealth::Up,
                drained: false,
                registered_at: 0,
            },
            gpus: gpus
                .iter()
                .enumerate()
                .map(|(index, (sms, mib))| GpuInfo {
                    index: u32::try_from(index).unwrap(),
                    uuid: format!("{id}-{index}"),
                    name: "Emulated".into(),
                    memory_bytes: mib * MIB,
                    sm_count: *sms,
                    emulated: true,
                    links: Vec::new(),
                })
                .collect(),
            last_heartbeat: Instant::now(),
            down_since: None,
        }
    }

    fn vm(ip: &str, host_ip: &str, units: u32, memory: u64) -> VmRequirement {
        VmRequirement { vm_ip: ip.into(), host_ip: host_ip.into(), compute_units: units, memory, gpus: 1, spread: false }
    }

    fn allocate(model: &mut Model, id: &str, vm: &VmRequirement) -> (String, u32) {
        let (node_id, gpu) = model.place(vm).unwrap();
        model.allocations.insert(
            id.into(),
            AllocationRecord {
                id: id.into(),
                vm_ip: vm.vm_ip.clone(),
                node_id: node_id.clone(),
                gpu,
                compute_units: vm.compute_units,
                memory: vm.memory,
                state: AllocationState::Running,
                ..AllocationRecord::default()
            },
        );
        let extra_gpus = model.extra_gpus(vm, &node_id, gpu).unwrap();
        model.allocations.get_mut(id).unwrap().extra_gpus = extra_gpus;
        (node_id, gpu)
    }

    fn model() -> Model {
        let mut model = Model::default();
        model.nodes.insert("a".into(), node("a", "192.0.2.1", &[(80, 16_384)]));
        model.nodes.insert("b".into(), node("b", "192.0.2.2", &[(80, 16_384), (40, 8_192)]));
        model
    }

    #[test]
    fn own_host_first_then_best_fit() {
        let mut model = model();
        assert_eq!(allocate(&mut model, "x1", &vm("10.0.0.1", "192.0.2.2", 30, 1024)), ("b".into(), 1));
        assert_eq!(allocate(&mut model, "x2", &vm("10.0.0.2", "192.0.2.1", 30, 1024)), ("a".into(), 0));
        // 'a' has 50 SMs left, 'b' GPU 1 has 10 and GPU 0 has 80: a 40-SM slice from a third host
        // goes to the fullest GPU that fits.
        assert_eq!(allocate(&mut model, "x3", &vm("10.0.0.3", "192.0.2.9", 40, 1024)), ("a".into(), 0));
        assert_eq!(model.gpu_used("a", 0, None), (70, 2048, 2));
    }

    #[test]
    fn several_gpus_go_to_one_node_that_has_them() {
        let mut model = model();
        model.nodes.insert("c".into(), node("c", "192.0.2.3", &[(80, 16_384), (80, 16_384), (80, 16_384)]));
        let two = VmRequirement { gpus: 2, ..vm("10.0.0.1", "192.0.2.1", 50, 4096) };
        // 'a' (the VM's host) has one GPU; 'b' two, one too small for 50 SMs: 'c'.
        let (node, first) = allocate(&mut model, "pair", &two);
        assert_eq!(node, "c");
        let extra = model.allocations["pair"].extra_gpus.clone();
        assert_eq!(extra.len(), 1);
        assert_ne!(extra[0], first);
        // Each of its GPUs counts the slice.
        for gpu in std::iter::once(first).chain(extra.iter().copied()) {
            assert_eq!(model.gpu_used("c", gpu, None), (50, 4096, 1), "GPU {gpu}");
        }
        // Three 30-SM slices: only 'c' has three GPUs with room (30, 30 and 80 SMs free).
        let three = VmRequirement { gpus: 3, ..vm("10.0.0.2", "192.0.2.3", 30, 4096) };
        assert_eq!(allocate(&mut model, "triple", &three).0, "c");
        // Another fits nowhere, and the error says how close the best node came ('b': two).
        let error = model.place(&VmRequirement { gpus: 3, ..vm("10.0.0.3", "192.0.2.3", 30, 4096) }).unwrap_err().to_string();
        assert!(error.contains("needs 3 GPUs of one node with 30 SMs and 4096 MiB each"), "{error}");
        assert!(error.contains("b has 2 of the 3 GPUs with room"), "{error}");
        // A resize must fit on every GPU of the allocation.
        let pair = model.allocations["pair"].clone();
        assert!(model.check_resize(&pair, 50, 4096).is_ok());
        assert!(model.check_resize(&pair, 51, 4096).is_err(), "two of its GPUs have no SM to spare");
    }

    /// Joins GPUs `a` and `b` of `node` both ways by `kind`.
    fn link(node: &mut NodeEntry, a: u32, b: u32, kind: GpuLinkKind) {
        use flyt_protocol::control::cluster::GpuLink;
        for (from, to) in [(a, b), (b, a)] {
            node.gpus.iter_mut().find(|gpu| gpu.index == from).unwrap().links.push(GpuLink { to, kind });
        }
    }

    #[test]
    fn several_gpus_go_to_gpus_joined_by_nvlink_first() {
        let mut model = Model::default();
        // Four GPUs: 0-1 and 2-3 over NVLink, 1-2 peers over PCIe, 0 and 3 not peers.
        let mut four = node("d", "192.0.2.4", &[(80, 16_384); 4]);
        link(&mut four, 0, 1, GpuLinkKind::NvLink);
        link(&mut four, 2, 3, GpuLinkKind::NvLink);
        link(&mut four, 1, 2, GpuLinkKind::Pcie);
        model.nodes.insert("d".into(), four);
        let two = |ip: &str, units| VmRequirement { gpus: 2, ..vm(ip, "192.0.2.4", units, 4096) };
        let pair = |model: &Model, id: &str| {
            let allocation = &model.allocations[id];
            let mut gpus = vec![allocation.gpu, allocation.extra_gpus[0]];
            gpus.sort();
            gpus
        };
        allocate(&mut model, "p1", &two("10.0.0.1", 50));
        let first = pair(&model, "p1");
        assert!(first == [0, 1] || first == [2, 3], "an NVLink pair, got {first:?}");
        // The other NVLink pair still has room for 50 SMs each: it gets the second VM.
        allocate(&mut model, "p2", &two("10.0.0.2", 50));
        let second = pair(&model, "p2");
        assert!((second == [0, 1] || second == [2, 3]) && second != first, "the other NVLink pair, got {second:?}");
        // 30 SMs are left on each GPU: a third pair goes to the fullest NVLink pair again, not
        // to 1-2 (PCIe) or 0-3 (no peer path).
        allocate(&mut model, "p3", &two("10.0.0.3", 30));
        let third = pair(&model, "p3");
        assert!(third == [0, 1] || third == [2, 3], "an NVLink pair, got {third:?}");
        // Three GPUs: no set of three is all NVLink; the best is a path 0-1-2 or 1-2-3 (two
        // NVLink pairs' worth of links beats including 0 with 3).
        let mut model = Model::default();
        let mut four = node("d", "192.0.2.4", &[(80, 16_384); 4]);
        link(&mut four, 0, 1, GpuLinkKind::NvLink);
        link(&mut four, 2, 3, GpuLinkKind::NvLink);
        link(&mut four, 1, 2, GpuLinkKind::Pcie);
        link(&mut four, 0, 2, GpuLinkKind::Pcie);
        link(&mut four, 1, 3, GpuLinkKind::Pcie);
        model.nodes.insert("d".into(), four);
        allocate(&mut model, "t", &VmRequirement { gpus: 3, ..vm("10.0.0.4", "192.0.2.4", 10, 1024) });
        let allocation = &model.allocations["t"];
        let mut three: Vec<u32> = std::iter::once(allocation.gpu).chain(allocation.extra_gpus.iter().copied()).collect();
        three.sort();
        assert!(three == [0, 1, 2] || three == [1, 2, 3], "every pair peer to peer, got {three:?}");
    }

    /// Places `vm` as the service does (`placement`, then `new_record`) and stores it as running.
    fn allocate_parts(model: &mut Model, id: &str, vm: &VmRequirement) -> Vec<Part> {
        let parts = model.placement(vm, &[]).unwrap();
        let mut record = model.new_record(id.into(), vm, &parts, &ClientIdentity::default(), 0).unwrap();
        record.state = AllocationState::Running;
        model.allocations.insert(id.into(), record);
        parts
    }

    fn spread(ip: &str, host_ip: &str, gpus: u32, units: u32, memory: u64) -> VmRequirement {
        VmRequirement { gpus, spread: true, ..vm(ip, host_ip, units, memory) }
    }

    #[test]
    fn spread_gpus_go_to_one_node_when_one_has_them() {
        let mut model = model();
        // 'b' has two GPUs with room for 30 SMs: one node, one part, though spreading is allowed.
        let parts = allocate_parts(&mut model, "pair", &spread("10.0.0.1", "192.0.2.1", 2, 30, 1024));
        assert_eq!(parts.len(), 1, "{parts:?}");
        assert_eq!(parts[0].node_id, "b");
        assert!(model.allocations["pair"].further.is_empty());
    }

    #[test]
    fn spread_gpus_go_across_nodes_only_when_allowed() {
        let mut model = Model::default();
        model.nodes.insert("a".into(), node("a", "192.0.2.1", &[(40, 4096)]));
        model.nodes.insert("b".into(), node("b", "192.0.2.2", &[(40, 4096)]));
        // Without --spread: refused, saying what one node lacks and that spreading would do.
        let error = model.placement(&VmRequirement { gpus: 2, ..vm("10.0.0.1", "192.0.2.2", 20, 1024) }, &[]).unwrap_err().to_string();
        assert!(error.contains("needs 2 GPUs of one node with 20 SMs and 1024 MiB each"), "{error}");
        assert!(error.contains("2 nodes have them together, but VM 10.0.0.1 is not allowed to spread over nodes"), "{error}");
        assert!(error.contains("--gpus 2 --spread"), "{error}");
        // With it: both nodes, the VM's own host ('b') first, the second in address window 1.
        let parts = allocate_parts(&mut model, "two", &spread("10.0.0.1", "192.0.2.2", 2, 20, 1024));
        assert_eq!(parts, vec![Part { node_id: "b".into(), gpus: vec![0] }, Part { node_id: "a".into(), gpus: vec![0] }]);
        let record = &model.allocations["two"];
        assert_eq!((record.node_id.as_str(), record.gpu, record.extra_gpus.len()), ("b", 0, 0));
        assert_eq!(record.further.len(), 1);
        assert_eq!((record.further[0].node_id.as_str(), record.further[0].address_window), ("a", 1));
        assert_eq!(record.further[0].sm_percentage, 50);
        let order: Vec<(String, u32)> = record.all_gpus().into_iter().map(|gpu| (gpu.node_id, gpu.index)).collect();
        assert_eq!(order, vec![("b".to_string(), 0), ("a".to_string(), 0)]);
        // Each node's GPU holds the slice: a resize must fit both, a third VM of 30 SMs fits neither.
        assert_eq!(model.gpu_used("a", 0, None), (20, 1024, 1));
        assert_eq!(model.gpu_used("b", 0, None), (20, 1024, 1));
        let two = model.allocations["two"].clone();
        assert!(model.check_resize(&two, 40, 4096).is_ok());
        model.allocations.insert(
            "other".into(),
            AllocationRecord {
                id: "other".into(),
                vm_ip: "10.0.0.9".into(),
                ..model
                    .new_record(
                        "other".into(),
                        &vm("10.0.0.9", "", 10, 1024),
                        &[Part { node_id: "a".into(), gpus: vec![0] }],
                        &ClientIdentity::default(),
                        0,
                    )
                    .unwrap()
            },
        );
        let error = model.check_resize(&two, 40, 1024).unwrap_err().to_string();
        assert!(error.contains("a GPU 0 has 30 SMs"), "a further node's GPU counts too: {error}");
        // More than the nodes hold, spread or not: what they have is named.
        let error = model.placement(&spread("10.0.0.2", "192.0.2.2", 3, 10, 1024), &[]).unwrap_err().to_string();
        assert!(error.contains("needs 3 GPUs of one node"), "{error}");
        assert!(
            error.contains("across nodes (--spread): the up, undrained nodes have 2 GPUs with room for one of the 3 slices (b 1, a 1)"),
            "{error}"
        );
        // A node to avoid (one that did not answer a start) is left out.
        let error = model.placement(&spread("10.0.0.3", "192.0.2.2", 2, 10, 1024), &["a".to_string()]).unwrap_err().to_string();
        assert!(error.contains("have 1 GPUs with room for one of the 2 slices (b 1)"), "{error}");
    }

    #[test]
    fn spread_gpus_take_the_fewest_nodes_then_nvlink_pairs() {
        let mut model = Model::default();
        model.nodes.insert("one".into(), node("one", "192.0.2.1", &[(80, 16_384)]));
        model.nodes.insert("two".into(), node("two", "192.0.2.2", &[(80, 16_384); 2]));
        model.nodes.insert("three".into(), node("three", "192.0.2.3", &[(80, 16_384); 3]));
        // Four GPUs: 'three' and then one more from the node that fits it most tightly ('one'),
        // two nodes rather than three.
        let parts = allocate_parts(&mut model, "four", &spread("10.0.0.1", "192.0.2.9", 4, 50, 1024));
        let nodes: Vec<(&str, usize)> = parts.iter().map(|part| (part.node_id.as_str(), part.gpus.len())).collect();
        assert_eq!(nodes, vec![("three", 3), ("one", 1)]);
        // Inside a node, the GPUs joined by NVLink: six GPUs on two nodes of four, the second
        // node's two are its NVLink pair.
        let mut model = Model::default();
        let mut left = node("left", "192.0.2.1", &[(80, 16_384); 4]);
        link(&mut left, 0, 1, GpuLinkKind::NvLink);
        let mut right = node("right", "192.0.2.2", &[(80, 16_384); 4]);
        link(&mut right, 2, 3, GpuLinkKind::NvLink);
        link(&mut right, 0, 1, GpuLinkKind::Pcie);
        model.nodes.insert("left".into(), left);
        model.nodes.insert("right".into(), right);
        let parts = allocate_parts(&mut model, "six", &spread("10.0.0.2", "192.0.2.9", 6, 10, 1024));
        assert_eq!(parts.len(), 2, "{parts:?}");
        assert_eq!(parts[0].gpus.len(), 4);
        let mut pair = parts[1].gpus.clone();
        pair.sort_unstable();
        assert_eq!((parts[1].node_id.as_str(), pair), ("right", vec![2, 3]), "the NVLink pair of the second node");
    }

    #[test]
    fn spread_gpus_span_at_most_one_node_per_address_window() {
        let mut model = Model::default();
        for index in 0..=MAX_ADDRESS_WINDOW + 1 {
            let id = format!("n{index}");
            model.nodes.insert(id.clone(), node(&id, &format!("192.0.2.{index}"), &[(80, 16_384)]));
        }
        let most = MAX_ADDRESS_WINDOW + 1;
        let parts = allocate_parts(&mut model, "five", &spread("10.0.0.1", "192.0.2.99", most, 10, 1024));
        let windows: Vec<u32> = model.allocations["five"].further.iter().map(|share| share.address_window).collect();
        assert_eq!((parts.len(), windows), (5, vec![1, 2, 3, 4]));
        let error = model.placement(&spread("10.0.0.2", "192.0.2.99", most + 1, 10, 1024), &[]).unwrap_err().to_string();
        assert!(error.contains("the 6 GPUs take 6 nodes at the fewest; an allocation spans at most 5 nodes"), "{error}");
    }

    #[test]
    fn a_vm_on_its_allocations_host_gets_shared_memory_mode() {
        let mut model = model();
        let (own, other, full) =
            (vm("10.0.0.1", "192.0.2.2", 30, 1024), vm("10.0.0.3", "192.0.2.9", 30, 1024), vm("10.0.0.4", "192.0.2.1", 70, 1024));
        for requirement in [&own, &other, &full] {
            model.vms.insert(requirement.vm_ip.clone(), requirement.clone());
        }
        allocate(&mut model, "own", &own);
        allocate(&mut model, "other", &other);
        // Its own host ('a') has no room left for 70 SMs after the 30 above: placed elsewhere,
        // it gets RPC-only mode.
        allocate(&mut model, "filler", &vm("10.0.0.5", "192.0.2.1", 30, 1024));
        allocate(&mut model, "full", &full);
        let mode = |id: &str| model.vm_mode(&model.allocations[id].vm_ip, &model.allocations[id]);
        assert_eq!(mode("own"), VmMode::SharedMemory);
        assert_eq!(mode("other"), VmMode::RpcOnly);
        assert_ne!(model.allocations["full"].node_id, "a");
        assert_eq!(mode("full"), VmMode::RpcOnly);
        assert_eq!(VmMode::between("", ""), VmMode::RpcOnly, "an unknown host is never the node's");
    }

    #[test]
    fn what_is_missing_is_named() {
        let mut model = model();
        let error = model.place(&vm("10.0.0.9", "192.0.2.1", 81, 1024)).unwrap_err().to_string();
        assert!(error.contains("needs 81 SMs") && error.contains("short by 1 SMs"), "{error}");
        let error = model.place(&vm("10.0.0.9", "192.0.2.1", 10, 20_000)).unwrap_err().to_string();
        assert!(error.contains("MiB"), "{error}");
        for node in model.nodes.values_mut() {
            node.record.drained = true;
        }
        let error = model.place(&vm("10.0.0.9", "192.0.2.1", 1, 1)).unwrap_err().to_string();
        assert!(error.contains("drained"), "{error}");
        for node in model.nodes.values_mut() {
            node.record.health = NodeHealth::Down;
        }
        let error = model.place(&vm("10.0.0.9", "192.0.2.1", 1, 1)).unwrap_err().to_string();
        assert!(error.contains("no node manager is up"), "{error}");
    }

    #[test]
    fn resizes_are_checked_against_the_rest_of_the_gpu() {
        let mut model = model();
        allocate(&mut model, "x1", &vm("10.0.0.1", "192.0.2.1", 40, 4096));
        allocate(&mut model, "x2", &vm("10.0.0.2", "192.0.2.1", 20, 4096));
        let x1 = model.allocations["x1"].clone();
        assert!(model.check_resize(&x1, 60, 12_288).is_ok());
        assert!(model.check_resize(&x1, 61, 1024).is_err());
        assert!(model.check_resize(&x1, 10, 12_289).is_err());
    }

    #[test]
    fn a_resize_under_way_holds_the_larger_size() {
        let mut model = model();
        allocate(&mut model, "x1", &vm("10.0.0.1", "192.0.2.1", 40, 4096));
        let x1 = model.allocations.get_mut("x1").unwrap();
        x1.pending_resize = Some(flyt_protocol::control::cluster::SliceSize { compute_units: 60, memory: 2048, sm_percentage: 75 });
        assert_eq!(model.gpu_used("a", 0, None), (60, 4096, 1));
        let error = model.place(&vm("10.0.0.2", "192.0.2.1", 30, 1024)).map(|(node, _)| node);
        assert_eq!(error.ok().as_deref(), Some("b"), "only 20 SMs are free on a while x1 may grow to 60");
    }

    #[test]
    fn a_move_needs_a_known_up_undrained_other_node_with_room() {
        let mut model = model();
        model.nodes.insert("c".into(), node("c", "192.0.2.3", &[(20, 16_384)]));
        allocate(&mut model, "x1", &vm("10.0.0.1", "192.0.2.1", 30, 4096));
        allocate(&mut model, "x2", &vm("10.0.0.2", "192.0.2.2", 60, 4096));
        let x1 = model.allocations["x1"].clone();
        assert_eq!(x1.node_id, "a");
        // Node b: GPU 0 has 20 SMs left, GPU 1 (40 SMs of 8 GiB) all 40: only GPU 1 holds 30.
        assert_eq!(model.check_move(&x1, "b", None).unwrap(), (1, 75));
        let full = model.check_move(&x1, "b", Some(0)).unwrap_err().to_string();
        assert!(full.starts_with("target full: b GPU 0 has 20 SMs and 12288 MiB free"), "{full}");
        let full = model.check_move(&x1, "c", None).unwrap_err().to_string();
        assert!(full.contains("needs 30 SMs and 4096 MiB"), "{full}");
        assert!(matches!(model.check_move(&x1, "z", None), Err(ControlError::UnknownNode(_))));
        assert!(model.check_move(&x1, "b", Some(7)).unwrap_err().to_string().contains("no GPU 7"));
        assert!(model.check_move(&x1, "a", None).unwrap_err().to_string().contains("already runs on a"));
        model.nodes.get_mut("b").unwrap().record.drained = true;
        assert!(model.check_move(&x1, "b", None).unwrap_err().to_string().contains("drained"));
        model.nodes.get_mut("b").unwrap().record.health = NodeHealth::Down;
        assert!(matches!(model.check_move(&x1, "b", None), Err(ControlError::NodeUnreachable { .. })));
    }

    #[test]
    fn an_allocation_of_several_gpus_moves_whole_to_another_node_with_as_many() {
        let mut model = Model::default();
        model.nodes.insert("a".into(), node("a", "192.0.2.1", &[(80, 16_384); 2]));
        model.nodes.insert("b".into(), node("b", "192.0.2.2", &[(80, 16_384)]));
        let mut three = node("c", "192.0.2.3", &[(80, 16_384), (80, 16_384), (40, 16_384)]);
        link(&mut three, 1, 2, GpuLinkKind::NvLink);
        model.nodes.insert("c".into(), three);
        allocate(&mut model, "pair", &VmRequirement { gpus: 2, ..vm("10.0.0.1", "192.0.2.1", 30, 4096) });
        let pair = model.allocations["pair"].clone();
        assert_eq!(pair.node_id, "a");
        // 'b' has one GPU: too few, said so.
        let error = model.check_move_set(&pair, "b", None).unwrap_err().to_string();
        assert!(error.starts_with("target full: b has 1 of the 2 GPUs with room for the slice"), "{error}");
        // 'c': its NVLink pair (1 and 2), the percentage from the first's SMs.
        let (gpus, percentage) = model.check_move_set(&pair, "c", None).unwrap();
        let mut sorted = gpus.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![1, 2], "{gpus:?}");
        let first_sms = if gpus[0] == 2 { 40 } else { 80 };
        assert_eq!(percentage, sm_percentage(30, first_sms));
        // A named GPU comes first; one without room is refused.
        assert_eq!(model.check_move_set(&pair, "c", Some(0)).unwrap().0[0], 0);
        let error = model.check_move_set(&pair, "a", None).unwrap_err().to_string();
        assert!(error.contains("moves to another node only"), "{error}");
        let error = model.check_move_set(&pair, "c", Some(7)).unwrap_err().to_string();
        assert!(error.contains("no GPU 7"), "{error}");
        // While it moves, every GPU of both ends holds the slice.
        model.allocations.get_mut("pair").unwrap().pending_move = Some(flyt_protocol::control::cluster::PendingMove {
            from_node: "a".into(),
            from_gpu: pair.gpu,
            to_node: "c".into(),
            to_gpu: gpus[0],
            to_sm_percentage: percentage,
            phase: flyt_protocol::control::cluster::MovePhase::Switching,
            from_extra_gpus: pair.extra_gpus.clone(),
            to_extra_gpus: gpus[1..].to_vec(),
        });
        // The record names the target once Switching: the source's GPUs still count.
        let record = model.allocations.get_mut("pair").unwrap();
        record.node_id = "c".into();
        record.gpu = gpus[0];
        record.extra_gpus = gpus[1..].to_vec();
        for (node, gpu) in [("a", 0), ("a", 1), ("c", 1), ("c", 2)] {
            assert_eq!(model.gpu_used(node, gpu, None), (30, 4096, 1), "{node}/{gpu}");
        }
        assert_eq!(model.gpu_used("c", 0, None), (0, 0, 0));
        let error = model.check_move_set(&model.allocations["pair"].clone(), "c", Some(0)).unwrap_err().to_string();
        assert!(error.contains("moves to another node only"), "{error}");
    }

    /// An allocation on GPUs `gpus` of node `a` (`gpus[0]` first), of `units` SMs and `memory`
    /// MiB on each.
    fn on_gpus(model: &mut Model, id: &str, vm_ip: &str, gpus: &[u32], units: u32, memory: u64) {
        allocate(model, id, &vm(vm_ip, "192.0.2.1", 1, 1));
        let record = model.allocations.get_mut(id).unwrap();
        (record.node_id, record.gpu, record.extra_gpus) = ("a".into(), gpus[0], gpus[1..].to_vec());
        (record.compute_units, record.memory) = (units, memory);
    }

    #[test]
    fn one_gpu_of_an_allocation_moves_within_its_node_when_the_gpus_that_stay_hold_a_second_slice() {
        let mut model = Model::default();
        model.nodes.insert("a".into(), node("a", "192.0.2.1", &[(80, 16_384), (80, 16_384), (40, 16_384), (80, 16_384)]));
        model.nodes.insert("b".into(), node("b", "192.0.2.2", &[(80, 16_384); 3]));
        on_gpus(&mut model, "pair", "10.0.0.1", &[0, 1], 30, 4096);
        // GPU 3 is taken by another allocation, so GPU 2 (40 SMs) is the only one with room.
        on_gpus(&mut model, "big", "10.0.0.2", &[3], 60, 4096);
        let pair = model.allocations["pair"].clone();
        // Index 1 to GPU 2: the others stay at their indices; the percentage is of the first GPU.
        assert_eq!(model.check_move_one_gpu(&pair, 1, "a", Some(2)).unwrap(), (vec![0, 2], sm_percentage(30, 80)));
        assert_eq!(model.check_move_one_gpu(&pair, 1, "a", None).unwrap().0, vec![0, 2], "the one GPU with room");
        // Index 0: the new GPU becomes the first, its SMs give the percentage.
        assert_eq!(model.check_move_one_gpu(&pair, 0, "a", Some(2)).unwrap(), (vec![2, 1], sm_percentage(30, 40)));
        let refused = |model: &Model, index: u32, node: &str, gpu: Option<u32>| {
            model.check_move_one_gpu(&model.allocations["pair"], index, node, gpu).unwrap_err().to_string()
        };
        let error = refused(&model, 2, "a", Some(2));
        assert!(error.contains("has 2 GPU(s) (a/0,1): there is no GPU at index 2 (0 to 1)"), "{error}");
        let error = refused(&model, 1, "a", Some(0));
        assert!(error.contains("GPU 0 of a is already in allocation pair (at index 0 of 0,1)"), "{error}");
        let error = refused(&model, 1, "a", Some(7));
        assert!(error.contains("node a has no GPU 7"), "{error}");
        let error = refused(&model, 1, "b", Some(2));
        assert!(error.contains("moves to another GPU of that node only") && error.contains("--to b"), "{error}");
        let error = refused(&model, 1, "a", Some(3));
        assert!(error.starts_with("target full: a GPU 3 has 20 SMs and 12288 MiB free"), "{error}");
        // GPU 0 stays: with a third allocation of 30 SMs there it has 20 free, short of a second
        // slice of 30.
        on_gpus(&mut model, "third", "10.0.0.3", &[0], 30, 1024);
        let error = refused(&model, 1, "a", Some(2));
        assert!(
            error.contains("a GPU 0 (index 0, which stays) has 20 SMs and 11264 MiB free")
                && error.contains("room for a second slice of 30 SMs and 4096 MiB"),
            "{error}"
        );
        // Moving index 0 away leaves GPU 1 to stay, which has room.
        assert_eq!(model.check_move_one_gpu(&model.allocations["pair"], 0, "a", Some(2)).unwrap().0, vec![2, 1]);
        model.allocations.remove("third");
        // A spread allocation is refused.
        let mut spread = model.allocations["pair"].clone();
        spread.further.push(NodeShare {
            node_id: "b".into(),
            gpu: 0,
            extra_gpus: Vec::new(),
            address_window: 1,
            sm_percentage: 40,
            addresses: Vec::new(),
            pid: 0,
            sessions: 0,
            metrics: None,
        });
        let error = model.check_move_one_gpu(&spread, 1, "a", Some(2)).unwrap_err().to_string();
        assert!(error.contains("is spread over nodes"), "{error}");
        // While it moves (0,1 to 0,2), GPU 0 holds both servers' slices, 1 and 2 one each.
        model.allocations.get_mut("pair").unwrap().pending_move = Some(flyt_protocol::control::cluster::PendingMove {
            from_node: "a".into(),
            from_gpu: 0,
            to_node: "a".into(),
            to_gpu: 0,
            to_sm_percentage: 38,
            phase: flyt_protocol::control::cluster::MovePhase::Copying,
            from_extra_gpus: vec![1],
            to_extra_gpus: vec![2],
        });
        assert_eq!(model.gpu_used("a", 0, None), (60, 8192, 1));
        assert_eq!(model.gpu_used("a", 1, None), (30, 4096, 1));
        assert_eq!(model.gpu_used("a", 2, None), (30, 4096, 1));
        // Once Switching the record names the new set; the count is the same.
        let record = model.allocations.get_mut("pair").unwrap();
        record.extra_gpus = vec![2];
        assert_eq!(model.gpu_used("a", 0, None), (60, 8192, 1));
        assert_eq!(model.gpu_used("a", 1, None), (30, 4096, 1));
        // Over: only the new set holds slices.
        model.allocations.get_mut("pair").unwrap().pending_move = None;
        assert_eq!((model.gpu_used("a", 0, None), model.gpu_used("a", 1, None)), ((30, 4096, 1), (0, 0, 0)));
    }

    #[test]
    fn a_move_under_way_holds_room_on_both_gpus() {
        let mut model = model();
        allocate(&mut model, "x1", &vm("10.0.0.1", "192.0.2.1", 30, 4096));
        model.allocations.get_mut("x1").unwrap().pending_move = Some(flyt_protocol::control::cluster::PendingMove {
            from_node: "a".into(),
            from_gpu: 0,
            to_node: "b".into(),
            to_gpu: 1,
            to_sm_percentage: 75,
            phase: flyt_protocol::control::cluster::MovePhase::Copying,
            from_extra_gpus: Vec::new(),
            to_extra_gpus: Vec::new(),
        });
        assert_eq!(model.gpu_used("a", 0, None), (30, 4096, 1));
        assert_eq!(model.gpu_used("b", 1, None), (30, 4096, 1));
        assert_eq!(model.gpu_used("b", 0, None), (0, 0, 0));
    }

    #[test]
    fn apps_on_the_servers_host_get_its_unix_socket() {
        let both = vec!["192.0.2.1:4000".to_string(), "unix:/run/flyt/servers/x.sock".to_string()];
        assert_eq!(data_address(&both, true).as_deref(), Some("unix:/run/flyt/servers/x.sock"));
        assert_eq!(data_address(&both, false).as_deref(), Some("192.0.2.1:4000"));
        assert_eq!(data_address(&both[1..], false).as_deref(), Some("unix:/run/flyt/servers/x.sock"));
        assert_eq!(data_address(&[], true), None);
    }

    #[test]
    fn sm_percentages_round_up() {
        assert_eq!(sm_percentage(33, 132), 25);
        assert_eq!(sm_percentage(34, 132), 26);
        assert_eq!(sm_percentage(200, 132), 100);
        assert_eq!(sm_percentage(0, 132), 1);
    }

    #[test]
    fn idleness_follows_clients_and_sessions() {
        let mut model = model();
        allocate(&mut model, "x1", &vm("10.0.0.1", "192.0.2.1", 1, 1));
        let allocation = model.allocations.get_mut("x1").unwrap();
        refresh_idle(allocation, 10);
        assert_eq!(allocation.idle_since, Some(10));
        refresh_idle(allocation, 20);
        assert_eq!(allocation.idle_since, Some(10), "idle since the first time it was seen idle");
        add_client(allocation, &ClientIdentity { pid: 5, ..Default::default() }, 30);
        add_client(allocation, &ClientIdentity { pid: 5, ..Default::default() }, 30);
        assert_eq!((allocation.clients.len(), allocation.idle_since), (1, None));
    }
}
