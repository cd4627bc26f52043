//! Pitched and 3D memory, CUDA arrays and mipmapped arrays: allocations, memsets and copies,
//! translated onto the driver's. The runtime describes an array's elements by channel sizes and a
//! kind (`cudaChannelFormatDesc`) and a 3D copy in elements (`cudaMemcpy3DParms`); the driver by a
//! `CUarray_format` and a channel count, and in bytes. Flyt's driver does the work and checks
//! bounds; what stays here is the runtime's: its structs, its kinds, its errors.

#![allow(clippy::too_many_arguments, reason = "the CUDA runtime's signatures")]

use std::ffi::{c_int, c_uint, c_void};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;

use super::device::valid_device;
use super::memory::{DEFAULT, Mode, Side2D, check_sides, copy_2d, describe_2d};
use crate::driver::{
    CUDA_ARRAY_MEMORY_REQUIREMENTS, CUDA_ARRAY_SPARSE_PROPERTIES, CUDA_ARRAY3D_DESCRIPTOR, CUDA_MEMCPY2D, CUDA_MEMCPY3D,
    CUDA_MEMCPY3D_PEER, CUarray, CUcontext, CUdeviceptr, CUmipmappedArray, MEMORYTYPE_ARRAY, MEMORYTYPE_UNIFIED, cu_ctx, current_device,
    device_context,
};
use crate::ffi::{cudaChannelFormatDesc, cudaMemcpyKind, cudaStream_t, write_out};

/// `cudaPos`: an offset, `x` in elements of the array a copy involves, else bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct cudaPos {
    pub(crate) x: usize,
    pub(crate) y: usize,
    pub(crate) z: usize,
}

/// `cudaPitchedPtr`: memory of rows `pitch` bytes apart, slices `ysize` rows apart.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cudaPitchedPtr {
    pub(crate) ptr: *mut c_void,
    pub(crate) pitch: usize,
    pub(crate) xsize: usize,
    pub(crate) ysize: usize,
}

/// `cudaExtent`: `width` in elements of an array, or bytes of memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct cudaExtent {
    pub(crate) width: usize,
    pub(crate) height: usize,
    pub(crate) depth: usize,
}

/// `cudaMemcpy3DParms` (also a graph's copy node).
#[repr(C)]
pub struct cudaMemcpy3DParms {
    pub(crate) src_array: CUarray,
    pub(crate) src_pos: cudaPos,
    pub(crate) src_ptr: cudaPitchedPtr,
    pub(crate) dst_array: CUarray,
    pub(crate) dst_pos: cudaPos,
    pub(crate) dst_ptr: cudaPitchedPtr,
    pub(crate) extent: cudaExtent,
    pub(crate) kind: cudaMemcpyKind,
}

/// `cudaMemcpy3DPeerParms`: a 3D copy that names each side's device instead of a kind.
#[repr(C)]
pub struct cudaMemcpy3DPeerParms {
    src_array: CUarray,
    src_pos: cudaPos,
    src_ptr: cudaPitchedPtr,
    src_device: c_int,
    dst_array: CUarray,
    dst_pos: cudaPos,
    dst_ptr: cudaPitchedPtr,
    dst_device: c_int,
    extent: cudaExtent,
}

// The sizes of the C structs (driver_types.h, x86_64).
const _: () = {
    assert!(size_of::<cudaPitchedPtr>() == 32);
    assert!(size_of::<cudaMemcpy3DParms>() == 160);
    assert!(std::mem::offset_of!(cudaMemcpy3DParms, kind) == 152);
    assert!(size_of::<cudaMemcpy3DPeerParms>() == 168);
    assert!(std::mem::offset_of!(cudaMemcpy3DPeerParms, dst_array) == 72);
    assert!(std::mem::offset_of!(cudaMemcpy3DPeerParms, extent) == 144);
    assert!(size_of::<cudaChannelFormatDesc>() == 20);
};

// --- channel formats ---

/// `cudaChannelFormatKind`s of the plain formats, and of none.
const KIND_SIGNED: c_int = 0;
const KIND_UNSIGNED: c_int = 1;
const KIND_FLOAT: c_int = 2;
const KIND_NONE: c_int = 3;

/// `cudaErrorInvalidChannelDescriptor`.
pub(super) fn invalid_channel_descriptor() -> CudaError {
    CudaError::from_code(20)
}

/// The plain `CUarray_format`s: `(kind, bits of each channel, format)`.
const PLAIN_FORMATS: [(c_int, c_int, c_uint); 8] = [
    (KIND_UNSIGNED, 8, 0x01),
    (KIND_UNSIGNED, 16, 0x02),
    (KIND_UNSIGNED, 32, 0x03),
    (KIND_SIGNED, 8, 0x08),
    (KIND_SIGNED, 16, 0x09),
    (KIND_SIGNED, 32, 0x0a),
    (KIND_FLOAT, 16, 0x10),
    (KIND_FLOAT, 32, 0x20),
];

/// The runtime's other channel kinds (normalized, block-compressed, planar, packed), each one
/// format: `(kind, the channel sizes cudaCreateChannelDesc<kind>() gives, format)`.
const SPECIAL_FORMATS: [(c_int, [c_int; 4], c_uint); 28] = [
    (4, [8, 8, 8, 0], 0xb0),
    (5, [8, 0, 0, 0], 0xc0),
    (6, [8, 8, 0, 0], 0xc1),
    (7, [8, 8, 8, 8], 0xc2),
    (8, [16, 0, 0, 0], 0xc3),
    (9, [16, 16, 0, 0], 0xc4),
    (10, [16, 16, 16, 16], 0xc5),
    (11, [8, 0, 0, 0], 0xc6),
    (12, [8, 8, 0, 0], 0xc7),
    (13, [8, 8, 8, 8], 0xc8),
    (14, [16, 0, 0, 0], 0xc9),
    (15, [16, 16, 0, 0], 0xca),
    (16, [16, 16, 16, 16], 0xcb),
    (17, [8, 8, 8, 8], 0x91),
    (18, [8, 8, 8, 8], 0x92),
    (19, [8, 8, 8, 8], 0x93),
    (20, [8, 8, 8, 8], 0x94),
    (21, [8, 8, 8, 8], 0x95),
    (22, [8, 8, 8, 8], 0x96),
    (23, [8, 0, 0, 0], 0x97),
    (24, [8, 0, 0, 0], 0x98),
    (25, [8, 8, 0, 0], 0x99),
    (26, [8, 8, 0, 0], 0x9a),
    (27, [16, 16, 16, 0], 0x9b),
    (28, [16, 16, 16, 0], 0x9c),
    (29, [8, 8, 8, 8], 0x9d),
    (30, [8, 8, 8, 8], 0x9e),
    (31, [10, 10, 10, 2], 0x50),
];

