//! Writing: rows → Arrow batches → numbered Parquet segments.
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use std::sync::Arc;

use arrow_array::builder::{Int32Builder, Int64Builder, PrimitiveBuilder, UInt32Builder};
use arrow_array::types::{ArrowDictionaryKeyType, ArrowPrimitiveType, Int16Type, Int32Type, Int64Type, Int8Type, UInt32Type};
use arrow_array::{ArrayRef, DictionaryArray, RecordBatch, StringArray};
use arrow_schema::ArrowError;
use rustc_hash::FxHashMap;
use arrow_schema::SchemaRef;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::schema::types::ColumnPath;

use crate::segment::SegmentFile;
use crate::{arrow_schema, Row, Rpc};

/// A dictionary-encoded string column. The tracer appends the same few strings (layer,
/// op, device, command) to every row, so the previous row's value is compared first and
/// only a change pays for a hash lookup; this halved the tracer's CPU per event compared
/// with Arrow's generic dictionary builder.
struct DictColumn<K: ArrowDictionaryKeyType> {
    keys: PrimitiveBuilder<K>,
    values: Vec<Box<str>>,
    index: FxHashMap<Box<str>, usize>,
    last: Option<usize>,
    /// The caller's key for `last` (append_keyed): a match skips comparing strings.
    last_key: Option<u128>,
    /// Nulls not yet appended to `keys` (appended in bulk before the next value).
    nulls: usize,
}

impl<K: ArrowDictionaryKeyType> DictColumn<K> {
    fn new() -> Self {
        DictColumn {
            keys: PrimitiveBuilder::new(),
            values: Vec::new(),
            index: FxHashMap::default(),
            last: None,
            last_key: None,
            nulls: 0,
        }
    }

    /// Appends `v`, known to the caller by `key` (equal keys: equal strings), so that a
    /// run of one value costs a key comparison per row.
    fn append_keyed(&mut self, key: u128, v: &str) -> Result<(), ArrowError> {
        match self.last {
            Some(i) if self.last_key == Some(key) => self.push_key(i),
            _ => {
                self.append(v)?;
                self.last_key = Some(key);
                Ok(())
            }
        }
    }

    fn push_key(&mut self, i: usize) -> Result<(), ArrowError> {
        if self.nulls > 0 {
            self.keys.append_nulls(std::mem::take(&mut self.nulls));
        }
        let key = <K::Native as arrow_buffer::ArrowNativeType>::from_usize(i)
            .ok_or_else(|| ArrowError::DictionaryKeyOverflowError)?;
        self.keys.append_value(key);
        Ok(())
    }

    fn append(&mut self, v: &str) -> Result<(), ArrowError> {
        self.last_key = None;
        let i = match self.last {
            // Static and interned strings compare by address; the rest by content.
            Some(i) if std::ptr::eq(self.values[i].as_ptr(), v.as_ptr()) && self.values[i].len() == v.len() => i,
            Some(i) if &*self.values[i] == v => i,
            _ => {
                let i = match self.index.get(v) {
                    Some(&i) => i,
                    None => {
                        let i = self.values.len();
                        self.values.push(v.into());
                        self.index.insert(v.into(), i);
                        i
                    }
                };
                self.last = Some(i);
                i
            }
        };
        self.push_key(i)
    }

    fn append_null(&mut self) {
        self.nulls += 1;
    }

    /// Sizes the (empty) column for `rows` rows.
    fn reserve(&mut self, rows: usize) {
        self.keys = PrimitiveBuilder::with_capacity(rows);
    }

    /// The column so far; starts empty again (each batch carries its own dictionary).
    fn finish(&mut self) -> DictionaryArray<K> {
        self.keys.append_nulls(std::mem::take(&mut self.nulls));
        let keys = self.keys.finish();
        let values = StringArray::from_iter_values(self.values.drain(..));
        self.index.clear();
        self.last = None;
        self.last_key = None;
        DictionaryArray::try_new(keys, Arc::new(values)).expect("keys index the values")
    }
}

/// A nullable integer column whose nulls are appended in bulk (before the next value, or
/// at finish): block rows leave the file and RPC columns null, row after row.
struct Nullable<T: ArrowPrimitiveType> {
    values: PrimitiveBuilder<T>,
    nulls: usize,
}

impl<T: ArrowPrimitiveType> Nullable<T> {
    fn with_capacity(rows: usize) -> Self {
        Nullable { values: PrimitiveBuilder::with_capacity(rows), nulls: 0 }
    }

