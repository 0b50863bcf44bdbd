//! Steps from the batch handoff (the model's part 2 with workers) and the rank's compute
//! intervals between its gets (part 3). A DataLoader worker reads a batch, then writes it
//! to its rank's pipe: a step is one batch, a worker's data reads between two of its
//! writes to the pipe. The rank takes a batch, then writes the next batch index to a
//! worker's index queue; from there to its next poll or read of the pipe it computes.

use std::collections::HashMap;

use trainio_schema::OwnedRow;

use crate::evidence::{distinct_files, opens_between, Files, GpuEvidence, StepsFound};
use crate::job::{Read, SetupRead, Step};
use crate::stats::{busy_ns, quantile};

/// Writes of one worker this close together are one message (header and payload).
const MESSAGE_MERGE_NS: i64 = 2_000_000;
/// A rank's reads of its data pipe this close together belong to one get.
const GET_MERGE_NS: i64 = 1_000_000;

/// The steps of a GPU whose workers hand their batches to the rank through a pipe the
/// trace sees (`ev.data_pipes` not empty).
pub(crate) fn steps(ev: &GpuEvidence, files: &mut Files, warnings: &mut Vec<String>) -> StepsFound {
    let GpuEvidence { index, rank, workers, .. } = *ev;
    let input = ev.job.input;
    let (data_pipes, opens) = (&ev.data_pipes, &ev.opens);
    let mut unfinished_bytes = 0u64;
    // Workers in the order they were started: PyTorch's worker ids. Batch b goes to
    // worker b mod W, so a worker's s-th batch is batch s*W + w.
    let fork_at: HashMap<u32, i64> =
        input.proc_rows.iter().filter(|r| &*r.op == "fork").map(|r| (r.pid, r.issue_ns)).collect();
    let mut order: Vec<usize> = (0..workers.len()).collect();
    order.sort_by_key(|&i| (fork_at.get(&workers[i]).copied().unwrap_or(i64::MAX), i));
    // Messages: each worker's writes on the pipe, merged when back to back.
    let mut per_worker_msgs: Vec<Vec<i64>> = vec![Vec::new(); workers.len()];
    for (wi, &w) in workers.iter().enumerate() {
        let mut ws: Vec<&OwnedRow> = ev
            .ipc_rows(w)
            .iter()
            .copied()
            .filter(|r| &*r.op == "write" && r.bytes > 0 && r.file.as_deref().is_some_and(|f| data_pipes.contains(f)))
            .collect();
        ws.sort_by_key(|r| r.issue_ns);
        let mut last_end = i64::MIN;
        for r in ws {
            if last_end != i64::MIN && r.issue_ns - last_end < MESSAGE_MERGE_NS {
                last_end = r.complete_ns;
                continue;
            }
            per_worker_msgs[wi].push(r.issue_ns);
            last_end = r.complete_ns;
        }
    }
    // A worker's batch: its data reads since its previous message.
    let mut per_worker: Vec<Vec<&OwnedRow>> = workers.iter().map(|&w| ev.data_rows(w).to_vec()).collect();
    for v in &mut per_worker {
        v.sort_by_key(|r| (r.issue_ns, r.complete_ns));
    }
    let nw = workers.len();
    let mut batches: Vec<(usize, Step)> = Vec::new();
    for (rank_of_worker, &wi) in order.iter().enumerate() {
        let list = &per_worker[wi];
        let mut cursor = 0usize;
        let mut prev = i64::MIN;
        let mut seq = 0usize;
        for &at in &per_worker_msgs[wi] {
            let mut reads = Vec::new();
            let mut first = i64::MAX;
            while cursor < list.len() && list[cursor].complete_ns <= at {
                let r = list[cursor];
                let mut rd = files.add(r);
                rd.reader = rank_of_worker as u32;
                first = first.min(r.issue_ns);
                reads.push(rd);
                cursor += 1;
            }
            let samples = opens_between(opens, &[workers[wi]], prev, at);
            prev = at;
            if reads.is_empty() {
                continue; // a message that carried no batch (a status, the end)
            }
            let bytes = reads.iter().map(|r| r.len).sum();
            let samples = if samples > 0 { samples } else { distinct_files(&reads) };
            let io = busy_ns(&list[cursor - reads.len()..cursor]);
            // Page faults are instants in the trace: a batch read through mmap has no
            // measured I/O time to tell its CPU time from.
            let faulted = reads.iter().any(|r| r.mapped);
            batches.push((
                seq * nw + rank_of_worker,
                Step {
                    reads,
                    bytes,
                    samples,
                    first_read_ns: first,
                    ready_ns: at,
                    interval_s: None,
                    wait_s: 0.0,
                    period_s: None,
                    worker_cpu_s: (!faulted).then(|| ((at - first) - io).max(0) as f64 / 1e9),
                },
            ));
            seq += 1;
        }
        unfinished_bytes += list[cursor..].iter().map(|r| r.bytes as u64).sum::<u64>();
    }
    batches.sort_by_key(|(b, s)| (*b, s.ready_ns));
    let mut steps: Vec<Step> = batches.into_iter().map(|(_, s)| s).collect();
    // The rank's own data reads (a rank that also reads) are not replayed: say so.
    let own: u64 = ev.data_rows(rank).iter().map(|r| r.bytes as u64).sum();
    if own > 0 {
        warnings.push(format!(
            "GPU {index} (pid {rank}): the rank's own {:.1} MiB of data reads are left out of its steps (its workers read the batches)",
            own as f64 / (1u64 << 20) as f64
        ));
    }
    let RankGets { windows, computes, waits, costs } = rank_gets(ev);
    // The median step that got a batch off the pipe: a step served from batches the
    // rank already held costs nothing here, its batch's unpickling was paid when it
    // was read; the windows at the loader's end hold several steps.
    let handoff_s = quantile(&costs, 0.5).unwrap_or(0.0);
    if computes.is_empty() {
        warnings.push(format!(
            "GPU {index} (pid {rank}): no batch index written to its workers after the first batch: compute time unknown"
        ));
    }
    for (k, step) in steps.iter_mut().enumerate() {
        step.interval_s = computes.get(k).copied();
        step.wait_s = waits.get(k).copied().unwrap_or(0.0);
    }
    StepsFound {
        steps,
        signal: "handoff",
        readers: nw,
        synchronous: false,
        intervals: Some(computes),
        windows,
        read_ahead: 2,
        handoff_s,
        unfinished_bytes,
    }
}

