//! Where a worker's device addresses land.
//!
//! The CUDA driver takes device addresses from its process's address space (it reserves them with
//! `mmap`, top-down like any other mapping: `gpu-tests/probes/va_layout_probe.c`), so left alone
//! they lie among this worker's libraries, at the top of the address space, which is exactly where
//! the app's own libraries and heaps are. An app cannot use a device address that is host memory
//! of its own (a copy's direction is told from its pointers), so a session whose device
//! addresses kept landing on the app's mappings had its allocations fail (seen once in PyTorch
//! over shared memory, 2026-11-25).
//!
//! So a worker, before it loads the driver, reserves every free part of the address space from
//! a ceiling (`0x3100_0000_0000` to `0x4000_0000_0000`) up to its stack (no access, no memory
//! behind it; where its heap cannot grow, malloc maps instead). Every later mapping of the
//! worker, the driver's device addresses included, then lies below the ceiling, where Linux
//! places nothing of an ordinary process: apps map their libraries near the top (up to 1 TiB
//! below their stack with address randomization), their program and heap near
//! `0x5555_5555_0000`, and Flyt's client its shared segment in `0x2000_0000_0000..0x3000_0000_0000`.

/// Every mapping the worker makes after [`keep_mappings_low`] lies below its ceiling, an address
/// it picks at random (whole GiBs) between these two: a moved session's allocations are mapped
/// again at their addresses in another worker, whose own device addresses must then lie
/// elsewhere (as address randomization placed them before).
const HIGHEST_CEILING: u64 = 0x4000_0000_0000;
/// A TiB above the part of the address space where the client places its shared segments.
const LOWEST_CEILING: u64 = 0x3100_0000_0000;
const GIB: u64 = 1 << 30;
/// Left free below the stack for it to grow: Linux starts its mappings at least this far below.
const STACK_ROOM: u64 = 128 << 20;

/// One line of `/proc/self/maps`: its range and what it maps.
#[derive(Debug, PartialEq)]
struct Mapping {
    start: u64,
    end: u64,
    name: String,
}

fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (start, end) = fields.next()?.split_once('-')?;
            let name = fields.skip(4).collect::<Vec<_>>().join(" ");
            Some(Mapping { start: u64::from_str_radix(start, 16).ok()?, end: u64::from_str_radix(end, 16).ok()?, name })
        })
        .collect()
}

/// The free ranges of `[ceiling, stack - STACK_ROOM)`. The heap's room is among them: where `brk`
/// cannot grow, malloc maps its memory instead (below the ceiling).
fn ranges_to_reserve(maps: &[Mapping], ceiling: u64) -> Vec<(u64, u64)> {
    let Some(stack) = maps.iter().find(|mapping| mapping.name == "[stack]") else { return Vec::new() };
    let top = stack.start.saturating_sub(STACK_ROOM);
    let mut occupied: Vec<(u64, u64)> = maps.iter().map(|mapping| (mapping.start, mapping.end)).collect();
    occupied.sort_unstable();
    let mut free = Vec::new();
    let mut cursor = ceiling;
    for (start, end) in occupied {
        if start >= top {
            break;
        }
        if start > cursor {
            free.push((cursor, start));
        }
        cursor = cursor.max(end);
    }
    if cursor < top {
        free.push((cursor, top));
    }
    free
}

/// The ranges this worker reserved and still holds, sorted and disjoint.
static HELD: std::sync::Mutex<Vec<(u64, u64)>> = std::sync::Mutex::new(Vec::new());

fn held() -> std::sync::MutexGuard<'static, Vec<(u64, u64)>> {
    HELD.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

enum Reserved {
    Done,
    Taken,
    /// A kernel without MAP_FIXED_NOREPLACE (before 4.17) took the address as a hint.
    Unsupported,
}

