//! The CUDA backend's pitched memory, shaped copies, arrays, textures and surfaces. The
//! descriptors are declared here with plain integer fields (the driver's enums as `unsigned`,
//! which shares their ABI), so a value this build does not know stays a number the driver
//! rejects instead of an invalid Rust enum.

use std::ffi::{c_int, c_uint};

use cudarc::driver::sys;
use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{ArrayDesc, DecompressOp, Resource, SparseProperties, Subresource, TextureDesc, ViewDesc};

use super::cuda::{CudaDevice, Handle, check, raw_check};
use super::{ArrayMapWork, ArrayRef, Extent, Side, TexResource};

/// `CUDA_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
struct RawArrayDesc {
    width: usize,
    height: usize,
    depth: usize,
    format: c_uint,
    channels: c_uint,
    flags: c_uint,
}

/// `CUDA_RESOURCE_DESC`: the type, a 128-byte union and flags.
#[repr(C)]
struct RawResourceDesc {
    kind: c_uint,
    res: [u64; 16],
    flags: c_uint,
}

/// `CUDA_TEXTURE_DESC`.
#[repr(C)]
struct RawTextureDesc {
    address_mode: [c_uint; 3],
    filter_mode: c_uint,
    flags: c_uint,
    max_anisotropy: c_uint,
    mipmap_filter_mode: c_uint,
    mipmap_level_bias: f32,
    min_mipmap_level_clamp: f32,
    max_mipmap_level_clamp: f32,
    border_color: [f32; 4],
    reserved: [c_int; 12],
}

/// `CUDA_RESOURCE_VIEW_DESC`.
#[repr(C)]
struct RawViewDesc {
    format: c_uint,
    width: usize,
    height: usize,
    depth: usize,
    first_mipmap_level: c_uint,
    last_mipmap_level: c_uint,
    first_layer: c_uint,
    last_layer: c_uint,
    reserved: [c_uint; 16],
}

/// `CUDA_ARRAY_SPARSE_PROPERTIES`.
#[repr(C)]
#[derive(Default)]
struct RawSparseProperties {
    tile: [c_uint; 3],
    miptail_first_level: c_uint,
    miptail_size: u64,
    flags: c_uint,
    reserved: [c_uint; 4],
}

/// `CUDA_ARRAY_MEMORY_REQUIREMENTS`.
#[repr(C)]
#[derive(Default)]
struct RawMemoryRequirements {
    size: usize,
    alignment: usize,
    reserved: [c_uint; 4],
}

/// `CUarrayMapInfo`'s `subresource.miptail`.
#[repr(C)]
#[derive(Clone, Copy)]
struct RawMiptail {
    layer: c_uint,
    offset: u64,
    size: u64,
}

/// `CUarrayMapInfo`'s `subresource`: `sparseLevel` (level, layer, offsets, extents) or
/// `miptail`.
#[repr(C)]
union RawSubresource {
    sparse_level: [c_uint; 8],
    miptail: RawMiptail,
}

/// `CUarrayMapInfo`, its enums as `unsigned`.
#[repr(C)]
struct RawArrayMapInfo {
    resource_type: c_uint,
    /// `resource`: the `CUarray` or `CUmipmappedArray`.
    resource: *mut std::ffi::c_void,
    subresource_type: c_uint,
    subresource: RawSubresource,
    mem_operation_type: c_uint,
    mem_handle_type: c_uint,
    mem_handle: u64,
    offset: u64,
    device_bit_mask: c_uint,
    flags: c_uint,
    reserved: [c_uint; 2],
}

/// `CUmemDecompressParams`, its pointers as addresses.
#[repr(C)]
struct RawDecompressParams {
    src_num_bytes: usize,
    dst_num_bytes: usize,
    dst_act_bytes: u64,
    src: u64,
    dst: u64,
    algo: c_uint,
    padding: [u8; 20],
}

