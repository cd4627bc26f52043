//! Pitched allocations, 2D memsets, arrays, mipmapped arrays, texture and surface objects on
//! the client side. Arrays are named by ids this process chooses (the app's `CUarray` and
//! `CUmipmappedArray` values) and their descriptors are kept here, so descriptor queries and
//! copy bounds are answered without a round trip. Texture and surface objects are the driver's
//! own values on the server: kernels take them as arguments.
//!
//! A planar array's planes (`cuArrayGetPlane`) and a mipmapped array's levels are arrays of their
//! own ids, parts of their array: they go with it and cannot be destroyed alone. Sparse and
//! deferred-mapping arrays get their memory from `cuMemMapArrayAsync` (`map_arrays`), onto
//! physical allocations made as tile pools.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{
    ArrayDesc, ArrayMap, DecompressOp, Memset2d, Resource, SparseProperties, Subresource, TextureDesc, ViewDesc, array_flags,
    decompress_algorithm, mem_usage, req,
};

use crate::client::Client;

/// Array ids live apart from every other handle range the app may hold.
const ARRAY_ID_BASE: u64 = 0xA_0000_0000;

/// What an array is a part of (it goes with that one).
#[derive(Clone, Copy, PartialEq, Eq)]
enum PartOf {
    /// A level of this mipmapped array.
    Level(u64),
    /// A plane of this planar array.
    Plane(u64),
}

/// An array or mipmapped array this process made.
#[derive(Clone)]
struct ArrayInfo {
    desc: ArrayDesc,
    /// `Some(levels)` for a mipmapped array, with the ids its levels were given.
    mipmap: Option<(u32, HashMap<u32, u64>)>,
    part_of: Option<PartOf>,
    /// The ids a planar array's planes were given, by plane.
    planes: HashMap<u32, u64>,
}