fn reserve(start: u64, end: u64) -> Reserved {
    let (Ok(address), Ok(len)) = (usize::try_from(start), usize::try_from(end - start)) else { return Reserved::Taken };
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED_NOREPLACE;
    // SAFETY: a new anonymous mapping without access over a range that was free;
    // MAP_FIXED_NOREPLACE fails instead of replacing anything mapped there meanwhile.
    let got = unsafe { libc::mmap(std::ptr::without_provenance_mut(address), len, libc::PROT_NONE, flags, -1, 0) };
    if got == libc::MAP_FAILED {
        return Reserved::Taken;
    }
    if got as usize != address {
        // SAFETY: the mapping just made, used by nothing.
        unsafe { libc::munmap(got, len) };
        return Reserved::Unsupported;
    }
    Reserved::Done
}

/// A ceiling between the lowest and the highest, in whole GiBs.
fn random_ceiling() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the system's random source for each process.
    let random = std::collections::hash_map::RandomState::new().build_hasher().finish();
    LOWEST_CEILING + random % ((HIGHEST_CEILING - LOWEST_CEILING) / GIB + 1) * GIB
}

/// Reserves the free address space above a ceiling picked at random (see the module's comment);
/// returns the ceiling and the bytes reserved. Best effort: a range that cannot be reserved is
/// left as it is.
pub fn keep_mappings_low() -> std::io::Result<(u64, u64)> {
    let maps = parse_maps(&std::fs::read_to_string("/proc/self/maps")?);
    let ceiling = random_ceiling();
    let mut reserved = 0;
    let mut held = held();
    for (start, end) in ranges_to_reserve(&maps, ceiling) {
        match reserve(start, end) {
            Reserved::Done => {
                held.push((start, end));
                reserved += end - start;
            }
            Reserved::Taken => {}
            Reserved::Unsupported => break,
        }
    }
    held.sort_unstable();
    Ok((ceiling, reserved))
}

/// Gives back the held parts of `[start, end)`, so that something may be mapped exactly there
/// (a moved session's allocation at its old address, a pinned block at the app's address of it);
/// returns them, for [`hold_again`] when that place is no longer used.
pub fn give_back(start: u64, end: u64) -> Vec<(u64, u64)> {
    let mut held = held();
    let mut given = Vec::new();
    let mut kept = Vec::with_capacity(held.len() + 1);
    for &(from, to) in held.iter() {
        let (overlap_start, overlap_end) = (from.max(start), to.min(end));
        if overlap_start >= overlap_end {
            kept.push((from, to));
            continue;
        }
        // SAFETY: part of a reservation this worker made and holds, with nothing else in it.
        unsafe { libc::munmap(std::ptr::without_provenance_mut(overlap_start as usize), (overlap_end - overlap_start) as usize) };
        given.push((overlap_start, overlap_end));
        kept.extend([(from, overlap_start), (overlap_end, to)].into_iter().filter(|(from, to)| from < to));
    }
    *held = kept;
    given
}

