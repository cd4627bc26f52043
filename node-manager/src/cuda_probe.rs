//! GPU discovery through the CUDA driver API (`libcuda.so.1`, loaded at run time), the one FFI
//! edge of the node manager. The driver rather than NVML: it reports the SM count (NVML has no
//! call for it outside MIG) and numbers GPUs by CUDA ordinal, which is what
//! `flyt-rpc-server --gpu` takes. Only `cuInit` and `cuDeviceGet*`/`cuDeviceCanAccessPeer`
//! queries are used: no context is created, so MPS started afterwards is unaffected.

use std::ffi::{c_char, c_int, c_uint};

use flyt_cuda_sys::{CUresult, DriverTable};
use flyt_protocol::control::cluster::{GpuInfo, GpuLink, GpuLinkKind};
use libloading::Library;

/// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT` in `cuda.h`.
const ATTRIBUTE_MULTIPROCESSOR_COUNT: c_uint = 16;
/// `CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED` in `cuda.h`.
const P2P_NATIVE_ATOMIC_SUPPORTED: c_uint = 3;

/// The driver exports the probe calls: a driver without one is [`ProbeError::MissingSymbol`].
const REQUIRED: &[&str] = &[
    "cuInit",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceTotalMem_v2",
    "cuDeviceGetAttribute",
    "cuDeviceGetUuid_v2",
    "cuDeviceCanAccessPeer",
    "cuDeviceGetP2PAttribute",
];

/// Calls `$name` of the generated driver table: its status (`probe` checked every name it calls).
macro_rules! cu {
    ($table:expr, $name:ident($($arg:expr),* $(,)?)) => {
        match $table.$name {
            Some(function) => function($($arg),*),
            None => CUresult::CUDA_ERROR_NOT_SUPPORTED,
        }
    };
}

/// Why the driver could not be asked.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum ProbeError {
    /// cannot load {0}: {1}
    Load(String, String),
    /// the driver lacks {0}
    MissingSymbol(&'static str),
    /// {call} failed with CUDA error {code}
    Call { call: &'static str, code: i32 },
}

fn check(call: &'static str, code: CUresult) -> Result<(), ProbeError> {
    if code == CUresult::CUDA_SUCCESS { Ok(()) } else { Err(ProbeError::Call { call, code: code.0 as i32 }) }
}

/// Lists the GPUs the driver sees (an empty list when it sees none).
pub fn probe(library_name: &str) -> Result<Vec<GpuInfo>, ProbeError> {
    // SAFETY: loading libcuda runs its initialisers, which have no preconditions on the caller;
    // the library is kept alive (`library`) for as long as any symbol taken from it is called.
    let library = unsafe { Library::new(library_name) }.map_err(|error| ProbeError::Load(library_name.to_string(), error.to_string()))?;
    // SAFETY: `library` is a CUDA driver (its exports have the header's signatures, as generated)
    // and outlives every call through the table below.
    let table = unsafe { DriverTable::resolve(&library) };
    let missing = table.missing();
    if let Some(name) = REQUIRED.iter().find(|name| missing.contains(name)) {
        return Err(ProbeError::MissingSymbol(name));
    }

    // SAFETY: cuInit takes flags by value; 0 is the only defined value.
    check("cuInit", unsafe { cu!(table, cuInit(0)) })?;
    let mut count: c_int = 0;
    // SAFETY: `count` is a live, writable c_int for the duration of the call.
    check("cuDeviceGetCount", unsafe { cu!(table, cuDeviceGetCount(&mut count)) })?;
    let mut gpus = Vec::new();
    for ordinal in 0..count {
        let mut device: c_int = 0;
        // SAFETY: `device` is a live, writable CUdevice (an int); `ordinal` < the count just read.
        check("cuDeviceGet", unsafe { cu!(table, cuDeviceGet(&mut device, ordinal)) })?;
        let mut name = [0 as c_char; 256];
        // SAFETY: `name` holds 256 writable bytes and we pass 256 as its length; the driver
        // NUL-terminates within that length.
        check("cuDeviceGetName", unsafe { cu!(table, cuDeviceGetName(name.as_mut_ptr(), 256, device)) })?;
        let mut memory: usize = 0;
        // SAFETY: `memory` is a live, writable size_t; `device` came from cuDeviceGet.
        check("cuDeviceTotalMem_v2", unsafe { cu!(table, cuDeviceTotalMem_v2(&mut memory, device)) })?;
        let mut sm_count: c_int = 0;
        // SAFETY: `sm_count` is a live, writable int; the attribute id is from cuda.h.
        check("cuDeviceGetAttribute", unsafe { cu!(table, cuDeviceGetAttribute(&mut sm_count, ATTRIBUTE_MULTIPROCESSOR_COUNT, device)) })?;
        // SAFETY: all-zero bytes are a valid CUuuid.
        let mut uuid: flyt_cuda_sys::types::CUuuid = unsafe { std::mem::zeroed() };
        // SAFETY: `uuid` is a live, writable CUuuid; `device` came from cuDeviceGet.
        check("cuDeviceGetUuid_v2", unsafe { cu!(table, cuDeviceGetUuid_v2(&mut uuid, device)) })?;
        let uuid = uuid.bytes.map(|byte| byte as u8);
        let name_bytes: Vec<u8> = name.iter().take_while(|byte| **byte != 0).map(|byte| *byte as u8).collect();
        gpus.push(GpuInfo {
            index: u32::try_from(ordinal).unwrap_or(0),
            uuid: format_uuid(&uuid),
            name: String::from_utf8_lossy(&name_bytes).into_owned(),
            memory_bytes: memory as u64,
            sm_count: u32::try_from(sm_count).unwrap_or(0),
            emulated: false,
            links: Vec::new(),
        });
    }
    // Peer paths between every ordered pair. NVLink (and NVSwitch) carries native atomics; a
    // PCIe peer path does not: the driver's attribute tells them apart without NVML.
    for from in 0..count {
        for to in (0..count).filter(|to| *to != from) {
            let mut can: c_int = 0;
            // SAFETY: `can` is a live, writable int; both ordinals are below the count read above
            // (CUdevice handles equal ordinals in the driver API).
            if unsafe { cu!(table, cuDeviceCanAccessPeer(&mut can, from, to)) } != CUresult::CUDA_SUCCESS || can == 0 {
                continue;
            }
            let mut atomics: c_int = 0;
            // SAFETY: as above; the attribute id is from cuda.h.
            let asked = unsafe { cu!(table, cuDeviceGetP2PAttribute(&mut atomics, P2P_NATIVE_ATOMIC_SUPPORTED, from, to)) };
            let kind = if asked == CUresult::CUDA_SUCCESS && atomics != 0 { GpuLinkKind::NvLink } else { GpuLinkKind::Pcie };
            gpus[from as usize].links.push(GpuLink { to: u32::try_from(to).unwrap_or(0), kind });
        }
    }
    Ok(gpus)
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as nvidia-smi prints it.
fn format_uuid(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("GPU-{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_driver_is_an_error_not_a_panic() {
        assert!(matches!(probe("libcuda-that-does-not-exist.so.1"), Err(ProbeError::Load(..))));
    }

    #[test]
    fn uuids_print_like_nvidia_smi() {
        let uuid = format_uuid(&[0x12; 16]);
        assert_eq!(uuid, "GPU-12121212-1212-1212-1212-121212121212");
    }
}
