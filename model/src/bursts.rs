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
/// A jump with fewer gaps above it than this may be a job's start, end and epochs.
const MIN_STEPS_ABOVE: usize = 8;
/// The least jump taken between batches when only a jump below a few long gaps is clearer.
const WEAK_GAP_RATIO: f64 = 2.0;
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
///
/// A job's start, its end and its epochs' starts leave a few gaps far longer than the
/// rest, and on a busy host the gaps inside a batch (a stalled read) and between batches
/// (a loader running behind) can come within MIN_GAP_RATIO of each other. The jump above
/// those few long gaps then looks the clearest, and a step would be a whole epoch. So a
/// jump with at least MIN_STEPS_ABOVE gaps above it is preferred: the largest such jump of
/// at least MIN_GAP_RATIO, else (when only a jump below a few long gaps reaches it) the
/// largest such jump of at least WEAK_GAP_RATIO.
pub fn step_gap_ns(gaps: &[i64]) -> (i64, bool) {
    let mut g: Vec<i64> = gaps.iter().copied().filter(|&x| x > 0).collect();
    g.sort_unstable();
    // (ratio, gap, gaps above) per jump between neighbours, the upper at least MIN_STEP_GAP_NS.
    let jumps: Vec<(f64, i64, usize)> = g
        .windows(2)
        .enumerate()
        .filter(|(_, w)| w[1] >= MIN_STEP_GAP_NS)
        .map(|(i, w)| {
            let lo = w[0].max(1) as f64;
            (w[1] as f64 / lo, ((lo * w[1] as f64).sqrt() as i64).max(MIN_STEP_GAP_NS), g.len() - 1 - i)
        })
        .collect();
    let best = |min_ratio: f64, min_above: usize| {
        jumps.iter().filter(|&&(r, _, above)| r >= min_ratio && above >= min_above).fold(
            None,
            |b: Option<(f64, i64)>, &(r, t, _)| if b.is_none_or(|(br, _)| r > br) { Some((r, t)) } else { b },
        )
    };
    let clear = best(MIN_GAP_RATIO, 0);
    let chosen =
        best(MIN_GAP_RATIO, MIN_STEPS_ABOVE).or_else(|| clear.and(best(WEAK_GAP_RATIO, MIN_STEPS_ABOVE))).or(clear);
    match chosen {
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
/// batches. Conversely a batch whose read stalled past the step gap spreads over several
/// bursts, and a fill that a stall cut in two holds whole batches only counted together.
/// So the bursts are taken in runs: from each burst, the fewest consecutive bursts (at
/// most MAX_RUN) whose files number a multiple of the modal burst's B. A run of one burst
/// of B files stays as it is; any other run becomes its files / B steps of B files each,
/// in the order of their first read, each starting at its first read. The run's recorded
/// periods are shared evenly between its steps, so the replay keeps the recorded pace and
/// the step period stays the compute time. Files, not opens, count here: a thread reading
/// ahead opens its next sample in one burst and reads it in the next. A burst that starts
/// no such run (an epoch's short last batch) stays as it is. Returns the steps, how many
/// runs were split into more steps than bursts, how many were joined into fewer (or as
/// many), and the most batches one burst held.
/// `times`: per step, the (issue, complete) ns of each of its reads.
fn regroup_bursts(steps: Vec<Step>, times: &[Vec<(i64, i64)>]) -> (Vec<Step>, usize, usize, usize) {
    // A step's files in the order of their first read (a burst of a storage-bound loader
    // can hold every file of the run: no quadratic search).
    let files_of = |s: &Step| {
        let mut seen: HashSet<u32> = HashSet::new();
        s.reads.iter().map(|r| r.file).filter(|&f| seen.insert(f)).collect::<Vec<u32>>()
    };
    let files: Vec<Vec<u32>> = steps.iter().map(files_of).collect();
    let mut counts: HashMap<usize, usize> = HashMap::new();
    for f in &files {
        *counts.entry(f.len()).or_default() += 1;
    }
    // The modal batch: the most common count of files read (the smaller on a tie), at least 2,
    // seen in at least half the bursts and at least 3 times.
    let Some((batch, seen)) = counts.iter().map(|(&b, &n)| (b, n)).max_by_key(|&(b, n)| (n, std::cmp::Reverse(b)))
    else {
        return (steps, 0, 0, 1);
    };
    if batch < 2
        || seen < 3
        || seen * 2 < steps.len()
        || times.len() != steps.len()
        || steps.iter().zip(times).any(|(s, t)| t.len() != s.reads.len())
    {
        return (steps, 0, 0, 1);
    }
    let mut out = Vec::with_capacity(steps.len());
    let (mut split, mut joined, mut deepest) = (0, 0, 1);
    let mut i = 0;
    while i < steps.len() {
        // The run's distinct files (a file read in two bursts counts once).
        let mut union: HashSet<u32> = HashSet::new();
        let mut total = 0;
        let mut end = None;
        for (j, f) in files.iter().enumerate().skip(i).take(MAX_RUN) {
            union.extend(f);
            total = union.len();
            if total % batch == 0 {
                end = Some(j + 1);
                break;
            }
        }
        let Some(j) = end.filter(|&j| j > i + 1 || total != batch) else {
            out.push(steps[i].clone());
            i += 1;
            continue;
        };
        let parts = regroup_run(&steps[i..j], &times[i..j], &files[i..j], batch);
        if parts.len() > j - i {
            split += 1;
        } else {
            joined += 1;
        }
        deepest = deepest.max(files[i..j].iter().map(|f| f.len().div_ceil(batch)).max().unwrap_or(1));
        out.extend(parts);
        i = j;
    }
    (out, split, joined, deepest)
}

/// Bursts read back to back at most: a run longer than this is not one stalled batch or fill.
const MAX_RUN: usize = 4;

/// The steps of one run of bursts (`regroup_bursts`): its files, in the order of their
/// first read, cut into batches of `batch`.
fn regroup_run(run: &[Step], times: &[Vec<(i64, i64)>], files: &[Vec<u32>], batch: usize) -> Vec<Step> {
    let mut position: HashMap<u32, usize> = HashMap::new();
    for &f in files.iter().flatten() {
        let next = position.len();
        position.entry(f).or_insert(next);
    }
    let k = position.len().div_ceil(batch);
    let samples: u32 = run.iter().map(|s| s.samples).sum();
    let one_per_file = samples as usize == files.iter().map(Vec::len).sum::<usize>();
    let period: Option<f64> = run.iter().map(|s| s.period_s).sum();
    let mut parts: Vec<Step> = (0..k)
        .map(|i| Step {
            reads: Vec::new(),
            bytes: 0,
            samples: if one_per_file { batch as u32 } else { samples / k as u32 + u32::from(i < samples as usize % k) },
            first_read_ns: i64::MAX,
            ready_ns: i64::MIN,
            interval_s: None,
            wait_s: 0.0,
            period_s: period.map(|p| p / k as f64),
            worker_cpu_s: None,
            taken: true,
        })
        .collect();
    for (s, t) in run.iter().zip(times) {
        for (r, &(issue, done)) in s.reads.iter().zip(t) {
            let part = &mut parts[position[&r.file] / batch];
            part.reads.push(*r);
            part.bytes += r.len;
            part.first_read_ns = part.first_read_ns.min(issue);
            part.ready_ns = part.ready_ns.max(done);
        }
    }
    // The first batch starts with the run (its opens included).
    parts[0].first_read_ns = parts[0].first_read_ns.min(run[0].first_read_ns);
    let last_interval = run[run.len() - 1].interval_s;
    for i in 0..parts.len() {
        parts[i].wait_s = (parts[i].ready_ns - parts[i].first_read_ns).max(0) as f64 / 1e9;
        parts[i].interval_s = match parts.get(i + 1) {
            Some(next) => Some((next.first_read_ns - parts[i].ready_ns).max(0) as f64 / 1e9),
            None => last_interval,
        };
    }
    parts
}
