//! The driver under this runtime: Flyt's `libcuda.so.1`, which holds the process's one session
//! (as NVIDIA's runtime sits over NVIDIA's driver). It is loaded from this library's own folder
//! first (Flyt's library folder holds both), else by name, and only the driver functions the
//! runtime calls are looked up, once. Every call is in the process; the driver decides what
//! crosses the wire.
//!
//! The runtime's implicit context lives here too: each thread works in the primary context of its
//! current device, retained and made current on the thread's first call, as NVIDIA's runtime does;
//! a context the app made current itself (driver API) is used as it is.

#![allow(non_snake_case, reason = "the fields carry the driver functions' names")]

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;

pub type CUresult = u32;
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUlibrary = *mut c_void;
pub type CUkernel = *mut c_void;
pub type CUdeviceptr = u64;

/// `CUipcMemHandle` and `CUipcEventHandle` (and the runtime's `cudaIpc*Handle_t`): 64 opaque
/// bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IpcHandle {
    pub reserved: [std::ffi::c_char; 64],
}

/// `CUDA_MEMCPY2D`, the driver's description of a pitched copy.
#[repr(C)]
pub struct Memcpy2D {
    pub src_x_in_bytes: usize,
    pub src_y: usize,
    pub src_memory_type: c_uint,
    pub src_host: *const c_void,
    pub src_device: CUdeviceptr,
    pub src_array: *mut c_void,
    pub src_pitch: usize,
    pub dst_x_in_bytes: usize,
    pub dst_y: usize,
    pub dst_memory_type: c_uint,
    pub dst_host: *mut c_void,
    pub dst_device: CUdeviceptr,
    pub dst_array: *mut c_void,
    pub dst_pitch: usize,
    pub width_in_bytes: usize,
    pub height: usize,
}

/// `CUmemLocation`, which is also the runtime's `cudaMemLocation` (same layout, same
/// `cudaMemLocationType` numbers): where a prefetch or advice of managed memory points. Passed by
/// value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemLocation {
    pub kind: c_int,
    pub id: c_int,
}

/// `CUDA_MEMCPY3D`, the driver's description of a 3D copy (a graph's copy node).
#[repr(C)]
pub struct Memcpy3D {
    pub src_x_in_bytes: usize,
    pub src_y: usize,
    pub src_z: usize,
    pub src_lod: usize,
    pub src_memory_type: c_uint,
    pub src_host: *const c_void,
    pub src_device: CUdeviceptr,
    pub src_array: *mut c_void,
    pub reserved0: *mut c_void,
    pub src_pitch: usize,
    pub src_height: usize,
    pub dst_x_in_bytes: usize,
    pub dst_y: usize,
    pub dst_z: usize,
    pub dst_lod: usize,
    pub dst_memory_type: c_uint,
    pub dst_host: *mut c_void,
    pub dst_device: CUdeviceptr,
    pub dst_array: *mut c_void,
    pub reserved1: *mut c_void,
    pub dst_pitch: usize,
    pub dst_height: usize,
    pub width_in_bytes: usize,
    pub height: usize,
    pub depth: usize,
}

/// `CUDA_KERNEL_NODE_PARAMS` (v2): a graph's kernel node.
#[repr(C)]
pub struct KernelNodeParams {
    pub func: CUkernel,
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_mem: c_uint,
    pub kernel_params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
    pub kern: CUkernel,
    pub ctx: CUcontext,
}

/// `CUlaunchConfig`: a launch with attributes (whose layout, `CUlaunchAttribute`, is the
/// runtime's `cudaLaunchAttribute`).
#[repr(C)]
pub struct LaunchConfig {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_mem: c_uint,
    pub stream: CUstream,
    pub attrs: *mut c_void,
    pub num_attrs: c_uint,
}

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

pub type CUgraph = *mut c_void;
pub type CUgraphNode = *mut c_void;
pub type CUgraphExec = *mut c_void;
/// The runtime's and the driver's host functions and stream callbacks have one ABI.
pub type HostFn = Option<unsafe extern "C" fn(*mut c_void)>;
pub type StreamCallback = Option<unsafe extern "C" fn(CUstream, c_uint, *mut c_void)>;

/// `CU_MEMORYTYPE_UNIFIED`: the driver tells host from device memory by the pointer.
pub const MEMORYTYPE_UNIFIED: c_uint = 4;
/// `CU_MEMORYTYPE_HOST`: the side of a copy is host memory (`srcHost`/`dstHost`).
pub const MEMORYTYPE_HOST: c_uint = 1;
/// `CU_MEMORYTYPE_ARRAY`: the side of a copy is a CUDA array.
pub const MEMORYTYPE_ARRAY: c_uint = 3;

pub type CUarray = *mut c_void;
pub type CUmipmappedArray = *mut c_void;

/// `CUDA_ARRAY3D_DESCRIPTOR`: an array's extent in elements (0 for a dimension it lacks), its
/// `CUarray_format`, channels per element and `CUDA_ARRAY3D_*` flags.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Array3DDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub num_channels: c_uint,
    pub flags: c_uint,
}

/// The union of `CUDA_RESOURCE_DESC`, flattened: every member starts with the handle or device
/// pointer, `linear` and `pitch2D` go on alike (`size` is `linear.sizeInBytes` or
/// `pitch2D.width`), and `reserved` pads it to the union's 128 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ResourceData {
    pub handle: u64,
    pub format: c_uint,
    pub num_channels: c_uint,
    pub size: usize,
    pub height: usize,
    pub pitch_in_bytes: usize,
    pub reserved: [u64; 11],
}

/// `CUDA_RESOURCE_DESC`: what a texture or surface object reads.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ResourceDesc {
    pub res_type: c_uint,
    pub res: ResourceData,
    pub flags: c_uint,
}

