//! The accelerator model: simulated GPUs, their data-loader workers, and the step barrier,
//! all driven by one event loop per rank over an I/O backend (`Backend`: io_uring or psync
//! threads in uring.rs, a fake in the unit tests).
//!
//! Why one thread: a simulated GPU is mostly asleep (computing) or waiting for its reads,
//! so an OS thread per GPU or per reader would spend the host's CPU on context switches
//! and make sleep overshoot grow with the GPU count. Here every reader of every simulated
//! GPU is a state machine with at most one read in flight, submitted to io_uring, so the
//! storage sees exactly `read_threads` outstanding reads per simulated GPU, as a PyTorch
//! DataLoader with `num_workers = read_threads` would create, whatever the GPU count. The
//! compute sleeps are deadlines in a heap; the loop waits in `io_uring_enter` with a timeout
//! at the next deadline.
//!
//! Loader model (PyTorch's): each worker reads one whole batch, sample after sample, and
//! hands it over in step order; a GPU may have `window` batches started but not consumed
//! (`read_threads × ceil(prefetch_size / read_threads)`, DLIO's prefetch_factor rule).
//! A new epoch's reading starts when the GPU enters that epoch (a new DataLoader iterator).
//!
//! Checkpoints (a workload's `checkpoint` section): when one is due after a step, the
//! loop writes it between the step barrier and the next step, so every simulated GPU of
//! the job stands still meanwhile, and its time is left out of AU as DLIO leaves it out
//! (checkpointing.rs, docs/checkpoints.md). A trace's write bursts are written the same way
//! after the step they followed (Program::writes_after, trace_writes.rs).
//!
//! This file holds the types and the event loop; beside it in engine/: loader.rs (the
//! workers that read batches into each GPU's window), steps.rs (a step's end: compute,
//! barrier, writes between steps, epochs and AU), the backends that issue the reads
//! (uring.rs: io_uring, or with `--io-engine psync` the thread pool of pool.rs) and
//! client.rs, the client's own CPU.
//! The object-storage backend is object/s3_reads.rs.

pub mod client;
mod loader;
pub mod pool;
mod steps;
pub mod uring;

use crate::cluster::{Cluster, PendingBarrier};
use anyhow::{bail, Result};
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::path::{Path, PathBuf};
use steps::{close_epoch, final_au};

/// One read request (a sample, a part of one, or a recorded read): a byte range of a file.
#[derive(Debug, Clone, Copy)]
pub struct SampleRead {
    pub file: u32,
    pub offset: u64,
    pub len: u64,
    /// Workload mode: issued on the file the worker's previous read left open (the next
    /// request of a format reader's sequence), not on a new open of the file.
    pub chain: bool,
    /// Recorded mode: the file is closed once this read completes (a stream's last read
    /// of it).
    pub close: bool,
    /// The reader's own CPU time after this read, before it goes on (decoding what it
    /// read, DLIO's `preprocess_time`): the worker stays busy, and the batch is not ready
    /// before it ends.
    pub think_ns: u64,
    /// Trace mode: the job read these bytes through a memory mapping (page faults), so
    /// the replay maps them and touches each page in order rather than reading them.
    pub mapped: bool,
    /// Workload mode: not a read but posix_fadvise(WILLNEED) of the range, as Arrow's
    /// read cache asks for the ranges it is about to read (the kernel reads them ahead,
    /// each exactly); the worker goes straight on to its next request.
    pub advise: bool,
}

