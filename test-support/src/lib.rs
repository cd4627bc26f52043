//! Helpers for Flyt's integration tests: where the built binaries and `libcudart.so.13` are, a
//! CUDA 13 toolkit (headers and nvcc from NVIDIA's PyPI wheels, fetched once), and a
//! `flyt-rpc-server` running for the length of a test.
#![forbid(unsafe_code)]

pub mod guest;
pub mod regions;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("test-support lives in the workspace").to_path_buf()
}

/// The cargo profile directory the running test was built into (`target/debug`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test>-<hash>
    exe.parent().and_then(Path::parent).expect("test binaries live in <profile>/deps").to_path_buf()
}

/// A built artifact of the workspace; panics with what to do when it is missing.
pub fn artifact(name: &str) -> PathBuf {
    let path = profile_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace first (`cargo build --workspace`, or run `cargo test --workspace`)",
        path.display()
    );
    path
}

/// A directory laid out as Flyt's library folder, for `LD_LIBRARY_PATH`: `libcudart.so.13` (the
/// runtime front), `libnvidia-ml.so.1` (NVML) and `libcuda.so.1` (the driver both run over).
pub fn shim_lib_dir() -> PathBuf {
    let dir = profile_dir().join("flyt-shim-lib");
    std::fs::create_dir_all(&dir).expect("shim lib dir");
    for (built, name) in
        [("libcudart.so", "libcudart.so.13"), ("libflyt_libcuda.so", "libcuda.so.1"), ("libflyt_nvml_lib.so", "libnvidia-ml.so.1")]
    {
        let library = artifact(built);
        let link = dir.join(name);
        if std::fs::read_link(&link).ok().as_deref() != Some(library.as_path()) {
            // Tests run in parallel: build the link aside and rename it into place, so no test
            // ever sees the name missing.
            let staged = dir.join(format!(".{name}.{}.{:?}", std::process::id(), std::thread::current().id()));
            let _ = std::fs::remove_file(&staged);
            std::os::unix::fs::symlink(&library, &staged).unwrap_or_else(|error| panic!("symlink {name}: {error}"));
            std::fs::rename(&staged, &link).unwrap_or_else(|error| panic!("place {name}: {error}"));
        }
    }
    dir
}

/// The CUDA 13 toolkit (`include/`, `bin/nvcc`, `lib/libcudart.so.13`), fetched once by
/// `.ci/fetch-cuda-toolkit` into `.cuda/` (or `FLYT_CUDA_HOME`).
pub fn cuda_toolkit() -> PathBuf {
    let script = workspace_root().join(".ci/fetch-cuda-toolkit");
    let output = Command::new(&script).output().unwrap_or_else(|error| panic!("{}: {error}", script.display()));
    assert!(output.status.success(), "fetching the CUDA toolkit failed:\n{}", String::from_utf8_lossy(&output.stderr));
    PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
}

/// The CUDA toolkit the environment `variable` names (`FLYT_CUDA_HOME`, `FLYT_CUDA12_HOME`), or
/// `None` after a line saying the test is skipped (`tools/test` sets them).
pub fn toolkit_from(variable: &str) -> Option<PathBuf> {
    let toolkit = std::env::var_os(variable).map(PathBuf::from);
    if toolkit.is_none() {
        eprintln!("skipped: {variable} is not set (tools/test sets it)");
    }
    toolkit
}

/// Polls `done` every 20 ms until it holds or `timeout` has passed; whether it held.
pub fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    done()
}

/// A program a test talks with line by line (it says when it is ready, the test tells it to go
/// on), its standard streams piped.
pub struct Interactive {
    child: Child,
    stdout: BufReader<ChildStdout>,
}

impl Interactive {
    pub fn spawn(command: &mut Command) -> Self {
        let mut child = command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start the program");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Self { child, stdout }
    }

    /// The program's next line, its line end left on ("" at the end of its output).
    pub fn read_line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("the program's output");
        line
    }

    /// Sends the program `line` and a line end.
    pub fn send(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin.write_all(format!("{line}\n").as_bytes()).expect("write to the program");
    }

    /// Stops the program at once (SIGKILL).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Reads the rest of the program's stdout and all its stderr and waits for its end:
    /// (its status, the rest of its stdout, its stderr).
    pub fn finish(mut self) -> (ExitStatus, String, String) {
        let mut rest = String::new();
        self.stdout.read_to_string(&mut rest).expect("the program's output");
        let mut stderr = String::new();
        self.child.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("the program's errors");
        let status = self.child.wait().expect("the program ends");
        (status, rest, stderr)
    }
}

