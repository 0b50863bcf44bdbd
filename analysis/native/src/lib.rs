//! Compiled loops of the trace analyzer: `trainio_analysis._native`.
//!
//! Each function is the fused, single-pass equivalent of a few numpy passes in
//! `trainio_analysis` (named in its doc comment) and returns exactly what they return; the
//! Python side keeps those numpy versions as the reference the tests compare against.
//! Every function releases the GIL while it loops, so the analyzer's worker threads run
//! on all cores.

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

mod job_model;

/// `sketch.SUB_BITS`, `sketch.N_BUCKETS`: log buckets with 128 sub-buckets per octave.
const SUB_BITS: i64 = 7;
const N_BUCKETS: usize = 64 * (1 << SUB_BITS) + 1;
const SIZE_BUCKETS: usize = 65;
const CODE_ISSUE: i64 = 1;
const CODE_COMPLETE_ZERO: i64 = 2;

/// `sketch.log_bucket` of one value: exponent and top mantissa bits of its float64.
#[inline]
fn log_bucket(v: i64) -> usize {
    let bits = ((v as f64).to_bits() as i64) >> (52 - SUB_BITS);
    (bits - ((1023 << SUB_BITS) - 1)).max(0) as usize
}

/// `sketch.pow2_bucket` of one value: 0 for 0, else k+1 for 2^k <= v < 2^(k+1).
#[inline]
fn pow2_bucket(v: i64) -> usize {
    let bits = ((v as f64).to_bits() as i64) >> 52;
    (bits - 1022).max(0) as usize
}

fn slice<'a, T: numpy::Element>(a: &'a PyReadonlyArray1<'_, T>, name: &str) -> PyResult<&'a [T]> {
    a.as_slice().map_err(|_| PyValueError::new_err(format!("{name}: array must be contiguous")))
}

fn same_len(n: usize, m: usize, name: &str) -> PyResult<()> {
    if n == m {
        Ok(())
    } else {
        Err(PyValueError::new_err(format!("{name}: length {m}, expected {n}")))
    }
}

/// Sorted event keys of one group's requests: `qd_sweep.event_keys` then `qd_sweep._sort_keys`.
///
/// Issue keys `4 (issue - offset) + 1`, completion keys `4 (complete - offset)` (+2 for a
/// zero-latency request). Rows near completion order (what the tracer writes) make the
/// completion keys a sorted run and the issue keys nearly sorted: each is sorted on its
/// own (an adaptive merge sort: linear on runs) and the two are merged.
#[pyfunction]
fn event_keys_sorted<'py>(
    py: Python<'py>,
    issue: PyReadonlyArray1<'py, i64>,
    complete: PyReadonlyArray1<'py, i64>,
    offset: i64,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    let iss = slice(&issue, "issue")?;
    let com = slice(&complete, "complete")?;
    same_len(iss.len(), com.len(), "complete")?;
    let out = py.detach(|| {
        let base = 4 * offset;
        let complete_key = |k: usize| {
            let (i, c) = (iss[k], com[k]);
            4 * c - base + if c == i { CODE_COMPLETE_ZERO } else { 0 }
        };
        let mut a: Vec<i64> = iss.iter().map(|&t| 4 * t + CODE_ISSUE - base).collect();
        sort_nearly_sorted(&mut a);
        if (1..com.len()).all(|k| complete_key(k - 1) <= complete_key(k)) {
            // rows in completion order: the completion keys are a sorted run already
            merge_with(&a, com.len(), complete_key)
        } else {
            let mut b: Vec<i64> = (0..com.len()).map(complete_key).collect();
            sort_nearly_sorted(&mut b);
            merge(&a, &b)
        }
    });
    Ok(PyArray1::from_vec(py, out))
}

/// Sorts keys that are usually close to sorted: insertion sort (linear in the number of
/// inversions, a few per key for rows in completion order), switching to a general sort
/// when the keys turn out to be far from sorted.
fn sort_nearly_sorted(v: &mut [i64]) {
    let budget = 16 * v.len() + 1024;
    let mut moves = 0usize;
    for i in 1..v.len() {
        let x = v[i];
        if v[i - 1] <= x {
            continue;
        }
        let mut j = i;
        while j > 0 && v[j - 1] > x {
            v[j] = v[j - 1];
            j -= 1;
        }
        v[j] = x;
        moves += i - j;
        if moves > budget {
            v.sort_unstable();
            return;
        }
    }
}

