//! One GPU of the job model from its evidence: its steps (handoff.rs or bursts.rs),
//! samples recounted from streamed tar shards (shards.rs), its compute (compute.rs), and
//! the throughput one GPU needs (the model's part 4): bytes per step / compute per step.

use std::collections::HashMap;

use trainio_schema::OwnedRow;

use crate::compute::{compute, Compute};
use crate::evidence::{Files, GpuEvidence, JobEvidence, StepsFound};
use crate::grouping::{Groups, Processes};
use crate::input::rows_of;
use crate::job::{GpuModel, Member};
use crate::stats::quantile;
use crate::{bursts, handoff, object_reads, shards, writes};

/// The GPUs of `groups`, numbered in the order of their ranks' pids.
pub(crate) fn gpus(job: &JobEvidence, procs: &Processes, groups: &Groups, warnings: &mut Vec<String>) -> Vec<GpuModel> {
    let mut gpus = Vec::new();
    for (rank, ws) in &groups.gpus {
        // Workers in the order of their first data read.
        let mut ws = ws.clone();
        let first_read: HashMap<u32, i64> =
            job.data.rows.iter().filter(|r| ws.contains(&r.pid)).fold(HashMap::new(), |mut m, r| {
                let e = m.entry(r.pid).or_insert(i64::MAX);
                *e = (*e).min(r.issue_ns);
                m
            });
        ws.sort_by_key(|w| (first_read.get(w).copied().unwrap_or(i64::MAX), *w));
        let members = members(job, procs, groups, *rank, &ws);
        let ev = GpuEvidence::new(job, gpus.len(), *rank, &ws);
        let mut gpu = build_gpu(&ev, members, warnings);
        place_writes(&ev, &mut gpu, warnings);
        gpus.push(gpu);
    }
    gpus
}

/// The GPU's processes: its rank, then its workers.
fn members(job: &JobEvidence, procs: &Processes, groups: &Groups, rank: u32, workers: &[u32]) -> Vec<Member> {
    let (reader_bytes, reader_comm) = (&job.data.bytes, &job.data.comm);
    let mut members = vec![Member {
        pid: rank,
        comm: procs.comm_of(rank, reader_comm.get(&rank).map(String::as_str).unwrap_or("?")),
        role: "rank",
        why: String::new(),
        bytes: reader_bytes.get(&rank).copied().unwrap_or(0),
    }];
    for w in workers {
        members.push(Member {
            pid: *w,
            comm: procs.comm_of(*w, &reader_comm[w]),
            role: "worker",
            why: groups.worker_of.get(w).map(|x| x.1.clone()).unwrap_or_default(),
            bytes: reader_bytes[w],
        });
    }
    members
}

