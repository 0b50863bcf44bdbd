//! Arguments → validated configuration: `Job::prepare` reads the workload or the trace,
//! applies the command line's overrides, refuses what the readers it models refuse, and
//! checks object storage before any work. Every refusal is an InputError naming the
//! option or key.

use super::{Job, Recorded, Source, DEFAULT_TRANSFER, MAX_COMPUTE_S};
use crate::cli::{ReplayArgs, RunArgs, SweepArgs};
use crate::errors::InputError;
use crate::formats::Format;
use crate::object::s3_writes::S3Target;
use crate::trace::trace_input::{self, PathMap};
use crate::workload::{ComputeTime, Workload};
use anyhow::{bail, Result};
use std::path::Path;

impl Job {
    /// `trainio replay`'s job for `ranks` MPI ranks: a run's (`prepare`), and what the
    /// command asks of it checked (a GPU per rank, training to replay, --runs that
    /// repeat a training run).
    pub fn for_replay(args: &ReplayArgs, ranks: usize) -> Result<Job> {
        let job = Job::prepare(&args.run)?;
        if args.gpus < ranks as u64 {
            bail!(InputError(format!(
                "--gpus {} is fewer than the {} MPI ranks: give every rank at least one simulated GPU",
                args.gpus, ranks
            )));
        }
        if job.workload.dataset_only {
            bail!(InputError(format!(
                "{}: workflow.train is false and there is no checkpoint: a dataset to generate, nothing to replay (run 'trainio datagen' with it)",
                job.source
            )));
        }
        if args.runs > 1 && (args.plan_only || !job.workload.train) {
            bail!(InputError(format!(
                "--runs {}: repeats a training run; {} runs once",
                args.runs,
                if args.plan_only { "--plan-only" } else { "a checkpoint-only workload" }
            )));
        }
        Ok(job)
    }

    /// `trainio sweep`'s job for `ranks` MPI ranks and the GPU count its search starts
    /// at: a run's (`prepare`), of a workload or trace that trains, with --start-gpus (at
    /// least one GPU per rank) not above --max-gpus.
    pub fn for_sweep(args: &SweepArgs, ranks: usize) -> Result<(Job, u64)> {
        let job = Job::prepare(&args.run)?;
        if job.workload.dataset_only {
            bail!(InputError(format!(
                "{}: workflow.train is false and there is no checkpoint: a dataset to generate, nothing to sweep (run 'trainio datagen' with it)",
                job.source
            )));
        }
        if !job.workload.train {
            bail!(InputError(format!(
                "{}: a checkpoint-only workload has no AU to sweep: run 'trainio replay' with it",
                job.source
            )));
        }
        let start = args.start_gpus.unwrap_or(1).max(ranks as u64);
        if start > args.max_gpus {
            bail!(InputError(format!("--start-gpus {start} is above --max-gpus {}", args.max_gpus)));
        }
        Ok((job, start))
    }

    /// A run's arguments (replay's, sweep's, or datagen's as `RunArgs::datagen` makes
    /// them) turned into the validated job: the workload or the trace read, the
    /// overrides applied, every check that needs no dataset made.
    pub fn prepare(args: &RunArgs) -> Result<Job> {
        let src = &args.source;
        let rd = &args.reader;
        if !args.quiet {
            crate::progress::interval()?;
        }
        let (mut w, source) = match (&src.workload, &src.trace) {
            (Some(path), _) => (workload_source(args, path)?, Source::Workload(path.clone())),
            (None, Some(trace)) => {
                let (w, recorded) = trace_source(args, trace)?;
                (w, Source::Trace(trace.clone(), Box::new(recorded)))
            }
            (None, None) => bail!(InputError("give --workload FILE.yaml or --trace TRACE".into())),
        };
        let path = source.path();
        apply_overrides(&mut w, args)?;
        let threshold = args.io.threshold.unwrap_or(w.au_threshold_percent);
        if !(0.0..=100.0).contains(&threshold) {
            bail!(InputError(format!("--threshold must be between 0 and 100 percent, got {threshold}")));
        }
        check_odirect(&w, args, source.recorded().is_some(), path)?;
        let s3 = object_target(&w, args, path)?;
        let engine = crate::engine::EngineOptions {
            odirect: args.io.odirect || w.odirect,
            barrier: !args.io.no_barrier,
            progress: !args.quiet,
            realtime: args.io.realtime,
            psync: args.io.io_engine == crate::cli::IoEngine::Psync,
        };
        Ok(Job {
            s3,
            engine,
            compute_override: rd.computation_time,
            prefetch_override: rd.prefetch_size,
            transfer_size: rd.transfer_size.or(w.transfer_size).unwrap_or(DEFAULT_TRANSFER),
            tf_buffer: rd.transfer_size.or(w.transfer_size).unwrap_or(crate::workload::program::TF_BUFFER),
            workload: w,
            source,
            // Absolute: every path beneath it is resolved against the directory opened once
            // (beneath.rs), and a relative one would be taken twice.
            data_dir: std::path::absolute(&src.data_dir).unwrap_or_else(|_| src.data_dir.clone()),
            max_steps: src.steps.unwrap_or(0),
            threshold_percent: threshold,
            drop_caches: args.io.drop_caches,
            generate: args.io.generate,
            force: src.force,
            cache_warned: Default::default(),
        })
    }
}

