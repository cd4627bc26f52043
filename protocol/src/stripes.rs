//! Striped bulk copies: a session over a socket may open extra data connections to its server
//! (same transport, same token and TLS as the main one), each proving it belongs to the session
//! with the secret the server gave in the handshake (`SessionInfo::stripe_secret`). A large copy's
//! request stays on the main connection; its bytes travel in chunks over the data connections,
//! each chunk behind a [`ChunkHeader`] that names its copy and place, raw or compressed
//! (`wire_len < len`: over a slow link, where compressing costs less than sending): one LZ4
//! block, or 16-bit floats coded in planes ([`FLOAT_PLANES`]).
//!
//! The sender deals a copy's chunks (the plan [`chunks`]) to whichever connection is free, not in
//! a fixed turn: connections of one link do not run at one speed (over loopback TCP, 8 of them
//! read 40 to 54 ms of a 1 GiB copy on an H200 host, 2026-11-29), and a fixed turn makes the copy
//! wait for the slowest. So each side takes a chunk's place from its header, and host to device,
//! where the server cannot know which connection brings which chunk, every data connection ends
//! its share of each copy with an [`ChunkHeader::end`] header, even when it carried no chunk.

use serde::{Deserialize, Serialize};

/// Bytes in a session's stripe secret.
pub const SECRET_LEN: usize = 32;

/// Most data connections a session may open (the server refuses more).
pub const MAX_LINKS: usize = 16;

/// A data connection's claim, sent in its `Hello` (`Hello::stripe`) instead of opening a session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StripeJoin {
    pub session_id: u64,
    pub secret: [u8; SECRET_LEN],
    /// Which data connection of the session this is (0-based).
    pub index: u32,
}

/// The answer to a data connection's hello. `Refused` has the shape of `HelloReply::Refused`, so a
/// refusal by the listener (before the worker saw the claim) decodes the same.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StripeReply {
    Joined,
    Refused { error: u32, reason: String },
}

/// Bytes in a [`ChunkHeader`].
pub const CHUNK_HEADER_LEN: usize = 48;
/// [`ChunkHeader::flags`]: before LZ4, the chunk's bytes were split in two planes, every 2-byte
/// value's first byte then every second one (an odd last byte last), as bf16 and fp16 tensors
/// compress far better so: their high bytes repeat, their low bytes are noise.
pub const SHUFFLED: u64 = 1;
/// [`ChunkHeader::flags`]: the chunk is 16-bit floats coded by `crate::float_planes` (their
/// sign and exponent bits Huffman-coded, the rest as they are), not an LZ4 block.
pub const FLOAT_PLANES: u64 = 2;
/// [`ChunkHeader::flags`]: no chunk but the end of this connection's share of a host-to-device
/// copy (`len` and `wire_len` 0).
pub const END_OF_SHARE: u64 = 4;
/// Opens every chunk header, so a data stream out of step is caught at once.
const CHUNK_MAGIC: u64 = u64::from_le_bytes(*b"FLYTCHNK");

/// What precedes each chunk's bytes on a data connection (both directions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    /// The copy's id, chosen by the client and carried by the copy's request.
    pub transfer: u64,
    /// Where the chunk starts in the copy.
    pub offset: u64,
    /// The chunk's bytes in the copy.
    pub len: u64,
    /// Bytes that follow the header: `len` when raw, fewer when they are one LZ4 block that
    /// decompresses to exactly `len` bytes; never more.
    pub wire_len: u64,
    /// How a compressed chunk's bytes were arranged before LZ4 ([`SHUFFLED`]); 0 when raw.
    pub flags: u64,
}

impl ChunkHeader {
    /// A chunk sent raw.
    pub fn raw(transfer: u64, offset: u64, len: u64) -> Self {
        Self { transfer, offset, len, wire_len: len, flags: 0 }
    }

    /// The end of a connection's share of copy `transfer` (host to device).
    pub fn end(transfer: u64) -> Self {
        Self { transfer, offset: 0, len: 0, wire_len: 0, flags: END_OF_SHARE }
    }

    /// Whether this is no chunk but [`ChunkHeader::end`].
    pub fn ends_share(&self) -> bool {
        self.flags == END_OF_SHARE
    }

    /// Whether the bytes that follow are an LZ4 block.
    pub fn compressed(&self) -> bool {
        self.wire_len < self.len
    }

