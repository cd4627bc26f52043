//! The CUDA backend's pitched memory, shaped copies, arrays, textures and surfaces. The
//! descriptors and entry points are the generated ones (`flyt-cuda-sys`: the driver's enums as
//! `unsigned`, which shares their ABI), so a value this build does not know stays a number the
//! driver rejects instead of an invalid Rust enum.

use std::ffi::c_uint;

use cudarc::driver::sys;
use flyt_cuda_sys::types::{
    CUDA_ARRAY_MEMORY_REQUIREMENTS, CUDA_ARRAY_SPARSE_PROPERTIES, CUDA_ARRAY3D_DESCRIPTOR, CUDA_RESOURCE_DESC,
    CUDA_RESOURCE_DESC_st_res_array, CUDA_RESOURCE_DESC_st_res_linear, CUDA_RESOURCE_DESC_st_res_mipmap, CUDA_RESOURCE_DESC_st_res_pitch2D,
    CUDA_RESOURCE_VIEW_DESC, CUDA_TEXTURE_DESC, CUarrayMapInfo, CUarrayMapInfo_st_memHandle, CUarrayMapInfo_st_resource,
    CUarrayMapInfo_st_subresource, CUarrayMapInfo_st_subresource_miptail, CUarrayMapInfo_st_subresource_sparseLevel, CUmemDecompressParams,
};
use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{ArrayDesc, DecompressOp, Resource, SparseProperties, Subresource, TextureDesc, ViewDesc};

use super::cuda::{CudaDevice, Handle, check, driver_table, entry, raw_check};
use super::{ArrayMapWork, ArrayRef, Extent, Side, TexResource};

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

/// The entry points that take those descriptors, required when the device opens (the others
/// here answer not-supported where the driver lacks them).
pub(super) const REQUIRED: &[&str] = &[
    "cuArray3DCreate_v2",
    "cuMipmappedArrayCreate",
    "cuTexObjectCreate",
    "cuSurfObjectCreate",
    "cuStreamSetAttribute",
    "cuStreamGetAttribute",
    "cuArray3DGetDescriptor_v2",
];

fn raw_array_desc(desc: &ArrayDesc) -> CudaResult<CUDA_ARRAY3D_DESCRIPTOR> {
    let size = |value: u64| usize::try_from(value).map_err(|_| CudaError::INVALID_VALUE);
    Ok(CUDA_ARRAY3D_DESCRIPTOR {
        Width: size(desc.width)?,
        Height: size(desc.height)?,
        Depth: size(desc.depth)?,
        Format: desc.format,
        NumChannels: desc.channels,
        Flags: desc.flags,
    })
}

/// A `CUDA_RESOURCE_DESC` of `kind`, all zero (its union included) but what `fill` writes.
fn resource(kind: u32, fill: impl FnOnce(&mut CUDA_RESOURCE_DESC)) -> CUDA_RESOURCE_DESC {
    // SAFETY: all-zero is a valid `CUDA_RESOURCE_DESC` (integers and null handles).
    let mut desc: CUDA_RESOURCE_DESC = unsafe { std::mem::zeroed() };
    desc.resType = kind;
    fill(&mut desc);
    desc
}

