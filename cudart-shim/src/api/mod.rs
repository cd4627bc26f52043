//! The bodies of the implemented exports, one module per area. Each `unsafe fn` here is an FFI
//! edge: it checks what the app passed (NULL, flags, kinds, registered symbols), then calls the
//! driver API of Flyt's `libcuda.so.1` (`crate::driver`).

#![allow(non_snake_case, reason = "bodies carry the names of the CUDA exports they implement")]
#![allow(clippy::missing_safety_doc, reason = "each body's contract is the CUDA runtime's for its export")]

mod arrays;
mod device;
mod errors;
mod functions;
mod graph;
mod launch;
mod libraries;
mod managed;
mod memory;
mod peers;
mod pools;
mod register;
mod streams;
mod textures;

pub use arrays::*;
pub use device::*;
pub use errors::*;
pub use functions::*;
pub use graph::*;
pub use launch::*;
pub use libraries::*;
pub use managed::*;
pub use memory::*;
pub use peers::*;
pub use pools::*;
pub use register::*;
pub use streams::*;
pub use textures::*;

use flyt_protocol::CudaError;

use crate::ffi::cudaError_t;

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