/// `madvise`/`posix_fadvise` advice WILLNEED (traces/SCHEMA.md, *mapped reads*).
const WILLNEED: u32 = 3;

/// The rank's own reads of its data files before its workers' first read, and its
/// readahead advice (WILLNEED) on files the GPU reads, in order (`GpuModel::setup`): a
/// dataset's loader reads the files' schema and index at load time (pyarrow through the
/// mapping, asking readahead of each range it reads), so the steps start with those
/// pages cached. The reads' files are added to `files`. Also the time from the setup's
/// first row to the first batch's first read (`GpuModel::setup_lead_s`).
pub(crate) fn setup(ev: &GpuEvidence, steps: &[Step], files: &mut Files) -> (Vec<SetupRead>, f64) {
    let Some(first) = steps.iter().map(|s| s.first_read_ns).min() else { return (Vec::new(), 0.0) };
    let mut rows: Vec<&OwnedRow> = ev
        .data_rows(ev.rank)
        .iter()
        .copied()
        .filter(|r| r.issue_ns < first && r.bytes > 0)
        .chain(ev.file_rows(ev.rank).iter().copied().filter(|r| {
            &*r.op == "madvise" && r.flags == WILLNEED && r.error == 0 && r.issue_ns < first && r.bytes_requested > 0
        }))
        .collect();
    rows.sort_by_key(|r| (r.issue_ns, r.complete_ns));
    let lead_s = rows.first().map_or(0.0, |r| (first - r.issue_ns) as f64 / 1e9);
    let mut out = Vec::new();
    for r in rows {
        if &*r.op != "madvise" {
            out.push(SetupRead { read: files.add(r), advise: false });
            continue;
        }
        // Advice on a file the GPU never reads does not shape its reads.
        let (Some(file), Some(offset)) = (files.get(r), r.offset) else { continue };
        let read = Read { file, offset: offset.max(0) as u64, len: r.bytes_requested as u64, reader: 0, mapped: false };
        out.push(SetupRead { read, advise: true });
    }
    (out, lead_s)
}

