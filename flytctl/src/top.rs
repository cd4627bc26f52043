//! `flytctl top`: a live view of the allocations. Every refresh lists them through the cluster
//! manager and scrapes each one's rpc-server metrics (the address the node manager reported), then
//! shows rates between this scrape and the last: calls, copy bandwidth, errors.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use comfy_table::Table;
use flyt_protocol::control::cluster::AllocationRecord;
use serde::Serialize;

/// What one scrape of a server's metrics says (sums over its series).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    pub sessions: f64,
    pub memory_used: f64,
    pub memory_quota: f64,
    pub calls: f64,
    pub errors: f64,
    pub copied_bytes: f64,
    pub kernels: f64,
    /// Oversubscription (`docs/design/paging.md`): sessions resident (`None`: paging off), and
    /// bytes the live sessions had paged out and in.
    pub sessions_resident: Option<f64>,
    pub paged_bytes: f64,
}

/// Sums the series of a Prometheus text exposition into a `Sample`.
pub fn parse(text: &str) -> Sample {
    let mut sample = Sample::default();
    for line in text.lines().filter(|line| !line.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let Ok(value) = value.parse::<f64>() else { continue };
        let name = series.split('{').next().unwrap_or(series);
        let slot = match name {
            "flyt_rpc_sessions" => &mut sample.sessions,
            "flyt_rpc_memory_used_bytes" => &mut sample.memory_used,
            "flyt_rpc_memory_quota_bytes" => &mut sample.memory_quota,
            "flyt_rpc_calls_total" => &mut sample.calls,
            "flyt_rpc_errors_total" => &mut sample.errors,
            "flyt_rpc_copied_bytes_total" => &mut sample.copied_bytes,
            "flyt_rpc_kernels_launched_total" => &mut sample.kernels,
            "flyt_rpc_sessions_resident" => sample.sessions_resident.get_or_insert(0.0),
            "flyt_rpc_session_paged_out_bytes_total" | "flyt_rpc_session_paged_in_bytes_total" => &mut sample.paged_bytes,
            _ => continue,
        };
        *slot += value;
    }
    sample
}

/// Fetches `http://address/metrics` (blocking, bounded by `timeout`).
pub fn scrape(address: &str, timeout: Duration) -> Result<String, String> {
    let target = address.parse::<std::net::SocketAddr>().map_err(|error| format!("{address}: {error}"))?;
    let mut stream = std::net::TcpStream::connect_timeout(&target, timeout).map_err(|error| format!("{address}: {error}"))?;
    stream.set_read_timeout(Some(timeout)).map_err(|error| error.to_string())?;
    stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").map_err(|error| format!("{address}: {error}"))?;
    let mut response = String::new();
    stream.read_to_string(&mut response).map_err(|error| format!("{address}: {error}"))?;
    match response.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200") => Ok(body.to_string()),
        _ => Err(format!("{address}: {}", response.lines().next().unwrap_or("no answer"))),
    }
}

/// One row of the view.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub allocation: String,
    pub vm: String,
    pub node: String,
    pub gpu: u32,
    pub sm_percentage: u32,
    pub sessions: u64,
    pub memory_used_bytes: u64,
    pub memory_quota_bytes: u64,
    /// Rates since the last refresh; `None` on the first one or without metrics.
    pub calls_per_second: Option<f64>,
    pub copy_bytes_per_second: Option<f64>,
    pub errors_per_second: Option<f64>,
    pub kernels_per_second: Option<f64>,
    /// Sessions whose memory is on the GPU, when the server pages (oversubscription).
    pub sessions_resident: Option<u64>,
    /// Bytes paged out and in per second (the live sessions' counters).
    pub paged_bytes_per_second: Option<f64>,
    /// Why this allocation has no figures (no metrics address, or the scrape failed).
    pub note: Option<String>,
}

