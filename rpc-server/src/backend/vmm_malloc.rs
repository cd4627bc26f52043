//! A session's `cuMemAlloc` memory while the server pages (`--oversubscribe`,
//! `docs/design/paging.md`): the worker makes it itself, as virtual memory in addresses it
//! reserves, so a page-out releases only the physical memory and keeps the addresses, and a
//! page-in maps new memory there. (Memory from the driver's `cuMemAlloc` cannot do that: its
//! allocator keeps the addresses of what `cuMemFree` returns, so they could not be reserved
//! again and the app's pointers would have nowhere to come back to.)
//!
//! An allocation of a page (the allocation granularity) or more has a reservation of whole pages
//! to itself. Smaller ones are packed into shared one-page spans, as the driver packs them, each
//! span freed with its last allocation (freed room in a span is used again). Every span is one
//! physical allocation, mapped whole or not at all, so what is mapped is always known, also after
//! a page-out or page-in that failed part way.
//!
//! Backend-neutral: the CUDA backend and the emulated device give the primitives (`VmmDriver`).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use flyt_protocol::CudaError;

/// Packed allocations start this far apart (what `cuMemAlloc` aligns to).
pub(super) const PIECE_ALIGNMENT: u64 = 512;

/// What a backend does for this memory: reserve addresses, map new physical memory there
/// accessible to the session's GPUs, unmap it.
pub(super) trait VmmDriver {
    /// The granularity of physical allocations: spans and reservations are whole pages.
    fn page(&self) -> u64;
    /// The GPU new memory is made on (the current one).
    fn device(&self) -> usize;
    /// Reserves `len` bytes of addresses (whole pages) anywhere: their start.
    fn reserve(&mut self, len: u64) -> Result<u64, CudaError>;
    /// Frees a reservation made by `reserve`, with nothing mapped in it.
    fn free_reservation(&mut self, start: u64, len: u64) -> Result<(), CudaError>;
    /// New physical memory of `len` bytes mapped at `start` (nothing mapped there), accessible
    /// to the session's GPUs: its handle. On `Err` nothing of it stays.
    fn map_new(&mut self, start: u64, len: u64) -> Result<u64, CudaError>;
    /// Unmaps the memory mapped at `start` and releases it. `Err`: it is still mapped.
    fn unmap(&mut self, start: u64, len: u64, handle: u64) -> Result<(), CudaError>;
}

/// One reservation of this memory and the physical memory over it.
struct Span {
    len: u64,
    /// The GPU its physical memory is made on.
    device: usize,
    /// Physical memory mapped over the whole span; `None` while paged out.
    handle: Option<u64>,
    /// Allocations in it, by offset: their lengths (packed ones rounded to `PIECE_ALIGNMENT`).
    live: BTreeMap<u64, u64>,
    /// Packed spans: the room not in use, by offset. `None`: the span of one large allocation.
    room: Option<BTreeMap<u64, u64>>,
}

/// Allocations (start, length).
pub(super) type Allocations = Vec<(u64, u64)>;

/// Where an allocation of this memory lives: its span and the physical memory over it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SpanInfo {
    pub start: u64,
    pub len: u64,
    /// `None` while paged out.
    pub handle: Option<u64>,
}

/// What a page-out did: whether any memory was released, and what was not (still mapped).
#[derive(Debug, Default)]
pub(super) struct PagedOut {
    pub released: bool,
    pub failed: Vec<String>,
}

/// The session's allocations made here.
#[derive(Default)]
pub(super) struct OwnMemory {
    spans: BTreeMap<u64, Span>,
    /// Each allocation's span.
    span_of: HashMap<u64, u64>,
}

/// The first room of `room` that holds `len` bytes, taken out of it: its offset.
fn take_room(room: &mut BTreeMap<u64, u64>, len: u64) -> Option<u64> {
    let (&offset, &free) = room.iter().find(|(_, free)| **free >= len)?;
    room.remove(&offset);
    if free > len {
        room.insert(offset + len, free - len);
    }
    Some(offset)
}

