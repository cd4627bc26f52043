//! Device memory this worker maps itself, at addresses it holds: a moved session's, mapped back
//! at the addresses its app holds (`RestoredMemory`), and the CUDA driver's side of the session's
//! own allocations while the server pages (`CudaVmm`, for `vmm_malloc`), which share the making of
//! physical memory, its mapping and its access list (`map_new`).
//!
//! The source's allocations came from `cuMemAlloc`, which packs small ones into 2 MiB pages, so
//! the allocations are grouped into page-aligned spans (each one physical allocation, mapped
//! once) inside reservations made at the spans' own addresses. The driver honours an address
//! hint for a large reservation but places small ones itself, so a reservation first covers its
//! spans rounded out to whole GiBs; where the driver already uses part of that (it offers another
//! address), the spans are reserved again with finer rounding, down to the spans themselves. An
//! address the driver will not give back at all fails the restore before the app has moved.
//! The app's own address reservations (`cuMemAddressReserve`) are held the same way, and its
//! mappings are made again inside them.

use std::collections::{BTreeMap, HashMap};

use cudarc::driver::sys;

/// Rounding of reservations and how far apart spans may be and still share one, coarse first:
/// whole GiBs (large enough for the driver to take the address hint), then finer where the
/// driver already holds part of a GiB.
const LEVELS: [(u64, u64); 4] = [(1 << 30, 4 << 30), (256 << 20, 0), (32 << 20, 0), (2 << 20, 0)];

/// One physical allocation mapped over restored allocations.
struct Span {
    len: u64,
    handle: sys::CUmemGenericAllocationHandle,
    /// Restored allocations still alive in it: unmapped and released when the last is freed.
    live: usize,
}

/// The restored memory of this worker's session.
#[derive(Default)]
pub(super) struct RestoredMemory {
    spans: BTreeMap<u64, Span>,
    /// Each restored allocation's span.
    span_of: HashMap<u64, u64>,
    /// The app's reservations (start, length), inside reservations made here.
    app_reservations: std::collections::HashSet<(u64, u64)>,
    /// Reservations made here (start, end), held until the worker exits: a later restore (a
    /// paged-out session paged in, `docs/design/paging.md`) maps inside them again.
    held: Vec<(u64, u64)>,
}

/// The page of physical allocations made with `prop`.
fn granularity(prop: &sys::CUmemAllocationProp) -> Result<usize, String> {
    let mut page = 0usize;
    // SAFETY: valid out-pointer and a complete properties struct.
    let code = unsafe {
        sys::cuMemGetAllocationGranularity(&mut page, prop, sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM)
    };
    if code != sys::CUresult::CUDA_SUCCESS || page == 0 {
        return Err(format!("cuMemGetAllocationGranularity: {code:?}"));
    }
    Ok(page)
}

/// New physical memory of `len` bytes mapped at `start` (inside a reservation, nothing mapped
/// there) and made accessible as `access` says: its handle.
fn map_new(
    start: u64,
    len: usize,
    prop: &sys::CUmemAllocationProp,
    access: &[sys::CUmemAccessDesc],
) -> Result<sys::CUmemGenericAllocationHandle, sys::CUresult> {
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: valid out-pointer and a complete properties struct.
    let code = unsafe { sys::cuMemCreate(&mut handle, len, prop, 0) };
    if code != sys::CUresult::CUDA_SUCCESS {
        return Err(code);
    }
    // SAFETY: the caller's `start..start + len` lies inside a reservation with nothing mapped
    // there; the handle is `len` bytes. On failure the handle is released unmapped.
    let code = unsafe {
        let mut code = sys::cuMemMap(start, len, 0, handle, 0);
        if code == sys::CUresult::CUDA_SUCCESS {
            code = sys::cuMemSetAccess(start, len, access.as_ptr(), access.len());
        }
        if code != sys::CUresult::CUDA_SUCCESS {
            sys::cuMemUnmap(start, len);
            sys::cuMemRelease(handle);
        }
        code
    };
    if code == sys::CUresult::CUDA_SUCCESS { Ok(handle) } else { Err(code) }
}

/// Whether `start..end` lies inside one of the `held` reservations.
fn covered(held: &[(u64, u64)], start: u64, end: u64) -> bool {
    held.iter().any(|&(from, to)| from <= start && end <= to)
}

fn round_down(value: u64, align: u64) -> u64 {
    value / align * align
}

fn round_up(value: u64, align: u64) -> Option<u64> {
    value.checked_add(align - 1).map(|value| value / align * align)
}

