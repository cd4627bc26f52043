//! Striped copies' compressed chunks as a receiver sees them: every byte of the block is the
//! peer's, and so are the chunk's length and the codec its header names (LZ4, LZ4 in planes,
//! 16-bit floats in planes). Decoding fills the chunk or fails, never panics or writes past it.
#![no_main]

use flyt_protocol::stripes::{ChunkHeader, Decompressor, FLOAT_PLANES, SHUFFLED};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&[kind, high, low], block)) = data.split_first_chunk::<3>() else { return };
    let flags = [0, SHUFFLED, FLOAT_PLANES][usize::from(kind % 3)];
    // Up to 1 MiB, any length (odd ones too).
    let len = (u64::from(u16::from_le_bytes([low, high])) << 4) | u64::from(kind >> 4);
    if block.len() as u64 >= len {
        return;
    }
    let header = ChunkHeader { transfer: 1, offset: 0, len, wire_len: block.len() as u64, flags };
    let mut target = vec![0u8; len as usize];
    let _ = Decompressor::default().decompress(&header, block, &mut target);
});
