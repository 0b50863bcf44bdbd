//! The job model: what a training job is, inferred from its trace. One implementation,
//! used by `trainio replay --trace` (Rust) and `trainio analyze` (through the analyzer's
//! native extension), so both say the same thing about a trace.
//!
//! From the trace's `file`, `proc`, `ipc` and `object` layers (traces/SCHEMA.md) it finds
//! (object requests, a job's GETs of its samples from S3, are its reads: object_reads.rs):
//!
//! 1. **Which processes are one GPU.** A rank and its DataLoader worker processes are one
//!    simulated GPU. A process that reads data is a *worker* of its parent when it names
//!    itself `pt_data_worker` (PyTorch's workers do) or hands what it read to its parent
//!    through a pipe or socket (a write on an inode the parent reads or polls). Every
//!    other process that reads data is a rank. Groups that read under 1 % of the largest
//!    group's bytes (a launcher, an interpreter loading modules) are left out.
//! 2. **Steps.** With workers, a step is one batch: a worker's data reads from its get of
//!    the batch's index (a read of the index queue its rank writes) to its next get, handed
//!    off by its next write to the parent's pipe (without gets in the trace, its reads
//!    between two of those writes). Without workers (the rank reads its samples itself),
//!    a step is a burst of reads: bursts are separated by gaps longer than every gap
//!    inside a batch (the largest jump in the sorted gaps, or `--burst-gap-ms`).
//! 3. **Compute time per step.** The time the rank spends outside getting its data: with
//!    workers, from the end of one batch's read off the pipe to the start of the next
//!    get (its poll on the pipe, or the read itself), so waiting for a late batch is not
//!    counted; without workers, the gap between bursts. The GPU's compute time is the
//!    10th percentile of these intervals: an interval can only be longer than the compute
//!    (a collective waiting for a slower rank, the end of an epoch), rarely shorter.
//! 4. **Throughput one GPU needs**: bytes per step / compute time per step.
//! 5. **Whether the file layer saw the data**: the block-layer bytes each traced process
//!    caused against its file-layer reads. Reads through mmap (its page faults, schema
//!    1.6: mapped.rs) count as reads; io_uring reads are file-layer rows only when
//!    recorded with `--io-uring`, and traces before 1.6 have no mapped reads. A trace
//!    whose file layer lacks most of the data is marked incomplete, and replay refuses it
//!    unless told otherwise.
//!
//! Where each part lives: 1 in grouping.rs; 2 in handoff.rs (with workers) and bursts.rs
//! (without), over the typed evidence of evidence.rs; 3 in compute.rs (and the rank's
//! gets in handoff.rs); 4 in gpu.rs, which builds each GPU from the parts; 5 in
//! coverage.rs. Beside them: input.rs (what the model reads from a trace, from its files or from
//! batches the analyzer decoded), async_reads.rs and arrivals.rs (io_uring readers, timed by
//! when the device saw their requests), job.rs (what
//! it says), mapped.rs (reads through mmap), object_reads.rs (GETs from an object store
//! as reads), shards.rs (samples of streamed tar shards),
//! writes.rs (write bursts), trace_set.rs (a job recorded on several hosts), whatif.rs
//! (what-ifs), describe.rs (JSON and printed lines). This file ties them together.

use std::path::{Path, PathBuf};

use trainio_schema::open_trace_set;

mod arrivals;
mod async_reads;
mod bursts;
mod compute;
mod coverage;
mod describe;
mod evidence;
mod gpu;
mod grouping;
mod handoff;
mod input;
mod job;
pub mod mapped;
pub mod object_reads;
mod options;
pub mod shards;
mod stats;
mod trace_set;
pub mod whatif;
pub mod writes;

pub use bursts::{step_gap_ns, DEFAULT_BURST_GAP_MS};
pub use describe::{describe, to_json};
pub use grouping::WORKER_COMM;
pub use input::{load_input, load_member_input, Input, InputBuilder};
pub use job::{Coverage, GpuModel, JobModel, LeftOut, Member, ObjectSource, Read, SetupRead, Step};
pub use options::{Grouping, Options};
pub use trace_set::combine;

use evidence::JobEvidence;
use grouping::{group, DataReads, Processes};
use input::ByPid;
use stats::quantile;

/// The job model of a trace, or of a trace set (the per-host traces of one job, see
/// [`combine`]), read from its files.
pub fn infer_trace(trace: &Path, opts: &Options) -> Result<JobModel, String> {
    let parts: Box<dyn Iterator<Item = Result<Part, String>>> =
        match open_trace_set(trace).map_err(|e| e.to_string())? {
            Some(members) => Box::new(members.into_iter().map(|m| {
                let (name, member) = (m.member.path.clone(), Some((m.member.host.clone(), m.member.shift_ns)));
                Ok(Part { input: load_member_input(m)?, name, member })
            })),
            None => Box::new(std::iter::once_with(|| {
                Ok(Part { input: load_input(trace)?, name: trace.to_path_buf(), member: None })
            })),
        };
    infer_parts(parts, opts)
}

