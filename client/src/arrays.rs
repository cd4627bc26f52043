//! Pitched allocations, 2D memsets, arrays, mipmapped arrays, texture and surface objects on
//! the client side. Arrays are named by ids this process chooses (the app's `CUarray` and
//! `CUmipmappedArray` values) and their descriptors are kept here, so descriptor queries and
//! copy bounds are answered without a round trip. Texture and surface objects are the driver's
//! own values on the server: kernels take them as arguments.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{ArrayDesc, Memset2d, Resource, TextureDesc, ViewDesc, req};

use crate::client::Client;

/// Array ids live apart from every other handle range the app may hold.
const ARRAY_ID_BASE: u64 = 0xA_0000_0000;

/// An array or mipmapped array this process made.
#[derive(Clone)]
struct ArrayInfo {
    desc: ArrayDesc,
    /// `Some(levels)` for a mipmapped array, with the ids its levels were given.
    mipmap: Option<(u32, HashMap<u32, u64>)>,
    /// The mipmapped array this is a level of.
    level_of: Option<u64>,
}

#[derive(Default)]
pub struct Arrays {
    next_id: AtomicU64,
    arrays: Mutex<HashMap<u64, ArrayInfo>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Arrays {
    fn new_id(&self) -> u64 {
        ARRAY_ID_BASE + self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }
}

impl Client {
    /// `cuMemAllocPitch`: the allocation and its pitch.
    pub fn malloc_pitch(&self, width: u64, height: u64, element_size: u32) -> CudaResult<(u64, u64)> {
        let reply = self.call(req::MallocPitch { width, height, element_size })?;
        self.add_device_range(reply.ptr, reply.pitch * height, true);
        self.ranges.mark_legacy_ipc(reply.ptr);
        Ok((reply.ptr, reply.pitch))
    }

    /// A 2D memset, checked here and queued.
    pub fn memset_2d(&self, set: Memset2d, stream: u64) -> CudaResult<()> {
        if set.width == 0 || set.height == 0 {
            return Ok(());
        }
        let row = set.width.checked_mul(u64::from(set.element_size)).ok_or(CudaError::INVALID_VALUE)?;
        if set.height > 1 && row > set.pitch {
            return Err(CudaError::INVALID_VALUE);
        }
        let span = (set.height - 1).checked_mul(set.pitch).and_then(|rows| rows.checked_add(row)).ok_or(CudaError::INVALID_VALUE)?;
        self.check_device_range(set.dst, span)?;
        self.post(req::Memset2D { set, stream })
    }

    /// A new array (`levels`: a mipmapped array of that many levels); its id.
    pub fn array_create(&self, desc: ArrayDesc, levels: Option<u32>) -> CudaResult<u64> {
        let array = self.arrays.new_id();
        self.call(req::ArrayCreate { array, desc, levels })?;
        let info = ArrayInfo { desc, mipmap: levels.map(|levels| (levels, HashMap::new())), level_of: None };
        lock(&self.arrays.arrays).insert(array, info);
        Ok(array)
    }

    /// Destroys an array or a mipmapped array (with its levels); a level alone cannot be.
    pub fn array_destroy(&self, array: u64, mipmapped: bool) -> CudaResult<()> {
        {
            let arrays = lock(&self.arrays.arrays);
            match arrays.get(&array) {
                Some(info) if info.level_of.is_none() && info.mipmap.is_some() == mipmapped => {}
                _ => return Err(CudaError::INVALID_VALUE),
            }
        }
        self.call(req::ArrayDestroy { array })?;
        let mut arrays = lock(&self.arrays.arrays);
        if let Some(ArrayInfo { mipmap: Some((_, levels)), .. }) = arrays.remove(&array) {
            for level in levels.values() {
                arrays.remove(level);
            }
        }
        Ok(())
    }

    /// The array of level `level` of a mipmapped array (the same id each time it is asked).
    pub fn mipmap_level(&self, mipmap: u64, level: u32) -> CudaResult<u64> {
        {
            let arrays = lock(&self.arrays.arrays);
            match arrays.get(&mipmap).and_then(|info| info.mipmap.as_ref()) {
                Some((levels, _)) if level >= *levels => return Err(CudaError::INVALID_VALUE),
                Some((_, known)) => {
                    if let Some(array) = known.get(&level) {
                        return Ok(*array);
                    }
                }
                None => return Err(CudaError::INVALID_VALUE),
            }
        }
        let array = self.arrays.new_id();
        self.call(req::MipmappedArrayLevel { mipmap, level, array })?;
        let mut arrays = lock(&self.arrays.arrays);
        let desc = arrays.get(&mipmap).map(|info| info.desc.level(level)).ok_or(CudaError::INVALID_VALUE)?;
        if let Some(ArrayInfo { mipmap: Some((_, known)), .. }) = arrays.get_mut(&mipmap) {
            known.insert(level, array);
        }
        arrays.insert(array, ArrayInfo { desc, mipmap: None, level_of: Some(mipmap) });
        Ok(array)
    }

    /// An array's descriptor (not a mipmapped array's).
    pub fn array_desc(&self, array: u64) -> CudaResult<ArrayDesc> {
        match lock(&self.arrays.arrays).get(&array) {
            Some(info) if info.mipmap.is_none() => Ok(info.desc),
            _ => Err(CudaError::INVALID_VALUE),
        }
    }

    /// A mipmapped array's level-0 descriptor and level count.
    pub fn mipmap_desc(&self, mipmap: u64) -> CudaResult<(ArrayDesc, u32)> {
        match lock(&self.arrays.arrays).get(&mipmap) {
            Some(ArrayInfo { desc, mipmap: Some((levels, _)), .. }) => Ok((*desc, *levels)),
            _ => Err(CudaError::INVALID_VALUE),
        }
    }

    pub fn tex_object_create(&self, resource: Resource, texture: TextureDesc, view: Option<ViewDesc>) -> CudaResult<u64> {
        self.call(req::TexObjectCreate { resource, texture, view }).map(|reply| reply.handle)
    }

    pub fn surf_object_create(&self, array: u64) -> CudaResult<u64> {
        self.call(req::SurfObjectCreate { array }).map(|reply| reply.handle)
    }

    pub fn object_destroy(&self, handle: u64, surface: bool) -> CudaResult<()> {
        self.call(req::ObjectDestroy { handle, surface }).map(drop)
    }

    /// Forgets every array (after a device reset destroyed them).
    pub fn forget_arrays(&self) {
        lock(&self.arrays.arrays).clear();
    }
}
