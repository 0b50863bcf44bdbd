//! One Parquet segment file. Integer columns go through the parquet crate's Arrow column
//! writers; the dictionary-encoded string columns (`layer`, `op`, `dev`, `comm`, `file`)
//! are encoded here.
//!
//! Why: the crate's writer hashes and compares every row's string to rebuild a dictionary
//! and its min/max statistics, although the rows arrive as Arrow dictionaries of one or
//! two entries. That was half of the recorder's encoding time (`make bench-encode`).
//! Here each batch's dictionary entries are mapped once to the column chunk's
//! dictionary; a row costs a key comparison (rows are kept as runs of one index until
//! their page is encoded), and the statistics are taken over the chunk's dictionary when
//! the row group closes.
//!
//! The column chunk written is what the crate would write: a PLAIN dictionary page, then
//! v1 data pages of RLE_DICTIONARY indices (RLE/bit-packed hybrid) after RLE definition
//! levels for nullable columns, all zstd-compressed; a page without values (every row
//! null) is PLAIN, levels only, and a chunk without values has no dictionary page.
use std::fs::File;
use std::sync::Arc;

use anyhow::{anyhow, Result};
use arrow_array::cast::AsArray;
use arrow_array::types::{ArrowDictionaryKeyType, Int16Type, Int32Type, Int8Type};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_buffer::ArrowNativeType;
use arrow_schema::{DataType, SchemaRef};
use bytes::Bytes;
use parquet::arrow::arrow_writer::{compute_leaves, ArrowColumnWriter, ArrowRowGroupWriterFactory};
use parquet::arrow::{add_encoded_arrow_schema_to_metadata, ArrowSchemaConverter};
use parquet::basic::{Compression, Encoding};
use parquet::column::page::{CompressedPage, Page, PageWriter};
use parquet::column::writer::ColumnCloseResult;
use parquet::data_type::ByteArray;
use parquet::file::metadata::{ColumnChunkMetaData, KeyValue};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::statistics::{Statistics, ValueStatistics};
use parquet::file::writer::{SerializedFileWriter, SerializedPageWriter, TrackedWrite};
use parquet::schema::types::ColumnDescPtr;
use rustc_hash::FxHashMap;

/// Values per data page of a dictionary column (the crate's default page row limit).
const PAGE_VALUES: usize = 20_000;

pub(crate) struct SegmentFile {
    file: SerializedFileWriter<File>,
    factory: ArrowRowGroupWriterFactory,
    schema: SchemaRef,
    group: Option<Group>,
    max_rows: usize,
}

/// The row group being written.
struct Group {
    columns: Vec<Column>,
    rows: usize,
}

enum Column {
    Arrow(ArrowColumnWriter),
    Dict(DictChunk),
}

impl SegmentFile {
    pub(crate) fn new(file: File, schema: SchemaRef, mut props: WriterProperties) -> Result<Self> {
        let parquet_schema = ArrowSchemaConverter::new().convert(&schema)?;
        add_encoded_arrow_schema_to_metadata(&schema, &mut props);
        let max_rows = props.max_row_group_row_count().unwrap_or(usize::MAX);
        let file = SerializedFileWriter::new(file, parquet_schema.root_schema_ptr(), Arc::new(props))?;
        let factory = ArrowRowGroupWriterFactory::new(&file, schema.clone());
        Ok(SegmentFile { file, factory, schema, group: None, max_rows })
    }

