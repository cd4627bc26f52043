//! `flyt-front-kit`: what Flyt's libraries that load into apps share. The client core
//! (`flyt-client`, inside Flyt's `libcuda.so.1`) and the fronts over it (Flyt's `libcudart.so.13`
//! and `libnvidia-ml.so.1`) each link a copy.

pub mod diagnostics;
pub mod driver_library;
pub mod ffi;
pub mod flyt_table;

/// Defines an API call and its per-thread default stream twin (`_ptsz`, `_ptds`), which differ
/// only in whether a null stream means the calling thread's default stream: one body, in which
/// the named flag is false in the first and true in the twin.
///
/// ```ignore
/// per_thread_twins! {
///     pub unsafe fn cuStreamQuery / cuStreamQuery_ptsz(stream: CUstream) -> CUresult |per_thread| {
///         run(|| query(stream, per_thread))
///     }
/// }
/// ```
#[macro_export]
macro_rules! per_thread_twins {
    ($($(#[$meta:meta])* pub unsafe fn $name:ident / $twin:ident ($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty |$per_thread:ident| $body:block)*) => {$(
        $(#[$meta])*
        pub unsafe fn $name($($arg: $ty),*) -> $ret {
            let $per_thread = false;
            $body
        }

        $(#[$meta])*
        pub unsafe fn $twin($($arg: $ty),*) -> $ret {
            let $per_thread = true;
            $body
        }
    )*};
}
