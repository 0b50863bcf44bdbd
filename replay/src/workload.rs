//! DLIO / MLPerf Storage workload files, read as they are.
//!
//! The YAML is walked as a generic value tree instead of a fixed serde struct because the
//! published files differ in small ways that a strict struct would reject: v1.0 spells the
//! record keys `record_length*`, v2.0 `record_length_bytes*`; `model` is a string in some
//! files and a mapping in others; numbers are sometimes quoted; `computation_time` is a
//! scalar or a distribution. Keys we do not use are ignored, as DLIO ignores them.
//!
//! Workload mode's parts live beside it in workload/: unmodeled.rs (what a run does not
//! model, named before it starts), dlio_dataset.rs (a dataset DLIO generated, replayed in
//! place) and program.rs (what each simulated GPU reads). The typed reads of the YAML's
//! keys are in yaml_keys.rs, which the checkpoint and Parquet sections use too.

pub mod dlio_dataset;
pub mod program;
pub mod unmodeled;

use crate::checkpoint::CheckpointSpec;
use crate::yaml_keys::{boolean, first_number, number, section, short, string, to_f64, uint};
use anyhow::{bail, Context, Result};
use rand::Rng;
use rand_distr::{Distribution, Exp, Gamma, Normal, Poisson};
use serde_yaml::Value;
use std::path::Path;

/// How long the emulated accelerator computes on one batch.
#[derive(Debug, Clone, PartialEq)]
pub enum ComputeTime {
    Fixed(f64),
    Normal { mean: f64, stdev: f64 },
    Uniform { min: f64, max: f64 },
    Gamma { shape: f64, scale: f64 },
    Exponential { scale: f64 },
    Poisson { lam: f64 },
}

impl ComputeTime {
    /// Draws one step's computation time in seconds (never negative).
    pub fn sample<R: Rng>(&self, rng: &mut R) -> f64 {
        let seconds = match *self {
            ComputeTime::Fixed(s) => s,
            ComputeTime::Normal { mean, stdev } if stdev > 0.0 => {
                Normal::new(mean, stdev).map(|d| d.sample(rng)).unwrap_or(mean)
            }
            ComputeTime::Normal { mean, .. } => mean,
            ComputeTime::Uniform { min, max } if max > min => rng.gen_range(min..max),
            ComputeTime::Uniform { min, .. } => min,
            ComputeTime::Gamma { shape, scale } => {
                Gamma::new(shape, scale).map(|d| d.sample(rng)).unwrap_or(shape * scale)
            }
            ComputeTime::Exponential { scale } if scale > 0.0 => {
                Exp::new(1.0 / scale).map(|d| d.sample(rng)).unwrap_or(scale)
            }
            ComputeTime::Exponential { scale } => scale,
            ComputeTime::Poisson { lam } if lam > 0.0 => Poisson::new(lam).map(|d| d.sample(rng)).unwrap_or(lam),
            ComputeTime::Poisson { lam } => lam,
        };
        seconds.max(0.0)
    }

    pub fn mean(&self) -> f64 {
        match *self {
            ComputeTime::Fixed(s) => s,
            ComputeTime::Normal { mean, .. } => mean,
            ComputeTime::Uniform { min, max } => (min + max) / 2.0,
            ComputeTime::Gamma { shape, scale } => shape * scale,
            ComputeTime::Exponential { scale } => scale,
            ComputeTime::Poisson { lam } => lam,
        }
    }

    pub fn describe(&self) -> String {
        match *self {
            ComputeTime::Fixed(s) => format!("{s} s"),
            ComputeTime::Normal { mean, stdev } => {
                format!("normal(mean {mean} s, stdev {stdev} s)")
            }
            ComputeTime::Uniform { min, max } => format!("uniform({min} s, {max} s)"),
            ComputeTime::Gamma { shape, scale } => format!("gamma(shape {shape}, scale {scale} s)"),
            ComputeTime::Exponential { scale } => format!("exponential(scale {scale} s)"),
            ComputeTime::Poisson { lam } => format!("poisson(lam {lam} s)"),
        }
    }
}

