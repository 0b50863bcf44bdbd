//! The recording: preflight checks, probes, the target, the drain loop, segments,
//! metadata and the summary. Order matters at the end: stop the target, detach, drain
//! what is left, then close the last segment with the final counters.
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::mem::MaybeUninit;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::rc::Rc;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;
use trainio_schema::{keys, Layer, Retention, SegmentLimits, TraceWriter, SCHEMA_MINOR, SCHEMA_VERSION};

use crate::cli::{usage, Args};
use crate::encoder::{thread_cpu_ns, Encoder};
use crate::events::{Collector, FLUSH_ROWS};
use crate::host;
use crate::metrics::LiveMetrics;
use crate::probes::{Probes, Settings, Target};

/// How long the drain waits for records: long enough for about TURN_ROWS rows to arrive
/// at the rate the last turn saw, between POLL_BUSY and POLL (next_poll). A turn is then
/// short (~40 µs of work) and does not hold a CPU the traced job's pipeline is waiting on
/// (10 ms turns at 200k rows/s scored 2-3 points lower on bench-tracer's 4 KiB workload:
/// docs/design/recorder.md), while a slow stream of rows does not wake the drain 500 times a
/// second for a few rows each: every wake-up costs ~20 µs of CPU whatever it finds.
const POLL: Duration = Duration::from_millis(10);
const POLL_BUSY: Duration = Duration::from_millis(2);
const TURN_ROWS: u32 = 256;

/// The next poll's timeout, after a turn that added `rows` rows `since` the turn before.
fn next_poll(rows: usize, since: Duration) -> Duration {
    match u32::try_from(rows).unwrap_or(u32::MAX) {
        0 => POLL,
        rows => (since * TURN_ROWS / rows).clamp(POLL_BUSY, POLL),
    }
}

const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// How often each CPU's batch of block completions is checked for age (block.bpf.c:
/// written once its first event is 50 ms old, so rows lag the kernel by at most ~150 ms).
const BATCH_FLUSH_EVERY: Duration = Duration::from_millis(100);
/// Kernel BPF statistics are sampled: on at the start of every STATS_PERIOD until
/// STATS_RUNS program runs have been timed or STATS_ON has passed (StatsSampler).
const STATS_ON: Duration = Duration::from_secs(1);
const STATS_RUNS: u64 = 50_000;
const STATS_PERIOD: Duration = Duration::from_secs(20);

/// Keeps the kernel's BPF statistics on only as long as a sample needs. While on they
/// slow every program run by two clock reads: a busy device (500k runs a second) is
/// timed for a tenth of a second in every twenty, a quiet one for the whole second.
struct StatsSampler {
    period_start: Instant,
    /// Timed runs when this period's sample began (None: not read yet).
    runs_at_start: Option<u64>,
}

impl StatsSampler {
    /// A sampler whose first sample starts at `now` (Probes::new turns the statistics on,
    /// before any program has run).
    fn new(now: Instant) -> Self {
        StatsSampler { period_start: now, runs_at_start: Some(0) }
    }

    /// Whether the statistics should be on at `now`, given whether they are, and the runs
    /// timed so far (read only while on). Called about every POLL.
    fn want_on(&mut self, now: Instant, on: bool, timed_runs: impl FnOnce() -> u64) -> bool {
        if now.duration_since(self.period_start) >= STATS_PERIOD {
            self.period_start = now;
            self.runs_at_start = None;
            return true;
        }
        if !on {
            return false;
        }
        let runs = timed_runs();
        let from = *self.runs_at_start.get_or_insert(runs);
        runs - from < STATS_RUNS && now.duration_since(self.period_start) < STATS_ON
    }

    fn tick(&mut self, probes: &Probes) {
        let on = probes.stats_on();
        let want = self.want_on(Instant::now(), on, || probes.timed_runs());
        if want != on {
            probes.set_stats(want);
        }
    }
}

/// lost_events key: rows lost because a segment could not be written (a full disk).
const WRITE_LOST: &str = "segment_write_failed";
/// Disk held back for the last segment (its metadata) until the recording ends.
const RESERVE_BYTES: usize = 1 << 20;

static SIGNALLED: AtomicI32 = AtomicI32::new(0);
/// Signals received: the first is forwarded to the command, a later one stops recording.
static SIGNALS: AtomicU32 = AtomicU32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNALLED.store(sig, Ordering::SeqCst);
    SIGNALS.fetch_add(1, Ordering::SeqCst);
}

fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// What is being traced, as the user gave it.
enum Subject {
    Command(Vec<OsString>),
    Pid(u32),
    Cgroup(PathBuf),
    All,
}

/// Resolves a command name the way execvp will, so a typo fails before any probe loads.
fn find_program(name: &OsString) -> Option<PathBuf> {
    let p = Path::new(name);
    if p.components().count() > 1 {
        return is_executable(p).then(|| p.to_path_buf());
    }
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).map(|d| d.join(p)).find(|c| is_executable(c)))
        .unwrap_or(None)
}

/// A regular file that exec may run, as execvp searches PATH for one.
fn is_executable(p: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else { return false };
    p.is_file() && unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0
}

struct Checked {
    block: bool,
    file: bool,
    nfs: bool,
    object: bool,
    devs: Vec<(u32, String)>,
    subject: Subject,
    target: Target,
    ringbuf_bytes: u32,
}

/// A failed lookup of something the user named is bad input (exit 2).
fn as_usage(e: anyhow::Error) -> anyhow::Error {
    anyhow::Error::new(crate::cli::Usage(format!("{e:#}")))
}

/// `--per-host`: this host's trace in the set `set` is `set/HOSTNAME` (SCHEMA.md, *Trace
/// sets*). The set directory may hold other hosts' traces, not a trace of its own.
fn per_host_output(set: &Path) -> Result<PathBuf> {
    let host = host::hostname();
    if host.is_empty() || host.contains('/') || host == "." || host == ".." {
        usage!("--per-host: this host's name {host:?} cannot name a directory");
    }
    // One look at the path: the other hosts' recorders create it at the same time (it does
    // not exist, then it is a directory), so asking twice could see each in turn.
    match std::fs::metadata(set) {
        Ok(m) if m.is_dir() => {
            let own = std::fs::read_dir(set)?
                .filter_map(|e| e.ok())
                .any(|e| e.file_name().to_str().is_some_and(trainio_schema::is_segment_name));
            if own {
                usage!(
                    "--output {}: holds a trace of its own, so it cannot be a set of per-host traces",
                    set.display()
                );
            }
        }
        Ok(_) => usage!("--output {}: exists and is not a directory", set.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => usage!("--output {}: {e}", set.display()),
    }
    Ok(set.join(host))
}

/// Every check that can fail on bad input, before anything is loaded or written.
fn preflight(args: &Args) -> Result<Checked> {
    if let Some(mb) = args.retain_mb.filter(|&mb| mb < args.segment_mb) {
        usage!(
            "--retain-mb {mb} is below --segment-mb {}: retention keeps whole segments (lower --segment-mb)",
            args.segment_mb
        );
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        usage!("must run as root: loading BPF programs needs CAP_BPF and CAP_PERFMON (try sudo)");
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        usage!("this kernel has no BTF (/sys/kernel/btf/vmlinux missing): CONFIG_DEBUG_INFO_BTF=y is needed");
    }
    let (mut block, mut file, mut nfs, mut object) = (false, false, false, false);
    for l in &args.layers {
        match Layer::parse(l.trim()) {
            Some(Layer::Block) => block = true,
            Some(Layer::File) => file = true,
            Some(Layer::Nfs) => nfs = true,
            Some(Layer::Object) => object = true,
            // Recorded with the file layer, not chosen on their own.
            Some(Layer::Proc | Layer::Ipc) | None => {
                usage!("--layers: unknown layer `{l}` (known: block, file, nfs, object)")
            }
        }
    }
    if object && !file {
        usage!(
            "--layers: object is recorded from the file layer's socket probes: add file (e.g. --layers file,object)"
        );
    }
    if args.io_uring && !file {
        usage!("--io-uring: io_uring requests are recorded at the file layer, which --layers leaves out");
    }
    let mut devs = Vec::new();
    for d in &args.devs {
        devs.push(host::resolve_block_device(d).map_err(as_usage)?);
    }
    let out = &args.output;
    if out.exists() {
        if !out.is_dir() {
            usage!("--output {}: exists and is not a directory", out.display());
        }
        if std::fs::read_dir(out)?.next().is_some() {
            usage!("--output {}: directory is not empty (a trace is never written over another)", out.display());
        }
    }
    // The nearest directory that exists must take new entries (a read-only mount does not,
    // even for root): said now rather than after the probes are loaded.
    let cwd = Path::new(".");
    if let Some(dir) = out.ancestors().map(|a| if a.as_os_str().is_empty() { cwd } else { a }).find(|a| a.is_dir()) {
        let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap_or_default();
        // SAFETY: c is a NUL-terminated path.
        if unsafe { libc::access(c.as_ptr(), libc::W_OK) } != 0 {
            usage!(
                "--output {}: {} is not writable: {}",
                out.display(),
                dir.display(),
                std::io::Error::last_os_error()
            );
        }
    }
    let (subject, target) = if !args.command.is_empty() {
        if find_program(&args.command[0]).is_none() {
            let (name, path) = (args.command[0].to_string_lossy(), Path::new(&args.command[0]));
            if path.components().count() > 1 && path.exists() {
                usage!("{name}: not an executable file");
            }
            usage!("command not found: {name}");
        }
        (Subject::Command(args.command.clone()), Target::Tgids)
    } else if let Some(pid) = args.pid {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            usage!("--pid {pid}: no such process");
        }
        (Subject::Pid(pid), Target::Tgids)
    } else if let Some(cg) = &args.cgroup {
        let id = host::cgroup_id(cg).map_err(as_usage)?;
        (Subject::Cgroup(cg.clone()), Target::Cgroup(id, host::cgroup_level(cg)))
    } else {
        (Subject::All, Target::All)
    };
    let bytes = (args.ringbuf_mb * 1048576.0).ceil().max(4096.0);
    if bytes > (1u64 << 31) as f64 {
        usage!("--ringbuf-mb {}: at most 2048", args.ringbuf_mb);
    }
    let ringbuf_bytes = (bytes as u32).next_power_of_two();
    Ok(Checked { block, file, nfs, object, devs, subject, target, ringbuf_bytes })
}

