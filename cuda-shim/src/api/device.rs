//! Device queries, answered from what the device source reported at `cuInit` (no round trip).

use std::ffi::{CStr, c_char, c_int, c_uint};

use flyt_protocol::device::{DeviceInfo, attr};

use crate::CUresult;
use crate::driver::driver;
use crate::ffi::{DriverResult, finish, non_null, write_out};
use flyt_protocol::ops::req;

use crate::generated::types::{
    CUarray_format, CUasyncCallback, CUasyncCallbackHandle, CUasyncNotificationInfo, CUatomicOperation, CUdevice, CUdevice_P2PAttribute,
    CUdevice_attribute, CUdevprop, CUexecAffinityParam, CUexecAffinityParam_st_param, CUexecAffinitySmCount, CUexecAffinityType, CUuuid,
};

fn with_device<T>(dev: CUdevice, f: impl FnOnce(&DeviceInfo) -> DriverResult<T>) -> DriverResult<T> {
    f(driver().session()?.device(dev)?)
}

fn attribute(info: &DeviceInfo, attribute: u32) -> DriverResult<i32> {
    info.attribute(attribute).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
}

/// `CU_DEVICE_ATTRIBUTE_MAX` of CUDA 13.0: attribute ids below it are valid.
const ATTRIBUTE_MAX: u32 = 148;

/// An attribute as a program sees it through Flyt: capabilities Flyt cannot serve read 0 (mapped host
/// memory without the shared-memory channel among them), and so does a valid attribute the server's
/// device did not report; an id that is no attribute is invalid value.
fn served_attribute(info: &DeviceInfo, id: u32) -> DriverResult<i32> {
    if !(1..ATTRIBUTE_MAX).contains(&id) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // Mapped and managed memory are had over the shared-memory channel (the server maps pinned
    // blocks at the app's addresses), so the device's answer stands when the session has it.
    let shared_memory = flyt_client::devices::WITH_SHARED_MEMORY.contains(&id)
        && flyt_client::client::client().is_ok_and(|client| client.has_shared_memory());
    Ok(flyt_client::devices::served_attribute(info, id, shared_memory).unwrap_or(0))
}

/// Copies `text` into a C buffer of `len` bytes, truncated and always NUL-terminated.
///
/// # Safety
/// `out` is NULL or writable for `len` bytes.
unsafe fn write_c_string(out: *mut c_char, len: c_int, text: &str) -> DriverResult {
    let len = usize::try_from(len).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if out.is_null() || len == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let n = text.len().min(len - 1);
    // SAFETY: `out` is writable for `len` bytes per the contract, and `n + 1 <= len`.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), out, n);
        out.add(n).write(0);
    }
    Ok(())
}

pub unsafe fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    finish((|| {
        non_null([device.cast()])?;
        driver().session()?.device(ordinal)?;
        // SAFETY: checked non-NULL; the caller passes a writable CUdevice.
        unsafe { write_out(device, ordinal) }
    })())
}

pub unsafe fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    finish((|| {
        non_null([count.cast()])?;
        let n = c_int::try_from(driver().session()?.devices.len()).unwrap_or(c_int::MAX);
        // SAFETY: checked non-NULL; the caller passes a writable int.
        unsafe { write_out(count, n) }
    })())
}

pub unsafe fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    // SAFETY: the caller passes a buffer of `len` bytes.
    finish(with_device(dev, |info| unsafe { write_c_string(name, len, &info.name) }))
}

unsafe fn write_uuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    finish((|| {
        non_null([uuid.cast()])?;
        let bytes = with_device(dev, |info| Ok(info.uuid))?;
        // SAFETY: checked non-NULL; the caller passes a writable CUuuid.
        unsafe { write_out(uuid, CUuuid { bytes: bytes.map(|b| b as c_char) }) }
    })())
}

/// The legacy entry point: the same UUID as `_v2` (they differ only for MIG instances, which a Flyt
/// session reports as the slice it is).
pub unsafe fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { write_uuid(uuid, dev) }
}

pub unsafe fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { write_uuid(uuid, dev) }
}

