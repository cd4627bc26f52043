//! What a TLS peer's bytes reach after the handshake on the data plane (any TCP client can
//! complete a handshake with an rpc-server before it shows a token): record headers, opening,
//! the content type and padding, post-handshake messages; and sealing then opening any
//! plaintext gives it back.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| flyt_ring::tls::fuzz_records(data));