/// What the rank's gets say, per step between two of its index writes: its compute
/// window (`StepsFound::windows`), its compute, its wait on the pipe, and, for a step
/// that got a batch off the pipe, what taking it cost.
struct RankGets {
    windows: Vec<(i64, i64, i64)>,
    computes: Vec<f64>,
    waits: Vec<f64>,
    costs: Vec<f64>,
}

fn rank_gets(ev: &GpuEvidence) -> RankGets {
    let rank = ev.rank;
    let (data_pipes, index_pipes) = (&ev.data_pipes, &ev.index_pipes);
    let mut windows: Vec<(i64, i64, i64)> = Vec::new();
    // The rank's time outside getting data. It takes a batch, then writes the next
    // batch index to a worker's index queue: one write per step. From there to its
    // next poll or read of the worker pipe (or to the next index write, when the
    // batch came from the batches it already holds) it computes.
    let mut pipe_events: Vec<(i64, i64, bool)> = ev
        .ipc_rows(rank)
        .iter()
        .filter(|r| {
            r.file.as_deref().is_some_and(|f| data_pipes.contains(f))
                && (&*r.op == "wait" || (&*r.op == "read" && r.bytes > 0))
        })
        .map(|r| (r.issue_ns, r.complete_ns, &*r.op == "wait"))
        .collect();
    pipe_events.sort_unstable();
    let first_get = pipe_events.first().map(|e| e.0).unwrap_or(i64::MAX);
    let mut marks: Vec<i64> = ev
        .ipc_rows(rank)
        .iter()
        .filter(|r| &*r.op == "write" && r.bytes > 0 && r.file.as_deref().is_some_and(|f| index_pipes.contains(f)))
        .map(|r| r.issue_ns)
        .filter(|&t| t > first_get)
        .collect();
    marks.sort_unstable();
    // Index writes back to back (the loader's shutdown, one per worker) are one mark.
    marks.dedup_by(|b, a| *b - *a < GET_MERGE_NS);
    let mut computes = Vec::new();
    let mut waits = Vec::new();
    let mut costs = Vec::new();
    let mut prev_t = i64::MIN;
    for w in marks.windows(2) {
        let (t, next) = (w[0], w[1]);
        let k = pipe_events.partition_point(|e| e.0 <= t);
        let end = match pipe_events.get(k) {
            Some(e) if e.0 < next => e.0,
            _ => next,
        };
        // The get this index write followed: the handoff the compute starts after.
        let got = match k.checked_sub(1).map(|i| pipe_events[i].0) {
            Some(g) if g > prev_t => g,
            _ => t,
        };
        prev_t = t;
        windows.push((got, t, end));
        computes.push((end - t) as f64 / 1e9);
        let waited: i64 = pipe_events[k..].iter().take_while(|e| e.0 < next).filter(|e| e.2).map(|e| e.1 - e.0).sum();
        waits.push(waited as f64 / 1e9);
        if end < next {
            costs.push(((next - end) - waited).max(0) as f64 / 1e9);
        }
    }
    RankGets { windows, computes, waits, costs }
}