pub unsafe fn cuDeviceGetLuid(luid: *mut c_char, device_node_mask: *mut c_uint, dev: CUdevice) -> CUresult {
    finish((|| {
        non_null([luid.cast(), device_node_mask.cast()])?;
        let (bytes, mask) = with_device(dev, |info| Ok((info.luid, info.luid_device_node_mask)))?;
        // SAFETY: checked non-NULL; the caller passes an 8-byte buffer and a writable unsigned int.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), luid, bytes.len());
            write_out(device_node_mask, mask)
        }
    })())
}

/// The legacy 32-bit entry point: sizes of 4 GiB and more are clamped.
pub unsafe fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) -> CUresult {
    finish((|| {
        non_null([bytes.cast()])?;
        let total = with_device(dev, |info| Ok(info.total_mem))?;
        // SAFETY: checked non-NULL; the caller passes a writable unsigned int.
        unsafe { write_out(bytes, c_uint::try_from(total).unwrap_or(c_uint::MAX)) }
    })())
}

pub unsafe fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    finish((|| {
        non_null([bytes.cast()])?;
        let total = with_device(dev, |info| Ok(info.total_mem))?;
        // SAFETY: checked non-NULL; the caller passes a writable size_t.
        unsafe { write_out(bytes, total as usize) }
    })())
}

pub unsafe fn cuDeviceGetAttribute(pi: *mut c_int, attrib: CUdevice_attribute, dev: CUdevice) -> CUresult {
    finish((|| {
        non_null([pi.cast()])?;
        let value = with_device(dev, |info| served_attribute(info, attrib))?;
        // SAFETY: checked non-NULL; the caller passes a writable int.
        unsafe { write_out(pi, value) }
    })())
}

/// `CU_EXEC_AFFINITY_TYPE_SM_COUNT`, the one execution affinity type.
const AFFINITY_SM_COUNT: CUexecAffinityType = 0;