    pub(crate) fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let mut rest = batch.clone();
        while rest.num_rows() > 0 {
            if self.group.is_none() {
                self.group = Some(self.start_group()?);
            }
            let group = self.group.as_mut().expect("group started");
            let take = rest.num_rows().min(self.max_rows - group.rows);
            let part = rest.slice(0, take);
            rest = rest.slice(take, rest.num_rows() - take);
            for ((column, field), array) in group.columns.iter_mut().zip(self.schema.fields()).zip(part.columns()) {
                match column {
                    Column::Arrow(w) => {
                        for leaf in compute_leaves(field, array)? {
                            w.write(&leaf)?;
                        }
                    }
                    Column::Dict(d) => d.write(array)?,
                }
            }
            group.rows += take;
            if group.rows >= self.max_rows {
                self.flush()?;
            }
        }
        Ok(())
    }

    fn start_group(&self) -> Result<Group> {
        let index = self.file.flushed_row_groups().len();
        let writers = self.factory.create_column_writers(index)?;
        let props = self.file.properties();
        let columns = writers
            .into_iter()
            .zip(self.schema.fields())
            .zip(self.file.schema_descr().columns())
            .map(|((w, field), descr)| match field.data_type() {
                DataType::Dictionary(_, _) => Column::Dict(DictChunk::new(descr.clone(), props)),
                _ => Column::Arrow(w),
            })
            .collect();
        Ok(Group { columns, rows: 0 })
    }

    /// Writes the row group in progress, if any.
    fn flush(&mut self) -> Result<()> {
        let Some(group) = self.group.take() else { return Ok(()) };
        let mut rg = self.file.next_row_group()?;
        for column in group.columns {
            match column {
                Column::Arrow(w) => w.close()?.append_to_row_group(&mut rg)?,
                Column::Dict(d) => {
                    let (bytes, close) = d.finish()?;
                    rg.append_column(&bytes, close)?;
                }
            }
        }
        rg.close()?;
        Ok(())
    }

    /// Bytes written to the file, and an estimate of those the row group in progress will add.
    pub(crate) fn size(&self) -> u64 {
        let pending: usize = self.group.as_ref().map_or(0, |g| {
            g.columns
                .iter()
                .map(|c| match c {
                    Column::Arrow(w) => w.get_estimated_total_bytes(),
                    Column::Dict(d) => d.estimated_bytes(),
                })
                .sum()
        });
        self.file.bytes_written() as u64 + pending as u64
    }

    pub(crate) fn append_key_value_metadata(&mut self, kv: KeyValue) {
        self.file.append_key_value_metadata(kv);
    }

    pub(crate) fn close(mut self) -> Result<()> {
        self.flush()?;
        self.file.close()?;
        Ok(())
    }
}

/// A dictionary string column's chunk in a row group: its dictionary (in order of first
/// use) and its data pages, encoded every PAGE_VALUES rows (a page's index bit width is
/// that of the dictionary so far) and compressed when the row group closes, after the
/// dictionary page is known.
struct DictChunk {
    descr: ColumnDescPtr,
    zstd_level: Option<i32>,
    statistics: bool,
    values: Vec<Box<[u8]>>,
    ids: FxHashMap<Box<[u8]>, u32>,
    /// Rows not yet in a page, as runs of one value: their dictionary indices, and
    /// (nullable columns only) their definition levels, 1 for a value and 0 for a null.
    /// Trace columns hold long runs (one device, command or layer row after row), which
    /// the RLE/bit-packed hybrid then writes as they are.
    indices: Runs,
    levels: Runs,
    pages: Vec<PageParts>,
    rows: u64,
    nulls: u64,
}

/// A data page before compression: RLE definition levels (nullable columns) and the
/// encoded values (for dictionary columns, the bit width byte and the indices).
struct PageParts {
    rows: usize,
    /// Rows with a value; a page without any is written PLAIN (levels only).
    present: usize,
    levels: Vec<u8>,
    values: Vec<u8>,
}

impl DictChunk {
    fn new(descr: ColumnDescPtr, props: &WriterProperties) -> Self {
        let path = descr.path();
        let zstd_level = match props.compression(path) {
            Compression::ZSTD(level) => Some(level.compression_level()),
            _ => None,
        };
        DictChunk {
            statistics: props.statistics_enabled(path) != EnabledStatistics::None,
            zstd_level,
            descr,
            values: Vec::new(),
            ids: FxHashMap::default(),
            indices: Runs::default(),
            levels: Runs::default(),
            pages: Vec::new(),
            rows: 0,
            nulls: 0,
        }
    }

    fn nullable(&self) -> bool {
        self.descr.max_def_level() > 0
    }

    fn write(&mut self, array: &ArrayRef) -> Result<()> {
        match array.data_type() {
            DataType::Dictionary(key, _) => match key.as_ref() {
                DataType::Int8 => self.write_keys::<Int8Type>(array)?,
                DataType::Int16 => self.write_keys::<Int16Type>(array)?,
                DataType::Int32 => self.write_keys::<Int32Type>(array)?,
                t => return Err(anyhow!("dictionary keys of type {t} are not written here")),
            },
            t => return Err(anyhow!("{t} is not a dictionary column")),
        }
        self.cut_pages(false);
        Ok(())
    }

