//! Parquet files of a workload's `dataset.parquet` section, as DLIO's parquet generator
//! writes them with pyarrow, and the reads pyarrow's `ParquetFile.read_row_group` makes
//! on them (the read plans the workload mode replays; docs/design/formats.md).
//!
//! The file: `PAR1`, then per row group one column chunk per column, then the footer
//! (Thrift compact FileMetaData), its length and `PAR1`. Each column is what pyarrow
//! writes for DLIO's column spec: `size: 1` a required scalar, `size: N` a required
//! LIST of N elements (pyarrow's FixedSizeList). Physical types are pyarrow's: 8- to
//! 32-bit integers as INT32 (4 bytes a value), 64-bit as INT64, float16 as a 2-byte
//! FIXED_LEN_BYTE_ARRAY with the FLOAT16 logical type, float32 as FLOAT, float64 as
//! DOUBLE. Pages hold whole rows, about 1 MiB of values each (pyarrow's data page size),
//! PLAIN-encoded, with no dictionary and no statistics, so that every size, and so the
//! whole layout, follows from the spec before a byte is written.
//!
//! Compression is real and readable by any Parquet reader, and of known size: SNAPPY
//! streams of literals, GZIP members of stored deflate blocks. The data are random bytes,
//! which a compressor would store at about that size anyway.

use crate::formats::thrift::{self, Writer};
use crate::yaml_keys::{short, string, uint};
use anyhow::{bail, Result};
use serde_yaml::Value;
use std::io::{self, Write};

/// pyarrow's default data page size: a page is cut after about this many value bytes.
pub const PAGE_BYTES: u64 = 1 << 20;
/// pyarrow's default footer read: the last 64 KiB of the file in one read.
pub const FOOTER_READ: u64 = 64 << 10;
/// Arrow's read coalescing (io::CacheOptions::Defaults): ranges closer than this are
/// read together, ...
pub const HOLE_LIMIT: u64 = 8 << 10;
/// ... as long as the read they make stays within this.
pub const RANGE_LIMIT: u64 = 32 << 20;
/// The most bytes a row of one column may take: a page holds at least a row, and a
/// page's size is a Thrift i32 (with room for the levels and the codec's framing).
pub const MAX_ROW: u64 = 1 << 30;
/// DLIO's default `parquet.row_group_size` (dlio_benchmark/utils/config.py).
pub const DEFAULT_ROW_GROUP: u64 = 1_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    Int8,
    Int16,
    Int32,
    Int64,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Float16,
    Float32,
    Float64,
}

// Parquet's physical types and the converted types the integers carry.
const INT32: i32 = 1;
const INT64: i32 = 2;
const FLOAT: i32 = 4;
const DOUBLE: i32 = 5;
const FIXED_LEN_BYTE_ARRAY: i32 = 7;
const REQUIRED: i32 = 0;
const REPEATED: i32 = 2;
const CONVERTED_LIST: i32 = 3;
const PLAIN: i32 = 0;
const RLE: i32 = 3;

impl Dtype {
    fn parse(name: &str) -> Option<Dtype> {
        Some(match name {
            "int8" => Dtype::Int8,
            "int16" => Dtype::Int16,
            "int32" => Dtype::Int32,
            "int64" => Dtype::Int64,
            "uint8" => Dtype::Uint8,
            "uint16" => Dtype::Uint16,
            "uint32" => Dtype::Uint32,
            "uint64" => Dtype::Uint64,
            "float16" => Dtype::Float16,
            // DLIO's `list` is a list of float32.
            "float32" | "list" => Dtype::Float32,
            "float64" => Dtype::Float64,
            _ => return None,
        })
    }

    /// Bytes of one value in the file.
    pub fn width(self) -> u64 {
        match self {
            Dtype::Int64 | Dtype::Uint64 | Dtype::Float64 => 8,
            Dtype::Float16 => 2,
            _ => 4,
        }
    }

