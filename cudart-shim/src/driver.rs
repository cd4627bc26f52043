//! The driver under this runtime: Flyt's `libcuda.so.1`, which holds the process's one session
//! (as NVIDIA's runtime sits over NVIDIA's driver). It is loaded from this library's own folder
//! first (Flyt's library folder holds both), else by name, and its exports are looked up once,
//! into `flyt-cuda-sys`'s generated `DriverTable`: the runtime types no driver signature of its
//! own. Every call is in the process; the driver decides what crosses the wire.
//!
//! The runtime's implicit context lives here too: each thread works in the primary context of its
//! current device, retained and made current on the thread's first call, as NVIDIA's runtime does;
//! a context the app made current itself (driver API) is used as it is.

use std::cell::Cell;
use std::ffi::{c_int, c_uint};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;

pub use flyt_cuda_sys::CUresult;
use flyt_cuda_sys::DriverTable;
pub use flyt_cuda_sys::types::{
    CUDA_ARRAY_MEMORY_REQUIREMENTS, CUDA_ARRAY_SPARSE_PROPERTIES, CUDA_ARRAY3D_DESCRIPTOR, CUDA_CONDITIONAL_NODE_PARAMS,
    CUDA_KERNEL_NODE_PARAMS, CUDA_MEM_ALLOC_NODE_PARAMS_v2, CUDA_MEMCPY_NODE_PARAMS, CUDA_MEMCPY2D, CUDA_MEMCPY3D, CUDA_MEMCPY3D_PEER,
    CUDA_MEMSET_NODE_PARAMS_v2, CUDA_RESOURCE_DESC, CUDA_RESOURCE_VIEW_DESC, CUDA_TEXTURE_DESC, CUlaunchConfig,
};
/// The members of `CUDA_RESOURCE_DESC`'s union, by what they describe.
pub use flyt_cuda_sys::types::{
    CUDA_RESOURCE_DESC_st_res_array as CUresourceDescArray, CUDA_RESOURCE_DESC_st_res_linear as CUresourceDescLinear,
    CUDA_RESOURCE_DESC_st_res_mipmap as CUresourceDescMipmap, CUDA_RESOURCE_DESC_st_res_pitch2D as CUresourceDescPitch2D,
};
pub use flyt_cuda_sys::types::{
    CUarray, CUcontext, CUdeviceptr, CUevent, CUgraph, CUgraphExec, CUgraphNode, CUipcEventHandle, CUipcMemHandle, CUkernel, CUlibrary,
    CUmemLocation, CUmipmappedArray, CUstream,
};

/// `CUgraphNodeParams` and the runtime's `cudaGraphNodeParams`: the node type, a union of 29
/// 8-byte words (whose members differ for kernel, copy, memset and conditional nodes), a reserved
/// word.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GraphNodeParams {
    pub kind: c_int,
    pub reserved0: [c_int; 3],
    pub union: [u64; 29],
    pub reserved2: i64,
}

/// The runtime's and the driver's host functions and stream callbacks have one ABI.
pub use flyt_cuda_sys::types::{CUhostFn as HostFn, CUstreamCallback as StreamCallback};

/// `CU_MEMORYTYPE_UNIFIED`: the driver tells host from device memory by the pointer.
pub const MEMORYTYPE_UNIFIED: c_uint = 4;
/// `CU_MEMORYTYPE_HOST`: the side of a copy is host memory (`srcHost`/`dstHost`).
pub const MEMORYTYPE_HOST: c_uint = 1;
/// `CU_MEMORYTYPE_ARRAY`: the side of a copy is a CUDA array.
pub const MEMORYTYPE_ARRAY: c_uint = 3;

// The sizes of the C structs (cuda.h, x86_64).
const _: () = {
    assert!(size_of::<GraphNodeParams>() == 256);
};

