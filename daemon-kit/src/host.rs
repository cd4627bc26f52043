//! Facts about this host that daemons report.

use std::time::{SystemTime, UNIX_EPOCH};

/// `/proc/sys/kernel/random/boot_id`: equal on two processes means one kernel (shared memory
/// works between them). Empty when unreadable.
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|id| id.trim().to_string()).unwrap_or_default()
}

/// The kernel's host name, or `localhost` when unreadable.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_string())
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// The local address of the route to `peer` (`host:port`): what this host is to its peers, as
/// a manager reports it; `None` when there is no route (or `peer` does not resolve).
pub fn route_address(peer: &str) -> Option<String> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect(peer).ok()?;
    Some(socket.local_addr().ok()?.ip().to_string())
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|elapsed| elapsed.as_secs()).unwrap_or(0)
}

/// Whether process `pid` still exists, and (when `start_time` is given) is the same process
/// that had that start time (field 22 of `/proc/<pid>/stat`), so a reused pid is not mistaken
/// for the original.
pub fn process_alive(pid: u32, start_time: Option<u64>) -> bool {
    match (process_start_time(pid), start_time) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(now), Some(then)) => now == then,
    }
}

/// Field 22 of `/proc/<pid>/stat` (start time in clock ticks since boot); `None` for a process
/// that does not exist or is a zombie.
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields after it follow the last ')'.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    // `after_name` starts at field 3 (state); field 22 is 19 further on.
    fields.nth(18)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_with_its_own_start_time() {
        let pid = std::process::id();
        let start = process_start_time(pid).unwrap();
        assert!(process_alive(pid, Some(start)));
        assert!(!process_alive(pid, Some(start + 1)));
        assert!(!process_alive(u32::MAX, None));
        assert!(!boot_id().is_empty());
    }
}