/// Contexts limited to fewer SMs are refused (`cuCtxCreate_v3`): the session's slice is its SM
/// share, so Flyt does not offer the affinity.
pub unsafe fn cuDeviceGetExecAffinitySupport(pi: *mut c_int, type_: CUexecAffinityType, dev: CUdevice) -> CUresult {
    finish((|| {
        non_null([pi.cast()])?;
        with_device(dev, |_| Ok(()))?;
        if type_ != AFFINITY_SM_COUNT {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: checked non-NULL.
        unsafe { write_out(pi, 0) }
    })())
}

/// The current context's SM count: every SM of the session's slice (no context is limited).
pub unsafe fn cuCtxGetExecAffinity(p_exec_affinity: *mut CUexecAffinityParam, type_: CUexecAffinityType) -> CUresult {
    finish((|| {
        non_null([p_exec_affinity.cast()])?;
        let ctx = crate::context::current().ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
        ctx.usable()?;
        if type_ != AFFINITY_SM_COUNT {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let sms = with_device(ctx.device(), |info| attribute(info, attr::MULTIPROCESSOR_COUNT))?;
        let value = CUexecAffinityParam {
            r#type: AFFINITY_SM_COUNT,
            param: CUexecAffinityParam_st_param { smCount: CUexecAffinitySmCount { val: c_uint::try_from(sms).unwrap_or(0) } },
        };
        // SAFETY: checked non-NULL.
        unsafe { write_out(p_exec_affinity, value) }
    })())
}

/// Device queries: no current context needed, as the driver answers them before any.
pub unsafe fn cuDeviceGetTexture1DLinearMaxWidth(
    max_width_in_elements: *mut usize,
    format: CUarray_format,
    num_channels: c_uint,
    dev: CUdevice,
) -> CUresult {
    finish((|| {
        non_null([max_width_in_elements.cast()])?;
        with_device(dev, |_| Ok(()))?;
        let request = req::Texture1DLinearMaxWidth { format, channels: num_channels };
        let width = super::session::session_client()?.call(request).map_err(super::session::driver_error)?.width;
        // SAFETY: checked non-NULL.
        unsafe { write_out(max_width_in_elements, usize::try_from(width).unwrap_or(usize::MAX)) }
    })())
}

/// The server driver's answer for `count` operations.
///
/// # Safety
/// `capabilities` and `operations` hold `count` entries, per the driver API's contract.
unsafe fn atomic_capabilities(capabilities: *mut c_uint, operations: *const CUatomicOperation, count: c_uint, peer: bool) -> DriverResult {
    non_null([capabilities.cast(), operations.cast()])?;
    if count == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: per this function's contract.
    let operations = unsafe { std::slice::from_raw_parts(operations, count as usize) }.to_vec();
    let request = req::AtomicCapabilities { operations, peer };
    let found = super::session::session_client()?.call(request).map_err(super::session::driver_error)?.capabilities;
    if found.len() != count as usize {
        return Err(CUresult::CUDA_ERROR_UNKNOWN);
    }
    // SAFETY: per this function's contract; `found` holds `count` entries.
    unsafe { std::ptr::copy_nonoverlapping(found.as_ptr(), capabilities, found.len()) };
    Ok(())
}

pub unsafe fn cuDeviceGetHostAtomicCapabilities(
    capabilities: *mut c_uint,
    operations: *const CUatomicOperation,
    count: c_uint,
    dev: CUdevice,
) -> CUresult {
    finish((|| {
        with_device(dev, |_| Ok(()))?;
        // SAFETY: forwarded contract.
        unsafe { atomic_capabilities(capabilities, operations, count, false) }
    })())
}

/// A session serves one device: the only pair is the device with itself, which the server's
/// driver answers for.
pub unsafe fn cuDeviceGetP2PAtomicCapabilities(
    capabilities: *mut c_uint,
    operations: *const CUatomicOperation,
    count: c_uint,
    src_device: CUdevice,
    dst_device: CUdevice,
) -> CUresult {
    finish((|| {
        with_device(src_device, |_| Ok(()))?;
        with_device(dst_device, |_| Ok(()))?;
        // SAFETY: forwarded contract.
        unsafe { atomic_capabilities(capabilities, operations, count, true) }
    })())
}

/// `domain:bus:device.function` in hex, as the driver formats it.
pub fn format_pci_bus_id(info: &DeviceInfo) -> DriverResult<String> {
    let domain = attribute(info, attr::PCI_DOMAIN_ID)?;
    let bus = attribute(info, attr::PCI_BUS_ID)?;
    let device = attribute(info, attr::PCI_DEVICE_ID)?;
    Ok(format!("{domain:04x}:{bus:02x}:{device:02x}.0"))
}

pub unsafe fn cuDeviceGetPCIBusId(pci_bus_id: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    finish((|| {
        let id = with_device(dev, format_pci_bus_id)?;
        // SAFETY: the caller passes a buffer of `len` bytes.
        unsafe { write_c_string(pci_bus_id, len, &id) }
    })())
}

/// `[domain:]bus:device[.function]`, hex: `(domain, bus, device)`; a `.` with no function is
/// refused.
pub fn parse_pci_bus_id(text: &str) -> Option<(i32, i32, i32)> {
    let (domain, bus, device) = flyt_front_kit::pci::parse_bus_id(text, false)?;
    Some((i32::try_from(domain).ok()?, i32::try_from(bus).ok()?, i32::try_from(device).ok()?))
}

pub unsafe fn cuDeviceGetByPCIBusId(dev: *mut CUdevice, pci_bus_id: *const c_char) -> CUresult {
    finish((|| {
        non_null([dev.cast(), pci_bus_id.cast()])?;
        // SAFETY: non-NULL; the caller passes a NUL-terminated string.
        let text = unsafe { CStr::from_ptr(pci_bus_id) }.to_str().map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let wanted = parse_pci_bus_id(text).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let session = driver().session()?;
        let found = session
            .devices
            .iter()
            .position(|info| {
                let id = |a| info.attribute(a).unwrap_or(-1);
                (id(attr::PCI_DOMAIN_ID), id(attr::PCI_BUS_ID), id(attr::PCI_DEVICE_ID)) == wanted
            })
            .ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)?;
        // SAFETY: checked non-NULL; the caller passes a writable CUdevice.
        unsafe { write_out(dev, found as CUdevice) }
    })())
}

pub unsafe fn cuDeviceComputeCapability(major: *mut c_int, minor: *mut c_int, dev: CUdevice) -> CUresult {
    finish((|| {
        non_null([major.cast(), minor.cast()])?;
        let (ma, mi) = with_device(dev, |info| {
            Ok((attribute(info, attr::COMPUTE_CAPABILITY_MAJOR)?, attribute(info, attr::COMPUTE_CAPABILITY_MINOR)?))
        })?;
        // SAFETY: checked non-NULL; the caller passes writable ints.
        unsafe {
            write_out(major, ma)?;
            write_out(minor, mi)
        }
    })())
}

/// The legacy `CUdevprop`, filled from the attributes.
pub unsafe fn cuDeviceGetProperties(prop: *mut CUdevprop, dev: CUdevice) -> CUresult {
    finish((|| {
        non_null([prop.cast()])?;
        let value = with_device(dev, |info| {
            let a = |id| attribute(info, id);
            Ok(CUdevprop {
                maxThreadsPerBlock: a(attr::MAX_THREADS_PER_BLOCK)?,
                maxThreadsDim: [a(attr::MAX_BLOCK_DIM_X)?, a(attr::MAX_BLOCK_DIM_Y)?, a(attr::MAX_BLOCK_DIM_Z)?],
                maxGridSize: [a(attr::MAX_GRID_DIM_X)?, a(attr::MAX_GRID_DIM_Y)?, a(attr::MAX_GRID_DIM_Z)?],
                sharedMemPerBlock: a(attr::MAX_SHARED_MEMORY_PER_BLOCK)?,
                totalConstantMemory: a(attr::TOTAL_CONSTANT_MEMORY)?,
                SIMDWidth: a(attr::WARP_SIZE)?,
                memPitch: a(attr::MAX_PITCH)?,
                regsPerBlock: a(attr::MAX_REGISTERS_PER_BLOCK)?,
                clockRate: a(attr::CLOCK_RATE)?,
                textureAlign: a(attr::TEXTURE_ALIGNMENT)?,
            })
        })?;
        // SAFETY: checked non-NULL; the caller passes a writable CUdevprop.
        unsafe { write_out(prop, value) }
    })())
}

/// Peer attributes between two of the session's devices, as the server's driver answered them;
/// a device is no peer of itself (`CUDA_ERROR_INVALID_DEVICE`, as the driver answers).
pub unsafe fn cuDeviceGetP2PAttribute(
    value: *mut c_int,
    attrib: CUdevice_P2PAttribute,
    src_device: CUdevice,
    dst_device: CUdevice,
) -> CUresult {
    finish((|| {
        non_null([value.cast()])?;
        let session = driver().session()?;
        session.device(src_device)?;
        session.device(dst_device)?;
        let client = flyt_client::client::client().map_err(crate::client_source::to_driver)?;
        let link = client.peer_link(src_device as usize, dst_device as usize).ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)?;
        let answer = link.attribute(attrib).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: checked non-NULL; the caller passes a writable int.
        unsafe { write_out(value, answer) }
    })())
}