/// Starts the command held just before exec until its pid is in the traced map, so the
/// trace sees it from its first syscall: the child adds itself (the map fd is inherited).
fn spawn_traced(argv: &[OsString], traced_map: Option<i32>) -> Result<Child> {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    if let Some(fd) = traced_map {
        // SAFETY: the hook only makes async-signal-safe syscalls (getpid, bpf).
        unsafe {
            cmd.pre_exec(move || {
                let pid = libc::getpid() as u32;
                // The value is the process's reads in flight (file.bpf.c, traced).
                let in_flight: u32 = 0;
                let rc = libbpf_rs::libbpf_sys::bpf_map_update_elem(
                    fd,
                    &pid as *const u32 as *const libc::c_void,
                    &in_flight as *const u32 as *const libc::c_void,
                    0,
                );
                if rc != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd.spawn().with_context(|| format!("starting {}", argv[0].to_string_lossy()))
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// Alive and not a zombie: a traced process whose parent has not reaped it is done.
fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()))
        .is_some_and(|state| state != 'Z' && state != 'X')
}

/// The traced processes that exist as the recording starts, each for a proc `start` row:
/// the command (`command_pid`, our child, whose parent is `recorder`), or the --pid
/// process and its descendants, or the cgroup's processes, or every process but ours.
/// A process that is gone by the time /proc is read has none (its exit is recorded).
fn existing_processes(subject: &Subject, command_pid: Option<u32>, recorder: u32) -> Vec<host::ProcInfo> {
    let pids: Vec<u32> = match (subject, command_pid) {
        (Subject::Command(argv), Some(pid)) => {
            // Ours until we reap it: at worst a zombie, whose cmdline /proc no longer has.
            let mut info = host::proc_info(pid).unwrap_or_else(|| host::ProcInfo {
                pid,
                ppid: recorder,
                comm: String::new(),
                cmdline: String::new(),
            });
            if info.cmdline.is_empty() {
                let joined: Vec<u8> =
                    argv.iter().flat_map(|a| a.as_encoded_bytes().iter().copied().chain([0])).collect();
                info.cmdline = host::cmdline_string(&joined);
            }
            if info.comm.is_empty() {
                let name =
                    Path::new(&argv[0]).file_name().unwrap_or(argv[0].as_os_str()).to_string_lossy().into_owned();
                info.comm = name
                    .chars()
                    .scan(0, |n, c| {
                        *n += c.len_utf8();
                        (*n <= 15).then_some(c)
                    })
                    .collect();
            }
            return vec![info];
        }
        (Subject::Command(_), None) => Vec::new(),
        (Subject::Pid(pid), _) => std::iter::once(*pid).chain(host::descendants(*pid)).collect(),
        (Subject::Cgroup(path), _) => host::cgroup_pids(path),
        (Subject::All, _) => host::all_pids().into_iter().filter(|&p| p != recorder).collect(),
    };
    pids.into_iter().filter_map(host::proc_info).collect()
}

/// Fixed facts of the recording, written into every segment.
struct Static {
    start_ns: i64,
    layers: Vec<&'static str>,
    target: serde_json::Value,
    skipped: BTreeMap<String, String>,
    selected_devs: Vec<String>,
    /// NFS mounts' mountstats when the recording started (empty without the nfs layer).
    nfs_at_start: Option<Vec<host::NfsMountStats>>,
    /// The drain thread's CPU time once the probes were loaded and attached: what comes
    /// after is the recording's own cost.
    drain_cpu_at_start: u64,
}

impl Static {
    /// The drain thread's CPU time since the probes were attached (call it on that thread).
    fn drain_cpu_ns(&self) -> u64 {
        thread_cpu_ns() - self.drain_cpu_at_start
    }
}

/// `trainio.nfs_mounts`: each NFS mount's identity from mountstats and mountinfo, and
/// its counters at the start of the recording and now (the segment's close).
fn nfs_mounts_json(at_start: &[host::NfsMountStats], now: &[host::NfsMountStats]) -> serde_json::Value {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for point in now.iter().chain(at_start).map(|m| m.mount_point.as_str()) {
        if !seen.insert(point) {
            continue;
        }
        let start = at_start.iter().rev().find(|m| m.mount_point == point);
        let close = now.iter().rev().find(|m| m.mount_point == point);
        let m = close.or(start).expect("point came from one of them");
        let nconnect = m
            .opts
            .split(',')
            .find_map(|o| o.strip_prefix("nconnect=").and_then(|n| n.parse::<u32>().ok()))
            .unwrap_or(1);
        out.push(json!({
            "dev": host::mount_dev(point),
            "mount_point": point,
            "source": m.source,
            "fstype": m.fstype,
            "statvers": m.statvers,
            "opts": m.opts,
            "nconnect": nconnect,
            "at_start": start.map(|s| &s.now),
            "at_close": close.map(|s| &s.now),
        }));
    }
    serde_json::Value::Array(out)
}

fn segment_metadata(
    st: &Static,
    coll: &Collector,
    probes: &Probes,
    segment: u32,
    recorder_cpu_ns: (u64, u64),
    write_lost: u64,
    ended: Option<&str>,
) -> Vec<(String, String)> {
    let mut devs: Vec<&str> = coll.devices().collect();
    devs.extend(st.selected_devs.iter().map(String::as_str));
    devs.sort();
    devs.dedup();
    let mut events: BTreeMap<&str, u64> = BTreeMap::new();
    for ((layer, _), t) in &coll.tally() {
        *events.entry(layer.as_str()).or_default() += t.events;
    }
    let mut lost = probes.lost();
    if coll.undecodable > 0 {
        lost.insert("undecodable_records".into(), coll.undecodable);
    }
    if write_lost > 0 {
        lost.insert(WRITE_LOST.into(), write_lost);
    }
    vec![
        (keys::SCHEMA_VERSION.into(), SCHEMA_VERSION.into()),
        (keys::SCHEMA_MINOR.into(), SCHEMA_MINOR.into()),
        (keys::TRACER_VERSION.into(), env!("CARGO_PKG_VERSION").into()),
        (keys::HOSTNAME.into(), host::hostname()),
        (keys::KERNEL_RELEASE.into(), host::kernel_release()),
        (keys::CLOCK_OFFSET_NS.into(), host::clock_offset_ns().to_string()),
        (keys::START_NS.into(), st.start_ns.to_string()),
        (keys::END_NS.into(), host::monotonic_ns().to_string()),
        (keys::SEGMENT.into(), segment.to_string()),
        (keys::LAYERS.into(), json!(st.layers).to_string()),
        (keys::SKIPPED_PROBES.into(), json!(st.skipped).to_string()),
        (keys::TARGET.into(), st.target.to_string()),
        (keys::DEVICES.into(), json!(host::describe_devices(devs)).to_string()),
        (keys::LOST_EVENTS.into(), json!(lost).to_string()),
        (keys::BPF_STATS.into(), json!(probes.bpf_stats()).to_string()),
        (keys::EVENTS.into(), json!(events).to_string()),
        (keys::RECORDER_CPU_NS.into(), json!({"drain": recorder_cpu_ns.0, "encoder": recorder_cpu_ns.1}).to_string()),
        (
            keys::NFS_MOUNTS.into(),
            match &st.nfs_at_start {
                Some(start) => nfs_mounts_json(start, &host::nfs_mountstats()).to_string(),
                None => "[]".into(),
            },
        ),
        // Only the segment closed as the recording ends says it is complete: a trace
        // whose last segment says otherwise was cut off (SCHEMA.md, *The end of a recording*).
        (
            keys::END.into(),
            match ended {
                Some(reason) => json!({"complete": true, "reason": reason}),
                None => json!({"complete": false, "reason": "recording"}),
            }
            .to_string(),
        ),
    ]
}

pub fn run(mut args: Args) -> Result<i32> {
    if args.per_host {
        args.output = per_host_output(&args.output)?;
    }
    let checked = preflight(&args)?;
    // Bound before anything is loaded or written: a bad or busy address is bad input.
    let listener = match &args.metrics_addr {
        Some(addr) => Some(crate::metrics::listen(addr).map_err(|m| anyhow::Error::new(crate::cli::Usage(m)))?),
        None => None,
    };
    std::fs::create_dir_all(&args.output)
        .with_context(|| format!("creating {}", args.output.display()))
        .map_err(as_usage)?;
    let note = |msg: &str| {
        if !args.quiet {
            eprintln!("trainio record: {msg}");
        }
    };

    let settings = Settings {
        block: checked.block,
        file: checked.file,
        object: checked.object,
        nfs: checked.nfs,
        devs: checked.devs.iter().map(|(d, _)| *d).collect(),
        ringbuf_bytes: checked.ringbuf_bytes,
        target: checked.target.clone(),
        bpf_stats: !args.no_bpf_stats,
        io_uring: args.io_uring,
    };
    let mut block_obj = MaybeUninit::uninit();
    let mut file_obj = MaybeUninit::uninit();
    let mut nfs_obj = MaybeUninit::uninit();
    let probes = Probes::load(&settings, &mut block_obj, &mut file_obj, &mut nfs_obj)?;
    for (probe, why) in &probes.skipped {
        note(&format!("note: skipping {probe}: {why}"));
    }

    let mut layers = Vec::new();
    if checked.block && !probes.skipped.contains_key("block") {
        layers.push("block");
    }
    if checked.file {
        // proc and ipc are recorded by the file layer's probes.
        layers.extend(["file", "proc", "ipc"]);
    }
    if checked.nfs && !probes.skipped.contains_key("nfs") {
        layers.push("nfs");
    }
    if checked.object {
        layers.push("object");
    }
    let layers_has_nfs = layers.contains(&"nfs");
    let st = Static {
        start_ns: host::monotonic_ns(),
        layers,
        target: match &checked.subject {
            Subject::Command(argv) => json!({"command": argv.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>()}),
            Subject::Pid(p) => json!({"pid": p}),
            Subject::Cgroup(c) => json!({"cgroup": c.display().to_string()}),
            Subject::All => json!({"all": true}),
        },
        skipped: probes.skipped.clone(),
        selected_devs: checked.devs.iter().map(|(d, _)| trainio_schema::dev_string(*d)).collect(),
        nfs_at_start: layers_has_nfs.then(host::nfs_mountstats),
        drain_cpu_at_start: thread_cpu_ns(),
    };

    let collector = Rc::new(RefCell::new(Collector::new()));
    let ring = {
        let c = collector.clone();
        probes.ring_buffer(move |data| c.borrow_mut().on_record(data))?
    };
    let retention =
        Retention { max_bytes: args.retain_mb.map(|mb| mb << 20), max_age: args.retain_s.map(Duration::from_secs_f64) };
    let mut writer = TraceWriter::new(
        &args.output,
        SegmentLimits { max_bytes: args.segment_mb << 20, max_age: Duration::from_secs_f64(args.segment_s) },
    )
    .with_retention(retention);
    if let Err(e) = writer.hold_reserve(RESERVE_BYTES) {
        note(&format!("WARNING: no room for the last segment's reserve ({e:#}): a full disk can lose the trace's end"));
    }
    let mut encoder = Encoder::start(writer)?;

    let live = listener.map(|l| {
        let m = Arc::new(Mutex::new(LiveMetrics::default()));
        let at = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
        crate::metrics::serve(l, m.clone());
        (m, at)
    });
    if let Some((_, at)) = &live {
        note(&format!("serving metrics at http://{at}/metrics"));
    }
    let live = live.map(|(m, _)| m);
    let mut last_status = Instant::now();

    install_signal_handlers();
    let mut child = match &checked.subject {
        Subject::Command(argv) => Some(spawn_traced(argv, probes.traced_map_fd())?),
        Subject::Pid(pid) => {
            probes.trace_pid(*pid)?;
            None
        }
        _ => None,
    };
    if checked.file {
        let ppid_of_command = std::process::id();
        let c = &mut collector.borrow_mut();
        for info in existing_processes(&checked.subject, child.as_ref().map(|c| c.id()), ppid_of_command) {
            c.proc_start(&info, st.start_ns);
        }
    }
    let started = Instant::now();
    // Probes::new turned the statistics on: the first sample starts now.
    let mut stats = StatsSampler::new(started);
    let deadline = args.duration.map(|s| started + Duration::from_secs_f64(s));
    note(&format!("recording {} into {}", st.layers.join("+"), args.output.display()));

    let mut exit_status = None;
    let mut ended = "signal"; // why the loop below stopped, for trainio.end
    let mut forwarded = None; // the signal count when the command was sent one
    let mut abandoned = false;
    let mut last_flush = Instant::now();
    let mut last_batch_flush = Instant::now();
    let mut poll = POLL;
    let mut last_turn = Instant::now();
    loop {
        let rows_before = collector.borrow().batch.len();
        // The count it returns is not needed (the rows are counted below), nor its -errno:
        // EINTR comes from our own signal handlers, which the loop checks below.
        let _ = ring.poll_raw(poll);
        if last_batch_flush.elapsed() >= BATCH_FLUSH_EVERY {
            // Block completions a CPU has batched and not yet written (block.bpf.c).
            probes.flush_block(false);
            last_batch_flush = Instant::now();
        }
        let _ = ring.consume_raw();
        let now = Instant::now();
        poll = next_poll(collector.borrow().batch.len() - rows_before, now - last_turn);
        last_turn = now;
        stats.tick(&probes);
        if collector.borrow().batch.len() >= FLUSH_ROWS || now - last_flush >= FLUSH_EVERY {
            let batch = collector.borrow_mut().batch.finish();
            if let Some(m) = &live {
                let mut m = m.lock().unwrap_or_else(|p| p.into_inner());
                m.observe(&batch);
                if now - last_status >= FLUSH_EVERY {
                    m.set_status(probes.lost(), started.elapsed());
                    last_status = now;
                }
            }
            encoder.send(batch)?;
            last_flush = now;
        }
        if encoder.segment_full() {
            // The segment index is the encoder's to fill in.
            let cpu = (st.drain_cpu_ns(), encoder.cpu_ns());
            let meta = segment_metadata(&st, &collector.borrow(), &probes, 0, cpu, encoder.write_losses().0, None);
            encoder.close_segment(meta)?;
        }
        encoder.regulate();
        if let Some(c) = child.as_mut() {
            if let Some(status) = c.try_wait()? {
                exit_status = Some(status);
                ended = "command exited";
                break;
            }
        }
        let sig = SIGNALLED.load(Ordering::SeqCst);
        if sig != 0 {
            let count = SIGNALS.load(Ordering::SeqCst);
            match (child.as_ref(), forwarded) {
                // Let the command end as it would without us, and record its exit.
                (Some(c), None) => {
                    // SAFETY: sending a signal to our own child.
                    unsafe { libc::kill(c.id() as i32, sig) };
                    forwarded = Some(count);
                }
                // A command that ignores the signal: the next one stops the recording.
                (Some(c), Some(at)) if count > at => {
                    note(&format!(
                        "signalled again: recording stopped; the command (pid {}) is still running, untraced",
                        c.id()
                    ));
                    abandoned = true;
                    break;
                }
                (Some(_), Some(_)) => {}
                (None, _) => break,
            }
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            ended = "duration";
            break;
        }
        if let Subject::Pid(pid) = checked.subject {
            if !process_alive(pid) {
                ended = "process exited";
                break;
            }
        }
    }

    // Completions of requests issued just before the end are still arriving: drain once
    // more after a short grace, detach, then drain what was submitted meanwhile.
    std::thread::sleep(Duration::from_millis(20));
    let _ = ring.consume();
    probes.detach();
    // What the CPUs still hold in their batches: written by the flush program on each
    // CPU, and read from the map for any CPU it could not run on. (The test setting
    // skips the first, so that the second is exercised.)
    if std::env::var_os("TRAINIO_TEST_SKIP_FINAL_FLUSH").is_none() {
        probes.flush_block(true);
    }
    let _ = ring.consume();
    for rec in probes.take_pending_block() {
        collector.borrow_mut().on_record(&rec);
    }
    collector.borrow_mut().finish_objects();
    let batch = collector.borrow_mut().batch.finish();
    if let Some(m) = &live {
        let mut m = m.lock().unwrap_or_else(|p| p.into_inner());
        m.observe(&batch);
        m.set_status(probes.lost(), started.elapsed());
    }
    encoder.send(batch)?;
    let fin = encoder.finish()?;
    let (mut writer, mut write_error) = (fin.writer, fin.write_error);
    let cpu_ns = (st.drain_cpu_ns(), fin.cpu_ns);
    let backlog = fin.peak_backlog;
    // The last segment carries the trace's final metadata. On a full disk it is tried with
    // its rows, then (those rows counted as lost) empty, so that the loss is in the trace;
    // the reserve's blocks are freed for it first.
    writer.release_reserve();
    let mut last = Ok(None);
    for _ in 0..2 {
        let lost = writer.lost_rows() + fin.dropped_rows;
        let index = writer.segment_index();
        let meta = segment_metadata(&st, &collector.borrow(), &probes, index, cpu_ns, lost, Some(ended));
        last = writer.open().and_then(|_| writer.close_segment(&meta));
        match &last {
            Ok(_) => break,
            Err(e) => {
                writer.abandon_segment();
                write_error.get_or_insert_with(|| format!("{e:#}"));
            }
        }
    }
    let elapsed = started.elapsed();
    drop(ring);

    let write_lost = writer.lost_rows() + fin.dropped_rows;
    print_summary(&args.output, &writer, &collector.borrow(), &probes, elapsed, cpu_ns, write_lost);
    eprintln!("  encoder backlog: at most {} rows, {:.1} s behind", backlog.rows, backlog.lag.as_secs_f64());
    if let Some(e) = &write_error {
        eprintln!("  writing the trace failed ({e}): the finished segments are intact");
        if last.is_err() {
            eprintln!("  WARNING: the last segment could not be written: the trace's metadata does not count these");
        }
    }

    // A --duration that ended before the command: the command is the user's job, so wait.
    let code = match (exit_status, child.as_mut()) {
        (_, Some(_)) if abandoned => 128 + SIGNALLED.load(Ordering::SeqCst),
        (Some(status), _) => exit_code(status),
        (None, Some(c)) => wait_command(c, forwarded)?,
        (None, None) => 0,
    };
    Ok(code)
}

/// Waits for the command after the trace is written (a --duration that ended first): a
/// signal is forwarded to it, and a later one stops the wait with the command running.
fn wait_command(c: &mut std::process::Child, mut forwarded: Option<u32>) -> Result<i32> {
    loop {
        if let Some(status) = c.try_wait()? {
            return Ok(exit_code(status));
        }
        let count = SIGNALS.load(Ordering::SeqCst);
        let sig = SIGNALLED.load(Ordering::SeqCst);
        match forwarded {
            None if count > 0 => {
                // SAFETY: sending a signal to our own child.
                unsafe { libc::kill(c.id() as i32, sig) };
                forwarded = Some(count);
            }
            Some(at) if count > at => {
                eprintln!("trainio record: signalled again: the command (pid {}) is still running", c.id());
                return Ok(128 + sig);
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `cpu_ns`: the drain's and the encoder's CPU time while recording.
fn print_summary(
    dir: &Path,
    writer: &TraceWriter,
    coll: &Collector,
    probes: &Probes,
    elapsed: Duration,
    cpu_ns: (u64, u64),
    write_lost: u64,
) {
    let size: u64 = writer.finished_segments().iter().filter_map(|p| std::fs::metadata(p).ok()).map(|m| m.len()).sum();
    let mib = |b: u64| b as f64 / 1048576.0;
    eprintln!(
        "trainio record: trace {} ({} segment{}, {:.1} MiB on disk, {:.2} s)",
        dir.display(),
        writer.finished_segments().len(),
        if writer.finished_segments().len() == 1 { "" } else { "s" },
        mib(size),
        elapsed.as_secs_f64()
    );
    let dropped = writer.dropped();
    if dropped.segments > 0 {
        eprintln!(
            "  retention removed {} segment{} ({} rows, {:.1} MiB)",
            dropped.segments,
            if dropped.segments == 1 { "" } else { "s" },
            dropped.rows,
            mib(dropped.bytes)
        );
    }
    eprintln!("  {:<6} {:<9} {:>10} {:>11} {:>11}", "layer", "dev", "events", "read MiB", "write MiB");
    for ((layer, dev), t) in &coll.tally() {
        let dev = dev.as_deref().unwrap_or("-");
        if *layer == Layer::Proc {
            // Process events: no bytes.
            eprintln!("  {:<6} {:<9} {:>10} {:>11} {:>11}", layer.as_str(), dev, t.events, "-", "-");
        } else {
            eprintln!(
                "  {:<6} {:<9} {:>10} {:>11.2} {:>11.2}",
                layer.as_str(),
                dev,
                t.events,
                mib(t.bytes_read),
                mib(t.bytes_written)
            );
        }
    }
    // What recording cost in user space (the probes' kernel time is in trainio.bpf_stats).
    let events: u64 = coll.tally().values().map(|t| t.events).sum();
    eprintln!(
        "  recorder CPU: drain {:.2} s, encoder {:.2} s ({:.0} ns per event)",
        cpu_ns.0 as f64 / 1e9,
        cpu_ns.1 as f64 / 1e9,
        (cpu_ns.0 + cpu_ns.1) as f64 / events.max(1) as f64
    );
    let mut lost = probes.lost();
    if write_lost > 0 {
        lost.insert(WRITE_LOST.into(), write_lost);
    }
    let total: u64 = lost.values().sum::<u64>() + coll.undecodable;
    if total == 0 {
        eprintln!("  lost events: 0");
    } else {
        let full = lost.iter().any(|(probe, n)| *n > 0 && probe.ends_with("ringbuf_full"));
        let hint = if full { ": raise --ringbuf-mb" } else { "" };
        eprintln!("  WARNING: {total} EVENTS LOST, the trace is incomplete{hint}");
        for (probe, n) in lost.iter().filter(|(_, n)| **n > 0) {
            eprintln!("    {probe}: {n}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_sample_closes_after_enough_runs_and_reopens_next_period() {
        let t0 = Instant::now();
        let mut s = StatsSampler::new(t0);
        let ms = |n: u64| t0 + Duration::from_millis(n);
        // Busy: the sample closes once STATS_RUNS runs are timed, long before STATS_ON.
        assert!(s.want_on(ms(10), true, || STATS_RUNS - 1));
        assert!(!s.want_on(ms(20), true, || STATS_RUNS));
        // Off until the next period; the run count is not read meanwhile.
        assert!(!s.want_on(ms(5_000), false, || panic!("read while off")));
        assert!(s.want_on(ms(20_000), false, || panic!("read at the period start")));
        // The new sample counts from the runs timed when it began.
        assert!(s.want_on(ms(20_010), true, || 3 * STATS_RUNS));
        assert!(s.want_on(ms(20_020), true, || 4 * STATS_RUNS - 1));
        assert!(!s.want_on(ms(20_030), true, || 4 * STATS_RUNS));
    }

    #[test]
    fn poll_waits_for_about_turn_rows_at_the_last_rate() {
        let ms = Duration::from_millis;
        // Nothing arrived: the idle poll.
        assert_eq!(next_poll(0, ms(10)), POLL);
        // 200k rows/s (bench-tracer's 4 KiB pattern): as short as allowed.
        assert_eq!(next_poll(400, ms(2)), POLL_BUSY);
        // 64k rows/s: TURN_ROWS arrive in 4 ms.
        assert_eq!(next_poll(640, ms(10)), ms(4));
        // 12k rows/s (the 1 MiB pattern): no more often than the idle poll.
        assert_eq!(next_poll(24, ms(2)), POLL);
        assert_eq!(next_poll(120, ms(10)), POLL);
        assert_eq!(next_poll(usize::MAX, ms(1)), POLL_BUSY);
    }

    #[test]
    fn stats_sample_of_a_quiet_device_lasts_stats_on() {
        let t0 = Instant::now();
        let mut s = StatsSampler::new(t0);
        let at = |d: Duration| t0 + d;
        assert!(s.want_on(at(STATS_ON - Duration::from_millis(1)), true, || 64));
        assert!(!s.want_on(at(STATS_ON), true, || 64));
        assert!(!s.want_on(at(STATS_PERIOD - Duration::from_millis(1)), false, || 64));
        assert!(s.want_on(at(STATS_PERIOD), false, || 64));
    }
}
