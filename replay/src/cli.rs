//! Command-line interface: `trainio replay|datagen|sweep`. The raw arguments become a
//! validated configuration in `replay::Job::prepare`, not here.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// The command line, every subcommand named as it is typed ("trainio replay") in its
/// --version as in its usage line.
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    Cli::command().mut_subcommands(|sub| {
        let name = format!("trainio {}", sub.get_name());
        // "-1" is a value to check (and refuse naming its option), not an unknown flag.
        sub.display_name(name).allow_negative_numbers(true)
    })
}

/// This process's command line, parsed (clap's message and exit on a bad one).
pub fn parse() -> Cli {
    use clap::FromArgMatches;
    Cli::from_arg_matches(&command().get_matches()).unwrap_or_else(|e| e.exit())
}

/// A command line given as words (`["trainio", "replay", ...]`), parsed.
#[cfg(test)]
pub fn parse_from<I: IntoIterator<Item = T>, T: Into<std::ffi::OsString> + Clone>(
    words: I,
) -> Result<Cli, clap::Error> {
    use clap::FromArgMatches;
    Cli::from_arg_matches(&command().try_get_matches_from(words)?)
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoEngine {
    #[value(name = "io_uring")]
    #[default]
    IoUring,
    Psync,
}

#[derive(Parser, Debug)]
#[command(
    name = "trainio",
    bin_name = "trainio",
    version,
    propagate_version = true,
    about = "Replay AI-training storage I/O with emulated accelerators"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Replay a DLIO/MLPerf workload or a recorded trace with simulated GPUs.
    Replay(ReplayArgs),
    /// Materialize a workload's (or a trace's) dataset in --data-dir.
    Datagen(DatagenArgs),
    /// Find the most simulated GPUs that keep AU at or above the threshold.
    Sweep(SweepArgs),
    /// MLPerf Storage's dataset size for a workload, GPU count and client RAM.
    Datasize(DatasizeArgs),
}

