//! The data-plane op table: every message the shim sends to an rpc-server, declared once.
//!
//! A row is `id Name method [class bulk] { request fields } -> { reply fields };`
//! - `id`: the wire id, explicit and never reused (retired ids stay as comments).
//! - `class`: `noreply` (asynchronous: nothing comes back; a failure becomes the session's
//!   deferred error), `reply` (a reply comes back; the shim may collect it later), `sync_point`
//!   (a reply that also delivers any deferred error, as CUDA reports asynchronous errors at the
//!   next synchronizing call).
//! - `bulk`: `bulk_in` (raw bytes follow the request), `bulk_out` (raw bytes follow the reply), `-`.
//!
//! Many C exports map to one op (`cudaMemcpy`, `cudaMemcpyAsync` and the symbol copies all become
//! `MemcpyHtoD`/`MemcpyDtoH`/`MemcpyDtoD`); which export maps to which op is the shim's business
//! (`cudart-shim/src/exports.rs`). The table is expanded here into request/reply types and their
//! codec, and in the rpc-server into the handler trait every device backend implements, so a new op
//! is a row plus one server method, and a missing method is a compile error.
//!
//! Streams and events are named by client-chosen ids (`0` is the legacy default stream), so
//! creating them needs no round trip. Device pointers are real device addresses.

use serde::{Deserialize, Serialize};

use crate::error::CudaError;
use crate::frame::{FrameError, decode_exact, encode_into};

