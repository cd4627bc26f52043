//! An ivshmem region: the memory a virtual machine's guest shares with its host, in which each of
//! the guest's Flyt sessions takes a slot for its shared-memory segment (pinned blocks, staging,
//! message rings).
//!
//! The host makes one region per VM: a file that QEMU maps into the guest as the BAR of an
//! `ivshmem-plain` PCI device (vendor 0x1af4, device 0x1110, `resource2` in sysfs) and that the
//! rpc-server maps too. Beside it, a token file only the host can read holds the region's secret.
//! The guest reads the same secret from the region's header (the guest sees only its own region),
//! and presents it when it offers a slot: a guest cannot name another VM's region, whose secret it
//! never saw. Everything in the region is writable by the guest, so the server trusts nothing
//! in it but what it checks (the token against the host's copy, offsets against the file).
//!
//! Layout: two header pages at 0 (magic, version, geometry, name, token, then one cache line per
//! slot holding the guest pid that owns it, 0 when free); the slots start at [`FIRST_SLOT`]
//! (huge-page aligned) and are `slot_size` bytes each.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

const MAGIC: [u8; 8] = *b"FLYTVMR1";
const VERSION: u32 = 1;
/// Where the first slot starts: after the header, on a 2 MiB boundary.
pub const FIRST_SLOT: u64 = 2 << 20;
/// Most slots (sessions at once) a region holds.
pub const MAX_SLOTS: u32 = 64;
/// Smallest slot: the staging area and rings of a session need most of it.
pub const MIN_SLOT: u64 = 96 << 20;
const NAME_LEN: usize = 64;
const TOKEN_LEN: usize = 64;
const OWNERS_AT: usize = 256;
const HEADER_PAGE: usize = 8192;
const _: () = assert!(OWNERS_AT + MAX_SLOTS as usize * 64 <= HEADER_PAGE);

/// The vendor and device ids of QEMU's ivshmem PCI device.
pub const PCI_VENDOR: &str = "0x1af4";
pub const PCI_DEVICE: &str = "0x1110";

/// What the header says, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub name: String,
    pub token: String,
    pub size: u64,
    pub slot_size: u64,
    pub slots: u32,
}

impl Geometry {
    /// Where slot `index` starts.
    pub fn slot_offset(&self, index: u32) -> u64 {
        FIRST_SLOT + u64::from(index) * self.slot_size
    }
}

/// A region name: what the host and the guest call the VM's region (file names in the server's
/// region folder, so nothing that could leave it).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() < NAME_LEN
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The token file beside region `name` in `dir`.
pub fn token_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.token"))
}

/// Host side: makes region `name` in `dir` (`size` bytes, `slots` sessions at most), writes its
/// header and token file (both owner-only), and returns the region file's path. An existing
/// region of that name is replaced: the VM using it must be stopped.
pub fn create(dir: &Path, name: &str, size: u64, slots: u32) -> io::Result<PathBuf> {
    let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidInput, what);
    if !valid_name(name) {
        return Err(invalid(format!("region name '{name}': use letters, digits, '-', '_' and '.' (at most 63)")));
    }
    if !(1..=MAX_SLOTS).contains(&slots) {
        return Err(invalid(format!("{slots} sessions: a region holds 1 to {MAX_SLOTS}")));
    }
    if !size.is_power_of_two() {
        return Err(invalid(format!("{size} bytes: an ivshmem BAR is a power of two in size")));
    }
    let slot_size = (size.saturating_sub(FIRST_SLOT) / u64::from(slots)) / FIRST_SLOT * FIRST_SLOT;
    if slot_size < MIN_SLOT {
        return Err(invalid(format!(
            "{size} bytes for {slots} sessions leaves {slot_size} bytes each; each needs {MIN_SLOT} (use a larger size or fewer sessions)"
        )));
    }
    let mut secret = [0u8; TOKEN_LEN / 2];
    File::open("/dev/urandom").and_then(|mut random| io::Read::read_exact(&mut random, &mut secret))?;
    let token: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::create_dir_all(dir)?;
    let path = dir.join(name);
    let owner_only = |path: &Path| {
        std::os::unix::fs::OpenOptionsExt::mode(std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true), 0o600)
            .open(path)
    };
    let file = owner_only(&path)?;
    if !pinnable(&file)? {
        let _ = std::fs::remove_file(&path);
        return Err(invalid(format!(
            "{}: not in shared memory (tmpfs such as /dev/shm, or hugetlbfs): the GPU could not pin it",
            dir.display()
        )));
    }
    file.set_len(size)?;
    let mut header = vec![0u8; HEADER_PAGE];
    header[..8].copy_from_slice(&MAGIC);
    header[8..12].copy_from_slice(&VERSION.to_le_bytes());
    header[12..16].copy_from_slice(&slots.to_le_bytes());
    header[16..24].copy_from_slice(&size.to_le_bytes());
    header[24..32].copy_from_slice(&slot_size.to_le_bytes());
    header[32..40].copy_from_slice(&FIRST_SLOT.to_le_bytes());
    header[40..40 + name.len()].copy_from_slice(name.as_bytes());
    header[40 + NAME_LEN..40 + NAME_LEN + TOKEN_LEN].copy_from_slice(token.as_bytes());
    std::os::unix::fs::FileExt::write_all_at(&file, &header, 0)?;
    std::io::Write::write_all(&mut owner_only(&token_path(dir, name))?, token.as_bytes())?;
    Ok(path)
}