// The sizes and offsets `cuda.h` gives them (x86_64, checked with the C compiler).
const _: () = {
    assert!(size_of::<RawResourceDesc>() == 144 && size_of::<RawTextureDesc>() == 104 && size_of::<RawViewDesc>() == 112);
    assert!(size_of::<RawSparseProperties>() == 48 && size_of::<RawMemoryRequirements>() == 32);
    assert!(size_of::<RawArrayMapInfo>() == 96);
    assert!(std::mem::offset_of!(RawArrayMapInfo, subresource) == 24);
    assert!(std::mem::offset_of!(RawArrayMapInfo, mem_operation_type) == 56);
    assert!(std::mem::offset_of!(RawArrayMapInfo, mem_handle) == 64);
    assert!(std::mem::offset_of!(RawArrayMapInfo, device_bit_mask) == 80);
    assert!(std::mem::offset_of!(RawMiptail, offset) == 8 && std::mem::offset_of!(RawMiptail, size) == 16);
    assert!(size_of::<RawDecompressParams>() == 64 && std::mem::offset_of!(RawDecompressParams, algo) == 40);
};

/// `CUarraySparseSubresourceType`, `CUmemOperationType`.
const SUBRESOURCE_SPARSE_LEVEL: c_uint = 0;
const SUBRESOURCE_MIPTAIL: c_uint = 1;
const OPERATION_MAP: c_uint = 1;
const OPERATION_UNMAP: c_uint = 2;

/// `CUresourcetype`.
mod resource_type {
    pub const ARRAY: u32 = 0;
    pub const MIPMAPPED_ARRAY: u32 = 1;
    pub const LINEAR: u32 = 2;
    pub const PITCH2D: u32 = 3;
}

/// The entry points that take those descriptors (and a stream attribute's raw value).
pub struct RawArrays {
    array_3d_create: unsafe extern "C" fn(*mut sys::CUarray, *const RawArrayDesc) -> u32,
    mipmapped_array_create: unsafe extern "C" fn(*mut sys::CUmipmappedArray, *const RawArrayDesc, c_uint) -> u32,
    tex_object_create: unsafe extern "C" fn(*mut u64, *const RawResourceDesc, *const RawTextureDesc, *const RawViewDesc) -> u32,
    surf_object_create: unsafe extern "C" fn(*mut u64, *const RawResourceDesc) -> u32,
    stream_set_attribute: unsafe extern "C" fn(sys::CUstream, c_uint, *const [u8; 64]) -> u32,
    stream_get_attribute: unsafe extern "C" fn(sys::CUstream, c_uint, *mut [u8; 64]) -> u32,
    array_get_descriptor: unsafe extern "C" fn(*mut RawArrayDesc, sys::CUarray) -> u32,
    // Newer than some drivers a server may run on: `None` answers not-supported.
    array_get_plane: Option<unsafe extern "C" fn(*mut sys::CUarray, sys::CUarray, c_uint) -> u32>,
    array_sparse_properties: Option<unsafe extern "C" fn(*mut RawSparseProperties, sys::CUarray) -> u32>,
    mipmap_sparse_properties: Option<unsafe extern "C" fn(*mut RawSparseProperties, sys::CUmipmappedArray) -> u32>,
    array_memory_requirements: Option<unsafe extern "C" fn(*mut RawMemoryRequirements, sys::CUarray, sys::CUdevice) -> u32>,
    mipmap_memory_requirements: Option<unsafe extern "C" fn(*mut RawMemoryRequirements, sys::CUmipmappedArray, sys::CUdevice) -> u32>,
    map_array: Option<unsafe extern "C" fn(*mut RawArrayMapInfo, c_uint, sys::CUstream) -> u32>,
    batch_decompress: Option<unsafe extern "C" fn(*mut RawDecompressParams, usize, c_uint, *mut usize, sys::CUstream) -> u32>,
}

