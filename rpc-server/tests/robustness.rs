//! The rpc-server against bad and hostile clients, on the emulated device: every bad input gets
//! a clear error or a closed connection with a logged reason, and no other session is harmed.

#![allow(clippy::tests_outside_test_module, reason = "an integration test crate: every function in it is a test")]

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use flyt_protocol::CudaError;
use flyt_protocol::frame::{FrameHeader, FrameLimits, read_value, write_frame, write_value};
use flyt_protocol::handshake::{Hello, HelloReply};
use flyt_protocol::ops::{Request, req};
use flyt_test_support::{Server, scratch_dir};

mod raw;
use raw::{RawSession, emulated_server, hello_reply, identity};

#[test]
fn hostile_frames_close_only_their_own_connection() {
    let (server, socket) = emulated_server("hostile", &[]);
    let mut good = RawSession::open(&socket, None).expect("good session");
    good.round_trip(1);

    // Not a Flyt client at all.
    let mut http = UnixStream::connect(socket.trim_start_matches("unix:")).unwrap();
    http.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    // A frame header claiming a 4 GiB message, before the hello.
    let mut huge = UnixStream::connect(socket.trim_start_matches("unix:")).unwrap();
    huge.write_all(&FrameHeader { message_len: u32::MAX, seq: 0, bulk_len: 0 }.encode()).unwrap();

    // Inside sessions: an unknown op, an oversized frame, bulk on an op that takes none, a
    // truncated frame.
    let mut unknown = RawSession::open(&socket, None).unwrap();
    write_frame(&mut unknown.stream, 1, &[0xff, 0x7f, 1, 2, 3], &[]).unwrap();
    let mut oversized = RawSession::open(&socket, None).unwrap();
    oversized.stream.write_all(&FrameHeader { message_len: 64 << 20, seq: 1, bulk_len: 0 }.encode()).unwrap();
    let mut stray_bulk = RawSession::open(&socket, None).unwrap();
    let mut message = Vec::new();
    Request::from(req::DeviceSynchronize {}).encode(&mut message);
    write_frame(&mut stray_bulk.stream, 1, &message, b"unexpected").unwrap();
    let mut truncated = RawSession::open(&socket, None).unwrap();
    truncated.stream.write_all(&FrameHeader { message_len: 100, seq: 1, bulk_len: 0 }.encode()).unwrap();
    truncated.stream.write_all(&[1, 2, 3]).unwrap();
    truncated.stream.shutdown(std::net::Shutdown::Write).unwrap();

    for session in [&mut unknown, &mut oversized, &mut stray_bulk, &mut truncated] {
        assert!(session.closed_by_server(), "the server must close a connection that breaks the protocol");
    }
    let log_has = |text: &str| server.wait_for_log(text, Duration::from_secs(10));
    assert!(log_has("unknown op id"), "{}", server.log_text());
    assert!(log_has("exceeds the limit"), "{}", server.log_text());
    assert!(log_has("unexpected bulk bytes"), "{}", server.log_text());
    assert!(log_has("connection ended inside a frame"), "{}", server.log_text());
    assert!(log_has("connection closed before a valid hello"), "{}", server.log_text());

    // The good session never noticed, and new sessions still work.
    good.round_trip(2);
    RawSession::open(&socket, None).expect("new session").round_trip(3);
}

