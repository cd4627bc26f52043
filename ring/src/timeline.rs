//! Opt-in timestamps of the stages of a call, on both sides of a session, for finding where a
//! round trip's time goes on machines that have no profiler (the GPU VMs have no `perf`).
//!
//! `FLYT_TIMELINE=PREFIX` turns it on: each process stamps the first `FLYT_TIMELINE_MARKS`
//! (default 200,000) marks with the CPU's time-stamp counter, which both sides of a same-host
//! session share, and writes them to `PREFIX.PID.tsv` once that many are taken.
//! `benchmarks/diagnostics/timeline.py` lines the two files up. Off, a mark costs one relaxed
//! load of a static.

use std::io::Write;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

/// The stages marked. Client side first, then server side.
#[derive(Clone, Copy, Debug)]
#[repr(u16)]
pub enum Stage {
    /// The app called a launch.
    LaunchEnter = 1,
    /// An asynchronous request was written to the wire by the calling thread.
    Posted = 2,
    /// A synchronous call began.
    CallEnter = 3,
    /// A synchronous call's request was written to the wire.
    CallSent = 4,
    /// A reply was read and handed to its slot.
    ReplyRead = 5,
    /// A synchronous call returned its reply.
    CallReturn = 6,
    /// The app entered a driver export.
    ExportEnter = 7,
    /// A driver export returned to the app.
    ExportReturn = 8,
    /// The server read a request frame.
    FrameRead = 10,
    /// The server finished handling a request (its reply may still be owed).
    Dispatched = 11,
    /// The server is about to call the driver's launch.
    DriverLaunch = 12,
    /// The driver's launch returned.
    DriverLaunched = 13,
    /// The server saw the work it waited for done.
    WaitDone = 14,
    /// The server wrote a reply frame.
    ReplyWritten = 15,
}

const UNKNOWN: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);

struct Marks {
    prefix: String,
    /// Two words per mark: the counter, then the stage.
    words: Box<[AtomicU64]>,
    next: AtomicUsize,
    /// The counter and the clock when recording began, for converting ticks to time.
    started: (u64, Instant),
}

static MARKS: OnceLock<Option<Marks>> = OnceLock::new();

fn marks() -> Option<&'static Marks> {
    MARKS
        .get_or_init(|| {
            let prefix = std::env::var("FLYT_TIMELINE").ok().filter(|prefix| !prefix.is_empty())?;
            let capacity = std::env::var("FLYT_TIMELINE_MARKS").ok().and_then(|value| value.parse().ok()).unwrap_or(200_000usize);
            let words = (0..capacity * 2).map(|_| AtomicU64::new(0)).collect();
            Some(Marks { prefix, words, next: AtomicUsize::new(0), started: (ticks(), Instant::now()) })
        })
        .as_ref()
}

/// Records that this thread reached `stage` now, when the timeline is on.
#[inline]
pub fn mark(stage: Stage) {
    match STATE.load(Ordering::Relaxed) {
        OFF => {}
        ON => record(stage),
        _ => {
            let on = marks().is_some();
            STATE.store(if on { ON } else { OFF }, Ordering::Relaxed);
            if on {
                record(stage);
            }
        }
    }
}

#[cold]
fn record(stage: Stage) {
    let Some(marks) = marks() else { return };
    let now = ticks();
    let index = marks.next.fetch_add(1, Ordering::Relaxed);
    let capacity = marks.words.len() / 2;
    if index >= capacity {
        return;
    }
    marks.words[index * 2].store(now, Ordering::Relaxed);
    marks.words[index * 2 + 1].store(stage as u64, Ordering::Release);
    if index + 1 == capacity {
        STATE.store(OFF, Ordering::Relaxed);
        write_out(marks);
    }
}

fn write_out(marks: &Marks) {
    let (ticks_then, clock_then) = marks.started;
    let per_us = (ticks().saturating_sub(ticks_then)) as f64 / clock_then.elapsed().as_secs_f64() / 1e6;
    let path = format!("{}.{}.tsv", marks.prefix, std::process::id());
    let result = std::fs::File::create(&path).and_then(|file| {
        let mut out = std::io::BufWriter::new(file);
        writeln!(out, "# ticks_per_us {per_us:.3}")?;
        for pair in marks.words.chunks_exact(2) {
            writeln!(out, "{}\t{}", pair[0].load(Ordering::Relaxed), pair[1].load(Ordering::Acquire))?;
        }
        out.flush()
    });
    if let Err(error) = result {
        eprintln!("flyt: timeline not written to {path}: {error}");
    }
}

#[cfg(target_arch = "x86_64")]
fn ticks() -> u64 {
    // SAFETY: RDTSC reads a counter; it has no operands and touches no memory.
    unsafe { std::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
fn ticks() -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed().as_nanos() as u64
}
