//! Streams, events, context synchronization and limits, through the process's `flyt-client`
//! session. Stream and event handles are ids the client chooses (no round trip), shared with the
//! runtime front.

use std::ffi::{c_int, c_uint, c_ulonglong};

use flyt_protocol::ops::req;

use super::session::{client, driver_error, resolve_stream, run};
use crate::CUresult;
use crate::ffi::{DriverResult, non_null, write_out};
use crate::generated::types::{
    CUcontext, CUdevice, CUevent, CUfunc_cache, CUgreenCtx, CUlimit, CUstream, CUstreamAttrID, CUstreamAttrValue,
};

/// `CU_STREAM_NON_BLOCKING` is the only stream flag.
const STREAM_FLAGS: c_uint = 0x1;
/// `CU_EVENT_BLOCKING_SYNC | DISABLE_TIMING | INTERPROCESS`.
const EVENT_FLAGS: c_uint = 0x7;
const EVENT_DISABLE_TIMING: c_uint = 0x2;
const EVENT_INTERPROCESS: c_uint = 0x4;

/// A stream made in the current context: on the server, one of the green context's when that
/// is a green context's.
fn create_stream(out: *mut CUstream, flags: c_uint, priority: c_int) -> DriverResult {
    non_null([out.cast()])?;
    if flags & !STREAM_FLAGS != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let client = client()?;
    let current = crate::context::current();
    let id = match current.and_then(crate::context::Context::green) {
        Some(green) => flyt_client::green::create_stream(client, green.id(), flags, priority),
        None => flyt_client::streams::create_stream(client, flags, priority),
    }
    .map_err(driver_error)?;
    if let Some(ctx) = current {
        remember_stream_context(id, ctx);
    }
    // SAFETY: checked non-NULL; the caller's out-pointer.
    unsafe { write_out(out, id as usize as CUstream) }
}

/// Records the context a stream was made in.
pub(super) fn remember_stream_context(stream: u64, ctx: &'static crate::context::Context) {
    lock_contexts().insert(stream, ctx.handle() as usize);
}

/// The streams made in `ctx` (a green context's, which go with it).
pub(super) fn streams_of(ctx: &'static crate::context::Context) -> Vec<u64> {
    let handle = ctx.handle() as usize;
    lock_contexts().iter().filter(|(_, made_in)| **made_in == handle).map(|(stream, _)| *stream).collect()
}

/// The context each stream was created in, for `cuStreamGetCtx` (streams are the client's ids,
/// shared with the runtime front, whose streams are made here too).
static STREAM_CONTEXTS: std::sync::LazyLock<std::sync::Mutex<std::collections::HashMap<u64, usize>>> =
    std::sync::LazyLock::new(Default::default);

fn lock_contexts() -> std::sync::MutexGuard<'static, std::collections::HashMap<u64, usize>> {
    STREAM_CONTEXTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether a handle is one of the default streams (NULL, legacy, per-thread).
pub(super) fn is_default_stream(stream: CUstream) -> bool {
    matches!(stream as usize, 0 | flyt_client::streams::STREAM_LEGACY | flyt_client::streams::STREAM_PER_THREAD)
}

/// A stream's context: the one it was created in; the default streams (NULL, legacy,
/// per-thread) belong to the current context.
pub(super) fn stream_context(stream: CUstream, ptds: bool) -> DriverResult<&'static crate::context::Context> {
    let client = client()?;
    let id = resolve_stream(client, stream, ptds)?;
    let current = crate::context::current().ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
    if is_default_stream(stream) {
        return Ok(current);
    }
    let contexts = &crate::driver::driver().contexts;
    match lock_contexts().get(&id) {
        Some(ctx) => contexts.lookup(*ctx as CUcontext),
        // Made before this table knew it (a per-thread stream of another thread): the device's
        // primary context, as the session has one device.
        None => contexts.primary(current.device()),
    }
}

