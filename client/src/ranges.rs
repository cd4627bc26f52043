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
    /// Made by `cuMemAlloc` or `cuMemAllocPitch`: memory `cuIpcGetMemHandle` exports (pool
    /// allocations and mappings it refuses, as natively).
    legacy_ipc: bool,
    /// Another process's pool allocation, imported (`cuMemPoolImportPointer`): how many times
    /// (each import of one imported already is one more; each free drops one). 0: this
    /// process's own. Freeable here, held by its exporter.
    imports: u32,
    /// A pool allocation's pool (own or imported), for its pointer attributes.
    pool: Option<u64>,
    id: u64,
    /// The session device (the server's index) it was made on: the thread's when it was recorded.
    device: u32,
}

/// Buffer ids, unique in the process (`CU_POINTER_ATTRIBUTE_BUFFER_ID`): an address reused by a
/// later allocation gets a new one.
static NEXT_BUFFER_ID: AtomicU64 = AtomicU64::new(1);

/// A buffer id no other allocation of the process had.
pub fn new_buffer_id() -> u64 {
    NEXT_BUFFER_ID.fetch_add(1, Ordering::Relaxed)
}

fn range(len: u64, freeable: bool) -> Range {
    Range {
        len,
        freeable,
        mapped: false,
        legacy_ipc: false,
        imports: 0,
        pool: None,
        id: new_buffer_id(),
        device: crate::devices::thread_device(),
    }
}

/// Device addresses are the server's: nothing stops this process from mapping host memory at the
/// same numbers, and a host pointer that is also a device range's address would be taken for device
/// memory (a copy would go the wrong way, silently under `cudaMemcpyDefault`). So every device
/// range's 2 MiB chunks are reserved in this process (`PROT_NONE`, no memory behind them) while
/// the range lives: host memory can no longer land there, and a device range that lands on host
/// memory the process already has is seen (`claim` fails) and can be given back.
const CHUNK: u64 = 2 << 20;

#[derive(Default)]
struct Reservations {
    /// Chunk index to the number of live ranges in it.
    chunks: crate::IdMap<u64, u32>,
    /// This kernel treats `MAP_FIXED_NOREPLACE` as a hint (before Linux 4.17): nothing is reserved.
    unsupported: bool,
}

/// The outcome of reserving one run of chunks.
enum Reserved {
    Done,
    /// Something of this process's is mapped there.
    Taken,
    /// The address cannot be mapped here at all (outside this process's address space): no host
    /// memory can be there either.
    Impossible,
    /// The kernel ignores `MAP_FIXED_NOREPLACE`.
    Unsupported,
}

fn reserve(start: u64, len: u64) -> Reserved {
    let (Ok(addr), Ok(size)) = (usize::try_from(start), usize::try_from(len)) else { return Reserved::Impossible };
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED_NOREPLACE;
    // SAFETY: a fresh anonymous mapping with no access; MAP_FIXED_NOREPLACE never replaces an
    // existing mapping (it fails with EEXIST instead).
    let got = unsafe { libc::mmap(addr as *mut libc::c_void, size, libc::PROT_NONE, flags, -1, 0) };
    if got == libc::MAP_FAILED {
        return if std::io::Error::last_os_error().raw_os_error() == Some(libc::EEXIST) { Reserved::Taken } else { Reserved::Impossible };
    }
    if got as usize != addr {
        // SAFETY: the mapping the kernel just made elsewhere, ours alone.
        unsafe { libc::munmap(got, size) };
        return Reserved::Unsupported;
    }
    Reserved::Done
}

fn unreserve(chunk: u64, count: u64) {
    // SAFETY: chunks this process reserved itself, with nothing else in them.
    unsafe { libc::munmap((chunk * CHUNK) as usize as *mut libc::c_void, (count * CHUNK) as usize) };
}

impl Reservations {
    fn span(start: u64, len: u64) -> std::ops::RangeInclusive<u64> {
        start / CHUNK..=start.saturating_add(len.max(1) - 1) / CHUNK
    }