/// One trace's rows (see [`InputBuilder`]), named for messages, and in a trace set its
/// member's host and the shift of its clock onto the set's.
pub struct Part {
    pub name: PathBuf,
    pub member: Option<(String, i64)>,
    pub input: Input,
}

/// The job model of a trace (one part, no member) or of a trace set (its members' parts
/// in member order), each part read only when the one before is modelled. Both entry
/// points come here: [`infer_trace`] with parts read from the files, the analyzer with
/// parts built from the batches it decoded.
pub fn infer_parts(parts: impl IntoIterator<Item = Result<Part, String>>, opts: &Options) -> Result<JobModel, String> {
    infer_as_recorded(parts, opts).and_then(|m| whatif::apply(m, opts))
}

fn infer_as_recorded(
    parts: impl IntoIterator<Item = Result<Part, String>>,
    opts: &Options,
) -> Result<JobModel, String> {
    let mut members = Vec::new();
    for part in parts {
        let part = part?;
        let model = infer(&part.input, opts).map_err(|e| format!("{}: {e}", part.name.display()))?;
        match part.member {
            None => return Ok(model),
            Some((host, shift_ns)) => members.push((host, shift_ns, model)),
        }
    }
    Ok(combine(members))
}

/// Infers the job model from rows (`load_input`).
pub fn infer(input: &Input, opts: &Options) -> Result<JobModel, String> {
    let mut warnings = Vec::new();
    // Reads through mmap are data reads like read syscalls (mapped.rs), and so are GETs
    // of objects (object_reads.rs). Asynchronous reads are timed by when the device saw
    // them (async_reads.rs).
    let mapped_reads = mapped::reads(&input.file, &input.proc_rows);
    let object_reads = object_reads::reads(&input.object);
    let paced = async_reads::paced_by_arrivals(&input.file, &input.arrivals, &mut warnings);
    let with_mapped;
    let input = if mapped_reads.is_empty() && object_reads.is_empty() && paced.is_none() {
        input
    } else {
        let file = paced.unwrap_or_else(|| input.file.clone());
        with_mapped = Input {
            file: file.into_iter().chain(mapped_reads).chain(object_reads).collect(),
            proc_rows: input.proc_rows.clone(),
            ipc: input.ipc.clone(),
            // Kept for the objects the job put (writes.rs).
            object: input.object.clone(),
            block_reads: input.block_reads.clone(),
            block_dev_reads: input.block_dev_reads.clone(),
            has_block: input.has_block,
            // Used above only.
            arrivals: Default::default(),
        };
        &with_mapped
    };
    let procs = Processes::new(input);
    let data = DataReads::new(input, opts, &procs);
    let groups = group(input, opts, &procs, &data, &mut warnings);
    let ix = ByPid::new(input, &data.rows, data.dev_blocks(input).unwrap_or(&input.block_reads));
    let file_rows: Vec<&_> = input.file.iter().collect();
    let object_rows: Vec<&_> = input.object.iter().collect();
    let (job_bursts, _) = writes::bursts_with_objects(&file_rows, &object_rows, &mut Vec::new());
    let job_writes: Vec<(i64, i64)> = job_bursts.iter().map(|b| (b.start_ns, b.end_ns)).collect();
    let job = JobEvidence { input, ix: &ix, opts, data: &data, job_writes: &job_writes };
    let gpus = gpu::gpus(&job, &procs, &groups, &mut warnings);
    let (coverage, incomplete) = coverage::coverage(&job, &procs, &gpus, &mut warnings);
    let mut left_out = groups.left_out;
    left_out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.pid.cmp(&b.pid)));

    let computes: Vec<f64> = gpus.iter().filter_map(|g| g.compute_s).collect();
    let compute_s = quantile(&computes, 0.5);
    let bps: Vec<f64> = gpus.iter().filter(|g| !g.steps.is_empty()).map(|g| g.bytes_per_step).collect();
    let bytes_per_step = quantile(&bps, 0.5);
    let reqs: Vec<f64> = gpus.iter().filter_map(|g| g.required_mib_s).collect();
    let steps = gpus.iter().map(|g| g.steps_taken as u64).sum();
    let object_store = ObjectSource::of(data.dev.as_deref(), &data.rows);
    Ok(JobModel {
        object_store,
        data_dev: data.dev,
        grouping: groups.desc,
        gpus,
        left_out,
        compute_s,
        bytes_per_step,
        required_mib_s_per_gpu: quantile(&reqs, 0.5),
        steps,
        coverage,
        incomplete,
        warnings,
        writes: writes::summarize(job_bursts),
        hosts: Vec::new(),
    })
}

#[cfg(test)]
mod tests;
