//! One session: the op table implemented once over any `Device`, with every check the server
//! owes its tenants. Device ranges are validated before any copy or memset reaches the device;
//! stream, event, module and kernel ids are the session's own; memory counts against the
//! allocation's quota; blocking waits run on waiter threads; everything is released when the
//! session ends, however it ends.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::frame::{FrameError, FrameLimits, read_full};
use flyt_protocol::ops::{BulkDirection, CACHED_IMAGE_MIN, JitOption, LinkOutcome, Op, OpClass, ParamInfo, Request, rep, req};
use serde::Serialize;

use crate::activity::{Activity, Mark, Work};
use crate::backend::{Device, LaunchShape};
use crate::budget::MemoryBudget;
use crate::images::ImageCache;
use crate::memory::{MovedVariables, RangeKind, RangeMap};
use crate::shm::Segment;
use crate::transport::{Connection, Outbox};
use crate::waiters::Waiters;

mod arrays;
pub(crate) mod graphs;
mod green;
mod intake;
mod ipc;
mod memops;
mod paging;
mod pools;
mod snapshot;
mod vmm;

pub use snapshot::{MoveControl, Restored, path_of as snapshot_path, restore, valid_name as valid_snapshot_name};
pub(crate) use snapshot::{copy_direct, read_device, write_device};

/// The session's handle maps, looked up on every launch, copy and wait: keys are ids the app
/// chose, hashed quickly (a colliding app slows only its own session, in its own worker).
pub(crate) type IdMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Answers one request. Dropping it unanswered is a server bug, reported to the client as
/// `cudaErrorUnknown` rather than leaving the client waiting.
pub struct Responder<T: Serialize> {
    seq: u32,
    class: OpClass,
    /// The op's id, and when its request was taken up (when calls are timed): for the metrics.
    op: u16,
    started: Option<Instant>,
    outbox: Arc<Outbox>,
    answered: bool,
    _reply: PhantomData<fn(T)>,
}

impl<T: Serialize> Responder<T> {
    fn new(seq: u32, class: OpClass, op: u16, started: Option<Instant>, outbox: Arc<Outbox>) -> Self {
        if class != OpClass::NoReply {
            outbox.reply_awaited();
        }
        Self { seq, class, op, started, outbox, answered: false, _reply: PhantomData }
    }

    fn count(&self, failed: bool) {
        if let Some(stats) = self.outbox.stats() {
            if failed {
                stats.error(self.op);
            }
            if let Some(started) = self.started.filter(|_| self.class != OpClass::NoReply) {
                stats.latency(started.elapsed());
            }
        }
    }

    pub fn send(self, result: CudaResult<T>) {
        self.send_with_bulk(result, &[]);
    }

    pub fn send_with_bulk(mut self, result: CudaResult<T>, bulk: &[u8]) {
        self.answered = true;
        self.count(result.is_err());
        self.outbox.reply(self.seq, self.class, result.as_ref().map_err(|error| *error), bulk);
    }

    /// Sends without first sending the held device-to-host replies (for one of those).
    fn send_now_with_bulk(mut self, result: CudaResult<T>, bulk: &[u8]) {
        self.answered = true;
        self.count(result.is_err());
        self.outbox.reply_now(self.seq, self.class, result.as_ref().map_err(|error| *error), bulk);
    }
}

/// A device-to-host copy whose reply (with its bytes) waits in the outbox until it finishes.
struct HeldCopy<D: Device, R: Serialize> {
    device: Arc<D>,
    copy: D::PendingCopy,
    /// A blocking `cudaMemcpy`: flushes what the kernels printed first, as CUDA does.
    blocking: bool,
    /// The responder and the reply it sends on success.
    reply: Mutex<Option<(Responder<R>, R)>>,
}

impl<D: Device, R: Serialize + Send + 'static> crate::transport::PendingReply for HeldCopy<D, R> {
    fn ready(&self) -> bool {
        self.device.dtoh_done(&self.copy)
    }

    fn send(&self, outbox: &Outbox) {
        let Some((reply, done)) = self.reply.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take() else {
            return;
        };
        let result = self.device.dtoh_bytes(&self.copy);
        if self.blocking {
            outbox.send_output();
        }
        match result {
            Ok(bytes) => reply.send_now_with_bulk(Ok(done), bytes),
            Err(error) => reply.send_now_with_bulk(Err(error), &[]),
        }
    }
}

impl<T: Serialize> Drop for Responder<T> {
    fn drop(&mut self) {
        if !self.answered {
            tracing::error!(seq = self.seq, "request dropped without a reply");
            self.count(true);
            self.outbox.reply::<()>(self.seq, self.class, Err(CudaError::UNKNOWN), &[]);
        }
    }
}

/// The raw bytes that follow a request. Whatever the handler leaves unread is discarded, so the
/// stream stays in step.
pub struct BulkIn<'a> {
    reader: Box<dyn intake::BulkSource + 'a>,
    remaining: u64,
    failure: Option<FrameError>,
}

impl<'a> BulkIn<'a> {
    fn new(reader: Box<dyn intake::BulkSource + 'a>, len: u64) -> Self {
        Self { reader, remaining: len, failure: None }
    }

    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Fills `buf` from the bulk bytes; `false` when the connection failed (the session ends).
    pub fn read_into(&mut self, buf: &mut [u8]) -> bool {
        if self.failure.is_some() || buf.len() as u64 > self.remaining {
            return false;
        }
        match read_full(&mut self.reader, buf, false) {
            Ok(()) => {
                self.remaining -= buf.len() as u64;
                if self.remaining == 0 {
                    self.reader.release();
                }
                true
            }
            Err(error) => {
                self.failure = Some(error);
                false
            }
        }
    }

    /// All the remaining bulk bytes; `None` when the connection failed or they cannot fit in memory.
    pub fn read_all(&mut self) -> Option<Vec<u8>> {
        let mut bytes = vec![0u8; usize::try_from(self.remaining).ok()?];
        self.read_into(&mut bytes).then_some(bytes)
    }

    fn finish(mut self) -> Result<(), FrameError> {
        if let Some(failure) = self.failure.take() {
            return Err(failure);
        }
        flyt_protocol::frame::discard(&mut self.reader, self.remaining)
    }
}

