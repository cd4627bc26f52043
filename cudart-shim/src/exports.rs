//! Every symbol `libcudart.so.13` exports, declared once. Expanded here into the C exports, each
//! bound to the ELF version node `libcudart.so.13` with `.symver` and wrapped in the panic
//! boundary; the `exports_match_the_cuda_runtime` test checks the table against the real
//! library's export list.
//!
//! - `checked`: implemented; the body (`crate::api::<name>`) returns `CudaResult<()>`, and a
//!   failure becomes the thread's last error, as in CUDA.
//! - `raw`: implemented; the body returns the C return type itself (registration hooks, error
//!   queries, struct-returning helpers).
//! - `unsupported`: exported so apps load and link, and answer `cudaErrorNotSupported` with a
//!   one-line message naming the function: never a silent success, never a missing symbol.

#![allow(non_snake_case, reason = "the exports carry the CUDA runtime's names")]
#![allow(clippy::missing_safety_doc, reason = "each export's contract is the CUDA runtime's")]

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::ffi::*;
use crate::props::{cudaDeviceProp, cudaFuncAttributes, cudaPointerAttributes};

macro_rules! cudart_exports {
    ($callback:ident) => {
        $callback! {
            checked {
                // --- registration and launch ---
                __cudaGetKernel(kernel: *mut cudaKernel_t, host_fun: *const c_void);
                __cudaPopCallConfiguration(grid: *mut dim3, block: *mut dim3, shared_mem: *mut usize, stream: *mut c_void);
                __cudaLaunchKernel(kernel: cudaKernel_t, grid: dim3, block: dim3, args: *mut *mut c_void, shared_mem: usize, stream: cudaStream_t);
                __cudaLaunchKernel_ptsz(kernel: cudaKernel_t, grid: dim3, block: dim3, args: *mut *mut c_void, shared_mem: usize, stream: cudaStream_t);
                cudaLaunchKernel(func: *const c_void, grid: dim3, block: dim3, args: *mut *mut c_void, shared_mem: usize, stream: cudaStream_t);
                cudaLaunchKernel_ptsz(func: *const c_void, grid: dim3, block: dim3, args: *mut *mut c_void, shared_mem: usize, stream: cudaStream_t);
                cudaLaunchKernelExC(config: *const crate::api::cudaLaunchConfig_t, func: *const c_void, args: *mut *mut c_void);
                cudaLaunchKernelExC_ptsz(config: *const crate::api::cudaLaunchConfig_t, func: *const c_void, args: *mut *mut c_void);
                cudaLaunchCooperativeKernel(func: *const c_void, grid: dim3, block: dim3, args: *mut *mut c_void, shared_mem: usize, stream: cudaStream_t);
                cudaLaunchCooperativeKernel_ptsz(func: *const c_void, grid: dim3, block: dim3, args: *mut *mut c_void, shared_mem: usize, stream: cudaStream_t);
                // --- device ---
                cudaGetDeviceCount(count: *mut c_int);
                cudaGetDevice(device: *mut c_int);
                cudaSetDevice(device: c_int);
                cudaSetDeviceFlags(flags: c_uint);
                cudaGetDeviceFlags(flags: *mut c_uint);
                cudaGetDeviceProperties(prop: *mut cudaDeviceProp, device: c_int);
                cudaDeviceGetAttribute(value: *mut c_int, attr: c_int, device: c_int);
                cudaDeviceSynchronize();
                cudaDeviceReset();
                cudaDeviceSetLimit(limit: c_int, value: usize);
                cudaDeviceGetLimit(value: *mut usize, limit: c_int);
                cudaDeviceSetCacheConfig(config: c_int);
                cudaDeviceSetSharedMemConfig(config: c_int);
                cudaDeviceGetSharedMemConfig(config: *mut c_int);
                cudaDeviceGetTexture1DLinearMaxWidth(width: *mut usize, desc: *const cudaChannelFormatDesc, device: c_int);
                cudaDeviceRegisterAsyncNotification(device: c_int, callback_func: flyt_cuda_sys::types::CUasyncCallback, user_data: *mut c_void, callback: *mut *mut c_void);
                cudaDeviceUnregisterAsyncNotification(device: c_int, callback: *mut c_void);
                cudaDeviceGetHostAtomicCapabilities(capabilities: *mut c_uint, operations: *const c_uint, count: c_uint, device: c_int);
                cudaDeviceGetP2PAtomicCapabilities(capabilities: *mut c_uint, operations: *const c_uint, count: c_uint, src: c_int, dst: c_int);
                cudaDeviceGetCacheConfig(config: *mut c_int);
                cudaCtxResetPersistingL2Cache();
                cudaDeviceGetP2PAttribute(value: *mut c_int, attr: c_int, src: c_int, dst: c_int);
                cudaProfilerStart();
                cudaProfilerStop();
                cudaMemGetInfo(free: *mut usize, total: *mut usize);
                cudaDriverGetVersion(version: *mut c_int);
                cudaRuntimeGetVersion(version: *mut c_int);
                // --- memory ---
                cudaMalloc(dev_ptr: *mut *mut c_void, size: usize);
                cudaFree(dev_ptr: *mut c_void);
                cudaMallocHost(ptr: *mut *mut c_void, size: usize);
                cudaHostAlloc(ptr: *mut *mut c_void, size: usize, flags: c_uint);
                cudaFreeHost(ptr: *mut c_void);
                cudaHostRegister(ptr: *mut c_void, size: usize, flags: c_uint);
                cudaHostUnregister(ptr: *mut c_void);
                cudaHostGetFlags(flags: *mut c_uint, ptr: *mut c_void);
                cudaHostGetDevicePointer(device: *mut *mut c_void, host: *mut c_void, flags: c_uint);
                cudaMemcpy(dst: *mut c_void, src: *const c_void, count: usize, kind: cudaMemcpyKind);
                cudaMemcpy_ptds(dst: *mut c_void, src: *const c_void, count: usize, kind: cudaMemcpyKind);
                cudaMemcpyAsync(dst: *mut c_void, src: *const c_void, count: usize, kind: cudaMemcpyKind, stream: cudaStream_t);
                cudaMemcpyAsync_ptsz(dst: *mut c_void, src: *const c_void, count: usize, kind: cudaMemcpyKind, stream: cudaStream_t);
                cudaMemcpy2D(dst: *mut c_void, dpitch: usize, src: *const c_void, spitch: usize, width: usize, height: usize, kind: cudaMemcpyKind);
                cudaMemcpy2D_ptds(dst: *mut c_void, dpitch: usize, src: *const c_void, spitch: usize, width: usize, height: usize, kind: cudaMemcpyKind);
                cudaMemcpy2DAsync(dst: *mut c_void, dpitch: usize, src: *const c_void, spitch: usize, width: usize, height: usize, kind: cudaMemcpyKind, stream: cudaStream_t);
                cudaMemcpy2DAsync_ptsz(dst: *mut c_void, dpitch: usize, src: *const c_void, spitch: usize, width: usize, height: usize, kind: cudaMemcpyKind, stream: cudaStream_t);
                cudaMemset(dev_ptr: *mut c_void, value: c_int, count: usize);
                cudaMemset_ptds(dev_ptr: *mut c_void, value: c_int, count: usize);
                cudaMemsetAsync(dev_ptr: *mut c_void, value: c_int, count: usize, stream: cudaStream_t);
                cudaMemsetAsync_ptsz(dev_ptr: *mut c_void, value: c_int, count: usize, stream: cudaStream_t);
                cudaMemcpyToSymbol(symbol: *const c_void, src: *const c_void, count: usize, offset: usize, kind: cudaMemcpyKind);
                cudaMemcpyToSymbol_ptds(symbol: *const c_void, src: *const c_void, count: usize, offset: usize, kind: cudaMemcpyKind);
                cudaMemcpyFromSymbol(dst: *mut c_void, symbol: *const c_void, count: usize, offset: usize, kind: cudaMemcpyKind);
                cudaMemcpyFromSymbol_ptds(dst: *mut c_void, symbol: *const c_void, count: usize, offset: usize, kind: cudaMemcpyKind);
                cudaMemcpyToSymbolAsync(symbol: *const c_void, src: *const c_void, count: usize, offset: usize, kind: cudaMemcpyKind, stream: cudaStream_t);
                cudaMemcpyToSymbolAsync_ptsz(symbol: *const c_void, src: *const c_void, count: usize, offset: usize, kind: cudaMemcpyKind, stream: cudaStream_t);
                cudaMemcpyFromSymbolAsync(dst: *mut c_void, symbol: *const c_void, count: usize, offset: usize, kind: cudaMemcpyKind, stream: cudaStream_t);
                cudaMemcpyFromSymbolAsync_ptsz(dst: *mut c_void, symbol: *const c_void, count: usize, offset: usize, kind: cudaMemcpyKind, stream: cudaStream_t);
                cudaGetSymbolAddress(dev_ptr: *mut *mut c_void, symbol: *const c_void);
                cudaGetSymbolSize(size: *mut usize, symbol: *const c_void);
                cudaPointerGetAttributes(attributes: *mut cudaPointerAttributes, ptr: *const c_void);
                // --- pitched and 3D memory, arrays (see `api::arrays`) ---
                cudaMallocPitch(dev_ptr: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize);
                cudaMalloc3D(pitched: *mut crate::api::cudaPitchedPtr, extent: crate::api::cudaExtent);
                cudaMemset2D(dev_ptr: *mut c_void, pitch: usize, value: c_int, width: usize, height: usize);
                cudaMemset2D_ptds(dev_ptr: *mut c_void, pitch: usize, value: c_int, width: usize, height: usize);
                cudaMemset2DAsync(dev_ptr: *mut c_void, pitch: usize, value: c_int, width: usize, height: usize, stream: cudaStream_t);
                cudaMemset2DAsync_ptsz(dev_ptr: *mut c_void, pitch: usize, value: c_int, width: usize, height: usize, stream: cudaStream_t);
                cudaMemset3D(target: crate::api::cudaPitchedPtr, value: c_int, extent: crate::api::cudaExtent);
                cudaMemset3D_ptds(target: crate::api::cudaPitchedPtr, value: c_int, extent: crate::api::cudaExtent);
                cudaMemset3DAsync(target: crate::api::cudaPitchedPtr, value: c_int, extent: crate::api::cudaExtent, stream: cudaStream_t);
                cudaMemset3DAsync_ptsz(target: crate::api::cudaPitchedPtr, value: c_int, extent: crate::api::cudaExtent, stream: cudaStream_t);
                cudaMallocArray(array: *mut cudaArray_t, desc: *const cudaChannelFormatDesc, width: usize, height: usize, flags: c_uint);
                cudaMalloc3DArray(array: *mut cudaArray_t, desc: *const cudaChannelFormatDesc, extent: crate::api::cudaExtent, flags: c_uint);
                cudaMallocMipmappedArray(mipmapped: *mut cudaMipmappedArray_t, desc: *const cudaChannelFormatDesc, extent: crate::api::cudaExtent, levels: c_uint, flags: c_uint);
                cudaGetMipmappedArrayLevel(level_array: *mut cudaArray_t, mipmapped: cudaMipmappedArray_t, level: c_uint);
                cudaFreeArray(array: cudaArray_t);
                cudaFreeMipmappedArray(mipmapped: cudaMipmappedArray_t);
                cudaArrayGetInfo(desc: *mut cudaChannelFormatDesc, extent: *mut crate::api::cudaExtent, flags: *mut c_uint, array: cudaArray_t);
                cudaGetChannelDesc(desc: *mut cudaChannelFormatDesc, array: cudaArray_t);
                cudaArrayGetPlane(plane_array: *mut cudaArray_t, array: cudaArray_t, plane: c_uint);
                cudaArrayGetSparseProperties(properties: *mut crate::api::cudaArraySparseProperties, array: cudaArray_t);
                cudaMipmappedArrayGetSparseProperties(properties: *mut crate::api::cudaArraySparseProperties, mipmapped: cudaMipmappedArray_t);
                cudaArrayGetMemoryRequirements(requirements: *mut crate::api::cudaArrayMemoryRequirements, array: cudaArray_t, device: c_int);
                cudaMipmappedArrayGetMemoryRequirements(requirements: *mut crate::api::cudaArrayMemoryRequirements, mipmapped: cudaMipmappedArray_t, device: c_int);
                cudaMemcpy2DToArray(dst: cudaArray_t, w_offset: usize, h_offset: usize, src: *const c_void, spitch: usize, width: usize, height: usize, kind: cudaMemcpyKind);
                cudaMemcpy2DToArray_ptds(dst: cudaArray_t, w_offset: usize, h_offset: usize, src: *const c_void, spitch: usize, width: usize, height: usize, kind: cudaMemcpyKind);
                cudaMemcpy2DToArrayAsync(dst: cudaArray_t, w_offset: usize, h_offset: usize, src: *const c_void, spitch: usize, width: usize, height: usize, kind: cudaMemcpyKind, stream: cudaStream_t);
                cudaMemcpy2DToArrayAsync_ptsz(dst: cudaArray_t, w_offset: usize, h_offset: usize, src: *const c_void, spitch: usize, width: usize, height: usize, kind: cudaMemcpyKind, stream: cudaStream_t);
                cudaMemcpy2DFromArray(dst: *mut c_void, dpitch: usize, src: cudaArray_t, w_offset: usize, h_offset: usize, width: usize, height: usize, kind: cudaMemcpyKind);
                cudaMemcpy2DFromArray_ptds(dst: *mut c_void, dpitch: usize, src: cudaArray_t, w_offset: usize, h_offset: usize, width: usize, height: usize, kind: cudaMemcpyKind);
                cudaMemcpy2DFromArrayAsync(dst: *mut c_void, dpitch: usize, src: cudaArray_t, w_offset: usize, h_offset: usize, width: usize, height: usize, kind: cudaMemcpyKind, stream: cudaStream_t);
                cudaMemcpy2DFromArrayAsync_ptsz(dst: *mut c_void, dpitch: usize, src: cudaArray_t, w_offset: usize, h_offset: usize, width: usize, height: usize, kind: cudaMemcpyKind, stream: cudaStream_t);
                cudaMemcpy2DArrayToArray(dst: cudaArray_t, w_offset_dst: usize, h_offset_dst: usize, src: cudaArray_t, w_offset_src: usize, h_offset_src: usize, width: usize, height: usize, kind: cudaMemcpyKind);
                cudaMemcpy2DArrayToArray_ptds(dst: cudaArray_t, w_offset_dst: usize, h_offset_dst: usize, src: cudaArray_t, w_offset_src: usize, h_offset_src: usize, width: usize, height: usize, kind: cudaMemcpyKind);
                cudaMemcpyToArray(dst: cudaArray_t, w_offset: usize, h_offset: usize, src: *const c_void, count: usize, kind: cudaMemcpyKind);
                cudaMemcpyToArray_ptds(dst: cudaArray_t, w_offset: usize, h_offset: usize, src: *const c_void, count: usize, kind: cudaMemcpyKind);
                cudaMemcpyToArrayAsync(dst: cudaArray_t, w_offset: usize, h_offset: usize, src: *const c_void, count: usize, kind: cudaMemcpyKind, stream: cudaStream_t);
                cudaMemcpyToArrayAsync_ptsz(dst: cudaArray_t, w_offset: usize, h_offset: usize, src: *const c_void, count: usize, kind: cudaMemcpyKind, stream: cudaStream_t);
                cudaMemcpyFromArray(dst: *mut c_void, src: cudaArray_t, w_offset: usize, h_offset: usize, count: usize, kind: cudaMemcpyKind);
                cudaMemcpyFromArray_ptds(dst: *mut c_void, src: cudaArray_t, w_offset: usize, h_offset: usize, count: usize, kind: cudaMemcpyKind);
                cudaMemcpyFromArrayAsync(dst: *mut c_void, src: cudaArray_t, w_offset: usize, h_offset: usize, count: usize, kind: cudaMemcpyKind, stream: cudaStream_t);
                cudaMemcpyFromArrayAsync_ptsz(dst: *mut c_void, src: cudaArray_t, w_offset: usize, h_offset: usize, count: usize, kind: cudaMemcpyKind, stream: cudaStream_t);
                cudaMemcpyArrayToArray(dst: cudaArray_t, w_offset_dst: usize, h_offset_dst: usize, src: cudaArray_t, w_offset_src: usize, h_offset_src: usize, count: usize, kind: cudaMemcpyKind);
                cudaMemcpyArrayToArray_ptds(dst: cudaArray_t, w_offset_dst: usize, h_offset_dst: usize, src: cudaArray_t, w_offset_src: usize, h_offset_src: usize, count: usize, kind: cudaMemcpyKind);
                cudaMemcpy3D(params: *const crate::api::cudaMemcpy3DParms);
                cudaMemcpy3D_ptds(params: *const crate::api::cudaMemcpy3DParms);
                cudaMemcpy3DAsync(params: *const crate::api::cudaMemcpy3DParms, stream: cudaStream_t);
                cudaMemcpy3DAsync_ptsz(params: *const crate::api::cudaMemcpy3DParms, stream: cudaStream_t);
                cudaMemcpy3DPeer(params: *const crate::api::cudaMemcpy3DPeerParms);
                cudaMemcpy3DPeer_ptds(params: *const crate::api::cudaMemcpy3DPeerParms);
                cudaMemcpy3DPeerAsync(params: *const crate::api::cudaMemcpy3DPeerParms, stream: cudaStream_t);
                cudaMemcpy3DPeerAsync_ptsz(params: *const crate::api::cudaMemcpy3DPeerParms, stream: cudaStream_t);
                // --- texture and surface objects (see `api::textures`) ---
                cudaCreateTextureObject(texture: *mut cudaTextureObject_t, resource: *const crate::api::cudaResourceDesc, desc: *const crate::api::cudaTextureDesc, view: *const crate::api::cudaResourceViewDesc);
                cudaDestroyTextureObject(texture: cudaTextureObject_t);
                cudaGetTextureObjectResourceDesc(resource: *mut crate::api::cudaResourceDesc, texture: cudaTextureObject_t);
                cudaGetTextureObjectTextureDesc(desc: *mut crate::api::cudaTextureDesc, texture: cudaTextureObject_t);
                cudaGetTextureObjectResourceViewDesc(view: *mut crate::api::cudaResourceViewDesc, texture: cudaTextureObject_t);
                cudaCreateSurfaceObject(surface: *mut cudaSurfaceObject_t, resource: *const crate::api::cudaResourceDesc);
                cudaDestroySurfaceObject(surface: cudaSurfaceObject_t);
                cudaGetSurfaceObjectResourceDesc(resource: *mut crate::api::cudaResourceDesc, surface: cudaSurfaceObject_t);
                // --- streams and events ---
                cudaStreamCreate(stream: *mut cudaStream_t);
                cudaStreamCreateWithFlags(stream: *mut cudaStream_t, flags: c_uint);
                cudaStreamCreateWithPriority(stream: *mut cudaStream_t, flags: c_uint, priority: c_int);
                cudaStreamDestroy(stream: cudaStream_t);
                cudaStreamSynchronize(stream: cudaStream_t);
                cudaStreamSynchronize_ptsz(stream: cudaStream_t);
                cudaStreamQuery(stream: cudaStream_t);
                cudaStreamQuery_ptsz(stream: cudaStream_t);
                cudaStreamWaitEvent(stream: cudaStream_t, event: cudaEvent_t, flags: c_uint);
                cudaStreamWaitEvent_ptsz(stream: cudaStream_t, event: cudaEvent_t, flags: c_uint);
                cudaStreamGetFlags(stream: cudaStream_t, flags: *mut c_uint);
                cudaStreamGetFlags_ptsz(stream: cudaStream_t, flags: *mut c_uint);
                cudaStreamGetPriority(stream: cudaStream_t, priority: *mut c_int);
                cudaStreamGetPriority_ptsz(stream: cudaStream_t, priority: *mut c_int);
                cudaStreamSetAttribute(stream: cudaStream_t, attribute: c_uint, value: *const c_void);
                cudaIpcGetMemHandle(handle: *mut cudaIpcMemHandle_t, dev_ptr: *mut c_void);
                cudaIpcOpenMemHandle(dev_ptr: *mut *mut c_void, handle: cudaIpcMemHandle_t, flags: c_uint);
                cudaIpcCloseMemHandle(dev_ptr: *mut c_void);
                cudaIpcGetEventHandle(handle: *mut cudaIpcEventHandle_t, event: cudaEvent_t);
                cudaIpcOpenEventHandle(event: *mut cudaEvent_t, handle: cudaIpcEventHandle_t);
                cudaStreamSetAttribute_ptsz(stream: cudaStream_t, attribute: c_uint, value: *const c_void);
                cudaStreamGetAttribute(stream: cudaStream_t, attribute: c_uint, value: *mut c_void);
                cudaStreamGetAttribute_ptsz(stream: cudaStream_t, attribute: c_uint, value: *mut c_void);
                cudaStreamCopyAttributes(dst: cudaStream_t, src: cudaStream_t);
                cudaStreamCopyAttributes_ptsz(dst: cudaStream_t, src: cudaStream_t);
                cudaDeviceGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int);
                cudaEventCreate(event: *mut cudaEvent_t);
                cudaEventCreateWithFlags(event: *mut cudaEvent_t, flags: c_uint);
                cudaEventRecord(event: cudaEvent_t, stream: cudaStream_t);
                cudaEventRecord_ptsz(event: cudaEvent_t, stream: cudaStream_t);
                cudaEventRecordWithFlags(event: cudaEvent_t, stream: cudaStream_t, flags: c_uint);
                cudaEventRecordWithFlags_ptsz(event: cudaEvent_t, stream: cudaStream_t, flags: c_uint);
                cudaEventSynchronize(event: cudaEvent_t);
                cudaEventQuery(event: cudaEvent_t);
                cudaEventElapsedTime(ms: *mut f32, start: cudaEvent_t, end: cudaEvent_t);
                cudaEventDestroy(event: cudaEvent_t);
                // --- functions ---
                cudaFuncGetAttributes(attributes: *mut cudaFuncAttributes, func: *const c_void);
                cudaFuncSetAttribute(func: *const c_void, attr: c_int, value: c_int);
                cudaFuncSetCacheConfig(func: *const c_void, config: c_int);
                cudaFuncSetSharedMemConfig(func: *const c_void, config: c_int);
                cudaFuncGetName(name: *mut *const c_char, func: *const c_void);
                // --- libraries the app loads ---
                cudaLibraryLoadData(library: *mut cudaLibrary_t, code: *const c_void, jit_options: *mut c_int, jit_values: *mut *mut c_void, jit_count: c_uint, library_options: *mut c_int, library_values: *mut *mut c_void, library_count: c_uint);
                cudaLibraryLoadFromFile(library: *mut cudaLibrary_t, file_name: *const c_char, jit_options: *mut c_int, jit_values: *mut *mut c_void, jit_count: c_uint, library_options: *mut c_int, library_values: *mut *mut c_void, library_count: c_uint);
                cudaLibraryUnload(library: cudaLibrary_t);
                cudaLibraryGetKernel(kernel: *mut cudaKernel_t, library: cudaLibrary_t, name: *const c_char);
                cudaLibraryGetKernelCount(count: *mut c_uint, library: cudaLibrary_t);
                cudaLibraryEnumerateKernels(kernels: *mut cudaKernel_t, num_kernels: c_uint, library: cudaLibrary_t);
                cudaLibraryGetGlobal(dev_ptr: *mut *mut c_void, bytes: *mut usize, library: cudaLibrary_t, name: *const c_char);
                cudaLibraryGetManaged(dev_ptr: *mut *mut c_void, bytes: *mut usize, library: cudaLibrary_t, name: *const c_char);
                // --- the error log (the driver's) ---
                cudaLogsRegisterCallback(callback: flyt_cuda_sys::types::CUlogsCallback, data: *mut c_void, handle: *mut *mut c_void);
                cudaLogsUnregisterCallback(handle: *mut c_void);
                cudaLogsCurrent(iterator: *mut c_uint, flags: c_uint);
                cudaLogsDumpToFile(iterator: *mut c_uint, path: *const c_char, flags: c_uint);
                cudaLogsDumpToMemory(iterator: *mut c_uint, buffer: *mut c_char, size: *mut usize, flags: c_uint);
                cudaFuncGetParamInfo(func: *const c_void, index: usize, offset: *mut usize, size: *mut usize);
                cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks: *mut c_int, func: *const c_void, block_size: c_int, dynamic_smem: usize);
                cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(blocks: *mut c_int, func: *const c_void, block_size: c_int, dynamic_smem: usize, flags: c_uint);
                // --- stream capture, graphs and host functions (see `api::graph`) ---
                cudaStreamBeginCapture(stream: cudaStream_t, mode: c_int);
                cudaStreamBeginCapture_ptsz(stream: cudaStream_t, mode: c_int);
                cudaStreamBeginCaptureToGraph(stream: cudaStream_t, graph: cudaGraph_t, dependencies: *const cudaGraphNode_t, edges: *const c_void, count: usize, mode: c_int);
                cudaStreamBeginCaptureToGraph_ptsz(stream: cudaStream_t, graph: cudaGraph_t, dependencies: *const cudaGraphNode_t, edges: *const c_void, count: usize, mode: c_int);
                cudaStreamUpdateCaptureDependencies(stream: cudaStream_t, dependencies: *mut cudaGraphNode_t, edges: *const c_void, count: usize, flags: c_uint);
                cudaStreamUpdateCaptureDependencies_ptsz(stream: cudaStream_t, dependencies: *mut cudaGraphNode_t, edges: *const c_void, count: usize, flags: c_uint);
                cudaStreamEndCapture(stream: cudaStream_t, graph: *mut cudaGraph_t);
                cudaStreamEndCapture_ptsz(stream: cudaStream_t, graph: *mut cudaGraph_t);
                cudaStreamIsCapturing(stream: cudaStream_t, status: *mut c_int);
                cudaStreamIsCapturing_ptsz(stream: cudaStream_t, status: *mut c_int);
                cudaStreamGetCaptureInfo(stream: cudaStream_t, status: *mut c_int, id: *mut u64, graph: *mut cudaGraph_t, dependencies: *mut *const cudaGraphNode_t, edges: *mut *const c_void, count: *mut usize);
                cudaStreamGetCaptureInfo_ptsz(stream: cudaStream_t, status: *mut c_int, id: *mut u64, graph: *mut cudaGraph_t, dependencies: *mut *const cudaGraphNode_t, edges: *mut *const c_void, count: *mut usize);
                cudaThreadExchangeStreamCaptureMode(mode: *mut c_int);
                cudaGraphCreate(graph: *mut cudaGraph_t, flags: c_uint);
                cudaGraphDestroy(graph: cudaGraph_t);
                cudaGraphAddKernelNode(node: *mut cudaGraphNode_t, graph: cudaGraph_t, dependencies: *const cudaGraphNode_t, count: usize, params: *const crate::api::cudaKernelNodeParams);
                cudaGraphKernelNodeGetParams(node: cudaGraphNode_t, params: *mut crate::api::cudaKernelNodeParams);
                cudaGraphKernelNodeSetParams(node: cudaGraphNode_t, params: *const crate::api::cudaKernelNodeParams);
                cudaGraphExecKernelNodeSetParams(exec: cudaGraphExec_t, node: cudaGraphNode_t, params: *const crate::api::cudaKernelNodeParams);
                cudaGraphAddMemcpyNode(node: *mut cudaGraphNode_t, graph: cudaGraph_t, dependencies: *const cudaGraphNode_t, count: usize, params: *const crate::api::cudaMemcpy3DParms);
                cudaGraphAddMemcpyNode1D(node: *mut cudaGraphNode_t, graph: cudaGraph_t, dependencies: *const cudaGraphNode_t, count: usize, dst: *mut c_void, src: *const c_void, bytes: usize, kind: cudaMemcpyKind);
                cudaGraphMemcpyNodeSetParams(node: cudaGraphNode_t, params: *const crate::api::cudaMemcpy3DParms);
                cudaGraphMemcpyNodeSetParams1D(node: cudaGraphNode_t, dst: *mut c_void, src: *const c_void, bytes: usize, kind: cudaMemcpyKind);
                cudaGraphExecMemcpyNodeSetParams(exec: cudaGraphExec_t, node: cudaGraphNode_t, params: *const crate::api::cudaMemcpy3DParms);
                cudaGraphExecMemcpyNodeSetParams1D(exec: cudaGraphExec_t, node: cudaGraphNode_t, dst: *mut c_void, src: *const c_void, bytes: usize, kind: cudaMemcpyKind);
                cudaGraphAddMemsetNode(node: *mut cudaGraphNode_t, graph: cudaGraph_t, dependencies: *const cudaGraphNode_t, count: usize, params: *const c_void);
                cudaGraphMemsetNodeSetParams(node: cudaGraphNode_t, params: *const c_void);
                cudaGraphExecMemsetNodeSetParams(exec: cudaGraphExec_t, node: cudaGraphNode_t, params: *const c_void);
                cudaGraphAddHostNode(node: *mut cudaGraphNode_t, graph: cudaGraph_t, dependencies: *const cudaGraphNode_t, count: usize, params: *const c_void);
                cudaGraphHostNodeSetParams(node: cudaGraphNode_t, params: *const c_void);
                cudaGraphExecHostNodeSetParams(exec: cudaGraphExec_t, node: cudaGraphNode_t, params: *const c_void);
                cudaGraphAddChildGraphNode(node: *mut cudaGraphNode_t, graph: cudaGraph_t, dependencies: *const cudaGraphNode_t, count: usize, child: cudaGraph_t);
                cudaGraphExecChildGraphNodeSetParams(exec: cudaGraphExec_t, node: cudaGraphNode_t, child: cudaGraph_t);
                cudaGraphAddEmptyNode(node: *mut cudaGraphNode_t, graph: cudaGraph_t, dependencies: *const cudaGraphNode_t, count: usize);
                cudaGraphAddEventRecordNode(node: *mut cudaGraphNode_t, graph: cudaGraph_t, dependencies: *const cudaGraphNode_t, count: usize, event: cudaEvent_t);
                cudaGraphAddEventWaitNode(node: *mut cudaGraphNode_t, graph: cudaGraph_t, dependencies: *const cudaGraphNode_t, count: usize, event: cudaEvent_t);
                cudaGraphEventRecordNodeSetEvent(node: cudaGraphNode_t, event: cudaEvent_t);
                cudaGraphExecEventRecordNodeSetEvent(exec: cudaGraphExec_t, node: cudaGraphNode_t, event: cudaEvent_t);
                cudaGraphEventWaitNodeSetEvent(node: cudaGraphNode_t, event: cudaEvent_t);
                cudaGraphExecEventWaitNodeSetEvent(exec: cudaGraphExec_t, node: cudaGraphNode_t, event: cudaEvent_t);
                cudaGraphAddDependencies(graph: cudaGraph_t, from: *const cudaGraphNode_t, to: *const cudaGraphNode_t, edges: *const c_void, count: usize);
                cudaGraphRemoveDependencies(graph: cudaGraph_t, from: *const cudaGraphNode_t, to: *const cudaGraphNode_t, edges: *const c_void, count: usize);
                cudaGraphGetNodes(graph: cudaGraph_t, nodes: *mut cudaGraphNode_t, count: *mut usize);
                cudaGraphGetRootNodes(graph: cudaGraph_t, nodes: *mut cudaGraphNode_t, count: *mut usize);
                cudaGraphNodeGetType(node: cudaGraphNode_t, kind: *mut c_int);
                cudaGraphDestroyNode(node: cudaGraphNode_t);
                cudaGraphClone(clone: *mut cudaGraph_t, graph: cudaGraph_t);
                cudaGraphNodeFindInClone(found: *mut cudaGraphNode_t, node: cudaGraphNode_t, clone: cudaGraph_t);
                cudaGraphInstantiate(exec: *mut cudaGraphExec_t, graph: cudaGraph_t, flags: u64);
                cudaGraphInstantiateWithFlags(exec: *mut cudaGraphExec_t, graph: cudaGraph_t, flags: u64);
                cudaGraphInstantiateWithParams(exec: *mut cudaGraphExec_t, graph: cudaGraph_t, params: *mut c_void);
                cudaGraphInstantiateWithParams_ptsz(exec: *mut cudaGraphExec_t, graph: cudaGraph_t, params: *mut c_void);
                cudaGraphLaunch(exec: cudaGraphExec_t, stream: cudaStream_t);
                cudaGraphLaunch_ptsz(exec: cudaGraphExec_t, stream: cudaStream_t);
                cudaGraphUpload(exec: cudaGraphExec_t, stream: cudaStream_t);
                cudaGraphUpload_ptsz(exec: cudaGraphExec_t, stream: cudaStream_t);
                cudaGraphExecDestroy(exec: cudaGraphExec_t);
                cudaGraphExecUpdate(exec: cudaGraphExec_t, graph: cudaGraph_t, info: *mut c_void);
                cudaGraphDebugDotPrint(graph: cudaGraph_t, path: *const c_char, flags: c_uint);
                cudaGraphAddMemAllocNode(node: *mut cudaGraphNode_t, graph: cudaGraph_t, dependencies: *const cudaGraphNode_t, count: usize, params: *mut c_void);
                cudaGraphAddMemFreeNode(node: *mut cudaGraphNode_t, graph: cudaGraph_t, dependencies: *const cudaGraphNode_t, count: usize, ptr: *mut c_void);
                cudaGraphMemAllocNodeGetParams(node: cudaGraphNode_t, params: *mut c_void);
                cudaGraphMemFreeNodeGetParams(node: cudaGraphNode_t, ptr_out: *mut c_void);
                cudaDeviceGraphMemTrim(device: c_int);
                cudaDeviceGetGraphMemAttribute(device: c_int, attr: c_int, value: *mut c_void);
                cudaDeviceSetGraphMemAttribute(device: c_int, attr: c_int, value: *mut c_void);
                cudaGraphConditionalHandleCreate(handle: *mut u64, graph: cudaGraph_t, default_value: c_uint, flags: c_uint);
                cudaGraphAddNode(node: *mut cudaGraphNode_t, graph: cudaGraph_t, dependencies: *const cudaGraphNode_t, edges: *const c_void, count: usize, params: *mut crate::driver::GraphNodeParams);
                cudaGraphNodeSetParams(node: cudaGraphNode_t, params: *mut crate::driver::GraphNodeParams);
                cudaGraphExecNodeSetParams(exec: cudaGraphExec_t, node: cudaGraphNode_t, params: *mut crate::driver::GraphNodeParams);
                cudaGraphNodeGetDependencies(node: cudaGraphNode_t, dependencies: *mut cudaGraphNode_t, edges: *mut c_void, count: *mut usize);
                cudaGraphNodeGetDependentNodes(node: cudaGraphNode_t, dependents: *mut cudaGraphNode_t, edges: *mut c_void, count: *mut usize);
                cudaGraphGetEdges(graph: cudaGraph_t, from: *mut cudaGraphNode_t, to: *mut cudaGraphNode_t, edges: *mut c_void, count: *mut usize);
                cudaGraphNodeSetEnabled(exec: cudaGraphExec_t, node: cudaGraphNode_t, enabled: c_uint);
                cudaGraphNodeGetEnabled(exec: cudaGraphExec_t, node: cudaGraphNode_t, enabled: *mut c_uint);
                cudaGraphExecGetFlags(exec: cudaGraphExec_t, flags: *mut u64);
                cudaGraphEventRecordNodeGetEvent(node: cudaGraphNode_t, event: *mut cudaEvent_t);
                cudaGraphEventWaitNodeGetEvent(node: cudaGraphNode_t, event: *mut cudaEvent_t);
                cudaGraphChildGraphNodeGetGraph(node: cudaGraphNode_t, graph: *mut cudaGraph_t);
                cudaGraphMemcpyNodeGetParams(node: cudaGraphNode_t, params: *mut crate::api::cudaMemcpy3DParms);
                cudaGraphMemsetNodeGetParams(node: cudaGraphNode_t, params: *mut c_void);
                cudaGraphHostNodeGetParams(node: cudaGraphNode_t, params: *mut c_void);
                cudaGraphAddMemcpyNodeToSymbol(node: *mut cudaGraphNode_t, graph: cudaGraph_t, dependencies: *const cudaGraphNode_t, count: usize, symbol: *const c_void, src: *const c_void, bytes: usize, offset: usize, kind: cudaMemcpyKind);
                cudaGraphAddMemcpyNodeFromSymbol(node: *mut cudaGraphNode_t, graph: cudaGraph_t, dependencies: *const cudaGraphNode_t, count: usize, dst: *mut c_void, symbol: *const c_void, bytes: usize, offset: usize, kind: cudaMemcpyKind);
                cudaGraphMemcpyNodeSetParamsToSymbol(node: cudaGraphNode_t, symbol: *const c_void, src: *const c_void, bytes: usize, offset: usize, kind: cudaMemcpyKind);
                cudaGraphMemcpyNodeSetParamsFromSymbol(node: cudaGraphNode_t, dst: *mut c_void, symbol: *const c_void, bytes: usize, offset: usize, kind: cudaMemcpyKind);
                cudaGraphExecMemcpyNodeSetParamsToSymbol(exec: cudaGraphExec_t, node: cudaGraphNode_t, symbol: *const c_void, src: *const c_void, bytes: usize, offset: usize, kind: cudaMemcpyKind);
                cudaGraphExecMemcpyNodeSetParamsFromSymbol(exec: cudaGraphExec_t, node: cudaGraphNode_t, dst: *mut c_void, symbol: *const c_void, bytes: usize, offset: usize, kind: cudaMemcpyKind);
                cudaGraphKernelNodeGetAttribute(node: cudaGraphNode_t, attribute: c_int, value: *mut c_void);
                cudaGraphKernelNodeSetAttribute(node: cudaGraphNode_t, attribute: c_int, value: *const c_void);
                cudaGraphKernelNodeCopyAttributes(dst: cudaGraphNode_t, src: cudaGraphNode_t);
                cudaUserObjectCreate(object: *mut *mut c_void, ptr: *mut c_void, destroy: crate::driver::HostFn, refs: c_uint, flags: c_uint);
                cudaUserObjectRetain(object: *mut c_void, count: c_uint);
                cudaUserObjectRelease(object: *mut c_void, count: c_uint);
                cudaGraphRetainUserObject(graph: cudaGraph_t, object: *mut c_void, count: c_uint, flags: c_uint);
                cudaGraphReleaseUserObject(graph: cudaGraph_t, object: *mut c_void, count: c_uint);
                // --- driver entry points, kernels by symbol, per-device kernel attributes ---
                cudaGetDriverEntryPoint(symbol: *const c_char, func: *mut *mut c_void, flags: u64, status: *mut c_int);
                cudaGetDriverEntryPoint_ptsz(symbol: *const c_char, func: *mut *mut c_void, flags: u64, status: *mut c_int);
                cudaGetDriverEntryPointByVersion(symbol: *const c_char, func: *mut *mut c_void, version: c_uint, flags: u64, status: *mut c_int);
                cudaGetDriverEntryPointByVersion_ptsz(symbol: *const c_char, func: *mut *mut c_void, version: c_uint, flags: u64, status: *mut c_int);
                cudaGetFuncBySymbol(func: *mut *mut c_void, symbol: *const c_void);
                cudaGetKernel(kernel: *mut cudaKernel_t, entry: *const c_void);
                cudaOccupancyAvailableDynamicSMemPerBlock(size: *mut usize, func: *const c_void, blocks: c_int, block_size: c_int);
                cudaKernelSetAttributeForDevice(kernel: cudaKernel_t, attr: c_int, value: c_int, device: c_int);
                cudaLaunchHostFunc(stream: cudaStream_t, function: crate::driver::HostFn, data: *mut c_void);
                cudaLaunchHostFunc_ptsz(stream: cudaStream_t, function: crate::driver::HostFn, data: *mut c_void);
                cudaStreamAddCallback(stream: cudaStream_t, callback: crate::driver::StreamCallback, data: *mut c_void, flags: c_uint);
                cudaStreamAddCallback_ptsz(stream: cudaStream_t, callback: crate::driver::StreamCallback, data: *mut c_void, flags: c_uint);
                // --- stream-ordered allocation (see `api::pools`) ---
                cudaMallocAsync(ptr: *mut *mut c_void, size: usize, stream: cudaStream_t);
                cudaMallocAsync_ptsz(ptr: *mut *mut c_void, size: usize, stream: cudaStream_t);
                cudaMallocFromPoolAsync(ptr: *mut *mut c_void, size: usize, pool: *mut c_void, stream: cudaStream_t);
                cudaMallocFromPoolAsync_ptsz(ptr: *mut *mut c_void, size: usize, pool: *mut c_void, stream: cudaStream_t);
                cudaFreeAsync(ptr: *mut c_void, stream: cudaStream_t);
                cudaFreeAsync_ptsz(ptr: *mut c_void, stream: cudaStream_t);
                cudaDeviceGetDefaultMemPool(pool: *mut *mut c_void, device: c_int);
                cudaDeviceGetMemPool(pool: *mut *mut c_void, device: c_int);
                cudaDeviceSetMemPool(device: c_int, pool: *mut c_void);
                cudaMemPoolGetAttribute(pool: *mut c_void, attribute: c_int, value: *mut c_void);
                cudaMemPoolSetAttribute(pool: *mut c_void, attribute: c_int, value: *mut c_void);
                cudaMemPoolTrimTo(pool: *mut c_void, keep: usize);
                cudaMemPoolCreate(pool: *mut *mut c_void, props: *const c_void);
                cudaMemPoolDestroy(pool: *mut c_void);
                cudaMemPoolExportToShareableHandle(handle: *mut c_void, pool: *mut c_void, handle_type: c_int, flags: c_uint);
                cudaMemPoolImportFromShareableHandle(pool: *mut *mut c_void, handle: *mut c_void, handle_type: c_int, flags: c_uint);
                cudaMemPoolExportPointer(data: *mut c_void, ptr: *mut c_void);
                cudaMemPoolImportPointer(ptr: *mut *mut c_void, pool: *mut c_void, data: *mut c_void);
                cudaMemPoolSetAccess(pool: *mut c_void, descriptors: *const c_void, count: usize);
                cudaMemPoolGetAccess(flags: *mut c_int, pool: *mut c_void, location: *mut crate::api::cudaMemLocation);
                cudaMemGetDefaultMemPool(pool: *mut *mut c_void, location: *mut crate::api::cudaMemLocation, kind: c_int);
                cudaMemGetMemPool(pool: *mut *mut c_void, location: *mut crate::api::cudaMemLocation, kind: c_int);
                cudaMemSetMemPool(location: *mut crate::api::cudaMemLocation, kind: c_int, pool: *mut c_void);
                // --- peers (a session serves one device), stream queries, device identity ---
                cudaDeviceCanAccessPeer(can_access: *mut c_int, device: c_int, peer: c_int);
                cudaDeviceEnablePeerAccess(peer: c_int, flags: c_uint);
                cudaDeviceDisablePeerAccess(peer: c_int);
                cudaMemcpyPeer(dst: *mut c_void, dst_device: c_int, src: *const c_void, src_device: c_int, count: usize);
                cudaMemcpyPeerAsync(dst: *mut c_void, dst_device: c_int, src: *const c_void, src_device: c_int, count: usize, stream: cudaStream_t);
                cudaMemcpyBatchAsync(dsts: *const *mut c_void, srcs: *const *const c_void, sizes: *const usize, count: usize, attrs: *mut c_void, attrs_idxs: *mut usize, num_attrs: usize, stream: cudaStream_t);
                cudaMemcpy3DBatchAsync(num_ops: usize, op_list: *mut c_void, flags: u64, stream: cudaStream_t);
                cudaMemcpy3DBatchAsync_ptsz(num_ops: usize, op_list: *mut c_void, flags: u64, stream: cudaStream_t);
                cudaMemcpyBatchAsync_ptsz(dsts: *const *mut c_void, srcs: *const *const c_void, sizes: *const usize, count: usize, attrs: *mut c_void, attrs_idxs: *mut usize, num_attrs: usize, stream: cudaStream_t);
                cudaStreamGetDevice(stream: cudaStream_t, device: *mut c_int);
                cudaStreamGetDevice_ptsz(stream: cudaStream_t, device: *mut c_int);
                cudaStreamGetId(stream: cudaStream_t, id: *mut u64);
                cudaStreamGetId_ptsz(stream: cudaStream_t, id: *mut u64);
                cudaOccupancyMaxActiveClusters(clusters: *mut c_int, func: *const c_void, config: *const crate::api::cudaLaunchConfig_t);
                cudaOccupancyMaxPotentialClusterSize(size: *mut c_int, func: *const c_void, config: *const crate::api::cudaLaunchConfig_t);
                cudaDeviceGetPCIBusId(bus_id: *mut c_char, len: c_int, device: c_int);
                cudaDeviceGetByPCIBusId(device: *mut c_int, bus_id: *const c_char);
                cudaChooseDevice(device: *mut c_int, prop: *const cudaDeviceProp);
                cudaInitDevice(device: c_int, device_flags: c_uint, flags: c_uint);
                cudaSetValidDevices(devices: *mut c_int, len: c_int);
                // --- managed memory (see `api::managed`) ---
                cudaMallocManaged(dev_ptr: *mut *mut c_void, size: usize, flags: c_uint);
                cudaMemPrefetchAsync(dev_ptr: *const c_void, count: usize, location: crate::api::cudaMemLocation, flags: c_uint, stream: cudaStream_t);
                cudaMemPrefetchAsync_ptsz(dev_ptr: *const c_void, count: usize, location: crate::api::cudaMemLocation, flags: c_uint, stream: cudaStream_t);
                cudaMemAdvise(dev_ptr: *const c_void, count: usize, advice: c_int, location: crate::api::cudaMemLocation);
                cudaMemRangeGetAttribute(data: *mut c_void, data_size: usize, attribute: c_int, dev_ptr: *const c_void, count: usize);
                cudaMemRangeGetAttributes(data: *mut *mut c_void, data_sizes: *mut usize, attributes: *mut c_int, num_attributes: usize, dev_ptr: *const c_void, count: usize);
                cudaStreamAttachMemAsync(stream: cudaStream_t, dev_ptr: *mut c_void, length: usize, flags: c_uint);
                cudaStreamAttachMemAsync_ptsz(stream: cudaStream_t, dev_ptr: *mut c_void, length: usize, flags: c_uint);
                cudaMemPrefetchBatchAsync(dptrs: *mut *mut c_void, sizes: *mut usize, count: usize, locations: *mut crate::api::cudaMemLocation, location_starts: *mut usize, num_locations: usize, flags: u64, stream: cudaStream_t);
                cudaMemPrefetchBatchAsync_ptsz(dptrs: *mut *mut c_void, sizes: *mut usize, count: usize, locations: *mut crate::api::cudaMemLocation, location_starts: *mut usize, num_locations: usize, flags: u64, stream: cudaStream_t);
                cudaMemDiscardBatchAsync(dptrs: *mut *mut c_void, sizes: *mut usize, count: usize, flags: u64, stream: cudaStream_t);
                cudaMemDiscardBatchAsync_ptsz(dptrs: *mut *mut c_void, sizes: *mut usize, count: usize, flags: u64, stream: cudaStream_t);
                cudaMemDiscardAndPrefetchBatchAsync(dptrs: *mut *mut c_void, sizes: *mut usize, count: usize, locations: *mut crate::api::cudaMemLocation, location_starts: *mut usize, num_locations: usize, flags: u64, stream: cudaStream_t);
                cudaMemDiscardAndPrefetchBatchAsync_ptsz(dptrs: *mut *mut c_void, sizes: *mut usize, count: usize, locations: *mut crate::api::cudaMemLocation, location_starts: *mut usize, num_locations: usize, flags: u64, stream: cudaStream_t);
            }
            raw {
                __cudaRegisterFatBinary(fat_cubin: *mut c_void) -> *mut *mut c_void;
                __cudaRegisterFatBinaryEnd(handle: *mut *mut c_void) -> ();
                __cudaUnregisterFatBinary(handle: *mut *mut c_void) -> ();
                __cudaRegisterFunction(handle: *mut *mut c_void, host_fun: *const c_char, device_fun: *mut c_char, device_name: *const c_char, thread_limit: c_int, tid: *mut dim3, bid: *mut dim3, block: *mut dim3, grid: *mut dim3, warp_size: *mut c_int) -> ();
                __cudaRegisterVar(handle: *mut *mut c_void, host_var: *mut c_char, device_address: *mut c_char, device_name: *const c_char, ext: c_int, size: usize, constant: c_int, global: c_int) -> ();
                __cudaRegisterManagedVar(handle: *mut *mut c_void, host_var_ptr_address: *mut *mut c_void, device_address: *mut c_char, device_name: *const c_char, ext: c_int, size: usize, constant: c_int, global: c_int) -> ();
                __cudaInitModule(handle: *mut *mut c_void) -> c_char;
                __cudaPushCallConfiguration(grid: dim3, block: dim3, shared_mem: usize, stream: cudaStream_t) -> c_uint;
                cudaGetLastError() -> cudaError_t;
                cudaPeekAtLastError() -> cudaError_t;
                cudaGetErrorString(error: cudaError_t) -> *const c_char;
                cudaGetErrorName(error: cudaError_t) -> *const c_char;
                cudaCreateChannelDesc(x: c_int, y: c_int, z: c_int, w: c_int, f: c_int) -> cudaChannelFormatDesc;
            }
            unsupported {
        __cudaGetProcAddress, __cudaRegisterHostVar, __cudaRegisterUnifiedTable,
        cudaDestroyExternalMemory, cudaDestroyExternalSemaphore,
        cudaDeviceFlushGPUDirectRDMAWrites,
        cudaDeviceGetNvSciSyncAttributes,
        cudaEGLStreamConsumerAcquireFrame, cudaEGLStreamConsumerConnect,
        cudaEGLStreamConsumerConnectWithFlags, cudaEGLStreamConsumerDisconnect,
        cudaEGLStreamConsumerReleaseFrame, cudaEGLStreamProducerConnect, cudaEGLStreamProducerDisconnect,
        cudaEGLStreamProducerPresentFrame, cudaEGLStreamProducerReturnFrame, cudaEventCreateFromEGLSync,
        cudaExternalMemoryGetMappedBuffer, cudaExternalMemoryGetMappedMipmappedArray,
        cudaGetExportTable, cudaGLGetDevices,
        cudaGLMapBufferObject, cudaGLMapBufferObjectAsync, cudaGLRegisterBufferObject,
        cudaGLSetBufferObjectMapFlags, cudaGLSetGLDevice, cudaGLUnmapBufferObject,
        cudaGLUnmapBufferObjectAsync, cudaGLUnregisterBufferObject, cudaGraphAddExternalSemaphoresSignalNode,
        cudaGraphAddExternalSemaphoresWaitNode, cudaGraphExecExternalSemaphoresSignalNodeSetParams, cudaGraphExecExternalSemaphoresWaitNodeSetParams,
        cudaGraphExternalSemaphoresSignalNodeGetParams, cudaGraphExternalSemaphoresSignalNodeSetParams,
        cudaGraphExternalSemaphoresWaitNodeGetParams, cudaGraphExternalSemaphoresWaitNodeSetParams,
        cudaGraphicsEGLRegisterImage, cudaGraphicsGLRegisterBuffer,
        cudaGraphicsGLRegisterImage, cudaGraphicsMapResources, cudaGraphicsResourceGetMappedEglFrame,
        cudaGraphicsResourceGetMappedMipmappedArray, cudaGraphicsResourceGetMappedPointer,
        cudaGraphicsResourceSetMapFlags, cudaGraphicsSubResourceGetMappedArray, cudaGraphicsUnmapResources,
        cudaGraphicsUnregisterResource, cudaGraphicsVDPAURegisterOutputSurface,
        cudaGraphicsVDPAURegisterVideoSurface, cudaImportExternalMemory, cudaImportExternalSemaphore,
        cudaLibraryGetUnifiedFunction,
        cudaSignalExternalSemaphoresAsync,
        cudaSignalExternalSemaphoresAsync_ptsz,
        cudaVDPAUGetDevice, cudaVDPAUSetVDPAUDevice,
        cudaWaitExternalSemaphoresAsync, cudaWaitExternalSemaphoresAsync_ptsz,
            }
        }
    };
}