/// Page-aligned spans covering `allocations`, merged where they touch or overlap.
fn spans(allocations: &[(u64, u64)], page: u64) -> Result<Vec<(u64, u64)>, String> {
    let mut ends: Vec<(u64, u64)> = Vec::with_capacity(allocations.len());
    for &(ptr, len) in allocations {
        let end = ptr.checked_add(len.max(1)).and_then(|end| round_up(end, page)).ok_or("an allocation runs past the address space")?;
        ends.push((round_down(ptr, page), end));
    }
    ends.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (start, end) in ends {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    Ok(merged)
}

/// `allocations` grouped by the span `RestoredMemory::restore` maps each in, in address order:
/// a group may be restored on its own while another's bytes are copied (a page-in).
pub(super) fn span_groups(allocations: &[(u64, u64)], prop: &sys::CUmemAllocationProp) -> Result<Vec<Vec<(u64, u64)>>, String> {
    groups_by_span(allocations, granularity(prop)? as u64)
}

fn groups_by_span(allocations: &[(u64, u64)], page: u64) -> Result<Vec<Vec<(u64, u64)>>, String> {
    let spans = spans(allocations, page)?;
    let mut groups = vec![Vec::new(); spans.len()];
    for &(ptr, len) in allocations {
        let index = spans.partition_point(|&(start, _)| start <= ptr).checked_sub(1).ok_or("an allocation outside its spans")?;
        groups[index].push((ptr, len));
    }
    Ok(groups.into_iter().filter(|group| !group.is_empty()).collect())
}

/// Reservations covering `spans` (sorted start, end), rounded out to `align` and joined where
/// they come within `gap`: each reservation's start, end and the spans it covers.
fn reservations(spans: &[(u64, u64)], align: u64, gap: u64) -> Result<Vec<(u64, u64, std::ops::Range<usize>)>, String> {
    let mut out: Vec<(u64, u64, std::ops::Range<usize>)> = Vec::new();
    for (index, &(start, end)) in spans.iter().enumerate() {
        let (start, end) = (round_down(start, align), round_up(end, align).ok_or("address overflow")?);
        match out.last_mut() {
            Some(last) if start <= last.1.saturating_add(gap) => {
                last.1 = last.1.max(end);
                last.2.end = index + 1;
            }
            _ => out.push((start, end, index..index + 1)),
        }
    }
    Ok(out)
}

/// Reserves `start..end` exactly: `Ok(false)` when the driver offers another address (nothing
/// is then held).
fn reserve_exactly(start: u64, end: u64, held: &mut Vec<(u64, u64)>) -> Result<bool, String> {
    let mut got: sys::CUdeviceptr = 0;
    let len = (end - start) as usize;
    // SAFETY: valid out-pointer; the hint is only a request.
    let code = unsafe { sys::cuMemAddressReserve(&mut got, len, 0, start, 0) };
    if code != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("reserving {len} bytes at {start:#x}: {code:?}"));
    }
    if got != start {
        // SAFETY: the reservation just made, of `len` bytes.
        unsafe { sys::cuMemAddressFree(got, len) };
        return Ok(false);
    }
    // Reservations stay until the worker exits: they only hold addresses.
    held.push((start, end));
    Ok(true)
}

/// Reserves the addresses of `spans` (sorted), coarsely rounded first (`LEVELS[level]`), more
/// finely where the driver holds part of a coarse reservation.
fn reserve_spans(spans: &[(u64, u64)], level: usize, held: &mut Vec<(u64, u64)>) -> Result<(), String> {
    let (align, gap) = LEVELS[level];
    for (start, end, covered) in reservations(spans, align, gap)? {
        if reserve_exactly(start, end, held)? {
            continue;
        }
        if level + 1 == LEVELS.len() {
            return Err(format!("addresses {start:#x}..{end:#x} are taken on this device"));
        }
        if let Err(error) = reserve_spans(&spans[covered.clone()], level + 1, held) {
            if level > 0 {
                return Err(error);
            }
            // What holds the place here, for the operator (and for whoever reads the log).
            let (first, last) = (spans[covered.start].0, spans[covered.end - 1].1);
            return Err(format!("{error} (here: {})", crate::address_space::describe(first, last)));
        }
    }
    Ok(())
}