impl ArrayInfo {
    fn new(desc: ArrayDesc, mipmap: Option<(u32, HashMap<u32, u64>)>, part_of: Option<PartOf>) -> Self {
        Self { desc, mipmap, part_of, planes: HashMap::new() }
    }
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
        self.refuse_overlap(reply.ptr, reply.pitch * height)?;
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
        if let Some(outcome) = self.on_other_server(set.dst, stream, |stream| self.post(req::Memset2D { set, stream })) {
            return outcome;
        }
        self.post(req::Memset2D { set, stream })
    }

    /// A new array (`levels`: a mipmapped array of that many levels); its id.
    pub fn array_create(&self, desc: ArrayDesc, levels: Option<u32>) -> CudaResult<u64> {
        let array = self.arrays.new_id();
        self.call(req::ArrayCreate { array, desc, levels })?;
        let info = ArrayInfo::new(desc, levels.map(|levels| (levels, HashMap::new())), None);
        lock(&self.arrays.arrays).insert(array, info);
        Ok(array)
    }

    /// Destroys an array (with its planes) or a mipmapped array (with its levels); a level or a
    /// plane alone cannot be.
    pub fn array_destroy(&self, array: u64, mipmapped: bool) -> CudaResult<()> {
        {
            let arrays = lock(&self.arrays.arrays);
            match arrays.get(&array) {
                Some(info) if info.part_of.is_none() && info.mipmap.is_some() == mipmapped => {}
                _ => return Err(CudaError::INVALID_VALUE),
            }
        }
        self.call(req::ArrayDestroy { array })?;
        let mut arrays = lock(&self.arrays.arrays);
        if let Some(info) = arrays.remove(&array) {
            let levels = info.mipmap.map(|(_, levels)| levels).unwrap_or_default();
            for part in levels.values().chain(info.planes.values()) {
                arrays.remove(part);
            }
        }
        Ok(())
    }

    /// The array of plane `plane` of a planar array (the same id each time it is asked), with
    /// the descriptor the server's driver gives it.
    pub fn array_plane(&self, array: u64, plane: u32) -> CudaResult<u64> {
        {
            let arrays = lock(&self.arrays.arrays);
            let info = arrays.get(&array).filter(|info| info.part_of.is_none() && info.mipmap.is_none()).ok_or(CudaError::INVALID_VALUE)?;
            let planes = info.desc.planes().ok_or(CudaError::INVALID_VALUE)?;
            if plane as usize >= planes.len() {
                return Err(CudaError::INVALID_VALUE);
            }
            if let Some(known) = info.planes.get(&plane) {
                return Ok(*known);
            }
        }
        let plane_array = self.arrays.new_id();
        let desc = self.call(req::ArrayGetPlane { array, plane, plane_array })?.desc;
        let mut arrays = lock(&self.arrays.arrays);
        arrays.get_mut(&array).ok_or(CudaError::INVALID_VALUE)?.planes.insert(plane, plane_array);
        arrays.insert(plane_array, ArrayInfo::new(desc, None, Some(PartOf::Plane(array))));
        Ok(plane_array)
    }

    /// The descriptor and level count (1: an array) of an array or mipmapped array of this
    /// process that is no part of another (`mipmapped` says which it must be).
    fn whole_array(&self, array: u64, mipmapped: bool) -> CudaResult<(ArrayDesc, u32)> {
        match lock(&self.arrays.arrays).get(&array) {
            Some(info) if info.part_of.is_none() && info.mipmap.is_some() == mipmapped => {
                Ok((info.desc, info.mipmap.as_ref().map_or(1, |(levels, _)| *levels)))
            }
            _ => Err(CudaError::INVALID_VALUE),
        }
    }

    /// `cuArrayGetSparseProperties` (`cuMipmappedArrayGetSparseProperties` with `mipmapped`) of
    /// a sparse array: not of a level, whose mipmapped array has them.
    pub fn sparse_properties(&self, array: u64, mipmapped: bool) -> CudaResult<SparseProperties> {
        let (desc, _) = self.whole_array(array, mipmapped)?;
        if desc.flags & array_flags::SPARSE == 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        self.call(req::ArraySparseProperties { array }).map(|reply| reply.properties)
    }

    /// `cuArrayGetMemoryRequirements` (`cuMipmappedArrayGetMemoryRequirements` with
    /// `mipmapped`) of a deferred-mapping array: size and alignment.
    pub fn memory_requirements(&self, array: u64, mipmapped: bool) -> CudaResult<(u64, u64)> {
        let (desc, _) = self.whole_array(array, mipmapped)?;
        if desc.flags & array_flags::DEFERRED_MAPPING == 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        self.call(req::ArrayMemoryRequirements { array }).map(|reply| (reply.size, reply.alignment))
    }

    /// `cuMemMapArrayAsync`: each entry names a sparse or deferred-mapping array of this process
    /// (a deferred-mapping one is mapped whole: the driver ignores its subresource) and, to map,
    /// a physical allocation made as a tile pool; the session's device is the only device.
    /// The server checks each subresource against the array's tiles and answers at once.
    pub fn map_arrays(&self, mut maps: Vec<ArrayMap>, stream: u64) -> CudaResult<()> {
        if maps.is_empty() {
            return Err(CudaError::INVALID_VALUE);
        }
        for map in &mut maps {
            let (desc, _) = self.whole_array(map.array, map.mipmapped)?;
            if !desc.is_mapped_later() || map.device_mask != 1 {
                return Err(CudaError::INVALID_VALUE);
            }
            if desc.flags & array_flags::DEFERRED_MAPPING != 0 {
                map.subresource = Subresource::Whole;
            }
            if let Some((handle, _)) = map.memory {
                let physical = self.mem_physical(handle).ok_or(CudaError::INVALID_VALUE)?;
                if physical.usage & mem_usage::TILE_POOL == 0 {
                    return Err(CudaError::INVALID_VALUE);
                }
            }
        }
        self.call(req::MemMapArray { maps, stream }).map(drop)
    }

    /// `cuMemBatchDecompressAsync`: every buffer must be device memory of the session. An error
    /// comes with the index of the operation it is about (`u64::MAX`: the batch as a whole).
    pub fn batch_decompress(&self, ops: Vec<DecompressOp>, stream: u64) -> Result<(), (CudaError, Option<u64>)> {
        if ops.is_empty() {
            return Err((CudaError::INVALID_VALUE, Some(u64::MAX)));
        }
        for (index, op) in ops.iter().enumerate() {
            let checked = self
                .check_device_range(op.src, op.src_len)
                .and_then(|()| self.check_device_range(op.dst, op.dst_len.max(1)))
                .and_then(|()| self.check_device_range(op.dst_act_bytes, 4));
            let known = matches!(op.algo, decompress_algorithm::DEFLATE | decompress_algorithm::SNAPPY | decompress_algorithm::LZ4);
            if op.src_len == 0 || !known || checked.is_err() {
                return Err((CudaError::INVALID_VALUE, Some(index as u64)));
            }
        }
        match self.call(req::MemBatchDecompress { ops, stream }) {
            Ok(reply) => reply.error.map_or(Ok(()), |error| Err((error, reply.error_index))),
            Err(error) => Err((error, Some(u64::MAX))),
        }
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
        arrays.insert(array, ArrayInfo::new(desc, None, Some(PartOf::Level(mipmap))));
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
