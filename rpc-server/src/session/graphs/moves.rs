//! Graphs and executable graphs in a snapshot: each graph is read back from the driver (its
//! nodes' parameters, kernels by module and index with their packed arguments, edges with their
//! data) and made again node by node in the restoring worker, where the app's ids name the new
//! graphs and nodes. An executable graph cannot be read back, so the session keeps a copy of the
//! graph it runs (`Exec::shadow`: the app's own graph while that is plain and unchanged, else a
//! clone, changed along with the executable graph's nodes); the restoring worker instantiates that copy and sends the app's
//! node ids to its nodes.
//!
//! What the driver could not make again at the same addresses or handles makes the checkpoint
//! fail with the reason: graph memory, conditional nodes, graphs launched from the device,
//! copies of host memory or arrays.

use std::collections::HashMap;
use std::sync::Arc;

use flyt_protocol::CudaError;
use flyt_protocol::ops::{
    Copy3d, Dim3, FunctionRef, Memset2d, NodeCopy, NodeCopySide, NodeParams, ParamInfo, StreamMemOp, kernel_node_attribute, node_type,
};
use serde::{Deserialize, Serialize};

use super::{Exec, GraphTable, Shadow};
use crate::backend::{Device, EdgeData, NodeRead, NodeWork};
use crate::host_calls::HostCalls;
use crate::session::Session;

/// `CU_MEMORYTYPE_DEVICE` and `CU_MEMORYTYPE_UNIFIED`: a copy side at a device address.
const MEMORY_DEVICE: u32 = 2;
const MEMORY_UNIFIED: u32 = 4;
/// `CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH`.
const DEVICE_LAUNCH: u64 = 4;
/// Deepest nesting of child graphs followed.
const MAX_DEPTH: u32 = 64;

/// A session's graphs as the snapshot holds them.
#[derive(Serialize, Deserialize, Default)]
pub struct GraphsState {
    /// The app's graphs (not the ones a node owns, which travel with their node), by id.
    graphs: Vec<(u64, Shape)>,
    execs: Vec<ExecState>,
    /// The next id the server gives a node the app had not named (so none is given twice).
    next_server_node: u64,
}

/// A graph's nodes in the driver's order and its edges between them (by index).
#[derive(Serialize, Deserialize)]
struct Shape {
    nodes: Vec<NodeState>,
    edges: Vec<(u32, u32, EdgeData)>,
}

#[derive(Serialize, Deserialize)]
struct NodeState {
    /// The app's id of the node, if it named it.
    id: Option<u64>,
    work: NodeSpec,
}

#[derive(Serialize, Deserialize)]
enum NodeSpec {
    Empty,
    Kernel {
        function: FunctionRef,
        grid: Dim3,
        block: Dim3,
        shared_mem: u32,
        args: Vec<u8>,
        /// Launch attributes the node holds (`CUlaunchAttributeID`, value), set again where a new
        /// node's differ.
        attributes: Vec<(u32, Vec<u8>)>,
    },
    Memcpy(Copy3d),
    Memset(Memset2d),
    /// The app's event id.
    EventRecord(u64),
    EventWait(u64),
    /// The app's host function.
    Host(u64),
    /// A child graph node: its graph (with the app's id for it, if it asked for one).
    Child {
        id: Option<u64>,
        graph: Shape,
    },
    /// Memory operations on the session's device memory.
    BatchMemOp(Vec<StreamMemOp>),
}