/// A channel description as the driver's `(format, channel count)`. Channels are x, then y, z
/// and w, without gaps; a plain kind has 1, 2 or 4 of them, all of one size the format has; a
/// special kind has exactly the sizes its own description gives.
pub(super) fn array_format(desc: &cudaChannelFormatDesc) -> CudaResult<(c_uint, c_uint)> {
    let bits = [desc.x, desc.y, desc.z, desc.w];
    let channels = bits.iter().take_while(|size| **size != 0).count();
    if bits[channels..].iter().any(|size| *size != 0) {
        return Err(invalid_channel_descriptor());
    }
    if let Some((_, sizes, format)) = SPECIAL_FORMATS.iter().find(|(kind, ..)| *kind == desc.f) {
        return if *sizes == bits { Ok((*format, channels as c_uint)) } else { Err(invalid_channel_descriptor()) };
    }
    if !matches!(channels, 1 | 2 | 4) || bits[..channels].iter().any(|size| *size != desc.x) {
        return Err(invalid_channel_descriptor());
    }
    PLAIN_FORMATS
        .iter()
        .find(|(kind, size, _)| *kind == desc.f && *size == desc.x)
        .map(|(.., format)| (*format, channels as c_uint))
        .ok_or_else(invalid_channel_descriptor)
}

/// The runtime's channel description of a driver format with `channels` channels. A format the
/// runtime has no kind for (video formats of imported memory) is kind none, with no channels.
pub(super) fn channel_desc(format: c_uint, channels: c_uint) -> cudaChannelFormatDesc {
    if let Some((kind, size, _)) = PLAIN_FORMATS.iter().find(|(.., f)| *f == format) {
        let channel = |index: c_uint| if index < channels { *size } else { 0 };
        return cudaChannelFormatDesc { x: channel(0), y: channel(1), z: channel(2), w: channel(3), f: *kind };
    }
    match SPECIAL_FORMATS.iter().find(|(.., f)| *f == format) {
        Some((kind, [x, y, z, w], _)) => cudaChannelFormatDesc { x: *x, y: *y, z: *z, w: *w, f: *kind },
        None => cudaChannelFormatDesc { f: KIND_NONE, ..Default::default() },
    }
}

/// Whether texels of `format` are integers (those the runtime's `cudaReadModeElementType` returns
/// unconverted, where the driver would promote them to floats unless told otherwise).
pub(super) fn is_integer_format(format: c_uint) -> bool {
    matches!(format, 0x01 | 0x02 | 0x03 | 0x08 | 0x09 | 0x0a)
}

/// The bytes of one element of an array, for offsets and extents the runtime gives in elements;
/// `None` for block-compressed and planar formats, whose elements are not bytes in rows.
fn element_size(descriptor: &CUDA_ARRAY3D_DESCRIPTOR) -> Option<usize> {
    let channels = descriptor.NumChannels as usize;
    match descriptor.Format {
        0x01 | 0x08 => Some(channels),
        0x02 | 0x09 | 0x10 => Some(2 * channels),
        0x03 | 0x0a | 0x20 => Some(4 * channels),
        0xc0 | 0xc6 => Some(1),
        0xc1 | 0xc7 | 0xc3 | 0xc9 => Some(2),
        0xc2 | 0xc8 | 0xc4 | 0xca | 0x50 => Some(4),
        0xc5 | 0xcb => Some(8),
        _ => None,
    }
}

/// An array's descriptor (NULL is no array, as the driver answers too).
pub(super) fn descriptor(array: CUarray) -> CudaResult<CUDA_ARRAY3D_DESCRIPTOR> {
    if array.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    // SAFETY: all-zero is a valid value of these plain integer fields.
    let mut descriptor: CUDA_ARRAY3D_DESCRIPTOR = unsafe { std::mem::zeroed() };
    cu_ctx!(cuArray3DGetDescriptor_v2(std::ptr::from_mut(&mut descriptor).cast(), array))?;
    Ok(descriptor)
}

/// The bytes of one element of `array`, for copies that count in elements.
fn array_element_size(array: CUarray, symbol: &str) -> CudaResult<usize> {
    element_size(&descriptor(array)?).ok_or_else(|| super::unsupported_use(symbol, "an array of a block-compressed or planar format"))
}

// --- pitched and 3D memory ---

/// `ElementSizeBytes` of pitched allocations: the widest accesses a kernel makes (16 bytes),
/// which the pitch keeps aligned.
const PITCH_ELEMENT_SIZE: c_uint = 16;

/// `rows` rows of `width` bytes: the address and the pitch. An empty allocation is NULL with no
/// pitch, as `cudaMalloc(0)` is NULL.
fn allocate_pitched(width: usize, rows: usize) -> CudaResult<(CUdeviceptr, usize)> {
    if width == 0 || rows == 0 {
        crate::driver::ensure_context()?;
        return Ok((0, 0));
    }
    let (mut ptr, mut pitch) = (0, 0);
    cu_ctx!(cuMemAllocPitch_v2(&mut ptr, &mut pitch, width, rows, PITCH_ELEMENT_SIZE))?;
    Ok((ptr, pitch))
}

pub unsafe fn cudaMallocPitch(dev_ptr: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize) -> CudaResult<()> {
    if dev_ptr.is_null() || pitch.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let (ptr, row) = allocate_pitched(width, height)?;
    // SAFETY: checked non-NULL; the app's out-pointers.
    unsafe {
        write_out(dev_ptr, ptr as usize as *mut c_void)?;
        write_out(pitch, row)
    }
}