    #[inline]
    fn append_option(&mut self, v: Option<T::Native>) {
        match v {
            None => self.nulls += 1,
            Some(v) => {
                if self.nulls > 0 {
                    self.values.append_nulls(std::mem::take(&mut self.nulls));
                }
                self.values.append_value(v);
            }
        }
    }

    fn finish(&mut self) -> arrow_array::PrimitiveArray<T> {
        self.values.append_nulls(std::mem::take(&mut self.nulls));
        self.values.finish()
    }
}

/// What the caller knows a row's strings by (BatchBuilder::push_keyed): equal keys in one
/// column mean equal strings.
#[derive(Clone, Copy, Debug)]
pub struct RowKeys {
    pub op: u32,
    pub dev: u32,
    pub comm: u128,
}

/// Accumulates rows column by column.
pub struct BatchBuilder {
    schema: SchemaRef,
    layer: DictColumn<Int8Type>,
    op: DictColumn<Int8Type>,
    issue_ns: Int64Builder,
    complete_ns: Int64Builder,
    insert_ns: Nullable<Int64Type>,
    dev: DictColumn<Int16Type>,
    offset: Nullable<Int64Type>,
    bytes: Int64Builder,
    bytes_requested: Int64Builder,
    queue_depth: UInt32Builder,
    pid: UInt32Builder,
    tid: UInt32Builder,
    comm: DictColumn<Int32Type>,
    fd: Nullable<Int32Type>,
    file: DictColumn<Int32Type>,
    error: Int32Builder,
    flags: UInt32Builder,
    rpc_xid: Nullable<UInt32Type>,
    rpc_backlog_ns: Nullable<Int64Type>,
    rpc_rtt_ns: Nullable<Int64Type>,
    rpc_execute_ns: Nullable<Int64Type>,
    rpc_retrans: Nullable<UInt32Type>,
    len: usize,
    /// Rows each column is sized for after every finish (0: grow as needed).
    capacity: usize,
}

impl Default for BatchBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl BatchBuilder {
    pub fn new() -> Self {
        BatchBuilder {
            schema: arrow_schema(),
            layer: DictColumn::new(),
            op: DictColumn::new(),
            issue_ns: Int64Builder::new(),
            complete_ns: Int64Builder::new(),
            insert_ns: Nullable::with_capacity(0),
            dev: DictColumn::new(),
            offset: Nullable::with_capacity(0),
            bytes: Int64Builder::new(),
            bytes_requested: Int64Builder::new(),
            queue_depth: UInt32Builder::new(),
            pid: UInt32Builder::new(),
            tid: UInt32Builder::new(),
            comm: DictColumn::new(),
            fd: Nullable::with_capacity(0),
            file: DictColumn::new(),
            error: Int32Builder::new(),
            flags: UInt32Builder::new(),
            rpc_xid: Nullable::with_capacity(0),
            rpc_backlog_ns: Nullable::with_capacity(0),
            rpc_rtt_ns: Nullable::with_capacity(0),
            rpc_execute_ns: Nullable::with_capacity(0),
            rpc_retrans: Nullable::with_capacity(0),
            len: 0,
            capacity: 0,
        }
    }

    /// A builder whose columns hold `rows` rows without reallocating, again after every
    /// [`finish`](Self::finish) (the tracer's drain path: no copying as columns grow).
    pub fn with_capacity(rows: usize) -> Self {
        let mut b = Self::new();
        b.capacity = rows;
        b.reserve(rows);
        b
    }

