//! No op answers success for a bad id, pointer, range or value: the op table walked on the
//! emulated device. For every op, requests that each get one input wrong (an unknown stream,
//! event, module or kernel; a pointer or range outside the session's memory; a flag or limit
//! the device does not have) must come back as the right CUDA error: in the reply, or, for an
//! op that has none, as the session's deferred error at the next synchronization (once). Ops that
//! take no input that could be wrong have a check of what they did instead. A new op without an
//! entry here does not compile (`probes!` has no rule for it).

#![allow(clippy::tests_outside_test_module, reason = "an integration test crate: every function in it is a test")]

use flyt_protocol::CudaError;
use flyt_protocol::frame::{FrameLimits, read_full, read_message};
use flyt_protocol::handshake::Notice;
use flyt_protocol::ops::{
    ArrayDesc, ArrayMap, Copy3d, CopySide, DecompressOp, Dim3, FunctionRef, HostCopy, JitOption, Memset2d, NodeParams, NodeReadback, Op,
    OpClass, OpInfo, Pos3, Request, Resource, SERVER_NODE_BIT, ShapedCopy, StreamMemOp, Subresource, TensorMapLayout, TensorMapParams,
    TextureDesc, array_flags, array_format, capture_status, decompress_algorithm, dev_resource, mem_op, mem_usage, node_type, rep, req,
    split_reply,
};

mod raw;
use raw::{RawSession, emulated_server};

const BOGUS_POINTER: u64 = 0xdead_0000;
const BOGUS_HANDLE: u64 = 0x7777_7777;
const BOGUS_FUNCTION: FunctionRef = FunctionRef { module: 4242, index: 0 };

/// Handles and memory that exist, so a probe can get exactly one input wrong.
struct Valid {
    ptr: u64,
    len: u64,
    stream: u64,
    event: u64,
    untimed_event: u64,
    unrecorded_event: u64,
}

/// One request and what must come of it.
enum Probe {
    /// Must fail with this error (in the reply, or deferred to the next synchronization).
    Refused { request: Request, bulk: Vec<u8>, error: CudaError },
    /// The op takes nothing that could be wrong: check its effect in a session of its own.
    Effect(fn(&str)),
}

fn refused(request: impl Into<Request>, error: CudaError) -> Probe {
    Probe::Refused { request: request.into(), bulk: Vec::new(), error }
}

fn refused_with_bulk(request: impl Into<Request>, bulk: &[u8], error: CudaError) -> Probe {
    Probe::Refused { request: request.into(), bulk: bulk.to_vec(), error }
}

const INVALID_VALUE: CudaError = CudaError::INVALID_VALUE;
const UNKNOWN_HANDLE: CudaError = CudaError::INVALID_RESOURCE_HANDLE;
const UNKNOWN_FUNCTION: CudaError = CudaError::INVALID_DEVICE_FUNCTION;
/// The driver's `CUDA_ERROR_INVALID_CONTEXT` (201 in both numberings).
const INVALID_CONTEXT: CudaError = CudaError::DEVICE_UNINITIALIZED;

/// A well-formed shareable handle naming a socket no worker serves.
fn unserved_shareable() -> Vec<u8> {
    let mut shareable = b"FLYTSHR1".to_vec();
    shareable.extend_from_slice(&[9; 16]);
    shareable.push(19);
    shareable.extend_from_slice(b"flyt-vmm-1-nobody00");
    shareable
}

/// Export data of a pool allocation as Flyt makes it, with `token`.
fn export_data(token: &[u8; 16]) -> Vec<u8> {
    let mut data = b"FLYTPTR1".to_vec();
    data.extend_from_slice(token);
    data.resize(64, 0);
    data
}

