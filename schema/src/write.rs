//! Writing: Arrow batches (batch.rs) → numbered Parquet segments, each closed with its
//! metadata, renamed into place, and removed again by retention.
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use arrow_array::RecordBatch;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::schema::types::ColumnPath;

use crate::arrow_schema;
use crate::segment::SegmentFile;

/// When a segment is closed and the next one started.
#[derive(Clone, Copy, Debug)]
pub struct SegmentLimits {
    pub max_bytes: u64,
    pub max_age: Duration,
}

/// What a trace keeps of itself while it is written (`trainio record --retain-mb`,
/// `--retain-s`): when a segment is closed, the oldest finished segments are removed
/// until the rest (the closing one included) fit `max_bytes` and none closed more than
/// `max_age` ago. The newest finished segment always stays, so a reader finds a trace
/// (and its metadata) at every moment; the open segment is never removed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Retention {
    pub max_bytes: Option<u64>,
    pub max_age: Option<Duration>,
}

impl Retention {
    pub fn is_on(&self) -> bool {
        self.max_bytes.is_some() || self.max_age.is_some()
    }
}

/// What retention has removed so far (SCHEMA.md, `trainio.retention`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dropped {
    pub segments: u64,
    pub rows: u64,
    pub bytes: u64,
    /// `trainio.end_ns` of the newest removed segment: rows before it may be missing.
    pub until_ns: Option<i64>,
}

/// A finished segment as retention sees it.
#[derive(Clone, Debug)]
struct Kept {
    bytes: u64,
    rows: u64,
    closed: Instant,
    end_ns: Option<i64>,
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
            props =
                props.set_column_statistics_enabled(ColumnPath::from(field.name().as_str()), EnabledStatistics::None);
        }
    }
    props.build()
}

struct OpenSegment {
    writer: SegmentFile,
    partial: PathBuf,
    done: PathBuf,
    opened: Instant,
    rows: u64,
}

/// Writes a trace directory segment by segment.
pub struct TraceWriter {
    dir: PathBuf,
    limits: SegmentLimits,
    next_index: u32,
    current: Option<OpenSegment>,
    finished: Vec<PathBuf>,
    /// Size, rows and closing time of each of `finished`.
    kept: Vec<Kept>,
    retention: Retention,
    dropped: Dropped,
    /// `trainio.start_ns` as the first segment's metadata gave it (the recording's start).
    recording_start_ns: Option<String>,
    lost_rows: u64,
    /// A file of real blocks held until the last segment is written (SCHEMA.md, *The
    /// end of a recording*): on a full disk, removing it makes room for that segment.
    reserve: Option<(PathBuf, u64)>,
}

/// The reserve's name in the trace directory; readers ignore it (not a segment).
pub const RESERVE_NAME: &str = ".trainio-reserve";

