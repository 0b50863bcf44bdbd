//! The dictionary-encoded string columns' chunks (`layer`, `op`, `dev`, `comm`, `file`):
//! each batch's dictionary entries mapped once to the chunk's dictionary, rows kept as
//! runs of one index until their page is encoded.
use anyhow::{anyhow, Result};
use arrow_array::cast::AsArray;
use arrow_array::types::{ArrowDictionaryKeyType, Int16Type, Int32Type, Int8Type};
use arrow_array::{Array, ArrayRef};
use arrow_buffer::ArrowNativeType;
use arrow_schema::DataType;
use bytes::Bytes;
use parquet::basic::Encoding;
use parquet::column::writer::ColumnCloseResult;
use parquet::data_type::ByteArray;
use parquet::file::properties::WriterProperties;
use parquet::file::statistics::{Statistics, ValueStatistics};
use parquet::schema::types::ColumnDescPtr;
use rustc_hash::FxHashMap;

use super::chunk::{Chunk, PageParts};
use crate::encoding::{index_bit_width, plain_byte_arrays, rle_hybrid, RunList};

/// A dictionary string column's chunk in a row group: its dictionary (in order of first
/// use) and its data pages, encoded every PAGE_VALUES rows (a page's index bit width is
/// that of the dictionary so far) and compressed when the row group closes, after the
/// dictionary page is known.
pub(super) struct DictChunk {
    chunk: Chunk,
    values: Vec<Box<[u8]>>,
    ids: FxHashMap<Box<[u8]>, u32>,
    /// Dictionary indices of the values not yet in a page, as runs of one index. Trace
    /// columns hold long runs (one device, command or layer row after row), which the
    /// RLE/bit-packed hybrid then writes as they are.
    indices: RunList,
}

impl DictChunk {
    pub(super) fn new(descr: ColumnDescPtr, props: &WriterProperties) -> Self {
        DictChunk {
            chunk: Chunk::new(descr, props),
            values: Vec::new(),
            ids: FxHashMap::default(),
            indices: RunList::default(),
        }
    }

    pub(super) fn write(&mut self, array: &ArrayRef) -> Result<()> {
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
    pub(super) fn cut_pages(&mut self, all: bool) {
        let bit_width = index_bit_width(self.values.len());
        while let Some((rows, levels, present)) = self.chunk.next_page(all, self.indices.len) {
            let mut values = vec![bit_width];
            values.extend(rle_hybrid(&self.indices.take(present), bit_width));
            self.chunk.pages.push(PageParts { rows, present, levels, values });
        }
    }

    pub(super) fn estimated_bytes(&self) -> usize {
        // Encoded pages shrink further under zstd; pending runs count 8 bytes each.
        self.values.iter().map(|v| v.len() + 4).sum::<usize>()
            + self.chunk.pages_bytes()
            + 8 * (self.chunk.levels.runs.len() + self.indices.runs.len())
    }

    /// The chunk's bytes and what the row group writer needs to know of them.
    pub(super) fn finish(mut self) -> Result<(Bytes, ColumnCloseResult)> {
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
