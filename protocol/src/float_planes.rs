//! Chunks of 16-bit floats (bf16 or fp16 tensors: model weights, activations) coded for slow
//! links. Each 2-byte value (little-endian) is cut in two: its top 11 bits (sign, exponent and
//! the first mantissa bits) get a canonical Huffman code built for the chunk, its low 5 bits go as
//! they are. A model's weights use few exponents, so the top bits carry about 5.5 bits of
//! information and a whole bf16 value about 10.5 of its 16 (N(0, 0.02) weights: 1.52x, within 1%
//! of the order-0 entropy of the whole value), where LZ4 finds almost no repeats (1.19x after
//! splitting the bytes in planes).
//!
//! Block: the number of values (u32, little-endian), the number of symbols in the code (u16),
//! each symbol (u16) with its code length (u8) in increasing symbol order (the lengths make a
//! complete prefix code: a chunk of one symbol lists a second, unused one), the chunk's odd last
//! byte if it has one, the byte lengths of bit streams 0 to 6 (u32 each), then the eight streams:
//! value `i` is in stream `i % 8` (eight streams let the decoder work on eight values at once), as
//! its low 5 bits, lowest first, then its code, first bit first (canonical: shorter codes first,
//! then by symbol). A stream's bits fill each of its bytes from the least significant bit; its
//! last byte is padded with zeros, and it has no byte more. Decoding checks everything it reads:
//! a block from a hostile peer fails, never panics.

/// Bits of a value coded by the Huffman code: sign, 8 exponent bits and 2 mantissa bits of bf16.
const SYMBOL_BITS: u32 = 11;
/// Bits of a value sent as they are.
const RAW_BITS: u32 = 16 - SYMBOL_BITS;
const SYMBOLS: usize = 1 << SYMBOL_BITS;
/// All 16-bit values.
const VALUES: usize = 1 << 16;
/// Longest code: the decoding table has `1 << MAX_CODE` entries.
const MAX_CODE: u32 = 12;
const TABLE_LEN: usize = 1 << MAX_CODE;
/// Chunks with fewer values are not worth a code table.
const MIN_VALUES: usize = 4096;
/// Bit streams a block's values are dealt over.
const STREAMS: usize = 8;
/// Bytes of a row: a value of each stream.
const ROW: usize = 2 * STREAMS;
/// Bytes of a word: the rows coded between two flushes, or decoded between two refills, of each
/// stream's 64 bits. Fewer than 8 bits are held after a flush, 57 or more after a refill: three
/// values of at most `MAX_CODE + RAW_BITS` = 17 bits fit, and take 7 bytes at most.
const WORD: usize = 3 * ROW;
/// Words coded per stream in turn: few enough to stay in the first-level cache while each stream
/// takes its values from them.
const BLOCK_WORDS: usize = 256;
/// A stream's symbol counts, with room after them: counts a multiple of 4 KiB apart (the same
/// symbol's in two streams) look alike to the processor's store forwarding, which stalls counting.
const COUNTS_LEN: usize = SYMBOLS + 16;

/// The top bits of `value`: its symbol.
#[inline(always)]
fn symbol_of(value: u16) -> usize {
    usize::from(value >> RAW_BITS)
}

/// The value at `at` of `bytes` (little-endian).
#[inline(always)]
fn value_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(bytes[at..at + 2].try_into().unwrap_or_default())
}

/// Bytes of a block before its streams.
fn header_len(used: usize, chunk_len: usize) -> usize {
    4 + 2 + 3 * used + chunk_len % 2 + 4 * (STREAMS - 1)
}

/// `code` of `length` bits with its first bit lowest, as the streams hold it.
fn first_bit_lowest(code: u16, length: u8) -> u16 {
    if length == 0 { 0 } else { code.reverse_bits() >> (16 - u32::from(length)) }
}

/// Codes chunks, keeping its buffers between them (one per sending thread).
#[derive(Default)]
pub struct Encoder {
    /// Per stream, how many of its values have each symbol (apart also so that neighbouring
    /// values never wait on each other's count).
    counts: Vec<[u32; COUNTS_LEN]>,
    /// All streams' counts together.
    totals: Vec<u32>,
    lengths: Vec<u8>,
    codes: Vec<u16>,
    /// Per value: its low bits with its symbol's code above them, as a stream holds them.
    value_bits: Vec<u32>,
    /// Per value: the bits of `value_bits`.
    value_widths: Vec<u8>,
    /// Each stream's bytes, as the last estimate counted them.
    stream_bytes: [usize; STREAMS],
}

/// What [`Encoder::estimate`] found: the coded size and how skewed the values are.
pub struct Estimate {
    /// Bytes of the whole block.
    pub bytes: usize,
    /// The share of the values that have the most common top bits (near 1: repeats, which LZ4
    /// may code far better).
    pub top_share: f64,
}