/// One pitched allocation of `height * depth` rows: slices are `height` rows apart.
pub unsafe fn cudaMalloc3D(pitched: *mut cudaPitchedPtr, extent: cudaExtent) -> CudaResult<()> {
    if pitched.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let rows = extent.height.checked_mul(extent.depth).ok_or(CudaError::INVALID_VALUE)?;
    let (ptr, pitch) = allocate_pitched(extent.width, rows)?;
    let value = cudaPitchedPtr { ptr: ptr as usize as *mut c_void, pitch, xsize: extent.width, ysize: extent.height };
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(pitched, value) }
}

/// `height` rows of `width` bytes set to the low byte of `value`.
fn memset_2d(
    dst: CUdeviceptr,
    pitch: usize,
    value: c_int,
    width: usize,
    height: usize,
    stream: cudaStream_t,
    mode: Mode,
    per_thread: bool,
) -> CudaResult<()> {
    if width == 0 || height == 0 {
        return Ok(());
    }
    // The pitch of one row is unused (CUDA's words); the driver checks one all the same.
    let pitch = if height == 1 { pitch.max(width) } else { pitch };
    if pitch < width {
        return Err(CudaError::INVALID_VALUE);
    }
    let byte = value as u8;
    match (mode, per_thread) {
        (Mode::Synchronous, false) => cu_ctx!(cuMemsetD2D8_v2(dst, pitch, byte, width, height)),
        (Mode::Synchronous, true) => cu_ctx!(cuMemsetD2D8_v2_ptds(dst, pitch, byte, width, height)),
        (Mode::Asynchronous, false) => cu_ctx!(cuMemsetD2D8Async(dst, pitch, byte, width, height, stream.cast())),
        (Mode::Asynchronous, true) => cu_ctx!(cuMemsetD2D8Async_ptsz(dst, pitch, byte, width, height, stream.cast())),
    }
}

/// A 3D memset: one 2D memset where the rows of consecutive slices follow one another (one
/// slice, or every row of each), else one per slice.
fn memset_3d(
    target: cudaPitchedPtr,
    value: c_int,
    extent: cudaExtent,
    stream: cudaStream_t,
    mode: Mode,
    per_thread: bool,
) -> CudaResult<()> {
    let cudaExtent { width, height, depth } = extent;
    if width == 0 || height == 0 || depth == 0 {
        return Ok(());
    }
    let dst = target.ptr as CUdeviceptr;
    if depth == 1 || height == target.ysize {
        let rows = height.checked_mul(depth).ok_or(CudaError::INVALID_VALUE)?;
        return memset_2d(dst, target.pitch, value, width, rows, stream, mode, per_thread);
    }
    // Taller than a slice, the rows would run into the next slice.
    if height > target.ysize {
        return Err(CudaError::INVALID_VALUE);
    }
    let slice = target.pitch.checked_mul(target.ysize).ok_or(CudaError::INVALID_VALUE)?;
    // The last slice first: a box that runs past its allocation is refused before any is set.
    for z in (0..depth).rev() {
        let offset = slice.checked_mul(z).and_then(|offset| dst.checked_add(offset as u64)).ok_or(CudaError::INVALID_VALUE)?;
        memset_2d(offset, target.pitch, value, width, height, stream, mode, per_thread)?;
    }
    Ok(())
}

stream_entry_points! {
    [cudaMemset2D, cudaMemset2D_ptds, cudaMemset2DAsync, cudaMemset2DAsync_ptsz]
    (dev_ptr: *mut c_void, pitch: usize, value: c_int, width: usize, height: usize)
    |stream, mode, per_thread| memset_2d(dev_ptr as CUdeviceptr, pitch, value, width, height, stream, mode, per_thread)
}

stream_entry_points! {
    [cudaMemset3D, cudaMemset3D_ptds, cudaMemset3DAsync, cudaMemset3DAsync_ptsz]
    (target: cudaPitchedPtr, value: c_int, extent: cudaExtent)
    |stream, mode, per_thread| memset_3d(target, value, extent, stream, mode, per_thread)
}

// --- arrays and mipmapped arrays ---

/// Checks the out-pointer and the channel description of a new array or mipmapped array and
/// gives the driver's descriptor. The runtime's `cudaArray*` flags are the driver's
/// `CUDA_ARRAY3D_*` flags, number for number.
///
/// # Safety
/// `desc` is NULL or a readable `cudaChannelFormatDesc`.
unsafe fn array_descriptor<T>(
    out: *mut T,
    desc: *const cudaChannelFormatDesc,
    extent: cudaExtent,
    flags: c_uint,
) -> CudaResult<CUDA_ARRAY3D_DESCRIPTOR> {
    if out.is_null() || desc.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    // SAFETY: checked non-NULL; the app's struct.
    let (format, num_channels) = array_format(unsafe { &*desc })?;
    Ok(CUDA_ARRAY3D_DESCRIPTOR {
        Width: extent.width,
        Height: extent.height,
        Depth: extent.depth,
        Format: format,
        NumChannels: num_channels,
        Flags: flags,
    })
}

/// # Safety
/// As [`array_descriptor`]; `out` is NULL or the app's out-pointer.
unsafe fn create_array(out: *mut CUarray, desc: *const cudaChannelFormatDesc, extent: cudaExtent, flags: c_uint) -> CudaResult<()> {
    // SAFETY: the app's struct.
    let descriptor = unsafe { array_descriptor(out, desc, extent, flags) }?;
    let mut array: CUarray = std::ptr::null_mut();
    cu_ctx!(cuArray3DCreate_v2(&mut array, std::ptr::from_ref(&descriptor).cast()))?;
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(out, array) }
}

/// A 1D (height 0) or 2D array: a 3D array of depth 0.
pub unsafe fn cudaMallocArray(
    array: *mut CUarray,
    desc: *const cudaChannelFormatDesc,
    width: usize,
    height: usize,
    flags: c_uint,
) -> CudaResult<()> {
    // SAFETY: the app's pointers.
    unsafe { create_array(array, desc, cudaExtent { width, height, depth: 0 }, flags) }
}

pub unsafe fn cudaMalloc3DArray(
    array: *mut CUarray,
    desc: *const cudaChannelFormatDesc,
    extent: cudaExtent,
    flags: c_uint,
) -> CudaResult<()> {
    // SAFETY: the app's pointers.
    unsafe { create_array(array, desc, extent, flags) }
}

