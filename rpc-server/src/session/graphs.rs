//! Stream capture, graphs and host functions for a session: the client names graphs, nodes and
//! executable graphs with its own ids; this table maps them to the backend's handles, checks
//! every id and device range before the driver sees it, and forgets a graph's nodes with it, so
//! a stale id is refused rather than handed to the driver.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{
    CaptureInfo, Copy3d, GraphEdge, GraphNodeEntry, HostCopy, NodeCopy, NodeCopySide, NodeParams, NodeReadback, Pos3, SERVER_NODE_BIT,
    node_type, rep, req,
};

use super::{MAX_HANDLES, Responder, Session};
use crate::backend::{CaptureInto, Device, EdgeData, NodeRead, NodeWork};
use crate::host_calls::{HostCallSite, HostCalls, StagedCopy, Staging};
use crate::memory::RangeKind;

mod moves;
pub use moves::{GraphsState, Resolve};

/// `CU_MEMORYTYPE_HOST`.
const MEMORY_HOST: u32 = 1;
/// `CU_MEMORYTYPE_DEVICE`.
const MEMORY_DEVICE: u32 = 2;
/// The most bytes one copy with the app's host memory moves (its bytes travel as one frame's bulk).
const MAX_HOST_COPY: u64 = 1 << 30;

/// An executable graph, with what makes it again on another server.
struct Exec<D: Device> {
    exec: D::GraphExec,
    flags: u64,
    /// What makes the graph it runs again after a move.
    shadow: Shadow<D::Graph>,
    /// The app's graph `shadow` was copied from (its nodes are found in the copy), or is.
    cloned_from: Option<u64>,
    /// Nodes the app names this executable graph's nodes by, where those are not the app's own
    /// nodes: after a move, the executable graph is made from `shadow`, whose nodes these are.
    translate: HashMap<u64, D::GraphNode>,
}

/// An executable graph's record of the graph it runs.
enum Shadow<G> {
    /// The session's own copy, kept as the executable graph changes.
    Copy(G),
    /// Still exactly the app's graph `cloned_from`, a plain one (no child graphs, graph memory or
    /// conditional nodes): copied only when the app is about to change it or the executable
    /// graph's own nodes change, and taken over when the app destroys it. An app that updates its
    /// executable graph every step from a graph it then destroys pays no copy.
    App,
    /// Why there is none: the session cannot move.
    Refused(String),
}

/// The session's graph objects.
pub struct GraphTable<D: Device> {
    graphs: HashMap<u64, D::Graph>,
    graph_ids: HashMap<D::Graph, u64>,
    /// Each node with the id of its graph.
    nodes: HashMap<u64, (D::GraphNode, u64)>,
    node_ids: HashMap<D::GraphNode, u64>,
    execs: HashMap<u64, Exec<D>>,
    /// The graph each capture (by its origin stream) records into.
    captures: HashMap<u64, u64>,
    /// Captures that were refused work (host-memory copies): they end invalidated, never as a
    /// graph missing that work.
    spoiled: HashSet<u64>,
    /// Graphs the app made that a capture records into (`cuStreamBeginCaptureToGraph`): an
    /// invalidated capture leaves them the app's.
    captured_into: HashSet<u64>,
    next_server_node: u64,
    pub host_calls: Arc<HostCalls>,
    /// Host functions graphs may run (nodes, captured calls): kept while the session lives.
    sites: HashMap<u64, Arc<HostCallSite>>,
    /// Graphs a node owns (a conditional node's bodies, a child graph node's graph as the app
    /// reached it), forgotten with the node's graph and never destroyed by the app.
    owned: HashMap<u64, Vec<u64>>,
    /// Conditional handles the driver made for this session.
    conditionals: HashSet<u64>,
    /// Memory allocation nodes' memory: its size and the graph whose node made it (0 once that
    /// graph is gone while executable graphs made from it still allocate it at launch).
    memory: HashMap<u64, (u64, u64)>,
    /// The graph memory each executable graph allocates when it runs (made from a graph that
    /// had it): it stays the session's while the executable graph lives, graph or no graph.
    exec_memory: HashMap<u64, Vec<u64>>,
    /// Copy nodes with the app's host memory, as the app gave them (each is a child graph node
    /// to the driver: the copy through staging and its host half; see `host_copy_graph`).
    host_copies: HashMap<u64, HostCopy>,
    /// The staging those copies go through, by address: its bytes, counted in the quota, and
    /// the host half of its copy, which the driver's host node names.
    staging: HashMap<u64, (u64, Arc<HostCallSite>)>,
    /// The staging each graph and executable graph (by the app's id) may run a copy through:
    /// its own nodes', its children's and conditional bodies', what it was cloned, instantiated
    /// or updated from. Staging no graph or executable graph holds is freed.
    staging_holders: HashMap<u64, HashSet<u64>>,
}

/// A move's blocker that passes: a checkpoint asked for meanwhile is tried again
/// (`Listener::checkpoint`).
pub const CAPTURE_UNDER_WAY: &str = "a stream capture is under way";

impl<D: Device> GraphTable<D> {
    /// Whether `ptr` is the start of memory a graph's allocation node made.
    pub fn is_graph_memory(&self, ptr: u64) -> bool {
        self.memory.contains_key(&ptr)
    }

    /// How many graphs and executable graphs the app holds.
    pub(super) fn held(&self) -> usize {
        self.graphs.len() + self.execs.len()
    }

    /// Why the session cannot move, if graphs or captures hold it.
    pub(super) fn move_blocker(&self) -> Option<String> {
        if !self.captures.is_empty() {
            return Some(CAPTURE_UNDER_WAY.into());
        }
        if !self.memory.is_empty() {
            return Some("its graphs allocate graph memory (memory nodes), whose addresses the driver picks".into());
        }
        if !self.conditionals.is_empty() {
            return Some("its graphs have conditional nodes, whose handles kernels hold".into());
        }
        if !self.staging.is_empty() {
            return Some("its graphs copy with the app's host memory, through staging this worker holds".into());
        }
        self.execs.values().find_map(|exec| match &exec.shadow {
            Shadow::Refused(reason) => Some(format!("an executable graph cannot move: {reason}")),
            Shadow::Copy(_) | Shadow::App => None,
        })
    }

    pub fn new(host_calls: Arc<HostCalls>) -> Self {
        Self {
            graphs: HashMap::new(),
            graph_ids: HashMap::new(),
            nodes: HashMap::new(),
            node_ids: HashMap::new(),
            execs: HashMap::new(),
            captures: HashMap::new(),
            spoiled: HashSet::new(),
            captured_into: HashSet::new(),
            next_server_node: SERVER_NODE_BIT,
            host_calls,
            sites: HashMap::new(),
            owned: HashMap::new(),
            conditionals: HashSet::new(),
            memory: HashMap::new(),
            exec_memory: HashMap::new(),
            host_copies: HashMap::new(),
            staging: HashMap::new(),
            staging_holders: HashMap::new(),
        }
    }

    /// The host-function site for the client's `call`, kept while the session lives.
    fn site(&mut self, call: u64) -> Arc<HostCallSite> {
        self.sites.entry(call).or_insert_with(|| HostCallSite::new(call, &self.host_calls)).clone()
    }

    fn is_owned(&self, graph: u64) -> bool {
        self.owned.values().any(|graphs| graphs.contains(&graph))
    }

    fn graph(&self, id: u64) -> CudaResult<D::Graph> {
        self.graphs.get(&id).copied().ok_or(CudaError::INVALID_VALUE)
    }