/// The driver functions the runtime cannot start without: a `libcuda.so.1` lacking one is not
/// Flyt's driver, and the runtime refuses it at load (`cudaErrorInsufficientDriver`). Any other
/// export the runtime calls answers `cudaErrorNotSupported` where the driver lacks it.
macro_rules! missing_required {
    ($table:expr) => {
        missing_of!($table;
            cuInit, cuDriverGetVersion, cuDeviceGetCount, cuDeviceGetAttribute, cuDeviceGetName, cuDeviceGetUuid_v2,
            cuDeviceGetLuid, cuDeviceTotalMem_v2, cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxReset_v2,
            cuDevicePrimaryCtxSetFlags_v2, cuDevicePrimaryCtxGetState, cuCtxGetCurrent, cuCtxSetCurrent,
            cuCtxGetDevice, cuCtxSynchronize, cuCtxSetLimit, cuCtxGetLimit, cuCtxGetStreamPriorityRange,
            cuMemAlloc_v2, cuMemFree_v2, cuMemGetInfo_v2, cuMemHostAlloc, cuMemFreeHost, cuMemHostRegister_v2,
            cuMemHostUnregister, cuMemHostGetFlags, cuMemHostGetDevicePointer_v2, cuMemcpy, cuMemcpy_ptds,
            cuMemcpyAsync, cuMemcpyAsync_ptsz, cuMemcpy2DUnaligned_v2, cuMemcpy2DUnaligned_v2_ptds,
            cuMemcpy2DAsync_v2, cuMemcpy2DAsync_v2_ptsz, cuMemsetD8_v2, cuMemsetD8_v2_ptds, cuMemsetD8Async,
            cuMemsetD8Async_ptsz, cuPointerGetAttribute, cuStreamCreateWithPriority, cuStreamDestroy_v2,
            cuStreamSynchronize, cuStreamSynchronize_ptsz, cuStreamQuery, cuStreamQuery_ptsz, cuStreamWaitEvent,
            cuStreamWaitEvent_ptsz, cuStreamGetFlags, cuStreamGetFlags_ptsz, cuStreamGetPriority,
            cuStreamGetPriority_ptsz, cuStreamSetAttribute, cuIpcGetMemHandle, cuIpcOpenMemHandle_v2,
            cuIpcCloseMemHandle, cuIpcGetEventHandle, cuIpcOpenEventHandle, cuStreamSetAttribute_ptsz,
            cuStreamGetAttribute, cuStreamGetAttribute_ptsz, cuStreamCopyAttributes, cuStreamCopyAttributes_ptsz,
            cuEventCreate, cuEventRecordWithFlags, cuEventRecordWithFlags_ptsz, cuEventSynchronize, cuEventQuery,
            cuEventElapsedTime_v2, cuEventDestroy_v2, cuLibraryLoadData, cuLibraryLoadFromFile, cuLibraryUnload,
            cuLibraryGetKernelCount, cuLibraryEnumerateKernels, cuKernelGetName, cuLibraryGetKernel,
            cuLibraryGetGlobal, cuLibraryGetManaged, cuLaunchKernel, cuLaunchKernel_ptsz, cuLaunchCooperativeKernel,
            cuLaunchCooperativeKernel_ptsz, cuLaunchKernelEx, cuLaunchKernelEx_ptsz, cuFuncGetAttribute,
            cuFuncGetName, cuLogsRegisterCallback, cuLogsUnregisterCallback, cuLogsCurrent, cuLogsDumpToFile,
            cuLogsDumpToMemory, cuFuncGetParamInfo, cuFuncSetAttribute, cuFuncSetCacheConfig, cuCtxSetCacheConfig,
            cuCtxGetSharedMemConfig, cuDeviceGetTexture1DLinearMaxWidth, cuDeviceRegisterAsyncNotification,
            cuDeviceUnregisterAsyncNotification, cuDeviceGetHostAtomicCapabilities, cuDeviceGetP2PAtomicCapabilities,
            cuCtxSetSharedMemConfig, cuFuncSetSharedMemConfig, cuCtxGetCacheConfig, cuCtxResetPersistingL2Cache,
            cuProfilerStart, cuProfilerStop, cuDeviceGetP2PAttribute, cuStreamBeginCapture_v2,
            cuStreamBeginCapture_v2_ptsz, cuStreamBeginCaptureToGraph, cuStreamBeginCaptureToGraph_ptsz,
            cuStreamUpdateCaptureDependencies_v2, cuStreamUpdateCaptureDependencies_v2_ptsz, cuStreamEndCapture,
            cuStreamEndCapture_ptsz, cuStreamIsCapturing, cuStreamIsCapturing_ptsz, cuStreamGetCaptureInfo_v3,
            cuStreamGetCaptureInfo_v3_ptsz, cuThreadExchangeStreamCaptureMode, cuGraphCreate, cuGraphDestroy,
            cuGraphAddKernelNode_v2, cuGraphKernelNodeGetParams_v2, cuGraphKernelNodeSetParams_v2,
            cuGraphExecKernelNodeSetParams_v2, cuGraphAddMemcpyNode, cuGraphMemcpyNodeSetParams,
            cuGraphExecMemcpyNodeSetParams, cuGraphAddMemsetNode, cuGraphMemsetNodeSetParams,
            cuGraphExecMemsetNodeSetParams, cuGraphAddHostNode, cuGraphHostNodeSetParams,
            cuGraphExecHostNodeSetParams, cuGraphAddChildGraphNode, cuGraphExecChildGraphNodeSetParams,
            cuGraphAddEmptyNode, cuGraphAddEventRecordNode, cuGraphAddEventWaitNode, cuGraphEventRecordNodeSetEvent,
            cuGraphExecEventRecordNodeSetEvent, cuGraphEventWaitNodeSetEvent, cuGraphExecEventWaitNodeSetEvent,
            cuGraphAddDependencies_v2, cuGraphRemoveDependencies_v2, cuGraphGetNodes, cuGraphGetRootNodes,
            cuGraphNodeGetType, cuGraphDestroyNode, cuGraphClone, cuGraphNodeFindInClone, cuGraphInstantiateWithFlags,
            cuGraphInstantiateWithParams, cuGraphInstantiateWithParams_ptsz, cuGraphLaunch, cuGraphLaunch_ptsz,
            cuGraphUpload, cuGraphUpload_ptsz, cuGraphExecDestroy, cuGraphExecUpdate_v2, cuGraphDebugDotPrint,
            cuGraphAddMemAllocNode, cuGraphAddMemFreeNode, cuGraphMemAllocNodeGetParams, cuGraphMemFreeNodeGetParams,
            cuDeviceGraphMemTrim, cuDeviceGetGraphMemAttribute, cuDeviceSetGraphMemAttribute,
            cuGraphConditionalHandleCreate, cuGraphAddNode_v2, cuGraphNodeSetParams, cuGraphExecNodeSetParams,
            cuGraphNodeGetDependencies_v2, cuGraphNodeGetDependentNodes_v2, cuGraphGetEdges_v2, cuGraphNodeSetEnabled,
            cuGraphNodeGetEnabled, cuGraphExecGetFlags, cuGraphEventRecordNodeGetEvent, cuGraphEventWaitNodeGetEvent,
            cuGraphChildGraphNodeGetGraph, cuGraphHostNodeGetParams, cuGraphMemcpyNodeGetParams,
            cuGraphMemsetNodeGetParams, cuGraphKernelNodeGetAttribute, cuGraphKernelNodeSetAttribute,
            cuGraphKernelNodeCopyAttributes, cuUserObjectCreate, cuUserObjectRetain, cuUserObjectRelease,
            cuGraphRetainUserObject, cuGraphReleaseUserObject, cuGetProcAddress_v2,
            cuOccupancyAvailableDynamicSMemPerBlock, cuKernelSetAttribute, cuLaunchHostFunc, cuLaunchHostFunc_ptsz,
            cuStreamAddCallback, cuStreamAddCallback_ptsz, cuMemAllocAsync, cuMemAllocAsync_ptsz,
            cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz, cuMemFreeAsync, cuMemFreeAsync_ptsz,
            cuDeviceCanAccessPeer, cuCtxEnablePeerAccess, cuCtxDisablePeerAccess, cuMemcpyPeer, cuMemcpyPeerAsync,
            cuStreamGetDevice, cuStreamGetDevice_ptsz, cuStreamGetId, cuStreamGetId_ptsz, cuMemPoolSetAccess,
            cuMemPoolGetAccess, cuMemGetDefaultMemPool, cuMemGetMemPool, cuMemSetMemPool,
            cuOccupancyMaxActiveClusters, cuOccupancyMaxPotentialClusterSize, cuDeviceGetPCIBusId,
            cuDeviceGetByPCIBusId, cuDeviceGetDefaultMemPool, cuDeviceGetMemPool, cuDeviceSetMemPool,
            cuMemPoolGetAttribute, cuMemPoolSetAttribute, cuMemPoolTrimTo, cuMemPoolCreate, cuMemPoolDestroy,
            cuMemPoolExportToShareableHandle, cuMemPoolImportFromShareableHandle, cuMemPoolExportPointer,
            cuMemPoolImportPointer, cuMemAllocManaged, cuMemPrefetchAsync_v2, cuMemPrefetchAsync_v2_ptsz,
            cuMemAdvise_v2, cuMemRangeGetAttribute, cuMemRangeGetAttributes, cuStreamAttachMemAsync,
            cuStreamAttachMemAsync_ptsz, cuMemPrefetchBatchAsync, cuMemPrefetchBatchAsync_ptsz,
            cuMemDiscardBatchAsync, cuMemDiscardBatchAsync_ptsz, cuMemDiscardAndPrefetchBatchAsync,
            cuMemDiscardAndPrefetchBatchAsync_ptsz, cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags,
            cuMemAllocPitch_v2, cuMemsetD2D8_v2, cuMemsetD2D8_v2_ptds, cuMemsetD2D8Async, cuMemsetD2D8Async_ptsz,
            cuMemcpy3D_v2, cuMemcpy3D_v2_ptds, cuMemcpy3DAsync_v2, cuMemcpyBatchAsync_v2, cuMemcpy3DBatchAsync_v2,
            cuMemcpy3DBatchAsync_v2_ptsz, cuMemcpyBatchAsync_v2_ptsz, cuMemcpy3DAsync_v2_ptsz, cuMemcpy3DPeer,
            cuMemcpy3DPeer_ptds, cuMemcpy3DPeerAsync, cuMemcpy3DPeerAsync_ptsz, cuArray3DCreate_v2,
            cuArray3DGetDescriptor_v2, cuArrayDestroy, cuMipmappedArrayCreate, cuMipmappedArrayGetLevel,
            cuMipmappedArrayDestroy, cuArrayGetPlane, cuArrayGetSparseProperties, cuMipmappedArrayGetSparseProperties,
            cuArrayGetMemoryRequirements, cuMipmappedArrayGetMemoryRequirements, cuTexObjectCreate,
            cuTexObjectDestroy, cuTexObjectGetResourceDesc, cuTexObjectGetTextureDesc, cuTexObjectGetResourceViewDesc,
            cuSurfObjectCreate, cuSurfObjectDestroy, cuSurfObjectGetResourceDesc,
        )
    };
}

