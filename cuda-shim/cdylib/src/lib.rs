//! `libcuda.so.1`: Flyt's CUDA driver library. All the logic is in `flyt-cuda`; this crate only links it as
//! a shared library with the driver's soname (see `build.rs`) and runs its unload hook.

pub use flyt_cuda::*;

/// Runs when the library is unloaded or the process exits: from then on every call answers
/// CUDA_ERROR_DEINITIALIZED without blocking, as NVIDIA's driver does during teardown.
extern "C" fn on_unload() {
    flyt_cuda::driver::on_unload();
}

// SAFETY: `.fini_array` holds pointers to `extern "C" fn()` run by the loader at unload; `on_unload` is one and
// only flips an atomic flag.
#[used]
#[unsafe(link_section = ".fini_array")]
static ON_UNLOAD: extern "C" fn() = on_unload;
