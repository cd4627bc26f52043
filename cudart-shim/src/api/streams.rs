//! Streams and events, through the driver: its handles are ids Flyt chooses, so creating one
//! costs no round trip. What stays here is the runtime's: flag checks with the runtime's errors,
//! and events whose last record failed. Stream capture is the driver's (see `graph`).

use std::collections::HashSet;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;

use crate::driver::cu_ctx;
use crate::ffi::{cudaEvent_t, cudaStream_t, write_out};

/// `cudaStreamNonBlocking` is the only stream flag.
const STREAM_FLAGS: c_uint = 0x1;
/// `cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess`.
const EVENT_FLAGS: c_uint = 0x7;
const EVENT_DISABLE_TIMING: c_uint = 0x2;
const EVENT_INTERPROCESS: c_uint = 0x4;
/// `cudaEventRecordExternal` (record) and `cudaEventWaitExternal` (wait): they change only what
/// stream capture puts in a graph; the driver takes them as they are.
const EXTERNAL: c_uint = 0x1;
/// `cudaStreamLegacy` and `cudaStreamPerThread`.
const STREAM_LEGACY: usize = 1;
const STREAM_PER_THREAD: usize = 2;

/// Whether the driver knows `stream` (a default stream, or one the app created and holds).
pub(crate) fn is_stream(stream: cudaStream_t) -> bool {
    let mut flags = 0;
    cu_ctx!(cuStreamGetFlags(stream.cast(), &mut flags)).is_ok()
}

/// Events whose last record failed: they hold no time the app asked for, so timings that use them
/// fail until a record succeeds, instead of measuring something else.
static FAILED_RECORDS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);
static ANY_FAILED_RECORD: AtomicBool = AtomicBool::new(false);

fn note_record(event: cudaEvent_t, failed: bool) {
    if !failed && !ANY_FAILED_RECORD.load(Ordering::Acquire) {
        return;
    }
    let mut records = FAILED_RECORDS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let records = records.get_or_insert_with(HashSet::new);
    if failed {
        records.insert(event as usize);
    } else {
        records.remove(&(event as usize));
    }
    ANY_FAILED_RECORD.store(!records.is_empty(), Ordering::Release);
}

fn record_failed(event: cudaEvent_t) -> bool {
    ANY_FAILED_RECORD.load(Ordering::Acquire)
        && FAILED_RECORDS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).as_ref().is_some_and(|r| r.contains(&(event as usize)))
}

pub unsafe fn cudaDeviceGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) -> CudaResult<()> {
    // Either pointer may be NULL, as in CUDA.
    cu_ctx!(cuCtxGetStreamPriorityRange(least, greatest))
}

fn create_stream(out: *mut cudaStream_t, flags: c_uint, priority: c_int) -> CudaResult<()> {
    if out.is_null() || flags & !STREAM_FLAGS != 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    // The driver clamps a priority outside the device's range to the range, as CUDA does.
    let mut stream: cudaStream_t = std::ptr::null_mut();
    cu_ctx!(cuStreamCreateWithPriority(std::ptr::from_mut(&mut stream).cast(), flags, priority))?;
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(out, stream) }
}

pub unsafe fn cudaStreamCreate(stream: *mut cudaStream_t) -> CudaResult<()> {
    create_stream(stream, 0, 0)
}

pub unsafe fn cudaStreamCreateWithFlags(stream: *mut cudaStream_t, flags: c_uint) -> CudaResult<()> {
    create_stream(stream, flags, 0)
}

pub unsafe fn cudaStreamCreateWithPriority(stream: *mut cudaStream_t, flags: c_uint, priority: c_int) -> CudaResult<()> {
    create_stream(stream, flags, priority)
}

pub unsafe fn cudaStreamDestroy(stream: cudaStream_t) -> CudaResult<()> {
    // The default streams are not the app's to destroy.
    if matches!(stream as usize, 0 | STREAM_LEGACY | STREAM_PER_THREAD) {
        return Err(CudaError::INVALID_RESOURCE_HANDLE);
    }
    cu_ctx!(cuStreamDestroy_v2(stream.cast()))
}

per_thread_twins! {
    cudaStreamSynchronize, cudaStreamSynchronize_ptsz (stream: cudaStream_t)
        => cuStreamSynchronize, cuStreamSynchronize_ptsz (stream.cast())
}

