//! Green contexts on the client side. SM resources are the server driver's: the server names
//! each by an id (its bytes stay there); resource descriptors and green contexts are named by
//! ids chosen here, and each green context gets a stream of its own, made with it on the server,
//! for the work the app queues on the NULL stream while the green context is current. Streams of
//! a green context are ordinary stream ids (in [`Client::streams`]) whose server stream belongs
//! to the green context, so everything queued on them runs there.

use std::sync::atomic::{AtomicU64, Ordering};

use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{DevResource, rep, req};

use crate::client::{Client, StreamInfo};

/// Where descriptor and green context ids start: handles the app holds, apart from other ids.
const DESC_ID_BASE: u64 = 0xD_0000_0000;
const GREEN_ID_BASE: u64 = 0x6_0000_0000;

/// The ids this process chose.
#[derive(Default)]
pub struct Greens {
    next_desc: AtomicU64,
    next_green: AtomicU64,
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A resource (`kind`: a `CUdevResourceType`) of the session's context (`green` 0), or of a
/// green context.
pub fn resource(client: &Client, green: u64, kind: u32) -> CudaResult<DevResource> {
    client.call(req::DevResourceGet { green, kind }).map(|reply| reply.resource)
}

/// `cuDevSmResourceSplitByCount` of the resource the server named `input`.
pub fn split(client: &Client, input: u64, groups: Option<u32>, flags: u32, min_count: u32) -> CudaResult<rep::DevResourceSplit> {
    client.call(req::DevResourceSplit { input, groups, flags, min_count })
}

/// A descriptor of the resources the server named: its id.
pub fn describe(client: &Client, resources: Vec<u64>) -> CudaResult<u64> {
    let desc = DESC_ID_BASE + client.greens.next_desc.fetch_add(1, Ordering::Relaxed) + 1;
    client.call(req::DevResourceDesc { desc, resources })?;
    Ok(desc)
}

/// A green context made on the server from a descriptor: its id and the stream of its NULL
/// stream's work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Created {
    pub green: u64,
    pub default_stream: u64,
}

pub fn create(client: &Client, desc: u64, flags: u32) -> CudaResult<Created> {
    let green = GREEN_ID_BASE + client.greens.next_green.fetch_add(1, Ordering::Relaxed) + 1;
    let default_stream = client.new_stream_id();
    client.call(req::GreenCtxCreate { green, desc, flags, default_stream })?;
    lock(&client.streams).insert(default_stream, StreamInfo { flags: 0, priority: 0 });
    Ok(Created { green, default_stream })
}

/// Destroys a green context; `streams` (its default stream and any the app left) went with it
/// on the server and are forgotten here.
pub fn destroy(client: &Client, green: u64, streams: &[u64]) -> CudaResult<()> {
    client.call(req::GreenCtxDestroy { green })?;
    let mut known = lock(&client.streams);
    for stream in streams {
        known.remove(stream);
    }
    Ok(())
}

/// A stream of green context `green` with the front's checked `flags` and `priority` (clamped
/// to the device's range, as CUDA does): its id.
pub fn create_stream(client: &Client, green: u64, flags: u32, priority: i32) -> CudaResult<u64> {
    let priority = crate::streams::clamped_priority(client, priority)?;
    let stream = client.new_stream_id();
    client.call(req::GreenStreamCreate { green, stream, flags, priority })?;
    lock(&client.streams).insert(stream, StreamInfo { flags, priority });
    Ok(stream)
}

/// `cuGreenCtxRecordEvent` (`wait` false) or `cuGreenCtxWaitEvent` of an event the app holds.
pub fn event(client: &Client, green: u64, event: usize, wait: bool) -> CudaResult<()> {
    let event = crate::streams::event_id(client, event)?;
    client.call(req::GreenCtxEvent { green, event, wait }).map(drop)
}
