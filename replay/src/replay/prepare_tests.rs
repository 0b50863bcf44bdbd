//! Unit tests of prepare.rs: command lines (as words) turned into the validated job,
//! without running anything: the values it resolves, and each refusal's message.

use super::*;
use crate::cli::{self, Command};
use std::path::PathBuf;

/// A scratch directory with a small workload file (v2.0 keys, metric.au 0.8) in it.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("trainio-prepare-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("wl.yaml"),
            "model:\n  name: test\ndataset:\n  num_files_train: 16\n  num_samples_per_file: 2\n  record_length_bytes: 65536\nreader:\n  batch_size: 2\n  read_threads: 3\n  transfer_size: 8192\ntrain:\n  epochs: 1\n  computation_time: 0.01\nmetric:\n  au: 0.8\n",
        )
        .unwrap();
        Scratch(dir)
    }

    fn workload(&self) -> String {
        self.0.join("wl.yaml").display().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The sample trace of a one-GPU unet3d job shipped in traces/.
fn sample_trace() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../traces/unet3d-demo-1gpu").to_string()
}

fn replay_args(words: &[&str]) -> ReplayArgs {
    let all = ["trainio", "replay"].iter().chain(words);
    match cli::parse_from(all).unwrap_or_else(|e| panic!("{words:?}: {e}")).command {
        Command::Replay(r) => r,
        other => panic!("not a replay: {other:?}"),
    }
}

/// The job of `trainio replay WORDS` on one rank, or its refusal as its one-line message.
fn replay(words: &[&str]) -> Result<Job, String> {
    Job::for_replay(&replay_args(words), 1).map_err(|e| {
        assert!(e.downcast_ref::<InputError>().is_some(), "{words:?}: not an input error: {e:#}");
        format!("{e:#}")
    })
}

#[test]
fn a_workload_run_resolves_its_settings_from_the_file_and_the_defaults() {
    let s = Scratch::new("defaults");
    let wl = s.workload();
    let job = replay(&["--workload", &wl, "--data-dir", "relative/data"]).unwrap();
    assert!(matches!(&job.source, Source::Workload(p) if p == &PathBuf::from(&wl)), "{:?}", job.source);
    assert_eq!(job.source.to_string(), wl);
    assert_eq!(job.data_dir, std::env::current_dir().unwrap().join("relative/data"));
    // reader.transfer_size from the file; the AU threshold from metric.au.
    assert_eq!((job.transfer_size, job.tf_buffer, job.threshold_percent), (8192, 8192, 80.0));
    assert_eq!((job.workload.batch_size, job.workload.read_threads, job.workload.epochs), (2, 3, 1));
    assert_eq!((job.max_steps, job.compute_override, job.prefetch_override), (0, None, None));
    assert!(
        job.engine.barrier
            && job.engine.progress
            && !job.generate
            && !job.engine.odirect
            && !job.engine.psync
            && !job.drop_caches
    );
    assert!(job.s3.is_none() && !job.force && !job.engine.realtime);
}

#[test]
fn a_workload_run_takes_every_override() {
    let s = Scratch::new("overrides");
    let wl = s.workload();
    let job = replay(&[
        "--workload",
        &wl,
        "--data-dir",
        "d",
        "--transfer-size",
        "4096",
        "--threshold",
        "50",
        "--io-engine",
        "psync",
        "--no-barrier",
        "--odirect",
        "--steps",
        "5",
        "--batch-size",
        "3",
        "--read-threads",
        "2",
        "--prefetch-size",
        "4",
        "--computation-time",
        "0.5",
        "--epochs",
        "3",
        "--seed",
        "9",
        "--generate",
        "--force",
        "-q",
        "--param",
        "dataset.num_files_train=32",
        "++workload.train.epochs=2",
    ])
    .unwrap();
    assert_eq!((job.transfer_size, job.tf_buffer, job.threshold_percent, job.max_steps), (4096, 4096, 50.0, 5));
    let w = &job.workload;
    assert_eq!((w.batch_size, w.read_threads, w.prefetch_size, w.epochs, w.seed), (3, 2, 4, 3, 9));
    assert_eq!((w.num_files_train, w.computation_time.clone()), (32, crate::workload::ComputeTime::Fixed(0.5)));
    assert_eq!(w.params, ["dataset.num_files_train=32", "train.epochs=2"]);
    assert_eq!((job.compute_override, job.prefetch_override), (Some(0.5), Some(4)));
    assert!(
        !job.engine.barrier
            && !job.engine.progress
            && job.generate
            && job.engine.odirect
            && job.engine.psync
            && job.force
    );
}