impl Encoder {
    /// Builds the chunk's code and says what the block would take; `None` when `bytes` is too
    /// short to be worth it.
    pub fn estimate(&mut self, bytes: &[u8]) -> Option<Estimate> {
        let values = bytes.len() / 2;
        if values < MIN_VALUES || u32::try_from(values).is_err() {
            return None;
        }
        self.counts.clear();
        self.counts.resize(STREAMS, [0; COUNTS_LEN]);
        let counts: &mut [[u32; COUNTS_LEN]; STREAMS] = self.counts.as_mut_slice().try_into().expect("counts per stream");
        let rows = bytes.chunks_exact(ROW);
        let last_values = rows.remainder();
        // The last rows first: the chunk's start is then the freshest in the caches for encode.
        for row in rows.rev() {
            for (quarter, counts) in row.chunks_exact(8).zip(counts.chunks_exact_mut(4)) {
                let quarter = u64::from_le_bytes(quarter.try_into().unwrap_or_default());
                for (stream, counts) in counts.iter_mut().enumerate() {
                    counts[symbol_of((quarter >> (16 * stream)) as u16)] += 1;
                }
            }
        }
        for (counts, pair) in counts.iter_mut().zip(last_values.chunks_exact(2)) {
            counts[symbol_of(value_at(pair, 0))] += 1;
        }
        self.totals.clear();
        self.totals.extend((0..SYMBOLS).map(|symbol| counts.iter().map(|counts| counts[symbol]).sum::<u32>()));
        code_lengths(&self.totals, &mut self.lengths);
        for (stream, (stream_bytes, counts)) in self.stream_bytes.iter_mut().zip(counts.iter()).enumerate() {
            let stream_values = (values + STREAMS - 1 - stream) / STREAMS;
            let code_bits: u64 = counts.iter().zip(&self.lengths).map(|(&count, &length)| u64::from(count) * u64::from(length)).sum();
            *stream_bytes = (code_bits + stream_values as u64 * u64::from(RAW_BITS)).div_ceil(8) as usize;
        }
        let used = self.lengths.iter().filter(|&&length| length > 0).count();
        let top = self.totals.iter().copied().max().unwrap_or(0);
        let bytes = header_len(used, bytes.len()) + self.stream_bytes.iter().sum::<usize>();
        Some(Estimate { bytes, top_share: f64::from(top) / values as f64 })
    }

    /// Codes `bytes` with the code the last [`Encoder::estimate`] of the same bytes built, into
    /// `out`. Bytes that changed since (an app writing the buffer being copied) are coded as
    /// something else, the block still well formed.
    pub fn encode(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        let values = bytes.len() / 2;
        canonical_codes(&self.lengths, &mut self.codes);
        // A table over whole values rather than symbols: one load gives all of a value's bits.
        // Only the chunk's symbols are filled in; the others keep zeros or an earlier chunk's
        // entries, read only where the bytes changed, and as well formed.
        self.value_bits.resize(VALUES, 0);
        self.value_widths.resize(VALUES, 0);
        for (symbol, (&code, &length)) in self.codes.iter().zip(&self.lengths).enumerate().filter(|(_, (_, length))| **length > 0) {
            let code = u32::from(first_bit_lowest(code, length)) << RAW_BITS;
            let symbol_values = symbol << RAW_BITS..(symbol + 1) << RAW_BITS;
            for (raw, bits) in self.value_bits[symbol_values.clone()].iter_mut().enumerate() {
                *bits = code | raw as u32;
            }
            self.value_widths[symbol_values].fill(length + RAW_BITS as u8);
        }
        let coded = ValueCodes {
            bits: self.value_bits.as_slice().try_into().expect("bits per value"),
            widths: self.value_widths.as_slice().try_into().expect("a width per value"),
        };
        let used = self.lengths.iter().filter(|&&length| length > 0).count();
        let header = header_len(used, bytes.len());
        // The streams go straight to their places where the estimate was right (always, unless
        // the bytes changed). Every byte is written, so the buffer's old bytes need no zeroing.
        out.resize(header + self.stream_bytes.iter().sum::<usize>(), 0);
        let mut stream_bytes = encode_streams(bytes, &coded, regions(&mut out[header..], self.stream_bytes));
        if stream_bytes != self.stream_bytes {
            // Room for any stream, then each moved down behind the one before.
            let most = (values.div_ceil(STREAMS) * (MAX_CODE + RAW_BITS) as usize).div_ceil(8);
            out.resize(header + STREAMS * most, 0);
            stream_bytes = encode_streams(bytes, &coded, regions(&mut out[header..], [most; STREAMS]));
            let mut end = header;
            for (stream, &len) in stream_bytes.iter().enumerate() {
                let start = header + stream * most;
                out.copy_within(start..start + len, end);
                end += len;
            }
            out.truncate(end);
        }
        let mut at = 0;
        let mut put = |field: &[u8]| {
            out[at..at + field.len()].copy_from_slice(field);
            at += field.len();
        };
        put(&(values as u32).to_le_bytes());
        put(&(used as u16).to_le_bytes());
        for (symbol, &length) in self.lengths.iter().enumerate().filter(|(_, length)| **length > 0) {
            put(&(symbol as u16).to_le_bytes());
            put(&[length]);
        }
        if bytes.len() % 2 == 1 {
            put(&bytes[bytes.len() - 1..]);
        }
        for &len in &stream_bytes[..STREAMS - 1] {
            put(&(len as u32).to_le_bytes());
        }
    }
}

