//! CUDA IPC between sessions served on one GPU: a session exports its own allocations and
//! interprocess events as the driver's handles, and maps what another session exported. Each
//! session runs in its own worker process, so these are the driver's own cross-process handles,
//! with its checks; the session adds its own: only its allocations and events are exported, and
//! only mappings it opened are closed. Imported memory is the exporter's, in the exporter's quota.

use std::collections::HashMap;

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{rep, req};

use super::{MAX_HANDLES, Responder, Session};
use crate::backend::Device;
use crate::memory::RangeKind;

/// The session's open mappings of other sessions' memory: address to size.
#[derive(Default)]
pub struct IpcTable {
    opened: HashMap<u64, u64>,
    /// Allocations this session exported: another tenant may have them open.
    exported: usize,
}

impl IpcTable {
    /// Why the session cannot move, if IPC holds it: memory of other sessions it opened, or its
    /// own memory that others may have opened (their mappings would not follow it).
    pub(super) fn move_blocker(&self) -> Option<String> {
        if !self.opened.is_empty() {
            return Some(format!("it has {} IPC memory handle(s) of other processes open", self.opened.len()));
        }
        (self.exported > 0).then(|| format!("it exported {} allocation(s) through IPC handles other processes may hold", self.exported))
    }
}

fn handle_bytes(handle: &[u8]) -> CudaResult<[u8; 64]> {
    handle.try_into().map_err(|_| CudaError::INVALID_VALUE)
}

impl<D: Device> Session<D> {
    /// Closes what the session still has open (it ends, or the device resets).
    pub(super) fn release_ipc(&mut self) {
        for (ptr, size) in self.ipc.opened.drain() {
            self.ranges.remove_within(ptr, size, RangeKind::Imported);
            let _ = self.device.ipc_close_mem(ptr);
        }
    }

    pub(super) fn export_memory(&mut self, request: req::IpcGetMemHandle, reply: Responder<rep::IpcGetMemHandle>) {
        let result = (|| {
            // The session's own allocation: not a variable, a mapping or imported memory.
            if self.ranges.kind_at(request.ptr) != Some(RangeKind::Allocation) {
                return Err(CudaError::INVALID_VALUE);
            }
            let handle = self.device.ipc_mem_handle(request.ptr)?;
            self.ipc.exported += 1;
            Ok(rep::IpcGetMemHandle { handle: handle.to_vec() })
        })();
        reply.send(result);
    }

    pub(super) fn import_memory(&mut self, request: req::IpcOpenMemHandle, reply: Responder<rep::IpcOpenMemHandle>) {
        let result = (|| {
            // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS is the one flag.
            if request.flags & !1 != 0 || self.ipc.opened.len() >= MAX_HANDLES {
                return Err(CudaError::INVALID_VALUE);
            }
            let handle = handle_bytes(&request.handle)?;
            let (ptr, size) = self.device.ipc_open_mem(&handle, request.flags)?;
            self.ranges.insert(ptr, size, RangeKind::Imported);
            self.ipc.opened.insert(ptr, size);
            Ok(rep::IpcOpenMemHandle { ptr, size })
        })();
        reply.send(result);
    }

    pub(super) fn close_import(&mut self, request: req::IpcCloseMemHandle, reply: Responder<rep::IpcCloseMemHandle>) {
        let result = match self.ipc.opened.get(&request.ptr).copied() {
            Some(size) => self.device.ipc_close_mem(request.ptr).map(|()| {
                self.ipc.opened.remove(&request.ptr);
                self.ranges.remove_within(request.ptr, size, RangeKind::Imported);
            }),
            None => Err(CudaError::INVALID_VALUE),
        };
        reply.send(result.map(|()| rep::IpcCloseMemHandle {}));
    }

    pub(super) fn export_event(&mut self, request: req::IpcGetEventHandle, reply: Responder<rep::IpcGetEventHandle>) {
        let result = self
            .event(request.event)
            .and_then(|event| self.device.ipc_event_handle(event))
            .map(|handle| rep::IpcGetEventHandle { handle: handle.to_vec() });
        reply.send(result);
    }

    pub(super) fn import_event(&mut self, request: req::IpcOpenEventHandle, reply: Responder<rep::IpcOpenEventHandle>) {
        let result = (|| {
            if request.event == 0 || self.events.contains_key(&request.event) || self.events.len() >= MAX_HANDLES {
                return Err(CudaError::INVALID_VALUE);
            }
            let event = self.device.ipc_open_event(&handle_bytes(&request.handle)?)?;
            self.events.insert(request.event, event);
            Ok(())
        })();
        reply.send(result.map(|()| rep::IpcOpenEventHandle {}));
    }
}
