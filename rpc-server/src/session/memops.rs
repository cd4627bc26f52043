//! Stream memory operations (`cuStreamWriteValue*`, `cuStreamWaitValue*`, `cuStreamBatchMemOp`),
//! tensor maps and context-wide events for a session. Every address is checked against the
//! session's memory before the driver sees it: a memory operation's word lies in the session's
//! device memory or in pinned host memory mapped at the client's address; a tensor map's whole
//! tensor lies in one device range.

use std::collections::{HashMap, VecDeque};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{StreamMemOp, TENSOR_MAP_SIZE, mem_op, rep, req};

use super::{Responder, Session};
use crate::backend::Device;

/// The tensor maps the session's driver encoded, each with the bytes its tensor spans from its
/// address: `cuTensorMapReplaceAddress` may only move a map it knows to memory that holds the
/// whole tensor. The most recent `TENSOR_MAPS_KEPT` are kept.
#[derive(Default)]
pub struct TensorMaps {
    spans: HashMap<[u8; TENSOR_MAP_SIZE], u64>,
    order: VecDeque<[u8; TENSOR_MAP_SIZE]>,
}

const TENSOR_MAPS_KEPT: usize = 4096;

impl TensorMaps {
    /// Why the session cannot move, if tensor maps hold it (they embed device addresses and
    /// the driver's encoding).
    pub(super) fn move_blocker(&self) -> Option<String> {
        (!self.spans.is_empty()).then(|| format!("it encoded {} tensor map(s)", self.spans.len()))
    }

    fn remember(&mut self, map: [u8; TENSOR_MAP_SIZE], span: u64) {
        if self.spans.insert(map, span).is_none() {
            self.order.push_back(map);
        }
        while self.order.len() > TENSOR_MAPS_KEPT {
            if let Some(old) = self.order.pop_front() {
                self.spans.remove(&old);
            }
        }
    }
}

impl<D: Device> Session<D> {
    /// Whether an op is one Flyt serves, with flags the driver's v2 API takes. Flushes of
    /// remote writes are refused: `CAN_FLUSH_REMOTE_WRITES` reads 0 through Flyt.
    fn check_mem_op(&self, op: &StreamMemOp) -> CudaResult<()> {
        match op.kind {
            mem_op::BARRIER => {
                return if matches!(op.flags, mem_op::BARRIER_SYS | mem_op::BARRIER_GPU) { Ok(()) } else { Err(CudaError::INVALID_VALUE) };
            }
            mem_op::FLUSH_REMOTE_WRITES => return Err(CudaError::NOT_SUPPORTED),
            mem_op::WAIT_VALUE_32 | mem_op::WAIT_VALUE_64 if op.flags & mem_op::WAIT_FLUSH != 0 => {
                return Err(CudaError::NOT_SUPPORTED);
            }
            mem_op::WAIT_VALUE_32 | mem_op::WAIT_VALUE_64 if op.flags > mem_op::WAIT_NOR => return Err(CudaError::INVALID_VALUE),
            mem_op::WRITE_VALUE_32 | mem_op::WRITE_VALUE_64 if op.flags != 0 => return Err(CudaError::INVALID_VALUE),
            mem_op::WAIT_VALUE_32 | mem_op::WAIT_VALUE_64 | mem_op::WRITE_VALUE_32 | mem_op::WRITE_VALUE_64 => {}
            _ => return Err(CudaError::INVALID_VALUE),
        }
        let width = op.width().ok_or(CudaError::INVALID_VALUE)?;
        if !op.address.is_multiple_of(width) {
            return Err(CudaError::INVALID_VALUE);
        }
        if self.ranges.check(op.address, width).is_ok() {
            return Ok(());
        }
        // Pinned host memory the server mapped at the client's address (a flag the app's CPU
        // writes): the device reaches it as under unified addressing.
        match &self.shm {
            Some(segment) if segment.aliases(op.address, width) => Ok(()),
            _ => Err(CudaError::INVALID_VALUE),
        }
    }

    /// The operations of a batch memory operation node: as a batch's, on the session's device
    /// memory only (a graph outlives the pinned host blocks it could name).
    pub(super) fn check_node_mem_ops(&self, ops: &[StreamMemOp]) -> CudaResult<()> {
        if ops.is_empty() || ops.len() > mem_op::MAX_BATCH {
            return Err(CudaError::INVALID_VALUE);
        }
        for op in ops {
            self.check_mem_op(op)?;
            if let Some(width) = op.width() {
                self.ranges.check(op.address, width)?;
            }
        }
        Ok(())
    }

    pub(super) fn mem_ops(&mut self, request: req::StreamMemOps, reply: Responder<rep::StreamMemOps>) {
        let result = (|| {
            if request.ops.is_empty() || request.ops.len() > mem_op::MAX_BATCH {
                return Err(CudaError::INVALID_VALUE);
            }
            let stream = self.stream(request.stream)?;
            request.ops.iter().try_for_each(|op| self.check_mem_op(op))?;
            // SAFETY: every address was checked above: the session's device memory, or a block
            // of the segment mapped at that address and registered mapped, which is unmapped only
            // after the device is synchronized.
            unsafe { self.device.stream_mem_ops(stream, &request.ops) }
        })();
        reply.send(result.map(|()| rep::StreamMemOps {}));
    }

    pub(super) fn encode_tensor_map(&mut self, request: req::TensorMapEncode, reply: Responder<rep::TensorMapEncode>) {
        let result = (|| {
            let span = request.encode.global_span().ok_or(CudaError::INVALID_VALUE)?;
            self.ranges.check(request.encode.address, span)?;
            let map = self.device.tensor_map_encode(&request.encode)?;
            self.tensor_maps.remember(map, span);
            Ok(map)
        })();
        reply.send(result.map(|map| rep::TensorMapEncode { map: map.to_vec() }));
    }

    pub(super) fn replace_tensor_map_address(
        &mut self,
        request: req::TensorMapReplaceAddress,
        reply: Responder<rep::TensorMapReplaceAddress>,
    ) {
        let result = (|| {
            let map: [u8; TENSOR_MAP_SIZE] = request.map.as_slice().try_into().map_err(|_| CudaError::INVALID_VALUE)?;
            // A map's layout is the driver's: its span is known only for maps encoded here.
            let span = *self.tensor_maps.spans.get(&map).ok_or(CudaError::INVALID_VALUE)?;
            self.ranges.check(request.address, span)?;
            let moved = self.device.tensor_map_replace_address(&map, request.address)?;
            self.tensor_maps.remember(moved, span);
            Ok(moved)
        })();
        reply.send(result.map(|map| rep::TensorMapReplaceAddress { map: map.to_vec() }));
    }

    pub(super) fn ctx_event(&mut self, request: req::ContextEvent, reply: Responder<rep::ContextEvent>) {
        let result = self.event(request.event).and_then(|event| self.device.context_event(event, request.wait));
        reply.send(result.map(|()| rep::ContextEvent {}));
    }
}