/// Declares the queries that answer one thing about a stream's context (the stream's own, or
/// the per-thread default stream's where `$ptds`), written to the caller's out-pointer.
macro_rules! stream_context_queries {
    ($($name:ident, $ptds:literal, $out:ident: *mut $ty:ty => |$ctx:ident| $value:expr;)*) => {$(
        pub unsafe fn $name(h_stream: CUstream, $out: *mut $ty) -> CUresult {
            run(|| {
                non_null([$out.cast()])?;
                let $ctx = stream_context(h_stream, $ptds)?;
                // SAFETY: checked non-NULL; the caller's out-pointer.
                unsafe { write_out($out, $value) }
            })
        }
    )*};
}

stream_context_queries! {
    cuStreamGetCtx, false, pctx: *mut CUcontext => |ctx| ctx.handle();
    cuStreamGetCtx_ptsz, true, pctx: *mut CUcontext => |ctx| ctx.handle();
    cuStreamGetDevice, false, device: *mut CUdevice => |ctx| ctx.device();
    cuStreamGetDevice_ptsz, true, device: *mut CUdevice => |ctx| ctx.device();
}

macro_rules! stream_contexts_v2 {
    ($($name:ident, $ptds:literal;)*) => {$(
        /// A green context's stream answers the green context and the device's primary context
        /// (`CU_STREAM_PER_THREAD` while a green context is current is an invalid handle, as
        /// documented); any other stream its context and NULL.
        pub unsafe fn $name(h_stream: CUstream, p_ctx: *mut CUcontext, p_green_ctx: *mut CUgreenCtx) -> CUresult {
            run(|| {
                if p_ctx.is_null() && p_green_ctx.is_null() {
                    return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
                }
                let ctx = stream_context(h_stream, $ptds)?;
                let (ctx, green) = match ctx.green() {
                    Some(_) if h_stream as usize == flyt_client::streams::STREAM_PER_THREAD => {
                        return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
                    }
                    Some(green) => (crate::driver::driver().contexts.primary(ctx.device())?.handle(), green.handle()),
                    None => (ctx.handle(), std::ptr::null_mut()),
                };
                if !p_ctx.is_null() {
                    // SAFETY: checked non-NULL; the caller's out-pointer.
                    unsafe { write_out(p_ctx, ctx)? };
                }
                if !p_green_ctx.is_null() {
                    // SAFETY: as above.
                    unsafe { write_out(p_green_ctx, green)? };
                }
                Ok(())
            })
        }
    )*};
}

stream_contexts_v2! {
    cuStreamGetCtx_v2, false;
    cuStreamGetCtx_v2_ptsz, true;
}

/// `cuCtxRecordEvent` / `cuCtxWaitEvent`: the session's context on the server is the one every
/// context here stands for (one device), except a green context's, whose work alone the event
/// covers (or waits), as `cuGreenCtxRecordEvent` does.
fn context_event(ctx: CUcontext, event: CUevent, wait: bool) -> DriverResult {
    let client = client()?;
    let contexts = &crate::driver::driver().contexts;
    let ctx = contexts.lookup_or_current(ctx)?;
    ctx.usable()?;
    if let Some(green) = ctx.green() {
        return flyt_client::green::event(client, green.id(), event as usize, wait).map_err(driver_error);
    }
    let event = flyt_client::streams::event_id(client, event as usize).map_err(driver_error)?;
    client.call(req::ContextEvent { event, wait }).map(drop).map_err(driver_error)
}

pub unsafe fn cuCtxRecordEvent(h_ctx: CUcontext, h_event: CUevent) -> CUresult {
    run(|| context_event(h_ctx, h_event, false))
}

pub unsafe fn cuCtxWaitEvent(h_ctx: CUcontext, h_event: CUevent) -> CUresult {
    run(|| context_event(h_ctx, h_event, true))
}

pub unsafe fn cuStreamCreate(ph_stream: *mut CUstream, flags: c_uint) -> CUresult {
    run(|| create_stream(ph_stream, flags, 0))
}

