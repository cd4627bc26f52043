//! Graphs, stream capture and host functions on the client side. Graphs, nodes and executable
//! graphs are named by ids this process chooses (the app's handles are those ids), so building
//! and launching cost no round trip beyond the driver's own answers. Host functions run here, in
//! the app's process, when the server says a stream reached one.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Condvar, Mutex, OnceLock};

use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{CaptureInfo, HostBox, capture_status, req};

use crate::IdMap;
use crate::client::Client;

/// An app function a stream or graph runs.
#[derive(Clone, Copy)]
pub enum HostFunction {
    /// `cuLaunchHostFunc`, a host node: `fn(user_data)`.
    Plain { function: unsafe extern "C" fn(*mut std::ffi::c_void), user_data: usize },
    /// `cuStreamAddCallback`: `fn(stream, CUDA_SUCCESS, user_data)`.
    StreamCallback { function: unsafe extern "C" fn(*mut std::ffi::c_void, u32, *mut std::ffi::c_void), stream: usize, user_data: usize },
}

/// What the host-function thread does, in the order the server asked.
pub enum HostJob {
    /// Runs the app's function `call`.
    Call { call: u64, run: u64 },
    /// A graph's device-to-host copy: writes `bytes` (packed) at the app's `host` rows.
    CopyOut { run: u64, host: HostBox, bytes: Vec<u8> },
    /// A graph's host-to-device copy: reads the app's `host` rows and sends them.
    CopyIn { run: u64, host: HostBox },
}

struct Registered {
    function: HostFunction,
    /// Runs once (a launched host function), or for every launch of a graph that holds it.
    once: bool,
}

/// The session's graph bookkeeping.
#[derive(Default)]
pub struct Graphs {
    next_id: AtomicU64,
    /// Captures begun by this process and not yet ended.
    active_captures: AtomicUsize,
    /// Origin stream of each active capture.
    captures: Mutex<IdMap<u64, u64>>,
    /// Each active capture's beginning thread (`thread_token`) and capture mode: which calls of
    /// which app thread the driver would prohibit (see `Client::capture_mode_for_thread`).
    capture_owners: Mutex<IdMap<u64, (u64, u32)>>,
    /// Host-function nodes each executable graph runs per launch.
    exec_host_nodes: Mutex<IdMap<u64, u32>>,
    /// Node types, as added or as the server listed them.
    node_kinds: Mutex<IdMap<u64, u32>>,
    /// `(clone, original node)` to the clone's node.
    clones: Mutex<HashMap<(u64, u64), u64>>,
    host_functions: Mutex<IdMap<u64, Registered>>,
    /// Addresses of graph memory (allocation nodes, allocations made in a capture): the app may
    /// free them outside their graph after each launch, any number of times.
    memory: Mutex<HashSet<u64>>,
    /// Jobs with the first session device of the server that asked (answered there).
    runner: OnceLock<Mutex<Sender<(HostJob, u32)>>>,
    /// Host functions that streams will reach and that have not returned yet.
    outstanding: AtomicUsize,
    /// Held to wait for `outstanding` to reach zero.
    returned_lock: Mutex<()>,
    returned: Condvar,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

thread_local! {
    /// Set on the thread that runs the app's host functions: CUDA calls are not permitted there.
    static IN_HOST_FUNCTION: Cell<bool> = const { Cell::new(false) };
    /// This app thread's capture interaction mode (`cuThreadExchangeStreamCaptureMode`).
    static THREAD_CAPTURE_MODE: Cell<u32> = const { Cell::new(CAPTURE_MODE_GLOBAL) };
    /// A number naming this app thread while it lives.
    static THREAD_TOKEN: Cell<u64> = const { Cell::new(0) };
}

/// `CU_STREAM_CAPTURE_MODE_GLOBAL`, `CU_STREAM_CAPTURE_MODE_RELAXED`.
const CAPTURE_MODE_GLOBAL: u32 = 0;
const CAPTURE_MODE_RELAXED: u32 = 2;

/// The calling thread's capture interaction mode, as it last set it.
pub fn thread_capture_mode() -> u32 {
    THREAD_CAPTURE_MODE.try_with(Cell::get).unwrap_or(CAPTURE_MODE_GLOBAL)
}

/// Sets the calling thread's capture interaction mode; the previous one.
pub fn set_thread_capture_mode(mode: u32) -> u32 {
    THREAD_CAPTURE_MODE.try_with(|cell| cell.replace(mode)).unwrap_or(CAPTURE_MODE_GLOBAL)
}

fn thread_token() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    THREAD_TOKEN
        .try_with(|token| {
            if token.get() == 0 {
                token.set(NEXT.fetch_add(1, Ordering::Relaxed));
            }
            token.get()
        })
        .unwrap_or(0)
}

