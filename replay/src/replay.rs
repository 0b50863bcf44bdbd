//! One replay job: arguments → validated configuration → dataset → engine → results.

use crate::checkpoint::Plan;
use crate::checkpointing::{self, Checkpointer};
use crate::cli::RunArgs;
use crate::cluster::Cluster;
use crate::dataset::{self, Layout};
use crate::datasize;
use crate::engine::Program;
use crate::engine::{Engine, EngineOptions};
use crate::program::WorkloadProgram;
use crate::results::{self, RankReport, Settings};
use crate::trace_input::{self, PathMap, Placement, Template, TraceOptions, TraceProgram};
use crate::workload::{ComputeTime, Workload};
use anyhow::{bail, Context, Result};
use std::path::PathBuf;

pub use crate::errors::InputError;

pub const DEFAULT_TRANSFER: u64 = 1 << 20;
/// The longest --computation-time (a day per step): a time that fits a Duration.
pub const MAX_COMPUTE_S: f64 = 86_400.0;
/// From this many files on, datagen checks a lower bound of the dataset's bytes against
/// the free space before it builds the layout.
const PRECHECK_FILES: u64 = 1_000_000;

#[derive(Debug, Clone)]
pub struct Job {
    /// Workload mode: the workload; trace mode: a stand-in carrying the shared settings.
    pub workload: Workload,
    /// Trace mode: the GPUs of the trace's job model.
    pub templates: Option<Vec<Template>>,
    /// Trace mode: the job model the templates come from.
    pub model: Option<trainio_model::JobModel>,
    pub compute_override: Option<f64>,
    /// --prefetch-size given: trace mode uses it instead of each GPU's loader window.
    pub prefetch_override: Option<u64>,
    /// Trace mode: --gpus-per-process (1: as recorded).
    pub gpus_per_process: u32,
    /// Trace mode: --compute-scale.
    pub compute_scale: Option<f64>,
    /// Trace mode: --map-path given: the replay reads the job's own files in place.
    pub map_path: Option<PathMap>,
    pub source: String,
    pub data_dir: PathBuf,
    pub transfer_size: u64,
    /// TensorFlow's reader buffer for TFRecord files: the transfer size when one is given
    /// (DLIO passes reader.transfer_size as TFRecordDataset's buffer_size), else TF's 256 KiB.
    pub tf_buffer: u64,
    pub max_steps: u64,
    pub threshold_percent: f64,
    pub barrier: bool,
    pub odirect: bool,
    pub drop_caches: bool,
    pub generate: bool,
    pub force: bool,
    pub progress: bool,
    pub realtime: bool,
    pub psync: bool,
    /// The page-cache warning was printed (once per command, not once per `--runs` run).
    pub cache_warned: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// `storage.storage_type: s3`: the dataset and checkpoints are objects there, checked
    /// (endpoint, credentials, bucket) before any work; --data-dir is not used.
    pub s3: Option<crate::s3_writes::S3Target>,
}

/// GPUs of rank `rank` when `gpus` are spread over `ranks`: contiguous, the first
/// `gpus % ranks` ranks take one more.
pub fn split(gpus: u64, ranks: usize, rank: usize) -> Vec<u64> {
    let ranks = ranks as u64;
    let rank = rank as u64;
    let base = gpus / ranks;
    let extra = gpus % ranks;
    let start = rank * base + rank.min(extra);
    let count = base + u64::from(rank < extra);
    (start..start + count).collect()
}

pub fn mem_total_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// On rank 0: the client hosts and their total RAM (MemTotal of each host counted once,
/// as MLPerf's rule counts it); None on the other ranks. Every rank must call it.
pub fn client_ram(cluster: &Cluster) -> Option<(u64, u64)> {
    let ram = mem_total_bytes();
    let hosts = cluster.gather(format!("{}\t{ram}", cluster.hostname).into_bytes())?;
    let by_host: std::collections::BTreeMap<String, u64> = hosts
        .iter()
        .filter_map(|b| {
            let line = String::from_utf8_lossy(b).into_owned();
            let (h, r) = line.split_once('\t')?;
            Some((h.to_string(), r.parse().ok()?))
        })
        .collect();
    Some((by_host.len() as u64, by_host.values().sum()))
}

/// Free bytes for an unprivileged writer on the file system that holds `path`, or that
/// will hold it (its nearest existing ancestor), and that directory.
fn free_bytes(path: &std::path::Path) -> Result<(u64, PathBuf)> {
    use std::os::unix::ffi::OsStrExt;
    let mut dir = path.to_path_buf();
    while !dir.exists() {
        match dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => dir = p.to_path_buf(),
            _ => {
                dir = PathBuf::from(".");
                break;
            }
        }
    }
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a NUL-terminated path and st a statvfs to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        bail!("statvfs {}: {}", dir.display(), std::io::Error::last_os_error());
    }
    Ok((st.f_bavail as u64 * st.f_frsize as u64, dir))
}

fn cpu_seconds() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