#[cfg(test)]
mod tests {
    use super::*;

    // The global driver of the unit-test binary has `testing::FakeDevices` (see `driver::driver`).
    #[test]
    fn device_queries_answer_from_the_reported_devices() {
        // SAFETY: every pointer below is a valid local.
        unsafe {
            assert_eq!(cuInit(1), CUresult::CUDA_ERROR_INVALID_VALUE);
            assert_eq!(cuInit(0), CUresult::CUDA_SUCCESS);
            let mut count = 0;
            assert_eq!(cuDeviceGetCount(&mut count), CUresult::CUDA_SUCCESS);
            assert_eq!(count, crate::testing::GLOBAL_FAKE_DEVICES as c_int);
            let mut dev = -1;
            assert_eq!(cuDeviceGet(&mut dev, 1), CUresult::CUDA_SUCCESS);
            assert_eq!(dev, 1);
            assert_eq!(cuDeviceGet(&mut dev, count), CUresult::CUDA_ERROR_INVALID_DEVICE);
            assert_eq!(dev, 1, "not written on failure");

            let mut name = [0 as c_char; 64];
            assert_eq!(cuDeviceGetName(name.as_mut_ptr(), 64, 1), CUresult::CUDA_SUCCESS);
            assert_eq!(CStr::from_ptr(name.as_ptr()).to_str().unwrap(), "Fake H100 1");
            assert_eq!(cuDeviceGetName(name.as_mut_ptr(), 5, 1), CUresult::CUDA_SUCCESS);
            assert_eq!(CStr::from_ptr(name.as_ptr()).to_str().unwrap(), "Fake");

            let mut uuid = CUuuid { bytes: [0; 16] };
            assert_eq!(cuDeviceGetUuid_v2(&mut uuid, 1), CUresult::CUDA_SUCCESS);
            assert_eq!(uuid.bytes[0], 1);
            assert_eq!(uuid.bytes[15], 15);

            let (mut total, mut total32) = (0usize, 0 as c_uint);
            assert_eq!(cuDeviceTotalMem_v2(&mut total, 0), CUresult::CUDA_SUCCESS);
            assert_eq!(total, 80 << 30);
            assert_eq!(cuDeviceTotalMem(&mut total32, 0), CUresult::CUDA_SUCCESS);
            assert_eq!(total32, c_uint::MAX);

            let mut value = 0;
            assert_eq!(cuDeviceGetAttribute(&mut value, attr::MULTIPROCESSOR_COUNT, 0), CUresult::CUDA_SUCCESS);
            assert_eq!(value, 132);
            assert_eq!(cuDeviceGetAttribute(&mut value, 9999, 0), CUresult::CUDA_ERROR_INVALID_VALUE);
            assert_eq!(cuDeviceGetAttribute(&mut value, 16, 99), CUresult::CUDA_ERROR_INVALID_DEVICE);

            let mut bus = [0 as c_char; 16];
            assert_eq!(cuDeviceGetPCIBusId(bus.as_mut_ptr(), 16, 1), CUresult::CUDA_SUCCESS);
            assert_eq!(CStr::from_ptr(bus.as_ptr()).to_str().unwrap(), "0000:11:00.0");
            assert_eq!(cuDeviceGetByPCIBusId(&mut dev, bus.as_ptr()), CUresult::CUDA_SUCCESS);
            assert_eq!(dev, 1);
            assert_eq!(cuDeviceGetByPCIBusId(&mut dev, c"0000:99:00.0".as_ptr()), CUresult::CUDA_ERROR_INVALID_DEVICE);

            let (mut major, mut minor) = (0, 0);
            assert_eq!(cuDeviceComputeCapability(&mut major, &mut minor, 0), CUresult::CUDA_SUCCESS);
            assert_eq!((major, minor), (9, 0));

            let mut prop = std::mem::zeroed::<CUdevprop>();
            assert_eq!(cuDeviceGetProperties(&mut prop, 0), CUresult::CUDA_SUCCESS);
            assert_eq!((prop.maxThreadsPerBlock, prop.SIMDWidth, prop.maxThreadsDim[2]), (1024, 32, 64));

            let (mut luid, mut mask) = ([1 as c_char; 8], 7);
            assert_eq!(cuDeviceGetLuid(luid.as_mut_ptr(), &mut mask, 0), CUresult::CUDA_SUCCESS);
            assert_eq!((luid, mask), ([0; 8], 0));
        }
    }

