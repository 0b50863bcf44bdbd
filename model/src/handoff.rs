//! Steps from the batch handoff (the model's part 2 with workers) and the rank's compute
//! intervals between its gets (part 3). A DataLoader worker gets a batch index from its
//! index queue, reads the batch, then puts it on its rank's pipe: a step is one batch, a
//! worker's data reads from its get of the batch's index to its next get. The put is
//! written by the worker's feeder thread, which can fall behind the worker's main thread
//! by a whole batch on a busy host, so the gets, not the writes, bound the batches; the
//! writes say when each batch was handed off (the k-th write, the k-th get's batch).
//! The rank takes a batch, then writes the next batch index to a worker's index queue;
//! from there to its next poll or read of the pipe it computes.

use std::collections::HashMap;

use trainio_schema::OwnedRow;

use crate::evidence::{opens_between, samples_without_opens, Files, GpuEvidence, StepsFound};
use crate::job::{Read, SetupRead, Step};
use crate::stats::{busy_ns, quantile};

/// A worker's write of a length prefix and its write of the payload this soon after it
/// are one message (multiprocessing writes a large message's 4-byte length, or -1 and an
/// 8-byte length, before the payload; a small one in one write).
const MESSAGE_MERGE_NS: i64 = 2_000_000;
/// The longest length prefix (bytes) of a multiprocessing message.
const LENGTH_PREFIX_BYTES: i64 = 8;
/// A rank's reads of its data pipe this close together belong to one get.
const GET_MERGE_NS: i64 = 1_000_000;

