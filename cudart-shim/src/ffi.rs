//! The C ABI edge: C types, the panic boundary every export goes through, the per-thread last
//! error, and pointer checks.

#![allow(non_camel_case_types, reason = "C type names, as the CUDA headers spell them")]

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint, c_void};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;

/// `cudaError_t` as it crosses the C ABI.
pub type cudaError_t = u32;
pub type cudaStream_t = *mut c_void;
pub type cudaEvent_t = *mut c_void;
pub type cudaKernel_t = *mut c_void;
pub type cudaMemcpyKind = c_int;
/// The runtime's arrays are the driver's (`CUarray`), as is what the app holds.
pub type cudaArray_t = crate::driver::CUarray;
pub type cudaMipmappedArray_t = crate::driver::CUmipmappedArray;
/// The runtime's graphs, libraries and IPC handles are the driver's (cuda_runtime_api.h declares
/// them so: `typedef struct CUgraph_st *cudaGraph_t`).
pub type cudaGraph_t = crate::driver::CUgraph;
pub type cudaGraphNode_t = crate::driver::CUgraphNode;
pub type cudaGraphExec_t = crate::driver::CUgraphExec;
pub type cudaLibrary_t = crate::driver::CUlibrary;
pub type cudaIpcMemHandle_t = crate::driver::CUipcMemHandle;
pub type cudaIpcEventHandle_t = crate::driver::CUipcEventHandle;
pub type cudaTextureObject_t = std::ffi::c_ulonglong;
pub type cudaSurfaceObject_t = std::ffi::c_ulonglong;

/// `dim3` / `uint3`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct dim3 {
    pub x: c_uint,
    pub y: c_uint,
    pub z: c_uint,
}

/// `cudaChannelFormatDesc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct cudaChannelFormatDesc {
    pub x: c_int,
    pub y: c_int,
    pub z: c_int,
    pub w: c_int,
    pub f: c_int,
}

thread_local! {
    static LAST_ERROR: Cell<cudaError_t> = const { Cell::new(0) };
}

/// Records `error` as the calling thread's last error. Reached through `try_with`, so a call
/// from a thread-exit destructor degrades instead of panicking.
pub fn set_last_error(error: CudaError) {
    let _ = LAST_ERROR.try_with(|last| last.set(error.code()));
}

/// `cudaGetLastError`: returns and clears.
pub fn take_last_error() -> cudaError_t {
    LAST_ERROR.try_with(|last| last.replace(0)).unwrap_or(0)
}

/// `cudaPeekAtLastError`: returns without clearing.
pub fn peek_last_error() -> cudaError_t {
    LAST_ERROR.try_with(Cell::get).unwrap_or(0)
}

/// What an export returns if its body panicked: a defined, failing value.
pub trait PanicValue {
    fn on_panic() -> Self;
}

impl PanicValue for u32 {
    fn on_panic() -> Self {
        CudaError::UNKNOWN.code()
    }
}

impl PanicValue for () {
    fn on_panic() -> Self {}
}

impl PanicValue for c_char {
    fn on_panic() -> Self {
        0
    }
}

impl<T> PanicValue for *mut T {
    fn on_panic() -> Self {
        std::ptr::null_mut()
    }
}

impl<T> PanicValue for *const T {
    fn on_panic() -> Self {
        std::ptr::null()
    }
}

impl PanicValue for cudaChannelFormatDesc {
    fn on_panic() -> Self {
        Self::default()
    }
}

/// Runs an export's body; a panic never crosses into the app: it is reported once on stderr and
/// becomes `cudaErrorUnknown` (or the return type's failing value).
pub fn boundary<R: PanicValue>(symbol: &'static str, body: impl FnOnce() -> R) -> R {
    flyt_front_kit::ffi::catch_panic(symbol, body, || {
        set_last_error(CudaError::UNKNOWN);
        R::on_panic()
    })
}

/// Converts a checked export's result to `cudaError_t`, recording failures as the last error.
pub fn finish(result: CudaResult<()>) -> cudaError_t {
    match result {
        Ok(()) => 0,
        // A query's "not ready" is an answer, not a failure: CUDA leaves the last error alone.
        Err(CudaError::NOT_READY) => CudaError::NOT_READY.code(),
        Err(error) => {
            set_last_error(error);
            error.code()
        }
    }
}

/// Writes an out-parameter; NULL is `cudaErrorInvalidValue`. Out-parameters are written only on
/// success, so callers compute first and write last.
///
/// # Safety
/// `out` is NULL or valid for a write of `T`, as the CUDA API contract requires of the caller.
pub unsafe fn write_out<T>(out: *mut T, value: T) -> CudaResult<()> {
    // SAFETY: forwarded contract.
    unsafe { flyt_front_kit::ffi::write_out(out, value, CudaError::INVALID_VALUE) }
}

/// A host buffer the app passed, as a byte slice (`len == 0` with NULL is an empty slice).
///
/// # Safety
/// `ptr` is NULL or valid for reads of `len` bytes for the returned lifetime.
pub unsafe fn host_slice<'a>(ptr: *const c_void, len: usize) -> CudaResult<&'a [u8]> {
    match (ptr.is_null(), len) {
        (_, 0) => Ok(&[]),
        (true, _) => Err(CudaError::INVALID_VALUE),
        // SAFETY: non-null and valid for `len` bytes per this function's contract.
        (false, _) => Ok(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }),
    }
}

/// A host buffer the app passed for writing.
///
/// # Safety
/// `ptr` is NULL or valid for writes of `len` bytes for the returned lifetime, and nothing else
/// accesses it meanwhile.
pub unsafe fn host_slice_mut<'a>(ptr: *mut c_void, len: usize) -> CudaResult<&'a mut [u8]> {
    match (ptr.is_null(), len) {
        (_, 0) => Ok(&mut []),
        (true, _) => Err(CudaError::INVALID_VALUE),
        // SAFETY: non-null and valid for `len` bytes per this function's contract.
        (false, _) => Ok(unsafe { std::slice::from_raw_parts_mut(ptr.cast::<u8>(), len) }),
    }
}