impl Drop for Interactive {
    /// A test that fails midway leaves no program behind.
    fn drop(&mut self) {
        self.kill();
    }
}

/// Server arguments of the paging tests' oversubscribed emulated device: 8 MiB of device memory,
/// a quota of twice that.
pub const OVERSUBSCRIBED: [&str; 6] = ["--emulated-memory", "8MiB", "--memory-quota", "16MiB", "--oversubscribe", "2.0"];

/// A unique scratch directory for one test.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flyt-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// An emulated-device server with a memory quota, a cluster key and the control socket the node
/// manager uses: `(server, data socket address, control socket path, key file)`. The key file
/// holds `key` with the mode the daemons require (0600); `extra` arguments are added.
pub fn controlled_server(scratch: &Path, key: &str, quota: &str, extra: &[&str]) -> (Server, String, PathBuf, PathBuf) {
    let key_file = scratch.join("cluster.key");
    std::fs::write(&key_file, key).expect("write the cluster key");
    std::fs::set_permissions(&key_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("key file mode");
    let socket = format!("unix:{}", scratch.join("data.sock").display());
    let control = scratch.join("control.sock");
    let control_arg = format!("unix:{}", control.display());
    let key_arg = key_file.display().to_string();
    let mut args = vec![
        "--device",
        "emulated",
        "--listen",
        &socket,
        "--memory-quota",
        quota,
        "--cluster-key-file",
        &key_arg,
        "--control",
        &control_arg,
    ];
    args.extend_from_slice(extra);
    let server = Server::start(&args, scratch);
    (server, socket, control, key_file)
}

/// A running `flyt-rpc-server`, stopped when dropped.
pub struct Server {
    child: Child,
    /// The addresses it announced, in the order given (`127.0.0.1:PORT`, `unix:/path`).
    pub addresses: Vec<String>,
    /// Where its stderr (the log) goes.
    pub log: PathBuf,
}

impl Server {
    /// Starts the server with `args` (e.g. `--device emulated --listen 127.0.0.1:0`) and waits
    /// for its ready line.
    pub fn start(args: &[&str], scratch: &Path) -> Self {
        Self::start_with_env(args, scratch, &[])
    }

    /// As `start`, with `env` (name, value) set for the server only (test knobs such as the
    /// emulated device's, which a test must not set for the whole test process).
    pub fn start_with_env(args: &[&str], scratch: &Path, env: &[(&str, &str)]) -> Self {
        Self::start_through(&[], args, scratch, env)
    }

    /// As `start_with_env`, the server run by `through` (a command and its arguments that run
    /// the one after them, as `ip netns exec NAME` does: the server in a network namespace).
    pub fn start_through(through: &[&str], args: &[&str], scratch: &Path, env: &[(&str, &str)]) -> Self {
        let log = scratch.join("server.log");
        let log_file = std::fs::File::create(&log).expect("server log");
        let server = artifact("flyt-rpc-server");
        let mut command = match through.split_first() {
            Some((first, rest)) => {
                let mut command = Command::new(first);
                command.args(rest).arg(&server);
                command
            }
            None => Command::new(&server),
        };
        let mut child = command
            .args(args)
            .envs(env.iter().copied())
            .env("FLYT_LOG", "info")
            // Each test's own module image cache, never the user's.
            .env("FLYT_RPC_IMAGE_CACHE", scratch.join("images"))
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .expect("start flyt-rpc-server");
        let stdout = child.stdout.take().expect("server stdout");
        let (lines, ready) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
        let line = ready.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| {
            let _ = child.kill();
            panic!("flyt-rpc-server did not become ready; log:\n{}", std::fs::read_to_string(&log).unwrap_or_default())
        });
        let addresses = line
            .strip_prefix("flyt-rpc-server listening on ")
            .unwrap_or_else(|| panic!("unexpected ready line: {line}"))
            .split_whitespace()
            .map(str::to_string)
            .collect();
        Self { child, addresses, log }
    }

    /// The server's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `needle` (bounded); `false` on timeout.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.log_text().contains(needle) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// The worker process of the `nth` session the listener opened (0: the first), from the log
    /// line it wrote for it ("opened: ... worker=PID"), which may come a moment after the app's
    /// first reply: waited for up to 10 s.
    pub fn session_worker(&self, nth: usize) -> i32 {
        let opened = |log: &str| log.lines().filter(|line| line.contains("opened:")).nth(nth).map(str::to_string);
        let mut line = None;
        wait_until(Duration::from_secs(10), || {
            line = opened(&self.log_text());
            line.is_some()
        });
        let line = line.unwrap_or_else(|| panic!("no log line for session {nth}:\n{}", self.log_text()));
        line.rsplit("worker=").next().and_then(|w| w.split_whitespace().next()).and_then(|w| w.parse().ok()).expect("worker pid")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the server at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SIGTERM lets the listener stop its workers; SIGKILL if it does not go.
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a command with a time limit; returns (exit code or -1, stdout, stderr).
pub fn run_with_timeout(command: &mut Command, timeout: Duration) -> (i32, String, String) {
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut text);
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
    let deadline = Instant::now() + timeout;
    let code = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status.code().unwrap_or(-1);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break -1;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    (code, out.join().unwrap_or_default(), err.join().unwrap_or_default())
}

/// Compiles a C file against the CUDA 13 headers and links it with `-lcudart` from `lib_dir`.
pub fn compile_c(source: &Path, output: &Path, lib_dir: &Path, extra: &[&str]) {
    let cuda = cuda_toolkit();
    let status = Command::new("cc")
        .arg("-O1")
        .arg("-Wall")
        .arg(format!("-I{}", cuda.join("include").display()))
        .arg(source)
        .arg("-o")
        .arg(output)
        .arg(format!("-L{}", lib_dir.display()))
        .arg("-l:libcudart.so.13")
        .args(extra)
        .status()
        .expect("cc");
    assert!(status.success(), "compiling {} failed", source.display());
}

/// A `lib` folder in `scratch` holding this build's driver library under the name programs load,
/// `libcuda.so.1` (for `LD_LIBRARY_PATH`).
pub fn driver_lib(scratch: &Path) -> PathBuf {
    let lib = scratch.join("lib");
    std::fs::create_dir_all(&lib).expect("lib dir");
    let link = lib.join("libcuda.so.1");
    if !link.exists() {
        std::os::unix::fs::symlink(artifact("libflyt_libcuda.so"), &link).expect("link libcuda.so.1");
    }
    lib
}

/// Builds a driver-API C program against Flyt's `libcuda.so.1` (in `driver_lib(scratch)`),
/// including `cuda.h` from the toolkit at `cuda`. Returns (program, lib folder).
pub fn driver_program(source: &Path, cuda: &Path, scratch: &Path) -> (PathBuf, PathBuf) {
    let lib = driver_lib(scratch);
    let program = scratch.join(source.file_stem().expect("a source file name"));
    let status = Command::new("cc")
        .args(["-std=gnu11", "-Wall", "-Werror", "-O2"])
        .arg(format!("-I{}", cuda.join("include").display()))
        .arg(source)
        .arg("-o")
        .arg(&program)
        .arg(format!("-L{}", lib.display()))
        .arg("-l:libcuda.so.1")
        .status()
        .expect("a C compiler (cc) is needed for this test");
    assert!(status.success(), "compiling {}", source.display());
    (program, lib)
}

/// Every defined dynamic function symbol of a library (`nm -D`), each as `name` or, where the
/// library binds it to a version node, `name@@version`.
pub fn exported_functions(library: &Path) -> std::collections::BTreeSet<String> {
    let output = Command::new("nm")
        .args(["-D", "--with-symbol-versions", "--defined-only"])
        .arg(library)
        .output()
        .expect("nm (binutils) is needed for this test");
    assert!(output.status.success(), "nm {} failed", library.display());
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_, kind, name) = (fields.next()?, fields.next()?, fields.next()?);
            (kind == "T").then(|| name.to_string())
        })
        .collect()
}

/// The series the Grafana dashboard in `configs/` asks for whose names start with one of
/// `prefixes`.
pub fn dashboard_series(prefixes: &[&str]) -> std::collections::BTreeSet<String> {
    let path = workspace_root().join("configs/grafana-dashboard.json");
    let dashboard = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    prefixes
        .iter()
        .flat_map(|prefix| dashboard.match_indices(prefix))
        .map(|(at, _)| {
            let rest = &dashboard[at..];
            rest[..rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len())].to_string()
        })
        .collect()
}

/// Whether the exposition `text` has a sample of the series `name` (with or without labels).
pub fn serves(text: &str, name: &str) -> bool {
    text.lines().any(|line| line.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' ')))
}

/// The body of `http://address/metrics`, after checking the answer is `200`.
pub fn scrape_metrics(address: &str) -> String {
    let mut stream = std::net::TcpStream::connect(address).unwrap_or_else(|error| panic!("metrics at {address}: {error}"));
    stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").expect("send the scrape");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read the scrape");
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("not HTTP: {text}"));
    assert!(head.starts_with("HTTP/1.0 200"), "{head}");
    body.to_string()
}

/// The value of the series `name{labels}` (exactly as written) in a scrape.
pub fn series_value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}
