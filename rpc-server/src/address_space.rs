//! Where a worker's device addresses land.
//!
//! The CUDA driver takes device addresses from its process's address space, top-down like any
//! other mapping (`gpu-tests/probes/va_layout_probe.c`), so by default they lie among the
//! worker's libraries, in the top TiB of the address space, which is exactly where the app's own
//! libraries and heaps are (each process's place in that TiB is random). An app cannot use a
//! device address that is host memory of its own (a copy's direction is told from its pointers),
//! and a session whose device addresses kept landing on the app's mappings had its allocations
//! fail (seen once in a PyTorch run over shared memory, 2026-11-25; with 20 GiB of mappings on
//! each side, about one session in twenty would meet).
//!
//! So a worker runs with Linux's bottom-up layout (`ADDR_COMPAT_LAYOUT`, set between fork and
//! exec): its mappings, the driver's device addresses among them, go up from a third of the
//! address space (`0x2aaa_aaaa_b000` plus a random offset of up to 1 TiB), where an ordinary
//! process maps nothing: apps map their libraries near the top, their program and heap near
//! `0x5555_5555_0000`, and Flyt's client its shared segments in `0x1000_0000_0000..0x2000_0000_0000`.
//!
//! Reserving the top of the worker's address space before the driver loads would do the same
//! but breaks moves: the driver then never honours an address hint there
//! (`gpu-tests/probes/va_hint_probe.c --hold-first`), and a moved session's allocations must be
//! mapped again at their addresses.

//! Address windows (`--address-window N`): a tenant spread over several nodes has one server,
//! hence one worker, per node, and the app holds all their device addresses in one space. Two
//! workers' drivers would pick addresses alike, so each node's server is given its own window:
//! a worker of window N first reserves (inaccessible, no memory behind it) `N x WINDOW_SPAN`
//! bytes just above its libraries, so the driver's reservations, which go up from there, start
//! N windows higher (the emulated device's addresses likewise). The client still checks every
//! allocation against the other servers' ranges (`flyt_client`), since a window is a layout,
//! not a guarantee.

/// The span of one address window: the bottom-up part of a 47-bit address space (from 42.7 TiB
/// to 128 TiB) holds five.
pub const WINDOW_SPAN: u64 = 16 << 40;
/// The highest window.
pub const MAX_WINDOW: u32 = 4;
/// How the listener hands its window to its workers (they inherit its environment).
const WINDOW_ENV: &str = "FLYT_RPC_ADDRESS_WINDOW";

/// How the listener tells its workers that the emulated device's first address is fixed.
const FIXED_BASE_ENV: &str = "FLYT_RPC_EMULATED_FIXED_BASE";

/// Sets the window this server's workers use (the listener calls it before starting any), and
/// whether an emulated device's addresses start at the same place in every worker.
pub fn set_window_for_workers(window: u32, emulated_fixed_base: bool) {
    // SAFETY: called at the listener's start, before it starts threads that read the environment.
    unsafe {
        std::env::set_var(WINDOW_ENV, window.to_string());
        if emulated_fixed_base {
            std::env::set_var(FIXED_BASE_ENV, "1");
        }
    }
}

/// Whether this worker's emulated device starts at the same address as every other's
/// (`--emulated-fixed-base`, for tests).
pub fn emulated_fixed_base() -> bool {
    std::env::var_os(FIXED_BASE_ENV).is_some()
}

/// This worker's window (0 when the listener named none or an invalid one).
pub fn window() -> u32 {
    std::env::var(WINDOW_ENV).ok().and_then(|text| text.parse().ok()).filter(|window| *window <= MAX_WINDOW).unwrap_or(0)
}

/// How far this worker's device addresses are moved up: `window() x WINDOW_SPAN`.
pub fn window_offset() -> u64 {
    u64::from(window()) * WINDOW_SPAN
}

