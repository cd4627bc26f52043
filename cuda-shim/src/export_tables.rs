//! `cuGetExportTable`: the undocumented tables NVIDIA's runtime, its libraries and PyTorch ask the
//! driver for by UUID, declared as data.
//!
//! A table is an array of pointer-sized words with a stable address for the life of the process: word 0
//! is the table's size in bytes (except the context-local storage table, which has none and ends with
//! NULL), then entry points. Entries Flyt implements are named functions; every other slot is a stub that
//! knows its table and index, prints `flyt: export table <uuid> entry <i> is not implemented` once and
//! answers CUDA_ERROR_NOT_SUPPORTED, so the next gap shows in one run. Sizes are the real driver 580's.
//! An unknown UUID is CUDA_ERROR_INVALID_VALUE, as from the real driver.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::Mutex;
use std::sync::atomic::AtomicU32;

use crate::CUresult;
use crate::context::ClsDestroy;
use crate::driver::driver;
use crate::exports::Address;
use crate::ffi::{DriverResult, boundary, finish, write_out};
use crate::generated::types::{CUcontext, CUdevice, CUjit_option, CUmodule, CUstream};
use crate::integrity::{DeviceIdentity, Header, check_value};

/// The largest table (ToolsModule, 99 words) fits.
const MAX_WORDS: usize = 128;

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, the bytes in memory order.
const fn uuid(text: &str) -> [u8; 16] {
    let text = text.as_bytes();
    let mut out = [0u8; 16];
    let (mut i, mut n) = (0, 0);
    while i < text.len() {
        if text[i] != b'-' {
            let digit = match text[i] {
                b'0'..=b'9' => text[i] - b'0',
                b'a'..=b'f' => text[i] - b'a' + 10,
                _ => panic!("bad hex digit in a table UUID"),
            };
            out[n / 2] |= if n % 2 == 0 { digit << 4 } else { digit };
            n += 1;
        }
        i += 1;
    }
    assert!(n == 32, "a table UUID has 32 hex digits");
    out
}

/// A table as the caller sees it.
#[repr(C)]
pub struct Table<const N: usize>(pub [Address; N]);

const NULL: Address = Address(std::ptr::null());

/// Word `index` of table `table` when Flyt does not implement it.
extern "C" fn stub<const TABLE: usize, const INDEX: usize>() -> CUresult {
    boundary("export table stub", || {
        let uuid = TABLES.get(TABLE).map_or_else(String::new, |t| format_uuid(&t.uuid));
        crate::diagnostics::once(
            &format!("table:{uuid}:{INDEX}"),
            &format!("flyt: export table {uuid} entry {INDEX} is not implemented (returning CUDA_ERROR_NOT_SUPPORTED)"),
        );
        CUresult::CUDA_ERROR_NOT_SUPPORTED
    })
}

macro_rules! stub_words {
    ($table:ident; $($index:literal)*) => {
        [$(Address(stub::<$table, $index> as *const c_void)),*]
    };
}

const fn stubs<const TABLE: usize>() -> [Address; MAX_WORDS] {
    stub_words!(TABLE;
        0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38
        39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74
        75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94 95 96 97 98 99 100 101 102 103 104 105 106 107
        108 109 110 111 112 113 114 115 116 117 118 119 120 121 122 123 124 125 126 127)
}

/// Table `TABLE` of `N` words: the size word (if `sized`), `entries` where given, stubs elsewhere.
const fn build<const TABLE: usize, const N: usize>(sized: bool, entries: &[(usize, Address)]) -> Table<N> {
    let all = stubs::<TABLE>();
    let mut words = [NULL; N];
    let mut i = 0;
    while i < N {
        words[i] = all[i];
        i += 1;
    }
    if sized {
        words[0] = Address(std::ptr::without_provenance(N * size_of::<usize>()));
    }
    let mut e = 0;
    while e < entries.len() {
        words[entries[e].0] = entries[e].1;
        e += 1;
    }
    Table(words)
}

/// One table: its UUID, a name for diagnostics, and its address.
pub struct ExportTable {
    pub uuid: [u8; 16],
    pub name: &'static str,
    pub words: usize,
    pub sized: bool,
    pub address: Address,
}