impl Job {
    pub fn prepare(args: &RunArgs) -> Result<Job> {
        let src = &args.source;
        let rd = &args.reader;
        let (mut w, templates, path) = match (&src.workload, &src.trace) {
            (Some(path), _) => {
                if args.gpus_per_process != 1 || args.compute_scale.is_some() || !args.map_path.is_empty() {
                    bail!(InputError(
                        "--gpus-per-process, --compute-scale and --map-path change a recorded job: they go with --trace, not --workload".into()
                    ));
                }
                let mut params = src.params.clone();
                params.extend(
                    crate::workload::hydra_overrides(&src.overrides).map_err(|e| InputError(format!("{e:#}")))?,
                );
                if let Some(mode) = &rd.checkpoint_mode {
                    params.push(format!("checkpoint.mode={mode}"));
                }
                let w = Workload::from_file_with(path, &params)
                    .map_err(|e| InputError(format!("{e:#}").replace('\n', " ")))?;
                if w.train && w.checkpoint.is_some() && args.no_barrier {
                    bail!(InputError(format!(
                        "{}: checkpoints inside training stop every simulated GPU at a step barrier: drop --no-barrier (or pass --param workflow.checkpoint=false)",
                        path.display()
                    )));
                }
                crate::unmodeled::print(path, &w);
                (w, None, path.clone())
            }
            (None, Some(trace)) => {
                if !src.params.is_empty() || !src.overrides.is_empty() || rd.checkpoint_mode.is_some() {
                    bail!(InputError(
                        "--param, ++workload.KEY=VALUE and --checkpoint-mode set workload keys: they go with --workload, not --trace".into()
                    ));
                }
                if let Some(gap) = args.burst_gap_ms {
                    if !(gap > 0.0 && gap <= 1e9) {
                        bail!(InputError(format!("--burst-gap-ms must be above 0 and at most 1e9 ms, got {gap}")));
                    }
                }
                if let Some(f) = args.compute_scale {
                    if !(f > 0.0 && f.is_finite()) {
                        bail!(InputError(format!("--compute-scale must be a number > 0, got {f}")));
                    }
                }
                let map = PathMap::parse(&args.map_path).map_err(InputError)?;
                if !map.0.is_empty() && args.generate {
                    bail!(InputError(
                        "--map-path replays the job's own files in place: there is nothing to generate (drop --generate)".into()
                    ));
                }
                let opts = trainio_model::Options {
                    grouping: trainio_model::Grouping::parse(&args.gpu_grouping).map_err(InputError)?,
                    burst_gap_ms: args.burst_gap_ms,
                    dev: None,
                    gpus_per_process: Some(args.gpus_per_process),
                    compute_scale: args.compute_scale,
                };
                let (templates, model) =
                    trace_input::load_templates(trace, &opts, args.allow_incomplete).map_err(InputError)?;
                if !map.0.is_empty() {
                    map.check(&templates).map_err(InputError)?;
                }
                let name = trace.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                // The stand-in carries the shared settings; the loader of each GPU comes
                // from its template (trace_input).
                let w = Workload::from_yaml(
                    &format!("model: {{name: \"trace {name}\"}}\ndataset: {{record_length_bytes: 1}}\nreader: {{prefetch_size: 2}}\ntrain: {{}}\n"),
                    "trace",
                )?;
                (w, Some((templates, model)), trace.clone())
            }
            (None, None) => bail!(InputError("give --workload FILE.yaml or --trace TRACE".into())),
        };
        if let Some(ct) = rd.computation_time {
            if !(0.0..=MAX_COMPUTE_S).contains(&ct) {
                bail!(InputError(format!(
                    "--computation-time must be ≥ 0 and at most {MAX_COMPUTE_S} seconds, got {ct}"
                )));
            }
            w.computation_time = ComputeTime::Fixed(ct);
        }
        if let Some(v) = src.batch_size {
            w.batch_size = v;
        }
        if let Some(v) = rd.read_threads {
            w.read_threads = v;
        }
        if let Some(v) = rd.prefetch_size {
            w.prefetch_size = v;
        }
        if let Some(v) = rd.epochs {
            w.epochs = v;
        }
        if let Some(v) = src.seed {
            w.seed = v;
        }
        let threshold = args.threshold.unwrap_or(w.au_threshold_percent);
        if !(0.0..=100.0).contains(&threshold) {
            bail!(InputError(format!("--threshold must be between 0 and 100 percent, got {threshold}")));
        }
        if w.train && matches!(crate::formats::Format::parse(&w.format), crate::formats::Format::Hdf5(_)) {
            // DLIO raises for it too: h5py reads through the page cache.
            if w.odirect {
                bail!(InputError(format!(
                    "{}: reader.odirect: true: O_DIRECT is not supported with dataset.format hdf5 (h5py reads through the page cache)",
                    path.display()
                )));
            }
            if args.odirect {
                bail!(InputError(format!(
                    "--odirect: O_DIRECT is not supported with dataset.format hdf5 in {} (h5py reads through the page cache)",
                    path.display()
                )));
            }
        }
        let format = crate::formats::Format::parse(&w.format);
        if (args.odirect || w.odirect)
            && templates.is_none()
            && (crate::indexed::is_indexed(format) || format == crate::formats::Format::Parquet)
        {
            // DLIO's reader factory raises for these formats under O_DIRECT.
            bail!(InputError(format!(
                "{}: dataset.format {} is read through the page cache by DLIO's reader (it refuses O_DIRECT): drop --odirect / reader.odirect",
                path.display(),
                w.format
            )));
        }
        let (templates, model) = match templates {
            Some((t, m)) => (Some(t), Some(m)),
            None => (None, None),
        };
        let s3 = match &w.object_store {
            Some(store) => {
                if args.odirect || w.odirect {
                    bail!(InputError(format!(
                        "{}: O_DIRECT (--odirect, reader.odirect) is for files; this workload reads {}",
                        path.display(),
                        store.uri()
                    )));
                }
                let checkpoint_bucket: Vec<String> =
                    w.checkpoint.iter().map(|c| store.checkpoint_location(&c.folder).0).collect();
                Some(crate::s3_writes::preflight(store, &checkpoint_bucket)?)
            }
            None => None,
        };
        Ok(Job {
            s3,
            templates,
            model,
            compute_override: rd.computation_time,
            prefetch_override: rd.prefetch_size,
            gpus_per_process: args.gpus_per_process,
            compute_scale: args.compute_scale,
            map_path: PathMap::parse(&args.map_path).ok().filter(|m| !m.0.is_empty()),
            transfer_size: rd.transfer_size.or(w.transfer_size).unwrap_or(DEFAULT_TRANSFER),
            tf_buffer: rd.transfer_size.or(w.transfer_size).unwrap_or(crate::program::TF_BUFFER),
            odirect: args.odirect || w.odirect,
            workload: w,
            source: path.display().to_string(),
            // Absolute: every path beneath it is resolved against the directory opened once
            // (beneath.rs), and a relative one would be taken twice.
            data_dir: std::path::absolute(&src.data_dir).unwrap_or_else(|_| src.data_dir.clone()),
            max_steps: src.steps.unwrap_or(0),
            threshold_percent: threshold,
            barrier: !args.no_barrier,
            drop_caches: args.drop_caches,
            generate: args.generate,
            force: src.force,
            progress: !args.quiet,
            realtime: args.realtime,
            psync: args.io_engine == crate::cli::IoEngine::Psync,
            cache_warned: Default::default(),
        })
    }