pub unsafe fn cudaMallocMipmappedArray(
    mipmapped: *mut CUmipmappedArray,
    desc: *const cudaChannelFormatDesc,
    extent: cudaExtent,
    levels: c_uint,
    flags: c_uint,
) -> CudaResult<()> {
    // SAFETY: the app's struct.
    let descriptor = unsafe { array_descriptor(mipmapped, desc, extent, flags) }?;
    let mut handle: CUmipmappedArray = std::ptr::null_mut();
    cu_ctx!(cuMipmappedArrayCreate(&mut handle, std::ptr::from_ref(&descriptor).cast(), levels))?;
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(mipmapped, handle) }
}

pub unsafe fn cudaGetMipmappedArrayLevel(level_array: *mut CUarray, mipmapped: CUmipmappedArray, level: c_uint) -> CudaResult<()> {
    if level_array.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    if mipmapped.is_null() {
        return Err(CudaError::INVALID_RESOURCE_HANDLE);
    }
    let mut array: CUarray = std::ptr::null_mut();
    cu_ctx!(cuMipmappedArrayGetLevel(&mut array, mipmapped, level))?;
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(level_array, array) }
}

/// Freeing NULL does nothing, as CUDA documents.
pub unsafe fn cudaFreeArray(array: CUarray) -> CudaResult<()> {
    if array.is_null() {
        return Ok(());
    }
    cu_ctx!(cuArrayDestroy(array))
}

pub unsafe fn cudaFreeMipmappedArray(mipmapped: CUmipmappedArray) -> CudaResult<()> {
    if mipmapped.is_null() {
        return Ok(());
    }
    cu_ctx!(cuMipmappedArrayDestroy(mipmapped))
}

/// Any of the three out-pointers may be NULL. A 2D array has depth 0, a 1D array height 0 too.
pub unsafe fn cudaArrayGetInfo(
    desc: *mut cudaChannelFormatDesc,
    extent: *mut cudaExtent,
    flags: *mut c_uint,
    array: CUarray,
) -> CudaResult<()> {
    let d = descriptor(array)?;
    if !desc.is_null() {
        // SAFETY: checked non-NULL; the app's out-pointer.
        unsafe { write_out(desc, channel_desc(d.Format, d.NumChannels)) }?;
    }
    if !extent.is_null() {
        // SAFETY: as above.
        unsafe { write_out(extent, cudaExtent { width: d.Width, height: d.Height, depth: d.Depth }) }?;
    }
    if !flags.is_null() {
        // SAFETY: as above.
        unsafe { write_out(flags, d.Flags) }?;
    }
    Ok(())
}

pub unsafe fn cudaGetChannelDesc(desc: *mut cudaChannelFormatDesc, array: CUarray) -> CudaResult<()> {
    if desc.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let d = descriptor(array)?;
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(desc, channel_desc(d.Format, d.NumChannels)) }
}

// --- planes, sparse properties and memory requirements (the driver's, struct for struct) ---

/// `cudaArraySparseProperties`: the driver's struct, field for field.
#[allow(non_camel_case_types, reason = "the C type's name, as the CUDA headers spell it")]
pub type cudaArraySparseProperties = CUDA_ARRAY_SPARSE_PROPERTIES;
/// `cudaArrayMemoryRequirements`: the driver's struct, field for field.
#[allow(non_camel_case_types, reason = "the C type's name, as the CUDA headers spell it")]
pub type cudaArrayMemoryRequirements = CUDA_ARRAY_MEMORY_REQUIREMENTS;

/// A plane of a planar (NV12) array: an array of its own, part of `array` (it goes with it).
pub unsafe fn cudaArrayGetPlane(plane_array: *mut CUarray, array: CUarray, plane: c_uint) -> CudaResult<()> {
    if plane_array.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    if array.is_null() {
        return Err(CudaError::INVALID_RESOURCE_HANDLE);
    }
    let mut out: CUarray = std::ptr::null_mut();
    cu_ctx!(cuArrayGetPlane(&mut out, array, plane))?;
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(plane_array, out) }
}

/// Queries that fill one of these structs: the out-pointer is checked (then the device, where the
/// query names one), and the driver fills the struct from all-zero.
macro_rules! struct_queries {
    ($($name:ident($out:ident: *mut $out_ty:ty, $handle:ident: $handle_ty:ty $(, $device:ident: c_int)?) => $driver:ident;)*) => {$(
        pub unsafe fn $name($out: *mut $out_ty, $handle: $handle_ty $(, $device: c_int)?) -> CudaResult<()> {
            if $out.is_null() {
                return Err(CudaError::INVALID_VALUE);
            }
            $(let $device = valid_device($device)?;)?
            // SAFETY: all-zero is a valid value of these plain integer fields.
            let mut value: $out_ty = unsafe { std::mem::zeroed() };
            cu_ctx!($driver(std::ptr::from_mut(&mut value).cast(), $handle $(, $device)?))?;
            // SAFETY: checked non-NULL; the app's out-pointer.
            unsafe { write_out($out, value) }
        }
    )*};
}

struct_queries! {
    cudaArrayGetSparseProperties(properties: *mut cudaArraySparseProperties, array: CUarray) => cuArrayGetSparseProperties;
    cudaMipmappedArrayGetSparseProperties(properties: *mut cudaArraySparseProperties, mipmapped: CUmipmappedArray)
        => cuMipmappedArrayGetSparseProperties;
    cudaArrayGetMemoryRequirements(requirements: *mut cudaArrayMemoryRequirements, array: CUarray, device: c_int)
        => cuArrayGetMemoryRequirements;
    cudaMipmappedArrayGetMemoryRequirements(requirements: *mut cudaArrayMemoryRequirements, mipmapped: CUmipmappedArray, device: c_int)
        => cuMipmappedArrayGetMemoryRequirements;
}

// --- 2D copies to, from and between arrays (offsets and widths in bytes, as the driver's) ---

/// A pitched copy with an array on one side or both: checked as `cudaMemcpy2D` checks its
/// pointers and kind (an array is device memory whatever the kind says), then described to the
/// driver.
fn memcpy_2d_array(
    dst: Side2D,
    dst_at: (usize, usize),
    src: Side2D,
    src_at: (usize, usize),
    width: usize,
    height: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
    mode: Mode,
    per_thread: bool,
) -> CudaResult<()> {
    if width == 0 || height == 0 {
        return Ok(());
    }
    for side in [dst, src] {
        match side {
            Side2D::Memory { ptr: 0, .. } => return Err(CudaError::INVALID_VALUE),
            Side2D::Memory { pitch, .. } if height > 1 && pitch < width => return Err(CudaError::INVALID_PITCH_VALUE),
            Side2D::Array(array) if array.is_null() => return Err(CudaError::INVALID_VALUE),
            _ => {}
        }
    }
    check_sides(memory_of(dst), memory_of(src), kind)?;
    copy_2d(&describe_2d(dst, dst_at, src, src_at, width, height), stream, mode, per_thread)
}

