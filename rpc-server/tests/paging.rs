//! Oversubscription (`docs/design/paging.md`) against an emulated server whose device holds
//! 8 MiB while its sessions may hold 16 MiB together (`--memory-quota 16MiB --oversubscribe 2.0`):
//! sessions whose memory sums to twice the device's take turns, each turn paging one in (its
//! bytes checked) and another out; a session that cannot be paged (an interprocess event) is never
//! chosen; a request that cannot be met fails with out-of-memory within the configured wait.
//! Paged memory goes to each worker's pool of host memory pinned ahead (chunks of `--page-chunk`,
//! all pools within `--page-host-budget`), and what does not fit it to memory files.
//!
//! The emulated "driver" keeps the addresses of freed `cuMemAlloc` memory for its own next
//! allocations (`FLYT_EMULATED_DRIVER_KEEPS_FREED_ADDRESSES`), as the real one does: a paging
//! server's sessions' memory must come back at its addresses all the same.

#![allow(clippy::tests_outside_test_module, reason = "an integration test crate: every function in it is a test")]

mod raw;

use std::time::{Duration, Instant};

use flyt_protocol::CudaError;
use flyt_protocol::ops::req;
use flyt_test_support::{scrape_metrics as scrape, series_value as value};
use raw::RawSession;

const MIB: u64 = 1 << 20;
/// Each session's memory: two allocations of 2 MiB, 4 MiB in all (four sessions: 16 MiB).
const ALLOCATION: u64 = 2 * MIB;

/// Bytes that differ by session, round and place (a page put back at the wrong address shows).
fn pattern(session: usize, round: usize, which: usize) -> Vec<u8> {
    let mut state =
        (session as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (round as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9) ^ which as u64;
    (0..ALLOCATION / 8)
        .flat_map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()
        })
        .collect()
}

/// The emulated "driver" keeps freed `cuMemAlloc` addresses for itself, as NVIDIA's does.
const DRIVER_KEEPS_FREED: (&str, &str) = ("FLYT_EMULATED_DRIVER_KEEPS_FREED_ADDRESSES", "1");

fn oversubscribed(name: &str, extra: &[&str]) -> (flyt_test_support::Server, String) {
    oversubscribed_with_env(name, extra, &[])
}

/// As `oversubscribed`, with `env` set for the server too.
fn oversubscribed_with_env(name: &str, extra: &[&str], env: &[(&str, &str)]) -> (flyt_test_support::Server, String) {
    let scratch = flyt_test_support::scratch_dir(name);
    let socket = format!("unix:{}", scratch.join("flyt.sock").display());
    let mut args = vec!["--device", "emulated", "--listen", socket.as_str(), "--warm-workers", "1"];
    args.extend_from_slice(&flyt_test_support::OVERSUBSCRIBED);
    args.extend_from_slice(&["--page-chunk", "1MiB"]);
    args.extend_from_slice(extra);
    let env: Vec<(&str, &str)> = env.iter().copied().chain([DRIVER_KEEPS_FREED]).collect();
    (flyt_test_support::Server::start_with_env(&args, &scratch, &env), socket)
}

fn write(session: &mut RawSession, dst: u64, bytes: &[u8]) {
    session.send(&req::MemcpyHtoD { dst, stream: 0 }.into(), bytes);
}

/// Waits for the session's work, as an app does at the end of a step: it is idle after.
fn synchronize(session: &mut RawSession) {
    session.call(req::DeviceSynchronize {}).0.expect("synchronize");
}

fn read(session: &mut RawSession, src: u64) -> Vec<u8> {
    let (reply, bytes) = session.call(req::MemcpyDtoH { src, len: ALLOCATION, stream: 0, blocking: true });
    reply.expect("read back");
    bytes
}

/// A session with its two allocations, filled with round 0's pattern.
fn filled(socket: &str, index: usize) -> (RawSession, [u64; 2]) {
    let mut session = RawSession::open(socket, None).expect("session");
    let ptrs = [0, 1].map(|_| session.call(req::Malloc { size: ALLOCATION }).0.expect("malloc within the quota").ptr);
    for (which, ptr) in ptrs.iter().enumerate() {
        write(&mut session, *ptr, &pattern(index, 0, which));
    }
    synchronize(&mut session);
    assert!(read(&mut session, ptrs[1]) == pattern(index, 0, 1));
    (session, ptrs)
}