    fn exec(&self, id: u64) -> CudaResult<D::GraphExec> {
        self.execs.get(&id).map(|exec| exec.exec).ok_or(CudaError::INVALID_VALUE)
    }

    /// An executable graph and its node the app names `node` by.
    fn exec_node(&self, exec: u64, node: u64) -> CudaResult<(D::GraphExec, D::GraphNode)> {
        let record = self.execs.get(&exec).ok_or(CudaError::INVALID_VALUE)?;
        match record.translate.get(&node) {
            Some(translated) => Ok((record.exec, *translated)),
            None => Ok((record.exec, self.node(node)?.0)),
        }
    }

    /// A node by id, with its graph's id.
    fn node(&self, id: u64) -> CudaResult<(D::GraphNode, u64)> {
        self.nodes.get(&id).copied().ok_or(CudaError::INVALID_VALUE)
    }

    fn nodes_of(&self, ids: &[u64], graph: u64) -> CudaResult<Vec<D::GraphNode>> {
        ids.iter()
            .map(|id| self.node(*id).and_then(|(node, of)| if of == graph { Ok(node) } else { Err(CudaError::INVALID_VALUE) }))
            .collect()
    }

    fn new_id_allowed(&self, id: u64) -> CudaResult<()> {
        let room = self.graphs.len() + self.nodes.len() + self.execs.len() < 4 * MAX_HANDLES;
        if id == 0 || id & SERVER_NODE_BIT != 0 || !room { Err(CudaError::INVALID_VALUE) } else { Ok(()) }
    }

    /// A new id the app gives a graph, node or exec: allowed, and not yet in `table`.
    fn new_id_free<V>(&self, id: u64, table: &HashMap<u64, V>) -> CudaResult<()> {
        self.new_id_allowed(id)?;
        if table.contains_key(&id) { Err(CudaError::INVALID_VALUE) } else { Ok(()) }
    }

    fn add_graph(&mut self, id: u64, graph: D::Graph) {
        self.graphs.insert(id, graph);
        self.graph_ids.insert(graph, id);
    }

    fn add_node(&mut self, id: u64, node: D::GraphNode, graph: u64) {
        self.nodes.insert(id, (node, graph));
        self.node_ids.insert(node, id);
    }

    /// The id of a node the driver named (found in a captured graph or a clone), given one if new.
    fn node_id(&mut self, node: D::GraphNode, graph: u64) -> u64 {
        if let Some(id) = self.node_ids.get(&node) {
            return *id;
        }
        self.next_server_node += 1;
        let id = self.next_server_node;
        self.add_node(id, node, graph);
        id
    }

    /// Forgets a graph and its nodes, with the graphs its nodes own (the driver destroyed them,
    /// or is about to); the graph memory its nodes made is returned (start, size) for release.
    #[expect(clippy::type_complexity, reason = "the graph and its memory's (start, size) pairs")]
    fn forget_graph(&mut self, id: u64) -> Option<(D::Graph, Vec<(u64, u64)>)> {
        let graph = self.graphs.remove(&id)?;
        self.graph_ids.remove(&graph);
        self.staging_holders.remove(&id);
        for exec in self.execs.values_mut().filter(|exec| exec.cloned_from == Some(id)) {
            exec.cloned_from = None;
        }
        let nodes = &mut self.nodes;
        let mut removed = Vec::new();
        self.node_ids.retain(|_, node_id| match nodes.get(node_id) {
            Some((_, of)) if *of == id => {
                nodes.remove(node_id);
                removed.push(*node_id);
                false
            }
            _ => true,
        });
        let mut memory: Vec<(u64, u64)> = Vec::new();
        for node in &removed {
            self.host_copies.remove(node);
        }
        for node in removed {
            for owned in self.owned.remove(&node).unwrap_or_default() {
                if let Some((_, more)) = self.forget_graph(owned) {
                    memory.extend(more);
                }
            }
        }
        let exec_memory = &self.exec_memory;
        self.memory.retain(|ptr, (size, of)| {
            if *of != id {
                return true;
            }
            // An executable graph made from it still allocates it: kept, without its graph.
            if exec_memory.values().any(|held| held.contains(ptr)) {
                *of = 0;
                return true;
            }
            memory.push((*ptr, *size));
            false
        });
        Some((graph, memory))
    }

    /// Records the graph memory `exec` allocates when it runs: `graph`'s.
    fn hold_memory(&mut self, exec: u64, graph: u64) {
        let held: Vec<u64> = self.memory.iter().filter(|(_, (_, of))| *of == graph).map(|(ptr, _)| *ptr).collect();
        if !held.is_empty() {
            self.exec_memory.insert(exec, held);
        }
    }

    /// Forgets what `exec` held; the graph memory no graph or other executable graph holds any
    /// more is returned (start, size) for release.
    fn release_exec_memory(&mut self, exec: u64) -> Vec<(u64, u64)> {
        let Some(held) = self.exec_memory.remove(&exec) else {
            return Vec::new();
        };
        let mut freed = Vec::new();
        for ptr in held {
            let orphan = self.memory.get(&ptr).is_some_and(|(_, of)| *of == 0);
            if orphan
                && !self.exec_memory.values().any(|others| others.contains(&ptr))
                && let Some((size, _)) = self.memory.remove(&ptr)
            {
                freed.push((ptr, size));
            }
        }
        freed
    }

    /// Everything, destroyed (the session ends or its device is reset).
    pub fn release(&mut self, device: &D) {
        for (_, exec) in self.execs.drain() {
            let _ = destroy_exec(device, exec);
        }
        let ids: Vec<u64> = self.graphs.keys().copied().collect();
        for id in ids {
            let owned = self.is_owned(id);
            if let Some((graph, _)) = self.forget_graph(id)
                && !owned
            {
                let _ = device.graph_destroy(graph);
            }
        }
        self.memory.clear();
        self.exec_memory.clear();
        self.conditionals.clear();
        self.captures.clear();
        self.spoiled.clear();
        self.host_copies.clear();
    }

    /// The staging of host copies, given back (the session ends or its device is reset, after
    /// every graph is gone): address, bytes and host half, which the caller frees, releases and
    /// drops in that order.
    pub fn take_staging(&mut self) -> Vec<(u64, u64, Arc<HostCallSite>)> {
        self.staging_holders.clear();
        self.staging.drain().map(|(address, (len, site))| (address, len, site)).collect()
    }

    /// Staging no graph or executable graph holds any more, forgotten here: its address, bytes
    /// and host half, which the caller keeps until the staging is freed (a launch in flight may
    /// still run it).
    fn unheld_staging(&mut self) -> Vec<(u64, u64, Arc<HostCallSite>)> {
        if self.staging.is_empty() {
            return Vec::new();
        }
        let held: HashSet<u64> = self.staging_holders.values().flatten().copied().collect();
        let unheld: Vec<u64> = self.staging.keys().filter(|address| !held.contains(address)).copied().collect();
        unheld.into_iter().filter_map(|address| self.staging.remove(&address).map(|(len, site)| (address, len, site))).collect()
    }

    /// `graph` (or an executable graph) may run a copy through the staging at `address`; so may
    /// the graphs whose nodes own `graph` (a conditional node's body, a child graph named back).
    fn hold(&mut self, holder: u64, address: u64) {
        let mut at = Some(holder);
        for _ in 0..64 {
            let Some(graph) = at else { break };
            self.staging_holders.entry(graph).or_default().insert(address);
            at =
                self.owned.iter().find(|(_, graphs)| graphs.contains(&graph)).and_then(|(node, _)| self.nodes.get(node)).map(|(_, of)| *of);
        }
    }