/// Merges two sorted runs; branch-free in the loop (which run a key comes from is a
/// coin toss for interleaved issues and completions).
fn merge(a: &[i64], b: &[i64]) -> Vec<i64> {
    merge_with(a, b.len(), |j| b[j])
}

/// [`merge`] with the second run given as `b(0) <= b(1) <= ... <= b(nb - 1)`.
#[inline(always)]
fn merge_with(a: &[i64], nb: usize, b: impl Fn(usize) -> i64) -> Vec<i64> {
    let mut out = Vec::with_capacity(a.len() + nb);
    let (mut i, mut j) = (0usize, 0usize);
    while i < a.len() && j < nb {
        let (x, y) = (a[i], b(j));
        let take_a = x <= y;
        out.push(if take_a { x } else { y });
        i += take_a as usize;
        j += (!take_a) as usize;
    }
    out.extend_from_slice(&a[i..]);
    out.extend((j..nb).map(b));
    out
}

/// Whether two sorted keys are equal and one of them is an issue:
/// `analyze.decode.equal_neighbours` for one group.
#[pyfunction]
fn equal_issue_neighbours(py: Python<'_>, keys: PyReadonlyArray1<'_, i64>) -> PyResult<bool> {
    let k = slice(&keys, "keys")?;
    Ok(py.detach(|| k.windows(2).any(|w| w[0] == w[1] && (w[0] & 3) == CODE_ISSUE)))
}

/// `qd_sweep.summarize(qd_sweep.merge_sorted(keys, [more]))`: the sweep of two sorted runs
/// of event keys merged (not materialized), not both empty, as a tuple
/// `(t_first, t_last, q_min, q_last, level_counts, time_hist, ends, starts)`.
#[pyfunction]
#[pyo3(signature = (keys, more=None))]
#[allow(clippy::type_complexity)]
fn summarize<'py>(
    py: Python<'py>,
    keys: PyReadonlyArray1<'py, i64>,
    more: Option<PyReadonlyArray1<'py, i64>>,
) -> PyResult<(
    i64,
    i64,
    i64,
    i64,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<f64>>,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<i64>>,
)> {
    let a = slice(&keys, "keys")?;
    let b: &[i64] = match &more {
        Some(m) => slice(m, "more")?,
        None => &[],
    };
    if a.is_empty() && b.is_empty() {
        return Err(PyValueError::new_err("summarize: no keys"));
    }
    let (t_first, t_last, q_min, q_last, levels, time, ends, starts) = py.detach(|| {
        if b.is_empty() {
            sweep(a)
        } else if a.is_empty() {
            sweep(b)
        } else {
            sweep(&merge(a, b))
        }
    });
    Ok((
        t_first,
        t_last,
        q_min,
        q_last,
        PyArray1::from_vec(py, levels),
        PyArray1::from_vec(py, time),
        PyArray1::from_vec(py, ends),
        PyArray1::from_vec(py, starts),
    ))
}

