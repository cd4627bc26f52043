//! Each session's device memory: a range map that validates every copy and memset range (a bad
//! pointer is `cudaErrorInvalidValue`, never a device fault) and counts usage against the quota.

use std::collections::BTreeMap;

use flyt_protocol::{CudaError, error::CudaResult};

/// What a range is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangeKind {
    /// From `cudaMalloc`: freeable, counted against the quota.
    Allocation,
    /// A module's `__device__`/`__constant__` variable: copyable, never freed by the app.
    Variable,
    /// Physical memory mapped into a reserved range (`cuMemMap`): copyable until unmapped.
    Mapping,
    /// Memory another session exported, opened with `cuIpcOpenMemHandle` (copyable until
    /// closed) or imported from its pool with `cuMemPoolImportPointer` (until freed): never
    /// freed as an allocation, not in this session's quota.
    Imported,
    /// A memory allocation node's memory: copyable while its graph lives, counted against the
    /// quota until then, never freed with `cuMemFree` here.
    GraphMemory,
}

#[derive(Clone, Copy, Debug)]
struct Range {
    len: u64,
    kind: RangeKind,
}

/// The device ranges a session may touch.
#[derive(Debug, Default)]
pub struct RangeMap {
    ranges: BTreeMap<u64, Range>,
    allocated: u64,
    /// Counts changes, so a reader can tell that the ranges changed since it last looked.
    version: u64,
}

impl RangeMap {
    /// Records a new range. Overlaps would mean the driver handed out the same memory twice.
    pub fn insert(&mut self, start: u64, len: u64, kind: RangeKind) {
        if kind == RangeKind::Allocation {
            self.allocated += len;
        }
        self.version += 1;
        self.ranges.insert(start, Range { len, kind });
    }

    /// Removes an allocation that starts exactly at `start`; anything else is
    /// `cudaErrorInvalidValue`, as `cudaFree` of a pointer into the middle of a block is.
    pub fn remove_allocation(&mut self, start: u64) -> CudaResult<u64> {
        match self.ranges.get(&start) {
            Some(range) if range.kind == RangeKind::Allocation => {
                let len = range.len;
                self.ranges.remove(&start);
                self.allocated -= len;
                self.version += 1;
                Ok(len)
            }
            _ => Err(CudaError::INVALID_VALUE),
        }
    }

    /// Removes every range of `kind` starting in `[start, start + len)` (a module's variables).
    pub fn remove_within(&mut self, start: u64, len: u64, kind: RangeKind) {
        let doomed: Vec<u64> =
            self.ranges.range(start..start.saturating_add(len)).filter(|(_, range)| range.kind == kind).map(|(begin, _)| *begin).collect();
        for begin in doomed {
            self.remove_exact(begin);
        }
    }

    fn remove_exact(&mut self, start: u64) {
        self.version += 1;
        if let Some(range) = self.ranges.remove(&start)
            && range.kind == RangeKind::Allocation
        {
            self.allocated -= range.len;
        }
    }

    /// Checks that `[ptr, ptr + len)` lies inside one known range, or a run of adjacent mappings
    /// (physical allocations mapped back to back are one range to the device). A zero-length
    /// range is valid anywhere, as CUDA treats zero-byte copies as no-ops.
    /// The kind of the range holding `ptr`.
    pub fn kind_at(&self, ptr: u64) -> Option<RangeKind> {
        self.ranges.range(..=ptr).next_back().filter(|(start, range)| ptr - **start < range.len).map(|(_, range)| range.kind)
    }

    pub fn check(&self, ptr: u64, len: u64) -> CudaResult<()> {
        if len == 0 {
            return Ok(());
        }
        let last = ptr.checked_add(len).ok_or(CudaError::INVALID_VALUE)?;
        let Some((start, range)) = self.ranges.range(..=ptr).next_back() else {
            return Err(CudaError::INVALID_VALUE);
        };
        let mut end = start.checked_add(range.len).ok_or(CudaError::INVALID_VALUE)?;
        if end <= ptr {
            return Err(CudaError::INVALID_VALUE);
        }
        if range.kind == RangeKind::Mapping && end < last {
            for (next, range) in self.ranges.range(end..last) {
                if *next != end || range.kind != RangeKind::Mapping {
                    break;
                }
                end = next.saturating_add(range.len);
            }
        }
        if last <= end { Ok(()) } else { Err(CudaError::INVALID_VALUE) }
    }

    /// Changes so far (any insert or removal makes it grow).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Bytes held by allocations.
    pub fn allocated(&self) -> u64 {
        self.allocated
    }

    /// Every allocation's start, for freeing them all.
    pub fn allocations(&self) -> Vec<u64> {
        self.ranges.iter().filter(|(_, range)| range.kind == RangeKind::Allocation).map(|(start, _)| *start).collect()
    }

    /// Every range of `kind`: (start, length), in address order.
    pub fn of_kind(&self, kind: RangeKind) -> Vec<(u64, u64)> {
        self.ranges.iter().filter(|(_, range)| range.kind == kind).map(|(start, range)| (*start, range.len)).collect()
    }

    /// Forgets all allocations (after the device freed them).
    pub fn clear_allocations(&mut self) {
        self.ranges.retain(|_, range| range.kind != RangeKind::Allocation);
        self.allocated = 0;
        self.version += 1;
    }
}