/// The rank's own writes: they stand between its steps (a checkpoint). Its workers
/// write beside the GPU, not between its steps; they count in the job's bursts. Only
/// writes on the data's device are the GPU's: a results file or a log on another file
/// system is no load on the storage the replay tests. Likewise the objects the rank put
/// (writes.rs) are the GPU's when its data are objects of the same store (endpoint).
fn place_writes(ev: &GpuEvidence, gpu: &mut GpuModel, warnings: &mut Vec<String>) {
    let job = ev.job;
    let rank = gpu.rank_pid;
    let (own, elsewhere): (Vec<&OwnedRow>, Vec<&OwnedRow>) = rows_of(&job.ix.file, rank)
        .iter()
        .copied()
        .filter(|r| writes::is_write_row(r))
        .partition(|r| job.data.on_dev(r));
    if !elsewhere.is_empty() {
        let bytes: u64 = elsewhere.iter().filter(|r| &*r.op == "write").map(|r| r.bytes as u64).sum();
        let mut devs: Vec<&str> = elsewhere.iter().filter_map(|r| r.dev.as_deref()).collect();
        devs.sort_unstable();
        devs.dedup();
        warnings.push(format!(
            "GPU {} (pid {rank}): {} writes and syncs ({bytes} bytes) on other devices than the data's ({}) are not the GPU's: {}",
            gpu.index,
            elsewhere.len(),
            job.data.dev.as_deref().unwrap_or("?"),
            devs.join(", ")
        ));
    }
    let store = job.data.dev.as_deref().and_then(object_reads::store_of).map(|(endpoint, _)| endpoint);
    let (objects, other_store): (Vec<&OwnedRow>, Vec<&OwnedRow>) = job
        .input
        .object
        .iter()
        .filter(|r| r.pid == rank && matches!(&*r.op, "put" | "post" | "delete"))
        .partition(|r| r.object.as_ref().is_some_and(|o| Some(&*o.endpoint) == store));
    let puts: Vec<&&OwnedRow> = other_store.iter().filter(|r| &*r.op == "put").collect();
    if !puts.is_empty() {
        let bytes: u64 = puts.iter().map(|r| r.bytes.max(0) as u64).sum();
        let mut eps: Vec<&str> = other_store.iter().filter_map(|r| r.object.as_ref().map(|o| &*o.endpoint)).collect();
        eps.sort_unstable();
        eps.dedup();
        warnings.push(format!(
            "GPU {} (pid {rank}): {} PUTs ({bytes} bytes) to other stores than the data's ({}) are not the GPU's: {}",
            gpu.index,
            puts.len(),
            job.data.dev.as_deref().unwrap_or("?"),
            eps.join(", ")
        ));
    }
    let (bursts, left_out) = writes::bursts_with_objects(&own, &objects, &mut gpu.write_files);
    if left_out > 0 {
        warnings.push(format!(
            "GPU {} (pid {rank}): {left_out} multipart upload(s) not completed in the trace (aborted, or open when the recording ended) put no object: not replayed",
            gpu.index
        ));
    }
    gpu.write_bursts = bursts;
    let calls = calls(ev, gpu);
    writes::place(&mut gpu.write_bursts, |t| calls.by(t));
}

/// The rank's calls for its batches, which place its writes between its steps. With
/// workers, from its takes off the data pipes (handoff::rank_takes, handoff::Calls): a
/// batch is handed off (`ready_ns`) up to 2 × workers batches before the rank takes it,
/// and waits in the pipe while the rank computes or saves. Without workers (or without
/// those reads in the trace), the steps' `ready_ns`, one call each.
fn calls(ev: &GpuEvidence, gpu: &GpuModel) -> handoff::Calls {
    match handoff::rank_takes(ev) {
        Some(took) if !ev.data_pipes.is_empty() && !took.is_empty() => {
            handoff::Calls::new(&took, gpu.compute_s.map_or(0, |c| (c * 1e9) as i64))
        }
        _ => handoff::Calls::new(&gpu.steps.iter().map(|s| s.ready_ns).collect::<Vec<_>>(), 0),
    }
}