/// Host side, for a region an operator declares (the node manager's `ivshmem_regions`): makes
/// region `name` if it is not there, and keeps it if it is, with its token, so a VM that has it
/// mapped keeps working across restarts. Whether it was made now. A region that exists with
/// another size or session count is an error: remaking it would cut off the VM that uses it.
pub fn ensure(dir: &Path, name: &str, size: u64, slots: u32) -> io::Result<(PathBuf, bool)> {
    let path = dir.join(name);
    if !path.exists() {
        return create(dir, name, size, slots).map(|path| (path, true));
    }
    let existing = GuestRegion::open(&path)?.geometry;
    if existing.size != size || existing.slots != slots || existing.name != name || host_token(dir, name).is_err() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "region {name} exists as {} MiB for {} sessions{}, not {} MiB for {slots}: remake it (remove {} and its .token) while its VM is stopped",
                existing.size >> 20,
                existing.slots,
                if host_token(dir, name).is_err() { ", without its token file" } else { "" },
                size >> 20,
                path.display()
            ),
        ));
    }
    Ok((path, false))
}

/// The QEMU options that give a VM region `name` at `path`, of `size` bytes.
pub fn qemu_options(path: &Path, name: &str, size: u64) -> String {
    format!(
        "-object memory-backend-file,id=flyt-{name},share=on,mem-path={},size={}M -device ivshmem-plain,memdev=flyt-{name}",
        path.display(),
        size >> 20
    )
}

/// Host side: whether the region file lives in memory the GPU driver can pin (tmpfs, as
/// `/dev/shm`, or hugetlbfs). The kernel refuses long-term pins of a disk file's pages, so a
/// region elsewhere would fail at the first pin with a bare "invalid argument".
pub fn pinnable(file: &File) -> io::Result<bool> {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;
    // SAFETY: all-zero is a valid statfs to be filled.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs fills the struct for a descriptor this process owns.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &raw mut stat) } != 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(clippy::useless_conversion, reason = "f_type's width differs between targets")]
    let kind = i64::from(stat.f_type);
    Ok(kind == TMPFS_MAGIC || kind == HUGETLBFS_MAGIC)
}

/// Host side: the secret of region `name` in `dir`, from the token file only the host reads.
pub fn host_token(dir: &Path, name: &str) -> io::Result<String> {
    Ok(std::fs::read_to_string(token_path(dir, name))?.trim().to_owned())
}

/// Compares two secrets in time that does not depend on where they differ.
pub fn same_token(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Guest side: the region's file (the device's `resource2`, or a plain file in tests) with its
/// header page mapped.
pub struct GuestRegion {
    pub file: File,
    pub path: PathBuf,
    pub geometry: Geometry,
    header: memmap2::MmapRaw,
}

