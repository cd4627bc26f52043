//! Chunks of 16-bit floats (bf16 or fp16 tensors: model weights, activations) coded for slow
//! links. Each 2-byte value (little-endian) is cut in two: its top 11 bits (sign, exponent and
//! the first mantissa bits) get a canonical Huffman code built for the chunk, its low 5 bits go as
//! they are. A model's weights use few exponents, so the top bits carry about 5.5 bits of
//! information and a whole bf16 value about 10.5 of its 16 (N(0, 0.02) weights: 1.52x, within 1%
//! of the order-0 entropy of the whole value), where LZ4 finds almost no repeats (1.19x after
//! splitting the bytes in planes).
//!
//! Block: the number of values (u32, little-endian), the number of symbols in the code (u16),
//! each symbol (u16) with its code length (u8) in increasing symbol order, the chunk's odd last
//! byte if it has one, the byte lengths of bit streams 0 to 2 (u32 each), then the four streams:
//! value `i` is in stream `i % 4`, as its code then its low bits, most significant bit first (four
//! streams let the decoder work on four values at once). Decoding checks everything it reads: a
//! block from a hostile peer fails, never panics.

/// Bits of a value coded by the Huffman code: sign, 8 exponent bits and 2 mantissa bits of bf16.
const SYMBOL_BITS: u32 = 11;
/// Bits of a value sent as they are.
const RAW_BITS: u32 = 16 - SYMBOL_BITS;
const SYMBOLS: usize = 1 << SYMBOL_BITS;
/// Longest code: the decoding table has `1 << MAX_CODE` entries.
const MAX_CODE: u32 = 12;
/// Chunks with fewer values are not worth a code table.
const MIN_VALUES: usize = 4096;
/// Bit streams a block's values are dealt over.
const STREAMS: usize = 4;

/// Codes chunks, keeping its buffers between them (one per sending thread).
#[derive(Default)]
pub struct Encoder {
    counts: Vec<u32>,
    lengths: Vec<u8>,
    codes: Vec<u16>,
    /// Per symbol: its code above 8 bits of its width with the raw bits.
    coded_symbols: Vec<u32>,
    streams: [Vec<u8>; STREAMS],
}

/// What [`Encoder::estimate`] found: the coded size and how skewed the values are.
pub struct Estimate {
    /// Bytes of the whole block, at most (each stream ends on a whole byte).
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
        self.counts.resize(SYMBOLS, 0);
        for pair in bytes.chunks_exact(2) {
            self.counts[usize::from(u16::from_le_bytes([pair[0], pair[1]]) >> RAW_BITS)] += 1;
        }
        code_lengths(&self.counts, &mut self.lengths);
        let used = self.lengths.iter().filter(|&&length| length > 0).count();
        let bits: u64 = self.counts.iter().zip(&self.lengths).map(|(&count, &length)| u64::from(count) * u64::from(length)).sum::<u64>()
            + values as u64 * u64::from(RAW_BITS);
        let top = self.counts.iter().copied().max().unwrap_or(0);
        let bytes = 6 + 3 * used + bytes.len() % 2 + 4 * (STREAMS - 1) + bits.div_ceil(8) as usize + STREAMS - 1;
        Some(Estimate { bytes, top_share: f64::from(top) / values as f64 })
    }

    /// Codes `bytes` with the code the last [`Encoder::estimate`] of the same bytes built, into
    /// `out` (cleared).
    pub fn encode(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        out.clear();
        let values = bytes.len() / 2;
        canonical_codes(&self.lengths, &mut self.codes);
        out.extend_from_slice(&(values as u32).to_le_bytes());
        let used = self.lengths.iter().filter(|&&length| length > 0).count();
        out.extend_from_slice(&(used as u16).to_le_bytes());
        for (symbol, &length) in self.lengths.iter().enumerate().filter(|(_, length)| **length > 0) {
            out.extend_from_slice(&(symbol as u16).to_le_bytes());
            out.push(length);
        }
        if bytes.len() % 2 == 1 {
            out.push(bytes[bytes.len() - 1]);
        }
        // Each symbol's code and the width of code and raw bits together, in one word.
        let (lengths, codes) = (&self.lengths, &self.codes);
        self.coded_symbols.clear();
        self.coded_symbols
            .extend(codes.iter().zip(lengths).map(|(&code, &length)| (u32::from(code) << 8) | (u32::from(length) + RAW_BITS)));
        let coded: &[u32; SYMBOLS] = self.coded_symbols.as_slice().try_into().expect("a word per symbol");
        let raw_mask = (1u32 << RAW_BITS) - 1;
        let code = |pair: [u8; 2]| {
            let value = u32::from(u16::from_le_bytes(pair));
            let entry = coded[(value >> RAW_BITS) as usize];
            (((entry >> 8) << RAW_BITS) | (value & raw_mask), entry & 0xff)
        };
        // At most MAX_CODE + RAW_BITS bits a value: room for every stream's worst case.
        let most = (values.div_ceil(STREAMS) * (MAX_CODE + RAW_BITS) as usize).div_ceil(8) + 8;
        let mut writers = self.streams.each_mut().map(|stream| {
            stream.clear();
            stream.resize(most, 0);
            BitWriter { out: stream, at: 0, bits: 0, count: 0 }
        });
        // Three values of each stream per flush (fewer than 8 bits held, three values of at most
        // 17 bits each: within 64).
        let triples = bytes.chunks_exact(3 * 2 * STREAMS);
        let after = triples.remainder();
        for triple in triples {
            for group in triple.chunks_exact(2 * STREAMS) {
                for (index, writer) in writers.iter_mut().enumerate() {
                    let (bits, width) = code([group[2 * index], group[2 * index + 1]]);
                    writer.add(bits, width);
                }
            }
            for writer in &mut writers {
                writer.flush();
            }
        }
        for group in after.chunks(2 * STREAMS) {
            for (writer, pair) in writers.iter_mut().zip(group.chunks_exact(2)) {
                let (bits, width) = code([pair[0], pair[1]]);
                writer.add(bits, width);
                writer.flush();
            }
        }
        for writer in writers {
            writer.finish();
        }
        for stream in &self.streams[..STREAMS - 1] {
            out.extend_from_slice(&(stream.len() as u32).to_le_bytes());
        }
        for stream in &self.streams {
            out.extend_from_slice(stream);
        }
    }
}