/// Calls the given macro with the op table.
#[macro_export]
macro_rules! for_each_op {
    ($callback:ident) => {
        $callback! {
            // --- memory ---
            /// `cudaMalloc`.
            1 Malloc malloc [reply -] { size: u64 } -> { ptr: u64 };
            /// `cudaFree`.
            2 Free free [reply -] { ptr: u64 } -> {};
            /// `cudaMemGetInfo`, as the session's slice sees it.
            3 MemGetInfo mem_get_info [reply -] {} -> { free: u64, total: u64 };
            /// Host to device; the bytes follow as bulk. Large copies arrive as several chunks.
            4 MemcpyHtoD memcpy_htod [noreply bulk_in] { dst: u64, stream: u64 } -> {};
            /// Device to host; the bytes come back as bulk. `blocking`: a `cudaMemcpy` (not
            /// `...Async`) whose last chunk this is, which also flushes device `printf` output.
            5 MemcpyDtoH memcpy_dtoh [sync_point bulk_out] { src: u64, len: u64, stream: u64, blocking: bool } -> {};
            /// Device to device.
            6 MemcpyDtoD memcpy_dtod [noreply -] { dst: u64, src: u64, len: u64, stream: u64 } -> {};
            /// `cudaMemset*`, `cuMemsetD8/D16/D32*`: `len` bytes of elements `width` bytes wide (1, 2
            /// or 4), each the low `width` bytes of `pattern`.
            7 Memset memset [noreply -] { dst: u64, pattern: u32, width: u8, len: u64, stream: u64 } -> {};
            // --- modules and kernels ---
            /// A module image under a client-chosen id; its kernels and variables are asked for by
            /// name afterwards. The image's bytes follow as bulk, or, with `cached` (the image's
            /// SHA-256), no bytes follow and the server loads the image it cached under that digest;
            /// `image_needed` says it holds none, and the client sends the bytes.
            8 RegisterModule register_module [reply bulk_in] { module: u32, cached: Option<[u8; 32]> } -> { image_needed: bool };
            /// `__cudaUnregisterFatBinary`.
            9 UnregisterModule unregister_module [noreply -] { module: u32 } -> {};
            /// A kernel launch; `args` is packed by the kernel's parameter layout. `attributes`:
            /// `cuLaunchKernelEx`'s launch attributes (empty for a plain launch).
            10 Launch launch [noreply -] {
                function: FunctionRef, grid: Dim3, block: Dim3, shared_mem: u32, stream: u64, args: Vec<u8>,
                attributes: Vec<LaunchAttribute>
            } -> {};
            /// `cudaFuncGetAttributes`.
            11 FuncGetAttributes func_get_attributes [reply -] { function: FunctionRef } -> { attributes: FuncAttributes };
            /// `cudaFuncSetAttribute` (`cudaFuncAttribute` numbering).
            12 FuncSetAttribute func_set_attribute [reply -] { function: FunctionRef, attribute: u32, value: i32 } -> {};
            /// `cudaOccupancyMaxActiveBlocksPerMultiprocessor[WithFlags]`.
            13 OccupancyMaxActiveBlocks occupancy_max_active_blocks [reply -] {
                function: FunctionRef, block_size: i32, dynamic_shared_mem: u64, flags: u32
            } -> { blocks: i32 };
            // --- streams and events ---
            /// `cudaStreamCreate*` under a client-chosen id.
            14 StreamCreate stream_create [noreply -] { stream: u64, flags: u32, priority: i32 } -> {};
            /// `cudaStreamDestroy`.
            15 StreamDestroy stream_destroy [noreply -] { stream: u64 } -> {};
            /// `cudaStreamSynchronize`.
            16 StreamSynchronize stream_synchronize [sync_point -] { stream: u64 } -> {};
            /// `cudaStreamQuery`: `cudaErrorNotReady` while work is pending.
            17 StreamQuery stream_query [sync_point -] { stream: u64 } -> {};
            /// `cudaStreamWaitEvent`.
            18 StreamWaitEvent stream_wait_event [noreply -] { stream: u64, event: u64, flags: u32 } -> {};
            /// `cudaEventCreate*` under a client-chosen id.
            19 EventCreate event_create [noreply -] { event: u64, flags: u32 } -> {};
            /// `cudaEventRecord[WithFlags]`.
            20 EventRecord event_record [noreply -] { event: u64, stream: u64, flags: u32 } -> {};
            /// `cudaEventSynchronize`.
            21 EventSynchronize event_synchronize [sync_point -] { event: u64 } -> {};
            /// `cudaEventQuery`: `cudaErrorNotReady` while the event is pending.
            22 EventQuery event_query [sync_point -] { event: u64 } -> {};
            /// `cudaEventElapsedTime`.
            23 EventElapsedTime event_elapsed_time [reply -] { start: u64, end: u64 } -> { milliseconds: f32 };
            /// `cudaEventDestroy`.
            24 EventDestroy event_destroy [noreply -] { event: u64 } -> {};
            // --- device ---
            /// `cudaDeviceSynchronize`.
            25 DeviceSynchronize device_synchronize [sync_point -] {} -> {};
            /// `cudaDeviceReset`: resets the device's context; the session keeps its modules (loaded again).
            26 DeviceReset device_reset [reply -] {} -> {};
            /// `cudaDeviceSetLimit` (`cudaLimit` numbering).
            27 DeviceSetLimit device_set_limit [reply -] { limit: u32, value: u64 } -> {};
            /// `cudaDeviceGetLimit`.
            28 DeviceGetLimit device_get_limit [reply -] { limit: u32 } -> { value: u64 };
            // --- shared-memory channel (same host; offsets are into the session's segment) ---
            /// Pins `[offset, offset + len)` of the segment for DMA (a `cudaMallocHost` block).
            /// `mapped_at` (0: none): the client's address of the block. When that address is free
            /// on the server, the block is mapped there too and pinned as mapped memory, and
            /// `device_pointer` is the address kernels use for it (that same address, under unified
            /// addressing); 0 when the block is pinned for copies only.
            29 ShmRegister shm_register [reply -] { offset: u64, len: u64, mapped_at: u64 } -> { device_pointer: u64 };
            /// Unpins a block registered with `ShmRegister` (`cudaFreeHost`).
            30 ShmUnregister shm_unregister [noreply -] { offset: u64 } -> {};
            /// Host to device straight from pinned segment memory.
            31 ShmCopyHtoD shm_copy_htod [noreply -] { dst: u64, offset: u64, len: u64, stream: u64 } -> {};
            /// Device to host straight into pinned segment memory.
            32 ShmCopyDtoH shm_copy_dtoh [noreply -] { src: u64, offset: u64, len: u64, stream: u64 } -> {};
            /// Answers once everything queued on `stream` so far is done: the client then reuses a
            /// staging slot or reads what a copy put there. Deferred errors stay for a sync point.
            33 ShmFence shm_fence [reply -] { stream: u64 } -> {};
            // --- more device queries ---
            /// `cudaDeviceGetStreamPriorityRange` (asked once per session, then answered locally).
            34 StreamPriorityRange stream_priority_range [reply -] {} -> { least: i32, greatest: i32 };
            // --- modules loaded through the driver API ---
            /// A kernel of a module by name (`cuModuleGetFunction`, `cuLibraryGetKernel`): the index
            /// later launches name it by, and its parameter layout. Asking twice gives the same index.
            35 ModuleGetFunction module_get_function [reply -] { module: u32, name: String } -> { index: u32, params: Vec<ParamInfo> };
            /// A `__device__`/`__constant__`/`__managed__` variable of a module by name
            /// (`cuModuleGetGlobal`); `managed`: the app reaches it through a mirror.
            36 ModuleGetGlobal module_get_global [reply -] { module: u32, name: String } -> { address: u64, size: u64, managed: bool };
            /// `cuOccupancyMaxActiveClusters` for a launch configuration.
            37 OccupancyMaxActiveClusters occupancy_max_active_clusters [reply -] {
                function: FunctionRef, grid: Dim3, block: Dim3, shared_mem: u32, attributes: Vec<LaunchAttribute>
            } -> { clusters: i32 };
            /// `cuOccupancyAvailableDynamicSMemPerBlock`.
            38 OccupancyAvailableDynamicSmem occupancy_available_dynamic_smem [reply -] {
                function: FunctionRef, num_blocks: i32, block_size: i32
            } -> { bytes: u64 };
            // --- JIT linking (`cuLink*`), each link under a client-chosen id ---
            /// `cuLinkCreate`: `options` shape the code (only [`JitOption::FORWARDED`] ones);
            /// `info_log`/`error_log`: the sizes of the app's log buffers (0: none).
            39 LinkCreate link_create [reply -] { link: u64, options: Vec<JitOption>, info_log: u32, error_log: u32 } -> {};
            /// `cuLinkAddData`/`cuLinkAddFile`: one input (`CUjitInputType`), its bytes as bulk.
            40 LinkAdd link_add [reply bulk_in] { link: u64, kind: u32, name: String, options: Vec<JitOption> } -> { outcome: LinkOutcome };
            /// `cuLinkComplete`: the linked cubin stays with the link until read.
            41 LinkComplete link_complete [reply -] { link: u64 } -> { outcome: LinkOutcome, size: u64 };
            /// Bytes of a completed link's cubin, as bulk (at most a copy chunk).
            42 LinkRead link_read [reply bulk_out] { link: u64, offset: u64, len: u64 } -> {};
            /// `cuLinkDestroy`.
            43 LinkDestroy link_destroy [noreply -] { link: u64 } -> {};
            /// The kernels of a module, by name (`cuModuleEnumerateFunctions`, the tools module
            /// iterator cuFFT uses), in the driver's order.
            44 ModuleFunctionNames module_function_names [reply -] { module: u32 } -> { names: Vec<String> };
            // --- preferences and tools ---
            /// `cudaFuncSetCacheConfig` (`cudaFuncCache` numbering, the driver's `CUfunc_cache`).
            45 FuncSetCacheConfig func_set_cache_config [reply -] { function: FunctionRef, config: u32 } -> {};
            /// `cudaDeviceSetCacheConfig`: the context's preference.
            46 DeviceSetCacheConfig device_set_cache_config [reply -] { config: u32 } -> {};
            /// `cudaDeviceGetCacheConfig`.
            47 DeviceGetCacheConfig device_get_cache_config [reply -] {} -> { config: u32 };
            /// `cudaProfilerStart` (`start`) or `cudaProfilerStop`: for a profiler attached to the
            /// server's process.
            48 ProfilerControl profiler_control [reply -] { start: bool } -> {};
            /// `cudaCtxResetPersistingL2Cache`.
            49 ResetPersistingL2Cache reset_persisting_l2_cache [reply -] {} -> {};
            // --- stream capture and graphs (ids are the client's: graphs, nodes and executable
            // graphs; nodes the server finds in a captured graph get ids with `SERVER_NODE_BIT`) ---
            /// `cuStreamBeginCapture`: the graph being captured is named `graph`. `thread_mode`: the
            /// calling thread's capture interaction mode (`cuThreadExchangeStreamCaptureMode`).
            /// `into`: `cuStreamBeginCaptureToGraph`, `graph` is an existing graph and the first
            /// captured work follows `dependencies`, nodes of it, each with `data[i]` (from port,
            /// to port, type), or none at all (plain full dependencies).
            50 StreamBeginCapture stream_begin_capture [reply -] {
                stream: u64, mode: u32, thread_mode: u32, graph: u64, into: bool, dependencies: Vec<u64>, data: Vec<[u8; 3]>
            } -> {};
            /// `cuStreamEndCapture`: the captured graph's id (the one its capture began with).
            51 StreamEndCapture stream_end_capture [reply -] { stream: u64 } -> { graph: u64 };
            /// `cuStreamGetCaptureInfo` while some capture is active (otherwise the client knows
            /// the answer): status, capture id, the graph and the capture's current dependencies.
            52 StreamCaptureInfo stream_capture_info [reply -] { stream: u64 } -> { info: CaptureInfo };
            /// `cuThreadExchangeStreamCaptureMode` of the app thread whose calls follow, while a
            /// capture is active (the server makes all of a session's calls from one thread).
            53 CaptureMode capture_mode [noreply -] { mode: u32 } -> {};
            /// `cuGraphCreate`.
            54 GraphCreate graph_create [reply -] { graph: u64 } -> {};
            /// `cuGraphDestroy`.
            55 GraphDestroy graph_destroy [noreply -] { graph: u64 } -> {};
            /// `cuGraphAdd*Node`: a node of `graph` after `dependencies`, named `node`.
            /// `ptr`: a memory allocation node's address (0 for other nodes).
            56 GraphAddNode graph_add_node [reply -] { graph: u64, node: u64, dependencies: Vec<u64>, params: NodeParams } -> { ptr: u64 };
            /// `cuGraphAddDependencies_v2` (`remove`: `cuGraphRemoveDependencies_v2`): edges
            /// `from[i]` -> `to[i]`, each with `data[i]` (from port, to port, type), or none at all
            /// (plain full dependencies).
            57 GraphEdges graph_edges [reply -] { graph: u64, from: Vec<u64>, to: Vec<u64>, data: Vec<[u8; 3]>, remove: bool } -> {};
            /// `cuGraphGetNodes` (`roots`: `cuGraphGetRootNodes`), each with its `CUgraphNodeType`.
            58 GraphNodes graph_nodes [reply -] { graph: u64, roots: bool } -> { nodes: Vec<GraphNodeEntry> };
            /// `cuGraphClone`: `clone` names the copy; `nodes` pairs each original node with its copy.
            59 GraphClone graph_clone [reply -] { graph: u64, clone: u64 } -> { nodes: Vec<(u64, u64)> };
            /// `cuGraphInstantiateWithFlags` under `exec`; `host_nodes`: host-function nodes in the
            /// graph and its children (each launch runs them in the app's process).
            60 GraphInstantiate graph_instantiate [reply -] { graph: u64, exec: u64, flags: u64 } -> { host_nodes: u32 };
            /// `cuGraphLaunch`.
            61 GraphLaunch graph_launch [noreply -] { exec: u64, stream: u64 } -> {};
            /// `cuGraphUpload`.
            62 GraphUpload graph_upload [noreply -] { exec: u64, stream: u64 } -> {};
            /// `cuGraphExecDestroy`.
            63 GraphExecDestroy graph_exec_destroy [noreply -] { exec: u64 } -> {};
            /// `cuGraphExecUpdate`: `error` is the call's own error, `status` its
            /// `CUgraphExecUpdateResult` and `error_node` the node that names (0: none).
            64 GraphExecUpdate graph_exec_update [reply -] { exec: u64, graph: u64 } -> {
                error: Option<CudaError>, status: u32, error_node: u64, host_nodes: u32
            };
            /// `cuGraph*NodeSetParams` (`exec` 0) and `cuGraphExec*NodeSetParams` (in that
            /// executable graph).
            65 GraphNodeSetParams graph_node_set_params [reply -] { exec: u64, node: u64, params: NodeParams } -> {};
            /// `cuGraphDebugDotPrint`: the DOT text (the client writes the app's file).
            66 GraphDotPrint graph_dot_print [reply -] { graph: u64, flags: u32 } -> { text: String };
            /// `cuGraphDestroyNode`.
            67 GraphDestroyNode graph_destroy_node [reply -] { node: u64 } -> {};
            // --- host functions in stream order (`cuLaunchHostFunc`) ---
            /// Runs the app's host function `call` when `stream` reaches this point: the server
            /// sends `Notice::HostCall` and holds the stream until `HostCallDone`.
            68 LaunchHostFunc launch_host_func [noreply -] { stream: u64, call: u64 } -> {};
            /// The app's host function of `Notice::HostCall { run, .. }` has returned.
            69 HostCallDone host_call_done [noreply -] { run: u64 } -> {};
            // --- virtual memory management (`cuMem*`): physical allocations under client-chosen ids,
            // mapped into address ranges the session reserved ---
            /// `cuMemGetAllocationGranularity` for pinned device memory, or with `host` for pinned
            /// memory of the GPU host's NUMA node nearest the device (a query NCCL makes before it
            /// tries such an allocation; `recommended`: the recommended granularity, else the
            /// minimum).
            70 MemGranularity mem_granularity [reply -] { recommended: bool, host: bool } -> { granularity: u64 };
            /// `cuMemAddressReserve`: `addr` is a hint (0: none).
            71 MemAddressReserve mem_address_reserve [reply -] { size: u64, alignment: u64, addr: u64 } -> { ptr: u64 };
            /// `cuMemAddressFree` of a whole reservation, nothing mapped in it.
            72 MemAddressFree mem_address_free [reply -] { ptr: u64, size: u64 } -> {};
            /// `cuMemCreate` of pinned device memory, counted in the quota; `handle_types` is the
            /// prop's `requestedHandleTypes` (none, or a POSIX file descriptor).
            /// `usage`: the prop's `allocFlags.usage` (`CU_MEM_CREATE_USAGE_*`: a tile pool for
            /// sparse arrays, memory for hardware decompression).
            73 MemCreate mem_create [reply -] { handle: u64, size: u64, handle_types: u32, usage: u32 } -> {};
            /// `cuMemRelease`: the last reference; the memory goes once it is unmapped.
            74 MemRelease mem_release [reply -] { handle: u64 } -> {};
            /// `cuMemMap` of `[offset, offset + size)` of a handle at `ptr`, inside a reservation.
            75 MemMap mem_map [reply -] { ptr: u64, size: u64, offset: u64, handle: u64 } -> {};
            /// `cuMemUnmap` of whole mappings.
            76 MemUnmap mem_unmap [reply -] { ptr: u64, size: u64 } -> {};
            /// `cuMemSetAccess` for the session's device (`CUmemAccess_flags`).
            77 MemSetAccess mem_set_access [reply -] { ptr: u64, size: u64, flags: u32 } -> {};
            // --- stream-ordered allocation and memory pools (pool ids are the client's; `DEFAULT_POOL`
            // is the device's default pool) ---
            /// `cuMemAllocAsync` (`pool` 0: the device's current pool) / `cuMemAllocFromPoolAsync`,
            /// counted in the quota until freed.
            78 MemAllocAsync mem_alloc_async [reply -] { size: u64, stream: u64, pool: u64 } -> { ptr: u64 };
            /// `cuMemFreeAsync`.
            79 MemFreeAsync mem_free_async [noreply -] { ptr: u64, stream: u64 } -> {};
            /// `cuMemPoolGetAttribute`, or `cuMemPoolSetAttribute` with `value` (`CUmemPool_attribute`
            /// numbering; every value widened to 64 bits).
            80 MemPoolAttribute mem_pool_attribute [reply -] { pool: u64, attribute: u32, value: Option<u64> } -> { value: u64 };
            /// `cuMemPoolTrimTo`.
            81 MemPoolTrim mem_pool_trim [reply -] { pool: u64, keep: u64 } -> {};
            /// `cuMemPoolCreate` of a pool of pinned memory on the session's device, with the
            /// shareable handle types its props ask for (none, or a POSIX file descriptor).
            82 MemPoolCreate mem_pool_create [reply -] { pool: u64, handle_types: u32 } -> {};
            /// `cuMemPoolDestroy`.
            83 MemPoolDestroy mem_pool_destroy [reply -] { pool: u64 } -> {};
            /// `cuDeviceSetMemPool` (`pool` set), and the device's current pool either way.
            84 DeviceMemPool device_mem_pool [reply -] { set: Option<u64> } -> { pool: u64 };
            // --- pitched memory, shaped (2D/3D, array) copies, arrays, textures and surfaces (array
            // ids are the client's; texture and surface objects are the driver's values, which
            // kernels take as arguments) ---
            /// `cuMemAllocPitch`: `height` rows of `width` bytes, counted in the quota.
            85 MallocPitch malloc_pitch [reply -] { width: u64, height: u64, element_size: u32 } -> { ptr: u64, pitch: u64 };
            /// `cuMemsetD2D8/16/32*`.
            86 Memset2D memset_2d [noreply -] { set: Memset2d, stream: u64 } -> {};
            /// `cuMemcpy3D*` (and 2D, array and peer copies) between device memory and arrays.
            87 MemcpyShaped memcpy_shaped [noreply -] { copy: ShapedCopy, stream: u64 } -> {};
            /// A shaped copy from host memory: the source is the bulk, rows packed (a `Host` side
            /// of pitch `width`, at the origin). Large copies arrive as several row-aligned pieces.
            88 MemcpyHtoShaped memcpy_htos [noreply bulk_in] { copy: ShapedCopy, stream: u64 } -> {};
            /// A shaped copy into host memory: the rows come back packed as bulk. `blocking` as
            /// for `MemcpyDtoH`.
            89 MemcpyShapedToH memcpy_stoh [sync_point bulk_out] { copy: ShapedCopy, stream: u64, blocking: bool } -> {};
            /// A shaped copy whose host side is in the shared-memory segment at `offset` (a
            /// `Host` side: the layout there).
            90 ShmCopyShaped shm_copy_shaped [noreply -] { copy: ShapedCopy, offset: u64, stream: u64 } -> {};
            /// `cuArray3DCreate` (and `cuArrayCreate`, `cuMipmappedArrayCreate` with `levels`),
            /// named `array`, counted in the quota.
            91 ArrayCreate array_create [reply -] { array: u64, desc: ArrayDesc, levels: Option<u32> } -> {};
            /// `cuArrayDestroy`, `cuMipmappedArrayDestroy`.
            92 ArrayDestroy array_destroy [reply -] { array: u64 } -> {};
            /// `cuMipmappedArrayGetLevel`: level `level` of `mipmap`, named `array`.
            93 MipmappedArrayLevel mipmapped_array_level [reply -] { mipmap: u64, level: u32, array: u64 } -> {};
            /// `cuTexObjectCreate`.
            94 TexObjectCreate tex_object_create [reply -] { resource: Resource, texture: TextureDesc, view: Option<ViewDesc> } -> { handle: u64 };
            /// `cuSurfObjectCreate` over an array.
            95 SurfObjectCreate surf_object_create [reply -] { array: u64 } -> { handle: u64 };
            /// `cuTexObjectDestroy` (`surface` false), `cuSurfObjectDestroy`.
            96 ObjectDestroy object_destroy [reply -] { handle: u64, surface: bool } -> {};
            /// `cuStreamGetAttribute`, or `cuStreamSetAttribute` with `set` (a `CUstreamAttrValue`'s
            /// 64 bytes); the value after the call.
            97 StreamAttribute stream_attribute [reply -] { stream: u64, attribute: u32, set: Option<Vec<u8>> } -> { value: Vec<u8> };
            // --- CUDA IPC between sessions on one GPU (the driver's 64-byte handles) ---
            /// `cuIpcGetMemHandle` of an allocation of the session.
            98 IpcGetMemHandle ipc_get_mem_handle [reply -] { ptr: u64 } -> { handle: Vec<u8> };
            /// `cuIpcOpenMemHandle` (reopens are counted by the client, which calls this once):
            /// the mapping and its size. It is the exporter's memory: not in this session's quota.
            99 IpcOpenMemHandle ipc_open_mem_handle [reply -] { handle: Vec<u8>, flags: u32 } -> { ptr: u64, size: u64 };
            /// `cuIpcCloseMemHandle` of a mapping the session opened.
            100 IpcCloseMemHandle ipc_close_mem_handle [reply -] { ptr: u64 } -> {};
            /// `cuIpcGetEventHandle` of an interprocess event.
            101 IpcGetEventHandle ipc_get_event_handle [reply -] { event: u64 } -> { handle: Vec<u8> };
            /// `cuIpcOpenEventHandle`, named `event`.
            102 IpcOpenEventHandle ipc_open_event_handle [reply -] { handle: Vec<u8>, event: u64 } -> {};
            /// `cuStreamUpdateCaptureDependencies_v2`: the capture's next work follows
            /// `dependencies` (`set`) or these as well, each with `data[i]` (from port, to port,
            /// type), or none at all (plain full dependencies).
            103 StreamCaptureDependencies stream_capture_dependencies [reply -] {
                stream: u64, dependencies: Vec<u64>, data: Vec<[u8; 3]>, set: bool
            } -> {};
            // --- graph nodes beyond kernels and copies, and graph queries ---
            /// `cuGraphConditionalHandleCreate`: the driver's handle (kernels take it as an argument).
            104 GraphConditionalHandle graph_conditional_handle [reply -] { graph: u64, default_value: u32, flags: u32 } -> { handle: u64 };
            /// `cuGraphNodeGetDependencies` (`dependents`: `cuGraphNodeGetDependentNodes`), with edge data.
            105 GraphNodeLinks graph_node_links [reply -] { node: u64, dependents: bool } -> { links: Vec<GraphEdge> };
            /// `cuGraphGetEdges`, with edge data.
            106 GraphGetEdges graph_get_edges [reply -] { graph: u64 } -> { edges: Vec<GraphEdge> };
            /// `cuGraphNodeGetEnabled`, or `cuGraphNodeSetEnabled` with `set`.
            107 GraphNodeEnabled graph_node_enabled [reply -] { exec: u64, node: u64, set: Option<bool> } -> { enabled: bool };
            /// The object a node names: an event record or wait node's event, a child graph
            /// node's graph (named with `SERVER_NODE_BIT` if the client has not named it).
            108 GraphNodeObject graph_node_object [reply -] { node: u64 } -> { object: u64 };
            /// `cuDeviceGetGraphMemAttribute`, or `cuDeviceSetGraphMemAttribute` with `set`.
            109 GraphMemAttribute graph_mem_attribute [reply -] { attribute: u32, set: Option<u64> } -> { value: u64 };
            /// `cuDeviceGraphMemTrim`.
            110 GraphMemTrim graph_mem_trim [reply -] {} -> {};
            /// `cuGraphMemcpyNodeGetParams`, `cuGraphMemsetNodeGetParams`, `cuGraphHostNodeGetParams`
            /// of a node the client holds no record of (a captured or server-named node): the
            /// parameters as the server's driver holds them, with the host function's client call id.
            111 GraphNodeGetParams graph_node_get_params [reply -] { node: u64 } -> { params: NodeReadback };
            /// `cuGraphKernelNodeGetAttribute` (a `CUlaunchAttributeID`), after
            /// `cuGraphKernelNodeSetAttribute` with `set` (the 64-byte value) if given.
            112 GraphKernelNodeAttribute graph_kernel_node_attribute [reply -] { node: u64, attribute: u32, set: Option<Vec<u8>> } -> { value: Vec<u8> };
            /// `cuGraphKernelNodeCopyAttributes` from kernel node `src` to kernel node `dst`.
            113 GraphKernelNodeCopyAttributes graph_kernel_node_copy_attributes [reply -] { dst: u64, src: u64 } -> {};
            // --- checkpoint and migration (ids 114-119) ---
            /// The client's answer to `Notice::Pause`: the last frame before the move; the
            /// session drains its work and snapshots everything up to here.
            114 Pause pause [noreply -] {} -> {};
            // --- stream memory operations, tensor maps, context events, pool access, cluster
            // occupancy, shareable VMM handles, NVML's tenant, memory pool IPC (ids 120-139) ---
            /// `cuStreamWriteValue*`, `cuStreamWaitValue*` and `cuStreamBatchMemOp`: the ops in
            /// order on `stream`, each address in the session's device memory (or pinned host
            /// memory mapped at the client's address).
            120 StreamMemOps stream_mem_ops [noreply -] { stream: u64, ops: Vec<StreamMemOp> } -> {};
            /// `cuTensorMapEncodeTiled`/`Im2col`/`Im2colWide`: the server's driver encodes (and
            /// validates); the 128-byte `CUtensorMap` comes back.
            121 TensorMapEncode tensor_map_encode [reply -] { encode: TensorMapParams } -> { map: Vec<u8> };
            /// `cuTensorMapReplaceAddress` of the app's 128-byte map.
            122 TensorMapReplaceAddress tensor_map_replace_address [reply -] { map: Vec<u8>, address: u64 } -> { map: Vec<u8> };
            /// `cuCtxRecordEvent` (`wait` false) or `cuCtxWaitEvent` in the session's context
            /// (answered: the driver refuses both during a capture, at the call).
            123 ContextEvent context_event [reply -] { event: u64, wait: bool } -> {};
            /// `cuMemPoolGetAccess` from the session's device, after `cuMemPoolSetAccess` with `set`
            /// (`CUmemAccess_flags`) if given.
            124 MemPoolAccess mem_pool_access [reply -] { pool: u64, set: Option<u32> } -> { flags: u32 };
            /// `cuOccupancyMaxPotentialClusterSize` for a launch configuration.
            125 OccupancyMaxPotentialClusterSize occupancy_max_potential_cluster_size [reply -] {
                function: FunctionRef, grid: Dim3, block: Dim3, shared_mem: u32, attributes: Vec<LaunchAttribute>
            } -> { cluster_size: i32 };
            /// `cuMemExportToShareableHandle` (a POSIX file descriptor) of a physical allocation
            /// made with that handle type: `shareable` is opaque to the client, which hands the app
            /// a descriptor holding it; only a server can use it (`MemImport`).
            126 MemExport mem_export [reply -] { handle: u64 } -> { shareable: Vec<u8> };
            /// `cuMemImportFromShareableHandle` of what another session's `MemExport` gave, under
            /// the client-chosen `handle`; the allocation's size comes back. Imported memory stays
            /// in the exporter's quota.
            127 MemImport mem_import [reply -] { handle: u64, shareable: Vec<u8> } -> { size: u64 };
            /// `cuDeviceGetTexture1DLinearMaxWidth` for elements of `format` (`CUarray_format`)
            /// with `channels` channels.
            128 Texture1DLinearMaxWidth texture_1d_linear_max_width [reply -] { format: u32, channels: u32 } -> { width: u64 };
            /// `cuDeviceGetHostAtomicCapabilities` of `operations` (`CUatomicOperation`s), or with
            /// `peer`, `cuDeviceGetP2PAtomicCapabilities` of the session's device with itself.
            129 AtomicCapabilities atomic_capabilities [reply -] { operations: Vec<u32>, peer: bool } -> { capabilities: Vec<u32> };
            /// NVML's process list for the session's slice: the app process of each live session of
            /// the tenant (this server) and the device memory its allocations hold.
            130 TenantProcesses tenant_processes [reply -] {} -> { processes: Vec<TenantProcess> };
            /// NVML's utilization for the session's slice: the percentages of the last second in
            /// which the tenant had kernels, and copies or memsets, queued and not yet seen done.
            131 TenantUtilization tenant_utilization [reply -] {} -> { kernels: u32, copies: u32 };
            /// `cuMemPoolExportToShareableHandle` (a POSIX file descriptor) of a pool made with that
            /// handle type: `shareable` is opaque to the client, as `MemExport`'s is.
            132 MemPoolExport mem_pool_export [reply -] { pool: u64 } -> { shareable: Vec<u8> };
            /// `cuMemPoolImportFromShareableHandle` of what another session's `MemPoolExport` gave,
            /// under the client-chosen `pool`: a pool to import pointers from, never to allocate from.
            133 MemPoolImport mem_pool_import [reply -] { pool: u64, shareable: Vec<u8> } -> {};
            /// `cuMemPoolExportPointer` of a live allocation (its start) of a pool made with a POSIX
            /// file descriptor handle type: the 64 bytes of `CUmemPoolPtrExportData`, opaque to the
            /// client.
            134 MemPoolExportPointer mem_pool_export_pointer [reply -] { ptr: u64 } -> { data: Vec<u8> };
            /// `cuMemPoolImportPointer` of another session's `MemPoolExportPointer` data from the
            /// imported `pool` it came from: the memory's address here and its size. Imported
            /// memory stays in the exporter's quota; `Free` and `MemFreeAsync` end the import.
            135 MemPoolImportPointer mem_pool_import_pointer [reply -] { pool: u64, data: Vec<u8> } -> { ptr: u64, size: u64 };
            // --- planar, sparse and deferred-mapping arrays, batch decompression (ids 140-149) ---
            /// `cuArrayGetPlane`: plane `plane` of `array` (a planar format such as NV12), named
            /// `plane_array`, and its descriptor. A plane belongs to its array and goes with it.
            140 ArrayGetPlane array_get_plane [reply -] { array: u64, plane: u32, plane_array: u64 } -> { desc: ArrayDesc };
            /// `cuArrayGetSparseProperties`, `cuMipmappedArrayGetSparseProperties` of a sparse
            /// array or mipmapped array of the session.
            141 ArraySparseProperties array_sparse_properties [reply -] { array: u64 } -> { properties: SparseProperties };
            /// `cuArrayGetMemoryRequirements`, `cuMipmappedArrayGetMemoryRequirements` of a
            /// deferred-mapping array or mipmapped array, on the session's device.
            142 ArrayMemoryRequirements array_memory_requirements [reply -] { array: u64 } -> { size: u64, alignment: u64 };
            /// `cuMemMapArrayAsync`: the maps and unmaps in order on `stream`, arrays and physical
            /// allocations by the client's ids (answered: the driver checks them at the call).
            143 MemMapArray mem_map_array [reply -] { maps: Vec<ArrayMap>, stream: u64 } -> {};
            /// `cuMemBatchDecompressAsync` on `stream`, every buffer in the session's memory. What
            /// the driver answered is `error` and `error_index` (`u64::MAX`: the batch as a whole;
            /// `None`: the driver left the app's index as it was); a refusal of the session's own
            /// is the reply's error.
            144 MemBatchDecompress mem_batch_decompress [reply -] { ops: Vec<DecompressOp>, stream: u64 } -> {
                error: Option<CudaError>, error_index: Option<u64>
            };
            // --- green contexts (ids 150-159): SM resources as the server's driver describes them
            // (named by the server's ids: their bytes stay there), descriptors and green contexts
            // named by client-chosen ids ---
            /// `cuDeviceGetDevResource`/`cuCtxGetDevResource` (`green` 0: the session's context,
            /// as the server's driver reports it for the worker: under MPS, the tenant's SM share)
            /// or `cuGreenCtxGetDevResource` of green context `green`; `kind`: a `CUdevResourceType`.
            150 DevResourceGet dev_resource_get [reply -] { green: u64, kind: u32 } -> { resource: DevResource };
            /// `cuDevSmResourceSplitByCount` of a resource the server described: `groups` of them
            /// asked for (`None`: the app's result array is NULL, only count them). The created
            /// groups, how many there are (or would be), and what is left over.
            151 DevResourceSplit dev_resource_split [reply -] { input: u64, groups: Option<u32>, flags: u32, min_count: u32 } -> {
                groups: Vec<DevResource>, count: u32, remaining: DevResource
            };
            /// `cuDevResourceGenerateDesc` of resources the server described, named `desc`.
            152 DevResourceDesc dev_resource_desc [reply -] { desc: u64, resources: Vec<u64> } -> {};
            /// `cuGreenCtxCreate` from descriptor `desc`, named `green`. `default_stream` names a
            /// stream the server makes in it: the client sends the work the app queues on the NULL
            /// stream there while the green context is current.
            153 GreenCtxCreate green_ctx_create [reply -] { green: u64, desc: u64, flags: u32, default_stream: u64 } -> {};
            /// `cuGreenCtxDestroy`: its default stream goes with it, and any stream of it the app
            /// left (natively they leak, unusable).
            154 GreenCtxDestroy green_ctx_destroy [reply -] { green: u64 } -> {};
            /// `cuGreenCtxStreamCreate`, or `cuStreamCreate` while the green context is current: a
            /// stream of green context `green` named `stream`.
            155 GreenStreamCreate green_stream_create [reply -] { green: u64, stream: u64, flags: u32, priority: i32 } -> {};
            /// `cuGreenCtxRecordEvent` (`wait` false) or `cuGreenCtxWaitEvent`.
            156 GreenCtxEvent green_ctx_event [reply -] { green: u64, event: u64, wait: bool } -> {};
            // --- the app's shared file mappings as mapped host memory (same host; see `deposit`) ---
            /// A one-use ticket for handing the worker a descriptor: its socket's name and a token.
            157 ShmFileTicket shm_file_ticket [reply -] {} -> { socket: String, token: [u8; 16] };
            /// `cuMemHostRegister` of the app's shared mapping of a file: maps `len` bytes of the
            /// file deposited under `token`, from `file_offset`, at the app's address `mapped_at`
            /// (page aligned) and registers them mapped; `device_pointer` is `mapped_at`.
            158 ShmRegisterFile shm_register_file [reply -] { token: [u8; 16], file_offset: u64, len: u64, mapped_at: u64 } -> { device_pointer: u64 };
            /// `cuMemHostUnregister` of a range `ShmRegisterFile` mapped at `mapped_at`.
            159 ShmUnregisterFile shm_unregister_file [noreply -] { mapped_at: u64 } -> {};
            // --- a session on several GPUs ---
            /// The device the requests after it run on, an index into the session's devices: sent
            /// by the client, under the same hold of the connection as the request that follows,
            /// whenever the calling thread's device differs from the last one sent. An index
            /// outside the session's devices is refused (the deferred error) and changes nothing.
            170 SetDevice set_device [noreply -] { index: u32 } -> {};
            /// `cuCtxEnablePeerAccess` (`enable`) / `cuCtxDisablePeerAccess`: kernels of the current
            /// device may (no longer) use device `peer`'s memory.
            171 PeerAccess peer_access [reply -] { peer: u32, enable: bool, flags: u32 } -> {};
            // --- graph copies with the app's host memory ---
            /// A copy between device memory and the app's host memory on a capturing `stream`:
            /// the capture records a node that copies through server staging and the client
            /// (`NodeParams::HostMemcpy`) each time the graph runs.
            180 CaptureHostCopy capture_host_copy [reply -] { stream: u64, copy: HostCopy } -> {};
            /// A host-to-device copy node ran its host half (`Notice::HostCopyIn { run, .. }`): the
            /// app's bytes, packed, follow as bulk.
            181 HostCopyDone host_copy_done [noreply bulk_in] { run: u64 } -> {};
            // --- striped bulk copies (`crate::stripes`) ---
            /// Host to device over the session's data connections: `len` bytes for `dst` arrive in
            /// chunks of `chunk` bytes (the last one shorter), chunk `i` on data connection
            /// `i % count`, each behind a chunk header naming `transfer`. The reply comes once every
            /// chunk landed: a chunk the client wrote may still be lost with its connection, so the
            /// app's buffer is let go only then. `again`: a data connection broke under the copy in a
            /// resumable session, and the client sends the copy again whole over its main connection.
            182 MemcpyHtoDStriped memcpy_htod_striped [reply -] { dst: u64, len: u64, stream: u64, transfer: u64, chunk: u64 } -> { again: bool };
            /// Device to host over the session's data connections (chunks as above); the reply
            /// comes once every chunk was written. `blocking` as for `MemcpyDtoH`; `compress`:
            /// chunks LZ4 makes smaller go compressed (the client measured a slow link).
            183 MemcpyDtoHStriped memcpy_dtoh_striped [sync_point -] { src: u64, len: u64, stream: u64, transfer: u64, chunk: u64, blocking: bool, compress: bool } -> {};
            // --- the session's end ---
            /// The app is exiting: the session ends now (a TCP connection that merely breaks is
            /// waited for, `docs/design/reconnect.md`).
            184 Goodbye goodbye [noreply -] {} -> {};
        }
    };
}

