//! Stream capture, graphs and host functions: Flyt's driver does the work (the server's driver
//! captures and runs the graphs); this front converts the runtime's structs where they differ
//! from the driver's (a kernel node names its kernel by the app's host stub, a copy node uses
//! pitched pointers and positions) and passes the rest on as they are.

#![allow(clippy::too_many_arguments, reason = "the CUDA runtime's signatures")]

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;

use super::arrays::{cudaExtent, cudaMemcpy3DParms, cudaPitchedPtr, cudaPos};
use crate::driver::{
    CUDA_CONDITIONAL_NODE_PARAMS, CUDA_KERNEL_NODE_PARAMS, CUDA_MEM_ALLOC_NODE_PARAMS_v2, CUDA_MEMCPY_NODE_PARAMS, CUDA_MEMCPY3D,
    CUDA_MEMSET_NODE_PARAMS_v2, CUdeviceptr, CUgraph, CUgraphExec, CUgraphNode, GraphNodeParams, HostFn, MEMORYTYPE_ARRAY, MEMORYTYPE_HOST,
    MEMORYTYPE_UNIFIED, StreamCallback, cu, cu_ctx, current_context,
};
use crate::ffi::{cudaEvent_t, cudaMemcpyKind, cudaStream_t, dim3};
use crate::registry::{host_function_of, kernel_by_host};

// --- stream capture ---

per_thread_twins! {
    cudaStreamBeginCapture, cudaStreamBeginCapture_ptsz (stream: cudaStream_t, mode: c_int)
        => cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz (stream.cast(), mode.cast_unsigned())
}

per_thread_twins! {
    cudaStreamBeginCaptureToGraph, cudaStreamBeginCaptureToGraph_ptsz
        (stream: cudaStream_t, graph: CUgraph, dependencies: *const CUgraphNode, edges: *const c_void, count: usize, mode: c_int)
        => cuStreamBeginCaptureToGraph, cuStreamBeginCaptureToGraph_ptsz
        (stream.cast(), graph, dependencies, edges.cast(), count, mode.cast_unsigned())
}

per_thread_twins! {
    /// CUDA 13's form takes edge data, as the driver's `_v2` does.
    cudaStreamUpdateCaptureDependencies, cudaStreamUpdateCaptureDependencies_ptsz
        (stream: cudaStream_t, dependencies: *mut CUgraphNode, edges: *const c_void, count: usize, flags: c_uint)
        => cuStreamUpdateCaptureDependencies_v2, cuStreamUpdateCaptureDependencies_v2_ptsz
        (stream.cast(), dependencies, edges.cast(), count, flags)
}

per_thread_twins! {
    cudaStreamEndCapture, cudaStreamEndCapture_ptsz (stream: cudaStream_t, graph: *mut CUgraph)
        => cuStreamEndCapture, cuStreamEndCapture_ptsz (stream.cast(), graph)
}

per_thread_twins! {
    cudaStreamIsCapturing, cudaStreamIsCapturing_ptsz (stream: cudaStream_t, status: *mut c_int)
        => cuStreamIsCapturing, cuStreamIsCapturing_ptsz (stream.cast(), status.cast())
}

per_thread_twins! {
    cudaStreamGetCaptureInfo, cudaStreamGetCaptureInfo_ptsz
        (
            stream: cudaStream_t,
            status: *mut c_int,
            id: *mut u64,
            graph: *mut CUgraph,
            dependencies: *mut *const CUgraphNode,
            edges: *mut *const c_void,
            count: *mut usize,
        )
        => cuStreamGetCaptureInfo_v3, cuStreamGetCaptureInfo_v3_ptsz
        (stream.cast(), status.cast(), id, graph, dependencies, edges.cast(), count)
}

pub unsafe fn cudaThreadExchangeStreamCaptureMode(mode: *mut c_int) -> CudaResult<()> {
    cu_ctx!(cuThreadExchangeStreamCaptureMode(mode.cast()))
}

// --- graphs ---

driver_forwards! {
    cudaGraphCreate(graph: *mut CUgraph, flags: c_uint) => cuGraphCreate(graph, flags);
    cudaGraphDestroy(graph: CUgraph) => cuGraphDestroy(graph);
}

/// `cudaKernelNodeParams`: the kernel is the app's host stub.
#[repr(C)]
pub struct cudaKernelNodeParams {
    func: *mut c_void,
    grid: dim3,
    block: dim3,
    shared_mem: c_uint,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
}

