//! The data-plane framing: a fixed 16-byte header, an encoded message, then raw bulk bytes.
//!
//! ```text
//! u32 message_len | u32 seq | u64 bulk_len | message (postcard) | bulk (raw bytes)
//! ```
//! All little-endian. Bulk bytes travel outside the codec so either side can read them straight
//! into their destination (an app buffer, a pinned staging buffer) and write them straight from
//! their source. Requests carry a client-chosen `seq`; replies echo it; `seq == 0` from the server
//! is a notice that answers no request.

use std::io::{self, IoSlice, Read, Write};

use serde::{Serialize, de::DeserializeOwned};

/// Bytes in a frame header.
pub const HEADER_LEN: usize = 16;

/// The header that starts every frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// Length of the encoded message that follows the header.
    pub message_len: u32,
    /// Request sequence number; replies echo the request's.
    pub seq: u32,
    /// Length of the raw bulk bytes that follow the message.
    pub bulk_len: u64,
}

/// What a reader accepts before it allocates anything: a hostile length closes the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameLimits {
    /// Largest encoded message.
    pub max_message: u32,
    /// Largest bulk payload.
    pub max_bulk: u64,
}

impl Default for FrameLimits {
    fn default() -> Self {
        // Messages hold control fields and launch arguments (at most 32 KiB in CUDA 13); bulk holds
        // copy chunks and whole fatbinaries, which reach hundreds of MiB in large frameworks.
        Self { max_message: 1 << 20, max_bulk: 4 << 30 }
    }
}

/// Why a frame could not be read or decoded.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum FrameError {
    /// the peer closed the connection
    Closed,
    /// the connection ended inside a frame
    Truncated,
    /// message of {0} bytes exceeds the limit of {1} bytes
    MessageTooLarge(u32, u32),
    /// bulk payload of {0} bytes exceeds the limit of {1} bytes
    BulkTooLarge(u64, u64),
    /// undecodable message: {0}
    Decode(String),
    /// i/o error: {0}
    Io(#[from] io::Error),
}

impl FrameHeader {
    /// Serializes the header.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut bytes = [0u8; HEADER_LEN];
        bytes[0..4].copy_from_slice(&self.message_len.to_le_bytes());
        bytes[4..8].copy_from_slice(&self.seq.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.bulk_len.to_le_bytes());
        bytes
    }

    /// Parses a header and checks it against `limits`.
    pub fn decode(bytes: &[u8; HEADER_LEN], limits: &FrameLimits) -> Result<Self, FrameError> {
        let word = |range: std::ops::Range<usize>| -> [u8; 4] { bytes[range].try_into().unwrap_or([0; 4]) };
        let message_len = u32::from_le_bytes(word(0..4));
        let seq = u32::from_le_bytes(word(4..8));
        let bulk_len = u64::from_le_bytes(bytes[8..16].try_into().unwrap_or([0; 8]));
        if message_len > limits.max_message {
            return Err(FrameError::MessageTooLarge(message_len, limits.max_message));
        }
        if bulk_len > limits.max_bulk {
            return Err(FrameError::BulkTooLarge(bulk_len, limits.max_bulk));
        }
        Ok(Self { message_len, seq, bulk_len })
    }
}

/// Reads exactly `buf.len()` bytes; an end of stream before the first byte is `Closed` when
/// `at_frame_start`, anywhere else `Truncated`.
pub fn read_full(reader: &mut impl Read, buf: &mut [u8], at_frame_start: bool) -> Result<(), FrameError> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) if filled == 0 && at_frame_start => return Err(FrameError::Closed),
            Ok(0) => return Err(FrameError::Truncated),
            Ok(n) => filled += n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(FrameError::Io(error)),
        }
    }
    Ok(())
}

/// Reads one frame header.
pub fn read_header(reader: &mut impl Read, limits: &FrameLimits) -> Result<FrameHeader, FrameError> {
    let mut bytes = [0u8; HEADER_LEN];
    read_full(reader, &mut bytes, true)?;
    FrameHeader::decode(&bytes, limits)
}

/// Reads a header and its message into `message` (resized); the bulk bytes are left unread.
pub fn read_message(reader: &mut impl Read, limits: &FrameLimits, message: &mut Vec<u8>) -> Result<FrameHeader, FrameError> {
    let header = read_header(reader, limits)?;
    message.clear();
    message.resize(header.message_len as usize, 0);
    read_full(reader, message, false)?;
    Ok(header)
}

/// Reads and throws away `len` bytes (the bulk of a frame nobody wants).
pub fn discard(reader: &mut impl Read, mut len: u64) -> Result<(), FrameError> {
    // Called after every request: the common case must not pay for a scratch buffer.
    if len == 0 {
        return Ok(());
    }
    let mut scratch = vec![0u8; 64 * 1024];
    while len > 0 {
        let step = usize::try_from(len).unwrap_or(usize::MAX).min(scratch.len());
        read_full(reader, &mut scratch[..step], false)?;
        len -= step as u64;
    }
    Ok(())
}

/// Writes one whole frame with as few system calls as the kernel allows.
pub fn write_frame(writer: &mut impl Write, seq: u32, message: &[u8], bulk: &[u8]) -> io::Result<()> {
    let header = FrameHeader {
        message_len: u32::try_from(message.len()).map_err(|_| io::Error::other("message too large"))?,
        seq,
        bulk_len: bulk.len() as u64,
    }
    .encode();
    write_all_vectored(writer, &mut [IoSlice::new(&header), IoSlice::new(message), IoSlice::new(bulk)])
}