/// A device resource (`CUdevResource`) as the server's driver described it: the server keeps
/// the driver's bytes under `id`; the client writes the public fields into the app's struct.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevResource {
    pub id: u64,
    /// `CUdevResourceType` (see [`dev_resource`]).
    pub kind: u32,
    /// `CUdevSmResource`'s fields (for an SM resource).
    pub sm_count: u32,
    pub min_partition_size: u32,
    pub coscheduled_alignment: u32,
}

/// `CUdevResourceType` values, the split and green context flags.
pub mod dev_resource {
    pub const INVALID: u32 = 0;
    pub const SM: u32 = 1;
    /// `CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING`, `_MAX_POTENTIAL_CLUSTER_SIZE`.
    pub const SPLIT_IGNORE_SM_COSCHEDULING: u32 = 0x1;
    pub const SPLIT_MAX_POTENTIAL_CLUSTER_SIZE: u32 = 0x2;
    /// `CU_GREEN_CTX_DEFAULT_STREAM`: required by `cuGreenCtxCreate`.
    pub const GREEN_CTX_DEFAULT_STREAM: u32 = 0x1;
    /// Most groups one split may ask for: more than any GPU has SMs.
    pub const MAX_GROUPS: u32 = 1024;
}

/// An app process of the tenant, as NVML lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantProcess {
    pub pid: u32,
    pub device_bytes: u64,
}

