//! Registration hooks called by nvcc's generated code, mostly from static constructors before
//! `main`: they record locally (see `crate::registry`) and never reach the driver, except to
//! unload at exit what was loaded.

use std::ffi::{c_char, c_int, c_void};

use crate::ffi::dim3;
use crate::registry::{self, c_name, fat_binary_index};

pub unsafe fn __cudaRegisterFatBinary(fat_cubin: *mut c_void) -> *mut *mut c_void {
    // SAFETY: nvcc passes its `__fatBinC_Wrapper_t`.
    unsafe { registry::add_fat_binary(fat_cubin) }.unwrap_or_else(|| {
        crate::diagnostics::once("fatbin", "flyt: ignoring a fatbinary in a format this runtime does not know");
        std::ptr::null_mut()
    })
}

pub unsafe fn __cudaRegisterFatBinaryEnd(_handle: *mut *mut c_void) {}

pub unsafe fn __cudaUnregisterFatBinary(handle: *mut *mut c_void) {
    // SAFETY: `handle` came from `__cudaRegisterFatBinary`.
    if let Some(index) = unsafe { fat_binary_index(handle) } {
        registry::unload(index);
    }
}

#[allow(clippy::too_many_arguments, reason = "the C signature nvcc's registration code calls")]
pub unsafe fn __cudaRegisterFunction(
    handle: *mut *mut c_void,
    host_fun: *const c_char,
    _device_fun: *mut c_char,
    device_name: *const c_char,
    _thread_limit: c_int,
    _tid: *mut dim3,
    _bid: *mut dim3,
    _block: *mut dim3,
    _grid: *mut dim3,
    _warp_size: *mut c_int,
) {
    // SAFETY: `handle` came from `__cudaRegisterFatBinary`; `device_name` is a NUL-terminated
    // string in the app's image.
    if let (Some(index), Some(name)) = (unsafe { fat_binary_index(handle) }, unsafe { c_name(device_name) }) {
        registry::add_kernel(index, host_fun as usize, name);
    }
}

#[allow(clippy::too_many_arguments, reason = "the C signature nvcc's registration code calls")]
pub unsafe fn __cudaRegisterVar(
    handle: *mut *mut c_void,
    host_var: *mut c_char,
    _device_address: *mut c_char,
    device_name: *const c_char,
    _ext: c_int,
    size: usize,
    _constant: c_int,
    _global: c_int,
) {
    // SAFETY: as in `__cudaRegisterFunction`.
    if let (Some(index), Some(name)) = (unsafe { fat_binary_index(handle) }, unsafe { c_name(device_name) }) {
        registry::add_variable(index, host_var as usize, name, size);
    }
}

#[allow(clippy::too_many_arguments, reason = "the C signature nvcc's registration code calls")]
pub unsafe fn __cudaRegisterManagedVar(
    handle: *mut *mut c_void,
    host_var_ptr_address: *mut *mut c_void,
    _device_address: *mut c_char,
    device_name: *const c_char,
    _ext: c_int,
    _size: usize,
    _constant: c_int,
    _global: c_int,
) {
    // SAFETY: as in `__cudaRegisterFunction`.
    if let (Some(index), Some(name)) = (unsafe { fat_binary_index(handle) }, unsafe { c_name(device_name) })
        && !host_var_ptr_address.is_null()
    {
        registry::add_managed_variable(index, host_var_ptr_address as usize, name);
    }
}

/// nvcc's host code calls this before it first touches a `__managed__` variable: the fat binary
/// loads then and the variables' pointers are filled. Other fat binaries load when their first
/// kernel or variable is used. Returns whether the module is ready (1) or not (0).
pub unsafe fn __cudaInitModule(handle: *mut *mut c_void) -> c_char {
    // SAFETY: `handle` came from `__cudaRegisterFatBinary`.
    let Some(index) = (unsafe { fat_binary_index(handle) }) else {
        return 0;
    };
    match registry::init_managed(index) {
        Ok(()) => 1,
        Err(error) => {
            crate::ffi::set_last_error(error);
            0
        }
    }
}