/// The names among `$name`s that `$table` lacks.
macro_rules! missing_of {
    ($table:expr; $($name:ident,)*) => {{
        let mut missing: Vec<&'static str> = Vec::new();
        $(if $table.$name.is_none() {
            missing.push(stringify!($name));
        })*
        missing
    }};
}

/// The driver under the runtime: the generated table of its exports (one declaration per export,
/// in `flyt-cuda-sys`), looked up once in the library, which stays loaded with it.
pub struct Driver {
    table: DriverTable,
    _library: libloading::Library,
}

impl std::ops::Deref for Driver {
    type Target = DriverTable;

    fn deref(&self) -> &DriverTable {
        &self.table
    }
}

impl Driver {
    fn resolve(library: libloading::Library) -> Result<Driver, String> {
        // SAFETY: `library` is the `libcuda.so.1` the front kit found (Flyt's driver, or one that
        // claims the name): its exports have the header's signatures. It stays loaded beside the
        // table in `Driver`.
        let table = unsafe { DriverTable::resolve(&library) };
        let missing = missing_required!(table);
        if !missing.is_empty() {
            return Err(format!("{} missing", missing.join(", ")));
        }
        Ok(Driver { table, _library: library })
    }
}

/// A call to an export the driver lacks: `cudaErrorNotSupported`, with one line naming it.
#[cold]
pub fn missing_export(name: &str) -> CudaError {
    crate::diagnostics::once(&format!("missing {name}"), &format!("flyt: the CUDA runtime cannot call {name}: the driver lacks it"));
    CudaError::NOT_SUPPORTED
}

