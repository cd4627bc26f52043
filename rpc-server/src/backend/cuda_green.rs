//! The CUDA backend's green contexts: SM resources, their splits and descriptors, green contexts
//! and their streams and events. The entry points come from the generated driver table
//! (`flyt-cuda-sys`), `CUdevResource` as the bytes cuda.h 13.0 lays out, so a driver without them
//! (older than CUDA 12.4) answers "not supported" instead of failing to load.

use std::ffi::c_uint;

use cudarc::driver::sys;
use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{DevResource, dev_resource};

use super::SmSplit;
use super::cuda::{CudaDevice, Handle, check, driver_table, entry, raw_check};

/// `CUdevResource` of cuda.h 13.0 (`CUdevResource_v1`): the type, 92 bytes the driver keeps for
/// itself, and a 48-byte union whose first three words are `CUdevSmResource` (`smCount`,
/// `minSmPartitionSize`, `smCoscheduledAlignment`). The session hands it back to the driver only
/// as the driver wrote it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RawResource {
    kind: c_uint,
    internal: [u8; 92],
    union: [c_uint; 12],
}

const _: () = assert!(size_of::<RawResource>() == 144 && align_of::<RawResource>() == align_of::<sys::CUdevResource>());
const _: () = assert!(size_of::<RawResource>() == size_of::<sys::CUdevResource>());

impl RawResource {
    const ZERO: Self = Self { kind: dev_resource::INVALID, internal: [0; 92], union: [0; 12] };
}

/// A green context and the context `cuCtxFromGreenCtx` made of it (pushed to make streams in it).
pub type GreenHandle = Handle<(sys::CUgreenCtx, sys::CUcontext)>;

/// `CU_STREAM_NON_BLOCKING`: the flag `cuGreenCtxStreamCreate` requires.
const NON_BLOCKING: c_uint = 0x1;

pub fn resource_facts(resource: &RawResource) -> DevResource {
    let [sm_count, min_partition_size, coscheduled_alignment, ..] = resource.union;
    DevResource { id: 0, kind: resource.kind, sm_count, min_partition_size, coscheduled_alignment }
}

impl CudaDevice {
    pub(super) fn green_resource(&self, green: Option<GreenHandle>, kind: u32) -> CudaResult<RawResource> {
        let mut resource = RawResource::ZERO;
        // SAFETY: a valid out-pointer of `CUdevResource`'s size; the context is the worker's
        // primary context (retained for its life) or a green context of the session's.
        raw_check(unsafe {
            match green {
                None => entry(driver_table().cuCtxGetDevResource)?(self.primary_context().cast(), (&raw mut resource).cast(), kind).0,
                Some(green) => entry(driver_table().cuGreenCtxGetDevResource)?(green.0.0.cast(), (&raw mut resource).cast(), kind).0,
            }
        })?;
        Ok(resource)
    }

    pub(super) fn split_resource(
        &self,
        input: &RawResource,
        groups: Option<u32>,
        flags: u32,
        min_count: u32,
    ) -> CudaResult<SmSplit<CudaDevice>> {
        let split = entry(driver_table().cuDevSmResourceSplitByCount)?;
        let mut count = groups.unwrap_or(0);
        let mut made = vec![RawResource::ZERO; groups.unwrap_or(0) as usize];
        let mut remaining = RawResource::ZERO;
        let result = if groups.is_some() { made.as_mut_ptr() } else { std::ptr::null_mut() };
        let (input, remaining_ptr) = ((input as *const RawResource).cast(), (&raw mut remaining).cast());
        // SAFETY: `result` is NULL (counting only) or an array of `count` resources; `input` is a
        // resource this driver wrote (the session checked), `remaining` a valid out-pointer.
        let code = unsafe { split(result.cast(), &mut count, input, remaining_ptr, flags, min_count) };
        raw_check(code.0)?;
        made.truncate(if groups.is_some() { count as usize } else { 0 });
        Ok(SmSplit { groups: made, count, remaining })
    }

    pub(super) fn describe_resources(&self, resources: &[RawResource]) -> CudaResult<sys::CUdevResourceDesc> {
        let generate = entry(driver_table().cuDevResourceGenerateDesc)?;
        let mut resources = resources.to_vec();
        let count = c_uint::try_from(resources.len()).map_err(|_| CudaError::INVALID_VALUE)?;
        let mut desc: sys::CUdevResourceDesc = std::ptr::null_mut();
        // SAFETY: an array of `count` resources this driver wrote; a valid out-pointer.
        raw_check(unsafe { generate((&raw mut desc).cast(), resources.as_mut_ptr().cast(), count) }.0)?;
        Ok(desc)
    }

    pub(super) fn new_green(&self, desc: sys::CUdevResourceDesc, flags: u32) -> CudaResult<GreenHandle> {
        let table = driver_table();
        let (create, to_context, destroy) =
            (entry(table.cuGreenCtxCreate)?, entry(table.cuCtxFromGreenCtx)?, entry(table.cuGreenCtxDestroy)?);
        let mut green: sys::CUgreenCtx = std::ptr::null_mut();
        // SAFETY: a descriptor this driver made for the session; a valid out-pointer.
        raw_check(unsafe { create((&raw mut green).cast(), desc.cast(), self.device(), flags) }.0)?;
        let mut context: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the green context just made; a valid out-pointer.
        if let Err(error) = raw_check(unsafe { to_context((&raw mut context).cast(), green.cast()) }.0) {
            // SAFETY: made above and named nowhere else.
            unsafe { destroy(green.cast()) };
            return Err(error);
        }
        Ok(Handle::new((green, context)))
    }

    pub(super) fn new_green_stream(&self, green: GreenHandle, flags: u32, priority: i32) -> CudaResult<Handle<sys::CUstream>> {
        let (green, context) = green.0;
        let mut stream: sys::CUstream = std::ptr::null_mut();
        if flags & NON_BLOCKING != 0 {
            let create = entry(driver_table().cuGreenCtxStreamCreate)?;
            // SAFETY: a green context of the session; a valid out-pointer.
            raw_check(unsafe { create((&raw mut stream).cast(), green.cast(), flags, priority) }.0)?;
            return Ok(Handle::new(stream));
        }
        // A blocking stream is made as `cuStreamCreate` makes one in the green context: with it
        // current, for the call only (the session's thread keeps its primary context current).
        // SAFETY: the context `cuCtxFromGreenCtx` gave for a live green context of the session.
        check(unsafe { sys::cuCtxPushCurrent_v2(context).result() })?;
        // SAFETY: a valid out-pointer; the flags and priority are the app's, checked by the driver.
        let created = check(unsafe { sys::cuStreamCreateWithPriority(&mut stream, flags, priority).result() });
        let mut popped = std::ptr::null_mut();
        // SAFETY: pops the context pushed above, leaving the primary context current again.
        let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
        created.map(|()| Handle::new(stream))
    }

    pub(super) fn green_event_op(&self, green: GreenHandle, event: sys::CUevent, wait: bool) -> CudaResult<()> {
        let table = driver_table();
        let call = if wait { entry(table.cuGreenCtxWaitEvent)? } else { entry(table.cuGreenCtxRecordEvent)? };
        // SAFETY: a green context and an event of the session.
        raw_check(unsafe { call(green.0.0.cast(), event.cast()) }.0)
    }

    pub(super) fn drop_green(&self, green: GreenHandle) -> CudaResult<()> {
        let destroy = entry(driver_table().cuGreenCtxDestroy)?;
        // SAFETY: a green context of the session, whose streams the session destroyed first;
        // the session forgets it.
        raw_check(unsafe { destroy(green.0.0.cast()) }.0)
    }
}