/// Shuffling as DLIO spells it: off, or seeded/random.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shuffle {
    Off,
    Seed,
    Random,
}

/// The parts of a DLIO workload that drive storage I/O.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub name: String,
    pub format: String,
    pub data_loader: String,
    pub num_files_train: u64,
    pub num_samples_per_file: u64,
    pub num_subfolders_train: u64,
    /// On-disk bytes of one sample (mean of the distribution).
    pub record_length: f64,
    pub record_length_stdev: f64,
    /// A sample's bytes as MLPerf's dataset-size rule counts them: record_length_bytes,
    /// else for Parquet the sum of its columns (edition::parquet_rule_record_length),
    /// else record_length.
    pub rule_record_length: f64,
    /// `dataset.chunk_dims`, the hdf5 dataset's chunk shape as DLIO passes it to h5py
    /// (empty when absent or not a list of non-negative integers); hdf5.rs decides
    /// which the replay models.
    pub chunk_dims: Vec<u64>,
    pub batch_size: u64,
    pub read_threads: u64,
    /// `reader.read_threads: 0`: DLIO's loader reads in the main process (PyTorch's
    /// `num_workers=0`); the replay reads with one reader (`read_threads` is 1) and
    /// names the difference (unmodeled.rs).
    pub main_process_reads: bool,
    pub prefetch_size: u64,
    /// Bytes per read request; None = 1 MiB (see docs/replay.md).
    pub transfer_size: Option<u64>,
    pub odirect: bool,
    pub file_shuffle: Shuffle,
    pub sample_shuffle: Shuffle,
    pub epochs: u64,
    pub computation_time: ComputeTime,
    /// `reader.preprocess_time` (± `preprocess_time_stdev`), seconds: DLIO's reader
    /// sleeps a normal draw of it (clamped at 0) after reading each sample, in the
    /// worker, before the sample joins its batch (reader_handler.py, `preprocess`).
    pub preprocess_time: f64,
    pub preprocess_time_stdev: f64,
    pub seed: u64,
    /// Accelerator-utilization threshold in percent: metric.au × 100, else the edition's
    /// threshold for the model (edition.rs), else 90.
    pub au_threshold_percent: f64,
    /// Where au_threshold_percent comes from, in words.
    pub au_threshold_from: String,
    /// `workflow.checkpoint: true`: the model and checkpoint keys.
    pub checkpoint: Option<CheckpointSpec>,
    /// False for a checkpoint-only workload (`workflow.train: false`, or no `dataset`
    /// section, with `workflow.checkpoint: true`): MLPerf Storage's llama3 files.
    pub train: bool,
    /// `workflow.train: false` without checkpoints: a dataset to generate, no training
    /// (MLPerf's *_datagen.yaml).
    pub dataset_only: bool,
    /// Overrides (`--param KEY=VALUE`, `++workload.KEY=VALUE`) applied to the file, in
    /// order, each as `KEY=VALUE`.
    pub params: Vec<String>,
    /// `storage.storage_type: s3`: the dataset and checkpoints are objects (object_store.rs).
    pub object_store: Option<crate::object::object_store::ObjectStore>,
    /// `format: parquet`: the columns, row groups and codec of `dataset.parquet`
    /// (parquet_files.rs).
    pub parquet: Option<crate::formats::parquet_files::Spec>,
}