/// The probes of one op, by its name in the table.
macro_rules! probes {
    (Malloc, $v:ident) => {
        vec![refused(req::Malloc { size: u64::MAX }, CudaError::MEMORY_ALLOCATION)]
    };
    (Free, $v:ident) => {
        vec![refused(req::Free { ptr: $v.ptr + 8 }, INVALID_VALUE), refused(req::Free { ptr: BOGUS_POINTER }, INVALID_VALUE)]
    };
    (MemGetInfo, $v:ident) => {
        vec![Probe::Effect(mem_get_info_counts_allocations)]
    };
    (MemcpyHtoD, $v:ident) => {
        vec![
            refused_with_bulk(req::MemcpyHtoD { dst: BOGUS_POINTER, stream: 0 }, &[1; 16], INVALID_VALUE),
            refused_with_bulk(req::MemcpyHtoD { dst: $v.ptr + $v.len - 8, stream: 0 }, &[1; 16], INVALID_VALUE),
            refused_with_bulk(req::MemcpyHtoD { dst: $v.ptr, stream: BOGUS_HANDLE }, &[1; 16], UNKNOWN_HANDLE),
        ]
    };
    (MemcpyDtoH, $v:ident) => {
        vec![
            refused(req::MemcpyDtoH { src: BOGUS_POINTER, len: 16, stream: 0, blocking: true }, INVALID_VALUE),
            refused(req::MemcpyDtoH { src: $v.ptr + 1, len: $v.len, stream: 0, blocking: true }, INVALID_VALUE),
            refused(req::MemcpyDtoH { src: $v.ptr, len: 16, stream: BOGUS_HANDLE, blocking: true }, UNKNOWN_HANDLE),
            refused(req::MemcpyDtoH { src: $v.ptr, len: u64::MAX, stream: 0, blocking: true }, INVALID_VALUE),
        ]
    };
    // Striped copies: checked like the plain ones; a valid one in a session that opened no data
    // connection is refused rather than waiting for chunks that never come.
    (MemcpyHtoDStriped, $v:ident) => {
        vec![
            refused(req::MemcpyHtoDStriped { dst: BOGUS_POINTER, len: 16, stream: 0, transfer: 1, chunk: 1 << 20 }, INVALID_VALUE),
            refused(req::MemcpyHtoDStriped { dst: $v.ptr + 1, len: $v.len, stream: 0, transfer: 1, chunk: 1 << 20 }, INVALID_VALUE),
            refused(req::MemcpyHtoDStriped { dst: $v.ptr, len: 16, stream: BOGUS_HANDLE, transfer: 1, chunk: 1 << 20 }, UNKNOWN_HANDLE),
            refused(req::MemcpyHtoDStriped { dst: $v.ptr, len: 16, stream: 0, transfer: 1, chunk: 1 << 20 }, CudaError::NOT_SUPPORTED),
        ]
    };
    (MemcpyDtoHStriped, $v:ident) => {
        vec![
            refused(
                req::MemcpyDtoHStriped {
                    src: BOGUS_POINTER,
                    len: 16,
                    stream: 0,
                    transfer: 1,
                    chunk: 1 << 20,
                    blocking: true,
                    compress: false,
                },
                INVALID_VALUE,
            ),
            refused(
                req::MemcpyDtoHStriped {
                    src: $v.ptr,
                    len: 16,
                    stream: BOGUS_HANDLE,
                    transfer: 1,
                    chunk: 1 << 20,
                    blocking: true,
                    compress: false,
                },
                UNKNOWN_HANDLE,
            ),
            refused(
                req::MemcpyDtoHStriped { src: $v.ptr, len: 16, stream: 0, transfer: 1, chunk: 1 << 20, blocking: true, compress: false },
                CudaError::NOT_SUPPORTED,
            ),
        ]
    };
    (MemcpyDtoD, $v:ident) => {
        vec![
            refused(req::MemcpyDtoD { dst: BOGUS_POINTER, src: $v.ptr, len: 16, stream: 0 }, INVALID_VALUE),
            refused(req::MemcpyDtoD { dst: $v.ptr, src: BOGUS_POINTER, len: 16, stream: 0 }, INVALID_VALUE),
            refused(req::MemcpyDtoD { dst: $v.ptr, src: $v.ptr + 1, len: $v.len, stream: 0 }, INVALID_VALUE),
            refused(req::MemcpyDtoD { dst: $v.ptr, src: $v.ptr, len: 16, stream: BOGUS_HANDLE }, UNKNOWN_HANDLE),
        ]
    };
    (Memset, $v:ident) => {
        vec![
            refused(req::Memset { dst: BOGUS_POINTER, pattern: 0, width: 1, len: 16, stream: 0 }, INVALID_VALUE),
            refused(req::Memset { dst: $v.ptr + $v.len - 1, pattern: 0, width: 1, len: 2, stream: 0 }, INVALID_VALUE),
            refused(req::Memset { dst: $v.ptr, pattern: 0, width: 1, len: 16, stream: BOGUS_HANDLE }, UNKNOWN_HANDLE),
            refused(req::Memset { dst: $v.ptr, pattern: 0, width: 3, len: 12, stream: 0 }, INVALID_VALUE),
            refused(req::Memset { dst: $v.ptr + 2, pattern: 0, width: 4, len: 8, stream: 0 }, INVALID_VALUE),
            refused(req::Memset { dst: $v.ptr, pattern: 0, width: 4, len: 6, stream: 0 }, INVALID_VALUE),
        ]
    };
    (RegisterModule, $v:ident) => {
        // The emulated device loads no GPU code; a GPU's driver refuses a garbage image too.
        vec![
            refused_with_bulk(req::RegisterModule { module: 1, cached: None }, b"not a fatbinary", CudaError::NOT_SUPPORTED),
            // A digest and bytes at once: which image is meant is ambiguous.
            refused_with_bulk(req::RegisterModule { module: 2, cached: Some([1; 32]) }, b"bytes too", INVALID_VALUE),
        ]
    };
    (UnregisterModule, $v:ident) => {
        vec![refused(req::UnregisterModule { module: 4242 }, INVALID_VALUE)]
    };
    (Launch, $v:ident) => {
        vec![refused(
            req::Launch {
                function: BOGUS_FUNCTION,
                grid: Dim3 { x: 1, y: 1, z: 1 },
                block: Dim3 { x: 1, y: 1, z: 1 },
                shared_mem: 0,
                stream: 0,
                args: Vec::new(),
                attributes: Vec::new(),
            },
            UNKNOWN_FUNCTION,
        )]
    };
    (FuncGetAttributes, $v:ident) => {
        vec![refused(req::FuncGetAttributes { function: BOGUS_FUNCTION }, UNKNOWN_FUNCTION)]
    };
    (FuncSetAttribute, $v:ident) => {
        vec![refused(req::FuncSetAttribute { function: BOGUS_FUNCTION, attribute: 8, value: 0 }, UNKNOWN_FUNCTION)]
    };
    (OccupancyMaxActiveBlocks, $v:ident) => {
        vec![refused(
            req::OccupancyMaxActiveBlocks { function: BOGUS_FUNCTION, block_size: 128, dynamic_shared_mem: 0, flags: 0 },
            UNKNOWN_FUNCTION,
        )]
    };
    (StreamCreate, $v:ident) => {
        vec![
            refused(req::StreamCreate { stream: 0, flags: 0, priority: 0 }, INVALID_VALUE),
            refused(req::StreamCreate { stream: $v.stream, flags: 0, priority: 0 }, INVALID_VALUE),
            refused(req::StreamCreate { stream: BOGUS_HANDLE + 1, flags: 0x80, priority: 0 }, INVALID_VALUE),
        ]
    };
    (StreamDestroy, $v:ident) => {
        vec![
            refused(req::StreamDestroy { stream: BOGUS_HANDLE }, UNKNOWN_HANDLE),
            refused(req::StreamDestroy { stream: 0 }, UNKNOWN_HANDLE),
        ]
    };
    (StreamSynchronize, $v:ident) => {
        vec![refused(req::StreamSynchronize { stream: BOGUS_HANDLE }, UNKNOWN_HANDLE)]
    };
    (StreamQuery, $v:ident) => {
        vec![refused(req::StreamQuery { stream: BOGUS_HANDLE }, UNKNOWN_HANDLE)]
    };
    (StreamWaitEvent, $v:ident) => {
        vec![
            refused(req::StreamWaitEvent { stream: BOGUS_HANDLE, event: $v.event, flags: 0 }, UNKNOWN_HANDLE),
            refused(req::StreamWaitEvent { stream: $v.stream, event: BOGUS_HANDLE, flags: 0 }, UNKNOWN_HANDLE),
            refused(req::StreamWaitEvent { stream: $v.stream, event: $v.event, flags: 0x2 }, INVALID_VALUE),
        ]
    };
    (EventCreate, $v:ident) => {
        vec![
            refused(req::EventCreate { event: 0, flags: 0 }, INVALID_VALUE),
            refused(req::EventCreate { event: $v.event, flags: 0 }, INVALID_VALUE),
            refused(req::EventCreate { event: BOGUS_HANDLE + 2, flags: 0x8 }, INVALID_VALUE),
            // cudaEventInterprocess without cudaEventDisableTiming.
            refused(req::EventCreate { event: BOGUS_HANDLE + 3, flags: 0x4 }, INVALID_VALUE),
        ]
    };
    (EventRecord, $v:ident) => {
        vec![
            refused(req::EventRecord { event: BOGUS_HANDLE, stream: $v.stream, flags: 0 }, UNKNOWN_HANDLE),
            refused(req::EventRecord { event: $v.event, stream: BOGUS_HANDLE, flags: 0 }, UNKNOWN_HANDLE),
            refused(req::EventRecord { event: $v.event, stream: $v.stream, flags: 0x2 }, INVALID_VALUE),
        ]
    };
    (EventSynchronize, $v:ident) => {
        vec![refused(req::EventSynchronize { event: BOGUS_HANDLE }, UNKNOWN_HANDLE)]
    };
    (EventQuery, $v:ident) => {
        vec![refused(req::EventQuery { event: BOGUS_HANDLE }, UNKNOWN_HANDLE)]
    };
    (EventElapsedTime, $v:ident) => {
        vec![
            refused(req::EventElapsedTime { start: BOGUS_HANDLE, end: $v.event }, UNKNOWN_HANDLE),
            refused(req::EventElapsedTime { start: $v.event, end: BOGUS_HANDLE }, UNKNOWN_HANDLE),
            // CUDA: an event without timing, or never recorded, has no time.
            refused(req::EventElapsedTime { start: $v.event, end: $v.untimed_event }, UNKNOWN_HANDLE),
            refused(req::EventElapsedTime { start: $v.unrecorded_event, end: $v.event }, UNKNOWN_HANDLE),
        ]
    };
    (EventDestroy, $v:ident) => {
        vec![refused(req::EventDestroy { event: BOGUS_HANDLE }, UNKNOWN_HANDLE)]
    };
    (DeviceSynchronize, $v:ident) => {
        vec![Probe::Effect(device_synchronize_delivers_a_deferred_error_once)]
    };
    (DeviceReset, $v:ident) => {
        vec![Probe::Effect(device_reset_frees_everything)]
    };
    (DeviceSetLimit, $v:ident) => {
        vec![
            refused(req::DeviceSetLimit { limit: 99, value: 1 }, CudaError::UNSUPPORTED_LIMIT),
            // cudaLimitDevRuntimeSyncDepth: not on a compute capability 9.0 device.
            refused(req::DeviceSetLimit { limit: 3, value: 4 }, CudaError::UNSUPPORTED_LIMIT),
        ]
    };
    (DeviceGetLimit, $v:ident) => {
        vec![refused(req::DeviceGetLimit { limit: 99 }, CudaError::UNSUPPORTED_LIMIT)]
    };
    // This session has no shared-memory segment: every segment op is refused (bad offsets in a
    // session that has one are `robustness.rs`'s).
    (ShmRegister, $v:ident) => {
        vec![refused(req::ShmRegister { offset: 0, len: 4096, mapped_at: 0 }, CudaError::NOT_SUPPORTED)]
    };
    (ShmUnregister, $v:ident) => {
        vec![refused(req::ShmUnregister { offset: 0 }, CudaError::NOT_SUPPORTED)]
    };
    (ShmFileTicket, $v:ident) => {
        vec![refused(req::ShmFileTicket {}, CudaError::NOT_SUPPORTED)]
    };
    (ShmRegisterFile, $v:ident) => {
        vec![refused(req::ShmRegisterFile { token: [7; 16], file_offset: 0, len: 4096, mapped_at: 1 << 40 }, CudaError::NOT_SUPPORTED)]
    };
    (ShmUnregisterFile, $v:ident) => {
        vec![refused(req::ShmUnregisterFile { mapped_at: 1 << 40 }, CudaError::NOT_SUPPORTED)]
    };
    (ShmCopyHtoD, $v:ident) => {
        vec![refused(req::ShmCopyHtoD { dst: $v.ptr, offset: 0, len: 16, stream: 0 }, CudaError::NOT_SUPPORTED)]
    };
    (ShmCopyDtoH, $v:ident) => {
        vec![refused(req::ShmCopyDtoH { src: $v.ptr, offset: 0, len: 16, stream: 0 }, CudaError::NOT_SUPPORTED)]
    };
    (ShmFence, $v:ident) => {
        vec![refused(req::ShmFence { stream: BOGUS_HANDLE }, UNKNOWN_HANDLE)]
    };
    (StreamPriorityRange, $v:ident) => {
        vec![Probe::Effect(stream_priority_range_is_ordered)]
    };
    (ModuleGetFunction, $v:ident) => {
        vec![refused(req::ModuleGetFunction { module: 4242, name: "kernel".into() }, UNKNOWN_FUNCTION)]
    };
    (ModuleGetGlobal, $v:ident) => {
        vec![refused(req::ModuleGetGlobal { module: 4242, name: "symbol".into() }, CudaError::INVALID_RESOURCE_HANDLE)]
    };
    (OccupancyAvailableDynamicSmem, $v:ident) => {
        vec![refused(req::OccupancyAvailableDynamicSmem { function: BOGUS_FUNCTION, num_blocks: 1, block_size: 128 }, UNKNOWN_FUNCTION)]
    };
    // A JIT option carrying a host pointer (a log buffer) must never reach the server's driver.
    (LinkCreate, $v:ident) => {
        vec![
            refused(
                req::LinkCreate { link: 1, options: vec![JitOption { option: 3, value: 0x1000 }], info_log: 0, error_log: 0 },
                INVALID_VALUE,
            ),
            Probe::Effect(a_link_on_the_emulated_device_fails_with_its_reason),
        ]
    };
    (LinkAdd, $v:ident) => {
        vec![refused_with_bulk(
            req::LinkAdd { link: BOGUS_HANDLE, kind: 1, name: "input".into(), options: Vec::new() },
            b".version 8.0",
            UNKNOWN_HANDLE,
        )]
    };
    (LinkComplete, $v:ident) => {
        vec![refused(req::LinkComplete { link: BOGUS_HANDLE }, UNKNOWN_HANDLE)]
    };
    (LinkRead, $v:ident) => {
        vec![refused(req::LinkRead { link: BOGUS_HANDLE, offset: 0, len: 16 }, UNKNOWN_HANDLE)]
    };
    (ModuleFunctionNames, $v:ident) => {
        vec![refused(req::ModuleFunctionNames { module: 4242 }, UNKNOWN_HANDLE)]
    };
    (FuncSetCacheConfig, $v:ident) => {
        vec![refused(req::FuncSetCacheConfig { function: BOGUS_FUNCTION, config: 1 }, UNKNOWN_FUNCTION)]
    };
    (DeviceSetCacheConfig, $v:ident) => {
        vec![refused(req::DeviceSetCacheConfig { config: 4 }, CudaError::INVALID_VALUE), Probe::Effect(cache_config_is_kept)]
    };
    (DeviceGetCacheConfig, $v:ident) => {
        vec![Probe::Effect(cache_config_is_kept)]
    };
    (ProfilerControl, $v:ident) => {
        vec![Probe::Effect(profiler_start_and_stop_answer_as_without_a_profiler)]
    };
    (ResetPersistingL2Cache, $v:ident) => {
        vec![Probe::Effect(profiler_start_and_stop_answer_as_without_a_profiler)]
    };
    (LinkDestroy, $v:ident) => {
        vec![refused(req::LinkDestroy { link: BOGUS_HANDLE }, UNKNOWN_HANDLE)]
    };
    (OccupancyMaxActiveClusters, $v:ident) => {
        vec![refused(
            req::OccupancyMaxActiveClusters {
                function: BOGUS_FUNCTION,
                grid: Dim3 { x: 2, y: 1, z: 1 },
                block: Dim3 { x: 128, y: 1, z: 1 },
                shared_mem: 0,
                attributes: Vec::new(),
            },
            UNKNOWN_FUNCTION,
        )]
    };
    // --- stream-ordered allocation ---
    (MemAllocAsync, $v:ident) => {
        vec![
            refused(req::MemAllocAsync { size: 4096, stream: BOGUS_HANDLE, pool: 0 }, UNKNOWN_HANDLE),
            refused(req::MemAllocAsync { size: 4096, stream: 0, pool: BOGUS_HANDLE }, INVALID_VALUE),
            refused(req::MemAllocAsync { size: u64::MAX, stream: 0, pool: 0 }, CudaError::MEMORY_ALLOCATION),
            Probe::Effect(stream_ordered_allocations_count_in_the_quota),
            Probe::Effect(captured_allocations_are_graph_memory),
            Probe::Effect(graph_memory_lives_with_the_executable_graph),
        ]
    };
    // --- several devices: this server has one ---
    (SetDevice, $v:ident) => {
        vec![
            refused(req::SetDevice { index: 1 }, CudaError::INVALID_DEVICE),
            refused(req::SetDevice { index: u32::MAX }, CudaError::INVALID_DEVICE),
        ]
    };
    (PeerAccess, $v:ident) => {
        vec![
            refused(req::PeerAccess { peer: 0, enable: true, flags: 0 }, CudaError::INVALID_DEVICE),
            refused(req::PeerAccess { peer: 3, enable: false, flags: 0 }, CudaError::INVALID_DEVICE),
        ]
    };
    (MemFreeAsync, $v:ident) => {
        vec![refused(req::MemFreeAsync { ptr: BOGUS_POINTER, stream: 0 }, INVALID_VALUE)]
    };
    (MemPoolAttribute, $v:ident) => {
        vec![
            refused(req::MemPoolAttribute { pool: BOGUS_HANDLE, attribute: 4, value: None }, INVALID_VALUE),
            refused(req::MemPoolAttribute { pool: 1, attribute: 99, value: None }, INVALID_VALUE),
        ]
    };
    (MemPoolTrim, $v:ident) => {
        vec![refused(req::MemPoolTrim { pool: BOGUS_HANDLE, keep: 0 }, INVALID_VALUE)]
    };
    (MemPoolCreate, $v:ident) => {
        // The default pool's id, and a shareable handle type other than a POSIX descriptor.
        vec![
            refused(req::MemPoolCreate { pool: 1, handle_types: 0 }, INVALID_VALUE),
            refused(req::MemPoolCreate { pool: 77, handle_types: 0x8 }, INVALID_VALUE),
        ]
    };
    (MemPoolDestroy, $v:ident) => {
        // The default pool is the device's, not the app's to destroy.
        vec![refused(req::MemPoolDestroy { pool: 1 }, INVALID_VALUE), refused(req::MemPoolDestroy { pool: BOGUS_HANDLE }, INVALID_VALUE)]
    };
    (DeviceMemPool, $v:ident) => {
        vec![refused(req::DeviceMemPool { set: Some(BOGUS_HANDLE) }, INVALID_VALUE)]
    };
    // --- virtual memory management: a tenant maps, unmaps and frees only what it made ---
    (MemGranularity, $v:ident) => {
        vec![Probe::Effect(virtual_memory_maps_physical_allocations_into_reserved_ranges)]
    };
    (MemAddressReserve, $v:ident) => {
        vec![refused(req::MemAddressReserve { size: 0, alignment: 0, addr: 0 }, INVALID_VALUE)]
    };
    (MemAddressFree, $v:ident) => {
        vec![refused(req::MemAddressFree { ptr: $v.ptr, size: $v.len }, INVALID_VALUE)]
    };
    (MemCreate, $v:ident) => {
        vec![
            refused(req::MemCreate { handle: 0, size: 2 << 20, handle_types: 0, usage: 0 }, INVALID_VALUE),
            refused(
                req::MemCreate { handle: 7, size: u64::MAX & !((2 << 20) - 1), handle_types: 0, usage: 0 },
                CudaError::MEMORY_ALLOCATION,
            ),
            // A usage CUDA does not define.
            refused(req::MemCreate { handle: 7, size: 2 << 20, handle_types: 0, usage: 0x8 }, INVALID_VALUE),
        ]
    };
    (MemExport, $v:ident) => {
        vec![refused(req::MemExport { handle: BOGUS_HANDLE }, INVALID_VALUE)]
    };
    // --- memory pools shared between sessions: only pools made with the POSIX handle type, only
    // live allocations of theirs, only exports their exporter still serves ---
    (MemPoolExport, $v:ident) => {
        // The default pool has no shareable handle type.
        vec![
            refused(req::MemPoolExport { pool: BOGUS_HANDLE }, INVALID_VALUE),
            refused(req::MemPoolExport { pool: 1 }, INVALID_VALUE),
            Probe::Effect(a_pool_allocation_is_shared_between_sessions),
        ]
    };
    (MemPoolImport, $v:ident) => {
        vec![
            refused(req::MemPoolImport { pool: 1, shareable: unserved_shareable() }, INVALID_VALUE),
            refused(req::MemPoolImport { pool: 900, shareable: vec![0; 40] }, INVALID_VALUE),
            refused(req::MemPoolImport { pool: 900, shareable: unserved_shareable() }, INVALID_VALUE),
        ]
    };
    (MemPoolExportPointer, $v:ident) => {
        // cuMemAlloc memory is no pool's.
        vec![
            refused(req::MemPoolExportPointer { ptr: BOGUS_POINTER }, INVALID_VALUE),
            refused(req::MemPoolExportPointer { ptr: $v.ptr }, INVALID_VALUE),
        ]
    };
    (MemPoolImportPointer, $v:ident) => {
        // Only into a pool imported from another session.
        vec![
            refused(req::MemPoolImportPointer { pool: 1, data: export_data(&[7; 16]) }, INVALID_VALUE),
            refused(req::MemPoolImportPointer { pool: BOGUS_HANDLE, data: export_data(&[7; 16]) }, INVALID_VALUE),
        ]
    };
    (MemImport, $v:ident) => {
        // A shareable must name a live export of some worker, with its token.
        vec![
            refused(req::MemImport { handle: 0, shareable: unserved_shareable() }, INVALID_VALUE),
            refused(req::MemImport { handle: 9, shareable: vec![0; 40] }, INVALID_VALUE),
            refused(req::MemImport { handle: 9, shareable: unserved_shareable() }, INVALID_VALUE),
        ]
    };
    (Texture1DLinearMaxWidth, $v:ident) => {
        // The emulated device has no texture hardware to describe.
        vec![refused(req::Texture1DLinearMaxWidth { format: 0x20, channels: 1 }, CudaError::NOT_SUPPORTED)]
    };
    (AtomicCapabilities, $v:ident) => {
        vec![
            refused(req::AtomicCapabilities { operations: Vec::new(), peer: false }, INVALID_VALUE),
            refused(req::AtomicCapabilities { operations: vec![0; 4096], peer: true }, INVALID_VALUE),
        ]
    };
    (TenantProcesses, $v:ident) => {
        vec![Probe::Effect(tenant_processes_are_the_sessions_apps)]
    };
    (TenantUtilization, $v:ident) => {
        vec![Probe::Effect(tenant_utilization_counts_queued_copies)]
    };
    (MemRelease, $v:ident) => {
        vec![refused(req::MemRelease { handle: BOGUS_HANDLE }, INVALID_VALUE)]
    };
    (MemMap, $v:ident) => {
        vec![refused(req::MemMap { ptr: $v.ptr, size: $v.len, offset: 0, handle: BOGUS_HANDLE }, INVALID_VALUE)]
    };
    (MemUnmap, $v:ident) => {
        // An allocation of cudaMalloc is no mapping.
        vec![refused(req::MemUnmap { ptr: $v.ptr, size: $v.len }, INVALID_VALUE)]
    };
    (MemSetAccess, $v:ident) => {
        vec![refused(req::MemSetAccess { ptr: $v.ptr, size: $v.len, flags: 3 }, INVALID_VALUE)]
    };
    // --- graphs: every id is the client's and checked; bad ones never reach the driver ---
    (StreamBeginCapture, $v:ident) => {
        vec![
            refused(
                req::StreamBeginCapture {
                    stream: BOGUS_HANDLE,
                    mode: 0,
                    thread_mode: 0,
                    graph: 9,
                    into: false,
                    dependencies: Vec::new(),
                    data: Vec::new(),
                },
                UNKNOWN_HANDLE,
            ),
            refused(
                req::StreamBeginCapture {
                    stream: $v.stream,
                    mode: 0,
                    thread_mode: 0,
                    graph: 0,
                    into: false,
                    dependencies: Vec::new(),
                    data: Vec::new(),
                },
                INVALID_VALUE,
            ),
            refused(
                req::StreamBeginCapture {
                    stream: $v.stream,
                    mode: 0,
                    thread_mode: 0,
                    graph: SERVER_NODE_BIT | 9,
                    into: false,
                    dependencies: Vec::new(),
                    data: Vec::new(),
                },
                INVALID_VALUE,
            ),
            refused(
                req::StreamBeginCapture {
                    stream: $v.stream,
                    mode: 7,
                    thread_mode: 0,
                    graph: 9,
                    into: false,
                    dependencies: Vec::new(),
                    data: Vec::new(),
                },
                INVALID_VALUE,
            ),
            // The legacy stream synchronizes with every stream: it cannot be captured.
            refused(
                req::StreamBeginCapture {
                    stream: 0,
                    mode: 0,
                    thread_mode: 0,
                    graph: 9,
                    into: false,
                    dependencies: Vec::new(),
                    data: Vec::new(),
                },
                CudaError::STREAM_CAPTURE_UNSUPPORTED,
            ),
            // Into a graph the session does not have, or after a node that is not in it.
            refused(
                req::StreamBeginCapture {
                    stream: $v.stream,
                    mode: 0,
                    thread_mode: 0,
                    graph: 9,
                    into: true,
                    dependencies: Vec::new(),
                    data: Vec::new(),
                },
                INVALID_VALUE,
            ),
            // Edge data annotates dependencies: a new graph has none.
            refused(
                req::StreamBeginCapture {
                    stream: $v.stream,
                    mode: 0,
                    thread_mode: 0,
                    graph: 9,
                    into: false,
                    dependencies: Vec::new(),
                    data: vec![[0, 0, 0]],
                },
                INVALID_VALUE,
            ),
            Probe::Effect(a_capture_into_an_existing_graph_follows_its_nodes),
            Probe::Effect(a_capture_records_stream_work_into_a_graph),
            Probe::Effect(a_capture_that_met_a_host_copy_ends_invalidated),
        ]
    };
    (StreamEndCapture, $v:ident) => {
        vec![
            refused(req::StreamEndCapture { stream: BOGUS_HANDLE }, UNKNOWN_HANDLE),
            refused(req::StreamEndCapture { stream: $v.stream }, CudaError::ILLEGAL_STATE),
        ]
    };
    (StreamCaptureDependencies, $v:ident) => {
        vec![
            refused(
                req::StreamCaptureDependencies { stream: BOGUS_HANDLE, dependencies: Vec::new(), data: Vec::new(), set: true },
                UNKNOWN_HANDLE,
            ),
            // Not capturing.
            refused(
                req::StreamCaptureDependencies { stream: $v.stream, dependencies: Vec::new(), data: Vec::new(), set: true },
                CudaError::ILLEGAL_STATE,
            ),
        ]
    };
    (StreamCaptureInfo, $v:ident) => {
        vec![refused(req::StreamCaptureInfo { stream: BOGUS_HANDLE }, UNKNOWN_HANDLE)]
    };
    (CaptureMode, $v:ident) => {
        vec![refused(req::CaptureMode { mode: 9 }, INVALID_VALUE)]
    };
    (GraphCreate, $v:ident) => {
        vec![refused(req::GraphCreate { graph: 0 }, INVALID_VALUE), refused(req::GraphCreate { graph: SERVER_NODE_BIT | 1 }, INVALID_VALUE)]
    };
    (GraphDestroy, $v:ident) => {
        vec![refused(req::GraphDestroy { graph: BOGUS_HANDLE }, INVALID_VALUE)]
    };
    (GraphAddNode, $v:ident) => {
        vec![
            refused(req::GraphAddNode { graph: BOGUS_HANDLE, node: 1, dependencies: Vec::new(), params: NodeParams::Empty }, INVALID_VALUE),
            Probe::Effect(graph_nodes_are_checked_before_the_driver_sees_them),
            Probe::Effect(a_graph_of_copies_runs_in_dependency_order),
        ]
    };
    (GraphEdges, $v:ident) => {
        vec![refused(req::GraphEdges { graph: BOGUS_HANDLE, from: vec![1], to: vec![2], data: vec![], remove: false }, INVALID_VALUE)]
    };
    (GraphNodes, $v:ident) => {
        vec![refused(req::GraphNodes { graph: BOGUS_HANDLE, roots: false }, INVALID_VALUE)]
    };
    (GraphClone, $v:ident) => {
        vec![refused(req::GraphClone { graph: BOGUS_HANDLE, clone: 5 }, INVALID_VALUE)]
    };
    (GraphInstantiate, $v:ident) => {
        vec![refused(req::GraphInstantiate { graph: BOGUS_HANDLE, exec: 5, flags: 0 }, INVALID_VALUE)]
    };
    (GraphLaunch, $v:ident) => {
        vec![refused(req::GraphLaunch { exec: BOGUS_HANDLE, stream: 0 }, INVALID_VALUE)]
    };
    (GraphUpload, $v:ident) => {
        vec![refused(req::GraphUpload { exec: BOGUS_HANDLE, stream: 0 }, INVALID_VALUE)]
    };
    (GraphExecDestroy, $v:ident) => {
        vec![refused(req::GraphExecDestroy { exec: BOGUS_HANDLE }, INVALID_VALUE)]
    };
    (GraphExecUpdate, $v:ident) => {
        vec![refused(req::GraphExecUpdate { exec: BOGUS_HANDLE, graph: BOGUS_HANDLE }, INVALID_VALUE)]
    };
    (GraphNodeSetParams, $v:ident) => {
        vec![refused(req::GraphNodeSetParams { exec: 0, node: BOGUS_HANDLE, params: NodeParams::Empty }, INVALID_VALUE)]
    };
    (GraphDotPrint, $v:ident) => {
        vec![refused(req::GraphDotPrint { graph: BOGUS_HANDLE, flags: 0 }, INVALID_VALUE)]
    };
    (GraphDestroyNode, $v:ident) => {
        vec![refused(req::GraphDestroyNode { node: BOGUS_HANDLE }, INVALID_VALUE)]
    };
    (GraphConditionalHandle, $v:ident) => {
        vec![refused(req::GraphConditionalHandle { graph: BOGUS_HANDLE, default_value: 0, flags: 0 }, INVALID_VALUE)]
    };
    (GraphNodeLinks, $v:ident) => {
        vec![refused(req::GraphNodeLinks { node: BOGUS_HANDLE, dependents: true }, INVALID_VALUE)]
    };
    (GraphGetEdges, $v:ident) => {
        vec![refused(req::GraphGetEdges { graph: BOGUS_HANDLE }, INVALID_VALUE)]
    };
    (GraphNodeEnabled, $v:ident) => {
        vec![refused(req::GraphNodeEnabled { exec: BOGUS_HANDLE, node: BOGUS_HANDLE, set: Some(false) }, INVALID_VALUE)]
    };
    (GraphNodeObject, $v:ident) => {
        vec![refused(req::GraphNodeObject { node: BOGUS_HANDLE }, INVALID_VALUE)]
    };
    (GraphMemAttribute, $v:ident) => {
        vec![
            refused(req::GraphMemAttribute { attribute: 99, set: None }, INVALID_VALUE),
            refused(req::GraphMemAttribute { attribute: 0, set: Some(5) }, INVALID_VALUE),
        ]
    };
    (GraphNodeGetParams, $v:ident) => {
        vec![
            refused(req::GraphNodeGetParams { node: BOGUS_HANDLE }, INVALID_VALUE),
            Probe::Effect(captured_nodes_read_back_their_parameters),
        ]
    };
    (GraphKernelNodeAttribute, $v:ident) => {
        vec![
            refused(req::GraphKernelNodeAttribute { node: BOGUS_HANDLE, attribute: 8, set: None }, INVALID_VALUE),
            refused(req::GraphKernelNodeAttribute { node: BOGUS_HANDLE, attribute: 99, set: None }, INVALID_VALUE),
            refused(req::GraphKernelNodeAttribute { node: BOGUS_HANDLE, attribute: 7, set: Some(vec![0; 64]) }, CudaError::NOT_SUPPORTED),
            refused(req::GraphKernelNodeAttribute { node: BOGUS_HANDLE, attribute: 8, set: Some(vec![0; 8]) }, INVALID_VALUE),
            refused(
                req::GraphKernelNodeAttribute { node: BOGUS_HANDLE, attribute: 1, set: Some(access_window(BOGUS_POINTER, 4096)) },
                INVALID_VALUE,
            ),
            Probe::Effect(kernel_node_attributes_refuse_other_nodes),
        ]
    };
    (GraphKernelNodeCopyAttributes, $v:ident) => {
        vec![refused(req::GraphKernelNodeCopyAttributes { dst: BOGUS_HANDLE, src: BOGUS_HANDLE }, INVALID_VALUE)]
    };
    (Pause, $v:ident) => {
        vec![Probe::Effect(an_unasked_pause_changes_nothing)]
    };
    (Goodbye, $v:ident) => {
        vec![Probe::Effect(a_goodbye_ends_the_session)]
    };
    (GraphMemTrim, $v:ident) => {
        vec![Probe::Effect(graph_memory_trim_answers)]
    };
    (LaunchHostFunc, $v:ident) => {
        vec![
            refused(req::LaunchHostFunc { stream: BOGUS_HANDLE, call: 1 }, UNKNOWN_HANDLE),
            Probe::Effect(a_host_call_holds_its_stream_until_answered),
        ]
    };
    (HostCallDone, $v:ident) => {
        // Only a run the server is waiting for can be answered.
        vec![refused(req::HostCallDone { run: 4242 }, INVALID_VALUE)]
    };
    (CaptureHostCopy, $v:ident) => {
        vec![
            refused(req::CaptureHostCopy { stream: BOGUS_HANDLE, copy: host_copy(0x1000, $v.ptr, 64, true) }, UNKNOWN_HANDLE),
            // Not capturing.
            refused(req::CaptureHostCopy { stream: $v.stream, copy: host_copy(0x1000, $v.ptr, 64, true) }, INVALID_VALUE),
            Probe::Effect(host_copy_nodes_run_through_the_client),
        ]
    };
    (HostCopyDone, $v:ident) => {
        // Only a host-to-device copy's run the server is waiting for, with its bytes.
        vec![refused(req::HostCopyDone { run: 4242 }, INVALID_VALUE)]
    };
    // --- pitched memory, shaped copies, arrays, textures and surfaces ---
    (MallocPitch, $v:ident) => {
        vec![
            refused(req::MallocPitch { width: 100, height: 4, element_size: 3 }, INVALID_VALUE),
            refused(req::MallocPitch { width: 1 << 40, height: 1 << 20, element_size: 4 }, CudaError::MEMORY_ALLOCATION),
            Probe::Effect(shaped_copies_move_boxes_between_host_pitched_memory_and_arrays),
        ]
    };
    (Memset2D, $v:ident) => {
        vec![
            refused(
                req::Memset2D { set: Memset2d { dst: $v.ptr, pitch: 512, value: 1, element_size: 1, width: 64, height: 9 }, stream: 0 },
                INVALID_VALUE,
            ),
            refused(
                req::Memset2D { set: Memset2d { dst: $v.ptr, pitch: 32, value: 1, element_size: 1, width: 64, height: 2 }, stream: 0 },
                INVALID_VALUE,
            ),
            refused(
                req::Memset2D {
                    set: Memset2d { dst: $v.ptr, pitch: 64, value: 1, element_size: 1, width: 64, height: 2 },
                    stream: BOGUS_HANDLE,
                },
                UNKNOWN_HANDLE,
            ),
        ]
    };
    (MemcpyShaped, $v:ident) => {
        vec![
            refused(
                req::MemcpyShaped { copy: device_box($v.ptr, 512, 512, 64, 9, 1, CopySide::Array { array: BOGUS_HANDLE }), stream: 0 },
                INVALID_VALUE,
            ),
            refused(
                req::MemcpyShaped {
                    copy: device_box($v.ptr, 512, 512, 64, 9, 1, CopySide::Device { ptr: $v.ptr, pitch: 64, height: 8 }),
                    stream: 0,
                },
                INVALID_VALUE,
            ),
            refused(
                req::MemcpyShaped {
                    copy: device_box($v.ptr, 32, 4, 64, 2, 1, CopySide::Device { ptr: $v.ptr, pitch: 64, height: 2 }),
                    stream: 0,
                },
                INVALID_VALUE,
            ),
        ]
    };
    (MemcpyHtoShaped, $v:ident) => {
        vec![
            refused_with_bulk(
                req::MemcpyHtoShaped {
                    copy: host_box(false, CopySide::Device { ptr: BOGUS_POINTER, pitch: 16, height: 1 }, 16, 1),
                    stream: 0,
                },
                &[1; 16],
                INVALID_VALUE,
            ),
            // The bulk must be exactly the packed box.
            refused_with_bulk(
                req::MemcpyHtoShaped { copy: host_box(false, CopySide::Device { ptr: $v.ptr, pitch: 16, height: 2 }, 16, 2), stream: 0 },
                &[1; 16],
                INVALID_VALUE,
            ),
        ]
    };
    (MemcpyShapedToH, $v:ident) => {
        vec![
            refused(
                req::MemcpyShapedToH { copy: host_box(true, CopySide::Array { array: BOGUS_HANDLE }, 16, 1), stream: 0, blocking: true },
                INVALID_VALUE,
            ),
            refused(
                req::MemcpyShapedToH {
                    copy: host_box(true, CopySide::Device { ptr: $v.ptr, pitch: 16, height: 1 }, 16, 1),
                    stream: BOGUS_HANDLE,
                    blocking: true,
                },
                UNKNOWN_HANDLE,
            ),
        ]
    };
    (ShmCopyShaped, $v:ident) => {
        // This session has no shared-memory segment.
        vec![refused(
            req::ShmCopyShaped {
                copy: host_box(true, CopySide::Device { ptr: $v.ptr, pitch: 16, height: 1 }, 16, 1),
                offset: 0,
                stream: 0,
            },
            CudaError::NOT_SUPPORTED,
        )]
    };
    (ArrayCreate, $v:ident) => {
        vec![
            refused(req::ArrayCreate { array: 0, desc: float_array(8, 8), levels: None }, INVALID_VALUE),
            refused(req::ArrayCreate { array: 5, desc: ArrayDesc { channels: 3, ..float_array(8, 8) }, levels: None }, INVALID_VALUE),
            refused(
                req::ArrayCreate { array: 5, desc: ArrayDesc { format: 0x91, ..float_array(8, 8) }, levels: None },
                CudaError::NOT_SUPPORTED,
            ),
            refused(req::ArrayCreate { array: 5, desc: float_array(1 << 30, 1 << 20), levels: None }, CudaError::MEMORY_ALLOCATION),
        ]
    };
    (ArrayDestroy, $v:ident) => {
        vec![refused(req::ArrayDestroy { array: BOGUS_HANDLE }, INVALID_VALUE)]
    };
    (MipmappedArrayLevel, $v:ident) => {
        vec![refused(req::MipmappedArrayLevel { mipmap: BOGUS_HANDLE, level: 0, array: 9 }, INVALID_VALUE)]
    };
    (TexObjectCreate, $v:ident) => {
        vec![
            refused(
                req::TexObjectCreate { resource: Resource::Array { array: BOGUS_HANDLE }, texture: TextureDesc::default(), view: None },
                INVALID_VALUE,
            ),
            // Past the allocation's end is allowed (as the driver allows); memory not the
            // session's, or an extent past the address space, is not.
            refused(
                req::TexObjectCreate {
                    resource: Resource::Linear { ptr: 0x10, format: 0x20, channels: 1, size: 4 },
                    texture: TextureDesc::default(),
                    view: None,
                },
                INVALID_VALUE,
            ),
            refused(
                req::TexObjectCreate {
                    resource: Resource::Linear { ptr: $v.ptr, format: 0x20, channels: 1, size: u64::MAX },
                    texture: TextureDesc::default(),
                    view: None,
                },
                INVALID_VALUE,
            ),
        ]
    };
    (SurfObjectCreate, $v:ident) => {
        vec![refused(req::SurfObjectCreate { array: BOGUS_HANDLE }, INVALID_VALUE)]
    };
    (StreamAttribute, $v:ident) => {
        vec![
            refused(req::StreamAttribute { stream: BOGUS_HANDLE, attribute: 3, set: None }, UNKNOWN_HANDLE),
            refused(req::StreamAttribute { stream: $v.stream, attribute: 2, set: None }, INVALID_VALUE),
            refused(req::StreamAttribute { stream: $v.stream, attribute: 3, set: Some(vec![0; 8]) }, INVALID_VALUE),
            refused(req::StreamAttribute { stream: $v.stream, attribute: 1, set: Some(window(BOGUS_POINTER, 4096)) }, INVALID_VALUE),
            Probe::Effect(stream_attributes_read_back_as_set),
        ]
    };
    // --- IPC: only the session's own allocations and events are exported, only its own mappings
    // closed; the emulated device's memory cannot be mapped by another worker ---
    (IpcGetMemHandle, $v:ident) => {
        vec![
            refused(req::IpcGetMemHandle { ptr: BOGUS_POINTER }, INVALID_VALUE),
            refused(req::IpcGetMemHandle { ptr: $v.ptr }, CudaError::NOT_SUPPORTED),
        ]
    };
    (IpcOpenMemHandle, $v:ident) => {
        vec![
            refused(req::IpcOpenMemHandle { handle: vec![0; 8], flags: 0 }, INVALID_VALUE),
            refused(req::IpcOpenMemHandle { handle: vec![0; 64], flags: 2 }, INVALID_VALUE),
            refused(req::IpcOpenMemHandle { handle: vec![0; 64], flags: 1 }, CudaError::NOT_SUPPORTED),
        ]
    };
    (IpcCloseMemHandle, $v:ident) => {
        // An allocation of the session's own is no mapping it opened.
        vec![refused(req::IpcCloseMemHandle { ptr: $v.ptr }, INVALID_VALUE)]
    };
    (IpcGetEventHandle, $v:ident) => {
        vec![refused(req::IpcGetEventHandle { event: BOGUS_HANDLE }, UNKNOWN_HANDLE)]
    };
    (IpcOpenEventHandle, $v:ident) => {
        vec![
            refused(req::IpcOpenEventHandle { handle: vec![0; 64], event: $v.event }, INVALID_VALUE),
            refused(req::IpcOpenEventHandle { handle: vec![0; 64], event: 0xE_0000_0777 }, CudaError::NOT_SUPPORTED),
        ]
    };
    (ObjectDestroy, $v:ident) => {
        vec![refused(req::ObjectDestroy { handle: BOGUS_HANDLE, surface: false }, INVALID_VALUE)]
    };
    // --- stream memory operations: every word in the session's memory, aligned; flags known ---
    (StreamMemOps, $v:ident) => {
        vec![
            refused(req::StreamMemOps { stream: 0, ops: vec![write32(BOGUS_POINTER, 1)] }, INVALID_VALUE),
            refused(req::StreamMemOps { stream: 0, ops: vec![write32($v.ptr + $v.len - 2, 1)] }, INVALID_VALUE),
            refused(req::StreamMemOps { stream: 0, ops: vec![write32($v.ptr + 2, 1)] }, INVALID_VALUE),
            refused(req::StreamMemOps { stream: BOGUS_HANDLE, ops: vec![write32($v.ptr, 1)] }, UNKNOWN_HANDLE),
            refused(req::StreamMemOps { stream: 0, ops: Vec::new() }, INVALID_VALUE),
            refused(req::StreamMemOps { stream: 0, ops: vec![write32($v.ptr, 1); 256] }, INVALID_VALUE),
            refused(req::StreamMemOps { stream: 0, ops: vec![StreamMemOp { kind: 9, ..write32($v.ptr, 1) }] }, INVALID_VALUE),
            refused(req::StreamMemOps { stream: 0, ops: vec![StreamMemOp { flags: 7, ..wait32($v.ptr, 0) }] }, INVALID_VALUE),
            refused(req::StreamMemOps { stream: 0, ops: vec![StreamMemOp { flags: 1, ..write32($v.ptr, 0) }] }, INVALID_VALUE),
            // Remote-write flushes: CAN_FLUSH_REMOTE_WRITES reads 0 through Flyt.
            refused(
                req::StreamMemOps { stream: 0, ops: vec![StreamMemOp { flags: mem_op::WAIT_FLUSH, ..wait32($v.ptr, 0) }] },
                CudaError::NOT_SUPPORTED,
            ),
            refused(
                req::StreamMemOps { stream: 0, ops: vec![StreamMemOp { kind: mem_op::BARRIER, address: 0, value: 0, flags: 2 }] },
                INVALID_VALUE,
            ),
            Probe::Effect(stream_memory_operations_write_and_wait),
        ]
    };
    (TensorMapEncode, $v:ident) => {
        vec![
            refused(req::TensorMapEncode { encode: tiled_map(BOGUS_POINTER) }, INVALID_VALUE),
            refused(req::TensorMapEncode { encode: tiled_map($v.ptr + $v.len - 512) }, INVALID_VALUE),
            refused(req::TensorMapEncode { encode: TensorMapParams { rank: 6, ..tiled_map($v.ptr) } }, INVALID_VALUE),
            refused(req::TensorMapEncode { encode: TensorMapParams { data_type: 99, ..tiled_map($v.ptr) } }, INVALID_VALUE),
            // In the session's memory: the emulated device has no driver to encode the GPU's
            // descriptor format.
            refused(req::TensorMapEncode { encode: tiled_map($v.ptr) }, CudaError::NOT_SUPPORTED),
        ]
    };
    (TensorMapReplaceAddress, $v:ident) => {
        vec![
            refused(req::TensorMapReplaceAddress { map: vec![0; 64], address: $v.ptr }, INVALID_VALUE),
            // A map the session did not encode: its span is unknown.
            refused(req::TensorMapReplaceAddress { map: vec![0; 128], address: $v.ptr }, INVALID_VALUE),
        ]
    };
    (ContextEvent, $v:ident) => {
        vec![
            refused(req::ContextEvent { event: BOGUS_HANDLE, wait: false }, UNKNOWN_HANDLE),
            refused(req::ContextEvent { event: BOGUS_HANDLE, wait: true }, UNKNOWN_HANDLE),
            Probe::Effect(a_context_event_records_and_waits),
        ]
    };
    (MemPoolAccess, $v:ident) => {
        vec![
            refused(req::MemPoolAccess { pool: BOGUS_HANDLE, set: None }, INVALID_VALUE),
            refused(req::MemPoolAccess { pool: 1, set: Some(7) }, INVALID_VALUE),
            Probe::Effect(a_pool_is_read_write_on_its_device),
        ]
    };
    // --- planar, sparse and deferred-mapping arrays: only the session's arrays, whole tiles of
    // its tile pools; decompression of the session's memory ---
    (ArrayGetPlane, $v:ident) => {
        vec![
            refused(req::ArrayGetPlane { array: BOGUS_HANDLE, plane: 0, plane_array: 9 }, INVALID_VALUE),
            Probe::Effect(planar_arrays_are_copied_plane_by_plane),
        ]
    };
    (ArraySparseProperties, $v:ident) => {
        vec![
            refused(req::ArraySparseProperties { array: BOGUS_HANDLE }, INVALID_VALUE),
            Probe::Effect(sparse_arrays_map_whole_tiles_of_tile_pools_only),
        ]
    };
    (ArrayMemoryRequirements, $v:ident) => {
        vec![
            refused(req::ArrayMemoryRequirements { array: BOGUS_HANDLE }, INVALID_VALUE),
            Probe::Effect(sparse_arrays_map_whole_tiles_of_tile_pools_only),
        ]
    };
    (MemMapArray, $v:ident) => {
        vec![
            refused(req::MemMapArray { maps: Vec::new(), stream: 0 }, INVALID_VALUE),
            refused(
                req::MemMapArray {
                    maps: vec![ArrayMap {
                        array: BOGUS_HANDLE,
                        mipmapped: false,
                        subresource: Subresource::Miptail { layer: 0, offset: 0, size: 65536 },
                        memory: None,
                        device_mask: 1,
                    }],
                    stream: 0,
                },
                INVALID_VALUE,
            ),
            Probe::Effect(sparse_arrays_map_whole_tiles_of_tile_pools_only),
        ]
    };
    (MemBatchDecompress, $v:ident) => {
        vec![
            refused(req::MemBatchDecompress { ops: Vec::new(), stream: 0 }, INVALID_VALUE),
            refused(req::MemBatchDecompress { ops: vec![decompress($v.ptr); 5000], stream: 0 }, INVALID_VALUE),
            refused(
                req::MemBatchDecompress { ops: vec![DecompressOp { src: BOGUS_POINTER, ..decompress($v.ptr) }], stream: 0 },
                INVALID_VALUE,
            ),
            refused(
                req::MemBatchDecompress { ops: vec![DecompressOp { src_len: $v.len + 1, ..decompress($v.ptr) }], stream: 0 },
                INVALID_VALUE,
            ),
            refused(
                req::MemBatchDecompress { ops: vec![DecompressOp { dst: $v.ptr + $v.len, ..decompress($v.ptr) }], stream: 0 },
                INVALID_VALUE,
            ),
            refused(
                req::MemBatchDecompress { ops: vec![DecompressOp { dst_act_bytes: $v.ptr + 2, ..decompress($v.ptr) }], stream: 0 },
                INVALID_VALUE,
            ),
            refused(req::MemBatchDecompress { ops: vec![DecompressOp { algo: 8, ..decompress($v.ptr) }], stream: 0 }, INVALID_VALUE),
            refused(req::MemBatchDecompress { ops: vec![DecompressOp { src_len: 0, ..decompress($v.ptr) }], stream: 0 }, INVALID_VALUE),
            refused(req::MemBatchDecompress { ops: vec![decompress($v.ptr)], stream: BOGUS_HANDLE }, UNKNOWN_HANDLE),
            Probe::Effect(a_decompression_gets_the_devices_own_answer),
        ]
    };
    (DevResourceGet, $v:ident) => {
        vec![
            refused(req::DevResourceGet { green: 0, kind: 2 }, CudaError::INVALID_RESOURCE_TYPE),
            refused(req::DevResourceGet { green: 0, kind: 0 }, CudaError::INVALID_RESOURCE_TYPE),
            refused(req::DevResourceGet { green: BOGUS_HANDLE, kind: dev_resource::SM }, INVALID_CONTEXT),
            Probe::Effect(green_contexts_partition_the_device_and_hold_streams),
        ]
    };
    (DevResourceSplit, $v:ident) => {
        vec![
            refused(req::DevResourceSplit { input: BOGUS_HANDLE, groups: Some(2), flags: 0, min_count: 8 }, INVALID_VALUE),
            refused(req::DevResourceSplit { input: 0, groups: None, flags: 0, min_count: 8 }, INVALID_VALUE),
            Probe::Effect(bad_splits_and_descriptors_are_refused),
        ]
    };
    (DevResourceDesc, $v:ident) => {
        vec![
            refused(req::DevResourceDesc { desc: 0xD_0000_0001, resources: vec![BOGUS_HANDLE] }, INVALID_VALUE),
            refused(req::DevResourceDesc { desc: 0xD_0000_0001, resources: Vec::new() }, INVALID_VALUE),
        ]
    };
    (GreenCtxCreate, $v:ident) => {
        vec![
            refused(
                req::GreenCtxCreate { green: 0x6_0000_0001, desc: BOGUS_HANDLE, flags: 1, default_stream: 0x5_0000_0100 },
                INVALID_VALUE,
            ),
            refused(req::GreenCtxCreate { green: 0x6_0000_0001, desc: 0, flags: 1, default_stream: 0x5_0000_0100 }, INVALID_VALUE),
        ]
    };
    (GreenCtxDestroy, $v:ident) => {
        vec![
            refused(req::GreenCtxDestroy { green: BOGUS_HANDLE }, INVALID_CONTEXT),
            refused(req::GreenCtxDestroy { green: 0 }, INVALID_CONTEXT),
        ]
    };
    (GreenStreamCreate, $v:ident) => {
        vec![refused(req::GreenStreamCreate { green: BOGUS_HANDLE, stream: 0x5_0000_0101, flags: 1, priority: 0 }, INVALID_CONTEXT)]
    };
    (GreenCtxEvent, $v:ident) => {
        vec![
            refused(req::GreenCtxEvent { green: BOGUS_HANDLE, event: $v.event, wait: false }, INVALID_CONTEXT),
            refused(req::GreenCtxEvent { green: BOGUS_HANDLE, event: $v.event, wait: true }, INVALID_CONTEXT),
        ]
    };
    (OccupancyMaxPotentialClusterSize, $v:ident) => {
        vec![refused(
            req::OccupancyMaxPotentialClusterSize {
                function: BOGUS_FUNCTION,
                grid: Dim3 { x: 2, y: 1, z: 1 },
                block: Dim3 { x: 128, y: 1, z: 1 },
                shared_mem: 0,
                attributes: Vec::new(),
            },
            UNKNOWN_FUNCTION,
        )]
    };
}

