//! The session's side of paging (`crate::paging`, `docs/design/paging.md`): each request passes
//! the pager's gate, which pages the session in first when it is out; after it, the pager learns
//! the session's allocations and whether anything holds it on the device.

use std::sync::Arc;

use super::Session;
use crate::backend::Device;
use crate::memory::RangeKind;
use crate::paging::{Gate, Pager};

/// Ops that run often and change nothing paging looks at: the blockers are not looked for again
/// after them (allocations are, by the range map's version, after every op).
fn leaves_blockers_as_they_were(op: &str) -> bool {
    matches!(
        op,
        "Launch"
            | "MemcpyHtoD"
            | "MemcpyDtoH"
            | "MemcpyDtoD"
            | "Memset"
            | "GraphLaunch"
            | "EventRecord"
            | "EventQuery"
            | "EventSynchronize"
            | "StreamQuery"
            | "StreamSynchronize"
            | "StreamWaitEvent"
            | "DeviceSynchronize"
    )
}

impl<D: Device> Session<D> {
    /// Turns paging on for this session (the server oversubscribes its GPU share).
    pub fn set_pager(&mut self, pager: Arc<Pager>) {
        self.pager = Some(pager);
    }

    /// Why the session's memory cannot be paged out, if anything holds it: what holds a move
    /// (IPC exports, shared files, a capture under way, graph memory...). Memory other than
    /// `cuMemAlloc`'s is refused by the pager itself (it compares the quota's count).
    fn page_blocker(&self) -> Option<String> {
        self.move_blocker()
    }

    /// Tells the pager what the request `op` changed.
    pub(super) fn after_request(&self, gate: &mut Gate, op: &str) {
        gate.set_allocations(self.ranges.version(), || self.ranges.of_kind(RangeKind::Allocation));
        if !leaves_blockers_as_they_were(op) {
            gate.set_blocker(self.page_blocker());
        }
    }
}
