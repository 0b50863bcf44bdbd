//! The recording: preflight checks (preflight.rs), probes, the target, the drain loop
//! (Recording::drain: turns, rows to the encoder, segment rotation), the end
//! (Recording::end), segment metadata (metadata.rs) and the summary. Order matters at the
//! end: stop the target, detach, drain what is left, then close the last segment with
//! the final counters.
use std::cell::RefCell;
use std::ffi::OsString;
use std::mem::MaybeUninit;
use std::net::TcpListener;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, ExitStatus};
use std::rc::Rc;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use libbpf_rs::RingBuffer;
use trainio_schema::{Layer, Retention, SegmentLimits, TraceWriter};

use crate::cli::Args;
use crate::encoder::Encoder;
use crate::events::{Collector, FLUSH_ROWS};
use crate::host;
use crate::metrics::LiveMetrics;
use crate::probes::Probes;

mod metadata;
mod preflight;
mod progress;

use metadata::{segment_metadata, Static, WRITE_LOST};
use preflight::{as_usage, per_host_output, preflight, Subject};

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

/// Records until the command exits, the --pid process ends, the duration passes or a signal
/// stops it. The phases: checks, probes, the target, the drain (Recording::drain), the end
/// (Recording::end), the summary; returns the exit code (the command's, when there is one).
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

    let mut block_obj = MaybeUninit::uninit();
    let mut file_obj = MaybeUninit::uninit();
    let mut nfs_obj = MaybeUninit::uninit();
    let probes = Probes::load(&checked.settings(&args), &mut block_obj, &mut file_obj, &mut nfs_obj)?;
    for (probe, why) in &probes.skipped {
        note(&format!("note: skipping {probe}: {why}"));
    }
    let st = Static::new(&checked, &probes);

    let collector = Rc::new(RefCell::new(Collector::new()));
    let ring = {
        let c = collector.clone();
        probes.ring_buffer(move |data| c.borrow_mut().on_record(data))?
    };
    let mut encoder = start_encoder(&args, &note)?;
    let live = serve_metrics(listener, &note);

    install_signal_handlers();
    let mut child = start_subject(&checked.subject, &probes)?;
    if checked.file {
        let ppid_of_command = std::process::id();
        let c = &mut collector.borrow_mut();
        for info in existing_processes(&checked.subject, child.as_ref().map(|c| c.id()), ppid_of_command) {
            c.proc_start(&info, st.start_ns);
        }
    }
    let started = Instant::now();
    let deadline = args.duration.map(|s| started + Duration::from_secs_f64(s));
    note(&format!("recording {} into {}", st.layers.join("+"), args.output.display()));

    let progress = progress::Progress::new(args.quiet, child.is_some(), checked.progress_every, started);
    let mut recording = Recording::new(&probes, ring, collector.clone(), st, live, started, progress);
    let stop = recording.drain(&mut encoder, &mut child, &checked.subject, deadline, &note)?;
    let end = recording.end(encoder, stop.ended)?;

    print_summary(&args.output, &end.writer, &collector.borrow(), &probes, end.elapsed, end.cpu_ns, end.write_lost);
    let backlog = end.backlog;
    eprintln!("  encoder backlog: at most {} rows, {:.1} s behind", backlog.rows, backlog.lag.as_secs_f64());
    if let Some(e) = &end.write_error {
        eprintln!("  writing the trace failed ({e}): the finished segments are intact");
        if end.last_failed {
            eprintln!("  WARNING: the last segment could not be written: the trace's metadata does not count these");
        }
    }

    // A --duration that ended before the command: the command is the user's job, so wait.
    let code = match (stop.exit_status, child.as_mut()) {
        (_, Some(_)) if stop.abandoned => 128 + SIGNALLED.load(Ordering::SeqCst),
        (Some(status), _) => exit_code(status),
        (None, Some(c)) => wait_command(c, stop.forwarded)?,
        (None, None) => 0,
    };
    Ok(code)
}

/// The trace writer (its segment limits, retention, and the reserve held for the last
/// segment) started on the encoder's thread.
fn start_encoder(args: &Args, note: &dyn Fn(&str)) -> Result<Encoder> {
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
    Encoder::start(writer)
}

/// The live metrics served on --metrics-addr's listener, if one was bound.
fn serve_metrics(listener: Option<TcpListener>, note: &dyn Fn(&str)) -> Option<Arc<Mutex<LiveMetrics>>> {
    let live = listener.map(|l| {
        let m = Arc::new(Mutex::new(LiveMetrics::default()));
        let at = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
        crate::metrics::serve(l, m.clone());
        (m, at)
    });
    if let Some((_, at)) = &live {
        note(&format!("serving metrics at http://{at}/metrics"));
    }
    live.map(|(m, _)| m)
}