pub unsafe fn cuStreamCreateWithPriority(ph_stream: *mut CUstream, flags: c_uint, priority: c_int) -> CUresult {
    run(|| create_stream(ph_stream, flags, priority))
}

/// A stream of a green context destroyed before it is `CUDA_ERROR_CONTEXT_IS_DESTROYED` (it went
/// with its green context on the server), as natively.
pub unsafe fn cuStreamDestroy_v2(h_stream: CUstream) -> CUresult {
    run(|| {
        let client = client()?;
        let id = h_stream as u64;
        let made_in = lock_contexts().get(&id).copied();
        if let Some(ctx) = made_in.and_then(|ctx| crate::driver::driver().contexts.lookup(ctx as CUcontext).ok())
            && ctx.green().is_some()
            && ctx.usable().is_err()
        {
            lock_contexts().remove(&id);
            return Err(CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED);
        }
        client.on_handle_server(id, || flyt_client::streams::destroy_stream(client, id)).map_err(driver_error)?;
        lock_contexts().remove(&id);
        Ok(())
    })
}

/// The CUDA 3.x entry point, the same call as `_v2` (programs built before CUDA 4.0 name it).
pub unsafe fn cuStreamDestroy(h_stream: CUstream) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuStreamDestroy_v2(h_stream) }
}

fn synchronize(stream: CUstream, ptds: bool) -> DriverResult {
    let client = client()?;
    let stream = resolve_stream(client, stream, ptds)?;
    client.on_handle_server(stream, || client.synchronize_stream(stream)).map_err(driver_error)
}

per_thread_twins! {
    cuStreamSynchronize, cuStreamSynchronize_ptsz (h_stream: CUstream)
        |per_thread| run(|| synchronize(h_stream, per_thread))
}

fn query(stream: CUstream, ptds: bool) -> DriverResult {
    let client = client()?;
    let stream = resolve_stream(client, stream, ptds)?;
    client.on_handle_server(stream, || client.call(req::StreamQuery { stream })).map(|_| ()).map_err(driver_error)
}

per_thread_twins! {
    cuStreamQuery, cuStreamQuery_ptsz (h_stream: CUstream)
        |per_thread| run(|| query(h_stream, per_thread))
}

fn wait_event(stream: CUstream, event: CUevent, flags: c_uint, ptds: bool) -> DriverResult {
    // CU_EVENT_WAIT_EXTERNAL (0x1) only changes what a stream capture records: the server's
    // driver, which captures, gets it.
    if flags & !0x1 != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let client = client()?;
    let stream = resolve_stream(client, stream, ptds)?;
    let event = flyt_client::streams::event_id(client, event as usize).map_err(driver_error)?;
    if client.on_different_servers(stream, event) {
        // GPUs of two nodes (a spread session): no server can make one's stream wait for the
        // other's event, so the app's thread waits for the event here (bounded as every reply is,
        // `FLYT_REPLY_TIMEOUT`) and the stream's later work is sent after it.
        return client.on_handle_server(event, || client.call(req::EventSynchronize { event })).map(drop).map_err(driver_error);
    }
    client.on_handle_server(stream, || client.post(req::StreamWaitEvent { stream, event, flags })).map_err(driver_error)
}

per_thread_twins! {
    cuStreamWaitEvent, cuStreamWaitEvent_ptsz (h_stream: CUstream, h_event: CUevent, flags: c_uint)
        |per_thread| run(|| wait_event(h_stream, h_event, flags, per_thread))
}

pub unsafe fn cuEventCreate(ph_event: *mut CUevent, flags: c_uint) -> CUresult {
    run(|| {
        non_null([ph_event.cast()])?;
        if flags & !EVENT_FLAGS != 0 || (flags & EVENT_INTERPROCESS != 0 && flags & EVENT_DISABLE_TIMING == 0) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let id = flyt_client::streams::create_event(client()?, flags).map_err(driver_error)?;
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(ph_event, id as usize as CUevent) }
    })
}