/// A JIT option and its value, as the driver takes it in a pointer-sized slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct JitOption {
    pub option: u32,
    pub value: u64,
}

impl JitOption {
    /// `CU_JIT_*` options that ask for information back or restate what the server does anyway:
    /// each end answers them itself, none is ever forwarded.
    pub const WALL_TIME: u32 = 2;
    pub const INFO_LOG_BUFFER: u32 = 3;
    pub const INFO_LOG_BUFFER_SIZE_BYTES: u32 = 4;
    pub const ERROR_LOG_BUFFER: u32 = 5;
    pub const ERROR_LOG_BUFFER_SIZE_BYTES: u32 = 6;
    pub const TARGET_FROM_CUCONTEXT: u32 = 8;
    /// Forwarded, but asks only for more log text.
    pub const LOG_VERBOSE: u32 = 12;

    /// The `CUjit_option`s forwarded to the server: plain values that shape the generated code
    /// (registers, optimization level, target, debug and line info, cache mode, FTZ/precision/FMA,
    /// position-independent code, occupancy hints). Options that carry host pointers (logs,
    /// symbol tables) or write a result back into their slot are never sent.
    pub const FORWARDED: &[u32] = &[0, 7, 9, 10, 11, 12, 13, 14, 16, 20, 21, 22, 23, 24, 29, 30, 31, 32, 33, 34];

    pub fn forwarded(&self) -> bool {
        Self::FORWARDED.contains(&self.option)
    }
}

/// What a link step (`cuLinkAddData`, `cuLinkComplete`) came to: its error if it failed, the
/// linker's logs so far (each within the size the app gave) and, once complete, its wall time.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkOutcome {
    pub error: Option<CudaError>,
    pub info_log: String,
    pub error_log: String,
    pub wall_time_ms: f32,
}

/// Launch geometry, as `dim3`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Dim3 {
    pub x: u32,
    pub y: u32,
    pub z: u32,
}

impl Dim3 {
    /// Threads or blocks in all three dimensions together.
    pub fn volume(&self) -> u64 {
        u64::from(self.x) * u64::from(self.y) * u64::from(self.z)
    }
}

/// A kernel: the client-chosen module id and its index among the module's registered functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FunctionRef {
    pub module: u32,
    pub index: u32,
}

/// One `CUlaunchAttribute` of `cuLaunchKernelEx`: its id and the first 16 bytes of its value
/// union, which hold every attribute Flyt forwards (none of them carries a host pointer or a
/// handle).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LaunchAttribute {
    pub id: u32,
    pub value: [u32; 4],
}

impl LaunchAttribute {
    /// The `CUlaunchAttributeID`s Flyt forwards: plain values that mean the same on the server
    /// (cooperative, synchronization policy, cluster dimension, cluster scheduling preference,
    /// programmatic stream serialization, priority, memory sync domain map and domain, preferred
    /// cluster dimension, preferred shared memory carveout). Events, access policy windows and
    /// graph-only attributes are refused at the call.
    pub const FORWARDED: &[u32] = &[2, 3, 4, 5, 6, 8, 9, 10, 11, 14];

    pub fn is_forwarded(&self) -> bool {
        Self::FORWARDED.contains(&self.id)
    }
}

/// One operation of `cuStreamBatchMemOp` (the single-value calls are batches of one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamMemOp {
    /// `CUstreamBatchMemOpType` (see [`mem_op`]).
    pub kind: u32,
    /// The word waited on or written (none for a barrier).
    pub address: u64,
    /// The value compared or written (the low 32 bits for 32-bit ops).
    pub value: u64,
    /// `CUstreamWaitValue_flags`, `CUstreamWriteValue_flags` or `CUstreamMemoryBarrier_flags`.
    pub flags: u32,
}

/// `CUstreamBatchMemOpType` values and the flags Flyt serves.
pub mod mem_op {
    pub const WAIT_VALUE_32: u32 = 1;
    pub const WRITE_VALUE_32: u32 = 2;
    pub const FLUSH_REMOTE_WRITES: u32 = 3;
    pub const WAIT_VALUE_64: u32 = 4;
    pub const WRITE_VALUE_64: u32 = 5;
    pub const BARRIER: u32 = 6;
    /// `CU_STREAM_WAIT_VALUE_GEQ`, `EQ`, `AND`, `NOR`: the low bits of a wait's flags.
    pub const WAIT_GEQ: u32 = 0;
    pub const WAIT_EQ: u32 = 1;
    pub const WAIT_AND: u32 = 2;
    pub const WAIT_NOR: u32 = 3;
    /// `CU_STREAM_WAIT_VALUE_FLUSH`.
    pub const WAIT_FLUSH: u32 = 1 << 30;
    /// `CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER` (v1 entry points only).
    pub const WRITE_NO_MEMORY_BARRIER: u32 = 1;
    /// `CU_STREAM_MEMORY_BARRIER_TYPE_SYS`, `_GPU`.
    pub const BARRIER_SYS: u32 = 0;
    pub const BARRIER_GPU: u32 = 1;
    /// The most operations one batch may hold (the driver's: "less than 256").
    pub const MAX_BATCH: usize = 255;
}

impl StreamMemOp {
    /// The bytes the op reads or writes at `address`: 4, 8, or `None` for ops on no address.
    pub fn width(&self) -> Option<u64> {
        match self.kind {
            mem_op::WAIT_VALUE_32 | mem_op::WRITE_VALUE_32 => Some(4),
            mem_op::WAIT_VALUE_64 | mem_op::WRITE_VALUE_64 => Some(8),
            _ => None,
        }
    }

    pub fn is_wait(&self) -> bool {
        matches!(self.kind, mem_op::WAIT_VALUE_32 | mem_op::WAIT_VALUE_64)
    }

    /// The op a driver's `CUstreamBatchMemOpParams` (a 48-byte union, read as six words)
    /// describes: wait and write ops are `{ operation; address; value or value64; flags; alias }`,
    /// barriers and flushes `{ operation, flags }`, each field little-endian.
    pub fn from_driver_words(words: &[u64; 6]) -> Self {
        let kind = words[0] as u32;
        let mut op = match kind {
            mem_op::WAIT_VALUE_32 | mem_op::WRITE_VALUE_32 | mem_op::WAIT_VALUE_64 | mem_op::WRITE_VALUE_64 => {
                Self { kind, address: words[1], value: words[2], flags: words[3] as u32 }
            }
            _ => Self { kind, address: 0, value: 0, flags: (words[0] >> 32) as u32 },
        };
        if op.width() == Some(4) {
            op.value &= u64::from(u32::MAX);
        }
        op
    }

