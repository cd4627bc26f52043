//! Stream-capture queries. Flyt does not capture streams yet (`cuStreamBeginCapture` answers
//! CUDA_ERROR_NOT_SUPPORTED), so no stream is ever capturing: the queries libraries make before
//! they enqueue work (cuBLAS, PyTorch's allocator) get that true answer, after the stream handle
//! is checked as the driver checks it.

use std::cell::Cell;

use super::session::{client, resolve_stream, run};
use crate::CUresult;
use crate::ffi::{DriverResult, non_null, write_out};
use crate::generated::types::{CUgraph, CUgraphEdgeData, CUgraphNode, CUstream, CUstreamCaptureMode, CUstreamCaptureStatus, cuuint64_t};

/// `CU_STREAM_CAPTURE_STATUS_NONE`.
const CAPTURE_STATUS_NONE: CUstreamCaptureStatus = 0;
/// `CU_STREAM_CAPTURE_MODE_RELAXED`, the last of GLOBAL (0), THREAD_LOCAL (1), RELAXED (2).
const CAPTURE_MODE_RELAXED: CUstreamCaptureMode = 2;

fn not_capturing(stream: CUstream, status: *mut CUstreamCaptureStatus, ptsz: bool) -> DriverResult {
    non_null([status.cast()])?;
    resolve_stream(client()?, stream, ptsz)?;
    // SAFETY: checked non-NULL; the caller's out-pointer.
    unsafe { write_out(status, CAPTURE_STATUS_NONE) }
}

pub unsafe fn cuStreamIsCapturing(h_stream: CUstream, capture_status: *mut CUstreamCaptureStatus) -> CUresult {
    run(|| not_capturing(h_stream, capture_status, false))
}

pub unsafe fn cuStreamIsCapturing_ptsz(h_stream: CUstream, capture_status: *mut CUstreamCaptureStatus) -> CUresult {
    run(|| not_capturing(h_stream, capture_status, true))
}

macro_rules! capture_info {
    ($($name:ident ($($extra:ident : $ty:ty),*) => $ptsz:literal;)*) => {$(
        /// The other out-parameters are defined only while a capture is active, so only the status
        /// is written.
        #[allow(unused_variables, reason = "written only during a capture, which never happens")]
        pub unsafe fn $name(h_stream: CUstream, capture_status_out: *mut CUstreamCaptureStatus $(, $extra: $ty)*) -> CUresult {
            run(|| not_capturing(h_stream, capture_status_out, $ptsz))
        }
    )*};
}

capture_info! {
    cuStreamGetCaptureInfo(id_out: *mut cuuint64_t) => false;
    cuStreamGetCaptureInfo_ptsz(id_out: *mut cuuint64_t) => true;
    cuStreamGetCaptureInfo_v2(id_out: *mut cuuint64_t, graph_out: *mut CUgraph, dependencies_out: *mut *const CUgraphNode,
        num_dependencies_out: *mut usize) => false;
    cuStreamGetCaptureInfo_v2_ptsz(id_out: *mut cuuint64_t, graph_out: *mut CUgraph, dependencies_out: *mut *const CUgraphNode,
        num_dependencies_out: *mut usize) => true;
    cuStreamGetCaptureInfo_v3(id_out: *mut cuuint64_t, graph_out: *mut CUgraph, dependencies_out: *mut *const CUgraphNode,
        edge_data_out: *mut *const CUgraphEdgeData, num_dependencies_out: *mut usize) => false;
    cuStreamGetCaptureInfo_v3_ptsz(id_out: *mut cuuint64_t, graph_out: *mut CUgraph, dependencies_out: *mut *const CUgraphNode,
        edge_data_out: *mut *const CUgraphEdgeData, num_dependencies_out: *mut usize) => true;
}

thread_local! {
    /// This thread's capture interaction mode (GLOBAL until exchanged).
    static CAPTURE_MODE: Cell<CUstreamCaptureMode> = const { Cell::new(0) };
}

/// Swaps the calling thread's capture mode, as the driver keeps it: per thread, no device needed.
pub unsafe fn cuThreadExchangeStreamCaptureMode(mode: *mut CUstreamCaptureMode) -> CUresult {
    run(|| {
        non_null([mode.cast()])?;
        // SAFETY: checked non-NULL; the caller's in/out mode.
        let wanted = unsafe { mode.read() };
        if wanted > CAPTURE_MODE_RELAXED {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let previous = CAPTURE_MODE.try_with(|current| current.replace(wanted)).map_err(|_| CUresult::CUDA_ERROR_UNKNOWN)?;
        // SAFETY: as above.
        unsafe { write_out(mode, previous) }
    })
}
