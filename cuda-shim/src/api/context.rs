//! Primary contexts, `cuCtxCreate`/`cuCtxDestroy` and the per-thread context stack, answered in the
//! process (see `crate::context`).

use std::ffi::{c_int, c_uint, c_ulonglong};

use crate::CUresult;
use crate::context::{self, API_VERSION, Context};
use crate::driver::driver;
use crate::ffi::{DriverResult, finish, non_null, write_out};
use crate::generated::types::{CUcontext, CUctxCreateParams, CUdevice, CUexecAffinityParam, CUsharedconfig};

fn contexts() -> DriverResult<&'static crate::context::Contexts> {
    let driver = driver();
    driver.session()?;
    Ok(&driver.contexts)
}

/// A handle argument (NULL: the current context) that must not be destroyed.
fn usable(ctx: CUcontext) -> DriverResult<&'static Context> {
    let ctx = contexts()?.lookup_or_current(ctx)?;
    ctx.usable()?;
    Ok(ctx)
}

// -- primary contexts --

pub unsafe fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    finish((|| {
        non_null([pctx.cast()])?;
        let ctx = contexts()?.primary_retain(dev)?;
        // SAFETY: checked non-NULL; the caller passes a writable CUcontext.
        unsafe { write_out(pctx, ctx.handle()) }
    })())
}

pub unsafe fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    finish(contexts().and_then(|c| c.primary_release(dev)))
}

pub unsafe fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    finish(contexts().and_then(|c| c.primary_release(dev)))
}

pub unsafe fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) -> CUresult {
    finish((|| {
        non_null([flags.cast(), active.cast()])?;
        let ctx = contexts()?.primary(dev)?;
        // SAFETY: checked non-NULL; the caller passes writable values.
        unsafe {
            write_out(flags, ctx.flags())?;
            write_out(active, c_int::from(ctx.active()))
        }
    })())
}

/// The legacy entry point refuses while the context is active (CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE).
pub unsafe fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: c_uint) -> CUresult {
    finish(contexts().and_then(|c| c.primary_set_flags(dev, flags, false)))
}

pub unsafe fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) -> CUresult {
    finish(contexts().and_then(|c| c.primary_set_flags(dev, flags, true)))
}

/// The context's work, memory, streams and events go (the session's device is reset on the
/// server, when a session is open); its handle stays, inactive.
fn primary_reset(dev: CUdevice) -> DriverResult {
    let contexts = contexts()?;
    contexts.primary(dev)?;
    if let Some(client) = flyt_client::client::existing_client() {
        client.device_reset().map_err(crate::client_source::to_driver)?;
    }
    contexts.primary_reset(dev)
}

pub unsafe fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult {
    finish(primary_reset(dev))
}

pub unsafe fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    finish(primary_reset(dev))
}

// -- created contexts --

unsafe fn create(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    finish((|| {
        non_null([pctx.cast()])?;
        let ctx = contexts()?.create(dev, flags)?;
        // SAFETY: checked non-NULL; the caller passes a writable CUcontext.
        unsafe { write_out(pctx, ctx.handle()) }
    })())
}

pub unsafe fn cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { create(pctx, flags, dev) }
}

pub unsafe fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { create(pctx, flags, dev) }
}

/// Execution-affinity parameters (SM limits) are not supported: a context restricted that way would
/// behave differently from what the program asked for.
pub unsafe fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    params_array: *mut CUexecAffinityParam,
    num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    if num_params < 0 || (num_params > 0 && params_array.is_null()) {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    if num_params > 0 {
        return crate::diagnostics::unsupported("cuCtxCreate_v3 with execution-affinity parameters");
    }
    // SAFETY: forwarded contract.
    unsafe { create(pctx, flags, dev) }
}

/// As `_v3`: execution-affinity and CIG parameters are not supported; NULL or empty parameters are.
pub unsafe fn cuCtxCreate_v4(pctx: *mut CUcontext, ctx_create_params: *mut CUctxCreateParams, flags: c_uint, dev: CUdevice) -> CUresult {
    if !ctx_create_params.is_null() {
        // SAFETY: non-NULL; the caller passes a readable CUctxCreateParams.
        let params = unsafe { ctx_create_params.read() };
        if params.numExecAffinityParams != 0 || !params.cigParams.is_null() {
            return crate::diagnostics::unsupported("cuCtxCreate_v4 with execution-affinity or CIG parameters");
        }
    }
    // SAFETY: forwarded contract.
    unsafe { create(pctx, flags, dev) }
}

pub unsafe fn cuCtxDestroy(ctx: CUcontext) -> CUresult {
    finish(contexts().and_then(|c| c.destroy(ctx)))
}