impl RestoredMemory {
    /// Maps memory under every allocation of `allocations` (start, length) at its address, and
    /// holds the addresses of `reservations` (the app's, whole pages) for their mappings.
    pub(super) fn restore(
        &mut self,
        allocations: &[(u64, u64)],
        reservations: &[(u64, u64)],
        prop: &sys::CUmemAllocationProp,
        access: &[sys::CUmemAccessDesc],
    ) -> Result<(), String> {
        let page = granularity(prop)?;
        let spans = spans(allocations, page as u64)?;
        let everything: Vec<_> = allocations.iter().chain(reservations).copied().collect();
        let held = &self.held;
        let unheld: Vec<_> =
            self::spans(&everything, page as u64)?.into_iter().filter(|&(start, end)| !covered(held, start, end)).collect();
        reserve_spans(&unheld, 0, &mut self.held)?;
        self.app_reservations.extend(reservations.iter().copied());
        let mut made = Vec::with_capacity(spans.len());
        for (start, end) in spans {
            let len = (end - start) as usize;
            match map_new(start, len, prop, access) {
                Ok(handle) => made.push((start, Span { len: len as u64, handle, live: 0 })),
                Err(code) => {
                    // Nothing of this restore stays mapped: a later try (a page-in after room
                    // is made) maps the same spans again.
                    for (start, span) in made {
                        // SAFETY: mapped just above and used by nothing yet.
                        unsafe {
                            sys::cuMemUnmap(start, span.len as usize);
                            sys::cuMemRelease(span.handle);
                        }
                    }
                    return Err(format!("{len} bytes of device memory mapped at {start:#x}: {code:?}"));
                }
            }
        }
        self.spans.extend(made);
        for &(ptr, _) in allocations {
            let Some((&start, span)) = self.spans.range_mut(..=ptr).next_back() else {
                return Err(format!("no span holds {ptr:#x}"));
            };
            span.live += 1;
            self.span_of.insert(ptr, start);
        }
        Ok(())
    }

    /// Holds the addresses of `allocations` (start, length), just freed, in reservations of
    /// `page`-aligned spans, so nothing else lands there until `restore` maps memory again (a
    /// session paged out). Spans already inside a reservation made here stay as they are.
    pub(super) fn hold(&mut self, allocations: &[(u64, u64)], prop: &sys::CUmemAllocationProp) -> Result<(), String> {
        let page = granularity(prop)? as u64;
        let held = &self.held;
        let unheld: Vec<_> = spans(allocations, page)?.into_iter().filter(|&(start, end)| !covered(held, start, end)).collect();
        reserve_spans(&unheld, 0, &mut self.held)
    }

    /// Forgets the app's reservation `ptr..ptr + len` if it is one restored here (its addresses
    /// stay held until the worker exits); `false` when it is not.
    pub(super) fn forget_reservation(&mut self, ptr: u64, len: u64) -> bool {
        self.app_reservations.remove(&(ptr, len))
    }

    /// The span (start, length, physical handle) holding restored allocation `ptr`.
    pub(super) fn span_of(&self, ptr: u64) -> Option<(u64, u64, sys::CUmemGenericAllocationHandle)> {
        let start = *self.span_of.get(&ptr)?;
        self.spans.get(&start).map(|span| (start, span.len, span.handle))
    }

    /// Frees an allocation mapped here (its addresses stay held until the worker exits); `None`
    /// when `ptr` is not one (the driver's `cuMemFree` applies).
    pub(super) fn free(&mut self, ptr: u64) -> Option<sys::CUresult> {
        self.unmap(ptr)
    }

    /// Releases the physical memory under an allocation mapped here, its addresses staying held
    /// (a page-out: `restore` maps new memory there); `None` when `ptr` is not one.
    pub(super) fn unmap(&mut self, ptr: u64) -> Option<sys::CUresult> {
        let start = self.span_of.remove(&ptr)?;
        let span = self.spans.get_mut(&start)?;
        span.live -= 1;
        if span.live > 0 {
            return Some(sys::CUresult::CUDA_SUCCESS);
        }
        let span = self.spans.remove(&start)?;
        // SAFETY: the span was mapped by `restore` and no allocation in it is alive: the session
        // freed the last one (cuMemFree semantics: the caller synchronized) or it is paged out
        // (after a synchronize), so no queued work uses it.
        unsafe {
            sys::cuCtxSynchronize();
            let code = sys::cuMemUnmap(start, span.len as usize);
            sys::cuMemRelease(span.handle);
            Some(code)
        }
    }
}

/// The CUDA driver's primitives for the session's own memory while the server pages
/// (`vmm_malloc`): physical memory made with `prop` and accessible as `access` says, as restored
/// memory is.
pub(super) struct CudaVmm<'a> {
    prop: &'a sys::CUmemAllocationProp,
    access: &'a [sys::CUmemAccessDesc],
    page: u64,
}

impl<'a> CudaVmm<'a> {
    pub(super) fn new(prop: &'a sys::CUmemAllocationProp, access: &'a [sys::CUmemAccessDesc]) -> Result<Self, String> {
        Ok(Self { prop, access, page: granularity(prop)? as u64 })
    }
}

fn cuda_error(code: sys::CUresult) -> flyt_protocol::CudaError {
    super::cuda::check(code.result()).err().unwrap_or(flyt_protocol::CudaError::UNKNOWN)
}

