//! Command line of `trainio record`, and the errors that mean "bad input" (exit 2).
use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

use clap::Parser;

/// Record a training job's storage I/O with eBPF into a Parquet trace.
///
/// Block-layer requests on the selected devices are recorded whatever process issued
/// them; file-layer syscalls only for the target (a command and its descendants, a pid,
/// a cgroup, or every process when no target is given).
#[derive(Parser, Debug)]
#[command(
    name = "trainio record",
    bin_name = "trainio record",
    version,
    allow_negative_numbers = true,
    after_help = "Example: trainio record -o /tmp/t -- dd if=/dev/loop0 of=/dev/null bs=1M count=64 iflag=direct"
)]
pub struct Args {
    /// Directory to write the trace into (created if missing; must be empty)
    #[arg(short, long)]
    pub output: PathBuf,

    /// Write this host's trace into OUTPUT/HOSTNAME, so that one recorder per host (e.g.
    /// `mpirun -npernode 1 trainio record --per-host -o SET …`) makes a trace set that
    /// analyze, report, compare and replay --trace read as one job
    #[arg(long)]
    pub per_host: bool,

    /// Layers to record, comma-separated: block, file, nfs, object (a layer the kernel
    /// lacks is skipped with a note). object: HTTP/1.x object requests (S3 over plain
    /// HTTP) from the socket syscalls; it needs file
    #[arg(long, value_delimiter = ',', default_value = "block,file,nfs")]
    pub layers: Vec<String>,

    /// Block device to record (name like loop0, a device node's path like /dev/nvme0n1 or
    /// /dev/disk/by-id/…, or MAJ:MIN); repeatable. Default: all devices
    #[arg(long = "dev", value_name = "NAME|MAJ:MIN")]
    pub devs: Vec<String>,

    /// Stop recording after this many seconds (at most 1e9)
    #[arg(long, value_parser = seconds)]
    pub duration: Option<f64>,

    /// Ring-buffer size per layer in MiB (rounded up to a power of two, at least 4 KiB)
    #[arg(long, default_value_t = 16.0, value_parser = positive_f64)]
    pub ringbuf_mb: f64,

    /// Start a new segment when the current one reaches this many MiB
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=MAX_SEGMENT_MB))]
    pub segment_mb: u64,

    /// Start a new segment when the current one is this many seconds old (at most 1e9)
    #[arg(long, default_value_t = 300.0, value_parser = seconds)]
    pub segment_s: f64,

    /// Keep at most this many MiB of finished segments: when a segment closes, the oldest
    /// are removed (at least one finished segment and the one being written stay, so the
    /// output holds at most this plus about two --segment-mb). Off by default
    #[arg(long, value_name = "MiB", value_parser = clap::value_parser!(u64).range(1..=MAX_SEGMENT_MB * 1024))]
    pub retain_mb: Option<u64>,

    /// Keep only segments closed at most this many seconds ago (checked whenever a segment
    /// closes: at least every --segment-s). Off by default
    #[arg(long, value_name = "SECONDS", value_parser = seconds)]
    pub retain_s: Option<f64>,

    /// Serve live metrics of the recording (per device: requests, bytes, queue-depth and
    /// latency histograms, latency percentiles; per process: file-layer requests and bytes)
    /// as Prometheus text at http://ADDR/metrics, e.g. 127.0.0.1:9464. Off by default
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<String>,

    /// Do not sample the kernel's BPF run-time statistics (by default on at the start of
    /// every 20 s for 50,000 program runs or 1 s; they cost two clock reads per run while on)
    #[arg(long)]
    pub no_bpf_stats: bool,

    /// Also probe this libssl for HTTPS requests (repeatable): one that the target loads
    /// instead of the system's, e.g. a conda environment's lib/libssl.so.3. The system's
    /// (the linker cache's) and, with --pid, each libssl the target processes have mapped
    /// are probed anyway. Needs the object layer
    #[arg(long, value_name = "PATH")]
    pub tls_lib: Vec<PathBuf>,

    /// Also record the target's io_uring reads and writes at the file layer (one row per
    /// request, from submission to completion). Off by default: its probes run on every
    /// io_uring request of the machine
    #[arg(long)]
    pub io_uring: bool,

    /// Trace this running process and its descendants (those it has now and those started from now on)
    #[arg(long, conflicts_with_all = ["cgroup", "command"])]
    pub pid: Option<u32>,

    /// Trace the processes of this cgroup-v2 directory and of the cgroups below it (e.g.
    /// every pod under /sys/fs/cgroup/kubepods.slice)
    #[arg(long, conflicts_with = "command")]
    pub cgroup: Option<PathBuf>,

    /// Only errors and the final summary on stderr: no notes, no progress
    #[arg(short, long)]
    pub quiet: bool,

    /// The command to run and trace, after `--`; its exit code becomes ours
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// The longest --duration and --segment-s: about 31 years, far below where a time
/// (`Instant + Duration`) overflows.
pub const MAX_SECONDS: f64 = 1e9;
/// The largest --segment-mb (1 TiB): its bytes fit a u64.
pub const MAX_SEGMENT_MB: u64 = 1 << 20;

fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= MAX_SECONDS => Ok(v),
        _ => Err(format!("`{s}` is not a number of seconds above 0 and at most 1e9")),
    }
}

fn positive_f64(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("`{s}` is not a positive number")),
    }
}

/// Bad input: reported in one line, exit code 2.
#[derive(Debug)]
pub struct Usage(pub String);

impl fmt::Display for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

macro_rules! usage {
    ($($arg:tt)*) => { return Err(anyhow::Error::new($crate::cli::Usage(format!($($arg)*)))) };
}
pub(crate) use usage;
