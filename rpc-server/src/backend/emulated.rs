//! The emulated device: device memory is host memory, every copy and memset is real, and work
//! completes when it is submitted. It cannot run GPU code: loading a module or launching a kernel
//! is `cudaErrorNotSupported`, never a pretended success. CI tests the whole data plane on it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::Instant;

use flyt_protocol::CudaError;
use flyt_protocol::device::{DeviceInfo, HOPPER_LIMITS, attr};
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{
    ArrayDesc, Copy3d, DecompressOp, DevResource, FuncAttributes, JitOption, LinkOutcome, Memset2d, NodeCopy, NodeCopySide, ParamInfo,
    Pos3, SPARSE_TILE_BYTES, SparseProperties, StreamMemOp, TensorMapParams, TextureDesc, ViewDesc, array_flags, capture_status,
    dev_resource, mem_op, mem_usage,
};

use super::emulated_graphs::{Graphs, HostRunner, StreamCapture, Work};
use super::emulated_green::EmulatedResource;
use super::{
    AddedNode, ArrayMapWork, ArrayRef, Capture, CaptureInto, Device, EdgeData, ExecUpdate, Extent, KernelRead, LaunchShape, NodeRead,
    NodeWork, Side, SmSplit, TexResource,
};
use crate::host_calls::HostCallSite;
use std::sync::Arc;

/// First fake device address: where a worker's real device addresses lie (`address_space`: the
/// bottom-up layout starts at a third of the address space), and 2 MiB-aligned like real
/// allocations. Each worker starts at its own offset from it (a GPU's addresses differ between
/// processes too), so a moved session's pointers are the same only if the restore put its
/// memory back where it was.
const BASE_ADDRESS: u64 = 0x2b00_0000_0000;
/// Steps between workers' first addresses (4096 of them: 16 TiB).
const BASE_STEP: u64 = 1 << 32;
const ALIGNMENT: u64 = 2 << 20;

/// Sizes of the emulated device.
#[derive(Clone, Debug)]
pub struct EmulatedConfig {
    pub memory: u64,
    pub sms: u32,
    /// The session's GPUs: their ordinals on the emulated host (of `HOST_GPUS`), which give
    /// them their UUIDs. They share one address space (as one driver's devices do) and, here,
    /// one memory of `memory` bytes.
    pub host_gpus: Vec<usize>,
}

/// GPUs of the emulated host a server's `--gpu` may name (a large node's eight, and room).
pub const HOST_GPUS: usize = 16;

/// The UUID of the emulated host's GPU `ordinal`: `flyt-emulated-NN`.
pub fn host_uuid(ordinal: usize) -> [u8; 16] {
    let mut uuid = *b"flyt-emulated-00";
    uuid[14] = b'0' + (ordinal / 10 % 10) as u8;
    uuid[15] = b'0' + (ordinal % 10) as u8;
    // Servers of one tenant on several nodes have their own address windows: their emulated
    // GPUs have UUIDs of their own, as real GPUs of two nodes do (the listener's probe and its
    // workers read the same window).
    let window = crate::address_space::window();
    if window > 0 {
        uuid[13] = b'0' + window as u8;
    }
    uuid
}

/// Every GPU of the emulated host as `CUDA_VISIBLE_DEVICES` names it, in ordinal order.
pub fn host_uuid_names() -> Vec<String> {
    (0..HOST_GPUS).map(|ordinal| crate::visible::uuid_name(&host_uuid(ordinal), false)).collect()
}

/// An event: whether it keeps time (`cudaEventDisableTiming` not set) and when it last fired.
struct Event {
    timing: bool,
    recorded: Option<Instant>,
    /// The host functions submitted before it was recorded, which must return before it fires.
    host_mark: u64,
}

/// `cudaStreamNonBlocking`.
const STREAM_FLAGS: u32 = 0x1;
/// `cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess`.
const EVENT_FLAGS: u32 = 0x7;
const EVENT_DISABLE_TIMING: u32 = 0x2;
const EVENT_INTERPROCESS: u32 = 0x4;
/// `cudaEventRecordExternal` / `cudaEventWaitExternal`: meaningful only in stream capture.
const EXTERNAL: u32 = 0x1;
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
const POSIX_FD: u32 = 0x1;

#[derive(Default)]
struct State {
    blocks: HashMap<u64, Block>,
    /// The device current when each `cuMemAlloc` block and each stream was made (a memset
    /// reaches another device's memory only with peer access, as natively).
    block_devices: HashMap<u64, usize>,
    stream_devices: HashMap<u64, usize>,
    next_address: u64,
    used: u64,
    events: HashMap<u64, Event>,
    next_handle: u64,
    limits: HashMap<u32, u64>,
    /// The context's cache preference (`CU_FUNC_CACHE_PREFER_NONE` until set).
    cache_config: u32,
    graphs: Graphs,
    /// Blocks held by memory allocation nodes, and the most they ever held at once.
    graph_memory: HashSet<u64>,
    graph_memory_high: u64,
    /// Virtual memory management: reserved ranges, physical allocations (their bytes, or `None`
    /// while mapped, when the bytes are a block at the mapping's address) and mappings.
    reserved: HashMap<u64, u64>,
    physical: HashMap<u64, (u64, Option<Block>)>,
    mapped: HashMap<u64, u64>,
    /// Memory pools: each one's attributes (`CUmemPool_attribute` to value). Pool 1 is device
    /// 0's default.
    pools: HashMap<u64, HashMap<u32, u64>>,
    /// The device each pool belongs to, where it is not device 0.
    pool_devices: HashMap<u64, usize>,
    /// The default pools of devices past the first.
    default_pools: HashMap<usize, u64>,
    /// Access to pools given to devices other than their own: (pool, device) to the flags.
    pool_peers: HashMap<(u64, usize), u32>,
    /// The memory files of pools made with a POSIX shareable handle type, and of pools imported
    /// from other workers: their allocations are spans of the file, so another worker that
    /// imported the pool maps the same bytes.
    pool_files: HashMap<u64, PoolFile>,
    /// Allocations in a pool's memory file, by address: the pool and the span's offset.
    pool_spans: HashMap<u64, (u64, u64)>,
    /// Mipmapped arrays: their levels.
    mipmaps: HashMap<u64, Vec<EmulatedArray>>,
    /// Live texture (`false`) and surface (`true`) objects.
    objects: HashMap<u64, bool>,
    /// The last object handle given: objects are numbered apart from other handles, from 1,
    /// as the driver numbers them.
    last_object: u64,
    /// Stream attributes set, by stream and `CUstreamAttrID` (unset ones read as zeros).
    stream_attributes: HashMap<(u64, u32), [u8; 64]>,
    /// Resource descriptors and green contexts, each with the SMs it holds.
    resource_descs: HashMap<u64, u32>,
    greens: HashMap<u64, u32>,
    /// Allocations paged out (address, length): their blocks are gone (the bytes left this
    /// device's memory), their addresses stay the session's until paged in.
    paged_out: HashMap<u64, u64>,
    /// Blocks the emulated `cuMemAlloc` placed (`allocate`), and, with
    /// `FLYT_EMULATED_DRIVER_KEEPS_FREED_ADDRESSES`, the addresses of those freed, which the
    /// "driver" keeps for its next allocations (start to length) as a real driver does.
    driver_blocks: HashSet<u64>,
    kept: BTreeMap<u64, u64>,
}

/// A shareable pool's memory file: allocations take spans of it, one after the other (a freed
/// span is not used again: the emulated device serves tests, not long runs).
struct PoolFile {
    file: std::fs::File,
    /// Where the next allocation's span starts.
    end: u64,
    /// Imported from another worker: no allocations of its own.
    imported: bool,
}

/// Spans of a pool's memory file start at page boundaries, where a mapping may start.
const POOL_SPAN_ALIGNMENT: u64 = 64 << 10;
/// What the emulated device's export data of a pool allocation opens with (the span's offset
/// and length follow).
const POOL_EXPORT_MAGIC: &[u8; 8] = b"EMUPOOL1";

/// An emulated array: a block of device memory holding its rows packed (a planar array's planes
/// one after the other, luma first), or no memory at all for a sparse or deferred-mapping array,
/// whose memory would be mapped into it (`unbacked`: this device maps none, so copies to and from
/// it are refused).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmulatedArray {
    base: u64,
    pitch: u64,
    height: u64,
    unbacked: bool,
}

impl State {
    fn new_handle(&mut self) -> u64 {
        self.next_handle += 1;
        self.next_handle
    }

    fn new_object(&mut self, surface: bool) -> u64 {
        self.last_object += 1;
        self.objects.insert(self.last_object, surface);
        self.last_object
    }

    /// Records `work` as a node of the capture `stream` is in, if it is in one.
    fn capture(&mut self, stream: u64, work: impl FnOnce() -> Work) -> Option<CudaResult<()>> {
        if !self.graphs.captures.contains_key(&stream) {
            return None;
        }
        let id = self.new_handle();
        self.graphs.capture(stream, id, work())
    }
}

/// A host-memory device.
pub struct EmulatedDevice {
    config: EmulatedConfig,
    state: Mutex<State>,
    host: HostRunner,
    /// The current device's index.
    current: std::sync::atomic::AtomicUsize,
    /// Peer access enabled, as (from, to) device indices.
    peers_enabled: Mutex<HashSet<(usize, usize)>>,
    /// Host memory registered ("pinned": plain memory here), by start: its length.
    registered: Mutex<HashMap<usize, usize>>,
    /// Registrations ever made.
    registrations: std::sync::atomic::AtomicUsize,
    /// A test's slow device-to-host link: each copy to host memory takes this long per MiB.
    copy_to_host_delay: Option<std::time::Duration>,
    /// The addresses of freed `cuMemAlloc` memory stay the "driver's", for its next
    /// allocations, and cannot be had back (`FLYT_EMULATED_DRIVER_KEEPS_FREED_ADDRESSES`).
    driver_keeps_freed: bool,
    /// The server pages: the session's allocations are memory the device makes itself in
    /// addresses it reserves (`vmm_malloc`), as the CUDA backend's are.
    keep_addresses: bool,
    own: Mutex<super::vmm_malloc::OwnMemory>,
}

/// `FLYT_EMULATED_COPY_TO_HOST_MS_PER_MIB` (a test knob, read by this device only): copies to host
/// memory take that long per MiB, as a page-out through a slow link would.
fn copy_to_host_delay() -> Option<std::time::Duration> {
    let millis: u64 = std::env::var("FLYT_EMULATED_COPY_TO_HOST_MS_PER_MIB").ok()?.trim().parse().ok()?;
    (millis > 0).then(|| std::time::Duration::from_millis(millis))
}

/// `FLYT_EMULATED_DRIVER_KEEPS_FREED_ADDRESSES=1` (a test knob, read by this device only): the
/// addresses of freed `cuMemAlloc` memory stay with the "driver", which gives them to its next
/// allocations and to nobody else, as a real driver's allocator does (what made page-ins of
/// `cuMemAlloc` memory fail on H200s: `docs/design/paging.md`).
fn driver_keeps_freed() -> bool {
    std::env::var("FLYT_EMULATED_DRIVER_KEEPS_FREED_ADDRESSES").is_ok_and(|value| value.trim() == "1")
}

/// The three algorithms' bits of `attr::MEM_DECOMPRESS_ALGORITHM_MASK`.
const DEFLATE_SNAPPY_LZ4: i32 = 0b111;

/// `FLYT_EMULATED_CLAIMS_DECOMPRESSION=1` (a test knob, read by this device only): the device
/// reports a decompression engine, so a client checks a batch's arguments as on a GPU that has
/// one, then the device answers CUDA_ERROR_NOT_SUPPORTED as it always does (it runs none).
fn claims_decompression() -> bool {
    std::env::var("FLYT_EMULATED_CLAIMS_DECOMPRESSION").is_ok_and(|value| value.trim() == "1")
}

/// The emulated device's primitives for the session's own memory (`vmm_malloc`): its VMM calls,
/// as the CUDA backend makes the driver's.
struct EmulatedVmm<'a>(&'a EmulatedDevice);

impl super::vmm_malloc::VmmDriver for EmulatedVmm<'_> {
    fn page(&self) -> u64 {
        ALIGNMENT
    }

    fn device(&self) -> usize {
        self.0.current_device()
    }

    fn reserve(&mut self, len: u64) -> Result<u64, CudaError> {
        self.0.mem_address_reserve(len, ALIGNMENT, 0)
    }

    fn free_reservation(&mut self, start: u64, len: u64) -> Result<(), CudaError> {
        self.0.mem_address_free(start, len)
    }

    fn map_new(&mut self, start: u64, len: u64) -> Result<u64, CudaError> {
        let handle = self.0.mem_create(len, 0, 0)?;
        let mapped = self.0.mem_map(start, len, 0, handle).and_then(|()| self.0.mem_set_access(start, len, 3));
        if let Err(error) = mapped {
            let _ = self.0.mem_unmap(start, len);
            let _ = self.0.mem_release(handle);
            return Err(error);
        }
        Ok(handle)
    }

    fn unmap(&mut self, start: u64, len: u64, handle: u64) -> Result<(), CudaError> {
        self.0.mem_unmap(start, len)?;
        let _ = self.0.mem_release(handle);
        Ok(())
    }
}