/// Every key trainio reads from a workload file: what `--param` may set.
pub const KNOWN_KEYS: &[&str] = &[
    "dataset.format",
    "dataset.num_files_train",
    "dataset.num_samples_per_file",
    "dataset.num_subfolders_train",
    "dataset.record_length_bytes",
    "dataset.record_length",
    "dataset.record_length_bytes_stdev",
    "dataset.record_length_stdev",
    "dataset.compression",
    "dataset.parquet.columns",
    "dataset.parquet.row_group_size",
    "dataset.parquet.generation_batch_size",
    "dataset.parquet.read_mode",
    "dataset.parquet.row_group_cache_size",
    "reader.data_loader",
    "reader.batch_size",
    "reader.read_threads",
    "reader.prefetch_size",
    "reader.transfer_size",
    "reader.odirect",
    "reader.file_shuffle",
    "reader.sample_shuffle",
    "reader.preprocess_time",
    "reader.preprocess_time_stdev",
    "train.epochs",
    "train.computation_time",
    "train.computation_time_stdev",
    "train.seed",
    "metric.au",
    "workflow.train",
    "workflow.checkpoint",
    "model.name",
    "model.type",
    "model.num_layers",
    "model.model_datatype",
    "model.optimizer_datatype",
    "model.model_size_bytes",
    "model.model_size",
    "model.parallelism.tensor",
    "model.parallelism.pipeline",
    "model.parallelism.data",
    "model.parallelism.zero_stage",
    "model.transformer.vocab_size",
    "model.transformer.hidden_size",
    "model.transformer.ffn_hidden_size",
    "model.transformer.num_attention_heads",
    "model.transformer.num_kv_heads",
    "checkpoint.checkpoint_folder",
    "checkpoint.num_checkpoints_write",
    "checkpoint.num_checkpoints_read",
    "checkpoint.time_between_checkpoints",
    "checkpoint.fsync",
    "checkpoint.mode",
    "checkpoint.checkpoint_after_epoch",
    "checkpoint.epochs_between_checkpoints",
    "checkpoint.steps_between_checkpoints",
    "checkpoint.model_size",
    "storage.storage_type",
    "storage.storage_root",
    "storage.storage_library",
    "storage.protocol",
    "storage.storage_options.endpoint_url",
    "storage.storage_options.region",
    "storage.storage_options.secure",
    "storage.storage_options.access_key_id",
    "storage.storage_options.secret_access_key",
    "dataset.data_folder",
];

/// Keys of DLIO's sections that trainio does not read and that do not change the I/O it
/// emulates: no warning for them.
pub const QUIET_KEYS: &[&str] = &[
    // which of DLIO's generators writes the Parquet files (s3dlio's or pyarrow's): the
    // files' layout is the section's either way
    "dataset.parquet.use_s3dlio_gen",
    "dataset.record_length_bytes_resize",
    "dataset.record_length_resize",
    "dataset.num_files_eval",
    "dataset.num_subfolders_eval",
    "dataset.file_prefix",
    "dataset.keep_files",
    "reader.shuffle_size",
    "reader.multiprocessing_context",
    "reader.read_type",
    "reader.batch_size_eval",
    "train.total_training_steps",
    "train.seed_change_epoch",
    "workflow.generate_data",
    "workflow.evaluation",
    "workflow.profiling",
    "storage.storage_options",
    // The replay always addresses buckets path-style and does not retry: neither changes
    // the requests a healthy endpoint sees.
    "storage.storage_options.s3_force_path_style",
    "storage.storage_options.s3_max_attempts",
    "reader.storage_type",
    "reader.storage_root",
    "reader.storage_library",
    "reader.storage_options",
    "reader.protocol",
    "checkpoint.type",
    "checkpoint.checkpoint_rank_sync",
    "checkpoint.steps_between_checkpoints",
];

fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// Warnings for keys of the file that trainio does not know but that are close to one it
/// reads (a typo silently runs with the default otherwise).
pub fn typo_warnings(root: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let Some(top) = root.as_mapping() else { return out };
    for (section, body) in top {
        let (Some(section), Some(body)) = (section.as_str(), body.as_mapping()) else { continue };
        for key in body.keys().filter_map(Value::as_str) {
            let dotted = format!("{section}.{key}");
            if KNOWN_KEYS.contains(&dotted.as_str()) || QUIET_KEYS.contains(&dotted.as_str()) {
                continue;
            }
            let close = KNOWN_KEYS
                .iter()
                .filter(|k| k.matches('.').count() == 1)
                .map(|k| (edit_distance(key, k.rsplit('.').next().unwrap_or(k)), *k))
                .filter(|(d, _)| *d <= 2)
                .min();
            if let Some((_, known)) = close {
                out.push(format!("{dotted}: not a key trainio reads; did you mean {known}?"));
            }
        }
    }
    out
}

