//! Stream-ordered allocation and memory pools (`cuMemAllocAsync`, `cuMemPool*`): the server's
//! driver allocates from the session's pools, each allocation counted in the quota until it is
//! freed. Pool handles are the client's ids; each device has its own default pool
//! (`default_pool_of` its index in the session) and current pool. Pools belong to their device:
//! asking about them needs no current context, as with the driver; a call naming a device runs
//! on it (`on_device`), and a pool's access from a device is set with that device current.
//!
//! Pools made with `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` are shared between processes as
//! natively: the exporter's descriptor is a sealed memory file naming the export (as for
//! physical allocations, `super::vmm`), and `CUmemPoolPtrExportData` holds a token the pool's
//! exporter serves (`rpc-server/src/shareable.rs`). A refusal of one of these says why, once.

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};

use flyt_client::vmm::{POSIX_FD, SharedPool};
use flyt_protocol::ops::{default_pool_of, req};

use super::session::{client, driver_error, resolve_stream, run, session_client};
use crate::CUresult;
use crate::ffi::{DriverResult, non_null, write_out};
use crate::generated::types::{
    CUdevice, CUdeviceptr, CUmemAccess_flags, CUmemAccessDesc, CUmemAllocationHandleType, CUmemAllocationType, CUmemLocation,
    CUmemPool_attribute, CUmemPoolProps, CUmemPoolPtrExportData, CUmemoryPool, CUstream,
};

/// Pool handles are this plus the pool's id, far from the other handle kinds.
const POOL_BASE: usize = 0x706f_0000_0000;

pub(super) fn pool_handle(id: u64) -> CUmemoryPool {
    std::ptr::without_provenance_mut(POOL_BASE + id as usize)
}

fn pool_id(pool: CUmemoryPool) -> DriverResult<u64> {
    (pool as usize).checked_sub(POOL_BASE).filter(|id| *id > 0).map(|id| id as u64).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
}

/// The app's device `dev` as the session numbers it (`CUDA_ERROR_INVALID_DEVICE` for a device
/// the app does not have).
fn session_device(dev: CUdevice) -> DriverResult<u32> {
    let index = usize::try_from(dev).map_err(|_| CUresult::CUDA_ERROR_INVALID_DEVICE)?;
    session_client()?.server_device(index).ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)
}

pub unsafe fn cuDeviceGetDefaultMemPool(pool_out: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    run(|| {
        non_null([pool_out.cast()])?;
        let device = session_device(dev)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(pool_out, pool_handle(default_pool_of(device))) }
    })
}

/// Device `dev`'s current pool, after making it `set` if given.
fn device_pool(dev: CUdevice, set: Option<u64>) -> DriverResult<u64> {
    session_device(dev)?;
    super::vmm::on_device(dev, || session_client()?.device_pool(set).map_err(driver_error))
}

pub unsafe fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    run(|| {
        non_null([pool.cast()])?;
        let current = device_pool(dev, None)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(pool, pool_handle(current)) }
    })
}

pub unsafe fn cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool) -> CUresult {
    run(|| device_pool(dev, Some(pool_id(pool)?)).map(drop))
}

fn alloc(dptr: *mut CUdeviceptr, size: usize, pool: u64, stream: CUstream, ptsz: bool) -> DriverResult {
    non_null([dptr.cast()])?;
    if size == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let client = session_client()?;
    let stream = resolve_stream(client, stream, ptsz)?;
    if client.shared_pool(pool) == Some(SharedPool::Imported) {
        return Err(invalid("cuMemAllocFromPoolAsync", "an imported pool makes no allocations"));
    }
    let ptr = client.alloc_async(size as u64, stream, pool).map_err(driver_error)?;
    // SAFETY: checked non-NULL.
    unsafe { write_out(dptr, ptr) }
}

per_thread_twins! {
    cuMemAllocAsync, cuMemAllocAsync_ptsz (dptr: *mut CUdeviceptr, bytesize: usize, h_stream: CUstream)
        |per_thread| run(|| alloc(dptr, bytesize, 0, h_stream, per_thread))
}

per_thread_twins! {
    cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz
        (
            dptr: *mut CUdeviceptr,
            bytesize: usize,
            pool: CUmemoryPool,
            h_stream: CUstream,
        )
        |per_thread| run(|| alloc(dptr, bytesize, pool_id(pool)?, h_stream, per_thread))
}