/// Whether the calling thread is running an app host function (where the driver permits no
/// CUDA call).
pub fn in_host_function() -> bool {
    IN_HOST_FUNCTION.try_with(Cell::get).unwrap_or(false)
}

impl Graphs {
    /// A fresh id for a graph, node or executable graph (never 0, never a server node id).
    pub fn new_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub fn any_capture(&self) -> bool {
        self.active_captures.load(Ordering::Acquire) > 0
    }

    /// Records graph memory at `ptr` (kept while the session lives: the server refuses a free
    /// of memory whose graph is gone).
    pub fn note_memory(&self, ptr: u64) {
        lock(&self.memory).insert(ptr);
    }

    pub fn is_memory(&self, ptr: u64) -> bool {
        lock(&self.memory).contains(&ptr)
    }

    pub fn node_kind(&self, node: u64) -> Option<u32> {
        lock(&self.node_kinds).get(&node).copied()
    }

    pub fn note_nodes(&self, nodes: impl IntoIterator<Item = (u64, u32)>) {
        lock(&self.node_kinds).extend(nodes);
    }

    pub fn forget_node(&self, node: u64) {
        lock(&self.node_kinds).remove(&node);
    }

    pub fn note_clone(&self, clone: u64, pairs: &[(u64, u64)]) {
        let mut clones = lock(&self.clones);
        let mut kinds = lock(&self.node_kinds);
        for (original, copy) in pairs {
            clones.insert((clone, *original), *copy);
            if let Some(kind) = kinds.get(original).copied() {
                kinds.insert(*copy, kind);
            }
        }
    }

    pub fn node_in_clone(&self, clone: u64, original: u64) -> Option<u64> {
        lock(&self.clones).get(&(clone, original)).copied()
    }

    pub fn set_exec_host_nodes(&self, exec: u64, count: u32) {
        lock(&self.exec_host_nodes).insert(exec, count);
    }

    pub fn forget_exec(&self, exec: u64) {
        lock(&self.exec_host_nodes).remove(&exec);
    }

    fn exec_host_nodes(&self, exec: u64) -> u32 {
        lock(&self.exec_host_nodes).get(&exec).copied().unwrap_or(0)
    }

    fn add_outstanding(&self, count: usize) {
        self.outstanding.fetch_add(count, Ordering::AcqRel);
    }

    fn one_returned(&self) {
        let _guard = lock(&self.returned_lock);
        let left = self.outstanding.fetch_update(Ordering::AcqRel, Ordering::Acquire, |count| Some(count.saturating_sub(1)));
        if left.is_ok_and(|before| before <= 1) {
            self.returned.notify_all();
        }
    }

    /// Whether some host function a stream will reach has not returned yet (one load: every
    /// asynchronous copy over a socket asks).
    pub fn host_functions_pending(&self) -> bool {
        self.outstanding.load(Ordering::Acquire) > 0
    }

