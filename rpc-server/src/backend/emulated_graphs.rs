//! Stream capture and graphs on the emulated device: a graph is a list of nodes with their
//! dependencies; instantiating puts its work (children inlined) in dependency order, and a
//! launch runs it as the emulated device runs everything, at submission. Host functions run on
//! one thread of the device's, in submission order; their stream is busy until they return.
//! Kernel nodes need GPU code, so they are refused like kernel launches.

use std::collections::HashMap;
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Condvar, Mutex};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{Copy3d, Memset2d, StreamMemOp, capture_status, node_type};

use crate::host_calls::HostCallSite;

/// A while loop whose condition holds at launch: only a kernel could end it, and none runs here.
const NO_LOOP_EXIT: CudaError = CudaError::NOT_SUPPORTED;

/// What a node does.
#[derive(Clone)]
pub enum Work {
    Empty,
    Memcpy(Copy3d),
    Memset(Memset2d),
    /// The node's own copy of the child graph.
    Child(u64),
    EventRecord(u64),
    #[allow(dead_code, reason = "events complete at submission here: a wait has nothing to wait for")]
    EventWait(u64),
    Host(Arc<HostCallSite>),
    /// Graph memory: a block at `ptr` the node holds while it lives (no GPU to map it at launch).
    MemAlloc {
        ptr: u64,
        size: u64,
    },
    #[allow(dead_code, reason = "graph memory is freed with its node here: a free node has nothing to do at launch")]
    MemFree(u64),
    /// A conditional node on `handle` (`CU_GRAPH_COND_TYPE_*` `kind`), with its body graphs.
    Conditional {
        handle: u64,
        kind: u32,
        bodies: Vec<u64>,
    },
    /// Memory operations on device memory, in order.
    BatchMemOp(Vec<StreamMemOp>),
}

impl Work {
    pub fn kind(&self) -> u32 {
        match self {
            Self::Empty => node_type::EMPTY,
            Self::Memcpy(_) => node_type::MEMCPY,
            Self::Memset(_) => node_type::MEMSET,
            Self::Child(_) => node_type::GRAPH,
            Self::EventRecord(_) => node_type::EVENT_RECORD,
            Self::EventWait(_) => node_type::WAIT_EVENT,
            Self::Host(_) => node_type::HOST,
            Self::MemAlloc { .. } => node_type::MEM_ALLOC,
            Self::MemFree(_) => node_type::MEM_FREE,
            Self::Conditional { .. } => node_type::CONDITIONAL,
            Self::BatchMemOp(_) => node_type::BATCH_MEM_OP,
        }
    }
}

#[derive(Clone)]
pub struct Node {
    pub graph: u64,
    pub work: Work,
    pub dependencies: Vec<u64>,
}

/// A capture in progress on a stream (the origin, or one that joined through an event).
#[derive(Clone)]
pub struct StreamCapture {
    pub graph: u64,
    pub id: u64,
    /// The nodes the next captured node depends on.
    pub tail: Vec<u64>,
    pub origin: bool,
    /// The capture mode it began in (`CU_STREAM_CAPTURE_MODE_*`).
    pub mode: u32,
}

#[derive(Default)]
pub struct Graphs {
    /// The session thread's capture interaction mode (`cuThreadExchangeStreamCaptureMode`;
    /// 0, global, until exchanged).
    pub thread_mode: u32,
    pub graphs: HashMap<u64, Vec<u64>>,
    pub nodes: HashMap<u64, Node>,
    /// Each executable graph's own copy of the graph it was made from.
    pub execs: HashMap<u64, u64>,
    pub captures: HashMap<u64, StreamCapture>,
    /// Where a capture stood when an event was recorded into it (a stream waiting on the event
    /// joins the capture there).
    pub captured_events: HashMap<u64, StreamCapture>,
    pub clones: HashMap<(u64, u64), u64>,
    pub next_capture: u64,
    /// Conditional handles: (default value, flags).
    pub conditionals: HashMap<u64, (u32, u32)>,
    /// Nodes of executable graphs' copies that `cuGraphNodeSetEnabled` turned off.
    pub disabled: std::collections::HashSet<u64>,
}

impl Graphs {
    /// The graph's nodes in an order that puts every node after its dependencies.
    pub fn ordered(&self, graph: u64) -> CudaResult<Vec<u64>> {
        let members = self.graphs.get(&graph).ok_or(CudaError::INVALID_VALUE)?;
        let mut done: Vec<u64> = Vec::with_capacity(members.len());
        let mut left: Vec<u64> = members.clone();
        while !left.is_empty() {
            let before = left.len();
            left.retain(|node| {
                let ready = self.nodes.get(node).is_some_and(|n| n.dependencies.iter().all(|d| done.contains(d)));
                if ready {
                    done.push(*node);
                }
                !ready
            });
            if left.len() == before {
                // A cycle: the driver refuses to instantiate it too.
                return Err(CudaError::INVALID_VALUE);
            }
        }
        Ok(done)
    }

