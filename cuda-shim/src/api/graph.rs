//! CUDA graphs and host functions. Graphs, nodes and executable graphs are the session's ids
//! (the app's handles are those ids as pointers), built and run by the server's driver; a graph
//! launch is one asynchronous message. Host functions run in this process when the server says a
//! stream reached one. Node parameters that name memory must name device memory: a copy node
//! with host memory could not read or write this process's memory from the server, so it is
//! refused at the call with a one-line message.

#![allow(clippy::too_many_arguments, reason = "the driver API's signatures")]

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong, c_void};
use std::sync::{Arc, Mutex};

use flyt_client::client::Client;
use flyt_client::graphs::HostFunction;
use flyt_client::launch::{Args, pack_args};
use flyt_client::registry::Function;
use flyt_client::user_objects::user_objects;
use flyt_protocol::ops::{Copy3d, Dim3, HostCopy, Memset2d, NodeCopy, NodeParams, NodeReadback, StreamMemOp, node_type, req};

use super::module::{extra_buffer, function, function_handle};
use super::session::{client, driver_error, resolve_stream, run};
use crate::CUresult;
use crate::ffi::{DriverResult, non_null, write_out};
use crate::generated::types::{
    CUDA_BATCH_MEM_OP_NODE_PARAMS, CUDA_BATCH_MEM_OP_NODE_PARAMS_v2, CUDA_CHILD_GRAPH_NODE_PARAMS, CUDA_CONDITIONAL_NODE_PARAMS,
    CUDA_GRAPH_INSTANTIATE_PARAMS, CUDA_HOST_NODE_PARAMS, CUDA_KERNEL_NODE_PARAMS, CUDA_KERNEL_NODE_PARAMS_v1, CUDA_MEM_ALLOC_NODE_PARAMS,
    CUDA_MEMCPY_NODE_PARAMS, CUDA_MEMCPY3D, CUDA_MEMSET_NODE_PARAMS, CUcontext, CUdevice, CUdeviceptr, CUevent, CUgraph,
    CUgraphConditionalHandle, CUgraphEdgeData, CUgraphExec, CUgraphExecUpdateResult, CUgraphExecUpdateResultInfo, CUgraphMem_attribute,
    CUgraphNode, CUgraphNodeParams, CUgraphNodeType, CUhostFn, CUkernelNodeAttrID, CUkernelNodeAttrValue, CUmemAccessDesc, CUmemLocation,
    CUstream, CUstreamCallback, CUuserObject, cuuint64_t,
};

/// The app's handle of a graph, node or executable graph id (0: NULL).
pub(super) fn graph_handle<T>(id: u64) -> *mut T {
    std::ptr::without_provenance_mut(id as usize)
}

pub(super) fn node_handle<T>(id: u64) -> *mut T {
    graph_handle(id)
}

pub(super) fn id_of<T>(handle: *mut T) -> DriverResult<u64> {
    if handle.is_null() { Err(CUresult::CUDA_ERROR_INVALID_VALUE) } else { Ok(handle as usize as u64) }
}

/// The ids of `count` nodes at `nodes`.
///
/// # Safety
/// `nodes` holds `count` handles (or is NULL with `count` 0).
pub(super) unsafe fn node_ids(nodes: *const CUgraphNode, count: usize) -> DriverResult<Vec<u64>> {
    if count == 0 {
        return Ok(Vec::new());
    }
    non_null([nodes.cast()])?;
    // SAFETY: the caller's array of `count` handles.
    unsafe { std::slice::from_raw_parts(nodes, count) }.iter().map(|node| id_of(*node)).collect()
}

/// A kernel node's parameters as the app gave them, for `cuGraphKernelNodeGetParams`: the
/// argument values stay here, where the returned `kernelParams` point.
struct KernelNode {
    function: Arc<Function>,
    /// The handle as the app gave it, and whether in v2's `kern` field (read back as given).
    handle: usize,
    in_kern: bool,
    grid: Dim3,
    block: Dim3,
    shared_mem: u32,
    /// The packed argument values, held for `pointers`.
    _values: Box<[u8]>,
    /// Addresses of each argument inside the values.
    pointers: Box<[usize]>,
}

static KERNEL_NODES: Mutex<Option<HashMap<u64, KernelNode>>> = Mutex::new(None);

fn kernel_nodes() -> std::sync::MutexGuard<'static, Option<HashMap<u64, KernelNode>>> {
    KERNEL_NODES.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The fields of a kernel node's parameters that v1 and v2 share, and v2's kernel handle.
struct KernelFields {
    func: *mut c_void,
    in_kern: bool,
    grid: Dim3,
    block: Dim3,
    shared_mem: u32,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
}

/// # Safety
/// `params` is a readable `CUDA_KERNEL_NODE_PARAMS` (v2).
unsafe fn fields_v2(params: *const CUDA_KERNEL_NODE_PARAMS) -> DriverResult<KernelFields> {
    non_null([params.cast()])?;
    // SAFETY: checked non-NULL; the caller's struct.
    let p = unsafe { &*params };
    let in_kern = !p.kern.is_null();
    let func = if in_kern { p.kern.cast() } else { p.func.cast() };
    Ok(KernelFields {
        func,
        in_kern,
        grid: Dim3 { x: p.gridDimX, y: p.gridDimY, z: p.gridDimZ },
        block: Dim3 { x: p.blockDimX, y: p.blockDimY, z: p.blockDimZ },
        shared_mem: p.sharedMemBytes,
        kernel_params: p.kernelParams,
        extra: p.extra,
    })
}

/// # Safety
/// `params` is a readable `CUDA_KERNEL_NODE_PARAMS_v1`.
unsafe fn fields_v1(params: *const CUDA_KERNEL_NODE_PARAMS_v1) -> DriverResult<KernelFields> {
    non_null([params.cast()])?;
    // SAFETY: checked non-NULL; the caller's struct.
    let p = unsafe { &*params };
    Ok(KernelFields {
        func: p.func.cast(),
        in_kern: false,
        grid: Dim3 { x: p.gridDimX, y: p.gridDimY, z: p.gridDimZ },
        block: Dim3 { x: p.blockDimX, y: p.blockDimY, z: p.blockDimZ },
        shared_mem: p.sharedMemBytes,
        kernel_params: p.kernelParams,
        extra: p.extra,
    })
}

/// A kernel node's parameters packed for the server, and the record kept for reading them back.
///
/// # Safety
/// `fields` holds the app's `kernelParams`/`extra`, as `cuLaunchKernel` requires them.
unsafe fn kernel_params(fields: KernelFields) -> DriverResult<(NodeParams, KernelNode)> {
    let function = function(fields.func)?;
    let args = match (fields.kernel_params.is_null(), fields.extra.is_null()) {
        (_, true) => Args::Pointers(fields.kernel_params),
        // SAFETY: the caller's `extra` array.
        (true, false) => Args::Packed(unsafe { extra_buffer(fields.extra) }?),
        (false, false) => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    };
    // SAFETY: forwarded contract.
    let packed = unsafe { pack_args(&function, args) }.map_err(driver_error)?;
    let args: Box<[u8]> = packed.clone().into_boxed_slice();
    let base = args.as_ptr() as usize;
    let pointers = function.layout.params.iter().map(|param| base + param.offset as usize).collect();
    let params = NodeParams::Kernel {
        function: function.reference(),
        grid: fields.grid,
        block: fields.block,
        shared_mem: fields.shared_mem,
        args: packed,
    };
    let (handle, in_kern) = (fields.func as usize, fields.in_kern);
    Ok((
        params,
        KernelNode {
            function,
            handle,
            in_kern,
            grid: fields.grid,
            block: fields.block,
            shared_mem: fields.shared_mem,
            _values: args,
            pointers,
        },
    ))
}

/// `CU_MEMORYTYPE_DEVICE` and `CU_MEMORYTYPE_UNIFIED`.
const MEMORY_DEVICE: c_uint = 2;
const MEMORY_UNIFIED: c_uint = 4;

/// Where one side of a copy node lies.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CopyMemory {
    Device,
    /// The app's host memory: the server copies through staging and this process when the
    /// graph runs.
    Host,
}

