//! Tenants on GPUs of one host (issue 45, decision 5), against emulated servers of an emulated
//! host: each server's workers see only its GPUs (`CUDA_VISIBLE_DEVICES` by UUID, numbered from
//! 0 inside), and a hostile client of tenant A, speaking raw frames, tries every way it has to
//! reach tenant B's GPU and memory: each is refused with a clear CUDA error, the refusal of a
//! foreign device is logged once, and B's data stay intact.

#![allow(clippy::tests_outside_test_module, reason = "an integration test crate: every function in it is a test")]

mod raw;

use std::time::Duration;

use flyt_protocol::CudaError;
use flyt_protocol::ops::req;
use flyt_test_support::{Server, artifact, run_with_timeout};
use raw::{RawSession, emulated_server};

const MIB: u64 = 1 << 20;
const MIB_BYTES: usize = 1 << 20;

/// The emulated host's GPU `ordinal` as `CUDA_VISIBLE_DEVICES` names it.
fn host_gpu(ordinal: usize) -> String {
    flyt_rpc_server::visible::uuid_name(&flyt_rpc_server::backend::emulated::host_uuid(ordinal), false)
}

/// The worker processes of `server` (its children), with each one's environment and arguments.
fn workers(server: &Server) -> Vec<(Vec<String>, Vec<String>)> {
    let tasks = std::fs::read_dir(format!("/proc/{}/task", server.pid())).expect("the server's threads");
    let mut pids: Vec<String> = tasks
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|children| children.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .collect();
    pids.sort();
    pids.dedup();
    let split = |bytes: Vec<u8>| bytes.split(|byte| *byte == 0).map(|part| String::from_utf8_lossy(part).into_owned()).collect::<Vec<_>>();
    pids.iter()
        .filter_map(|pid| {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            Some((split(environ), split(cmdline)))
        })
        .filter(|(_, cmdline)| cmdline.get(1).is_some_and(|mode| mode == "worker"))
        .collect()
}

fn argument<'a>(cmdline: &'a [String], flag: &str) -> Option<&'a str> {
    cmdline.iter().position(|arg| arg == flag).and_then(|at| cmdline.get(at + 1)).map(String::as_str)
}

#[test]
fn each_servers_workers_see_only_its_gpus_numbered_from_zero() {
    let (server, socket) = emulated_server("isolation-one-gpu", &["--gpu", "1"]);
    let session = RawSession::open(&socket, None).unwrap();
    assert_eq!(session.info.devices.len(), 1, "one device");
    assert_eq!(&session.info.devices[0].uuid, b"flyt-emulated-01", "the host's GPU 1, as the session's device 0");
    let started = workers(&server);
    assert!(!started.is_empty(), "the server runs workers");
    for (environ, cmdline) in &started {
        assert!(environ.contains(&format!("CUDA_VISIBLE_DEVICES={}", host_gpu(1))), "the worker sees GPU 1 only: {environ:?}");
        assert_eq!(argument(cmdline, "--gpu"), Some("0"), "inside, the GPU is device 0");
        assert_eq!(argument(cmdline, "--gpu-uuids"), Some(host_gpu(1).as_str()));
    }
    drop(session);

    let (server, socket) = emulated_server("isolation-two-gpus", &["--gpu", "3,0"]);
    let session = RawSession::open(&socket, None).unwrap();
    let uuids: Vec<[u8; 16]> = session.info.devices.iter().map(|device| device.uuid).collect();
    assert_eq!(uuids, vec![*b"flyt-emulated-03", *b"flyt-emulated-00"], "in the order of --gpu");
    for (environ, cmdline) in workers(&server) {
        assert!(environ.contains(&format!("CUDA_VISIBLE_DEVICES={},{}", host_gpu(3), host_gpu(0))), "{environ:?}");
        assert_eq!(argument(&cmdline, "--gpu"), Some("0,1"));
    }
}

#[test]
fn a_gpu_the_host_lacks_is_a_start_up_error() {
    let scratch = flyt_test_support::scratch_dir("isolation-missing-gpu");
    let socket = format!("unix:{}", scratch.join("flyt.sock").display());
    let mut command = std::process::Command::new(artifact("flyt-rpc-server"));
    command.args(["--device", "emulated", "--listen", &socket, "--gpu", "0,99"]).env("FLYT_RPC_IMAGE_CACHE", "off");
    let (code, _, stderr) = run_with_timeout(&mut command, Duration::from_secs(60));
    assert_ne!(code, 0);
    assert!(stderr.contains("GPU 99 does not exist"), "{stderr}");
}

#[test]
fn the_probe_names_the_emulated_hosts_gpus() {
    let mut command = std::process::Command::new(artifact("flyt-rpc-server"));
    command.args(["gpu-uuids", "--backend", "emulated", "--gpu", "2,5"]);
    let (code, stdout, _) = run_with_timeout(&mut command, Duration::from_secs(30));
    assert_eq!(code, 0);
    assert_eq!(stdout.lines().collect::<Vec<_>>(), vec![host_gpu(2), host_gpu(5)]);
}

/// Reads `len` bytes at `src` back from the device.
fn read_back(session: &mut RawSession, src: u64, len: u64) -> Result<Vec<u8>, CudaError> {
    let (reply, bytes) = session.call(req::MemcpyDtoH { src, len, stream: 0, blocking: true });
    reply.map(|_| bytes)
}

