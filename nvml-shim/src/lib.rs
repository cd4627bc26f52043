//! `flyt-nvml`: Flyt's NVML, loaded into apps as `libnvidia-ml.so.1`. It answers the NVML queries
//! PyTorch and monitoring tools make for the GPU slice the process's Flyt session serves, and holds
//! no session of its own: it is a front over Flyt's `libcuda.so.1` ([`driver`]), so every answer
//! agrees with the driver's (device count, names, UUIDs, PCI ids, driver version) and memory is the
//! slice's (its quota as total); processes and utilization are the tenant's, as the slice's server
//! counts them; NVLinks are the server host's, as far as they join the session's devices. Everything else NVML offers answers `NVML_ERROR_NOT_SUPPORTED`
//! with one line naming the function; nothing is invented.
//!
//! Device handles are values Flyt chooses; a handle it never gave out is refused, never read.

#![allow(non_snake_case, reason = "NVML's names")]
#![allow(clippy::cast_possible_truncation, reason = "Flyt runs on 64-bit Linux only; NVML's counts and lengths are small")]
#![allow(clippy::missing_safety_doc, reason = "each function's contract is NVML's")]

pub mod driver;

use std::ffi::{CStr, c_char, c_int, c_uint};
use std::sync::atomic::{AtomicU32, Ordering};

use flyt_front_kit::diagnostics;

pub type NvmlReturn = c_uint;
pub type NvmlDevice = *mut std::ffi::c_void;

pub const NVML_SUCCESS: NvmlReturn = 0;
pub const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
pub const NVML_ERROR_NOT_SUPPORTED: NvmlReturn = 3;
pub const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
pub const NVML_ERROR_DRIVER_NOT_LOADED: NvmlReturn = 9;
pub const NVML_ERROR_FUNCTION_NOT_FOUND: NvmlReturn = 13;
pub const NVML_ERROR_GPU_IS_LOST: NvmlReturn = 15;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: NvmlReturn = 25;
pub const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

type Result<T = ()> = std::result::Result<T, NvmlReturn>;

/// `nvmlInit` calls not yet matched by `nvmlShutdown`.
static INITIALIZED: AtomicU32 = AtomicU32::new(0);

/// Handles are this plus the device index.
const HANDLE_BASE: usize = 0x6e76_6d6c_0000;

fn handle(index: c_int) -> NvmlDevice {
    std::ptr::without_provenance_mut(HANDLE_BASE + index as usize)
}

