//! Reads a thread does not wait for: io_uring (recorded with `--io-uring`) and AIO
//! requests are file-layer `read` rows from submission to completion by the submitting
//! thread, which goes on while they are in flight. A thread inside a read syscall can
//! issue nothing else, so two reads of one thread whose [issue, complete] spans overlap
//! can only be asynchronous: such a thread is an asynchronous reader. Its requests are
//! replayed as it kept them in flight: each on one of as many streams as it had requests
//! outstanding at once (the first stream free when the request was issued).
//!
//! An asynchronous request is stamped at its submission (`io_uring_submit_req`), and the
//! device may see it much later: a rank's first io_uring submission can wait 7-11 ms
//! (the ring's worker starting) while its next ones, stamped later, go to the device at
//! once. Paced by those stamps, the replay would issue the first fills of all ranks
//! together where the job's were staggered. So [`paced_by_arrivals`] moves each such read
//! to the first block-layer read of its process that arrived between its submission and
//! its completion (arrivals.rs); a read the page cache served (no arrival in its span)
//! keeps its stamp.

use std::collections::{HashMap, HashSet};
use trainio_schema::OwnedRow;

use crate::arrivals::{Arrivals, MAX_ARRIVALS};
use crate::input::is_data_read;
use crate::stats::quantile;

/// Overlapping pairs that mark a thread asynchronous: one could be a clock's rounding.
const MIN_OVERLAPS: usize = 2;

/// The threads among `reads` (data reads) that had two of their reads in flight at once,
/// at least MIN_OVERLAPS times.
pub fn async_tids<'a>(reads: impl Iterator<Item = &'a OwnedRow>) -> HashSet<u32> {
    let mut by_tid: HashMap<u32, Vec<(i64, i64)>> = HashMap::new();
    for r in reads {
        by_tid.entry(r.tid).or_default().push((r.issue_ns, r.complete_ns));
    }
    by_tid
        .into_iter()
        .filter_map(|(tid, mut spans)| {
            spans.sort_unstable();
            let mut end = i64::MIN;
            let mut overlaps = 0;
            for &(issue, complete) in &spans {
                if issue < end {
                    overlaps += 1;
                }
                end = end.max(complete);
            }
            (overlaps >= MIN_OVERLAPS).then_some(tid)
        })
        .collect()
}

/// `file` with the data reads of asynchronous threads ([`async_tids`]) moved to when the
/// device saw them (the module's doc), or None when no read moves. Says in `notes` how many
/// moved and by how much, and how many kept their stamps for the bound on arrivals.
pub(crate) fn paced_by_arrivals(
    file: &[OwnedRow],
    arrivals: &Arrivals,
    notes: &mut Vec<String>,
) -> Option<Vec<OwnedRow>> {
    if arrivals.is_empty() {
        return None;
    }
    let tids = async_tids(file.iter().filter(|r| is_data_read(r)));
    if tids.is_empty() {
        return None;
    }
    // (row, its new stamp): the rows are copied only when one moves.
    let mut moves: Vec<(usize, i64)> = Vec::new();
    let mut moved_ms: Vec<f64> = Vec::new();
    let (mut unknown, mut cached) = (0usize, 0usize);
    for (i, r) in file.iter().enumerate().filter(|(_, r)| tids.contains(&r.tid) && is_data_read(r)) {
        if !arrivals.known_until(r.complete_ns) {
            unknown += 1;
            continue;
        }
        match arrivals.first_in(r.pid, r.issue_ns, r.complete_ns) {
            Some(at) if at > r.issue_ns => {
                moved_ms.push((at - r.issue_ns) as f64 / 1e6);
                moves.push((i, at));
            }
            Some(_) => {}
            None => cached += 1,
        }
    }
    if unknown > 0 {
        notes.push(format!(
            "{unknown} asynchronous read(s) in flight from {:.3} s on keep their submission stamps: the model keeps the first {MAX_ARRIVALS} block-read arrivals only",
            arrivals.dropped_from().unwrap_or(0) as f64 / 1e9
        ));
    }
    if moved_ms.is_empty() {
        return None;
    }
    let max = moved_ms.iter().copied().fold(0.0, f64::max);
    notes.push(format!(
        "{} asynchronous read(s) moved from their submission to when the device saw them (their process's first block read in their span): by {:.3} ms median, {max:.3} ms at most; {cached} with no block read in their span (the page cache served them, or another file system) keep their stamps",
        moved_ms.len(),
        quantile(&moved_ms, 0.5).unwrap_or(0.0),
    ));
    let mut rows = file.to_vec();
    for (i, at) in moves {
        rows[i].issue_ns = at;
    }
    Some(rows)
}

