//! The rpc-server's read loop over a session's byte stream: frame headers checked against the
//! limits, each message decoded as a request, bulk bytes skipped as `BulkIn` does. Whatever
//! decodes re-encodes to bytes that decode to the same request.
#![no_main]

use flyt_protocol::frame::{FrameLimits, read_message};
use flyt_protocol::ops::Request;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let limits = FrameLimits::default();
    let mut stream = data;
    let mut message = Vec::new();
    while let Ok(header) = read_message(&mut stream, &limits, &mut message) {
        if let Ok(request) = Request::decode(&message) {
            let info = request.info();
            assert!(!info.name.is_empty());
            let mut encoded = Vec::new();
            request.encode(&mut encoded);
            let again = Request::decode(&encoded).expect("a request Flyt encoded decodes");
            let mut encoded_again = Vec::new();
            again.encode(&mut encoded_again);
            assert_eq!(encoded, encoded_again, "{} does not survive a round trip", info.name);
        }
        let skip = usize::try_from(header.bulk_len).unwrap_or(usize::MAX).min(stream.len());
        stream = &stream[skip..];
    }
});
