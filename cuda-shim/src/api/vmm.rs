//! Virtual memory management (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`...), as NCCL and
//! PyTorch's expandable segments use it: pinned memory of the session's device, mapped into
//! ranges the server reserved; handles are ids the client chooses. Properties Flyt cannot give
//! (other locations, shareable handles other than a POSIX file descriptor, compression) are
//! refused at the call with one line.

use std::ffi::{c_int, c_ulonglong, c_void};

use flyt_protocol::ops::mem_usage;

use super::session::{driver_error, run, session_client};
use crate::CUresult;
use crate::ffi::{DriverResult, non_null, write_out};
use crate::generated::types::{
    CUdeviceptr, CUmemAccessDesc, CUmemAllocationGranularity_flags, CUmemAllocationHandleType, CUmemAllocationProp,
    CUmemAllocationProp_st_allocFlags, CUmemGenericAllocationHandle, CUmemLocation,
};

/// `CU_MEM_ALLOCATION_TYPE_PINNED`, `CU_MEM_LOCATION_TYPE_DEVICE`.
const ALLOCATION_PINNED: u32 = 1;
const LOCATION_DEVICE: u32 = 1;
/// `CU_MEM_LOCATION_TYPE_HOST`, `_HOST_NUMA` and `_HOST_NUMA_CURRENT`.
const LOCATION_HOST: u32 = 2;
const LOCATION_HOST_NUMA: u32 = 3;
const LOCATION_HOST_NUMA_CURRENT: u32 = 4;
/// `CU_MEM_HANDLE_TYPE_NONE`, `_POSIX_FILE_DESCRIPTOR` and `_FABRIC`.
const HANDLE_TYPES_SUPPORTED: u32 = 0x1 | FABRIC;
/// `CU_MEM_HANDLE_TYPE_FABRIC`: asked for by XLA's allocator on every GPU (the driver creates
/// such memory and answers its granularity on machines without a fabric too); made here as
/// the other types ask, and only its export is refused.
const FABRIC: u32 = 0x8;
const POSIX_FD: u32 = 0x1;
/// What a shareable handle's descriptor holds first: a sealed memory file of Flyt's, holding
/// what the server gave for the export (the driver's own descriptor stays on the server).
const SHAREABLE_MAGIC: &[u8; 8] = b"FLYTMEMH";
/// More than any server's shareable (a socket name and a token).
const MAX_SHAREABLE: usize = 256;

fn refuse(what: &str) -> CUresult {
    crate::diagnostics::once(
        &format!("vmm-{what}"),
        &format!("flyt: virtual memory with {what} is not supported (returning CUDA_ERROR_NOT_SUPPORTED)"),
    );
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

/// A device of the session as a location: its ordinal.
fn device_location(location: &CUmemLocation) -> DriverResult<i32> {
    if location.r#type != LOCATION_DEVICE {
        return Err(refuse("a location other than the device"));
    }
    match session_client()?.server_device(usize::try_from(location.id).unwrap_or(usize::MAX)) {
        Some(_) => Ok(location.id),
        None => Err(CUresult::CUDA_ERROR_INVALID_DEVICE),
    }
}

/// Runs `call` with the calling thread's requests made on the app's device `device` (what a
/// location names, whichever device is current), then as before.
fn on_device<T>(device: i32, call: impl FnOnce() -> DriverResult<T>) -> DriverResult<T> {
    let client = session_client()?;
    let server = client.server_device(usize::try_from(device).unwrap_or(usize::MAX)).ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)?;
    let before = flyt_client::devices::thread_device();
    if server == before {
        return call();
    }
    flyt_client::devices::set_thread_device(server);
    let result = call();
    flyt_client::devices::set_thread_device(before);
    result
}

