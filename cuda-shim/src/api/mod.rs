//! The implemented driver functions, one Rust function per implemented row of the table, with the row's
//! exact signature (the exports call them by name).
//!
//! Out-parameters are written only on success; NULL where the driver needs a pointer is
//! CUDA_ERROR_INVALID_VALUE.

#![allow(non_snake_case, reason = "the driver's names")]
#![allow(clippy::missing_safety_doc, reason = "each function's contract is the CUDA driver API's")]

/// Declares a driver function and its per-thread default stream twin (`_ptsz` or `_ptds`) over
/// one body, which sees `|per_thread|` (false for the first, true for the twin).
macro_rules! per_thread_twins {
    ($(#[$meta:meta])* $name:ident, $name_pt:ident ($($arg:ident: $ty:ty),* $(,)?) |$per_thread:ident| $body:expr) => {
        $(#[$meta])*
        #[allow(clippy::too_many_arguments, reason = "the driver function's parameters")]
        pub unsafe fn $name($($arg: $ty),*) -> $crate::CUresult {
            let $per_thread = false;
            $body
        }

        #[allow(clippy::too_many_arguments, reason = "the driver function's parameters")]
        pub unsafe fn $name_pt($($arg: $ty),*) -> $crate::CUresult {
            let $per_thread = true;
            $body
        }
    };
}

/// Declares one driver function under several export names (a later version that kept the ABI):
/// each name gets the parameters and the body.
macro_rules! export_names {
    ([$($name:ident),+ $(,)?] $params:tt $body:block) => {
        $(export_names!(@one $name $params $body);)+
    };
    (@one $name:ident ($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        #[allow(clippy::too_many_arguments, reason = "the driver function's parameters")]
        pub unsafe fn $name($($arg: $ty),*) -> $crate::CUresult $body
    };
}

mod arrays;
mod capture;
mod context;
mod decompress;
mod device;
mod graph;
mod green;
pub(crate) mod init;
mod ipc;
mod link;
mod logs;
mod managed;
mod memops;
mod memory;
pub mod module;
mod pools;
mod session;
mod shaped;
mod stream;
mod vmm;

pub use arrays::*;
pub use capture::*;
pub use context::*;
pub use decompress::*;
pub use device::*;
pub use graph::*;
pub use green::*;
pub use init::*;
pub use ipc::*;
pub use link::*;
pub use logs::*;
pub use managed::*;
pub use memops::*;
pub use memory::*;
pub use module::*;
pub use pools::*;
pub use shaped::*;
pub use stream::*;
pub use vmm::*;
