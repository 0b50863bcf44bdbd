//! Parquet encoding off the drain path. The drain thread decodes ring-buffer records into
//! Arrow batches (that has to happen promptly: fd and path lookups need the processes
//! alive) and hands each batch here. This thread encodes and writes segments at
//! SCHED_IDLE, so on a busy machine the encoding takes only CPU time nobody else wants;
//! the traced workload pays for the decode alone (about a third of the drain's cost).
//!
//! A segment is closed with metadata as of its closing, which only the drain thread can
//! compute (counters, devices, BPF statistics): when the open segment reaches its size or
//! age limit, this thread raises `full`, and the drain thread's next turn (within ~10 ms)
//! sends the metadata to close it with. Batches sent meanwhile go into it too.
//!
//! The backlog is bounded in rows and in age: past either bound the drain thread puts
//! this thread back to normal priority until it has caught up, so memory stays bounded
//! and a SIGKILL loses at most MAX_LAG of events more than before.
//!
//! A backlog's batches are freed once written, but the allocator keeps their pages: the
//! recorder's resident memory would stay at its largest backlog so far. After each segment
//! it closes, this thread hands free pages back (`malloc_trim`), so resident memory follows
//! the backlog down again; the summary gives the largest backlog.
use std::collections::VecDeque;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use arrow_array::RecordBatch;
use trainio_schema::{keys, TraceWriter};

use crate::events::FLUSH_ROWS;

/// Unwritten rows past which the encoder runs at normal priority (~80 bytes each in
/// Arrow: ~320 MiB).
const MAX_BACKLOG_ROWS: u64 = 4 << 20;
/// Age of the oldest unwritten batch past which the encoder runs at normal priority.
const MAX_LAG: Duration = Duration::from_secs(3);

/// Metadata to close a segment with (the segment index is filled in by the encoder).
pub type Metadata = Vec<(String, String)>;

enum Msg {
    Batch(u64, RecordBatch),
    Close(Metadata),
}

/// `Shared::full`: no request; the open segment is full; its closing metadata is on the way.
const FULL_NO: i32 = 0;
const FULL_YES: i32 = 1;
const FULL_ASKED: i32 = 2;

struct Shared {
    /// Thread id of the encoder (for sched_setscheduler from the drain thread).
    tid: AtomicI32,
    /// Sequence number of the last batch sent, and of the last one written.
    sent: AtomicU64,
    written: AtomicU64,
    /// 1 while the encoder runs at normal priority until caught up; 2 until the end.
    boosted: AtomicI32,
    /// FULL_NO, FULL_YES or FULL_ASKED.
    full: AtomicI32,
    /// The encoder thread's CPU time, as of its last message.
    cpu_ns: AtomicU64,
    /// Rows lost to failed writes (a full disk): in abandoned segments, or dropped while
    /// waiting to try again.
    lost_rows: AtomicU64,
    /// The first write error, as text.
    write_error: std::sync::Mutex<Option<String>>,
}

/// After a failed write, batches are dropped (and counted) for this long before a new
/// segment is tried, so that a full disk is not hammered with files that fail at once.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// CPU time of the calling thread, in ns.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What the encoder leaves when it has written everything sent.
pub struct Finished {
    pub writer: TraceWriter,
    pub cpu_ns: u64,
    /// Rows dropped while waiting to retry after a failed write (not in writer.lost_rows()).
    pub dropped_rows: u64,
    pub write_error: Option<String>,
    /// The largest backlog there was.
    pub peak_backlog: Backlog,
}

pub struct Encoder {
    tx: Option<SyncSender<Msg>>,
    thread: Option<JoinHandle<Result<TraceWriter>>>,
    shared: Arc<Shared>,
    /// (sequence, rows, when sent) of batches not yet written.
    pending: VecDeque<(u64, u64, Instant)>,
    pending_rows: u64,
    next_seq: u64,
    /// The largest backlog so far: rows, and the age of its oldest batch.
    peak: Backlog,
}

/// Rows sent and not yet written, and how long the oldest of them has waited.
#[derive(Clone, Copy, Debug, Default)]
pub struct Backlog {
    pub rows: u64,
    pub lag: Duration,
}