/// The GPU of `ev`, its processes `members` (the rank first).
fn build_gpu(ev: &GpuEvidence, members: Vec<Member>, warnings: &mut Vec<String>) -> GpuModel {
    let GpuEvidence { index, rank, workers, .. } = *ev;
    let comm = members[0].comm.clone();
    let mut files = Files::new();
    let mut found = if !ev.data_pipes.is_empty() {
        handoff::steps(ev, &mut files, warnings)
    } else {
        bursts::steps(ev, &mut files, warnings)
    };
    // A rank with workers: what it read itself before their first batch (handoff::setup).
    let (setup, setup_lead_s) =
        if ev.data_pipes.is_empty() { (Vec::new(), 0.0) } else { handoff::setup(ev, &found.steps, &mut files) };
    // Streamed tar shards: a step's samples from the members its reads completed.
    let (shards, unreadable) = shards::recount(&mut found.steps, &files.list);
    if shards > 0 {
        warnings.push(format!(
            "GPU {index} (pid {rank}): samples per step counted from the members of {shards} tar shard(s) its steps streamed"
        ));
    }
    if !unreadable.is_empty() {
        warnings.push(format!(
            "GPU {index} (pid {rank}): {} tar shard(s) cannot be read here (e.g. {}): their samples per step are counted from opens",
            unreadable.len(),
            unreadable[0]
        ));
    }
    for f in &mut files.list {
        f.1 = f.1.max(1).div_ceil(4096) * 4096;
    }
    let Compute { compute_s, sync_s, signal: compute_signal, intervals, paced } = compute(ev, &found);
    let StepsFound {
        steps, signal: step_signal, readers, synchronous, read_ahead, handoff_s, unfinished_bytes, ..
    } = found;
    // The batches the GPU took come first (handoff::steps marks the rest); what a step
    // costs and needs is over those, while every batch's reads count in the bytes.
    let steps_taken = steps.iter().take_while(|s| s.taken).count();
    let taken = &steps[..steps_taken];
    let bytes: u64 = steps.iter().map(|s| s.bytes).sum();
    let taken_bytes: u64 = taken.iter().map(|s| s.bytes).sum();
    let samples: u64 = taken.iter().map(|s| s.samples as u64).sum();
    let n = taken.len().max(1) as f64;
    let per_sample: Vec<f64> =
        steps.iter().filter(|s| s.samples > 0).filter_map(|s| Some(s.worker_cpu_s? / s.samples as f64)).collect();
    let cpu_share: Vec<f64> = steps
        .iter()
        .filter(|s| s.ready_ns > s.first_read_ns)
        .filter_map(|s| Some(s.worker_cpu_s? / ((s.ready_ns - s.first_read_ns) as f64 / 1e9)))
        .collect();
    let bytes_per_step = taken_bytes as f64 / n;
    let required_mib_s = compute_s.filter(|&c| c > 0.0).map(|c| bytes_per_step / c / (1u64 << 20) as f64);
    // The job's run: from its first batch's first read to the last taken batch's compute.
    let (au_recorded, mib_s_recorded) = match (taken.first(), taken.last(), compute_s) {
        (Some(a), Some(b), Some(c)) if taken.len() >= 2 => {
            let span = (b.ready_ns - a.ready_ns) as f64 / 1e9 + c;
            let whole = (b.ready_ns - a.first_read_ns) as f64 / 1e9 + c;
            (
                (span > 0.0).then(|| ((taken.len() - 1) as f64 * c / span).min(1.0)),
                (whole > 0.0).then(|| bytes as f64 / whole / (1u64 << 20) as f64),
            )
        }
        _ => (None, None),
    };
    GpuModel {
        index,
        host: None,
        rank_pid: rank,
        comm,
        workers: workers.len(),
        members,
        readers,
        synchronous,
        paced,
        prefetch_batches: if !workers.is_empty() && step_signal == "handoff" {
            2 * workers.len()
        } else if paced {
            read_ahead
        } else {
            1
        },
        step_signal,
        files: files.list,
        bytes,
        samples,
        compute_s,
        interval_p50_s: quantile(&intervals, 0.5),
        interval_p90_s: quantile(&intervals, 0.9),
        wait_s: steps.iter().map(|s| s.wait_s).sum(),
        handoff_s,
        compute_signal,
        sync_s,
        bytes_per_step,
        samples_per_step: samples as f64 / n,
        required_mib_s,
        au_recorded,
        mib_s_recorded,
        worker_cpu_s_per_sample: quantile(&per_sample, 0.5),
        worker_cpu_share: quantile(&cpu_share, 0.5),
        unfinished_bytes,
        steps_taken,
        untaken_bytes: bytes - taken_bytes,
        setup,
        setup_lead_s,
        steps,
        write_bursts: Vec::new(),
        write_files: Vec::new(),
    }
}
