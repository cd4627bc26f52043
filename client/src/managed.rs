//! Managed memory (`cuMemAllocManaged`, `cudaMallocManaged`). Two backings:
//!
//! - With the shared-memory channel (the app shares a host with its GPU server): a block of the
//!   segment that the server mapped at the app's own address, so the CPU and the GPU use the same
//!   pages at the same address, concurrently, as managed memory allows. Kernels reach it over the
//!   bus rather than from device memory: correct, possibly slower than native, where pages migrate.
//! - Without it (a socket alone, TCP: the GPU possibly on another host), or where the server cannot
//!   map the block at the app's address: a mirror (`mirrors.rs`), device memory on the server whose
//!   address is the app's pointer on both sides, with private pages at that address here. Host
//!   and device see each other's writes at the points where CUDA makes managed memory coherent
//!   for a program without concurrent access (launches, synchronizations, copies, memsets,
//!   prefetches), so `CONCURRENT_MANAGED_ACCESS` reads 0 for such sessions (`devices.rs`). Copies
//!   take such memory as device memory (`transfer::classify`), after the host's changes are sent.
//!
//! Prefetches and advice change where native pages live, never what they hold; here the pages
//! stay where they are (a prefetch of mirrored memory to the device sends the host's changes; one
//! to the CPU needs nothing more than the fetch every synchronization after device work does).
//! Both are checked as CUDA checks them and recorded per page, so the range queries
//! (`cuMemRangeGetAttribute`) answer what the app asked for.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::req;

use crate::client::{Client, HostAllocation};

const PAGE: u64 = 4096;

/// `CU_MEM_ATTACH_GLOBAL | CU_MEM_ATTACH_HOST | CU_MEM_ATTACH_SINGLE`.
pub const ATTACH_GLOBAL: u32 = 1;
pub const ATTACH_HOST: u32 = 2;
pub const ATTACH_SINGLE: u32 = 4;

/// `CUmemLocationType`.
pub mod location_type {
    pub const INVALID: u32 = 0;
    pub const DEVICE: u32 = 1;
    pub const HOST: u32 = 2;
    pub const HOST_NUMA: u32 = 3;
    pub const HOST_NUMA_CURRENT: u32 = 4;
}

/// `CU_DEVICE_CPU` and `CU_DEVICE_INVALID`, the legacy attributes' names for host and none.
pub const DEVICE_CPU: i32 = -1;
pub const DEVICE_INVALID: i32 = -2;

/// A `CUmemLocation`: where advice or a prefetch points.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Location {
    pub kind: u32,
    pub id: i32,
}

impl Location {
    pub const NONE: Location = Location { kind: location_type::INVALID, id: 0 };

    /// The legacy form: a device ordinal, `CU_DEVICE_CPU`, or `CU_DEVICE_INVALID`.
    pub fn from_legacy(device: i32) -> Location {
        match device {
            DEVICE_CPU => Location { kind: location_type::HOST, id: 0 },
            device => Location { kind: location_type::DEVICE, id: device },
        }
    }

    pub fn legacy(self) -> i32 {
        match self.kind {
            location_type::DEVICE => self.id,
            location_type::HOST | location_type::HOST_NUMA | location_type::HOST_NUMA_CURRENT => DEVICE_CPU,
            _ => DEVICE_INVALID,
        }
    }

    /// Checks a location an app names: a device of the session or the host.
    pub fn check(self, client: &Client) -> CudaResult<Location> {
        match self.kind {
            location_type::DEVICE if usize::try_from(self.id).is_ok_and(|id| id < client.device_count()) => Ok(self),
            location_type::DEVICE => Err(CudaError::INVALID_DEVICE),
            // The current thread's NUMA node is recorded as the host: the queries name no other.
            location_type::HOST | location_type::HOST_NUMA_CURRENT => Ok(Location { kind: location_type::HOST, id: 0 }),
            location_type::HOST_NUMA if self.id >= 0 => Ok(self),
            _ => Err(CudaError::INVALID_VALUE),
        }
    }

    /// One bit per location for "accessed by": devices by ordinal, the host as bit 31.
    fn bit(self) -> u32 {
        match self.kind {
            location_type::DEVICE => 1 << (self.id as u32).min(30),
            _ => 1 << 31,
        }
    }
}

/// `CUmem_advise`.
pub mod advice {
    pub const SET_READ_MOSTLY: u32 = 1;
    pub const UNSET_READ_MOSTLY: u32 = 2;
    pub const SET_PREFERRED_LOCATION: u32 = 3;
    pub const UNSET_PREFERRED_LOCATION: u32 = 4;
    pub const SET_ACCESSED_BY: u32 = 5;
    pub const UNSET_ACCESSED_BY: u32 = 6;
}