macro_rules! handler_method {
    (-, $method:ident, $name:ident) => {
        fn $method(&mut self, request: req::$name, reply: Responder<rep::$name>);
    };
    (bulk_in, $method:ident, $name:ident) => {
        fn $method(&mut self, request: req::$name, bulk: &mut BulkIn<'_>, reply: Responder<rep::$name>);
    };
    (bulk_out, $method:ident, $name:ident) => {
        fn $method(&mut self, request: req::$name, reply: Responder<rep::$name>);
    };
}

macro_rules! handler_call {
    (bulk_in, $handler:ident, $method:ident, $fields:ident, $bulk:ident, $reply:ident) => {
        $handler.$method($fields, $bulk, $reply)
    };
    ($other:tt, $handler:ident, $method:ident, $fields:ident, $bulk:ident, $reply:ident) => {
        $handler.$method($fields, $reply)
    };
}

macro_rules! define_handler {
    ($(
        $(#[$doc:meta])*
        $id:literal $name:ident $method:ident [$class:ident $bulk:tt]
        { $($req_field:ident : $req_ty:ty),* $(,)? } -> { $($rep_field:ident : $rep_ty:ty),* $(,)? };
    )*) => {
        /// One method per row of the op table: a new op that the server does not handle is a
        /// compile error here.
        pub trait OpHandler {
            $(handler_method!($bulk, $method, $name);)*
        }

        /// Routes a decoded request to its handler method with a typed responder.
        pub fn dispatch<H: OpHandler>(
            handler: &mut H,
            request: Request,
            seq: u32,
            started: Option<Instant>,
            bulk: &mut BulkIn<'_>,
            outbox: &Arc<Outbox>,
        ) {
            match request {
                $(Request::$name(fields) => {
                    let info = <req::$name as Op>::INFO;
                    let reply = Responder::new(seq, info.class, info.id, started, outbox.clone());
                    handler_call!($bulk, handler, $method, fields, bulk, reply)
                })*
            }
        }
    };
}

flyt_protocol::for_each_op!(define_handler);

/// Most streams or events one session may hold: a runaway client exhausts its own quota, not
/// the worker's memory.
const MAX_HANDLES: usize = 1 << 16;

/// Private events for waits, each with the device (index) whose context made it.
type SpareEvents<D> = Arc<Mutex<Vec<(usize, <D as Device>::Event)>>>;

struct LoadedModule<D: Device> {
    module: D::Module,
    /// The device it was loaded on (`elsewhere` holds its loads on the session's other devices).
    device: usize,
    /// Kept to load the module again after a device reset, which unloads it on the device while
    /// the app keeps its handles (CUDA's libraries outlive a reset).
    image: Arc<Vec<u8>>,
    /// Kernels by index, in the order they were asked for by name.
    functions: Vec<CudaResult<Kernel<D>>>,
    /// The index of each kernel found by name, so asking twice gives the same index.
    function_names: HashMap<String, u32>,
    /// Variables the app asked for: name, address, size.
    variables: Vec<(String, u64, u64)>,
}

/// `home` loaded again on the current device (`current`, another of the session's): the kernels
/// its own device found, at the same indices, with the attributes the app set on them.
fn load_elsewhere<D: Device>(device: &D, home: &LoadedModule<D>, current: usize) -> CudaResult<LoadedModule<D>> {
    let module = device.load_module(&home.image)?;
    let mut functions: Vec<CudaResult<Kernel<D>>> = (0..home.functions.len()).map(|_| Err(CudaError::INVALID_DEVICE_FUNCTION)).collect();
    for (name, index) in &home.function_names {
        let kernel = device.function(&module, name).and_then(|(function, params)| {
            let attributes_set = home.functions.get(*index as usize).and_then(|k| k.as_ref().ok()).map(|k| k.attributes_set.clone());
            for (attribute, value) in attributes_set.iter().flatten() {
                device.func_set_attribute(function, *attribute, *value)?;
            }
            Ok(Kernel { attributes_set: attributes_set.unwrap_or_default(), ..Kernel::new(function, params) })
        });
        functions[*index as usize] = kernel;
    }
    Ok(LoadedModule {
        module,
        device: current,
        image: home.image.clone(),
        functions,
        function_names: home.function_names.clone(),
        variables: Vec::new(),
    })
}

/// A kernel of a loaded module and its parameter layout.
struct Kernel<D: Device> {
    function: D::Function,
    params: Vec<ParamInfo>,
    /// Bytes its packed arguments take.
    args_len: u64,
    /// Attributes the app set, latest value of each: a device reset keeps them, as CUDA's
    /// runtime applies them again to the new context.
    attributes_set: Vec<(u32, i32)>,
}

impl<D: Device> Kernel<D> {
    fn new(function: D::Function, params: Vec<ParamInfo>) -> Self {
        let args_len = params.iter().map(|p| u64::from(p.offset) + u64::from(p.size)).max().unwrap_or(0);
        Self { function, params, args_len, attributes_set: Vec::new() }
    }
}

/// How long a device reset waits for the session's waiters to finish (their work is done by
/// then, so they finish at once).
const RESET_DRAIN: Duration = Duration::from_secs(2);

/// Most kernels one module may hold: a client asking for names in a loop exhausts this, not the
/// worker's memory.
const MAX_FUNCTIONS_PER_MODULE: usize = 1 << 20;
/// JIT links one session may hold open at once.
const MAX_LINKS: usize = 256;
/// Log buffers a link keeps on the server, each (an app asking for more gets this much).
const MAX_LINK_LOG: u32 = 1 << 20;

/// A JIT link of the session: the device's state, the sizes of the app's log buffers, and the
/// cubin once complete.
struct Linked<D: Device> {
    link: D::Link,
    info_log: u32,
    error_log: u32,
    cubin: Option<Vec<u8>>,
}

impl<D: Device> Linked<D> {
    /// The outcome as the app's buffers hold it: each log cut to its buffer, less the NUL.
    fn fitted(&self, mut outcome: LinkOutcome) -> LinkOutcome {
        fit(&mut outcome.info_log, self.info_log);
        fit(&mut outcome.error_log, self.error_log);
        outcome
    }
}

/// Cuts `text` to fit a C buffer of `size` bytes with its NUL, at a character boundary.
fn fit(text: &mut String, size: u32) {
    let mut len = (size as usize).saturating_sub(1).min(text.len());
    while !text.is_char_boundary(len) {
        len -= 1;
    }
    text.truncate(len);
}

/// `FLYT_RPC_OP_TIMES=1`: how long the reader spent handling each op (decode excluded, the
/// inline answer included), logged when the session ends. For finding where a round trip's time
/// goes on the server; off by default.
struct OpTimes(HashMap<&'static str, (u64, Duration, Duration)>);

impl OpTimes {
    fn from_env() -> Option<Self> {
        std::env::var("FLYT_RPC_OP_TIMES").is_ok_and(|value| value == "1").then(|| Self(HashMap::new()))
    }

    fn add(&mut self, op: &'static str, took: Duration) {
        let (count, total, max) = self.0.entry(op).or_default();
        *count += 1;
        *total += took;
        *max = (*max).max(took);
    }
}

impl Drop for OpTimes {
    fn drop(&mut self) {
        let mut rows: Vec<_> = self.0.iter().collect();
        rows.sort_by_key(|(_, (_, total, _))| std::cmp::Reverse(*total));
        for (op, (count, total, max)) in rows {
            let mean_us = total.as_secs_f64() * 1e6 / *count as f64;
            tracing::info!(op, count, mean_us = format!("{mean_us:.3}"), max_us = max.as_micros() as u64, "op handling time");
        }
    }
}

/// Tunables of a session.
#[derive(Clone, Debug)]
pub struct SessionConfig {
    /// Largest bulk payload per copy frame (the client chunks bigger copies).
    pub copy_chunk: u64,
    /// How long the reader polls a wait itself before handing it to a waiter thread: short
    /// waits (an empty kernel) then cost no thread hand-off.
    pub inline_wait: Duration,
    pub limits: FrameLimits,
    /// Where large module images are kept across sessions, when on.
    pub image_cache: Option<Arc<ImageCache>>,
    /// This worker's counters for the metrics endpoint, and whether to time calls too.
    pub stats: Option<Arc<crate::stats::SlotStats>>,
    pub time_calls: bool,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            copy_chunk: 4 << 20,
            inline_wait: Duration::from_micros(20),
            limits: FrameLimits::default(),
            image_cache: None,
            stats: None,
            time_calls: false,
        }
    }
}

/// The state of one session.
pub struct Session<D: Device> {
    device: Arc<D>,
    budget: Arc<dyn MemoryBudget>,
    outbox: Arc<Outbox>,
    waiters: Waiters,
    config: SessionConfig,
    ranges: RangeMap,
    streams: IdMap<u64, D::Stream>,
    /// The stream an op named last (0: the legacy stream): a device synchronize polls it last,
    /// the others (likely idle) while its work runs.
    last_stream: AtomicU64,
    /// Whether a request naming a device outside the session's was logged (once a session: a
    /// hostile client must not fill the log).
    foreign_device_logged: bool,
    /// Work queued and not yet seen done, for NVML's utilization.
    activity: Arc<Mutex<Activity>>,
    events: IdMap<u64, D::Event>,
    /// How each stream (flags, priority) and event (flags) was created: to make them again when
    /// the session moves.
    stream_params: IdMap<u64, (u32, i32)>,
    event_flags: IdMap<u64, u32>,
    /// Checkpoints asked for by the listener, and whether the session moved away (it ends).
    moves: Arc<MoveControl>,
    moved: bool,
    /// Variables at other addresses than the app knows them by, after a move.
    moved_variables: MovedVariables,
    modules: IdMap<u32, LoadedModule<D>>,
    /// Modules loaded again on another of the session's devices than their own, by (id, device
    /// index): a module is per device in the driver, while the app's handles (a library's
    /// kernels) are not, so a kernel launched on another device loads its image there first.
    elsewhere: IdMap<(u32, usize), LoadedModule<D>>,
    links: IdMap<u64, Linked<D>>,
    /// Private events for waiting on streams, reused by streams of the device that made them (an
    /// event is recorded only on streams of its context).
    spare_events: SpareEvents<D>,
    /// The shared-memory segment, when the client shares this host.
    shm: Option<Segment>,
    /// Whether a loaded module may print (device `printf` or `assert`): only then do
    /// synchronizing calls look for output to forward.
    may_print: bool,
    /// Graphs, captures and host functions.
    graphs: graphs::GraphTable<D>,
    /// Virtual memory management.
    vmm: vmm::VmmTable<D>,
    /// Memory pools.
    pools: pools::PoolTable<D>,
    /// Arrays, mipmapped arrays, texture and surface objects.
    arrays: arrays::ArrayTable<D>,
    /// Other sessions' memory this one mapped.
    ipc: ipc::IpcTable,
    /// Tensor maps the driver encoded, for `cuTensorMapReplaceAddress`.
    tensor_maps: memops::TensorMaps,
    /// Green contexts, their streams, and the resources and descriptors they are made from.
    green: green::GreenTable<D>,
    /// The data connections striped copies travel on (`None`: the session stripes nothing).
    stripes: Option<Arc<crate::stripes::Stripes<D>>>,
    /// Paging, when the server oversubscribes its GPU share (`crate::paging`).
    pager: Option<Arc<crate::paging::Pager>>,
    /// The device each allocation, stream and event was made on, and the peer access enabled:
    /// a session of several GPUs is made again device by device when it moves.
    owners: snapshot::Owners,
}

/// Whether a module image may print: it names `vprintf` or `__assertfail`, or its code is not
/// plain ELF or PTX text (compressed fatbinary entries), so it cannot be told.
fn may_print(image: &[u8]) -> bool {
    let contains = |needle: &[u8]| image.windows(needle.len()).any(|window| window == needle);
    contains(b"vprintf") || contains(b"__assertfail") || !(contains(b"\x7fELF") || contains(b".version"))
}

/// `CU_STREAM_CAPTURE_MODE_RELAXED`, for the session's helper threads.
const CAPTURE_MODE_RELAXED: u32 = 2;

impl<D: Device> Session<D> {
    /// The value a request sets for a launch attribute of a stream or a kernel node (`LEN` bytes,
    /// a `CUlaunchAttributeValue`), checked: an access policy window (`is_window`) names device
    /// memory, which must be the session's own.
    fn launch_attribute_value<const LEN: usize>(&self, set: Option<&[u8]>, is_window: bool) -> CudaResult<Option<[u8; LEN]>> {
        let Some(bytes) = set else { return Ok(None) };
        let value = <[u8; LEN]>::try_from(bytes).map_err(|_| CudaError::INVALID_VALUE)?;
        if is_window {
            let word = |at: usize| value.get(at..at + 8).and_then(|word| word.try_into().ok()).map_or(0, u64::from_le_bytes);
            let (base, len) = (word(0), word(8));
            if len > 0 {
                self.ranges.check(base, len)?;
            }
        }
        Ok(Some(value))
    }

    pub fn new(
        device: Arc<D>,
        budget: Arc<dyn MemoryBudget>,
        writer: Connection,
        config: SessionConfig,
        shm: Option<Segment>,
        output: Option<Arc<crate::output::Capture>>,
    ) -> Self {
        let bind_device = device.clone();
        let bind = Arc::new(move || {
            if let Err(error) = bind_device.bind_thread() {
                tracing::error!(%error, "waiter could not bind the device");
            }
            // A helper's event query or synchronize (a staging fence's wait that outlives the
            // copy's reply, say) may run while the app captures in global mode on the session
            // thread; in the default mode the driver would refuse it and invalidate the app's
            // capture. Relaxed, the helper's calls touch no capture, as the app's would not.
            if let Err(error) = bind_device.exchange_capture_mode(CAPTURE_MODE_RELAXED) {
                tracing::warn!(%error, "a helper thread keeps the global capture mode");
            }
        });
        let outbox = Arc::new(Outbox::new(writer, output, config.stats.clone()));
        let host_calls = crate::host_calls::HostCalls::new(outbox.clone(), bind.clone());
        Self {
            device,
            activity: Arc::new(Mutex::new(Activity::new(budget.clone()))),
            budget,
            outbox,
            waiters: Waiters::new(bind),
            config,
            ranges: RangeMap::default(),
            streams: IdMap::default(),
            last_stream: AtomicU64::new(0),
            foreign_device_logged: false,
            events: IdMap::default(),
            stream_params: IdMap::default(),
            event_flags: IdMap::default(),
            moves: Arc::new(MoveControl::default()),
            moved: false,
            moved_variables: MovedVariables::default(),
            modules: IdMap::default(),
            elsewhere: IdMap::default(),
            links: IdMap::default(),
            spare_events: Arc::new(Mutex::new(Vec::new())),
            shm,
            may_print: false,
            graphs: graphs::GraphTable::new(host_calls),
            vmm: vmm::VmmTable::default(),
            pools: pools::PoolTable::default(),
            arrays: arrays::ArrayTable::default(),
            ipc: ipc::IpcTable::default(),
            tensor_maps: memops::TensorMaps::default(),
            green: green::GreenTable::default(),
            stripes: None,
            pager: None,
            owners: snapshot::Owners::default(),
        }
    }

    /// Reads and handles requests until the client leaves (`Ok`) or breaks the protocol
    /// (`Err`, with the reason to log).
    pub fn serve(&mut self, reader: Connection) -> Result<(), FrameError> {
        let intake = intake::Intake::new(reader, self.config.limits, self.outbox.clone());
        let outcome = self.serve_frames(&intake);
        intake.end();
        outcome
    }

    fn serve_frames(&mut self, intake: &Arc<intake::Intake>) -> Result<(), FrameError> {
        let mut message = Vec::with_capacity(4096);
        let outbox = self.outbox.clone();
        let pager = self.pager.clone();
        let mut op_times = OpTimes::from_env();
        loop {
            // A session that has named host functions to the device has its frames read ahead
            // while its thread is held in the driver (intake.rs says why): checked before each
            // frame, so the read-ahead runs before any host function can.
            if self.graphs.host_calls.used() {
                intake.start_read_ahead(self.graphs.host_calls.clone(), self.config.stats.clone());
            }
            let next = match intake.next(&mut message) {
                Ok(next) => next,
                Err(FrameError::Closed) => return Ok(()),
                Err(error) => return Err(error),
            };
            let header = next.header;
            flyt_ring::timeline::mark(flyt_ring::timeline::Stage::FrameRead);
            let request = Request::decode(&message)?;
            let info = request.info();
            if header.bulk_len != 0 && info.bulk != BulkDirection::In {
                return Err(FrameError::Decode(format!("{} carries {} unexpected bulk bytes", info.name, header.bulk_len)));
            }
            let mut bulk = BulkIn::new(next.into_bulk(), header.bulk_len);
            if let Some(stats) = &self.config.stats {
                stats.call(info.id);
            }
            let started = (op_times.is_some() || self.config.time_calls).then(Instant::now);
            // Paging: a paged-out session is paged in before its request runs.
            let gate = match pager.as_deref().map(|pager| pager.enter(&*self.device, &outbox)) {
                Some(Err(reason)) => {
                    tracing::warn!(op = info.name, %reason, "request failed: out of device memory");
                    outbox.reply::<()>(header.seq, info.class, Err(CudaError::MEMORY_ALLOCATION), &[]);
                    bulk.finish()?;
                    continue;
                }
                Some(Ok(gate)) => Some(gate),
                None => None,
            };
            dispatch(self, request, header.seq, started, &mut bulk, &outbox);
            if let (Some(pager), Some(mut gate)) = (pager.as_deref(), gate) {
                self.after_request(&mut gate, info.name);
                pager.leave(gate);
            }
            flyt_ring::timeline::mark(flyt_ring::timeline::Stage::Dispatched);
            if let (Some(times), Some(started)) = (op_times.as_mut(), started) {
                times.add(info.name, started.elapsed());
            }
            bulk.finish()?;
            if self.moved {
                return Ok(());
            }
        }
    }

    /// A copy was queued on `stream`: its bytes count for the metrics endpoint, its time for
    /// NVML's utilization.
    fn count_copy(&self, stream: u64, how: crate::stats::Copied, bytes: u64) {
        self.queued(stream, Work::Copies);
        if let Some(stats) = &self.config.stats {
            stats.copied(how, bytes);
        }
    }

    fn stream(&self, id: u64) -> CudaResult<D::Stream> {
        self.last_stream.store(id, Ordering::Relaxed);
        if id == 0 {
            return Ok(self.device.null_stream());
        }
        self.streams.get(&id).copied().ok_or(CudaError::INVALID_RESOURCE_HANDLE)
    }

    fn event(&self, id: u64) -> CudaResult<D::Event> {
        self.events.get(&id).copied().ok_or(CudaError::INVALID_RESOURCE_HANDLE)
    }

    fn function(&mut self, function: flyt_protocol::ops::FunctionRef) -> CudaResult<(D::Function, u64)> {
        let index = usize::try_from(function.index).map_err(|_| CudaError::INVALID_DEVICE_FUNCTION)?;
        if let Some(kernel) = self.module_here(function.module)?.functions.get(index) {
            return kernel.as_ref().map(|kernel| (kernel.function, kernel.args_len)).map_err(|error| *error);
        }
        self.find_here(function.module, index)
    }

    /// A kernel the module's own device found by name after the current device's load of it was
    /// made: found in that load too, at the same index.
    fn find_here(&mut self, id: u32, index: usize) -> CudaResult<(D::Function, u64)> {
        let home = self.modules.get(&id).ok_or(CudaError::INVALID_DEVICE_FUNCTION)?;
        let name = home.function_names.iter().find(|(_, at)| **at as usize == index).map(|(name, _)| name.clone());
        let name = name.ok_or(CudaError::INVALID_DEVICE_FUNCTION)?;
        let device = self.device.clone();
        let module = self.module_here(id)?;
        module.functions.resize_with(index + 1, || Err(CudaError::INVALID_DEVICE_FUNCTION));
        let kernel = device.function(&module.module, &name).map(|(function, params)| Kernel::new(function, params));
        let found = kernel.as_ref().map(|kernel| (kernel.function, kernel.args_len)).map_err(|error| *error);
        module.functions[index] = kernel;
        module.function_names.insert(name, u32::try_from(index).unwrap_or(u32::MAX));
        found
    }

    /// Module `id` as loaded on the current device: its own load there, or a load of its image
    /// made now, with the kernels found on its own device at the same indices.
    fn module_here(&mut self, id: u32) -> CudaResult<&mut LoadedModule<D>> {
        let current = self.device.current_device();
        let home = self.modules.get(&id).ok_or(CudaError::INVALID_DEVICE_FUNCTION)?;
        if home.device == current {
            return self.modules.get_mut(&id).ok_or(CudaError::INVALID_DEVICE_FUNCTION);
        }
        if !self.elsewhere.contains_key(&(id, current)) {
            let loaded = load_elsewhere(&*self.device, home, current)?;
            tracing::debug!(module = id, device = current, "module loaded on another device of the session");
            self.elsewhere.insert((id, current), loaded);
        }
        self.elsewhere.get_mut(&(id, current)).ok_or(CudaError::INVALID_DEVICE_FUNCTION)
    }

    /// Polls `ready` for up to the inline-wait budget; `true` if it became ready.
    ///
    /// The clock is read on every poll (not as `flyt_ring::SpinDeadline` does): each poll is a
    /// driver call of a few hundred nanoseconds, and the budget is short, so 15 polls past it
    /// would keep the reader from the socket noticeably longer than asked.
    fn ready_soon(&self, mut ready: impl FnMut() -> bool) -> bool {
        let started = Instant::now();
        loop {
            if ready() {
                flyt_ring::timeline::mark(flyt_ring::timeline::Stage::WaitDone);
                return true;
            }
            if started.elapsed() >= self.config.inline_wait {
                return false;
            }
            std::hint::spin_loop();
        }
    }

    /// Calls `answer` once everything queued on `stream` so far is done: at once if the stream
    /// is idle, after a short poll of the stream itself, or from a waiter thread (on a private
    /// event recorded now, so a later destroy of the stream cannot pull the handle from under the
    /// waiter). With `flush_output`, what the kernels printed is sent first (a synchronize
    /// flushes it).
    fn when_stream_done(&self, stream: u64, flush_output: bool, answer: impl FnOnce(CudaResult<()>) + Send + 'static) {
        let flush_output = flush_output && self.may_print;
        let answer = self.seeing_done(self.wait_mark(stream), answer);
        let stream = match self.stream(stream) {
            Ok(stream) => stream,
            Err(error) => return answer(Err(error)),
        };
        if !flush_output {
            // Polling the stream is what a native wait costs; recording an event first adds GPU
            // work behind the kernel (measured on an H100: about 1.8 us more per short wait).
            let mut state = Err(CudaError::NOT_READY);
            if self.ready_soon(|| {
                state = self.device.stream_query(stream);
                state != Err(CudaError::NOT_READY)
            }) {
                return answer(state);
            }
        }
        let (gpu, event) = match self.private_event(stream) {
            Ok(made) => made,
            Err(error) => return answer(Err(error)),
        };
        let spare = self.spare_events.clone();
        let recycle = move |event| spare.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((gpu, event));
        if let Err(error) = self.device.event_record(event, stream, 0) {
            recycle(event);
            return answer(Err(error));
        }
        // The stream was just polled for the inline budget: the event goes to a waiter at once.
        self.when_event_done(event, flush_output, !flush_output, move |result| {
            answer(result);
            recycle(event);
        });
    }

    /// Calls `answer` with `event`'s synchronize once the event has fired (see `after`). The
    /// synchronize then returns at once; it is made anyway because the driver reports the event's
    /// error and flushes device printf output there, which `flush_output` sends first.
    fn when_event_done(
        &self,
        event: D::Event,
        flush_output: bool,
        polled_already: bool,
        answer: impl FnOnce(CudaResult<()>) + Send + 'static,
    ) {
        let (device, outbox) = (self.device.clone(), self.outbox.clone());
        let fired = device.clone();
        self.after(
            polled_already,
            move || fired.event_query(event) != Err(CudaError::NOT_READY),
            move || {
                let result = device.event_synchronize(event);
                if flush_output {
                    outbox.send_output();
                }
                answer(result);
            },
        );
    }

    /// Runs `finish` once `done()` holds: polled inline for a moment, then on a waiter that polls
    /// without burning a core (`waiters::wait_until`). A session whose kernels may print runs
    /// `finish` on a waiter at once instead, and `finish` waits in the driver: polling would let
    /// the driver empty the device's printf buffer while a kernel still prints, delivering lines
    /// that CUDA drops when the buffer is full.
    /// With `polled_already`, the caller has just polled for the inline budget itself: no
    /// second inline poll.
    fn after(&self, polled_already: bool, done: impl Fn() -> bool + Send + 'static, finish: impl FnOnce() + Send + 'static) {
        if self.may_print {
            return self.waiters.run(finish);
        }
        if !polled_already && self.ready_soon(&done) {
            return finish();
        }
        self.waiters.run(move || {
            crate::waiters::wait_until(done);
            finish();
        });
    }

    /// Calls `answer` with the context-wide synchronize's result once every stream is idle,
    /// polled (inline briefly, then on a waiter) so the wait burns no core; the synchronize itself
    /// then returns at once, reports the device's sticky error, and flushes device printf output,
    /// which is sent before the answer.
    fn when_device_idle(&self, answer: impl FnOnce(CudaResult<()>) + Send + 'static) {
        let answer = self.seeing_done(self.activity().mark_where(|_| true), answer);
        let device = self.device.clone();
        // The stream that took work last is polled last: the others are seen idle while its work
        // runs, so its completion is seen without another query after it (measured on an H100:
        // each stream queried after the busy one adds about 0.4 us to a short wait).
        let last = self.last_stream.load(Ordering::Relaxed);
        let busiest = if last == 0 { Some(device.null_stream()) } else { self.streams.get(&last).copied() };
        let others = std::iter::once((0, device.null_stream())).chain(self.streams.iter().map(|(id, stream)| (*id, *stream)));
        let streams: Vec<D::Stream> =
            others.filter(|(id, _)| busiest.is_none() || *id != last).map(|(_, stream)| stream).chain(busiest).collect();
        let outbox = self.outbox.clone();
        let flush_output = self.may_print;
        let finish = move |device: &D, idle: CudaResult<()>| {
            // Every stream idle and healthy: no context-wide call is needed unless output may
            // wait in the device's printf buffer; an error from a query is the sticky error,
            // which the synchronize returns.
            let result = if idle.is_ok() && !flush_output { Ok(()) } else { device.synchronize() };
            if flush_output {
                outbox.send_output();
            }
            answer(result);
        };
        if self.may_print {
            // Waits in the driver (see `after`).
            self.waiters.run(move || finish(&device, Err(CudaError::NOT_READY)));
            return;
        }
        // Streams are queried from the reader only: a waiter must not touch a stream the reader
        // may destroy meanwhile, so a long wait goes through private events instead. Each poll
        // queries one stream, the first not yet seen idle: a stream seen idle stays idle (only
        // this reader queues work), and querying every stream on every poll delays the wake-up
        // (measured on an H100: about 2 us more per short wait than polling one stream).
        let mut state = Err(CudaError::NOT_READY);
        let mut idle_up_to = 0;
        if self.ready_soon(|| {
            while let Some(stream) = streams.get(idle_up_to) {
                match device.stream_query(*stream) {
                    Ok(()) => idle_up_to += 1,
                    Err(CudaError::NOT_READY) => return false,
                    Err(error) => {
                        state = Err(error);
                        return true;
                    }
                }
            }
            state = Ok(());
            true
        }) {
            return finish(&device, state);
        }
        let streams = &streams[idle_up_to..];
        let mut events = Vec::with_capacity(streams.len());
        for stream in streams {
            match self.private_event(*stream).and_then(|(gpu, event)| self.device.event_record(event, *stream, 0).map(|()| (gpu, event))) {
                Ok(event) => events.push(event),
                Err(error) => {
                    let spare = self.spare_events.clone();
                    spare.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend(events);
                    return finish(&device, Err(error));
                }
            }
        }
        let spare = self.spare_events.clone();
        self.waiters.run(move || {
            crate::waiters::wait_until(|| events.iter().all(|(_, event)| device.event_query(*event) != Err(CudaError::NOT_READY)));
            spare.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend(events);
            finish(&device, Err(CudaError::NOT_READY));
        });
    }

    /// Holds a device-to-host copy's reply in the outbox until the copy is done, then sends it
    /// with the bytes (`done` on success).
    /// The copy's sighting also tells the activity account that `stream`'s work up to it is done.
    fn hold_copy<R: Serialize + Send + 'static>(&self, copy: D::PendingCopy, stream: u64, blocking: bool, reply: Responder<R>, done: R) {
        let seen = self.seeing_done(self.wait_mark(stream), |_| {});
        let held = Arc::new(HeldCopy {
            device: self.device.clone(),
            copy,
            blocking: blocking && self.may_print,
            reply: Mutex::new(Some((reply, done))),
        });
        self.outbox.hold(held.clone());
        let (outbox, polled, waits_in_driver) = (self.outbox.clone(), held.clone(), self.may_print);
        self.after(
            false,
            move || polled.device.dtoh_done(&polled.copy),
            move || {
                if waits_in_driver {
                    // Waits in the driver (see `after`); the outcome is read again when the
                    // reply is sent.
                    let _ = held.device.dtoh_bytes(&held.copy);
                }
                seen(Ok(()));
                outbox.send_ready();
            },
        );
    }

    fn activity(&self) -> std::sync::MutexGuard<'_, Activity> {
        self.activity.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What a wait on the app's `stream` covers in the activity account: the stream, and for the
    /// legacy stream (0) every blocking stream too.
    fn wait_mark(&self, stream: u64) -> Mark {
        const NON_BLOCKING: u32 = 1;
        let activity = self.activity();
        if stream != 0 {
            return activity.mark(stream);
        }
        let blocking = |id: u64| id == 0 || self.stream_params.get(&id).is_some_and(|(flags, _)| flags & NON_BLOCKING == 0);
        activity.mark_where(blocking)
    }

    /// `work` was queued on `stream` (for NVML's utilization). Work a capture records does not
    /// run, and no wait would ever see it done: it does not count.
    fn queued(&self, stream: u64, work: Work) {
        if self.capturing(stream) {
            return;
        }
        self.activity().queued(stream, work);
    }

    /// `answer`, which also tells the activity account that the work `mark` names is done when
    /// the wait ends well.
    fn seeing_done(
        &self,
        mark: Mark,
        answer: impl FnOnce(CudaResult<()>) + Send + 'static,
    ) -> impl FnOnce(CudaResult<()>) + Send + 'static {
        // Nothing queued, nothing to tell: no reference taken on the account.
        let activity = (!matches!(mark, Mark::Nothing)).then(|| self.activity.clone());
        move |result: CudaResult<()>| {
            let seen_done = result.is_ok();
            // The app is answered first: the account's bookkeeping (a lock, the tenant page) is
            // not on the wait's path. Work the app queues after this answer counts as newer
            // than `mark`, so a late `done` cannot close it.
            answer(result);
            if let (true, Some(activity)) = (seen_done, activity) {
                activity.lock().unwrap_or_else(std::sync::PoisonError::into_inner).done(&mark);
            }
        }
    }

    /// An event of the session's own, made by `stream`'s device (so it can be recorded there),
    /// with that device's index.
    fn private_event(&self, stream: D::Stream) -> CudaResult<(usize, D::Event)> {
        let gpu = self.device.stream_device(stream);
        let mut spare = self.spare_events.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match spare.iter().rposition(|(made_on, _)| *made_on == gpu) {
            Some(at) => Ok(spare.swap_remove(at)),
            // cudaEventDisableTiming: waits need no timestamps, and untimed events are cheaper.
            None => self.device.event_create_on(gpu, 0x2).map(|event| (gpu, event)),
        }
    }

    fn release_everything(&mut self) {
        self.graphs.release(&*self.device);
        for (address, len, site) in self.graphs.take_staging() {
            let _ = self.device.graph_staging_free(address);
            self.budget.release(len);
            // The host half goes after its staging, once no work can run it.
            drop(site);
        }
        self.release_vmm();
        self.release_pools();
        self.release_arrays();
        self.release_ipc();
        for ptr in self.ranges.allocations() {
            if let Ok(len) = self.ranges.remove_allocation(ptr) {
                let _ = self.device.free(ptr);
                self.budget.release(len);
            }
        }
        self.release_green();
        self.stream_params.clear();
        self.event_flags.clear();
        for (_, stream) in self.streams.drain() {
            let _ = self.device.stream_destroy(stream);
        }
        for (_, event) in self.events.drain() {
            let _ = self.device.event_destroy(event);
        }
    }

    /// After a device reset: pins the segment's staging area and blocks again (the reset unpinned
    /// them). A block whose mapping no longer lands at its alias stays unpinned: its copies still
    /// work, through the driver's pageable path, while a kernel's access to it would fault, as
    /// said in the log.
    fn pin_segment_again(&mut self) {
        let Some(segment) = &self.shm else { return };
        for pin in segment.pins() {
            // SAFETY: each pin lies inside the session's mapping (checked when it was added) and
            // stays mapped until it is removed, after it is unpinned.
            let pinned = unsafe {
                match pin.mapped {
                    true => register_mapped(&*self.device, pin.ptr, pin.len),
                    false => self.device.host_register(pin.ptr, pin.len, false),
                }
            };
            if let Err(error) = pinned {
                tracing::error!(%error, len = pin.len, mapped = pin.mapped, "host memory not pinned again after a device reset");
            }
        }
    }

    /// After a device reset: loads every module again from its image and finds its kernels again
    /// by name, so the app's handles keep working. Variables are found again when asked (their
    /// addresses may move).
    fn reload_modules(&mut self) {
        self.moved_variables.clear();
        // Loads on other devices are made again when next used there.
        for (_, module) in std::mem::take(&mut self.elsewhere) {
            for (_, address, size) in &module.variables {
                self.ranges.remove_within(*address, *size, RangeKind::Variable);
            }
            let _ = self.device.unload_module(module.module);
        }
        for (id, loaded) in &mut self.modules {
            for (_, address, size) in loaded.variables.drain(..) {
                self.ranges.remove_within(address, size, RangeKind::Variable);
            }
            match self.device.load_module(&loaded.image) {
                Ok(module) => loaded.module = module,
                Err(error) => {
                    tracing::error!(module = id, %error, "module not loaded again after a device reset");
                    for kernel in &mut loaded.functions {
                        *kernel = Err(error);
                    }
                    continue;
                }
            }
            for (name, index) in &loaded.function_names {
                let Some(kernel) = loaded.functions.get_mut(*index as usize) else { continue };
                let attributes_set = kernel.as_mut().map(|kernel| std::mem::take(&mut kernel.attributes_set)).unwrap_or_default();
                *kernel = self.device.function(&loaded.module, name).and_then(|(function, params)| {
                    for (attribute, value) in &attributes_set {
                        self.device.func_set_attribute(function, *attribute, *value)?;
                    }
                    Ok(Kernel { attributes_set, ..Kernel::new(function, params) })
                });
            }
        }
    }

    /// The session's pause and move, for the worker's command thread.
    pub fn moves(&self) -> Arc<MoveControl> {
        self.moves.clone()
    }

    /// Lets data connections presenting `secret` (given to the client in the handshake) join
    /// the session; the worker admits them through the returned set.
    /// `staging_slots`: the device's pinned staging buffers, which bound a copy's chunks in flight.
    pub fn enable_stripes(
        &mut self,
        secret: [u8; flyt_protocol::stripes::SECRET_LEN],
        staging_slots: usize,
    ) -> Arc<crate::stripes::Stripes<D>> {
        let stripes = Arc::new(crate::stripes::Stripes::new(self.device.clone(), secret, self.config.stats.clone(), staging_slots));
        self.stripes = Some(stripes.clone());
        stripes
    }

    /// The session's reply channel (for notices the client did not ask for).
    pub fn outbox(&self) -> Arc<Outbox> {
        self.outbox.clone()
    }

    /// Bytes of device memory the session holds.
    pub fn memory_used(&self) -> u64 {
        self.ranges.allocated()
    }
}