    /// The driver's form of the op ([`StreamMemOp::from_driver_words`] reversed).
    pub fn driver_words(&self) -> [u64; 6] {
        let mut words = [0u64; 6];
        match self.width() {
            Some(width) => {
                words[0] = u64::from(self.kind);
                words[1] = self.address;
                words[2] = if width == 4 { self.value & u64::from(u32::MAX) } else { self.value };
                words[3] = u64::from(self.flags);
            }
            None => words[0] = u64::from(self.kind) | (u64::from(self.flags) << 32),
        }
        words
    }

    /// Whether a wait's condition holds for `current`, the word at its address (compared at the
    /// op's width, as the driver does; `GEQ` is cyclic).
    pub fn wait_satisfied(&self, current: u64) -> bool {
        let (current, value, signed) = match self.kind {
            mem_op::WAIT_VALUE_32 => {
                let (c, v) = (current as u32, self.value as u32);
                (u64::from(c), u64::from(v), i64::from(c.wrapping_sub(v) as i32))
            }
            _ => (current, self.value, current.wrapping_sub(self.value) as i64),
        };
        let mask = if self.kind == mem_op::WAIT_VALUE_32 { u64::from(u32::MAX) } else { u64::MAX };
        match self.flags & !mem_op::WAIT_FLUSH {
            mem_op::WAIT_GEQ => signed >= 0,
            mem_op::WAIT_EQ => current == value,
            mem_op::WAIT_AND => current & value != 0,
            mem_op::WAIT_NOR => !(current | value) & mask != 0,
            _ => false,
        }
    }
}

/// `cuTensorMapEncode*`'s parameters (`CUtensorMapDataType`, `...Interleave`, `...Swizzle`,
/// `...L2promotion` and `...FloatOOBfill` numbering). `strides` holds the `rank - 1` byte
/// strides of dimensions 1 and up.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorMapParams {
    pub data_type: u32,
    pub rank: u32,
    pub address: u64,
    pub dims: Vec<u64>,
    pub strides: Vec<u64>,
    pub element_strides: Vec<u32>,
    pub interleave: u32,
    pub swizzle: u32,
    pub l2_promotion: u32,
    pub oob_fill: u32,
    pub layout: TensorMapLayout,
}

/// What kind of tensor map, with the parameters only it takes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TensorMapLayout {
    /// `cuTensorMapEncodeTiled`: the box, `rank` entries.
    Tiled { box_dim: Vec<u32> },
    /// `cuTensorMapEncodeIm2col`: the corners, `rank - 2` entries each.
    Im2col { lower_corner: Vec<i32>, upper_corner: Vec<i32>, channels_per_pixel: u32, pixels_per_column: u32 },
    /// `cuTensorMapEncodeIm2colWide` (`mode`: `CUtensorMapIm2ColWideMode`).
    Im2colWide { lower_corner_width: i32, upper_corner_width: i32, channels_per_pixel: u32, pixels_per_column: u32, mode: u32 },
}

impl Default for TensorMapLayout {
    fn default() -> Self {
        Self::Tiled { box_dim: Vec::new() }
    }
}

/// The size of a `CUtensorMap`.
pub const TENSOR_MAP_SIZE: usize = 128;

impl TensorMapParams {
    /// The highest rank a tensor map takes.
    pub const MAX_RANK: u32 = 5;

    /// The bytes of one dimension-0 row of `elements` elements, or `None` for an unknown type.
    fn row_bytes(data_type: u32, elements: u64) -> Option<u64> {
        let bytes = |size: u64| elements.checked_mul(size);
        match data_type {
            0 => bytes(1),
            1 | 6 | 9 => bytes(2),
            2 | 3 | 7 | 10..=12 => bytes(4),
            4 | 5 | 8 => bytes(8),
            // Sub-byte types, packed 16 elements to 8 (`16U4_ALIGN8B`) or 16 bytes.
            13 => elements.div_ceil(16).checked_mul(8),
            14 | 15 => elements.div_ceil(16).checked_mul(16),
            _ => None,
        }
    }

    /// The bytes from `address` the tensor covers (its last element's end), or `None` when the
    /// shape is malformed (wrong counts, an unknown type, overflow): what the server checks
    /// against the session's memory before its driver sees the address.
    pub fn global_span(&self) -> Option<u64> {
        let rank = usize::try_from(self.rank).ok()?;
        if rank == 0 || rank > Self::MAX_RANK as usize || self.dims.len() != rank || self.strides.len() != rank - 1 {
            return None;
        }
        if self.dims.contains(&0) {
            return None;
        }
        let mut end = Self::row_bytes(self.data_type, self.dims[0])?;
        for (dim, stride) in self.dims[1..].iter().zip(&self.strides) {
            end = end.checked_add((dim - 1).checked_mul(*stride)?)?;
        }
        Some(end)
    }
}

/// The id of the first device's default memory pool (the client chooses the ids of pools it
/// creates, above it).
pub const DEFAULT_POOL: u64 = 1;

/// The ids of other devices' default pools: this plus the session's device index, far above the
/// ids the client gives pools it creates.
const OTHER_DEFAULT_POOLS: u64 = 1 << 48;

/// The id of the default memory pool of the session's device `device` (`DEFAULT_POOL` for 0).
pub const fn default_pool_of(device: u32) -> u64 {
    if device == 0 { DEFAULT_POOL } else { OTHER_DEFAULT_POOLS + device as u64 }
}

/// The session's device whose default pool `pool` is, if it is one.
pub const fn default_pool_device(pool: u64) -> Option<u32> {
    if pool == DEFAULT_POOL {
        Some(0)
    } else if pool > OTHER_DEFAULT_POOLS && pool - OTHER_DEFAULT_POOLS <= u32::MAX as u64 {
        Some((pool - OTHER_DEFAULT_POOLS) as u32)
    } else {
        None
    }
}

/// Node ids the server gives to nodes it finds in a captured graph have this bit set; the
/// client chooses the ids of nodes it adds, below it.
pub const SERVER_NODE_BIT: u64 = 1 << 63;

/// `CU_STREAM_CAPTURE_STATUS_*`.
pub mod capture_status {
    pub const NONE: u32 = 0;
    pub const ACTIVE: u32 = 1;
    pub const INVALIDATED: u32 = 2;
}

/// What `cuStreamGetCaptureInfo` tells about a stream.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureInfo {
    pub status: u32,
    pub id: u64,
    pub graph: u64,
    pub dependencies: Vec<u64>,
    /// The edge data (from port, to port, type) of each dependency as the driver gave it, or
    /// none where it gave none (a NULL array).
    pub data: Vec<[u8; 3]>,
}

/// A node of a graph and its `CUgraphNodeType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphNodeEntry {
    pub node: u64,
    pub kind: u32,
}

/// An edge of a graph: for `GraphNodeLinks` only `from` is used (the other node); ports and
/// type as `CUgraphEdgeData` has them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphEdge {
    pub from: u64,
    pub to: u64,
    pub from_port: u8,
    pub to_port: u8,
    pub kind: u8,
}

/// One side of a copy node as the server's driver holds it: `memory_type` is a `CUmemorytype`
/// (device, unified, or host memory the server maps at the client's own address); arrays are
/// not read back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeCopySide {
    pub memory_type: u32,
    pub ptr: u64,
    pub pos: Pos3,
    pub pitch: u64,
    pub height: u64,
}

/// A copy node's parameters as `CUDA_MEMCPY3D` has them (no arrays).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeCopy {
    pub src: NodeCopySide,
    pub dst: NodeCopySide,
    pub width: u64,
    pub height: u64,
    pub depth: u64,
}

/// What `GraphNodeGetParams` reads back from a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeReadback {
    Memcpy(NodeCopy),
    Memset(Memset2d),
    /// A host node running the client's host function `call`.
    Host {
        call: u64,
    },
    BatchMemOp {
        ops: Vec<StreamMemOp>,
    },
}

/// `CUlaunchAttributeID`s of kernel nodes (`cuGraphKernelNodeSetAttribute`).
pub mod kernel_node_attribute {
    /// Names device memory: the server checks the window lies in the session's memory.
    pub const ACCESS_POLICY_WINDOW: u32 = 1;
    /// Refused on the client when set: the server's packed-argument nodes cannot be cooperative.
    pub const COOPERATIVE: u32 = 2;
    /// Carry events, which the server's driver could not take from the client: refused.
    pub const PROGRAMMATIC_EVENT: u32 = 7;
    pub const LAUNCH_COMPLETION_EVENT: u32 = 12;
    /// Plain values forwarded to the server's driver (which says which ones kernel nodes take).
    pub const FORWARDED: [u32; 13] = [1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 13, 14, 16];
    /// The size of `CUlaunchAttributeValue`.
    pub const VALUE_LEN: usize = 64;
}

/// `CUgraphNodeType` values.
pub mod node_type {
    pub const KERNEL: u32 = 0;
    pub const MEMCPY: u32 = 1;
    pub const MEMSET: u32 = 2;
    pub const HOST: u32 = 3;
    pub const GRAPH: u32 = 4;
    pub const EMPTY: u32 = 5;
    pub const WAIT_EVENT: u32 = 6;
    pub const EVENT_RECORD: u32 = 7;
    pub const MEM_ALLOC: u32 = 10;
    pub const MEM_FREE: u32 = 11;
    pub const BATCH_MEM_OP: u32 = 12;
    pub const CONDITIONAL: u32 = 13;
}

/// A copy between device memory regions of `width` bytes x `height` rows x `depth` slices; each
/// side's rows are `pitch` bytes apart and its slices `pitch * height` (its own height) apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Copy3d {
    pub src: u64,
    pub src_pitch: u64,
    pub src_height: u64,
    pub dst: u64,
    pub dst_pitch: u64,
    pub dst_height: u64,
    pub width: u64,
    pub height: u64,
    pub depth: u64,
}

impl Copy3d {
    /// A plain copy of `len` bytes from `src` to `dst`.
    pub fn flat(dst: u64, src: u64, len: u64) -> Self {
        Self { src, src_pitch: len, src_height: 1, dst, dst_pitch: len, dst_height: 1, width: len, height: 1, depth: 1 }
    }

    /// The bytes from `base` that a side with this pitch and height covers, or `None` on
    /// overflow (the server validates that span).
    pub fn span(&self, pitch: u64, slice_height: u64) -> Option<u64> {
        if self.width == 0 || self.height == 0 || self.depth == 0 {
            return Some(0);
        }
        let slice = pitch.checked_mul(slice_height)?;
        (self.depth - 1).checked_mul(slice)?.checked_add((self.height - 1).checked_mul(pitch)?)?.checked_add(self.width)
    }
}

/// A 2D memset of elements `element_size` bytes wide (1, 2 or 4): `width` elements per row,
/// `height` rows `pitch` bytes apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Memset2d {
    pub dst: u64,
    pub pitch: u64,
    pub value: u32,
    pub element_size: u8,
    pub width: u64,
    pub height: u64,
}

/// One side of a shaped copy, as `CUDA_MEMCPY3D` describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CopySide {
    /// Device memory from `ptr`: rows `pitch` bytes apart, slices `pitch * height`.
    Device { ptr: u64, pitch: u64, height: u64 },
    /// A CUDA array (the client's id).
    Array { array: u64 },
    /// Host memory: packed bulk bytes, or the shared-memory segment (see the ops).
    Host { pitch: u64, height: u64 },
}

/// A position in a shaped copy: `x` in bytes, `y` rows, `z` slices (layers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pos3 {
    pub x: u64,
    pub y: u64,
    pub z: u64,
}

/// `cuMemcpy3D`'s whole description: a box of `width` bytes x `height` rows x `depth` slices
/// from `src` at `src_pos` to `dst` at `dst_pos`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShapedCopy {
    pub src: CopySide,
    pub src_pos: Pos3,
    pub dst: CopySide,
    pub dst_pos: Pos3,
    pub width: u64,
    pub height: u64,
    pub depth: u64,
}

