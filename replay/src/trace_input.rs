//! Trace mode: each recorded process becomes a template for simulated GPUs.
//!
//! From the file layer of a trace (read through `trainio-schema`, the one Rust reader of
//! the format) we keep every successful read syscall with an offset, per process (pid):
//! its file, offset and size, in issue order. Steps are the analyzer's bursts: reads
//! separated by an idle gap (no read of that process in flight) of at least
//! `--burst-gap-ms` (default 10 ms, as `trainio analyze`).
//!
//! A step's compute time is the recorded step period: from its burst's first read to the
//! next burst's first read (the last burst gets the median period). A data loader reads
//! step k+1 while the accelerator computes step k, so the idle gap after a burst is the
//! period minus the read time: taking the gap as the compute and prefetching too would
//! replay every step a burst's read time too early. With the period, and the next burst
//! started when the GPU takes the current one (a prefetch window of one burst, trace
//! mode's default), a replay on the same storage keeps the recorded pace.
//!
//! Reads keep their recorded threads: each thread (tid) of the process that read is one
//! reader of the simulated GPU, and issues its reads one at a time in recorded order, as
//! the blocking syscalls were. So the replay puts the recorded per-process concurrency on
//! storage, burst by burst (one loader worker reading a batch is QD 1, not the process's
//! peak).
//!
//! Simulated GPU g replays template g mod T (round-robin) on its own copy of the
//! template's files, `trace/gpuNNNNN/fNNNNN.dat` under --data-dir, sized to the largest
//! byte read, so no two simulated GPUs share data.

use crate::dataset::{round_up, DataFile, Layout, ALIGN};
use crate::engine::{Batch, Program, SampleRead};
use anyhow::Result;
use rand::rngs::StdRng;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use trainio_schema::{read_rows, Layer};

#[derive(Debug, Clone)]
pub struct TemplateStep {
    /// `file` is the index into the template's files.
    pub reads: Vec<SampleRead>,
    /// Per read: the reader (recorded thread, numbered in order of first read) issuing it.
    pub streams: Vec<u32>,
    pub samples: u32,
    pub compute_s: f64,
    /// When the burst's first read was issued, ns after the first read of the trace (of
    /// any template).
    pub start_ns: u64,
}

#[derive(Debug, Clone)]
pub struct Template {
    pub pid: u32,
    pub comm: String,
    /// Recorded path and the size its copy needs.
    pub files: Vec<(String, u64)>,
    pub steps: Vec<TemplateStep>,
    /// Readers: the threads of the process that read (at most MAX_READERS; beyond that
    /// threads share readers).
    pub concurrency: usize,
    pub bytes: u64,
    /// The device (`MAJ:MIN`) whose reads were kept, when the trace names devices.
    pub dev: Option<String>,
}

/// Most readers one simulated GPU gets from a template.
pub const MAX_READERS: usize = 4096;