/// Gives `offset..offset + len` back to `room`, joined with the room either side.
fn give_room(room: &mut BTreeMap<u64, u64>, offset: u64, len: u64) {
    let (mut start, mut end) = (offset, offset + len);
    if let Some((&before, &before_len)) = room.range(..offset).next_back()
        && before + before_len == offset
    {
        room.remove(&before);
        start = before;
    }
    if let Some(after_len) = room.remove(&end) {
        end += after_len;
    }
    room.insert(start, end - start);
}

impl OwnMemory {
    /// A new allocation of `size` bytes (not 0): packed into a span with room when smaller than a
    /// page, else in a reservation of its own.
    pub(super) fn allocate(&mut self, driver: &mut impl VmmDriver, size: u64) -> Result<u64, CudaError> {
        let page = driver.page();
        let piece = size.max(1).checked_next_multiple_of(PIECE_ALIGNMENT).ok_or(CudaError::MEMORY_ALLOCATION)?;
        if piece < page {
            if let Some(ptr) = self.pack(piece, driver.device()) {
                return Ok(ptr);
            }
            let start = self.new_span(driver, page, BTreeMap::new(), Some(BTreeMap::from([(0, page)])))?;
            return self.pack(piece, driver.device()).filter(|ptr| *ptr == start).ok_or(CudaError::UNKNOWN);
        }
        let len = size.checked_next_multiple_of(page).ok_or(CudaError::MEMORY_ALLOCATION)?;
        let start = self.new_span(driver, len, BTreeMap::from([(0, len)]), None)?;
        self.span_of.insert(start, start);
        Ok(start)
    }

    /// `len` bytes in the first mapped packed span of `device` with room for them.
    fn pack(&mut self, len: u64, device: usize) -> Option<u64> {
        let (start, offset) = self.spans.iter_mut().find_map(|(start, span)| {
            let room = span.room.as_mut().filter(|_| span.handle.is_some() && span.device == device)?;
            let offset = take_room(room, len)?;
            span.live.insert(offset, len);
            Some((*start, offset))
        })?;
        self.span_of.insert(start + offset, start);
        Some(start + offset)
    }

    /// Reserves and maps a span of `len` bytes.
    fn new_span(
        &mut self,
        driver: &mut impl VmmDriver,
        len: u64,
        live: BTreeMap<u64, u64>,
        room: Option<BTreeMap<u64, u64>>,
    ) -> Result<u64, CudaError> {
        let start = driver.reserve(len)?;
        match driver.map_new(start, len) {
            Ok(handle) => {
                self.spans.insert(start, Span { len, device: driver.device(), handle: Some(handle), live, room });
                Ok(start)
            }
            Err(error) => {
                let _ = driver.free_reservation(start, len);
                Err(error)
            }
        }
    }

    /// Frees allocation `ptr` (the caller waited for the device, as `cuMemFree` does): its span
    /// goes with its last allocation. `None` when `ptr` is no allocation of this memory.
    pub(super) fn free(&mut self, driver: &mut impl VmmDriver, ptr: u64) -> Option<Result<(), CudaError>> {
        let start = self.span_of.remove(&ptr)?;
        let span = self.spans.get_mut(&start)?;
        let offset = ptr - start;
        let len = span.live.remove(&offset).unwrap_or(0);
        if !span.live.is_empty() {
            if let Some(room) = &mut span.room {
                give_room(room, offset, len);
            }
            return Some(Ok(()));
        }
        let span = self.spans.remove(&start)?;
        if let Some(handle) = span.handle
            && let Err(error) = driver.unmap(start, span.len, handle)
        {
            // Still mapped: its addresses stay reserved (leaked, as the error says).
            return Some(Err(error));
        }
        Some(driver.free_reservation(start, span.len))
    }

    /// Whether `ptr` is the start of an allocation of this memory.
    pub(super) fn contains(&self, ptr: u64) -> bool {
        self.span_of.contains_key(&ptr)
    }

    /// Whether `ptr` lies in a span of this memory (any byte of it).
    pub(super) fn holds(&self, ptr: u64) -> bool {
        self.spans.range(..=ptr).next_back().is_some_and(|(start, span)| ptr - start < span.len)
    }

    /// The span of allocation `ptr`.
    pub(super) fn span_of(&self, ptr: u64) -> Option<SpanInfo> {
        let start = *self.span_of.get(&ptr)?;
        self.spans.get(&start).map(|span| SpanInfo { start, len: span.len, handle: span.handle })
    }