/// The deferred error a request without a reply left, read at the next synchronize.
fn deferred_after(session: &mut RawSession, request: flyt_protocol::ops::Request, bulk: &[u8]) -> Option<CudaError> {
    session.send(&request, bulk);
    let synced = session.call_with_deferred(req::DeviceSynchronize {}).0;
    assert!(synced.result.is_ok(), "the session goes on");
    synced.deferred
}

#[test]
fn a_hostile_tenant_cannot_reach_another_tenants_gpu_or_memory() {
    // One emulated host, two tenants: A on GPU 0, B on GPU 1, each its own server.
    let (server_a, socket_a) = emulated_server("isolation-tenant-a", &["--gpu", "0"]);
    let (_server_b, socket_b) = emulated_server("isolation-tenant-b", &["--gpu", "1"]);
    let mut b = RawSession::open(&socket_b, None).unwrap();
    let mut a = RawSession::open(&socket_a, None).unwrap();
    assert_eq!(a.info.devices.len(), 1, "A sees its one GPU");
    assert_eq!(&a.info.devices[0].uuid, b"flyt-emulated-00");
    assert!(a.info.peers.is_empty(), "and no peer to reach");

    // B's data: an allocation, and an allocation of a pool it exported (a shareable handle).
    let secret = b.call(req::Malloc { size: MIB }).0.unwrap().ptr;
    b.send(&req::MemcpyHtoD { dst: secret, stream: 0 }.into(), &vec![0xb7; MIB_BYTES]);
    b.call(req::MemPoolCreate { pool: 7, handle_types: 1 }).0.unwrap();
    let pooled = b.call(req::MemAllocAsync { size: MIB, stream: 0, pool: 7 }).0.unwrap().ptr;
    b.send(&req::Memset { dst: pooled, pattern: 0x3c, width: 1, len: MIB, stream: 0 }.into(), &[]);
    let shareable = b.call(req::MemPoolExport { pool: 7 }).0.unwrap().shareable;
    // A's own memory, of another size than B's (separate workers may be handed equal addresses:
    // an address A holds itself is A's, whatever B holds there).
    let own = a.call(req::Malloc { size: 3 * MIB }).0.unwrap().ptr;
    let foreign: Vec<u64> = [secret, pooled, secret + 4096].into_iter().filter(|ptr| !(own..own + 3 * MIB).contains(ptr)).collect();
    assert!(!foreign.is_empty(), "B's addresses are not all A's too");

    // B's GPU by index: SetDevice (twice: logged once), peer access, a peer's context.
    for index in [1, 1, 2, u32::MAX] {
        assert_eq!(deferred_after(&mut a, req::SetDevice { index }.into(), &[]), Some(CudaError::INVALID_DEVICE), "SetDevice {index}");
    }
    let refusals = server_a.log_text().matches("a device outside the session's refused").count();
    assert_eq!(refusals, 1, "logged once a session:\n{}", server_a.log_text());
    for peer in [1, 0, 7] {
        assert_eq!(a.call(req::PeerAccess { peer, enable: true, flags: 0 }).0.err(), Some(CudaError::INVALID_DEVICE), "peer {peer}");
    }

    // B's addresses in A's requests: copies each way, device to device, memsets, frees.
    for ptr in foreign {
        assert_eq!(read_back(&mut a, ptr, 64).err(), Some(CudaError::INVALID_VALUE), "reading B's {ptr:#x}");
        assert_eq!(deferred_after(&mut a, req::MemcpyHtoD { dst: ptr, stream: 0 }.into(), &[0; 64]), Some(CudaError::INVALID_VALUE));
        let copy_out = req::MemcpyDtoD { dst: own, src: ptr, len: 64, stream: 0 };
        assert_eq!(deferred_after(&mut a, copy_out.into(), &[]), Some(CudaError::INVALID_VALUE));
        let copy_in = req::MemcpyDtoD { dst: ptr, src: own, len: 64, stream: 0 };
        assert_eq!(deferred_after(&mut a, copy_in.into(), &[]), Some(CudaError::INVALID_VALUE));
        let memset = req::Memset { dst: ptr, pattern: 0, width: 1, len: 64, stream: 0 };
        assert_eq!(deferred_after(&mut a, memset.into(), &[]), Some(CudaError::INVALID_VALUE));
        assert_eq!(a.call(req::Free { ptr }).0.err(), Some(CudaError::INVALID_VALUE), "freeing B's {ptr:#x}");
        assert!(deferred_after(&mut a, req::MemFreeAsync { ptr, stream: 0 }.into(), &[]).is_some(), "a stream-ordered free of B's");
        assert!(a.call(req::IpcGetMemHandle { ptr }).0.is_err(), "exporting B's memory as A's");
    }

    // B's shareable handle with a guessed token, and an IPC handle A made up: refused.
    let mut forged = shareable.clone();
    forged[8] ^= 0xff;
    assert_eq!(a.call(req::MemPoolImport { pool: 9, shareable: forged }).0.err(), Some(CudaError::INVALID_VALUE));
    assert!(a.call(req::IpcOpenMemHandle { handle: vec![0x5a; 64], flags: 1 }).0.is_err());

    // A's session still works, and B's data are as B left them.
    assert_eq!(read_back(&mut a, own, 8).unwrap().len(), 8);
    assert_eq!(read_back(&mut b, secret, MIB).unwrap(), vec![0xb7; MIB_BYTES], "B's allocation intact");
    assert_eq!(read_back(&mut b, pooled, MIB).unwrap(), vec![0x3c; MIB_BYTES], "B's pool allocation intact");
}
