//! Stream capture. The server's driver captures for real: work queued on a capturing stream
//! goes to the server as always and becomes nodes of the graph there. While no capture is
//! active in the process (the common case: libraries ask before every enqueue), the queries are
//! answered here without a round trip; during one, the server answers (it also knows the streams
//! that joined a capture through events). Edge data (ports and types of programmatic launches)
//! goes to the server's driver with the dependencies it annotates, and comes back with them.

use std::ffi::c_uint;

use flyt_client::graphs::CaptureInto;
use flyt_protocol::ops::capture_status;

use super::session::{client, driver_error, resolve_stream, run};
use crate::CUresult;
use crate::ffi::{DriverResult, non_null, write_out};
use crate::generated::types::{CUgraph, CUgraphEdgeData, CUgraphNode, CUstream, CUstreamCaptureMode, CUstreamCaptureStatus, cuuint64_t};

/// `CU_STREAM_CAPTURE_MODE_GLOBAL` and `_RELAXED`, the first and last of the three modes.
const CAPTURE_MODE_GLOBAL: CUstreamCaptureMode = 0;
const CAPTURE_MODE_RELAXED: CUstreamCaptureMode = 2;

thread_local! {
    /// The dependencies `cuStreamGetCaptureInfo` last gave this thread and their edge data
    /// (valid until its next call, as the driver's arrays are valid until the next call on the
    /// stream).
    static DEPENDENCIES: std::cell::RefCell<(Vec<CUgraphNode>, Vec<CUgraphEdgeData>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// This thread's capture interaction mode (GLOBAL until exchanged), which the client keeps: it
/// decides the mode each of the thread's requests runs in on the server.
fn thread_mode() -> CUstreamCaptureMode {
    flyt_client::graphs::thread_capture_mode()
}

/// The stream a capture begins on: the legacy stream is the legacy stream (which the driver
/// refuses to capture) in a green context too.
fn capture_stream(client: &flyt_client::client::Client, stream: CUstream, ptsz: bool) -> DriverResult<u64> {
    if super::session::is_legacy_stream(client, stream, ptsz)? { Ok(0) } else { resolve_stream(client, stream, ptsz) }
}

fn begin(stream: CUstream, mode: CUstreamCaptureMode, ptsz: bool) -> DriverResult {
    if mode > CAPTURE_MODE_RELAXED {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let client = client()?;
    let stream = capture_stream(client, stream, ptsz)?;
    client.begin_capture(stream, mode, thread_mode(), None).map(drop).map_err(driver_error)
}

/// `cuStreamBeginCaptureToGraph`: into the app's graph, after `count` of its nodes, with their
/// edge data if given (which the server's driver checks).
///
/// # Safety
/// `dependencies` holds `count` node handles (or is NULL with `count` 0); `edge_data` is NULL
/// or holds `count` entries.
unsafe fn begin_to_graph(
    stream: CUstream,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    edge_data: *const CUgraphEdgeData,
    count: usize,
    mode: CUstreamCaptureMode,
    ptsz: bool,
) -> DriverResult {
    if mode > CAPTURE_MODE_RELAXED {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let client = client()?;
    let stream = capture_stream(client, stream, ptsz)?;
    // SAFETY: forwarded contract.
    let (dependencies, data) = unsafe { (super::graph::node_ids(dependencies, count)?, super::graph::edge_kinds(edge_data, count)) };
    let graph = super::graph::id_of(graph)?;
    let with_data = !data.is_empty();
    client
        .begin_capture(stream, mode, thread_mode(), Some(CaptureInto { graph, dependencies, data }))
        .map(drop)
        .map_err(|error| super::graph::edge_data_refused(with_data, error))
}

macro_rules! begin_to_graph {
    ($($name:ident => $ptsz:literal;)*) => {$(
        pub unsafe fn $name(
            h_stream: CUstream,
            h_graph: CUgraph,
            dependencies: *const CUgraphNode,
            dependency_data: *const CUgraphEdgeData,
            num_dependencies: usize,
            mode: CUstreamCaptureMode,
        ) -> CUresult {
            // SAFETY: the caller's array of `num_dependencies` nodes.
            run(|| unsafe { begin_to_graph(h_stream, h_graph, dependencies, dependency_data, num_dependencies, mode, $ptsz) })
        }
    )*};
}

begin_to_graph! {
    cuStreamBeginCaptureToGraph => false;
    cuStreamBeginCaptureToGraph_ptsz => true;
}

/// `cuStreamUpdateCaptureDependencies*`: `flags` is `CU_STREAM_ADD_CAPTURE_DEPENDENCIES` (0) or
/// `CU_STREAM_SET_CAPTURE_DEPENDENCIES` (1); the edge data, if given, goes along.
///
/// # Safety
/// `dependencies` holds `count` node handles (or is NULL with `count` 0); `edge_data` is NULL
/// or holds `count` entries.
unsafe fn update_dependencies(
    stream: CUstream,
    dependencies: *const CUgraphNode,
    edge_data: *const CUgraphEdgeData,
    count: usize,
    flags: c_uint,
    ptsz: bool,
) -> DriverResult {
    if flags > 1 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let client = client()?;
    let stream = resolve_stream(client, stream, ptsz)?;
    // SAFETY: forwarded contract.
    let (nodes, data) = unsafe { (super::graph::node_ids(dependencies, count)?, super::graph::edge_kinds(edge_data, count)) };
    let with_data = !data.is_empty();
    client.update_capture_dependencies(stream, nodes, data, flags == 1).map_err(|error| super::graph::edge_data_refused(with_data, error))
}

per_thread_twins! {
    cuStreamUpdateCaptureDependencies, cuStreamUpdateCaptureDependencies_ptsz
        (
            h_stream: CUstream,
            dependencies: *mut CUgraphNode,
            num_dependencies: usize,
            flags: c_uint,
        )
        |per_thread| {
            // SAFETY: the caller's array.
            run(|| unsafe { update_dependencies(h_stream, dependencies, std::ptr::null(), num_dependencies, flags, per_thread) })
        }
}

per_thread_twins! {
    cuStreamUpdateCaptureDependencies_v2, cuStreamUpdateCaptureDependencies_v2_ptsz
        (
            h_stream: CUstream,
            dependencies: *mut CUgraphNode,
            dependency_data: *const CUgraphEdgeData,
            num_dependencies: usize,
            flags: c_uint,
        )
        |per_thread| {
            // SAFETY: the caller's arrays.
            run(|| unsafe { update_dependencies(h_stream, dependencies, dependency_data, num_dependencies, flags, per_thread) })
        }
}

per_thread_twins! {
    cuStreamBeginCapture, cuStreamBeginCapture_ptsz (h_stream: CUstream)
        |per_thread| run(|| begin(h_stream, CAPTURE_MODE_GLOBAL, per_thread))
}

per_thread_twins! {
    cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz (h_stream: CUstream, mode: CUstreamCaptureMode)
        |per_thread| run(|| begin(h_stream, mode, per_thread))
}

/// `graph` may be NULL: the driver then ends the capture all the same (NVIDIA's
/// graphConditionalNodes does so after capturing into a conditional node's body graph).
fn end(stream: CUstream, graph: *mut CUgraph, ptsz: bool) -> DriverResult {
    let client = client()?;
    let stream = resolve_stream(client, stream, ptsz)?;
    let ended = client.end_capture(stream);
    if !graph.is_null() {
        // The driver writes NULL when the capture ends without a graph (invalidated).
        let handle = ended.as_ref().map_or(std::ptr::null_mut(), |id| super::graph::graph_handle(*id));
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(graph, handle) }?;
    }
    ended.map(drop).map_err(driver_error)
}

per_thread_twins! {
    cuStreamEndCapture, cuStreamEndCapture_ptsz (h_stream: CUstream, ph_graph: *mut CUgraph)
        |per_thread| run(|| end(h_stream, ph_graph, per_thread))
}

/// What `cuStreamGetCaptureInfo` writes; NULL out-pointers other than the status are skipped.
struct InfoOut {
    status: *mut CUstreamCaptureStatus,
    id: *mut cuuint64_t,
    graph: *mut CUgraph,
    dependencies: *mut *const CUgraphNode,
    edges: *mut *const CUgraphEdgeData,
    count: *mut usize,
}

fn capture_info(stream: CUstream, out: InfoOut, ptsz: bool) -> DriverResult {
    non_null([out.status.cast()])?;
    // The edge data parallels the dependencies: asked for alone, it is an invalid value.
    if !out.edges.is_null() && out.dependencies.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let client = client()?;
    let stream = resolve_stream(client, stream, ptsz)?;
    let info = client.capture_info(stream).map_err(driver_error)?;
    let active = info.status != capture_status::NONE;
    if !info.data.is_empty() && info.data.len() != info.dependencies.len() {
        return Err(CUresult::CUDA_ERROR_UNKNOWN);
    }
    // Dependencies asked for without their edge data, where some is not the default, would
    // lose it: the driver refuses such a query.
    if active && !out.dependencies.is_null() && out.edges.is_null() && info.data.iter().any(|edge| *edge != [0; 3]) {
        return Err(CUresult::CUDA_ERROR_LOSSY_QUERY);
    }
    let nodes: Vec<CUgraphNode> = info.dependencies.iter().map(|id| super::graph::node_handle(*id)).collect();
    let edges: Vec<CUgraphEdgeData> = info
        .data
        .iter()
        .map(|[from_port, to_port, kind]| CUgraphEdgeData { from_port: *from_port, to_port: *to_port, r#type: *kind, reserved: [0; 5] })
        .collect();
    let (nodes_ptr, edges_ptr, count) = DEPENDENCIES
        .try_with(|kept| {
            let mut kept = kept.borrow_mut();
            *kept = (nodes, edges);
            let (nodes, edges) = &*kept;
            // The driver's NULL edge data (plain full dependencies) stays NULL.
            let edges_ptr = if edges.is_empty() { std::ptr::null() } else { edges.as_ptr() };
            (if nodes.is_empty() { std::ptr::null() } else { nodes.as_ptr() }, edges_ptr, nodes.len())
        })
        .map_err(|_| CUresult::CUDA_ERROR_UNKNOWN)?;
    // SAFETY: each pointer is checked non-NULL by `write_out` or here; they are the caller's
    // out-parameters. The other values are defined only while a capture is active.
    unsafe {
        write_out(out.status, info.status as CUstreamCaptureStatus)?;
        if active {
            if !out.id.is_null() {
                write_out(out.id, info.id)?;
            }
            if !out.graph.is_null() {
                write_out(out.graph, super::graph::graph_handle(info.graph))?;
            }
            if !out.dependencies.is_null() {
                write_out(out.dependencies, nodes_ptr)?;
            }
            if !out.edges.is_null() {
                write_out(out.edges, edges_ptr)?;
            }
            if !out.count.is_null() {
                write_out(out.count, count)?;
            }
        }
    }
    Ok(())
}

fn no_more() -> InfoOut {
    InfoOut {
        status: std::ptr::null_mut(),
        id: std::ptr::null_mut(),
        graph: std::ptr::null_mut(),
        dependencies: std::ptr::null_mut(),
        edges: std::ptr::null_mut(),
        count: std::ptr::null_mut(),
    }
}

per_thread_twins! {
    cuStreamIsCapturing, cuStreamIsCapturing_ptsz (h_stream: CUstream, capture_status: *mut CUstreamCaptureStatus)
        |per_thread| run(|| capture_info(h_stream, InfoOut { status: capture_status, ..no_more() }, per_thread))
}

per_thread_twins! {
    cuStreamGetCaptureInfo, cuStreamGetCaptureInfo_ptsz
        (
            h_stream: CUstream,
            capture_status_out: *mut CUstreamCaptureStatus,
            id_out: *mut cuuint64_t,
        )
        |per_thread| run(|| capture_info(h_stream, InfoOut { status: capture_status_out, id: id_out, ..no_more() }, per_thread))
}

per_thread_twins! {
    cuStreamGetCaptureInfo_v2, cuStreamGetCaptureInfo_v2_ptsz
        (
            h_stream: CUstream,
            capture_status_out: *mut CUstreamCaptureStatus,
            id_out: *mut cuuint64_t,
            graph_out: *mut CUgraph,
            dependencies_out: *mut *const CUgraphNode,
            num_dependencies_out: *mut usize,
        )
        |per_thread| {
            let (status, id, graph, dependencies, count) = (capture_status_out, id_out, graph_out, dependencies_out, num_dependencies_out);
            run(|| capture_info(h_stream, InfoOut { status, id, graph, dependencies, count, ..no_more() }, per_thread))
        }
}

per_thread_twins! {
    cuStreamGetCaptureInfo_v3, cuStreamGetCaptureInfo_v3_ptsz
        (
            h_stream: CUstream,
            capture_status_out: *mut CUstreamCaptureStatus,
            id_out: *mut cuuint64_t,
            graph_out: *mut CUgraph,
            dependencies_out: *mut *const CUgraphNode,
            edge_data_out: *mut *const CUgraphEdgeData,
            num_dependencies_out: *mut usize,
        )
        |per_thread| {
            let (status, id, graph, dependencies, edges, count) =
                (capture_status_out, id_out, graph_out, dependencies_out, edge_data_out, num_dependencies_out);
            run(|| capture_info(h_stream, InfoOut { status, id, graph, dependencies, edges, count }, per_thread))
        }
}

/// Swaps the calling thread's capture mode, as the driver keeps it: per thread. During a
/// capture the thread's requests carry it to the server (`Client::capture_mode_for_thread`),
/// whose driver checks the calls made during a capture.
pub unsafe fn cuThreadExchangeStreamCaptureMode(mode: *mut CUstreamCaptureMode) -> CUresult {
    run(|| {
        non_null([mode.cast()])?;
        // SAFETY: checked non-NULL; the caller's in/out mode.
        let wanted = unsafe { mode.read() };
        if wanted > CAPTURE_MODE_RELAXED {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let previous = flyt_client::graphs::set_thread_capture_mode(wanted);
        // SAFETY: as above.
        unsafe { write_out(mode, previous) }
    })
}
