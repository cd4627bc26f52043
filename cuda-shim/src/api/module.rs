//! Module loading as NVIDIA's runtime asks for it through the CudartInterface export table (fat
//! binaries registered by `__cudaRegisterFatBinary`). Loading needs a GPU server, which this library
//! does not reach yet: each answers CUDA_ERROR_NOT_SUPPORTED and names itself once.

use std::ffi::{c_uint, c_void};

use crate::CUresult;
use crate::generated::types::{CUjit_option, CUmodule, CUmoduleLoadingMode};

/// Entry 1: a module from a fat binary (`__fatBinC_Wrapper_t` or a bare fat binary).
pub fn load_fat_binary(_module: *mut CUmodule, _fat_cubin: *const c_void) -> CUresult {
    crate::diagnostics::unsupported("module loading (CudartInterface ModuleLoadFatBinary)")
}

/// Entry 6: as entry 1, with host symbol relocations.
pub fn load_fat_binary_with_relocations(
    _module: *mut CUmodule,
    _fat_cubin: *const c_void,
    _symbol_names: *const *const std::ffi::c_char,
    _symbol_addresses: *mut *mut c_void,
    _count: c_uint,
) -> CUresult {
    crate::diagnostics::unsupported("module loading (CudartInterface ModuleLoadFatBinaryWithRelocations)")
}

/// Entry 8: a module hidden from tools, with JIT options (note the argument order: image first).
pub fn load_data_ex_hidden(
    _image: *const c_void,
    _module: *mut CUmodule,
    _options: *mut CUjit_option,
    _option_values: *mut *mut c_void,
    _count: c_uint,
) -> CUresult {
    crate::diagnostics::unsupported("module loading (CudartInterface ModuleLoadDataExHidden)")
}

/// `CU_MODULE_EAGER_LOADING` and `CU_MODULE_LAZY_LOADING`.
const EAGER_LOADING: CUmoduleLoadingMode = 1;
const LAZY_LOADING: CUmoduleLoadingMode = 2;

/// The loading mode the process asked for with `CUDA_MODULE_LOADING` (lazy unless `EAGER`, as the
/// driver's default is since CUDA 12.2). Answered in the process.
pub unsafe fn cuModuleGetLoadingMode(mode: *mut CUmoduleLoadingMode) -> CUresult {
    let value = match std::env::var("CUDA_MODULE_LOADING") {
        Ok(text) if text.eq_ignore_ascii_case("EAGER") => EAGER_LOADING,
        _ => LAZY_LOADING,
    };
    // SAFETY: the caller passes NULL (refused) or a writable mode.
    crate::ffi::finish(unsafe { crate::ffi::write_out(mode, value) })
}