/// A shaped copy's box: `width` bytes x `height` rows x `depth` slices. Client and server check
/// every side of a copy with these, the client to fail at the call, the server to protect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BoxSize {
    pub width: u64,
    pub height: u64,
    pub depth: u64,
}

impl BoxSize {
    /// The bytes of one side with rows `pitch` apart and slices `pitch * slice_height` apart,
    /// from the side's first byte at `pos` to its last, or `None` on overflow.
    pub fn span(&self, pos: Pos3, pitch: u64, slice_height: u64) -> Option<(u64, u64)> {
        let slice = pitch.checked_mul(slice_height)?;
        let start = pos.z.checked_mul(slice)?.checked_add(pos.y.checked_mul(pitch)?)?.checked_add(pos.x)?;
        if self.width == 0 || self.height == 0 || self.depth == 0 {
            return Some((start, 0));
        }
        let len = (self.depth - 1).checked_mul(slice)?.checked_add((self.height - 1).checked_mul(pitch)?)?.checked_add(self.width)?;
        Some((start, len))
    }

    /// [`BoxSize::span`] of a pitched side (device or host memory), or `None` also when the
    /// box's rows or slices would overlap their neighbours.
    pub fn pitched_span(&self, pos: Pos3, pitch: u64, slice_height: u64) -> Option<(u64, u64)> {
        let rows = self.height > 1 || self.depth > 1;
        if rows && pos.x.checked_add(self.width)? > pitch {
            return None;
        }
        if self.depth > 1 && pos.y.checked_add(self.height)? > slice_height {
            return None;
        }
        self.span(pos, pitch, slice_height)
    }

    /// Whether the box at `pos` lies inside an array of `desc`, in whole elements.
    pub fn fits_array(&self, pos: Pos3, desc: &ArrayDesc) -> bool {
        let (Some((width, height, depth)), Some(element)) = (desc.extent(), desc.element_size()) else { return false };
        let fits = |at: u64, len: u64, limit: u64| at.checked_add(len).is_some_and(|end| end <= limit);
        let whole_elements = pos.x.is_multiple_of(element) && self.width.is_multiple_of(element);
        whole_elements && fits(pos.x, self.width, width) && fits(pos.y, self.height, height) && fits(pos.z, self.depth, depth)
    }
}

impl ShapedCopy {
    pub fn size(&self) -> BoxSize {
        BoxSize { width: self.width, height: self.height, depth: self.depth }
    }

    /// The bytes the box holds, packed.
    pub fn packed_len(&self) -> Option<u64> {
        self.width.checked_mul(self.height)?.checked_mul(self.depth)
    }
}

/// `CUDA_ARRAY3D_DESCRIPTOR`: `width` elements of `format` (`CUarray_format`) x `channels`,
/// `height` and `depth` 0 for fewer dimensions; `flags` are `CUDA_ARRAY3D_*`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayDesc {
    pub width: u64,
    pub height: u64,
    pub depth: u64,
    pub format: u32,
    pub channels: u32,
    pub flags: u32,
}

/// `CUstreamAttrID` values a stream takes, and the size of a `CUstreamAttrValue`.
pub mod stream_attribute {
    pub const ACCESS_POLICY_WINDOW: u32 = 1;
    /// Refused on the client when set: the server's packed-argument nodes cannot be cooperative.
    pub const COOPERATIVE: u32 = 2;
    pub const SYNCHRONIZATION_POLICY: u32 = 3;
    pub const PRIORITY: u32 = 8;
    pub const MEM_SYNC_DOMAIN_MAP: u32 = 9;
    pub const MEM_SYNC_DOMAIN: u32 = 10;
    pub const ALL: [u32; 5] = [ACCESS_POLICY_WINDOW, SYNCHRONIZATION_POLICY, PRIORITY, MEM_SYNC_DOMAIN_MAP, MEM_SYNC_DOMAIN];
    pub const VALUE_LEN: usize = 64;
}

/// `CUarray_format` values with plain elements, and the planar ones (the ones Flyt serves).
pub mod array_format {
    pub const UNSIGNED_INT8: u32 = 0x01;
    pub const UNSIGNED_INT16: u32 = 0x02;
    pub const UNSIGNED_INT32: u32 = 0x03;
    pub const SIGNED_INT8: u32 = 0x08;
    pub const SIGNED_INT16: u32 = 0x09;
    pub const SIGNED_INT32: u32 = 0x0a;
    pub const HALF: u32 = 0x10;
    pub const FLOAT: u32 = 0x20;
    /// 8-bit YUV 4:2:0, semi-planar: a luma plane and an interleaved chroma plane.
    pub const NV12: u32 = 0xb0;
}

/// `CUDA_ARRAY3D_*` flags.
pub mod array_flags {
    pub const LAYERED: u32 = 0x01;
    pub const SURFACE_LDST: u32 = 0x02;
    pub const CUBEMAP: u32 = 0x04;
    pub const TEXTURE_GATHER: u32 = 0x08;
    /// Tiles and mip tail mapped onto tile-pool memory with `cuMemMapArrayAsync`.
    pub const SPARSE: u32 = 0x40;
    /// The whole array mapped onto memory with `cuMemMapArrayAsync`.
    pub const DEFERRED_MAPPING: u32 = 0x80;
}

/// `CU_MEM_CREATE_USAGE_*`: what a physical allocation (`cuMemCreate`) is for.
pub mod mem_usage {
    /// A tile pool: memory `cuMemMapArrayAsync` maps sparse arrays' tiles onto.
    pub const TILE_POOL: u32 = 0x1;
    /// Buffers of hardware decompression (`cuMemBatchDecompressAsync`).
    pub const HW_DECOMPRESS: u32 = 0x2;
    pub const ALL: u32 = TILE_POOL | HW_DECOMPRESS;
}

/// The bytes of one tile of a sparse array (every format and shape), and the alignment of
/// memory mapped into one.
pub const SPARSE_TILE_BYTES: u64 = 64 << 10;

/// `CUDA_ARRAY_SPARSE_PROPERTIES`: the tile's extent in elements, where the mip tail begins, its
/// size in bytes, and `CU_ARRAY_SPARSE_PROPERTIES_SINGLE_MIPTAIL`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SparseProperties {
    pub tile: [u32; 3],
    pub miptail_first_level: u32,
    pub miptail_size: u64,
    pub flags: u32,
}

impl SparseProperties {
    /// `CU_ARRAY_SPARSE_PROPERTIES_SINGLE_MIPTAIL`.
    pub const SINGLE_MIPTAIL: u32 = 0x1;
}

/// What one `cuMemMapArrayAsync` entry maps or unmaps in its array.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Subresource {
    /// Whole tiles of a level (`CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL`): offsets and
    /// extents in elements (x, y, z).
    SparseLevel { level: u32, layer: u32, offset: [u32; 3], extent: [u32; 3] },
    /// Bytes of the mip tail (`CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL`).
    Miptail { layer: u32, offset: u64, size: u64 },
    /// A deferred-mapping array, whole (the driver ignores the subresource fields).
    Whole,
}

/// One `CUarrayMapInfo`, with the client's ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayMap {
    /// A sparse or deferred-mapping array, or with `mipmapped` such a mipmapped array.
    pub array: u64,
    pub mipmapped: bool,
    pub subresource: Subresource,
    /// `Some((physical allocation, offset in it))` maps (`CU_MEM_OPERATION_TYPE_MAP`); `None`
    /// unmaps.
    pub memory: Option<(u64, u64)>,
    /// `deviceBitMask` in the app's numbering: the session's device is device 0.
    pub device_mask: u32,
}

/// One `CUmemDecompressParams`: `src_len` compressed bytes at `src` decompressed into `dst`
/// (`dst_len`: the size expected, 0 if the app gave none), the size written going into the
/// 32-bit word at `dst_act_bytes`; `algo` is a `CUmemDecompressAlgorithm`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecompressOp {
    pub src: u64,
    pub src_len: u64,
    pub dst: u64,
    pub dst_len: u64,
    pub dst_act_bytes: u64,
    pub algo: u32,
}

/// `CUmemDecompressAlgorithm` values.
pub mod decompress_algorithm {
    pub const DEFLATE: u32 = 1 << 0;
    pub const SNAPPY: u32 = 1 << 1;
    pub const LZ4: u32 = 1 << 2;
}

impl ArrayDesc {
    /// Bytes per element (all channels), or `None` for a format Flyt does not serve.
    pub fn element_size(&self) -> Option<u64> {
        use array_format::*;
        let channel = match self.format {
            UNSIGNED_INT8 | SIGNED_INT8 => 1,
            UNSIGNED_INT16 | SIGNED_INT16 | HALF => 2,
            UNSIGNED_INT32 | SIGNED_INT32 | FLOAT => 4,
            _ => return None,
        };
        matches!(self.channels, 1 | 2 | 4).then_some(channel * u64::from(self.channels))
    }

    /// Width in bytes, rows and slices (layers, cube faces) as copies address them.
    pub fn extent(&self) -> Option<(u64, u64, u64)> {
        Some((self.width.checked_mul(self.element_size()?)?, self.height.max(1), self.depth.max(1)))
    }

    /// Whether the format is planar (`cuArrayGetPlane` names its planes).
    pub fn is_planar(&self) -> bool {
        self.format == array_format::NV12
    }

    /// The descriptors of a planar array's planes as CUDA documents them: for NV12 a luma plane
    /// of the array's size, one 8-bit channel, and a chroma plane of half its width and height
    /// (rounded up, as 4:2:0 chroma is), two 8-bit channels; `None` for other formats. The
    /// planes keep the array's flags.
    pub fn planes(&self) -> Option<[Self; 2]> {
        if !self.is_planar() {
            return None;
        }
        let luma = Self { format: array_format::UNSIGNED_INT8, channels: 1, ..*self };
        let chroma = Self { width: self.width.div_ceil(2), height: self.height.div_ceil(2), channels: 2, ..luma };
        Some([luma, chroma])
    }

    /// Whether the array's memory is mapped by `cuMemMapArrayAsync` (sparse or deferred mapping)
    /// rather than its own.
    pub fn is_mapped_later(&self) -> bool {
        self.flags & (array_flags::SPARSE | array_flags::DEFERRED_MAPPING) != 0
    }

    /// Layers (or cube faces) of a layered or cubemap array; 0 for other arrays.
    pub fn layers(&self) -> u64 {
        if self.flags & (array_flags::LAYERED | array_flags::CUBEMAP) != 0 { self.depth.max(1) } else { 0 }
    }

    /// The bytes of the array's elements, packed, over `levels` mipmap levels (planes summed),
    /// or `None` for a format Flyt does not serve or on overflow.
    pub fn packed_bytes(&self, levels: u32) -> Option<u64> {
        if let Some(planes) = self.planes() {
            return planes.iter().try_fold(0u64, |total, plane| total.checked_add(plane.packed_bytes(levels)?));
        }
        (0..levels.max(1)).try_fold(0u64, |total, level| {
            let (width, height, depth) = self.level(level).extent()?;
            total.checked_add(width.checked_mul(height)?.checked_mul(depth)?)
        })
    }

    /// The descriptor of mipmap level `level`: each dimension halves, down to 1 (layers and
    /// cube faces stay).
    pub fn level(&self, level: u32) -> Self {
        let shrink = |size: u64| if size == 0 { 0 } else { (size >> level.min(63)).max(1) };
        let layered = self.flags & (array_flags::LAYERED | array_flags::CUBEMAP) != 0;
        Self {
            width: shrink(self.width),
            height: shrink(self.height),
            depth: if layered { self.depth } else { shrink(self.depth) },
            ..*self
        }
    }
}

/// What a texture reads (`CUDA_RESOURCE_DESC`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Resource {
    Array { array: u64 },
    Mipmapped { array: u64 },
    Linear { ptr: u64, format: u32, channels: u32, size: u64 },
    Pitch2d { ptr: u64, format: u32, channels: u32, width: u64, height: u64, pitch: u64 },
}

