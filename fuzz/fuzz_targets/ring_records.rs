//! The shared-memory rings as the server sees them: a ring area whose every byte the client
//! controls (counters, stamps, lengths, payload). The server reads what it finds and answers;
//! it gets data or an error, never a panic or an access outside the area.
#![no_main]

use std::io::Write;
use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::time::Duration;

use flyt_ring::{AREA_HEADER, Pair, Side, area_len};

const CAPACITY: usize = 4096;

fn liveness() -> &'static (std::os::unix::net::UnixStream, std::os::unix::net::UnixStream) {
    static PAIR: OnceLock<(std::os::unix::net::UnixStream, std::os::unix::net::UnixStream)> = OnceLock::new();
    PAIR.get_or_init(|| std::os::unix::net::UnixStream::pair().expect("a socket pair"))
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let mut area = memmap2::MmapMut::map_anon(area_len(CAPACITY)).expect("an anonymous mapping");
    if mode & 1 == 0 {
        // Raw bytes over the whole area, counters included.
        let len = rest.len().min(area.len());
        area[..len].copy_from_slice(&rest[..len]);
    } else {
        // Records that look complete: (slot, length) pairs, each stamp as the client writes it,
        // then the payload bytes after them.
        let mut records = rest.chunks_exact(9);
        for record in records.by_ref().take(8) {
            let position = u64::from(record[0]) * 64 % CAPACITY as u64;
            let len = u64::from_le_bytes(record[1..9].try_into().unwrap_or_default());
            let at = AREA_HEADER + position as usize;
            area[at..at + 8].copy_from_slice(&flyt_ring::stamp_for_tests(position).to_le_bytes());
            area[at + 8..at + 16].copy_from_slice(&len.to_le_bytes());
        }
        let payload = records.remainder();
        let len = payload.len().min(CAPACITY - 16);
        area[AREA_HEADER + 16..AREA_HEADER + 16 + len].copy_from_slice(&payload[..len]);
    }
    // SAFETY: the mapping holds `area_len(CAPACITY)` bytes, page-aligned, alive until the halves
    // are dropped at the end of this run; the socket lives for the whole process.
    let (mut reader, mut writer) =
        unsafe { Pair::new(area.as_mut_ptr(), CAPACITY, Side::Server, liveness().0.as_raw_fd(), Duration::ZERO, flyt_ring::Wake::Futex) }.split();
    let mut buf = [0u8; 1000];
    for _ in 0..16 {
        match reader.try_read(&mut buf) {
            Ok(read) => assert!(read <= buf.len()),
            Err(_) => break,
        }
    }
    for _ in 0..3 {
        if writer.write(&buf[..300]).is_err() {
            break;
        }
    }
    drop((reader, writer));
});
