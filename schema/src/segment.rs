//! One Parquet segment file. Its column chunks are assembled here, into pages and row
//! groups: the dictionary-encoded string columns (`layer`, `op`, `dev`, `comm`, `file`)
//! by DictChunk, the Int64, Int32 and UInt32 columns by IntChunk, their values encoded by
//! encoding.rs; a column of any other type goes through the parquet crate's Arrow column
//! writer. The crate lays out the file, footer and row groups. What the two kinds of
//! chunk share (pages, levels, the chunk's layout) is segment/chunk.rs.
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

use anyhow::Result;
use arrow_array::RecordBatch;
use arrow_schema::{DataType, SchemaRef};
use parquet::arrow::arrow_writer::{compute_leaves, ArrowColumnWriter, ArrowRowGroupWriterFactory};
use parquet::arrow::{add_encoded_arrow_schema_to_metadata, ArrowSchemaConverter};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;

mod chunk;
mod dict;
mod int;

use dict::DictChunk;
use int::IntChunk;

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

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Int32Type, Int64Type, UInt32Type};
    use arrow_array::{ArrayRef, DictionaryArray, Int64Array, StringArray};
    use arrow_schema::{Field, Schema};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::basic::Compression;
    use parquet::basic::ZstdLevel;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::file::statistics::Statistics;

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