/// Huffman code lengths for `counts` (0 for unused symbols), none longer than `MAX_CODE`, making
/// a complete prefix code (one used symbol gets an unused partner).
fn code_lengths(counts: &[u32], lengths: &mut Vec<u8>) {
    lengths.clear();
    lengths.resize(counts.len(), 0);
    // Used symbols, most frequent first (ties by symbol: the same input gives the same code).
    let mut used: Vec<(u32, usize)> =
        counts.iter().enumerate().filter(|(_, count)| **count > 0).map(|(symbol, count)| (*count, symbol)).collect();
    used.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    if used.len() == 1 {
        lengths[used[0].1] = 1;
        lengths[used[0].1 ^ 1] = 1;
        return;
    }
    // The Huffman tree's leaf depths, by merging the two lightest nodes until one is left.
    let mut parent = vec![usize::MAX; 2 * used.len()];
    let mut heap: std::collections::BinaryHeap<std::cmp::Reverse<(u64, usize)>> =
        used.iter().enumerate().map(|(leaf, &(count, _))| std::cmp::Reverse((u64::from(count), leaf))).collect();
    let mut next = used.len();
    while heap.len() > 1 {
        let (Some(std::cmp::Reverse((a, left))), Some(std::cmp::Reverse((b, right)))) = (heap.pop(), heap.pop()) else { break };
        parent[left] = next;
        parent[right] = next;
        heap.push(std::cmp::Reverse((a + b, next)));
        next += 1;
    }
    let root = next - 1;
    let mut depth = vec![0u32; next];
    for node in (0..root).rev() {
        depth[node] = depth[parent[node]] + 1;
    }
    // How many codes of each length, the longest folded into MAX_CODE and the lengths then
    // evened out until they make a complete code again (as DEFLATE's encoders do).
    let mut per_length = [0u32; MAX_CODE as usize + 1];
    for leaf in 0..used.len() {
        per_length[depth[leaf].min(MAX_CODE) as usize] += 1;
    }
    let full = 1u64 << MAX_CODE;
    let mut total: u64 = (1..=MAX_CODE as usize).map(|length| u64::from(per_length[length]) << (MAX_CODE as usize - length)).sum();
    while total > full {
        per_length[MAX_CODE as usize] -= 1;
        if let Some(shorter) = (1..MAX_CODE as usize).rev().find(|&length| per_length[length] > 0) {
            per_length[shorter] -= 1;
            per_length[shorter + 1] += 2;
        }
        total -= 1;
    }
    // The most frequent symbols get the shortest codes.
    let mut leaves = used.iter();
    for (length, &count) in per_length.iter().enumerate().skip(1) {
        for _ in 0..count {
            if let Some(&(_, symbol)) = leaves.next() {
                lengths[symbol] = length as u8;
            }
        }
    }
}

/// The canonical code of each symbol of `lengths` (shorter codes first, then by symbol).
fn canonical_codes(lengths: &[u8], codes: &mut Vec<u16>) {
    codes.clear();
    codes.resize(lengths.len(), 0);
    let mut per_length = [0u32; MAX_CODE as usize + 2];
    for &length in lengths {
        per_length[usize::from(length)] += 1;
    }
    per_length[0] = 0;
    let mut next = [0u32; MAX_CODE as usize + 2];
    let mut code = 0u32;
    for length in 1..=MAX_CODE as usize {
        code = (code + per_length[length - 1]) << 1;
        next[length] = code;
    }
    for (symbol, &length) in lengths.iter().enumerate().filter(|(_, length)| **length > 0) {
        codes[symbol] = next[usize::from(length)] as u16;
        next[usize::from(length)] += 1;
    }
}

/// How each value is coded: its low bits with its symbol's code above them (the first bit
/// lowest), and how many bits that is.
struct ValueCodes<'a> {
    bits: &'a [u32; VALUES],
    widths: &'a [u8; VALUES],
}

/// `area` cut in consecutive regions of `lens` bytes (the first ones).
fn regions(area: &mut [u8], lens: [usize; STREAMS]) -> [&mut [u8]; STREAMS] {
    let mut rest = area;
    lens.map(|len| {
        let (region, after) = std::mem::take(&mut rest).split_at_mut(len);
        rest = after;
        region
    })
}

