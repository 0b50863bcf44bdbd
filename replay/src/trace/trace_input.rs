//! Trace mode: each GPU of the trace's job model becomes a template for simulated GPUs.
//!
//! The job model (crate `trainio-model`, the same one `trainio analyze` prints) groups a
//! rank and its DataLoader workers into one GPU, splits its reads into steps (batches),
//! and infers the compute time per step. A template replays that GPU: its steps' reads,
//! each by the reader (worker, or recorded thread) that made it, one read at a time per
//! reader as the blocking syscalls were; its compute time after each step; and its
//! loader: workers reading up to `prefetch_batches` ahead (PyTorch's prefetch_factor 2
//! per worker), or, for a rank that read its batches itself, each batch read only when
//! the GPU asks for it. A worker spends its recorded time outside its reads on each
//! batch (the model's `worker_cpu_s`: decoding, collating) where it spent it: after each
//! read, the time it took before its next read of the batch or its handoff
//! (`Read::cpu_after_ns`), so a decode-bound loader feeds the GPU at its recorded pace.
//! Batches the workers read ahead that the GPU never took (the model's untaken steps, of a job that
//! stopped at a step count) are read in the last epoch as the job read them, beside its
//! last steps, with no compute: the GPU computes its taken steps, and the run ends when
//! the last one's compute does (`Program::untaken_batches`). The replay is closed-loop: steps are paced by the compute time
//! and the storage under test, not by the recorded clock, so a faster or slower storage
//! shows in AU.
//!
//! Simulated GPU g replays template g mod T (round-robin). The files are the job's: each
//! distinct file the templates read (by recorded path) is laid out once per *copy*,
//! `trace/cCCCCC/fDDDDD.dat` under --data-dir, sized to the largest byte any template read
//! from it, and the GPUs of a copy share it as the recorded GPUs shared the file. GPUs
//! 0..T read copy 0, GPUs T..2T copy 1, and so on (Placement): the recorded GPU count
//! reads the job's data once, twice as many GPUs read twice the bytes, each copy from its
//! own files, so the page cache does not serve one copy's reads from another's.
//! In place (`--map-path OLD=NEW`) every GPU reads the job's own files, mapped to where a
//! copy of them is: nothing is generated, and the files must hold every byte read.
//!
//! A job that read its samples from an object store (the model's GETs, schema 1.8) is
//! laid out the same way, each copy of an object under its recorded `bucket/key`
//! (`trace/c00000/train/a/s0.bin`): with `--storage-root` the copies are objects in that
//! bucket, read as the job's requests were (whole, or the recorded byte range), else
//! files under --data-dir.
//!
//! A template also carries its GPU's write bursts (the model's `write_bursts` placed in
//! its steps): simulated GPU g writes them after the same step, to its own copies of the
//! written files, `trace/gpuNNNNN/wNNNNN.dat` under --data-dir, with the same offsets,
//! lengths and syncs (trace_writes.rs). Bursts before the GPU's first batch (an
//! interpreter's caches, set-up) are not replayed. The objects it put go where its copy
//! of the data is, under their recorded `bucket/key` (`trace/c00000/ckpt/model.pt`): to
//! the bucket of `--storage-root`, else as files under --data-dir.

use crate::dataset::{DataFile, Layout};
use crate::engine::{Batch, Program, SampleRead};
use rand::rngs::StdRng;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use trainio_model::writes::WriteOp;
use trainio_model::{infer_trace, JobModel, Options};

#[derive(Debug, Clone)]
pub struct TemplateStep {
    /// `file` is the index into the template's files.
    pub reads: Vec<SampleRead>,
    /// Per read: the reader (worker or recorded thread) issuing it.
    pub streams: Vec<u32>,
    pub samples: u32,
    pub compute_s: f64,
    /// Paced templates: when the burst's first read was issued, ns after the first read
    /// of the trace (of any template).
    pub start_ns: u64,
}

