//! Device backends: the CUDA driver (cudarc, loaded at run time) and the emulated host-memory
//! device for machines without a GPU. The session layer (`session.rs`) implements the op table
//! once, with validation, quotas and handle maps; a backend only provides these primitives.

/// A driver function looked up by name in `$lib` (NVIDIA's driver library, loaded at run time):
/// `required_symbol!` fails the load with the name, `optional_symbol!` gives `None` where this
/// driver lacks it. Only inside an `unsafe` block whose SAFETY comment gives each symbol its C
/// signature.
macro_rules! required_symbol {
    ($lib:expr, $name:literal) => {
        *$lib.get(concat!($name, "\0").as_bytes()).map_err(|error| format!("{}: {error}", $name))?
    };
}
macro_rules! optional_symbol {
    ($lib:expr, $name:literal) => {
        $lib.get(concat!($name, "\0").as_bytes()).ok().map(|symbol| *symbol)
    };
}

/// Calls `$name` of a generated [`flyt_cuda_sys::DriverTable`]: its status as a number, or
/// CUDA_ERROR_NOT_SUPPORTED's where the driver lacks it. Only inside an `unsafe` block whose SAFETY
/// comment says why the arguments meet the function's C contract.
macro_rules! driver_call {
    ($table:expr, $name:ident($($arg:expr),* $(,)?)) => {
        match $table.$name {
            Some(function) => function($($arg),*).0,
            None => flyt_cuda_sys::CUresult::CUDA_ERROR_NOT_SUPPORTED.0,
        }
    };
}

pub mod cuda;
mod cuda_arrays;
mod cuda_green;
mod cuda_restore;
pub mod emulated;
mod emulated_graphs;
mod emulated_green;
pub mod nvlinks;
mod vmm_malloc;

use std::sync::Arc;

use flyt_protocol::CudaError;
use flyt_protocol::device::DeviceInfo;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{
    ArrayDesc, Copy3d, DecompressOp, DevResource, Dim3, FuncAttributes, JitOption, LaunchAttribute, LinkOutcome, Memset2d, ParamInfo, Pos3,
    Resource, SparseProperties, StreamMemOp, Subresource, TensorMapParams, TextureDesc, ViewDesc,
};

use crate::host_calls::HostCallSite;

/// A launch's configuration, less its stream and arguments: as a launch and the cluster
/// occupancy queries give it to the driver (`CUlaunchConfig`).
#[derive(Clone, Copy, Debug)]
pub struct LaunchShape<'a> {
    pub grid: Dim3,
    pub block: Dim3,
    pub shared_mem: u32,
    pub attributes: &'a [LaunchAttribute],
}

/// What a graph node does, with the session's ids resolved to the backend's handles.
pub enum NodeWork<'a, D: Device + ?Sized> {
    Empty,
    Kernel {
        function: D::Function,
        grid: Dim3,
        block: Dim3,
        shared_mem: u32,
        args: &'a mut [u8],
    },
    /// Between device ranges the session checked.
    Memcpy(Copy3d),
    /// Over a device range the session checked.
    Memset(Memset2d),
    Child(D::Graph),
    EventRecord(D::Event),
    EventWait(D::Event),
    /// The session keeps the site alive as long as any graph or executable graph may run it.
    Host(&'a Arc<HostCallSite>),
    /// `size` bytes of the device's graph memory; `access`: the flags of an access descriptor
    /// for the device itself, if the app gave one.
    MemAlloc {
        size: u64,
        access: Option<u32>,
    },
    /// A graph allocation the session checked.
    MemFree(u64),
    /// A conditional node on the driver's `handle` with `size` body graphs.
    Conditional {
        handle: u64,
        kind: u32,
        size: u32,
    },
    /// Memory operations whose addresses the session checked (as `stream_mem_ops`'s), in order.
    BatchMemOp(&'a [StreamMemOp]),
}

/// A node the backend added, with what the driver made along with it.
pub struct AddedNode<D: Device + ?Sized> {
    pub node: D::GraphNode,
    /// A memory allocation node's address (0 for other nodes).
    pub ptr: u64,
    /// A conditional node's body graphs, owned by the node.
    pub bodies: Vec<D::Graph>,
}

/// A node's parameters as the backend reads them back (`GraphNodeGetParams`).
pub enum NodeRead {
    Memcpy(flyt_protocol::ops::NodeCopy),
    Memset(Memset2d),
    /// A host node's user data: the address of the `HostCallSite` it runs (the session finds
    /// the site among its own).
    Host(usize),
    BatchMemOp(Vec<StreamMemOp>),
}

/// A kernel node's launch as the driver holds it, its arguments packed by the kernel's layout.
pub struct KernelRead<D: Device + ?Sized> {
    pub function: D::Function,
    pub grid: Dim3,
    pub block: Dim3,
    pub shared_mem: u32,
    pub args: Vec<u8>,
}

/// `CUgraphEdgeData`'s port and type fields.
pub type EdgeData = [u8; 3];

/// One side of a shaped copy (`cuMemcpy3D`), checked by the session.
pub enum Side<D: Device + ?Sized> {
    /// Device memory whose first copied byte is at `ptr`; rows `pitch` apart, slices
    /// `pitch * height`.
    Device { ptr: u64, pitch: u64, height: u64 },
    /// An array, from `pos` (`x` in bytes).
    Array { array: D::Array, pos: Pos3 },
    /// Host memory of this process (pinned staging or registered segment memory) whose first
    /// copied byte is at `ptr`.
    Host { ptr: *mut u8, pitch: u64, height: u64 },
}

/// A shaped copy's box: `width` bytes x `height` rows x `depth` slices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub width: u64,
    pub height: u64,
    pub depth: u64,
}