impl RawArrays {
    pub fn load() -> Result<Self, String> {
        // SAFETY: as in `RawDriver::load`: the driver library is loaded, and each symbol gets its
        // documented C signature with the descriptors declared above.
        unsafe {
            let lib = sys::culib();
            Ok(Self {
                array_3d_create: required_symbol!(lib, "cuArray3DCreate_v2"),
                mipmapped_array_create: required_symbol!(lib, "cuMipmappedArrayCreate"),
                tex_object_create: required_symbol!(lib, "cuTexObjectCreate"),
                surf_object_create: required_symbol!(lib, "cuSurfObjectCreate"),
                stream_set_attribute: required_symbol!(lib, "cuStreamSetAttribute"),
                stream_get_attribute: required_symbol!(lib, "cuStreamGetAttribute"),
                array_get_descriptor: required_symbol!(lib, "cuArray3DGetDescriptor_v2"),
                array_get_plane: optional_symbol!(lib, "cuArrayGetPlane"),
                array_sparse_properties: optional_symbol!(lib, "cuArrayGetSparseProperties"),
                mipmap_sparse_properties: optional_symbol!(lib, "cuMipmappedArrayGetSparseProperties"),
                array_memory_requirements: optional_symbol!(lib, "cuArrayGetMemoryRequirements"),
                mipmap_memory_requirements: optional_symbol!(lib, "cuMipmappedArrayGetMemoryRequirements"),
                map_array: optional_symbol!(lib, "cuMemMapArrayAsync"),
                batch_decompress: optional_symbol!(lib, "cuMemBatchDecompressAsync"),
            })
        }
    }
}

fn raw_array_desc(desc: &ArrayDesc) -> CudaResult<RawArrayDesc> {
    let size = |value: u64| usize::try_from(value).map_err(|_| CudaError::INVALID_VALUE);
    Ok(RawArrayDesc {
        width: size(desc.width)?,
        height: size(desc.height)?,
        depth: size(desc.depth)?,
        format: desc.format,
        channels: desc.channels,
        flags: desc.flags,
    })
}

fn resource(kind: u32, fields: &[u64]) -> RawResourceDesc {
    let mut res = [0u64; 16];
    res[..fields.len()].copy_from_slice(fields);
    RawResourceDesc { kind, res, flags: 0 }
}

/// One side of a `CUDA_MEMCPY3D`, field by field.
struct RawSide {
    memory_type: sys::CUmemorytype,
    host: *mut u8,
    device: u64,
    array: sys::CUarray,
    x: usize,
    y: usize,
    z: usize,
    pitch: usize,
    height: usize,
}

fn raw_side(side: Side<CudaDevice>) -> CudaResult<RawSide> {
    let size = |value: u64| usize::try_from(value).map_err(|_| CudaError::INVALID_VALUE);
    let mut raw = RawSide {
        memory_type: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        host: std::ptr::null_mut(),
        device: 0,
        array: std::ptr::null_mut(),
        x: 0,
        y: 0,
        z: 0,
        pitch: 0,
        height: 0,
    };
    match side {
        Side::Device { ptr, pitch, height } => {
            (raw.device, raw.pitch, raw.height) = (ptr, size(pitch)?, size(height)?);
        }
        Side::Array { array, pos } => {
            raw.memory_type = sys::CUmemorytype::CU_MEMORYTYPE_ARRAY;
            (raw.array, raw.x, raw.y, raw.z) = (array.0, size(pos.x)?, size(pos.y)?, size(pos.z)?);
        }
        Side::Host { ptr, pitch, height } => {
            raw.memory_type = sys::CUmemorytype::CU_MEMORYTYPE_HOST;
            (raw.host, raw.pitch, raw.height) = (ptr, size(pitch)?, size(height)?);
        }
    }
    Ok(raw)
}

