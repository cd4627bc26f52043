//! Pitched memory, shaped copies (2D, 3D, to and from arrays), arrays, mipmapped arrays,
//! texture and surface objects for a session. Array ids are the client's; every copy's box is
//! checked against the session's ranges or the array's extent before it reaches the device, and
//! arrays count in the quota from creation to destruction.
//!
//! A planar array (NV12) is copied plane by plane: `cuArrayGetPlane` names each plane an array of
//! the session, part of its array as a mipmapped array's levels are of theirs (it goes with it,
//! and cannot be destroyed alone). Sparse and deferred-mapping arrays have no memory of their
//! own: `cuMemMapArrayAsync` maps tile-pool memory of the session's (`cuMemCreate`, counted in
//! the quota there) into them, each entry checked against the array's tiles, levels, layers and
//! mip tail and the pool's size first.
//!
//! A session moves with its arrays (their bytes in the snapshot, a planar array's plane by plane)
//! and its texture and surface objects. Kernels take those objects by the driver's handle, which
//! the app holds, so each is made again under the same handle: in handle order, the driver's
//! lower handles taken by fillers until it gives the one wanted (a restore fails if it has passed
//! it). Sparse and deferred-mapping arrays do not move yet: what is mapped into them is the
//! driver's to know, and a session holding one refuses to move.

use std::collections::HashMap;
use std::io::{Read, Write};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{
    ArrayDesc, ArrayMap, CopySide, DecompressOp, Pos3, Resource, SPARSE_TILE_BYTES, ShapedCopy, SparseProperties, Subresource, TextureDesc,
    ViewDesc, array_flags, decompress_algorithm, rep, req,
};
use serde::{Deserialize, Serialize};

use super::{BulkIn, MAX_HANDLES, Responder, Session, chunk_len};
use crate::backend::{ArrayMapWork, ArrayRef, Device, Extent, Side, TexResource};
use crate::memory::RangeKind;

/// What an array the session named is a part of; it goes with that.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PartOf {
    /// A level of a mipmapped array.
    Level { mipmap: u64, level: u32 },
    /// A plane of a planar array.
    Plane { array: u64, plane: u32 },
}

/// An array the session named: its own, a level of one of its mipmapped arrays, or a plane of one
/// of its planar arrays.
struct ArrayEntry<D: Device> {
    array: D::Array,
    desc: ArrayDesc,
    part_of: Option<PartOf>,
    /// The ids its planes were given (a planar array).
    planes: Vec<u64>,
}

impl<D: Device> ArrayEntry<D> {
    fn own(array: D::Array, desc: ArrayDesc) -> Self {
        Self { array, desc, part_of: None, planes: Vec::new() }
    }
}

/// Most entries one `cuMemMapArrayAsync` or `cuMemBatchDecompressAsync` may carry: far more than
/// apps batch, few enough that a hostile count costs the worker little.
const MAX_BATCH: usize = 4096;

struct MipmapEntry<D: Device> {
    mipmap: D::Mipmap,
    desc: ArrayDesc,
    count: u32,
    /// The ids its levels were given.
    levels: Vec<u64>,
    charged: u64,
}

/// A texture or surface object as the app made it (array ids are the session's).
#[derive(Clone, Serialize, Deserialize)]
enum Object {
    Texture { resource: Resource, texture: TextureDesc, view: Option<ViewDesc> },
    Surface { array: u64 },
}

impl Object {
    fn is_surface(&self) -> bool {
        matches!(self, Self::Surface { .. })
    }
}

/// The session's arrays and objects.
pub struct ArrayTable<D: Device> {
    arrays: HashMap<u64, ArrayEntry<D>>,
    mipmaps: HashMap<u64, MipmapEntry<D>>,
    /// Texture and surface objects the session made, by the driver's handle.
    objects: HashMap<u64, Object>,
}

/// A mipmapped array in a snapshot: id, descriptor, level count and the levels the app named
/// (id, level).
type MipmapState = (u64, ArrayDesc, u32, Vec<(u64, u32)>);

/// The session's arrays and objects in a snapshot; the arrays' bytes follow in the file, each
/// array whole (a planar one plane by plane), then each mipmapped array level by level.
#[derive(Serialize, Deserialize)]
pub(super) struct ArraysState {
    /// Id and descriptor.
    arrays: Vec<(u64, ArrayDesc)>,
    mipmaps: Vec<MipmapState>,
    /// By handle, ascending.
    objects: Vec<(u64, Object)>,
    /// The planes the app named: id, its array's id, plane.
    planes: Vec<(u64, u64, u32)>,
}

impl<D: Device> Default for ArrayTable<D> {
    fn default() -> Self {
        Self { arrays: HashMap::new(), mipmaps: HashMap::new(), objects: HashMap::new() }
    }
}

impl<D: Device> ArrayTable<D> {
    /// How many arrays, mipmapped arrays and texture or surface objects the app holds.
    pub(super) fn held(&self) -> usize {
        self.arrays.len() + self.mipmaps.len() + self.objects.len()
    }

    /// Why the session cannot move, if its arrays hold it: sparse and deferred-mapping arrays,
    /// whose mappings onto physical memory only the driver knows.
    pub(super) fn move_blocker(&self) -> Option<String> {
        let own = self.arrays.values().filter(|entry| entry.part_of.is_none()).map(|entry| &entry.desc);
        let mapped = own.chain(self.mipmaps.values().map(|entry| &entry.desc)).filter(|desc| desc.is_mapped_later()).count();
        (mapped > 0).then(|| format!("it holds {mapped} sparse or deferred-mapping CUDA array(s), whose mappings do not move yet"))
    }

