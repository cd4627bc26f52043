//! One-line messages on stderr, each at most once per process and key, so a program that calls an
//! unsupported function in a loop prints one line, not a million.

use std::collections::HashSet;
use std::sync::Mutex;

static SAID: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// Prints `line` unless something was already printed under `key`; returns whether it printed.
pub fn once(key: &str, line: &str) -> bool {
    let mut said = SAID.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let first = said.get_or_insert_with(HashSet::new).insert(key.to_string());
    if first {
        eprintln!("{line}");
        crate::logs::record(crate::logs::ERROR, line);
    }
    first
}

/// The line an unsupported driver function prints (once) before answering CUDA_ERROR_NOT_SUPPORTED.
pub fn unsupported(symbol: &str) -> crate::CUresult {
    once(symbol, &format!("flyt: {symbol} is not supported through Flyt (returning CUDA_ERROR_NOT_SUPPORTED)"));
    crate::CUresult::CUDA_ERROR_NOT_SUPPORTED
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_key_prints_once() {
        assert!(super::once("diagnostics-test-key", "flyt: test line (expected in test output)"));
        assert!(!super::once("diagnostics-test-key", "flyt: test line (expected in test output)"));
    }
}