/// Codes the values of `bytes` into one region per stream; the bytes each stream took (more than
/// its region when it did not fit: then its region holds only its start).
fn encode_streams(bytes: &[u8], coded: &ValueCodes<'_>, regions: [&mut [u8]; STREAMS]) -> [usize; STREAMS] {
    let mut writers = regions.map(|rest| BitWriter { region: rest.len(), rest, beyond: 0, bits: 0, count: 0 });
    let words = bytes.len() / WORD * WORD;
    for block in bytes[..words].chunks(BLOCK_WORDS * WORD) {
        // One stream at a time: its loop keeps all it needs in registers.
        let [w0, w1, w2, w3, w4, w5, w6, w7] = &mut writers;
        w0.add_words::<0>(block, coded);
        w1.add_words::<1>(block, coded);
        w2.add_words::<2>(block, coded);
        w3.add_words::<3>(block, coded);
        w4.add_words::<4>(block, coded);
        w5.add_words::<5>(block, coded);
        w6.add_words::<6>(block, coded);
        w7.add_words::<7>(block, coded);
    }
    for row in bytes[words..].chunks(ROW) {
        for (writer, pair) in writers.iter_mut().zip(row.chunks_exact(2)) {
            writer.add(coded, value_at(pair, 0));
            writer.flush();
        }
    }
    writers.map(BitWriter::finish)
}

/// [`BitWriter::add_words`] where every flush finds 8 bytes of room in `out` (no check for the
/// region's end but one per two words: the loop's state stays in registers); the bytes written,
/// and the bits and their count left.
#[inline(never)]
fn add_roomy_words<const STREAM: usize>(
    words: &[u8],
    coded: &ValueCodes<'_>,
    out: &mut [u8],
    mut bits: u64,
    mut count: u32,
) -> (usize, u64, u32) {
    let mut add_word = |word: &[u8], out: &mut [u8]| {
        for row in word.chunks_exact(ROW) {
            let value = usize::from(value_at(row, 2 * STREAM));
            bits |= u64::from(coded.bits[value]) << (count & 63);
            count += u32::from(coded.widths[value]);
        }
        out[..8].copy_from_slice(&bits.to_le_bytes());
        // Fewer than 64 bits are held: the masks only tell the compiler so.
        let whole = count & 56;
        bits >>= whole;
        count &= 7;
        whole / 8
    };
    // Bytes written by this call: few, so `at + 15` cannot overflow.
    let mut at = 0u32;
    let mut pairs = words.chunks_exact(2 * WORD);
    for pair in &mut pairs {
        let (first, second) = pair.split_at(WORD);
        // The second word's store starts 7 bytes in at most.
        let place = &mut out[at as usize..at as usize + 15];
        let whole = add_word(first, place);
        at += whole + add_word(second, &mut place[whole as usize..]);
    }
    for word in pairs.remainder().chunks_exact(WORD) {
        at += add_word(word, &mut out[at as usize..at as usize + 8]);
    }
    (at as usize, bits, count)
}

/// Writes bits lowest first into a region of the block.
struct BitWriter<'a> {
    /// The region's bytes not written yet.
    rest: &'a mut [u8],
    /// The region's bytes.
    region: usize,
    /// Bytes that did not fit.
    beyond: usize,
    /// Bits not written yet, `count` of them, the first lowest.
    bits: u64,
    count: u32,
}

impl BitWriter<'_> {
    /// Appends `value` coded; the bits held (fewer than 8 after a flush) and those added before
    /// the next flush must fit 64.
    #[inline(always)]
    fn add(&mut self, coded: &ValueCodes<'_>, value: u16) {
        self.bits |= u64::from(coded.bits[usize::from(value)]) << self.count;
        self.count += u32::from(coded.widths[usize::from(value)]);
    }

    /// Appends this stream's values of whole words.
    fn add_words<const STREAM: usize>(&mut self, words: &[u8], coded: &ValueCodes<'_>) {
        // Words whose flush finds 8 bytes of room, each flush taking 7 at most.
        let roomy = (self.rest.len().saturating_sub(1) / 7).min(words.len() / WORD);
        let (fast, slow) = words.split_at(roomy * WORD);
        let taken;
        (taken, self.bits, self.count) = add_roomy_words::<STREAM>(fast, coded, self.rest, self.bits, self.count);
        self.rest = &mut std::mem::take(&mut self.rest)[taken..];
        for word in slow.chunks_exact(WORD) {
            for row in word.chunks_exact(ROW) {
                self.add(coded, value_at(row, 2 * STREAM));
            }
            self.flush();
        }
    }

    /// Writes the whole bytes held (with one 8-byte store, but near the region's end).
    fn flush(&mut self) {
        let whole = (self.count / 8) as usize;
        let rest = std::mem::take(&mut self.rest);
        self.rest = if rest.len() >= 8 {
            rest[..8].copy_from_slice(&self.bits.to_le_bytes());
            &mut rest[whole..]
        } else {
            let fits = whole.min(rest.len());
            self.beyond += whole - fits;
            rest[..fits].copy_from_slice(&self.bits.to_le_bytes()[..fits]);
            &mut rest[fits..]
        };
        self.bits >>= 8 * whole;
        self.count %= 8;
    }

    /// The bytes the stream took.
    fn finish(mut self) -> usize {
        self.flush();
        if self.count > 0 {
            match std::mem::take(&mut self.rest).split_first_mut() {
                Some((last, rest)) => {
                    *last = self.bits as u8;
                    self.rest = rest;
                }
                None => self.beyond += 1,
            }
        }
        self.region - self.rest.len() + self.beyond
    }
}

