//! JPEG images as datagen writes them, and the reads PIL makes to open and decode one
//! (`np.asarray(Image.open(path))`, DLIO's image reader; torchvision's `pil_loader`
//! reads the same way).
//!
//! An image is a baseline (SOF0) grayscale JPEG of 8×8 blocks, 64 blocks wide, whose
//! entropy-coded data fill the file: most blocks hold 63 AC coefficients of random
//! 4-bit values (508 bits), the rest only a DC and an end-of-block (8 bits), so the
//! scan's length is set to the bit; a comment segment after SOI takes the last few
//! bytes, so the file has exactly the sample's size. Quantization is 1 and the Huffman
//! tables give every symbol a 4-bit code, none all ones, so the scan never holds 0xFF
//! (no stuffing) until its final padding.

use crate::formats::{PyFile, Req};
use std::io::{self, Write};

/// Blocks across the image (512 pixels) once there are that many.
const BLOCKS_WIDE: u64 = 64;
/// Bits of a full block (a 4-bit DC code, 63 × (4-bit code + 4 value bits)) and of an
/// empty one (DC code, EOB code).
const FULL_BITS: u64 = 4 + 63 * 8;
const EMPTY_BITS: u64 = 8;
/// The smallest comment segment (marker and length).
const COM_MIN: u64 = 4;
/// PIL's ImageFile.load reads the image data in reads of this (decodermaxblock).
pub const PIL_BLOCK: u64 = 64 << 10;

