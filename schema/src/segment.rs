//! One Parquet segment file. Its column chunks are assembled here, into pages and row
//! groups: the dictionary-encoded string columns (`layer`, `op`, `dev`, `comm`, `file`)
//! by DictChunk, the Int64, Int32 and UInt32 columns by IntChunk, their values encoded by
//! encoding.rs; a column of any other type goes through the parquet crate's Arrow column
//! writer. The crate lays out the file, footer and row groups.
//!
//! Why: the crate's writer hashes and compares every row's string to rebuild a dictionary
//! and its min/max statistics, although the rows arrive as Arrow dictionaries of one or
//! two entries. That was half of the recorder's encoding time (`make bench-encode`).
//! Here each batch's dictionary entries are mapped once to the column chunk's
//! dictionary; a row costs a key comparison (rows are kept as runs of one index until
//! their page is encoded), and the statistics are taken over the chunk's dictionary when
//! the row group closes. Integer columns: most are constant for long stretches (pid, tid,
//! bytes, flags, error of one job's block rows), and a block of 128 equal values is
//! written after one comparison per value, where the crate's delta encoder computes,
//! reduces and bit-packs every delta (IntChunk).
//!
//! The column chunks are standard: for strings a PLAIN dictionary page, then v1 data
//! pages of RLE_DICTIONARY indices (RLE/bit-packed hybrid); for integers v1 data pages
//! of DELTA_BINARY_PACKED values; RLE definition levels first in the pages of nullable
//! columns, all zstd-compressed; a page without values (every row null) is PLAIN, levels
//! only, and a chunk without values has no dictionary page.
use std::fs::File;
use std::sync::Arc;

use anyhow::{anyhow, Result};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    ArrowDictionaryKeyType, ArrowPrimitiveType, Int16Type, Int32Type, Int64Type, Int8Type, UInt32Type,
};
use arrow_array::{Array, ArrayRef, PrimitiveArray, RecordBatch};
use arrow_buffer::{ArrowNativeType, NullBuffer};
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

use crate::encoding::{delta_binary_packed, index_bit_width, plain_byte_arrays, rle_hybrid, RunList};

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

