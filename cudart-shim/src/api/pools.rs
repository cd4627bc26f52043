//! Stream-ordered allocation and memory pools: Flyt's driver does the work; the pointers become
//! the runtime's device ranges like those of `cudaMalloc`.

use std::ffi::{c_int, c_uint, c_void};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;

use crate::driver::{CUdeviceptr, cu_ctx};
use crate::ffi::{cudaStream_t, write_out};

/// Runs a driver allocation and gives the app its pointer.
fn allocate(out: *mut *mut c_void, driver: impl FnOnce(&mut CUdeviceptr) -> CudaResult<()>) -> CudaResult<()> {
    if out.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let mut device = 0;
    driver(&mut device)?;
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(out, device as *mut c_void) }
}

pub unsafe fn cudaMallocAsync(ptr: *mut *mut c_void, size: usize, stream: cudaStream_t) -> CudaResult<()> {
    allocate(ptr, |device| cu_ctx!(cuMemAllocAsync(device, size, stream.cast())))
}

pub unsafe fn cudaMallocAsync_ptsz(ptr: *mut *mut c_void, size: usize, stream: cudaStream_t) -> CudaResult<()> {
    allocate(ptr, |device| cu_ctx!(cuMemAllocAsync_ptsz(device, size, stream.cast())))
}

pub unsafe fn cudaMallocFromPoolAsync(ptr: *mut *mut c_void, size: usize, pool: *mut c_void, stream: cudaStream_t) -> CudaResult<()> {
    allocate(ptr, |device| cu_ctx!(cuMemAllocFromPoolAsync(device, size, pool.cast(), stream.cast())))
}

pub unsafe fn cudaMallocFromPoolAsync_ptsz(ptr: *mut *mut c_void, size: usize, pool: *mut c_void, stream: cudaStream_t) -> CudaResult<()> {
    allocate(ptr, |device| cu_ctx!(cuMemAllocFromPoolAsync_ptsz(device, size, pool.cast(), stream.cast())))
}

per_thread_twins! {
    cudaFreeAsync, cudaFreeAsync_ptsz (ptr: *mut c_void, stream: cudaStream_t)
        => cuMemFreeAsync, cuMemFreeAsync_ptsz (ptr as CUdeviceptr, stream.cast())
}

pub unsafe fn cudaDeviceGetDefaultMemPool(pool: *mut *mut c_void, device: c_int) -> CudaResult<()> {
    cu_ctx!(cuDeviceGetDefaultMemPool(pool.cast(), device))
}

pub unsafe fn cudaDeviceGetMemPool(pool: *mut *mut c_void, device: c_int) -> CudaResult<()> {
    cu_ctx!(cuDeviceGetMemPool(pool.cast(), device))
}

pub unsafe fn cudaDeviceSetMemPool(device: c_int, pool: *mut c_void) -> CudaResult<()> {
    cu_ctx!(cuDeviceSetMemPool(device, pool.cast()))
}

pub unsafe fn cudaMemPoolGetAttribute(pool: *mut c_void, attribute: c_int, value: *mut c_void) -> CudaResult<()> {
    cu_ctx!(cuMemPoolGetAttribute(pool.cast(), attribute.cast_unsigned(), value))
}

pub unsafe fn cudaMemPoolSetAttribute(pool: *mut c_void, attribute: c_int, value: *mut c_void) -> CudaResult<()> {
    cu_ctx!(cuMemPoolSetAttribute(pool.cast(), attribute.cast_unsigned(), value))
}

pub unsafe fn cudaMemPoolTrimTo(pool: *mut c_void, keep: usize) -> CudaResult<()> {
    cu_ctx!(cuMemPoolTrimTo(pool.cast(), keep))
}

pub unsafe fn cudaMemPoolCreate(pool: *mut *mut c_void, props: *const c_void) -> CudaResult<()> {
    cu_ctx!(cuMemPoolCreate(pool.cast(), props.cast()))
}

pub unsafe fn cudaMemPoolDestroy(pool: *mut c_void) -> CudaResult<()> {
    cu_ctx!(cuMemPoolDestroy(pool.cast()))
}

// --- pools shared between processes: the runtime's handle types and export data are the
// driver's ---

pub unsafe fn cudaMemPoolExportToShareableHandle(
    handle: *mut c_void,
    pool: *mut c_void,
    handle_type: c_int,
    flags: c_uint,
) -> CudaResult<()> {
    cu_ctx!(cuMemPoolExportToShareableHandle(handle, pool.cast(), handle_type.cast_unsigned(), u64::from(flags)))
}

pub unsafe fn cudaMemPoolImportFromShareableHandle(
    pool: *mut *mut c_void,
    handle: *mut c_void,
    handle_type: c_int,
    flags: c_uint,
) -> CudaResult<()> {
    cu_ctx!(cuMemPoolImportFromShareableHandle(pool.cast(), handle, handle_type.cast_unsigned(), u64::from(flags)))
}

pub unsafe fn cudaMemPoolExportPointer(data: *mut c_void, ptr: *mut c_void) -> CudaResult<()> {
    cu_ctx!(cuMemPoolExportPointer(data.cast(), ptr as CUdeviceptr))
}

pub unsafe fn cudaMemPoolImportPointer(ptr: *mut *mut c_void, pool: *mut c_void, data: *mut c_void) -> CudaResult<()> {
    allocate(ptr, |device| cu_ctx!(cuMemPoolImportPointer(device, pool.cast(), data.cast())))
}
