//! What the shim decodes from the server: frames whose sequence number 0 marks a notice, and
//! replies of every op (the op is chosen by the input's first two bytes, as the shim knows which
//! op a sequence number belongs to).
#![no_main]

use flyt_protocol::frame::{FrameLimits, decode_exact, read_message};
use flyt_protocol::handshake::Notice;
use flyt_protocol::ops::{decode_reply, rep, split_reply};

macro_rules! decode_every_reply {
    ($(
        $(#[$doc:meta])*
        $id:literal $name:ident $method:ident [$class:ident $bulk:tt]
        { $($req_field:ident : $req_ty:ty),* $(,)? } -> { $($rep_field:ident : $rep_ty:ty),* $(,)? };
    )*) => {
        fn decode_reply_of(op: u16, message: &[u8]) {
            match op {
                $($id => drop(decode_reply::<rep::$name>(message)),)*
                _ => {}
            }
        }
    };
}

flyt_protocol::for_each_op!(decode_every_reply);

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((op, mut stream)) = data.split_first_chunk::<2>() else { return };
    let op = u16::from_le_bytes(*op);
    let limits = FrameLimits::default();
    let mut message = Vec::new();
    while let Ok(header) = read_message(&mut stream, &limits, &mut message) {
        if header.seq == 0 {
            drop(decode_exact::<Notice>(&message));
        } else {
            drop(split_reply(&message));
            decode_reply_of(op, &message);
        }
        let skip = usize::try_from(header.bulk_len).unwrap_or(usize::MAX).min(stream.len());
        stream = &stream[skip..];
    }
});
