//! Two hosts in one test (issue 46's test bed): two network namespaces this test makes, joined by
//! a veth pair, the emulated server in one and the app in the other, which reaches it only across
//! the pair. Large copies (`c/driver_striped_copies.c`, every byte checked) stripe over data
//! connections across it; their count follows the link, and a veth's speed (10 Gb/s, whatever
//! carries it) counts as unknown: 4, `FLYT_STRIPES_MAX` lower, `FLYT_STRIPES` exact. With a
//! round trip of a network: `benchmarks/delay_relay.c` in the app's namespace holds every byte 1
//! ms each way (the CI kernel has no `netem`).
//!
//! Skipped (with a line saying so) when `FLYT_CUDA_HOME` is not set (`tools/test` sets it) or
//! namespaces cannot be made here (not root, no `ip(8)`).

#![allow(clippy::tests_outside_test_module, reason = "an integration test file is its own test crate")]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use flyt_test_support::{Interactive, Server, driver_program, run_with_timeout, scratch_dir, toolkit_from, wait_until};

/// The two namespaces and the pair between them; deleted (and the pair with them) when dropped.
struct Hosts {
    server: String,
    app: String,
}

/// The pair's addresses, inside the namespaces only.
const SERVER_ADDRESS: &str = "10.201.0.1";
const APP_ADDRESS: &str = "10.201.0.2";

impl Hosts {
    /// Made with `ip`; `Err` with the reason where it cannot (the ones made are deleted).
    fn make(tag: &str) -> Result<Self, String> {
        let name = |side: &str| format!("flyt-{tag}-{}-{side}", std::process::id());
        let hosts = Self { server: name("s"), app: name("a") };
        let steps: [&[&str]; 11] = [
            &["netns", "add", &hosts.server],
            &["netns", "add", &hosts.app],
            &["link", "add", "flyt-s", "netns", &hosts.server, "type", "veth", "peer", "name", "flyt-a", "netns", &hosts.app],
            &["-n", &hosts.server, "addr", "add", &format!("{SERVER_ADDRESS}/30"), "dev", "flyt-s"],
            &["-n", &hosts.app, "addr", "add", &format!("{APP_ADDRESS}/30"), "dev", "flyt-a"],
            &["-n", &hosts.server, "link", "set", "flyt-s", "up"],
            &["-n", &hosts.app, "link", "set", "flyt-a", "up"],
            &["-n", &hosts.server, "link", "set", "lo", "up"],
            &["-n", &hosts.app, "link", "set", "lo", "up"],
            // Running a program inside takes more than making them (a mount namespace, /sys again).
            &["netns", "exec", &hosts.server, "true"],
            &["netns", "exec", &hosts.app, "true"],
        ];
        for step in steps {
            let output = Command::new("ip").args(step).stdin(Stdio::null()).output().map_err(|error| format!("ip: {error}"))?;
            if !output.status.success() {
                return Err(format!("ip {}: {}", step.join(" "), String::from_utf8_lossy(&output.stderr).trim()));
            }
        }
        Ok(hosts)
    }

    /// The command that runs a program in namespace `name`.
    fn inside(name: &str) -> [&str; 3] {
        ["netns", "exec", name]
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for name in [&self.server, &self.app] {
            let _ = Command::new("ip").args(["netns", "delete", name]).stderr(Stdio::null()).status();
        }
    }
}

/// The two hosts with the emulated server started in its namespace and
/// `c/driver_striped_copies.c` built for the app's.
struct TestBed {
    server: Server,
    program: PathBuf,
    lib: PathBuf,
    scratch: PathBuf,
    // Last: the namespaces go once nothing runs in them.
    hosts: Hosts,
}

impl TestBed {
    /// `None` (with a line saying why) where the test cannot run here.
    fn up(tag: &str) -> Option<Self> {
        let cuda = toolkit_from("FLYT_CUDA_HOME")?;
        let hosts = match Hosts::make(tag) {
            Ok(hosts) => hosts,
            Err(reason) => {
                eprintln!("skipped: no network namespaces here ({reason})");
                return None;
            }
        };
        let scratch = scratch_dir(&format!("two-hosts-{tag}"));
        let source = format!("{}/tests/c/driver_striped_copies.c", env!("CARGO_MANIFEST_DIR"));
        let (program, lib) = driver_program(Path::new(&source), &cuda, &scratch);
        let through: Vec<&str> = [&["ip"][..], &Hosts::inside(&hosts.server)].concat();
        let server = Server::start_through(&through, &["--device", "emulated", "--listen", &format!("{SERVER_ADDRESS}:0")], &scratch, &[]);
        assert!(server.addresses[0].starts_with(SERVER_ADDRESS), "the server listens across the pair: {}", server.addresses[0]);
        Some(Self { server, program, lib, scratch, hosts })
    }

