//! `libcuda.so.1` exports exactly the real driver's 707 functions, each a row of the table, with the
//! driver's soname.

#![allow(clippy::tests_outside_test_module, reason = "an integration test file is its own test crate")]

use std::collections::BTreeSet;
use std::process::Command;

use flyt_test_support::{artifact, exported_functions};

/// The build output: not named `libcuda.so`, so that nothing run by cargo (whose library path includes
/// the target directories) loads it in place of NVIDIA's driver; it is installed as `libcuda.so.1`.
const LIBRARY: &str = "libflyt_libcuda.so";

#[test]
fn exports_are_the_real_drivers_707() {
    let expected: BTreeSet<String> = include_str!("../../data/libcuda-580-exports.txt")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(str::to_string)
        .collect();
    assert_eq!(expected.len(), 707);
    let ours = exported_functions(&artifact(LIBRARY));
    let missing: Vec<_> = expected.difference(&ours).collect();
    let extra: Vec<_> = ours.difference(&expected).collect();
    assert!(missing.is_empty() && extra.is_empty(), "missing: {missing:?}\nextra: {extra:?}");
}

#[test]
fn every_export_is_a_table_row_once() {
    let table: BTreeSet<String> = flyt_cuda::exports::EXPORTS.iter().map(|e| e.name.to_string()).collect();
    assert_eq!(table.len(), flyt_cuda::exports::EXPORTS.len(), "a name appears twice in the table");
    assert_eq!(table, exported_functions(&artifact(LIBRARY)));
}

#[test]
fn soname_is_libcuda_so_1() {
    let output = Command::new("readelf").arg("-d").arg(artifact(LIBRARY)).output().expect("readelf");
    assert!(String::from_utf8_lossy(&output.stdout).contains("Library soname: [libcuda.so.1]"));
}

#[test]
fn the_generated_driver_table_finds_every_export_and_calls_through_it() {
    // SAFETY: Flyt's driver library, whose exports have the generated signatures (the table they are
    // expanded from is the one `DriverTable` is); loading it starts nothing (no session before cuInit).
    let table = unsafe { flyt_cuda_sys::DriverTable::open(artifact(LIBRARY).as_os_str()) }.expect("load Flyt's driver");
    assert_eq!(table.missing(), Vec::<&str>::new(), "exports the table does not find");
    assert_eq!(flyt_cuda_sys::DriverTable::NAMES.len(), 707);
    // A call answered in the process, through a pointer the table looked up.
    let get_error_name = table.cuGetErrorName.expect("cuGetErrorName");
    let mut name: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: a valid out-pointer; the driver hands out a static C string.
    let status = unsafe { get_error_name(flyt_cuda_sys::CUresult::CUDA_ERROR_INVALID_VALUE, &mut name) };
    assert_eq!(status, flyt_cuda_sys::CUresult::CUDA_SUCCESS);
    // SAFETY: on success `name` is the driver's NUL-terminated static string.
    assert_eq!(unsafe { std::ffi::CStr::from_ptr(name) }.to_str(), Ok("CUDA_ERROR_INVALID_VALUE"));
}
