//! No silent success: every export of `libcudart.so.13` either does what CUDA documents or fails
//! with an error and its one line on stderr. C programs built against the real CUDA 13 headers
//! drive a real `flyt-rpc-server` on the emulated device:
//!
//! - `audit_implemented.c` audits each implemented export (invalid input fails with CUDA's
//!   error; a call that succeeds has its effect checked through another path). The test compares
//!   the exports it audited with the export table, so a new export without an audit fails here.
//! - `audit_unsupported.c` calls every export Flyt does not support, by its dynamic symbol: each
//!   answers `cudaErrorNotSupported` and prints its line once.
//! - `graph_path.c` is a typical CUDA graphs program (capture, instantiate, timed launches): a
//!   program that checks its errors stops at the first refused call; one that does not gets an
//!   error from every call of the path and no captured work runs behind its back.

#![allow(clippy::tests_outside_test_module, reason = "an integration test crate: every function in it is a test")]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use flyt_cudart::exports::EXPORTS;
use flyt_test_support::{Server, compile_c, run_with_timeout, scratch_dir, shim_lib_dir};

/// Compiles `tests/c/<source>.c` into `<scratch>/<output>`.
fn build(scratch: &Path, source: &str, output: &str, extra: &[&str]) -> PathBuf {
    let program = scratch.join(output);
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{source}.c"));
    compile_c(&source, &program, &shim_lib_dir(), extra);
    program
}

fn emulated_server(scratch: &Path) -> Server {
    let socket = format!("unix:{}", scratch.join("flyt.sock").display());
    Server::start(&["--device", "emulated", "--listen", "127.0.0.1:0", "--listen", &socket], scratch)
}

fn run(program: &Path, args: &[&str], server: &str, shm: &str, stdin: Option<&Path>) -> (i32, String, String) {
    let mut command = Command::new(program);
    command.args(args).env("LD_LIBRARY_PATH", shim_lib_dir()).env("FLYT_SERVER", server).env("FLYT_SHM", shm);
    if let Some(path) = stdin {
        command.stdin(std::fs::File::open(path).expect("stdin file"));
    }
    run_with_timeout(&mut command, Duration::from_secs(60))
}

/// The names a program printed as `audited <name>`, each once.
fn audited(stdout: &str) -> BTreeSet<String> {
    let names: Vec<String> = stdout.lines().filter_map(|line| line.strip_prefix("audited ")).map(str::to_string).collect();
    let set: BTreeSet<String> = names.iter().cloned().collect();
    assert_eq!(set.len(), names.len(), "an export audited twice:\n{stdout}");
    set
}

fn exports(implemented: bool) -> BTreeSet<String> {
    EXPORTS.iter().filter(|(_, supported)| *supported == implemented).map(|(name, _)| name.to_string()).collect()
}

fn unsupported_line(name: &str) -> String {
    format!("flyt: {name} is not supported through Flyt (returning cudaErrorNotSupported)")
}

/// Asserts that stderr holds exactly these lines, each once, in any order.
fn assert_stderr_lines(stderr: &str, expected: &[String]) {
    let mut got: Vec<&str> = stderr.lines().collect();
    let mut want: Vec<&str> = expected.iter().map(String::as_str).collect();
    got.sort_unstable();
    want.sort_unstable();
    assert_eq!(got, want, "stderr:\n{stderr}");
}