/// One side of a copy node: its address with the offsets applied, and what memory it is.
#[expect(clippy::too_many_arguments, reason = "one side of a CUDA_MEMCPY3D, field by field")]
fn copy_side(
    client: &Client,
    memory_type: c_uint,
    device: u64,
    host: u64,
    x: usize,
    y: usize,
    z: usize,
    pitch: u64,
    height: u64,
) -> DriverResult<(u64, CopyMemory)> {
    // Mirrored managed memory is device memory to copies (its host changes go at the launch).
    let (base, memory) = match memory_type {
        MEMORY_DEVICE => (device, CopyMemory::Device),
        MEMORY_UNIFIED if client.is_device_pointer(device) || client.managed().device_backed(device, 1) => (device, CopyMemory::Device),
        MEMORY_UNIFIED => (device, CopyMemory::Host),
        MEMORY_HOST => (host, CopyMemory::Host),
        _ => {
            crate::diagnostics::once("graph-array-copy", "flyt: graph memcpy nodes with arrays are not supported");
            return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
    };
    if base == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let offset = (z as u64)
        .checked_mul(pitch)
        .and_then(|slice| slice.checked_mul(height))
        .and_then(|slices| slices.checked_add((y as u64).checked_mul(pitch)?))
        .and_then(|rows| rows.checked_add(x as u64))
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    Ok((base.checked_add(offset).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?, memory))
}

/// # Safety
/// `params` is a readable `CUDA_MEMCPY3D`.
unsafe fn memcpy_params(client: &Client, params: *const CUDA_MEMCPY3D) -> DriverResult<NodeParams> {
    non_null([params.cast()])?;
    // SAFETY: checked non-NULL; the caller's struct.
    let p = unsafe { &*params };
    let (width, height, depth) = (p.WidthInBytes as u64, p.Height.max(1) as u64, p.Depth.max(1) as u64);
    // One row needs no pitch, one slice no height: the driver accepts 0 there.
    let pitch = |pitch: usize| if height == 1 && depth == 1 { (pitch as u64).max(width) } else { pitch as u64 };
    let slice_height = |rows: usize| if depth == 1 { (rows as u64).max(height) } else { rows as u64 };
    let (src_pitch, src_height) = (pitch(p.srcPitch), slice_height(p.srcHeight));
    let (dst_pitch, dst_height) = (pitch(p.dstPitch), slice_height(p.dstHeight));
    let (src, src_memory) =
        copy_side(client, p.srcMemoryType, p.srcDevice, p.srcHost as u64, p.srcXInBytes, p.srcY, p.srcZ, src_pitch, src_height)?;
    let (dst, dst_memory) =
        copy_side(client, p.dstMemoryType, p.dstDevice, p.dstHost as u64, p.dstXInBytes, p.dstY, p.dstZ, dst_pitch, dst_height)?;
    let copy = Copy3d { src, src_pitch, src_height, dst, dst_pitch, dst_height, width, height, depth };
    Ok(match (src_memory, dst_memory) {
        (CopyMemory::Device, CopyMemory::Device) => NodeParams::Memcpy(copy),
        (CopyMemory::Device, CopyMemory::Host) => NodeParams::HostMemcpy(HostCopy { copy, to_host: true }),
        (CopyMemory::Host, CopyMemory::Device) => NodeParams::HostMemcpy(HostCopy { copy, to_host: false }),
        (CopyMemory::Host, CopyMemory::Host) => {
            crate::diagnostics::once(
                "graph-host-to-host-copy",
                "flyt: graph memcpy nodes from host memory to host memory are not supported",
            );
            return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
    })
}

/// # Safety
/// `params` is a readable `CUDA_MEMSET_NODE_PARAMS`.
unsafe fn memset_params(params: *const CUDA_MEMSET_NODE_PARAMS) -> DriverResult<NodeParams> {
    non_null([params.cast()])?;
    // SAFETY: checked non-NULL; the caller's struct.
    let p = unsafe { &*params };
    let element_size = u8::try_from(p.elementSize).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let row = (p.width as u64).saturating_mul(u64::from(element_size));
    let pitch = if p.height <= 1 { (p.pitch as u64).max(row) } else { p.pitch as u64 };
    Ok(NodeParams::Memset(Memset2d { dst: p.dst, pitch, value: p.value, element_size, width: p.width as u64, height: p.height as u64 }))
}

/// # Safety
/// `params` is a readable `CUDA_HOST_NODE_PARAMS`.
unsafe fn host_params(client: &Client, params: *const CUDA_HOST_NODE_PARAMS) -> DriverResult<NodeParams> {
    non_null([params.cast()])?;
    // SAFETY: checked non-NULL; the caller's struct.
    let p = unsafe { &*params };
    let function = p.r#fn.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let call = client.host_node_function(HostFunction::Plain { function, user_data: p.userData as usize }).map_err(driver_error)?;
    Ok(NodeParams::Host { call })
}

fn event_params(client: &Client, event: CUevent, record: bool) -> DriverResult<NodeParams> {
    let event = flyt_client::streams::event_id(client, event as usize).map_err(driver_error)?;
    Ok(if record { NodeParams::EventRecord { event } } else { NodeParams::EventWait { event } })
}

/// Adds a node to a graph and gives the app its handle.
///
/// The node's id and, for a memory allocation node, the address the driver chose.
///
/// # Safety
/// `out` is the caller's out-pointer; `dependencies` holds `count` handles.
unsafe fn add_node(
    client: &Client,
    out: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    count: usize,
    params: NodeParams,
) -> DriverResult<(u64, u64)> {
    non_null([out.cast()])?;
    let graph = id_of(graph)?;
    // SAFETY: forwarded contract.
    let dependencies = unsafe { node_ids(dependencies, count) }?;
    let node = client.graphs().new_id();
    let kind = params.kind();
    let ptr = client.call(req::GraphAddNode { graph, node, dependencies, params }).map_err(driver_error)?.ptr;
    client.graphs().note_nodes([(node, kind)]);
    // SAFETY: checked non-NULL.
    unsafe { write_out(out, node_handle(node)) }?;
    Ok((node, ptr))
}

pub unsafe fn cuGraphCreate(ph_graph: *mut CUgraph, flags: c_uint) -> CUresult {
    run(|| {
        non_null([ph_graph.cast()])?;
        if flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let client = client()?;
        let graph = client.graphs().new_id();
        client.call(req::GraphCreate { graph }).map_err(driver_error)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(ph_graph, graph_handle(graph)) }
    })
}

pub unsafe fn cuGraphDestroy(h_graph: CUgraph) -> CUresult {
    run(|| {
        let graph = id_of(h_graph)?;
        client()?.post(req::GraphDestroy { graph }).map_err(driver_error)?;
        user_objects().owner_gone(graph);
        Ok(())
    })
}

/// Adds a kernel node and keeps its parameters for `cuGraphKernelNodeGetParams`.
///
/// # Safety
/// `fields` come from the caller's struct, whose arrays it vouches for; `out` and
/// `dependencies` are the caller's out-pointer and array of `count` handles.
unsafe fn add_kernel_node(
    out: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    count: usize,
    fields: DriverResult<KernelFields>,
) -> DriverResult {
    let client = client()?;
    // SAFETY: forwarded contract.
    let (params, record) = unsafe { kernel_params(fields?) }?;
    // SAFETY: forwarded contract.
    let (node, _) = unsafe { add_node(client, out, graph, dependencies, count, params) }?;
    kernel_nodes().get_or_insert_with(HashMap::new).insert(node, record);
    Ok(())
}

/// Declares the kernel node exports of one version of `CUDA_KERNEL_NODE_PARAMS`: adding a node,
/// and setting its parameters in its graph or in an executable graph.
macro_rules! kernel_node_versions {
    ($($add:ident, $set:ident, $exec_set:ident ($ty:ty) => $fields:ident;)*) => {$(
        pub unsafe fn $add(ph_graph_node: *mut CUgraphNode, h_graph: CUgraph, dependencies: *const CUgraphNode, num_dependencies: usize, node_params: *const $ty) -> CUresult {
            // SAFETY: the caller's struct, out-pointer and dependency array.
            run(|| unsafe { add_kernel_node(ph_graph_node, h_graph, dependencies, num_dependencies, $fields(node_params)) })
        }

        pub unsafe fn $set(h_node: CUgraphNode, node_params: *const $ty) -> CUresult {
            // SAFETY: the caller's struct.
            run(|| set_kernel(std::ptr::null_mut(), h_node, unsafe { $fields(node_params) }))
        }

        pub unsafe fn $exec_set(h_graph_exec: CUgraphExec, h_node: CUgraphNode, node_params: *const $ty) -> CUresult {
            run(|| {
                non_null([h_graph_exec.cast()])?;
                // SAFETY: the caller's struct.
                set_kernel(h_graph_exec, h_node, unsafe { $fields(node_params) })
            })
        }
    )*};
}

kernel_node_versions! {
    cuGraphAddKernelNode, cuGraphKernelNodeSetParams, cuGraphExecKernelNodeSetParams (CUDA_KERNEL_NODE_PARAMS_v1) => fields_v1;
    cuGraphAddKernelNode_v2, cuGraphKernelNodeSetParams_v2, cuGraphExecKernelNodeSetParams_v2 (CUDA_KERNEL_NODE_PARAMS) => fields_v2;
}

/// Declares the exports of the copy, memset and host nodes: adding a node, and setting its
/// parameters in its graph or in an executable graph. `$convert` checks and converts the app's
/// struct, which is then kept for the node's getter (`remember`): read only once checked.
macro_rules! remembered_nodes {
    ($($add:ident, $set:ident, $exec_set:ident ($params:ident: $ty:ty $(, $ctx:ident)?) => $convert:expr, $app:path;)*) => {$(
        pub unsafe fn $add(ph_graph_node: *mut CUgraphNode, h_graph: CUgraph, dependencies: *const CUgraphNode, num_dependencies: usize, $params: *const $ty, $($ctx: CUcontext)?) -> CUresult {
            run(|| {
                let client = client()?;
                // SAFETY: the caller's struct (read after `$convert` checked it), out-pointer and
                // dependency array.
                unsafe {
                    let (node, _) = add_node(client, ph_graph_node, h_graph, dependencies, num_dependencies, $convert?)?;
                    remember(node, $app(*$params));
                }
                Ok(())
            })
        }

        pub unsafe fn $set(h_node: CUgraphNode, $params: *const $ty) -> CUresult {
            run(|| {
                // SAFETY: the caller's struct (read after `$convert` checked it).
                unsafe {
                    set_params(std::ptr::null_mut(), h_node, $convert?)?;
                    remember(id_of(h_node)?, $app(*$params));
                }
                Ok(())
            })
        }

        pub unsafe fn $exec_set(h_graph_exec: CUgraphExec, h_node: CUgraphNode, $params: *const $ty, $($ctx: CUcontext)?) -> CUresult {
            run(|| {
                non_null([h_graph_exec.cast()])?;
                // SAFETY: the caller's struct.
                set_params(h_graph_exec, h_node, unsafe { $convert }?)
            })
        }
    )*};
}

remembered_nodes! {
    cuGraphAddMemcpyNode, cuGraphMemcpyNodeSetParams, cuGraphExecMemcpyNodeSetParams (node_params: CUDA_MEMCPY3D, _ctx)
        => memcpy_params(client()?, node_params), AppParams::Copy;
    cuGraphAddMemsetNode, cuGraphMemsetNodeSetParams, cuGraphExecMemsetNodeSetParams (node_params: CUDA_MEMSET_NODE_PARAMS, _ctx)
        => memset_params(node_params), AppParams::Memset;
    cuGraphAddHostNode, cuGraphHostNodeSetParams, cuGraphExecHostNodeSetParams (node_params: CUDA_HOST_NODE_PARAMS)
        => host_params(client()?, node_params), AppParams::Host;
}

/// A batch memory operation node's parameters: `cuStreamBatchMemOp_v2`'s operations on the
/// session's device memory, no flags; the context is the session's.
///
/// # Safety
/// `params` is NULL or the caller's struct, whose `paramArray` holds `count` operations.
unsafe fn batch_node_params(name: &str, params: *const CUDA_BATCH_MEM_OP_NODE_PARAMS) -> DriverResult<NodeParams> {
    non_null([params.cast()])?;
    // SAFETY: checked non-NULL; the caller's struct.
    let p = unsafe { &*params };
    if p.flags != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: forwarded contract.
    let ops = unsafe { super::memops::node_ops(name, p.count, p.paramArray) }?;
    Ok(NodeParams::BatchMemOp { ops })
}

/// A batch memory operation node's operations in the driver's form, kept for its getter (the
/// array it hands out); `None` for other nodes.
fn batch_words(params: &NodeParams) -> Option<Box<[[u64; 6]]>> {
    match params {
        NodeParams::BatchMemOp { ops } => Some(ops.iter().map(StreamMemOp::driver_words).collect()),
        _ => None,
    }
}

/// Keeps what [`batch_words`] made for `node`; the array it replaces ends here, as the driver's
/// does when a node's parameters change.
fn remember_batch(node: u64, words: Option<Box<[[u64; 6]]>>) {
    if let Some(words) = words {
        with_records(|records| records.batch_ops.insert(node, words));
    }
}

pub unsafe fn cuGraphAddBatchMemOpNode(
    ph_graph_node: *mut CUgraphNode,
    h_graph: CUgraph,
    dependencies: *const CUgraphNode,
    num_dependencies: usize,
    node_params: *const CUDA_BATCH_MEM_OP_NODE_PARAMS,
) -> CUresult {
    run(|| {
        let client = client()?;
        // SAFETY: the caller's struct, out-pointer and dependency array.
        unsafe {
            let params = batch_node_params("cuGraphAddBatchMemOpNode", node_params)?;
            let words = batch_words(&params);
            let (node, _) = add_node(client, ph_graph_node, h_graph, dependencies, num_dependencies, params)?;
            remember_batch(node, words);
        }
        Ok(())
    })
}

pub unsafe fn cuGraphBatchMemOpNodeSetParams(h_node: CUgraphNode, node_params: *const CUDA_BATCH_MEM_OP_NODE_PARAMS) -> CUresult {
    run(|| {
        // SAFETY: the caller's struct.
        let params = unsafe { batch_node_params("cuGraphBatchMemOpNodeSetParams", node_params) }?;
        let words = batch_words(&params);
        set_params(std::ptr::null_mut(), h_node, params)?;
        remember_batch(id_of(h_node)?, words);
        Ok(())
    })
}

pub unsafe fn cuGraphExecBatchMemOpNodeSetParams(
    h_graph_exec: CUgraphExec,
    h_node: CUgraphNode,
    node_params: *const CUDA_BATCH_MEM_OP_NODE_PARAMS,
) -> CUresult {
    run(|| {
        non_null([h_graph_exec.cast()])?;
        // SAFETY: the caller's struct.
        set_params(h_graph_exec, h_node, unsafe { batch_node_params("cuGraphExecBatchMemOpNodeSetParams", node_params) }?)
    })
}

/// The node's operations as the app gave them, or, for a node the app did not make (captured
/// from `cuStreamBatchMemOp`), as the server's driver holds them: kept here, where the array the
/// getter hands out lives.
fn batch_node_words(node: u64) -> DriverResult<(*const [u64; 6], usize)> {
    if let Some(found) = with_records(|records| records.batch_ops.get(&node).map(|words| (words.as_ptr(), words.len()))) {
        return Ok(found);
    }
    let NodeReadback::BatchMemOp { ops } = client()?.call(req::GraphNodeGetParams { node }).map_err(driver_error)?.params else {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    };
    let words: Box<[[u64; 6]]> = ops.iter().map(StreamMemOp::driver_words).collect();
    Ok(with_records(|records| {
        let words = records.batch_ops.entry(node).or_insert(words);
        (words.as_ptr(), words.len())
    }))
}

pub unsafe fn cuGraphBatchMemOpNodeGetParams(h_node: CUgraphNode, node_params_out: *mut CUDA_BATCH_MEM_OP_NODE_PARAMS) -> CUresult {
    run(|| {
        non_null([node_params_out.cast()])?;
        let (words, count) = batch_node_words(id_of(h_node)?)?;
        let params = CUDA_BATCH_MEM_OP_NODE_PARAMS {
            ctx: crate::context::current_or_primary()?.handle(),
            count: c_uint::try_from(count).map_err(|_| CUresult::CUDA_ERROR_UNKNOWN)?,
            // The driver's array is the node's and not the app's to change: so is this one.
            paramArray: words.cast_mut().cast(),
            flags: 0,
        };
        // SAFETY: checked non-NULL.
        unsafe { write_out(node_params_out, params) }
    })
}

pub unsafe fn cuGraphAddChildGraphNode(
    ph_graph_node: *mut CUgraphNode,
    h_graph: CUgraph,
    dependencies: *const CUgraphNode,
    num_dependencies: usize,
    child_graph: CUgraph,
) -> CUresult {
    run(|| {
        let client = client()?;
        let child = id_of(child_graph)?;
        // SAFETY: the caller's out-pointer and dependency array.
        unsafe { add_node(client, ph_graph_node, h_graph, dependencies, num_dependencies, NodeParams::Child { graph: child }) }?;
        // The node holds a copy of the child graph, and so its user objects.
        user_objects().inherit(child, id_of(h_graph)?);
        Ok(())
    })
}

pub unsafe fn cuGraphAddEmptyNode(
    ph_graph_node: *mut CUgraphNode,
    h_graph: CUgraph,
    dependencies: *const CUgraphNode,
    num_dependencies: usize,
) -> CUresult {
    // SAFETY: the caller's out-pointer and dependency array.
    run(|| unsafe { add_node(client()?, ph_graph_node, h_graph, dependencies, num_dependencies, NodeParams::Empty) }.map(drop))
}

/// Declares the exports of the event record (`$record` true) and event wait nodes: adding a
/// node, and setting its event in its graph or in an executable graph.
macro_rules! event_nodes {
    ($($add:ident, $set:ident, $exec_set:ident => $record:literal;)*) => {$(
        pub unsafe fn $add(ph_graph_node: *mut CUgraphNode, h_graph: CUgraph, dependencies: *const CUgraphNode, num_dependencies: usize, event: CUevent) -> CUresult {
            run(|| {
                let client = client()?;
                let params = event_params(client, event, $record)?;
                // SAFETY: the caller's out-pointer and dependency array.
                unsafe { add_node(client, ph_graph_node, h_graph, dependencies, num_dependencies, params) }.map(drop)
            })
        }

        pub unsafe fn $set(h_node: CUgraphNode, event: CUevent) -> CUresult {
            run(|| set_params(std::ptr::null_mut(), h_node, event_params(client()?, event, $record)?))
        }

        pub unsafe fn $exec_set(h_graph_exec: CUgraphExec, h_node: CUgraphNode, event: CUevent) -> CUresult {
            run(|| {
                non_null([h_graph_exec.cast()])?;
                set_params(h_graph_exec, h_node, event_params(client()?, event, $record)?)
            })
        }
    )*};
}

event_nodes! {
    cuGraphAddEventRecordNode, cuGraphEventRecordNodeSetEvent, cuGraphExecEventRecordNodeSetEvent => true;
    cuGraphAddEventWaitNode, cuGraphEventWaitNodeSetEvent, cuGraphExecEventWaitNodeSetEvent => false;
}

/// The app's edge data for `count` edges as (from port, to port, type), which the server's
/// driver checks (programmatic edges join kernel nodes); empty when NULL or all default (plain
/// full dependencies).
///
/// # Safety
/// `data` is NULL or holds `count` entries.
pub(super) unsafe fn edge_kinds(data: *const CUgraphEdgeData, count: usize) -> Vec<[u8; 3]> {
    if data.is_null() || count == 0 {
        return Vec::new();
    }
    // SAFETY: the caller's array of `count` entries.
    let data = unsafe { std::slice::from_raw_parts(data, count) };
    let kinds: Vec<[u8; 3]> = data.iter().map(|edge| [edge.from_port, edge.to_port, edge.r#type]).collect();
    if kinds.iter().all(|kind| *kind == [0; 3]) { Vec::new() } else { kinds }
}

/// Adds or removes edges, with the app's edge data if it gave any.
///
/// # Safety
/// `from`/`to` hold `count` handles; `edges` is NULL or holds `count` entries.
unsafe fn edges(
    graph: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    edges: *const CUgraphEdgeData,
    count: usize,
    remove: bool,
) -> DriverResult {
    let client = client()?;
    // SAFETY: forwarded contract.
    let (from, to, data) = unsafe { (node_ids(from, count)?, node_ids(to, count)?, edge_kinds(edges, count)) };
    add_edges(client, req::GraphEdges { graph: id_of(graph)?, from, to, data, remove })
}

/// Sends a `GraphEdges`.
fn add_edges(client: &Client, request: req::GraphEdges) -> DriverResult {
    let with_data = !request.data.is_empty();
    client.call(request).map(drop).map_err(|error| edge_data_refused(with_data, error))
}

/// The driver's error for a call that carried edge data (`with_data`) or not. A device that
/// answers "not supported" to edge data is the emulated one (a driver checks ports and types
/// against the nodes' kinds): said once.
pub(super) fn edge_data_refused(with_data: bool, error: flyt_protocol::CudaError) -> CUresult {
    if with_data && error == flyt_protocol::CudaError::NOT_SUPPORTED {
        crate::diagnostics::once(
            "graph-edge-data",
            "flyt: the GPU server's emulated device has no kernel nodes, so no graph edge with a port or a type (returning CUDA_ERROR_NOT_SUPPORTED)",
        );
    }
    driver_error(error)
}

/// Declares `cuGraphAddDependencies` and `cuGraphRemoveDependencies` (`$remove`), each with its
/// `_v2` form that takes edge data.
macro_rules! dependency_edits {
    ($($name:ident, $name_v2:ident => $remove:literal;)*) => {$(
        pub unsafe fn $name(h_graph: CUgraph, from: *const CUgraphNode, to: *const CUgraphNode, num_dependencies: usize) -> CUresult {
            // SAFETY: forwarded contract.
            unsafe { $name_v2(h_graph, from, to, std::ptr::null(), num_dependencies) }
        }

        pub unsafe fn $name_v2(h_graph: CUgraph, from: *const CUgraphNode, to: *const CUgraphNode, edge_data: *const CUgraphEdgeData, num_dependencies: usize) -> CUresult {
            // SAFETY: forwarded contract.
            run(|| unsafe { edges(h_graph, from, to, edge_data, num_dependencies, $remove) })
        }
    )*};
}

dependency_edits! {
    cuGraphAddDependencies, cuGraphAddDependencies_v2 => false;
    cuGraphRemoveDependencies, cuGraphRemoveDependencies_v2 => true;
}

/// Lists a graph's nodes (or roots) as the driver does: the count alone with `nodes` NULL,
/// else up to `*count` handles, NULL after the last, and the number written.
fn list_nodes(graph: CUgraph, nodes: *mut CUgraphNode, count: *mut usize, roots: bool) -> DriverResult {
    non_null([count.cast()])?;
    let client = client()?;
    let listed = client.call(req::GraphNodes { graph: id_of(graph)?, roots }).map_err(driver_error)?.nodes;
    client.graphs().note_nodes(listed.iter().map(|entry| (entry.node, entry.kind)));
    // SAFETY: `count` checked non-NULL; `nodes` (when not NULL) has room for `*count` handles,
    // the caller's contract.
    unsafe {
        if nodes.is_null() {
            return write_out(count, listed.len());
        }
        let room = count.read();
        for index in 0..room {
            nodes.add(index).write(listed.get(index).map_or(std::ptr::null_mut(), |entry| node_handle(entry.node)));
        }
        write_out(count, listed.len().min(room))
    }
}

pub unsafe fn cuGraphGetNodes(h_graph: CUgraph, nodes: *mut CUgraphNode, num_nodes: *mut usize) -> CUresult {
    run(|| list_nodes(h_graph, nodes, num_nodes, false))
}

pub unsafe fn cuGraphGetRootNodes(h_graph: CUgraph, root_nodes: *mut CUgraphNode, num_root_nodes: *mut usize) -> CUresult {
    run(|| list_nodes(h_graph, root_nodes, num_root_nodes, true))
}

pub unsafe fn cuGraphNodeGetType(h_node: CUgraphNode, type_: *mut CUgraphNodeType) -> CUresult {
    run(|| {
        non_null([type_.cast()])?;
        let kind = client()?.graphs().node_kind(id_of(h_node)?).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(type_, kind as CUgraphNodeType) }
    })
}

pub unsafe fn cuGraphDestroyNode(h_node: CUgraphNode) -> CUresult {
    run(|| {
        let client = client()?;
        let node = id_of(h_node)?;
        client.call(req::GraphDestroyNode { node }).map_err(driver_error)?;
        client.graphs().forget_node(node);
        if let Some(nodes) = kernel_nodes().as_mut() {
            nodes.remove(&node);
        }
        with_records(|records| records.params.remove(&node));
        Ok(())
    })
}

pub unsafe fn cuGraphClone(ph_graph_clone: *mut CUgraph, original_graph: CUgraph) -> CUresult {
    run(|| {
        non_null([ph_graph_clone.cast()])?;
        let client = client()?;
        let clone = client.graphs().new_id();
        let original = id_of(original_graph)?;
        let pairs = client.call(req::GraphClone { graph: original, clone }).map_err(driver_error)?.nodes;
        client.graphs().note_clone(clone, &pairs);
        with_records(|records| {
            for (original, copy) in &pairs {
                if let Some(params) = records.params.get(original).copied() {
                    records.params.insert(*copy, params);
                }
            }
        });
        user_objects().inherit(original, clone);
        // SAFETY: checked non-NULL.
        unsafe { write_out(ph_graph_clone, graph_handle(clone)) }
    })
}

pub unsafe fn cuGraphNodeFindInClone(ph_node: *mut CUgraphNode, h_original_node: CUgraphNode, h_cloned_graph: CUgraph) -> CUresult {
    run(|| {
        non_null([ph_node.cast()])?;
        let client = client()?;
        let found =
            client.graphs().node_in_clone(id_of(h_cloned_graph)?, id_of(h_original_node)?).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(ph_node, node_handle(found)) }
    })
}

fn instantiate(out: *mut CUgraphExec, graph: CUgraph, flags: u64) -> DriverResult<u64> {
    non_null([out.cast()])?;
    let client = client()?;
    let exec = client.graphs().new_id();
    let graph = id_of(graph)?;
    let reply = client.call(req::GraphInstantiate { graph, exec, flags }).map_err(driver_error)?;
    client.graphs().set_exec_host_nodes(exec, reply.host_nodes);
    user_objects().inherit(graph, exec);
    with_records(|records| records.exec_flags.insert(exec, flags));
    // SAFETY: checked non-NULL.
    unsafe { write_out(out, graph_handle(exec)) }?;
    Ok(exec)
}

pub unsafe fn cuGraphInstantiateWithFlags(ph_graph_exec: *mut CUgraphExec, h_graph: CUgraph, flags: c_ulonglong) -> CUresult {
    run(|| instantiate(ph_graph_exec, h_graph, flags).map(drop))
}

// `cuGraphInstantiate` (CUDA 11's export, the same ABI) and `_v2`: flags 0, no error node, an
// empty log. The optional out-pointers are NULL or the caller's (`log_buffer` with
// `buffer_size` bytes).
export_names! {
    [cuGraphInstantiate, cuGraphInstantiate_v2]
    (ph_graph_exec: *mut CUgraphExec, h_graph: CUgraph, ph_error_node: *mut CUgraphNode, log_buffer: *mut c_char, buffer_size: usize)
    {
        run(|| {
            instantiate(ph_graph_exec, h_graph, 0)?;
            // SAFETY: the caller's optional out-pointers: no error node, an empty log.
            unsafe {
                if !ph_error_node.is_null() {
                    ph_error_node.write(std::ptr::null_mut());
                }
                if !log_buffer.is_null() && buffer_size > 0 {
                    log_buffer.write(0);
                }
            }
            Ok(())
        })
    }
}

/// `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD`.
const INSTANTIATE_UPLOAD: u64 = 2;

fn instantiate_with_params(out: *mut CUgraphExec, graph: CUgraph, params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS, ptsz: bool) -> DriverResult {
    non_null([params.cast()])?;
    // SAFETY: checked non-NULL; the caller's in/out struct.
    let p = unsafe { &mut *params };
    let instantiated = instantiate(out, graph, p.flags & !INSTANTIATE_UPLOAD);
    // CUDA_GRAPH_INSTANTIATE_SUCCESS (0) or _ERROR (1); no node to blame is known here.
    p.result_out = if instantiated.is_ok() { 0 } else { 1 };
    p.hErrNode_out = std::ptr::null_mut();
    let exec = instantiated?;
    if p.flags & INSTANTIATE_UPLOAD != 0 {
        let client = client()?;
        let stream = resolve_stream(client, p.hUploadStream, ptsz)?;
        client.post(req::GraphUpload { exec, stream }).map_err(driver_error)?;
    }
    Ok(())
}

per_thread_twins! {
    cuGraphInstantiateWithParams, cuGraphInstantiateWithParams_ptsz
        (
            ph_graph_exec: *mut CUgraphExec,
            h_graph: CUgraph,
            instantiate_params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
        )
        |per_thread| run(|| instantiate_with_params(ph_graph_exec, h_graph, instantiate_params, per_thread))
}

fn launch(exec: CUgraphExec, stream: CUstream, ptsz: bool, upload: bool) -> DriverResult {
    let client = client()?;
    let (exec, stream) = (id_of(exec)?, resolve_stream(client, stream, ptsz)?);
    let posted = if upload { client.post(req::GraphUpload { exec, stream }) } else { client.launch_graph(exec, stream) };
    posted.map_err(driver_error)
}

per_thread_twins! {
    cuGraphLaunch, cuGraphLaunch_ptsz (h_graph_exec: CUgraphExec, h_stream: CUstream)
        |per_thread| run(|| launch(h_graph_exec, h_stream, per_thread, false))
}

per_thread_twins! {
    cuGraphUpload, cuGraphUpload_ptsz (h_graph_exec: CUgraphExec, h_stream: CUstream)
        |per_thread| run(|| launch(h_graph_exec, h_stream, per_thread, true))
}

pub unsafe fn cuGraphExecDestroy(h_graph_exec: CUgraphExec) -> CUresult {
    run(|| {
        let client = client()?;
        let exec = id_of(h_graph_exec)?;
        client.graphs().forget_exec(exec);
        client.post(req::GraphExecDestroy { exec }).map_err(driver_error)?;
        // Launches in flight hold their own references (see `flyt_client::user_objects`).
        user_objects().owner_gone(exec);
        Ok(())
    })
}

/// Updates an executable graph; the outcome's result and node.
fn exec_update(exec: CUgraphExec, graph: CUgraph) -> DriverResult<(Result<(), CUresult>, CUgraphExecUpdateResult, CUgraphNode)> {
    let client = client()?;
    let exec = id_of(exec)?;
    let reply = client.call(req::GraphExecUpdate { exec, graph: id_of(graph)? }).map_err(driver_error)?;
    let node = if reply.error_node == 0 { std::ptr::null_mut() } else { node_handle(reply.error_node) };
    let result = match reply.error {
        None => {
            client.graphs().set_exec_host_nodes(exec, reply.host_nodes);
            // The new graph's user object references replace the executable graph's.
            user_objects().replace(exec, id_of(graph)?);
            Ok(())
        }
        Some(error) => Err(driver_error(error)),
    };
    Ok((result, reply.status as CUgraphExecUpdateResult, node))
}

pub unsafe fn cuGraphExecUpdate(
    h_graph_exec: CUgraphExec,
    h_graph: CUgraph,
    h_error_node_out: *mut CUgraphNode,
    update_result_out: *mut CUgraphExecUpdateResult,
) -> CUresult {
    run(|| {
        non_null([h_error_node_out.cast(), update_result_out.cast()])?;
        let (result, status, node) = exec_update(h_graph_exec, h_graph)?;
        // SAFETY: checked non-NULL.
        unsafe {
            write_out(update_result_out, status)?;
            write_out(h_error_node_out, node)?;
        }
        result
    })
}

pub unsafe fn cuGraphExecUpdate_v2(h_graph_exec: CUgraphExec, h_graph: CUgraph, result_info: *mut CUgraphExecUpdateResultInfo) -> CUresult {
    run(|| {
        non_null([result_info.cast()])?;
        let (result, status, node) = exec_update(h_graph_exec, h_graph)?;
        // SAFETY: checked non-NULL; the caller's struct.
        let info = unsafe { &mut *result_info };
        info.result = status;
        info.errorNode = node;
        info.errorFromNode = std::ptr::null_mut();
        result
    })
}

/// New parameters for a node, in its graph (`exec` NULL) or in an executable graph.
fn set_params(exec: CUgraphExec, node: CUgraphNode, params: NodeParams) -> DriverResult {
    let client = client()?;
    let exec = if exec.is_null() { 0 } else { id_of(exec)? };
    client.call(req::GraphNodeSetParams { exec, node: id_of(node)?, params }).map(drop).map_err(driver_error)
}

fn set_kernel(exec: CUgraphExec, node: CUgraphNode, fields: DriverResult<KernelFields>) -> DriverResult {
    // SAFETY: the fields come from the caller's struct, whose arrays it vouches for.
    let (params, record) = unsafe { kernel_params(fields?) }?;
    set_params(exec, node, params)?;
    if exec.is_null() {
        kernel_nodes().get_or_insert_with(HashMap::new).insert(id_of(node)?, record);
    }
    Ok(())
}

/// A kernel node's parameters as the app set them; `kernelParams` point at values kept here
/// until the node's parameters change or it is destroyed.
fn kernel_node_params(node: CUgraphNode) -> DriverResult<(CUDA_KERNEL_NODE_PARAMS_v1, Option<*mut c_void>)> {
    let client = client()?;
    let node = id_of(node)?;
    if client.graphs().node_kind(node).is_none_or(|kind| kind != flyt_protocol::ops::node_type::KERNEL) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let mut nodes = kernel_nodes();
    let record = nodes.as_mut().and_then(|nodes| nodes.get_mut(&node)).ok_or_else(|| {
        crate::diagnostics::once("kernel-node-params", "flyt: reading the parameters of a captured kernel node is not supported");
        CUresult::CUDA_ERROR_NOT_SUPPORTED
    })?;
    // The handle the app gave (a CUkernel in v2's `kern`, or a CUfunction), or the function's own.
    let handle: *mut c_void =
        if record.handle == 0 { function_handle(&record.function) } else { std::ptr::without_provenance_mut(record.handle) };
    let params = CUDA_KERNEL_NODE_PARAMS_v1 {
        func: handle.cast(),
        gridDimX: record.grid.x,
        gridDimY: record.grid.y,
        gridDimZ: record.grid.z,
        blockDimX: record.block.x,
        blockDimY: record.block.y,
        blockDimZ: record.block.z,
        sharedMemBytes: record.shared_mem,
        kernelParams: record.pointers.as_mut_ptr().cast(),
        extra: std::ptr::null_mut(),
    };
    Ok((params, record.in_kern.then_some(handle)))
}

pub unsafe fn cuGraphKernelNodeGetParams(h_node: CUgraphNode, node_params: *mut CUDA_KERNEL_NODE_PARAMS_v1) -> CUresult {
    run(|| {
        non_null([node_params.cast()])?;
        let (params, _) = kernel_node_params(h_node)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(node_params, params) }
    })
}