    pub(super) fn state(&self) -> ArraysState {
        let mut arrays: Vec<_> =
            self.arrays.iter().filter(|(_, entry)| entry.part_of.is_none()).map(|(id, entry)| (*id, entry.desc)).collect();
        arrays.sort_unstable_by_key(|(id, _)| *id);
        let level_of = |id: &u64| match self.arrays.get(id)?.part_of? {
            PartOf::Level { level, .. } => Some(level),
            PartOf::Plane { .. } => None,
        };
        let mut mipmaps: Vec<_> = self
            .mipmaps
            .iter()
            .map(|(id, entry)| {
                let levels = entry.levels.iter().filter_map(|level| Some((*level, level_of(level)?))).collect();
                (*id, entry.desc, entry.count, levels)
            })
            .collect();
        mipmaps.sort_unstable_by_key(|(id, ..)| *id);
        let mut objects: Vec<_> = self.objects.iter().map(|(handle, object)| (*handle, object.clone())).collect();
        objects.sort_unstable_by_key(|(handle, _)| *handle);
        let mut planes: Vec<_> = self
            .arrays
            .iter()
            .filter_map(|(id, entry)| match entry.part_of? {
                PartOf::Plane { array, plane } => Some((*id, array, plane)),
                PartOf::Level { .. } => None,
            })
            .collect();
        planes.sort_unstable();
        ArraysState { arrays, mipmaps, objects, planes }
    }

    /// Every array of the session with the descriptor of its bytes, in snapshot file order (a
    /// planar array's planes in plane order).
    fn in_file_order(&self, state: &ArraysState, device: &D) -> CudaResult<Vec<(D::Array, ArrayDesc)>> {
        let mut out = Vec::new();
        for (id, desc) in &state.arrays {
            let array = self.arrays.get(id).ok_or(CudaError::INVALID_VALUE)?.array;
            match desc.planes() {
                Some(planes) => {
                    for plane in (0u32..).take(planes.len()) {
                        out.push(device.array_plane(array, desc, plane)?);
                    }
                }
                None => out.push((array, *desc)),
            }
        }
        for (id, desc, count, _) in &state.mipmaps {
            let mipmap = self.mipmaps.get(id).ok_or(CudaError::INVALID_VALUE)?.mipmap;
            for level in 0..(*count).max(1) {
                out.push((device.mipmap_level(mipmap, level)?, desc.level(level)));
            }
        }
        Ok(out)
    }

    /// Writes the bytes of the arrays of `state` to `out` (after the session drained).
    pub(super) fn write_bytes(&self, state: &ArraysState, device: &D, chunk: u64, out: &mut impl Write) -> Result<(), String> {
        let arrays = self.in_file_order(state, device).map_err(|error| format!("the session's arrays: {error}"))?;
        for (array, desc) in arrays {
            for (pos, extent) in pieces(&desc, chunk)? {
                let len = (extent.width * extent.height) as usize;
                let staging = device.staging(len).map_err(|error| format!("staging: {error}"))?;
                let pending = device
                    .start_shaped_to_staged(Side::Array { array, pos }, extent, staging, device.null_stream())
                    .map_err(|error| format!("reading an array: {error}"))?;
                while !device.dtoh_done(&pending) {
                    std::hint::spin_loop();
                }
                let bytes = device.dtoh_bytes(&pending).map_err(|error| format!("reading an array: {error}"))?;
                out.write_all(&bytes[..len]).map_err(|error| format!("writing the snapshot: {error}"))?;
            }
        }
        Ok(())
    }

    /// Makes the arrays and objects of `state` again on `device`, filling the arrays from
    /// `input` (their bytes in the quota are `state_bytes`). A worker whose restore fails exits,
    /// and the driver frees what it made.
    pub(super) fn restore(device: &D, state: ArraysState, chunk: u64, input: &mut impl Read) -> Result<Self, String> {
        let mut table = Self::default();
        for (id, desc) in &state.arrays {
            let array = device.array_create(desc).map_err(|error| format!("array {id}: {error}"))?;
            table.arrays.insert(*id, ArrayEntry::own(array, *desc));
        }
        for &(plane_id, of, plane) in &state.planes {
            let parent = table.arrays.get(&of).ok_or(format!("plane {plane_id} names array {of}, which is gone"))?;
            let (array, desc) =
                device.array_plane(parent.array, &parent.desc, plane).map_err(|error| format!("plane {plane} of array {of}: {error}"))?;
            table
                .arrays
                .insert(plane_id, ArrayEntry { array, desc, part_of: Some(PartOf::Plane { array: of, plane }), planes: Vec::new() });
            if let Some(parent) = table.arrays.get_mut(&of) {
                parent.planes.push(plane_id);
            }
        }
        for (id, desc, count, levels) in &state.mipmaps {
            let mipmap = device.mipmap_create(desc, *count).map_err(|error| format!("mipmapped array {id}: {error}"))?;
            let charged = charge(desc, *count).map_err(|error| format!("mipmapped array {id}: {error}"))?;
            let mut named = Vec::new();
            for &(level_id, level) in levels {
                let array = device.mipmap_level(mipmap, level).map_err(|error| format!("level {level} of array {id}: {error}"))?;
                let part_of = Some(PartOf::Level { mipmap: *id, level });
                table.arrays.insert(level_id, ArrayEntry { array, desc: desc.level(level), part_of, planes: Vec::new() });
                named.push(level_id);
            }
            table.mipmaps.insert(*id, MipmapEntry { mipmap, desc: *desc, count: *count, levels: named, charged });
        }
        let arrays = table.in_file_order(&state, device).map_err(|error| format!("the session's arrays: {error}"))?;
        for (array, desc) in arrays {
            for (pos, extent) in pieces(&desc, chunk)? {
                let len = (extent.width * extent.height) as usize;
                let mut staging = device.staging(len).map_err(|error| format!("staging: {error}"))?;
                input.read_exact(&mut D::staging_bytes(&mut staging)[..len]).map_err(|error| format!("reading the snapshot: {error}"))?;
                device
                    .copy_staged_to_shaped(Side::Array { array, pos }, extent, staging, device.null_stream())
                    .map_err(|error| format!("writing an array: {error}"))?;
            }
        }
        table.remake_objects(device, &state.objects)?;
        Ok(table)
    }