    fn write_keys<K: ArrowDictionaryKeyType>(&mut self, array: &ArrayRef) -> Result<()> {
        let dict = array.as_dictionary::<K>();
        let strings = dict.values().as_string::<i32>();
        // This batch's dictionary entries, mapped to the chunk's on first use.
        let mut map = vec![u32::MAX; strings.len()];
        let mut id_of = |k: usize, chunk: &mut Self| -> u32 {
            if map[k] == u32::MAX {
                let s = strings.value(k).as_bytes();
                map[k] = match chunk.ids.get(s) {
                    Some(&id) => id,
                    None => {
                        let id = chunk.values.len() as u32;
                        chunk.values.push(s.into());
                        chunk.ids.insert(s.into(), id);
                        id
                    }
                };
            }
            map[k]
        };
        let keys = dict.keys();
        self.rows += keys.len() as u64;
        if !keys.is_empty() && keys.null_count() == keys.len() && self.nullable() {
            self.nulls += keys.len() as u64;
            self.levels.push_n(0, keys.len());
            return Ok(());
        }
        match keys.nulls().filter(|n| n.null_count() > 0) {
            None => {
                // Keys repeat row after row: map a key once per run.
                let mut last = (usize::MAX, 0);
                for k in keys.values().iter() {
                    let k = k.as_usize();
                    if k != last.0 {
                        last = (k, id_of(k, self));
                    }
                    self.indices.push_n(last.1, 1);
                }
                if self.nullable() {
                    self.levels.push_n(1, keys.len());
                }
            }
            Some(valid) => {
                if !self.nullable() {
                    return Err(anyhow!("nulls in the non-nullable column {}", self.descr.name()));
                }
                for (k, ok) in keys.values().iter().zip(valid.iter()) {
                    if ok {
                        let id = id_of(k.as_usize(), self);
                        self.indices.push_n(id, 1);
                    } else {
                        self.nulls += 1;
                    }
                    self.levels.push_n(u32::from(ok), 1);
                }
            }
        }
        Ok(())
    }

    /// Encodes the pending rows into pages of PAGE_VALUES rows; with `all`, the rest too.
    fn cut_pages(&mut self, all: bool) {
        let nullable = self.nullable();
        let bit_width = (32 - (self.values.len().saturating_sub(1) as u32).leading_zeros()).max(1) as u8;
        loop {
            let pending = if nullable { self.levels.len } else { self.indices.len };
            if pending == 0 || (pending < PAGE_VALUES && !all) {
                break;
            }
            let rows = pending.min(PAGE_VALUES);
            let (levels, present) = if nullable {
                let l = self.levels.take(rows);
                let present = l.iter().filter(|r| r.0 == 1).map(|r| r.1 as usize).sum();
                (rle_hybrid(&l, 1), present)
            } else {
                (Vec::new(), rows)
            };
            let mut values = vec![bit_width];
            values.extend(rle_hybrid(&self.indices.take(present), bit_width));
            self.pages.push(PageParts { rows, present, levels, values });
        }
    }

    fn estimated_bytes(&self) -> usize {
        // Encoded pages shrink further under zstd; pending runs count 8 bytes each.
        let pages: usize = self.pages.iter().map(|p| p.levels.len() + p.values.len()).sum();
        self.values.iter().map(|v| v.len() + 4).sum::<usize>() + pages + 8 * (self.levels.runs.len() + self.indices.runs.len())
    }

