//! The real `flyt` binary: exit statuses and signals pass through as a shell passes them, the
//! program sees Flyt's library folder first, the server is found or `flyt` says why not, and a
//! CUDA C program runs through `flyt run` against a real flyt-rpc-server on the emulated device.

#[cfg(test)]
mod tests {
    use std::{
        io::{BufRead, BufReader},
        os::unix::{net::UnixListener, process::CommandExt},
        path::{Path, PathBuf},
        process::{Command, Stdio},
        thread::JoinHandle,
        time::{Duration, Instant},
    };

    use flyt_protocol::{
        frame::{FrameLimits, read_value, write_value},
        locate::{LocateReply, LocateRequest},
    };
    use flyt_test_support::{Server, artifact, compile_c, run_with_timeout};
    use nix::{
        sys::signal::{Signal, kill},
        unistd::Pid,
    };

    const FLYT: &str = env!("CARGO_BIN_EXE_flyt");

    /// A library folder holding (empty) files of the names `flyt` requires.
    fn fake_lib_dir(parent: &Path) -> PathBuf {
        let dir = parent.join("lib");
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["libcudart.so.13", "libcuda.so.1", "libnvidia-ml.so.1"] {
            std::fs::write(dir.join(name), b"").unwrap();
        }
        std::fs::canonicalize(dir).unwrap()
    }

    /// `flyt` with nothing inherited that would choose a server or a folder for it.
    fn flyt(args: &[&str]) -> Command {
        let mut command = Command::new(FLYT);
        command
            .args(args)
            .env_remove("FLYT_SERVER")
            .env_remove("FLYT_TOKEN")
            .env_remove("FLYT_SHM")
            .env_remove("FLYT_LIB_DIR")
            .env_remove("FLYT_CLIENT_MANAGER_SOCKET")
            .env_remove("FLYT_LOCATE_TIMEOUT_SECONDS");
        command
    }

    /// Runs `flyt run` in direct mode (an address nobody listens on: only the program's shim
    /// would connect, and these programs have none) with a fake library folder.
    fn run_direct(lib: &Path, script: &str) -> (i32, String, String) {
        let lib = lib.to_str().unwrap();
        run_with_timeout(
            &mut flyt(&["run", "--lib-dir", lib, "--server", "127.0.0.1:9", "--", "sh", "-c", script]),
            Duration::from_secs(30),
        )
    }

    #[test]
    fn the_programs_exit_status_is_flyts() {
        let folder = tempfile::tempdir().unwrap();
        let lib = fake_lib_dir(folder.path());
        assert_eq!(run_direct(&lib, "exit 0").0, 0);
        let (code, _, stderr) = run_direct(&lib, "exit 3");
        assert_eq!(code, 3, "{stderr}");
        assert_eq!(stderr, "", "a plain exit needs no words from flyt");
    }

    #[test]
    fn a_program_killed_by_a_signal_makes_flyt_exit_128_plus_the_signal() {
        let folder = tempfile::tempdir().unwrap();
        let lib = fake_lib_dir(folder.path());
        let (code, _, stderr) = run_direct(&lib, "kill -TERM $$");
        assert_eq!(code, 128 + 15, "{stderr}");
        assert!(stderr.contains("was killed by SIGTERM"), "{stderr}");
    }