/// `CUDA_TEXTURE_DESC`, field by field (floats as their bits).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TextureDesc {
    pub address_mode: [u32; 3],
    pub filter_mode: u32,
    pub flags: u32,
    pub max_anisotropy: u32,
    pub mipmap_filter_mode: u32,
    pub mipmap_level_bias: u32,
    pub min_mipmap_level_clamp: u32,
    pub max_mipmap_level_clamp: u32,
    pub border_color: [u32; 4],
}

/// `CUDA_RESOURCE_VIEW_DESC`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewDesc {
    pub format: u32,
    pub width: u64,
    pub height: u64,
    pub depth: u64,
    pub first_mipmap_level: u32,
    pub last_mipmap_level: u32,
    pub first_layer: u32,
    pub last_layer: u32,
}

/// What a graph node does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeParams {
    Empty,
    Kernel {
        function: FunctionRef,
        grid: Dim3,
        block: Dim3,
        shared_mem: u32,
        args: Vec<u8>,
    },
    Memcpy(Copy3d),
    Memset(Memset2d),
    /// A child graph node: a copy of `graph` (the client's id).
    Child {
        graph: u64,
    },
    EventRecord {
        event: u64,
    },
    EventWait {
        event: u64,
    },
    /// The app's host function `call` (see `LaunchHostFunc`).
    Host {
        call: u64,
    },
    /// `cuGraphAddMemAllocNode` on the session's device: `size` bytes, and the flags of an
    /// access descriptor for that device if the app gave one.
    MemAlloc {
        size: u64,
        access: Option<u32>,
    },
    /// `cuGraphAddMemFreeNode`.
    MemFree {
        ptr: u64,
    },
    /// A conditional node (`CU_GRAPH_COND_TYPE_*` `kind`) on the driver's `handle`; the
    /// driver makes `size` body graphs, named `bodies` (the client's ids).
    Conditional {
        handle: u64,
        kind: u32,
        size: u32,
        bodies: Vec<u64>,
    },
    /// `cuGraphAddBatchMemOpNode`: the operations of a `cuStreamBatchMemOp`, in order (v2 flags).
    BatchMemOp {
        ops: Vec<StreamMemOp>,
    },
    /// A copy node between device memory and the app's host memory: the server copies through
    /// staging of its own and asks the client for, or sends it, the host bytes when it runs.
    HostMemcpy(HostCopy),
}

/// A copy between device memory and the app's host memory, as a graph runs it: `copy`'s
/// device side is the session's memory, its host side the app's address (never read here).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostCopy {
    pub copy: Copy3d,
    /// Device to host (`copy.dst` is the host side), else host to device (`copy.src` is).
    pub to_host: bool,
}

impl HostCopy {
    /// The host side: the app's rows, as `HostBox`.
    pub fn host_box(&self) -> HostBox {
        let c = &self.copy;
        let (ptr, pitch, height) = if self.to_host { (c.dst, c.dst_pitch, c.dst_height) } else { (c.src, c.src_pitch, c.src_height) };
        HostBox { ptr, pitch, height, width: c.width, rows: c.height, depth: c.depth }
    }

    /// The bytes of the box, packed (`None` on overflow).
    pub fn packed_len(&self) -> Option<u64> {
        self.copy.width.checked_mul(self.copy.height)?.checked_mul(self.copy.depth)
    }
}

/// Rows of the app's host memory a graph's host copy writes or reads: `depth` slices of `rows`
/// rows of `width` bytes, rows `pitch` apart and slices `pitch * height` apart, from `ptr`.
/// Travels packed (rows back to back).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostBox {
    pub ptr: u64,
    pub pitch: u64,
    pub height: u64,
    pub width: u64,
    pub rows: u64,
    pub depth: u64,
}

impl HostBox {
    /// The address of each row in order (`None` on overflow).
    pub fn row_addresses(&self) -> Option<Vec<u64>> {
        let mut rows = Vec::new();
        for z in 0..self.depth {
            let slice = z.checked_mul(self.pitch)?.checked_mul(self.height)?;
            for y in 0..self.rows {
                rows.push(self.ptr.checked_add(slice.checked_add(y.checked_mul(self.pitch)?)?)?);
            }
        }
        Some(rows)
    }
}

impl NodeParams {
    /// The `CUgraphNodeType` of a node with these parameters.
    pub fn kind(&self) -> u32 {
        match self {
            Self::Empty => node_type::EMPTY,
            Self::Kernel { .. } => node_type::KERNEL,
            Self::Memcpy(_) => node_type::MEMCPY,
            Self::Memset(_) => node_type::MEMSET,
            Self::Child { .. } => node_type::GRAPH,
            Self::EventRecord { .. } => node_type::EVENT_RECORD,
            Self::EventWait { .. } => node_type::WAIT_EVENT,
            Self::Host { .. } => node_type::HOST,
            Self::MemAlloc { .. } => node_type::MEM_ALLOC,
            Self::MemFree { .. } => node_type::MEM_FREE,
            Self::Conditional { .. } => node_type::CONDITIONAL,
            Self::BatchMemOp { .. } => node_type::BATCH_MEM_OP,
            Self::HostMemcpy(_) => node_type::MEMCPY,
        }
    }
}

/// Module images at least this long are offered to the server's image cache by digest before
/// their bytes are sent; shorter ones cost less to send than the round trip a miss would add.
pub const CACHED_IMAGE_MIN: usize = 16 << 10;

/// The digest a module image is cached under: its SHA-256. The server computes it itself from
/// the bytes it receives, so a client cannot file bytes under another image's digest.
pub fn image_digest(image: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(image).into()
}

/// One kernel parameter as the driver lays it out (`cuFuncGetParamInfo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamInfo {
    pub offset: u32,
    pub size: u32,
}

/// `cudaFuncAttributes`, field by field.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FuncAttributes {
    pub shared_size_bytes: u64,
    pub const_size_bytes: u64,
    pub local_size_bytes: u64,
    pub max_threads_per_block: i32,
    pub num_regs: i32,
    pub ptx_version: i32,
    pub binary_version: i32,
    pub cache_mode_ca: i32,
    pub max_dynamic_shared_size_bytes: i32,
    pub preferred_shmem_carveout: i32,
    pub cluster_dim_must_be_set: i32,
    pub required_cluster_width: i32,
    pub required_cluster_height: i32,
    pub required_cluster_depth: i32,
    pub cluster_scheduling_policy_preference: i32,
    pub non_portable_cluster_size_allowed: i32,
}

/// How the shim treats an op's reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpClass {
    /// Nothing comes back; a failure becomes the session's deferred error.
    NoReply,
    /// A reply comes back.
    Reply,
    /// A reply comes back and delivers any deferred error.
    SyncPoint,
}

/// Where an op's raw bulk bytes travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BulkDirection {
    None,
    /// With the request.
    In,
    /// With the reply.
    Out,
}

/// What the table says about one op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpInfo {
    pub id: u16,
    pub name: &'static str,
    pub class: OpClass,
    pub bulk: BulkDirection,
}

/// A request type and what its op is.
pub trait Op: Serialize + serde::de::DeserializeOwned + Into<Request> {
    /// The reply's fields.
    type Reply: Serialize + serde::de::DeserializeOwned;
    /// The table row.
    const INFO: OpInfo;
}