/// Reserves this worker's window offset before the driver loads (see the module's notes): an
/// inaccessible mapping the driver's later reservations lie above. Kept for the process's life.
pub fn reserve_window() -> Result<(), String> {
    let span = window_offset();
    if span == 0 {
        return Ok(());
    }
    let len = usize::try_from(span).map_err(|_| "the window does not fit this address space".to_string())?;
    // SAFETY: a fresh anonymous mapping at an address the kernel picks; nothing else is touched.
    let placed = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0)
    };
    if placed == libc::MAP_FAILED {
        return Err(format!("reserving the address window ({len} bytes): {}", std::io::Error::last_os_error()));
    }
    // Top-down (the bottom-up layout refused), the reservation lies below the driver's
    // addresses, not under them: the window does nothing there.
    if (placed as u64) > 0x6000_0000_0000 {
        return Err(format!("the worker does not run bottom-up (its reservation landed at {placed:p}): the address window has no effect"));
    }
    Ok(())
}

/// `personality(2)`'s flag for the bottom-up layout.
const ADDR_COMPAT_LAYOUT: libc::c_ulong = 0x0200000;

/// Adds the bottom-up flag to this process's persona, which only changes how its next exec lays
/// out memory; returns the persona it had. Only async-signal-safe calls (it runs between fork and
/// exec). It can be refused: Docker's default seccomp profile allows `personality` with a few
/// values only, and the listener says so once ([`bottom_up_allowed`]).
fn add_bottom_up() -> std::io::Result<libc::c_ulong> {
    // SAFETY: personality(0xffffffff) only reads the persona.
    let current = unsafe { libc::personality(0xffff_ffff) };
    if current == -1 {
        return Err(std::io::Error::last_os_error());
    }
    let current = current as libc::c_ulong;
    // SAFETY: the persona only changes how a later exec lays out memory.
    if unsafe { libc::personality(current | ADDR_COMPAT_LAYOUT) } == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(current)
}

/// Makes the next `exec` of this process use the bottom-up layout (see [`add_bottom_up`]).
pub fn bottom_up_layout_after_exec() -> std::io::Result<()> {
    add_bottom_up().map(drop)
}

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

/// Whether this process may ask for the bottom-up layout (asked, then set back).
pub fn bottom_up_allowed() -> bool {
    add_bottom_up().is_ok_and(|before| {
        // SAFETY: back to the persona this process had.
        unsafe { libc::personality(before) };
        true
    })
}

