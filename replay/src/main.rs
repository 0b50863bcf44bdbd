#![recursion_limit = "256"]
//! trainio-replay: `trainio replay|datagen|sweep`. See docs/replay.md.

mod beneath;
mod checkpoint;
mod cli;
mod cluster;
mod dataset;
mod engine;
mod errors;
mod formats;
mod histogram;
mod lock;
mod mlperf;
mod object;
mod output;
mod progress;
mod record;
mod replay;
mod results;
mod sweep;
mod trace;
mod workload;
mod yaml_keys;

use anyhow::{Context, Result};
use checkpoint::checkpointing;
use cli::Command;
use cluster::Cluster;
use mlperf::{datasize, edition, runrules};
use replay::Job;

fn main() {
    let cli = cli::parse();
    let name = match &cli.command {
        Command::Replay(_) => "replay",
        Command::Datagen(_) => "datagen",
        Command::Sweep(_) => "sweep",
        Command::Datasize(_) => "datasize",
    };
    let cluster = match Cluster::init() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("trainio {name}: {e:#}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(cli.command, &cluster) {
        let cause = format!("{e:#}").replace('\n', " ");
        if cluster.size > 1 {
            eprintln!("trainio {name}: rank {} on {} failed: {cause}", cluster.rank, cluster.hostname);
        } else {
            eprintln!("trainio {name}: {cause}");
        }
        cluster.abort(2);
    }
    if let Some(lost) = cluster.lost() {
        // A rank other than 0 that stopped for a lost rank: rank 0 named it (and saved
        // this rank's results) unless rank 0 is the one this rank lost.
        if lost.ranks.contains(&0) {
            eprintln!(
                "trainio {name}: rank {} on {} stopped: {}; its results could not reach rank 0",
                cluster.rank,
                cluster.hostname,
                lost.describe()
            );
        }
        cluster.abort(2);
    }
    cluster.finish();
}

/// Refuses a results file (`--json`) that is the workload or trace the command reads, or
/// lies inside the trace or the dataset.
pub fn check_not_input(path: &std::path::Path, src: &cli::SourceArgs) -> Result<()> {
    let mut inputs = Vec::new();
    let mut inside = vec![("--data-dir", src.data_dir.as_path())];
    if let Some(w) = &src.workload {
        inputs.push(("the workload", w.as_path()));
    }
    if let Some(t) = &src.trace {
        if t.is_dir() {
            inside.push(("the trace", t.as_path()));
        } else {
            inputs.push(("the trace", t.as_path()));
        }
    }
    output::refuse_inputs(path, "--json", &inputs, &inside)
}

/// A run that stopped early (a checkpoint that failed, a rank lost) ends the command with its cause
/// in one line, exit 2, once its results are shown and saved.
fn stopped_error(summary: &serde_json::Value, json: Option<&std::path::Path>) -> Result<()> {
    let last = summary["runs"].as_array().and_then(|r| r.last()).unwrap_or(summary);
    let Some(why) = last["stopped"].as_str() else { return Ok(()) };
    let kept = match json {
        Some(p) => format!("the results of the steps run are in {}", p.display()),
        None => "the results of the steps run are above".to_string(),
    };
    anyhow::bail!(replay::InputError(format!("{why}; the run stopped there, and {kept}")))
}

/// Prints a run's summary and saves its results (--json) when asked to.
fn show(human: &str, summary: &impl serde::Serialize, json: Option<&std::path::Path>) -> Result<()> {
    print!("{human}");
    json.map_or(Ok(()), |p| output::save_json(p, summary))
}

