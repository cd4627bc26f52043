//! Device queries and device-wide calls, through the driver, which answers attributes and
//! properties in the process (fetched once per session).

use std::ffi::{c_char, c_int, c_uint, c_void};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::handshake::RUNTIME_VERSION;

use crate::driver::{cu, cu_ctx, current_device};
use crate::ffi::{cudaChannelFormatDesc, write_out};
use crate::props::{Identity, cudaDeviceProp, device_prop};

/// The number of devices: asking opens the session.
fn device_count() -> CudaResult<c_int> {
    let mut count = 0;
    cu!(cuDeviceGetCount(&mut count))?;
    Ok(count)
}

/// Checks a device ordinal against the session's devices.
pub(super) fn valid_device(device: c_int) -> CudaResult<c_int> {
    if (0..device_count()?).contains(&device) { Ok(device) } else { Err(CudaError::INVALID_DEVICE) }
}

pub unsafe fn cudaGetDeviceCount(count: *mut c_int) -> CudaResult<()> {
    match device_count() {
        // SAFETY: `count` is the app's out-pointer (NULL is refused).
        Ok(found) => unsafe { write_out(count, found) },
        Err(error) => {
            // CUDA reports no devices alongside the error, so apps that only read the count
            // degrade gracefully.
            // SAFETY: as above.
            let _ = unsafe { write_out(count, 0) };
            Err(error)
        }
    }
}

pub unsafe fn cudaGetDevice(device: *mut c_int) -> CudaResult<()> {
    // A host function run by a stream may make no CUDA call: the driver says so (a host function
    // exists only once the driver is loaded).
    if let Some(driver) = crate::driver::loaded() {
        let mut context = std::ptr::null_mut();
        // A valid out-pointer.
        if CudaError::check(crate::driver::driver_call!(driver, cuCtxGetCurrent(&mut context)).0) == Err(CudaError::NOT_PERMITTED) {
            return Err(CudaError::NOT_PERMITTED);
        }
    }
    // SAFETY: the app's out-pointer.
    unsafe { write_out(device, current_device()) }
}

pub unsafe fn cudaSetDevice(device: c_int) -> CudaResult<()> {
    crate::driver::set_device(valid_device(device)?)
}

/// `cudaDeviceScheduleMask | cudaDeviceMapHost | cudaDeviceLmemResizeToMax | cudaDeviceSyncMemops`,
/// numbered as the driver's context flags.
const DEVICE_FLAGS: c_uint = 0x9f;

pub unsafe fn cudaSetDeviceFlags(flags: c_uint) -> CudaResult<()> {
    // They shape how the host waits, which Flyt decides itself (SyncMemops: whether a synchronous
    // device-side copy or memset waits is visible only through host memory, which Flyt's copies
    // back already order after it); anything else is invalid.
    if flags & !DEVICE_FLAGS != 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    cu!(cuDevicePrimaryCtxSetFlags_v2(current_device(), flags))
}

pub unsafe fn cudaGetDeviceFlags(flags: *mut c_uint) -> CudaResult<()> {
    let (mut value, mut active) = (0, 0);
    cu!(cuDevicePrimaryCtxGetState(current_device(), &mut value, &mut active))?;
    // SAFETY: the app's out-pointer.
    unsafe { write_out(flags, value) }
}

/// A device's identity as the driver reports it.
fn identity(device: c_int) -> CudaResult<Identity> {
    let mut name = [0 as c_char; 256];
    cu!(cuDeviceGetName(name.as_mut_ptr(), 256, device))?;
    let name = name.iter().take_while(|c| **c != 0).map(|c| *c as u8 as char).collect();
    let mut uuid = [0u8; 16];
    cu!(cuDeviceGetUuid_v2(std::ptr::from_mut(&mut uuid).cast(), device))?;
    let (mut luid, mut luid_device_node_mask) = ([0 as c_char; 8], 0);
    // No LUID outside Windows: the driver says so and the fields stay zero, as CUDA's do.
    let _ = cu!(cuDeviceGetLuid(luid.as_mut_ptr(), &mut luid_device_node_mask, device));
    let mut total_mem = 0;
    cu!(cuDeviceTotalMem_v2(&mut total_mem, device))?;
    Ok(Identity { name, uuid, luid: luid.map(|byte| byte as u8), luid_device_node_mask, total_mem })
}

fn attribute(device: c_int, id: u32) -> CudaResult<c_int> {
    let mut value = 0;
    cu!(cuDeviceGetAttribute(&mut value, (c_int::try_from(id).map_err(|_| CudaError::INVALID_VALUE)?).cast_unsigned(), device))?;
    Ok(value)
}

