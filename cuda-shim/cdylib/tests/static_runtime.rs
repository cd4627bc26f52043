//! NVIDIA's own CUDA runtime, linked statically into a program by nvcc's default, runs over Flyt's
//! `libcuda.so.1` against a real `flyt-rpc-server` on the emulated device: `cuGetProcAddress`, the
//! export tables and the integrity check are exercised by the real runtime, and memory, copies,
//! memsets, streams and events go through the client core.
//!
//! Skipped (with a line saying so) when `FLYT_CUDA_HOME` is not set; `tools/test` sets it.

#![allow(clippy::tests_outside_test_module, reason = "an integration test file is its own test crate")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use flyt_test_support::{Interactive, Server, driver_lib, driver_program, run_with_timeout, scratch_dir, toolkit_from, wait_until};

/// A run of a test program: its exit code, stdout and stderr.
type Run = (i32, String, String);

/// A driver-API test program, `tests/c/NAME.c`, compiled against CUDA 13's cuda.h and linked with
/// Flyt's libcuda.so.1, in a scratch folder of its own (NAME with dashes).
struct DriverProgram {
    scratch: PathBuf,
    program: PathBuf,
    lib: PathBuf,
}

impl DriverProgram {
    /// `None` (the test skipped, with a line saying so) when `FLYT_CUDA_HOME` is not set.
    fn compile(name: &str) -> Option<Self> {
        Self::compile_in(name, name)
    }

    /// As `compile`, in the scratch folder `folder` (a second test of the same program runs
    /// beside the first, in a folder of its own).
    fn compile_in(name: &str, folder: &str) -> Option<Self> {
        let cuda = toolkit_from("FLYT_CUDA_HOME")?;
        let scratch = scratch_dir(&folder.replace('_', "-"));
        let source = format!("{}/tests/c/{name}.c", env!("CARGO_MANIFEST_DIR"));
        let (program, lib) = driver_program(Path::new(&source), &cuda, &scratch);
        Some(Self { scratch, program, lib })
    }

    /// As `compile`, with an emulated-device server started for it: `args` and a Unix socket,
    /// `socket("flyt.sock")`, listened on after them.
    fn serving(name: &str, args: &[&str]) -> Option<(Self, Server)> {
        let driver = Self::compile(name)?;
        let server = driver.server(&[args, &["--listen", &driver.socket("flyt.sock")]].concat());
        Some((driver, server))
    }

    /// The address of the Unix socket `file` in the scratch folder.
    fn socket(&self, file: &str) -> String {
        format!("unix:{}", self.scratch.join(file).display())
    }

    /// An emulated-device server: `--device emulated` and `args`, its log in the scratch folder.
    fn server(&self, args: &[&str]) -> Server {
        emulated_server(&self.scratch, args)
    }

    /// As `server`, its log in the scratch folder's own folder `dir` (for a second server).
    fn server_in(&self, dir: &str, args: &[&str]) -> Server {
        let dir = self.scratch.join(dir);
        std::fs::create_dir_all(&dir).expect("a server's folder");
        emulated_server(&dir, args)
    }

    /// The program as an app of `servers` (`FLYT_SERVER`), with the shared-memory channel `shm`
    /// ("on" or "off") where one is given.
    fn app(&self, servers: &str, shm: Option<&str>) -> Command {
        app_command(&self.program, &self.lib, servers, shm)
    }
}

fn emulated_server(scratch: &Path, args: &[&str]) -> Server {
    Server::start(&[&["--device", "emulated"], args].concat(), scratch)
}

/// `program` as an app of Flyt's: its libcuda.so.1 from `lib`, its servers `servers`, the
/// shared-memory channel `shm` where one is given.
fn app_command(program: &Path, lib: &Path, servers: &str, shm: Option<&str>) -> Command {
    let mut command = Command::new(program);
    command.env("LD_LIBRARY_PATH", lib).env("FLYT_SERVER", servers);
    if let Some(shm) = shm {
        command.env("FLYT_SHM", shm);
    }
    command
}

/// `command` with `CUDA_VISIBLE_DEVICES` set to `visible`, or unset (every device seen).
fn seeing(mut command: Command, visible: Option<&str>) -> Command {
    match visible {
        Some(visible) => command.env("CUDA_VISIBLE_DEVICES", visible),
        None => command.env_remove("CUDA_VISIBLE_DEVICES"),
    };
    command
}

/// Runs `command` for `seconds` at most.
fn run(mut command: Command, seconds: u64) -> Run {
    run_with_timeout(&mut command, Duration::from_secs(seconds))
}

/// Asserts that every line of `lines` is in `stdout`; `what` names the run in the messages.
fn assert_lines(what: &str, stdout: &str, stderr: &str, lines: &[&str]) {
    for line in lines {
        assert!(stdout.contains(line), "{what}: missing '{line}':\n{stdout}\n{stderr}");
    }
}

/// Asserts that `run` exited 0 with every line of `lines` in its stdout.
fn assert_passed(what: &str, (code, stdout, stderr): &Run, lines: &[&str]) {
    assert_eq!(*code, 0, "{what}\n{stdout}\n{stderr}");
    assert_lines(what, stdout, stderr, lines);
}

/// A check of each run's stderr (for `check_with_and_without_channel`): every line of `lines` is
/// in it.
fn stderr_has(lines: &'static [&'static str]) -> impl Fn(&str, &str, &str) {
    move |shm, _, stderr| {
        for line in lines {
            assert!(stderr.contains(line), "FLYT_SHM={shm}: missing '{line}':\n{stderr}");
        }
    }
}

/// A check of each run's stderr: no line of `lines` is in it.
fn stderr_lacks(lines: &'static [&'static str]) -> impl Fn(&str, &str, &str) {
    move |shm, _, stderr| {
        for line in lines {
            assert!(!stderr.contains(line), "FLYT_SHM={shm}: '{line}':\n{stderr}");
        }
    }
}

/// `tests/c/static_runtime.cu` built into the scratch folder `name` with the toolkit the
/// environment `variable` names, by the command `build(toolkit, source, program)` (`what` names it
/// in the message if it fails): the scratch folder, the program and the lib folder with Flyt's
/// libcuda.so.1. `None`: skipped.
fn build_static_runtime(
    variable: &str,
    name: &str,
    what: &str,
    build: impl FnOnce(&Path, &str, &Path) -> Command,
) -> Option<(PathBuf, PathBuf, PathBuf)> {
    let toolkit = toolkit_from(variable)?;
    let scratch = scratch_dir(name);
    let program = scratch.join(name.replace('-', "_"));
    let source = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/static_runtime.cu");
    let status = build(&toolkit, source, &program).status().unwrap_or_else(|error| panic!("{what}: {error}"));
    assert!(status.success(), "{what} {source}");
    let lib = driver_lib(&scratch);
    Some((scratch, program, lib))
}