impl<D: Device> Drop for Session<D> {
    fn drop(&mut self) {
        // Nobody answers host functions any more: let the streams that wait for one go on.
        self.graphs.host_calls.close();
        self.release_everything();
        for module in self.modules.drain().map(|(_, module)| module).chain(self.elsewhere.drain().map(|(_, module)| module)) {
            let _ = self.device.unload_module(module.module);
        }
        for (_, event) in self.spare_events.lock().unwrap_or_else(std::sync::PoisonError::into_inner).drain(..) {
            let _ = self.device.event_destroy(event);
        }
        if let Some(segment) = &self.shm {
            let _ = self.device.synchronize();
            for pinned in segment.pinned_blocks() {
                // SAFETY: each block was registered by this session and its mapping is still up.
                let _ = unsafe { self.device.host_unregister(pinned) };
            }
        }
    }
}

/// Registers `[ptr, ptr + len)` as mapped host memory, kept only when the device sees it at that
/// same address (unified addressing), as the client's kernels use it; `NOT_SUPPORTED` otherwise.
///
/// # Safety
/// The range is mapped in this process and stays mapped until it is unregistered.
unsafe fn register_mapped<D: Device>(device: &D, ptr: *mut u8, len: usize) -> CudaResult<()> {
    // SAFETY: the caller's contract.
    unsafe { device.host_register(ptr, len, true) }?;
    if device.host_device_pointer(ptr) == Ok(ptr as u64) {
        return Ok(());
    }
    // SAFETY: registered just above.
    let _ = unsafe { device.host_unregister(ptr) };
    Err(CudaError::NOT_SUPPORTED)
}

