//! Pitched allocations, 2D memsets and shaped copies: `cuMemcpy2D*`, `cuMemcpy3D*` (and peer),
//! and the 1D copies to and from arrays, all one path (`flyt_client::shaped`).

use std::ffi::{c_uchar, c_uint, c_ulonglong, c_ushort, c_void};

use flyt_client::shaped::{self, Shape, Side};
use flyt_client::transfer::Mode;
use flyt_protocol::ops::{Memset2d, Pos3};

use super::session::{client, resolve_stream, run};
use crate::CUresult;
use crate::ffi::{DriverResult, non_null, write_out};
use crate::generated::types::{CUDA_MEMCPY2D, CUDA_MEMCPY3D, CUDA_MEMCPY3D_BATCH_OP, CUDA_MEMCPY3D_PEER, CUarray, CUdeviceptr, CUstream};

/// `CUmemorytype`: where one side of a copy lives.
mod memory_type {
    pub const HOST: u32 = 1;
    pub const DEVICE: u32 = 2;
    pub const ARRAY: u32 = 3;
    pub const UNIFIED: u32 = 4;
}

/// One side of a copy descriptor, checked to be of the declared kind (unified: whatever the
/// pointer is).
fn side(kind: u32, host: *const c_void, device: CUdeviceptr, array: CUarray, pitch: usize, height: usize) -> DriverResult<Side> {
    let client = client()?;
    let (pitch, height) = (pitch as u64, height as u64);
    let host_side = |ptr: *const c_void| match ptr.is_null() {
        true => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        false => Ok(Side::Host { ptr: ptr.cast_mut().cast(), pitch, height }),
    };
    match kind {
        memory_type::HOST if client.is_device_pointer(host as u64) => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        memory_type::HOST => host_side(host),
        memory_type::DEVICE if device == 0 => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        // Host memory kernels use at its address (mapped or managed, as in one-dimensional
        // copies: `transfer::declared_fits`) is copied as the host memory it is here.
        memory_type::DEVICE
            if !client.is_device_pointer(device)
                && !client.managed().device_backed(device, 1)
                && client.host_allocation(device as usize).is_some_and(|host| host.device_mapped) =>
        {
            host_side(device as usize as *const c_void)
        }
        memory_type::DEVICE => Ok(Side::Device { ptr: device, pitch, height }),
        // Mirrored managed memory is device memory to copies (`transfer::classify`).
        memory_type::UNIFIED if client.is_device_pointer(device) || client.managed().device_backed(device, 1) => {
            Ok(Side::Device { ptr: device, pitch, height })
        }
        memory_type::UNIFIED => host_side(device as usize as *const c_void),
        memory_type::ARRAY if array.is_null() => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        memory_type::ARRAY => Ok(Side::Array { array: array as u64 }),
        _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

/// Runs a shaped copy on the app's stream.
///
/// # Safety
/// Host sides are valid for the box, per the driver API's contract.
unsafe fn copy(shape: Shape, stream: CUstream, mode: Mode, ptds: bool) -> DriverResult {
    let client = client()?;
    let stream = resolve_stream(client, stream, ptds)?;
    // SAFETY: forwarded contract.
    unsafe { shaped::copy(client, shape, stream, mode) }.map_err(super::session::driver_error)
}

/// # Safety
/// `copy` is NULL or a readable `CUDA_MEMCPY2D` whose host sides are valid for the rectangle.
unsafe fn memcpy_2d(p_copy: *const CUDA_MEMCPY2D, stream: CUstream, mode: Mode, ptds: bool) -> DriverResult {
    non_null([p_copy.cast()])?;
    // SAFETY: checked non-NULL; the caller's descriptor.
    let p = unsafe { &*p_copy };
    let height = p.Height;
    let shape = Shape {
        src: side(p.srcMemoryType, p.srcHost, p.srcDevice, p.srcArray, p.srcPitch, height)?,
        src_pos: Pos3 { x: p.srcXInBytes as u64, y: p.srcY as u64, z: 0 },
        dst: side(p.dstMemoryType, p.dstHost, p.dstDevice, p.dstArray, p.dstPitch, height)?,
        dst_pos: Pos3 { x: p.dstXInBytes as u64, y: p.dstY as u64, z: 0 },
        width: p.WidthInBytes as u64,
        height: height as u64,
        depth: 1,
    };
    // SAFETY: forwarded contract.
    unsafe { copy(shape, stream, mode, ptds) }
}

/// The fields `CUDA_MEMCPY3D` and `CUDA_MEMCPY3D_PEER` share (the peer form's contexts name the
/// session's one device).
macro_rules! shape_3d {
    ($p:expr) => {{
        let p = $p;
        Shape {
            src: side(p.srcMemoryType, p.srcHost, p.srcDevice, p.srcArray, p.srcPitch, p.srcHeight)?,
            src_pos: Pos3 { x: p.srcXInBytes as u64, y: p.srcY as u64, z: p.srcZ as u64 },
            dst: side(p.dstMemoryType, p.dstHost, p.dstDevice, p.dstArray, p.dstPitch, p.dstHeight)?,
            dst_pos: Pos3 { x: p.dstXInBytes as u64, y: p.dstY as u64, z: p.dstZ as u64 },
            width: p.WidthInBytes as u64,
            height: p.Height as u64,
            depth: p.Depth as u64,
        }
    }};
}

/// # Safety
/// `copy` is NULL or a readable `CUDA_MEMCPY3D` whose host sides are valid for the box.
unsafe fn memcpy_3d(p_copy: *const CUDA_MEMCPY3D, stream: CUstream, mode: Mode, ptds: bool) -> DriverResult {
    non_null([p_copy.cast()])?;
    // SAFETY: checked non-NULL; the caller's descriptor.
    let shape = shape_3d!(unsafe { &*p_copy });
    // SAFETY: forwarded contract.
    unsafe { copy(shape, stream, mode, ptds) }
}

/// # Safety
/// As [`memcpy_3d`], for a `CUDA_MEMCPY3D_PEER`.
unsafe fn memcpy_3d_peer(p_copy: *const CUDA_MEMCPY3D_PEER, stream: CUstream, mode: Mode, ptds: bool) -> DriverResult {
    non_null([p_copy.cast()])?;
    // SAFETY: checked non-NULL; the caller's descriptor.
    let shape = shape_3d!(unsafe { &*p_copy });
    // SAFETY: forwarded contract.
    unsafe { copy(shape, stream, mode, ptds) }
}

/// `CUmemcpy3DOperand` and `CUDA_MEMCPY3D_BATCH_OP` (cuda.h 12.8+; opaque in the generated types).
#[repr(C)]
#[derive(Clone, Copy)]
struct PointerOperand {
    ptr: CUdeviceptr,
    row_length: usize,
    layer_height: usize,
    loc_hint: [u32; 2],
}

#[repr(C)]
#[derive(Clone, Copy)]
struct ArrayOperand {
    array: CUarray,
    offset: [usize; 3],
}

#[repr(C)]
union OperandBody {
    ptr: PointerOperand,
    array: ArrayOperand,
}

#[repr(C)]
struct Operand {
    kind: c_uint,
    body: OperandBody,
}

#[repr(C)]
pub struct BatchOp3d {
    src: Operand,
    dst: Operand,
    extent: [usize; 3],
    src_access_order: c_uint,
    flags: c_uint,
}

const _: () = assert!(size_of::<BatchOp3d>() == 112 && size_of::<Operand>() == 40);

/// `CU_MEMCPY_OPERAND_TYPE_POINTER`, `_ARRAY`.
const OPERAND_POINTER: c_uint = 1;
const OPERAND_ARRAY: c_uint = 2;

impl Operand {
    /// The array this operand names, if it is one.
    fn array(&self) -> DriverResult<Option<CUarray>> {
        match self.kind {
            // SAFETY: the type says which member the caller filled.
            OPERAND_ARRAY => Ok(Some(unsafe { self.body.array }.array)),
            OPERAND_POINTER => Ok(None),
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// This operand as one side of a box `extent` elements of `element` bytes, and where in it
    /// the copy starts.
    fn side(&self, extent: [usize; 3], element: u64) -> DriverResult<(Side, Pos3)> {
        if self.kind == OPERAND_ARRAY {
            // SAFETY: the type says which member the caller filled.
            let array = unsafe { self.body.array };
            let [x, y, z] = array.offset.map(|v| v as u64);
            let side = side(memory_type::ARRAY, std::ptr::null(), 0, array.array, 0, 0)?;
            return Ok((side, Pos3 { x: x * element, y, z }));
        }
        // SAFETY: a pointer operand (`array` checked the type).
        let operand = unsafe { self.body.ptr };
        let [width, height, _] = extent;
        let longer = |given: usize, least: usize| {
            if given == 0 {
                Ok(least)
            } else if given >= least {
                Ok(given)
            } else {
                Err(CUresult::CUDA_ERROR_INVALID_VALUE)
            }
        };
        let pitch = longer(operand.row_length, width)? as u64 * element;
        let rows = longer(operand.layer_height, height)?;
        let side = side(memory_type::UNIFIED, std::ptr::null(), operand.ptr, std::ptr::null_mut(), pitch as usize, rows)?;
        Ok((side, Pos3 { x: 0, y: 0, z: 0 }))
    }
}

/// One `CUDA_MEMCPY3D_BATCH_OP` as a shape, and whether its source must be read before the call
/// returns.
fn batch_shape(op: &BatchOp3d) -> DriverResult<(Shape, bool)> {
    use super::memory::{ACCESS_ORDER_DURING_CALL, valid_batch_attributes};
    if op.extent.contains(&0) || !valid_batch_attributes(op.src_access_order, op.flags) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // Elements are bytes between pointers, an array's elements otherwise (both arrays alike).
    let element_of = |array: CUarray| {
        client()?.array_desc(array as u64).map_err(super::session::driver_error)?.element_size().ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
    };
    let element = match (op.src.array()?, op.dst.array()?) {
        (None, None) => 1,
        (Some(array), None) | (None, Some(array)) => element_of(array)?,
        (Some(src), Some(dst)) => {
            let size = element_of(src)?;
            if element_of(dst)? != size {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            size
        }
    };
    let (src, src_pos) = op.src.side(op.extent, element)?;
    let (dst, dst_pos) = op.dst.side(op.extent, element)?;
    let read_now = op.src_access_order == ACCESS_ORDER_DURING_CALL && matches!(src, Side::Host { .. });
    let [width, height, depth] = op.extent.map(|v| v as u64);
    Ok((Shape { src, src_pos, dst, dst_pos, width: width * element, height, depth }, read_now))
}

/// `cuMemcpy3DBatchAsync*`: the copies one after the other on `stream` (an order the driver could
/// choose); `fail_idx` names a failing copy.
///
/// # Safety
/// `ops` holds `count` operations whose host sides are valid, per the driver API's contract.
unsafe fn memcpy_3d_batch(
    count: usize,
    ops: *const BatchOp3d,
    fail_idx: *mut usize,
    flags: u64,
    stream: CUstream,
    ptds: bool,
) -> DriverResult {
    // SAFETY: the caller's optional out-pointer.
    let fail_idx = unsafe { super::memory::FailIndex::new(fail_idx) };
    non_null([ops.cast()])?;
    // The legacy NULL stream (id 0 on the wire) is refused, as the driver documents.
    if count == 0 || flags != 0 || super::session::is_legacy_stream(client()?, stream, ptds)? {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's array of `count` operations.
    let ops = unsafe { std::slice::from_raw_parts(ops, count) };
    for (index, op) in ops.iter().enumerate() {
        let result = batch_shape(op).and_then(|(shape, read_now)| {
            let mode = if read_now { Mode::Synchronous } else { Mode::Asynchronous };
            // SAFETY: forwarded contract.
            unsafe { copy(shape, stream, mode, ptds) }
        });
        if let Err(error) = result {
            fail_idx.set(index);
            return Err(error);
        }
    }
    Ok(())
}

per_thread_twins! {
    cuMemcpy3DBatchAsync, cuMemcpy3DBatchAsync_ptsz
        (
            num_ops: usize,
            op_list: *mut CUDA_MEMCPY3D_BATCH_OP,
            fail_idx: *mut usize,
            flags: c_ulonglong,
            h_stream: CUstream,
        )
        |per_thread| {
            // SAFETY: the caller's operations, per the driver API's contract.
            run(|| unsafe { memcpy_3d_batch(num_ops, op_list.cast(), fail_idx, flags, h_stream, per_thread) })
        }
}

per_thread_twins! {
    cuMemcpy3DBatchAsync_v2, cuMemcpy3DBatchAsync_v2_ptsz
        (
            num_ops: usize,
            op_list: *mut CUDA_MEMCPY3D_BATCH_OP,
            flags: c_ulonglong,
            h_stream: CUstream,
        )
        |per_thread| {
            // SAFETY: the caller's operations, per the driver API's contract.
            run(|| unsafe { memcpy_3d_batch(num_ops, op_list.cast(), std::ptr::null_mut(), flags, h_stream, per_thread) })
        }
}

macro_rules! descriptor_copies {
    ($($name:ident ($desc:ty $(, $stream:ident)?) => $via:ident, $mode:ident, $ptds:literal;)*) => {$(
        pub unsafe fn $name(p_copy: *const $desc $(, $stream: CUstream)?) -> CUresult {
            #[allow(unused_mut, unused_assignments, reason = "the synchronous forms have no stream")]
            let mut stream: CUstream = std::ptr::null_mut();
            $(stream = $stream;)?
            // SAFETY: the caller's descriptor and buffers, per the driver API's contract.
            run(|| unsafe { $via(p_copy, stream, Mode::$mode, $ptds) })
        }
    )*};
}

// The unaligned forms lift alignment limits of the hardware's 2D copy; Flyt's are the driver's
// 3D copies of whole boxes or packed pieces, so all take one path.
descriptor_copies! {
    cuMemcpy2D_v2(CUDA_MEMCPY2D) => memcpy_2d, Synchronous, false;
    cuMemcpy2D_v2_ptds(CUDA_MEMCPY2D) => memcpy_2d, Synchronous, true;
    cuMemcpy2DUnaligned_v2(CUDA_MEMCPY2D) => memcpy_2d, Synchronous, false;
    cuMemcpy2DUnaligned_v2_ptds(CUDA_MEMCPY2D) => memcpy_2d, Synchronous, true;
    cuMemcpy2DAsync_v2(CUDA_MEMCPY2D, h_stream) => memcpy_2d, Asynchronous, false;
    cuMemcpy2DAsync_v2_ptsz(CUDA_MEMCPY2D, h_stream) => memcpy_2d, Asynchronous, true;
    cuMemcpy3D_v2(CUDA_MEMCPY3D) => memcpy_3d, Synchronous, false;
    cuMemcpy3D_v2_ptds(CUDA_MEMCPY3D) => memcpy_3d, Synchronous, true;
    cuMemcpy3DAsync_v2(CUDA_MEMCPY3D, h_stream) => memcpy_3d, Asynchronous, false;
    cuMemcpy3DAsync_v2_ptsz(CUDA_MEMCPY3D, h_stream) => memcpy_3d, Asynchronous, true;
    cuMemcpy3DPeer(CUDA_MEMCPY3D_PEER) => memcpy_3d_peer, Synchronous, false;
    cuMemcpy3DPeer_ptds(CUDA_MEMCPY3D_PEER) => memcpy_3d_peer, Synchronous, true;
    cuMemcpy3DPeerAsync(CUDA_MEMCPY3D_PEER, h_stream) => memcpy_3d_peer, Asynchronous, false;
    cuMemcpy3DPeerAsync_ptsz(CUDA_MEMCPY3D_PEER, h_stream) => memcpy_3d_peer, Asynchronous, true;
}

/// A 1D copy of `count` bytes between arrays (at byte offsets), device memory and host memory.
///
/// # Safety
/// Host sides are valid for `count` bytes, per the driver API's contract.
unsafe fn linear(dst: (Side, u64), src: (Side, u64), count: usize, stream: CUstream, mode: Mode, ptds: bool) -> DriverResult {
    let shape = Shape {
        src: src.0,
        src_pos: Pos3 { x: src.1, y: 0, z: 0 },
        dst: dst.0,
        dst_pos: Pos3 { x: dst.1, y: 0, z: 0 },
        width: count as u64,
        height: 1,
        depth: 1,
    };
    // SAFETY: forwarded contract.
    unsafe { copy(shape, stream, mode, ptds) }
}

fn array(array: CUarray) -> DriverResult<Side> {
    side(memory_type::ARRAY, std::ptr::null(), 0, array, 0, 1)
}

fn host(ptr: *const c_void, count: usize) -> DriverResult<Side> {
    side(memory_type::HOST, ptr, 0, std::ptr::null_mut(), count, 1)
}

fn device(ptr: CUdeviceptr, count: usize) -> DriverResult<Side> {
    side(memory_type::DEVICE, std::ptr::null(), ptr, std::ptr::null_mut(), count, 1)
}

macro_rules! array_copies {
    ($($name:ident ($($arg:ident : $ty:ty),*) => ($dst:expr, $src:expr, $count:expr), $stream:expr, $mode:ident, $ptds:literal;)*) => {$(
        pub unsafe fn $name($($arg: $ty),*) -> CUresult {
            // SAFETY: the caller's buffers, per the driver API's contract.
            run(|| unsafe { linear($dst, $src, $count, $stream, Mode::$mode, $ptds) })
        }
    )*};
}

const NO_STREAM: CUstream = std::ptr::null_mut();

array_copies! {
    cuMemcpyHtoA_v2(dst_array: CUarray, dst_offset: usize, src_host: *const c_void, byte_count: usize)
        => ((array(dst_array)?, dst_offset as u64), (host(src_host, byte_count)?, 0), byte_count), NO_STREAM, Synchronous, false;
    cuMemcpyHtoA_v2_ptds(dst_array: CUarray, dst_offset: usize, src_host: *const c_void, byte_count: usize)
        => ((array(dst_array)?, dst_offset as u64), (host(src_host, byte_count)?, 0), byte_count), NO_STREAM, Synchronous, true;
    cuMemcpyHtoAAsync_v2(dst_array: CUarray, dst_offset: usize, src_host: *const c_void, byte_count: usize, h_stream: CUstream)
        => ((array(dst_array)?, dst_offset as u64), (host(src_host, byte_count)?, 0), byte_count), h_stream, Asynchronous, false;
    cuMemcpyHtoAAsync_v2_ptsz(dst_array: CUarray, dst_offset: usize, src_host: *const c_void, byte_count: usize, h_stream: CUstream)
        => ((array(dst_array)?, dst_offset as u64), (host(src_host, byte_count)?, 0), byte_count), h_stream, Asynchronous, true;
    cuMemcpyAtoH_v2(dst_host: *mut c_void, src_array: CUarray, src_offset: usize, byte_count: usize)
        => ((host(dst_host, byte_count)?, 0), (array(src_array)?, src_offset as u64), byte_count), NO_STREAM, Synchronous, false;
    cuMemcpyAtoH_v2_ptds(dst_host: *mut c_void, src_array: CUarray, src_offset: usize, byte_count: usize)
        => ((host(dst_host, byte_count)?, 0), (array(src_array)?, src_offset as u64), byte_count), NO_STREAM, Synchronous, true;
    cuMemcpyAtoHAsync_v2(dst_host: *mut c_void, src_array: CUarray, src_offset: usize, byte_count: usize, h_stream: CUstream)
        => ((host(dst_host, byte_count)?, 0), (array(src_array)?, src_offset as u64), byte_count), h_stream, Asynchronous, false;
    cuMemcpyAtoHAsync_v2_ptsz(dst_host: *mut c_void, src_array: CUarray, src_offset: usize, byte_count: usize, h_stream: CUstream)
        => ((host(dst_host, byte_count)?, 0), (array(src_array)?, src_offset as u64), byte_count), h_stream, Asynchronous, true;
    cuMemcpyDtoA_v2(dst_array: CUarray, dst_offset: usize, src_device: CUdeviceptr, byte_count: usize)
        => ((array(dst_array)?, dst_offset as u64), (device(src_device, byte_count)?, 0), byte_count), NO_STREAM, Synchronous, false;
    cuMemcpyDtoA_v2_ptds(dst_array: CUarray, dst_offset: usize, src_device: CUdeviceptr, byte_count: usize)
        => ((array(dst_array)?, dst_offset as u64), (device(src_device, byte_count)?, 0), byte_count), NO_STREAM, Synchronous, true;
    cuMemcpyAtoD_v2(dst_device: CUdeviceptr, src_array: CUarray, src_offset: usize, byte_count: usize)
        => ((device(dst_device, byte_count)?, 0), (array(src_array)?, src_offset as u64), byte_count), NO_STREAM, Synchronous, false;
    cuMemcpyAtoD_v2_ptds(dst_device: CUdeviceptr, src_array: CUarray, src_offset: usize, byte_count: usize)
        => ((device(dst_device, byte_count)?, 0), (array(src_array)?, src_offset as u64), byte_count), NO_STREAM, Synchronous, true;
    cuMemcpyAtoA_v2(dst_array: CUarray, dst_offset: usize, src_array: CUarray, src_offset: usize, byte_count: usize)
        => ((array(dst_array)?, dst_offset as u64), (array(src_array)?, src_offset as u64), byte_count), NO_STREAM, Synchronous, false;
    cuMemcpyAtoA_v2_ptds(dst_array: CUarray, dst_offset: usize, src_array: CUarray, src_offset: usize, byte_count: usize)
        => ((array(dst_array)?, dst_offset as u64), (array(src_array)?, src_offset as u64), byte_count), NO_STREAM, Synchronous, true;
}

pub unsafe fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    p_pitch: *mut usize,
    width_in_bytes: usize,
    height: usize,
    element_size_bytes: c_uint,
) -> CUresult {
    run(|| {
        non_null([dptr.cast(), p_pitch.cast()])?;
        let client = client()?;
        let (ptr, pitch) =
            client.malloc_pitch(width_in_bytes as u64, height as u64, element_size_bytes).map_err(super::session::driver_error)?;
        // SAFETY: checked non-NULL; the caller's out-pointers.
        unsafe {
            write_out(dptr, ptr)?;
            write_out(p_pitch, pitch as usize)
        }
    })
}

/// A 2D memset of `width` elements of `element_size` bytes per row; queued (the synchronous
/// forms are asynchronous for device memory, as CUDA documents).
#[expect(clippy::too_many_arguments, reason = "the driver's 2D memset, its element size and the stream's resolution")]
fn memset_2d(
    dst: CUdeviceptr,
    pitch: usize,
    value: u32,
    element_size: u8,
    width: usize,
    height: usize,
    stream: CUstream,
    ptds: bool,
) -> DriverResult {
    let client = client()?;
    let stream = resolve_stream(client, stream, ptds)?;
    let set = Memset2d { dst, pitch: pitch as u64, value, element_size, width: width as u64, height: height as u64 };
    client.memset_2d(set, stream).map_err(super::session::driver_error)
}

macro_rules! memsets_2d {
    ($($name:ident ($value:ident : $ty:ty $(, $stream:ident)?) => $size:literal, $ptds:literal;)*) => {$(
        pub unsafe fn $name(dst_device: CUdeviceptr, dst_pitch: usize, $value: $ty, width: usize, height: usize $(, $stream: CUstream)?) -> CUresult {
            #[allow(unused_mut, unused_assignments, reason = "the synchronous forms have no stream")]
            let mut stream: CUstream = std::ptr::null_mut();
            $(stream = $stream;)?
            run(|| memset_2d(dst_device, dst_pitch, u32::from($value), $size, width, height, stream, $ptds))
        }
    )*};
}

memsets_2d! {
    cuMemsetD2D8_v2(uc: c_uchar) => 1, false;
    cuMemsetD2D8_v2_ptds(uc: c_uchar) => 1, true;
    cuMemsetD2D16_v2(us: c_ushort) => 2, false;
    cuMemsetD2D16_v2_ptds(us: c_ushort) => 2, true;
    cuMemsetD2D32_v2(ui: c_uint) => 4, false;
    cuMemsetD2D32_v2_ptds(ui: c_uint) => 4, true;
    cuMemsetD2D8Async(uc: c_uchar, h_stream) => 1, false;
    cuMemsetD2D8Async_ptsz(uc: c_uchar, h_stream) => 1, true;
    cuMemsetD2D16Async(us: c_ushort, h_stream) => 2, false;
    cuMemsetD2D16Async_ptsz(us: c_ushort, h_stream) => 2, true;
    cuMemsetD2D32Async(ui: c_uint, h_stream) => 4, false;
    cuMemsetD2D32Async_ptsz(ui: c_uint, h_stream) => 4, true;
}
