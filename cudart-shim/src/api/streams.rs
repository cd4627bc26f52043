//! Streams and events. Their handles are ids the shim chooses, so creating one costs no round
//! trip; the server learns of it from an asynchronous request.

use std::ffi::{c_int, c_uint};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::req;

use super::{call, capture, post};
use crate::client::{Client, StreamInfo, client};
use crate::ffi::{cudaEvent_t, cudaStream_t, write_out};
use crate::streams::{self, priority_range};

use crate::streams::{STREAM_LEGACY, STREAM_PER_THREAD};
/// `cudaStreamNonBlocking` is the only stream flag.
const STREAM_FLAGS: c_uint = 0x1;
/// `cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess`.
const EVENT_FLAGS: c_uint = 0x7;
const EVENT_DISABLE_TIMING: c_uint = 0x2;
const EVENT_INTERPROCESS: c_uint = 0x4;
/// `cudaEventRecordExternal` (record) and `cudaEventWaitExternal` (wait): they change only what
/// stream capture puts in a graph. No stream ever captures through Flyt (capture is refused), and
/// outside capture CUDA treats them as the default, so they are accepted and sent as 0.
const EXTERNAL: c_uint = 0x1;
/// Kept in the session's event map beside the app's flags (no CUDA event flag uses this bit): the
/// event's last record failed, so it holds no time the app asked for.
const RECORD_FAILED: u32 = 1 << 31;

/// The wire id of a stream handle for a call that uses the stream: as `resolve_stream`, and
/// refused while the app believes the stream is capturing (see `capture`).
pub(crate) fn stream_id(client: &Client, stream: cudaStream_t, per_thread_default: bool) -> CudaResult<u64> {
    let id = resolve_stream(client, stream, per_thread_default)?;
    capture::check_not_refused_capture(id)?;
    Ok(id)
}

/// The wire id of a stream handle (see `flyt_client::streams::resolve`).
pub(crate) fn resolve_stream(client: &Client, stream: cudaStream_t, per_thread_default: bool) -> CudaResult<u64> {
    streams::resolve(client, stream as usize, per_thread_default)
}

fn event_id(client: &Client, event: cudaEvent_t) -> CudaResult<u64> {
    let id = event as u64;
    if client.events.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains_key(&id) {
        Ok(id)
    } else {
        Err(CudaError::INVALID_RESOURCE_HANDLE)
    }
}

pub unsafe fn cudaDeviceGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) -> CudaResult<()> {
    let (low, high) = priority_range(client()?)?;
    // Either pointer may be NULL, as in CUDA.
    if !least.is_null() {
        // SAFETY: the app's non-NULL out-pointer.
        unsafe { write_out(least, low)? };
    }
    if !greatest.is_null() {
        // SAFETY: as above.
        unsafe { write_out(greatest, high)? };
    }
    Ok(())
}

/// A stream's flags and priority as the app created it; the default streams have neither.
fn stream_info(stream: cudaStream_t) -> CudaResult<StreamInfo> {
    let client = client()?;
    match stream as usize {
        0 | STREAM_LEGACY | STREAM_PER_THREAD => Ok(StreamInfo { flags: 0, priority: 0 }),
        handle => {
            let streams = client.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            streams.get(&(handle as u64)).copied().ok_or(CudaError::INVALID_RESOURCE_HANDLE)
        }
    }
}

pub unsafe fn cudaStreamGetPriority(stream: cudaStream_t, priority: *mut c_int) -> CudaResult<()> {
    let value = stream_info(stream)?.priority;
    // SAFETY: the app's out-pointer.
    unsafe { write_out(priority, value) }
}

/// The null handle is the thread's default stream here, which has no priority either.
pub unsafe fn cudaStreamGetPriority_ptsz(stream: cudaStream_t, priority: *mut c_int) -> CudaResult<()> {
    // SAFETY: same contract.
    unsafe { cudaStreamGetPriority(stream, priority) }
}

