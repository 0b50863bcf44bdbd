//! Write bursts: what a job wrote (a checkpoint, a log, a shard) and the syncs that made
//! it durable, from the file layer's `write`, `fsync`, `fdatasync` and `sync_file_range`
//! rows (schema 1.4).
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

/// One write or sync of a burst, on one of its owner's write files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct WriteOp {
    /// Index into the owner's `write_files`.
    pub file: u32,
    /// A write: its offset and length. sync_file_range: the range (len 0: to the end).
    pub offset: u64,
    pub len: u64,
    /// None for a write, else the sync op.
    pub sync: Option<&'static str>,
}

#[derive(Clone, Debug, Serialize)]
pub struct WriteBurst {
    /// First write's (or sync's) issue and last one's completion, trace clock ns.
    pub start_ns: i64,
    pub end_ns: i64,
    pub duration_s: f64,
    pub bytes: u64,
    pub writes: u64,
    pub syncs: u64,
    /// Distinct files written or synced.
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

/// The bursts of `rows` (write rows, any order). Files are numbered into `files` (path,
/// size a copy needs: the largest byte written).
pub fn bursts(rows: &[&OwnedRow], files: &mut Vec<(String, u64)>) -> Vec<WriteBurst> {
    let mut rows: Vec<&OwnedRow> = rows.iter().copied().filter(|r| is_write_row(r)).collect();
    rows.sort_by_key(|r| (r.issue_ns, r.complete_ns));
    let mut index: HashMap<String, u32> = files.iter().enumerate().map(|(i, (p, _))| (p.clone(), i as u32)).collect();
    let mut out: Vec<WriteBurst> = Vec::new();
    let mut burst_files: Vec<u32> = Vec::new();
    for r in rows {
        let path = r.file.as_deref().unwrap_or_default();
        let file = *index.entry(path.to_string()).or_insert_with(|| {
            files.push((path.to_string(), 0));
            (files.len() - 1) as u32
        });
        let sync = SYNC_OPS.iter().copied().find(|&s| s == &*r.op);
        let offset = r.offset.unwrap_or(0).max(0) as u64;
        let len = if sync.is_some() { r.bytes_requested.max(0) as u64 } else { r.bytes as u64 };
        if sync.is_none() {
            let need = offset + len;
            if need > files[file as usize].1 {
                files[file as usize].1 = need;
            }
        }
        let op = WriteOp { file, offset, len, sync };
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
    out
}

fn add(b: &mut WriteBurst, op: WriteOp, pid: u32, files: &mut Vec<u32>) {
    if op.sync.is_some() {
        b.syncs += 1;
    } else {
        b.writes += 1;
        b.bytes += op.len;
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

/// Places each burst after the batches taken before it began (`ready_ns` of the steps).
pub fn place(bursts: &mut [WriteBurst], ready_ns: &[i64]) {
    for b in bursts {
        let taken = ready_ns.iter().filter(|&&t| t <= b.start_ns).count() as u64;
        b.after_step = (taken > 0).then_some(taken);
    }
}