#[test]
fn every_implemented_export_does_its_work_or_fails_as_cuda_documents() {
    let scratch = scratch_dir("audit-implemented");
    let program = build(&scratch, "audit_implemented", "audit_implemented", &[]);
    let server = emulated_server(&scratch);
    // The socket path alone over TCP, and the shared-memory channel over the Unix socket.
    for (address, shm) in [(&server.addresses[0], "off"), (&server.addresses[1], "on")] {
        let (code, stdout, stderr) = run(&program, &[], address, shm, None);
        assert_eq!(code, 0, "over {address} with FLYT_SHM={shm}:\n{stdout}\n{stderr}");
        assert!(stdout.contains("PASSED: 0 failure(s)") && !stdout.contains("FAILED"), "{stdout}");
        let expected = exports(true);
        let done = audited(&stdout);
        let missing: Vec<_> = expected.difference(&done).collect();
        let unknown: Vec<_> = done.difference(&expected).collect();
        assert!(
            missing.is_empty() && unknown.is_empty(),
            "implemented exports without an audit entry in tests/c/audit_implemented.c: {missing:?}\n\
             audited names that are no implemented export: {unknown:?}"
        );
        // Each refusal said so, once, and nothing else was printed. Mapped memory is refused
        // only without the channel.
        let mapped_refusal = (shm == "off").then(|| {
            "flyt: cuMemHostAlloc with CU_MEMHOSTALLOC_DEVICEMAP needs the shared-memory channel (GPU server on this host) with the block's address free in the server (returning CUDA_ERROR_NOT_SUPPORTED)".to_string()
        });
        assert_stderr_lines(
            &stderr,
            &[
                "flyt: cudaHostRegister with cudaHostRegisterMapped is not supported through Flyt (returning cudaErrorNotSupported)"
                    .to_string(),
                "flyt: cudaHostRegister with cudaHostRegisterIoMemory is not supported through Flyt (returning cudaErrorNotSupported)"
                    .to_string(),
                unsupported_line("cudaGraphLaunch"),
                "flyt: ignoring a fatbinary in a format this runtime does not know".to_string(),
                "flyt: kernel fake_kernel cannot run: the server's emulated device has no GPU (cudaErrorNotSupported(801))".to_string(),
            ]
            .into_iter()
            .chain(mapped_refusal)
            .collect::<Vec<_>>(),
        );
    }
}

#[test]
fn every_unsupported_export_answers_not_supported_and_says_so_once() {
    let scratch = scratch_dir("audit-unsupported");
    let program = build(&scratch, "audit_unsupported", "audit_unsupported", &["-ldl"]);
    let server = emulated_server(&scratch);
    let names = exports(false);
    assert!(names.len() > 300, "the table lists {} unsupported exports", names.len());
    let list = scratch.join("unsupported.txt");
    std::fs::write(&list, names.iter().map(|name| format!("{name}\n")).collect::<String>()).unwrap();
    let (code, stdout, stderr) = run(&program, &[], &server.addresses[1], "auto", Some(&list));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(!stdout.contains("FAILED"), "{stdout}");
    assert_eq!(audited(&stdout), names);
    let lines: Vec<String> = names.iter().map(|name| unsupported_line(name)).collect();
    assert_stderr_lines(&stderr, &lines);
}

/// What the unchecked graph program must get from each call of the path.
fn expected_graph_path() -> BTreeMap<&'static str, &'static str> {
    const NOT_SUPPORTED: &str = "cudaErrorNotSupported";
    const INVALIDATED: &str = "cudaErrorStreamCaptureInvalidated";
    BTreeMap::from([
        ("cudaStreamBeginCapture", NOT_SUPPORTED),
        ("cudaEventRecord in capture", INVALIDATED),
        // A stream that waits for an event of the capture joins it.
        ("cudaStreamWaitEvent forking a second stream", INVALIDATED),
        ("cudaMemsetAsync on the forked stream", INVALIDATED),
        ("cudaEventRecord on the forked stream", INVALIDATED),
        ("cudaStreamWaitEvent joining the forked stream", INVALIDATED),
        ("cudaMemsetAsync in capture", INVALIDATED),
        ("cudaMemcpyAsync in capture", INVALIDATED),
        ("cudaStreamWaitEvent in capture", INVALIDATED),
        ("cudaStreamQuery in capture", INVALIDATED),
        ("cudaEventSynchronize on an event of the capture", "cudaErrorCapturedEvent"),
        ("cudaStreamIsCapturing", NOT_SUPPORTED),
        ("cudaStreamGetCaptureInfo", NOT_SUPPORTED),
        ("cudaStreamEndCapture", NOT_SUPPORTED),
        ("cudaGraphGetNodes", NOT_SUPPORTED),
        ("cudaGraphInstantiate", NOT_SUPPORTED),
        ("cudaGraphUpload", NOT_SUPPORTED),
        ("cudaGraphLaunch", NOT_SUPPORTED),
        // The launches never ran: the next synchronization says so.
        ("cudaEventSynchronize after the graph launches", NOT_SUPPORTED),
        // The event's record in the capture failed: it holds no time.
        ("cudaEventElapsedTime from an event recorded in capture", "cudaErrorInvalidResourceHandle"),
        ("cudaGraphExecDestroy", NOT_SUPPORTED),
        ("cudaGraphDestroy", NOT_SUPPORTED),
    ])
}

