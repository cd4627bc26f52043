//! The bodies of the implemented exports, one module per area. Each `unsafe fn` here is an FFI
//! edge: it checks what the app passed (NULL, flags, kinds, registered symbols), then calls the
//! driver API of Flyt's `libcuda.so.1` (`crate::driver`).

#![allow(non_snake_case, reason = "bodies carry the names of the CUDA exports they implement")]
#![allow(clippy::missing_safety_doc, reason = "each body's contract is the CUDA runtime's for its export")]

/// Declares the entry points of one copy or memset over one body: the synchronous call and its
/// per-thread default stream (`_ptds`) twin, and where named the asynchronous call on a stream and
/// its `_ptsz` twin. The body sees the call's parameters plus `|stream, mode, per_thread|`.
macro_rules! stream_entry_points {
    ([$sync:ident, $sync_ptds:ident $(,)?] ($($arg:ident: $ty:ty),* $(,)?) |$stream:ident, $mode:ident, $per_thread:ident| $body:expr) => {
        stream_entry_points!(@one $sync, ($($arg: $ty),*), (), (std::ptr::null_mut(), super::memory::Mode::Synchronous, false), |$stream, $mode, $per_thread| $body);
        stream_entry_points!(@one $sync_ptds, ($($arg: $ty),*), (), (std::ptr::null_mut(), super::memory::Mode::Synchronous, true), |$stream, $mode, $per_thread| $body);
    };
    ([$sync:ident, $sync_ptds:ident, $async_:ident, $async_ptsz:ident $(,)?] ($($arg:ident: $ty:ty),* $(,)?) |$stream:ident, $mode:ident, $per_thread:ident| $body:expr) => {
        stream_entry_points!([$sync, $sync_ptds] ($($arg: $ty),*) |$stream, $mode, $per_thread| $body);
        stream_entry_points!(@one $async_, ($($arg: $ty),*), ($stream), ($stream, super::memory::Mode::Asynchronous, false), |$stream, $mode, $per_thread| $body);
        stream_entry_points!(@one $async_ptsz, ($($arg: $ty),*), ($stream), ($stream, super::memory::Mode::Asynchronous, true), |$stream, $mode, $per_thread| $body);
    };
    (@one $name:ident, ($($arg:ident: $ty:ty),*), ($($stream_arg:ident)?), ($stream_value:expr, $mode_value:expr, $per_thread_value:expr), |$stream:ident, $mode:ident, $per_thread:ident| $body:expr) => {
        #[allow(clippy::too_many_arguments, reason = "the CUDA export's parameters")]
        pub unsafe fn $name($($arg: $ty,)* $($stream_arg: $crate::ffi::cudaStream_t)?) -> flyt_protocol::error::CudaResult<()> {
            let ($stream, $mode, $per_thread): ($crate::ffi::cudaStream_t, super::memory::Mode, bool) = ($stream_value, $mode_value, $per_thread_value);
            $body
        }
    };
}

/// Declares an export and its per-thread default stream twin (`_ptsz`): each one driver call, the
/// twin's to the driver's per-thread entry point with the same arguments, or one body that sees
/// `|per_thread|`.
macro_rules! per_thread_twins {
    ($(#[$meta:meta])* $name:ident, $name_pt:ident ($($arg:ident: $ty:ty),* $(,)?) => $driver:ident, $driver_pt:ident ($($call:expr),* $(,)?)) => {
        $(#[$meta])*
        #[allow(clippy::too_many_arguments, reason = "the CUDA export's parameters")]
        pub unsafe fn $name($($arg: $ty),*) -> flyt_protocol::error::CudaResult<()> {
            $crate::driver::cu_ctx!($driver($($call),*))
        }

        #[allow(clippy::too_many_arguments, reason = "the CUDA export's parameters")]
        pub unsafe fn $name_pt($($arg: $ty),*) -> flyt_protocol::error::CudaResult<()> {
            $crate::driver::cu_ctx!($driver_pt($($call),*))
        }
    };
    ($(#[$meta:meta])* $name:ident, $name_pt:ident ($($arg:ident: $ty:ty),* $(,)?) |$per_thread:ident| $body:expr) => {
        $(#[$meta])*
        #[allow(clippy::too_many_arguments, reason = "the CUDA export's parameters")]
        pub unsafe fn $name($($arg: $ty),*) -> flyt_protocol::error::CudaResult<()> {
            let $per_thread = false;
            $body
        }

        #[allow(clippy::too_many_arguments, reason = "the CUDA export's parameters")]
        pub unsafe fn $name_pt($($arg: $ty),*) -> flyt_protocol::error::CudaResult<()> {
            let $per_thread = true;
            $body
        }
    };
}

/// Declares exports that are each one driver call with the app's arguments (converted where the
/// runtime's types differ), as a table of `export(parameters) => driver(arguments);`.
macro_rules! driver_forwards {
    ($($(#[$meta:meta])* $name:ident($($arg:ident: $ty:ty),* $(,)?) => $driver:ident($($call:expr),* $(,)?);)*) => {
        $(
            $(#[$meta])*
            #[allow(clippy::too_many_arguments, reason = "the CUDA export's parameters")]
            pub unsafe fn $name($($arg: $ty),*) -> flyt_protocol::error::CudaResult<()> {
                $crate::driver::cu_ctx!($driver($($call),*))
            }
        )*
    };
}

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