    /// The chunk's bytes as the parquet crate lays them out (the dictionary page, if any,
    /// then v1 data pages, each compressed), and what the row group writer needs to know of
    /// them.
    fn finish(mut self) -> Result<(Bytes, ColumnCloseResult)> {
        self.cut_pages(true);
        // Without values (every row null) there is no dictionary: PLAIN pages of levels.
        let dictionary = (!self.values.is_empty()).then(|| {
            let mut plain = Vec::new();
            for v in &self.values {
                plain.extend_from_slice(&(v.len() as u32).to_le_bytes());
                plain.extend_from_slice(v);
            }
            (plain, self.values.len() as u32)
        });
        let statistics = self.statistics.then(|| {
            let min = self.values.iter().min().map(|v| ByteArray::from(v.to_vec()));
            let max = self.values.iter().max().map(|v| ByteArray::from(v.to_vec()));
            Statistics::ByteArray(ValueStatistics::new(min, max, None, Some(self.nulls), false))
        });
        let has_dictionary = dictionary.is_some();
        let nullable = self.nullable();
        let mut sink = TrackedWrite::new(Vec::new());
        let (mut compressed, mut uncompressed) = (0u64, 0u64);
        let mut first_data = None;
        {
            let mut pages = SerializedPageWriter::new(&mut sink);
            let mut put = |page: Page, size: usize| -> Result<u64> {
                let spec = pages.write_page(CompressedPage::new(page, size))?;
                compressed += spec.compressed_size as u64;
                uncompressed += spec.uncompressed_size as u64;
                Ok(spec.offset)
            };
            if let Some((plain, entries)) = dictionary {
                let (buf, size) = compress(self.zstd_level, plain)?;
                put(Page::DictionaryPage { buf, num_values: entries, encoding: Encoding::PLAIN, is_sorted: false }, size)?;
            }
            // A row group has rows, so the chunk has at least one page.
            for p in &self.pages {
                let mut body = Vec::with_capacity(4 + p.levels.len() + p.values.len());
                if nullable {
                    body.extend_from_slice(&(p.levels.len() as u32).to_le_bytes());
                    body.extend_from_slice(&p.levels);
                }
                let encoding = if p.present > 0 { Encoding::RLE_DICTIONARY } else { Encoding::PLAIN };
                if p.present > 0 {
                    body.extend_from_slice(&p.values);
                }
                let (buf, size) = compress(self.zstd_level, body)?;
                let page = Page::DataPage {
                    buf,
                    num_values: p.rows as u32,
                    encoding,
                    def_level_encoding: Encoding::RLE,
                    rep_level_encoding: Encoding::RLE,
                    statistics: None,
                };
                let offset = put(page, size)?;
                first_data.get_or_insert(offset);
            }
            pages.close()?;
        }
        let bytes_written = sink.bytes_written() as u64;
        let buf = Bytes::from(sink.into_inner()?);
        let mut meta = ColumnChunkMetaData::builder(self.descr.clone())
            .set_encodings(if has_dictionary {
                vec![Encoding::PLAIN, Encoding::RLE, Encoding::RLE_DICTIONARY]
            } else {
                vec![Encoding::PLAIN, Encoding::RLE]
            })
            .set_compression(match self.zstd_level {
                Some(l) => Compression::ZSTD(parquet::basic::ZstdLevel::try_new(l)?),
                None => Compression::UNCOMPRESSED,
            })
            .set_num_values(self.rows as i64)
            .set_total_compressed_size(compressed as i64)
            .set_total_uncompressed_size(uncompressed as i64)
            .set_data_page_offset(first_data.expect("at least one data page") as i64)
            .set_dictionary_page_offset(has_dictionary.then_some(0));
        if let Some(st) = statistics {
            meta = meta.set_statistics(st);
        }
        let close = ColumnCloseResult {
            bytes_written,
            rows_written: self.rows,
            metadata: meta.build()?,
            bloom_filter: None,
            column_index: None,
            offset_index: None,
        };
        Ok((buf, close))
    }
}

fn compress(zstd_level: Option<i32>, body: Vec<u8>) -> Result<(Bytes, usize)> {
    let len = body.len();
    Ok(match zstd_level {
        Some(level) => (zstd::bulk::compress(&body, level)?.into(), len),
        None => (body.into(), len),
    })
}

/// Values as runs of one value: (value, count), no two neighbours equal, count > 0.
#[derive(Default)]
struct Runs {
    runs: std::collections::VecDeque<(u32, u32)>,
    /// Values in all runs.
    len: usize,
}