#[test]
fn a_graph_program_fails_loudly_at_every_step() {
    let scratch = scratch_dir("graph-path");
    let server = emulated_server(&scratch);
    for per_thread in [false, true] {
        let (name, extra, suffix) = if per_thread {
            ("graph_path-ptsz", &["-DCUDA_API_PER_THREAD_DEFAULT_STREAM"][..], "_ptsz")
        } else {
            ("graph_path", &[][..], "")
        };
        let program = build(&scratch, "graph_path", name, extra);

        // A program that checks its errors stops at the capture, says where, and exits 1.
        let (code, stdout, stderr) = run(&program, &["checked"], &server.addresses[1], "auto", None);
        assert_eq!(code, 1, "{name}:\n{stdout}\n{stderr}");
        assert!(!stdout.contains("per graph launch"), "no timing may be printed:\n{stdout}");
        assert!(stderr.contains(&unsupported_line(&format!("cudaStreamBeginCapture{suffix}"))), "{stderr}");
        assert!(stderr.contains("CUDA error cudaErrorNotSupported (operation not supported)"), "{stderr}");
        assert!(stderr.contains("cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal)"), "{stderr}");

        // A program that checks nothing gets an error from every call of the path.
        let (code, stdout, stderr) = run(&program, &["unchecked"], &server.addresses[0], "off", None);
        assert_eq!(code, 0, "{name}:\n{stdout}\n{stderr}");
        let got: BTreeMap<&str, &str> =
            stdout.lines().filter_map(|line| line.strip_prefix("call ")).filter_map(|line| line.split_once(" -> ")).collect();
        assert_eq!(got, expected_graph_path(), "{name}:\n{stdout}");
        assert!(stdout.contains("outside cudaEventRecord start -> cudaSuccess"), "{stdout}");
        assert!(stdout.contains("outside cudaStreamQuery on the forked stream after the capture -> cudaSuccess"), "{stdout}");
        assert!(stdout.contains("captured work did not run: yes"), "{stdout}");
        assert!(stdout.contains("a later synchronization is clean: yes"), "{stdout}");
        let refused =
            |base: &str, per_thread_entry: bool| unsupported_line(&format!("{base}{}", if per_thread_entry { suffix } else { "" }));
        let mut lines = vec![
            refused("cudaStreamBeginCapture", true),
            refused("cudaStreamIsCapturing", true),
            refused("cudaStreamGetCaptureInfo", true),
            refused("cudaStreamEndCapture", true),
            refused("cudaGraphGetNodes", false),
            refused("cudaGraphInstantiate", false),
            refused("cudaGraphUpload", true),
            refused("cudaGraphLaunch", true),
            refused("cudaGraphExecDestroy", false),
            refused("cudaGraphDestroy", false),
        ];
        lines.push(
            "flyt: work on a stream whose cudaStreamBeginCapture was refused fails with \
             cudaErrorStreamCaptureInvalidated until cudaStreamEndCapture (stream capture is not supported)"
                .to_string(),
        );
        assert_stderr_lines(&stderr, &lines);
    }
}