/// The driver's kernel node parameters for the runtime's.
///
/// # Safety
/// `params` is NULL or a readable `cudaKernelNodeParams`.
unsafe fn kernel_params(params: *const cudaKernelNodeParams) -> CudaResult<CUDA_KERNEL_NODE_PARAMS> {
    if params.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    // SAFETY: checked non-NULL; the app's struct.
    let p = unsafe { &*params };
    let kernel = kernel_by_host(p.func as usize).ok_or(CudaError::INVALID_DEVICE_FUNCTION)?.handle()?;
    Ok(CUDA_KERNEL_NODE_PARAMS {
        // A `CUkernel` serves where the driver takes a `CUfunction` (cuda.h says so).
        func: kernel.cast(),
        gridDimX: p.grid.x,
        gridDimY: p.grid.y,
        gridDimZ: p.grid.z,
        blockDimX: p.block.x,
        blockDimY: p.block.y,
        blockDimZ: p.block.z,
        sharedMemBytes: p.shared_mem,
        kernelParams: p.kernel_params,
        extra: p.extra,
        kern: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
    })
}

pub unsafe fn cudaGraphAddKernelNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    count: usize,
    params: *const cudaKernelNodeParams,
) -> CudaResult<()> {
    // SAFETY: the app's struct.
    let params = unsafe { kernel_params(params) }?;
    cu_ctx!(cuGraphAddKernelNode_v2(node, graph, dependencies, count, &params))
}

pub unsafe fn cudaGraphKernelNodeSetParams(node: CUgraphNode, params: *const cudaKernelNodeParams) -> CudaResult<()> {
    // SAFETY: the app's struct.
    let params = unsafe { kernel_params(params) }?;
    cu_ctx!(cuGraphKernelNodeSetParams_v2(node, &params))
}

pub unsafe fn cudaGraphExecKernelNodeSetParams(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *const cudaKernelNodeParams,
) -> CudaResult<()> {
    // SAFETY: the app's struct.
    let params = unsafe { kernel_params(params) }?;
    cu_ctx!(cuGraphExecKernelNodeSetParams_v2(exec, node, &params))
}

pub unsafe fn cudaGraphKernelNodeGetParams(node: CUgraphNode, params: *mut cudaKernelNodeParams) -> CudaResult<()> {
    if params.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    // SAFETY: all-zero is a valid value of these plain fields and NULL pointers.
    let mut driver: CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
    cu_ctx!(cuGraphKernelNodeGetParams_v2(node, &mut driver))?;
    let func = host_function_of(driver.func.cast()).ok_or(CudaError::INVALID_DEVICE_FUNCTION)?;
    let value = cudaKernelNodeParams {
        func: func as *mut c_void,
        grid: dim3 { x: driver.gridDimX, y: driver.gridDimY, z: driver.gridDimZ },
        block: dim3 { x: driver.blockDimX, y: driver.blockDimY, z: driver.blockDimZ },
        shared_mem: driver.sharedMemBytes,
        kernel_params: driver.kernelParams,
        extra: driver.extra,
    };
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { params.write(value) };
    Ok(())
}

/// A 3D copy between linear memory, as the driver describes it (the driver tells device memory
/// from host memory by the pointers; arrays are not supported).
fn memcpy3d(src: &cudaPitchedPtr, src_pos: &cudaPos, dst: &cudaPitchedPtr, dst_pos: &cudaPos, extent: &cudaExtent) -> CUDA_MEMCPY3D {
    CUDA_MEMCPY3D {
        srcXInBytes: src_pos.x,
        srcY: src_pos.y,
        srcZ: src_pos.z,
        srcLOD: 0,
        srcMemoryType: MEMORYTYPE_UNIFIED,
        srcHost: src.ptr,
        srcDevice: src.ptr as u64,
        srcArray: std::ptr::null_mut(),
        reserved0: std::ptr::null_mut(),
        srcPitch: src.pitch,
        srcHeight: src.ysize,
        dstXInBytes: dst_pos.x,
        dstY: dst_pos.y,
        dstZ: dst_pos.z,
        dstLOD: 0,
        dstMemoryType: MEMORYTYPE_UNIFIED,
        dstHost: dst.ptr,
        dstDevice: dst.ptr as u64,
        dstArray: std::ptr::null_mut(),
        reserved1: std::ptr::null_mut(),
        dstPitch: dst.pitch,
        dstHeight: dst.ysize,
        WidthInBytes: extent.width,
        Height: extent.height,
        Depth: extent.depth,
    }
}

