//! The app's own shared mappings of files, registered as mapped host memory. NCCL's ranks on one
//! host share a `/dev/shm` file this way: each maps it and registers it with
//! `CU_MEMHOSTREGISTER_DEVICEMAP`, and kernels of every rank read and write the same pages.
//!
//! Memory the app maps privately lives only in this process, out of the server's reach; a shared
//! file mapping is the file's pages, which the worker can map too. So over the shared-memory
//! channel (the worker on this host) the file's descriptor goes to the worker
//! (`flyt_protocol::deposit`), which maps the same pages at the same address and registers them
//! there: the device pointer is the app's pointer, as under unified addressing natively, and the
//! app, its kernels and every other process mapping the file see one set of pages.
//!
//! The process's own anonymous memory (`malloc`'d, `mmap`'d privately) registered so is made such
//! a mapping first: its pages' contents go into a memory file that is then mapped over them at the
//! same address (`rebacked`), so the app keeps its pointer and its bytes and the worker maps the
//! same pages. Writes another thread makes to those pages during the swap are lost (natively
//! registering never touches the memory), and a child forked afterwards shares these pages with
//! its parent instead of copying them.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::time::Duration;

use flyt_protocol::CudaError;
use flyt_protocol::deposit;
use flyt_protocol::ops::req;

use crate::client::Client;

const PAGE: usize = 4096;
/// How long the worker's socket may take to take the descriptor.
const DEPOSIT_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a range cannot be mapped for the server's GPU, for the app's one-line message.
#[derive(Debug, PartialEq, Eq)]
pub enum Unmappable {
    /// A CUDA error on the way (the connection failed, or the server refused a bad request).
    Cuda(CudaError),
    /// The range is not what a worker can map, and why.
    Refused(&'static str),
}

impl From<CudaError> for Unmappable {
    fn from(error: CudaError) -> Self {
        Self::Cuda(error)
    }
}

/// One line of `/proc/self/maps`: a mapping of a file.
#[derive(Debug, PartialEq, Eq)]
struct Mapping {
    start: usize,
    end: usize,
    writable: bool,
    shared: bool,
    file_offset: u64,
    /// `major:minor` of the file's device, as the kernel prints them.
    device: (u32, u32),
    inode: u64,
    path: String,
}

/// Parses one line of `/proc/PID/maps`; `None` for anonymous mappings and lines it cannot read.
fn parse_line(line: &str) -> Option<Mapping> {
    let mut fields = line.splitn(6, ' ');
    let (range, perms, offset, device, inode) = (fields.next()?, fields.next()?, fields.next()?, fields.next()?, fields.next()?);
    let path = fields.next().unwrap_or("").trim_start();
    let (start, end) = range.split_once('-')?;
    let (major, minor) = device.split_once(':')?;
    let inode = inode.parse().ok()?;
    if inode == 0 || !path.starts_with('/') {
        return None;
    }
    let perms = perms.as_bytes();
    Some(Mapping {
        start: usize::from_str_radix(start, 16).ok()?,
        end: usize::from_str_radix(end, 16).ok()?,
        writable: perms.get(1) == Some(&b'w'),
        shared: perms.get(3) == Some(&b's'),
        file_offset: u64::from_str_radix(offset, 16).ok()?,
        device: (u32::from_str_radix(major, 16).ok()?, u32::from_str_radix(minor, 16).ok()?),
        inode,
        path: path.to_owned(),
    })
}

/// Whether every byte of `[start, end)` lies in this process's private, writable, anonymous memory
/// (`malloc`'s heap and its mapped chunks, private `mmap`s; not the stack).
fn private_anonymous(maps: &str, start: usize, end: usize) -> bool {
    let mut covered = start;
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else { continue };
        let path = fields.nth(3).unwrap_or("");
        let Some((from, to)) = range.split_once('-') else { continue };
        let (Ok(from), Ok(to)) = (usize::from_str_radix(from, 16), usize::from_str_radix(to, 16)) else { continue };
        if to <= covered || from >= end {
            continue;
        }
        let anonymous = path.is_empty() || path == "[heap]";
        if from > covered || !anonymous || !perms.starts_with("rw") || perms.as_bytes().get(3) != Some(&b'p') {
            return false;
        }
        covered = to;
        if covered >= end {
            return true;
        }
    }
    false
}

