//! Green contexts (`cuGreenCtx*`, `cuDevResource*`, `cuDevSmResourceSplitByCount`), made by the
//! server's driver for the session's device (see `flyt_client::green`). A `CUdevResource` the app
//! holds carries the public fields the server's driver reported and, in the bytes cuda.h leaves to
//! the driver, the server's id of the resource: only resources the server's driver wrote go back
//! to it. A `CUgreenCtx` is a [`GreenContext`] of this process; `cuCtxFromGreenCtx` gives its
//! context, which the app makes current like any other: streams made then are the green
//! context's, and the NULL stream's work goes to the green context's own stream on the server, so
//! it runs on the green context's SMs.

use std::ffi::{c_int, c_uint, c_ulonglong};

use flyt_protocol::ops::{DevResource, dev_resource};

use super::session::{client, driver_error, run, session_client};
use crate::CUresult;
use crate::context::{Context, GreenContext};
use crate::driver::driver;
use crate::ffi::{DriverResult, non_null, write_out};
use crate::generated::types::{CUcontext, CUdevResource, CUdevResourceDesc, CUdevResourceType, CUdevice, CUevent, CUgreenCtx, CUstream};

/// `CUdevResource` as cuda.h 13.0 lays it out (`CUdevResource_v1`): the type, 92 bytes left to the
/// driver, and a 48-byte union whose first three words are `CUdevSmResource`.
#[repr(C)]
#[derive(Clone, Copy)]
struct AppResource {
    kind: c_uint,
    internal: [u8; 92],
    sm: [c_uint; 3],
    rest: [u8; 36],
}

const _: () = assert!(size_of::<AppResource>() == 144);

/// What opens Flyt's part of the internal bytes: the server's id follows.
const TAG: [u8; 4] = *b"FLYT";

impl AppResource {
    fn from(resource: &DevResource) -> Self {
        let mut internal = [0u8; 92];
        internal[..4].copy_from_slice(&TAG);
        internal[4..12].copy_from_slice(&resource.id.to_le_bytes());
        Self {
            kind: resource.kind,
            internal,
            sm: [resource.sm_count, resource.min_partition_size, resource.coscheduled_alignment],
            rest: [0; 36],
        }
    }

    /// The server's id of an SM resource; a resource of another type is
    /// `CUDA_ERROR_INVALID_RESOURCE_TYPE`, one no call made here `CUDA_ERROR_INVALID_VALUE`.
    fn id(&self) -> DriverResult<u64> {
        if self.kind != dev_resource::SM {
            return Err(CUresult::CUDA_ERROR_INVALID_RESOURCE_TYPE);
        }
        if self.internal[..4] != TAG {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut id = [0u8; 8];
        id.copy_from_slice(&self.internal[4..12]);
        Ok(u64::from_le_bytes(id))
    }
}

/// Writes a resource into the app's `CUdevResource`.
///
/// # Safety
/// `out` is valid for a write of a `CUdevResource` (checked non-NULL by the caller).
unsafe fn write_resource(out: *mut AppResource, resource: &DevResource) {
    // SAFETY: per this function's contract; the app's struct may sit at any address.
    unsafe { out.write_unaligned(AppResource::from(resource)) }
}

/// The app's `CUdevResource` pointer as what it points at: the generated type is opaque (of no
/// size), so arrays of resources are stepped through as `AppResource`s.
fn app_resources(resources: *mut CUdevResource) -> *mut AppResource {
    resources.cast()
}

/// The server's id of the resource the app passes.
///
/// # Safety
/// `resource` is valid for a read of a `CUdevResource` (checked non-NULL by the caller).
unsafe fn resource_id(resource: *const AppResource) -> DriverResult<u64> {
    // SAFETY: per this function's contract.
    unsafe { resource.read_unaligned() }.id()
}

/// A resource of the session's context (`green` 0) or of a green context, into the app's struct.
fn get_resource(resource: *mut CUdevResource, kind: CUdevResourceType, green: u64, client: &flyt_client::client::Client) -> DriverResult {
    non_null([resource.cast()])?;
    if kind != dev_resource::SM {
        return Err(CUresult::CUDA_ERROR_INVALID_RESOURCE_TYPE);
    }
    let found = flyt_client::green::resource(client, green, kind).map_err(no_green_contexts)?;
    // SAFETY: checked non-NULL; the caller's `CUdevResource`.
    unsafe { write_resource(app_resources(resource), &found) };
    Ok(())
}

/// A session error, and the one line saying why when the server's driver has no green contexts.
fn no_green_contexts(error: flyt_protocol::CudaError) -> CUresult {
    let error = driver_error(error);
    if error == CUresult::CUDA_ERROR_NOT_SUPPORTED {
        crate::diagnostics::once(
            "green-contexts",
            "flyt: green contexts: the server's driver has none (CUDA 12.4 or later makes them; returning CUDA_ERROR_NOT_SUPPORTED)",
        );
    }
    error
}

/// The session's device's SMs as the server's driver reports them for the session's context
/// (under MPS, the tenant's share): the same as `cuCtxGetDevResource` of any context but a green
/// one's. Needs no current context, as natively.
pub unsafe fn cuDeviceGetDevResource(device: CUdevice, resource: *mut CUdevResource, type_: CUdevResourceType) -> CUresult {
    run(|| {
        let client = session_client()?;
        driver().contexts.primary(device)?;
        get_resource(resource, type_, 0, client)
    })
}

pub unsafe fn cuCtxGetDevResource(h_ctx: CUcontext, resource: *mut CUdevResource, type_: CUdevResourceType) -> CUresult {
    run(|| {
        let client = session_client()?;
        let ctx = driver().contexts.lookup_or_current(h_ctx)?;
        ctx.usable()?;
        get_resource(resource, type_, ctx.green().map_or(0, GreenContext::id), client)
    })
}

/// A live green context of this process.
fn green_of(handle: CUgreenCtx) -> DriverResult<&'static GreenContext> {
    let green = driver().contexts.lookup_green(handle)?;
    green.context().usable()?;
    Ok(green)
}