/// # Safety
/// `params` is NULL or a readable `cudaMemcpy3DParms`.
unsafe fn copy_params(symbol: &str, params: *const cudaMemcpy3DParms) -> CudaResult<CUDA_MEMCPY3D> {
    if params.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    // SAFETY: checked non-NULL; the app's struct.
    let p = unsafe { &*params };
    if !p.src_array.is_null() || !p.dst_array.is_null() {
        return Err(super::unsupported_use(symbol, "CUDA arrays"));
    }
    Ok(memcpy3d(&p.src_ptr, &p.src_pos, &p.dst_ptr, &p.dst_pos, &p.extent))
}

/// A 1D copy as the driver's 3D description.
fn copy_1d(dst: *mut c_void, src: *const c_void, count: usize) -> CUDA_MEMCPY3D {
    let origin = || cudaPos { x: 0, y: 0, z: 0 };
    let line = |ptr: *mut c_void| cudaPitchedPtr { ptr, pitch: count, xsize: count, ysize: 1 };
    memcpy3d(&line(src.cast_mut()), &origin(), &line(dst), &origin(), &cudaExtent { width: count, height: 1, depth: 1 })
}

/// Declares the three exports that take one form of copy node parameters: adding a node to a
/// graph, setting a graph's node and setting an instantiated graph's node. Each converts the
/// parameters to the driver's `CUDA_MEMCPY3D` in `$copy` (which sees the export's name as
/// `|$function|`), then calls the driver.
macro_rules! copy_node_exports {
    ($(
        $add:ident, $set:ident, $exec_set:ident ($($arg:ident: $ty:ty),* $(,)?) |$function:pat_param| $copy:expr;
    )*) => {$(
        #[allow(clippy::too_many_arguments, reason = "the CUDA export's parameters")]
        pub unsafe fn $add(
            node: *mut CUgraphNode,
            graph: CUgraph,
            dependencies: *const CUgraphNode,
            num_dependencies: usize,
            $($arg: $ty),*
        ) -> CudaResult<()> {
            let $function: &str = stringify!($add);
            let copy: CUDA_MEMCPY3D = $copy?;
            cu_ctx!(cuGraphAddMemcpyNode(node, graph, dependencies, num_dependencies, &copy, std::ptr::null_mut()))
        }

        #[allow(clippy::too_many_arguments, reason = "the CUDA export's parameters")]
        pub unsafe fn $set(node: CUgraphNode, $($arg: $ty),*) -> CudaResult<()> {
            let $function: &str = stringify!($set);
            let copy: CUDA_MEMCPY3D = $copy?;
            cu_ctx!(cuGraphMemcpyNodeSetParams(node, &copy))
        }

        #[allow(clippy::too_many_arguments, reason = "the CUDA export's parameters")]
        pub unsafe fn $exec_set(exec: CUgraphExec, node: CUgraphNode, $($arg: $ty),*) -> CudaResult<()> {
            let $function: &str = stringify!($exec_set);
            let copy: CUDA_MEMCPY3D = $copy?;
            cu_ctx!(cuGraphExecMemcpyNodeSetParams(exec, node, &copy, std::ptr::null_mut()))
        }
    )*};
}

copy_node_exports! {
    cudaGraphAddMemcpyNode, cudaGraphMemcpyNodeSetParams, cudaGraphExecMemcpyNodeSetParams (params: *const cudaMemcpy3DParms)
        // SAFETY: the app's struct.
        |function| unsafe { copy_params(function, params) };
    cudaGraphAddMemcpyNode1D, cudaGraphMemcpyNodeSetParams1D, cudaGraphExecMemcpyNodeSetParams1D
        (dst: *mut c_void, src: *const c_void, bytes: usize, _kind: cudaMemcpyKind)
        |_| CudaResult::Ok(copy_1d(dst, src, bytes));
    cudaGraphAddMemcpyNodeToSymbol, cudaGraphMemcpyNodeSetParamsToSymbol, cudaGraphExecMemcpyNodeSetParamsToSymbol
        (symbol: *const c_void, src: *const c_void, count: usize, offset: usize, kind: cudaMemcpyKind)
        |_| symbol_copy(symbol, count, offset, kind, true, src);
    cudaGraphAddMemcpyNodeFromSymbol, cudaGraphMemcpyNodeSetParamsFromSymbol, cudaGraphExecMemcpyNodeSetParamsFromSymbol
        (dst: *mut c_void, symbol: *const c_void, count: usize, offset: usize, kind: cudaMemcpyKind)
        |_| symbol_copy(symbol, count, offset, kind, false, dst);
}