#[test]
fn bad_requests_get_cuda_errors_and_the_session_goes_on() {
    let (_server, socket) = emulated_server("bad-requests", &[]);
    let mut session = RawSession::open(&socket, None).unwrap();
    let ptr = session.call(req::Malloc { size: 1024 }).0.unwrap().ptr;
    // Out of range, wrong pointer, unknown handles, a chunk larger than announced.
    assert_eq!(session.call(req::MemcpyDtoH { src: ptr + 1000, len: 100, stream: 0, blocking: true }).0, Err(CudaError::INVALID_VALUE));
    assert_eq!(session.call(req::MemcpyDtoH { src: 0x10, len: 1, stream: 0, blocking: true }).0, Err(CudaError::INVALID_VALUE));
    assert_eq!(session.call(req::Free { ptr: ptr + 8 }).0, Err(CudaError::INVALID_VALUE));
    assert_eq!(session.call(req::StreamSynchronize { stream: 77 }).0, Err(CudaError::INVALID_RESOURCE_HANDLE));
    assert_eq!(session.call(req::EventQuery { event: 5 }).0, Err(CudaError::INVALID_RESOURCE_HANDLE));
    let too_big = session.info.copy_chunk + 1;
    assert_eq!(session.call(req::MemcpyDtoH { src: ptr, len: too_big, stream: 0, blocking: true }).0, Err(CudaError::INVALID_VALUE));
    // An asynchronous op that fails reports at the next sync point, once.
    session.send(&req::Memset { dst: ptr + 1020, pattern: 0, width: 1, len: 8, stream: 0 }.into(), &[]);
    session.send(&req::StreamCreate { stream: 0, flags: 0, priority: 0 }.into(), &[]);
    let first = session.call_with_deferred(req::DeviceSynchronize {}).0;
    assert_eq!((first.result.is_ok(), first.deferred), (true, Some(CudaError::INVALID_VALUE)));
    let second = session.call_with_deferred(req::DeviceSynchronize {}).0;
    assert_eq!((second.result.is_ok(), second.deferred), (true, None));
    session.round_trip(9);
}

#[test]
fn wrong_versions_and_strangers_are_refused_with_a_reason() {
    let (_server, socket) = emulated_server("versions", &[]);
    let mut old = Hello::new(None, identity("old-client"), None);
    old.protocol_version = 0;
    match hello_reply(&socket, &old).1 {
        HelloReply::Refused { reason, .. } => assert!(reason.contains("protocol version"), "{reason}"),
        other => panic!("accepted an old protocol: {other:?}"),
    }
    let mut cuda12 = Hello::new(None, identity("cuda12-app"), None);
    cuda12.cuda_abi_major = 12;
    match hello_reply(&socket, &cuda12).1 {
        HelloReply::Refused { error, reason } => {
            assert_eq!(error, CudaError::INSUFFICIENT_DRIVER.code());
            assert!(reason.contains("CUDA 12"), "{reason}");
        }
        other => panic!("accepted a CUDA 12 app: {other:?}"),
    }
    let mut stranger = Hello::new(None, identity("stranger"), None);
    stranger.magic = *b"HTTP";
    assert!(matches!(hello_reply(&socket, &stranger).1, HelloReply::Refused { .. }));
}