    /// Reserves the chunks of `[start, start + len)` not reserved yet; false if host memory of
    /// this process is already there (nothing is reserved then). Chunks that cannot be mapped
    /// here at all are not counted, so `release` never unmaps what this process did not map.
    fn claim(&mut self, start: u64, len: u64) -> bool {
        if self.unsupported {
            return true;
        }
        let span = Self::span(start, len);
        let mut made: Vec<(u64, u64)> = Vec::new();
        let mut unmappable: Vec<(u64, u64)> = Vec::new();
        let mut chunk = *span.start();
        while chunk <= *span.end() {
            if self.chunks.contains_key(&chunk) {
                chunk += 1;
                continue;
            }
            let first = chunk;
            while chunk <= *span.end() && !self.chunks.contains_key(&chunk) {
                chunk += 1;
            }
            match reserve(first * CHUNK, (chunk - first) * CHUNK) {
                Reserved::Done => made.push((first, chunk - first)),
                Reserved::Impossible => unmappable.push((first, chunk - first)),
                Reserved::Unsupported => {
                    self.unsupported = true;
                    made.into_iter().for_each(|(first, count)| unreserve(first, count));
                    return true;
                }
                Reserved::Taken => {
                    made.into_iter().for_each(|(first, count)| unreserve(first, count));
                    return false;
                }
            }
        }
        for chunk in span.filter(|chunk| !unmappable.iter().any(|(first, count)| (*first..first + count).contains(chunk))) {
            *self.chunks.entry(chunk).or_default() += 1;
        }
        true
    }

    /// Gives back the chunks of `[start, start + len)` no other range holds.
    fn release(&mut self, start: u64, len: u64) {
        if self.unsupported {
            return;
        }
        for chunk in Self::span(start, len) {
            match self.chunks.get_mut(&chunk) {
                Some(count) if *count > 1 => *count -= 1,
                Some(_) => {
                    self.chunks.remove(&chunk);
                    unreserve(chunk, 1);
                }
                None => {}
            }
        }
    }
}

/// Start address to its range.
#[derive(Default)]
pub struct DeviceRanges(RwLock<BTreeMap<u64, Range>>, std::sync::Mutex<Reservations>);