    /// Sizes every (empty) column for `rows` rows.
    fn reserve(&mut self, rows: usize) {
        self.layer.reserve(rows);
        self.op.reserve(rows);
        self.dev.reserve(rows);
        self.comm.reserve(rows);
        self.file.reserve(rows);
        self.issue_ns = Int64Builder::with_capacity(rows);
        self.complete_ns = Int64Builder::with_capacity(rows);
        self.insert_ns = Nullable::with_capacity(rows);
        self.offset = Nullable::with_capacity(rows);
        self.bytes = Int64Builder::with_capacity(rows);
        self.bytes_requested = Int64Builder::with_capacity(rows);
        self.queue_depth = UInt32Builder::with_capacity(rows);
        self.pid = UInt32Builder::with_capacity(rows);
        self.tid = UInt32Builder::with_capacity(rows);
        self.fd = Nullable::with_capacity(rows);
        self.error = Int32Builder::with_capacity(rows);
        self.flags = UInt32Builder::with_capacity(rows);
        self.rpc_xid = Nullable::with_capacity(rows);
        self.rpc_backlog_ns = Nullable::with_capacity(rows);
        self.rpc_rtt_ns = Nullable::with_capacity(rows);
        self.rpc_execute_ns = Nullable::with_capacity(rows);
        self.rpc_retrans = Nullable::with_capacity(rows);
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A row without RPC fields (every layer but nfs, and nfs rows not joined).
    pub fn push(&mut self, r: &Row) {
        self.push_rpc(r, None)
    }

    /// A row whose device and command the caller knows by number (the kernel's dev_t and
    /// the raw 16-byte comm): runs of one device or command skip the string comparison.
    pub fn push_keyed(&mut self, r: &Row, keys: RowKeys) {
        self.push_with(r, None, Some(keys))
    }

    /// A row with the RPC that carried it (nfs layer).
    pub fn push_rpc(&mut self, r: &Row, rpc: Option<&Rpc>) {
        self.push_with(r, rpc, None)
    }

    #[inline]
    fn push_with(&mut self, r: &Row, rpc: Option<&Rpc>, keys: Option<RowKeys>) {
        // Dictionary keys overflow only past 127 ops/layers or 32767 devices per batch.
        self.layer.append_keyed(r.layer as u128, r.layer.as_str()).expect("layer dictionary");
        match keys {
            Some(k) => self.op.append_keyed(k.op.into(), r.op),
            None => self.op.append(r.op),
        }
        .expect("op dictionary");
        self.issue_ns.append_value(r.issue_ns);
        self.complete_ns.append_value(r.complete_ns);
        self.insert_ns.append_option(r.insert_ns);
        match (r.dev, keys) {
            (Some(d), Some(k)) => self.dev.append_keyed(k.dev.into(), d).expect("dev dictionary"),
            (Some(d), None) => self.dev.append(d).expect("dev dictionary"),
            (None, _) => self.dev.append_null(),
        }
        self.offset.append_option(r.offset);
        self.bytes.append_value(r.bytes);
        self.bytes_requested.append_value(r.bytes_requested);
        self.queue_depth.append_value(r.queue_depth);
        self.pid.append_value(r.pid);
        self.tid.append_value(r.tid);
        match keys {
            Some(k) => self.comm.append_keyed(k.comm, r.comm),
            None => self.comm.append(r.comm),
        }
        .expect("comm dictionary");
        self.fd.append_option(r.fd);
        match r.file {
            Some(f) => self.file.append(f).expect("file dictionary"),
            None => self.file.append_null(),
        }
        self.error.append_value(r.error);
        self.flags.append_value(r.flags);
        self.rpc_xid.append_option(rpc.map(|p| p.xid));
        self.rpc_backlog_ns.append_option(rpc.map(|p| p.backlog_ns));
        self.rpc_rtt_ns.append_option(rpc.map(|p| p.rtt_ns));
        self.rpc_execute_ns.append_option(rpc.map(|p| p.execute_ns));
        self.rpc_retrans.append_option(rpc.and_then(|p| p.retrans));
        self.len += 1;
    }

    /// Takes the rows pushed so far as one batch and starts empty again.
    pub fn finish(&mut self) -> RecordBatch {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.layer.finish()),
            Arc::new(self.op.finish()),
            Arc::new(self.issue_ns.finish()),
            Arc::new(self.complete_ns.finish()),
            Arc::new(self.insert_ns.finish()),
            Arc::new(self.dev.finish()),
            Arc::new(self.offset.finish()),
            Arc::new(self.bytes.finish()),
            Arc::new(self.bytes_requested.finish()),
            Arc::new(self.queue_depth.finish()),
            Arc::new(self.pid.finish()),
            Arc::new(self.tid.finish()),
            Arc::new(self.comm.finish()),
            Arc::new(self.fd.finish()),
            Arc::new(self.file.finish()),
            Arc::new(self.error.finish()),
            Arc::new(self.flags.finish()),
            Arc::new(self.rpc_xid.finish()),
            Arc::new(self.rpc_backlog_ns.finish()),
            Arc::new(self.rpc_rtt_ns.finish()),
            Arc::new(self.rpc_execute_ns.finish()),
            Arc::new(self.rpc_retrans.finish()),
        ];
        self.len = 0;
        if self.capacity > 0 {
            self.reserve(self.capacity);
        }
        RecordBatch::try_new(self.schema.clone(), columns).expect("batch matches schema")
    }
}

