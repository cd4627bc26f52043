//! A postcard codec for `tokio-serde`, so tarpc's messages are not encoded with bincode
//! (unmaintained: DEPENDENCIES.md). Frame lengths are bounded by the length-delimited layer
//! underneath ([`crate::rpc::MAX_FRAME_BYTES`]).

use std::{io, marker::PhantomData, pin::Pin};

use bytes::{Bytes, BytesMut};
use serde::{Serialize, de::DeserializeOwned};

/// Encodes `SinkItem`s and decodes `Item`s with postcard.
pub struct PostcardCodec<Item, SinkItem> {
    marker: PhantomData<fn(SinkItem) -> Item>,
}

impl<Item, SinkItem> Default for PostcardCodec<Item, SinkItem> {
    fn default() -> Self {
        Self { marker: PhantomData }
    }
}

impl<Item: DeserializeOwned, SinkItem> tokio_serde::Deserializer<Item> for PostcardCodec<Item, SinkItem> {
    type Error = io::Error;

    fn deserialize(self: Pin<&mut Self>, src: &BytesMut) -> Result<Item, Self::Error> {
        decode(src)
    }
}

/// Decodes one whole message as the codec does: postcard, no trailing bytes, and a decoder
/// that panics is an error. tarpc's own `Deserialize` for a request's deadline panics on a
/// duration that overflows `Instant` (found by fuzzing): a peer's bytes must never panic a daemon.
pub fn decode<Item: DeserializeOwned>(src: &[u8]) -> io::Result<Item> {
    let decoded = std::panic::catch_unwind(|| postcard::take_from_bytes::<Item>(src))
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "a message whose decoding panicked"))?;
    let (item, rest) = decoded.map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))?;
    if rest.is_empty() {
        Ok(item)
    } else {
        Err(io::Error::new(io::ErrorKind::InvalidData, format!("{} trailing bytes after a message", rest.len())))
    }
}

impl<Item, SinkItem: Serialize> tokio_serde::Serializer<SinkItem> for PostcardCodec<Item, SinkItem> {
    type Error = io::Error;

    fn serialize(self: Pin<&mut Self>, item: &SinkItem) -> Result<Bytes, Self::Error> {
        postcard::to_stdvec(item).map(Bytes::from).map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;

    use tokio_serde::{Deserializer, Serializer};

    use super::*;

    #[test]
    fn values_round_trip_and_junk_is_an_error() {
        let mut codec = pin!(PostcardCodec::<(u32, String), (u32, String)>::default());
        let bytes = codec.as_mut().serialize(&(7, "seven".to_string())).unwrap();
        let decoded = codec.as_mut().deserialize(&BytesMut::from(&bytes[..])).unwrap();
        assert_eq!(decoded, (7, "seven".to_string()));
        let mut longer = BytesMut::from(&bytes[..]);
        longer.extend_from_slice(&[0]);
        assert!(codec.as_mut().deserialize(&longer).is_err());
        assert!(codec.as_mut().deserialize(&BytesMut::from(&[0xff, 0xff, 0xff][..])).is_err());
    }

    #[test]
    fn a_deadline_past_what_instant_holds_is_an_error_not_a_panic() {
        // A request (variant 0) whose context's deadline is u64::MAX seconds from now: tarpc's
        // `Deserialize` adds it to `Instant::now()`, which panics (found by fuzzing).
        let bytes = [0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x00, 0x00, 0x00];
        let mut codec = pin!(PostcardCodec::<tarpc::ClientMessage<u32>, ()>::default());
        assert_eq!(codec.as_mut().deserialize(&BytesMut::from(&bytes[..])).unwrap_err().kind(), io::ErrorKind::InvalidData);
    }
}