per_thread_twins! {
    cudaStreamQuery, cudaStreamQuery_ptsz (stream: cudaStream_t)
        => cuStreamQuery, cuStreamQuery_ptsz (stream.cast())
}

fn wait_event(stream: cudaStream_t, event: cudaEvent_t, flags: c_uint, per_thread_default: bool) -> CudaResult<()> {
    if flags & !EXTERNAL != 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    if per_thread_default {
        cu_ctx!(cuStreamWaitEvent_ptsz(stream.cast(), event.cast(), flags))
    } else {
        cu_ctx!(cuStreamWaitEvent(stream.cast(), event.cast(), flags))
    }
}

pub unsafe fn cudaStreamWaitEvent(stream: cudaStream_t, event: cudaEvent_t, flags: c_uint) -> CudaResult<()> {
    wait_event(stream, event, flags, false)
}

pub unsafe fn cudaStreamWaitEvent_ptsz(stream: cudaStream_t, event: cudaEvent_t, flags: c_uint) -> CudaResult<()> {
    wait_event(stream, event, flags, true)
}

/// The stream queries: the driver answers (the null handle of a `_ptsz` form is the thread's
/// default stream, a blocking stream without priority).
macro_rules! stream_queries {
    ($($name:ident($out:ident: *mut $ty:ty) => $driver:ident;)*) => {$(
        pub unsafe fn $name(stream: cudaStream_t, $out: *mut $ty) -> CudaResult<()> {
            let mut value: $ty = 0;
            cu_ctx!($driver(stream.cast(), &mut value))?;
            // SAFETY: the app's out-pointer.
            unsafe { write_out($out, value) }
        }
    )*};
}

stream_queries! {
    cudaStreamGetFlags(flags: *mut c_uint) => cuStreamGetFlags;
    cudaStreamGetFlags_ptsz(flags: *mut c_uint) => cuStreamGetFlags_ptsz;
    cudaStreamGetPriority(priority: *mut c_int) => cuStreamGetPriority;
    cudaStreamGetPriority_ptsz(priority: *mut c_int) => cuStreamGetPriority_ptsz;
}

/// Stream attributes: the runtime's ids and 64-byte values are the driver's own.
macro_rules! stream_attributes {
    ($($set:ident, $get:ident, $copy:ident => $set_driver:ident, $get_driver:ident, $copy_driver:ident;)*) => {$(
        pub unsafe fn $set(stream: cudaStream_t, attribute: c_uint, value: *const c_void) -> CudaResult<()> {
            cu_ctx!($set_driver(stream.cast(), attribute, value.cast()))
        }

        pub unsafe fn $get(stream: cudaStream_t, attribute: c_uint, value: *mut c_void) -> CudaResult<()> {
            cu_ctx!($get_driver(stream.cast(), attribute, value.cast()))
        }

        pub unsafe fn $copy(dst: cudaStream_t, src: cudaStream_t) -> CudaResult<()> {
            cu_ctx!($copy_driver(dst.cast(), src.cast()))
        }
    )*};
}

stream_attributes! {
    cudaStreamSetAttribute, cudaStreamGetAttribute, cudaStreamCopyAttributes
        => cuStreamSetAttribute, cuStreamGetAttribute, cuStreamCopyAttributes;
    cudaStreamSetAttribute_ptsz, cudaStreamGetAttribute_ptsz, cudaStreamCopyAttributes_ptsz
        => cuStreamSetAttribute_ptsz, cuStreamGetAttribute_ptsz, cuStreamCopyAttributes_ptsz;
}

// --- CUDA IPC: the driver's handles (the runtime's handle types are the same 64 bytes) ---

pub unsafe fn cudaIpcGetMemHandle(handle: *mut crate::driver::CUipcMemHandle, dev_ptr: *mut c_void) -> CudaResult<()> {
    cu_ctx!(cuIpcGetMemHandle(handle.cast(), dev_ptr as u64))
}

pub unsafe fn cudaIpcOpenMemHandle(dev_ptr: *mut *mut c_void, handle: crate::driver::CUipcMemHandle, flags: c_uint) -> CudaResult<()> {
    if dev_ptr.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    let mut ptr = 0u64;
    cu_ctx!(cuIpcOpenMemHandle_v2(&mut ptr, handle, flags))?;
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(dev_ptr, ptr as usize as *mut c_void) }
}