impl Drop for TraceWriter {
    fn drop(&mut self) {
        self.release_reserve();
    }
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
            kept: Vec::new(),
            retention: Retention::default(),
            dropped: Dropped::default(),
            recording_start_ns: None,
            lost_rows: 0,
            reserve: None,
        }
    }

    /// Holds `bytes` of the trace's file system in a reserve file of written (not sparse)
    /// blocks, so that [`release_reserve`](Self::release_reserve) can free them for the
    /// last segment when the disk has filled meanwhile.
    pub fn hold_reserve(&mut self, bytes: usize) -> Result<()> {
        let path = self.dir.join(RESERVE_NAME);
        let zeros = vec![0u8; 64 << 10];
        let written = File::create(&path).and_then(|mut f| {
            let mut left = bytes;
            while left > 0 {
                let n = left.min(zeros.len());
                f.write_all(&zeros[..n])?;
                left -= n;
            }
            f.sync_all()
        });
        if let Err(e) = written {
            let _ = fs::remove_file(&path);
            return Err(e).with_context(|| format!("writing {}", path.display()));
        }
        self.reserve = Some((path, bytes as u64));
        Ok(())
    }

    /// Removes the reserve (if held): its blocks are free for the segments that follow.
    pub fn release_reserve(&mut self) {
        if let Some((p, _)) = self.reserve.take() {
            let _ = fs::remove_file(p);
        }
    }

    /// The same writer, removing its oldest segments as `retention` says.
    pub fn with_retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }

    /// What retention has removed so far.
    pub fn dropped(&self) -> Dropped {
        self.dropped
    }

    /// Removes the oldest finished segments that retention no longer keeps, given the
    /// bytes of the segment about to be closed. The newest finished segment stays.
    fn retain(&mut self, closing_bytes: u64) {
        // The reserve is part of what the output holds.
        let reserve = self.reserve.as_ref().map_or(0, |r| r.1);
        let mut total: u64 = self.kept.iter().map(|k| k.bytes).sum::<u64>() + closing_bytes + reserve;
        while self.finished.len() > 1 {
            let oldest = &self.kept[0];
            let too_big = self.retention.max_bytes.is_some_and(|max| total > max);
            let too_old = self.retention.max_age.is_some_and(|age| oldest.closed.elapsed() > age);
            if !(too_big || too_old) {
                break;
            }
            match fs::remove_file(&self.finished[0]) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                // Left in place (and counted as kept); the next close tries again.
                Err(_) => break,
            }
            let k = self.kept.remove(0);
            self.finished.remove(0);
            total -= k.bytes;
            self.dropped.segments += 1;
            self.dropped.rows += k.rows;
            self.dropped.bytes += k.bytes;
            self.dropped.until_ns = k.end_ns.or(self.dropped.until_ns);
        }
    }

    /// The `trainio.retention` value (and, once segments were removed, the
    /// `trainio.start_ns` that the kept trace starts at) for the segment being closed.
    fn retention_metadata(&mut self, metadata: &[(String, String)]) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = metadata.to_vec();
        let start = out.iter().find(|(k, _)| k == crate::keys::START_NS).map(|(_, v)| v.clone());
        if self.recording_start_ns.is_none() {
            self.recording_start_ns = start;
        }
        let recording_start: Option<i64> = self.recording_start_ns.as_deref().and_then(|v| v.parse().ok());
        let d = self.dropped;
        let value = serde_json::json!({
            "max_bytes": self.retention.max_bytes,
            "max_age_s": self.retention.max_age.map(|a| a.as_secs_f64()),
            "recording_start_ns": recording_start,
            "dropped_segments": d.segments,
            "dropped_rows": d.rows,
            "dropped_bytes": d.bytes,
            "dropped_until_ns": d.until_ns,
        })
        .to_string();
        out.retain(|(k, _)| k != crate::keys::RETENTION);
        out.push((crate::keys::RETENTION.into(), value));
        if let Some(until) = d.until_ns {
            // The kept trace covers what follows the newest removed segment.
            for (k, v) in out.iter_mut() {
                if k == crate::keys::START_NS && recording_start.is_some_and(|s| s < until) {
                    *v = until.to_string();
                }
            }
        }
        out
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
        seg.rows += batch.num_rows() as u64;
        seg.writer.write(batch).with_context(|| format!("writing {}", seg.partial.display()))
    }

    /// Gives up the open segment after a failed write (a full disk): its file is removed,
    /// its index is reused by the next segment, and the rows it held count as lost.
    /// Finished segments stay as they are. A failed close_segment does the same.
    pub fn abandon_segment(&mut self) {
        if let Some(seg) = self.current.take() {
            self.lost_rows += seg.rows;
            drop(seg.writer);
            let _ = fs::remove_file(&seg.partial);
        }
    }

    /// Rows given up with their segments (abandon_segment, a failed close_segment).
    pub fn lost_rows(&self) -> u64 {
        self.lost_rows
    }

    /// Starts a segment unless one is open, so that even a trace without rows has one
    /// segment to carry its metadata.
    pub fn open(&mut self) -> Result<()> {
        if self.current.is_none() {
            let name = format!("seg-{:06}.parquet", self.next_index);
            let done = self.dir.join(&name);
            let partial = self.dir.join(format!("{name}.partial"));
            let file = File::create(&partial).with_context(|| format!("creating {}", partial.display()))?;
            let writer =
                SegmentFile::new(file, arrow_schema(), writer_properties()).context("starting a Parquet segment")?;
            self.current = Some(OpenSegment { writer, partial, done, opened: Instant::now(), rows: 0 });
        }
        Ok(())
    }

    /// True when the open segment has reached its size or age limit.
    pub fn segment_full(&self) -> bool {
        self.current
            .as_ref()
            .is_some_and(|s| s.writer.size() >= self.limits.max_bytes || s.opened.elapsed() >= self.limits.max_age)
    }

    /// Closes the open segment (if any) with these key-value metadata and renames it into
    /// place. Returns the finished segment's path.
    pub fn close_segment(&mut self, metadata: &[(String, String)]) -> Result<Option<PathBuf>> {
        let Some(mut seg) = self.current.take() else {
            return Ok(None);
        };
        let with_retention;
        let metadata = if self.retention.is_on() {
            // The segment's own bytes, its last row group written: an estimate of a row
            // group still in memory counts it uncompressed and removes too much.
            let closing = match seg.writer.flushed_size() {
                Ok(n) => n,
                Err(e) => {
                    let _ = fs::remove_file(&seg.partial);
                    self.lost_rows += seg.rows;
                    return Err(e.context(format!("closing {}", seg.partial.display())));
                }
            };
            self.retain(closing);
            with_retention = self.retention_metadata(metadata);
            &with_retention[..]
        } else {
            metadata
        };
        let end_ns = metadata.iter().find(|(k, _)| k == crate::keys::END_NS).and_then(|(_, v)| v.parse().ok());
        for (k, v) in metadata {
            seg.writer.append_key_value_metadata(KeyValue::new(k.clone(), v.clone()));
        }
        let (partial, rows) = (seg.partial.clone(), seg.rows);
        let closed = seg.writer.close().with_context(|| format!("closing {}", partial.display())).and_then(|_| {
            fs::rename(&partial, &seg.done).with_context(|| format!("renaming {} into place", partial.display()))
        });
        if let Err(e) = closed {
            // A segment that cannot be closed (a full disk) is given up as abandon_segment does.
            let _ = fs::remove_file(&partial);
            self.lost_rows += rows;
            return Err(e);
        }
        self.next_index += 1;
        let bytes = fs::metadata(&seg.done).map(|m| m.len()).unwrap_or(0);
        self.kept.push(Kept { bytes, rows, closed: Instant::now(), end_ns });
        self.finished.push(seg.done.clone());
        Ok(Some(seg.done))
    }
}
