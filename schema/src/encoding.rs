//! Parquet's value encodings, as segment.rs writes them into pages: the RLE/bit-packed
//! hybrid (definition levels and dictionary indices), DELTA_BINARY_PACKED (integer
//! columns), PLAIN byte arrays (the dictionary page), and the varints they are built of.
//! Each function returns the encoded bytes of the values it is given; pages, their
//! headers, compression and the row groups are segment.rs's.
//!
//! Values arrive as runs where the data has them: [`RunList`] keeps a column's pending
//! values as (value, count) runs, which [`rle_hybrid`] writes as RLE runs without
//! expanding them, and [`delta_binary_packed`] writes a block of 128 equal values after
//! one comparison per value.

/// Values as runs of one value: (value, count), no two neighbours equal, count > 0.
#[derive(Default)]
pub(crate) struct RunList {
    pub(crate) runs: std::collections::VecDeque<(u32, u32)>,
    /// Values in all runs.
    pub(crate) len: usize,
}

impl RunList {
    #[inline]
    pub(crate) fn push_n(&mut self, v: u32, n: usize) {
        if n == 0 {
            return;
        }
        self.len += n;
        match self.runs.back_mut() {
            Some(last) if last.0 == v && (last.1 as usize) + n <= u32::MAX as usize => last.1 += n as u32,
            _ => self.runs.push_back((v, n as u32)),
        }
    }

    /// Removes the first `n` values (n <= len) and returns their runs.
    pub(crate) fn take(&mut self, mut n: usize) -> Vec<(u32, u32)> {
        self.len -= n;
        let mut out = Vec::new();
        while n > 0 {
            let front = self.runs.front_mut().expect("n <= len");
            if (front.1 as usize) <= n {
                n -= front.1 as usize;
                out.push(self.runs.pop_front().expect("front exists"));
            } else {
                front.1 -= n as u32;
                out.push((front.0, n as u32));
                n = 0;
            }
        }
        out
    }
}

/// Parquet's RLE/bit-packed hybrid encoding of the values of `runs` (each < 2^bit_width),
/// without a length prefix: runs of 8 or more equal values as RLE runs, the rest
/// bit-packed in groups of 8 (the last group padded with zeros; readers stop at the page's
/// count).
pub(crate) fn rle_hybrid(runs: &[(u32, u32)], bit_width: u8) -> Vec<u8> {
    let mut out = Vec::new();
    let mut literals: Vec<u32> = Vec::new();
    for &(v, run) in runs {
        let run = run as usize;
        // A literal group must be complete before a run can start: top it up from the run.
        let fill = (8 - literals.len() % 8) % 8;
        if run >= fill + 8 {
            literals.extend(std::iter::repeat_n(v, fill));
            flush_literals(&mut out, &mut literals, bit_width);
            put_varint(&mut out, ((run - fill) as u64) << 1);
            out.extend_from_slice(&v.to_le_bytes()[..usize::from(bit_width).div_ceil(8)]);
        } else {
            literals.extend(std::iter::repeat_n(v, run));
        }
    }
    if !literals.is_empty() {
        literals.resize(literals.len().div_ceil(8) * 8, 0);
        flush_literals(&mut out, &mut literals, bit_width);
    }
    out
}