#[test]
fn sessions_need_a_valid_token_when_a_cluster_key_is_set() {
    let scratch = scratch_dir("tokens");
    let key_path = scratch.join("cluster.key");
    std::fs::write(&key_path, "a cluster key of at least sixteen bytes\n").unwrap();
    std::fs::set_permissions(&key_path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let socket = format!("unix:{}", scratch.join("flyt.sock").display());
    let key = key_path.display().to_string();
    let _server =
        Server::start(&["--device", "emulated", "--listen", &socket, "--cluster-key-file", &key, "--allocation", "alloc-1"], &scratch);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let token = |allocation: &str, expires_at: u64| {
        let claims = flyt_protocol::token::SessionClaims { allocation: allocation.into(), expires_at };
        flyt_protocol::token::issue(b"a cluster key of at least sixteen bytes", &claims).unwrap()
    };
    let refused = |token: Option<String>| RawSession::open(&socket, token).err().expect("must be refused");
    assert!(refused(None).1.contains("needs a session token"));
    assert!(refused(Some(token("alloc-2", now + 60))).1.contains("not this server's"));
    assert!(refused(Some(token("alloc-1", now - 1))).1.contains("expired"));
    assert!(refused(Some("flyt1.alloc-1.99999999999.00".into())).1.contains("malformed"));
    RawSession::open(&socket, Some(token("alloc-1", now + 60))).expect("valid token").round_trip(4);
}

#[test]
fn the_quota_is_exact_shared_and_given_back_when_a_client_dies() {
    let (server, socket) = emulated_server("quota", &["--memory-quota", "64MiB"]);
    let mut first = RawSession::open(&socket, None).unwrap();
    assert_eq!(first.info.devices[0].total_mem, 64 << 20, "the session sees its slice");
    let info = first.call(req::MemGetInfo {}).0.unwrap();
    assert_eq!((info.free, info.total), (64 << 20, 64 << 20));
    first.call(req::Malloc { size: 40 << 20 }).0.expect("within the quota");
    // A second session of the same allocation shares the quota.
    let mut second = RawSession::open(&socket, None).unwrap();
    assert_eq!(second.call(req::Malloc { size: 30 << 20 }).0, Err(CudaError::MEMORY_ALLOCATION));
    second.call(req::Malloc { size: 24 << 20 }).0.expect("exactly the rest");
    assert_eq!(second.call(req::Malloc { size: 1 }).0, Err(CudaError::MEMORY_ALLOCATION));
    assert_eq!(second.call(req::MemGetInfo {}).0.unwrap().free, 0);
    // The first client dies without freeing anything.
    drop(first);
    assert!(server.wait_for_log("session 1 closed", Duration::from_secs(10)), "{}", server.log_text());
    second.call(req::Malloc { size: 40 << 20 }).0.expect("the dead session's memory is back");
}

#[test]
fn a_dead_worker_ends_only_its_session() {
    let (server, socket) = emulated_server("worker-death", &[]);
    let mut victim = RawSession::open(&socket, None).unwrap();
    let mut bystander = RawSession::open(&socket, None).unwrap();
    victim.round_trip(5);
    let log = server.log_text();
    let worker: u32 = log
        .lines()
        .find(|line| line.contains(&format!("session {} opened", victim.info.session_id)))
        .and_then(|line| line.split("worker=").nth(1))
        .and_then(|pid| pid.trim().parse().ok())
        .expect("the log names the session's worker");
    std::process::Command::new("kill").args(["-KILL", &worker.to_string()]).status().unwrap();
    assert!(victim.closed_by_server());
    assert!(server.wait_for_log(&format!("session {} closed", victim.info.session_id), Duration::from_secs(10)));
    bystander.round_trip(6);
    RawSession::open(&socket, None).expect("new sessions still start").round_trip(7);
}

#[test]
fn warm_workers_that_die_unused_are_replaced() {
    let scratch = flyt_test_support::scratch_dir("warm-replaced");
    let socket = format!("unix:{}", scratch.join("flyt.sock").display());
    let server = flyt_test_support::Server::start(&["--device", "emulated", "--listen", &socket, "--warm-workers", "3"], &scratch);
    let children = || -> Vec<String> {
        let out = std::process::Command::new("pgrep").args(["-P", &server.pid().to_string()]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_string).collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while children().len() < 3 {
        assert!(std::time::Instant::now() < deadline, "the warm workers did not start: {:?}", children());
        std::thread::sleep(Duration::from_millis(20));
    }
    // (The server starts with one more than its warm count: the worker that opened the device.)
    std::thread::sleep(Duration::from_millis(300));
    let first = children();
    std::process::Command::new("kill").arg("-KILL").args(&first).status().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let now = children();
        if now.len() >= 3 && now.iter().all(|pid| !first.contains(pid)) {
            // Replaced, and no more than replaced: each gap is filled once.
            std::thread::sleep(Duration::from_millis(500));
            let settled = children();
            assert_eq!(settled.len(), 3, "warm workers {first:?} killed, now {settled:?}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "warm workers {first:?} killed, now {now:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    RawSession::open(&socket, None).expect("sessions still start").round_trip(3);
}

/// Opens a session offering a memfd segment that really holds `real` bytes but claims `offered`.
fn open_with_segment(socket: &str, real: u64, offered: u64, staging: u64) -> (RawSession, std::fs::File) {
    use std::os::fd::AsRawFd;
    let fd = nix::sys::memfd::memfd_create(c"test-segment", nix::sys::memfd::MFdFlags::MFD_ALLOW_SEALING).unwrap();
    let file = std::fs::File::from(fd);
    file.set_len(real).unwrap();
    let offer = flyt_protocol::handshake::ShmOffer { path: String::new(), size: offered, staging, rings: 0, region: None };
    let mut stream = UnixStream::connect(socket.trim_start_matches("unix:")).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write_value(&mut stream, 0, &Hello::new(None, identity("shm-test"), Some(offer))).unwrap();
    let fds = [file.as_raw_fd()];
    nix::sys::socket::sendmsg::<()>(
        stream.as_raw_fd(),
        &[std::io::IoSlice::new(b"S")],
        &[nix::sys::socket::ControlMessage::ScmRights(&fds)],
        nix::sys::socket::MsgFlags::empty(),
        None,
    )
    .unwrap();
    let (_, reply) = read_value::<HelloReply>(&mut stream, &FrameLimits::default()).unwrap();
    let HelloReply::Accepted(info) = reply else { panic!("refused: {reply:?}") };
    (RawSession { stream, info, seq: 1 }, file)
}

#[test]
fn bad_segments_and_offsets_get_clear_errors() {
    let (_server, socket) = emulated_server("shm-bad", &[]);
    // A segment smaller than offered is declined, with the reason, and the session goes on.
    let (mut short, _file) = open_with_segment(&socket, 4096, 1 << 30, 0);
    assert!(!short.info.shm_accepted);
    assert!(short.info.shm_refusal.as_deref().unwrap_or_default().contains("holds 4096 bytes"), "{:?}", short.info.shm_refusal);
    short.round_trip(8);
    assert_eq!(short.call(req::ShmRegister { offset: 0, len: 4096, mapped_at: 0 }).0, Err(CudaError::NOT_SUPPORTED));

    let (mut session, _file) = open_with_segment(&socket, 16 << 20, 16 << 20, 8 << 20);
    assert!(session.info.shm_accepted);
    let ptr = session.call(req::Malloc { size: 1 << 20 }).0.unwrap().ptr;
    // Staging is pinned; the rest of the segment only once registered.
    session.send(&req::ShmCopyHtoD { dst: ptr, offset: 0, len: 4096, stream: 0 }.into(), &[]);
    let clean = session.call_with_deferred(req::DeviceSynchronize {}).0;
    assert_eq!(clean.deferred, None);
    for (offset, len) in [(8 << 20, 4096), ((16 << 20) - 10, 4096), (u64::MAX - 5, 10)] {
        session.send(&req::ShmCopyHtoD { dst: ptr, offset, len, stream: 0 }.into(), &[]);
        let reply = session.call_with_deferred(req::DeviceSynchronize {}).0;
        assert_eq!(reply.deferred, Some(CudaError::INVALID_VALUE), "offset {offset} len {len}");
    }
    assert_eq!(session.call(req::ShmRegister { offset: 4096, len: 4096, mapped_at: 0 }).0, Err(CudaError::INVALID_VALUE), "inside staging");
    assert_eq!(
        session.call(req::ShmRegister { offset: 12 << 20, len: 8 << 20, mapped_at: 0 }).0,
        Err(CudaError::INVALID_VALUE),
        "past the end"
    );
    session.call(req::ShmRegister { offset: 8 << 20, len: 4 << 20, mapped_at: 0 }).0.expect("a block");
    assert_eq!(
        session.call(req::ShmRegister { offset: 10 << 20, len: 4096, mapped_at: 0 }).0,
        Err(CudaError::HOST_MEMORY_ALREADY_REGISTERED)
    );
    session.send(&req::ShmCopyDtoH { src: ptr, offset: 9 << 20, len: 1 << 20, stream: 0 }.into(), &[]);
    assert_eq!(session.call_with_deferred(req::ShmFence { stream: 0 }).0.result, Ok(flyt_protocol::ops::rep::ShmFence {}));

    // A block is also mapped at the client's address of it when that address is free in the
    // server (kernels then use the app's pointer), never over anything of the server's; copies
    // go through that mapping of the same pages.
    const FREE: u64 = 0x6d00_0000_0000;
    let mapped = session.call(req::ShmRegister { offset: 12 << 20, len: 8192, mapped_at: FREE }).0.expect("a mapped block");
    assert_eq!(mapped.device_pointer, FREE);
    let twice = session.call(req::ShmRegister { offset: 13 << 20, len: 4096, mapped_at: FREE }).0.expect("a block");
    assert_eq!(twice.device_pointer, 0, "the address is taken by the first block now");
    for (offset, unusable) in [(14 << 20, FREE + 1), (14 << 20, 1 << 47), (14 << 20, 4096), (14 << 20, u64::MAX - 4095)] {
        let reply = session.call(req::ShmRegister { offset, len: 4096, mapped_at: unusable }).0.expect("a block");
        assert_eq!(reply.device_pointer, 0, "{unusable:#x}");
        session.send(&req::ShmUnregister { offset }.into(), &[]);
    }
    std::os::unix::fs::FileExt::write_all_at(&_file, b"mapped pages", (12 << 20) + 4096).unwrap();
    session.send(&req::ShmCopyHtoD { dst: ptr, offset: (12 << 20) + 4096, len: 12, stream: 0 }.into(), &[]);
    session.send(&req::ShmCopyDtoH { src: ptr, offset: 12 << 20, len: 12, stream: 0 }.into(), &[]);
    assert_eq!(session.call_with_deferred(req::ShmFence { stream: 0 }).0.result, Ok(flyt_protocol::ops::rep::ShmFence {}));
    let mut back = [0u8; 12];
    std::os::unix::fs::FileExt::read_exact_at(&_file, &mut back, 12 << 20).unwrap();
    assert_eq!(&back, b"mapped pages");
    session.send(&req::ShmUnregister { offset: 12 << 20 }.into(), &[]);
    let again = session.call(req::ShmRegister { offset: 12 << 20, len: 4096, mapped_at: FREE }).0.expect("a block");
    assert_eq!(again.device_pointer, FREE, "unregistering unmapped the alias");

    // The client unmapping or resizing its side cannot hurt the server: the memfd is sealed.
    assert!(_file.set_len(4096).is_err(), "the server seals the segment against shrinking");
    session.round_trip(9);
}

/// Hands `fd` to the worker under `token` (as `flyt_client::host_files` does); whether the worker
/// kept it.
fn deposit(socket: &str, token: &[u8; 16], fd: std::os::fd::RawFd) -> bool {
    use std::io::Read;
    use std::os::linux::net::SocketAddrExt;
    let address = std::os::unix::net::SocketAddr::from_abstract_name(socket.as_bytes()).unwrap();
    let Ok(mut stream) = UnixStream::connect_addr(&address) else { return false };
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let request = flyt_protocol::deposit::request(token);
    let fds = [fd];
    nix::sys::socket::sendmsg::<()>(
        std::os::fd::AsRawFd::as_raw_fd(&stream),
        &[std::io::IoSlice::new(&request)],
        &[nix::sys::socket::ControlMessage::ScmRights(&fds)],
        nix::sys::socket::MsgFlags::empty(),
        None,
    )
    .unwrap();
    let mut answer = [0u8];
    stream.read_exact(&mut answer).is_ok() && answer[0] == flyt_protocol::deposit::ACCEPTED
}

/// The app's own files, handed over by descriptor and mapped at the app's address: only tickets
/// the worker issued take a descriptor, once; what is not a file, a range past its end and an
/// unknown token are refused; a good one is mapped where asked, written through, unmapped.
#[test]
fn deposited_files_are_checked_before_they_are_mapped() {
    use std::os::fd::AsRawFd;
    let (_server, socket) = emulated_server("shm-files", &[]);
    let (mut plain, _) = open_with_segment(&socket, 4096, 1 << 30, 0);
    assert_eq!(plain.call(req::ShmFileTicket {}).0.map(drop), Err(CudaError::NOT_SUPPORTED), "no segment, no tickets");
    let (mut session, _segment) = open_with_segment(&socket, 16 << 20, 16 << 20, 8 << 20);
    assert!(session.info.shm_accepted);

    let scratch = scratch_dir("shm-files-data");
    let path = scratch.join("shared");
    let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    file.set_len(8192).unwrap();
    const FREE: u64 = 0x6e00_0000_0000;
    let register = |session: &mut RawSession, token, file_offset, len, mapped_at| {
        session.call(req::ShmRegisterFile { token, file_offset, len, mapped_at }).0.map(|reply| reply.device_pointer)
    };

    assert_eq!(register(&mut session, [9; 16], 0, 4096, FREE), Err(CudaError::INVALID_VALUE), "a token never issued");
    let ticket = session.call(req::ShmFileTicket {}).0.expect("a ticket");
    assert!(ticket.socket.starts_with(flyt_protocol::deposit::SOCKET_PREFIX), "{}", ticket.socket);
    assert!(!deposit(&ticket.socket, &[9; 16], file.as_raw_fd()), "a token the worker did not issue");
    assert!(deposit(&ticket.socket, &ticket.token, file.as_raw_fd()));
    assert!(!deposit(&ticket.socket, &ticket.token, file.as_raw_fd()), "a ticket takes one descriptor");
    assert_eq!(register(&mut session, ticket.token, 4096, 8192, FREE), Err(CudaError::INVALID_VALUE), "past the file's end");
    assert_eq!(register(&mut session, ticket.token, 0, 4096, FREE), Err(CudaError::INVALID_VALUE), "a ticket is used once");

    let (reader, _writer) = std::io::pipe().unwrap();
    let ticket = session.call(req::ShmFileTicket {}).0.unwrap();
    assert!(deposit(&ticket.socket, &ticket.token, reader.as_raw_fd()));
    assert_eq!(register(&mut session, ticket.token, 0, 4096, FREE), Err(CudaError::INVALID_VALUE), "a pipe is no file");

    let ticket = session.call(req::ShmFileTicket {}).0.unwrap();
    assert!(deposit(&ticket.socket, &ticket.token, file.as_raw_fd()));
    assert_eq!(register(&mut session, ticket.token, 0, 4096, FREE + 1), Err(CudaError::INVALID_VALUE), "unaligned");
    let ticket = session.call(req::ShmFileTicket {}).0.unwrap();
    assert!(deposit(&ticket.socket, &ticket.token, file.as_raw_fd()));
    assert_eq!(register(&mut session, ticket.token, 4096, 4096, FREE), Ok(FREE));
    // A memset at the app's address lands in the file's second page.
    session.send(&req::Memset { dst: FREE + 16, pattern: 0x77, width: 1, len: 8, stream: 0 }.into(), &[]);
    assert_eq!(session.call_with_deferred(req::DeviceSynchronize {}).0.deferred, None);
    let mut back = [0u8; 10];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut back, 4096 + 15).unwrap();
    assert_eq!(back, [0, 0x77, 0x77, 0x77, 0x77, 0x77, 0x77, 0x77, 0x77, 0]);
    // The address is taken now: a second file there is refused, and nothing of the first moves.
    let ticket = session.call(req::ShmFileTicket {}).0.unwrap();
    assert!(deposit(&ticket.socket, &ticket.token, file.as_raw_fd()));
    assert_eq!(register(&mut session, ticket.token, 0, 4096, FREE), Err(CudaError::NOT_SUPPORTED));

    session.send(&req::ShmUnregisterFile { mapped_at: FREE }.into(), &[]);
    session.send(&req::Memset { dst: FREE, pattern: 1, width: 1, len: 8, stream: 0 }.into(), &[]);
    assert_eq!(session.call_with_deferred(req::DeviceSynchronize {}).0.deferred, Some(CudaError::INVALID_VALUE), "unmapped");
    session.send(&req::ShmUnregisterFile { mapped_at: FREE }.into(), &[]);
    assert_eq!(session.call_with_deferred(req::DeviceSynchronize {}).0.deferred, Some(CudaError::HOST_MEMORY_NOT_REGISTERED));
    let ticket = session.call(req::ShmFileTicket {}).0.unwrap();
    assert!(deposit(&ticket.socket, &ticket.token, file.as_raw_fd()));
    assert_eq!(register(&mut session, ticket.token, 0, 8192, FREE), Ok(FREE), "the address is free again");
    // A file ending inside its last page maps up to that page's end.
    file.set_len(4096 + 4).unwrap();
    let ticket = session.call(req::ShmFileTicket {}).0.unwrap();
    assert!(deposit(&ticket.socket, &ticket.token, file.as_raw_fd()));
    assert_eq!(register(&mut session, ticket.token, 0, 8192, FREE + (1 << 20)), Ok(FREE + (1 << 20)));
    let ticket = session.call(req::ShmFileTicket {}).0.unwrap();
    assert!(deposit(&ticket.socket, &ticket.token, file.as_raw_fd()));
    assert_eq!(register(&mut session, ticket.token, 0, 3 * 4096, FREE + (2 << 20)), Err(CudaError::INVALID_VALUE), "a page past it");
    session.round_trip(10);
}
