//! What one GPU's inference works from, as typed values: the job's rows and choices
//! (`JobEvidence`, built once), one GPU's processes, data files and pipes
//! (`GpuEvidence`), and what finding its steps yields (`StepsFound`). The parts that find
//! steps (handoff.rs, bursts.rs), compute (compute.rs) and figures (gpu.rs) take these
//! instead of long parameter lists.

use std::collections::{HashMap, HashSet};

use trainio_schema::OwnedRow;

use crate::grouping::DataReads;
use crate::input::{rows_of, ByPid, Input};
use crate::job::{Read, Step};
use crate::mapped;
use crate::options::Options;

/// The job-wide evidence every GPU's inference reads.
pub(crate) struct JobEvidence<'a> {
    pub input: &'a Input,
    /// The trace's rows by process.
    pub ix: &'a ByPid<'a>,
    pub opts: &'a Options,
    /// The data device and the reads on it.
    pub data: &'a DataReads<'a>,
    /// Every traced process's write bursts, (start, end) ns.
    pub job_writes: &'a [(i64, i64)],
}

/// One GPU's processes and what they read and pass between them.
pub(crate) struct GpuEvidence<'a> {
    pub job: &'a JobEvidence<'a>,
    /// The GPU's number in the job, as warnings name it.
    pub index: usize,
    pub rank: u32,
    /// Its workers, in order of their first data read.
    pub workers: &'a [u32],
    /// The rank, then its workers.
    pub pids: Vec<u32>,
    /// The data files: those the GPU's processes read from the data device. Opens and
    /// closes count only on them (an open row carries no device).
    pub data_paths: HashSet<&'a str>,
    /// Successful opens of the data files: (pid, issue ns).
    pub opens: Vec<(u32, i64)>,
    /// The worker pipe(s): written by this GPU's workers, read by its rank.
    pub data_pipes: HashSet<&'a str>,
    /// The workers' index queues: written by the rank, read by a worker (one batch index
    /// per batch the rank takes).
    pub index_pipes: HashSet<&'a str>,
}

impl<'a> GpuEvidence<'a> {
    pub fn new(job: &'a JobEvidence<'a>, index: usize, rank: u32, workers: &'a [u32]) -> Self {
        let ix = job.ix;
        let mut pids: Vec<u32> = vec![rank];
        pids.extend_from_slice(workers);
        let data_paths: HashSet<&'a str> =
            pids.iter().flat_map(|&p| rows_of(&ix.data, p)).filter_map(|r| r.file.as_deref()).collect();
        let is_data_file = |r: &OwnedRow| r.file.as_deref().is_some_and(|f| data_paths.contains(f));
        let opens: Vec<(u32, i64)> = pids
            .iter()
            .flat_map(|&p| rows_of(&ix.file, p))
            .filter(|r| &*r.op == "open" && r.error == 0 && is_data_file(r))
            .map(|r| (r.pid, r.issue_ns))
            .collect();
        let mut data_pipes: HashSet<&'a str> = HashSet::new();
        let mut index_pipes: HashSet<&'a str> = HashSet::new();
        if !workers.is_empty() {
            let mut w_of: HashSet<&str> = HashSet::new();
            let mut r_of: HashSet<&str> = HashSet::new();
            let mut rank_w: HashSet<&str> = HashSet::new();
            let mut worker_r: HashSet<&str> = HashSet::new();
            for r in pids.iter().flat_map(|&p| rows_of(&ix.ipc, p)) {
                let Some(f) = r.file.as_deref() else { continue };
                match &*r.op {
                    "write" if r.bytes > 0 && workers.contains(&r.pid) => {
                        w_of.insert(f);
                    }
                    "write" if r.bytes > 0 && r.pid == rank => {
                        rank_w.insert(f);
                    }
                    "read" if r.bytes > 0 && r.pid == rank => {
                        r_of.insert(f);
                    }
                    "read" if r.bytes > 0 && workers.contains(&r.pid) => {
                        worker_r.insert(f);
                    }
                    _ => {}
                }
            }
            data_pipes = w_of.intersection(&r_of).copied().collect();
            index_pipes = rank_w.intersection(&worker_r).copied().collect();
        }
        GpuEvidence { job, index, rank, workers, pids, data_paths, opens, data_pipes, index_pipes }
    }

    pub fn is_data_file(&self, r: &OwnedRow) -> bool {
        r.file.as_deref().is_some_and(|f| self.data_paths.contains(f))
    }

