//! `flyt-cuda`: Flyt's `libcuda.so.1`, the CUDA driver API inside an unmodified program's process.
//!
//! NVIDIA's runtime (static or shared), its libraries (cuBLAS, cuDNN, ...) and PyTorch all load the driver
//! with `dlopen("libcuda.so.1")`; this crate is what they find. Every one of the 707 functions NVIDIA's
//! driver exports is declared once, in the generated [`flyt_cuda_sys::for_each_driver_api!`] table, and exported from
//! [`exports`]: implemented rows call [`api`], the others answer CUDA_ERROR_NOT_SUPPORTED and name
//! themselves once on stderr.
//!
//! What lives here needs no GPU server: device queries answered from what a [`driver::DeviceSource`]
//! reported once, contexts and the per-thread context stack, context-local storage, `cuGetProcAddress`
//! (a generated map of the real driver's answers) and `cuGetExportTable` (the undocumented tables NVIDIA's
//! runtime needs, including its integrity check, computed here). Nothing here panics across the C ABI.
//!
//! The logic lives in this rlib so it can be tested as Rust; the `cdylib/` crate only links it as
//! `libcuda.so.1`.
#![allow(clippy::cast_possible_truncation, reason = "Flyt runs on 64-bit Linux only: pointers and sizes are 64-bit")]

#[rustfmt::skip]
pub mod generated;

pub mod api;
pub mod client_source;
pub mod context;
pub mod diagnostics;
pub mod driver;
pub mod export_tables;
pub mod exports;
pub mod ffi;
pub mod integrity;
pub mod logs;
pub mod proc_address;
pub mod testing;

pub use generated::errors::CUresult;