impl NodeSpec {
    fn kind(&self) -> u32 {
        match self {
            Self::Empty => node_type::EMPTY,
            Self::Kernel { .. } => node_type::KERNEL,
            Self::Memcpy(_) => node_type::MEMCPY,
            Self::Memset(_) => node_type::MEMSET,
            Self::EventRecord(_) => node_type::EVENT_RECORD,
            Self::EventWait(_) => node_type::WAIT_EVENT,
            Self::Host(_) => node_type::HOST,
            Self::Child { .. } => node_type::GRAPH,
            Self::BatchMemOp(_) => node_type::BATCH_MEM_OP,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct ExecState {
    id: u64,
    flags: u64,
    /// The graph it runs (its copy of it).
    graph: Shape,
    /// Node ids the app names its nodes by, with the index of the node of `graph` each names.
    nodes: Vec<(u64, u32)>,
    /// Indexes of the nodes the app turned off in it.
    disabled: Vec<u32>,
}

/// The session's kernels by the driver's handle: their id and parameter layout.
type Kernels<D> = HashMap<<D as Device>::Function, (FunctionRef, Vec<ParamInfo>)>;

/// A copy node's sides as device addresses, if both are device memory.
fn device_copy(copy: &NodeCopy) -> Option<Copy3d> {
    let start = |side: &NodeCopySide| {
        if !matches!(side.memory_type, MEMORY_DEVICE | MEMORY_UNIFIED) {
            return None;
        }
        let row = side.pos.y.checked_mul(side.pitch)?;
        let slice = side.pos.z.checked_mul(side.pitch)?.checked_mul(side.height)?;
        side.ptr.checked_add(side.pos.x)?.checked_add(row)?.checked_add(slice)
    };
    Some(Copy3d {
        src: start(&copy.src)?,
        src_pitch: copy.src.pitch,
        src_height: copy.src.height,
        dst: start(&copy.dst)?,
        dst_pitch: copy.dst.pitch,
        dst_height: copy.dst.height,
        width: copy.width,
        height: copy.height,
        depth: copy.depth,
    })
}

impl<D: Device> Session<D> {
    /// What an executable graph made with `flags` from `graph` keeps of it: nothing yet for a
    /// `plain` graph (it is the record until the app changes it), else a copy, or why it has none.
    pub(super) fn shadow_of(&self, graph: D::Graph, flags: u64, plain: bool) -> Shadow<D::Graph> {
        if flags & DEVICE_LAUNCH != 0 {
            return Shadow::Refused("it is launched from the device, whose kernels hold its handle".into());
        }
        // A graph a node owns goes when that node's graph goes: an executable graph keeps a copy.
        let owned = self.graphs.graph_ids.get(&graph).is_some_and(|id| self.graphs.is_owned(*id));
        if plain && !owned {
            return Shadow::App;
        }
        self.clone_shadow(graph)
    }

    fn clone_shadow(&self, graph: D::Graph) -> Shadow<D::Graph> {
        match self.device.graph_clone(graph) {
            Ok(copy) => Shadow::Copy(copy),
            Err(error) => {
                Shadow::Refused(format!("its graph cannot be copied ({error}): graphs with memory or conditional nodes do not move"))
            }
        }
    }

    /// Whether `exec`'s record is still the app's graph `graph`.
    pub(super) fn runs_app_graph(exec: &Exec<D>, graph: u64) -> bool {
        matches!(exec.shadow, Shadow::App) && exec.cloned_from == Some(graph)
    }

    /// The app is about to change its graph `graph`: executable graphs whose record it still is
    /// get their own copy of it first.
    pub(super) fn detach_execs(&mut self, graph: u64) {
        self.detach_execs_except(graph, None);
    }

    /// [`detach_execs`](Self::detach_execs) but for `except` (which takes the graph over).
    pub(super) fn detach_execs_except(&mut self, graph: u64, except: Option<u64>) {
        let ids: Vec<u64> = self
            .graphs
            .execs
            .iter()
            .filter(|(id, exec)| Some(**id) != except && Self::runs_app_graph(exec, graph))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.detach_exec(id);
        }
    }

    /// Gives executable graph `exec` its own copy of the app's graph it records, if it records one.
    fn detach_exec(&mut self, exec: u64) {
        let Some(record) = self.graphs.execs.get(&exec) else { return };
        let (Shadow::App, Some(from)) = (&record.shadow, record.cloned_from) else { return };
        let copy = self.graphs.graph(from).map_or_else(|_| Shadow::Refused("its graph is gone".into()), |graph| self.clone_shadow(graph));
        if let Some(record) = self.graphs.execs.get_mut(&exec) {
            record.shadow = copy;
        }
    }

    /// Makes the same change in an executable graph's copy of its graph as `params` just made
    /// in the executable graph; an executable graph whose copy cannot follow cannot move.
    pub(super) fn mirror_exec_params(&mut self, exec: u64, node: u64, params: &mut NodeParams) {
        // The executable graph is about to differ from the app's graph: it needs its own copy.
        self.detach_exec(exec);
        let Some(record) = self.graphs.execs.get(&exec) else { return };
        let Shadow::Copy(shadow) = record.shadow else { return };
        let counterpart = match (record.translate.get(&node), self.graphs.node(node), record.cloned_from) {
            (Some(translated), _, _) => Ok(*translated),
            (None, Ok((original, of)), Some(from)) if of == from => self.device.graph_node_in_clone(original, shadow),
            _ => Err(CudaError::INVALID_VALUE),
        };
        let mut site = None;
        let mirrored = counterpart.and_then(|counterpart| {
            let work = self.node_work(params, &mut site)?;
            self.device.graph_node_set(None, counterpart, work)
        });
        if let Err(error) = mirrored {
            let _ = self.device.graph_destroy(shadow);
            if let Some(record) = self.graphs.execs.get_mut(&exec) {
                record.shadow = Shadow::Refused(format!("a change to one of its nodes could not be followed in its copy ({error})"));
            }
        }
    }

    /// The session's graphs and executable graphs, read back for a snapshot (the session's
    /// work has drained); `Err` says why they cannot move.
    pub(in crate::session) fn graphs_state(&self) -> Result<GraphsState, String> {
        if let Some(reason) = self.graphs.move_blocker() {
            return Err(reason);
        }
        let mut kernels: Kernels<D> = HashMap::new();
        for (module, loaded) in &self.modules {
            for (index, kernel) in loaded.functions.iter().enumerate() {
                if let Ok(kernel) = kernel {
                    let id = FunctionRef { module: *module, index: index as u32 };
                    kernels.insert(kernel.function, (id, kernel.params.clone()));
                }
            }
        }
        let mut ids: Vec<u64> = self.graphs.graphs.keys().copied().filter(|id| !self.graphs.is_owned(*id)).collect();
        ids.sort_unstable();
        let mut graphs = Vec::with_capacity(ids.len());
        for id in ids {
            graphs.push((id, self.describe(self.graphs.graphs[&id], true, &kernels, 0)?.0));
        }
        let mut exec_ids: Vec<u64> = self.graphs.execs.keys().copied().collect();
        exec_ids.sort_unstable();
        let mut execs = Vec::with_capacity(exec_ids.len());
        for id in exec_ids {
            execs.push(self.exec_state(id, &kernels)?);
        }
        Ok(GraphsState { graphs, execs, next_server_node: self.graphs.next_server_node })
    }

    fn exec_state(&self, id: u64, kernels: &Kernels<D>) -> Result<ExecState, String> {
        let record = &self.graphs.execs[&id];
        // The app's own graph where it is still the record: its nodes are the executable graph's.
        let (shadow, is_app_graph) = match (&record.shadow, record.cloned_from) {
            (Shadow::Copy(shadow), _) => (*shadow, false),
            (Shadow::App, Some(from)) => (self.graphs.graph(from).map_err(|_| "an executable graph's graph is gone".to_string())?, true),
            (Shadow::App, None) => return Err("an executable graph's graph is gone".into()),
            (Shadow::Refused(reason), _) => return Err(format!("an executable graph cannot move: {reason}")),
        };
        let (graph, listed) = self.describe(shadow, false, kernels, 0)?;
        let position: HashMap<D::GraphNode, u32> = listed.into_iter().enumerate().map(|(index, node)| (node, index as u32)).collect();
        let mut nodes: Vec<(u64, u32)> = record.translate.iter().filter_map(|(id, node)| Some((*id, *position.get(node)?))).collect();
        if let Some(from) = record.cloned_from {
            for (node_id, (node, of)) in &self.graphs.nodes {
                let counterpart = if is_app_graph { Ok(*node) } else { self.device.graph_node_in_clone(*node, shadow) };
                if *of == from
                    && let Ok(copy) = counterpart
                    && let Some(index) = position.get(&copy)
                {
                    nodes.push((*node_id, *index));
                }
            }
        }
        nodes.sort_unstable();
        let mut disabled = Vec::new();
        for (node_id, index) in &nodes {
            let switchable = matches!(graph.nodes[*index as usize].work.kind(), node_type::KERNEL | node_type::MEMCPY | node_type::MEMSET);
            if switchable
                && let Ok((exec, node)) = self.graphs.exec_node(id, *node_id)
                && self.device.graph_node_enabled(exec, node, None) == Ok(false)
            {
                disabled.push(*index);
            }
        }
        Ok(ExecState { id, flags: record.flags, graph, nodes, disabled })
    }

    /// A graph read back from the driver, and its nodes in the shape's order; `named`: with the
    /// app's ids of its nodes and child graphs (an executable graph's copy has none).
    fn describe(&self, graph: D::Graph, named: bool, kernels: &Kernels<D>, depth: u32) -> Result<(Shape, Vec<D::GraphNode>), String> {
        if depth > MAX_DEPTH {
            return Err("child graphs nest too deep".into());
        }
        let listed = self.device.graph_nodes(graph, false).map_err(|error| format!("a graph's nodes: {error}"))?;
        let mut nodes = Vec::with_capacity(listed.len());
        for (node, kind) in &listed {
            let work = match *kind {
                node_type::EMPTY => NodeSpec::Empty,
                node_type::KERNEL => {
                    let layout = |function| kernels.get(&function).map(|(_, params)| params.clone());
                    let read = self.device.graph_kernel_node_read(*node, &layout).map_err(|error| format!("a kernel node: {error}"))?;
                    let (function, _) = kernels.get(&read.function).ok_or("a kernel node runs a kernel the session did not load")?;
                    let attributes = kernel_node_attribute::FORWARDED
                        .iter()
                        .filter_map(|attribute| {
                            self.device.graph_kernel_node_attribute(*node, *attribute, None).ok().map(|value| (*attribute, value.to_vec()))
                        })
                        .collect();
                    let (grid, block, shared_mem, args) = (read.grid, read.block, read.shared_mem, read.args);
                    NodeSpec::Kernel { function: *function, grid, block, shared_mem, args, attributes }
                }
                node_type::MEMCPY => match self.device.graph_node_read(*node) {
                    Ok(NodeRead::Memcpy(copy)) => {
                        NodeSpec::Memcpy(device_copy(&copy).ok_or("a copy node copies host memory, which the new server does not have")?)
                    }
                    Err(CudaError::NOT_SUPPORTED) => {
                        return Err("a copy node copies an array, which cannot be named after a move yet".into());
                    }
                    _ => return Err("a copy node cannot be read".into()),
                },
                node_type::MEMSET => match self.device.graph_node_read(*node) {
                    Ok(NodeRead::Memset(set)) => NodeSpec::Memset(set),
                    _ => return Err("a memset node cannot be read".into()),
                },
                node_type::HOST => {
                    let Ok(NodeRead::Host(site)) = self.device.graph_node_read(*node) else {
                        return Err("a host node cannot be read".into());
                    };
                    let known = self.graphs.sites.iter().find(|(_, known)| Arc::as_ptr(known) as usize == site);
                    NodeSpec::Host(*known.ok_or("a host node runs a function the session does not know")?.0)
                }
                node_type::EVENT_RECORD | node_type::WAIT_EVENT => {
                    let event = self.device.graph_node_event(*node).map_err(|error| format!("an event node: {error}"))?;
                    let id = self.events.iter().find(|(_, known)| **known == event).map(|(id, _)| *id);
                    let id = id.ok_or("an event node names an event the session does not know")?;
                    if *kind == node_type::EVENT_RECORD { NodeSpec::EventRecord(id) } else { NodeSpec::EventWait(id) }
                }
                node_type::GRAPH => {
                    let child = self.device.graph_child(*node).map_err(|error| format!("a child graph node: {error}"))?;
                    let id = if named { self.graphs.graph_ids.get(&child).copied() } else { None };
                    NodeSpec::Child { id, graph: self.describe(child, named, kernels, depth + 1)?.0 }
                }
                node_type::BATCH_MEM_OP => match self.device.graph_node_read(*node) {
                    // What a node the app adds may hold (the session's device memory) is what
                    // the new server can make again.
                    Ok(NodeRead::BatchMemOp(ops)) => {
                        if self.check_node_mem_ops(&ops).is_err() {
                            return Err("a batch memory operation node names host memory, which the new server does not have".into());
                        }
                        NodeSpec::BatchMemOp(ops)
                    }
                    _ => return Err("a batch memory operation node cannot be read".into()),
                },
                other => return Err(format!("a graph node of type {other} cannot be made again elsewhere")),
            };
            let id = if named { self.graphs.node_ids.get(node).copied() } else { None };
            nodes.push(NodeState { id, work });
        }
        let position: HashMap<D::GraphNode, u32> = listed.iter().enumerate().map(|(index, (node, _))| (*node, index as u32)).collect();
        let mut edges = Vec::new();
        for (from, to, data) in self.device.graph_all_edges(graph).map_err(|error| format!("a graph's edges: {error}"))? {
            let (Some(from), Some(to)) = (position.get(&from), position.get(&to)) else {
                return Err("a graph's edge joins nodes it does not list".into());
            };
            edges.push((*from, *to, data));
        }
        Ok((Shape { nodes, edges }, listed.into_iter().map(|(node, _)| node).collect()))
    }
}

/// What a restore finds the app's kernels and events by.
pub struct Resolve<'a, D: Device> {
    /// A kernel's handle here and the bytes of its packed arguments.
    pub kernel: &'a dyn Fn(FunctionRef) -> Option<(D::Function, u64)>,
    pub event: &'a dyn Fn(u64) -> Option<D::Event>,
}

impl<D: Device> GraphTable<D> {
    /// The graphs of a snapshot made again on `device`; their host nodes announce through
    /// `host_calls` (linked to the session once it connects).
    pub fn restore(device: &D, state: GraphsState, host_calls: Arc<HostCalls>, resolve: &Resolve<'_, D>) -> Result<Self, String> {
        let mut table = Self::new(host_calls);
        table.next_server_node = state.next_server_node;
        for (id, shape) in &state.graphs {
            let graph = device.graph_create().map_err(|error| format!("a graph: {error}"))?;
            table.add_graph(*id, graph);
            let made = table.build(device, shape, graph, resolve, 0)?;
            table.name_nodes(device, shape, &made, *id, 0)?;
        }
        for exec in state.execs {
            let shadow = device.graph_create().map_err(|error| format!("a graph: {error}"))?;
            let nodes = table.build(device, &exec.graph, shadow, resolve, 0)?;
            let made = device.graph_instantiate(shadow, exec.flags).map_err(|error| format!("an executable graph: {error}"))?;
            let node_at = |index: u32| nodes.get(index as usize).copied().ok_or("an executable graph's node is missing");
            for index in &exec.disabled {
                device.graph_node_enabled(made, node_at(*index)?, Some(false)).map_err(|error| format!("turning a node off: {error}"))?;
            }
            let mut translate = HashMap::with_capacity(exec.nodes.len());
            for (id, index) in &exec.nodes {
                translate.insert(*id, node_at(*index)?);
            }
            table.execs.insert(exec.id, Exec { exec: made, flags: exec.flags, shadow: Shadow::Copy(shadow), cloned_from: None, translate });
        }
        Ok(table)
    }

