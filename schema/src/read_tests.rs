//! Unit tests of read.rs: rows of every layer written and read back, batches of a stream
//! decoded as a file's, retention, traces of earlier minors, and set members.

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
    b.push_object(&get, &ObjectFields { endpoint: "127.0.0.1:9000", http_status: Some(206), first_byte_ns: Some(15) });
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
