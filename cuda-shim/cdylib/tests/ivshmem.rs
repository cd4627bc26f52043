//! A virtual machine's guest on a GPU host: its sessions' shared-memory segments are slots of the
//! VM's ivshmem region (a file the host made with `flytctl ivshmem create`, which QEMU gives the
//! guest as a PCI BAR and the rpc-server maps from its `--ivshmem-dir`), and the two sides, on
//! different kernels, wake each other through the session's socket instead of a futex.
//!
//! Here the guest's client opens the region file directly (`FLYT_IVSHMEM`, as it opens the
//! device's `resource2` in a guest) and reaches the server over TCP; the server runs the
//! emulated device. The bulk bytes are counted by the server's metrics by path.
//!
//! Skipped (with a line saying so) when `FLYT_CUDA_HOME` is not set; `tools/test` sets it.

#![allow(clippy::tests_outside_test_module, reason = "an integration test file is its own test crate")]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flyt_test_support::regions::{FIRST_SLOT, Regions, copied, free_port, read_at};
use flyt_test_support::{Server, driver_program, run_with_timeout, scrape_metrics, scratch_dir};

struct Guest {
    program: PathBuf,
    lib: PathBuf,
    regions: Regions,
}

impl Guest {
    fn command(&self, server: &str, region: &Path, rounds: u32) -> Command {
        let mut command = Command::new(&self.program);
        command
            .arg(rounds.to_string())
            .env("LD_LIBRARY_PATH", &self.lib)
            .env("FLYT_SERVER", server)
            .env("FLYT_IVSHMEM", region)
            .env("FLYT_SHM", "on")
            // The client's wait spins briefly before it sleeps: the doorbells are exercised.
            .env("FLYT_SPIN_US", "20");
        command
    }
}

fn set_up(name: &str) -> Option<(PathBuf, Guest)> {
    let Some(cuda) = std::env::var_os("FLYT_CUDA_HOME").map(PathBuf::from) else {
        eprintln!("skipped: FLYT_CUDA_HOME is not set (tools/test sets it)");
        return None;
    };
    let scratch = scratch_dir(name);
    let source = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/region_copies.c"));
    let (program, lib) = driver_program(source, &cuda, &scratch);
    let regions = Regions::new(name);
    Some((scratch, Guest { program, lib, regions }))
}

/// `flytctl ivshmem create NAME` in the guest's region folder: the operator's command.
fn create_region(guest: &Guest, name: &str, size: &str, sessions: u32) -> PathBuf {
    guest.regions.create(name, size, sessions).0
}

fn start_server(scratch: &Path, guest: &Guest, metrics: &str) -> Server {
    guest.regions.start_server(&["127.0.0.1:0"], metrics, scratch, &[])
}

#[test]
fn a_guest_copies_through_its_ivshmem_region() {
    let Some((scratch, guest)) = set_up("ivshmem-copies") else { return };
    let region = create_region(&guest, "vm-a", "512MiB", 2);
    let metrics = free_port();
    let server = start_server(&scratch, &guest, &metrics);
    let (code, stdout, stderr) = run_with_timeout(&mut guest.command(&server.addresses[0], &region, 2), Duration::from_secs(120));
    assert_eq!(code, 0, "{stdout}\n{stderr}\n{}", server.log_text());
    assert!(stdout.contains("PASSED: 0 failure(s)"), "{stdout}\n{stderr}");
    let copied_bytes: f64 = stdout
        .lines()
        .find_map(|line| line.strip_prefix("copied ")?.split_whitespace().next()?.parse().ok())
        .expect("the program prints what it copied");

    // Every bulk byte went through the region: none through the socket.
    let text = scrape_metrics(&metrics);
    let through_region = copied(&text, "h2d", "shm") + copied(&text, "d2h", "shm");
    assert!(through_region >= copied_bytes, "{through_region} bytes through the region of {copied_bytes} copied:\n{text}");
    assert_eq!(copied(&text, "h2d", "socket") + copied(&text, "d2h", "socket"), 0.0, "{text}");

    // The VM's last session ended: the region's slots were wiped, its header kept.
    assert!(server.wait_for_log("region wiped", Duration::from_secs(10)), "{}", server.log_text());
    assert!(read_at(&region, FIRST_SLOT, 1 << 20).iter().all(|&b| b == 0), "the first slot is wiped");
    assert_eq!(&read_at(&region, 0, 8), b"FLYTVMR1");

    // Two sessions of the VM at once take the region's two slots.
    let mut first = guest.command(&server.addresses[0], &region, 20).stdout(Stdio::piped()).spawn().expect("first");
    let mut second = guest.command(&server.addresses[0], &region, 20).stdout(Stdio::piped()).spawn().expect("second");
    for child in [&mut first, &mut second] {
        let mut out = String::new();
        child.stdout.take().expect("stdout").read_to_string(&mut out).expect("read");
        assert!(child.wait().expect("wait").success() && out.contains("PASSED: 0 failure(s)"), "{out}");
    }
}

