//! `metrics_listen`: Prometheus metrics of the cluster at `http://host:port/metrics`: nodes by
//! health, GPUs, free and total compute units and memory (in all and per GPU), allocations by
//! state, each allocation's SMs and memory on each of its GPUs (labelled with the device number
//! its apps see), placements granted and refused, moves done and refused, node calls that
//! failed, and each store operation's latency and failures.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use flyt_daemon_kit::metrics::{CONTROL_LATENCY_BOUNDS, Histogram, Labels, Registry, Series};
use flyt_protocol::control::cluster::{AllocationRecord, GpuInfo, NodeRecord, VmRequirement};

use crate::store::{Store, StoreError, StoredState};

/// The store's operations, by their index in the metrics' arrays.
#[derive(Clone, Copy)]
enum StoreOp {
    Load,
    PutVm,
    RemoveVm,
    PutNode,
    PutGpus,
    PutAllocation,
    RemoveAllocation,
}

/// Each [`StoreOp`]'s label, in its order.
const STORE_OPS: [&str; 7] = ["load", "put_vm", "remove_vm", "put_node", "put_gpus", "put_allocation", "remove_allocation"];

/// Counters the cluster manager keeps for its metrics.
#[derive(Debug)]
pub struct ClusterMetrics {
    pub placements_granted: AtomicU64,
    pub placements_refused: AtomicU64,
    /// `migrate` calls that moved the allocation, and those that left it where it was.
    pub moves_done: AtomicU64,
    pub moves_refused: AtomicU64,
    pub node_call_failures: AtomicU64,
    store_latency: Vec<Histogram>,
    store_failures: Vec<AtomicU64>,
}