macro_rules! tables {
    ($( $index:literal $static:ident $name:literal $uuid:literal [$words:literal $sized:ident] { $($entry:literal => $f:expr),* $(,)? } )*) => {
        $(
            pub static $static: Table<$words> = build::<$index, $words>(
                tables!(@sized $sized),
                &[$(($entry, Address($f as *const c_void))),*],
            );
        )*
        /// Every table this driver serves, by index (the index is the stubs' `TABLE`).
        pub static TABLES: &[ExportTable] = &[
            $(ExportTable {
                uuid: uuid($uuid),
                name: $name,
                words: $words,
                sized: tables!(@sized $sized),
                address: Address(&$static as *const Table<$words> as *const c_void),
            },)*
        ];
        #[cfg(test)]
        const INDICES: &[usize] = &[$($index),*];
    };
    (@sized sized) => { true };
    (@sized unsized) => { false };
}

tables! {
    0 CUDART_INTERFACE "CudartInterface" "6bd5fb6c-5bf4-e74a-8987-d93912fd9df9" [13 sized] {
        1 => cudart_load_fat_binary,
        2 => cudart_primary_context,
        6 => cudart_load_fat_binary_with_relocations,
        7 => cudart_fat_binary_destroyed,
        8 => cudart_load_data_ex_hidden,
        12 => cudart_load_compilers,
    }
    1 TOOLS_RUNTIME_CALLBACK_HOOKS "ToolsRuntimeCallbackHooks" "a094798c-2e74-2e74-93f2-0800200c0a66" [7 sized] {
        2 => hooks_enable_buffer,
        6 => hooks_internal_enable_buffer,
    }
    2 TOOLS_TLS "ToolsTls" "42d85a81-23f6-cb47-8298-f6e78a3aecdc" [3 sized] {
        1 => tls_set_current,
        2 => tls_get_current,
    }
    3 CONTEXT_LOCAL_STORAGE "ContextLocalStorageInterface_v0301" "c693336e-1121-df11-a8c3-68f355d89593" [4 unsized] {
        0 => cls_register,
        1 => cls_unregister,
        2 => cls_get,
        3 => std::ptr::null::<c_void>(),
    }
    4 INTEGRITY_CHECK "IntegrityCheck" "d4082055-bde6-704b-8d34-ba123c66e1f2" [3 sized] {
        1 => integrity_check,
    }
    5 GREEN_CONTEXT "GreenContext" "263e8860-7cd2-6143-92f6-bbd5006dfa7e" [15 sized] {
        2 => green_context_type,
        3 => green_context_support_enabled,
    }
    6 TOOLS_DEVICE "ToolsDevice" "b10541e1-f7c7-c74a-9f64-f223be99f1e2" [31 sized] {
        5 => tools_device_attribute_property,
        13 => tools_device_query_ttu,
    }
    7 RUNTIME_LOG "(unnamed: the runtime's error log)" "f8cff951-2146-8b4e-b9e2-fb469e7c0dd9" [3 sized] {
        1 => runtime_log_message,
    }
    8 CTX_CREATE_BYPASS "CtxCreateBypass" "0ca50b8c-1004-929a-89a7-d0df10e77286" [2 sized] {}
    9 HYBRID_CUDART "HybridCudart" "dd9e98a4-f410-4844-99b0-e2aeb7b432b5" [3 sized] {}
    10 TOOLS_CONTEXT "ToolsContext" "21318c60-9714-3248-8ca6-41ff7324c8f2" [93 sized] {
        4 => tools_context_kind,
        39 => tools_context_stream_id,
        51 => tools_context_stream_object,
    }
    11 TOOLS_MODULE "ToolsModule" "6e163fbe-b958-444d-835c-e182aff1991e" [99 sized] {
        7 => tools_module_each_function,
    }
    12 TOOLS_MEMORY "ToolsMemory" "bfdb432d-bf3c-5a4a-945e-b34029e81e75" [60 sized] {}
    13 TOOLS_MEM_COPY "ToolsMemCopy" "35770f1b-092e-0348-a48e-056fc423968d" [10 sized] {}
    14 PYTORCH_UNKNOWN_69A28E9F "(unnamed, requested with PyTorch)" "69a28e9f-2449-8b47-b030-c5da330ea4e9" [34 sized] {}
    15 NCCL_UNKNOWN_1734DC26 "(unnamed, requested by NCCL)" "1734dc26-800d-4745-8726-c0f1e7dd8bca" [17 sized] {}
    16 NCCL_UNKNOWN_DA9151D3 "(unnamed, requested by NCCL)" "da9151d3-3ae6-cc41-a5c0-4f26d533e328" [7 sized] {}
    17 FLYT "Flyt (for Flyt's NVML)" "466c7974-4e56-4d4c-8000-000000000001" [6 sized] {
        1 => flyt_mem_info,
        2 => flyt_process_memory,
        3 => flyt_tenant_processes,
        4 => flyt_utilization,
        5 => flyt_nvlink_peer,
    }
}