/// The pointer of a side that is memory (`None` for an array).
fn memory_of(side: Side2D) -> Option<u64> {
    match side {
        Side2D::Memory { ptr, .. } => Some(ptr),
        Side2D::Array(_) => None,
    }
}

fn memory(ptr: *const c_void, pitch: usize) -> Side2D {
    Side2D::Memory { ptr: ptr as u64, pitch }
}

stream_entry_points! {
    [cudaMemcpy2DToArray, cudaMemcpy2DToArray_ptds, cudaMemcpy2DToArrayAsync, cudaMemcpy2DToArrayAsync_ptsz]
    (dst: CUarray, w_offset: usize, h_offset: usize, src: *const c_void, spitch: usize, width: usize, height: usize, kind: cudaMemcpyKind)
    |stream, mode, per_thread| {
        let (dst, src) = (Side2D::Array(dst), memory(src, spitch));
        memcpy_2d_array(dst, (w_offset, h_offset), src, (0, 0), width, height, kind, stream, mode, per_thread)
    }
}

stream_entry_points! {
    [cudaMemcpy2DFromArray, cudaMemcpy2DFromArray_ptds, cudaMemcpy2DFromArrayAsync, cudaMemcpy2DFromArrayAsync_ptsz]
    (dst: *mut c_void, dpitch: usize, src: CUarray, w_offset: usize, h_offset: usize, width: usize, height: usize, kind: cudaMemcpyKind)
    |stream, mode, per_thread| {
        let (dst, src) = (memory(dst, dpitch), Side2D::Array(src));
        memcpy_2d_array(dst, (0, 0), src, (w_offset, h_offset), width, height, kind, stream, mode, per_thread)
    }
}

stream_entry_points! {
    [cudaMemcpy2DArrayToArray, cudaMemcpy2DArrayToArray_ptds]
    (
        dst: CUarray,
        w_offset_dst: usize,
        h_offset_dst: usize,
        src: CUarray,
        w_offset_src: usize,
        h_offset_src: usize,
        width: usize,
        height: usize,
        kind: cudaMemcpyKind,
    )
    |stream, mode, per_thread| {
        let (dst, dst_at, src, src_at) = (Side2D::Array(dst), (w_offset_dst, h_offset_dst), Side2D::Array(src), (w_offset_src, h_offset_src));
        memcpy_2d_array(dst, dst_at, src, src_at, width, height, kind, stream, mode, per_thread)
    }
}

// --- the deprecated 1D copies to, from and between arrays ---

/// Where a deprecated 1D array copy stands on one side: in memory, or in an array whose rows are
/// `row` bytes wide, at byte `x` of row `y`. The copy runs on along the array's rows, as CUDA's
/// does (a whole 2D array is filled from one packed buffer by one call).
#[derive(Clone, Copy)]
enum Run {
    Memory(u64),
    Array { array: CUarray, row: usize, x: usize, y: usize },
}

impl Run {
    /// An array side at `(x bytes, y rows)`, checked to hold `count` bytes from there (so that a
    /// copy too long fails before any of it is made).
    fn array(array: CUarray, x: usize, y: usize, count: usize, symbol: &str) -> CudaResult<Run> {
        let d = descriptor(array)?;
        let element = element_size(&d).ok_or_else(|| super::unsupported_use(symbol, "an array of a block-compressed or planar format"))?;
        let row = d.Width.checked_mul(element).ok_or(CudaError::INVALID_VALUE)?;
        // A 1D array is one row; only the first slice of a 3D array is reached.
        let rows = d.Height.max(1);
        let room = rows.checked_sub(y).and_then(|left| left.checked_mul(row)).and_then(|bytes| bytes.checked_sub(x));
        if x >= row || room.is_none_or(|room| room < count) {
            return Err(CudaError::INVALID_VALUE);
        }
        Ok(Run::Array { array, row, x, y })
    }

    /// The bytes left in the current row (unbounded in memory).
    fn room(self) -> usize {
        match self {
            Run::Memory(_) => usize::MAX,
            Run::Array { row, x, .. } => row - x,
        }
    }

    /// The row width of an array side that stands at the start of a row.
    fn row_start(self) -> Option<usize> {
        match self {
            Run::Array { row, x: 0, .. } => Some(row),
            _ => None,
        }
    }

    /// The side of a piece `width` bytes wide, and where it starts.
    fn side(self, width: usize) -> (Side2D, (usize, usize)) {
        match self {
            Run::Memory(ptr) => (Side2D::Memory { ptr, pitch: width }, (0, 0)),
            Run::Array { array, x, y, .. } => (Side2D::Array(array), (x, y)),
        }
    }

    fn advance(&mut self, width: usize, height: usize) {
        match self {
            Run::Memory(ptr) => *ptr += (width * height) as u64,
            Run::Array { row, x, y, .. } => {
                *x += width;
                *y += height - 1;
                if *x == *row {
                    *x = 0;
                    *y += 1;
                }
            }
        }
    }
}

/// The next piece of a 1D array copy with `left` bytes to go, as `(width, height)`: whole rows
/// where both sides stand at the start of rows of one width, else the rest of the shorter row.
fn next_piece(dst: Run, src: Run, left: usize) -> (usize, usize) {
    let row = match (dst, src) {
        (Run::Memory(_), array) | (array, Run::Memory(_)) => array.row_start(),
        _ => dst.row_start().filter(|row| src.row_start() == Some(*row)),
    };
    match row {
        Some(row) if left >= row => (row, left / row),
        _ => (left.min(dst.room()).min(src.room()), 1),
    }
}

