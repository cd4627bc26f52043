//! [`DriverTable`]: every export of the generated table as a function pointer, looked up by name in a
//! loaded driver library, `None` where that library lacks it (an older driver, or a newer name).

#![allow(non_snake_case, reason = "the fields carry the driver functions' names")]

use std::ffi::{c_char, c_int, c_uchar, c_uint, c_ulonglong, c_ushort, c_void};
use std::ptr::NonNull;

use libloading::Library;

use crate::CUresult;
#[allow(clippy::wildcard_imports, reason = "the generated rows name any of the header's types")]
use crate::generated::types::*;

/// The address of an export without a public signature (the debugger's symbols, retired entry points):
/// its presence is known, calling it is not possible from here.
#[derive(Clone, Copy, Debug)]
pub struct OpaqueSymbol(pub NonNull<c_void>);

// SAFETY: a code address, immutable while its library is loaded (the table's libraries stay loaded for
// the life of the process); sharing it between threads shares no data.
unsafe impl Send for OpaqueSymbol {}
// SAFETY: as above.
unsafe impl Sync for OpaqueSymbol {}

/// The field type of one row: its C signature, or an [`OpaqueSymbol`] for a row without one.
macro_rules! driver_fn_type {
    (opaque ()) => {
        Option<OpaqueSymbol>
    };
    ($kind:ident ($($ty:ty),*)) => {
        Option<unsafe extern "C" fn($($ty),*) -> CUresult>
    };
}

/// Looks one row up: by its name, with its C signature.
macro_rules! driver_fn_lookup {
    ($library:ident, opaque $name:ident ()) => {
        // SAFETY: only the address is read; nothing is called through it.
        unsafe { $library.get::<*mut c_void>(concat!(stringify!($name), "\0").as_bytes()) }
            .ok()
            .and_then(|symbol| NonNull::new(*symbol))
            .map(OpaqueSymbol)
    };
    ($library:ident, $kind:ident $name:ident ($($ty:ty),*)) => {
        // SAFETY: the caller of `DriverTable::resolve` vouches that `$library` is a CUDA driver, whose
        // export of this name has this C signature (the header's, as generated).
        unsafe { $library.get::<unsafe extern "C" fn($($ty),*) -> CUresult>(concat!(stringify!($name), "\0").as_bytes()) }
            .ok()
            .map(|symbol| *symbol)
    };
}

macro_rules! define_driver_table {
    ($( $kind:ident $name:ident [$base:ident $version:literal $stream:ident $origin:ident]
        ($($arg:ident : $ty:ty),*); )*) => {
        /// Every function NVIDIA's `libcuda.so.1` exports, by its exported name (`cuMemAlloc_v2`, not the
        /// header's macro `cuMemAlloc`), with the header's C signature; `None` where the library lacks it.
        #[allow(clippy::type_complexity, reason = "the driver API's signatures")]
        pub struct DriverTable {
            $(pub $name: driver_fn_type!($kind ($($ty),*)),)*
        }

        impl DriverTable {
            /// Every export's name, in the table's order (sorted).
            pub const NAMES: &[&str] = &[$(stringify!($name)),*];

            /// Looks every export up in `library`, once.
            ///
            /// # Safety
            ///
            /// `library` must be a CUDA driver API library (NVIDIA's or Flyt's `libcuda.so.1`): each of its
            /// exports of a name in the table must have that row's C signature. It must stay loaded while
            /// any pointer of the table is called (a `&'static` library, or one that outlives the table).
            pub unsafe fn resolve(library: &Library) -> DriverTable {
                DriverTable { $($name: driver_fn_lookup!(library, $kind $name ($($ty),*)),)* }
            }

            /// The names of the exports `library` lacks, in the table's order.
            pub fn missing(&self) -> Vec<&'static str> {
                let mut missing = Vec::new();
                $(if self.$name.is_none() {
                    missing.push(stringify!($name));
                })*
                missing
            }
        }
    };
}

for_each_driver_api!(define_driver_table);

impl DriverTable {
    /// Opens `name` (a path, or a name for the dynamic loader) and looks every export up in it. The
    /// library stays loaded for the rest of the process, as a driver does.
    ///
    /// # Safety
    ///
    /// As for [`DriverTable::resolve`]; loading a library also runs its initializers.
    pub unsafe fn open(name: &std::ffi::OsStr) -> Result<DriverTable, libloading::Error> {
        // SAFETY: the caller vouches that `name` is a CUDA driver library, safe to load.
        let library = unsafe { Library::new(name) }?;
        // SAFETY: as above; leaked, the library outlives every pointer taken from it.
        Ok(unsafe { DriverTable::resolve(Box::leak(Box::new(library))) })
    }
}

/// `table.cuX` as a function pointer, or `Err("cuX is missing from the driver")`: for an export the
/// caller cannot do without.
#[macro_export]
macro_rules! required {
    ($table:expr, $name:ident) => {
        $table.$name.ok_or_else(|| concat!(stringify!($name), " is missing from the driver").to_string())
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_generated_rows_sorted_and_unique() {
        assert_eq!(DriverTable::NAMES.len(), 707, "NVIDIA's 580 driver exports 707 functions");
        assert!(DriverTable::NAMES.windows(2).all(|pair| pair[0] < pair[1]));
        assert!(DriverTable::NAMES.contains(&"cuMemAlloc_v2"));
    }

    #[test]
    fn a_library_without_the_driver_resolves_to_nothing() {
        // libc exports none of the driver's names: every row is `None`, nothing is guessed.
        // SAFETY: libc is loaded in every process; none of its exports bear a driver name.
        let table = unsafe { DriverTable::open(std::ffi::OsStr::new("libc.so.6")) }.expect("libc loads");
        assert_eq!(table.missing().len(), DriverTable::NAMES.len());
        assert!(table.cuInit.is_none());
    }
}
