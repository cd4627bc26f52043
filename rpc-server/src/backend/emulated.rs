//! The emulated device: device memory is host memory, every copy and memset is real, and work
//! completes when it is submitted. It cannot run GPU code: loading a module or launching a kernel
//! is `cudaErrorNotSupported`, never a pretended success. CI tests the whole data plane on it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use flyt_protocol::CudaError;
use flyt_protocol::device::{DeviceInfo, attr};
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{Dim3, FuncAttributes, JitOption, LaunchAttribute, LinkOutcome, ParamInfo};

use super::Device;

/// First fake device address: far from where Linux places a process's heap and libraries, and
/// 2 MiB-aligned like real allocations.
const BASE_ADDRESS: u64 = 0x7e00_0000_0000;
const ALIGNMENT: u64 = 2 << 20;

/// Sizes of the emulated device.
#[derive(Clone, Copy, Debug)]
pub struct EmulatedConfig {
    pub memory: u64,
    pub sms: u32,
}

/// An event: whether it keeps time (`cudaEventDisableTiming` not set) and when it last fired.
struct Event {
    timing: bool,
    recorded: Option<Instant>,
}

/// `cudaStreamNonBlocking`.
const STREAM_FLAGS: u32 = 0x1;
/// `cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess`.
const EVENT_FLAGS: u32 = 0x7;
const EVENT_DISABLE_TIMING: u32 = 0x2;
const EVENT_INTERPROCESS: u32 = 0x4;
/// `cudaEventRecordExternal` / `cudaEventWaitExternal`: meaningful only in stream capture.
const EXTERNAL: u32 = 0x1;

#[derive(Default)]
struct State {
    blocks: HashMap<u64, Vec<u8>>,
    next_address: u64,
    used: u64,
    events: HashMap<u64, Event>,
    next_handle: u64,
    limits: HashMap<u32, u64>,
    /// The context's cache preference (`CU_FUNC_CACHE_PREFER_NONE` until set).
    cache_config: u32,
}

/// A host-memory device.
pub struct EmulatedDevice {
    config: EmulatedConfig,
    state: Mutex<State>,
}