/// A 1D array copy as pitched copies (at most three where one side is memory).
fn pieces(mut dst: Run, mut src: Run, count: usize) -> Vec<CUDA_MEMCPY2D> {
    let mut pieces = Vec::new();
    let mut left = count;
    while left > 0 {
        let (width, height) = next_piece(dst, src, left);
        let ((dst_side, dst_at), (src_side, src_at)) = (dst.side(width), src.side(width));
        pieces.push(describe_2d(dst_side, dst_at, src_side, src_at, width, height));
        dst.advance(width, height);
        src.advance(width, height);
        left -= width * height;
    }
    pieces
}

/// Checks a deprecated 1D array copy (as the 2D ones are checked) and makes it.
fn memcpy_1d(
    symbol: &str,
    dst: Side2D,
    dst_at: (usize, usize),
    src: Side2D,
    src_at: (usize, usize),
    count: usize,
    kind: cudaMemcpyKind,
    stream: cudaStream_t,
    mode: Mode,
    per_thread: bool,
) -> CudaResult<()> {
    if count == 0 {
        return Ok(());
    }
    for side in [dst, src] {
        match side {
            Side2D::Memory { ptr: 0, .. } => return Err(CudaError::INVALID_VALUE),
            Side2D::Array(array) if array.is_null() => return Err(CudaError::INVALID_VALUE),
            _ => {}
        }
    }
    check_sides(memory_of(dst), memory_of(src), kind)?;
    let run = |side: Side2D, (x, y): (usize, usize)| match side {
        Side2D::Memory { ptr, .. } => Ok(Run::Memory(ptr)),
        Side2D::Array(array) => Run::array(array, x, y, count, symbol),
    };
    // The last piece first: memory too short for the copy is refused before any of it is made.
    for piece in pieces(run(dst, dst_at)?, run(src, src_at)?, count).iter().rev() {
        copy_2d(piece, stream, mode, per_thread)?;
    }
    Ok(())
}

stream_entry_points! {
    [cudaMemcpyToArray, cudaMemcpyToArray_ptds, cudaMemcpyToArrayAsync, cudaMemcpyToArrayAsync_ptsz]
    (dst: CUarray, w_offset: usize, h_offset: usize, src: *const c_void, count: usize, kind: cudaMemcpyKind)
    |stream, mode, per_thread| {
        let (dst, src) = (Side2D::Array(dst), memory(src, 0));
        memcpy_1d("cudaMemcpyToArray", dst, (w_offset, h_offset), src, (0, 0), count, kind, stream, mode, per_thread)
    }
}

stream_entry_points! {
    [cudaMemcpyFromArray, cudaMemcpyFromArray_ptds, cudaMemcpyFromArrayAsync, cudaMemcpyFromArrayAsync_ptsz]
    (dst: *mut c_void, src: CUarray, w_offset: usize, h_offset: usize, count: usize, kind: cudaMemcpyKind)
    |stream, mode, per_thread| {
        let (dst, src) = (memory(dst, 0), Side2D::Array(src));
        memcpy_1d("cudaMemcpyFromArray", dst, (0, 0), src, (w_offset, h_offset), count, kind, stream, mode, per_thread)
    }
}

stream_entry_points! {
    [cudaMemcpyArrayToArray, cudaMemcpyArrayToArray_ptds]
    (
        dst: CUarray,
        w_offset_dst: usize,
        h_offset_dst: usize,
        src: CUarray,
        w_offset_src: usize,
        h_offset_src: usize,
        count: usize,
        kind: cudaMemcpyKind,
    )
    |stream, mode, per_thread| {
        let (dst, dst_at, src, src_at) = (Side2D::Array(dst), (w_offset_dst, h_offset_dst), Side2D::Array(src), (w_offset_src, h_offset_src));
        memcpy_1d("cudaMemcpyArrayToArray", dst, dst_at, src, src_at, count, kind, stream, mode, per_thread)
    }
}

// --- 3D copies ---

/// One side of a 3D copy as the runtime gives it: an array, or pitched memory.
struct Side3D<'a> {
    array: CUarray,
    pos: &'a cudaPos,
    ptr: &'a cudaPitchedPtr,
}

/// The driver's side of a 3D copy: `(x in bytes, y, z, memory type, pointer, array, pitch, slice
/// height)`.
type DriverSide = (usize, usize, usize, c_uint, u64, CUarray, usize, usize);

/// The driver's description of a runtime 3D copy, `None` when there is nothing to copy. Each side
/// is an array or memory, never both. Where an array takes part, the width and both sides' x
/// count its elements (both arrays' elements must be of one size): CUDA documents a memory side's
/// x in bytes, but CUDA 13's runtime takes it in the array's elements (an H100: `srcPos.x` 8 next
/// to a float array reads from byte 32), and programs that work natively are written so. Without
/// an array, all are bytes. `symbol` names the copy in what cannot be done.
fn describe_3d(
    src: Side3D<'_>,
    dst: Side3D<'_>,
    extent: &cudaExtent,
    kind: cudaMemcpyKind,
    symbol: &str,
) -> CudaResult<Option<CUDA_MEMCPY3D>> {
    let is_array = |side: &Side3D<'_>| match (side.array.is_null(), side.ptr.ptr.is_null()) {
        (false, true) => Ok(true),
        (true, false) => Ok(false),
        _ => Err(CudaError::INVALID_VALUE),
    };
    let (src_is_array, dst_is_array) = (is_array(&src)?, is_array(&dst)?);
    if extent.width == 0 || extent.height == 0 || extent.depth == 0 {
        return Ok(None);
    }
    let memory = |side: &Side3D<'_>, array: bool| (!array).then_some(side.ptr.ptr as u64);
    check_sides(memory(&dst, dst_is_array), memory(&src, src_is_array), kind)?;
    let src_element = if src_is_array { Some(array_element_size(src.array, symbol)?) } else { None };
    let dst_element = if dst_is_array { Some(array_element_size(dst.array, symbol)?) } else { None };
    let element = match (src_element, dst_element) {
        (Some(a), Some(b)) if a != b => return Err(CudaError::INVALID_VALUE),
        (Some(size), _) | (None, Some(size)) => size,
        (None, None) => 1,
    };
    let width = extent.width.checked_mul(element).ok_or(CudaError::INVALID_VALUE)?;
    let driver_side = |side: &Side3D<'_>, is_array: bool| -> CudaResult<DriverSide> {
        let cudaPos { x, y, z } = *side.pos;
        let x = x.checked_mul(element).ok_or(CudaError::INVALID_VALUE)?;
        if is_array {
            return Ok((x, y, z, MEMORYTYPE_ARRAY, 0, side.array, 0, 0));
        }
        let cudaPitchedPtr { ptr, pitch, ysize, .. } = *side.ptr;
        if (extent.height > 1 || extent.depth > 1) && pitch < width {
            return Err(CudaError::INVALID_PITCH_VALUE);
        }
        // Slices of fewer rows than the copy's would overlap.
        if extent.depth > 1 && y.checked_add(extent.height).is_none_or(|rows| rows > ysize) {
            return Err(CudaError::INVALID_VALUE);
        }
        Ok((x, y, z, MEMORYTYPE_UNIFIED, ptr as u64, std::ptr::null_mut(), pitch, ysize))
    };
    let (src_x, src_y, src_z, src_type, src_ptr, src_array, src_pitch, src_height) = driver_side(&src, src_is_array)?;
    let (dst_x, dst_y, dst_z, dst_type, dst_ptr, dst_array, dst_pitch, dst_height) = driver_side(&dst, dst_is_array)?;
    Ok(Some(CUDA_MEMCPY3D {
        srcXInBytes: src_x,
        srcY: src_y,
        srcZ: src_z,
        srcLOD: 0,
        srcMemoryType: src_type,
        srcHost: src_ptr as usize as *const c_void,
        srcDevice: src_ptr,
        srcArray: src_array.cast(),
        reserved0: std::ptr::null_mut(),
        srcPitch: src_pitch,
        srcHeight: src_height,
        dstXInBytes: dst_x,
        dstY: dst_y,
        dstZ: dst_z,
        dstLOD: 0,
        dstMemoryType: dst_type,
        dstHost: dst_ptr as usize as *mut c_void,
        dstDevice: dst_ptr,
        dstArray: dst_array.cast(),
        reserved1: std::ptr::null_mut(),
        dstPitch: dst_pitch,
        dstHeight: dst_height,
        WidthInBytes: width,
        Height: extent.height,
        Depth: extent.depth,
    }))
}