/// Splits one override into (how the user spelled the key, the dotted key, the value).
/// Two spellings: `--param KEY=VALUE`, and DLIO's (Hydra's) `++workload.KEY=VALUE`
/// (also `+workload.` and `workload.`), where KEY is the same dotted path.
fn parse_override(param: &str) -> Result<(String, String, String)> {
    let Some((lhs, value)) = param.split_once('=') else {
        if param.starts_with('+') || param.starts_with("workload.") {
            bail!("{param}: expected ++workload.KEY=VALUE, e.g. ++workload.dataset.num_files_train=64");
        }
        bail!("--param {param}: expected KEY=VALUE, e.g. model.num_layers=2");
    };
    let lhs = lhs.trim();
    let hydra = lhs.trim_start_matches('+');
    if let Some(key) = hydra.strip_prefix("workload.") {
        return Ok((lhs.to_string(), key.to_string(), value.to_string()));
    }
    if lhs.starts_with('+') {
        bail!("{lhs}: not a workload override: DLIO's form is ++workload.KEY=VALUE (e.g. ++workload.dataset.num_files_train=64)");
    }
    Ok((format!("--param {lhs}"), lhs.to_string(), value.to_string()))
}

/// Overrides given as bare arguments must be in DLIO's form (`++workload.KEY=VALUE`):
/// anything else there is a mistyped option or a stray word.
pub fn hydra_overrides(args: &[String]) -> Result<Vec<String>> {
    for a in args {
        if !a.trim_start_matches('+').starts_with("workload.") {
            bail!("{a}: not a workload override: DLIO's form is ++workload.KEY=VALUE (e.g. ++workload.dataset.num_files_train=64), or use --param KEY=VALUE");
        }
    }
    Ok(args.to_vec())
}

/// Sets one override (see `parse_override`; KEY one of KNOWN_KEYS, VALUE a YAML scalar)
/// in the workload tree, so the value is then read and checked exactly as the file's own
/// would be. Returns it as `KEY=VALUE`.
fn apply_param(root: &mut Value, param: &str) -> Result<String> {
    let (label, key, value) = parse_override(param)?;
    let (key, value) = (key.as_str(), value.as_str());
    if !KNOWN_KEYS.contains(&key) {
        bail!("{label}: not a workload key trainio reads (see docs/replay.md, Inputs)");
    }
    let normalized = format!("{key}={value}");
    let value: Value =
        serde_yaml::from_str(value).with_context(|| format!("{label}: '{value}' is not a YAML scalar"))?;
    if value.is_mapping() || value.is_sequence() {
        bail!("{label}: give one value, not a mapping or a list");
    }
    let mut node = root;
    let parts: Vec<&str> = key.split('.').collect();
    for (i, part) in parts.iter().enumerate() {
        if !node.is_mapping() {
            // v1.0's `model: unet3d` becomes `model: {name: unet3d}` to take sub-keys.
            let name = node.as_str().map(str::to_string);
            let mut m = serde_yaml::Mapping::new();
            if let Some(n) = name {
                m.insert("name".into(), n.into());
            }
            *node = Value::Mapping(m);
        }
        let map = node.as_mapping_mut().expect("made a mapping above");
        if i + 1 == parts.len() {
            map.insert((*part).into(), value);
            return Ok(normalized);
        }
        node = map.entry((*part).into()).or_insert(Value::Null);
    }
    Ok(normalized)
}

/// DLIO's FormatType values (dlio_benchmark/common/enumerations.py; parquet since the
/// parquet reader of MLPerf Storage v3.0's DLIO): a workload of any other format is one
/// DLIO refuses to run.
pub const DLIO_FORMATS: &[&str] = &[
    "tfrecord",
    "hdf5",
    "csv",
    "npz",
    "npy",
    "hdf5_opt",
    "jpeg",
    "png",
    "indexed_binary",
    "mmap_indexed_binary",
    "synthetic",
    "parquet",
];

