//! The files of a workload's `dataset.format`, as datagen writes them, and the reads the
//! real readers issue on them (the read plans the workload mode replays).
//!
//! Files are valid files of their format, so the real readers can be run on them:
//! - `npz`: a zip with one member `x.npy`, stored uncompressed, laid out as numpy.savez
//!   writes it (Python's zipfile with a zip64 extra field in the local header);
//! - `npy`: numpy's format 1.0, a header padded to 64 bytes, then the array;
//! - `tfrecord`: records framed as TensorFlow writes them (length, masked CRC-32C of the
//!   length, data, masked CRC-32C of the data); the data are raw bytes, not a
//!   tf.train.Example;
//! - `hdf5`: what h5py writes for DLIO's hdf5 generator, a dataset `records_0`
//!   (contiguous, or chunked along the samples) and `labels` (hdf5.rs);
//! - `indexed_binary`, `mmap_indexed_binary`: the samples back to back, with two index
//!   files beside each data file (indexed.rs);
//! - `parquet`: the columns of `dataset.parquet`, as pyarrow writes them for DLIO's
//!   parquet generator (parquet_files.rs);
//! - `jpeg`: baseline JPEG images that PIL decodes, of the record length (jpeg.rs);
//! - every other format (`png` among them, see docs/replay.md): opaque bytes, read whole.
//!
//! The array of an npz or npy file, and an hdf5 file's `records_0`, is `uint8` of shape
//! (samples per file, sample bytes): sample k is the k-th row.
//!
//! One file per format with more to it than a few lines, in formats/: hdf5.rs, jpeg.rs,
//! indexed.rs, parquet_files.rs (and thrift.rs, the Parquet footer's encoding).

pub mod hdf5;
pub mod indexed;
pub mod jpeg;
pub mod parquet_files;
pub mod thrift;

use std::io::{self, Read, Write};

/// The formats whose files datagen writes in their own layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Npz,
    Npy,
    TfRecord,
    /// Rows per chunk of `records_0` (0: contiguous; hdf5.rs).
    Hdf5(u64),
    /// DLIO's indexed_binary and mmap_indexed_binary (indexed.rs): the samples back to back.
    IndexedBinary,
    MmapIndexedBinary,
    /// Columns in row groups (parquet_files.rs: the layout is the dataset's `Layout`).
    Parquet,
    /// One baseline JPEG image a file (jpeg.rs).
    Jpeg,
    /// Opaque bytes (png, and the formats trainio does not lay out).
    Raw,
}

impl Format {
    pub fn parse(name: &str) -> Format {
        match name.to_ascii_lowercase().as_str() {
            "npz" => Format::Npz,
            "npy" => Format::Npy,
            "tfrecord" => Format::TfRecord,
            "hdf5" => Format::Hdf5(0),
            "indexed_binary" => Format::IndexedBinary,
            "mmap_indexed_binary" => Format::MmapIndexedBinary,
            "parquet" => Format::Parquet,
            "jpeg" => Format::Jpeg,
            _ => Format::Raw,
        }
    }
}

/// The name numpy.savez gives the array (`np.savez(f, x=a)`).
const NPZ_MEMBER: &[u8] = b"x.npy";
const ZIP_LOCAL: u64 = 30;
const ZIP64_EXTRA: u64 = 20;
const ZIP_CENTRAL: u64 = 46;
const ZIP_END: u64 = 22;
/// numpy's ARRAY_ALIGN and GROWTH_AXIS_MAX_DIGITS.
const NPY_ALIGN: usize = 64;
const NPY_GROWTH_DIGITS: usize = 21;
/// A TFRecord's framing: u64 length, u32 masked CRC of the length, then after the data a
/// u32 masked CRC of the data.
pub const TFRECORD_FRAME: u64 = 16;