    /// The spans of `allocations` (all of this memory), each once, in address order.
    fn spans_of(&self, allocations: &[(u64, u64)]) -> Result<BTreeSet<u64>, String> {
        allocations
            .iter()
            .map(|(ptr, _)| self.span_of.get(ptr).copied().ok_or_else(|| format!("{ptr:#x} is not memory of this worker's")))
            .collect()
    }

    /// `allocations` split into those of this memory, grouped by span in address order (a
    /// page-in maps each group's span once, so a group's copies may run while the next is
    /// mapped), and the others.
    pub(super) fn groups(&self, allocations: &[(u64, u64)]) -> (Vec<Allocations>, Allocations) {
        let mut by_span: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
        let mut others = Vec::new();
        for &(ptr, len) in allocations {
            match self.span_of.get(&ptr) {
                Some(start) => by_span.entry(*start).or_default().push((ptr, len)),
                None => others.push((ptr, len)),
            }
        }
        (by_span.into_values().collect(), others)
    }

    /// A page-out (bytes saved, device idle): releases the physical memory of the spans of
    /// `allocations` (all of this memory), the addresses staying reserved. A span holding an
    /// allocation not listed stays, and so does one the driver would not unmap: `failed` says
    /// which, and they stay recorded as mapped.
    pub(super) fn page_out(&mut self, driver: &mut impl VmmDriver, allocations: &[(u64, u64)]) -> PagedOut {
        let mut outcome = PagedOut::default();
        let starts = match self.spans_of(allocations) {
            Ok(starts) => starts,
            Err(reason) => {
                outcome.failed.push(reason);
                return outcome;
            }
        };
        let listed: HashSet<u64> = allocations.iter().map(|(ptr, _)| *ptr).collect();
        for start in starts {
            let Some(span) = self.spans.get_mut(&start) else { continue };
            // Out already (a page-out that failed part way, then this one).
            let Some(handle) = span.handle else { continue };
            if let Some(offset) = span.live.keys().find(|offset| !listed.contains(&(start + **offset))) {
                outcome.failed.push(format!("the memory at {start:#x} also holds {:#x}, which is not paged out", start + offset));
                continue;
            }
            match driver.unmap(start, span.len, handle) {
                Ok(()) => {
                    span.handle = None;
                    outcome.released = true;
                }
                Err(error) => outcome.failed.push(format!("releasing {} bytes at {start:#x}: {error}", span.len)),
            }
        }
        outcome
    }

    /// A page-in: maps new physical memory over the spans of `allocations` (all of this memory)
    /// that are out, at their addresses, on the GPU each was made on (`driver`'s: a session of
    /// several GPUs is never paged). On `Err` nothing this call mapped stays mapped (a later try
    /// maps the same spans); spans mapped before it (a page-out that failed part way) stay.
    pub(super) fn page_in(&mut self, driver: &mut impl VmmDriver, allocations: &[(u64, u64)]) -> Result<(), String> {
        let mut mapped_now = Vec::new();
        for start in self.spans_of(allocations)? {
            let Some(span) = self.spans.get_mut(&start) else { continue };
            if span.handle.is_some() {
                continue;
            }
            let mapped = if span.device == driver.device() { driver.map_new(start, span.len) } else { Err(CudaError::INVALID_DEVICE) };
            match mapped {
                Ok(handle) => {
                    span.handle = Some(handle);
                    mapped_now.push(start);
                }
                Err(error) => {
                    let len = span.len;
                    for start in mapped_now {
                        if let Some(span) = self.spans.get_mut(&start)
                            && let Some(handle) = span.handle
                            && driver.unmap(start, span.len, handle).is_ok()
                        {
                            span.handle = None;
                        }
                    }
                    return Err(format!("{len} bytes of device memory mapped at {start:#x}: {error}"));
                }
            }
        }
        Ok(())
    }

