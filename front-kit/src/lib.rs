//! `flyt-front-kit`: what Flyt's libraries that load into apps share. The client core
//! (`flyt-client`, inside Flyt's `libcuda.so.1`) and the fronts over it (Flyt's `libcudart.so.13`
//! and `libnvidia-ml.so.1`) each link a copy.

pub mod diagnostics;
pub mod driver_library;
pub mod ffi;
pub mod flyt_table;
pub mod pci;