fn run(command: Command, cluster: &Cluster) -> Result<()> {
    match command {
        Command::Datagen(d) => {
            let gpus = d.gpus;
            let args = cli::RunArgs::datagen(d);
            let job = Job::prepare(&args)?;
            // Object storage: nothing is written under --data-dir, so there is nothing to lock.
            let _lock = match job.s3 {
                None => Some(lock::acquire_for_job(cluster, &job.data_dir, true)?),
                Some(_) => None,
            };
            job.datagen(cluster, gpus)
        }
        Command::Datasize(args) => datasize_command(&args),
        Command::Replay(args) => {
            // Checked before any work: the results of a run must have somewhere to go, and
            // never onto what the run reads.
            if let (Some(path), true) = (&args.json, cluster.is_root()) {
                output::check(path, "--json")?;
                check_not_input(path, &args.run.source)?;
            }
            // So is the recorder --record runs, before the dataset is generated.
            let recorder_program = match &args.record {
                Some(_) if cluster.is_root() => Some(record::find_recorder()?),
                _ => None,
            };
            let job = Job::for_replay(&args, cluster.size)?;
            if args.plan_only {
                let summary = job.plan_only(cluster, args.gpus)?;
                if cluster.is_root() {
                    print!("{}", checkpointing::human_summary(&summary));
                    if let Some(path) = &args.json {
                        output::save_json(path, &summary)?;
                    }
                }
                return Ok(());
            }
            let _lock = match job.s3 {
                None => Some(lock::acquire_for_job(cluster, &job.data_dir, job.generate && job.workload.train)?),
                Some(_) => None,
            };
            // Generate first: the recording is of the replay, not of datagen's writes.
            if job.workload.train && job.generate {
                job.datagen(cluster, args.gpus)?;
            }
            let recorder = match (&args.record, &recorder_program) {
                (Some(dir), Some(program)) => Some(record::Recorder::start(program, dir)?),
                _ => None,
            };
            // The results are shown and saved before the recorder is stopped: a recording
            // that fails does not take the finished replay's results with it.
            let ran = if job.workload.train {
                training_runs(&job, cluster, &args).and_then(|summary| match summary {
                    Some((human, s)) => show(&human, &s, args.json.as_deref()).map(|()| Some(s)),
                    None => Ok(None),
                })
            } else {
                job.run_checkpoint_only(cluster, args.gpus).and_then(|summary| match summary {
                    Some(s) => show(&checkpointing::human_summary(&s), &s, args.json.as_deref()).map(|()| Some(s)),
                    None => Ok(None),
                })
            };
            let recorded = recorder.map(|r| r.stop()).transpose();
            let summary = ran?;
            recorded.map_err(|e| e.context("the replay's results above stand"))?;
            if let (Some(dir), Some(s)) = (&args.record, &summary) {
                // The recording carries the results of the run it recorded: a report
                // shows a replay by them, not by a job model of the replay's own I/O.
                record::save_results(dir, s)?;
            }
            summary.map_or(Ok(()), |s| stopped_error(&s, args.json.as_deref()))
        }
        Command::Sweep(args) => sweep::sweep(&args, cluster),
    }
}

/// `--runs N` runs of a training workload on the same dataset (each dropping the page
/// cache first with --drop-caches, as one run does), and MLPerf's run rules checked
/// against their results. Rank 0 gets the human summary and the results: one run's
/// object with `rules[]` for N = 1, the combined object (runrules::combine) otherwise.
/// With N ≥ 2 and --json, the file is rewritten (atomically) after every finished run
/// with the runs so far (`run_count` of `runs_requested`, `complete` false until the
/// last), so an interrupted job keeps the runs it finished.
fn training_runs(job: &Job, cluster: &Cluster, args: &cli::ReplayArgs) -> Result<Option<(String, serde_json::Value)>> {
    let threshold_from = match (args.run.io.threshold, job.source.recorded().is_some()) {
        (Some(_), _) => "--threshold",
        (None, true) => "90% by default",
        (None, false) => job.workload.au_threshold_from.as_str(),
    };
    let workload = job.source.recorded().is_none().then_some(&job.workload);
    let category = workload.map(|w| {
        let accelerator = edition::accelerator_of(job.source.path());
        edition::category(&w.name, accelerator, &changed_keys(w, &args.run))
    });
    let combined = |runs: Vec<serde_json::Value>| {
        let rules = runrules::check(workload, &runs, threshold_from, category.as_ref());
        let done = runs.len() as u64;
        let mut c = runrules::combine(runs, &rules);
        c["runs_requested"] = args.runs.into();
        c["complete"] = (done == args.runs).into();
        (c, rules)
    };
    let mut runs = Vec::new();
    for i in 0..args.runs {
        if let Some(s) = job.run_generated(cluster, args.gpus)? {
            if args.runs > 1 {
                print!("run {} of {}: {}", i + 1, args.runs, results::human(&s));
            }
            let stopped = s["stopped"].is_string();
            runs.push(s);
            if stopped {
                break; // a checkpoint failed: the runs after it would fail the same way
            }
            if let (Some(path), true) = (&args.json, args.runs > 1 && i + 1 < args.runs) {
                output::write_atomic(path, &serde_json::to_vec_pretty(&combined(runs.clone()).0)?)
                    .with_context(|| format!("saving the runs so far to {}", path.display()))?;
            }
        }
    }
    if runs.is_empty() {
        return Ok(None);
    }
    if args.runs == 1 {
        let rules = runrules::check(workload, &runs, threshold_from, category.as_ref());
        let mut s = runs.pop().expect("one run");
        let human = results::human(&s) + &runrules::human_rules(&rules);
        s["rules"] = serde_json::to_value(&rules)?;
        return Ok(Some((human, s)));
    }
    let (combined, rules) = combined(runs);
    let human = runrules::human_table(&combined) + &runrules::human_rules(&rules);
    Ok(Some((human, combined)))
}