/// A `CUDA_RESOURCE_DESC` over a CUDA array.
fn array_resource(array: sys::CUarray) -> CUDA_RESOURCE_DESC {
    resource(resource_type::ARRAY, |desc| desc.res.array = CUDA_RESOURCE_DESC_st_res_array { hArray: array.cast() })
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
        let mut array: sys::CUarray = std::ptr::null_mut();
        // SAFETY: valid out-pointer and descriptor.
        raw_check(unsafe { driver_call!(driver_table(), cuArray3DCreate_v2((&raw mut array).cast(), &raw)) })?;
        Ok(Handle::new(array))
    }

    pub(super) fn destroy_array(&self, array: Handle<sys::CUarray>) -> CudaResult<()> {
        // SAFETY: an array this session created (its own, not a mipmap level), destroyed once.
        check(unsafe { sys::cuArrayDestroy(array.0) }.result())
    }

    pub(super) fn new_mipmap(&self, desc: &ArrayDesc, levels: u32) -> CudaResult<Handle<sys::CUmipmappedArray>> {
        let raw = raw_array_desc(desc)?;
        let mut mipmap: sys::CUmipmappedArray = std::ptr::null_mut();
        // SAFETY: valid out-pointer and descriptor.
        raw_check(unsafe { driver_call!(driver_table(), cuMipmappedArrayCreate((&raw mut mipmap).cast(), &raw, levels)) })?;
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
        let size = |value: u64| usize::try_from(value).map_err(|_| CudaError::INVALID_VALUE);
        let raw_resource = match resource {
            TexResource::Array(array) => array_resource(array.0),
            TexResource::Mipmapped(mipmap) => self::resource(resource_type::MIPMAPPED_ARRAY, |desc| {
                desc.res.mipmap = CUDA_RESOURCE_DESC_st_res_mipmap { hMipmappedArray: mipmap.0.cast() };
            }),
            TexResource::Memory(Resource::Linear { ptr, format, channels, size: bytes }) => {
                let linear = CUDA_RESOURCE_DESC_st_res_linear { devPtr: ptr, format, numChannels: channels, sizeInBytes: size(bytes)? };
                self::resource(resource_type::LINEAR, |desc| desc.res.linear = linear)
            }
            TexResource::Memory(Resource::Pitch2d { ptr, format, channels, width, height, pitch }) => {
                let pitch2d = CUDA_RESOURCE_DESC_st_res_pitch2D {
                    devPtr: ptr,
                    format,
                    numChannels: channels,
                    width: size(width)?,
                    height: size(height)?,
                    pitchInBytes: size(pitch)?,
                };
                self::resource(resource_type::PITCH2D, |desc| desc.res.pitch2D = pitch2d)
            }
            TexResource::Memory(_) => return Err(CudaError::INVALID_VALUE),
        };
        let raw_texture = CUDA_TEXTURE_DESC {
            addressMode: texture.address_mode,
            filterMode: texture.filter_mode,
            flags: texture.flags,
            maxAnisotropy: texture.max_anisotropy,
            mipmapFilterMode: texture.mipmap_filter_mode,
            mipmapLevelBias: f32::from_bits(texture.mipmap_level_bias),
            minMipmapLevelClamp: f32::from_bits(texture.min_mipmap_level_clamp),
            maxMipmapLevelClamp: f32::from_bits(texture.max_mipmap_level_clamp),
            borderColor: texture.border_color.map(f32::from_bits),
            reserved: [0; 12],
        };
        let raw_view = view
            .map(|view| {
                Ok::<_, CudaError>(CUDA_RESOURCE_VIEW_DESC {
                    format: view.format,
                    width: size(view.width)?,
                    height: size(view.height)?,
                    depth: size(view.depth)?,
                    firstMipmapLevel: view.first_mipmap_level,
                    lastMipmapLevel: view.last_mipmap_level,
                    firstLayer: view.first_layer,
                    lastLayer: view.last_layer,
                    reserved: [0; 16],
                })
            })
            .transpose()?;
        let mut handle = 0u64;
        let view_ptr = raw_view.as_ref().map_or(std::ptr::null(), |view| view as *const CUDA_RESOURCE_VIEW_DESC);
        // SAFETY: valid out-pointer and descriptors; the resource's arrays and memory are the
        // session's (checked).
        raw_check(unsafe { driver_call!(driver_table(), cuTexObjectCreate(&mut handle, &raw_resource, &raw_texture, view_ptr)) })?;
        Ok(handle)
    }

    pub(super) fn new_surface(&self, array: Handle<sys::CUarray>) -> CudaResult<u64> {
        let raw = array_resource(array.0);
        let mut handle = 0u64;
        // SAFETY: valid out-pointer and descriptor over an array of the session.
        raw_check(unsafe { driver_call!(driver_table(), cuSurfObjectCreate(&mut handle, &raw)) })?;
        Ok(handle)
    }

    pub(super) fn destroy_object(&self, handle: u64, surface: bool) -> CudaResult<()> {
        // SAFETY: a texture or surface object this session created, destroyed once.
        check(unsafe { if surface { sys::cuSurfObjectDestroy(handle) } else { sys::cuTexObjectDestroy(handle) } }.result())
    }

    pub(super) fn plane(&self, array: Handle<sys::CUarray>, plane: u32) -> CudaResult<(Handle<sys::CUarray>, ArrayDesc)> {
        let get_plane = entry(driver_table().cuArrayGetPlane)?;
        let mut plane_array: sys::CUarray = std::ptr::null_mut();
        // SAFETY: a planar array of the session's; valid out-pointer.
        raw_check(unsafe { get_plane((&raw mut plane_array).cast(), array.0.cast(), plane) }.0)?;
        let mut raw = CUDA_ARRAY3D_DESCRIPTOR { Width: 0, Height: 0, Depth: 0, Format: 0, NumChannels: 0, Flags: 0 };
        // SAFETY: the plane just given; valid out-pointer to a whole descriptor.
        raw_check(unsafe { driver_call!(driver_table(), cuArray3DGetDescriptor_v2(&mut raw, plane_array.cast())) })?;
        let desc = ArrayDesc {
            width: raw.Width as u64,
            height: raw.Height as u64,
            depth: raw.Depth as u64,
            format: raw.Format,
            channels: raw.NumChannels,
            flags: raw.Flags,
        };
        Ok((Handle::new(plane_array), desc))
    }

    pub(super) fn sparse_of(&self, target: ArrayRef<Self>) -> CudaResult<SparseProperties> {
        // SAFETY: all-zero is a valid `CUDA_ARRAY_SPARSE_PROPERTIES` (integers only).
        let mut raw: CUDA_ARRAY_SPARSE_PROPERTIES = unsafe { std::mem::zeroed() };
        let table = driver_table();
        // SAFETY: a sparse array or mipmapped array of the session's; valid out-pointer.
        let code = unsafe {
            match target {
                ArrayRef::Array(array) => entry(table.cuArrayGetSparseProperties)?(&mut raw, array.0.cast()),
                ArrayRef::Mipmap(mipmap) => entry(table.cuMipmappedArrayGetSparseProperties)?(&mut raw, mipmap.0.cast()),
            }
        };
        raw_check(code.0)?;
        let tile = raw.tileExtent;
        Ok(SparseProperties {
            tile: [tile.width, tile.height, tile.depth],
            miptail_first_level: raw.miptailFirstLevel,
            miptail_size: raw.miptailSize,
            flags: raw.flags,
        })
    }

    pub(super) fn requirements_of(&self, target: ArrayRef<Self>, device: sys::CUdevice) -> CudaResult<(u64, u64)> {
        let mut raw = CUDA_ARRAY_MEMORY_REQUIREMENTS { size: 0, alignment: 0, reserved: [0; 4] };
        let table = driver_table();
        // SAFETY: a deferred-mapping array or mipmapped array of the session's, on its device;
        // valid out-pointer.
        let code = unsafe {
            match target {
                ArrayRef::Array(array) => entry(table.cuArrayGetMemoryRequirements)?(&mut raw, array.0.cast(), device),
                ArrayRef::Mipmap(mipmap) => entry(table.cuMipmappedArrayGetMemoryRequirements)?(&mut raw, mipmap.0.cast(), device),
            }
        };
        raw_check(code.0)?;
        Ok((raw.size as u64, raw.alignment as u64))
    }

    /// `cuMemMapArrayAsync` for `device` (its ordinal's bit).
    pub(super) fn map_array_work(&self, maps: &[ArrayMapWork<Self>], stream: sys::CUstream, device: sys::CUdevice) -> CudaResult<()> {
        let map_array = entry(driver_table().cuMemMapArrayAsync)?;
        let device_bit_mask = u32::try_from(device).ok().and_then(|ordinal| 1u32.checked_shl(ordinal)).ok_or(CudaError::INVALID_DEVICE)?;
        let sparse_level = |[level, layer, offset_x, offset_y, offset_z, extent_width, extent_height, extent_depth]: [c_uint; 8]| {
            CUarrayMapInfo_st_subresource {
                sparseLevel: CUarrayMapInfo_st_subresource_sparseLevel {
                    level,
                    layer,
                    offsetX: offset_x,
                    offsetY: offset_y,
                    offsetZ: offset_z,
                    extentWidth: extent_width,
                    extentHeight: extent_height,
                    extentDepth: extent_depth,
                },
            }
        };
        let mut raw: Vec<CUarrayMapInfo> = maps
            .iter()
            .map(|map| {
                let (resource_type, resource) = match map.target {
                    ArrayRef::Array(array) => (resource_type::ARRAY, CUarrayMapInfo_st_resource { array: array.0.cast() }),
                    ArrayRef::Mipmap(mipmap) => (resource_type::MIPMAPPED_ARRAY, CUarrayMapInfo_st_resource { mipmap: mipmap.0.cast() }),
                };
                let (subresource_type, subresource) = match map.subresource {
                    Subresource::SparseLevel { level, layer, offset, extent } => (
                        SUBRESOURCE_SPARSE_LEVEL,
                        sparse_level([level, layer, offset[0], offset[1], offset[2], extent[0], extent[1], extent[2]]),
                    ),
                    Subresource::Miptail { layer, offset, size } => (
                        SUBRESOURCE_MIPTAIL,
                        CUarrayMapInfo_st_subresource { miptail: CUarrayMapInfo_st_subresource_miptail { layer, offset, size } },
                    ),
                    // Ignored by the driver for a deferred-mapping array.
                    Subresource::Whole => (SUBRESOURCE_SPARSE_LEVEL, sparse_level([0; 8])),
                };
                let (mem_operation_type, mem_handle, offset) = match map.memory {
                    Some((handle, offset)) => (OPERATION_MAP, handle, offset),
                    None => (OPERATION_UNMAP, 0, 0),
                };
                CUarrayMapInfo {
                    resourceType: resource_type,
                    resource,
                    subresourceType: subresource_type,
                    subresource,
                    memOperationType: mem_operation_type,
                    memHandleType: 0,
                    memHandle: CUarrayMapInfo_st_memHandle { memHandle: mem_handle },
                    offset,
                    deviceBitMask: device_bit_mask,
                    flags: 0,
                    reserved: [0; 2],
                }
            })
            .collect();
        let count = c_uint::try_from(raw.len()).map_err(|_| CudaError::INVALID_VALUE)?;
        // SAFETY: `count` complete entries naming arrays and tile pools of the session's, their
        // subresources and offsets checked by it; a stream of the session's.
        raw_check(unsafe { map_array(raw.as_mut_ptr(), count, stream.cast()) }.0)
    }

    pub(super) fn decompress(&self, ops: &[DecompressOp], stream: sys::CUstream) -> Result<(), (CudaError, Option<u64>)> {
        let whole = |error| (error, Some(u64::MAX));
        let batch_decompress = driver_table().cuMemBatchDecompressAsync.ok_or(whole(CudaError::NOT_SUPPORTED))?;
        let size = |value: u64| usize::try_from(value).map_err(|_| whole(CudaError::INVALID_VALUE));
        let mut raw = ops
            .iter()
            .map(|op| {
                // The addresses are the session's device memory: numbers here, pointers to the driver.
                Ok(CUmemDecompressParams {
                    srcNumBytes: size(op.src_len)?,
                    dstNumBytes: size(op.dst_len)?,
                    dstActBytes: std::ptr::without_provenance_mut(size(op.dst_act_bytes)?),
                    src: std::ptr::without_provenance(size(op.src)?),
                    dst: std::ptr::without_provenance_mut(size(op.dst)?),
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
        let code = unsafe { batch_decompress(raw.as_mut_ptr(), raw.len(), 0, &mut index, stream.cast()) };
        raw_check(code.0).map_err(|error| (error, (index != UNTOUCHED).then_some(index as u64)))
    }

    pub(super) fn attribute_of_stream(&self, stream: sys::CUstream, attribute: u32, set: Option<&[u8; 64]>) -> CudaResult<[u8; 64]> {
        if let Some(value) = set {
            // SAFETY: a stream of the session; a 64-byte value the session checked.
            raw_check(unsafe { driver_call!(driver_table(), cuStreamSetAttribute(stream.cast(), attribute, value.as_ptr().cast())) })?;
        }
        let mut value = [0u8; 64];
        // SAFETY: as above; the driver writes at most a `CUstreamAttrValue` (64 bytes).
        raw_check(unsafe { driver_call!(driver_table(), cuStreamGetAttribute(stream.cast(), attribute, value.as_mut_ptr().cast())) })?;
        Ok(value)
    }
}