/// The replay's reader streams of one GPU: one per thread that read synchronously, and
/// per asynchronous thread one per request it had in flight at once.
#[derive(Default)]
pub struct Streams {
    asynchronous: HashSet<u32>,
    /// Synchronous thread → its stream.
    sync: HashMap<u32, u32>,
    /// Asynchronous thread → (stream, completion of its last request) per stream.
    slots: HashMap<u32, Vec<(u32, i64)>>,
    count: u32,
}

impl Streams {
    pub fn new(asynchronous: HashSet<u32>) -> Streams {
        Streams { asynchronous, ..Default::default() }
    }

    /// The stream of read `r`; reads must come in issue order.
    pub fn of(&mut self, r: &OwnedRow) -> u32 {
        if !self.asynchronous.contains(&r.tid) {
            let next = self.count;
            let s = *self.sync.entry(r.tid).or_insert(next);
            if s == next {
                self.count += 1;
            }
            return s;
        }
        let slots = self.slots.entry(r.tid).or_default();
        if let Some(slot) = slots.iter_mut().find(|s| s.1 <= r.issue_ns) {
            slot.1 = r.complete_ns;
            return slot.0;
        }
        let s = self.count;
        self.count += 1;
        slots.push((s, r.complete_ns));
        s
    }

    /// How many streams the reads so far took.
    pub fn count(&self) -> usize {
        self.count as usize
    }

