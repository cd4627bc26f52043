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

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use flyt_test_support::{Server, driver_program, run_with_timeout, scratch_dir, toolkit_from, wait_until};

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

#[test]
fn copies_stripe_across_a_veth_pair_as_many_ways_as_the_link_says() {
    let Some(cuda) = toolkit_from("FLYT_CUDA_HOME") else { return };
    let hosts = match Hosts::make("veth") {
        Ok(hosts) => hosts,
        Err(reason) => {
            eprintln!("skipped: no network namespaces here ({reason})");
            return;
        }
    };
    let scratch = scratch_dir("two-hosts");
    let source = format!("{}/tests/c/driver_striped_copies.c", env!("CARGO_MANIFEST_DIR"));
    let (program, lib) = driver_program(Path::new(&source), &cuda, &scratch);
    let through: Vec<&str> = [&["ip"][..], &Hosts::inside(&hosts.server)].concat();
    let server = Server::start_through(&through, &["--device", "emulated", "--listen", &format!("{SERVER_ADDRESS}:0")], &scratch, &[]);
    let address = server.addresses[0].clone();
    assert!(address.starts_with(SERVER_ADDRESS), "the server listens across the pair: {address}");

    let joins = || server.log_text().matches("data connection joined").count();
    for (env, expected) in [(None, 4), (Some(("FLYT_STRIPES_MAX", "2")), 2), (Some(("FLYT_STRIPES", "3")), 3)] {
        let before = joins();
        let mut app = Command::new("ip");
        app.args(Hosts::inside(&hosts.app)).arg(&program);
        app.env("LD_LIBRARY_PATH", &lib).env("FLYT_SERVER", &address).env("FLYT_SHM", "off").envs(env);
        let (code, stdout, stderr) = run_with_timeout(&mut app, Duration::from_secs(120));
        let what = format!("{env:?}");
        assert_eq!(code, 0, "{what}\n{stdout}\n{stderr}\n{}", server.log_text());
        assert!(stdout.contains("PASSED: 0 failure(s)"), "{what}\n{stdout}\n{stderr}");
        assert!(!stderr.contains("bulk copies use one connection"), "{what}: striping fell back\n{stderr}");
        // The worker logs a join just after answering it.
        wait_until(Duration::from_secs(5), || joins() - before >= expected);
        assert_eq!(joins() - before, expected, "{what}: data connections joined\n{}", server.log_text());
    }
    // Every session came from the app's side of the pair.
    let log = server.log_text();
    let opened: Vec<&str> = log.lines().filter(|line| line.contains("opened:")).collect();
    assert_eq!(opened.len(), 3, "{log}");
    assert!(opened.iter().all(|line| line.contains(&format!("peer={APP_ADDRESS}:"))), "{log}");
}

/// A process killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Each way's delay in the relay, microseconds.
const RELAY_DELAY_US: u64 = 1000;

#[test]
fn striped_copies_keep_every_byte_through_a_relay_that_delays_each_way() {
    let Some(cuda) = toolkit_from("FLYT_CUDA_HOME") else { return };
    let hosts = match Hosts::make("relay") {
        Ok(hosts) => hosts,
        Err(reason) => {
            eprintln!("skipped: no network namespaces here ({reason})");
            return;
        }
    };
    let scratch = scratch_dir("two-hosts-relay");
    let source = format!("{}/tests/c/driver_striped_copies.c", env!("CARGO_MANIFEST_DIR"));
    let (program, lib) = driver_program(Path::new(&source), &cuda, &scratch);
    let relay_source = format!("{}/../../benchmarks/delay_relay.c", env!("CARGO_MANIFEST_DIR"));
    let relay_program = scratch.join("delay_relay");
    let built = Command::new("cc").args(["-O2", "-pthread", "-o"]).arg(&relay_program).arg(&relay_source).status().expect("cc");
    assert!(built.success(), "delay_relay does not build");
    let through: Vec<&str> = [&["ip"][..], &Hosts::inside(&hosts.server)].concat();
    let server = Server::start_through(&through, &["--device", "emulated", "--listen", &format!("{SERVER_ADDRESS}:0")], &scratch, &[]);

    // The relay on the app's host: a port of the namespace's own loopback, free as nothing else
    // runs there.
    let relay_address = "127.0.0.1:7046";
    let mut relay = Command::new("ip");
    relay.args(Hosts::inside(&hosts.app)).arg(&relay_program).args([relay_address, &server.addresses[0], &RELAY_DELAY_US.to_string()]);
    let mut relay = Killed(relay.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("start delay_relay"));
    let mut ready = String::new();
    std::io::BufReader::new(relay.0.stdout.take().expect("relay stdout")).read_line(&mut ready).expect("relay's ready line");
    assert!(ready.starts_with("delay_relay listening"), "delay_relay: {ready}");

    let mut app = Command::new("ip");
    app.args(Hosts::inside(&hosts.app)).arg(&program);
    app.env("LD_LIBRARY_PATH", &lib).env("FLYT_SERVER", relay_address).env("FLYT_SHM", "off").env("FLYT_STRIPE_TRACE", "1");
    let (code, stdout, stderr) = run_with_timeout(&mut app, Duration::from_secs(300));
    assert_eq!(code, 0, "{stdout}\n{stderr}\n{}", server.log_text());
    assert!(stdout.contains("PASSED: 0 failure(s)"), "{stdout}\n{stderr}");
    assert!(!stderr.contains("bulk copies use one connection"), "striping fell back\n{stderr}");
    wait_until(Duration::from_secs(5), || server.log_text().matches("data connection joined").count() >= 4);
    assert_eq!(server.log_text().matches("data connection joined").count(), 4, "{}", server.log_text());
    // The delay is on the path: no striped copy answered sooner than a round trip through it.
    let replies: Vec<u64> = stderr
        .lines()
        .filter(|line| line.starts_with("flyt: striped copy traced "))
        .filter_map(|line| line.split_whitespace().find_map(|word| word.strip_prefix("reply_us="))?.parse().ok())
        .collect();
    assert!(!replies.is_empty(), "no copy traced\n{stderr}");
    let fastest = replies.iter().min().copied().unwrap_or(0);
    assert!(fastest >= 2 * RELAY_DELAY_US, "a copy answered in {fastest} us, under the relay's round trip\n{stderr}");
}