/// Pins a block of the segment for the client: at the client's own address `mapped_at` as mapped
/// memory when that address is free here and the device sees it there too (the device pointer,
/// equal to `mapped_at`, is returned), else through the segment's view, for copies only (0).
pub(crate) fn pin_block<D: Device>(segment: &mut Segment, device: &D, offset: u64, len: u64, mapped_at: Option<u64>) -> CudaResult<u64> {
    let host_len = usize::try_from(len).map_err(|_| CudaError::INVALID_VALUE)?;
    let pinned = segment.add_block(offset, len, mapped_at)?;
    if let Some(alias) = segment.alias(offset) {
        // Kept only where the device sees it at the client's address, as its kernels use it.
        // SAFETY: the alias maps the block (inside the segment, checked by `add_block`) until
        // the block is removed, after it is unpinned.
        if unsafe { register_mapped(device, pinned, host_len) }.is_ok() {
            return Ok(alias);
        }
    }
    // Pinned for copies only, through the segment's own view of the block.
    let view = segment.drop_alias(offset).ok_or(CudaError::INVALID_VALUE)?;
    // SAFETY: the block lies inside the mapped segment, which stays mapped for the session's life.
    unsafe { device.host_register(view, host_len, false) }.map(|()| 0).inspect_err(|_| {
        segment.remove_block(offset);
    })
}

fn chunk_len(len: u64, chunk: u64) -> CudaResult<usize> {
    usize::try_from(len.min(chunk)).map_err(|_| CudaError::INVALID_VALUE)
}

impl<D: Device> OpHandler for Session<D> {
    fn malloc(&mut self, request: req::Malloc, reply: Responder<rep::Malloc>) {
        if request.size == 0 {
            // cudaMalloc(0) succeeds with a null pointer.
            return reply.send(Ok(rep::Malloc { ptr: 0 }));
        }
        if !self.budget.try_reserve(request.size) {
            return reply.send(Err(CudaError::MEMORY_ALLOCATION));
        }
        let mut allocated = self.device.malloc(request.size);
        // Paging counts only the sessions' allocations; the device may still be full of its
        // contexts' and the driver's memory: idle sessions make room, then once more.
        if allocated == Err(CudaError::MEMORY_ALLOCATION) && self.budget.make_room(request.size) {
            allocated = self.device.malloc(request.size);
        }
        match allocated {
            Ok(ptr) => {
                self.ranges.insert(ptr, request.size, RangeKind::Allocation);
                self.owners.allocated(ptr, self.device.current_device());
                reply.send(Ok(rep::Malloc { ptr }));
            }
            Err(error) => {
                self.budget.release(request.size);
                reply.send(Err(error));
            }
        }
    }

    fn free(&mut self, request: req::Free, reply: Responder<rep::Free>) {
        if request.ptr == 0 {
            return reply.send(Ok(rep::Free {}));
        }
        if let Some(freed) = self.free_pool_import(request.ptr, None) {
            return reply.send(freed.map(|()| rep::Free {}));
        }
        if self.ranges.kind_at(request.ptr) == Some(RangeKind::GraphMemory) && self.graphs.is_graph_memory(request.ptr) {
            return reply.send(self.device.free_graph_memory(request.ptr).map(|()| rep::Free {}));
        }
        let result = self.ranges.remove_allocation(request.ptr).and_then(|len| {
            self.budget.release(len);
            self.forget_pool_allocation(request.ptr);
            self.owners.freed(request.ptr);
            self.device.free(request.ptr)
        });
        reply.send(result.map(|()| rep::Free {}));
    }

    fn mem_get_info(&mut self, _request: req::MemGetInfo, reply: Responder<rep::MemGetInfo>) {
        let result = self.device.mem_get_info().map(|(free, total)| match self.budget.limit() {
            Some(limit) => rep::MemGetInfo { free: free.min(limit.saturating_sub(self.budget.used())), total: limit.min(total) },
            None => rep::MemGetInfo { free, total },
        });
        reply.send(result);
    }

    fn memcpy_htod(&mut self, request: req::MemcpyHtoD, bulk: &mut BulkIn<'_>, reply: Responder<rep::MemcpyHtoD>) {
        let len = bulk.remaining();
        let result = (|| {
            self.ranges.check(request.dst, len)?;
            let dst = self.moved_variables.here(request.dst);
            let stream = self.stream(request.stream)?;
            self.refuse_while_capturing(stream)?;
            let mut offset = 0;
            while offset < len {
                let mut staging = self.device.staging(chunk_len(len - offset, self.config.copy_chunk)?)?;
                let bytes = D::staging_bytes(&mut staging);
                let piece = bytes.len() as u64;
                if !bulk.read_into(bytes) {
                    // The connection broke; the session ends after this op.
                    return Ok(());
                }
                self.device.copy_htod(dst + offset, staging, stream)?;
                offset += piece;
            }
            Ok(())
        })();
        if result.is_ok() {
            self.count_copy(request.stream, crate::stats::Copied::HostToDeviceSocket, len);
        }
        reply.send(result.map(|()| rep::MemcpyHtoD {}));
    }

    fn memcpy_dtoh(&mut self, request: req::MemcpyDtoH, reply: Responder<rep::MemcpyDtoH>) {
        let started = (|| {
            if request.len > self.config.copy_chunk {
                return Err(CudaError::INVALID_VALUE);
            }
            self.ranges.check(request.src, request.len)?;
            let stream = self.stream(request.stream)?;
            self.refuse_while_capturing(stream)?;
            let staging = self.device.staging(chunk_len(request.len, self.config.copy_chunk)?)?;
            self.device.start_dtoh(self.moved_variables.here(request.src), staging, stream)
        })();
        let copy = match started {
            Ok(copy) => copy,
            Err(error) => return reply.send(Err(error)),
        };
        self.count_copy(request.stream, crate::stats::Copied::DeviceToHostSocket, request.len);
        self.hold_copy(copy, request.stream, request.blocking, reply, rep::MemcpyDtoH {});
    }

    fn memcpy_htod_striped(&mut self, request: req::MemcpyHtoDStriped, reply: Responder<rep::MemcpyHtoDStriped>) {
        let checked = (|| {
            self.ranges.check(request.dst, request.len)?;
            let stream = self.stream(request.stream)?;
            self.refuse_while_capturing(stream)?;
            Ok(stream)
        })();
        let result = match &self.stripes {
            // Refused copies still read their chunks, which are on their way.
            Some(stripes) => {
                let (stream, refused) = match checked {
                    Ok(stream) => (stream, None),
                    Err(error) => (self.device.null_stream(), Some(error)),
                };
                let dst = self.moved_variables.here(request.dst);
                let copy = crate::stripes::StripedCopy { device: dst, len: request.len, chunk: request.chunk, transfer: request.transfer };
                stripes.receive(copy, stream, self.config.copy_chunk, refused)
            }
            None => checked.and(Err(CudaError::NOT_SUPPORTED)),
        };
        if result.is_ok() {
            self.count_copy(request.stream, crate::stats::Copied::HostToDeviceSocket, request.len);
        }
        // A resumable session's client copies again over its main connection (`crate::reconnect`).
        let result = match result {
            Err(CudaError::DEVICES_UNAVAILABLE) if self.stripes.as_ref().is_some_and(|stripes| stripes.broken_copies_come_again()) => {
                tracing::info!(len = request.len, "a data connection broke under a striped copy: the client sends it again");
                Ok(rep::MemcpyHtoDStriped { again: true })
            }
            other => other.map(|()| rep::MemcpyHtoDStriped { again: false }),
        };
        reply.send(result);
    }

