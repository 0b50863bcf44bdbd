//! Write bursts: what a job wrote (a checkpoint, a log, a shard) and the syncs that made
//! it durable, from the file layer's `write`, `fsync`, `fdatasync` and `sync_file_range`
//! rows (schema 1.4), and the objects it put to an object store, from the object layer's
//! `put` and `post` rows (schema 1.8).
//!
//! An object written is a PutObject (one `put` of the whole body), or a multipart upload:
//! CreateMultipartUpload (a `post` without a body), its UploadPart requests (`put`s to
//! the same `bucket/key` by the same process while the upload is open) and
//! CompleteMultipartUpload (a `post` with a body, its list of parts). The trace does not
//! keep the query (`?uploads`, `?partNumber=N&uploadId=X`), so the upload is told by
//! that sequence. Its parts keep their recorded sizes, and the most of them that were in
//! flight at once is the upload's `parallel`. The part numbers are not in the trace
//! either: the parts are numbered largest first, in issue order among equals, so a short
//! last part (the object's tail) keeps its place at the end. An upload the trace does not
//! see completed (aborted with a `delete`, or still open when the recording ended) wrote
//! no object and is left out. Only requests to a key in a bucket answered 2xx count (a
//! response whose body the recorder did not follow, `error` -61, counts: its status says
//! the store took the request).
//!
//! A burst is a run of a process group's writes and syncs in which each one starts less
//! than `WRITE_GAP_NS` after the previous one ended: a checkpoint is written back to
//! back, then synced, and the next one comes steps later. A GPU's rank has its own
//! bursts, each placed in the step sequence by the batches the GPU had taken when it
//! began (`after_step`), which is where `trainio replay --trace` writes it again.

use std::collections::HashMap;

use serde::Serialize;
use trainio_schema::{Layer, OwnedRow};

/// Writes and syncs closer than this (end of one to start of the next) are one burst.
pub const WRITE_GAP_NS: i64 = 100_000_000;

/// The sync ops of the file layer, as the trace names them.
pub const SYNC_OPS: [&str; 3] = ["fsync", "fdatasync", "sync_file_range"];

/// An object request of a burst, on the object (`bucket/key`) its `WriteOp::file` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ObjectWrite {
    /// PutObject: the whole object, `len` bytes, in one request.
    Put,
    /// CreateMultipartUpload of an upload of `parts` parts, at most `parallel` of them
    /// in flight at once in the recording.
    Create { parts: u32, parallel: u32 },
    /// UploadPart `number` (1-based): `len` bytes, at `offset` of the object.
    Part { number: u32 },
    /// CompleteMultipartUpload.
    Complete,
}

/// One write or sync of a burst, on one of its owner's write files, or one request that
/// puts an object (`object`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct WriteOp {
    /// Index into the owner's `write_files`.
    pub file: u32,
    /// A write: its offset and length. sync_file_range: the range (len 0: to the end).
    /// An object request: the body's place in the object (0 and 0 for create and complete).
    pub offset: u64,
    pub len: u64,
    /// None for a write, else the sync op.
    pub sync: Option<&'static str>,
    /// An object request (then `sync` is None).
    pub object: Option<ObjectWrite>,
}

#[derive(Clone, Debug, Serialize)]
pub struct WriteBurst {
    /// First write's (or sync's) issue and last one's completion, trace clock ns.
    pub start_ns: i64,
    pub end_ns: i64,
    pub duration_s: f64,
    /// Bytes written, and object bodies put (PutObject, UploadPart).
    pub bytes: u64,
    /// Writes, and requests that carried an object's bytes (PutObject, UploadPart).
    pub writes: u64,
    pub syncs: u64,
    /// Distinct files written or synced, and objects put.
    pub files: u32,
    /// bytes / duration.
    pub mib_s: f64,
    /// The GPU's batches taken (ready) before the burst began: the replay writes it after
    /// that many steps. None before the GPU's first batch, and for bursts of the job as a
    /// whole.
    pub after_step: Option<u64>,
    pub pids: Vec<u32>,
    #[serde(skip)]
    pub ops: Vec<WriteOp>,
}

/// The write bursts of the whole job (every traced process) and their totals.
#[derive(Clone, Debug, Default, Serialize)]
pub struct WriteSummary {
    pub gap_ms: f64,
    pub count: u64,
    pub bytes: u64,
    pub syncs: u64,
    /// Sum of the bursts' durations.
    pub duration_s: f64,
    pub mean_duration_s: Option<f64>,
    pub mean_bytes: Option<f64>,
    /// Bytes over the summed durations: the throughput while writing.
    pub mib_s: Option<f64>,
    /// Mean start-to-start time between consecutive bursts.
    pub interval_s: Option<f64>,
    pub bursts: Vec<WriteBurst>,
}

/// Whether a row is a successful write with data or a sync, of a known file.
pub fn is_write_row(r: &OwnedRow) -> bool {
    r.layer == Layer::File
        && r.error == 0
        && r.file.is_some()
        && match &*r.op {
            "write" => r.bytes > 0 && r.offset.is_some(),
            op => SYNC_OPS.contains(&op),
        }
}

