//! Stream capture and graph launches, which Flyt does not support: the `refused` exports. Each
//! answers `cudaErrorNotSupported` with its one line (the export does that), and first records
//! what the app asked for, so that a program that goes on as if the call had worked fails at its
//! next steps too instead of producing results that look right:
//!
//! - After a refused `cudaStreamBeginCapture`, the app believes the stream is capturing: work it
//!   queues there is meant for a graph, not for now. Running it at once would give a later
//!   (equally refused) graph launch nothing to do and the timings around it nothing to measure.
//!   So until the app ends the capture it asked for (or destroys the stream), every call that
//!   uses the stream fails with `cudaErrorStreamCaptureInvalidated`, CUDA's answer for work in a
//!   capture sequence that an earlier error broke. The stream is never capturing, so
//!   `cudaStreamEndCapture` has no graph to give.
//! - In CUDA, a stream that waits for an event recorded in a capturing stream joins the capture
//!   (the fork of a multi-stream capture). An event whose record was refused that way remembers
//!   the capture, and a stream that waits for it is refused with it, so the forked stream's work
//!   does not run at once either.
//! - A refused `cudaGraphLaunch` is an asynchronous launch that did not happen: like the error of
//!   any asynchronous work, it is reported again at the next synchronizing call (once), so a
//!   program that checks only its synchronizations still fails.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;

use super::streams::{is_stream, stream_key};
use crate::ffi::cudaStream_t;

/// The refused captures the app has not ended: each stream (see `streams::stream_key`) or event
/// with the stream whose `cudaStreamBeginCapture` was refused (the capture's origin).
#[derive(Default)]
struct Refused {
    streams: HashMap<usize, usize>,
    events: HashMap<usize, usize>,
}

static REFUSED: Mutex<Option<Refused>> = Mutex::new(None);
/// Whether `REFUSED` may hold anything: every queued call checks this, so the common case costs
/// one load, not a lock.
static ANY_REFUSED: AtomicBool = AtomicBool::new(false);
/// A refused asynchronous launch not yet reported at a synchronizing call.
static OWED_AT_SYNC: AtomicBool = AtomicBool::new(false);

/// Runs `change` on the refused captures, keeping `ANY_REFUSED` in step.
fn with_refused<T>(change: impl FnOnce(&mut Refused) -> T) -> T {
    let mut guard = REFUSED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let refused = guard.get_or_insert_with(Refused::default);
    let result = change(refused);
    ANY_REFUSED.store(!refused.streams.is_empty() || !refused.events.is_empty(), Ordering::Release);
    result
}

fn invalidated() -> CudaError {
    crate::diagnostics::once(
        "refused-capture-work",
        "flyt: work on a stream whose cudaStreamBeginCapture was refused fails with \
         cudaErrorStreamCaptureInvalidated until cudaStreamEndCapture (stream capture is not supported)",
    );
    CudaError::STREAM_CAPTURE_INVALIDATED
}

/// Fails a call that uses stream `id` while the app believes the stream is capturing.
pub(crate) fn check_not_refused_capture(id: usize) -> CudaResult<()> {
    if ANY_REFUSED.load(Ordering::Acquire) && with_refused(|refused| refused.streams.contains_key(&id)) {
        return Err(invalidated());
    }
    Ok(())
}

/// A record of `event` on `stream`: refused if the stream is in a refused capture, and then the
/// event belongs to that capture (a stream that waits for it joins it); a record that goes ahead
/// takes the event out of any.
pub(crate) fn record(event: usize, stream: usize) -> CudaResult<()> {
    if !ANY_REFUSED.load(Ordering::Acquire) {
        return Ok(());
    }
    let refused = with_refused(|refused| match refused.streams.get(&stream).copied() {
        Some(origin) => {
            refused.events.insert(event, origin);
            true
        }
        None => {
            refused.events.remove(&event);
            false
        }
    });
    if refused { Err(invalidated()) } else { Ok(()) }
}

/// A wait of `stream` for `event`: if the event belongs to a refused capture, the stream joins
/// it and the wait is refused.
pub(crate) fn wait(stream: usize, event: usize) -> CudaResult<()> {
    if !ANY_REFUSED.load(Ordering::Acquire) {
        return Ok(());
    }
    let joined = with_refused(|refused| match refused.events.get(&event).copied() {
        Some(origin) if stream != 0 => {
            refused.streams.insert(stream, origin);
            true
        }
        // The legacy stream cannot join a capture in CUDA either (the wait fails there too).
        Some(_) => true,
        None => false,
    });
    if joined { Err(invalidated()) } else { Ok(()) }
}

