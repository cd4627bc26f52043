//! `metrics_listen`: Prometheus metrics of this node at `http://host:port/metrics`, read at each
//! scrape from the rpc-servers' reports: per GPU, its slices (rpc-servers), SMs and memory in
//! all and held by slices, memory the sessions use, sessions; per GPU of each allocation, the
//! SMs and memory its slice holds there (a server of several GPUs holds a slice on each); and
//! whether MPS runs.

use flyt_daemon_kit::metrics::{Labels, Registry, Series};
use flyt_protocol::control::cluster::{GpuInfo, ServerReport};

/// The exposition text: `mps_up` is `None` when this node does not run MPS.
pub fn render(node: &str, gpus: &[GpuInfo], reports: &[ServerReport], mps_up: Option<bool>) -> String {
    let labels = |gpu: &GpuInfo| -> Labels { vec![("node", node.to_string()), ("gpu", gpu.index.to_string())] };
    let per_gpu = |value: &dyn Fn(&GpuInfo, &[&ServerReport]) -> u64| {
        Series::Gauges(
            gpus.iter()
                .map(|gpu| {
                    let on_gpu: Vec<&ServerReport> = reports.iter().filter(|report| serves(report, gpu.index)).collect();
                    (labels(gpu), i64::try_from(value(gpu, &on_gpu)).unwrap_or(i64::MAX))
                })
                .collect(),
        )
    };
    let mut registry = Registry::with_prefix("flyt_node");
    registry.register("slices", "rpc-servers (allocations) on the GPU", per_gpu(&|_, on| on.len() as u64));
    registry.register("sms", "Streaming multiprocessors of the GPU", per_gpu(&|gpu, _| u64::from(gpu.sm_count)));
    registry.register(
        "sms_allocated",
        "SMs the slices hold (their MPS active-thread percentage of the GPU's SMs)",
        per_gpu(&|gpu, on| on.iter().map(|report| u64::from(report.sm_percentage.min(100)) * u64::from(gpu.sm_count) / 100).sum::<u64>()),
    );
    registry.register("memory_bytes", "Memory of the GPU", per_gpu(&|gpu, _| gpu.memory_bytes));
    registry.register(
        "memory_allocated_bytes",
        "Memory the slices may hold (their quotas)",
        per_gpu(&|_, on| on.iter().map(|report| report.memory_quota_bytes).sum()),
    );
    registry.register(
        "memory_used_bytes",
        "Memory the slices' sessions hold now",
        per_gpu(&|_, on| on.iter().map(|report| report.memory_used_bytes).sum()),
    );
    registry.register("sessions", "Sessions the slices serve", per_gpu(&|_, on| on.iter().map(|report| u64::from(report.sessions)).sum()));
    // One series per GPU of each allocation: a server of several GPUs holds a slice on each.
    let per_slice = |value: &dyn Fn(&GpuInfo, &ServerReport) -> u64| {
        Series::Gauges(
            reports
                .iter()
                .flat_map(|report| std::iter::once(report.gpu).chain(report.extra_gpus.iter().copied()).map(move |index| (report, index)))
                .filter_map(|(report, index)| {
                    let gpu = gpus.iter().find(|gpu| gpu.index == index)?;
                    let labels = vec![("node", node.to_string()), ("gpu", index.to_string()), ("allocation", report.allocation_id.clone())];
                    Some((labels, i64::try_from(value(gpu, report)).unwrap_or(i64::MAX)))
                })
                .collect(),
        )
    };
    registry.register(
        "slice_sms",
        "SMs an allocation's slice holds on the GPU",
        per_slice(&|gpu, report| u64::from(report.sm_percentage.min(100)) * u64::from(gpu.sm_count) / 100),
    );
    registry.register(
        "slice_memory_bytes",
        "Memory an allocation's slice may hold on the GPU (its quota)",
        per_slice(&|_, report| report.memory_quota_bytes),
    );
    if let Some(up) = mps_up {
        registry.register(
            "mps_up",
            "Whether the MPS control daemon runs (1) or not (0)",
            Series::gauge(vec![("node", node.to_string())], u64::from(up)),
        );
    }
    flyt_daemon_kit::metrics::encode(&registry)
}

/// Whether `report`'s server serves GPU `index` (its first GPU or one of the others).
fn serves(report: &ServerReport, index: u32) -> bool {
    report.gpu == index || report.extra_gpus.contains(&index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(gpu: u32, sm_percentage: u32, quota_mib: u64, used_mib: u64, sessions: u32) -> ServerReport {
        ServerReport {
            allocation_id: format!("alloc-{gpu}-{sm_percentage}"),
            gpu,
            extra_gpus: Vec::new(),
            pid: 1,
            addresses: Vec::new(),
            memory_quota_bytes: quota_mib << 20,
            sm_percentage,
            sessions,
            memory_used_bytes: used_mib << 20,
            metrics: None,
        }
    }

    /// An emulated GPU of 8 GiB and 80 SMs.
    fn gpu(index: u32) -> GpuInfo {
        GpuInfo { index, uuid: String::new(), name: "g".into(), memory_bytes: 8 << 30, sm_count: 80, emulated: true, links: Vec::new() }
    }

    #[test]
    fn each_gpu_sums_its_own_slices() {
        let text = render(
            "n1",
            &[gpu(0), gpu(1)],
            &[report(0, 25, 1024, 10, 2), report(0, 50, 2048, 0, 0), report(1, 100, 512, 1, 1)],
            Some(false),
        );
        assert!(text.contains("flyt_node_slices{node=\"n1\",gpu=\"0\"} 2"), "{text}");
        assert!(text.contains("flyt_node_sms_allocated{node=\"n1\",gpu=\"0\"} 60"), "{text}");
        assert!(text.contains("flyt_node_memory_allocated_bytes{node=\"n1\",gpu=\"0\"} 3221225472"), "{text}");
        assert!(text.contains("flyt_node_sessions{node=\"n1\",gpu=\"1\"} 1"), "{text}");
        assert!(text.contains("flyt_node_mps_up{node=\"n1\"} 0"), "{text}");
        assert!(!render("n1", &[gpu(0)], &[], None).contains("mps_up"));
    }

    #[test]
    fn a_server_of_two_gpus_holds_a_slice_on_each() {
        let pair = ServerReport { allocation_id: "alloc-pair".into(), extra_gpus: vec![1], ..report(0, 50, 1024, 0, 1) };
        let text = render("n1", &[gpu(0), gpu(1)], &[pair], None);
        for gpu in ["0", "1"] {
            assert!(text.contains(&format!("flyt_node_slices{{node=\"n1\",gpu=\"{gpu}\"}} 1")), "{text}");
            assert!(text.contains(&format!("flyt_node_sms_allocated{{node=\"n1\",gpu=\"{gpu}\"}} 40")), "{text}");
            assert!(text.contains(&format!("flyt_node_slice_sms{{node=\"n1\",gpu=\"{gpu}\",allocation=\"alloc-pair\"}} 40")), "{text}");
            assert!(
                text.contains(&format!("flyt_node_slice_memory_bytes{{node=\"n1\",gpu=\"{gpu}\",allocation=\"alloc-pair\"}} 1073741824")),
                "{text}"
            );
        }
    }
}