#[test]
fn a_guest_cannot_open_another_vms_region_and_its_scribbles_harm_only_itself() {
    let Some((scratch, guest)) = set_up("ivshmem-isolation") else { return };
    let region_a = create_region(&guest, "vm-a", "256MiB", 2);
    let region_b = create_region(&guest, "vm-b", "256MiB", 2);
    let metrics = free_port();
    let server = start_server(&scratch, &guest, &metrics);
    let address = server.addresses[0].clone();

    // A guest of VM a that names VM b's region presents a's token: refused.
    let forged = scratch.join("forged-region");
    std::fs::copy(&region_a, &forged).expect("copy the region");
    let mut name = [0u8; 64];
    name[..4].copy_from_slice(b"vm-b");
    std::os::unix::fs::FileExt::write_all_at(&std::fs::OpenOptions::new().write(true).open(&forged).expect("forged"), &name, 40)
        .expect("rename the forged region");
    let (code, stdout, stderr) = run_with_timeout(&mut guest.command(&address, &forged, 1), Duration::from_secs(60));
    assert_ne!(code, 0, "{stdout}\n{stderr}");
    assert!(stderr.contains("the token does not open region vm-b"), "{stderr}");
    // A region's size: not left behind in the scratch folder.
    let _ = std::fs::remove_file(&forged);

    // VM b's session runs while VM a's guest scribbles over its own region: over its session's
    // staging area and pinned blocks, past the message rings (a scribbled ring is data or an
    // error for the reader, `flyt-ring`'s tests, but one that erases a record both sides then
    // wait for stalls the scribbler's own session).
    let spawn = |region: &Path, rounds: u32| -> Child {
        guest.command(&address, region, rounds).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn")
    };
    let mut victim = spawn(&region_b, 40);
    let mut scribbler = spawn(&region_a, 100_000);
    std::thread::sleep(Duration::from_millis(300));
    let file = std::fs::OpenOptions::new().write(true).open(&region_a).expect("region a");
    let mut noise = vec![0u8; 1 << 20];
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let started = Instant::now();
    let mut scribbler_status = None;
    while started.elapsed() < Duration::from_secs(30) {
        for byte in &mut noise {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *byte = state.to_le_bytes()[0];
        }
        let past_rings = FIRST_SLOT + (4 << 20);
        let offset = past_rings + (state % ((256 << 20) - past_rings - (1 << 20))) / 4096 * 4096;
        std::os::unix::fs::FileExt::write_all_at(&file, &noise, offset).expect("scribble");
        if let Some(status) = scribbler.try_wait().expect("try_wait") {
            scribbler_status = Some(status);
            break;
        }
    }
    // Not `wait`: a hung scribbler is this test's failure, not its hang.
    if scribbler_status.is_none() {
        let _ = scribbler.kill();
    }
    let waited = scribbler.wait().expect("wait");
    let scribbler_status =
        scribbler_status.unwrap_or_else(|| panic!("the scribbling guest's session neither failed nor ended within 30 s ({waited})"));
    let mut scribbler_out = String::new();
    let mut scribbler_err = String::new();
    let _ = scribbler.stdout.take().expect("stdout").read_to_string(&mut scribbler_out);
    let _ = scribbler.stderr.take().expect("stderr").read_to_string(&mut scribbler_err);
    assert!(!scribbler_status.success(), "scribbled copies cannot all check out:\n{scribbler_out}\n{scribbler_err}");
    assert!(
        scribbler_out.contains("FAIL") || scribbler_err.contains("flyt:"),
        "the scribbler gets errors it can read:\n{scribbler_out}\n{scribbler_err}"
    );

    let mut victim_out = String::new();
    victim.stdout.take().expect("stdout").read_to_string(&mut victim_out).expect("read");
    assert!(victim.wait().expect("wait").success(), "{victim_out}");
    assert!(victim_out.contains("PASSED: 0 failure(s)"), "{victim_out}");

    // Once the scribbler's session is gone, VM a's region is wiped and serves again.
    let wiped = |name: &str| server.log_text().lines().any(|line| line.contains("region wiped") && line.contains(name));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !wiped("vm-a") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(wiped("vm-a"), "{}", server.log_text());
    let (code, stdout, stderr) = run_with_timeout(&mut guest.command(&address, &region_a, 1), Duration::from_secs(120));
    assert_eq!(code, 0, "{stdout}\n{stderr}\n{}", server.log_text());
    assert!(stdout.contains("PASSED: 0 failure(s)"), "{stdout}");
}