    fn physical(self) -> i32 {
        match self {
            Dtype::Int64 | Dtype::Uint64 => INT64,
            Dtype::Float16 => FIXED_LEN_BYTE_ARRAY,
            Dtype::Float32 => FLOAT,
            Dtype::Float64 => DOUBLE,
            _ => INT32,
        }
    }

    /// (bits, signed) of an integer type.
    fn integer(self) -> Option<(i8, bool)> {
        match self {
            Dtype::Int8 => Some((8, true)),
            Dtype::Int16 => Some((16, true)),
            Dtype::Int32 => Some((32, true)),
            Dtype::Int64 => Some((64, true)),
            Dtype::Uint8 => Some((8, false)),
            Dtype::Uint16 => Some((16, false)),
            Dtype::Uint32 => Some((32, false)),
            Dtype::Uint64 => Some((64, false)),
            _ => None,
        }
    }

    /// The schema element's type fields: type, type_length, converted_type, logicalType.
    fn schema_fields(self, w: &mut Writer) {
        w.i32(1, self.physical());
        if self == Dtype::Float16 {
            w.i32(2, 2);
        }
        w.i32(3, REQUIRED);
    }

    fn logical_fields(self, w: &mut Writer) {
        if let Some((bits, signed)) = self.integer() {
            // INT_8 … INT_64 are 15 … 18, UINT_8 … UINT_64 11 … 14.
            let base = if signed { 15 } else { 11 };
            w.i32(6, base + bits.trailing_zeros() as i32 - 3);
            w.begin(10);
            w.begin(10);
            w.byte(1, bits);
            w.bool(2, signed);
            w.end();
            w.end();
        } else if self == Dtype::Float16 {
            w.begin(10);
            w.begin(15);
            w.end();
            w.end();
        }
    }

    /// Rewrites random bytes of `values` into valid values of this type: a narrow
    /// integer stored in INT32 is its sign- or zero-extended low bytes.
    fn shape_values(self, values: &mut [u8]) {
        let narrow = match self.integer() {
            Some((bits, signed)) if bits < 32 => (bits, signed),
            _ => return,
        };
        for v in values.chunks_exact_mut(4) {
            let x = u32::from_le_bytes([v[0], v[1], v[2], v[3]]);
            let y = match narrow {
                (8, true) => x as u8 as i8 as i32 as u32,
                (8, false) => x & 0xff,
                (16, true) => x as u16 as i16 as i32 as u32,
                _ => x & 0xffff,
            };
            v.copy_from_slice(&y.to_le_bytes());
        }
    }
}

/// One column of `dataset.parquet.columns`.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    pub name: String,
    pub dtype: Dtype,
    /// Values per row (DLIO's `size`): 1 is a scalar, more a list.
    pub size: u64,
    /// DLIO's `read` flag: whether the reader asks for this column.
    pub read: bool,
}

impl Column {
    /// Bytes of one row of this column's values.
    pub fn row_bytes(&self) -> u64 {
        self.size * self.dtype.width()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    None,
    Snappy,
    Gzip,
}

impl Codec {
    fn thrift(self) -> i32 {
        match self {
            Codec::None => 0,
            Codec::Snappy => 1,
            Codec::Gzip => 2,
        }
    }

    /// Bytes `n` bytes take stored by this codec (literal snappy, stored deflate).
    fn stored(self, n: u64) -> u64 {
        match self {
            Codec::None => n,
            Codec::Snappy => varint_len(n) + n + 3 * n.div_ceil(SNAPPY_LITERAL),
            Codec::Gzip => 10 + n + 5 * n.div_ceil(DEFLATE_STORED).max(1) + 8,
        }
    }