/// `CUDA_TEXTURE_DESC`: how a texture object samples (the runtime's read mode, sRGB and
/// coordinate switches are `CU_TRSF_*` bits of `flags`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TextureDesc {
    pub address_mode: [c_int; 3],
    pub filter_mode: c_int,
    pub flags: c_uint,
    pub max_anisotropy: c_uint,
    pub mipmap_filter_mode: c_int,
    pub mipmap_level_bias: f32,
    pub min_mipmap_level_clamp: f32,
    pub max_mipmap_level_clamp: f32,
    pub border_color: [f32; 4],
    pub reserved: [c_int; 12],
}

/// `CUDA_RESOURCE_VIEW_DESC`, which is also the runtime's `cudaResourceViewDesc` (same layout,
/// same format numbers).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ResourceViewDesc {
    pub format: c_int,
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub first_mipmap_level: c_uint,
    pub last_mipmap_level: c_uint,
    pub first_layer: c_uint,
    pub last_layer: c_uint,
    pub reserved: [c_uint; 16],
}

// The sizes of the C structs (cuda.h, x86_64).
const _: () = {
    assert!(size_of::<MemLocation>() == 8);
    assert!(size_of::<Memcpy2D>() == 128);
    assert!(size_of::<Memcpy3D>() == 200);
    assert!(size_of::<GraphNodeParams>() == 256);
    assert!(size_of::<KernelNodeParams>() == 72);
    assert!(std::mem::offset_of!(Memcpy3D, reserved0) == 64);
    assert!(std::mem::offset_of!(Memcpy3D, reserved1) == 152);
    assert!(size_of::<Array3DDescriptor>() == 40);
    assert!(size_of::<ResourceData>() == 128);
    assert!(std::mem::offset_of!(ResourceData, size) == 16);
    assert!(size_of::<ResourceDesc>() == 144);
    assert!(std::mem::offset_of!(ResourceDesc, res) == 8);
    assert!(std::mem::offset_of!(ResourceDesc, flags) == 136);
    assert!(size_of::<TextureDesc>() == 104);
    assert!(std::mem::offset_of!(TextureDesc, border_color) == 40);
    assert!(size_of::<ResourceViewDesc>() == 112);
    assert!(std::mem::offset_of!(ResourceViewDesc, first_mipmap_level) == 32);
};

macro_rules! driver_functions {
    ($($name:ident($($arg:ident: $ty:ty),* $(,)?);)*) => {
        /// The driver functions the runtime calls, resolved once.
        pub struct Driver {
            $(pub $name: unsafe extern "C" fn($($ty),*) -> CUresult,)*
            _library: libloading::Library,
        }

        impl Driver {
            fn resolve(library: libloading::Library) -> Result<Driver, String> {
                Ok(Driver {
                    $($name: {
                        // SAFETY: the symbol is the driver API function of this name, whose C
                        // signature is the one declared in this table.
                        let symbol = unsafe {
                            library.get::<unsafe extern "C" fn($($ty),*) -> CUresult>(concat!(stringify!($name), "\0").as_bytes())
                        };
                        *symbol.map_err(|error| format!("{} is missing ({error})", stringify!($name)))?
                    },)*
                    _library: library,
                })
            }
        }
    };
}