    /// The dataset for `gpus`; its size is bounded (dataset::MAX_FILES) before anything
    /// in proportion to it is allocated.
    pub fn layout(&self, gpus: u64) -> Result<Layout> {
        match self.placement(gpus) {
            Some(p) => Ok(p.layout),
            None => {
                let needed = self.bounded_files(gpus)?;
                let layout = Layout::from_workload(&self.workload, gpus, self.max_steps, &self.data_dir);
                if self.in_place_dlio() {
                    return crate::dlio_dataset::layout(&self.workload, &layout, needed)
                        .map_err(|e| InputError(e).into());
                }
                Ok(layout)
            }
        }
    }

    /// Workload mode, without --generate, on a directory that holds no trainio dataset
    /// but DLIO's `train/`: the dataset DLIO generated, read in place (dlio_dataset.rs).
    pub fn in_place_dlio(&self) -> bool {
        self.templates.is_none() && !self.generate && crate::dlio_dataset::looks_like(&self.data_dir)
    }

    /// Workload mode: the files of the dataset for `gpus`, refused above dataset::MAX_FILES.
    fn bounded_files(&self, gpus: u64) -> Result<u64> {
        let n = Layout::files_for(&self.workload, gpus, self.max_steps);
        if n > dataset::MAX_FILES {
            bail!(InputError(format!(
                "{}: --gpus {gpus} × --steps {} × --batch-size {} (or dataset.num_files_train {}) needs {n} files, above trainio's bound of {}: lower one of them",
                self.source,
                self.max_steps.max(1),
                self.workload.batch_size,
                self.workload.num_files_train,
                dataset::MAX_FILES
            )));
        }
        Ok(n)
    }

    /// Trace mode: which file each simulated GPU reads (trace_input.rs).
    fn placement(&self, gpus: u64) -> Option<Placement> {
        self.templates.as_ref().map(|t| Placement::new(t, gpus, &self.data_dir, self.map_path.as_ref()))
    }

    /// The files simulated GPU `g` of `gpus` reads.
    fn files_of(&self, layout: &Layout, placement: Option<&Placement>, g: u64, gpus: u64) -> Vec<usize> {
        match placement {
            Some(p) => p.files_of(g),
            None => layout.shard(g, gpus),
        }
    }

    /// The checkpoints of this rank's simulated GPUs, when the workload checkpoints.
    pub fn checkpointer(&self, cluster: &Cluster, gpus: u64) -> Result<Option<Checkpointer>> {
        let Some(spec) = &self.workload.checkpoint else {
            return Ok(None);
        };
        let plan = Plan::new(spec, gpus).map_err(|e| InputError(format!("{}: {e:#}", self.source)))?;
        Ok(Some(Checkpointer {
            spec: spec.clone(),
            plan,
            root: self.data_dir.clone(),
            local: split(gpus, cluster.size, cluster.rank),
            transfer: self.transfer_size,
            odirect: self.odirect,
            s3: self.s3.clone(),
        }))
    }

    /// What a checkpoint-only run echoes as its settings.
    fn checkpoint_settings(&self) -> serde_json::Value {
        serde_json::json!({
            "mode": "checkpoint",
            "source": self.source,
            "name": self.workload.name,
            "data_dir": self.data_dir.display().to_string(),
            "params": self.workload.params,
            "transfer_size": self.transfer_size,
            "odirect": self.odirect,
            "train": self.workload.train,
            "storage": self.s3.as_ref().map(|t| t.settings_json()),
        })
    }

