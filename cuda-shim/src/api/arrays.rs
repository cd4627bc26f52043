//! CUDA arrays, mipmapped arrays, texture and surface objects. Array handles are the client's
//! ids (`flyt_client::arrays`); texture and surface objects are the server driver's values,
//! which kernels take as arguments. The descriptors an object was made with are kept here, so
//! the `Get*Desc` queries answer what the app gave without a round trip.
//!
//! Planar arrays (NV12) are made whole and used plane by plane (`cuArrayGetPlane`: each plane
//! an array of the client's, part of its array). Sparse and deferred-mapping arrays get their
//! memory from `cuMemMapArrayAsync`, whose entries name the app's array and physical allocation
//! handles: each is translated and checked here and again by the server.

use std::collections::HashMap;
use std::ffi::c_uint;
use std::sync::{LazyLock, Mutex};

use flyt_protocol::CudaError;
use flyt_protocol::ops::{ArrayDesc, ArrayMap, Resource, SparseProperties, Subresource, TextureDesc, ViewDesc};

use super::session::{client, driver_error, resolve_stream, run};
use crate::CUresult;
use crate::ffi::{DriverResult, non_null, write_out};
use crate::generated::types::{
    CUDA_ARRAY_DESCRIPTOR, CUDA_ARRAY_MEMORY_REQUIREMENTS, CUDA_ARRAY_SPARSE_PROPERTIES, CUDA_ARRAY_SPARSE_PROPERTIES_st_tileExtent,
    CUDA_ARRAY3D_DESCRIPTOR, CUDA_RESOURCE_DESC, CUDA_RESOURCE_VIEW_DESC, CUDA_TEXTURE_DESC, CUarray, CUarrayMapInfo, CUdevice,
    CUmipmappedArray, CUstream, CUsurfObject, CUtexObject,
};

/// `CUresourcetype`.
mod resource_type {
    pub const ARRAY: u32 = 0;
    pub const MIPMAPPED_ARRAY: u32 = 1;
    pub const LINEAR: u32 = 2;
    pub const PITCH2D: u32 = 3;
}

/// What an object was made with, as the app gave it.
#[derive(Clone, Copy)]
struct Described {
    resource: CUDA_RESOURCE_DESC,
    /// Textures only.
    texture: Option<CUDA_TEXTURE_DESC>,
    view: Option<CUDA_RESOURCE_VIEW_DESC>,
}

// SAFETY: plain descriptor values; the handles inside (arrays) are the client's ids, never
// dereferenced.
unsafe impl Send for Described {}

/// Live texture and surface objects.
static OBJECTS: LazyLock<Mutex<HashMap<u64, Described>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

fn objects() -> std::sync::MutexGuard<'static, HashMap<u64, Described>> {
    OBJECTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn create(desc: ArrayDesc, levels: Option<u32>) -> DriverResult<u64> {
    if desc.width == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    if desc.is_planar() {
        // Its channel count is the driver's to judge (NVIDIA's runtime describes NV12 with three).
        if levels.is_some() {
            return Err(crate::diagnostics::unsupported("a mipmapped CUDA array of a planar (NV12) format"));
        }
    } else if !matches!(desc.channels, 1 | 2 | 4) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    } else if desc.element_size().is_none() {
        return Err(crate::diagnostics::unsupported("a CUDA array of a block-compressed or packed format"));
    }
    client()?.array_create(desc, levels).map_err(driver_error)
}

pub unsafe fn cuArrayCreate_v2(p_handle: *mut CUarray, p_allocate_array: *const CUDA_ARRAY_DESCRIPTOR) -> CUresult {
    run(|| {
        non_null([p_handle.cast(), p_allocate_array.cast()])?;
        // SAFETY: checked non-NULL; the caller's descriptor.
        let d = unsafe { &*p_allocate_array };
        let desc =
            ArrayDesc { width: d.Width as u64, height: d.Height as u64, depth: 0, format: d.Format, channels: d.NumChannels, flags: 0 };
        let array = create(desc, None)?;
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(p_handle, array as usize as CUarray) }
    })
}

