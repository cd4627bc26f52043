//! Peers, stream queries, pool access, CUDA 13's location-based pools and cluster occupancy,
//! through Flyt's driver. A session serves one device: it is not its own peer, so enabling peer
//! access answers as the runtime does for the current device, and peer copies are copies within
//! the device.

use std::ffi::{c_int, c_uint, c_void};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;

use super::device::valid_device;
use super::launch::{cudaLaunchConfig_t, driver_config};
use super::managed::cudaMemLocation;
use crate::driver::{CUdeviceptr, cu, cu_ctx, device_context};
use crate::ffi::{cudaStream_t, write_out};
use crate::registry::kernel_by_host;

pub unsafe fn cudaDeviceCanAccessPeer(can_access: *mut c_int, device: c_int, peer: c_int) -> CudaResult<()> {
    if can_access.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    cu!(cuDeviceCanAccessPeer(can_access, valid_device(device)?, valid_device(peer)?))
}

/// The runtime refuses the current device as its own peer with `cudaErrorInvalidDevice`; any
/// other device is asked of the driver (there is none in a session).
pub unsafe fn cudaDeviceEnablePeerAccess(peer: c_int, flags: c_uint) -> CudaResult<()> {
    let peer = valid_device(peer)?;
    if flags != 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    // The current device as its own peer: the driver's answer (cudaErrorPeerAccessUnsupported
    // natively, measured on an H100), which `cuCtxEnablePeerAccess` of its context gives.
    let context = device_context(peer)?;
    cu_ctx!(cuCtxEnablePeerAccess(context, 0))
}

pub unsafe fn cudaDeviceDisablePeerAccess(peer: c_int) -> CudaResult<()> {
    let context = device_context(valid_device(peer)?)?;
    cu_ctx!(cuCtxDisablePeerAccess(context))
}

pub unsafe fn cudaMemcpyPeer(dst: *mut c_void, dst_device: c_int, src: *const c_void, src_device: c_int, count: usize) -> CudaResult<()> {
    let dst_context = device_context(valid_device(dst_device)?)?;
    let src_context = device_context(valid_device(src_device)?)?;
    cu_ctx!(cuMemcpyPeer(dst as CUdeviceptr, dst_context, src as CUdeviceptr, src_context, count))
}

pub unsafe fn cudaMemcpyPeerAsync(
    dst: *mut c_void,
    dst_device: c_int,
    src: *const c_void,
    src_device: c_int,
    count: usize,
    stream: cudaStream_t,
) -> CudaResult<()> {
    let dst_context = device_context(valid_device(dst_device)?)?;
    let src_context = device_context(valid_device(src_device)?)?;
    cu_ctx!(cuMemcpyPeerAsync(dst as CUdeviceptr, dst_context, src as CUdeviceptr, src_context, count, stream.cast()))
}

per_thread_twins! {
    cudaStreamGetDevice, cudaStreamGetDevice_ptsz (stream: cudaStream_t, device: *mut c_int)
        => cuStreamGetDevice, cuStreamGetDevice_ptsz (stream.cast(), device)
}

per_thread_twins! {
    cudaStreamGetId, cudaStreamGetId_ptsz (stream: cudaStream_t, id: *mut u64)
        => cuStreamGetId, cuStreamGetId_ptsz (stream.cast(), id)
}

driver_forwards! {
    /// `cudaMemAccessDesc` is the driver's `CUmemAccessDesc`.
    cudaMemPoolSetAccess(pool: *mut c_void, descriptors: *const c_void, count: usize) => cuMemPoolSetAccess(pool.cast(), descriptors.cast(), count);
    cudaMemPoolGetAccess(flags: *mut c_int, pool: *mut c_void, location: *mut cudaMemLocation) => cuMemPoolGetAccess(flags.cast(), pool.cast(), location);
    /// `cudaMemAllocationType` and `cudaMemLocationType` number as the driver's.
    cudaMemGetDefaultMemPool(pool: *mut *mut c_void, location: *mut cudaMemLocation, kind: c_int) => cuMemGetDefaultMemPool(pool.cast(), location, kind.cast_unsigned());
    cudaMemGetMemPool(pool: *mut *mut c_void, location: *mut cudaMemLocation, kind: c_int) => cuMemGetMemPool(pool.cast(), location, kind.cast_unsigned());
    cudaMemSetMemPool(location: *mut cudaMemLocation, kind: c_int, pool: *mut c_void) => cuMemSetMemPool(location, kind.cast_unsigned(), pool.cast());
}

/// Declares the cluster occupancy queries: each the driver's query of the same name for the
/// kernel registered for a host stub, with the driver's form of the configuration.
macro_rules! cluster_occupancy_queries {
    ($($name:ident => $driver:ident;)*) => {$(
        pub unsafe fn $name(out: *mut c_int, func: *const c_void, config: *const cudaLaunchConfig_t) -> CudaResult<()> {
            if out.is_null() || config.is_null() {
                return Err(CudaError::INVALID_VALUE);
            }
            let kernel = kernel_by_host(func as usize).ok_or(CudaError::INVALID_DEVICE_FUNCTION)?.handle()?;
            // SAFETY: checked non-NULL; the app's configuration.
            let config = driver_config(unsafe { &*config })?;
            let mut value = 0;
            cu_ctx!($driver(&mut value, kernel.cast(), &config))?;
            // SAFETY: checked non-NULL; the app's out-pointer.
            unsafe { write_out(out, value) }
        }
    )*};
}

cluster_occupancy_queries! {
    cudaOccupancyMaxActiveClusters => cuOccupancyMaxActiveClusters;
    cudaOccupancyMaxPotentialClusterSize => cuOccupancyMaxPotentialClusterSize;
}

per_thread_twins! {
    /// `cudaMemcpyBatchAsync`: the driver's, whose `cudaMemcpyAttributes` are the driver's
    /// `CUmemcpyAttributes` field for field.
    cudaMemcpyBatchAsync, cudaMemcpyBatchAsync_ptsz
        (
            dsts: *const *mut c_void,
            srcs: *const *const c_void,
            sizes: *const usize,
            count: usize,
            attrs: *mut c_void,
            attrs_idxs: *mut usize,
            num_attrs: usize,
            stream: cudaStream_t,
        )
        => cuMemcpyBatchAsync_v2, cuMemcpyBatchAsync_v2_ptsz
        (dsts.cast_mut().cast(), srcs.cast_mut().cast(), sizes.cast_mut(), count, attrs.cast(), attrs_idxs, num_attrs, stream.cast())
}

per_thread_twins! {
    /// `cudaMemcpy3DBatchAsync`: the driver's; `cudaMemcpy3DBatchOp` is `CUDA_MEMCPY3D_BATCH_OP` field
    /// for field (this front's arrays are the driver's).
    cudaMemcpy3DBatchAsync, cudaMemcpy3DBatchAsync_ptsz (num_ops: usize, op_list: *mut c_void, flags: u64, stream: cudaStream_t)
        => cuMemcpy3DBatchAsync_v2, cuMemcpy3DBatchAsync_v2_ptsz (num_ops, op_list.cast(), flags, stream.cast())
}