    pub fn encode(&self) -> [u8; CHUNK_HEADER_LEN] {
        let mut bytes = [0u8; CHUNK_HEADER_LEN];
        for (index, word) in [CHUNK_MAGIC, self.transfer, self.offset, self.len, self.wire_len, self.flags].into_iter().enumerate() {
            bytes[index * 8..index * 8 + 8].copy_from_slice(&word.to_le_bytes());
        }
        bytes
    }

    /// `None` when the bytes are no chunk header (or one whose bytes would outgrow the chunk, or
    /// with flags this side does not know or on a raw chunk, or an empty chunk, or an end that
    /// carries bytes).
    pub fn decode(bytes: &[u8; CHUNK_HEADER_LEN]) -> Option<Self> {
        let word = |index: usize| u64::from_le_bytes(bytes[index * 8..index * 8 + 8].try_into().unwrap_or([0; 8]));
        let header = Self { transfer: word(1), offset: word(2), len: word(3), wire_len: word(4), flags: word(5) };
        let fits = match header.flags {
            END_OF_SHARE => header == Self::end(header.transfer),
            0 => header.len > 0,
            SHUFFLED | FLOAT_PLANES => header.compressed(),
            _ => false,
        };
        (word(0) == CHUNK_MAGIC && header.wire_len <= header.len && fits).then_some(header)
    }
}

/// Compresses chunks: as 16-bit floats in planes ([`FLOAT_PLANES`]) when that saves a fifth or
/// more (model weights), else as LZ4 blocks, plain or after splitting their bytes in planes
/// ([`SHUFFLED`]), whichever saves at least a sixteenth (LZ4 is tried too when most values repeat,
/// where it does better). One per thread: it keeps its buffers and which LZ4 arrangement worked
/// last, tried first next time.
#[derive(Default)]
pub struct Compressor {
    planes: Vec<u8>,
    block: Vec<u8>,
    prefer_shuffled: bool,
    floats: crate::float_planes::Encoder,
    coded: Vec<u8>,
}

/// Splits `bytes` in two planes into `planes` (see [`SHUFFLED`]).
fn shuffle(bytes: &[u8], planes: &mut Vec<u8>) {
    planes.clear();
    planes.extend(bytes.iter().step_by(2));
    planes.extend(bytes.iter().skip(1).step_by(2));
}

/// Undoes [`shuffle`]: `planes` back into `target` (the same length).
fn unshuffle(planes: &[u8], target: &mut [u8]) {
    let firsts = target.len().div_ceil(2);
    let (first, second) = planes.split_at(firsts);
    for (index, byte) in first.iter().enumerate() {
        target[index * 2] = *byte;
    }
    for (index, byte) in second.iter().enumerate() {
        target[index * 2 + 1] = *byte;
    }
}

/// One LZ4 block of `input` into `block`; its length when it saves at least a sixteenth.
fn lz4_block(input: &[u8], block: &mut Vec<u8>) -> Option<usize> {
    block.resize(lz4_flex::block::get_maximum_output_size(input.len()), 0);
    let compressed = lz4_flex::block::compress_into(input, block).ok()?;
    (compressed < input.len() - input.len() / 16).then_some(compressed)
}

impl Compressor {
    /// The compressed chunk (the block and the header's flags), or `None`: send it raw.
    pub fn compress(&mut self, bytes: &[u8]) -> Option<(&[u8], u64)> {
        let floats = self.floats.estimate(bytes).filter(|estimate| estimate.bytes <= bytes.len() - bytes.len() / 5);
        if let Some(estimate) = floats {
            let lz4_may_beat_it = estimate.top_share > 0.5;
            if !lz4_may_beat_it || self.lz4(bytes).is_none_or(|(_, len)| len >= estimate.bytes) {
                self.floats.encode(bytes, &mut self.coded);
                return Some((&self.coded, FLOAT_PLANES));
            }
        }
        let (flags, len) = self.lz4(bytes)?;
        Some((&self.block[..len], flags))
    }