    /// The graph's work in order, children inlined.
    pub fn flatten(&self, graph: u64, out: &mut Vec<Work>, depth: u32) -> CudaResult<()> {
        if depth > 64 {
            return Err(CudaError::INVALID_VALUE);
        }
        for node in self.ordered(graph)? {
            if self.disabled.contains(&node) {
                continue;
            }
            match &self.nodes[&node].work {
                Work::Child(child) => self.flatten(*child, out, depth + 1)?,
                Work::Conditional { handle, kind, bodies } => {
                    // No kernel runs here to set the condition: it holds the value each launch
                    // assigns (the default, with CU_GRAPH_COND_ASSIGN_DEFAULT), else 0.
                    let (default, flags) = self.conditionals.get(handle).copied().ok_or(CudaError::INVALID_VALUE)?;
                    let value = if flags & 1 != 0 { default } else { 0 };
                    let body = match (*kind, value) {
                        (0, 0) => bodies.get(1),
                        (0, _) => bodies.first(),
                        // A loop whose condition holds would only end by a kernel setting it.
                        (1, 0) => None,
                        (1, _) => return Err(NO_LOOP_EXIT),
                        (_, value) => bodies.get(value as usize),
                    };
                    if let Some(body) = body {
                        self.flatten(*body, out, depth + 1)?;
                    }
                }
                work => out.push(work.clone()),
            }
        }
        Ok(())
    }

    /// A copy of `graph` under `new` (nodes get ids from `next_id`); the pairs of original and
    /// copied nodes.
    pub fn clone_graph(&mut self, graph: u64, new: u64, next_id: &mut dyn FnMut() -> u64) -> CudaResult<Vec<(u64, u64)>> {
        let members = self.graphs.get(&graph).ok_or(CudaError::INVALID_VALUE)?.clone();
        let pairs: Vec<(u64, u64)> = members.iter().map(|node| (*node, next_id())).collect();
        let renamed: HashMap<u64, u64> = pairs.iter().copied().collect();
        for (old, copy) in &pairs {
            let mut node = self.nodes[old].clone();
            node.graph = new;
            node.dependencies = node.dependencies.iter().map(|d| renamed[d]).collect();
            match node.work {
                Work::Child(child) => {
                    let child_copy = next_id();
                    self.clone_graph(child, child_copy, next_id)?;
                    node.work = Work::Child(child_copy);
                }
                Work::Conditional { handle, kind, ref bodies } => {
                    let mut copies = Vec::with_capacity(bodies.len());
                    for body in bodies.clone() {
                        let copy = next_id();
                        self.clone_graph(body, copy, next_id)?;
                        copies.push(copy);
                    }
                    node.work = Work::Conditional { handle, kind, bodies: copies };
                }
                _ => {}
            }
            self.nodes.insert(*copy, node);
            self.clones.insert((*old, new), *copy);
        }
        self.graphs.insert(new, pairs.iter().map(|(_, copy)| *copy).collect());
        Ok(pairs)
    }

    pub fn add(&mut self, graph: u64, id: u64, dependencies: &[u64], work: Work) -> CudaResult<()> {
        if !self.graphs.contains_key(&graph) || dependencies.iter().any(|d| self.nodes.get(d).is_none_or(|n| n.graph != graph)) {
            return Err(CudaError::INVALID_VALUE);
        }
        self.nodes.insert(id, Node { graph, work, dependencies: dependencies.to_vec() });
        self.graphs.get_mut(&graph).ok_or(CudaError::INVALID_VALUE)?.push(id);
        Ok(())
    }

    /// Records `work` into the stream's capture, if it is capturing: `Some(id)` of the new node.
    pub fn capture(&mut self, stream: u64, id: u64, work: Work) -> Option<CudaResult<()>> {
        let capture = self.captures.get(&stream)?.clone();
        let result = self.add(capture.graph, id, &capture.tail, work);
        if result.is_ok()
            && let Some(capture) = self.captures.get_mut(&stream)
        {
            capture.tail = vec![id];
        }
        Some(result)
    }

    pub fn status(&self, stream: u64) -> u32 {
        if self.captures.contains_key(&stream) { capture_status::ACTIVE } else { capture_status::NONE }
    }