/// The largest workload file read (DLIO's and MLPerf's are a few KiB).
pub const MAX_WORKLOAD_BYTES: u64 = 1 << 20;

/// The text of a workload file, read up to MAX_WORKLOAD_BYTES: a directory, a device
/// such as /dev/zero or a huge file is refused by name, not read without end.
pub fn read_workload_text(path: &Path) -> Result<String> {
    use std::io::Read;
    let file =
        std::fs::File::open(path).with_context(|| format!("{}: cannot read the workload file", path.display()))?;
    let meta = file.metadata().with_context(|| format!("{}: cannot read the workload file", path.display()))?;
    if meta.is_dir() {
        bail!("{}: is a directory, not a workload file", path.display());
    }
    let mut bytes = Vec::new();
    file.take(MAX_WORKLOAD_BYTES + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("{}: cannot read the workload file", path.display()))?;
    if bytes.len() as u64 > MAX_WORKLOAD_BYTES {
        bail!("{}: larger than {} MiB, too large for a workload file", path.display(), MAX_WORKLOAD_BYTES >> 20);
    }
    String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("{}: not text (UTF-8)", path.display()))
}

impl Workload {
    /// Rows per chunk of its hdf5 files (0: contiguous), as formats::hdf5::chunk_rows
    /// maps its chunk_dims.
    pub fn hdf5_chunk_rows(&self) -> u64 {
        crate::formats::hdf5::chunk_rows(&crate::formats::hdf5::Samples {
            chunk_dims: &self.chunk_dims,
            record_length: self.record_length,
            record_length_stdev: self.record_length_stdev,
            per_file: self.num_samples_per_file,
        })
    }

    /// Trace mode's stand-in: the settings every recorded GPU shares, each GPU's loader
    /// coming from its template (trace_input.rs). A sample of 1 byte and DLIO's defaults
    /// (batch 1, one reader, prefetch 2, one epoch, no compute of its own, seed 123, AU
    /// 90%), its data on files or, with `store`, objects.
    pub fn trace_stand_in(trace_name: &str, store: Option<crate::object::object_store::ObjectStore>) -> Workload {
        Workload {
            name: format!("trace {trace_name}"),
            format: String::new(),
            data_loader: "pytorch".into(),
            num_files_train: 1,
            num_samples_per_file: 1,
            num_subfolders_train: 0,
            record_length: 1.0,
            record_length_stdev: 0.0,
            rule_record_length: 1.0,
            chunk_dims: Vec::new(),
            batch_size: 1,
            read_threads: 1,
            main_process_reads: false,
            prefetch_size: 2,
            transfer_size: None,
            odirect: false,
            file_shuffle: Shuffle::Off,
            sample_shuffle: Shuffle::Off,
            epochs: 1,
            computation_time: ComputeTime::Fixed(0.0),
            preprocess_time: 0.0,
            preprocess_time_stdev: 0.0,
            seed: 123,
            au_threshold_percent: 90.0,
            au_threshold_from: "90% without metric.au".into(),
            checkpoint: None,
            train: true,
            dataset_only: false,
            params: Vec::new(),
            object_store: store,
            parquet: None,
        }
    }

    /// Reads the file with `--param KEY=VALUE` overrides applied first.
    pub fn from_file_with(path: &Path, params: &[String]) -> Result<Workload> {
        let text = read_workload_text(path)?;
        let fallback = path.file_stem().and_then(|s| s.to_str()).unwrap_or("workload");
        let w = Workload::from_yaml_with(&text, fallback, params)
            .with_context(|| format!("{}: bad workload", path.display()))?;
        // Once per job: every MPI rank reads the file.
        let rank0 = std::env::var("OMPI_COMM_WORLD_RANK").map_or(true, |r| r == "0");
        if rank0 {
            if let Ok(root) = serde_yaml::from_str::<Value>(&text) {
                for w in typo_warnings(&root) {
                    eprintln!("trainio: warning: {}: {w}", path.display());
                }
            }
        }
        Ok(w)
    }