impl DeviceRanges {
    fn reservations(&self) -> std::sync::MutexGuard<'_, Reservations> {
        self.1.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records a device allocation if its addresses are free in this process (see
    /// `Reservations`); false, recording nothing, if host memory of the process is there.
    pub fn try_add(&self, start: u64, len: u64, freeable: bool) -> bool {
        if !self.reservations().claim(start, len) {
            return false;
        }
        self.write().insert(start, range(len, freeable));
        true
    }

    /// Reserves a range recorded anyway (the app already holds its address); says once when host
    /// memory of the process is there too.
    fn claim_or_warn(&self, start: u64, len: u64) {
        if !self.reservations().claim(start, len) {
            crate::diagnostics::once(
                "device-range-overlaps-host",
                &format!(
                    "flyt: device memory at {start:#x} ({len} bytes) overlaps host memory of this process; copies between the two cannot be told apart"
                ),
            );
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<u64, Range>> {
        self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<u64, Range>> {
        self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records a device allocation (or a module variable when `!freeable`).
    pub fn add(&self, start: u64, len: u64, freeable: bool) {
        self.claim_or_warn(start, len);
        self.write().insert(start, range(len, freeable));
    }

    /// Records another process's allocation of `pool` this process imported: freeable, not among
    /// the bytes this process holds (`allocated_bytes`), as its exporter holds them. Imported
    /// again, it holds one more reference.
    pub fn add_imported(&self, start: u64, len: u64, pool: u64) {
        let mut ranges = self.write();
        if let Some(range) = ranges.get_mut(&start).filter(|range| range.imports > 0) {
            range.imports += 1;
            return;
        }
        self.claim_or_warn(start, len);
        ranges.insert(start, Range { imports: 1, pool: Some(pool), ..range(len, true) });
    }

    /// Drops one reference of an allocation imported more than once: `true` while it stays (a
    /// free then does nothing more), `false` for anything else, which a free removes.
    pub fn drop_import(&self, start: u64) -> bool {
        match self.write().get_mut(&start) {
            Some(range) if range.imports > 1 => {
                range.imports -= 1;
                true
            }
            _ => false,
        }
    }

    /// Records the pool the allocation at `start` came from.
    pub fn set_pool(&self, start: u64, pool: u64) {
        if let Some(range) = self.write().get_mut(&start) {
            range.pool = Some(pool);
        }
    }

    /// The pool of the allocation that starts at `start`, if it is a pool allocation.
    pub fn pool(&self, start: u64) -> Option<u64> {
        self.read().get(&start).and_then(|range| range.pool)
    }

    /// Records module variables as `(address, size)`.
    pub fn add_variables(&self, variables: impl Iterator<Item = (u64, u64)>) {
        for (start, len) in variables {
            self.add(start, len, false);
        }
    }

    /// Reserves a virtual range of the server's (`cuMemAddressReserve`) in this process, with no
    /// device range recorded: host memory cannot land where mappings will go.
    pub fn reserve_addresses(&self, start: u64, len: u64) {
        self.claim_or_warn(start, len);
    }

    /// Gives back what `reserve_addresses` reserved (`cuMemAddressFree`).
    pub fn free_addresses(&self, start: u64, len: u64) {
        self.released([(start, len)]);
    }

    /// Records physical memory mapped at `start` (`cuMemMap`).
    pub fn add_mapping(&self, start: u64, len: u64) {
        self.claim_or_warn(start, len);
        self.write().insert(start, Range { mapped: true, ..range(len, false) });
    }

    /// Forgets the given ranges' reservations (they were removed).
    fn released(&self, removed: impl IntoIterator<Item = (u64, u64)>) {
        let mut reservations = self.reservations();
        for (start, len) in removed {
            reservations.release(start, len);
        }
    }

    /// Forgets the mappings inside `[start, start + len)` (`cuMemUnmap`).
    pub fn remove_mappings(&self, start: u64, len: u64) {
        let mut removed = Vec::new();
        self.write().retain(|begin, range| {
            let keep = !(range.mapped && *begin >= start && *begin < start.saturating_add(len));
            if !keep {
                removed.push((*begin, range.len));
            }
            keep
        });
        self.released(removed);
    }

    /// Forgets a module variable at `start` (its module was unloaded).
    pub fn remove_variable(&self, start: u64) {
        let removed = {
            let mut ranges = self.write();
            match ranges.get(&start) {
                Some(range) if !range.freeable => ranges.remove(&start),
                _ => None,
            }
        };
        self.released(removed.map(|range| (start, range.len)));
    }

    /// Forgets an allocation that starts exactly at `start`; anything else is CUDA's invalid value.
    pub fn remove_allocation(&self, start: u64) -> CudaResult<()> {
        let removed = {
            let mut ranges = self.write();
            match ranges.get(&start) {
                Some(range) if range.freeable => ranges.remove(&start),
                _ => return Err(CudaError::INVALID_VALUE),
            }
        };
        self.released(removed.map(|range| (start, range.len)));
        Ok(())
    }

    /// Forgets every allocation and mapping (a device reset), keeping module variables.
    pub fn forget_allocations(&self) {
        let mut removed = Vec::new();
        self.write().retain(|start, range| {
            let keep = !range.freeable && !range.mapped;
            if !keep {
                removed.push((*start, range.len));
            }
            keep
        });
        self.released(removed);
    }

    /// Bytes of device memory the process's allocations hold (not what it imported).
    pub fn allocated_bytes(&self) -> u64 {
        self.read().values().filter(|range| range.freeable && range.imports == 0).map(|range| range.len).sum()
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

    /// Marks the allocation at `start` as made by `cuMemAlloc` or `cuMemAllocPitch`.
    pub fn mark_legacy_ipc(&self, start: u64) {
        if let Some(range) = self.write().get_mut(&start) {
            range.legacy_ipc = true;
        }
    }

    /// Whether the range holding `ptr` is memory `cuIpcGetMemHandle` exports.
    pub fn legacy_ipc_capable(&self, ptr: u64) -> bool {
        self.holding(ptr).is_some_and(|(_, range)| range.legacy_ipc)
    }

    /// The buffer id of the range holding `ptr`.
    pub fn buffer_id(&self, ptr: u64) -> Option<u64> {
        self.holding(ptr).map(|(_, range)| range.id)
    }

    /// A range overlapping `[start, start + len)` made on a device `elsewhere` says is another
    /// server's, as `(start, len, device)`: two servers of a spread session handed out the same
    /// addresses.
    pub fn overlapping_elsewhere(&self, start: u64, len: u64, elsewhere: impl Fn(u32) -> bool) -> Option<(u64, u64, u32)> {
        let end = start.saturating_add(len.max(1));
        let ranges = self.read();
        let before = ranges.range(..start).next_back().filter(|(first, range)| *first + range.len > start);
        before
            .into_iter()
            .chain(ranges.range(start..end))
            .find(|(_, range)| elsewhere(range.device))
            .map(|(first, range)| (*first, range.len, range.device))
    }

    /// The session device (the server's index) the range holding `ptr` was made on.
    pub fn device_of(&self, ptr: u64) -> Option<u32> {
        self.holding(ptr).map(|(_, range)| range.device)
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

    /// A free, chunk-aligned stretch of this process's address space of `chunks` chunks.
    fn free_stretch(chunks: u64) -> u64 {
        let len = ((chunks + 1) * CHUNK) as usize;
        // SAFETY: a fresh anonymous mapping, unmapped at once: only its address is kept.
        let got = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
        assert_ne!(got, libc::MAP_FAILED);
        // SAFETY: the mapping just made.
        unsafe { libc::munmap(got, len) };
        (got as u64).div_ceil(CHUNK) * CHUNK
    }

    /// Whether host memory can be mapped at `addr` now.
    fn host_can_map(addr: u64) -> bool {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE;
        // SAFETY: MAP_FIXED_NOREPLACE never replaces a mapping; a made one is unmapped at once.
        let got = unsafe { libc::mmap(addr as usize as *mut libc::c_void, 4096, libc::PROT_READ, flags, -1, 0) };
        if got == libc::MAP_FAILED {
            return false;
        }
        // SAFETY: the mapping just made.
        unsafe { libc::munmap(got, 4096) };
        got as u64 == addr
    }

    /// A spread session's servers' ranges: an allocation overlapping another server's range is
    /// found (by the device it was made on), one next to it or on the same server is not.
    #[test]
    fn ranges_of_other_servers_overlapping_are_found() {
        let ranges = DeviceRanges::default();
        let base = free_stretch(8);
        crate::devices::with_thread_device(1, || assert!(ranges.try_add(base + CHUNK, 2 * CHUNK, true)));
        let second_server = |device: u32| device == 1;
        assert_eq!(ranges.overlapping_elsewhere(base, CHUNK + 1, second_server), Some((base + CHUNK, 2 * CHUNK, 1)), "its start");
        assert_eq!(ranges.overlapping_elsewhere(base + 2 * CHUNK, 8, second_server), Some((base + CHUNK, 2 * CHUNK, 1)), "inside");
        assert_eq!(ranges.overlapping_elsewhere(base, CHUNK, second_server), None, "just below");
        assert_eq!(ranges.overlapping_elsewhere(base + 3 * CHUNK, CHUNK, second_server), None, "just above");
        assert_eq!(ranges.overlapping_elsewhere(base + 2 * CHUNK, 8, |device| device != 1), None, "the same server's");
        ranges.remove_allocation(base + CHUNK).unwrap();
    }

    #[test]
    fn device_ranges_keep_host_memory_out_and_are_refused_over_it() {
        let ranges = DeviceRanges::default();
        let base = free_stretch(4);
        assert!(ranges.try_add(base + 512, 3 * CHUNK, true));
        assert!(!host_can_map(base + CHUNK), "a device range's addresses are reserved");
        // Two ranges in one chunk share its reservation.
        assert!(ranges.try_add(base + 3 * CHUNK + 4096, 4096, true));
        ranges.remove_allocation(base + 512).unwrap();
        assert!(host_can_map(base + CHUNK), "given back with its range");
        assert!(!host_can_map(base + 3 * CHUNK), "the chunk another range still holds stays reserved");
        ranges.remove_allocation(base + 3 * CHUNK + 4096).unwrap();
        assert!(host_can_map(base + 3 * CHUNK));
        // Host memory there first: the device range is refused and nothing is recorded.
        // SAFETY: a fresh anonymous mapping at a free address, unmapped below.
        let host = unsafe {
            libc::mmap(
                (base + CHUNK) as usize as *mut libc::c_void,
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        assert_eq!(host as u64, base + CHUNK);
        assert!(!ranges.try_add(base, 2 * CHUNK, true));
        assert_eq!(ranges.find(base), None);
        assert!(host_can_map(base), "a refused range leaves no reservation behind");
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(host, 4096) };
    }

    #[test]
    fn chunks_that_cannot_be_mapped_are_not_counted() {
        let mut reservations = Reservations::default();
        // Kernel addresses, which no process may map.
        const KERNEL: u64 = 0xffff_f000_0000_0000;
        assert!(reservations.claim(KERNEL, 0x100));
        assert!(reservations.chunks.is_empty(), "nothing was reserved, so nothing is counted to unmap later");
        reservations.release(KERNEL, 0x100);
    }

    #[test]
    fn imported_pool_memory_is_freeable_and_not_held_here() {
        let ranges = DeviceRanges::default();
        ranges.add(0x1000, 0x100, true);
        ranges.add_imported(0x4000, 0x200, 7);
        assert_eq!(ranges.allocated_bytes(), 0x100, "the exporter holds imported memory");
        assert!(ranges.check(0x4000, 0x200).is_ok());
        assert_eq!(ranges.pool(0x4000), Some(7));
        ranges.add_imported(0x4000, 0x200, 7);
        assert!(ranges.drop_import(0x4000), "imported twice: the first free leaves it");
        assert!(!ranges.drop_import(0x4000), "the last free removes it");
        assert_eq!(ranges.remove_allocation(0x4000), Ok(()));
        assert_eq!(ranges.find(0x4000), None);
    }

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