pub unsafe fn cuGreenCtxGetDevResource(h_ctx: CUgreenCtx, resource: *mut CUdevResource, type_: CUdevResourceType) -> CUresult {
    run(|| {
        let client = session_client()?;
        let green = green_of(h_ctx)?;
        get_resource(resource, type_, green.id(), client)
    })
}

/// `result` NULL only counts the groups; otherwise `*nb_groups` is its size, and the groups made
/// are written there (at most that many) and counted in `*nb_groups`. `remaining` may be NULL.
pub unsafe fn cuDevSmResourceSplitByCount(
    result: *mut CUdevResource,
    nb_groups: *mut c_uint,
    input: *const CUdevResource,
    remaining: *mut CUdevResource,
    use_flags: c_uint,
    min_count: c_uint,
) -> CUresult {
    run(|| {
        non_null([nb_groups.cast(), input.cast()])?;
        let client = session_client()?;
        // SAFETY: checked non-NULL; the caller's `CUdevResource`.
        let input = unsafe { resource_id(input.cast()) }?;
        // SAFETY: checked non-NULL; the caller's count.
        let asked = (!result.is_null()).then(|| unsafe { nb_groups.read() });
        let split = flyt_client::green::split(client, input, asked, use_flags, min_count).map_err(no_green_contexts)?;
        let fits = split.groups.len().min(asked.unwrap_or(0) as usize);
        for (index, group) in split.groups.iter().take(fits).enumerate() {
            // SAFETY: `result` holds `*nb_groups` resources (the caller's contract) and `index`
            // is below both that and the groups made.
            unsafe { write_resource(app_resources(result).add(index), group) };
        }
        if !remaining.is_null() {
            // SAFETY: non-NULL; the caller's `CUdevResource`.
            unsafe { write_resource(app_resources(remaining), &split.remaining) };
        }
        let count = if asked.is_some() { fits as c_uint } else { split.count };
        // SAFETY: checked non-NULL.
        unsafe { write_out(nb_groups, count) }
    })
}

pub unsafe fn cuDevResourceGenerateDesc(ph_desc: *mut CUdevResourceDesc, resources: *mut CUdevResource, nb_resources: c_uint) -> CUresult {
    run(|| {
        non_null([ph_desc.cast(), resources.cast()])?;
        if nb_resources == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let client = session_client()?;
        let ids = (0..nb_resources as usize)
            // SAFETY: `resources` holds `nb_resources` resources (the caller's contract).
            .map(|index| unsafe { resource_id(app_resources(resources).add(index)) })
            .collect::<DriverResult<Vec<u64>>>()?;
        let desc = flyt_client::green::describe(client, ids).map_err(no_green_contexts)?;
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(ph_desc, desc as usize as CUdevResourceDesc) }
    })
}