fn memcpy_3d(src: Side<CudaDevice>, dst: Side<CudaDevice>, extent: Extent) -> CudaResult<sys::CUDA_MEMCPY3D> {
    let (src, dst) = (raw_side(src)?, raw_side(dst)?);
    let size = |value: u64| usize::try_from(value).map_err(|_| CudaError::INVALID_VALUE);
    Ok(sys::CUDA_MEMCPY3D {
        srcXInBytes: src.x,
        srcY: src.y,
        srcZ: src.z,
        srcLOD: 0,
        srcMemoryType: src.memory_type,
        srcHost: src.host as *const std::ffi::c_void,
        srcDevice: src.device,
        srcArray: src.array,
        reserved0: std::ptr::null_mut(),
        srcPitch: src.pitch,
        srcHeight: src.height,
        dstXInBytes: dst.x,
        dstY: dst.y,
        dstZ: dst.z,
        dstLOD: 0,
        dstMemoryType: dst.memory_type,
        dstHost: dst.host.cast(),
        dstDevice: dst.device,
        dstArray: dst.array,
        reserved1: std::ptr::null_mut(),
        dstPitch: dst.pitch,
        dstHeight: dst.height,
        WidthInBytes: size(extent.width)?,
        Height: size(extent.height)?,
        Depth: size(extent.depth)?,
    })
}

impl CudaDevice {
    pub(super) fn pitch_alloc(&self, width: u64, height: u64, element_size: u32) -> CudaResult<(u64, u64)> {
        let (mut ptr, mut pitch) = (0u64, 0usize);
        let size = |value: u64| usize::try_from(value).map_err(|_| CudaError::INVALID_VALUE);
        // SAFETY: valid out-pointers; a context is current on this thread.
        check(unsafe { sys::cuMemAllocPitch_v2(&mut ptr, &mut pitch, size(width)?, size(height)?, element_size) }.result())?;
        Ok((ptr, pitch as u64))
    }

    pub(super) fn set_2d(&self, set: &flyt_protocol::ops::Memset2d, stream: sys::CUstream) -> CudaResult<()> {
        let size = |value: u64| usize::try_from(value).map_err(|_| CudaError::INVALID_VALUE);
        let (pitch, width, height) = (size(set.pitch)?, size(set.width)?, size(set.height)?);
        // SAFETY: the session checked the rows against its ranges and the element size.
        check(unsafe {
            match set.element_size {
                1 => sys::cuMemsetD2D8Async(set.dst, pitch, set.value as u8, width, height, stream),
                2 => sys::cuMemsetD2D16Async(set.dst, pitch, set.value as u16, width, height, stream),
                _ => sys::cuMemsetD2D32Async(set.dst, pitch, set.value, width, height, stream),
            }
            .result()
        })
    }

    /// # Safety
    /// Host sides lie in pinned memory that stays mapped while the copy runs.
    pub(super) unsafe fn shaped(&self, src: Side<Self>, dst: Side<Self>, extent: Extent, stream: sys::CUstream) -> CudaResult<()> {
        let params = memcpy_3d(src, dst, extent)?;
        // SAFETY: the session checked device ranges and array bounds; host sides per the
        // caller's contract.
        check(unsafe { sys::cuMemcpy3DAsync_v2(&params, stream) }.result())
    }

    pub(super) fn new_array(&self, desc: &ArrayDesc) -> CudaResult<Handle<sys::CUarray>> {
        let raw = raw_array_desc(desc)?;
        let mut array = std::ptr::null_mut();
        // SAFETY: valid out-pointer and descriptor.
        raw_check(unsafe { (self.arrays.array_3d_create)(&mut array, &raw) })?;
        Ok(Handle::new(array))
    }

    pub(super) fn destroy_array(&self, array: Handle<sys::CUarray>) -> CudaResult<()> {
        // SAFETY: an array this session created (its own, not a mipmap level), destroyed once.
        check(unsafe { sys::cuArrayDestroy(array.0) }.result())
    }

    pub(super) fn new_mipmap(&self, desc: &ArrayDesc, levels: u32) -> CudaResult<Handle<sys::CUmipmappedArray>> {
        let raw = raw_array_desc(desc)?;
        let mut mipmap = std::ptr::null_mut();
        // SAFETY: valid out-pointer and descriptor.
        raw_check(unsafe { (self.arrays.mipmapped_array_create)(&mut mipmap, &raw, levels) })?;
        Ok(Handle::new(mipmap))
    }

