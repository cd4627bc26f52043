//! `--metrics-listen host:port`: Prometheus metrics of this server's allocation at
//! `http://host:port/metrics`, read at each scrape from the workers' counters (`stats.rs`), the
//! budget page and the live sessions. A plain HTTP/1.0 responder on one thread: scrapes are rare
//! and small.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::listener::Server;
use crate::stats::{Copied, LATENCY_BOUNDS};

/// Starts the endpoint's thread; returns the address bound (`host:port`, the port resolved), or
/// `Err` if the address cannot be bound.
pub fn start(server: Arc<Server>, address: &str) -> anyhow::Result<String> {
    let listener = TcpListener::bind(address).with_context(|| format!("metrics address {address}"))?;
    let bound = listener.local_addr().map_or_else(|_| address.to_string(), |address| address.to_string());
    tracing::info!("metrics on http://{bound}/metrics");
    let shown = bound.clone();
    std::thread::Builder::new().name("flyt-metrics".into()).spawn(move || {
        for stream in listener.incoming().flatten() {
            if let Err(error) = answer(&server, stream) {
                tracing::debug!(%error, "metrics request failed");
            }
        }
    })?;
    Ok(shown)
}

fn answer(server: &Server, mut stream: TcpStream) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut request = [0u8; 1024];
    let read = stream.read(&mut request)?;
    let line = String::from_utf8_lossy(&request[..read]);
    let (status, content_type, body) = if line.starts_with("GET /metrics ") || line.starts_with("GET /metrics?") {
        ("200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", render(server))
    } else {
        ("404 Not Found", "text/plain; charset=utf-8", "only /metrics is served here\n".to_string())
    };
    write!(stream, "HTTP/1.0 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
}

type Labels = Vec<(&'static str, String)>;

/// Series counted elsewhere (the workers' pages), encoded as they are at the scrape.
#[derive(Debug)]
enum Counted {
    Counters(Vec<(Labels, u64)>),
    Gauges(Vec<(Labels, i64)>),
    /// Labels, per-bucket counts (upper bound, count), count, sum.
    Histogram(Labels, Vec<(f64, u64)>, u64, f64),
}

impl EncodeMetric for Counted {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        match self {
            Self::Counters(series) => {
                for (labels, value) in series {
                    encoder.encode_family(labels)?.encode_counter::<NoLabelSet, _, u64>(value, None)?;
                }
            }
            Self::Gauges(series) => {
                for (labels, value) in series {
                    encoder.encode_family(labels)?.encode_gauge(value)?;
                }
            }
            Self::Histogram(labels, buckets, count, sum) => {
                encoder.encode_family(labels)?.encode_histogram::<NoLabelSet>(*sum, *count, buckets, None)?;
            }
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        match self {
            Self::Counters(_) => MetricType::Counter,
            Self::Gauges(_) => MetricType::Gauge,
            Self::Histogram(..) => MetricType::Histogram,
        }
    }
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
    let gauge = |value: u64| Counted::Gauges(vec![(base(), i64::try_from(value).unwrap_or(i64::MAX))]);
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
        Counted::Counters(ops.iter().map(|(op, calls, _)| (with(&[("op", op)]), *calls)).collect()),
    );
    registry.register(
        "errors",
        "Requests that failed (their reply or their deferred error), by op",
        Counted::Counters(ops.iter().filter(|(_, _, failed)| *failed > 0).map(|(op, _, failed)| (with(&[("op", op)]), *failed)).collect()),
    );
    registry.register("kernels_launched", "Kernels launched", Counted::Counters(vec![(base(), counts.kernels())]));
    registry.register(
        "copied_bytes",
        "Bytes copied between host and device, by direction and path",
        Counted::Counters(
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
        "call_duration_seconds",
        "Time from a request's arrival to its reply, for calls with a reply (timed while metrics are on)",
        Counted::Histogram(base(), bounds.zip(buckets).collect(), count, sum),
    );
    let mut text = String::new();
    if prometheus_client::encoding::text::encode(&mut text, &registry).is_err() {
        text = "# the metrics could not be encoded\n".into();
    }
    text
}
