//! Texture and surface objects: Flyt's driver makes them; this front converts the runtime's
//! descriptions to the driver's and back (a channel description becomes a format and a channel
//! count, the texture's read mode and switches become `CU_TRSF_*` flags).

use std::ffi::{c_int, c_uint, c_void};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;

use super::arrays::{array_format, channel_desc, descriptor, is_integer_format};
use crate::driver::{
    CUDA_RESOURCE_DESC, CUDA_RESOURCE_VIEW_DESC, CUDA_TEXTURE_DESC, CUarray, CUresourceDescArray, CUresourceDescLinear,
    CUresourceDescMipmap, CUresourceDescPitch2D, cu_ctx,
};
use crate::ffi::{cudaChannelFormatDesc, cudaSurfaceObject_t, cudaTextureObject_t, write_out};

/// `cudaResourceViewDesc` is the driver's `CUDA_RESOURCE_VIEW_DESC`, format numbers included.
#[allow(non_camel_case_types, reason = "the C type's name, as the CUDA headers spell it")]
pub type cudaResourceViewDesc = CUDA_RESOURCE_VIEW_DESC;

/// The union of `cudaResourceDesc`, flattened: the handle or device pointer, then for memory the channel description, `size`
/// (`linear.sizeInBytes` or `pitch2D.width`), the height and the pitch.
#[repr(C)]
#[derive(Clone, Copy)]
struct RuntimeResourceData {
    handle: *mut c_void,
    desc: cudaChannelFormatDesc,
    size: usize,
    height: usize,
    pitch_in_bytes: usize,
    reserved: [u64; 9],
}

/// `cudaResourceDesc`: what a texture or surface object reads.
#[repr(C)]
pub struct cudaResourceDesc {
    res_type: c_int,
    res: RuntimeResourceData,
    flags: c_uint,
}

/// `cudaTextureDesc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct cudaTextureDesc {
    address_mode: [c_int; 3],
    filter_mode: c_int,
    read_mode: c_int,
    srgb: c_int,
    border_color: [f32; 4],
    normalized_coords: c_int,
    max_anisotropy: c_uint,
    mipmap_filter_mode: c_int,
    mipmap_level_bias: f32,
    min_mipmap_level_clamp: f32,
    max_mipmap_level_clamp: f32,
    disable_trilinear_optimization: c_int,
    seamless_cubemap: c_int,
}

// The sizes of the C structs (driver_types.h and texture_types.h, x86_64).
const _: () = {
    assert!(size_of::<RuntimeResourceData>() == 128);
    assert!(std::mem::offset_of!(RuntimeResourceData, size) == 32);
    assert!(size_of::<cudaResourceDesc>() == 144);
    assert!(std::mem::offset_of!(cudaResourceDesc, res) == 8);
    assert!(std::mem::offset_of!(cudaResourceDesc, flags) == 136);
    assert!(size_of::<cudaTextureDesc>() == 72);
    assert!(std::mem::offset_of!(cudaTextureDesc, border_color) == 24);
    assert!(std::mem::offset_of!(cudaTextureDesc, seamless_cubemap) == 68);
};

/// `cudaResourceType`, numbered as the driver's `CUresourcetype`.
const RESOURCE_ARRAY: c_int = 0;
const RESOURCE_MIPMAPPED_ARRAY: c_int = 1;
const RESOURCE_LINEAR: c_int = 2;
const RESOURCE_PITCH_2D: c_int = 3;

/// `cudaTextureReadMode`.
const READ_MODE_ELEMENT_TYPE: c_int = 0;
const READ_MODE_NORMALIZED_FLOAT: c_int = 1;
/// `cudaTextureAddressMode`, numbered as the driver's `CUaddress_mode`.
const ADDRESS_WRAP: c_int = 0;
const ADDRESS_CLAMP: c_int = 1;
const ADDRESS_MIRROR: c_int = 2;

/// `CU_TRSF_*`: the driver's texture flags.
const READ_AS_INTEGER: c_uint = 0x01;
const NORMALIZED_COORDINATES: c_uint = 0x02;
const SRGB: c_uint = 0x10;
const DISABLE_TRILINEAR_OPTIMIZATION: c_uint = 0x20;
const SEAMLESS_CUBEMAP: c_uint = 0x40;