    fn memcpy_dtoh_striped(&mut self, request: req::MemcpyDtoHStriped, reply: Responder<rep::MemcpyDtoHStriped>) {
        let result = (|| {
            self.ranges.check(request.src, request.len)?;
            let stream = self.stream(request.stream)?;
            self.refuse_while_capturing(stream)?;
            let stripes = self.stripes.as_ref().ok_or(CudaError::NOT_SUPPORTED)?;
            let src = self.moved_variables.here(request.src);
            let copy = crate::stripes::StripedCopy { device: src, len: request.len, chunk: request.chunk, transfer: request.transfer };
            stripes.send(copy, stream, self.config.copy_chunk, request.compress)
        })();
        if result.is_ok() {
            self.count_copy(request.stream, crate::stats::Copied::DeviceToHostSocket, request.len);
        }
        if request.blocking && self.may_print {
            self.outbox.send_output();
        }
        reply.send(result.map(|()| rep::MemcpyDtoHStriped {}));
    }

    fn memcpy_dtod(&mut self, request: req::MemcpyDtoD, reply: Responder<rep::MemcpyDtoD>) {
        let result = self
            .ranges
            .check(request.src, request.len)
            .and_then(|()| self.ranges.check(request.dst, request.len))
            .and_then(|()| self.stream(request.stream))
            .and_then(|stream| {
                let (dst, src) = (self.moved_variables.here(request.dst), self.moved_variables.here(request.src));
                self.device.copy_dtod(dst, src, request.len, stream)
            });
        if result.is_ok() {
            self.queued(request.stream, Work::Copies);
        }
        reply.send(result.map(|()| rep::MemcpyDtoD {}));
    }

    fn memset(&mut self, request: req::Memset, reply: Responder<rep::Memset>) {
        let width = u64::from(request.width);
        let whole_elements = matches!(width, 1 | 2 | 4) && request.dst.is_multiple_of(width) && request.len.is_multiple_of(width);
        let result = (|| {
            let device_memory = self.ranges.check(request.dst, request.len).is_ok();
            // Or pinned host memory mapped at the client's address: kernels and memsets use it as
            // device memory, as under unified addressing.
            let mapped_host = !device_memory && self.shm.as_ref().is_some_and(|segment| segment.aliases(request.dst, request.len));
            if !whole_elements || !(device_memory || mapped_host) {
                return Err(CudaError::INVALID_VALUE);
            }
            let stream = self.stream(request.stream)?;
            let (dst, pattern, width, len) = (self.moved_variables.here(request.dst), request.pattern, request.width, request.len);
            if device_memory {
                return self.device.memset(dst, pattern, width, len, stream);
            }
            // SAFETY: the range lies in a block mapped at the client's address and registered
            // mapped (checked above); a block is unmapped only after the device is synchronized.
            unsafe { self.device.memset_mapped_host(dst, pattern, width, len, stream) }
        })();
        if result.is_ok() {
            self.queued(request.stream, Work::Copies);
        }
        reply.send(result.map(|()| rep::Memset {}));
    }

    fn register_module(&mut self, request: req::RegisterModule, bulk: &mut BulkIn<'_>, reply: Responder<rep::RegisterModule>) {
        if self.modules.contains_key(&request.module) {
            return reply.send(Err(CudaError::INVALID_VALUE));
        }
        let image = match request.cached {
            Some(digest) => {
                if bulk.remaining() != 0 {
                    // Bytes with a digest: which one to load would be ambiguous.
                    return reply.send(Err(CudaError::INVALID_VALUE));
                }
                match self.config.image_cache.as_ref().and_then(|cache| cache.get(&digest)) {
                    Some(image) => {
                        tracing::info!(module = request.module, bytes = image.len(), "module image from the cache");
                        image
                    }
                    None => return reply.send(Ok(rep::RegisterModule { image_needed: true })),
                }
            }
            None => match bulk.read_all() {
                Some(image) => image,
                None => return reply.send(Err(CudaError::INVALID_VALUE)),
            },
        };
        self.may_print |= may_print(&image);
        let loaded = self.device.load_module(&image);
        let image = Arc::new(image);
        // Cached whether or not this device takes it: a later session sending the same bytes
        // would get the same answer.
        if let Some(cache) = self.config.image_cache.as_ref().filter(|_| request.cached.is_none() && image.len() >= CACHED_IMAGE_MIN) {
            cache.put_later(image.clone());
        }
        let module = match loaded {
            Ok(module) => module,
            Err(error) => {
                tracing::info!(module = request.module, %error, "module not loaded");
                return reply.send(Err(error));
            }
        };
        let device = self.device.current_device();
        let loaded =
            LoadedModule::<D> { module, device, image, functions: Vec::new(), function_names: HashMap::new(), variables: Vec::new() };
        self.modules.insert(request.module, loaded);
        reply.send(Ok(rep::RegisterModule { image_needed: false }));
    }

    fn module_get_function(&mut self, request: req::ModuleGetFunction, reply: Responder<rep::ModuleGetFunction>) {
        let Some(loaded) = self.modules.get_mut(&request.module) else {
            return reply.send(Err(CudaError::INVALID_DEVICE_FUNCTION));
        };
        if let Some(index) = loaded.function_names.get(&request.name) {
            let result = match loaded.functions.get(*index as usize) {
                Some(Ok(kernel)) => Ok(kernel.params.clone()),
                Some(Err(error)) => Err(*error),
                None => Err(CudaError::INVALID_DEVICE_FUNCTION),
            };
            return reply.send(result.map(|params| rep::ModuleGetFunction { index: *index, params }));
        }
        if loaded.functions.len() >= MAX_FUNCTIONS_PER_MODULE {
            return reply.send(Err(CudaError::MEMORY_ALLOCATION));
        }
        // A name the module lacks is not remembered: a wrong guess costs nothing.
        let result = self.device.function(&loaded.module, &request.name).map(|(function, params)| {
            let index = u32::try_from(loaded.functions.len()).unwrap_or(u32::MAX);
            loaded.functions.push(Ok(Kernel::new(function, params.clone())));
            loaded.function_names.insert(request.name, index);
            rep::ModuleGetFunction { index, params }
        });
        reply.send(result);
    }

    fn module_function_names(&mut self, request: req::ModuleFunctionNames, reply: Responder<rep::ModuleFunctionNames>) {
        let Some(loaded) = self.modules.get(&request.module) else {
            return reply.send(Err(CudaError::INVALID_RESOURCE_HANDLE));
        };
        reply.send(self.device.function_names(&loaded.module).map(|names| rep::ModuleFunctionNames { names }));
    }

    fn module_get_global(&mut self, request: req::ModuleGetGlobal, reply: Responder<rep::ModuleGetGlobal>) {
        if !self.modules.contains_key(&request.module) {
            return reply.send(Err(CudaError::INVALID_RESOURCE_HANDLE));
        }
        // A variable is per device: the current device's copy.
        let device = self.device.clone();
        let found = match self.module_here(request.module) {
            Ok(loaded) => device.variable(&loaded.module, &request.name),
            Err(error) => return reply.send(Err(error)),
        };
        let result = found.and_then(|(here, size, managed)| {
            // A variable that moved keeps the address the app first got.
            let address = self.moved_variables.app_address(here).unwrap_or(here);
            let loaded = self.module_here(request.module)?;
            if !loaded.variables.iter().any(|(_, known, _)| *known == address) {
                loaded.variables.push((request.name.clone(), address, size));
                self.ranges.insert(address, size, RangeKind::Variable);
            }
            Ok(rep::ModuleGetGlobal { address, size, managed })
        });
        reply.send(result);
    }

    fn link_create(&mut self, request: req::LinkCreate, reply: Responder<rep::LinkCreate>) {
        if self.links.contains_key(&request.link) || !request.options.iter().all(JitOption::forwarded) {
            return reply.send(Err(CudaError::INVALID_VALUE));
        }
        if self.links.len() >= MAX_LINKS {
            return reply.send(Err(CudaError::MEMORY_ALLOCATION));
        }
        let (info_log, error_log) = (request.info_log.min(MAX_LINK_LOG), request.error_log.min(MAX_LINK_LOG));
        let result = self.device.link_create(&request.options, info_log as usize, error_log as usize).map(|link| {
            self.links.insert(request.link, Linked { link, info_log, error_log, cubin: None });
            rep::LinkCreate {}
        });
        reply.send(result);
    }

    fn link_add(&mut self, request: req::LinkAdd, bulk: &mut BulkIn<'_>, reply: Responder<rep::LinkAdd>) {
        let Some(data) = bulk.read_all().filter(|_| request.options.iter().all(JitOption::forwarded)) else {
            return reply.send(Err(CudaError::INVALID_VALUE));
        };
        let Some(linked) = self.links.get_mut(&request.link) else {
            return reply.send(Err(CudaError::INVALID_RESOURCE_HANDLE));
        };
        if linked.cubin.is_some() {
            // The driver takes no inputs after cuLinkComplete.
            return reply.send(Err(CudaError::INVALID_VALUE));
        }
        let outcome = self.device.link_add(&mut linked.link, request.kind, &request.name, data, &request.options);
        reply.send(Ok(rep::LinkAdd { outcome: linked.fitted(outcome) }));
    }

    fn link_complete(&mut self, request: req::LinkComplete, reply: Responder<rep::LinkComplete>) {
        let Some(linked) = self.links.get_mut(&request.link) else {
            return reply.send(Err(CudaError::INVALID_RESOURCE_HANDLE));
        };
        let (outcome, cubin) = self.device.link_complete(&mut linked.link);
        let size = cubin.len() as u64;
        if outcome.error.is_none() {
            linked.cubin = Some(cubin);
        }
        reply.send(Ok(rep::LinkComplete { outcome: linked.fitted(outcome), size }));
    }

    fn link_read(&mut self, request: req::LinkRead, reply: Responder<rep::LinkRead>) {
        let Some(cubin) = self.links.get(&request.link).and_then(|linked| linked.cubin.as_ref()) else {
            return reply.send(Err(CudaError::INVALID_RESOURCE_HANDLE));
        };
        let range = usize::try_from(request.offset)
            .ok()
            .zip(usize::try_from(request.len).ok())
            .filter(|_| request.len <= self.config.copy_chunk)
            .and_then(|(offset, len)| Some(offset..offset.checked_add(len)?))
            .filter(|range| range.end <= cubin.len());
        match range {
            Some(range) => reply.send_with_bulk(Ok(rep::LinkRead {}), &cubin[range]),
            None => reply.send(Err(CudaError::INVALID_VALUE)),
        }
    }

    fn link_destroy(&mut self, request: req::LinkDestroy, reply: Responder<rep::LinkDestroy>) {
        let result = self.links.remove(&request.link).map(|_| rep::LinkDestroy {}).ok_or(CudaError::INVALID_RESOURCE_HANDLE);
        reply.send(result);
    }

    fn occupancy_available_dynamic_smem(
        &mut self,
        request: req::OccupancyAvailableDynamicSmem,
        reply: Responder<rep::OccupancyAvailableDynamicSmem>,
    ) {
        let result = self
            .function(request.function)
            .and_then(|(function, _)| self.device.available_dynamic_smem(function, request.num_blocks, request.block_size));
        reply.send(result.map(|bytes| rep::OccupancyAvailableDynamicSmem { bytes }));
    }

    fn occupancy_max_active_clusters(
        &mut self,
        request: req::OccupancyMaxActiveClusters,
        reply: Responder<rep::OccupancyMaxActiveClusters>,
    ) {
        let result = self.function(request.function).and_then(|(function, _)| {
            self.device.occupancy_max_active_clusters(
                function,
                LaunchShape { grid: request.grid, block: request.block, shared_mem: request.shared_mem, attributes: &request.attributes },
            )
        });
        reply.send(result.map(|clusters| rep::OccupancyMaxActiveClusters { clusters }));
    }

    fn unregister_module(&mut self, request: req::UnregisterModule, reply: Responder<rep::UnregisterModule>) {
        let result = match self.modules.remove(&request.module) {
            Some(module) => {
                let others: Vec<(u32, usize)> = self.elsewhere.keys().filter(|(id, _)| *id == request.module).copied().collect();
                let loads = others.into_iter().filter_map(|key| self.elsewhere.remove(&key));
                let mut result = Ok(());
                for module in std::iter::once(module).chain(loads.collect::<Vec<_>>()) {
                    for (_, address, size) in &module.variables {
                        self.ranges.remove_within(*address, *size, RangeKind::Variable);
                        self.moved_variables.remove(*address);
                    }
                    result = result.and(self.device.unload_module(module.module));
                }
                result
            }
            None => Err(CudaError::INVALID_VALUE),
        };
        reply.send(result.map(|()| rep::UnregisterModule {}));
    }