/// Workload mode: the workload file with --param, Hydra's overrides and
/// --checkpoint-mode applied, its unmodeled features printed.
fn workload_source(args: &RunArgs, path: &Path) -> Result<Workload> {
    let src = &args.source;
    if args.trace.gpus_per_process != 1 || args.trace.compute_scale.is_some() || !args.trace.map_path.is_empty() {
        bail!(InputError(
            "--gpus-per-process, --compute-scale and --map-path change a recorded job: they go with --trace, not --workload".into()
        ));
    }
    if src.storage_root.is_some() {
        bail!(InputError(
            "--storage-root is for --trace: a workload names its bucket in storage.storage_root (or --param storage.storage_root=BUCKET)".into()
        ));
    }
    let mut params = src.params.clone();
    params.extend(crate::workload::hydra_overrides(&src.overrides).map_err(|e| InputError(format!("{e:#}")))?);
    if let Some(mode) = &args.reader.checkpoint_mode {
        params.push(format!("checkpoint.mode={mode}"));
    }
    let w = Workload::from_file_with(path, &params).map_err(|e| InputError(format!("{e:#}").replace('\n', " ")))?;
    if w.train && w.checkpoint.is_some() && args.io.no_barrier {
        bail!(InputError(format!(
            "{}: checkpoints inside training stop every simulated GPU at a step barrier: drop --no-barrier (or pass --param workflow.checkpoint=false)",
            path.display()
        )));
    }
    crate::workload::unmodeled::print(path, &w);
    Ok(w)
}

/// Trace mode: the trace's job model and its GPUs as templates, with a stand-in workload
/// that carries the settings every GPU shares.
fn trace_source(args: &RunArgs, trace: &Path) -> Result<(Workload, Recorded)> {
    let src = &args.source;
    if !src.params.is_empty() || !src.overrides.is_empty() || args.reader.checkpoint_mode.is_some() {
        bail!(InputError(
            "--param, ++workload.KEY=VALUE and --checkpoint-mode set workload keys: they go with --workload, not --trace".into()
        ));
    }
    if let Some(gap) = args.trace.burst_gap_ms {
        if !(gap > 0.0 && gap <= 1e9) {
            bail!(InputError(format!("--burst-gap-ms must be above 0 and at most 1e9 ms, got {gap}")));
        }
    }
    if let Some(f) = args.trace.compute_scale {
        if !(f > 0.0 && f.is_finite()) {
            bail!(InputError(format!("--compute-scale must be a number > 0, got {f}")));
        }
    }
    let map = PathMap::parse(&args.trace.map_path).map_err(InputError)?;
    if !map.0.is_empty() && src.storage_root.is_some() {
        bail!(InputError(
            "--map-path reads the job's own files in place and --storage-root reads objects: give one of them".into()
        ));
    }
    if !map.0.is_empty() && args.io.generate {
        bail!(InputError(
            "--map-path replays the job's own files in place: there is nothing to generate (drop --generate)".into()
        ));
    }
    let opts = trainio_model::Options {
        grouping: trainio_model::Grouping::parse(&args.trace.gpu_grouping).map_err(InputError)?,
        burst_gap_ms: args.trace.burst_gap_ms,
        dev: None,
        gpus_per_process: Some(args.trace.gpus_per_process),
        compute_scale: args.trace.compute_scale,
    };
    let (templates, model) =
        trace_input::load_templates(trace, &opts, args.trace.allow_incomplete).map_err(InputError)?;
    if !map.0.is_empty() {
        map.check(&templates).map_err(InputError)?;
    }
    let name = trace.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // --storage-root: the job's data are objects in that bucket, configured as a
    // workload's object storage is (s3dlio's pattern: each recorded read one GET).
    let store = match &src.storage_root {
        Some(root) => Some(storage_root(root).map_err(|e| {
            let why = format!("{e:#}").replace(&format!("storage.storage_root: '{root}': "), "");
            InputError(format!("--storage-root {root}: {why}").replace('\n', " "))
        })?),
        None => None,
    };
    let w = Workload::trace_stand_in(&name, store);
    let recorded = Recorded {
        templates,
        model,
        gpus_per_process: args.trace.gpus_per_process,
        compute_scale: args.trace.compute_scale,
        map_path: Some(map).filter(|m| !m.0.is_empty()),
    };
    Ok((w, recorded))
}