fn set_policy(tid: i32, idle: bool) {
    let param = libc::sched_param { sched_priority: 0 };
    let policy = if idle { libc::SCHED_IDLE } else { libc::SCHED_OTHER };
    // SAFETY: plain syscall on one of our own threads; failure only costs speed.
    unsafe { libc::sched_setscheduler(tid, policy, &param) };
}

fn with_segment(meta: &Metadata, segment: u32) -> Metadata {
    let mut m = meta.clone();
    match m.iter_mut().find(|(k, _)| k == keys::SEGMENT) {
        Some(kv) => kv.1 = segment.to_string(),
        None => m.push((keys::SEGMENT.into(), segment.to_string())),
    }
    m
}

fn run(mut writer: TraceWriter, rx: Receiver<Msg>, shared: Arc<Shared>) -> Result<TraceWriter> {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    shared.tid.store(tid, Ordering::SeqCst);
    if shared.boosted.load(Ordering::SeqCst) == 0 {
        set_policy(0, true);
    }
    let mut failed_at: Option<Instant> = None;
    let mut dropped = 0u64;
    let fail = |e: anyhow::Error, at: &mut Option<Instant>| {
        *at = Some(Instant::now());
        let mut first = shared.write_error.lock().unwrap_or_else(|p| p.into_inner());
        first.get_or_insert_with(|| format!("{e:#}"));
    };
    for msg in rx {
        match msg {
            Msg::Batch(seq, batch) => {
                if failed_at.is_some_and(|t| t.elapsed() < RETRY_AFTER) {
                    dropped += batch.num_rows() as u64;
                } else if let Err(e) = writer.write(&batch) {
                    // A full disk: give the segment up (finished ones stay) and go on.
                    writer.abandon_segment();
                    fail(e, &mut failed_at);
                }
                shared.lost_rows.store(writer.lost_rows() + dropped, Ordering::SeqCst);
                if writer.segment_full() {
                    let _ = shared.full.compare_exchange(FULL_NO, FULL_YES, Ordering::SeqCst, Ordering::SeqCst);
                }
                shared.written.store(seq, Ordering::SeqCst);
                // Caught up: give the CPU back to the workload.
                if seq >= shared.sent.load(Ordering::SeqCst)
                    && shared.boosted.compare_exchange(1, 0, Ordering::SeqCst, Ordering::SeqCst).is_ok()
                {
                    set_policy(0, true);
                }
            }
            Msg::Close(meta) => {
                if let Err(e) = writer.close_segment(&with_segment(&meta, writer.segment_index())) {
                    fail(e, &mut failed_at);
                }
                shared.lost_rows.store(writer.lost_rows() + dropped, Ordering::SeqCst);
                shared.full.store(FULL_NO, Ordering::SeqCst);
                // SAFETY: malloc_trim only returns free memory to the kernel; a few ms
                // once a segment (seconds of events), off the drain path.
                unsafe { libc::malloc_trim(0) };
            }
        }
        shared.cpu_ns.store(thread_cpu_ns(), Ordering::SeqCst);
    }
    Ok(writer)
}

