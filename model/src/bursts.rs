//! Steps as bursts of reads (the model's part 2 without workers, or when their handoff is
//! not in the trace). A step is a burst of reads on the GPU's data files: bursts are
//! separated by gaps longer than every gap inside a batch (the largest jump in the sorted
//! gaps, or `--burst-gap-ms`). A rank that reads inline computes in the gaps; loader
//! threads that read ahead set the pace, and their bursts are regrouped into batches.

use std::collections::{HashMap, HashSet};

use trainio_schema::OwnedRow;

use crate::async_reads;
use crate::evidence::{samples_without_opens, Files, GpuEvidence, StepsFound};
use crate::input::is_data_read;
use crate::job::Step;
use crate::stats::quantile;
use crate::writes;

/// Gaps shorter than this are inside a batch whatever the distribution says.
const MIN_STEP_GAP_NS: i64 = 500_000;
/// The largest gap jump must be at least this ratio to separate batches from their insides.
const MIN_GAP_RATIO: f64 = 3.0;
/// Default step gap when the gaps show no clear jump.
pub const DEFAULT_BURST_GAP_MS: f64 = 10.0;

/// The steps of a GPU whose batches are not handed over a pipe the trace sees.
pub(crate) fn steps(ev: &GpuEvidence, files: &mut Files, warnings: &mut Vec<String>) -> StepsFound {
    let GpuEvidence { index, rank, workers, .. } = *ev;
    let pids = &ev.pids;
    let mut steps: Vec<Step> = Vec::new();
    let mut windows: Vec<(i64, i64, i64)> = Vec::new();
    let mut read_ahead = 2usize;
    let mut intervals: Option<Vec<f64>> = None;
    if !workers.is_empty() {
        warnings.push(format!(
            "GPU {index} (pid {rank}): its workers' batch handoff is not in the trace (no ipc layer): steps are bursts of reads, which merge or split batches when workers read ahead"
        ));
    }
    let Activity { act, write_spans, gap_ns } = activity(ev, warnings);
    let wrote_in = |from: i64, to: i64| write_spans.iter().any(|&(s, e)| s < to && e > from);
    let mut streams =
        async_reads::Streams::new(async_reads::async_tids(act.iter().copied().filter(|r| is_data_read(r))));
    let mut busy = i64::MIN;
    let mut cur: Option<Step> = None;
    // Per read of the current burst, and per finished burst: (issue, complete) ns.
    let mut cur_times: Vec<(i64, i64)> = Vec::new();
    let mut step_times: Vec<Vec<(i64, i64)>> = Vec::new();
    let mut open_count = 0u32;
    // Per burst: time inside read syscalls (their union), to tell I/O from the
    // loader's own CPU time in the burst.
    let mut io_ns = 0i64;
    let mut io_end = i64::MIN;
    let mut cpu: Vec<f64> = Vec::new();
    let close_burst = |s: &Step, io: i64, cpu: &mut Vec<f64>| {
        if !s.reads.is_empty() {
            cpu.push(((s.ready_ns - s.first_read_ns) - io).max(0) as f64 / 1e9);
        }
    };
    for r in &act {
        if busy != i64::MIN && (r.issue_ns - busy >= gap_ns || r.issue_ns > busy && wrote_in(busy, r.issue_ns)) {
            if let Some(mut s) = cur.take() {
                s.interval_s = Some((r.issue_ns - busy) as f64 / 1e9);
                close_burst(&s, io_ns, &mut cpu);
                if finish_burst(&mut s, open_count, &mut steps) {
                    step_times.push(std::mem::take(&mut cur_times));
                }
                cur_times.clear();
            }
            open_count = 0;
            io_ns = 0;
            io_end = i64::MIN;
        }
        if &*r.op == "read" {
            let from = r.issue_ns.max(io_end);
            if r.complete_ns > from {
                io_ns += r.complete_ns - from;
            }
            io_end = io_end.max(r.complete_ns);
        }
        busy = busy.max(r.complete_ns);
        let s = cur.get_or_insert_with(|| Step {
            reads: Vec::new(),
            bytes: 0,
            samples: 0,
            first_read_ns: r.issue_ns,
            ready_ns: r.complete_ns,
            interval_s: None,
            wait_s: 0.0,
            period_s: None,
            worker_cpu_s: None,
            taken: true,
        });
        s.ready_ns = s.ready_ns.max(r.complete_ns);
        match &*r.op {
            "open" if r.error == 0 => open_count += 1,
            "read" if is_data_read(r) => {
                let stream = streams.of(r);
                let mut rd = files.add(r);
                rd.reader = stream;
                s.reads.push(rd);
                s.bytes += rd.len;
                cur_times.push((r.issue_ns, r.complete_ns));
            }
            _ => {}
        }
    }
    if let Some(mut s) = cur.take() {
        close_burst(&s, io_ns, &mut cpu);
        if finish_burst(&mut s, open_count, &mut steps) {
            step_times.push(std::mem::take(&mut cur_times));
        }
    }
    let mut handoff = if cpu.is_empty() { 0.0 } else { cpu.iter().sum::<f64>() / cpu.len() as f64 };
    for s in &mut steps {
        s.wait_s = (s.ready_ns - s.first_read_ns).max(0) as f64 / 1e9;
    }
    let readers = streams.count().max(1);
    // The thread that computes is the process's main thread: if it read every batch
    // itself with read syscalls, the job read, then computed. Otherwise other threads
    // read ahead, or its own requests (io_uring) were in flight while it computed.
    let inline = pids.iter().flat_map(|&p| ev.data_rows(p)).all(|r| r.tid == r.pid);
    let synchronous = workers.is_empty() && inline && !streams.any_async();
    if streams.any_async() {
        warnings.push(format!(
            "GPU {index} (pid {rank}): its reads were asynchronous (several in flight from one thread: io_uring): replayed on {readers} streams, as many as it kept in flight"
        ));
    }
    if synchronous {
        for w in steps.windows(2) {
            if w[0].interval_s.is_some() {
                windows.push((w[0].ready_ns, w[0].ready_ns, w[1].first_read_ns));
            }
        }
    }
    if !synchronous {
        let starts: Vec<i64> = steps.iter().map(|s| s.first_read_ns).collect();
        let periods: Vec<f64> = starts.windows(2).map(|w| (w[1] - w[0]) as f64 / 1e9).collect();
        let median = quantile(&periods, 0.5);
        for (k, st) in steps.iter_mut().enumerate() {
            st.period_s = periods.get(k).copied().or(median);
        }
        let (regrouped, split, joined, deepest) = regroup_bursts(std::mem::take(&mut steps), &step_times);
        steps = regrouped;
        // A fill of k batches read back to back: the replay's loader may read as far ahead
        // (each batch still starts no earlier than its recorded time).
        read_ahead = read_ahead.max(deepest);
        if split > 0 {
            warnings.push(format!(
                "GPU {index} (pid {rank}): {split} burst(s) held several whole batches read back to back (the loader filling its prefetch queue): each split into its batches"
            ));
        }
        if joined > 0 {
            warnings.push(format!(
                "GPU {index} (pid {rank}): {joined} batch(es) spread over several bursts (a read stalled past the step gap): each joined into one step"
            ));
        }
        intervals = Some(steps.iter().filter_map(|s| s.period_s).collect());
        handoff = 0.0;
    }
    StepsFound {
        steps,
        signal: "bursts",
        readers,
        synchronous,
        intervals,
        windows,
        read_ahead,
        handoff_s: handoff,
        unfinished_bytes: 0,
    }
}