fn create_stream(out: *mut cudaStream_t, flags: c_uint, priority: c_int) -> CudaResult<()> {
    if out.is_null() || flags & !STREAM_FLAGS != 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    // CUDA clamps a priority outside the device's range to the range, and reports the clamped one.
    let id = streams::create_stream(client()?, flags, priority)?;
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(out, id as usize as cudaStream_t) }
}

pub unsafe fn cudaStreamCreate(stream: *mut cudaStream_t) -> CudaResult<()> {
    create_stream(stream, 0, 0)
}

pub unsafe fn cudaStreamCreateWithFlags(stream: *mut cudaStream_t, flags: c_uint) -> CudaResult<()> {
    create_stream(stream, flags, 0)
}

pub unsafe fn cudaStreamCreateWithPriority(stream: *mut cudaStream_t, flags: c_uint, priority: c_int) -> CudaResult<()> {
    create_stream(stream, flags, priority)
}

pub unsafe fn cudaStreamDestroy(stream: cudaStream_t) -> CudaResult<()> {
    let client = client()?;
    let id = stream as u64;
    if client.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&id).is_none() {
        return Err(CudaError::INVALID_RESOURCE_HANDLE);
    }
    capture::forget_stream(id);
    post(client, req::StreamDestroy { stream: id })
}

fn synchronize(stream: cudaStream_t, per_thread_default: bool) -> CudaResult<()> {
    let client = client()?;
    let id = stream_id(client, stream, per_thread_default)?;
    call(client, req::StreamSynchronize { stream: id }).map(|_| ())
}

pub unsafe fn cudaStreamSynchronize(stream: cudaStream_t) -> CudaResult<()> {
    synchronize(stream, false)
}

pub unsafe fn cudaStreamSynchronize_ptsz(stream: cudaStream_t) -> CudaResult<()> {
    synchronize(stream, true)
}

fn query(stream: cudaStream_t, per_thread_default: bool) -> CudaResult<()> {
    let client = client()?;
    let id = stream_id(client, stream, per_thread_default)?;
    call(client, req::StreamQuery { stream: id }).map(|_| ())
}

pub unsafe fn cudaStreamQuery(stream: cudaStream_t) -> CudaResult<()> {
    query(stream, false)
}

pub unsafe fn cudaStreamQuery_ptsz(stream: cudaStream_t) -> CudaResult<()> {
    query(stream, true)
}

fn wait_event(stream: cudaStream_t, event: cudaEvent_t, flags: c_uint, per_thread_default: bool) -> CudaResult<()> {
    if flags & !EXTERNAL != 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    let client = client()?;
    let stream = stream_id(client, stream, per_thread_default)?;
    let event = event_id(client, event)?;
    capture::wait(stream, event)?;
    post(client, req::StreamWaitEvent { stream, event, flags: 0 })
}

pub unsafe fn cudaStreamWaitEvent(stream: cudaStream_t, event: cudaEvent_t, flags: c_uint) -> CudaResult<()> {
    wait_event(stream, event, flags, false)
}

pub unsafe fn cudaStreamWaitEvent_ptsz(stream: cudaStream_t, event: cudaEvent_t, flags: c_uint) -> CudaResult<()> {
    wait_event(stream, event, flags, true)
}

pub unsafe fn cudaStreamGetFlags(stream: cudaStream_t, flags: *mut c_uint) -> CudaResult<()> {
    let value = stream_info(stream)?.flags;
    // SAFETY: the app's out-pointer.
    unsafe { write_out(flags, value) }
}

/// The null handle is the thread's default stream here, a blocking stream (flags 0).
pub unsafe fn cudaStreamGetFlags_ptsz(stream: cudaStream_t, flags: *mut c_uint) -> CudaResult<()> {
    // SAFETY: same contract.
    unsafe { cudaStreamGetFlags(stream, flags) }
}