    /// Waits until every host function that streams will reach has returned. A stream-ordered
    /// copy from pinned memory reads that memory when its stream reaches it, after any host
    /// function before it, which may write it; over a socket the bytes travel at the call, so
    /// such a copy is read only once those functions have run.
    pub fn wait_for_host_functions(&self) {
        let mut guard = lock(&self.returned_lock);
        while self.host_functions_pending() {
            guard = self.returned.wait(guard).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// The app function registered as `call` (a host node's, for its parameters).
    pub fn host_function(&self, call: u64) -> Option<HostFunction> {
        lock(&self.host_functions).get(&call).map(|registered| registered.function)
    }

    /// Registers an app function; its id goes to the server.
    pub fn register(&self, function: HostFunction, once: bool) -> u64 {
        let id = self.new_id();
        lock(&self.host_functions).insert(id, Registered { function, once });
        id
    }
}

/// Where `cuStreamBeginCaptureToGraph` records: the app's graph, the first captured work
/// following `dependencies` (nodes of it), with `data` for each (from port, to port, type) or
/// none at all (plain full dependencies).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CaptureInto {
    pub graph: u64,
    pub dependencies: Vec<u64>,
    pub data: Vec<[u8; 3]>,
}

impl Client {
    /// Begins a capture of `stream` into a new graph, or into an existing one after some of its
    /// nodes, with their edge data (none, or one entry each: from port, to port, type) (`into`);
    /// the graph's id.
    pub fn begin_capture(&self, stream: u64, mode: u32, thread_mode: u32, into: Option<CaptureInto>) -> CudaResult<u64> {
        let (graph, dependencies, data, into) = match into {
            Some(CaptureInto { graph, dependencies, data }) => (graph, dependencies, data, true),
            None => (self.graphs.new_id(), Vec::new(), Vec::new(), false),
        };
        self.call(req::StreamBeginCapture { stream, mode, thread_mode, graph, into, dependencies, data })?;
        lock(&self.graphs.capture_owners).insert(stream, (thread_token(), mode));
        lock(&self.graphs.captures).insert(stream, graph);
        self.graphs.active_captures.fetch_add(1, Ordering::AcqRel);
        Ok(graph)
    }

    /// Ends the capture `stream` began: the captured graph's id.
    pub fn end_capture(&self, stream: u64) -> CudaResult<u64> {
        let result = self.call(req::StreamEndCapture { stream }).map(|reply| reply.graph);
        // Ended (as a graph, or invalidated) unless the stream is still capturing.
        let still_capturing = result.is_err() && self.capture_info(stream).is_ok_and(|info| info.status != capture_status::NONE);
        if !still_capturing && lock(&self.graphs.captures).remove(&stream).is_some() {
            lock(&self.graphs.capture_owners).remove(&stream);
            self.graphs.active_captures.fetch_sub(1, Ordering::AcqRel);
        }
        result
    }

    /// A stream's capture: answered here while no capture is active, else by the server (which
    /// also knows the streams that joined a capture through events).
    pub fn capture_info(&self, stream: u64) -> CudaResult<CaptureInfo> {
        if !self.graphs.any_capture() {
            return Ok(CaptureInfo::default());
        }
        self.call(req::StreamCaptureInfo { stream }).map(|reply| reply.info)
    }

    /// `cuStreamUpdateCaptureDependencies_v2`: the capture's next work follows `dependencies`
    /// (`set`) or these as well, with their edge data (none, or one entry each).
    pub fn update_capture_dependencies(&self, stream: u64, dependencies: Vec<u64>, data: Vec<[u8; 3]>, set: bool) -> CudaResult<()> {
        self.call(req::StreamCaptureDependencies { stream, dependencies, data, set }).map(drop)
    }

    /// Tells the server the calling thread's capture interaction mode, which its checks of
    /// calls made during a capture follow.
    /// The capture interaction mode the server's session thread must run the calling app thread's
    /// requests in, while any capture is active (`None` otherwise). The session thread makes all
    /// of the session's calls, so it holds every app thread's captures: the app thread's own mode
    /// applies where the driver would apply it (the thread began a capture, or some capture was
    /// begun in global mode), and relaxed otherwise, where the driver prohibits nothing for this
    /// thread (another thread's thread-local capture, as XLA's command buffers are).
    pub fn capture_mode_for_thread(&self) -> Option<u32> {
        if !self.graphs.any_capture() {
            return None;
        }
        let (me, own) = (thread_token(), thread_capture_mode());
        let owners = lock(&self.graphs.capture_owners);
        let applies = owners.values().any(|(thread, mode)| *thread == me || *mode == CAPTURE_MODE_GLOBAL);
        Some(if applies { own } else { CAPTURE_MODE_RELAXED })
    }