/// numpy's .npy header (format 1.0) of a uint8 array of this shape, byte for byte as
/// numpy.save writes it.
pub fn npy_header(shape: &[u64]) -> Vec<u8> {
    let dims = match shape {
        [one] => format!("({one},)"),
        _ => format!("({})", shape.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")),
    };
    let mut dict = format!("{{'descr': '|u1', 'fortran_order': False, 'shape': {dims}, }}");
    // Room to grow the first axis in place (numpy's _write_array_header).
    let first = shape.first().map_or(0, |d| d.to_string().len());
    dict.push_str(&" ".repeat(NPY_GROWTH_DIGITS.saturating_sub(first)));
    // numpy's _wrap_header: magic, version, u16 length, dict, spaces and '\n' to a multiple
    // of 64 (a whole 64 more when it is already one).
    let hlen = dict.len() + 1;
    let pad = NPY_ALIGN - (10 + hlen) % NPY_ALIGN;
    dict.push_str(&" ".repeat(pad));
    dict.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out
}

/// Where the parts of a file of `format` with `spf` samples of `sample` bytes lie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub size: u64,
    /// Offset of sample 0's bytes; sample k starts at `data + k × sample` (npz, npy, hdf5, raw)
    /// or `k × (sample + 16) + 12` (tfrecord).
    pub data: u64,
    /// npz: the member's bytes (npy header and array) and the central directory's offset.
    pub member: u64,
    pub central: u64,
    /// npz, npy: the npy header's length.
    pub header: u64,
}

pub fn shape(format: Format, spf: u64, sample: u64) -> Shape {
    let payload = spf * sample;
    match format {
        // A Parquet file's size comes from its layout (parquet_files.rs), not from here.
        Format::Raw | Format::IndexedBinary | Format::MmapIndexedBinary | Format::Parquet => {
            Shape { size: payload, data: 0, member: 0, central: 0, header: 0 }
        }
        // One image a file, of the sample's bytes, whatever the samples per file.
        Format::Jpeg => Shape { size: sample, data: 0, member: 0, central: 0, header: 0 },
        Format::Npy => {
            let header = npy_header(&[spf, sample]).len() as u64;
            Shape { size: header + payload, data: header, member: 0, central: 0, header }
        }
        Format::Npz => {
            let header = npy_header(&[spf, sample]).len() as u64;
            let start = ZIP_LOCAL + NPZ_MEMBER.len() as u64 + ZIP64_EXTRA;
            let member = header + payload;
            let central = start + member;
            let size = central + ZIP_CENTRAL + NPZ_MEMBER.len() as u64 + ZIP_END;
            Shape { size, data: start + header, member, central, header }
        }
        Format::TfRecord => Shape { size: spf * (sample + TFRECORD_FRAME), data: 12, member: 0, central: 0, header: 0 },
        Format::Hdf5(c) => {
            Shape { size: hdf5::size(spf, sample, c), data: hdf5::DATA, member: 0, central: 0, header: 0 }
        }
    }
}