/// Huffman code lengths for `counts` (0 for unused symbols), none longer than `MAX_CODE`.
fn code_lengths(counts: &[u32], lengths: &mut Vec<u8>) {
    lengths.clear();
    lengths.resize(counts.len(), 0);
    // Used symbols, most frequent first (ties by symbol: the same input gives the same code).
    let mut used: Vec<(u32, usize)> =
        counts.iter().enumerate().filter(|(_, count)| **count > 0).map(|(symbol, count)| (*count, symbol)).collect();
    used.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    if used.len() == 1 {
        lengths[used[0].1] = 1;
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

/// Writes bits most significant first into a buffer sized for the worst case, then cut to what
/// was written.
struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    at: usize,
    bits: u64,
    count: u32,
}

impl BitWriter<'_> {
    /// Appends the low `width` bits of `value`; the bits held (fewer than 8 after a flush) and
    /// those added before the next flush must fit 64.
    #[inline(always)]
    fn add(&mut self, value: u32, width: u32) {
        self.bits = (self.bits << width) | u64::from(value);
        self.count += width;
    }

    /// Writes the whole bytes held (eight bytes stored, the buffer has room past its end).
    #[inline(always)]
    fn flush(&mut self) {
        if self.count == 0 {
            return;
        }
        let aligned = self.bits << (64 - self.count);
        self.out[self.at..self.at + 8].copy_from_slice(&aligned.to_be_bytes());
        let whole = self.count / 8;
        self.at += whole as usize;
        self.count -= whole * 8;
    }

    fn finish(mut self) {
        self.flush();
        if self.count > 0 {
            self.out[self.at] = (self.bits << (8 - self.count)) as u8;
            self.at += 1;
        }
        self.out.truncate(self.at);
    }
}

/// Reads bits most significant first; past the end it reads zeros (`position` still counts them,
/// so the decoder can tell it read more than the stream held).
struct BitReader<'a> {
    data: &'a [u8],
    position: usize,
    /// The next bits, left-aligned; `count` of them are valid.
    bits: u64,
    count: u32,
}

impl BitReader<'_> {
    fn refill(&mut self) {
        if let Some(word) = self.data.get(self.position..self.position + 8) {
            let word = u64::from_be_bytes(word.try_into().unwrap_or([0; 8]));
            let take = (63 - self.count) / 8;
            self.bits |= (word >> self.count) & !(u64::MAX >> (self.count + take * 8));
            self.position += take as usize;
            self.count += take * 8;
            return;
        }
        while self.count <= 56 {
            let byte = self.data.get(self.position).copied().unwrap_or(0);
            self.bits |= u64::from(byte) << (56 - self.count);
            self.position += 1;
            self.count += 8;
        }
    }

    fn peek(&self, width: u32) -> u32 {
        (self.bits >> (64 - width)) as u32
    }

    fn consume(&mut self, width: u32) {
        self.bits <<= width;
        self.count -= width;
    }
}

