//! Module loading as NVIDIA's runtime asks for it through the CudartInterface export table (fat
//! binaries registered by `__cudaRegisterFatBinary`). Loading needs a GPU server, which this library
//! does not reach yet: each answers CUDA_ERROR_NOT_SUPPORTED and names itself once.

use std::ffi::{c_uint, c_void};

use crate::CUresult;
use crate::generated::types::{CUjit_option, CUmodule};

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