    #[cfg(test)]
    pub fn from_yaml(text: &str, fallback_name: &str) -> Result<Workload> {
        Workload::from_yaml_with(text, fallback_name, &[])
    }

    pub fn from_yaml_with(text: &str, fallback_name: &str, params: &[String]) -> Result<Workload> {
        let mut root: Value = serde_yaml::from_str(text).context("not valid YAML")?;
        if !root.is_mapping() {
            bail!("expected a mapping with the DLIO sections (dataset, reader, train)");
        }
        let mut applied = Vec::with_capacity(params.len());
        for p in params {
            applied.push(apply_param(&mut root, p)?);
        }
        let object_store = crate::object::object_store::ObjectStore::from_root(&root)?;
        let empty = Value::Mapping(Default::default());
        let workflow = root.get("workflow").unwrap_or(&empty);
        let do_checkpoint = boolean(workflow, "workflow", "checkpoint")?.unwrap_or(false);
        let do_train = boolean(workflow, "workflow", "train")?.unwrap_or(true);
        let checkpoint = if do_checkpoint { Some(CheckpointSpec::from_root(&root, fallback_name)?) } else { None };
        // MLPerf's llama3 files: checkpointing only, no dataset to read.
        let train = !(do_checkpoint && (!do_train || root.get("dataset").is_none()));
        let (dataset, reader, train_sec) = if train && do_train {
            (section(&root, "dataset")?, section(&root, "reader")?, section(&root, "train")?)
        } else if train {
            // MLPerf's *_datagen.yaml (`workflow.train: false`): a dataset, no reader or train.
            (
                section(&root, "dataset")?,
                root.get("reader").filter(|v| v.is_mapping()).unwrap_or(&empty),
                root.get("train").filter(|v| v.is_mapping()).unwrap_or(&empty),
            )
        } else {
            (
                root.get("dataset").filter(|v| v.is_mapping()).unwrap_or(&empty),
                root.get("reader").filter(|v| v.is_mapping()).unwrap_or(&empty),
                root.get("train").filter(|v| v.is_mapping()).unwrap_or(&empty),
            )
        };
        let train_flag = train;
        let train = train_sec;
        let metric = root.get("metric");

        let name = match root.get("model") {
            Some(Value::String(s)) => s.clone(),
            Some(m @ Value::Mapping(_)) => m.get("name").and_then(Value::as_str).unwrap_or(fallback_name).to_string(),
            _ => fallback_name.to_string(),
        };
        let format = string(dataset, "format").unwrap_or_default();
        let is_parquet = format.eq_ignore_ascii_case("parquet");
        let record_length = first_number(dataset, "dataset", &["record_length_bytes", "record_length"])?;
        // Parquet's columns give a row's bytes when the file does not.
        let parquet = match is_parquet {
            true => Some(crate::formats::parquet_files::Spec::from_dataset(dataset, record_length.unwrap_or(1.0))?),
            false => None,
        };
        let record_length = record_length
            .or(parquet.as_ref().map(|p| p.row_bytes() as f64))
            .or((!train_flag).then_some(1.0))
            .context("dataset.record_length_bytes (or v1.0's record_length) is required")?;
        if record_length <= 0.0 {
            bail!("dataset.record_length_bytes must be positive, got {record_length}");
        }
        if !format.is_empty() && !DLIO_FORMATS.contains(&format.to_ascii_lowercase().as_str()) {
            bail!("dataset.format: '{format}' is not a format DLIO reads ({})", DLIO_FORMATS.join(", "));
        }
        let record_length_stdev =
            first_number(dataset, "dataset", &["record_length_bytes_stdev", "record_length_stdev"])?.unwrap_or(0.0);
        let rule_record_length = match first_number(dataset, "dataset", &["record_length_bytes"])? {
            Some(r) => r,
            None if format.eq_ignore_ascii_case("parquet") => {
                crate::mlperf::edition::parquet_rule_record_length(dataset).unwrap_or(record_length)
            }
            None => record_length,
        };
        let batch_size = uint(reader, "reader", "batch_size")?.unwrap_or(1);
        let read_threads = uint(reader, "reader", "read_threads")?.unwrap_or(1);
        let main_process_reads = read_threads == 0;
        let read_threads = read_threads.max(1);
        let prefetch_size = uint(reader, "reader", "prefetch_size")?.unwrap_or(2);
        let computation_time = compute_time(train)?;
        let preprocess_time = number(reader, "reader", "preprocess_time")?.unwrap_or(0.0);
        let preprocess_time_stdev = number(reader, "reader", "preprocess_time_stdev")?.unwrap_or(0.0);
        let au = match metric {
            Some(m) => number(m, "metric", "au")?,
            None => None,
        };
        let edition_au = crate::mlperf::edition::au_threshold_percent(&name);
        let (au_threshold_percent, au_threshold_from) = match (au, edition_au) {
            (Some(a), Some(e)) => (
                if a <= 1.0 { a * 100.0 } else { a },
                format!("metric.au; {}'s threshold for {name}: {e:.0}%", crate::mlperf::edition::EDITION),
            ),
            (Some(a), None) => (if a <= 1.0 { a * 100.0 } else { a }, "metric.au".to_string()),
            (None, Some(e)) => (e, format!("{}'s threshold for {name}", crate::mlperf::edition::EDITION)),
            (None, None) => (90.0, "90% without metric.au".to_string()),
        };
        let workload = Workload {
            name,
            format,
            data_loader: string(reader, "data_loader")
                .or_else(|| root.get("framework").and_then(Value::as_str).map(str::to_string))
                .unwrap_or_else(|| "pytorch".into()),
            num_files_train: uint(dataset, "dataset", "num_files_train")?.unwrap_or(1),
            num_samples_per_file: uint(dataset, "dataset", "num_samples_per_file")?.unwrap_or(1),
            num_subfolders_train: uint(dataset, "dataset", "num_subfolders_train")?.unwrap_or(0),
            record_length,
            record_length_stdev,
            rule_record_length,
            chunk_dims: dataset
                .get("chunk_dims")
                .and_then(Value::as_sequence)
                .and_then(|s| s.iter().map(Value::as_u64).collect::<Option<Vec<u64>>>())
                .unwrap_or_default(),
            batch_size,
            read_threads,
            main_process_reads,
            prefetch_size,
            transfer_size: uint(reader, "reader", "transfer_size")?,
            odirect: boolean(reader, "reader", "odirect")?.unwrap_or(false),
            file_shuffle: shuffle(reader, "file_shuffle")?,
            sample_shuffle: shuffle(reader, "sample_shuffle")?,
            epochs: uint(train, "train", "epochs")?.unwrap_or(1),
            computation_time,
            preprocess_time,
            preprocess_time_stdev,
            seed: uint(train, "train", "seed")?.unwrap_or(123),
            au_threshold_percent,
            au_threshold_from,
            checkpoint,
            train: train_flag,
            dataset_only: train_flag && !do_train,
            params: applied,
            object_store,
            parquet,
        };
        workload.validate()?;
        Ok(workload)
    }