/// `CU_EVENT_RECORD_EXTERNAL`, the only record flag (it matters only during stream capture).
const EVENT_RECORD_FLAGS: c_uint = 0x1;

fn record(event: CUevent, stream: CUstream, flags: c_uint, ptds: bool) -> DriverResult {
    if flags & !EVENT_RECORD_FLAGS != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let client = client()?;
    let event = flyt_client::streams::event_id(client, event as usize).map_err(driver_error)?;
    let stream = resolve_stream(client, stream, ptds)?;
    if client.on_different_servers(stream, event) {
        // As the driver refuses an event and a stream of two contexts.
        return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
    }
    client.on_handle_server(stream, || client.post(req::EventRecord { event, stream, flags })).map_err(driver_error)
}

per_thread_twins! {
    cuEventRecord, cuEventRecord_ptsz (h_event: CUevent, h_stream: CUstream)
        |per_thread| run(|| record(h_event, h_stream, 0, per_thread))
}

per_thread_twins! {
    cuEventRecordWithFlags, cuEventRecordWithFlags_ptsz (h_event: CUevent, h_stream: CUstream, flags: c_uint)
        |per_thread| run(|| record(h_event, h_stream, flags, per_thread))
}

/// `(least, greatest)` stream priority: asked of the server once per session. Either out-pointer
/// may be NULL.
pub unsafe fn cuCtxGetStreamPriorityRange(least_priority: *mut c_int, greatest_priority: *mut c_int) -> CUresult {
    run(|| {
        let (least, greatest) = flyt_client::streams::priority_range(client()?).map_err(driver_error)?;
        if !least_priority.is_null() {
            // SAFETY: non-NULL; the caller's out-pointer.
            unsafe { least_priority.write(least) };
        }
        if !greatest_priority.is_null() {
            // SAFETY: non-NULL; the caller's out-pointer.
            unsafe { greatest_priority.write(greatest) };
        }
        Ok(())
    })
}

pub unsafe fn cuEventSynchronize(h_event: CUevent) -> CUresult {
    run(|| {
        let client = client()?;
        let event = flyt_client::streams::event_id(client, h_event as usize).map_err(driver_error)?;
        client.on_handle_server(event, || client.call(req::EventSynchronize { event })).map(|_| ()).map_err(driver_error)
    })
}

pub unsafe fn cuEventQuery(h_event: CUevent) -> CUresult {
    run(|| {
        let client = client()?;
        let event = flyt_client::streams::event_id(client, h_event as usize).map_err(driver_error)?;
        client.on_handle_server(event, || client.call(req::EventQuery { event })).map(|_| ()).map_err(driver_error)
    })
}

fn elapsed(ms: *mut f32, start: CUevent, end: CUevent) -> DriverResult {
    non_null([ms.cast()])?;
    let client = client()?;
    let start = flyt_client::streams::event_id(client, start as usize).map_err(driver_error)?;
    let end = flyt_client::streams::event_id(client, end as usize).map_err(driver_error)?;
    if [start, end].iter().any(|id| client.event_flags(*id).is_none_or(|flags| flags & EVENT_DISABLE_TIMING != 0)) {
        return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
    }
    if client.on_different_servers(start, end) {
        // Two nodes' clocks: no elapsed time between them.
        return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
    }
    let reply = client.on_handle_server(start, || client.call(req::EventElapsedTime { start, end })).map_err(driver_error)?;
    // SAFETY: checked non-NULL; the caller's out-pointer.
    unsafe { write_out(ms, reply.milliseconds) }
}

pub unsafe fn cuEventElapsedTime(p_milliseconds: *mut f32, h_start: CUevent, h_end: CUevent) -> CUresult {
    run(|| elapsed(p_milliseconds, h_start, h_end))
}

/// The same call as `cuEventElapsedTime`.
pub unsafe fn cuEventElapsedTime_v2(p_milliseconds: *mut f32, h_start: CUevent, h_end: CUevent) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuEventElapsedTime(p_milliseconds, h_start, h_end) }
}