#[test]
fn a_trace_run_holds_its_recorded_job_and_a_typed_stand_in() {
    let trace = sample_trace();
    let job =
        replay(&["--trace", &trace, "--data-dir", "d", "--compute-scale", "0.5", "--gpus-per-process", "2"]).unwrap();
    let Source::Trace(path, recorded) = &job.source else { panic!("not trace mode: {:?}", job.source) };
    assert_eq!(path, &PathBuf::from(&trace));
    assert_eq!((recorded.gpus_per_process, recorded.compute_scale), (2, Some(0.5)));
    assert!(recorded.map_path.is_none());
    // Each recorded GPU drives two accelerators: twice the templates of the trace as recorded.
    let as_recorded = replay(&["--trace", &trace, "--data-dir", "d"]).unwrap();
    let once = as_recorded.source.recorded().map(|r| (r.templates.len(), r.gpus_per_process, r.compute_scale));
    assert_eq!(once, Some((1, 1, None)));
    assert_eq!(recorded.templates.len(), 2);
    assert_eq!(job.workload, Workload::trace_stand_in("unet3d-demo-1gpu", None));
    assert_eq!((job.transfer_size, job.threshold_percent), (DEFAULT_TRANSFER, 90.0));
    assert!(job.source.recorded().is_some());
}