/// `CUmem_range_attribute`.
pub mod range_attribute {
    pub const READ_MOSTLY: u32 = 1;
    pub const PREFERRED_LOCATION: u32 = 2;
    pub const ACCESSED_BY: u32 = 3;
    pub const LAST_PREFETCH_LOCATION: u32 = 4;
    pub const PREFERRED_LOCATION_TYPE: u32 = 5;
    pub const PREFERRED_LOCATION_ID: u32 = 6;
    pub const LAST_PREFETCH_LOCATION_TYPE: u32 = 7;
    pub const LAST_PREFETCH_LOCATION_ID: u32 = 8;
}

/// What the app asked of one page.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
struct PageState {
    read_mostly: bool,
    preferred: Location,
    last_prefetch: Location,
    accessed_by: u32,
}

/// One managed allocation.
struct Allocation {
    len: u64,
    buffer_id: u64,
    /// A `__managed__` variable's mirror (`mirrors.rs`): the module's, never freed by the app.
    mirrored: bool,
    /// An allocation mirrored over device memory (`mirrors.rs`), not a segment block.
    device_backed: bool,
    /// Per page, made at the first advice or prefetch.
    pages: Option<Vec<PageState>>,
}

/// The process's managed allocations, by start address.
#[derive(Default)]
pub struct Managed {
    allocations: Mutex<BTreeMap<u64, Allocation>>,
    /// Whether the process ever had managed memory: copies check their sides only then.
    ever: AtomicBool,
}

/// The answer to a range query.
#[derive(Debug, PartialEq, Eq)]
pub enum RangeValue {
    Int(i32),
    /// `ACCESSED_BY`: the locations advised for the whole range, in device order (host last).
    Locations(Vec<Location>),
}

impl Managed {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Allocation>> {
        self.allocations.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn insert(&self, start: u64, allocation: Allocation) {
        self.lock().insert(start, allocation);
        self.ever.store(true, Ordering::Relaxed);
    }

    /// A copy's side at `address` of `len` bytes: one that starts in managed memory must end in
    /// it, as with device memory.
    pub fn check_copy_side(&self, address: u64, len: u64) -> CudaResult<()> {
        if !self.ever.load(Ordering::Relaxed) || self.holding(address, 1).is_none() {
            return Ok(());
        }
        self.check(address, len).map(drop)
    }

    /// Records a `__managed__` variable's mirror, so hints and pointer queries take it as managed.
    pub fn add_mirror(&self, address: u64, len: u64) {
        self.insert(
            address,
            Allocation { len: len.max(1), buffer_id: crate::ranges::new_buffer_id(), mirrored: true, device_backed: false, pages: None },
        );
    }

    pub fn forget_mirror(&self, address: u64) {
        let mut allocations = self.lock();
        if allocations.get(&address).is_some_and(|allocation| allocation.mirrored) {
            allocations.remove(&address);
        }
    }

    /// The managed allocation holding `[ptr, ptr + len)` as `(start, len, buffer id)`.
    pub fn holding(&self, ptr: u64, len: u64) -> Option<(u64, u64, u64)> {
        let allocations = self.lock();
        let (start, allocation) = allocations.range(..=ptr).next_back()?;
        let end = ptr.checked_add(len.max(1))?;
        (end <= start + allocation.len).then_some((*start, allocation.len, allocation.buffer_id))
    }

    /// Whether `[ptr, ptr + len)` lies in one managed allocation mirrored over device memory: a
    /// copy takes it as device memory.
    pub fn device_backed(&self, ptr: u64, len: u64) -> bool {
        if !self.ever.load(Ordering::Relaxed) {
            return false;
        }
        let allocations = self.lock();
        let Some((start, allocation)) = allocations.range(..=ptr).next_back() else {
            return false;
        };
        allocation.device_backed && ptr.checked_add(len.max(1)).is_some_and(|end| end <= start + allocation.len)
    }

    /// Applies `change` to every page of `[ptr, ptr + len)`, which must lie in one allocation.
    fn update(&self, ptr: u64, len: u64, change: impl Fn(&mut PageState)) -> CudaResult<()> {
        let mut allocations = self.lock();
        let (start, allocation) = allocations.range_mut(..=ptr).next_back().ok_or(CudaError::INVALID_VALUE)?;
        let end = ptr.checked_add(len).ok_or(CudaError::INVALID_VALUE)?;
        if len == 0 || end > start + allocation.len {
            return Err(CudaError::INVALID_VALUE);
        }
        let pages = allocation.pages.get_or_insert_with(|| vec![PageState::default(); allocation.len.div_ceil(PAGE) as usize]);
        let (first, last) = (((ptr - start) / PAGE) as usize, ((end - start).div_ceil(PAGE)) as usize);
        pages[first..last].iter_mut().for_each(change);
        Ok(())
    }