/// `turns` turns, round robin over `sessions`: each reads its session's bytes back as its last
/// turn wrote them (round 0: `filled`) and writes the next round's. The round each session is at.
fn take_turns(sessions: &mut [(RawSession, [u64; 2])], turns: usize) -> Vec<usize> {
    let mut rounds = vec![0usize; sessions.len()];
    for turn in 0..turns {
        let index = turn % sessions.len();
        let (session, ptrs) = &mut sessions[index];
        for (which, ptr) in ptrs.iter().enumerate() {
            assert!(read(session, *ptr) == pattern(index, rounds[index], which), "session {index}'s bytes at turn {turn}");
        }
        rounds[index] = turn + 1;
        for (which, ptr) in ptrs.iter().enumerate() {
            write(session, *ptr, &pattern(index, rounds[index], which));
        }
        synchronize(session);
    }
    rounds
}

fn count(log: &str, needle: &str) -> usize {
    log.matches(needle).count()
}

#[test]
fn sessions_twice_the_device_take_turns_with_their_bytes_checked_each_time() {
    let metrics = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let (server, socket) = oversubscribed(
        "paging-turns",
        &["--idle-page-out-ms", "0", "--resident-min-ms", "0", "--page-wait-ms", "10000", "--metrics-listen", &metrics],
    );
    // Two sessions fill the device; the third and fourth page the first two out to start.
    let mut sessions: Vec<(RawSession, [u64; 2])> = (0..4).map(|index| filled(&socket, index)).collect();
    let rounds = take_turns(&mut sessions, 100);
    for (index, (session, ptrs)) in sessions.iter_mut().enumerate() {
        for (which, ptr) in ptrs.iter().enumerate() {
            assert!(read(session, *ptr) == pattern(index, rounds[index], which), "session {index}'s last bytes");
        }
    }
    // Only two sessions fit the device at once: every turn paged one in and another out.
    let log = server.log_text();
    let (outs, ins) = (count(&log, " paged out"), count(&log, " paged in"));
    assert!(outs >= 100 && ins >= 100, "{outs} page-outs, {ins} page-ins:\n{log}");
    assert_eq!(count(&log, "request failed: out of device memory"), 0, "{log}");
    // Each worker pinned its session's memory ahead (the metrics below: 4 MiB each), and its
    // page-outs went there.
    assert!(log.contains("paging pool pinned ahead"), "{log}");
    assert!(log.contains(&format!("pooled_bytes={} file_bytes=0", 2 * ALLOCATION)), "paged memory in the pool's chunks:\n{log}");
    eprintln!("{outs} page-outs, {ins} page-ins");
    // The metrics say the same: per session, bytes paged out and in; two sessions resident.
    let text = scrape(&metrics);
    assert_eq!(value(&text, "flyt_rpc_resident_capacity_bytes{allocation=\"\"}"), Some((8 * MIB) as f64), "{text}");
    assert_eq!(value(&text, "flyt_rpc_sessions_resident{allocation=\"\"}"), Some(2.0), "{text}");
    for (session, _) in &sessions {
        let id = session.info.session_id;
        let paged_in = value(&text, &format!("flyt_rpc_session_paged_in_bytes_total{{allocation=\"\",session=\"{id}\"}}"));
        assert!(paged_in.is_some_and(|bytes| bytes >= (20 * 4 * MIB) as f64), "session {id}: {paged_in:?}\n{text}");
        let pinned = value(&text, &format!("flyt_rpc_session_paging_pinned_bytes{{allocation=\"\",session=\"{id}\"}}"));
        assert_eq!(pinned, Some((4 * MIB) as f64), "session {id}'s pool: its memory, pinned ahead\n{text}");
    }
}