    pub(super) fn level(&self, mipmap: Handle<sys::CUmipmappedArray>, level: u32) -> CudaResult<Handle<sys::CUarray>> {
        let mut array = std::ptr::null_mut();
        // SAFETY: a mipmapped array of this session; valid out-pointer.
        check(unsafe { sys::cuMipmappedArrayGetLevel(&mut array, mipmap.0, level) }.result())?;
        Ok(Handle::new(array))
    }

    pub(super) fn destroy_mipmap(&self, mipmap: Handle<sys::CUmipmappedArray>) -> CudaResult<()> {
        // SAFETY: a mipmapped array of this session, destroyed once.
        check(unsafe { sys::cuMipmappedArrayDestroy(mipmap.0) }.result())
    }

    pub(super) fn new_texture(&self, resource: TexResource<Self>, texture: &TextureDesc, view: Option<&ViewDesc>) -> CudaResult<u64> {
        let raw_resource = match resource {
            TexResource::Array(array) => self::resource(resource_type::ARRAY, &[array.0 as u64]),
            TexResource::Mipmapped(mipmap) => self::resource(resource_type::MIPMAPPED_ARRAY, &[mipmap.0 as u64]),
            TexResource::Memory(Resource::Linear { ptr, format, channels, size }) => {
                self::resource(resource_type::LINEAR, &[ptr, u64::from(format) | u64::from(channels) << 32, size])
            }
            TexResource::Memory(Resource::Pitch2d { ptr, format, channels, width, height, pitch }) => {
                self::resource(resource_type::PITCH2D, &[ptr, u64::from(format) | u64::from(channels) << 32, width, height, pitch])
            }
            TexResource::Memory(_) => return Err(CudaError::INVALID_VALUE),
        };
        let raw_texture = RawTextureDesc {
            address_mode: texture.address_mode,
            filter_mode: texture.filter_mode,
            flags: texture.flags,
            max_anisotropy: texture.max_anisotropy,
            mipmap_filter_mode: texture.mipmap_filter_mode,
            mipmap_level_bias: f32::from_bits(texture.mipmap_level_bias),
            min_mipmap_level_clamp: f32::from_bits(texture.min_mipmap_level_clamp),
            max_mipmap_level_clamp: f32::from_bits(texture.max_mipmap_level_clamp),
            border_color: texture.border_color.map(f32::from_bits),
            reserved: [0; 12],
        };
        let size = |value: u64| usize::try_from(value).map_err(|_| CudaError::INVALID_VALUE);
        let raw_view = view
            .map(|view| {
                Ok::<_, CudaError>(RawViewDesc {
                    format: view.format,
                    width: size(view.width)?,
                    height: size(view.height)?,
                    depth: size(view.depth)?,
                    first_mipmap_level: view.first_mipmap_level,
                    last_mipmap_level: view.last_mipmap_level,
                    first_layer: view.first_layer,
                    last_layer: view.last_layer,
                    reserved: [0; 16],
                })
            })
            .transpose()?;
        let mut handle = 0u64;
        let view_ptr = raw_view.as_ref().map_or(std::ptr::null(), |view| view as *const RawViewDesc);
        // SAFETY: valid out-pointer and descriptors; the resource's arrays and memory are the
        // session's (checked).
        raw_check(unsafe { (self.arrays.tex_object_create)(&mut handle, &raw_resource, &raw_texture, view_ptr) })?;
        Ok(handle)
    }

    pub(super) fn new_surface(&self, array: Handle<sys::CUarray>) -> CudaResult<u64> {
        let raw = resource(resource_type::ARRAY, &[array.0 as u64]);
        let mut handle = 0u64;
        // SAFETY: valid out-pointer and descriptor over an array of the session.
        raw_check(unsafe { (self.arrays.surf_object_create)(&mut handle, &raw) })?;
        Ok(handle)
    }