/// Writes `literals` (a multiple of 8 values) as one bit-packed run, and empties it.
fn flush_literals(out: &mut Vec<u8>, literals: &mut Vec<u32>, bit_width: u8) {
    if literals.is_empty() {
        return;
    }
    put_varint(out, ((literals.len() / 8) as u64) << 1 | 1);
    let (mut acc, mut bits) = (0u64, 0u32);
    for &v in literals.iter() {
        acc |= u64::from(v) << bits;
        bits += u32::from(bit_width);
        while bits >= 8 {
            out.push(acc as u8);
            acc >>= 8;
            bits -= 8;
        }
    }
    debug_assert_eq!(bits, 0, "8 values fill whole bytes");
    literals.clear();
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

const DELTA_BLOCK: usize = 128;
const DELTA_MINIBLOCKS: usize = 4;
const DELTA_MINIBLOCK: usize = DELTA_BLOCK / DELTA_MINIBLOCKS;

/// DELTA_BINARY_PACKED encoding of `values` (at least one), deltas wrapping at 32 bits
/// when `int32`: a header (block size, miniblocks per block, count, first value), then
/// per block of 128 deltas its minimum (zigzag) and four miniblock bit widths, each
/// miniblock's deltas less the minimum bit-packed (the last one padded with zeros; the
/// widths of miniblocks past the last value are 0 and have no bytes).
pub(crate) fn delta_binary_packed(values: &[i64], int32: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + values.len() / 8);
    put_varint(&mut out, DELTA_BLOCK as u64);
    put_varint(&mut out, DELTA_MINIBLOCKS as u64);
    put_varint(&mut out, values.len() as u64);
    put_zigzag(&mut out, values[0]);
    let mut deltas = [0u64; DELTA_BLOCK];
    let mut i = 1;
    while i < values.len() {
        let m = (values.len() - i).min(DELTA_BLOCK);
        // values[i - 1..i + m]: the block's m deltas and the value before them.
        let span = &values[i - 1..i + m];
        if span.iter().all(|&v| v == span[0]) {
            // Zero deltas: minimum 0, widths 0, no miniblock bytes.
            out.extend_from_slice(&[0; 1 + DELTA_MINIBLOCKS]);
            i += m;
            continue;
        }
        let mut min = i64::MAX;
        for (d, w) in deltas.iter_mut().zip(span.windows(2)) {
            let delta =
                if int32 { i64::from((w[1] as i32).wrapping_sub(w[0] as i32)) } else { w[1].wrapping_sub(w[0]) };
            *d = delta as u64;
            min = min.min(delta);
        }
        put_zigzag(&mut out, min);
        let widths_at = out.len();
        out.extend_from_slice(&[0; DELTA_MINIBLOCKS]);
        for (k, mini) in deltas[..m].chunks(DELTA_MINIBLOCK).enumerate() {
            let mut packed = [0u64; DELTA_MINIBLOCK];
            let mut any = 0u64;
            for (p, &d) in packed.iter_mut().zip(mini) {
                *p = (d as i64).wrapping_sub(min) as u64 & if int32 { u64::from(u32::MAX) } else { u64::MAX };
                any |= *p;
            }
            let width = 64 - any.leading_zeros();
            out[widths_at + k] = width as u8;
            pack(&mut out, &packed, width);
        }
        i += m;
    }
    out
}

/// Appends 32 values of `width` bits each, little-endian bit order (4 × width bytes).
fn pack(out: &mut Vec<u8>, values: &[u64; DELTA_MINIBLOCK], width: u32) {
    if width == 0 {
        return;
    }
    let (mut acc, mut bits) = (0u128, 0u32);
    for &v in values {
        acc |= u128::from(v) << bits;
        bits += width;
        if bits >= 64 {
            out.extend_from_slice(&(acc as u64).to_le_bytes());
            acc >>= 64;
            bits -= 64;
        }
    }
    // 32 × width bits: what is left is 0 or 32 bits.
    out.extend_from_slice(&(acc as u64).to_le_bytes()[..(bits / 8) as usize]);
}