    /// Launches an executable graph; the server will ask for its host-function nodes. A graph
    /// that holds user objects holds them for the launch too, until a host function queued after
    /// it on the stream lets them go (not when the launch is captured into another graph).
    pub fn launch_graph(&self, exec: u64, stream: u64) -> CudaResult<()> {
        let host_nodes = self.graphs.exec_host_nodes(exec);
        if host_nodes > 0 {
            self.start_host_runner()?;
            self.conn().expect_notices(host_nodes as usize);
        }
        self.push_mirrors()?;
        let objects = crate::user_objects::user_objects();
        let held = match self.capture_info(stream)?.status {
            capture_status::NONE => objects.launch_references(exec),
            _ => None,
        };
        let launched = self
            .conn()
            .send_async_with(&req::GraphLaunch { exec, stream }.into(), &[], || self.graphs.add_outstanding(host_nodes as usize));
        if let Some(token) = held {
            let release = HostFunction::Plain { function: crate::user_objects::launch_done, user_data: token as usize };
            if launched.is_err() {
                // Nothing runs that could use the objects: the references go now.
                objects.owner_gone(token);
            } else if self.launch_host_function(stream, release).is_err() {
                // The launch may still run: its references stay (a destructor that never runs
                // rather than one that runs too early).
                crate::diagnostics::once(
                    "user-object-launch",
                    "flyt: a graph launch's user object references could not be scheduled for release",
                );
            }
        }
        launched
    }

    /// `cuLaunchHostFunc`/`cuStreamAddCallback`: runs `function` here when `stream` reaches it.
    pub fn launch_host_function(&self, stream: u64, function: HostFunction) -> CudaResult<()> {
        // On the stream's server, whichever device is current (a spread session).
        self.on_handle_server(stream, || self.launch_host_function_here(stream, function))
    }

    fn launch_host_function_here(&self, stream: u64, function: HostFunction) -> CudaResult<()> {
        self.start_host_runner()?;
        let captured = self.capture_info(stream)?.status != capture_status::NONE;
        let call = self.graphs.register(function, !captured);
        if !captured {
            self.conn().expect_notices(1);
        }
        let outstanding = if captured { 0 } else { 1 };
        self.conn().send_async_with(&req::LaunchHostFunc { stream, call }.into(), &[], || self.graphs.add_outstanding(outstanding))
    }

    /// A host node's function (kept while the session lives: graphs may run it at any launch).
    pub fn host_node_function(&self, function: HostFunction) -> CudaResult<u64> {
        self.start_host_runner()?;
        Ok(self.graphs.register(function, false))
    }

    /// The server reached a host function or a graph's host copy: queues it for the runner
    /// thread, which runs them in the order they came.
    pub(crate) fn host_call_arrived(&self, job: HostJob, origin: u32) {
        let run = match &job {
            HostJob::Call { run, .. } | HostJob::CopyOut { run, .. } | HostJob::CopyIn { run, .. } => *run,
        };
        let sent = self.graphs.runner.get().is_some_and(|runner| lock(runner).send((job, origin)).is_ok());
        if !sent {
            // No runner: answer at once so the stream is not held forever (a host-to-device
            // copy's staging then stays as it was).
            let _ = self.conn_of(origin).send_host_call_done(&req::HostCallDone { run }.into(), &[], || {});
        }
    }