    pub fn validate(&self) -> Result<()> {
        for (key, v) in [
            ("dataset.num_files_train", self.num_files_train),
            ("dataset.num_samples_per_file", self.num_samples_per_file),
            ("reader.batch_size", self.batch_size),
            ("reader.read_threads", self.read_threads),
            ("train.epochs", self.epochs),
        ] {
            if v == 0 {
                bail!("{key} must be at least 1");
            }
        }
        if self.computation_time.mean() < 0.0 {
            bail!("train.computation_time must not be negative");
        }
        for (key, v) in [
            ("reader.preprocess_time", self.preprocess_time),
            ("reader.preprocess_time_stdev", self.preprocess_time_stdev),
        ] {
            // An hour a sample is beyond any decoder; the bound keeps the nanoseconds in u64.
            if !(0.0..=3600.0).contains(&v) {
                bail!("{key} must be between 0 and 3600 seconds, got {v}");
            }
        }
        if self.transfer_size == Some(0) {
            bail!("reader.transfer_size must be positive");
        }
        // The dataset's size is a product of keys: it must stay addressable (an overflow
        // made 0-byte files that a replay then read at 0 MiB/s and called a pass).
        if self.train {
            const MAX_SAMPLE: f64 = (1u64 << 40) as f64;
            const MAX_DATASET: f64 = (1u64 << 60) as f64;
            let sample = self.record_length + 3.0 * self.record_length_stdev;
            if sample > MAX_SAMPLE {
                bail!("dataset.record_length_bytes {} is beyond 1 TiB per sample", self.record_length);
            }
            if self.record_length_stdev < 0.0 {
                bail!("dataset.record_length_bytes_stdev must not be negative");
            }
            let total = self.num_files_train as f64 * self.num_samples_per_file as f64 * self.record_length;
            if total > MAX_DATASET {
                bail!(
                    "the dataset would hold {total:.3e} bytes (num_files_train × num_samples_per_file × record_length_bytes): beyond 1 EiB"
                );
            }
        }
        Ok(())
    }
}