/// [`missing_export`] as the driver's status (`CUDA_ERROR_NOT_SUPPORTED`).
#[cold]
pub fn missing_status(name: &str) -> CUresult {
    CUresult(missing_export(name).code())
}

/// `$driver.$name($args)`: the driver's status, `CUDA_ERROR_NOT_SUPPORTED` (named once) where the
/// driver lacks the export. The caller's arguments must meet the function's C contract.
macro_rules! driver_call {
    ($driver:expr, $name:ident($($arg:expr),* $(,)?)) => {
        match $driver.$name {
            // SAFETY: a driver API call with arguments that meet its C contract (the caller's duty,
            // stated where the macro is used).
            Some(function) => unsafe { function($($arg),*) },
            None => $crate::driver::missing_status(stringify!($name)),
        }
    };
}
pub(crate) use driver_call;

/// Calls a driver function: `cu!(cuMemFree_v2(ptr))` is its status as a `CudaResult<()>`.
/// The driver's status codes are the runtime's error numbers (CUDA numbers them alike).
macro_rules! cu {
    ($name:ident($($arg:expr),* $(,)?)) => {{
        match $crate::driver::driver() {
            // SAFETY: a driver API call with arguments that meet its C contract: the caller checked
            // what the app passed, or passes it on under the runtime function's own contract.
            Ok(driver) => flyt_protocol::CudaError::check($crate::driver::driver_call!(driver, $name($($arg),*)).0),
            Err(error) => Err(error),
        }
    }};
}
pub(crate) use cu;