fn desc_3d(d: &CUDA_ARRAY3D_DESCRIPTOR) -> ArrayDesc {
    ArrayDesc {
        width: d.Width as u64,
        height: d.Height as u64,
        depth: d.Depth as u64,
        format: d.Format,
        channels: d.NumChannels,
        flags: d.Flags,
    }
}

pub unsafe fn cuArray3DCreate_v2(p_handle: *mut CUarray, p_allocate_array: *const CUDA_ARRAY3D_DESCRIPTOR) -> CUresult {
    run(|| {
        non_null([p_handle.cast(), p_allocate_array.cast()])?;
        // SAFETY: checked non-NULL; the caller's descriptor.
        let array = create(desc_3d(unsafe { &*p_allocate_array }), None)?;
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(p_handle, array as usize as CUarray) }
    })
}

pub unsafe fn cuMipmappedArrayCreate(
    p_handle: *mut CUmipmappedArray,
    p_mipmapped_array_desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    num_mipmap_levels: c_uint,
) -> CUresult {
    run(|| {
        non_null([p_handle.cast(), p_mipmapped_array_desc.cast()])?;
        if num_mipmap_levels == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: checked non-NULL; the caller's descriptor.
        let mipmap = create(desc_3d(unsafe { &*p_mipmapped_array_desc }), Some(num_mipmap_levels))?;
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(p_handle, mipmap as usize as CUmipmappedArray) }
    })
}

pub unsafe fn cuArrayDestroy(h_array: CUarray) -> CUresult {
    run(|| client()?.array_destroy(h_array as u64, false).map_err(super::session::driver_error))
}

pub unsafe fn cuMipmappedArrayDestroy(h_mipmapped_array: CUmipmappedArray) -> CUresult {
    run(|| client()?.array_destroy(h_mipmapped_array as u64, true).map_err(super::session::driver_error))
}

pub unsafe fn cuMipmappedArrayGetLevel(p_level_array: *mut CUarray, h_mipmapped_array: CUmipmappedArray, level: c_uint) -> CUresult {
    run(|| {
        non_null([p_level_array.cast()])?;
        let array = client()?.mipmap_level(h_mipmapped_array as u64, level).map_err(super::session::driver_error)?;
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(p_level_array, array as usize as CUarray) }
    })
}

fn array_desc(array: CUarray) -> DriverResult<ArrayDesc> {
    client()?.array_desc(array as u64).map_err(super::session::driver_error)
}

pub unsafe fn cuArrayGetDescriptor_v2(p_array_descriptor: *mut CUDA_ARRAY_DESCRIPTOR, h_array: CUarray) -> CUresult {
    run(|| {
        let d = array_desc(h_array)?;
        let out = CUDA_ARRAY_DESCRIPTOR { Width: d.width as usize, Height: d.height as usize, Format: d.format, NumChannels: d.channels };
        // SAFETY: the caller's out-pointer (NULL is refused by `write_out`).
        unsafe { write_out(p_array_descriptor, out) }
    })
}

pub unsafe fn cuArray3DGetDescriptor_v2(p_array_descriptor: *mut CUDA_ARRAY3D_DESCRIPTOR, h_array: CUarray) -> CUresult {
    run(|| {
        let d = array_desc(h_array)?;
        let out = CUDA_ARRAY3D_DESCRIPTOR {
            Width: d.width as usize,
            Height: d.height as usize,
            Depth: d.depth as usize,
            Format: d.format,
            NumChannels: d.channels,
            Flags: d.flags,
        };
        // SAFETY: the caller's out-pointer (NULL is refused by `write_out`).
        unsafe { write_out(p_array_descriptor, out) }
    })
}

