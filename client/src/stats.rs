//! `FLYT_STATS=1`: per-call statistics printed to stderr when the app exits: how often each
//! function was called, how many calls blocked on the server, and how long they blocked.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

#[derive(Default)]
struct CallStats {
    calls: u64,
    blocked: Vec<u32>,
    total: Duration,
}

static ENABLED: OnceLock<bool> = OnceLock::new();

/// Module images: sent with their bytes, offered by digest, found in the server's image cache,
/// and the bytes sent. Counted whether or not statistics are printed (four relaxed adds per
/// module load).
static IMAGES_SENT: AtomicU64 = AtomicU64::new(0);
static IMAGES_OFFERED: AtomicU64 = AtomicU64::new(0);
static IMAGES_CACHED: AtomicU64 = AtomicU64::new(0);
static IMAGE_BYTES_SENT: AtomicU64 = AtomicU64::new(0);

/// A module image's bytes went to the server.
pub fn image_sent(bytes: usize) {
    IMAGES_SENT.fetch_add(1, Ordering::Relaxed);
    IMAGE_BYTES_SENT.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// A module image was offered by its digest; `cached`: the server had it.
pub fn image_offered(cached: bool) {
    IMAGES_OFFERED.fetch_add(1, Ordering::Relaxed);
    if cached {
        IMAGES_CACHED.fetch_add(1, Ordering::Relaxed);
    }
}
static TABLE: Mutex<BTreeMap<&'static str, CallStats>> = Mutex::new(BTreeMap::new());

thread_local! {
    static BLOCKED_NS: Cell<u64> = const { Cell::new(0) };
}

/// Whether statistics are being kept (read once).
pub fn enabled() -> bool {
    *ENABLED.get_or_init(|| {
        let on = std::env::var("FLYT_STATS").is_ok_and(|value| value != "0" && !value.is_empty());
        if on {
            extern "C" fn report_at_exit() {
                report();
            }
            // SAFETY: registering a plain `extern "C" fn()` with atexit is always sound.
            unsafe { libc::atexit(report_at_exit) };
        }
        on
    })
}

/// Called by a waiting call: time spent blocked on the server.
pub fn add_blocked(elapsed: Duration) {
    let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
    let _ = BLOCKED_NS.try_with(|blocked| blocked.set(blocked.get().saturating_add(nanos)));
}

/// Starts timing an export's call; `None` when statistics are off.
pub fn start() -> Option<Instant> {
    if !enabled() {
        return None;
    }
    let _ = BLOCKED_NS.try_with(|blocked| blocked.set(0));
    Some(Instant::now())
}

/// Records a finished call.
pub fn finish(symbol: &'static str, started: Option<Instant>) {
    let Some(started) = started else { return };
    let blocked = BLOCKED_NS.try_with(Cell::take).unwrap_or(0);
    let mut table = TABLE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let entry = table.entry(symbol).or_default();
    entry.calls += 1;
    entry.total += started.elapsed();
    if blocked > 0 {
        entry.blocked.push(u32::try_from(blocked / 1000).unwrap_or(u32::MAX));
    }
}

fn percentile(sorted: &[u32], fraction: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((sorted.len() - 1) as f64 * fraction).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Prints the table, and the process's page faults and context switches (a copy path that
/// faults or sleeps shows up here).
pub fn report() {
    // SAFETY: getrusage fills a plain struct; all-zero is a valid initial value.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    eprintln!(
        "flyt stats: process: {} minor faults, {} major faults, {} voluntary and {} involuntary context switches, {:.3} s user, {:.3} s system",
        usage.ru_minflt,
        usage.ru_majflt,
        usage.ru_nvcsw,
        usage.ru_nivcsw,
        usage.ru_utime.tv_sec as f64 + usage.ru_utime.tv_usec as f64 / 1e6,
        usage.ru_stime.tv_sec as f64 + usage.ru_stime.tv_usec as f64 / 1e6,
    );
    eprintln!(
        "flyt stats: module images: {} sent ({} bytes), {} offered by digest, {} of them found in the server's cache",
        IMAGES_SENT.load(Ordering::Relaxed),
        IMAGE_BYTES_SENT.load(Ordering::Relaxed),
        IMAGES_OFFERED.load(Ordering::Relaxed),
        IMAGES_CACHED.load(Ordering::Relaxed),
    );
    let table = TABLE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    eprintln!(
        "flyt stats: {:<48} {:>10} {:>9} {:>13} {:>9} {:>9} {:>11}",
        "call", "calls", "blocked", "blocked_ms", "p50_us", "p99_us", "cpu_us/call"
    );
    for (symbol, stats) in table.iter() {
        let mut blocked = stats.blocked.clone();
        blocked.sort_unstable();
        let blocked_ms: f64 = blocked.iter().map(|us| f64::from(*us)).sum::<f64>() / 1000.0;
        let per_call = stats.total.as_secs_f64() * 1e6 / stats.calls.max(1) as f64;
        eprintln!(
            "flyt stats: {:<48} {:>10} {:>9} {:>13.3} {:>9} {:>9} {:>11.3}",
            symbol,
            stats.calls,
            blocked.len(),
            blocked_ms,
            percentile(&blocked, 0.5),
            percentile(&blocked, 0.99),
            per_call
        );
    }
}