pub unsafe fn cuEventDestroy_v2(h_event: CUevent) -> CUresult {
    run(|| {
        let client = client()?;
        let id = h_event as u64;
        if !client.forget_event(id) {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        }
        client.on_handle_server(id, || client.post(req::EventDestroy { event: id })).map_err(driver_error)
    })
}

/// The CUDA 3.x entry point, the same call as `_v2` (programs built before CUDA 4.0 name it).
pub unsafe fn cuEventDestroy(h_event: CUevent) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuEventDestroy_v2(h_event) }
}

pub unsafe fn cuCtxSynchronize() -> CUresult {
    run(|| client()?.call(req::DeviceSynchronize {}).map(|_| ()).map_err(driver_error))
}

/// `CUlimit` and `cudaLimit` number the limits the same way, which is how the op carries them.
pub unsafe fn cuCtxGetLimit(pvalue: *mut usize, limit: CUlimit) -> CUresult {
    run(|| {
        non_null([pvalue.cast()])?;
        let value = client()?.device_limit(limit).map_err(driver_error)?;
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(pvalue, value as usize) }
    })
}

/// The context's cache preference: a hint the server's driver applies to the session's context.
pub unsafe fn cuCtxSetCacheConfig(config: CUfunc_cache) -> CUresult {
    run(|| client()?.call(req::DeviceSetCacheConfig { config }).map(|_| ()).map_err(driver_error))
}

pub unsafe fn cuCtxGetCacheConfig(pconfig: *mut CUfunc_cache) -> CUresult {
    run(|| {
        non_null([pconfig.cast()])?;
        let config = client()?.call(req::DeviceGetCacheConfig {}).map_err(driver_error)?.config;
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(pconfig, config) }
    })
}

/// Profiling ranges are the server's: a profiler attached to the GPU server (nsys, ncu) sees them.
pub unsafe fn cuProfilerStart() -> CUresult {
    run(|| client()?.call(req::ProfilerControl { start: true }).map(|_| ()).map_err(driver_error))
}

pub unsafe fn cuProfilerStop() -> CUresult {
    run(|| client()?.call(req::ProfilerControl { start: false }).map(|_| ()).map_err(driver_error))
}

pub unsafe fn cuCtxResetPersistingL2Cache() -> CUresult {
    run(|| client()?.call(req::ResetPersistingL2Cache {}).map(|_| ()).map_err(driver_error))
}

pub unsafe fn cuCtxSetLimit(limit: CUlimit, value: usize) -> CUresult {
    run(|| client()?.set_device_limit(limit, value as u64).map_err(driver_error))
}

/// CUDA 13's form: synchronizes `ctx` (NULL: the current one). Every context of a process shares the
/// session's device, so this waits for all of the session's work, as `cuCtxSynchronize` does.
pub unsafe fn cuCtxSynchronize_v2(ctx: CUcontext) -> CUresult {
    run(|| {
        crate::driver::driver().contexts.lookup_or_current(ctx)?.usable()?;
        client()?.call(req::DeviceSynchronize {}).map(|_| ()).map_err(driver_error)
    })
}

/// A stream's flags and priority as the app created it; the default streams have neither.
fn stream_info(stream: CUstream, ptds: bool) -> DriverResult<flyt_client::client::StreamInfo> {
    let client = client()?;
    let id = resolve_stream(client, stream, ptds)?;
    Ok(client.stream_info(id))
}

macro_rules! stream_queries {
    ($($name:ident($out:ident: *mut $ty:ty) => $field:ident, $ptds:literal;)*) => {$(
        pub unsafe fn $name(h_stream: CUstream, $out: *mut $ty) -> CUresult {
            run(|| {
                non_null([$out.cast()])?;
                let value = stream_info(h_stream, $ptds)?.$field;
                // SAFETY: checked non-NULL; the caller's out-pointer.
                unsafe { write_out($out, value as $ty) }
            })
        }
    )*};
}

