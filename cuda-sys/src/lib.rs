//! `flyt-cuda-sys`: the CUDA driver API's C declarations, once for every crate of Flyt.
//!
//! [`generated`] is written by `tools/gen-cuda-tables/generate` from the CUDA 13.0 headers (CI regenerates
//! it and fails on a difference): the C types ([`types`]), one row per function NVIDIA's `libcuda.so.1`
//! exports ([`for_each_driver_api!`]) and the `CUresult` codes with their names and strings ([`errors`]).
//! [`DriverTable`] is expanded from the same rows: a pointer per export, looked up by name in a loaded
//! library, so a crate that calls a driver (the server's CUDA backend calls NVIDIA's, the runtime front
//! calls Flyt's) types no signature of its own. Nothing here depends on the rest of Flyt.
//!
//! A hand-typed copy of a generated name outside this crate fails CI (`tools/check-one-declaration`).

#[macro_use]
#[rustfmt::skip]
pub mod generated;

mod driver_table;

pub use driver_table::{DriverTable, OpaqueSymbol};
pub use generated::errors::{self, CUresult};
pub use generated::types;
