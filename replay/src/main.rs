#![recursion_limit = "256"]
//! trainio-replay: `trainio replay|datagen|sweep`. See docs/replay.md.

mod beneath;
mod checkpoint;
mod checkpointing;
mod cli;
mod cluster;
mod dataset;
mod engine;
mod output;
mod pool;
mod program;
mod record;
mod replay;
mod results;
mod sweep;
mod trace_input;
mod trace_writes;
mod workload;

use anyhow::Result;
use cli::{Cli, Command};
use cluster::Cluster;
use replay::Job;

/// The command line, every subcommand named as it is typed ("trainio replay") in its
/// --version as in its usage line.
fn parse_cli() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let command = Cli::command().mut_subcommands(|sub| {
        let name = format!("trainio {}", sub.get_name());
        sub.display_name(name)
    });
    Cli::from_arg_matches(&command.get_matches()).unwrap_or_else(|e| e.exit())
}

fn main() {
    let cli = parse_cli();
    let name = match &cli.command {
        Command::Replay(_) => "replay",
        Command::Datagen(_) => "datagen",
        Command::Sweep(_) => "sweep",
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
            eprintln!(
                "trainio {name}: rank {} on {} failed: {cause}",
                cluster.rank, cluster.hostname
            );
        } else {
            eprintln!("trainio {name}: {cause}");
        }
        cluster.abort(2);
    }
}

/// Prints a run's summary and saves its results (--json) when asked to.
fn show(human: &str, summary: &impl serde::Serialize, json: Option<&std::path::Path>) -> Result<()> {
    print!("{human}");
    json.map_or(Ok(()), |p| output::save_json(p, summary))
}

fn run(command: Command, cluster: &Cluster) -> Result<()> {
    match command {
        Command::Datagen(source) => {
            let args = cli::RunArgs {
                source,
                generate: true,
                no_barrier: false,
                odirect: false,
                drop_caches: false,
                threshold: None,
                realtime: false,
                burst_gap_ms: None,
                gpu_grouping: "auto".into(),
                allow_incomplete: false,
                io_engine: cli::IoEngine::IoUring,
                quiet: false,
            };
            let job = Job::prepare(&args)?;
            job.datagen(cluster, args.source.gpus)
        }
        Command::Replay(args) => {
            // Checked before any work: the results of a run must have somewhere to go.
            if let (Some(path), true) = (&args.json, cluster.is_root()) {
                output::check(path, "--json")?;
            }
            let job = Job::prepare(&args.run)?;
            if args.run.source.gpus < cluster.size as u64 {
                anyhow::bail!(replay::InputError(format!(
                    "--gpus {} is fewer than the {} MPI ranks: give every rank at least one simulated GPU",
                    args.run.source.gpus, cluster.size
                )));
            }
            if args.plan_only {
                let summary = job.plan_only(cluster, args.run.source.gpus)?;
                if cluster.is_root() {
                    print!("{}", checkpointing::human_summary(&summary));
                    if let Some(path) = &args.json {
                        output::save_json(path, &summary)?;
                    }
                }
                return Ok(());
            }
            // Generate first: the recording is of the replay, not of datagen's writes.
            if job.workload.train && job.generate {
                job.datagen(cluster, args.run.source.gpus)?;
            }
            let recorder = match &args.record {
                Some(dir) if cluster.is_root() => Some(record::Recorder::start(dir)?),
                _ => None,
            };
            // The results are shown and saved before the recorder is stopped: a recording
            // that fails does not take the finished replay's results with it.
            let ran = if job.workload.train {
                job.run_generated(cluster, args.run.source.gpus).and_then(|summary| match summary {
                    Some(s) => show(&results::human(&s), &s, args.json.as_deref()),
                    None => Ok(()),
                })
            } else {
                job.run_checkpoint_only(cluster, args.run.source.gpus).and_then(|summary| match summary {
                    Some(s) => show(&checkpointing::human_summary(&s), &s, args.json.as_deref()),
                    None => Ok(()),
                })
            };
            let recorded = recorder.map(|r| r.stop()).transpose();
            ran?;
            recorded.map_err(|e| e.context("the replay's results above stand"))?;
            Ok(())
        }
        Command::Sweep(args) => sweep::sweep(&args, cluster),
    }
}
