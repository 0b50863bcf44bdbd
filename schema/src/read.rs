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
    mut f: impl FnMut(&RecordBatch, &BatchOrigin) -> Result<(), TraceError>,
) -> Result<(), TraceError> {
    let known_minor: u32 = SCHEMA_MINOR.parse().expect("SCHEMA_MINOR is a number");
    let segs = segment_paths(path)?;
    let last = segs.last().cloned();
    for seg in segs {
        let file = match File::open(&seg) {
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
mod tests {
    use super::*;
    use crate::{BatchBuilder, Row, SegmentLimits, TraceWriter, SCHEMA_MINOR};
    use std::time::Duration;

    fn row(layer: Layer, op: &'static str) -> Row<'static> {
        Row { layer, op, ..Row::sample() }
    }

    /// `b`'s rows written as one segment of a fresh trace named for `name` (with the
    /// schema's version keys), and read back: (the trace's directory, its rows).
    fn round_trip(name: &str, mut b: BatchBuilder) -> (std::path::PathBuf, Vec<OwnedRow>) {
        let dir = std::env::temp_dir().join(format!("trainio-schema-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut w = TraceWriter::new(&dir, SegmentLimits { max_bytes: 1 << 30, max_age: Duration::from_secs(60) });
        w.write(&b.finish()).unwrap();
        let meta = vec![
            (keys::SCHEMA_VERSION.to_string(), SCHEMA_VERSION.to_string()),
            (keys::SCHEMA_MINOR.to_string(), SCHEMA_MINOR.to_string()),
        ];
        w.close_segment(&meta).unwrap();
        let rows = read_rows(&dir, None).unwrap();
        (dir, rows)
    }

    #[test]
    fn rpc_fields_round_trip_and_are_null_elsewhere() {
        let rpc = Rpc { xid: 0xdead_beef, backlog_ns: 1000, rtt_ns: 250_000, execute_ns: 300_000, retrans: Some(2) };
        let mut b = BatchBuilder::new();
        b.push_rpc(&row(Layer::Nfs, "read"), Some(&rpc));
        b.push_rpc(&row(Layer::Nfs, "read"), Some(&Rpc { retrans: None, ..rpc }));
        b.push_rpc(&row(Layer::Nfs, "write"), None);
        b.push(&row(Layer::Block, "read"));
        let (dir, rows) = round_trip("rt", b);
        assert_eq!(rows[0].rpc, Some(rpc));
        assert_eq!(rows[1].rpc.unwrap().retrans, None);
        assert_eq!(rows[1].rpc.unwrap().rtt_ns, 250_000);
        assert_eq!((rows[2].rpc, rows[3].rpc), (None, None));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn batches_of_a_stream_decode_as_the_files_do_and_name_the_row_they_refuse() {
        let mut b = BatchBuilder::new();
        b.push(&row(Layer::File, "read"));
        b.push(&Row { pid: 7, ..row(Layer::Block, "read") });
        b.push(&Row { pid: 8, ..row(Layer::Block, "write") });
        let (dir, rows) = round_trip("stream", b);
        let mut read = Vec::new();
        read_batches(&dir, |batch, _| {
            let name = Path::new("stream");
            let (mut whole, mut brief) = (Vec::new(), Vec::new());
            RowDecoder::default().decode(
                batch,
                &BatchOrigin::checked(name, 0),
                |l| l == Layer::File,
                |r| whole.push(r),
                |r| brief.push((r.layer, r.op.to_string(), r.pid, r.bytes, r.dev.map(str::to_string))),
            )?;
            assert_eq!(whole, rows[..1], "the file row whole, as read_rows reads it");
            let dev = Some("0:30".to_string());
            assert_eq!(
                brief,
                [(Layer::Block, "read".into(), 7, 4096, dev.clone()), (Layer::Block, "write".into(), 8, 4096, dev)]
            );
            // a row the stream's producer should have refused: named by its row in the stream
            let issue = batch.schema().index_of("issue_ns").unwrap();
            let mut cols = batch.columns().to_vec();
            cols[issue] = Arc::new(Int64Array::from(vec![10, 10, 99]));
            let bad_batch = RecordBatch::try_new(batch.schema(), cols).unwrap();
            let err = RowDecoder::default()
                .decode(&bad_batch, &BatchOrigin::checked(name, 5), |_| true, |_| {}, |_| {})
                .unwrap_err();
            assert_eq!(err.0, "stream: row 7: complete_ns 20 < issue_ns 99");
            read.push(batch.num_rows());
            Ok(())
        })
        .unwrap();
        assert_eq!(read, [3]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Segments of `rows` distinct block rows each, closed with start/end metadata; the
    /// directory after each close.
    fn retained_trace(dir: &Path, retention: crate::Retention, sizes: &[usize]) -> Vec<(Vec<PathBuf>, u64)> {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).unwrap();
        let mut w = TraceWriter::new(dir, SegmentLimits { max_bytes: 1 << 30, max_age: Duration::from_secs(60) })
            .with_retention(retention);
        let mut after = Vec::new();
        let mut t = 1_000_i64;
        for (i, &rows) in sizes.iter().enumerate() {
            let mut b = BatchBuilder::new();
            for k in 0..rows {
                // Offsets that do not repeat: the segment's size grows with its rows.
                let offset = Some(((k as i64).wrapping_mul(2_654_435_761) % (1 << 30)) * 4096);
                b.push(&Row { issue_ns: t, complete_ns: t + 7, offset, ..row(Layer::Block, "read") });
                t += 1000;
            }
            w.write(&b.finish()).unwrap();
            let meta = vec![
                (keys::SCHEMA_VERSION.to_string(), SCHEMA_VERSION.to_string()),
                (keys::SCHEMA_MINOR.to_string(), SCHEMA_MINOR.to_string()),
                (keys::START_NS.to_string(), "500".to_string()),
                // Just after the segment's last completion, before the next one's first issue.
                (keys::END_NS.to_string(), (t - 1).to_string()),
                (keys::SEGMENT.to_string(), i.to_string()),
            ];
            w.close_segment(&meta).unwrap();
            let segs = segment_paths(dir).unwrap();
            let bytes = segs.iter().map(|p| std::fs::metadata(p).unwrap().len()).sum();
            after.push((segs, bytes));
        }
        after
    }

    #[test]
    fn retention_removes_the_oldest_segments_and_says_so() {
        let dir = std::env::temp_dir().join(format!("trainio-schema-retain-{}", std::process::id()));
        // One segment's size, to set the limit at three of them.
        let one = retained_trace(&dir, crate::Retention::default(), &[20_000])[0].1;
        let limit = 3 * one + one / 2;
        let after = retained_trace(&dir, crate::Retention { max_bytes: Some(limit), max_age: None }, &[20_000; 8]);
        for (i, (segs, bytes)) in after.iter().enumerate() {
            assert!(*bytes <= limit, "after segment {i}: {bytes} B kept, limit {limit}");
            // Never fewer than the limit allows: only whole segments beyond it go.
            assert_eq!(segs.len(), (i + 1).min(3), "after segment {i}: {segs:?}");
            assert!(segs.last().unwrap().ends_with(format!("seg-{i:06}.parquet")));
        }
        let meta = read_metadata(&dir).unwrap();
        let r: serde_json::Value = serde_json::from_str(&meta[keys::RETENTION]).unwrap();
        // Eight segments, three kept: the five oldest went.
        assert_eq!(r["dropped_segments"], 5, "{r}");
        assert_eq!(r["dropped_rows"], 5 * 20_000);
        assert_eq!(r["max_bytes"], limit);
        assert_eq!(r["recording_start_ns"], 500);
        // The kept trace starts where the newest removed segment (the 5th) ended.
        let until = r["dropped_until_ns"].as_i64().unwrap();
        assert_eq!(until, 1_000 + 5 * 20_000 * 1000 - 1);
        assert_eq!(meta[keys::START_NS], until.to_string());
        let rows = read_rows(&dir, None).unwrap();
        assert_eq!(rows.len(), 3 * 20_000);
        assert!(rows.iter().all(|r| r.issue_ns > until));

        // An age of zero keeps the newest finished segment and the one being closed.
        let after = retained_trace(&dir, crate::Retention { max_bytes: None, max_age: Some(Duration::ZERO) }, &[10; 4]);
        for (i, (segs, _)) in after.iter().enumerate() {
            assert_eq!(segs.len(), (i + 1).min(2), "after segment {i}");
        }
        let r: serde_json::Value = serde_json::from_str(&read_metadata(&dir).unwrap()[keys::RETENTION]).unwrap();
        assert_eq!((r["dropped_segments"].as_u64(), r["max_bytes"].is_null()), (Some(2), true));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn proc_and_ipc_rows_and_ppid_round_trip() {
        let mut b = BatchBuilder::new();
        b.push(&Row {
            ppid: Some(41),
            pid: 42,
            tid: 42,
            comm: "python",
            file: Some("python train.py"),
            ..row(Layer::Proc, "start")
        });
        b.push(&Row { ppid: Some(42), pid: 43, tid: 43, error: 0, ..row(Layer::Proc, "fork") });
        b.push(&Row { ppid: Some(42), pid: 43, tid: 43, comm: "pt_data_worker", ..row(Layer::Proc, "comm") });
        b.push(&Row {
            pid: 43,
            tid: 43,
            fd: Some(5),
            file: Some("pipe:[1234]"),
            dev: Some("0:15"),
            ..row(Layer::Ipc, "write")
        });
        b.push(&row(Layer::File, "read"));
        let (dir, rows) = round_trip("proc", b);
        let got: Vec<_> = rows.iter().map(|r| (r.layer, &*r.op, r.ppid)).collect();
        assert_eq!(
            got,
            [
                (Layer::Proc, "start", Some(41)),
                (Layer::Proc, "fork", Some(42)),
                (Layer::Proc, "comm", Some(42)),
                (Layer::Ipc, "write", None),
                (Layer::File, "read", None),
            ]
        );
        assert_eq!(rows[0].file.as_deref(), Some("python train.py"));
        assert_eq!(&*rows[2].comm, "pt_data_worker");
        assert_eq!(rows[3].file.as_deref(), Some("pipe:[1234]"));
        let procs = read_rows(&dir, Some(Layer::Proc)).unwrap();
        assert_eq!(procs.len(), 3);
        assert_eq!(Layer::parse("ipc"), Some(Layer::Ipc));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn object_rows_round_trip_with_their_endpoint_status_and_first_byte() {
        let mut b = BatchBuilder::new();
        let get = Row { offset: Some(100), bytes: 50, bytes_requested: 50, fd: Some(7), ..row(Layer::Object, "get") };
        let get = Row { file: Some("bkt/a/b.npz"), dev: None, queue_depth: 3, ..get };
        b.push_object(
            &get,
            &ObjectFields { endpoint: "127.0.0.1:9000", http_status: Some(206), first_byte_ns: Some(15) },
        );
        b.push(&row(Layer::File, "read"));
        let missing = Row { file: Some("bkt/none"), offset: None, bytes: 0, dev: None, ..row(Layer::Object, "head") };
        b.push_object(&missing, &ObjectFields { endpoint: "[::1]:80", http_status: None, first_byte_ns: None });
        let (dir, rows) = round_trip("object", b);
        assert_eq!(rows.len(), 3);
        let o = rows[0].object.as_ref().expect("an object row has its fields");
        assert_eq!((&*o.endpoint, o.http_status, o.first_byte_ns), ("127.0.0.1:9000", Some(206), Some(15)));
        assert_eq!((rows[0].offset, rows[0].bytes, rows[0].queue_depth), (Some(100), 50, 3));
        assert_eq!(rows[0].file.as_deref(), Some("bkt/a/b.npz"));
        assert!(rows[1].object.is_none(), "a file row has no object fields");
        let o = rows[2].object.as_ref().unwrap();
        assert_eq!((&*o.endpoint, o.http_status, o.first_byte_ns), ("[::1]:80", None, None));
        assert_eq!(read_rows(&dir, Some(Layer::Object)).unwrap().len(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_1_3_trace_written_by_the_python_writer_reads_as_python_reads_it() {
        // tests/analysis/test_trace.py, PROC_IPC_ROWS: the same rows, read there too.
        let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/python-1.3.parquet");
        let rows = read_rows(&sample, None).unwrap();
        let got: Vec<_> = rows.iter().map(|r| (r.layer, &*r.op, r.pid, r.ppid, r.file.as_deref())).collect();
        assert_eq!(
            got,
            [
                (Layer::Proc, "start", 4100, Some(4000), Some("python train.py")),
                (Layer::Proc, "fork", 4101, Some(4100), None),
                (Layer::Proc, "comm", 4101, Some(4100), None),
                (Layer::Ipc, "write", 4101, None, Some("pipe:[777]")),
                (Layer::Ipc, "wait", 4100, None, Some("pipe:[777]")),
                (Layer::Proc, "exit", 4101, Some(4100), None),
                (Layer::File, "read", 4100, None, Some("/d/a")),
            ]
        );
        assert_eq!(&*rows[2].comm, "pt_data_worker");
        assert_eq!(
            (rows[4].bytes, rows[4].bytes_requested, rows[4].fd, rows[4].dev.as_deref()),
            (1, 1, Some(8), Some("0:15"))
        );
        assert_eq!(read_metadata(&sample).unwrap()[keys::SCHEMA_MINOR], "3");
    }

    #[test]
    fn a_1_0_trace_without_rpc_columns_reads_with_rpc_none() {
        let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces/unet3d-demo-1gpu");
        let seg = &segment_paths(&sample).unwrap()[0];
        let file = File::open(seg).unwrap();
        let schema = ParquetRecordBatchReaderBuilder::try_new(file).unwrap().schema().clone();
        assert!(schema.field_with_name("rpc_xid").is_err(), "the sample predates schema 1.1");
        let rows = read_rows(&sample, None).unwrap();
        assert!(!rows.is_empty());
        assert!(rows.iter().all(|r| r.rpc.is_none()));
        assert!(rows.iter().all(|r| r.ppid.is_none()), "a trace before 1.3 has no ppid");
        assert!(rows.iter().all(|r| r.object.is_none()), "a trace before 1.8 has no object rows");
    }

    /// A member written as a recorder leaves it: `end` is its `trainio.end` (None: no key).
    fn member(dir: &Path, host: &str, minor: &str, end: Option<&str>, reserve: bool) {
        std::fs::create_dir_all(dir).unwrap();
        let mut w = TraceWriter::new(dir, SegmentLimits { max_bytes: 1 << 30, max_age: Duration::from_secs(60) });
        if reserve {
            w.hold_reserve(1 << 20).unwrap();
            let held = std::fs::metadata(dir.join(crate::RESERVE_NAME)).unwrap();
            assert_eq!(held.len(), 1 << 20);
        }
        let mut b = BatchBuilder::new();
        b.push(&row(Layer::Block, "read"));
        w.write(&b.finish()).unwrap();
        let mut meta = vec![
            (keys::SCHEMA_VERSION.to_string(), SCHEMA_VERSION.to_string()),
            (keys::SCHEMA_MINOR.to_string(), minor.to_string()),
            (keys::HOSTNAME.to_string(), host.to_string()),
        ];
        if let Some(e) = end {
            meta.push((keys::END.to_string(), e.to_string()));
        }
        w.close_segment(&meta).unwrap();
        // The reserve is not a segment: the trace reads with it in place, and dropping the
        // writer (as a recorder that ends, or fails, does) removes it.
        assert_eq!(segment_paths(dir).unwrap().len(), 1);
        drop(w);
        assert!(!dir.join(crate::RESERVE_NAME).exists());
    }

    #[test]
    fn a_set_member_whose_recording_did_not_end_is_not_complete() {
        let set = std::env::temp_dir().join(format!("trainio-schema-end-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&set);
        let done = r#"{"complete": true, "reason": "command exited"}"#;
        let recording = r#"{"complete": false, "reason": "recording"}"#;
        member(&set.join("a"), "h1", SCHEMA_MINOR, Some(done), true);
        member(&set.join("b"), "h2", SCHEMA_MINOR, Some(recording), false);
        member(&set.join("c"), "h3", SCHEMA_MINOR, None, false);
        let members = crate::trace_set_members(&set).unwrap().unwrap();
        let complete: Vec<_> = members.iter().map(|m| (m.host.as_str(), m.complete)).collect();
        assert_eq!(complete, [("h1", Some(true)), ("h2", Some(false)), ("h3", Some(false))]);
        // Before 1.9 a trace cannot say.
        let old = set.join("old");
        member(&old, "h1", "8", Some(recording), false);
        assert_eq!(crate::recording_complete(&read_metadata(&old).unwrap()), None);
        std::fs::remove_dir_all(&set).unwrap();
    }
}
