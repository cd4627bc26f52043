//! The server's side of a session's shared-memory segment: the client's memory, mapped here too
//! and pinned for DMA, so copies from or to it need no socket and no extra copy. Every offset the
//! client sends is checked against the segment and against what is pinned.
//!
//! A pinned block (a `cuMemHostAlloc` of the app) is also mapped a second time at the very
//! address the app sees it at, when that address is free in this process, and pinned there as
//! mapped memory: with unified addressing its device pointer is then that same address, so a
//! kernel given the app's host pointer reads and writes the app's pages, as on a local GPU.
//!
//! The app's own shared mappings of files (a `/dev/shm` file NCCL's ranks all map) are mapped
//! the same way, from the descriptor the app handed over (`flyt_protocol::deposit`), and kept
//! with the segment: kernels, memsets and memory operations take them as they take blocks.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;

/// Pinned blocks are page aligned (the client allocates them so).
pub const PAGE: u64 = 4096;

/// Lowest and highest (exclusive) addresses a block may be mapped at: above the kernel's
/// `mmap_min_addr` and inside the 47-bit user address space.
const ALIAS_RANGE: std::ops::Range<u64> = 1 << 16..1 << 47;

/// A block's second mapping, at the client's address of it; unmapped when dropped.
#[derive(Debug)]
pub struct Alias {
    address: u64,
    len: usize,
}

impl Alias {
    /// Maps `len` bytes of `file` from `offset` at exactly `address`, or `None` when anything
    /// of this process lies there already (it is never replaced) or the address is unusable.
    fn map(file: &File, offset: u64, len: u64, address: u64) -> Option<Self> {
        let end = address.checked_add(len)?;
        if !address.is_multiple_of(PAGE) || address < ALIAS_RANGE.start || end > ALIAS_RANGE.end {
            return None;
        }
        let (len, offset) = (usize::try_from(len).ok()?, libc::off_t::try_from(offset).ok()?);
        // SAFETY: a new shared mapping of the segment file; MAP_FIXED_NOREPLACE fails instead of
        // replacing anything already mapped at that address, so no memory of ours changes.
        let mapped = unsafe {
            libc::mmap(
                address as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE,
                file.as_raw_fd(),
                offset,
            )
        };
        if mapped == libc::MAP_FAILED {
            return None;
        }
        // Kernels before 4.17 take the flag as a hint and may map elsewhere: not ours to keep.
        let alias = Self { address: mapped as u64, len };
        (alias.address == address).then_some(alias)
    }

    pub fn address(&self) -> u64 {
        self.address
    }
}

impl Drop for Alias {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `Alias::map` and is unmapped once, here.
        let _ = unsafe { libc::munmap(self.address as *mut libc::c_void, self.len) };
    }
}

/// A block pinned on the client's request.
#[derive(Debug)]
struct Block {
    len: u64,
    /// The block's mapping at the client's address, pinned as mapped memory instead of the
    /// segment's own view of it.
    alias: Option<Alias>,
}

/// A session's hold on its VM's ivshmem region: a shared lock on the region file while the
/// session lives. The last session to let go wipes the region's slots.
#[derive(Debug)]
pub struct RegionLease {
    file: File,
    name: String,
}

impl RegionLease {
    /// Takes the shared lock (waiting while a session that just ended wipes the region).
    pub fn take(file: &File, name: &str) -> Result<Self, String> {
        let file = file.try_clone().map_err(|error| error.to_string())?;
        // SAFETY: flock on a descriptor this struct owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH) } != 0 {
            return Err(format!("locking region {name}: {}", std::io::Error::last_os_error()));
        }
        Ok(Self { file, name: name.to_owned() })
    }
}