/// When a segment is closed and the next one started.
#[derive(Clone, Copy, Debug)]
pub struct SegmentLimits {
    pub max_bytes: u64,
    pub max_age: Duration,
}

/// Parquet settings, chosen for the tracer's drain path (CPU per row) at ~7 bytes per
/// row: every integer column is delta-encoded without a dictionary (a dictionary costs a
/// hash per value per row; constant or slowly varying columns delta-pack to a few bits),
/// strings are dictionary-encoded, pages are zstd level 1, statistics are per column
/// chunk (row group) rather than per page, and not for `comm` and `file`.
fn writer_properties() -> WriterProperties {
    let mut props = WriterProperties::builder()
        .set_writer_version(WriterVersion::PARQUET_2_0)
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1).expect("zstd level")))
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_max_row_group_row_count(Some(1 << 20));
    for field in arrow_schema().fields() {
        if field.data_type().is_integer() {
            let path = ColumnPath::from(field.name().as_str());
            props = props
                .set_column_dictionary_enabled(path.clone(), false)
                .set_column_encoding(path, Encoding::DELTA_BINARY_PACKED);
        } else if matches!(field.name().as_str(), "comm" | "file") {
            // String min/max is a comparison per row (a memcmp call each); readers use it
            // for layer, op and dev (a row group with one value skips decoding them), not
            // for these.
            props = props.set_column_statistics_enabled(ColumnPath::from(field.name().as_str()), EnabledStatistics::None);
        }
    }
    props.build()
}

struct OpenSegment {
    writer: SegmentFile,
    partial: PathBuf,
    done: PathBuf,
    opened: Instant,
}

/// Writes a trace directory segment by segment.
pub struct TraceWriter {
    dir: PathBuf,
    limits: SegmentLimits,
    next_index: u32,
    current: Option<OpenSegment>,
    finished: Vec<PathBuf>,
}