/// Per `MAX_CODE` next bits of a stream (the first lowest), for the code they start with: what
/// turns the stream's next 16 bits into the value (they hold its low bits, then the first 11 of
/// these `MAX_CODE`: `adds` holds the symbol less those), and the bits of low bits and code.
struct Table {
    adds: [u16; TABLE_LEN],
    widths: [u8; TABLE_LEN],
}

/// Decodes blocks, keeping its tables between them (one per receiving thread).
#[derive(Default)]
pub struct Decoder {
    lengths: Vec<u8>,
    codes: Vec<u16>,
    table: Option<Box<Table>>,
}

/// Decodes a block made by [`Encoder::encode`] into `target`, whose length must be the chunk's.
#[cfg(test)]
pub fn decode(block: &[u8], target: &mut [u8]) -> Result<(), String> {
    Decoder::default().decode(block, target)
}

impl Decoder {
    /// Decodes a block made by [`Encoder::encode`] into `target`, whose length must be the
    /// chunk's.
    pub fn decode(&mut self, block: &[u8], target: &mut [u8]) -> Result<(), String> {
        let bad = |what: &str| Err(format!("a float-planes chunk {what}"));
        let (Some(values), Some(used)) = (block.get(0..4), block.get(4..6)) else { return bad("is cut short") };
        let values = u32::from_le_bytes(values.try_into().unwrap_or([0; 4])) as usize;
        let used = usize::from(u16::from_le_bytes(used.try_into().unwrap_or([0; 2])));
        if values != target.len() / 2 {
            return bad(&format!("holds {values} values, not {}", target.len() / 2));
        }
        let Some(table_bytes) = block.get(6..6 + 3 * used) else { return bad("has its code cut short") };
        let lengths = &mut self.lengths;
        lengths.clear();
        lengths.resize(SYMBOLS, 0);
        let mut last = None;
        let mut kraft = 0u64;
        for entry in table_bytes.chunks_exact(3) {
            let symbol = usize::from(u16::from_le_bytes([entry[0], entry[1]]));
            let length = entry[2];
            if symbol >= SYMBOLS || last.is_some_and(|last| symbol <= last) || length == 0 || u32::from(length) > MAX_CODE {
                return bad("has a bad code");
            }
            last = Some(symbol);
            lengths[symbol] = length;
            kraft += 1u64 << (MAX_CODE - u32::from(length));
        }
        // Complete: every `MAX_CODE` bits start a code, so every entry of the table is written.
        if kraft != 1 << MAX_CODE {
            return bad("has a code that is no complete prefix code");
        }
        canonical_codes(lengths, &mut self.codes);
        let table = self.table.get_or_insert_with(|| Box::new(Table { adds: [0; TABLE_LEN], widths: [0; TABLE_LEN] }));
        for (symbol, &length) in lengths.iter().enumerate().filter(|(_, length)| **length > 0) {
            let first = usize::from(first_bit_lowest(self.codes[symbol], length));
            for index in (first..TABLE_LEN).step_by(1 << length) {
                table.adds[index] = ((symbol as u16) << RAW_BITS).wrapping_sub((index as u16) << RAW_BITS);
                table.widths[index] = length + RAW_BITS as u8;
            }
        }
        let mut at = 6 + 3 * used;
        if target.len() % 2 == 1 {
            let Some(&odd) = block.get(at) else { return bad("lacks its last byte") };
            let end = target.len() - 1;
            target[end] = odd;
            at += 1;
        }
        // The bit each stream is at in the block, and the byte it ends before.
        let mut positions = [0; STREAMS];
        let mut ends = [0; STREAMS];
        let mut start = at + 4 * (STREAMS - 1);
        for (index, (position, stream_end)) in positions.iter_mut().zip(&mut ends).enumerate() {
            let len = if index == STREAMS - 1 {
                block.len().checked_sub(start)
            } else {
                block.get(at + 4 * index..at + 4 * index + 4).map(|len| u32::from_le_bytes(len.try_into().unwrap_or([0; 4])) as usize)
            };
            let Some(end) = len.and_then(|len| start.checked_add(len)).filter(|&end| end <= block.len()) else {
                return bad("is cut short");
            };
            (*position, *stream_end) = (8 * start, end);
            start = end;
        }
        let rows = values / STREAMS * ROW;
        let mut done = 0;
        loop {
            // Words every stream has 8 bytes for at each refill (a word takes 7 at most): their
            // loop need not look for the streams' ends.
            let roomy = ends.iter().zip(&positions).map(|(&end, &position)| end.saturating_sub(position / 8 + 1) / 7).min();
            let words = roomy.unwrap_or(0).min((rows - done) / WORD);
            if words == 0 {
                break;
            }
            let end = done + words * WORD;
            decode_words(block, &mut positions, table, &mut target[done..end]);
            done = end;
        }
        // The last values, one at a time, each stream's bytes read zero-padded.
        for (index, pair) in target[done..2 * values].chunks_exact_mut(2).enumerate() {
            let stream = (done / 2 + index) % STREAMS;
            let position = &mut positions[stream];
            let mut word = [0u8; 8];
            let left = block.get(*position / 8..ends[stream]).unwrap_or_default();
            let inside = left.len().min(8);
            word[..inside].copy_from_slice(&left[..inside]);
            pair.copy_from_slice(&take_value(u64::from_le_bytes(word) >> (*position % 8), position, table).to_le_bytes());
        }
        // Every bit read must have been in its stream, and every byte of a stream read.
        if ends.iter().zip(positions).any(|(&end, position)| position.div_ceil(8) != end) {
            return bad("has a stream of the wrong length");
        }
        Ok(())
    }
}