/// A copy node's parameters in the runtime's form: each side's pointer (device or host, as the
/// driver says), position and pitch; the row width, which the driver's form lacks, is the pitch.
pub unsafe fn cudaGraphMemcpyNodeGetParams(node: CUgraphNode, params: *mut cudaMemcpy3DParms) -> CudaResult<()> {
    if params.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    // SAFETY: all-zero is a valid value of these plain fields and NULL pointers.
    let mut copy: CUDA_MEMCPY3D = unsafe { std::mem::zeroed() };
    cu_ctx!(cuGraphMemcpyNodeGetParams(node, &mut copy))?;
    if copy.srcMemoryType == MEMORYTYPE_ARRAY || copy.dstMemoryType == MEMORYTYPE_ARRAY {
        return Err(super::unsupported_use("cudaGraphMemcpyNodeGetParams", "CUDA arrays"));
    }
    let side = |memory_type: c_uint, host: *mut c_void, device: CUdeviceptr, pitch: usize, height: usize| cudaPitchedPtr {
        ptr: if memory_type == MEMORYTYPE_HOST { host } else { std::ptr::with_exposed_provenance_mut(device as usize) },
        pitch,
        xsize: pitch,
        ysize: height,
    };
    let value = cudaMemcpy3DParms {
        src_array: std::ptr::null_mut(),
        src_pos: cudaPos { x: copy.srcXInBytes, y: copy.srcY, z: copy.srcZ },
        src_ptr: side(copy.srcMemoryType, copy.srcHost.cast_mut(), copy.srcDevice, copy.srcPitch, copy.srcHeight),
        dst_array: std::ptr::null_mut(),
        dst_pos: cudaPos { x: copy.dstXInBytes, y: copy.dstY, z: copy.dstZ },
        dst_ptr: side(copy.dstMemoryType, copy.dstHost, copy.dstDevice, copy.dstPitch, copy.dstHeight),
        extent: cudaExtent { width: copy.WidthInBytes, height: copy.Height, depth: copy.Depth },
        kind: MEMCPY_DEFAULT,
    };
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { params.write(value) };
    Ok(())
}

/// `cudaMemcpyDefault`: the runtime's copy nodes read back with the kind the pointers imply.
const MEMCPY_DEFAULT: cudaMemcpyKind = 4;

/// A 1D copy node to or from a `__device__` variable: its address, `offset` in.
fn symbol_copy(
    symbol: *const c_void,
    count: usize,
    offset: usize,
    kind: cudaMemcpyKind,
    to_symbol: bool,
    other: *const c_void,
) -> CudaResult<CUDA_MEMCPY3D> {
    super::memory::symbol_direction(to_symbol, kind)?;
    let address: *mut c_void = std::ptr::with_exposed_provenance_mut(super::memory::symbol_address(symbol, count, offset)? as usize);
    Ok(if to_symbol { copy_1d(address, other, count) } else { copy_1d(other.cast_mut(), address, count) })
}

// `cudaMemsetParams` and `cudaHostNodeParams` have the driver's layouts, and so have
// `cudaLaunchAttributeValue` and the attribute numbers.

driver_forwards! {
    cudaGraphMemsetNodeGetParams(node: CUgraphNode, params: *mut c_void) => cuGraphMemsetNodeGetParams(node, params.cast());
    cudaGraphHostNodeGetParams(node: CUgraphNode, params: *mut c_void) => cuGraphHostNodeGetParams(node, params.cast());
    cudaGraphKernelNodeGetAttribute(node: CUgraphNode, attribute: c_int, value: *mut c_void) => cuGraphKernelNodeGetAttribute(node, attribute.cast_unsigned(), value.cast());
    cudaGraphKernelNodeSetAttribute(node: CUgraphNode, attribute: c_int, value: *const c_void) => cuGraphKernelNodeSetAttribute(node, attribute.cast_unsigned(), value.cast());
    cudaGraphKernelNodeCopyAttributes(dst: CUgraphNode, src: CUgraphNode) => cuGraphKernelNodeCopyAttributes(dst, src);
}

// User objects: the flags (`cudaUserObjectNoDestructorSync`, `cudaGraphUserObjectMove`) are
// the driver's.

