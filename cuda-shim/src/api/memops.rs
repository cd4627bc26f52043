//! Stream memory operations (`cuStreamWriteValue*`, `cuStreamWaitValue*`, `cuStreamBatchMemOp`)
//! and tensor maps (`cuTensorMapEncode*`, `cuTensorMapReplaceAddress`), through the session.
//!
//! Memory operations are queued like copies (no round trip): each word must be device memory of
//! the session or pinned host memory the server mapped at its address, which is checked here and
//! again on the server. On the emulated device, whose work completes at submission, a wait that
//! no earlier work satisfied fails at the call with `CUDA_ERROR_NOT_SUPPORTED` and one line. Remote-write flushes are refused with one line: `CAN_FLUSH_REMOTE_WRITES`
//! reads 0 through Flyt. Tensor maps are encoded by the server's driver, which validates them;
//! the 128 bytes come back into the app's `CUtensorMap`.

#![allow(clippy::too_many_arguments, reason = "the driver API's signatures")]

use std::ffi::{c_int, c_uint, c_void};

use flyt_client::client::Client;
use flyt_protocol::ops::{StreamMemOp, TENSOR_MAP_SIZE, TensorMapLayout, TensorMapParams, mem_op, req};

use super::session::{client, driver_error, resolve_stream, run};
use crate::CUresult;
use crate::ffi::{DriverResult, non_null};
use crate::generated::types::{
    CUdeviceptr, CUstream, CUstreamBatchMemOpParams, CUtensorMap, CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapIm2ColWideMode,
    CUtensorMapInterleave, CUtensorMapL2promotion, CUtensorMapSwizzle, cuuint32_t, cuuint64_t,
};

/// Which API generation an entry point is: the v1 forms (`cuStreamWriteValue32`) take
/// `CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER` and no barrier ops; the v2 forms the reverse.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Api {
    V1,
    V2,
}