pub unsafe fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    finish(contexts().and_then(|c| c.destroy(ctx)))
}

// -- the context stack --

fn push(ctx: CUcontext) -> DriverResult {
    if ctx.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
    }
    let ctx = contexts()?.lookup(ctx)?;
    ctx.usable()?;
    context::push(ctx)
}

pub unsafe fn cuCtxPushCurrent(ctx: CUcontext) -> CUresult {
    finish(push(ctx))
}

pub unsafe fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult {
    finish(push(ctx))
}

/// `pctx` may be NULL (the popped context is then not reported).
unsafe fn pop(pctx: *mut CUcontext) -> CUresult {
    finish((|| {
        contexts()?;
        let ctx = context::pop()?;
        if !pctx.is_null() {
            // SAFETY: non-NULL; the caller passes a writable CUcontext.
            unsafe { write_out(pctx, ctx.handle())? };
        }
        Ok(())
    })())
}

pub unsafe fn cuCtxPopCurrent(pctx: *mut CUcontext) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { pop(pctx) }
}

pub unsafe fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { pop(pctx) }
}

pub unsafe fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    finish((|| {
        let contexts = contexts()?;
        if ctx.is_null() {
            return context::set_current(None);
        }
        let ctx = contexts.lookup(ctx)?;
        ctx.usable()?;
        context::set_current(Some(ctx))
    })())
}

pub unsafe fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    finish((|| {
        non_null([pctx.cast()])?;
        contexts()?;
        let handle = context::current().map_or(std::ptr::null_mut(), Context::handle);
        // SAFETY: checked non-NULL; the caller passes a writable CUcontext.
        unsafe { write_out(pctx, handle) }
    })())
}

pub unsafe fn cuCtxGetDevice(device: *mut CUdevice) -> CUresult {
    finish((|| {
        non_null([device.cast()])?;
        let ctx = usable(std::ptr::null_mut())?;
        // SAFETY: checked non-NULL; the caller passes a writable CUdevice.
        unsafe { write_out(device, ctx.device()) }
    })())
}

/// The CUDA 13 form: the device of `ctx`, or of the current context when `ctx` is NULL.
pub unsafe fn cuCtxGetDevice_v2(device: *mut CUdevice, ctx: CUcontext) -> CUresult {
    finish((|| {
        non_null([device.cast()])?;
        let ctx = usable(ctx)?;
        // SAFETY: checked non-NULL; the caller passes a writable CUdevice.
        unsafe { write_out(device, ctx.device()) }
    })())
}

pub unsafe fn cuCtxGetFlags(flags: *mut c_uint) -> CUresult {
    finish((|| {
        non_null([flags.cast()])?;
        let ctx = usable(std::ptr::null_mut())?;
        // SAFETY: checked non-NULL; the caller passes a writable unsigned int.
        unsafe { write_out(flags, ctx.flags()) }
    })())
}

pub unsafe fn cuCtxSetFlags(flags: c_uint) -> CUresult {
    finish(usable(std::ptr::null_mut()).and_then(|ctx| ctx.set_flags(flags)))
}

/// `CU_SHARED_MEM_CONFIG_DEFAULT_BANK_SIZE` .. `_EIGHT_BYTE_BANK_SIZE`.
pub(super) const SHARED_MEM_CONFIGS: std::ops::RangeInclusive<CUsharedconfig> = 0..=2;
/// `CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE`.
const FOUR_BYTE_BANKS: CUsharedconfig = 1;

/// Shared memory banks are 4 bytes wide on every GPU since Maxwell, where the bank size cannot be
/// configured: the driver answers 4-byte banks and takes any valid setting without effect.
pub unsafe fn cuCtxGetSharedMemConfig(config: *mut CUsharedconfig) -> CUresult {
    finish((|| {
        non_null([config.cast()])?;
        usable(std::ptr::null_mut())?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(config, FOUR_BYTE_BANKS) }
    })())
}

pub unsafe fn cuCtxSetSharedMemConfig(config: CUsharedconfig) -> CUresult {
    finish((|| {
        usable(std::ptr::null_mut())?;
        if SHARED_MEM_CONFIGS.contains(&config) { Ok(()) } else { Err(CUresult::CUDA_ERROR_INVALID_VALUE) }
    })())
}

pub unsafe fn cuCtxGetApiVersion(ctx: CUcontext, version: *mut c_uint) -> CUresult {
    finish((|| {
        non_null([version.cast()])?;
        usable(ctx)?;
        // SAFETY: checked non-NULL; the caller passes a writable unsigned int.
        unsafe { write_out(version, API_VERSION) }
    })())
}