/// A resource descriptor on the wire.
fn resource(desc: &CUDA_RESOURCE_DESC) -> DriverResult<Resource> {
    if desc.flags != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the union member read is the one `resType` names (plain integers and handles).
    let resource = unsafe {
        match desc.resType {
            resource_type::ARRAY => Resource::Array { array: desc.res.array.hArray as u64 },
            resource_type::MIPMAPPED_ARRAY => Resource::Mipmapped { array: desc.res.mipmap.hMipmappedArray as u64 },
            resource_type::LINEAR => {
                let linear = desc.res.linear;
                Resource::Linear {
                    ptr: linear.devPtr,
                    format: linear.format,
                    channels: linear.numChannels,
                    size: linear.sizeInBytes as u64,
                }
            }
            resource_type::PITCH2D => {
                let pitched = desc.res.pitch2D;
                Resource::Pitch2d {
                    ptr: pitched.devPtr,
                    format: pitched.format,
                    channels: pitched.numChannels,
                    width: pitched.width as u64,
                    height: pitched.height as u64,
                    pitch: pitched.pitchInBytes as u64,
                }
            }
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    };
    Ok(resource)
}

fn texture(desc: &CUDA_TEXTURE_DESC) -> TextureDesc {
    TextureDesc {
        address_mode: desc.addressMode,
        filter_mode: desc.filterMode,
        flags: desc.flags,
        max_anisotropy: desc.maxAnisotropy,
        mipmap_filter_mode: desc.mipmapFilterMode,
        mipmap_level_bias: desc.mipmapLevelBias.to_bits(),
        min_mipmap_level_clamp: desc.minMipmapLevelClamp.to_bits(),
        max_mipmap_level_clamp: desc.maxMipmapLevelClamp.to_bits(),
        border_color: desc.borderColor.map(f32::to_bits),
    }
}

fn view(desc: &CUDA_RESOURCE_VIEW_DESC) -> ViewDesc {
    ViewDesc {
        format: desc.format,
        width: desc.width as u64,
        height: desc.height as u64,
        depth: desc.depth as u64,
        first_mipmap_level: desc.firstMipmapLevel,
        last_mipmap_level: desc.lastMipmapLevel,
        first_layer: desc.firstLayer,
        last_layer: desc.lastLayer,
    }
}

pub unsafe fn cuTexObjectCreate(
    p_tex_object: *mut CUtexObject,
    p_res_desc: *const CUDA_RESOURCE_DESC,
    p_tex_desc: *const CUDA_TEXTURE_DESC,
    p_res_view_desc: *const CUDA_RESOURCE_VIEW_DESC,
) -> CUresult {
    run(|| {
        non_null([p_tex_object.cast(), p_res_desc.cast(), p_tex_desc.cast()])?;
        // SAFETY: checked non-NULL (the view is optional); the caller's descriptors.
        let described = unsafe { Described { resource: *p_res_desc, texture: Some(*p_tex_desc), view: p_res_view_desc.as_ref().copied() } };
        let texture_desc = described.texture.as_ref().map(texture).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let handle = client()?
            .tex_object_create(resource(&described.resource)?, texture_desc, described.view.as_ref().map(view))
            .map_err(super::session::driver_error)?;
        objects().insert(handle, described);
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(p_tex_object, handle) }
    })
}

pub unsafe fn cuSurfObjectCreate(p_surf_object: *mut CUsurfObject, p_res_desc: *const CUDA_RESOURCE_DESC) -> CUresult {
    run(|| {
        non_null([p_surf_object.cast(), p_res_desc.cast()])?;
        // SAFETY: checked non-NULL; the caller's descriptor.
        let described = Described { resource: unsafe { *p_res_desc }, texture: None, view: None };
        let Resource::Array { array } = resource(&described.resource)? else {
            // Surfaces are over arrays only.
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        let handle = client()?.surf_object_create(array).map_err(super::session::driver_error)?;
        objects().insert(handle, described);
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(p_surf_object, handle) }
    })
}