fn refuse_flush(name: &str) -> CUresult {
    crate::diagnostics::once(
        "memop-flush",
        &format!("flyt: {name}: flushing remote writes is not supported through Flyt (returning CUDA_ERROR_NOT_SUPPORTED)"),
    );
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

/// Checks an op as the driver would and puts it in the form the server takes (v2 flags).
fn checked_op(client: &Client, name: &str, mut op: StreamMemOp, api: Api) -> DriverResult<StreamMemOp> {
    match op.kind {
        mem_op::FLUSH_REMOTE_WRITES => return Err(refuse_flush(name)),
        mem_op::BARRIER if api == Api::V2 && matches!(op.flags, mem_op::BARRIER_SYS | mem_op::BARRIER_GPU) => return Ok(op),
        mem_op::WAIT_VALUE_32 | mem_op::WAIT_VALUE_64 => {
            if op.flags & mem_op::WAIT_FLUSH != 0 {
                return Err(refuse_flush(name));
            }
            if op.flags > mem_op::WAIT_NOR {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
        }
        mem_op::WRITE_VALUE_32 | mem_op::WRITE_VALUE_64 => match (op.flags, api) {
            (0, _) => {}
            // Without it the write is fenced: stronger, and what the v2 API always does.
            (mem_op::WRITE_NO_MEMORY_BARRIER, Api::V1) => op.flags = 0,
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        },
        _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
    let width = op.width().ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if !op.address.is_multiple_of(width) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    client.check_device_accessible(op.address, width).map_err(driver_error)?;
    Ok(op)
}

fn queue(name: &str, stream: CUstream, ops: &[StreamMemOp], api: Api, ptsz: bool) -> DriverResult {
    let client = client()?;
    let stream = resolve_stream(client, stream, ptsz)?;
    let ops = ops.iter().map(|op| checked_op(client, name, *op, api)).collect::<DriverResult<Vec<_>>>()?;
    if ops.is_empty() {
        return Ok(());
    }
    let waits = ops.iter().any(StreamMemOp::is_wait);
    // Mirrored memory (`flyt_client::mirrors`) has the host's bytes before the operations read
    // it, and is fetched at the next sync after they write it.
    client.push_mirrors().map_err(driver_error)?;
    client.post(req::StreamMemOps { stream, ops }).map_err(driver_error)?;
    client.mirrors().note_device_write();
    if waits && client.emulated() && !client.graphs().any_capture() {
        // The emulated device has run the ops already (work completes at submission), so asking
        // now costs a round trip and changes nothing: a wait no earlier work satisfied fails
        // here, at the call, with its line, rather than at some later synchronization.
        if let Err(error) = client.call(req::StreamSynchronize { stream }) {
            if error == flyt_protocol::CudaError::NOT_SUPPORTED {
                crate::diagnostics::once(
                    "memop-emulated-wait",
                    &format!(
                        "flyt: {name}: the server's emulated device runs work at submission, so a wait that no earlier work satisfied would never end (returning CUDA_ERROR_NOT_SUPPORTED)"
                    ),
                );
            }
            return Err(driver_error(error));
        }
    }
    Ok(())
}

macro_rules! single_ops {
    ($($name:ident ($value_ty:ty) => $kind:expr, $api:ident, $ptsz:literal;)*) => {$(
        pub unsafe fn $name(stream: CUstream, addr: CUdeviceptr, value: $value_ty, flags: c_uint) -> CUresult {
            let op = StreamMemOp { kind: $kind, address: addr, value: u64::from(value), flags };
            run(|| queue(stringify!($name), stream, &[op], Api::$api, $ptsz))
        }
    )*};
}

single_ops! {
    cuStreamWriteValue32(cuuint32_t) => mem_op::WRITE_VALUE_32, V1, false;
    cuStreamWriteValue32_ptsz(cuuint32_t) => mem_op::WRITE_VALUE_32, V1, true;
    cuStreamWriteValue32_v2(cuuint32_t) => mem_op::WRITE_VALUE_32, V2, false;
    cuStreamWriteValue32_v2_ptsz(cuuint32_t) => mem_op::WRITE_VALUE_32, V2, true;
    cuStreamWriteValue64(cuuint64_t) => mem_op::WRITE_VALUE_64, V1, false;
    cuStreamWriteValue64_ptsz(cuuint64_t) => mem_op::WRITE_VALUE_64, V1, true;
    cuStreamWriteValue64_v2(cuuint64_t) => mem_op::WRITE_VALUE_64, V2, false;
    cuStreamWriteValue64_v2_ptsz(cuuint64_t) => mem_op::WRITE_VALUE_64, V2, true;
    cuStreamWaitValue32(cuuint32_t) => mem_op::WAIT_VALUE_32, V1, false;
    cuStreamWaitValue32_ptsz(cuuint32_t) => mem_op::WAIT_VALUE_32, V1, true;
    cuStreamWaitValue32_v2(cuuint32_t) => mem_op::WAIT_VALUE_32, V2, false;
    cuStreamWaitValue32_v2_ptsz(cuuint32_t) => mem_op::WAIT_VALUE_32, V2, true;
    cuStreamWaitValue64(cuuint64_t) => mem_op::WAIT_VALUE_64, V1, false;
    cuStreamWaitValue64_ptsz(cuuint64_t) => mem_op::WAIT_VALUE_64, V1, true;
    cuStreamWaitValue64_v2(cuuint64_t) => mem_op::WAIT_VALUE_64, V2, false;
    cuStreamWaitValue64_v2_ptsz(cuuint64_t) => mem_op::WAIT_VALUE_64, V2, true;
}

/// The operations of a batch memory operation node (`cuGraphAddBatchMemOpNode` and its
/// setters), checked as `cuStreamBatchMemOp_v2`'s. Their words must be device memory of the
/// session: a graph outlives the pinned host blocks it could name, so host memory is refused with
/// one line.
///
/// # Safety
/// A non-NULL `params` points at `count` 48-byte unions.
pub(crate) unsafe fn node_ops(name: &str, count: c_uint, params: *const CUstreamBatchMemOpParams) -> DriverResult<Vec<StreamMemOp>> {
    if count == 0 || count as usize > mem_op::MAX_BATCH {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    non_null([params.cast()])?;
    let client = client()?;
    // SAFETY: checked non-NULL; the caller's `count` 48-byte, 8-byte-aligned unions.
    let words = unsafe { std::slice::from_raw_parts(params.cast::<[u64; 6]>(), count as usize) };
    let ops = words
        .iter()
        .map(|words| checked_op(client, name, StreamMemOp::from_driver_words(words), Api::V2))
        .collect::<DriverResult<Vec<_>>>()?;
    if ops.iter().any(|op| op.width().is_some() && client.device_range(op.address).is_none()) {
        crate::diagnostics::once(
            "memop-node-host",
            &format!(
                "flyt: {name}: batch memory operation nodes on host memory are not supported through Flyt (returning CUDA_ERROR_NOT_SUPPORTED)"
            ),
        );
        return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    Ok(ops)
}

fn batch(
    name: &str,
    stream: CUstream,
    count: c_uint,
    params: *mut CUstreamBatchMemOpParams,
    flags: c_uint,
    api: Api,
    ptsz: bool,
) -> DriverResult {
    if flags != 0 || count as usize > mem_op::MAX_BATCH {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    if count == 0 {
        return Ok(());
    }
    non_null([params.cast()])?;
    // SAFETY: checked non-NULL; the caller passes `count` 48-byte, 8-byte-aligned unions.
    let words = unsafe { std::slice::from_raw_parts(params.cast::<[u64; 6]>(), count as usize) };
    let ops: Vec<StreamMemOp> = words.iter().map(StreamMemOp::from_driver_words).collect();
    queue(name, stream, &ops, api, ptsz)
}

macro_rules! batch_ops {
    ($($name:ident => $api:ident, $ptsz:literal;)*) => {$(
        pub unsafe fn $name(stream: CUstream, count: c_uint, param_array: *mut CUstreamBatchMemOpParams, flags: c_uint) -> CUresult {
            run(|| batch(stringify!($name), stream, count, param_array, flags, Api::$api, $ptsz))
        }
    )*};
}

batch_ops! {
    cuStreamBatchMemOp => V1, false;
    cuStreamBatchMemOp_ptsz => V1, true;
    cuStreamBatchMemOp_v2 => V2, false;
    cuStreamBatchMemOp_v2_ptsz => V2, true;
}

// -- tensor maps --

/// Reads `len` values the caller passes (none when `len` is 0, where NULL is allowed).
///
/// # Safety
/// A non-NULL `ptr` points at `len` values.
unsafe fn read_array<T: Copy>(ptr: *const T, len: usize) -> DriverResult<Vec<T>> {
    if len == 0 {
        return Ok(Vec::new());
    }
    non_null([ptr.cast()])?;
    // SAFETY: checked non-NULL; the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) }.to_vec())
}

/// Asks the server's driver to encode, then writes the map into the app's `CUtensorMap`.
fn encode(name: &str, tensor_map: *mut CUtensorMap, params: TensorMapParams) -> DriverResult {
    let client = client()?;
    let map = match client.call(req::TensorMapEncode { encode: params }) {
        Ok(reply) => reply.map,
        Err(error) => {
            let error = driver_error(error);
            if error == CUresult::CUDA_ERROR_NOT_SUPPORTED {
                crate::diagnostics::once(
                    "tensor-map-encode",
                    &format!(
                        "flyt: {name}: the server's device encodes no tensor maps (an emulated device has no driver to; returning CUDA_ERROR_NOT_SUPPORTED)"
                    ),
                );
            }
            return Err(error);
        }
    };
    write_map(tensor_map, &map)
}

fn write_map(tensor_map: *mut CUtensorMap, map: &[u8]) -> DriverResult {
    if map.len() != TENSOR_MAP_SIZE {
        return Err(CUresult::CUDA_ERROR_UNKNOWN);
    }
    // SAFETY: checked non-NULL by the callers; a `CUtensorMap` is 128 bytes the caller owns.
    unsafe { std::ptr::copy_nonoverlapping(map.as_ptr(), tensor_map.cast::<u8>(), TENSOR_MAP_SIZE) };
    Ok(())
}

/// How every encoding fetches elements: the parameters the three take alike.
struct Fetch {
    data_type: CUtensorMapDataType,
    interleave: CUtensorMapInterleave,
    swizzle: CUtensorMapSwizzle,
    l2_promotion: CUtensorMapL2promotion,
    oob_fill: CUtensorMapFloatOOBfill,
}

/// What every encoding takes: the out-pointer checked, the rank checked, and the arrays read from
/// the caller's pointers.
///
/// # Safety
/// The arrays hold what the driver reads for `rank`.
unsafe fn common(
    tensor_map: *mut CUtensorMap,
    fetch: Fetch,
    rank: cuuint32_t,
    min_rank: u32,
    global_address: *mut c_void,
    global_dim: *const cuuint64_t,
    global_strides: *const cuuint64_t,
    element_strides: *const cuuint32_t,
) -> DriverResult<TensorMapParams> {
    non_null([tensor_map.cast()])?;
    if !(min_rank..=TensorMapParams::MAX_RANK).contains(&rank) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let rank_len = rank as usize;
    let Fetch { data_type, interleave, swizzle, l2_promotion, oob_fill } = fetch;
    Ok(TensorMapParams {
        data_type,
        rank,
        address: global_address as u64,
        // SAFETY: the caller's arrays, of `rank` and `rank - 1` entries.
        dims: unsafe { read_array(global_dim, rank_len) }?,
        // SAFETY: as above.
        strides: unsafe { read_array(global_strides, rank_len - 1) }?,
        // SAFETY: as above.
        element_strides: unsafe { read_array(element_strides, rank_len) }?,
        interleave,
        swizzle,
        l2_promotion,
        oob_fill,
        ..TensorMapParams::default()
    })
}

pub unsafe fn cuTensorMapEncodeTiled(
    tensor_map: *mut CUtensorMap,
    tensor_data_type: CUtensorMapDataType,
    tensor_rank: cuuint32_t,
    global_address: *mut c_void,
    global_dim: *const cuuint64_t,
    global_strides: *const cuuint64_t,
    box_dim: *const cuuint32_t,
    element_strides: *const cuuint32_t,
    interleave: CUtensorMapInterleave,
    swizzle: CUtensorMapSwizzle,
    l2_promotion: CUtensorMapL2promotion,
    oob_fill: CUtensorMapFloatOOBfill,
) -> CUresult {
    run(|| {
        let fetch = Fetch { data_type: tensor_data_type, interleave, swizzle, l2_promotion, oob_fill };
        // SAFETY: the caller's arrays, per the driver API's contract.
        let common = unsafe { common(tensor_map, fetch, tensor_rank, 1, global_address, global_dim, global_strides, element_strides) }?;
        // SAFETY: as above: `rank` entries.
        let box_dim = unsafe { read_array(box_dim, tensor_rank as usize) }?;
        encode("cuTensorMapEncodeTiled", tensor_map, TensorMapParams { layout: TensorMapLayout::Tiled { box_dim }, ..common })
    })
}

pub unsafe fn cuTensorMapEncodeIm2col(
    tensor_map: *mut CUtensorMap,
    tensor_data_type: CUtensorMapDataType,
    tensor_rank: cuuint32_t,
    global_address: *mut c_void,
    global_dim: *const cuuint64_t,
    global_strides: *const cuuint64_t,
    pixel_box_lower_corner: *const c_int,
    pixel_box_upper_corner: *const c_int,
    channels_per_pixel: cuuint32_t,
    pixels_per_column: cuuint32_t,
    element_strides: *const cuuint32_t,
    interleave: CUtensorMapInterleave,
    swizzle: CUtensorMapSwizzle,
    l2_promotion: CUtensorMapL2promotion,
    oob_fill: CUtensorMapFloatOOBfill,
) -> CUresult {
    run(|| {
        let fetch = Fetch { data_type: tensor_data_type, interleave, swizzle, l2_promotion, oob_fill };
        // SAFETY: the caller's arrays, per the driver API's contract (im2col: rank 3 to 5).
        let common = unsafe { common(tensor_map, fetch, tensor_rank, 3, global_address, global_dim, global_strides, element_strides) }?;
        let corners = tensor_rank as usize - 2;
        // SAFETY: as above: `rank - 2` entries each.
        let (lower_corner, upper_corner) =
            unsafe { (read_array(pixel_box_lower_corner, corners)?, read_array(pixel_box_upper_corner, corners)?) };
        let layout = TensorMapLayout::Im2col { lower_corner, upper_corner, channels_per_pixel, pixels_per_column };
        let params = TensorMapParams { layout, ..common };
        encode("cuTensorMapEncodeIm2col", tensor_map, params)
    })
}

pub unsafe fn cuTensorMapEncodeIm2colWide(
    tensor_map: *mut CUtensorMap,
    tensor_data_type: CUtensorMapDataType,
    tensor_rank: cuuint32_t,
    global_address: *mut c_void,
    global_dim: *const cuuint64_t,
    global_strides: *const cuuint64_t,
    pixel_box_lower_corner_width: c_int,
    pixel_box_upper_corner_width: c_int,
    channels_per_pixel: cuuint32_t,
    pixels_per_column: cuuint32_t,
    element_strides: *const cuuint32_t,
    interleave: CUtensorMapInterleave,
    mode: CUtensorMapIm2ColWideMode,
    swizzle: CUtensorMapSwizzle,
    l2_promotion: CUtensorMapL2promotion,
    oob_fill: CUtensorMapFloatOOBfill,
) -> CUresult {
    run(|| {
        let fetch = Fetch { data_type: tensor_data_type, interleave, swizzle, l2_promotion, oob_fill };
        // SAFETY: the caller's arrays, per the driver API's contract (im2col: rank 3 to 5).
        let common = unsafe { common(tensor_map, fetch, tensor_rank, 3, global_address, global_dim, global_strides, element_strides) }?;
        let (lower_corner_width, upper_corner_width) = (pixel_box_lower_corner_width, pixel_box_upper_corner_width);
        let layout = TensorMapLayout::Im2colWide { lower_corner_width, upper_corner_width, channels_per_pixel, pixels_per_column, mode };
        let params = TensorMapParams { layout, ..common };
        encode("cuTensorMapEncodeIm2colWide", tensor_map, params)
    })
}

/// The server moves maps its driver encoded for this session (it knows their extent).
pub unsafe fn cuTensorMapReplaceAddress(tensor_map: *mut CUtensorMap, global_address: *mut c_void) -> CUresult {
    run(|| {
        non_null([tensor_map.cast()])?;
        let mut map = vec![0u8; TENSOR_MAP_SIZE];
        // SAFETY: checked non-NULL; a `CUtensorMap` is 128 bytes the caller owns.
        unsafe { std::ptr::copy_nonoverlapping(tensor_map.cast::<u8>(), map.as_mut_ptr(), TENSOR_MAP_SIZE) };
        let client = client()?;
        let reply = client.call(req::TensorMapReplaceAddress { map, address: global_address as u64 }).map_err(driver_error)?;
        write_map(tensor_map, &reply.map)
    })
}