    /// Makes `object` on `device` with the arrays of this table.
    fn make_object(&self, device: &D, object: &Object) -> Result<u64, String> {
        let array = |id: &u64| self.arrays.get(id).map(|entry| entry.array).ok_or(format!("an object names array {id}, which is gone"));
        let made = match object {
            Object::Texture { resource, texture, view } => {
                let resource = match resource {
                    Resource::Array { array: id } => TexResource::Array(array(id)?),
                    Resource::Mipmapped { array: id } => TexResource::Mipmapped(
                        self.mipmaps
                            .get(id)
                            .map(|entry| entry.mipmap)
                            .ok_or(format!("a texture names mipmapped array {id}, which is gone"))?,
                    ),
                    memory => TexResource::Memory(*memory),
                };
                device.tex_create(resource, texture, view.as_ref())
            }
            Object::Surface { array: id } => device.surf_create(array(id)?),
        };
        made.map_err(|error| format!("a texture or surface object: {error}"))
    }

    /// Makes `objects` (ascending handles) again under their handles.
    fn remake_objects(&mut self, device: &D, objects: &[(u64, Object)]) -> Result<(), String> {
        let mut fillers = Vec::new();
        let made = (|| {
            for (handle, object) in objects {
                loop {
                    let made = self.make_object(device, object)?;
                    if made == *handle {
                        self.objects.insert(made, object.clone());
                        break;
                    }
                    fillers.push((made, object.is_surface()));
                    if made > *handle || fillers.len() > MAX_HANDLES {
                        return Err(format!(
                            "texture or surface object {handle} cannot be made again under its handle here (the driver gives {made})"
                        ));
                    }
                }
            }
            Ok(())
        })();
        for (handle, surface) in fillers {
            let _ = device.object_destroy(handle, surface);
        }
        made
    }
}

/// An array's bytes cut into copies of whole rows of at most `chunk` bytes (one row at least),
/// slice by slice: each copy's position and box.
fn pieces(desc: &ArrayDesc, chunk: u64) -> Result<Vec<(Pos3, Extent)>, String> {
    let (width, height, depth) = desc.extent().ok_or("an array of an unknown format")?;
    let rows = (chunk / width.max(1)).max(1);
    let mut out = Vec::new();
    for z in 0..depth {
        let mut y = 0;
        while y < height {
            let take = rows.min(height - y);
            out.push((Pos3 { x: 0, y, z }, Extent { width, height: take, depth: 1 }));
            y += take;
        }
    }
    Ok(out)
}

/// Bytes of the arrays of `state` in a snapshot file.
pub(super) fn state_bytes(state: &ArraysState) -> u64 {
    let arrays = state.arrays.iter().map(|(_, desc)| charge(desc, 1).unwrap_or(0));
    let mipmaps = state.mipmaps.iter().map(|(_, desc, count, _)| charge(desc, *count).unwrap_or(0));
    arrays.chain(mipmaps).sum()
}

/// The bytes an array (all its levels, all its planes) is charged: its elements, packed. A sparse
/// or deferred-mapping array is charged nothing: its memory is the tile pools mapped into it,
/// charged when they were made.
fn charge(desc: &ArrayDesc, levels: u32) -> CudaResult<u64> {
    let bytes = desc.packed_bytes(levels).ok_or(CudaError::INVALID_VALUE)?;
    Ok(if desc.is_mapped_later() { 0 } else { bytes })
}

