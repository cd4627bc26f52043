//! The driver under this NVML: Flyt's `libcuda.so.1` (beside this library, else by name), which
//! holds the process's one session. Identity comes from the public driver API, which answers from
//! the session without making a context; memory comes from Flyt's own export table, which needs
//! no context either. NVIDIA's driver has no such table: over it, NVML answers "driver not loaded".

use std::ffi::{c_char, c_int, c_uint};
use std::sync::OnceLock;

use flyt_front_kit::flyt_table;

use crate::{NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_GPU_IS_LOST, NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_UNKNOWN, Result};

type CUresult = u32;
const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
const CUDA_ERROR_INSUFFICIENT_DRIVER: CUresult = 35;
const CUDA_ERROR_NO_DEVICE: CUresult = 100;
const CUDA_ERROR_UNKNOWN: CUresult = 999;
/// `CU_DEVICE_ATTRIBUTE_*`.
const COMPUTE_CAPABILITY_MAJOR: c_int = 75;
const COMPUTE_CAPABILITY_MINOR: c_int = 76;
const PCI_BUS_ID: c_int = 33;
const PCI_DEVICE_ID: c_int = 34;
const PCI_DOMAIN_ID: c_int = 50;

struct Driver {
    device_get_count: unsafe extern "C" fn(*mut c_int) -> CUresult,
    device_get_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> CUresult,
    device_get_uuid: unsafe extern "C" fn(*mut [u8; 16], c_int) -> CUresult,
    device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CUresult,
    device_get_p2p_attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int, c_int) -> CUresult,
    driver_get_version: unsafe extern "C" fn(*mut c_int) -> CUresult,
    mem_info: flyt_table::MemInfo,
    tenant_processes: flyt_table::TenantProcesses,
    utilization: flyt_table::Utilization,
    /// Absent from an older Flyt driver's table (no NVLinks known then).
    nvlink_peer: Option<flyt_table::NvLinkPeer>,
    _library: libloading::Library,
}

static DRIVER: OnceLock<std::result::Result<Driver, String>> = OnceLock::new();

fn load() -> std::result::Result<Driver, String> {
    let library = flyt_front_kit::driver_library::open()?;
    macro_rules! symbol {
        ($name:literal) => {
            // SAFETY: the driver API function of this name, given its documented C signature (enums
            // as `int`, `CUresult` as `unsigned`, which share their ABI).
            *unsafe { library.get(concat!($name, "\0").as_bytes()) }.map_err(|error| format!("{}: {error}", $name))?
        };
    }
    let init: unsafe extern "C" fn(c_uint) -> CUresult = symbol!("cuInit");
    let get_export_table: unsafe extern "C" fn(*mut *const usize, *const [u8; 16]) -> CUresult = symbol!("cuGetExportTable");
    // SAFETY: cuInit takes flags by value (0 is the only valid value).
    let initialized = unsafe { init(0) };
    if initialized != 0 {
        return Err(format!("cuInit failed ({initialized})"));
    }
    let mut table: *const usize = std::ptr::null();
    // SAFETY: valid out-pointer and a 16-byte UUID.
    if unsafe { get_export_table(&mut table, &flyt_table::UUID) } != 0 || table.is_null() {
        return Err("the libcuda.so.1 found is not Flyt's (it has no Flyt table)".into());
    }
    // SAFETY: Flyt's table: word 0 is its size in bytes, then entry points (flyt_table's layout).
    let words = unsafe { *table } / size_of::<usize>();
    let needed = flyt_table::UTILIZATION + 1;
    if words < needed {
        return Err(format!("Flyt's driver table has {words} words, fewer than the {needed} this NVML needs"));
    }
    // SAFETY: entries within the table's size, each a function of the type flyt_table names.
    let (mem_info, tenant_processes, utilization) = unsafe {
        (
            std::mem::transmute::<usize, flyt_table::MemInfo>(*table.add(flyt_table::MEM_INFO)),
            std::mem::transmute::<usize, flyt_table::TenantProcesses>(*table.add(flyt_table::TENANT_PROCESSES)),
            std::mem::transmute::<usize, flyt_table::Utilization>(*table.add(flyt_table::UTILIZATION)),
        )
    };
    // SAFETY: as above, where the table is long enough to hold the entry.
    let nvlink_peer = (words > flyt_table::NVLINK_PEER)
        .then(|| unsafe { std::mem::transmute::<usize, flyt_table::NvLinkPeer>(*table.add(flyt_table::NVLINK_PEER)) });
    Ok(Driver {
        device_get_count: symbol!("cuDeviceGetCount"),
        device_get_name: symbol!("cuDeviceGetName"),
        device_get_uuid: symbol!("cuDeviceGetUuid_v2"),
        device_get_attribute: symbol!("cuDeviceGetAttribute"),
        device_get_p2p_attribute: symbol!("cuDeviceGetP2PAttribute"),
        driver_get_version: symbol!("cuDriverGetVersion"),
        mem_info,
        tenant_processes,
        utilization,
        nvlink_peer,
        _library: library,
    })
}