/// The driver's description of a resource.
///
/// # Safety
/// `resource` is NULL or a readable `cudaResourceDesc`.
unsafe fn driver_resource(resource: *const cudaResourceDesc) -> CudaResult<CUDA_RESOURCE_DESC> {
    if resource.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    // SAFETY: checked non-NULL; the app's struct.
    let r = unsafe { &*resource };
    // SAFETY: all-zero is a valid value of every member of the union (integers, NULL handles).
    let mut driver: CUDA_RESOURCE_DESC = unsafe { std::mem::zeroed() };
    match r.res_type {
        RESOURCE_ARRAY => driver.res.array = CUresourceDescArray { hArray: r.res.handle.cast() },
        RESOURCE_MIPMAPPED_ARRAY => driver.res.mipmap = CUresourceDescMipmap { hMipmappedArray: r.res.handle.cast() },
        RESOURCE_LINEAR => {
            let (format, channels) = array_format(&r.res.desc)?;
            driver.res.linear =
                CUresourceDescLinear { devPtr: r.res.handle as u64, format, numChannels: channels, sizeInBytes: r.res.size };
        }
        RESOURCE_PITCH_2D => {
            let (format, channels) = array_format(&r.res.desc)?;
            driver.res.pitch2D = CUresourceDescPitch2D {
                devPtr: r.res.handle as u64,
                format,
                numChannels: channels,
                width: r.res.size,
                height: r.res.height,
                pitchInBytes: r.res.pitch_in_bytes,
            };
        }
        _ => return Err(CudaError::INVALID_VALUE),
    }
    driver.resType = r.res_type.cast_unsigned();
    driver.flags = r.flags;
    Ok(driver)
}

/// The runtime's description of a resource the driver describes.
fn runtime_resource(r: &CUDA_RESOURCE_DESC) -> cudaResourceDesc {
    let res_type = r.resType.cast_signed();
    let mut res = RuntimeResourceData {
        handle: std::ptr::null_mut(),
        desc: cudaChannelFormatDesc::default(),
        size: 0,
        height: 0,
        pitch_in_bytes: 0,
        reserved: [0; 9],
    };
    // Each union read is of the member `resType` names, the one the driver filled in.
    match res_type {
        // SAFETY: as above.
        RESOURCE_ARRAY => res.handle = unsafe { r.res.array.hArray }.cast(),
        // SAFETY: as above.
        RESOURCE_MIPMAPPED_ARRAY => res.handle = unsafe { r.res.mipmap.hMipmappedArray }.cast(),
        RESOURCE_LINEAR => {
            // SAFETY: as above.
            let linear = unsafe { r.res.linear };
            res.handle = std::ptr::with_exposed_provenance_mut(linear.devPtr as usize);
            res.desc = channel_desc(linear.format, linear.numChannels);
            res.size = linear.sizeInBytes;
        }
        RESOURCE_PITCH_2D => {
            // SAFETY: as above.
            let pitched = unsafe { r.res.pitch2D };
            res.handle = std::ptr::with_exposed_provenance_mut(pitched.devPtr as usize);
            res.desc = channel_desc(pitched.format, pitched.numChannels);
            (res.size, res.height, res.pitch_in_bytes) = (pitched.width, pitched.height, pitched.pitchInBytes);
        }
        _ => {}
    }
    cudaResourceDesc { res_type, res, flags: r.flags }
}

/// Whether a texture reads integer texels: those of its view's format where it has one
/// (`view_format`, `cudaResViewFormat*`: the integer formats come first, then the float and
/// block-compressed ones), else those of its resource.
fn reads_integers(resource: &CUDA_RESOURCE_DESC, view_format: c_int) -> CudaResult<bool> {
    match view_format {
        0x01..=0x12 => return Ok(true),
        0x13.. => return Ok(false),
        _ => {}
    }
    // Each union read is of the member `resType` names, the one the driver filled in.
    let format = match resource.resType.cast_signed() {
        // SAFETY: as above.
        RESOURCE_LINEAR => unsafe { resource.res.linear.format },
        // SAFETY: as above.
        RESOURCE_PITCH_2D => unsafe { resource.res.pitch2D.format },
        // SAFETY: as above.
        RESOURCE_ARRAY => descriptor(unsafe { resource.res.array.hArray })?.Format,
        RESOURCE_MIPMAPPED_ARRAY => {
            // SAFETY: as above.
            let mipmapped = unsafe { resource.res.mipmap.hMipmappedArray };
            let mut level: CUarray = std::ptr::null_mut();
            cu_ctx!(cuMipmappedArrayGetLevel(&mut level, mipmapped, 0))?;
            descriptor(level)?.Format
        }
        _ => return Err(CudaError::INVALID_VALUE),
    };
    Ok(is_integer_format(format))
}

