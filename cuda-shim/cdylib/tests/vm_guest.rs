//! Real virtual machines on a GPU host: QEMU (TCG) boots a Linux guest whose CUDA programs run
//! over Flyt's `libcuda.so.1` against the host's rpc-server (the emulated device). The guest has
//! no network card: its control path is a virtio-serial port that QEMU connects to the server's
//! Unix socket (`FLYT_SERVER=serial:PORT`), and its bulk bytes go through its ivshmem region
//! (`flytctl ivshmem create`), which the guest's client finds on its PCI bus by itself.
//!
//! Skipped (with a line saying so) when `FLYT_CUDA_HOME` or `FLYT_GUEST_KERNEL` is not set;
//! `tools/test` sets both (`.ci/fetch-guest-kernel` installs QEMU and busybox and fetches the
//! kernel).

#![allow(clippy::tests_outside_test_module, reason = "an integration test file is its own test crate")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use flyt_test_support::guest::{GuestKernel, Vm, write_image};
use flyt_test_support::regions::{FIRST_SLOT, Regions, copied, free_port, read_at};
use flyt_test_support::{Server, driver_program, scrape_metrics, scratch_dir};
/// How long a guest may take, boot to power-off (TCG on a 2-core CI machine is slow).
const GUEST_TIMEOUT: Duration = Duration::from_secs(300);

/// One guest at a time per test binary (the scribble test runs two at once): TCG takes a core each.
static GUESTS: Mutex<()> = Mutex::new(());

struct Setup {
    scratch: PathBuf,
    kernel: GuestKernel,
    /// The guest programs built here, and Flyt's library folder they link against.
    copies: PathBuf,
    scribble: PathBuf,
    bandwidth: PathBuf,
    lib: PathBuf,
    regions: Regions,
}

fn set_up(name: &str) -> Option<Setup> {
    let Some(cuda) = std::env::var_os("FLYT_CUDA_HOME").map(PathBuf::from) else {
        eprintln!("skipped: FLYT_CUDA_HOME is not set (tools/test sets it)");
        return None;
    };
    let kernel = GuestKernel::from_env()?;
    let scratch = scratch_dir(name);
    let sources = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c"));
    let (copies, lib) = driver_program(&sources.join("region_copies.c"), &cuda, &scratch);
    let (scribble, _) = driver_program(&sources.join("region_scribble.c"), &cuda, &scratch);
    let benchmarks = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../benchmarks"));
    let (bandwidth, _) = driver_program(&benchmarks.join("guest_copy.c"), &cuda, &scratch);
    let regions = Regions::new(name);
    Some(Setup { scratch, kernel, copies, scribble, bandwidth, lib, regions })
}

impl Setup {
    /// A server on a Unix socket (the guests' serial ports connect to it) and on TCP (for guests
    /// with a network card) that serves the regions.
    fn start_server(&self, metrics: &str) -> Server {
        let socket = format!("unix:{}", self.scratch.join("rpc.sock").display());
        // QEMU connects a port when the VM starts; its guest speaks once it has booted.
        self.regions.start_server(&[&socket, "127.0.0.1:0"], metrics, &self.scratch, &["--handshake-timeout-secs", "600"])
    }

    /// The initramfs of a guest whose `/init` runs `body` after the prelude, then powers off.
    fn image(&self, name: &str, body: &str) -> PathBuf {
        let path = self.scratch.join(format!("{name}.cpio"));
        let programs = [self.copies.clone(), self.scribble.clone(), self.bandwidth.clone()];
        write_image(&self.kernel, &self.scratch, &programs, &self.lib, body, &path);
        path
    }
}

/// QEMU options for virtio-serial ports named `flyt.0`, `flyt.1`, ... each connected to the
/// server's Unix socket, and connected again when the server closes a connection (a port
/// carries one session per connection).
fn serial_ports(server: &Server, count: usize, vm: &str) -> Vec<String> {
    let socket = server.addresses[0].strip_prefix("unix:").expect("a Unix socket").to_string();
    let mut options = vec!["-device".to_string(), "virtio-serial-pci".to_string()];
    for port in 0..count {
        options.extend([
            "-chardev".into(),
            format!("socket,id={vm}-port{port},path={socket},reconnect=1"),
            "-device".into(),
            format!("virtserialport,chardev={vm}-port{port},name=flyt.{port}"),
        ]);
    }
    options
}

/// The value after `key=` on the guest console line that starts with it.
fn marker<'a>(console: &'a str, key: &str) -> Option<&'a str> {
    console.lines().find_map(|line| line.trim().strip_prefix(key)?.strip_prefix('='))
}

/// A program's environment in the guest: its session on serial port `port`, the region
/// required (a session without it fails instead of going over the port), and short spins, so
/// the doorbells that cross the VM boundary are exercised.
fn session_env(port: usize) -> String {
    format!("FLYT_SERVER=serial:$(port flyt.{port}) FLYT_SHM=on FLYT_SPIN_US=20")
}

