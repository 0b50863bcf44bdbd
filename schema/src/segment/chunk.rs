//! A column chunk's data pages, shared by the dictionary and integer columns (dict.rs,
//! int.rs): the definition levels of the rows not yet in a page, the pages cut every
//! PAGE_VALUES rows, and the chunk's layout (dictionary page, data pages, zstd, column
//! metadata and statistics) when its row group closes.
use anyhow::{anyhow, Result};
use arrow_buffer::NullBuffer;
use bytes::Bytes;
use parquet::basic::{Compression, Encoding};
use parquet::column::page::{CompressedPage, Page, PageWriter};
use parquet::column::writer::ColumnCloseResult;
use parquet::file::metadata::ColumnChunkMetaData;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::statistics::Statistics;
use parquet::file::writer::{SerializedPageWriter, TrackedWrite};
use parquet::schema::types::ColumnDescPtr;

use crate::encoding::{rle_hybrid, RunList};

/// Values per data page of a dictionary column (the crate's default page row limit).
pub(super) const PAGE_VALUES: usize = 20_000;

/// What the dictionary and integer column chunks share: the column and its settings, the
/// definition levels of rows not yet in a page (nullable columns only), the pages so far
/// and the counts; and the chunk's layout when the row group closes.
pub(super) struct Chunk {
    descr: ColumnDescPtr,
    zstd_level: Option<i32>,
    pub(super) statistics: bool,
    /// Rows not yet in a page, as runs: 1 for a value, 0 for a null.
    pub(super) levels: RunList,
    pub(super) pages: Vec<PageParts>,
    rows: u64,
    pub(super) nulls: u64,
}

/// A data page before compression: RLE definition levels (nullable columns) and the
/// encoded values (for dictionary columns, the bit width byte and the indices).
pub(super) struct PageParts {
    pub(super) rows: usize,
    /// Rows with a value; a page without any is written PLAIN (levels only).
    pub(super) present: usize,
    pub(super) levels: Vec<u8>,
    pub(super) values: Vec<u8>,
}

impl Chunk {
    pub(super) fn new(descr: ColumnDescPtr, props: &WriterProperties) -> Self {
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
    pub(super) fn push_rows(&mut self, len: usize, nulls: Option<&NullBuffer>) -> Result<()> {
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
    pub(super) fn next_page(&mut self, all: bool, pending_values: usize) -> Option<(usize, Vec<u8>, usize)> {
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
    pub(super) fn pages_bytes(&self) -> usize {
        self.pages.iter().map(|p| p.levels.len() + p.values.len()).sum()
    }

    /// The chunk's bytes as the parquet crate lays them out (the dictionary page, if any,
    /// then v1 data pages, each compressed), and what the row group writer needs to know
    /// of them. `dictionary`: a PLAIN dictionary page's body and its entry count;
    /// `value_encoding`: that of the pages' values (pages without values are PLAIN,
    /// levels only).
    pub(super) fn write(
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

pub(super) fn compress(zstd_level: Option<i32>, body: Vec<u8>) -> Result<(Bytes, usize)> {
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