#[test]
fn each_refusal_names_its_option() {
    let s = Scratch::new("refusals");
    let wl = s.workload();
    let trace = sample_trace();
    let llama = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/llama3_8b.yaml");
    let w = |extra: &[&'static str]| [&["--workload", wl.as_str(), "--data-dir", "d"], extra].concat();
    let t = |extra: &[&'static str]| [&["--trace", trace.as_str(), "--data-dir", "d"], extra].concat();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (w(&["--threshold", "101"]), "--threshold must be between 0 and 100 percent, got 101"),
        (w(&["--threshold", "-1"]), "--threshold must be between 0 and 100 percent, got -1"),
        (w(&["--computation-time", "-1"]), "--computation-time must be ≥ 0 and at most 86400 seconds, got -1"),
        (w(&["--gpus-per-process", "2"]), "--gpus-per-process, --compute-scale and --map-path change a recorded job"),
        (w(&["--map-path", "/a=/b"]), "they go with --trace, not --workload"),
        (w(&["--storage-root", "bkt"]), "--storage-root is for --trace"),
        (w(&["--param", "reader.batch_sise=2"]), "--param reader.batch_sise: not a workload key trainio reads"),
        (
            w(&["--param", "dataset.format=hdf5", "--odirect"]),
            "--odirect: O_DIRECT is not supported with dataset.format hdf5",
        ),
        (w(&["--param", "dataset.format=parquet", "--odirect"]), "is read through the page cache by DLIO's reader"),
        (w(&["--param", "workflow.train=false"]), "workflow.train is false and there is no checkpoint"),
        (w(&["--plan-only", "--runs", "2"]), "--runs 2: repeats a training run; --plan-only runs once"),
        (
            vec!["--workload", llama, "--data-dir", "d", "--runs", "3"],
            "--runs 3: repeats a training run; a checkpoint-only workload runs once",
        ),
        (t(&["--param", "train.epochs=2"]), "--param, ++workload.KEY=VALUE and --checkpoint-mode set workload keys"),
        (t(&["++workload.train.epochs=2"]), "they go with --workload, not --trace"),
        (t(&["--burst-gap-ms", "0"]), "--burst-gap-ms must be above 0 and at most 1e9 ms, got 0"),
        (t(&["--compute-scale", "0"]), "--compute-scale must be a number > 0, got 0"),
        (t(&["--compute-scale", "inf"]), "--compute-scale must be a number > 0, got inf"),
        (t(&["--map-path", "/a=/b", "--storage-root", "bkt"]), "give one of them"),
        (t(&["--map-path", "/a=/b", "--generate"]), "there is nothing to generate (drop --generate)"),
    ];
    for (words, says) in cases {
        let e = replay(&words).err().unwrap_or_else(|| panic!("{words:?} was accepted"));
        assert!(e.contains(says), "{words:?}: {e}");
        assert!(!e.contains('\n'), "{words:?}: more than one line: {e}");
    }
    let e = Job::for_replay(&replay_args(&w(&["--gpus", "2"])), 4).unwrap_err();
    assert_eq!(format!("{e:#}"), "--gpus 2 is fewer than the 4 MPI ranks: give every rank at least one simulated GPU");
}

/// datagen's arguments are a run's with clap's defaults and --generate: the job it
/// prepares is the one `replay --generate` with the same source would.
#[test]
fn datagen_is_a_run_with_the_defaults_that_generates() {
    let s = Scratch::new("datagen");
    let wl = s.workload();
    let source = ["--workload", wl.as_str(), "--data-dir", "d", "--steps", "4", "-q"];
    let d = match cli::parse_from(["trainio", "datagen"].iter().chain(&source)).unwrap().command {
        Command::Datagen(d) => d,
        other => panic!("not datagen: {other:?}"),
    };
    let from_datagen = cli::RunArgs::datagen(d);
    let replayed = replay_args(&[&source[..], &["--generate"]].concat()).run;
    assert_eq!(format!("{from_datagen:?}"), format!("{replayed:?}"));
    let job = Job::prepare(&from_datagen).unwrap();
    assert!(job.generate && !job.engine.progress && job.max_steps == 4);
}

fn sweep(words: &[&str], ranks: usize) -> Result<(Job, u64), String> {
    let all = ["trainio", "sweep"].iter().chain(words);
    let args = match cli::parse_from(all).unwrap_or_else(|e| panic!("{words:?}: {e}")).command {
        Command::Sweep(a) => a,
        other => panic!("not a sweep: {other:?}"),
    };
    Job::for_sweep(&args, ranks).map_err(|e| {
        assert!(e.downcast_ref::<InputError>().is_some(), "{words:?}: not an input error: {e:#}");
        format!("{e:#}")
    })
}

/// sweep's checks, made before any work: where the search starts, and workloads with no
/// AU to sweep.
#[test]
fn a_sweep_starts_at_a_gpu_per_rank_and_refuses_what_has_no_au() {
    let s = Scratch::new("sweep");
    let wl = s.workload();
    let base = ["--workload", wl.as_str(), "--data-dir", "d"];
    let with = |more: &[&'static str]| base.iter().copied().chain(more.iter().copied()).collect::<Vec<&str>>();
    let (job, start) = sweep(&with(&["--max-gpus", "64"]), 1).unwrap();
    assert_eq!((start, job.engine.barrier), (1, true));
    assert_eq!(sweep(&with(&["--max-gpus", "64"]), 3).unwrap().1, 3, "one GPU per rank at least");
    assert_eq!(sweep(&with(&["--max-gpus", "64", "--start-gpus", "8"]), 3).unwrap().1, 8);
    let e = sweep(&with(&["--max-gpus", "4", "--start-gpus", "8"]), 1).unwrap_err();
    assert_eq!(e, "--start-gpus 8 is above --max-gpus 4");
    let e = sweep(&with(&["--max-gpus", "4", "--param", "workflow.train=false"]), 1).unwrap_err();
    assert!(e.contains("nothing to sweep"), "{e}");
    let ckpt = ["--workload", "../configs/llama3_8b.yaml", "--data-dir", "d", "--max-gpus", "8"];
    let ckpt: Vec<String> =
        ckpt.iter().map(|w| w.replace("../", concat!(env!("CARGO_MANIFEST_DIR"), "/../"))).collect();
    let e = sweep(&ckpt.iter().map(String::as_str).collect::<Vec<_>>(), 1).unwrap_err();
    assert!(e.contains("checkpoint-only workload has no AU to sweep"), "{e}");
}