    /// The checkpoint plan for `gpus` simulated GPUs, computed without writing anything.
    pub fn plan_only(&self, cluster: &Cluster, gpus: u64) -> Result<serde_json::Value> {
        let Some(ckpt) = self.checkpointer(cluster, gpus)? else {
            bail!(InputError(format!(
                "{}: --plan-only plans checkpoints, and this workload has none (workflow.checkpoint is not true)",
                self.source
            )));
        };
        Ok(serde_json::json!({
            "tool": "trainio replay",
            "version": env!("CARGO_PKG_VERSION"),
            "plan_only": true,
            "gpus": gpus,
            "ranks": cluster.size,
            "hosts": 1,
            "checkpoint": checkpointing::plan_json(&ckpt.spec, &ckpt.plan),
            "settings": self.checkpoint_settings(),
        }))
    }

    /// A checkpoint-only workload (MLPerf Storage's llama3 files): writes, then reads back.
    pub fn run_checkpoint_only(&self, cluster: &Cluster, gpus: u64) -> Result<Option<serde_json::Value>> {
        let ckpt = self.checkpointer(cluster, gpus)?.expect("a checkpoint-only workload has a checkpoint spec");
        if ckpt.spec.num_checkpoints_write == 0 && ckpt.spec.num_checkpoints_read == 0 {
            bail!(InputError(format!(
                "{}: checkpoint.num_checkpoints_write and num_checkpoints_read are both 0: nothing to run",
                self.source
            )));
        }
        if ckpt.spec.num_checkpoints_write > 0 && cluster.is_root() && self.s3.is_none() {
            dataset::claim_directory(&self.data_dir, self.force)?;
            dataset::write_marker(&Layout {
                root: self.data_dir.clone(),
                files: Vec::new(),
                samples_per_file: 1,
                description: format!("checkpoints of {}", self.workload.name),
                format: crate::formats::Format::Raw,
                parquet: None,
            })?;
        }
        cluster.barrier()?;
        checkpointing::run_checkpoint_only(&ckpt, cluster, self.checkpoint_settings(), self.progress)
    }

    /// Generates the dataset for `gpus`, every rank writing its share of the files.
    pub fn datagen(&self, cluster: &Cluster, gpus: u64) -> Result<()> {
        if !self.workload.train {
            bail!(InputError(format!(
                "{}: a checkpoint-only workload has no dataset to generate (run 'trainio replay' with it)",
                self.source
            )));
        }
        if let Some(target) = &self.s3 {
            return self.datagen_s3(target, cluster, gpus);
        }
        if cluster.is_root() {
            self.precheck_free_space(gpus)?;
        }
        let layout = self.layout(gpus)?;
        let clients = client_ram(cluster);
        if cluster.is_root() {
            self.print_size_check("datagen", &layout, gpus, None, clients);
            self.check_free_space(&layout)?;
            dataset::claim_directory(&self.data_dir, self.force)?;
            dataset::write_marker(&layout)?;
        }
        cluster.barrier()?;
        let started = std::time::Instant::now();
        let bytes = dataset::generate(&layout, cluster.rank, cluster.size, self.progress && cluster.is_root())?;
        cluster.barrier()?;
        if cluster.is_root() {
            eprintln!(
                "trainio datagen: {} files, {:.1} MiB in {} ({:.1} MiB written by rank 0 in {:.1} s)",
                layout.files.len(),
                layout.total_bytes() as f64 / 1048576.0,
                self.data_dir.display(),
                bytes as f64 / 1048576.0,
                started.elapsed().as_secs_f64()
            );
        }
        Ok(())
    }

    /// Datagen to object storage: every rank PUTs its share of the objects.
    fn datagen_s3(&self, target: &crate::s3_writes::S3Target, cluster: &Cluster, gpus: u64) -> Result<()> {
        let layout = self.layout(gpus)?;
        if cluster.is_root() {
            self.print_size_check("datagen", &layout, gpus, None, client_ram(cluster));
        }
        cluster.barrier()?;
        let started = std::time::Instant::now();
        let bytes = crate::s3_writes::generate(target, &layout, cluster.rank, cluster.size)?;
        cluster.barrier()?;
        if cluster.is_root() {
            eprintln!(
                "trainio datagen: {} objects, {:.1} MiB in {} ({:.1} MiB put by rank 0 in {:.1} s, {})",
                layout.files.len(),
                layout.total_bytes() as f64 / 1048576.0,
                target.store.uri(),
                bytes as f64 / 1048576.0,
                started.elapsed().as_secs_f64(),
                target.store.library.name()
            );
        }
        Ok(())
    }

