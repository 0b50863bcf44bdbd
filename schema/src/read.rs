//! Reading: a trace directory (or one segment file) → rows and metadata.
//!
//! What a reader accepts and refuses is SCHEMA.md's *Readers* section; the Python reader
//! (analysis/trainio_analysis/trace/) keeps to the same, and tests/analysis run one table
//! of cases through both.
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::fs::File;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_cast::cast;
use arrow_schema::{DataType, Schema};
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::file::reader::{FileReader, SerializedFileReader};

use crate::{arrow_schema, keys, Layer, ObjectFields, Rpc, OPTIONAL_COLUMNS, SCHEMA_MINOR, SCHEMA_VERSION};

/// A trace that cannot be read: the message names the file and what is wrong.
#[derive(Debug)]
pub struct TraceError(pub String);

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TraceError {}

fn bad(path: &Path, what: impl fmt::Display) -> TraceError {
    // one line: a decoder's message may hold several
    let what = what.to_string();
    let what = what.lines().next().unwrap_or("").trim_end();
    TraceError(one_line(&format!("{}: {what}", path.display())))
}

/// A message as one printable line: a name read from a corrupt file may hold line breaks
/// or control characters, which are escaped.
pub fn one_line(text: &str) -> String {
    text.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

/// Whether a file of a trace directory is one of its segments (SCHEMA.md: `seg-*.parquet`;
/// other files, `*.partial` segments among them, are not part of the trace).
pub fn is_segment_name(name: &str) -> bool {
    name.starts_with("seg-") && name.ends_with(".parquet")
}

/// The finished segments of a trace in order (a single `.parquet` file is a trace of one).
pub fn segment_paths(path: &Path) -> Result<Vec<PathBuf>, TraceError> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    if !path.is_dir() {
        return Err(bad(path, "no such trace (neither a directory nor a file)"));
    }
    let entries = std::fs::read_dir(path).map_err(|e| bad(path, format!("cannot read: {e}")))?;
    let mut segs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(is_segment_name))
        .collect();
    segs.sort();
    if segs.is_empty() {
        if let Ok(Some(members)) = crate::trace_set_members(path) {
            return Err(bad(
                path,
                format!(
                    "a trace set of {} hosts, read here one host at a time: give one of its traces ({})",
                    members.len(),
                    members[0].path.display()
                ),
            ));
        }
        return Err(bad(path, "empty trace (no seg-*.parquet segments)"));
    }
    Ok(segs)
}

/// Installs (once) a panic hook that prints nothing for panics inside [`guard_decoder`],
/// which turns them into the file's one-line error, and hands every other panic to the
/// hook that was there. For programs that promise one line on bad
/// input (the analyzer's extension, `trainio-trace-rows`).
pub fn quiet_decoder_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !IN_DECODER.with(|d| d.get()) {
                previous(info);
            }
        }));
    });
}

