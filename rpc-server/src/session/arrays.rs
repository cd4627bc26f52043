//! Pitched memory, shaped copies (2D, 3D, to and from arrays), arrays, mipmapped arrays,
//! texture and surface objects for a session. Array ids are the client's; every copy's box is
//! checked against the session's ranges or the array's extent before it reaches the device, and
//! arrays count in the quota from creation to destruction.
//!
//! A session moves with its arrays (their bytes in the snapshot) and its texture and surface
//! objects. Kernels take those objects by the driver's handle, which the app holds, so each is
//! made again under the same handle: in handle order, the driver's lower handles taken by
//! fillers until it gives the one wanted (a restore fails if it has passed it).

use std::collections::HashMap;
use std::io::{Read, Write};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{ArrayDesc, CopySide, Pos3, Resource, ShapedCopy, TextureDesc, ViewDesc, rep, req};
use serde::{Deserialize, Serialize};

use super::{BulkIn, MAX_HANDLES, Responder, Session, chunk_len};
use crate::backend::{Device, Extent, Side, TexResource};
use crate::memory::RangeKind;

/// An array the session named: its own, or a level of one of its mipmapped arrays.
struct ArrayEntry<D: Device> {
    array: D::Array,
    desc: ArrayDesc,
    /// The mipmapped array and level it is (it goes with that one).
    level_of: Option<(u64, u32)>,
}

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
/// array whole, then each mipmapped array level by level.
#[derive(Serialize, Deserialize)]
pub(super) struct ArraysState {
    /// Id and descriptor.
    arrays: Vec<(u64, ArrayDesc)>,
    mipmaps: Vec<MipmapState>,
    /// By handle, ascending.
    objects: Vec<(u64, Object)>,
}

impl<D: Device> Default for ArrayTable<D> {
    fn default() -> Self {
        Self { arrays: HashMap::new(), mipmaps: HashMap::new(), objects: HashMap::new() }
    }
}

impl<D: Device> ArrayTable<D> {
    pub(super) fn state(&self) -> ArraysState {
        let mut arrays: Vec<_> =
            self.arrays.iter().filter(|(_, entry)| entry.level_of.is_none()).map(|(id, entry)| (*id, entry.desc)).collect();
        arrays.sort_unstable_by_key(|(id, _)| *id);
        let mut mipmaps: Vec<_> = self
            .mipmaps
            .iter()
            .map(|(id, entry)| {
                let levels = entry.levels.iter().filter_map(|level| Some((*level, self.arrays.get(level)?.level_of?.1))).collect();
                (*id, entry.desc, entry.count, levels)
            })
            .collect();
        mipmaps.sort_unstable_by_key(|(id, ..)| *id);
        let mut objects: Vec<_> = self.objects.iter().map(|(handle, object)| (*handle, object.clone())).collect();
        objects.sort_unstable_by_key(|(handle, _)| *handle);
        ArraysState { arrays, mipmaps, objects }
    }

    /// Every array of the session with the descriptor of its bytes, in snapshot file order.
    fn in_file_order(&self, state: &ArraysState, device: &D) -> CudaResult<Vec<(D::Array, ArrayDesc)>> {
        let mut out = Vec::new();
        for (id, desc) in &state.arrays {
            out.push((self.arrays.get(id).ok_or(CudaError::INVALID_VALUE)?.array, *desc));
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
            table.arrays.insert(*id, ArrayEntry { array, desc: *desc, level_of: None });
        }
        for (id, desc, count, levels) in &state.mipmaps {
            let mipmap = device.mipmap_create(desc, *count).map_err(|error| format!("mipmapped array {id}: {error}"))?;
            let charged = array_bytes(desc, *count).map_err(|error| format!("mipmapped array {id}: {error}"))?;
            let mut named = Vec::new();
            for &(level_id, level) in levels {
                let array = device.mipmap_level(mipmap, level).map_err(|error| format!("level {level} of array {id}: {error}"))?;
                table.arrays.insert(level_id, ArrayEntry { array, desc: desc.level(level), level_of: Some((*id, level)) });
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
    let arrays = state.arrays.iter().map(|(_, desc)| array_bytes(desc, 1).unwrap_or(0));
    let mipmaps = state.mipmaps.iter().map(|(_, desc, count, _)| array_bytes(desc, *count).unwrap_or(0));
    arrays.chain(mipmaps).sum()
}

/// The bytes an array (all its levels) is charged: its elements, packed.
fn array_bytes(desc: &ArrayDesc, levels: u32) -> CudaResult<u64> {
    (0..levels.max(1)).try_fold(0u64, |total, level| {
        let (width, height, depth) = desc.level(level).extent().ok_or(CudaError::INVALID_VALUE)?;
        width
            .checked_mul(height)
            .and_then(|bytes| bytes.checked_mul(depth))
            .and_then(|bytes| total.checked_add(bytes))
            .ok_or(CudaError::INVALID_VALUE)
    })
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
            if entry.level_of.is_none() {
                if let Ok(bytes) = array_bytes(&entry.desc, 1) {
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
                // Block-compressed, NV12 and the newer packed formats are not served.
                None if matches!(desc.channels, 1 | 2 | 4) => return Err(CudaError::NOT_SUPPORTED),
                None => return Err(CudaError::INVALID_VALUE),
            }
            let levels = request.levels.unwrap_or(1);
            let bytes = array_bytes(&desc, levels)?;
            if !self.budget.try_reserve(bytes) {
                return Err(CudaError::MEMORY_ALLOCATION);
            }
            let made = match request.levels {
                None => self.device.array_create(&desc).map(|array| {
                    self.arrays.arrays.insert(request.array, ArrayEntry { array, desc, level_of: None });
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
                if entry.level_of.is_some() {
                    // A level goes with its mipmapped array.
                    return Err(CudaError::INVALID_VALUE);
                }
                let (array, desc) = (entry.array, entry.desc);
                self.device.array_destroy(array)?;
                self.arrays.arrays.remove(&request.array);
                self.budget.release(array_bytes(&desc, 1)?);
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
            self.arrays.arrays.insert(request.array, ArrayEntry { array, desc, level_of: Some((request.mipmap, request.level)) });
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
                Resource::Linear { ptr, size, .. } => {
                    self.ranges.check(ptr, size)?;
                    TexResource::Memory(request.resource)
                }
                Resource::Pitch2d { ptr, pitch, height, .. } => {
                    self.ranges.check(ptr, pitch.checked_mul(height).ok_or(CudaError::INVALID_VALUE)?)?;
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
}
