//! Every function NVIDIA's `libcuda.so.1` exports, expanded from the generated table
//! ([`for_each_driver_api!`]) into `#[unsafe(no_mangle)]` C functions, each behind the panic boundary:
//!
//! - `implemented` rows call `crate::api::<name>` (a missing one is a compile error);
//! - `unsupported` rows answer CUDA_ERROR_NOT_SUPPORTED and print one line naming themselves, once per
//!   process: never a silent success, never a missing symbol;
//! - `opaque` rows (no public signature) do the same, declared without arguments.
//!
//! [`EXPORTS`] lists them all with their family and address, for `cuGetProcAddress` and the tests.

#![allow(non_snake_case, reason = "the exports carry the driver's names")]
#![allow(clippy::missing_safety_doc, reason = "each export's contract is the CUDA driver API's")]
#![allow(clippy::too_many_arguments, reason = "the driver API's signatures")]

use std::ffi::{c_char, c_int, c_uchar, c_uint, c_ulonglong, c_ushort, c_void};

use flyt_cuda_sys::for_each_driver_api;

use crate::CUresult;
use crate::generated::types::*;

/// A code address in a static table.
#[derive(Clone, Copy, Debug)]
pub struct Address(pub *const c_void);

// SAFETY: the addresses are of functions, immutable for the life of the process; sharing them between
// threads shares no data.
unsafe impl Sync for Address {}
// SAFETY: as above.
unsafe impl Send for Address {}

/// One export: its name, whether Flyt implements it, its family and its address.
#[derive(Debug)]
pub struct Export {
    pub name: &'static str,
    pub implemented: bool,
    /// The name without `_vN`/`_ptds`/`_ptsz`, the version suffix (1 for none), and the stream variant
    /// (`legacy`, `ptds` or `ptsz`).
    pub base: &'static str,
    pub version: u32,
    pub stream: &'static str,
    /// Which view of the header declares it (see the generated table's docs).
    pub origin: &'static str,
    pub address: Address,
}

macro_rules! export_fn {
    (implemented $name:ident ($($arg:ident : $ty:ty),*)) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
            // SAFETY: the caller holds the driver API's contract for this function, which the body's own
            // SAFETY comments rely on.
            crate::ffi::boundary(stringify!($name), || unsafe { crate::api::$name($($arg),*) })
        }
    };
    (unsupported $name:ident ($($arg:ident : $ty:ty),*)) => {
        #[unsafe(no_mangle)]
        #[allow(unused_variables, reason = "an unsupported function only names itself")]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
            crate::ffi::boundary(stringify!($name), || crate::diagnostics::unsupported(stringify!($name)))
        }
    };
    (opaque $name:ident ()) => {
        #[unsafe(no_mangle)]
        pub extern "C" fn $name() -> CUresult {
            crate::ffi::boundary(stringify!($name), || crate::diagnostics::unsupported(stringify!($name)))
        }
    };
}

macro_rules! implemented {
    (implemented) => {
        true
    };
    ($other:ident) => {
        false
    };
}

macro_rules! define_exports {
    ($( $kind:ident $name:ident [$base:ident $version:literal $stream:ident $origin:ident]
        ($($arg:ident : $ty:ty),*); )*) => {
        $( export_fn!($kind $name ($($arg: $ty),*)); )*

        /// Every export, sorted by name.
        pub static EXPORTS: &[Export] = &[
            $(Export {
                name: stringify!($name),
                implemented: implemented!($kind),
                base: stringify!($base),
                version: $version,
                stream: stringify!($stream),
                origin: stringify!($origin),
                address: Address($name as *const c_void),
            },)*
        ];
    };
}

for_each_driver_api!(define_exports);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_every_export_of_the_real_driver_once() {
        let real: Vec<&str> =
            include_str!("../data/libcuda-580-exports.txt").lines().filter(|l| !l.starts_with('#') && !l.is_empty()).collect();
        assert_eq!(real.len(), 707);
        let ours: Vec<&str> = EXPORTS.iter().map(|e| e.name).collect();
        let mut sorted_real = real.clone();
        sorted_real.sort_unstable();
        assert_eq!(ours, sorted_real);
        assert!(EXPORTS.windows(2).all(|w| w[0].name < w[1].name), "sorted, no duplicates");
    }

    #[test]
    fn implemented_list_matches_the_table() {
        let listed: Vec<&str> = include_str!("../data/implemented.txt").lines().filter(|l| !l.starts_with('#') && !l.is_empty()).collect();
        let mut implemented: Vec<&str> = EXPORTS.iter().filter(|e| e.implemented).map(|e| e.name).collect();
        let mut listed_sorted = listed.clone();
        listed_sorted.sort_unstable();
        implemented.sort_unstable();
        assert_eq!(implemented, listed_sorted);
    }

    #[test]
    fn families_parse_from_names() {
        let find = |n: &str| EXPORTS.iter().find(|e| e.name == n).unwrap();
        let e = find("cuMemcpyHtoD_v2_ptds");
        assert_eq!((e.base, e.version, e.stream, e.origin), ("cuMemcpyHtoD", 2, "ptds", "per_thread"));
        let e = find("cuMemAlloc");
        assert_eq!((e.base, e.version, e.stream, e.origin), ("cuMemAlloc", 1, "legacy", "internal"));
        let e = find("cuMemAlloc_v2");
        assert_eq!((e.base, e.version, e.origin), ("cuMemAlloc", 2, "current"));
    }

    #[test]
    fn unsupported_exports_answer_not_supported() {
        // SAFETY: unsupported exports ignore their arguments.
        let result = unsafe { cuGraphicsUnregisterResource(std::ptr::null_mut()) };
        assert_eq!(result, CUresult::CUDA_ERROR_NOT_SUPPORTED);
        assert_eq!(cudbgApiInit(), CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
}
