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

use std::collections::BTreeSet;
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
        // Each refusal said so, once, and nothing else was printed. Without the channel mapped
        // and managed memory are mirrored (and say so).
        // Memory the app allocated itself, registered mapped: served with the channel, refused
        // with the reason without it.
        let mapped_refusal = (shm == "off").then(|| {
            "flyt: cuMemHostRegister with CU_MEMHOSTREGISTER_DEVICEMAP is not supported through Flyt: the server's GPU reaches the app's own memory only over the shared-memory channel (FLYT_SHM, same host) (returning CUDA_ERROR_NOT_SUPPORTED)".to_string()
        });
        let channel_refusals = (shm == "off").then(|| {
            [
                "flyt: mapped host memory without the shared-memory channel: kernels and the host see each other's writes at launches and synchronizations only".to_string(),
                "flyt: managed memory without the shared-memory channel: kernels and the host see each other's writes at launches, copies and synchronizations only (concurrentManagedAccess reads 0)".to_string(),
            ]
        });
        assert_stderr_lines(
            &stderr,
            &[
                "flyt: cudaHostRegister with cudaHostRegisterIoMemory is not supported through Flyt (returning cudaErrorNotSupported)"
                    .to_string(),
                "flyt: CUDA IPC on a GPU server without a GPU or one that maps the memory itself (it pages sessions: --oversubscribe; its log says which) is not supported through Flyt (returning CUDA_ERROR_NOT_SUPPORTED)"
                    .to_string(),
                "flyt: ignoring a fatbinary in a format this runtime does not know".to_string(),
                "flyt: the GPU server's emulated device has no kernel nodes, so no graph edge with a port or a type (returning CUDA_ERROR_NOT_SUPPORTED)".to_string(),
                "flyt: kernel node attributes that carry events are not supported".to_string(),
                "flyt: the kernel fake_kernel did not run: the Flyt server's GPU is emulated (no GPU there: memory and copies work, kernels do not) (cudaErrorNotSupported(801))".to_string(),
                "flyt: cuMemGetDefaultMemPool: host memory pools are not supported through Flyt (returning CUDA_ERROR_NOT_SUPPORTED)"
                    .to_string(),
                "flyt: memory pools with shareable handles other than a POSIX file descriptor are not supported (returning CUDA_ERROR_NOT_SUPPORTED)"
                    .to_string(),
                "flyt: cuMemPoolExportToShareableHandle: the pool was not made with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (returning CUDA_ERROR_INVALID_VALUE)"
                    .to_string(),
                "flyt: cuMemPoolImportFromShareableHandle: the descriptor is not a shareable handle a memory pool was exported as through Flyt (returning CUDA_ERROR_INVALID_VALUE)"
                    .to_string(),
                "flyt: cuMemAllocFromPoolAsync: an imported pool makes no allocations (returning CUDA_ERROR_INVALID_VALUE)".to_string(),
                "flyt: cuMemPoolExportPointer: the pointer is not the start of a live allocation of a pool made with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (returning CUDA_ERROR_INVALID_VALUE)"
                    .to_string(),
                "flyt: cuMemPoolImportPointer: the export data names no live allocation of the pool it was imported from (returning CUDA_ERROR_INVALID_VALUE)"
                    .to_string(),
            ]
            .into_iter()
            .chain(channel_refusals.into_iter().flatten())
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
    assert!(names.len() > 50, "the table lists {} unsupported exports", names.len());
    let list = scratch.join("unsupported.txt");
    std::fs::write(&list, names.iter().map(|name| format!("{name}\n")).collect::<String>()).unwrap();
    let (code, stdout, stderr) = run(&program, &[], &server.addresses[1], "auto", Some(&list));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(!stdout.contains("FAILED"), "{stdout}");
    assert_eq!(audited(&stdout), names);
    let lines: Vec<String> = names.iter().map(|name| unsupported_line(name)).collect();
    assert_stderr_lines(&stderr, &lines);
}

/// A graph program without kernels runs through the runtime front on the emulated device: a
/// capture forked onto a second stream and joined, launched 100 times; a capture with a copy to
/// host memory records it, and its launch writes that memory; host functions run in stream order.
#[test]
fn a_graph_program_runs_through_the_runtime() {
    let scratch = scratch_dir("graph-path");
    let server = emulated_server(&scratch);
    for per_thread in [false, true] {
        let (name, extra) =
            if per_thread { ("graph_path-ptsz", &["-DCUDA_API_PER_THREAD_DEFAULT_STREAM"][..]) } else { ("graph_path", &[][..]) };
        let program = build(&scratch, "graph_path", name, extra);
        for (address, shm) in [(&server.addresses[0], "off"), (&server.addresses[1], "on")] {
            let (code, stdout, stderr) = run(&program, &[], address, shm, None);
            assert_eq!(code, 0, "{name} over {address} with FLYT_SHM={shm}:\n{stdout}\n{stderr}");
            for line in [
                "capture seen: yes, forked stream joined: yes, capture id set: yes",
                "forked stream left the capture: yes",
                "graph nodes: 2",
                "captured work waited for the launch: yes",
                "graph ran: yes",
                "host functions ran: 2",
            ] {
                assert!(stdout.contains(line), "{name} over {address}: missing '{line}' in:\n{stdout}\n{stderr}");
            }
            // The copy to host memory is recorded: the capture leaves the memory alone and
            // each launch writes it.
            for line in [
                "capture with a copy to host memory: copy cudaSuccess, end cudaSuccess, graph SET, host memory untouched: yes",
                "the launch wrote the host memory: yes",
            ] {
                assert!(stdout.contains(line), "{name} over {address}: missing '{line}' in:\n{stdout}\n{stderr}");
            }
            assert!(stderr.is_empty(), "{name}: {stderr}");
        }
    }
}