    use super::super::init::cuInit;
}

// -- Async notifications (`cuDeviceRegisterAsyncNotification`) --
//
// The one notification CUDA defines is "over budget": the process holds more device memory than
// its budget. Through Flyt the budget is the slice's quota, shared by the tenant's sessions; an
// operator who lowers it below what the tenant holds makes the server tell each session how far
// over it is (`Notice::OverBudget`). The notice arrives with the next reply the app reads, and
// the callbacks run on a thread of Flyt's, as the driver runs them on one of its own.

/// `CUasyncNotificationInfo` for `CU_ASYNC_NOTIFICATION_TYPE_OVER_BUDGET`: the type, then the
/// union whose over-budget member is one `unsigned long long`.
#[repr(C)]
struct OverBudgetInfo {
    notification_type: c_uint,
    bytes_over_budget: u64,
}

const _: () = assert!(size_of::<OverBudgetInfo>() == 16);

/// `CU_ASYNC_NOTIFICATION_TYPE_OVER_BUDGET`.
const OVER_BUDGET: c_uint = 1;

type AsyncCallback = unsafe extern "C" fn(*mut CUasyncNotificationInfo, *mut std::ffi::c_void, CUasyncCallbackHandle);

struct Registration {
    handle: usize,
    callback: AsyncCallback,
    /// The app's pointer, handed back untouched.
    user_data: usize,
}

