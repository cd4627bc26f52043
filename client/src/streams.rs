//! Stream and event handles. Their ids are chosen here, so creating one costs no round trip (the
//! server learns of it from an asynchronous request); the driver front hands them to the app as
//! `CUstream` and `CUevent` (the runtime front passes those on as `cudaStream_t`/`cudaEvent_t`).

use std::cell::Cell;

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::req;

use crate::client::{Client, StreamInfo, existing_client};

/// `cudaStreamLegacy`/`CU_STREAM_LEGACY` and `cudaStreamPerThread`/`CU_STREAM_PER_THREAD`.
pub const STREAM_LEGACY: usize = 1;
pub const STREAM_PER_THREAD: usize = 2;

/// This thread's per-thread default stream: `(reset generation, id)`, destroyed with the thread.
struct PerThreadStream(Cell<(u64, u64)>);

impl Drop for PerThreadStream {
    fn drop(&mut self) {
        let (generation, id) = self.0.get();
        if let Some(client) = existing_client()
            && id != 0
            && generation == client.reset_generation.load(std::sync::atomic::Ordering::Acquire)
        {
            client.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&id);
            let _ = client.post(req::StreamDestroy { stream: id });
        }
    }
}

thread_local! {
    static PER_THREAD_STREAM: PerThreadStream = const { PerThreadStream(Cell::new((0, 0))) };
}

/// The calling thread's per-thread default stream, created on first use. It is a blocking
/// stream, so it synchronizes with the legacy default stream as CUDA's does.
fn per_thread_stream(client: &Client) -> CudaResult<u64> {
    let generation = client.reset_generation.load(std::sync::atomic::Ordering::Acquire);
    let existing = PER_THREAD_STREAM.try_with(|stream| stream.0.get()).map_err(|_| CudaError::INVALID_RESOURCE_HANDLE)?;
    if existing.0 == generation && existing.1 != 0 {
        return Ok(existing.1);
    }
    let id = client.new_stream_id();
    client.post(req::StreamCreate { stream: id, flags: 0, priority: 0 })?;
    client.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(id, StreamInfo { flags: 0, priority: 0 });
    let _ = PER_THREAD_STREAM.try_with(|stream| stream.0.set((generation, id)));
    Ok(id)
}

/// The wire id of a stream handle. `per_thread_default` says what the null handle means: the
/// legacy stream, or (`_ptsz`/`_ptds` entry points) the thread's own default stream.
pub fn resolve(client: &Client, stream: usize, per_thread_default: bool) -> CudaResult<u64> {
    match stream {
        0 if per_thread_default => per_thread_stream(client),
        0 | STREAM_LEGACY => Ok(0),
        STREAM_PER_THREAD => per_thread_stream(client),
        handle => {
            let id = handle as u64;
            if client.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains_key(&id) {
                Ok(id)
            } else {
                Err(CudaError::INVALID_RESOURCE_HANDLE)
            }
        }
    }
}

/// The device's stream priority range, asked once per session.
pub fn priority_range(client: &Client) -> CudaResult<(i32, i32)> {
    if let Some(range) = client.priority_range.get() {
        return Ok(*range);
    }
    let reply = client.call(req::StreamPriorityRange {})?;
    Ok(*client.priority_range.get_or_init(|| (reply.least, reply.greatest)))
}

/// A stream priority clamped to the device's range, as CUDA does.
pub(crate) fn clamped_priority(client: &Client, priority: i32) -> CudaResult<i32> {
    if priority == 0 {
        return Ok(0);
    }
    let (least, greatest) = priority_range(client)?;
    Ok(priority.clamp(greatest.min(least), least.max(greatest)))
}

/// Creates a stream with the front's checked `flags` and `priority` (clamped to the device's
/// range, as CUDA does): its id, with no round trip.
pub fn create_stream(client: &Client, flags: u32, priority: i32) -> CudaResult<u64> {
    let priority = clamped_priority(client, priority)?;
    let id = client.new_stream_id();
    client.post(req::StreamCreate { stream: id, flags, priority })?;
    client.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(id, StreamInfo { flags, priority });
    Ok(id)
}

/// Destroys a stream the app created (invalid handle for anything else).
pub fn destroy_stream(client: &Client, id: u64) -> CudaResult<()> {
    if client.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&id).is_none() {
        return Err(CudaError::INVALID_RESOURCE_HANDLE);
    }
    client.post(req::StreamDestroy { stream: id })
}

/// Creates an event with the front's checked `flags`: its id, with no round trip.
pub fn create_event(client: &Client, flags: u32) -> CudaResult<u64> {
    let id = client.new_event_id();
    client.post(req::EventCreate { event: id, flags })?;
    client.events.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(id, flags);
    Ok(id)
}

/// The id of an event handle the app holds, or invalid handle.
pub fn event_id(client: &Client, event: usize) -> CudaResult<u64> {
    let id = event as u64;
    if client.events.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains_key(&id) {
        Ok(id)
    } else {
        Err(CudaError::INVALID_RESOURCE_HANDLE)
    }
}