fn create_event(out: *mut cudaEvent_t, flags: c_uint) -> CudaResult<()> {
    if out.is_null() || flags & !EVENT_FLAGS != 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    // CUDA: an interprocess event must be created with cudaEventDisableTiming.
    if flags & EVENT_INTERPROCESS != 0 && flags & EVENT_DISABLE_TIMING == 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    let id = streams::create_event(client()?, flags)?;
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(out, id as usize as cudaEvent_t) }
}

pub unsafe fn cudaEventCreate(event: *mut cudaEvent_t) -> CudaResult<()> {
    create_event(event, 0)
}

pub unsafe fn cudaEventCreateWithFlags(event: *mut cudaEvent_t, flags: c_uint) -> CudaResult<()> {
    create_event(event, flags)
}

fn record(event: cudaEvent_t, stream: cudaStream_t, flags: c_uint, per_thread_default: bool) -> CudaResult<()> {
    let client = client()?;
    let event = event_id(client, event)?;
    let recorded = if flags & !EXTERNAL != 0 {
        Err(CudaError::INVALID_VALUE)
    } else {
        resolve_stream(client, stream, per_thread_default).and_then(|stream| {
            capture::record(event, stream)?;
            post(client, req::EventRecord { event, stream, flags: 0 })
        })
    };
    // A failed record leaves the event without the time the app meant it to hold: timings that
    // use it fail until a record succeeds, instead of measuring something else.
    if let Some(flags) = client.events.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get_mut(&event) {
        if recorded.is_ok() {
            *flags &= !RECORD_FAILED;
        } else {
            *flags |= RECORD_FAILED;
        }
    }
    recorded
}

pub unsafe fn cudaEventRecord(event: cudaEvent_t, stream: cudaStream_t) -> CudaResult<()> {
    record(event, stream, 0, false)
}

pub unsafe fn cudaEventRecord_ptsz(event: cudaEvent_t, stream: cudaStream_t) -> CudaResult<()> {
    record(event, stream, 0, true)
}

pub unsafe fn cudaEventRecordWithFlags(event: cudaEvent_t, stream: cudaStream_t, flags: c_uint) -> CudaResult<()> {
    record(event, stream, flags, false)
}

pub unsafe fn cudaEventRecordWithFlags_ptsz(event: cudaEvent_t, stream: cudaStream_t, flags: c_uint) -> CudaResult<()> {
    record(event, stream, flags, true)
}

pub unsafe fn cudaEventSynchronize(event: cudaEvent_t) -> CudaResult<()> {
    let client = client()?;
    let event = event_id(client, event)?;
    capture::check_event(event)?;
    call(client, req::EventSynchronize { event }).map(|_| ())
}

pub unsafe fn cudaEventQuery(event: cudaEvent_t) -> CudaResult<()> {
    let client = client()?;
    let event = event_id(client, event)?;
    capture::check_event(event)?;
    call(client, req::EventQuery { event }).map(|_| ())
}

pub unsafe fn cudaEventElapsedTime(ms: *mut f32, start: cudaEvent_t, end: cudaEvent_t) -> CudaResult<()> {
    if ms.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let client = client()?;
    let (start, end) = (event_id(client, start)?, event_id(client, end)?);
    {
        // CUDA: an event created with cudaEventDisableTiming has no time; an event whose last
        // record failed (see `record`) has none the app asked for.
        let events = client.events.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let untimed = |id| events.get(&id).is_none_or(|flags| flags & (EVENT_DISABLE_TIMING | RECORD_FAILED) != 0);
        if untimed(start) || untimed(end) {
            return Err(CudaError::INVALID_RESOURCE_HANDLE);
        }
    }
    let reply = call(client, req::EventElapsedTime { start, end })?;
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(ms, reply.milliseconds) }
}

pub unsafe fn cudaEventDestroy(event: cudaEvent_t) -> CudaResult<()> {
    let client = client()?;
    let id = event as u64;
    if client.events.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&id).is_none() {
        return Err(CudaError::INVALID_RESOURCE_HANDLE);
    }
    capture::forget_event(id);
    post(client, req::EventDestroy { event: id })
}