fn driver() -> Result<&'static Driver> {
    DRIVER.get_or_init(load).as_ref().map_err(|reason| {
        flyt_front_kit::diagnostics::once("nvml-driver", &format!("flyt: NVML has no driver to ask: {reason}"));
        NVML_ERROR_DRIVER_NOT_LOADED
    })
}

/// A driver status in NVML's terms.
fn check(status: CUresult) -> Result {
    match status {
        0 => Ok(()),
        CUDA_ERROR_INVALID_DEVICE | CUDA_ERROR_INVALID_VALUE => Err(NVML_ERROR_INVALID_ARGUMENT),
        // No session (no server, refused): as NVML without a working driver.
        CUDA_ERROR_NO_DEVICE | CUDA_ERROR_NOT_INITIALIZED | CUDA_ERROR_INSUFFICIENT_DRIVER | CUDA_ERROR_UNKNOWN => {
            Err(NVML_ERROR_DRIVER_NOT_LOADED)
        }
        // The session was lost.
        _ if (700..800).contains(&status) => Err(NVML_ERROR_GPU_IS_LOST),
        _ => Err(NVML_ERROR_UNKNOWN),
    }
}

/// `CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED` and `_NATIVE_ATOMIC_SUPPORTED`.
pub const P2P_ACCESS_SUPPORTED: c_int = 2;
pub const P2P_NATIVE_ATOMIC_SUPPORTED: c_int = 3;

/// A peer attribute of two different devices, as the session's driver answers it.
pub fn p2p_attribute(attribute: c_int, from: c_int, to: c_int) -> Result<c_int> {
    let mut value = 0;
    // SAFETY: a valid out-pointer; the driver checks the devices.
    check(unsafe { (driver()?.device_get_p2p_attribute)(&mut value, attribute, from, to) })?;
    Ok(value)
}

pub fn device_count() -> Result<c_int> {
    let mut count = 0;
    // SAFETY: a valid out-pointer.
    check(unsafe { (driver()?.device_get_count)(&mut count) })?;
    Ok(count)
}

pub fn driver_version() -> Result<c_int> {
    let mut version = 0;
    // SAFETY: a valid out-pointer.
    check(unsafe { (driver()?.driver_get_version)(&mut version) })?;
    Ok(version)
}

/// What NVML reports of a device, all of it as the driver reports it.
pub struct Identity {
    pub name: String,
    pub uuid: [u8; 16],
    /// `(domain, bus, device)`.
    pub pci: (c_uint, c_uint, c_uint),
    pub compute_capability: (c_int, c_int),
}

impl Identity {
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as NVML and `nvidia-smi -L` write it.
    pub fn uuid_text(&self) -> String {
        let hex = |range: std::ops::Range<usize>| self.uuid[range].iter().map(|b| format!("{b:02x}")).collect::<String>();
        format!("GPU-{}-{}-{}-{}-{}", hex(0..4), hex(4..6), hex(6..8), hex(8..10), hex(10..16))
    }
}

pub fn identity(device: c_int) -> Result<Identity> {
    let driver = driver()?;
    let attribute = |attribute: c_int| -> Result<c_int> {
        let mut value = 0;
        // SAFETY: a valid out-pointer.
        check(unsafe { (driver.device_get_attribute)(&mut value, attribute, device) })?;
        Ok(value)
    };
    let mut name = [0 as c_char; 256];
    // SAFETY: a buffer of the length given.
    check(unsafe { (driver.device_get_name)(name.as_mut_ptr(), name.len() as c_int, device) })?;
    let mut uuid = [0u8; 16];
    // SAFETY: a valid 16-byte out-pointer.
    check(unsafe { (driver.device_get_uuid)(&mut uuid, device) })?;
    // SAFETY: the driver wrote a NUL-terminated name into the buffer.
    let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned();
    let unsigned = |value: c_int| c_uint::try_from(value).unwrap_or(0);
    Ok(Identity {
        name,
        uuid,
        pci: (unsigned(attribute(PCI_DOMAIN_ID)?), unsigned(attribute(PCI_BUS_ID)?), unsigned(attribute(PCI_DEVICE_ID)?)),
        compute_capability: (attribute(COMPUTE_CAPABILITY_MAJOR)?, attribute(COMPUTE_CAPABILITY_MINOR)?),
    })
}