/// CRC-32C (Castagnoli), as TFRecord frames use it.
pub fn crc32c(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut t = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 { 0x82F6_3B78 ^ (c >> 1) } else { c >> 1 };
                k += 1;
            }
            t[i] = c;
            i += 1;
        }
        t
    };
    let mut crc = !0u32;
    for &b in data {
        crc = TABLE[((crc ^ b as u32) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

/// TFRecord's masked CRC (tensorflow/core/lib/hash/crc32c.h).
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let c = crc32c(data);
    (c.rotate_right(15)).wrapping_add(0xa282_ead8)
}

/// Writes one file of `format`: `spf` samples of `sample` bytes, whose bytes `fill` makes
/// (called with a buffer and the payload offset it starts at). Returns bytes to write
/// over what was written, at an offset (the npz local header's CRC, which Python's
/// zipfile also writes last, seeking back).
pub fn write_file(
    format: Format,
    out: &mut impl Write,
    spf: u64,
    sample: u64,
    fill: &mut dyn FnMut(&mut [u8], u64),
) -> io::Result<Option<(u64, [u8; 4])>> {
    let mut buf = vec![0u8; (1 << 20).min(sample.max(1) * spf) as usize];
    // Streams `n` payload bytes through `fill`, feeding `hash` when given.
    let mut payload = |out: &mut dyn Write, from: u64, n: u64, hash: &mut Option<&mut crc32fast::Hasher>| {
        let mut done = 0;
        while done < n {
            let k = (n - done).min(buf.len() as u64) as usize;
            fill(&mut buf[..k], from + done);
            if let Some(h) = hash.as_deref_mut() {
                h.update(&buf[..k]);
            }
            out.write_all(&buf[..k])?;
            done += k as u64;
        }
        io::Result::Ok(())
    };
    match format {
        Format::Raw | Format::IndexedBinary | Format::MmapIndexedBinary => {
            payload(out, 0, spf * sample, &mut None).map(|_| None)
        }
        // Written by their own modules (dataset.rs calls them), which read plans from here.
        Format::Parquet => Err(io::Error::other("a Parquet file is written from its layout (parquet_files.rs)")),
        Format::Jpeg => Err(io::Error::other("a JPEG image is written by jpeg.rs")),
        Format::Npy => {
            out.write_all(&npy_header(&[spf, sample]))?;
            payload(out, 0, spf * sample, &mut None).map(|_| None)
        }
        Format::Hdf5(c) => {
            out.write_all(&hdf5::metadata(spf, sample, c))?;
            payload(out, 0, spf * sample, &mut None)?;
            io::copy(&mut io::repeat(0).take(hdf5::payload(spf, sample, c) - spf * sample), out)?;
            out.write_all(&hdf5::labels(spf)).map(|_| None)
        }
        Format::Npz => {
            let s = shape(format, spf, sample);
            if s.size >= u32::MAX as u64 {
                return Err(io::Error::other(format!(
                    "an npz file of {} bytes needs zip64 central records, which datagen does not write",
                    s.size
                )));
            }
            // Local header as numpy.savez's zipfile writes it: version 4.5, stored, the
            // DOS date 1980-01-01, sizes in a zip64 extra field.
            let mut local = Vec::with_capacity(55);
            local.extend_from_slice(b"PK\x03\x04");
            local.extend_from_slice(&45u16.to_le_bytes());
            local.extend_from_slice(&[0, 0, 0, 0, 0, 0]); // flags, method, time
            local.extend_from_slice(&0x21u16.to_le_bytes()); // date
            local.extend_from_slice(&0u32.to_le_bytes()); // CRC, patched below
            local.extend_from_slice(&u32::MAX.to_le_bytes());
            local.extend_from_slice(&u32::MAX.to_le_bytes());
            local.extend_from_slice(&(NPZ_MEMBER.len() as u16).to_le_bytes());
            local.extend_from_slice(&(ZIP64_EXTRA as u16).to_le_bytes());
            local.extend_from_slice(NPZ_MEMBER);
            local.extend_from_slice(&1u16.to_le_bytes());
            local.extend_from_slice(&16u16.to_le_bytes());
            local.extend_from_slice(&s.member.to_le_bytes());
            local.extend_from_slice(&s.member.to_le_bytes());
            out.write_all(&local)?;
            let mut hasher = crc32fast::Hasher::new();
            let header = npy_header(&[spf, sample]);
            hasher.update(&header);
            out.write_all(&header)?;
            payload(out, 0, spf * sample, &mut Some(&mut hasher))?;
            let crc = hasher.finalize();
            let mut central = Vec::with_capacity(73);
            central.extend_from_slice(b"PK\x01\x02");
            central.extend_from_slice(&0x032du16.to_le_bytes()); // made by: Unix, 4.5
            central.extend_from_slice(&45u16.to_le_bytes());
            central.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
            central.extend_from_slice(&0x21u16.to_le_bytes());
            central.extend_from_slice(&crc.to_le_bytes());
            central.extend_from_slice(&(s.member as u32).to_le_bytes());
            central.extend_from_slice(&(s.member as u32).to_le_bytes());
            central.extend_from_slice(&(NPZ_MEMBER.len() as u16).to_le_bytes());
            central.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0]); // extra, comment, disk, internal attributes
            central.extend_from_slice(&0x0180_0000u32.to_le_bytes()); // mode 0600
            central.extend_from_slice(&0u32.to_le_bytes()); // the local header's offset
            central.extend_from_slice(NPZ_MEMBER);
            central.extend_from_slice(b"PK\x05\x06");
            central.extend_from_slice(&[0, 0, 0, 0]);
            central.extend_from_slice(&1u16.to_le_bytes());
            central.extend_from_slice(&1u16.to_le_bytes());
            central.extend_from_slice(&((ZIP_CENTRAL + NPZ_MEMBER.len() as u64) as u32).to_le_bytes());
            central.extend_from_slice(&(s.central as u32).to_le_bytes());
            central.extend_from_slice(&0u16.to_le_bytes());
            out.write_all(&central)?;
            Ok(Some((14, crc.to_le_bytes())))
        }
        Format::TfRecord => {
            let mut record = vec![0u8; sample as usize];
            for k in 0..spf {
                fill(&mut record, k * sample);
                let len = sample.to_le_bytes();
                out.write_all(&len)?;
                out.write_all(&masked_crc32c(&len).to_le_bytes())?;
                out.write_all(&record)?;
                out.write_all(&masked_crc32c(&record).to_le_bytes())?;
            }
            Ok(None)
        }
    }
}

