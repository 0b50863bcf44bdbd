//! `trainio record --metrics-addr`: a live view of the recording as Prometheus text
//! metrics, computed from the rows the drain thread hands to the encoder (the same rows
//! the trace gets: no second set of probes, and no count that the trace would not show).
//!
//! Per layer and device: requests and bytes by op (counters: Prometheus' `rate()` gives
//! IOPS and throughput), the per-issue queue depth and the latency of data requests
//! (read, write) as histograms, and latency percentiles read off that histogram. Per
//! process of the file layer: requests and bytes by op. Per cgroup (a pod, a systemd unit,
//! a job's slice) and layer (file, block): data requests and bytes by op, the cgroup read
//! from `/proc/PID/cgroup` the first time a process's row arrives (a process gone by then
//! counts as `unknown`; a block request counts toward the process that issued it, which
//! for writeback is a kernel worker). Rows arrive in the encoder's
//! batches (at least once a second), so a scrape lags the kernel by about a second.
//!
//! The server is one thread that answers `GET /metrics` and closes each connection; it
//! lives as long as the recorder.
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int64Type, UInt32Type};
use arrow_array::{Array, RecordBatch};

/// Queue-depth buckets: 1, 2, 4, ... 1024 requests in flight (then +Inf).
const QD_BUCKETS: usize = 11;
/// Latency buckets: 1 µs × 2^k for k = 0..25 (1 µs to ~33.6 s, then +Inf).
const LAT_BUCKETS: usize = 26;
/// Processes of the file layer with series of their own; later ones are summed as "other".
const MAX_PROCESSES: usize = 256;
/// Cgroups with series of their own; later ones are summed as "other".
const MAX_CGROUPS: usize = 256;
/// The percentiles reported per device.
const QUANTILES: [f64; 4] = [0.5, 0.9, 0.99, 0.999];

#[derive(Clone, Default)]
struct DeviceSeries {
    /// op -> (requests, bytes)
    ops: BTreeMap<String, (u64, u64)>,
    /// Data requests (read, write) by per-issue queue depth and by latency; +Inf last.
    qd: [u64; QD_BUCKETS + 1],
    qd_sum: u64,
    lat: [u64; LAT_BUCKETS + 1],
    lat_sum_ns: u128,
}

impl DeviceSeries {
    fn data_requests(&self) -> u64 {
        self.qd.iter().sum()
    }

    /// The latency below which `q` of the data requests completed, in seconds: found in
    /// the histogram and interpolated geometrically within its bucket.
    fn latency_quantile(&self, q: f64) -> Option<f64> {
        let n = self.data_requests();
        if n == 0 {
            return None;
        }
        let rank = q * n as f64;
        let mut below = 0u64;
        for (k, &c) in self.lat.iter().enumerate() {
            if c > 0 && (below + c) as f64 >= rank {
                let upper = lat_bound_s(k);
                if k == LAT_BUCKETS {
                    return Some(lat_bound_s(LAT_BUCKETS - 1));
                }
                let lower = if k == 0 { upper / 2.0 } else { lat_bound_s(k - 1) };
                let frac = ((rank - below as f64) / c as f64).clamp(0.0, 1.0);
                return Some(lower * (upper / lower).powf(frac));
            }
            below += c;
        }
        None
    }
}

/// Upper bound of latency bucket `k`, in seconds.
fn lat_bound_s(k: usize) -> f64 {
    (1u64 << k) as f64 * 1e-6
}

/// The bucket of a latency in ns: the first k with latency ≤ 2^k µs.
fn lat_bucket(ns: i64) -> usize {
    let us = (ns.max(0) as u64).div_ceil(1000).max(1);
    (64 - (us - 1).leading_zeros() as usize).min(LAT_BUCKETS)
}

/// The bucket of a queue depth: the first k with qd ≤ 2^k.
fn qd_bucket(qd: u32) -> usize {
    let qd = qd.max(1);
    (32 - (qd - 1).leading_zeros() as usize).min(QD_BUCKETS)
}

/// What a scrape shows. The drain thread adds every batch; the server renders it.
#[derive(Default)]
pub struct LiveMetrics {
    /// (layer, dev) -> series; dev "" when the row has none.
    devices: BTreeMap<(String, String), DeviceSeries>,
    /// (pid, comm) -> op -> (requests, bytes), file layer.
    processes: BTreeMap<(String, String), BTreeMap<String, (u64, u64)>>,
    /// (cgroup, layer) -> op -> (requests, bytes), data requests of the file and block layers.
    cgroups: BTreeMap<(String, String), BTreeMap<String, (u64, u64)>>,
    /// pid -> its cgroup, read once.
    cgroup_of: std::collections::HashMap<u32, String>,
    /// layer -> rows.
    rows: BTreeMap<String, u64>,
    lost: BTreeMap<String, u64>,
    recording_s: f64,
}

