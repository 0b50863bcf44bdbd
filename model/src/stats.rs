//! Small statistics the model's parts share: quantiles of intervals, time covered by spans.

use trainio_schema::OwnedRow;

pub(crate) fn quantile(v: &[f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let pos = q * (s.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    Some(s[lo] + (s[hi] - s[lo]) * (pos - lo as f64))
}

/// Time covered by the rows' [issue, complete] spans (their union), rows sorted by issue.
pub(crate) fn busy_ns(rows: &[&OwnedRow]) -> i64 {
    let (mut total, mut start, mut end) = (0i64, i64::MIN, i64::MIN);
    for r in rows {
        if r.issue_ns > end {
            total += (end - start).max(0);
            start = r.issue_ns;
            end = r.complete_ns;
        } else {
            end = end.max(r.complete_ns);
        }
    }
    total + (end - start).max(0)
}
