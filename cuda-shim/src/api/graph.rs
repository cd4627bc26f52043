//! CUDA graphs and host functions. Graphs, nodes and executable graphs are the session's ids
//! (the app's handles are those ids as pointers), built and run by the server's driver; a graph
//! launch is one asynchronous message. Host functions run in this process when the server says a
//! stream reached one. Node parameters that name memory must name device memory: a copy node
//! with host memory could not read or write this process's memory from the server, so it is
//! refused at the call with a one-line message.

#![allow(clippy::too_many_arguments, reason = "the driver API's signatures")]

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_uint, c_ulonglong, c_void};
use std::sync::{Arc, Mutex};

use flyt_client::client::Client;
use flyt_client::graphs::HostFunction;
use flyt_client::launch::{Args, pack_args};
use flyt_client::registry::Function;
use flyt_protocol::ops::{Copy3d, Dim3, Memset2d, NodeParams, req};

use super::module::{extra_buffer, function, function_handle};
use super::session::{client, driver_error, resolve_stream, run};
use crate::CUresult;
use crate::ffi::{DriverResult, non_null, write_out};
use crate::generated::types::{
    CUDA_GRAPH_INSTANTIATE_PARAMS, CUDA_HOST_NODE_PARAMS, CUDA_KERNEL_NODE_PARAMS, CUDA_KERNEL_NODE_PARAMS_v1, CUDA_MEMCPY3D,
    CUDA_MEMSET_NODE_PARAMS, CUcontext, CUevent, CUgraph, CUgraphEdgeData, CUgraphExec, CUgraphExecUpdateResult,
    CUgraphExecUpdateResultInfo, CUgraphNode, CUgraphNodeType, CUhostFn, CUstream, CUstreamCallback,
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

/// One side of a copy node: its address with the offsets applied, if it is device memory.
fn copy_side(
    client: &Client,
    memory_type: c_uint,
    device: u64,
    x: usize,
    y: usize,
    z: usize,
    pitch: u64,
    height: u64,
) -> DriverResult<u64> {
    let device_memory = memory_type == MEMORY_DEVICE || (memory_type == MEMORY_UNIFIED && client.is_device_pointer(device));
    if !device_memory {
        crate::diagnostics::once(
            "graph-host-copy",
            "flyt: graph memcpy nodes with host memory or arrays are not supported (the server cannot reach this process's memory at launch)",
        );
        return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    let offset = (z as u64)
        .checked_mul(pitch)
        .and_then(|slice| slice.checked_mul(height))
        .and_then(|slices| slices.checked_add((y as u64).checked_mul(pitch)?))
        .and_then(|rows| rows.checked_add(x as u64))
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    device.checked_add(offset).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
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
    let src = copy_side(client, p.srcMemoryType, p.srcDevice, p.srcXInBytes, p.srcY, p.srcZ, src_pitch, src_height)?;
    let dst = copy_side(client, p.dstMemoryType, p.dstDevice, p.dstXInBytes, p.dstY, p.dstZ, dst_pitch, dst_height)?;
    Ok(NodeParams::Memcpy(Copy3d { src, src_pitch, src_height, dst, dst_pitch, dst_height, width, height, depth }))
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
/// # Safety
/// `out` is the caller's out-pointer; `dependencies` holds `count` handles.
unsafe fn add_node(
    client: &Client,
    out: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    count: usize,
    params: NodeParams,
) -> DriverResult<u64> {
    non_null([out.cast()])?;
    let graph = id_of(graph)?;
    // SAFETY: forwarded contract.
    let dependencies = unsafe { node_ids(dependencies, count) }?;
    let node = client.graphs.new_id();
    let kind = params.kind();
    client.call(req::GraphAddNode { graph, node, dependencies, params }).map_err(driver_error)?;
    client.graphs.note_nodes([(node, kind)]);
    // SAFETY: checked non-NULL.
    unsafe { write_out(out, node_handle(node)) }?;
    Ok(node)
}

pub unsafe fn cuGraphCreate(ph_graph: *mut CUgraph, flags: c_uint) -> CUresult {
    run(|| {
        non_null([ph_graph.cast()])?;
        if flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let client = client()?;
        let graph = client.graphs.new_id();
        client.call(req::GraphCreate { graph }).map_err(driver_error)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(ph_graph, graph_handle(graph)) }
    })
}

pub unsafe fn cuGraphDestroy(h_graph: CUgraph) -> CUresult {
    run(|| client()?.post(req::GraphDestroy { graph: id_of(h_graph)? }).map_err(driver_error))
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
    let node = unsafe { add_node(client, out, graph, dependencies, count, params) }?;
    kernel_nodes().get_or_insert_with(HashMap::new).insert(node, record);
    Ok(())
}

pub unsafe fn cuGraphAddKernelNode(
    ph_graph_node: *mut CUgraphNode,
    h_graph: CUgraph,
    dependencies: *const CUgraphNode,
    num_dependencies: usize,
    node_params: *const CUDA_KERNEL_NODE_PARAMS_v1,
) -> CUresult {
    // SAFETY: the caller's struct, out-pointer and dependency array.
    run(|| unsafe { add_kernel_node(ph_graph_node, h_graph, dependencies, num_dependencies, fields_v1(node_params)) })
}

pub unsafe fn cuGraphAddKernelNode_v2(
    ph_graph_node: *mut CUgraphNode,
    h_graph: CUgraph,
    dependencies: *const CUgraphNode,
    num_dependencies: usize,
    node_params: *const CUDA_KERNEL_NODE_PARAMS,
) -> CUresult {
    // SAFETY: the caller's struct, out-pointer and dependency array.
    run(|| unsafe { add_kernel_node(ph_graph_node, h_graph, dependencies, num_dependencies, fields_v2(node_params)) })
}

pub unsafe fn cuGraphAddMemcpyNode(
    ph_graph_node: *mut CUgraphNode,
    h_graph: CUgraph,
    dependencies: *const CUgraphNode,
    num_dependencies: usize,
    copy_params: *const CUDA_MEMCPY3D,
    _ctx: CUcontext,
) -> CUresult {
    run(|| {
        let client = client()?;
        // SAFETY: the caller's struct; out-pointer and dependency array.
        unsafe {
            let params = memcpy_params(client, copy_params)?;
            add_node(client, ph_graph_node, h_graph, dependencies, num_dependencies, params).map(drop)
        }
    })
}

pub unsafe fn cuGraphAddMemsetNode(
    ph_graph_node: *mut CUgraphNode,
    h_graph: CUgraph,
    dependencies: *const CUgraphNode,
    num_dependencies: usize,
    memset_params: *const CUDA_MEMSET_NODE_PARAMS,
    _ctx: CUcontext,
) -> CUresult {
    run(|| {
        let client = client()?;
        // SAFETY: as above.
        unsafe {
            let params = self::memset_params(memset_params)?;
            add_node(client, ph_graph_node, h_graph, dependencies, num_dependencies, params).map(drop)
        }
    })
}

pub unsafe fn cuGraphAddHostNode(
    ph_graph_node: *mut CUgraphNode,
    h_graph: CUgraph,
    dependencies: *const CUgraphNode,
    num_dependencies: usize,
    node_params: *const CUDA_HOST_NODE_PARAMS,
) -> CUresult {
    run(|| {
        let client = client()?;
        // SAFETY: as above.
        unsafe {
            let params = host_params(client, node_params)?;
            add_node(client, ph_graph_node, h_graph, dependencies, num_dependencies, params).map(drop)
        }
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
        let params = NodeParams::Child { graph: id_of(child_graph)? };
        // SAFETY: the caller's out-pointer and dependency array.
        unsafe { add_node(client, ph_graph_node, h_graph, dependencies, num_dependencies, params) }.map(drop)
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

pub unsafe fn cuGraphAddEventRecordNode(
    ph_graph_node: *mut CUgraphNode,
    h_graph: CUgraph,
    dependencies: *const CUgraphNode,
    num_dependencies: usize,
    event: CUevent,
) -> CUresult {
    run(|| {
        let client = client()?;
        let params = event_params(client, event, true)?;
        // SAFETY: the caller's out-pointer and dependency array.
        unsafe { add_node(client, ph_graph_node, h_graph, dependencies, num_dependencies, params) }.map(drop)
    })
}

pub unsafe fn cuGraphAddEventWaitNode(
    ph_graph_node: *mut CUgraphNode,
    h_graph: CUgraph,
    dependencies: *const CUgraphNode,
    num_dependencies: usize,
    event: CUevent,
) -> CUresult {
    run(|| {
        let client = client()?;
        let params = event_params(client, event, false)?;
        // SAFETY: the caller's out-pointer and dependency array.
        unsafe { add_node(client, ph_graph_node, h_graph, dependencies, num_dependencies, params) }.map(drop)
    })
}

/// Adds or removes edges; edge data, if given, must be the default (a full dependency).
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
    if !edges.is_null() && count > 0 {
        /// `CUgraphEdgeData`: from port, to port, type, 5 reserved bytes; all zero by default.
        const EDGE_DATA_LEN: usize = 8;
        // SAFETY: the caller's array of `count` 8-byte entries.
        let bytes = unsafe { std::slice::from_raw_parts(edges.cast::<u8>(), count * EDGE_DATA_LEN) };
        if bytes.iter().any(|byte| *byte != 0) {
            crate::diagnostics::once("graph-edge-data", "flyt: graph edges with ports or types other than the default are not supported");
            return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
    }
    let client = client()?;
    // SAFETY: forwarded contract.
    let (from, to) = unsafe { (node_ids(from, count)?, node_ids(to, count)?) };
    client.call(req::GraphEdges { graph: id_of(graph)?, from, to, remove }).map(drop).map_err(driver_error)
}

pub unsafe fn cuGraphAddDependencies(
    h_graph: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    num_dependencies: usize,
) -> CUresult {
    // SAFETY: forwarded contract.
    run(|| unsafe { edges(h_graph, from, to, std::ptr::null(), num_dependencies, false) })
}

pub unsafe fn cuGraphAddDependencies_v2(
    h_graph: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    edge_data: *const CUgraphEdgeData,
    num_dependencies: usize,
) -> CUresult {
    // SAFETY: forwarded contract.
    run(|| unsafe { edges(h_graph, from, to, edge_data, num_dependencies, false) })
}

pub unsafe fn cuGraphRemoveDependencies(
    h_graph: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    num_dependencies: usize,
) -> CUresult {
    // SAFETY: forwarded contract.
    run(|| unsafe { edges(h_graph, from, to, std::ptr::null(), num_dependencies, true) })
}

pub unsafe fn cuGraphRemoveDependencies_v2(
    h_graph: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    edge_data: *const CUgraphEdgeData,
    num_dependencies: usize,
) -> CUresult {
    // SAFETY: forwarded contract.
    run(|| unsafe { edges(h_graph, from, to, edge_data, num_dependencies, true) })
}

/// Lists a graph's nodes (or roots) as the driver does: the count alone with `nodes` NULL,
/// else up to `*count` handles, NULL after the last, and the number written.
fn list_nodes(graph: CUgraph, nodes: *mut CUgraphNode, count: *mut usize, roots: bool) -> DriverResult {
    non_null([count.cast()])?;
    let client = client()?;
    let listed = client.call(req::GraphNodes { graph: id_of(graph)?, roots }).map_err(driver_error)?.nodes;
    client.graphs.note_nodes(listed.iter().map(|entry| (entry.node, entry.kind)));
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
        let kind = client()?.graphs.node_kind(id_of(h_node)?).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(type_, kind as CUgraphNodeType) }
    })
}

pub unsafe fn cuGraphDestroyNode(h_node: CUgraphNode) -> CUresult {
    run(|| {
        let client = client()?;
        let node = id_of(h_node)?;
        client.call(req::GraphDestroyNode { node }).map_err(driver_error)?;
        client.graphs.forget_node(node);
        if let Some(nodes) = kernel_nodes().as_mut() {
            nodes.remove(&node);
        }
        Ok(())
    })
}

pub unsafe fn cuGraphClone(ph_graph_clone: *mut CUgraph, original_graph: CUgraph) -> CUresult {
    run(|| {
        non_null([ph_graph_clone.cast()])?;
        let client = client()?;
        let clone = client.graphs.new_id();
        let pairs = client.call(req::GraphClone { graph: id_of(original_graph)?, clone }).map_err(driver_error)?.nodes;
        client.graphs.note_clone(clone, &pairs);
        // SAFETY: checked non-NULL.
        unsafe { write_out(ph_graph_clone, graph_handle(clone)) }
    })
}

pub unsafe fn cuGraphNodeFindInClone(ph_node: *mut CUgraphNode, h_original_node: CUgraphNode, h_cloned_graph: CUgraph) -> CUresult {
    run(|| {
        non_null([ph_node.cast()])?;
        let client = client()?;
        let found =
            client.graphs.node_in_clone(id_of(h_cloned_graph)?, id_of(h_original_node)?).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(ph_node, node_handle(found)) }
    })
}

fn instantiate(out: *mut CUgraphExec, graph: CUgraph, flags: u64) -> DriverResult<u64> {
    non_null([out.cast()])?;
    let client = client()?;
    let exec = client.graphs.new_id();
    let reply = client.call(req::GraphInstantiate { graph: id_of(graph)?, exec, flags }).map_err(driver_error)?;
    client.graphs.set_exec_host_nodes(exec, reply.host_nodes);
    // SAFETY: checked non-NULL.
    unsafe { write_out(out, graph_handle(exec)) }?;
    Ok(exec)
}

pub unsafe fn cuGraphInstantiateWithFlags(ph_graph_exec: *mut CUgraphExec, h_graph: CUgraph, flags: c_ulonglong) -> CUresult {
    run(|| instantiate(ph_graph_exec, h_graph, flags).map(drop))
}

pub unsafe fn cuGraphInstantiate_v2(
    ph_graph_exec: *mut CUgraphExec,
    h_graph: CUgraph,
    ph_error_node: *mut CUgraphNode,
    log_buffer: *mut c_char,
    buffer_size: usize,
) -> CUresult {
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

pub unsafe fn cuGraphInstantiateWithParams(
    ph_graph_exec: *mut CUgraphExec,
    h_graph: CUgraph,
    instantiate_params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
) -> CUresult {
    run(|| instantiate_with_params(ph_graph_exec, h_graph, instantiate_params, false))
}

pub unsafe fn cuGraphInstantiateWithParams_ptsz(
    ph_graph_exec: *mut CUgraphExec,
    h_graph: CUgraph,
    instantiate_params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
) -> CUresult {
    run(|| instantiate_with_params(ph_graph_exec, h_graph, instantiate_params, true))
}

fn launch(exec: CUgraphExec, stream: CUstream, ptsz: bool, upload: bool) -> DriverResult {
    let client = client()?;
    let (exec, stream) = (id_of(exec)?, resolve_stream(client, stream, ptsz)?);
    let posted = if upload { client.post(req::GraphUpload { exec, stream }) } else { client.launch_graph(exec, stream) };
    posted.map_err(driver_error)
}

pub unsafe fn cuGraphLaunch(h_graph_exec: CUgraphExec, h_stream: CUstream) -> CUresult {
    run(|| launch(h_graph_exec, h_stream, false, false))
}

pub unsafe fn cuGraphLaunch_ptsz(h_graph_exec: CUgraphExec, h_stream: CUstream) -> CUresult {
    run(|| launch(h_graph_exec, h_stream, true, false))
}

pub unsafe fn cuGraphUpload(h_graph_exec: CUgraphExec, h_stream: CUstream) -> CUresult {
    run(|| launch(h_graph_exec, h_stream, false, true))
}

pub unsafe fn cuGraphUpload_ptsz(h_graph_exec: CUgraphExec, h_stream: CUstream) -> CUresult {
    run(|| launch(h_graph_exec, h_stream, true, true))
}

pub unsafe fn cuGraphExecDestroy(h_graph_exec: CUgraphExec) -> CUresult {
    run(|| {
        let client = client()?;
        let exec = id_of(h_graph_exec)?;
        client.graphs.forget_exec(exec);
        client.post(req::GraphExecDestroy { exec }).map_err(driver_error)
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
            client.graphs.set_exec_host_nodes(exec, reply.host_nodes);
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

pub unsafe fn cuGraphKernelNodeSetParams(h_node: CUgraphNode, node_params: *const CUDA_KERNEL_NODE_PARAMS_v1) -> CUresult {
    // SAFETY: the caller's struct.
    run(|| set_kernel(std::ptr::null_mut(), h_node, unsafe { fields_v1(node_params) }))
}

pub unsafe fn cuGraphKernelNodeSetParams_v2(h_node: CUgraphNode, node_params: *const CUDA_KERNEL_NODE_PARAMS) -> CUresult {
    // SAFETY: the caller's struct.
    run(|| set_kernel(std::ptr::null_mut(), h_node, unsafe { fields_v2(node_params) }))
}

pub unsafe fn cuGraphExecKernelNodeSetParams(
    h_graph_exec: CUgraphExec,
    h_node: CUgraphNode,
    node_params: *const CUDA_KERNEL_NODE_PARAMS_v1,
) -> CUresult {
    run(|| {
        non_null([h_graph_exec.cast()])?;
        // SAFETY: the caller's struct.
        set_kernel(h_graph_exec, h_node, unsafe { fields_v1(node_params) })
    })
}

pub unsafe fn cuGraphExecKernelNodeSetParams_v2(
    h_graph_exec: CUgraphExec,
    h_node: CUgraphNode,
    node_params: *const CUDA_KERNEL_NODE_PARAMS,
) -> CUresult {
    run(|| {
        non_null([h_graph_exec.cast()])?;
        // SAFETY: the caller's struct.
        set_kernel(h_graph_exec, h_node, unsafe { fields_v2(node_params) })
    })
}

/// A kernel node's parameters as the app set them; `kernelParams` point at values kept here
/// until the node's parameters change or it is destroyed.
fn kernel_node_params(node: CUgraphNode) -> DriverResult<(CUDA_KERNEL_NODE_PARAMS_v1, Option<*mut c_void>)> {
    let client = client()?;
    let node = id_of(node)?;
    if client.graphs.node_kind(node).is_none_or(|kind| kind != flyt_protocol::ops::node_type::KERNEL) {
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

pub unsafe fn cuGraphMemsetNodeSetParams(h_node: CUgraphNode, node_params: *const CUDA_MEMSET_NODE_PARAMS) -> CUresult {
    // SAFETY: the caller's struct.
    run(|| set_params(std::ptr::null_mut(), h_node, unsafe { memset_params(node_params) }?))
}

pub unsafe fn cuGraphExecMemsetNodeSetParams(
    h_graph_exec: CUgraphExec,
    h_node: CUgraphNode,
    memset_params: *const CUDA_MEMSET_NODE_PARAMS,
    _ctx: CUcontext,
) -> CUresult {
    run(|| {
        non_null([h_graph_exec.cast()])?;
        // SAFETY: the caller's struct.
        set_params(h_graph_exec, h_node, unsafe { self::memset_params(memset_params) }?)
    })
}

pub unsafe fn cuGraphMemcpyNodeSetParams(h_node: CUgraphNode, node_params: *const CUDA_MEMCPY3D) -> CUresult {
    // SAFETY: the caller's struct.
    run(|| set_params(std::ptr::null_mut(), h_node, unsafe { memcpy_params(client()?, node_params) }?))
}

pub unsafe fn cuGraphExecMemcpyNodeSetParams(
    h_graph_exec: CUgraphExec,
    h_node: CUgraphNode,
    copy_params: *const CUDA_MEMCPY3D,
    _ctx: CUcontext,
) -> CUresult {
    run(|| {
        non_null([h_graph_exec.cast()])?;
        // SAFETY: the caller's struct.
        set_params(h_graph_exec, h_node, unsafe { memcpy_params(client()?, copy_params) }?)
    })
}

pub unsafe fn cuGraphHostNodeSetParams(h_node: CUgraphNode, node_params: *const CUDA_HOST_NODE_PARAMS) -> CUresult {
    // SAFETY: the caller's struct.
    run(|| set_params(std::ptr::null_mut(), h_node, unsafe { host_params(client()?, node_params) }?))
}

pub unsafe fn cuGraphExecHostNodeSetParams(
    h_graph_exec: CUgraphExec,
    h_node: CUgraphNode,
    node_params: *const CUDA_HOST_NODE_PARAMS,
) -> CUresult {
    run(|| {
        non_null([h_graph_exec.cast()])?;
        // SAFETY: the caller's struct.
        set_params(h_graph_exec, h_node, unsafe { host_params(client()?, node_params) }?)
    })
}

pub unsafe fn cuGraphExecChildGraphNodeSetParams(h_graph_exec: CUgraphExec, h_node: CUgraphNode, child_graph: CUgraph) -> CUresult {
    run(|| {
        non_null([h_graph_exec.cast()])?;
        set_params(h_graph_exec, h_node, NodeParams::Child { graph: id_of(child_graph)? })
    })
}

pub unsafe fn cuGraphEventRecordNodeSetEvent(h_node: CUgraphNode, event: CUevent) -> CUresult {
    run(|| set_params(std::ptr::null_mut(), h_node, event_params(client()?, event, true)?))
}

pub unsafe fn cuGraphExecEventRecordNodeSetEvent(h_graph_exec: CUgraphExec, h_node: CUgraphNode, event: CUevent) -> CUresult {
    run(|| {
        non_null([h_graph_exec.cast()])?;
        set_params(h_graph_exec, h_node, event_params(client()?, event, true)?)
    })
}

pub unsafe fn cuGraphEventWaitNodeSetEvent(h_node: CUgraphNode, event: CUevent) -> CUresult {
    run(|| set_params(std::ptr::null_mut(), h_node, event_params(client()?, event, false)?))
}

pub unsafe fn cuGraphExecEventWaitNodeSetEvent(h_graph_exec: CUgraphExec, h_node: CUgraphNode, event: CUevent) -> CUresult {
    run(|| {
        non_null([h_graph_exec.cast()])?;
        set_params(h_graph_exec, h_node, event_params(client()?, event, false)?)
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

pub unsafe fn cuLaunchHostFunc(h_stream: CUstream, fn_: CUhostFn, user_data: *mut c_void) -> CUresult {
    run(|| {
        let function = fn_.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        host_function(h_stream, HostFunction::Plain { function, user_data: user_data as usize }, false)
    })
}

pub unsafe fn cuLaunchHostFunc_ptsz(h_stream: CUstream, fn_: CUhostFn, user_data: *mut c_void) -> CUresult {
    run(|| {
        let function = fn_.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        host_function(h_stream, HostFunction::Plain { function, user_data: user_data as usize }, true)
    })
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

pub unsafe fn cuStreamAddCallback(h_stream: CUstream, callback: CUstreamCallback, user_data: *mut c_void, flags: c_uint) -> CUresult {
    run(|| stream_callback(h_stream, callback, user_data, flags, false))
}

pub unsafe fn cuStreamAddCallback_ptsz(h_stream: CUstream, callback: CUstreamCallback, user_data: *mut c_void, flags: c_uint) -> CUresult {
    run(|| stream_callback(h_stream, callback, user_data, flags, true))
}
