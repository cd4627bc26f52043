//! Kernel attributes and occupancy, through the driver (which asks the server once per kernel
//! and keeps the answer).

use std::ffi::{c_char, c_int, c_uint, c_void};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::handshake::RUNTIME_VERSION;

use crate::driver::{CUkernel, cu, cu_ctx};
use crate::ffi::{cudaKernel_t, write_out};
use crate::props::cudaFuncAttributes;
use crate::registry::{kernel_by_handle, kernel_by_host};

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
        cu_ctx!(cuFuncGetAttribute(&mut value, id.cast_unsigned(), kernel.cast()))?;
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
    cu_ctx!(cuFuncSetAttribute(kernel.cast(), attr.cast_unsigned(), value))
}

/// A kernel's cache preference (`cudaFuncCache`: the driver's `CUfunc_cache` numbers). A host
/// function that is no kernel is an invalid resource handle here (CUDA 13's runtime, measured),
/// where `cudaFuncSetAttribute` says invalid device function.
pub unsafe fn cudaFuncSetCacheConfig(func: *const c_void, config: c_int) -> CudaResult<()> {
    let registered = kernel_by_host(func as usize).ok_or(CudaError::INVALID_RESOURCE_HANDLE)?;
    let config = c_uint::try_from(config).map_err(|_| CudaError::INVALID_VALUE)?;
    let kernel = registered.handle()?;
    cu_ctx!(cuFuncSetCacheConfig(kernel.cast(), config))
}

pub unsafe fn cudaFuncGetName(name: *mut *const c_char, func: *const c_void) -> CudaResult<()> {
    if name.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let kernel = kernel(func)?;
    cu_ctx!(cuFuncGetName(name, kernel.cast()))
}

pub unsafe fn cudaFuncGetParamInfo(func: *const c_void, index: usize, offset: *mut usize, size: *mut usize) -> CudaResult<()> {
    let kernel = kernel(func)?;
    cu_ctx!(cuFuncGetParamInfo(kernel.cast(), index, offset, size))
}

pub unsafe fn cudaFuncSetSharedMemConfig(func: *const c_void, config: c_int) -> CudaResult<()> {
    let registered = kernel_by_host(func as usize).ok_or(CudaError::INVALID_RESOURCE_HANDLE)?;
    let config = c_uint::try_from(config).map_err(|_| CudaError::INVALID_VALUE)?;
    let kernel = registered.handle()?;
    cu_ctx!(cuFuncSetSharedMemConfig(kernel.cast(), config))
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
    cu_ctx!(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&mut value, kernel.cast(), block_size, dynamic_smem, flags))?;
    // SAFETY: checked non-NULL above; the app's out-pointer.
    unsafe { write_out(blocks, value) }
}

/// `cudaEnableDefault`, `cudaEnableLegacyStream`, `cudaEnablePerThreadDefaultStream`: the
/// driver's `CU_GET_PROC_ADDRESS_*` numbers; the default is the caller's build (legacy for the
/// plain entry point, per-thread for `_ptsz`), as NVIDIA's runtime resolves it.
fn entry_point_flags(flags: u64, per_thread: bool) -> u64 {
    match flags {
        0 if per_thread => 2,
        0 => 1,
        flags => flags,
    }
}

/// A driver function of Flyt's `libcuda.so.1` by base name, as `cuGetProcAddress_v2` resolves it.
fn driver_entry_point(
    symbol: *const c_char,
    func: *mut *mut c_void,
    version: c_uint,
    flags: u64,
    status: *mut c_int,
    per_thread: bool,
) -> CudaResult<()> {
    if symbol.is_null() || func.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let version = c_int::try_from(version).map_err(|_| CudaError::INVALID_VALUE)?;
    cu!(cuGetProcAddress_v2(symbol, func, version, entry_point_flags(flags, per_thread), status.cast()))
}

per_thread_twins! {
    cudaGetDriverEntryPoint, cudaGetDriverEntryPoint_ptsz
        (symbol: *const c_char, func: *mut *mut c_void, flags: u64, status: *mut c_int)
        |per_thread| driver_entry_point(symbol, func, RUNTIME_VERSION.cast_unsigned(), flags, status, per_thread)
}

per_thread_twins! {
    cudaGetDriverEntryPointByVersion, cudaGetDriverEntryPointByVersion_ptsz
        (symbol: *const c_char, func: *mut *mut c_void, version: c_uint, flags: u64, status: *mut c_int)
        |per_thread| driver_entry_point(symbol, func, version, flags, status, per_thread)
}

/// The driver's handle of a kernel by its host stub (a `CUkernel`, which the driver takes as a
/// `CUfunction` too).
pub unsafe fn cudaGetFuncBySymbol(func: *mut *mut c_void, symbol: *const c_void) -> CudaResult<()> {
    if func.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let handle = kernel(symbol)?;
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(func, handle.cast()) }
}

/// The `cudaKernel_t` of a kernel by its host stub, as the launch stubs ask for it.
pub unsafe fn cudaGetKernel(kernel: *mut cudaKernel_t, entry: *const c_void) -> CudaResult<()> {
    // SAFETY: forwarded contract.
    unsafe { super::launch::__cudaGetKernel(kernel, entry) }
}

pub unsafe fn cudaOccupancyAvailableDynamicSMemPerBlock(
    size: *mut usize,
    func: *const c_void,
    blocks: c_int,
    block_size: c_int,
) -> CudaResult<()> {
    if size.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let kernel = kernel(func)?;
    let mut value = 0usize;
    cu_ctx!(cuOccupancyAvailableDynamicSMemPerBlock(&mut value, kernel.cast(), blocks, block_size))?;
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(size, value) }
}

/// A settable attribute of a `cudaKernel_t` this runtime gave out, for one device.
pub unsafe fn cudaKernelSetAttributeForDevice(kernel: cudaKernel_t, attr: c_int, value: c_int, device: c_int) -> CudaResult<()> {
    let registered = kernel_by_handle(kernel as usize).ok_or(CudaError::INVALID_DEVICE_FUNCTION)?;
    if !SETTABLE_ATTRIBUTES.contains(&attr) {
        return Err(CudaError::INVALID_VALUE);
    }
    let handle = registered.handle()?;
    cu_ctx!(cuKernelSetAttribute(attr.cast_unsigned(), value, handle, device))
}