/// Like [`cu!`], in the calling thread's context (see [`in_context`]).
macro_rules! cu_ctx {
    ($name:ident($($arg:expr),* $(,)?)) => {
        // SAFETY: as in `cu!`.
        $crate::driver::in_context(|driver| $crate::driver::driver_call!(driver, $name($($arg),*)))
    };
}
pub(crate) use cu_ctx;

static DRIVER: OnceLock<Result<Driver, CudaError>> = OnceLock::new();

/// The driver, loaded and initialized on first use. A driver that cannot be loaded is
/// `cudaErrorInsufficientDriver` for every call, as NVIDIA's runtime answers without one, with
/// one line saying why.
pub fn driver() -> CudaResult<&'static Driver> {
    DRIVER.get_or_init(load).as_ref().map_err(|error| *error)
}

/// The driver if it is loaded already (nothing is loaded or initialized for the asking).
pub fn loaded() -> Option<&'static Driver> {
    DRIVER.get().and_then(|driver| driver.as_ref().ok())
}

fn load() -> Result<Driver, CudaError> {
    let library = flyt_front_kit::driver_library::open().map_err(|reason| {
        crate::diagnostics::once("driver", &format!("flyt: the CUDA runtime found no driver: {reason}"));
        CudaError::INSUFFICIENT_DRIVER
    })?;
    let driver = Driver::resolve(library).map_err(|reason| {
        crate::diagnostics::once("driver", &format!("flyt: the libcuda.so.1 found is not a CUDA driver: {reason}"));
        CudaError::INSUFFICIENT_DRIVER
    })?;
    // `cuInit` takes flags by value; 0 is the only valid value.
    CudaError::check(driver_call!(driver, cuInit(0)).0)?;
    Ok(driver)
}

thread_local! {
    /// The thread's current device (`cudaSetDevice`).
    static CURRENT_DEVICE: Cell<c_int> = const { Cell::new(0) };
    /// The reset generation in which this thread last made sure of its context.
    static CONTEXT_CHECKED: Cell<u64> = const { Cell::new(u64::MAX) };
}

/// Bumped by `cudaDeviceReset`: primary contexts are retained again after it.
static RESET_GENERATION: AtomicU64 = AtomicU64::new(0);
/// The primary contexts this runtime holds a reference to: `(device, generation, context)`.
static RETAINED: Mutex<Vec<(c_int, u64, usize)>> = Mutex::new(Vec::new());

/// How many device resets this runtime made (what was found on the device before one may have
/// moved).
pub fn reset_generation() -> u64 {
    RESET_GENERATION.load(Ordering::Acquire)
}

/// Whether this runtime ever set up a context (so there is something to reset).
pub fn context_ever_made() -> bool {
    !RETAINED.lock().unwrap_or_else(std::sync::PoisonError::into_inner).is_empty()
}

pub fn current_device() -> c_int {
    CURRENT_DEVICE.try_with(Cell::get).unwrap_or(0)
}

/// The primary context of `device`, retained once per reset generation.
fn primary_context(driver: &Driver, device: c_int, generation: u64) -> CudaResult<CUcontext> {
    let mut retained = RETAINED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, _, context)) = retained.iter().find(|(d, g, _)| *d == device && *g == generation) {
        return Ok(*context as CUcontext);
    }
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: `context` is a local out-value.
    CudaError::check(driver_call!(driver, cuDevicePrimaryCtxRetain(&mut context, device)).0)?;
    retained.retain(|(d, _, _)| *d != device);
    retained.push((device, generation, context as usize));
    Ok(context)
}

/// The primary context of `device` (an ordinal the caller checked), retained by this runtime:
/// the context a copy that names its devices (`cudaMemcpy3DPeer`) runs in.
pub fn device_context(device: c_int) -> CudaResult<CUcontext> {
    primary_context(driver()?, device, RESET_GENERATION.load(Ordering::Acquire))
}

