//! Registration hooks called by nvcc's generated code, mostly from static constructors before
//! `main`: they record locally and never open a session.

use std::ffi::{c_char, c_int, c_void};

use flyt_protocol::ops::req;

use super::post;
use crate::client::existing_client;
use crate::ffi::dim3;
use crate::registry::{self, c_name, image_from_wrapper, module_handle, module_id};

pub unsafe fn __cudaRegisterFatBinary(fat_cubin: *mut c_void) -> *mut *mut c_void {
    // SAFETY: nvcc passes its `__fatBinC_Wrapper_t`.
    let Some(image) = (unsafe { image_from_wrapper(fat_cubin) }) else {
        crate::diagnostics::once("fatbin", "flyt: ignoring a fatbinary in a format this runtime does not know");
        return std::ptr::null_mut();
    };
    module_handle(registry::add_module(image))
}

pub unsafe fn __cudaRegisterFatBinaryEnd(handle: *mut *mut c_void) {
    // SAFETY: `handle` came from `__cudaRegisterFatBinary`.
    if let Some(id) = unsafe { module_id(handle) } {
        registry::complete_module(id);
        if let Some(client) = existing_client() {
            registry::send_module(&client.conn, id);
        }
    }
}

pub unsafe fn __cudaUnregisterFatBinary(handle: *mut *mut c_void) {
    // At exit: tell a live session, but never open one for this.
    // SAFETY: `handle` came from `__cudaRegisterFatBinary`.
    if let (Some(id), Some(client)) = (unsafe { module_id(handle) }, existing_client())
        && registry::held_by_server(&client.conn, id)
    {
        let _ = post(client, req::UnregisterModule { module: id });
        let _ = client.conn.flush();
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
    if let (Some(id), Some(name)) = (unsafe { module_id(handle) }, unsafe { c_name(device_name) }) {
        registry::add_function(id, host_fun as usize, name);
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
    if let (Some(id), Some(name)) = (unsafe { module_id(handle) }, unsafe { c_name(device_name) }) {
        registry::add_variable(id, host_var as usize, name, size);
    }
}

pub unsafe fn __cudaInitModule(handle: *mut *mut c_void) -> c_char {
    // Modules load when their first kernel or variable is used; report whether the handle is ours.
    // SAFETY: `handle` came from `__cudaRegisterFatBinary`.
    c_char::from(unsafe { module_id(handle) }.is_some())
}