#[allow(clippy::type_complexity)]
fn sweep(k: &[i64]) -> (i64, i64, i64, i64, Vec<i64>, Vec<f64>, Vec<i64>, Vec<i64>) {
    // One pass. Levels are relative to the slice's start (0) until its minimum is known:
    // counts of levels >= 0 in `up[q]`, of levels < 0 in `down[-q - 1]`.
    // Ends (the count at its minimum) and starts (issues raising it to one above) are
    // collected relative to m = min(0, counts so far): an issue can raise the count to
    // m + 1 only from m, so a new minimum drops all earlier candidates. When no event
    // reaches 0 the minimum is 1 (the first event is an issue): `ends1`/`starts1`.
    struct Levels {
        up: Vec<i64>,
        down: Vec<i64>,
    }
    impl Levels {
        #[inline(always)]
        fn slot(&mut self, q: i64) -> &mut i64 {
            let (v, i) = if q >= 0 { (&mut self.up, q as usize) } else { (&mut self.down, (-q - 1) as usize) };
            if i >= v.len() {
                v.resize(i + 1, 0);
            }
            &mut v[i]
        }
        /// Values of levels lo..lo + len, in order.
        fn take(mut self, lo: i64, len: usize) -> Vec<i64> {
            (0..len as i64).map(|d| *self.slot(lo + d)).collect()
        }
    }
    let mut levels = Levels { up: Vec::new(), down: Vec::new() };
    let mut time = Levels { up: Vec::new(), down: Vec::new() };
    let (mut ends, mut starts) = (Vec::new(), Vec::new());
    let (mut ends1, mut starts1) = (Vec::new(), Vec::new());
    let (mut q, mut lo, mut hi, mut hi_but_last) = (0i64, i64::MAX, i64::MIN, i64::MIN);
    let (mut m, mut above) = (0i64, true);
    let mut prev_t = k[0] >> 2;
    for (idx, &key) in k.iter().enumerate() {
        let t = key >> 2;
        if idx > 0 {
            // np.bincount(q[:-1], weights=dt): the previous level held until this event
            *time.slot(q) += t - prev_t;
            hi_but_last = hi_but_last.max(q);
        }
        let issue = key & 3 == CODE_ISSUE;
        q += if issue { 1 } else { -1 };
        *levels.slot(q) += 1;
        lo = lo.min(q);
        hi = hi.max(q);
        if q < m {
            m = q;
            ends.clear();
            starts.clear();
        }
        if q == m {
            ends.push(t);
        } else if q == m + 1 && issue {
            starts.push(t);
        }
        if above {
            if q <= 0 {
                above = false;
                ends1 = Vec::new();
                starts1 = Vec::new();
            } else if q == 1 {
                ends1.push(t);
            } else if q == 2 && issue {
                starts1.push(t);
            }
        }
        prev_t = t;
    }
    if above {
        (ends, starts) = (ends1, starts1);
    }
    let levels = levels.take(lo, (hi - lo + 1) as usize);
    let time_len = if k.len() > 1 { (hi_but_last - lo + 1) as usize } else { 0 };
    // integer sums: the float64 bincount gives the same while below 2^53 ns per level
    let time: Vec<f64> = time.take(lo, time_len).into_iter().map(|v| v as f64).collect();
    (k[0] >> 2, prev_t, lo, q, levels, time, ends, starts)
}

/// The counting half of `analyze.decode.Decoder.prepare` in one pass over a row group.
///
/// Rows are those where `mask` is true (all when None). `op` holds each row's op code
/// (None: every row has op code `only_op`); `kind[op]` is 0 read, 1 write, 2 other and
/// `counted[op]` whether the queue-depth counter counts it. Returns a dict: `reads`,
/// `writes`, `bytes_read`, `bytes_written`, `tl_read`/`tl_write` (bytes per completion
/// bin, float64 of `nbins`; None when no row of that kind), `latency_count`, `_min`, `_max`,
/// `_sum`, `latency_buckets`, `latency` (the data rows' latencies, only if
/// `want_latency`), `size_counts` and `kernel_qd` (bincount of `kqd` over counted rows,
/// when `kqd` is given; None when no row is counted).
#[pyfunction]
#[pyo3(signature = (issue, complete, nbytes, mask, op, only_op, kind, counted, kqd, t0, bin_ns, nbins, want_latency))]
#[allow(clippy::too_many_arguments)]
fn count_rows<'py>(
    py: Python<'py>,
    issue: PyReadonlyArray1<'py, i64>,
    complete: PyReadonlyArray1<'py, i64>,
    nbytes: PyReadonlyArray1<'py, i64>,
    mask: Option<PyReadonlyArray1<'py, bool>>,
    op: Option<PyReadonlyArray1<'py, i64>>,
    only_op: i64,
    kind: Vec<u8>,
    counted: Vec<bool>,
    kqd: Option<PyReadonlyArray1<'py, u32>>,
    t0: i64,
    bin_ns: i64,
    nbins: usize,
    want_latency: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let iss = slice(&issue, "issue")?;
    let n = iss.len();
    let com = slice(&complete, "complete")?;
    same_len(n, com.len(), "complete")?;
    let nb = slice(&nbytes, "nbytes")?;
    same_len(n, nb.len(), "nbytes")?;
    let mask = match &mask {
        Some(m) => Some(slice(m, "mask")?),
        None => None,
    };
    let op = match &op {
        Some(o) => Some(slice(o, "op")?),
        None => None,
    };
    let kqd = match &kqd {
        Some(q) => Some(slice(q, "kqd")?),
        None => None,
    };
    for (arr, name) in [(mask.map(|m| m.len()), "mask"), (op.map(|o| o.len()), "op"), (kqd.map(|q| q.len()), "kqd")] {
        if let Some(m) = arr {
            same_len(n, m, name)?;
        }
    }
    if kind.len() != counted.len() || bin_ns <= 0 {
        return Err(PyValueError::new_err("count_rows: bad op tables or bin width"));
    }
    let op_ok = |o: i64| o >= 0 && (o as usize) < kind.len();
    if !op_ok(only_op) || op.is_some_and(|o| !o.iter().all(|&c| op_ok(c))) {
        return Err(PyValueError::new_err("count_rows: op code outside the op tables"));
    }
    let r = py.detach(|| {
        let mut c = Counts::new(nbins, want_latency);
        // one loop per shape of the input, so the per-row choices compile away
        let cols = Cols { iss, com, nb, t0, bin_ns };
        let only = only_op as usize;
        match (mask, op, kqd) {
            (None, None, Some(q)) => cols.run(&mut c, |_| true, |_| only, &kind, &counted, |i| Some(q[i])),
            (None, None, None) => cols.run(&mut c, |_| true, |_| only, &kind, &counted, |_| None),
            (None, Some(o), Some(q)) => cols.run(&mut c, |_| true, |i| o[i] as usize, &kind, &counted, |i| Some(q[i])),
            (None, Some(o), None) => cols.run(&mut c, |_| true, |i| o[i] as usize, &kind, &counted, |_| None),
            (m, o, q) => cols.run(
                &mut c,
                |i| m.is_none_or(|m| m[i]),
                |i| o.map_or(only, |o| o[i] as usize),
                &kind,
                &counted,
                |i| q.map(|q| q[i]),
            ),
        }
        c
    });
    r.into_dict(py)
}