impl Default for ClusterMetrics {
    fn default() -> Self {
        Self {
            placements_granted: AtomicU64::new(0),
            placements_refused: AtomicU64::new(0),
            moves_done: AtomicU64::new(0),
            moves_refused: AtomicU64::new(0),
            node_call_failures: AtomicU64::new(0),
            store_latency: STORE_OPS.iter().map(|_| Histogram::new(&CONTROL_LATENCY_BOUNDS)).collect(),
            store_failures: STORE_OPS.iter().map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl ClusterMetrics {
    pub fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn store_op(&self, op: StoreOp, started: Instant, failed: bool) {
        self.store_latency[op as usize].observe(started.elapsed());
        if failed {
            self.store_failures[op as usize].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A store whose every operation is timed into [`ClusterMetrics`].
pub struct TimedStore<S> {
    inner: S,
    metrics: Arc<ClusterMetrics>,
}

impl<S> TimedStore<S> {
    pub fn new(inner: S, metrics: Arc<ClusterMetrics>) -> Self {
        Self { inner, metrics }
    }

    async fn timed<T>(&self, op: StoreOp, operation: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
        let started = Instant::now();
        let result = operation.await;
        self.metrics.store_op(op, started, result.is_err());
        result
    }
}

impl<S: Store> Store for TimedStore<S> {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn load(&self) -> impl Future<Output = Result<StoredState, StoreError>> + Send {
        self.timed(StoreOp::Load, self.inner.load())
    }

    fn put_vm(&self, vm: &VmRequirement) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.timed(StoreOp::PutVm, self.inner.put_vm(vm))
    }

    fn remove_vm(&self, vm_ip: &str) -> impl Future<Output = Result<bool, StoreError>> + Send {
        self.timed(StoreOp::RemoveVm, self.inner.remove_vm(vm_ip))
    }

    fn put_node(&self, node: &NodeRecord) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.timed(StoreOp::PutNode, self.inner.put_node(node))
    }

    fn put_gpus(&self, node_id: &str, gpus: &[GpuInfo]) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.timed(StoreOp::PutGpus, self.inner.put_gpus(node_id, gpus))
    }

    fn put_allocation(&self, allocation: &AllocationRecord) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.timed(StoreOp::PutAllocation, self.inner.put_allocation(allocation))
    }

    fn remove_allocation(&self, id: &str) -> impl Future<Output = Result<bool, StoreError>> + Send {
        self.timed(StoreOp::RemoveAllocation, self.inner.remove_allocation(id))
    }
}

/// What the model holds at the scrape.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub nodes_up: u64,
    pub nodes_down: u64,
    pub nodes_drained: u64,
    pub gpus: u64,
    pub compute_units_total: u64,
    pub compute_units_free: u64,
    pub memory_total_bytes: u64,
    pub memory_free_bytes: u64,
    pub vms: u64,
    pub client_managers: u64,
    pub allocations_starting: u64,
    pub allocations_running: u64,
    pub allocations_resizing: u64,
    pub allocations_moving: u64,
    /// Each GPU of an up node with what allocations hold of it.
    pub gpus_used: Vec<GpuUse>,
    /// Each GPU of each allocation, in the order its apps number them.
    pub allocated_gpus: Vec<AllocatedGpuUse>,
}

/// One GPU and what allocations hold of it.
#[derive(Debug, Default)]
pub struct GpuUse {
    pub node: String,
    pub gpu: u32,
    pub compute_units_total: u64,
    pub compute_units_allocated: u64,
    pub memory_total_bytes: u64,
    pub memory_allocated_bytes: u64,
}

/// One GPU of an allocation: the slice it holds there.
#[derive(Debug, Default)]
pub struct AllocatedGpuUse {
    pub allocation: String,
    pub vm: String,
    /// The device number the allocation's apps see it as.
    pub device: usize,
    pub node: String,
    pub gpu: u32,
    pub compute_units: u64,
    pub memory_bytes: u64,
}

/// The exposition text.
pub fn render(metrics: &ClusterMetrics, snapshot: &Snapshot) -> String {
    let by = |key: &'static str, values: &[(&str, u64)]| {
        Series::Gauges(
            values.iter().map(|(label, value)| (vec![(key, (*label).to_string())], i64::try_from(*value).unwrap_or(i64::MAX))).collect(),
        )
    };
    let counter = |value: &AtomicU64| Series::Counters(vec![(Labels::new(), value.load(Ordering::Relaxed))]);
    let mut registry = Registry::with_prefix("flyt_cluster");
    registry.register(
        "nodes",
        "Node managers by health (drained nodes are also counted as up or down)",
        by("health", &[("up", snapshot.nodes_up), ("down", snapshot.nodes_down), ("drained", snapshot.nodes_drained)]),
    );
    registry.register("gpus", "GPUs on nodes that are up", Series::gauge(Labels::new(), snapshot.gpus));
    registry.register(
        "compute_units",
        "SMs on nodes that are up: all of them, and those no allocation holds",
        by("state", &[("total", snapshot.compute_units_total), ("free", snapshot.compute_units_free)]),
    );
    registry.register(
        "memory_bytes",
        "GPU memory on nodes that are up: all of it, and what no allocation holds",
        by("state", &[("total", snapshot.memory_total_bytes), ("free", snapshot.memory_free_bytes)]),
    );
    let per_gpu = |value: &dyn Fn(&GpuUse) -> (u64, u64)| {
        Series::Gauges(
            snapshot
                .gpus_used
                .iter()
                .flat_map(|used| {
                    let (total, allocated) = value(used);
                    let labels =
                        |state: &str| vec![("node", used.node.clone()), ("gpu", used.gpu.to_string()), ("state", state.to_string())];
                    [(labels("total"), total), (labels("allocated"), allocated)]
                })
                .map(|(labels, value)| (labels, i64::try_from(value).unwrap_or(i64::MAX)))
                .collect(),
        )
    };
    registry.register(
        "gpu_compute_units",
        "SMs of each GPU on nodes that are up: all of them, and those allocations hold",
        per_gpu(&|used| (used.compute_units_total, used.compute_units_allocated)),
    );
    registry.register(
        "gpu_memory_bytes",
        "Memory of each GPU on nodes that are up: all of it, and what allocations hold",
        per_gpu(&|used| (used.memory_total_bytes, used.memory_allocated_bytes)),
    );
    let per_allocated_gpu = |value: &dyn Fn(&AllocatedGpuUse) -> u64| {
        Series::Gauges(
            snapshot
                .allocated_gpus
                .iter()
                .map(|slice| {
                    let labels = vec![
                        ("allocation", slice.allocation.clone()),
                        ("vm", slice.vm.clone()),
                        ("device", slice.device.to_string()),
                        ("node", slice.node.clone()),
                        ("gpu", slice.gpu.to_string()),
                    ];
                    (labels, i64::try_from(value(slice)).unwrap_or(i64::MAX))
                })
                .collect(),
        )
    };
    registry.register(
        "allocation_gpu_compute_units",
        "SMs an allocation holds on each of its GPUs (device: the number its apps see it as)",
        per_allocated_gpu(&|slice| slice.compute_units),
    );
    registry.register(
        "allocation_gpu_memory_bytes",
        "Memory an allocation holds on each of its GPUs (device: the number its apps see it as)",
        per_allocated_gpu(&|slice| slice.memory_bytes),
    );
    registry.register("vms", "VMs with a resource requirement", Series::gauge(Labels::new(), snapshot.vms));
    registry.register("client_managers", "Client managers reporting", Series::gauge(Labels::new(), snapshot.client_managers));
    registry.register(
        "allocations",
        "Allocations by state (resizing and moving ones are also counted as running)",
        by(
            "state",
            &[
                ("starting", snapshot.allocations_starting),
                ("running", snapshot.allocations_running),
                ("resizing", snapshot.allocations_resizing),
                ("moving", snapshot.allocations_moving),
            ],
        ),
    );
    registry.register("placements_granted", "Allocation requests granted", counter(&metrics.placements_granted));
    registry.register(
        "placements_refused",
        "Allocation requests refused (no room, unknown VM, a node that failed...)",
        counter(&metrics.placements_refused),
    );
    registry.register(
        "moves",
        "Allocations moved to another node (`flytctl migrate`), and moves that left them where they were",
        Series::Counters(vec![
            (vec![("outcome", "moved".to_string())], metrics.moves_done.load(Ordering::Relaxed)),
            (vec![("outcome", "refused".to_string())], metrics.moves_refused.load(Ordering::Relaxed)),
        ]),
    );
    registry.register("node_call_failures", "Calls to node managers that failed to reach them", counter(&metrics.node_call_failures));
    registry.register(
        "store_failures",
        "Store operations that failed, by operation",
        Series::Counters(
            STORE_OPS
                .iter()
                .zip(&metrics.store_failures)
                .map(|(op, failed)| (vec![("op", (*op).to_string())], failed.load(Ordering::Relaxed)))
                .collect(),
        ),
    );
    registry.register(
        "store_duration_seconds",
        "Time each store operation took, by operation",
        Series::Histograms(
            STORE_OPS.iter().zip(&metrics.store_latency).map(|(op, latency)| latency.snapshot(vec![("op", (*op).to_string())])).collect(),
        ),
    );
    flyt_daemon_kit::metrics::encode(&registry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_gpu_and_each_allocations_gpu_is_a_series() {
        let snapshot = Snapshot {
            gpus_used: vec![GpuUse {
                node: "node-b".into(),
                gpu: 0,
                compute_units_total: 40,
                compute_units_allocated: 20,
                memory_total_bytes: 4 << 30,
                memory_allocated_bytes: 1 << 30,
            }],
            allocated_gpus: vec![
                AllocatedGpuUse {
                    allocation: "alloc-1".into(),
                    vm: "10.0.0.1".into(),
                    device: 0,
                    node: "node-a".into(),
                    gpu: 0,
                    compute_units: 20,
                    memory_bytes: 1 << 30,
                },
                AllocatedGpuUse {
                    allocation: "alloc-1".into(),
                    vm: "10.0.0.1".into(),
                    device: 1,
                    node: "node-b".into(),
                    gpu: 0,
                    compute_units: 20,
                    memory_bytes: 1 << 30,
                },
            ],
            ..Snapshot::default()
        };
        let text = render(&ClusterMetrics::default(), &snapshot);
        for line in [
            "flyt_cluster_gpu_compute_units{node=\"node-b\",gpu=\"0\",state=\"allocated\"} 20",
            "flyt_cluster_gpu_memory_bytes{node=\"node-b\",gpu=\"0\",state=\"total\"} 4294967296",
            "flyt_cluster_allocation_gpu_compute_units{allocation=\"alloc-1\",vm=\"10.0.0.1\",device=\"1\",node=\"node-b\",gpu=\"0\"} 20",
            "flyt_cluster_allocation_gpu_memory_bytes{allocation=\"alloc-1\",vm=\"10.0.0.1\",device=\"0\",node=\"node-a\",gpu=\"0\"} 1073741824",
        ] {
            assert!(text.contains(line), "missing {line}:\n{text}");
        }
    }
}