    /// As [`Self::compress`], the block handed over in `out` (a buffer the caller owns, for a
    /// thread of its own to write while this one compresses the next; its old buffer is kept
    /// here for reuse, nothing is copied); its flags.
    pub fn compress_into(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Option<u64> {
        let (len, flags) = self.compress(bytes).map(|(block, flags)| (block.len(), flags))?;
        std::mem::swap(if flags == FLOAT_PLANES { &mut self.coded } else { &mut self.block }, out);
        out.truncate(len);
        Some(flags)
    }

    /// The chunk as an LZ4 block in `block`: its flags and length, when it saves a sixteenth.
    fn lz4(&mut self, bytes: &[u8]) -> Option<(u64, usize)> {
        let order = if self.prefer_shuffled { [true, false] } else { [false, true] };
        for shuffled in order {
            let Self { planes, block, .. } = self;
            let found = if shuffled {
                shuffle(bytes, planes);
                lz4_block(planes, block)
            } else {
                lz4_block(bytes, block)
            };
            if let Some(len) = found {
                self.prefer_shuffled = shuffled;
                return Some((if shuffled { SHUFFLED } else { 0 }, len));
            }
        }
        None
    }
}

/// Decompresses chunks, keeping its buffers between them (one per receiving thread).
#[derive(Default)]
pub struct Decompressor {
    planes: Vec<u8>,
    floats: crate::float_planes::Decoder,
}

impl Decompressor {
    /// Decompresses a compressed chunk's `block` into `target` (its `len` bytes), undoing the
    /// arrangement its header names; the block must give exactly `len` bytes.
    pub fn decompress(&mut self, header: &ChunkHeader, block: &[u8], target: &mut [u8]) -> Result<(), String> {
        if header.flags == FLOAT_PLANES {
            return self.floats.decode(block, target);
        }
        decompress_lz4(header, block, target, &mut self.planes)
    }
}

/// An LZ4 block into `target`, through `planes` when its bytes were split in planes.
fn decompress_lz4(header: &ChunkHeader, block: &[u8], target: &mut [u8], planes: &mut Vec<u8>) -> Result<(), String> {
    let into = if header.flags & SHUFFLED != 0 {
        planes.resize(target.len(), 0);
        &mut planes[..]
    } else {
        &mut *target
    };
    match lz4_flex::block::decompress_into(block, into) {
        Ok(written) if written == into.len() => {}
        Ok(written) => return Err(format!("a compressed chunk gave {written} bytes, not {}", into.len())),
        Err(error) => return Err(format!("a compressed chunk does not decompress: {error}")),
    }
    if header.flags & SHUFFLED != 0 {
        unshuffle(planes, target);
    }
    Ok(())
}

/// Chunks at each end of a copy per size step (one per data connection, up to 8).
const RAMP_WIDTH: u64 = 8;

/// Compressed chunks a data connection's thread reads or codes ahead of its second thread
/// (which decodes or writes them), on either side.
pub const BLOCKS_AHEAD: usize = 2;

/// The blocks a data connection's two threads pass between them: the way back for blocks the
/// second thread is done with, and where the first takes them (`BLOCKS_AHEAD` there to start).
pub fn block_pool() -> (std::sync::mpsc::Sender<Vec<u8>>, std::sync::mpsc::Receiver<Vec<u8>>) {
    let (return_block, spare_blocks) = std::sync::mpsc::channel();
    for _ in 0..BLOCKS_AHEAD {
        let _ = return_block.send(Vec::new());
    }
    (return_block, spare_blocks)
}

/// Chunks start at multiples of this (but for a copy's unaligned last bytes) when the chunk size
/// is one: a chunk cut mid-value would code 16-bit floats out of step, and whole pages copy fastest.
const CHUNK_ALIGN: u64 = 4096;

/// The chunks of a copy of `len` bytes cut at `chunk` over `lanes` data connections: (offset,
/// length) in order, each dealt to the first connection free. They come in rounds of one chunk
/// per connection, the chunks of a round the same length (to `CHUNK_ALIGN`), so connections of
/// one speed finish together. The copy's ends ramp: its first 8 chunks (at
/// least one round) are a quarter of `chunk` and the next 8 a half, and its last 16 the same
/// mirrored (a copy shorter than both ramps goes in quarters): the first chunk is coded, and the
/// last decoded, while the link waits for them, so they are kept short.
pub fn chunks(len: u64, chunk: u64, lanes: usize) -> Vec<(u64, u64)> {
    let chunk = chunk.max(1);
    let lanes = u64::try_from(lanes.max(1)).unwrap_or(1);
    let (quarter, half) = ((chunk / 4).max(1), (chunk / 2).max(1));
    let ramp_rounds = RAMP_WIDTH.div_ceil(lanes);
    let (quarters, halves) = (ramp_rounds * lanes * quarter, ramp_rounds * lanes * half);
    let edge = quarters + halves;
    let short = len <= 2 * edge;
    // Where the last ramp begins: aligned, its last quarters taking the copy's odd end.
    let tail = len.saturating_sub(edge) / CHUNK_ALIGN * CHUNK_ALIGN;
    // The bytes of the round that starts at `offset`: one chunk per lane of the size of that
    // stretch of the copy; the middle's last round only what is left before the last ramp.
    let round_at = |offset: u64| {
        let (size, end) = if short || offset < quarters || offset >= tail + halves {
            (quarter, len)
        } else if offset < edge {
            (half, len)
        } else if offset < tail {
            (chunk, tail)
        } else {
            (half, tail + halves)
        };
        (lanes * size).min(end - offset)
    };
    let unit = if quarter % CHUNK_ALIGN == 0 { CHUNK_ALIGN } else { 1 };
    let mut pieces = Vec::new();
    let mut offset = 0;
    while offset < len {
        let round = round_at(offset);
        // Whole units dealt evenly (the first lanes one more), the odd bytes on the last chunk.
        let (units, odd) = (round / unit, round % unit);
        let (each, more) = (units / lanes, units % lanes);
        let end = offset + round;
        for lane in 0..lanes {
            let piece = (each + u64::from(lane < more)) * unit;
            if piece > 0 {
                pieces.push((offset, piece));
                offset += piece;
            }
        }
        if odd > 0 {
            match pieces.last_mut() {
                Some(last) if last.0 + last.1 == offset && units > 0 => last.1 += odd,
                _ => pieces.push((offset, odd)),
            }
            offset += odd;
        }
        debug_assert_eq!(offset, end);
    }
    pieces
}

/// Compares two secrets in time independent of where they differ.
pub fn secrets_equal(a: &[u8; SECRET_LEN], b: &[u8; SECRET_LEN]) -> bool {
    a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_copy_once_with_short_ones_at_both_ends() {
        for (len, chunk) in
            [(1u64 << 30, 4u64 << 20), (1 << 30, 2 << 20), (25 << 20, 4 << 20), (7 * 65536 + 4093, 65536), (1, 65536), (3, 1)]
        {
            for lanes in [1, 2, 3, 4, 8, 16] {
                let pieces = chunks(len, chunk, lanes);
                let mut next = 0;
                for &(offset, piece) in &pieces {
                    assert!(offset == next && piece > 0 && piece <= chunk, "{len} {chunk} {lanes}: {pieces:?}");
                    // Whole pages but for the copy's odd end, where the chunk is whole pages.
                    assert!(chunk % (4 * CHUNK_ALIGN) != 0 || offset % CHUNK_ALIGN == 0, "{len} {chunk} {lanes}: {pieces:?}");
                    next += piece;
                }
                assert_eq!(next, len, "{len} {chunk} {lanes}");
            }
        }
        for lanes in [1, 4, 8] {
            let pieces: Vec<u64> = chunks(1 << 30, 4 << 20, lanes).into_iter().map(|(_, piece)| piece).collect();
            assert_eq!(&pieces[..8], &[1 << 20; 8]);
            assert_eq!(&pieces[8..16], &[2 << 20; 8]);
            assert_eq!(pieces[16], 4 << 20);
            assert_eq!(&pieces[pieces.len() - 8..], &[1 << 20; 8]);
            assert_eq!(&pieces[pieces.len() - 16..pieces.len() - 8], &[2 << 20; 8]);
        }
        // Fewer lanes than the ramp's 8 chunks still ramp; more ramp one round each.
        let pieces: Vec<u64> = chunks(1 << 30, 4 << 20, 16).into_iter().map(|(_, piece)| piece).collect();
        assert_eq!(&pieces[..16], &[1 << 20; 16]);
        assert_eq!(&pieces[16..32], &[2 << 20; 16]);
    }

    #[test]
    fn every_connection_carries_the_same_share_of_a_copy() {
        for (len, chunk) in
            [(64u64 << 20, 4u64 << 20), (1 << 30, 4 << 20), (100 << 20, 4 << 20), ((64 << 20) + 12345, 4 << 20), (5 << 20, 4 << 20)]
        {
            for lanes in [2usize, 3, 4, 5, 8] {
                let mut carried = vec![0u64; lanes];
                for (number, (_, piece)) in chunks(len, chunk, lanes).into_iter().enumerate() {
                    carried[number % lanes] += piece;
                }
                let (most, least) = (*carried.iter().max().unwrap(), *carried.iter().min().unwrap());
                // Only the rounding of the rounds that are not whole (to whole pages) parts them.
                assert!(most - least <= 2 * CHUNK_ALIGN, "{len} {chunk} {lanes}: {carried:?}");
            }
        }
    }

    #[test]
    fn a_header_round_trips_and_a_stray_one_is_refused() {
        let header = ChunkHeader { transfer: 7, offset: 4 << 20, len: 12345, wire_len: 999, flags: SHUFFLED };
        assert_eq!(ChunkHeader::decode(&header.encode()), Some(header));
        assert!(header.compressed() && !ChunkHeader::raw(7, 0, 5).compressed());
        let mut bytes = header.encode();
        bytes[0] ^= 1;
        assert_eq!(ChunkHeader::decode(&bytes), None);
        // More bytes on the wire than the chunk holds: no header of ours.
        assert_eq!(ChunkHeader::decode(&ChunkHeader { wire_len: 12346, ..header }.encode()), None);
        // Unknown flags, and a raw chunk that claims an arrangement.
        assert_eq!(ChunkHeader::decode(&ChunkHeader { flags: 8, ..header }.encode()), None);
        assert_eq!(ChunkHeader::decode(&ChunkHeader { flags: SHUFFLED | FLOAT_PLANES, ..header }.encode()), None);
        assert_eq!(
            ChunkHeader::decode(&ChunkHeader { flags: FLOAT_PLANES, ..header }.encode()),
            Some(ChunkHeader { flags: FLOAT_PLANES, ..header })
        );
        assert_eq!(ChunkHeader::decode(&ChunkHeader { flags: SHUFFLED, ..ChunkHeader::raw(1, 0, 9) }.encode()), None);
        // An end of share round-trips; with bytes, or a chunk of none, it is no header.
        let end = ChunkHeader::end(7);
        assert!(ChunkHeader::decode(&end.encode()).is_some_and(|end| end.ends_share() && end.transfer == 7));
        assert!(!header.ends_share() && !ChunkHeader::raw(7, 0, 5).ends_share());
        assert_eq!(ChunkHeader::decode(&ChunkHeader { len: 5, wire_len: 5, ..end }.encode()), None);
        assert_eq!(ChunkHeader::decode(&ChunkHeader { offset: 4096, ..end }.encode()), None);
        assert_eq!(ChunkHeader::decode(&ChunkHeader::raw(7, 0, 0).encode()), None);
    }

    fn random_bytes(len: usize, mut state: u64) -> Vec<u8> {
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 32) as u8
            })
            .collect()
    }

    /// Compresses `bytes` with a fresh compressor, checks they come back, and gives the flags and
    /// the ratio.
    fn compressed(bytes: &[u8]) -> Option<(u64, f64)> {
        let mut compressor = Compressor::default();
        let (block, flags) = compressor.compress(bytes).map(|(block, flags)| (block.to_vec(), flags))?;
        let header = ChunkHeader { transfer: 1, offset: 0, len: bytes.len() as u64, wire_len: block.len() as u64, flags };
        let mut back = vec![0u8; bytes.len()];
        Decompressor::default().decompress(&header, &block, &mut back).unwrap();
        assert!(back == bytes);
        Some((flags, bytes.len() as f64 / block.len() as f64))
    }

    #[test]
    fn each_kind_of_chunk_gets_the_codec_that_suits_it() {
        // bf16 weights: floats in planes, 1.5x or better.
        let weights = crate::float_planes::tests::bf16_weights(1 << 20, 0.02, 3);
        let (flags, ratio) = compressed(&weights).unwrap();
        assert!(flags == FLOAT_PLANES && ratio > 1.5, "{flags} {ratio:.3}");
        // Zeros: LZ4 (floats in planes would give 2.7x).
        let (flags, ratio) = compressed(&vec![0u8; 1 << 20]).unwrap();
        assert!(flags == 0 && ratio > 100.0, "{flags} {ratio:.3}");
        // Random bytes: raw.
        assert!(compressed(&random_bytes(1 << 20, 9)).is_none());
    }

    #[test]
    fn bf16_like_bytes_compress_in_planes_and_come_back_exactly() {
        // 2-byte values whose high bytes repeat and low bytes are noise, odd length: too short
        // for a code table, so LZ4 in planes.
        let noise = random_bytes(6000, 7);
        let values: Vec<u8> = noise.chunks(2).flat_map(|pair| [pair[0], 0x3c + u8::from(pair[1] & 0x1f == 0)]).chain([0x55]).collect();
        let mut compressor = Compressor::default();
        let (block, flags) = compressor.compress(&values).map(|(block, flags)| (block.to_vec(), flags)).expect("they shrink in planes");
        assert_eq!(flags, SHUFFLED);
        let header = ChunkHeader { transfer: 1, offset: 0, len: values.len() as u64, wire_len: block.len() as u64, flags };
        let (mut back, mut decompressor) = (vec![0u8; values.len()], Decompressor::default());
        decompressor.decompress(&header, &block, &mut back).unwrap();
        assert!(back == values);
        // Repetitive bytes compress plainly; random ones not at all.
        let plain: Vec<u8> = (0..1u32 << 20).map(|i| (i / 64) as u8).collect();
        let mut fresh = Compressor::default();
        assert_eq!(fresh.compress(&plain).map(|(_, flags)| flags), Some(0));
        assert!(fresh.compress(&random_bytes(1 << 20, 9)).is_none());
        // A block that gives fewer bytes than its chunk is refused.
        let short = ChunkHeader { len: values.len() as u64 + 1, ..header };
        assert!(decompressor.decompress(&short, &block, &mut vec![0u8; values.len() + 1]).is_err());
    }

    #[test]
    fn chunks_cover_odd_sizes_exactly() {
        // Shorter than its ramps: in quarters of the chunk.
        let pieces = chunks(10, 4, 1);
        assert_eq!(pieces, [(0, 1), (1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1), (7, 1), (8, 1), (9, 1)]);
        // A round shorter than its lanes: the lanes past its bytes get nothing.
        assert_eq!(chunks(3, 4, 4), [(0, 1), (1, 1), (2, 1)]);
        assert!(chunks(0, 4, 4).is_empty());
        assert_eq!(chunks((3 << 20) + 1, 1 << 20, 4).iter().map(|(_, len)| len).sum::<u64>(), (3 << 20) + 1);
    }

    #[test]
    fn a_refusal_decodes_as_the_listeners_hello_refusal() {
        let mut bytes = Vec::new();
        crate::frame::encode_into(&crate::handshake::HelloReply::Refused { error: 800, reason: "no".into() }, &mut bytes);
        let reply: StripeReply = crate::frame::decode_exact(&bytes).unwrap();
        assert_eq!(reply, StripeReply::Refused { error: 800, reason: "no".into() });
    }

    #[test]
    fn secrets_compare() {
        assert!(secrets_equal(&[3; SECRET_LEN], &[3; SECRET_LEN]));
        assert!(!secrets_equal(&[3; SECRET_LEN], &[4; SECRET_LEN]));
    }

    /// What choosing a chunk's codec costs per core on 4 MiB chunks: bf16 weights (coded in
    /// planes) and random bytes (sent raw after the estimate and both LZ4 tries fail). Run:
    /// `cargo test -p flyt-protocol --release --lib stripes::tests::choice_speed -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, run by hand in release"]
    fn choice_speed() {
        const CHUNK: usize = 4 << 20;
        for (name, bytes) in
            [("bf16 N(0,0.02)", crate::float_planes::tests::bf16_weights(16 << 20, 0.02, 9)), ("random", random_bytes(32 << 20, 9))]
        {
            let mut compressor = Compressor::default();
            let (mut wire, mut kinds) = (0usize, std::collections::BTreeMap::new());
            let started = std::time::Instant::now();
            for chunk in bytes.chunks(CHUNK) {
                let (len, flags) = compressor.compress(chunk).map_or((chunk.len(), u64::MAX), |(block, flags)| (block.len(), flags));
                wire += len;
                *kinds.entry(flags).or_insert(0) += 1;
            }
            let seconds = started.elapsed().as_secs_f64();
            println!(
                "{name}: {:.0} MB/s per core, {:.4}x, chunks by flags (u64::MAX = raw) {kinds:?}",
                bytes.len() as f64 / 1e6 / seconds,
                bytes.len() as f64 / wire as f64
            );
        }
    }
}