/// Runs the static-runtime program `program` over `address` with the channel `shm`: it passes with
/// every line of `lines`, and nothing NVIDIA's runtime called on its path was left unsupported or
/// unimplemented.
fn check_static_runtime(program: &Path, lib: &Path, address: &str, shm: &str, lines: &[&str]) {
    let run = run(app_command(program, lib, address, Some(shm)), 120);
    assert_passed(&format!("over {address}"), &run, lines);
    let stderr = &run.2;
    assert!(!stderr.contains("is not supported through Flyt"), "{stderr}");
    assert!(!stderr.contains("is not implemented"), "{stderr}");
}

#[test]
fn a_static_cudart_program_runs_over_flyt() {
    // nvcc's default runtime is the static one: no -cudart flag.
    let built = build_static_runtime("FLYT_CUDA_HOME", "static-runtime", "nvcc", |cuda, source, program| {
        let mut nvcc = Command::new(cuda.join("bin/nvcc"));
        nvcc.arg(format!("-L{}", cuda.join("lib").display())).arg("-o").arg(program).arg(source);
        nvcc
    });
    let Some((scratch, program, lib)) = built else { return };
    let linked = Command::new("readelf").arg("-d").arg(&program).output().expect("readelf");
    assert!(!String::from_utf8_lossy(&linked.stdout).contains("libcudart"), "the program must not link a shared runtime");

    let socket = format!("unix:{}", scratch.join("flyt.sock").display());
    let server = emulated_server(&scratch, &["--listen", "127.0.0.1:0", "--listen", &socket]);
    // Over TCP without the channel (as from another host), over the Unix socket with it.
    for address in &server.addresses {
        let shm = if address.starts_with("unix:") { "on" } else { "off" };
        check_static_runtime(
            &program,
            &lib,
            address,
            shm,
            &[
                "devices: 1",
                "device 0: Flyt Emulated Device",
                "driver 13000 runtime 13000",
                "round trip: equal",
                "memset: ok",
                "async copies: ok, elapsed time measured",
                "new thread: pointer attributes ok",
                "captured graph: capture seen, 2 nodes, replayed",
                "host functions: ran 5 of 5 times, memset node ran",
                "CUDA call in a host function: cudaErrorNotPermitted",
                "stream-ordered allocation: ok",
                "managed memory: ok",
                "kernel launch: refused",
                "PASSED: 0 failure(s)",
            ],
        );
        // The server was sent the program's real fat binary (sized from its header) and said why it
        // could not load it.
        assert!(server.wait_for_log("module not loaded", Duration::from_secs(5)), "{}", server.log_text());
    }
}

/// CUDA 12.9's static runtime (an older NVIDIA runtime, asking `cuGetProcAddress` for 12.x
/// versions and its own export tables) runs over Flyt's `libcuda.so.1` too. The runtime wheel has
/// no nvcc: the same program is compiled as plain C++, without its kernel, and linked with
/// `libcudart_static.a`. Skipped (with a line saying so) when `FLYT_CUDA12_HOME` is not set;
/// `tools/test` sets it.
#[test]
fn a_cuda12_static_runtime_program_runs_over_flyt() {
    let what = "c++ with CUDA 12.9's static runtime";
    let built = build_static_runtime("FLYT_CUDA12_HOME", "static-runtime-12", what, |cuda12, source, program| {
        let mut cxx = Command::new("c++");
        cxx.args(["-x", "c++", "-O1"])
            .arg(format!("-I{}", cuda12.join("include").display()))
            .arg(source)
            .args(["-x", "none"])
            .arg(cuda12.join("lib/libcudart_static.a"))
            .args(["-lpthread", "-ldl", "-lrt", "-o"])
            .arg(program);
        cxx
    });
    let Some((scratch, program, lib)) = built else { return };
    let socket = format!("unix:{}", scratch.join("flyt.sock").display());
    let server = emulated_server(&scratch, &["--listen", &socket]);
    // Without the channel: managed memory is mirrored device memory.
    check_static_runtime(
        &program,
        &lib,
        &server.addresses[0],
        "off",
        &[
            "devices: 1",
            "device 0: Flyt Emulated Device",
            "runtime 12090",
            "round trip: equal",
            "memset: ok",
            "async copies: ok, elapsed time measured",
            "managed memory: ok",
            "PASSED: 0 failure(s)",
        ],
    );
}

#[test]
fn driver_api_modules_and_launches_fail_loudly_without_gpu_code() {
    let Some(driver) = DriverProgram::compile("driver_modules") else { return };
    let server = driver.server(&["--listen", "127.0.0.1:0"]);
    let address = &server.addresses[0];
    let run_once = || {
        let mut app = driver.app(address, None);
        app.env("FLYT_STATS", "1");
        run(app, 60)
    };
    let first = run_once();
    assert_passed("first", &first, &["PASSED: 0 failure(s)", "loading mode: lazy"]);
    let stderr = &first.2;
    // The refused JIT option names itself once.
    assert!(stderr.contains("JIT option 0 is not supported through Flyt"), "{stderr}");
    assert!(stderr.contains("JIT option 17 is not supported through Flyt's linker"), "{stderr}");

    // The large image was sent once and filed by the server (Server::start gives each test its
    // own cache folder); a second process's session loads it from there, and answers the same.
    let cache = driver.scratch.join("images");
    let cached = || {
        std::fs::read_dir(&cache)
            .map(|entries| entries.filter_map(Result::ok).filter(|e| e.path().extension().is_some_and(|x| x == "image")).count())
            .unwrap_or(0)
    };
    wait_until(Duration::from_secs(10), || cached() > 0);
    assert_eq!(cached(), 1, "only the large image is cached, once");
    let hits = || server.log_text().matches("module image from the cache").count();
    let hits_before = hits();
    let second = run_once();
    assert_passed("second", &second, &["PASSED: 0 failure(s)"]);
    // Both loads of the large image in the second process came from the cache, and the app's
    // statistics say so.
    assert_eq!(hits(), hits_before + 2, "{}", server.log_text());
    let stderr = &second.2;
    assert!(stderr.contains("2 offered by digest, 2 of them found in the server's cache"), "{stderr}");
}