/// Reads the trace's file layer into templates, largest reader first. Only reads of the
/// device most bytes were read from count (see `Template::dev`). Processes that read
/// less than 1 % of the largest one's bytes (an interpreter loading its modules, a
/// shell) are left out.
pub fn load_templates(trace: &Path, burst_gap_ms: f64) -> Result<Vec<Template>, String> {
    let rows =
        read_rows(trace, Some(Layer::File)).map_err(|e| format!("{}: {e}", trace.display()))?;
    // A process is named by its main thread (tid = pid) when that shows up in any row.
    let mut main_comm: HashMap<u32, std::sync::Arc<str>> = HashMap::new();
    for r in rows.iter().filter(|r| r.tid == r.pid) {
        main_comm.entry(r.pid).or_insert_with(|| r.comm.clone());
    }
    let reads: Vec<_> = rows
        .into_iter()
        .filter(|r| &*r.op == "read" && r.error == 0 && r.bytes > 0 && r.offset.is_some())
        .collect();
    // The storage under study: the device the most bytes were read from. Reads of other
    // devices (shared libraries, /proc, configuration files) are start-up noise that
    // would add steps of their own; reads whose device is unknown are kept.
    let mut per_dev: HashMap<&str, u64> = HashMap::new();
    for r in &reads {
        if let Some(d) = &r.dev {
            *per_dev.entry(d).or_default() += r.bytes as u64;
        }
    }
    let dev: Option<String> = per_dev
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(a.0)))
        .map(|(d, _)| d.to_string());
    let mut by_pid: HashMap<u32, Vec<_>> = HashMap::new();
    for r in reads
        .into_iter()
        .filter(|r| dev.is_none() || r.dev.is_none() || r.dev.as_deref() == dev.as_deref())
    {
        by_pid.entry(r.pid).or_default().push(r);
    }
    if by_pid.is_empty() {
        return Err(format!(
            "{}: no file-layer reads in this trace (record with the file layer to replay it)",
            trace.display()
        ));
    }
    let gap_ns = (burst_gap_ms * 1e6) as i64;
    // One time origin for every template: the processes' bursts keep their offsets to
    // each other (a job's ranks read together after each step's barrier).
    let origin = by_pid
        .values()
        .flat_map(|rs| rs.iter().map(|r| r.issue_ns))
        .min()
        .unwrap_or(0);
    let mut templates: Vec<Template> = by_pid
        .into_iter()
        .map(|(pid, mut reads)| {
            reads.sort_by_key(|r| (r.issue_ns, r.complete_ns));
            let comm = main_comm.get(&pid).unwrap_or(&reads[0].comm).to_string();
            let mut file_index: HashMap<String, usize> = HashMap::new();
            let mut files: Vec<(String, u64)> = Vec::new();
            let mut steps: Vec<TemplateStep> = Vec::new();
            let mut starts: Vec<i64> = Vec::new();
            let mut busy_until = i64::MIN;
            let mut tids: HashMap<u32, u32> = HashMap::new();
            let mut bytes = 0u64;
            for r in &reads {
                let name = match (&r.file, r.fd) {
                    (Some(f), _) => f.to_string(),
                    (None, fd) => format!("<fd {}>", fd.unwrap_or(-1)),
                };
                let next = files.len();
                let fi = *file_index.entry(name.clone()).or_insert(next);
                if fi == files.len() {
                    files.push((name, 0));
                }
                let offset = r.offset.unwrap().max(0) as u64;
                let len = r.bytes as u64;
                files[fi].1 = files[fi].1.max(offset + len);
                if steps.is_empty() || (busy_until != i64::MIN && r.issue_ns - busy_until >= gap_ns)
                {
                    starts.push(r.issue_ns);
                    steps.push(TemplateStep {
                        reads: Vec::new(),
                        streams: Vec::new(),
                        samples: 0,
                        compute_s: 0.0,
                        start_ns: (r.issue_ns - origin).max(0) as u64,
                    });
                }
                let next_stream = tids.len() as u32;
                let stream = *tids.entry(r.tid).or_insert(next_stream);
                let step = steps.last_mut().unwrap();
                step.reads.push(SampleRead {
                    file: fi as u32,
                    offset,
                    len,
                });
                step.streams.push(stream % MAX_READERS as u32);
                step.samples += 1;
                busy_until = busy_until.max(r.complete_ns);
                bytes += len;
            }
            let periods = step_periods(&starts);
            let median = {
                let mut g = periods.clone();
                g.sort_by(|a, b| a.partial_cmp(b).unwrap());
                g.get(g.len() / 2).copied().unwrap_or(0.0)
            };
            for (i, step) in steps.iter_mut().enumerate() {
                step.compute_s = periods.get(i).copied().unwrap_or(median);
            }
            for f in &mut files {
                f.1 = round_up(f.1.max(1), ALIGN);
            }
            Template {
                pid,
                comm,
                files,
                steps,
                concurrency: tids.len().clamp(1, MAX_READERS),
                bytes,
                dev: dev.clone(),
            }
        })
        .collect();
    templates.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.pid.cmp(&b.pid)));
    let largest = templates[0].bytes;
    templates.retain(|t| t.bytes * 100 >= largest);
    Ok(templates)
}

/// Step periods from the bursts' start times (ns): start(k+1) - start(k), in seconds.
fn step_periods(starts: &[i64]) -> Vec<f64> {
    starts
        .windows(2)
        .map(|w| (w[1] - w[0]) as f64 / 1e9)
        .collect()
}

