//! The job model's types: what the model says of a job, its GPUs, their steps and reads,
//! the processes left out and how much of the data the file layer saw. They serialize
//! as the `job_model` of `trainio analyze --json` (docs/analysis.md).

use serde::Serialize;

use trainio_schema::OwnedRow;

use crate::{object_reads, writes};

/// One read of a step: a byte range of one of the GPU's files, by one of its readers.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Read {
    pub file: u32,
    pub offset: u64,
    pub len: u64,
    /// The worker (or thread) that issued it, numbered from 0 in order of first read.
    pub reader: u32,
    /// Read through a memory mapping (its page faults, mapped.rs), not a read syscall.
    pub mapped: bool,
    /// A DataLoader worker's own time after this read, before its next read of the batch
    /// (after the batch's last read: before its handoff), ns: its share of the step's
    /// `worker_cpu_s`, kept where the worker spent it. 0 outside a worker's batch, and in
    /// a batch read through a mapping (its reads are instants: no CPU time to tell apart).
    #[serde(skip)]
    pub cpu_after_ns: u64,
}

/// What a rank did to its data files itself before its workers' first batch (opening
/// the dataset: reading its schema and index through the mapping, asking the kernel to
/// read ranges ahead): the page cache its steps start with. The replay does it before
/// its steps, as the job did before its first batch.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SetupRead {
    pub read: Read,
    /// Not a read but `madvise`/`posix_fadvise(WILLNEED)` of the range (pyarrow asks it
    /// of each range it reads): readahead that the kernel starts, moving no bytes.
    pub advise: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct Step {
    #[serde(skip)]
    pub reads: Vec<Read>,
    pub bytes: u64,
    pub samples: u32,
    /// When the batch's first read was issued (trace clock, ns).
    pub first_read_ns: i64,
    /// When the GPU had the batch: the end of its read off the worker pipe, or of the
    /// burst's last read.
    pub ready_ns: i64,
    /// Time from this step's batch being ready to the GPU asking for the next one
    /// (compute, plus any wait for other ranks); None for the last step.
    pub interval_s: Option<f64>,
    /// Time the GPU waited for this batch (polling its workers' pipe, or reading the burst).
    pub wait_s: f64,
    /// Loader threads that read ahead (`GpuModel::paced`): from this burst's first read to
    /// the next one's, the recorded step period (the last step: the median).
    pub period_s: Option<f64>,
    /// A DataLoader worker's own time on this batch outside its reads: from its first
    /// read to its handoff, less the time inside read syscalls (decoding, augmenting,
    /// collating). None for steps that are not a worker's batch.
    pub worker_cpu_s: Option<f64>,
    /// The GPU took this batch. False: its workers read it ahead (PyTorch's prefetch) and
    /// handed it off, but the job ended before the GPU took it; its reads are real, it
    /// has no compute. Such batches come after every batch the GPU took.
    pub taken: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct Member {
    pub pid: u32,
    pub comm: String,
    /// `rank` or `worker`.
    pub role: &'static str,
    /// Why a worker is a worker: `named pt_data_worker`, `hands off to its parent`.
    pub why: String,
    pub bytes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct GpuModel {
    pub index: usize,
    /// The host the GPU ran on, in the model of a trace set (None: one trace).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    pub rank_pid: u32,
    pub comm: String,
    pub members: Vec<Member>,
    pub workers: usize,
    /// Readers the replay gives this GPU: its workers, or the threads that read.
    pub readers: usize,
    /// The rank reads its batches itself, then computes (no worker reads ahead).
    pub synchronous: bool,
    /// Reads come from threads other than the one that computes (a loader thread pool, or
    /// worker processes whose handoff is not in the trace): steps are bursts that the
    /// threads read ahead, compute per step is the recorded step period, and the replay
    /// starts each burst no earlier than its recorded time.
    pub paced: bool,
    /// Batches a GPU's workers may have started but it has not taken (PyTorch's
    /// prefetch_factor 2 × workers).
    pub prefetch_batches: usize,
    /// `handoff` (batches from the worker pipe) or `bursts` (gaps between reads).
    pub step_signal: &'static str,
    /// The GPU's batches in order: the `steps_taken` it took, then those its workers read
    /// ahead that it never took (`Step::taken`).
    pub steps: Vec<Step>,
    /// Batches the GPU took and computed on: the steps the replay computes.
    pub steps_taken: usize,
    /// Bytes of the batches read ahead and never taken (they count in `bytes`).
    pub untaken_bytes: u64,
    /// Recorded path and the size a copy needs (largest byte read, rounded to 4 KiB).
    pub files: Vec<(String, u64)>,
    /// Bytes of every batch, taken or not.
    pub bytes: u64,
    /// Samples of the batches taken.
    pub samples: u64,
    pub compute_s: Option<f64>,
    pub interval_p50_s: Option<f64>,
    pub interval_p90_s: Option<f64>,
    pub wait_s: f64,
    /// GPU-side time per step spent taking a batch that is not waiting for storage: the
    /// rank receiving a batch from its workers (unpickling, shared-memory handles), or
    /// the loader's own CPU time between a rank's reads. The replay spends it too.
    pub handoff_s: f64,
    /// What `compute_s` was measured from: `collective` (the batch in hand to the first
    /// send of the step's collective), `next_get` (an index write to the next get of the
    /// worker pipe), `gap` (an inline loader's idle gap), `period` (reader threads).
    pub compute_signal: &'static str,
    /// With `compute_signal` `collective`: the collective's own time per step, from its
    /// first send to the next ask for data when no rank waits for another (the 10th
    /// percentile); 0 otherwise. The replay spends it, outside compute.
    pub sync_s: f64,
    /// Per batch taken.
    pub bytes_per_step: f64,
    pub samples_per_step: f64,
    pub required_mib_s: Option<f64>,
    /// The GPU's utilization in the recording, by DLIO's formula with the inferred compute.
    pub au_recorded: Option<f64>,
    pub mib_s_recorded: Option<f64>,
    /// Workers' time per sample outside their reads (the median over the batches of
    /// `Step::worker_cpu_s` / samples): the loader's preprocessing per sample, which the
    /// storage does not set. None without workers.
    pub worker_cpu_s_per_sample: Option<f64>,
    /// Of a worker's time on a batch (first read to handoff), the share outside its
    /// reads (median over the batches): near 1 a loader-bound job, near 0 a storage-bound one.
    pub worker_cpu_share: Option<f64>,
    /// Bytes a worker read after its last handoff (a batch never delivered).
    pub unfinished_bytes: u64,
    /// A rank with workers: its own reads and readahead advice on its data files before
    /// the first batch, in order (`SetupRead`).
    #[serde(skip)]
    pub setup: Vec<SetupRead>,
    /// From the setup's first read or advice to the first batch's first read, s (0
    /// without a setup): the loading and the workers' start-up, outside the steps.
    #[serde(skip)]
    pub setup_lead_s: f64,
    /// The rank's write bursts (writes::bursts), placed in its steps.
    pub write_bursts: Vec<writes::WriteBurst>,
    /// Files the GPU wrote: recorded path and the size a copy needs (largest byte written).
    #[serde(skip)]
    pub write_files: Vec<(String, u64)>,
}

impl GpuModel {
    /// The batches the GPU took (the first `steps_taken` of `steps`).
    pub fn taken(&self) -> &[Step] {
        &self.steps[..self.steps_taken.min(self.steps.len())]
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct LeftOut {
    /// The host, in the model of a trace set (None: one trace).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    pub pid: u32,
    pub comm: String,
    pub bytes: u64,
    pub why: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Coverage {
    /// The host, in the model of a trace set (None: one trace).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    pub pid: u32,
    pub comm: String,
    pub block_read_bytes: u64,
    pub file_read_bytes: u64,
    /// The process belongs to a GPU; then the two figures from its GPU's first data read on.
    pub in_gpu: bool,
    pub block_read_bytes_training: u64,
    pub file_read_bytes_training: u64,
}

/// The object store the GPUs' data comes from (object_reads.rs).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ObjectSource {
    /// `IP:PORT` of the server.
    pub endpoint: String,
    pub bucket: String,
    /// The GETs of its objects the model counts as reads, and their body bytes.
    pub requests: u64,
    pub bytes: u64,
}

impl ObjectSource {
    /// The store `data_dev` names (`s3://ENDPOINT/BUCKET`), with its reads among `rows`.
    pub(crate) fn of(data_dev: Option<&str>, rows: &[&OwnedRow]) -> Option<ObjectSource> {
        let dev = data_dev?;
        let (endpoint, bucket) = object_reads::store_of(dev)?;
        let on = rows.iter().filter(|r| object_reads::is_object_read(r) && r.dev.as_deref() == Some(dev));
        let (requests, bytes) = on.fold((0, 0), |(n, b), r| (n + 1, b + r.bytes.max(0) as u64));
        Some(ObjectSource { endpoint: endpoint.into(), bucket: bucket.into(), requests, bytes })
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct JobModel {
    /// Where the GPUs' data comes from: a disk `MAJ:MIN`, or an object store
    /// `s3://ENDPOINT/BUCKET` (then `object_store` says which).
    pub data_dev: Option<String>,
    /// The data comes from an object store: its GETs are the reads (absent: from files).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object_store: Option<ObjectSource>,
    /// How the GPUs were found.
    pub grouping: String,
    pub gpus: Vec<GpuModel>,
    pub left_out: Vec<LeftOut>,
    pub compute_s: Option<f64>,
    pub bytes_per_step: Option<f64>,
    pub required_mib_s_per_gpu: Option<f64>,
    /// The batches the GPUs took, summed (`GpuModel::steps_taken`).
    pub steps: u64,
    /// Per traced process with block reads: block bytes against file-layer bytes.
    pub coverage: Vec<Coverage>,
    /// Set when the file layer lacks most of what the job read: the reason, one line.
    pub incomplete: Option<String>,
    pub warnings: Vec<String>,
    /// Every traced process's write bursts, the job's checkpoints among them.
    pub writes: writes::WriteSummary,
    /// The hosts of a trace set's model, in member order (empty: one trace).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
}
