//! What the bodies that reach the GPU server share: the process's `flyt-client` session, found
//! through the driver (so the devices are opened first and a current context is required, as the
//! driver requires one), stream handles, and error mapping.

use flyt_client::client::Client;
use flyt_protocol::CudaError;

use crate::CUresult;
use crate::driver::driver;
use crate::ffi::{DriverResult, finish};
use crate::generated::types::CUstream;

/// Runs a body and turns its result into the status the caller sees.
pub(super) fn run(body: impl FnOnce() -> DriverResult) -> CUresult {
    finish(body())
}

/// A session error in the driver's numbering.
pub(super) fn driver_error(error: CudaError) -> CUresult {
    crate::client_source::to_driver(error)
}

/// The session, for a call that needs no current context (pointer queries: under unified
/// addressing the driver answers them from any thread).
pub(super) fn session_client() -> DriverResult<&'static Client> {
    driver().session()?;
    flyt_client::client::client().map_err(driver_error)
}

/// The session, for a call made in a current context after `cuInit`.
pub(super) fn client() -> DriverResult<&'static Client> {
    driver().session()?;
    crate::context::current().ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?.usable()?;
    flyt_client::client::client().map_err(driver_error)
}

/// The wire id of a stream handle: NULL is the legacy stream, or the thread's own default stream
/// for the `_ptds`/`_ptsz` entry points; `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD` are what
/// they say; anything else must be a stream this process created. While a green context is
/// current (`cuCtxFromGreenCtx`), NULL, legacy and per-thread stand for its own stream, made with
/// it on the server, so the work runs on the green context's SMs.
pub(super) fn resolve_stream(client: &Client, stream: CUstream, per_thread_default: bool) -> DriverResult<u64> {
    if super::stream::is_default_stream(stream)
        && let Some(green) = crate::context::current().and_then(crate::context::Context::green)
    {
        return Ok(green.default_stream());
    }
    flyt_client::streams::resolve(client, stream as usize, per_thread_default).map_err(driver_error)
}

/// Whether a stream handle names the legacy NULL stream itself, whichever context is current:
/// the calls the driver refuses on it (batches, captures) refuse it in a green context too.
pub(super) fn is_legacy_stream(client: &Client, stream: CUstream, per_thread_default: bool) -> DriverResult<bool> {
    flyt_client::streams::resolve(client, stream as usize, per_thread_default).map(|id| id == 0).map_err(driver_error)
}