pub unsafe fn cuGraphKernelNodeGetParams_v2(h_node: CUgraphNode, node_params: *mut CUDA_KERNEL_NODE_PARAMS) -> CUresult {
    run(|| {
        non_null([node_params.cast()])?;
        let (p, kern) = kernel_node_params(h_node)?;
        let params = CUDA_KERNEL_NODE_PARAMS {
            func: p.func,
            gridDimX: p.gridDimX,
            gridDimY: p.gridDimY,
            gridDimZ: p.gridDimZ,
            blockDimX: p.blockDimX,
            blockDimY: p.blockDimY,
            blockDimZ: p.blockDimZ,
            sharedMemBytes: p.sharedMemBytes,
            kernelParams: p.kernelParams,
            extra: p.extra,
            kern: kern.map_or(std::ptr::null_mut(), <*mut c_void>::cast),
            ctx: std::ptr::null_mut(),
        };
        // SAFETY: checked non-NULL.
        unsafe { write_out(node_params, params) }
    })
}

pub unsafe fn cuGraphExecChildGraphNodeSetParams(h_graph_exec: CUgraphExec, h_node: CUgraphNode, child_graph: CUgraph) -> CUresult {
    run(|| {
        non_null([h_graph_exec.cast()])?;
        set_params(h_graph_exec, h_node, NodeParams::Child { graph: id_of(child_graph)? })
    })
}