impl GuestRegion {
    /// Opens and checks the region at `path`.
    pub fn open(path: &Path) -> io::Result<Self> {
        let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {what}", path.display()));
        let file = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
        let len = file.metadata()?.len();
        if len < FIRST_SLOT {
            return Err(bad("too small to be a Flyt region"));
        }
        let header = memmap2::MmapOptions::new().len(HEADER_PAGE).map_raw(&file)?;
        let mut bytes = [0u8; OWNERS_AT];
        // SAFETY: the mapping holds HEADER_PAGE >= OWNERS_AT bytes; a racing writer (the guest's
        // own other processes write only the owner words, past OWNERS_AT) changes nothing read.
        unsafe { std::ptr::copy_nonoverlapping(header.as_ptr(), bytes.as_mut_ptr(), OWNERS_AT) };
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default());
        let text = |at: usize, len: usize| {
            let raw = &bytes[at..at + len];
            String::from_utf8_lossy(&raw[..raw.iter().position(|&b| b == 0).unwrap_or(len)]).into_owned()
        };
        if bytes[..8] != MAGIC {
            return Err(bad("not a Flyt region (no header; was it made with `flytctl ivshmem create`?)"));
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().unwrap_or_default());
        if version != VERSION {
            return Err(bad(&format!("region version {version}, this client reads {VERSION}")));
        }
        let slots = u32::from_le_bytes(bytes[12..16].try_into().unwrap_or_default());
        let geometry =
            Geometry { name: text(40, NAME_LEN), token: text(40 + NAME_LEN, TOKEN_LEN), size: word(16), slot_size: word(24), slots };
        let end = u64::from(slots).checked_mul(geometry.slot_size).and_then(|bytes| bytes.checked_add(FIRST_SLOT));
        if !(1..=MAX_SLOTS).contains(&slots)
            || word(32) != FIRST_SLOT
            || geometry.slot_size < MIN_SLOT
            || !geometry.slot_size.is_multiple_of(FIRST_SLOT)
            || end.is_none_or(|end| end > geometry.size || end > len)
            || !valid_name(&geometry.name)
        {
            return Err(bad("the region's header is damaged"));
        }
        Ok(Self { file, path: path.to_owned(), geometry, header })
    }

    fn owner(&self, index: u32) -> &AtomicU64 {
        let at = OWNERS_AT + index as usize * 64;
        // SAFETY: `index < slots <= MAX_SLOTS`, so the 8-aligned word lies in the header page,
        // which this struct keeps mapped; it is only accessed atomically.
        unsafe { &*self.header.as_ptr().add(at).cast::<AtomicU64>() }
    }

    /// Takes a free slot for this process (or one whose owner process is gone) and returns its
    /// index; the slot stays this process's until [`release`](Self::release) or its exit.
    pub fn claim(&self) -> io::Result<u32> {
        let me = u64::from(std::process::id());
        for index in 0..self.geometry.slots {
            let owner = self.owner(index);
            let current = owner.load(Ordering::Acquire);
            let free = current == 0 || (current != me && !process_alive(current));
            if free && owner.compare_exchange(current, me, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                return Ok(index);
            }
        }
        Err(io::Error::new(
            io::ErrorKind::ResourceBusy,
            format!("all {} session slots of region {} are taken", self.geometry.slots, self.geometry.name),
        ))
    }

    /// Gives slot `index` back if this process still owns it.
    pub fn release(&self, index: u32) {
        if index < self.geometry.slots {
            let _ = self.owner(index).compare_exchange(u64::from(std::process::id()), 0, Ordering::AcqRel, Ordering::Relaxed);
        }
    }
}

/// Whether a process of this kernel (the guest's) with that pid exists.
fn process_alive(pid: u64) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let result = unsafe { libc::kill(pid, 0) };
    result == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Guest side: the ivshmem devices the kernel lists (their `resource2` files), for a client told
/// to find its region itself.
pub fn find_devices() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/sys/bus/pci/devices") else { return Vec::new() };
    let read = |path: PathBuf| std::fs::read_to_string(path).map(|text| text.trim().to_owned()).unwrap_or_default();
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .map(|entry| entry.path())
        .filter(|device| read(device.join("vendor")) == PCI_VENDOR && read(device.join("device")) == PCI_DEVICE)
        .map(|device| device.join("resource2"))
        .filter(|bar| bar.exists())
        .collect();
    found.sort();
    found
}