/// The GPU's activity on its data files (reads, opens, closes) in time order, the
/// spans of the rank's write bursts, and the step gap that splits the activity.
struct Activity<'a> {
    act: Vec<&'a OwnedRow>,
    write_spans: Vec<(i64, i64)>,
    gap_ns: i64,
}

fn activity<'a>(ev: &GpuEvidence<'a>, warnings: &mut Vec<String>) -> Activity<'a> {
    let (index, rank) = (ev.index, ev.rank);
    // Activity on data files of the group: reads, opens, closes.
    let mut act: Vec<&'a OwnedRow> = ev
        .pids
        .iter()
        .flat_map(|&p| ev.file_rows(p))
        .copied()
        .filter(|r| {
            is_data_read(r) && ev.job.data.on_dev(r) || matches!(&*r.op, "open" | "close") && ev.is_data_file(r)
        })
        .collect();
    act.sort_by_key(|r| (r.issue_ns, r.complete_ns));
    // A gap in which the rank wrote a burst (a checkpoint saved between two steps)
    // separates steps whatever its length. Gaps in which any process of the job
    // wrote are left out of the gaps that set the step gap: a checkpoint's pause, or
    // a rank waiting at a collective for another rank's checkpoint, would otherwise
    // look like the gap between batches, and the compute gaps like gaps inside one.
    let write_spans: Vec<(i64, i64)> =
        writes::bursts(ev.file_rows(rank), &mut Vec::new()).iter().map(|b| (b.start_ns, b.end_ns)).collect();
    let wrote_in = |from: i64, to: i64| write_spans.iter().any(|&(s, e)| s < to && e > from);
    let job_wrote_in = |from: i64, to: i64| ev.job.job_writes.iter().any(|&(s, e)| s < to && e > from);
    let mut gaps = Vec::new();
    let mut busy = i64::MIN;
    for r in &act {
        if busy != i64::MIN && r.issue_ns > busy && !wrote_in(busy, r.issue_ns) && !job_wrote_in(busy, r.issue_ns) {
            gaps.push(r.issue_ns - busy);
        }
        busy = busy.max(r.complete_ns);
    }
    let gap_ns = match ev.job.opts.burst_gap_ms {
        Some(ms) => (ms * 1e6) as i64,
        None => {
            let (g, found) = step_gap_ns(&gaps);
            if !found && gaps.len() > 1 {
                warnings.push(format!(
                    "GPU {index} (pid {rank}): no clear gap between batches; steps split at {DEFAULT_BURST_GAP_MS} ms idle gaps"
                ));
            }
            g
        }
    };
    Activity { act, write_spans, gap_ns }
}