#[derive(Debug, Clone)]
pub struct Template {
    /// The host the GPU was recorded on (a trace set), None for one trace.
    pub host: Option<String>,
    /// The rank's pid in the recording.
    pub pid: u32,
    pub comm: String,
    /// Recorded path and the size its copy needs.
    pub files: Vec<(String, u64)>,
    /// The GPU's batches: the `taken` it computed on, then those read ahead and never taken.
    pub steps: Vec<TemplateStep>,
    pub taken: usize,
    /// Readers: the GPU's workers (or the threads that read).
    pub concurrency: usize,
    pub workers: usize,
    /// The rank reads each batch itself when it asks for it (no worker reads ahead).
    pub synchronous: bool,
    /// Loader threads read ahead: bursts start no earlier than their recorded times.
    pub paced: bool,
    /// Batches the workers may have started that the GPU has not taken.
    pub prefetch: usize,
    pub bytes: u64,
    pub compute_s: f64,
    /// Time the GPU spends taking each batch (model's handoff_s).
    pub handoff_s: f64,
    /// The collective's own time per step (model's sync_s), spent after the compute.
    pub sync_s: f64,
    /// The data device (`MAJ:MIN`) whose reads were kept, when the trace names devices.
    pub dev: Option<String>,
    /// Write bursts by the step (1-based) after which they were made.
    pub write_bursts: BTreeMap<u64, Vec<WriteOp>>,
    /// Recorded path of each written file (WriteOp::file indexes it).
    pub write_files: Vec<String>,
    /// The model's throughput need of this GPU, MiB/s (bytes per step / compute).
    pub required_mib_s: Option<f64>,
    /// The rank's own reads and readahead advice before its first batch (the model's
    /// `setup`), done before the run (TraceProgram::prepare).
    pub setup: Vec<SampleRead>,
    /// The model's `setup_lead_s`: the setup's first row to the first batch's first read.
    pub setup_lead_s: f64,
}

impl Template {
    /// The GPU's data came from an object store: its files are objects, named `bucket/key`.
    pub fn objects(&self) -> bool {
        self.dev.as_deref().and_then(trainio_model::object_reads::store_of).is_some()
    }

    /// The steps the GPU took and computed on.
    pub fn taken_steps(&self) -> &[TemplateStep] {
        &self.steps[..self.taken]
    }

    /// Bytes of the steps the GPU took.
    pub fn taken_bytes(&self) -> u64 {
        self.taken_steps().iter().flat_map(|s| &s.reads).map(|r| r.len).sum()
    }

    pub fn write_bytes(&self) -> u64 {
        self.write_bursts.values().flatten().filter(|o| o.sync.is_none()).map(|o| o.len).sum()
    }
}

/// Most readers one simulated GPU gets from a template.
pub const MAX_READERS: usize = 4096;

/// The trace's job model and a template per GPU in it. A trace whose file layer lacks
/// most of what the job read (mmap, io_uring) is refused unless `allow_incomplete`.
pub fn load_templates(
    trace: &Path,
    opts: &Options,
    allow_incomplete: bool,
) -> Result<(Vec<Template>, JobModel), String> {
    let model = infer_trace(trace, opts)?;
    if let Some(why) = &model.incomplete {
        if !allow_incomplete {
            return Err(format!(
                "{}: {why}; replaying it would replay only what the file layer saw (pass --allow-incomplete to do so anyway)",
                trace.display()
            ));
        }
    }
    if model.gpus.iter().all(|g| g.steps.is_empty()) {
        return Err(format!(
            "{}: no file-layer reads of data in this trace (record with the file layer to replay it)",
            trace.display()
        ));
    }
    // One time origin for every template: their bursts keep their offsets to each other.
    let origin = model.gpus.iter().flat_map(|g| g.steps.iter().map(|s| s.first_read_ns)).min().unwrap_or(0);
    // With --compute-scale the recorded pace is scaled as the periods are.
    let scale = opts.compute_scale.unwrap_or(1.0);
    let templates = model
        .gpus
        .iter()
        .filter(|g| !g.steps.is_empty())
        .map(|g| {
            let compute = g.compute_s.unwrap_or(0.0);
            Template {
                host: g.host.clone(),
                pid: g.rank_pid,
                comm: g.comm.clone(),
                files: g.files.clone(),
                steps: g
                    .steps
                    .iter()
                    .map(|s| TemplateStep {
                        // A worker's own time on its batch (decoding, collating), after
                        // the read it followed, as the worker spent it.
                        reads: s
                            .reads
                            .iter()
                            .map(|r| SampleRead {
                                think_ns: r.cpu_after_ns,
                                mapped: r.mapped,
                                ..SampleRead::new(r.file, r.offset, r.len)
                            })
                            .collect(),
                        streams: s.reads.iter().map(|r| r.reader % MAX_READERS as u32).collect(),
                        samples: s.samples,
                        compute_s: if g.paced { s.period_s.unwrap_or(compute) } else { compute },
                        start_ns: ((s.first_read_ns - origin).max(0) as f64 * scale) as u64,
                    })
                    .collect(),
                taken: g.steps_taken.min(g.steps.len()),
                concurrency: g.readers.clamp(1, MAX_READERS),
                workers: g.workers,
                synchronous: g.synchronous,
                paced: g.paced,
                prefetch: g.prefetch_batches.max(1),
                bytes: g.bytes,
                compute_s: compute,
                handoff_s: g.handoff_s,
                sync_s: g.sync_s,
                dev: model.data_dev.clone(),
                write_bursts: g.write_bursts.iter().filter_map(|b| b.after_step.map(|k| (k, b.ops.clone()))).fold(
                    BTreeMap::new(),
                    |mut m, (k, ops)| {
                        m.entry(k).or_insert_with(Vec::new).extend(ops);
                        m
                    },
                ),
                write_files: g.write_files.iter().map(|(p, _)| p.clone()).collect(),
                required_mib_s: g.required_mib_s,
                setup: g
                    .setup
                    .iter()
                    .map(|s| SampleRead {
                        mapped: s.read.mapped,
                        advise: s.advise,
                        ..SampleRead::new(s.read.file, s.read.offset, s.read.len)
                    })
                    .collect(),
                setup_lead_s: g.setup_lead_s,
            }
        })
        .collect();
    Ok((templates, model))
}

