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
        let (item, rest) = postcard::take_from_bytes(src).map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))?;
        if rest.is_empty() {
            Ok(item)
        } else {
            Err(io::Error::new(io::ErrorKind::InvalidData, format!("{} trailing bytes after a message", rest.len())))
        }
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
}
