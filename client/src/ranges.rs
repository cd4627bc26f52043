//! The device ranges a process may copy to or from: its allocations (freeable) and the module
//! variables the server reported (not freeable). Pointers are checked here before anything is
//! sent, so a bad pointer is an error at the call, never a device fault, and a copy's direction
//! can be told from its pointers (unified addressing).

use std::collections::BTreeMap;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;

/// One range: its length, whether the app may free it (an allocation) or not (a module
/// variable), and its buffer id.
#[derive(Clone, Copy)]
struct Range {
    len: u64,
    freeable: bool,
    /// Physical memory mapped into a reserved range (`cuMemMap`): adjacent mappings are one range.
    mapped: bool,
    id: u64,
}

/// Buffer ids, unique in the process (`CU_POINTER_ATTRIBUTE_BUFFER_ID`): an address reused by a
/// later allocation gets a new one.
static NEXT_BUFFER_ID: AtomicU64 = AtomicU64::new(1);

/// A buffer id no other allocation of the process had.
pub fn new_buffer_id() -> u64 {
    NEXT_BUFFER_ID.fetch_add(1, Ordering::Relaxed)
}

fn range(len: u64, freeable: bool) -> Range {
    Range { len, freeable, mapped: false, id: new_buffer_id() }
}

/// Start address to its range.
#[derive(Default)]
pub struct DeviceRanges(RwLock<BTreeMap<u64, Range>>);

impl DeviceRanges {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<u64, Range>> {
        self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<u64, Range>> {
        self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records a device allocation (or a module variable when `!freeable`).
    pub fn add(&self, start: u64, len: u64, freeable: bool) {
        self.write().insert(start, range(len, freeable));
    }

    /// Records module variables as `(address, size)`.
    pub fn add_variables(&self, variables: impl Iterator<Item = (u64, u64)>) {
        let mut ranges = self.write();
        for (start, len) in variables {
            ranges.insert(start, range(len, false));
        }
    }

    /// Records physical memory mapped at `start` (`cuMemMap`).
    pub fn add_mapping(&self, start: u64, len: u64) {
        self.write().insert(start, Range { mapped: true, ..range(len, false) });
    }

    /// Forgets the mappings inside `[start, start + len)` (`cuMemUnmap`).
    pub fn remove_mappings(&self, start: u64, len: u64) {
        self.write().retain(|begin, range| !(range.mapped && *begin >= start && *begin < start.saturating_add(len)));
    }

    /// Forgets a module variable at `start` (its module was unloaded).
    pub fn remove_variable(&self, start: u64) {
        let mut ranges = self.write();
        if ranges.get(&start).is_some_and(|range| !range.freeable) {
            ranges.remove(&start);
        }
    }

    /// Forgets an allocation that starts exactly at `start`; anything else is CUDA's invalid value.
    pub fn remove_allocation(&self, start: u64) -> CudaResult<()> {
        let mut ranges = self.write();
        match ranges.get(&start) {
            Some(range) if range.freeable => {
                ranges.remove(&start);
                Ok(())
            }
            _ => Err(CudaError::INVALID_VALUE),
        }
    }

    /// Forgets every allocation and mapping (a device reset), keeping module variables.
    pub fn forget_allocations(&self) {
        self.write().retain(|_, range| !range.freeable && !range.mapped);
    }

    /// Bytes of device memory the process's allocations hold.
    pub fn allocated_bytes(&self) -> u64 {
        self.read().values().filter(|range| range.freeable).map(|range| range.len).sum()
    }

    /// The range holding `ptr`, with its start.
    fn holding(&self, ptr: u64) -> Option<(u64, Range)> {
        let ranges = self.read();
        let (start, range) = ranges.range(..=ptr).next_back()?;
        (ptr - start < range.len).then_some((*start, *range))
    }

    /// The range holding `ptr`, as `(start, len)`.
    pub fn find(&self, ptr: u64) -> Option<(u64, u64)> {
        self.holding(ptr).map(|(start, range)| (start, range.len))
    }

    /// The buffer id of the range holding `ptr`.
    pub fn buffer_id(&self, ptr: u64) -> Option<u64> {
        self.holding(ptr).map(|(_, range)| range.id)
    }

    /// Checks that `[ptr, ptr + len)` lies inside one range, or a run of adjacent mappings.
    pub fn check(&self, ptr: u64, len: u64) -> CudaResult<()> {
        if len == 0 {
            return Ok(());
        }
        let last = ptr.checked_add(len).ok_or(CudaError::INVALID_VALUE)?;
        let (start, range) = self.holding(ptr).ok_or(CudaError::INVALID_VALUE)?;
        let mut end = start + range.len;
        if range.mapped && end < last {
            for (next, range) in self.read().range(end..last) {
                if *next != end || !range.mapped {
                    break;
                }
                end = next.saturating_add(range.len);
            }
        }
        if last <= end { Ok(()) } else { Err(CudaError::INVALID_VALUE) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_find_check_and_free() {
        let ranges = DeviceRanges::default();
        ranges.add(0x1000, 0x100, true);
        ranges.add_variables([(0x2000, 8)].into_iter());
        assert_eq!(ranges.find(0x10ff), Some((0x1000, 0x100)));
        assert_eq!(ranges.find(0x1100), None);
        assert!(ranges.check(0x1080, 0x80).is_ok());
        assert_eq!(ranges.check(0x1080, 0x81), Err(CudaError::INVALID_VALUE));
        assert_eq!(ranges.remove_allocation(0x1010), Err(CudaError::INVALID_VALUE));
        assert_eq!(ranges.remove_allocation(0x2000), Err(CudaError::INVALID_VALUE), "a variable is not freeable");
        ranges.add(0x3000, 16, true);
        ranges.forget_allocations();
        assert_eq!(ranges.find(0x1000), None);
        assert_eq!(ranges.find(0x3000), None);
        assert_eq!(ranges.find(0x2004), Some((0x2000, 8)));
        let first = ranges.buffer_id(0x2004);
        ranges.remove_variable(0x2000);
        ranges.add_variables([(0x2000, 8)].into_iter());
        assert!(
            first.is_some() && ranges.buffer_id(0x2000).is_some() && ranges.buffer_id(0x2000) != first,
            "a reused address gets a new id"
        );
        assert_eq!(ranges.buffer_id(0x2008), None);
    }
}