/// The keys a run changes from its workload file, for its v3.0 category: the overrides
/// (`--param`, `++workload.`), and the options that set a workload key (by that key) or
/// change the run in a way no key does (by their flag).
fn changed_keys(w: &workload::Workload, run: &cli::RunArgs) -> Vec<String> {
    let mut keys = edition::override_keys(&w.params);
    let (src, rd) = (&run.source, &run.reader);
    for (set, key) in [
        (src.batch_size.is_some(), "reader.batch_size"),
        (src.steps.is_some(), "--steps"),
        (src.seed.is_some(), "train.seed"),
        (rd.computation_time.is_some(), "train.computation_time"),
        (rd.read_threads.is_some(), "reader.read_threads"),
        (rd.prefetch_size.is_some(), "reader.prefetch_size"),
        (rd.transfer_size.is_some(), "reader.transfer_size"),
        (rd.epochs.is_some(), "train.epochs"),
        (run.io.odirect, "reader.odirect"),
        (run.io.threshold.is_some(), "metric.au"),
        (run.io.no_barrier, "--no-barrier"),
    ] {
        if set {
            keys.push(key.to_string());
        }
    }
    keys
}

/// `trainio datasize`: MLPerf's rule for the workload, printed (and saved with --json).
fn datasize_command(args: &cli::DatasizeArgs) -> Result<()> {
    use replay::InputError;
    if let Some(path) = &args.json {
        output::check(path, "--json")?;
        output::refuse_inputs(path, "--json", &[("the workload", &args.workload)], &[])?;
    }
    let per_host = match args.client_ram.trim() {
        "auto" => match replay::mem_total_bytes() {
            0 => anyhow::bail!(InputError(
                "--client-ram auto: /proc/meminfo has no MemTotal: give the RAM of one client host in bytes".into()
            )),
            b => b,
        },
        given => datasize::parse_bytes(given).map_err(|e| InputError(format!("--client-ram {given}: {e}")))?,
    };
    let ram_from = if args.client_ram.trim() == "auto" {
        format!("{} host(s) × MemTotal of this host", args.hosts)
    } else {
        format!("{} host(s) × --client-ram {}", args.hosts, args.client_ram.trim())
    };
    let total = per_host
        .checked_mul(args.hosts)
        .ok_or_else(|| InputError(format!("--hosts {} × --client-ram {per_host}: too large", args.hosts)))?;
    let mut params = args.params.clone();
    params.extend(workload::hydra_overrides(&args.overrides).map_err(|e| InputError(format!("{e:#}")))?);
    let w = workload::Workload::from_file_with(&args.workload, &params)
        .map_err(|e| InputError(format!("{e:#}").replace('\n', " ")))?;
    if !w.train {
        anyhow::bail!(InputError(format!(
            "{}: a checkpoint-only workload has no training dataset to size",
            args.workload.display()
        )));
    }
    let s = datasize::sizing(&w, args.gpus, args.hosts, total);
    print!("{}", datasize::human(&w.name, &s, &ram_from));
    let accelerator = edition::accelerator_of(&args.workload);
    let need = datasize::need_bytes_per_s(&w).map(|b| b / (1u64 << 20) as f64);
    if let Some(line) = datasize::need_line(&w, accelerator) {
        println!("{line}");
        println!("storage for {} of them: {:.1} MiB/s at 100% AU", args.gpus, need.unwrap_or(0.0) * args.gpus as f64);
    }
    if let Some(path) = &args.json {
        let mut out = serde_json::json!({
            "tool": "trainio datasize",
            "version": env!("CARGO_PKG_VERSION"),
            "workload": w.name,
            "source": args.workload.display().to_string(),
            "params": w.params,
            "client_ram_per_host_bytes": per_host,
            "client_ram_from": if args.client_ram.trim() == "auto" { "auto" } else { "given" },
            "accelerator": accelerator,
            "per_gpu_need_mib_s": need,
            "au_threshold_percent": w.au_threshold_percent,
        });
        if let (Some(o), serde_json::Value::Object(m)) = (out.as_object_mut(), serde_json::to_value(&s)?) {
            o.extend(m);
        }
        output::save_json(path, &out)?;
    }
    Ok(())
}
