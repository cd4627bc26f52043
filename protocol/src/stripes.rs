//! Striped bulk copies: a session over a socket may open extra data connections to its server
//! (same transport, same token and TLS as the main one), each proving it belongs to the session
//! with the secret the server gave in the handshake (`SessionInfo::stripe_secret`). A large copy's
//! request stays on the main connection; its bytes travel in chunks, round-robin over the data
//! connections, each chunk behind a [`ChunkHeader`] that names its copy and place, raw or as one
//! LZ4 block (`wire_len < len`: over a slow link, where compressing costs less than sending).

use serde::{Deserialize, Serialize};

/// Bytes in a session's stripe secret.
pub const SECRET_LEN: usize = 32;

/// A data connection's claim, sent in its `Hello` (`Hello::stripe`) instead of opening a session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StripeJoin {
    pub session_id: u64,
    pub secret: [u8; SECRET_LEN],
    /// Which data connection of the session this is (0-based): chunk `i` of a copy travels on
    /// connection `i % count`.
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
pub const CHUNK_HEADER_LEN: usize = 40;
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
}

impl ChunkHeader {
    /// A chunk sent raw.
    pub fn raw(transfer: u64, offset: u64, len: u64) -> Self {
        Self { transfer, offset, len, wire_len: len }
    }

    /// Whether the bytes that follow are an LZ4 block.
    pub fn compressed(&self) -> bool {
        self.wire_len < self.len
    }

    pub fn encode(&self) -> [u8; CHUNK_HEADER_LEN] {
        let mut bytes = [0u8; CHUNK_HEADER_LEN];
        for (index, word) in [CHUNK_MAGIC, self.transfer, self.offset, self.len, self.wire_len].into_iter().enumerate() {
            bytes[index * 8..index * 8 + 8].copy_from_slice(&word.to_le_bytes());
        }
        bytes
    }

    /// `None` when the bytes are no chunk header (or one whose bytes would outgrow the chunk).
    pub fn decode(bytes: &[u8; CHUNK_HEADER_LEN]) -> Option<Self> {
        let word = |index: usize| u64::from_le_bytes(bytes[index * 8..index * 8 + 8].try_into().unwrap_or([0; 8]));
        (word(0) == CHUNK_MAGIC && word(4) <= word(3)).then(|| Self { transfer: word(1), offset: word(2), len: word(3), wire_len: word(4) })
    }
}

/// The chunks of a copy of `len` bytes cut at `chunk`: (offset, length) in order; chunk `i` goes
/// on data connection `i % connections`.
pub fn chunks(len: u64, chunk: u64) -> impl Iterator<Item = (u64, u64)> {
    let chunk = chunk.max(1);
    (0..len.div_ceil(chunk)).map(move |index| (index * chunk, chunk.min(len - index * chunk)))
}

/// Compares two secrets in time independent of where they differ.
pub fn secrets_equal(a: &[u8; SECRET_LEN], b: &[u8; SECRET_LEN]) -> bool {
    a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_round_trips_and_a_stray_one_is_refused() {
        let header = ChunkHeader { transfer: 7, offset: 4 << 20, len: 12345, wire_len: 999 };
        assert_eq!(ChunkHeader::decode(&header.encode()), Some(header));
        assert!(header.compressed() && !ChunkHeader::raw(7, 0, 5).compressed());
        let mut bytes = header.encode();
        bytes[0] ^= 1;
        assert_eq!(ChunkHeader::decode(&bytes), None);
        // More bytes on the wire than the chunk holds: no header of ours.
        assert_eq!(ChunkHeader::decode(&ChunkHeader { wire_len: 12346, ..header }.encode()), None);
    }

    #[test]
    fn chunks_cover_odd_sizes_exactly() {
        let pieces: Vec<_> = chunks(10, 4).collect();
        assert_eq!(pieces, [(0, 4), (4, 4), (8, 2)]);
        assert_eq!(chunks(0, 4).count(), 0);
        assert_eq!(chunks((3 << 20) + 1, 1 << 20).map(|(_, len)| len).sum::<u64>(), (3 << 20) + 1);
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
}