    /// Adds `shape`'s nodes and edges to the empty `graph`; its nodes in `shape`'s order.
    fn build(
        &mut self,
        device: &D,
        shape: &Shape,
        graph: D::Graph,
        resolve: &Resolve<'_, D>,
        depth: u32,
    ) -> Result<Vec<D::GraphNode>, String> {
        if depth > MAX_DEPTH {
            return Err("child graphs nest too deep".into());
        }
        let mut made = Vec::with_capacity(shape.nodes.len());
        for node in &shape.nodes {
            let mut args = Vec::new();
            let site;
            let mut child = None;
            let event = |id: &u64| (resolve.event)(*id).ok_or_else(|| format!("event {id} of a graph node is not in the snapshot"));
            let work = match &node.work {
                NodeSpec::Empty => NodeWork::Empty,
                NodeSpec::Kernel { function, grid, block, shared_mem, args: packed, .. } => {
                    let (kernel, len) = (resolve.kernel)(*function).ok_or("a graph node's kernel did not load here")?;
                    if packed.len() as u64 != len {
                        return Err("a graph node's kernel arguments do not fit its kernel".into());
                    }
                    args.clone_from(packed);
                    NodeWork::Kernel { function: kernel, grid: *grid, block: *block, shared_mem: *shared_mem, args: &mut args }
                }
                NodeSpec::Memcpy(copy) => NodeWork::Memcpy(*copy),
                NodeSpec::Memset(set) => NodeWork::Memset(*set),
                NodeSpec::EventRecord(id) => NodeWork::EventRecord(event(id)?),
                NodeSpec::EventWait(id) => NodeWork::EventWait(event(id)?),
                NodeSpec::Host(call) => {
                    site = self.site(*call);
                    NodeWork::Host(&site)
                }
                NodeSpec::Child { graph: inner, .. } => {
                    // The node takes a copy of the graph given.
                    let staged = device.graph_create().map_err(|error| format!("a graph: {error}"))?;
                    self.build(device, inner, staged, resolve, depth + 1)?;
                    child = Some(staged);
                    NodeWork::Child(staged)
                }
                NodeSpec::BatchMemOp(ops) => NodeWork::BatchMemOp(ops),
            };
            let added = device.graph_add_node(graph, &[], work);
            if let Some(staged) = child {
                let _ = device.graph_destroy(staged);
            }
            let added = added.map_err(|error| format!("a graph node: {error}"))?.node;
            if let NodeSpec::Kernel { attributes, .. } = &node.work {
                for (attribute, value) in attributes {
                    let value = <[u8; kernel_node_attribute::VALUE_LEN]>::try_from(value.as_slice())
                        .map_err(|_| "a kernel node's attribute has the wrong size".to_string())?;
                    if device.graph_kernel_node_attribute(added, *attribute, None).ok() != Some(value) {
                        device
                            .graph_kernel_node_attribute(added, *attribute, Some(&value))
                            .map_err(|error| format!("kernel node attribute {attribute}: {error}"))?;
                    }
                }
            }
            made.push(added);
        }
        let node_at = |index: u32| made.get(index as usize).copied().ok_or_else(|| "a graph's edge names a missing node".to_string());
        let (mut from, mut to, mut data) = (Vec::new(), Vec::new(), Vec::new());
        for (edge_from, edge_to, edge_data) in &shape.edges {
            from.push(node_at(*edge_from)?);
            to.push(node_at(*edge_to)?);
            data.push(*edge_data);
        }
        device.graph_edges(graph, &from, &to, Some(&data), false).map_err(|error| format!("a graph's edges: {error}"))?;
        Ok(made)
    }

