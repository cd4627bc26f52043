//! The driver under this NVML: Flyt's `libcuda.so.1` (beside this library, else by name), which
//! holds the process's one session. Identity comes from the public driver API, which answers from
//! the session without making a context; memory comes from Flyt's own export table, which needs
//! no context either. NVIDIA's driver has no such table: over it, NVML answers "driver not loaded".

use std::ffi::{c_char, c_int, c_uint};
use std::sync::OnceLock;

use flyt_cuda_sys::{CUresult, DriverTable};
use flyt_front_kit::flyt_table;

use crate::{NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_GPU_IS_LOST, NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_UNKNOWN, Result};

/// `CU_DEVICE_ATTRIBUTE_*`.
const COMPUTE_CAPABILITY_MAJOR: c_uint = 75;
const COMPUTE_CAPABILITY_MINOR: c_uint = 76;
const PCI_BUS_ID: c_uint = 33;
const PCI_DEVICE_ID: c_uint = 34;
const PCI_DOMAIN_ID: c_uint = 50;

/// The runtime's `cudaErrorInsufficientDriver` (no `CUresult` has its number), which a driver
/// without a session may answer.
const INSUFFICIENT_DRIVER: CUresult = CUresult(35);

/// The driver exports this NVML calls: the load fails, naming the first one missing, without one.
const REQUIRED: &[&str] = &[
    "cuInit",
    "cuGetExportTable",
    "cuDeviceGetCount",
    "cuDeviceGetName",
    "cuDeviceGetUuid_v2",
    "cuDeviceGetAttribute",
    "cuDeviceGetP2PAttribute",
    "cuDriverGetVersion",
];

struct Driver {
    /// The generated driver table (`flyt-cuda-sys`) over the library found, which stays loaded.
    table: DriverTable,
    mem_info: flyt_table::MemInfo,
    tenant_processes: flyt_table::TenantProcesses,
    utilization: flyt_table::Utilization,
    /// Absent from an older Flyt driver's table (no NVLinks known then).
    nvlink_peer: Option<flyt_table::NvLinkPeer>,
}

/// Calls `$name` of the driver table: its status as a number (`load` checked that every name this
/// NVML calls is there; a missing one would answer CUDA_ERROR_NOT_SUPPORTED).
macro_rules! cu {
    ($table:expr, $name:ident($($arg:expr),* $(,)?)) => {
        match $table.$name {
            Some(function) => function($($arg),*).0,
            None => CUresult::CUDA_ERROR_NOT_SUPPORTED.0,
        }
    };
}

static DRIVER: OnceLock<std::result::Result<Driver, String>> = OnceLock::new();

fn load() -> std::result::Result<Driver, String> {
    // Leaked: the driver stays loaded for the life of the process, as it would in `DRIVER`.
    let library: &'static libloading::Library = Box::leak(Box::new(flyt_front_kit::driver_library::open()?));
    // SAFETY: a CUDA driver library (Flyt's, or whichever `libcuda.so.1` the loader found), whose
    // exports have the header's signatures, as generated.
    let driver_table = unsafe { DriverTable::resolve(library) };
    let missing = driver_table.missing();
    if let Some(name) = REQUIRED.iter().find(|name| missing.contains(name)) {
        return Err(format!("{name}: the driver lacks it"));
    }
    // SAFETY: cuInit takes flags by value (0 is the only valid value).
    let initialized = unsafe { cu!(driver_table, cuInit(0)) };
    if initialized != 0 {
        return Err(format!("cuInit failed ({initialized})"));
    }
    let (mut table, table_id): (*const usize, [u8; 16]) = (std::ptr::null(), flyt_table::UUID);
    // SAFETY: valid out-pointer and a 16-byte UUID (a `CUuuid`).
    if unsafe { cu!(driver_table, cuGetExportTable((&raw mut table).cast(), (&raw const table_id).cast())) } != 0 || table.is_null() {
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
    Ok(Driver { table: driver_table, mem_info, tenant_processes, utilization, nvlink_peer })
}

fn driver() -> Result<&'static Driver> {
    DRIVER.get_or_init(load).as_ref().map_err(|reason| {
        flyt_front_kit::diagnostics::once("nvml-driver", &format!("flyt: NVML has no driver to ask: {reason}"));
        NVML_ERROR_DRIVER_NOT_LOADED
    })
}

/// A driver status in NVML's terms.
fn check(status: u32) -> Result {
    match CUresult(status) {
        CUresult::CUDA_SUCCESS => Ok(()),
        CUresult::CUDA_ERROR_INVALID_DEVICE | CUresult::CUDA_ERROR_INVALID_VALUE => Err(NVML_ERROR_INVALID_ARGUMENT),
        // No session (no server, refused): as NVML without a working driver.
        CUresult::CUDA_ERROR_NO_DEVICE | CUresult::CUDA_ERROR_NOT_INITIALIZED | INSUFFICIENT_DRIVER | CUresult::CUDA_ERROR_UNKNOWN => {
            Err(NVML_ERROR_DRIVER_NOT_LOADED)
        }
        // The session was lost.
        _ if (700..800).contains(&status) => Err(NVML_ERROR_GPU_IS_LOST),
        _ => Err(NVML_ERROR_UNKNOWN),
    }
}

/// `CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED` and `_NATIVE_ATOMIC_SUPPORTED`.
pub const P2P_ACCESS_SUPPORTED: c_uint = 2;
pub const P2P_NATIVE_ATOMIC_SUPPORTED: c_uint = 3;

/// A peer attribute of two different devices, as the session's driver answers it.
pub fn p2p_attribute(attribute: c_uint, from: c_int, to: c_int) -> Result<c_int> {
    let mut value = 0;
    // SAFETY: a valid out-pointer; the driver checks the devices.
    check(unsafe { cu!(driver()?.table, cuDeviceGetP2PAttribute(&mut value, attribute, from, to)) })?;
    Ok(value)
}

pub fn device_count() -> Result<c_int> {
    let mut count = 0;
    // SAFETY: a valid out-pointer.
    check(unsafe { cu!(driver()?.table, cuDeviceGetCount(&mut count)) })?;
    Ok(count)
}

pub fn driver_version() -> Result<c_int> {
    let mut version = 0;
    // SAFETY: a valid out-pointer.
    check(unsafe { cu!(driver()?.table, cuDriverGetVersion(&mut version)) })?;
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
    let attribute = |attribute: c_uint| -> Result<c_int> {
        let mut value = 0;
        // SAFETY: a valid out-pointer.
        check(unsafe { cu!(driver.table, cuDeviceGetAttribute(&mut value, attribute, device)) })?;
        Ok(value)
    };
    let mut name = [0 as c_char; 256];
    // SAFETY: a buffer of the length given.
    check(unsafe { cu!(driver.table, cuDeviceGetName(name.as_mut_ptr(), name.len() as c_int, device)) })?;
    // SAFETY: all-zero bytes are a valid `CUuuid`.
    let mut uuid: flyt_cuda_sys::types::CUuuid = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer.
    check(unsafe { cu!(driver.table, cuDeviceGetUuid_v2(&mut uuid, device)) })?;
    let uuid = uuid.bytes.map(|byte| byte as u8);
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
        status if CUresult(status) == CUresult::CUDA_ERROR_INVALID_VALUE => Ok(None),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_written_as_nvml_does() {
        let identity = Identity { name: String::new(), uuid: std::array::from_fn(|i| i as u8), pci: (0, 0, 0), compute_capability: (9, 0) };
        assert_eq!(identity.uuid_text(), "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f");
    }
}
