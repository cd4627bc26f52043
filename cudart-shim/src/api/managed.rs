//! Managed memory (`cudaMallocManaged`) and its hints: prefetches, advice, stream attachment and
//! the range queries. Flyt's driver does the work: managed memory is had where the GPU's server
//! shares the app's host (the shared-memory channel), and is refused with the driver's one line
//! elsewhere. The runtime's `cudaMemLocation`, `cudaMemoryAdvise` and `cudaMemRangeAttribute` are
//! the driver's `CUmemLocation`, `CUmem_advise` and `CUmem_range_attribute` (same layout, same
//! numbers), so they go through as they are. `cudaFree` frees managed memory (`cuMemFree_v2`),
//! and `cudaPointerGetAttributes` reports it as `cudaMemoryTypeManaged`.

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;

use crate::driver::{CUdeviceptr, CUmemLocation, cu_ctx};
use crate::ffi::{cudaStream_t, write_out};

/// The runtime's `cudaMemLocation`: the driver's `CUmemLocation`.
#[allow(non_camel_case_types, reason = "the C type's name, as the CUDA headers spell it")]
pub type cudaMemLocation = CUmemLocation;

pub unsafe fn cudaMallocManaged(dev_ptr: *mut *mut c_void, size: usize, flags: c_uint) -> CudaResult<()> {
    if dev_ptr.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    // The driver checks the size (0 is invalid, as CUDA documents) and the flags.
    let mut ptr: CUdeviceptr = 0;
    cu_ctx!(cuMemAllocManaged(&mut ptr, size, flags))?;
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(dev_ptr, ptr as usize as *mut c_void) }
}

per_thread_twins! {
    cudaMemPrefetchAsync, cudaMemPrefetchAsync_ptsz (dev_ptr: *const c_void, count: usize, location: cudaMemLocation, flags: c_uint, stream: cudaStream_t)
        => cuMemPrefetchAsync_v2, cuMemPrefetchAsync_v2_ptsz (dev_ptr as CUdeviceptr, count, location, flags, stream.cast())
}

driver_forwards! {
    cudaMemAdvise(dev_ptr: *const c_void, count: usize, advice: c_int, location: cudaMemLocation) => cuMemAdvise_v2(dev_ptr as CUdeviceptr, count, advice.cast_unsigned(), location);
    cudaMemRangeGetAttribute(data: *mut c_void, data_size: usize, attribute: c_int, dev_ptr: *const c_void, count: usize) => cuMemRangeGetAttribute(data, data_size, attribute.cast_unsigned(), dev_ptr as CUdeviceptr, count);
    cudaMemRangeGetAttributes(data: *mut *mut c_void, data_sizes: *mut usize, attributes: *mut c_int, num_attributes: usize, dev_ptr: *const c_void, count: usize) => cuMemRangeGetAttributes(data, data_sizes, attributes.cast(), num_attributes, dev_ptr as CUdeviceptr, count);
}

per_thread_twins! {
    cudaStreamAttachMemAsync, cudaStreamAttachMemAsync_ptsz (stream: cudaStream_t, dev_ptr: *mut c_void, length: usize, flags: c_uint)
        => cuStreamAttachMemAsync, cuStreamAttachMemAsync_ptsz (stream.cast(), dev_ptr as CUdeviceptr, length, flags)
}

// The batches: the runtime's array of pointers is the driver's array of `CUdeviceptr` (both
// 64-bit addresses).

per_thread_twins! {
    cudaMemDiscardBatchAsync, cudaMemDiscardBatchAsync_ptsz (dptrs: *mut *mut c_void, sizes: *mut usize, count: usize, flags: c_ulonglong, stream: cudaStream_t)
        => cuMemDiscardBatchAsync, cuMemDiscardBatchAsync_ptsz (dptrs.cast::<CUdeviceptr>(), sizes, count, flags, stream.cast())
}

/// The batches that prefetch to locations, which take the same parameters.
macro_rules! batch_to_locations {
    ($($name:ident, $name_pt:ident => $driver:ident, $driver_pt:ident;)*) => {
        $(per_thread_twins! {
            $name, $name_pt
                (
                    dptrs: *mut *mut c_void,
                    sizes: *mut usize,
                    count: usize,
                    locations: *mut cudaMemLocation,
                    location_starts: *mut usize,
                    num_locations: usize,
                    flags: c_ulonglong,
                    stream: cudaStream_t,
                )
                => $driver, $driver_pt
                (dptrs.cast::<CUdeviceptr>(), sizes, count, locations, location_starts, num_locations, flags, stream.cast())
        })*
    };
}

batch_to_locations! {
    cudaMemPrefetchBatchAsync, cudaMemPrefetchBatchAsync_ptsz => cuMemPrefetchBatchAsync, cuMemPrefetchBatchAsync_ptsz;
    cudaMemDiscardAndPrefetchBatchAsync, cudaMemDiscardAndPrefetchBatchAsync_ptsz
        => cuMemDiscardAndPrefetchBatchAsync, cuMemDiscardAndPrefetchBatchAsync_ptsz;
}
