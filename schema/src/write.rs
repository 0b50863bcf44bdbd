//! Writing: rows → Arrow batches → numbered Parquet segments.
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use arrow_array::builder::{
    Int32Builder, Int64Builder, StringDictionaryBuilder, UInt32Builder,
};
use arrow_array::types::{Int16Type, Int32Type, Int8Type};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::SchemaRef;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{WriterProperties, WriterVersion};
use parquet::schema::types::ColumnPath;

use crate::{arrow_schema, Row};

/// Accumulates rows column by column.
pub struct BatchBuilder {
    schema: SchemaRef,
    layer: StringDictionaryBuilder<Int8Type>,
    op: StringDictionaryBuilder<Int8Type>,
    issue_ns: Int64Builder,
    complete_ns: Int64Builder,
    insert_ns: Int64Builder,
    dev: StringDictionaryBuilder<Int16Type>,
    offset: Int64Builder,
    bytes: Int64Builder,
    bytes_requested: Int64Builder,
    queue_depth: UInt32Builder,
    pid: UInt32Builder,
    tid: UInt32Builder,
    comm: StringDictionaryBuilder<Int32Type>,
    fd: Int32Builder,
    file: StringDictionaryBuilder<Int32Type>,
    error: Int32Builder,
    flags: UInt32Builder,
    len: usize,
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
            layer: StringDictionaryBuilder::new(),
            op: StringDictionaryBuilder::new(),
            issue_ns: Int64Builder::new(),
            complete_ns: Int64Builder::new(),
            insert_ns: Int64Builder::new(),
            dev: StringDictionaryBuilder::new(),
            offset: Int64Builder::new(),
            bytes: Int64Builder::new(),
            bytes_requested: Int64Builder::new(),
            queue_depth: UInt32Builder::new(),
            pid: UInt32Builder::new(),
            tid: UInt32Builder::new(),
            comm: StringDictionaryBuilder::new(),
            fd: Int32Builder::new(),
            file: StringDictionaryBuilder::new(),
            error: Int32Builder::new(),
            flags: UInt32Builder::new(),
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn push(&mut self, r: &Row) {
        // Dictionary keys overflow only past 127 ops/layers or 32767 devices per batch.
        self.layer.append(r.layer.as_str()).expect("layer dictionary");
        self.op.append(r.op).expect("op dictionary");
        self.issue_ns.append_value(r.issue_ns);
        self.complete_ns.append_value(r.complete_ns);
        self.insert_ns.append_option(r.insert_ns);
        match r.dev {
            Some(d) => drop(self.dev.append(d).expect("dev dictionary")),
            None => self.dev.append_null(),
        }
        self.offset.append_option(r.offset);
        self.bytes.append_value(r.bytes);
        self.bytes_requested.append_value(r.bytes_requested);
        self.queue_depth.append_value(r.queue_depth);
        self.pid.append_value(r.pid);
        self.tid.append_value(r.tid);
        self.comm.append(r.comm).expect("comm dictionary");
        self.fd.append_option(r.fd);
        match r.file {
            Some(f) => drop(self.file.append(f).expect("file dictionary")),
            None => self.file.append_null(),
        }
        self.error.append_value(r.error);
        self.flags.append_value(r.flags);
        self.len += 1;
    }

    /// Takes the rows pushed so far as one batch and starts empty again.
    pub fn finish(&mut self) -> RecordBatch {
        let columns: Vec<ArrayRef> = vec![
            std::sync::Arc::new(self.layer.finish()),
            std::sync::Arc::new(self.op.finish()),
            std::sync::Arc::new(self.issue_ns.finish()),
            std::sync::Arc::new(self.complete_ns.finish()),
            std::sync::Arc::new(self.insert_ns.finish()),
            std::sync::Arc::new(self.dev.finish()),
            std::sync::Arc::new(self.offset.finish()),
            std::sync::Arc::new(self.bytes.finish()),
            std::sync::Arc::new(self.bytes_requested.finish()),
            std::sync::Arc::new(self.queue_depth.finish()),
            std::sync::Arc::new(self.pid.finish()),
            std::sync::Arc::new(self.tid.finish()),
            std::sync::Arc::new(self.comm.finish()),
            std::sync::Arc::new(self.fd.finish()),
            std::sync::Arc::new(self.file.finish()),
            std::sync::Arc::new(self.error.finish()),
            std::sync::Arc::new(self.flags.finish()),
        ];
        self.len = 0;
        RecordBatch::try_new(self.schema.clone(), columns).expect("batch matches schema")
    }
}

/// When a segment is closed and the next one started.
#[derive(Clone, Copy, Debug)]
pub struct SegmentLimits {
    pub max_bytes: u64,
    pub max_age: Duration,
}

/// Parquet settings: zstd, and delta encoding for the nearly-sorted time and offset
/// columns (plain + zstd stores random-looking nanosecond stamps at ~5 bytes each).
fn writer_properties() -> WriterProperties {
    let mut props = WriterProperties::builder()
        .set_writer_version(WriterVersion::PARQUET_2_0)
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3).expect("zstd level")))
        .set_max_row_group_row_count(Some(1 << 20));
    for col in ["issue_ns", "complete_ns", "insert_ns", "offset"] {
        let path = ColumnPath::from(col);
        props = props
            .set_column_dictionary_enabled(path.clone(), false)
            .set_column_encoding(path, Encoding::DELTA_BINARY_PACKED);
    }
    props.build()
}

struct OpenSegment {
    writer: ArrowWriter<File>,
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
            let writer = ArrowWriter::try_new(file, arrow_schema(), Some(writer_properties()))
                .context("starting a Parquet segment")?;
            self.current = Some(OpenSegment { writer, partial, done, opened: Instant::now() });
        }
        Ok(())
    }

    /// True when the open segment has reached its size or age limit.
    pub fn segment_full(&self) -> bool {
        self.current.as_ref().is_some_and(|s| {
            (s.writer.bytes_written() + s.writer.in_progress_size()) as u64 >= self.limits.max_bytes
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