/// The table with this UUID (pure lookup: no state, no connection).
pub fn find(id: &[u8; 16]) -> Option<*const c_void> {
    TABLES.iter().find(|t| &t.uuid == id).map(|t| t.address.0)
}

/// The UUID as the census and the log lines write it (memory order, grouped 4-2-2-2-6).
pub fn format_uuid(id: &[u8; 16]) -> String {
    let hex = |range: std::ops::Range<usize>| id[range].iter().map(|b| format!("{b:02x}")).collect::<String>();
    format!("{}-{}-{}-{}-{}", hex(0..4), hex(4..6), hex(6..8), hex(8..10), hex(10..16))
}

// -- Flyt's own table (`flyt_front_kit::flyt_table`) --

/// The session for a device query that needs no context (NVML's).
fn session_for(device: c_int) -> DriverResult<&'static flyt_client::client::Client> {
    driver().session()?.device(device)?;
    flyt_client::client::client().map_err(crate::client_source::to_driver)
}

unsafe extern "C" fn flyt_mem_info(device: c_int, free: *mut u64, total: *mut u64) -> CUresult {
    boundary("Flyt[1]", || {
        finish((|| {
            let reply = session_for(device)?.call(flyt_protocol::ops::req::MemGetInfo {}).map_err(crate::client_source::to_driver)?;
            // SAFETY: the caller's out-pointers (checked by `write_out`).
            unsafe {
                write_out(free, reply.free)?;
                write_out(total, reply.total)
            }
        })())
    })
}

unsafe extern "C" fn flyt_process_memory(device: c_int, bytes: *mut u64) -> CUresult {
    boundary("Flyt[2]", || {
        finish((|| {
            let held = session_for(device)?.allocated_bytes();
            // SAFETY: the caller's out-pointer (checked by `write_out`).
            unsafe { write_out(bytes, held) }
        })())
    })
}

