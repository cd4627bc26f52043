//! The bodies of the implemented exports, one module per area. Each `unsafe fn` here is an FFI
//! edge: it checks what the app passed (NULL, lengths, handles), then does the work in safe
//! Rust through the session (`client`), the registry and the connection.

#![allow(non_snake_case, reason = "bodies carry the names of the CUDA exports they implement")]
#![allow(clippy::missing_safety_doc, reason = "each body's contract is the CUDA runtime's for its export")]

mod capture;
mod device;
mod errors;
mod functions;
mod launch;
mod memory;
mod register;
mod streams;

pub use capture::*;
pub use device::*;
pub use errors::*;
pub use functions::*;
pub use launch::*;
pub use memory::*;
pub use register::*;
pub use streams::*;

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{Op, OpClass};

use crate::client::Client;
use crate::ffi::cudaError_t;

/// Sends a request and waits for its reply. At a sync point, a deferred error of an earlier
/// asynchronous call is returned; the server sent the bytes of every copy the call covers before
/// its reply, so they have landed. A refused graph launch still owed is returned too (see
/// `capture`).
pub(crate) fn call<O: Op>(client: &Client, request: O) -> CudaResult<O::Reply> {
    let fields = client.call(request)?;
    if O::INFO.class == OpClass::SyncPoint {
        capture::take_owed_at_sync()?;
    }
    Ok(fields)
}

/// Queues an asynchronous request.
pub(crate) fn post<O: Op>(client: &Client, request: O) -> CudaResult<()> {
    client.post(request)
}

/// Every unsupported export: a clear error and one line naming the function.
pub fn unsupported(symbol: &str) -> cudaError_t {
    crate::diagnostics::once(symbol, &format!("flyt: {symbol} is not supported through Flyt (returning cudaErrorNotSupported)"));
    crate::ffi::set_last_error(CudaError::NOT_SUPPORTED);
    CudaError::NOT_SUPPORTED.code()
}

/// A supported function called with a flag or mode Flyt does not provide (`what`): a clear error
/// and one line naming both, once per process, rather than a success that skips what was asked.
pub(crate) fn unsupported_use(symbol: &str, what: &str) -> CudaError {
    let key = format!("{symbol} {what}");
    crate::diagnostics::once(&key, &format!("flyt: {symbol} with {what} is not supported through Flyt (returning cudaErrorNotSupported)"));
    CudaError::NOT_SUPPORTED
}