/// `(free, total)` of the device as the session sees it.
pub fn memory(device: c_int) -> Result<(u64, u64)> {
    let (mut free, mut total) = (0u64, 0u64);
    // SAFETY: valid out-pointers; the entry's contract is flyt_table's.
    check(unsafe { (driver()?.mem_info)(device, &mut free, &mut total) })?;
    Ok((free, total))
}

/// The tenant's app processes on the device that hold device memory, with what each holds.
pub fn tenant_processes(device: c_int) -> Result<Vec<(c_uint, u64)>> {
    let driver = driver()?;
    let mut room = 64u32;
    loop {
        let (mut pids, mut bytes) = (vec![0u32; room as usize], vec![0u64; room as usize]);
        let mut count = room;
        // SAFETY: arrays of `count` entries and a valid in/out count; flyt_table's contract.
        check(unsafe { (driver.tenant_processes)(device, pids.as_mut_ptr(), bytes.as_mut_ptr(), &mut count) })?;
        if count <= room {
            // A session that opened but holds nothing has made no allocation yet: NVML lists a
            // process once it uses the device (a monitoring tool asking NVML is not listed).
            let listed = pids.into_iter().zip(bytes).take(count as usize).filter(|(_, bytes)| *bytes > 0);
            return Ok(listed.collect());
        }
        room = count;
    }
}

/// `(kernels, copies)`: percentages of the last second the tenant had such work queued.
pub fn utilization(device: c_int) -> Result<(c_uint, c_uint)> {
    let (mut kernels, mut copies) = (0u32, 0u32);
    // SAFETY: valid out-pointers; the entry's contract is flyt_table's.
    check(unsafe { (driver()?.utilization)(device, &mut kernels, &mut copies) })?;
    Ok((kernels, copies))
}

/// What one of a device's NVLinks reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkEnd {
    /// Down, not for peer traffic, or to a GPU this process does not see.
    Inactive,
    /// Another device (its index).
    Device(c_int),
    /// An NVSwitch (or another far end that is no GPU).
    Switch,
}

/// NVLink `link` of `device`, or `None` past the device's last link (a device without NVLink, or
/// under a driver that does not tell, has none).
pub fn nvlink(device: c_int, link: c_uint) -> Result<Option<LinkEnd>> {
    let Some(nvlink_peer) = driver()?.nvlink_peer else { return Ok(None) };
    let mut far_end: c_int = flyt_table::NVLINK_INACTIVE;
    // SAFETY: a valid out-pointer; the entry's contract is flyt_table's.
    match unsafe { nvlink_peer(device, link, &mut far_end) } {
        CUDA_ERROR_INVALID_VALUE => Ok(None),
        status => check(status).map(|()| {
            Some(match far_end {
                flyt_table::NVLINK_SWITCH => LinkEnd::Switch,
                index if index >= 0 => LinkEnd::Device(index),
                _ => LinkEnd::Inactive,
            })
        }),
    }
}

/// How many NVLinks `device` has (NVML numbers at most `limit`).
pub fn nvlink_count(device: c_int, limit: c_uint) -> Result<c_uint> {
    for link in 0..limit {
        if nvlink(device, link)?.is_none() {
            return Ok(link);
        }
    }
    Ok(limit)
}

/// Parses a PCI bus id as NVML accepts it: `[domain:]bus:device[.function]`, hexadecimal, any case.
pub fn parse_pci_bus_id(text: &str) -> Option<(c_uint, c_uint, c_uint)> {
    let text = text.trim();
    let without_function = text.split_once('.').map_or(text, |(head, _)| head);
    let parts: Vec<&str> = without_function.split(':').collect();
    let number = |part: &str| c_uint::from_str_radix(part, 16).ok();
    match parts.as_slice() {
        [domain, bus, device] => Some((number(domain)?, number(bus)?, number(device)?)),
        [bus, device] => Some((0, number(bus)?, number(device)?)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_bus_ids_parse_in_every_form_nvml_accepts() {
        assert_eq!(parse_pci_bus_id("00000000:1A:00.0"), Some((0, 0x1a, 0)));
        assert_eq!(parse_pci_bus_id("0001:1a:03.0"), Some((1, 0x1a, 3)));
        assert_eq!(parse_pci_bus_id("1a:03"), Some((0, 0x1a, 3)));
        assert_eq!(parse_pci_bus_id("not a bus id"), None);
        assert_eq!(parse_pci_bus_id("0:1:2:3"), None);
    }

    #[test]
    fn uuids_are_written_as_nvml_does() {
        let identity = Identity { name: String::new(), uuid: std::array::from_fn(|i| i as u8), pci: (0, 0, 0), compute_capability: (9, 0) };
        assert_eq!(identity.uuid_text(), "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f");
    }
}