pub unsafe fn cuCtxGetId(ctx: CUcontext, ctx_id: *mut c_ulonglong) -> CUresult {
    finish((|| {
        non_null([ctx_id.cast()])?;
        let ctx = usable(ctx)?;
        // SAFETY: checked non-NULL; the caller passes a writable unsigned long long.
        unsafe { write_out(ctx_id, ctx.id()) }
    })())
}

// -- peer access between the session's devices, as the server's driver answers it --

/// The driver's answers for the app's devices `from` and `to` (both checked as the session's).
fn peer_link(from: CUdevice, to: CUdevice) -> DriverResult<Option<flyt_protocol::device::PeerLink>> {
    let contexts = contexts()?;
    // Both must be devices of the session (INVALID_DEVICE otherwise).
    contexts.primary(from)?;
    contexts.primary(to)?;
    let client = flyt_client::client::client().map_err(crate::client_source::to_driver)?;
    Ok(client.peer_link(from as usize, to as usize).cloned())
}

pub unsafe fn cuDeviceCanAccessPeer(can_access_peer: *mut c_int, dev: CUdevice, peer_dev: CUdevice) -> CUresult {
    finish((|| {
        non_null([can_access_peer.cast()])?;
        // A device is not its own peer.
        let can = peer_link(dev, peer_dev)?.is_some_and(|link| link.access_supported != 0);
        // SAFETY: checked non-NULL; the caller passes a writable int.
        unsafe { write_out(can_access_peer, c_int::from(can)) }
    })())
}

/// The current context and the peer one, both alive: what the driver checks before asking
/// whether the devices are peers.
fn peer_contexts(peer_context: CUcontext) -> DriverResult<(&'static Context, &'static Context)> {
    let contexts = contexts()?;
    let current = context::current().ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
    current.usable()?;
    let peer = contexts.lookup(peer_context)?;
    peer.usable().map_err(|_| CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
    Ok((current, peer))
}

/// Asks the server's driver to let the current device's kernels use the peer's memory (or no
/// longer); a pair that is no peers (the same device, or no path between them) is refused here as
/// the driver refuses it.
fn peer_access(peer_context: CUcontext, enable: bool, flags: c_uint) -> DriverResult {
    let (current, peer) = peer_contexts(peer_context)?;
    if flags != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let link = peer_link(current.device(), peer.device())?;
    match link {
        None if enable => return Err(CUresult::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED),
        None => return Err(CUresult::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED),
        Some(link) if link.access_supported == 0 && enable => return Err(CUresult::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED),
        // Never enabled where it cannot be (GPUs of two nodes have no path; their servers do
        // not know each other's devices).
        Some(link) if link.access_supported == 0 => return Err(CUresult::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED),
        Some(_) => {}
    }
    let client = flyt_client::client::client().map_err(crate::client_source::to_driver)?;
    // The peer as its server numbers it (the same server's: peers are never across servers).
    let peer = client.server_device(peer.device() as usize).ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)?;
    let peer = client.local_device(peer);
    client.call(flyt_protocol::ops::req::PeerAccess { peer, enable, flags }).map(drop).map_err(crate::client_source::to_driver)
}

pub unsafe fn cuCtxEnablePeerAccess(peer_context: CUcontext, flags: c_uint) -> CUresult {
    finish(peer_access(peer_context, true, flags))
}