/// `trainio datasize`: MLPerf's rule, computed without touching storage.
#[derive(Args, Debug, Clone)]
pub struct DatasizeArgs {
    /// DLIO / MLPerf Storage workload YAML (v1.0 or v2.0 key names).
    #[arg(long, value_name = "FILE.yaml")]
    pub workload: PathBuf,
    /// Simulated GPUs (MLPerf's accelerators) in the whole job.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub gpus: u64,
    /// Client hosts (each with --client-ram of RAM).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub hosts: u64,
    /// RAM of one client host: bytes (suffixes K, M, G, T = KiB… also accepted), or
    /// `auto` (this host's MemTotal from /proc/meminfo).
    #[arg(long, value_name = "BYTES|auto", default_value = "auto")]
    pub client_ram: String,
    /// Set a workload key before the file is read (as for replay).
    #[arg(long = "param", value_name = "KEY=VALUE")]
    pub params: Vec<String>,
    /// Workload keys in DLIO's (Hydra's) form, e.g. `++workload.reader.batch_size=4`.
    #[arg(value_name = "++workload.KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Write the numbers as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// Where the I/O pattern comes from, where the data lives, and the keys that size the
/// dataset: what datagen uses (replay and sweep take these and `ReaderArgs`).
#[derive(Args, Debug, Clone)]
pub struct SourceArgs {
    /// DLIO / MLPerf Storage workload YAML (v1.0 or v2.0 key names).
    #[arg(long, value_name = "FILE.yaml", required_unless_present = "trace", conflicts_with = "trace")]
    pub workload: Option<PathBuf>,
    /// Recorded trace (directory of Parquet segments, or one .parquet file): its file-layer reads.
    #[arg(long, value_name = "TRACE")]
    pub trace: Option<PathBuf>,
    /// Directory that holds (or will hold) the dataset (with a workload on object storage,
    /// `storage.storage_type: s3`, the bucket holds the dataset instead).
    #[arg(long, value_name = "DIR")]
    pub data_dir: PathBuf,
    /// Trace mode: the job's data as objects in this S3 bucket (BUCKET[/PREFIX]), as a
    /// workload's `storage.storage_type: s3` and `storage.storage_root` put it there: the
    /// endpoint from AWS_ENDPOINT_URL (or S3_ENDPOINT_URIS, S3_ENDPOINT), the keys from
    /// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; --data-dir is not read.
    #[arg(long, value_name = "BUCKET[/PREFIX]")]
    pub storage_root: Option<String>,
    /// Use a non-empty directory that trainio did not create.
    #[arg(long)]
    pub force: bool,
    /// Override reader.batch_size.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub batch_size: Option<u64>,
    /// Steps per epoch (default: as many as each GPU's shard of num_files_train holds);
    /// the dataset grows when a shard holds fewer.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub steps: Option<u64>,
    /// Override train.seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Set a workload key before the file is read, e.g. `--param model.num_layers=2`
    /// (dotted key as in the YAML; repeatable; checked like the file's own keys).
    #[arg(long = "param", value_name = "KEY=VALUE")]
    pub params: Vec<String>,
    /// The same in DLIO's (Hydra's) form: `++workload.dataset.num_files_train=64`
    /// (`workload.KEY=VALUE` and `+workload.KEY=VALUE` too; repeatable).
    #[arg(value_name = "++workload.KEY=VALUE")]
    pub overrides: Vec<String>,
}

/// How the simulated GPUs read and compute: replay and sweep only.
#[derive(Args, Debug, Clone, Default)]
pub struct ReaderArgs {
    /// Override the computation time per step, seconds.
    #[arg(long, value_name = "SECONDS")]
    pub computation_time: Option<f64>,
    /// Override reader.read_threads (outstanding reads per simulated GPU).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub read_threads: Option<u64>,
    /// Override reader.prefetch_size (batches).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub prefetch_size: Option<u64>,
    /// Bytes per read request (default: reader.transfer_size, else 1 MiB).
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(512..=(1u64 << 30)))]
    pub transfer_size: Option<u64>,
    /// Override train.epochs.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub epochs: Option<u64>,
    /// MLPerf Storage's checkpoint mode (`checkpoint.mode`): `default` writes the whole
    /// checkpoint over --gpus = TP×PP×DP simulated GPUs; `subset` has --gpus write their
    /// share of the checkpoint of TP×PP×model.parallelism.data GPUs.
    #[arg(long, value_name = "default|subset")]
    pub checkpoint_mode: Option<String>,
}

/// `trainio datagen`: only what sizes and places the dataset.
#[derive(Args, Debug, Clone)]
pub struct DatagenArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// Simulated GPUs the dataset is for (each gets its shard of whole batches).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub gpus: u64,
    /// No progress: no bar on a terminal, no periodic lines (every TRAINIO_PROGRESS_S
    /// seconds, 10 by default) otherwise.
    #[arg(long, short)]
    pub quiet: bool,
}

/// A run's arguments: where its I/O comes from (`source`), how its GPUs read
/// (`reader`), how it reads and runs (`io`), and how a trace is replayed (`trace`).
/// `replay::Job::prepare` turns them into the validated job; datagen's are a run's
/// with their defaults (`RunArgs::datagen`).
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub reader: ReaderArgs,
    #[command(flatten)]
    pub io: IoArgs,
    #[command(flatten)]
    pub trace: TraceArgs,
    /// No progress: no bar on a terminal, no periodic lines (every TRAINIO_PROGRESS_S
    /// seconds, 10 by default) otherwise.
    #[arg(long, short)]
    pub quiet: bool,
}