impl Drop for RegionLease {
    fn drop(&mut self) {
        // Converting to an exclusive lock succeeds only when no other session holds the region
        // (a failed conversion drops this session's lock, so of two ending at once, the later
        // one wipes).
        // SAFETY: flock on a descriptor this struct owns.
        if unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            match flyt_ring::region::wipe_slots(&self.file) {
                Ok(()) => tracing::info!(region = %self.name, "the VM's last session ended: region wiped"),
                Err(error) => tracing::warn!(region = %self.name, %error, "wiping the region failed"),
            }
        }
    }
}

/// A mapped segment.
#[derive(Debug)]
pub struct Segment {
    file: File,
    /// Where the segment starts in `file` (a region slot's offset; 0 for a file of its own).
    file_offset: u64,
    /// Held while the segment is mapped, when it is a region slot.
    lease: Option<RegionLease>,
    map: memmap2::MmapRaw,
    size: u64,
    staging: u64,
    /// Blocks pinned on the client's request, by offset.
    registered: BTreeMap<u64, Block>,
    /// The app's shared file mappings, mapped here at the app's address and pinned mapped, by
    /// address.
    files: BTreeMap<u64, Alias>,
}

impl Segment {
    /// Maps a segment of `size` bytes whose first `staging` bytes are the staging area. A memfd
    /// is sealed against shrinking first, so the client cannot make the mapping fault under us.
    pub fn map(file: File, size: u64, staging: u64, memfd: bool) -> Result<Self, String> {
        Self::map_at(file, 0, size, staging, memfd, None)
    }

    /// Maps a slot of a VM's ivshmem region: `size` bytes from `offset` of the region file.
    pub fn map_region(file: File, offset: u64, size: u64, staging: u64, lease: RegionLease) -> Result<Self, String> {
        if !offset.is_multiple_of(PAGE) {
            return Err(format!("a region slot at {offset} is not page aligned"));
        }
        Self::map_at(file, offset, size, staging, false, Some(lease))
    }