// Only each row's name counts here: its class (`[...]`) and fields (`{...}`) are taken whole.
macro_rules! audit_table {
    ($($(#[$doc:meta])* $id:literal $name:ident $method:ident $class:tt $request:tt -> $reply:tt;)*) => {
        /// Every op of the table with its probes.
        fn audit_table(valid: &Valid) -> Vec<(OpInfo, Vec<Probe>)> {
            vec![$((<req::$name as Op>::INFO, probes!($name, valid)),)*]
        }
    };
}

flyt_protocol::for_each_op!(audit_table);

/// Sends one refused probe and checks its error, and that the session holds no other error.
fn check_refused(session: &mut RawSession, info: OpInfo, request: Request, bulk: &[u8], error: CudaError) {
    let what = format!("{} {request:?}", info.name);
    let seq = session.send(&request, bulk);
    if info.class == OpClass::NoReply {
        let first = session.call_with_deferred(req::DeviceSynchronize {}).0;
        assert_eq!((first.result.is_ok(), first.deferred), (true, Some(error)), "{what}: not reported at the next sync");
    } else {
        let mut message = Vec::new();
        let header = read_message(&mut session.stream, &FrameLimits::default(), &mut message).expect("reply");
        assert_eq!(header.seq, seq, "{what}");
        let mut bulk_out = vec![0u8; usize::try_from(header.bulk_len).unwrap()];
        read_full(&mut session.stream, &mut bulk_out, false).unwrap();
        let (status, deferred, _) = split_reply(&message).expect("a reply");
        assert_eq!(CudaError::check(status), Err(error), "{what}");
        assert_eq!(deferred, None, "{what}: a stale deferred error");
        assert!(bulk_out.is_empty(), "{what}: a refused call sent bytes back");
    }
    // Reported once: the next synchronization is clean.
    let next = session.call_with_deferred(req::DeviceSynchronize {}).0;
    assert_eq!((next.result.is_ok(), next.deferred), (true, None), "{what}: the error stuck");
}

#[test]
fn no_op_answers_success_for_a_bad_id_pointer_range_or_value() {
    let (_server, socket) = emulated_server("op-audit", &[]);
    let mut session = RawSession::open(&socket, None).expect("session");
    let len = 4096;
    let ptr = session.call(req::Malloc { size: len }).0.expect("malloc").ptr;
    let valid =
        Valid { ptr, len, stream: 0x5_0000_0001, event: 0xE_0000_0001, untimed_event: 0xE_0000_0002, unrecorded_event: 0xE_0000_0003 };
    session.send(&req::StreamCreate { stream: valid.stream, flags: 0, priority: 0 }.into(), &[]);
    session.send(&req::EventCreate { event: valid.event, flags: 0 }.into(), &[]);
    session.send(&req::EventCreate { event: valid.untimed_event, flags: 0x2 }.into(), &[]);
    session.send(&req::EventCreate { event: valid.unrecorded_event, flags: 0 }.into(), &[]);
    session.send(&req::EventRecord { event: valid.event, stream: valid.stream, flags: 0 }.into(), &[]);
    session.send(&req::EventRecord { event: valid.untimed_event, stream: valid.stream, flags: 0 }.into(), &[]);
    let setup = session.call_with_deferred(req::DeviceSynchronize {}).0;
    assert_eq!((setup.result.is_ok(), setup.deferred), (true, None), "setup");

    let table = audit_table(&valid);
    assert_eq!(table.len(), flyt_protocol::ops::OPS.len());
    let mut refusals = 0;
    for (info, probes) in table {
        assert!(!probes.is_empty(), "{} has no probe", info.name);
        for probe in probes {
            match probe {
                Probe::Refused { request, bulk, error } => {
                    assert_eq!(request.info(), info, "a probe of {} sends another op", info.name);
                    check_refused(&mut session, info, request, &bulk, error);
                    refusals += 1;
                }
                Probe::Effect(check) => check(&socket),
            }
        }
    }
    assert!(refusals > 50, "{refusals} refusals checked");
    // The valid handles still work and the session goes on.
    let elapsed = session.call(req::EventElapsedTime { start: valid.event, end: valid.event }).0;
    assert_eq!(elapsed.map(|reply| reply.milliseconds), Ok(0.0));
    session.round_trip(0x5a);
}

fn mem_get_info_counts_allocations(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    let before = session.call(req::MemGetInfo {}).0.unwrap();
    assert!(before.free <= before.total && before.total > 0);
    let ptr = session.call(req::Malloc { size: 8 << 20 }).0.unwrap().ptr;
    let after = session.call(req::MemGetInfo {}).0.unwrap();
    assert_eq!((before.free - after.free, after.total), (8 << 20, before.total));
    session.call(req::Free { ptr }).0.unwrap();
    assert_eq!(session.call(req::MemGetInfo {}).0.unwrap().free, before.free);
}

/// Every live session of the server is listed with its app's pid and the memory it holds; a
/// closed one no longer is.
fn tenant_processes_are_the_sessions_apps(socket: &str) {
    let pid = std::process::id();
    let held = |session: &mut RawSession| -> Vec<u64> {
        let processes = session.call(req::TenantProcesses {}).0.unwrap().processes;
        let mut ours: Vec<u64> = processes.iter().filter(|process| process.pid == pid).map(|process| process.device_bytes).collect();
        ours.sort_unstable();
        ours
    };
    let mut first = RawSession::open(socket, None).unwrap();
    let mut second = RawSession::open(socket, None).unwrap();
    let ptr = first.call(req::Malloc { size: 24 << 20 }).0.unwrap().ptr;
    second.call(req::Malloc { size: 20 << 20 }).0.unwrap();
    // Other probes' sessions of this process may be listed too, with other sizes.
    let listed = held(&mut second);
    assert!(listed.contains(&(24 << 20)) && listed.contains(&(20 << 20)), "{listed:?}");
    first.call(req::Free { ptr }).0.unwrap();
    assert!(held(&mut second).contains(&0));
    drop(first);
    for _ in 0..200 {
        if !held(&mut second).contains(&0) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("a closed session is still listed: {:?}", held(&mut second));
}

/// A queued memset counts as copy time until the session sees it done, and stays in the window.
fn tenant_utilization_counts_queued_copies(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    let ptr = session.call(req::Malloc { size: 1 << 20 }).0.unwrap().ptr;
    session.send(&Request::from(req::Memset { dst: ptr, pattern: 7, width: 1, len: 1 << 20, stream: 0 }), &[]);
    let busy = session.call(req::TenantUtilization {}).0.unwrap();
    assert!((1..=100).contains(&busy.copies) && busy.kernels <= 100, "{busy:?}");
    session.call(req::DeviceSynchronize {}).0.unwrap();
    let after = session.call(req::TenantUtilization {}).0.unwrap();
    assert!((1..=100).contains(&after.copies), "{after:?}");
    // A captured memset never runs: it must not count, or the stretch would stay open for good.
    session.send(&Request::from(req::StreamCreate { stream: 77, flags: 1, priority: 0 }), &[]);
    let capture =
        req::StreamBeginCapture { stream: 77, mode: 2, thread_mode: 0, graph: 78, into: false, dependencies: Vec::new(), data: Vec::new() };
    session.call(capture).0.unwrap();
    session.send(&Request::from(req::Memset { dst: ptr, pattern: 9, width: 1, len: 1 << 20, stream: 77 }), &[]);
    session.call(req::StreamEndCapture { stream: 77 }).0.unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let later = session.call(req::TenantUtilization {}).0.unwrap();
    assert_eq!((later.kernels, later.copies), (0, 0), "a second after, with only a captured memset since");
    // A wait on the legacy stream covers the blocking streams too (as CUDA's legacy stream waits
    // for them), but not a non-blocking one.
    session.send(&Request::from(req::StreamCreate { stream: 79, flags: 0, priority: 0 }), &[]);
    session.send(&Request::from(req::Memset { dst: ptr, pattern: 3, width: 1, len: 1 << 20, stream: 79 }), &[]);
    session.call(req::StreamSynchronize { stream: 0 }).0.unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let legacy = session.call(req::TenantUtilization {}).0.unwrap();
    assert_eq!(legacy.copies, 0, "a second after a legacy-stream wait covered the blocking stream's memset");
    session.send(&Request::from(req::Memset { dst: ptr, pattern: 4, width: 1, len: 1 << 20, stream: 77 }), &[]);
    session.call(req::StreamSynchronize { stream: 0 }).0.unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let open = session.call(req::TenantUtilization {}).0.unwrap();
    assert_eq!(open.copies, 100, "a non-blocking stream's memset is not covered by a legacy-stream wait");
    session.call(req::StreamSynchronize { stream: 77 }).0.unwrap();
}

/// The context's cache preference reads back as set, and a reset returns it to "prefer none".
fn cache_config_is_kept(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    assert_eq!(session.call(req::DeviceGetCacheConfig {}).0.unwrap().config, 0);
    session.call(req::DeviceSetCacheConfig { config: 2 }).0.unwrap();
    assert_eq!(session.call(req::DeviceGetCacheConfig {}).0.unwrap().config, 2);
    session.call(req::DeviceReset {}).0.unwrap();
    assert_eq!(session.call(req::DeviceGetCacheConfig {}).0.unwrap().config, 0);
}

/// A trim with no graph memory held succeeds and leaves the usage at zero.
/// `Pause` answers a checkpoint's pause notice; sent when no checkpoint asked for one, it is
/// ignored and the session goes on.
fn an_unasked_pause_changes_nothing(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    session.send(&req::Pause {}.into(), &[]);
    let ptr = session.call(req::Malloc { size: 4096 }).0.unwrap().ptr;
    session.call(req::Free { ptr }).0.unwrap();
}

/// The app's exit: the server ends the session and closes its connection at once (a TCP
/// session's server would otherwise wait for the connection to come back).
fn a_goodbye_ends_the_session(socket: &str) {
    use std::io::Read;
    let mut session = RawSession::open(socket, None).unwrap();
    session.call(req::Malloc { size: 4096 }).0.unwrap();
    session.send(&req::Goodbye {}.into(), &[]);
    let mut rest = Vec::new();
    session.stream.read_to_end(&mut rest).expect("the connection ends, within the read timeout");
    assert!(rest.is_empty(), "nothing follows a goodbye: {} bytes", rest.len());
}

fn graph_memory_trim_answers(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    session.call(req::GraphMemTrim {}).0.unwrap();
    assert_eq!(session.call(req::GraphMemAttribute { attribute: 0, set: None }).0.unwrap().value, 0);
}

/// No profiler is attached to the server: start and stop succeed, as the driver's do then, and
/// so does resetting persisting L2 lines (there are none).
fn profiler_start_and_stop_answer_as_without_a_profiler(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    session.call(req::ProfilerControl { start: true }).0.unwrap();
    session.call(req::ProfilerControl { start: false }).0.unwrap();
    session.call(req::ResetPersistingL2Cache {}).0.unwrap();
}

fn device_synchronize_delivers_a_deferred_error_once(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    let clean = session.call_with_deferred(req::DeviceSynchronize {}).0;
    assert_eq!((clean.result.is_ok(), clean.deferred), (true, None));
    session.send(&req::StreamDestroy { stream: BOGUS_HANDLE }.into(), &[]);
    session.send(&req::Memset { dst: BOGUS_POINTER, pattern: 0, width: 1, len: 1, stream: 0 }.into(), &[]);
    // The first error of the two, once.
    let first = session.call_with_deferred(req::DeviceSynchronize {}).0;
    assert_eq!((first.result.is_ok(), first.deferred), (true, Some(UNKNOWN_HANDLE)));
    let second = session.call_with_deferred(req::DeviceSynchronize {}).0;
    assert_eq!((second.result.is_ok(), second.deferred), (true, None));
}

fn device_reset_frees_everything(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    let total = session.call(req::MemGetInfo {}).0.unwrap();
    let ptr = session.call(req::Malloc { size: 1 << 20 }).0.unwrap().ptr;
    session.send(&req::StreamCreate { stream: 9, flags: 0, priority: 0 }.into(), &[]);
    session.send(&req::EventCreate { event: 9, flags: 0 }.into(), &[]);
    const PRINTF_FIFO: u32 = 1;
    let fifo_default = session.call(req::DeviceGetLimit { limit: PRINTF_FIFO }).0.unwrap().value;
    session.call(req::DeviceSetLimit { limit: PRINTF_FIFO, value: fifo_default * 2 }).0.unwrap();
    let reset: Result<rep::DeviceReset, CudaError> = session.call(req::DeviceReset {}).0;
    assert!(reset.is_ok(), "{reset:?}");
    assert_eq!(
        session.call(req::DeviceGetLimit { limit: PRINTF_FIFO }).0.unwrap().value,
        fifo_default,
        "limits are back to their defaults"
    );
    assert_eq!(session.call(req::Free { ptr }).0.map(|_| ()), Err(INVALID_VALUE), "allocations are gone");
    assert_eq!(session.call(req::StreamQuery { stream: 9 }).0.map(|_| ()), Err(UNKNOWN_HANDLE), "streams are gone");
    assert_eq!(session.call(req::EventQuery { event: 9 }).0.map(|_| ()), Err(UNKNOWN_HANDLE), "events are gone");
    assert_eq!(session.call(req::MemGetInfo {}).0.unwrap().free, total.free, "the memory is back");
    session.round_trip(7);
}

fn a_link_on_the_emulated_device_fails_with_its_reason(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    let options = vec![JitOption { option: 7, value: 3 }];
    session.call(req::LinkCreate { link: 9, options, info_log: 64, error_log: 24 }).0.expect("a link is bookkeeping");
    assert_eq!(
        session.call(req::LinkCreate { link: 9, options: Vec::new(), info_log: 0, error_log: 0 }).0,
        Err(INVALID_VALUE),
        "id in use"
    );
    let ptx = b".version 8.0\n.target sm_90\n.address_size 64\n\0";
    let added = session.call_with_bulk(req::LinkAdd { link: 9, kind: 1, name: "a.ptx".into(), options: Vec::new() }, ptx).0.result.unwrap();
    assert_eq!(added.outcome.error, Some(CudaError::NOT_SUPPORTED));
    // The reason, cut to the app's 24-byte buffer with its NUL.
    assert_eq!(added.outcome.error_log, "flyt: the emulated devi");
    let completed = session.call(req::LinkComplete { link: 9 }).0.unwrap();
    assert_eq!((completed.outcome.error, completed.size), (Some(CudaError::NOT_SUPPORTED), 0));
    assert_eq!(session.call(req::LinkRead { link: 9, offset: 0, len: 1 }).0, Err(UNKNOWN_HANDLE), "no cubin to read");
    session.send(&req::LinkDestroy { link: 9 }.into(), &[]);
    let synchronized = session.call_with_deferred(req::DeviceSynchronize {}).0;
    assert_eq!((synchronized.result.is_ok(), synchronized.deferred), (true, None));
    assert_eq!(session.call(req::LinkComplete { link: 9 }).0.err(), Some(UNKNOWN_HANDLE), "destroyed");
}

fn stream_priority_range_is_ordered(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    let range = session.call(req::StreamPriorityRange {}).0.unwrap();
    assert!(range.greatest <= range.least, "{range:?}");
    assert_eq!(session.call(req::StreamPriorityRange {}).0.unwrap(), range);
}

/// Reads `len` bytes of device memory back.
fn read_back(session: &mut RawSession, ptr: u64, len: u64) -> Vec<u8> {
    let (result, bytes) = session.call(req::MemcpyDtoH { src: ptr, len, stream: 0, blocking: true });
    result.expect("copy back");
    bytes
}

fn memset_node(dst: u64, value: u32, len: u64) -> NodeParams {
    NodeParams::Memset(Memset2d { dst, pitch: len, value, element_size: 1, width: len, height: 1 })
}

fn copy_node(dst: u64, src: u64, len: u64) -> NodeParams {
    NodeParams::Memcpy(Copy3d { src, src_pitch: len, src_height: 1, dst, dst_pitch: len, dst_height: 1, width: len, height: 1, depth: 1 })
}

/// A memset node then a copy node that depends on it: a launch runs them in that order; a
/// node's parameters set in the executable graph change what the next launch does; the graph's
/// nodes, roots, clone, update and DOT text read back as built.
fn a_graph_of_copies_runs_in_dependency_order(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    let a = session.call(req::Malloc { size: 4096 }).0.unwrap().ptr;
    let b = session.call(req::Malloc { size: 4096 }).0.unwrap().ptr;
    session.call(req::GraphCreate { graph: 1 }).0.unwrap();
    session.call(req::GraphAddNode { graph: 1, node: 10, dependencies: vec![], params: memset_node(a, 0x11, 256) }).0.unwrap();
    session.call(req::GraphAddNode { graph: 1, node: 11, dependencies: vec![10], params: copy_node(b, a, 256) }).0.unwrap();
    let nodes = session.call(req::GraphNodes { graph: 1, roots: false }).0.unwrap().nodes;
    let kinds: Vec<(u64, u32)> = nodes.iter().map(|entry| (entry.node, entry.kind)).collect();
    assert_eq!(kinds, vec![(10, node_type::MEMSET), (11, node_type::MEMCPY)]);
    assert_eq!(session.call(req::GraphNodes { graph: 1, roots: true }).0.unwrap().nodes.len(), 1);
    let instantiated = session.call(req::GraphInstantiate { graph: 1, exec: 100, flags: 0 }).0.unwrap();
    assert_eq!(instantiated.host_nodes, 0);
    // Nothing ran yet: instantiating is not launching.
    assert_eq!(read_back(&mut session, b, 256), vec![0; 256]);
    session.send(&req::GraphLaunch { exec: 100, stream: 0 }.into(), &[]);
    assert_eq!(read_back(&mut session, b, 256), vec![0x11; 256]);

    session.call(req::GraphNodeSetParams { exec: 100, node: 10, params: memset_node(a, 0x22, 256) }).0.unwrap();
    session.send(&req::GraphLaunch { exec: 100, stream: 0 }.into(), &[]);
    assert_eq!(read_back(&mut session, b, 256), vec![0x22; 256]);
    // A node's type cannot change, and its memory must be the session's.
    let wrong_kind = session.call(req::GraphNodeSetParams { exec: 100, node: 10, params: copy_node(b, a, 16) }).0;
    assert_eq!(wrong_kind.err(), Some(INVALID_VALUE));
    let outside = session.call(req::GraphNodeSetParams { exec: 0, node: 10, params: memset_node(BOGUS_POINTER, 1, 16) }).0;
    assert_eq!(outside.err(), Some(INVALID_VALUE));

    let pairs = session.call(req::GraphClone { graph: 1, clone: 2 }).0.unwrap().nodes;
    assert_eq!(pairs.len(), 2);
    assert!(pairs.iter().all(|(original, copy)| [10, 11].contains(original) && copy & SERVER_NODE_BIT != 0));
    let update = session.call(req::GraphExecUpdate { exec: 100, graph: 2 }).0.unwrap();
    assert_eq!((update.error, update.status), (None, 0));
    session.send(&req::GraphLaunch { exec: 100, stream: 0 }.into(), &[]);
    assert_eq!(read_back(&mut session, b, 256), vec![0x11; 256], "the clone's memset, 0x11");
    let dot = session.call(req::GraphDotPrint { graph: 1, flags: 0 }).0.unwrap().text;
    assert!(dot.starts_with("digraph"), "{dot}");

    session.send(&req::GraphExecDestroy { exec: 100 }.into(), &[]);
    session.send(&req::GraphDestroy { graph: 1 }.into(), &[]);
    // The destroyed graph's nodes and executable graph are gone with it.
    let stale = session.call(req::GraphNodeSetParams { exec: 0, node: 10, params: memset_node(a, 1, 16) }).0;
    assert_eq!(stale.err(), Some(INVALID_VALUE));
    let clean = session.call_with_deferred(req::DeviceSynchronize {}).0;
    assert_eq!((clean.result.is_ok(), clean.deferred), (true, None));
}

/// A 32-bit write of 1 to `address`.
fn write_word(address: u64) -> StreamMemOp {
    StreamMemOp { kind: mem_op::WRITE_VALUE_32, address, value: 1, flags: 0 }
}

/// Node ids, dependencies and ranges are checked: a dependency from another graph, a memset
/// past the end of an allocation, a copy with rows wider than its pitch, an id reused.
fn graph_nodes_are_checked_before_the_driver_sees_them(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    let a = session.call(req::Malloc { size: 4096 }).0.unwrap().ptr;
    session.call(req::GraphCreate { graph: 1 }).0.unwrap();
    session.call(req::GraphCreate { graph: 2 }).0.unwrap();
    session.call(req::GraphAddNode { graph: 2, node: 20, dependencies: vec![], params: NodeParams::Empty }).0.unwrap();
    let refusals = [
        req::GraphAddNode { graph: 1, node: 10, dependencies: vec![20], params: NodeParams::Empty },
        req::GraphAddNode { graph: 1, node: 10, dependencies: vec![], params: memset_node(a + 4000, 0, 200) },
        req::GraphAddNode {
            graph: 1,
            node: 10,
            dependencies: vec![],
            params: NodeParams::Memcpy(Copy3d {
                src: a,
                src_pitch: 8,
                src_height: 2,
                dst: a + 2048,
                dst_pitch: 16,
                dst_height: 2,
                width: 16,
                height: 2,
                depth: 1,
            }),
        },
        req::GraphAddNode { graph: 1, node: 20, dependencies: vec![], params: NodeParams::Empty },
        req::GraphAddNode { graph: 1, node: 10, dependencies: vec![], params: NodeParams::Child { graph: BOGUS_HANDLE } },
        req::GraphAddNode { graph: 1, node: 10, dependencies: vec![], params: NodeParams::EventRecord { event: BOGUS_HANDLE } },
        // Batch memory operations: none, too many, a word past the allocation, a misaligned
        // one, a flush of remote writes, a write with v1 flags.
        req::GraphAddNode { graph: 1, node: 10, dependencies: vec![], params: NodeParams::BatchMemOp { ops: vec![] } },
        req::GraphAddNode { graph: 1, node: 10, dependencies: vec![], params: NodeParams::BatchMemOp { ops: vec![write_word(a); 256] } },
        req::GraphAddNode { graph: 1, node: 10, dependencies: vec![], params: NodeParams::BatchMemOp { ops: vec![write_word(a + 4096)] } },
        req::GraphAddNode { graph: 1, node: 10, dependencies: vec![], params: NodeParams::BatchMemOp { ops: vec![write_word(a + 2)] } },
        req::GraphAddNode {
            graph: 1,
            node: 10,
            dependencies: vec![],
            params: NodeParams::BatchMemOp { ops: vec![StreamMemOp { kind: mem_op::FLUSH_REMOTE_WRITES, ..StreamMemOp::default() }] },
        },
        req::GraphAddNode {
            graph: 1,
            node: 10,
            dependencies: vec![],
            params: NodeParams::BatchMemOp { ops: vec![StreamMemOp { flags: mem_op::WRITE_NO_MEMORY_BARRIER, ..write_word(a) }] },
        },
    ];
    for request in refusals {
        let what = format!("{request:?}");
        assert!(session.call(request).0.is_err(), "{what}");
    }
    // The emulated device runs no GPU code: a kernel node is refused as a launch is.
    let kernel =
        NodeParams::Kernel { function: BOGUS_FUNCTION, grid: Dim3::default(), block: Dim3::default(), shared_mem: 0, args: vec![] };
    assert_eq!(
        session.call(req::GraphAddNode { graph: 1, node: 10, dependencies: vec![], params: kernel }).0.err(),
        Some(UNKNOWN_FUNCTION)
    );
    assert_eq!(session.call(req::GraphNodes { graph: 1, roots: false }).0.unwrap().nodes, vec![]);
    // Edge data: one entry per edge; the emulated device has no kernel nodes, so no edge with a
    // port or a type (programmatic launches) is one it can make; default data is a plain edge.
    session.call(req::GraphAddNode { graph: 1, node: 11, dependencies: vec![], params: NodeParams::Empty }).0.unwrap();
    session.call(req::GraphAddNode { graph: 1, node: 12, dependencies: vec![], params: NodeParams::Empty }).0.unwrap();
    let edge = |data: Vec<[u8; 3]>| req::GraphEdges { graph: 1, from: vec![11], to: vec![12], data, remove: false };
    assert_eq!(session.call(edge(vec![[0, 0, 1], [0, 0, 1]])).0.err(), Some(INVALID_VALUE));
    assert_eq!(session.call(edge(vec![[1, 0, 1]])).0.err(), Some(CudaError::NOT_SUPPORTED));
    session.call(edge(vec![[0, 0, 0]])).0.unwrap();
    assert_eq!(session.call(req::GraphNodes { graph: 1, roots: true }).0.unwrap().nodes.len(), 1);
}

/// Work queued on a capturing stream is recorded, not run; the capture's status, graph and
/// dependencies read back; the graph runs it when launched; a stream that waits on an event
/// recorded in the capture joins it.
fn a_capture_records_stream_work_into_a_graph(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    let a = session.call(req::Malloc { size: 4096 }).0.unwrap().ptr;
    let (stream, side, fork, join) = (0x5_0000_0001, 0x5_0000_0002, 0xE_0000_0001, 0xE_0000_0002);
    session.send(&req::StreamCreate { stream, flags: 1, priority: 0 }.into(), &[]);
    session.send(&req::StreamCreate { stream: side, flags: 1, priority: 0 }.into(), &[]);
    session.send(&req::EventCreate { event: fork, flags: 2 }.into(), &[]);
    session.send(&req::EventCreate { event: join, flags: 2 }.into(), &[]);
    session
        .call(req::StreamBeginCapture {
            stream,
            mode: 0,
            thread_mode: 0,
            graph: 7,
            into: false,
            dependencies: Vec::new(),
            data: Vec::new(),
        })
        .0
        .unwrap();
    session.send(&req::Memset { dst: a, pattern: 0x33, width: 1, len: 128, stream }.into(), &[]);
    session.send(&req::EventRecord { event: fork, stream, flags: 0 }.into(), &[]);
    session.send(&req::StreamWaitEvent { stream: side, event: fork, flags: 0 }.into(), &[]);
    session.send(&req::MemcpyDtoD { dst: a + 1024, src: a, len: 128, stream: side }.into(), &[]);
    session.send(&req::EventRecord { event: join, stream: side, flags: 0 }.into(), &[]);
    session.send(&req::StreamWaitEvent { stream, event: join, flags: 0 }.into(), &[]);
    let info = session.call(req::StreamCaptureInfo { stream: side }).0.unwrap().info;
    assert_eq!((info.status, info.graph, info.dependencies.len()), (capture_status::ACTIVE, 7, 1));
    assert_eq!(session.call(req::StreamEndCapture { stream }).0.unwrap().graph, 7);
    assert_eq!(read_back(&mut session, a, 128), vec![0; 128], "captured work does not run");
    let after = session.call(req::StreamCaptureInfo { stream: side }).0.unwrap().info;
    assert_eq!(after.status, capture_status::NONE, "the joined stream left the capture with it");
    assert_eq!(session.call(req::GraphNodes { graph: 7, roots: false }).0.unwrap().nodes.len(), 2);
    session.call(req::GraphInstantiate { graph: 7, exec: 70, flags: 0 }).0.unwrap();
    session.send(&req::GraphLaunch { exec: 70, stream }.into(), &[]);
    assert_eq!(read_back(&mut session, a + 1024, 128), vec![0x33; 128]);
}

/// A captured graph's copy, memset, host and batch memory operation nodes read back as the
/// driver holds them (the host node as the client's call id); other nodes have no such parameters.
fn captured_nodes_read_back_their_parameters(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    let a = session.call(req::Malloc { size: 4096 }).0.unwrap().ptr;
    let stream = 0x5_0000_0001;
    session.send(&req::StreamCreate { stream, flags: 1, priority: 0 }.into(), &[]);
    session
        .call(req::StreamBeginCapture {
            stream,
            mode: 0,
            thread_mode: 0,
            graph: 7,
            into: false,
            dependencies: Vec::new(),
            data: Vec::new(),
        })
        .0
        .unwrap();
    session.send(&req::Memset { dst: a, pattern: 0x33, width: 1, len: 128, stream }.into(), &[]);
    session.send(&req::MemcpyDtoD { dst: a + 1024, src: a, len: 128, stream }.into(), &[]);
    session.send(&req::LaunchHostFunc { stream, call: 55 }.into(), &[]);
    session.send(&req::StreamMemOps { stream, ops: vec![write_word(a + 2048)] }.into(), &[]);
    assert_eq!(session.call(req::StreamEndCapture { stream }).0.unwrap().graph, 7);
    let nodes = session.call(req::GraphNodes { graph: 7, roots: false }).0.unwrap().nodes;
    assert_eq!(nodes.len(), 4);
    for entry in nodes {
        let params = session.call(req::GraphNodeGetParams { node: entry.node }).0.unwrap().params;
        match params {
            NodeReadback::Memset(set) => assert_eq!((set.dst, set.value, set.element_size, set.width), (a, 0x33, 1, 128)),
            NodeReadback::Memcpy(copy) => {
                assert_eq!((copy.src.ptr, copy.dst.ptr, copy.width, copy.height, copy.depth), (a, a + 1024, 128, 1, 1));
            }
            NodeReadback::Host { call } => assert_eq!(call, 55),
            NodeReadback::BatchMemOp { ops } => assert_eq!(ops, vec![write_word(a + 2048)]),
        }
    }
    session.call(req::GraphCreate { graph: 8 }).0.unwrap();
    session.call(req::GraphAddNode { graph: 8, node: 80, dependencies: vec![], params: NodeParams::Empty }).0.unwrap();
    assert_eq!(session.call(req::GraphNodeGetParams { node: 80 }).0.err(), Some(INVALID_VALUE));
}

/// `CUaccessPolicyWindow` as a 64-byte attribute value.
fn access_window(base: u64, len: u64) -> Vec<u8> {
    let mut value = vec![0; 64];
    value[..8].copy_from_slice(&base.to_le_bytes());
    value[8..16].copy_from_slice(&len.to_le_bytes());
    value
}

/// Kernel node attributes name kernel nodes: an empty node has none (the emulated device has no
/// kernel nodes at all).
fn kernel_node_attributes_refuse_other_nodes(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    session.call(req::GraphCreate { graph: 1 }).0.unwrap();
    session.call(req::GraphAddNode { graph: 1, node: 10, dependencies: vec![], params: NodeParams::Empty }).0.unwrap();
    let read = session.call(req::GraphKernelNodeAttribute { node: 10, attribute: 8, set: None }).0;
    assert_eq!(read.err(), Some(INVALID_VALUE));
    assert_eq!(session.call(req::GraphKernelNodeCopyAttributes { dst: 10, src: 10 }).0.err(), Some(INVALID_VALUE));
}

/// A host copy cannot be part of a graph over a socket (its staging memory is reused): it is
/// refused, and the capture ends invalidated rather than as a graph without the copy.
fn a_capture_that_met_a_host_copy_ends_invalidated(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    let a = session.call(req::Malloc { size: 4096 }).0.unwrap().ptr;
    let stream = 0x5_0000_0001;
    session.send(&req::StreamCreate { stream, flags: 1, priority: 0 }.into(), &[]);
    session
        .call(req::StreamBeginCapture {
            stream,
            mode: 0,
            thread_mode: 0,
            graph: 7,
            into: false,
            dependencies: Vec::new(),
            data: Vec::new(),
        })
        .0
        .unwrap();
    session.send(&req::MemcpyHtoD { dst: a, stream }.into(), &[1; 64]);
    assert_eq!(session.call(req::StreamEndCapture { stream }).0.err(), Some(CudaError::STREAM_CAPTURE_INVALIDATED));
    let deferred = session.call_with_deferred(req::DeviceSynchronize {}).0;
    assert_eq!(deferred.deferred, Some(CudaError::STREAM_CAPTURE_UNSUPPORTED));
    assert_eq!(session.call(req::GraphNodes { graph: 7, roots: false }).0.err(), Some(INVALID_VALUE), "no graph is left");
    assert_eq!(read_back(&mut session, a, 64), vec![0; 64]);
}

/// A copy between `device` and the app's `host` memory of `len` bytes (`to_host`: device to host).
fn host_copy(host: u64, device: u64, len: u64, to_host: bool) -> HostCopy {
    let copy = if to_host { Copy3d::flat(host, device, len) } else { Copy3d::flat(device, host, len) };
    HostCopy { copy, to_host }
}

/// The next frame, a notice, with its bulk bytes.
fn next_notice(session: &mut RawSession) -> (Notice, Vec<u8>) {
    let mut message = Vec::new();
    let header = read_message(&mut session.stream, &FrameLimits::default(), &mut message).expect("a notice");
    assert_eq!(header.seq, 0, "a notice");
    let mut bulk = vec![0; usize::try_from(header.bulk_len).expect("a bulk length that fits in memory")];
    read_full(&mut session.stream, &mut bulk, false).expect("the notice's bytes");
    (flyt_protocol::frame::decode_exact::<Notice>(&message).expect("a notice"), bulk)
}

/// Copies with the app's host memory run through the client at every launch: a host-to-device
/// node asks for the bytes (`HostCopyIn`) and holds its stream until they come, a device-to-host
/// node after it sends them (`HostCopyOut`); the nodes read back as copies with the app's host
/// addresses. Absurd sizes, device memory outside the session and wrong answers are refused.
fn host_copy_nodes_run_through_the_client(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    let a = session.call(req::Malloc { size: 4096 }).0.unwrap().ptr;
    let stream = 0x5_0000_0002;
    session.send(&req::StreamCreate { stream, flags: 1, priority: 0 }.into(), &[]);
    let (input, output) = (0x7f00_1000_0000, 0x7f00_2000_0000);
    let add = |node: u64, dependencies: Vec<u64>, copy: HostCopy| req::GraphAddNode {
        graph: 1,
        node,
        dependencies,
        params: NodeParams::HostMemcpy(copy),
    };
    session.call(req::GraphCreate { graph: 1 }).0.unwrap();
    let free_before = session.call(req::MemGetInfo {}).0.unwrap().free;
    for (request, error) in [
        (add(9, vec![], host_copy(input, a, 1 << 40, false)), INVALID_VALUE),
        (add(9, vec![], host_copy(input, a + 4000, 200, false)), INVALID_VALUE),
        (add(9, vec![], host_copy(input, BOGUS_POINTER, 64, false)), INVALID_VALUE),
        (add(9, vec![], host_copy(0, a, 64, false)), INVALID_VALUE),
    ] {
        let what = format!("{request:?}");
        assert_eq!(session.call(request).0.err(), Some(error), "{what}");
    }
    session.call(add(10, vec![], host_copy(input, a, 64, false))).0.unwrap();
    session.call(add(11, vec![10], host_copy(output, a, 64, true))).0.unwrap();
    assert_eq!(session.call(req::MemGetInfo {}).0.unwrap().free, free_before - 128, "staging counts in the quota");
    let nodes = session.call(req::GraphNodes { graph: 1, roots: false }).0.unwrap().nodes;
    assert!(nodes.iter().all(|entry| entry.kind == node_type::MEMCPY), "{nodes:?}");
    let NodeReadback::Memcpy(back) = session.call(req::GraphNodeGetParams { node: 11 }).0.unwrap().params else { panic!("a copy") };
    assert_eq!((back.dst.memory_type, back.dst.ptr, back.src.memory_type, back.src.ptr), (1, output, 2, a));
    let host_nodes = session.call(req::GraphInstantiate { graph: 1, exec: 5, flags: 0 }).0.unwrap().host_nodes;
    assert_eq!(host_nodes, 2, "each copy has a host half");
    for launch in 0..2u8 {
        session.send(&req::GraphLaunch { exec: 5, stream }.into(), &[]);
        let (Notice::HostCopyIn { run, host }, bulk) = next_notice(&mut session) else { panic!("not a copy in") };
        assert_eq!((host.ptr, host.width, host.rows, host.depth, bulk.len()), (input, 64, 1, 1, 0));
        // Too few bytes are refused (the emulated device holds the session's thread in the
        // launch till the copy is answered, so the refusal is told at the next sync point);
        // the stream waits on for the right answer.
        session.send(&req::HostCopyDone { run }.into(), &[1; 63]);
        session.send(&req::HostCopyDone { run }.into(), &[launch + 1; 64]);
        let (Notice::HostCopyOut { run, host }, bulk) = next_notice(&mut session) else { panic!("not a copy out") };
        assert_eq!((host.ptr, bulk), (output, vec![launch + 1; 64]), "launch {launch}");
        session.send(&req::HostCallDone { run }.into(), &[]);
        let synchronized = session.call_with_deferred(req::StreamSynchronize { stream }).0;
        assert_eq!((synchronized.result, synchronized.deferred), (Ok(rep::StreamSynchronize {}), Some(INVALID_VALUE)));
        assert_eq!(read_back(&mut session, a, 64), vec![launch + 1; 64]);
    }
    // The executable graph holds the staging after its graph is gone; then nothing does.
    session.send(&req::GraphDestroy { graph: 1 }.into(), &[]);
    assert_eq!(session.call(req::MemGetInfo {}).0.unwrap().free, free_before - 128, "the executable graph still copies");
    session.send(&req::GraphExecDestroy { exec: 5 }.into(), &[]);
    assert_eq!(session.call(req::MemGetInfo {}).0.unwrap().free, free_before, "staging freed with the last holder");
}

/// A host function holds its stream: the server tells the client to run it, the stream is busy
/// until the client answers, then synchronizes.
fn a_host_call_holds_its_stream_until_answered(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    let stream = 0x5_0000_0001;
    session.send(&req::StreamCreate { stream, flags: 1, priority: 0 }.into(), &[]);
    session.send(&req::LaunchHostFunc { stream, call: 42 }.into(), &[]);
    let mut message = Vec::new();
    let header = read_message(&mut session.stream, &FrameLimits::default(), &mut message).expect("a notice");
    assert_eq!(header.seq, 0);
    let Ok(Notice::HostCall { call: 42, run }) = flyt_protocol::frame::decode_exact::<Notice>(&message) else { panic!("not a host call") };
    assert_eq!(session.call(req::StreamQuery { stream }).0.err(), Some(CudaError::NOT_READY));
    session.send(&req::HostCallDone { run }.into(), &[]);
    session.call(req::StreamSynchronize { stream }).0.unwrap();
    // Answered once: a second answer for the same run is refused.
    session.send(&req::HostCallDone { run }.into(), &[]);
    assert_eq!(session.call_with_deferred(req::DeviceSynchronize {}).0.deferred, Some(INVALID_VALUE));
}

/// Two physical allocations mapped back to back into a reserved range make one copyable range;
/// what is mapped stays in the allocation across an unmap and a new map; ranges that are not the
/// session's own whole mappings are refused; releasing gives the quota back.
fn virtual_memory_maps_physical_allocations_into_reserved_ranges(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    let granularity = session.call(req::MemGranularity { recommended: false, host: false }).0.unwrap().granularity;
    assert!(granularity.is_power_of_two(), "{granularity}");
    let before = session.call(req::MemGetInfo {}).0.unwrap().free;
    let base = session.call(req::MemAddressReserve { size: 4 * granularity, alignment: 0, addr: 0 }).0.unwrap().ptr;
    session.call(req::MemCreate { handle: 1, size: 2 * granularity, handle_types: 0, usage: 0 }).0.unwrap();
    session.call(req::MemCreate { handle: 2, size: 2 * granularity, handle_types: 1, usage: 0 }).0.unwrap();
    assert_eq!(session.call(req::MemGetInfo {}).0.unwrap().free, before - 4 * granularity, "created memory counts in the quota");
    let refusals = [
        req::MemMap { ptr: base + granularity, size: 4 * granularity, offset: 0, handle: 1 },
        req::MemMap { ptr: base, size: 2 * granularity, offset: granularity, handle: 1 },
        req::MemMap { ptr: BOGUS_POINTER, size: 2 * granularity, offset: 0, handle: 1 },
    ];
    for request in refusals {
        let what = format!("{request:?}");
        assert_eq!(session.call(request).0.err(), Some(INVALID_VALUE), "{what}");
    }
    session.call(req::MemMap { ptr: base, size: 2 * granularity, offset: 0, handle: 1 }).0.unwrap();
    let overlap = session.call(req::MemMap { ptr: base + granularity, size: 2 * granularity, offset: 0, handle: 2 }).0;
    assert_eq!(overlap.err(), Some(INVALID_VALUE), "a mapping over a mapping");
    session.call(req::MemMap { ptr: base + 2 * granularity, size: 2 * granularity, offset: 0, handle: 2 }).0.unwrap();
    session.call(req::MemSetAccess { ptr: base, size: 4 * granularity, flags: 3 }).0.unwrap();
    let len = 4 * granularity;
    // Copies across the seam pass the session's checks; the emulated device keeps each mapping
    // in a block of its own, so they are made per mapping here (gpu-tests/vmm.cu crosses it).
    session.send(&req::Memset { dst: base, pattern: 0x3c, width: 1, len: 2 * granularity, stream: 0 }.into(), &[]);
    session.send(&req::Memset { dst: base + 2 * granularity, pattern: 0x3c, width: 1, len: 2 * granularity, stream: 0 }.into(), &[]);
    assert_eq!(read_back(&mut session, base + 2 * granularity - 16, 16), vec![0x3c; 16]);
    assert_eq!(read_back(&mut session, base + 2 * granularity, 16), vec![0x3c; 16]);
    assert_eq!(session.call(req::MemUnmap { ptr: base, size: granularity }).0.err(), Some(INVALID_VALUE), "half a mapping");
    assert_eq!(session.call(req::MemAddressFree { ptr: base, size: len }).0.err(), Some(INVALID_VALUE), "a range still mapped");
    session.call(req::MemUnmap { ptr: base + 2 * granularity, size: 2 * granularity }).0.unwrap();
    let (unmapped, _) = session.call(req::MemcpyDtoH { src: base + 2 * granularity, len: 16, stream: 0, blocking: true });
    assert_eq!(unmapped.err(), Some(INVALID_VALUE), "an unmapped range is no memory");
    session.call(req::MemMap { ptr: base + 2 * granularity, size: 2 * granularity, offset: 0, handle: 2 }).0.unwrap();
    assert_eq!(read_back(&mut session, base + 3 * granularity, 16), vec![0x3c; 16], "kept across unmap and map");
    session.call(req::MemUnmap { ptr: base, size: len }).0.unwrap();
    session.call(req::MemRelease { handle: 1 }).0.unwrap();
    session.call(req::MemRelease { handle: 2 }).0.unwrap();
    session.call(req::MemAddressFree { ptr: base, size: len }).0.unwrap();
    assert_eq!(session.call(req::MemGetInfo {}).0.unwrap().free, before, "released memory leaves the quota");
}

/// Allocations from the default pool and from a pool of the app's count in the quota until freed
/// (asynchronously, or with cudaFree) and hold bytes like any other; the device's current pool
/// follows cuDeviceSetMemPool and returns to the default when its pool is destroyed.
fn stream_ordered_allocations_count_in_the_quota(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    let stream = 0x5_0000_0001;
    session.send(&req::StreamCreate { stream, flags: 1, priority: 0 }.into(), &[]);
    let before = session.call(req::MemGetInfo {}).0.unwrap().free;
    let a = session.call(req::MemAllocAsync { size: 1 << 20, stream, pool: 0 }).0.unwrap().ptr;
    session.call(req::MemPoolCreate { pool: 2, handle_types: 0 }).0.unwrap();
    let b = session.call(req::MemAllocAsync { size: 1 << 20, stream, pool: 2 }).0.unwrap().ptr;
    assert_eq!(session.call(req::MemGetInfo {}).0.unwrap().free, before - (2 << 20));
    session.send(&req::Memset { dst: b, pattern: 0x61, width: 1, len: 1 << 20, stream }.into(), &[]);
    session.send(&req::MemcpyDtoD { dst: a, src: b, len: 1 << 20, stream }.into(), &[]);
    session.call(req::StreamSynchronize { stream }).0.unwrap();
    assert_eq!(read_back(&mut session, a + 100, 16), vec![0x61; 16]);
    let threshold = session.call(req::MemPoolAttribute { pool: 1, attribute: 4, value: Some(1 << 30) }).0.unwrap().value;
    assert_eq!(threshold, 1 << 30, "the release threshold reads back as set");
    assert_eq!(session.call(req::DeviceMemPool { set: Some(2) }).0.unwrap().pool, 2);
    session.send(&req::MemFreeAsync { ptr: a, stream }.into(), &[]);
    session.call(req::Free { ptr: b }).0.unwrap();
    session.call(req::MemPoolTrim { pool: 2, keep: 0 }).0.unwrap();
    session.call(req::MemPoolDestroy { pool: 2 }).0.unwrap();
    assert_eq!(session.call(req::DeviceMemPool { set: None }).0.unwrap().pool, 1, "back to the default pool");
    let clean = session.call_with_deferred(req::DeviceSynchronize {}).0;
    assert_eq!((clean.result.is_ok(), clean.deferred), (true, None));
    assert_eq!(session.call(req::MemGetInfo {}).0.unwrap().free, before, "freed memory leaves the quota");
}

/// A stream-ordered allocation on a capturing stream is graph memory (an allocation node): the
/// app may free it outside the graph after every launch, with cudaFree or in stream order, and it
/// counts in the quota until its graph is destroyed (NVIDIA's graphMemoryNodes; a second cudaFree
/// was refused when it was taken for an ordinary allocation).
fn captured_allocations_are_graph_memory(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    let stream = 0x5_0000_0002;
    session.send(&req::StreamCreate { stream, flags: 1, priority: 0 }.into(), &[]);
    let before = session.call(req::MemGetInfo {}).0.unwrap().free;
    let begin =
        req::StreamBeginCapture { stream, mode: 0, thread_mode: 0, graph: 21, into: false, dependencies: Vec::new(), data: Vec::new() };
    session.call(begin).0.unwrap();
    let ptr = session.call(req::MemAllocAsync { size: 1 << 20, stream, pool: 0 }).0.unwrap().ptr;
    assert_eq!(session.call(req::StreamEndCapture { stream }).0.unwrap().graph, 21);
    assert_eq!(session.call(req::MemGetInfo {}).0.unwrap().free, before - (1 << 20), "graph memory counts");
    for round in 0..2 {
        assert!(session.call(req::Free { ptr }).0.is_ok(), "cudaFree of graph memory, round {round}");
        session.send(&req::MemFreeAsync { ptr, stream }.into(), &[]);
        let synced = session.call_with_deferred(req::StreamSynchronize { stream }).0;
        assert_eq!((synced.result.is_ok(), synced.deferred), (true, None), "a free in stream order, round {round}");
    }
    session.send(&req::GraphDestroy { graph: 21 }.into(), &[]);
    assert_eq!(session.call(req::MemGetInfo {}).0.unwrap().free, before, "its graph gone, the quota is back");
    assert_eq!(session.call(req::Free { ptr }).0.err(), Some(INVALID_VALUE), "no longer the session's memory");
}

/// An executable graph keeps allocating its graph's memory after the graph is destroyed (NVIDIA's
/// graphMemoryNodes destroys the graph right after instantiating it, then frees the memory with
/// cudaFree after launches): the memory stays the session's, and counted, until the executable
/// graph goes.
fn graph_memory_lives_with_the_executable_graph(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    let before = session.call(req::MemGetInfo {}).0.unwrap().free;
    session.call(req::GraphCreate { graph: 31 }).0.unwrap();
    let alloc = NodeParams::MemAlloc { size: 1 << 20, access: None };
    let ptr = session.call(req::GraphAddNode { graph: 31, node: 310, dependencies: vec![], params: alloc }).0.unwrap().ptr;
    session.call(req::GraphInstantiate { graph: 31, exec: 311, flags: 0 }).0.unwrap();
    session.send(&req::GraphDestroy { graph: 31 }.into(), &[]);
    for round in 0..2 {
        assert!(session.call(req::Free { ptr }).0.is_ok(), "cudaFree of the executable graph's memory, round {round}");
    }
    assert_eq!(session.call(req::MemGetInfo {}).0.unwrap().free, before - (1 << 20), "still counted");
    session.send(&req::GraphExecDestroy { exec: 311 }.into(), &[]);
    assert_eq!(session.call(req::Free { ptr }).0.err(), Some(INVALID_VALUE), "gone with the executable graph");
    assert_eq!(session.call(req::MemGetInfo {}).0.unwrap().free, before, "and no longer counted");
}

/// A box of `width` bytes x `height` rows x `depth` slices from pitched device memory at `ptr` to
/// `dst`.
fn device_box(ptr: u64, pitch: u64, rows: u64, width: u64, height: u64, depth: u64, dst: CopySide) -> ShapedCopy {
    ShapedCopy {
        src: CopySide::Device { ptr, pitch, height: rows },
        src_pos: Pos3::default(),
        dst,
        dst_pos: Pos3::default(),
        width,
        height,
        depth,
    }
}

/// A box between packed host bytes and `device` (`to_host`: device to host).
fn host_box(to_host: bool, device: CopySide, width: u64, height: u64) -> ShapedCopy {
    let host = CopySide::Host { pitch: width, height };
    let (src, dst) = if to_host { (device, host) } else { (host, device) };
    ShapedCopy { src, src_pos: Pos3::default(), dst, dst_pos: Pos3::default(), width, height, depth: 1 }
}

/// A 2D array of `width` x `height` floats.
fn float_array(width: u64, height: u64) -> ArrayDesc {
    ArrayDesc { width, height, depth: 0, format: 0x20, channels: 1, flags: 0 }
}

/// Host rows go into pitched memory at an offset, from there into a 3D array slice and back out
/// of the array to the host, every byte where it belongs; arrays count in the quota until
/// destroyed, textures and surfaces over them are the session's own.
fn shaped_copies_move_boxes_between_host_pitched_memory_and_arrays(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    let before = session.call(req::MemGetInfo {}).0.unwrap().free;
    let pitched = session.call(req::MallocPitch { width: 100, height: 6, element_size: 4 }).0.unwrap();
    assert_eq!(pitched.pitch, 512, "rows 512 bytes apart, as on current GPUs");
    session.send(&req::Memset { dst: pitched.ptr, pattern: 0xee, width: 1, len: 512 * 6, stream: 0 }.into(), &[]);
    // 3 rows of 40 bytes at (x 8, y 2).
    let rows: Vec<u8> = (0..120u8).collect();
    let into_pitched = ShapedCopy {
        src: CopySide::Host { pitch: 40, height: 3 },
        src_pos: Pos3::default(),
        dst: CopySide::Device { ptr: pitched.ptr, pitch: 512, height: 6 },
        dst_pos: Pos3 { x: 8, y: 2, z: 0 },
        width: 40,
        height: 3,
        depth: 1,
    };
    session.send(&req::MemcpyHtoShaped { copy: into_pitched, stream: 0 }.into(), &rows);
    let all = read_back(&mut session, pitched.ptr, 512 * 6);
    for (index, byte) in all.iter().enumerate() {
        let (y, x) = (index / 512, index % 512);
        let expected = if (2..5).contains(&y) && (8..48).contains(&x) { u8::try_from((y - 2) * 40 + x - 8).unwrap() } else { 0xee };
        assert_eq!(*byte, expected, "byte {x} of row {y}");
    }
    // A 3D array of 10 x 3 x 2 floats: slice 1 gets the three rows.
    let desc = ArrayDesc { width: 10, height: 3, depth: 2, format: 0x20, channels: 1, flags: 0 };
    session.call(req::ArrayCreate { array: 40, desc, levels: None }).0.unwrap();
    assert_eq!(session.call(req::MemGetInfo {}).0.unwrap().free, before - 512 * 6 - 240, "pitched memory and the array in the quota");
    let into_array = ShapedCopy {
        src: CopySide::Device { ptr: pitched.ptr, pitch: 512, height: 6 },
        src_pos: Pos3 { x: 8, y: 2, z: 0 },
        dst: CopySide::Array { array: 40 },
        dst_pos: Pos3 { x: 0, y: 0, z: 1 },
        width: 40,
        height: 3,
        depth: 1,
    };
    session.send(&req::MemcpyShaped { copy: into_array, stream: 0 }.into(), &[]);
    let beyond = ShapedCopy { dst_pos: Pos3 { x: 4, y: 0, z: 1 }, ..into_array };
    session.send(&req::MemcpyShaped { copy: beyond, stream: 0 }.into(), &[]);
    let refused = session.call_with_deferred(req::DeviceSynchronize {}).0;
    assert_eq!(refused.deferred, Some(INVALID_VALUE), "a box past the array's width");
    let out_of_array = ShapedCopy {
        src: CopySide::Array { array: 40 },
        src_pos: Pos3 { x: 0, y: 1, z: 1 },
        dst: CopySide::Host { pitch: 40, height: 2 },
        dst_pos: Pos3::default(),
        width: 40,
        height: 2,
        depth: 1,
    };
    let (reply, bytes) = session.call(req::MemcpyShapedToH { copy: out_of_array, stream: 0, blocking: true });
    reply.unwrap();
    assert_eq!(bytes, rows[40..].to_vec(), "rows 1 and 2 of slice 1");
    // Objects over the array are the session's; a texture handle is no surface handle.
    let texture =
        session.call(req::TexObjectCreate { resource: Resource::Array { array: 40 }, texture: TextureDesc::default(), view: None });
    let texture = texture.0.unwrap().handle;
    let surface = session.call(req::SurfObjectCreate { array: 40 }).0.unwrap().handle;
    assert_eq!(session.call(req::ObjectDestroy { handle: texture, surface: true }).0.err(), Some(INVALID_VALUE));
    session.call(req::ObjectDestroy { handle: texture, surface: false }).0.unwrap();
    session.call(req::ObjectDestroy { handle: surface, surface: true }).0.unwrap();
    // A mipmapped array's levels are named by the client and go with it.
    session.call(req::ArrayCreate { array: 41, desc: float_array(8, 8), levels: Some(3) }).0.unwrap();
    session.call(req::MipmappedArrayLevel { mipmap: 41, level: 2, array: 42 }).0.unwrap();
    let level_box = host_box(true, CopySide::Array { array: 42 }, 8, 2);
    assert_eq!(session.call(req::MemcpyShapedToH { copy: level_box, stream: 0, blocking: true }).0.err(), None, "level 2 is 2 x 2 floats");
    assert_eq!(session.call(req::ArrayDestroy { array: 42 }).0.err(), Some(INVALID_VALUE), "a level goes with its mipmapped array");
    session.call(req::ArrayDestroy { array: 41 }).0.unwrap();
    session.call(req::ArrayDestroy { array: 40 }).0.unwrap();
    session.call(req::Free { ptr: pitched.ptr }).0.unwrap();
    assert_eq!(session.call(req::MemGetInfo {}).0.unwrap().free, before, "everything left the quota");
}

/// A `CUaccessPolicyWindow` over `[base, base + len)`, in a `CUstreamAttrValue`'s 64 bytes.
fn window(base: u64, len: u64) -> Vec<u8> {
    let mut value = vec![0u8; 64];
    value[..8].copy_from_slice(&base.to_le_bytes());
    value[8..16].copy_from_slice(&len.to_le_bytes());
    value[16..20].copy_from_slice(&0.5f32.to_le_bytes());
    value
}

fn stream_attributes_read_back_as_set(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    let ptr = session.call(req::Malloc { size: 1 << 20 }).0.unwrap().ptr;
    let stream = 0x5_0000_0001;
    session.send(&req::StreamCreate { stream, flags: 0, priority: 0 }.into(), &[]);
    let set = session.call(req::StreamAttribute { stream, attribute: 1, set: Some(window(ptr, 1 << 20)) }).0.unwrap();
    assert_eq!(set.value, window(ptr, 1 << 20));
    let got = session.call(req::StreamAttribute { stream, attribute: 1, set: None }).0.unwrap();
    assert_eq!(got.value, window(ptr, 1 << 20), "the window reads back");
}

/// `cuStreamBeginCaptureToGraph`: captured work lands in the app's graph after the nodes named;
/// `cuStreamUpdateCaptureDependencies` moves where the next work goes; the graph stays the app's.
/// Edge data goes along, one entry per dependency: the emulated device has no kernel nodes, so
/// it refuses a port or a type (programmatic launches), and default data is no data.
fn a_capture_into_an_existing_graph_follows_its_nodes(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    let a = session.call(req::Malloc { size: 4096 }).0.unwrap().ptr;
    let stream = 0x5_0000_0001;
    session.send(&req::StreamCreate { stream, flags: 1, priority: 0 }.into(), &[]);
    session.call(req::GraphCreate { graph: 30 }).0.unwrap();
    session.call(req::GraphAddNode { graph: 30, node: 31, dependencies: Vec::new(), params: memset_node(a, 0x44, 128) }).0.unwrap();
    let begin = |dependencies: Vec<u64>, data: Vec<[u8; 3]>| req::StreamBeginCapture {
        stream,
        mode: 0,
        thread_mode: 0,
        graph: 30,
        into: true,
        dependencies,
        data,
    };
    assert_eq!(session.call(begin(vec![99], Vec::new())).0.err(), Some(INVALID_VALUE), "a dependency that is no node of the graph");
    assert_eq!(session.call(begin(vec![31], vec![[0; 3], [0; 3]])).0.err(), Some(INVALID_VALUE), "edge data for two dependencies of one");
    assert_eq!(session.call(begin(vec![31], vec![[1, 0, 1]])).0.err(), Some(CudaError::NOT_SUPPORTED), "a programmatic dependency");
    assert_eq!(session.call(req::StreamCaptureInfo { stream }).0.unwrap().info.status, capture_status::NONE, "no capture begun");
    session.call(begin(vec![31], vec![[0; 3]])).0.unwrap();
    session.send(&req::MemcpyDtoD { dst: a + 1024, src: a, len: 128, stream }.into(), &[]);
    let info = session.call(req::StreamCaptureInfo { stream }).0.unwrap().info;
    assert_eq!((info.graph, info.dependencies.len(), info.data), (30, 1, Vec::new()), "plain dependencies carry no edge data");
    // The next work goes after the memset again, beside the copy, not after it.
    let update = |data: Vec<[u8; 3]>| req::StreamCaptureDependencies { stream, dependencies: vec![31], data, set: true };
    assert_eq!(session.call(update(vec![[0; 3], [0; 3]])).0.err(), Some(INVALID_VALUE), "edge data for two dependencies of one");
    assert_eq!(session.call(update(vec![[0, 2, 1]])).0.err(), Some(CudaError::NOT_SUPPORTED), "a programmatic dependency");
    session.call(update(vec![[0; 3]])).0.unwrap();
    let info = session.call(req::StreamCaptureInfo { stream }).0.unwrap().info;
    assert_eq!((info.dependencies, info.data), (vec![31], Vec::new()));
    session.send(&req::MemcpyDtoD { dst: a + 2048, src: a, len: 128, stream }.into(), &[]);
    assert_eq!(session.call(req::StreamEndCapture { stream }).0.unwrap().graph, 30);
    assert_eq!(session.call(req::GraphNodes { graph: 30, roots: false }).0.unwrap().nodes.len(), 3);
    assert_eq!(session.call(req::GraphNodes { graph: 30, roots: true }).0.unwrap().nodes.len(), 1, "the memset is the one root");
    let edges = session.call(req::GraphGetEdges { graph: 30 }).0.unwrap().edges;
    assert!(
        edges.len() == 2 && edges.iter().all(|edge| edge.from == 31 && [edge.from_port, edge.to_port, edge.kind] == [0; 3]),
        "{edges:?}"
    );
    session.call(req::GraphInstantiate { graph: 30, exec: 300, flags: 0 }).0.unwrap();
    session.send(&req::GraphLaunch { exec: 300, stream }.into(), &[]);
    assert_eq!(read_back(&mut session, a + 1024, 128), vec![0x44; 128]);
    assert_eq!(read_back(&mut session, a + 2048, 128), vec![0x44; 128]);
}

fn write32(address: u64, value: u64) -> StreamMemOp {
    StreamMemOp { kind: mem_op::WRITE_VALUE_32, address, value, flags: 0 }
}

fn wait32(address: u64, value: u64) -> StreamMemOp {
    StreamMemOp { kind: mem_op::WAIT_VALUE_32, address, value, flags: mem_op::WAIT_GEQ }
}

/// A 2D float tensor of 16 x 16 (1 KiB) at `address`, tiled 8 x 8.
fn tiled_map(address: u64) -> TensorMapParams {
    TensorMapParams {
        data_type: 7,
        rank: 2,
        address,
        dims: vec![16, 16],
        strides: vec![64],
        element_strides: vec![1, 1],
        layout: TensorMapLayout::Tiled { box_dim: vec![8, 8] },
        ..TensorMapParams::default()
    }
}

/// Writes land at submission, in order, at both widths; a wait whose condition holds passes; one
/// that no earlier write satisfied fails (deferred, once) instead of passing, and the ops after
/// it in its batch do not run.
fn stream_memory_operations_write_and_wait(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    let a = session.call(req::Malloc { size: 4096 }).0.unwrap().ptr;
    let write64 = StreamMemOp { kind: mem_op::WRITE_VALUE_64, address: a + 8, value: 0x1122_3344_5566_7788, flags: 0 };
    let barrier = StreamMemOp { kind: mem_op::BARRIER, address: 0, value: 0, flags: mem_op::BARRIER_GPU };
    session.send(&req::StreamMemOps { stream: 0, ops: vec![write32(a, 7), barrier, write64] }.into(), &[]);
    let eq64 = StreamMemOp { kind: mem_op::WAIT_VALUE_64, address: a + 8, value: 0x1122_3344_5566_7788, flags: mem_op::WAIT_EQ };
    let and = StreamMemOp { flags: mem_op::WAIT_AND, ..wait32(a, 4) };
    let nor = StreamMemOp { flags: mem_op::WAIT_NOR, ..wait32(a, 0) };
    session.send(&req::StreamMemOps { stream: 0, ops: vec![wait32(a, 7), eq64, and, nor] }.into(), &[]);
    let deferred = session.call_with_deferred(req::DeviceSynchronize {}).0;
    assert_eq!((deferred.result.is_ok(), deferred.deferred), (true, None), "satisfied waits pass");
    let bytes = read_back(&mut session, a, 16);
    assert_eq!(bytes[..4], 7u32.to_le_bytes());
    assert_eq!(bytes[8..], 0x1122_3344_5566_7788u64.to_le_bytes());
    // 7 >= 8 does not hold (cyclically): the wait fails and the write after it does not run.
    session.send(&req::StreamMemOps { stream: 0, ops: vec![wait32(a, 8), write32(a, 99)] }.into(), &[]);
    let deferred = session.call_with_deferred(req::DeviceSynchronize {}).0;
    assert_eq!(deferred.deferred, Some(CudaError::NOT_SUPPORTED));
    assert_eq!(read_back(&mut session, a, 4), 7u32.to_le_bytes());
    assert_eq!(session.call_with_deferred(req::DeviceSynchronize {}).0.deferred, None, "reported once");
}

/// `cuCtxRecordEvent` fires the event over the context's work so far; `cuCtxWaitEvent` on it
/// passes; neither is allowed while a stream captures.
fn a_context_event_records_and_waits(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    let (event, stream) = (0xE_0000_0042, 0x5_0000_0042);
    session.send(&req::EventCreate { event, flags: 2 }.into(), &[]);
    session.call(req::ContextEvent { event, wait: false }).0.unwrap();
    session.call(req::ContextEvent { event, wait: true }).0.unwrap();
    session.call(req::EventQuery { event }).0.unwrap();
    session.send(&req::StreamCreate { stream, flags: 1, priority: 0 }.into(), &[]);
    session
        .call(req::StreamBeginCapture {
            stream,
            mode: 2,
            thread_mode: 2,
            graph: 9,
            into: false,
            dependencies: Vec::new(),
            data: Vec::new(),
        })
        .0
        .unwrap();
    assert_eq!(session.call(req::ContextEvent { event, wait: false }).0.err(), Some(CudaError::STREAM_CAPTURE_UNSUPPORTED));
    assert_eq!(session.call(req::ContextEvent { event, wait: true }).0.err(), Some(CudaError::STREAM_CAPTURE_UNSUPPORTED));
    session.call(req::StreamEndCapture { stream }).0.unwrap();
}

/// The device's SMs (the emulated device's 132) split into groups, a descriptor of one group, a
/// green context of it whose resource is that group; streams made in it (its default stream and
/// the app's) copy and memset as any stream does, its events record and wait; destroying it takes
/// its streams along, and a session holding one does not move.
fn green_contexts_partition_the_device_and_hold_streams(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    let device = session.call(req::DevResourceGet { green: 0, kind: dev_resource::SM }).0.unwrap().resource;
    assert_eq!((device.kind, device.sm_count, device.min_partition_size), (dev_resource::SM, 132, 8));
    // The same resource asked again is the same id.
    assert_eq!(session.call(req::DevResourceGet { green: 0, kind: dev_resource::SM }).0.unwrap().resource.id, device.id);
    let counted = session.call(req::DevResourceSplit { input: device.id, groups: None, flags: 0, min_count: 16 }).0.unwrap();
    assert_eq!((counted.count, counted.groups.len()), (8, 0));
    let split = session.call(req::DevResourceSplit { input: device.id, groups: Some(2), flags: 0, min_count: 16 }).0.unwrap();
    assert_eq!((split.count, split.groups.len(), split.remaining.sm_count), (2, 2, 100));
    assert!(split.groups.iter().all(|group| group.sm_count == 16 && group.id != device.id));
    assert_ne!(split.groups[0].id, split.groups[1].id);
    let desc = 0xD_0000_0010;
    session.call(req::DevResourceDesc { desc, resources: vec![split.groups[0].id] }).0.unwrap();
    // The descriptor's id is taken; green context flags must ask for the default stream.
    assert_eq!(session.call(req::DevResourceDesc { desc, resources: vec![split.groups[1].id] }).0.err(), Some(INVALID_VALUE));
    let (green, default_stream, stream) = (0x6_0000_0010, 0x5_0000_0110, 0x5_0000_0111);
    assert_eq!(session.call(req::GreenCtxCreate { green, desc, flags: 0, default_stream }).0.err(), Some(INVALID_VALUE));
    session.call(req::GreenCtxCreate { green, desc, flags: 1, default_stream }).0.unwrap();
    assert_eq!(session.call(req::GreenCtxCreate { green, desc, flags: 1, default_stream: 0x5_0000_0112 }).0.err(), Some(INVALID_VALUE));
    let own = session.call(req::DevResourceGet { green, kind: dev_resource::SM }).0.unwrap().resource;
    assert_eq!(own.sm_count, 16);
    // Its own resource splits again (a split's output does not).
    assert_eq!(session.call(req::DevResourceSplit { input: own.id, groups: None, flags: 0, min_count: 8 }).0.unwrap().count, 2);
    session.call(req::GreenStreamCreate { green, stream, flags: 1, priority: 0 }).0.unwrap();
    assert_eq!(session.call(req::GreenStreamCreate { green, stream, flags: 1, priority: 0 }).0.err(), Some(INVALID_VALUE));
    let ptr = session.call(req::Malloc { size: 64 }).0.unwrap().ptr;
    session.send(&req::Memset { dst: ptr, pattern: 0x5a, width: 1, len: 64, stream }.into(), &[]);
    session.send(&req::MemcpyDtoD { dst: ptr, src: ptr + 32, len: 16, stream: default_stream }.into(), &[]);
    session.call(req::StreamSynchronize { stream }).0.unwrap();
    let (result, bytes) = session.call(req::MemcpyDtoH { src: ptr, len: 64, stream: default_stream, blocking: true });
    result.unwrap();
    assert_eq!(bytes, vec![0x5a; 64]);
    let event = 0xE_0000_0110;
    session.send(&req::EventCreate { event, flags: 0 }.into(), &[]);
    session.call(req::GreenCtxEvent { green, event, wait: false }).0.unwrap();
    session.call(req::GreenCtxEvent { green, event, wait: true }).0.unwrap();
    session.call(req::EventQuery { event }).0.unwrap();
    assert_eq!(session.call(req::GreenCtxEvent { green, event: BOGUS_HANDLE, wait: false }).0.err(), Some(UNKNOWN_HANDLE));
    session.send(&req::StreamWaitEvent { stream, event, flags: 0 }.into(), &[]);
    session.call(req::DeviceSynchronize {}).0.unwrap();
    session.call(req::GreenCtxDestroy { green }).0.unwrap();
    // Its streams went with it; so did the green context.
    assert_eq!(session.call(req::StreamSynchronize { stream }).0.err(), Some(UNKNOWN_HANDLE));
    assert_eq!(session.call(req::StreamSynchronize { stream: default_stream }).0.err(), Some(UNKNOWN_HANDLE));
    assert_eq!(session.call(req::GreenCtxDestroy { green }).0.err(), Some(INVALID_CONTEXT));
    assert_eq!(session.call(req::DevResourceGet { green, kind: dev_resource::SM }).0.err(), Some(INVALID_CONTEXT));
    assert_eq!(session.call(req::GreenStreamCreate { green, stream: 0x5_0000_0113, flags: 1, priority: 0 }).0.err(), Some(INVALID_CONTEXT));
    session.call(req::Free { ptr }).0.unwrap();
}

/// Splits that ask too much, and descriptors of resources that do not go together, are refused
/// with the driver's errors.
fn bad_splits_and_descriptors_are_refused(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    let device = session.call(req::DevResourceGet { green: 0, kind: dev_resource::SM }).0.unwrap().resource;
    let split = |session: &mut RawSession, groups, flags, min_count| {
        session.call(req::DevResourceSplit { input: device.id, groups, flags, min_count }).0.map(|reply| reply.count)
    };
    // More SMs than the device has, unknown flags, no group.
    assert_eq!(split(&mut session, Some(1), 0, 133), Err(INVALID_VALUE));
    assert_eq!(split(&mut session, Some(1), 0x10, 8), Err(INVALID_VALUE));
    assert_eq!(split(&mut session, Some(0), 0, 8), Err(INVALID_VALUE));
    // No group of that size fits.
    assert_eq!(split(&mut session, Some(1), 0, 132), Err(CudaError::INVALID_RESOURCE_CONFIGURATION));
    // More groups asked than fit: as many as fit (an app's huge array costs the server nothing).
    assert_eq!(split(&mut session, Some(u32::MAX), 0, 64), Ok(2));
    assert_eq!(split(&mut session, None, dev_resource::SPLIT_IGNORE_SM_COSCHEDULING, 1), Ok(66));
    let first = session.call(req::DevResourceSplit { input: device.id, groups: Some(2), flags: 0, min_count: 8 }).0.unwrap();
    let second = session.call(req::DevResourceSplit { input: device.id, groups: Some(2), flags: 0, min_count: 8 }).0.unwrap();
    // A split's output is not split again.
    let again = session.call(req::DevResourceSplit { input: first.groups[0].id, groups: Some(1), flags: 0, min_count: 8 }).0;
    assert_eq!(again.err(), Some(CudaError::INVALID_RESOURCE_CONFIGURATION));
    let desc = |session: &mut RawSession, desc, resources| session.call(req::DevResourceDesc { desc, resources }).0.err();
    // Outputs of two splits, one twice, or the device with a group.
    assert_eq!(
        desc(&mut session, 0xD_0000_0020, vec![first.groups[0].id, second.groups[1].id]),
        Some(CudaError::INVALID_RESOURCE_CONFIGURATION)
    );
    assert_eq!(
        desc(&mut session, 0xD_0000_0021, vec![first.groups[0].id, first.groups[0].id]),
        Some(CudaError::INVALID_RESOURCE_CONFIGURATION)
    );
    assert_eq!(desc(&mut session, 0xD_0000_0022, vec![device.id, first.groups[0].id]), Some(CudaError::INVALID_RESOURCE_CONFIGURATION));
    // Outputs of one split, the remainder included, make one descriptor.
    assert_eq!(desc(&mut session, 0xD_0000_0023, vec![first.groups[0].id, first.groups[1].id, first.remaining.id]), None);
}

/// A pool's own device reads and writes it; that stays so when set again.
fn a_pool_is_read_write_on_its_device(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    assert_eq!(session.call(req::MemPoolAccess { pool: 1, set: None }).0.unwrap().flags, 3);
    session.call(req::MemPoolCreate { pool: 40, handle_types: 0 }).0.unwrap();
    assert_eq!(session.call(req::MemPoolAccess { pool: 40, set: Some(3) }).0.unwrap().flags, 3);
}

/// A pool made with the POSIX handle type is exported by one session and imported by another (two
/// workers of one server, the emulated device backing such pools with memory files); an
/// allocation of it exported by the one is imported by the other, whose copies and memsets reach
/// the same bytes. Refused: pools and allocations without the
/// handle type, an interior pointer, allocating from an imported pool or making it the device's,
/// export data of another pool's allocation, forged or malformed data, an export its exporter
/// ended (the allocation freed, the pool destroyed), and a physical allocation's shareable
/// handle given as a pool's.
fn a_pool_allocation_is_shared_between_sessions(socket: &str) {
    const MIB: u64 = 1 << 20;
    let mut exporter = RawSession::open(socket, None).unwrap();
    let mut importer = RawSession::open(socket, None).unwrap();
    let stream = 0x5_0000_0001;
    exporter.send(&req::StreamCreate { stream, flags: 1, priority: 0 }.into(), &[]);
    let exporter_before = exporter.call(req::MemGetInfo {}).0.unwrap().free;
    exporter.call(req::MemPoolCreate { pool: 2, handle_types: 1 }).0.unwrap();
    exporter.call(req::MemPoolCreate { pool: 3, handle_types: 0 }).0.unwrap();
    let a = exporter.call(req::MemAllocAsync { size: MIB, stream, pool: 2 }).0.unwrap().ptr;
    let plain = exporter.call(req::MemAllocAsync { size: MIB, stream, pool: 3 }).0.unwrap().ptr;
    exporter.send(&req::Memset { dst: a, pattern: 0x37, width: 1, len: MIB, stream }.into(), &[]);
    exporter.call(req::StreamSynchronize { stream }).0.unwrap();

    assert_eq!(exporter.call(req::MemPoolExport { pool: 3 }).0.err(), Some(INVALID_VALUE), "a pool without the handle type");
    assert_eq!(exporter.call(req::MemPoolExportPointer { ptr: plain }).0.err(), Some(INVALID_VALUE), "its allocation");
    assert_eq!(exporter.call(req::MemPoolExportPointer { ptr: a + 4096 }).0.err(), Some(INVALID_VALUE), "an interior pointer");
    let shareable = exporter.call(req::MemPoolExport { pool: 2 }).0.unwrap().shareable;
    let data = exporter.call(req::MemPoolExportPointer { ptr: a }).0.unwrap().data;
    assert_eq!(data.len(), 64);
    assert_eq!(exporter.call(req::MemPoolExportPointer { ptr: a }).0.unwrap().data, data, "one allocation, one export");

    // Pool ids are each session's own.
    importer.call(req::MemPoolImport { pool: 2, shareable: shareable.clone() }).0.unwrap();
    assert_eq!(importer.call(req::MemPoolImport { pool: 2, shareable: shareable.clone() }).0.err(), Some(INVALID_VALUE), "a taken id");
    assert_eq!(importer.call(req::MemAllocAsync { size: MIB, stream: 0, pool: 2 }).0.err(), Some(INVALID_VALUE), "an imported pool");
    assert_eq!(importer.call(req::DeviceMemPool { set: Some(2) }).0.err(), Some(INVALID_VALUE), "the device's pool");
    assert_eq!(importer.call(req::MemPoolAccess { pool: 2, set: None }).0.unwrap().flags, 3, "read-write on its device");
    let mut forged = data.clone();
    forged[8] ^= 1;
    for bad in [forged, vec![0; 64], data[..63].to_vec(), [&data[..], &[0]].concat()] {
        assert_eq!(importer.call(req::MemPoolImportPointer { pool: 2, data: bad }).0.err(), Some(INVALID_VALUE), "forged export data");
    }
    assert_eq!(importer.call(req::MemPoolImportPointer { pool: 1, data: data.clone() }).0.err(), Some(INVALID_VALUE), "not imported");

    let imported = importer.call(req::MemPoolImportPointer { pool: 2, data: data.clone() }).0.unwrap();
    assert_eq!(imported.size, MIB);
    assert_eq!(exporter.call(req::MemGetInfo {}).0.unwrap().free, exporter_before - 2 * MIB);
    assert_eq!(read_back(&mut importer, imported.ptr + 100, 16), vec![0x37; 16], "the exporter's bytes");
    importer.send(&req::Memset { dst: imported.ptr + MIB / 2, pattern: 0x5a, width: 1, len: MIB / 2, stream: 0 }.into(), &[]);
    importer.call(req::StreamSynchronize { stream: 0 }).0.unwrap();
    assert_eq!(read_back(&mut exporter, a + MIB / 2, 16), vec![0x5a; 16], "the importer's writes");
    assert_eq!(read_back(&mut exporter, a + MIB / 2 - 16, 16), vec![0x37; 16]);
    let (past_end, _) = importer.call(req::MemcpyDtoH { src: imported.ptr + MIB - 8, len: 16, stream: 0, blocking: true });
    assert_eq!(past_end.err(), Some(INVALID_VALUE), "the imported range ends where the allocation does");

    // Imported again: the same memory, one more reference; each free drops one.
    let again = importer.call(req::MemPoolImportPointer { pool: 2, data: data.clone() }).0.unwrap();
    assert_eq!(again.ptr, imported.ptr);
    importer.call(req::Free { ptr: imported.ptr }).0.unwrap();
    assert_eq!(read_back(&mut importer, imported.ptr, 16), vec![0x37; 16], "one import left");
    importer.send(&req::MemFreeAsync { ptr: imported.ptr, stream: 0 }.into(), &[]);
    let (freed, _) = importer.call(req::MemcpyDtoH { src: imported.ptr, len: 16, stream: 0, blocking: true });
    assert_eq!(freed.err(), Some(INVALID_VALUE), "freed by its importer");
    assert_eq!(importer.call(req::Free { ptr: imported.ptr }).0.err(), Some(INVALID_VALUE), "freed twice");

    // Another pool's allocation is not this pool's to import.
    exporter.call(req::MemPoolCreate { pool: 4, handle_types: 1 }).0.unwrap();
    let other = exporter.call(req::MemAllocAsync { size: MIB, stream, pool: 4 }).0.unwrap().ptr;
    let other_data = exporter.call(req::MemPoolExportPointer { ptr: other }).0.unwrap().data;
    assert_eq!(importer.call(req::MemPoolImportPointer { pool: 2, data: other_data }).0.err(), Some(INVALID_VALUE), "another pool's");

    // The exporter's free ends the allocation's export, its pool's destruction the pool's.
    exporter.send(&req::MemFreeAsync { ptr: a, stream }.into(), &[]);
    exporter.call(req::StreamSynchronize { stream }).0.unwrap();
    assert_eq!(importer.call(req::MemPoolImportPointer { pool: 2, data }).0.err(), Some(INVALID_VALUE), "a freed allocation");
    exporter.call(req::MemPoolDestroy { pool: 2 }).0.unwrap();
    assert_eq!(importer.call(req::MemPoolImport { pool: 5, shareable }).0.err(), Some(INVALID_VALUE), "a destroyed pool");
    importer.call(req::MemPoolDestroy { pool: 2 }).0.unwrap();

    // A physical allocation's shareable handle opens no pool.
    exporter.call(req::MemCreate { handle: 7, size: 2 * MIB, handle_types: 1, usage: 0 }).0.unwrap();
    let physical = exporter.call(req::MemExport { handle: 7 }).0.unwrap().shareable;
    assert_eq!(importer.call(req::MemPoolImport { pool: 6, shareable: physical }).0.err(), Some(INVALID_VALUE), "a physical allocation's");
    exporter.call(req::MemRelease { handle: 7 }).0.unwrap();

    exporter.call(req::Free { ptr: plain }).0.unwrap();
    exporter.call(req::Free { ptr: other }).0.unwrap();
    assert_eq!(exporter.call(req::MemGetInfo {}).0.unwrap().free, exporter_before, "freed memory leaves the quota");
}

/// Pool memory another session of the tenant imported is counted once in the tenant's quota (the
/// exporter's allocation), not again for the import; the importer's free gives nothing back, the
/// exporter's does.
#[test]
fn imported_pool_memory_is_counted_once_in_the_quota() {
    const MIB: u64 = 1 << 20;
    let (_server, socket) = emulated_server("op-audit-pool-quota", &["--memory-quota", "64MiB"]);
    let mut exporter = RawSession::open(&socket, None).unwrap();
    let mut importer = RawSession::open(&socket, None).unwrap();
    let free = |session: &mut RawSession| session.call(req::MemGetInfo {}).0.unwrap().free;
    let before = free(&mut importer);
    exporter.call(req::MemPoolCreate { pool: 2, handle_types: 1 }).0.unwrap();
    let ptr = exporter.call(req::MemAllocAsync { size: 8 * MIB, stream: 0, pool: 2 }).0.unwrap().ptr;
    let shareable = exporter.call(req::MemPoolExport { pool: 2 }).0.unwrap().shareable;
    let data = exporter.call(req::MemPoolExportPointer { ptr }).0.unwrap().data;
    assert_eq!(free(&mut importer), before - 8 * MIB, "the exporter's allocation");
    importer.call(req::MemPoolImport { pool: 2, shareable }).0.unwrap();
    let imported = importer.call(req::MemPoolImportPointer { pool: 2, data }).0.unwrap().ptr;
    assert_eq!(free(&mut importer), before - 8 * MIB, "the import is not counted again");
    importer.call(req::Free { ptr: imported }).0.unwrap();
    assert_eq!(free(&mut importer), before - 8 * MIB, "the importer's free gives back nothing");
    exporter.call(req::Free { ptr }).0.unwrap();
    assert_eq!(free(&mut importer), before);
}

/// A decompression of 100 bytes at `ptr` into 1 KiB after them, its size written at `ptr + 2048`.
fn decompress(ptr: u64) -> DecompressOp {
    DecompressOp { src: ptr, src_len: 100, dst: ptr + 1024, dst_len: 1024, dst_act_bytes: ptr + 2048, algo: decompress_algorithm::LZ4 }
}

/// A batch the session accepts reaches the device, whose own answer comes back in the reply
/// with the index it names: the emulated device, like a GPU without the engine, has none.
fn a_decompression_gets_the_devices_own_answer(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    let ptr = session.call(req::Malloc { size: 4096 }).0.unwrap().ptr;
    let reply = session.call(req::MemBatchDecompress { ops: vec![decompress(ptr); 2], stream: 0 }).0.unwrap();
    assert_eq!((reply.error, reply.error_index), (Some(CudaError::NOT_SUPPORTED), None), "the index left as it was");
    session.call(req::Free { ptr }).0.unwrap();
}

/// An NV12 array counts in the quota with both planes; each plane is an array of the session
/// (named once), copied to and from byte for byte, which a texture can read and which goes with
/// its array; the array itself is no box to copy.
fn planar_arrays_are_copied_plane_by_plane(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    let before = session.call(req::MemGetInfo {}).0.unwrap().free;
    let nv12 = ArrayDesc { width: 64, height: 32, depth: 0, format: array_format::NV12, channels: 3, flags: 0 };
    session.call(req::ArrayCreate { array: 60, desc: nv12, levels: None }).0.unwrap();
    assert_eq!(session.call(req::MemGetInfo {}).0.unwrap().free, before - 64 * 32 - 32 * 16 * 2, "luma and chroma in the quota");
    assert_eq!(session.call(req::ArrayCreate { array: 66, desc: nv12, levels: Some(2) }).0.err(), Some(CudaError::NOT_SUPPORTED));
    assert_eq!(session.call(req::ArrayGetPlane { array: 60, plane: 2, plane_array: 61 }).0.err(), Some(INVALID_VALUE), "two planes");
    let luma = session.call(req::ArrayGetPlane { array: 60, plane: 0, plane_array: 61 }).0.unwrap().desc;
    assert_eq!((luma.width, luma.height, luma.depth, luma.format, luma.channels), (64, 32, 0, array_format::UNSIGNED_INT8, 1));
    let chroma = session.call(req::ArrayGetPlane { array: 60, plane: 1, plane_array: 62 }).0.unwrap().desc;
    assert_eq!((chroma.width, chroma.height, chroma.format, chroma.channels), (32, 16, array_format::UNSIGNED_INT8, 2));
    let again = session.call(req::ArrayGetPlane { array: 60, plane: 0, plane_array: 61 }).0;
    assert_eq!(again.err(), Some(INVALID_VALUE), "an id already taken");
    let of_plane = session.call(req::ArrayGetPlane { array: 61, plane: 0, plane_array: 63 }).0;
    assert_eq!(of_plane.err(), Some(INVALID_VALUE), "a plane has no planes");
    session.call(req::ArrayCreate { array: 64, desc: float_array(8, 8), levels: None }).0.unwrap();
    assert_eq!(session.call(req::ArrayGetPlane { array: 64, plane: 0, plane_array: 65 }).0.err(), Some(INVALID_VALUE), "not planar");
    // Each plane holds its own bytes.
    let luma_bytes: Vec<u8> = (0..64u32 * 32).map(|i| (i * 7 + 3).to_le_bytes()[0]).collect();
    let chroma_bytes: Vec<u8> = (0..64u32 * 16).map(|i| (i * 5 + 1).to_le_bytes()[0]).collect();
    session.send(&req::MemcpyHtoShaped { copy: host_box(false, CopySide::Array { array: 61 }, 64, 32), stream: 0 }.into(), &luma_bytes);
    session.send(&req::MemcpyHtoShaped { copy: host_box(false, CopySide::Array { array: 62 }, 64, 16), stream: 0 }.into(), &chroma_bytes);
    let (luma_back, bytes) =
        session.call(req::MemcpyShapedToH { copy: host_box(true, CopySide::Array { array: 61 }, 64, 32), stream: 0, blocking: true });
    luma_back.unwrap();
    assert_eq!(bytes, luma_bytes, "luma plane");
    let (chroma_back, bytes) =
        session.call(req::MemcpyShapedToH { copy: host_box(true, CopySide::Array { array: 62 }, 64, 16), stream: 0, blocking: true });
    chroma_back.unwrap();
    assert_eq!(bytes, chroma_bytes, "chroma plane");
    let past =
        session.call(req::MemcpyShapedToH { copy: host_box(true, CopySide::Array { array: 62 }, 64, 17), stream: 0, blocking: true });
    assert_eq!(past.0.err(), Some(INVALID_VALUE), "a box past the chroma plane's rows");
    let whole =
        session.call(req::MemcpyShapedToH { copy: host_box(true, CopySide::Array { array: 60 }, 16, 1), stream: 0, blocking: true });
    assert_eq!(whole.0.err(), Some(INVALID_VALUE), "the array is copied plane by plane");
    let texture = session
        .call(req::TexObjectCreate { resource: Resource::Array { array: 61 }, texture: TextureDesc::default(), view: None })
        .0
        .unwrap();
    session.call(req::ObjectDestroy { handle: texture.handle, surface: false }).0.unwrap();
    assert_eq!(session.call(req::ArrayDestroy { array: 61 }).0.err(), Some(INVALID_VALUE), "a plane goes with its array");
    session.call(req::ArrayDestroy { array: 60 }).0.unwrap();
    let gone =
        session.call(req::MemcpyShapedToH { copy: host_box(true, CopySide::Array { array: 62 }, 64, 16), stream: 0, blocking: true });
    assert_eq!(gone.0.err(), Some(INVALID_VALUE), "the planes went with it");
    session.call(req::ArrayDestroy { array: 64 }).0.unwrap();
    assert_eq!(session.call(req::MemGetInfo {}).0.unwrap().free, before, "everything left the quota");
}

/// Sparse and deferred-mapping arrays hold no memory of their own; their layouts are answered
/// (64 KiB tiles, a mip tail, a size rounded up to tiles), and a map names whole tiles (or the
/// mip tail, or a deferred array whole) of the session's own arrays onto the session's tile
/// pools, inside them and aligned, for its one device. Every other entry is refused before the
/// device sees it; the emulated device refuses the maps it is sent, and copies into such arrays.
fn sparse_arrays_map_whole_tiles_of_tile_pools_only(socket: &str) {
    let mut session = RawSession::open(socket, None).unwrap();
    let before = session.call(req::MemGetInfo {}).0.unwrap().free;
    let sparse = ArrayDesc { flags: array_flags::SPARSE, ..float_array(1000, 600) };
    session.call(req::ArrayCreate { array: 50, desc: sparse, levels: None }).0.unwrap();
    assert_eq!(session.call(req::MemGetInfo {}).0.unwrap().free, before, "a sparse array holds no memory of its own");
    let properties = session.call(req::ArraySparseProperties { array: 50 }).0.unwrap().properties;
    assert_eq!((properties.tile, properties.miptail_size), ([128, 128, 1], 0), "64 KiB tiles of floats");
    session.call(req::ArrayCreate { array: 51, desc: float_array(8, 8), levels: None }).0.unwrap();
    assert_eq!(session.call(req::ArraySparseProperties { array: 51 }).0.err(), Some(INVALID_VALUE), "not sparse");
    assert_eq!(session.call(req::ArrayMemoryRequirements { array: 50 }).0.err(), Some(INVALID_VALUE), "not deferred");
    // Levels 0-3 of 1024 x 1024 floats hold whole tiles; 64 x 64 and below are the mip tail.
    let mipmapped = ArrayDesc { flags: array_flags::SPARSE, ..float_array(1024, 1024) };
    session.call(req::ArrayCreate { array: 52, desc: mipmapped, levels: Some(8) }).0.unwrap();
    let tail = session.call(req::ArraySparseProperties { array: 52 }).0.unwrap().properties;
    assert_eq!((tail.miptail_first_level, tail.miptail_size), (4, 65536));
    session.call(req::MipmappedArrayLevel { mipmap: 52, level: 0, array: 53 }).0.unwrap();
    assert_eq!(session.call(req::ArraySparseProperties { array: 53 }).0.err(), Some(INVALID_VALUE), "a level: its mipmapped array's");
    let deferred = ArrayDesc { flags: array_flags::DEFERRED_MAPPING, ..float_array(100, 100) };
    session.call(req::ArrayCreate { array: 54, desc: deferred, levels: None }).0.unwrap();
    let requirements = session.call(req::ArrayMemoryRequirements { array: 54 }).0.unwrap();
    assert_eq!((requirements.size, requirements.alignment), (65536, 65536), "100 x 100 floats in one 128 x 128 tile");

    let granularity = session.call(req::MemGranularity { recommended: false, host: false }).0.unwrap().granularity;
    let pool = 2 * granularity;
    session.call(req::MemCreate { handle: 1, size: pool, handle_types: 0, usage: mem_usage::TILE_POOL }).0.unwrap();
    session.call(req::MemCreate { handle: 2, size: granularity, handle_types: 0, usage: 0 }).0.unwrap();
    let level = |offset: [u32; 3], extent: [u32; 3]| Subresource::SparseLevel { level: 0, layer: 0, offset, extent };
    let map = |array: u64, mipmapped: bool, subresource: Subresource, memory: Option<(u64, u64)>| ArrayMap {
        array,
        mipmapped,
        subresource,
        memory,
        device_mask: 1,
    };
    let tile = level([0, 0, 0], [128, 128, 1]);
    let good = map(50, false, tile, Some((1, 0)));
    let refusals = [
        ("an offset inside a tile", map(50, false, level([64, 0, 0], [128, 128, 1]), Some((1, 0)))),
        ("part of a tile inside the array", map(50, false, level([0, 0, 0], [100, 128, 1]), Some((1, 0)))),
        ("tiles past the array's edge", map(50, false, level([896, 0, 0], [256, 128, 1]), Some((1, 0)))),
        ("depth in a 2D array", map(50, false, level([0, 0, 0], [128, 128, 2]), Some((1, 0)))),
        (
            "level 1 of an array",
            map(50, false, Subresource::SparseLevel { level: 1, layer: 0, offset: [0; 3], extent: [128, 128, 1] }, Some((1, 0))),
        ),
        (
            "layer 1 of an unlayered array",
            map(50, false, Subresource::SparseLevel { level: 0, layer: 1, offset: [0; 3], extent: [128, 128, 1] }, Some((1, 0))),
        ),
        ("memory that is no tile pool", map(50, false, tile, Some((2, 0)))),
        ("an unknown allocation", map(50, false, tile, Some((BOGUS_HANDLE, 0)))),
        ("an offset inside a tile of the pool", map(50, false, tile, Some((1, 4096)))),
        ("tiles past the pool's end", map(50, false, level([0, 0, 0], [256, 256, 1]), Some((1, pool - 65536)))),
        ("another device", ArrayMap { device_mask: 2, ..good }),
        ("an array as a mipmapped array", map(50, true, tile, Some((1, 0)))),
        ("a sparse array whole", map(50, false, Subresource::Whole, Some((1, 0)))),
        ("an array with memory of its own", map(51, false, tile, Some((1, 0)))),
        ("a level of a mipmapped array", map(53, false, tile, Some((1, 0)))),
        (
            "a level in the mip tail",
            map(52, true, Subresource::SparseLevel { level: 4, layer: 0, offset: [0; 3], extent: [64, 64, 1] }, Some((1, 0))),
        ),
        ("more than the mip tail", map(52, true, Subresource::Miptail { layer: 0, offset: 0, size: 131072 }, Some((1, 0)))),
        ("part of a tile of the mip tail", map(52, true, Subresource::Miptail { layer: 0, offset: 0, size: 4096 }, Some((1, 0)))),
        ("a deferred array by its tiles", map(54, false, tile, Some((1, 0)))),
        ("a deferred array at an unaligned offset", map(54, false, Subresource::Whole, Some((1, 4096)))),
    ];
    for (what, bad) in refusals {
        assert_eq!(session.call(req::MemMapArray { maps: vec![bad], stream: 0 }).0.err(), Some(INVALID_VALUE), "{what}");
        // One bad entry refuses the batch.
        assert_eq!(session.call(req::MemMapArray { maps: vec![good, bad], stream: 0 }).0.err(), Some(INVALID_VALUE), "{what} in a batch");
    }
    let on_unknown_stream = session.call(req::MemMapArray { maps: vec![good], stream: BOGUS_HANDLE }).0;
    assert_eq!(on_unknown_stream.err(), Some(UNKNOWN_HANDLE));
    // What the session accepts reaches the device: the emulated device maps nothing.
    let accepted = [
        ("the edge tiles, up to the array's edge", map(50, false, level([896, 512, 0], [104, 88, 1]), Some((1, 0)))),
        ("a tile unmapped", map(50, false, tile, None)),
        ("the mip tail", map(52, true, Subresource::Miptail { layer: 0, offset: 0, size: 65536 }, Some((1, 65536)))),
        (
            "a level above the mip tail",
            map(52, true, Subresource::SparseLevel { level: 3, layer: 0, offset: [0; 3], extent: [128, 128, 1] }, Some((1, 0))),
        ),
        ("a deferred array whole", map(54, false, Subresource::Whole, Some((1, 0)))),
    ];
    for (what, ok) in accepted {
        assert_eq!(session.call(req::MemMapArray { maps: vec![ok], stream: 0 }).0.err(), Some(CudaError::NOT_SUPPORTED), "{what}");
    }
    // Nothing can be mapped into a sparse array here, so no copy into one means anything.
    let ptr = session.call(req::Malloc { size: 4096 }).0.unwrap().ptr;
    let into_sparse = device_box(ptr, 512, 8, 512, 8, 1, CopySide::Array { array: 50 });
    session.send(&req::MemcpyShaped { copy: into_sparse, stream: 0 }.into(), &[]);
    let refused = session.call_with_deferred(req::DeviceSynchronize {}).0;
    assert_eq!(refused.deferred, Some(CudaError::NOT_SUPPORTED), "a copy into a sparse array on the emulated device");
    for array in [50, 51, 52, 54] {
        session.call(req::ArrayDestroy { array }).0.unwrap();
    }
    session.call(req::Free { ptr }).0.unwrap();
    session.call(req::MemRelease { handle: 1 }).0.unwrap();
    session.call(req::MemRelease { handle: 2 }).0.unwrap();
    assert_eq!(session.call(req::MemGetInfo {}).0.unwrap().free, before, "everything left the quota");
}

/// Under an SM share, the device's SM resource is the share the device reports (MPS gives a GPU
/// context its share; the emulated device is made with it), and splits divide that.
#[test]
fn an_sm_share_is_the_device_resource() {
    let (_server, socket) = emulated_server("op-audit-sm-share", &["--sm-percentage", "25"]);
    let mut session = RawSession::open(&socket, None).expect("session");
    let reported = session.info.devices[0].attribute(flyt_protocol::device::attr::MULTIPROCESSOR_COUNT);
    let resource = session.call(req::DevResourceGet { green: 0, kind: dev_resource::SM }).0.unwrap().resource;
    assert_eq!((reported, resource.sm_count), (Some(33), 33));
    let counted = session.call(req::DevResourceSplit { input: resource.id, groups: None, flags: 0, min_count: 8 }).0.unwrap();
    assert_eq!(counted.count, 4);
}