/// What a texture object reads, with the session's array ids resolved.
pub enum TexResource<D: Device + ?Sized> {
    Array(D::Array),
    Mipmapped(D::Mipmap),
    /// Device memory (`Resource::Linear` or `Resource::Pitch2d`) the session checked.
    Memory(Resource),
}

/// An array or a mipmapped array, as the sparse queries and `cuMemMapArrayAsync` name them.
pub enum ArrayRef<D: Device + ?Sized> {
    Array(D::Array),
    Mipmap(D::Mipmap),
}

impl<D: Device + ?Sized> Clone for ArrayRef<D> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<D: Device + ?Sized> Copy for ArrayRef<D> {}

/// One map or unmap of `cuMemMapArrayAsync`, checked by the session: the subresource lies in the
/// array, the memory in the tile pool.
pub struct ArrayMapWork<D: Device + ?Sized> {
    pub target: ArrayRef<D>,
    pub subresource: Subresource,
    /// The tile pool and the offset in it; `None` unmaps.
    pub memory: Option<(D::MemHandle, u64)>,
}

/// A stream's capture, as `cuStreamGetCaptureInfo_v3` tells it.
pub struct Capture<D: Device + ?Sized> {
    pub status: u32,
    pub id: u64,
    pub graph: Option<D::Graph>,
    pub dependencies: Vec<D::GraphNode>,
    /// The edge data of each dependency, or none where the driver gave none (a NULL array).
    pub data: Vec<EdgeData>,
}

/// Where `cuStreamBeginCaptureToGraph` records: an existing graph, the first captured work
/// following `dependencies` (nodes of it), each with `data[i]` if given (plain full
/// dependencies if not).
pub struct CaptureInto<'a, D: Device + ?Sized> {
    pub graph: D::Graph,
    pub dependencies: &'a [D::GraphNode],
    pub data: Option<&'a [EdgeData]>,
}

/// What `cuGraphExecUpdate` came to: a `CUgraphExecUpdateResult` and the node it names.
pub struct ExecUpdate<D: Device + ?Sized> {
    pub result: CudaResult<()>,
    pub status: u32,
    pub error_node: Option<D::GraphNode>,
}

/// Which backend serves the sessions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// The CUDA driver API on a real GPU.
    Cuda,
    /// Host memory only; kernels cannot run.
    Emulated,
    /// CUDA when a driver and a GPU are present, else emulated.
    Auto,
}

/// What a device backend does for a session. Every method is called from the session's reader
/// thread except the waits (queries polled until done, then `event_synchronize`/`synchronize`),
/// which run on waiter threads that called `bind_thread` first.
/// A paused session's device memory, exported for a worker on the same GPU that restores it.
#[derive(Debug, Default)]
pub struct MovedMemory {
    /// Driver allocations (`cuMemAlloc`): address, length and CUDA IPC handle.
    pub ipc: Vec<(u64, u64, [u8; 64])>,
    /// Physical memory shared by descriptor: spans of a session restored before, and copies of
    /// allocations the driver shares by no IPC handle (a pool's).
    pub spans: Vec<MovedSpan>,
}

/// Physical memory of a paused session handed over by descriptor (`cuMemExportToShareableHandle`).
#[derive(Debug)]
pub struct MovedSpan {
    /// Where its bytes go: the app's address.
    pub start: u64,
    /// Its size (whole pages).
    pub len: u64,
    /// How many of its bytes are the app's.
    pub copy_len: u64,
    pub fd: std::os::fd::OwnedFd,
}