#[test]
fn a_session_that_cannot_be_paged_is_never_chosen() {
    // No pool: paged memory goes through the memory file's pages.
    let (server, socket) = oversubscribed(
        "paging-blocked",
        &["--idle-page-out-ms", "0", "--resident-min-ms", "0", "--page-wait-ms", "10000", "--page-host-budget", "0"],
    );
    // The blocked session made an interprocess event (`cudaEventInterprocess`): other processes
    // may have opened it, as IPC memory handles would be (the emulated device exports none).
    let (mut blocked, blocked_ptrs) = filled(&socket, 7);
    blocked.send(&req::EventCreate { event: 1, flags: 0x4 | 0x2 }.into(), &[]);
    synchronize(&mut blocked);
    let blocked_id = blocked.info.session_id;
    // Two more sessions take turns in the 4 MiB left: each turn pages the other out.
    let mut turns: Vec<(RawSession, [u64; 2])> = (0..2).map(|index| filled(&socket, index)).collect();
    take_turns(&mut turns, 20);
    assert!(read(&mut blocked, blocked_ptrs[1]) == pattern(7, 0, 1), "the blocked session's bytes");
    let log = server.log_text();
    assert!(count(&log, " paged out") >= 19, "{log}");
    assert!(log.contains(&format!("pooled_bytes=0 file_bytes={}", 2 * ALLOCATION)), "{log}");
    assert!(!log.contains(&format!("pooled_bytes={}", 2 * ALLOCATION)) && !log.contains("paging pool pinned"), "{log}");
    assert_eq!(count(&log, &format!("session {blocked_id} paged out")), 0, "the blocked session was paged out:\n{log}");
    assert_eq!(count(&log, &format!("session_id={blocked_id} refused")), 0, "the blocked session was even asked:\n{log}");
}

#[test]
fn sessions_larger_than_the_pool_page_through_it_and_a_file() {
    // A host budget of 6 MiB (the old flag's name still works) for three sessions of 4 MiB:
    // their workers' pools cannot all hold their sessions, so some page-outs go part through the
    // pool and part through a memory file.
    let (server, socket) = oversubscribed(
        "paging-small-pool",
        &["--idle-page-out-ms", "0", "--resident-min-ms", "0", "--page-wait-ms", "10000", "--page-pinned-max", "6MiB"],
    );
    let mut sessions: Vec<(RawSession, [u64; 2])> = (0..3).map(|index| filled(&socket, index)).collect();
    take_turns(&mut sessions, 30);
    let log = server.log_text();
    assert!(count(&log, " paged in") >= 29, "{log}");
    // (pooled, file) bytes of each page-out.
    let outs: Vec<(u64, u64)> = log
        .lines()
        .filter(|line| line.contains(" paged out "))
        .map(|line| {
            let field = |name: &str| {
                line.split_whitespace().find_map(|word| word.strip_prefix(name)).and_then(|value| value.parse::<u64>().ok()).unwrap()
            };
            (field("pooled_bytes="), field("file_bytes="))
        })
        .collect();
    assert!(outs.iter().all(|(pooled, file)| pooled + file == 4 * MIB), "{outs:?}");
    assert!(outs.iter().any(|(pooled, file)| *pooled > 0 && *file > 0), "through the pool and a file: {outs:?}\n{log}");
    // No pool grew past its session (the budget's sharing is `page_pool`'s unit test).
    let pinned: Vec<u64> = log
        .lines()
        .filter(|line| line.contains("paging pool pinned ahead"))
        .filter_map(|line| line.split_whitespace().find_map(|word| word.strip_prefix("pool_bytes=")).and_then(|value| value.parse().ok()))
        .collect();
    assert!(!pinned.is_empty() && pinned.iter().all(|bytes| *bytes <= 4 * MIB), "{pinned:?}");
    assert_eq!(count(&log, "request failed: out of device memory"), 0, "{log}");
}

#[test]
fn a_request_that_cannot_be_met_fails_with_out_of_memory_within_its_wait() {
    // A session stays resident for a minute once in: nobody can be paged out for the newcomer.
    let (server, socket) =
        oversubscribed("paging-oom", &["--idle-page-out-ms", "0", "--resident-min-ms", "60000", "--page-wait-ms", "500"]);
    let mut first = RawSession::open(&socket, None).expect("session");
    let full = first.call(req::Malloc { size: 8 * MIB }).0.expect("the whole device");
    let mut second = RawSession::open(&socket, None).expect("session");
    let started = Instant::now();
    let refused = second.call(req::Malloc { size: 2 * MIB }).0.err();
    let waited = started.elapsed();
    assert_eq!(refused, Some(CudaError::MEMORY_ALLOCATION));
    assert!(waited >= Duration::from_millis(450) && waited < Duration::from_secs(5), "waited {waited:?}");
    // More than the device holds fails at once, whoever is idle.
    let started = Instant::now();
    assert_eq!(second.call(req::Malloc { size: 9 * MIB }).0.err(), Some(CudaError::MEMORY_ALLOCATION));
    assert!(started.elapsed() < Duration::from_millis(400), "no wait for what can never fit");
    // The first session is unharmed and keeps its memory.
    first.send(&req::Memset { dst: full.ptr, pattern: 0x3c, width: 1, len: 8 * MIB, stream: 0 }.into(), &[]);
    let (reply, bytes) = first.call(req::MemcpyDtoH { src: full.ptr + 8 * MIB - 16, len: 16, stream: 0, blocking: true });
    reply.unwrap();
    assert_eq!(bytes, vec![0x3c; 16]);
    assert_eq!(count(&server.log_text(), " paged out"), 0);
}

