//! Prometheus metrics for every daemon: a small HTTP/1.0 responder serving `GET /metrics` on its
//! own thread (scrapes are rare and small), series encoded from values read at the scrape
//! ([`Series`]), and a lock-free latency histogram ([`Histogram`]).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
pub use prometheus_client::registry::Registry;

/// Label pairs of one series.
pub type Labels = Vec<(&'static str, String)>;

/// Serves `render()` at `http://address/metrics` from a thread named `thread`; returns the bound
/// address (`host:port`, the port resolved), or `Err` if the address cannot be bound.
pub fn serve(address: &str, thread: &str, render: impl Fn() -> String + Send + 'static) -> std::io::Result<String> {
    let listener =
        TcpListener::bind(address).map_err(|error| std::io::Error::new(error.kind(), format!("metrics address {address}: {error}")))?;
    let bound = listener.local_addr().map_or_else(|_| address.to_string(), |address| address.to_string());
    tracing::info!("metrics on http://{bound}/metrics");
    std::thread::Builder::new().name(thread.into()).spawn(move || {
        for stream in listener.incoming().flatten() {
            if let Err(error) = answer(stream, &render) {
                tracing::debug!(%error, "metrics request failed");
            }
        }
    })?;
    Ok(bound)
}

fn answer(mut stream: TcpStream, render: &impl Fn() -> String) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    // The whole head (a client may send it in pieces), so that closing never drops unread bytes,
    // which would reset the connection under the reply.
    let mut request = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !request.windows(4).any(|window| window == b"\r\n\r\n") && request.len() < 16 << 10 {
        let read = stream.read(&mut chunk)?;
        if read == 0 {
            break;
        }
        request.extend_from_slice(&chunk[..read]);
    }
    let line = String::from_utf8_lossy(&request);
    let (status, content_type, body) = if line.starts_with("GET /metrics ") || line.starts_with("GET /metrics?") {
        ("200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", render())
    } else {
        ("404 Not Found", "text/plain; charset=utf-8", "only /metrics is served here\n".to_string())
    };
    write!(stream, "HTTP/1.0 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
}

/// The exposition text of a registry.
pub fn encode(registry: &Registry) -> String {
    let mut text = String::new();
    if prometheus_client::encoding::text::encode(&mut text, registry).is_err() {
        text = "# the metrics could not be encoded\n".into();
    }
    text
}

/// Series whose values are read at the scrape (from counters kept elsewhere), encoded as they are.
#[derive(Debug)]
pub enum Series {
    Counters(Vec<(Labels, u64)>),
    Gauges(Vec<(Labels, i64)>),
    Histograms(Vec<HistogramSnapshot>),
}

/// One histogram series as read at the scrape.
#[derive(Debug)]
pub struct HistogramSnapshot {
    pub labels: Labels,
    /// (upper bound, count in that bucket alone: the encoder makes them cumulative).
    pub buckets: Vec<(f64, u64)>,
    pub count: u64,
    pub sum: f64,
}

impl Series {
    /// One gauge series without labels beyond `labels`.
    pub fn gauge(labels: Labels, value: u64) -> Self {
        Self::Gauges(vec![(labels, i64::try_from(value).unwrap_or(i64::MAX))])
    }
}

impl EncodeMetric for Series {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        match self {
            Self::Counters(series) => {
                for (labels, value) in series {
                    labelled(&mut encoder, labels, |encoder| encoder.encode_counter::<NoLabelSet, _, u64>(value, None))?;
                }
            }
            Self::Gauges(series) => {
                for (labels, value) in series {
                    labelled(&mut encoder, labels, |encoder| encoder.encode_gauge(value))?;
                }
            }
            Self::Histograms(series) => {
                for histogram in series {
                    labelled(&mut encoder, &histogram.labels, |encoder| {
                        encoder.encode_histogram::<NoLabelSet>(histogram.sum, histogram.count, &histogram.buckets, None)
                    })?;
                }
            }
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        match self {
            Self::Counters(_) => MetricType::Counter,
            Self::Gauges(_) => MetricType::Gauge,
            Self::Histograms(_) => MetricType::Histogram,
        }
    }
}

/// Encodes one series with its labels; without labels, without braces (`name 1`, not `name{} 1`).
fn labelled(
    encoder: &mut MetricEncoder,
    labels: &Labels,
    encode: impl FnOnce(&mut MetricEncoder) -> Result<(), std::fmt::Error>,
) -> Result<(), std::fmt::Error> {
    if labels.is_empty() { encode(encoder) } else { encode(&mut encoder.encode_family(labels)?) }
}

/// Upper bounds (seconds) for control-plane latencies: a store write, an RPC to a node.
pub const CONTROL_LATENCY_BOUNDS: [f64; 12] = [1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 1.0, 10.0];

/// A latency histogram anyone may add to without a lock.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// One more than `bounds`: the last counts what is above every bound.
    buckets: Vec<AtomicU64>,
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_nanos: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        let bucket = self.bounds.iter().position(|bound| seconds <= *bound).unwrap_or(self.bounds.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// The histogram as it is now, as a series with `labels`.
    pub fn snapshot(&self, labels: Labels) -> HistogramSnapshot {
        let buckets = self
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(&self.buckets)
            .map(|(bound, count)| (bound, count.load(Ordering::Relaxed)))
            .collect();
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        HistogramSnapshot { labels, buckets, count: self.count.load(Ordering::Relaxed), sum }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(address: &str, path: &str) -> String {
        let mut stream = TcpStream::connect(address).unwrap();
        write!(stream, "GET {path} HTTP/1.0\r\n\r\n").unwrap();
        let mut text = String::new();
        stream.read_to_string(&mut text).unwrap();
        text
    }

    #[test]
    fn the_endpoint_serves_the_rendered_series_and_refuses_other_paths() {
        let latency = std::sync::Arc::new(Histogram::new(&CONTROL_LATENCY_BOUNDS));
        latency.observe(Duration::from_micros(300));
        latency.observe(Duration::from_secs(30));
        let shared = latency.clone();
        let address = serve("127.0.0.1:0", "test-metrics", move || {
            let mut registry = Registry::with_prefix("flyt_test");
            registry.register("things", "Things", Series::gauge(vec![("kind", "a".into())], 7));
            registry.register("wait_seconds", "Waits", Series::Histograms(vec![shared.snapshot(vec![("op", "put".into())])]));
            encode(&registry)
        })
        .unwrap();
        let text = scrape(&address, "/metrics");
        assert!(text.starts_with("HTTP/1.0 200 OK"), "{text}");
        assert!(text.contains("flyt_test_things{kind=\"a\"} 7"), "{text}");
        // 300 us falls in the 500 us bucket (cumulative), 30 s only in +Inf.
        assert!(text.contains("flyt_test_wait_seconds_bucket{le=\"0.00025\",op=\"put\"} 0"), "{text}");
        assert!(text.contains("flyt_test_wait_seconds_bucket{le=\"0.0005\",op=\"put\"} 1"), "{text}");
        assert!(text.contains("flyt_test_wait_seconds_bucket{le=\"10.0\",op=\"put\"} 1"), "{text}");
        assert!(text.contains("flyt_test_wait_seconds_bucket{le=\"+Inf\",op=\"put\"} 2"), "{text}");
        assert!(text.contains("flyt_test_wait_seconds_count{op=\"put\"} 2"), "{text}");
        assert!(scrape(&address, "/other").starts_with("HTTP/1.0 404"));
    }
}