/// `--map-path OLD=NEW`: a recorded path under OLD is read at NEW (the longest OLD that
/// holds it, by whole path components).
#[derive(Debug, Clone, Default)]
pub struct PathMap(pub Vec<(PathBuf, PathBuf)>);

impl PathMap {
    pub fn parse(args: &[String]) -> Result<PathMap, String> {
        args.iter()
            .map(|a| match a.split_once('=') {
                Some((old, new)) if Path::new(old).is_absolute() && Path::new(new).is_absolute() => {
                    Ok((PathBuf::from(old), PathBuf::from(new)))
                }
                _ => {
                    Err(format!("--map-path {a}: expected OLD=NEW, two absolute paths (e.g. /old/prefix=/new/prefix)"))
                }
            })
            .collect::<Result<Vec<_>, _>>()
            .map(PathMap)
    }

    /// Where the job's file `recorded` is read, None when no OLD holds it.
    pub fn map(&self, recorded: &str) -> Option<PathBuf> {
        let p = Path::new(recorded);
        self.0
            .iter()
            .filter_map(|(old, new)| {
                let rest = p.strip_prefix(old).ok()?;
                rest.components()
                    .all(|c| matches!(c, std::path::Component::Normal(_)))
                    .then(|| (old.components().count(), new.join(rest)))
            })
            .max_by_key(|(k, _)| *k)
            .map(|(_, p)| p)
    }