/// Checks one `cuMemMapArrayAsync` entry's subresource against its array's sparse layout
/// (`properties`; `levels` 1 for an array) and returns the bytes of tile pool it maps: whole
/// tiles of a level inside its extent (rounded up to tiles), or whole tiles of the mip tail.
fn subresource_bytes(desc: &ArrayDesc, levels: u32, properties: &SparseProperties, subresource: &Subresource) -> CudaResult<u64> {
    let layers = desc.layers();
    let layer_ok = |layer: u32, per_layer: bool| if per_layer && layers > 0 { u64::from(layer) < layers } else { layer == 0 };
    match *subresource {
        Subresource::SparseLevel { level, layer, offset, extent } => {
            let in_tail = properties.miptail_size > 0 && level >= properties.miptail_first_level;
            if level >= levels || in_tail || !layer_ok(layer, true) || desc.height == 0 {
                return Err(CudaError::INVALID_VALUE);
            }
            let shape = desc.level(level);
            let three_d = layers == 0 && desc.depth > 0;
            let dims = [shape.width, shape.height, if three_d { shape.depth } else { 1 }];
            if !three_d && (offset[2] != 0 || extent[2] != 1) {
                return Err(CudaError::INVALID_VALUE);
            }
            let mut tiles = 1u64;
            // A 2D array's tiles are one element deep, whatever depth the driver reports.
            for axis in 0..if three_d { 3 } else { 2 } {
                let (tile, at, len, dim) = (u64::from(properties.tile[axis]), u64::from(offset[axis]), u64::from(extent[axis]), dims[axis]);
                let end = at + len;
                // Whole tiles from a tile's start, up to the level's edge (the last tile may
                // hang over it).
                let aligned = tile > 0 && at.is_multiple_of(tile) && (len.is_multiple_of(tile) || end == dim);
                if !aligned || len == 0 || end > dim.next_multiple_of(tile) {
                    return Err(CudaError::INVALID_VALUE);
                }
                tiles = tiles.checked_mul(len.div_ceil(tile)).ok_or(CudaError::INVALID_VALUE)?;
            }
            tiles.checked_mul(SPARSE_TILE_BYTES).ok_or(CudaError::INVALID_VALUE)
        }
        Subresource::Miptail { layer, offset, size } => {
            let per_layer = properties.flags & SparseProperties::SINGLE_MIPTAIL == 0;
            let within = offset.checked_add(size).is_some_and(|end| end <= properties.miptail_size);
            let whole_tiles = offset.is_multiple_of(SPARSE_TILE_BYTES) && size.is_multiple_of(SPARSE_TILE_BYTES);
            if size == 0 || !within || !whole_tiles || !layer_ok(layer, per_layer) {
                return Err(CudaError::INVALID_VALUE);
            }
            Ok(size)
        }
        Subresource::Whole => Err(CudaError::INVALID_VALUE),
    }
}

fn extent(copy: &ShapedCopy) -> Extent {
    Extent { width: copy.width, height: copy.height, depth: copy.depth }
}

impl<D: Device> Session<D> {
    /// Checks one non-host side of `copy` and resolves it for the device.
    fn device_side(&self, side: CopySide, pos: Pos3, copy: &ShapedCopy) -> CudaResult<Side<D>> {
        match side {
            CopySide::Device { ptr, pitch, height } => {
                let (start, len) = copy.size().pitched_span(pos, pitch, height).ok_or(CudaError::INVALID_VALUE)?;
                let first = ptr.checked_add(start).ok_or(CudaError::INVALID_VALUE)?;
                self.ranges.check(first, len)?;
                Ok(Side::Device { ptr: first, pitch, height })
            }
            CopySide::Array { array } => {
                let entry = self.arrays.arrays.get(&array).ok_or(CudaError::INVALID_VALUE)?;
                if !copy.size().fits_array(pos, &entry.desc) {
                    return Err(CudaError::INVALID_VALUE);
                }
                Ok(Side::Array { array: entry.array, pos })
            }
            CopySide::Host { .. } => Err(CudaError::INVALID_VALUE),
        }
    }

    /// Destroys the session's arrays and objects (it ends, or the device resets).
    pub(super) fn release_arrays(&mut self) {
        for (handle, object) in self.arrays.objects.drain() {
            let _ = self.device.object_destroy(handle, object.is_surface());
        }
        for (_, entry) in self.arrays.arrays.drain() {
            if entry.part_of.is_none() {
                if let Ok(bytes) = charge(&entry.desc, 1) {
                    self.budget.release(bytes);
                }
                let _ = self.device.array_destroy(entry.array);
            }
        }
        for (_, entry) in self.arrays.mipmaps.drain() {
            self.budget.release(entry.charged);
            let _ = self.device.mipmap_destroy(entry.mipmap);
        }
    }

    pub(super) fn pitch_alloc(&mut self, request: req::MallocPitch, reply: Responder<rep::MallocPitch>) {
        let result = (|| {
            if !matches!(request.element_size, 4 | 8 | 16) || request.width == 0 || request.height == 0 {
                return Err(CudaError::INVALID_VALUE);
            }
            // Charged for the rows as asked; the pitch the device picks is known only after.
            let asked = request.width.checked_mul(request.height).ok_or(CudaError::MEMORY_ALLOCATION)?;
            if !self.budget.try_reserve(asked) {
                return Err(CudaError::MEMORY_ALLOCATION);
            }
            let (ptr, pitch) = match self.device.malloc_pitch(request.width, request.height, request.element_size) {
                Ok(made) => made,
                Err(error) => {
                    self.budget.release(asked);
                    return Err(error);
                }
            };
            let len = pitch * request.height;
            // Charge the padding too; if the quota has no room for it, give everything back.
            if len > asked && !self.budget.try_reserve(len - asked) {
                self.budget.release(asked);
                let _ = self.device.free(ptr);
                return Err(CudaError::MEMORY_ALLOCATION);
            }
            self.ranges.insert(ptr, len, RangeKind::Allocation);
            self.owners.allocated(ptr, self.device.current_device());
            Ok(rep::MallocPitch { ptr, pitch })
        })();
        reply.send(result);
    }