/// The step gap: the geometric middle of the largest jump between sorted gaps (at least
/// MIN_GAP_RATIO, above MIN_STEP_GAP_NS), else the default.
pub fn step_gap_ns(gaps: &[i64]) -> (i64, bool) {
    let mut g: Vec<i64> = gaps.iter().copied().filter(|&x| x > 0).collect();
    g.sort_unstable();
    let mut best: Option<(f64, i64)> = None;
    for w in g.windows(2) {
        if w[1] < MIN_STEP_GAP_NS {
            continue;
        }
        let lo = w[0].max(1) as f64;
        let ratio = w[1] as f64 / lo;
        if ratio >= MIN_GAP_RATIO && best.is_none_or(|(r, _)| ratio > r) {
            best = Some((ratio, ((lo * w[1] as f64).sqrt() as i64).max(MIN_STEP_GAP_NS)));
        }
    }
    match best {
        Some((_, t)) => (t, true),
        None => ((DEFAULT_BURST_GAP_MS * 1e6) as i64, false),
    }
}

/// Pushes a finished burst onto `steps`; false for a burst without data reads.
fn finish_burst(s: &mut Step, opens: u32, steps: &mut Vec<Step>) -> bool {
    if s.reads.is_empty() {
        return false; // opens and closes only: no data read
    }
    s.samples = if opens > 0 { opens } else { samples_without_opens(&s.reads) };
    steps.push(std::mem::replace(
        s,
        Step {
            reads: Vec::new(),
            bytes: 0,
            samples: 0,
            first_read_ns: 0,
            ready_ns: 0,
            interval_s: None,
            wait_s: 0.0,
            period_s: None,
            worker_cpu_s: None,
            taken: true,
        },
    ));
    true
}