/// Fails a wait for, or a query of, an event recorded in a refused capture the app has not
/// ended: CUDA's answer for an event last recorded in a capturing stream.
pub(crate) fn check_event(event: usize) -> CudaResult<()> {
    if ANY_REFUSED.load(Ordering::Acquire) && with_refused(|refused| refused.events.contains_key(&event)) {
        return Err(CudaError::CAPTURED_EVENT);
    }
    Ok(())
}

/// Forgets everything (`cudaDeviceReset` destroyed every stream and event, and with them any
/// error still owed).
pub(crate) fn forget_all() {
    if ANY_REFUSED.load(Ordering::Acquire) {
        with_refused(|refused| *refused = Refused::default());
    }
    OWED_AT_SYNC.store(false, Ordering::Release);
}

/// Forgets a stream (destroyed): the capture it began, if any, or its part in one.
pub(crate) fn forget_stream(id: usize) {
    if ANY_REFUSED.load(Ordering::Acquire) {
        with_refused(|refused| {
            if refused.streams.get(&id) == Some(&id) {
                end_capture_of(refused, id);
            } else {
                refused.streams.remove(&id);
            }
        });
    }
}

/// Forgets an event (destroyed).
pub(crate) fn forget_event(id: usize) {
    if ANY_REFUSED.load(Ordering::Acquire) {
        with_refused(|refused| refused.events.remove(&id));
    }
}

/// Ends the refused capture `stream` is part of (every stream and event of it), or the one it
/// began.
fn end_capture_of(refused: &mut Refused, stream: usize) {
    let origin = refused.streams.get(&stream).copied().unwrap_or(stream);
    refused.streams.retain(|id, of| *of != origin && *id != stream);
    refused.events.retain(|_, of| *of != origin);
}

/// The refused asynchronous launch to report at this synchronizing call, if any (once).
pub(crate) fn take_owed_at_sync() -> CudaResult<()> {
    if OWED_AT_SYNC.swap(false, Ordering::AcqRel) { Err(CudaError::NOT_SUPPORTED) } else { Ok(()) }
}

fn begin(stream: cudaStream_t, per_thread_default: bool) {
    // The legacy stream cannot capture in CUDA either (the call fails there too), and an unknown
    // handle is no stream: nothing to remember.
    let id = stream_key(stream, per_thread_default);
    if id != 0 && is_stream(stream) {
        with_refused(|refused| {
            end_capture_of(refused, id);
            refused.streams.insert(id, id);
        });
    }
}

fn end(stream: cudaStream_t, per_thread_default: bool) {
    if ANY_REFUSED.load(Ordering::Acquire) {
        with_refused(|refused| end_capture_of(refused, stream_key(stream, per_thread_default)));
    }
}

pub unsafe fn cudaStreamBeginCapture(stream: cudaStream_t, _mode: c_int) {
    begin(stream, false);
}

pub unsafe fn cudaStreamBeginCapture_ptsz(stream: cudaStream_t, _mode: c_int) {
    begin(stream, true);
}

pub unsafe fn cudaStreamBeginCaptureToGraph(
    stream: cudaStream_t,
    _graph: *mut c_void,
    _dependencies: *const c_void,
    _dependency_data: *const c_void,
    _count: usize,
    _mode: c_int,
) {
    begin(stream, false);
}

pub unsafe fn cudaStreamBeginCaptureToGraph_ptsz(
    stream: cudaStream_t,
    _graph: *mut c_void,
    _dependencies: *const c_void,
    _dependency_data: *const c_void,
    _count: usize,
    _mode: c_int,
) {
    begin(stream, true);
}

/// `*graph` is left as it is: out-parameters are written only on success.
pub unsafe fn cudaStreamEndCapture(stream: cudaStream_t, _graph: *mut *mut c_void) {
    end(stream, false);
}

pub unsafe fn cudaStreamEndCapture_ptsz(stream: cudaStream_t, _graph: *mut *mut c_void) {
    end(stream, true);
}

pub unsafe fn cudaGraphLaunch(_exec: *mut c_void, _stream: cudaStream_t) {
    OWED_AT_SYNC.store(true, Ordering::Release);
}

pub unsafe fn cudaGraphLaunch_ptsz(_exec: *mut c_void, _stream: cudaStream_t) {
    OWED_AT_SYNC.store(true, Ordering::Release);
}