pub unsafe fn cudaUserObjectCreate(
    object: *mut *mut c_void,
    ptr: *mut c_void,
    destroy: HostFn,
    refs: c_uint,
    flags: c_uint,
) -> CudaResult<()> {
    cu!(cuUserObjectCreate(object.cast(), ptr, destroy, refs, flags))
}

pub unsafe fn cudaUserObjectRetain(object: *mut c_void, count: c_uint) -> CudaResult<()> {
    cu!(cuUserObjectRetain(object.cast(), count))
}

pub unsafe fn cudaUserObjectRelease(object: *mut c_void, count: c_uint) -> CudaResult<()> {
    cu!(cuUserObjectRelease(object.cast(), count))
}

driver_forwards! {
    cudaGraphRetainUserObject(graph: CUgraph, object: *mut c_void, count: c_uint, flags: c_uint) => cuGraphRetainUserObject(graph, object.cast(), count, flags);
    cudaGraphReleaseUserObject(graph: CUgraph, object: *mut c_void, count: c_uint) => cuGraphReleaseUserObject(graph, object.cast(), count);
}

// `cudaMemsetParams` and `cudaHostNodeParams` have the driver's layouts.

driver_forwards! {
    cudaGraphAddMemsetNode(node: *mut CUgraphNode, graph: CUgraph, dependencies: *const CUgraphNode, count: usize, params: *const c_void) => cuGraphAddMemsetNode(node, graph, dependencies, count, params.cast(), std::ptr::null_mut());
    cudaGraphMemsetNodeSetParams(node: CUgraphNode, params: *const c_void) => cuGraphMemsetNodeSetParams(node, params.cast());
    cudaGraphExecMemsetNodeSetParams(exec: CUgraphExec, node: CUgraphNode, params: *const c_void) => cuGraphExecMemsetNodeSetParams(exec, node, params.cast(), std::ptr::null_mut());
    cudaGraphAddHostNode(node: *mut CUgraphNode, graph: CUgraph, dependencies: *const CUgraphNode, count: usize, params: *const c_void) => cuGraphAddHostNode(node, graph, dependencies, count, params.cast());
    cudaGraphHostNodeSetParams(node: CUgraphNode, params: *const c_void) => cuGraphHostNodeSetParams(node, params.cast());
    cudaGraphExecHostNodeSetParams(exec: CUgraphExec, node: CUgraphNode, params: *const c_void) => cuGraphExecHostNodeSetParams(exec, node, params.cast());
    cudaGraphAddChildGraphNode(node: *mut CUgraphNode, graph: CUgraph, dependencies: *const CUgraphNode, count: usize, child: CUgraph) => cuGraphAddChildGraphNode(node, graph, dependencies, count, child);
    cudaGraphExecChildGraphNodeSetParams(exec: CUgraphExec, node: CUgraphNode, child: CUgraph) => cuGraphExecChildGraphNodeSetParams(exec, node, child);
    cudaGraphAddEmptyNode(node: *mut CUgraphNode, graph: CUgraph, dependencies: *const CUgraphNode, count: usize) => cuGraphAddEmptyNode(node, graph, dependencies, count);
    cudaGraphAddEventRecordNode(node: *mut CUgraphNode, graph: CUgraph, dependencies: *const CUgraphNode, count: usize, event: cudaEvent_t) => cuGraphAddEventRecordNode(node, graph, dependencies, count, event.cast());
    cudaGraphAddEventWaitNode(node: *mut CUgraphNode, graph: CUgraph, dependencies: *const CUgraphNode, count: usize, event: cudaEvent_t) => cuGraphAddEventWaitNode(node, graph, dependencies, count, event.cast());
    cudaGraphEventRecordNodeSetEvent(node: CUgraphNode, event: cudaEvent_t) => cuGraphEventRecordNodeSetEvent(node, event.cast());
    cudaGraphExecEventRecordNodeSetEvent(exec: CUgraphExec, node: CUgraphNode, event: cudaEvent_t) => cuGraphExecEventRecordNodeSetEvent(exec, node, event.cast());
    cudaGraphEventWaitNodeSetEvent(node: CUgraphNode, event: cudaEvent_t) => cuGraphEventWaitNodeSetEvent(node, event.cast());
    cudaGraphExecEventWaitNodeSetEvent(exec: CUgraphExec, node: CUgraphNode, event: cudaEvent_t) => cuGraphExecEventWaitNodeSetEvent(exec, node, event.cast());
    cudaGraphAddDependencies(graph: CUgraph, from: *const CUgraphNode, to: *const CUgraphNode, edges: *const c_void, count: usize) => cuGraphAddDependencies_v2(graph, from, to, edges.cast(), count);
    cudaGraphRemoveDependencies(graph: CUgraph, from: *const CUgraphNode, to: *const CUgraphNode, edges: *const c_void, count: usize) => cuGraphRemoveDependencies_v2(graph, from, to, edges.cast(), count);
    cudaGraphGetNodes(graph: CUgraph, nodes: *mut CUgraphNode, count: *mut usize) => cuGraphGetNodes(graph, nodes, count);
    cudaGraphGetRootNodes(graph: CUgraph, nodes: *mut CUgraphNode, count: *mut usize) => cuGraphGetRootNodes(graph, nodes, count);
    cudaGraphNodeGetType(node: CUgraphNode, kind: *mut c_int) => cuGraphNodeGetType(node, kind.cast());
    cudaGraphDestroyNode(node: CUgraphNode) => cuGraphDestroyNode(node);
    cudaGraphClone(clone: *mut CUgraph, graph: CUgraph) => cuGraphClone(clone, graph);
    cudaGraphNodeFindInClone(found: *mut CUgraphNode, node: CUgraphNode, clone: CUgraph) => cuGraphNodeFindInClone(found, node, clone);
    cudaGraphInstantiate(exec: *mut CUgraphExec, graph: CUgraph, flags: c_ulonglong) => cuGraphInstantiateWithFlags(exec, graph, flags);
    cudaGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: c_ulonglong) => cuGraphInstantiateWithFlags(exec, graph, flags);
}