/// What this worker has mapped over `[start, end)`, from `/proc/self/maps` (a few mappings), for
/// error messages.
pub fn describe(start: u64, end: u64) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").map(|text| parse_maps(&text)).unwrap_or_default();
    let overlapping: Vec<String> = maps
        .iter()
        .filter(|mapping| mapping.start < end && start < mapping.end)
        .take(4)
        .map(|mapping| {
            format!("{:#x}..{:#x} {}", mapping.start, mapping.end, if mapping.name.is_empty() { "anonymous" } else { &mapping.name })
        })
        .collect();
    if overlapping.is_empty() { "nothing mapped".to_string() } else { overlapping.join(", ") }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether this process runs with the bottom-up layout.
    fn is_bottom_up() -> bool {
        // SAFETY: personality(0xffffffff) only reads the persona.
        let current = unsafe { libc::personality(0xffff_ffff) };
        current != -1 && current as libc::c_ulong & ADDR_COMPAT_LAYOUT != 0
    }

    const MAPS: &str = "\
5555_0000_0000-5555_0000_4000 r--p 00000000 08:01 1 /usr/bin/flyt rpc-server
2aaa_0000_0000-2aaa_1000_0000 ---p 00000000 00:00 0
7ffd_0000_0000-7ffd_0002_1000 rw-p 00000000 00:00 0 [stack]
";

    #[test]
    fn maps_lines_are_read() {
        let maps = parse_maps(&MAPS.replace('_', ""));
        assert_eq!(maps.len(), 3);
        assert_eq!(maps[0].name, "/usr/bin/flyt rpc-server");
        assert_eq!(maps[1], Mapping { start: 0x2aaa_0000_0000, end: 0x2aaa_1000_0000, name: String::new() });
        assert_eq!(maps[2].name, "[stack]");
    }

    /// A child started with the flag gets the bottom-up layout: its mappings lie in the third of
    /// the address space where apps map nothing.
    #[test]
    fn a_child_started_bottom_up_maps_low() {
        use std::os::unix::process::CommandExt;
        let mut command = std::process::Command::new("cat");
        command.arg("/proc/self/maps");
        // SAFETY: the hook only calls personality(2).
        unsafe { command.pre_exec(bottom_up_layout_after_exec) };
        let output = command.output().expect("cat runs");
        assert!(!is_bottom_up(), "this process keeps the default layout");
        assert!(bottom_up_allowed());
        assert!(!is_bottom_up(), "asking leaves the layout as it was");
        let maps = parse_maps(&String::from_utf8_lossy(&output.stdout));
        let libc_map = maps.iter().find(|mapping| mapping.name.contains("libc")).expect("libc mapped");
        assert!((0x2aaa_0000_0000..0x2c00_0000_0000).contains(&libc_map.start), "{:#x}", libc_map.start);
        // This process keeps the default layout.
        let own = parse_maps(&std::fs::read_to_string("/proc/self/maps").unwrap());
        let own_libc = own.iter().find(|mapping| mapping.name.contains("libc")).expect("libc mapped");
        assert!(own_libc.start > 0x7000_0000_0000, "{:#x}", own_libc.start);
    }

    /// A worker of window 2 maps nothing in the two windows above its libraries: its next
    /// mappings land past them.
    #[test]
    fn a_window_moves_later_mappings_up() {
        use std::os::unix::process::CommandExt;
        let probe = |window: u32| {
            let mut command = std::process::Command::new(std::env::current_exe().unwrap());
            command
                .args(["--exact", "address_space::tests::window_probe", "--nocapture", "--include-ignored"])
                .env(WINDOW_ENV, window.to_string())
                .env("FLYT_WINDOW_PROBE", "1");
            // SAFETY: the hook only calls personality(2).
            unsafe { command.pre_exec(bottom_up_layout_after_exec) };
            let output = command.output().expect("the probe runs");
            let text = String::from_utf8_lossy(&output.stdout);
            let line = text.lines().find_map(|line| line.strip_prefix("mapped at ")).unwrap_or_else(|| panic!("{text}"));
            u64::from_str_radix(line.trim_start_matches("0x"), 16).unwrap()
        };
        let (plain, moved) = (probe(0), probe(2));
        assert!(moved >= plain + 2 * WINDOW_SPAN - (1 << 40), "window 0 at {plain:#x}, window 2 at {moved:#x}");
        assert!(moved < 0x7000_0000_0000, "{moved:#x}");
    }

    /// Run by `a_window_moves_later_mappings_up` in a child: reserves the window, then maps 1 GiB.
    #[test]
    #[ignore = "a child of a_window_moves_later_mappings_up"]
    fn window_probe() {
        if std::env::var_os("FLYT_WINDOW_PROBE").is_none() {
            return;
        }
        reserve_window().unwrap();
        // SAFETY: a fresh anonymous mapping, only its address is read.
        let placed = unsafe {
            libc::mmap(std::ptr::null_mut(), 1 << 30, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0)
        };
        println!("mapped at {:#x}", placed as u64);
    }

    #[test]
    fn describe_names_what_is_mapped() {
        let text = describe(0, u64::MAX);
        let program = std::env::current_exe().unwrap();
        assert!(text.contains(program.file_name().unwrap().to_str().unwrap()), "{text}");
        assert_eq!(describe(0x1000, 0x2000), "nothing mapped");
    }
}