pub unsafe fn cuCtxDisablePeerAccess(peer_context: CUcontext) -> CUresult {
    finish(peer_access(peer_context, false, 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::cuInit;

    // Device 2 of the unit tests' global fake driver belongs to this test (others use other devices).
    #[test]
    fn primary_context_lifecycle_through_the_c_entry_points() {
        const DEV: CUdevice = 2;
        // SAFETY: every pointer below is a valid local.
        unsafe {
            assert_eq!(cuInit(0), CUresult::CUDA_SUCCESS);
            let (mut flags, mut active) = (99, 99);
            assert_eq!(cuDevicePrimaryCtxGetState(DEV, &mut flags, &mut active), CUresult::CUDA_SUCCESS);
            assert_eq!((flags, active), (0, 0));
            let mut ctx: CUcontext = std::ptr::null_mut();
            assert_eq!(cuDevicePrimaryCtxRetain(&mut ctx, DEV), CUresult::CUDA_SUCCESS);
            assert!(!ctx.is_null());
            assert_eq!(cuDevicePrimaryCtxGetState(DEV, &mut flags, &mut active), CUresult::CUDA_SUCCESS);
            assert_eq!(active, 1);
            assert_eq!(cuDevicePrimaryCtxSetFlags(DEV, 4), CUresult::CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE);
            assert_eq!(cuDevicePrimaryCtxSetFlags_v2(DEV, 4), CUresult::CUDA_SUCCESS);

            assert_eq!(cuCtxSetCurrent(ctx), CUresult::CUDA_SUCCESS);
            let mut current: CUcontext = std::ptr::null_mut();
            assert_eq!(cuCtxGetCurrent(&mut current), CUresult::CUDA_SUCCESS);
            assert_eq!(current, ctx);
            let mut device = -1;
            assert_eq!(cuCtxGetDevice(&mut device), CUresult::CUDA_SUCCESS);
            assert_eq!(device, DEV);
            device = -1;
            assert_eq!(cuCtxGetDevice_v2(&mut device, std::ptr::null_mut()), CUresult::CUDA_SUCCESS);
            assert_eq!(device, DEV);
            let mut ctx_flags = 0;
            assert_eq!(cuCtxGetFlags(&mut ctx_flags), CUresult::CUDA_SUCCESS);
            assert_eq!(ctx_flags, 4);
            let mut version = 0;
            assert_eq!(cuCtxGetApiVersion(ctx, &mut version), CUresult::CUDA_SUCCESS);
            assert_eq!(version, 3020);

            assert_eq!(cuDevicePrimaryCtxRelease_v2(DEV), CUresult::CUDA_SUCCESS);
            assert_eq!(cuDevicePrimaryCtxGetState(DEV, &mut flags, &mut active), CUresult::CUDA_SUCCESS);
            assert_eq!((flags, active), (4, 0));
            assert_eq!(cuDevicePrimaryCtxRelease_v2(DEV), CUresult::CUDA_ERROR_INVALID_CONTEXT);
            assert_eq!(cuCtxSetCurrent(std::ptr::null_mut()), CUresult::CUDA_SUCCESS);
        }
    }

    // Device 3 belongs to this test.
    #[test]
    fn created_contexts_stack_and_die() {
        const DEV: CUdevice = 3;
        // SAFETY: every pointer below is a valid local.
        unsafe {
            assert_eq!(cuInit(0), CUresult::CUDA_SUCCESS);
            let mut none: CUcontext = 1usize as CUcontext;
            assert_eq!(cuCtxGetCurrent(&mut none), CUresult::CUDA_SUCCESS);
            assert!(none.is_null());
            let mut device = 0;
            assert_eq!(cuCtxGetDevice(&mut device), CUresult::CUDA_ERROR_INVALID_CONTEXT);

            let (mut a, mut b): (CUcontext, CUcontext) = (std::ptr::null_mut(), std::ptr::null_mut());
            assert_eq!(cuCtxCreate_v2(&mut a, 0, DEV), CUresult::CUDA_SUCCESS);
            let mut params =
                CUctxCreateParams { execAffinityParams: std::ptr::null_mut(), numExecAffinityParams: 0, cigParams: std::ptr::null_mut() };
            assert_eq!(cuCtxCreate_v4(&mut b, &mut params, 1, DEV), CUresult::CUDA_SUCCESS);
            assert_ne!(a, b);
            let (mut id_a, mut id_b) = (0, 0);
            assert_eq!(cuCtxGetId(a, &mut id_a), CUresult::CUDA_SUCCESS);
            assert_eq!(cuCtxGetId(b, &mut id_b), CUresult::CUDA_SUCCESS);
            assert_ne!(id_a, id_b);
            let mut popped: CUcontext = std::ptr::null_mut();
            assert_eq!(cuCtxPopCurrent_v2(&mut popped), CUresult::CUDA_SUCCESS);
            assert_eq!(popped, b);
            assert_eq!(cuCtxPushCurrent_v2(b), CUresult::CUDA_SUCCESS);
            assert_eq!(cuCtxDestroy_v2(b), CUresult::CUDA_SUCCESS);
            let mut current: CUcontext = std::ptr::null_mut();
            assert_eq!(cuCtxGetCurrent(&mut current), CUresult::CUDA_SUCCESS);
            assert_eq!(current, a, "destroying the current context popped it");
            assert_eq!(cuCtxPushCurrent_v2(b), CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED);
            assert_eq!(cuCtxGetId(b, &mut id_b), CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED);
            assert_eq!(cuCtxCreate_v2(&mut b, 0, 99), CUresult::CUDA_ERROR_INVALID_DEVICE);
            assert_eq!(cuCtxDestroy_v2(a), CUresult::CUDA_SUCCESS);
            assert_eq!(cuCtxPopCurrent_v2(std::ptr::null_mut()), CUresult::CUDA_ERROR_INVALID_CONTEXT);
        }
    }
}