unsafe extern "C" fn flyt_tenant_processes(device: c_int, pids: *mut u32, bytes: *mut u64, count: *mut u32) -> CUresult {
    boundary("Flyt[3]", || {
        finish((|| {
            if count.is_null() {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            let reply = session_for(device)?.call(flyt_protocol::ops::req::TenantProcesses {}).map_err(crate::client_source::to_driver)?;
            // SAFETY: the caller's in/out count, checked non-NULL above.
            let room = unsafe { *count } as usize;
            if room > 0 && (pids.is_null() || bytes.is_null()) {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            for (index, process) in reply.processes.iter().take(room).enumerate() {
                // SAFETY: `index < room`, the number of entries the caller's arrays hold.
                unsafe {
                    pids.add(index).write(process.pid);
                    bytes.add(index).write(process.device_bytes);
                }
            }
            // SAFETY: as above.
            unsafe { write_out(count, u32::try_from(reply.processes.len()).unwrap_or(u32::MAX)) }
        })())
    })
}

unsafe extern "C" fn flyt_utilization(device: c_int, kernels: *mut u32, copies: *mut u32) -> CUresult {
    boundary("Flyt[4]", || {
        finish((|| {
            let reply =
                session_for(device)?.call(flyt_protocol::ops::req::TenantUtilization {}).map_err(crate::client_source::to_driver)?;
            // SAFETY: the caller's out-pointers (checked by `write_out`).
            unsafe {
                write_out(kernels, reply.kernels)?;
                write_out(copies, reply.copies)
            }
        })())
    })
}

unsafe extern "C" fn flyt_nvlink_peer(device: c_int, link: u32, far_end: *mut c_int) -> CUresult {
    use flyt_front_kit::flyt_table::{NVLINK_INACTIVE, NVLINK_SWITCH};
    use flyt_protocol::device::NvLinkEnd;
    boundary("Flyt[5]", || {
        finish((|| {
            let client = session_for(device)?;
            let device = usize::try_from(device).map_err(|_| CUresult::CUDA_ERROR_INVALID_DEVICE)?;
            let end = client.nvlink(device, link as usize).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
            let value = match end {
                NvLinkEnd::Device(index) => c_int::try_from(index).unwrap_or(NVLINK_INACTIVE),
                NvLinkEnd::Switch => NVLINK_SWITCH,
                NvLinkEnd::Inactive => NVLINK_INACTIVE,
            };
            // SAFETY: the caller's out-pointer (checked by `write_out`).
            unsafe { write_out(far_end, value) }
        })())
    })
}

// -- CudartInterface --

unsafe extern "C" fn cudart_load_fat_binary(module: *mut CUmodule, fat_cubin: *const c_void) -> CUresult {
    // SAFETY: the runtime passes its out-pointer and a registered fat binary.
    boundary("CudartInterface[1]", || unsafe { crate::api::module::load_fat_binary(module, fat_cubin) })
}

/// Entry 2: the device's primary context, neither retained nor activated (the real driver's behaviour:
/// `cuDevicePrimaryCtxGetState` still reports it inactive afterwards).
unsafe extern "C" fn cudart_primary_context(ctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    boundary("CudartInterface[2]", || {
        finish((|| {
            let driver = driver();
            driver.session()?;
            let primary = driver.contexts.primary(dev)?;
            // SAFETY: the runtime passes NULL or a writable CUcontext.
            unsafe { write_out(ctx, primary.handle()) }
        })())
    })
}

unsafe extern "C" fn cudart_load_fat_binary_with_relocations(
    module: *mut CUmodule,
    fat_cubin: *const c_void,
    symbol_names: *const *const std::ffi::c_char,
    symbol_addresses: *mut *mut c_void,
    count: c_uint,
) -> CUresult {
    // SAFETY: as entry 1, with the runtime's relocation arrays.
    boundary("CudartInterface[6]", || unsafe {
        crate::api::module::load_fat_binary_with_relocations(module, fat_cubin, symbol_names, symbol_addresses, count)
    })
}

/// Entry 7: the runtime forgets a fat binary; nothing is cached for it yet.
extern "C" fn cudart_fat_binary_destroyed(_fat_cubin: *const c_void) {}

/// Entry 8: a module hidden from tools, with JIT options (note the argument order: image first).
unsafe extern "C" fn cudart_load_data_ex_hidden(
    image: *const c_void,
    module: *mut CUmodule,
    options: *mut CUjit_option,
    option_values: *mut *mut c_void,
    count: c_uint,
) -> CUresult {
    // SAFETY: the runtime's image, out-pointer and JIT option arrays.
    boundary("CudartInterface[8]", || unsafe { crate::api::cuModuleLoadDataEx(module, image, count, options, option_values) })
}

/// Entry 12 (CUDA 13.1 runtimes): load the JIT compilers; nothing to do in the client.
extern "C" fn cudart_load_compilers() -> CUresult {
    CUresult::CUDA_SUCCESS
}

// -- ToolsRuntimeCallbackHooks: callback-enable flags, all zero (no tool attached) --

/// Zeroed flags in writable memory (a tool would set them; the runtime polls them).
pub struct EnableBuffer<const N: usize>([AtomicU32; N]);

pub static ENABLE_BUFFER: EnableBuffer<1024> = EnableBuffer([const { AtomicU32::new(0) }; 1024]);
pub static INTERNAL_ENABLE_BUFFER: EnableBuffer<14> = EnableBuffer([const { AtomicU32::new(0) }; 14]);

unsafe fn hand_out<const N: usize>(buffer: &'static EnableBuffer<N>, out: *mut *mut u32, count: *mut usize) {
    if !out.is_null() {
        // SAFETY: non-NULL; the runtime passes a writable pointer. The buffer is `static`, so the pointer
        // stays valid; `AtomicU32` has the layout of `u32`.
        unsafe { out.write(buffer.0.as_ptr().cast_mut().cast()) };
    }
    if !count.is_null() {
        // SAFETY: non-NULL; the runtime passes a writable size_t.
        unsafe { count.write(N) };
    }
}

unsafe extern "C" fn hooks_enable_buffer(out: *mut *mut u32, count: *mut usize) {
    // SAFETY: forwarded contract.
    boundary("ToolsRuntimeCallbackHooks[2]", || unsafe { hand_out(&ENABLE_BUFFER, out, count) })
}

unsafe extern "C" fn hooks_internal_enable_buffer(out: *mut *mut u32, count: *mut usize) {
    // SAFETY: forwarded contract.
    boundary("ToolsRuntimeCallbackHooks[6]", || unsafe { hand_out(&INTERNAL_ENABLE_BUFFER, out, count) })
}

// -- ToolsTls: the current context, as cuCtxSetCurrent/cuCtxGetCurrent --

unsafe extern "C" fn tls_set_current(ctx: CUcontext) -> CUresult {
    // SAFETY: the caller's contract is cuCtxSetCurrent's.
    boundary("ToolsTls[1]", || unsafe { crate::api::cuCtxSetCurrent(ctx) })
}

unsafe extern "C" fn tls_get_current(pctx: *mut CUcontext) -> CUresult {
    // SAFETY: the caller's contract is cuCtxGetCurrent's.
    boundary("ToolsTls[2]", || unsafe { crate::api::cuCtxGetCurrent(pctx) })
}

// -- context-local storage (NULL context: the calling thread's current one) --

fn cls_context(ctx: CUcontext) -> DriverResult<&'static crate::context::Context> {
    let driver = driver();
    driver.alive()?;
    driver.contexts.lookup_or_current(ctx)
}

unsafe extern "C" fn cls_register(ctx: CUcontext, key: *mut c_void, data: *mut c_void, destroy: ClsDestroy) -> CUresult {
    boundary("ContextLocalStorage[0]", || finish(cls_context(ctx).and_then(|c| c.cls_register(key, data, destroy))))
}

unsafe extern "C" fn cls_unregister(ctx: CUcontext, key: *mut c_void) -> CUresult {
    boundary("ContextLocalStorage[1]", || finish(cls_context(ctx).and_then(|c| c.cls_unregister(key))))
}

/// A missing key is CUDA_ERROR_INVALID_HANDLE and leaves `*data` alone; no context is
/// CUDA_ERROR_INVALID_CONTEXT (both as from the real driver).
unsafe extern "C" fn cls_get(data: *mut *mut c_void, ctx: CUcontext, key: *mut c_void) -> CUresult {
    boundary("ContextLocalStorage[2]", || {
        finish((|| {
            let value = cls_context(ctx)?.cls_get(key)?;
            // SAFETY: the runtime passes a writable pointer (NULL is refused).
            unsafe { write_out(data, value) }
        })())
    })
}

// -- the integrity check --

/// What this process reports, hashed as the runtime will hash what it observes.
pub fn integrity_inputs(version: u32, unix_seconds: u64) -> (Header, Vec<DeviceIdentity>) {
    let driver = driver();
    // SAFETY: getpid and pthread_self have no preconditions.
    let (process, thread) = unsafe { (libc::getpid() as u32, libc::pthread_self() as u32) };
    // After cuInit the devices are opened here if nothing opened them yet (the runtime hashes the
    // devices it can see); before cuInit there are none.
    let devices = driver.session().ok().map_or_else(Vec::new, |session| {
        session
            .devices
            .iter()
            .map(|info| {
                let a = |id| info.attribute(id).unwrap_or(0);
                DeviceIdentity {
                    uuid: info.uuid,
                    pci_domain: a(flyt_protocol::device::attr::PCI_DOMAIN_ID),
                    pci_bus: a(flyt_protocol::device::attr::PCI_BUS_ID),
                    pci_device: a(flyt_protocol::device::attr::PCI_DEVICE_ID),
                }
            })
            .collect()
    });
    let header = Header {
        driver_version: driver.driver_version() as u32,
        version,
        process,
        thread,
        cudart_table: CUDART_INTERFACE_ADDRESS.0 as u64,
        integrity_table: INTEGRITY_CHECK_ADDRESS.0 as u64,
        check_function: INTEGRITY_CHECK.0[1].0 as u64,
        unix_seconds,
    };
    (header, devices)
}

const CUDART_INTERFACE_ADDRESS: Address = Address(&CUDART_INTERFACE as *const Table<13> as *const c_void);
const INTEGRITY_CHECK_ADDRESS: Address = Address(&INTEGRITY_CHECK as *const Table<3> as *const c_void);

unsafe extern "C" fn integrity_check(version: u32, unix_seconds: u64, out: *mut [u64; 2]) -> CUresult {
    boundary("IntegrityCheck[1]", || {
        let (header, devices) = integrity_inputs(version, unix_seconds);
        // SAFETY: the runtime passes NULL or a writable pair of u64.
        finish(unsafe { write_out(out, check_value(&header, &devices)) })
    })
}

// -- GreenContext --

/// Entry 2 (`cuCtxGetType`): a plain context is type 0, and `primary` is written only for green
/// contexts. What the driver answers for a green context's context has not been measured yet, so
/// one answers as a plain context (its public API, `cuStreamGetCtx_v2`, `cuStreamGetGreenCtx` and
/// ToolsContext entry 4, tells it apart).
unsafe extern "C" fn green_context_type(ctx: CUcontext, kind: *mut c_uint, _primary: *mut CUcontext) -> CUresult {
    boundary("GreenContext[2]", || {
        finish((|| {
            let driver = driver();
            driver.alive()?;
            driver.contexts.lookup_or_current(ctx)?;
            // SAFETY: the caller passes NULL or a writable unsigned int.
            unsafe { write_out(kind, 0) }
        })())
    })
}

/// Entry 3: whether the primary context supports green contexts: no.
extern "C" fn green_context_support_enabled() -> c_int {
    0
}

// -- ToolsDevice --

/// Entry 5: a device attribute as a tools variant `{value, 0}`.
unsafe extern "C" fn tools_device_attribute_property(
    dev: CUdevice,
    attribute: c_int,
    _property: c_int,
    value: *mut [usize; 2],
) -> CUresult {
    boundary("ToolsDevice[5]", || {
        finish((|| {
            let session = driver().session()?;
            let id = u32::try_from(attribute).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
            let v = session.device(dev)?.attribute(id).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
            // SAFETY: the caller passes NULL or a writable pair of words.
            unsafe { write_out(value, [i64::from(v) as usize, 0]) }
        })())
    })
}

/// Entry 13: the TTU query answers 0.
unsafe extern "C" fn tools_device_query_ttu(out: *mut u8, dev: CUdevice) -> CUresult {
    boundary("ToolsDevice[13]", || {
        finish((|| {
            driver().session()?.device(dev)?;
            // SAFETY: the caller passes NULL or a writable byte.
            unsafe { write_out(out, 0) }
        })())
    })
}

// -- the runtime's error log --

/// Entry 1: the runtime files an error message (its component name, a level, a printf format and
/// its `va_list`) with the driver, for `cuLogsDumpToMemory`. Flyt keeps no driver log: the message
/// is dropped and the runtime's own error return is unchanged (it ignores this result).
extern "C" fn runtime_log_message(_component: *const c_char, _level: c_int, _format: *const c_char, _args: *mut c_void) -> CUresult {
    CUresult::CUDA_SUCCESS
}

// -- ToolsContext (cuBLAS, cuBLASLt, cuSOLVER, cuFFT, PyTorch) --

/// Entry 4, called before most library calls: what kind of context `ctx` is, as a 64-bit word:
/// 1 a primary context, 2 a created one, 3 a green one (`cuCtxFromGreenCtx`'s), 0 for NULL
/// (measured on driver 580 by `gpu-tests/probes/tools_probe.c`).
unsafe extern "C" fn tools_context_kind(ctx: CUcontext, out: *mut u64) -> CUresult {
    boundary("ToolsContext[4]", || {
        finish((|| {
            let driver = driver();
            driver.alive()?;
            let kind = if ctx.is_null() {
                0
            } else {
                let ctx = driver.contexts.lookup(ctx)?;
                if ctx.is_primary() {
                    1
                } else if ctx.green().is_some() {
                    3
                } else {
                    2
                }
            };
            // SAFETY: the caller passes NULL or a writable 64-bit word.
            unsafe { write_out(out, kind) }
        })())
    })
}

/// What entry 51 hands out for a stream: laid out as the driver's own stream object begins
/// (`{1, 0, ctx, 0, 0, 1, 0, 0}`, measured), in case a library reads it.
#[repr(C)]
pub struct StreamObject {
    driver_words: [u64; 8],
}

/// The stream objects handed out, kept for the life of the process (one per stream ever asked
/// about: the libraries hold on to them), found both ways in O(1): both entries run per library
/// call.
#[derive(Default)]
struct StreamObjects {
    by_stream: HashMap<u64, &'static StreamObject>,
    /// An object's address to its stream's id (only an address handed out here is ever read).
    ids: HashMap<usize, u64>,
}

static STREAM_OBJECTS: Mutex<Option<StreamObjects>> = Mutex::new(None);

/// Entry 51 (cuBLAS and cuSOLVER, per call): the object behind a stream handle (NULL: the legacy
/// stream), which entry 39 takes.
unsafe extern "C" fn tools_context_stream_object(
    ctx: CUcontext,
    stream: CUstream,
    out: *mut *const StreamObject,
    _flags: c_uint,
) -> CUresult {
    boundary("ToolsContext[51]", || {
        finish((|| {
            let context = driver().contexts.lookup_or_current(ctx)?;
            context.usable()?;
            let id = crate::api::stream_id(stream, false)?;
            let mut guard = STREAM_OBJECTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let objects = guard.get_or_insert_with(StreamObjects::default);
            let object: &'static StreamObject = match objects.by_stream.get(&id) {
                Some(object) => object,
                None => {
                    let object = &*Box::leak(Box::new(StreamObject { driver_words: [1, 0, context.handle() as u64, 0, 0, 1, 0, 0] }));
                    objects.by_stream.insert(id, object);
                    objects.ids.insert(std::ptr::from_ref(object) as usize, id);
                    object
                }
            };
            // SAFETY: the caller passes NULL or a writable pointer; the object is never freed.
            unsafe { write_out(out, std::ptr::from_ref(object)) }
        })())
    })
}