impl EmulatedDevice {
    pub fn new(config: EmulatedConfig) -> Self {
        Self { config, state: Mutex::new(State { next_address: BASE_ADDRESS, next_handle: 1, ..State::default() }) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Finds the block holding `[ptr, ptr + len)`; the session validated the range already, so a
/// miss here is a bookkeeping bug reported as an invalid value, not a crash.
fn block_slice(blocks: &mut HashMap<u64, Vec<u8>>, ptr: u64, len: u64) -> CudaResult<&mut [u8]> {
    let (base, block) = blocks
        .iter_mut()
        .find(|(base, block)| ptr >= **base && ptr - **base + len <= block.len() as u64)
        .ok_or(CudaError::INVALID_VALUE)?;
    let offset = usize::try_from(ptr - base).map_err(|_| CudaError::INVALID_VALUE)?;
    let len = usize::try_from(len).map_err(|_| CudaError::INVALID_VALUE)?;
    Ok(&mut block[offset..offset + len])
}

/// Fills `target` with elements `width` bytes wide, each the low bytes of `pattern`.
fn fill_elements(target: &mut [u8], pattern: u32, width: u8) {
    if width <= 1 {
        // One byte: a plain fill (element by element would copy byte by byte).
        return target.fill(pattern as u8);
    }
    let element = &pattern.to_le_bytes()[..usize::from(width.min(4))];
    for chunk in target.chunks_mut(element.len()) {
        chunk.copy_from_slice(&element[..chunk.len()]);
    }
}

const NO_GPU_CODE: CudaError = CudaError::NOT_SUPPORTED;

/// A link step on the emulated device: it has no JIT compiler or linker, and says so in the
/// error log the app reads.
fn no_linker() -> LinkOutcome {
    LinkOutcome {
        error: Some(NO_GPU_CODE),
        error_log: "flyt: the emulated device has no JIT linker (it runs no GPU code)".into(),
        ..LinkOutcome::default()
    }
}

impl Device for EmulatedDevice {
    type Stream = u64;
    type Event = u64;
    type Module = ();
    type Link = ();
    type Function = ();
    type Staging = Vec<u8>;
    type PendingCopy = CudaResult<Vec<u8>>;

    fn info(&self) -> DeviceInfo {
        let sms = i32::try_from(self.config.sms).unwrap_or(i32::MAX);
        // A Hopper-like shape, so apps that size their launches from properties behave.
        let attributes = vec![
            (attr::MAX_THREADS_PER_BLOCK, 1024),
            (attr::MAX_BLOCK_DIM_X, 1024),
            (attr::MAX_BLOCK_DIM_Y, 1024),
            (attr::MAX_BLOCK_DIM_Z, 64),
            (attr::MAX_GRID_DIM_X, i32::MAX),
            (attr::MAX_GRID_DIM_Y, 65535),
            (attr::MAX_GRID_DIM_Z, 65535),
            (attr::MAX_SHARED_MEMORY_PER_BLOCK, 48 << 10),
            (attr::TOTAL_CONSTANT_MEMORY, 64 << 10),
            (attr::WARP_SIZE, 32),
            (attr::MAX_PITCH, i32::MAX),
            (attr::MAX_REGISTERS_PER_BLOCK, 65536),
            (attr::CLOCK_RATE, 1_980_000),
            (attr::TEXTURE_ALIGNMENT, 512),
            (attr::MULTIPROCESSOR_COUNT, sms),
            (attr::CAN_MAP_HOST_MEMORY, 1),
            (attr::CONCURRENT_KERNELS, 1),
            (attr::MEMORY_CLOCK_RATE, 3_201_000),
            (attr::GLOBAL_MEMORY_BUS_WIDTH, 6144),
            (attr::L2_CACHE_SIZE, 60 << 20),
            (attr::MAX_THREADS_PER_MULTIPROCESSOR, 2048),
            (attr::ASYNC_ENGINE_COUNT, 2),
            (attr::UNIFIED_ADDRESSING, 1),
            (attr::COMPUTE_CAPABILITY_MAJOR, 9),
            (attr::COMPUTE_CAPABILITY_MINOR, 0),
            (attr::STREAM_PRIORITIES_SUPPORTED, 1),
            (attr::MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, 228 << 10),
            (attr::MAX_REGISTERS_PER_MULTIPROCESSOR, 65536),
            (attr::MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 227 << 10),
            (attr::MAX_BLOCKS_PER_MULTIPROCESSOR, 32),
        ];
        DeviceInfo {
            name: "Flyt Emulated Device (no GPU: kernels cannot run)".into(),
            uuid: *b"flyt-emulated-00",
            luid: [0; 8],
            luid_device_node_mask: 0,
            total_mem: self.config.memory,
            attributes,
        }
    }

    fn driver_version(&self) -> i32 {
        flyt_protocol::handshake::RUNTIME_VERSION
    }

    fn emulated(&self) -> bool {
        true
    }

    fn bind_thread(&self) -> CudaResult<()> {
        Ok(())
    }

    fn null_stream(&self) -> u64 {
        0
    }

    fn malloc(&self, size: u64) -> CudaResult<u64> {
        let mut state = self.state();
        if size > self.config.memory - state.used {
            return Err(CudaError::MEMORY_ALLOCATION);
        }
        let len = usize::try_from(size).map_err(|_| CudaError::MEMORY_ALLOCATION)?;
        let address = state.next_address;
        state.next_address += size.max(1).div_ceil(ALIGNMENT) * ALIGNMENT;
        state.used += size;
        // `vec![0; n]` asks for zeroed pages, which the kernel maps lazily: a large allocation
        // costs nothing until it is written.
        state.blocks.insert(address, vec![0; len]);
        Ok(address)
    }

    fn free(&self, ptr: u64) -> CudaResult<()> {
        let mut state = self.state();
        let block = state.blocks.remove(&ptr).ok_or(CudaError::INVALID_VALUE)?;
        state.used -= block.len() as u64;
        Ok(())
    }

    fn mem_get_info(&self) -> CudaResult<(u64, u64)> {
        Ok((self.config.memory - self.state().used, self.config.memory))
    }

    fn staging(&self, len: usize) -> CudaResult<Vec<u8>> {
        Ok(vec![0; len])
    }

    fn staging_bytes(staging: &mut Vec<u8>) -> &mut [u8] {
        staging
    }

    fn copy_htod(&self, dst: u64, src: Vec<u8>, _stream: u64) -> CudaResult<()> {
        block_slice(&mut self.state().blocks, dst, src.len() as u64)?.copy_from_slice(&src);
        Ok(())
    }

    fn start_dtoh(&self, src: u64, mut dst: Vec<u8>, _stream: u64) -> CudaResult<CudaResult<Vec<u8>>> {
        let len = dst.len() as u64;
        dst.copy_from_slice(block_slice(&mut self.state().blocks, src, len)?);
        Ok(Ok(dst))
    }

    fn dtoh_done(&self, _pending: &CudaResult<Vec<u8>>) -> bool {
        true
    }

    fn dtoh_bytes<'a>(&self, pending: &'a CudaResult<Vec<u8>>) -> CudaResult<&'a [u8]> {
        pending.as_deref().map_err(|error| *error)
    }

    fn copy_dtod(&self, dst: u64, src: u64, len: u64, _stream: u64) -> CudaResult<()> {
        let mut state = self.state();
        let bytes = block_slice(&mut state.blocks, src, len)?.to_vec();
        block_slice(&mut state.blocks, dst, len)?.copy_from_slice(&bytes);
        Ok(())
    }

    unsafe fn host_register(&self, _ptr: *mut u8, _len: usize, _mapped: bool) -> CudaResult<()> {
        Ok(())
    }

    /// Unified addressing, as on a GPU: mapped host memory has its host address on the device.
    fn host_device_pointer(&self, ptr: *mut u8) -> CudaResult<u64> {
        Ok(ptr as u64)
    }

    unsafe fn host_unregister(&self, _ptr: *mut u8) -> CudaResult<()> {
        Ok(())
    }

    unsafe fn copy_from_host(&self, dst: u64, src: *const u8, len: usize, _stream: u64) -> CudaResult<()> {
        // SAFETY: the caller guarantees `src..src+len` is mapped host memory.
        let source = unsafe { std::slice::from_raw_parts(src, len) };
        block_slice(&mut self.state().blocks, dst, len as u64)?.copy_from_slice(source);
        Ok(())
    }

    unsafe fn copy_to_host(&self, dst: *mut u8, src: u64, len: usize, _stream: u64) -> CudaResult<()> {
        // SAFETY: the caller guarantees `dst..dst+len` is mapped host memory nothing else writes
        // during the copy.
        let target = unsafe { std::slice::from_raw_parts_mut(dst, len) };
        target.copy_from_slice(block_slice(&mut self.state().blocks, src, len as u64)?);
        Ok(())
    }

    fn memset(&self, dst: u64, pattern: u32, width: u8, len: u64, _stream: u64) -> CudaResult<()> {
        fill_elements(block_slice(&mut self.state().blocks, dst, len)?, pattern, width);
        Ok(())
    }

    unsafe fn memset_mapped_host(&self, dst: u64, pattern: u32, width: u8, len: u64, _stream: u64) -> CudaResult<()> {
        let len = usize::try_from(len).map_err(|_| CudaError::INVALID_VALUE)?;
        // SAFETY: the caller guarantees `[dst, dst + len)` is mapped host memory of this process;
        // the emulated device runs every operation at once, so nothing else writes it meanwhile.
        let target = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, len) };
        fill_elements(target, pattern, width);
        Ok(())
    }

    fn load_module(&self, _image: &[u8]) -> CudaResult<()> {
        Err(NO_GPU_CODE)
    }

    fn function(&self, _module: &(), _name: &str) -> CudaResult<((), Vec<ParamInfo>)> {
        Err(NO_GPU_CODE)
    }

    fn function_names(&self, _module: &()) -> CudaResult<Vec<String>> {
        Err(NO_GPU_CODE)
    }

    fn variable(&self, _module: &(), _name: &str) -> CudaResult<(u64, u64)> {
        Err(NO_GPU_CODE)
    }

    fn unload_module(&self, _module: ()) -> CudaResult<()> {
        Ok(())
    }

    fn link_create(&self, _options: &[JitOption], _info_log: usize, _error_log: usize) -> CudaResult<()> {
        Ok(())
    }

    fn link_add(&self, _link: &mut (), _kind: u32, _name: &str, _data: Vec<u8>, _options: &[JitOption]) -> LinkOutcome {
        no_linker()
    }

    fn link_complete(&self, _link: &mut ()) -> (LinkOutcome, Vec<u8>) {
        (no_linker(), Vec::new())
    }

    fn launch(&self, _: (), _: Dim3, _: Dim3, _: u32, _: u64, _: &mut [u8], _: &[LaunchAttribute]) -> CudaResult<()> {
        Err(NO_GPU_CODE)
    }

    fn available_dynamic_smem(&self, _: (), _: i32, _: i32) -> CudaResult<u64> {
        Err(NO_GPU_CODE)
    }

    fn occupancy_max_active_clusters(&self, _: (), _: Dim3, _: Dim3, _: u32, _: &[LaunchAttribute]) -> CudaResult<i32> {
        Err(NO_GPU_CODE)
    }

    fn func_attributes(&self, _function: ()) -> CudaResult<FuncAttributes> {
        Err(NO_GPU_CODE)
    }

    fn func_set_attribute(&self, _function: (), _attribute: u32, _value: i32) -> CudaResult<()> {
        Err(NO_GPU_CODE)
    }

    fn occupancy(&self, _function: (), _block_size: i32, _dynamic_shared_mem: u64, _flags: u32) -> CudaResult<i32> {
        Err(NO_GPU_CODE)
    }

    fn stream_create(&self, flags: u32, _priority: i32) -> CudaResult<u64> {
        if flags & !STREAM_FLAGS != 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        let mut state = self.state();
        state.next_handle += 1;
        Ok(state.next_handle)
    }

    fn stream_priority_range(&self) -> CudaResult<(i32, i32)> {
        // The range Hopper GPUs report, matching the attributes above (priorities supported).
        Ok((0, -5))
    }

    fn stream_destroy(&self, _stream: u64) -> CudaResult<()> {
        Ok(())
    }

    fn stream_query(&self, _stream: u64) -> CudaResult<()> {
        Ok(())
    }

    fn stream_wait_event(&self, _stream: u64, _event: u64, flags: u32) -> CudaResult<()> {
        // Work completes at submission: the event has fired, there is nothing to wait for.
        if flags & !EXTERNAL != 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        Ok(())
    }

    fn event_create(&self, flags: u32) -> CudaResult<u64> {
        // As the driver: known flags only, and an interprocess event keeps no time.
        if flags & !EVENT_FLAGS != 0 || (flags & EVENT_INTERPROCESS != 0 && flags & EVENT_DISABLE_TIMING == 0) {
            return Err(CudaError::INVALID_VALUE);
        }
        let mut state = self.state();
        state.next_handle += 1;
        let handle = state.next_handle;
        state.events.insert(handle, Event { timing: flags & EVENT_DISABLE_TIMING == 0, recorded: None });
        Ok(handle)
    }

    fn event_record(&self, event: u64, _stream: u64, flags: u32) -> CudaResult<()> {
        if flags & !EXTERNAL != 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        // Work completes at submission, so the event fires when it is recorded.
        self.state().events.get_mut(&event).ok_or(CudaError::INVALID_RESOURCE_HANDLE)?.recorded = Some(Instant::now());
        Ok(())
    }

    fn event_query(&self, _event: u64) -> CudaResult<()> {
        Ok(())
    }

    fn event_synchronize(&self, _event: u64) -> CudaResult<()> {
        Ok(())
    }

    fn event_elapsed(&self, start: u64, end: u64) -> CudaResult<f32> {
        let state = self.state();
        // CUDA: an event without timing, or never recorded, has no time to give.
        let recorded = |event| {
            state.events.get(&event).filter(|event| event.timing).and_then(|event| event.recorded).ok_or(CudaError::INVALID_RESOURCE_HANDLE)
        };
        let (start, end) = (recorded(start)?, recorded(end)?);
        let millis =
            if end >= start { end.duration_since(start).as_secs_f32() * 1e3 } else { -(start.duration_since(end).as_secs_f32() * 1e3) };
        Ok(millis)
    }

    fn event_destroy(&self, event: u64) -> CudaResult<()> {
        self.state().events.remove(&event);
        Ok(())
    }

    fn synchronize(&self) -> CudaResult<()> {
        Ok(())
    }

    fn reset(&self) -> CudaResult<()> {
        // As a new context: no memory, no events, default limits (addresses keep growing, so a
        // stale pointer from before never names new memory).
        let mut state = self.state();
        state.blocks.clear();
        state.used = 0;
        state.events.clear();
        state.limits.clear();
        state.cache_config = 0;
        Ok(())
    }

    fn func_set_cache_config(&self, _function: (), config: u32) -> CudaResult<()> {
        // A preference the emulated device has no cache to apply to; its value is checked as
        // the driver checks it.
        cache_config(config).map(drop)
    }

    fn set_cache_config(&self, config: u32) -> CudaResult<()> {
        self.state().cache_config = cache_config(config)?;
        Ok(())
    }

    fn cache_config(&self) -> CudaResult<u32> {
        Ok(self.state().cache_config)
    }

    fn profiler(&self, _start: bool) -> CudaResult<()> {
        // No profiler is attached to this process: the driver answers success then too.
        Ok(())
    }

    fn reset_persisting_l2_cache(&self) -> CudaResult<()> {
        // No L2 lines persist on a host-memory device.
        Ok(())
    }

    fn set_limit(&self, limit: u32, value: u64) -> CudaResult<()> {
        default_limit(limit)?;
        // cudaLimitMaxL2FetchGranularity is a hint from 0 to 128 bytes, clamped as drivers do.
        let value = if limit == LIMIT_MAX_L2_FETCH_GRANULARITY { value.min(128) } else { value };
        self.state().limits.insert(limit, value);
        Ok(())
    }

    fn get_limit(&self, limit: u32) -> CudaResult<u64> {
        let default = default_limit(limit)?;
        Ok(self.state().limits.get(&limit).copied().unwrap_or(default))
    }
}

const LIMIT_MAX_L2_FETCH_GRANULARITY: u32 = 5;

/// A `CUfunc_cache` value: prefer none, shared memory, L1, or equal.
fn cache_config(config: u32) -> CudaResult<u32> {
    if config <= 3 { Ok(config) } else { Err(CudaError::INVALID_VALUE) }
}

/// A `cudaLimit`'s default on this Hopper-shaped device; a limit CUDA does not define, or one a
/// compute capability 9.0 device does not have (`cudaLimitDevRuntimeSyncDepth`), is
/// `cudaErrorUnsupportedLimit`, as the driver answers, never stored and ignored.
fn default_limit(limit: u32) -> CudaResult<u64> {
    match limit {
        // Stack size, printf FIFO, malloc heap.
        0 => Ok(1024),
        1 | 2 => Ok(8 << 20),
        // Pending device-runtime launches (CUDA documents 2048), L2 fetch granularity, persisting
        // L2 cache size.
        4 => Ok(2048),
        LIMIT_MAX_L2_FETCH_GRANULARITY => Ok(64),
        6 => Ok(0),
        _ => Err(CudaError::UNSUPPORTED_LIMIT),
    }
}