driver_forwards! {
    cudaIpcCloseMemHandle(dev_ptr: *mut c_void) => cuIpcCloseMemHandle(dev_ptr as u64);
    cudaIpcGetEventHandle(handle: *mut crate::driver::CUipcEventHandle, event: cudaEvent_t) => cuIpcGetEventHandle(handle, event.cast());
    cudaIpcOpenEventHandle(event: *mut cudaEvent_t, handle: crate::driver::CUipcEventHandle) => cuIpcOpenEventHandle(event.cast(), handle);
}

fn create_event(out: *mut cudaEvent_t, flags: c_uint) -> CudaResult<()> {
    if out.is_null() || flags & !EVENT_FLAGS != 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    // CUDA: an interprocess event must be created with cudaEventDisableTiming.
    if flags & EVENT_INTERPROCESS != 0 && flags & EVENT_DISABLE_TIMING == 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    let mut event: cudaEvent_t = std::ptr::null_mut();
    cu_ctx!(cuEventCreate(std::ptr::from_mut(&mut event).cast(), flags))?;
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(out, event) }
}

pub unsafe fn cudaEventCreate(event: *mut cudaEvent_t) -> CudaResult<()> {
    create_event(event, 0)
}

pub unsafe fn cudaEventCreateWithFlags(event: *mut cudaEvent_t, flags: c_uint) -> CudaResult<()> {
    create_event(event, flags)
}

fn record(event: cudaEvent_t, stream: cudaStream_t, flags: c_uint, per_thread_default: bool) -> CudaResult<()> {
    let recorded = if flags & !EXTERNAL != 0 {
        Err(CudaError::INVALID_VALUE)
    } else {
        if per_thread_default {
            cu_ctx!(cuEventRecordWithFlags_ptsz(event.cast(), stream.cast(), flags))
        } else {
            cu_ctx!(cuEventRecordWithFlags(event.cast(), stream.cast(), flags))
        }
    };
    // An unknown event is no event: nothing to remember of it.
    if recorded != Err(CudaError::INVALID_RESOURCE_HANDLE) || is_event(event) {
        note_record(event, recorded.is_err());
    }
    recorded
}

/// Whether the driver knows `event`.
fn is_event(event: cudaEvent_t) -> bool {
    !matches!(cu_ctx!(cuEventQuery(event.cast())), Err(CudaError::INVALID_RESOURCE_HANDLE))
}

pub unsafe fn cudaEventRecord(event: cudaEvent_t, stream: cudaStream_t) -> CudaResult<()> {
    record(event, stream, 0, false)
}

pub unsafe fn cudaEventRecord_ptsz(event: cudaEvent_t, stream: cudaStream_t) -> CudaResult<()> {
    record(event, stream, 0, true)
}

pub unsafe fn cudaEventRecordWithFlags(event: cudaEvent_t, stream: cudaStream_t, flags: c_uint) -> CudaResult<()> {
    record(event, stream, flags, false)
}

pub unsafe fn cudaEventRecordWithFlags_ptsz(event: cudaEvent_t, stream: cudaStream_t, flags: c_uint) -> CudaResult<()> {
    record(event, stream, flags, true)
}

driver_forwards! {
    cudaEventSynchronize(event: cudaEvent_t) => cuEventSynchronize(event.cast());
    cudaEventQuery(event: cudaEvent_t) => cuEventQuery(event.cast());
}

pub unsafe fn cudaEventElapsedTime(ms: *mut f32, start: cudaEvent_t, end: cudaEvent_t) -> CudaResult<()> {
    if ms.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    if record_failed(start) || record_failed(end) {
        return Err(CudaError::INVALID_RESOURCE_HANDLE);
    }
    let mut value = 0.0f32;
    cu_ctx!(cuEventElapsedTime_v2(&mut value, start.cast(), end.cast()))?;
    // SAFETY: checked non-NULL; the app's out-pointer.
    unsafe { write_out(ms, value) }
}

pub unsafe fn cudaEventDestroy(event: cudaEvent_t) -> CudaResult<()> {
    cu_ctx!(cuEventDestroy_v2(event.cast()))?;
    note_record(event, false);
    Ok(())
}

/// Forgets what this front remembers of streams and events (`cudaDeviceReset` destroyed them).
pub(crate) fn forget_all() {
    let mut records = FAILED_RECORDS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    *records = None;
    ANY_FAILED_RECORD.store(false, Ordering::Release);
}