fn free(ptr: CUdeviceptr, stream: CUstream, ptsz: bool) -> DriverResult {
    let client = client()?;
    let stream = resolve_stream(client, stream, ptsz)?;
    client.free_async(ptr, stream).map_err(driver_error)
}

per_thread_twins! {
    cuMemFreeAsync, cuMemFreeAsync_ptsz (dptr: CUdeviceptr, h_stream: CUstream)
        |per_thread| run(|| free(dptr, h_stream, per_thread))
}

/// `CU_MEMPOOL_ATTR_REUSE_*` are `int`s; the other attributes are `cuuint64_t`s.
fn narrow(attribute: CUmemPool_attribute) -> bool {
    (1..=3).contains(&attribute)
}

pub unsafe fn cuMemPoolGetAttribute(pool: CUmemoryPool, attr: CUmemPool_attribute, value: *mut c_void) -> CUresult {
    run(|| {
        non_null([value.cast()])?;
        let read = session_client()?.pool_attribute(pool_id(pool)?, attr, None).map_err(driver_error)?;
        // SAFETY: checked non-NULL; the caller's value of the attribute's width.
        unsafe { if narrow(attr) { write_out(value.cast::<i32>(), read as i32) } else { write_out(value.cast::<u64>(), read) } }
    })
}

pub unsafe fn cuMemPoolSetAttribute(pool: CUmemoryPool, attr: CUmemPool_attribute, value: *mut c_void) -> CUresult {
    run(|| {
        non_null([value.cast()])?;
        // SAFETY: checked non-NULL; the caller's value of the attribute's width.
        let set = unsafe { if narrow(attr) { u64::from(value.cast::<i32>().read() as u32) } else { value.cast::<u64>().read() } };
        session_client()?.pool_attribute(pool_id(pool)?, attr, Some(set)).map(drop).map_err(driver_error)
    })
}

pub unsafe fn cuMemPoolTrimTo(pool: CUmemoryPool, min_bytes_to_keep: usize) -> CUresult {
    run(|| session_client()?.pool_trim(pool_id(pool)?, min_bytes_to_keep as u64).map_err(driver_error))
}

/// `CU_MEM_ALLOCATION_TYPE_PINNED`, `CU_MEM_LOCATION_TYPE_DEVICE`.
const ALLOCATION_PINNED: c_uint = 1;
const LOCATION_DEVICE: c_uint = 1;

pub unsafe fn cuMemPoolCreate(pool: *mut CUmemoryPool, pool_props: *const CUmemPoolProps) -> CUresult {
    run(|| {
        non_null([pool.cast(), pool_props.cast()])?;
        // SAFETY: checked non-NULL; the caller's properties.
        let props = unsafe { &*pool_props };
        if props.allocType != ALLOCATION_PINNED || props.location.r#type != LOCATION_DEVICE {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if props.handleTypes & !POSIX_FD != 0 || props.maxSize != 0 {
            crate::diagnostics::once(
                "pool-props",
                "flyt: memory pools with shareable handles other than a POSIX file descriptor, or a size limit, are not supported (returning CUDA_ERROR_NOT_SUPPORTED)",
            );
            return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
        // Made on the location's device, whichever is current (NCCL makes one per GPU).
        let id = super::vmm::on_device(props.location.id, || session_client()?.pool_create(props.handleTypes).map_err(driver_error))?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(pool, pool_handle(id)) }
    })
}

pub unsafe fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    run(|| session_client()?.pool_destroy(pool_id(pool)?).map_err(driver_error))
}

/// `CU_MEM_ALLOCATION_TYPE_MANAGED` and the host location types (`HOST`, `HOST_NUMA`,
/// `HOST_NUMA_CURRENT`): pools Flyt does not serve (`HOST_MEMORY_POOLS_SUPPORTED` reads 0).
const ALLOCATION_MANAGED: c_uint = 2;
const LOCATION_NONE: c_uint = 0;
const LOCATION_HOST_FIRST: c_uint = 2;
const LOCATION_HOST_LAST: c_uint = 4;