/// Every segment but the comment and the scan: SOI, DQT, SOF0, two DHT, SOS, EOI.
fn tables(width: u16, height: u16) -> (Vec<u8>, Vec<u8>) {
    let mut head = Vec::with_capacity(160);
    head.extend_from_slice(&[0xff, 0xdb, 0, 67, 0]);
    head.extend_from_slice(&[1; 64]);
    head.extend_from_slice(&[0xff, 0xc0, 0, 11, 8]);
    head.extend_from_slice(&height.to_be_bytes());
    head.extend_from_slice(&width.to_be_bytes());
    head.extend_from_slice(&[1, 1, 0x11, 0]);
    // DC: categories 0..=11, each a 4-bit code.
    head.extend_from_slice(&[0xff, 0xc4, 0, 2 + 1 + 16 + 12, 0x00]);
    head.extend_from_slice(&[0, 0, 0, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    head.extend(0..12u8);
    // AC: EOB and run 0 of sizes 1..=10, each a 4-bit code (EOB 0000, size 4 0100).
    head.extend_from_slice(&[0xff, 0xc4, 0, 2 + 1 + 16 + 11, 0x10]);
    head.extend_from_slice(&[0, 0, 0, 11, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    head.extend(0..11u8);
    head.extend_from_slice(&[0xff, 0xda, 0, 8, 1, 1, 0x00, 0, 63, 0]);
    (head, vec![0xff, 0xd9])
}

/// Bits to bytes, 0xFF followed by a stuffed 0x00 as JPEG's scans require.
struct Bits {
    out: Vec<u8>,
    acc: u32,
    n: u32,
}

impl Bits {
    fn put(&mut self, v: u32, bits: u32) {
        self.acc = (self.acc << bits) | (v & ((1 << bits) - 1));
        self.n += bits;
        while self.n >= 8 {
            self.n -= 8;
            let b = (self.acc >> self.n) as u8;
            self.out.push(b);
            if b == 0xff {
                self.out.push(0);
            }
        }
        self.acc &= (1 << self.n) - 1;
    }

    fn finish(mut self) -> Vec<u8> {
        if self.n > 0 {
            let pad = 8 - self.n;
            self.put((1 << pad) - 1, pad);
        }
        self.out
    }
}

/// The entropy-coded data of `blocks` blocks, the first `full` of them full.
fn scan(blocks: u64, full: u64, seed: u64) -> Vec<u8> {
    let mut bits = Bits { out: Vec::with_capacity((full * FULL_BITS / 8 + blocks) as usize), acc: 0, n: 0 };
    let mut state = (seed ^ 0x2545_f491_4f6c_dd1d).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for b in 0..blocks {
        bits.put(0b0000, 4); // DC difference 0
        if b < full {
            for _ in 0..63 {
                // xorshift64: values differ from file to file and block to block.
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                bits.put(0b0100, 4); // run 0, size 4
                bits.put(state as u32, 4);
            }
        } else {
            bits.put(0b0000, 4); // EOB
        }
    }
    bits.finish()
}

/// Writes a JPEG image of exactly `size` bytes (at least 256).
pub fn write(out: &mut impl Write, size: u64, seed: u64) -> io::Result<()> {
    let (head, tail) = tables(8, 8);
    let fixed = 2 + head.len() as u64 + tail.len() as u64;
    if size < fixed + COM_MIN + 64 {
        return Err(io::Error::other(format!("a JPEG image of {size} bytes is too small to write")));
    }
    let budget_bits = (size - fixed - COM_MIN) * 8;
    let blocks = (budget_bits / FULL_BITS).max(1);
    let wide = blocks.min(BLOCKS_WIDE);
    let blocks = blocks.div_ceil(wide) * wide;
    let mut full = (budget_bits.saturating_sub(blocks * EMPTY_BITS) / (FULL_BITS - EMPTY_BITS)).min(blocks);
    let (data, pad) = loop {
        let data = scan(blocks, full, seed);
        let pad = size as i64 - fixed as i64 - data.len() as i64;
        if pad == 0 || pad >= COM_MIN as i64 || full == 0 {
            break (data, pad);
        }
        full -= 1;
    };
    if pad < 0 || (1..COM_MIN as i64).contains(&pad) {
        return Err(io::Error::other(format!("cannot lay out a JPEG image of {size} bytes")));
    }
    if blocks / wide * 8 > u16::MAX as u64 {
        return Err(io::Error::other(format!("a JPEG image of {size} bytes is beyond 65535 lines of 512 pixels")));
    }
    let (w, h) = ((wide * 8) as u16, (blocks / wide * 8) as u16);
    let (head, tail) = tables(w, h);
    out.write_all(&[0xff, 0xd8])?;
    let mut pad = pad as u64;
    while pad > 0 {
        let mut seg = pad.min(65535 + 2);
        if (1..COM_MIN).contains(&(pad - seg)) {
            seg -= COM_MIN;
        }
        out.write_all(&[0xff, 0xfe])?;
        out.write_all(&((seg - 2) as u16).to_be_bytes())?;
        out.write_all(&vec![b' '; (seg - COM_MIN) as usize])?;
        pad -= seg;
    }
    out.write_all(&head)?;
    out.write_all(&data)?;
    out.write_all(&tail)
}

/// PIL's reads of a JPEG file of `size` bytes through Python's BufferedReader of `bs`
/// (the file's st_blksize): Image.open reads its 16-byte prefix (one buffer fill) and
/// parses the header from that buffer; decoding seeks back to 0 (the tile starts at the
/// file's start: libjpeg parses the header again) and reads 64 KiB at a time until the
/// read that reaches the end of the file.
pub fn pil_plan(size: u64, bs: u64) -> Vec<Req> {
    let mut f = PyFile::new(bs, size);
    f.read(16);
    f.seek(0);
    for _ in 0..size.div_ceil(PIL_BLOCK).max(1) {
        f.read(PIL_BLOCK);
    }
    f.out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_have_the_sample_size() {
        for size in [4096u64, 4097, 4100, 65536, 322957, 1 << 20] {
            let mut out = Vec::new();
            write(&mut out, size, 7).unwrap();
            assert_eq!(out.len() as u64, size);
            assert_eq!(&out[..2], [0xff, 0xd8]);
            assert_eq!(&out[out.len() - 2..], [0xff, 0xd9]);
        }
    }

    #[test]
    fn pil_plan_is_what_pil_read() {
        // strace of np.asarray(Image.open(f)) on a 181267-byte JPEG (st_blksize 4096).
        let want = [(0, 4096), (4096, 61440), (65536, 65536), (131072, 65536), (181267, 12288)];
        assert_eq!(pil_plan(181267, 4096), want);
    }
}