/// `--storage-root BUCKET[/PREFIX]`: the object store a workload's storage section
/// `{storage_type: s3, storage_library: s3dlio, storage_root: ROOT}` names, checked as
/// that section is.
fn storage_root(root: &str) -> Result<crate::object::object_store::ObjectStore> {
    let mut storage = serde_yaml::Mapping::new();
    storage.insert("storage_type".into(), "s3".into());
    storage.insert("storage_library".into(), "s3dlio".into());
    storage.insert("storage_root".into(), root.into());
    let mut sections = serde_yaml::Mapping::new();
    sections.insert("storage".into(), storage.into());
    let store = crate::object::object_store::ObjectStore::from_root(&sections.into())?;
    store.ok_or_else(|| anyhow::anyhow!("storage.storage_type s3 names no object store"))
}

/// The command line's overrides of the workload's (or the stand-in's) settings.
fn apply_overrides(w: &mut Workload, args: &RunArgs) -> Result<()> {
    let (src, rd) = (&args.source, &args.reader);
    if let Some(ct) = rd.computation_time {
        if !(0.0..=MAX_COMPUTE_S).contains(&ct) {
            bail!(InputError(format!("--computation-time must be ≥ 0 and at most {MAX_COMPUTE_S} seconds, got {ct}")));
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
    Ok(())
}

/// Refuses O_DIRECT where the reader the replay models refuses it (h5py; DLIO's indexed
/// and parquet readers).
fn check_odirect(w: &Workload, args: &RunArgs, trace_mode: bool, path: &Path) -> Result<()> {
    if w.train && matches!(Format::parse(&w.format), Format::Hdf5(_)) {
        // DLIO raises for it too: h5py reads through the page cache.
        if w.odirect {
            bail!(InputError(format!(
                "{}: reader.odirect: true: O_DIRECT is not supported with dataset.format hdf5 (h5py reads through the page cache)",
                path.display()
            )));
        }
        if args.io.odirect {
            bail!(InputError(format!(
                "--odirect: O_DIRECT is not supported with dataset.format hdf5 in {} (h5py reads through the page cache)",
                path.display()
            )));
        }
    }
    let format = Format::parse(&w.format);
    if (args.io.odirect || w.odirect)
        && !trace_mode
        && (crate::formats::indexed::is_indexed(format) || format == Format::Parquet)
    {
        // DLIO's reader factory raises for these formats under O_DIRECT.
        bail!(InputError(format!(
            "{}: dataset.format {} is read through the page cache by DLIO's reader (it refuses O_DIRECT): drop --odirect / reader.odirect",
            path.display(),
            w.format
        )));
    }
    Ok(())
}

/// `storage.storage_type: s3`: the endpoint, credentials and buckets checked before any
/// work (s3_writes::preflight); None for a workload on files.
fn object_target(w: &Workload, args: &RunArgs, path: &Path) -> Result<Option<S3Target>> {
    let Some(store) = &w.object_store else { return Ok(None) };
    if args.io.odirect || w.odirect {
        bail!(InputError(format!(
            "{}: O_DIRECT (--odirect, reader.odirect) is for files; this workload reads {}",
            path.display(),
            store.uri()
        )));
    }
    let checkpoint_bucket: Vec<String> = w.checkpoint.iter().map(|c| store.checkpoint_location(&c.folder).0).collect();
    Ok(Some(crate::object::s3_writes::preflight(store, &checkpoint_bucket)?))
}

#[cfg(test)]
#[path = "prepare_tests.rs"]
mod tests;