    /// `cuMemAdvise`: records the advice for the pages of the range.
    pub fn advise(&self, client: &Client, ptr: u64, len: u64, advice: u32, location: Location) -> CudaResult<()> {
        use advice::*;
        let location = match advice {
            SET_READ_MOSTLY | UNSET_READ_MOSTLY | UNSET_PREFERRED_LOCATION => location,
            SET_PREFERRED_LOCATION | SET_ACCESSED_BY | UNSET_ACCESSED_BY => location.check(client)?,
            _ => return Err(CudaError::INVALID_VALUE),
        };
        self.update(ptr, len, |page| match advice {
            SET_READ_MOSTLY => page.read_mostly = true,
            UNSET_READ_MOSTLY => page.read_mostly = false,
            SET_PREFERRED_LOCATION => page.preferred = location,
            UNSET_PREFERRED_LOCATION => page.preferred = Location::NONE,
            SET_ACCESSED_BY => page.accessed_by |= location.bit(),
            _ => page.accessed_by &= !location.bit(),
        })
    }

    /// A prefetch (`cuMemPrefetchAsync`): checked and recorded. The pages already are where both
    /// processors reach them, so nothing moves.
    pub fn prefetch(&self, client: &Client, ptr: u64, len: u64, location: Location) -> CudaResult<()> {
        let location = location.check(client)?;
        self.update(ptr, len, |page| page.last_prefetch = location)
    }

    /// Checks that `[ptr, ptr + len)` is managed memory (a discard, an attach).
    pub fn check(&self, ptr: u64, len: u64) -> CudaResult<(u64, u64)> {
        self.holding(ptr, len).map(|(start, len, _)| (start, len)).ok_or(CudaError::INVALID_VALUE)
    }

    /// `cuMemRangeGetAttribute`: what every page of the range has in common.
    pub fn range_attribute(&self, client: &Client, ptr: u64, len: u64, attribute: u32) -> CudaResult<RangeValue> {
        use range_attribute::*;
        let allocations = self.lock();
        let (start, allocation) = allocations.range(..=ptr).next_back().ok_or(CudaError::INVALID_VALUE)?;
        let end = ptr.checked_add(len).ok_or(CudaError::INVALID_VALUE)?;
        if len == 0 || end > start + allocation.len {
            return Err(CudaError::INVALID_VALUE);
        }
        let untouched = [PageState::default()];
        let pages = match &allocation.pages {
            Some(pages) => &pages[((ptr - start) / PAGE) as usize..((end - start).div_ceil(PAGE)) as usize],
            None => &untouched[..],
        };
        // The location all pages share, or none.
        let common = |of: fn(&PageState) -> Location| {
            let first = of(&pages[0]);
            if pages.iter().all(|page| of(page) == first) { first } else { Location::NONE }
        };
        let preferred = || common(|page| page.preferred);
        let prefetched = || common(|page| page.last_prefetch);
        Ok(match attribute {
            READ_MOSTLY => RangeValue::Int(i32::from(pages.iter().all(|page| page.read_mostly))),
            PREFERRED_LOCATION => RangeValue::Int(preferred().legacy()),
            LAST_PREFETCH_LOCATION => RangeValue::Int(prefetched().legacy()),
            PREFERRED_LOCATION_TYPE => RangeValue::Int(preferred().kind as i32),
            PREFERRED_LOCATION_ID => RangeValue::Int(preferred().id),
            LAST_PREFETCH_LOCATION_TYPE => RangeValue::Int(prefetched().kind as i32),
            LAST_PREFETCH_LOCATION_ID => RangeValue::Int(prefetched().id),
            ACCESSED_BY => {
                let all = pages.iter().fold(u32::MAX, |bits, page| bits & page.accessed_by);
                let mut locations: Vec<Location> = (0..client.device_count().min(31))
                    .filter(|device| all & (1 << device) != 0)
                    .map(|device| Location { kind: location_type::DEVICE, id: device as i32 })
                    .collect();
                if all & (1 << 31) != 0 {
                    locations.push(Location { kind: location_type::HOST, id: 0 });
                }
                RangeValue::Locations(locations)
            }
            _ => return Err(CudaError::INVALID_VALUE),
        })
    }
}

/// Managed memory of `size` bytes: a segment block the server mapped at this address, or where
/// there is none (no channel, or the address taken in the server), mirrored device memory.
/// `flags` is `CU_MEM_ATTACH_GLOBAL` or `CU_MEM_ATTACH_HOST`, as the front checked.
pub fn alloc(client: &Client, size: usize, flags: u32) -> CudaResult<u64> {
    let (ptr, device_backed) = match crate::transfer::mapped_block(client, size, flags, true) {
        Ok(ptr) => (ptr, false),
        Err(CudaError::NOT_SUPPORTED) => (client.mirror_alloc(size, flags, true)?, true),
        Err(error) => return Err(error),
    };
    let allocation =
        Allocation { len: size as u64, buffer_id: crate::ranges::new_buffer_id(), mirrored: false, device_backed, pages: None };
    client.managed.insert(ptr as u64, allocation);
    Ok(ptr as u64)
}

/// Frees managed memory [`alloc`] gave out, after the device's work is done (`cuMemFree`
/// synchronizes, and a kernel may still be using the pages). Anything else (a pointer inside an
/// allocation, one freed already, a `__managed__` variable) is an invalid value.
pub fn free(client: &Client, ptr: u64) -> CudaResult<()> {
    let device_backed = match client.managed.lock().get(&ptr) {
        Some(allocation) if !allocation.mirrored => allocation.device_backed,
        _ => return Err(CudaError::INVALID_VALUE),
    };
    client.call(req::DeviceSynchronize {})?;
    // Another thread may have freed it meanwhile: only the one that removes it frees it.
    if client.managed.lock().remove(&ptr).is_none() {
        return Err(CudaError::INVALID_VALUE);
    }
    if device_backed {
        return client.free_mirrored(ptr, true).unwrap_or(Err(CudaError::INVALID_VALUE));
    }
    release(client, ptr)
}

/// Unpins an allocation's block and gives it back to the channel.
fn release(client: &Client, ptr: u64) -> CudaResult<()> {
    let allocation = client.host_allocations.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&(ptr as usize));
    let Some(HostAllocation { len, segment_offset: Some(offset), .. }) = allocation else {
        return Err(CudaError::INVALID_VALUE);
    };
    crate::transfer::release_allocation_block(client, offset, len)
}