    fn write(self, out: &mut impl Write, data: &[u8]) -> io::Result<()> {
        match self {
            Codec::None => out.write_all(data),
            Codec::Snappy => {
                let mut head = Vec::new();
                thrift::varint_into(&mut head, data.len() as u64);
                out.write_all(&head)?;
                for chunk in data.chunks(SNAPPY_LITERAL as usize) {
                    // A literal of 1..=65536 bytes: tag 61 << 2, then its length - 1 in 2 bytes.
                    out.write_all(&[61 << 2])?;
                    out.write_all(&((chunk.len() - 1) as u16).to_le_bytes())?;
                    out.write_all(chunk)?;
                }
                Ok(())
            }
            Codec::Gzip => {
                out.write_all(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff])?;
                let chunks: Vec<&[u8]> =
                    if data.is_empty() { vec![&[][..]] } else { data.chunks(DEFLATE_STORED as usize).collect() };
                for (i, chunk) in chunks.iter().enumerate() {
                    let len = chunk.len() as u16;
                    out.write_all(&[(i + 1 == chunks.len()) as u8])?;
                    out.write_all(&len.to_le_bytes())?;
                    out.write_all(&(!len).to_le_bytes())?;
                    out.write_all(chunk)?;
                }
                out.write_all(&crc32fast::hash(data).to_le_bytes())?;
                out.write_all(&(data.len() as u32).to_le_bytes())
            }
        }
    }
}

const SNAPPY_LITERAL: u64 = 1 << 16;
const DEFLATE_STORED: u64 = 65535;

fn varint_len(n: u64) -> u64 {
    let mut v = Vec::new();
    thrift::varint_into(&mut v, n);
    v.len() as u64
}

/// `dataset.parquet` (and `dataset.compression`) of a workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    pub columns: Vec<Column>,
    pub row_group_size: u64,
    /// DLIO's `generation_batch_size`: rows per table the generator writes (0: a row
    /// group's); a table's rows are cut into row groups of their own.
    pub generation_batch: u64,
    pub codec: Codec,
    /// Row groups a reader keeps (`row_group_cache_size`, default 1: DLIO's reader keeps
    /// the row group it read last).
    pub cache: u64,
}

impl Spec {
    /// Reads `dataset.parquet`; `record_length` makes DLIO's single `data` column of
    /// uint8 when no columns are given.
    pub fn from_dataset(dataset: &Value, record_length: f64) -> Result<Spec> {
        let empty = Value::Mapping(Default::default());
        let pq = match dataset.get("parquet") {
            None | Some(Value::Null) => &empty,
            Some(v @ Value::Mapping(_)) => v,
            Some(v) => bail!("dataset.parquet must be a mapping, got {}", short(v)),
        };
        let mut columns = Vec::new();
        match pq.get("columns") {
            None | Some(Value::Null) => columns.push(Column {
                name: "data".into(),
                dtype: Dtype::Uint8,
                size: (record_length.ceil() as u64).max(1),
                read: true,
            }),
            Some(Value::Sequence(cols)) => {
                for (i, c) in cols.iter().enumerate() {
                    columns.push(column(c, i)?);
                }
            }
            Some(v) => bail!("dataset.parquet.columns must be a list of columns, got {}", short(v)),
        }
        if columns.is_empty() {
            bail!("dataset.parquet.columns is empty: give at least one column");
        }
        if let Some(c) = columns.iter().find(|c| c.row_bytes() > MAX_ROW) {
            bail!(
                "dataset.parquet.columns: a row of column '{}' is {} bytes, more than a Parquet page holds ({MAX_ROW})",
                c.name,
                c.row_bytes()
            );
        }
        let row_group_size = uint(pq, "dataset.parquet", "row_group_size")?.unwrap_or(DEFAULT_ROW_GROUP);
        if row_group_size == 0 {
            bail!("dataset.parquet.row_group_size must be at least 1");
        }
        let generation_batch = uint(pq, "dataset.parquet", "generation_batch_size")?.unwrap_or(0);
        let cache = uint(pq, "dataset.parquet", "row_group_cache_size")?.unwrap_or(1).max(1);
        match string(pq, "read_mode").as_deref() {
            None | Some("default") | Some("row_group") => {}
            Some(other) => {
                bail!("dataset.parquet.read_mode must be default or row_group (DLIO's two modes), got '{other}'")
            }
        }
        let codec = match string(dataset, "compression").map(|s| s.to_ascii_lowercase()).as_deref() {
            None | Some("none") => Codec::None,
            Some("snappy") => Codec::Snappy,
            Some("gzip") => Codec::Gzip,
            Some(other) => {
                bail!("dataset.compression: '{other}' is not a codec trainio writes Parquet with (none, snappy, gzip)")
            }
        };
        Ok(Spec { columns, row_group_size, generation_batch, codec, cache })
    }