    /// `holder` may run whatever `from` may (a child graph node, a clone, an instantiation or
    /// an update).
    fn hold_as(&mut self, holder: u64, from: u64) {
        let addresses: Vec<u64> = self.staging_holders.get(&from).map(|set| set.iter().copied().collect()).unwrap_or_default();
        for address in addresses {
            self.hold(holder, address);
        }
    }
}

/// The app's edge data for `count` edges or dependencies: none (plain full dependencies), or
/// one entry each.
fn edge_data(data: &[EdgeData], count: usize) -> CudaResult<Option<&[EdgeData]>> {
    match data.len() {
        0 => Ok(None),
        len if len == count => Ok(Some(data)),
        _ => Err(CudaError::INVALID_VALUE),
    }
}

/// Destroys an executable graph and its copy of its graph; the driver's answer for the
/// executable graph (the copy is the session's own business).
fn destroy_exec<D: Device>(device: &D, exec: Exec<D>) -> CudaResult<()> {
    if let Shadow::Copy(shadow) = exec.shadow {
        let _ = device.graph_destroy(shadow);
    }
    device.graph_exec_destroy(exec.exec)
}

impl<D: Device> Session<D> {
    /// Whether the app's `stream` is capturing (asked of the driver only while a capture is on).
    pub(super) fn capturing(&self, stream: u64) -> bool {
        !self.graphs.captures.is_empty() && self.stream(stream).is_ok_and(|stream| self.device.capturing(stream))
    }

    /// Refuses host-memory copies on a stream that is capturing (or may not be used during a
    /// capture): the staging memory they would record is reused, so such a graph would copy
    /// garbage. The capture then ends invalidated, as CUDA ends one that met an unsupported call.
    pub(super) fn refuse_while_capturing(&mut self, stream: D::Stream) -> CudaResult<()> {
        if self.graphs.captures.is_empty() || !self.device.capturing(stream) {
            return Ok(());
        }
        let graph = self.device.capture_info(stream).ok().and_then(|capture| capture.graph);
        match graph.and_then(|graph| self.graphs.graph_ids.get(&graph).copied()) {
            Some(id) => {
                self.graphs.spoiled.insert(id);
            }
            // The legacy stream during a capture: every capture is affected.
            None => self.graphs.spoiled.extend(self.graphs.captures.values().copied()),
        }
        Err(CudaError::STREAM_CAPTURE_UNSUPPORTED)
    }

    /// The graph a capture on `stream` records into, by the app's id (a stream joined to a
    /// capture through an event has no capture of its own here).
    fn capture_graph(&self, stream: D::Stream) -> Option<u64> {
        if self.graphs.captures.is_empty() || !self.device.capturing(stream) {
            return None;
        }
        let graph = self.device.capture_info(stream).ok()?.graph?;
        self.graphs.graph_ids.get(&graph).copied()
    }

    /// Records memory a stream-ordered allocation made on a capturing stream: an allocation
    /// node of the captured graph, whose memory each launch allocates again at that address and
    /// the app may free outside the graph after any launch. It lives, and counts against the
    /// quota, until its graph is forgotten. `false` when `stream` is not capturing.
    pub(super) fn record_captured_allocation(&mut self, stream: D::Stream, ptr: u64, size: u64) -> bool {
        let Some(graph) = self.capture_graph(stream) else {
            return false;
        };
        self.ranges.insert(ptr, size, RangeKind::GraphMemory);
        self.graphs.memory.insert(ptr, (size, graph));
        true
    }

    /// The host-function site for the client's `call`, kept for graphs that may run it.
    fn kept_site(&mut self, call: u64) -> Arc<HostCallSite> {
        self.graphs.site(call)
    }

    /// Checks a node's parameters and resolves its ids; the kernel arguments stay in `params`.
    fn node_work<'a>(&mut self, params: &'a mut NodeParams, site: &'a mut Option<Arc<HostCallSite>>) -> CudaResult<NodeWork<'a, D>> {
        Ok(match params {
            NodeParams::Empty => NodeWork::Empty,
            NodeParams::Kernel { function, grid, block, shared_mem, args } => {
                let (kernel, args_len) = self.function(*function)?;
                if args.len() as u64 != args_len {
                    return Err(CudaError::INVALID_VALUE);
                }
                NodeWork::Kernel { function: kernel, grid: *grid, block: *block, shared_mem: *shared_mem, args: args.as_mut_slice() }
            }
            NodeParams::Memcpy(copy) => {
                let src = copy.span(copy.src_pitch, copy.src_height).ok_or(CudaError::INVALID_VALUE)?;
                let dst = copy.span(copy.dst_pitch, copy.dst_height).ok_or(CudaError::INVALID_VALUE)?;
                if copy.width > copy.src_pitch.max(copy.width)
                    || (copy.height > 1 && (copy.width > copy.src_pitch || copy.width > copy.dst_pitch))
                {
                    return Err(CudaError::INVALID_PITCH_VALUE);
                }
                self.ranges.check(copy.src, src)?;
                self.ranges.check(copy.dst, dst)?;
                NodeWork::Memcpy(*copy)
            }
            NodeParams::Memset(set) => {
                let row = set.width.checked_mul(u64::from(set.element_size)).ok_or(CudaError::INVALID_VALUE)?;
                if !matches!(set.element_size, 1 | 2 | 4) || (set.height > 1 && row > set.pitch) {
                    return Err(CudaError::INVALID_VALUE);
                }
                let span = if set.height == 0 || row == 0 {
                    0
                } else {
                    (set.height - 1).checked_mul(set.pitch).and_then(|rows| rows.checked_add(row)).ok_or(CudaError::INVALID_VALUE)?
                };
                self.ranges.check(set.dst, span)?;
                NodeWork::Memset(*set)
            }
            NodeParams::Child { graph } => NodeWork::Child(self.graphs.graph(*graph)?),
            NodeParams::EventRecord { event } => NodeWork::EventRecord(self.event(*event)?),
            NodeParams::EventWait { event } => NodeWork::EventWait(self.event(*event)?),
            NodeParams::Host { call } => {
                *site = Some(self.kept_site(*call));
                NodeWork::Host(site.as_ref().ok_or(CudaError::UNKNOWN)?)
            }
            NodeParams::MemAlloc { size, access } => {
                if *size == 0 || access.is_some_and(|flags| !matches!(flags, 0 | 1 | 3)) {
                    return Err(CudaError::INVALID_VALUE);
                }
                NodeWork::MemAlloc { size: *size, access: *access }
            }
            NodeParams::MemFree { ptr } => {
                if !self.graphs.memory.contains_key(ptr) {
                    return Err(CudaError::INVALID_VALUE);
                }
                NodeWork::MemFree(*ptr)
            }
            NodeParams::Conditional { handle, kind, size, bodies } => {
                if !self.graphs.conditionals.contains(handle) || bodies.len() != *size as usize || *size > 1024 {
                    return Err(CudaError::INVALID_VALUE);
                }
                for body in bodies.iter() {
                    self.graphs.new_id_free(*body, &self.graphs.graphs)?;
                }
                NodeWork::Conditional { handle: *handle, kind: *kind, size: *size }
            }
            NodeParams::BatchMemOp { ops } => {
                self.check_node_mem_ops(ops)?;
                NodeWork::BatchMemOp(ops.as_slice())
            }
            // Made by `add_host_copy` and `set_host_copy`, not as one node of the driver's.
            NodeParams::HostMemcpy(_) => return Err(CudaError::INVALID_VALUE),
        })
    }