// `cudaGraphInstantiateParams` and `cudaGraphExecUpdateResultInfo` have the driver's layouts.

per_thread_twins! {
    cudaGraphInstantiateWithParams, cudaGraphInstantiateWithParams_ptsz (exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void)
        => cuGraphInstantiateWithParams, cuGraphInstantiateWithParams_ptsz (exec, graph, params.cast())
}

per_thread_twins! {
    cudaGraphLaunch, cudaGraphLaunch_ptsz (exec: CUgraphExec, stream: cudaStream_t)
        => cuGraphLaunch, cuGraphLaunch_ptsz (exec, stream.cast())
}

per_thread_twins! {
    cudaGraphUpload, cudaGraphUpload_ptsz (exec: CUgraphExec, stream: cudaStream_t)
        => cuGraphUpload, cuGraphUpload_ptsz (exec, stream.cast())
}

driver_forwards! {
    cudaGraphExecDestroy(exec: CUgraphExec) => cuGraphExecDestroy(exec);
    cudaGraphExecUpdate(exec: CUgraphExec, graph: CUgraph, info: *mut c_void) => cuGraphExecUpdate_v2(exec, graph, info.cast());
    cudaGraphDebugDotPrint(graph: CUgraph, path: *const c_char, flags: c_uint) => cuGraphDebugDotPrint(graph, path, flags);
}

// --- memory nodes (`cudaMemAllocNodeParams` has the driver's layout; the driver writes `dptr`) ---

driver_forwards! {
    cudaGraphAddMemAllocNode(node: *mut CUgraphNode, graph: CUgraph, dependencies: *const CUgraphNode, count: usize, params: *mut c_void) => cuGraphAddMemAllocNode(node, graph, dependencies, count, params.cast());
    cudaGraphAddMemFreeNode(node: *mut CUgraphNode, graph: CUgraph, dependencies: *const CUgraphNode, count: usize, ptr: *mut c_void) => cuGraphAddMemFreeNode(node, graph, dependencies, count, ptr as CUdeviceptr);
    cudaGraphMemAllocNodeGetParams(node: CUgraphNode, params: *mut c_void) => cuGraphMemAllocNodeGetParams(node, params.cast());
    /// `ptr_out` points to the app's `void *`, which is the driver's `CUdeviceptr`.
    cudaGraphMemFreeNodeGetParams(node: CUgraphNode, ptr_out: *mut c_void) => cuGraphMemFreeNodeGetParams(node, ptr_out.cast());
    cudaDeviceGraphMemTrim(device: c_int) => cuDeviceGraphMemTrim(device);
    cudaDeviceGetGraphMemAttribute(device: c_int, attribute: c_int, value: *mut c_void) => cuDeviceGetGraphMemAttribute(device, attribute.cast_unsigned(), value);
    cudaDeviceSetGraphMemAttribute(device: c_int, attribute: c_int, value: *mut c_void) => cuDeviceSetGraphMemAttribute(device, attribute.cast_unsigned(), value);
}