/// The driver's description of a texture. `cudaReadModeElementType` of integer texels is the
/// driver's `CU_TRSF_READ_AS_INTEGER` (without it the driver promotes them to floats, which is
/// `cudaReadModeNormalizedFloat`); of float texels, which are never promoted, it is no flag.
/// `integer_texels` is asked only where that matters.
fn driver_texture(t: &cudaTextureDesc, integer_texels: impl FnOnce() -> CudaResult<bool>) -> CudaResult<CUDA_TEXTURE_DESC> {
    if !matches!(t.read_mode, READ_MODE_ELEMENT_TYPE | READ_MODE_NORMALIZED_FLOAT) {
        return Err(CudaError::INVALID_VALUE);
    }
    let mut flags = 0;
    if t.read_mode == READ_MODE_ELEMENT_TYPE && integer_texels()? {
        flags |= READ_AS_INTEGER;
    }
    for (on, flag) in [
        (t.normalized_coords, NORMALIZED_COORDINATES),
        (t.srgb, SRGB),
        (t.disable_trilinear_optimization, DISABLE_TRILINEAR_OPTIMIZATION),
        (t.seamless_cubemap, SEAMLESS_CUBEMAP),
    ] {
        if on != 0 {
            flags |= flag;
        }
    }
    // Unnormalized coordinates cannot wrap or mirror: CUDA clamps them instead.
    let address =
        |mode: c_int| if t.normalized_coords == 0 && matches!(mode, ADDRESS_WRAP | ADDRESS_MIRROR) { ADDRESS_CLAMP } else { mode };
    Ok(CUDA_TEXTURE_DESC {
        addressMode: t.address_mode.map(|mode| address(mode).cast_unsigned()),
        filterMode: t.filter_mode.cast_unsigned(),
        flags,
        maxAnisotropy: t.max_anisotropy,
        mipmapFilterMode: t.mipmap_filter_mode.cast_unsigned(),
        mipmapLevelBias: t.mipmap_level_bias,
        minMipmapLevelClamp: t.min_mipmap_level_clamp,
        maxMipmapLevelClamp: t.max_mipmap_level_clamp,
        borderColor: t.border_color,
        reserved: [0; 12],
    })
}

/// The runtime's description of a texture the driver describes (see [`driver_texture`]).
fn runtime_texture(t: &CUDA_TEXTURE_DESC, integer_texels: bool) -> cudaTextureDesc {
    let on = |flag: c_uint| c_int::from(t.flags & flag != 0);
    let promoted = integer_texels && t.flags & READ_AS_INTEGER == 0;
    cudaTextureDesc {
        address_mode: t.addressMode.map(c_uint::cast_signed),
        filter_mode: t.filterMode.cast_signed(),
        read_mode: if promoted { READ_MODE_NORMALIZED_FLOAT } else { READ_MODE_ELEMENT_TYPE },
        srgb: on(SRGB),
        border_color: t.borderColor,
        normalized_coords: on(NORMALIZED_COORDINATES),
        max_anisotropy: t.maxAnisotropy,
        mipmap_filter_mode: t.mipmapFilterMode.cast_signed(),
        mipmap_level_bias: t.mipmapLevelBias,
        min_mipmap_level_clamp: t.minMipmapLevelClamp,
        max_mipmap_level_clamp: t.maxMipmapLevelClamp,
        disable_trilinear_optimization: on(DISABLE_TRILINEAR_OPTIMIZATION),
        seamless_cubemap: on(SEAMLESS_CUBEMAP),
    }
}

// --- texture objects ---

/// A view (`view`, optional) narrows an array or mipmapped array only.
pub unsafe fn cudaCreateTextureObject(
    texture: *mut cudaTextureObject_t,
    resource: *const cudaResourceDesc,
    desc: *const cudaTextureDesc,
    view: *const cudaResourceViewDesc,
) -> CudaResult<()> {
    if texture.is_null() || desc.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    // SAFETY: the app's struct.
    let resource = unsafe { driver_resource(resource) }?;
    // SAFETY: NULL or the app's struct.
    let view_format = unsafe { view.as_ref() }.map(|view| view.format.cast_signed());
    if view_format.is_some() && !matches!(resource.resType.cast_signed(), RESOURCE_ARRAY | RESOURCE_MIPMAPPED_ARRAY) {
        return Err(CudaError::INVALID_VALUE);
    }
    // SAFETY: checked non-NULL; the app's struct.
    let desc = driver_texture(unsafe { &*desc }, || reads_integers(&resource, view_format.unwrap_or(0)))?;
    let mut object = 0;
    cu_ctx!(cuTexObjectCreate(&mut object, &resource, &desc, view.cast()))?;
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(texture, object) }
}