/// Binds an internal export to the public name at version `libcudart.so.13` (rustc's own
/// version script would otherwise leave the symbol unversioned, and an app built against the
/// real runtime asks for `name@libcudart.so.13`).
macro_rules! symver {
    ($name:ident) => {
        std::arch::global_asm!(concat!(".symver __flyt_", stringify!($name), ", ", stringify!($name), "@@libcudart.so.13"));
    };
}

macro_rules! define_exports {
    (
        checked { $( $name:ident ( $($arg:ident : $ty:ty),* $(,)? ); )* }
        raw { $( $raw_name:ident ( $($raw_arg:ident : $raw_ty:ty),* $(,)? ) -> $ret:ty; )* }
        unsupported { $($unsupported:ident),* $(,)? }
    ) => {
        $(
            #[unsafe(export_name = concat!("__flyt_", stringify!($name)))]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> cudaError_t {
                // SAFETY: the app calls this with the CUDA runtime's contract for the function,
                // which the body's own SAFETY comments rely on.
                boundary(stringify!($name), || finish(unsafe { crate::api::$name($($arg),*) }))
            }
            symver!($name);
        )*
        $(
            #[unsafe(export_name = concat!("__flyt_", stringify!($raw_name)))]
            pub unsafe extern "C" fn $raw_name($($raw_arg: $raw_ty),*) -> $ret {
                // SAFETY: as above.
                boundary(stringify!($raw_name), || unsafe { crate::api::$raw_name($($raw_arg),*) })
            }
            symver!($raw_name);
        )*
        $(
            #[unsafe(export_name = concat!("__flyt_", stringify!($unsupported)))]
            pub extern "C" fn $unsupported() -> cudaError_t {
                boundary(stringify!($unsupported), || crate::api::unsupported(stringify!($unsupported)))
            }
            symver!($unsupported);
        )*

        /// Every exported name and whether it is implemented (`false`: it answers
        /// `cudaErrorNotSupported`), for the export tests.
        pub const EXPORTS: &[(&str, bool)] = &[
            $((stringify!($name), true),)*
            $((stringify!($raw_name), true),)*
            $((stringify!($unsupported), false),)*
        ];
    };
}

cudart_exports!(define_exports);