pub unsafe fn cuGraphDebugDotPrint(h_graph: CUgraph, path: *const c_char, flags: c_uint) -> CUresult {
    run(|| {
        non_null([path.cast()])?;
        // SAFETY: checked non-NULL; the caller's NUL-terminated path.
        let path = unsafe { CStr::from_ptr(path) };
        let path = std::path::Path::new(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(path.to_bytes()));
        let text = client()?.call(req::GraphDotPrint { graph: id_of(h_graph)?, flags }).map_err(driver_error)?.text;
        std::fs::write(path, text).map_err(|_| CUresult::CUDA_ERROR_OPERATING_SYSTEM)
    })
}

fn host_function(stream: CUstream, function: HostFunction, ptsz: bool) -> DriverResult {
    let client = client()?;
    let stream = resolve_stream(client, stream, ptsz)?;
    client.launch_host_function(stream, function).map_err(driver_error)
}

per_thread_twins! {
    cuLaunchHostFunc, cuLaunchHostFunc_ptsz (h_stream: CUstream, fn_: CUhostFn, user_data: *mut c_void)
        |per_thread| {
            run(|| {
                let function = fn_.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
                host_function(h_stream, HostFunction::Plain { function, user_data: user_data as usize }, per_thread)
            })
        }
}

fn stream_callback(stream: CUstream, callback: CUstreamCallback, user_data: *mut c_void, flags: c_uint, ptsz: bool) -> DriverResult {
    let callback = callback.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if flags != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: `CUresult` is a transparent `u32`, so the two function types have one ABI.
    let function = unsafe {
        std::mem::transmute::<unsafe extern "C" fn(CUstream, CUresult, *mut c_void), unsafe extern "C" fn(*mut c_void, u32, *mut c_void)>(
            callback,
        )
    };
    host_function(stream, HostFunction::StreamCallback { function, stream: stream as usize, user_data: user_data as usize }, ptsz)
}