    pub(super) fn destroy_object(&self, handle: u64, surface: bool) -> CudaResult<()> {
        // SAFETY: a texture or surface object this session created, destroyed once.
        check(unsafe { if surface { sys::cuSurfObjectDestroy(handle) } else { sys::cuTexObjectDestroy(handle) } }.result())
    }

    pub(super) fn plane(&self, array: Handle<sys::CUarray>, plane: u32) -> CudaResult<(Handle<sys::CUarray>, ArrayDesc)> {
        let get_plane = self.arrays.array_get_plane.ok_or(CudaError::NOT_SUPPORTED)?;
        let mut plane_array = std::ptr::null_mut();
        // SAFETY: a planar array of the session's; valid out-pointer.
        raw_check(unsafe { get_plane(&mut plane_array, array.0, plane) })?;
        let mut raw = RawArrayDesc { width: 0, height: 0, depth: 0, format: 0, channels: 0, flags: 0 };
        // SAFETY: the plane just given; valid out-pointer to a whole descriptor.
        raw_check(unsafe { (self.arrays.array_get_descriptor)(&mut raw, plane_array) })?;
        let desc = ArrayDesc {
            width: raw.width as u64,
            height: raw.height as u64,
            depth: raw.depth as u64,
            format: raw.format,
            channels: raw.channels,
            flags: raw.flags,
        };
        Ok((Handle::new(plane_array), desc))
    }

    pub(super) fn sparse_of(&self, target: ArrayRef<Self>) -> CudaResult<SparseProperties> {
        let mut raw = RawSparseProperties::default();
        // SAFETY: a sparse array or mipmapped array of the session's; valid out-pointer.
        let code = unsafe {
            match target {
                ArrayRef::Array(array) => (self.arrays.array_sparse_properties.ok_or(CudaError::NOT_SUPPORTED)?)(&mut raw, array.0),
                ArrayRef::Mipmap(mipmap) => (self.arrays.mipmap_sparse_properties.ok_or(CudaError::NOT_SUPPORTED)?)(&mut raw, mipmap.0),
            }
        };
        raw_check(code)?;
        Ok(SparseProperties {
            tile: raw.tile,
            miptail_first_level: raw.miptail_first_level,
            miptail_size: raw.miptail_size,
            flags: raw.flags,
        })
    }

    pub(super) fn requirements_of(&self, target: ArrayRef<Self>, device: sys::CUdevice) -> CudaResult<(u64, u64)> {
        let mut raw = RawMemoryRequirements::default();
        // SAFETY: a deferred-mapping array or mipmapped array of the session's, on its device;
        // valid out-pointer.
        let code = unsafe {
            match target {
                ArrayRef::Array(array) => {
                    (self.arrays.array_memory_requirements.ok_or(CudaError::NOT_SUPPORTED)?)(&mut raw, array.0, device)
                }
                ArrayRef::Mipmap(mipmap) => {
                    (self.arrays.mipmap_memory_requirements.ok_or(CudaError::NOT_SUPPORTED)?)(&mut raw, mipmap.0, device)
                }
            }
        };
        raw_check(code)?;
        Ok((raw.size as u64, raw.alignment as u64))
    }