/// The rows for `allocations`, given this refresh's samples and the last ones.
pub fn rows(
    allocations: &[AllocationRecord],
    samples: &HashMap<String, Result<(Sample, Instant), String>>,
    previous: &HashMap<String, (Sample, Instant)>,
) -> Vec<Row> {
    allocations
        .iter()
        .map(|allocation| {
            let mut row = Row {
                allocation: allocation.id.clone(),
                vm: allocation.vm_ip.clone(),
                node: allocation.node_id.clone(),
                gpu: allocation.gpu,
                sm_percentage: allocation.sm_percentage,
                sessions: u64::from(allocation.sessions),
                memory_used_bytes: 0,
                memory_quota_bytes: allocation.memory << 20,
                calls_per_second: None,
                copy_bytes_per_second: None,
                errors_per_second: None,
                kernels_per_second: None,
                sessions_resident: None,
                paged_bytes_per_second: None,
                note: None,
            };
            match samples.get(&allocation.id) {
                None => row.note = Some("no metrics address (set the node manager's [rpc_server] metrics_host)".into()),
                Some(Err(reason)) => row.note = Some(reason.clone()),
                Some(Ok((sample, at))) => {
                    row.sessions = whole(sample.sessions);
                    row.memory_used_bytes = whole(sample.memory_used);
                    row.memory_quota_bytes = whole(sample.memory_quota);
                    row.sessions_resident = sample.sessions_resident.map(whole);
                    if let Some((last, then)) = previous.get(&allocation.id) {
                        let seconds = at.duration_since(*then).as_secs_f64();
                        // A restarted server starts its counters again: no rate for that refresh.
                        if seconds > 0.0 && sample.calls >= last.calls {
                            let rate = |now: f64, before: f64| Some(((now - before) / seconds).max(0.0));
                            row.calls_per_second = rate(sample.calls, last.calls);
                            row.copy_bytes_per_second = rate(sample.copied_bytes, last.copied_bytes);
                            row.errors_per_second = rate(sample.errors, last.errors);
                            row.kernels_per_second = rate(sample.kernels, last.kernels);
                            if sample.sessions_resident.is_some() {
                                row.paged_bytes_per_second = rate(sample.paged_bytes, last.paged_bytes);
                            }
                        }
                    }
                }
            }
            row
        })
        .collect()
}

/// A gauge's value as a whole number (they are byte and session counts; junk reads as 0).
#[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "clamped to u64's range first")]
fn whole(value: f64) -> u64 {
    if value.is_finite() && value > 0.0 { value.min(u64::MAX as f64) as u64 } else { 0 }
}

fn shown(value: Option<f64>, scale: f64, digits: usize) -> String {
    value.map_or_else(|| "-".into(), |value| format!("{:.digits$}", value / scale))
}

/// The table of `rows`.
pub fn table(rows: &[Row]) -> Table {
    let mut out = crate::table(&[
        "ALLOCATION",
        "VM",
        "NODE/GPU",
        "SM %",
        "MEMORY (MiB) used/quota",
        "SESSIONS",
        "RESIDENT",
        "PAGED MB/s",
        "CALLS/s",
        "COPY GB/s",
        "KERNELS/s",
        "ERRORS/s",
        "NOTE",
    ]);
    // A live view of fixed columns: wrapped rows would jump at every refresh.
    out.set_content_arrangement(comfy_table::ContentArrangement::Disabled);
    for row in rows {
        out.add_row(vec![
            row.allocation.clone(),
            row.vm.clone(),
            format!("{}/{}", row.node, row.gpu),
            row.sm_percentage.to_string(),
            format!("{} / {}", row.memory_used_bytes >> 20, row.memory_quota_bytes >> 20),
            row.sessions.to_string(),
            row.sessions_resident.map_or_else(|| "-".into(), |resident| resident.to_string()),
            shown(row.paged_bytes_per_second, 1e6, 1),
            shown(row.calls_per_second, 1.0, 0),
            shown(row.copy_bytes_per_second, 1e9, 2),
            shown(row.kernels_per_second, 1.0, 0),
            shown(row.errors_per_second, 1.0, 1),
            row.note.clone().unwrap_or_default(),
        ]);
    }
    out
}

#[cfg(test)]
mod tests {
    use flyt_protocol::control::cluster::AllocationState;

    use super::*;