    /// The rows of `pid` among the trace's file rows.
    pub fn file_rows(&self, pid: u32) -> &'a [&'a OwnedRow] {
        rows_of(&self.job.ix.file, pid)
    }

    pub fn ipc_rows(&self, pid: u32) -> &'a [&'a OwnedRow] {
        rows_of(&self.job.ix.ipc, pid)
    }

    /// The data reads of `pid` (on the data device).
    pub fn data_rows(&self, pid: u32) -> &'a [&'a OwnedRow] {
        rows_of(&self.job.ix.data, pid)
    }
}

/// What finding a GPU's steps yields, by the batch handoff (handoff.rs) or by bursts of
/// reads (bursts.rs).
pub(crate) struct StepsFound {
    pub steps: Vec<Step>,
    /// `handoff` or `bursts` (`GpuModel::step_signal`).
    pub signal: &'static str,
    pub readers: usize,
    pub synchronous: bool,
    /// The intervals compute is taken from; None: the steps' `interval_s`.
    pub intervals: Option<Vec<f64>>,
    /// Per step: (from, anchor, to): the GPU has its batch from `from` (its main thread's
    /// last syscall up to `anchor` starts the compute) until it asks for the next at `to`.
    pub windows: Vec<(i64, i64, i64)>,
    /// Reader threads: how many batches the loader was seen to read ahead (at least 2).
    pub read_ahead: usize,
    pub handoff_s: f64,
    /// Bytes a worker read after its last handoff.
    pub unfinished_bytes: u64,
}

/// The files a GPU read, numbered in order of first read, with the size a copy needs.
pub(crate) struct Files {
    index: HashMap<String, u32>,
    pub list: Vec<(String, u64)>,
}

impl Files {
    pub fn new() -> Self {
        Files { index: HashMap::new(), list: Vec::new() }
    }
    fn name(r: &OwnedRow) -> String {
        match (&r.file, r.fd) {
            (Some(f), _) => f.to_string(),
            (None, fd) => format!("<pid {} fd {}>", r.pid, fd.unwrap_or(-1)),
        }
    }
    /// The number of the file of `r`, None when no read of it was added.
    pub fn get(&self, r: &OwnedRow) -> Option<u32> {
        self.index.get(&Self::name(r)).copied()
    }
    pub fn add(&mut self, r: &OwnedRow) -> Read {
        let name = Self::name(r);
        let next = self.list.len() as u32;
        let fi = *self.index.entry(name.clone()).or_insert(next);
        if fi == next {
            self.list.push((name, 0));
        }
        let offset = r.offset.unwrap_or(0).max(0) as u64;
        let len = r.bytes as u64;
        let e = &mut self.list[fi as usize].1;
        *e = (*e).max(offset + len);
        Read { file: fi, offset, len, reader: 0, mapped: mapped::is_mapped_read(r), cpu_after_ns: 0 }
    }
}

/// Pages of one sample read through a mapping may be this far apart in its rows: a
/// fault that maps a large folio leaves no row for the folio's other pages (up to the
/// 128 KiB of the default readahead).
const SAMPLE_GAP_BYTES: u64 = 128 << 10;

/// A batch's (or burst's) samples when it opened no data file. Read through a memory
/// mapping (shuffled rows of an Arrow file), each sample is one run of pages, so its
/// samples are its runs of mapped pages per file, runs less than SAMPLE_GAP_BYTES apart
/// being one; a run under a quarter of the batch's longest is the file's header or
/// index, not a sample (rows read in order make one run). Reads by syscall count a
/// sample per file.
pub(crate) fn samples_without_opens(reads: &[Read]) -> u32 {
    let mut pages: Vec<(u32, u64, u64)> =
        reads.iter().filter(|r| r.mapped).map(|r| (r.file, r.offset, r.offset + r.len)).collect();
    pages.sort_unstable();
    let mut runs: Vec<(u32, u64, u64)> = Vec::new();
    for (file, start, end) in pages {
        match runs.last_mut() {
            Some((f, _, e)) if *f == file && start <= *e + SAMPLE_GAP_BYTES => *e = (*e).max(end),
            _ => runs.push((file, start, end)),
        }
    }
    let longest = runs.iter().map(|(_, s, e)| e - s).max().unwrap_or(0);
    let samples = runs.iter().filter(|(_, s, e)| 4 * (e - s) >= longest).count();
    let by_syscall: HashSet<u32> = reads.iter().filter(|r| !r.mapped).map(|r| r.file).collect();
    (samples + by_syscall.len()) as u32
}

/// Counts the opens of data files per (pid, time window): the samples of a batch, one
/// `__getitem__` opening one file.
pub(crate) fn opens_between(opens: &[(u32, i64)], pids: &[u32], from: i64, to: i64) -> u32 {
    opens.iter().filter(|(p, t)| pids.contains(p) && *t > from && *t <= to).count() as u32
}
