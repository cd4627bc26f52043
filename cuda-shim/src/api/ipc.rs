//! CUDA IPC (`cuIpc*`): handles are the server driver's, so memory and events exported by one
//! session open in another served on the same GPU (see `flyt_client::ipc`).

use std::ffi::{c_char, c_uint};

use super::session::{client, driver_error, run};
use crate::CUresult;
use crate::ffi::{non_null, write_out};
use crate::generated::types::{CUdeviceptr, CUevent, CUipcEventHandle, CUipcMemHandle};

/// The server's answer, with a line when its device cannot share memory between processes: a
/// server without a GPU, or memory the server maps itself, which the driver exports by no IPC
/// handle (all of a session's while the server pages sessions out, `--oversubscribe`).
fn shared<T>(result: flyt_protocol::error::CudaResult<T>) -> crate::ffi::DriverResult<T> {
    result.map_err(|error| match error {
        flyt_protocol::CudaError::NOT_SUPPORTED => crate::diagnostics::unsupported(
            "CUDA IPC on a GPU server without a GPU or one that maps the memory itself (it pages sessions: --oversubscribe; its log says which)",
        ),
        error => driver_error(error),
    })
}

fn bytes(reserved: [c_char; 64]) -> [u8; 64] {
    reserved.map(|byte| byte as u8)
}

fn reserved(bytes: [u8; 64]) -> [c_char; 64] {
    bytes.map(|byte| byte as c_char)
}

pub unsafe fn cuIpcGetMemHandle(p_handle: *mut CUipcMemHandle, dptr: CUdeviceptr) -> CUresult {
    run(|| {
        non_null([p_handle.cast()])?;
        let handle = shared(client()?.ipc_get_mem_handle(dptr))?;
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(p_handle, CUipcMemHandle { reserved: reserved(handle) }) }
    })
}

/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`.
const LAZY_ENABLE_PEER_ACCESS: c_uint = 0x1;

pub unsafe fn cuIpcOpenMemHandle_v2(pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint) -> CUresult {
    run(|| {
        non_null([pdptr.cast()])?;
        if flags & !LAZY_ENABLE_PEER_ACCESS != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let ptr = shared(client()?.ipc_open_mem_handle(bytes(handle.reserved), flags))?;
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(pdptr, ptr) }
    })
}

pub unsafe fn cuIpcOpenMemHandle(pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuIpcOpenMemHandle_v2(pdptr, handle, flags) }
}

pub unsafe fn cuIpcCloseMemHandle(dptr: CUdeviceptr) -> CUresult {
    run(|| client()?.ipc_close_mem_handle(dptr).map_err(driver_error))
}

pub unsafe fn cuIpcGetEventHandle(p_handle: *mut CUipcEventHandle, event: CUevent) -> CUresult {
    run(|| {
        non_null([p_handle.cast()])?;
        let handle = shared(client()?.ipc_get_event_handle(event as u64))?;
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(p_handle, CUipcEventHandle { reserved: reserved(handle) }) }
    })
}

pub unsafe fn cuIpcOpenEventHandle(ph_event: *mut CUevent, handle: CUipcEventHandle) -> CUresult {
    run(|| {
        non_null([ph_event.cast()])?;
        let event = shared(client()?.ipc_open_event_handle(bytes(handle.reserved)))?;
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(ph_event, event as usize as CUevent) }
    })
}