pub trait Device: Send + Sync + 'static {
    type Stream: Copy + Send + Sync + 'static;
    type Event: Copy + PartialEq + Send + Sync + 'static;
    type Module: Send + 'static;
    /// A JIT link in progress (`cuLink*`).
    type Link: Send + 'static;
    type Function: Copy + Eq + std::hash::Hash + Send + Sync + 'static;
    /// A host buffer the device copies from or into asynchronously (pinned memory on CUDA).
    type Staging: Send + 'static;
    /// A device-to-host copy in flight.
    type PendingCopy: Send + Sync + 'static;
    type Graph: Copy + Eq + std::hash::Hash + Send + Sync + 'static;
    type GraphNode: Copy + Eq + std::hash::Hash + Send + Sync + 'static;
    type GraphExec: Copy + Send + Sync + 'static;
    /// A physical allocation of virtual memory management (`CUmemGenericAllocationHandle`).
    type MemHandle: Copy + Send + Sync + 'static;
    /// A memory pool (`CUmemoryPool`).
    type MemPool: Copy + Send + Sync + 'static;
    /// A CUDA array (`CUarray`), alone or a level of a mipmapped array.
    type Array: Copy + Send + Sync + 'static;
    /// A mipmapped array (`CUmipmappedArray`).
    type Mipmap: Copy + Send + Sync + 'static;
    /// A device resource as the driver described it (`CUdevResource`, the driver's own bytes).
    type Resource: Clone + Eq + std::hash::Hash + Send + 'static;
    /// A resource descriptor (`CUdevResourceDesc`).
    type ResourceDesc: Copy + Send + 'static;
    /// A green context (`CUgreenCtx`) and what it stands for in the driver.
    type GreenCtx: Copy + Send + 'static;

    /// The device as the hardware reports it (the session applies its slice on top).
    fn info(&self) -> DeviceInfo;
    fn driver_version(&self) -> i32;
    fn emulated(&self) -> bool;
    /// Makes the device current on the calling thread.
    fn bind_thread(&self) -> CudaResult<()>;

    /// The session's GPUs: how many (a backend serves one unless it says otherwise).
    fn device_count(&self) -> usize {
        1
    }
    /// The index of the current one, on which every call below acts.
    fn current_device(&self) -> usize {
        0
    }
    /// Makes device `index` current (on the calling thread: the session's).
    fn select_device(&self, index: usize) -> CudaResult<()> {
        if index == 0 { Ok(()) } else { Err(CudaError::INVALID_DEVICE) }
    }
    /// Every device, as `info` reports the current one.
    fn infos(&self) -> Vec<DeviceInfo> {
        vec![self.info()]
    }
    /// The driver's answers for each ordered pair of devices.
    fn peer_links(&self) -> Vec<flyt_protocol::device::PeerLink> {
        Vec::new()
    }
    /// Each device's NVLinks, by link index (`SessionInfo::nvlinks`); none known by default.
    fn nvlinks(&self) -> Vec<Vec<flyt_protocol::device::NvLinkEnd>> {
        Vec::new()
    }
    /// The device (index) whose context `stream` belongs to.
    fn stream_device(&self, _stream: Self::Stream) -> usize {
        self.current_device()
    }
    /// An event made in device `device`'s context (`event_create` makes it in the current one).
    fn event_create_on(&self, _device: usize, flags: u32) -> CudaResult<Self::Event> {
        self.event_create(flags)
    }
    /// Lets kernels of the current device use device `peer`'s memory (`enable`), or no longer.
    fn peer_access(&self, _peer: usize, _enable: bool, _flags: u32) -> CudaResult<()> {
        Err(CudaError::INVALID_DEVICE)
    }

    fn null_stream(&self) -> Self::Stream;

    fn malloc(&self, size: u64) -> CudaResult<u64>;
    fn free(&self, ptr: u64) -> CudaResult<()>;
    /// Staging for a graph's copy with the app's host memory: `len` bytes of this process's
    /// memory that copy nodes name by the returned address (as device memory), and its host
    /// pointer, valid until `graph_staging_free`.
    fn graph_staging_alloc(&self, len: u64) -> CudaResult<(u64, *mut u8)>;
    /// Frees staging `graph_staging_alloc` gave, once no graph that names it can run.
    fn graph_staging_free(&self, address: u64) -> CudaResult<()>;
    /// Frees graph memory outside its graph (`cudaFree` after a launch): what the launch
    /// allocated goes back; the address stays the graph's, for its next launch.
    fn free_graph_memory(&self, ptr: u64) -> CudaResult<()> {
        self.free(ptr)
    }
    /// Frees graph memory in stream order: a free node when `stream` captures, else what a
    /// launch allocated, once the stream reaches the free.
    fn free_graph_memory_async(&self, ptr: u64, stream: Self::Stream) -> CudaResult<()> {
        self.free_async(ptr, stream)
    }
    /// Allocates a moved session's allocations (start, length) at those very addresses, so the
    /// pointers its app holds stay valid, and reserves its own address reservations
    /// (`cuMemAddressReserve`) there too, for its mappings to be made again; `Err` says why not.
    /// `free` and `mem_address_free` free them like any other.
    fn restore_allocations(&self, allocations: &[(u64, u64)], reservations: &[(u64, u64)]) -> Result<(), String>;
    /// Paging (`docs/design/paging.md`): releases the device memory of `allocations` (start,
    /// length; their bytes already saved, the device synchronized) while their addresses stay
    /// this session's, held so nothing else lands there until `page_in`. `Err` says why, and
    /// whether part of the memory was released nonetheless (the caller then treats all of it as
    /// out: its bytes are saved).
    fn page_out(&self, _allocations: &[(u64, u64)]) -> Result<(), (String, bool)> {
        Err(("this device cannot page memory out".into(), false))
    }
    /// `allocations` (paged out together) in groups that `page_in` may map one after the
    /// other, each group's copies under way while the next is mapped: groups share no physical
    /// memory (on CUDA, allocations sharing a span are in one group).
    fn page_groups(&self, allocations: &[(u64, u64)]) -> Vec<Vec<(u64, u64)>> {
        vec![allocations.to_vec()]
    }
    /// Makes device memory again under `allocations` paged out by `page_out`, at the same
    /// addresses (its bytes are then copied back by the caller).
    fn page_in(&self, _allocations: &[(u64, u64)]) -> Result<(), String> {
        Err("this device cannot page memory in".into())
    }
    /// Exports the memory of `allocations` for another worker on this GPU (a move on one node).
    fn export_for_move(&self, allocations: &[(u64, u64)]) -> CudaResult<MovedMemory>;
    /// Copies another worker's exported memory into this worker's restored allocations at the
    /// same addresses, GPU to GPU.
    fn import_for_move(&self, moved: MovedMemory) -> Result<(), String>;
    fn mem_get_info(&self) -> CudaResult<(u64, u64)>;

    /// A staging buffer of `len` bytes (at most the copy chunk); may wait for one to free up.
    fn staging(&self, len: usize) -> CudaResult<Self::Staging>;
    fn staging_bytes(staging: &mut Self::Staging) -> &mut [u8];
    /// Keeps only the first `len` bytes of a staging buffer (a chunk shorter than the buffer
    /// taken for it), so a copy from it moves only those.
    fn shorten_staging(staging: &mut Self::Staging, len: usize);
    /// Queues a copy from a filled staging buffer; the buffer is reused once the copy is done.
    fn copy_htod(&self, dst: u64, src: Self::Staging, stream: Self::Stream) -> CudaResult<()>;
    /// Queues a copy into a staging buffer.
    fn start_dtoh(&self, src: u64, dst: Self::Staging, stream: Self::Stream) -> CudaResult<Self::PendingCopy>;
    /// `true` once a device-to-host copy has finished or failed; never blocks.
    fn dtoh_done(&self, pending: &Self::PendingCopy) -> bool;
    /// The bytes of a finished copy, or why it failed (call once `dtoh_done`).
    fn dtoh_bytes<'a>(&self, pending: &'a Self::PendingCopy) -> CudaResult<&'a [u8]>;
    fn copy_dtod(&self, dst: u64, src: u64, len: u64, stream: Self::Stream) -> CudaResult<()>;

    /// Pins host memory for DMA (the shared-memory segment's blocks); `mapped`: also maps it
    /// into the device's address space, for kernels to use.
    ///
    /// # Safety
    /// `[ptr, ptr + len)` is mapped in this process and stays mapped until `host_unregister`.
    unsafe fn host_register(&self, ptr: *mut u8, len: usize, mapped: bool) -> CudaResult<()>;
    /// The device address of host memory registered `mapped`.
    fn host_device_pointer(&self, ptr: *mut u8) -> CudaResult<u64>;
    /// # Safety
    /// `ptr` was registered with `host_register`.
    unsafe fn host_unregister(&self, ptr: *mut u8) -> CudaResult<()>;
    /// Queues a copy from registered host memory.
    ///
    /// # Safety
    /// `[src, src + len)` lies in registered host memory that stays mapped while the copy runs.
    unsafe fn copy_from_host(&self, dst: u64, src: *const u8, len: usize, stream: Self::Stream) -> CudaResult<()>;
    /// Queues a copy into registered host memory.
    ///
    /// # Safety
    /// `[dst, dst + len)` lies in registered host memory that stays mapped while the copy runs.
    unsafe fn copy_to_host(&self, dst: *mut u8, src: u64, len: usize, stream: Self::Stream) -> CudaResult<()>;
    /// Fills `len` bytes at `dst` with elements `width` bytes wide (1, 2 or 4; `dst` and `len`
    /// are multiples of it), each the low `width` bytes of `pattern`.
    fn memset(&self, dst: u64, pattern: u32, width: u8, len: u64, stream: Self::Stream) -> CudaResult<()>;
    /// [`Device::memset`] on host memory registered `mapped` (its device address is its host
    /// address).
    ///
    /// # Safety
    /// `[dst, dst + len)` lies in host memory of this process registered `mapped`, which stays
    /// mapped until the memset is done.
    unsafe fn memset_mapped_host(&self, dst: u64, pattern: u32, width: u8, len: u64, stream: Self::Stream) -> CudaResult<()>;

    fn load_module(&self, image: &[u8]) -> CudaResult<Self::Module>;
    /// A kernel and its parameter layout, from the driver.
    fn function(&self, module: &Self::Module, name: &str) -> CudaResult<(Self::Function, Vec<ParamInfo>)>;
    /// The names of a module's kernels, in the driver's order.
    fn function_names(&self, module: &Self::Module) -> CudaResult<Vec<String>>;
    /// A module variable's device address, size, and whether it is managed (`__managed__`).
    fn variable(&self, module: &Self::Module, name: &str) -> CudaResult<(u64, u64, bool)>;
    fn unload_module(&self, module: Self::Module) -> CudaResult<()>;
    /// `cuLinkCreate` with the forwarded JIT options (the caller checked them) and log buffers of
    /// the given sizes.
    fn link_create(&self, options: &[JitOption], info_log: usize, error_log: usize) -> CudaResult<Self::Link>;
    /// `cuLinkAddData`: `kind` is a `CUjitInputType`, not yet checked.
    fn link_add(&self, link: &mut Self::Link, kind: u32, name: &str, data: Vec<u8>, options: &[JitOption]) -> LinkOutcome;
    /// `cuLinkComplete`: the outcome, and the cubin when it succeeded.
    fn link_complete(&self, link: &mut Self::Link) -> (LinkOutcome, Vec<u8>);
    /// Launches on `stream` with arguments packed by the kernel's parameter layout.
    fn launch(&self, function: Self::Function, shape: LaunchShape<'_>, stream: Self::Stream, args: &mut [u8]) -> CudaResult<()>;
    /// `cuDeviceGetTexture1DLinearMaxWidth` (`format`: a `CUarray_format`).
    fn texture_1d_linear_max_width(&self, format: u32, channels: u32) -> CudaResult<u64>;
    /// `cuDeviceGetHostAtomicCapabilities` of `operations` (`CUatomicOperation`s), or with `peer`
    /// `cuDeviceGetP2PAtomicCapabilities` of the device with itself.
    fn atomic_capabilities(&self, operations: &[u32], peer: bool) -> CudaResult<Vec<u32>>;
    /// `cuOccupancyAvailableDynamicSMemPerBlock`.
    fn available_dynamic_smem(&self, function: Self::Function, num_blocks: i32, block_size: i32) -> CudaResult<u64>;
    /// `cuOccupancyMaxActiveClusters` for a launch configuration.
    fn occupancy_max_active_clusters(&self, function: Self::Function, shape: LaunchShape<'_>) -> CudaResult<i32>;
    fn func_attributes(&self, function: Self::Function) -> CudaResult<FuncAttributes>;
    fn func_set_attribute(&self, function: Self::Function, attribute: u32, value: i32) -> CudaResult<()>;
    fn occupancy(&self, function: Self::Function, block_size: i32, dynamic_shared_mem: u64, flags: u32) -> CudaResult<i32>;

    fn stream_create(&self, flags: u32, priority: i32) -> CudaResult<Self::Stream>;
    /// `(least, greatest)` stream priority.
    fn stream_priority_range(&self) -> CudaResult<(i32, i32)>;
    fn stream_destroy(&self, stream: Self::Stream) -> CudaResult<()>;
    /// `Err(NOT_READY)` while work is pending.
    fn stream_query(&self, stream: Self::Stream) -> CudaResult<()>;
    fn stream_wait_event(&self, stream: Self::Stream, event: Self::Event, flags: u32) -> CudaResult<()>;

    fn event_create(&self, flags: u32) -> CudaResult<Self::Event>;
    fn event_record(&self, event: Self::Event, stream: Self::Stream, flags: u32) -> CudaResult<()>;
    fn event_query(&self, event: Self::Event) -> CudaResult<()>;
    fn event_synchronize(&self, event: Self::Event) -> CudaResult<()>;
    fn event_elapsed(&self, start: Self::Event, end: Self::Event) -> CudaResult<f32>;
    fn event_destroy(&self, event: Self::Event) -> CudaResult<()>;

    fn synchronize(&self) -> CudaResult<()>;
    /// Resets the device's context (`cuDevicePrimaryCtxReset`), once the session's work is done
    /// and it drops every handle it held: everything made on the device goes (memory, streams,
    /// events, modules, pinned host memory) and limits return to their defaults. The backend makes
    /// its own buffers again and binds the calling thread to the new context; other threads call
    /// `bind_thread` again before their next use.
    fn reset(&self) -> CudaResult<()>;
    /// A kernel's cache preference (`CUfunc_cache` numbering, checked).
    fn func_set_cache_config(&self, function: Self::Function, config: u32) -> CudaResult<()>;
    /// The context's cache preference.
    fn set_cache_config(&self, config: u32) -> CudaResult<()>;
    fn cache_config(&self) -> CudaResult<u32>;
    /// Starts (`true`) or stops a profiler attached to this process.
    fn profiler(&self, start: bool) -> CudaResult<()>;
    fn reset_persisting_l2_cache(&self) -> CudaResult<()>;
    fn set_limit(&self, limit: u32, value: u64) -> CudaResult<()>;
    fn get_limit(&self, limit: u32) -> CudaResult<u64>;

    // --- stream capture and graphs ---
    /// `cuStreamBeginCapture` in `mode` (`CUstreamCaptureMode`); `into`: an existing graph and
    /// the nodes of it the first captured work follows (`cuStreamBeginCaptureToGraph`).
    fn capture_begin(&self, stream: Self::Stream, mode: u32, into: Option<CaptureInto<'_, Self>>) -> CudaResult<()>;
    /// `cuStreamUpdateCaptureDependencies_v2`: replace (`set`) or add to the capture's
    /// dependencies, with `data` for each if given (plain full dependencies if not).
    fn capture_dependencies(&self, stream: Self::Stream, nodes: &[Self::GraphNode], data: Option<&[EdgeData]>, set: bool)
    -> CudaResult<()>;
    fn capture_end(&self, stream: Self::Stream) -> CudaResult<Self::Graph>;
    fn capture_info(&self, stream: Self::Stream) -> CudaResult<Capture<Self>>;
    /// Whether work queued on `stream` now would be captured rather than run (or may not be
    /// queued at all while another stream captures): host-memory copies are refused then, as the
    /// staging memory they would record is reused.
    fn capturing(&self, stream: Self::Stream) -> bool;
    /// `cuThreadExchangeStreamCaptureMode` on the session's thread; the previous mode.
    fn exchange_capture_mode(&self, mode: u32) -> CudaResult<u32>;
    fn graph_create(&self) -> CudaResult<Self::Graph>;
    fn graph_destroy(&self, graph: Self::Graph) -> CudaResult<()>;
    fn graph_add_node(&self, graph: Self::Graph, dependencies: &[Self::GraphNode], work: NodeWork<'_, Self>)
    -> CudaResult<AddedNode<Self>>;
    /// `cuGraphConditionalHandleCreate` in the device's context.
    fn graph_conditional_handle(&self, graph: Self::Graph, default_value: u32, flags: u32) -> CudaResult<u64>;
    /// A node's dependencies (or, with `dependents`, the nodes that depend on it), with edge data.
    fn graph_node_links(&self, node: Self::GraphNode, dependents: bool) -> CudaResult<Vec<(Self::GraphNode, EdgeData)>>;
    /// Every edge of a graph: from, to, edge data.
    #[expect(clippy::type_complexity, reason = "an edge is its two nodes and its data")]
    fn graph_all_edges(&self, graph: Self::Graph) -> CudaResult<Vec<(Self::GraphNode, Self::GraphNode, EdgeData)>>;
    /// `cuGraphNodeGetEnabled`, after `cuGraphNodeSetEnabled` when `set` is given.
    fn graph_node_enabled(&self, exec: Self::GraphExec, node: Self::GraphNode, set: Option<bool>) -> CudaResult<bool>;
    /// A node's `CUgraphNodeType`.
    fn graph_node_kind(&self, node: Self::GraphNode) -> CudaResult<u32>;
    /// The event an event record or wait node names.
    fn graph_node_event(&self, node: Self::GraphNode) -> CudaResult<Self::Event>;
    /// `cuDeviceGetGraphMemAttribute` (after `cuDeviceSetGraphMemAttribute` when `set` is given).
    fn graph_mem_attribute(&self, attribute: u32, set: Option<u64>) -> CudaResult<u64>;
    /// `cuDeviceGraphMemTrim`.
    fn graph_mem_trim(&self) -> CudaResult<()>;
    /// A copy, memset or host node's parameters as the driver holds them; arrays are not read
    /// back (`NOT_SUPPORTED`), other node types are `INVALID_VALUE`.
    fn graph_node_read(&self, node: Self::GraphNode) -> CudaResult<NodeRead>;
    /// A kernel node's launch, its arguments packed as `layout` (the session's parameter layout
    /// of the node's kernel; `None`: not a kernel of the session's) says.
    fn graph_kernel_node_read(
        &self,
        node: Self::GraphNode,
        layout: &dyn Fn(Self::Function) -> Option<Vec<ParamInfo>>,
    ) -> CudaResult<KernelRead<Self>>;
    /// `cuGraphKernelNodeGetAttribute`, after `cuGraphKernelNodeSetAttribute` with `set` (a
    /// value the session checked) if given.
    fn graph_kernel_node_attribute(&self, node: Self::GraphNode, attribute: u32, set: Option<&[u8; 64]>) -> CudaResult<[u8; 64]>;
    /// `cuGraphKernelNodeCopyAttributes`.
    fn graph_kernel_node_copy_attributes(&self, dst: Self::GraphNode, src: Self::GraphNode) -> CudaResult<()>;
    /// A node's new parameters, in its graph (`exec` `None`) or in an executable graph.
    fn graph_node_set(&self, exec: Option<Self::GraphExec>, node: Self::GraphNode, work: NodeWork<'_, Self>) -> CudaResult<()>;
    fn graph_destroy_node(&self, node: Self::GraphNode) -> CudaResult<()>;
    /// Adds (or removes) the edges `from[i] -> to[i]`, with `data` for each if given (plain full
    /// dependencies if not).
    fn graph_edges(
        &self,
        graph: Self::Graph,
        from: &[Self::GraphNode],
        to: &[Self::GraphNode],
        data: Option<&[EdgeData]>,
        remove: bool,
    ) -> CudaResult<()>;
    /// The graph's nodes (or its root nodes) with their `CUgraphNodeType`s.
    fn graph_nodes(&self, graph: Self::Graph, roots: bool) -> CudaResult<Vec<(Self::GraphNode, u32)>>;
    /// The graph a child-graph node holds.
    fn graph_child(&self, node: Self::GraphNode) -> CudaResult<Self::Graph>;
    fn graph_clone(&self, graph: Self::Graph) -> CudaResult<Self::Graph>;
    fn graph_node_in_clone(&self, node: Self::GraphNode, clone: Self::Graph) -> CudaResult<Self::GraphNode>;
    fn graph_instantiate(&self, graph: Self::Graph, flags: u64) -> CudaResult<Self::GraphExec>;
    fn graph_launch(&self, exec: Self::GraphExec, stream: Self::Stream) -> CudaResult<()>;
    fn graph_upload(&self, exec: Self::GraphExec, stream: Self::Stream) -> CudaResult<()>;
    fn graph_exec_destroy(&self, exec: Self::GraphExec) -> CudaResult<()>;
    fn graph_exec_update(&self, exec: Self::GraphExec, graph: Self::Graph) -> ExecUpdate<Self>;
    /// `cuGraphDebugDotPrint`'s text.
    fn graph_dot(&self, graph: Self::Graph, flags: u32) -> CudaResult<String>;
    /// Runs `site` when `stream` reaches this point, holding the stream until it returns.
    /// `kept`: the session keeps the site alive (the stream is capturing, so it may run many
    /// times); otherwise it runs once and the backend holds it till then.
    fn launch_host_call(&self, stream: Self::Stream, site: &Arc<HostCallSite>, kept: bool) -> CudaResult<()>;

    // --- virtual memory management (the session checks every range against its reservations
    // and mappings first) ---
    /// With `host`: of pinned memory on the GPU host's NUMA node nearest the device.
    fn mem_granularity(&self, recommended: bool, host: bool) -> CudaResult<u64>;
    fn mem_address_reserve(&self, size: u64, alignment: u64, addr: u64) -> CudaResult<u64>;
    fn mem_address_free(&self, ptr: u64, size: u64) -> CudaResult<()>;
    /// Pinned memory on the session's device; `handle_types`: `CUmemAllocationHandleType` bits;
    /// `usage`: `CU_MEM_CREATE_USAGE_*` bits the session checked.
    fn mem_create(&self, size: u64, handle_types: u32, usage: u32) -> CudaResult<Self::MemHandle>;
    fn mem_release(&self, handle: Self::MemHandle) -> CudaResult<()>;
    fn mem_map(&self, ptr: u64, size: u64, offset: u64, handle: Self::MemHandle) -> CudaResult<()>;
    fn mem_unmap(&self, ptr: u64, size: u64) -> CudaResult<()>;
    /// `CUmemAccess_flags` for the session's device.
    fn mem_set_access(&self, ptr: u64, size: u64, flags: u32) -> CudaResult<()>;
    /// `cuMemExportToShareableHandle` as a POSIX file descriptor (the handle was made with that
    /// type).
    fn mem_export(&self, handle: Self::MemHandle) -> CudaResult<std::os::fd::OwnedFd>;
    /// `cuMemImportFromShareableHandle` of a descriptor another worker's `mem_export` made, for
    /// an allocation of `size` bytes.
    fn mem_import(&self, fd: std::os::fd::BorrowedFd<'_>, size: u64) -> CudaResult<Self::MemHandle>;

    // --- stream-ordered allocation ---
    /// The current device's default pool.
    fn default_pool(&self) -> CudaResult<Self::MemPool>;
    /// Device `device`'s default pool (each device has its own, as with the driver).
    fn default_pool_of(&self, device: usize) -> CudaResult<Self::MemPool>;
    /// A pool of pinned memory on the session's device, shareable through `handle_types` (none,
    /// or a POSIX file descriptor).
    fn pool_create(&self, handle_types: u32) -> CudaResult<Self::MemPool>;
    fn pool_destroy(&self, pool: Self::MemPool) -> CudaResult<()>;
    /// Makes `pool` the device's current pool (what `cuMemAllocAsync` takes from).
    fn set_current_pool(&self, pool: Self::MemPool) -> CudaResult<()>;
    fn alloc_async(&self, size: u64, pool: Self::MemPool, stream: Self::Stream) -> CudaResult<u64>;
    fn free_async(&self, ptr: u64, stream: Self::Stream) -> CudaResult<()>;
    /// Reads a `CUmemPool_attribute`, after setting it to `set` if given.
    fn pool_attribute(&self, pool: Self::MemPool, attribute: u32, set: Option<u64>) -> CudaResult<u64>;
    fn pool_trim(&self, pool: Self::MemPool, keep: u64) -> CudaResult<()>;
    /// `cuMemPoolExportToShareableHandle` as a POSIX file descriptor (the pool was made with that
    /// type).
    fn pool_export(&self, pool: Self::MemPool) -> CudaResult<std::os::fd::OwnedFd>;
    /// `cuMemPoolImportFromShareableHandle` of a descriptor another worker's `pool_export` made:
    /// a pool to import allocations from, which makes none.
    fn pool_import(&self, fd: std::os::fd::BorrowedFd<'_>) -> CudaResult<Self::MemPool>;
    /// `cuMemPoolExportPointer` of a live allocation of a pool made with a shareable handle type.
    fn pool_export_pointer(&self, ptr: u64) -> CudaResult<[u8; 64]>;
    /// `cuMemPoolImportPointer` from an imported pool of what another worker's
    /// `pool_export_pointer` of an allocation of `size` bytes of that pool made: its address
    /// here, freed with `free` or `free_async`.
    fn pool_import_pointer(&self, pool: Self::MemPool, data: &[u8; 64], size: u64) -> CudaResult<u64>;

    // --- pitched memory, shaped copies, arrays, textures and surfaces (the session checks every
    // range, array bound and handle first) ---
    /// `cuMemAllocPitch`: the allocation and its pitch.
    fn malloc_pitch(&self, width: u64, height: u64, element_size: u32) -> CudaResult<(u64, u64)>;
    fn memset_2d(&self, set: &Memset2d, stream: Self::Stream) -> CudaResult<()>;
    /// Queues a shaped copy.
    ///
    /// # Safety
    /// Host sides lie in pinned host memory of this process that stays mapped while the copy
    /// runs.
    unsafe fn copy_shaped(&self, src: Side<Self>, dst: Side<Self>, extent: Extent, stream: Self::Stream) -> CudaResult<()>;
    /// Queues a shaped copy from a filled staging buffer holding the box's rows packed.
    fn copy_staged_to_shaped(&self, dst: Side<Self>, extent: Extent, src: Self::Staging, stream: Self::Stream) -> CudaResult<()>;
    /// Queues a shaped copy into a staging buffer, rows packed (finished like `start_dtoh`).
    fn start_shaped_to_staged(
        &self,
        src: Side<Self>,
        extent: Extent,
        dst: Self::Staging,
        stream: Self::Stream,
    ) -> CudaResult<Self::PendingCopy>;
    /// `cuArray3DCreate` of a descriptor the session checked.
    fn array_create(&self, desc: &flyt_protocol::ops::ArrayDesc) -> CudaResult<Self::Array>;
    fn array_destroy(&self, array: Self::Array) -> CudaResult<()>;
    fn mipmap_create(&self, desc: &flyt_protocol::ops::ArrayDesc, levels: u32) -> CudaResult<Self::Mipmap>;
    /// A level of a mipmapped array: it belongs to the mipmapped array and goes with it.
    fn mipmap_level(&self, mipmap: Self::Mipmap, level: u32) -> CudaResult<Self::Array>;
    fn mipmap_destroy(&self, mipmap: Self::Mipmap) -> CudaResult<()>;
    fn tex_create(&self, resource: TexResource<Self>, texture: &TextureDesc, view: Option<&ViewDesc>) -> CudaResult<u64>;
    fn surf_create(&self, array: Self::Array) -> CudaResult<u64>;
    fn object_destroy(&self, handle: u64, surface: bool) -> CudaResult<()>;
    /// `cuArrayGetPlane`: plane `plane` of a planar array of descriptor `desc`, and the plane's
    /// descriptor (the driver's). The plane belongs to the array and goes with it.
    fn array_plane(&self, array: Self::Array, desc: &ArrayDesc, plane: u32) -> CudaResult<(Self::Array, ArrayDesc)>;
    /// `cuArrayGetSparseProperties`/`cuMipmappedArrayGetSparseProperties` of a sparse array or
    /// mipmapped array of descriptor `desc` (its level 0) with `levels` levels (1: an array).
    fn sparse_properties(&self, target: ArrayRef<Self>, desc: &ArrayDesc, levels: u32) -> CudaResult<SparseProperties>;
    /// `cuArrayGetMemoryRequirements`/`cuMipmappedArrayGetMemoryRequirements` of a
    /// deferred-mapping array or mipmapped array (as for `sparse_properties`) on the session's
    /// device: size and alignment.
    fn memory_requirements(&self, target: ArrayRef<Self>, desc: &ArrayDesc, levels: u32) -> CudaResult<(u64, u64)>;
    /// `cuMemMapArrayAsync` on `stream`, for the session's device.
    fn map_arrays(&self, maps: &[ArrayMapWork<Self>], stream: Self::Stream) -> CudaResult<()>;
    /// `cuMemBatchDecompressAsync` on `stream` of buffers the session checked; an error comes
    /// with the index of the operation it is about (`u64::MAX`: the batch as a whole), as the
    /// driver answers.
    fn batch_decompress(&self, ops: &[DecompressOp], stream: Self::Stream) -> Result<(), (CudaError, Option<u64>)>;
    /// `cuStreamGetAttribute` after `cuStreamSetAttribute` with `set`, if given (an attribute
    /// and value the session checked).
    fn stream_attribute(&self, stream: Self::Stream, attribute: u32, set: Option<&[u8; 64]>) -> CudaResult<[u8; 64]>;

    // --- CUDA IPC: the session checks pointers and events first ---
    fn ipc_mem_handle(&self, ptr: u64) -> CudaResult<[u8; 64]>;
    /// Maps memory another process exported: its address and size.
    fn ipc_open_mem(&self, handle: &[u8; 64], flags: u32) -> CudaResult<(u64, u64)>;
    fn ipc_close_mem(&self, ptr: u64) -> CudaResult<()>;
    fn ipc_event_handle(&self, event: Self::Event) -> CudaResult<[u8; 64]>;
    fn ipc_open_event(&self, handle: &[u8; 64]) -> CudaResult<Self::Event>;

    // --- stream memory operations, tensor maps, context events, pool access ---
    /// `cuStreamBatchMemOp`: the ops in order on `stream` (kinds and flags the session checked).
    ///
    /// # Safety
    /// Every op's address lies in device memory of the session or in host memory of this process
    /// registered mapped at that address, which stays mapped until the ops are done.
    unsafe fn stream_mem_ops(&self, stream: Self::Stream, ops: &[StreamMemOp]) -> CudaResult<()>;
    /// `cuTensorMapEncode*` of a tensor whose memory the session checked: the 128-byte map.
    fn tensor_map_encode(&self, encode: &TensorMapParams) -> CudaResult<[u8; 128]>;
    /// `cuTensorMapReplaceAddress` with an address the session checked.
    fn tensor_map_replace_address(&self, map: &[u8; 128], address: u64) -> CudaResult<[u8; 128]>;
    /// `cuCtxRecordEvent` (`wait` false) or `cuCtxWaitEvent` in the session's context.
    fn context_event(&self, event: Self::Event, wait: bool) -> CudaResult<()>;
    /// `cuMemPoolGetAccess` from the current device after `cuMemPoolSetAccess` with `set` for it
    /// (the pool's own device, or a peer given access to the pool).
    fn pool_access(&self, pool: Self::MemPool, set: Option<u32>) -> CudaResult<u32>;
    /// `cuOccupancyMaxPotentialClusterSize` for a launch configuration.
    fn occupancy_max_potential_cluster_size(&self, function: Self::Function, shape: LaunchShape<'_>) -> CudaResult<i32>;

    // --- green contexts (the session checks every id first) ---
    /// `cuCtxGetDevResource` of the session's context (`green` `None`: under MPS, the tenant's
    /// share), or `cuGreenCtxGetDevResource`; `kind` is a `CUdevResourceType`.
    fn dev_resource(&self, green: Option<Self::GreenCtx>, kind: u32) -> CudaResult<Self::Resource>;
    /// A resource's public fields (`id` left 0).
    fn resource_facts(resource: &Self::Resource) -> DevResource;
    /// `cuDevSmResourceSplitByCount`: `groups` asked for (`None`: counted only).
    fn sm_resource_split(&self, input: &Self::Resource, groups: Option<u32>, flags: u32, min_count: u32) -> CudaResult<SmSplit<Self>>;
    /// `cuDevResourceGenerateDesc`.
    fn resource_desc(&self, resources: &[Self::Resource]) -> CudaResult<Self::ResourceDesc>;
    /// `cuGreenCtxCreate` on the session's device.
    fn green_create(&self, desc: Self::ResourceDesc, flags: u32) -> CudaResult<Self::GreenCtx>;
    /// A stream of the green context: `cuGreenCtxStreamCreate` for a non-blocking one, else the
    /// stream `cuStreamCreate` makes while the green context is current.
    fn green_stream_create(&self, green: Self::GreenCtx, flags: u32, priority: i32) -> CudaResult<Self::Stream>;
    /// `cuGreenCtxRecordEvent` (`wait` false) or `cuGreenCtxWaitEvent`.
    fn green_event(&self, green: Self::GreenCtx, event: Self::Event, wait: bool) -> CudaResult<()>;
    /// `cuGreenCtxDestroy` (its streams were destroyed first).
    fn green_destroy(&self, green: Self::GreenCtx) -> CudaResult<()>;
}

/// What `cuDevSmResourceSplitByCount` made: the groups (none when only counting), how many
/// there are or would be, and the rest.
pub struct SmSplit<D: Device + ?Sized> {
    pub groups: Vec<D::Resource>,
    pub count: u32,
    pub remaining: D::Resource,
}
