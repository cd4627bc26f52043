//! The C ABI edge: the panic boundary every export and export-table entry goes through, and the
//! early-return helpers for pointer arguments.

use crate::CUresult;

/// What an entry point returns if its body panicked (a bug in Flyt): never unwinds into C.
pub trait PanicDefault {
    fn on_panic() -> Self;
    /// The error code this return value carries, if it is a failed `CUresult`.
    fn failure(&self) -> Option<CUresult> {
        None
    }
}

impl PanicDefault for CUresult {
    fn on_panic() -> Self {
        CUresult::CUDA_ERROR_UNKNOWN
    }

    fn failure(&self) -> Option<CUresult> {
        (*self != CUresult::CUDA_SUCCESS).then_some(*self)
    }
}

impl PanicDefault for () {
    fn on_panic() -> Self {}
}

/// A count (the tools module iterator's result): nothing visited.
impl PanicDefault for usize {
    fn on_panic() -> Self {
        0
    }
}

impl PanicDefault for std::ffi::c_int {
    fn on_panic() -> Self {
        0
    }
}

/// Runs `body`, turning a panic into `R::on_panic()` and one line on stderr naming `symbol`.
pub fn boundary<R: PanicDefault>(symbol: &'static str, body: impl FnOnce() -> R) -> R {
    flyt_ring::timeline::mark(flyt_ring::timeline::Stage::ExportEnter);
    let started = flyt_client::stats::start();
    let result = flyt_front_kit::ffi::catch_panic(symbol, body, R::on_panic);
    flyt_client::stats::finish(symbol, started);
    // Not-ready answers are how queries poll, not failures.
    if let Some(code) = result.failure().filter(|code| *code != CUresult::CUDA_ERROR_NOT_READY) {
        let line = format!("{symbol} returned {}", crate::api::init::error_name(code));
        crate::logs::record(crate::logs::ERROR, &line);
        if trace_errors() {
            eprintln!("flyt trace: {line}");
        }
    }
    flyt_ring::timeline::mark(flyt_ring::timeline::Stage::ExportReturn);
    result
}

/// `FLYT_TRACE=errors`: every entry point that returns an error says so on stderr, one line per
/// call (for finding which call a library tripped over; off by default).
pub fn trace_errors() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("FLYT_TRACE").is_ok_and(|value| value.split(',').any(|item| item.trim() == "errors")))
}

/// `Result` for the driver's bodies: `?` on a `CUresult` error, `finish` at the edge.
pub type DriverResult<T = ()> = Result<T, CUresult>;

/// Turns a body's result into the status the C caller sees.
pub fn finish(result: DriverResult) -> CUresult {
    match result {
        Ok(()) => CUresult::CUDA_SUCCESS,
        Err(code) => code,
    }
}

/// Writes `value` through an out-pointer, or fails with CUDA_ERROR_INVALID_VALUE on NULL.
///
/// # Safety
/// `ptr` is NULL or valid for a write of `T` (the caller's contract for the driver function).
pub unsafe fn write_out<T>(ptr: *mut T, value: T) -> DriverResult {
    // SAFETY: forwarded contract.
    unsafe { flyt_front_kit::ffi::write_out(ptr, value, CUresult::CUDA_ERROR_INVALID_VALUE) }
}

/// Fails with CUDA_ERROR_INVALID_VALUE if any pointer is NULL (checked before anything is written, so
/// out-parameters are written only on success).
pub fn non_null<const N: usize>(pointers: [*const (); N]) -> DriverResult {
    if pointers.iter().any(|p| p.is_null()) { Err(CUresult::CUDA_ERROR_INVALID_VALUE) } else { Ok(()) }
}