struct Cols<'a> {
    iss: &'a [i64],
    com: &'a [i64],
    nb: &'a [i64],
    t0: i64,
    bin_ns: i64,
}

impl Cols<'_> {
    #[inline(always)]
    fn run(
        &self,
        c: &mut Counts,
        keep: impl Fn(usize) -> bool,
        op: impl Fn(usize) -> usize,
        kind: &[u8],
        counted: &[bool],
        kqd: impl Fn(usize) -> Option<u32>,
    ) {
        for i in 0..self.iss.len() {
            if !keep(i) {
                continue;
            }
            let o = op(i);
            c.row(kind[o], counted[o], self.iss[i], self.com[i], self.nb[i], kqd(i), self.t0, self.bin_ns);
        }
    }
}

struct Counts {
    reads: i64,
    writes: i64,
    bytes: [i64; 2],
    tl: [Vec<i64>; 2],
    lat_count: i64,
    lat_min: i64,
    lat_max: i64,
    lat_sum: i128,
    lat_buckets: Vec<i64>,
    latency: Option<Vec<i64>>,
    sizes: Vec<i64>,
    kqd: Vec<i64>,
    kqd_rows: usize,
    bad_bin: bool,
    // the bin of the last completion: rows near completion order mostly stay in it,
    // which saves a 64-bit division per row
    bin: i64,
    bin_lo: i64,
    bin_hi: i64,
}

impl Counts {
    fn new(nbins: usize, want_latency: bool) -> Self {
        Counts {
            reads: 0,
            writes: 0,
            bytes: [0, 0],
            tl: [vec![0; nbins], vec![0; nbins]],
            lat_count: 0,
            lat_min: i64::MAX,
            lat_max: i64::MIN,
            lat_sum: 0,
            lat_buckets: vec![0; N_BUCKETS],
            latency: want_latency.then(Vec::new),
            sizes: vec![0; SIZE_BUCKETS],
            kqd: Vec::new(),
            kqd_rows: 0,
            bad_bin: false,
            bin: 0,
            bin_lo: 0,
            bin_hi: 0, // empty: the first row divides
        }
    }

