//! A network that blips (issue 46, `docs/design/reconnect.md`): a TCP relay between the app and
//! an emulated server cuts every live connection 20 times, by a reset or a plain close, while a
//! driver-API program copies and checks in a loop: every result is right, the app sees no error,
//! and the server still serves one session. A server that is really gone is still a CUDA error
//! within `FLYT_RECONNECT_MS`.
//!
//! Skipped (with a line saying so) when `FLYT_CUDA_HOME` is not set; `tools/test` sets it.

#![allow(clippy::tests_outside_test_module, reason = "an integration test file is its own test crate")]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flyt_test_support::{Interactive, Server, driver_program, scrape_metrics, scratch_dir, series_value, toolkit_from, wait_until};

/// A TCP relay that can cut every connection it carries, on command.
struct Relay {
    address: String,
    /// Both ends of every live relayed connection.
    live: Arc<Mutex<Vec<TcpStream>>>,
    accepted: Arc<AtomicUsize>,
}

impl Relay {
    fn start(target: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("relay port");
        let address = listener.local_addr().expect("relay address").to_string();
        let live = Arc::new(Mutex::new(Vec::new()));
        let accepted = Arc::new(AtomicUsize::new(0));
        let (target, relayed, counted) = (target.to_string(), live.clone(), accepted.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(&target) else { continue };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                relayed.lock().unwrap().extend([client.try_clone().unwrap(), server.try_clone().unwrap()]);
                counted.fetch_add(1, Ordering::SeqCst);
                for (from, to) in [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)] {
                    std::thread::spawn(move || pump(from, to));
                }
            }
        });
        Self { address, live, accepted }
    }

    /// Cuts every live connection, both ways: with a reset (an abortive close) or a plain close.
    fn cut(&self, reset: bool) {
        for stream in self.live.lock().unwrap().drain(..) {
            if reset {
                let linger = libc::linger { l_onoff: 1, l_linger: 0 };
                // SAFETY: setsockopt on a socket this relay owns, with a `linger` read during the call.
                unsafe {
                    libc::setsockopt(
                        stream.as_raw_fd(),
                        libc::SOL_SOCKET,
                        libc::SO_LINGER,
                        std::ptr::addr_of!(linger).cast(),
                        libc::socklen_t::try_from(std::mem::size_of::<libc::linger>()).unwrap(),
                    );
                }
            }
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

/// Copies one direction until either end fails, then ends both.
fn pump(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(read) => {
                if to.write_all(&buf[..read]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

fn free_port() -> String {
    TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("its address").to_string()
}

fn sessions(metrics: &str) -> Option<f64> {
    series_value(&scrape_metrics(metrics), "flyt_rpc_sessions{allocation=\"blips\"}")
}

fn compiled(name: &str) -> Option<(PathBuf, PathBuf, PathBuf)> {
    let cuda = toolkit_from("FLYT_CUDA_HOME")?;
    let scratch = scratch_dir(name);
    let source = format!("{}/tests/c/driver_reconnect.c", env!("CARGO_MANIFEST_DIR"));
    let (program, lib) = driver_program(Path::new(&source), &cuda, &scratch);
    Some((scratch, program, lib))
}

/// The looping program (`c/driver_reconnect.c`) started as an app of `server` (its
/// `FLYT_SERVER`), without the shared-memory channel and with `env`, its "ready" line read.
fn start_loop(program: &Path, lib: &Path, server: &str, args: &[&str], env: &[(&str, &str)], log: &Server) -> Interactive {
    let mut command = Command::new(program);
    command.args(args).env("LD_LIBRARY_PATH", lib).env("FLYT_SERVER", server).env("FLYT_SHM", "off").envs(env.iter().copied());
    let mut app = Interactive::spawn(&mut command);
    assert_eq!(app.read_line().trim(), "ready", "{}", log.log_text());
    app
}

/// How many times the server logged a client coming back to its session.
fn came_back(server: &Server) -> usize {
    server.log_text().matches("the client came back: the session goes on").count()
}

/// Cuts the relay's connections (`reset` or a plain close) and waits for the app's `cut`th return.
fn cut_and_come_back(relay: &Relay, server: &Server, cut: usize, reset: bool) {
    let connections = relay.accepted.load(Ordering::SeqCst);
    relay.cut(reset);
    let back = wait_until(Duration::from_secs(15), || relay.accepted.load(Ordering::SeqCst) > connections && came_back(server) > cut);
    assert!(back, "cut {cut}: the app did not come back:\n{}", server.log_text());
}

/// Stops the loop: it must end well, every result right and nothing told to the app; its output
/// after "ready".
fn stop_loop(app: Interactive, server: &Server) -> String {
    let mut app = app;
    app.send("stop");
    let (status, rest, stderr) = app.finish();
    assert!(status.success(), "{rest}\n{stderr}\n{}", server.log_text());
    assert!(rest.contains(", wrong: 0") && rest.contains("PASSED: 0 failure(s)"), "{rest}\n{stderr}");
    assert!(stderr.trim().is_empty(), "the app was told something:\n{stderr}");
    rest
}

#[test]
fn twenty_cut_connections_cost_the_app_nothing() {
    let Some((scratch, program, lib)) = compiled("reconnect-blips") else { return };
    let metrics = free_port();
    let server = Server::start(
        &["--device", "emulated", "--listen", "127.0.0.1:0", "--allocation", "blips", "--metrics-listen", &metrics],
        &scratch,
    );
    assert!(server.wait_for_log("metrics on http://", Duration::from_secs(10)), "{}", server.log_text());
    let relay = Relay::start(&server.addresses[0]);
    // Striped copies open data connections of their own, which this does not resume.
    let app = start_loop(&program, &lib, &relay.address, &[], &[("FLYT_STRIPES", "0")], &server);

    const CUTS: usize = 20;
    for cut in 0..CUTS {
        // Traffic flows a little on the current connection first.
        std::thread::sleep(Duration::from_millis(150));
        cut_and_come_back(&relay, &server, cut, cut % 2 == 0);
    }
    assert_eq!(came_back(&server), CUTS, "{}", server.log_text());
    assert_eq!(sessions(&metrics), Some(1.0), "one session, as before the cuts:\n{}", server.log_text());

    let rest = stop_loop(app, &server);
    let iterations: u64 = rest
        .lines()
        .find_map(|line| line.strip_prefix("iterations: ")?.split(',').next()?.parse().ok())
        .expect("the program counts its iterations");
    assert!(iterations >= CUTS as u64, "only {iterations} iteration(s) ran across {CUTS} cuts");
    // The app said goodbye at its exit: its session ends at once, not a grace period later.
    assert!(wait_until(Duration::from_secs(5), || sessions(&metrics) == Some(0.0)), "{}", server.log_text());
    assert!(server.log_text().contains("session ended by the client"), "{}", server.log_text());
}

/// Over TLS: each returning connection makes its own TLS handshake through the relay, and the
/// session's plain bytes go on where they were.
#[test]
fn cuts_under_tls_cost_the_app_nothing() {
    let Some((scratch, program, lib)) = compiled("reconnect-tls") else { return };
    let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let (cert, key) = (scratch.join("server.pem"), scratch.join("server.key"));
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let server = Server::start(&["--device", "emulated", "--listen", "127.0.0.1:0", "--tls-cert", &cert, "--tls-key", &key], &scratch);
    let relay = Relay::start(&server.addresses[0]);
    let app = start_loop(&program, &lib, &relay.address, &[], &[("FLYT_TLS_CA", &cert), ("FLYT_STRIPES", "0")], &server);
    assert!(server.log_text().contains("transport=tls"), "{}", server.log_text());
    for cut in 0..5 {
        std::thread::sleep(Duration::from_millis(150));
        cut_and_come_back(&relay, &server, cut, cut % 2 == 0);
    }
    stop_loop(app, &server);
    assert_eq!(came_back(&server), 5, "{}", server.log_text());
}

/// Large copies striped over data connections (4 over TCP): a cut breaks those too, a copy under
/// way is sent again whole over the main connection, and the data connections join again for the
/// copies after; the app hears nothing.
#[test]
fn striped_copies_cut_under_way_are_sent_again() {
    let Some((scratch, program, lib)) = compiled("reconnect-striped") else { return };
    let server = Server::start(&["--device", "emulated", "--listen", "127.0.0.1:0"], &scratch);
    let relay = Relay::start(&server.addresses[0]);
    let mut app = start_loop(&program, &lib, &relay.address, &["large"], &[("FLYT_STRIPE_LZ4", "off")], &server);
    for cut in 0..3 {
        if cut == 0 {
            // The first cut lands inside a striped host-to-device copy (24 MiB over the relay).
            let mut line = app.read_line();
            while !line.starts_with("copy up 2") {
                assert!(!line.is_empty(), "the loop ended before its first copy up");
                line = app.read_line();
            }
            std::thread::sleep(Duration::from_millis(3));
        } else {
            std::thread::sleep(Duration::from_millis(300));
        }
        cut_and_come_back(&relay, &server, cut, cut % 2 == 1);
    }
    std::thread::sleep(Duration::from_millis(300));
    stop_loop(app, &server);
    let log = server.log_text();
    assert!(log.contains("data connection joined"), "the copies were striped:\n{log}");
    // The data connections joined again after the cuts: later copies were striped too.
    let joined = log.matches("data connection joined").count();
    assert!(joined > 4, "only {joined} data connection(s) joined:\n{log}");
    assert!(log.contains("the client sends it again"), "no striped copy was cut under way:\n{log}");
}

/// A server that is really gone (listener and worker killed) is the CUDA error it always was,
/// within `FLYT_RECONNECT_MS` of the break and with the reason.
#[test]
fn a_server_really_gone_is_an_error_within_the_reconnect_window() {
    let Some((scratch, program, lib)) = compiled("reconnect-gone") else { return };
    let mut server = Server::start(&["--device", "emulated", "--listen", "127.0.0.1:0"], &scratch);
    let app = start_loop(&program, &lib, &server.addresses[0], &[], &[("FLYT_RECONNECT_MS", "2000")], &server);
    std::thread::sleep(Duration::from_millis(300));
    let worker = server.session_worker(0);
    server.kill();
    // SAFETY: signals a process this test's server started.
    unsafe { libc::kill(worker, libc::SIGKILL) };
    let killed = Instant::now();
    let (status, rest, stderr) = app.finish();
    let took = killed.elapsed();
    assert!(!status.success(), "{rest}\n{stderr}");
    assert!(rest.contains("stopped by CUDA_ERROR_"), "{rest}\n{stderr}");
    assert!(took < Duration::from_secs(8), "the error took {took:?}:\n{rest}\n{stderr}");
    assert!(stderr.contains("FLYT_RECONNECT_MS"), "the reason is told:\n{stderr}");
}