fn destroy(handle: u64, surface: bool) -> DriverResult {
    match objects().get(&handle) {
        Some(described) if described.texture.is_none() == surface => {}
        _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
    client()?.object_destroy(handle, surface).map_err(super::session::driver_error)?;
    objects().remove(&handle);
    Ok(())
}

pub unsafe fn cuTexObjectDestroy(tex_object: CUtexObject) -> CUresult {
    run(|| destroy(tex_object, false))
}

pub unsafe fn cuSurfObjectDestroy(surf_object: CUsurfObject) -> CUresult {
    run(|| destroy(surf_object, true))
}

/// What an object was made with (`surface`: which kind it must be, `None`: either).
fn described(handle: u64, surface: Option<bool>) -> DriverResult<Described> {
    match objects().get(&handle) {
        Some(described) if surface.is_none_or(|surface| described.texture.is_none() == surface) => Ok(*described),
        _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

pub unsafe fn cuTexObjectGetResourceDesc(p_res_desc: *mut CUDA_RESOURCE_DESC, tex_object: CUtexObject) -> CUresult {
    // SAFETY: the caller's out-pointer (NULL is refused by `write_out`).
    run(|| unsafe { write_out(p_res_desc, described(tex_object, Some(false))?.resource) })
}

pub unsafe fn cuTexObjectGetTextureDesc(p_tex_desc: *mut CUDA_TEXTURE_DESC, tex_object: CUtexObject) -> CUresult {
    run(|| {
        let texture = described(tex_object, Some(false))?.texture.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the caller's out-pointer (NULL is refused by `write_out`).
        unsafe { write_out(p_tex_desc, texture) }
    })
}

pub unsafe fn cuTexObjectGetResourceViewDesc(p_res_view_desc: *mut CUDA_RESOURCE_VIEW_DESC, tex_object: CUtexObject) -> CUresult {
    run(|| {
        let view = described(tex_object, Some(false))?.view.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the caller's out-pointer (NULL is refused by `write_out`).
        unsafe { write_out(p_res_view_desc, view) }
    })
}

pub unsafe fn cuSurfObjectGetResourceDesc(p_res_desc: *mut CUDA_RESOURCE_DESC, surf_object: CUsurfObject) -> CUresult {
    // SAFETY: the caller's out-pointer (NULL is refused by `write_out`).
    run(|| unsafe { write_out(p_res_desc, described(surf_object, Some(true))?.resource) })
}

pub unsafe fn cuArrayGetPlane(p_plane_array: *mut CUarray, h_array: CUarray, plane_idx: c_uint) -> CUresult {
    run(|| {
        non_null([p_plane_array.cast()])?;
        let plane = client()?.array_plane(h_array as u64, plane_idx).map_err(driver_error)?;
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(p_plane_array, plane as usize as CUarray) }
    })
}

fn sparse_properties(array: u64, mipmapped: bool, out: *mut CUDA_ARRAY_SPARSE_PROPERTIES) -> DriverResult {
    non_null([out.cast()])?;
    let p: SparseProperties = client()?.sparse_properties(array, mipmapped).map_err(driver_error)?;
    let value = CUDA_ARRAY_SPARSE_PROPERTIES {
        tileExtent: CUDA_ARRAY_SPARSE_PROPERTIES_st_tileExtent { width: p.tile[0], height: p.tile[1], depth: p.tile[2] },
        miptailFirstLevel: p.miptail_first_level,
        miptailSize: p.miptail_size,
        flags: p.flags,
        reserved: [0; 4],
    };
    // SAFETY: checked non-NULL; the caller's out-pointer.
    unsafe { write_out(out, value) }
}

pub unsafe fn cuArrayGetSparseProperties(sparse_properties_out: *mut CUDA_ARRAY_SPARSE_PROPERTIES, array: CUarray) -> CUresult {
    run(|| sparse_properties(array as u64, false, sparse_properties_out))
}

pub unsafe fn cuMipmappedArrayGetSparseProperties(
    sparse_properties_out: *mut CUDA_ARRAY_SPARSE_PROPERTIES,
    mipmap: CUmipmappedArray,
) -> CUresult {
    run(|| sparse_properties(mipmap as u64, true, sparse_properties_out))
}

/// Memory requirements on `device`, which must be the session's.
fn memory_requirements(array: u64, mipmapped: bool, device: CUdevice, out: *mut CUDA_ARRAY_MEMORY_REQUIREMENTS) -> DriverResult {
    non_null([out.cast()])?;
    crate::driver::driver().session()?.device(device)?;
    let (size, alignment) = client()?.memory_requirements(array, mipmapped).map_err(driver_error)?;
    let to_usize = |value: u64| usize::try_from(value).map_err(|_| CUresult::CUDA_ERROR_UNKNOWN);
    let value = CUDA_ARRAY_MEMORY_REQUIREMENTS { size: to_usize(size)?, alignment: to_usize(alignment)?, reserved: [0; 4] };
    // SAFETY: checked non-NULL; the caller's out-pointer.
    unsafe { write_out(out, value) }
}

pub unsafe fn cuArrayGetMemoryRequirements(
    memory_requirements_out: *mut CUDA_ARRAY_MEMORY_REQUIREMENTS,
    array: CUarray,
    device: CUdevice,
) -> CUresult {
    run(|| memory_requirements(array as u64, false, device, memory_requirements_out))
}

pub unsafe fn cuMipmappedArrayGetMemoryRequirements(
    memory_requirements_out: *mut CUDA_ARRAY_MEMORY_REQUIREMENTS,
    mipmap: CUmipmappedArray,
    device: CUdevice,
) -> CUresult {
    run(|| memory_requirements(mipmap as u64, true, device, memory_requirements_out))
}

/// `CUresourcetype`, `CUarraySparseSubresourceType` and `CUmemOperationType` values of a map
/// entry.
const SUBRESOURCE_SPARSE_LEVEL: c_uint = 0;
const SUBRESOURCE_MIPTAIL: c_uint = 1;
const OPERATION_MAP: c_uint = 1;
const OPERATION_UNMAP: c_uint = 2;

/// One `CUarrayMapInfo` on the wire: the union members read are the ones its type fields name;
/// flags and reserved words must be zero, a map names a generic handle and an unmap none.
fn array_map(info: &CUarrayMapInfo) -> DriverResult<ArrayMap> {
    let invalid = CUresult::CUDA_ERROR_INVALID_VALUE;
    if info.flags != 0 || info.reserved != [0; 2] {
        return Err(invalid);
    }
    // SAFETY: each union read is of the member the entry's type field names; all are plain
    // integers and handles (the handles are the client's ids, never dereferenced).
    let (array, mipmapped, subresource, handle) = unsafe {
        let (array, mipmapped) = match info.resourceType {
            resource_type::ARRAY => (info.resource.array as u64, false),
            resource_type::MIPMAPPED_ARRAY => (info.resource.mipmap as u64, true),
            _ => return Err(invalid),
        };
        let subresource = match info.subresourceType {
            SUBRESOURCE_SPARSE_LEVEL => {
                let level = info.subresource.sparseLevel;
                Subresource::SparseLevel {
                    level: level.level,
                    layer: level.layer,
                    offset: [level.offsetX, level.offsetY, level.offsetZ],
                    extent: [level.extentWidth, level.extentHeight, level.extentDepth],
                }
            }
            SUBRESOURCE_MIPTAIL => {
                let tail = info.subresource.miptail;
                Subresource::Miptail { layer: tail.layer, offset: tail.offset, size: tail.size }
            }
            // The driver ignores the subresource of a deferred-mapping array (the client
            // checks that this one is).
            _ => Subresource::Whole,
        };
        (array, mipmapped, subresource, info.memHandle.memHandle)
    };
    let memory = match info.memOperationType {
        OPERATION_MAP if info.memHandleType == 0 => Some((handle, info.offset)),
        OPERATION_UNMAP if handle == 0 => None,
        _ => return Err(invalid),
    };
    Ok(ArrayMap { array, mipmapped, subresource, memory, device_mask: info.deviceBitMask })
}

fn map_arrays(map_info_list: *mut CUarrayMapInfo, count: c_uint, h_stream: CUstream, per_thread: bool) -> DriverResult {
    if count == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    non_null([map_info_list.cast()])?;
    // SAFETY: checked non-NULL; the caller's array of `count` entries.
    let infos = unsafe { std::slice::from_raw_parts(map_info_list, count as usize) };
    let maps = infos.iter().map(array_map).collect::<DriverResult<Vec<_>>>()?;
    let client = client()?;
    let stream = resolve_stream(client, h_stream, per_thread)?;
    client.map_arrays(maps, stream).map_err(|error| {
        if error == CudaError::NOT_SUPPORTED && client.emulated() {
            crate::diagnostics::once(
                "map-array-emulated",
                "flyt: cuMemMapArrayAsync: the server's emulated device maps no memory into sparse or deferred-mapping arrays (returning CUDA_ERROR_NOT_SUPPORTED)",
            );
        }
        driver_error(error)
    })
}

per_thread_twins! {
    cuMemMapArrayAsync, cuMemMapArrayAsync_ptsz (map_info_list: *mut CUarrayMapInfo, count: c_uint, h_stream: CUstream)
        |per_thread| run(|| map_arrays(map_info_list, count, h_stream, per_thread))
}