impl LiveMetrics {
    /// Adds a batch of trace rows (the writer's schema: trainio_schema::arrow_schema).
    pub fn observe(&mut self, batch: &RecordBatch) {
        let n = batch.num_rows();
        if n == 0 {
            return;
        }
        let col = |name: &str| batch.column_by_name(name).expect("trace column");
        let (layer, op, dev, comm) = (col("layer"), col("op"), col("dev"), col("comm"));
        let issue = col("issue_ns").as_primitive::<Int64Type>().clone();
        let complete = col("complete_ns").as_primitive::<Int64Type>().clone();
        let bytes = col("bytes").as_primitive::<Int64Type>().clone();
        let qd = col("queue_depth").as_primitive::<UInt32Type>().clone();
        let pid = col("pid").as_primitive::<UInt32Type>().clone();
        // Decode each dictionary once per batch: rows index its values.
        let strings = |c: &dyn Array| -> (Vec<usize>, Vec<String>) {
            let d = c.as_any_dictionary();
            let values = d.values().as_string::<i32>();
            (d.normalized_keys(), (0..values.len()).map(|i| values.value(i).to_string()).collect())
        };
        let (layer_k, layer_v) = strings(layer.as_ref());
        let (op_k, op_v) = strings(op.as_ref());
        let (dev_k, dev_v) = strings(dev.as_ref());
        let (comm_k, comm_v) = strings(comm.as_ref());
        for i in 0..n {
            let layer = &layer_v[layer_k[i]];
            *self.rows.entry(layer.clone()).or_default() += 1;
            if layer == "proc" || layer == "ipc" {
                continue;
            }
            let op = &op_v[op_k[i]];
            let dev = if dev.is_null(i) { "" } else { dev_v[dev_k[i]].as_str() };
            let s = match self.devices.get_mut(&(layer.clone(), dev.to_string())) {
                Some(s) => s,
                None => self.devices.entry((layer.clone(), dev.to_string())).or_default(),
            };
            let b = bytes.value(i).max(0) as u64;
            let e = s.ops.entry(op.clone()).or_default();
            e.0 += 1;
            e.1 += b;
            let data = op == "read" || op == "write";
            if data {
                let q = qd.value(i);
                s.qd[qd_bucket(q)] += 1;
                s.qd_sum += q as u64;
                let lat = complete.value(i) - issue.value(i);
                s.lat[lat_bucket(lat)] += 1;
                s.lat_sum_ns += lat.max(0) as u128;
            }
            if data && (layer == "file" || layer == "block") {
                let cg = self.cgroup(pid.value(i));
                let key = (cg, layer.clone());
                let key = if self.cgroups.len() < MAX_CGROUPS || self.cgroups.contains_key(&key) {
                    key
                } else {
                    ("other".into(), layer.clone())
                };
                let e = self.cgroups.entry(key).or_default().entry(op.clone()).or_default();
                e.0 += 1;
                e.1 += b;
            }
            if layer == "file" && data {
                let key = (pid.value(i).to_string(), comm_v[comm_k[i]].clone());
                let key = if self.processes.len() < MAX_PROCESSES || self.processes.contains_key(&key) {
                    key
                } else {
                    ("other".into(), "other".into())
                };
                let e = self.processes.entry(key).or_default().entry(op.clone()).or_default();
                e.0 += 1;
                e.1 += b;
            }
        }
    }

    /// The cgroup of process `pid`: its cgroup v2 path (the `0::` line of
    /// /proc/PID/cgroup), else its v1 systemd or first hierarchy's, read once per pid;
    /// `unknown` when the process is gone.
    fn cgroup(&mut self, pid: u32) -> String {
        if let Some(c) = self.cgroup_of.get(&pid) {
            return c.clone();
        }
        let c = crate::host::cgroup_of(pid).unwrap_or_else(|| "unknown".into());
        // pids are reused: forget them all now and then rather than grow without bound.
        if self.cgroup_of.len() >= 65536 {
            self.cgroup_of.clear();
        }
        self.cgroup_of.insert(pid, c.clone());
        c
    }