#[doc(hidden)]
#[macro_export]
macro_rules! op_class {
    (noreply) => {
        $crate::ops::OpClass::NoReply
    };
    (reply) => {
        $crate::ops::OpClass::Reply
    };
    (sync_point) => {
        $crate::ops::OpClass::SyncPoint
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! op_bulk {
    (-) => {
        $crate::ops::BulkDirection::None
    };
    (bulk_in) => {
        $crate::ops::BulkDirection::In
    };
    (bulk_out) => {
        $crate::ops::BulkDirection::Out
    };
}

macro_rules! define_ops {
    ($(
        $(#[$doc:meta])*
        $id:literal $name:ident $method:ident [$class:ident $bulk:tt]
        { $($req_field:ident : $req_ty:ty),* $(,)? } -> { $($rep_field:ident : $rep_ty:ty),* $(,)? };
    )*) => {
        /// Request fields, one struct per op.
        pub mod req {
            #[allow(unused_imports, reason = "not every row uses every type")]
            use super::*;
            $(
                $(#[$doc])*
                #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
                pub struct $name { $(pub $req_field: $req_ty),* }

                impl Op for $name {
                    type Reply = super::rep::$name;
                    const INFO: OpInfo = OpInfo {
                        id: $id,
                        name: stringify!($name),
                        class: $crate::op_class!($class),
                        bulk: $crate::op_bulk!($bulk),
                    };
                }

                impl From<$name> for Request {
                    fn from(request: $name) -> Request {
                        Request::$name(request)
                    }
                }
            )*
        }

        /// Reply fields, one struct per op.
        pub mod rep {
            #[allow(unused_imports, reason = "not every row uses every type")]
            use super::*;
            $(
                #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
                pub struct $name { $(pub $rep_field: $rep_ty),* }
            )*
        }

        /// Every request, as it travels.
        #[derive(Clone, Debug, PartialEq)]
        pub enum Request {
            $($name(req::$name),)*
        }

        /// The whole table, in id order.
        pub const OPS: &[OpInfo] = &[$(<req::$name as Op>::INFO,)*];

        impl Request {
            /// The op's table row.
            pub fn info(&self) -> OpInfo {
                match self {
                    $(Request::$name(_) => <req::$name as Op>::INFO,)*
                }
            }

            /// Appends `u16 id` then the postcard fields.
            pub fn encode(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.info().id.to_le_bytes());
                match self {
                    $(Request::$name(fields) => encode_into(fields, out),)*
                }
            }

            /// Decodes a whole request message; an unknown id or any leftover byte is an error.
            pub fn decode(bytes: &[u8]) -> Result<Self, FrameError> {
                let (id, fields) = match bytes {
                    [low, high, fields @ ..] => (u16::from_le_bytes([*low, *high]), fields),
                    _ => return Err(FrameError::Decode("message shorter than an op id".into())),
                };
                match id {
                    $($id => Ok(Request::$name(decode_exact(fields)?)),)*
                    unknown => Err(FrameError::Decode(format!("unknown op id {unknown}"))),
                }
            }
        }
    };
}

for_each_op!(define_ops);

/// Encodes a reply message: `u32 status | u32 deferred error | fields (only when status is 0)`.
pub fn encode_reply<T: Serialize>(result: Result<&T, CudaError>, deferred: Option<CudaError>, out: &mut Vec<u8>) {
    let status = result.err().map_or(0, CudaError::code);
    out.extend_from_slice(&status.to_le_bytes());
    out.extend_from_slice(&deferred.map_or(0, CudaError::code).to_le_bytes());
    if let Ok(fields) = result {
        encode_into(fields, out);
    }
}

/// A decoded reply: the op's own result and any deferred error it delivers.
#[derive(Debug, PartialEq)]
pub struct Reply<T> {
    pub result: Result<T, CudaError>,
    pub deferred: Option<CudaError>,
}

/// Decodes a reply message for a known op.
pub fn decode_reply<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<Reply<T>, FrameError> {
    let (status, deferred, fields) = split_reply(bytes)?;
    let result = match status {
        0 => Ok(decode_exact(fields)?),
        code => Err(CudaError::from_code(code)),
    };
    Ok(Reply { result, deferred })
}

/// Splits a reply message into status, deferred error and encoded fields.
pub fn split_reply(bytes: &[u8]) -> Result<(u32, Option<CudaError>, &[u8]), FrameError> {
    if bytes.len() < 8 {
        return Err(FrameError::Decode("reply shorter than its status words".into()));
    }
    let (words, fields) = bytes.split_at(8);
    let status = u32::from_le_bytes([words[0], words[1], words[2], words[3]]);
    let deferred = u32::from_le_bytes([words[4], words[5], words[6], words[7]]);
    Ok((status, CudaError::check(deferred).err(), fields))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn each_device_has_its_own_default_pool_id_and_none_is_a_pool_the_client_makes() {
        assert_eq!(default_pool_of(0), DEFAULT_POOL);
        let ids: Vec<u64> = (0..8).map(default_pool_of).collect();
        assert!(ids.iter().enumerate().all(|(at, id)| !ids[..at].contains(id)), "distinct: {ids:?}");
        for device in [0, 1, 7, u32::MAX] {
            assert_eq!(default_pool_device(default_pool_of(device)), Some(device));
        }
        for made in [0, 2, 3, 1 << 20, OTHER_DEFAULT_POOLS] {
            assert_eq!(default_pool_device(made), None, "pool id {made}");
        }
    }

    /// The driver's 48-byte form: where each field sits (as `cuda.h` lays out
    /// `CUstreamBatchMemOpParams`), and back again.
    #[test]
    fn memory_operations_take_the_driver_layout_and_come_back() {
        let write = StreamMemOp { kind: mem_op::WRITE_VALUE_32, address: 0x7f00_0000_1000, value: 0xdead_beef_0000_0042, flags: 0 };
        let words = write.driver_words();
        assert_eq!(words, [2, 0x7f00_0000_1000, 0x42, 0, 0, 0], "a 32-bit value keeps its low word only");
        assert_eq!(StreamMemOp::from_driver_words(&words), StreamMemOp { value: 0x42, ..write });
        let wait = StreamMemOp { kind: mem_op::WAIT_VALUE_64, address: 0x1000, value: u64::MAX - 1, flags: mem_op::WAIT_NOR };
        assert_eq!(wait.driver_words(), [4, 0x1000, u64::MAX - 1, 3, 0, 0]);
        assert_eq!(StreamMemOp::from_driver_words(&wait.driver_words()), wait);
        // Barriers and flushes are `{ operation, flags }` in the first word.
        let barrier = StreamMemOp { kind: mem_op::BARRIER, address: 0, value: 0, flags: mem_op::BARRIER_GPU };
        assert_eq!(barrier.driver_words(), [6 | (1 << 32), 0, 0, 0, 0, 0]);
        assert_eq!(StreamMemOp::from_driver_words(&barrier.driver_words()), barrier);
        // A 32-bit write read from the driver ignores the union's high bytes there.
        assert_eq!(StreamMemOp::from_driver_words(&[2, 0x2000, 0xffff_ffff_0000_0007, 0, 0, 0]).value, 7);
    }

    proptest! {
        #[test]
        fn every_operation_survives_the_driver_layout(kind in 1u32..=6, address: u64, value: u64, flags in 0u32..4) {
            let mut op = StreamMemOp { kind, address, value, flags };
            if op.width().is_none() {
                op.address = 0;
                op.value = 0;
            } else if op.width() == Some(4) {
                op.value &= u64::from(u32::MAX);
            }
            prop_assert_eq!(StreamMemOp::from_driver_words(&op.driver_words()), op);
        }
    }

    #[test]
    fn stream_waits_compare_as_the_driver_documents() {
        let wait = |kind, value, flags| StreamMemOp { kind, address: 0, value, flags };
        // GEQ is cyclic: (int32_t)(*addr - value) >= 0.
        assert!(wait(mem_op::WAIT_VALUE_32, 5, mem_op::WAIT_GEQ).wait_satisfied(5));
        assert!(!wait(mem_op::WAIT_VALUE_32, 6, mem_op::WAIT_GEQ).wait_satisfied(5));
        assert!(wait(mem_op::WAIT_VALUE_32, 0xffff_fff0, mem_op::WAIT_GEQ).wait_satisfied(3), "wraps around");
        assert!(wait(mem_op::WAIT_VALUE_64, u64::MAX - 1, mem_op::WAIT_GEQ).wait_satisfied(1));
        // 32-bit ops look at the low word only.
        assert!(wait(mem_op::WAIT_VALUE_32, 7, mem_op::WAIT_EQ).wait_satisfied(0xdead_0000_0000_0007));
        assert!(wait(mem_op::WAIT_VALUE_32, 0b100, mem_op::WAIT_AND).wait_satisfied(0b110));
        assert!(!wait(mem_op::WAIT_VALUE_32, 0b001, mem_op::WAIT_AND).wait_satisfied(0b110));
        // NOR: ~(*addr | value) != 0, within the op's width.
        assert!(wait(mem_op::WAIT_VALUE_32, 0xffff_0000, mem_op::WAIT_NOR).wait_satisfied(0));
        assert!(!wait(mem_op::WAIT_VALUE_32, 0xffff_0000, mem_op::WAIT_NOR).wait_satisfied(0x0000_ffff));
        assert!(wait(mem_op::WAIT_VALUE_64, 0xffff_0000, mem_op::WAIT_NOR).wait_satisfied(0x0000_ffff), "the high word is free");
    }

    #[test]
    fn a_tensor_spans_its_last_element() {
        let tiled = |data_type, dims: Vec<u64>, strides: Vec<u64>| TensorMapParams {
            data_type,
            rank: dims.len() as u32,
            dims,
            strides,
            ..TensorMapParams::default()
        };
        // 16 floats per row, rows 64 bytes apart: the last row ends 15 * 64 + 64 bytes in.
        assert_eq!(tiled(7, vec![16, 16], vec![64]).global_span(), Some(1024));
        assert_eq!(tiled(0, vec![100], vec![]).global_span(), Some(100));
        assert_eq!(tiled(13, vec![17], vec![]).global_span(), Some(16), "two packs of 16 4-bit elements");
        assert_eq!(tiled(7, vec![16, 16], vec![]).global_span(), None, "a stride missing");
        assert_eq!(tiled(99, vec![16], vec![]).global_span(), None, "an unknown type");
        assert_eq!(tiled(7, vec![16, 0], vec![64]).global_span(), None, "an empty dimension");
        assert_eq!(tiled(7, vec![1; 6], vec![1; 5]).global_span(), None, "rank 6");
        assert_eq!(tiled(8, vec![u64::MAX, 2], vec![8]).global_span(), None, "overflow");
    }

    #[test]
    fn an_nv12_array_has_a_luma_and_a_half_size_chroma_plane() {
        let nv12 = ArrayDesc { width: 64, height: 31, depth: 0, format: array_format::NV12, channels: 3, flags: array_flags::SURFACE_LDST };
        let [luma, chroma] = nv12.planes().expect("planar");
        assert_eq!((luma.width, luma.height, luma.format, luma.channels), (64, 31, array_format::UNSIGNED_INT8, 1));
        assert_eq!((chroma.width, chroma.height, chroma.format, chroma.channels), (32, 16, array_format::UNSIGNED_INT8, 2));
        assert_eq!(chroma.flags, array_flags::SURFACE_LDST, "planes keep the array's flags");
        assert_eq!(nv12.element_size(), None, "the array itself is copied plane by plane");
        assert_eq!(nv12.packed_bytes(1), Some(64 * 31 + 32 * 16 * 2));
        let float = ArrayDesc { width: 8, height: 8, depth: 0, format: array_format::FLOAT, channels: 1, flags: 0 };
        assert_eq!(float.planes(), None);
        assert_eq!(float.packed_bytes(3), Some(256 + 64 + 16), "three levels");
        assert_eq!(ArrayDesc { format: 0x91, ..float }.packed_bytes(1), None);
        assert!(ArrayDesc { flags: array_flags::SPARSE, ..float }.is_mapped_later());
        assert_eq!(ArrayDesc { depth: 6, flags: array_flags::CUBEMAP, ..float }.layers(), 6);
        assert_eq!(ArrayDesc { depth: 6, ..float }.layers(), 0);
    }

    #[test]
    fn ids_are_unique_and_ascending() {
        assert!(OPS.windows(2).all(|pair| pair[0].id < pair[1].id), "{OPS:?}");
    }

    #[test]
    fn every_bulk_in_op_is_a_request_with_bulk() {
        let bulk_in: Vec<_> = OPS.iter().filter(|op| op.bulk == BulkDirection::In).map(|op| op.name).collect();
        assert_eq!(bulk_in, ["MemcpyHtoD", "RegisterModule", "LinkAdd", "MemcpyHtoShaped", "HostCopyDone"]);
    }

    fn sample_requests() -> Vec<Request> {
        vec![
            req::Malloc { size: 1 << 20 }.into(),
            req::MemcpyDtoH { src: 0x7f00_0000_1000, len: 4096, stream: 17, blocking: false }.into(),
            req::RegisterModule { module: 3, cached: Some([7; 32]) }.into(),
            req::Launch {
                function: FunctionRef { module: 3, index: 0 },
                grid: Dim3 { x: 4, y: 1, z: 1 },
                block: Dim3 { x: 256, y: 1, z: 1 },
                shared_mem: 0,
                stream: 0,
                args: vec![1, 2, 3, 4, 5, 6, 7, 8],
                attributes: vec![LaunchAttribute { id: 4, value: [2, 1, 1, 0] }],
            }
            .into(),
            req::DeviceSynchronize {}.into(),
            req::MemMapArray {
                maps: vec![
                    ArrayMap {
                        array: 0xA_0000_0001,
                        mipmapped: false,
                        subresource: Subresource::SparseLevel { level: 0, layer: 0, offset: [128, 0, 0], extent: [128, 128, 1] },
                        memory: Some((3, 64 << 10)),
                        device_mask: 1,
                    },
                    ArrayMap {
                        array: 9,
                        mipmapped: true,
                        subresource: Subresource::Miptail { layer: 0, offset: 0, size: 65536 },
                        memory: None,
                        device_mask: 1,
                    },
                ],
                stream: 0,
            }
            .into(),
            req::MemBatchDecompress {
                ops: vec![DecompressOp {
                    src: 0x1000,
                    src_len: 100,
                    dst: 0x2000,
                    dst_len: 0,
                    dst_act_bytes: 0x3000,
                    algo: decompress_algorithm::LZ4,
                }],
                stream: 5,
            }
            .into(),
            req::DevResourceSplit { input: 9, groups: Some(4), flags: dev_resource::SPLIT_IGNORE_SM_COSCHEDULING, min_count: 8 }.into(),
            req::GreenStreamCreate { green: 2, stream: 0x5_0000_0003, flags: 1, priority: -1 }.into(),
        ]
    }

    #[test]
    fn requests_round_trip() {
        for request in sample_requests() {
            let mut bytes = Vec::new();
            request.encode(&mut bytes);
            assert_eq!(Request::decode(&bytes).unwrap(), request);
        }
    }

    #[test]
    fn unknown_ids_and_short_messages_are_errors() {
        assert!(Request::decode(&[]).is_err());
        assert!(Request::decode(&[0xff, 0xff]).is_err());
        let mut bytes = Vec::new();
        Request::from(req::Free { ptr: 5 }).encode(&mut bytes);
        bytes.push(9);
        assert!(Request::decode(&bytes).is_err());
    }

    #[test]
    fn replies_round_trip_with_deferred_errors() {
        let mut bytes = Vec::new();
        encode_reply(Ok(&rep::Malloc { ptr: 0x1000 }), Some(CudaError::LAUNCH_FAILURE), &mut bytes);
        let reply: Reply<rep::Malloc> = decode_reply(&bytes).unwrap();
        assert_eq!(reply.result, Ok(rep::Malloc { ptr: 0x1000 }));
        assert_eq!(reply.deferred, Some(CudaError::LAUNCH_FAILURE));

        bytes.clear();
        encode_reply::<rep::Malloc>(Err(CudaError::MEMORY_ALLOCATION), None, &mut bytes);
        let reply: Reply<rep::Malloc> = decode_reply(&bytes).unwrap();
        assert_eq!(reply.result, Err(CudaError::MEMORY_ALLOCATION));
        assert_eq!(reply.deferred, None);
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = Request::decode(&bytes);
            let _ = decode_reply::<rep::RegisterModule>(&bytes);
        }

        #[test]
        fn launches_round_trip(module in any::<u32>(), index in any::<u32>(), grid in any::<[u32; 3]>(),
                               args in proptest::collection::vec(any::<u8>(), 0..512), stream in any::<u64>()) {
            let request: Request = req::Launch {
                function: FunctionRef { module, index },
                grid: Dim3 { x: grid[0], y: grid[1], z: grid[2] },
                block: Dim3 { x: 1, y: 1, z: 1 },
                shared_mem: 0,
                stream,
                args,
                attributes: Vec::new(),
            }.into();
            let mut bytes = Vec::new();
            request.encode(&mut bytes);
            prop_assert_eq!(Request::decode(&bytes).unwrap(), request);
        }
    }
}
