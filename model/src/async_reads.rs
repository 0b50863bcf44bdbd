//! Reads a thread does not wait for: io_uring (recorded with `--io-uring`) and AIO
//! requests are file-layer `read` rows from submission to completion by the submitting
//! thread, which goes on while they are in flight. A thread inside a read syscall can
//! issue nothing else, so two reads of one thread whose [issue, complete] spans overlap
//! can only be asynchronous: such a thread is an asynchronous reader. Its requests are
//! replayed as it kept them in flight: each on one of as many streams as it had requests
//! outstanding at once (the first stream free when the request was issued).

use std::collections::{HashMap, HashSet};
use trainio_schema::OwnedRow;

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
}
