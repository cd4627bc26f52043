//! Module images as the app hands them over: a pointer with no length. The driver API accepts a
//! fat binary (bare or inside nvcc's `__fatBinC_Wrapper_t`), an ELF cubin or PTX text; each says
//! how long it is in its own way, and the bytes are what travel to the server.

use std::ffi::c_void;
use std::sync::Arc;

/// `__fatBinC_Wrapper_t`'s magic.
const WRAPPER_MAGIC: u32 = 0x466243b1;
/// A fat binary's magic.
const FATBIN_MAGIC: u32 = 0xBA55ED50;
const ELF_MAGIC: [u8; 4] = *b"\x7fELF";
/// ELF's `SHT_NOBITS`: a section with no bytes in the file.
const SHT_NOBITS: u32 = 8;
/// No module image is larger: a length past this is a pointer to something else.
const MAX_IMAGE: u64 = 4 << 30;

/// An image's bytes: the app's own (nvcc's registered fat binaries live in the executable for the
/// life of the process, and `CU_LIBRARY_BINARY_IS_PRESERVED` promises the same), or a copy.
#[derive(Clone)]
pub enum Image {
    Static { ptr: *const u8, len: usize },
    Owned(Arc<[u8]>),
}

// SAFETY: a static image is read-only memory the app keeps mapped and unchanged for the life of
// the process (its executable's `.nv_fatbin`, or a buffer it promised to preserve); sharing the
// pointer between threads only shares read access. An owned image is an `Arc<[u8]>`.
unsafe impl Send for Image {}
// SAFETY: as above.
unsafe impl Sync for Image {}

impl Image {
    pub fn bytes(&self) -> &[u8] {
        match self {
            // SAFETY: `ptr..ptr+len` was sized by `image_len` and stays mapped and unchanged (the
            // type's invariant).
            Image::Static { ptr, len } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
            Image::Owned(bytes) => bytes,
        }
    }
}

/// What an image pointer holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    FatBinary,
    Elf,
    Ptx,
}

/// Reads the image at `ptr` as the driver would: unwraps a `__fatBinC_Wrapper_t`, then sizes a fat
/// binary from its header, an ELF cubin from its section and program headers, or PTX text up to
/// and including its NUL. Returns the image's start, length and kind, or `None` for NULL or a
/// length past any real image.
///
/// # Safety
/// `ptr` is NULL or points at a module image, readable to its end, as the driver API requires of
/// the `image` argument of `cuModuleLoadData`.
pub unsafe fn image_len(ptr: *const c_void) -> Option<(*const u8, usize, Kind)> {
    if ptr.is_null() {
        return None;
    }
    let mut data = ptr.cast::<u8>();
    // SAFETY: every image kind is at least 4 bytes long (a PTX text is at least its NUL, and the
    // reads below stop at it).
    let magic = unsafe { data.cast::<u32>().read_unaligned() };
    if magic == WRAPPER_MAGIC {
        // SAFETY: `{ int magic; int version; const unsigned long long *data; void *filename_or_fatbins; }`.
        data = unsafe { data.add(8).cast::<*const u8>().read_unaligned() };
        if data.is_null() {
            return None;
        }
    }
    // SAFETY: as above, for the wrapped image too.
    let head = unsafe { std::slice::from_raw_parts(data, 4) };
    if head == FATBIN_MAGIC.to_le_bytes() {
        // SAFETY: a fat binary header: `u32 magic, u16 version, u16 header_size, u64 fat_size`.
        let (header_size, fat_size) = unsafe { (data.add(6).cast::<u16>().read_unaligned(), data.add(8).cast::<u64>().read_unaligned()) };
        let len = fat_size.checked_add(u64::from(header_size)).filter(|len| *len <= MAX_IMAGE)?;
        return Some((data, len as usize, Kind::FatBinary));
    }
    if head == ELF_MAGIC {
        // SAFETY: an ELF image, readable to its end, which its headers describe.
        let len = unsafe { elf_len(data) }.filter(|len| *len <= MAX_IMAGE)?;
        return Some((data, len as usize, Kind::Elf));
    }
    // SAFETY: anything else is PTX text, NUL-terminated per the caller's contract.
    let text = unsafe { std::ffi::CStr::from_ptr(data.cast()) };
    let len = text.to_bytes_with_nul().len();
    Some((data, len, Kind::Ptx))
}

/// An ELF64 image's length: the furthest end of its headers and of every section with bytes.
///
/// # Safety
/// `data` points at an ELF image readable to its end.
unsafe fn elf_len(data: *const u8) -> Option<u64> {
    // SAFETY: fields of the 64-byte ELF64 header, then of the tables it locates (read only after
    // checking they lie within a plausible image).
    unsafe {
        let u16_at = |offset: usize| u64::from(data.add(offset).cast::<u16>().read_unaligned());
        let u32_at = |offset: u64| data.add(offset as usize).cast::<u32>().read_unaligned();
        let u64_at = |offset: u64| data.add(offset as usize).cast::<u64>().read_unaligned();
        if *data.add(4) != 2 {
            return None; // not ELFCLASS64
        }
        let (ph_offset, sh_offset) = (u64_at(0x20), u64_at(0x28));
        let (ph_size, ph_count) = (u16_at(0x36), u16_at(0x38));
        let (sh_size, sh_count) = (u16_at(0x3A), u16_at(0x3C));
        let ph_end = ph_offset.checked_add(ph_size * ph_count)?;
        let sh_end = sh_offset.checked_add(sh_size * sh_count)?;
        let mut end = 64u64.max(ph_end).max(sh_end);
        if end > MAX_IMAGE || sh_size < 0x28 {
            return None;
        }
        for index in 0..sh_count {
            let header = sh_offset + index * sh_size;
            if u32_at(header + 4) == SHT_NOBITS {
                continue;
            }
            end = end.max(u64_at(header + 0x18).checked_add(u64_at(header + 0x20))?);
        }
        for index in 0..ph_count {
            let header = ph_offset + index * ph_size;
            end = end.max(u64_at(header + 8).checked_add(u64_at(header + 0x20))?);
        }
        Some(end)
    }
}