    pub(super) fn set_2d(&mut self, request: req::Memset2D, reply: Responder<rep::Memset2D>) {
        let set = request.set;
        let result = (|| {
            let element = u64::from(set.element_size);
            if !matches!(set.element_size, 1 | 2 | 4) || !set.dst.is_multiple_of(element) || !set.pitch.is_multiple_of(element) {
                return Err(CudaError::INVALID_VALUE);
            }
            let row = set.width.checked_mul(element).ok_or(CudaError::INVALID_VALUE)?;
            if set.width == 0 || set.height == 0 {
                return Ok(());
            }
            if set.height > 1 && row > set.pitch {
                return Err(CudaError::INVALID_VALUE);
            }
            let span = (set.height - 1).checked_mul(set.pitch).and_then(|rows| rows.checked_add(row)).ok_or(CudaError::INVALID_VALUE)?;
            self.ranges.check(set.dst, span)?;
            let stream = self.stream(request.stream)?;
            self.device.memset_2d(&set, stream)
        })();
        if result.is_ok() {
            self.queued(request.stream, crate::activity::Work::Copies);
        }
        reply.send(result.map(|()| rep::Memset2D {}));
    }

    pub(super) fn copy_shaped(&mut self, request: req::MemcpyShaped, reply: Responder<rep::MemcpyShaped>) {
        let copy = request.copy;
        let result = (|| {
            let src = self.device_side(copy.src, copy.src_pos, &copy)?;
            let dst = self.device_side(copy.dst, copy.dst_pos, &copy)?;
            let stream = self.stream(request.stream)?;
            if copy.packed_len() == Some(0) {
                return Ok(());
            }
            // SAFETY: no host side (`device_side` refuses them).
            unsafe { self.device.copy_shaped(src, dst, extent(&copy), stream) }
        })();
        if result.is_ok() {
            self.queued(request.stream, crate::activity::Work::Copies);
        }
        reply.send(result.map(|()| rep::MemcpyShaped {}));
    }

    pub(super) fn copy_host_to_shaped(
        &mut self,
        request: req::MemcpyHtoShaped,
        bulk: &mut BulkIn<'_>,
        reply: Responder<rep::MemcpyHtoShaped>,
    ) {
        let copy = request.copy;
        let result = (|| {
            // The bulk is the box, packed: one staging buffer's worth at most (the client cuts
            // larger copies into row-aligned pieces).
            let len = copy.packed_len().ok_or(CudaError::INVALID_VALUE)?;
            let packed = CopySide::Host { pitch: copy.width, height: copy.height };
            if copy.src != packed || copy.src_pos != Pos3::default() || len != bulk.remaining() || len > self.config.copy_chunk {
                return Err(CudaError::INVALID_VALUE);
            }
            let dst = self.device_side(copy.dst, copy.dst_pos, &copy)?;
            let stream = self.stream(request.stream)?;
            self.refuse_while_capturing(stream)?;
            if len == 0 {
                return Ok(());
            }
            let mut staging = self.device.staging(chunk_len(len, self.config.copy_chunk)?)?;
            if !bulk.read_into(D::staging_bytes(&mut staging)) {
                // The connection broke; the session ends after this op.
                return Ok(());
            }
            self.device.copy_staged_to_shaped(dst, extent(&copy), staging, stream)?;
            self.count_copy(request.stream, crate::stats::Copied::HostToDeviceSocket, len);
            Ok(())
        })();
        reply.send(result.map(|()| rep::MemcpyHtoShaped {}));
    }

    pub(super) fn copy_shaped_to_host(&mut self, request: req::MemcpyShapedToH, reply: Responder<rep::MemcpyShapedToH>) {
        let copy = request.copy;
        let started = (|| {
            let len = copy.packed_len().ok_or(CudaError::INVALID_VALUE)?;
            let packed = CopySide::Host { pitch: copy.width, height: copy.height };
            if copy.dst != packed || copy.dst_pos != Pos3::default() || len == 0 || len > self.config.copy_chunk {
                return Err(CudaError::INVALID_VALUE);
            }
            let src = self.device_side(copy.src, copy.src_pos, &copy)?;
            let stream = self.stream(request.stream)?;
            self.refuse_while_capturing(stream)?;
            let staging = self.device.staging(chunk_len(len, self.config.copy_chunk)?)?;
            let pending = self.device.start_shaped_to_staged(src, extent(&copy), staging, stream)?;
            Ok((pending, len))
        })();
        match started {
            Ok((pending, len)) => {
                self.count_copy(request.stream, crate::stats::Copied::DeviceToHostSocket, len);
                self.hold_copy(pending, request.stream, request.blocking, reply, rep::MemcpyShapedToH {});
            }
            Err(error) => reply.send(Err(error)),
        }
    }