    /// The recorder's own counters, as of the latest batch.
    pub fn set_status(&mut self, lost: BTreeMap<String, u64>, recording: Duration) {
        self.lost = lost;
        self.recording_s = recording.as_secs_f64();
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub fn render(&self) -> String {
        let mut o = String::new();
        let esc = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
        let _ = writeln!(o, "# HELP trainio_recording_seconds Seconds since the probes were attached.");
        let _ = writeln!(o, "# TYPE trainio_recording_seconds gauge");
        let _ = writeln!(o, "trainio_recording_seconds {}", self.recording_s);
        let _ = writeln!(o, "# HELP trainio_rows_total Trace rows recorded, by layer.");
        let _ = writeln!(o, "# TYPE trainio_rows_total counter");
        for (layer, n) in &self.rows {
            let _ = writeln!(o, "trainio_rows_total{{layer=\"{layer}\"}} {n}");
        }
        let _ =
            writeln!(o, "# HELP trainio_lost_events_total Events lost, by probe and cause (0: the trace is complete).");
        let _ = writeln!(o, "# TYPE trainio_lost_events_total counter");
        for (probe, n) in &self.lost {
            let _ = writeln!(o, "trainio_lost_events_total{{probe=\"{}\"}} {n}", esc(probe));
        }
        let _ = writeln!(o, "# HELP trainio_requests_total Requests by layer, device and op (rate(): IOPS).");
        let _ = writeln!(o, "# TYPE trainio_requests_total counter");
        for ((layer, dev), s) in &self.devices {
            for (op, (n, _)) in &s.ops {
                let _ = writeln!(o, "trainio_requests_total{{layer=\"{layer}\",dev=\"{}\",op=\"{op}\"}} {n}", esc(dev));
            }
        }
        let _ = writeln!(o, "# HELP trainio_bytes_total Bytes by layer, device and op (rate(): throughput).");
        let _ = writeln!(o, "# TYPE trainio_bytes_total counter");
        for ((layer, dev), s) in &self.devices {
            for (op, (_, b)) in &s.ops {
                let _ = writeln!(o, "trainio_bytes_total{{layer=\"{layer}\",dev=\"{}\",op=\"{op}\"}} {b}", esc(dev));
            }
        }
        let _ = writeln!(o, "# HELP trainio_queue_depth Per-issue queue depth of data requests (read, write).");
        let _ = writeln!(o, "# TYPE trainio_queue_depth histogram");
        for ((layer, dev), s) in &self.devices {
            let labels = format!("layer=\"{layer}\",dev=\"{}\"", esc(dev));
            let mut cum = 0;
            for k in 0..QD_BUCKETS {
                cum += s.qd[k];
                let _ = writeln!(o, "trainio_queue_depth_bucket{{{labels},le=\"{}\"}} {cum}", 1u64 << k);
            }
            let _ = writeln!(o, "trainio_queue_depth_bucket{{{labels},le=\"+Inf\"}} {}", s.data_requests());
            let _ = writeln!(o, "trainio_queue_depth_sum{{{labels}}} {}", s.qd_sum);
            let _ = writeln!(o, "trainio_queue_depth_count{{{labels}}} {}", s.data_requests());
        }
        let _ = writeln!(o, "# HELP trainio_latency_seconds Latency (issue to completion) of data requests.");
        let _ = writeln!(o, "# TYPE trainio_latency_seconds histogram");
        for ((layer, dev), s) in &self.devices {
            let labels = format!("layer=\"{layer}\",dev=\"{}\"", esc(dev));
            let mut cum = 0;
            for k in 0..LAT_BUCKETS {
                cum += s.lat[k];
                let _ = writeln!(o, "trainio_latency_seconds_bucket{{{labels},le=\"{}\"}} {cum}", lat_bound_s(k));
            }
            let _ = writeln!(o, "trainio_latency_seconds_bucket{{{labels},le=\"+Inf\"}} {}", s.data_requests());
            let _ = writeln!(o, "trainio_latency_seconds_sum{{{labels}}} {}", s.lat_sum_ns as f64 / 1e9);
            let _ = writeln!(o, "trainio_latency_seconds_count{{{labels}}} {}", s.data_requests());
        }
        let _ = writeln!(
            o,
            "# HELP trainio_latency_quantile_seconds Latency percentiles of data requests since the start, \
             from the histogram."
        );
        let _ = writeln!(o, "# TYPE trainio_latency_quantile_seconds gauge");
        for ((layer, dev), s) in &self.devices {
            for q in QUANTILES {
                if let Some(v) = s.latency_quantile(q) {
                    let _ = writeln!(
                        o,
                        "trainio_latency_quantile_seconds{{layer=\"{layer}\",dev=\"{}\",quantile=\"{q}\"}} {v}",
                        esc(dev)
                    );
                }
            }
        }
        // Counters by op, per cgroup and per process: each series' labels and its ops.
        type Ops = BTreeMap<String, (u64, u64)>;
        let cgroups: Vec<(String, &Ops)> = self
            .cgroups
            .iter()
            .map(|((cg, layer), ops)| (format!("cgroup=\"{}\",layer=\"{layer}\"", esc(cg)), ops))
            .collect();
        let processes: Vec<(String, &Ops)> = self
            .processes
            .iter()
            .map(|((pid, comm), ops)| (format!("pid=\"{pid}\",comm=\"{}\"", esc(comm)), ops))
            .collect();
        for (family, what, series) in [
            ("trainio_cgroup", "by the issuing process's cgroup, per layer", &cgroups),
            ("trainio_process", "by process, file layer", &processes),
        ] {
            for (name, help, bytes) in
                [("requests", "Reads and writes", false), ("bytes", "Bytes read and written", true)]
            {
                let _ = writeln!(o, "# HELP {family}_{name}_total {help} {what}.");
                let _ = writeln!(o, "# TYPE {family}_{name}_total counter");
                for (labels, ops) in series {
                    for (op, (n, b)) in *ops {
                        let v = if bytes { b } else { n };
                        let _ = writeln!(o, "{family}_{name}_total{{{labels},op=\"{op}\"}} {v}");
                    }
                }
            }
        }
        o
    }
}

/// Listens on `addr` (checked before anything is loaded: a bad or busy address is bad
/// input), then serves `metrics` from a thread of its own.
pub fn listen(addr: &str) -> Result<TcpListener, String> {
    let parsed: SocketAddr = addr
        .parse()
        .map_err(|_| format!("--metrics-addr {addr:?}: not an address like 127.0.0.1:9464 or [::]:9464"))?;
    TcpListener::bind(parsed).map_err(|e| format!("--metrics-addr {addr}: cannot listen ({e})"))
}

pub fn serve(listener: TcpListener, metrics: Arc<Mutex<LiveMetrics>>) {
    let _ = std::thread::Builder::new().name("trainio-metrics".into()).spawn(move || {
        for stream in listener.incoming().flatten() {
            let _ = answer(stream, &metrics);
        }
    });
}

fn answer(mut stream: TcpStream, metrics: &Mutex<LiveMetrics>) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    // The request line is all that matters; read until the end of the head (or 8 KiB).
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, body) = match (method, path.split('?').next().unwrap_or("")) {
        ("GET", "/metrics") => {
            let text = metrics.lock().unwrap_or_else(|p| p.into_inner()).render();
            ("200 OK", text)
        }
        ("GET", "/") => ("200 OK", "trainio record: metrics at /metrics\n".to_string()),
        ("GET", _) => ("404 Not Found", "not found: try /metrics\n".to_string()),
        _ => ("405 Method Not Allowed", "only GET\n".to_string()),
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(reply.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::cgroup_path;
    use trainio_schema::{BatchBuilder, Layer, Row};

    fn row(op: &'static str, dev: Option<&'static str>, qd: u32, lat: i64, bytes: i64) -> Row<'static> {
        Row {
            layer: Layer::Block,
            op,
            issue_ns: 1000,
            complete_ns: 1000 + lat,
            insert_ns: None,
            dev,
            offset: Some(0),
            bytes,
            bytes_requested: bytes,
            queue_depth: qd,
            pid: 7,
            tid: 7,
            comm: "fio",
            fd: None,
            file: None,
            error: 0,
            flags: 0,
            ppid: None,
        }
    }

    #[test]
    fn buckets_hold_their_upper_bounds() {
        assert_eq!(
            (qd_bucket(0), qd_bucket(1), qd_bucket(2), qd_bucket(3), qd_bucket(32), qd_bucket(33)),
            (0, 0, 1, 2, 5, 6)
        );
        assert_eq!(qd_bucket(u32::MAX), QD_BUCKETS);
        assert_eq!(
            (lat_bucket(0), lat_bucket(1000), lat_bucket(1001), lat_bucket(2000), lat_bucket(4_096_000)),
            (0, 0, 1, 1, 12)
        );
        // 4.096 ms is 2^12 µs, the upper bound of bucket 12; a ns more is bucket 13.
        assert_eq!(lat_bucket(4_096_001), 13);
        assert_eq!(lat_bucket(i64::MAX), LAT_BUCKETS);
    }

    #[test]
    fn requests_count_toward_the_issuing_process_cgroup() {
        assert_eq!(
            cgroup_path("0::/kubepods.slice/pod1/cri-x.scope\n").as_deref(),
            Some("/kubepods.slice/pod1/cri-x.scope")
        );
        let v1 = "12:blkio:/\n1:name=systemd:/system.slice/train.service\n";
        assert_eq!(cgroup_path(v1).as_deref(), Some("/system.slice/train.service"));
        // Hybrid: v2 at the root, the job below v1's blkio.
        let hybrid = "7:blkio:/job-1\n4:memory:/other\n1:name=systemd:/\n0::/\n";
        assert_eq!(cgroup_path(hybrid).as_deref(), Some("/job-1"));
        assert_eq!(cgroup_path("1:name=systemd:/\n0::/\n").as_deref(), Some("/"));
        assert_eq!(cgroup_path(""), None);
        // This process's rows: its own cgroup; a pid that cannot exist: unknown.
        let own = cgroup_path(&std::fs::read_to_string("/proc/self/cgroup").unwrap()).unwrap();
        let me = std::process::id();
        let mut b = BatchBuilder::new();
        for _ in 0..3 {
            b.push(&Row { pid: me, ..row("read", Some("7:0"), 1, 100, 4096) });
        }
        b.push(&Row { pid: me, layer: Layer::File, ..row("write", Some("7:0"), 1, 100, 512) });
        b.push(&Row { pid: u32::MAX, ..row("read", Some("7:0"), 1, 100, 4096) });
        b.push(&Row { pid: me, ..row("flush", Some("7:0"), 1, 100, 0) });
        let mut m = LiveMetrics::default();
        m.observe(&b.finish());
        let text = m.render();
        let has = |line: String| assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        has(format!("trainio_cgroup_requests_total{{cgroup=\"{own}\",layer=\"block\",op=\"read\"}} 3"));
        has(format!("trainio_cgroup_bytes_total{{cgroup=\"{own}\",layer=\"block\",op=\"read\"}} 12288"));
        has(format!("trainio_cgroup_bytes_total{{cgroup=\"{own}\",layer=\"file\",op=\"write\"}} 512"));
        has("trainio_cgroup_requests_total{cgroup=\"unknown\",layer=\"block\",op=\"read\"} 1".into());
        // Only data requests count: no cgroup series of the flush.
        assert!(!text.lines().any(|l| l.starts_with("trainio_cgroup_") && l.contains("op=\"flush\"")), "{text}");
    }

    #[test]
    fn counts_histograms_and_quantiles_follow_the_rows() {
        let mut b = BatchBuilder::new();
        // 90 reads of 4 KiB at QD 32 taking 100 µs, 10 at QD 1 taking 10 ms; a flush.
        for _ in 0..90 {
            b.push(&row("read", Some("7:0"), 32, 100_000, 4096));
        }
        for _ in 0..10 {
            b.push(&row("read", Some("7:0"), 1, 10_000_000, 4096));
        }
        b.push(&row("flush", Some("7:0"), 1, 5, 0));
        let mut m = LiveMetrics::default();
        m.observe(&b.finish());
        let text = m.render();
        let has = |line: &str| assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        has("trainio_requests_total{layer=\"block\",dev=\"7:0\",op=\"read\"} 100");
        has("trainio_requests_total{layer=\"block\",dev=\"7:0\",op=\"flush\"} 1");
        has("trainio_bytes_total{layer=\"block\",dev=\"7:0\",op=\"read\"} 409600");
        has("trainio_queue_depth_bucket{layer=\"block\",dev=\"7:0\",le=\"16\"} 10");
        has("trainio_queue_depth_bucket{layer=\"block\",dev=\"7:0\",le=\"32\"} 100");
        has("trainio_queue_depth_count{layer=\"block\",dev=\"7:0\"} 100");
        has("trainio_rows_total{layer=\"block\"} 101");
        let s = &m.devices[&("block".to_string(), "7:0".to_string())];
        // p50 within the 100 µs bucket (64-128 µs), p99 within the 10 ms one (8.2-16.4 ms).
        let p50 = s.latency_quantile(0.5).unwrap();
        let p99 = s.latency_quantile(0.99).unwrap();
        assert!((64e-6..=128e-6).contains(&p50), "{p50}");
        assert!((8.192e-3..=16.384e-3).contains(&p99), "{p99}");
    }
}