per_thread_twins! {
    cuStreamAddCallback, cuStreamAddCallback_ptsz
        (
            h_stream: CUstream,
            callback: CUstreamCallback,
            user_data: *mut c_void,
            flags: c_uint,
        )
        |per_thread| run(|| stream_callback(h_stream, callback, user_data, flags, per_thread))
}

// --- memory nodes, conditional nodes, generic node parameters and graph queries ---

/// `CU_MEM_ALLOCATION_TYPE_PINNED`, `CU_MEM_LOCATION_TYPE_DEVICE`.
const ALLOCATION_PINNED: c_uint = 1;
const LOCATION_DEVICE: c_uint = 1;

/// A memory allocation node as the app made it, for `cuGraphMemAllocNodeGetParams` (whose
/// `accessDescs` point here).
struct AllocNode {
    size: u64,
    ptr: u64,
    access: Box<[CUmemAccessDesc]>,
}

/// Per-node records the driver's getters answer from: memory nodes, conditional bodies, and
/// each executable graph's instantiation flags.
#[derive(Default)]
struct NodeRecords {
    allocs: HashMap<u64, AllocNode>,
    frees: HashMap<u64, u64>,
    /// A conditional node's body graphs, in the array the app's `phGraph_out` points to.
    bodies: HashMap<u64, Box<[CUgraph]>>,
    exec_flags: HashMap<u64, u64>,
    /// Copy, memset and host nodes' parameters as the app gave them.
    params: HashMap<u64, AppParams>,
    /// Batch memory operation nodes' operations in the driver's form: the array
    /// `cuGraphBatchMemOpNodeGetParams` hands out, valid until the node's parameters change.
    batch_ops: HashMap<u64, Box<[[u64; 6]]>>,
}

// SAFETY: the body arrays hold graph handles, which are ids, not pointers to memory; the app's
// parameters are plain values this library never dereferences.
unsafe impl Send for NodeRecords {}

static NODE_RECORDS: Mutex<Option<NodeRecords>> = Mutex::new(None);

fn with_records<T>(f: impl FnOnce(&mut NodeRecords) -> T) -> T {
    f(NODE_RECORDS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get_or_insert_with(NodeRecords::default))
}

/// Checks a memory allocation node's parameters: pinned memory on the session's device, and
/// access descriptors (if any) for that device.
///
/// # Safety
/// `params` is a readable `CUDA_MEM_ALLOC_NODE_PARAMS` whose `accessDescs` holds `accessDescCount` entries.
unsafe fn alloc_params(client: &Client, params: *const CUDA_MEM_ALLOC_NODE_PARAMS) -> DriverResult<(NodeParams, Box<[CUmemAccessDesc]>)> {
    non_null([params.cast()])?;
    // SAFETY: checked non-NULL; the caller's struct.
    let p = unsafe { &*params };
    let props = &p.poolProps;
    if props.allocType != ALLOCATION_PINNED || props.location.r#type != LOCATION_DEVICE || p.bytesize == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    if props.location.id < 0 || props.location.id as usize >= client.device_count() {
        return Err(CUresult::CUDA_ERROR_INVALID_DEVICE);
    }
    if props.handleTypes != 0 {
        crate::diagnostics::once("graph-memory-export", "flyt: graph memory with shareable handle types is not supported");
        return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    let access: Box<[CUmemAccessDesc]> = if p.accessDescCount == 0 {
        Box::new([])
    } else {
        non_null([p.accessDescs.cast()])?;
        // SAFETY: the caller's array of `accessDescCount` descriptors.
        unsafe { std::slice::from_raw_parts(p.accessDescs, p.accessDescCount) }.into()
    };
    // A session serves one device: access from other devices cannot be granted.
    if access.iter().any(|desc| desc.location.r#type != LOCATION_DEVICE || desc.location.id != props.location.id) {
        return Err(CUresult::CUDA_ERROR_INVALID_DEVICE);
    }
    let flags = access.last().map(|desc| desc.flags);
    Ok((NodeParams::MemAlloc { size: p.bytesize as u64, access: flags }, access))
}

/// What a node gives beyond its handle: the access a memory allocation node grants (kept for its
/// getter), and the app's fields for the driver's own outputs, NULL where there are none.
struct NodeOutputs {
    access: Box<[CUmemAccessDesc]>,
    /// A memory allocation node's address.
    alloc_out: *mut CUdeviceptr,
    /// A conditional node's bodies.
    bodies_out: *mut *mut CUgraph,
}

impl Default for NodeOutputs {
    fn default() -> Self {
        NodeOutputs { access: Box::new([]), alloc_out: std::ptr::null_mut(), bodies_out: std::ptr::null_mut() }
    }
}

/// Adds a node with the driver's own outputs (see [`NodeOutputs`]).
///
/// # Safety
/// As `add_node`; the output fields are NULL or the app's.
unsafe fn add_node_with_outputs(
    out: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    count: usize,
    params: NodeParams,
    NodeOutputs { access, alloc_out, bodies_out }: NodeOutputs,
) -> DriverResult<u64> {
    let client = client()?;
    let (size, bodies) = match &params {
        NodeParams::MemAlloc { size, .. } => (*size, Vec::new()),
        NodeParams::Conditional { bodies, .. } => (0, bodies.clone()),
        _ => (0, Vec::new()),
    };
    let free = if let NodeParams::MemFree { ptr } = params { Some(ptr) } else { None };
    // SAFETY: forwarded contract.
    let (node, ptr) = unsafe { add_node(client, out, graph, dependencies, count, params) }?;
    if size > 0 {
        // Graph memory: kernels and copies may name it while its graph lives.
        client.add_device_range(ptr, size, false);
        client.graphs().note_memory(ptr);
        with_records(|records| records.allocs.insert(node, AllocNode { size, ptr, access }));
        if !alloc_out.is_null() {
            // SAFETY: the app's `dptr` field.
            unsafe { alloc_out.write(ptr) };
        }
    }
    if let Some(ptr) = free {
        with_records(|records| records.frees.insert(node, ptr));
    }
    if !bodies.is_empty() {
        let mut handles: Box<[CUgraph]> = bodies.iter().map(|id| graph_handle(*id)).collect();
        if !bodies_out.is_null() {
            // SAFETY: the app's `phGraph_out` field; the array lives as long as the records.
            unsafe { bodies_out.write(handles.as_mut_ptr()) };
        }
        with_records(|records| records.bodies.insert(node, handles));
    }
    Ok(node)
}

pub unsafe fn cuGraphAddMemAllocNode(
    ph_graph_node: *mut CUgraphNode,
    h_graph: CUgraph,
    dependencies: *const CUgraphNode,
    num_dependencies: usize,
    node_params: *mut CUDA_MEM_ALLOC_NODE_PARAMS,
) -> CUresult {
    run(|| {
        // SAFETY: the caller's struct (checked non-NULL inside).
        let (params, access) = unsafe { alloc_params(client()?, node_params) }?;
        // SAFETY: checked non-NULL above; the app's `dptr` field.
        let outputs = NodeOutputs { access, alloc_out: unsafe { &raw mut (*node_params).dptr }, ..NodeOutputs::default() };
        // SAFETY: forwarded contract.
        unsafe { add_node_with_outputs(ph_graph_node, h_graph, dependencies, num_dependencies, params, outputs) }.map(drop)
    })
}

pub unsafe fn cuGraphAddMemFreeNode(
    ph_graph_node: *mut CUgraphNode,
    h_graph: CUgraph,
    dependencies: *const CUgraphNode,
    num_dependencies: usize,
    dptr: CUdeviceptr,
) -> CUresult {
    run(|| {
        let (params, outputs) = (NodeParams::MemFree { ptr: dptr }, NodeOutputs::default());
        // SAFETY: forwarded contract.
        unsafe { add_node_with_outputs(ph_graph_node, h_graph, dependencies, num_dependencies, params, outputs) }.map(drop)
    })
}