/// The steps of a GPU whose workers hand their batches to the rank through a pipe the
/// trace sees (`ev.data_pipes` not empty).
pub(crate) fn steps(ev: &GpuEvidence, files: &mut Files, warnings: &mut Vec<String>) -> StepsFound {
    let GpuEvidence { index, rank, workers, .. } = *ev;
    let input = ev.job.input;
    let opens = &ev.opens;
    let mut unfinished_bytes = 0u64;
    // Workers in the order they were started: PyTorch's worker ids. Batch b goes to
    // worker b mod W, so a worker's s-th batch is batch s*W + w.
    let fork_at: HashMap<u32, i64> =
        input.proc_rows.iter().filter(|r| &*r.op == "fork").map(|r| (r.pid, r.issue_ns)).collect();
    let mut order: Vec<usize> = (0..workers.len()).collect();
    order.sort_by_key(|&i| (fork_at.get(&workers[i]).copied().unwrap_or(i64::MAX), i));
    let nw = workers.len();
    let mut batches: Vec<(usize, Step)> = Vec::new();
    for (rank_of_worker, &wi) in order.iter().enumerate() {
        let w = workers[wi];
        let msgs = messages(ev, w);
        let gets = index_gets(ev, w);
        let mut list: Vec<&OwnedRow> = ev.data_rows(w).to_vec();
        list.sort_by_key(|r| (r.issue_ns, r.complete_ns));
        // Each batch: its reads (a range of `list`), when it was handed off, and when
        // the worker was done with it (its next get, or the handoff).
        let mut spans: Vec<(std::ops::Range<usize>, i64, i64)> = Vec::new();
        let mut cursor = 0usize;
        if gets.is_empty() {
            // No index queue in the trace: a batch is the reads done by its handoff.
            for &at in &msgs {
                let from = cursor;
                while cursor < list.len() && list[cursor].complete_ns <= at {
                    cursor += 1;
                }
                spans.push((from..cursor, at, at));
            }
        } else {
            // The j-th get's batch is handed off by the j-th message; reads before the
            // first get are the first batch's.
            for (j, &at) in msgs.iter().enumerate().take(gets.len()) {
                let next_get = gets.get(j + 1).copied().unwrap_or(i64::MAX);
                let from = cursor;
                while cursor < list.len() && list[cursor].issue_ns < next_get {
                    cursor += 1;
                }
                spans.push((from..cursor, at, at.min(next_get)));
            }
        }
        let mut seq = 0usize;
        let mut prev = i64::MIN;
        for (j, (range, at, done)) in spans.into_iter().enumerate() {
            let rows = &list[range];
            let bound = if gets.is_empty() { at } else { done };
            let opened = opens_between(opens, &[w], prev, bound);
            prev = bound;
            if rows.is_empty() {
                continue; // a message that carried no batch (a status, the end)
            }
            let mut reads: Vec<Read> =
                rows.iter().map(|r| Read { reader: rank_of_worker as u32, ..files.add(r) }).collect();
            let first = rows.iter().map(|r| r.issue_ns).min().unwrap_or(at);
            let bytes = reads.iter().map(|r| r.len).sum();
            let samples = if opened > 0 { opened } else { samples_without_opens(&reads) };
            let io = busy_ns(rows);
            // Page faults are instants in the trace: a batch read through mmap has no
            // measured I/O time to tell its CPU time from.
            let faulted = reads.iter().any(|r| r.mapped);
            let cpu_ns = ((done - first) - io).max(0);
            if !faulted {
                for (read, after) in reads.iter_mut().zip(cpu_after_reads(rows, done, cpu_ns)) {
                    read.cpu_after_ns = after;
                }
            }
            // The worker's j-th get is its j-th batch; without gets, its j-th batch is
            // its j-th message that carried reads.
            let nth = if gets.is_empty() { seq } else { j };
            batches.push((
                nth * nw + rank_of_worker,
                Step {
                    reads,
                    bytes,
                    samples,
                    first_read_ns: first,
                    ready_ns: at,
                    interval_s: None,
                    wait_s: 0.0,
                    period_s: None,
                    worker_cpu_s: (!faulted).then(|| cpu_ns as f64 / 1e9),
                    taken: true,
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
    // The workers read ahead; a job that stops before its sampler ends (a step count)
    // leaves the batches they had read unread by the GPU. It takes batches in order.
    if let Some(took) = rank_takes(ev) {
        for step in steps.iter_mut().skip(took.len()) {
            step.taken = false;
        }
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

/// A worker's time after each read of a batch (`Read::cpu_after_ns`), `rows` sorted by
/// issue: from the read's end (the latest end so far; overlapping reads leave no gap) to
/// the next read's start, and from the last read's end to `done`. The worker spends its
/// time where it falls (a JPEG loader decodes after its first read, importing PIL's
/// plugins, then reads the rest of the batch back to back), so the replay spends it
/// there too, not spread evenly. The gaps sum to the batch's `cpu_ns` (its first read to
/// `done`, less its reads' busy time); when reads end after `done` (a next get issued
/// before a read's end), the excess comes off the last gaps.
fn cpu_after_reads(rows: &[&OwnedRow], done: i64, cpu_ns: i64) -> Vec<u64> {
    let mut end = i64::MIN;
    let mut gaps: Vec<i64> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            end = end.max(r.complete_ns);
            let next = rows.get(i + 1).map_or(done, |n| n.issue_ns);
            (next - end).max(0)
        })
        .collect();
    let mut excess = gaps.iter().sum::<i64>() - cpu_ns;
    for g in gaps.iter_mut().rev() {
        if excess <= 0 {
            break;
        }
        let cut = excess.min(*g);
        *g -= cut;
        excess -= cut;
    }
    gaps.into_iter().map(|g| g as u64).collect()
}

/// When worker `w` handed off its batches: its writes on the GPU's data pipe, a length
/// prefix and the payload written right after it being one message.
fn messages(ev: &GpuEvidence, w: u32) -> Vec<i64> {
    let mut ws: Vec<&OwnedRow> = ev
        .ipc_rows(w)
        .iter()
        .copied()
        .filter(|r| &*r.op == "write" && r.bytes > 0 && r.file.as_deref().is_some_and(|f| ev.data_pipes.contains(f)))
        .collect();
    ws.sort_by_key(|r| r.issue_ns);
    let mut msgs = Vec::new();
    let mut prev: Option<&OwnedRow> = None;
    for r in ws {
        let continues =
            prev.is_some_and(|p| p.bytes <= LENGTH_PREFIX_BYTES && r.issue_ns - p.complete_ns < MESSAGE_MERGE_NS);
        if !continues {
            msgs.push(r.issue_ns);
        }
        prev = Some(r);
    }
    msgs
}

/// When worker `w` got each batch index from its index queue (one of the GPU's index
/// pipes): the start of each get, its polls included, a get ending with the read of a
/// message's payload (a read longer than a length prefix). Empty when the trace has
/// none of the worker's reads of an index pipe.
fn index_gets(ev: &GpuEvidence, w: u32) -> Vec<i64> {
    let mut rows: Vec<&OwnedRow> = ev
        .ipc_rows(w)
        .iter()
        .copied()
        .filter(|r| {
            r.file.as_deref().is_some_and(|f| ev.index_pipes.contains(f))
                && (&*r.op == "wait" || (&*r.op == "read" && r.bytes > 0))
        })
        .collect();
    rows.sort_by_key(|r| (r.issue_ns, r.complete_ns));
    let mut gets = Vec::new();
    let mut started: Option<i64> = None;
    for r in rows {
        let start = *started.get_or_insert(r.issue_ns);
        if &*r.op == "read" && r.bytes > LENGTH_PREFIX_BYTES {
            gets.push(start);
            started = None;
        }
    }
    gets
}

/// When the rank took each batch off its workers' pipes, in time order: the first read
/// of each message it read there that carries a payload (a read longer than a length
/// prefix after the prefix's own read; a payload read in several reads is one message).
/// Its length is the number of batches the GPU took. None when the trace has none of the
/// rank's reads of a data pipe.
pub(crate) fn rank_takes(ev: &GpuEvidence) -> Option<Vec<i64>> {
    let mut reads: Vec<(&str, i64, i64)> = ev
        .ipc_rows(ev.rank)
        .iter()
        .filter(|r| &*r.op == "read" && r.bytes > 0)
        .filter_map(|r| r.file.as_deref().filter(|f| ev.data_pipes.contains(*f)).map(|f| (f, r.issue_ns, r.bytes)))
        .collect();
    if reads.is_empty() {
        return None;
    }
    reads.sort_unstable();
    let mut took = Vec::new();
    let mut in_payload = false;
    let mut pipe = "";
    // The message's first read: its length prefix, or the payload read alone.
    let mut message_at = i64::MIN;
    for (f, at, bytes) in reads {
        if f != pipe {
            (pipe, in_payload) = (f, false);
        }
        let payload = bytes > LENGTH_PREFIX_BYTES;
        if !in_payload && !payload {
            message_at = at;
        }
        if payload && !in_payload {
            took.push(if message_at > i64::MIN { message_at } else { at });
            message_at = i64::MIN;
        }
        in_payload = payload;
    }
    took.sort_unstable();
    Some(took)
}

/// The rank's calls for its next batch, counted from its takes off the data pipes
/// ([`rank_takes`]) and its compute per step. A DataLoader returns batches in order: a
/// batch that comes off the pipe before an earlier one (another worker was quicker) is
/// kept, and the call that needs it later returns it without reading. So one call can
/// take several batches (takes closer together than half a step's compute: no step lies
/// between them), and after it the rank makes one call per step's compute that reads
/// nothing, while any batch is kept.
pub(crate) struct Calls {
    /// Takes in one call each: (first, last, how many).
    calls: Vec<(i64, i64, u64)>,
    compute_ns: i64,
}

impl Calls {
    /// `took` in time order; `compute_ns` 0 when the GPU's compute is not known: every
    /// take is then a call of its own.
    pub(crate) fn new(took: &[i64], compute_ns: i64) -> Calls {
        let mut calls: Vec<(i64, i64, u64)> = Vec::new();
        for &t in took {
            match calls.last_mut() {
                Some(c) if compute_ns > 0 && t - c.1 < compute_ns / 2 => (c.1, c.2) = (t, c.2 + 1),
                _ => calls.push((t, t, 1)),
            }
        }
        Calls { calls, compute_ns }
    }

    /// The calls the rank had made by `t`: the steps it had begun.
    pub(crate) fn by(&self, t: i64) -> u64 {
        let (mut made, mut kept) = (0u64, 0u64);
        for (i, &(first, last, takes)) in self.calls.iter().enumerate() {
            if first > t {
                break;
            }
            made += 1;
            kept += takes - 1;
            if kept == 0 {
                continue;
            }
            // Calls that read nothing, after this call's own step: one per compute up to the
            // next call that read (whole computes in the gap), or up to `t`.
            let c = self.compute_ns as f64;
            let computes = match self.calls.get(i + 1) {
                Some(&(next, _, _)) if next <= t => ((next - last) as f64 / c).round(),
                _ => ((t - last) as f64 / c).floor(),
            } as i64
                - 1;
            let unread = (computes.max(0) as u64).min(kept);
            made += unread;
            kept -= unread;
        }
        made
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
        let read = Read {
            file,
            offset: offset.max(0) as u64,
            len: r.bytes_requested as u64,
            reader: 0,
            mapped: false,
            cpu_after_ns: 0,
        };
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
