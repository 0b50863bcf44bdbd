//! Value histograms (value → count) and their percentiles: a leaf module, shared by the
//! results and the object-storage request log without either depending on the other.

use std::collections::BTreeMap;

/// The smallest value at or below which a fraction `q` of the counts lie (0 when empty).
pub fn percentile(hist: &BTreeMap<u64, u64>, q: f64) -> u64 {
    let total: u64 = hist.values().sum();
    if total == 0 {
        return 0;
    }
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (&v, &c) in hist {
        seen += c;
        if seen >= rank {
            return v;
        }
    }
    *hist.keys().last().unwrap()
}