pub unsafe fn cudaDestroyTextureObject(texture: cudaTextureObject_t) -> CudaResult<()> {
    cu_ctx!(cuTexObjectDestroy(texture))
}

/// A texture's or surface's resource in the runtime's form: `query` is the driver's getter.
///
/// # Safety
/// A non-NULL `out` is the app's out-pointer.
unsafe fn object_resource(out: *mut cudaResourceDesc, query: impl FnOnce(&mut CUDA_RESOURCE_DESC) -> CudaResult<()>) -> CudaResult<()> {
    if out.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    // SAFETY: all-zero is a valid value of these plain fields (and of every member of the union).
    let mut resource: CUDA_RESOURCE_DESC = unsafe { std::mem::zeroed() };
    query(&mut resource)?;
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(out, runtime_resource(&resource)) }
}

pub unsafe fn cudaGetTextureObjectResourceDesc(out: *mut cudaResourceDesc, texture: cudaTextureObject_t) -> CudaResult<()> {
    let query = |resource: &mut CUDA_RESOURCE_DESC| cu_ctx!(cuTexObjectGetResourceDesc(resource, texture));
    // SAFETY: forwarded contract.
    unsafe { object_resource(out, query) }
}

/// The read mode comes back as it was given for integer texels; for others (never promoted) it
/// is `cudaReadModeElementType`.
pub unsafe fn cudaGetTextureObjectTextureDesc(out: *mut cudaTextureDesc, texture: cudaTextureObject_t) -> CudaResult<()> {
    if out.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    // SAFETY: all-zero is a valid value of these plain fields.
    let mut desc: CUDA_TEXTURE_DESC = unsafe { std::mem::zeroed() };
    cu_ctx!(cuTexObjectGetTextureDesc(&mut desc, texture))?;
    let integer_texels = if desc.flags & READ_AS_INTEGER != 0 {
        true
    } else {
        // SAFETY: all-zero is a valid value of these plain fields (and of every member of the union).
        let mut resource: CUDA_RESOURCE_DESC = unsafe { std::mem::zeroed() };
        cu_ctx!(cuTexObjectGetResourceDesc(&mut resource, texture))?;
        // Only arrays have views; a texture made without one has none to give (the driver may
        // say so with an error), and the resource's format is the texels'.
        // SAFETY: all-zero is a valid value of these plain fields.
        let mut view: CUDA_RESOURCE_VIEW_DESC = unsafe { std::mem::zeroed() };
        let has_view = matches!(resource.resType.cast_signed(), RESOURCE_ARRAY | RESOURCE_MIPMAPPED_ARRAY)
            && cu_ctx!(cuTexObjectGetResourceViewDesc(&mut view, texture)).is_ok();
        reads_integers(&resource, if has_view { view.format.cast_signed() } else { 0 })?
    };
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(out, runtime_texture(&desc, integer_texels)) }
}

pub unsafe fn cudaGetTextureObjectResourceViewDesc(out: *mut cudaResourceViewDesc, texture: cudaTextureObject_t) -> CudaResult<()> {
    if out.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    // SAFETY: all-zero is a valid value of these plain fields.
    let mut view: CUDA_RESOURCE_VIEW_DESC = unsafe { std::mem::zeroed() };
    cu_ctx!(cuTexObjectGetResourceViewDesc(&mut view, texture))?;
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(out, view) }
}

// --- surface objects ---

/// Surfaces load and store elements of an array only.
pub unsafe fn cudaCreateSurfaceObject(surface: *mut cudaSurfaceObject_t, resource: *const cudaResourceDesc) -> CudaResult<()> {
    if surface.is_null() || resource.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    // SAFETY: checked non-NULL; the app's struct.
    if unsafe { (*resource).res_type } != RESOURCE_ARRAY {
        return Err(CudaError::INVALID_VALUE);
    }
    // SAFETY: the app's struct.
    let resource = unsafe { driver_resource(resource) }?;
    let mut object = 0;
    cu_ctx!(cuSurfObjectCreate(&mut object, &resource))?;
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(surface, object) }
}

