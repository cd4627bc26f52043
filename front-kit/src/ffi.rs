//! The edge every export of Flyt's libraries crosses: one panic boundary and one out-parameter
//! writer, each front giving its ABI's values (a `CUresult`, a `cudaError_t`, an `nvmlReturn_t`).

use std::panic::{AssertUnwindSafe, catch_unwind};

/// Runs an export's `body`; a panic never unwinds into the app's C code: it is reported once on
/// stderr (naming `symbol` and the panic's message) and the export returns `on_panic()`.
pub fn catch_panic<R>(symbol: &str, body: impl FnOnce() -> R, on_panic: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|text| text.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            crate::diagnostics::once(
                &format!("panic:{symbol}"),
                &format!("flyt: internal error in {symbol} (a bug in Flyt; returning an error): {message}"),
            );
            on_panic()
        }
    }
}

/// Writes `value` through an out-parameter the app passed; NULL is `null_error` (out-parameters
/// are written only on success, so callers compute first and write last).
///
/// # Safety
/// `out` is NULL or valid for a write of `T` (any alignment), as the API's contract requires of
/// the caller.
pub unsafe fn write_out<T, E>(out: *mut T, value: T, null_error: E) -> Result<(), E> {
    if out.is_null() {
        return Err(null_error);
    }
    // SAFETY: non-NULL, and valid for writes per this function's contract.
    unsafe { out.write_unaligned(value) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_the_fronts_value_and_a_write_needs_a_place() {
        assert_eq!(catch_panic("ok", || 1, || 2), 1);
        assert_eq!(catch_panic("boom", || panic!("bug"), || 7), 7);
        let mut slot = 0u64;
        // SAFETY: a valid local, and NULL.
        unsafe {
            assert_eq!(write_out(&raw mut slot, 5, "null"), Ok(()));
            assert_eq!(write_out(std::ptr::null_mut::<u64>(), 5, "null"), Err("null"));
        }
        assert_eq!(slot, 5);
    }
}
