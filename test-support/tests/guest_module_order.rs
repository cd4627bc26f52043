//! `.ci/guest-module-order`, which orders the modules a VM guest loads from their own `depends=`:
//! checked on made-up modules (a `.modinfo`-like run of NUL-terminated strings is all it reads)
//! whose dependencies differ from the fixed list the fetch script once used.

#![allow(clippy::tests_outside_test_module, reason = "an integration test file is its own test crate")]

use std::path::{Path, PathBuf};
use std::process::Command;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/guest-module-order")
}

/// A module file whose `.modinfo` strings name its dependencies, inside some binary noise.
fn write_module(dir: &Path, file: &str, depends: &[&str]) {
    let mut bytes = b"\x7fELF\0\x01\x02junk\0".to_vec();
    bytes.extend_from_slice(format!("license=GPL\0depends={}\0retpoline=Y\0", depends.join(",")).as_bytes());
    bytes.extend_from_slice(b"\0\xff\xfe tail");
    std::fs::create_dir_all(dir.join(Path::new(file).parent().unwrap())).unwrap();
    std::fs::write(dir.join(file), bytes).unwrap();
}

struct Outcome {
    ok: bool,
    names: Vec<String>,
    stderr: String,
}

fn order(dir: &Path, builtin: &[&str], wanted: &[&str]) -> Outcome {
    let builtin_list = dir.join("modules.builtin");
    std::fs::write(&builtin_list, builtin.iter().map(|path| format!("{path}\n")).collect::<String>()).unwrap();
    let output = Command::new("bash").arg(script()).arg(dir).arg(&builtin_list).args(wanted).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    Outcome {
        ok: output.status.success(),
        names: stdout.lines().map(|line| line.split_whitespace().next().unwrap_or("").to_string()).collect(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn position(names: &[String], name: &str) -> usize {
    names.iter().position(|n| n == name).unwrap_or_else(|| panic!("{name} missing from {names:?}"))
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flyt-module-order-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn every_module_follows_what_it_depends_on() {
    let dir = scratch("chain");
    // Debian 6.1.0-56's shape: virtio needs virtio_ring (the old fixed list loaded virtio first).
    write_module(&dir, "kernel/drivers/virtio/virtio.ko", &["virtio_ring"]);
    write_module(&dir, "kernel/drivers/virtio/virtio_ring.ko", &[]);
    write_module(&dir, "kernel/drivers/virtio/virtio_pci_legacy_dev.ko", &[]);
    write_module(&dir, "kernel/drivers/virtio/virtio_pci_modern_dev.ko", &[]);
    write_module(&dir, "kernel/drivers/virtio/virtio_pci.ko", &["virtio_pci_modern_dev", "virtio", "virtio_ring", "virtio_pci_legacy_dev"]);
    write_module(&dir, "kernel/drivers/char/virtio_console.ko", &["virtio", "virtio_ring"]);
    write_module(&dir, "kernel/net/core/failover.ko", &[]);
    write_module(&dir, "kernel/drivers/net/net_failover.ko", &["failover"]);
    write_module(&dir, "kernel/drivers/net/virtio_net.ko", &["net_failover", "virtio", "virtio_ring"]);
    // Not asked for and needed by nothing asked for: left out.
    write_module(&dir, "kernel/drivers/block/virtio_blk.ko", &["virtio"]);

    let outcome = order(&dir, &[], &["virtio_pci", "virtio_console", "virtio_net"]);
    assert!(outcome.ok, "{}", outcome.stderr);
    let names = &outcome.names;
    assert_eq!(names.len(), 9, "{names:?}");
    assert!(!names.iter().any(|n| n == "virtio_blk"), "{names:?}");
    let needs = [
        ("virtio", "virtio_ring"),
        ("virtio_pci", "virtio"),
        ("virtio_pci", "virtio_pci_modern_dev"),
        ("virtio_pci", "virtio_pci_legacy_dev"),
        ("virtio_console", "virtio"),
        ("virtio_net", "net_failover"),
        ("net_failover", "failover"),
    ];
    for (module, dependency) in needs {
        assert!(position(names, dependency) < position(names, module), "{module} loads before {dependency}: {names:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn built_in_modules_are_skipped_and_compressed_ones_read() {
    let dir = scratch("builtin");
    // virtio and virtio_ring built in; the transport compressed, its name spelt with a dash.
    let plain = dir.join("plain");
    write_module(&plain, "virtio-pci.ko", &["virtio", "virtio_ring"]);
    std::fs::create_dir_all(dir.join("kernel/drivers/virtio")).unwrap();
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "gzip -c {} > {}",
            plain.join("virtio-pci.ko").display(),
            dir.join("kernel/drivers/virtio/virtio-pci.ko.gz").display()
        ))
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::remove_dir_all(&plain).unwrap();

    let outcome = order(&dir, &["kernel/drivers/virtio/virtio.ko", "kernel/drivers/virtio/virtio_ring.ko"], &["virtio_pci"]);
    assert!(outcome.ok, "{}", outcome.stderr);
    assert_eq!(outcome.names, vec!["virtio_pci".to_string()]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_module_is_an_error_naming_it() {
    let dir = scratch("missing");
    write_module(&dir, "virtio_console.ko", &["virtio", "virtio_ring"]);
    write_module(&dir, "virtio.ko", &["virtio_ring"]);
    let outcome = order(&dir, &[], &["virtio_console"]);
    assert!(!outcome.ok, "succeeded without virtio_ring: {:?}", outcome.names);
    assert!(outcome.stderr.contains("virtio_ring") && outcome.stderr.contains("needed by"), "{}", outcome.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}