pub unsafe fn cudaDestroySurfaceObject(surface: cudaSurfaceObject_t) -> CudaResult<()> {
    cu_ctx!(cuSurfObjectDestroy(surface))
}

pub unsafe fn cudaGetSurfaceObjectResourceDesc(out: *mut cudaResourceDesc, surface: cudaSurfaceObject_t) -> CudaResult<()> {
    let query = |resource: &mut CUDA_RESOURCE_DESC| cu_ctx!(cuSurfObjectGetResourceDesc(resource, surface));
    // SAFETY: forwarded contract.
    unsafe { object_resource(out, query) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texture(read_mode: c_int, normalized_coords: c_int) -> cudaTextureDesc {
        cudaTextureDesc {
            address_mode: [ADDRESS_WRAP, ADDRESS_MIRROR, 3],
            filter_mode: 1,
            read_mode,
            srgb: 1,
            border_color: [0.25, 0.5, 0.75, 1.0],
            normalized_coords,
            max_anisotropy: 4,
            mipmap_filter_mode: 1,
            mipmap_level_bias: 0.5,
            min_mipmap_level_clamp: 0.0,
            max_mipmap_level_clamp: 2.0,
            disable_trilinear_optimization: 0,
            seamless_cubemap: 1,
        }
    }

    #[test]
    fn read_modes_and_switches_are_the_drivers_flags_and_back() {
        for integer in [false, true] {
            for read_mode in [READ_MODE_ELEMENT_TYPE, READ_MODE_NORMALIZED_FLOAT] {
                let t = texture(read_mode, 1);
                let driver = driver_texture(&t, || Ok(integer)).unwrap();
                let read_as_integer = integer && read_mode == READ_MODE_ELEMENT_TYPE;
                assert_eq!(driver.flags & READ_AS_INTEGER != 0, read_as_integer);
                assert_eq!(driver.flags & !READ_AS_INTEGER, NORMALIZED_COORDINATES | SRGB | SEAMLESS_CUBEMAP);
                assert_eq!(driver.addressMode.map(c_uint::cast_signed), t.address_mode);
                // Float texels are never promoted: their read mode comes back as element type.
                let expected = if integer { t } else { texture(READ_MODE_ELEMENT_TYPE, 1) };
                assert_eq!(runtime_texture(&driver, integer), expected);
            }
        }
    }

    #[test]
    fn unnormalized_coordinates_clamp_and_unknown_read_modes_are_refused() {
        let driver = driver_texture(&texture(READ_MODE_NORMALIZED_FLOAT, 0), || unreachable!()).unwrap();
        assert_eq!(driver.addressMode.map(c_uint::cast_signed), [ADDRESS_CLAMP, ADDRESS_CLAMP, 3]);
        assert_eq!(driver.flags & NORMALIZED_COORDINATES, 0);
        assert_eq!(driver_texture(&texture(2, 1), || Ok(true)).err(), Some(CudaError::INVALID_VALUE));
    }

    #[test]
    fn memory_resources_carry_their_channels_both_ways() {
        let runtime = cudaResourceDesc {
            res_type: RESOURCE_PITCH_2D,
            res: RuntimeResourceData {
                handle: 0x7000 as *mut c_void,
                desc: cudaChannelFormatDesc { x: 16, y: 16, z: 0, w: 0, f: 2 },
                size: 64,
                height: 32,
                pitch_in_bytes: 512,
                reserved: [0; 9],
            },
            flags: 0,
        };
        // SAFETY: a local struct.
        let driver = unsafe { driver_resource(&runtime) }.unwrap();
        assert_eq!(driver.resType.cast_signed(), RESOURCE_PITCH_2D);
        // SAFETY: a pitched resource fills in `pitch2D`.
        let pitched = unsafe { driver.res.pitch2D };
        assert_eq!((pitched.devPtr, pitched.format, pitched.numChannels), (0x7000, 0x10, 2));
        assert_eq!((pitched.width, pitched.height, pitched.pitchInBytes), (64, 32, 512));
        let back = runtime_resource(&driver);
        assert_eq!((back.res_type, back.res.handle, back.res.desc), (RESOURCE_PITCH_2D, runtime.res.handle, runtime.res.desc));
        assert_eq!((back.res.size, back.res.height, back.res.pitch_in_bytes), (64, 32, 512));
    }
}