pub unsafe fn cuGraphMemAllocNodeGetParams(h_node: CUgraphNode, params_out: *mut CUDA_MEM_ALLOC_NODE_PARAMS) -> CUresult {
    run(|| {
        non_null([params_out.cast()])?;
        let node = id_of(h_node)?;
        with_records(|records| {
            let record = records.allocs.get(&node).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
            // SAFETY: checked non-NULL; every field is written (an all-zero pool props is valid).
            unsafe {
                let mut params: CUDA_MEM_ALLOC_NODE_PARAMS = std::mem::zeroed();
                params.poolProps.allocType = ALLOCATION_PINNED;
                params.poolProps.location = CUmemLocation { r#type: LOCATION_DEVICE, id: 0 };
                params.accessDescs = if record.access.is_empty() { std::ptr::null() } else { record.access.as_ptr() };
                params.accessDescCount = record.access.len();
                params.bytesize = record.size as usize;
                params.dptr = record.ptr;
                params_out.write(params);
            }
            Ok(())
        })
    })
}

/// Writes what the records keep for a handle (`table`: which of them) to the caller's `out`;
/// CUDA_ERROR_INVALID_VALUE for a handle they do not keep.
///
/// # Safety
/// `out` is NULL or the caller's out-pointer.
unsafe fn write_recorded<T>(out: *mut u64, handle: *mut T, table: fn(&NodeRecords) -> &HashMap<u64, u64>) -> CUresult {
    run(|| {
        non_null([out.cast()])?;
        let id = id_of(handle)?;
        let value = with_records(|records| table(records).get(&id).copied()).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(out, value) }
    })
}

pub unsafe fn cuGraphMemFreeNodeGetParams(h_node: CUgraphNode, dptr_out: *mut CUdeviceptr) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { write_recorded(dptr_out, h_node, |records| &records.frees) }
}

/// The session's device, or `CUDA_ERROR_INVALID_DEVICE`.
fn session_device(device: CUdevice) -> DriverResult<&'static Client> {
    let client = client()?;
    if device < 0 || device as usize >= client.device_count() {
        return Err(CUresult::CUDA_ERROR_INVALID_DEVICE);
    }
    Ok(client)
}

pub unsafe fn cuDeviceGraphMemTrim(device: CUdevice) -> CUresult {
    run(|| session_device(device)?.call(req::GraphMemTrim {}).map(drop).map_err(driver_error))
}

pub unsafe fn cuDeviceGetGraphMemAttribute(device: CUdevice, attr: CUgraphMem_attribute, value: *mut c_void) -> CUresult {
    run(|| {
        non_null([value.cast()])?;
        let reply = session_device(device)?.call(req::GraphMemAttribute { attribute: attr, set: None }).map_err(driver_error)?;
        // SAFETY: checked non-NULL; every graph memory attribute is a 64-bit value.
        unsafe { write_out(value.cast::<u64>(), reply.value) }
    })
}

pub unsafe fn cuDeviceSetGraphMemAttribute(device: CUdevice, attr: CUgraphMem_attribute, value: *mut c_void) -> CUresult {
    run(|| {
        non_null([value.cast()])?;
        // SAFETY: checked non-NULL; a 64-bit value, as every graph memory attribute is.
        let set = unsafe { value.cast::<u64>().read_unaligned() };
        session_device(device)?.call(req::GraphMemAttribute { attribute: attr, set: Some(set) }).map(drop).map_err(driver_error)
    })
}

pub unsafe fn cuGraphConditionalHandleCreate(
    p_handle_out: *mut CUgraphConditionalHandle,
    h_graph: CUgraph,
    _ctx: CUcontext,
    default_launch_value: c_uint,
    flags: c_uint,
) -> CUresult {
    run(|| {
        non_null([p_handle_out.cast()])?;
        let request = req::GraphConditionalHandle { graph: id_of(h_graph)?, default_value: default_launch_value, flags };
        let handle = client()?.call(request).map_err(driver_error)?.handle;
        // SAFETY: checked non-NULL.
        unsafe { write_out(p_handle_out, handle) }
    })
}

/// `CUgraphNodeParams`: the node type, a union of 29 8-byte words whose members this file reads
/// through casts, and a reserved word (256 bytes in all).
#[repr(C)]
struct GenericNodeParams {
    kind: c_uint,
    _reserved0: [c_int; 3],
    union: [u64; 29],
    _reserved2: i64,
}

/// The union member of a `CUgraphNodeParams` as `T`.
///
/// # Safety
/// `params` is a readable `CUgraphNodeParams` whose type says the member is a `T`.
unsafe fn member<T>(params: *mut CUgraphNodeParams) -> *mut T {
    // SAFETY: the union starts 16 bytes in, 8-byte aligned, per the caller's contract.
    unsafe { (&raw mut (*params.cast::<GenericNodeParams>()).union).cast::<T>() }
}

/// What a generic `CUgraphNodeParams` asks for, as the specific entry points take it.
enum Generic {
    Params(NodeParams, Box<[CUmemAccessDesc]>),
    Kernel(*const CUDA_KERNEL_NODE_PARAMS),
}