    #[test]
    fn signals_sent_to_flyt_reach_the_program() {
        let folder = tempfile::tempdir().unwrap();
        let lib = fake_lib_dir(folder.path());
        // The shell runs a trap once its current `sleep` ends; each trap says which signal came.
        let script = r#"
            for name in HUP INT QUIT USR1 USR2; do trap "echo got-$name" $name; done
            trap 'echo got-TERM; exit 7' TERM
            echo ready
            while :; do sleep 0.05; done"#;
        let mut command = flyt(&["run", "--lib-dir", lib.to_str().unwrap(), "--server", "127.0.0.1:9", "--", "sh", "-c", script]);
        command.stdout(Stdio::piped());
        // A test runner started in the background (`cmd &`, `nohup`) ignores SIGINT, SIGQUIT or
        // SIGHUP, and flyt rightly keeps an inherited "ignore": give flyt the default actions
        // this test is about.
        // SAFETY: between fork and exec only sigaction runs, which is async-signal-safe.
        unsafe {
            command.pre_exec(|| {
                for signal in [Signal::SIGHUP, Signal::SIGINT, Signal::SIGQUIT, Signal::SIGUSR1, Signal::SIGUSR2, Signal::SIGTERM] {
                    nix::sys::signal::signal(signal, nix::sys::signal::SigHandler::SigDfl).map_err(std::io::Error::from)?;
                }
                Ok(())
            })
        };
        let mut child = command.spawn().unwrap();
        let pid = Pid::from_raw(i32::try_from(child.id()).unwrap());
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut next_line = move || lines.next().and_then(Result::ok).unwrap_or_default();
        assert_eq!(next_line(), "ready");
        for (signal, name) in [
            (Signal::SIGHUP, "HUP"),
            (Signal::SIGINT, "INT"),
            (Signal::SIGQUIT, "QUIT"),
            (Signal::SIGUSR1, "USR1"),
            (Signal::SIGUSR2, "USR2"),
        ] {
            kill(pid, signal).unwrap();
            assert_eq!(next_line(), format!("got-{name}"), "{signal} sent to flyt");
        }
        kill(pid, Signal::SIGTERM).unwrap();
        assert_eq!(next_line(), "got-TERM");
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(7), "flyt exits with the program's status after its TERM trap");
    }

    #[test]
    fn the_program_sees_flyts_library_folder_first_and_triton_pointed_at_it() {
        let folder = tempfile::tempdir().unwrap();
        let lib = fake_lib_dir(folder.path());
        let lib_text = lib.to_str().unwrap();
        let (code, stdout, stderr) = run_with_timeout(
            flyt(&["run", "--lib-dir", lib_text, "--server", "gpu-host:7000", "--shm", "off", "--token", "t0k", "--", "sh", "-c"])
                .arg("echo \"$LD_LIBRARY_PATH|$TRITON_LIBCUDA_PATH|$FLYT_SERVER|$FLYT_TOKEN|$FLYT_SHM\"")
                .env("LD_LIBRARY_PATH", "/usr/local/cuda/lib64:/opt/other"),
            Duration::from_secs(30),
        );
        assert_eq!(code, 0, "{stderr}");
        assert_eq!(stdout.trim(), format!("{lib_text}:/usr/local/cuda/lib64:/opt/other|{lib_text}|gpu-host:7000|t0k|off"));
    }

    #[test]
    fn flyt_env_prints_what_flyt_run_sets() {
        let folder = tempfile::tempdir().unwrap();
        let lib = fake_lib_dir(folder.path());
        let lib_text = lib.to_str().unwrap();
        let (code, stdout, stderr) = run_with_timeout(
            flyt(&["env", "--lib-dir", lib_text, "--server", "gpu-host:7000"]).env("LD_LIBRARY_PATH", "/opt/other"),
            Duration::from_secs(30),
        );
        assert_eq!(code, 0, "{stderr}");
        // Evaluated by a shell, twice (as a shell profile might): the folder is there once.
        let script = format!(
            "eval \"$(cat <<'EOF'\n{stdout}EOF\n)\"; eval \"$(cat <<'EOF'\n{stdout}EOF\n)\"; echo \"$LD_LIBRARY_PATH|$TRITON_LIBCUDA_PATH|$FLYT_SERVER\""
        );
        let output = Command::new("sh").arg("-c").arg(script).env("LD_LIBRARY_PATH", "/opt/other").output().unwrap();
        assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), format!("{lib_text}:/opt/other|{lib_text}|gpu-host:7000"));
    }

    #[test]
    fn without_a_server_or_client_manager_flyt_says_so_and_runs_nothing() {
        let folder = tempfile::tempdir().unwrap();
        let lib = fake_lib_dir(folder.path());
        let marker = folder.path().join("ran");
        let (code, _, stderr) = run_with_timeout(
            flyt(&["run", "--lib-dir", lib.to_str().unwrap(), "--", "touch", marker.to_str().unwrap()])
                .env("FLYT_CLIENT_MANAGER_SOCKET", folder.path().join("client-manager.sock")),
            Duration::from_secs(30),
        );
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.starts_with("flyt: no Flyt server: pass --server or start the client manager"), "{stderr}");
        assert!(stderr.contains("client-manager.sock"), "names where it looked: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(!marker.exists(), "the program ran without a server");
        // A Unix socket address that names no socket is refused the same way.
        let (code, _, stderr) = run_with_timeout(
            &mut flyt(&["run", "--lib-dir", lib.to_str().unwrap(), "--server", "unix:/nonexistent/flyt.sock", "--", "true"]),
            Duration::from_secs(30),
        );
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains("no Flyt server at unix:/nonexistent/flyt.sock"), "{stderr}");
    }

    /// A client manager that answers `replies.len()` locate requests with these replies.
    fn client_manager(socket: &Path, replies: Vec<LocateReply>) -> JoinHandle<Vec<LocateRequest>> {
        let listener = UnixListener::bind(socket).unwrap();
        std::thread::spawn(move || {
            let mut requests = Vec::new();
            for reply in replies {
                let (mut stream, _) = listener.accept().unwrap();
                let (_, request): (u32, LocateRequest) = read_value(&mut stream, &FrameLimits::default()).unwrap();
                requests.push(request);
                write_value(&mut stream, 0, &reply).unwrap();
            }
            requests
        })
    }

    #[test]
    fn with_a_client_manager_the_program_asks_it_itself() {
        let folder = tempfile::tempdir().unwrap();
        let lib = fake_lib_dir(folder.path());
        let socket = folder.path().join("client-manager.sock");
        let reply = LocateReply::Server {
            address: "unix:/x".into(),
            token: "secret".into(),
            same_host: true,
            ivshmem: false,
            tls_ca: String::new(),
        };
        let answered = client_manager(&socket, vec![reply]);
        let (code, stdout, stderr) = run_with_timeout(
            flyt(&[
                "run",
                "--lib-dir",
                lib.to_str().unwrap(),
                "--",
                "sh",
                "-c",
                "echo \"${FLYT_SERVER-unset}|${FLYT_TOKEN-unset}|$FLYT_CLIENT_MANAGER_SOCKET\"",
            ])
            .env("FLYT_CLIENT_MANAGER_SOCKET", &socket),
            Duration::from_secs(30),
        );
        assert_eq!(code, 0, "{stderr}");
        // flyt holds no session and hands out no server: the program's shim locates its own.
        assert_eq!(stdout.trim(), format!("unset|unset|{}", socket.display()));
        let requests = answered.join().unwrap();
        assert_eq!(requests[0].client.program, "flyt run sh");
    }

    #[test]
    fn a_client_manager_that_refuses_or_hangs_stops_flyt_with_its_reason() {
        let folder = tempfile::tempdir().unwrap();
        let lib = fake_lib_dir(folder.path());
        let socket = folder.path().join("client-manager.sock");
        let answered = client_manager(&socket, vec![LocateReply::Refused { reason: "this VM has no GPU requirement".into() }]);
        let (code, _, stderr) = run_with_timeout(
            flyt(&["run", "--lib-dir", lib.to_str().unwrap(), "--", "true"]).env("FLYT_CLIENT_MANAGER_SOCKET", &socket),
            Duration::from_secs(30),
        );
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains("this VM has no GPU requirement"), "{stderr}");
        answered.join().unwrap();

        // Accepts and never answers, as a stopped client manager's socket does.
        let hung = folder.path().join("hung.sock");
        let listener = UnixListener::bind(&hung).unwrap();
        let held = std::thread::spawn(move || {
            let connection = listener.accept();
            std::thread::sleep(Duration::from_secs(3));
            drop(connection);
        });
        let started = Instant::now();
        let (code, _, stderr) = run_with_timeout(
            flyt(&["run", "--lib-dir", lib.to_str().unwrap(), "--locate-timeout-seconds", "1", "--", "true"])
                .env("FLYT_CLIENT_MANAGER_SOCKET", &hung),
            Duration::from_secs(30),
        );
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains("did not answer within 1 s"), "{stderr}");
        assert!(started.elapsed() < Duration::from_millis(2500), "took {:?}", started.elapsed());
        held.join().unwrap();
    }

    #[test]
    fn a_library_folder_without_flyts_libraries_is_refused() {
        let folder = tempfile::tempdir().unwrap();
        let lib = folder.path().join("lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libcudart.so.13"), b"").unwrap();
        let (code, _, stderr) =
            run_with_timeout(flyt(&["run", "--server", "127.0.0.1:9", "--", "true"]).env("FLYT_LIB_DIR", &lib), Duration::from_secs(30));
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains("lacks libcuda.so.1") && stderr.contains("--lib-dir"), "{stderr}");
        let (code, _, stderr) = run_with_timeout(
            &mut flyt(&["run", "--lib-dir", "/nonexistent/flyt/lib", "--server", "127.0.0.1:9", "--", "true"]),
            Duration::from_secs(30),
        );
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains("/nonexistent/flyt/lib does not exist"), "{stderr}");
    }

    /// The dist layout: `bin/flyt` finds `lib` beside its `bin` folder, through a symlink too.
    #[test]
    fn flyt_finds_the_lib_folder_beside_its_bin_folder() {
        let folder = tempfile::tempdir().unwrap();
        let dist = std::fs::canonicalize(folder.path()).unwrap().join("dist");
        std::fs::create_dir_all(dist.join("bin")).unwrap();
        std::fs::copy(FLYT, dist.join("bin/flyt")).unwrap();
        let script = ["run", "--server", "127.0.0.1:9", "--", "sh", "-c", "echo $LD_LIBRARY_PATH"];
        let mut command = Command::new(dist.join("bin/flyt"));
        command.args(script).env_remove("FLYT_LIB_DIR").env_remove("LD_LIBRARY_PATH");
        let (code, _, stderr) = run_with_timeout(&mut command, Duration::from_secs(30));
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains(&format!("{} does not exist", dist.join("lib").display())), "{stderr}");
        let lib = fake_lib_dir(&dist);
        let (code, stdout, stderr) = run_with_timeout(&mut command, Duration::from_secs(30));
        assert_eq!(code, 0, "{stderr}");
        assert_eq!(stdout.trim(), lib.to_str().unwrap());
        // Started through a link elsewhere (~/bin/flyt -> dist/bin/flyt): still dist/lib.
        let link = folder.path().join("flyt");
        std::os::unix::fs::symlink(dist.join("bin/flyt"), &link).unwrap();
        let (code, stdout, stderr) = run_with_timeout(
            Command::new(&link).args(script).env_remove("FLYT_LIB_DIR").env_remove("LD_LIBRARY_PATH"),
            Duration::from_secs(30),
        );
        assert_eq!(code, 0, "{stderr}");
        assert_eq!(stdout.trim(), lib.to_str().unwrap());
    }

    #[test]
    fn bad_usage_and_missing_commands_exit_2_or_as_a_shell_does() {
        let folder = tempfile::tempdir().unwrap();
        let lib = fake_lib_dir(folder.path());
        let lib = lib.to_str().unwrap();
        for args in [&["run"][..], &["run", "--server", "127.0.0.1:9"], &["run", "--bogus", "--", "true"], &["launch"], &[]] {
            let (code, _, stderr) = run_with_timeout(&mut flyt(args), Duration::from_secs(30));
            assert_eq!(code, 2, "flyt {args:?}: {stderr}");
            assert!(stderr.contains("Usage: flyt"), "flyt {args:?}: {stderr}");
        }
        let (code, _, stderr) =
            run_with_timeout(&mut flyt(&["run", "--lib-dir", lib, "--token", "t", "--", "true"]), Duration::from_secs(30));
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains("--token needs --server"), "{stderr}");
        let (code, _, stderr) = run_with_timeout(
            &mut flyt(&["run", "--lib-dir", lib, "--server", "127.0.0.1:9", "--", "flyt-no-such-command"]),
            Duration::from_secs(30),
        );
        assert_eq!(code, 127, "{stderr}");
        assert!(stderr.contains("flyt-no-such-command: command not found"), "{stderr}");
        let (code, _, stderr) =
            run_with_timeout(&mut flyt(&["run", "--lib-dir", lib, "--server", "127.0.0.1:9", "--", lib]), Duration::from_secs(30));
        assert_eq!(code, 126, "a folder is not a program: {stderr}");
    }

    #[test]
    fn help_explains_run_env_the_server_and_the_library_folder() {
        let output = flyt(&["--help"]).output().unwrap();
        let text = String::from_utf8_lossy(&output.stdout);
        for needle in
            ["flyt run -- ./my-cuda-app", "flyt env", "LD_LIBRARY_PATH", "TRITON_LIBCUDA_PATH", "FLYT_LIB_DIR", "client manager", "128"]
        {
            assert!(text.contains(needle), "flyt --help lacks {needle}:\n{text}");
        }
        let output = flyt(&["run", "--help"]).output().unwrap();
        let text = String::from_utf8_lossy(&output.stdout);
        for needle in ["--server", "--shm", "--token", "--lib-dir", "FLYT_SERVER", "SIGTERM", "COMMAND"] {
            assert!(text.contains(needle), "flyt run --help lacks {needle}:\n{text}");
        }
    }

    /// A CUDA C program, linked with -lcudart and started by `flyt run --server unix:...`, runs
    /// against a real flyt-rpc-server on the emulated device, finding Flyt's libcudart.so.13 only
    /// through the library path `flyt` sets; `--shm` reaches its shim.
    #[test]
    fn a_cuda_program_runs_through_flyt_run_against_a_real_server() {
        if std::env::var_os("FLYT_CUDA_HOME").is_none() {
            eprintln!("skipped: FLYT_CUDA_HOME is not set (tools/test sets it to the CUDA 13 toolkit)");
            return;
        }
        let folder = tempfile::tempdir().unwrap();
        let scratch = folder.path();
        // Flyt's library folder as tools/dist lays it out, from this build's artifacts.
        let lib = scratch.join("lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::os::unix::fs::symlink(artifact("libcudart.so"), lib.join("libcudart.so.13")).unwrap();
        std::os::unix::fs::symlink(artifact("libflyt_libcuda.so"), lib.join("libcuda.so.1")).unwrap();
        std::os::unix::fs::symlink(artifact("libflyt_nvml_lib.so"), lib.join("libnvidia-ml.so.1")).unwrap();
        let program = scratch.join("through_flyt");
        compile_c(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/through_flyt.c")), &program, &lib, &[]);
        // Without flyt the program does not even load: nothing else provides libcudart.so.13.
        let (code, _, stderr) = run_with_timeout(Command::new(&program).env_remove("LD_LIBRARY_PATH"), Duration::from_secs(30));
        assert_ne!(code, 0, "the program started without Flyt's library folder: {stderr}");

        let socket = format!("unix:{}", scratch.join("flyt.sock").display());
        let server = Server::start(&["--device", "emulated", "--listen", &socket], scratch);
        for shm in ["off", "on"] {
            let (code, stdout, stderr) = run_with_timeout(
                flyt(&["run", "--lib-dir", lib.to_str().unwrap(), "--server", &socket, "--shm", shm, "--"])
                    .arg(&program)
                    .env_remove("LD_LIBRARY_PATH"),
                Duration::from_secs(120),
            );
            assert_eq!(code, 0, "--shm {shm}:\n{stdout}\n{stderr}");
            assert!(stdout.contains("PASSED: 0 failure(s)"), "--shm {shm}:\n{stdout}\n{stderr}");
        }
        assert!(server.wait_for_log("session 2 closed", Duration::from_secs(10)), "{}", server.log_text());
        let log = server.log_text();
        assert_eq!(log.matches("opened: program=through_flyt").count(), 2, "{log}");
        assert_eq!(log.matches("shared-memory channel open").count(), 1, "only the --shm on run: {log}");
    }
}