/// Decodes whole words into `rows`, every stream having 8 bytes at each refill. A stream's state
/// is only the bit it is at in `block` (its bits are loaded afresh for each word): few registers
/// for eight streams.
#[inline(never)]
fn decode_words(block: &[u8], positions: &mut [usize; STREAMS], table: &Table, rows: &mut [u8]) {
    let mut local = *positions;
    for word in rows.chunks_exact_mut(WORD) {
        let mut bits = [0; STREAMS];
        for (bits, &position) in bits.iter_mut().zip(&local) {
            let at = position / 8;
            *bits = u64::from_le_bytes(block[at..at + 8].try_into().unwrap_or_default()) >> (position % 8);
        }
        for row in word.chunks_exact_mut(ROW) {
            for ((bits, position), pair) in bits.iter_mut().zip(&mut local).zip(row.chunks_exact_mut(2)) {
                pair.copy_from_slice(&take_value(*bits, position, table).to_le_bytes());
                *bits >>= table.widths[(*bits >> RAW_BITS) as usize % TABLE_LEN];
            }
        }
    }
    *positions = local;
}

/// The value `bits` start with (`MAX_CODE + RAW_BITS` of them or more), `position` moved past it.
#[inline(always)]
fn take_value(bits: u64, position: &mut usize, table: &Table) -> u16 {
    let index = (bits >> RAW_BITS) as usize % TABLE_LEN;
    *position += usize::from(table.widths[index]);
    (bits as u16).wrapping_add(table.adds[index])
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// bf16 values of N(0, sigma) from a seeded generator (Box-Muller), as a checkpoint holds.
    pub(crate) fn bf16_weights(values: usize, sigma: f64, mut state: u64) -> Vec<u8> {
        let mut uniform = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        (0..values)
            .flat_map(|_| {
                let normal = (-2.0 * uniform().ln()).sqrt() * (2.0 * std::f64::consts::PI * uniform()).cos() * sigma;
                (((normal as f32).to_bits() >> 16) as u16).to_le_bytes()
            })
            .collect()
    }

    fn round_trip(bytes: &[u8]) -> usize {
        let mut encoder = Encoder::default();
        let estimate = encoder.estimate(bytes).expect("long enough");
        let mut block = Vec::new();
        encoder.encode(bytes, &mut block);
        assert_eq!(block.len(), estimate.bytes, "the estimate is the block's size");
        let mut back = vec![0u8; bytes.len()];
        decode(&block, &mut back).unwrap();
        assert!(back == bytes, "the bytes come back");
        block.len()
    }

    #[test]
    fn bf16_weights_code_to_two_thirds_and_come_back() {
        let weights = bf16_weights(1 << 20, 0.02, 11);
        let coded = round_trip(&weights);
        let ratio = weights.len() as f64 / coded as f64;
        assert!(ratio > 1.5, "{ratio:.3}x");
        // An odd last byte, a tiny sigma and a wide one.
        let mut odd = bf16_weights(5000, 0.001, 3);
        odd.push(0x7f);
        round_trip(&odd);
        round_trip(&bf16_weights(8192, 1000.0, 5));
    }

    #[test]
    fn skewed_and_flat_inputs_round_trip() {
        // One symbol only, two, and every symbol (random bytes: the code does not pay).
        round_trip(&vec![0u8; 10000]);
        round_trip(&(0..10000u32).flat_map(|i| [(i % 7) as u8, if i % 1000 == 0 { 0x80 } else { 0 }]).collect::<Vec<u8>>());
        let mut state = 99u64;
        let random: Vec<u8> = (0..1 << 16)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
            .collect();
        let coded = round_trip(&random);
        assert!(coded > random.len(), "random bytes do not shrink");
        // Lengths stay within MAX_CODE even for counts spread over many orders of magnitude.
        let mut counts = vec![0u32; SYMBOLS];
        for (symbol, count) in counts.iter_mut().enumerate().take(40) {
            *count = 1 << (symbol % 30);
        }
        let mut lengths = Vec::new();
        code_lengths(&counts, &mut lengths);
        assert!(lengths.iter().all(|&length| u32::from(length) <= MAX_CODE));
        let kraft: u64 = lengths.iter().filter(|&&l| l > 0).map(|&l| 1u64 << (MAX_CODE - u32::from(l))).sum();
        assert_eq!(kraft, 1 << MAX_CODE);
    }

    #[test]
    fn hostile_blocks_fail_without_panicking() {
        let weights = bf16_weights(1 << 14, 0.02, 1);
        let mut encoder = Encoder::default();
        encoder.estimate(&weights).unwrap();
        let mut block = Vec::new();
        encoder.encode(&weights, &mut block);
        let mut target = vec![0u8; weights.len()];
        // Cut anywhere, or with flipped bytes anywhere: an error or other bytes, never a panic.
        for cut in [0, 3, 5, 6, 50, block.len() / 2, block.len() - 1] {
            assert!(decode(&block[..cut], &mut target).is_err(), "cut at {cut}");
        }
        let mut state = 5u64;
        for _ in 0..2000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let mut broken = block.clone();
            let at = (state as usize) % broken.len();
            broken[at] ^= (state >> 40) as u8 | 1;
            let _ = decode(&broken, &mut target);
        }
        // A code that is no prefix code, a symbol out of range, a wrong count of values.
        let mut bad = vec![0, 0x40, 0, 0, 3, 0, 1, 0, 1, 2, 0, 1, 3, 0, 1];
        assert!(decode(&bad, &mut vec![0u8; 0x8000]).is_err());
        bad[6..9].copy_from_slice(&[0xff, 0xff, 1]);
        assert!(decode(&bad, &mut vec![0u8; 0x8000]).is_err());
        assert!(decode(&block, &mut vec![0u8; weights.len() + 2]).is_err());
        // A code with prefixes that start no code (one symbol of length 1 alone).
        let mut incomplete = vec![0, 0x40, 0, 0, 1, 0, 1, 0, 1];
        incomplete.extend([0u8; 4 * (STREAMS - 1)]);
        incomplete.extend(vec![0u8; 0x4000 * 6 / 8]);
        assert!(decode(&incomplete, &mut vec![0u8; 0x8000]).is_err());
        // A byte more at the end, or a byte moved from one stream to the next.
        let mut longer = block.clone();
        longer.push(0);
        assert!(decode(&longer, &mut target).is_err());
        let lengths_at = 6 + 3 * usize::from(u16::from_le_bytes([block[4], block[5]]));
        let mut moved = block.clone();
        let first = u32::from_le_bytes(moved[lengths_at..lengths_at + 4].try_into().unwrap());
        moved[lengths_at..lengths_at + 4].copy_from_slice(&(first - 1).to_le_bytes());
        assert!(decode(&moved, &mut target).is_err());
    }

    /// Bytes that change between the estimate and the encoding (an app writing the buffer being
    /// copied): a well-formed block, which decodes to some bytes or fails, never a panic.
    #[test]
    fn bytes_changed_after_the_estimate_still_make_a_block() {
        let weights = bf16_weights(1 << 14, 0.02, 4);
        let mut encoder = Encoder::default();
        let mut block = Vec::new();
        let mut target = vec![0u8; weights.len()];
        let mut state = 3u64;
        let others = [
            bf16_weights(1 << 14, 0.02, 5),
            bf16_weights(1 << 14, 1000.0, 6),
            vec![0xff; weights.len()],
            (0..weights.len())
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state >> 24) as u8
                })
                .collect(),
        ];
        for other in &others {
            encoder.estimate(&weights).unwrap();
            encoder.encode(other, &mut block);
            let _ = decode(&block, &mut target);
            // The same encoder then codes a chunk right.
            let estimate = encoder.estimate(other).unwrap();
            encoder.encode(other, &mut block);
            assert_eq!(block.len(), estimate.bytes);
            decode(&block, &mut target).unwrap();
            assert!(&target == other);
        }
    }

    /// Lengths around whole rows and words, odd and even, so that every stream's tail is coded
    /// and decoded: each comes back.
    #[test]
    fn every_length_round_trips() {
        let weights = bf16_weights(MIN_VALUES + 4 * WORD, 0.02, 8);
        for len in (2 * MIN_VALUES..2 * MIN_VALUES + 2 * WORD + 3).chain([weights.len() - 1, weights.len()]) {
            round_trip(&weights[..len]);
        }
        // A reused decoder and encoder, chunk after chunk with other codes.
        let (mut encoder, mut decoder) = (Encoder::default(), Decoder::default());
        let mut block = Vec::new();
        for (index, chunk) in
            [bf16_weights(9000, 0.02, 1), vec![7u8; 9001], bf16_weights(5000, 30.0, 2), bf16_weights(70000, 0.5, 3)].iter().enumerate()
        {
            encoder.estimate(chunk).unwrap();
            encoder.encode(chunk, &mut block);
            let mut back = vec![index as u8; chunk.len()];
            decoder.decode(&block, &mut back).unwrap();
            assert!(&back == chunk, "chunk {index}");
        }
    }

    /// Every prefix of a small block, and random blocks behind a plausible header (a value count
    /// that matches, a code table of random entries): an error or some bytes, never a panic or a
    /// read past the block.
    #[test]
    fn truncated_and_random_blocks_fail_without_panicking() {
        let mut weights = bf16_weights(MIN_VALUES + 3, 0.02, 2);
        weights.push(0x3c);
        let mut encoder = Encoder::default();
        encoder.estimate(&weights).unwrap();
        let mut block = Vec::new();
        encoder.encode(&weights, &mut block);
        let mut target = vec![0u8; weights.len()];
        for cut in 0..block.len() {
            assert!(decode(&block[..cut], &mut target).is_err(), "cut at {cut} of {}", block.len());
        }
        decode(&block, &mut target).unwrap();
        assert!(target == weights);
        let mut state = 17u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..3000 {
            let values = 1 + (next() % 5000) as usize;
            let used = (next() % 40) as u16;
            let mut random = Vec::new();
            random.extend_from_slice(&(values as u32).to_le_bytes());
            random.extend_from_slice(&used.to_le_bytes());
            let mut symbol = 0u16;
            for _ in 0..used {
                // Mostly increasing symbols with lengths in range, now and then anything.
                symbol = if round % 7 == 0 { next() as u16 } else { symbol.saturating_add(1 + (next() % 50) as u16) };
                let length = if round % 5 == 0 { next() as u8 } else { 1 + (next() % u64::from(MAX_CODE)) as u8 };
                random.extend_from_slice(&symbol.to_le_bytes());
                random.push(length);
            }
            let tail = (next() % 20000) as usize;
            random.extend((0..tail).map(|_| next() as u8));
            let mut target = vec![0u8; 2 * values + (round % 2)];
            let _ = decode(&random, &mut target);
            let _ = decode(&random[..random.len() / 2], &mut target);
        }
    }

    /// Entropy bounds, ratio and single-core speed on 4 MiB chunks of bf16 N(0, 0.02) weights
    /// (the client's default chunk), with buffers allocated and touched beforehand (as the
    /// stripes' threads reuse theirs), the best of a few rounds. Run: `cargo test -p
    /// flyt-protocol --release --lib float_planes::tests::speed -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, run by hand in release"]
    fn speed() {
        const CHUNK: usize = 4 << 20;
        const ROUNDS: usize = 5;
        let weights = bf16_weights(16 << 20, 0.02, 7);
        let entropy = |bits: u32, shift: u32| {
            let mut counts = vec![0u64; 1 << bits];
            for pair in weights.chunks_exact(2) {
                counts[usize::from(u16::from_le_bytes([pair[0], pair[1]]) >> shift) & ((1 << bits) - 1)] += 1;
            }
            let total = (weights.len() / 2) as f64;
            counts.iter().filter(|&&c| c > 0).map(|&c| -(c as f64 / total) * (c as f64 / total).log2()).sum::<f64>()
        };
        let h16 = entropy(16, 0);
        let (h_top, h_low) = (entropy(SYMBOL_BITS, RAW_BITS), entropy(RAW_BITS, 0));
        println!(
            "order-0 entropy: whole value {h16:.3} bits ({:.3}x), top {SYMBOL_BITS} bits {h_top:.3} + low {RAW_BITS} bits {h_low:.3}",
            16.0 / h16
        );
        let (mut encoder, mut decoder) = (Encoder::default(), Decoder::default());
        let mut blocks: Vec<Vec<u8>> = weights.chunks(CHUNK).map(|chunk| vec![1u8; chunk.len()]).collect();
        let mut back = vec![1u8; weights.len()];
        let best = |run: &mut dyn FnMut()| {
            (0..ROUNDS)
                .map(|_| {
                    let started = std::time::Instant::now();
                    run();
                    started.elapsed().as_secs_f64()
                })
                .fold(f64::MAX, f64::min)
        };
        let encode = best(&mut || {
            for (chunk, block) in weights.chunks(CHUNK).zip(&mut blocks) {
                encoder.estimate(chunk).unwrap();
                encoder.encode(chunk, block);
            }
        });
        let decode_time = best(&mut || {
            for (chunk, block) in back.chunks_mut(CHUNK).zip(&blocks) {
                decoder.decode(block, chunk).unwrap();
            }
        });
        assert!(back == weights);
        let estimate = best(&mut || {
            for chunk in weights.chunks(CHUNK) {
                encoder.estimate(chunk).unwrap();
            }
        });
        let coded: usize = blocks.iter().map(Vec::len).sum();
        let mb = weights.len() as f64 / 1e6;
        let ratio = weights.len() as f64 / coded as f64;
        let bits = 8.0 * coded as f64 / (weights.len() / 2) as f64;
        println!(
            "float planes: {ratio:.4}x ({bits:.3} bits/value), estimate {:.0} MB/s, estimate+encode {:.0} MB/s, decode {:.0} MB/s (one core)",
            mb / estimate,
            mb / encode,
            mb / decode_time
        );
    }
}
