//! Striped bulk copies on the wire (`flyt_protocol::stripes`), against an emulated server: data
//! connections join a session only with its secret, carry striped copies of odd sizes both ways
//! with the bytes intact whichever connection carries which chunk, stay in step when a copy is
//! refused, and a hostile or broken data connection (a stray, repeated or missing chunk) fails
//! its copy (the copy's reply says so) without harming the session.

#![allow(clippy::tests_outside_test_module, reason = "an integration test crate: every function in it is a test")]
#![allow(clippy::cast_possible_truncation, reason = "test copies of a few MiB: offsets fit in usize, bytes wrap on purpose")]

mod raw;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use flyt_protocol::CudaError;
use flyt_protocol::frame::{FrameLimits, read_message, read_value, write_value};
use flyt_protocol::handshake::Hello;
use flyt_protocol::ops::{decode_reply, rep, req};
use flyt_protocol::stripes::{CHUNK_HEADER_LEN, ChunkHeader, SECRET_LEN, StripeJoin, StripeReply, chunks};
use raw::{RawSession, emulated_server, identity};

const CHUNK: u64 = 64 << 10;

/// Opens a data connection claiming `session_id` with `secret`, and its answer.
fn join(socket: &str, session_id: u64, secret: [u8; SECRET_LEN], index: u32) -> (UnixStream, StripeReply) {
    let mut stream = UnixStream::connect(socket.trim_start_matches("unix:")).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let hello = Hello { stripe: Some(StripeJoin { session_id, secret, index }), ..Hello::new(None, identity("stripe-test"), None) };
    write_value(&mut stream, 0, &hello).unwrap();
    let (_, reply) = read_value::<StripeReply>(&mut stream, &FrameLimits::default()).expect("an answer");
    (stream, reply)
}

fn pattern(len: u64, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed).wrapping_add((i >> 16) as u8)).collect()
}

/// Writes a copy's chunks over `links` unevenly (most on the last, every third on the first: a
/// client deals each to the first connection free), then every link's end of share.
fn send_chunks(links: &mut [UnixStream], transfer: u64, bytes: &[u8]) {
    for (number, (offset, len)) in chunks(bytes.len() as u64, CHUNK, links.len()).into_iter().enumerate() {
        let link = if number % 3 == 0 { 0 } else { links.len() - 1 };
        links[link].write_all(&ChunkHeader::raw(transfer, offset, len).encode()).unwrap();
        links[link].write_all(&bytes[offset as usize..(offset + len) as usize]).unwrap();
    }
    end_shares(links, transfer);
}

/// Every link's end of its share of copy `transfer`.
fn end_shares(links: &mut [UnixStream], transfer: u64) {
    for link in links {
        link.write_all(&ChunkHeader::end(transfer).encode()).unwrap();
    }
}