/// `error` of an object request whose response the recorder did not see to its end
/// (a chunked body, as CompleteMultipartUpload's answer often is): -ENODATA.
const RESPONSE_CUT: i32 = -61;

/// Whether an object row is a successful request to a key in a bucket (a write when it
/// is a `put`, or one of a multipart upload's `post`s: `object_writes`): answered 2xx,
/// its response received in full or cut short (the status says the store took it).
fn is_object_request(r: &OwnedRow) -> bool {
    let ok = r.object.as_ref().and_then(|o| o.http_status).is_some_and(|s| (200..300).contains(&s));
    ok && r.layer == Layer::Object
        && (r.error == 0 || r.error == RESPONSE_CUT)
        && r.file.as_deref().and_then(|f| f.split_once('/')).is_some_and(|(b, k)| !b.is_empty() && !k.is_empty())
}

/// One write, sync or object request, before it joins a burst.
struct Item<'a> {
    issue_ns: i64,
    complete_ns: i64,
    pid: u32,
    path: &'a str,
    offset: u64,
    len: u64,
    sync: Option<&'static str>,
    object: Option<ObjectWrite>,
}

/// A multipart upload open in the trace: its create and its parts so far.
struct Upload<'a> {
    create: &'a OwnedRow,
    parts: Vec<&'a OwnedRow>,
}

/// The object writes among object rows (module comment): each PutObject, and each
/// completed multipart upload as its create, numbered parts and complete. Returns them
/// and the uploads left out (not completed in the trace).
fn object_writes<'a>(rows: &[&'a OwnedRow]) -> (Vec<Item<'a>>, u64) {
    let mut rows: Vec<&OwnedRow> = rows.iter().copied().filter(|r| is_object_request(r)).collect();
    rows.sort_by_key(|r| (r.issue_ns, r.complete_ns));
    let mut open: HashMap<(u32, &str), Upload> = HashMap::new();
    let mut out = Vec::new();
    let mut left_out = 0;
    let item = |r: &'a OwnedRow, offset: u64, len: u64, object: ObjectWrite| Item {
        issue_ns: r.issue_ns,
        complete_ns: r.complete_ns,
        pid: r.pid,
        path: r.file.as_deref().unwrap_or_default(),
        offset,
        len,
        sync: None,
        object: Some(object),
    };
    for r in rows {
        let key = (r.pid, r.file.as_deref().unwrap_or_default());
        match (&*r.op, r.bytes > 0) {
            ("post", false) => {
                // Created again before it was completed: the first put no object.
                left_out += u64::from(open.insert(key, Upload { create: r, parts: Vec::new() }).is_some());
            }
            ("put", _) => match open.get_mut(&key) {
                Some(u) => u.parts.push(r),
                None => out.push(item(r, 0, r.bytes as u64, ObjectWrite::Put)),
            },
            ("post", true) => {
                // A post to a key without an open upload writes no object.
                let Some(u) = open.remove(&key) else { continue };
                // Largest first, in issue order among equals: the parts' numbers.
                let mut order: Vec<usize> = (0..u.parts.len()).collect();
                order.sort_by_key(|&i| (std::cmp::Reverse(u.parts[i].bytes), i));
                let mut offsets = vec![(0u64, 0u32); u.parts.len()];
                let mut at = 0u64;
                for (n, &i) in order.iter().enumerate() {
                    offsets[i] = (at, n as u32 + 1);
                    at += u.parts[i].bytes.max(0) as u64;
                }
                let parts = u.parts.len() as u32;
                let parallel = most_in_flight(&u.parts);
                out.push(item(u.create, 0, 0, ObjectWrite::Create { parts, parallel }));
                for (p, &(offset, number)) in u.parts.iter().zip(&offsets) {
                    out.push(item(p, offset, p.bytes.max(0) as u64, ObjectWrite::Part { number }));
                }
                out.push(item(r, 0, 0, ObjectWrite::Complete));
            }
            ("delete", _) => {
                left_out += u64::from(open.remove(&key).is_some()); // AbortMultipartUpload
            }
            _ => {}
        }
    }
    (out, left_out + open.len() as u64)
}

/// The most of `rows` in flight at once (issue to completion).
fn most_in_flight(rows: &[&OwnedRow]) -> u32 {
    let mut edges: Vec<(i64, i32)> = rows.iter().flat_map(|r| [(r.issue_ns, 1), (r.complete_ns, -1)]).collect();
    // An end before a start at the same instant: back to back is not at once.
    edges.sort_unstable();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    most.max(1) as u32
}

/// The bursts of `rows` (write rows, any order). Files are numbered into `files` (path,
/// size a copy needs: the largest byte written).
pub fn bursts(rows: &[&OwnedRow], files: &mut Vec<(String, u64)>) -> Vec<WriteBurst> {
    bursts_with_objects(rows, &[], files).0
}

