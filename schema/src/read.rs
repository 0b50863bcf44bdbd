//! Reading: a trace directory (or one segment file) → rows and metadata.
use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_cast::cast;
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::reader::{FileReader, SerializedFileReader};

use crate::{keys, Layer, Rpc, OPTIONAL_COLUMNS, SCHEMA_VERSION};

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
    TraceError(format!("{}: {what}", path.display()))
}

/// The finished segments of a trace in order (a single `.parquet` file is a trace of one).
pub fn segment_paths(path: &Path) -> Result<Vec<PathBuf>, TraceError> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let entries = std::fs::read_dir(path).map_err(|e| bad(path, format!("cannot read: {e}")))?;
    let mut segs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
        .collect();
    segs.sort();
    if segs.is_empty() {
        return Err(bad(path, "no trace segments (*.parquet) in this directory"));
    }
    Ok(segs)
}

fn file_metadata(seg: &Path) -> Result<HashMap<String, String>, TraceError> {
    let file = File::open(seg).map_err(|e| bad(seg, format!("cannot open: {e}")))?;
    let reader = SerializedFileReader::new(file).map_err(|e| bad(seg, format!("not Parquet: {e}")))?;
    let kv = reader.metadata().file_metadata().key_value_metadata().cloned().unwrap_or_default();
    let meta: HashMap<String, String> =
        kv.into_iter().filter_map(|kv| kv.value.map(|v| (kv.key, v))).collect();
    match meta.get(keys::SCHEMA_VERSION).map(String::as_str) {
        Some(SCHEMA_VERSION) => Ok(meta),
        Some(v) => Err(bad(seg, format!("trace schema version {v} is not supported (this build reads {SCHEMA_VERSION})"))),
        None => Err(bad(seg, format!("not a trainio trace: no {} metadata", keys::SCHEMA_VERSION))),
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
}

/// Columns cast to one canonical type whatever the writer used (dictionary or plain
/// strings, any integer width), so traces written by Python read the same.
struct Columns {
    strings: HashMap<&'static str, StringArray>,
    ints: HashMap<&'static str, Int64Array>,
}

const STRING_COLS: [&str; 5] = ["layer", "op", "dev", "comm", "file"];
const INT_COLS: [&str; 12] = [
    "issue_ns", "complete_ns", "insert_ns", "offset", "bytes", "bytes_requested",
    "queue_depth", "pid", "tid", "fd", "error", "flags",
];

fn columns(seg: &Path, batch: &RecordBatch) -> Result<Columns, TraceError> {
    let get = |name: &str| -> Result<ArrayRef, TraceError> {
        batch.column_by_name(name).cloned().ok_or_else(|| bad(seg, format!("missing column `{name}`")))
    };
    let mut strings = HashMap::new();
    for name in STRING_COLS {
        let col = cast(&get(name)?, &DataType::Utf8).map_err(|e| bad(seg, format!("column `{name}`: {e}")))?;
        strings.insert(name, col.as_any().downcast_ref::<StringArray>().expect("utf8").clone());
    }
    let mut ints = HashMap::new();
    for name in INT_COLS {
        let col = cast(&get(name)?, &DataType::Int64).map_err(|e| bad(seg, format!("column `{name}`: {e}")))?;
        ints.insert(name, col.as_any().downcast_ref::<Int64Array>().expect("int64").clone());
    }
    // Added by minor versions: a trace written before them has all-null columns.
    for name in OPTIONAL_COLUMNS {
        let col = match batch.column_by_name(name) {
            Some(c) => cast(c, &DataType::Int64).map_err(|e| bad(seg, format!("column `{name}`: {e}")))?,
            None => arrow_array::new_null_array(&DataType::Int64, batch.num_rows()),
        };
        ints.insert(name, col.as_any().downcast_ref::<Int64Array>().expect("int64").clone());
    }
    Ok(Columns { strings, ints })
}

/// Reads every row of a trace, or only those of `layer`.
pub fn read_rows(path: &Path, layer: Option<Layer>) -> Result<Vec<OwnedRow>, TraceError> {
    let mut rows = Vec::new();
    let mut interned: HashMap<String, Arc<str>> = HashMap::new();
    let mut intern = |s: &str| -> Arc<str> {
        interned.entry(s.to_string()).or_insert_with(|| Arc::from(s)).clone()
    };
    for seg in segment_paths(path)? {
        file_metadata(&seg)?;
        let file = File::open(&seg).map_err(|e| bad(&seg, format!("cannot open: {e}")))?;
        let reader = ParquetRecordBatchReaderBuilder::try_new(file)
            .and_then(|b| b.with_batch_size(65536).build())
            .map_err(|e| bad(&seg, format!("not Parquet: {e}")))?;
        for batch in reader {
            let batch = batch.map_err(|e| bad(&seg, format!("corrupt: {e}")))?;
            let c = columns(&seg, &batch)?;
            let s = |n: &str, i: usize| {
                let a = &c.strings[n];
                (!a.is_null(i)).then(|| a.value(i))
            };
            let n = |name: &str, i: usize| {
                let a = &c.ints[name];
                (!a.is_null(i)).then(|| a.value(i))
            };
            for i in 0..batch.num_rows() {
                let layer_name = s("layer", i).unwrap_or("");
                let row_layer = Layer::parse(layer_name)
                    .ok_or_else(|| bad(&seg, format!("row {i}: unknown layer `{layer_name}`")))?;
                if layer.is_some_and(|l| l != row_layer) {
                    continue;
                }
                rows.push(OwnedRow {
                    layer: row_layer,
                    op: intern(s("op", i).unwrap_or("")),
                    issue_ns: n("issue_ns", i).unwrap_or(0),
                    complete_ns: n("complete_ns", i).unwrap_or(0),
                    insert_ns: n("insert_ns", i),
                    dev: s("dev", i).map(&mut intern),
                    offset: n("offset", i),
                    bytes: n("bytes", i).unwrap_or(0),
                    bytes_requested: n("bytes_requested", i).unwrap_or(0),
                    queue_depth: n("queue_depth", i).unwrap_or(0) as u32,
                    pid: n("pid", i).unwrap_or(0) as u32,
                    tid: n("tid", i).unwrap_or(0) as u32,
                    comm: intern(s("comm", i).unwrap_or("")),
                    fd: n("fd", i).map(|v| v as i32),
                    file: s("file", i).map(&mut intern),
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
                });
            }
        }
    }
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

    #[test]
    fn rpc_fields_round_trip_and_are_null_elsewhere() {
        let dir = std::env::temp_dir().join(format!("trainio-schema-rt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let rpc = Rpc { xid: 0xdead_beef, backlog_ns: 1000, rtt_ns: 250_000, execute_ns: 300_000, retrans: Some(2) };
        let mut b = BatchBuilder::new();
        b.push_rpc(&row(Layer::Nfs, "read"), Some(&rpc));
        b.push_rpc(&row(Layer::Nfs, "read"), Some(&Rpc { retrans: None, ..rpc }));
        b.push_rpc(&row(Layer::Nfs, "write"), None);
        b.push(&row(Layer::Block, "read"));
        let mut w = TraceWriter::new(&dir, SegmentLimits { max_bytes: 1 << 30, max_age: Duration::from_secs(60) });
        w.write(&b.finish()).unwrap();
        let meta = vec![
            (keys::SCHEMA_VERSION.to_string(), SCHEMA_VERSION.to_string()),
            (keys::SCHEMA_MINOR.to_string(), SCHEMA_MINOR.to_string()),
        ];
        w.close_segment(&meta).unwrap();
        let rows = read_rows(&dir, None).unwrap();
        assert_eq!(rows[0].rpc, Some(rpc));
        assert_eq!(rows[1].rpc.unwrap().retrans, None);
        assert_eq!(rows[1].rpc.unwrap().rtt_ns, 250_000);
        assert_eq!((rows[2].rpc, rows[3].rpc), (None, None));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn proc_and_ipc_rows_and_ppid_round_trip() {
        let dir = std::env::temp_dir().join(format!("trainio-schema-proc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut b = BatchBuilder::new();
        b.push(&Row { ppid: Some(41), pid: 42, tid: 42, comm: "python", file: Some("python train.py"), ..row(Layer::Proc, "start") });
        b.push(&Row { ppid: Some(42), pid: 43, tid: 43, error: 0, ..row(Layer::Proc, "fork") });
        b.push(&Row { ppid: Some(42), pid: 43, tid: 43, comm: "pt_data_worker", ..row(Layer::Proc, "comm") });
        b.push(&Row { pid: 43, tid: 43, fd: Some(5), file: Some("pipe:[1234]"), dev: Some("0:15"), ..row(Layer::Ipc, "write") });
        b.push(&row(Layer::File, "read"));
        let mut w = TraceWriter::new(&dir, SegmentLimits { max_bytes: 1 << 30, max_age: Duration::from_secs(60) });
        w.write(&b.finish()).unwrap();
        let meta = vec![
            (keys::SCHEMA_VERSION.to_string(), SCHEMA_VERSION.to_string()),
            (keys::SCHEMA_MINOR.to_string(), SCHEMA_MINOR.to_string()),
        ];
        w.close_segment(&meta).unwrap();
        let rows = read_rows(&dir, None).unwrap();
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
        assert_eq!((rows[4].bytes, rows[4].bytes_requested, rows[4].fd, rows[4].dev.as_deref()), (1, 1, Some(8), Some("0:15")));
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
    }
}