    fn launch(&mut self, mut request: req::Launch, reply: Responder<rep::Launch>) {
        let result = self.function(request.function).and_then(|(function, args_len)| {
            // The driver reads exactly the layout's bytes: a short buffer must never reach it.
            if request.args.len() as u64 != args_len {
                return Err(CudaError::INVALID_VALUE);
            }
            let stream = self.stream(request.stream)?;
            if !self.moved_variables.is_empty() {
                // A pointer argument may name a variable by the address the app knows it by.
                for word in request.args.chunks_exact_mut(8) {
                    let value = u64::from_le_bytes(<[u8; 8]>::try_from(&*word).unwrap_or_default());
                    word.copy_from_slice(&self.moved_variables.here(value).to_le_bytes());
                }
            }
            self.device.launch(
                function,
                LaunchShape { grid: request.grid, block: request.block, shared_mem: request.shared_mem, attributes: &request.attributes },
                stream,
                &mut request.args,
            )
        });
        if result.is_ok() {
            self.queued(request.stream, Work::Kernels);
            if let Some(stats) = &self.config.stats {
                stats.kernel();
            }
        }
        reply.send(result.map(|()| rep::Launch {}));
    }

    fn func_get_attributes(&mut self, request: req::FuncGetAttributes, reply: Responder<rep::FuncGetAttributes>) {
        let result = self
            .function(request.function)
            .and_then(|(function, _)| self.device.func_attributes(function))
            .map(|attributes| rep::FuncGetAttributes { attributes });
        reply.send(result);
    }

    fn func_set_attribute(&mut self, request: req::FuncSetAttribute, reply: Responder<rep::FuncSetAttribute>) {
        let result = self
            .function(request.function)
            .and_then(|(function, _)| self.device.func_set_attribute(function, request.attribute, request.value));
        if result.is_ok()
            && let Ok(module) = self.module_here(request.function.module)
            && let Some(Ok(kernel)) = module.functions.get_mut(request.function.index as usize)
        {
            kernel.attributes_set.retain(|(attribute, _)| *attribute != request.attribute);
            kernel.attributes_set.push((request.attribute, request.value));
        }
        reply.send(result.map(|()| rep::FuncSetAttribute {}));
    }

    fn occupancy_max_active_blocks(&mut self, request: req::OccupancyMaxActiveBlocks, reply: Responder<rep::OccupancyMaxActiveBlocks>) {
        let result = self
            .function(request.function)
            .and_then(|(function, _)| self.device.occupancy(function, request.block_size, request.dynamic_shared_mem, request.flags));
        reply.send(result.map(|blocks| rep::OccupancyMaxActiveBlocks { blocks }));
    }

    fn stream_create(&mut self, request: req::StreamCreate, reply: Responder<rep::StreamCreate>) {
        let result = if request.stream == 0 || self.streams.contains_key(&request.stream) {
            Err(CudaError::INVALID_VALUE)
        } else if self.streams.len() >= MAX_HANDLES {
            Err(CudaError::MEMORY_ALLOCATION)
        } else {
            self.device.stream_create(request.flags, request.priority).map(|stream| {
                self.streams.insert(request.stream, stream);
                self.stream_params.insert(request.stream, (request.flags, request.priority));
                self.owners.stream_made(request.stream, self.device.current_device());
            })
        };
        reply.send(result.map(|()| rep::StreamCreate {}));
    }

    fn stream_destroy(&mut self, request: req::StreamDestroy, reply: Responder<rep::StreamDestroy>) {
        self.stream_params.remove(&request.stream);
        self.green.forget_stream(request.stream);
        let result = match self.streams.remove(&request.stream) {
            Some(stream) => self.device.stream_destroy(stream),
            None => Err(CudaError::INVALID_RESOURCE_HANDLE),
        };
        self.activity().stream_destroyed(request.stream);
        reply.send(result.map(|()| rep::StreamDestroy {}));
    }

    fn stream_synchronize(&mut self, request: req::StreamSynchronize, reply: Responder<rep::StreamSynchronize>) {
        self.when_stream_done(request.stream, true, move |done| reply.send(done.map(|()| rep::StreamSynchronize {})));
    }

    fn stream_query(&mut self, request: req::StreamQuery, reply: Responder<rep::StreamQuery>) {
        let mark = self.wait_mark(request.stream);
        let result = self.stream(request.stream).and_then(|stream| self.device.stream_query(stream));
        self.seeing_done(mark, move |result| reply.send(result.map(|()| rep::StreamQuery {})))(result);
    }

    fn stream_wait_event(&mut self, request: req::StreamWaitEvent, reply: Responder<rep::StreamWaitEvent>) {
        let result = self
            .stream(request.stream)
            .and_then(|stream| Ok((stream, self.event(request.event)?)))
            .and_then(|(stream, event)| self.device.stream_wait_event(stream, event, request.flags));
        reply.send(result.map(|()| rep::StreamWaitEvent {}));
    }

    fn event_create(&mut self, request: req::EventCreate, reply: Responder<rep::EventCreate>) {
        let result = if request.event == 0 || self.events.contains_key(&request.event) {
            Err(CudaError::INVALID_VALUE)
        } else if self.events.len() >= MAX_HANDLES {
            Err(CudaError::MEMORY_ALLOCATION)
        } else {
            self.device.event_create(request.flags).map(|event| {
                self.events.insert(request.event, event);
                self.event_flags.insert(request.event, request.flags);
                self.owners.event_made(request.event, self.device.current_device());
            })
        };
        reply.send(result.map(|()| rep::EventCreate {}));
    }

    fn event_record(&mut self, request: req::EventRecord, reply: Responder<rep::EventRecord>) {
        let result = self
            .event(request.event)
            .and_then(|event| Ok((event, self.stream(request.stream)?)))
            .and_then(|(event, stream)| self.device.event_record(event, stream, request.flags));
        if result.is_ok() {
            self.activity().event_recorded(request.event, request.stream);
        }
        reply.send(result.map(|()| rep::EventRecord {}));
    }

    fn event_synchronize(&mut self, request: req::EventSynchronize, reply: Responder<rep::EventSynchronize>) {
        let event = match self.event(request.event) {
            Ok(event) => event,
            Err(error) => return reply.send(Err(error)),
        };
        let answer = self
            .seeing_done(self.activity().event_mark(request.event), move |result| reply.send(result.map(|()| rep::EventSynchronize {})));
        self.when_event_done(event, self.may_print, false, answer);
    }

    fn event_query(&mut self, request: req::EventQuery, reply: Responder<rep::EventQuery>) {
        let mark = self.activity().event_mark(request.event);
        let result = self.event(request.event).and_then(|event| self.device.event_query(event));
        self.seeing_done(mark, move |result| reply.send(result.map(|()| rep::EventQuery {})))(result);
    }

    fn event_elapsed_time(&mut self, request: req::EventElapsedTime, reply: Responder<rep::EventElapsedTime>) {
        let result = self
            .event(request.start)
            .and_then(|start| Ok((start, self.event(request.end)?)))
            .and_then(|(start, end)| self.device.event_elapsed(start, end));
        reply.send(result.map(|milliseconds| rep::EventElapsedTime { milliseconds }));
    }

    fn event_destroy(&mut self, request: req::EventDestroy, reply: Responder<rep::EventDestroy>) {
        self.event_flags.remove(&request.event);
        self.activity().event_destroyed(request.event);
        let result = match self.events.remove(&request.event) {
            Some(event) => self.device.event_destroy(event),
            None => Err(CudaError::INVALID_RESOURCE_HANDLE),
        };
        reply.send(result.map(|()| rep::EventDestroy {}));
    }

    fn device_synchronize(&mut self, _request: req::DeviceSynchronize, reply: Responder<rep::DeviceSynchronize>) {
        self.when_device_idle(move |result| reply.send(result.map(|()| rep::DeviceSynchronize {})));
    }

    fn device_reset(&mut self, _request: req::DeviceReset, reply: Responder<rep::DeviceReset>) {
        // A sticky error does not stop a reset: clearing it is what a reset is for.
        if let Err(error) = self.device.synchronize() {
            tracing::info!(%error, "device reset after an error");
        }
        if self.may_print {
            self.outbox.send_output();
        }
        // Finished device-to-host copies go out now, freeing their staging buffers, and every
        // waiter finishes its (now immediate) wait: nothing may use the old context past here.
        self.outbox.send_ready();
        if !self.waiters.wait_idle(RESET_DRAIN) {
            tracing::warn!("device reset with a waiter still busy");
        }
        self.release_everything();
        self.owners.reset(self.device.current_device());
        self.activity().forget_all();
        // Errors of work queued before the reset went with its context.
        let _ = self.outbox.take_deferred();
        // The private events go with the context.
        self.spare_events.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clear();
        let result = self.device.reset().map(|()| {
            self.waiters.rebind();
            self.pin_segment_again();
            if let Some(pager) = &self.pager {
                pager.pin_pool_again();
            }
            self.reload_modules();
        });
        if let Err(error) = result {
            tracing::error!(%error, "device reset failed");
        }
        reply.send(result.map(|()| rep::DeviceReset {}));
    }

    fn device_set_limit(&mut self, request: req::DeviceSetLimit, reply: Responder<rep::DeviceSetLimit>) {
        reply.send(self.device.set_limit(request.limit, request.value).map(|()| rep::DeviceSetLimit {}));
    }

    fn func_set_cache_config(&mut self, request: req::FuncSetCacheConfig, reply: Responder<rep::FuncSetCacheConfig>) {
        let result = self.function(request.function).and_then(|(function, _)| self.device.func_set_cache_config(function, request.config));
        reply.send(result.map(|()| rep::FuncSetCacheConfig {}));
    }

    fn device_set_cache_config(&mut self, request: req::DeviceSetCacheConfig, reply: Responder<rep::DeviceSetCacheConfig>) {
        reply.send(self.device.set_cache_config(request.config).map(|()| rep::DeviceSetCacheConfig {}));
    }

    fn device_get_cache_config(&mut self, _request: req::DeviceGetCacheConfig, reply: Responder<rep::DeviceGetCacheConfig>) {
        reply.send(self.device.cache_config().map(|config| rep::DeviceGetCacheConfig { config }));
    }

    fn profiler_control(&mut self, request: req::ProfilerControl, reply: Responder<rep::ProfilerControl>) {
        reply.send(self.device.profiler(request.start).map(|()| rep::ProfilerControl {}));
    }

    fn reset_persisting_l2_cache(&mut self, _request: req::ResetPersistingL2Cache, reply: Responder<rep::ResetPersistingL2Cache>) {
        reply.send(self.device.reset_persisting_l2_cache().map(|()| rep::ResetPersistingL2Cache {}));
    }

    fn device_get_limit(&mut self, request: req::DeviceGetLimit, reply: Responder<rep::DeviceGetLimit>) {
        reply.send(self.device.get_limit(request.limit).map(|value| rep::DeviceGetLimit { value }));
    }

    fn shm_register(&mut self, request: req::ShmRegister, reply: Responder<rep::ShmRegister>) {
        let Some(segment) = self.shm.as_mut() else {
            return reply.send(Err(CudaError::NOT_SUPPORTED));
        };
        let mapped_at = (request.mapped_at != 0).then_some(request.mapped_at);
        let result = pin_block(segment, &*self.device, request.offset, request.len, mapped_at);
        reply.send(result.map(|device_pointer| rep::ShmRegister { device_pointer }));
    }

    fn shm_unregister(&mut self, request: req::ShmUnregister, reply: Responder<rep::ShmUnregister>) {
        let Some(segment) = self.shm.as_mut() else {
            return reply.send(Err(CudaError::NOT_SUPPORTED));
        };
        let result = match segment.remove_block(request.offset) {
            // cudaFreeHost waits for the device, so no copy or kernel still uses the block; its
            // alias (if any) is unmapped after it is unpinned.
            // SAFETY: the block was registered by this session at `pinned`.
            Some((pinned, _alias)) => self.device.synchronize().and_then(|()| unsafe { self.device.host_unregister(pinned) }),
            None => Err(CudaError::HOST_MEMORY_NOT_REGISTERED),
        };
        reply.send(result.map(|()| rep::ShmUnregister {}));
    }