    fn joins(&self) -> usize {
        self.server.log_text().matches("data connection joined").count()
    }

    /// Runs the app on its host against `address` with `env`: it passes, striping on, and
    /// `expected` data connections join. Returns its stderr.
    fn copies_pass(&self, address: &str, env: &[(&str, &str)], expected: usize) -> String {
        let before = self.joins();
        let mut app = Command::new("ip");
        app.args(Hosts::inside(&self.hosts.app)).arg(&self.program);
        app.env("LD_LIBRARY_PATH", &self.lib).env("FLYT_SERVER", address).env("FLYT_SHM", "off").envs(env.iter().copied());
        let (code, stdout, stderr) = run_with_timeout(&mut app, Duration::from_secs(300));
        let what = format!("{env:?}");
        assert_eq!(code, 0, "{what}\n{stdout}\n{stderr}\n{}", self.server.log_text());
        assert!(stdout.contains("PASSED: 0 failure(s)"), "{what}\n{stdout}\n{stderr}");
        assert!(!stderr.contains("bulk copies use one connection"), "{what}: striping fell back\n{stderr}");
        // The worker logs a join just after answering it.
        wait_until(Duration::from_secs(5), || self.joins() - before >= expected);
        assert_eq!(self.joins() - before, expected, "{what}: data connections joined\n{}", self.server.log_text());
        stderr
    }
}

#[test]
fn copies_stripe_across_a_veth_pair_as_many_ways_as_the_link_says() {
    let Some(bed) = TestBed::up("veth") else { return };
    let address = bed.server.addresses[0].clone();
    for (env, expected) in [(&[][..], 4), (&[("FLYT_STRIPES_MAX", "2")][..], 2), (&[("FLYT_STRIPES", "3")][..], 3)] {
        bed.copies_pass(&address, env, expected);
    }
    // Every session came from the app's side of the pair.
    let log = bed.server.log_text();
    let opened: Vec<&str> = log.lines().filter(|line| line.contains("opened:")).collect();
    assert_eq!(opened.len(), 3, "{log}");
    assert!(opened.iter().all(|line| line.contains(&format!("peer={APP_ADDRESS}:"))), "{log}");
}

/// Each way's delay in the relay, microseconds.
const RELAY_DELAY_US: u64 = 1000;

#[test]
fn striped_copies_keep_every_byte_through_a_relay_that_delays_each_way() {
    let Some(bed) = TestBed::up("relay") else { return };
    let relay_source = format!("{}/../../benchmarks/delay_relay.c", env!("CARGO_MANIFEST_DIR"));
    let relay_program = bed.scratch.join("delay_relay");
    let built = Command::new("cc").args(["-O2", "-pthread", "-o"]).arg(&relay_program).arg(&relay_source).status().expect("cc");
    assert!(built.success(), "delay_relay does not build");
    // The relay on the app's host: a port of the namespace's own loopback, free as nothing else
    // runs there. It prints its ready line or exits (a refused port: "" here).
    let relay_address = "127.0.0.1:7046";
    let mut relay = Command::new("ip");
    relay.args(Hosts::inside(&bed.hosts.app)).arg(&relay_program).args([
        relay_address,
        &bed.server.addresses[0],
        &RELAY_DELAY_US.to_string(),
    ]);
    let mut relay = Interactive::spawn(&mut relay);
    let ready = relay.read_line();
    assert!(ready.starts_with("delay_relay listening"), "delay_relay: {ready}");

    let stderr = bed.copies_pass(relay_address, &[("FLYT_STRIPE_TRACE", "1")], 4);
    // The delay is on the path: no striped copy answered sooner than a round trip through it.
    let replies: Vec<u64> = stderr
        .lines()
        .filter(|line| line.starts_with("flyt: striped copy traced "))
        .filter_map(|line| line.split_whitespace().find_map(|word| word.strip_prefix("reply_us="))?.parse().ok())
        .collect();
    assert!(!replies.is_empty(), "no copy traced\n{stderr}");
    let fastest = replies.iter().min().copied().unwrap_or(0);
    assert!(fastest >= 2 * RELAY_DELAY_US, "a copy answered in {fastest} us, under the relay's round trip\n{stderr}");
    relay.kill();
}
