//! Hardware decompression (`cuMemBatchDecompressAsync`): each operation's buffers must be device
//! memory of the session, checked here and by the server; the server's driver runs the batch on
//! its decompression engine, and a GPU without one answers its own error, which reaches the app
//! as the driver gave it, with the index it names.

use std::ffi::c_uint;

use flyt_protocol::CudaError;
use flyt_protocol::ops::DecompressOp;

use super::session::{client, driver_error, resolve_stream, run};
use crate::CUresult;
use crate::ffi::{DriverResult, non_null};
use crate::generated::types::{CUmemDecompressParams, CUstream};

/// Writes the index an error is about where the app asked for it (`errorIndex` may be NULL):
/// `SIZE_MAX` for the batch as a whole; `None` leaves it as the server's driver left its own.
fn report_index(error_index: *mut usize, index: Option<u64>) {
    if let (false, Some(index)) = (error_index.is_null(), index) {
        let index = usize::try_from(index).unwrap_or(usize::MAX);
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { error_index.write(index) };
    }
}

fn emulated_has_no_engine() {
    crate::diagnostics::once(
        "decompress-emulated",
        "flyt: cuMemBatchDecompressAsync: the server's emulated device has no decompression engine (returning CUDA_ERROR_NOT_SUPPORTED)",
    );
}

fn decompress(
    params_array: *mut CUmemDecompressParams,
    count: usize,
    flags: c_uint,
    error_index: *mut usize,
    stream: CUstream,
    per_thread: bool,
) -> DriverResult {
    let fail = |error: CUresult, index: Option<u64>| {
        report_index(error_index, index);
        Err(error)
    };
    // A device without the engine answers every batch so, its arguments unread and the index
    // untouched, as the driver does (an H200: even an empty batch).
    let ordinal = crate::context::current_or_primary()?.device();
    if crate::driver::driver()
        .session()?
        .device(ordinal)?
        .attribute(flyt_protocol::device::attr::MEM_DECOMPRESS_ALGORITHM_MASK)
        .unwrap_or(0)
        == 0
    {
        if client()?.emulated() {
            emulated_has_no_engine();
        }
        return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    if count == 0 || flags != 0 {
        return fail(CUresult::CUDA_ERROR_INVALID_VALUE, Some(u64::MAX));
    }
    if non_null([params_array.cast()]).is_err() {
        return fail(CUresult::CUDA_ERROR_INVALID_VALUE, Some(u64::MAX));
    }
    // SAFETY: checked non-NULL; the caller's array of `count` operations.
    let params = unsafe { std::slice::from_raw_parts(params_array, count) };
    let mut ops = Vec::with_capacity(count);
    for (index, p) in params.iter().enumerate() {
        // The unused bytes must be zero, as the driver documents.
        if p.padding != [0; 20] {
            return fail(CUresult::CUDA_ERROR_INVALID_VALUE, Some(index as u64));
        }
        ops.push(DecompressOp {
            src: p.src as u64,
            src_len: p.srcNumBytes as u64,
            dst: p.dst as u64,
            dst_len: p.dstNumBytes as u64,
            dst_act_bytes: p.dstActBytes as u64,
            algo: p.algo,
        });
    }
    let client = client()?;
    let stream = resolve_stream(client, stream, per_thread)?;
    match client.batch_decompress(ops, stream) {
        Ok(()) => Ok(()),
        Err((error, index)) => {
            if error == CudaError::NOT_SUPPORTED && client.emulated() {
                emulated_has_no_engine();
            }
            fail(driver_error(error), index)
        }
    }
}

per_thread_twins! {
    cuMemBatchDecompressAsync, cuMemBatchDecompressAsync_ptsz
        (
            params_array: *mut CUmemDecompressParams,
            count: usize,
            flags: c_uint,
            error_index: *mut usize,
            stream: CUstream,
        )
        |per_thread| run(|| decompress(params_array, count, flags, error_index, stream, per_thread))
}
