//! The driver's error log (`cuLogs*`, CUDA 12.9+): every entry point that fails (other than a
//! query answering "not ready") and every one-line refusal of Flyt's is a message, kept in a
//! buffer of the driver's size (25600 bytes, the oldest dropped first), handed to the app's
//! callbacks as it happens and dumped on request from an iterator (a message's sequence number).

use std::collections::VecDeque;
use std::ffi::{c_char, c_void};
use std::sync::Mutex;

/// What the driver keeps (its documented buffer size).
const CAPACITY: usize = 25600;
/// `CU_LOG_LEVEL_ERROR`, `CU_LOG_LEVEL_WARNING`.
pub const ERROR: u32 = 0;
pub const WARNING: u32 = 1;

pub type Callback = unsafe extern "C" fn(data: *mut c_void, level: u32, message: *mut c_char, length: usize);

struct Registered {
    id: usize,
    callback: Callback,
    data: usize,
}

#[derive(Default)]
struct Logs {
    /// Sequence number and text of each kept message, oldest first.
    kept: VecDeque<(u32, String)>,
    bytes: usize,
    next: u32,
    callbacks: Vec<Registered>,
    next_callback: usize,
}

impl Logs {
    fn push(&mut self, message: &str) {
        self.kept.push_back((self.next, message.to_string()));
        self.next = self.next.wrapping_add(1);
        self.bytes += message.len() + 1;
        while self.bytes > CAPACITY
            && let Some((_, old)) = self.kept.pop_front()
        {
            self.bytes -= old.len() + 1;
        }
    }

    /// See [`dump`].
    fn dump(&self, from: Option<u32>, limit: usize) -> Option<(String, u32)> {
        let oldest = self.kept.front().map_or(self.next, |(seq, _)| *seq);
        // Sequence numbers wrap: distances from the next message order them.
        let age = |seq: u32| self.next.wrapping_sub(seq);
        let from = from.unwrap_or(oldest);
        let wanted: Vec<&String> = self.kept.iter().filter(|(seq, _)| age(*seq) <= age(from)).map(|(_, text)| text).collect();
        let mut head = Vec::new();
        if age(from) > age(oldest) {
            head.push(format!("[flyt] {} older log message(s) were overwritten", age(from) - age(oldest)));
        }
        let size = |lines: &[&String], head: &[String]| {
            lines.iter().map(|line| line.len() + 1).sum::<usize>() + head.iter().map(|line| line.len() + 1).sum::<usize>()
        };
        let mut first = 0;
        if size(&wanted, &head) > limit {
            head = vec!["[flyt] older log messages did not fit".to_string()];
            while first < wanted.len() && size(&wanted[first..], &head) > limit {
                first += 1;
            }
            if first == wanted.len() && !wanted.is_empty() {
                return None;
            }
        }
        let mut out = String::new();
        for line in head.iter().chain(wanted[first..].iter().copied()) {
            out.push_str(line);
            out.push('\n');
        }
        Some((out, self.next))
    }
}

static LOGS: Mutex<Option<Logs>> = Mutex::new(None);

fn with<T>(f: impl FnOnce(&mut Logs) -> T) -> T {
    let mut logs = LOGS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    f(logs.get_or_insert_with(Logs::default))
}

/// Adds a message and hands it to every registered callback (outside the lock: a callback may
/// call the driver).
pub fn record(level: u32, message: &str) {
    let callbacks: Vec<(Callback, usize)> = with(|logs| {
        logs.push(message);
        logs.callbacks.iter().map(|registered| (registered.callback, registered.data)).collect()
    });
    for (callback, data) in callbacks {
        let mut text = message.as_bytes().to_vec();
        text.push(0);
        // SAFETY: the app registered `callback` for exactly this call shape; the text is
        // NUL-terminated and lives until the call returns.
        unsafe { callback(data as *mut c_void, level, text.as_mut_ptr().cast(), message.len()) };
    }
}

/// Registers a callback; its handle.
pub fn register(callback: Callback, data: *mut c_void) -> usize {
    with(|logs| {
        logs.next_callback += 1;
        logs.callbacks.push(Registered { id: logs.next_callback, callback, data: data as usize });
        logs.next_callback
    })
}

/// Whether `id` was registered (and is no more).
pub fn unregister(id: usize) -> bool {
    with(|logs| {
        let before = logs.callbacks.len();
        logs.callbacks.retain(|registered| registered.id != id);
        logs.callbacks.len() != before
    })
}

/// Where the next message will be.
pub fn current() -> u32 {
    with(|logs| logs.next)
}

/// The kept messages from `from` on (all of them for `None`), as lines, with a first line saying
/// so when older ones were dropped; and the iterator past the last. At most `limit` bytes: the most
/// recent messages that fit, after a line saying the rest did not (`None` if not even the last
/// one fits).
pub fn dump(from: Option<u32>, limit: usize) -> Option<(String, u32)> {
    with(|logs| logs.dump(from, limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dumps_follow_the_iterator_and_keep_the_latest_when_space_is_short() {
        let mut logs = Logs::default();
        logs.push(&format!("first {}", "x".repeat(60)));
        let middle = logs.next;
        logs.push("second");
        let (all, next) = logs.dump(Some(0), CAPACITY).expect("fits");
        assert_eq!(all, format!("first {}\nsecond\n", "x".repeat(60)));
        assert_eq!(next, 2);
        assert_eq!(logs.dump(Some(middle), CAPACITY).expect("fits").0, "second\n");
        let (short, _) = logs.dump(None, 60).expect("the last one fits");
        assert_eq!(short, "[flyt] older log messages did not fit\nsecond\n");
        assert!(logs.dump(None, 10).is_none());
    }

    #[test]
    fn the_oldest_messages_go_first_and_a_dump_says_so() {
        let mut logs = Logs::default();
        for i in 0..1000 {
            logs.push(&format!("message {i:04} {}", "y".repeat(40)));
        }
        assert!(logs.bytes <= CAPACITY);
        let (text, _) = logs.dump(Some(0), usize::MAX).expect("fits");
        assert!(
            text.starts_with("[flyt] ")
                && text.contains("were overwritten")
                && text.ends_with(&format!("message 0999 {}\n", "y".repeat(40))),
            "{text}"
        );
    }
}
