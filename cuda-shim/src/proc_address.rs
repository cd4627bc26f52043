//! `cuGetProcAddress`: which export a name resolves to for a requested CUDA version and flags, from the
//! generated map of the real driver's answers (`generated/proc_address.rs`). Pure data lookups: nothing
//! here connects anywhere or takes a lock, because NVIDIA's runtime asks for ~440 names at start.

use std::ffi::c_void;

use crate::CUresult;
use crate::exports::EXPORTS;
use crate::generated::proc_address::ENTRIES;

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`: resolve to the `_ptds`/`_ptsz` variants.
pub const PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// `CUdriverProcAddressQueryResult`.
pub const SYMBOL_SUCCESS: u32 = 0;
pub const SYMBOL_NOT_FOUND: u32 = 1;
pub const VERSION_NOT_SUFFICIENT: u32 = 2;

/// What a name resolves to from version `from` on (until the next step).
#[derive(Clone, Copy, Debug)]
pub struct Step {
    pub from: u32,
    pub target: Target,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The export at this index of [`EXPORTS`].
    Export(u16),
    /// NULL with this `symbolStatus`.
    Null(u32),
    /// The driver answers this error.
    Error(u32),
}

/// One name's steps for flags 0 (`legacy`) and 2 (`per_thread`; `None`: same as flags 0).
pub struct Entry {
    pub name: &'static str,
    pub legacy: &'static [Step],
    pub per_thread: Option<&'static [Step]>,
}

/// The answer to one request, before it is written to the caller's pointers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution {
    Found(*const c_void),
    /// NULL with this status (the v2 entry point still returns CUDA_SUCCESS).
    Missing(u32),
    Error(CUresult),
}

/// Resolves `name` as the real driver does; `driver_version` is what `cuDriverGetVersion` reports (a
/// request above it is CUDA_ERROR_INVALID_VALUE).
pub fn resolve(name: &[u8], cuda_version: i32, flags: u64, driver_version: i32) -> Resolution {
    if cuda_version > driver_version {
        return Resolution::Error(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let Ok(entry) = ENTRIES.binary_search_by(|e| e.name.as_bytes().cmp(name)).map(|i| &ENTRIES[i]) else {
        return Resolution::Missing(SYMBOL_NOT_FOUND);
    };
    let steps = match entry.per_thread {
        Some(per_thread) if flags & PER_THREAD_DEFAULT_STREAM != 0 => per_thread,
        _ => entry.legacy,
    };
    let version = u32::try_from(cuda_version).unwrap_or(0);
    match steps.iter().rev().find(|step| step.from <= version).map(|step| step.target) {
        None => Resolution::Missing(VERSION_NOT_SUFFICIENT),
        Some(Target::Export(index)) => Resolution::Found(EXPORTS[usize::from(index)].address.0),
        Some(Target::Null(status)) => Resolution::Missing(status),
        Some(Target::Error(code)) => Resolution::Error(CUresult(code)),
    }
}

/// The name of the export an address belongs to (for tests and diagnostics).
pub fn export_name(address: *const c_void) -> Option<&'static str> {
    EXPORTS.iter().find(|e| e.address.0 == address).map(|e| e.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name_of(name: &str, version: i32, flags: u64) -> Option<&'static str> {
        match resolve(name.as_bytes(), version, flags, 13000) {
            Resolution::Found(address) => export_name(address),
            _ => None,
        }
    }

    #[test]
    fn entries_are_sorted_and_point_at_their_family() {
        assert!(ENTRIES.windows(2).all(|w| w[0].name < w[1].name));
        for entry in ENTRIES {
            for step in entry.legacy.iter().chain(entry.per_thread.unwrap_or(&[])) {
                if let Target::Export(index) = step.target {
                    let target = EXPORTS[usize::from(index)].name;
                    assert!(target.starts_with(entry.name) || entry.name == "cuGraphInstantiate", "{} resolves to {target}", entry.name);
                }
            }
        }
    }

    #[test]
    fn versions_and_flags_select_the_variant() {
        assert_eq!(name_of("cuMemAlloc", 2000, 0), Some("cuMemAlloc"));
        assert_eq!(name_of("cuMemAlloc", 3020, 0), Some("cuMemAlloc_v2"));
        assert_eq!(name_of("cuMemAlloc", 13000, 2), Some("cuMemAlloc_v2"), "no per-thread variant: as flags 0");
        assert_eq!(name_of("cuMemcpyHtoD", 7000, 2), Some("cuMemcpyHtoD_v2_ptds"));
        assert_eq!(name_of("cuMemcpyHtoD", 7000, 1), Some("cuMemcpyHtoD_v2"));
        assert_eq!(name_of("cuMemcpyAsync", 12000, 2), Some("cuMemcpyAsync_ptsz"));
        assert_eq!(name_of("cuCtxCreate", 11040, 0), Some("cuCtxCreate_v3"));
        assert_eq!(name_of("cuCtxCreate", 12080, 0), Some("cuCtxCreate_v4"));
        assert_eq!(name_of("cuCtxGetDevice", 12090, 0), Some("cuCtxGetDevice"));
        assert_eq!(name_of("cuCtxGetDevice", 13000, 0), Some("cuCtxGetDevice_v2"));
        assert_eq!(name_of("cuGetProcAddress", 11030, 0), Some("cuGetProcAddress"));
        assert_eq!(name_of("cuGetProcAddress", 12000, 0), Some("cuGetProcAddress_v2"));
    }

    #[test]
    fn unknown_too_old_and_too_new() {
        assert_eq!(resolve(b"", 0, 0, 13000), Resolution::Missing(SYMBOL_NOT_FOUND));
        assert_eq!(resolve(b"cuNoSuchFunction", 12000, 0, 13000), Resolution::Missing(SYMBOL_NOT_FOUND));
        assert_eq!(resolve(b"cuMemAlloc_v2", 12000, 0, 13000), Resolution::Missing(SYMBOL_NOT_FOUND));
        assert_eq!(resolve(b"cuCtxCreate", 1000, 0, 13000), Resolution::Missing(VERSION_NOT_SUFFICIENT));
        assert_eq!(resolve(b"cuMemcpyHtoD", 3020, 2, 13000), Resolution::Missing(VERSION_NOT_SUFFICIENT));
        assert_eq!(resolve(b"cuMemAlloc", 99000, 0, 13000), Resolution::Error(CUresult::CUDA_ERROR_INVALID_VALUE));
        assert_eq!(resolve(b"cuMemAlloc", 13010, 0, 13000), Resolution::Error(CUresult::CUDA_ERROR_INVALID_VALUE));
    }
}