driver_functions! {
    cuInit(flags: c_uint);
    cuDriverGetVersion(version: *mut c_int);
    cuDeviceGetCount(count: *mut c_int);
    cuDeviceGetAttribute(value: *mut c_int, attribute: c_int, device: c_int);
    cuDeviceGetName(name: *mut c_char, len: c_int, device: c_int);
    cuDeviceGetUuid_v2(uuid: *mut [u8; 16], device: c_int);
    cuDeviceGetLuid(luid: *mut c_char, device_node_mask: *mut c_uint, device: c_int);
    cuDeviceTotalMem_v2(bytes: *mut usize, device: c_int);
    cuDevicePrimaryCtxRetain(context: *mut CUcontext, device: c_int);
    cuDevicePrimaryCtxReset_v2(device: c_int);
    cuDevicePrimaryCtxSetFlags_v2(device: c_int, flags: c_uint);
    cuDevicePrimaryCtxGetState(device: c_int, flags: *mut c_uint, active: *mut c_int);
    cuCtxGetCurrent(context: *mut CUcontext);
    cuCtxSetCurrent(context: CUcontext);
    cuCtxGetDevice(device: *mut c_int);
    cuCtxSynchronize();
    cuCtxSetLimit(limit: c_int, value: usize);
    cuCtxGetLimit(value: *mut usize, limit: c_int);
    cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int);
    cuMemAlloc_v2(ptr: *mut CUdeviceptr, size: usize);
    cuMemFree_v2(ptr: CUdeviceptr);
    cuMemGetInfo_v2(free: *mut usize, total: *mut usize);
    cuMemHostAlloc(ptr: *mut *mut c_void, size: usize, flags: c_uint);
    cuMemFreeHost(ptr: *mut c_void);
    cuMemHostRegister_v2(ptr: *mut c_void, size: usize, flags: c_uint);
    cuMemHostUnregister(ptr: *mut c_void);
    cuMemHostGetFlags(flags: *mut c_uint, ptr: *mut c_void);
    cuMemHostGetDevicePointer_v2(device: *mut CUdeviceptr, host: *mut c_void, flags: c_uint);
    cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, count: usize);
    cuMemcpy_ptds(dst: CUdeviceptr, src: CUdeviceptr, count: usize);
    cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, count: usize, stream: CUstream);
    cuMemcpyAsync_ptsz(dst: CUdeviceptr, src: CUdeviceptr, count: usize, stream: CUstream);
    cuMemcpy2DUnaligned_v2(copy: *const Memcpy2D);
    cuMemcpy2DUnaligned_v2_ptds(copy: *const Memcpy2D);
    cuMemcpy2DAsync_v2(copy: *const Memcpy2D, stream: CUstream);
    cuMemcpy2DAsync_v2_ptsz(copy: *const Memcpy2D, stream: CUstream);
    cuMemsetD8_v2(dst: CUdeviceptr, value: u8, count: usize);
    cuMemsetD8_v2_ptds(dst: CUdeviceptr, value: u8, count: usize);
    cuMemsetD8Async(dst: CUdeviceptr, value: u8, count: usize, stream: CUstream);
    cuMemsetD8Async_ptsz(dst: CUdeviceptr, value: u8, count: usize, stream: CUstream);
    cuPointerGetAttribute(data: *mut c_void, attribute: c_int, ptr: CUdeviceptr);
    cuStreamCreateWithPriority(stream: *mut CUstream, flags: c_uint, priority: c_int);
    cuStreamDestroy_v2(stream: CUstream);
    cuStreamSynchronize(stream: CUstream);
    cuStreamSynchronize_ptsz(stream: CUstream);
    cuStreamQuery(stream: CUstream);
    cuStreamQuery_ptsz(stream: CUstream);
    cuStreamWaitEvent(stream: CUstream, event: CUevent, flags: c_uint);
    cuStreamWaitEvent_ptsz(stream: CUstream, event: CUevent, flags: c_uint);
    cuStreamGetFlags(stream: CUstream, flags: *mut c_uint);
    cuStreamGetFlags_ptsz(stream: CUstream, flags: *mut c_uint);
    cuStreamGetPriority(stream: CUstream, priority: *mut c_int);
    cuStreamGetPriority_ptsz(stream: CUstream, priority: *mut c_int);
    cuStreamSetAttribute(stream: CUstream, attribute: c_uint, value: *const c_void);
    cuIpcGetMemHandle(handle: *mut IpcHandle, ptr: CUdeviceptr);
    cuIpcOpenMemHandle_v2(ptr: *mut CUdeviceptr, handle: IpcHandle, flags: c_uint);
    cuIpcCloseMemHandle(ptr: CUdeviceptr);
    cuIpcGetEventHandle(handle: *mut IpcHandle, event: CUevent);
    cuIpcOpenEventHandle(event: *mut CUevent, handle: IpcHandle);
    cuStreamSetAttribute_ptsz(stream: CUstream, attribute: c_uint, value: *const c_void);
    cuStreamGetAttribute(stream: CUstream, attribute: c_uint, value: *mut c_void);
    cuStreamGetAttribute_ptsz(stream: CUstream, attribute: c_uint, value: *mut c_void);
    cuStreamCopyAttributes(dst: CUstream, src: CUstream);
    cuStreamCopyAttributes_ptsz(dst: CUstream, src: CUstream);
    cuEventCreate(event: *mut CUevent, flags: c_uint);
    cuEventRecordWithFlags(event: CUevent, stream: CUstream, flags: c_uint);
    cuEventRecordWithFlags_ptsz(event: CUevent, stream: CUstream, flags: c_uint);
    cuEventSynchronize(event: CUevent);
    cuEventQuery(event: CUevent);
    cuEventElapsedTime_v2(milliseconds: *mut f32, start: CUevent, end: CUevent);
    cuEventDestroy_v2(event: CUevent);
    cuLibraryLoadData(
        library: *mut CUlibrary,
        code: *const c_void,
        jit_options: *mut c_int,
        jit_values: *mut *mut c_void,
        jit_count: c_uint,
        library_options: *mut c_int,
        library_values: *mut *mut c_void,
        library_count: c_uint,
    );
    cuLibraryLoadFromFile(
        library: *mut CUlibrary,
        file_name: *const c_char,
        jit_options: *mut c_int,
        jit_values: *mut *mut c_void,
        jit_count: c_uint,
        library_options: *mut c_int,
        library_values: *mut *mut c_void,
        library_count: c_uint,
    );
    cuLibraryUnload(library: CUlibrary);
    cuLibraryGetKernelCount(count: *mut c_uint, library: CUlibrary);
    cuLibraryEnumerateKernels(kernels: *mut CUkernel, count: c_uint, library: CUlibrary);
    cuKernelGetName(name: *mut *const c_char, kernel: CUkernel);
    cuLibraryGetKernel(kernel: *mut CUkernel, library: CUlibrary, name: *const c_char);
    cuLibraryGetGlobal(ptr: *mut CUdeviceptr, bytes: *mut usize, library: CUlibrary, name: *const c_char);
    cuLibraryGetManaged(ptr: *mut CUdeviceptr, bytes: *mut usize, library: CUlibrary, name: *const c_char);
    cuLaunchKernel(
        function: CUkernel,
        grid_x: c_uint,
        grid_y: c_uint,
        grid_z: c_uint,
        block_x: c_uint,
        block_y: c_uint,
        block_z: c_uint,
        shared_mem: c_uint,
        stream: CUstream,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    );
    cuLaunchKernel_ptsz(
        function: CUkernel,
        grid_x: c_uint,
        grid_y: c_uint,
        grid_z: c_uint,
        block_x: c_uint,
        block_y: c_uint,
        block_z: c_uint,
        shared_mem: c_uint,
        stream: CUstream,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    );
    cuLaunchCooperativeKernel(
        function: CUkernel,
        grid_x: c_uint,
        grid_y: c_uint,
        grid_z: c_uint,
        block_x: c_uint,
        block_y: c_uint,
        block_z: c_uint,
        shared_mem: c_uint,
        stream: CUstream,
        params: *mut *mut c_void,
    );
    cuLaunchCooperativeKernel_ptsz(
        function: CUkernel,
        grid_x: c_uint,
        grid_y: c_uint,
        grid_z: c_uint,
        block_x: c_uint,
        block_y: c_uint,
        block_z: c_uint,
        shared_mem: c_uint,
        stream: CUstream,
        params: *mut *mut c_void,
    );
    cuLaunchKernelEx(config: *const LaunchConfig, function: CUkernel, params: *mut *mut c_void, extra: *mut *mut c_void);
    cuLaunchKernelEx_ptsz(config: *const LaunchConfig, function: CUkernel, params: *mut *mut c_void, extra: *mut *mut c_void);
    cuFuncGetAttribute(value: *mut c_int, attribute: c_int, function: CUkernel);
    cuFuncGetName(name: *mut *const c_char, function: CUkernel);
    cuLogsRegisterCallback(callback: *const c_void, data: *mut c_void, handle: *mut *mut c_void);
    cuLogsUnregisterCallback(handle: *mut c_void);
    cuLogsCurrent(iterator: *mut c_uint, flags: c_uint);
    cuLogsDumpToFile(iterator: *mut c_uint, path: *const c_char, flags: c_uint);
    cuLogsDumpToMemory(iterator: *mut c_uint, buffer: *mut c_char, size: *mut usize, flags: c_uint);
    cuFuncGetParamInfo(function: CUkernel, index: usize, offset: *mut usize, size: *mut usize);
    cuFuncSetAttribute(function: CUkernel, attribute: c_int, value: c_int);
    cuFuncSetCacheConfig(function: CUkernel, config: c_uint);
    cuCtxSetCacheConfig(config: c_uint);
    cuCtxGetSharedMemConfig(config: *mut c_uint);
    cuDeviceGetTexture1DLinearMaxWidth(width: *mut usize, format: c_uint, channels: c_uint, device: c_int);
    cuDeviceRegisterAsyncNotification(device: c_int, callback_func: *mut c_void, user_data: *mut c_void, callback: *mut *mut c_void);
    cuDeviceUnregisterAsyncNotification(device: c_int, callback: *mut c_void);
    cuDeviceGetHostAtomicCapabilities(capabilities: *mut c_uint, operations: *const c_uint, count: c_uint, device: c_int);
    cuDeviceGetP2PAtomicCapabilities(capabilities: *mut c_uint, operations: *const c_uint, count: c_uint, src: c_int, dst: c_int);
    cuCtxSetSharedMemConfig(config: c_uint);
    cuFuncSetSharedMemConfig(function: CUkernel, config: c_uint);
    cuCtxGetCacheConfig(config: *mut c_uint);
    cuCtxResetPersistingL2Cache();
    cuProfilerStart();
    cuProfilerStop();
    cuDeviceGetP2PAttribute(value: *mut c_int, attribute: c_uint, src: c_int, dst: c_int);
    // --- stream capture, graphs and host functions: the runtime's structs that differ from the
    // driver's are converted (see `api::graph`); the rest are the driver's own layouts ---
    cuStreamBeginCapture_v2(stream: CUstream, mode: c_int);
    cuStreamBeginCapture_v2_ptsz(stream: CUstream, mode: c_int);
    cuStreamBeginCaptureToGraph(stream: CUstream, graph: CUgraph, dependencies: *const CUgraphNode, edges: *const c_void, count: usize, mode: c_int);
    cuStreamBeginCaptureToGraph_ptsz(stream: CUstream, graph: CUgraph, dependencies: *const CUgraphNode, edges: *const c_void, count: usize, mode: c_int);
    cuStreamUpdateCaptureDependencies_v2(stream: CUstream, dependencies: *mut CUgraphNode, edges: *const c_void, count: usize, flags: c_uint);
    cuStreamUpdateCaptureDependencies_v2_ptsz(stream: CUstream, dependencies: *mut CUgraphNode, edges: *const c_void, count: usize, flags: c_uint);
    cuStreamEndCapture(stream: CUstream, graph: *mut CUgraph);
    cuStreamEndCapture_ptsz(stream: CUstream, graph: *mut CUgraph);
    cuStreamIsCapturing(stream: CUstream, status: *mut c_int);
    cuStreamIsCapturing_ptsz(stream: CUstream, status: *mut c_int);
    cuStreamGetCaptureInfo_v3(
        stream: CUstream,
        status: *mut c_int,
        id: *mut u64,
        graph: *mut CUgraph,
        dependencies: *mut *const CUgraphNode,
        edges: *mut *const c_void,
        count: *mut usize,
    );
    cuStreamGetCaptureInfo_v3_ptsz(
        stream: CUstream,
        status: *mut c_int,
        id: *mut u64,
        graph: *mut CUgraph,
        dependencies: *mut *const CUgraphNode,
        edges: *mut *const c_void,
        count: *mut usize,
    );
    cuThreadExchangeStreamCaptureMode(mode: *mut c_int);
    cuGraphCreate(graph: *mut CUgraph, flags: c_uint);
    cuGraphDestroy(graph: CUgraph);
    cuGraphAddKernelNode_v2(node: *mut CUgraphNode, graph: CUgraph, dependencies: *const CUgraphNode, count: usize, params: *const KernelNodeParams);
    cuGraphKernelNodeGetParams_v2(node: CUgraphNode, params: *mut KernelNodeParams);
    cuGraphKernelNodeSetParams_v2(node: CUgraphNode, params: *const KernelNodeParams);
    cuGraphExecKernelNodeSetParams_v2(exec: CUgraphExec, node: CUgraphNode, params: *const KernelNodeParams);
    cuGraphAddMemcpyNode(node: *mut CUgraphNode, graph: CUgraph, dependencies: *const CUgraphNode, count: usize, params: *const Memcpy3D, ctx: CUcontext);
    cuGraphMemcpyNodeSetParams(node: CUgraphNode, params: *const Memcpy3D);
    cuGraphExecMemcpyNodeSetParams(exec: CUgraphExec, node: CUgraphNode, params: *const Memcpy3D, ctx: CUcontext);
    cuGraphAddMemsetNode(node: *mut CUgraphNode, graph: CUgraph, dependencies: *const CUgraphNode, count: usize, params: *const c_void, ctx: CUcontext);
    cuGraphMemsetNodeSetParams(node: CUgraphNode, params: *const c_void);
    cuGraphExecMemsetNodeSetParams(exec: CUgraphExec, node: CUgraphNode, params: *const c_void, ctx: CUcontext);
    cuGraphAddHostNode(node: *mut CUgraphNode, graph: CUgraph, dependencies: *const CUgraphNode, count: usize, params: *const c_void);
    cuGraphHostNodeSetParams(node: CUgraphNode, params: *const c_void);
    cuGraphExecHostNodeSetParams(exec: CUgraphExec, node: CUgraphNode, params: *const c_void);
    cuGraphAddChildGraphNode(node: *mut CUgraphNode, graph: CUgraph, dependencies: *const CUgraphNode, count: usize, child: CUgraph);
    cuGraphExecChildGraphNodeSetParams(exec: CUgraphExec, node: CUgraphNode, child: CUgraph);
    cuGraphAddEmptyNode(node: *mut CUgraphNode, graph: CUgraph, dependencies: *const CUgraphNode, count: usize);
    cuGraphAddEventRecordNode(node: *mut CUgraphNode, graph: CUgraph, dependencies: *const CUgraphNode, count: usize, event: CUevent);
    cuGraphAddEventWaitNode(node: *mut CUgraphNode, graph: CUgraph, dependencies: *const CUgraphNode, count: usize, event: CUevent);
    cuGraphEventRecordNodeSetEvent(node: CUgraphNode, event: CUevent);
    cuGraphExecEventRecordNodeSetEvent(exec: CUgraphExec, node: CUgraphNode, event: CUevent);
    cuGraphEventWaitNodeSetEvent(node: CUgraphNode, event: CUevent);
    cuGraphExecEventWaitNodeSetEvent(exec: CUgraphExec, node: CUgraphNode, event: CUevent);
    cuGraphAddDependencies_v2(graph: CUgraph, from: *const CUgraphNode, to: *const CUgraphNode, edges: *const c_void, count: usize);
    cuGraphRemoveDependencies_v2(graph: CUgraph, from: *const CUgraphNode, to: *const CUgraphNode, edges: *const c_void, count: usize);
    cuGraphGetNodes(graph: CUgraph, nodes: *mut CUgraphNode, count: *mut usize);
    cuGraphGetRootNodes(graph: CUgraph, nodes: *mut CUgraphNode, count: *mut usize);
    cuGraphNodeGetType(node: CUgraphNode, kind: *mut c_int);
    cuGraphDestroyNode(node: CUgraphNode);
    cuGraphClone(clone: *mut CUgraph, graph: CUgraph);
    cuGraphNodeFindInClone(found: *mut CUgraphNode, node: CUgraphNode, clone: CUgraph);
    cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: u64);
    cuGraphInstantiateWithParams(exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void);
    cuGraphInstantiateWithParams_ptsz(exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void);
    cuGraphLaunch(exec: CUgraphExec, stream: CUstream);
    cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream);
    cuGraphUpload(exec: CUgraphExec, stream: CUstream);
    cuGraphUpload_ptsz(exec: CUgraphExec, stream: CUstream);
    cuGraphExecDestroy(exec: CUgraphExec);
    cuGraphExecUpdate_v2(exec: CUgraphExec, graph: CUgraph, info: *mut c_void);
    cuGraphDebugDotPrint(graph: CUgraph, path: *const c_char, flags: c_uint);
    // Memory and conditional nodes (`cudaMemAllocNodeParams` and `cudaGraphEdgeData` have the
    // driver's layouts), generic nodes, queries.
    cuGraphAddMemAllocNode(node: *mut CUgraphNode, graph: CUgraph, dependencies: *const CUgraphNode, count: usize, params: *mut c_void);
    cuGraphAddMemFreeNode(node: *mut CUgraphNode, graph: CUgraph, dependencies: *const CUgraphNode, count: usize, ptr: CUdeviceptr);
    cuGraphMemAllocNodeGetParams(node: CUgraphNode, params: *mut c_void);
    cuGraphMemFreeNodeGetParams(node: CUgraphNode, ptr: *mut CUdeviceptr);
    cuDeviceGraphMemTrim(device: c_int);
    cuDeviceGetGraphMemAttribute(device: c_int, attribute: c_int, value: *mut c_void);
    cuDeviceSetGraphMemAttribute(device: c_int, attribute: c_int, value: *mut c_void);
    cuGraphConditionalHandleCreate(handle: *mut u64, graph: CUgraph, context: CUcontext, default_value: c_uint, flags: c_uint);
    cuGraphAddNode_v2(
        node: *mut CUgraphNode,
        graph: CUgraph,
        dependencies: *const CUgraphNode,
        edges: *const c_void,
        count: usize,
        params: *mut GraphNodeParams,
    );
    cuGraphNodeSetParams(node: CUgraphNode, params: *mut GraphNodeParams);
    cuGraphExecNodeSetParams(exec: CUgraphExec, node: CUgraphNode, params: *mut GraphNodeParams);
    cuGraphNodeGetDependencies_v2(node: CUgraphNode, nodes: *mut CUgraphNode, edges: *mut c_void, count: *mut usize);
    cuGraphNodeGetDependentNodes_v2(node: CUgraphNode, nodes: *mut CUgraphNode, edges: *mut c_void, count: *mut usize);
    cuGraphGetEdges_v2(graph: CUgraph, from: *mut CUgraphNode, to: *mut CUgraphNode, edges: *mut c_void, count: *mut usize);
    cuGraphNodeSetEnabled(exec: CUgraphExec, node: CUgraphNode, enabled: c_uint);
    cuGraphNodeGetEnabled(exec: CUgraphExec, node: CUgraphNode, enabled: *mut c_uint);
    cuGraphExecGetFlags(exec: CUgraphExec, flags: *mut u64);
    cuGraphEventRecordNodeGetEvent(node: CUgraphNode, event: *mut CUevent);
    cuGraphEventWaitNodeGetEvent(node: CUgraphNode, event: *mut CUevent);
    cuGraphChildGraphNodeGetGraph(node: CUgraphNode, graph: *mut CUgraph);
    // Node getters, kernel node attributes (`cudaLaunchAttributeValue` is the driver's), user
    // objects.
    cuGraphHostNodeGetParams(node: CUgraphNode, params: *mut c_void);
    cuGraphMemcpyNodeGetParams(node: CUgraphNode, params: *mut Memcpy3D);
    cuGraphMemsetNodeGetParams(node: CUgraphNode, params: *mut c_void);
    cuGraphKernelNodeGetAttribute(node: CUgraphNode, attribute: c_int, value: *mut c_void);
    cuGraphKernelNodeSetAttribute(node: CUgraphNode, attribute: c_int, value: *const c_void);
    cuGraphKernelNodeCopyAttributes(dst: CUgraphNode, src: CUgraphNode);
    cuUserObjectCreate(object: *mut *mut c_void, ptr: *mut c_void, destroy: HostFn, refs: c_uint, flags: c_uint);
    cuUserObjectRetain(object: *mut c_void, count: c_uint);
    cuUserObjectRelease(object: *mut c_void, count: c_uint);
    cuGraphRetainUserObject(graph: CUgraph, object: *mut c_void, count: c_uint, flags: c_uint);
    cuGraphReleaseUserObject(graph: CUgraph, object: *mut c_void, count: c_uint);
    // Entry points by name (the runtime's flags and statuses are the driver's numbers), kernel
    // queries by device.
    cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int);
    cuOccupancyAvailableDynamicSMemPerBlock(size: *mut usize, kernel: CUkernel, blocks: c_int, block_size: c_int);
    cuKernelSetAttribute(attribute: c_int, value: c_int, kernel: CUkernel, device: c_int);
    cuLaunchHostFunc(stream: CUstream, function: HostFn, data: *mut c_void);
    cuLaunchHostFunc_ptsz(stream: CUstream, function: HostFn, data: *mut c_void);
    cuStreamAddCallback(stream: CUstream, callback: StreamCallback, data: *mut c_void, flags: c_uint);
    cuStreamAddCallback_ptsz(stream: CUstream, callback: StreamCallback, data: *mut c_void, flags: c_uint);
    // --- stream-ordered allocation (`cudaMemPoolProps` has the driver's layout) ---
    cuMemAllocAsync(ptr: *mut CUdeviceptr, size: usize, stream: CUstream);
    cuMemAllocAsync_ptsz(ptr: *mut CUdeviceptr, size: usize, stream: CUstream);
    cuMemAllocFromPoolAsync(ptr: *mut CUdeviceptr, size: usize, pool: *mut c_void, stream: CUstream);
    cuMemAllocFromPoolAsync_ptsz(ptr: *mut CUdeviceptr, size: usize, pool: *mut c_void, stream: CUstream);
    cuMemFreeAsync(ptr: CUdeviceptr, stream: CUstream);
    cuMemFreeAsync_ptsz(ptr: CUdeviceptr, stream: CUstream);
    // --- peers, stream queries, pool access, CUDA 13's location-based pools, clusters ---
    cuDeviceCanAccessPeer(can_access: *mut c_int, device: c_int, peer: c_int);
    cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint);
    cuCtxDisablePeerAccess(peer: CUcontext);
    cuMemcpyPeer(dst: CUdeviceptr, dst_context: CUcontext, src: CUdeviceptr, src_context: CUcontext, count: usize);
    cuMemcpyPeerAsync(dst: CUdeviceptr, dst_context: CUcontext, src: CUdeviceptr, src_context: CUcontext, count: usize, stream: CUstream);
    cuStreamGetDevice(stream: CUstream, device: *mut c_int);
    cuStreamGetDevice_ptsz(stream: CUstream, device: *mut c_int);
    cuStreamGetId(stream: CUstream, id: *mut u64);
    cuStreamGetId_ptsz(stream: CUstream, id: *mut u64);
    cuMemPoolSetAccess(pool: *mut c_void, descriptors: *const c_void, count: usize);
    cuMemPoolGetAccess(flags: *mut c_int, pool: *mut c_void, location: *mut MemLocation);
    cuMemGetDefaultMemPool(pool: *mut *mut c_void, location: *mut MemLocation, kind: c_int);
    cuMemGetMemPool(pool: *mut *mut c_void, location: *mut MemLocation, kind: c_int);
    cuMemSetMemPool(location: *mut MemLocation, kind: c_int, pool: *mut c_void);
    cuOccupancyMaxActiveClusters(clusters: *mut c_int, kernel: CUkernel, config: *const LaunchConfig);
    cuOccupancyMaxPotentialClusterSize(size: *mut c_int, kernel: CUkernel, config: *const LaunchConfig);
    cuDeviceGetPCIBusId(bus_id: *mut c_char, len: c_int, device: c_int);
    cuDeviceGetByPCIBusId(device: *mut c_int, bus_id: *const c_char);
    cuDeviceGetDefaultMemPool(pool: *mut *mut c_void, device: c_int);
    cuDeviceGetMemPool(pool: *mut *mut c_void, device: c_int);
    cuDeviceSetMemPool(device: c_int, pool: *mut c_void);
    cuMemPoolGetAttribute(pool: *mut c_void, attribute: c_int, value: *mut c_void);
    cuMemPoolSetAttribute(pool: *mut c_void, attribute: c_int, value: *mut c_void);
    cuMemPoolTrimTo(pool: *mut c_void, keep: usize);
    cuMemPoolCreate(pool: *mut *mut c_void, props: *const c_void);
    cuMemPoolDestroy(pool: *mut c_void);
    // Pools shared between processes: the runtime's export data is the driver's 64 bytes.
    cuMemPoolExportToShareableHandle(handle: *mut c_void, pool: *mut c_void, handle_type: c_int, flags: u64);
    cuMemPoolImportFromShareableHandle(pool: *mut *mut c_void, handle: *mut c_void, handle_type: c_int, flags: u64);
    cuMemPoolExportPointer(data: *mut c_void, ptr: CUdeviceptr);
    cuMemPoolImportPointer(ptr: *mut CUdeviceptr, pool: *mut c_void, data: *mut c_void);
    // --- managed memory (see `api::managed`: the runtime's enums and `cudaMemLocation` are the
    // driver's) ---
    cuMemAllocManaged(ptr: *mut CUdeviceptr, size: usize, flags: c_uint);
    cuMemPrefetchAsync_v2(ptr: CUdeviceptr, count: usize, location: MemLocation, flags: c_uint, stream: CUstream);
    cuMemPrefetchAsync_v2_ptsz(ptr: CUdeviceptr, count: usize, location: MemLocation, flags: c_uint, stream: CUstream);
    cuMemAdvise_v2(ptr: CUdeviceptr, count: usize, advice: c_int, location: MemLocation);
    cuMemRangeGetAttribute(data: *mut c_void, data_size: usize, attribute: c_int, ptr: CUdeviceptr, count: usize);
    cuMemRangeGetAttributes(
        data: *mut *mut c_void,
        data_sizes: *mut usize,
        attributes: *mut c_int,
        num_attributes: usize,
        ptr: CUdeviceptr,
        count: usize,
    );
    cuStreamAttachMemAsync(stream: CUstream, ptr: CUdeviceptr, length: usize, flags: c_uint);
    cuStreamAttachMemAsync_ptsz(stream: CUstream, ptr: CUdeviceptr, length: usize, flags: c_uint);
    cuMemPrefetchBatchAsync(
        ptrs: *mut CUdeviceptr,
        sizes: *mut usize,
        count: usize,
        locations: *mut MemLocation,
        location_starts: *mut usize,
        num_locations: usize,
        flags: u64,
        stream: CUstream,
    );
    cuMemPrefetchBatchAsync_ptsz(
        ptrs: *mut CUdeviceptr,
        sizes: *mut usize,
        count: usize,
        locations: *mut MemLocation,
        location_starts: *mut usize,
        num_locations: usize,
        flags: u64,
        stream: CUstream,
    );
    cuMemDiscardBatchAsync(ptrs: *mut CUdeviceptr, sizes: *mut usize, count: usize, flags: u64, stream: CUstream);
    cuMemDiscardBatchAsync_ptsz(ptrs: *mut CUdeviceptr, sizes: *mut usize, count: usize, flags: u64, stream: CUstream);
    cuMemDiscardAndPrefetchBatchAsync(
        ptrs: *mut CUdeviceptr,
        sizes: *mut usize,
        count: usize,
        locations: *mut MemLocation,
        location_starts: *mut usize,
        num_locations: usize,
        flags: u64,
        stream: CUstream,
    );
    cuMemDiscardAndPrefetchBatchAsync_ptsz(
        ptrs: *mut CUdeviceptr,
        sizes: *mut usize,
        count: usize,
        locations: *mut MemLocation,
        location_starts: *mut usize,
        num_locations: usize,
        flags: u64,
        stream: CUstream,
    );
    cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
        blocks: *mut c_int,
        function: CUkernel,
        block_size: c_int,
        dynamic_smem: usize,
        flags: c_uint,
    );
    // --- pitched memory, 2D and 3D copies and memsets, arrays, texture and surface objects (see
    // `api::arrays` and `api::textures`: the runtime's structs are converted) ---
    cuMemAllocPitch_v2(ptr: *mut CUdeviceptr, pitch: *mut usize, width_in_bytes: usize, height: usize, element_size: c_uint);
    cuMemsetD2D8_v2(dst: CUdeviceptr, pitch: usize, value: u8, width: usize, height: usize);
    cuMemsetD2D8_v2_ptds(dst: CUdeviceptr, pitch: usize, value: u8, width: usize, height: usize);
    cuMemsetD2D8Async(dst: CUdeviceptr, pitch: usize, value: u8, width: usize, height: usize, stream: CUstream);
    cuMemsetD2D8Async_ptsz(dst: CUdeviceptr, pitch: usize, value: u8, width: usize, height: usize, stream: CUstream);
    cuMemcpy3D_v2(copy: *const Memcpy3D);
    cuMemcpy3D_v2_ptds(copy: *const Memcpy3D);
    cuMemcpy3DAsync_v2(copy: *const Memcpy3D, stream: CUstream);
    cuMemcpyBatchAsync_v2(dsts: *mut CUdeviceptr, srcs: *mut CUdeviceptr, sizes: *mut usize, count: usize, attrs: *mut c_void, attrs_idxs: *mut usize, num_attrs: usize, stream: CUstream);
    cuMemcpy3DBatchAsync_v2(num_ops: usize, ops: *mut c_void, flags: u64, stream: CUstream);
    cuMemcpy3DBatchAsync_v2_ptsz(num_ops: usize, ops: *mut c_void, flags: u64, stream: CUstream);
    cuMemcpyBatchAsync_v2_ptsz(dsts: *mut CUdeviceptr, srcs: *mut CUdeviceptr, sizes: *mut usize, count: usize, attrs: *mut c_void, attrs_idxs: *mut usize, num_attrs: usize, stream: CUstream);
    cuMemcpy3DAsync_v2_ptsz(copy: *const Memcpy3D, stream: CUstream);
    // `CUDA_MEMCPY3D_PEER` is `CUDA_MEMCPY3D` with the source and destination contexts in its
    // two reserved fields.
    cuMemcpy3DPeer(copy: *const Memcpy3D);
    cuMemcpy3DPeer_ptds(copy: *const Memcpy3D);
    cuMemcpy3DPeerAsync(copy: *const Memcpy3D, stream: CUstream);
    cuMemcpy3DPeerAsync_ptsz(copy: *const Memcpy3D, stream: CUstream);
    cuArray3DCreate_v2(array: *mut CUarray, descriptor: *const Array3DDescriptor);
    cuArray3DGetDescriptor_v2(descriptor: *mut Array3DDescriptor, array: CUarray);
    cuArrayDestroy(array: CUarray);
    cuMipmappedArrayCreate(mipmapped: *mut CUmipmappedArray, descriptor: *const Array3DDescriptor, levels: c_uint);
    cuMipmappedArrayGetLevel(level_array: *mut CUarray, mipmapped: CUmipmappedArray, level: c_uint);
    cuMipmappedArrayDestroy(mipmapped: CUmipmappedArray);
    // The runtime's sparse properties and memory requirements have the driver's layout.
    cuArrayGetPlane(plane: *mut CUarray, array: CUarray, plane_index: c_uint);
    cuArrayGetSparseProperties(properties: *mut crate::api::cudaArraySparseProperties, array: CUarray);
    cuMipmappedArrayGetSparseProperties(properties: *mut crate::api::cudaArraySparseProperties, mipmapped: CUmipmappedArray);
    cuArrayGetMemoryRequirements(requirements: *mut crate::api::cudaArrayMemoryRequirements, array: CUarray, device: c_int);
    cuMipmappedArrayGetMemoryRequirements(
        requirements: *mut crate::api::cudaArrayMemoryRequirements,
        mipmapped: CUmipmappedArray,
        device: c_int,
    );
    cuTexObjectCreate(texture: *mut u64, resource: *const ResourceDesc, desc: *const TextureDesc, view: *const ResourceViewDesc);
    cuTexObjectDestroy(texture: u64);
    cuTexObjectGetResourceDesc(resource: *mut ResourceDesc, texture: u64);
    cuTexObjectGetTextureDesc(desc: *mut TextureDesc, texture: u64);
    cuTexObjectGetResourceViewDesc(view: *mut ResourceViewDesc, texture: u64);
    cuSurfObjectCreate(surface: *mut u64, resource: *const ResourceDesc);
    cuSurfObjectDestroy(surface: u64);
    cuSurfObjectGetResourceDesc(resource: *mut ResourceDesc, surface: u64);
}