    pub(super) fn shm_copy_shaped(&mut self, request: req::ShmCopyShaped, reply: Responder<rep::ShmCopyShaped>) {
        let copy = request.copy;
        let result = (|| {
            let segment = self.shm.as_ref().ok_or(CudaError::NOT_SUPPORTED)?;
            // Exactly one side is in the segment.
            let (host, host_pos, to_host) = match (copy.src, copy.dst) {
                (CopySide::Host { pitch, height }, dst) if !matches!(dst, CopySide::Host { .. }) => ((pitch, height), copy.src_pos, false),
                (src, CopySide::Host { pitch, height }) if !matches!(src, CopySide::Host { .. }) => ((pitch, height), copy.dst_pos, true),
                _ => return Err(CudaError::INVALID_VALUE),
            };
            let (pitch, height) = host;
            let (start, len) = copy.size().pitched_span(host_pos, pitch, height).ok_or(CudaError::INVALID_VALUE)?;
            let first = request.offset.checked_add(start).ok_or(CudaError::INVALID_VALUE)?;
            let ptr = segment.pinned(first, len)?;
            let staged = first < segment.staging();
            let host = Side::Host { ptr, pitch, height };
            let stream = self.stream(request.stream)?;
            if staged {
                self.refuse_while_capturing(stream)?;
            }
            let (src, dst) = if to_host {
                (self.device_side(copy.src, copy.src_pos, &copy)?, host)
            } else {
                (host, self.device_side(copy.dst, copy.dst_pos, &copy)?)
            };
            if len == 0 {
                return Ok(());
            }
            // SAFETY: the host side lies in pinned segment memory (checked above), mapped while
            // it is pinned; the other side was checked by `device_side`.
            unsafe { self.device.copy_shaped(src, dst, extent(&copy), stream) }?;
            let how = if to_host { crate::stats::Copied::DeviceToHostShm } else { crate::stats::Copied::HostToDeviceShm };
            self.count_copy(request.stream, how, copy.packed_len().unwrap_or(0));
            Ok(())
        })();
        reply.send(result.map(|()| rep::ShmCopyShaped {}));
    }

    pub(super) fn new_array(&mut self, request: req::ArrayCreate, reply: Responder<rep::ArrayCreate>) {
        let result = (|| {
            let ids_taken = self.arrays.arrays.contains_key(&request.array) || self.arrays.mipmaps.contains_key(&request.array);
            if request.array == 0 || ids_taken || self.arrays.arrays.len() + self.arrays.mipmaps.len() >= MAX_HANDLES {
                return Err(CudaError::INVALID_VALUE);
            }
            let desc = request.desc;
            match desc.element_size() {
                Some(_) => {}
                // Planar arrays (NV12) are copied plane by plane; not mipmapped.
                None if desc.is_planar() && request.levels.is_none() => {}
                // Block-compressed and the newer packed formats are not served.
                None if desc.is_planar() || matches!(desc.channels, 1 | 2 | 4) => return Err(CudaError::NOT_SUPPORTED),
                None => return Err(CudaError::INVALID_VALUE),
            }
            let levels = request.levels.unwrap_or(1);
            let bytes = charge(&desc, levels)?;
            if !self.budget.try_reserve(bytes) {
                return Err(CudaError::MEMORY_ALLOCATION);
            }
            let made = match request.levels {
                None => self.device.array_create(&desc).map(|array| {
                    self.arrays.arrays.insert(request.array, ArrayEntry::own(array, desc));
                }),
                Some(levels) => self.device.mipmap_create(&desc, levels).map(|mipmap| {
                    self.arrays
                        .mipmaps
                        .insert(request.array, MipmapEntry { mipmap, desc, count: levels, levels: Vec::new(), charged: bytes });
                }),
            };
            if made.is_err() {
                self.budget.release(bytes);
            }
            made
        })();
        reply.send(result.map(|()| rep::ArrayCreate {}));
    }

    pub(super) fn drop_array(&mut self, request: req::ArrayDestroy, reply: Responder<rep::ArrayDestroy>) {
        let result = (|| {
            if let Some(entry) = self.arrays.arrays.get(&request.array) {
                if entry.part_of.is_some() {
                    // A level goes with its mipmapped array, a plane with its array.
                    return Err(CudaError::INVALID_VALUE);
                }
                let (array, desc) = (entry.array, entry.desc);
                self.device.array_destroy(array)?;
                if let Some(entry) = self.arrays.arrays.remove(&request.array) {
                    for plane in entry.planes {
                        self.arrays.arrays.remove(&plane);
                    }
                }
                self.budget.release(charge(&desc, 1)?);
                return Ok(());
            }
            let entry = self.arrays.mipmaps.get(&request.array).ok_or(CudaError::INVALID_VALUE)?;
            self.device.mipmap_destroy(entry.mipmap)?;
            let entry = self.arrays.mipmaps.remove(&request.array).ok_or(CudaError::INVALID_VALUE)?;
            for level in entry.levels {
                self.arrays.arrays.remove(&level);
            }
            self.budget.release(entry.charged);
            Ok(())
        })();
        reply.send(result.map(|()| rep::ArrayDestroy {}));
    }

    pub(super) fn array_level(&mut self, request: req::MipmappedArrayLevel, reply: Responder<rep::MipmappedArrayLevel>) {
        let result = (|| {
            if request.array == 0 || self.arrays.arrays.contains_key(&request.array) || self.arrays.mipmaps.contains_key(&request.array) {
                return Err(CudaError::INVALID_VALUE);
            }
            let entry = self.arrays.mipmaps.get(&request.mipmap).ok_or(CudaError::INVALID_VALUE)?;
            let array = self.device.mipmap_level(entry.mipmap, request.level)?;
            let desc = entry.desc.level(request.level);
            let part_of = Some(PartOf::Level { mipmap: request.mipmap, level: request.level });
            self.arrays.arrays.insert(request.array, ArrayEntry { array, desc, part_of, planes: Vec::new() });
            if let Some(entry) = self.arrays.mipmaps.get_mut(&request.mipmap) {
                entry.levels.push(request.array);
            }
            Ok(())
        })();
        reply.send(result.map(|()| rep::MipmappedArrayLevel {}));
    }