/// Puts a memory file holding the same bytes in place of the private pages `[first, first +
/// span)`; the file. The pages are the process's own, checked by the caller against its maps.
fn rebacked(first: usize, span: usize) -> Result<File, Unmappable> {
    let file = crate::shm::memory_file(c"flyt-registered", libc::MFD_CLOEXEC).map_err(|_| CudaError::OPERATING_SYSTEM)?;
    file.set_len(span as u64).map_err(|_| CudaError::OPERATING_SYSTEM)?;
    // SAFETY: the caller checked that `[first, first + span)` is readable memory of this process.
    let contents = unsafe { std::slice::from_raw_parts(first as *const u8, span) };
    std::os::unix::fs::FileExt::write_all_at(&file, contents, 0).map_err(|_| CudaError::OPERATING_SYSTEM)?;
    // SAFETY: MAP_FIXED replaces exactly the pages whose bytes the file now holds, with the same
    // protection; the app's pointers into them stay valid and read the same bytes.
    let mapped = unsafe {
        libc::mmap(
            first as *mut libc::c_void,
            span,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            file.as_raw_fd(),
            0,
        )
    };
    if mapped as usize != first {
        return Err(Unmappable::Cuda(CudaError::OPERATING_SYSTEM));
    }
    Ok(file)
}

/// Has the worker map `file` (`len` bytes from `file_offset`) at `first` and register it mapped.
fn register_file(client: &Client, file: &File, file_offset: u64, first: usize, span: usize) -> Result<(), Unmappable> {
    let token = deposit(client, file)?;
    let reply =
        client.call(req::ShmRegisterFile { token, file_offset, len: span as u64, mapped_at: first as u64 }).map_err(
            |error| match error {
                CudaError::NOT_SUPPORTED => Unmappable::Refused("the server could not map the file at the app's address"),
                error => Unmappable::Cuda(error),
            },
        )?;
    if reply.device_pointer != first as u64 {
        return Err(Unmappable::Cuda(CudaError::UNKNOWN));
    }
    Ok(())
}

/// The one mapping of this process that holds all of `[start, end)`, if it maps a file.
fn mapping_of(maps: &str, start: usize, end: usize) -> Option<Mapping> {
    maps.lines().filter_map(parse_line).find(|mapping| mapping.start <= start && end <= mapping.end)
}

/// Whether `file` is the file `mapping` maps.
fn is_mapped_file(file: &File, mapping: &Mapping) -> bool {
    file.metadata().is_ok_and(|metadata| {
        metadata.ino() == mapping.inode && (libc::major(metadata.dev()), libc::minor(metadata.dev())) == mapping.device
    })
}

/// The file `mapping` maps, opened for reading and writing and checked to be that very file: by
/// its path, or, when it was removed since (NCCL's last rank to attach removes its segment before
/// registering it) or its path names another file now, through a descriptor of it the app still
/// holds.
fn open_mapped_file(mapping: &Mapping) -> Result<File, Unmappable> {
    let by_path = (!mapping.path.ends_with(" (deleted)"))
        .then(|| std::fs::OpenOptions::new().read(true).write(true).open(&mapping.path).ok())
        .flatten()
        .filter(|file| is_mapped_file(file, mapping));
    by_path.or_else(|| held_descriptor(mapping)).ok_or(Unmappable::Refused(
        "the mapped file was removed and no descriptor of it is open for writing (it is handed to the server by descriptor)",
    ))
}

/// A duplicate of a descriptor of this process open for reading and writing on the file `mapping`
/// maps.
fn held_descriptor(mapping: &Mapping) -> Option<File> {
    let entries = std::fs::read_dir("/proc/self/fd").ok()?;
    entries.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<libc::c_int>().ok()).find_map(|fd| {
        // SAFETY: plain syscalls on a descriptor number; if another thread closed or reused it
        // meanwhile, they fail or duplicate another file, which the checks below reject. The
        // duplicate is ours alone.
        let duplicate = unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            if flags < 0 || flags & libc::O_ACCMODE != libc::O_RDWR {
                return None;
            }
            let duplicate = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0);
            if duplicate < 0 {
                return None;
            }
            File::from_raw_fd(duplicate)
        };
        is_mapped_file(&duplicate, mapping).then_some(duplicate)
    })
}