    /// `cuMemMapArrayAsync` for `device` (its ordinal's bit).
    pub(super) fn map_array_work(&self, maps: &[ArrayMapWork<Self>], stream: sys::CUstream, device: sys::CUdevice) -> CudaResult<()> {
        let map_array = self.arrays.map_array.ok_or(CudaError::NOT_SUPPORTED)?;
        let device_bit_mask = u32::try_from(device).ok().and_then(|ordinal| 1u32.checked_shl(ordinal)).ok_or(CudaError::INVALID_DEVICE)?;
        let mut raw: Vec<RawArrayMapInfo> = maps
            .iter()
            .map(|map| {
                let (resource_type, resource) = match map.target {
                    ArrayRef::Array(array) => (resource_type::ARRAY, array.0.cast()),
                    ArrayRef::Mipmap(mipmap) => (resource_type::MIPMAPPED_ARRAY, mipmap.0.cast()),
                };
                let (subresource_type, subresource) = match map.subresource {
                    Subresource::SparseLevel { level, layer, offset, extent } => (
                        SUBRESOURCE_SPARSE_LEVEL,
                        RawSubresource { sparse_level: [level, layer, offset[0], offset[1], offset[2], extent[0], extent[1], extent[2]] },
                    ),
                    Subresource::Miptail { layer, offset, size } => {
                        (SUBRESOURCE_MIPTAIL, RawSubresource { miptail: RawMiptail { layer, offset, size } })
                    }
                    // Ignored by the driver for a deferred-mapping array.
                    Subresource::Whole => (SUBRESOURCE_SPARSE_LEVEL, RawSubresource { sparse_level: [0; 8] }),
                };
                let (mem_operation_type, mem_handle, offset) = match map.memory {
                    Some((handle, offset)) => (OPERATION_MAP, handle, offset),
                    None => (OPERATION_UNMAP, 0, 0),
                };
                RawArrayMapInfo {
                    resource_type,
                    resource,
                    subresource_type,
                    subresource,
                    mem_operation_type,
                    mem_handle_type: 0,
                    mem_handle,
                    offset,
                    device_bit_mask,
                    flags: 0,
                    reserved: [0; 2],
                }
            })
            .collect();
        let count = c_uint::try_from(raw.len()).map_err(|_| CudaError::INVALID_VALUE)?;
        // SAFETY: `count` complete entries naming arrays and tile pools of the session's, their
        // subresources and offsets checked by it; a stream of the session's.
        raw_check(unsafe { map_array(raw.as_mut_ptr(), count, stream) })
    }

    pub(super) fn decompress(&self, ops: &[DecompressOp], stream: sys::CUstream) -> Result<(), (CudaError, Option<u64>)> {
        let whole = |error| (error, Some(u64::MAX));
        let batch_decompress = self.arrays.batch_decompress.ok_or(whole(CudaError::NOT_SUPPORTED))?;
        let size = |value: u64| usize::try_from(value).map_err(|_| whole(CudaError::INVALID_VALUE));
        let mut raw = ops
            .iter()
            .map(|op| {
                Ok(RawDecompressParams {
                    src_num_bytes: size(op.src_len)?,
                    dst_num_bytes: size(op.dst_len)?,
                    dst_act_bytes: op.dst_act_bytes,
                    src: op.src,
                    dst: op.dst,
                    algo: op.algo,
                    padding: [0; 20],
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        // A value the driver never writes (it writes an entry's index or SIZE_MAX): still there
        // after an error, the driver left the app's index alone (an H200 without the engine
        // does), and so does the app's copy.
        const UNTOUCHED: usize = usize::MAX - 1;
        let mut index = UNTOUCHED;
        // SAFETY: complete parameters whose buffers lie in the session's memory (checked by it);
        // `index` is a valid out-pointer; a stream of the session's.
        let code = unsafe { batch_decompress(raw.as_mut_ptr(), raw.len(), 0, &mut index, stream) };
        raw_check(code).map_err(|error| (error, (index != UNTOUCHED).then_some(index as u64)))
    }

    pub(super) fn attribute_of_stream(&self, stream: sys::CUstream, attribute: u32, set: Option<&[u8; 64]>) -> CudaResult<[u8; 64]> {
        if let Some(value) = set {
            // SAFETY: a stream of the session; a 64-byte value the session checked.
            raw_check(unsafe { (self.arrays.stream_set_attribute)(stream, attribute, value) })?;
        }
        let mut value = [0u8; 64];
        // SAFETY: as above; the driver writes at most a `CUstreamAttrValue` (64 bytes).
        raw_check(unsafe { (self.arrays.stream_get_attribute)(stream, attribute, &mut value) })?;
        Ok(value)
    }
}