pub unsafe fn cuGreenCtxCreate(ph_ctx: *mut CUgreenCtx, desc: CUdevResourceDesc, dev: CUdevice, flags: c_uint) -> CUresult {
    run(|| {
        non_null([ph_ctx.cast()])?;
        let client = session_client()?;
        let contexts = &driver().contexts;
        contexts.primary(dev)?;
        if desc.is_null() || flags != dev_resource::GREEN_CTX_DEFAULT_STREAM {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let created = flyt_client::green::create(client, desc as usize as u64, flags).map_err(no_green_contexts)?;
        let green = contexts.create_green(dev, created.green, created.default_stream)?;
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(ph_ctx, green.handle()) }
    })
}

/// The green context goes on the server with its default stream and any stream of it the app
/// left (which then answer `CUDA_ERROR_CONTEXT_IS_DESTROYED`); its context dies here.
pub unsafe fn cuGreenCtxDestroy(h_ctx: CUgreenCtx) -> CUresult {
    run(|| {
        let client = session_client()?;
        let green = green_of(h_ctx)?;
        let mut streams = super::stream::streams_of(green.context());
        streams.push(green.default_stream());
        flyt_client::green::destroy(client, green.id(), &streams).map_err(driver_error)?;
        driver().contexts.destroy_green(green)
    })
}

pub unsafe fn cuCtxFromGreenCtx(p_context: *mut CUcontext, h_ctx: CUgreenCtx) -> CUresult {
    run(|| {
        non_null([p_context.cast()])?;
        driver().session()?;
        let green = green_of(h_ctx)?;
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(p_context, green.context().handle()) }
    })
}

/// The id of a green context, or (NULL) of the current context's green context: the id of its
/// context (`cuCtxGetId`), unique in the process.
pub unsafe fn cuGreenCtxGetId(green_ctx: CUgreenCtx, green_ctx_id: *mut c_ulonglong) -> CUresult {
    run(|| {
        non_null([green_ctx_id.cast()])?;
        driver().session()?;
        let green = if green_ctx.is_null() {
            crate::context::current().and_then(Context::green).ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?
        } else {
            driver().contexts.lookup_green(green_ctx)?
        };
        green.context().usable()?;
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(green_ctx_id, green.context().id()) }
    })
}

fn green_event(h_ctx: CUgreenCtx, h_event: CUevent, wait: bool) -> DriverResult {
    let client = session_client()?;
    let green = green_of(h_ctx)?;
    flyt_client::green::event(client, green.id(), h_event as usize, wait).map_err(driver_error)
}

pub unsafe fn cuGreenCtxRecordEvent(h_ctx: CUgreenCtx, h_event: CUevent) -> CUresult {
    run(|| green_event(h_ctx, h_event, false))
}

pub unsafe fn cuGreenCtxWaitEvent(h_ctx: CUgreenCtx, h_event: CUevent) -> CUresult {
    run(|| green_event(h_ctx, h_event, true))
}

/// `CU_STREAM_NON_BLOCKING`: `cuGreenCtxStreamCreate` requires it, and takes no other flag.
const NON_BLOCKING: c_uint = 0x1;

/// A stream of the green context, whatever context is current.
pub unsafe fn cuGreenCtxStreamCreate(ph_stream: *mut CUstream, green_ctx: CUgreenCtx, flags: c_uint, priority: c_int) -> CUresult {
    run(|| {
        non_null([ph_stream.cast()])?;
        let client = session_client()?;
        let green = green_of(green_ctx)?;
        if flags != NON_BLOCKING {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let stream = flyt_client::green::create_stream(client, green.id(), flags, priority).map_err(driver_error)?;
        super::stream::remember_stream_context(stream, green.context());
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(ph_stream, stream as usize as CUstream) }
    })
}

/// The green context a stream was made in (or, for the NULL, legacy and per-thread streams, the
/// current context's), or NULL.
pub unsafe fn cuStreamGetGreenCtx(h_stream: CUstream, ph_ctx: *mut CUgreenCtx) -> CUresult {
    run(|| {
        non_null([ph_ctx.cast()])?;
        client()?;
        let ctx = super::stream::stream_context(h_stream, false)?;
        let green = ctx.green().map_or(std::ptr::null_mut(), GreenContext::handle);
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(ph_ctx, green) }
    })
}
