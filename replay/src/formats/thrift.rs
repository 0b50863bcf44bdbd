//! Thrift's compact protocol, the writing half only: what a Parquet footer and page
//! headers need (structs, i32/i64, binary, lists, booleans). Parquet's metadata is small
//! and its layout must be known byte for byte before a file is written (parquet_files.rs),
//! so it is serialized here rather than through a generated Thrift binding.

/// Compact protocol type codes.
pub const BYTE: u8 = 3;
pub const I16: u8 = 4;
pub const I32: u8 = 5;
pub const I64: u8 = 6;
pub const BINARY: u8 = 8;
pub const STRUCT: u8 = 12;
const TRUE: u8 = 1;
const FALSE: u8 = 2;
const LIST: u8 = 9;

#[derive(Default)]
pub struct Writer {
    pub out: Vec<u8>,
    /// The last field id of each open struct (field headers hold the delta).
    last: Vec<i16>,
    id: i16,
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

pub fn varint_into(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

impl Writer {
    pub fn new() -> Writer {
        Writer::default()
    }

    fn field(&mut self, id: i16, ty: u8) {
        let delta = id - self.id;
        if (1..=15).contains(&delta) {
            self.out.push(((delta as u8) << 4) | ty);
        } else {
            self.out.push(ty);
            varint_into(&mut self.out, zigzag(id as i64));
        }
        self.id = id;
    }

    pub fn i16(&mut self, id: i16, v: i16) {
        self.field(id, I16);
        varint_into(&mut self.out, zigzag(v as i64));
    }

    pub fn i32(&mut self, id: i16, v: i32) {
        self.field(id, I32);
        varint_into(&mut self.out, zigzag(v as i64));
    }

    pub fn i64(&mut self, id: i16, v: i64) {
        self.field(id, I64);
        varint_into(&mut self.out, zigzag(v));
    }

    pub fn byte(&mut self, id: i16, v: i8) {
        self.field(id, BYTE);
        self.out.push(v as u8);
    }

    pub fn bool(&mut self, id: i16, v: bool) {
        self.field(id, if v { TRUE } else { FALSE });
    }

    pub fn binary(&mut self, id: i16, v: &[u8]) {
        self.field(id, BINARY);
        varint_into(&mut self.out, v.len() as u64);
        self.out.extend_from_slice(v);
    }

    /// A struct field; close it with `end`.
    pub fn begin(&mut self, id: i16) {
        self.field(id, STRUCT);
        self.open();
    }

    /// A struct as a list element (no field header); close it with `end`.
    pub fn open(&mut self) {
        self.last.push(self.id);
        self.id = 0;
    }

    pub fn end(&mut self) {
        self.out.push(0);
        self.id = self.last.pop().unwrap_or(0);
    }

    /// A list field of `n` elements of type `elem`, which the caller writes next.
    pub fn list(&mut self, id: i16, elem: u8, n: usize) {
        self.field(id, LIST);
        if n < 15 {
            self.out.push(((n as u8) << 4) | elem);
        } else {
            self.out.push(0xf0 | elem);
            varint_into(&mut self.out, n as u64);
        }
    }

    /// An i32 list element.
    pub fn elem_i32(&mut self, v: i32) {
        varint_into(&mut self.out, zigzag(v as i64));
    }

    /// A binary list element.
    pub fn elem_binary(&mut self, v: &[u8]) {
        varint_into(&mut self.out, v.len() as u64);
        self.out.extend_from_slice(v);
    }

    /// Ends the outermost struct (the message).
    pub fn finish(mut self) -> Vec<u8> {
        self.out.push(0);
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_encoding_of_known_values() {
        let mut w = Writer::new();
        w.i32(1, 1); // delta 1, I32, zigzag(1) = 2
        w.i64(4, -1); // delta 3, I64, zigzag(-1) = 1
        w.binary(20, b"ab"); // delta 16: long form, zigzag(20) = 40
        w.list(21, I32, 2);
        w.elem_i32(0);
        w.elem_i32(3);
        w.begin(22);
        w.bool(1, true);
        w.end();
        assert_eq!(w.finish(), [0x15, 2, 0x36, 1, 0x08, 40, 2, b'a', b'b', 0x19, 0x25, 0, 6, 0x1c, 0x11, 0, 0]);
    }
}