    /// `(complete - t0) // bin_ns` (floor division).
    #[inline]
    fn bin_of(&mut self, complete: i64, t0: i64, bin_ns: i64) -> i64 {
        let rel = complete - t0;
        if rel < self.bin_lo || rel >= self.bin_hi {
            self.bin = rel.div_euclid(bin_ns);
            self.bin_lo = self.bin * bin_ns;
            self.bin_hi = self.bin_lo.saturating_add(bin_ns);
        }
        self.bin
    }

    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn row(
        &mut self,
        kind: u8,
        counted: bool,
        issue: i64,
        complete: i64,
        nbytes: i64,
        kqd: Option<u32>,
        t0: i64,
        bin_ns: i64,
    ) {
        if kind < 2 {
            let k = kind as usize;
            if k == 0 {
                self.reads += 1;
            } else {
                self.writes += 1;
            }
            self.bytes[k] += nbytes;
            let bin = self.bin_of(complete, t0, bin_ns);
            match self.tl[k].get_mut(bin as usize) {
                Some(slot) if bin >= 0 => *slot += nbytes,
                _ => self.bad_bin = true,
            }
            let lat = complete - issue;
            self.lat_count += 1;
            self.lat_min = self.lat_min.min(lat);
            self.lat_max = self.lat_max.max(lat);
            self.lat_sum += lat as i128;
            self.lat_buckets[log_bucket(lat)] += 1;
            if let Some(l) = self.latency.as_mut() {
                l.push(lat);
            }
            self.sizes[pow2_bucket(nbytes)] += 1;
        }
        if counted {
            if let Some(q) = kqd {
                let q = q as usize;
                if q >= self.kqd.len() {
                    self.kqd.resize(q + 1, 0);
                }
                self.kqd[q] += 1;
                self.kqd_rows += 1;
            }
        }
    }

    fn into_dict(self, py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
        if self.bad_bin {
            return Err(PyValueError::new_err("count_rows: a completion outside the timeline"));
        }
        let d = PyDict::new(py);
        d.set_item("reads", self.reads)?;
        d.set_item("writes", self.writes)?;
        d.set_item("bytes_read", self.bytes[0])?;
        d.set_item("bytes_written", self.bytes[1])?;
        let [tl_r, tl_w] = self.tl;
        for (key, tl, rows) in [("tl_read", tl_r, self.reads), ("tl_write", tl_w, self.writes)] {
            if rows > 0 {
                // integer sums: the float64 bincount gives the same below 2^53 bytes per bin
                let f: Vec<f64> = tl.into_iter().map(|v| v as f64).collect();
                d.set_item(key, PyArray1::from_vec(py, f))?;
            } else {
                d.set_item(key, py.None())?;
            }
        }
        d.set_item("latency_count", self.lat_count)?;
        d.set_item("latency_min", self.lat_min)?;
        d.set_item("latency_max", self.lat_max)?;
        d.set_item("latency_sum", self.lat_sum)?;
        d.set_item("latency_buckets", PyArray1::from_vec(py, self.lat_buckets))?;
        match self.latency {
            Some(l) => d.set_item("latency", PyArray1::from_vec(py, l))?,
            None => d.set_item("latency", py.None())?,
        }
        d.set_item("size_counts", PyArray1::from_vec(py, self.sizes))?;
        if self.kqd_rows > 0 {
            d.set_item("kernel_qd", PyArray1::from_vec(py, self.kqd))?;
        } else {
            d.set_item("kernel_qd", py.None())?;
        }
        Ok(d)
    }
}

/// An Arrow type as pyarrow prints it (`str(pa.DataType)`), for the types of the trace schema.
fn pyarrow_type_name(t: &arrow_schema::DataType) -> String {
    use arrow_schema::DataType as T;
    match t {
        T::Dictionary(k, v) => {
            format!("dictionary<values={}, indices={}, ordered=0>", pyarrow_type_name(v), pyarrow_type_name(k))
        }
        T::Utf8 => "string".into(),
        T::Int8 => "int8".into(),
        T::Int16 => "int16".into(),
        T::Int32 => "int32".into(),
        T::Int64 => "int64".into(),
        T::UInt8 => "uint8".into(),
        T::UInt16 => "uint16".into(),
        T::UInt32 => "uint32".into(),
        T::UInt64 => "uint64".into(),
        other => format!("{other}"),
    }
}