/// Where simulated GPU `g`'s copies of its template's files live, and their sizes.
pub fn layout(templates: &[Template], gpus: u64, root: &Path) -> Layout {
    let mut files = Vec::new();
    for g in 0..gpus {
        let t = &templates[(g % templates.len() as u64) as usize];
        for (j, (_, size)) in t.files.iter().enumerate() {
            files.push(DataFile {
                rel: PathBuf::from(format!("trace/gpu{g:05}/f{j:05}.dat")),
                size: *size,
            });
        }
    }
    Layout {
        root: root.to_path_buf(),
        files,
        samples_per_file: 1,
        description: "trace replay".into(),
    }
}

/// Settings of a trace replay that do not come from the trace.
pub struct TraceOptions {
    pub epochs: u64,
    /// Cap on steps per epoch (0 = none).
    pub max_steps: u64,
    pub compute_override: Option<f64>,
    pub prefetch_size: usize,
}

pub struct TraceProgram {
    templates: Vec<Template>,
    layout: Layout,
    /// Per local GPU: template index and the index of its first file in the layout.
    local: Vec<(usize, usize)>,
    pub steps_per_epoch: u64,
    epochs: u64,
    compute_override: Option<f64>,
    prefetch_size: usize,
    max_request: u64,
}

impl TraceProgram {
    pub fn new(
        templates: Vec<Template>,
        layout: Layout,
        gpus: u64,
        local_gpus: &[u64],
        opts: TraceOptions,
    ) -> TraceProgram {
        let TraceOptions {
            epochs,
            max_steps,
            compute_override,
            prefetch_size,
        } = opts;
        let t_of = |g: u64| (g % templates.len() as u64) as usize;
        let mut first_file = Vec::with_capacity(gpus as usize);
        let mut next = 0usize;
        for g in 0..gpus {
            first_file.push(next);
            next += templates[t_of(g)].files.len();
        }
        let local: Vec<(usize, usize)> = local_gpus
            .iter()
            .map(|&g| (t_of(g), first_file[g as usize]))
            .collect();
        // Every GPU runs the same number of steps (the barrier needs it): the longest
        // template's; shorter templates end with empty steps.
        let used = (gpus as usize).min(templates.len());
        let mut steps = templates[..used]
            .iter()
            .map(|t| t.steps.len() as u64)
            .max()
            .unwrap_or(0);
        if max_steps > 0 {
            steps = steps.min(max_steps);
        }
        let max_request = templates
            .iter()
            .flat_map(|t| t.steps.iter().flat_map(|s| s.reads.iter().map(|r| r.len)))
            .max()
            .unwrap_or(1);
        TraceProgram {
            templates,
            layout,
            local,
            steps_per_epoch: steps,
            epochs,
            compute_override,
            prefetch_size,
            max_request,
        }
    }

    pub fn templates(&self) -> &[Template] {
        &self.templates
    }
}

impl Program for TraceProgram {
    fn epochs(&self) -> u64 {
        self.epochs
    }

    fn steps_per_epoch(&self) -> u64 {
        self.steps_per_epoch
    }

    fn batch(&self, gpu: usize, _epoch: u64, step: u64) -> Batch {
        let (t, base) = self.local[gpu];
        match self.templates[t].steps.get(step as usize) {
            Some(s) => Batch {
                samples: s.samples,
                streams: s.streams.clone(),
                reads: s
                    .reads
                    .iter()
                    .map(|r| SampleRead {
                        file: (base + r.file as usize) as u32,
                        ..*r
                    })
                    .collect(),
            },
            None => Batch::default(),
        }
    }

    fn compute_seconds(&self, gpu: usize, _epoch: u64, step: u64, _rng: &mut StdRng) -> f64 {
        if let Some(c) = self.compute_override {
            return c;
        }
        let (t, _) = self.local[gpu];
        self.templates[t]
            .steps
            .get(step as usize)
            .map(|s| s.compute_s)
            .unwrap_or(0.0)
    }

    fn path(&self, file: u32) -> PathBuf {
        self.layout.path(file as usize)
    }