/// The driver, with the calling thread's context set up: on the thread's first call (and its first
/// after a reset) the primary context of its device is retained and, unless the app made a context
/// current itself (driver API), made current. Later calls cost one thread-local read: the driver
/// checks the current context on every call anyway, and [`in_context`] rebinds when it finds none.
pub fn ensure_context() -> CudaResult<&'static Driver> {
    let driver = driver()?;
    let generation = RESET_GENERATION.load(Ordering::Acquire);
    if CONTEXT_CHECKED.try_with(Cell::get).ok() != Some(generation) {
        bind_context(driver, generation)?;
    }
    Ok(driver)
}

fn bind_context(driver: &Driver, generation: u64) -> CudaResult<()> {
    let mut current: CUcontext = std::ptr::null_mut();
    // SAFETY: `current` is a local out-value.
    CudaError::check(driver_call!(driver, cuCtxGetCurrent(&mut current)).0)?;
    let primary = primary_context(driver, current_device(), generation)?;
    if current.is_null() || current == primary {
        // SAFETY: a context handle the driver gave out.
        CudaError::check(driver_call!(driver, cuCtxSetCurrent(primary)).0)?;
    }
    let _ = CONTEXT_CHECKED.try_with(|checked| checked.set(generation));
    Ok(())
}

/// `CUDA_ERROR_INVALID_CONTEXT`: the driver found no context current on the thread.
const INVALID_CONTEXT: CUresult = CUresult(201);

/// Runs a driver call in the thread's context. A call refused for want of a current context (the
/// app popped or unset it through the driver API) did nothing: the thread's primary context is made
/// current and the call made once more, as NVIDIA's runtime sets its context up again.
pub fn in_context(mut call: impl FnMut(&Driver) -> CUresult) -> CudaResult<()> {
    let driver = ensure_context()?;
    let status = call(driver);
    if status != INVALID_CONTEXT {
        return CudaError::check(status.0);
    }
    bind_context(driver, RESET_GENERATION.load(Ordering::Acquire))?;
    CudaError::check(call(driver).0)
}

/// The calling thread's context, set up as for any runtime call: what the runtime gives a driver
/// call that names its context (a conditional handle, a generic copy or memset node).
pub fn current_context() -> CudaResult<CUcontext> {
    let mut current: CUcontext = std::ptr::null_mut();
    in_context(|driver| {
        // SAFETY: `current` is a local out-value.
        let status = driver_call!(driver, cuCtxGetCurrent(&mut current));
        // No context current: `in_context` binds the thread's primary context and asks again.
        if status.0 == 0 && current.is_null() { INVALID_CONTEXT } else { status }
    })?;
    Ok(current)
}

/// `cudaSetDevice`: the thread's device becomes `device` and its primary context current.
pub fn set_device(device: c_int) -> CudaResult<()> {
    let driver = driver()?;
    let generation = RESET_GENERATION.load(Ordering::Acquire);
    let primary = primary_context(driver, device, generation)?;
    // SAFETY: a context handle the driver gave out.
    CudaError::check(driver_call!(driver, cuCtxSetCurrent(primary)).0)?;
    let _ = CURRENT_DEVICE.try_with(|current| current.set(device));
    let _ = CONTEXT_CHECKED.try_with(|checked| checked.set(generation));
    Ok(())
}

/// `cudaDeviceReset`: the device's primary context is reset (its memory, streams and events go);
/// the next call retains it again.
pub fn reset_device() -> CudaResult<()> {
    cu!(cuDevicePrimaryCtxReset_v2(current_device()))?;
    RESET_GENERATION.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_without_the_required_exports_is_refused_and_named() {
        // libc bears none of the driver's names: every required export is reported missing.
        // SAFETY: libc is loaded in every process already; loading it again runs nothing new.
        let library = unsafe { libloading::Library::new("libc.so.6") }.expect("libc loads");
        let Err(reason) = Driver::resolve(library) else { panic!("libc accepted as a CUDA driver") };
        assert!(reason.starts_with("cuInit, "), "{reason}");
        assert!(reason.contains("cuMemAlloc_v2") && reason.contains("cuSurfObjectGetResourceDesc"), "{reason}");
    }

    #[test]
    fn a_missing_optional_export_is_not_supported() {
        assert_eq!(missing_export("cuTestOnlyExport"), CudaError::NOT_SUPPORTED);
        assert_eq!(missing_status("cuTestOnlyExport"), CUresult(801));
    }
}
