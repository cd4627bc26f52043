//! Error queries, answered locally with the CUDA runtime's own names and messages, and the
//! other pure helpers.

use std::collections::HashMap;
use std::ffi::{CString, c_char, c_int, c_uint, c_void};

use flyt_protocol::error::CudaResult;
use std::sync::LazyLock;

use flyt_protocol::error::{message_of, name_of};

use crate::driver::cu;
use crate::ffi::{cudaChannelFormatDesc, cudaError_t, peek_last_error, take_last_error};

/// NUL-terminated copies of the names and messages, built once; the pointers handed to the app
/// stay valid for the life of the process.
static TEXTS: LazyLock<HashMap<cudaError_t, (CString, CString)>> = LazyLock::new(|| {
    (0..100_000u32)
        .filter(|code| name_of(*code) != name_of(u32::MAX))
        .map(|code| {
            let c = |text: &str| CString::new(text).unwrap_or_default();
            (code, (c(name_of(code)), c(message_of(code))))
        })
        .collect()
});
static UNRECOGNIZED: LazyLock<CString> = LazyLock::new(|| CString::new(name_of(u32::MAX)).unwrap_or_default());

pub unsafe fn cudaGetLastError() -> cudaError_t {
    take_last_error()
}

pub unsafe fn cudaPeekAtLastError() -> cudaError_t {
    peek_last_error()
}

pub unsafe fn cudaGetErrorName(error: cudaError_t) -> *const c_char {
    TEXTS.get(&error).map_or(UNRECOGNIZED.as_ptr(), |(name, _)| name.as_ptr())
}

pub unsafe fn cudaGetErrorString(error: cudaError_t) -> *const c_char {
    TEXTS.get(&error).map_or(UNRECOGNIZED.as_ptr(), |(_, message)| message.as_ptr())
}

pub unsafe fn cudaCreateChannelDesc(x: c_int, y: c_int, z: c_int, w: c_int, f: c_int) -> cudaChannelFormatDesc {
    cudaChannelFormatDesc { x, y, z, w, f }
}

// The error log is the driver's (`cuLogs*`): the runtime's functions are the same calls.

pub unsafe fn cudaLogsRegisterCallback(
    callback: flyt_cuda_sys::types::CUlogsCallback,
    data: *mut c_void,
    handle: *mut *mut c_void,
) -> CudaResult<()> {
    cu!(cuLogsRegisterCallback(callback, data, handle.cast()))
}

pub unsafe fn cudaLogsUnregisterCallback(handle: *mut c_void) -> CudaResult<()> {
    cu!(cuLogsUnregisterCallback(handle.cast()))
}

pub unsafe fn cudaLogsCurrent(iterator: *mut c_uint, flags: c_uint) -> CudaResult<()> {
    cu!(cuLogsCurrent(iterator, flags))
}

pub unsafe fn cudaLogsDumpToFile(iterator: *mut c_uint, path: *const c_char, flags: c_uint) -> CudaResult<()> {
    cu!(cuLogsDumpToFile(iterator, path, flags))
}

pub unsafe fn cudaLogsDumpToMemory(iterator: *mut c_uint, buffer: *mut c_char, size: *mut usize, flags: c_uint) -> CudaResult<()> {
    cu!(cuLogsDumpToMemory(iterator, buffer, size, flags))
}