/// Sends `file` to the worker under a fresh ticket; the ticket's token.
fn deposit(client: &Client, file: &File) -> Result<[u8; deposit::TOKEN_LEN], Unmappable> {
    let ticket = client.call(req::ShmFileTicket {}).map_err(|error| match error {
        CudaError::NOT_SUPPORTED => Unmappable::Refused("the server cannot map this host's files (the app runs in a VM)"),
        error => Unmappable::Cuda(error),
    })?;
    // The server names its own socket; anything else is not ours to connect to.
    if !ticket.socket.starts_with(deposit::SOCKET_PREFIX) {
        return Err(Unmappable::Cuda(CudaError::UNKNOWN));
    }
    let unreachable = Unmappable::Refused("the server's socket for descriptors is out of reach (another network namespace?)");
    let address = SocketAddr::from_abstract_name(ticket.socket.as_bytes()).map_err(|_| CudaError::UNKNOWN)?;
    let mut socket = UnixStream::connect_addr(&address).map_err(|_| unreachable)?;
    socket.set_read_timeout(Some(DEPOSIT_TIMEOUT)).map_err(|_| CudaError::OPERATING_SYSTEM)?;
    socket.set_write_timeout(Some(DEPOSIT_TIMEOUT)).map_err(|_| CudaError::OPERATING_SYSTEM)?;
    crate::shm::send_with_descriptor(&socket, file.as_raw_fd(), &deposit::request(&ticket.token))
        .map_err(|_| Unmappable::Cuda(CudaError::OPERATING_SYSTEM))?;
    let mut answer = [0u8];
    socket.read_exact(&mut answer).map_err(|_| Unmappable::Cuda(CudaError::OPERATING_SYSTEM))?;
    if answer[0] != deposit::ACCEPTED {
        return Err(Unmappable::Cuda(CudaError::UNKNOWN));
    }
    Ok(ticket.token)
}

/// The pages holding `[start, start + len)`.
pub fn page_span(start: usize, len: usize) -> Option<(usize, usize)> {
    let first = start & !(PAGE - 1);
    let end = start.checked_add(len)?.checked_next_multiple_of(PAGE)?;
    Some((first, end - first))
}

/// Has the worker map the pages of `[start, start + len)` (the app's shared mapping of a file, or
/// its anonymous memory, made one first) at the same address and register them mapped. Refused
/// for private file mappings, the stack, read-only mappings, and without the shared-memory
/// channel (the worker on another host).
pub fn register(client: &Client, start: usize, len: usize) -> Result<(), Unmappable> {
    if client.shm.is_none() {
        return Err(Unmappable::Refused(
            "the server's GPU reaches the app's own memory only over the shared-memory channel (FLYT_SHM, same host)",
        ));
    }
    let (first, span) = page_span(start, len).ok_or(CudaError::INVALID_VALUE)?;
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|_| CudaError::OPERATING_SYSTEM)?;
    let Some(mapping) = mapping_of(&maps, first, first + span).filter(|mapping| mapping.shared) else {
        if private_anonymous(&maps, first, first + span) {
            let file = rebacked(first, span)?;
            return register_file(client, &file, 0, first, span);
        }
        return Err(Unmappable::Refused(
            "only the process's anonymous memory or a shared mapping of a file can be mapped for the server's GPU; this is a private file mapping or the stack",
        ));
    };
    if !mapping.writable {
        return Err(Unmappable::Refused("read-only file mappings are not mapped for the server's GPU"));
    }
    let file = open_mapped_file(&mapping)?;
    let file_offset = mapping.file_offset + (first - mapping.start) as u64;
    register_file(client, &file, file_offset, first, span)
}