    /// Every file the templates read maps somewhere: else a line naming the first that does not.
    pub fn check(&self, templates: &[Template]) -> Result<(), String> {
        for t in templates {
            for (path, _) in &t.files {
                if self.map(path).is_none() {
                    return Err(format!(
                        "--map-path: the job read {path} (pid {}), which is under none of the OLD prefixes given",
                        t.pid
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Which file each simulated GPU reads for each file of its template (module comment):
/// the job's distinct files, once per copy; in place, the job's own files, mapped.
pub struct Placement {
    /// Per template: its file j → distinct file.
    distinct_of: Vec<Vec<u32>>,
    /// Distinct files: recorded path and the largest byte read from it.
    distinct: Vec<(String, u64)>,
    templates: u64,
    in_place: bool,
    /// Per copy: distinct file → its index in `layout` (u32::MAX: not in this copy).
    index: Vec<Vec<u32>>,
    pub layout: Layout,
}

impl Placement {
    pub fn new(templates: &[Template], gpus: u64, root: &Path, map: Option<&PathMap>) -> Placement {
        let mut by_path: std::collections::HashMap<&str, u32> = std::collections::HashMap::new();
        let mut distinct: Vec<(String, u64)> = Vec::new();
        let mut sizes: Vec<u64> = Vec::new();
        let mut distinct_of = Vec::with_capacity(templates.len());
        for t in templates {
            let mut ends = vec![0u64; t.files.len()];
            for r in t.steps.iter().flat_map(|s| &s.reads) {
                let e = &mut ends[r.file as usize];
                *e = (*e).max(r.offset + r.len);
            }
            let mut of = Vec::with_capacity(t.files.len());
            for ((path, size), end) in t.files.iter().zip(ends) {
                let d = *by_path.entry(path.as_str()).or_insert_with(|| {
                    distinct.push((path.clone(), 0));
                    sizes.push(0);
                    distinct.len() as u32 - 1
                });
                distinct[d as usize].1 = distinct[d as usize].1.max(end);
                sizes[d as usize] = sizes[d as usize].max(*size);
                of.push(d);
            }
            distinct_of.push(of);
        }
        let n = templates.len() as u64;
        let in_place = map.is_some();
        let objects = templates.iter().any(|t| t.objects());
        let copies = if in_place { 1 } else { gpus.div_ceil(n).max(1) };
        // The last copy holds the files of the templates its GPUs replay: 0..last.
        let last = if in_place { gpus.min(n) } else { gpus - (copies - 1) * n };
        let mut in_last = vec![false; distinct.len()];
        for of in &distinct_of[..last as usize] {
            for &d in of {
                in_last[d as usize] = true;
            }
        }
        let mapped: Vec<PathBuf> = match map {
            Some(m) => distinct.iter().map(|(p, _)| m.map(p).unwrap_or_else(|| PathBuf::from(p))).collect(),
            None => Vec::new(),
        };
        // In place: the directory every mapped file is in, for the engine to open them beneath.
        let root = match mapped.first() {
            Some(first) => {
                let mut r = first.parent().unwrap_or(Path::new("/")).to_path_buf();
                while !mapped.iter().all(|p| p.starts_with(&r)) {
                    r = r.parent().unwrap_or(Path::new("/")).to_path_buf();
                }
                r
            }
            None => root.to_path_buf(),
        };
        let mut files = Vec::new();
        let mut index = Vec::with_capacity(copies as usize);
        for c in 0..copies {
            let mut ix = vec![u32::MAX; distinct.len()];
            for d in 0..distinct.len() {
                if c + 1 == copies && !in_last[d] {
                    continue;
                }
                ix[d] = files.len() as u32;
                files.push(if in_place {
                    let rel = mapped[d].strip_prefix(&root).unwrap_or(&mapped[d]).to_path_buf();
                    DataFile { rel, size: distinct[d].1, sample: distinct[d].1 }
                } else {
                    DataFile { rel: copy_name(c, d, &distinct[d].0, objects), size: sizes[d], sample: sizes[d] }
                });
            }
            index.push(ix);
        }
        Placement {
            distinct_of,
            distinct,
            templates: n,
            in_place,
            index,
            layout: Layout {
                root,
                files,
                samples_per_file: 1,
                description: if in_place { "the job's own files (in place)" } else { "trace replay" }.into(),
                format: crate::formats::Format::Raw,
                parquet: None,
            },
        }
    }

    pub fn in_place(&self) -> bool {
        self.in_place
    }

    /// The layout index of simulated GPU `g`'s file for its template's file `j`.
    pub fn file(&self, g: u64, j: u32) -> u32 {
        let c = if self.in_place { 0 } else { g / self.templates };
        self.index[c as usize][self.distinct_of[(g % self.templates) as usize][j as usize] as usize]
    }

    /// The layout indexes of the files simulated GPU `g` reads.
    pub fn files_of(&self, g: u64) -> Vec<usize> {
        let t = (g % self.templates) as usize;
        (0..self.distinct_of[t].len() as u32).map(|j| self.file(g, j) as usize).collect()
    }

    /// In place: the files `which` exist, are regular files and hold every byte the job
    /// read from them; else one line naming the first that does not.
    pub fn verify_in_place(&self, which: &[usize]) -> Result<(), String> {
        // The index of a distinct file in copy 0 is its layout index: find its recorded path.
        let recorded: std::collections::HashMap<u32, &str> = self.index[0]
            .iter()
            .enumerate()
            .filter(|(_, i)| **i != u32::MAX)
            .map(|(d, &i)| (i, self.distinct[d].0.as_str()))
            .collect();
        for &i in which {
            let p = self.layout.path(i);
            let job = recorded.get(&(i as u32)).copied().unwrap_or("?");
            let need = self.layout.files[i].size;
            match std::fs::symlink_metadata(&p) {
                Ok(m) if m.is_file() && m.len() >= need => {}
                Ok(m) if m.is_file() => {
                    return Err(format!(
                        "{}: {} bytes, but the job read up to byte {need} of {job} (--map-path): not a whole copy of the job's file",
                        p.display(),
                        m.len()
                    ))
                }
                Ok(_) => {
                    return Err(format!(
                        "{}: not a regular file (the job's {job}, --map-path; links are not followed)",
                        p.display()
                    ))
                }
                Err(e) => return Err(format!("{}: {e} (the job's {job}, --map-path)", p.display())),
            }
        }
        Ok(())
    }
}

/// Where copy `c` of the job's distinct file `d` (recorded as `recorded`) is laid out: a
/// job's objects under their recorded `bucket/key` (`trace/c00000/train/a/s0.bin`), so a
/// copy in a bucket holds the same keys; files, and keys that are not a plain relative
/// path, as `trace/cCCCCC/fDDDDD.dat`.
fn copy_name(c: u64, d: usize, recorded: &str, objects: bool) -> PathBuf {
    if objects && plain_key(recorded) {
        return Path::new(&format!("trace/c{c:05}")).join(recorded);
    }
    PathBuf::from(format!("trace/c{c:05}/f{d:05}.dat"))
}

/// A recorded `bucket/key` that can name a copy beneath a folder: not empty, not ending
/// in `/`, and only plain components (no `..`, no root).
fn plain_key(recorded: &str) -> bool {
    !recorded.is_empty()
        && !recorded.ends_with('/')
        && Path::new(recorded).components().all(|x| matches!(x, std::path::Component::Normal(_)))
}

/// Settings of a trace replay that do not come from the trace.
pub struct TraceOptions {
    pub epochs: u64,
    /// Cap on steps per epoch (0 = none).
    pub max_steps: u64,
    pub compute_override: Option<f64>,
    /// --prefetch-size: replaces each template's own loader window.
    pub prefetch_override: Option<usize>,
}

pub struct TraceProgram {
    templates: Vec<Template>,
    placement: Placement,
    /// Per local GPU: template index and the simulated GPU's global index.
    local: Vec<(usize, u64)>,
    /// Per local GPU: the directory of its written files under --data-dir.
    write_dirs: Vec<PathBuf>,
    data_dir: PathBuf,
    /// `--storage-root`: where the objects the GPUs put go (else files under data_dir).
    s3: Option<crate::object::s3_writes::S3Target>,
    pub steps_per_epoch: u64,
    epochs: u64,
    compute_override: Option<f64>,
    prefetch_override: Option<usize>,
    max_request: u64,
}

impl TraceProgram {
    pub fn new(
        templates: Vec<Template>,
        placement: Placement,
        data_dir: &Path,
        gpus: u64,
        local_gpus: &[u64],
        opts: TraceOptions,
    ) -> TraceProgram {
        let TraceOptions { epochs, max_steps, compute_override, prefetch_override } = opts;
        let t_of = |g: u64| (g % templates.len() as u64) as usize;
        let local: Vec<(usize, u64)> = local_gpus.iter().map(|&g| (t_of(g), g)).collect();
        // Every GPU runs the same number of steps (the barrier needs it): the longest
        // template's; shorter templates end with empty steps.
        let used = (gpus as usize).min(templates.len());
        let mut steps = templates[..used].iter().map(|t| t.taken as u64).max().unwrap_or(0);
        if max_steps > 0 {
            steps = steps.min(max_steps);
        }
        let max_request = templates
            .iter()
            .flat_map(|t| t.steps.iter().flat_map(|s| s.reads.iter().map(|r| r.len)))
            .max()
            .unwrap_or(1);
        let write_dirs = local_gpus.iter().map(|&g| data_dir.join(format!("trace/gpu{g:05}"))).collect();
        TraceProgram {
            templates,
            placement,
            local,
            write_dirs,
            data_dir: data_dir.to_path_buf(),
            s3: None,
            steps_per_epoch: steps,
            epochs,
            compute_override,
            prefetch_override,
            max_request,
        }
    }

    pub fn templates(&self) -> &[Template] {
        &self.templates
    }

    /// Local GPU `gpu`'s template step for step `step` of the run: its taken steps, empty
    /// steps up to `steps_per_epoch`, then its untaken batches (None: an empty step).
    fn step_of(&self, gpu: usize, step: u64) -> Option<&TemplateStep> {
        let t = &self.templates[self.local[gpu].0];
        let k = if step < self.steps_per_epoch {
            Some(step).filter(|&s| s < t.taken as u64)?
        } else {
            t.taken as u64 + (step - self.steps_per_epoch)
        };
        t.steps.get(k as usize)
    }

    /// `--storage-root`: the objects the GPUs put go to this store.
    pub fn with_object_store(mut self, s3: Option<crate::object::s3_writes::S3Target>) -> TraceProgram {
        self.s3 = s3;
        self
    }

    /// Where local GPU `gpu` puts its template's object `file` (recorded `recorded`):
    /// its copy's folder, under the recorded `bucket/key` when that is a plain relative
    /// path, else `trace/gpuNNNNN/wNNNNN.dat` as a written file.
    fn object_copy(&self, gpu: usize, file: u32, recorded: &str) -> String {
        let g = self.local[gpu].1;
        let c = g / self.templates.len() as u64;
        if plain_key(recorded) {
            format!("trace/c{c:05}/{recorded}")
        } else {
            format!("trace/gpu{g:05}/w{file:05}.dat")
        }
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
        let g = self.local[gpu].1;
        match self.step_of(gpu, step) {
            Some(s) => Batch {
                samples: s.samples,
                streams: s.streams.clone(),
                reads: s.reads.iter().map(|r| SampleRead { file: self.placement.file(g, r.file), ..*r }).collect(),
            },
            None => Batch::default(),
        }
    }

    fn compute_seconds(&self, gpu: usize, _epoch: u64, step: u64, _rng: &mut StdRng) -> f64 {
        if let Some(c) = self.compute_override {
            return c;
        }
        self.step_of(gpu, step).map(|s| s.compute_s).unwrap_or(0.0)
    }

    fn path(&self, file: u32) -> PathBuf {
        self.placement.layout.path(file as usize)
    }

    fn root(&self) -> &std::path::Path {
        &self.placement.layout.root
    }

    fn read_threads(&self, gpu: usize) -> usize {
        self.templates[self.local[gpu].0].concurrency
    }

    fn prefetch_size(&self, gpu: usize) -> usize {
        self.prefetch_override.unwrap_or(self.templates[self.local[gpu].0].prefetch)
    }

    fn handoff_seconds(&self, gpu: usize) -> f64 {
        if self.compute_override.is_some() {
            return 0.0;
        }
        // Taking the batch and the step's collective: per step, outside the compute (the
        // collective's time is spent before the compute, where the replay's step has room
        // for it; either way it is in the step period and not in AU's compute).
        let t = &self.templates[self.local[gpu].0];
        t.handoff_s + t.sync_s
    }

    fn synchronous(&self, gpu: usize) -> bool {
        self.prefetch_override.is_none() && self.templates[self.local[gpu].0].synchronous
    }

    fn max_request(&self) -> u64 {
        self.max_request
    }

    /// Each local GPU's setup (Template::setup) on its own files, one read after another
    /// as the rank made them: buffered reads, page touches through a mapping of the range,
    /// or posix_fadvise(WILLNEED) of the range (the call madvise(WILLNEED) makes on a
    /// mapped file), so the run starts with the page cache the job's first batch found;
    /// then the rest of the recorded lead (Template::setup_lead_s: in the job, its
    /// workers' start-up) passes, so the run's first reads come as long after the setup's
    /// as the job's did (a read cap drains the setup's requests meanwhile, as it did).
    fn prepare(&self) -> anyhow::Result<()> {
        use anyhow::Context;
        use std::os::fd::AsRawFd;
        let start = std::time::Instant::now();
        let lead = self
            .local
            .iter()
            .map(|&(t, _)| &self.templates[t])
            .filter(|t| !t.setup.is_empty())
            .map(|t| t.setup_lead_s)
            .fold(0.0f64, f64::max);
        // Nothing to do (no setup, or a job whose data are objects): the data directory
        // may not even exist.
        if self.local.iter().all(|&(t, _)| self.templates[t].setup.is_empty() || self.templates[t].objects()) {
            return Ok(());
        }
        let beneath = crate::beneath::Beneath::new(self.root())?;
        let mut buf = Vec::new();
        for &(t, g) in &self.local {
            if self.templates[t].objects() {
                continue;
            }
            for r in &self.templates[t].setup {
                let path = self.path(self.placement.file(g, r.file));
                let fd = beneath.open(&path, libc::O_RDONLY | libc::O_CLOEXEC, 0)?;
                let (raw, len) = (fd.as_raw_fd(), r.len as usize);
                let res = if r.advise {
                    // A hint: a failure changes what is cached ahead, not what is read.
                    unsafe {
                        libc::posix_fadvise(raw, r.offset as libc::off_t, len as libc::off_t, libc::POSIX_FADV_WILLNEED)
                    };
                    0
                } else if r.mapped {
                    crate::engine::pool::touch_mapped(raw, r.offset, len) as isize
                } else {
                    buf.resize(len, 0u8);
                    // SAFETY: buf holds len bytes.
                    unsafe { libc::pread(raw, buf.as_mut_ptr().cast(), len, r.offset as libc::off_t) }
                };
                if res < 0 {
                    let e = if r.mapped {
                        std::io::Error::from_raw_os_error(-res as i32)
                    } else {
                        std::io::Error::last_os_error()
                    };
                    return Err(e)
                        .with_context(|| format!("reading {} before the run (the rank's setup)", path.display()));
                }
            }
        }
        if let Some(rest) =
            std::time::Duration::try_from_secs_f64(lead).ok().and_then(|l| l.checked_sub(start.elapsed()))
        {
            std::thread::sleep(rest);
        }
        Ok(())
    }

    fn recorded(&self) -> bool {
        true
    }

    fn writes_after(&self, gpu: usize, _epoch: u64, step: u64) -> Vec<crate::trace::trace_writes::WriteCall> {
        let t = &self.templates[self.local[gpu].0];
        let Some(ops) = t.write_bursts.get(&step) else {
            return Vec::new();
        };
        use crate::trace::trace_writes::WriteCall;
        use trainio_model::writes::ObjectWrite;
        ops.iter()
            .filter_map(|o| {
                let Some(what) = o.object else {
                    let path = self.write_dirs[gpu].join(format!("w{:05}.dat", o.file));
                    return Some(WriteCall::file(path, o.offset, o.len, o.sync));
                };
                let copy = self.object_copy(gpu, o.file, &t.write_files[o.file as usize]);
                match (&self.s3, what) {
                    (Some(s3), _) => Some(WriteCall {
                        object: Some((crate::object::object_store::join_key(&[&s3.store.prefix, &copy]), what)),
                        ..WriteCall::file(PathBuf::new(), o.offset, o.len, None)
                    }),
                    // Without an object store: the object's bytes as a file, at their place.
                    (None, ObjectWrite::Put | ObjectWrite::Part { .. }) => {
                        Some(WriteCall::file(self.data_dir.join(copy), o.offset, o.len, None))
                    }
                    (None, ObjectWrite::Create { .. } | ObjectWrite::Complete) => None,
                }
            })
            .collect()
    }

    fn run_write_bursts(
        &self,
        bursts: &[Vec<crate::trace::trace_writes::WriteCall>],
        buf: &mut Vec<u8>,
    ) -> anyhow::Result<Vec<(crate::trace::trace_writes::BurstIo, f64)>> {
        crate::trace::trace_writes::run_bursts(bursts, buf, self.s3.as_ref())
    }

    /// Paced templates (loader threads that read ahead): a burst starts at its recorded
    /// time after the epoch's start (or later, when the GPU is behind), so a replay on the
    /// same storage reads when the recording did; not with --computation-time, which
    /// replaces the recorded pace.
    fn not_before_ns(&self, gpu: usize, _epoch: u64, step: u64) -> Option<u64> {
        let t = &self.templates[self.local[gpu].0];
        if self.compute_override.is_some() || !t.paced {
            return None;
        }
        self.step_of(gpu, step).map(|s| s.start_ns)
    }

    /// The template's batches after its taken ones, in the last epoch, unless
    /// --max-steps cut the run before the template's last taken step.
    fn untaken_batches(&self, gpu: usize, epoch: u64) -> u64 {
        let t = &self.templates[self.local[gpu].0];
        if epoch + 1 != self.epochs || (t.taken as u64) > self.steps_per_epoch {
            return 0;
        }
        (t.steps.len() - t.taken) as u64
    }
}

#[cfg(test)]
#[path = "trace_input_tests.rs"]
mod tests;