    pub fn destroy(&mut self, graph: u64) {
        if let Some(members) = self.graphs.remove(&graph) {
            for node in members {
                match self.nodes.remove(&node).map(|node| node.work) {
                    Some(Work::Child(child)) => self.destroy(child),
                    Some(Work::Conditional { bodies, .. }) => bodies.into_iter().for_each(|body| self.destroy(body)),
                    _ => {}
                }
            }
        }
    }

    /// Whether `to` has the shape of `from` (the same nodes in the same order, children alike);
    /// with `apply`, `to`'s nodes then take `from`'s work (an executable graph's update).
    pub fn same_shape(&mut self, from: u64, to: u64, apply: bool, depth: u32) -> CudaResult<bool> {
        let (from_nodes, to_nodes) = (self.ordered(from)?, self.ordered(to)?);
        if from_nodes.len() != to_nodes.len() || depth > 64 {
            return Ok(false);
        }
        for (a, b) in from_nodes.iter().zip(&to_nodes) {
            let (work_a, work_b) = (self.nodes[a].work.clone(), self.nodes[b].work.clone());
            if work_a.kind() != work_b.kind() {
                return Ok(false);
            }
            match (work_a, work_b) {
                (Work::Child(child_a), Work::Child(child_b)) if !self.same_shape(child_a, child_b, apply, depth + 1)? => return Ok(false),
                (Work::Child(_), Work::Child(_)) => {}
                (work, _) if apply => {
                    if let Some(node) = self.nodes.get_mut(b) {
                        node.work = work;
                    }
                }
                _ => {}
            }
        }
        Ok(true)
    }

    pub fn kind(&self, node: u64) -> CudaResult<u32> {
        self.nodes.get(&node).map(|n| n.work.kind()).ok_or(CudaError::INVALID_VALUE)
    }
}

/// Host functions not yet returned: per stream, and how many were submitted and have returned
/// in all (they run one at a time, in submission order).
#[derive(Default)]
struct Pending {
    streams: HashMap<u64, usize>,
    submitted: u64,
    returned: u64,
}

/// A host function to run and its stream.
type Submitted = (u64, Arc<HostCallSite>);

/// The thread that runs host functions.
pub struct HostRunner {
    queue: Mutex<Option<Sender<Submitted>>>,
    pending: Arc<(Mutex<Pending>, Condvar)>,
}

impl Default for HostRunner {
    fn default() -> Self {
        Self { queue: Mutex::new(None), pending: Arc::new((Mutex::new(Pending::default()), Condvar::new())) }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl HostRunner {
    pub fn submit(&self, stream: u64, site: Arc<HostCallSite>) -> CudaResult<()> {
        let mut queue = lock(&self.queue);
        if queue.is_none() {
            let (sender, receiver) = channel::<Submitted>();
            let pending = self.pending.clone();
            std::thread::Builder::new()
                .name("flyt-emulated-host".into())
                .spawn(move || {
                    for (stream, site) in receiver {
                        site.run();
                        let (counts, changed) = &*pending;
                        let mut counts = lock(counts);
                        counts.returned += 1;
                        if let Some(count) = counts.streams.get_mut(&stream) {
                            *count -= 1;
                            if *count == 0 {
                                counts.streams.remove(&stream);
                            }
                        }
                        changed.notify_all();
                    }
                })
                .map_err(|_| CudaError::OPERATING_SYSTEM)?;
            *queue = Some(sender);
        }
        let mut pending = lock(&self.pending.0);
        *pending.streams.entry(stream).or_default() += 1;
        pending.submitted += 1;
        drop(pending);
        queue.as_ref().and_then(|queue| queue.send((stream, site)).ok()).ok_or(CudaError::OPERATING_SYSTEM)
    }

    /// Whether host functions of `stream` (any stream: `None`) have yet to return.
    pub fn busy(&self, stream: Option<u64>) -> bool {
        let counts = lock(&self.pending.0);
        match stream {
            Some(stream) => counts.streams.contains_key(&stream),
            None => !counts.streams.is_empty(),
        }
    }

    /// How many host functions were submitted so far: an event recorded now fires once that
    /// many have returned.
    pub fn mark(&self) -> u64 {
        lock(&self.pending.0).submitted
    }

    pub fn returned(&self, mark: u64) -> bool {
        lock(&self.pending.0).returned >= mark
    }

    /// Waits until the host functions submitted before `mark` have returned (all: `u64::MAX`).
    pub fn wait(&self, mark: u64) {
        let (counts, changed) = &*self.pending;
        let mut counts = lock(counts);
        while counts.returned < mark.min(counts.submitted) {
            counts = changed.wait(counts).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }
}