/// Loader threads that read ahead fill their prefetch queue at an epoch's start (and catch
/// up after a stall) with several batches read back to back: one burst that holds k whole
/// batches. A burst that read k (≥ 2) times as many files as the modal burst's B is split
/// into k steps of B files each (in the order of their first read), each starting at its
/// first read; the burst's recorded period is shared evenly between them, so the replay
/// keeps the recorded pace and the step period stays the compute time. Files, not opens,
/// count here: a thread reading ahead opens its next sample in one burst and reads it in
/// the next. Conversely, consecutive bursts that together read B files (a batch whose last
/// read stalled past the step gap) are one step. Returns the steps, how many bursts were
/// split, how many steps were joined from several bursts, and the most batches one burst
/// held.
/// `times`: per step, the (issue, complete) ns of each of its reads.
fn regroup_bursts(steps: Vec<Step>, times: &[Vec<(i64, i64)>]) -> (Vec<Step>, usize, usize, usize) {
    // A step's files in the order of their first read (a burst of a storage-bound loader
    // can hold every file of the run: no quadratic search).
    let files_of = |s: &Step| {
        let mut seen: HashSet<u32> = HashSet::new();
        s.reads.iter().map(|r| r.file).filter(|&f| seen.insert(f)).collect::<Vec<u32>>()
    };
    let mut counts: HashMap<usize, usize> = HashMap::new();
    for s in &steps {
        *counts.entry(files_of(s).len()).or_default() += 1;
    }
    // The modal batch: the most common count of files read (the smaller on a tie), at least 2,
    // seen in at least half the bursts and at least 3 times.
    let Some((batch, seen)) = counts.iter().map(|(&b, &n)| (b, n)).max_by_key(|&(b, n)| (n, std::cmp::Reverse(b)))
    else {
        return (steps, 0, 0, 1);
    };
    if batch < 2 || seen < 3 || seen * 2 < steps.len() || times.len() != steps.len() {
        return (steps, 0, 0, 1);
    }
    let mut out = Vec::with_capacity(steps.len());
    let (mut split, mut joined, mut deepest) = (0, 0, 1);
    for (s, t) in steps.into_iter().zip(times) {
        let order = files_of(&s);
        let k = order.len() / batch;
        if k < 2 || order.len() % batch != 0 || t.len() != s.reads.len() {
            out.push(s);
            continue;
        }
        split += 1;
        deepest = deepest.max(k);
        // Samples: one per file when the burst counted one per file, else shared evenly.
        let samples = |i: usize| {
            if s.samples as usize == order.len() {
                batch as u32
            } else {
                s.samples / k as u32 + u32::from(i < s.samples as usize % k)
            }
        };
        let mut parts: Vec<Step> = (0..k)
            .map(|i| Step {
                reads: Vec::new(),
                bytes: 0,
                samples: samples(i),
                first_read_ns: i64::MAX,
                ready_ns: i64::MIN,
                interval_s: None,
                wait_s: 0.0,
                period_s: s.period_s.map(|p| p / k as f64),
                worker_cpu_s: None,
                taken: true,
            })
            .collect();
        let position: HashMap<u32, usize> = order.iter().enumerate().map(|(i, &f)| (f, i)).collect();
        for (r, &(issue, done)) in s.reads.iter().zip(t) {
            let part = &mut parts[position[&r.file] / batch];
            part.reads.push(*r);
            part.bytes += r.len;
            part.first_read_ns = part.first_read_ns.min(issue);
            part.ready_ns = part.ready_ns.max(done);
        }
        // The first batch starts with the burst (its opens included).
        parts[0].first_read_ns = parts[0].first_read_ns.min(s.first_read_ns);
        for i in 0..parts.len() {
            parts[i].wait_s = (parts[i].ready_ns - parts[i].first_read_ns).max(0) as f64 / 1e9;
            parts[i].interval_s = match parts.get(i + 1) {
                Some(next) => Some((next.first_read_ns - parts[i].ready_ns).max(0) as f64 / 1e9),
                None => s.interval_s,
            };
        }
        out.extend(parts);
    }
    // A batch split by a stalled read: consecutive bursts of fewer files than B whose files
    // together are B make one step.
    let mut steps = Vec::with_capacity(out.len());
    let mut i = 0;
    while i < out.len() {
        let mut files: HashSet<u32> = files_of(&out[i]).into_iter().collect();
        let mut j = i + 1;
        while files.len() < batch && j < out.len() {
            let mut union = files.clone();
            union.extend(files_of(&out[j]));
            if union.len() > batch {
                break;
            }
            files = union;
            j += 1;
        }
        if j > i + 1 && files.len() == batch {
            let mut s = out[i].clone();
            for next in &out[i + 1..j] {
                s.reads.extend_from_slice(&next.reads);
                s.bytes += next.bytes;
                s.samples += next.samples;
                s.ready_ns = s.ready_ns.max(next.ready_ns);
                s.interval_s = next.interval_s;
                s.period_s = match (s.period_s, next.period_s) {
                    (Some(a), Some(b)) => Some(a + b),
                    (a, b) => a.or(b),
                };
            }
            s.wait_s = (s.ready_ns - s.first_read_ns).max(0) as f64 / 1e9;
            steps.push(s);
            joined += 1;
            i = j;
        } else {
            steps.push(out[i].clone());
            i += 1;
        }
    }
    (steps, split, joined, deepest)
}