/// Checks allocation properties; the requested handle types and the usage
/// (`CU_MEM_CREATE_USAGE_*`: a tile pool for sparse arrays, decompression buffers).
///
/// # Safety
/// `prop` is NULL or a readable `CUmemAllocationProp`.
unsafe fn allocation_prop(prop: *const CUmemAllocationProp) -> DriverResult<(u32, u32, i32)> {
    non_null([prop.cast()])?;
    // SAFETY: checked non-NULL; the caller's struct.
    let p = unsafe { &*prop };
    if p.r#type != ALLOCATION_PINNED {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let device = device_location(&p.location)?;
    if p.requestedHandleTypes & !HANDLE_TYPES_SUPPORTED != 0 {
        return Err(refuse("shareable handles other than a POSIX file descriptor"));
    }
    if p.allocFlags.compressionType != 0 {
        return Err(refuse("compression"));
    }
    let usage = u32::from(p.allocFlags.usage);
    if usage & !mem_usage::ALL != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    Ok((p.requestedHandleTypes & !FABRIC, usage, device))
}

pub unsafe fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const CUmemAllocationProp,
    option: CUmemAllocationGranularity_flags,
) -> CUresult {
    run(|| {
        non_null([granularity.cast()])?;
        non_null([prop.cast()])?;
        // SAFETY: checked non-NULL; the caller's struct.
        let mut device_prop = unsafe { prop.read() };
        // Host memory is asked about too: NCCL asks before it tries a host allocation (which
        // `cuMemCreate` refuses, so NCCL takes its other path), and stops if the query fails.
        let host = matches!(device_prop.location.r#type, LOCATION_HOST | LOCATION_HOST_NUMA | LOCATION_HOST_NUMA_CURRENT);
        if host {
            device_prop.location = CUmemLocation { r#type: LOCATION_DEVICE, id: 0 };
        }
        // SAFETY: a local struct.
        let (_, _, device) = unsafe { allocation_prop(&device_prop) }?;
        if option > 1 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let value = on_device(device, || session_client()?.mem_granularity(option == 1, host).map_err(driver_error))?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(granularity, value as usize) }
    })
}

pub unsafe fn cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, alignment: usize, addr: CUdeviceptr, flags: c_ulonglong) -> CUresult {
    run(|| {
        non_null([ptr.cast()])?;
        if flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let reserved = session_client()?.mem_address_reserve(size as u64, alignment as u64, addr).map_err(driver_error)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(ptr, reserved) }
    })
}

pub unsafe fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    run(|| session_client()?.mem_address_free(ptr, size as u64).map_err(driver_error))
}

pub unsafe fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: c_ulonglong,
) -> CUresult {
    run(|| {
        non_null([handle.cast()])?;
        if flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's struct.
        let (handle_types, usage, device) = unsafe { allocation_prop(prop) }?;
        let created = on_device(device, || session_client()?.mem_create(size as u64, handle_types, usage).map_err(driver_error))?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(handle, created) }
    })
}

pub unsafe fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    run(|| session_client()?.mem_release(handle).map_err(driver_error))
}

pub unsafe fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: c_ulonglong) -> CUresult {
    run(|| {
        if flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        session_client()?.mem_map(ptr, size as u64, offset as u64, handle).map_err(driver_error)
    })
}

pub unsafe fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    run(|| session_client()?.mem_unmap(ptr, size as u64).map_err(driver_error))
}

pub unsafe fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) -> CUresult {
    run(|| {
        if count == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        non_null([desc.cast()])?;
        // SAFETY: the caller's array of `count` descriptors.
        let descs = unsafe { std::slice::from_raw_parts(desc, count) };
        for desc in descs {
            device_location(&desc.location)?;
        }
        // Each device's access, set with that device current on the server.
        for desc in descs {
            on_device(desc.location.id, || session_client()?.mem_set_access(ptr, size as u64, desc.flags).map_err(driver_error))?;
        }
        Ok(())
    })
}

pub unsafe fn cuMemGetAccess(flags: *mut c_ulonglong, location: *const CUmemLocation, ptr: CUdeviceptr) -> CUresult {
    run(|| {
        non_null([flags.cast(), location.cast()])?;
        // SAFETY: checked non-NULL; the caller's location.
        let device = device_location(unsafe { &*location })?;
        let access = on_device(device, || session_client()?.mem_access(ptr).map_err(driver_error))?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(flags, c_ulonglong::from(access)) }
    })
}

pub unsafe fn cuMemRetainAllocationHandle(handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void) -> CUresult {
    run(|| {
        non_null([handle.cast()])?;
        let retained = session_client()?.mem_retain(addr as u64).map_err(driver_error)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(handle, retained) }
    })
}

