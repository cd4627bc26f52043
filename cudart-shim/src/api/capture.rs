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
//! - A refused `cudaGraphLaunch` is an asynchronous launch that did not happen: like the error of
//!   any asynchronous work, it is reported again at the next synchronizing call (once), so a
//!   program that checks only its synchronizations still fails.

use std::collections::HashSet;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;

use super::streams::resolve_stream;
use crate::client::client;
use crate::ffi::cudaStream_t;

/// Wire ids of the streams whose capture was refused and not ended yet.
static REFUSED_CAPTURES: Mutex<Option<HashSet<u64>>> = Mutex::new(None);
/// Whether `REFUSED_CAPTURES` may be non-empty: every queued call checks this, so the common
/// case costs one relaxed load, not a lock.
static ANY_REFUSED_CAPTURE: AtomicBool = AtomicBool::new(false);
/// A refused asynchronous launch not yet reported at a synchronizing call.
static OWED_AT_SYNC: AtomicBool = AtomicBool::new(false);

fn refused_captures() -> std::sync::MutexGuard<'static, Option<HashSet<u64>>> {
    REFUSED_CAPTURES.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Fails a call that uses stream `id` while the app believes the stream is capturing.
pub(crate) fn check_not_refused_capture(id: u64) -> CudaResult<()> {
    if !ANY_REFUSED_CAPTURE.load(Ordering::Acquire) {
        return Ok(());
    }
    if refused_captures().as_ref().is_some_and(|ids| ids.contains(&id)) {
        crate::diagnostics::once(
            "refused-capture-work",
            "flyt: work on a stream whose cudaStreamBeginCapture was refused fails with \
             cudaErrorStreamCaptureInvalidated until cudaStreamEndCapture (stream capture is not supported)",
        );
        return Err(CudaError::STREAM_CAPTURE_INVALIDATED);
    }
    Ok(())
}

/// Forgets a stream (destroyed, or its capture ended).
pub(crate) fn forget_refused_capture(id: u64) {
    if ANY_REFUSED_CAPTURE.load(Ordering::Acquire) {
        let mut ids = refused_captures();
        if let Some(set) = ids.as_mut() {
            set.remove(&id);
            ANY_REFUSED_CAPTURE.store(!set.is_empty(), Ordering::Release);
        }
    }
}

/// The refused asynchronous launch to report at this synchronizing call, if any (once).
pub(crate) fn take_owed_at_sync() -> CudaResult<()> {
    if OWED_AT_SYNC.swap(false, Ordering::AcqRel) { Err(CudaError::NOT_SUPPORTED) } else { Ok(()) }
}

fn begin(stream: cudaStream_t, per_thread_default: bool) {
    let Ok(client) = client() else { return };
    // The legacy stream cannot capture in CUDA either (the call fails there too), and an unknown
    // handle is no stream: nothing to remember.
    if let Ok(id) = resolve_stream(client, stream, per_thread_default)
        && id != 0
    {
        refused_captures().get_or_insert_with(HashSet::new).insert(id);
        ANY_REFUSED_CAPTURE.store(true, Ordering::Release);
    }
}

fn end(stream: cudaStream_t, per_thread_default: bool) {
    if let Ok(client) = client()
        && let Ok(id) = resolve_stream(client, stream, per_thread_default)
    {
        forget_refused_capture(id);
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