    /// Bytes of one row's values, all columns.
    pub fn row_bytes(&self) -> u64 {
        self.columns.iter().map(Column::row_bytes).sum()
    }

    /// Indices of the columns the reader asks for: those whose `read` is true (all of
    /// them when none is, as DLIO's reader then passes no column list).
    pub fn read_columns(&self) -> Vec<usize> {
        let read: Vec<usize> = (0..self.columns.len()).filter(|&c| self.columns[c].read).collect();
        if read.is_empty() {
            (0..self.columns.len()).collect()
        } else {
            read
        }
    }

    /// Rows of each row group of a file of `rows` rows.
    fn row_groups(&self, rows: u64) -> Vec<u64> {
        let batch = if self.generation_batch > 0 { self.generation_batch } else { self.row_group_size };
        let mut out = Vec::new();
        let mut left = rows;
        while left > 0 {
            let mut in_batch = left.min(batch);
            left -= in_batch;
            while in_batch > 0 {
                let n = in_batch.min(self.row_group_size);
                out.push(n);
                in_batch -= n;
            }
        }
        out
    }
}

fn column(c: &Value, i: usize) -> Result<Column> {
    let key = format!("dataset.parquet.columns[{i}]");
    let Some(_) = c.as_mapping() else {
        bail!("{key} must be a mapping with name, dtype, size and read, got {}", short(c));
    };
    let name = string(c, "name").unwrap_or_else(|| "data".into());
    let dtype_name = string(c, "dtype").unwrap_or_else(|| "float32".into()).to_ascii_lowercase();
    let Some(dtype) = Dtype::parse(&dtype_name) else {
        bail!(
            "{key}.dtype: '{dtype_name}' is not a numeric type trainio writes (int8-64, uint8-64, float16, float32, float64, list)"
        );
    };
    let size = uint(c, &key, "size")?.unwrap_or(1);
    if size == 0 {
        bail!("{key}.size must be at least 1");
    }
    let read = crate::yaml_keys::boolean(c, &key, "read")?.unwrap_or(true);
    Ok(Column { name, dtype, size, read })
}

/// One data page: its header, the rows it holds, and its payload's bytes before and
/// after compression.
#[derive(Debug, Clone)]
struct Page {
    header: Vec<u8>,
    rows: u64,
    raw: u64,
}

/// A column chunk: where it starts, its stored bytes, its pages.
#[derive(Debug, Clone)]
pub struct Chunk {
    pub start: u64,
    pub len: u64,
    raw_len: u64,
    pages: Vec<Page>,
}

#[derive(Debug, Clone)]
pub struct RowGroup {
    pub rows: u64,
    pub chunks: Vec<Chunk>,
}

/// Where everything of a file lies.
#[derive(Debug, Clone)]
pub struct FileLayout {
    pub spec: Spec,
    pub row_groups: Vec<RowGroup>,
    /// The FileMetaData, serialized.
    pub footer: Vec<u8>,
    pub size: u64,
}

/// The repetition levels of `rows` lists of `size` values (RLE runs: a 0 opens each
/// list, `size - 1` ones continue it), with their 4-byte length.
fn rep_levels(rows: u64, size: u64) -> Vec<u8> {
    let mut run = Vec::new();
    thrift::varint_into(&mut run, 1 << 1);
    run.push(0);
    thrift::varint_into(&mut run, (size - 1) << 1);
    run.push(1);
    let mut out = Vec::with_capacity(4 + run.len() * rows as usize);
    out.extend_from_slice(&((run.len() as u64 * rows) as u32).to_le_bytes());
    for _ in 0..rows {
        out.extend_from_slice(&run);
    }
    out
}