    fn map_at(file: File, file_offset: u64, size: u64, staging: u64, memfd: bool, lease: Option<RegionLease>) -> Result<Self, String> {
        if staging > size || !staging.is_multiple_of(PAGE) || !size.is_multiple_of(PAGE) || size == 0 {
            return Err(format!("segment of {size} bytes with {staging} staging bytes is not page aligned"));
        }
        if memfd {
            // SAFETY: fcntl on a descriptor this process owns, with an integer argument.
            let sealed = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) };
            if sealed != 0 {
                return Err(format!("the segment cannot be sealed: {}", std::io::Error::last_os_error()));
            }
        }
        let actual = file.metadata().map_err(|error| error.to_string())?.len();
        if file_offset.checked_add(size).is_none_or(|end| actual < end) {
            return Err(format!("the segment holds {actual} bytes, not the {size} offered from {file_offset}"));
        }
        let len = usize::try_from(size).map_err(|_| "segment too large".to_string())?;
        let map = memmap2::MmapOptions::new()
            .offset(file_offset)
            .len(len)
            .map_raw(&file)
            .map_err(|error| format!("mapping the segment: {error}"))?;
        // Ask for huge pages where the kernel allows them for shared memory: DMA from pinned
        // memory in 4 KiB pages was measured slower (43 GB/s for 64 MiB) than native pinned
        // memory (55 GB/s). Refused or unsupported, it changes nothing.
        // SAFETY: advice on a mapping this struct owns; it never changes the mapping's contents.
        let _ = unsafe { libc::madvise(map.as_mut_ptr().cast(), len, libc::MADV_HUGEPAGE) };
        Ok(Self { file, file_offset, lease, map, size, staging, registered: BTreeMap::new(), files: BTreeMap::new() })
    }

    /// Where `offset` lies in this process.
    pub fn ptr(&self, offset: u64) -> *mut u8 {
        // `offset <= size` is checked by every caller before the pointer is used.
        self.map.as_mut_ptr().wrapping_add(usize::try_from(offset).unwrap_or(usize::MAX))
    }

    pub fn staging(&self) -> u64 {
        self.staging
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether the segment is a slot of a VM's ivshmem region.
    pub fn is_region(&self) -> bool {
        self.lease.is_some()
    }

    /// Every pinned block: offset, length and the client's address it is mapped at (`None`:
    /// pinned for copies only), for a snapshot of the session.
    pub fn blocks(&self) -> Vec<(u64, u64, Option<u64>)> {
        self.registered.iter().map(|(offset, block)| (*offset, block.len, block.alias.as_ref().map(Alias::address))).collect()
    }

    /// Checks that `[offset, offset + len)` is inside the segment and pinned (staging or a
    /// registered block), so DMA may use it, and gives the address it is pinned at here.
    pub fn pinned(&self, offset: u64, len: u64) -> CudaResult<*mut u8> {
        let end = offset.checked_add(len).filter(|end| *end <= self.size).ok_or(CudaError::INVALID_VALUE)?;
        if end <= self.staging {
            return Ok(self.ptr(offset));
        }
        match self.registered.range(..=offset).next_back() {
            Some((start, block)) if end <= start + block.len => Ok(self.pinned_at(*start, block).wrapping_add((offset - start) as usize)),
            _ => Err(CudaError::INVALID_VALUE),
        }
    }

    /// Records a block to pin; it must be page aligned, inside the segment, outside staging and
    /// apart from every other block. With `address` (the client's address of the block), the
    /// block is also mapped there if that is free here; the caller then pins that mapping.
    /// Gives the address to pin: the alias or the segment's own view.
    pub fn add_block(&mut self, offset: u64, len: u64, address: Option<u64>) -> CudaResult<*mut u8> {
        let end = offset.checked_add(len).filter(|end| *end <= self.size).ok_or(CudaError::INVALID_VALUE)?;
        if len == 0 || !offset.is_multiple_of(PAGE) || offset < self.staging {
            return Err(CudaError::INVALID_VALUE);
        }
        let overlaps_before = self.registered.range(..offset).next_back().is_some_and(|(start, block)| start + block.len > offset);
        let overlaps_after = self.registered.range(offset..end).next().is_some();
        if overlaps_before || overlaps_after {
            return Err(CudaError::HOST_MEMORY_ALREADY_REGISTERED);
        }
        let block = Block { len, alias: address.and_then(|address| Alias::map(&self.file, self.file_offset + offset, len, address)) };
        let pinned = self.pinned_at(offset, &block);
        self.registered.insert(offset, block);
        Ok(pinned)
    }

    /// Where the block at `offset` is pinned: its alias, or the segment's own view of it.
    fn pinned_at(&self, offset: u64, block: &Block) -> *mut u8 {
        block.alias.as_ref().map_or_else(|| self.ptr(offset), |alias| alias.address() as *mut u8)
    }

    /// Whether `[address, address + len)` lies inside one block mapped at the client's address
    /// (memory kernels and memsets may use, as device memory).
    pub fn aliases(&self, address: u64, len: u64) -> bool {
        let Some(end) = address.checked_add(len) else { return false };
        self.registered.values().filter_map(|block| block.alias.as_ref()).chain(self.files.values()).any(|alias| {
            let start = alias.address();
            address >= start && end <= start + alias.len as u64
        })
    }

    /// The client's address of the block at `offset`, when the block is mapped there.
    pub fn alias(&self, offset: u64) -> Option<u64> {
        self.registered.get(&offset)?.alias.as_ref().map(Alias::address)
    }

    /// Gives up a block's alias (after its pinning there failed): the segment's view is pinned instead.
    pub fn drop_alias(&mut self, offset: u64) -> Option<*mut u8> {
        let block = self.registered.get_mut(&offset)?;
        block.alias = None;
        Some(self.ptr(offset))
    }

    /// Forgets a block, giving the address it was pinned at; `None` if no block starts at
    /// `offset`. Its alias, if any, stays mapped until the returned guard is dropped, so the
    /// caller unpins it first.
    pub fn remove_block(&mut self, offset: u64) -> Option<(*mut u8, Option<Alias>)> {
        let block = self.registered.remove(&offset)?;
        Some((self.pinned_at(offset, &block), block.alias))
    }

    /// Maps `len` bytes of the app's `file` from `offset` at the app's `address`, where its own
    /// shared mapping of the file is; the address to pin (mapped). `NOT_SUPPORTED` when that
    /// address is taken here or the file cannot be mapped so (say, a read-only descriptor).
    pub fn add_file(&mut self, file: &File, offset: u64, len: u64, address: u64) -> CudaResult<*mut u8> {
        if len == 0 || !offset.is_multiple_of(PAGE) || !address.is_multiple_of(PAGE) {
            return Err(CudaError::INVALID_VALUE);
        }
        let alias = Alias::map(file, offset, len, address).ok_or(CudaError::NOT_SUPPORTED)?;
        self.files.insert(address, alias);
        Ok(address as *mut u8)
    }

    /// Forgets the file mapped at `address`; it stays mapped until the returned guard is dropped,
    /// so the caller unpins it first.
    pub fn remove_file(&mut self, address: u64) -> Option<Alias> {
        self.files.remove(&address)
    }

    /// Whether any file of the app is mapped here.
    pub fn has_files(&self) -> bool {
        !self.files.is_empty()
    }

    /// Every pinned address, staging first, for unpinning at the end.
    pub fn pinned_blocks(&self) -> Vec<*mut u8> {
        self.pins().into_iter().map(|pin| pin.ptr).collect()
    }

    /// Every pinned range, staging first: the staging area and blocks without an alias are
    /// pinned only, blocks with one are also mapped for the device (at the alias).
    pub fn pins(&self) -> Vec<Pin> {
        let staging = (self.staging > 0).then(|| Pin { ptr: self.ptr(0), len: self.staging as usize, mapped: false });
        let blocks = self.registered.iter().map(|(offset, block)| Pin {
            ptr: self.pinned_at(*offset, block),
            len: block.len as usize,
            mapped: block.alias.is_some(),
        });
        let files = self.files.values().map(|alias| Pin { ptr: alias.address() as *mut u8, len: alias.len, mapped: true });
        staging.into_iter().chain(blocks).chain(files).collect()
    }
}