impl super::vmm_malloc::VmmDriver for CudaVmm<'_> {
    fn page(&self) -> u64 {
        self.page
    }

    fn device(&self) -> usize {
        usize::try_from(self.prop.location.id).unwrap_or(usize::MAX)
    }

    fn reserve(&mut self, len: u64) -> Result<u64, flyt_protocol::CudaError> {
        let mut start: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; no address hint; the alignment is the granularity.
        let code = unsafe { sys::cuMemAddressReserve(&mut start, len as usize, self.page as usize, 0, 0) };
        if code == sys::CUresult::CUDA_SUCCESS { Ok(start) } else { Err(cuda_error(code)) }
    }

    fn free_reservation(&mut self, start: u64, len: u64) -> Result<(), flyt_protocol::CudaError> {
        // SAFETY: a reservation `reserve` made, with nothing mapped in it (the caller's contract).
        let code = unsafe { sys::cuMemAddressFree(start, len as usize) };
        if code == sys::CUresult::CUDA_SUCCESS { Ok(()) } else { Err(cuda_error(code)) }
    }

    fn map_new(&mut self, start: u64, len: u64) -> Result<u64, flyt_protocol::CudaError> {
        map_new(start, len as usize, self.prop, self.access).map_err(cuda_error)
    }

    fn unmap(&mut self, start: u64, len: u64, handle: u64) -> Result<(), flyt_protocol::CudaError> {
        // SAFETY: `map_new` mapped `handle` over `start..start + len`; the caller waited for the
        // device (a free, or a page-out after its synchronize), so no queued work uses it.
        let code = unsafe { sys::cuMemUnmap(start, len as usize) };
        if code != sys::CUresult::CUDA_SUCCESS {
            return Err(cuda_error(code));
        }
        // SAFETY: the handle `map_new` made, unmapped just above, released once.
        let released = unsafe { sys::cuMemRelease(handle) };
        if released != sys::CUresult::CUDA_SUCCESS {
            // Unmapped all the same: the addresses are free for new memory.
            tracing::warn!(start = format_args!("{start:#x}"), len, code = ?released, "device memory unmapped but not released");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = 2 << 20;

    #[test]
    fn allocations_sharing_a_page_share_a_span() {
        let base = 0x7f00_0000_0000;
        let spans = spans(&[(base + 512, 256), (base, 512), (base + PAGE + 4096, 3 * PAGE)], PAGE).unwrap();
        // The first two share a page; the third starts in the next page, which touches it.
        assert_eq!(spans, vec![(base, base + 5 * PAGE)]);
        let apart = super::spans(&[(base, 256), (base + 4 * PAGE, 256)], PAGE).unwrap();
        assert_eq!(apart, vec![(base, base + PAGE), (base + 4 * PAGE, base + 5 * PAGE)]);
    }

    #[test]
    fn allocations_are_grouped_by_the_span_they_are_mapped_in() {
        let base = 0x7f00_0000_0000;
        let far = base + 8 * PAGE;
        let allocations = [(far, PAGE), (base + 512, 256), (base, 512), (base + PAGE, PAGE)];
        // The first page's two and the next page (touching): one span; the far one its own.
        assert_eq!(
            groups_by_span(&allocations, PAGE).unwrap(),
            vec![vec![(base + 512, 256), (base, 512), (base + PAGE, PAGE)], vec![(far, PAGE)]]
        );
    }

    #[test]
    fn reservations_are_rounded_and_join_near_spans() {
        let gib = 1u64 << 30;
        let base = 0x7f00_0000_0000;
        let spans = [(base + PAGE, base + 2 * PAGE), (base + 2 * gib, base + 2 * gib + PAGE)];
        let (align, gap) = LEVELS[0];
        assert_eq!(reservations(&spans, align, gap).unwrap(), vec![(base, base + 3 * gib, 0..2)]);
        let far = reservations(&[(0x3_0200_0000, 0x3_0220_0000), (base, base + PAGE)], align, gap).unwrap();
        assert_eq!(far, vec![(0x3_0000_0000, 0x3_4000_0000, 0..1), (base, base + gib, 1..2)]);
        // Finer levels keep apart what the GiB level joined, down to the spans themselves.
        let (align, gap) = LEVELS[1];
        assert_eq!(
            reservations(&spans, align, gap).unwrap(),
            vec![(base, base + (256 << 20), 0..1), (base + 2 * gib, base + 2 * gib + (256 << 20), 1..2)]
        );
        let (align, gap) = LEVELS[LEVELS.len() - 1];
        assert_eq!(reservations(&spans, align, gap).unwrap(), vec![(spans[0].0, spans[0].1, 0..1), (spans[1].0, spans[1].1, 1..2)]);
    }
}