    pub(super) fn new_texture(&mut self, request: req::TexObjectCreate, reply: Responder<rep::TexObjectCreate>) {
        let result = (|| {
            if self.arrays.objects.len() >= MAX_HANDLES {
                return Err(CudaError::INVALID_VALUE);
            }
            let resource = match request.resource {
                Resource::Array { array } => TexResource::Array(self.arrays.arrays.get(&array).ok_or(CudaError::INVALID_VALUE)?.array),
                Resource::Mipmapped { array } => {
                    TexResource::Mipmapped(self.arrays.mipmaps.get(&array).ok_or(CudaError::INVALID_VALUE)?.mipmap)
                }
                // The memory must be the session's; its extent may run past the allocation, as
                // the driver allows (NVIDIA's convolutionFFT2D declares its spectrum textures a
                // padding wider than the buffer): what a kernel fetches there is its own context's.
                Resource::Linear { ptr, size, .. } => {
                    self.ranges.check(ptr, 1)?;
                    size.checked_add(ptr).ok_or(CudaError::INVALID_VALUE)?;
                    TexResource::Memory(request.resource)
                }
                Resource::Pitch2d { ptr, pitch, height, .. } => {
                    self.ranges.check(ptr, 1)?;
                    pitch.checked_mul(height).and_then(|bytes| bytes.checked_add(ptr)).ok_or(CudaError::INVALID_VALUE)?;
                    TexResource::Memory(request.resource)
                }
            };
            let handle = self.device.tex_create(resource, &request.texture, request.view.as_ref())?;
            let object = Object::Texture { resource: request.resource, texture: request.texture, view: request.view };
            self.arrays.objects.insert(handle, object);
            Ok(rep::TexObjectCreate { handle })
        })();
        reply.send(result);
    }

    pub(super) fn new_surface(&mut self, request: req::SurfObjectCreate, reply: Responder<rep::SurfObjectCreate>) {
        let result = (|| {
            if self.arrays.objects.len() >= MAX_HANDLES {
                return Err(CudaError::INVALID_VALUE);
            }
            let array = self.arrays.arrays.get(&request.array).ok_or(CudaError::INVALID_VALUE)?.array;
            let handle = self.device.surf_create(array)?;
            self.arrays.objects.insert(handle, Object::Surface { array: request.array });
            Ok(rep::SurfObjectCreate { handle })
        })();
        reply.send(result);
    }

    pub(super) fn drop_object(&mut self, request: req::ObjectDestroy, reply: Responder<rep::ObjectDestroy>) {
        let result = match self.arrays.objects.get(&request.handle) {
            Some(object) if object.is_surface() == request.surface => {
                self.device.object_destroy(request.handle, request.surface).map(|()| {
                    self.arrays.objects.remove(&request.handle);
                })
            }
            _ => Err(CudaError::INVALID_VALUE),
        };
        reply.send(result.map(|()| rep::ObjectDestroy {}));
    }

    /// Whether `id` names a fresh array id: not 0 and not taken.
    fn fresh_array_id(&self, id: u64) -> bool {
        id != 0
            && !self.arrays.arrays.contains_key(&id)
            && !self.arrays.mipmaps.contains_key(&id)
            && self.arrays.arrays.len() + self.arrays.mipmaps.len() < MAX_HANDLES
    }

    pub(super) fn array_plane(&mut self, request: req::ArrayGetPlane, reply: Responder<rep::ArrayGetPlane>) {
        let result = (|| {
            if !self.fresh_array_id(request.plane_array) {
                return Err(CudaError::INVALID_VALUE);
            }
            // An array of the session's own (not a level or a plane) of a planar format.
            let entry = self.arrays.arrays.get(&request.array).filter(|entry| entry.part_of.is_none()).ok_or(CudaError::INVALID_VALUE)?;
            let planes = entry.desc.planes().ok_or(CudaError::INVALID_VALUE)?;
            if request.plane as usize >= planes.len() {
                return Err(CudaError::INVALID_VALUE);
            }
            let (array, desc) = self.device.array_plane(entry.array, &entry.desc, request.plane)?;
            if desc.extent().is_none() {
                // A plane of elements copies could not be checked against.
                return Err(CudaError::NOT_SUPPORTED);
            }
            let part_of = Some(PartOf::Plane { array: request.array, plane: request.plane });
            self.arrays.arrays.insert(request.plane_array, ArrayEntry { array, desc, part_of, planes: Vec::new() });
            if let Some(entry) = self.arrays.arrays.get_mut(&request.array) {
                entry.planes.push(request.plane_array);
            }
            Ok(rep::ArrayGetPlane { desc })
        })();
        reply.send(result);
    }

    /// An array of the session's own (not a level or a plane) or a mipmapped array, with its
    /// descriptor and level count (1 for an array).
    fn whole_array(&self, id: u64) -> CudaResult<(ArrayRef<D>, ArrayDesc, u32)> {
        if let Some(entry) = self.arrays.arrays.get(&id) {
            return match entry.part_of {
                None => Ok((ArrayRef::Array(entry.array), entry.desc, 1)),
                Some(_) => Err(CudaError::INVALID_VALUE),
            };
        }
        let entry = self.arrays.mipmaps.get(&id).ok_or(CudaError::INVALID_VALUE)?;
        Ok((ArrayRef::Mipmap(entry.mipmap), entry.desc, entry.count))
    }