pub unsafe fn cudaGetDeviceProperties(prop: *mut cudaDeviceProp, device: c_int) -> CudaResult<()> {
    let device = valid_device(device)?;
    let value = device_prop(&identity(device)?, |id| attribute(device, id).unwrap_or(0));
    // SAFETY: the app's out-pointer to a CUDA 13 `cudaDeviceProp`.
    unsafe { write_out(prop, value) }
}

/// `cudaDeviceAttr` numbers the attributes as the driver's `CUdevice_attribute` does.
pub unsafe fn cudaDeviceGetAttribute(value: *mut c_int, attr: c_int, device: c_int) -> CudaResult<()> {
    let device = valid_device(device)?;
    let found = attribute(device, u32::try_from(attr).map_err(|_| CudaError::INVALID_VALUE)?)?;
    // SAFETY: the app's out-pointer.
    unsafe { write_out(value, found) }
}

pub unsafe fn cudaDeviceSynchronize() -> CudaResult<()> {
    cu_ctx!(cuCtxSynchronize())
}

pub unsafe fn cudaDeviceReset() -> CudaResult<()> {
    // Reset before any call that set up the runtime is a no-op, as on a process that never
    // touched the GPU (it must not open a session for this).
    if !crate::driver::context_ever_made() {
        return Ok(());
    }
    crate::driver::reset_device()?;
    super::streams::forget_all();
    Ok(())
}

/// `cudaLimit` numbers the limits as the driver's `CUlimit` does.
pub unsafe fn cudaDeviceSetLimit(limit: c_int, value: usize) -> CudaResult<()> {
    cu_ctx!(cuCtxSetLimit(limit.cast_unsigned(), value))
}

pub unsafe fn cudaDeviceGetLimit(value: *mut usize, limit: c_int) -> CudaResult<()> {
    let mut found = 0;
    cu_ctx!(cuCtxGetLimit(&mut found, limit.cast_unsigned()))?;
    // SAFETY: the app's out-pointer.
    unsafe { write_out(value, found) }
}

pub unsafe fn cudaDeviceSetCacheConfig(config: c_int) -> CudaResult<()> {
    let config = c_uint::try_from(config).map_err(|_| CudaError::INVALID_VALUE)?;
    cu_ctx!(cuCtxSetCacheConfig(config))
}

pub unsafe fn cudaDeviceSetSharedMemConfig(config: c_int) -> CudaResult<()> {
    let config = c_uint::try_from(config).map_err(|_| CudaError::INVALID_VALUE)?;
    cu_ctx!(cuCtxSetSharedMemConfig(config))
}

pub unsafe fn cudaDeviceGetSharedMemConfig(config: *mut c_int) -> CudaResult<()> {
    let mut found = 0;
    cu_ctx!(cuCtxGetSharedMemConfig(&mut found))?;
    // SAFETY: the app's out-pointer.
    unsafe { write_out(config, c_int::try_from(found).unwrap_or(0)) }
}

/// The channel description as the driver's format and channel count.
pub unsafe fn cudaDeviceGetTexture1DLinearMaxWidth(width: *mut usize, desc: *const cudaChannelFormatDesc, device: c_int) -> CudaResult<()> {
    if desc.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    // SAFETY: checked non-NULL; the app's descriptor.
    let (format, channels) = super::arrays::array_format(unsafe { &*desc })?;
    cu!(cuDeviceGetTexture1DLinearMaxWidth(width, format, channels, device))
}

/// The runtime's callback, info and handle have the driver's layout: the driver's own calls serve.
pub unsafe fn cudaDeviceRegisterAsyncNotification(
    device: c_int,
    callback_func: flyt_cuda_sys::types::CUasyncCallback,
    user_data: *mut c_void,
    callback: *mut *mut c_void,
) -> CudaResult<()> {
    cu!(cuDeviceRegisterAsyncNotification(device, callback_func, user_data, callback.cast()))
}

pub unsafe fn cudaDeviceUnregisterAsyncNotification(device: c_int, callback: *mut c_void) -> CudaResult<()> {
    cu!(cuDeviceUnregisterAsyncNotification(device, callback.cast()))
}

/// `cudaAtomicOperation` values are the driver's `CUatomicOperation`s.
pub unsafe fn cudaDeviceGetHostAtomicCapabilities(
    capabilities: *mut c_uint,
    operations: *const c_uint,
    count: c_uint,
    device: c_int,
) -> CudaResult<()> {
    cu!(cuDeviceGetHostAtomicCapabilities(capabilities, operations, count, device))
}