/// Reads a generic node's parameters.
///
/// # Safety
/// `params` is a readable `CUgraphNodeParams` (the member its type names is valid).
unsafe fn generic_params(client: &Client, params: *mut CUgraphNodeParams) -> DriverResult<Generic> {
    non_null([params.cast()])?;
    // SAFETY: checked non-NULL; each arm reads the member its type names.
    unsafe {
        let kind = (*params.cast::<GenericNodeParams>()).kind;
        Ok(match kind {
            node_type::KERNEL => Generic::Kernel(member::<CUDA_KERNEL_NODE_PARAMS>(params)),
            node_type::MEMCPY => {
                Generic::Params(memcpy_params(client, &raw const (*member::<CUDA_MEMCPY_NODE_PARAMS>(params)).copyParams)?, Box::new([]))
            }
            node_type::MEMSET => Generic::Params(memset_params(member::<CUDA_MEMSET_NODE_PARAMS>(params))?, Box::new([])),
            node_type::HOST => Generic::Params(host_params(client, member::<CUDA_HOST_NODE_PARAMS>(params))?, Box::new([])),
            node_type::GRAPH => {
                let child = &*member::<CUDA_CHILD_GRAPH_NODE_PARAMS>(params);
                // CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE only: a moved graph would change hands.
                if child.ownership != 0 {
                    crate::diagnostics::once(
                        "graph-child-move",
                        "flyt: child graph nodes that take ownership of their graph are not supported",
                    );
                    return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
                }
                Generic::Params(NodeParams::Child { graph: id_of(child.graph)? }, Box::new([]))
            }
            node_type::EMPTY => Generic::Params(NodeParams::Empty, Box::new([])),
            node_type::WAIT_EVENT => Generic::Params(event_params(client, *member::<CUevent>(params), false)?, Box::new([])),
            node_type::EVENT_RECORD => Generic::Params(event_params(client, *member::<CUevent>(params), true)?, Box::new([])),
            node_type::MEM_ALLOC => {
                let (params, access) = alloc_params(client, member::<CUDA_MEM_ALLOC_NODE_PARAMS>(params))?;
                Generic::Params(params, access)
            }
            node_type::MEM_FREE => Generic::Params(NodeParams::MemFree { ptr: *member::<CUdeviceptr>(params) }, Box::new([])),
            node_type::CONDITIONAL => {
                let conditional = &*member::<CUDA_CONDITIONAL_NODE_PARAMS>(params);
                let bodies = (0..conditional.size.min(1024)).map(|_| client.graphs().new_id()).collect();
                let params =
                    NodeParams::Conditional { handle: conditional.handle, kind: conditional.r#type, size: conditional.size, bodies };
                Generic::Params(params, Box::new([]))
            }
            node_type::BATCH_MEM_OP => {
                let batch = member::<CUDA_BATCH_MEM_OP_NODE_PARAMS_v2>(params).cast::<CUDA_BATCH_MEM_OP_NODE_PARAMS>();
                Generic::Params(batch_node_params("cuGraphAddNode", batch)?, Box::new([]))
            }
            _ => {
                crate::diagnostics::once("graph-node-type", "flyt: graph nodes for external semaphores are not supported");
                return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
            }
        })
    }
}

/// `cuGraphAddNode` and `_v2`: edge data, if given, must be the default.
///
/// # Safety
/// The caller's pointers, as the driver documents them.
unsafe fn add_generic(
    out: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    edge_data: *const CUgraphEdgeData,
    count: usize,
    params: *mut CUgraphNodeParams,
) -> DriverResult {
    // SAFETY: forwarded contract.
    let kinds = unsafe { edge_kinds(edge_data, count) };
    if kinds.is_empty() {
        // SAFETY: forwarded contract.
        return unsafe { add_generic_node(out, graph, dependencies, count, params) };
    }
    // Edges with data: the node first, then its dependencies with their data, as
    // `cuGraphAddDependencies_v2` adds them; a refused edge takes the new node back out.
    // SAFETY: forwarded contract (no dependencies: none read).
    unsafe { add_generic_node(out, graph, std::ptr::null(), 0, params) }?;
    // SAFETY: `out` was written by the call above.
    let node = unsafe { *out };
    let client = client()?;
    // SAFETY: forwarded contract.
    let from = unsafe { node_ids(dependencies, count) }?;
    let request = req::GraphEdges { graph: id_of(graph)?, from, to: vec![id_of(node)?; count], data: kinds, remove: false };
    add_edges(client, request).inspect_err(|_| {
        if let Ok(node) = id_of(node) {
            let _ = client.call(req::GraphDestroyNode { node });
        }
    })
}

/// `add_generic` without edge data.
///
/// # Safety
/// As `add_generic`'s.
unsafe fn add_generic_node(
    out: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    count: usize,
    params: *mut CUgraphNodeParams,
) -> DriverResult {
    let client = client()?;
    // SAFETY: forwarded contract.
    match unsafe { generic_params(client, params) }? {
        // SAFETY: forwarded contract; the member is the v3 layout, whose prefix is v2's.
        Generic::Kernel(kernel) => unsafe { add_kernel_node(out, graph, dependencies, count, fields_v2(kernel)) },
        Generic::Params(node, access) => {
            let (alloc_out, bodies_out) = match node {
                // SAFETY: the member the type names: the app's `dptr` field.
                NodeParams::MemAlloc { .. } => unsafe {
                    (&raw mut (*member::<CUDA_MEM_ALLOC_NODE_PARAMS>(params)).dptr, std::ptr::null_mut())
                },
                // SAFETY: the member the type names: the app's `phGraph_out` field.
                NodeParams::Conditional { .. } => unsafe {
                    (std::ptr::null_mut(), &raw mut (*member::<CUDA_CONDITIONAL_NODE_PARAMS>(params)).phGraph_out)
                },
                _ => (std::ptr::null_mut(), std::ptr::null_mut()),
            };
            let words = batch_words(&node);
            // SAFETY: forwarded contract.
            let node =
                unsafe { add_node_with_outputs(out, graph, dependencies, count, node, NodeOutputs { access, alloc_out, bodies_out }) }?;
            // SAFETY: the caller's struct, read as its type says.
            if let Some(app) = unsafe { generic_app_params(params) } {
                remember(node, app);
            }
            remember_batch(node, words);
            Ok(())
        }
    }
}

pub unsafe fn cuGraphAddNode(
    ph_graph_node: *mut CUgraphNode,
    h_graph: CUgraph,
    dependencies: *const CUgraphNode,
    num_dependencies: usize,
    node_params: *mut CUgraphNodeParams,
) -> CUresult {
    // SAFETY: forwarded contract.
    run(|| unsafe { add_generic(ph_graph_node, h_graph, dependencies, std::ptr::null(), num_dependencies, node_params) })
}

pub unsafe fn cuGraphAddNode_v2(
    ph_graph_node: *mut CUgraphNode,
    h_graph: CUgraph,
    dependencies: *const CUgraphNode,
    dependency_data: *const CUgraphEdgeData,
    num_dependencies: usize,
    node_params: *mut CUgraphNodeParams,
) -> CUresult {
    // SAFETY: forwarded contract.
    run(|| unsafe { add_generic(ph_graph_node, h_graph, dependencies, dependency_data, num_dependencies, node_params) })
}

/// `cuGraphNodeSetParams` (`exec` NULL) and `cuGraphExecNodeSetParams`.
///
/// # Safety
/// `params` is a readable `CUgraphNodeParams`.
unsafe fn set_generic(exec: CUgraphExec, node: CUgraphNode, params: *mut CUgraphNodeParams) -> DriverResult {
    let client = client()?;
    // SAFETY: forwarded contract.
    match unsafe { generic_params(client, params) }? {
        // SAFETY: as in `add_generic`.
        Generic::Kernel(kernel) => set_kernel(exec, node, unsafe { fields_v2(kernel) }),
        // Memory and conditional nodes take no new parameters.
        Generic::Params(NodeParams::MemAlloc { .. } | NodeParams::MemFree { .. } | NodeParams::Conditional { .. }, _) => {
            Err(CUresult::CUDA_ERROR_INVALID_VALUE)
        }
        // A child graph node's graph changes through the graph it returns.
        Generic::Params(NodeParams::Child { .. }, _) if exec.is_null() => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        Generic::Params(node_params, _) => {
            let words = batch_words(&node_params);
            set_params(exec, node, node_params)?;
            if exec.is_null() {
                // SAFETY: the caller's struct, read as its type says.
                if let Some(app) = unsafe { generic_app_params(params) } {
                    remember(id_of(node)?, app);
                }
                remember_batch(id_of(node)?, words);
            }
            Ok(())
        }
    }
}

pub unsafe fn cuGraphNodeSetParams(h_node: CUgraphNode, node_params: *mut CUgraphNodeParams) -> CUresult {
    // SAFETY: forwarded contract.
    run(|| unsafe { set_generic(std::ptr::null_mut(), h_node, node_params) })
}

pub unsafe fn cuGraphExecNodeSetParams(h_graph_exec: CUgraphExec, h_node: CUgraphNode, node_params: *mut CUgraphNodeParams) -> CUresult {
    run(|| {
        non_null([h_graph_exec.cast()])?;
        // SAFETY: forwarded contract.
        unsafe { set_generic(h_graph_exec, h_node, node_params) }
    })
}

/// Writes edges as the driver does: with `nodes` NULL the count alone, else up to `*count`
/// entries (NULL after the last) and the number written. `edge_data` NULL means the caller
/// takes no edge data, which is refused (`CUDA_ERROR_LOSSY_QUERY`) if any edge has some.
///
/// # Safety
/// `count` is the caller's in/out count; the arrays, when not NULL, have room for `*count`.
unsafe fn write_edges(
    edges: &[flyt_protocol::ops::GraphEdge],
    from: *mut CUgraphNode,
    to: *mut CUgraphNode,
    edge_data: *mut CUgraphEdgeData,
    count: *mut usize,
) -> DriverResult {
    non_null([count.cast()])?;
    if edge_data.is_null() && edges.iter().any(|edge| edge.from_port != 0 || edge.to_port != 0 || edge.kind != 0) {
        return Err(CUresult::CUDA_ERROR_LOSSY_QUERY);
    }
    // SAFETY: the caller's contract (see above).
    unsafe {
        if from.is_null() && to.is_null() {
            return write_out(count, edges.len());
        }
        let room = count.read();
        for index in 0..room {
            let edge = edges.get(index);
            if !from.is_null() {
                from.add(index).write(edge.map_or(std::ptr::null_mut(), |edge| node_handle(edge.from)));
            }
            if !to.is_null() {
                to.add(index).write(edge.map_or(std::ptr::null_mut(), |edge| node_handle(edge.to)));
            }
            if !edge_data.is_null() {
                let (from_port, to_port, kind) = edge.map_or((0, 0, 0), |edge| (edge.from_port, edge.to_port, edge.kind));
                edge_data.add(index).write(CUgraphEdgeData { from_port, to_port, r#type: kind, reserved: [0; 5] });
            }
        }
        write_out(count, edges.len().min(room))
    }
}

fn node_links(
    node: CUgraphNode,
    nodes: *mut CUgraphNode,
    edge_data: *mut CUgraphEdgeData,
    count: *mut usize,
    dependents: bool,
) -> DriverResult {
    let node = id_of(node)?;
    let links = client()?.call(req::GraphNodeLinks { node, dependents }).map_err(driver_error)?.links;
    // SAFETY: the caller's arrays and count, as the driver documents them.
    unsafe { write_edges(&links, nodes, std::ptr::null_mut(), edge_data, count) }
}

pub unsafe fn cuGraphNodeGetDependencies(h_node: CUgraphNode, dependencies: *mut CUgraphNode, num_dependencies: *mut usize) -> CUresult {
    run(|| node_links(h_node, dependencies, std::ptr::null_mut(), num_dependencies, false))
}

pub unsafe fn cuGraphNodeGetDependencies_v2(
    h_node: CUgraphNode,
    dependencies: *mut CUgraphNode,
    edge_data: *mut CUgraphEdgeData,
    num_dependencies: *mut usize,
) -> CUresult {
    run(|| node_links(h_node, dependencies, edge_data, num_dependencies, false))
}

pub unsafe fn cuGraphNodeGetDependentNodes(
    h_node: CUgraphNode,
    dependent_nodes: *mut CUgraphNode,
    num_dependent_nodes: *mut usize,
) -> CUresult {
    run(|| node_links(h_node, dependent_nodes, std::ptr::null_mut(), num_dependent_nodes, true))
}

pub unsafe fn cuGraphNodeGetDependentNodes_v2(
    h_node: CUgraphNode,
    dependent_nodes: *mut CUgraphNode,
    edge_data: *mut CUgraphEdgeData,
    num_dependent_nodes: *mut usize,
) -> CUresult {
    run(|| node_links(h_node, dependent_nodes, edge_data, num_dependent_nodes, true))
}

fn graph_edges(
    graph: CUgraph,
    from: *mut CUgraphNode,
    to: *mut CUgraphNode,
    edge_data: *mut CUgraphEdgeData,
    count: *mut usize,
) -> DriverResult {
    // Both arrays or neither, as the driver requires.
    if from.is_null() != to.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let edges = client()?.call(req::GraphGetEdges { graph: id_of(graph)? }).map_err(driver_error)?.edges;
    // SAFETY: the caller's arrays and count, as the driver documents them.
    unsafe { write_edges(&edges, from, to, edge_data, count) }
}

pub unsafe fn cuGraphGetEdges(h_graph: CUgraph, from: *mut CUgraphNode, to: *mut CUgraphNode, num_edges: *mut usize) -> CUresult {
    run(|| graph_edges(h_graph, from, to, std::ptr::null_mut(), num_edges))
}

pub unsafe fn cuGraphGetEdges_v2(
    h_graph: CUgraph,
    from: *mut CUgraphNode,
    to: *mut CUgraphNode,
    edge_data: *mut CUgraphEdgeData,
    num_edges: *mut usize,
) -> CUresult {
    run(|| graph_edges(h_graph, from, to, edge_data, num_edges))
}

fn node_enabled(exec: CUgraphExec, node: CUgraphNode, set: Option<bool>) -> DriverResult<bool> {
    let request = req::GraphNodeEnabled { exec: id_of(exec)?, node: id_of(node)?, set };
    client()?.call(request).map(|reply| reply.enabled).map_err(driver_error)
}

pub unsafe fn cuGraphNodeSetEnabled(h_graph_exec: CUgraphExec, h_node: CUgraphNode, is_enabled: c_uint) -> CUresult {
    run(|| node_enabled(h_graph_exec, h_node, Some(is_enabled != 0)).map(drop))
}

pub unsafe fn cuGraphNodeGetEnabled(h_graph_exec: CUgraphExec, h_node: CUgraphNode, is_enabled: *mut c_uint) -> CUresult {
    run(|| {
        non_null([is_enabled.cast()])?;
        let enabled = node_enabled(h_graph_exec, h_node, None)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(is_enabled, c_uint::from(enabled)) }
    })
}

pub unsafe fn cuGraphExecGetFlags(h_graph_exec: CUgraphExec, flags: *mut cuuint64_t) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { write_recorded(flags, h_graph_exec, |records| &records.exec_flags) }
}

/// The object an event or child graph node names, as the server tells it.
fn node_object(node: CUgraphNode) -> DriverResult<u64> {
    client()?.call(req::GraphNodeObject { node: id_of(node)? }).map(|reply| reply.object).map_err(driver_error)
}

fn node_event(node: CUgraphNode, event_out: *mut CUevent, record: bool) -> DriverResult {
    non_null([event_out.cast()])?;
    let wanted = if record { node_type::EVENT_RECORD } else { node_type::WAIT_EVENT };
    let client = client()?;
    if client.graphs().node_kind(id_of(node)?).is_some_and(|kind| kind != wanted) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let event = node_object(node)?;
    // SAFETY: checked non-NULL; the app's event handles are the session's event ids.
    unsafe { write_out(event_out, std::ptr::without_provenance_mut(event as usize)) }
}

pub unsafe fn cuGraphEventRecordNodeGetEvent(h_node: CUgraphNode, event_out: *mut CUevent) -> CUresult {
    run(|| node_event(h_node, event_out, true))
}

pub unsafe fn cuGraphEventWaitNodeGetEvent(h_node: CUgraphNode, event_out: *mut CUevent) -> CUresult {
    run(|| node_event(h_node, event_out, false))
}

pub unsafe fn cuGraphChildGraphNodeGetGraph(h_node: CUgraphNode, ph_graph: *mut CUgraph) -> CUresult {
    run(|| {
        non_null([ph_graph.cast()])?;
        let graph = node_object(h_node)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(ph_graph, graph_handle(graph)) }
    })
}

// --- node parameter getters, kernel node attributes, user objects ---

/// A copy, memset or host node's parameters as the app gave them: the getters answer these
/// (the server's driver holds them as Flyt rewrote them, offsets folded into addresses).
#[derive(Clone, Copy)]
enum AppParams {
    Copy(CUDA_MEMCPY3D),
    Memset(CUDA_MEMSET_NODE_PARAMS),
    Host(CUDA_HOST_NODE_PARAMS),
}

