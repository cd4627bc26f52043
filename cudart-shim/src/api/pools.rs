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

driver_forwards! {
    cudaDeviceGetDefaultMemPool(pool: *mut *mut c_void, device: c_int) => cuDeviceGetDefaultMemPool(pool.cast(), device);
    cudaDeviceGetMemPool(pool: *mut *mut c_void, device: c_int) => cuDeviceGetMemPool(pool.cast(), device);
    cudaDeviceSetMemPool(device: c_int, pool: *mut c_void) => cuDeviceSetMemPool(device, pool.cast());
    cudaMemPoolGetAttribute(pool: *mut c_void, attribute: c_int, value: *mut c_void) => cuMemPoolGetAttribute(pool.cast(), attribute.cast_unsigned(), value);
    cudaMemPoolSetAttribute(pool: *mut c_void, attribute: c_int, value: *mut c_void) => cuMemPoolSetAttribute(pool.cast(), attribute.cast_unsigned(), value);
    cudaMemPoolTrimTo(pool: *mut c_void, keep: usize) => cuMemPoolTrimTo(pool.cast(), keep);
    cudaMemPoolCreate(pool: *mut *mut c_void, props: *const c_void) => cuMemPoolCreate(pool.cast(), props.cast());
    cudaMemPoolDestroy(pool: *mut c_void) => cuMemPoolDestroy(pool.cast());
}

// --- pools shared between processes: the runtime's handle types and export data are the
// driver's ---

driver_forwards! {
    cudaMemPoolExportToShareableHandle(handle: *mut c_void, pool: *mut c_void, handle_type: c_int, flags: c_uint) => cuMemPoolExportToShareableHandle(handle, pool.cast(), handle_type.cast_unsigned(), u64::from(flags));
    cudaMemPoolImportFromShareableHandle(pool: *mut *mut c_void, handle: *mut c_void, handle_type: c_int, flags: c_uint) => cuMemPoolImportFromShareableHandle(pool.cast(), handle, handle_type.cast_unsigned(), u64::from(flags));
    cudaMemPoolExportPointer(data: *mut c_void, ptr: *mut c_void) => cuMemPoolExportPointer(data.cast(), ptr as CUdeviceptr);
}

pub unsafe fn cudaMemPoolImportPointer(ptr: *mut *mut c_void, pool: *mut c_void, data: *mut c_void) -> CudaResult<()> {
    allocate(ptr, |device| cu_ctx!(cuMemPoolImportPointer(device, pool.cast(), data.cast())))
}