fn copy_3d(copy: &CUDA_MEMCPY3D, stream: cudaStream_t, mode: Mode, per_thread: bool) -> CudaResult<()> {
    match (mode, per_thread) {
        (Mode::Synchronous, false) => cu_ctx!(cuMemcpy3D_v2(copy)),
        (Mode::Synchronous, true) => cu_ctx!(cuMemcpy3D_v2_ptds(copy)),
        (Mode::Asynchronous, false) => cu_ctx!(cuMemcpy3DAsync_v2(copy, stream.cast())),
        (Mode::Asynchronous, true) => cu_ctx!(cuMemcpy3DAsync_v2_ptsz(copy, stream.cast())),
    }
}

/// # Safety
/// `params` is NULL or a readable `cudaMemcpy3DParms`.
unsafe fn memcpy_3d(params: *const cudaMemcpy3DParms, stream: cudaStream_t, mode: Mode, per_thread: bool) -> CudaResult<()> {
    if params.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    // SAFETY: checked non-NULL; the app's struct.
    let p = unsafe { &*params };
    let src = Side3D { array: p.src_array, pos: &p.src_pos, ptr: &p.src_ptr };
    let dst = Side3D { array: p.dst_array, pos: &p.dst_pos, ptr: &p.dst_ptr };
    match describe_3d(src, dst, &p.extent, p.kind, "cudaMemcpy3D")? {
        Some(copy) => copy_3d(&copy, stream, mode, per_thread),
        None => Ok(()),
    }
}

/// A 3D copy between devices: between memory of the thread's current device it is a plain 3D
/// copy; otherwise the driver copies between the two devices' primary contexts.
///
/// # Safety
/// `params` is NULL or a readable `cudaMemcpy3DPeerParms`.
unsafe fn memcpy_3d_peer(params: *const cudaMemcpy3DPeerParms, stream: cudaStream_t, mode: Mode, per_thread: bool) -> CudaResult<()> {
    if params.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    // SAFETY: checked non-NULL; the app's struct.
    let p = unsafe { &*params };
    let (src_device, dst_device) = (valid_device(p.src_device)?, valid_device(p.dst_device)?);
    let src = Side3D { array: p.src_array, pos: &p.src_pos, ptr: &p.src_ptr };
    let dst = Side3D { array: p.dst_array, pos: &p.dst_pos, ptr: &p.dst_ptr };
    let Some(copy) = describe_3d(src, dst, &p.extent, DEFAULT, "cudaMemcpy3DPeer")? else {
        return Ok(());
    };
    let current = current_device();
    if src_device == current && dst_device == current {
        return copy_3d(&copy, stream, mode, per_thread);
    }
    let copy = peer_copy(&copy, device_context(src_device)?, device_context(dst_device)?);
    match (mode, per_thread) {
        (Mode::Synchronous, false) => cu_ctx!(cuMemcpy3DPeer(&copy)),
        (Mode::Synchronous, true) => cu_ctx!(cuMemcpy3DPeer_ptds(&copy)),
        (Mode::Asynchronous, false) => cu_ctx!(cuMemcpy3DPeerAsync(&copy, stream.cast())),
        (Mode::Asynchronous, true) => cu_ctx!(cuMemcpy3DPeerAsync_ptsz(&copy, stream.cast())),
    }
}

/// `copy` between the primary contexts of two devices: `CUDA_MEMCPY3D_PEER` is `CUDA_MEMCPY3D` with
/// each side's context where the latter has a reserved field.
fn peer_copy(copy: &CUDA_MEMCPY3D, src_context: CUcontext, dst_context: CUcontext) -> CUDA_MEMCPY3D_PEER {
    CUDA_MEMCPY3D_PEER {
        srcXInBytes: copy.srcXInBytes,
        srcY: copy.srcY,
        srcZ: copy.srcZ,
        srcLOD: copy.srcLOD,
        srcMemoryType: copy.srcMemoryType,
        srcHost: copy.srcHost,
        srcDevice: copy.srcDevice,
        srcArray: copy.srcArray,
        srcContext: src_context,
        srcPitch: copy.srcPitch,
        srcHeight: copy.srcHeight,
        dstXInBytes: copy.dstXInBytes,
        dstY: copy.dstY,
        dstZ: copy.dstZ,
        dstLOD: copy.dstLOD,
        dstMemoryType: copy.dstMemoryType,
        dstHost: copy.dstHost,
        dstDevice: copy.dstDevice,
        dstArray: copy.dstArray,
        dstContext: dst_context,
        dstPitch: copy.dstPitch,
        dstHeight: copy.dstHeight,
        WidthInBytes: copy.WidthInBytes,
        Height: copy.Height,
        Depth: copy.Depth,
    }
}

