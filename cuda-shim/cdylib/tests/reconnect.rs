//! A network that blips (issue 46, `docs/design/reconnect.md`): a TCP relay between the app and
//! an emulated server cuts every live connection 20 times, by a reset or a plain close, while a
//! driver-API program copies and checks in a loop: every result is right, the app sees no error,
//! and the server still serves one session. A server that is really gone is still a CUDA error
//! within `FLYT_RECONNECT_MS`.
//!
//! Skipped (with a line saying so) when `FLYT_CUDA_HOME` is not set; `tools/test` sets it.

#![allow(clippy::tests_outside_test_module, reason = "an integration test file is its own test crate")]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flyt_test_support::{Server, driver_program, scrape_metrics, scratch_dir, series_value};

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

fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    done()
}

fn compiled(name: &str) -> Option<(PathBuf, PathBuf, PathBuf)> {
    let Some(cuda) = std::env::var_os("FLYT_CUDA_HOME").map(PathBuf::from) else {
        eprintln!("skipped: FLYT_CUDA_HOME is not set (tools/test sets it)");
        return None;
    };
    let scratch = scratch_dir(name);
    let source = format!("{}/tests/c/driver_reconnect.c", env!("CARGO_MANIFEST_DIR"));
    let (program, lib) = driver_program(Path::new(&source), &cuda, &scratch);
    Some((scratch, program, lib))
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
    let mut app = Command::new(&program)
        .env("LD_LIBRARY_PATH", &lib)
        .env("FLYT_SERVER", &relay.address)
        .env("FLYT_SHM", "off")
        // Striped copies open data connections of their own, which this does not resume.
        .env("FLYT_STRIPES", "0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run driver_reconnect");
    let mut out = BufReader::new(app.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("ready");
    assert_eq!(line.trim(), "ready", "{}", server.log_text());

    const CUTS: usize = 20;
    let came_back = |log: &str| log.matches("the client came back: the session goes on").count();
    for cut in 0..CUTS {
        // Traffic flows a little on the current connection first.
        std::thread::sleep(Duration::from_millis(150));
        let connections = relay.accepted.load(Ordering::SeqCst);
        relay.cut(cut % 2 == 0);
        let back = wait_until(Duration::from_secs(15), || {
            relay.accepted.load(Ordering::SeqCst) > connections && came_back(&server.log_text()) > cut
        });
        assert!(back, "cut {cut}: the app did not come back:\n{}", server.log_text());
    }
    assert_eq!(came_back(&server.log_text()), CUTS, "{}", server.log_text());
    assert_eq!(sessions(&metrics), Some(1.0), "one session, as before the cuts:\n{}", server.log_text());

    app.stdin.take().expect("stdin").write_all(b"stop\n").expect("stop the loop");
    let mut rest = String::new();
    out.read_to_string(&mut rest).expect("the program's output");
    let mut stderr = String::new();
    app.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("the program's errors");
    let status = app.wait().expect("the program ends");
    assert!(status.success(), "{rest}\n{stderr}\n{}", server.log_text());
    assert!(rest.contains(", wrong: 0") && rest.contains("PASSED: 0 failure(s)"), "{rest}\n{stderr}");
    let iterations: u64 = rest
        .lines()
        .find_map(|line| line.strip_prefix("iterations: ")?.split(',').next()?.parse().ok())
        .expect("the program counts its iterations");
    assert!(iterations >= CUTS as u64, "only {iterations} iteration(s) ran across {CUTS} cuts");
    assert!(stderr.trim().is_empty(), "the app was told something:\n{stderr}");
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
    let mut app = Command::new(&program)
        .env("LD_LIBRARY_PATH", &lib)
        .env("FLYT_SERVER", &relay.address)
        .env("FLYT_TLS_CA", &cert)
        .env("FLYT_SHM", "off")
        .env("FLYT_STRIPES", "0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run driver_reconnect");
    let mut out = BufReader::new(app.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("ready");
    assert_eq!(line.trim(), "ready", "{}", server.log_text());
    assert!(server.log_text().contains("transport=tls"), "{}", server.log_text());
    let came_back = |log: &str| log.matches("the client came back: the session goes on").count();
    for cut in 0..5 {
        std::thread::sleep(Duration::from_millis(150));
        relay.cut(cut % 2 == 0);
        let back = wait_until(Duration::from_secs(15), || came_back(&server.log_text()) > cut);
        assert!(back, "cut {cut}: the app did not come back:\n{}", server.log_text());
    }
    app.stdin.take().expect("stdin").write_all(b"stop\n").expect("stop the loop");
    let mut rest = String::new();
    out.read_to_string(&mut rest).expect("the program's output");
    let mut stderr = String::new();
    app.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("the program's errors");
    let status = app.wait().expect("the program ends");
    assert!(status.success(), "{rest}\n{stderr}\n{}", server.log_text());
    assert!(rest.contains(", wrong: 0") && rest.contains("PASSED: 0 failure(s)"), "{rest}\n{stderr}");
    assert!(stderr.trim().is_empty(), "the app was told something:\n{stderr}");
    assert_eq!(came_back(&server.log_text()), 5, "{}", server.log_text());
}

/// Large copies striped over data connections (4 over TCP): a cut breaks those too, a copy under
/// way is sent again whole over the main connection, and the data connections join again for the
/// copies after; the app hears nothing.
#[test]
fn striped_copies_cut_under_way_are_sent_again() {
    let Some((scratch, program, lib)) = compiled("reconnect-striped") else { return };
    let server = Server::start(&["--device", "emulated", "--listen", "127.0.0.1:0"], &scratch);
    let relay = Relay::start(&server.addresses[0]);
    let mut app = Command::new(&program)
        .arg("large")
        .env("LD_LIBRARY_PATH", &lib)
        .env("FLYT_SERVER", &relay.address)
        .env("FLYT_SHM", "off")
        .env("FLYT_STRIPE_LZ4", "off")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run driver_reconnect");
    let mut out = BufReader::new(app.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("ready");
    assert_eq!(line.trim(), "ready", "{}", server.log_text());
    let came_back = |log: &str| log.matches("the client came back: the session goes on").count();
    for cut in 0..3 {
        if cut == 0 {
            // The first cut lands inside a striped host-to-device copy (24 MiB over the relay).
            line.clear();
            while !line.starts_with("copy up 2") {
                line.clear();
                out.read_line(&mut line).expect("the loop's progress");
            }
            std::thread::sleep(Duration::from_millis(3));
        } else {
            std::thread::sleep(Duration::from_millis(300));
        }
        relay.cut(cut % 2 == 1);
        let back = wait_until(Duration::from_secs(15), || came_back(&server.log_text()) > cut);
        assert!(back, "cut {cut}: the app did not come back:\n{}", server.log_text());
    }
    std::thread::sleep(Duration::from_millis(300));
    app.stdin.take().expect("stdin").write_all(b"stop\n").expect("stop the loop");
    let mut rest = String::new();
    out.read_to_string(&mut rest).expect("the program's output");
    let mut stderr = String::new();
    app.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("the program's errors");
    let status = app.wait().expect("the program ends");
    assert!(status.success(), "{rest}\n{stderr}\n{}", server.log_text());
    assert!(rest.contains(", wrong: 0") && rest.contains("PASSED: 0 failure(s)"), "{rest}\n{stderr}");
    let log = server.log_text();
    assert!(log.contains("data connection joined"), "the copies were striped:\n{log}");
    assert!(stderr.trim().is_empty(), "the app was told something:\n{stderr}");
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
    let mut app = Command::new(&program)
        .env("LD_LIBRARY_PATH", &lib)
        .env("FLYT_SERVER", &server.addresses[0])
        .env("FLYT_SHM", "off")
        .env("FLYT_RECONNECT_MS", "2000")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run driver_reconnect");
    let mut out = BufReader::new(app.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("ready");
    assert_eq!(line.trim(), "ready", "{}", server.log_text());
    std::thread::sleep(Duration::from_millis(300));
    let log = server.log_text();
    let opening = log.lines().find(|l| l.contains("opened:")).expect("the session's log line").to_string();
    let worker: i32 =
        opening.rsplit("worker=").next().and_then(|w| w.split_whitespace().next()).and_then(|w| w.parse().ok()).expect("worker pid");
    server.kill();
    // SAFETY: signals a process this test's server started.
    unsafe { libc::kill(worker, libc::SIGKILL) };
    let killed = Instant::now();
    let mut rest = String::new();
    out.read_to_string(&mut rest).expect("the program's output");
    let took = killed.elapsed();
    let mut stderr = String::new();
    app.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("the program's errors");
    let status = app.wait().expect("the program ends");
    assert!(!status.success(), "{rest}\n{stderr}");
    assert!(rest.contains("stopped by CUDA_ERROR_"), "{rest}\n{stderr}");
    assert!(took < Duration::from_secs(8), "the error took {took:?}:\n{rest}\n{stderr}");
    assert!(stderr.contains("FLYT_RECONNECT_MS"), "the reason is told:\n{stderr}");
}