#[test]
fn a_session_with_work_queued_is_busy_until_a_wait_covers_it() {
    let (server, socket) = oversubscribed("paging-busy", &["--idle-page-out-ms", "0", "--resident-min-ms", "0", "--page-wait-ms", "500"]);
    let mut first = RawSession::open(&socket, None).expect("session");
    let full = first.call(req::Malloc { size: 8 * MIB }).0.expect("the whole device");
    // A copy queued and not yet waited for: the session counts as busy, however long it idles.
    write(&mut first, full.ptr, &[0x5a; 4096]);
    let mut second = RawSession::open(&socket, None).expect("session");
    let started = Instant::now();
    assert_eq!(second.call(req::Malloc { size: 2 * MIB }).0.err(), Some(CudaError::MEMORY_ALLOCATION));
    assert!(started.elapsed() >= Duration::from_millis(450), "it waited");
    assert_eq!(count(&server.log_text(), " paged out"), 0);
    // Once its app waited for the copy, the first session is idle and makes room.
    synchronize(&mut first);
    let room = second.call(req::Malloc { size: 2 * MIB }).0.expect("room made by paging the first session out");
    second.call(req::Free { ptr: room.ptr }).0.expect("free");
    let (reply, bytes) = first.call(req::MemcpyDtoH { src: full.ptr, len: 4096, stream: 0, blocking: true });
    reply.expect("paged back in");
    assert_eq!(bytes, vec![0x5a; 4096]);
    let log = server.log_text();
    assert_eq!((count(&log, " paged out"), count(&log, " paged in")), (1, 1), "{log}");
}

/// A page-out slower than the wait (each step of it within the wait) does not fail the session
/// waiting for its memory: the wait counts only time with no page-out progressing. The emulated
/// device copies to host memory at 150 ms per MiB (`FLYT_EMULATED_COPY_TO_HOST_MS_PER_MIB`) and
/// no pool pins ahead (`--page-host-budget 0`): an 8 MiB session pages out through a memory file
/// in four batches of 2 MiB, about 1.2 s, against a wait of 500 ms.
#[test]
fn a_waiting_request_outlasts_a_slow_page_out_that_progresses() {
    let (server, socket) = oversubscribed_with_env(
        "paging-slow",
        &["--page-host-budget", "0", "--idle-page-out-ms", "0", "--resident-min-ms", "0", "--page-wait-ms", "500"],
        &[("FLYT_EMULATED_COPY_TO_HOST_MS_PER_MIB", "150")],
    );
    let mut first = RawSession::open(&socket, None).expect("session");
    let ptrs: Vec<u64> = (0..4).map(|_| first.call(req::Malloc { size: ALLOCATION }).0.expect("malloc").ptr).collect();
    for (which, ptr) in ptrs.iter().enumerate() {
        write(&mut first, *ptr, &pattern(0, 0, which));
    }
    synchronize(&mut first);
    // The newcomer's allocation needs the first session's memory: it waits out the slow page-out.
    let mut second = RawSession::open(&socket, None).expect("session");
    let started = Instant::now();
    let room = second.call(req::Malloc { size: ALLOCATION }).0.expect("memory, after the slow page-out");
    let waited = started.elapsed();
    assert!(waited > Duration::from_millis(900), "the page-out took longer than the wait: {waited:?}");
    write(&mut second, room.ptr, &pattern(1, 0, 0));
    synchronize(&mut second);
    let log = server.log_text();
    assert!(log.contains("pooled_bytes=0 file_bytes=8388608"), "through a memory file:\n{log}");
    // The first session's next request pages it in (the second, 2 MiB, goes out first): every byte back.
    for (which, ptr) in ptrs.iter().enumerate() {
        assert!(read(&mut first, *ptr) == pattern(0, 0, which), "allocation {which}'s bytes");
    }
    assert!(read(&mut second, room.ptr) == pattern(1, 0, 0), "the second session's bytes");
    let log = server.log_text();
    assert_eq!(count(&log, "request failed: out of device memory"), 0, "{log}");
    // A request nothing can meet still fails within its wait: see
    // `a_request_that_cannot_be_met_fails_with_out_of_memory_within_its_wait` (no page-out
    // progresses for it).
}