/// A device reset frees managed memory with the rest of the device's memory.
pub fn forget(client: &Client) {
    let starts: Vec<u64> = {
        let mut allocations = client.managed.lock();
        // Mirrored allocations go with the mirrors (`Mirrors::forget_all`).
        let starts = allocations
            .iter()
            .filter(|(_, allocation)| !allocation.mirrored && !allocation.device_backed)
            .map(|(start, _)| *start)
            .collect();
        allocations.retain(|_, allocation| allocation.mirrored);
        starts
    };
    for start in starts {
        let _ = release(client, start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_locations_round_trip() {
        assert_eq!(Location::from_legacy(DEVICE_CPU).legacy(), DEVICE_CPU);
        assert_eq!(Location::from_legacy(0).legacy(), 0);
        assert_eq!(Location::NONE.legacy(), DEVICE_INVALID);
    }

    #[test]
    fn page_records_answer_only_what_the_whole_range_shares() {
        let managed = Managed::default();
        managed.insert(0x10000, Allocation { len: 4 * PAGE, buffer_id: 1, mirrored: false, device_backed: false, pages: None });
        let device = Location { kind: location_type::DEVICE, id: 0 };
        managed.update(0x10000, 2 * PAGE, |page| page.last_prefetch = device).unwrap();
        managed.update(0x10000 + PAGE, PAGE, |page| page.read_mostly = true).unwrap();
        let pages = |ptr, len| {
            managed.lock()[&0x10000].pages.as_ref().unwrap()[((ptr - 0x10000) / PAGE) as usize..((ptr - 0x10000 + len) / PAGE) as usize]
                .to_vec()
        };
        assert!(pages(0x10000, 2 * PAGE).iter().all(|page| page.last_prefetch == device));
        assert!(pages(0x10000 + 2 * PAGE, 2 * PAGE).iter().all(|page| page.last_prefetch == Location::NONE));
        assert!(pages(0x10000 + PAGE, PAGE)[0].read_mostly && !pages(0x10000, PAGE)[0].read_mostly);
        // Outside the allocation, or spilling past its end: invalid value.
        assert_eq!(managed.update(0x10000 + 3 * PAGE, 2 * PAGE, |_| {}), Err(CudaError::INVALID_VALUE));
        assert_eq!(managed.update(0x9000, 16, |_| {}), Err(CudaError::INVALID_VALUE));
        assert_eq!(managed.holding(0x10000 + 5, 10), Some((0x10000, 4 * PAGE, 1)));
    }
}
