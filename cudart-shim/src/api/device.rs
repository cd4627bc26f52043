//! Device queries and device-wide calls. Properties and attributes come from the session's
//! cached device info: no round trip.

use std::cell::Cell;
use std::ffi::{c_int, c_uint};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::handshake::RUNTIME_VERSION;
use flyt_protocol::ops::req;

use super::call;
use crate::client::{client, existing_client};
use crate::ffi::write_out;
use crate::props::cudaDeviceProp;

thread_local! {
    static CURRENT_DEVICE: Cell<c_int> = const { Cell::new(0) };
}

/// Checks a device ordinal against the session's devices.
fn valid_device(device: c_int) -> CudaResult<usize> {
    let client = client()?;
    usize::try_from(device).ok().filter(|index| *index < client.device_count()).ok_or(CudaError::INVALID_DEVICE)
}

pub unsafe fn cudaGetDeviceCount(count: *mut c_int) -> CudaResult<()> {
    match client() {
        Ok(client) => {
            // SAFETY: `count` is the app's out-pointer (NULL is refused).
            unsafe { write_out(count, c_int::try_from(client.device_count()).unwrap_or(c_int::MAX)) }
        }
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
    let current = CURRENT_DEVICE.try_with(Cell::get).unwrap_or(0);
    // SAFETY: the app's out-pointer.
    unsafe { write_out(device, current) }
}

pub unsafe fn cudaSetDevice(device: c_int) -> CudaResult<()> {
    valid_device(device)?;
    let _ = CURRENT_DEVICE.try_with(|current| current.set(device));
    Ok(())
}

pub unsafe fn cudaSetDeviceFlags(flags: c_uint) -> CudaResult<()> {
    // cudaDeviceScheduleMask | cudaDeviceMapHost | cudaDeviceLmemResizeToMax | cudaDeviceSyncMemops:
    // they shape how the host waits, which the shim decides itself (SyncMemops: whether a
    // synchronous device-side copy or memset waits is visible only through host memory, which
    // Flyt's copies back already order after it); anything else is invalid.
    if flags & !0x9f != 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    *client()?.device_flags.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = flags;
    Ok(())
}

pub unsafe fn cudaGetDeviceFlags(flags: *mut c_uint) -> CudaResult<()> {
    let current = *client()?.device_flags.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    // SAFETY: the app's out-pointer.
    unsafe { write_out(flags, current) }
}

pub unsafe fn cudaGetDeviceProperties(prop: *mut cudaDeviceProp, device: c_int) -> CudaResult<()> {
    let index = valid_device(device)?;
    let value = crate::props::prop(client()?, index).ok_or(CudaError::INVALID_DEVICE)?;
    // SAFETY: the app's out-pointer to a CUDA 13 `cudaDeviceProp`.
    unsafe { write_out(prop, value) }
}

pub unsafe fn cudaDeviceGetAttribute(value: *mut c_int, attr: c_int, device: c_int) -> CudaResult<()> {
    let index = valid_device(device)?;
    let attribute = u32::try_from(attr).map_err(|_| CudaError::INVALID_VALUE)?;
    let device = client()?.device(index).ok_or(CudaError::INVALID_DEVICE)?;
    let found = crate::props::served_attribute(&device, attribute).ok_or(CudaError::INVALID_VALUE)?;
    // SAFETY: the app's out-pointer.
    unsafe { write_out(value, found) }
}

pub unsafe fn cudaDeviceSynchronize() -> CudaResult<()> {
    let client = client()?;
    call(client, req::DeviceSynchronize {}).map(|_| ())
}

pub unsafe fn cudaDeviceReset() -> CudaResult<()> {
    // Reset without a session is a no-op, as on a process that never touched the GPU.
    let Some(client) = existing_client() else {
        return Ok(());
    };
    call(client, req::DeviceReset {})?;
    client.forget_allocations();
    client.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clear();
    client.events.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clear();
    super::capture::forget_all();
    client.reset_generation.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    Ok(())
}

pub unsafe fn cudaDeviceSetLimit(limit: c_int, value: usize) -> CudaResult<()> {
    let limit = u32::try_from(limit).map_err(|_| CudaError::INVALID_VALUE)?;
    call(client()?, req::DeviceSetLimit { limit, value: value as u64 }).map(|_| ())
}

pub unsafe fn cudaDeviceGetLimit(value: *mut usize, limit: c_int) -> CudaResult<()> {
    let limit = u32::try_from(limit).map_err(|_| CudaError::INVALID_VALUE)?;
    let reply = call(client()?, req::DeviceGetLimit { limit })?;
    // SAFETY: the app's out-pointer.
    unsafe { write_out(value, usize::try_from(reply.value).unwrap_or(usize::MAX)) }
}

pub unsafe fn cudaMemGetInfo(free: *mut usize, total: *mut usize) -> CudaResult<()> {
    if free.is_null() || total.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let reply = call(client()?, req::MemGetInfo {})?;
    // SAFETY: both out-pointers were checked non-NULL above and are the app's.
    unsafe {
        write_out(free, usize::try_from(reply.free).unwrap_or(usize::MAX))?;
        write_out(total, usize::try_from(reply.total).unwrap_or(usize::MAX))
    }
}

pub unsafe fn cudaDriverGetVersion(version: *mut c_int) -> CudaResult<()> {
    // With no reachable server there is no driver: CUDA answers 0 and success.
    let driver = client().map_or(0, |client| client.info.driver_version);
    // SAFETY: the app's out-pointer.
    unsafe { write_out(version, driver) }
}

pub unsafe fn cudaRuntimeGetVersion(version: *mut c_int) -> CudaResult<()> {
    // SAFETY: the app's out-pointer.
    unsafe { write_out(version, RUNTIME_VERSION) }
}