/// Sizes of a session's allocations in the mixed-turns test: the small ones share one page of
/// 2 MiB (packed), the last has a page to itself. Each turn frees and makes again the second
/// and the last.
const MIXED: [u64; 7] = [4, 100, 4096, 65536, MIB + 3, 700_000, 2 * MIB];

fn mixed_pattern(session: usize, round: usize, which: usize) -> Vec<u8> {
    let seed = (session * 131 + round * 17 + which * 7) as u64;
    (0..MIXED[which]).map(|i| ((i.wrapping_mul(0x9e37_79b1) >> 7).wrapping_add(seed) % 251) as u8).collect()
}

fn read_len(session: &mut RawSession, src: u64, len: u64) -> Vec<u8> {
    let (reply, bytes) = session.call(req::MemcpyDtoH { src, len, stream: 0, blocking: true });
    reply.expect("read back");
    bytes
}

/// Three sessions of mixed allocations (4 B to 2 MiB, 3.8 MiB each) take turns on a device
/// holding two. Each turn checks every byte, frees two allocations and makes them again (the
/// driver would hand out the addresses it kept), writes new bytes: paged memory comes back at
/// its addresses every time, the small allocations sharing a page.
#[test]
fn mixed_allocations_freed_and_made_again_come_back_at_their_addresses() {
    let (server, socket) =
        oversubscribed("paging-mixed", &["--idle-page-out-ms", "0", "--resident-min-ms", "0", "--page-wait-ms", "10000"]);
    let mut sessions: Vec<(RawSession, Vec<u64>)> = (0..3)
        .map(|index| {
            let mut session = RawSession::open(&socket, None).expect("session");
            let ptrs: Vec<u64> = MIXED.iter().map(|size| session.call(req::Malloc { size: *size }).0.expect("malloc").ptr).collect();
            for (which, ptr) in ptrs.iter().enumerate() {
                write(&mut session, *ptr, &mixed_pattern(index, 0, which));
            }
            synchronize(&mut session);
            (session, ptrs)
        })
        .collect();
    // The small ones are packed: all within one page.
    let small = &sessions[0].1[..MIXED.len() - 1];
    let (low, high) = (small.iter().min().unwrap(), small.iter().max().unwrap());
    assert!(high - low < 2 * MIB, "{small:x?}");
    let mut rounds = [0usize; 3];
    for turn in 0..30 {
        let index = turn % 3;
        let (session, ptrs) = &mut sessions[index];
        for (which, ptr) in ptrs.iter().enumerate() {
            let back = read_len(session, *ptr, MIXED[which]);
            assert!(back == mixed_pattern(index, rounds[index], which), "session {index}'s allocation {which} at turn {turn}");
        }
        rounds[index] = turn + 1;
        for which in [1, MIXED.len() - 1] {
            session.call(req::Free { ptr: ptrs[which] }).0.expect("free");
            ptrs[which] = session.call(req::Malloc { size: MIXED[which] }).0.expect("malloc again").ptr;
        }
        for (which, ptr) in ptrs.iter().enumerate() {
            write(session, *ptr, &mixed_pattern(index, rounds[index], which));
        }
        synchronize(session);
    }
    for (index, (session, ptrs)) in sessions.iter_mut().enumerate() {
        for (which, ptr) in ptrs.iter().enumerate() {
            assert!(read_len(session, *ptr, MIXED[which]) == mixed_pattern(index, rounds[index], which), "session {index}'s last bytes");
        }
    }
    let log = server.log_text();
    let (outs, ins) = (count(&log, " paged out"), count(&log, " paged in"));
    assert!(outs >= 20 && ins >= 20, "{outs} page-outs, {ins} page-ins:\n{log}");
    assert_eq!(count(&log, "not all held") + count(&log, "are taken") + count(&log, "not paged in"), 0, "{log}");
    assert_eq!(count(&log, "request failed: out of device memory"), 0, "{log}");
}