/// Reads a device-to-host copy's chunks off whichever of `links` they come on until its `len`
/// bytes are in: each chunk's header and the bytes that followed it, in the order they came.
/// Checks they are the copy's plan, each chunk once.
fn receive_any(links: &mut [UnixStream], transfer: u64, len: u64) -> Vec<(ChunkHeader, Vec<u8>)> {
    for link in links.iter() {
        link.set_nonblocking(true).unwrap();
    }
    // Per link: the bytes of the header or chunk being read, and the header once whole.
    let mut partial: Vec<(Vec<u8>, Option<ChunkHeader>)> = vec![(Vec::new(), None); links.len()];
    let (mut came, mut got, mut buffer) = (Vec::new(), 0, vec![0u8; 1 << 16]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while got < len {
        assert!(Instant::now() < deadline, "copy {transfer}: chunks stopped at {got} of {len} bytes");
        let mut progressed = false;
        for (link, (pending, header)) in links.iter_mut().zip(&mut partial) {
            let want = header.map_or(CHUNK_HEADER_LEN, |header| header.wire_len as usize) - pending.len();
            match link.read(&mut buffer[..want.min(1 << 16)]) {
                Ok(0) => panic!("a data connection closed"),
                Ok(read) => {
                    pending.extend_from_slice(&buffer[..read]);
                    progressed = true;
                }
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(error) => panic!("reading a chunk: {error}"),
            }
            if header.is_none() && pending.len() == CHUNK_HEADER_LEN {
                let decoded = ChunkHeader::decode(pending[..].try_into().unwrap()).expect("a chunk header");
                assert_eq!(decoded.transfer, transfer);
                *header = Some(decoded);
                pending.clear();
            }
            if let Some(whole) = header.filter(|header| pending.len() as u64 == header.wire_len) {
                got += whole.len;
                came.push((whole, std::mem::take(pending)));
                *header = None;
            }
        }
        if !progressed {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    for link in links.iter() {
        link.set_nonblocking(false).unwrap();
    }
    let mut places: Vec<(u64, u64)> = came.iter().map(|(header, _)| (header.offset, header.len)).collect();
    places.sort_unstable();
    assert_eq!(places, chunks(len, CHUNK, links.len()), "copy {transfer}: each chunk of the plan once");
    came
}

/// Reads a device-to-host copy's chunks (all raw) off whichever of `links` they come on.
fn receive_chunks(links: &mut [UnixStream], transfer: u64, len: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; len as usize];
    for (header, payload) in receive_any(links, transfer, len) {
        assert!(!header.compressed());
        bytes[header.offset as usize..(header.offset + header.len) as usize].copy_from_slice(&payload);
    }
    bytes
}

fn read_back(session: &mut RawSession, src: u64, len: u64) -> Vec<u8> {
    let (result, bytes) = session.call(req::MemcpyDtoH { src, len, stream: 0, blocking: true });
    result.expect("read back");
    bytes
}

/// The reply to the striped host-to-device copy sent as `seq`, once its chunks are in.
fn htod_reply(session: &mut RawSession, seq: u32) -> Result<bool, CudaError> {
    let mut message = Vec::new();
    let header = read_message(&mut session.stream, &FrameLimits::default(), &mut message).expect("the copy's reply");
    assert_eq!(header.seq, seq);
    decode_reply::<rep::MemcpyHtoDStriped>(&message).expect("a striped copy's reply").result.map(|reply| reply.again)
}

#[test]
fn data_connections_join_with_the_secret_only_and_carry_odd_sized_copies_both_ways() {
    // Three staging slots: at most three chunks of a host-to-device copy in flight.
    let (_server, socket) = emulated_server("stripes-wire", &["--staging-slots", "3"]);
    let mut session = RawSession::open(&socket, None).expect("session");
    let id = session.info.session_id;
    let secret = session.info.stripe_secret.expect("a session over a socket gets a stripe secret");

    // Strangers are refused: a wrong secret, a session that does not exist.
    let mut wrong = secret;
    wrong[7] ^= 0x40;
    assert!(matches!(join(&socket, id, wrong, 0).1, StripeReply::Refused { .. }));
    assert!(matches!(join(&socket, id + 1000, secret, 0).1, StripeReply::Refused { .. }));

    let mut links: Vec<UnixStream> = (0..3)
        .map(|index| {
            let (stream, reply) = join(&socket, id, secret, index);
            assert_eq!(reply, StripeReply::Joined, "data connection {index}");
            stream
        })
        .collect();
    // An index taken already is refused, and the one holding it keeps it.
    assert!(matches!(join(&socket, id, secret, 1).1, StripeReply::Refused { .. }));

    let size = 1 << 20;
    let ptr = session.call(req::Malloc { size }).0.expect("malloc").ptr;
    // Host to device: 7 chunks and a short one, at an odd device offset.
    let len = 7 * CHUNK + 4093;
    let bytes = pattern(len, 3);
    session.send(&req::MemcpyHtoD { dst: ptr + 5 + len, stream: 0 }.into(), &pattern(CHUNK, 77));
    let seq = session.send(&req::MemcpyHtoDStriped { dst: ptr + 5, len, stream: 0, transfer: 11, chunk: CHUNK }.into(), &[]);
    send_chunks(&mut links, 11, &bytes);
    assert_eq!(htod_reply(&mut session, seq), Ok(false));
    assert!(read_back(&mut session, ptr + 5, len) == bytes, "striped host-to-device bytes");
    // Each chunk wrote its own bytes only, the last one nothing past the copy's end.
    assert!(read_back(&mut session, ptr + 5 + len, CHUNK) == pattern(CHUNK, 77), "bytes after the copy");

    // Device to host: the same bytes come back in chunks, then the reply.
    let seq = session.send(
        &req::MemcpyDtoHStriped { src: ptr + 5, len, stream: 0, transfer: 12, chunk: CHUNK, blocking: true, compress: false }.into(),
        &[],
    );
    let back = receive_chunks(&mut links, 12, len);
    let mut message = Vec::new();
    let header = read_message(&mut session.stream, &FrameLimits::default(), &mut message).expect("reply");
    assert_eq!(header.seq, seq);
    assert!(decode_reply::<rep::MemcpyDtoHStriped>(&message).unwrap().result.is_ok());
    assert!(back == bytes, "striped device-to-host bytes");

    // A refused copy (outside the session's memory) still reads its chunks: the next copy is in
    // step.
    let stray = pattern(2 * CHUNK + 1, 9);
    let seq = session
        .send(&req::MemcpyHtoDStriped { dst: 0xdead_0000, len: stray.len() as u64, stream: 0, transfer: 13, chunk: CHUNK }.into(), &[]);
    send_chunks(&mut links, 13, &stray);
    assert_eq!(htod_reply(&mut session, seq), Err(CudaError::INVALID_VALUE));
    let next = pattern(CHUNK + 17, 21);
    let seq = session.send(&req::MemcpyHtoDStriped { dst: ptr, len: next.len() as u64, stream: 0, transfer: 14, chunk: CHUNK }.into(), &[]);
    send_chunks(&mut links, 14, &next);
    assert_eq!(htod_reply(&mut session, seq), Ok(false));
    assert!(read_back(&mut session, ptr, next.len() as u64) == next, "the copy after a refused one");

    // A chunk the session did not expect (another copy's) fails the copy and ends striping; the
    // session itself goes on, and other sessions never noticed.
    let seq = session.send(&req::MemcpyHtoDStriped { dst: ptr, len: CHUNK, stream: 0, transfer: 15, chunk: CHUNK }.into(), &[]);
    links[0].write_all(&ChunkHeader::raw(99, 0, CHUNK).encode()).unwrap();
    // The server may close the connection at the header, before the payload is all written.
    let _ = links[0].write_all(&vec![0xEE; CHUNK as usize]);
    assert_eq!(htod_reply(&mut session, seq), Err(CudaError::DEVICES_UNAVAILABLE));
    assert!(read_back(&mut session, ptr, next.len() as u64) == next, "the stray chunk wrote nothing");
    let mut probe = [0u8; 1];
    assert!(matches!(links[1].read(&mut probe), Ok(0) | Err(_)), "the data connections were closed");
    session.round_trip(0x5A);
    assert_eq!(
        session
            .call(req::MemcpyDtoHStriped { src: ptr, len: CHUNK, stream: 0, transfer: 16, chunk: CHUNK, blocking: true, compress: false })
            .0
            .err(),
        Some(CudaError::NOT_SUPPORTED),
        "no data connections are left"
    );
    let mut other = RawSession::open(&socket, None).expect("another session");
    other.round_trip(0x11);
}

#[test]
fn a_data_connection_that_breaks_mid_copy_fails_the_copy_not_the_session() {
    let (_server, socket) = emulated_server("stripes-broken", &[]);
    let mut session = RawSession::open(&socket, None).expect("session");
    let (id, secret) = (session.info.session_id, session.info.stripe_secret.expect("secret"));
    let mut links: Vec<UnixStream> = (0..2).map(|index| join(&socket, id, secret, index).0).collect();
    let ptr = session.call(req::Malloc { size: 1 << 20 }).0.expect("malloc").ptr;
    let bytes = pattern(4 * CHUNK, 1);
    let seq = session.send(&req::MemcpyHtoDStriped { dst: ptr, len: bytes.len() as u64, stream: 0, transfer: 1, chunk: CHUNK }.into(), &[]);
    // Chunk 0 arrives; data connection 1 goes away before its first chunk.
    let (offset, len) = chunks(bytes.len() as u64, CHUNK, links.len())[0];
    links[0].write_all(&ChunkHeader::raw(1, offset, len).encode()).unwrap();
    links[0].write_all(&bytes[offset as usize..(offset + len) as usize]).unwrap();
    drop(links.remove(1));
    assert_eq!(htod_reply(&mut session, seq), Err(CudaError::DEVICES_UNAVAILABLE));
    session.round_trip(0x33);
    // A hostile chunk length (past what the copy expects) is refused the same way.
    let (id, secret) = (session.info.session_id, session.info.stripe_secret.unwrap());
    let mut fresh: Vec<UnixStream> = (0..1).map(|index| join(&socket, id, secret, index).0).collect();
    let seq = session.send(&req::MemcpyHtoDStriped { dst: ptr, len: CHUNK, stream: 0, transfer: 2, chunk: CHUNK }.into(), &[]);
    fresh[0].write_all(&ChunkHeader::raw(2, 0, u64::MAX).encode()).unwrap();
    assert_eq!(htod_reply(&mut session, seq), Err(CudaError::DEVICES_UNAVAILABLE));
    session.round_trip(0x44);
    // A chunk sent twice (on two links) fails the copy, and so do shares that end with chunks
    // never sent.
    for (transfer, twice) in [(3, true), (4, false)] {
        let mut links: Vec<UnixStream> = (0..2).map(|index| join(&socket, id, secret, index).0).collect();
        let seq = session.send(&req::MemcpyHtoDStriped { dst: ptr, len: 2 * CHUNK, stream: 0, transfer, chunk: CHUNK }.into(), &[]);
        let (offset, len) = chunks(2 * CHUNK, CHUNK, links.len())[0];
        let sends = if twice { 2 } else { 0 };
        for link in &mut links[..sends] {
            link.write_all(&ChunkHeader::raw(transfer, offset, len).encode()).unwrap();
            let _ = link.write_all(&bytes[offset as usize..(offset + len) as usize]);
        }
        if !twice {
            end_shares(&mut links, transfer);
        }
        assert_eq!(htod_reply(&mut session, seq), Err(CudaError::DEVICES_UNAVAILABLE), "copy {transfer}");
        session.round_trip(0x55);
    }
}

/// A striped copy's chunks as LZ4 blocks: compressed host-to-device chunks land as their bytes,
/// device-to-host chunks come compressed when asked and LZ4 shrinks them (raw when it does not:
/// random bytes), bf16-like bytes go in planes both ways, the server counts the bytes saved, and a block that does not decompress to its
/// chunk's length fails the copy without harming the session.
#[test]
fn compressed_chunks_travel_both_ways_and_a_bad_block_fails_only_its_copy() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let (server, socket) = emulated_server("stripes-lz4", &["--metrics-listen", &port]);
    assert!(server.wait_for_log("metrics on http://", Duration::from_secs(10)), "{}", server.log_text());
    let mut session = RawSession::open(&socket, None).expect("session");
    let (id, secret) = (session.info.session_id, session.info.stripe_secret.expect("secret"));
    let mut links: Vec<UnixStream> = (0..2).map(|index| join(&socket, id, secret, index).0).collect();
    let ptr = session.call(req::Malloc { size: 1 << 20 }).0.expect("malloc").ptr;

    // Weights-like bytes (slowly changing 16-bit values) compress; the last chunk is short.
    let weights: Vec<u8> = (0..(3 * CHUNK as u32 + 1000) / 2).flat_map(|i| ((i / 5) as u16 ^ 0x3c00).to_le_bytes()).collect();
    let len = weights.len() as u64;
    let mut saved = 0;
    let seq = session.send(&req::MemcpyHtoDStriped { dst: ptr, len, stream: 0, transfer: 1, chunk: CHUNK }.into(), &[]);
    for (number, (offset, piece)) in chunks(len, CHUNK, 2).into_iter().enumerate() {
        let block = lz4_flex::block::compress(&weights[offset as usize..(offset + piece) as usize]);
        assert!((block.len() as u64) < piece);
        saved += piece - block.len() as u64;
        let link = &mut links[number % 2];
        link.write_all(&ChunkHeader { transfer: 1, offset, len: piece, wire_len: block.len() as u64, flags: 0 }.encode()).unwrap();
        link.write_all(&block).unwrap();
    }
    end_shares(&mut links, 1);
    assert_eq!(htod_reply(&mut session, seq), Ok(false));
    assert!(read_back(&mut session, ptr, len) == weights, "compressed chunks landed as their bytes");

    // Back with compression asked: every chunk of these bytes comes as a block.
    let mut back = vec![0u8; len as usize];
    let seq = session
        .send(&req::MemcpyDtoHStriped { src: ptr, len, stream: 0, transfer: 2, chunk: CHUNK, blocking: true, compress: true }.into(), &[]);
    for (header, block) in receive_any(&mut links, 2, len) {
        assert!(header.compressed(), "the chunk at {} of weights came raw", header.offset);
        saved += header.len - header.wire_len;
        let target = &mut back[header.offset as usize..(header.offset + header.len) as usize];
        flyt_protocol::stripes::Decompressor::default().decompress(&header, &block, target).unwrap();
    }
    let mut message = Vec::new();
    assert_eq!(read_message(&mut session.stream, &FrameLimits::default(), &mut message).unwrap().seq, seq);
    assert!(back == weights, "compressed device-to-host chunks");

    // Random bytes do not shrink: they come raw even when compression is asked.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let random: Vec<u8> = (0..2 * CHUNK)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    session.send(&req::MemcpyHtoD { dst: ptr, stream: 0 }.into(), &random);
    let seq = session.send(
        &req::MemcpyDtoHStriped { src: ptr, len: 2 * CHUNK, stream: 0, transfer: 3, chunk: CHUNK, blocking: true, compress: true }.into(),
        &[],
    );
    assert!(receive_chunks(&mut links, 3, 2 * CHUNK) == random, "random bytes came raw and intact");
    assert_eq!(read_message(&mut session.stream, &FrameLimits::default(), &mut message).unwrap().seq, seq);

    // bf16-like values (noisy low bytes, repeating high bytes): they go as float planes.
    let mut state = 0x0123_4567_89AB_CDEFu64;
    // The last chunk short and odd (chunks at the ends of a copy are a quarter of CHUNK).
    let bf16: Vec<u8> = (0..CHUNK + CHUNK / 4 + 12001)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            if i % 2 == 0 { state as u8 } else { 0x3c + (state as u8 & 3) }
        })
        .collect();
    let mut compressor = flyt_protocol::stripes::Compressor::default();
    let bf16_len = bf16.len() as u64;
    let seq = session.send(&req::MemcpyHtoDStriped { dst: ptr, len: bf16_len, stream: 0, transfer: 5, chunk: CHUNK }.into(), &[]);
    for (number, (offset, piece)) in chunks(bf16_len, CHUNK, 2).into_iter().enumerate() {
        let (block, flags) = compressor.compress(&bf16[offset as usize..(offset + piece) as usize]).expect("bf16-like bytes shrink");
        assert_eq!(flags, flyt_protocol::stripes::FLOAT_PLANES);
        saved += piece - block.len() as u64;
        links[number % 2]
            .write_all(&ChunkHeader { transfer: 5, offset, len: piece, wire_len: block.len() as u64, flags }.encode())
            .unwrap();
        links[number % 2].write_all(block).unwrap();
    }
    end_shares(&mut links, 5);
    assert_eq!(htod_reply(&mut session, seq), Ok(false));
    assert!(read_back(&mut session, ptr, bf16_len) == bf16, "float-planes chunks landed as their bytes");
    let seq = session.send(
        &req::MemcpyDtoHStriped { src: ptr, len: bf16_len, stream: 0, transfer: 6, chunk: CHUNK, blocking: true, compress: true }.into(),
        &[],
    );
    let mut back = vec![0u8; bf16.len()];
    for (header, block) in receive_any(&mut links, 6, bf16_len) {
        assert_eq!(header.flags, flyt_protocol::stripes::FLOAT_PLANES);
        saved += header.len - header.wire_len;
        flyt_protocol::stripes::Decompressor::default()
            .decompress(&header, &block, &mut back[header.offset as usize..(header.offset + header.len) as usize])
            .unwrap();
    }
    assert_eq!(read_message(&mut session.stream, &FrameLimits::default(), &mut message).unwrap().seq, seq);
    assert!(back == bf16, "float-planes device-to-host chunks");

    let text = flyt_test_support::scrape_metrics(&port);
    let line = text.lines().find(|line| line.starts_with("flyt_rpc_stripe_compression_saved_bytes_total")).unwrap_or_default();
    let counted: f64 = line.rsplit(' ').next().and_then(|value| value.parse().ok()).unwrap_or(-1.0);
    assert_eq!(counted, saved as f64, "{text}");

    // A block that decompresses to fewer bytes than its chunk: the copy fails, the session goes on.
    // (A copy of one page is one chunk, over any number of links.)
    let piece = 4096;
    assert_eq!(chunks(piece, CHUNK, links.len()), [(0, piece)]);
    let short = lz4_flex::block::compress(&weights[..piece as usize - 1]);
    let seq = session.send(&req::MemcpyHtoDStriped { dst: ptr, len: piece, stream: 0, transfer: 4, chunk: CHUNK }.into(), &[]);
    links[0].write_all(&ChunkHeader { transfer: 4, offset: 0, len: piece, wire_len: short.len() as u64, flags: 0 }.encode()).unwrap();
    links[0].write_all(&short).unwrap();
    assert_eq!(htod_reply(&mut session, seq), Err(CudaError::DEVICES_UNAVAILABLE));
    session.round_trip(0x66);
}