impl EmulatedDevice {
    /// Host memory registered now (`host_register`: "pinned" memory, plain memory here).
    pub fn registered_bytes(&self) -> u64 {
        self.registered.lock().unwrap_or_else(std::sync::PoisonError::into_inner).values().map(|len| *len as u64).sum()
    }

    /// How many registrations were ever made (host memory pinned, on a GPU).
    pub fn registrations(&self) -> usize {
        self.registrations.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Device memory, as the driver's allocator gives it (the app's `malloc` checks the capture
    /// rules first; the device's own uses do not).
    fn allocate(&self, size: u64) -> CudaResult<u64> {
        let mut state = self.state();
        if size > self.config.memory.saturating_sub(state.used) {
            return Err(CudaError::MEMORY_ALLOCATION);
        }
        let len = usize::try_from(size).map_err(|_| CudaError::MEMORY_ALLOCATION)?;
        // `vec![0; n]` asks for zeroed pages, which the kernel maps lazily: a large allocation
        // costs nothing until it is written.
        let address = match self.driver_keeps_freed.then(|| reuse_kept(&mut state, size)).flatten() {
            Some(address) => {
                state.used += size;
                state.blocks.insert(address, Block::Heap(vec![0; len]));
                address
            }
            None => place(&mut state, size, Block::Heap(vec![0; len])),
        };
        state.block_devices.insert(address, self.current_device());
        state.driver_blocks.insert(address);
        Ok(address)
    }

    /// A memset on `stream` may write the memory at `dst` only where the stream's device is the
    /// memory's or has peer access to it (the driver answers `CUDA_ERROR_INVALID_VALUE`).
    /// Memory or streams this device does not place by device (pools', graphs', VMM) pass.
    fn memset_reaches(&self, state: &State, dst: u64, stream: u64) -> CudaResult<()> {
        let stream_device = match stream {
            0 => self.current_device(),
            stream => match state.stream_devices.get(&stream) {
                Some(device) => *device,
                None => return Ok(()),
            },
        };
        let memory_device = state
            .blocks
            .iter()
            .find(|(base, block)| dst >= **base && dst - **base < block.len() as u64)
            .and_then(|(base, _)| state.block_devices.get(base).copied());
        let Some(memory_device) = memory_device else { return Ok(()) };
        let peers = self.peers_enabled.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if memory_device == stream_device || peers.contains(&(stream_device, memory_device)) {
            Ok(())
        } else {
            Err(CudaError::INVALID_VALUE)
        }
    }

    /// A node's work here, a child graph copied as the driver copies it.
    fn node_work_here(&self, work: NodeWork<'_, Self>) -> CudaResult<Work> {
        match work {
            NodeWork::Child(child) => {
                let mut state = self.state();
                let copy = state.new_handle();
                let State { graphs, next_handle, .. } = &mut *state;
                graphs.clone_graph(child, copy, &mut || {
                    *next_handle += 1;
                    *next_handle
                })?;
                Ok(Work::Child(copy))
            }
            work => emulated_work(work),
        }
    }

    pub fn new(config: EmulatedConfig) -> Self {
        Self {
            config,
            state: Mutex::new(State {
                // The server's address window (`--address-window`) moves them up, as it moves a
                // real driver's.
                next_address: BASE_ADDRESS
                    + crate::address_space::window_offset()
                    + if crate::address_space::emulated_fixed_base() { 0 } else { u64::from(std::process::id() % 4096) * BASE_STEP },
                next_handle: 1,
                ..State::default()
            }),
            host: HostRunner::default(),
            current: std::sync::atomic::AtomicUsize::new(0),
            peers_enabled: Mutex::default(),
            registered: Mutex::default(),
            registrations: std::sync::atomic::AtomicUsize::new(0),
            copy_to_host_delay: copy_to_host_delay(),
            driver_keeps_freed: driver_keeps_freed(),
            keep_addresses: false,
            own: Mutex::default(),
        }
    }

    /// While the server pages: the session's allocations are memory this device makes in
    /// addresses it reserves, which a page-out keeps (`vmm_malloc`), as on CUDA.
    pub fn keep_allocation_addresses(mut self, keep: bool) -> Self {
        self.keep_addresses = keep;
        self
    }

    /// `FLYT_EMULATED_DRIVER_KEEPS_FREED_ADDRESSES` set in code (tests in this process).
    pub fn driver_keeps_freed_addresses(mut self, keeps: bool) -> Self {
        self.driver_keeps_freed = keeps;
        self
    }

    fn own_memory(&self) -> std::sync::MutexGuard<'_, super::vmm_malloc::OwnMemory> {
        self.own.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The session's own memory: reserved and mapped bytes (whole spans).
    pub fn own_memory_bytes(&self) -> (u64, u64) {
        self.own_memory().bytes()
    }

    /// The device's shape and identity (`info_of` names each of several apart).
    fn device_info(&self) -> DeviceInfo {
        let sms = i32::try_from(self.config.sms).unwrap_or(i32::MAX);
        // A Hopper-like shape, so apps that size their launches from properties behave.
        let mut attributes = HOPPER_LIMITS.to_vec();
        attributes.extend([
            (attr::MULTIPROCESSOR_COUNT, sms),
            (attr::CAN_MAP_HOST_MEMORY, 1),
            (attr::MANAGED_MEMORY, 1),
            (attr::CONCURRENT_MANAGED_ACCESS, 1),
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
            // Stream-ordered allocation from pools (the pool methods below).
            (attr::MEMORY_POOLS_SUPPORTED, 1),
            // Pools shared between processes through a POSIX file descriptor (their memory files).
            (attr::MEMORY_POOL_SUPPORTED_HANDLE_TYPES, POSIX_FD as i32),
            // Stream memory operations, 64-bit and NOR waits included (`stream_mem_ops`).
            (attr::CAN_USE_STREAM_MEM_OPS_V1, 1),
            (attr::CAN_USE_64_BIT_STREAM_MEM_OPS_V1, 1),
            (attr::CAN_USE_STREAM_WAIT_VALUE_NOR_V1, 1),
            (attr::CAN_USE_64_BIT_STREAM_MEM_OPS, 1),
            (attr::CAN_USE_STREAM_WAIT_VALUE_NOR, 1),
        ]);
        DeviceInfo {
            name: "Flyt Emulated Device (no GPU: kernels cannot run)".into(),
            uuid: *b"flyt-emulated-00",
            luid: [0; 8],
            luid_device_node_mask: 0,
            total_mem: self.config.memory,
            attributes,
        }
    }

    /// Device `index` as `info` reports it.
    fn info_of(&self, index: usize) -> DeviceInfo {
        let mut info = self.device_info();
        if self.config.host_gpus.len() > 1 {
            info.name = format!("Flyt Emulated Device {index} (no GPU: kernels cannot run)");
            // Distinct PCI addresses (by host ordinal), so NVML's NVLink far ends name one device each.
            let host_gpu = self.config.host_gpus.get(index).copied().unwrap_or(0) as i32;
            info.set_attribute(attr::PCI_DOMAIN_ID, 0);
            info.set_attribute(attr::PCI_BUS_ID, 0x10 + host_gpu);
            info.set_attribute(attr::PCI_DEVICE_ID, 0);
        }
        info.uuid = host_uuid(self.config.host_gpus.get(index).copied().unwrap_or(0));
        if claims_decompression() {
            info.set_attribute(attr::MEM_DECOMPRESS_ALGORITHM_MASK, DEFLATE_SNAPPY_LZ4);
        }
        info
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A block of emulated device memory: the worker's own, or a shared mapping of a file, which a
/// physical allocation made with a POSIX shareable handle type is, so another worker can import
/// it (`mem_export`) and both see the same bytes.
enum Block {
    Heap(Vec<u8>),
    Shared { map: memmap2::MmapMut, file: std::fs::File },
}

impl Block {
    /// `len` zeroed bytes in a memory file of their own.
    fn shared(len: usize) -> CudaResult<Self> {
        let file = memory_file("flyt-emulated-vmm", len as u64)?;
        Self::map(file, 0, len)
    }

    /// `len` bytes of `file` from `offset` (a multiple of the page size).
    fn map(file: std::fs::File, offset: u64, len: usize) -> CudaResult<Self> {
        // SAFETY: a shared mapping of a memory file: other workers may write it concurrently,
        // which a GPU's memory allows too; the bytes are only ever copied, never borrowed as
        // typed data.
        let map =
            unsafe { memmap2::MmapOptions::new().offset(offset).len(len).map_mut(&file) }.map_err(|_| CudaError::MEMORY_ALLOCATION)?;
        Ok(Self::Shared { map, file })
    }
}

/// A memory file of `len` zeroed bytes.
fn memory_file(name: &str, len: u64) -> CudaResult<std::fs::File> {
    let fd = nix::sys::memfd::memfd_create(name, nix::sys::memfd::MFdFlags::MFD_CLOEXEC).map_err(|_| CudaError::MEMORY_ALLOCATION)?;
    let file = std::fs::File::from(fd);
    file.set_len(len).map_err(|_| CudaError::MEMORY_ALLOCATION)?;
    Ok(file)
}

/// Places `block` (`size` bytes) at the device's next address: its address.
/// Frees the graph memory no node holds any more (clones and executable graphs' private copies
/// share their original's).
fn free_unheld_graph_memory(state: &mut State) {
    let held: HashSet<u64> =
        state.graphs.nodes.values().filter_map(|n| if let Work::MemAlloc { ptr, .. } = n.work { Some(ptr) } else { None }).collect();
    let unheld: Vec<u64> = state.graph_memory.iter().copied().filter(|ptr| !held.contains(ptr)).collect();
    for ptr in unheld {
        state.graph_memory.remove(&ptr);
        if let Some(block) = state.blocks.remove(&ptr) {
            state.used -= block.len() as u64;
        }
    }
}

/// Addresses the "driver" kept from freed memory (`FLYT_EMULATED_DRIVER_KEEPS_FREED_ADDRESSES`)
/// with room for `size` bytes, taken: their start.
fn reuse_kept(state: &mut State, size: u64) -> Option<u64> {
    let len = size.max(1).div_ceil(ALIGNMENT) * ALIGNMENT;
    let (&start, &kept) = state.kept.iter().find(|(_, kept)| **kept >= len)?;
    state.kept.remove(&start);
    if kept > len {
        state.kept.insert(start + len, kept - len);
    }
    Some(start)
}

/// Whether `ptr..end` meets a block, a reservation or addresses the "driver" kept.
fn taken(state: &State, ptr: u64, end: u64) -> bool {
    state.blocks.iter().any(|(start, block)| *start < end && ptr < start + block.len() as u64)
        || state.reserved.iter().any(|(start, len)| *start < end && ptr < start + len)
        || state.kept.range(..end).next_back().is_some_and(|(start, len)| ptr < start + len)
}

fn place(state: &mut State, size: u64, block: Block) -> u64 {
    let address = state.next_address;
    state.next_address += size.max(1).div_ceil(ALIGNMENT) * ALIGNMENT;
    state.used += size;
    state.blocks.insert(address, block);
    address
}

impl std::ops::Deref for Block {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Self::Heap(bytes) => bytes,
            Self::Shared { map, .. } => map,
        }
    }
}

impl std::ops::DerefMut for Block {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Self::Heap(bytes) => bytes,
            Self::Shared { map, .. } => map,
        }
    }
}