// --- conditional and generic nodes ---

/// The runtime names no context: the handle belongs to the thread's, as in NVIDIA's runtime.
pub unsafe fn cudaGraphConditionalHandleCreate(handle: *mut u64, graph: CUgraph, default_value: c_uint, flags: c_uint) -> CudaResult<()> {
    let context = current_context()?;
    cu_ctx!(cuGraphConditionalHandleCreate(handle, graph, context, default_value, flags))
}

/// `cudaGraphNodeType` values whose union members differ between the runtime and the driver, or
/// carry an output.
const NODE_KERNEL: c_int = 0;
const NODE_MEMCPY: c_int = 1;
const NODE_MEMSET: c_int = 2;
const NODE_MEM_ALLOC: c_int = 10;
const NODE_CONDITIONAL: c_int = 13;

/// `cudaMemcpyNodeParams`: three reserved ints where the driver's copy node has one and a context.
#[repr(C)]
struct RuntimeMemcpyNodeParams {
    flags: c_int,
    reserved: [c_int; 3],
    copy: cudaMemcpy3DParms,
}

// The sizes and offsets of the C structs (driver_types.h, cuda.h, x86_64).
const _: () = {
    assert!(std::mem::offset_of!(RuntimeMemcpyNodeParams, copy) == 16);
};

/// The union member of node parameters as a `T`.
///
/// # Safety
/// `params` points to node parameters; reading or writing the member is the caller's to justify.
unsafe fn member<T>(params: *mut GraphNodeParams) -> *mut T {
    const { assert!(size_of::<T>() <= 29 * 8 && align_of::<T>() <= 8) };
    // SAFETY: the caller's pointer; the union is 8-byte aligned and holds a `T` (asserted above).
    unsafe { (&raw mut (*params).union).cast() }
}

/// The driver's node parameters for the runtime's: a kernel node names its kernel by the app's
/// host stub, a copy node uses pitched pointers and positions, and copy, memset and conditional
/// nodes name the thread's context, which the runtime's structs leave out. Other members (host,
/// child graph, events, memory allocation and free) have the driver's layouts.
///
/// # Safety
/// `params` is NULL or a readable `cudaGraphNodeParams`.
unsafe fn node_params(symbol: &str, params: *mut GraphNodeParams) -> CudaResult<GraphNodeParams> {
    if params.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    // SAFETY: checked non-NULL; the app's struct.
    let mut driver = unsafe { params.read() };
    let out = &raw mut driver;
    // SAFETY: each arm reads the member the type names from the app's struct and writes the
    // driver's member into the local copy, both within the 232-byte union.
    unsafe {
        match driver.kind {
            NODE_KERNEL => {
                let kernel = kernel_params(member::<cudaKernelNodeParams>(params))?;
                member::<CUDA_KERNEL_NODE_PARAMS>(out).write(kernel);
            }
            NODE_MEMCPY => {
                let app = member::<RuntimeMemcpyNodeParams>(params);
                let copy = copy_params(symbol, &raw const (*app).copy)?;
                (*out).union = [0; 29];
                let node = CUDA_MEMCPY_NODE_PARAMS { flags: (*app).flags, reserved: 0, copyCtx: current_context()?, copyParams: copy };
                member::<CUDA_MEMCPY_NODE_PARAMS>(out).write(node);
            }
            NODE_MEMSET => (*member::<CUDA_MEMSET_NODE_PARAMS_v2>(out)).ctx = current_context()?,
            NODE_CONDITIONAL => (*member::<CUDA_CONDITIONAL_NODE_PARAMS>(out)).ctx = current_context()?,
            _ => {}
        }
    }
    Ok(driver)
}

