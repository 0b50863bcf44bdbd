//! When the device saw each process's reads: the block-layer read requests of a process,
//! as the times they reached the device's queue (`insert_ns` where the trace has it, else
//! `issue_ns`). An asynchronous request (io_uring) is stamped at its submission, which can
//! be milliseconds before the device sees it (async_reads.rs moves it to its arrival).
//!
//! Kept as the earliest arrival per ARRIVAL_BUCKET_NS of each process, and at most
//! MAX_ARRIVALS of them, so a block-heavy trace of days does not hold gigabytes: past the
//! bound, no arrival from the first one left out on is known, and reads in flight then
//! keep their submission stamps.

use std::collections::HashMap;

/// Arrivals of one process closer than this are one: the earliest is kept.
pub const ARRIVAL_BUCKET_NS: i64 = 50_000;
/// The most arrivals kept (8 M: 64 MiB of times).
pub const MAX_ARRIVALS: usize = 1 << 23;

/// Block-read arrival times per process (see the module's doc).
pub struct Arrivals {
    by_pid: HashMap<u32, Vec<i64>>,
    kept: usize,
    max: usize,
    /// The earliest arrival left out for the bound: none is known from it on.
    dropped_from: Option<i64>,
}

impl Default for Arrivals {
    fn default() -> Self {
        Arrivals::with_max(MAX_ARRIVALS)
    }
}

impl Arrivals {
    /// Arrivals holding at most `max` times.
    pub fn with_max(max: usize) -> Self {
        Arrivals { by_pid: HashMap::new(), kept: 0, max, dropped_from: None }
    }

    /// A block read of `pid` reached the device at `ns`. Rows come mostly in time order:
    /// one in the bucket of the process's last kept arrival is folded into it here, the
    /// rest when [`Arrivals::finish`] sorts them.
    pub fn add(&mut self, pid: u32, ns: i64) {
        let bucket = ns.div_euclid(ARRIVAL_BUCKET_NS);
        if let Some(times) = self.by_pid.get_mut(&pid) {
            if let Some(last) = times.last_mut() {
                if last.div_euclid(ARRIVAL_BUCKET_NS) == bucket {
                    *last = (*last).min(ns);
                    return;
                }
            }
        }
        if self.kept >= self.max {
            self.dropped_from = Some(self.dropped_from.map_or(ns, |d| d.min(ns)));
            return;
        }
        self.kept += 1;
        self.by_pid.entry(pid).or_default().push(ns);
    }

    /// Sorts each process's arrivals and keeps the earliest per bucket.
    pub fn finish(&mut self) {
        let mut kept = 0;
        for times in self.by_pid.values_mut() {
            times.sort_unstable();
            times.dedup_by_key(|t| t.div_euclid(ARRIVAL_BUCKET_NS));
            times.shrink_to_fit();
            kept += times.len();
        }
        self.kept = kept;
    }

    /// The first arrival of `pid` in [from, to], to a bucket: an arrival kept earlier in
    /// `from`'s bucket may stand for a later one folded into it, and counts as one at
    /// `from` (arrivals must be [`Arrivals::finish`]ed).
    pub fn first_in(&self, pid: u32, from: i64, to: i64) -> Option<i64> {
        let times = self.by_pid.get(&pid)?;
        let i = times.partition_point(|&t| t < from);
        let bucket = from.div_euclid(ARRIVAL_BUCKET_NS);
        if i > 0 && times[i - 1].div_euclid(ARRIVAL_BUCKET_NS) == bucket {
            return Some(from);
        }
        times.get(i).copied().filter(|&t| t <= to)
    }

    /// Whether every arrival up to `ns` was kept (none left out for the bound before it).
    pub fn known_until(&self, ns: i64) -> bool {
        self.dropped_from.is_none_or(|d| ns < d)
    }

    /// The earliest arrival left out for the bound, if any was.
    pub fn dropped_from(&self) -> Option<i64> {
        self.dropped_from
    }

    /// How many arrivals are kept.
    pub fn len(&self) -> usize {
        self.kept
    }

    pub fn is_empty(&self) -> bool {
        self.kept == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_earliest_arrival_per_bucket_is_kept_and_found_in_a_span() {
        let mut a = Arrivals::default();
        // Out of order, two in one bucket of pid 1 (10 and 30 us), one far later.
        for (pid, ns) in [(1, 30_000), (1, 10_000), (2, 20_000), (1, 900_000), (1, 120_000)] {
            a.add(pid, ns);
        }
        a.finish();
        assert_eq!(a.len(), 4);
        assert_eq!(a.first_in(1, 0, 1_000_000), Some(10_000));
        // 30 us was folded into 10 us: a span from 11 us on may hold it.
        assert_eq!(a.first_in(1, 11_000, 1_000_000), Some(11_000));
        assert_eq!(a.first_in(1, 50_000, 1_000_000), Some(120_000), "the next bucket's first");
        assert_eq!(a.first_in(1, 150_000, 800_000), None, "nothing in the span");
        assert_eq!(a.first_in(1, 150_000, 900_000), Some(900_000), "the span's end counts");
        assert_eq!(a.first_in(2, 0, 19_999), None);
        assert_eq!(a.first_in(3, 0, i64::MAX), None);
        assert!(a.known_until(i64::MAX) && a.dropped_from().is_none());
    }

    #[test]
    fn past_the_bound_no_arrival_is_known_from_the_first_left_out() {
        let mut a = Arrivals::with_max(3);
        for ns in [0, 100_000, 200_000, 300_000, 250_000, 400_000] {
            a.add(7, ns);
        }
        // 300_000 is the first past the bound; 250_000, out of order, is earlier still.
        a.finish();
        assert_eq!(a.len(), 3);
        assert_eq!(a.dropped_from(), Some(250_000));
        assert!(a.known_until(249_999));
        assert!(!a.known_until(250_000));
        assert_eq!(a.first_in(7, 150_000, 1_000_000), Some(200_000));
        assert_eq!(a.first_in(7, 250_000, 1_000_000), None);
    }
}