/// Decodes blocks, keeping its tables between them (one per receiving thread).
#[derive(Default)]
pub struct Decoder {
    lengths: Vec<u8>,
    codes: Vec<u16>,
    table: Vec<u32>,
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
        // The decoding table: for every MAX_CODE-bit prefix, the symbol and its code's length.
        let Self { lengths, codes, table } = self;
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
        if kraft > 1 << MAX_CODE {
            return bad("has a code that is no prefix code");
        }
        canonical_codes(lengths, codes);
        table.clear();
        table.resize(1 << MAX_CODE, 0);
        for (symbol, &length) in lengths.iter().enumerate().filter(|(_, length)| **length > 0) {
            let shift = MAX_CODE - u32::from(length);
            let start = (usize::from(codes[symbol])) << shift;
            for entry in &mut table[start..start + (1 << shift)] {
                *entry = ((symbol as u32) << 8) | u32::from(length);
            }
        }
        let mut at = 6 + 3 * used;
        if target.len() % 2 == 1 {
            let Some(&odd) = block.get(at) else { return bad("lacks its last byte") };
            let end = target.len() - 1;
            target[end] = odd;
            at += 1;
        }
        let mut readers: [BitReader<'_>; STREAMS] = std::array::from_fn(|_| BitReader { data: &[], position: 0, bits: 0, count: 0 });
        let mut start = at + 4 * (STREAMS - 1);
        for (index, reader) in readers.iter_mut().enumerate() {
            let len = if index == STREAMS - 1 {
                block.len().checked_sub(start)
            } else {
                block.get(at + 4 * index..at + 4 * index + 4).map(|len| u32::from_le_bytes(len.try_into().unwrap_or([0; 4])) as usize)
            };
            let Some(stream) = len.and_then(|len| block.get(start..start.checked_add(len)?)) else { return bad("is cut short") };
            reader.data = stream;
            start += stream.len();
        }
        let table: &[u32; 1 << MAX_CODE] = table.as_slice().try_into().map_err(|_| "a float-planes table of the wrong size".to_string())?;
        // A prefix no code starts with decodes as nothing; whether one came is looked at once, at the end.
        let mut unknown = false;
        // Three values of each stream per refill (a refill leaves 56 bits or more, a value takes
        // at most 17).
        let mut triples = target.chunks_exact_mut(3 * 2 * STREAMS);
        for triple in &mut triples {
            for reader in &mut readers {
                if reader.count < 3 * (MAX_CODE + RAW_BITS) {
                    reader.refill();
                }
            }
            for group in triple.chunks_exact_mut(2 * STREAMS) {
                let mut word = 0u64;
                for (index, reader) in readers.iter_mut().enumerate() {
                    word |= u64::from(take_value(reader, table, &mut unknown)) << (16 * index);
                }
                group.copy_from_slice(&word.to_le_bytes());
            }
        }
        let mut groups = triples.into_remainder().chunks_exact_mut(2 * STREAMS);
        for group in &mut groups {
            let mut word = 0u64;
            for (index, reader) in readers.iter_mut().enumerate() {
                word |= u64::from(decode_value(reader, table, &mut unknown)) << (16 * index);
            }
            group.copy_from_slice(&word.to_le_bytes());
        }
        let rest = groups.into_remainder();
        for (reader, pair) in readers.iter_mut().zip(rest.chunks_exact_mut(2)) {
            pair.copy_from_slice(&decode_value(reader, table, &mut unknown).to_le_bytes());
        }
        if unknown {
            return bad("has bits no code starts with");
        }
        // Every bit read must have been in its stream.
        if readers.iter().any(|reader| reader.position * 8 - reader.count as usize > reader.data.len() * 8) {
            return bad("is cut short");
        }
        Ok(())
    }
}

/// One value from `reader`; `unknown` set when its bits start no code.
#[inline(always)]
fn decode_value(reader: &mut BitReader<'_>, table: &[u32; 1 << MAX_CODE], unknown: &mut bool) -> u16 {
    if reader.count < MAX_CODE + RAW_BITS {
        reader.refill();
    }
    take_value(reader, table, unknown)
}

/// [`decode_value`] from bits already loaded (`MAX_CODE + RAW_BITS` of them or more).
#[inline(always)]
fn take_value(reader: &mut BitReader<'_>, table: &[u32; 1 << MAX_CODE], unknown: &mut bool) -> u16 {
    let entry = table[(reader.bits >> (64 - MAX_CODE)) as usize];
    let length = entry & 0xff;
    *unknown |= length == 0;
    reader.consume(length);
    let raw = reader.peek(RAW_BITS);
    reader.consume(RAW_BITS);
    (((entry >> 8) << RAW_BITS) | raw) as u16
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
        assert!(block.len() <= estimate.bytes && estimate.bytes <= block.len() + STREAMS, "the estimate bounds the block");
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
    /// (the client's default chunk). Run: `cargo test -p flyt-protocol --release --lib
    /// float_planes::tests::speed -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, run by hand in release"]
    fn speed() {
        const CHUNK: usize = 4 << 20;
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
        let mut encoder = Encoder::default();
        let mut block = Vec::new();
        let mut blocks = Vec::new();
        let started = std::time::Instant::now();
        for chunk in weights.chunks(CHUNK) {
            encoder.estimate(chunk).unwrap();
            encoder.encode(chunk, &mut block);
            blocks.push(block.clone());
        }
        let encode = started.elapsed().as_secs_f64();
        let coded: usize = blocks.iter().map(Vec::len).sum();
        let mut back = vec![0u8; weights.len()];
        let started = std::time::Instant::now();
        for (chunk, block) in back.chunks_mut(CHUNK).zip(&blocks) {
            decode(block, chunk).unwrap();
        }
        let decode_time = started.elapsed().as_secs_f64();
        assert!(back == weights);
        let started = std::time::Instant::now();
        for chunk in weights.chunks(CHUNK) {
            encoder.estimate(chunk).unwrap();
        }
        let estimate = started.elapsed().as_secs_f64();
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