fn remember(node: u64, params: AppParams) {
    with_records(|records| records.params.insert(node, params));
}

/// The app's parameters of a generic copy, memset or host node.
///
/// # Safety
/// `params` is a readable `CUgraphNodeParams` (the member its type names is valid).
unsafe fn generic_app_params(params: *mut CUgraphNodeParams) -> Option<AppParams> {
    // SAFETY: the caller's struct; each arm reads the member its type names.
    unsafe {
        Some(match (*params.cast::<GenericNodeParams>()).kind {
            node_type::MEMCPY => AppParams::Copy((*member::<CUDA_MEMCPY_NODE_PARAMS>(params)).copyParams),
            node_type::MEMSET => AppParams::Memset(*member::<CUDA_MEMSET_NODE_PARAMS>(params)),
            node_type::HOST => AppParams::Host(*member::<CUDA_HOST_NODE_PARAMS>(params)),
            _ => return None,
        })
    }
}

/// `CU_MEMORYTYPE_HOST`.
const MEMORY_HOST: c_uint = 1;

/// A copy node's parameters as the server's driver holds them, as a `CUDA_MEMCPY3D`.
fn copy_from_server(copy: &NodeCopy) -> CUDA_MEMCPY3D {
    // SAFETY: an all-zero `CUDA_MEMCPY3D` (integers and NULL pointers) is valid.
    let mut params: CUDA_MEMCPY3D = unsafe { std::mem::zeroed() };
    let (src, dst) = (&copy.src, &copy.dst);
    (params.srcXInBytes, params.srcY, params.srcZ) = (src.pos.x as usize, src.pos.y as usize, src.pos.z as usize);
    (params.srcMemoryType, params.srcPitch, params.srcHeight) = (src.memory_type, src.pitch as usize, src.height as usize);
    if src.memory_type == MEMORY_HOST {
        params.srcHost = std::ptr::with_exposed_provenance(src.ptr as usize);
    } else {
        params.srcDevice = src.ptr;
    }
    (params.dstXInBytes, params.dstY, params.dstZ) = (dst.pos.x as usize, dst.pos.y as usize, dst.pos.z as usize);
    (params.dstMemoryType, params.dstPitch, params.dstHeight) = (dst.memory_type, dst.pitch as usize, dst.height as usize);
    if dst.memory_type == MEMORY_HOST {
        params.dstHost = std::ptr::with_exposed_provenance_mut(dst.ptr as usize);
    } else {
        params.dstDevice = dst.ptr;
    }
    (params.WidthInBytes, params.Height, params.Depth) = (copy.width as usize, copy.height as usize, copy.depth as usize);
    params
}

/// A copy, memset or host node's parameters of the `kind` asked: as the app gave them, or, for
/// a node the app did not make (captured, or named by the server), as the server's driver holds
/// them, with the host function translated back to the app's.
fn node_params(node: CUgraphNode, kind: u32) -> DriverResult<AppParams> {
    let client = client()?;
    let node = id_of(node)?;
    let params = match with_records(|records| records.params.get(&node).copied()) {
        Some(params) => params,
        None => match client.call(req::GraphNodeGetParams { node }).map_err(driver_error)?.params {
            NodeReadback::Memcpy(copy) => AppParams::Copy(copy_from_server(&copy)),
            NodeReadback::Memset(set) => AppParams::Memset(CUDA_MEMSET_NODE_PARAMS {
                dst: set.dst,
                pitch: set.pitch as usize,
                value: set.value,
                elementSize: c_uint::from(set.element_size),
                width: set.width as usize,
                height: set.height as usize,
            }),
            NodeReadback::Host { call } => match client.graphs().host_function(call) {
                Some(HostFunction::Plain { function, user_data }) => AppParams::Host(CUDA_HOST_NODE_PARAMS {
                    r#fn: Some(function),
                    userData: std::ptr::with_exposed_provenance_mut(user_data),
                }),
                Some(HostFunction::StreamCallback { .. }) => {
                    crate::diagnostics::once(
                        "host-node-callback",
                        "flyt: the parameters of a host node captured from cuStreamAddCallback cannot be read back",
                    );
                    return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
                }
                None => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
            },
            NodeReadback::BatchMemOp { .. } => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        },
    };
    let matches = match params {
        AppParams::Copy(_) => kind == node_type::MEMCPY,
        AppParams::Memset(_) => kind == node_type::MEMSET,
        AppParams::Host(_) => kind == node_type::HOST,
    };
    if matches { Ok(params) } else { Err(CUresult::CUDA_ERROR_INVALID_VALUE) }
}

pub unsafe fn cuGraphMemcpyNodeGetParams(h_node: CUgraphNode, node_params: *mut CUDA_MEMCPY3D) -> CUresult {
    run(|| {
        non_null([node_params.cast()])?;
        let AppParams::Copy(params) = self::node_params(h_node, node_type::MEMCPY)? else { return Err(CUresult::CUDA_ERROR_INVALID_VALUE) };
        // SAFETY: checked non-NULL.
        unsafe { write_out(node_params, params) }
    })
}

pub unsafe fn cuGraphMemsetNodeGetParams(h_node: CUgraphNode, node_params: *mut CUDA_MEMSET_NODE_PARAMS) -> CUresult {
    run(|| {
        non_null([node_params.cast()])?;
        let AppParams::Memset(params) = self::node_params(h_node, node_type::MEMSET)? else {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        // SAFETY: checked non-NULL.
        unsafe { write_out(node_params, params) }
    })
}

pub unsafe fn cuGraphHostNodeGetParams(h_node: CUgraphNode, node_params: *mut CUDA_HOST_NODE_PARAMS) -> CUresult {
    run(|| {
        non_null([node_params.cast()])?;
        let AppParams::Host(params) = self::node_params(h_node, node_type::HOST)? else { return Err(CUresult::CUDA_ERROR_INVALID_VALUE) };
        // SAFETY: checked non-NULL.
        unsafe { write_out(node_params, params) }
    })
}

/// A kernel node attribute after setting it to `set`, if given: the server's driver holds them.
/// Attributes that carry events are refused (the server's driver cannot take this process's
/// events); an access policy window must cover the session's own memory.
fn kernel_node_attribute(node: CUgraphNode, attribute: CUkernelNodeAttrID, set: Option<[u8; 64]>) -> DriverResult<[u8; 64]> {
    use flyt_protocol::ops::kernel_node_attribute::{COOPERATIVE, LAUNCH_COMPLETION_EVENT, PROGRAMMATIC_EVENT};
    if attribute == PROGRAMMATIC_EVENT || attribute == LAUNCH_COMPLETION_EVENT {
        crate::diagnostics::once("kernel-node-event-attribute", "flyt: kernel node attributes that carry events are not supported");
        return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    // The server's kernel nodes take their arguments packed (`CU_LAUNCH_PARAM_BUFFER_POINTER`),
    // and its driver refuses to make such a node cooperative (measured on an H100, driver 580):
    // refused here with one line rather than as the driver's bare INVALID_VALUE.
    if set.is_some() && attribute == COOPERATIVE {
        crate::diagnostics::once(
            "kernel-node-cooperative",
            "flyt: cuGraphKernelNodeSetAttribute(CU_LAUNCH_ATTRIBUTE_COOPERATIVE) is not supported through Flyt (returning CUDA_ERROR_NOT_SUPPORTED)",
        );
        return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    let request = req::GraphKernelNodeAttribute { node: id_of(node)?, attribute, set: set.map(|value| value.to_vec()) };
    let reply = client()?.call(request).map_err(driver_error)?;
    reply.value.try_into().map_err(|_| CUresult::CUDA_ERROR_UNKNOWN)
}

pub unsafe fn cuGraphKernelNodeGetAttribute(
    h_node: CUgraphNode,
    attr: CUkernelNodeAttrID,
    value_out: *mut CUkernelNodeAttrValue,
) -> CUresult {
    run(|| {
        non_null([value_out.cast()])?;
        let bytes = kernel_node_attribute(h_node, attr, None)?;
        // SAFETY: checked non-NULL; the caller's 64-byte `CUkernelNodeAttrValue`.
        unsafe { write_out(value_out.cast::<[u8; 64]>(), bytes) }
    })
}

pub unsafe fn cuGraphKernelNodeSetAttribute(
    h_node: CUgraphNode,
    attr: CUkernelNodeAttrID,
    value: *const CUkernelNodeAttrValue,
) -> CUresult {
    run(|| {
        non_null([value.cast()])?;
        // SAFETY: checked non-NULL; a `CUkernelNodeAttrValue` is 64 bytes the caller owns.
        let bytes = unsafe { value.cast::<[u8; 64]>().read_unaligned() };
        kernel_node_attribute(h_node, attr, Some(bytes)).map(drop)
    })
}

pub unsafe fn cuGraphKernelNodeCopyAttributes(dst: CUgraphNode, src: CUgraphNode) -> CUresult {
    run(|| client()?.call(req::GraphKernelNodeCopyAttributes { dst: id_of(dst)?, src: id_of(src)? }).map(drop).map_err(driver_error))
}

/// `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`, the one flag (required) of `cuUserObjectCreate`.
const USER_OBJECT_NO_DESTRUCTOR_SYNC: c_uint = 1;
/// `CU_GRAPH_USER_OBJECT_MOVE`.
const GRAPH_USER_OBJECT_MOVE: c_uint = 1;

pub unsafe fn cuUserObjectCreate(
    object_out: *mut CUuserObject,
    ptr: *mut c_void,
    destroy: CUhostFn,
    initial_refcount: c_uint,
    flags: c_uint,
) -> CUresult {
    run(|| {
        crate::driver::driver().alive()?;
        non_null([object_out.cast()])?;
        let destroy = destroy.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        if flags != USER_OBJECT_NO_DESTRUCTOR_SYNC {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let object = user_objects().create(ptr.expose_provenance(), destroy, initial_refcount).map_err(driver_error)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(object_out, graph_handle(object)) }
    })
}

pub unsafe fn cuUserObjectRetain(object: CUuserObject, count: c_uint) -> CUresult {
    run(|| user_objects().retain(id_of(object)?, count).map_err(driver_error))
}

pub unsafe fn cuUserObjectRelease(object: CUuserObject, count: c_uint) -> CUresult {
    run(|| user_objects().release(id_of(object)?, count).map_err(driver_error))
}

pub unsafe fn cuGraphRetainUserObject(graph: CUgraph, object: CUuserObject, count: c_uint, flags: c_uint) -> CUresult {
    run(|| {
        if flags & !GRAPH_USER_OBJECT_MOVE != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let moved = flags & GRAPH_USER_OBJECT_MOVE != 0;
        user_objects().owner_retain(id_of(graph)?, id_of(object)?, count, moved).map_err(driver_error)
    })
}

pub unsafe fn cuGraphReleaseUserObject(graph: CUgraph, object: CUuserObject, count: c_uint) -> CUresult {
    run(|| user_objects().owner_release(id_of(graph)?, id_of(object)?, count).map_err(driver_error))
}