    fn start_host_runner(&self) -> CudaResult<()> {
        if self.graphs.runner.get().is_some() {
            return Ok(());
        }
        let (sender, receiver) = channel::<(HostJob, u32)>();
        if self.graphs.runner.set(Mutex::new(sender)).is_err() {
            return Ok(());
        }
        std::thread::Builder::new()
            .name("flyt-host-functions".into())
            .spawn(move || {
                IN_HOST_FUNCTION.with(|flag| flag.set(true));
                for (job, origin) in receiver {
                    let Some(client) = crate::client::existing_client() else { return };
                    let returned = || client.graphs.one_returned();
                    // Answered to the server that asked.
                    let asked = client.conn_of(origin);
                    let _ = match job {
                        HostJob::Call { call, run } => {
                            client.run_host_function(call);
                            asked.send_host_call_done(&req::HostCallDone { run }.into(), &[], returned)
                        }
                        HostJob::CopyOut { run, host, bytes } => {
                            write_host_rows(&host, &bytes);
                            asked.send_host_call_done(&req::HostCallDone { run }.into(), &[], returned)
                        }
                        HostJob::CopyIn { run, host } => {
                            let bytes = read_host_rows(&host);
                            asked.send_host_call_done(&req::HostCopyDone { run }.into(), &bytes, returned)
                        }
                    };
                }
            })
            .map_err(|_| flyt_protocol::CudaError::OPERATING_SYSTEM)?;
        Ok(())
    }

    /// Starts the thread that runs host functions and graph host copies (a graph with a copy
    /// node of host memory needs it before its first launch).
    pub fn ensure_host_runner(&self) -> CudaResult<()> {
        self.start_host_runner()
    }

    fn run_host_function(&self, call: u64) {
        let function = {
            let mut functions = lock(&self.graphs.host_functions);
            match functions.get(&call) {
                Some(registered) if registered.once => functions.remove(&call).map(|registered| registered.function),
                Some(registered) => Some(registered.function),
                None => None,
            }
        };
        let Some(function) = function else {
            crate::diagnostics::once("host-function", &format!("flyt: the server asked for an unknown host function {call}"));
            return;
        };
        // SAFETY: the app registered this function and its data with cuLaunchHostFunc,
        // cuStreamAddCallback or a host node; calling it here, once per time its stream or graph
        // reaches it, is that contract.
        unsafe {
            match function {
                HostFunction::Plain { function, user_data } => function(user_data as *mut std::ffi::c_void),
                HostFunction::StreamCallback { function, stream, user_data } => {
                    function(stream as *mut std::ffi::c_void, 0, user_data as *mut std::ffi::c_void)
                }
            }
        }
    }
}

/// Writes a graph's device-to-host copy into the app's memory, row by row (`bytes` packed).
fn write_host_rows(host: &HostBox, bytes: &[u8]) {
    let width = usize::try_from(host.width).unwrap_or(0);
    let Some(rows) = host.row_addresses() else { return };
    if width == 0 || rows.len().checked_mul(width) != Some(bytes.len()) {
        crate::diagnostics::once("graph-host-copy-size", "flyt: a graph's copy to host memory came with the wrong number of bytes");
        return;
    }
    for (row, piece) in rows.iter().zip(bytes.chunks_exact(width)) {
        // SAFETY: the app named these rows of its host memory in a copy node (or a captured
        // copy) as its destination; CUDA's contract is that they stay valid and writable while
        // the graph can run, and the node runs now.
        unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), std::ptr::with_exposed_provenance_mut::<u8>(*row as usize), width) };
    }
}

/// Reads the app's memory a graph's host-to-device copy takes, packed.
fn read_host_rows(host: &HostBox) -> Vec<u8> {
    let width = usize::try_from(host.width).unwrap_or(0);
    let Some(rows) = host.row_addresses() else { return Vec::new() };
    let mut bytes = Vec::with_capacity(rows.len().saturating_mul(width));
    for row in rows {
        // SAFETY: the app named these rows of its host memory as a copy node's source; CUDA's
        // contract is that they stay valid and readable while the graph can run.
        bytes.extend_from_slice(unsafe { std::slice::from_raw_parts(std::ptr::with_exposed_provenance::<u8>(row as usize), width) });
    }
    bytes
}