thread_local! {
    /// Whether this thread is inside [`guard_decoder`], which turns a panic into an error.
    static IN_DECODER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs a Parquet decoding step that may panic on a corrupt file (the decoder trusts
/// some lengths and offsets it reads), turning a panic into the file's error.
pub fn guard_decoder<T>(seg: &Path, step: impl FnOnce() -> Result<T, TraceError>) -> Result<T, TraceError> {
    let outer = IN_DECODER.with(|d| d.replace(true));
    let result = catch_unwind(AssertUnwindSafe(step));
    IN_DECODER.with(|d| d.set(outer));
    match result {
        Ok(r) => r,
        Err(panic) => {
            let why = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("decoder panicked");
            Err(bad(seg, format!("corrupt (the Parquet decoder failed: {why})")))
        }
    }
}

/// The schema minor of a segment's metadata (absent: 0, a 1.0 trace).
fn segment_minor(seg: &Path, meta: &HashMap<String, String>) -> Result<u32, TraceError> {
    match meta.get(keys::SCHEMA_MINOR) {
        None => Ok(0),
        Some(v) => v.trim().parse::<u32>().map_err(|_| {
            bad(
                seg,
                format!("{} {:?} is not a version number", keys::SCHEMA_MINOR, v.chars().take(20).collect::<String>()),
            )
        }),
    }
}

pub(crate) fn file_metadata(seg: &Path) -> Result<HashMap<String, String>, TraceError> {
    let file = File::open(seg).map_err(|e| bad(seg, format!("cannot open: {e}")))?;
    metadata_of(seg, file)
}

/// [`file_metadata`] of a segment, and the segment opened (for [`read_segment_batches`]).
pub(crate) fn open_with_metadata(seg: &Path) -> Result<(File, HashMap<String, String>), TraceError> {
    let file = File::open(seg).map_err(|e| bad(seg, format!("cannot open: {e}")))?;
    let meta = metadata_of(seg, file.try_clone().map_err(|e| bad(seg, format!("cannot open: {e}")))?)?;
    Ok((file, meta))
}

/// The trainio metadata of the open segment file `file` (named `seg`), checked.
fn metadata_of(seg: &Path, file: File) -> Result<HashMap<String, String>, TraceError> {
    let reader = guard_decoder(seg, || {
        SerializedFileReader::new(file).map_err(|e| bad(seg, format!("not a readable Parquet file ({e})")))
    })?;
    let kv = reader.metadata().file_metadata().key_value_metadata().cloned().unwrap_or_default();
    let meta: HashMap<String, String> = kv.into_iter().filter_map(|kv| kv.value.map(|v| (kv.key, v))).collect();
    match meta.get(keys::SCHEMA_VERSION) {
        Some(v) if v.trim().parse::<u64>().ok().map(|v| v.to_string()).as_deref() == Some(SCHEMA_VERSION) => {
            segment_minor(seg, &meta)?;
            Ok(meta)
        }
        Some(v) => Err(bad(
            seg,
            format!(
                "unknown trainio.schema_version {:?} (this reader knows {SCHEMA_VERSION})",
                v.chars().take(20).collect::<String>()
            ),
        )),
        None => Err(bad(seg, format!("not a trainio trace (no {} metadata)", keys::SCHEMA_VERSION))),
    }
}

/// Metadata of the trace: that of its last segment, whose counters are final.
pub fn read_metadata(path: &Path) -> Result<HashMap<String, String>, TraceError> {
    let segs = segment_paths(path)?;
    file_metadata(segs.last().expect("at least one segment"))
}

/// A row read back from a trace.
#[derive(Clone, Debug, PartialEq)]
pub struct OwnedRow {
    pub layer: Layer,
    pub op: Arc<str>,
    pub issue_ns: i64,
    pub complete_ns: i64,
    pub insert_ns: Option<i64>,
    pub dev: Option<Arc<str>>,
    pub offset: Option<i64>,
    pub bytes: i64,
    pub bytes_requested: i64,
    pub queue_depth: u32,
    pub pid: u32,
    pub tid: u32,
    pub comm: Arc<str>,
    pub fd: Option<i32>,
    pub file: Option<Arc<str>>,
    pub error: i32,
    pub flags: u32,
    /// The RPC that carried an nfs request (schema 1.1); None for other layers, for rows
    /// not joined, and for every row of a 1.0 trace.
    pub rpc: Option<Rpc>,
    /// The parent's tgid on proc rows (schema 1.3); None elsewhere and in older traces.
    pub ppid: Option<u32>,
    /// Endpoint, status and first byte of an object-layer row (schema 1.8); None elsewhere.
    pub object: Option<ObjectFields>,
}

/// Columns cast to one canonical type whatever the writer used (dictionary or plain
/// strings, any integer width), so traces written by Python read the same.
struct Columns {
    strings: HashMap<&'static str, StringArray>,
    ints: HashMap<&'static str, Int64Array>,
}

const STRING_COLS: [&str; 6] = ["layer", "op", "dev", "comm", "file", "endpoint"];
const INT_COLS: [&str; 12] = [
    "issue_ns",
    "complete_ns",
    "insert_ns",
    "offset",
    "bytes",
    "bytes_requested",
    "queue_depth",
    "pid",
    "tid",
    "fd",
    "error",
    "flags",
];

fn is_utf8(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

/// SCHEMA.md: any dictionary key width or plain UTF-8 for the string columns, any integer
/// width for the integer columns; every column but the minor versions' present.
fn check_schema(seg: &Path, schema: &Schema) -> Result<(), TraceError> {
    let want = arrow_schema();
    let missing: Vec<&str> = want
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .filter(|n| schema.field_with_name(n).is_err() && !OPTIONAL_COLUMNS.contains(n))
        .collect();
    if !missing.is_empty() {
        return Err(bad(seg, format!("missing column(s) {}", missing.join(", "))));
    }
    for want in want.fields() {
        let Ok(got) = schema.field_with_name(want.name()) else { continue };
        let (ok, kind) = if STRING_COLS.contains(&want.name().as_str()) {
            let ok = is_utf8(got.data_type()) || matches!(got.data_type(), DataType::Dictionary(_, v) if is_utf8(v));
            (ok, "UTF-8 strings")
        } else {
            (got.data_type().is_integer(), "an integer type")
        };
        if !ok {
            return Err(bad(
                seg,
                format!(
                    "column {} has type {}, expected {kind} (written as {})",
                    want.name(),
                    got.data_type(),
                    want.data_type()
                ),
            ));
        }
    }
    Ok(())
}

/// The (min, max) a value of an integer column may take: that of its SCHEMA.md type.
fn int_range(t: &DataType) -> (i64, i64) {
    match t {
        DataType::UInt32 => (0, u32::MAX as i64),
        DataType::Int32 => (i32::MIN as i64, i32::MAX as i64),
        _ => (i64::MIN, i64::MAX),
    }
}

fn columns(batch: &RecordBatch, origin: &BatchOrigin) -> Result<Columns, TraceError> {
    let seg = origin.name;
    let schema = arrow_schema();
    let mut strings = HashMap::new();
    let mut ints = HashMap::new();
    for field in schema.fields() {
        let name: &'static str = STRING_COLS
            .iter()
            .chain(INT_COLS.iter())
            .chain(OPTIONAL_COLUMNS.iter())
            .find(|n| **n == field.name())
            .copied()
            .expect("every column is a string, integer or optional column");
        let Some(col) = batch.column_by_name(name) else {
            // added by a minor version: a trace written before it reads as all null
            if STRING_COLS.contains(&name) {
                strings.insert(name, StringArray::from(vec![None::<&str>; batch.num_rows()]));
            } else {
                ints.insert(name, Int64Array::from(vec![None::<i64>; batch.num_rows()]));
            }
            continue;
        };
        if !field.is_nullable() && col.null_count() > 0 {
            let row = (0..col.len()).find(|&i| col.is_null(i)).unwrap_or(0);
            return Err(TraceError(format!("{}: null in column {name}, which is never null", origin.at(row))));
        }
        if STRING_COLS.contains(&name) {
            let c = cast(col, &DataType::Utf8).map_err(|e| bad(seg, format!("column {name}: {e}")))?;
            strings.insert(name, c.as_any().downcast_ref::<StringArray>().expect("utf8").clone());
            continue;
        }
        // a safe cast: a value that does not fit Int64 (a large uint64) becomes null
        let c: ArrayRef = cast(col, &DataType::Int64).map_err(|e| bad(seg, format!("column {name}: {e}")))?;
        let c = c.as_any().downcast_ref::<Int64Array>().expect("int64").clone();
        let (lo, hi) = int_range(field.data_type());
        let misfit = (0..c.len())
            .find(|&i| (c.is_null(i) && !col.is_null(i)) || (!c.is_null(i) && !(lo..=hi).contains(&c.value(i))));
        if let Some(row) = misfit {
            let value = if c.is_null(row) { "above 2^63".to_string() } else { c.value(row).to_string() };
            return Err(TraceError(format!(
                "{}: column {name} value {value} does not fit its type {}",
                origin.at(row),
                field.data_type()
            )));
        }
        ints.insert(name, c);
    }
    Ok(Columns { strings, ints })
}

/// Where the rows of a batch come from, for messages: a segment's row groups, or a stream
/// of batches that another reader checked already (the analyzer hands the job model the
/// rows it read through the Arrow C stream interface).
pub struct BatchOrigin<'a> {
    name: &'a Path,
    /// the first row of each row group in the segment (empty for a stream)
    starts: &'a [usize],
    /// the batch's first row in the segment (in the stream)
    first_row: usize,
    minor: u32,
    /// rows of layers or ops this reader does not know are skipped, not refused: the
    /// segment is of a later minor (SCHEMA.md), or the stream's producer checked its rows
    skip_unknown: bool,
}

impl<'a> BatchOrigin<'a> {
    /// A batch of a stream named `name` whose producer checked its rows as SCHEMA.md's
    /// *Readers* section says (the analyzer's reader) and left out the rows of layers and
    /// ops of a later minor; `first_row`: the batch's first row in the stream.
    pub fn checked(name: &'a Path, first_row: usize) -> Self {
        let minor = SCHEMA_MINOR.parse().expect("SCHEMA_MINOR is a number");
        BatchOrigin { name, starts: &[], first_row, minor, skip_unknown: true }
    }

    /// The path it comes from (a segment, or the stream's name).
    pub fn name(&self) -> &Path {
        self.name
    }

    /// Where row `i` of the batch is: its segment's row group and row, or its row in the stream.
    fn at(&self, i: usize) -> String {
        let row = self.first_row + i;
        if self.starts.is_empty() {
            return format!("{}: row {row}", self.name.display());
        }
        let g = self.starts.partition_point(|&s| s <= row).saturating_sub(1);
        format!("{}: row group {g}, row {}", self.name.display(), row - self.starts.get(g).copied().unwrap_or(0))
    }
}

/// A row of a layer the caller of [`RowDecoder::decode`] does not want whole: what the job
/// model sums of the block layer.
pub struct BriefRow<'a> {
    pub layer: Layer,
    pub op: &'a str,
    pub pid: u32,
    pub issue_ns: i64,
    /// When a block request entered the device's queue, where the trace has it.
    pub insert_ns: Option<i64>,
    pub bytes: i64,
    pub dev: Option<&'a str>,
}

/// Batches of a trace's rows into rows, checked as SCHEMA.md's *Readers* section says,
/// with every string shared among the rows that hold it.
#[derive(Default)]
pub struct RowDecoder {
    interned: HashSet<Arc<str>>,
}

impl RowDecoder {
    fn intern(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.interned.get(s) {
            return a.clone();
        }
        let a: Arc<str> = Arc::from(s);
        self.interned.insert(a.clone());
        a
    }

    /// The rows of `batch` (any of the widths SCHEMA.md allows), checked: each row of a
    /// layer `whole` takes is handed to `row`, each other one to `brief`.
    ///
    /// Refused with the row (SCHEMA.md, *Readers*): a null in a column that is never null,
    /// an integer outside its column's type, `complete_ns < issue_ns`, and a layer or op
    /// not in SCHEMA.md's tables (skipped instead in a segment of a later minor).
    pub fn decode(
        &mut self,
        batch: &RecordBatch,
        origin: &BatchOrigin,
        whole: impl Fn(Layer) -> bool,
        mut row: impl FnMut(OwnedRow),
        mut brief: impl FnMut(BriefRow<'_>),
    ) -> Result<(), TraceError> {
        let c = guard_decoder(origin.name, || columns(batch, origin))?;
        let s = |n: &str, i: usize| {
            let a = &c.strings[n];
            (!a.is_null(i)).then(|| a.value(i))
        };
        let n = |name: &str, i: usize| {
            let a = &c.ints[name];
            (!a.is_null(i)).then(|| a.value(i))
        };
        for i in 0..batch.num_rows() {
            let (issue_ns, complete_ns) = (n("issue_ns", i).unwrap_or(0), n("complete_ns", i).unwrap_or(0));
            if complete_ns < issue_ns {
                return Err(TraceError(format!("{}: complete_ns {complete_ns} < issue_ns {issue_ns}", origin.at(i))));
            }
            let layer_name = s("layer", i).unwrap_or("");
            let op = s("op", i).unwrap_or("");
            let row_layer = Layer::parse(layer_name);
            let Some(row_layer) = row_layer.filter(|l| l.ops().contains(&op)) else {
                if origin.skip_unknown {
                    continue; // a later minor may add layers and ops: skip its rows
                }
                let what = match row_layer {
                    None => format!("layer {layer_name:?}"),
                    Some(_) => format!("op {op:?} of layer {layer_name:?}"),
                };
                return Err(TraceError(format!(
                    "{}: unknown {what} in a schema 1.{} segment (SCHEMA.md lists the layers and ops)",
                    origin.at(i),
                    origin.minor
                )));
            };
            if !whole(row_layer) {
                brief(BriefRow {
                    layer: row_layer,
                    op,
                    pid: n("pid", i).unwrap_or(0) as u32,
                    issue_ns,
                    insert_ns: n("insert_ns", i),
                    bytes: n("bytes", i).unwrap_or(0),
                    dev: s("dev", i),
                });
                continue;
            }
            row(OwnedRow {
                layer: row_layer,
                op: self.intern(op),
                issue_ns,
                complete_ns,
                insert_ns: n("insert_ns", i),
                dev: s("dev", i).map(|d| self.intern(d)),
                offset: n("offset", i),
                bytes: n("bytes", i).unwrap_or(0),
                bytes_requested: n("bytes_requested", i).unwrap_or(0),
                queue_depth: n("queue_depth", i).unwrap_or(0) as u32,
                pid: n("pid", i).unwrap_or(0) as u32,
                tid: n("tid", i).unwrap_or(0) as u32,
                comm: self.intern(s("comm", i).unwrap_or("")),
                fd: n("fd", i).map(|v| v as i32),
                file: s("file", i).map(|f| self.intern(f)),
                error: n("error", i).unwrap_or(0) as i32,
                flags: n("flags", i).unwrap_or(0) as u32,
                rpc: n("rpc_xid", i).map(|xid| Rpc {
                    xid: xid as u32,
                    backlog_ns: n("rpc_backlog_ns", i).unwrap_or(0),
                    rtt_ns: n("rpc_rtt_ns", i).unwrap_or(0),
                    execute_ns: n("rpc_execute_ns", i).unwrap_or(0),
                    retrans: n("rpc_retrans", i).map(|r| r as u32),
                }),
                ppid: n("ppid", i).map(|p| p as u32),
                object: (row_layer == Layer::Object).then(|| ObjectFields {
                    endpoint: self.intern(s("endpoint", i).unwrap_or("")),
                    http_status: n("http_status", i).map(|v| v as u32),
                    first_byte_ns: n("first_byte_ns", i),
                }),
            });
        }
        Ok(())
    }
}

/// Reads a trace's segments one batch at a time: each segment's footer and schema checked,
/// then `f` given each batch and where it comes from (a [`RowDecoder`] makes rows of it).
pub fn read_batches(
    path: &Path,
    f: impl FnMut(&RecordBatch, &BatchOrigin) -> Result<(), TraceError>,
) -> Result<(), TraceError> {
    read_segment_batches(segment_paths(path)?, None, f)
}

/// [`read_batches`] of the segments `segs` (in order); `held`: the last one, opened
/// already by the caller (a trace set's member, whose metadata was read through it), read
/// through that descriptor rather than opened again.
pub(crate) fn read_segment_batches(
    segs: Vec<PathBuf>,
    mut held: Option<File>,
    mut f: impl FnMut(&RecordBatch, &BatchOrigin) -> Result<(), TraceError>,
) -> Result<(), TraceError> {
    let known_minor: u32 = SCHEMA_MINOR.parse().expect("SCHEMA_MINOR is a number");
    let last = segs.last().cloned();
    for seg in segs {
        let opened = match held.take_if(|_| last.as_ref() == Some(&seg)) {
            Some(file) => Ok(file),
            None => File::open(&seg),
        };
        let file = match opened {
            Ok(f) => f,
            // Removed by a recording's retention since it was listed (SCHEMA.md, *Retention*).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && last.as_ref() != Some(&seg) => continue,
            Err(e) => return Err(bad(&seg, format!("cannot open: {e}"))),
        };
        let meta = metadata_of(&seg, file.try_clone().map_err(|e| bad(&seg, format!("cannot open: {e}")))?)?;
        let minor = segment_minor(&seg, &meta)?;
        let (reader, starts): (ParquetRecordBatchReader, Vec<usize>) = guard_decoder(&seg, || {
            let builder = ParquetRecordBatchReaderBuilder::try_new(file)
                .map_err(|e| bad(&seg, format!("not a readable Parquet file ({e})")))?;
            check_schema(&seg, builder.schema())?;
            let mut starts = Vec::new();
            let mut at = 0usize;
            for g in builder.metadata().row_groups() {
                starts.push(at);
                at += usize::try_from(g.num_rows()).unwrap_or(0);
            }
            let reader = builder
                .with_batch_size(65536)
                .build()
                .map_err(|e| bad(&seg, format!("not a readable Parquet file ({e})")))?;
            Ok((reader, starts))
        })?;
        let mut reader = reader;
        let mut first_row = 0usize;
        while let Some(batch) = guard_decoder(&seg, || Ok(reader.next()))? {
            let batch = batch.map_err(|e| bad(&seg, format!("corrupt ({e})")))?;
            let origin =
                BatchOrigin { name: &seg, starts: &starts, first_row, minor, skip_unknown: minor > known_minor };
            f(&batch, &origin)?;
            first_row += batch.num_rows();
        }
    }
    Ok(())
}

/// Reads every row of a trace, or only those of `layer`, checked as [`RowDecoder::decode`]
/// says.
pub fn read_rows(path: &Path, layer: Option<Layer>) -> Result<Vec<OwnedRow>, TraceError> {
    let mut rows = Vec::new();
    let mut decoder = RowDecoder::default();
    read_batches(path, |batch, origin| {
        decoder.decode(batch, origin, |l| layer.is_none_or(|w| w == l), |r| rows.push(r), |_| {})
    })?;
    Ok(rows)
}

#[cfg(test)]
#[path = "read_tests.rs"]
mod tests;