/// Registered callbacks. The lock is held while they run, so that once
/// `cuDeviceUnregisterAsyncNotification` returns its callback runs no more.
static REGISTRATIONS: std::sync::Mutex<Vec<Registration>> = std::sync::Mutex::new(Vec::new());
static NEXT_HANDLE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);

thread_local! {
    /// Set on the thread that runs the callbacks: they may not register or unregister.
    static IN_CALLBACK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn registrations() -> std::sync::MutexGuard<'static, Vec<Registration>> {
    REGISTRATIONS.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The server's over-budget notice: every registered callback hears it, on a thread of its own
/// (the thread that read the notice is reading the app's replies).
fn notify_over_budget(bytes: u64) {
    let spawned = std::thread::Builder::new().name("flyt-notify".into()).spawn(move || {
        IN_CALLBACK.with(|flag| flag.set(true));
        let registered = registrations();
        for registration in registered.iter() {
            let mut info = OverBudgetInfo { notification_type: OVER_BUDGET, bytes_over_budget: bytes };
            let handle: CUasyncCallbackHandle = std::ptr::without_provenance_mut(registration.handle);
            // SAFETY: the app registered this callback with this user data, for exactly this
            // call; the info lives across the call and has CUasyncNotificationInfo's layout.
            unsafe { (registration.callback)((&raw mut info).cast(), std::ptr::without_provenance_mut(registration.user_data), handle) };
        }
    });
    if spawned.is_err() {
        crate::diagnostics::once("over-budget", "flyt: no thread for the over-budget notification: callbacks not run");
    }
}

pub unsafe fn cuDeviceRegisterAsyncNotification(
    device: CUdevice,
    callback_func: CUasyncCallback,
    user_data: *mut std::ffi::c_void,
    callback: *mut CUasyncCallbackHandle,
) -> CUresult {
    finish((|| {
        if IN_CALLBACK.with(std::cell::Cell::get) {
            return Err(CUresult::CUDA_ERROR_NOT_PERMITTED);
        }
        let (Some(function), false) = (callback_func, callback.is_null()) else {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        with_device(device, |_| Ok(()))?;
        flyt_client::client::on_over_budget(notify_over_budget);
        // Handles are small counters shifted clear of NULL; the app only hands them back.
        let handle = NEXT_HANDLE.fetch_add(1, std::sync::atomic::Ordering::Relaxed) << 4;
        registrations().push(Registration { handle, callback: function, user_data: user_data as usize });
        // SAFETY: checked non-NULL.
        unsafe { write_out(callback, std::ptr::without_provenance_mut(handle)) }
    })())
}

pub unsafe fn cuDeviceUnregisterAsyncNotification(device: CUdevice, callback: CUasyncCallbackHandle) -> CUresult {
    finish((|| {
        if IN_CALLBACK.with(std::cell::Cell::get) {
            return Err(CUresult::CUDA_ERROR_NOT_PERMITTED);
        }
        with_device(device, |_| Ok(()))?;
        let mut registered = registrations();
        let index = registered
            .iter()
            .position(|registration| registration.handle == callback as usize)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        registered.remove(index);
        Ok(())
    })())
}