    /// Forgets a graph (see `GraphTable::forget_graph`) and gives back the quota of the graph
    /// memory its nodes made.
    fn forget_graph(&mut self, id: u64) -> Option<D::Graph> {
        let (graph, memory) = self.graphs.forget_graph(id)?;
        for (ptr, size) in memory {
            self.ranges.remove_within(ptr, 1, RangeKind::GraphMemory);
            self.budget.release(size);
        }
        self.free_unheld_staging();
        Some(graph)
    }

    /// Host-function nodes of `graph` and of its children (each of which a launch runs once),
    /// and whether `graph` is plain: kernels, copies, memsets, host, empty and event nodes only
    /// (see `Shadow::App`). One listing serves both: instantiation and update pay it.
    fn census(&self, graph: D::Graph, depth: u32) -> CudaResult<(u32, bool)> {
        if depth > 64 {
            return Err(CudaError::INVALID_VALUE);
        }
        let (mut count, mut plain) = (0, true);
        for (node, kind) in self.device.graph_nodes(graph, false)? {
            match kind {
                node_type::HOST => count += 1,
                node_type::GRAPH => {
                    count += self.census(self.device.graph_child(node)?, depth + 1)?.0;
                    plain = false;
                }
                node_type::KERNEL
                | node_type::MEMCPY
                | node_type::MEMSET
                | node_type::EMPTY
                | node_type::WAIT_EVENT
                | node_type::EVENT_RECORD => {}
                _ => plain = false,
            }
        }
        Ok((count, plain))
    }

    pub(super) fn begin_capture(&mut self, request: req::StreamBeginCapture, reply: Responder<rep::StreamBeginCapture>) {
        let result = (|| {
            let data = edge_data(&request.data, request.dependencies.len())?;
            let into = if request.into {
                let graph = self.graphs.graph(request.graph)?;
                if self.graphs.captures.values().any(|captured| *captured == request.graph) {
                    return Err(CudaError::ILLEGAL_STATE);
                }
                self.detach_execs(request.graph);
                Some((graph, self.graphs.nodes_of(&request.dependencies, request.graph)?))
            } else {
                self.graphs.new_id_free(request.graph, &self.graphs.graphs)?;
                if !request.dependencies.is_empty() {
                    return Err(CudaError::INVALID_VALUE);
                }
                None
            };
            let stream = self.stream(request.stream)?;
            self.device.exchange_capture_mode(request.thread_mode)?;
            let target = into.as_ref().map(|(graph, nodes)| CaptureInto { graph: *graph, dependencies: nodes.as_slice(), data });
            self.device.capture_begin(stream, request.mode, target)?;
            if into.is_some() {
                self.graphs.captured_into.insert(request.graph);
            } else {
                let graph = self.device.capture_info(stream)?.graph.ok_or(CudaError::UNKNOWN)?;
                self.graphs.add_graph(request.graph, graph);
            }
            self.graphs.captures.insert(request.stream, request.graph);
            Ok(rep::StreamBeginCapture {})
        })();
        reply.send(result);
    }

    pub(super) fn end_capture(&mut self, request: req::StreamEndCapture, reply: Responder<rep::StreamEndCapture>) {
        let result = self.stream(request.stream).and_then(|stream| {
            let ended = self.device.capture_end(stream);
            let Some(id) = self.graphs.captures.get(&request.stream).copied() else {
                // Not a capture this session began on that stream: the driver said why.
                return ended.and(Err(CudaError::STREAM_CAPTURE_UNMATCHED));
            };
            match ended {
                Ok(graph) => {
                    self.graphs.captures.remove(&request.stream);
                    let into = self.graphs.captured_into.remove(&id);
                    if self.graphs.spoiled.remove(&id) {
                        if !into {
                            self.forget_graph(id);
                            let _ = self.device.graph_destroy(graph);
                        }
                        return Err(CudaError::STREAM_CAPTURE_INVALIDATED);
                    }
                    self.graphs.graph_ids.insert(graph, id);
                    self.graphs.graphs.insert(id, graph);
                    Ok(rep::StreamEndCapture { graph: id })
                }
                Err(error) => {
                    // An invalidated capture ends with its graph destroyed; others go on.
                    if self.device.capture_info(stream).is_ok_and(|info| info.status == flyt_protocol::ops::capture_status::NONE) {
                        self.graphs.captures.remove(&request.stream);
                        self.graphs.spoiled.remove(&id);
                        if !self.graphs.captured_into.remove(&id) {
                            self.forget_graph(id);
                        }
                    }
                    Err(error)
                }
            }
        });
        reply.send(result);
    }

    pub(super) fn capture_info(&mut self, request: req::StreamCaptureInfo, reply: Responder<rep::StreamCaptureInfo>) {
        let result = self.stream(request.stream).and_then(|stream| self.device.capture_info(stream)).map(|capture| {
            let graph = capture.graph.and_then(|graph| self.graphs.graph_ids.get(&graph).copied()).unwrap_or(0);
            let dependencies = capture.dependencies.into_iter().map(|node| self.graphs.node_id(node, graph)).collect();
            let info = CaptureInfo { status: capture.status, id: capture.id, graph, dependencies, data: capture.data };
            rep::StreamCaptureInfo { info }
        });
        reply.send(result);
    }

    pub(super) fn capture_dependencies(
        &mut self,
        request: req::StreamCaptureDependencies,
        reply: Responder<rep::StreamCaptureDependencies>,
    ) {
        let result = (|| {
            let data = edge_data(&request.data, request.dependencies.len())?;
            let stream = self.stream(request.stream)?;
            let info = self.device.capture_info(stream)?;
            let graph = info.graph.and_then(|graph| self.graphs.graph_ids.get(&graph).copied()).ok_or(CudaError::ILLEGAL_STATE)?;
            let nodes = self.graphs.nodes_of(&request.dependencies, graph)?;
            self.device.capture_dependencies(stream, &nodes, data, request.set)
        })();
        reply.send(result.map(|()| rep::StreamCaptureDependencies {}));
    }

    pub(super) fn capture_mode(&mut self, request: req::CaptureMode, reply: Responder<rep::CaptureMode>) {
        reply.send(self.device.exchange_capture_mode(request.mode).map(|_| rep::CaptureMode {}));
    }

    pub(super) fn graph_create(&mut self, request: req::GraphCreate, reply: Responder<rep::GraphCreate>) {
        let result = self.graphs.new_id_free(request.graph, &self.graphs.graphs).and_then(|()| {
            let graph = self.device.graph_create()?;
            self.graphs.add_graph(request.graph, graph);
            Ok(rep::GraphCreate {})
        });
        reply.send(result);
    }