/// One read request of a plan: (offset, bytes asked).
pub type Req = (u64, u64);

/// CPython's `io.BufferedReader` (Modules/_io/bufferedio.c) over a file of `size` bytes
/// with a buffer of `bs` (the file's st_blksize): the read syscalls a sequence of reads
/// and seeks makes. The buffer holds `[start, end)`; the raw file position is `end`.
pub struct PyFile {
    bs: u64,
    size: u64,
    start: u64,
    end: u64,
    pos: u64,
    pub out: Vec<Req>,
}

impl PyFile {
    pub fn new(bs: u64, size: u64) -> PyFile {
        PyFile { bs, size, start: 0, end: 0, pos: 0, out: Vec::new() }
    }

    /// A read syscall at the raw position; returns the bytes it got.
    fn raw(&mut self, n: u64) -> u64 {
        self.out.push((self.end, n));
        let got = n.min(self.size.saturating_sub(self.end));
        self.end += got;
        got
    }

    /// seek(target, SEEK_SET/SEEK_CUR): within the buffer when some of it is left,
    /// otherwise an lseek that drops the buffer.
    pub fn seek(&mut self, target: u64) {
        if self.end > self.pos && target >= self.start && target <= self.end {
            self.pos = target;
        } else {
            self.start = target;
            self.end = target;
            self.pos = target;
        }
    }

    /// seek(offset, SEEK_END): always an lseek.
    fn seek_end(&mut self, back: u64) {
        let t = self.size.saturating_sub(back);
        self.start = t;
        self.end = t;
        self.pos = t;
    }

    /// read(n): from the buffer; else what is left of it, then whole buffers' worth
    /// straight into the caller's memory, then one buffer fill for the rest.
    pub fn read(&mut self, n: u64) {
        let avail = self.end - self.pos;
        if n <= avail {
            self.pos += n;
            return;
        }
        let mut remaining = n - avail;
        self.start = self.end;
        self.pos = self.end;
        loop {
            let r = remaining / self.bs * self.bs;
            if r == 0 {
                break;
            }
            let got = self.raw(r);
            remaining -= got;
            if got == 0 {
                self.start = self.end;
                self.pos = self.end;
                return;
            }
        }
        self.start = self.end;
        self.pos = self.end;
        while remaining > 0 && self.end - self.start < self.bs {
            let got = self.raw(self.bs - (self.end - self.start));
            if got == 0 {
                break;
            }
            let take = remaining.min(got);
            self.pos += take;
            remaining -= take;
        }
    }