    /// Bytes reserved and bytes mapped (whole spans).
    pub(super) fn bytes(&self) -> (u64, u64) {
        let reserved = self.spans.values().map(|span| span.len).sum();
        let mapped = self.spans.values().filter(|span| span.handle.is_some()).map(|span| span.len).sum();
        (reserved, mapped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = 2 << 20;

    /// A driver that checks every call against what it reserved and mapped, and fails the calls
    /// a test tells it to.
    #[derive(Default)]
    struct FakeDriver {
        next: u64,
        reservations: BTreeMap<u64, u64>,
        /// Mapped spans: length and handle.
        mappings: BTreeMap<u64, (u64, u64)>,
        handles: u64,
        /// Fail the map that many maps from now (0: the next one).
        fail_map_in: Option<usize>,
        /// Refuse to unmap at these addresses.
        stuck: HashSet<u64>,
        /// The current GPU.
        device: usize,
    }

    impl FakeDriver {
        fn new() -> Self {
            Self { next: 0x7f00_0000_0000, ..Self::default() }
        }

        fn reserved(&self, start: u64, len: u64) -> bool {
            self.reservations.range(..=start).next_back().is_some_and(|(from, reserved)| start + len <= from + reserved)
        }
    }

    impl VmmDriver for FakeDriver {
        fn page(&self) -> u64 {
            PAGE
        }

        fn device(&self) -> usize {
            self.device
        }

        fn reserve(&mut self, len: u64) -> Result<u64, CudaError> {
            assert!(len > 0 && len.is_multiple_of(PAGE), "{len} is not whole pages");
            // Leave a page between reservations: adjacent ones would hide a span that ran over.
            let start = self.next;
            self.next += len + PAGE;
            self.reservations.insert(start, len);
            Ok(start)
        }

        fn free_reservation(&mut self, start: u64, len: u64) -> Result<(), CudaError> {
            assert_eq!(self.reservations.remove(&start), Some(len), "freeing {start:#x}");
            assert!(self.mappings.range(start..start + len).next().is_none(), "freeing {start:#x} with memory mapped");
            Ok(())
        }

        fn map_new(&mut self, start: u64, len: u64) -> Result<u64, CudaError> {
            assert!(self.reserved(start, len), "mapping {start:#x} outside a reservation");
            assert!(self.mappings.range(..start + len).next_back().is_none_or(|(at, (mapped, _))| at + mapped <= start), "mapped twice");
            if let Some(countdown) = self.fail_map_in.as_mut() {
                if *countdown == 0 {
                    self.fail_map_in = None;
                    return Err(CudaError::MEMORY_ALLOCATION);
                }
                *countdown -= 1;
            }
            self.handles += 1;
            self.mappings.insert(start, (len, self.handles));
            Ok(self.handles)
        }

        fn unmap(&mut self, start: u64, len: u64, handle: u64) -> Result<(), CudaError> {
            if self.stuck.contains(&start) {
                return Err(CudaError::UNKNOWN);
            }
            assert_eq!(self.mappings.remove(&start), Some((len, handle)), "unmapping {start:#x}");
            Ok(())
        }
    }

    #[test]
    fn small_allocations_share_a_page_and_its_room_is_used_again() {
        let (mut driver, mut memory) = (FakeDriver::new(), OwnMemory::default());
        let sizes = [4, 100, 512, 1000, 1 << 20];
        let ptrs: Vec<u64> = sizes.iter().map(|size| memory.allocate(&mut driver, *size).unwrap()).collect();
        assert_eq!(driver.reservations.len(), 1, "one page holds them all");
        let start = *driver.reservations.keys().next().unwrap();
        assert_eq!(ptrs, vec![start, start + 512, start + 1024, start + 1536, start + 2560]);
        // Freed room is used again, joined with its neighbours.
        memory.free(&mut driver, ptrs[1]).unwrap().unwrap();
        memory.free(&mut driver, ptrs[2]).unwrap().unwrap();
        assert_eq!(memory.allocate(&mut driver, 1024).unwrap(), start + 512);
        // Past the page's room, a second page.
        let big = memory.allocate(&mut driver, PAGE - 4096).unwrap();
        assert_eq!(driver.reservations.len(), 2);
        assert!(!(start..start + PAGE).contains(&big));
        assert!(memory.holds(start + 700) && memory.holds(big + PAGE - 1) && !memory.holds(start + PAGE));
        // The page goes with its last allocation, and its reservation with it.
        for ptr in [ptrs[0], ptrs[3], ptrs[4], start + 512] {
            assert!(driver.reservations.contains_key(&start));
            memory.free(&mut driver, ptr).unwrap().unwrap();
        }
        assert!(!driver.reservations.contains_key(&start) && !driver.mappings.contains_key(&start));
        assert_eq!(memory.free(&mut driver, ptrs[0]), None, "freed already: not this memory's");
        memory.free(&mut driver, big).unwrap().unwrap();
        assert_eq!(memory.bytes(), (0, 0));
        assert!(driver.reservations.is_empty() && driver.mappings.is_empty());
    }

    #[test]
    fn large_allocations_have_whole_pages_to_themselves() {
        let (mut driver, mut memory) = (FakeDriver::new(), OwnMemory::default());
        let one = memory.allocate(&mut driver, PAGE).unwrap();
        let three = memory.allocate(&mut driver, 2 * PAGE + 1).unwrap();
        assert_eq!(driver.reservations[&one], PAGE);
        assert_eq!(driver.reservations[&three], 3 * PAGE);
        assert_eq!(memory.span_of(three), Some(SpanInfo { start: three, len: 3 * PAGE, handle: Some(2) }));
        // A small one does not go into a large one's last page.
        let small = memory.allocate(&mut driver, 8).unwrap();
        assert_eq!(driver.reservations.len(), 3);
        for ptr in [one, three, small] {
            memory.free(&mut driver, ptr).unwrap().unwrap();
        }
        assert!(driver.reservations.is_empty());
    }

    #[test]
    fn a_malloc_free_loop_leaks_no_addresses() {
        let (mut driver, mut memory) = (FakeDriver::new(), OwnMemory::default());
        let mut live: Vec<u64> = Vec::new();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for round in 0..5000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let size = [4, 300, 4096, 100_000, PAGE - 1, PAGE, 3 * PAGE + 7][(state % 7) as usize];
            if live.len() < 40 || state.is_multiple_of(3) {
                live.push(memory.allocate(&mut driver, size).unwrap());
            } else {
                let ptr = live.swap_remove((state >> 8) as usize % live.len());
                memory.free(&mut driver, ptr).unwrap().unwrap();
            }
            let (reserved, mapped) = memory.bytes();
            assert_eq!(reserved, mapped);
            assert_eq!(reserved, driver.reservations.values().sum::<u64>(), "round {round}");
            // Every span holds an allocation: none is left behind empty.
            assert!(reserved <= live.len() as u64 * 4 * PAGE, "round {round}: {reserved} bytes reserved for {} allocations", live.len());
        }
        for ptr in live {
            memory.free(&mut driver, ptr).unwrap().unwrap();
        }
        assert!(driver.reservations.is_empty() && driver.mappings.is_empty());
    }

    /// Two pages of packed allocations and a large one.
    fn session(driver: &mut FakeDriver, memory: &mut OwnMemory) -> Vec<(u64, u64)> {
        let sizes = [64, PAGE - 1024, 3 * PAGE, 4096];
        sizes.iter().map(|size| (memory.allocate(driver, *size).unwrap(), *size)).collect()
    }

    #[test]
    fn a_page_out_keeps_the_addresses_and_a_page_in_maps_each_span_once() {
        let (mut driver, mut memory) = (FakeDriver::new(), OwnMemory::default());
        let allocations = session(&mut driver, &mut memory);
        let reservations = driver.reservations.clone();
        assert_eq!(reservations.len(), 3);
        let (groups, others) = memory.groups(&allocations);
        assert!(others.is_empty());
        // One group per span: the first page's two, the large one, the second page's.
        assert_eq!(groups, vec![vec![allocations[0], allocations[1]], vec![allocations[2]], vec![allocations[3]]]);
        let (mine, others) = memory.groups(&[allocations[2], (0x1000, 8)]);
        assert_eq!((mine, others), (vec![vec![allocations[2]]], vec![(0x1000, 8)]));
        for _ in 0..3 {
            let out = memory.page_out(&mut driver, &allocations);
            assert!(out.released && out.failed.is_empty(), "{out:?}");
            assert!(driver.mappings.is_empty(), "no physical memory left");
            assert_eq!(driver.reservations, reservations, "the addresses stay");
            assert_eq!(memory.bytes().1, 0);
            // No allocation goes into a paged-out page.
            let elsewhere = memory.allocate(&mut driver, 8).unwrap();
            assert!(!reservations.contains_key(&elsewhere));
            memory.free(&mut driver, elsewhere).unwrap().unwrap();
            for group in &groups {
                memory.page_in(&mut driver, group).unwrap();
            }
            assert_eq!(driver.mappings.keys().collect::<Vec<_>>(), reservations.keys().collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_page_in_that_fails_part_way_leaves_nothing_of_it_mapped() {
        let (mut driver, mut memory) = (FakeDriver::new(), OwnMemory::default());
        let allocations = session(&mut driver, &mut memory);
        memory.page_out(&mut driver, &allocations);
        driver.fail_map_in = Some(2);
        let refused = memory.page_in(&mut driver, &allocations).unwrap_err();
        assert!(refused.contains("device memory mapped at"), "{refused}");
        assert!(driver.mappings.is_empty(), "the spans it mapped were unmapped again");
        assert_eq!(memory.bytes().1, 0);
        memory.page_in(&mut driver, &allocations).unwrap();
        assert_eq!(driver.mappings.len(), 3);
        assert_eq!(memory.bytes().0, memory.bytes().1);
    }

    #[test]
    fn a_page_out_that_fails_part_way_knows_what_stays_mapped() {
        let (mut driver, mut memory) = (FakeDriver::new(), OwnMemory::default());
        let allocations = session(&mut driver, &mut memory);
        let large = allocations[2].0;
        driver.stuck.insert(large);
        let out = memory.page_out(&mut driver, &allocations);
        assert!(out.released);
        assert_eq!(out.failed.len(), 1, "{out:?}");
        assert!(out.failed[0].contains(&format!("{large:#x}")), "{out:?}");
        assert_eq!(memory.span_of(large).and_then(|span| span.handle), Some(driver.mappings[&large].1), "still mapped, and known so");
        assert_eq!(driver.mappings.len(), 1);
        // The page-in maps the others only (the fake driver refuses a second mapping).
        driver.stuck.clear();
        memory.page_in(&mut driver, &allocations).unwrap();
        assert_eq!(driver.mappings.len(), 3);
    }

    #[test]
    fn a_page_out_leaves_a_span_holding_an_allocation_not_listed() {
        let (mut driver, mut memory) = (FakeDriver::new(), OwnMemory::default());
        let allocations = session(&mut driver, &mut memory);
        let out = memory.page_out(&mut driver, &allocations[1..]);
        assert_eq!(out.failed.len(), 1, "{out:?}");
        assert!(out.failed[0].contains("not paged out"), "{out:?}");
        assert!(driver.mappings.contains_key(&allocations[0].0), "the first page keeps its memory");
        assert_eq!(driver.mappings.len(), 1);
        let unknown = memory.page_out(&mut driver, &[(0x1000, 8)]);
        assert!(!unknown.released && unknown.failed.len() == 1, "{unknown:?}");
    }

    #[test]
    fn a_paged_out_allocation_freed_gives_back_its_addresses() {
        let (mut driver, mut memory) = (FakeDriver::new(), OwnMemory::default());
        let allocations = session(&mut driver, &mut memory);
        memory.page_out(&mut driver, &allocations);
        for (ptr, _) in &allocations {
            memory.free(&mut driver, *ptr).unwrap().unwrap();
        }
        assert!(driver.reservations.is_empty() && driver.mappings.is_empty());
    }

    #[test]
    fn small_allocations_of_two_gpus_are_packed_apart() {
        let (mut driver, mut memory) = (FakeDriver::new(), OwnMemory::default());
        let first = memory.allocate(&mut driver, 64).unwrap();
        driver.device = 1;
        let second = memory.allocate(&mut driver, 64).unwrap();
        assert!(second.abs_diff(first) >= PAGE, "a page of the other GPU's");
        assert_eq!(memory.allocate(&mut driver, 64).unwrap(), second + 512);
        // A page-in maps memory only on the GPU a span was made on.
        memory.page_out(&mut driver, &[(first, 64)]);
        let refused = memory.page_in(&mut driver, &[(first, 64)]).unwrap_err();
        assert!(refused.contains(&format!("{first:#x}")), "{refused}");
        driver.device = 0;
        memory.page_in(&mut driver, &[(first, 64)]).unwrap();
    }
}