/// Reserves again ranges [`give_back`] returned, where they are still free.
pub fn hold_again(ranges: &[(u64, u64)]) {
    let mut held = held();
    for &(start, end) in ranges {
        if matches!(reserve(start, end), Reserved::Done) {
            held.push((start, end));
        }
    }
    held.sort_unstable();
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
5555_0000_0000-5555_0000_4000 r--p 00000000 08:01 1 /usr/bin/flyt-rpc-server
5555_0000_4000-5555_0001_0000 r-xp 00004000 08:01 1 /usr/bin/flyt-rpc-server
5555_0200_0000-5555_0210_0000 rw-p 00000000 00:00 0 [heap]
7f00_0000_0000-7f00_1000_0000 r-xp 00000000 08:01 2 /usr/lib/libc.so.6
7f00_2000_0000-7f00_3000_0000 r--p 00000000 08:01 3 /usr/lib/libm.so.6
7ffd_0000_0000-7ffd_0002_1000 rw-p 00000000 00:00 0 [stack]
7ffd_1000_0000-7ffd_1000_2000 r-xp 00000000 00:00 0 [vdso]
";

    fn maps() -> Vec<Mapping> {
        parse_maps(&MAPS.replace('_', ""))
    }

    #[test]
    fn maps_lines_are_read() {
        let maps = maps();
        assert_eq!(maps.len(), 7);
        assert_eq!(maps[2], Mapping { start: 0x5555_0200_0000, end: 0x5555_0210_0000, name: "[heap]".into() });
    }

    /// Everything free from the ceiling to the stack's room is reserved, the heap's room too.
    #[test]
    fn the_free_space_above_the_ceiling_is_reserved() {
        assert_eq!(
            ranges_to_reserve(&maps(), HIGHEST_CEILING),
            vec![
                (HIGHEST_CEILING, 0x5555_0000_0000),
                (0x5555_0001_0000, 0x5555_0200_0000),
                (0x5555_0210_0000, 0x7f00_0000_0000),
                (0x7f00_1000_0000, 0x7f00_2000_0000),
                (0x7f00_3000_0000, 0x7ffd_0000_0000 - STACK_ROOM),
            ]
        );
    }

    #[test]
    fn ceilings_are_whole_gibs_in_their_range_and_differ() {
        let ceilings: std::collections::HashSet<u64> = (0..64).map(|_| random_ceiling()).collect();
        assert!(ceilings.iter().all(|c| (LOWEST_CEILING..=HIGHEST_CEILING).contains(c) && c.is_multiple_of(GIB)));
        assert!(ceilings.len() > 32, "{}", ceilings.len());
    }

    #[test]
    fn nothing_is_reserved_without_a_stack_line() {
        let maps: Vec<Mapping> = maps().into_iter().filter(|mapping| mapping.name != "[stack]").collect();
        assert!(ranges_to_reserve(&maps, HIGHEST_CEILING).is_empty());
    }

    /// In a child process (the reservation would change where this process's other tests map):
    /// afterwards a new mapping lands below the ceiling.
    #[test]
    fn later_mappings_land_below_the_ceiling() {
        let status = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", "address_space::tests::child_reserves_and_maps", "--nocapture"])
            .env("FLYT_ADDRESS_SPACE_CHILD", "1")
            .status()
            .expect("child test");
        assert!(status.success());
    }

    #[test]
    fn child_reserves_and_maps() {
        if std::env::var_os("FLYT_ADDRESS_SPACE_CHILD").is_none() {
            return;
        }
        let (ceiling, reserved) = keep_mappings_low().expect("maps readable");
        assert!((LOWEST_CEILING..=HIGHEST_CEILING).contains(&ceiling) && ceiling.is_multiple_of(GIB), "{ceiling:#x}");
        assert!(reserved > 1 << 40, "{reserved}");
        for len in [4 << 10, 1 << 20, 1 << 30] {
            let map = memmap2::MmapMut::map_anon(len).expect("a mapping");
            assert!((map.as_ptr() as u64) < ceiling, "{:p}", map.as_ptr());
        }
        // A place given back can be mapped at exactly; held again once unmapped.
        let place =
            held().iter().find(|(start, end)| end - start >= 1 << 30).map(|(start, _)| start + (256 << 20)).expect("a large held range");
        let given = give_back(place, place + (2 << 20));
        assert_eq!(given, vec![(place, place + (2 << 20))]);
        assert!(matches!(reserve(place, place + (2 << 20)), Reserved::Done), "the place is free after give_back");
        // SAFETY: the reservation just made above.
        unsafe { libc::munmap(std::ptr::without_provenance_mut(place as usize), 2 << 20) };
        hold_again(&given);
        assert!(held().iter().any(|&(start, end)| start <= place && place + (2 << 20) <= end));
        assert!(matches!(reserve(place, place + (2 << 20)), Reserved::Taken), "held again");
    }
}
