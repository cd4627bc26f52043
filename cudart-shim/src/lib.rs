//! `flyt-cudart`: Flyt's CUDA runtime, loaded into `-cudart=shared` apps as `libcudart.so.13`.
//!
//! Every export of the CUDA 13 runtime is declared once in [`exports`]; implemented ones turn
//! into messages to a `flyt-rpc-server` (see `flyt_protocol::ops`), answered locally where CUDA
//! allows (properties, last error, launch configuration), asynchronously where CUDA is
//! asynchronous (launches, memsets, host-to-device copies, stream and event creation), and
//! unsupported ones fail with `cudaErrorNotSupported` and a one-line message. Nothing here panics
//! across the C ABI.
//!
//! The logic lives in this rlib so it can be tested as Rust; the `cdylib/` crate only re-exports
//! it as `libcudart.so.13`.
#![allow(
    clippy::cast_possible_truncation,
    reason = "Flyt runs on 64-bit Linux only: sizes and addresses cross the wire as u64 and fit usize"
)]

pub mod api;
pub mod exports;
pub mod ffi;
pub mod props;

// The client core, under the names the bodies have always used.
pub use flyt_client::{client, conn, diagnostics, registry, shm, stats, streams, transfer};
