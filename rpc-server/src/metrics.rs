//! `--metrics-listen host:port`: Prometheus metrics of this server's allocation at
//! `http://host:port/metrics`, read at each scrape from the workers' counters (`stats.rs`), the
//! budget page and the live sessions (the responder is the daemons' shared one).

use std::sync::Arc;

use flyt_daemon_kit::metrics::{HistogramSnapshot, Labels, Registry, Series};

use crate::listener::Server;
use crate::stats::{Copied, LATENCY_BOUNDS};

/// Starts the endpoint's thread; returns the address bound (`host:port`, the port resolved), or
/// `Err` if the address cannot be bound.
pub fn start(server: Arc<Server>, address: &str) -> std::io::Result<String> {
    flyt_daemon_kit::metrics::serve(address, "flyt-metrics", move || render(&server))
}

/// The exposition text of every series.
pub fn render(server: &Server) -> String {
    let status = server.status();
    let counts = server.counts();
    let allocation = status.allocation.clone().unwrap_or_default();
    let base = || -> Labels { vec![("allocation", allocation.clone())] };
    let with = |pairs: &[(&'static str, &str)]| -> Labels {
        let mut labels = base();
        labels.extend(pairs.iter().map(|(key, value)| (*key, (*value).to_string())));
        labels
    };
    let gauge = |value: u64| Series::gauge(base(), value);
    let ops: Vec<_> = counts.ops().collect();
    let used: u64 = status.sessions.iter().map(|session| session.memory_used).sum();
    let (buckets, count, sum) = counts.latency();
    let bounds = LATENCY_BOUNDS.iter().copied().chain(std::iter::once(f64::INFINITY));

    let mut registry = Registry::with_prefix("flyt_rpc");
    registry.register("sessions", "Sessions being served", gauge(status.sessions.len() as u64));
    registry.register("memory_used_bytes", "Device memory the sessions hold", gauge(used));
    registry.register("memory_quota_bytes", "Device memory the allocation may hold", gauge(status.memory_quota));
    registry.register("sm_percentage", "SM share of the allocation (MPS active-thread percentage)", gauge(u64::from(status.sm_percentage)));
    registry.register(
        "calls",
        "Requests received, by op",
        Series::Counters(ops.iter().map(|(op, calls, _)| (with(&[("op", op)]), *calls)).collect()),
    );
    registry.register(
        "errors",
        "Requests that failed (their reply or their deferred error), by op",
        Series::Counters(ops.iter().filter(|(_, _, failed)| *failed > 0).map(|(op, _, failed)| (with(&[("op", op)]), *failed)).collect()),
    );
    registry.register("kernels_launched", "Kernels launched", Series::Counters(vec![(base(), counts.kernels())]));
    registry.register(
        "copied_bytes",
        "Bytes copied between host and device, by direction and path",
        Series::Counters(
            Copied::ALL
                .iter()
                .map(|how| {
                    let (direction, path) = how.labels();
                    (with(&[("direction", direction), ("path", path)]), counts.copied(*how))
                })
                .collect(),
        ),
    );
    registry.register(
        "stripe_compression_saved_bytes",
        "Bytes striped copies kept off the network by sending chunks as LZ4 (both directions)",
        Series::Counters(vec![(base(), counts.compression_saved())]),
    );
    registry.register(
        "call_duration_seconds",
        "Time from a request's arrival to its reply, for calls with a reply (timed while metrics are on)",
        Series::Histograms(vec![HistogramSnapshot { labels: base(), buckets: bounds.zip(buckets).collect(), count, sum }]),
    );
    if let Some((capacity, sessions)) = server.paging() {
        register_paging(&mut registry, &with, capacity, &sessions);
    }
    flyt_daemon_kit::metrics::encode(&registry)
}

/// Labels of the allocation with the pairs given.
type LabelsWith<'a> = dyn Fn(&[(&'static str, &str)]) -> Labels + 'a;

/// Oversubscription's series (`docs/design/paging.md`): the resident capacity and sessions, and
/// per session its resident bytes, bytes paged out and in, host memory pinned ahead, and time
/// paused.
fn register_paging(registry: &mut Registry, with: &LabelsWith<'_>, capacity: u64, sessions: &[(u64, crate::paging::SlotView)]) {
    let resident = sessions.iter().filter(|(_, view)| !view.paged).count() as u64;
    registry.register(
        "resident_capacity_bytes",
        "Device memory the sessions may keep resident at once",
        Series::gauge(with(&[]), capacity),
    );
    registry.register("sessions_resident", "Sessions whose memory is on the device (not paged out)", Series::gauge(with(&[]), resident));
    let ids: Vec<String> = sessions.iter().map(|(id, _)| id.to_string()).collect();
    let per_session = |value: &dyn Fn(&crate::paging::SlotView) -> u64| -> Vec<(Labels, u64)> {
        sessions.iter().zip(&ids).map(|((_, view), id)| (with(&[("session", id)]), value(view))).collect()
    };
    let gauges = |values: Vec<(Labels, u64)>| Series::Gauges(values.into_iter().map(|(labels, value)| (labels, value as i64)).collect());
    registry.register("session_resident_bytes", "Device memory the session holds resident", gauges(per_session(&|view| view.resident)));
    registry.register(
        "session_paged_out_bytes",
        "Bytes of the session paged out to host memory",
        Series::Counters(per_session(&|view| view.paged_out_bytes)),
    );
    registry.register(
        "session_paged_in_bytes",
        "Bytes of the session paged back in",
        Series::Counters(per_session(&|view| view.paged_in_bytes)),
    );
    registry.register(
        "session_paging_pinned_bytes",
        "Host memory the session's worker keeps pinned ahead for its page-outs",
        gauges(per_session(&|view| view.pinned)),
    );
    registry.register(
        "session_paused_milliseconds",
        "Time the session spent paged out, up to its last page-in",
        Series::Counters(per_session(&|view| view.paused_ms)),
    );
}
