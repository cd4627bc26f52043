//! Kernel attributes and occupancy, through the driver (which asks the server once per kernel
//! and keeps the answer).

use std::ffi::{c_int, c_uint, c_void};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;

use crate::driver::{CUkernel, cu_ctx};
use crate::ffi::write_out;
use crate::props::cudaFuncAttributes;
use crate::registry::kernel_by_host;

/// `cudaFuncAttribute`: the settable ones run from `cudaFuncAttributeMaxDynamicSharedMemorySize`
/// (8) to `cudaFuncAttributeClusterSchedulingPolicyPreference` (15), numbered as the driver's
/// `CUfunction_attribute`.
const SETTABLE_ATTRIBUTES: std::ops::RangeInclusive<c_int> = 8..=15;
/// `cudaOccupancyDisableCachingOverride` is the only occupancy flag.
const OCCUPANCY_FLAGS: c_uint = 0x1;

/// The driver's handle of the kernel registered for a host stub.
fn kernel(func: *const c_void) -> CudaResult<CUkernel> {
    kernel_by_host(func as usize).ok_or(CudaError::INVALID_DEVICE_FUNCTION)?.handle()
}

/// `CU_FUNC_ATTRIBUTE_*`, in the order `cudaFuncAttributes` is filled.
mod attribute {
    pub const MAX_THREADS_PER_BLOCK: i32 = 0;
    pub const SHARED_SIZE_BYTES: i32 = 1;
    pub const CONST_SIZE_BYTES: i32 = 2;
    pub const LOCAL_SIZE_BYTES: i32 = 3;
    pub const NUM_REGS: i32 = 4;
    pub const PTX_VERSION: i32 = 5;
    pub const BINARY_VERSION: i32 = 6;
    pub const CACHE_MODE_CA: i32 = 7;
    pub const MAX_DYNAMIC_SHARED_SIZE_BYTES: i32 = 8;
    pub const PREFERRED_SHARED_MEMORY_CARVEOUT: i32 = 9;
    pub const CLUSTER_SIZE_MUST_BE_SET: i32 = 10;
    pub const REQUIRED_CLUSTER_WIDTH: i32 = 11;
    pub const REQUIRED_CLUSTER_HEIGHT: i32 = 12;
    pub const REQUIRED_CLUSTER_DEPTH: i32 = 13;
    pub const NON_PORTABLE_CLUSTER_SIZE_ALLOWED: i32 = 14;
    pub const CLUSTER_SCHEDULING_POLICY_PREFERENCE: i32 = 15;
}

pub unsafe fn cudaFuncGetAttributes(attributes: *mut cudaFuncAttributes, func: *const c_void) -> CudaResult<()> {
    use attribute::*;
    let kernel = kernel(func)?;
    let get = |id: i32| -> CudaResult<c_int> {
        let mut value = 0;
        cu_ctx!(cuFuncGetAttribute(&mut value, id, kernel))?;
        Ok(value)
    };
    let size = |id: i32| get(id).map(|value| usize::try_from(value).unwrap_or(0));
    let value = cudaFuncAttributes {
        sharedSizeBytes: size(SHARED_SIZE_BYTES)?,
        constSizeBytes: size(CONST_SIZE_BYTES)?,
        localSizeBytes: size(LOCAL_SIZE_BYTES)?,
        maxThreadsPerBlock: get(MAX_THREADS_PER_BLOCK)?,
        numRegs: get(NUM_REGS)?,
        ptxVersion: get(PTX_VERSION)?,
        binaryVersion: get(BINARY_VERSION)?,
        cacheModeCA: get(CACHE_MODE_CA)?,
        maxDynamicSharedSizeBytes: get(MAX_DYNAMIC_SHARED_SIZE_BYTES)?,
        preferredShmemCarveout: get(PREFERRED_SHARED_MEMORY_CARVEOUT)?,
        clusterDimMustBeSet: get(CLUSTER_SIZE_MUST_BE_SET)?,
        requiredClusterWidth: get(REQUIRED_CLUSTER_WIDTH)?,
        requiredClusterHeight: get(REQUIRED_CLUSTER_HEIGHT)?,
        requiredClusterDepth: get(REQUIRED_CLUSTER_DEPTH)?,
        clusterSchedulingPolicyPreference: get(CLUSTER_SCHEDULING_POLICY_PREFERENCE)?,
        nonPortableClusterSizeAllowed: get(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)?,
        reserved: [0; 16],
    };
    // SAFETY: the app's out-pointer to a CUDA 13 `cudaFuncAttributes`.
    unsafe { write_out(attributes, value) }
}

pub unsafe fn cudaFuncSetAttribute(func: *const c_void, attr: c_int, value: c_int) -> CudaResult<()> {
    let registered = kernel_by_host(func as usize).ok_or(CudaError::INVALID_DEVICE_FUNCTION)?;
    if !SETTABLE_ATTRIBUTES.contains(&attr) {
        return Err(CudaError::INVALID_VALUE);
    }
    let kernel = registered.handle()?;
    cu_ctx!(cuFuncSetAttribute(kernel, attr, value))
}

/// A kernel's cache preference (`cudaFuncCache`: the driver's `CUfunc_cache` numbers). A host
/// function that is no kernel is an invalid resource handle here (CUDA 13's runtime, measured),
/// where `cudaFuncSetAttribute` says invalid device function.
pub unsafe fn cudaFuncSetCacheConfig(func: *const c_void, config: c_int) -> CudaResult<()> {
    let registered = kernel_by_host(func as usize).ok_or(CudaError::INVALID_RESOURCE_HANDLE)?;
    let config = c_uint::try_from(config).map_err(|_| CudaError::INVALID_VALUE)?;
    let kernel = registered.handle()?;
    cu_ctx!(cuFuncSetCacheConfig(kernel, config))
}

pub unsafe fn cudaOccupancyMaxActiveBlocksPerMultiprocessor(
    blocks: *mut c_int,
    func: *const c_void,
    block_size: c_int,
    dynamic_smem: usize,
) -> CudaResult<()> {
    // SAFETY: same contract, default flags.
    unsafe { cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(blocks, func, block_size, dynamic_smem, 0) }
}

pub unsafe fn cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    blocks: *mut c_int,
    func: *const c_void,
    block_size: c_int,
    dynamic_smem: usize,
    flags: c_uint,
) -> CudaResult<()> {
    if blocks.is_null() || flags & !OCCUPANCY_FLAGS != 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    let kernel = kernel(func)?;
    let mut value = 0;
    cu_ctx!(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&mut value, kernel, block_size, dynamic_smem, flags))?;
    // SAFETY: checked non-NULL above; the app's out-pointer.
    unsafe { write_out(blocks, value) }
}
