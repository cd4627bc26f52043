//! `flyt-cudart`: Flyt's CUDA runtime, loaded into `-cudart=shared` apps as `libcudart.so.13`.
//!
//! A front over the driver API of Flyt's `libcuda.so.1` ([`driver`]), as NVIDIA's runtime is a
//! front over NVIDIA's driver: the driver library holds the process's one session, so a program
//! that mixes this runtime with NVIDIA's libraries (which carry their own runtime and call the
//! driver) has one session and one address space. What is the runtime's own stays here: the
//! export table ([`exports`]), the C types, the thread's last error and device, `<<<...>>>`
//! configurations, the kernels and variables nvcc registers (loaded as driver libraries on first
//! use), and the runtime structs (graph nodes, arrays, 3D copies, texture objects), converted to
//! the driver's. Unsupported exports fail with `cudaErrorNotSupported` and a one-line message.
//! Nothing here panics across the C ABI.
//!
//! The logic lives in this rlib so it can be tested as Rust; the `cdylib/` crate only re-exports
//! it as `libcudart.so.13`.
#![allow(
    clippy::cast_possible_truncation,
    reason = "Flyt runs on 64-bit Linux only: sizes and addresses cross the wire as u64 and fit usize"
)]

pub mod api;
pub use flyt_front_kit::diagnostics;
pub mod driver;
pub mod exports;
pub mod ffi;
pub mod props;
pub mod registry;