// One per column of a row group, used in place: boxing the Arrow writer would buy nothing.
#[allow(clippy::large_enum_variant)]
enum Column {
    Arrow(ArrowColumnWriter),
    Dict(DictChunk),
    Int(IntChunk),
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
                    Column::Int(c) => c.write(array)?,
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
                t => match IntChunk::new(descr.clone(), t, props) {
                    Some(c) => Column::Int(c),
                    None => Column::Arrow(w),
                },
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
                Column::Int(c) => {
                    let (bytes, close) = c.finish()?;
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
                    Column::Int(c) => c.estimated_bytes(),
                })
                .sum()
        });
        self.file.bytes_written() as u64 + pending as u64
    }

    /// Writes the row group in progress and returns the bytes in the file: all but the
    /// footer, exactly (the size retention counts a closing segment by).
    pub(crate) fn flushed_size(&mut self) -> Result<u64> {
        self.flush()?;
        Ok(self.file.bytes_written() as u64)
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

/// What the dictionary and integer column chunks share: the column and its settings, the
/// definition levels of rows not yet in a page (nullable columns only), the pages so far
/// and the counts; and the chunk's layout when the row group closes.
struct Chunk {
    descr: ColumnDescPtr,
    zstd_level: Option<i32>,
    statistics: bool,
    /// Rows not yet in a page, as runs: 1 for a value, 0 for a null.
    levels: RunList,
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

impl Chunk {
    fn new(descr: ColumnDescPtr, props: &WriterProperties) -> Self {
        let path = descr.path();
        let zstd_level = match props.compression(path) {
            Compression::ZSTD(level) => Some(level.compression_level()),
            _ => None,
        };
        Chunk {
            statistics: props.statistics_enabled(path) != EnabledStatistics::None,
            zstd_level,
            descr,
            levels: RunList::default(),
            pages: Vec::new(),
            rows: 0,
            nulls: 0,
        }
    }

    fn nullable(&self) -> bool {
        self.descr.max_def_level() > 0
    }

    /// Counts `len` rows with these nulls and queues their definition levels, a run of
    /// valid rows at a time; nulls in a non-nullable column are an error.
    fn push_rows(&mut self, len: usize, nulls: Option<&NullBuffer>) -> Result<()> {
        self.rows += len as u64;
        match nulls.filter(|n| n.null_count() > 0) {
            None if self.nullable() => self.levels.push_n(1, len),
            None => {}
            Some(_) if !self.nullable() => {
                return Err(anyhow!("nulls in the non-nullable column {}", self.descr.name()))
            }
            Some(n) => {
                self.nulls += n.null_count() as u64;
                let mut at = 0;
                for (start, end) in n.valid_slices() {
                    self.levels.push_n(0, start - at);
                    self.levels.push_n(1, end - start);
                    at = end;
                }
                self.levels.push_n(0, len - at);
            }
        }
        Ok(())
    }

    /// The next page to encode once PAGE_VALUES rows are pending (with `all`, any): its
    /// rows, its encoded definition levels and how many of its rows have a value.
    /// `pending_values`: values not yet in a page (the pending rows of a non-nullable
    /// column).
    fn next_page(&mut self, all: bool, pending_values: usize) -> Option<(usize, Vec<u8>, usize)> {
        let nullable = self.nullable();
        let pending = if nullable { self.levels.len } else { pending_values };
        if pending == 0 || (pending < PAGE_VALUES && !all) {
            return None;
        }
        let rows = pending.min(PAGE_VALUES);
        if !nullable {
            return Some((rows, Vec::new(), rows));
        }
        let l = self.levels.take(rows);
        let present = l.iter().filter(|r| r.0 == 1).map(|r| r.1 as usize).sum();
        Some((rows, rle_hybrid(&l, 1), present))
    }

    /// Bytes of the pages encoded so far (before zstd).
    fn pages_bytes(&self) -> usize {
        self.pages.iter().map(|p| p.levels.len() + p.values.len()).sum()
    }

    /// The chunk's bytes as the parquet crate lays them out (the dictionary page, if any,
    /// then v1 data pages, each compressed), and what the row group writer needs to know
    /// of them. `dictionary`: a PLAIN dictionary page's body and its entry count;
    /// `value_encoding`: that of the pages' values (pages without values are PLAIN,
    /// levels only).
    fn write(
        &self,
        dictionary: Option<(Vec<u8>, u32)>,
        value_encoding: Encoding,
        statistics: Option<Statistics>,
    ) -> Result<(Bytes, ColumnCloseResult)> {
        let nullable = self.nullable();
        let has_dictionary = dictionary.is_some();
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
                put(
                    Page::DictionaryPage { buf, num_values: entries, encoding: Encoding::PLAIN, is_sorted: false },
                    size,
                )?;
            }
            // A row group has rows, so the chunk has at least one page.
            for p in &self.pages {
                let mut body = Vec::with_capacity(4 + p.levels.len() + p.values.len());
                if nullable {
                    body.extend_from_slice(&(p.levels.len() as u32).to_le_bytes());
                    body.extend_from_slice(&p.levels);
                }
                let encoding = if p.present > 0 { value_encoding } else { Encoding::PLAIN };
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
        let mut encodings = vec![Encoding::RLE];
        if has_dictionary || self.pages.iter().any(|p| p.present == 0) {
            encodings.push(Encoding::PLAIN);
        }
        if self.pages.iter().any(|p| p.present > 0) {
            encodings.push(value_encoding);
        }
        let mut meta = ColumnChunkMetaData::builder(self.descr.clone())
            .set_encodings(encodings)
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

/// A dictionary string column's chunk in a row group: its dictionary (in order of first
/// use) and its data pages, encoded every PAGE_VALUES rows (a page's index bit width is
/// that of the dictionary so far) and compressed when the row group closes, after the
/// dictionary page is known.
struct DictChunk {
    chunk: Chunk,
    values: Vec<Box<[u8]>>,
    ids: FxHashMap<Box<[u8]>, u32>,
    /// Dictionary indices of the values not yet in a page, as runs of one index. Trace
    /// columns hold long runs (one device, command or layer row after row), which the
    /// RLE/bit-packed hybrid then writes as they are.
    indices: RunList,
}

impl DictChunk {
    fn new(descr: ColumnDescPtr, props: &WriterProperties) -> Self {
        DictChunk {
            chunk: Chunk::new(descr, props),
            values: Vec::new(),
            ids: FxHashMap::default(),
            indices: RunList::default(),
        }
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
        self.chunk.push_rows(keys.len(), keys.nulls())?;
        match keys.nulls().filter(|n| n.null_count() > 0) {
            // Keys repeat row after row: find each run, then map its key once.
            None => {
                let keys = keys.values();
                let mut i = 0;
                while i < keys.len() {
                    let k = keys[i];
                    let run = keys[i..].iter().take_while(|&&x| x == k).count();
                    let id = id_of(k.as_usize(), self);
                    self.indices.push_n(id, run);
                    i += run;
                }
            }
            Some(valid) if valid.null_count() == keys.len() => {}
            Some(valid) => {
                for (k, ok) in keys.values().iter().zip(valid.iter()) {
                    if ok {
                        let id = id_of(k.as_usize(), self);
                        self.indices.push_n(id, 1);
                    }
                }
            }
        }
        Ok(())
    }

    /// Encodes the pending rows into pages of PAGE_VALUES rows; with `all`, the rest too.
    fn cut_pages(&mut self, all: bool) {
        let bit_width = index_bit_width(self.values.len());
        while let Some((rows, levels, present)) = self.chunk.next_page(all, self.indices.len) {
            let mut values = vec![bit_width];
            values.extend(rle_hybrid(&self.indices.take(present), bit_width));
            self.chunk.pages.push(PageParts { rows, present, levels, values });
        }
    }

    fn estimated_bytes(&self) -> usize {
        // Encoded pages shrink further under zstd; pending runs count 8 bytes each.
        self.values.iter().map(|v| v.len() + 4).sum::<usize>()
            + self.chunk.pages_bytes()
            + 8 * (self.chunk.levels.runs.len() + self.indices.runs.len())
    }

    /// The chunk's bytes and what the row group writer needs to know of them.
    fn finish(mut self) -> Result<(Bytes, ColumnCloseResult)> {
        self.cut_pages(true);
        // Without values (every row null) there is no dictionary: PLAIN pages of levels.
        let dictionary = (!self.values.is_empty()).then(|| (plain_byte_arrays(&self.values), self.values.len() as u32));
        let statistics = self.chunk.statistics.then(|| {
            let min = self.values.iter().min().map(|v| ByteArray::from(v.to_vec()));
            let max = self.values.iter().max().map(|v| ByteArray::from(v.to_vec()));
            Statistics::ByteArray(ValueStatistics::new(min, max, None, Some(self.chunk.nulls), false))
        });
        self.chunk.write(dictionary, Encoding::RLE_DICTIONARY, statistics)
    }
}

/// An integer column's chunk in a row group, DELTA_BINARY_PACKED (blocks of 128 deltas,
/// 4 miniblocks of 32), in data pages of PAGE_VALUES rows encoded as rows arrive.
///
/// A block of 128 equal values is a zero minimum delta and four zero bit widths.
///
/// Values are kept as i64 (INT32 columns as their 32-bit pattern, sign-extended);
/// deltas wrap in the physical type, as the format asks.
struct IntChunk {
    chunk: Chunk,
    /// INT32 physical type (deltas wrap at 32 bits); UINT_32 logical type (statistics
    /// compare unsigned).
    int32: bool,
    unsigned: bool,
    /// Values of rows not yet in a page (nulls have none).
    values: Vec<i64>,
    /// Min and max so far, UINT_32 values zero-extended (the statistics take their low
    /// 32 bits).
    min_max: Option<(i64, i64)>,
}

impl IntChunk {
    /// An IntChunk for an Int64, Int32 or UInt32 column; None for other types.
    fn new(descr: ColumnDescPtr, data_type: &DataType, props: &WriterProperties) -> Option<Self> {
        let (int32, unsigned) = match data_type {
            DataType::Int64 => (false, false),
            DataType::Int32 => (true, false),
            DataType::UInt32 => (true, true),
            _ => return None,
        };
        Some(IntChunk { chunk: Chunk::new(descr, props), int32, unsigned, values: Vec::new(), min_max: None })
    }

    fn write(&mut self, array: &ArrayRef) -> Result<()> {
        match array.data_type() {
            DataType::Int64 => self.append(array.as_primitive::<Int64Type>(), |v| v)?,
            DataType::Int32 => self.append(array.as_primitive::<Int32Type>(), i64::from)?,
            DataType::UInt32 => self.append(array.as_primitive::<UInt32Type>(), |v| i64::from(v as i32))?,
            t => return Err(anyhow!("{t} is not written as an integer column here")),
        }
        self.cut_pages(false);
        Ok(())
    }

    fn append<T: ArrowPrimitiveType>(
        &mut self,
        a: &PrimitiveArray<T>,
        to_i64: impl Fn(T::Native) -> i64,
    ) -> Result<()> {
        let start = self.values.len();
        self.chunk.push_rows(a.len(), a.nulls())?;
        match a.nulls().filter(|n| n.null_count() > 0) {
            None => self.values.extend(a.values().iter().map(|&v| to_i64(v))),
            Some(valid) if valid.null_count() == a.len() => {}
            Some(valid) => {
                for (start, end) in valid.valid_slices() {
                    self.values.extend(a.values()[start..end].iter().map(|&v| to_i64(v)));
                }
            }
        }
        if self.chunk.statistics && start < self.values.len() {
            // Compared as the logical type orders them: UINT_32 values unsigned.
            let key = |v: i64| if self.unsigned { i64::from(v as u32) } else { v };
            let (lo, hi) =
                self.values[start..].iter().fold((i64::MAX, i64::MIN), |(lo, hi), &v| (lo.min(key(v)), hi.max(key(v))));
            self.min_max = Some(self.min_max.map_or((lo, hi), |(a, b)| (a.min(lo), b.max(hi))));
        }
        Ok(())
    }

    /// Encodes the pending rows into pages of PAGE_VALUES rows; with `all`, the rest too.
    fn cut_pages(&mut self, all: bool) {
        let mut at = 0;
        while let Some((rows, levels, present)) = self.chunk.next_page(all, self.values.len() - at) {
            let values =
                if present > 0 { delta_binary_packed(&self.values[at..at + present], self.int32) } else { Vec::new() };
            self.chunk.pages.push(PageParts { rows, present, levels, values });
            at += present;
        }
        self.values.drain(..at);
    }

    fn estimated_bytes(&self) -> usize {
        // Encoded pages shrink further under zstd; pending values count a byte each.
        self.chunk.pages_bytes() + self.values.len()
    }

    fn finish(mut self) -> Result<(Bytes, ColumnCloseResult)> {
        self.cut_pages(true);
        let statistics = self.chunk.statistics.then(|| {
            let (min, max) = (self.min_max.map(|m| m.0), self.min_max.map(|m| m.1));
            let nulls = Some(self.chunk.nulls);
            if self.int32 {
                Statistics::Int32(ValueStatistics::new(
                    min.map(|v| v as i32),
                    max.map(|v| v as i32),
                    None,
                    nulls,
                    false,
                ))
            } else {
                Statistics::Int64(ValueStatistics::new(min, max, None, nulls, false))
            }
        });
        self.chunk.write(None, Encoding::DELTA_BINARY_PACKED, statistics)
    }
}

fn compress(zstd_level: Option<i32>, body: Vec<u8>) -> Result<(Bytes, usize)> {
    thread_local! {
        /// One zstd context per thread and level, reused for every page (a context per
        /// page was ~2% of the encoder thread's time).
        static ZSTD: std::cell::RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { std::cell::RefCell::new(None) };
    }
    let len = body.len();
    let Some(level) = zstd_level else { return Ok((body.into(), len)) };
    let out = ZSTD.with_borrow_mut(|z| -> std::io::Result<Vec<u8>> {
        if z.as_ref().is_none_or(|(l, _)| *l != level) {
            *z = Some((level, zstd::bulk::Compressor::new(level)?));
        }
        z.as_mut().expect("just set").1.compress(&body)
    })?;
    Ok((out.into(), len))
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

    /// One Int64 column (nullable) through a segment file and back through the parquet
    /// crate's reader.
    fn int64_round_trip(name: &str, values: &[Option<i64>]) -> Vec<Option<i64>> {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, true)]));
        let path = std::env::temp_dir().join(format!("trainio-segment-{name}-{}.parquet", std::process::id()));
        let mut seg =
            SegmentFile::new(File::create(&path).unwrap(), schema.clone(), WriterProperties::default()).unwrap();
        let batch = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(values.to_vec()))]).unwrap();
        seg.write(&batch).unwrap();
        seg.close().unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(&path).unwrap()).unwrap().build().unwrap();
        let got =
            reader.flat_map(|b| b.unwrap().column(0).as_primitive::<Int64Type>().iter().collect::<Vec<_>>()).collect();
        std::fs::remove_file(&path).unwrap();
        got
    }

    /// The encodings' edge cases as the reader sees them: a page without values (every
    /// row null), one value, blocks of equal values (bit width 0), deltas that need 64
    /// bits, negative deltas, and a null between values.
    #[test]
    fn integer_edge_cases_read_back() {
        let mut v = 0i64;
        let wide: Vec<i64> = (0..70)
            .map(|i| {
                v = v.wrapping_add(if i == 0 {
                    0
                } else if i % 2 == 1 {
                    i64::MIN
                } else {
                    i64::MAX
                });
                v
            })
            .collect();
        let cases: Vec<(&str, Vec<Option<i64>>)> = vec![
            ("all-null", vec![None; 5]),
            ("one", vec![Some(-7)]),
            ("constant", vec![Some(42); 129 + 128 + 3]),
            ("wide", wide.into_iter().map(Some).collect()),
            ("down", (0..300).map(|i| Some(1_000 - 3 * i * i)).collect()),
            ("gaps", vec![Some(5), None, Some(3), None, None, Some(i64::MIN)]),
        ];
        for (name, values) in cases {
            assert_eq!(int64_round_trip(name, &values), values, "{name}");
        }
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
            let one =
                DictionaryArray::<Int32Type>::try_new(vec![0; len].into(), Arc::new(StringArray::from(vec!["block"])))
                    .unwrap();
            let none = DictionaryArray::<Int32Type>::try_new(
                vec![None::<i32>; len].into(),
                Arc::new(StringArray::from(Vec::<&str>::new())),
            )
            .unwrap();
            let late: Vec<Option<String>> = (0..len).map(|i| (batch >= 2).then(|| format!("x{}", i % 3))).collect();
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
            assert_eq!(
                (one.min_opt().unwrap().as_utf8().unwrap(), one.max_opt().unwrap().as_utf8().unwrap()),
                ("block", "block")
            );
            assert_eq!(rg.column(3).statistics().and_then(|s| s.null_count_opt()), Some(rg.num_rows() as u64));
        }
        std::fs::remove_file(&path).unwrap();
    }

    /// Integer columns: constant stretches (zero-delta blocks), random values including
    /// the extremes (deltas that wrap in i64 and in i32), small steps, nulls alone and in
    /// runs, an all-null column, UINT_32 values with the top bit set (unsigned
    /// statistics), page and row-group splits, and counts that are not whole blocks.
    #[test]
    fn integer_chunks_read_back_with_their_statistics() {
        use arrow_array::{Int32Array, UInt32Array};
        let schema = Arc::new(Schema::new(vec![
            Field::new("i64", DataType::Int64, false),
            Field::new("i32", DataType::Int32, true),
            Field::new("u32", DataType::UInt32, false),
            Field::new("none", DataType::Int64, true),
        ]));
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(1).unwrap()))
            .set_max_row_group_row_count(Some(25_000))
            .build();
        let path = std::env::temp_dir().join(format!("trainio-segment-int-test-{}.parquet", std::process::id()));
        let mut seg = SegmentFile::new(File::create(&path).unwrap(), schema.clone(), props).unwrap();
        let mut x: u64 = 11;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut e64, mut e32, mut eu32) = (Vec::new(), Vec::new(), Vec::new());
        for batch in 0..6 {
            let rows = [1, 7_777, 20_000, 129, 31_000, 4_321][batch];
            let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
            while a.len() < rows {
                let r = next();
                let run = [1, 3, 127, 128, 129, 300, 2_000, 5][(r % 8) as usize].min(rows - a.len());
                let v64 = match (r >> 3) % 5 {
                    0 => i64::MIN,
                    1 => i64::MAX,
                    2 => (r >> 8) as i64,
                    _ => ((r >> 8) % 1000) as i64 - 500,
                };
                let v32 = match (r >> 11) % 6 {
                    0 => None,
                    1 => Some(i32::MIN),
                    2 => Some(i32::MAX),
                    _ => Some((r >> 20) as i32),
                };
                let vu = match (r >> 14) % 3 {
                    0 => u32::MAX - (r >> 40) as u32 % 3,
                    _ => (r >> 24) as u32 % 64,
                };
                for k in 0..run {
                    // Runs of one value, and steps of one within some runs.
                    let step = if (r >> 5) % 4 == 0 { k as i64 } else { 0 };
                    a.push(v64.wrapping_add(step));
                    b.push(v32);
                    c.push(vu);
                }
            }
            let batch = RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from(a.clone())),
                    Arc::new(Int32Array::from(b.clone())),
                    Arc::new(UInt32Array::from(c.clone())),
                    Arc::new(Int64Array::from(vec![None::<i64>; rows])),
                ],
            )
            .unwrap();
            seg.write(&batch).unwrap();
            e64.extend(a);
            e32.extend(b);
            eu32.extend(c);
        }
        seg.close().unwrap();

        let (mut g64, mut g32, mut gu32) = (Vec::new(), Vec::new(), Vec::new());
        let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(&path).unwrap()).unwrap().build().unwrap();
        for b in reader {
            let b = b.unwrap();
            g64.extend(b.column(0).as_primitive::<Int64Type>().values().iter().copied());
            g32.extend(b.column(1).as_primitive::<Int32Type>().iter());
            gu32.extend(b.column(2).as_primitive::<UInt32Type>().values().iter().copied());
            assert_eq!(b.column(3).null_count(), b.num_rows());
        }
        assert_eq!(g64, e64);
        assert_eq!(g32, e32);
        assert_eq!(gu32, eu32);

        let file = SerializedFileReader::new(File::open(&path).unwrap()).unwrap();
        let meta = file.metadata();
        assert!(meta.num_row_groups() >= 3, "row groups were split");
        let mut at = 0;
        for rg in meta.row_groups() {
            let n = rg.num_rows() as usize;
            let Some(Statistics::Int64(s)) = rg.column(0).statistics() else { panic!("no i64 statistics") };
            let r = &e64[at..at + n];
            assert_eq!((s.min_opt(), s.max_opt()), (r.iter().min(), r.iter().max()));
            let Some(Statistics::Int32(s)) = rg.column(1).statistics() else { panic!("no i32 statistics") };
            let r: Vec<i32> = e32[at..at + n].iter().flatten().copied().collect();
            assert_eq!((s.min_opt(), s.max_opt()), (r.iter().min(), r.iter().max()));
            assert_eq!(s.null_count_opt(), Some((n - r.len()) as u64));
            let Some(Statistics::Int32(s)) = rg.column(2).statistics() else { panic!("no u32 statistics") };
            let r = &eu32[at..at + n];
            assert_eq!(
                (s.min_opt().map(|&v| v as u32), s.max_opt().map(|&v| v as u32)),
                (r.iter().min().copied(), r.iter().max().copied())
            );
            assert_eq!(rg.column(3).statistics().and_then(|s| s.null_count_opt()), Some(n as u64));
            at += n;
        }
        std::fs::remove_file(&path).unwrap();
    }
}