#[test]
fn a_booted_guest_copies_through_its_ivshmem_region_with_no_network() {
    let Some(setup) = set_up("vm-guest-copies") else { return };
    let _one_at_a_time = GUESTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let (region, mut devices) = setup.regions.create("vm-a", "256MiB", 2);
    let metrics = free_port();
    let server = setup.start_server(&metrics);
    devices.extend(serial_ports(&server, 2, "vm-a"));

    // Two sessions of the VM at once, each on its own port, sharing the region's two slots; then
    // a third on the first port, which an exited app's session still held (the host learns of
    // no exit in the guest): that session ends, QEMU connects the port again, the third runs.
    let body = format!(
        "{env0} region_copies 3 > /tmp/first.out 2>&1 &\n\
         first=$!\n\
         {env1} region_copies 3 > /tmp/second.out 2>&1\n\
         echo second-exit=$?\n\
         wait $first\n\
         echo first-exit=$?\n\
         cat /tmp/first.out /tmp/second.out\n\
         {env0} region_copies 1 > /tmp/third.out 2>&1\n\
         echo third-exit=$?\n\
         cat /tmp/third.out",
        env0 = session_env(0),
        env1 = session_env(1),
    );
    let image = setup.image("copies", &body);
    let started = Instant::now();
    let mut vm = Vm::boot(&setup.kernel, &image, &devices);
    let (console, powered_off) = vm.wait(GUEST_TIMEOUT);
    let took = started.elapsed();
    let context = || format!("guest console:\n{console}\nserver log:\n{}", server.log_text());
    assert!(powered_off && console.contains("flyt-guest-done"), "the guest ran to its end in {took:?}\n{}", context());
    assert_eq!(marker(&console, "first-exit"), Some("0"), "{}", context());
    assert_eq!(marker(&console, "second-exit"), Some("0"), "{}", context());
    assert_eq!(marker(&console, "third-exit"), Some("0"), "{}", context());
    assert_eq!(console.matches("PASSED: 0 failure(s)").count(), 3, "{}", context());
    let copied_bytes: f64 =
        console.lines().filter_map(|line| line.trim().strip_prefix("copied ")?.split_whitespace().next()?.parse::<f64>().ok()).sum();
    assert!(copied_bytes > 0.0, "{}", context());

    // Every bulk byte went through the region, none through the serial port.
    let text = scrape_metrics(&metrics);
    let through_region = copied(&text, "h2d", "shm") + copied(&text, "d2h", "shm");
    assert!(through_region >= copied_bytes, "{through_region} bytes through the region of {copied_bytes} copied:\n{text}");
    assert_eq!(copied(&text, "h2d", "socket") + copied(&text, "d2h", "socket"), 0.0, "{text}");

    // The VM is gone, and with it its sessions: the region's slots were wiped, its header kept.
    assert!(server.wait_for_log("region wiped", Duration::from_secs(20)), "{}", context());
    assert!(read_at(&region, FIRST_SLOT, 1 << 20).iter().all(|&b| b == 0), "the first slot is wiped");
    assert_eq!(&read_at(&region, 0, 8), b"FLYTVMR1");
    eprintln!("guest booted, copied {copied_bytes} bytes in three sessions and powered off in {took:?}");
}

#[test]
fn a_guest_that_scribbles_over_its_region_harms_only_its_own_session() {
    let Some(setup) = set_up("vm-guest-scribble") else { return };
    let _one_at_a_time = GUESTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let (_, mut devices_a) = setup.regions.create("vm-a", "256MiB", 2);
    let (_, mut devices_b) = setup.regions.create("vm-b", "256MiB", 2);
    let metrics = free_port();
    let server = setup.start_server(&metrics);
    devices_a.extend(serial_ports(&server, 1, "vm-a"));
    devices_b.extend(serial_ports(&server, 1, "vm-b"));

    // VM a scribbles over its own region (past its session's message rings: a scribbled ring
    // record both sides then wait for stalls the scribbler's own session, `flyt-ring`'s tests)
    // while its own program copies through it; VM b copies through its region meanwhile.
    let scribbler = format!(
        "bar=$(for d in /sys/bus/pci/devices/*; do \
           [ \"$(cat $d/vendor)$(cat $d/device)\" = 0x1af40x1110 ] && echo $d/resource2; done)\n\
         {env} region_scribble $bar 120 region_copies 100000\n\
         echo scribbler-exit=$?",
        env = session_env(0),
    );
    let victim = format!("{env} region_copies 12\necho victim-exit=$?", env = session_env(0));
    let (image_a, image_b) = (setup.image("scribbler", &scribbler), setup.image("victim", &victim));
    let mut vm_a = Vm::boot(&setup.kernel, &image_a, &devices_a);
    let mut vm_b = Vm::boot(&setup.kernel, &image_b, &devices_b);
    let (console_b, b_ended) = vm_b.wait(GUEST_TIMEOUT);
    let (console_a, a_ended) = vm_a.wait(GUEST_TIMEOUT);
    let context = || format!("VM a:\n{console_a}\nVM b:\n{console_b}\nserver log:\n{}", server.log_text());
    assert!(a_ended && b_ended, "both guests ran to their end\n{}", context());

    // The victim's copies all checked out.
    assert_eq!(marker(&console_b, "victim-exit"), Some("0"), "{}", context());
    assert!(console_b.contains("PASSED: 0 failure(s)"), "{}", context());

    // The scribbler's program ended (it did not hang), with errors it can read.
    assert_eq!(marker(&console_a, "scribbler-exit"), Some("0"), "the scribbled program ended by itself\n{}", context());
    let status = console_a
        .lines()
        .find_map(|line| line.trim().strip_prefix("scribble: the program ended with status ")?.split_whitespace().next())
        .unwrap_or_else(|| panic!("{}", context()));
    assert_ne!(status, "0", "scribbled copies cannot all check out\n{}", context());
    assert!(console_a.contains("FAIL") || console_a.contains("flyt:"), "the scribbler gets errors it can read\n{}", context());
    let first_error = console_a.lines().find(|line| line.contains("FAIL") || line.contains("flyt:")).unwrap_or_default();
    eprintln!("the scribbled program ended with status {status}, first error: {}", first_error.trim());

    // Both VMs are gone: each region was wiped for its next sessions.
    for name in ["vm-a", "vm-b"] {
        let wiped = || server.log_text().lines().any(|line| line.contains("region wiped") && line.contains(name));
        let deadline = Instant::now() + Duration::from_secs(20);
        while !wiped() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(wiped(), "{name} wiped\n{}", context());
    }
}