/// Entry 39: the id of a stream object from entry 51, as `cuStreamGetId` reports it (measured).
unsafe extern "C" fn tools_context_stream_id(ctx: CUcontext, object: *const StreamObject, out: *mut u64) -> CUresult {
    boundary("ToolsContext[39]", || {
        finish((|| {
            driver().contexts.lookup_or_current(ctx)?.usable()?;
            let objects = STREAM_OBJECTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let id = objects.as_ref().and_then(|o| o.ids.get(&(object as usize))).copied().ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
            // SAFETY: the caller passes NULL or a writable 64-bit word.
            unsafe { write_out(out, id) }
        })())
    })
}

// -- ToolsModule (cuFFT) --

/// Entry 7: calls `visit(opaque, function, name)` for each kernel of `module`, in the driver's
/// order, and returns how many it visited (measured: the result is a count, not a CUresult; the
/// callback returns nothing). An error visits nothing and returns 0.
unsafe extern "C" fn tools_module_each_function(
    _ctx: CUcontext,
    module: CUmodule,
    visit: Option<crate::api::module::EachFunction>,
    opaque: *mut c_void,
) -> usize {
    boundary("ToolsModule[7]", || {
        let Some(visit) = visit else { return 0 };
        crate::api::module::each_function(module, visit, opaque).unwrap_or(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(table: &ExportTable) -> &'static [Address] {
        // SAFETY: `address` points at a `Table` of `words` words (built by `tables!`).
        unsafe { std::slice::from_raw_parts(table.address.0.cast::<Address>(), table.words) }
    }

    #[test]
    fn tables_have_the_real_driver_sizes_and_stable_addresses() {
        assert_eq!(INDICES, (0..TABLES.len()).collect::<Vec<_>>().as_slice());
        for table in TABLES {
            let w = words(table);
            if table.sized {
                assert_eq!(w[0].0 as usize, table.words * 8, "{}", table.name);
            }
            assert!(w[1..].iter().all(|e| !e.0.is_null()) || !table.sized, "{}", table.name);
            assert_eq!(find(&table.uuid), Some(table.address.0));
            assert_eq!(find(&table.uuid), find(&table.uuid));
        }
        let cls = TABLES.iter().find(|t| t.name.starts_with("ContextLocalStorage")).unwrap();
        let w = words(cls);
        assert!(w[..3].iter().all(|e| !e.0.is_null()) && w[3].0.is_null(), "3 functions then NULL, no size");
        assert_eq!(format_uuid(&TABLES[0].uuid), "6bd5fb6c-5bf4-e74a-8987-d93912fd9df9");
        // Flyt's own table is where Flyt's other fronts look for it, as long as they expect.
        let flyt = TABLES.iter().find(|table| table.uuid == flyt_front_kit::flyt_table::UUID).expect("Flyt's table");
        assert_eq!(flyt.words, flyt_front_kit::flyt_table::WORDS);
        assert!(find(&uuid("195bcbf4-d67d-024a-acc5-1d29cea631ae")).is_none(), "absent on Linux");
    }

    #[test]
    fn stubs_know_their_slot_and_answer_not_supported() {
        let f: extern "C" fn() -> CUresult =
            // SAFETY: slot 5 of ToolsContext is a `stub`, whose type is `extern "C" fn() -> CUresult`.
            unsafe { std::mem::transmute(TOOLS_CONTEXT.0[5].0) };
        assert_eq!(f(), CUresult::CUDA_ERROR_NOT_SUPPORTED);
        assert_ne!(TOOLS_CONTEXT.0[5].0, TOOLS_CONTEXT.0[6].0);
        assert_ne!(TOOLS_CONTEXT.0[5].0, TOOLS_MODULE.0[5].0);
    }

    #[test]
    fn callback_hooks_hand_out_zeroed_buffers_with_entry_counts() {
        let (mut buffer, mut count) = (std::ptr::null_mut(), 0usize);
        // SAFETY: valid out-pointers; the buffer is read within its reported length.
        unsafe {
            hooks_enable_buffer(&mut buffer, &mut count);
            assert_eq!(count, 1024);
            assert!(std::slice::from_raw_parts(buffer, count).iter().all(|&f| f == 0));
            hooks_internal_enable_buffer(&mut buffer, &mut count);
            assert_eq!(count, 14);
            assert!(std::slice::from_raw_parts(buffer, count).iter().all(|&f| f == 0));
        }
    }

    // Device 0 of the unit tests' global fake driver belongs to this test.
    #[test]
    fn cudart_entry_2_does_not_activate_the_primary_context() {
        // SAFETY: valid out-pointers.
        unsafe {
            assert_eq!(crate::api::cuInit(0), CUresult::CUDA_SUCCESS);
            let mut ctx: CUcontext = std::ptr::null_mut();
            assert_eq!(cudart_primary_context(&mut ctx, 0), CUresult::CUDA_SUCCESS);
            let (mut flags, mut active) = (0, 7);
            assert_eq!(crate::api::cuDevicePrimaryCtxGetState(0, &mut flags, &mut active), CUresult::CUDA_SUCCESS);
            assert_eq!(active, 0);
            let mut retained: CUcontext = std::ptr::null_mut();
            assert_eq!(crate::api::cuDevicePrimaryCtxRetain(&mut retained, 0), CUresult::CUDA_SUCCESS);
            assert_eq!(retained, ctx);
            assert_eq!(crate::api::cuDevicePrimaryCtxRelease_v2(0), CUresult::CUDA_SUCCESS);

            // Context-local storage on it, through the table.
            let key = 0x1234usize as *mut c_void;
            let mut data: *mut c_void = 9usize as *mut c_void;
            assert_eq!(cls_get(&mut data, ctx, key), CUresult::CUDA_ERROR_INVALID_HANDLE);
            assert_eq!(data as usize, 9, "untouched on a missing key");
            assert_eq!(cls_get(&mut data, std::ptr::null_mut(), key), CUresult::CUDA_ERROR_INVALID_CONTEXT);
            assert_eq!(cls_register(ctx, key, 42usize as *mut c_void, None), CUresult::CUDA_SUCCESS);
            assert_eq!(tls_set_current(ctx), CUresult::CUDA_SUCCESS);
            assert_eq!(cls_get(&mut data, std::ptr::null_mut(), key), CUresult::CUDA_SUCCESS);
            assert_eq!(data as usize, 42);
            let mut current: CUcontext = std::ptr::null_mut();
            assert_eq!(tls_get_current(&mut current), CUresult::CUDA_SUCCESS);
            assert_eq!(current, ctx);
            let mut kind = 9;
            assert_eq!(green_context_type(std::ptr::null_mut(), &mut kind, std::ptr::null_mut()), CUresult::CUDA_SUCCESS);
            assert_eq!(kind, 0);
            assert_eq!(cls_unregister(ctx, key), CUresult::CUDA_SUCCESS);
            assert_eq!(tls_set_current(std::ptr::null_mut()), CUresult::CUDA_SUCCESS);

            let mut variant = [7usize, 7];
            assert_eq!(tools_device_attribute_property(0, 16, 0, &mut variant), CUresult::CUDA_SUCCESS);
            assert_eq!(variant, [132, 0]);
        }
    }

    #[test]
    fn integrity_check_hashes_what_this_library_reports() {
        // SAFETY: valid out-pointers.
        unsafe {
            assert_eq!(crate::api::cuInit(0), CUresult::CUDA_SUCCESS);
            let mut out = [0u64; 2];
            assert_eq!(integrity_check(13000, 1_700_000_000, &mut out), CUresult::CUDA_SUCCESS);
            assert_eq!(out, [0x3341181c03cb675c, 0x8ed383aa1f4cd1e8]);
            assert_eq!(integrity_check(13002, 1_700_000_000, &mut out), CUresult::CUDA_SUCCESS);
        }
        let (header, devices) = integrity_inputs(13002, 1_700_000_000);
        assert_eq!(devices.len(), crate::testing::GLOBAL_FAKE_DEVICES);
        assert_eq!(devices[1].pci_bus, 0x11);
        assert_eq!(header.cudart_table, find(&TABLES[0].uuid).unwrap() as u64);
        assert_eq!(header.integrity_table, find(&TABLES[4].uuid).unwrap() as u64);
        assert_eq!(header.driver_version, 13000);
        let mut out = [0u64; 2];
        // SAFETY: valid out-pointer.
        unsafe { integrity_check(13002, 1_700_000_000, &mut out) };
        assert_eq!(out, check_value(&header, &devices));
    }
}