impl SampleRead {
    pub fn new(file: u32, offset: u64, len: u64) -> SampleRead {
        SampleRead { file, offset, len, chain: false, close: false, think_ns: 0, mapped: false, advise: false }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub samples: u32,
    pub reads: Vec<SampleRead>,
    /// Recorded mode: per read, the reader (worker of the GPU, modulo its worker count)
    /// that issues it; a reader issues its reads one at a time, in order. Empty: read i
    /// goes to reader i mod workers.
    pub streams: Vec<u32>,
}

/// What every simulated GPU of this rank does; implemented by the workload and trace modes.
pub trait Program {
    fn epochs(&self) -> u64;
    fn steps_per_epoch(&self) -> u64;
    /// `gpu` is the rank-local index.
    fn batch(&self, gpu: usize, epoch: u64, step: u64) -> Batch;
    fn compute_seconds(&self, gpu: usize, epoch: u64, step: u64, rng: &mut StdRng) -> f64;
    fn path(&self, file: u32) -> PathBuf;
    /// The data directory: every path() is inside it, and opened beneath it.
    fn root(&self) -> &std::path::Path;
    fn read_threads(&self, gpu: usize) -> usize;
    fn prefetch_size(&self, gpu: usize) -> usize;
    /// Largest single read request, bytes.
    fn max_request(&self) -> u64;
    /// Replaying recorded syscalls: a batch's reads go to the workers named by
    /// `Batch::streams` (the recorded threads) and files stay open, as they did in the
    /// recording. Otherwise (workload mode) a worker reads a whole batch and opens and
    /// closes each sample, as a DataLoader worker does.
    fn recorded(&self) -> bool {
        false
    }
    /// Recorded mode: the GPU reads each batch itself when it asks for it (a DataLoader
    /// without workers): batch k+1 starts only when step k's compute has ended.
    fn synchronous(&self, _gpu: usize) -> bool {
        false
    }
    /// Seconds the GPU spends taking a batch once it is read, before it computes (a rank
    /// receiving a batch from its workers, a loader's own CPU time): waiting for data, not
    /// compute.
    fn handoff_seconds(&self, _gpu: usize) -> f64 {
        0.0
    }
    /// Recorded mode: batch `step` is not started before this many ns after the GPU
    /// entered the epoch (the recorded time of its first read), so a replay on the same
    /// storage issues its reads when the recording did, without drift. None: no pacing.
    fn not_before_ns(&self, _gpu: usize, _epoch: u64, _step: u64) -> Option<u64> {
        None
    }
    /// Work the ranks did before the run that shaped the page cache it starts with (a
    /// dataset's loading, in trace mode): done by run() after caches are dropped and
    /// before the timed run, counted in none of its figures.
    fn prepare(&self) -> anyhow::Result<()> {
        Ok(())
    }
    /// Recorded mode: the writes and syncs GPU `gpu` made after `step` steps of the epoch
    /// (1-based: the step just finished), in order; empty when it made none there.
    fn writes_after(&self, _gpu: usize, _epoch: u64, _step: u64) -> Vec<crate::trace::trace_writes::WriteCall> {
        Vec::new()
    }
    /// Batches the loader of GPU `gpu` reads in `epoch` past its last step, which the GPU
    /// never takes (a job that stopped while its workers had read ahead): steps
    /// `steps_per_epoch()..` of `batch()`. They are read within the prefetch window as
    /// the others are; when the GPU's last step ends, a reader finishes the batch it has
    /// started and starts no other (PyTorch's workers, shut down, finish the batch in hand).
    fn untaken_batches(&self, _gpu: usize, _epoch: u64) -> u64 {
        0
    }
    /// Recorded mode: makes the bursts of `writes_after` (one per GPU that writes after
    /// this step, at once), into `buf`; each burst's figures and seconds. The trace
    /// program puts a burst's objects to its store; the default writes files.
    fn run_write_bursts(
        &self,
        bursts: &[Vec<crate::trace::trace_writes::WriteCall>],
        buf: &mut Vec<u8>,
    ) -> Result<Vec<(crate::trace::trace_writes::BurstIo, f64)>> {
        crate::trace::trace_writes::run_bursts(bursts, buf, None)
    }
}

#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub odirect: bool,
    pub barrier: bool,
    pub progress: bool,
    /// Run the event loop SCHED_FIFO so other processes' load cannot delay a GPU's wake-up.
    pub realtime: bool,
    /// Issue reads as blocking pread syscalls from a thread per reader slot.
    pub psync: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct EpochStats {
    pub epoch: u64,
    pub steps: u64,
    pub samples: u64,
    pub bytes: u64,
    pub duration_s: f64,
    pub first_step_s: f64,
    /// Σ measured compute of steps 2..n of this epoch, without the first step after
    /// each checkpoint.
    pub compute_after_first_s: f64,
    pub au: f64,
    /// Time the GPU stood still for checkpoints in this epoch.
    #[serde(default)]
    pub checkpoint_s: f64,
    /// Time after the first step left out of AU: checkpoints, and the first step after
    /// each mid-epoch checkpoint (DLIO starts a new block there).
    #[serde(default)]
    pub excluded_s: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GpuStats {
    pub gpu: u64,
    pub rank: usize,
    pub steps: u64,
    pub samples: u64,
    pub bytes: u64,
    pub compute_s: f64,
    pub io_wait_s: f64,
    pub barrier_wait_s: f64,
    /// DLIO's AU as a fraction: first step of each epoch excluded.
    pub au: f64,
    /// Most reads of this GPU in flight at once: the queue depth it put on storage.
    pub max_outstanding_reads: u64,
    pub epochs: Vec<EpochStats>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RankRun {
    pub gpus: Vec<GpuStats>,
    pub wall_s: f64,
    /// Sleep overshoot histogram: (µs, count), sparse.
    pub overshoot_us: Vec<(u64, u64)>,
    /// This rank's part of every checkpoint the job wrote.
    #[serde(default)]
    pub checkpoints: Vec<crate::checkpoint::checkpointing::CheckpointIo>,
    /// Why the run stopped before its last step (a checkpoint that failed, a rank lost),
    /// if it did.
    #[serde(default)]
    pub stopped: Option<String>,
    /// Object storage: this rank's request log (the backend's `object_log`).
    #[serde(default)]
    pub object: Option<serde_json::Value>,
}

const ALIGN: u64 = 4096;

/// The reader of read `i` of a recorded batch (see `Batch::streams`).
fn stream_of(streams: &[u32], i: usize) -> usize {
    streams.get(i).map(|&s| s as usize).unwrap_or(i)
}

/// Bytes of one reader slot's buffer: the largest request, rounded up to O_DIRECT's
/// alignment, plus one alignment unit for an aligned read that starts before its sample.
pub fn buffer_len(program: &impl Program) -> usize {
    crate::dataset::round_up(program.max_request().max(1), ALIGN) as usize + ALIGN as usize
}

/// What the state machine needs of the I/O: a clock, files opened and closed, one read per
/// reader slot in flight at a time, and a wait for completions or a deadline.
pub trait Backend {
    /// Sets the clock to 0 and makes the backend ready to read.
    fn start(&mut self) -> Result<()>;
    /// ns since `start`.
    fn now(&self) -> u64;
    /// Largest read one slot's buffer holds, bytes.
    fn buf_len(&self) -> u64;
    /// Opens a data file for reading (O_DIRECT when the options ask for it).
    fn open(&mut self, path: &Path) -> Result<i32>;
    fn close(&mut self, fd: i32);
    /// Reader slot `slot` reads `len` bytes at `offset` of `fd`; the slot has no other read
    /// in flight.
    fn submit(&mut self, slot: usize, fd: i32, offset: u64, len: u32) -> Result<()>;
    /// As `submit`, but through a memory mapping: the slot maps the range and touches
    /// each of its pages in order, so the kernel faults them in (read-around and
    /// fault-around) as it did for the job. Completes with `len`.
    fn submit_mapped(&mut self, slot: usize, fd: i32, offset: u64, len: u32) -> Result<()> {
        self.submit(slot, fd, offset, len)
    }
    /// Submits what is queued and waits up to `wait_ns` (0: not at all; u64::MAX: until a
    /// completion) for a read to complete; appends the completed reads as (slot, bytes read
    /// or -errno).
    fn wait(&mut self, wait_ns: u64, out: &mut Vec<(usize, i32)>) -> Result<()>;
    /// An object-storage backend's request log (s3_reads.rs), in the rank's results.
    fn object_log(&self) -> Option<serde_json::Value> {
        None
    }
}
struct Worker {
    gpu: usize,
    /// Step of the batch being read, if any.
    step: Option<u64>,
    item: usize,
    pos: u64,
    fd: i32,
    /// Bytes the read in flight asked for.
    asked: u64,
    path: PathBuf,
    /// The read whose `think_ns` the worker is spending (a timer in `cpu_timers`).
    thinking: Option<SampleRead>,
}

struct Slot {
    step: u64,
    batch: Batch,
    done: bool,
    /// Recorded mode: reads not yet given to a worker, reads in flight, and per worker of
    /// the GPU the index from which its next read is searched (a worker takes its reads
    /// in order, so the search never goes back).
    unassigned: usize,
    outstanding: usize,
    cursor: Vec<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    WaitBatch { since: u64 },
    Computing { start: u64 },
    AtBarrier { since: u64 },
    Done,
}

struct Gpu {
    workers: Vec<usize>,
    window: u64,
    epoch: u64,
    step: u64,
    /// Batches handed to the GPU this epoch (the window counts from here).
    consumed: u64,
    next_to_start: u64,
    slots: VecDeque<Slot>,
    state: State,
    carry_ns: u64,
    /// A pace timer of this GPU is in `pace_timers`.
    pace_pending: bool,
    /// Reads of this GPU in flight now.
    outstanding: u64,
    rng: StdRng,
    epoch_start: u64,
    first_step_end: Option<u64>,
    /// The step being run is the first after a mid-epoch checkpoint, which began at this time.
    block_start: Option<u64>,
    cur: EpochStats,
    stats: GpuStats,
}

/// The state machine of one rank's simulated GPUs over backend `B`; worker `w` of the
/// rank reads through the backend's reader slot `w`.
pub struct Engine<'a, P: Program, B: Backend> {
    program: &'a P,
    options: EngineOptions,
    cluster: &'a Cluster,
    backend: B,
    workers: Vec<Worker>,
    gpus: Vec<Gpu>,
    timers: BinaryHeap<Reverse<(u64, usize)>>,
    /// Recorded mode: (time, GPU) when a paced batch may start.
    pace_timers: BinaryHeap<Reverse<(u64, usize)>>,
    /// (time, worker) when a worker's CPU time after a read ends (SampleRead::think_ns).
    cpu_timers: BinaryHeap<Reverse<(u64, usize)>>,
    in_flight: usize,
    at_barrier: usize,
    pending_barrier: Option<PendingBarrier>,
    /// Largest read request (program.max_request(), which may scan the layout: asked once).
    max_request: u64,
    recorded: bool,
    /// Recorded mode: open file descriptors by file index, closed at the end.
    open_files: std::collections::HashMap<u32, i32>,
    overshoot: BTreeMap<u64, u64>,
    bar: crate::progress::Progress,
    /// The workload's checkpoints, written between steps.
    checkpointer: Option<&'a crate::checkpoint::checkpointing::Checkpointer>,
    checkpoints: Vec<crate::checkpoint::checkpointing::CheckpointIo>,
    /// Trace mode: the bytes its write bursts write.
    write_buf: Vec<u8>,
    /// Why the run stopped early (errors::CheckpointFailed, errors::PeerLost).
    stopped: Option<String>,
}

impl<'a, P: Program, B: Backend> Engine<'a, P, B> {
    /// `gpus`: global indices of this rank's simulated GPUs; `seed` makes compute draws
    /// repeatable; `backend` has a reader slot per worker (Σ `read_threads` of the GPUs).
    pub fn with_backend(
        program: &'a P,
        gpus: &[u64],
        rank: usize,
        cluster: &'a Cluster,
        options: EngineOptions,
        seed: u64,
        backend: B,
    ) -> Result<Self> {
        use rand::SeedableRng;
        let mut workers = Vec::new();
        let mut sims = Vec::new();
        for (local, &global) in gpus.iter().enumerate() {
            let threads = program.read_threads(local).max(1);
            let ids: Vec<usize> = (workers.len()..workers.len() + threads).collect();
            for _ in 0..threads {
                workers.push(Worker {
                    gpu: local,
                    step: None,
                    item: 0,
                    pos: 0,
                    fd: -1,
                    asked: 0,
                    path: PathBuf::new(),
                    thinking: None,
                });
            }
            let prefetch = program.prefetch_size(local).max(1);
            // Recorded mode: a batch is already spread over the workers, so the window is
            // simply prefetch_size batches.
            let window =
                if program.recorded() { prefetch as u64 } else { (threads * prefetch.div_ceil(threads)) as u64 };
            sims.push(Gpu {
                workers: ids,
                window,
                epoch: 0,
                step: 0,
                consumed: 0,
                next_to_start: 0,
                slots: VecDeque::new(),
                state: State::WaitBatch { since: 0 },
                carry_ns: 0,
                pace_pending: false,
                outstanding: 0,
                rng: StdRng::seed_from_u64(seed ^ global.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
                epoch_start: 0,
                first_step_end: None,
                block_start: None,
                cur: EpochStats::default(),
                stats: GpuStats { gpu: global, rank, ..Default::default() },
            });
        }
        let total = program.epochs() * program.steps_per_epoch();
        let show = options.progress && cluster.is_root();
        let bar = crate::progress::Progress::new(show, "replay", crate::progress::Unit::Steps, total);
        Ok(Engine {
            program,
            options,
            cluster,
            backend,
            workers,
            gpus: sims,
            timers: BinaryHeap::new(),
            pace_timers: BinaryHeap::new(),
            cpu_timers: BinaryHeap::new(),
            in_flight: 0,
            at_barrier: 0,
            pending_barrier: None,
            max_request: program.max_request().max(1),
            recorded: program.recorded(),
            open_files: std::collections::HashMap::new(),
            overshoot: BTreeMap::new(),
            bar,
            checkpointer: None,
            checkpoints: Vec::new(),
            write_buf: Vec::new(),
            stopped: None,
        })
    }

    /// Has every simulated GPU stop and write the workload's checkpoints when they are
    /// due (with the step barrier on: all GPUs of the job stop at the same step).
    pub fn with_checkpoints(
        mut self,
        checkpointer: Option<&'a crate::checkpoint::checkpointing::Checkpointer>,
    ) -> Self {
        self.checkpointer = checkpointer;
        self
    }

    fn now(&self) -> u64 {
        self.backend.now()
    }

    pub fn run(mut self) -> Result<RankRun> {
        if self.program.steps_per_epoch() == 0 || self.program.epochs() == 0 {
            bail!("nothing to replay: 0 steps per epoch");
        }
        self.backend.start()?;
        for g in 0..self.gpus.len() {
            self.fill(g)?;
        }
        let mut completions: Vec<(usize, i32)> = Vec::with_capacity(1024);
        loop {
            self.fire_timers()?;
            if let Some(b) = self.pending_barrier.as_mut() {
                let arrived = match b.poll() {
                    Ok(arrived) => arrived,
                    Err(crate::errors::PeerLost(lost)) => {
                        // A rank is silent: the barrier never completes. This rank stops
                        // where it stands, as for a failed checkpoint, and keeps its steps.
                        self.pending_barrier = None;
                        let (epoch, step) = (self.gpus[0].epoch + 1, self.gpus[0].step + 1);
                        self.stopped =
                            Some(format!("{} at the step barrier after step {step} of epoch {epoch}", lost.describe()));
                        let now = self.now();
                        self.stop_all(now, &mut completions)?;
                        break;
                    }
                };
                if arrived {
                    self.pending_barrier = None;
                    let released = self.now();
                    if let Err(e) = self.release_barrier() {
                        let failed = e.downcast::<crate::errors::CheckpointFailed>()?;
                        self.stopped = Some(failed.0);
                        self.stop_all(released, &mut completions)?;
                        break;
                    }
                    continue;
                }
            }
            // Done: every GPU has ended its last step, and no reader is still on a batch
            // (reading, or spending its CPU time after a read).
            if self.gpus.iter().all(|g| g.state == State::Done) && self.in_flight == 0 && self.cpu_timers.is_empty() {
                break;
            }
            // Wait for a completion, the next deadline, or the next barrier poll.
            let mut wait_ns = u64::MAX;
            if let Some(&Reverse((deadline, _))) = self.timers.peek() {
                wait_ns = deadline.saturating_sub(self.now());
            }
            if let Some(&Reverse((at, _))) = self.pace_timers.peek() {
                wait_ns = wait_ns.min(at.saturating_sub(self.now()));
            }
            if let Some(&Reverse((at, _))) = self.cpu_timers.peek() {
                wait_ns = wait_ns.min(at.saturating_sub(self.now()));
            }
            if self.pending_barrier.is_some() {
                wait_ns = wait_ns.min(100_000);
            }
            if wait_ns == u64::MAX && self.in_flight == 0 {
                bail!("internal error: the replay stalled (no reads in flight, no GPU computing)");
            }
            completions.clear();
            self.backend.wait(wait_ns, &mut completions)?;
            for (k, &(w, res)) in completions.iter().enumerate() {
                self.in_flight -= 1;
                self.read_done(w, res)?;
                // A long burst of completions must not delay a GPU whose compute ended.
                if k % 8 == 7 {
                    self.fire_timers()?;
                }
            }
        }
        self.bar.finish();
        for (_, fd) in std::mem::take(&mut self.open_files) {
            self.backend.close(fd);
        }
        let wall_s = self.now() as f64 / 1e9;
        Ok(RankRun {
            gpus: self.gpus.into_iter().map(|g| g.stats).collect(),
            wall_s,
            overshoot_us: self.overshoot.into_iter().collect(),
            checkpoints: self.checkpoints,
            stopped: self.stopped,
            object: self.backend.object_log(),
        })
    }

    /// Stops every GPU where it stood at `now` (the barrier before a checkpoint that
    /// failed): the reads in flight (prefetches) are waited for and dropped, the epoch
    /// under way is closed at `now` with the steps it ended, and AU is over those. The
    /// step at whose end the checkpoint failed is computed but not counted as ended.
    fn stop_all(&mut self, now: u64, completions: &mut Vec<(usize, i32)>) -> Result<()> {
        while self.in_flight > 0 {
            completions.clear();
            self.backend.wait(100_000_000, completions)?;
            self.in_flight -= completions.len();
        }
        for gpu in &mut self.gpus {
            if gpu.state == State::Done {
                continue;
            }
            if gpu.cur.steps > 0 {
                close_epoch(gpu, now);
            }
            gpu.state = State::Done;
            final_au(gpu);
        }
        Ok(())
    }

    /// Ends the compute of every GPU whose deadline has passed.
    fn fire_timers(&mut self) -> Result<()> {
        let now = self.now();
        while let Some(&Reverse((deadline, g))) = self.timers.peek() {
            if deadline > now {
                break;
            }
            self.timers.pop();
            self.compute_done(g, deadline, now)?;
        }
        while let Some(&Reverse((at, g))) = self.pace_timers.peek() {
            if at > now {
                break;
            }
            self.pace_timers.pop();
            self.gpus[g].pace_pending = false;
            self.fill(g)?;
        }
        while let Some(&Reverse((at, w))) = self.cpu_timers.peek() {
            if at > now {
                break;
            }
            self.cpu_timers.pop();
            let read = self.workers[w].thinking.take().expect("a CPU timer for a worker that is not thinking");
            self.after_read(w, read)?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "engine/engine_tests.rs"]
mod tests;