    pub(super) fn graph_destroy(&mut self, request: req::GraphDestroy, reply: Responder<rep::GraphDestroy>) {
        // A graph still being captured is destroyed by ending its capture.
        let capturing = self.graphs.captures.values().any(|graph| *graph == request.graph);
        let result = match capturing {
            true => Err(CudaError::ILLEGAL_STATE),
            // A graph a node owns goes with that node's graph.
            false if self.graphs.is_owned(request.graph) => Err(CudaError::INVALID_VALUE),
            false => {
                // An executable graph whose record is still this graph takes it over; any other
                // gets its own copy first.
                let heir = self.graphs.execs.iter().find(|(_, exec)| Self::runs_app_graph(exec, request.graph)).map(|(id, _)| *id);
                if let Some(heir) = heir {
                    self.detach_execs_except(request.graph, Some(heir));
                }
                let forgotten = self.forget_graph(request.graph).ok_or(CudaError::INVALID_VALUE);
                match (forgotten, heir.and_then(|heir| self.graphs.execs.get_mut(&heir))) {
                    (Ok(graph), Some(exec)) => {
                        exec.shadow = Shadow::Copy(graph);
                        Ok(())
                    }
                    (forgotten, _) => forgotten.and_then(|graph| self.device.graph_destroy(graph)),
                }
            }
        };
        reply.send(result.map(|()| rep::GraphDestroy {}));
    }

    pub(super) fn graph_add_node(&mut self, mut request: req::GraphAddNode, reply: Responder<rep::GraphAddNode>) {
        let result = (|| {
            self.graphs.new_id_free(request.node, &self.graphs.nodes)?;
            let graph = self.graphs.graph(request.graph)?;
            let dependencies = self.graphs.nodes_of(&request.dependencies, request.graph)?;
            self.detach_execs(request.graph);
            if let NodeParams::HostMemcpy(host) = request.params {
                let node = self.add_host_copy(graph, request.graph, &dependencies, &host)?;
                self.graphs.add_node(request.node, node, request.graph);
                self.graphs.host_copies.insert(request.node, host);
                return Ok(rep::GraphAddNode { ptr: 0 });
            }
            let mut site = None;
            let bodies = match &request.params {
                NodeParams::Conditional { bodies, .. } => bodies.clone(),
                _ => Vec::new(),
            };
            let memory = match request.params {
                NodeParams::MemAlloc { size, .. } => size,
                _ => 0,
            };
            let work = self.node_work(&mut request.params, &mut site)?;
            if !self.budget.try_reserve(memory) {
                return Err(CudaError::MEMORY_ALLOCATION);
            }
            let added = match self.device.graph_add_node(graph, &dependencies, work) {
                Ok(added) => added,
                Err(error) => {
                    self.budget.release(memory);
                    return Err(error);
                }
            };
            self.graphs.add_node(request.node, added.node, request.graph);
            if let NodeParams::Child { graph: child } = request.params {
                self.graphs.hold_as(request.graph, child);
            }
            if memory > 0 {
                match self.graphs.memory.get(&added.ptr).copied() {
                    // The driver gave this graph's node an address one of its freed allocations
                    // had (as NVIDIA's graphMemoryNodes checks): one range, counted once.
                    Some((known, of)) if of == request.graph && known >= memory => self.budget.release(memory),
                    _ => {
                        self.ranges.insert(added.ptr, memory, RangeKind::GraphMemory);
                        self.graphs.memory.insert(added.ptr, (memory, request.graph));
                    }
                }
            }
            if !bodies.is_empty() {
                for (id, body) in bodies.iter().zip(added.bodies) {
                    self.graphs.add_graph(*id, body);
                }
                self.graphs.owned.insert(request.node, bodies);
            }
            Ok(rep::GraphAddNode { ptr: added.ptr })
        })();
        reply.send(result);
    }

    pub(super) fn graph_conditional_handle(&mut self, request: req::GraphConditionalHandle, reply: Responder<rep::GraphConditionalHandle>) {
        let result = self.graphs.graph(request.graph).and_then(|graph| {
            if self.graphs.conditionals.len() >= MAX_HANDLES {
                return Err(CudaError::MEMORY_ALLOCATION);
            }
            let handle = self.device.graph_conditional_handle(graph, request.default_value, request.flags)?;
            self.graphs.conditionals.insert(handle);
            Ok(rep::GraphConditionalHandle { handle })
        });
        reply.send(result);
    }

    pub(super) fn graph_node_links(&mut self, request: req::GraphNodeLinks, reply: Responder<rep::GraphNodeLinks>) {
        let result = self.graphs.node(request.node).and_then(|(node, graph)| {
            let links = self.device.graph_node_links(node, request.dependents)?;
            let links = links
                .into_iter()
                .map(|(other, [from_port, to_port, kind])| GraphEdge {
                    from: self.graphs.node_id(other, graph),
                    to: request.node,
                    from_port,
                    to_port,
                    kind,
                })
                .collect();
            Ok(rep::GraphNodeLinks { links })
        });
        reply.send(result);
    }

    pub(super) fn graph_get_edges(&mut self, request: req::GraphGetEdges, reply: Responder<rep::GraphGetEdges>) {
        let result = self.graphs.graph(request.graph).and_then(|graph| {
            let edges = self.device.graph_all_edges(graph)?;
            let edges = edges
                .into_iter()
                .map(|(from, to, [from_port, to_port, kind])| GraphEdge {
                    from: self.graphs.node_id(from, request.graph),
                    to: self.graphs.node_id(to, request.graph),
                    from_port,
                    to_port,
                    kind,
                })
                .collect();
            Ok(rep::GraphGetEdges { edges })
        });
        reply.send(result);
    }

    pub(super) fn graph_node_enabled(&mut self, request: req::GraphNodeEnabled, reply: Responder<rep::GraphNodeEnabled>) {
        let result = self
            .graphs
            .exec_node(request.exec, request.node)
            .and_then(|(exec, node)| self.device.graph_node_enabled(exec, node, request.set));
        reply.send(result.map(|enabled| rep::GraphNodeEnabled { enabled }));
    }

    pub(super) fn graph_node_object(&mut self, request: req::GraphNodeObject, reply: Responder<rep::GraphNodeObject>) {
        let result = (|| {
            let (node, _) = self.graphs.node(request.node)?;
            if self.graphs.host_copies.contains_key(&request.node) {
                return Err(CudaError::INVALID_VALUE);
            }
            match self.device.graph_node_kind(node)? {
                node_type::EVENT_RECORD | node_type::WAIT_EVENT => {
                    let event = self.device.graph_node_event(node)?;
                    self.events.iter().find(|(_, known)| **known == event).map(|(id, _)| *id).ok_or(CudaError::INVALID_VALUE)
                }
                node_type::GRAPH => {
                    let child = self.device.graph_child(node)?;
                    if let Some(id) = self.graphs.graph_ids.get(&child) {
                        return Ok(*id);
                    }
                    // The node's own graph, named now: it goes with the node.
                    self.graphs.next_server_node += 1;
                    let id = self.graphs.next_server_node;
                    self.graphs.add_graph(id, child);
                    self.graphs.owned.entry(request.node).or_default().push(id);
                    Ok(id)
                }
                _ => Err(CudaError::INVALID_VALUE),
            }
        })();
        reply.send(result.map(|object| rep::GraphNodeObject { object }));
    }

    pub(super) fn graph_mem_attribute(&mut self, request: req::GraphMemAttribute, reply: Responder<rep::GraphMemAttribute>) {
        reply.send(self.device.graph_mem_attribute(request.attribute, request.set).map(|value| rep::GraphMemAttribute { value }));
    }

    pub(super) fn graph_mem_trim(&mut self, _request: req::GraphMemTrim, reply: Responder<rep::GraphMemTrim>) {
        reply.send(self.device.graph_mem_trim().map(|()| rep::GraphMemTrim {}));
    }