    /// Object storage: the layout the engine reads, each object one file of samples read
    /// in one request per sample (the library turns it into its GETs, s3_reads.rs), and
    /// the objects' sizes as listed.
    fn s3_layout(
        &self,
        target: &crate::s3_writes::S3Target,
        layout: &Layout,
        mine: &[usize],
        sizing: &str,
    ) -> Result<(Layout, u64)> {
        let have = target.dataset_objects()?;
        target.verify(layout, mine, &have).map_err(|e| InputError(format!("{e:#} ({sizing})")))?;
        let spf = layout.samples_per_file.max(1);
        let files: Vec<dataset::DataFile> = layout
            .files
            .iter()
            .map(|f| dataset::DataFile { rel: f.rel.clone(), size: f.size, sample: (f.size / spf).max(1) })
            .collect();
        let largest = files.iter().map(|f| f.sample).max().unwrap_or(1);
        if largest > i32::MAX as u64 {
            bail!(InputError(format!(
                "{}: samples of {largest} bytes: object replay reads at most 2 GiB per request",
                self.source
            )));
        }
        Ok((Layout { files, format: crate::formats::Format::Raw, ..layout.clone() }, largest))
    }

    /// Steps per epoch each GPU gets from `layout` (its shard of whole batches, at most
    /// --steps), as the workload program counts them.
    fn layout_steps(&self, layout: &Layout, gpus: u64) -> u64 {
        let per_gpu = layout.files.len() as u64 / gpus.max(1) * layout.samples_per_file;
        let steps = per_gpu / self.workload.batch_size.max(1);
        if self.max_steps > 0 {
            steps.min(self.max_steps)
        } else {
            steps
        }
    }

    /// Prints (rank 0, workload mode; standard output) MLPerf's dataset-size rule for this run against
    /// the dataset it uses.
    fn print_size_check(&self, cmd: &str, layout: &Layout, gpus: u64, steps: Option<u64>, clients: Option<(u64, u64)>) {
        let (Some((hosts, ram)), None) = (clients, &self.templates) else { return };
        let rule = datasize::sizing(&self.workload, gpus, hosts, ram);
        let steps = steps.unwrap_or_else(|| self.layout_steps(layout, gpus));
        // On standard output: information, not a complaint (an error stays one line on
        // standard error).
        println!(
            "trainio {cmd}: {}",
            datasize::check_line(&rule, layout.files.len() as u64, layout.total_bytes(), steps)
        );
    }

    /// Refuses, before the layout of a large dataset (memory in proportion to the files) is built, a dataset
    /// that cannot fit whatever is already there: its files times the least a file takes
    /// (its samples rounded up to 4 KiB, plus one block), less the bytes of the dataset in
    /// --data-dir now, against the free space. `check_free_space` is the exact check.
    fn precheck_free_space(&self, gpus: u64) -> Result<()> {
        if self.templates.is_some() {
            return Ok(());
        }
        let w = &self.workload;
        let files = self.bounded_files(gpus)?;
        if files < PRECHECK_FILES {
            return Ok(()); // a small layout: check_free_space's exact count is cheap
        }
        let sample = if w.record_length_stdev > 0.0 {
            dataset::ALIGN
        } else {
            dataset::round_up((w.record_length.ceil() as u64).max(1), dataset::ALIGN)
        };
        let least = files.saturating_mul(w.num_samples_per_file.saturating_mul(sample).saturating_add(dataset::ALIGN));
        let have = dataset::marker_bytes(&self.data_dir);
        let (free, dir) = free_bytes(&self.data_dir)?;
        if least.saturating_sub(have) > free {
            bail!(InputError(format!(
                "--data-dir {}: {files} files of at least {} each need {} and the file system of {} has {} free: lower dataset.num_files_train (--param), --gpus, --steps or --batch-size, or free space",
                self.data_dir.display(),
                datasize::human_bytes((least / files.max(1)) as f64),
                datasize::human_bytes(least as f64),
                dir.display(),
                datasize::human_bytes(free as f64)
            )));
        }
        Ok(())
    }

    /// Refuses, before anything is written, a dataset whose missing files do not fit the
    /// free space of --data-dir's file system (each new file counted one 4 KiB block
    /// more, for its inode's extents and directory entry).
    fn check_free_space(&self, layout: &Layout) -> Result<()> {
        let (mut missing, mut bytes) = (0u64, 0u64);
        let exists = self.data_dir.is_dir();
        for (rel, size) in (0..layout.files.len()).flat_map(|i| layout.on_disk(i)) {
            let have = exists
                && std::fs::symlink_metadata(layout.root.join(&rel))
                    .map(|m| m.is_file() && m.len() == size)
                    .unwrap_or(false);
            if !have {
                missing += 1;
                bytes += size;
            }
        }
        let need = bytes + missing * dataset::ALIGN;
        let (free, dir) = free_bytes(&self.data_dir)?;
        if need > free {
            bail!(InputError(format!(
                "--data-dir {}: the dataset needs {need} B ({}) more for {missing} files and the file system of {} has {free} B ({}) free: lower dataset.num_files_train (--param), --gpus or --steps, or free space",
                self.data_dir.display(),
                datasize::human_bytes(need as f64),
                dir.display(),
                datasize::human_bytes(free as f64)
            )));
        }
        Ok(())
    }

    /// Runs the replay with `gpus` simulated GPUs. Rank 0 gets the results.
    pub fn run(&self, cluster: &Cluster, gpus: u64) -> Result<Option<serde_json::Value>> {
        if self.generate {
            self.datagen(cluster, gpus)?;
        }
        self.run_generated(cluster, gpus)
    }