/// Unmaps on the worker what [`register`] mapped for the range starting at `start`.
pub fn unregister(client: &Client, start: usize) -> Result<(), CudaError> {
    client.post(req::ShmUnregisterFile { mapped_at: (start & !(PAGE - 1)) as u64 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_file_mapping_is_read_from_its_maps_line() {
        let line = "7f1234560000-7f1234570000 rw-s 00002000 00:1a 4242                       /dev/shm/nccl-a b";
        let mapping = parse_line(line).expect("a file mapping");
        assert_eq!(
            mapping,
            Mapping {
                start: 0x7f12_3456_0000,
                end: 0x7f12_3457_0000,
                writable: true,
                shared: true,
                file_offset: 0x2000,
                device: (0, 0x1a),
                inode: 4242,
                path: "/dev/shm/nccl-a b".into(),
            }
        );
        assert!(!parse_line("7f1234560000-7f1234570000 r--p 00000000 103:02 99 /usr/lib/libc.so.6").expect("a file").shared);
        assert_eq!(parse_line("7ffd0000-7ffe0000 rw-p 00000000 00:00 0                          [stack]"), None);
        assert_eq!(parse_line("55550000-55560000 rw-p 00000000 00:00 0 "), None, "anonymous");
        assert_eq!(parse_line("garbage"), None);
    }

    #[test]
    fn anonymous_memory_is_told_from_files_and_the_stack() {
        let maps = "7f0000000000-7f0000004000 rw-p 00000000 00:00 0 \n\
                    7f0000004000-7f0000008000 rw-p 00000000 00:00 0                          [heap]\n\
                    7f0000008000-7f000000a000 rw-p 00000000 08:01 42                         /usr/lib/x.so\n\
                    7ffc00000000-7ffc00004000 rw-p 00000000 00:00 0                          [stack]\n";
        assert!(private_anonymous(maps, 0x7f00_0000_1000, 0x7f00_0000_6000), "heap after an anonymous mapping");
        assert!(!private_anonymous(maps, 0x7f00_0000_7000, 0x7f00_0000_9000), "runs into a file");
        assert!(!private_anonymous(maps, 0x7ffc_0000_0000, 0x7ffc_0000_1000), "the stack");
        assert!(!private_anonymous(maps, 0x7f00_0001_0000, 0x7f00_0001_1000), "unmapped");
    }

    #[test]
    fn the_mapping_must_hold_the_whole_range() {
        let maps = "1000-3000 rw-s 00000000 00:1a 7 /dev/shm/a\n3000-5000 rw-s 00000000 00:1a 8 /dev/shm/b\n";
        assert_eq!(mapping_of(maps, 0x1000, 0x3000).map(|mapping| mapping.inode), Some(7));
        assert_eq!(mapping_of(maps, 0x3000, 0x4000).map(|mapping| mapping.inode), Some(8));
        assert_eq!(mapping_of(maps, 0x2000, 0x4000), None, "two files");
    }

    #[test]
    fn a_range_is_widened_to_its_pages() {
        assert_eq!(page_span(0x1000, 1), Some((0x1000, 0x1000)));
        assert_eq!(page_span(0x1ff0, 0x20), Some((0x1000, 0x2000)));
        assert_eq!(page_span(0x2000, 0x2000), Some((0x2000, 0x2000)));
        assert_eq!(page_span(usize::MAX - 10, 100), None);
    }

    #[test]
    fn a_file_mapped_here_is_found_and_opened_as_itself() {
        let path = std::env::temp_dir().join(format!("flyt-host-files-{}", std::process::id()));
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).expect("file");
        file.set_len(2 * PAGE as u64).expect("size");
        let map = unsafe_free_map(&file);
        let start = map.as_ptr() as usize;
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        let mapping = mapping_of(&maps, start, start + 2 * PAGE).expect("the mapping");
        assert!(mapping.shared && mapping.writable);
        let opened = open_mapped_file(&mapping).expect("opened");
        assert_eq!(opened.metadata().expect("stat").ino(), file.metadata().expect("stat").ino());
        std::fs::remove_file(&path).expect("removed");
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        let deleted = mapping_of(&maps, start, start + PAGE).expect("still mapped");
        assert!(deleted.path.ends_with(" (deleted)"), "{}", deleted.path);
        let held = open_mapped_file(&deleted).expect("found through the descriptor still open");
        assert_eq!(held.metadata().expect("stat").ino(), file.metadata().expect("stat").ino());
        drop((held, opened, file));
        assert!(matches!(open_mapped_file(&deleted), Err(Unmappable::Refused(_))), "no descriptor left");
    }

    fn unsafe_free_map(file: &File) -> memmap2::MmapMut {
        // SAFETY: a test's own file, not truncated while mapped.
        unsafe { memmap2::MmapMut::map_mut(file) }.expect("mapped")
    }
}