/// Starts the command, or puts the --pid process in the traced set; a cgroup or every
/// process is the probes' own filter.
fn start_subject(subject: &Subject, probes: &Probes) -> Result<Option<Child>> {
    Ok(match subject {
        Subject::Command(argv) => Some(spawn_traced(argv, probes.traced_map_fd())?),
        Subject::Pid(pid) => {
            probes.trace_pid(*pid)?;
            None
        }
        _ => None,
    })
}

/// Why and how the drain stopped.
struct Stop {
    /// Why, for trainio.end.
    ended: &'static str,
    /// The command's exit, when it ended the recording.
    exit_status: Option<ExitStatus>,
    /// The signal count when the command was sent one.
    forwarded: Option<u32>,
    /// A second signal stopped the recording with the command still running.
    abandoned: bool,
}

impl Stop {
    /// Whether the recording stops now, and why: the command exited, a signal came with no
    /// command to forward it to, or a second one after the command was sent the first; the
    /// duration passed; the --pid process ended.
    fn now(
        &mut self,
        child: &mut Option<Child>,
        subject: &Subject,
        deadline: Option<Instant>,
        note: &dyn Fn(&str),
    ) -> Result<bool> {
        if let Some(c) = child.as_mut() {
            if let Some(status) = c.try_wait()? {
                self.exit_status = Some(status);
                self.ended = "command exited";
                return Ok(true);
            }
        }
        let sig = SIGNALLED.load(Ordering::SeqCst);
        if sig != 0 {
            let count = SIGNALS.load(Ordering::SeqCst);
            match (child.as_ref(), self.forwarded) {
                // Let the command end as it would without us, and record its exit.
                (Some(c), None) => {
                    // SAFETY: sending a signal to our own child.
                    unsafe { libc::kill(c.id() as i32, sig) };
                    self.forwarded = Some(count);
                }
                // A command that ignores the signal: the next one stops the recording.
                (Some(c), Some(at)) if count > at => {
                    note(&format!(
                        "signalled again: recording stopped; the command (pid {}) is still running, untraced",
                        c.id()
                    ));
                    self.abandoned = true;
                    return Ok(true);
                }
                (Some(_), Some(_)) => {}
                (None, _) => return Ok(true),
            }
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            self.ended = "duration";
            return Ok(true);
        }
        if let Subject::Pid(pid) = subject {
            if !process_alive(*pid) {
                self.ended = "process exited";
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// What the end of the recording leaves for the summary.
struct Ended {
    writer: TraceWriter,
    write_error: Option<String>,
    /// The last segment, with the trace's final metadata, could not be written.
    last_failed: bool,
    /// The drain's and the encoder's CPU time.
    cpu_ns: (u64, u64),
    /// Rows lost to failed writes.
    write_lost: u64,
    elapsed: Duration,
    /// The encoder's largest backlog.
    backlog: crate::encoder::Backlog,
}

/// The recording once the probes are attached: the ring buffers and what their records
/// become (rows in the collector, batches to the encoder, live metrics), and the pace of
/// the drain that turns them.
struct Recording<'r, 'o> {
    probes: &'r Probes<'o>,
    ring: RingBuffer<'r>,
    collector: Rc<RefCell<Collector>>,
    st: Static,
    live: Option<Arc<Mutex<LiveMetrics>>>,
    started: Instant,
    stats: StatsSampler,
    poll: Duration,
    last_turn: Instant,
    last_flush: Instant,
    last_batch_flush: Instant,
    last_status: Instant,
    progress: progress::Progress,
    /// Segments closed so far.
    segments: u64,
}

impl<'r, 'o> Recording<'r, 'o> {
    fn new(
        probes: &'r Probes<'o>,
        ring: RingBuffer<'r>,
        collector: Rc<RefCell<Collector>>,
        st: Static,
        live: Option<Arc<Mutex<LiveMetrics>>>,
        started: Instant,
        progress: progress::Progress,
    ) -> Self {
        let now = Instant::now();
        Recording {
            probes,
            ring,
            collector,
            st,
            live,
            started,
            // Probes::new turned the statistics on: the first sample starts now.
            stats: StatsSampler::new(started),
            poll: POLL,
            last_turn: now,
            last_flush: now,
            last_batch_flush: now,
            last_status: now,
            progress,
            segments: 0,
        }
    }

    /// Turns until the recording is to stop (Stop::now): each turn takes the records in,
    /// sends the rows to the encoder and closes a full segment.
    fn drain(
        &mut self,
        encoder: &mut Encoder,
        child: &mut Option<Child>,
        subject: &Subject,
        deadline: Option<Instant>,
        note: &dyn Fn(&str),
    ) -> Result<Stop> {
        let mut stop = Stop { ended: "signal", exit_status: None, forwarded: None, abandoned: false };
        loop {
            let now = self.turn();
            self.send_rows(encoder, now)?;
            self.rotate_segment(encoder)?;
            if self.progress.due(now) {
                let lost = self.probes.lost().values().sum();
                self.progress.show(now, progress::Sofar::of(&self.collector.borrow(), self.segments, lost));
            }
            encoder.regulate();
            if stop.now(child, subject, deadline, note)? {
                return Ok(stop);
            }
        }
    }

    /// One turn: waits for records, hands them to the collector, and sets how long the next
    /// turn waits. Returns when it ended.
    fn turn(&mut self) -> Instant {
        let rows_before = self.collector.borrow().batch.len();
        // The count it returns is not needed (the rows are counted below), nor its -errno:
        // EINTR comes from our own signal handlers, which the loop checks below.
        let _ = self.ring.poll_raw(self.poll);
        if self.last_batch_flush.elapsed() >= BATCH_FLUSH_EVERY {
            // Block completions a CPU has batched and not yet written (block.bpf.c).
            self.probes.flush_block(false);
            self.last_batch_flush = Instant::now();
        }
        let _ = self.ring.consume_raw();
        let now = Instant::now();
        self.poll = next_poll(self.collector.borrow().batch.len() - rows_before, now - self.last_turn);
        self.last_turn = now;
        self.stats.tick(self.probes);
        now
    }

    /// The collector's rows to the encoder (and the live metrics) once there are
    /// FLUSH_ROWS of them or FLUSH_EVERY has passed.
    fn send_rows(&mut self, encoder: &mut Encoder, now: Instant) -> Result<()> {
        if self.collector.borrow().batch.len() < FLUSH_ROWS && now - self.last_flush < FLUSH_EVERY {
            return Ok(());
        }
        let batch = self.collector.borrow_mut().batch.finish();
        if let Some(m) = &self.live {
            let mut m = m.lock().unwrap_or_else(|p| p.into_inner());
            m.observe(&batch);
            if now - self.last_status >= FLUSH_EVERY {
                m.set_status(self.probes.lost(), self.started.elapsed());
                self.last_status = now;
            }
        }
        encoder.send(batch)?;
        self.last_flush = now;
        Ok(())
    }

    /// Closes the encoder's segment once it is full, with the metadata as of now.
    fn rotate_segment(&mut self, encoder: &mut Encoder) -> Result<()> {
        if encoder.segment_full() {
            // The segment index is the encoder's to fill in.
            let cpu = (self.st.drain_cpu_ns(), encoder.cpu_ns());
            let lost = encoder.write_losses().0;
            let meta = segment_metadata(&self.st, &self.collector.borrow(), self.probes, 0, cpu, lost, None);
            encoder.close_segment(meta)?;
            self.segments += 1;
        }
        Ok(())
    }

    /// Takes in what is left once the probes detach, then writes the last segment with the
    /// trace's final metadata (`ended`: why the recording stopped).
    fn end(mut self, mut encoder: Encoder, ended: &str) -> Result<Ended> {
        self.progress.finish();
        // Completions of requests issued just before the end are still arriving: drain once
        // more after a short grace, detach, then drain what was submitted meanwhile.
        std::thread::sleep(Duration::from_millis(20));
        let _ = self.ring.consume();
        self.probes.detach();
        // What the CPUs still hold in their batches: written by the flush program on each
        // CPU, and read from the map for any CPU it could not run on. (The test setting
        // skips the first, so that the second is exercised.)
        if std::env::var_os("TRAINIO_TEST_SKIP_FINAL_FLUSH").is_none() {
            self.probes.flush_block(true);
        }
        let _ = self.ring.consume();
        for rec in self.probes.take_pending_block() {
            self.collector.borrow_mut().on_record(&rec);
        }
        self.collector.borrow_mut().finish_objects();
        let batch = self.collector.borrow_mut().batch.finish();
        if let Some(m) = &self.live {
            let mut m = m.lock().unwrap_or_else(|p| p.into_inner());
            m.observe(&batch);
            m.set_status(self.probes.lost(), self.started.elapsed());
        }
        encoder.send(batch)?;
        let fin = encoder.finish()?;
        let (mut writer, mut write_error) = (fin.writer, fin.write_error);
        let cpu_ns = (self.st.drain_cpu_ns(), fin.cpu_ns);
        let backlog = fin.peak_backlog;
        // The last segment carries the trace's final metadata. On a full disk it is tried with
        // its rows, then (those rows counted as lost) empty, so that the loss is in the trace;
        // the reserve's blocks are freed for it first.
        writer.release_reserve();
        let mut last = Ok(None);
        for _ in 0..2 {
            let lost = writer.lost_rows() + fin.dropped_rows;
            let index = writer.segment_index();
            let meta =
                segment_metadata(&self.st, &self.collector.borrow(), self.probes, index, cpu_ns, lost, Some(ended));
            last = writer.open().and_then(|_| writer.close_segment(&meta));
            match &last {
                Ok(_) => break,
                Err(e) => {
                    writer.abandon_segment();
                    write_error.get_or_insert_with(|| format!("{e:#}"));
                }
            }
        }
        let elapsed = self.started.elapsed();
        let write_lost = writer.lost_rows() + fin.dropped_rows;
        Ok(Ended { writer, write_error, last_failed: last.is_err(), cpu_ns, write_lost, elapsed, backlog })
    }
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