/// A pinned range of the segment (see [`Segment::pins`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pin {
    pub ptr: *mut u8,
    pub len: usize,
    pub mapped: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment() -> Segment {
        let fd = nix::sys::memfd::memfd_create(c"test", nix::sys::memfd::MFdFlags::MFD_ALLOW_SEALING).unwrap();
        let file = File::from(fd);
        file.set_len(64 * PAGE).unwrap();
        Segment::map(file, 64 * PAGE, 8 * PAGE, true).unwrap()
    }

    /// An address range that was free a moment ago.
    fn free_address(len: u64) -> u64 {
        let map = memmap2::MmapMut::map_anon(len as usize).unwrap();
        map.as_ptr() as u64
    }

    #[test]
    fn only_pinned_ranges_inside_the_segment_pass() {
        let mut segment = segment();
        assert_eq!(segment.pinned(0, 8 * PAGE), Ok(segment.ptr(0)));
        assert_eq!(segment.pinned(8 * PAGE, 1), Err(CudaError::INVALID_VALUE));
        assert_eq!(segment.add_block(16 * PAGE, 4 * PAGE, None), Ok(segment.ptr(16 * PAGE)));
        assert_eq!(segment.pinned(17 * PAGE, PAGE), Ok(segment.ptr(17 * PAGE)));
        assert_eq!(segment.pinned(19 * PAGE, PAGE + 1), Err(CudaError::INVALID_VALUE));
        assert_eq!(segment.pinned(u64::MAX, 2), Err(CudaError::INVALID_VALUE));
        assert_eq!(segment.add_block(18 * PAGE, PAGE, None), Err(CudaError::HOST_MEMORY_ALREADY_REGISTERED));
        assert_eq!(segment.add_block(12 * PAGE, 8 * PAGE, None), Err(CudaError::HOST_MEMORY_ALREADY_REGISTERED));
        assert_eq!(segment.add_block(4 * PAGE, PAGE, None), Err(CudaError::INVALID_VALUE), "staging is not a block");
        assert_eq!(segment.add_block(60 * PAGE, 8 * PAGE, None), Err(CudaError::INVALID_VALUE), "past the end");
        assert_eq!(segment.add_block(30 * PAGE + 1, PAGE, None), Err(CudaError::INVALID_VALUE), "unaligned");
        assert_eq!(segment.remove_block(16 * PAGE).map(|(pinned, alias)| (pinned, alias.is_none())), Some((segment.ptr(16 * PAGE), true)));
        assert_eq!(segment.pinned(17 * PAGE, PAGE), Err(CudaError::INVALID_VALUE));
    }

    #[test]
    fn a_block_is_mapped_at_the_clients_address_when_it_is_free() {
        let mut segment = segment();
        // Tests run on parallel threads: another may map the range between its release and the
        // block's mapping, and then the block rightly stays at the segment's view. Try again.
        let address = (0..20)
            .find_map(|_| {
                let address = free_address(2 * PAGE);
                match segment.add_block(20 * PAGE, 2 * PAGE, Some(address)) {
                    Ok(mapped) if mapped as u64 == address => Some(address),
                    Ok(_) => {
                        segment.remove_block(20 * PAGE).expect("the block just added");
                        None
                    }
                    Err(error) => panic!("add_block: {error:?}"),
                }
            })
            .expect("a free range was never mapped at its address");
        assert_eq!(segment.alias(20 * PAGE), Some(address));
        assert_eq!(segment.pinned(21 * PAGE + 8, 16), Ok((address + PAGE + 8) as *mut u8));
        // The same pages: what the segment's view holds, the alias shows.
        // SAFETY: both pointers lie in live mappings of the same two pages.
        unsafe {
            segment.ptr(21 * PAGE).write(0x5a);
            assert_eq!(((address + PAGE) as *const u8).read(), 0x5a);
        }
        assert!(segment.aliases(address + 100, PAGE));
        assert!(!segment.aliases(address + PAGE, PAGE + 1), "past the block");
        assert!(!segment.aliases(segment.ptr(20 * PAGE) as u64, 1), "the segment's own view is not the client's address");
        let (pinned, alias) = segment.remove_block(20 * PAGE).unwrap();
        assert_eq!(pinned, address as *mut u8);
        drop(alias);
        assert_eq!(segment.pinned(20 * PAGE, 1), Err(CudaError::INVALID_VALUE));

        // Where something of this process lies (the segment's own mapping) nothing is replaced;
        // nor is an unaligned or out-of-range address used.
        let taken = segment.ptr(0) as u64;
        for address in [taken, address + 1, 0, 1 << 47] {
            assert_eq!(segment.add_block(30 * PAGE, PAGE, Some(address)), Ok(segment.ptr(30 * PAGE)), "{address:#x}");
            assert_eq!(segment.alias(30 * PAGE), None);
            segment.remove_block(30 * PAGE);
        }
        // SAFETY: the segment's first page is still its own mapping, untouched.
        assert_eq!(unsafe { segment.ptr(0).read() }, 0);
    }

    #[test]
    fn a_segment_shorter_than_offered_is_refused() {
        let fd = nix::sys::memfd::memfd_create(c"short", nix::sys::memfd::MFdFlags::MFD_ALLOW_SEALING).unwrap();
        let file = File::from(fd);
        file.set_len(PAGE).unwrap();
        assert!(Segment::map(file, 64 * PAGE, 0, true).unwrap_err().contains("holds 4096 bytes"));
    }
}