/// Finds the block holding `[ptr, ptr + len)`; the session validated the range already, so a
/// miss here is a bookkeeping bug reported as an invalid value, not a crash.
fn block_slice(blocks: &mut HashMap<u64, Block>, ptr: u64, len: u64) -> CudaResult<&mut [u8]> {
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

/// Edge data for `nodes` (graph edges, a capture's dependencies): every edge here is a plain
/// full dependency, as ports and types belong to kernels' programmatic launches and this device
/// has no kernel nodes; all-default data is as good as none.
fn plain_edges(nodes: &[u64], data: Option<&[EdgeData]>) -> CudaResult<()> {
    match data {
        Some(data) if data.len() != nodes.len() || data.iter().any(|edge| *edge != [0; 3]) => Err(CudaError::NOT_SUPPORTED),
        _ => Ok(()),
    }
}

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
    type Graph = u64;
    type GraphNode = u64;
    type GraphExec = u64;
    type MemHandle = u64;
    type MemPool = u64;
    type Array = EmulatedArray;
    type Mipmap = u64;
    type Resource = EmulatedResource;
    type ResourceDesc = u64;
    type GreenCtx = u64;

    fn info(&self) -> DeviceInfo {
        self.info_of(self.current.load(std::sync::atomic::Ordering::Relaxed))
    }

    fn device_count(&self) -> usize {
        self.config.host_gpus.len().max(1)
    }

    fn current_device(&self) -> usize {
        self.current.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn select_device(&self, index: usize) -> CudaResult<()> {
        if index >= self.device_count() {
            return Err(CudaError::INVALID_DEVICE);
        }
        self.current.store(index, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    fn infos(&self) -> Vec<DeviceInfo> {
        (0..self.device_count()).map(|index| self.info_of(index)).collect()
    }

    fn peer_links(&self) -> Vec<flyt_protocol::device::PeerLink> {
        let count = self.device_count() as u32;
        let pairs = (0..count).flat_map(|from| (0..count).filter(move |to| *to != from).map(move |to| (from, to)));
        // One host memory: every device reaches every other's, with no atomics across them.
        pairs.map(|(from, to)| flyt_protocol::device::PeerLink { from, to, access_supported: 1, ..Default::default() }).collect()
    }

    fn nvlinks(&self) -> Vec<Vec<flyt_protocol::device::NvLinkEnd>> {
        super::nvlinks::emulated_nvlinks(self.device_count())
    }

    fn peer_access(&self, peer: usize, enable: bool, _flags: u32) -> CudaResult<()> {
        let current = self.current_device();
        if peer >= self.device_count() || peer == current {
            return Err(CudaError::INVALID_DEVICE);
        }
        let mut enabled = self.peers_enabled.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match enable {
            true if !enabled.insert((current, peer)) => Err(CudaError::PEER_ACCESS_ALREADY_ENABLED),
            false if !enabled.remove(&(current, peer)) => Err(CudaError::PEER_ACCESS_NOT_ENABLED),
            _ => Ok(()),
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
        {
            let state = self.state();
            // An unsafe call during a capture, as the driver rules it for the calling thread (the
            // session's, which began every capture): prohibited unless the thread is relaxed or
            // every capture was begun relaxed. Modelled for the app's allocations.
            const RELAXED: u32 = 2;
            if state.graphs.thread_mode != RELAXED
                && state.graphs.captures.values().any(|capture| capture.origin && capture.mode != RELAXED)
            {
                return Err(CudaError::STREAM_CAPTURE_UNSUPPORTED);
            }
        }
        if self.keep_addresses {
            return self.own_memory().allocate(&mut EmulatedVmm(self), size);
        }
        self.allocate(size)
    }

    /// A block of this device's memory, which is this process's own: its bytes are the host's.
    fn graph_staging_alloc(&self, len: u64) -> CudaResult<(u64, *mut u8)> {
        let address = self.allocate(len)?;
        let mut state = self.state();
        let host = state.blocks.get_mut(&address).map(|block| block.as_mut_ptr()).ok_or(CudaError::UNKNOWN)?;
        Ok((address, host))
    }

    fn graph_staging_free(&self, address: u64) -> CudaResult<()> {
        // A graph's host node may still be queued on the host thread: it reads this block.
        self.host.wait(u64::MAX);
        self.free(address)
    }

    fn free_graph_memory(&self, _ptr: u64) -> CudaResult<()> {
        // Graph memory lives with its node here (no GPU to map it at launch): only the wait a
        // free makes is left to do.
        self.host.wait(u64::MAX);
        Ok(())
    }

    fn free_graph_memory_async(&self, ptr: u64, stream: u64) -> CudaResult<()> {
        // A free node in a capture; outside one, as `free_graph_memory`: the memory stays with
        // its graph, and work completes at submission.
        let mut state = self.state();
        if !state.graph_memory.contains(&ptr) {
            return Err(CudaError::INVALID_VALUE);
        }
        state.capture(stream, || Work::MemFree(ptr)).unwrap_or(Ok(()))
    }

    fn free(&self, ptr: u64) -> CudaResult<()> {
        // cuMemFree waits for the device's work, host functions included (cudaFree
        // synchronizes): so does this device, or a test could not see what that wait costs.
        self.host.wait(u64::MAX);
        if let Some(freed) = self.own_memory().free(&mut EmulatedVmm(self), ptr) {
            return freed;
        }
        let mut state = self.state();
        let block = state.blocks.remove(&ptr).ok_or(CudaError::INVALID_VALUE)?;
        state.used -= block.len() as u64;
        state.pool_spans.remove(&ptr);
        state.block_devices.remove(&ptr);
        if state.driver_blocks.remove(&ptr) && self.driver_keeps_freed {
            state.kept.insert(ptr, (block.len() as u64).max(1).div_ceil(ALIGNMENT) * ALIGNMENT);
        }
        Ok(())
    }

    fn export_for_move(&self, _allocations: &[(u64, u64)]) -> CudaResult<super::MovedMemory> {
        // Each worker's memory is its own process's: nothing to share.
        Err(CudaError::NOT_SUPPORTED)
    }

    fn import_for_move(&self, _moved: super::MovedMemory) -> Result<(), String> {
        Err("the emulated device shares no memory between workers".into())
    }

    fn page_out(&self, allocations: &[(u64, u64)]) -> Result<(), (String, bool)> {
        // As cuMemFree: queued host functions finish first.
        self.host.wait(u64::MAX);
        // The session's own memory (all of it while the server pages): its physical memory goes,
        // its reservations stay.
        let (own, others): (Vec<_>, Vec<_>) = allocations.iter().copied().partition(|(ptr, _)| self.own_memory().contains(*ptr));
        let out = self.own_memory().page_out(&mut EmulatedVmm(self), &own);
        if !out.failed.is_empty() {
            return Err((out.failed.join("; "), out.released));
        }
        let mut state = self.state();
        for &(ptr, len) in &others {
            match state.blocks.get(&ptr) {
                Some(Block::Heap(bytes)) if bytes.len() as u64 == len => {}
                // A pool's shared memory file, say: nothing released.
                _ => return Err((format!("{ptr:#x} is not an allocation of {len} bytes of this worker's own memory"), out.released)),
            }
        }
        let mut lost = 0;
        for &(ptr, len) in &others {
            state.blocks.remove(&ptr);
            state.used -= len;
            state.paged_out.insert(ptr, len);
            // The "driver" keeps the addresses of its `cuMemAlloc` memory freed (the test knob):
            // they cannot be held for the page-in.
            if state.driver_blocks.remove(&ptr) && self.driver_keeps_freed {
                state.kept.insert(ptr, len.max(1).div_ceil(ALIGNMENT) * ALIGNMENT);
                lost += 1;
            }
        }
        if lost > 0 {
            tracing::warn!(reason = format!("the driver kept the addresses of {lost} allocation(s)"), "paged-out addresses not all held");
        }
        Ok(())
    }

    /// Each span of the session's own memory on its own, and each other allocation, so a page-in
    /// maps and copies them one after the other.
    fn page_groups(&self, allocations: &[(u64, u64)]) -> Vec<Vec<(u64, u64)>> {
        let (mut groups, others) = self.own_memory().groups(allocations);
        groups.extend(others.into_iter().map(|allocation| vec![allocation]));
        groups
    }

    fn page_in(&self, allocations: &[(u64, u64)]) -> Result<(), String> {
        let (own, others): (Vec<_>, Vec<_>) = allocations.iter().copied().partition(|(ptr, _)| self.own_memory().contains(*ptr));
        if !own.is_empty() {
            self.own_memory().page_in(&mut EmulatedVmm(self), &own)?;
        }
        if others.is_empty() {
            return Ok(());
        }
        let mut state = self.state();
        let refused = (|| {
            if let Some((ptr, len)) = others.iter().find(|(ptr, len)| state.paged_out.get(ptr) != Some(len)) {
                return Err(format!("{ptr:#x} ({len} bytes) was not paged out here"));
            }
            if let Some((ptr, len)) = others.iter().find(|(ptr, len)| taken(&state, *ptr, ptr + len)) {
                return Err(format!("addresses {ptr:#x}..{:#x} are taken on this device", ptr + len));
            }
            let total: u64 = others.iter().map(|(_, len)| len).sum();
            if total > self.config.memory.saturating_sub(state.used) {
                return Err(format!("{total} bytes do not fit this device"));
            }
            Ok(())
        })();
        if let Err(reason) = refused {
            drop(state);
            if !own.is_empty() {
                // Nothing of this page-in stays mapped.
                self.own_memory().page_out(&mut EmulatedVmm(self), &own);
            }
            return Err(reason);
        }
        for &(ptr, len) in &others {
            state.paged_out.remove(&ptr);
            let bytes = vec![0; usize::try_from(len).map_err(|_| "allocation too large")?];
            state.blocks.insert(ptr, Block::Heap(bytes));
            state.used += len;
        }
        Ok(())
    }

    fn restore_allocations(&self, allocations: &[(u64, u64)], reservations: &[(u64, u64)]) -> Result<(), String> {
        let mut state = self.state();
        let total: u64 = allocations.iter().map(|(_, len)| len).sum();
        if total > self.config.memory.saturating_sub(state.used) {
            return Err(format!("{total} bytes do not fit this device"));
        }
        for &(ptr, len) in reservations {
            let end = ptr.checked_add(len).ok_or("a reservation runs past the address space")?;
            if taken(&state, ptr, end) {
                return Err(format!("addresses {ptr:#x}..{end:#x} are taken on this device"));
            }
            state.reserved.insert(ptr, len);
            state.next_address = state.next_address.max(end.div_ceil(ALIGNMENT) * ALIGNMENT);
        }
        for &(ptr, len) in allocations {
            let end = ptr.checked_add(len).ok_or("an allocation runs past the address space")?;
            if taken(&state, ptr, end) {
                return Err(format!("address {ptr:#x} is taken on this device"));
            }
            state.blocks.insert(ptr, Block::Heap(vec![0; usize::try_from(len).map_err(|_| "allocation too large")?]));
            state.used += len;
            // New allocations go past every restored one.
            state.next_address = state.next_address.max(end.div_ceil(ALIGNMENT) * ALIGNMENT);
        }
        Ok(())
    }

    fn mem_get_info(&self) -> CudaResult<(u64, u64)> {
        Ok((self.config.memory.saturating_sub(self.state().used), self.config.memory))
    }

    fn staging(&self, len: usize) -> CudaResult<Vec<u8>> {
        Ok(vec![0; len])
    }

    fn staging_bytes(staging: &mut Vec<u8>) -> &mut [u8] {
        staging
    }

    fn shorten_staging(staging: &mut Vec<u8>, len: usize) {
        staging.truncate(len);
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

    fn copy_dtod(&self, dst: u64, src: u64, len: u64, stream: u64) -> CudaResult<()> {
        let mut state = self.state();
        let copy = Copy3d { src, src_pitch: len, src_height: 1, dst, dst_pitch: len, dst_height: 1, width: len, height: 1, depth: 1 };
        if let Some(captured) = state.capture(stream, || Work::Memcpy(copy)) {
            return captured;
        }
        let bytes = block_slice(&mut state.blocks, src, len)?.to_vec();
        block_slice(&mut state.blocks, dst, len)?.copy_from_slice(&bytes);
        Ok(())
    }

    unsafe fn host_register(&self, ptr: *mut u8, len: usize, _mapped: bool) -> CudaResult<()> {
        // Counted only, so tests see what would be pinned on a GPU, and when.
        self.registered.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(ptr as usize, len);
        self.registrations.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Ok(())
    }

    /// Unified addressing, as on a GPU: mapped host memory has its host address on the device.
    fn host_device_pointer(&self, ptr: *mut u8) -> CudaResult<u64> {
        Ok(ptr as u64)
    }

    unsafe fn host_unregister(&self, ptr: *mut u8) -> CudaResult<()> {
        self.registered.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&(ptr as usize));
        Ok(())
    }

    unsafe fn copy_from_host(&self, dst: u64, src: *const u8, len: usize, stream: u64) -> CudaResult<()> {
        let mut state = self.state();
        if state.graphs.captures.contains_key(&stream) {
            // The emulated graphs record device-to-device copies only (a copy with host memory
            // is a host copy node the session builds); never run now as if recorded.
            return Err(CudaError::NOT_SUPPORTED);
        }
        // SAFETY: the caller guarantees `src..src+len` is mapped host memory.
        let source = unsafe { std::slice::from_raw_parts(src, len) };
        block_slice(&mut state.blocks, dst, len as u64)?.copy_from_slice(source);
        Ok(())
    }

    unsafe fn copy_to_host(&self, dst: *mut u8, src: u64, len: usize, stream: u64) -> CudaResult<()> {
        if let Some(per_mib) = self.copy_to_host_delay {
            // A test's slow device-to-host link (`FLYT_EMULATED_COPY_TO_HOST_MS_PER_MIB`).
            std::thread::sleep(per_mib * u32::try_from(len.div_ceil(1 << 20)).unwrap_or(u32::MAX));
        }
        let mut state = self.state();
        if state.graphs.captures.contains_key(&stream) {
            // As in `copy_from_host`.
            return Err(CudaError::NOT_SUPPORTED);
        }
        // SAFETY: the caller guarantees `dst..dst+len` is mapped host memory nothing else writes
        // during the copy.
        let target = unsafe { std::slice::from_raw_parts_mut(dst, len) };
        target.copy_from_slice(block_slice(&mut state.blocks, src, len as u64)?);
        Ok(())
    }

    fn memset(&self, dst: u64, pattern: u32, width: u8, len: u64, stream: u64) -> CudaResult<()> {
        let mut state = self.state();
        let set = Memset2d { dst, pitch: len, value: pattern, element_size: width, width: len / u64::from(width.max(1)), height: 1 };
        if let Some(captured) = state.capture(stream, || Work::Memset(set)) {
            return captured;
        }
        self.memset_reaches(&state, dst, stream)?;
        fill_elements(block_slice(&mut state.blocks, dst, len)?, pattern, width);
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
        // cuModuleLoadData waits for the device's work, host functions included (seen on an
        // H200 under JAX): so does this device, though it then has no code to load.
        self.host.wait(u64::MAX);
        Err(NO_GPU_CODE)
    }

    fn function(&self, _module: &(), _name: &str) -> CudaResult<((), Vec<ParamInfo>)> {
        Err(NO_GPU_CODE)
    }

    fn function_names(&self, _module: &()) -> CudaResult<Vec<String>> {
        Err(NO_GPU_CODE)
    }

    fn variable(&self, _module: &(), _name: &str) -> CudaResult<(u64, u64, bool)> {
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

    fn launch(&self, _: (), _: LaunchShape<'_>, _: u64, _: &mut [u8]) -> CudaResult<()> {
        Err(NO_GPU_CODE)
    }

    fn texture_1d_linear_max_width(&self, _format: u32, _channels: u32) -> CudaResult<u64> {
        // No texture hardware to describe.
        Err(NO_GPU_CODE)
    }

    fn atomic_capabilities(&self, _operations: &[u32], _peer: bool) -> CudaResult<Vec<u32>> {
        // No kernels, so no atomics to describe.
        Err(NO_GPU_CODE)
    }

    fn available_dynamic_smem(&self, _: (), _: i32, _: i32) -> CudaResult<u64> {
        Err(NO_GPU_CODE)
    }

    fn occupancy_max_active_clusters(&self, _: (), _: LaunchShape<'_>) -> CudaResult<i32> {
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
        let (stream, device) = (state.next_handle, self.current_device());
        state.stream_devices.insert(stream, device);
        Ok(stream)
    }

    fn stream_priority_range(&self) -> CudaResult<(i32, i32)> {
        // The range Hopper GPUs report, matching the attributes above (priorities supported).
        Ok((0, -5))
    }

    fn stream_destroy(&self, stream: u64) -> CudaResult<()> {
        self.state().stream_devices.remove(&stream);
        Ok(())
    }

    fn stream_query(&self, stream: u64) -> CudaResult<()> {
        // Work completes at submission, except the app's host functions.
        let legacy = stream == 0;
        if self.host.busy((!legacy).then_some(stream)) { Err(CudaError::NOT_READY) } else { Ok(()) }
    }

    fn stream_wait_event(&self, stream: u64, event: u64, flags: u32) -> CudaResult<()> {
        // Work completes at submission: the event has fired, there is nothing to wait for,
        // unless it was recorded in a capture, which the stream then joins.
        if flags & !EXTERNAL != 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        let mut state = self.state();
        if let Some(capture) = state.graphs.captured_events.get(&event).cloned() {
            let graphs = &mut state.graphs;
            match graphs.captures.get_mut(&stream) {
                Some(joined) if joined.id == capture.id => joined.tail.extend(capture.tail),
                Some(_) => return Err(CudaError::STREAM_CAPTURE_ISOLATION),
                None => {
                    graphs.captures.insert(stream, StreamCapture { origin: false, ..capture });
                }
            }
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
        state.events.insert(handle, Event { timing: flags & EVENT_DISABLE_TIMING == 0, recorded: None, host_mark: 0 });
        Ok(handle)
    }

    fn event_record(&self, event: u64, stream: u64, flags: u32) -> CudaResult<()> {
        if flags & !EXTERNAL != 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        let mut state = self.state();
        if !state.events.contains_key(&event) {
            return Err(CudaError::INVALID_RESOURCE_HANDLE);
        }
        // Recorded into a capture, it marks where the capture stands.
        if let Some(capture) = state.graphs.captures.get(&stream).cloned() {
            state.graphs.captured_events.insert(event, capture);
            return Ok(());
        }
        state.graphs.captured_events.remove(&event);
        // Work completes at submission, so the event fires when it is recorded, or once the host
        // functions before it have returned.
        let host_mark = self.host.mark();
        if let Some(recorded) = state.events.get_mut(&event) {
            recorded.recorded = Some(Instant::now());
            recorded.host_mark = host_mark;
        }
        Ok(())
    }

    fn event_query(&self, event: u64) -> CudaResult<()> {
        let mark = self.state().events.get(&event).map_or(0, |event| event.host_mark);
        if self.host.returned(mark) { Ok(()) } else { Err(CudaError::NOT_READY) }
    }

    fn event_synchronize(&self, event: u64) -> CudaResult<()> {
        let mark = self.state().events.get(&event).map_or(0, |event| event.host_mark);
        self.host.wait(mark);
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
        self.host.wait(u64::MAX);
        Ok(())
    }

    fn reset(&self) -> CudaResult<()> {
        // As a new context: no memory, no events, default limits (addresses keep growing, so a
        // stale pointer from before never names new memory).
        let mut state = self.state();
        state.blocks.clear();
        state.pool_spans.clear();
        state.used = 0;
        state.events.clear();
        state.limits.clear();
        state.cache_config = 0;
        state.resource_descs.clear();
        state.greens.clear();
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

    fn capture_begin(&self, stream: u64, mode: u32, into: Option<CaptureInto<'_, Self>>) -> CudaResult<()> {
        if mode > 2 {
            return Err(CudaError::INVALID_VALUE);
        }
        if let Some(into) = &into {
            plain_edges(into.dependencies, into.data)?;
        }
        // The legacy stream cannot be captured (it synchronizes with every other stream).
        if stream == 0 {
            return Err(CudaError::STREAM_CAPTURE_UNSUPPORTED);
        }
        let mut state = self.state();
        if state.graphs.captures.contains_key(&stream) {
            return Err(CudaError::ILLEGAL_STATE);
        }
        let (graph, tail) = match into {
            Some(into) if state.graphs.graphs.contains_key(&into.graph) => (into.graph, into.dependencies.to_vec()),
            Some(_) => return Err(CudaError::INVALID_VALUE),
            None => {
                let graph = state.new_handle();
                state.graphs.graphs.insert(graph, Vec::new());
                (graph, Vec::new())
            }
        };
        state.graphs.next_capture += 1;
        let id = state.graphs.next_capture;
        state.graphs.captures.insert(stream, StreamCapture { graph, id, tail, origin: true, mode });
        Ok(())
    }

    fn capture_dependencies(&self, stream: u64, nodes: &[u64], data: Option<&[EdgeData]>, set: bool) -> CudaResult<()> {
        plain_edges(nodes, data)?;
        let mut state = self.state();
        let capture = state.graphs.captures.get_mut(&stream).ok_or(CudaError::ILLEGAL_STATE)?;
        if set {
            capture.tail.clear();
        }
        for node in nodes {
            if !capture.tail.contains(node) {
                capture.tail.push(*node);
            }
        }
        Ok(())
    }

    fn capture_end(&self, stream: u64) -> CudaResult<u64> {
        let mut state = self.state();
        let capture = match state.graphs.captures.get(&stream) {
            Some(capture) if capture.origin => capture.clone(),
            Some(_) => return Err(CudaError::STREAM_CAPTURE_UNMATCHED),
            None => return Err(CudaError::ILLEGAL_STATE),
        };
        state.graphs.captures.retain(|_, other| other.id != capture.id);
        state.graphs.captured_events.retain(|_, other| other.id != capture.id);
        Ok(capture.graph)
    }

    fn capture_info(&self, stream: u64) -> CudaResult<Capture<Self>> {
        let state = self.state();
        Ok(match state.graphs.captures.get(&stream) {
            Some(capture) => {
                let dependencies = capture.tail.clone();
                // Every dependency is a plain full one: no edge data (a NULL array).
                Capture { status: capture_status::ACTIVE, id: capture.id, graph: Some(capture.graph), dependencies, data: Vec::new() }
            }
            None => Capture { status: state.graphs.status(stream), id: 0, graph: None, dependencies: Vec::new(), data: Vec::new() },
        })
    }

    fn capturing(&self, stream: u64) -> bool {
        let state = self.state();
        // The legacy stream may not be used while any capture is active.
        state.graphs.captures.contains_key(&stream) || (stream == 0 && !state.graphs.captures.is_empty())
    }

    fn exchange_capture_mode(&self, mode: u32) -> CudaResult<u32> {
        if mode > 2 {
            return Err(CudaError::INVALID_VALUE);
        }
        Ok(std::mem::replace(&mut self.state().graphs.thread_mode, mode))
    }

    fn graph_create(&self) -> CudaResult<u64> {
        let mut state = self.state();
        let graph = state.new_handle();
        state.graphs.graphs.insert(graph, Vec::new());
        Ok(graph)
    }

    fn graph_destroy(&self, graph: u64) -> CudaResult<()> {
        let mut state = self.state();
        state.graphs.destroy(graph);
        free_unheld_graph_memory(&mut state);
        Ok(())
    }

    fn graph_add_node(&self, graph: u64, dependencies: &[u64], work: NodeWork<'_, Self>) -> CudaResult<AddedNode<Self>> {
        if !self.state().graphs.graphs.contains_key(&graph) {
            return Err(CudaError::INVALID_VALUE);
        }
        let (mut ptr, mut bodies) = (0, Vec::new());
        let work = match work {
            NodeWork::MemAlloc { size, access } => {
                if size == 0 || access.is_some_and(|flags| flags != 3) {
                    return Err(CudaError::INVALID_VALUE);
                }
                // The node holds its memory while it lives (a GPU maps it at launch).
                ptr = self.allocate(size)?;
                self.state().graph_memory.insert(ptr);
                Work::MemAlloc { ptr, size }
            }
            NodeWork::MemFree(dptr) => {
                if !self.state().graph_memory.contains(&dptr) {
                    return Err(CudaError::INVALID_VALUE);
                }
                Work::MemFree(dptr)
            }
            NodeWork::Conditional { handle, kind, size } => {
                let mut state = self.state();
                if !state.graphs.conditionals.contains_key(&handle)
                    || kind > 2
                    || size == 0
                    || (kind == 1 && size != 1)
                    || size > 2 && kind == 0
                {
                    return Err(CudaError::INVALID_VALUE);
                }
                for _ in 0..size {
                    let body = state.new_handle();
                    state.graphs.graphs.insert(body, Vec::new());
                    bodies.push(body);
                }
                Work::Conditional { handle, kind, bodies: bodies.clone() }
            }
            work => self.node_work_here(work)?,
        };
        let mut state = self.state();
        let id = state.new_handle();
        state.graphs.add(graph, id, dependencies, work)?;
        Ok(AddedNode { node: id, ptr, bodies })
    }

    fn graph_conditional_handle(&self, graph: u64, default_value: u32, flags: u32) -> CudaResult<u64> {
        let mut state = self.state();
        if !state.graphs.graphs.contains_key(&graph) || flags & !1 != 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        let handle = state.new_handle();
        state.graphs.conditionals.insert(handle, (default_value, flags));
        Ok(handle)
    }

    fn graph_node_links(&self, node: u64, dependents: bool) -> CudaResult<Vec<(u64, EdgeData)>> {
        let state = self.state();
        let this = state.graphs.nodes.get(&node).ok_or(CudaError::INVALID_VALUE)?;
        if !dependents {
            return Ok(this.dependencies.iter().map(|d| (*d, [0; 3])).collect());
        }
        let members = state.graphs.graphs.get(&this.graph).ok_or(CudaError::INVALID_VALUE)?;
        Ok(members
            .iter()
            .filter(|other| state.graphs.nodes.get(other).is_some_and(|n| n.dependencies.contains(&node)))
            .map(|other| (*other, [0; 3]))
            .collect())
    }

    fn graph_all_edges(&self, graph: u64) -> CudaResult<Vec<(u64, u64, EdgeData)>> {
        let state = self.state();
        let members = state.graphs.graphs.get(&graph).ok_or(CudaError::INVALID_VALUE)?;
        Ok(members
            .iter()
            .flat_map(|to| {
                state.graphs.nodes.get(to).into_iter().flat_map(move |n| n.dependencies.iter().map(move |from| (*from, *to, [0; 3])))
            })
            .collect())
    }

    fn graph_node_enabled(&self, exec: u64, node: u64, set: Option<bool>) -> CudaResult<bool> {
        let mut state = self.state();
        let private = state.graphs.execs.get(&exec).copied().ok_or(CudaError::INVALID_VALUE)?;
        let counterpart = state.graphs.clones.get(&(node, private)).copied().ok_or(CudaError::INVALID_VALUE)?;
        // Only kernel, copy and memset nodes can be turned off, as natively.
        if !matches!(
            state.graphs.kind(counterpart)?,
            flyt_protocol::ops::node_type::KERNEL | flyt_protocol::ops::node_type::MEMCPY | flyt_protocol::ops::node_type::MEMSET
        ) {
            return Err(CudaError::INVALID_VALUE);
        }
        match set {
            Some(true) => {
                state.graphs.disabled.remove(&counterpart);
            }
            Some(false) => {
                state.graphs.disabled.insert(counterpart);
            }
            None => {}
        }
        Ok(!state.graphs.disabled.contains(&counterpart))
    }

    fn graph_node_kind(&self, node: u64) -> CudaResult<u32> {
        self.state().graphs.kind(node)
    }

    fn graph_node_event(&self, node: u64) -> CudaResult<u64> {
        match self.state().graphs.nodes.get(&node).map(|n| &n.work) {
            Some(Work::EventRecord(event) | Work::EventWait(event)) => Ok(*event),
            _ => Err(CudaError::INVALID_VALUE),
        }
    }

    fn graph_mem_attribute(&self, attribute: u32, set: Option<u64>) -> CudaResult<u64> {
        let mut state = self.state();
        let current: u64 =
            state.graphs.nodes.values().filter_map(|n| if let Work::MemAlloc { size, .. } = n.work { Some(size) } else { None }).sum();
        state.graph_memory_high = state.graph_memory_high.max(current);
        match (attribute, set) {
            // Only the high watermarks may be set, and only to 0 (a reset).
            (1 | 3, Some(0)) => state.graph_memory_high = current,
            (_, Some(_)) => return Err(CudaError::INVALID_VALUE),
            (0..=3, None) => {}
            _ => return Err(CudaError::INVALID_VALUE),
        }
        Ok(if attribute.is_multiple_of(2) { current } else { state.graph_memory_high })
    }

    fn graph_mem_trim(&self) -> CudaResult<()> {
        Ok(())
    }

    fn graph_node_read(&self, node: u64) -> CudaResult<NodeRead> {
        let state = self.state();
        let side = |ptr: u64, pitch: u64, height: u64| NodeCopySide { memory_type: 2, ptr, pos: Pos3::default(), pitch, height };
        match state.graphs.nodes.get(&node).map(|n| &n.work) {
            Some(Work::Memcpy(copy)) => Ok(NodeRead::Memcpy(NodeCopy {
                src: side(copy.src, copy.src_pitch, copy.src_height),
                dst: side(copy.dst, copy.dst_pitch, copy.dst_height),
                width: copy.width,
                height: copy.height,
                depth: copy.depth,
            })),
            Some(Work::Memset(set)) => Ok(NodeRead::Memset(*set)),
            Some(Work::Host(site)) => Ok(NodeRead::Host(Arc::as_ptr(site) as usize)),
            Some(Work::BatchMemOp(ops)) => Ok(NodeRead::BatchMemOp(ops.clone())),
            _ => Err(CudaError::INVALID_VALUE),
        }
    }

    fn graph_kernel_node_read(&self, _node: u64, _layout: &dyn Fn(()) -> Option<Vec<ParamInfo>>) -> CudaResult<KernelRead<Self>> {
        // Kernel nodes need GPU code: no node here is one.
        Err(CudaError::INVALID_VALUE)
    }

    fn graph_kernel_node_attribute(&self, _node: u64, _attribute: u32, _set: Option<&[u8; 64]>) -> CudaResult<[u8; 64]> {
        // Kernel nodes need GPU code: no node here is one.
        Err(CudaError::INVALID_VALUE)
    }

    fn graph_kernel_node_copy_attributes(&self, _dst: u64, _src: u64) -> CudaResult<()> {
        Err(CudaError::INVALID_VALUE)
    }

    fn graph_node_set(&self, exec: Option<u64>, node: u64, work: NodeWork<'_, Self>) -> CudaResult<()> {
        let work = emulated_work(work)?;
        let mut state = self.state();
        let current = state.graphs.nodes.get(&node).ok_or(CudaError::INVALID_VALUE)?;
        if current.work.kind() != work.kind() {
            return Err(CudaError::INVALID_VALUE);
        }
        match exec {
            // An executable graph holds its own copy of the graph: the node's counterpart there.
            Some(exec) => {
                let private = state.graphs.execs.get(&exec).copied().ok_or(CudaError::INVALID_VALUE)?;
                let counterpart = state.graphs.clones.get(&(node, private)).copied().ok_or(CudaError::INVALID_VALUE)?;
                let work = match work {
                    Work::Child(child) => {
                        let copy = state.new_handle();
                        let State { graphs, next_handle, .. } = &mut *state;
                        graphs.clone_graph(child, copy, &mut || {
                            *next_handle += 1;
                            *next_handle
                        })?;
                        Work::Child(copy)
                    }
                    work => work,
                };
                if let Some(target) = state.graphs.nodes.get_mut(&counterpart) {
                    target.work = work;
                }
            }
            None => {
                if matches!(work, Work::Child(_)) {
                    return Err(CudaError::INVALID_VALUE);
                }
                if let Some(current) = state.graphs.nodes.get_mut(&node) {
                    current.work = work;
                }
            }
        }
        Ok(())
    }

    fn graph_destroy_node(&self, node: u64) -> CudaResult<()> {
        let mut state = self.state();
        let removed = state.graphs.nodes.remove(&node).ok_or(CudaError::INVALID_VALUE)?;
        if let Some(members) = state.graphs.graphs.get_mut(&removed.graph) {
            members.retain(|n| *n != node);
        }
        for other in state.graphs.nodes.values_mut() {
            other.dependencies.retain(|d| *d != node);
        }
        Ok(())
    }

    fn graph_edges(&self, graph: u64, from: &[u64], to: &[u64], data: Option<&[EdgeData]>, remove: bool) -> CudaResult<()> {
        plain_edges(from, data)?;
        let mut state = self.state();
        let in_graph = |node: &u64| state.graphs.nodes.get(node).is_some_and(|n| n.graph == graph);
        if from.len() != to.len() || !from.iter().chain(to).all(in_graph) {
            return Err(CudaError::INVALID_VALUE);
        }
        for (from, to) in from.iter().zip(to) {
            let Some(node) = state.graphs.nodes.get_mut(to) else { continue };
            match (remove, node.dependencies.contains(from)) {
                (false, false) => node.dependencies.push(*from),
                (true, true) => node.dependencies.retain(|d| d != from),
                _ => return Err(CudaError::INVALID_VALUE),
            }
        }
        Ok(())
    }

    fn graph_nodes(&self, graph: u64, roots: bool) -> CudaResult<Vec<(u64, u32)>> {
        let state = self.state();
        let members = state.graphs.graphs.get(&graph).ok_or(CudaError::INVALID_VALUE)?;
        members
            .iter()
            .filter(|node| !roots || state.graphs.nodes.get(node).is_some_and(|n| n.dependencies.is_empty()))
            .map(|node| Ok((*node, state.graphs.kind(*node)?)))
            .collect()
    }

    fn graph_child(&self, node: u64) -> CudaResult<u64> {
        match self.state().graphs.nodes.get(&node).map(|n| &n.work) {
            Some(Work::Child(child)) => Ok(*child),
            _ => Err(CudaError::INVALID_VALUE),
        }
    }

    fn graph_clone(&self, graph: u64) -> CudaResult<u64> {
        let mut state = self.state();
        let clone = state.new_handle();
        let State { graphs, next_handle, .. } = &mut *state;
        graphs.clone_graph(graph, clone, &mut || {
            *next_handle += 1;
            *next_handle
        })?;
        Ok(clone)
    }

    fn graph_node_in_clone(&self, node: u64, clone: u64) -> CudaResult<u64> {
        self.state().graphs.clones.get(&(node, clone)).copied().ok_or(CudaError::INVALID_VALUE)
    }

    fn graph_instantiate(&self, graph: u64, flags: u64) -> CudaResult<u64> {
        // cudaGraphInstantiateFlagAutoFreeOnLaunch, Upload, DeviceLaunch, UseNodePriority.
        if flags & !0xf != 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        let mut state = self.state();
        // A cycle cannot be instantiated.
        state.graphs.flatten(graph, &mut Vec::new(), 0)?;
        let private = state.new_handle();
        let State { graphs, next_handle, .. } = &mut *state;
        graphs.clone_graph(graph, private, &mut || {
            *next_handle += 1;
            *next_handle
        })?;
        let exec = state.new_handle();
        state.graphs.execs.insert(exec, private);
        Ok(exec)
    }

    fn graph_launch(&self, exec: u64, stream: u64) -> CudaResult<()> {
        let mut works = Vec::new();
        {
            let state = self.state();
            let private = state.graphs.execs.get(&exec).copied().ok_or(CudaError::INVALID_VALUE)?;
            state.graphs.flatten(private, &mut works, 0)?;
        }
        for work in works {
            let mut state = self.state();
            match work {
                Work::Memcpy(copy) => copy_3d(&mut state.blocks, &copy)?,
                Work::Memset(set) => memset_2d(&mut state.blocks, &set)?,
                Work::BatchMemOp(ops) => run_node_mem_ops(&mut state.blocks, &ops)?,
                Work::EventRecord(event) => {
                    if let Some(event) = state.events.get_mut(&event) {
                        event.recorded = Some(Instant::now());
                    }
                }
                Work::Host(site) => {
                    drop(state);
                    let copy = site.is_copy();
                    self.host.submit(stream, site)?;
                    if copy {
                        // A host copy's half on the host: the graph's next work (its copy out
                        // of staging, or the next launch's copy into it) must follow it, and
                        // work here runs at submission.
                        self.host.wait(self.host.mark());
                    }
                }
                // Graph memory is held by its node here; conditionals were inlined by `flatten`.
                Work::Empty | Work::EventWait(_) | Work::Child(_) | Work::MemAlloc { .. } | Work::MemFree(_) | Work::Conditional { .. } => {
                }
            }
        }
        Ok(())
    }

    fn graph_upload(&self, exec: u64, _stream: u64) -> CudaResult<()> {
        if self.state().graphs.execs.contains_key(&exec) { Ok(()) } else { Err(CudaError::INVALID_VALUE) }
    }

    fn graph_exec_destroy(&self, exec: u64) -> CudaResult<()> {
        let mut state = self.state();
        if let Some(private) = state.graphs.execs.remove(&exec) {
            state.graphs.destroy(private);
        }
        free_unheld_graph_memory(&mut state);
        Ok(())
    }

    fn graph_exec_update(&self, exec: u64, graph: u64) -> ExecUpdate<Self> {
        let mut state = self.state();
        let Some(private) = state.graphs.execs.get(&exec).copied() else {
            return ExecUpdate { result: Err(CudaError::INVALID_VALUE), status: 1, error_node: None };
        };
        // Checked first, then applied: a failed update leaves the executable graph as it was.
        match state.graphs.same_shape(graph, private, false, 0) {
            Ok(true) => {
                let _ = state.graphs.same_shape(graph, private, true, 0);
                ExecUpdate { result: Ok(()), status: 0, error_node: None }
            }
            // CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED.
            _ => ExecUpdate { result: Err(CudaError::GRAPH_EXEC_UPDATE_FAILURE), status: 2, error_node: None },
        }
    }

    fn graph_dot(&self, graph: u64, _flags: u32) -> CudaResult<String> {
        let state = self.state();
        let mut text = format!("digraph dot {{\n  subgraph cluster_{graph} {{\n    label=\"graph_{graph}\"\n");
        for node in state.graphs.ordered(graph)? {
            text.push_str(&format!("    node_{node} [label=\"type {}\"];\n", state.graphs.kind(node)?));
            for dependency in &state.graphs.nodes[&node].dependencies {
                text.push_str(&format!("    node_{dependency} -> node_{node};\n"));
            }
        }
        text.push_str("  }\n}\n");
        Ok(text)
    }

    fn mem_granularity(&self, _recommended: bool, host: bool) -> CudaResult<u64> {
        // Host memory comes in pages.
        Ok(if host { 4096 } else { ALIGNMENT })
    }

    fn mem_address_reserve(&self, size: u64, alignment: u64, addr: u64) -> CudaResult<u64> {
        if size == 0 || !size.is_multiple_of(ALIGNMENT) || (alignment != 0 && !alignment.is_power_of_two()) {
            return Err(CudaError::INVALID_VALUE);
        }
        let mut state = self.state();
        // A hint is taken when it is aligned and past every address given out so far (this
        // device never reuses addresses).
        let align = alignment.max(ALIGNMENT);
        let start = if addr != 0 && addr.is_multiple_of(align) && addr >= state.next_address {
            addr
        } else {
            state.next_address.div_ceil(align) * align
        };
        state.next_address = start + size;
        state.reserved.insert(start, size);
        Ok(start)
    }

    fn mem_address_free(&self, ptr: u64, size: u64) -> CudaResult<()> {
        let mut state = self.state();
        match state.reserved.get(&ptr) {
            Some(reserved) if *reserved == size => {
                state.reserved.remove(&ptr);
                Ok(())
            }
            _ => Err(CudaError::INVALID_VALUE),
        }
    }

    /// `usage` (a tile pool, decompression buffers) changes nothing here: this device maps no
    /// tiles and decompresses nothing, and refuses those calls.
    fn mem_create(&self, size: u64, handle_types: u32, usage: u32) -> CudaResult<u64> {
        if size == 0 || !size.is_multiple_of(ALIGNMENT) || handle_types > 1 || usage & !mem_usage::ALL != 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        let mut state = self.state();
        if size > self.config.memory.saturating_sub(state.used) {
            return Err(CudaError::MEMORY_ALLOCATION);
        }
        let len = usize::try_from(size).map_err(|_| CudaError::MEMORY_ALLOCATION)?;
        let bytes = if handle_types & POSIX_FD != 0 { Block::shared(len)? } else { Block::Heap(vec![0; len]) };
        state.used += size;
        let handle = state.new_handle();
        state.physical.insert(handle, (size, Some(bytes)));
        Ok(handle)
    }

    fn mem_release(&self, handle: u64) -> CudaResult<()> {
        let mut state = self.state();
        let (size, bytes) = state.physical.remove(&handle).ok_or(CudaError::INVALID_VALUE)?;
        // Mapped, the memory stays until it is unmapped.
        if bytes.is_some() {
            state.used -= size;
        }
        Ok(())
    }

    fn mem_map(&self, ptr: u64, size: u64, offset: u64, handle: u64) -> CudaResult<()> {
        let mut state = self.state();
        let bytes = match state.physical.get_mut(&handle) {
            // This device maps whole allocations, once at a time.
            Some((whole, bytes)) if offset == 0 && *whole == size => bytes.take().ok_or(CudaError::NOT_SUPPORTED)?,
            Some(_) => return Err(CudaError::NOT_SUPPORTED),
            None => return Err(CudaError::INVALID_VALUE),
        };
        state.blocks.insert(ptr, bytes);
        state.mapped.insert(ptr, handle);
        Ok(())
    }

    fn mem_unmap(&self, ptr: u64, size: u64) -> CudaResult<()> {
        let mut state = self.state();
        let handle = state.mapped.remove(&ptr).ok_or(CudaError::INVALID_VALUE)?;
        let bytes = state.blocks.remove(&ptr).ok_or(CudaError::INVALID_VALUE)?;
        if bytes.len() as u64 != size {
            return Err(CudaError::INVALID_VALUE);
        }
        match state.physical.get_mut(&handle) {
            Some((_, slot)) => *slot = Some(bytes),
            // Released while mapped: its memory goes now.
            None => state.used -= size,
        }
        Ok(())
    }

    fn mem_set_access(&self, _ptr: u64, _size: u64, flags: u32) -> CudaResult<()> {
        // PROT_NONE, READ, READWRITE; host memory is always accessible here.
        if matches!(flags, 0 | 1 | 3) { Ok(()) } else { Err(CudaError::INVALID_VALUE) }
    }

    fn mem_export(&self, handle: u64) -> CudaResult<std::os::fd::OwnedFd> {
        let state = self.state();
        let file = match state.physical.get(&handle) {
            Some((_, Some(Block::Shared { file, .. }))) => file,
            Some((_, None)) => {
                match state.mapped.iter().find(|(_, mapped)| **mapped == handle).and_then(|(ptr, _)| state.blocks.get(ptr)) {
                    Some(Block::Shared { file, .. }) => file,
                    _ => return Err(CudaError::INVALID_VALUE),
                }
            }
            // Made without a shareable handle type.
            Some(_) => return Err(CudaError::INVALID_VALUE),
            None => return Err(CudaError::INVALID_VALUE),
        };
        file.try_clone().map(std::os::fd::OwnedFd::from).map_err(|_| CudaError::OPERATING_SYSTEM)
    }

    fn mem_import(&self, fd: std::os::fd::BorrowedFd<'_>, size: u64) -> CudaResult<u64> {
        let file = std::fs::File::from(fd.try_clone_to_owned().map_err(|_| CudaError::OPERATING_SYSTEM)?);
        let len = usize::try_from(size).map_err(|_| CudaError::INVALID_VALUE)?;
        if size == 0 || file.metadata().map(|meta| meta.len()).unwrap_or(0) < size {
            return Err(CudaError::INVALID_VALUE);
        }
        let bytes = Block::map(file, 0, len)?;
        // Counted by this worker's device until released, like its own allocations (the
        // session's quota is the exporter's business, not this device's).
        let mut state = self.state();
        state.used += size;
        let handle = state.new_handle();
        state.physical.insert(handle, (size, Some(bytes)));
        Ok(handle)
    }

    fn default_pool(&self) -> CudaResult<u64> {
        self.default_pool_of(self.current_device())
    }

    fn default_pool_of(&self, device: usize) -> CudaResult<u64> {
        if device >= self.device_count() {
            return Err(CudaError::INVALID_DEVICE);
        }
        let mut guard = self.state();
        let state = &mut *guard;
        let pool = match device {
            0 => 1,
            _ => match state.default_pools.get(&device) {
                Some(pool) => *pool,
                None => {
                    let pool = state.new_handle();
                    state.default_pools.insert(device, pool);
                    state.pool_devices.insert(pool, device);
                    pool
                }
            },
        };
        state.pools.entry(pool).or_default();
        Ok(pool)
    }

    fn pool_create(&self, handle_types: u32) -> CudaResult<u64> {
        let file = match handle_types {
            0 => None,
            POSIX_FD => Some(memory_file("flyt-emulated-pool", 0)?),
            _ => return Err(CudaError::NOT_SUPPORTED),
        };
        let device = self.current_device();
        let mut state = self.state();
        let pool = state.new_handle();
        state.pools.insert(pool, HashMap::new());
        if device != 0 {
            state.pool_devices.insert(pool, device);
        }
        if let Some(file) = file {
            state.pool_files.insert(pool, PoolFile { file, end: 0, imported: false });
        }
        Ok(pool)
    }

    fn pool_destroy(&self, pool: u64) -> CudaResult<()> {
        let mut state = self.state();
        // Allocations still live keep their spans mapped (and the file with them).
        state.pool_files.remove(&pool);
        state.pool_devices.remove(&pool);
        state.pool_peers.retain(|(of, _), _| *of != pool);
        state.pools.remove(&pool).map(drop).ok_or(CudaError::INVALID_VALUE)
    }

    /// Only a pool of the current device can be its current pool.
    fn set_current_pool(&self, pool: u64) -> CudaResult<()> {
        let device = self.current_device();
        let state = self.state();
        let own = state.pool_devices.get(&pool).copied().unwrap_or(0) == device;
        if own && state.pools.contains_key(&pool) && !state.pool_files.get(&pool).is_some_and(|file| file.imported) {
            Ok(())
        } else {
            Err(CudaError::INVALID_VALUE)
        }
    }

    fn alloc_async(&self, size: u64, pool: u64, stream: u64) -> CudaResult<u64> {
        if self.state().graphs.captures.contains_key(&stream) {
            // An allocation node of the capture, holding its memory as an added one does.
            let ptr = self.allocate(size)?;
            let mut state = self.state();
            state.graph_memory.insert(ptr);
            return match state.capture(stream, || Work::MemAlloc { ptr, size }) {
                Some(Ok(())) | None => Ok(ptr),
                Some(Err(error)) => Err(error),
            };
        }
        // Work completes at submission: a stream-ordered allocation is an allocation now.
        let mut guard = self.state();
        let state = &mut *guard;
        if !state.pools.contains_key(&pool) {
            return Err(CudaError::INVALID_VALUE);
        }
        let Some(pool_file) = state.pool_files.get_mut(&pool) else {
            drop(guard);
            return self.allocate(size);
        };
        // An imported pool makes no allocations.
        if pool_file.imported {
            return Err(CudaError::INVALID_VALUE);
        }
        if size > self.config.memory.saturating_sub(state.used) {
            return Err(CudaError::MEMORY_ALLOCATION);
        }
        let len = usize::try_from(size).map_err(|_| CudaError::MEMORY_ALLOCATION)?;
        let offset = pool_file.end;
        let end = offset + size.max(1).div_ceil(POOL_SPAN_ALIGNMENT) * POOL_SPAN_ALIGNMENT;
        pool_file.file.set_len(end).map_err(|_| CudaError::MEMORY_ALLOCATION)?;
        pool_file.end = end;
        let file = pool_file.file.try_clone().map_err(|_| CudaError::MEMORY_ALLOCATION)?;
        let block = Block::map(file, offset, len)?;
        let address = place(state, size, block);
        state.pool_spans.insert(address, (pool, offset));
        Ok(address)
    }

    fn free_async(&self, ptr: u64, _stream: u64) -> CudaResult<()> {
        self.free(ptr)
    }

    fn pool_attribute(&self, pool: u64, attribute: u32, set: Option<u64>) -> CudaResult<u64> {
        let mut state = self.state();
        let used = state.used;
        let attributes = state.pools.get_mut(&pool).ok_or(CudaError::INVALID_VALUE)?;
        match (attribute, set) {
            // Reuse policies (on by default) and the release threshold.
            (1..=4, Some(value)) => {
                attributes.insert(attribute, value);
            }
            // The high-water marks may only be reset.
            (6 | 8, Some(0)) => {}
            (1..=8, None) => {}
            _ => return Err(CudaError::INVALID_VALUE),
        }
        Ok(match attribute {
            1..=3 => attributes.get(&attribute).copied().unwrap_or(1),
            4 => attributes.get(&attribute).copied().unwrap_or(0),
            // Nothing is cached: reserved is what is in use (of the whole device, here).
            _ => used,
        })
    }

    fn pool_trim(&self, pool: u64, _keep: u64) -> CudaResult<()> {
        if self.state().pools.contains_key(&pool) { Ok(()) } else { Err(CudaError::INVALID_VALUE) }
    }

    fn pool_export(&self, pool: u64) -> CudaResult<std::os::fd::OwnedFd> {
        let state = self.state();
        match state.pool_files.get(&pool) {
            Some(PoolFile { file, imported: false, .. }) => {
                file.try_clone().map(std::os::fd::OwnedFd::from).map_err(|_| CudaError::OPERATING_SYSTEM)
            }
            // Made without a shareable handle type, or imported.
            _ => Err(CudaError::INVALID_VALUE),
        }
    }

    fn pool_import(&self, fd: std::os::fd::BorrowedFd<'_>) -> CudaResult<u64> {
        let file = std::fs::File::from(fd.try_clone_to_owned().map_err(|_| CudaError::OPERATING_SYSTEM)?);
        let mut state = self.state();
        let pool = state.new_handle();
        state.pools.insert(pool, HashMap::new());
        state.pool_files.insert(pool, PoolFile { file, end: 0, imported: true });
        Ok(pool)
    }

    fn pool_export_pointer(&self, ptr: u64) -> CudaResult<[u8; 64]> {
        let state = self.state();
        let (_, offset) = state.pool_spans.get(&ptr).ok_or(CudaError::INVALID_VALUE)?;
        let len = state.blocks.get(&ptr).ok_or(CudaError::INVALID_VALUE)?.len() as u64;
        let mut data = [0; 64];
        data[..8].copy_from_slice(POOL_EXPORT_MAGIC);
        data[8..16].copy_from_slice(&offset.to_le_bytes());
        data[16..24].copy_from_slice(&len.to_le_bytes());
        Ok(data)
    }

    fn pool_import_pointer(&self, pool: u64, data: &[u8; 64], size: u64) -> CudaResult<u64> {
        let field = |at: usize| data[at..at + 8].try_into().map(u64::from_le_bytes).map_err(|_| CudaError::INVALID_VALUE);
        let (offset, len) = (field(8)?, field(16)?);
        if &data[..8] != POOL_EXPORT_MAGIC || len != size || size == 0 || offset % POOL_SPAN_ALIGNMENT != 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        let mut state = self.state();
        let file = match state.pool_files.get(&pool) {
            Some(PoolFile { file, imported: true, .. }) => file,
            _ => return Err(CudaError::INVALID_VALUE),
        };
        let end = offset.checked_add(size).ok_or(CudaError::INVALID_VALUE)?;
        if file.metadata().map(|meta| meta.len()).unwrap_or(0) < end {
            return Err(CudaError::INVALID_VALUE);
        }
        let file = file.try_clone().map_err(|_| CudaError::OPERATING_SYSTEM)?;
        let block = Block::map(file, offset, usize::try_from(size).map_err(|_| CudaError::INVALID_VALUE)?)?;
        // Counted by this worker's device until freed, like its own allocations (the session's
        // quota is the exporter's business, not this device's).
        Ok(place(&mut state, size, block))
    }

    fn launch_host_call(&self, stream: u64, site: &Arc<HostCallSite>, _kept: bool) -> CudaResult<()> {
        let mut state = self.state();
        if let Some(captured) = state.capture(stream, || Work::Host(site.clone())) {
            return captured;
        }
        drop(state);
        self.host.submit(stream, site.clone())
    }

    /// The emulated device's memory is its worker's own host memory, which no other session's
    /// worker can map: IPC needs a GPU.
    fn ipc_mem_handle(&self, _ptr: u64) -> CudaResult<[u8; 64]> {
        Err(CudaError::NOT_SUPPORTED)
    }

    fn ipc_open_mem(&self, _handle: &[u8; 64], _flags: u32) -> CudaResult<(u64, u64)> {
        Err(CudaError::NOT_SUPPORTED)
    }

    fn ipc_close_mem(&self, _ptr: u64) -> CudaResult<()> {
        Err(CudaError::INVALID_VALUE)
    }

    fn ipc_event_handle(&self, _event: u64) -> CudaResult<[u8; 64]> {
        Err(CudaError::NOT_SUPPORTED)
    }

    fn ipc_open_event(&self, _handle: &[u8; 64]) -> CudaResult<u64> {
        Err(CudaError::NOT_SUPPORTED)
    }

    /// Writes happen at submission, as all work here. A wait passes when its condition holds at
    /// submission; one that does not could only be satisfied by work submitted later, which a
    /// device with no queue cannot order after it, so it fails with `CUDA_ERROR_NOT_SUPPORTED`
    /// (the session's deferred error; the driver front asks at once, so the app sees it at the
    /// call) rather than pass. The ops after it in its batch do not run; later requests on the
    /// stream do (nothing holds them).
    unsafe fn stream_mem_ops(&self, stream: u64, ops: &[StreamMemOp]) -> CudaResult<()> {
        let mut state = self.state();
        if state.graphs.captures.contains_key(&stream) {
            // A captured batch becomes a node, which runs on device memory only here.
            if !ops.iter().all(|op| op.width().is_none_or(|width| block_slice(&mut state.blocks, op.address, width).is_ok())) {
                return Err(CudaError::NOT_SUPPORTED);
            }
            if let Some(captured) = state.capture(stream, || Work::BatchMemOp(ops.to_vec())) {
                return captured;
            }
        }
        for op in ops {
            let Some(width) = op.width() else { continue };
            let bytes: &mut [u8] = match block_slice(&mut state.blocks, op.address, width) {
                Ok(bytes) => bytes,
                // SAFETY: not device memory, so (the caller guarantees) host memory of this
                // process registered mapped at its address; work runs at once, so nothing else
                // writes it meanwhile.
                Err(_) => unsafe { std::slice::from_raw_parts_mut(op.address as *mut u8, width as usize) },
            };
            apply_mem_op(op, bytes)?;
        }
        Ok(())
    }

    /// A `CUtensorMap` is the GPU's own descriptor format, which only a driver can encode.
    fn tensor_map_encode(&self, _encode: &TensorMapParams) -> CudaResult<[u8; 128]> {
        Err(NO_GPU_CODE)
    }

    fn tensor_map_replace_address(&self, _map: &[u8; 128], _address: u64) -> CudaResult<[u8; 128]> {
        Err(NO_GPU_CODE)
    }

    fn context_event(&self, event: u64, wait: bool) -> CudaResult<()> {
        if !self.state().graphs.captures.is_empty() {
            return Err(CudaError::STREAM_CAPTURE_UNSUPPORTED);
        }
        if wait {
            // Work completes at submission: nothing the event covers is pending.
            return if self.state().events.contains_key(&event) { Ok(()) } else { Err(CudaError::INVALID_RESOURCE_HANDLE) };
        }
        // The context's work so far is the legacy stream's reach.
        self.event_record(event, 0, 0)
    }

    /// The pool's own device always has read-write access; another device (the current one)
    /// has none until given some (peer access to the pool's memory: every device here reaches
    /// every other's).
    fn pool_access(&self, pool: u64, set: Option<u32>) -> CudaResult<u32> {
        let device = self.current_device();
        let mut state = self.state();
        if !state.pools.contains_key(&pool) {
            return Err(CudaError::INVALID_VALUE);
        }
        if state.pool_devices.get(&pool).copied().unwrap_or(0) == device {
            return match set {
                None | Some(3) => Ok(3),
                Some(_) => Err(CudaError::INVALID_VALUE),
            };
        }
        match set {
            Some(flags @ (0 | 1 | 3)) => {
                state.pool_peers.insert((pool, device), flags);
                Ok(flags)
            }
            Some(_) => Err(CudaError::INVALID_VALUE),
            None => Ok(state.pool_peers.get(&(pool, device)).copied().unwrap_or(0)),
        }
    }

    fn occupancy_max_potential_cluster_size(&self, _: (), _: LaunchShape<'_>) -> CudaResult<i32> {
        Err(NO_GPU_CODE)
    }

    fn dev_resource(&self, green: Option<u64>, kind: u32) -> CudaResult<EmulatedResource> {
        if kind != dev_resource::SM {
            return Err(CudaError::INVALID_RESOURCE_TYPE);
        }
        let sm_count = match green {
            None => self.config.sms,
            Some(green) => *self.state().greens.get(&green).ok_or(CudaError::DEVICE_UNINITIALIZED)?,
        };
        Ok(EmulatedResource::whole(sm_count))
    }

    fn resource_facts(resource: &EmulatedResource) -> DevResource {
        resource.facts()
    }

    fn sm_resource_split(&self, input: &EmulatedResource, groups: Option<u32>, flags: u32, min_count: u32) -> CudaResult<SmSplit<Self>> {
        let instance = self.state().new_handle();
        let (groups, count, remaining) = super::emulated_green::split(input, groups, flags, min_count, instance)?;
        Ok(SmSplit { groups, count, remaining })
    }

    fn resource_desc(&self, resources: &[EmulatedResource]) -> CudaResult<u64> {
        let sms = super::emulated_green::described_sms(resources)?;
        let mut state = self.state();
        let desc = state.new_handle();
        state.resource_descs.insert(desc, sms);
        Ok(desc)
    }

    fn green_create(&self, desc: u64, flags: u32) -> CudaResult<u64> {
        let mut state = self.state();
        let sms = *state.resource_descs.get(&desc).ok_or(CudaError::INVALID_VALUE)?;
        if flags != dev_resource::GREEN_CTX_DEFAULT_STREAM {
            return Err(CudaError::INVALID_VALUE);
        }
        let green = state.new_handle();
        state.greens.insert(green, sms);
        Ok(green)
    }

    /// A stream like any other of the device (whose work never runs on SMs).
    fn green_stream_create(&self, green: u64, flags: u32, priority: i32) -> CudaResult<u64> {
        if !self.state().greens.contains_key(&green) {
            return Err(CudaError::DEVICE_UNINITIALIZED);
        }
        self.stream_create(flags, priority)
    }

    /// As the context-wide events: the green context's work is done at submission too.
    fn green_event(&self, green: u64, event: u64, wait: bool) -> CudaResult<()> {
        if !self.state().greens.contains_key(&green) {
            return Err(CudaError::DEVICE_UNINITIALIZED);
        }
        self.context_event(event, wait)
    }

    fn green_destroy(&self, green: u64) -> CudaResult<()> {
        self.state().greens.remove(&green).map(drop).ok_or(CudaError::DEVICE_UNINITIALIZED)
    }

    fn stream_attribute(&self, stream: u64, attribute: u32, set: Option<&[u8; 64]>) -> CudaResult<[u8; 64]> {
        let mut state = self.state();
        if let Some(value) = set {
            state.stream_attributes.insert((stream, attribute), *value);
        }
        Ok(state.stream_attributes.get(&(stream, attribute)).copied().unwrap_or([0; 64]))
    }

    fn malloc_pitch(&self, width: u64, height: u64, element_size: u32) -> CudaResult<(u64, u64)> {
        if width == 0 || height == 0 || !matches!(element_size, 4 | 8 | 16) {
            return Err(CudaError::INVALID_VALUE);
        }
        // The pitch CUDA gives on current GPUs: rows start 512 bytes apart.
        let pitch = width.checked_next_multiple_of(PITCH_ALIGNMENT).ok_or(CudaError::MEMORY_ALLOCATION)?;
        let size = pitch.checked_mul(height).ok_or(CudaError::MEMORY_ALLOCATION)?;
        let ptr = if self.keep_addresses { self.own_memory().allocate(&mut EmulatedVmm(self), size)? } else { self.allocate(size)? };
        Ok((ptr, pitch))
    }

    fn memset_2d(&self, set: &Memset2d, stream: u64) -> CudaResult<()> {
        let mut state = self.state();
        if let Some(captured) = state.capture(stream, || Work::Memset(*set)) {
            return captured;
        }
        memset_2d(&mut state.blocks, set)
    }

    unsafe fn copy_shaped(&self, src: Side<Self>, dst: Side<Self>, extent: Extent, stream: u64) -> CudaResult<()> {
        let mut state = self.state();
        let (src, dst) = (flat(src)?, flat(dst)?);
        if let (Flat::Device(src_ptr, src_pitch, src_height), Flat::Device(dst_ptr, dst_pitch, dst_height)) = (src, dst) {
            let copy = Copy3d {
                src: src_ptr,
                src_pitch,
                src_height,
                dst: dst_ptr,
                dst_pitch,
                dst_height,
                width: extent.width,
                height: extent.height,
                depth: extent.depth,
            };
            if let Some(captured) = state.capture(stream, || Work::Memcpy(copy)) {
                return captured;
            }
        } else if state.graphs.captures.contains_key(&stream) {
            // The emulated graphs record device-to-device copies only.
            return Err(CudaError::NOT_SUPPORTED);
        }
        // SAFETY: forwarded contract (host sides are mapped memory of this process).
        unsafe { copy_rows(&mut state.blocks, src, dst, extent) }
    }

    fn copy_staged_to_shaped(&self, dst: Side<Self>, extent: Extent, mut src: Vec<u8>, _stream: u64) -> CudaResult<()> {
        let host = Flat::Host(src.as_mut_ptr(), extent.width, extent.height);
        // SAFETY: the host side is the staging vector, which holds the packed box.
        unsafe { copy_rows(&mut self.state().blocks, host, flat(dst)?, extent) }
    }

    fn start_shaped_to_staged(&self, src: Side<Self>, extent: Extent, mut dst: Vec<u8>, _stream: u64) -> CudaResult<CudaResult<Vec<u8>>> {
        let host = Flat::Host(dst.as_mut_ptr(), extent.width, extent.height);
        // SAFETY: the host side is the staging vector, sized for the packed box.
        unsafe { copy_rows(&mut self.state().blocks, flat(src)?, host, extent) }?;
        Ok(Ok(dst))
    }

    fn array_create(&self, desc: &ArrayDesc) -> CudaResult<EmulatedArray> {
        if desc.width == 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        if let Some([luma, _]) = desc.planes() {
            // NV12 as NVIDIA's runtime describes it (three channels), one 2D image whose
            // memory is its own.
            if desc.channels != 3 || desc.height == 0 || desc.depth != 0 || desc.is_mapped_later() {
                return Err(CudaError::INVALID_VALUE);
            }
            let base = self.allocate(desc.packed_bytes(1).ok_or(CudaError::MEMORY_ALLOCATION)?)?;
            return Ok(EmulatedArray { base, pitch: luma.width, height: luma.height, unbacked: false });
        }
        let (width, height, depth) = desc.extent().ok_or(CudaError::INVALID_VALUE)?;
        if desc.is_mapped_later() {
            // Sparse arrays are 2D, 2D layered or 3D.
            if desc.flags & array_flags::SPARSE != 0 && desc.height == 0 {
                return Err(CudaError::INVALID_VALUE);
            }
            return Ok(EmulatedArray { base: 0, pitch: width, height, unbacked: true });
        }
        let base =
            self.allocate(width.checked_mul(height).and_then(|bytes| bytes.checked_mul(depth)).ok_or(CudaError::MEMORY_ALLOCATION)?)?;
        Ok(EmulatedArray { base, pitch: width, height, unbacked: false })
    }

    fn array_destroy(&self, array: EmulatedArray) -> CudaResult<()> {
        if array.unbacked { Ok(()) } else { self.free(array.base) }
    }

    fn mipmap_create(&self, desc: &ArrayDesc, levels: u32) -> CudaResult<u64> {
        let mut made = Vec::new();
        for level in 0..levels.max(1) {
            match self.array_create(&desc.level(level)) {
                Ok(array) => made.push(array),
                Err(error) => {
                    for array in made {
                        let _ = self.array_destroy(array);
                    }
                    return Err(error);
                }
            }
        }
        let mut state = self.state();
        let handle = state.new_handle();
        state.mipmaps.insert(handle, made);
        Ok(handle)
    }

    fn mipmap_level(&self, mipmap: u64, level: u32) -> CudaResult<EmulatedArray> {
        let state = self.state();
        let levels = state.mipmaps.get(&mipmap).ok_or(CudaError::INVALID_RESOURCE_HANDLE)?;
        levels.get(level as usize).copied().ok_or(CudaError::INVALID_VALUE)
    }

    fn mipmap_destroy(&self, mipmap: u64) -> CudaResult<()> {
        let levels = self.state().mipmaps.remove(&mipmap).ok_or(CudaError::INVALID_RESOURCE_HANDLE)?;
        for array in levels {
            self.array_destroy(array)?;
        }
        Ok(())
    }

    /// A handle kernels could name; the emulated device runs no kernels to read through it.
    fn tex_create(&self, _resource: TexResource<Self>, _texture: &TextureDesc, _view: Option<&ViewDesc>) -> CudaResult<u64> {
        Ok(self.state().new_object(false))
    }

    fn surf_create(&self, _array: EmulatedArray) -> CudaResult<u64> {
        Ok(self.state().new_object(true))
    }

    /// An NV12 array's planes lie in its block, luma rows then chroma rows, each packed.
    fn array_plane(&self, array: EmulatedArray, desc: &ArrayDesc, plane: u32) -> CudaResult<(EmulatedArray, ArrayDesc)> {
        let planes = desc.planes().ok_or(CudaError::INVALID_VALUE)?;
        let plane_desc = *planes.get(plane as usize).ok_or(CudaError::INVALID_VALUE)?;
        let (luma_width, luma_height, _) = planes[0].extent().ok_or(CudaError::INVALID_VALUE)?;
        let (width, height, _) = plane_desc.extent().ok_or(CudaError::INVALID_VALUE)?;
        let offset = if plane == 0 { 0 } else { luma_width * luma_height };
        Ok((EmulatedArray { base: array.base + offset, pitch: width, height, unbacked: false }, plane_desc))
    }

    /// Tiles of 64 KiB shaped as NVIDIA's sparse tiles are for the element size; a mipmapped
    /// array's mip tail begins at its first level smaller than a tile in any dimension, and holds
    /// the levels from there packed, per layer, rounded up to whole tiles.
    fn sparse_properties(&self, _target: ArrayRef<Self>, desc: &ArrayDesc, levels: u32) -> CudaResult<SparseProperties> {
        if desc.flags & array_flags::SPARSE == 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        let tile = sparse_tile(desc).ok_or(CudaError::INVALID_VALUE)?;
        let fits = |level: &ArrayDesc| {
            let depth = if desc.layers() == 0 && desc.depth > 0 { level.depth } else { 1 };
            level.width >= u64::from(tile[0]) && level.height.max(1) >= u64::from(tile[1]) && depth >= u64::from(tile[2])
        };
        let mut properties = SparseProperties { tile, ..SparseProperties::default() };
        if levels > 1 {
            let first = (0..levels).find(|level| !fits(&desc.level(*level))).unwrap_or(levels);
            let per_layer = (first..levels).try_fold(0u64, |total, level| {
                let (width, height, depth) = desc.level(level).extent()?;
                let slices = if desc.layers() == 0 { depth } else { 1 };
                total.checked_add(width.checked_mul(height)?.checked_mul(slices)?)
            });
            properties.miptail_first_level = first;
            properties.miptail_size = per_layer.ok_or(CudaError::INVALID_VALUE)?.next_multiple_of(SPARSE_TILE_BYTES);
        }
        Ok(properties)
    }

    /// Each level's extent rounded up to whole 64 KiB tiles (shaped as for sparse arrays), all
    /// layers, the total in whole tiles; mapped memory aligned to a tile.
    fn memory_requirements(&self, _target: ArrayRef<Self>, desc: &ArrayDesc, levels: u32) -> CudaResult<(u64, u64)> {
        if desc.flags & array_flags::DEFERRED_MAPPING == 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        let element = desc.element_size().ok_or(CudaError::INVALID_VALUE)?;
        let tile = sparse_tile(desc).unwrap_or([1, 1, 1]).map(u64::from);
        let three_d = desc.layers() == 0 && desc.depth > 0;
        let size = (0..levels.max(1)).try_fold(0u64, |total, level| {
            let level = desc.level(level);
            let rows = if desc.height == 0 { 1 } else { level.height.next_multiple_of(tile[1]) };
            let slices = if three_d { level.depth.next_multiple_of(tile[2]) } else { desc.layers().max(1) };
            let bytes = level.width.next_multiple_of(tile[0]).checked_mul(element)?.checked_mul(rows)?.checked_mul(slices)?;
            total.checked_add(bytes)
        });
        Ok((size.ok_or(CudaError::INVALID_VALUE)?.next_multiple_of(SPARSE_TILE_BYTES), SPARSE_TILE_BYTES))
    }

    /// Mapping memory into an array's tiles is the GPU's page tables' work, which this device
    /// cannot do.
    fn map_arrays(&self, _maps: &[ArrayMapWork<Self>], _stream: u64) -> CudaResult<()> {
        tracing::warn!("cuMemMapArrayAsync refused: the emulated device maps no memory into sparse or deferred-mapping arrays");
        Err(CudaError::NOT_SUPPORTED)
    }

    /// Decompression is a hardware engine's work: this device has none, as a GPU without one
    /// answers.
    fn batch_decompress(&self, _ops: &[DecompressOp], _stream: u64) -> Result<(), (CudaError, Option<u64>)> {
        // As a GPU without the engine answers (driver 580 on an H200): the index left alone.
        Err((CudaError::NOT_SUPPORTED, None))
    }

    fn object_destroy(&self, handle: u64, surface: bool) -> CudaResult<()> {
        let mut state = self.state();
        match state.objects.get(&handle) {
            Some(kind) if *kind == surface => {
                state.objects.remove(&handle);
                Ok(())
            }
            _ => Err(CudaError::INVALID_VALUE),
        }
    }
}

/// `cuMemAllocPitch`'s row alignment on current GPUs.
const PITCH_ALIGNMENT: u64 = 512;

/// One side of a shaped copy as rows: device memory (an array's block too) or host memory, its
/// first byte, pitch and rows per slice.
#[derive(Clone, Copy)]
enum Flat {
    Device(u64, u64, u64),
    Host(*mut u8, u64, u64),
}

/// `NOT_SUPPORTED` for an array without memory of its own (sparse, deferred mapping): nothing
/// can be mapped into it here, so no copy to or from it can mean anything.
fn flat(side: Side<EmulatedDevice>) -> CudaResult<Flat> {
    Ok(match side {
        Side::Device { ptr, pitch, height } => Flat::Device(ptr, pitch, height),
        Side::Array { array, .. } if array.unbacked => {
            tracing::warn!("a copy to or from a sparse or deferred-mapping array refused: the emulated device maps no memory into one");
            return Err(CudaError::NOT_SUPPORTED);
        }
        Side::Array { array, pos } => {
            Flat::Device(array.base + (pos.z * array.height + pos.y) * array.pitch + pos.x, array.pitch, array.height)
        }
        Side::Host { ptr, pitch, height } => Flat::Host(ptr, pitch, height),
    })
}

/// The extent (elements) of a 64 KiB sparse tile of `desc`'s elements: the shapes of NVIDIA's
/// sparse tiles (and the standard 64 KiB swizzle), for 2D and 2D layered arrays or for 3D ones;
/// `None` for an element size without one.
fn sparse_tile(desc: &ArrayDesc) -> Option<[u32; 3]> {
    let three_d = desc.layers() == 0 && desc.depth > 0;
    Some(match (three_d, desc.element_size()?) {
        (false, 1) => [256, 256, 1],
        (false, 2) => [256, 128, 1],
        (false, 4) => [128, 128, 1],
        (false, 8) => [128, 64, 1],
        (false, 16) => [64, 64, 1],
        (true, 1) => [64, 32, 32],
        (true, 2) => [32, 32, 32],
        (true, 4) => [32, 32, 16],
        (true, 8) => [32, 16, 16],
        (true, 16) => [16, 16, 16],
        _ => return None,
    })
}

/// Copies a box row by row (through a buffer: the sides may be one block).
///
/// # Safety
/// Host sides are mapped memory of this process covering the box.
unsafe fn copy_rows(blocks: &mut HashMap<u64, Block>, src: Flat, dst: Flat, extent: Extent) -> CudaResult<()> {
    let width = usize::try_from(extent.width).map_err(|_| CudaError::INVALID_VALUE)?;
    let mut row = vec![0u8; width];
    let offset = |pitch: u64, height: u64, y: u64, z: u64| (z * height + y) * pitch;
    for z in 0..extent.depth {
        for y in 0..extent.height {
            match src {
                Flat::Device(ptr, pitch, height) => {
                    row.copy_from_slice(block_slice(blocks, ptr + offset(pitch, height, y, z), extent.width)?)
                }
                // SAFETY: per this function's contract the row lies in mapped host memory.
                Flat::Host(ptr, pitch, height) => unsafe {
                    std::ptr::copy_nonoverlapping(ptr.add(offset(pitch, height, y, z) as usize), row.as_mut_ptr(), width)
                },
            }
            match dst {
                Flat::Device(ptr, pitch, height) => {
                    block_slice(blocks, ptr + offset(pitch, height, y, z), extent.width)?.copy_from_slice(&row)
                }
                // SAFETY: as above.
                Flat::Host(ptr, pitch, height) => unsafe {
                    std::ptr::copy_nonoverlapping(row.as_ptr(), ptr.add(offset(pitch, height, y, z) as usize), width)
                },
            }
        }
    }
    Ok(())
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

/// A node's work on this device: kernels need GPU code.
fn emulated_work(work: NodeWork<'_, EmulatedDevice>) -> CudaResult<Work> {
    Ok(match work {
        NodeWork::Empty => Work::Empty,
        NodeWork::Kernel { .. } => return Err(NO_GPU_CODE),
        NodeWork::Memcpy(copy) => Work::Memcpy(copy),
        NodeWork::Memset(set) => Work::Memset(set),
        NodeWork::Child(graph) => Work::Child(graph),
        NodeWork::EventRecord(event) => Work::EventRecord(event),
        NodeWork::EventWait(event) => Work::EventWait(event),
        NodeWork::Host(site) => Work::Host(site.clone()),
        NodeWork::BatchMemOp(ops) => Work::BatchMemOp(ops.to_vec()),
        // Added through `graph_add_node` only: they take no new parameters.
        NodeWork::MemAlloc { .. } | NodeWork::MemFree(_) | NodeWork::Conditional { .. } => return Err(CudaError::INVALID_VALUE),
    })
}

/// One memory operation on its word. Work here runs at submission: a wait passes when its
/// condition holds then; one that does not could only be satisfied by work submitted later, which
/// a device with no queue cannot order after it, so it fails with `CUDA_ERROR_NOT_SUPPORTED`
/// rather than pass.
fn apply_mem_op(op: &StreamMemOp, bytes: &mut [u8]) -> CudaResult<()> {
    if op.is_wait() {
        let mut word = [0u8; 8];
        word[..bytes.len()].copy_from_slice(bytes);
        if !op.wait_satisfied(u64::from_le_bytes(word)) {
            tracing::warn!(address = op.address, value = op.value, "a stream wait the emulated device can never satisfy");
            return Err(CudaError::NOT_SUPPORTED);
        }
    } else if op.kind == mem_op::WRITE_VALUE_32 || op.kind == mem_op::WRITE_VALUE_64 {
        bytes.copy_from_slice(&op.value.to_le_bytes()[..bytes.len()]);
    }
    Ok(())
}

/// A batch memory operation node's operations, on device memory (the session checked it).
fn run_node_mem_ops(blocks: &mut HashMap<u64, Block>, ops: &[StreamMemOp]) -> CudaResult<()> {
    for op in ops {
        if let Some(width) = op.width() {
            apply_mem_op(op, block_slice(blocks, op.address, width)?)?;
        }
    }
    Ok(())
}

/// A 3D copy, row by row (the session checked both sides' spans).
fn copy_3d(blocks: &mut HashMap<u64, Block>, copy: &Copy3d) -> CudaResult<()> {
    for z in 0..copy.depth {
        for y in 0..copy.height {
            let src = copy.src + z * copy.src_pitch * copy.src_height + y * copy.src_pitch;
            let dst = copy.dst + z * copy.dst_pitch * copy.dst_height + y * copy.dst_pitch;
            let row = block_slice(blocks, src, copy.width)?.to_vec();
            block_slice(blocks, dst, copy.width)?.copy_from_slice(&row);
        }
    }
    Ok(())
}

/// A 2D memset, row by row.
fn memset_2d(blocks: &mut HashMap<u64, Block>, set: &Memset2d) -> CudaResult<()> {
    let row_len = set.width * u64::from(set.element_size);
    for y in 0..set.height {
        fill_elements(block_slice(blocks, set.dst + y * set.pitch, row_len)?, set.value, set.element_size);
    }
    Ok(())
}