impl TraceWriter {
    /// `dir` must exist; the caller has checked that it is empty.
    pub fn new(dir: &Path, limits: SegmentLimits) -> Self {
        TraceWriter {
            dir: dir.to_path_buf(),
            limits,
            next_index: 0,
            current: None,
            finished: Vec::new(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Index of the segment that the next [`write`](Self::write) goes to.
    pub fn segment_index(&self) -> u32 {
        self.next_index
    }

    pub fn finished_segments(&self) -> &[PathBuf] {
        &self.finished
    }

    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        self.open()?;
        let seg = self.current.as_mut().expect("segment open");
        seg.writer
            .write(batch)
            .with_context(|| format!("writing {}", seg.partial.display()))
    }

    /// Starts a segment unless one is open, so that even a trace without rows has one
    /// segment to carry its metadata.
    pub fn open(&mut self) -> Result<()> {
        if self.current.is_none() {
            let name = format!("seg-{:06}.parquet", self.next_index);
            let done = self.dir.join(&name);
            let partial = self.dir.join(format!("{name}.partial"));
            let file = File::create(&partial)
                .with_context(|| format!("creating {}", partial.display()))?;
            let writer = SegmentFile::new(file, arrow_schema(), writer_properties())
                .context("starting a Parquet segment")?;
            self.current = Some(OpenSegment { writer, partial, done, opened: Instant::now() });
        }
        Ok(())
    }

    /// True when the open segment has reached its size or age limit.
    pub fn segment_full(&self) -> bool {
        self.current.as_ref().is_some_and(|s| {
            s.writer.size() >= self.limits.max_bytes
                || s.opened.elapsed() >= self.limits.max_age
        })
    }

    /// Closes the open segment (if any) with these key-value metadata and renames it into
    /// place. Returns the finished segment's path.
    pub fn close_segment(&mut self, metadata: &[(String, String)]) -> Result<Option<PathBuf>> {
        let Some(mut seg) = self.current.take() else {
            return Ok(None);
        };
        for (k, v) in metadata {
            seg.writer.append_key_value_metadata(KeyValue::new(k.clone(), v.clone()));
        }
        seg.writer
            .close()
            .with_context(|| format!("closing {}", seg.partial.display()))?;
        fs::rename(&seg.partial, &seg.done)
            .with_context(|| format!("renaming {} into place", seg.partial.display()))?;
        self.next_index += 1;
        self.finished.push(seg.done.clone());
        Ok(Some(seg.done))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::cast::AsArray;
    use arrow_array::Array;

    fn strings(a: &ArrayRef) -> Vec<Option<String>> {
        let d = a.as_any_dictionary();
        let values = d.values().as_string::<i32>();
        let keys = arrow_cast::cast(d.keys(), &arrow_schema::DataType::Int64).unwrap();
        let keys = keys.as_primitive::<arrow_array::types::Int64Type>();
        (0..a.len())
            .map(|i| keys.is_valid(i).then(|| values.value(keys.value(i) as usize).to_string()))
            .collect()
    }

    #[test]
    fn dictionary_columns_keep_every_value_across_batches() {
        let mut b = BatchBuilder::new();
        let comms = ["fio", "fio", "kworker/0:1", "fio", "dd", "kworker/0:1"];
        let devs = [Some("7:0"), Some("7:0"), None, Some("259:1"), Some("7:0"), None];
        for round in 0..2 {
            for (i, (c, d)) in comms.iter().zip(devs).enumerate() {
                b.push(&Row {
                    layer: if i % 2 == 0 { crate::Layer::Block } else { crate::Layer::File },
                    op: if i == 4 { "write" } else { "read" },
                    issue_ns: i as i64,
                    complete_ns: i as i64 + 1,
                    dev: d,
                    comm: c,
                    file: (round == 1).then_some("/data/x"),
                    ..Row::sample()
                });
            }
            // Each batch carries its own, complete dictionary.
            let batch = b.finish();
            let col = |n: &str| strings(batch.column_by_name(n).unwrap());
            assert_eq!(col("comm"), comms.iter().map(|c| Some(c.to_string())).collect::<Vec<_>>());
            assert_eq!(col("dev"), devs.iter().map(|d| d.map(str::to_string)).collect::<Vec<_>>());
            assert_eq!(col("layer")[..3], [Some("block".into()), Some("file".into()), Some("block".into())]);
            assert_eq!(col("op")[4], Some("write".into()));
            assert_eq!(col("op")[5], Some("read".into()));
            let want_file = (round == 1).then(|| "/data/x".to_string());
            assert!(col("file").iter().all(|f| *f == want_file));
            let comm_dict = batch.column_by_name("comm").unwrap().as_any_dictionary().values().len();
            assert_eq!(comm_dict, 3, "one dictionary entry per distinct value");
        }
    }

    fn row<'a>(comm: &'a str, dev: Option<&'a str>, insert_ns: Option<i64>, fd: Option<i32>) -> Row<'a> {
        Row { comm, dev, insert_ns, fd, ..Row::sample() }
    }

    #[test]
    fn keyed_rows_and_bulk_nulls_read_back_as_pushed() {
        let mut b = BatchBuilder::with_capacity(16);
        let keys = |comm: u128| RowKeys { op: 0, dev: 7, comm };
        // (comm, its key or None for an unkeyed push, insert_ns, fd)
        let rows: [(&str, Option<u128>, Option<i64>, Option<i32>); 7] = [
            ("fio", Some(1), None, None),
            ("fio", Some(1), Some(5), None),
            ("dd", None, None, Some(3)), // an unkeyed push between two keyed ones
            ("fio", Some(1), None, None),
            ("kworker", Some(2), None, None),
            ("kworker", Some(2), Some(9), Some(4)),
            ("fio", Some(1), None, None),
        ];
        for round in 0..2 {
            for (comm, key, ins, fd) in rows {
                let r = row(comm, Some("7:0"), ins, fd);
                match key {
                    Some(k) => b.push_keyed(&r, keys(k)),
                    None => b.push(&r),
                }
            }
            // A new batch starts a new dictionary: the first keyed row must not reuse a
            // key of the last batch's dictionary.
            let batch = b.finish();
            let col = |n: &str| strings(batch.column_by_name(n).unwrap());
            assert_eq!(col("comm"), rows.iter().map(|r| Some(r.0.to_string())).collect::<Vec<_>>(), "round {round}");
            assert!(col("dev").iter().all(|d| d.as_deref() == Some("7:0")));
            let ins = batch.column_by_name("insert_ns").unwrap().as_primitive::<arrow_array::types::Int64Type>();
            assert_eq!(ins.iter().collect::<Vec<_>>(), rows.iter().map(|r| r.2).collect::<Vec<_>>());
            let fd = batch.column_by_name("fd").unwrap().as_primitive::<arrow_array::types::Int32Type>();
            assert_eq!(fd.iter().collect::<Vec<_>>(), rows.iter().map(|r| r.3).collect::<Vec<_>>());
            let xid = batch.column_by_name("rpc_xid").unwrap();
            assert_eq!((xid.len(), xid.null_count()), (7, 7));
        }
    }
}
