//! The Int64, Int32 and UInt32 columns' chunks, DELTA_BINARY_PACKED: a block of equal
//! values costs one comparison per value.
use anyhow::{anyhow, Result};
use arrow_array::cast::AsArray;
use arrow_array::types::{ArrowPrimitiveType, Int32Type, Int64Type, UInt32Type};
use arrow_array::{Array, ArrayRef, PrimitiveArray};
use arrow_schema::DataType;
use bytes::Bytes;
use parquet::basic::Encoding;
use parquet::column::writer::ColumnCloseResult;
use parquet::file::properties::WriterProperties;
use parquet::file::statistics::{Statistics, ValueStatistics};
use parquet::schema::types::ColumnDescPtr;

use super::chunk::{Chunk, PageParts};
use crate::encoding::delta_binary_packed;

/// An integer column's chunk in a row group, DELTA_BINARY_PACKED (blocks of 128 deltas,
/// 4 miniblocks of 32), in data pages of PAGE_VALUES rows encoded as rows arrive.
///
/// A block of 128 equal values is a zero minimum delta and four zero bit widths.
///
/// Values are kept as i64 (INT32 columns as their 32-bit pattern, sign-extended);
/// deltas wrap in the physical type, as the format asks.
pub(super) struct IntChunk {
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
    pub(super) fn new(descr: ColumnDescPtr, data_type: &DataType, props: &WriterProperties) -> Option<Self> {
        let (int32, unsigned) = match data_type {
            DataType::Int64 => (false, false),
            DataType::Int32 => (true, false),
            DataType::UInt32 => (true, true),
            _ => return None,
        };
        Some(IntChunk { chunk: Chunk::new(descr, props), int32, unsigned, values: Vec::new(), min_max: None })
    }

    pub(super) fn write(&mut self, array: &ArrayRef) -> Result<()> {
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
    pub(super) fn cut_pages(&mut self, all: bool) {
        let mut at = 0;
        while let Some((rows, levels, present)) = self.chunk.next_page(all, self.values.len() - at) {
            let values =
                if present > 0 { delta_binary_packed(&self.values[at..at + present], self.int32) } else { Vec::new() };
            self.chunk.pages.push(PageParts { rows, present, levels, values });
            at += present;
        }
        self.values.drain(..at);
    }

    pub(super) fn estimated_bytes(&self) -> usize {
        // Encoded pages shrink further under zstd; pending values count a byte each.
        self.chunk.pages_bytes() + self.values.len()
    }

    pub(super) fn finish(mut self) -> Result<(Bytes, ColumnCloseResult)> {
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