/// The four forms of each 3D copy: synchronous or asynchronous, on the legacy or the per-thread
/// default stream.
macro_rules! copies_3d {
    ($($name:ident ($params:ty $(, $stream:ident)?) => $via:ident, $mode:ident, $per_thread:literal;)*) => {$(
        pub unsafe fn $name(params: *const $params $(, $stream: cudaStream_t)?) -> CudaResult<()> {
            #[allow(unused_mut, unused_assignments, reason = "the synchronous forms have no stream")]
            let mut stream: cudaStream_t = std::ptr::null_mut();
            $(stream = $stream;)?
            // SAFETY: the app's struct.
            unsafe { $via(params, stream, Mode::$mode, $per_thread) }
        }
    )*};
}

copies_3d! {
    cudaMemcpy3D(cudaMemcpy3DParms) => memcpy_3d, Synchronous, false;
    cudaMemcpy3D_ptds(cudaMemcpy3DParms) => memcpy_3d, Synchronous, true;
    cudaMemcpy3DAsync(cudaMemcpy3DParms, stream) => memcpy_3d, Asynchronous, false;
    cudaMemcpy3DAsync_ptsz(cudaMemcpy3DParms, stream) => memcpy_3d, Asynchronous, true;
    cudaMemcpy3DPeer(cudaMemcpy3DPeerParms) => memcpy_3d_peer, Synchronous, false;
    cudaMemcpy3DPeer_ptds(cudaMemcpy3DPeerParms) => memcpy_3d_peer, Synchronous, true;
    cudaMemcpy3DPeerAsync(cudaMemcpy3DPeerParms, stream) => memcpy_3d_peer, Asynchronous, false;
    cudaMemcpy3DPeerAsync_ptsz(cudaMemcpy3DPeerParms, stream) => memcpy_3d_peer, Asynchronous, true;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(x: c_int, y: c_int, z: c_int, w: c_int, f: c_int) -> cudaChannelFormatDesc {
        cudaChannelFormatDesc { x, y, z, w, f }
    }

    #[test]
    fn channel_descriptions_are_formats_and_back() {
        for (kind, size, format) in PLAIN_FORMATS {
            for channels in [1, 2, 4] {
                let size_of = |index: c_int| if index < channels { size } else { 0 };
                let runtime = desc(size_of(0), size_of(1), size_of(2), size_of(3), kind);
                assert_eq!(array_format(&runtime), Ok((format, channels as c_uint)));
                assert_eq!(channel_desc(format, channels as c_uint), runtime);
            }
        }
        for (kind, [x, y, z, w], format) in SPECIAL_FORMATS {
            let (found, channels) = array_format(&desc(x, y, z, w, kind)).unwrap();
            assert_eq!(found, format);
            assert_eq!(channel_desc(found, channels), desc(x, y, z, w, kind));
        }
        assert_eq!(array_format(&desc(16, 16, 0, 0, KIND_FLOAT)), Ok((0x10, 2)));
        assert_eq!(channel_desc(0xa5, 2).f, KIND_NONE);
    }

    #[test]
    fn invalid_channel_descriptions_are_refused() {
        for invalid in [
            desc(8, 16, 0, 0, KIND_UNSIGNED),
            desc(8, 8, 8, 0, KIND_SIGNED),
            desc(8, 0, 8, 0, KIND_UNSIGNED),
            desc(0, 8, 0, 0, KIND_UNSIGNED),
            desc(8, 0, 0, 0, KIND_FLOAT),
            desc(64, 0, 0, 0, KIND_FLOAT),
            desc(-8, 0, 0, 0, KIND_SIGNED),
            desc(0, 0, 0, 0, KIND_NONE),
            desc(32, 0, 0, 0, KIND_NONE),
            desc(8, 8, 0, 0, 5),
            desc(32, 0, 0, 0, 99),
        ] {
            assert_eq!(array_format(&invalid), Err(invalid_channel_descriptor()), "{invalid:?}");
        }
    }

    /// `(dst x, dst y, src x, src y, width, height)` of each piece, and the memory side's pitch.
    fn shapes(dst: Run, src: Run, count: usize) -> Vec<(usize, usize, usize, usize, usize, usize, usize)> {
        pieces(dst, src, count)
            .iter()
            .map(|p| (p.dstXInBytes, p.dstY, p.srcXInBytes, p.srcY, p.WidthInBytes, p.Height, p.srcPitch.max(p.dstPitch)))
            .collect()
    }

    #[test]
    fn one_dimensional_array_copies_run_on_along_the_rows() {
        let array = |x, y| Run::Array { array: std::ptr::dangling_mut(), row: 256, x, y };
        // From the middle of a row: the rest of it, whole rows, then the start of the last.
        assert_eq!(
            shapes(array(8, 2), Run::Memory(0x1000), 8 + 600),
            [(8, 2, 0, 0, 248, 1, 248), (0, 3, 0, 0, 256, 1, 256), (0, 4, 0, 0, 104, 1, 104)]
        );
        // From the start of a row: the whole rows in one piece.
        assert_eq!(shapes(Run::Memory(0x1000), array(0, 0), 4096), [(0, 0, 0, 0, 256, 16, 256)]);
        let [first, second] = pieces(Run::Memory(0x1000), array(0, 1), 300).try_into().ok().unwrap();
        assert_eq!((first.dstDevice, first.WidthInBytes, second.dstDevice, second.WidthInBytes), (0x1000, 256, 0x1100, 44));
        // Between arrays whose rows are out of step: no piece crosses a row of either.
        let other = |x, y| Run::Array { array: std::ptr::dangling_mut(), row: 128, x, y };
        assert_eq!(
            shapes(other(100, 0), array(200, 0), 100),
            [(100, 0, 200, 0, 28, 1, 0), (0, 1, 228, 0, 28, 1, 0), (28, 1, 0, 1, 44, 1, 0)]
        );
    }
}