    /// `run` without generating the dataset first (`--record` generates before it starts
    /// the recorder, so the recording holds the replay's I/O and not datagen's writes).
    pub fn run_generated(&self, cluster: &Cluster, gpus: u64) -> Result<Option<serde_json::Value>> {
        let placement = self.placement(gpus);
        let layout = self.layout(gpus)?;
        let clients = client_ram(cluster);
        let local = split(gpus, cluster.size, cluster.rank);
        // Each rank checks the files its own GPUs read.
        let mut mine: Vec<usize> =
            local.iter().flat_map(|&g| self.files_of(&layout, placement.as_ref(), g, gpus)).collect();
        mine.sort_unstable();
        mine.dedup();
        let sizing = match &self.templates {
            Some(_) => format!("the trace's files for --gpus {gpus}"),
            None => format!(
                "--gpus {gpus} × {} × --batch-size {} samples, at least dataset.num_files_train {}",
                match self.max_steps {
                    0 => "one step".to_string(),
                    s => format!("--steps {s}"),
                },
                self.workload.batch_size,
                self.workload.num_files_train
            ),
        };
        let mut object_layout = None;
        match (placement.as_ref().filter(|p| p.in_place()), &self.s3) {
            (Some(p), _) => p.verify_in_place(&mine).map_err(InputError)?,
            (None, Some(t)) => object_layout = Some(self.s3_layout(t, &layout, &mine, &sizing)?),
            // DLIO's dataset: every file checked when the layout was made from them.
            (None, None) if self.in_place_dlio() => {
                if cluster.is_root() {
                    eprintln!(
                        "trainio replay: note: {}: DLIO's dataset, read in place: {} files of {}; each file is read whole in {} B requests (the reads numpy.load or DLIO's reader make of its files are not modeled)",
                        self.data_dir.display(),
                        layout.files.len(),
                        crate::datasize::human_bytes(layout.total_bytes() as f64),
                        self.transfer_size
                    );
                }
            }
            (None, None) => layout.verify_files(&mine, &sizing)?,
        }
        let used: Vec<usize> = match &placement {
            // The layout holds only the files some GPU reads, each once.
            Some(_) => (0..layout.files.len()).collect(),
            None => (0..gpus).flat_map(|g| self.files_of(&layout, None, g, gpus)).collect(),
        };
        let used_bytes: u64 = used.iter().flat_map(|&i| layout.on_disk(i)).map(|(_, size)| size).sum();
        let w = &self.workload;
        match &self.templates {
            None => {
                let (read_layout, transfer) = match &object_layout {
                    Some((l, largest)) => (l.clone(), *largest),
                    None => (layout.clone(), self.transfer_size),
                };
                let program = WorkloadProgram::new(
                    w,
                    read_layout,
                    gpus,
                    &local,
                    transfer,
                    self.max_steps,
                    self.odirect,
                    self.tf_buffer,
                );
                if program.steps_per_epoch == 0 {
                    bail!(InputError(format!(
                        "each GPU's shard holds fewer samples than one batch ({} files of {} samples for {} GPUs, batch {})",
                        layout.files.len(),
                        layout.samples_per_file,
                        gpus,
                        w.batch_size
                    )));
                }
                // Datagen printed it when it ran in this process.
                if !self.generate {
                    self.print_size_check("replay", &layout, gpus, Some(program.steps_per_epoch), clients);
                }
                if cluster.is_root() && program.steps_per_epoch < 500 && self.max_steps == 0 {
                    eprintln!(
                        "trainio replay: note: {} steps per epoch; MLPerf Storage wants at least 500 (raise dataset.num_files_train or pass --steps)",
                        program.steps_per_epoch
                    );
                }
                let settings = Settings {
                    mode: "workload".into(),
                    source: self.source.clone(),
                    name: w.name.clone(),
                    data_dir: self.data_dir.display().to_string(),
                    batch_size: w.batch_size,
                    read_threads: w.read_threads,
                    prefetch_size: w.prefetch_size,
                    transfer_size: self.transfer_size,
                    computation_time: w.computation_time.describe(),
                    computation_time_mean_s: w.computation_time.mean(),
                    steps_per_epoch: program.steps_per_epoch,
                    epochs: w.epochs,
                    barrier: self.barrier,
                    odirect: self.odirect,
                    drop_caches: self.drop_caches,
                    realtime: self.realtime,
                    io_engine: if self.psync { "psync" } else { "io_uring" }.into(),
                    nominal_sample_bytes: w.record_length,
                    dataset_files: used.len() as u64,
                    dataset_bytes: used_bytes,
                    params: w.params.clone(),
                    reader: Some(program.reader_json(&w.format, &w.data_loader)),
                    templates: None,
                    gpus_per_process: None,
                    compute_scale: None,
                    required_mib_s_per_gpu: crate::datasize::need_bytes_per_s(w).map(|b| b / (1u64 << 20) as f64),
                    map_path: None,
                };
                let objects = match (&self.s3, &object_layout) {
                    (Some(t), Some((l, _))) => Some(crate::s3_reads::ObjectSet {
                        bucket: t.store.bucket.clone(),
                        prefix: t.store.prefix.clone(),
                        root: l.root.clone(),
                        sizes: l.files.iter().map(|f| (f.rel.clone(), f.size)).collect(),
                    }),
                    _ => None,
                };
                self.execute(cluster, &program, &local, gpus, used_bytes, settings, clients, objects)
            }
            Some(templates) => {
                let program = TraceProgram::new(
                    templates.clone(),
                    placement.expect("trace mode has a placement"),
                    &self.data_dir,
                    gpus,
                    &local,
                    TraceOptions {
                        epochs: w.epochs,
                        max_steps: self.max_steps,
                        compute_override: self.compute_override,
                        prefetch_override: self.prefetch_override.map(|p| p as usize),
                    },
                );
                let used_t = &templates[..templates.len().min(gpus as usize)];
                let bytes: u64 = used_t.iter().map(|t| t.bytes).sum();
                let steps: u64 = used_t.iter().map(|t| t.steps.len() as u64).sum();
                let samples: u64 = used_t.iter().flat_map(|t| &t.steps).map(|s| s.samples as u64).sum();
                let compute: f64 = used_t.iter().flat_map(|t| &t.steps).map(|s| s.compute_s).sum();
                // Per simulated GPU: the templates' own needs, or with --computation-time
                // their bytes per step over it.
                let needs: Vec<f64> = used_t
                    .iter()
                    .filter_map(|t| match self.compute_override {
                        Some(c) if c > 0.0 => {
                            Some(t.bytes as f64 / t.steps.len().max(1) as f64 / c / (1u64 << 20) as f64)
                        }
                        Some(_) => None,
                        None => t.required_mib_s,
                    })
                    .collect();
                let required = median(&needs);
                if cluster.is_root() {
                    if let Some(m) = &self.model {
                        for line in trainio_model::describe(m) {
                            eprintln!("trainio replay: {line}");
                        }
                    }
                }
                let settings = Settings {
                    mode: "trace".into(),
                    source: self.source.clone(),
                    name: w.name.clone(),
                    data_dir: self.data_dir.display().to_string(),
                    batch_size: (samples as f64 / steps.max(1) as f64).round() as u64,
                    read_threads: used_t.iter().map(|t| t.concurrency as u64).max().unwrap_or(1),
                    prefetch_size: self
                        .prefetch_override
                        .unwrap_or(used_t.iter().map(|t| t.prefetch as u64).max().unwrap_or(1)),
                    transfer_size: program.max_request(),
                    computation_time: match self.compute_override {
                        Some(c) => format!("{c} s (--computation-time)"),
                        None => "inferred per GPU from the trace (job model)".into(),
                    },
                    computation_time_mean_s: self.compute_override.unwrap_or(if steps > 0 { compute / steps as f64 } else { 0.0 }),
                    steps_per_epoch: program.steps_per_epoch,
                    epochs: w.epochs,
                    barrier: self.barrier,
                    odirect: self.odirect,
                    drop_caches: self.drop_caches,
                    realtime: self.realtime,
                    io_engine: if self.psync { "psync" } else { "io_uring" }.into(),
                    nominal_sample_bytes: if samples > 0 { bytes as f64 / samples as f64 } else { 0.0 },
                    dataset_files: used.len() as u64,
                    dataset_bytes: used_bytes,
                    params: Vec::new(),
                    reader: None,
                    templates: Some(
                        program
                            .templates()
                            .iter()
                            .map(|t| serde_json::json!({
                                "host": t.host, "pid": t.pid, "comm": t.comm, "files": t.files.len(), "steps": t.steps.len(),
                                "readers": t.concurrency, "workers": t.workers, "synchronous": t.synchronous, "paced": t.paced,
                                "prefetch": t.prefetch, "compute_s": t.compute_s, "handoff_s": t.handoff_s, "sync_s": t.sync_s, "bytes": t.bytes, "dev": t.dev,
                                "write_bursts": t.write_bursts.len(), "write_bytes": t.write_bytes(), "write_files": t.write_files.len(),
                                "write_after_steps": t.write_bursts.keys().collect::<Vec<_>>(),
                                "required_mib_s": t.required_mib_s,
                            }))
                            .collect(),
                    ),
                    gpus_per_process: Some(self.gpus_per_process),
                    compute_scale: Some(self.compute_scale.unwrap_or(1.0)),
                    required_mib_s_per_gpu: required,
                    map_path: Some(
                        self.map_path
                            .as_ref()
                            .map(|m| {
                                m.0.iter().map(|(o, n)| format!("{}={}", o.display(), n.display())).collect()
                            })
                            .unwrap_or_default(),
                    ),
                };
                self.execute(cluster, &program, &local, gpus, used_bytes, settings, clients, None)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn execute<P: Program>(
        &self,
        cluster: &Cluster,
        program: &P,
        local: &[u64],
        gpus: u64,
        used_bytes: u64,
        settings: Settings,
        clients: Option<(u64, u64)>,
        objects: Option<crate::s3_reads::ObjectSet>,
    ) -> Result<Option<serde_json::Value>> {
        if let (Some((hosts, client_ram)), None) = (clients, &self.s3) {
            if !self.odirect
                && !self.drop_caches
                && used_bytes < 5 * client_ram
                && !self.cache_warned.swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                eprintln!(
                    "trainio replay: warning: the dataset ({}) is smaller than 5 × the RAM of the {hosts} client host(s) (5 × {} = {}): reads may come from the page cache and AU would say nothing about storage; pass --odirect or --drop-caches, or generate more data (MLPerf's rule)",
                    datasize::gib(used_bytes as f64),
                    datasize::gib(client_ram as f64),
                    datasize::gib(5.0 * client_ram as f64)
                );
            }
        }
        if self.drop_caches {
            unsafe { libc::sync() };
            std::fs::write("/proc/sys/vm/drop_caches", b"3")
                .context("--drop-caches: writing /proc/sys/vm/drop_caches (needs root)")?;
        }
        program.prepare()?;
        let options = EngineOptions {
            odirect: self.odirect,
            barrier: self.barrier,
            progress: self.progress,
            realtime: self.realtime,
            psync: self.psync,
        };
        // Checkpoints go into the dataset's directory, which the dataset marker makes ours.
        let checkpointer = match &self.templates {
            None => self.checkpointer(cluster, gpus)?,
            Some(_) => None,
        };
        let run = match (&self.s3, objects) {
            (Some(t), Some(objects)) => {
                let slots = (0..local.len()).map(|g| program.read_threads(g).max(1)).sum();
                let backend = crate::s3_reads::S3Reads::new(
                    slots,
                    (*t.endpoint).clone(),
                    t.store.library.pattern(),
                    objects,
                    program.max_request().max(1),
                )?;
                let engine =
                    Engine::with_backend(program, local, cluster.rank, cluster, options, self.workload.seed, backend)?
                        .with_checkpoints(checkpointer.as_ref());
                cluster.barrier()?;
                timed(|| metered(|| engine.run()))?
            }
            _ => {
                let engine = Engine::new(program, local, cluster.rank, cluster, options, self.workload.seed)?
                    .with_checkpoints(checkpointer.as_ref());
                cluster.barrier()?;
                timed(|| metered(|| engine.run()))?
            }
        };
        let ((run, client), cpu_s) = run;
        let mut run = run;
        if let (Some(t), Some(reads)) = (&self.s3, run.object.take()) {
            // The reads' log and this rank's other requests (checkpoints) together.
            let mut all = crate::s3_client::RequestLog::from_wire(&reads).unwrap_or_default();
            all.merge(&t.log.lock().unwrap());
            run.object = Some(all.to_wire());
        }
        let report = RankReport {
            rank: cluster.rank,
            hostname: cluster.hostname.clone(),
            mem_total_bytes: mem_total_bytes(),
            cpu_s,
            client,
            run,
        };
        let gathered = cluster.gather(serde_json::to_vec(&report)?);
        let Some(all) = gathered else { return Ok(None) };
        let reports: Vec<RankReport> =
            all.iter().map(|b| serde_json::from_slice(b)).collect::<Result<_, _>>().context("decoding rank results")?;
        let mut summary = results::summarize(&reports, &settings, self.threshold_percent);
        if let Some(why) = reports.iter().find_map(|r| r.run.stopped.clone()) {
            summary["stopped"] = why.into();
        }
        if let Some(lost) = cluster.lost() {
            // Found at the gather (--no-barrier: the ranks still heard from ran to their
            // end): the results are theirs.
            if summary.get("stopped").is_none() {
                summary["stopped"] =
                    format!("{}: the results are those of the ranks still heard from", lost.describe()).into();
            }
            summary["lost"] = lost.to_json();
        }
        if let Some(c) = &checkpointer {
            let per_rank: Vec<_> = reports.iter().map(|r| r.run.checkpoints.clone()).collect();
            summary["checkpoint"] = checkpointing::with_ios(checkpointing::plan_json(&c.spec, &c.plan), &per_rank);
        }
        if self.templates.is_some() {
            let per_rank: Vec<_> = reports.iter().map(|r| r.run.checkpoints.clone()).collect();
            summary["writes"] = crate::trace_writes::summary(&per_rank);
        }
        if let Some(t) = &self.s3 {
            if let Some(o) = crate::s3_writes::combine_logs(reports.iter().filter_map(|r| r.run.object.as_ref())) {
                summary["object"] = o;
            }
            summary["settings"]["storage"] = t.settings_json();
        }
        Ok(Some(summary))
    }
}

/// `f`'s result with the scheduler's account of this rank's threads over it (client.rs).
fn metered<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, crate::client::ClientCpu)> {
    let meter = crate::client::Meter::start();
    let out = f()?;
    Ok((out, meter.finish()))
}

/// Runs `f`, with the process CPU seconds it took.
fn timed<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, f64)> {
    let cpu0 = cpu_seconds();
    let out = f()?;
    Ok((out, cpu_seconds() - cpu0))
}

fn median(v: &[f64]) -> Option<f64> {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    match s.len() {
        0 => None,
        n if n % 2 == 1 => Some(s[n / 2]),
        n => Some((s[n / 2 - 1] + s[n / 2]) / 2.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uneven_split_covers_every_gpu_once() {
        for (gpus, ranks) in [(5u64, 2usize), (7, 3), (2, 4), (288, 7)] {
            let all: Vec<u64> = (0..ranks).flat_map(|r| split(gpus, ranks, r)).collect();
            assert_eq!(all, (0..gpus).collect::<Vec<_>>());
            let sizes: Vec<usize> = (0..ranks).map(|r| split(gpus, ranks, r).len()).collect();
            assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
        }
        assert_eq!(split(5, 2, 0), vec![0, 1, 2]);
    }
}