/// Runs the driver-API test program `name` (tests/c/NAME.c) against an emulated server, with the
/// shared-memory channel and over the socket alone (copies take different paths), as
/// `(FLYT_SHM, exit code, stdout, stderr)`; `None` when `FLYT_CUDA_HOME` is not set.
fn run_with_and_without_channel(name: &str) -> Option<Vec<(&'static str, i32, String, String)>> {
    let (driver, server) = DriverProgram::serving(name, &[])?;
    let runs = ["on", "off"]
        .into_iter()
        .map(|shm| {
            let (code, stdout, stderr) = run(driver.app(&server.addresses[0], Some(shm)), 60);
            (shm, code, stdout, stderr)
        })
        .collect();
    Some(runs)
}

/// Runs the driver-API test program `name` with the shared-memory channel and over the socket
/// alone (`run_with_and_without_channel`) and asserts that each run exits 0 with every line of
/// `lines` in its stdout; `more(FLYT_SHM, stdout, stderr)` then makes the test's own checks of
/// each run. Nothing runs when `FLYT_CUDA_HOME` is not set.
fn check_with_and_without_channel(name: &str, lines: &[&str], more: impl Fn(&str, &str, &str)) {
    let Some(runs) = run_with_and_without_channel(name) else {
        return;
    };
    for (shm, code, stdout, stderr) in runs {
        let what = format!("FLYT_SHM={shm}");
        let run = (code, stdout, stderr);
        assert_passed(&what, &run, lines);
        more(shm, &run.1, &run.2);
    }
}