/// What `cuStreamGetId` reports for the legacy default stream: created streams report their wire
/// ids, which start far above it, so every stream's id is unique in the process.
const LEGACY_STREAM_ID: u64 = 1;

/// A stream's process-unique id, as `cuStreamGetId` reports it.
pub(crate) fn stream_id(stream: CUstream, ptds: bool) -> DriverResult<u64> {
    let id = resolve_stream(client()?, stream, ptds)?;
    Ok(if id == 0 { LEGACY_STREAM_ID } else { id })
}

per_thread_twins! {
    cuStreamGetId, cuStreamGetId_ptsz (h_stream: CUstream, stream_id_out: *mut c_ulonglong)
        |per_thread| {
            run(|| {
                non_null([stream_id_out.cast()])?;
                // SAFETY: checked non-NULL; the caller's out-pointer.
                unsafe { write_out(stream_id_out, stream_id(h_stream, per_thread)?) }
            })
        }
}

stream_queries! {
    cuStreamGetFlags(flags: *mut c_uint) => flags, false;
    cuStreamGetFlags_ptsz(flags: *mut c_uint) => flags, true;
    cuStreamGetPriority(priority: *mut c_int) => priority, false;
    cuStreamGetPriority_ptsz(priority: *mut c_int) => priority, true;
}

/// A stream attribute's value after setting it to `set`, if given: the server's driver holds
/// them (an access policy window must cover the session's own memory).
fn stream_attribute(stream: CUstream, attribute: c_uint, set: Option<[u8; 64]>, ptds: bool) -> DriverResult<[u8; 64]> {
    let client = client()?;
    let stream = resolve_stream(client, stream, ptds)?;
    let reply = client.call(req::StreamAttribute { stream, attribute, set: set.map(|value| value.to_vec()) }).map_err(driver_error)?;
    reply.value.try_into().map_err(|_| CUresult::CUDA_ERROR_UNKNOWN)
}

macro_rules! stream_attributes {
    ($($set:ident, $get:ident, $copy:ident => $ptds:literal;)*) => {$(
        pub unsafe fn $set(h_stream: CUstream, attr: CUstreamAttrID, value: *const CUstreamAttrValue) -> CUresult {
            run(|| {
                non_null([value.cast()])?;
                // SAFETY: checked non-NULL; a `CUstreamAttrValue` is 64 bytes the caller owns.
                let bytes = unsafe { *value.cast::<[u8; 64]>() };
                stream_attribute(h_stream, attr, Some(bytes), $ptds).map(drop)
            })
        }

        pub unsafe fn $get(h_stream: CUstream, attr: CUstreamAttrID, value_out: *mut CUstreamAttrValue) -> CUresult {
            run(|| {
                non_null([value_out.cast()])?;
                let bytes = stream_attribute(h_stream, attr, None, $ptds)?;
                // SAFETY: checked non-NULL; the caller's 64-byte `CUstreamAttrValue`.
                unsafe { write_out(value_out.cast::<[u8; 64]>(), bytes) }
            })
        }

        /// Every attribute a stream takes, except its priority (fixed when it was made).
        pub unsafe fn $copy(dst: CUstream, src: CUstream) -> CUresult {
            use flyt_protocol::ops::stream_attribute::{ALL, PRIORITY};
            run(|| {
                for attribute in ALL.into_iter().filter(|attribute| *attribute != PRIORITY) {
                    let value = stream_attribute(src, attribute, None, $ptds)?;
                    stream_attribute(dst, attribute, Some(value), $ptds)?;
                }
                Ok(())
            })
        }
    )*};
}

stream_attributes! {
    cuStreamSetAttribute, cuStreamGetAttribute, cuStreamCopyAttributes => false;
    cuStreamSetAttribute_ptsz, cuStreamGetAttribute_ptsz, cuStreamCopyAttributes_ptsz => true;
}