impl Runs {
    #[inline]
    fn push_n(&mut self, v: u32, n: usize) {
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
    fn take(&mut self, mut n: usize) -> Vec<(u32, u32)> {
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
fn rle_hybrid(runs: &[(u32, u32)], bit_width: u8) -> Vec<u8> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{DictionaryArray, Int64Array, StringArray};
    use arrow_schema::{Field, Schema};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::basic::ZstdLevel;
    use parquet::file::reader::{FileReader, SerializedFileReader};

    fn strings(a: &ArrayRef) -> Vec<Option<String>> {
        let d = a.as_dictionary::<Int32Type>();
        let values = d.values().as_string::<i32>();
        d.keys().iter().map(|k| k.map(|k| values.value(k as usize).to_string())).collect()
    }

    /// Columns shaped to reach every path: long runs, short runs and single values mixed
    /// (RLE and bit-packed runs in one page), dictionaries of 1 to 300 entries (bit widths
    /// 1 to 9, growing between pages), nulls in runs and alone, an all-null column, a
    /// column whose first page is all null and whose later pages are not, pages and row
    /// groups split.
    #[test]
    fn dictionary_chunks_read_back_with_their_statistics() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("n", DataType::Int64, false),
            Field::new("one", DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)), false),
            Field::new("many", DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)), true),
            Field::new("none", DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)), true),
            Field::new("late", DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)), true),
        ]));
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(1).unwrap()))
            .set_max_row_group_row_count(Some(30_000))
            .build();
        let path = std::env::temp_dir().join(format!("trainio-segment-test-{}.parquet", std::process::id()));
        let mut seg = SegmentFile::new(File::create(&path).unwrap(), schema.clone(), props).unwrap();
        let mut x: u64 = 7;
        let mut expect_many = Vec::new();
        let mut expect_late = Vec::new();
        let mut n = 0i64;
        for batch in 0..5 {
            let rows = 9_000 + batch * 3_001;
            let mut many = Vec::with_capacity(rows);
            while many.len() < rows {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let run = [1, 1, 2, 3, 7, 8, 9, 40][(x % 8) as usize];
                let v = match (x >> 8) % 10 {
                    0 => None,
                    _ => Some(format!("v{:03}", (x >> 16) % (60 * (batch as u64 + 1)))),
                };
                for _ in 0..run.min(rows - many.len()) {
                    many.push(v.clone());
                }
            }
            let len = many.len();
            // Each batch has its own dictionary, in its own order, with unused entries.
            let distinct: Vec<String> = {
                let mut d: Vec<String> = many.iter().flatten().cloned().collect();
                d.sort();
                d.dedup();
                d.reverse();
                d.push("unused".into());
                d
            };
            let key = |s: &String| distinct.iter().position(|d| d == s).unwrap() as i32;
            let many_arr = DictionaryArray::<Int32Type>::try_new(
                many.iter().map(|v| v.as_ref().map(key)).collect(),
                Arc::new(StringArray::from(distinct.clone())),
            )
            .unwrap();
            let one = DictionaryArray::<Int32Type>::try_new(
                vec![0; len].into(),
                Arc::new(StringArray::from(vec!["block"])),
            )
            .unwrap();
            let none = DictionaryArray::<Int32Type>::try_new(
                vec![None::<i32>; len].into(),
                Arc::new(StringArray::from(Vec::<&str>::new())),
            )
            .unwrap();
            let late: Vec<Option<String>> =
                (0..len).map(|i| (batch >= 2).then(|| format!("x{}", i % 3))).collect();
            let late_arr = DictionaryArray::<Int32Type>::try_new(
                late.iter().map(|v| v.as_ref().map(|s| s[1..].parse::<i32>().unwrap())).collect(),
                Arc::new(StringArray::from(vec!["x0", "x1", "x2"])),
            )
            .unwrap();
            expect_late.extend(late);
            let ns: Int64Array = (n..n + len as i64).collect();
            n += len as i64;
            let b = RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(ns), Arc::new(one), Arc::new(many_arr), Arc::new(none), Arc::new(late_arr)],
            )
            .unwrap();
            seg.write(&b).unwrap();
            expect_many.extend(many);
        }
        seg.close().unwrap();

        let mut got_many = Vec::new();
        let mut got_late = Vec::new();
        let mut rows = 0;
        let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(&path).unwrap()).unwrap().build().unwrap();
        for b in reader {
            let b = b.unwrap();
            let ns = b.column(0).as_primitive::<arrow_array::types::Int64Type>();
            assert!(ns.iter().enumerate().all(|(i, v)| v == Some((rows + i) as i64)), "rows stay aligned");
            assert!(strings(b.column(1)).iter().all(|v| v.as_deref() == Some("block")));
            assert!(strings(b.column(3)).iter().all(Option::is_none));
            got_many.extend(strings(b.column(2)));
            got_late.extend(strings(b.column(4)));
            rows += b.num_rows();
        }
        assert_eq!(rows, expect_many.len());
        assert_eq!(got_many, expect_many);
        assert_eq!(got_late, expect_late);

        // Statistics per row group: min, max and null count of exactly its rows.
        let file = SerializedFileReader::new(File::open(&path).unwrap()).unwrap();
        let meta = file.metadata();
        assert!(meta.num_row_groups() >= 3, "row groups were split");
        let mut at = 0;
        for rg in meta.row_groups() {
            let rows = &expect_many[at..at + rg.num_rows() as usize];
            at += rg.num_rows() as usize;
            let Some(Statistics::ByteArray(s)) = rg.column(2).statistics() else { panic!("no statistics") };
            let present: Vec<&String> = rows.iter().flatten().collect();
            assert_eq!(s.min_opt().unwrap().as_utf8().unwrap(), present.iter().min().unwrap().as_str());
            assert_eq!(s.max_opt().unwrap().as_utf8().unwrap(), present.iter().max().unwrap().as_str());
            assert_eq!(s.null_count_opt(), Some((rows.len() - present.len()) as u64));
            let Some(Statistics::ByteArray(one)) = rg.column(1).statistics() else { panic!("no statistics") };
            assert_eq!((one.min_opt().unwrap().as_utf8().unwrap(), one.max_opt().unwrap().as_utf8().unwrap()), ("block", "block"));
            assert_eq!(rg.column(3).statistics().and_then(|s| s.null_count_opt()), Some(rg.num_rows() as u64));
        }
        std::fs::remove_file(&path).unwrap();
    }
}
