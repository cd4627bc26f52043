//! Flyt's own export table: what Flyt's `libcuda.so.1` tells Flyt's other fronts that the public
//! driver API has no call for (or none that leaves contexts alone), asked for with
//! `cuGetExportTable` under Flyt's UUID, as NVIDIA's libraries ask NVIDIA's driver for theirs.
//! NVIDIA's driver answers this UUID with `CUDA_ERROR_INVALID_VALUE`, which tells a front it is
//! not over Flyt.
//!
//! Layout: pointer-sized words; word 0 the table's size in bytes, then the entries below.

use std::ffi::c_int;

/// `466c7974-4e56-4d4c-8000-000000000001` in memory order ("FlytNVML").
pub const UUID: [u8; 16] = [0x46, 0x6c, 0x79, 0x74, 0x4e, 0x56, 0x4d, 0x4c, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01];

/// Words in the table, its size word included.
pub const WORDS: usize = 6;

/// Entry 1: a device's memory as its session sees it (the slice's quota as total; free within
/// it), without a context. Returns a `CUresult`.
pub const MEM_INFO: usize = 1;
pub type MemInfo = unsafe extern "C" fn(device: c_int, free: *mut u64, total: *mut u64) -> u32;

/// Entry 2: the device memory this process holds (its allocations), without a context. Returns a
/// `CUresult`.
pub const PROCESS_MEMORY: usize = 2;
pub type ProcessMemory = unsafe extern "C" fn(device: c_int, bytes: *mut u64) -> u32;

/// Entry 3: the app processes of the tenant whose slice the device is (one per live session,
/// this process's too) and the device memory each holds, without a context. Fills up to
/// `*count` entries of `pids` and `bytes` and sets `*count` to how many there are. Returns a
/// `CUresult`.
pub const TENANT_PROCESSES: usize = 3;
pub type TenantProcesses = unsafe extern "C" fn(device: c_int, pids: *mut u32, bytes: *mut u64, count: *mut u32) -> u32;

/// Entry 4: the percentages of the last second in which the tenant had kernels (`kernels`) and
/// copies or memsets (`copies`) queued on the device and not yet seen done, without a context.
/// Returns a `CUresult`.
pub const UTILIZATION: usize = 4;
pub type Utilization = unsafe extern "C" fn(device: c_int, kernels: *mut u32, copies: *mut u32) -> u32;

/// Entry 5: what NVLink `link` of `device` reaches, as the session knows it (from the server's
/// NVML), without a context: `*far_end` is another device's index, [`NVLINK_SWITCH`] or
/// [`NVLINK_INACTIVE`]. Returns a `CUresult`: `CUDA_ERROR_INVALID_VALUE` past the device's last
/// link (a device without NVLink has none), `CUDA_ERROR_INVALID_DEVICE` for no such device.
pub const NVLINK_PEER: usize = 5;
pub type NvLinkPeer = unsafe extern "C" fn(device: c_int, link: u32, far_end: *mut c_int) -> u32;
/// `far_end` of an NVLink to an NVSwitch (or another far end that is no GPU).
pub const NVLINK_SWITCH: c_int = -1;
/// `far_end` of a link that is down, carries no peer traffic, or reaches a GPU the session does
/// not hold (or the app does not see).
pub const NVLINK_INACTIVE: c_int = -2;
