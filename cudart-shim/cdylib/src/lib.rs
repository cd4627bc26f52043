//! `libcudart.so.13`: the Flyt shim as a shared library. All the logic is in `flyt-cudart`; this
//! crate only links it, with the version script and soname the CUDA runtime's users expect
//! (see `build.rs`).

pub use flyt_cudart::*;