    pub(super) fn graph_node_get_params(&mut self, request: req::GraphNodeGetParams, reply: Responder<rep::GraphNodeGetParams>) {
        let result = (|| {
            let (node, _) = self.graphs.node(request.node)?;
            if let Some(host) = self.graphs.host_copies.get(&request.node) {
                return Ok(NodeReadback::Memcpy(app_copy(host)));
            }
            Ok(match self.device.graph_node_read(node)? {
                NodeRead::Memcpy(copy) => {
                    // Host memory a captured copy names is the client's own only where the
                    // segment is mapped at the client's address.
                    for side in [&copy.src, &copy.dst] {
                        let mapped = self.shm.as_ref().is_some_and(|segment| segment.aliases(side.ptr, 1));
                        if side.memory_type == MEMORY_HOST && !mapped {
                            return Err(CudaError::NOT_SUPPORTED);
                        }
                    }
                    NodeReadback::Memcpy(copy)
                }
                NodeRead::Memset(set) => NodeReadback::Memset(set),
                NodeRead::Host(site) => {
                    let call = self.graphs.sites.iter().find(|(_, known)| Arc::as_ptr(known) as usize == site).map(|(call, _)| *call);
                    NodeReadback::Host { call: call.ok_or(CudaError::INVALID_VALUE)? }
                }
                NodeRead::BatchMemOp(ops) => NodeReadback::BatchMemOp { ops },
            })
        })();
        reply.send(result.map(|params| rep::GraphNodeGetParams { params }));
    }

    /// A kernel node's attribute: forwarded values only (events are refused); an access
    /// policy window must lie in the session's memory.
    pub(super) fn graph_kernel_node_attribute(
        &mut self,
        request: req::GraphKernelNodeAttribute,
        reply: Responder<rep::GraphKernelNodeAttribute>,
    ) {
        use flyt_protocol::ops::kernel_node_attribute::{
            ACCESS_POLICY_WINDOW, FORWARDED, LAUNCH_COMPLETION_EVENT, PROGRAMMATIC_EVENT, VALUE_LEN,
        };
        let result = (|| {
            if matches!(request.attribute, PROGRAMMATIC_EVENT | LAUNCH_COMPLETION_EVENT) {
                return Err(CudaError::NOT_SUPPORTED);
            }
            if !FORWARDED.contains(&request.attribute) {
                return Err(CudaError::INVALID_VALUE);
            }
            let set = self.launch_attribute_value::<VALUE_LEN>(request.set.as_deref(), request.attribute == ACCESS_POLICY_WINDOW)?;
            let (node, graph) = self.graphs.node(request.node)?;
            if set.is_some() {
                self.detach_execs(graph);
            }
            let value = self.device.graph_kernel_node_attribute(node, request.attribute, set.as_ref())?;
            Ok(rep::GraphKernelNodeAttribute { value: value.to_vec() })
        })();
        reply.send(result);
    }

    pub(super) fn graph_kernel_node_copy_attributes(
        &mut self,
        request: req::GraphKernelNodeCopyAttributes,
        reply: Responder<rep::GraphKernelNodeCopyAttributes>,
    ) {
        let result = (|| {
            let ((dst, graph), (src, _)) = (self.graphs.node(request.dst)?, self.graphs.node(request.src)?);
            self.detach_execs(graph);
            self.device.graph_kernel_node_copy_attributes(dst, src)
        })();
        reply.send(result.map(|()| rep::GraphKernelNodeCopyAttributes {}));
    }

    pub(super) fn graph_edges(&mut self, request: req::GraphEdges, reply: Responder<rep::GraphEdges>) {
        let result = (|| {
            let graph = self.graphs.graph(request.graph)?;
            let from = self.graphs.nodes_of(&request.from, request.graph)?;
            let to = self.graphs.nodes_of(&request.to, request.graph)?;
            let data = edge_data(&request.data, from.len())?;
            self.detach_execs(request.graph);
            self.device.graph_edges(graph, &from, &to, data, request.remove)
        })();
        reply.send(result.map(|()| rep::GraphEdges {}));
    }

    pub(super) fn graph_nodes(&mut self, request: req::GraphNodes, reply: Responder<rep::GraphNodes>) {
        let result = self.graphs.graph(request.graph).and_then(|graph| self.device.graph_nodes(graph, request.roots)).map(|nodes| {
            let nodes = nodes
                .into_iter()
                .map(|(node, kind)| {
                    let node = self.graphs.node_id(node, request.graph);
                    // A copy with host memory is a child graph to the driver, a copy to the app.
                    let kind = if self.graphs.host_copies.contains_key(&node) { node_type::MEMCPY } else { kind };
                    GraphNodeEntry { node, kind }
                })
                .collect();
            rep::GraphNodes { nodes }
        });
        reply.send(result);
    }

    pub(super) fn graph_clone(&mut self, request: req::GraphClone, reply: Responder<rep::GraphClone>) {
        let result = (|| {
            self.graphs.new_id_free(request.clone, &self.graphs.graphs)?;
            let graph = self.graphs.graph(request.graph)?;
            let clone = self.device.graph_clone(graph)?;
            self.graphs.add_graph(request.clone, clone);
            self.graphs.hold_as(request.clone, request.graph);
            let originals: Vec<(u64, D::GraphNode)> =
                self.graphs.nodes.iter().filter(|(_, (_, of))| *of == request.graph).map(|(id, (node, _))| (*id, *node)).collect();
            let mut pairs = Vec::with_capacity(originals.len());
            for (id, node) in originals {
                let copy = self.device.graph_node_in_clone(node, clone)?;
                let copy = self.graphs.node_id(copy, request.clone);
                if let Some(host) = self.graphs.host_copies.get(&id).copied() {
                    self.graphs.host_copies.insert(copy, host);
                }
                pairs.push((id, copy));
            }
            Ok(rep::GraphClone { nodes: pairs })
        })();
        reply.send(result);
    }

    pub(super) fn graph_instantiate(&mut self, request: req::GraphInstantiate, reply: Responder<rep::GraphInstantiate>) {
        let result = (|| {
            self.graphs.new_id_free(request.exec, &self.graphs.execs)?;
            let graph = self.graphs.graph(request.graph)?;
            let (host_nodes, plain) = self.census(graph, 0)?;
            let exec = self.device.graph_instantiate(graph, request.flags)?;
            let shadow = self.shadow_of(graph, request.flags, plain);
            let cloned_from = Some(request.graph);
            self.graphs.execs.insert(request.exec, Exec { exec, flags: request.flags, shadow, cloned_from, translate: HashMap::new() });
            self.graphs.hold_memory(request.exec, request.graph);
            self.graphs.hold_as(request.exec, request.graph);
            Ok(rep::GraphInstantiate { host_nodes })
        })();
        reply.send(result);
    }

    pub(super) fn graph_launch(&mut self, request: req::GraphLaunch, reply: Responder<rep::GraphLaunch>) {
        let result = self.graphs.exec(request.exec).and_then(|exec| Ok((exec, self.stream(request.stream)?)));
        let result = result.and_then(|(exec, stream)| self.device.graph_launch(exec, stream));
        if result.is_ok() {
            self.queued(request.stream, crate::activity::Work::Kernels);
        }
        reply.send(result.map(|()| rep::GraphLaunch {}));
    }

    pub(super) fn graph_upload(&mut self, request: req::GraphUpload, reply: Responder<rep::GraphUpload>) {
        let result = self.graphs.exec(request.exec).and_then(|exec| Ok((exec, self.stream(request.stream)?)));
        let result = result.and_then(|(exec, stream)| self.device.graph_upload(exec, stream));
        reply.send(result.map(|()| rep::GraphUpload {}));
    }

