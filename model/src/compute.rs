//! Compute time per step (the model's part 3): the time a GPU spends outside getting its
//! data. It is taken from the intervals the steps' finder measured (handoff.rs, bursts.rs),
//! or, when the rank's threads send on a collective's socket in its compute windows, from
//! the batch in hand to the collective's first send.

use std::collections::{HashMap, HashSet};

use trainio_schema::OwnedRow;

use crate::evidence::{GpuEvidence, StepsFound};
use crate::stats::quantile;

/// Quantile of a GPU's step intervals taken as its compute time.
const COMPUTE_QUANTILE: f64 = 0.10;

/// A GPU's compute per step and what it was measured from.
pub(crate) struct Compute {
    pub compute_s: Option<f64>,
    /// The collective's own time per step (0 unless `signal` is `collective`).
    pub sync_s: f64,
    /// `GpuModel::compute_signal`.
    pub signal: &'static str,
    /// The step intervals (their p50 and p90 are the GPU's).
    pub intervals: Vec<f64>,
    /// Loader threads read ahead: compute per step is the recorded step period.
    pub paced: bool,
}

pub(crate) fn compute(ev: &GpuEvidence, found: &StepsFound) -> Compute {
    let rank = ev.rank;
    let steps = &found.steps;
    let intervals: Vec<f64> = match &found.intervals {
        Some(v) => v.clone(),
        None => steps.iter().filter_map(|s| s.interval_s).collect(),
    };
    let paced = found.signal == "bursts" && !found.synchronous;
    let excluded: HashSet<&str> = ev.data_pipes.union(&ev.index_pipes).copied().collect();
    let split = collective_split(&found.windows, rank, ev.ipc_rows(rank), ev.file_rows(rank), &excluded);
    // A step period is the compute when loader threads keep ahead; a gap or a time to
    // the next get can only be longer than the compute (COMPUTE_QUANTILE); the time to a
    // collective's first send is the compute itself (collective_split).
    let (compute_s, sync_s, signal) = match &split {
        Some((computes, syncs)) => {
            (quantile(computes, 0.5), quantile(syncs, COMPUTE_QUANTILE).unwrap_or(0.0), "collective")
        }
        None => (
            quantile(&intervals, if paced { 0.5 } else { COMPUTE_QUANTILE }),
            0.0,
            if paced {
                "period"
            } else if found.signal == "handoff" {
                "next_get"
            } else {
                "gap"
            },
        ),
    };
    Compute { compute_s, sync_s, signal, intervals, paced }
}

/// A collective's sends in a GPU's compute windows (a data-parallel job's all-reduce
/// after each step's compute, when its transport is a socket the trace sees: gloo's TCP
/// pairs, NCCL's socket transport). A socket is the collective's when the rank's threads
/// send on it in at least half the windows (and 2); the pipes of the handoff are not.
/// In a window (from, anchor, to) the compute starts at the end of the main thread's
/// last syscall in [from, anchor] (anchor when there is none: the batch was in hand) and
/// ends at the first send on a collective socket after it; from that send to `to` is the
/// collective, with any wait for a slower rank. Returns (computes, syncs) of the windows
/// that have a send, or None when no socket is the collective's or fewer than half the
/// windows have a send.
fn collective_split(
    windows: &[(i64, i64, i64)],
    rank: u32,
    ipc: &[&OwnedRow],
    file: &[&OwnedRow],
    excluded: &HashSet<&str>,
) -> Option<(Vec<f64>, Vec<f64>)> {
    if windows.len() < 2 {
        return None;
    }
    let mut sends: Vec<(i64, &str)> = ipc
        .iter()
        .filter(|r| &*r.op == "write" && r.bytes > 0)
        .filter_map(|r| {
            r.file.as_deref().filter(|f| f.starts_with("socket:") && !excluded.contains(f)).map(|f| (r.issue_ns, f))
        })
        .collect();
    sends.sort_unstable();
    let in_window = |from: i64, to: i64| {
        let lo = sends.partition_point(|s| s.0 <= from);
        let hi = sends.partition_point(|s| s.0 < to);
        &sends[lo..hi.max(lo)]
    };
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for &(from, _, to) in windows {
        let mut here: Vec<&str> = in_window(from, to).iter().map(|s| s.1).collect();
        here.sort_unstable();
        here.dedup();
        for f in here {
            *seen.entry(f).or_default() += 1;
        }
    }
    let need = windows.len().div_ceil(2).max(2);
    let collective: HashSet<&str> = seen.into_iter().filter(|&(_, n)| n >= need).map(|(f, _)| f).collect();
    if collective.is_empty() {
        return None;
    }
    let mut main: Vec<i64> =
        ipc.iter().chain(file.iter()).filter(|r| r.pid == rank && r.tid == rank).map(|r| r.complete_ns).collect();
    main.sort_unstable();
    let mut computes = Vec::new();
    let mut syncs = Vec::new();
    for &(from, anchor, to) in windows {
        let last = main.partition_point(|&t| t <= anchor);
        let start = match last.checked_sub(1).map(|i| main[i]) {
            Some(t) if t >= from => t,
            _ => anchor,
        };
        let Some(&(c, _)) = in_window(start, to).iter().find(|s| collective.contains(s.1)) else { continue };
        computes.push((c - start) as f64 / 1e9);
        syncs.push((to - c) as f64 / 1e9);
    }
    (computes.len() >= need).then_some((computes, syncs))
}