    fn shm_file_ticket(&mut self, _request: req::ShmFileTicket, reply: Responder<rep::ShmFileTicket>) {
        // Only a session with a segment of its own is on the app's host (a VM's is not).
        if self.shm.as_ref().is_none_or(Segment::is_region) {
            return reply.send(Err(CudaError::NOT_SUPPORTED));
        }
        let ticket = self.vmm.socket().ticket().map_err(|error| {
            tracing::warn!(%error, "no deposit ticket");
            CudaError::OPERATING_SYSTEM
        });
        reply.send(ticket.map(|(socket, token)| rep::ShmFileTicket { socket, token }));
    }

    fn shm_register_file(&mut self, request: req::ShmRegisterFile, reply: Responder<rep::ShmRegisterFile>) {
        let result = (|| {
            let segment = self.shm.as_mut().filter(|segment| !segment.is_region()).ok_or(CudaError::NOT_SUPPORTED)?;
            let file = std::fs::File::from(self.vmm.socket().take_deposit(&request.token).ok_or(CudaError::INVALID_VALUE)?);
            let metadata = file.metadata().map_err(|_| CudaError::INVALID_VALUE)?;
            let end = request.file_offset.checked_add(request.len).ok_or(CudaError::INVALID_VALUE)?;
            // Mapped pages may run past the end into the file's last page (NCCL's segments end
            // 4 bytes into one), never past it.
            if !metadata.is_file() || end > metadata.len().next_multiple_of(crate::shm::PAGE) {
                return Err(CudaError::INVALID_VALUE);
            }
            let host_len = usize::try_from(request.len).map_err(|_| CudaError::INVALID_VALUE)?;
            let pinned = segment.add_file(&file, request.file_offset, request.len, request.mapped_at)?;
            // SAFETY: the file is mapped at `pinned` until it is removed, after it is unpinned.
            let registered = unsafe { register_mapped(&*self.device, pinned, host_len) }.map(|()| request.mapped_at);
            if registered.is_err() {
                segment.remove_file(request.mapped_at);
            }
            registered
        })();
        reply.send(result.map(|device_pointer| rep::ShmRegisterFile { device_pointer }));
    }

    fn shm_unregister_file(&mut self, request: req::ShmUnregisterFile, reply: Responder<rep::ShmUnregisterFile>) {
        let Some(segment) = self.shm.as_mut() else {
            return reply.send(Err(CudaError::NOT_SUPPORTED));
        };
        let result = match segment.remove_file(request.mapped_at) {
            // As for a block: no work may still use the pages when they are unpinned, and the
            // mapping goes after (when `_alias` drops).
            // SAFETY: the file was registered by this session at `mapped_at`.
            Some(_alias) => self.device.synchronize().and_then(|()| unsafe { self.device.host_unregister(request.mapped_at as *mut u8) }),
            None => Err(CudaError::HOST_MEMORY_NOT_REGISTERED),
        };
        reply.send(result.map(|()| rep::ShmUnregisterFile {}));
    }

    fn shm_copy_htod(&mut self, request: req::ShmCopyHtoD, reply: Responder<rep::ShmCopyHtoD>) {
        let result = (|| {
            let segment = self.shm.as_ref().ok_or(CudaError::NOT_SUPPORTED)?;
            let source = segment.pinned(request.offset, request.len)?;
            let staged = request.offset < segment.staging();
            self.ranges.check(request.dst, request.len)?;
            let stream = self.stream(request.stream)?;
            // Staging slots are reused; registered blocks are the app's own pinned memory,
            // which a captured copy may name.
            if staged {
                self.refuse_while_capturing(stream)?;
            }
            let len = usize::try_from(request.len).map_err(|_| CudaError::INVALID_VALUE)?;
            // SAFETY: the source range is pinned segment memory (checked above), mapped while
            // it is pinned; the destination was validated against the session's ranges.
            unsafe { self.device.copy_from_host(self.moved_variables.here(request.dst), source, len, stream) }
        })();
        if result.is_ok() {
            self.count_copy(request.stream, crate::stats::Copied::HostToDeviceShm, request.len);
        }
        reply.send(result.map(|()| rep::ShmCopyHtoD {}));
    }

    fn shm_copy_dtoh(&mut self, request: req::ShmCopyDtoH, reply: Responder<rep::ShmCopyDtoH>) {
        let result = (|| {
            let segment = self.shm.as_ref().ok_or(CudaError::NOT_SUPPORTED)?;
            let target = segment.pinned(request.offset, request.len)?;
            let staged = request.offset < segment.staging();
            self.ranges.check(request.src, request.len)?;
            let stream = self.stream(request.stream)?;
            // Staging slots are reused; registered blocks are the app's own pinned memory,
            // which a captured copy may name.
            if staged {
                self.refuse_while_capturing(stream)?;
            }
            let len = usize::try_from(request.len).map_err(|_| CudaError::INVALID_VALUE)?;
            // SAFETY: as in `shm_copy_htod`, the other way round.
            unsafe { self.device.copy_to_host(target, self.moved_variables.here(request.src), len, stream) }
        })();
        if result.is_ok() {
            self.count_copy(request.stream, crate::stats::Copied::DeviceToHostShm, request.len);
        }
        reply.send(result.map(|()| rep::ShmCopyDtoH {}));
    }

    fn stream_priority_range(&mut self, _request: req::StreamPriorityRange, reply: Responder<rep::StreamPriorityRange>) {
        reply.send(self.device.stream_priority_range().map(|(least, greatest)| rep::StreamPriorityRange { least, greatest }));
    }

    fn shm_fence(&mut self, request: req::ShmFence, reply: Responder<rep::ShmFence>) {
        self.when_stream_done(request.stream, false, move |done| reply.send(done.map(|()| rep::ShmFence {})));
    }

    // --- a session on several GPUs ---
    fn set_device(&mut self, request: req::SetDevice, reply: Responder<rep::SetDevice>) {
        let index = usize::try_from(request.index).unwrap_or(usize::MAX);
        let result = if index == self.device.current_device() { Ok(()) } else { self.device.select_device(index) };
        if result.is_err() && !std::mem::replace(&mut self.foreign_device_logged, true) {
            tracing::warn!(
                index = request.index,
                devices = self.device.device_count(),
                "a device outside the session's refused (CUDA_ERROR_INVALID_DEVICE; logged once a session)"
            );
        }
        reply.send(result.map(|()| rep::SetDevice {}));
    }

    fn peer_access(&mut self, request: req::PeerAccess, reply: Responder<rep::PeerAccess>) {
        let peer = usize::try_from(request.peer).unwrap_or(usize::MAX);
        let result = self.device.peer_access(peer, request.enable, request.flags);
        if result.is_ok() {
            self.owners.peer_access(self.device.current_device(), peer, request.enable, request.flags);
        }
        reply.send(result.map(|()| rep::PeerAccess {}));
    }

    // --- stream-ordered allocation (session/pools.rs) ---
    fn mem_alloc_async(&mut self, request: req::MemAllocAsync, reply: Responder<rep::MemAllocAsync>) {
        Session::pool_alloc_async(self, request, reply);
    }

    fn mem_free_async(&mut self, request: req::MemFreeAsync, reply: Responder<rep::MemFreeAsync>) {
        Session::pool_free_async(self, request, reply);
    }

    fn mem_pool_attribute(&mut self, request: req::MemPoolAttribute, reply: Responder<rep::MemPoolAttribute>) {
        Session::pool_attribute(self, request, reply);
    }

    fn mem_pool_trim(&mut self, request: req::MemPoolTrim, reply: Responder<rep::MemPoolTrim>) {
        Session::pool_trim(self, request, reply);
    }

    fn mem_pool_create(&mut self, request: req::MemPoolCreate, reply: Responder<rep::MemPoolCreate>) {
        Session::pool_create(self, request, reply);
    }

    fn mem_pool_destroy(&mut self, request: req::MemPoolDestroy, reply: Responder<rep::MemPoolDestroy>) {
        Session::pool_destroy(self, request, reply);
    }

    fn device_mem_pool(&mut self, request: req::DeviceMemPool, reply: Responder<rep::DeviceMemPool>) {
        Session::pool_current(self, request, reply);
    }

    fn stream_attribute(&mut self, request: req::StreamAttribute, reply: Responder<rep::StreamAttribute>) {
        use flyt_protocol::ops::stream_attribute::{ACCESS_POLICY_WINDOW, ALL, VALUE_LEN};
        let result = (|| {
            if !ALL.contains(&request.attribute) {
                return Err(CudaError::INVALID_VALUE);
            }
            let set = self.launch_attribute_value::<VALUE_LEN>(request.set.as_deref(), request.attribute == ACCESS_POLICY_WINDOW)?;
            let stream = self.stream(request.stream)?;
            let value = self.device.stream_attribute(stream, request.attribute, set.as_ref())?;
            Ok(rep::StreamAttribute { value: value.to_vec() })
        })();
        reply.send(result);
    }

    fn stream_capture_dependencies(&mut self, request: req::StreamCaptureDependencies, reply: Responder<rep::StreamCaptureDependencies>) {
        self.capture_dependencies(request, reply);
    }

    fn stream_mem_ops(&mut self, request: req::StreamMemOps, reply: Responder<rep::StreamMemOps>) {
        self.mem_ops(request, reply);
    }

    fn tensor_map_encode(&mut self, request: req::TensorMapEncode, reply: Responder<rep::TensorMapEncode>) {
        self.encode_tensor_map(request, reply);
    }

    fn tensor_map_replace_address(&mut self, request: req::TensorMapReplaceAddress, reply: Responder<rep::TensorMapReplaceAddress>) {
        self.replace_tensor_map_address(request, reply);
    }

    fn context_event(&mut self, request: req::ContextEvent, reply: Responder<rep::ContextEvent>) {
        self.ctx_event(request, reply);
    }

    fn dev_resource_get(&mut self, request: req::DevResourceGet, reply: Responder<rep::DevResourceGet>) {
        self.get_dev_resource(request, reply);
    }

    fn dev_resource_split(&mut self, request: req::DevResourceSplit, reply: Responder<rep::DevResourceSplit>) {
        self.split_dev_resource(request, reply);
    }

    fn dev_resource_desc(&mut self, request: req::DevResourceDesc, reply: Responder<rep::DevResourceDesc>) {
        self.generate_resource_desc(request, reply);
    }

    fn green_ctx_create(&mut self, request: req::GreenCtxCreate, reply: Responder<rep::GreenCtxCreate>) {
        self.create_green_ctx(request, reply);
    }

    fn green_ctx_destroy(&mut self, request: req::GreenCtxDestroy, reply: Responder<rep::GreenCtxDestroy>) {
        self.destroy_green_ctx(request, reply);
    }

    fn green_stream_create(&mut self, request: req::GreenStreamCreate, reply: Responder<rep::GreenStreamCreate>) {
        self.create_green_stream(request, reply);
    }

    fn green_ctx_event(&mut self, request: req::GreenCtxEvent, reply: Responder<rep::GreenCtxEvent>) {
        self.green_ctx_event_op(request, reply);
    }

    fn mem_pool_access(&mut self, request: req::MemPoolAccess, reply: Responder<rep::MemPoolAccess>) {
        self.pool_access(request, reply);
    }

    fn occupancy_max_potential_cluster_size(
        &mut self,
        request: req::OccupancyMaxPotentialClusterSize,
        reply: Responder<rep::OccupancyMaxPotentialClusterSize>,
    ) {
        let result = self.function(request.function).and_then(|(function, _)| {
            self.device.occupancy_max_potential_cluster_size(
                function,
                LaunchShape { grid: request.grid, block: request.block, shared_mem: request.shared_mem, attributes: &request.attributes },
            )
        });
        reply.send(result.map(|cluster_size| rep::OccupancyMaxPotentialClusterSize { cluster_size }));
    }

    fn ipc_get_mem_handle(&mut self, request: req::IpcGetMemHandle, reply: Responder<rep::IpcGetMemHandle>) {
        self.export_memory(request, reply);
    }

    fn ipc_open_mem_handle(&mut self, request: req::IpcOpenMemHandle, reply: Responder<rep::IpcOpenMemHandle>) {
        self.import_memory(request, reply);
    }

    fn ipc_close_mem_handle(&mut self, request: req::IpcCloseMemHandle, reply: Responder<rep::IpcCloseMemHandle>) {
        self.close_import(request, reply);
    }

    fn ipc_get_event_handle(&mut self, request: req::IpcGetEventHandle, reply: Responder<rep::IpcGetEventHandle>) {
        self.export_event(request, reply);
    }

    fn ipc_open_event_handle(&mut self, request: req::IpcOpenEventHandle, reply: Responder<rep::IpcOpenEventHandle>) {
        self.import_event(request, reply);
    }

    fn malloc_pitch(&mut self, request: req::MallocPitch, reply: Responder<rep::MallocPitch>) {
        self.pitch_alloc(request, reply);
    }

    fn memset_2d(&mut self, request: req::Memset2D, reply: Responder<rep::Memset2D>) {
        self.set_2d(request, reply);
    }