    fn read_threads(&self, gpu: usize) -> usize {
        self.templates[self.local[gpu].0].concurrency
    }

    fn prefetch_size(&self, _gpu: usize) -> usize {
        self.prefetch_size
    }

    fn max_request(&self) -> u64 {
        self.max_request
    }

    fn recorded(&self) -> bool {
        true
    }

    /// Bursts start at their recorded times after the epoch's start (or later, when the
    /// GPU is behind); not with --computation-time, which replaces the recorded pace.
    fn not_before_ns(&self, gpu: usize, _epoch: u64, step: u64) -> Option<u64> {
        if self.compute_override.is_some() {
            return None;
        }
        let (t, _) = self.local[gpu];
        self.templates[t].steps.get(step as usize).map(|s| s.start_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use trainio_schema::{BatchBuilder, Row, SegmentLimits, TraceWriter};

    const MS: i64 = 1_000_000;

    #[allow(clippy::too_many_arguments)]
    fn read<'a>(
        pid: u32,
        tid: u32,
        comm: &'a str,
        dev: &'a str,
        file: &'a str,
        offset: i64,
        issue: i64,
        dur: i64,
    ) -> Row<'a> {
        Row {
            layer: Layer::File,
            op: "read",
            issue_ns: issue,
            complete_ns: issue + dur,
            insert_ns: None,
            dev: Some(dev),
            offset: Some(offset),
            bytes: 4096,
            bytes_requested: 4096,
            queue_depth: 1,
            pid,
            tid,
            comm,
            fd: Some(3),
            file: Some(file),
            error: 0,
            flags: 0,
            ppid: None,
        }
    }

    fn write_trace(rows: &[Row]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "trainio-trace-input-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut b = BatchBuilder::new();
        for r in rows {
            b.push(r);
        }
        let mut w = TraceWriter::new(
            &dir,
            SegmentLimits {
                max_bytes: 1 << 30,
                max_age: Duration::from_secs(3600),
            },
        );
        w.open().unwrap();
        w.write(&b.finish()).unwrap();
        w.close_segment(&[("trainio.schema_version".into(), "1".into())])
            .unwrap();
        dir
    }

    /// Two loader threads of one process on the data device, its main thread reading a
    /// library on another device. Bursts at 0 and 50 ms (each 4 ms long: gaps 46 ms).
    #[test]
    fn streams_periods_and_the_data_device() {
        let t0 = 1_000 * MS;
        let rows = vec![
            read(10, 10, "train", "254:0", "/lib/libc.so", 0, t0 - 5 * MS, MS / 10),
            read(10, 11, "worker", "7:1", "/d/a", 0, t0, 2 * MS),
            read(10, 12, "worker", "7:1", "/d/b", 0, t0 + MS / 10, 2 * MS),
            read(10, 11, "worker", "7:1", "/d/a", 4096, t0 + 2 * MS, 2 * MS),
            read(10, 12, "worker", "7:1", "/d/b", 4096, t0 + 50 * MS, 4 * MS),
        ];
        let dir = write_trace(&rows);
        let t = load_templates(&dir, 10.0).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(t.len(), 1);
        let t = &t[0];
        assert_eq!(t.dev.as_deref(), Some("7:1"), "the device most bytes came from");
        assert_eq!(t.comm, "train", "named by its main thread");
        assert_eq!(t.files.len(), 2, "the library read on 254:0 is left out");
        assert_eq!(t.concurrency, 2, "two threads read");
        assert_eq!(t.steps.len(), 2);
        // tid 11 is reader 0 (first to read), tid 12 reader 1; order kept.
        assert_eq!(t.steps[0].streams, vec![0, 1, 0]);
        assert_eq!(t.steps[1].streams, vec![1]);
        // The step period (burst start to burst start), not the 46 ms idle gap; the last
        // step gets the median period.
        assert!((t.steps[0].compute_s - 0.050).abs() < 1e-9);
        assert!((t.steps[1].compute_s - 0.050).abs() < 1e-9);
        // Start times from the first kept read.
        assert_eq!(t.steps[0].start_ns, 0);
        assert_eq!(t.steps[1].start_ns, 50 * MS as u64);
    }
}