    const TEXT: &str = "# HELP flyt_rpc_sessions Sessions being served.\n\
        # TYPE flyt_rpc_sessions gauge\n\
        flyt_rpc_sessions{allocation=\"a\"} 2\n\
        flyt_rpc_memory_used_bytes{allocation=\"a\"} 1048576\n\
        flyt_rpc_memory_quota_bytes{allocation=\"a\"} 67108864\n\
        flyt_rpc_calls_total{allocation=\"a\",op=\"Malloc\"} 10\n\
        flyt_rpc_calls_total{allocation=\"a\",op=\"Launch\"} 90\n\
        flyt_rpc_errors_total{allocation=\"a\",op=\"Free\"} 1\n\
        flyt_rpc_copied_bytes_total{allocation=\"a\",direction=\"h2d\",path=\"shm\"} 1000000000\n\
        flyt_rpc_copied_bytes_total{allocation=\"a\",direction=\"d2h\",path=\"socket\"} 0\n\
        flyt_rpc_kernels_launched_total{allocation=\"a\"} 90\n\
        flyt_rpc_call_duration_seconds_count{allocation=\"a\"} 10\n\
        # EOF\n";

    fn allocation(id: &str) -> AllocationRecord {
        AllocationRecord {
            id: id.into(),
            vm_ip: "10.0.0.1".into(),
            node_id: "n".into(),
            compute_units: 10,
            memory: 64,
            sm_percentage: 10,
            state: AllocationState::Running,
            pid: 1,
            metrics: Some("127.0.0.1:1".into()),
            ..AllocationRecord::default()
        }
    }

    #[test]
    fn a_scrape_sums_its_series() {
        let sample = parse(TEXT);
        assert_eq!(
            sample,
            Sample {
                sessions: 2.0,
                memory_used: 1_048_576.0,
                memory_quota: 67_108_864.0,
                calls: 100.0,
                errors: 1.0,
                copied_bytes: 1e9,
                kernels: 90.0,
                ..Sample::default()
            }
        );
    }

    #[test]
    fn a_paging_server_shows_its_resident_sessions_and_paging_rate() {
        let paging = "flyt_rpc_sessions_resident{allocation=\"a\"} 1\n\
            flyt_rpc_session_paged_out_bytes_total{allocation=\"a\",session=\"1\"} 3000000\n\
            flyt_rpc_session_paged_in_bytes_total{allocation=\"a\",session=\"2\"} 1000000\n";
        let start = Instant::now();
        let before = parse(TEXT);
        assert_eq!(before.sessions_resident, None, "no paging series: paging off");
        let after = parse(&format!("{TEXT}{paging}"));
        assert_eq!((after.sessions_resident, after.paged_bytes), (Some(1.0), 4e6));
        let previous = HashMap::from([("a".to_string(), (before, start))]);
        let samples = HashMap::from([("a".to_string(), Ok((after, start + Duration::from_secs(2))))]);
        let rows = rows(&[allocation("a")], &samples, &previous);
        assert_eq!((rows[0].sessions_resident, rows[0].paged_bytes_per_second), (Some(1), Some(2e6)));
        assert!(table(&rows).to_string().contains("PAGED MB/s"));
    }

    #[test]
    fn rates_come_from_two_scrapes_and_a_restart_or_a_missing_address_gives_none() {
        let start = Instant::now();
        let before = parse(TEXT);
        let mut after = before.clone();
        after.calls += 200.0;
        after.copied_bytes += 4e9;
        after.kernels += 100.0;
        let previous = HashMap::from([("a".to_string(), (before.clone(), start))]);
        let samples = HashMap::from([
            ("a".to_string(), Ok((after, start + Duration::from_secs(2)))),
            ("b".to_string(), Err("127.0.0.1:1: connection refused".to_string())),
        ]);
        let rows = rows(&[allocation("a"), allocation("b"), allocation("c")], &samples, &previous);
        assert_eq!(
            (rows[0].calls_per_second, rows[0].copy_bytes_per_second, rows[0].kernels_per_second),
            (Some(100.0), Some(2e9), Some(50.0))
        );
        assert_eq!((rows[0].sessions, rows[0].memory_used_bytes), (2, 1 << 20));
        assert_eq!((rows[1].calls_per_second, rows[1].note.as_deref()), (None, Some("127.0.0.1:1: connection refused")));
        assert!(rows[2].note.as_deref().is_some_and(|note| note.contains("metrics_host")));
        let restarted = HashMap::from([("a".to_string(), Ok((Sample::default(), start + Duration::from_secs(2))))]);
        assert_eq!(super::rows(&[allocation("a")], &restarted, &previous)[0].calls_per_second, None);
        let shown = table(&rows).to_string();
        assert!(shown.contains("COPY GB/s"), "{shown}");
    }
}
