//! Trace mode: each recorded process becomes a template for simulated GPUs.
//!
//! From the file layer of a trace (read through `trainio-schema`, the one Rust reader of
//! the format) we keep every successful read syscall with an offset, per process (pid):
//! its file, offset and size, in issue order. Steps are the analyzer's bursts: reads
//! separated by an idle gap (no read of that process in flight) of at least
//! `--burst-gap-ms` (default 10 ms, as `trainio analyze`). The gap after a burst is that
//! step's compute time (the analyzer reports the median of the same gaps); the last burst
//! gets the median. The process's read concurrency (largest per-process queue depth
//! recorded) becomes the simulated GPU's read_threads.
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
    pub samples: u32,
    pub compute_s: f64,
}

#[derive(Debug, Clone)]
pub struct Template {
    pub pid: u32,
    pub comm: String,
    /// Recorded path and the size its copy needs.
    pub files: Vec<(String, u64)>,
    pub steps: Vec<TemplateStep>,
    pub concurrency: usize,
    pub bytes: u64,
}

/// Reads the trace's file layer into templates, largest reader first. Processes that read
/// less than 1 % of the largest one's bytes (an interpreter loading its modules, a
/// shell) are left out.
pub fn load_templates(trace: &Path, burst_gap_ms: f64) -> Result<Vec<Template>, String> {
    let rows =
        read_rows(trace, Some(Layer::File)).map_err(|e| format!("{}: {e}", trace.display()))?;
    let mut by_pid: HashMap<u32, Vec<_>> = HashMap::new();
    for r in rows
        .into_iter()
        .filter(|r| &*r.op == "read" && r.error == 0 && r.bytes > 0 && r.offset.is_some())
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
    let mut templates: Vec<Template> = by_pid
        .into_iter()
        .map(|(pid, mut reads)| {
            reads.sort_by_key(|r| (r.issue_ns, r.complete_ns));
            let comm = reads[0].comm.to_string();
            let mut file_index: HashMap<String, usize> = HashMap::new();
            let mut files: Vec<(String, u64)> = Vec::new();
            let mut steps: Vec<TemplateStep> = Vec::new();
            let mut gaps: Vec<f64> = Vec::new();
            let mut busy_until = i64::MIN;
            let mut concurrency = 1usize;
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
                    if !steps.is_empty() {
                        gaps.push((r.issue_ns - busy_until) as f64 / 1e9);
                    }
                    steps.push(TemplateStep {
                        reads: Vec::new(),
                        samples: 0,
                        compute_s: 0.0,
                    });
                }
                let step = steps.last_mut().unwrap();
                step.reads.push(SampleRead {
                    file: fi as u32,
                    offset,
                    len,
                });
                step.samples += 1;
                busy_until = busy_until.max(r.complete_ns);
                concurrency = concurrency.max(r.queue_depth as usize);
                bytes += len;
            }
            let median = {
                let mut g = gaps.clone();
                g.sort_by(|a, b| a.partial_cmp(b).unwrap());
                g.get(g.len() / 2).copied().unwrap_or(0.0)
            };
            for (i, step) in steps.iter_mut().enumerate() {
                step.compute_s = gaps.get(i).copied().unwrap_or(median);
            }
            for f in &mut files {
                f.1 = round_up(f.1.max(1), ALIGN);
            }
            Template {
                pid,
                comm,
                files,
                steps,
                concurrency: concurrency.min(4096),
                bytes,
            }
        })
        .collect();
    templates.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.pid.cmp(&b.pid)));
    let largest = templates[0].bytes;
    templates.retain(|t| t.bytes * 100 >= largest);
    Ok(templates)
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
}