    /// Gives the app's ids to `nodes` (made from `shape`, in its order) and to the named child
    /// graphs among them, and their nodes.
    fn name_nodes(&mut self, device: &D, shape: &Shape, nodes: &[D::GraphNode], graph_id: u64, depth: u32) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err("child graphs nest too deep".into());
        }
        for (node, state) in nodes.iter().zip(&shape.nodes) {
            if let Some(id) = state.id {
                self.add_node(id, *node, graph_id);
            }
            if let NodeSpec::Child { id: Some(child_id), graph: inner } = &state.work {
                let child = device.graph_child(*node).map_err(|error| format!("a child graph node: {error}"))?;
                self.add_graph(*child_id, child);
                if let Some(node_id) = state.id {
                    self.owned.entry(node_id).or_default().push(*child_id);
                }
                let copied = copied_nodes(device, inner, child)?;
                self.name_nodes(device, inner, &copied, *child_id, depth + 1)?;
            }
        }
        Ok(())
    }
}

/// The nodes of a child graph node's copy of the graph made from `shape`, in `shape`'s order:
/// the driver lists them as they were added. The types and edges must agree, so a different
/// order is an error rather than ids given to the wrong nodes.
fn copied_nodes<D: Device>(device: &D, shape: &Shape, child: D::Graph) -> Result<Vec<D::GraphNode>, String> {
    let listed = device.graph_nodes(child, false).map_err(|error| format!("a graph's nodes: {error}"))?;
    let kinds: Vec<u32> = shape.nodes.iter().map(|node| node.work.kind()).collect();
    if listed.iter().map(|(_, kind)| *kind).ne(kinds.iter().copied()) {
        return Err("a child graph's copy lists its nodes in another order".into());
    }
    let position: HashMap<D::GraphNode, u32> = listed.iter().enumerate().map(|(index, (node, _))| (*node, index as u32)).collect();
    let mut edges = Vec::new();
    for (from, to, data) in device.graph_all_edges(child).map_err(|error| format!("a graph's edges: {error}"))? {
        edges.push((position.get(&from).copied(), position.get(&to).copied(), data));
    }
    let mut expected: Vec<_> = shape.edges.iter().map(|(from, to, data)| (Some(*from), Some(*to), *data)).collect();
    edges.sort_unstable();
    expected.sort_unstable();
    if edges != expected {
        return Err("a child graph's copy lists its nodes in another order".into());
    }
    Ok(listed.into_iter().map(|(node, _)| node).collect())
}
