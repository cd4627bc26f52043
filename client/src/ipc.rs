//! CUDA IPC on the client side. Opening a handle this process already has open counts a
//! reference and returns the same pointer, as the driver does, here, without a round trip: Open
//! MPI and vineyard reopen handles often, and a real open costs a round trip and the driver's
//! mapping (about 100 us). The server maps a handle once per session and unmaps it when the last
//! reference closes.

use std::collections::HashMap;
use std::sync::Mutex;

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::req;

use crate::client::Client;

/// A mapping this process opened: its handle, size and references.
struct Opened {
    handle: [u8; 64],
    size: u64,
    refs: u32,
}

#[derive(Default)]
pub struct Ipc {
    /// By handle, the mapping's address; by address, the mapping.
    by_handle: Mutex<HashMap<[u8; 64], u64>>,
    opened: Mutex<crate::IdMap<u64, Opened>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn handle_of(bytes: Vec<u8>) -> CudaResult<[u8; 64]> {
    bytes.try_into().map_err(|_| CudaError::UNKNOWN)
}

impl Client {
    pub fn ipc_get_mem_handle(&self, ptr: u64) -> CudaResult<[u8; 64]> {
        handle_of(self.call(req::IpcGetMemHandle { ptr })?.handle)
    }

    /// The address of another process's exported memory: mapped on first open, a counted
    /// reference after.
    pub fn ipc_open_mem_handle(&self, handle: [u8; 64], flags: u32) -> CudaResult<u64> {
        // One open at a time: two threads opening the same handle get one mapping.
        let mut by_handle = lock(&self.ipc.by_handle);
        if let Some(ptr) = by_handle.get(&handle)
            && let Some(opened) = lock(&self.ipc.opened).get_mut(ptr)
        {
            opened.refs += 1;
            return Ok(*ptr);
        }
        let reply = self.call(req::IpcOpenMemHandle { handle: handle.to_vec(), flags })?;
        self.add_device_range(reply.ptr, reply.size, false);
        by_handle.insert(handle, reply.ptr);
        lock(&self.ipc.opened).insert(reply.ptr, Opened { handle, size: reply.size, refs: 1 });
        Ok(reply.ptr)
    }

    /// Drops a reference; the last one unmaps the memory.
    pub fn ipc_close_mem_handle(&self, ptr: u64) -> CudaResult<()> {
        let mut by_handle = lock(&self.ipc.by_handle);
        let handle = {
            let mut opened = lock(&self.ipc.opened);
            let entry = opened.get_mut(&ptr).ok_or(CudaError::INVALID_VALUE)?;
            entry.refs -= 1;
            if entry.refs > 0 {
                return Ok(());
            }
            let handle = entry.handle;
            opened.remove(&ptr);
            handle
        };
        by_handle.remove(&handle);
        self.ranges.remove_variable(ptr);
        self.call(req::IpcCloseMemHandle { ptr }).map(drop)
    }

    /// The size of a mapping this process opened (for pointer queries).
    pub fn ipc_mapping_size(&self, ptr: u64) -> Option<u64> {
        lock(&self.ipc.opened).get(&ptr).map(|opened| opened.size)
    }

    pub fn ipc_get_event_handle(&self, event: u64) -> CudaResult<[u8; 64]> {
        handle_of(self.call(req::IpcGetEventHandle { event })?.handle)
    }

    /// Another process's interprocess event, as a new event id of this process.
    pub fn ipc_open_event_handle(&self, handle: [u8; 64]) -> CudaResult<u64> {
        let event = self.new_event_id();
        self.call(req::IpcOpenEventHandle { handle: handle.to_vec(), event })?;
        // Interprocess events are untimed (cudaEventInterprocess | cudaEventDisableTiming).
        lock(&self.events).insert(event, 0x6);
        Ok(event)
    }

    /// Forgets every mapping (after a device reset closed them).
    pub fn forget_ipc(&self) {
        lock(&self.ipc.by_handle).clear();
        for (ptr, _) in lock(&self.ipc.opened).drain() {
            self.ranges.remove_variable(ptr);
        }
    }
}