impl Encoder {
    pub fn start(writer: TraceWriter) -> Result<Self> {
        // Room for 4 × MAX_BACKLOG_ROWS in the drain's batches: the row and age bounds act
        // first; a full queue blocks the drain (the kernel ring buffer then absorbs, and
        // counts what it cannot).
        let (tx, rx) = sync_channel(4 * (MAX_BACKLOG_ROWS as usize / FLUSH_ROWS));
        let shared = Arc::new(Shared {
            tid: AtomicI32::new(0),
            sent: AtomicU64::new(0),
            written: AtomicU64::new(0),
            boosted: AtomicI32::new(0),
            full: AtomicI32::new(FULL_NO),
            cpu_ns: AtomicU64::new(0),
            lost_rows: AtomicU64::new(0),
            write_error: std::sync::Mutex::new(None),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("trainio-encode".into())
            .spawn(move || run(writer, rx, s))
            .map_err(|e| anyhow!("starting the encoder thread: {e}"))?;
        Ok(Encoder {
            tx: Some(tx),
            thread: Some(thread),
            shared,
            pending: VecDeque::new(),
            pending_rows: 0,
            next_seq: 1,
            peak: Backlog::default(),
        })
    }

    /// Queues a batch; returns an error only if the encoder failed (its error). Empty
    /// batches go too (the drain sends one a second): they let the encoder see that a
    /// segment reached its age while no rows came, so a quiet spell does not leave rows in
    /// a `.partial` that a SIGKILL would lose.
    pub fn send(&mut self, batch: RecordBatch) -> Result<()> {
        let seq = self.next_seq;
        self.next_seq += 1;
        let rows = batch.num_rows() as u64;
        self.shared.sent.store(seq, Ordering::SeqCst);
        self.put(Msg::Batch(seq, batch))?;
        self.pending.push_back((seq, rows, Instant::now()));
        self.pending_rows += rows;
        self.regulate();
        Ok(())
    }

    /// True once when the open segment is full: the caller then sends its metadata with
    /// [`close_segment`](Self::close_segment).
    pub fn segment_full(&self) -> bool {
        self.shared.full.compare_exchange(FULL_YES, FULL_ASKED, Ordering::SeqCst, Ordering::SeqCst).is_ok()
    }

    /// Closes the open segment, after the batches already sent, with this metadata.
    pub fn close_segment(&mut self, meta: Metadata) -> Result<()> {
        self.put(Msg::Close(meta))
    }

    fn put(&mut self, msg: Msg) -> Result<()> {
        if self.tx.as_ref().expect("encoder running").send(msg).is_err() {
            return Err(self.join().err().unwrap_or_else(|| anyhow!("the encoder thread stopped")));
        }
        Ok(())
    }

    /// Forgets written batches, and boosts the encoder when the backlog is too large or
    /// too old. Called after every send and on every drain-loop turn.
    pub fn regulate(&mut self) {
        let written = self.shared.written.load(Ordering::SeqCst);
        while self.pending.front().is_some_and(|&(seq, _, _)| seq <= written) {
            let (_, rows, _) = self.pending.pop_front().expect("front exists");
            self.pending_rows -= rows;
        }
        let lag = self.pending.front().map_or(Duration::ZERO, |&(_, _, t)| t.elapsed());
        self.peak.rows = self.peak.rows.max(self.pending_rows);
        self.peak.lag = self.peak.lag.max(lag);
        let behind = self.pending_rows > MAX_BACKLOG_ROWS || lag > MAX_LAG;
        let tid = self.shared.tid.load(Ordering::SeqCst);
        if behind && tid != 0 && self.shared.boosted.compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst).is_ok()
        {
            set_policy(tid, false);
        }
    }

    /// Rows lost to failed segment writes so far, and the first failure.
    pub fn write_losses(&self) -> (u64, Option<String>) {
        let e = self.shared.write_error.lock().unwrap_or_else(|p| p.into_inner()).clone();
        (self.shared.lost_rows.load(Ordering::SeqCst), e)
    }

    /// The encoder thread's CPU time so far (as of the last batch it wrote).
    pub fn cpu_ns(&self) -> u64 {
        self.shared.cpu_ns.load(Ordering::SeqCst)
    }

    /// Waits until everything sent is written (at normal priority), and returns the
    /// writer, so that the caller can close the last segment, and the thread's CPU time.
    /// Also returns the rows dropped (not written to any segment, beyond the writer's own
    /// lost_rows) and the first write error.
    pub fn finish(mut self) -> Result<Finished> {
        self.shared.boosted.store(2, Ordering::SeqCst);
        let tid = self.shared.tid.load(Ordering::SeqCst);
        if tid != 0 {
            set_policy(tid, false);
        }
        let writer = self.join()?;
        let (lost, write_error) = self.write_losses();
        let peak_backlog = self.peak;
        Ok(Finished {
            dropped_rows: lost - writer.lost_rows(),
            writer,
            cpu_ns: self.cpu_ns(),
            write_error,
            peak_backlog,
        })
    }

    fn join(&mut self) -> Result<TraceWriter> {
        drop(self.tx.take());
        match self.thread.take() {
            Some(t) => t.join().map_err(|_| anyhow!("the encoder thread panicked"))?,
            None => Err(anyhow!("the encoder thread already stopped")),
        }
    }
}