    /// read() to the end: FileIO.readall (CPython 3.11) sizes one read from fstat, then a
    /// 1-byte read finds the end.
    fn read_all(&mut self) {
        self.start = self.end;
        let left = self.size.saturating_sub(self.end);
        self.raw(left + 1);
        self.raw(1);
        self.start = self.end;
        self.pos = self.end;
    }
}

/// zipfile's ZipExtFile of a stored member over a _SharedFile: reads of at least 4096
/// (MIN_READ_SIZE), what a read got beyond what was asked kept in its own buffer.
struct ZipExt {
    shared: u64,
    left: u64,
    rb_len: u64,
    rb_off: u64,
}

impl ZipExt {
    fn shared_read(&mut self, f: &mut PyFile, n: u64) {
        f.seek(self.shared);
        f.read(n);
        self.shared = f.pos;
    }

    fn read(&mut self, f: &mut PyFile, n: u64) {
        let end = n + self.rb_off;
        if end < self.rb_len {
            self.rb_off = end;
            return;
        }
        let mut n = end - self.rb_len;
        self.rb_len = 0;
        self.rb_off = 0;
        while n > 0 && self.left > 0 {
            let want = n.max(4096).min(self.left);
            self.shared_read(f, want);
            self.left -= want;
            if n < want {
                self.rb_len = want;
                self.rb_off = n;
                break;
            }
            n -= want;
        }
    }
}

/// numpy.load's reads of an npz written by datagen (`np.load(f)["x"]`, numpy 2.x under
/// CPython 3.11): the magic, zipfile's search for the end records, the central
/// directory, the member's local header, then the array through ZipExtFile in numpy's
/// 256 KiB chunks (format.read_array), all through a BufferedReader of `bs` bytes.
/// Measured with `trainio record` on numpy.load (docs/design/formats.md).
pub fn npz_plan(s: &Shape, bs: u64) -> Vec<Req> {
    let mut f = PyFile::new(bs, s.size);
    // np.load: the magic, then back to 0.
    f.read(6);
    f.seek(0);
    // zipfile._EndRecData: the end record (read to the end), the zip64 locator before it.
    f.seek_end(0);
    f.seek_end(ZIP_END);
    f.read_all();
    f.seek_end(ZIP_END + 20);
    f.read(20);
    // _RealGetContents: the central directory.
    f.seek(s.central);
    f.read(ZIP_CENTRAL + NPZ_MEMBER.len() as u64);
    // ZipFile.open: the local header through a _SharedFile (a seek to its own position
    // before every read), then the member through a ZipExtFile.
    let mut z = ZipExt { shared: 0, left: s.member, rb_len: 0, rb_off: 0 };
    z.shared_read(&mut f, ZIP_LOCAL);
    z.shared_read(&mut f, NPZ_MEMBER.len() as u64);
    z.shared_read(&mut f, ZIP64_EXTRA);
    // NpzFile.__getitem__: the magic, then seek(0) within ZipExtFile's buffer.
    z.read(&mut f, 6);
    z.rb_off = 0;
    // format.read_array: magic and version, header length, header, then the data.
    z.read(&mut f, 8);
    z.read(&mut f, 2);
    z.read(&mut f, s.header - 10);
    let mut data = s.member - s.header;
    while data > 0 {
        let n = data.min(NUMPY_BUFFER);
        z.read(&mut f, n);
        data -= n;
    }
    f.out
}

/// numpy.format.BUFFER_SIZE: read_array reads a non-file stream in chunks of this.
pub const NUMPY_BUFFER: u64 = 1 << 18;

/// numpy.load's reads of an npy (numpy 2.x, CPython 3.11, glibc): the magic through a
/// BufferedReader, then numpy.fromfile on a dup of the descriptor through a glibc FILE
/// of `bs` bytes (its seek to the data reads the header again, its fread reads whole
/// buffers straight into the array, then one buffer for the tail).
pub fn npy_plan(s: &Shape, bs: u64) -> Vec<Req> {
    let mut out = vec![(0, bs), (0, s.header), (0, bs)];
    let have = bs.saturating_sub(s.header).min(s.size - s.header);
    let want = s.size - s.header - have;
    let direct = want / bs * bs;
    if direct > 0 {
        out.push((bs, direct));
    }
    if want > direct {
        out.push((bs + direct, bs));
    }
    out
}

