//! The server's side of a session's shared-memory segment: the client's memory, mapped here too
//! and pinned for DMA, so copies from or to it need no socket and no extra copy. Every offset the
//! client sends is checked against the segment and against what is pinned.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;

/// Pinned blocks are page aligned (the client allocates them so).
const PAGE: u64 = 4096;

/// A mapped segment.
#[derive(Debug)]
pub struct Segment {
    map: memmap2::MmapRaw,
    size: u64,
    staging: u64,
    /// Blocks pinned on the client's request: offset -> length.
    registered: BTreeMap<u64, u64>,
}

impl Segment {
    /// Maps a segment of `size` bytes whose first `staging` bytes are the staging area. A memfd
    /// is sealed against shrinking first, so the client cannot make the mapping fault under us.
    pub fn map(file: &File, size: u64, staging: u64, memfd: bool) -> Result<Self, String> {
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
        if actual < size {
            return Err(format!("the segment holds {actual} bytes, not the {size} offered"));
        }
        let len = usize::try_from(size).map_err(|_| "segment too large".to_string())?;
        let map = memmap2::MmapOptions::new().len(len).map_raw(file).map_err(|error| format!("mapping the segment: {error}"))?;
        // Ask for huge pages where the kernel allows them for shared memory: DMA from pinned
        // memory in 4 KiB pages was measured slower (43 GB/s for 64 MiB) than native pinned
        // memory (55 GB/s). Refused or unsupported, it changes nothing.
        // SAFETY: advice on a mapping this struct owns; it never changes the mapping's contents.
        let _ = unsafe { libc::madvise(map.as_mut_ptr().cast(), len, libc::MADV_HUGEPAGE) };
        Ok(Self { map, size, staging, registered: BTreeMap::new() })
    }

    /// Where `offset` lies in this process.
    pub fn ptr(&self, offset: u64) -> *mut u8 {
        // `offset <= size` is checked by every caller before the pointer is used.
        self.map.as_mut_ptr().wrapping_add(usize::try_from(offset).unwrap_or(usize::MAX))
    }

    pub fn staging(&self) -> u64 {
        self.staging
    }

    /// Checks that `[offset, offset + len)` is inside the segment and pinned (staging or a
    /// registered block), so DMA may use it.
    pub fn check_pinned(&self, offset: u64, len: u64) -> CudaResult<()> {
        let end = offset.checked_add(len).filter(|end| *end <= self.size).ok_or(CudaError::INVALID_VALUE)?;
        if end <= self.staging {
            return Ok(());
        }
        match self.registered.range(..=offset).next_back() {
            Some((start, block)) if end <= start + block => Ok(()),
            _ => Err(CudaError::INVALID_VALUE),
        }
    }

    /// Records a block to pin; it must be page aligned, inside the segment, outside staging and
    /// apart from every other block.
    pub fn add_block(&mut self, offset: u64, len: u64) -> CudaResult<()> {
        let end = offset.checked_add(len).filter(|end| *end <= self.size).ok_or(CudaError::INVALID_VALUE)?;
        if len == 0 || !offset.is_multiple_of(PAGE) || offset < self.staging {
            return Err(CudaError::INVALID_VALUE);
        }
        let overlaps_before = self.registered.range(..offset).next_back().is_some_and(|(start, block)| start + block > offset);
        let overlaps_after = self.registered.range(offset..end).next().is_some();
        if overlaps_before || overlaps_after {
            return Err(CudaError::HOST_MEMORY_ALREADY_REGISTERED);
        }
        self.registered.insert(offset, len);
        Ok(())
    }

    /// Forgets a block; `None` if no block starts at `offset`.
    pub fn remove_block(&mut self, offset: u64) -> Option<u64> {
        self.registered.remove(&offset)
    }

    /// Every pinned block, staging first, for unpinning at the end.
    pub fn pinned_blocks(&self) -> Vec<u64> {
        std::iter::once(0).filter(|_| self.staging > 0).chain(self.registered.keys().copied()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment() -> Segment {
        let fd = nix::sys::memfd::memfd_create(c"test", nix::sys::memfd::MFdFlags::MFD_ALLOW_SEALING).unwrap();
        let file = File::from(fd);
        file.set_len(64 * PAGE).unwrap();
        Segment::map(&file, 64 * PAGE, 8 * PAGE, true).unwrap()
    }

    #[test]
    fn only_pinned_ranges_inside_the_segment_pass() {
        let mut segment = segment();
        assert_eq!(segment.check_pinned(0, 8 * PAGE), Ok(()));
        assert_eq!(segment.check_pinned(8 * PAGE, 1), Err(CudaError::INVALID_VALUE));
        segment.add_block(16 * PAGE, 4 * PAGE).unwrap();
        assert_eq!(segment.check_pinned(17 * PAGE, PAGE), Ok(()));
        assert_eq!(segment.check_pinned(19 * PAGE, PAGE + 1), Err(CudaError::INVALID_VALUE));
        assert_eq!(segment.check_pinned(u64::MAX, 2), Err(CudaError::INVALID_VALUE));
        assert_eq!(segment.add_block(18 * PAGE, PAGE), Err(CudaError::HOST_MEMORY_ALREADY_REGISTERED));
        assert_eq!(segment.add_block(12 * PAGE, 8 * PAGE), Err(CudaError::HOST_MEMORY_ALREADY_REGISTERED));
        assert_eq!(segment.add_block(4 * PAGE, PAGE), Err(CudaError::INVALID_VALUE), "staging is not a block");
        assert_eq!(segment.add_block(60 * PAGE, 8 * PAGE), Err(CudaError::INVALID_VALUE), "past the end");
        assert_eq!(segment.add_block(30 * PAGE + 1, PAGE), Err(CudaError::INVALID_VALUE), "unaligned");
        assert_eq!(segment.remove_block(16 * PAGE), Some(4 * PAGE));
        assert_eq!(segment.check_pinned(17 * PAGE, PAGE), Err(CudaError::INVALID_VALUE));
    }

    #[test]
    fn a_segment_shorter_than_offered_is_refused() {
        let fd = nix::sys::memfd::memfd_create(c"short", nix::sys::memfd::MFdFlags::MFD_ALLOW_SEALING).unwrap();
        let file = File::from(fd);
        file.set_len(PAGE).unwrap();
        assert!(Segment::map(&file, 64 * PAGE, 0, true).unwrap_err().contains("holds 4096 bytes"));
    }
}