pub unsafe fn cudaDeviceGetP2PAtomicCapabilities(
    capabilities: *mut c_uint,
    operations: *const c_uint,
    count: c_uint,
    src: c_int,
    dst: c_int,
) -> CudaResult<()> {
    cu!(cuDeviceGetP2PAtomicCapabilities(capabilities, operations, count, src, dst))
}

pub unsafe fn cudaDeviceGetCacheConfig(config: *mut c_int) -> CudaResult<()> {
    let mut found = 0;
    cu_ctx!(cuCtxGetCacheConfig(&mut found))?;
    // SAFETY: the app's out-pointer.
    unsafe { write_out(config, found as c_int) }
}

pub unsafe fn cudaCtxResetPersistingL2Cache() -> CudaResult<()> {
    cu_ctx!(cuCtxResetPersistingL2Cache())
}

pub unsafe fn cudaDeviceGetP2PAttribute(value: *mut c_int, attr: c_int, src: c_int, dst: c_int) -> CudaResult<()> {
    let attr = c_uint::try_from(attr).map_err(|_| CudaError::INVALID_VALUE)?;
    cu!(cuDeviceGetP2PAttribute(value, attr, src, dst))
}

pub unsafe fn cudaDeviceGetPCIBusId(bus_id: *mut c_char, len: c_int, device: c_int) -> CudaResult<()> {
    cu!(cuDeviceGetPCIBusId(bus_id, len, valid_device(device)?))
}

pub unsafe fn cudaDeviceGetByPCIBusId(device: *mut c_int, bus_id: *const c_char) -> CudaResult<()> {
    cu!(cuDeviceGetByPCIBusId(device, bus_id))
}

/// The device that best matches `prop`: a session serves one device, so it is that one (the
/// runtime's choice is a closest match, never a refusal).
pub unsafe fn cudaChooseDevice(device: *mut c_int, prop: *const cudaDeviceProp) -> CudaResult<()> {
    if device.is_null() || prop.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    valid_device(0)?;
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(device, 0) }
}

/// `cudaInitDeviceFlagsAreValid`: `device_flags` are applied as `cudaSetDeviceFlags`'s.
const INIT_DEVICE_FLAGS_ARE_VALID: c_uint = 0x1;

/// Sets the device's primary context up (retained, flags applied) without making it current.
pub unsafe fn cudaInitDevice(device: c_int, device_flags: c_uint, flags: c_uint) -> CudaResult<()> {
    let device = valid_device(device)?;
    if flags & !INIT_DEVICE_FLAGS_ARE_VALID != 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    if flags & INIT_DEVICE_FLAGS_ARE_VALID != 0 {
        if device_flags & !DEVICE_FLAGS != 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        cu!(cuDevicePrimaryCtxSetFlags_v2(device, device_flags))?;
    }
    crate::driver::device_context(device).map(drop)
}

/// The devices the runtime may pick from when none was set: each must be a device of the
/// session, which has one, so the choice is always that device.
pub unsafe fn cudaSetValidDevices(devices: *mut c_int, len: c_int) -> CudaResult<()> {
    let len = usize::try_from(len).map_err(|_| CudaError::INVALID_VALUE)?;
    if len == 0 {
        return Ok(());
    }
    if devices.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    // SAFETY: checked non-NULL; the app passes `len` ordinals.
    let list = unsafe { std::slice::from_raw_parts(devices, len) };
    list.iter().try_for_each(|device| valid_device(*device).map(drop))
}

driver_forwards! {
    /// Profiling ranges go to the GPU server, where a profiler (nsys, ncu) may be attached.
    cudaProfilerStart() => cuProfilerStart();
    cudaProfilerStop() => cuProfilerStop();
}

pub unsafe fn cudaMemGetInfo(free: *mut usize, total: *mut usize) -> CudaResult<()> {
    if free.is_null() || total.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let (mut f, mut t) = (0, 0);
    cu_ctx!(cuMemGetInfo_v2(&mut f, &mut t))?;
    // SAFETY: both out-pointers were checked non-NULL above and are the app's.
    unsafe {
        write_out(free, f)?;
        write_out(total, t)
    }
}

pub unsafe fn cudaDriverGetVersion(version: *mut c_int) -> CudaResult<()> {
    // The remote driver's version once a session is open; with no reachable server there is no
    // driver: CUDA answers 0 and success.
    let mut driver = 0;
    if crate::driver::ensure_context().is_err() || cu!(cuDriverGetVersion(&mut driver)).is_err() {
        driver = 0;
    }
    // SAFETY: the app's out-pointer.
    unsafe { write_out(version, driver) }
}

pub unsafe fn cudaRuntimeGetVersion(version: *mut c_int) -> CudaResult<()> {
    // SAFETY: the app's out-pointer.
    unsafe { write_out(version, RUNTIME_VERSION) }
}