/// Module variables of a moved session that live at other addresses than the app knows them
/// by: a fresh worker's driver places a module's variables where it likes, while the app (its
/// runtime caches every symbol's address) keeps using the old ones. Copies and memsets that
/// name a variable by its old address, and kernel arguments that hold one, are sent to the new
/// one; the old addresses stay reserved, so no allocation can take them.
#[derive(Debug, Default)]
pub struct MovedVariables {
    /// App address -> (length, address here).
    by_app_address: BTreeMap<u64, (u64, u64)>,
}

impl MovedVariables {
    pub fn insert(&mut self, app_address: u64, len: u64, here: u64) {
        if app_address != here {
            self.by_app_address.insert(app_address, (len, here));
        }
    }

    pub fn is_empty(&self) -> bool {
        self.by_app_address.is_empty()
    }

    /// Where `ptr`, as the app knows it, lies on this device.
    pub fn here(&self, ptr: u64) -> u64 {
        if self.by_app_address.is_empty() {
            return ptr;
        }
        match self.by_app_address.range(..=ptr).next_back() {
            Some((start, (len, here))) if ptr - start < *len => here + (ptr - start),
            _ => ptr,
        }
    }

    /// The app's address of a variable that lives at `here`, when it moved.
    pub fn app_address(&self, here: u64) -> Option<u64> {
        self.by_app_address.iter().find(|(_, (_, at))| *at == here).map(|(app, _)| *app)
    }

    /// Forgets the variable the app knows at `app_address` (its module is gone).
    pub fn remove(&mut self, app_address: u64) {
        self.by_app_address.remove(&app_address);
    }

    pub fn clear(&mut self) {
        self.by_app_address.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_checked_inside_one_block() {
        let mut map = RangeMap::default();
        map.insert(0x1000, 0x100, RangeKind::Allocation);
        map.insert(0x1100, 0x100, RangeKind::Allocation);
        assert_eq!(map.check(0x1000, 0x100), Ok(()));
        assert_eq!(map.check(0x10ff, 1), Ok(()));
        // Adjacent blocks are still two blocks: a copy may not span them.
        assert_eq!(map.check(0x10ff, 2), Err(CudaError::INVALID_VALUE));
        assert_eq!(map.check(0xfff, 1), Err(CudaError::INVALID_VALUE));
        assert_eq!(map.check(0x1100, 0x101), Err(CudaError::INVALID_VALUE));
        assert_eq!(map.check(u64::MAX, 2), Err(CudaError::INVALID_VALUE));
        assert_eq!(map.check(0xdead, 0), Ok(()));
    }

    /// Physical allocations mapped back to back are one range; a gap, or an allocation next to
    /// a mapping, ends it.
    #[test]
    fn adjacent_mappings_are_one_range() {
        let mut map = RangeMap::default();
        map.insert(0x1000, 0x100, RangeKind::Mapping);
        map.insert(0x1100, 0x100, RangeKind::Mapping);
        map.insert(0x1200, 0x100, RangeKind::Allocation);
        map.insert(0x1400, 0x100, RangeKind::Mapping);
        assert_eq!(map.check(0x1000, 0x200), Ok(()));
        assert_eq!(map.check(0x10f0, 0x20), Ok(()));
        assert_eq!(map.check(0x1010, 0x10), Ok(()));
        assert_eq!(map.check(0x1100, 0x101), Err(CudaError::INVALID_VALUE));
        assert_eq!(map.check(0x1000, 0x500), Err(CudaError::INVALID_VALUE));
        assert_eq!(map.check(0x1300, 0x10), Err(CudaError::INVALID_VALUE));
    }

    #[test]
    fn only_exact_allocation_starts_are_freed() {
        let mut map = RangeMap::default();
        map.insert(0x1000, 0x100, RangeKind::Allocation);
        map.insert(0x9000, 0x10, RangeKind::Variable);
        assert_eq!(map.allocated(), 0x100);
        assert_eq!(map.remove_allocation(0x1001), Err(CudaError::INVALID_VALUE));
        assert_eq!(map.remove_allocation(0x9000), Err(CudaError::INVALID_VALUE));
        assert_eq!(map.remove_allocation(0x1000), Ok(0x100));
        assert_eq!(map.allocated(), 0);
        assert_eq!(map.check(0x1000, 1), Err(CudaError::INVALID_VALUE));
        assert_eq!(map.check(0x9000, 0x10), Ok(()));
        map.remove_within(0x9000, 0x100, RangeKind::Variable);
        assert_eq!(map.check(0x9000, 1), Err(CudaError::INVALID_VALUE));
    }

    #[test]
    fn moved_variables_send_old_addresses_to_new_ones() {
        let mut moved = MovedVariables::default();
        assert_eq!(moved.here(0x1000), 0x1000);
        moved.insert(0x7f00_0000_0000, 256, 0x7e00_0000_0100);
        moved.insert(0x5000, 16, 0x5000);
        assert_eq!(moved.here(0x7f00_0000_0000), 0x7e00_0000_0100);
        assert_eq!(moved.here(0x7f00_0000_00ff), 0x7e00_0000_01ff);
        assert_eq!(moved.here(0x7f00_0000_0100), 0x7f00_0000_0100, "past the variable");
        assert_eq!(moved.here(0x5008), 0x5008, "a variable that stayed is not translated");
        assert_eq!(moved.app_address(0x7e00_0000_0100), Some(0x7f00_0000_0000));
        moved.remove(0x7f00_0000_0000);
        assert!(moved.is_empty());
    }
}