/// `Write::write_all_vectored`, which is not stable yet.
pub fn write_all_vectored(writer: &mut impl Write, mut slices: &mut [IoSlice<'_>]) -> io::Result<()> {
    IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        match writer.write_vectored(slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut slices, n),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// Appends the postcard encoding of `value` to `out`.
pub fn encode_into<T: Serialize>(value: &T, out: &mut Vec<u8>) {
    let start = out.len();
    // Encoding into a Vec fails only for types serde cannot represent, which none of ours are;
    // were one to, nothing of it stays.
    if postcard::serialize_with_flavor(value, AppendTo(out)).is_err() {
        out.truncate(start);
    }
}

/// Postcard's output appended to the buffer the frame is built in, with `push` and
/// `extend_from_slice` (`to_extend`'s `Extend` of one byte at a time cost an async
/// `cuMemsetD8Async` 30 more instructions of its 1,300: `diagnostics/async_calls.sh`).
struct AppendTo<'a>(&'a mut Vec<u8>);

impl postcard::ser_flavors::Flavor for AppendTo<'_> {
    type Output = ();

    #[inline(always)]
    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        self.0.push(byte);
        Ok(())
    }

    #[inline(always)]
    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// Decodes a whole message; trailing bytes are an error, so two encodings never alias.
pub fn decode_exact<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, FrameError> {
    let (value, rest) = postcard::take_from_bytes(bytes).map_err(|error| FrameError::Decode(error.to_string()))?;
    if rest.is_empty() { Ok(value) } else { Err(FrameError::Decode(format!("{} trailing bytes", rest.len()))) }
}

/// Writes a frame holding just an encoded value (handshakes, locate requests).
pub fn write_value<T: Serialize>(writer: &mut impl Write, seq: u32, value: &T) -> io::Result<()> {
    let mut message = Vec::new();
    encode_into(value, &mut message);
    write_frame(writer, seq, &message, &[])
}

/// Reads a frame holding just an encoded value; a frame with bulk bytes is refused.
pub fn read_value<T: DeserializeOwned>(reader: &mut impl Read, limits: &FrameLimits) -> Result<(u32, T), FrameError> {
    let mut message = Vec::new();
    let header = read_message(reader, limits, &mut message)?;
    if header.bulk_len != 0 {
        return Err(FrameError::Decode("unexpected bulk payload".into()));
    }
    Ok((header.seq, decode_exact(&message)?))
}

/// A local socket's whole exchange from the asking side (`locate`, `jobs`), over a connected
/// stream: sends `request`, reads the one reply (within `reply_limits`). Timeouts are the
/// stream's (set them before calling).
pub fn ask<Request: Serialize, Reply: DeserializeOwned>(
    stream: &mut (impl Read + Write),
    request: &Request,
    reply_limits: &FrameLimits,
) -> Result<Reply, FrameError> {
    write_value(stream, 1, request)?;
    read_value(stream, reply_limits).map(|(_, reply)| reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let header = FrameHeader { message_len: 17, seq: 42, bulk_len: 1 << 33 };
        let limits = FrameLimits { max_message: 1 << 20, max_bulk: 1 << 34 };
        assert_eq!(FrameHeader::decode(&header.encode(), &limits).unwrap(), header);
    }

    #[test]
    fn oversized_lengths_are_refused_before_allocation() {
        let limits = FrameLimits::default();
        let huge_message = FrameHeader { message_len: u32::MAX, seq: 1, bulk_len: 0 }.encode();
        assert!(matches!(FrameHeader::decode(&huge_message, &limits), Err(FrameError::MessageTooLarge(..))));
        let huge_bulk = FrameHeader { message_len: 0, seq: 1, bulk_len: u64::MAX }.encode();
        assert!(matches!(FrameHeader::decode(&huge_bulk, &limits), Err(FrameError::BulkTooLarge(..))));
    }

    #[test]
    fn whole_frames_read_back_and_truncation_is_detected() {
        let mut wire = Vec::new();
        write_frame(&mut wire, 7, b"hello", b"bulk!").unwrap();
        let mut reader = &wire[..];
        let mut message = Vec::new();
        let header = read_message(&mut reader, &FrameLimits::default(), &mut message).unwrap();
        assert_eq!((header.seq, header.bulk_len, &message[..]), (7, 5, &b"hello"[..]));
        let mut bulk = [0u8; 5];
        read_full(&mut reader, &mut bulk, false).unwrap();
        assert_eq!(&bulk, b"bulk!");
        assert!(matches!(read_header(&mut reader, &FrameLimits::default()), Err(FrameError::Closed)));

        let mut cut = &wire[..HEADER_LEN + 2];
        assert!(matches!(read_message(&mut cut, &FrameLimits::default(), &mut message), Err(FrameError::Truncated)));
    }

    #[test]
    fn trailing_bytes_are_rejected() {
        let mut bytes = Vec::new();
        encode_into(&5u32, &mut bytes);
        bytes.push(0);
        assert!(decode_exact::<u32>(&bytes).is_err());
    }
}
