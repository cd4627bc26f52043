//! `libnvidia-ml.so.1`: Flyt's NVML as a shared library. All the logic is in `flyt-nvml`; this
//! crate only links it, with the soname NVML's users load (see `build.rs`).

pub use flyt_nvml::*;