/// TensorFlow's RecordReader over a file of `size` bytes with an input buffer of
/// `buffer`: preads of `buffer` from 0 to the end; the one that returns less than asked
/// is followed by a pread for the rest (PosixRandomAccessFile::Read reads until a pread
/// returns 0), then one more at the end for the next record's header, which returns 0.
pub fn tfrecord_plan(size: u64, buffer: u64) -> Vec<Req> {
    let mut out: Vec<Req> = (0..size.div_ceil(buffer)).map(|k| (k * buffer, buffer)).collect();
    if !size.is_multiple_of(buffer) {
        out.push((size, buffer - size % buffer));
    }
    out.push((size, buffer));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_header_is_numpys() {
        // numpy.save of np.zeros((1, 3145828), np.uint8), first 128 bytes.
        let h = npy_header(&[1, 3145828]);
        assert_eq!(h.len(), 128);
        assert_eq!(&h[..10], b"\x93NUMPY\x01\x00\x76\x00");
        let text = std::str::from_utf8(&h[10..]).unwrap();
        assert!(text.starts_with("{'descr': '|u1', 'fortran_order': False, 'shape': (1, 3145828), }"), "{text}");
        assert!(text.ends_with(" \n"));
    }

    #[test]
    fn crc32c_known_values() {
        // RFC 3720's test vector: 32 bytes of zeros.
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn npz_layout_adds_up() {
        let s = shape(Format::Npz, 1, 3145828);
        // numpy.savez of the same array: 3146084 bytes (measured).
        assert_eq!(s.size, 3146084);
        assert_eq!(s.data, 55 + 128);
        let mut out = Vec::new();
        let patched = write_file(Format::Npz, &mut out, 1, 3145828, &mut |b, _| b.fill(7)).unwrap();
        assert_eq!(out.len() as u64, s.size);
        assert_eq!(&out[s.central as usize..s.central as usize + 4], b"PK\x01\x02");
        assert_eq!(patched.unwrap().0, 14);
    }
    #[test]
    fn npz_plan_is_what_numpy_load_read() {
        // strace of np.load(f)["x"] on numpy.savez's 3146084-byte npz (st_blksize 4096).
        let s = shape(Format::Npz, 1, 3145828);
        let plan = npz_plan(&s, 4096);
        let size = 3146084;
        let mut want = vec![
            (0, 4096),
            (size - 22, 23),
            (size, 1),
            (size - 42, 4096),
            (3146011, 4096),
            (0, 4096),
            (4096, 4096),
            (8192, 253952),
            (262144, 4096),
        ];
        let mut at = 266240;
        while at + 258048 < size {
            want.push((at, 258048));
            want.push((at + 258048, 4096));
            at += 262144;
        }
        assert_eq!(&plan[..want.len()], &want[..]);
        assert_eq!(plan.len(), want.len(), "{:?}", &plan[want.len()..]);
        assert_eq!(*plan.last().unwrap(), (3145728, 4096), "the last fill reaches the end");
    }

    #[test]
    fn npy_plan_is_what_numpy_load_read() {
        let s = shape(Format::Npy, 1, 3145828);
        assert_eq!(s.size, 3145956);
        assert_eq!(npy_plan(&s, 4096), [(0, 4096), (0, 128), (0, 4096), (4096, 3141632), (3145728, 4096)]);
    }

    #[test]
    fn tfrecord_plan_streams_the_file() {
        assert_eq!(tfrecord_plan(600, 256), [(0, 256), (256, 256), (512, 256), (600, 168), (600, 256)]);
        assert_eq!(tfrecord_plan(512, 256), [(0, 256), (256, 256), (512, 256)]);
    }
}
