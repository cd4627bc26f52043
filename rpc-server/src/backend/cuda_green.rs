//! The CUDA backend's green contexts: SM resources, their splits and descriptors, green contexts
//! and their streams and events. The entry points are looked up by name when the device opens and
//! called through pointers with `CUdevResource` as the bytes cuda.h 13.0 lays out, so a driver
//! without them (older than CUDA 12.4) answers "not supported" instead of failing to load.

use std::ffi::{c_int, c_uint};

use cudarc::driver::sys;
use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{DevResource, dev_resource};

use super::SmSplit;
use super::cuda::{CudaDevice, Handle, check, raw_check};

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

type GetResource<H> = unsafe extern "C" fn(H, *mut RawResource, c_uint) -> u32;

/// The green context entry points (CUDA 12.4 and later); `None` for each the driver lacks.
#[derive(Default)]
pub struct RawGreen {
    ctx_get_resource: Option<GetResource<sys::CUcontext>>,
    green_get_resource: Option<GetResource<sys::CUgreenCtx>>,
    split: Option<unsafe extern "C" fn(*mut RawResource, *mut c_uint, *const RawResource, *mut RawResource, c_uint, c_uint) -> u32>,
    generate_desc: Option<unsafe extern "C" fn(*mut sys::CUdevResourceDesc, *mut RawResource, c_uint) -> u32>,
    create: Option<unsafe extern "C" fn(*mut sys::CUgreenCtx, sys::CUdevResourceDesc, sys::CUdevice, c_uint) -> u32>,
    destroy: Option<unsafe extern "C" fn(sys::CUgreenCtx) -> u32>,
    to_context: Option<unsafe extern "C" fn(*mut sys::CUcontext, sys::CUgreenCtx) -> u32>,
    stream_create: Option<unsafe extern "C" fn(*mut sys::CUstream, sys::CUgreenCtx, c_uint, c_int) -> u32>,
    record_event: Option<unsafe extern "C" fn(sys::CUgreenCtx, sys::CUevent) -> u32>,
    wait_event: Option<unsafe extern "C" fn(sys::CUgreenCtx, sys::CUevent) -> u32>,
}

impl RawGreen {
    pub fn load() -> Self {
        // SAFETY: the driver library was loaded and probed before (`CudaDevice::open`); each
        // symbol gets its documented C signature, with enums and `CUresult` as `unsigned` and
        // `CUdevResource` as `RawResource`, which has its size and alignment.
        unsafe {
            let lib = sys::culib();
            Self {
                ctx_get_resource: optional_symbol!(lib, "cuCtxGetDevResource"),
                green_get_resource: optional_symbol!(lib, "cuGreenCtxGetDevResource"),
                split: optional_symbol!(lib, "cuDevSmResourceSplitByCount"),
                generate_desc: optional_symbol!(lib, "cuDevResourceGenerateDesc"),
                create: optional_symbol!(lib, "cuGreenCtxCreate"),
                destroy: optional_symbol!(lib, "cuGreenCtxDestroy"),
                to_context: optional_symbol!(lib, "cuCtxFromGreenCtx"),
                stream_create: optional_symbol!(lib, "cuGreenCtxStreamCreate"),
                record_event: optional_symbol!(lib, "cuGreenCtxRecordEvent"),
                wait_event: optional_symbol!(lib, "cuGreenCtxWaitEvent"),
            }
        }
    }
}

/// An entry point, or "not supported" from a driver without it.
fn entry<F>(entry: Option<F>) -> CudaResult<F> {
    entry.ok_or(CudaError::NOT_SUPPORTED)
}

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
                None => entry(self.green.ctx_get_resource)?(self.primary_context(), &mut resource, kind),
                Some(green) => entry(self.green.green_get_resource)?(green.0.0, &mut resource, kind),
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
        let split = entry(self.green.split)?;
        let mut count = groups.unwrap_or(0);
        let mut made = vec![RawResource::ZERO; groups.unwrap_or(0) as usize];
        let mut remaining = RawResource::ZERO;
        let result = if groups.is_some() { made.as_mut_ptr() } else { std::ptr::null_mut() };
        // SAFETY: `result` is NULL (counting only) or an array of `count` resources; `input` is a
        // resource this driver wrote (the session checked), `remaining` a valid out-pointer.
        raw_check(unsafe { split(result, &mut count, input, &mut remaining, flags, min_count) })?;
        made.truncate(if groups.is_some() { count as usize } else { 0 });
        Ok(SmSplit { groups: made, count, remaining })
    }

    pub(super) fn describe_resources(&self, resources: &[RawResource]) -> CudaResult<sys::CUdevResourceDesc> {
        let generate = entry(self.green.generate_desc)?;
        let mut resources = resources.to_vec();
        let count = c_uint::try_from(resources.len()).map_err(|_| CudaError::INVALID_VALUE)?;
        let mut desc = std::ptr::null_mut();
        // SAFETY: an array of `count` resources this driver wrote; a valid out-pointer.
        raw_check(unsafe { generate(&mut desc, resources.as_mut_ptr(), count) })?;
        Ok(desc)
    }

    pub(super) fn new_green(&self, desc: sys::CUdevResourceDesc, flags: u32) -> CudaResult<GreenHandle> {
        let (create, to_context, destroy) = (entry(self.green.create)?, entry(self.green.to_context)?, entry(self.green.destroy)?);
        let mut green = std::ptr::null_mut();
        // SAFETY: a descriptor this driver made for the session; a valid out-pointer.
        raw_check(unsafe { create(&mut green, desc, self.device(), flags) })?;
        let mut context = std::ptr::null_mut();
        // SAFETY: the green context just made; a valid out-pointer.
        if let Err(error) = raw_check(unsafe { to_context(&mut context, green) }) {
            // SAFETY: made above and named nowhere else.
            unsafe { destroy(green) };
            return Err(error);
        }
        Ok(Handle::new((green, context)))
    }

    pub(super) fn new_green_stream(&self, green: GreenHandle, flags: u32, priority: i32) -> CudaResult<Handle<sys::CUstream>> {
        let (green, context) = green.0;
        let mut stream = std::ptr::null_mut();
        if flags & NON_BLOCKING != 0 {
            let create = entry(self.green.stream_create)?;
            // SAFETY: a green context of the session; a valid out-pointer.
            raw_check(unsafe { create(&mut stream, green, flags, priority) })?;
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
        let call = if wait { entry(self.green.wait_event)? } else { entry(self.green.record_event)? };
        // SAFETY: a green context and an event of the session.
        raw_check(unsafe { call(green.0.0, event) })
    }

    pub(super) fn drop_green(&self, green: GreenHandle) -> CudaResult<()> {
        let destroy = entry(self.green.destroy)?;
        // SAFETY: a green context of the session, whose streams the session destroyed first;
        // the session forgets it.
        raw_check(unsafe { destroy(green.0.0) })
    }
}