/// CUDA 13's location-based pool calls: the session's devices' pinned pools are served (the
/// app's device index is returned); host and managed pools answer `CUDA_ERROR_NOT_SUPPORTED`
/// with one line; anything else is invalid.
fn check_pool_location(name: &str, location: *const CUmemLocation, kind: CUmemAllocationType) -> DriverResult<CUdevice> {
    non_null([location.cast()])?;
    // SAFETY: checked non-NULL; the caller's location.
    let location = unsafe { &*location };
    let host = (LOCATION_HOST_FIRST..=LOCATION_HOST_LAST).contains(&location.r#type);
    match (kind, location.r#type) {
        (ALLOCATION_PINNED, LOCATION_DEVICE) => session_device(location.id).map(|_| location.id),
        (ALLOCATION_PINNED, _) if host => Err(not_served(name, "host memory pools")),
        (ALLOCATION_MANAGED, LOCATION_NONE | LOCATION_DEVICE) => Err(not_served(name, "managed memory pools")),
        (ALLOCATION_MANAGED, _) if host => Err(not_served(name, "managed memory pools")),
        _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

fn not_served(name: &str, what: &str) -> CUresult {
    crate::diagnostics::once(
        &format!("{name}-{what}"),
        &format!("flyt: {name}: {what} are not supported through Flyt (returning CUDA_ERROR_NOT_SUPPORTED)"),
    );
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

pub unsafe fn cuMemGetDefaultMemPool(pool_out: *mut CUmemoryPool, location: *mut CUmemLocation, type_: CUmemAllocationType) -> CUresult {
    run(|| {
        non_null([pool_out.cast()])?;
        let device = session_device(check_pool_location("cuMemGetDefaultMemPool", location, type_)?)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(pool_out, pool_handle(default_pool_of(device))) }
    })
}

pub unsafe fn cuMemGetMemPool(pool: *mut CUmemoryPool, location: *mut CUmemLocation, type_: CUmemAllocationType) -> CUresult {
    run(|| {
        non_null([pool.cast()])?;
        let current = device_pool(check_pool_location("cuMemGetMemPool", location, type_)?, None)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(pool, pool_handle(current)) }
    })
}

pub unsafe fn cuMemSetMemPool(location: *mut CUmemLocation, type_: CUmemAllocationType, pool: CUmemoryPool) -> CUresult {
    run(|| device_pool(check_pool_location("cuMemSetMemPool", location, type_)?, Some(pool_id(pool)?)).map(drop))
}

/// `CUmemAccess_flags`: `PROT_NONE`, `PROT_READ`, `PROT_READWRITE`.
const ACCESS_FLAGS: [c_uint; 3] = [0, 1, 3];

/// A pool's access from a device location: one of the session's devices (the app's index).
fn check_access_location(location: &CUmemLocation) -> DriverResult<CUdevice> {
    if location.r#type != LOCATION_DEVICE {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    session_device(location.id).map(|_| location.id)
}

pub unsafe fn cuMemPoolSetAccess(pool: CUmemoryPool, map: *const CUmemAccessDesc, count: usize) -> CUresult {
    run(|| {
        let id = pool_id(pool)?;
        if count == 0 {
            return Ok(());
        }
        non_null([map.cast()])?;
        // SAFETY: checked non-NULL; the caller passes `count` descriptors.
        let descriptors = unsafe { std::slice::from_raw_parts(map, count) };
        for desc in descriptors {
            check_access_location(&desc.location)?;
            if !ACCESS_FLAGS.contains(&desc.flags) {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
        }
        // Each device's access is set with that device current (the session's rule).
        for desc in descriptors {
            let set = || session_client()?.call(req::MemPoolAccess { pool: id, set: Some(desc.flags) }).map_err(driver_error);
            super::vmm::on_device(desc.location.id, set)?;
        }
        Ok(())
    })
}

pub unsafe fn cuMemPoolGetAccess(flags: *mut CUmemAccess_flags, mem_pool: CUmemoryPool, location: *mut CUmemLocation) -> CUresult {
    run(|| {
        non_null([flags.cast(), location.cast()])?;
        let id = pool_id(mem_pool)?;
        // SAFETY: checked non-NULL; the caller's location.
        let device = check_access_location(unsafe { &*location })?;
        let get = || session_client()?.call(req::MemPoolAccess { pool: id, set: None }).map_err(driver_error);
        let access = super::vmm::on_device(device, get)?.flags;
        // SAFETY: checked non-NULL.
        unsafe { write_out(flags, access) }
    })
}

// --- memory pools shared between processes ---

/// `CUDA_ERROR_NOT_SUPPORTED` for a shareable handle type other than a POSIX file descriptor,
/// with its line.
fn other_handle_type() -> CUresult {
    crate::diagnostics::once(
        "pool-handle-type",
        "flyt: memory pools with shareable handles other than a POSIX file descriptor are not supported (returning CUDA_ERROR_NOT_SUPPORTED)",
    );
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

/// `CUDA_ERROR_INVALID_VALUE` from `name`, with a line saying `why` (once per function and reason).
fn invalid(name: &str, why: &str) -> CUresult {
    crate::diagnostics::once(&format!("{name}: {why}"), &format!("flyt: {name}: {why} (returning CUDA_ERROR_INVALID_VALUE)"));
    CUresult::CUDA_ERROR_INVALID_VALUE
}

/// The session's answer, an invalid value said as `why`.
fn refused_as<T>(result: flyt_protocol::error::CudaResult<T>, name: &str, why: &str) -> DriverResult<T> {
    result.map_err(|error| match error {
        flyt_protocol::CudaError::INVALID_VALUE => invalid(name, why),
        error => driver_error(error),
    })
}

const NOT_EXPORTABLE: &str = "the pool was not made with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR";

pub unsafe fn cuMemPoolExportToShareableHandle(
    handle_out: *mut c_void,
    pool: CUmemoryPool,
    handle_type: CUmemAllocationHandleType,
    flags: c_ulonglong,
) -> CUresult {
    const NAME: &str = "cuMemPoolExportToShareableHandle";
    run(|| {
        non_null([handle_out.cast()])?;
        let id = pool_id(pool)?;
        if flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if handle_type != POSIX_FD {
            return Err(other_handle_type());
        }
        let client = session_client()?;
        if client.shared_pool(id) != Some(SharedPool::Exportable) {
            return Err(invalid(NAME, NOT_EXPORTABLE));
        }
        let shareable = refused_as(client.pool_export(id), NAME, NOT_EXPORTABLE)?;
        let fd = super::vmm::shareable_file(&shareable).map_err(|_| CUresult::CUDA_ERROR_OPERATING_SYSTEM)?;
        // SAFETY: checked non-NULL; for a POSIX descriptor the caller's out-pointer is an `int`.
        unsafe { write_out(handle_out.cast::<c_int>(), std::os::fd::IntoRawFd::into_raw_fd(fd)) }
    })
}

pub unsafe fn cuMemPoolImportFromShareableHandle(
    pool_out: *mut CUmemoryPool,
    handle: *mut c_void,
    handle_type: CUmemAllocationHandleType,
    flags: c_ulonglong,
) -> CUresult {
    const NAME: &str = "cuMemPoolImportFromShareableHandle";
    run(|| {
        non_null([pool_out.cast()])?;
        if flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if handle_type != POSIX_FD {
            return Err(other_handle_type());
        }
        // A POSIX descriptor travels as the pointer's value.
        let fd = c_int::try_from(handle as usize).map_err(|_| invalid(NAME, "the handle is not a file descriptor"))?;
        let shareable = super::vmm::read_shareable(fd)
            .ok_or_else(|| invalid(NAME, "the descriptor is not a shareable handle a memory pool was exported as through Flyt"))?;
        let client = session_client()?;
        let id = refused_as(client.pool_import(shareable), NAME, "the descriptor names no memory pool its exporter still shares")?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(pool_out, pool_handle(id)) }
    })
}

pub unsafe fn cuMemPoolExportPointer(share_data_out: *mut CUmemPoolPtrExportData, ptr: CUdeviceptr) -> CUresult {
    const NAME: &str = "cuMemPoolExportPointer";
    run(|| {
        non_null([share_data_out.cast()])?;
        let why = "the pointer is not the start of a live allocation of a pool made with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR";
        let data = refused_as(session_client()?.pool_export_pointer(ptr), NAME, why)?;
        // SAFETY: checked non-NULL; the caller's export data.
        unsafe { write_out(share_data_out, CUmemPoolPtrExportData { reserved: data }) }
    })
}

pub unsafe fn cuMemPoolImportPointer(ptr_out: *mut CUdeviceptr, pool: CUmemoryPool, share_data: *mut CUmemPoolPtrExportData) -> CUresult {
    const NAME: &str = "cuMemPoolImportPointer";
    run(|| {
        non_null([ptr_out.cast(), share_data.cast()])?;
        let id = pool_id(pool)?;
        let client = session_client()?;
        if client.shared_pool(id) != Some(SharedPool::Imported) {
            return Err(invalid(NAME, "the pool was not imported with cuMemPoolImportFromShareableHandle"));
        }
        // SAFETY: checked non-NULL; the caller's export data, read whole.
        let data = unsafe { share_data.read() }.reserved;
        let why = "the export data names no live allocation of the pool it was imported from";
        let ptr = refused_as(client.pool_import_pointer(id, data), NAME, why)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(ptr_out, ptr) }
    })
}