/// Driver-API test programs run with the shared-memory channel and without, a test each
/// (`check_with_and_without_channel`): after its doc, `test_name: "program", [the lines each run
/// prints], more checks of each run (|FLYT_SHM, stdout, stderr|);`.
macro_rules! channel_tests {
    ($($(#[$doc:meta])* $test:ident: $program:literal, [$($line:literal),* $(,)?], $more:expr;)*) => {
        $(
            $(#[$doc])*
            #[test]
            fn $test() {
                check_with_and_without_channel($program, &[$($line),*], $more);
            }
        )*
    };
}

channel_tests! {
    library_needs_pitched_copies_stream_ids_and_tool_entries: "driver_libraries",
        ["PASSED: 0 failure(s)"],
        |shm, _, stderr| {
            assert_eq!(stderr.contains("mapped host memory without the shared-memory channel"), shm == "off", "{stderr}");
            assert!(!stderr.contains("is not implemented"), "{stderr}");
        };

    /// Graphs that copy with the app's pageable host memory, over the socket and the shared-memory
    /// channel, on the emulated device: captured host-to-device and device-to-host copies around
    /// device work copy the host memory of each launch's moment; explicit copy nodes (1D, pitched
    /// 2D) with host sides read back as given and take new buffers in an executable graph.
    graph_copies_with_host_memory_through_the_driver_api: "driver_graph_host_copies",
        [
            "the capture left the host destination alone: yes",
            "captured host copies read back with their host pointers: yes",
            "launch 0: first half 10, second half 119",
            "launch 1: first half 11, second half 119",
            "launch 2: first half 12, second half 119",
            "every launch copied the host source of that moment, and back: yes",
            "captured pitched copies with host boxes ran at each launch: yes",
            "a copy node with host memory is a copy node: yes",
            "GetParams returns the host pointer and pitch as given: yes",
            "explicit host copies ran in order at every launch, pitch kept, host node after them: yes",
            "ExecMemcpyNodeSetParams: the copy lands in the new buffer only: yes",
            "the graph's node still names its own buffer: yes",
            "MemcpyNodeSetParams: a new instantiation copies to the new buffer: yes",
            "a host copy larger than its device memory is refused: yes",
            "a clone copies with host memory too: yes",
            "a generic copy node from host memory ran: yes",
            "cuGraphExecUpdate: the copies name the new graph's host buffers: yes",
            "PASSED: 0 failure(s)",
        ],
        stderr_lacks(&["not supported"]);

    /// Virtual memory management through the driver API, over the socket and the shared-memory
    /// channel, on the emulated device.
    virtual_memory_management_through_the_driver_api: "driver_vmm",
        [
            "granularity a power of two: yes",
            "host granularity a power of two: yes",
            "access read back: read-write",
            "second allocation holds the copy: yes",
            "retained handle is the second allocation: yes",
            "properties: type 1, location 1/0, handle types 1",
            "kept across unmap and map: yes",
            "PASSED: 0 failure(s)",
        ],
        stderr_has(&[
            "virtual memory with a location other than the device is not supported",
            "virtual memory with shareable handles other than a POSIX file descriptor is not supported",
        ]);

    /// Batch copies and the small context calls through the driver API, over the socket and the
    /// shared-memory channel, on the emulated device.
    batch_copies_and_context_settings_through_the_driver_api: "driver_batch",
        [
            "batch round trip: equal",
            "failing copy: 2",
            "context flags read back: yes",
            "banks: four bytes",
            "PASSED: 0 failure(s)",
        ],
        |_, _, _| {};

    /// Pitched memory, 3D copies, 2D memsets, arrays and texture and surface objects through the
    /// driver API, over the socket and the shared-memory channel, on the emulated device.
    arrays_and_shaped_copies_through_the_driver_api: "driver_arrays",
        [
            "pitch for 100-byte rows: 512",
            "3D box through pitched memory, pinned host: yes",
            "level round trip: yes",
            "access policy window copied to another stream: yes",
            "PASSED: 0 failure(s)",
        ],
        stderr_has(&["a CUDA array of a block-compressed or packed format is not supported"]);

    /// NV12 arrays and their planes, sparse and deferred-mapping arrays (properties, memory
    /// requirements, tile pools and map entries) and batch decompression through the driver API,
    /// over the socket and the shared-memory channel, on the emulated device (which maps no memory
    /// into arrays and has no decompression engine: its refusals say so once).
    planar_and_sparse_arrays_through_the_driver_api: "driver_planar_sparse",
        [
            "NV12 descriptor read back: yes",
            "luma plane: 64 x 32, format 1, 1 channel(s)",
            "chroma plane: 32 x 16, format 1, 2 channel(s)",
            "luma plane round trip: yes",
            "chroma plane round trip, on a stream: yes",
            "chroma element 5 is its U, V pair: yes",
            "sparse tile: 128 x 128 x 1, mip tail 0 bytes",
            "mip tail from level 4, 65536 bytes",
            "memory requirements: 65536 bytes, aligned to 65536",
            "a tile pool's usage is not read back: yes",
            "tile map on this device: CUDA_ERROR_NOT_SUPPORTED",
            "deferred map on this device: CUDA_ERROR_NOT_SUPPORTED",
            "copy into a sparse array on this device: CUDA_ERROR_NOT_SUPPORTED",
            "no decompression engine: every batch refused unread, index untouched: yes",
            "decompression on this device: CUDA_ERROR_NOT_SUPPORTED, index untouched",
            "PASSED: 0 failure(s)",
        ],
        |shm, _, stderr| {
            for line in [
                "flyt: a mipmapped CUDA array of a planar (NV12) format is not supported through Flyt",
                "flyt: cuMemMapArrayAsync: the server's emulated device maps no memory into sparse or deferred-mapping arrays",
                "flyt: cuMemBatchDecompressAsync: the server's emulated device has no decompression engine",
                "flyt: a copy to or from a sparse or deferred-mapping array: the server's emulated device maps no memory into one",
            ] {
                assert_eq!(stderr.matches(line).count(), 1, "FLYT_SHM={shm}: '{line}' once:\n{stderr}");
            }
        };

    /// Graph memory nodes, conditional nodes, generic node parameters and graph queries, on every
    /// transport (the emulated device runs the memsets and copies).
    graph_memory_and_conditional_nodes_through_the_driver_api: "driver_graph_nodes",
        [
            "graph memory filled and copied out: yes",
            "graph memory freed with cuMemFree after each launch: yes",
            "graph memory freed with cuMemFreeAsync after each launch: yes",
            "IF with value 1: body ran",
            "IF with value 0: body skipped",
            "a disabled memset does not run: yes",
            "copy node reads back as given: yes",
            "captured memset, copy and host nodes read back: yes",
            "legacy instantiate: empty log, no error node: yes",
            "user object destroyed once, after its graph, executable graph and launch: yes",
            "batch node reads back as given: yes",
            "batch node wrote both words: yes",
            "executable graph's batch node changed, graph's kept: yes",
            "graph's batch node changed: yes",
            "generic batch node reads back: yes",
            "both batch nodes ran: yes",
            "captured batch node reads back and runs at launch only: yes",
            "edge data reaches the device: programmatic refused, plain made, no node left behind: yes",
            "capture edge data: default data is none, programmatic refused by the device: yes",
            "a capture ended with a NULL graph pointer ends, its node recorded: yes",
            "PASSED: 0 failure(s)",
        ],
        |_, _, _| {};

    /// The app's own shared file mapping registered mapped (tests/c/driver_host_files.c), as NCCL's
    /// ranks register their /dev/shm segment: with the channel the server maps the same file at the
    /// same address (a device memset lands in the file); without it, and for private memory, a clear
    /// refusal.
    shared_file_mappings_registered_for_the_device: "driver_host_files",
        ["PASSED: 0 failure(s)"],
        |shm, stdout, stderr| {
            if shm == "on" {
                for line in [
                    "channel: yes",
                    "malloc'd memory registered mapped keeps its bytes: yes",
                    "malloc'd memory's device pointer is its host pointer: yes",
                    "a memset through its device pointer is seen by the host: yes",
                    "and the host's writes by the device: yes",
                    "still the app's memory after unregistering: yes",
                    "device pointer is the host pointer: yes",
                    "a memset through the device pointer is in the file (another mapping): yes",
                    "registered again and set again: yes",
                    "a removed file registered through its descriptor, its last bytes set: yes",
                ] {
                    assert!(stdout.contains(line), "missing '{line}':\n{stdout}\n{stderr}");
                }
                assert!(stderr.contains("the mapped file was removed"), "{stderr}");
            } else {
                assert!(stdout.contains("channel: no (CUDA_ERROR_NOT_SUPPORTED)"), "{stdout}\n{stderr}");
                assert!(stderr.contains("only over the shared-memory channel"), "{stderr}");
            }
        };

    /// Green contexts on the emulated device (tests/c/driver_green.c): the device's SMs split into
    /// groups, a green context of one, streams in it (its context current: the NULL stream too) that
    /// copy and memset, events through it, and its destruction taking its context and streams along.
    green_contexts_through_the_driver_api: "driver_green",
        [
            "device SMs: 132 (attribute 132), min partition 8, alignment 2",
            "groups of 16 SMs that fit: 8",
            "NULL-stream work in the green context: yes",
            "PASSED: 0 failure(s)",
        ],
        stderr_lacks(&["is not supported through Flyt"]);

    /// Stream memory operations, tensor maps, stream and peer queries, peer copies, pool access and
    /// context events on the emulated device (tests/c/driver_memops.c): writes read back, waits pass
    /// when satisfied and fail at the call otherwise, refusals are clear.
    stream_memory_operations_and_one_device_queries: "driver_memops",
        [
            "PASSED: 0 failure(s)",
            "an unsatisfiable wait fails at the call: yes",
            // Shared pages with the channel, mirrored device memory without it.
            "a write to mapped pinned memory seen by the host: yes",
        ],
        stderr_has(&[
            "cuStreamWaitValue32_v2: flushing remote writes is not supported through Flyt",
            "the server's device encodes no tensor maps",
            "host memory pools are not supported through Flyt",
            "managed memory pools are not supported through Flyt",
            "cuStreamBatchMemOp_v2: the server's emulated device runs work at submission, so a wait that no earlier work satisfied would never end",
        ]);

    /// Stream callbacks from several threads, each starting a thread that frees its memory and
    /// stream while other callbacks still hold their streams (NVIDIA's simpleCallback): the free
    /// waits for the device, the device for the callbacks, and the callbacks' answers must still
    /// reach the server. Hung before the server read ahead for them.
    callbacks_whose_threads_free_memory_do_not_hang: "driver_host_callbacks",
        [
            "workloads finished: 8 of 8, results right: 8",
            "module load behind a running host function returned; the function had run: yes",
            "PASSED: 0 failure(s)",
        ],
        |_, _, _| {};

    /// Capture interaction modes per app thread (`c/driver_capture_threads.c`): the server's session
    /// thread holds every capture, but each request runs under the rule the driver applies to its
    /// app thread (another thread's thread-local capture prohibits nothing; a global one prohibits
    /// what a thread not relaxed does).
    capture_modes_apply_per_app_thread: "driver_capture_threads",
        [
            "another thread's allocation during a thread-local capture: CUDA_SUCCESS",
            "the capturing thread's allocation, relaxed: CUDA_SUCCESS",
            "another thread's allocation during a global capture: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
            "a relaxed thread's allocation during a global capture: CUDA_SUCCESS",
            "another thread's allocation after the captures: CUDA_SUCCESS",
            "PASSED: 0 failure(s)",
        ],
        |_, _, _| {};
}

/// Batch decompression's arguments are checked as on a GPU that has the engine when the device
/// reports one (the emulated device claims it: `FLYT_EMULATED_CLAIMS_DECOMPRESSION`), then the
/// device refuses the batch it cannot run; without an engine every batch is refused unread
/// (`planar_and_sparse_arrays_through_the_driver_api`), as the driver does on an H200.
#[test]
fn decompression_arguments_are_checked_where_the_device_has_the_engine() {
    let Some(driver) = DriverProgram::compile_in("driver_planar_sparse", "decompression_engine") else { return };
    let socket = driver.socket("flyt.sock");
    let _server = Server::start_with_env(
        &["--device", "emulated", "--listen", &socket],
        &driver.scratch,
        &[("FLYT_EMULATED_CLAIMS_DECOMPRESSION", "1")],
    );
    let run = run(driver.app(&socket, Some("off")), 60);
    assert_passed(
        "an engine claimed",
        &run,
        &[
            "host memory to decompress: refused, index 1: yes",
            "padding not zeroed: refused, index 0: yes",
            "flags: refused, the batch as a whole: yes",
            "decompression on this device: CUDA_ERROR_NOT_SUPPORTED, index untouched",
            "PASSED: 0 failure(s)",
        ],
    );
}

/// Runs the two-process program `tests/c/NAME.c` (an exporter and the importer it forks) on the
/// emulated device: on one server with the shared-memory channel and without, and with the
/// importer on a second server over TCP (another tenant of the device). Each run must exit 0
/// with every line of `lines` in its stdout; `more(what the run was, its stderr)` then makes the
/// test's own checks. Nothing runs when `FLYT_CUDA_HOME` is not set.
fn check_exporter_and_importer(name: &str, lines: &[&str], more: impl Fn(&str, &str)) {
    let Some((driver, server)) = DriverProgram::serving(name, &[]) else { return };
    let other = driver.server_in("other", &["--listen", "127.0.0.1:0"]);
    for (shm, importer) in [("on", None), ("off", None), ("on", Some(&other.addresses[0]))] {
        let mut command = driver.app(&server.addresses[0], Some(shm));
        if let Some(address) = importer {
            command.env("IMPORTER_FLYT_SERVER", address);
        }
        let what = format!("FLYT_SHM={shm}, importer on {importer:?}");
        let outcome = run(command, 60);
        assert_passed(&what, &outcome, lines);
        more(&what, &outcome.2);
    }
}

/// A physical allocation shared between two processes through a POSIX descriptor: on one
/// server with and without the shared-memory channel, and between two servers (two tenants of
/// one device; the importer over TCP), on the emulated device, whose shareable allocations are
/// memory files both workers map.
#[test]
fn physical_allocations_shared_between_processes() {
    check_exporter_and_importer(
        "driver_vmm_share",
        &[
            "exported as a descriptor: yes",
            "imported handle types: 0",
            "importer reads the exporter's bytes: yes",
            "exporter sees the importer's writes: yes",
            "imported mapping outlives the export: yes",
            "importer PASSED: 0 failure(s)",
            "exporter PASSED: 0 failure(s)",
            "PASSED: both processes",
        ],
        |_, stderr| {
            assert!(
                stderr.contains("virtual memory with shareable handles other than a POSIX file descriptor is not supported"),
                "{stderr}"
            );
        },
    );
}

/// A memory pool and an allocation of it shared between two processes: the pool's POSIX
/// descriptor and the allocation's export data sent over a Unix socket; on one server with and
/// without the shared-memory channel, and between two servers (two tenants of one device; the
/// importer over TCP), on the emulated device, whose shareable pools are memory files. Each
/// refusal says why, once.
#[test]
fn memory_pools_shared_between_processes() {
    check_exporter_and_importer(
        "driver_pool_share",
        &[
            "pool handle types: 1",
            "exported the pool as a descriptor: yes",
            "one allocation, one export data: yes",
            "allocation's pool and handle types: its pool, 1 (a plain pool's: its pool, 0)",
            "imported allocation's pool and handle types: the imported pool, 1",
            "imported pool read-write on its device: yes",
            "importer reads the exporter's bytes: yes",
            "exporter sees the importer's writes: yes",
            "imported again at the same address: yes",
            "freed twice, once per import: yes",
            "importer PASSED: 0 failure(s)",
            "exporter PASSED: 0 failure(s)",
            "PASSED: both processes",
        ],
        |run, stderr| {
            let refused = |what: &str| format!("{what} (returning CUDA_ERROR_INVALID_VALUE)");
            for line in [
                "flyt: memory pools with shareable handles other than a POSIX file descriptor, or a size limit, are not supported (returning CUDA_ERROR_NOT_SUPPORTED)".to_string(),
                "flyt: memory pools with shareable handles other than a POSIX file descriptor are not supported (returning CUDA_ERROR_NOT_SUPPORTED)".to_string(),
                refused("flyt: cuMemPoolExportToShareableHandle: the pool was not made with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR"),
                refused("flyt: cuMemPoolExportPointer: the pointer is not the start of a live allocation of a pool made with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR"),
                refused("flyt: cuMemPoolImportFromShareableHandle: the descriptor is not a shareable handle a memory pool was exported as through Flyt"),
                refused("flyt: cuMemPoolImportFromShareableHandle: the descriptor names no memory pool its exporter still shares"),
                refused("flyt: cuMemAllocFromPoolAsync: an imported pool makes no allocations"),
                refused("flyt: cuMemPoolImportPointer: the pool was not imported with cuMemPoolImportFromShareableHandle"),
                refused("flyt: cuMemPoolImportPointer: the export data names no live allocation of the pool it was imported from"),
            ] {
                assert_eq!(stderr.matches(line.as_str()).count(), 1, "{run}: '{line}' once:\n{stderr}");
            }
        },
    );
}

/// Managed memory through the driver API on the emulated device: shared pages with the channel,
/// mirrored device memory over a socket alone and over TCP (without the channel, as from another
/// host), coherent at synchronizations (the
/// device reports no concurrent managed access there).
#[test]
fn managed_memory_through_the_driver_api() {
    let Some((driver, server)) = DriverProgram::serving("driver_managed", &["--listen", "127.0.0.1:0"]) else { return };
    let socket = driver.socket("flyt.sock");
    let tcp = server.addresses.iter().find(|address| !address.starts_with("unix:")).expect("a TCP address");
    for (transport, address, shm) in [("channel", &socket, "on"), ("socket", &socket, "off"), ("tcp", tcp, "off")] {
        let outcome = run(driver.app(address, Some(shm)), 120);
        assert_passed(
            transport,
            &outcome,
            &[
                "PASSED: 0 failure(s)",
                "memset seen by the host: yes",
                "device-to-device copy into managed memory: yes",
                "unified copy from managed memory: yes",
                "pointer is managed, device memory type, same device pointer: yes",
                "managed memory's device ordinal is 0: yes",
                "pointer attributes in a batch: managed, device type: yes",
                "prefetch to the CPU: device writes seen after the stream synchronized: yes",
                "stream memory operation on managed memory seen by the host: yes",
                "a copy out of managed memory reads the host's last write: yes",
                "accessed by device 0 and the host: yes",
                "batch prefetch: second half to device 0: yes",
                "odd-sized allocation: host bytes kept, memset to its end seen: yes",
                "copies into and out of an odd-sized allocation: yes",
                "2D copies into and out of managed memory: yes",
                "48 allocations filled, read through the device and freed: yes",
                "bad frees refused, the memory beside them kept: yes",
                "64 MiB allocation: host fill, memset and copy out agree: yes",
            ],
        );
        let (_, stdout, stderr) = &outcome;
        let channel = transport == "channel";
        let concurrent = if channel { "concurrent managed access: 1" } else { "concurrent managed access: 0" };
        assert!(stdout.contains(concurrent), "{transport}: '{concurrent}':\n{stdout}\n{stderr}");
        assert_eq!(stderr.contains("managed memory without the shared-memory channel"), !channel, "{transport}:\n{stderr}");
        assert!(!stderr.contains("cuMemAllocManaged"), "{transport}: no refusal:\n{stderr}");
    }
}

/// A client killed while its session's thread waits behind a host function that never returns
/// (a second thread's cuMemFree waits for the device): the server lets the held stream go, ends
/// the session and gives its memory back, rather than keeping a worker stuck for good.
#[test]
fn a_client_killed_while_its_session_waits_ends_the_session() {
    let Some((driver, server)) = DriverProgram::serving("driver_orphan", &[]) else { return };
    let ended = || server.log_text().matches("session ended by the client").count();
    for shm in ["off", "on"] {
        let mut app = Interactive::spawn(&mut driver.app(&server.addresses[0], Some(shm)));
        let line = app.read_line();
        let ended_before = ended();
        app.kill();
        assert!(line.trim() == "held", "FLYT_SHM={shm}: the program printed {line:?}\n{}", server.log_text());
        wait_until(Duration::from_secs(15), || ended() > ended_before);
        assert!(ended() > ended_before, "FLYT_SHM={shm}: the session did not end after its client was killed:\n{}", server.log_text());
    }
}

/// No call waits for ever for a server that stopped: with `FLYT_REPLY_TIMEOUT=3`, a call to a
/// server whose worker is stopped (SIGSTOP) fails with `CUDA_ERROR_DEVICE_UNAVAILABLE` and the
/// reason, while a 4 s wait on a live server succeeds (it says it is alive while the work lasts).
#[test]
fn a_stopped_server_is_an_error_within_the_reply_timeout() {
    let Some((driver, server)) = DriverProgram::serving("driver_reply_timeout", &[]) else { return };
    for shm in ["off", "on"] {
        let what = format!("FLYT_SHM={shm}");
        let mut long = driver.app(&server.addresses[0], Some(shm));
        long.arg("long").env("FLYT_REPLY_TIMEOUT", "2");
        assert_passed(&what, &run(long, 30), &["a 4 s wait: CUDA_SUCCESS after 4 s"]);

        let opened = server.log_text().matches("opened:").count();
        let mut app = driver.app(&server.addresses[0], Some(shm));
        app.env("FLYT_REPLY_TIMEOUT", "3");
        let mut app = Interactive::spawn(&mut app);
        assert_eq!(app.read_line().trim(), "ready", "{what}: {}", server.log_text());
        // The session's worker: the pid the listener logged for the session that just opened.
        let worker = server.session_worker(opened);
        // SAFETY: signals a process this test's server started.
        unsafe { libc::kill(worker, libc::SIGSTOP) };
        app.send("go");
        let started = std::time::Instant::now();
        let (_, rest, stderr) = app.finish();
        // SAFETY: as above; the worker then sees its client gone and ends.
        unsafe { libc::kill(worker, libc::SIGCONT) };
        assert!(started.elapsed() < Duration::from_secs(10), "{what}: took {:?}", started.elapsed());
        assert!(rest.contains("a call to a stopped server: CUDA_ERROR_DEVICE_UNAVAILABLE within"), "{what}\n{rest}\n{stderr}");
        assert!(stderr.contains("sent nothing for 3 s"), "{what}\n{stderr}");
    }
}

/// A session spread over two servers (GPUs on two nodes, issue 45): two emulated servers of one
/// GPU each, the second in address window 1, both named by `FLYT_SERVER`. The devices are
/// numbered server by server with each server's identity, `CUDA_VISIBLE_DEVICES` selects among
/// them, their addresses are disjoint, peer copies of a few MiB go from device 0 to device 1 and
/// back staged through the app (every byte checked), no peer path is reported and peer access is
/// refused; with and without the shared-memory channel (the first server's).
#[test]
fn two_servers_in_one_session_through_the_driver_api() {
    let Some(driver) = DriverProgram::compile("driver_two_nodes") else { return };
    let first = driver.server_in("first", &["--gpu", "0", "--listen", &driver.socket("first.sock")]);
    let second = driver.server_in("second", &["--gpu", "0", "--address-window", "1", "--listen", &driver.socket("second.sock")]);
    let servers = format!("{},{}", first.addresses[0], second.addresses[0]);
    let run_seeing = |shm: &str, visible: Option<&str>| run(seeing(driver.app(&servers, Some(shm)), visible), 60);
    let mut uuids = Vec::new();
    for shm in ["on", "off"] {
        let outcome = run_seeing(shm, None);
        assert_passed(
            &format!("FLYT_SHM={shm}"),
            &outcome,
            &[
                "devices: 2",
                "two identities: yes",
                "no peer path between the servers' GPUs: yes",
                "peer access refused: yes",
                "allocations named by their devices: yes",
                "disjoint addresses: yes",
                "each server's addresses in its window: yes",
                "peer copy from device 0 to device 1: yes",
                "copy back from device 1 to device 0: yes",
                "a part at offsets: yes",
                "a pitched box between the devices: yes",
                "a 2D memset of the other server's memory: yes",
                "streams and events find their servers: yes",
                "host functions on both servers' streams: yes",
                "PASSED: 0 failure(s)",
            ],
        );
        let uuid_of = |device: &str| {
            outcome.1.lines().find_map(|line| line.strip_prefix(device)?.split(" uuid ").nth(1).map(String::from)).expect("a uuid line")
        };
        uuids = vec![uuid_of("device 0: "), uuid_of("device 1: ")];
    }
    let device_0_is = |stdout: &str, uuid: &str| stdout.lines().any(|line| line.starts_with("device 0: ") && line.ends_with(uuid));
    // Only the second server's GPU: it is the app's device 0, with its identity.
    let alone = run_seeing("on", Some("1"));
    assert_passed("the second alone", &alone, &["devices: 1\n", "one device alone copies: yes", "PASSED: 0 failure(s)"]);
    assert!(device_0_is(&alone.1, &uuids[1]), "{}\n{}", alone.1, alone.2);
    // By UUID, in the other order: the second server's GPU first, and everything holds.
    let hex = &uuids[1];
    let uuid_text = format!("GPU-{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32]);
    let reordered = run_seeing("off", Some(&format!("{uuid_text},0")));
    assert_passed(&uuid_text, &reordered, &["devices: 2\n", "PASSED: 0 failure(s)"]);
    assert!(device_0_is(&reordered.1, &uuids[1]), "{uuid_text}:\n{}\n{}", reordered.1, reordered.2);
}

/// Two servers whose device addresses coincide (emulated devices with one fixed first address):
/// in one address window, device 1's first allocation lands on device 0's and is refused with a
/// line naming both servers; with `--address-window 1` on the second it is made, elsewhere.
#[test]
fn servers_in_one_address_window_are_refused_overlapping_memory() {
    let Some(driver) = DriverProgram::compile("driver_overlapping_nodes") else { return };
    let start = |name: &str, window: &str| {
        let socket = format!("unix:{}", driver.scratch.join(name).join("flyt.sock").display());
        driver.server_in(name, &["--gpu", "0", "--emulated-fixed-base", "--address-window", window, "--listen", &socket])
    };
    let (first, same_window, next_window) = (start("first", "0"), start("same", "0"), start("next", "1"));
    let run_with = |second: &Server, shm: &str| run(driver.app(&format!("{},{}", first.addresses[0], second.addresses[0]), Some(shm)), 60);
    for shm in ["on", "off"] {
        let what = format!("FLYT_SHM={shm}");
        let refused = run_with(&same_window, shm);
        assert_passed(&what, &refused, &["allocation on device 1: CUDA_ERROR_OUT_OF_MEMORY"]);
        let stderr = &refused.2;
        let line = stderr.lines().find(|line| line.contains("overlaps device memory of")).unwrap_or_else(|| panic!("no line:\n{stderr}"));
        assert!(
            line.contains(&same_window.addresses[0]) && line.contains(&first.addresses[0]) && line.contains("--address-window"),
            "the line names both servers and the cure: {line}"
        );
        let elsewhere = run_with(&next_window, shm);
        assert_passed(&what, &elsewhere, &["allocation on device 1: CUDA_SUCCESS\ndisjoint: yes"]);
        assert!(!elsewhere.2.contains("overlaps"), "{}", elsewhere.2);
    }
}

/// Two GPUs in one session (an emulated server with `--gpu 0,1`), over the socket and the
/// channel: both devices, their peer answers, allocations per device named by their attributes,
/// copies between them, peer access and two threads on two devices at once; under
/// `CUDA_VISIBLE_DEVICES=1` the app sees the second device alone, as its device 0.
#[test]
fn two_devices_in_one_session_through_the_driver_api() {
    let Some((driver, server)) = DriverProgram::serving("driver_two_devices", &["--gpu", "0,1"]) else { return };
    let run_seeing = |shm: &str, visible: Option<&str>| run(seeing(driver.app(&server.addresses[0], Some(shm)), visible), 60);
    for shm in ["on", "off"] {
        assert_passed(
            &format!("FLYT_SHM={shm}"),
            &run_seeing(shm, None),
            &[
                "devices: 2",
                "device 1: Flyt Emulated Device 1",
                "two identities: yes",
                "peer answers: 0 and 1 are peers, a device is not its own: yes",
                "allocations on the current device, named by their attributes: yes",
                "disjoint addresses: yes",
                "copies between the devices: yes",
                "two threads on two devices at once: yes",
                "physical memory of device 1 mapped for both: yes",
                "a memset across devices needs peer access: yes",
                "mapped host memory on each device, zeroed: yes",
                "PASSED: 0 failure(s)",
            ],
        );
    }
    // The second device alone, as device 0.
    assert_passed("CUDA_VISIBLE_DEVICES=1", &run_seeing("off", Some("1")), &["devices: 1\ndevice 0: Flyt Emulated Device 1"]);
    // Reordered, everything holds.
    assert_passed(
        "CUDA_VISIBLE_DEVICES=1,0",
        &run_seeing("off", Some("1,0")),
        &["device 0: Flyt Emulated Device 1", "device 1: Flyt Emulated Device 0", "PASSED: 0 failure(s)"],
    );
}

/// A tenant's app on a server of the emulated host's GPU 1 (`c/driver_foreign_gpu.c`): its one
/// device is that GPU, and ordinals past it, made-up contexts in peer access and peer copies are
/// refused with CUDA errors, its own device working on.
#[test]
fn an_app_cannot_name_another_tenants_gpu_through_the_driver_api() {
    let Some((driver, server)) = DriverProgram::serving("driver_foreign_gpu", &["--gpu", "1"]) else { return };
    assert_passed(
        "GPU 1's tenant",
        &run(seeing(driver.app(&server.addresses[0], None), None), 60),
        &[
            "devices: 1",
            "device 0 is the host's: flyt-emulated-01",
            "cuDeviceGet(1): CUDA_ERROR_INVALID_DEVICE",
            "cuDevicePrimaryCtxRetain(1): CUDA_ERROR_INVALID_DEVICE",
            "cuDeviceCanAccessPeer(0, 1): CUDA_ERROR_INVALID_DEVICE",
            "cuDeviceGetDefaultMemPool(1): CUDA_ERROR_INVALID_DEVICE",
            "cuCtxEnablePeerAccess(a made-up context): CUDA_ERROR_INVALID_CONTEXT",
            "cuMemcpyPeer from a made-up context: CUDA_ERROR_INVALID_CONTEXT",
            "cuMemcpyPeer to a made-up context: CUDA_ERROR_INVALID_CONTEXT",
            "its own memory still works: yes",
            "PASSED: 0 failure(s)",
        ],
    );
}

/// Each device's memory pools through the driver API (`c/driver_device_pools.c`), on an emulated
/// server with two GPUs: a default and a current pool per device, stream-ordered allocations from
/// the stream's device's pool, attributes and access per pool, a peer granted access.
#[test]
fn memory_pools_of_each_device_through_the_driver_api() {
    let Some((driver, server)) = DriverProgram::serving("driver_device_pools", &["--gpu", "0,1"]) else { return };
    for shm in ["on", "off"] {
        assert_passed(
            &format!("FLYT_SHM={shm}"),
            &run(seeing(driver.app(&server.addresses[0], Some(shm)), None), 60),
            &[
                "devices: 2",
                "an ordinal past the session's refused: yes",
                "a default pool per device, distinct: yes",
                "device 1's allocation names device 1 and its default pool: yes",
                "device 1's pool keeps its release threshold: yes",
                "the peer granted access: yes",
                "the next allocation on device 1 comes from it: yes",
                "PASSED: 0 failure(s)",
            ],
        );
    }
}

/// Large copies striped over a session's data connections (`client/src/stripes.rs`), over TCP and
/// a Unix socket, with the default count, one, three with small chunks (many chunks, the last
/// one short), striping off, and every chunk compressed (LZ4): odd sizes pinned and pageable, synchronous and asynchronous, 2D,
/// two threads at once, stream order; every byte checked by the program. Data connections must
/// join and no copy may fall back to the main connection. Traced (`FLYT_STRIPE_TRACE=1`), every
/// copy prints its line, its steps in order.
#[test]
fn large_copies_striped_over_data_connections_keep_every_byte_and_their_order() {
    let Some((driver, server)) = DriverProgram::serving("driver_striped_copies", &["--listen", "127.0.0.1:0"]) else { return };
    let runs: [(&str, &[(&str, &str)]); 9] = [
        ("tcp", &[]),
        ("tcp", &[("FLYT_STRIPES", "1")]),
        ("tcp", &[("FLYT_STRIPES", "3"), ("FLYT_STRIPE_CHUNK", "64K")]),
        ("tcp", &[("FLYT_STRIPES", "0")]),
        // Every chunk LZ4 shrinks goes compressed, both ways.
        ("tcp", &[("FLYT_STRIPE_LZ4", "on")]),
        ("unix", &[]),
        ("unix", &[("FLYT_STRIPES", "3"), ("FLYT_STRIPE_CHUNK", "192K")]),
        ("unix", &[("FLYT_STRIPE_LZ4", "on"), ("FLYT_STRIPE_CHUNK", "64K")]),
        ("unix", &[("FLYT_STRIPE_TRACE", "1")]),
    ];
    for (transport, env) in runs {
        let address = if transport == "tcp" { &server.addresses[0] } else { &server.addresses[1] };
        let joined_before = server.log_text().matches("data connection joined").count();
        let mut command = driver.app(address, Some("off"));
        command.envs(env.iter().copied());
        let what = format!("{transport} {env:?}");
        let outcome = run(command, 120);
        assert_passed(&what, &outcome, &["PASSED: 0 failure(s)"]);
        assert!(!outcome.2.contains("bulk copies use one connection"), "{what}: striping fell back\n{}", outcome.2);
        if env.contains(&("FLYT_STRIPE_TRACE", "1")) {
            assert_copies_traced(&what, &outcome.2);
        }
        let expected = match env.iter().find(|(name, _)| *name == "FLYT_STRIPES") {
            Some((_, count)) => count.parse::<usize>().unwrap(),
            None => 4,
        };
        // The worker logs a join just after answering it.
        let joined = || server.log_text().matches("data connection joined").count() - joined_before;
        wait_until(Duration::from_secs(5), || joined() >= expected);
        assert_eq!(joined(), expected, "{what}: data connections joined\n{}", server.log_text());
    }
}

/// Every line of the app's copy trace has a chunk moved on some connection and its calling
/// thread's steps in order (host to device: handed, written, reply; device to host: sent, reply,
/// landed), and both ways were traced.
fn assert_copies_traced(what: &str, stderr: &str) {
    let mut ways = std::collections::BTreeSet::new();
    for line in stderr.lines().filter(|line| line.starts_with("flyt: striped copy traced ")) {
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|word| word.strip_prefix(name)?.strip_prefix('='))
                .unwrap_or_else(|| panic!("{what}: no {name} in {line}"))
        };
        let number = |name: &str| field(name).parse::<u64>().unwrap_or_else(|_| panic!("{what}: {name} in {line}"));
        let way = field("way");
        let steps = if way == "htod" { ["handed_us", "written_us", "reply_us"] } else { ["sent_us", "reply_us", "landed_us"] };
        let steps = steps.map(number);
        assert!(steps[0] <= steps[1] && steps[1] <= steps[2], "{what}: steps out of order in {line}");
        assert!(field("first_chunk_us").split(',').any(|us| us != "0"), "{what}: no chunk moved in {line}");
        assert_eq!(field("connections"), "4", "{what}: {line}");
        ways.insert(way.to_string());
    }
    assert_eq!(ways.into_iter().collect::<Vec<_>>(), ["dtoh", "htod"], "{what}: both ways traced\n{stderr}");
}

/// A synchronize right after a device-to-host copy into pageable memory (which waited for the
/// stream) is answered without a round trip; one after new work is not.
#[test]
fn a_synchronize_after_a_waited_copy_costs_no_round_trip() {
    let Some(driver) = DriverProgram::compile("driver_sync_shortcut") else { return };
    let server = driver.server(&["--listen", "127.0.0.1:0"]);
    let mut command = driver.app(&server.addresses[0], Some("off"));
    command.env("FLYT_STATS", "1");
    let outcome = run(command, 60);
    assert_passed("FLYT_STATS=1", &outcome, &["every copy read the memset before it: yes", "PASSED"]);
    let stderr = &outcome.2;
    let row: Vec<u64> = stderr
        .lines()
        .find_map(|line| line.strip_prefix("flyt stats: cuStreamSynchronize "))
        .map(|rest| rest.split_whitespace().take(2).filter_map(|field| field.parse().ok()).collect())
        .unwrap_or_default();
    assert_eq!(row, [40, 20], "calls and round trips of cuStreamSynchronize:\n{stderr}");
}