    pub(super) fn graph_exec_destroy(&mut self, request: req::GraphExecDestroy, reply: Responder<rep::GraphExecDestroy>) {
        let result =
            self.graphs.execs.remove(&request.exec).ok_or(CudaError::INVALID_VALUE).and_then(|exec| destroy_exec(&*self.device, exec));
        if self.graphs.staging_holders.remove(&request.exec).is_some() {
            self.free_unheld_staging();
        }
        for (ptr, size) in self.graphs.release_exec_memory(request.exec) {
            self.ranges.remove_within(ptr, 1, RangeKind::GraphMemory);
            self.budget.release(size);
        }
        reply.send(result.map(|()| rep::GraphExecDestroy {}));
    }

    pub(super) fn graph_exec_update(&mut self, request: req::GraphExecUpdate, reply: Responder<rep::GraphExecUpdate>) {
        let result = (|| {
            let exec = self.graphs.exec(request.exec)?;
            let graph = self.graphs.graph(request.graph)?;
            let (host_nodes, plain) = self.census(graph, 0)?;
            let update = self.device.graph_exec_update(exec, graph);
            if update.result.is_ok() {
                self.graphs.hold_as(request.exec, request.graph);
                // The executable graph now runs `graph`'s work: its copy follows.
                let flags = self.graphs.execs.get(&request.exec).map_or(0, |record| record.flags);
                let shadow = self.shadow_of(graph, flags, plain);
                if let Some(record) = self.graphs.execs.get_mut(&request.exec) {
                    let old = std::mem::replace(&mut record.shadow, shadow);
                    record.cloned_from = Some(request.graph);
                    record.translate.clear();
                    if let Shadow::Copy(old) = old {
                        let _ = self.device.graph_destroy(old);
                    }
                }
            }
            let error_node = update.error_node.map_or(0, |node| self.graphs.node_ids.get(&node).copied().unwrap_or(0));
            // The outcome travels in the reply either way: the app reads the status and node too.
            Ok(rep::GraphExecUpdate { error: update.result.err(), status: update.status, error_node, host_nodes })
        })();
        reply.send(result);
    }

    pub(super) fn graph_node_set_params(&mut self, mut request: req::GraphNodeSetParams, reply: Responder<rep::GraphNodeSetParams>) {
        let result = (|| {
            let (exec, node, holder) = match request.exec {
                0 => {
                    let (node, graph) = self.graphs.node(request.node)?;
                    self.detach_execs(graph);
                    (None, node, graph)
                }
                exec => self.graphs.exec_node(exec, request.node).map(|(exec, node)| (Some(exec), node, request.exec))?,
            };
            let current = self.graphs.host_copies.get(&request.node).copied();
            match (&request.params, current) {
                (NodeParams::HostMemcpy(host), Some(current)) if host.to_host == current.to_host => {
                    // The driver updates only 1D copies in an executable graph; what it refuses
                    // of the copy inside is refused as it refuses the app's own copy node.
                    self.set_host_copy(exec, holder, node, host).map_err(|error| match (exec, error) {
                        (Some(_), CudaError::GRAPH_EXEC_UPDATE_FAILURE) => CudaError::INVALID_VALUE,
                        (_, error) => error,
                    })?;
                    if exec.is_none() {
                        self.graphs.host_copies.insert(request.node, *host);
                    }
                    return Ok(());
                }
                // A copy with host memory stays one, in its direction, as its node's shape
                // (a copy beside a host node) is fixed.
                (NodeParams::HostMemcpy(_), _) | (_, Some(_)) => return Err(CudaError::INVALID_VALUE),
                _ => {}
            }
            let mut site = None;
            let work = self.node_work(&mut request.params, &mut site)?;
            self.device.graph_node_set(exec, node, work)?;
            if exec.is_some() {
                self.mirror_exec_params(request.exec, request.node, &mut request.params);
            }
            Ok(())
        })();
        reply.send(result.map(|()| rep::GraphNodeSetParams {}));
    }

    pub(super) fn graph_dot_print(&mut self, request: req::GraphDotPrint, reply: Responder<rep::GraphDotPrint>) {
        let result = self.graphs.graph(request.graph).and_then(|graph| self.device.graph_dot(graph, request.flags));
        reply.send(result.map(|text| rep::GraphDotPrint { text }));
    }

    pub(super) fn graph_destroy_node(&mut self, request: req::GraphDestroyNode, reply: Responder<rep::GraphDestroyNode>) {
        let result = self.graphs.node(request.node).and_then(|(node, graph)| {
            self.detach_execs(graph);
            self.device.graph_destroy_node(node)?;
            self.graphs.host_copies.remove(&request.node);
            self.graphs.nodes.remove(&request.node);
            self.graphs.node_ids.remove(&node);
            Ok(rep::GraphDestroyNode {})
        });
        reply.send(result);
    }

    /// The device's copy of a copy with the app's host memory, to or from new staging, and the
    /// host half that sends the staged bytes to the client or fetches them: the device side is
    /// checked against the session's memory and the staging counted in its quota.
    fn host_copy_parts(&mut self, host: &HostCopy) -> CudaResult<(Copy3d, Arc<HostCallSite>, u64)> {
        let copy = host.copy;
        let len = host.packed_len().filter(|len| *len > 0).ok_or(CudaError::INVALID_VALUE)?;
        if len > MAX_HOST_COPY || usize::try_from(len).is_err() {
            return Err(CudaError::INVALID_VALUE);
        }
        let (device, pitch, height) =
            if host.to_host { (copy.src, copy.src_pitch, copy.src_height) } else { (copy.dst, copy.dst_pitch, copy.dst_height) };
        let shape = host.host_box();
        for (pitch, height) in [(pitch, height), (shape.pitch, shape.height)] {
            if (copy.height > 1 && copy.width > pitch) || (copy.depth > 1 && copy.height > height) {
                return Err(CudaError::INVALID_PITCH_VALUE);
            }
        }
        let host_end = copy.span(shape.pitch, shape.height).and_then(|span| shape.ptr.checked_add(span));
        if shape.ptr == 0 || host_end.is_none() {
            return Err(CudaError::INVALID_VALUE);
        }
        self.ranges.check(device, copy.span(pitch, height).ok_or(CudaError::INVALID_VALUE)?)?;
        let device = self.moved_variables.here(device);
        if !self.budget.try_reserve(len) {
            return Err(CudaError::MEMORY_ALLOCATION);
        }
        let (address, staging) = match self.device.graph_staging_alloc(len) {
            Ok(staging) => staging,
            Err(error) => {
                self.budget.release(len);
                return Err(error);
            }
        };
        let (width, rows, depth) = (copy.width, copy.height, copy.depth);
        let device_copy = if host.to_host {
            Copy3d {
                src: device,
                src_pitch: pitch,
                src_height: height,
                dst: address,
                dst_pitch: width,
                dst_height: rows,
                width,
                height: rows,
                depth,
            }
        } else {
            Copy3d {
                src: address,
                src_pitch: width,
                src_height: rows,
                dst: device,
                dst_pitch: pitch,
                dst_height: height,
                width,
                height: rows,
                depth,
            }
        };
        let staged = StagedCopy { staging: Staging { host: staging, len: len as usize }, host: shape, to_host: host.to_host };
        let site = HostCallSite::for_copy(staged, &self.graphs.host_calls);
        self.graphs.staging.insert(address, (len, site.clone()));
        Ok((device_copy, site, address))
    }