fn put_zigzag(out: &mut Vec<u8>, v: i64) {
    put_varint(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// The bit width of indices into a dictionary of `entries` values (at least 1, as a
/// dictionary page's data pages state it in their first byte).
pub(crate) fn index_bit_width(entries: usize) -> u8 {
    (32 - (entries.saturating_sub(1) as u32).leading_zeros()).max(1) as u8
}

/// PLAIN encoding of byte arrays: each value's length (4 bytes, little-endian), then its
/// bytes.
pub(crate) fn plain_byte_arrays(values: &[Box<[u8]>]) -> Vec<u8> {
    let mut plain = Vec::with_capacity(values.iter().map(|v| 4 + v.len()).sum());
    for v in values {
        plain.extend_from_slice(&(v.len() as u32).to_le_bytes());
        plain.extend_from_slice(v);
    }
    plain
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Parquet format's DELTA_BINARY_PACKED, decoded as the specification reads it
    /// (independently of the encoder above): header, then per block a zigzag minimum
    /// delta, the miniblocks' bit widths and their bit-packed deltas.
    fn decode_delta(bytes: &[u8], int32: bool) -> Vec<i64> {
        decode_delta_widths(bytes, int32).0
    }

    /// The values, and the bit widths of the miniblocks that hold any.
    fn decode_delta_widths(bytes: &[u8], int32: bool) -> (Vec<i64>, Vec<u32>) {
        let mut seen = Vec::new();
        let mut at = 0;
        let varint = |at: &mut usize| {
            let (mut v, mut shift) = (0u64, 0);
            loop {
                let b = bytes[*at];
                *at += 1;
                v |= u64::from(b & 0x7f) << shift;
                if b < 0x80 {
                    return v;
                }
                shift += 7;
            }
        };
        let unzigzag = |v: u64| ((v >> 1) as i64) ^ -((v & 1) as i64);
        let block = varint(&mut at) as usize;
        let minis = varint(&mut at) as usize;
        let count = varint(&mut at) as usize;
        let mut out = vec![unzigzag(varint(&mut at))];
        while out.len() < count {
            let min = unzigzag(varint(&mut at));
            let widths: Vec<u32> = bytes[at..at + minis].iter().map(|&w| u32::from(w)).collect();
            at += minis;
            for w in widths {
                if out.len() >= count {
                    break; // miniblocks past the last value have no bytes
                }
                seen.push(w);
                let per = block / minis;
                let (mut acc, mut bits, mut read) = (0u128, 0u32, 0usize);
                for _ in 0..per {
                    while bits < w {
                        acc |= u128::from(bytes[at + read]) << bits;
                        read += 1;
                        bits += 8;
                    }
                    let d = if w == 64 { acc as u64 } else { (acc as u64) & ((1u64 << w) - 1) };
                    acc >>= w;
                    bits -= w;
                    if out.len() < count {
                        let prev = *out.last().unwrap();
                        let v = if int32 {
                            i64::from((prev as i32).wrapping_add((min as i32).wrapping_add(d as i32)))
                        } else {
                            prev.wrapping_add(min.wrapping_add(d as i64))
                        };
                        out.push(v);
                    }
                }
                at += (per * w as usize) / 8;
            }
        }
        assert_eq!(at, bytes.len(), "no bytes left over");
        (out, seen)
    }

    /// The RLE/bit-packed hybrid, decoded as the specification reads it, `n` values.
    fn decode_hybrid(bytes: &[u8], width: u8, n: usize) -> Vec<u32> {
        let (mut at, mut out) = (0, Vec::new());
        while out.len() < n {
            let (mut header, mut shift) = (0u64, 0);
            loop {
                let b = bytes[at];
                at += 1;
                header |= u64::from(b & 0x7f) << shift;
                if b < 0x80 {
                    break;
                }
                shift += 7;
            }
            if header & 1 == 0 {
                let nbytes = usize::from(width).div_ceil(8);
                let mut v = [0u8; 4];
                v[..nbytes].copy_from_slice(&bytes[at..at + nbytes]);
                at += nbytes;
                out.extend(std::iter::repeat_n(u32::from_le_bytes(v), (header >> 1) as usize));
            } else {
                let values = (header >> 1) as usize * 8;
                let (mut acc, mut bits) = (0u64, 0u32);
                for _ in 0..values {
                    while bits < u32::from(width) {
                        acc |= u64::from(bytes[at]) << bits;
                        at += 1;
                        bits += 8;
                    }
                    out.push((acc & ((1u64 << width) - 1)) as u32);
                    acc >>= width;
                    bits -= u32::from(width);
                }
            }
        }
        assert_eq!(at, bytes.len(), "no bytes left over");
        out.truncate(n);
        out
    }

    fn runs_of(values: &[u32]) -> Vec<(u32, u32)> {
        let mut r = RunList::default();
        for &v in values {
            r.push_n(v, 1);
        }
        let n = r.len;
        r.take(n)
    }

    #[test]
    fn varints_and_zigzag_known_answers() {
        let enc = |v: u64| {
            let mut o = Vec::new();
            put_varint(&mut o, v);
            o
        };
        assert_eq!(enc(0), [0]);
        assert_eq!(enc(127), [0x7f]);
        assert_eq!(enc(128), [0x80, 0x01]);
        assert_eq!(enc(300), [0xac, 0x02]);
        assert_eq!(enc(u64::MAX).len(), 10);
        let zz = |v: i64| {
            let mut o = Vec::new();
            put_zigzag(&mut o, v);
            o
        };
        assert_eq!((zz(0), zz(-1), zz(1), zz(-2)), (vec![0], vec![1], vec![2], vec![3]));
        assert_eq!(zz(i64::MIN), enc(u64::MAX));
    }

    #[test]
    fn delta_one_value_is_the_header_alone() {
        // block 128 (varint 0x80 0x01), 4 miniblocks, 1 value, first value zigzag(7) = 14
        assert_eq!(delta_binary_packed(&[7], false), [0x80, 0x01, 0x04, 0x01, 0x0e]);
        assert_eq!(decode_delta(&delta_binary_packed(&[-7], false), false), [-7]);
    }

    #[test]
    fn delta_constant_blocks_have_width_zero_and_no_miniblock_bytes() {
        let values = vec![42i64; 1 + 128 + 5];
        let bytes = delta_binary_packed(&values, false);
        // header (6 bytes: 0x80 0x01, 4, count 134 = 0x86 0x01, zigzag 42 = 84), then two
        // blocks of a zero minimum and four zero widths
        assert_eq!(bytes[..6], [0x80, 0x01, 0x04, 0x86, 0x01, 84]);
        assert_eq!(bytes[6..], [0; 10]);
        assert_eq!(decode_delta_widths(&bytes, false), (values, vec![0, 0, 0, 0, 0]));
    }

    #[test]
    fn delta_width_64_and_negative_deltas() {
        // deltas of i64::MIN and i64::MAX in turn: less their minimum, they need 64 bits
        let mut v = 0i64;
        let extremes: Vec<i64> = (0..70)
            .map(|i| {
                v = v.wrapping_add(match i {
                    0 => 0,
                    i if i % 2 == 1 => i64::MIN,
                    _ => i64::MAX,
                });
                v
            })
            .collect();
        let (values, widths) = decode_delta_widths(&delta_binary_packed(&extremes, false), false);
        assert_eq!(values, extremes);
        assert_eq!(widths, [64, 64, 64]);
        // descending: every delta negative, the minimum delta negative too
        let down: Vec<i64> = (0..300).map(|i| 1_000 - 3 * i * i).collect();
        assert_eq!(decode_delta(&delta_binary_packed(&down, false), false), down);
        // INT32: deltas wrap at 32 bits, so i32 extremes take 32 bits, not 64
        let mut w = 0i32;
        let ext32: Vec<i64> = (0..40)
            .map(|i| {
                w = w.wrapping_add(match i {
                    0 => 0,
                    i if i % 2 == 1 => i32::MIN,
                    _ => i32::MAX,
                });
                i64::from(w)
            })
            .collect();
        let (values, widths) = decode_delta_widths(&delta_binary_packed(&ext32, true), true);
        assert_eq!(values, ext32);
        assert_eq!(widths, [32, 32]);
    }

    #[test]
    fn delta_round_trips_every_length_around_block_and_miniblock_edges() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for n in [1, 2, 31, 32, 33, 127, 128, 129, 130, 256, 257, 1000] {
            let values: Vec<i64> = (0..n)
                .map(|i| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    match i % 4 {
                        0 => x as i64,
                        1 => (x % 100) as i64 - 50,
                        _ => i as i64,
                    }
                })
                .collect();
            assert_eq!(decode_delta(&delta_binary_packed(&values, false), false), values, "n = {n}");
            let v32: Vec<i64> = values.iter().map(|&v| i64::from(v as i32)).collect();
            assert_eq!(decode_delta(&delta_binary_packed(&v32, true), true), v32, "n = {n} (int32)");
        }
    }

    #[test]
    fn hybrid_known_answers() {
        // nothing: no bytes
        assert!(rle_hybrid(&[], 1).is_empty());
        // one value: a bit-packed group of 8 (header 1 group: 0b11 = 3), padded with zeros
        assert_eq!(rle_hybrid(&[(1, 1)], 1), [0x03, 0x01]);
        // 8 equal values: an RLE run (header 8 << 1 = 16), the value in one byte
        assert_eq!(rle_hybrid(&[(5, 8)], 3), [0x10, 0x05]);
        // 3 literals then a run of 13: the group is topped up to 8 from the run, 8 left
        // for the RLE run
        let bytes = rle_hybrid(&[(0, 1), (1, 1), (0, 1), (1, 13)], 1);
        assert_eq!(bytes, [0x03, 0b1111_1010, 0x10, 0x01]);
        // a width of 9 bits takes two bytes per RLE value
        assert_eq!(rle_hybrid(&[(300, 9)], 9), [0x12, 0x2c, 0x01]);
    }

    #[test]
    fn hybrid_round_trips_runs_and_literals_at_each_width() {
        let mut x = 12345u64;
        for width in [1u8, 2, 3, 7, 8, 9, 16, 17, 31, 32] {
            let top = if width == 32 { u64::from(u32::MAX) } else { (1u64 << width) - 1 };
            let mut values = Vec::new();
            for _ in 0..200 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let run = [1, 1, 2, 7, 8, 9, 15, 16, 17, 100][(x % 10) as usize];
                values.extend(std::iter::repeat_n(((x >> 8) & top) as u32, run));
            }
            let bytes = rle_hybrid(&runs_of(&values), width);
            assert_eq!(decode_hybrid(&bytes, width, values.len()), values, "width {width}");
        }
    }

    #[test]
    fn runs_merge_neighbours_and_split_when_taken() {
        let mut r = RunList::default();
        r.push_n(3, 2);
        r.push_n(3, 0);
        r.push_n(3, 5);
        r.push_n(4, 1);
        assert_eq!((r.len, r.runs.iter().copied().collect::<Vec<_>>()), (8, vec![(3, 7), (4, 1)]));
        assert_eq!(r.take(4), [(3, 4)]);
        assert_eq!(r.take(4), [(3, 3), (4, 1)]);
        assert_eq!((r.len, r.take(0)), (0, vec![]));
    }

    #[test]
    fn dictionary_index_widths_and_plain_byte_arrays() {
        assert_eq!([0, 1, 2, 3, 4, 5, 256, 257].map(index_bit_width), [1, 1, 1, 2, 2, 3, 8, 9]);
        assert!(plain_byte_arrays(&[]).is_empty());
        let values: Vec<Box<[u8]>> = vec![b"ab".as_slice().into(), b"".as_slice().into()];
        assert_eq!(plain_byte_arrays(&values), [2, 0, 0, 0, b'a', b'b', 0, 0, 0, 0]);
    }
}
