//! The shim exports exactly what the CUDA 13 runtime exports, each at version `libcudart.so.13`.

#![allow(clippy::tests_outside_test_module, reason = "an integration test crate: every function in it is a test")]

use std::collections::BTreeSet;
use std::process::Command;

use flyt_test_support::{artifact, cuda_toolkit, exported_functions};

/// `name@@version` of every defined dynamic function symbol of a library. Our internal
/// `__flyt_*` names stay exported at the base version (see exports.rs).
fn versioned_exports(library: &std::path::Path) -> BTreeSet<String> {
    exported_functions(library).into_iter().filter(|name| !name.starts_with("__flyt_")).collect()
}

#[test]
fn exports_match_the_committed_list() {
    let expected: BTreeSet<String> = include_str!("../../cudart13-exports.txt").lines().map(str::to_string).collect();
    assert_eq!(expected.len(), 422);
    let ours = versioned_exports(&artifact("libcudart.so"));
    let missing: Vec<_> = expected.difference(&ours).collect();
    let extra: Vec<_> = ours.difference(&expected).collect();
    assert!(missing.is_empty() && extra.is_empty(), "missing: {missing:?}\nextra: {extra:?}");
}

#[test]
fn exports_match_the_real_cuda_13_runtime() {
    let real = versioned_exports(&cuda_toolkit().join("lib/libcudart.so.13"));
    let ours = versioned_exports(&artifact("libcudart.so"));
    assert_eq!(real, ours);
}

#[test]
fn every_export_is_a_table_row() {
    let table: BTreeSet<String> = flyt_cudart::exports::EXPORTS.iter().map(|(name, _)| format!("{name}@@libcudart.so.13")).collect();
    assert_eq!(table, versioned_exports(&artifact("libcudart.so")));
    assert_eq!(table.len(), flyt_cudart::exports::EXPORTS.len(), "a symbol appears twice in the table");
}

#[test]
fn soname_is_libcudart_so_13() {
    let output = Command::new("readelf").arg("-d").arg(artifact("libcudart.so")).output().expect("readelf");
    assert!(String::from_utf8_lossy(&output.stdout).contains("Library soname: [libcudart.so.13]"));
}