fn shuffle(reader: &Value, key: &str) -> Result<Shuffle> {
    match reader.get(key) {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(Shuffle::Off),
        Some(Value::Bool(true)) => Ok(Shuffle::Seed),
        Some(Value::String(s)) => match s.to_ascii_lowercase().as_str() {
            "off" | "none" | "false" => Ok(Shuffle::Off),
            "seed" | "true" => Ok(Shuffle::Seed),
            "random" => Ok(Shuffle::Random),
            other => bail!("reader.{key} must be off, seed or random, got '{other}'"),
        },
        Some(v) => bail!("reader.{key} must be off, seed or random, got {}", short(v)),
    }
}

/// `train.computation_time`: a scalar (with an optional `computation_time_stdev` beside it)
/// or a mapping `{mean, stdev}` / `{type: normal|uniform|gamma|exponential|poisson, ...}`.
fn compute_time(train: &Value) -> Result<ComputeTime> {
    let stdev = number(train, "train", "computation_time_stdev")?.unwrap_or(0.0);
    let spec = match train.get("computation_time") {
        None | Some(Value::Null) => return Ok(ComputeTime::Fixed(0.0)),
        Some(v) => v,
    };
    if let Some(s) = to_f64(spec) {
        if !s.is_finite() {
            bail!("train.computation_time must be a finite number, got {s}");
        }
        return Ok(if stdev > 0.0 { ComputeTime::Normal { mean: s, stdev } } else { ComputeTime::Fixed(s) });
    }
    if !spec.is_mapping() {
        bail!("train.computation_time must be a number or a distribution mapping, got {}", short(spec));
    }
    let field = |k: &str| number(spec, "train.computation_time", k);
    let need = |k: &str| -> Result<f64> {
        field(k)?.with_context(|| format!("train.computation_time needs '{k}' for this distribution"))
    };
    let kind = spec.get("type").and_then(Value::as_str).unwrap_or("normal").to_ascii_lowercase();
    let ct = match kind.as_str() {
        "normal" | "gaussian" => ComputeTime::Normal { mean: need("mean")?, stdev: field("stdev")?.unwrap_or(stdev) },
        "uniform" => ComputeTime::Uniform { min: need("min")?, max: need("max")? },
        "gamma" => ComputeTime::Gamma { shape: need("shape")?, scale: need("scale")? },
        "exponential" => ComputeTime::Exponential { scale: need("scale")? },
        "poisson" => ComputeTime::Poisson { lam: need("lam")? },
        other => {
            bail!("train.computation_time type '{other}' is not one of normal, uniform, gamma, exponential, poisson")
        }
    };
    Ok(ct)
}

#[cfg(test)]
#[path = "workload/workload_tests.rs"]
mod tests;