/// The device index behind a handle Flyt gave out.
fn index_of(device: NvmlDevice) -> Result<c_int> {
    let index =
        (device as usize).checked_sub(HANDLE_BASE).and_then(|index| c_int::try_from(index).ok()).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    if index >= driver::device_count()? {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok(index)
}

/// Runs an export's body after checking NVML is initialized; a panic becomes `NVML_ERROR_UNKNOWN`
/// with one line, never an unwind into C.
fn run(name: &'static str, body: impl FnOnce() -> Result) -> NvmlReturn {
    run_uninitialized(name, || {
        if INITIALIZED.load(Ordering::Acquire) == 0 {
            return Err(NVML_ERROR_UNINITIALIZED);
        }
        body()
    })
}

/// As [`run`], for the calls NVML answers before `nvmlInit`.
fn run_uninitialized(name: &'static str, body: impl FnOnce() -> Result) -> NvmlReturn {
    flyt_front_kit::ffi::catch_panic(name, || body().err().unwrap_or(NVML_SUCCESS), || NVML_ERROR_UNKNOWN)
}

/// Writes `value` through an out-pointer the app passed.
///
/// # Safety
/// `ptr` is NULL or valid for a write of `T`.
unsafe fn write<T>(ptr: *mut T, value: T) -> Result {
    // SAFETY: forwarded contract.
    unsafe { flyt_front_kit::ffi::write_out(ptr, value, NVML_ERROR_INVALID_ARGUMENT) }
}

/// Copies `text` and its NUL into a C buffer of `length` bytes, or `INSUFFICIENT_SIZE`.
///
/// # Safety
/// `buffer` is NULL or writable for `length` bytes.
unsafe fn write_text(buffer: *mut c_char, length: c_uint, text: &str) -> Result {
    if buffer.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    if text.len() >= length as usize {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: `text.len() + 1 <= length` bytes of the caller's buffer.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), buffer, text.len());
        *buffer.add(text.len()) = 0;
    }
    Ok(())
}

// -- initialization --

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> NvmlReturn {
    run_uninitialized("nvmlInit_v2", || {
        // Devices must be reachable: NVML without a GPU fails here, as it does without a driver.
        driver::device_count().map_err(|_| NVML_ERROR_DRIVER_NOT_LOADED)?;
        INITIALIZED.fetch_add(1, Ordering::AcqRel);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit() -> NvmlReturn {
    nvmlInit_v2()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> NvmlReturn {
    // The flags ask NVML to skip attaching to GPUs or to tolerate missing ones; Flyt attaches to
    // nothing local either way.
    nvmlInit_v2()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> NvmlReturn {
    run_uninitialized("nvmlShutdown", || {
        INITIALIZED
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |count| count.checked_sub(1))
            .map(|_| ())
            .map_err(|_| NVML_ERROR_UNINITIALIZED)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: NvmlReturn) -> *const c_char {
    let text: &'static CStr = match result {
        NVML_SUCCESS => c"Success",
        NVML_ERROR_UNINITIALIZED => c"Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED => c"Not Supported",
        NVML_ERROR_NOT_FOUND => c"Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        NVML_ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
        NVML_ERROR_FUNCTION_NOT_FOUND => c"Function Not Found",
        NVML_ERROR_GPU_IS_LOST => c"GPU is lost",
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH => c"Argument version mismatch",
        _ => c"Unknown Error",
    };
    text.as_ptr()
}

// -- system --

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> NvmlReturn {
    // SAFETY: the caller's out-pointer.
    run("nvmlSystemGetCudaDriverVersion_v2", || unsafe { write(version, driver::driver_version()?) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> NvmlReturn {
    // SAFETY: forwarded contract.
    unsafe { nvmlSystemGetCudaDriverVersion_v2(version) }
}

// -- devices --

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> NvmlReturn {
    // SAFETY: the caller's out-pointer.
    run("nvmlDeviceGetCount_v2", || unsafe { write(count, driver::device_count()? as c_uint) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> NvmlReturn {
    // SAFETY: forwarded contract.
    unsafe { nvmlDeviceGetCount_v2(count) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut NvmlDevice) -> NvmlReturn {
    run("nvmlDeviceGetHandleByIndex_v2", || {
        let index = c_int::try_from(index).map_err(|_| NVML_ERROR_INVALID_ARGUMENT)?;
        if index >= driver::device_count()? {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: the caller's out-pointer.
        unsafe { write(device, handle(index)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut NvmlDevice) -> NvmlReturn {
    // SAFETY: forwarded contract.
    unsafe { nvmlDeviceGetHandleByIndex_v2(index, device) }
}

/// The first device whose identity satisfies `matches`, as a handle, or `NOT_FOUND`.
fn find_device(matches: impl Fn(&driver::Identity) -> bool) -> Result<NvmlDevice> {
    for index in 0..driver::device_count()? {
        if matches(&driver::identity(index)?) {
            return Ok(handle(index));
        }
    }
    Err(NVML_ERROR_NOT_FOUND)
}

/// A C string argument, or `INVALID_ARGUMENT`.
///
/// # Safety
/// `text` is NULL or NUL-terminated.
unsafe fn text_argument<'a>(text: *const c_char) -> Result<&'a str> {
    if text.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: NUL-terminated per the caller's contract.
    unsafe { CStr::from_ptr(text) }.to_str().map_err(|_| NVML_ERROR_INVALID_ARGUMENT)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut NvmlDevice) -> NvmlReturn {
    run("nvmlDeviceGetHandleByUUID", || {
        // SAFETY: the caller's C string.
        let wanted = unsafe { text_argument(uuid) }?;
        let found = find_device(|identity| identity.uuid_text().eq_ignore_ascii_case(wanted))?;
        // SAFETY: the caller's out-pointer.
        unsafe { write(device, found) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id: *const c_char, device: *mut NvmlDevice) -> NvmlReturn {
    run("nvmlDeviceGetHandleByPciBusId_v2", || {
        // SAFETY: the caller's C string.
        let wanted = flyt_front_kit::pci::parse_bus_id(unsafe { text_argument(pci_bus_id) }?, true).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        let found = find_device(|identity| identity.pci == wanted)?;
        // SAFETY: the caller's out-pointer.
        unsafe { write(device, found) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(pci_bus_id: *const c_char, device: *mut NvmlDevice) -> NvmlReturn {
    // SAFETY: forwarded contract.
    unsafe { nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id, device) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: NvmlDevice, index: *mut c_uint) -> NvmlReturn {
    // SAFETY: the caller's out-pointer.
    run("nvmlDeviceGetIndex", || unsafe { write(index, index_of(device)? as c_uint) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(device: NvmlDevice, name: *mut c_char, length: c_uint) -> NvmlReturn {
    // SAFETY: the caller's buffer of `length` bytes.
    run("nvmlDeviceGetName", || unsafe { write_text(name, length, &driver::identity(index_of(device)?)?.name) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(device: NvmlDevice, uuid: *mut c_char, length: c_uint) -> NvmlReturn {
    // SAFETY: the caller's buffer of `length` bytes.
    run("nvmlDeviceGetUUID", || unsafe { write_text(uuid, length, &driver::identity(index_of(device)?)?.uuid_text()) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(device: NvmlDevice, major: *mut c_int, minor: *mut c_int) -> NvmlReturn {
    run("nvmlDeviceGetCudaComputeCapability", || {
        let identity = driver::identity(index_of(device)?)?;
        // SAFETY: the caller's out-pointers.
        unsafe {
            write(major, identity.compute_capability.0)?;
            write(minor, identity.compute_capability.1)
        }
    })
}

/// `NVML_P2P_STATUS_NOT_SUPPORTED` and `NVML_P2P_STATUS_OK`.
const P2P_STATUS_NOT_SUPPORTED: c_int = 5;
const P2P_STATUS_OK: c_int = 0;
/// `NVML_P2P_CAPS_INDEX_PCI`, the last capability index NVML defines.
const P2P_CAPS_INDEX_LAST: c_uint = 4;

/// `NVML_P2P_CAPS_INDEX_READ`, `_WRITE`, `_NVLINK`, `_ATOMICS`.
const P2P_CAPS_INDEX_READ: c_uint = 0;
const P2P_CAPS_INDEX_WRITE: c_uint = 1;
const P2P_CAPS_INDEX_NVLINK: c_uint = 2;
const P2P_CAPS_INDEX_ATOMICS: c_uint = 3;

/// Whether an active NVLink joins two devices: one of `first`'s reaches `second`, or both reach
/// a switch.
fn joined_by_nvlink(first: c_int, second: c_int) -> Result<bool> {
    let ends = |device: c_int| -> Result<Vec<driver::LinkEnd>> {
        let mut ends = Vec::new();
        while let Some(end) = driver::nvlink(device, ends.len() as c_uint)? {
            ends.push(end);
            if ends.len() as c_uint == NVLINK_MAX_LINKS {
                break;
            }
        }
        Ok(ends)
    };
    let (from, to) = (ends(first)?, ends(second)?);
    let reaches_switch = |ends: &[driver::LinkEnd]| ends.contains(&driver::LinkEnd::Switch);
    Ok(from.contains(&driver::LinkEnd::Device(second)) || (reaches_switch(&from) && reaches_switch(&to)))
}

/// Peer-to-peer capabilities between two devices, which NCCL asks about while it maps the
/// topology. A device with itself is answered as NVIDIA's NVML answers it on an H100 (measured
/// 2026-11-24): "not supported" for every capability index it defines, and OK for indices past
/// them. Two devices of the session: reads and writes as the driver's peer access, atomics as its
/// native atomics, NVLink when an active link joins them (directly, or both reach a switch); the
/// PCI path is not known through the driver API ("not supported", so NCCL judges it by its own
/// measures).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetP2PStatus(device1: NvmlDevice, device2: NvmlDevice, index: c_uint, status: *mut c_int) -> NvmlReturn {
    run("nvmlDeviceGetP2PStatus", || {
        let (first, second) = (index_of(device1)?, index_of(device2)?);
        let answer = if first != second {
            let supported = |attribute| driver::p2p_attribute(attribute, first, second).map(|value| value != 0);
            let yes = match index {
                P2P_CAPS_INDEX_READ | P2P_CAPS_INDEX_WRITE => supported(driver::P2P_ACCESS_SUPPORTED)?,
                P2P_CAPS_INDEX_ATOMICS => supported(driver::P2P_NATIVE_ATOMIC_SUPPORTED)?,
                P2P_CAPS_INDEX_NVLINK => joined_by_nvlink(first, second)?,
                _ => false,
            };
            if yes { P2P_STATUS_OK } else { P2P_STATUS_NOT_SUPPORTED }
        } else if index <= P2P_CAPS_INDEX_LAST {
            P2P_STATUS_NOT_SUPPORTED
        } else {
            P2P_STATUS_OK
        };
        // SAFETY: the caller's out-pointer.
        unsafe { write(status, answer) }
    })
}

/// `nvmlPciInfo_t` (what `nvmlDeviceGetPciInfo_v3` fills).
#[repr(C)]
pub struct NvmlPciInfo {
    pub bus_id_legacy: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pci_device_id: c_uint,
    pub pci_sub_system_id: c_uint,
    pub bus_id: [c_char; 32],
}

/// A device's PCI information as `nvmlDeviceGetPciInfo_v3` gives it.
fn pci_info(index: c_int) -> Result<NvmlPciInfo> {
    let (domain, bus, slot) = driver::identity(index)?.pci;
    let mut info = NvmlPciInfo {
        bus_id_legacy: [0; 16],
        domain,
        bus,
        device: slot,
        // The driver API does not tell the PCI product and subsystem ids: 0, never a guess.
        pci_device_id: 0,
        pci_sub_system_id: 0,
        bus_id: [0; 32],
    };
    // SAFETY: both are arrays of the lengths given.
    unsafe {
        write_text(info.bus_id_legacy.as_mut_ptr(), 16, &legacy_bus_id(info.domain, bus, slot))?;
        write_text(info.bus_id.as_mut_ptr(), 32, &format!("{domain:08X}:{bus:02X}:{slot:02X}.0"))?;
    }
    Ok(info)
}

/// The 16-byte bus id of NVML's older structures.
fn legacy_bus_id(domain: c_uint, bus: c_uint, slot: c_uint) -> String {
    format!("{domain:04X}:{bus:02X}:{slot:02X}.0")
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(device: NvmlDevice, pci: *mut NvmlPciInfo) -> NvmlReturn {
    run("nvmlDeviceGetPciInfo_v3", || {
        let info = pci_info(index_of(device)?)?;
        // SAFETY: the caller's out-pointer.
        unsafe { write(pci, info) }
    })
}

// -- NVLink --
//
// Each device's links as the server's host NVML reports them (`flyt_table::NVLINK_PEER`), their
// far ends named as this process sees them: another of its devices, a switch, or nothing (down,
// not for peer traffic, or a GPU it does not hold). NCCL reads these to choose P2P over NVLink.

/// `NVML_NVLINK_MAX_LINKS`.
const NVLINK_MAX_LINKS: c_uint = 18;
/// `NVML_FEATURE_DISABLED` and `_ENABLED`.
const FEATURE_DISABLED: c_uint = 0;
const FEATURE_ENABLED: c_uint = 1;

/// What link `link` of `device` reaches: `NOT_SUPPORTED` for a device without NVLink,
/// `INVALID_ARGUMENT` past its last link, as NVML answers.
fn nvlink_of(device: NvmlDevice, link: c_uint) -> Result<driver::LinkEnd> {
    let index = index_of(device)?;
    if link < NVLINK_MAX_LINKS
        && let Some(end) = driver::nvlink(index, link)?
    {
        return Ok(end);
    }
    if driver::nvlink_count(index, NVLINK_MAX_LINKS)? == 0 { Err(NVML_ERROR_NOT_SUPPORTED) } else { Err(NVML_ERROR_INVALID_ARGUMENT) }
}

fn is_active(end: driver::LinkEnd) -> bool {
    !matches!(end, driver::LinkEnd::Inactive)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(device: NvmlDevice, link: c_uint, is_active: *mut c_uint) -> NvmlReturn {
    run("nvmlDeviceGetNvLinkState", || {
        let state = if is_active_link(device, link)? { FEATURE_ENABLED } else { FEATURE_DISABLED };
        // SAFETY: the caller's out-pointer.
        unsafe { write(is_active, state) }
    })
}

fn is_active_link(device: NvmlDevice, link: c_uint) -> Result<bool> {
    nvlink_of(device, link).map(is_active)
}

/// `NVML_NVLINK_CAP_*`: peer traffic, system memory, peer atomics, system memory atomics, SLI,
/// "link is supported".
const NVLINK_CAP_SLI_BRIDGE: c_uint = 4;
const NVLINK_CAP_COUNT: c_uint = 6;

/// An active link is one the server's NVML reports P2P-capable and up: it answers every
/// capability but SLI (no graphics through Flyt); any other link answers none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkCapability(
    device: NvmlDevice,
    link: c_uint,
    capability: c_uint,
    result: *mut c_uint,
) -> NvmlReturn {
    run("nvmlDeviceGetNvLinkCapability", || {
        let active = is_active_link(device, link)?;
        if capability >= NVLINK_CAP_COUNT {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: the caller's out-pointer.
        unsafe { write(result, c_uint::from(active && capability != NVLINK_CAP_SLI_BRIDGE)) }
    })
}

/// The bus id NVML gives a far end it cannot show (an NVSwitch, or NVLinks of GPUs passed into a
/// VM): NCCL finds no such PCI device and takes the link for one to an NVSwitch. An empty bus id
/// would send NCCL 2.28 to `/sys/class/pci_bus` for the link's class, and its initialisation fails.
const UNSEEN_FAR_END: &str = "fffffff:ff:ff.0";

/// The far end's PCI information: another device's exactly as `nvmlDeviceGetPciInfo_v3` gives
/// it; a switch's with NVML's bus id for a far end it cannot show. A link that reaches nothing
/// the process may know answers `NOT_SUPPORTED`.
fn remote_pci_info(device: NvmlDevice, link: c_uint) -> Result<NvmlPciInfo> {
    match nvlink_of(device, link)? {
        driver::LinkEnd::Device(index) => pci_info(index),
        driver::LinkEnd::Switch => {
            let mut info = NvmlPciInfo {
                bus_id_legacy: [0; 16],
                domain: 0x0fff_ffff,
                bus: 0xff,
                device: 0xff,
                pci_device_id: 0,
                pci_sub_system_id: 0,
                bus_id: [0; 32],
            };
            // SAFETY: both buffers are this struct's, of the lengths given.
            unsafe {
                write_text(info.bus_id_legacy.as_mut_ptr(), 16, UNSEEN_FAR_END)?;
                write_text(info.bus_id.as_mut_ptr(), 32, UNSEEN_FAR_END)?;
            }
            Ok(info)
        }
        driver::LinkEnd::Inactive => Err(NVML_ERROR_NOT_SUPPORTED),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(device: NvmlDevice, link: c_uint, pci: *mut NvmlPciInfo) -> NvmlReturn {
    run("nvmlDeviceGetNvLinkRemotePciInfo_v2", || {
        let info = remote_pci_info(device, link)?;
        // SAFETY: the caller's out-pointer.
        unsafe { write(pci, info) }
    })
}

/// `nvmlPciInfo_t` before its 32-byte bus id: what the unversioned calls fill (NCCL declares this
/// layout, 52 bytes, and looks up `nvmlDeviceGetNvLinkRemotePciInfo` by that name).
#[repr(C)]
pub struct NvmlPciInfoV1 {
    pub bus_id: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pci_device_id: c_uint,
    pub pci_sub_system_id: c_uint,
    pub reserved: [c_uint; 4],
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo(device: NvmlDevice, link: c_uint, pci: *mut NvmlPciInfoV1) -> NvmlReturn {
    run("nvmlDeviceGetNvLinkRemotePciInfo", || {
        let info = remote_pci_info(device, link)?;
        let mut legacy = NvmlPciInfoV1 {
            bus_id: [0; 16],
            domain: info.domain,
            bus: info.bus,
            device: info.device,
            pci_device_id: info.pci_device_id,
            pci_sub_system_id: info.pci_sub_system_id,
            reserved: [0; 4],
        };
        legacy.bus_id = info.bus_id_legacy;
        // SAFETY: the caller's out-pointer, of the older (shorter) layout.
        unsafe { write(pci, legacy) }
    })
}

/// `nvmlIntNvLinkDeviceType_t`.
const NVLINK_DEVICE_TYPE_GPU: c_uint = 0x00;
const NVLINK_DEVICE_TYPE_SWITCH: c_uint = 0x02;
const NVLINK_DEVICE_TYPE_UNKNOWN: c_uint = 0xFF;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(device: NvmlDevice, link: c_uint, kind: *mut c_uint) -> NvmlReturn {
    run("nvmlDeviceGetNvLinkRemoteDeviceType", || {
        let answer = match nvlink_of(device, link)? {
            driver::LinkEnd::Device(_) => NVLINK_DEVICE_TYPE_GPU,
            driver::LinkEnd::Switch => NVLINK_DEVICE_TYPE_SWITCH,
            driver::LinkEnd::Inactive => NVLINK_DEVICE_TYPE_UNKNOWN,
        };
        // SAFETY: the caller's out-pointer.
        unsafe { write(kind, answer) }
    })
}

/// `nvmlFieldValue_t`.
#[repr(C)]
pub struct NvmlFieldValue {
    pub field_id: c_uint,
    pub scope_id: c_uint,
    pub timestamp: i64,
    pub latency_usec: i64,
    pub value_type: c_uint,
    pub nvml_return: NvmlReturn,
    /// `nvmlValue_t`, a union of 8 bytes.
    pub value: u64,
}

/// `NVML_FI_DEV_NVLINK_LINK_COUNT` and `NVML_FI_DEV_NVLINK_GET_STATE` (its scope the link).
const FI_DEV_NVLINK_LINK_COUNT: c_uint = 91;
const FI_DEV_NVLINK_GET_STATE: c_uint = 165;
/// `NVML_VALUE_TYPE_UNSIGNED_INT`.
const VALUE_TYPE_UNSIGNED_INT: c_uint = 1;

/// Field values: the NVLink count and each link's state; every other field answers its own
/// `NOT_SUPPORTED` (the call itself succeeds, as NVML's does for fields a device lacks).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(device: NvmlDevice, count: c_int, values: *mut NvmlFieldValue) -> NvmlReturn {
    run("nvmlDeviceGetFieldValues", || {
        let index = index_of(device)?;
        let count = usize::try_from(count).map_err(|_| NVML_ERROR_INVALID_ARGUMENT)?;
        if values.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_micros());
        for at in 0..count {
            // SAFETY: the caller's array of `count` entries, each with its field id set.
            let entry = unsafe { &mut *values.add(at) };
            let answer = match entry.field_id {
                FI_DEV_NVLINK_LINK_COUNT => driver::nvlink_count(index, NVLINK_MAX_LINKS),
                FI_DEV_NVLINK_GET_STATE => {
                    is_active_link(device, entry.scope_id).map(|active| if active { FEATURE_ENABLED } else { FEATURE_DISABLED })
                }
                _ => Err(NVML_ERROR_NOT_SUPPORTED),
            };
            entry.timestamp = i64::try_from(now).unwrap_or(i64::MAX);
            entry.latency_usec = 0;
            match answer {
                Ok(value) => {
                    entry.value_type = VALUE_TYPE_UNSIGNED_INT;
                    entry.value = u64::from(value);
                    entry.nvml_return = NVML_SUCCESS;
                }
                Err(error) => entry.nvml_return = error,
            }
        }
        Ok(())
    })
}

/// `nvmlMemory_t`.
#[repr(C)]
pub struct NvmlMemory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct NvmlMemoryV2 {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2`: the struct's size with its version in the top byte.
const MEMORY_V2: c_uint = size_of::<NvmlMemoryV2>() as c_uint | (2 << 24);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: NvmlDevice, memory: *mut NvmlMemory) -> NvmlReturn {
    run("nvmlDeviceGetMemoryInfo", || {
        let (free, total) = driver::memory(index_of(device)?)?;
        // SAFETY: the caller's out-pointer.
        unsafe { write(memory, NvmlMemory { total, free, used: total.saturating_sub(free) }) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(device: NvmlDevice, memory: *mut NvmlMemoryV2) -> NvmlReturn {
    run("nvmlDeviceGetMemoryInfo_v2", || {
        if memory.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-NULL; the caller sets `version` before the call.
        if unsafe { (*memory).version } != MEMORY_V2 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let (free, total) = driver::memory(index_of(device)?)?;
        let used = total.saturating_sub(free);
        // SAFETY: the caller's out-pointer.
        unsafe { write(memory, NvmlMemoryV2 { version: MEMORY_V2, total, reserved: 0, free, used }) }
    })
}

/// `nvmlUtilization_t`.
#[repr(C)]
pub struct NvmlUtilization {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// The slice's utilization over the last second, as Flyt's server measures it for the tenant:
/// `gpu` the share of time its kernels were queued and not yet seen done, `memory` the same for
/// its copies and memsets. (NVIDIA's own counters cover the whole GPU and, under MPS, cannot
/// tell tenants apart.)
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(device: NvmlDevice, utilization: *mut NvmlUtilization) -> NvmlReturn {
    run("nvmlDeviceGetUtilizationRates", || {
        let (gpu, memory) = driver::utilization(index_of(device)?)?;
        // SAFETY: the caller's out-pointer (checked by `write`).
        unsafe { write(utilization, NvmlUtilization { gpu, memory }) }
    })
}

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
pub struct NvmlProcessInfoV1 {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
}

/// `nvmlProcessInfo_t` (`_v2`, also what `_v3` fills).
#[repr(C)]
pub struct NvmlProcessInfo {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

/// Not in a MIG instance.
const NO_INSTANCE: c_uint = 0xFFFF_FFFF;

/// The processes of this tenant that use the device: one per live session of the slice's server,
/// this one too, each with the device memory its allocations hold. Their pids are as each app's
/// host knows them (an app on another host has a pid of that host).
fn tenant_processes(device: NvmlDevice) -> Result<Vec<(c_uint, u64)>> {
    driver::tenant_processes(index_of(device)?)
}

/// Fills a process list the NVML way: `count` in is the room, out is the number of entries (with
/// `INSUFFICIENT_SIZE` when there is not room for them all).
///
/// # Safety
/// `count` is NULL or writable; `infos` has room for `*count` entries when that is non-zero.
unsafe fn fill_processes<T>(count: *mut c_uint, infos: *mut T, processes: &[(c_uint, u64)], make: impl Fn(c_uint, u64) -> T) -> Result {
    if count.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-NULL; the caller's in/out count.
    let room = unsafe { *count } as usize;
    // SAFETY: as above.
    unsafe { *count = processes.len() as c_uint };
    if room < processes.len() {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    if !processes.is_empty() && infos.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    for (index, (pid, bytes)) in processes.iter().enumerate() {
        // SAFETY: `index < processes.len() <= room` entries of the caller's array.
        unsafe { infos.add(index).write(make(*pid, *bytes)) };
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut NvmlProcessInfo,
) -> NvmlReturn {
    run("nvmlDeviceGetComputeRunningProcesses_v3", || {
        let processes = tenant_processes(device)?;
        // SAFETY: the caller's count and array.
        unsafe {
            fill_processes(count, infos, &processes, |pid, used_gpu_memory| NvmlProcessInfo {
                pid,
                used_gpu_memory,
                gpu_instance_id: NO_INSTANCE,
                compute_instance_id: NO_INSTANCE,
            })
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut NvmlProcessInfo,
) -> NvmlReturn {
    // SAFETY: forwarded contract (the v2 and v3 entries share their struct).
    unsafe { nvmlDeviceGetComputeRunningProcesses_v3(device, count, infos) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut NvmlProcessInfoV1,
) -> NvmlReturn {
    run("nvmlDeviceGetComputeRunningProcesses", || {
        let processes = tenant_processes(device)?;
        // SAFETY: the caller's count and array.
        unsafe { fill_processes(count, infos, &processes, |pid, used_gpu_memory| NvmlProcessInfoV1 { pid, used_gpu_memory }) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut NvmlProcessInfo,
) -> NvmlReturn {
    run("nvmlDeviceGetGraphicsRunningProcesses_v3", || {
        index_of(device)?;
        // A Flyt session runs compute work only.
        // SAFETY: the caller's count and array.
        unsafe {
            fill_processes(count, infos, &[], |pid, used_gpu_memory| NvmlProcessInfo {
                pid,
                used_gpu_memory,
                gpu_instance_id: NO_INSTANCE,
                compute_instance_id: NO_INSTANCE,
            })
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v2(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut NvmlProcessInfo,
) -> NvmlReturn {
    // SAFETY: forwarded contract.
    unsafe { nvmlDeviceGetGraphicsRunningProcesses_v3(device, count, infos) }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInternalGetExportTable(_table: *mut *const std::ffi::c_void, _id: *const u8) -> NvmlReturn {
    // NVIDIA's tools ask for private tables Flyt does not have; NVML answers unknown ids so.
    NVML_ERROR_FUNCTION_NOT_FOUND
}

/// NVML functions Flyt exports without implementing them: each answers
/// `NVML_ERROR_NOT_SUPPORTED` and prints one line naming itself, so a tool that looks a function
/// up finds it (PyTorch treats a missing NVML symbol as a fatal assertion) and learns at the call.
macro_rules! unsupported {
    ($($name:ident)*) => {
        $(
            #[unsafe(no_mangle)]
            pub extern "C" fn $name() -> NvmlReturn {
                diagnostics::once(
                    stringify!($name),
                    concat!("flyt: ", stringify!($name), " is not supported through Flyt (returning NVML_ERROR_NOT_SUPPORTED)"),
                );
                NVML_ERROR_NOT_SUPPORTED
            }
        )*
        /// The unsupported exports, for tests.
        pub const UNSUPPORTED: &[&str] = &[$(stringify!($name)),*];
    };
}

unsupported! {
    nvmlSystemGetDriverVersion nvmlSystemGetNVMLVersion nvmlSystemGetProcessName
    nvmlDeviceGetPciInfo nvmlDeviceGetPciInfo_v2 nvmlDeviceGetMinorNumber nvmlDeviceGetSerial nvmlDeviceGetBoardId
    nvmlDeviceGetBrand nvmlDeviceGetArchitecture nvmlDeviceGetTemperature
    nvmlDeviceGetPowerUsage nvmlDeviceGetTotalEnergyConsumption nvmlDeviceGetPowerManagementLimit
    nvmlDeviceGetEnforcedPowerLimit nvmlDeviceGetClockInfo nvmlDeviceGetMaxClockInfo nvmlDeviceGetFanSpeed
    nvmlDeviceGetPerformanceState nvmlDeviceGetPersistenceMode nvmlDeviceGetComputeMode nvmlDeviceGetEccMode
    nvmlDeviceGetMigMode nvmlDeviceGetBAR1MemoryInfo nvmlDeviceGetTopologyCommonAncestor
    nvmlDeviceGetCpuAffinity nvmlDeviceGetMemoryAffinity nvmlDeviceGetCurrPcieLinkGeneration
    nvmlDeviceGetCurrPcieLinkWidth nvmlDeviceGetGpuFabricInfo nvmlDeviceGetGpuFabricInfoV
    nvmlDeviceGetMPSComputeRunningProcesses_v3 nvmlDeviceGetProcessUtilization nvmlDeviceGetSamples
}