/// The definition levels of `values` present values: one RLE run of ones.
fn def_levels(values: u64) -> Vec<u8> {
    let mut run = Vec::new();
    thrift::varint_into(&mut run, values << 1);
    run.push(1);
    let mut out = (run.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(&run);
    out
}

/// A page's level bytes (none for a scalar column).
fn levels(col: &Column, rows: u64) -> Vec<u8> {
    if col.size == 1 {
        return Vec::new();
    }
    let mut out = rep_levels(rows, col.size);
    out.extend(def_levels(rows * col.size));
    out
}

fn page_header(raw: u64, stored: u64, values: u64) -> Vec<u8> {
    let mut w = Writer::new();
    w.i32(1, 0); // DATA_PAGE
    w.i32(2, raw as i32);
    w.i32(3, stored as i32);
    w.begin(5);
    w.i32(1, values as i32);
    w.i32(2, PLAIN);
    w.i32(3, RLE);
    w.i32(4, RLE);
    w.end();
    w.finish()
}

impl FileLayout {
    /// The layout of a file of `rows` rows (a row of a column is at most MAX_ROW bytes,
    /// which Spec checks, so a page stays within Parquet's 2 GiB).
    pub fn new(spec: &Spec, rows: u64) -> FileLayout {
        let mut at = 4;
        let mut row_groups = Vec::new();
        for n in spec.row_groups(rows) {
            let mut chunks = Vec::with_capacity(spec.columns.len());
            for col in &spec.columns {
                let per_page = (PAGE_BYTES / col.row_bytes().max(1)).max(1);
                let (start, mut raw_len) = (at, 0);
                let mut pages = Vec::new();
                let mut left = n;
                while left > 0 {
                    let rows = left.min(per_page);
                    left -= rows;
                    let raw = levels(col, rows).len() as u64 + rows * col.row_bytes();
                    let stored = spec.codec.stored(raw);
                    let header = page_header(raw, stored, rows * col.size);
                    at += header.len() as u64 + stored;
                    raw_len += header.len() as u64 + raw;
                    pages.push(Page { header, rows, raw });
                }
                chunks.push(Chunk { start, len: at - start, raw_len, pages });
            }
            row_groups.push(RowGroup { rows: n, chunks });
        }
        let mut layout = FileLayout { spec: spec.clone(), row_groups, footer: Vec::new(), size: 0 };
        layout.footer = layout.file_metadata(rows);
        layout.size = at + layout.footer.len() as u64 + 8;
        layout
    }

    fn file_metadata(&self, rows: u64) -> Vec<u8> {
        let cols = &self.spec.columns;
        let mut w = Writer::new();
        w.i32(1, 1);
        let elements = 1 + cols.iter().map(|c| if c.size > 1 { 3 } else { 1 }).sum::<usize>();
        w.list(2, thrift::STRUCT, elements);
        w.open();
        w.binary(4, b"schema");
        w.i32(5, cols.len() as i32);
        w.end();
        for c in cols {
            if c.size > 1 {
                w.open();
                w.i32(3, REQUIRED);
                w.binary(4, c.name.as_bytes());
                w.i32(5, 1);
                w.i32(6, CONVERTED_LIST);
                w.begin(10);
                w.begin(3);
                w.end();
                w.end();
                w.end();
                w.open();
                w.i32(3, REPEATED);
                w.binary(4, b"list");
                w.i32(5, 1);
                w.end();
            }
            w.open();
            c.dtype.schema_fields(&mut w);
            w.binary(4, if c.size > 1 { b"element" } else { c.name.as_bytes() });
            c.dtype.logical_fields(&mut w);
            w.end();
        }
        w.i64(3, rows as i64);
        w.list(4, thrift::STRUCT, self.row_groups.len());
        for (ordinal, rg) in self.row_groups.iter().enumerate() {
            w.open();
            w.list(1, thrift::STRUCT, rg.chunks.len());
            for (c, chunk) in cols.iter().zip(&rg.chunks) {
                w.open();
                w.i64(2, chunk.start as i64);
                w.begin(3);
                w.i32(1, c.dtype.physical());
                let encodings: &[i32] = if c.size > 1 { &[PLAIN, RLE] } else { &[PLAIN] };
                w.list(2, thrift::I32, encodings.len());
                for &e in encodings {
                    w.elem_i32(e);
                }
                let path: Vec<&[u8]> =
                    if c.size > 1 { vec![c.name.as_bytes(), b"list", b"element"] } else { vec![c.name.as_bytes()] };
                w.list(3, thrift::BINARY, path.len());
                for p in path {
                    w.elem_binary(p);
                }
                w.i32(4, self.spec.codec.thrift());
                w.i64(5, (rg.rows * c.size) as i64);
                w.i64(6, chunk.raw_len as i64);
                w.i64(7, chunk.len as i64);
                w.i64(9, chunk.start as i64);
                w.end();
                w.end();
            }
            w.i64(2, rg.chunks.iter().map(|c| c.raw_len).sum::<u64>() as i64);
            w.i64(3, rg.rows as i64);
            w.i64(5, rg.chunks[0].start as i64);
            w.i64(6, rg.chunks.iter().map(|c| c.len).sum::<u64>() as i64);
            w.i16(7, ordinal as i16);
            w.end();
        }
        w.binary(6, b"trainio datagen");
        w.finish()
    }

    /// Writes the file: page by page, the values' bytes from `fill` (called with a buffer
    /// and the offset of its first value byte among all values written).
    pub fn write(&self, out: &mut impl Write, fill: &mut dyn FnMut(&mut [u8], u64)) -> io::Result<()> {
        out.write_all(b"PAR1")?;
        let mut values_at = 0;
        let mut page_buf = Vec::new();
        for rg in &self.row_groups {
            for (col, chunk) in self.spec.columns.iter().zip(&rg.chunks) {
                for page in &chunk.pages {
                    out.write_all(&page.header)?;
                    page_buf.clear();
                    page_buf.extend(levels(col, page.rows));
                    let lv = page_buf.len();
                    page_buf.resize(page.raw as usize, 0);
                    fill(&mut page_buf[lv..], values_at);
                    values_at += (page_buf.len() - lv) as u64;
                    col.dtype.shape_values(&mut page_buf[lv..]);
                    self.spec.codec.write(out, &page_buf)?;
                }
            }
        }
        out.write_all(&self.footer)?;
        out.write_all(&(self.footer.len() as u32).to_le_bytes())?;
        out.write_all(b"PAR1")
    }

    /// pyarrow's reads when it opens the file (ParquetFile): the last 64 KiB (the whole
    /// file when smaller), then, when the footer is longer than that read held, the
    /// whole footer again.
    pub fn footer_reads(&self) -> Vec<(u64, u64)> {
        let tail = self.size.min(FOOTER_READ);
        let mut out = vec![(self.size - tail, tail)];
        let footer = self.footer.len() as u64;
        if footer + 8 > tail {
            out.push((self.size - 8 - footer, footer));
        }
        out
    }

    /// pyarrow's reads of row group `rg` (`read_row_group(rg, columns=…)`, pre-buffered):
    /// the chunks of the columns asked for, coalesced as Arrow's ReadRangeCache does.
    pub fn row_group_reads(&self, rg: usize) -> Vec<(u64, u64)> {
        let chunks = &self.row_groups[rg].chunks;
        let ranges: Vec<(u64, u64)> =
            self.spec.read_columns().iter().map(|&c| (chunks[c].start, chunks[c].len)).collect();
        coalesce(ranges)
    }

    /// The row group holding row `k`.
    pub fn row_group_of(&self, k: u64) -> usize {
        let mut first = 0;
        for (i, rg) in self.row_groups.iter().enumerate() {
            if k < first + rg.rows {
                return i;
            }
            first += rg.rows;
        }
        self.row_groups.len().saturating_sub(1)
    }
}

/// Arrow's coalescing of read ranges (sorted by offset): a range joins the read before it
/// when the gap is at most HOLE_LIMIT and the joined read stays within RANGE_LIMIT; a
/// range longer than the limit is read alone, whole.
pub fn coalesce(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.retain(|r| r.1 > 0);
    ranges.sort_unstable();
    let mut out = Vec::new();
    let Some(&(first, _)) = ranges.first() else {
        return out;
    };
    let (mut start, mut end) = (first, first);
    for (offset, len) in ranges {
        if offset + len - start > RANGE_LIMIT || offset.saturating_sub(end) > HOLE_LIMIT {
            if end > start {
                out.push((start, end - start));
            }
            start = offset;
        }
        end = end.max(offset + len);
    }
    if end > start {
        out.push((start, end - start));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> Spec {
        let v: Value = serde_yaml::from_str(yaml).unwrap();
        Spec::from_dataset(&v, 100.0).unwrap()
    }

    #[test]
    fn coalesces_as_arrow() {
        // Adjacent and near ranges join; a gap beyond 8 KiB splits; a range beyond 32 MiB
        // is read alone and whole.
        assert_eq!(coalesce(vec![(4, 1332), (1336, 189324)]), [(4, 190656)]);
        assert_eq!(coalesce(vec![(4, 1332), (190692, 385111)]), [(4, 1332), (190692, 385111)]);
        let big = 52_432_750;
        assert_eq!(coalesce(vec![(4, big), (4 + big, 457), (4 + big + 457, 457)]), [(4, big), (4 + big, 914)]);
    }

    #[test]
    fn layout_adds_up_and_reads_follow_the_read_flags() {
        let s = spec(
            "compression: snappy\nparquet:\n  row_group_size: 100\n  columns:\n    - {name: a, dtype: float32, size: 1, read: true}\n    - {name: b, dtype: int8, size: 1000, read: false}\n    - {name: c, dtype: float16, size: 3}\n",
        );
        assert_eq!(s.row_bytes(), 4 + 4000 + 6, "int8 is stored in INT32");
        let l = FileLayout::new(&s, 250);
        assert_eq!(l.row_groups.iter().map(|r| r.rows).collect::<Vec<_>>(), [100, 100, 50]);
        let mut out = Vec::new();
        l.write(&mut out, &mut |b, _| b.fill(0xab)).unwrap();
        assert_eq!(out.len() as u64, l.size);
        assert_eq!(&out[..4], b"PAR1");
        assert_eq!(&out[out.len() - 4..], b"PAR1");
        // Column b (200 KB a row group) lies between a and c: a and c are read apart.
        let reads = l.row_group_reads(1);
        let chunks = &l.row_groups[1].chunks;
        assert_eq!(reads, [(chunks[0].start, chunks[0].len), (chunks[2].start, chunks[2].len)]);
        assert_eq!(l.row_group_of(0), 0);
        assert_eq!(l.row_group_of(249), 2);
        // Footer under 64 KiB: one read of the tail.
        assert_eq!(l.footer_reads(), [(l.size - FOOTER_READ, FOOTER_READ)]);
    }

    #[test]
    fn refuses_what_it_does_not_write() {
        let v: Value = serde_yaml::from_str("parquet:\n  columns:\n    - {name: s, dtype: string}\n").unwrap();
        let e = Spec::from_dataset(&v, 1.0).unwrap_err().to_string();
        assert!(e.contains("dataset.parquet.columns[0].dtype"), "{e}");
        let v: Value = serde_yaml::from_str("compression: lzo\n").unwrap();
        assert!(Spec::from_dataset(&v, 1.0).unwrap_err().to_string().contains("dataset.compression"));
        let v: Value = serde_yaml::from_str("parquet:\n  read_mode: mmap\n").unwrap();
        assert!(Spec::from_dataset(&v, 1.0).unwrap_err().to_string().contains("read_mode"));
    }
}