/// Not a test but a measurement (`benchmarks/vm-guest.sh` runs it): copy bandwidth from a booted
/// guest through its ivshmem region (control on a serial port) and through TCP alone (QEMU's
/// user-mode network, the guest's only other way out), with the guest's own memcpy beside them,
/// and the same program on the host through the same region as the reference.
/// Prints the table; asserts only that every run completed.
#[test]
#[ignore = "a benchmark: benchmarks/vm-guest.sh"]
fn guest_copy_bandwidth() {
    let Some(setup) = set_up("vm-guest-bandwidth") else { return };
    let reps = std::env::var("FLYT_GUEST_REPS").unwrap_or_else(|_| "9".into());
    // Slots large enough that the 64 MiB pinned buffer is a block of the region (a slot keeps
    // 96 MiB for staging and rings; pinned memory that does not fit is staged like pageable).
    let (region, mut devices) = setup.regions.create("vm-a", "512MiB", 2);
    let metrics = free_port();
    let server = setup.start_server(&metrics);
    let port = server.addresses[1].rsplit_once(':').expect("host:port").1.to_string();
    // The reference without emulation: the same program on the host, through the same region.
    let (code, on_host, stderr) = flyt_test_support::run_with_timeout(
        Command::new(&setup.bandwidth)
            .args(["host-ivshmem", &reps])
            .env("LD_LIBRARY_PATH", &setup.lib)
            .env("FLYT_SERVER", &server.addresses[1])
            .env("FLYT_SHM", "on")
            .env("FLYT_IVSHMEM", &region),
        Duration::from_secs(600),
    );
    assert_eq!(code, 0, "{on_host}\n{stderr}");
    devices.extend(serial_ports(&server, 1, "vm-a"));
    devices.extend(["-nic".into(), "user,model=virtio-net-pci".into()]);
    // QEMU's user-mode network: the guest is 10.0.2.15, and 10.0.2.2 is the host's loopback.
    let body = format!(
        "ip link set lo up; ip addr add 10.0.2.15/24 dev eth0; ip link set eth0 up\n\
         {env} guest_copy ivshmem {reps}\n\
         FLYT_SERVER=10.0.2.2:{port} FLYT_SHM=off FLYT_IVSHMEM=off guest_copy tcp {reps}",
        env = session_env(0),
    );
    let image = setup.image("bandwidth", &body);
    let mut vm = Vm::boot(&setup.kernel, &image, &devices);
    let (console, powered_off) = vm.wait(Duration::from_secs(1200));
    let context = || format!("guest console:\n{console}\nserver log:\n{}", server.log_text());
    assert!(powered_off && console.matches("guest_copy done").count() == 2, "{}", context());
    let text = scrape_metrics(&metrics);
    let (region, socket) =
        (copied(&text, "h2d", "shm") + copied(&text, "d2h", "shm"), copied(&text, "h2d", "socket") + copied(&text, "d2h", "socket"));
    println!("| channel | memory | direction | bytes | median GB/s | p90 GB/s |");
    println!("| --- | --- | --- | ---: | ---: | ---: |");
    for line in on_host.lines().chain(console.lines()).filter_map(|line| line.trim().strip_prefix("bw ")) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if let [channel, memory, direction, bytes, median, p90] = fields[..] {
            println!("| {channel} | {memory} | {direction} | {bytes} | {median} | {p90} |");
        }
    }
    println!("server counters: {region:.0} bytes through the region, {socket:.0} through sockets");
}
