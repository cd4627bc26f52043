//! One-line messages on stderr, each at most once per process and key, so an app that calls an
//! unsupported function in a loop prints one line, not a million.

use std::collections::HashSet;
use std::sync::Mutex;

static SAID: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// Prints `line` unless something was already printed under `key`.
pub fn once(key: &str, line: &str) {
    let mut said = SAID.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if said.get_or_insert_with(HashSet::new).insert(key.to_string()) {
        // What the app printed before goes out first, so the note lands where it happened
        // (the app's stdout is fully buffered in a pipe; stderr is not).
        // SAFETY: fflush(NULL) flushes every C stream of the process; it takes no pointer.
        unsafe { libc::fflush(std::ptr::null_mut()) };
        eprintln!("{line}");
    }
}
