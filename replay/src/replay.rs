//! One replay job: arguments → validated configuration → dataset → engine → results.
//!
//! This file holds the job (`Job`) and what every command asks of it (its dataset's
//! layout, its checkpoints); beside it in replay/: prepare.rs (arguments → validated
//! `Job`), datagen.rs (the dataset written) and run.rs (the replay run and its results).

mod datagen;
mod prepare;
mod run;
mod space;

use crate::checkpoint::checkpointing::{self, Checkpointer};
use crate::checkpoint::Plan;
use crate::cluster::Cluster;
use crate::dataset::{self, Layout};
use crate::trace::trace_input::{PathMap, Placement, Template};
use crate::workload::Workload;
use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

pub use crate::errors::InputError;

pub const DEFAULT_TRANSFER: u64 = 1 << 20;
/// The longest --computation-time (a day per step): a time that fits a Duration.
pub const MAX_COMPUTE_S: f64 = 86_400.0;
/// From this many files on, datagen checks a lower bound of the dataset's bytes against
/// the free space before it builds the layout.
const PRECHECK_FILES: u64 = 1_000_000;

/// Where a job's I/O comes from: the mode of every command.
#[derive(Debug, Clone)]
pub enum Source {
    /// `--workload FILE.yaml`: the job's `workload` is read from it.
    Workload(PathBuf),
    /// `--trace TRACE`: the recorded job; the job's `workload` is a stand-in carrying the
    /// settings its GPUs share.
    Trace(PathBuf, Box<Recorded>),
}

/// Trace mode: the recorded job, and how it is replayed.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The GPUs of the trace's job model.
    pub templates: Vec<Template>,
    /// The job model the templates come from.
    pub model: trainio_model::JobModel,
    /// --gpus-per-process (1: as recorded).
    pub gpus_per_process: u32,
    /// --compute-scale.
    pub compute_scale: Option<f64>,
    /// --map-path given: the replay reads the job's own files in place.
    pub map_path: Option<PathMap>,
}

impl Source {
    /// The workload file or the trace, as given.
    pub fn path(&self) -> &Path {
        match self {
            Source::Workload(p) | Source::Trace(p, _) => p,
        }
    }

    /// Trace mode's recorded job; None in workload mode.
    pub fn recorded(&self) -> Option<&Recorded> {
        match self {
            Source::Workload(_) => None,
            Source::Trace(_, r) => Some(r),
        }
    }
}

/// The path as messages and results name it.
impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.path().display().fmt(f)
    }
}

#[derive(Debug, Clone)]
pub struct Job {
    /// Workload mode: the workload; trace mode: a stand-in carrying the shared settings.
    pub workload: Workload,
    /// The workload file, or the trace and its recorded job.
    pub source: Source,
    pub compute_override: Option<f64>,
    /// --prefetch-size given: trace mode uses it instead of each GPU's loader window.
    pub prefetch_override: Option<u64>,
    pub data_dir: PathBuf,
    pub transfer_size: u64,
    /// TensorFlow's reader buffer for TFRecord files: the transfer size when one is given
    /// (DLIO passes reader.transfer_size as TFRecordDataset's buffer_size), else TF's 256 KiB.
    pub tf_buffer: u64,
    pub max_steps: u64,
    pub threshold_percent: f64,
    /// How the engine reads and paces: O_DIRECT, the step barrier, progress, SCHED_FIFO,
    /// the I/O engine; handed to each run's engine as they are.
    pub engine: crate::engine::EngineOptions,
    pub drop_caches: bool,
    pub generate: bool,
    pub force: bool,
    /// The page-cache warning was printed (once per command, not once per `--runs` run).
    pub cache_warned: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// `storage.storage_type: s3`: the dataset and checkpoints are objects there, checked
    /// (endpoint, credentials, bucket) before any work; --data-dir is not used.
    pub s3: Option<crate::object::s3_writes::S3Target>,
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

impl Job {
    /// The dataset for `gpus`; its size is bounded (dataset::MAX_FILES) before anything
    /// in proportion to it is allocated.
    pub fn layout(&self, gpus: u64) -> Result<Layout> {
        match self.placement(gpus) {
            Some(p) => Ok(p.layout),
            None => {
                let needed = self.bounded_files(gpus)?;
                let layout = Layout::from_workload(&self.workload, gpus, self.max_steps, &self.data_dir);
                if self.in_place_dlio() {
                    return crate::workload::dlio_dataset::layout(&self.workload, &layout, needed)
                        .map_err(|e| InputError(e).into());
                }
                Ok(layout)
            }
        }
    }

    /// Workload mode, without --generate, on a directory that holds no trainio dataset
    /// but DLIO's `train/`: the dataset DLIO generated, read in place (dlio_dataset.rs).
    pub fn in_place_dlio(&self) -> bool {
        self.source.recorded().is_none() && !self.generate && crate::workload::dlio_dataset::looks_like(&self.data_dir)
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
        self.source.recorded().map(|r| Placement::new(&r.templates, gpus, &self.data_dir, r.map_path.as_ref()))
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
            odirect: self.engine.odirect,
            s3: self.s3.clone(),
        }))
    }

    /// What a checkpoint-only run echoes as its settings.
    fn checkpoint_settings(&self) -> serde_json::Value {
        serde_json::json!({
            "mode": "checkpoint",
            "source": self.source.to_string(),
            "name": self.workload.name,
            "data_dir": self.data_dir.display().to_string(),
            "params": self.workload.params,
            "transfer_size": self.transfer_size,
            "odirect": self.engine.odirect,
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
        let writes = ckpt.spec.num_checkpoints_write;
        self.check_checkpoint_space(cluster, &ckpt, writes, |e, s| e == 1 && (1..=writes).contains(&s))?;
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
        checkpointing::run_checkpoint_only(&ckpt, cluster, self.checkpoint_settings(), self.engine.progress)
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