/// The image at `ptr`, kept as the app's own bytes when `preserved`, else copied.
///
/// # Safety
/// As for [`image_len`]; with `preserved`, the bytes also stay mapped and unchanged for the life of
/// the process.
pub unsafe fn image(ptr: *const c_void, preserved: bool) -> Option<(Image, Kind)> {
    // SAFETY: forwarded contract.
    let (data, len, kind) = unsafe { image_len(ptr) }?;
    let image = if preserved {
        Image::Static { ptr: data, len }
    } else {
        // SAFETY: `data..data+len` is the image, readable per the contract.
        Image::Owned(Arc::from(unsafe { std::slice::from_raw_parts(data, len) }))
    };
    Some((image, kind))
}

/// An image read from a file (`cuModuleLoad`, `cuLibraryLoadFromFile`): the file is read on the
/// client, where the app named it.
pub fn image_from_file(path: &std::path::Path) -> std::io::Result<(Image, Kind)> {
    let mut bytes = std::fs::read(path)?;
    let kind = if bytes.starts_with(&FATBIN_MAGIC.to_le_bytes()) {
        Kind::FatBinary
    } else if bytes.starts_with(&ELF_MAGIC) {
        Kind::Elf
    } else {
        // PTX text: the driver reads it up to a NUL.
        if bytes.last() != Some(&0) {
            bytes.push(0);
        }
        Kind::Ptx
    };
    Ok((Image::Owned(Arc::from(bytes)), kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fatbin(payload: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
        bytes.extend_from_slice(&1u16.to_le_bytes());
        bytes.extend_from_slice(&16u16.to_le_bytes());
        bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        bytes.extend_from_slice(payload);
        bytes.extend_from_slice(b"trailing bytes that are not part of the image");
        bytes
    }

    #[test]
    fn fat_binaries_are_sized_by_their_header_bare_or_wrapped() {
        let bytes = fatbin(&[7u8; 100]);
        // SAFETY: a complete fat binary.
        let (start, len, kind) = unsafe { image_len(bytes.as_ptr().cast()) }.unwrap();
        assert_eq!((start, len, kind), (bytes.as_ptr(), 116, Kind::FatBinary));
        #[repr(C)]
        struct Wrapper {
            magic: u32,
            version: u32,
            data: *const u8,
            filename: *const u8,
        }
        let wrapper = Wrapper { magic: WRAPPER_MAGIC, version: 1, data: bytes.as_ptr(), filename: std::ptr::null() };
        // SAFETY: a wrapper around the fat binary above.
        let (image, kind) = unsafe { image((&raw const wrapper).cast(), false) }.unwrap();
        assert_eq!(kind, Kind::FatBinary);
        assert_eq!(image.bytes(), &bytes[..116]);
    }

    #[test]
    fn ptx_is_read_through_its_nul() {
        let text = b".version 8.0\n.target sm_90\n\0garbage";
        // SAFETY: NUL-terminated text.
        let (_, len, kind) = unsafe { image_len(text.as_ptr().cast()) }.unwrap();
        assert_eq!((len, kind), (28, Kind::Ptx));
    }

    #[test]
    fn elf_images_end_at_their_last_section_or_header() {
        // A 64-byte header, one 0x40-byte section header table at 0x100 with two entries: one
        // section of bytes at 0x80..0xC0, one NOBITS section claiming far more.
        let mut bytes = vec![0u8; 0x200];
        bytes[..4].copy_from_slice(&ELF_MAGIC);
        bytes[4] = 2;
        bytes[0x28..0x30].copy_from_slice(&0x100u64.to_le_bytes());
        bytes[0x3A..0x3C].copy_from_slice(&0x40u16.to_le_bytes());
        bytes[0x3C..0x3E].copy_from_slice(&2u16.to_le_bytes());
        let section = 0x100;
        bytes[section + 4..section + 8].copy_from_slice(&1u32.to_le_bytes());
        bytes[section + 0x18..section + 0x20].copy_from_slice(&0x80u64.to_le_bytes());
        bytes[section + 0x20..section + 0x28].copy_from_slice(&0x40u64.to_le_bytes());
        let nobits = 0x140;
        bytes[nobits + 4..nobits + 8].copy_from_slice(&SHT_NOBITS.to_le_bytes());
        bytes[nobits + 0x18..nobits + 0x20].copy_from_slice(&0x1000u64.to_le_bytes());
        bytes[nobits + 0x20..nobits + 0x28].copy_from_slice(&0x1000u64.to_le_bytes());
        // SAFETY: the image above, readable to its end.
        let (_, len, kind) = unsafe { image_len(bytes.as_ptr().cast()) }.unwrap();
        assert_eq!((len, kind), (0x180, Kind::Elf));
    }

    #[test]
    fn absurd_lengths_and_null_are_refused() {
        let mut bytes = fatbin(&[]);
        bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        // SAFETY: a fat binary header (claiming an impossible length).
        assert!(unsafe { image_len(bytes.as_ptr().cast()) }.is_none());
        // SAFETY: NULL.
        assert!(unsafe { image_len(std::ptr::null()) }.is_none());
    }
}