    pub(super) fn array_sparse(&mut self, request: req::ArraySparseProperties, reply: Responder<rep::ArraySparseProperties>) {
        let result = self.whole_array(request.array).and_then(|(target, desc, levels)| {
            if desc.flags & array_flags::SPARSE == 0 {
                return Err(CudaError::INVALID_VALUE);
            }
            self.device.sparse_properties(target, &desc, levels)
        });
        reply.send(result.map(|properties| rep::ArraySparseProperties { properties }));
    }

    pub(super) fn array_requirements(&mut self, request: req::ArrayMemoryRequirements, reply: Responder<rep::ArrayMemoryRequirements>) {
        let result = self.whole_array(request.array).and_then(|(target, desc, levels)| {
            if desc.flags & array_flags::DEFERRED_MAPPING == 0 {
                return Err(CudaError::INVALID_VALUE);
            }
            self.device.memory_requirements(target, &desc, levels)
        });
        reply.send(result.map(|(size, alignment)| rep::ArrayMemoryRequirements { size, alignment }));
    }

    /// Checks one `cuMemMapArrayAsync` entry and resolves its ids: a sparse array's tiles or mip
    /// tail, or a deferred-mapping array whole, onto a tile pool of the session's inside its
    /// size, for the session's device only.
    fn array_map_work(&self, map: &ArrayMap) -> CudaResult<ArrayMapWork<D>> {
        let (target, desc, levels) = self.whole_array(map.array)?;
        if map.mipmapped != matches!(target, ArrayRef::Mipmap(_)) || map.device_mask != 1 {
            return Err(CudaError::INVALID_VALUE);
        }
        let deferred = desc.flags & array_flags::DEFERRED_MAPPING != 0;
        let (bytes, alignment) = if deferred {
            if map.subresource != Subresource::Whole {
                return Err(CudaError::INVALID_VALUE);
            }
            self.device.memory_requirements(target, &desc, levels)?
        } else if desc.flags & array_flags::SPARSE != 0 {
            let properties = self.device.sparse_properties(target, &desc, levels)?;
            (subresource_bytes(&desc, levels, &properties, &map.subresource)?, SPARSE_TILE_BYTES)
        } else {
            return Err(CudaError::INVALID_VALUE);
        };
        let memory = match map.memory {
            Some((id, offset)) => {
                let (handle, size) = self.vmm.tile_pool(id).ok_or(CudaError::INVALID_VALUE)?;
                let within = offset.checked_add(bytes).is_some_and(|end| end <= size);
                if !within || alignment == 0 || !offset.is_multiple_of(alignment) {
                    return Err(CudaError::INVALID_VALUE);
                }
                Some((handle, offset))
            }
            None => None,
        };
        Ok(ArrayMapWork { target, subresource: map.subresource, memory })
    }

    pub(super) fn map_arrays(&mut self, request: req::MemMapArray, reply: Responder<rep::MemMapArray>) {
        let result = (|| {
            if request.maps.is_empty() || request.maps.len() > MAX_BATCH {
                return Err(CudaError::INVALID_VALUE);
            }
            let work = request.maps.iter().map(|map| self.array_map_work(map)).collect::<CudaResult<Vec<_>>>()?;
            let stream = self.stream(request.stream)?;
            self.device.map_arrays(&work, stream)
        })();
        reply.send(result.map(|()| rep::MemMapArray {}));
    }

    /// Checks one decompression: every buffer in the session's memory, a known algorithm.
    fn check_decompress(&self, op: &DecompressOp) -> CudaResult<()> {
        use decompress_algorithm::{DEFLATE, LZ4, SNAPPY};
        if op.src_len == 0 || !matches!(op.algo, DEFLATE | SNAPPY | LZ4) || !op.dst_act_bytes.is_multiple_of(4) {
            return Err(CudaError::INVALID_VALUE);
        }
        self.ranges.check(op.src, op.src_len)?;
        // The destination's size is a hint the app may leave out; its first byte at least is
        // the session's (a kernel could write as far, too).
        self.ranges.check(op.dst, op.dst_len.max(1))?;
        self.ranges.check(op.dst_act_bytes, 4)
    }

    pub(super) fn decompress(&mut self, request: req::MemBatchDecompress, reply: Responder<rep::MemBatchDecompress>) {
        let result = (|| {
            if request.ops.is_empty() || request.ops.len() > MAX_BATCH {
                return Err(CudaError::INVALID_VALUE);
            }
            request.ops.iter().try_for_each(|op| self.check_decompress(op))?;
            let stream = self.stream(request.stream)?;
            Ok(match self.device.batch_decompress(&request.ops, stream) {
                Ok(()) => rep::MemBatchDecompress { error: None, error_index: None },
                Err((error, index)) => rep::MemBatchDecompress { error: Some(error), error_index: index },
            })
        })();
        if result.as_ref().is_ok_and(|reply| reply.error.is_none()) {
            self.queued(request.stream, crate::activity::Work::Copies);
        }
        reply.send(result);
    }
}