    fn memcpy_shaped(&mut self, request: req::MemcpyShaped, reply: Responder<rep::MemcpyShaped>) {
        self.copy_shaped(request, reply);
    }

    fn memcpy_htos(&mut self, request: req::MemcpyHtoShaped, bulk: &mut BulkIn<'_>, reply: Responder<rep::MemcpyHtoShaped>) {
        self.copy_host_to_shaped(request, bulk, reply);
    }

    fn memcpy_stoh(&mut self, request: req::MemcpyShapedToH, reply: Responder<rep::MemcpyShapedToH>) {
        self.copy_shaped_to_host(request, reply);
    }

    fn shm_copy_shaped(&mut self, request: req::ShmCopyShaped, reply: Responder<rep::ShmCopyShaped>) {
        Session::shm_copy_shaped(self, request, reply);
    }

    fn array_create(&mut self, request: req::ArrayCreate, reply: Responder<rep::ArrayCreate>) {
        self.new_array(request, reply);
    }

    fn array_destroy(&mut self, request: req::ArrayDestroy, reply: Responder<rep::ArrayDestroy>) {
        self.drop_array(request, reply);
    }

    fn mipmapped_array_level(&mut self, request: req::MipmappedArrayLevel, reply: Responder<rep::MipmappedArrayLevel>) {
        self.array_level(request, reply);
    }

    fn tex_object_create(&mut self, request: req::TexObjectCreate, reply: Responder<rep::TexObjectCreate>) {
        self.new_texture(request, reply);
    }

    fn surf_object_create(&mut self, request: req::SurfObjectCreate, reply: Responder<rep::SurfObjectCreate>) {
        self.new_surface(request, reply);
    }

    fn object_destroy(&mut self, request: req::ObjectDestroy, reply: Responder<rep::ObjectDestroy>) {
        self.drop_object(request, reply);
    }

    fn array_get_plane(&mut self, request: req::ArrayGetPlane, reply: Responder<rep::ArrayGetPlane>) {
        self.array_plane(request, reply);
    }

    fn array_sparse_properties(&mut self, request: req::ArraySparseProperties, reply: Responder<rep::ArraySparseProperties>) {
        self.array_sparse(request, reply);
    }

    fn array_memory_requirements(&mut self, request: req::ArrayMemoryRequirements, reply: Responder<rep::ArrayMemoryRequirements>) {
        self.array_requirements(request, reply);
    }

    fn mem_map_array(&mut self, request: req::MemMapArray, reply: Responder<rep::MemMapArray>) {
        self.map_arrays(request, reply);
    }

    fn mem_batch_decompress(&mut self, request: req::MemBatchDecompress, reply: Responder<rep::MemBatchDecompress>) {
        self.decompress(request, reply);
    }

    // --- virtual memory management (session/vmm.rs) ---
    fn mem_granularity(&mut self, request: req::MemGranularity, reply: Responder<rep::MemGranularity>) {
        self.vmm_granularity(request, reply);
    }

    fn mem_address_reserve(&mut self, request: req::MemAddressReserve, reply: Responder<rep::MemAddressReserve>) {
        self.vmm_address_reserve(request, reply);
    }

    fn mem_address_free(&mut self, request: req::MemAddressFree, reply: Responder<rep::MemAddressFree>) {
        self.vmm_address_free(request, reply);
    }

    fn mem_create(&mut self, request: req::MemCreate, reply: Responder<rep::MemCreate>) {
        self.vmm_create(request, reply);
    }

    fn texture_1d_linear_max_width(&mut self, request: req::Texture1DLinearMaxWidth, reply: Responder<rep::Texture1DLinearMaxWidth>) {
        let width = self.device.texture_1d_linear_max_width(request.format, request.channels);
        reply.send(width.map(|width| rep::Texture1DLinearMaxWidth { width }));
    }

    fn atomic_capabilities(&mut self, request: req::AtomicCapabilities, reply: Responder<rep::AtomicCapabilities>) {
        // The driver's own limit on one query is far below this; it keeps hostile sizes out.
        let result = if request.operations.is_empty() || request.operations.len() > 1024 {
            Err(CudaError::INVALID_VALUE)
        } else {
            self.device.atomic_capabilities(&request.operations, request.peer).map(|capabilities| rep::AtomicCapabilities { capabilities })
        };
        reply.send(result);
    }

    fn tenant_processes(&mut self, _request: req::TenantProcesses, reply: Responder<rep::TenantProcesses>) {
        let processes =
            self.budget.processes().into_iter().map(|(pid, device_bytes)| flyt_protocol::ops::TenantProcess { pid, device_bytes });
        reply.send(Ok(rep::TenantProcesses { processes: processes.collect() }));
    }

    fn tenant_utilization(&mut self, _request: req::TenantUtilization, reply: Responder<rep::TenantUtilization>) {
        let [kernels, copies] = crate::activity::utilization(&*self.budget);
        reply.send(Ok(rep::TenantUtilization { kernels, copies }));
    }

    fn mem_export(&mut self, request: req::MemExport, reply: Responder<rep::MemExport>) {
        self.vmm_export(request, reply);
    }

    fn mem_import(&mut self, request: req::MemImport, reply: Responder<rep::MemImport>) {
        self.vmm_import(request, reply);
    }

    fn mem_pool_export(&mut self, request: req::MemPoolExport, reply: Responder<rep::MemPoolExport>) {
        self.pool_export(request, reply);
    }

    fn mem_pool_import(&mut self, request: req::MemPoolImport, reply: Responder<rep::MemPoolImport>) {
        self.pool_import(request, reply);
    }

    fn mem_pool_export_pointer(&mut self, request: req::MemPoolExportPointer, reply: Responder<rep::MemPoolExportPointer>) {
        self.pool_export_pointer(request, reply);
    }

    fn mem_pool_import_pointer(&mut self, request: req::MemPoolImportPointer, reply: Responder<rep::MemPoolImportPointer>) {
        self.pool_import_pointer(request, reply);
    }

    fn mem_release(&mut self, request: req::MemRelease, reply: Responder<rep::MemRelease>) {
        self.vmm_release(request, reply);
    }

    fn mem_map(&mut self, request: req::MemMap, reply: Responder<rep::MemMap>) {
        self.vmm_map(request, reply);
    }

    fn mem_unmap(&mut self, request: req::MemUnmap, reply: Responder<rep::MemUnmap>) {
        self.vmm_unmap(request, reply);
    }

    fn mem_set_access(&mut self, request: req::MemSetAccess, reply: Responder<rep::MemSetAccess>) {
        self.vmm_set_access(request, reply);
    }

    // --- graphs and host functions (session/graphs.rs) ---
    fn stream_begin_capture(&mut self, request: req::StreamBeginCapture, reply: Responder<rep::StreamBeginCapture>) {
        self.begin_capture(request, reply);
    }

    fn stream_end_capture(&mut self, request: req::StreamEndCapture, reply: Responder<rep::StreamEndCapture>) {
        self.end_capture(request, reply);
    }

    fn stream_capture_info(&mut self, request: req::StreamCaptureInfo, reply: Responder<rep::StreamCaptureInfo>) {
        self.capture_info(request, reply);
    }

    fn capture_mode(&mut self, request: req::CaptureMode, reply: Responder<rep::CaptureMode>) {
        self.capture_mode(request, reply);
    }

    fn graph_create(&mut self, request: req::GraphCreate, reply: Responder<rep::GraphCreate>) {
        self.graph_create(request, reply);
    }

    fn graph_destroy(&mut self, request: req::GraphDestroy, reply: Responder<rep::GraphDestroy>) {
        self.graph_destroy(request, reply);
    }

    fn graph_add_node(&mut self, request: req::GraphAddNode, reply: Responder<rep::GraphAddNode>) {
        self.graph_add_node(request, reply);
    }

    fn graph_edges(&mut self, request: req::GraphEdges, reply: Responder<rep::GraphEdges>) {
        self.graph_edges(request, reply);
    }

    fn graph_nodes(&mut self, request: req::GraphNodes, reply: Responder<rep::GraphNodes>) {
        self.graph_nodes(request, reply);
    }

    fn graph_clone(&mut self, request: req::GraphClone, reply: Responder<rep::GraphClone>) {
        self.graph_clone(request, reply);
    }

    fn graph_instantiate(&mut self, request: req::GraphInstantiate, reply: Responder<rep::GraphInstantiate>) {
        self.graph_instantiate(request, reply);
    }

    fn graph_launch(&mut self, request: req::GraphLaunch, reply: Responder<rep::GraphLaunch>) {
        self.graph_launch(request, reply);
    }

    fn graph_upload(&mut self, request: req::GraphUpload, reply: Responder<rep::GraphUpload>) {
        self.graph_upload(request, reply);
    }

    fn graph_exec_destroy(&mut self, request: req::GraphExecDestroy, reply: Responder<rep::GraphExecDestroy>) {
        self.graph_exec_destroy(request, reply);
    }

    fn graph_exec_update(&mut self, request: req::GraphExecUpdate, reply: Responder<rep::GraphExecUpdate>) {
        self.graph_exec_update(request, reply);
    }

    fn graph_node_set_params(&mut self, request: req::GraphNodeSetParams, reply: Responder<rep::GraphNodeSetParams>) {
        self.graph_node_set_params(request, reply);
    }

    fn graph_dot_print(&mut self, request: req::GraphDotPrint, reply: Responder<rep::GraphDotPrint>) {
        self.graph_dot_print(request, reply);
    }

    fn graph_destroy_node(&mut self, request: req::GraphDestroyNode, reply: Responder<rep::GraphDestroyNode>) {
        self.graph_destroy_node(request, reply);
    }

    fn graph_conditional_handle(&mut self, request: req::GraphConditionalHandle, reply: Responder<rep::GraphConditionalHandle>) {
        self.graph_conditional_handle(request, reply);
    }

    fn graph_node_links(&mut self, request: req::GraphNodeLinks, reply: Responder<rep::GraphNodeLinks>) {
        self.graph_node_links(request, reply);
    }

    fn graph_get_edges(&mut self, request: req::GraphGetEdges, reply: Responder<rep::GraphGetEdges>) {
        self.graph_get_edges(request, reply);
    }

    fn graph_node_enabled(&mut self, request: req::GraphNodeEnabled, reply: Responder<rep::GraphNodeEnabled>) {
        self.graph_node_enabled(request, reply);
    }

    fn graph_node_object(&mut self, request: req::GraphNodeObject, reply: Responder<rep::GraphNodeObject>) {
        self.graph_node_object(request, reply);
    }

    fn graph_mem_attribute(&mut self, request: req::GraphMemAttribute, reply: Responder<rep::GraphMemAttribute>) {
        self.graph_mem_attribute(request, reply);
    }

    fn graph_mem_trim(&mut self, request: req::GraphMemTrim, reply: Responder<rep::GraphMemTrim>) {
        self.graph_mem_trim(request, reply);
    }

    fn graph_node_get_params(&mut self, request: req::GraphNodeGetParams, reply: Responder<rep::GraphNodeGetParams>) {
        self.graph_node_get_params(request, reply);
    }

    fn graph_kernel_node_attribute(&mut self, request: req::GraphKernelNodeAttribute, reply: Responder<rep::GraphKernelNodeAttribute>) {
        self.graph_kernel_node_attribute(request, reply);
    }

    fn graph_kernel_node_copy_attributes(
        &mut self,
        request: req::GraphKernelNodeCopyAttributes,
        reply: Responder<rep::GraphKernelNodeCopyAttributes>,
    ) {
        self.graph_kernel_node_copy_attributes(request, reply);
    }

    fn pause(&mut self, _request: req::Pause, reply: Responder<rep::Pause>) {
        // A no-reply op: nothing goes out; the notices that follow tell the client what happened.
        reply.send(Ok(rep::Pause {}));
        self.moved = self.pause_for_checkpoint();
    }

    fn goodbye(&mut self, _request: req::Goodbye, reply: Responder<rep::Goodbye>) {
        // The app is exiting: the session ends now rather than wait for a connection's return.
        reply.send(Ok(rep::Goodbye {}));
        self.moved = true;
    }

    fn launch_host_func(&mut self, request: req::LaunchHostFunc, reply: Responder<rep::LaunchHostFunc>) {
        self.launch_host_func(request, reply);
    }

    fn host_call_done(&mut self, request: req::HostCallDone, reply: Responder<rep::HostCallDone>) {
        self.host_call_done(request, reply);
    }

    fn capture_host_copy(&mut self, request: req::CaptureHostCopy, reply: Responder<rep::CaptureHostCopy>) {
        self.capture_host_copy(request, reply);
    }

    fn host_copy_done(&mut self, request: req::HostCopyDone, bulk: &mut BulkIn<'_>, reply: Responder<rep::HostCopyDone>) {
        self.host_copy_done(request, bulk, reply);
    }
}