/// Calls a driver function: `cu!(cuMemFree_v2(ptr))` is its status as a `CudaResult<()>`.
/// The driver's status codes are the runtime's error numbers (CUDA numbers them alike).
macro_rules! cu {
    ($name:ident($($arg:expr),* $(,)?)) => {{
        match $crate::driver::driver() {
            // SAFETY: a driver API call with arguments that meet its C contract: the caller checked
            // what the app passed, or passes it on under the runtime function's own contract.
            Ok(driver) => flyt_protocol::CudaError::check(unsafe { (driver.$name)($($arg),*) }),
            Err(error) => Err(error),
        }
    }};
}
pub(crate) use cu;

/// Like [`cu!`], in the calling thread's context (see [`in_context`]).
macro_rules! cu_ctx {
    ($name:ident($($arg:expr),* $(,)?)) => {
        // SAFETY: as in `cu!`.
        $crate::driver::in_context(|driver| unsafe { (driver.$name)($($arg),*) })
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
    // SAFETY: `cuInit` takes flags by value; 0 is the only valid value.
    CudaError::check(unsafe { (driver.cuInit)(0) })?;
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
    CudaError::check(unsafe { (driver.cuDevicePrimaryCtxRetain)(&mut context, device) })?;
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
    CudaError::check(unsafe { (driver.cuCtxGetCurrent)(&mut current) })?;
    let primary = primary_context(driver, current_device(), generation)?;
    if current.is_null() || current == primary {
        // SAFETY: a context handle the driver gave out.
        CudaError::check(unsafe { (driver.cuCtxSetCurrent)(primary) })?;
    }
    let _ = CONTEXT_CHECKED.try_with(|checked| checked.set(generation));
    Ok(())
}

/// `CUDA_ERROR_INVALID_CONTEXT`: the driver found no context current on the thread.
const INVALID_CONTEXT: CUresult = 201;

/// Runs a driver call in the thread's context. A call refused for want of a current context (the
/// app popped or unset it through the driver API) did nothing: the thread's primary context is made
/// current and the call made once more, as NVIDIA's runtime sets its context up again.
pub fn in_context(mut call: impl FnMut(&Driver) -> CUresult) -> CudaResult<()> {
    let driver = ensure_context()?;
    let status = call(driver);
    if status != INVALID_CONTEXT {
        return CudaError::check(status);
    }
    bind_context(driver, RESET_GENERATION.load(Ordering::Acquire))?;
    CudaError::check(call(driver))
}

/// The calling thread's context, set up as for any runtime call: what the runtime gives a driver
/// call that names its context (a conditional handle, a generic copy or memset node).
pub fn current_context() -> CudaResult<CUcontext> {
    let mut current: CUcontext = std::ptr::null_mut();
    in_context(|driver| {
        // SAFETY: `current` is a local out-value.
        let status = unsafe { (driver.cuCtxGetCurrent)(&mut current) };
        // No context current: `in_context` binds the thread's primary context and asks again.
        if status == 0 && current.is_null() { INVALID_CONTEXT } else { status }
    })?;
    Ok(current)
}

/// `cudaSetDevice`: the thread's device becomes `device` and its primary context current.
pub fn set_device(device: c_int) -> CudaResult<()> {
    let driver = driver()?;
    let generation = RESET_GENERATION.load(Ordering::Acquire);
    let primary = primary_context(driver, device, generation)?;
    // SAFETY: a context handle the driver gave out.
    CudaError::check(unsafe { (driver.cuCtxSetCurrent)(primary) })?;
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