/// The runtime's `cudaGraphAddNode` takes edge data, as the driver's `_v2` does (and as the
/// driver's `cudaGraphEdgeData` layout is).
pub unsafe fn cudaGraphAddNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    edges: *const c_void,
    count: usize,
    params: *mut GraphNodeParams,
) -> CudaResult<()> {
    // SAFETY: the app's struct.
    let mut driver = unsafe { node_params("cudaGraphAddNode", params) }?;
    cu_ctx!(cuGraphAddNode_v2(node, graph, dependencies, edges.cast(), count, std::ptr::from_mut(&mut driver).cast()))?;
    // The driver's outputs go back to the app's struct: an allocation's address, a conditional
    // node's body graphs (an array the driver keeps for the node's lifetime).
    // SAFETY: `params` is the app's writable struct (non-NULL: `node_params` checked), of the type
    // the driver read.
    unsafe {
        match driver.kind {
            NODE_MEM_ALLOC => {
                (*member::<CUDA_MEM_ALLOC_NODE_PARAMS_v2>(params)).dptr = (*member::<CUDA_MEM_ALLOC_NODE_PARAMS_v2>(&mut driver)).dptr
            }
            NODE_CONDITIONAL => {
                (*member::<CUDA_CONDITIONAL_NODE_PARAMS>(params)).phGraph_out =
                    (*member::<CUDA_CONDITIONAL_NODE_PARAMS>(&mut driver)).phGraph_out;
            }
            _ => {}
        }
    }
    Ok(())
}

pub unsafe fn cudaGraphNodeSetParams(node: CUgraphNode, params: *mut GraphNodeParams) -> CudaResult<()> {
    // SAFETY: the app's struct.
    let mut driver = unsafe { node_params("cudaGraphNodeSetParams", params) }?;
    cu_ctx!(cuGraphNodeSetParams(node, std::ptr::from_mut(&mut driver).cast()))
}

pub unsafe fn cudaGraphExecNodeSetParams(exec: CUgraphExec, node: CUgraphNode, params: *mut GraphNodeParams) -> CudaResult<()> {
    // SAFETY: the app's struct.
    let mut driver = unsafe { node_params("cudaGraphExecNodeSetParams", params) }?;
    cu_ctx!(cuGraphExecNodeSetParams(exec, node, std::ptr::from_mut(&mut driver).cast()))
}

// --- queries (CUDA 13's forms take edge data, as the driver's `_v2` do) ---

driver_forwards! {
    cudaGraphNodeGetDependencies(node: CUgraphNode, dependencies: *mut CUgraphNode, edges: *mut c_void, count: *mut usize) => cuGraphNodeGetDependencies_v2(node, dependencies, edges.cast(), count);
    cudaGraphNodeGetDependentNodes(node: CUgraphNode, dependents: *mut CUgraphNode, edges: *mut c_void, count: *mut usize) => cuGraphNodeGetDependentNodes_v2(node, dependents, edges.cast(), count);
    cudaGraphGetEdges(graph: CUgraph, from: *mut CUgraphNode, to: *mut CUgraphNode, edges: *mut c_void, count: *mut usize) => cuGraphGetEdges_v2(graph, from, to, edges.cast(), count);
    cudaGraphNodeSetEnabled(exec: CUgraphExec, node: CUgraphNode, enabled: c_uint) => cuGraphNodeSetEnabled(exec, node, enabled);
    cudaGraphNodeGetEnabled(exec: CUgraphExec, node: CUgraphNode, enabled: *mut c_uint) => cuGraphNodeGetEnabled(exec, node, enabled);
    cudaGraphExecGetFlags(exec: CUgraphExec, flags: *mut c_ulonglong) => cuGraphExecGetFlags(exec, flags);
    cudaGraphEventRecordNodeGetEvent(node: CUgraphNode, event: *mut cudaEvent_t) => cuGraphEventRecordNodeGetEvent(node, event.cast());
    cudaGraphEventWaitNodeGetEvent(node: CUgraphNode, event: *mut cudaEvent_t) => cuGraphEventWaitNodeGetEvent(node, event.cast());
    cudaGraphChildGraphNodeGetGraph(node: CUgraphNode, graph: *mut CUgraph) => cuGraphChildGraphNodeGetGraph(node, graph);
}

// --- host functions ---

per_thread_twins! {
    cudaLaunchHostFunc, cudaLaunchHostFunc_ptsz (stream: cudaStream_t, function: HostFn, data: *mut c_void)
        => cuLaunchHostFunc, cuLaunchHostFunc_ptsz (stream.cast(), function, data)
}

per_thread_twins! {
    cudaStreamAddCallback, cudaStreamAddCallback_ptsz (stream: cudaStream_t, callback: StreamCallback, data: *mut c_void, flags: c_uint)
        => cuStreamAddCallback, cuStreamAddCallback_ptsz (stream.cast(), callback, data, flags)
}