pub unsafe fn cuMemGetAllocationPropertiesFromHandle(prop: *mut CUmemAllocationProp, handle: CUmemGenericAllocationHandle) -> CUresult {
    run(|| {
        non_null([prop.cast()])?;
        let physical = session_client()?.mem_physical(handle).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let value = CUmemAllocationProp {
            r#type: ALLOCATION_PINNED,
            requestedHandleTypes: physical.handle_types,
            location: CUmemLocation { r#type: LOCATION_DEVICE, id: 0 },
            win32HandleMetaData: std::ptr::null_mut(),
            allocFlags: CUmemAllocationProp_st_allocFlags {
                compressionType: 0,
                gpuDirectRDMACapable: 0,
                // The driver does not read the usage back (0 for a tile pool: driver 580 on an
                // H200, natively).
                usage: 0,
                reserved: [0; 4],
            },
        };
        // SAFETY: checked non-NULL.
        unsafe { write_out(prop, value) }
    })
}

/// A sealed memory file holding `shareable`: the descriptor the app holds and may pass to
/// another process (over a Unix socket, or by inheritance), as it would the driver's.
pub(super) fn shareable_file(shareable: &[u8]) -> std::io::Result<std::os::fd::OwnedFd> {
    use nix::fcntl::{FcntlArg, SealFlag, fcntl};
    use nix::sys::memfd::{MFdFlags, memfd_create};
    let fd = memfd_create("flyt-shareable-memory", MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)?;
    let mut file = std::fs::File::from(fd);
    std::io::Write::write_all(&mut file, SHAREABLE_MAGIC)?;
    std::io::Write::write_all(&mut file, shareable)?;
    let seals = SealFlag::F_SEAL_WRITE | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_SEAL;
    fcntl(&file, FcntlArg::F_ADD_SEALS(seals))?;
    Ok(file.into())
}

/// What a shareable handle's descriptor holds, if it is one of Flyt's.
pub(super) fn read_shareable(fd: std::os::fd::RawFd) -> Option<Vec<u8>> {
    // SAFETY: the app's descriptor, borrowed for this call only (it stays the app's).
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let mut buf = [0u8; SHAREABLE_MAGIC.len() + MAX_SHAREABLE];
    let len = nix::sys::uio::pread(fd, &mut buf, 0).ok()?;
    buf[..len].strip_prefix(SHAREABLE_MAGIC.as_slice()).map(<[u8]>::to_vec)
}

pub unsafe fn cuMemExportToShareableHandle(
    shareable_handle: *mut c_void,
    handle: CUmemGenericAllocationHandle,
    handle_type: CUmemAllocationHandleType,
    flags: c_ulonglong,
) -> CUresult {
    run(|| {
        non_null([shareable_handle.cast()])?;
        if flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if handle_type != POSIX_FD {
            return Err(refuse("shareable handles other than a POSIX file descriptor"));
        }
        let shareable = session_client()?.mem_export(handle).map_err(driver_error)?;
        let fd = shareable_file(&shareable).map_err(|_| CUresult::CUDA_ERROR_OPERATING_SYSTEM)?;
        // SAFETY: checked non-NULL; for a POSIX descriptor the caller's out-pointer is an `int`.
        unsafe { write_out(shareable_handle.cast::<c_int>(), std::os::fd::IntoRawFd::into_raw_fd(fd)) }
    })
}

pub unsafe fn cuMemImportFromShareableHandle(
    handle: *mut CUmemGenericAllocationHandle,
    os_handle: *mut c_void,
    sh_handle_type: CUmemAllocationHandleType,
) -> CUresult {
    run(|| {
        non_null([handle.cast()])?;
        if sh_handle_type != POSIX_FD {
            return Err(refuse("shareable handles other than a POSIX file descriptor"));
        }
        // A POSIX descriptor travels as the pointer's value.
        let fd = c_int::try_from(os_handle as usize).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let shareable = read_shareable(fd).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let imported = session_client()?.mem_import(shareable).map_err(driver_error)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(handle, imported) }
    })
}