/// The Rust writer's Arrow schema (`trainio_schema::arrow_schema()`): (column, type as
/// pyarrow prints it, nullable) in column order: the Python reader's columns
/// (`trainio_analysis.trace.schema.COLUMNS`) are built from it.
#[pyfunction]
fn schema_columns() -> Vec<(String, String, bool)> {
    trainio_schema::arrow_schema()
        .fields()
        .iter()
        .map(|f| (f.name().clone(), pyarrow_type_name(f.data_type()), f.is_nullable()))
        .collect()
}

/// The Rust reader's layers and their ops (`trainio_schema::Layer::ops`).
#[pyfunction]
fn layer_ops() -> Vec<(String, Vec<String>)> {
    trainio_schema::Layer::ALL
        .iter()
        .map(|l| (l.as_str().to_string(), l.ops().iter().map(|o| o.to_string()).collect()))
        .collect()
}

/// The storage layers, the ones an analysis characterizes (`trainio_schema::Layer::STORAGE`).
#[pyfunction]
fn storage_layers() -> Vec<&'static str> {
    trainio_schema::Layer::STORAGE.iter().map(|l| l.as_str()).collect()
}

/// Each layer's ops that count in its queue depth (`trainio_schema::Layer::qd_ops`).
#[pyfunction]
fn qd_ops() -> Vec<(&'static str, Vec<&'static str>)> {
    trainio_schema::Layer::ALL.iter().map(|l| (l.as_str(), l.qd_ops().to_vec())).collect()
}

/// The ops whose bytes are data transfers (`trainio_schema::DATA_OPS`).
#[pyfunction]
fn data_ops() -> Vec<&'static str> {
    trainio_schema::DATA_OPS.to_vec()
}

/// A metadata key without its prefix, how its value is written, and its default JSON.
type MetaKey = (&'static str, &'static str, Option<&'static str>);

/// The metadata keys (`trainio_schema::keys::ALL`) without their prefix, and how each value
/// is written: (key, `text` | `int` | `json`, the JSON a writer writes when not told, or None).
#[pyfunction]
fn metadata_keys() -> (&'static str, Vec<MetaKey>) {
    use trainio_schema::{keys, MetaValue};
    let all = keys::ALL.iter().map(|(k, v)| {
        let short = k.strip_prefix(keys::PREFIX).expect("every key has the prefix");
        match v {
            MetaValue::Text => (short, "text", None),
            MetaValue::Int => (short, "int", None),
            MetaValue::Json(default) => (short, "json", Some(*default)),
        }
    });
    (keys::PREFIX, all.collect())
}

/// The columns a minor version added (`trainio_schema::OPTIONAL_COLUMNS`): readers take
/// them as null when a trace lacks them.
#[pyfunction]
fn optional_columns() -> Vec<&'static str> {
    trainio_schema::OPTIONAL_COLUMNS.to_vec()
}

/// The version the Rust writer writes: (`trainio.schema_version`, `trainio.schema_minor`).
#[pyfunction]
fn schema_version() -> (u32, u32) {
    let number = |s: &str| s.parse().expect("the schema's version is a number");
    (number(trainio_schema::SCHEMA_VERSION), number(trainio_schema::SCHEMA_MINOR))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // the trace reader turns a Parquet decoder's panic on a corrupt file into the file's
    // one-line error (a ValueError here): no panic message on stderr besides
    trainio_schema::quiet_decoder_panics();
    m.add_function(wrap_pyfunction!(job_model::job_model, m)?)?;
    m.add_class::<job_model::ModelRows>()?;
    m.add_function(wrap_pyfunction!(schema_columns, m)?)?;
    m.add_function(wrap_pyfunction!(layer_ops, m)?)?;
    m.add_function(wrap_pyfunction!(schema_version, m)?)?;
    m.add_function(wrap_pyfunction!(optional_columns, m)?)?;
    m.add_function(wrap_pyfunction!(storage_layers, m)?)?;
    m.add_function(wrap_pyfunction!(qd_ops, m)?)?;
    m.add_function(wrap_pyfunction!(data_ops, m)?)?;
    m.add_function(wrap_pyfunction!(metadata_keys, m)?)?;
    m.add_function(wrap_pyfunction!(event_keys_sorted, m)?)?;
    m.add_function(wrap_pyfunction!(equal_issue_neighbours, m)?)?;
    m.add_function(wrap_pyfunction!(summarize, m)?)?;
    m.add_function(wrap_pyfunction!(count_rows, m)?)?;
    Ok(())
}