    /// Whether any thread read asynchronously.
    pub fn any_async(&self) -> bool {
        !self.asynchronous.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::Input;

    fn read(tid: u32, issue: i64, complete: i64) -> OwnedRow {
        let r = crate::tests::row(trainio_schema::Layer::File, "read", 1, tid, "t", issue, complete);
        OwnedRow { offset: Some(0), bytes: 4096, ..r }
    }

    #[test]
    fn overlapping_reads_of_a_thread_are_asynchronous() {
        // tid 1: syscalls one after another; tid 2: four requests in flight, then two.
        let mut rows = vec![read(1, 0, 10), read(1, 10, 20), read(1, 25, 30)];
        rows.extend([read(2, 0, 40), read(2, 1, 41), read(2, 2, 42), read(2, 3, 43), read(2, 50, 60), read(2, 55, 70)]);
        let tids = async_tids(rows.iter());
        assert_eq!(tids, HashSet::from([2]));
        // One overlap is not enough.
        assert!(async_tids([read(3, 0, 10), read(3, 9, 20)].iter()).is_empty());

        rows.sort_by_key(|r| r.issue_ns);
        let mut streams = Streams::new(tids);
        let got: Vec<(u32, u32)> = rows.iter().map(|r| (r.tid, streams.of(r))).collect();
        // tid 2 used 4 streams at most; its request at 50 takes the first free one again.
        let of2: Vec<u32> = got.iter().filter(|g| g.0 == 2).map(|g| g.1).collect();
        let of1: Vec<u32> = got.iter().filter(|g| g.0 == 1).map(|g| g.1).collect();
        assert_eq!(of1, vec![of1[0]; 3]);
        assert_eq!(streams.count(), 5);
        let distinct: HashSet<u32> = of2.iter().copied().collect();
        assert_eq!(distinct.len(), 4);
        assert_eq!(of2[4], of2[0], "the first stream is free again at 50");
        assert_ne!(of2[5], of2[4], "the request at 55 overlaps the one at 50");
    }

    const MS: i64 = 1_000_000;

    /// An io_uring reader: one thread, 4 requests of 1 MiB submitted 10 us apart at each
    /// step, 50 ms apart; the device sees a step's requests `stall` after the first's
    /// submission (None: the page cache served them, the block layer saw none).
    fn uring_rank(input: &mut Input, rank: u32, t0: i64, stalls: &[Option<i64>]) {
        input.proc_rows.push(OwnedRow {
            ppid: Some(100),
            ..crate::tests::row(trainio_schema::Layer::Proc, "fork", rank, rank, "python", t0 - 10 * MS, t0 - 10 * MS)
        });
        for (k, stall) in stalls.iter().enumerate() {
            let at = t0 + k as i64 * 50 * MS;
            for i in 0..4i64 {
                let issue = at + i * 10_000;
                let (arrival, complete) = match stall {
                    Some(s) => (at + s + i * 5_000, at + s + (i + 1) * 2 * MS),
                    None => (0, issue + 50_000 + i * 20_000),
                };
                let r = read(rank, issue, complete);
                input.file.push(OwnedRow {
                    pid: rank,
                    offset: Some(0),
                    bytes: 1 << 20,
                    file: Some(format!("/data/r{rank}/s{k:03}_{i}.bin").into()),
                    dev: Some("7:3".into()),
                    ..r
                });
                if stall.is_some() {
                    input.add_block_read(rank, arrival, 1 << 20);
                    input.arrivals.add(rank, arrival);
                }
            }
        }
    }

    #[test]
    fn the_model_starts_an_asynchronous_readers_steps_when_the_device_saw_them() {
        // The first submission waits 8 ms before the device sees it; later ones 20 us;
        // the page cache serves step 5.
        let mut stalls = vec![Some(20_000); 12];
        stalls[0] = Some(8 * MS);
        stalls[5] = None;
        let mut input = Input { has_block: true, ..Input::default() };
        let t0 = 1_000 * MS;
        uring_rank(&mut input, 200, t0, &stalls);
        input.arrivals.finish();
        let m = crate::infer(&input, &crate::Options::default()).unwrap();
        let g = &m.gpus[0];
        let text = crate::describe(&m).join("\n");
        assert_eq!(g.steps.len(), 12, "{text}");
        assert!(!g.synchronous && g.readers == 4, "{text}");
        for (k, (s, stall)) in g.steps.iter().zip(&stalls).enumerate() {
            let at = t0 + k as i64 * 50 * MS;
            assert_eq!(s.first_read_ns, at + stall.unwrap_or(0), "step {k}: {text}");
        }
        let note = m.warnings.iter().find(|w| w.contains("moved from their submission")).expect(&text);
        // The first step's 4 reads moved by 7.97-8 ms; of each later step's, the two
        // submitted before the device saw the first (by 20 and 10 us): the others are
        // within 50 us of it (arrivals.rs). The 4 the cache served stay.
        assert!(note.starts_with("24 asynchronous read(s)"), "{note}");
        assert!(note.contains("by 0.020 ms median, 8.000 ms at most; 4 with no block read in their span"), "{note}");
    }

    #[test]
    fn past_the_bound_on_arrivals_reads_keep_their_stamps_and_a_note_says_so() {
        let mut input = Input { has_block: true, ..Input::default() };
        // Arrivals of the first 3 steps only kept (one per step: 5 us apart, one bucket).
        input.arrivals = Arrivals::with_max(3);
        let t0 = 1_000 * MS;
        uring_rank(&mut input, 200, t0, &[Some(MS); 6]);
        input.arrivals.finish();
        let mut notes = Vec::new();
        let rows = paced_by_arrivals(&input.file, &input.arrivals, &mut notes).unwrap();
        for (k, step) in rows.chunks(4).enumerate() {
            let at = t0 + k as i64 * 50 * MS;
            let first = step.iter().map(|r| r.issue_ns).min().unwrap();
            assert_eq!(first, if k < 3 { at + MS } else { at }, "step {k}");
        }
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(
            notes[0].starts_with("12 asynchronous read(s) in flight from 1.151 s on keep their submission stamps"),
            "{notes:?}"
        );
        assert!(notes[1].starts_with("12 asynchronous read(s) moved"), "{notes:?}");
    }
}
