//! Oversubscription through the driver API (`docs/design/paging.md`): four apps of 4 MiB each
//! against an emulated server whose device holds 8 MiB (`--oversubscribe 2.0`, quota 16 MiB),
//! two over the shared-memory channel and two over the socket, take turns; each turn checks
//! every byte the app wrote last turn and writes new ones. Between turns an app makes no call,
//! so the server pages it out for the next; the apps see only latency.

#![allow(clippy::tests_outside_test_module, reason = "an integration test crate: every function in it is a test")]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use flyt_test_support::{OVERSUBSCRIBED, Server, driver_program, scratch_dir, toolkit_from};

/// One app: its stdin, and its stdout's lines as they come.
struct App {
    child: Child,
    input: ChildStdin,
    lines: Receiver<String>,
}

impl App {
    fn next_line(&self) -> String {
        self.lines.recv_timeout(Duration::from_secs(60)).expect("the app answers within a minute")
    }
}

#[test]
fn apps_twice_the_device_take_turns_through_the_driver_api() {
    let Some(cuda) = toolkit_from("FLYT_CUDA_HOME") else { return };
    let scratch = scratch_dir("paging-apps");
    let source = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/paging_turns.c");
    let (program, lib) = driver_program(std::path::Path::new(source), &cuda, &scratch);
    let socket = format!("unix:{}", scratch.join("flyt.sock").display());
    let args =
        [&["--device", "emulated", "--listen", &socket][..], &OVERSUBSCRIBED, &["--idle-page-out-ms", "50", "--resident-min-ms", "0"]];
    let server = Server::start(&args.concat(), &scratch);
    let mut apps: Vec<App> = (0..4)
        .map(|index| {
            let mut child = Command::new(&program)
                .args([index.to_string(), "4".into()])
                .env("LD_LIBRARY_PATH", &lib)
                .env("FLYT_SERVER", &server.addresses[0])
                .env("FLYT_SHM", if index % 2 == 0 { "on" } else { "off" })
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("the app starts");
            let input = child.stdin.take().unwrap();
            let stdout = child.stdout.take().unwrap();
            let (sender, lines) = channel();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if sender.send(line).is_err() {
                        return;
                    }
                }
            });
            let app = App { child, input, lines };
            // One at a time: the third and fourth fit only once the first two are paged out.
            assert_eq!(app.next_line(), "ready", "app {index}:\n{}", server.log_text());
            app
        })
        .collect();
    for turn in 0..24 {
        let app = &mut apps[turn % 4];
        writeln!(app.input, "turn").unwrap();
        let answer = app.next_line();
        assert_eq!(answer, format!("turn {} ok", turn / 4 + 1), "app {} turn {turn}:\n{}", turn % 4, server.log_text());
    }
    for (index, app) in apps.into_iter().enumerate() {
        let App { mut child, input, lines } = app;
        drop(input);
        assert_eq!(lines.recv_timeout(Duration::from_secs(30)).as_deref(), Ok("PASSED: 0 failure(s)"), "app {index}");
        assert!(child.wait().unwrap().success(), "app {index}");
    }
    let log = server.log_text();
    let (outs, ins) = (log.matches(" paged out").count(), log.matches(" paged in").count());
    assert!(outs >= 24 && ins >= 24, "{outs} page-outs, {ins} page-ins:\n{log}");
}
