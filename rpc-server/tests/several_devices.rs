//! A session on several GPUs, against an emulated server with two (`--gpu 0,1`): the handshake
//! lists both with their peer answers and NVLinks; `SetDevice` makes a device current for the requests after
//! it, whose allocations and memory information are that device's; copies go between the two
//! devices' memory; peer access follows the driver's rules; an index outside the session's is
//! refused and changes nothing.

#![allow(clippy::tests_outside_test_module, reason = "an integration test crate: every function in it is a test")]

mod raw;

use flyt_protocol::CudaError;
use flyt_protocol::ops::req;
use raw::{RawSession, emulated_server};

const MIB: u64 = 1 << 20;

/// Reads `len` bytes at `src` back from the device.
fn read_back(session: &mut RawSession, src: u64, len: u64) -> Vec<u8> {
    let (reply, bytes) = session.call(req::MemcpyDtoH { src, len, stream: 0, blocking: true });
    reply.unwrap();
    bytes
}

#[test]
fn one_session_uses_both_devices_of_its_server() {
    let (_server, socket) = emulated_server("several-devices", &["--gpu", "0,1"]);
    let mut session = RawSession::open(&socket, None).unwrap();
    let info = session.info.clone();
    assert_eq!(info.devices.len(), 2, "two devices");
    assert_ne!(info.devices[0].uuid, info.devices[1].uuid, "each its own identity");
    assert_ne!(info.devices[0].name, info.devices[1].name);
    let links: Vec<(u32, u32, i32)> = info.peers.iter().map(|link| (link.from, link.to, link.access_supported)).collect();
    assert_eq!(links, vec![(0, 1, 1), (1, 0, 1)], "one answer per ordered pair");
    // The emulated device's fixed NVLink topology: two links join the pair.
    use flyt_protocol::device::NvLinkEnd;
    assert_eq!(info.nvlinks, vec![vec![NvLinkEnd::Device(1); 2], vec![NvLinkEnd::Device(0); 2]], "each device's links by index");

    let on_first = session.call(req::Malloc { size: MIB }).0.unwrap().ptr;
    session.send(&req::SetDevice { index: 1 }.into(), &[]);
    let on_second = session.call(req::Malloc { size: MIB }).0.unwrap().ptr;
    assert!(on_first + MIB <= on_second || on_second + MIB <= on_first, "disjoint addresses");

    // A memset on device 1, a copy to device 0's memory while device 1 is current, read back.
    session.send(&req::Memset { dst: on_second, pattern: 0x5a, width: 1, len: MIB, stream: 0 }.into(), &[]);
    session.send(&req::MemcpyDtoD { dst: on_first, src: on_second, len: MIB, stream: 0 }.into(), &[]);
    session.send(&req::SetDevice { index: 0 }.into(), &[]);
    assert_eq!(read_back(&mut session, on_first + 4096, 8), vec![0x5a; 8], "copied across devices");

    // Peer access: device 0 to device 1, once; not to itself; not disabled twice.
    assert!(session.call(req::PeerAccess { peer: 1, enable: true, flags: 0 }).0.is_ok());
    assert_eq!(session.call(req::PeerAccess { peer: 1, enable: true, flags: 0 }).0.err(), Some(CudaError::PEER_ACCESS_ALREADY_ENABLED));
    assert_eq!(session.call(req::PeerAccess { peer: 0, enable: true, flags: 0 }).0.err(), Some(CudaError::INVALID_DEVICE));
    assert!(session.call(req::PeerAccess { peer: 1, enable: false, flags: 0 }).0.is_ok());
    assert_eq!(session.call(req::PeerAccess { peer: 1, enable: false, flags: 0 }).0.err(), Some(CudaError::PEER_ACCESS_NOT_ENABLED));

    // A hostile index: refused (as the next synchronizing call's deferred error), device 0 kept.
    session.send(&req::SetDevice { index: 7 }.into(), &[]);
    let synced = session.call_with_deferred(req::DeviceSynchronize {}).0;
    assert_eq!(synced.deferred, Some(CudaError::INVALID_DEVICE), "an index outside the session's");
    assert!(session.call(req::PeerAccess { peer: 1, enable: true, flags: 0 }).0.is_ok(), "still on device 0");
    session.call(req::Free { ptr: on_first }).0.unwrap();
    session.call(req::Free { ptr: on_second }).0.unwrap();
}

#[test]
fn a_one_device_server_refuses_a_second_device() {
    let (_server, socket) = emulated_server("one-device", &[]);
    let mut session = RawSession::open(&socket, None).unwrap();
    assert_eq!(session.info.devices.len(), 1);
    assert!(session.info.peers.is_empty());
    assert_eq!(session.info.nvlinks, vec![Vec::new()], "a lone device has no NVLink");
    session.send(&req::SetDevice { index: 1 }.into(), &[]);
    let synced = session.call_with_deferred(req::DeviceSynchronize {}).0;
    assert_eq!(synced.deferred, Some(CudaError::INVALID_DEVICE));
}