    /// Frees the staging no graph or executable graph holds any more (after the device's work
    /// that may use it: `graph_staging_free` waits for it).
    fn free_unheld_staging(&mut self) {
        for (address, len, site) in self.graphs.unheld_staging() {
            if let Err(error) = self.device.graph_staging_free(address) {
                tracing::warn!(%error, "freeing a graph copy's staging");
            }
            self.budget.release(len);
            // Only now: the driver's host node names the site until its work is done.
            drop(site);
        }
    }

    /// A graph that runs a copy with the app's host memory: the device's copy then the host
    /// half (device to host), or the other way round. The caller adds it as a child graph node
    /// (the driver copies it) and destroys it.
    fn host_copy_graph(&mut self, host: &HostCopy) -> CudaResult<(D::Graph, u64)> {
        let (copy, site, address) = self.host_copy_parts(host)?;
        let graph = match self.device.graph_create() {
            Ok(graph) => graph,
            Err(error) => {
                self.free_unheld_staging();
                return Err(error);
            }
        };
        let built = if host.to_host {
            self.device
                .graph_add_node(graph, &[], NodeWork::Memcpy(copy))
                .and_then(|first| self.device.graph_add_node(graph, &[first.node], NodeWork::Host(&site)))
        } else {
            self.device
                .graph_add_node(graph, &[], NodeWork::Host(&site))
                .and_then(|first| self.device.graph_add_node(graph, &[first.node], NodeWork::Memcpy(copy)))
        };
        match built {
            Ok(_) => Ok((graph, address)),
            Err(error) => {
                let _ = self.device.graph_destroy(graph);
                self.free_unheld_staging();
                Err(error)
            }
        }
    }

    /// Adds a copy with the app's host memory to `graph` (the app's `id`) after `dependencies`:
    /// one child graph node to the driver.
    fn add_host_copy(&mut self, graph: D::Graph, id: u64, dependencies: &[D::GraphNode], host: &HostCopy) -> CudaResult<D::GraphNode> {
        let (child, address) = self.host_copy_graph(host)?;
        let added = self.device.graph_add_node(graph, dependencies, NodeWork::Child(child));
        let _ = self.device.graph_destroy(child);
        match added {
            Ok(added) => {
                self.graphs.hold(id, address);
                Ok(added.node)
            }
            Err(error) => {
                self.free_unheld_staging();
                Err(error)
            }
        }
    }

    /// New parameters of a copy with the app's host memory (same direction): in an executable
    /// graph its child graph is replaced; in a graph its copy and host half are changed in place.
    /// `holder`: the app's id of the executable graph, or of the node's graph.
    fn set_host_copy(&mut self, exec: Option<D::GraphExec>, holder: u64, node: D::GraphNode, host: &HostCopy) -> CudaResult<()> {
        if let Some(exec) = exec {
            let (child, address) = self.host_copy_graph(host)?;
            let set = self.device.graph_node_set(Some(exec), node, NodeWork::Child(child));
            let _ = self.device.graph_destroy(child);
            if set.is_ok() {
                self.graphs.hold(holder, address);
            } else {
                self.free_unheld_staging();
            }
            return set;
        }
        let (copy, site, address) = self.host_copy_parts(host)?;
        // Held before the nodes change: a failure halfway leaves a node that may name it.
        self.graphs.hold(holder, address);
        let inner = self.device.graph_child(node)?;
        for (inner_node, kind) in self.device.graph_nodes(inner, false)? {
            match kind {
                node_type::MEMCPY => self.device.graph_node_set(None, inner_node, NodeWork::Memcpy(copy))?,
                node_type::HOST => self.device.graph_node_set(None, inner_node, NodeWork::Host(&site))?,
                _ => return Err(CudaError::INVALID_VALUE),
            }
        }
        Ok(())
    }

    /// `CaptureHostCopy`: the capture records a copy with the app's host memory as a node after
    /// the stream's captured work, and the stream's next captured work follows it.
    pub(super) fn capture_host_copy(&mut self, request: req::CaptureHostCopy, reply: Responder<rep::CaptureHostCopy>) {
        let result = (|| {
            let stream = self.stream(request.stream)?;
            if self.graphs.captures.is_empty() || !self.device.capturing(stream) {
                return Err(CudaError::INVALID_VALUE);
            }
            let info = self.device.capture_info(stream)?;
            if info.status != flyt_protocol::ops::capture_status::ACTIVE {
                return Err(CudaError::STREAM_CAPTURE_INVALIDATED);
            }
            let graph = info.graph.ok_or(CudaError::ILLEGAL_STATE)?;
            let id = self.graphs.graph_ids.get(&graph).copied().ok_or(CudaError::ILLEGAL_STATE)?;
            let node = self.add_host_copy(graph, id, &info.dependencies, &request.copy)?;
            let node_id = self.graphs.node_id(node, id);
            self.graphs.host_copies.insert(node_id, request.copy);
            self.device.capture_dependencies(stream, &[node], None, true)
        })();
        reply.send(result.map(|()| rep::CaptureHostCopy {}));
    }

    /// `HostCopyDone` the session's thread read (the read-ahead takes most): the app's bytes
    /// for a host-to-device copy's staging.
    pub(super) fn host_copy_done(&mut self, request: req::HostCopyDone, bulk: &mut super::BulkIn<'_>, reply: Responder<rep::HostCopyDone>) {
        let result = match self.graphs.host_calls.bytes_wanted(request.run) {
            Some(len) if len as u64 == bulk.remaining() => match bulk.read_all() {
                Some(bytes) => self.graphs.host_calls.copy_done(request.run, bytes),
                // The connection broke: the session ends after this op.
                None => Ok(()),
            },
            _ => Err(CudaError::INVALID_VALUE),
        };
        reply.send(result.map(|()| rep::HostCopyDone {}));
    }

    pub(super) fn launch_host_func(&mut self, request: req::LaunchHostFunc, reply: Responder<rep::LaunchHostFunc>) {
        let result = self.stream(request.stream).and_then(|stream| {
            // Captured, the call becomes a node a graph may run many times.
            let kept = self.device.capturing(stream);
            let site = if kept { self.kept_site(request.call) } else { HostCallSite::new(request.call, &self.graphs.host_calls) };
            self.device.launch_host_call(stream, &site, kept)
        });
        reply.send(result.map(|()| rep::LaunchHostFunc {}));
    }

    pub(super) fn host_call_done(&mut self, request: req::HostCallDone, reply: Responder<rep::HostCallDone>) {
        reply.send(self.graphs.host_calls.done(request.run).map(|()| rep::HostCallDone {}));
    }
}

/// A copy with the app's host memory as the app gave it (`cuGraphMemcpyNodeGetParams`).
fn app_copy(host: &HostCopy) -> NodeCopy {
    let c = &host.copy;
    let side = |memory_type: u32, ptr: u64, pitch: u64, height: u64| NodeCopySide { memory_type, ptr, pos: Pos3::default(), pitch, height };
    let (src_type, dst_type) = if host.to_host { (MEMORY_DEVICE, MEMORY_HOST) } else { (MEMORY_HOST, MEMORY_DEVICE) };
    NodeCopy {
        src: side(src_type, c.src, c.src_pitch, c.src_height),
        dst: side(dst_type, c.dst, c.dst_pitch, c.dst_height),
        width: c.width,
        height: c.height,
        depth: c.depth,
    }
}
