//! Kernel attributes and occupancy: asked of the server, which holds the loaded kernels.

use std::ffi::{c_int, c_uint, c_void};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;

use crate::client::client;
use crate::ffi::write_out;
use crate::props::cudaFuncAttributes;
use crate::registry::{Function, function_by_host};

/// `cudaFuncAttribute`: the settable ones run from `cudaFuncAttributeMaxDynamicSharedMemorySize`
/// (8) to `cudaFuncAttributeClusterSchedulingPolicyPreference` (15).
const SETTABLE_ATTRIBUTES: std::ops::RangeInclusive<c_int> = 8..=15;
/// `cudaOccupancyDisableCachingOverride` is the only occupancy flag.
const OCCUPANCY_FLAGS: c_uint = 0x1;

fn function(func: *const c_void) -> CudaResult<std::sync::Arc<Function>> {
    function_by_host(func as usize).ok_or(CudaError::INVALID_DEVICE_FUNCTION)
}

pub unsafe fn cudaFuncGetAttributes(attributes: *mut cudaFuncAttributes, func: *const c_void) -> CudaResult<()> {
    let function = function(func)?;
    let a = client()?.function_attributes(&function)?;
    let size = |bytes: u64| usize::try_from(bytes).unwrap_or(usize::MAX);
    let value = cudaFuncAttributes {
        sharedSizeBytes: size(a.shared_size_bytes),
        constSizeBytes: size(a.const_size_bytes),
        localSizeBytes: size(a.local_size_bytes),
        maxThreadsPerBlock: a.max_threads_per_block,
        numRegs: a.num_regs,
        ptxVersion: a.ptx_version,
        binaryVersion: a.binary_version,
        cacheModeCA: a.cache_mode_ca,
        maxDynamicSharedSizeBytes: a.max_dynamic_shared_size_bytes,
        preferredShmemCarveout: a.preferred_shmem_carveout,
        clusterDimMustBeSet: a.cluster_dim_must_be_set,
        requiredClusterWidth: a.required_cluster_width,
        requiredClusterHeight: a.required_cluster_height,
        requiredClusterDepth: a.required_cluster_depth,
        clusterSchedulingPolicyPreference: a.cluster_scheduling_policy_preference,
        nonPortableClusterSizeAllowed: a.non_portable_cluster_size_allowed,
        reserved: [0; 16],
    };
    // SAFETY: the app's out-pointer to a CUDA 13 `cudaFuncAttributes`.
    unsafe { write_out(attributes, value) }
}

pub unsafe fn cudaFuncSetAttribute(func: *const c_void, attr: c_int, value: c_int) -> CudaResult<()> {
    let function = function(func)?;
    if !SETTABLE_ATTRIBUTES.contains(&attr) {
        return Err(CudaError::INVALID_VALUE);
    }
    let attribute = u32::try_from(attr).map_err(|_| CudaError::INVALID_VALUE)?;
    client()?.set_function_attribute(&function, attribute, value)
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
    let value = client()?.max_active_blocks(&*function(func)?, block_size, dynamic_smem, flags)?;
    // SAFETY: checked non-NULL above; the app's out-pointer.
    unsafe { write_out(blocks, value) }
}