/// Host side, when a VM's last session ends: gives the slots' memory back to the host, so the
/// next session (or nobody) finds zeros. The header stays.
pub fn wipe_slots(file: &File) -> io::Result<()> {
    let len = file.metadata()?.len();
    if len <= FIRST_SLOT {
        return Ok(());
    }
    let (offset, span) = (libc::off_t::try_from(FIRST_SLOT).unwrap_or(0), libc::off_t::try_from(len - FIRST_SLOT).unwrap_or(0));
    // SAFETY: fallocate on a descriptor this process owns; punching a hole keeps the size and
    // makes the range read as zeros (for the guest's mapping too).
    let punched = unsafe { libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, offset, span) };
    if punched != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_is_made_read_claimed_and_wiped() {
        let dir = std::path::PathBuf::from(format!("/dev/shm/region-unit-test-{}", std::process::id()));
        let path = create(&dir, "vm-7", 1 << 30, 4).unwrap();
        let region = GuestRegion::open(&path).unwrap();
        assert_eq!(region.geometry.name, "vm-7");
        assert_eq!(region.geometry.slots, 4);
        assert_eq!(region.geometry.slot_size, 254 << 20);
        assert!(same_token(&region.geometry.token, &host_token(&dir, "vm-7").unwrap()));
        assert!(!same_token(&region.geometry.token, &"0".repeat(64)));
        let first = region.claim().unwrap();
        let second = region.claim().unwrap();
        assert_ne!(first, second);
        region.release(first);
        assert_eq!(region.claim().unwrap(), first);
        // A slot owned by a process that is gone is free again.
        region.owner(2).store(u64::from(u32::MAX - 5), Ordering::Release);
        region.owner(3).store(u64::from(u32::MAX - 6), Ordering::Release);
        assert!(region.claim().is_ok() && region.claim().is_ok());
        assert!(region.claim().is_err(), "four slots, four owners alive");

        std::os::unix::fs::FileExt::write_all_at(&region.file, &[0xAB; 4096], region.geometry.slot_offset(1)).unwrap();
        wipe_slots(&region.file).unwrap();
        let mut back = [1u8; 4096];
        std::os::unix::fs::FileExt::read_exact_at(&region.file, &mut back, region.geometry.slot_offset(1)).unwrap();
        assert!(back.iter().all(|&b| b == 0));
        assert!(GuestRegion::open(&path).is_ok(), "the header survives a wipe");

        // Declared again with the same geometry, it is kept, token and all; with another, refused.
        let token = host_token(&dir, "vm-7").unwrap();
        assert_eq!(ensure(&dir, "vm-7", 1 << 30, 4).unwrap(), (path.clone(), false));
        assert_eq!(host_token(&dir, "vm-7").unwrap(), token);
        let error = ensure(&dir, "vm-7", 1 << 30, 2).unwrap_err().to_string();
        assert!(error.contains("exists as 1024 MiB for 4 sessions, not 1024 MiB for 2"), "{error}");
        let (made, created) = ensure(&dir, "vm-8", 256 << 20, 2).unwrap();
        assert!(created && GuestRegion::open(&made).is_ok());

        // A damaged header is refused, not trusted.
        std::os::unix::fs::FileExt::write_all_at(&region.file, &u64::MAX.to_le_bytes(), 24).unwrap();
        assert!(GuestRegion::open(&path).is_err());
        assert!(create(&dir, "../escape", 1 << 30, 4).is_err());
        assert!(create(&dir, "vm", 1 << 20, 4).is_err(), "too small");
        let on_disk = std::env::current_dir().unwrap().join(format!("target/flyt-region-test-{}", std::process::id()));
        if !pinnable(&File::open(std::env::current_dir().unwrap()).unwrap()).unwrap() {
            assert!(create(&on_disk, "vm", 1 << 30, 4).unwrap_err().to_string().contains("not in shared memory"));
        }
        let _ = std::fs::remove_dir_all(&on_disk);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