/// The bursts of file-layer write rows and of the objects that object rows put (any
/// order; module comment), together: a checkpoint saved as files and objects is one
/// burst. Files and objects are numbered into `files`. Also returns the multipart
/// uploads left out (not completed in the trace).
pub fn bursts_with_objects(
    rows: &[&OwnedRow],
    objects: &[&OwnedRow],
    files: &mut Vec<(String, u64)>,
) -> (Vec<WriteBurst>, u64) {
    let mut items: Vec<Item> = rows
        .iter()
        .copied()
        .filter(|r| is_write_row(r))
        .map(|r| {
            let sync = SYNC_OPS.iter().copied().find(|&s| s == &*r.op);
            Item {
                issue_ns: r.issue_ns,
                complete_ns: r.complete_ns,
                pid: r.pid,
                path: r.file.as_deref().unwrap_or_default(),
                offset: r.offset.unwrap_or(0).max(0) as u64,
                len: if sync.is_some() { r.bytes_requested.max(0) as u64 } else { r.bytes as u64 },
                sync,
                object: None,
            }
        })
        .collect();
    let (puts, left_out) = object_writes(objects);
    items.extend(puts);
    // Stable: an upload's create, parts and complete keep their order at equal times.
    items.sort_by_key(|r| (r.issue_ns, r.complete_ns));
    let mut index: HashMap<String, u32> = files.iter().enumerate().map(|(i, (p, _))| (p.clone(), i as u32)).collect();
    let mut out: Vec<WriteBurst> = Vec::new();
    let mut burst_files: Vec<u32> = Vec::new();
    for r in items {
        let file = *index.entry(r.path.to_string()).or_insert_with(|| {
            files.push((r.path.to_string(), 0));
            (files.len() - 1) as u32
        });
        let (offset, len, sync) = (r.offset, r.len, r.sync);
        if sync.is_none() {
            let need = offset + len;
            if need > files[file as usize].1 {
                files[file as usize].1 = need;
            }
        }
        let op = WriteOp { file, offset, len, sync, object: r.object };
        match out.last_mut() {
            Some(b) if r.issue_ns - b.end_ns < WRITE_GAP_NS => {
                b.end_ns = b.end_ns.max(r.complete_ns);
                add(b, op, r.pid, &mut burst_files);
            }
            _ => {
                if let Some(b) = out.last_mut() {
                    finish(b, &mut burst_files);
                }
                let mut b = WriteBurst {
                    start_ns: r.issue_ns,
                    end_ns: r.complete_ns,
                    duration_s: 0.0,
                    bytes: 0,
                    writes: 0,
                    syncs: 0,
                    files: 0,
                    mib_s: 0.0,
                    after_step: None,
                    pids: Vec::new(),
                    ops: Vec::new(),
                };
                add(&mut b, op, r.pid, &mut burst_files);
                out.push(b);
            }
        }
    }
    if let Some(b) = out.last_mut() {
        finish(b, &mut burst_files);
    }
    (out, left_out)
}

fn add(b: &mut WriteBurst, op: WriteOp, pid: u32, files: &mut Vec<u32>) {
    match (op.sync, op.object) {
        (Some(_), _) => b.syncs += 1,
        (None, None | Some(ObjectWrite::Put | ObjectWrite::Part { .. })) => {
            b.writes += 1;
            b.bytes += op.len;
        }
        (None, Some(_)) => {} // an upload's create or complete: no object bytes
    }
    if !b.pids.contains(&pid) {
        b.pids.push(pid);
    }
    files.push(op.file);
    b.ops.push(op);
}

fn finish(b: &mut WriteBurst, files: &mut Vec<u32>) {
    files.sort_unstable();
    files.dedup();
    b.files = files.len() as u32;
    files.clear();
    b.duration_s = (b.end_ns - b.start_ns).max(0) as f64 / 1e9;
    b.mib_s = if b.duration_s > 0.0 { b.bytes as f64 / (1 << 20) as f64 / b.duration_s } else { 0.0 };
}

/// The job's write bursts and their totals.
pub fn summarize(bursts: Vec<WriteBurst>) -> WriteSummary {
    let count = bursts.len() as u64;
    let bytes: u64 = bursts.iter().map(|b| b.bytes).sum();
    let duration_s: f64 = bursts.iter().map(|b| b.duration_s).sum();
    let starts: Vec<i64> = bursts.iter().map(|b| b.start_ns).collect();
    let interval_s =
        (starts.len() > 1).then(|| (starts[starts.len() - 1] - starts[0]) as f64 / 1e9 / (starts.len() - 1) as f64);
    WriteSummary {
        gap_ms: WRITE_GAP_NS as f64 / 1e6,
        count,
        bytes,
        syncs: bursts.iter().map(|b| b.syncs).sum(),
        duration_s,
        mean_duration_s: (count > 0).then(|| duration_s / count as f64),
        mean_bytes: (count > 0).then(|| bytes as f64 / count as f64),
        mib_s: (duration_s > 0.0).then(|| bytes as f64 / (1 << 20) as f64 / duration_s),
        interval_s,
        bursts,
    }
}

/// Places each burst after the steps its GPU had begun when it began (`steps_by`: the
/// steps begun by a time).
pub fn place(bursts: &mut [WriteBurst], steps_by: impl Fn(i64) -> u64) {
    for b in bursts {
        let taken = steps_by(b.start_ns);
        b.after_step = (taken > 0).then_some(taken);
    }
}