/// How a run reads and runs: replay and sweep only.
#[derive(Args, Debug, Clone, Default)]
pub struct IoArgs {
    /// Generate the dataset first (as `trainio datagen` would).
    #[arg(long)]
    pub generate: bool,
    /// No step barrier across simulated GPUs (DLIO's allreduce is on by default).
    #[arg(long)]
    pub no_barrier: bool,
    /// Read with O_DIRECT, bypassing the page cache.
    #[arg(long)]
    pub odirect: bool,
    /// Drop the page cache (echo 3 > /proc/sys/vm/drop_caches; root) before the run.
    #[arg(long)]
    pub drop_caches: bool,
    /// AU threshold in percent (default: the workload's metric.au, else MLPerf Storage
    /// v3.0's for the model: unet3d 90, retinanet 85; else 90).
    #[arg(long, value_name = "PERCENT")]
    pub threshold: Option<f64>,
    /// Run each rank's event loop SCHED_FIFO (root): compute sleeps then end on time even
    /// when other processes load the host's CPUs.
    #[arg(long)]
    pub realtime: bool,
    /// How reads are issued: io_uring (one event loop, no thread per read), or psync
    /// (a thread per reader slot doing pread, visible to the file-layer recorder).
    #[arg(long, value_enum, default_value = "io_uring")]
    pub io_engine: IoEngine,
}

/// How a recorded job is replayed (trace mode): replay and sweep only.
#[derive(Args, Debug, Clone)]
pub struct TraceArgs {
    /// Trace mode: a rank that reads its own batches has its steps split at idle gaps at
    /// least this long (default: found from the gaps, as `trainio analyze` does).
    #[arg(long, value_name = "MS")]
    pub burst_gap_ms: Option<f64>,
    /// Trace mode: which processes are one GPU: `auto` (a rank and its DataLoader
    /// workers, from the trace), `process` (every process that reads), or the ranks' pids
    /// (`4242,4243`: every other reader joins its nearest listed ancestor).
    #[arg(long, value_name = "auto|process|PIDS", default_value = "auto")]
    pub gpu_grouping: String,
    /// Trace mode: accelerators each recorded GPU (process) drives (JAX's one process per
    /// host, torch DataParallel): each becomes N simulated GPUs that split its batches.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub gpus_per_process: u32,
    /// Trace mode: multiply the recorded compute per step by F (e.g. 0.5 for an
    /// accelerator twice as fast), each step's spread kept.
    #[arg(long, value_name = "F")]
    pub compute_scale: Option<f64>,
    /// Trace mode: replay in place, reading the job's own files where a copy of them is:
    /// a recorded path under OLD is read under NEW (repeatable); nothing is generated.
    #[arg(long = "map-path", value_name = "OLD=NEW")]
    pub map_path: Vec<String>,
    /// Trace mode: replay a trace whose file layer lacks most of what the job read
    /// (reads through mmap or io_uring), replaying only what it saw.
    #[arg(long)]
    pub allow_incomplete: bool,
}

/// The values clap gives when none of the options is passed.
impl Default for TraceArgs {
    fn default() -> TraceArgs {
        TraceArgs {
            burst_gap_ms: None,
            gpu_grouping: "auto".into(),
            gpus_per_process: 1,
            compute_scale: None,
            map_path: Vec::new(),
            allow_incomplete: false,
        }
    }
}

impl RunArgs {
    /// `trainio datagen`'s arguments as a run's: its source, every other option at its
    /// default, and the dataset generated.
    pub fn datagen(d: DatagenArgs) -> RunArgs {
        RunArgs {
            source: d.source,
            reader: ReaderArgs::default(),
            io: IoArgs { generate: true, ..IoArgs::default() },
            trace: TraceArgs::default(),
            quiet: d.quiet,
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// Simulated GPUs in the whole job (spread over the MPI ranks).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub gpus: u64,
    /// Run the training N times on the same dataset (MLPerf: 5) and report each run and
    /// the mean and spread of AU and throughput.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub runs: u64,
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Trace the replay itself with `trainio record` into DIR.
    #[arg(long, value_name = "DIR")]
    pub record: Option<PathBuf>,
    /// Print (and with --json save) the workload's checkpoint plan, the bytes every
    /// simulated GPU would write, and exit without touching --data-dir.
    #[arg(long)]
    pub plan_only: bool,
}

#[derive(Args, Debug, Clone)]
pub struct SweepArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// GPU count of the first run (default 1, or the number of MPI ranks if more).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub start_gpus: Option<u64>,
    /// Largest GPU count to try.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_gpus: u64,
    /// Where to save the curve (GPUs → AU, throughput) as JSON (default:
    /// trainio-sweep.json in --data-dir, next to the data).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}
