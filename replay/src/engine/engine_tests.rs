//! Unit tests of the GPU/loader state machine, run over a fake backend: a virtual clock
//! that jumps to the next completion or deadline, reads that complete after a latency the
//! test chooses, and files of a size the test chooses (a read past the end is short). No
//! file is opened and no time is slept.

use super::*;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

const MS: u64 = 1_000_000;

/// What the fake backend saw, each at its virtual time.
#[derive(Debug, Clone, PartialEq)]
enum Io {
    Open { t: u64, file: u32, fd: i32 },
    Close { t: u64, file: u32 },
    Submit { t: u64, slot: usize, file: u32, offset: u64, len: u32 },
    Done { t: u64, slot: usize, file: u32, res: i32 },
}

struct Submitted {
    slot: usize,
    file: u32,
    seq: u64,
}

struct FakeIo {
    clock: Rc<Cell<u64>>,
    buf_len: u64,
    latency: Box<dyn Fn(&Submitted) -> u64>,
    size: Box<dyn Fn(u32) -> u64>,
    fds: HashMap<i32, u32>,
    next_fd: i32,
    seq: u64,
    /// (due, seq, slot, file, result)
    pending: Vec<(u64, u64, usize, u32, i32)>,
    log: Rc<RefCell<Vec<Io>>>,
}

fn file_of(path: &Path) -> u32 {
    path.file_name().unwrap().to_str().unwrap().parse().unwrap()
}

impl Backend for FakeIo {
    fn start(&mut self) -> Result<()> {
        self.clock.set(0);
        Ok(())
    }
    fn now(&self) -> u64 {
        self.clock.get()
    }
    fn buf_len(&self) -> u64 {
        self.buf_len
    }
    fn open(&mut self, path: &Path) -> Result<i32> {
        let (fd, file) = (self.next_fd, file_of(path));
        self.next_fd += 1;
        self.fds.insert(fd, file);
        self.log.borrow_mut().push(Io::Open { t: self.now(), file, fd });
        Ok(fd)
    }
    fn close(&mut self, fd: i32) {
        let file = self.fds.remove(&fd).expect("close of an fd that is not open");
        self.log.borrow_mut().push(Io::Close { t: self.now(), file });
    }
    fn submit(&mut self, slot: usize, fd: i32, offset: u64, len: u32) -> Result<()> {
        let file = *self.fds.get(&fd).expect("read on an fd that is not open");
        assert!(self.pending.iter().all(|p| p.2 != slot), "slot {slot} has two reads in flight");
        let t = self.now();
        self.log.borrow_mut().push(Io::Submit { t, slot, file, offset, len });
        self.seq += 1;
        let due = t + (self.latency)(&Submitted { slot, file, seq: self.seq });
        let res = (len as u64).min((self.size)(file).saturating_sub(offset)) as i32;
        self.pending.push((due, self.seq, slot, file, res));
        Ok(())
    }
    fn wait(&mut self, wait_ns: u64, out: &mut Vec<(usize, i32)>) -> Result<()> {
        let next = self.pending.iter().map(|p| p.0).min().unwrap_or(u64::MAX);
        let now = self.now();
        let until = if wait_ns == 0 { now } else { next.min(now.saturating_add(wait_ns)) };
        if until == u64::MAX {
            bail!("fake backend: waiting forever");
        }
        self.clock.set(now.max(until));
        let t = self.now();
        self.pending.sort();
        let (done, rest): (Vec<_>, Vec<_>) = self.pending.drain(..).partition(|p| p.0 <= t);
        self.pending = rest;
        for (_, _, slot, file, res) in done {
            self.log.borrow_mut().push(Io::Done { t, slot, file, res });
            out.push((slot, res));
        }
        Ok(())
    }
}

/// What the state machine asked of the program, each at its virtual time.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Ev {
    /// A batch was taken into the prefetch window (`Program::batch`).
    Batch { t: u64, gpu: usize, epoch: u64, step: u64 },
    /// A step's compute began (`Program::compute_seconds`).
    Compute { t: u64, gpu: usize, epoch: u64, step: u64 },
}

struct FakeProgram {
    clock: Rc<Cell<u64>>,
    epochs: u64,
    steps: u64,
    threads: usize,
    prefetch: usize,
    compute_ns: u64,
    max_request: u64,
    recorded: bool,
    batch: Box<dyn Fn(usize, u64, u64) -> Batch>,
    not_before: Option<Box<dyn Fn(u64) -> u64>>,
    /// Batches read past the last step of the last epoch and never taken.
    untaken: u64,
    log: RefCell<Vec<Ev>>,
    root: PathBuf,
}

/// A file index that names the batch and read it belongs to.
fn file_id(gpu: usize, epoch: u64, step: u64, i: usize) -> u32 {
    (((gpu as u64 * 10 + epoch) * 1000 + step) * 100 + i as u64) as u32
}
fn batch_of(file: u32) -> (usize, u64, u64) {
    let f = file as u64 / 100;
    ((f / 1000 / 10) as usize, f / 1000 % 10, f % 1000)
}

impl FakeProgram {
    fn new(clock: &Rc<Cell<u64>>) -> FakeProgram {
        FakeProgram {
            clock: clock.clone(),
            epochs: 1,
            steps: 8,
            threads: 2,
            prefetch: 2,
            compute_ns: 5 * MS,
            max_request: 1 << 20,
            recorded: false,
            // Three samples of 64 KiB, each in its own file.
            batch: Box::new(|g, e, s| Batch {
                samples: 3,
                reads: (0..3).map(|i| SampleRead::new(file_id(g, e, s, i), 0, 65536)).collect(),
                streams: Vec::new(),
            }),
            not_before: None,
            untaken: 0,
            log: RefCell::new(Vec::new()),
            root: PathBuf::from("/fake"),
        }
    }
    fn events(&self) -> Vec<Ev> {
        self.log.borrow().clone()
    }
}

impl Program for FakeProgram {
    fn epochs(&self) -> u64 {
        self.epochs
    }
    fn steps_per_epoch(&self) -> u64 {
        self.steps
    }
    fn batch(&self, gpu: usize, epoch: u64, step: u64) -> Batch {
        self.log.borrow_mut().push(Ev::Batch { t: self.clock.get(), gpu, epoch, step });
        (self.batch)(gpu, epoch, step)
    }
    fn compute_seconds(&self, gpu: usize, epoch: u64, step: u64, _rng: &mut StdRng) -> f64 {
        self.log.borrow_mut().push(Ev::Compute { t: self.clock.get(), gpu, epoch, step });
        self.compute_ns as f64 / 1e9
    }
    fn path(&self, file: u32) -> PathBuf {
        self.root.join(file.to_string())
    }
    fn root(&self) -> &Path {
        &self.root
    }
    fn read_threads(&self, _gpu: usize) -> usize {
        self.threads
    }
    fn prefetch_size(&self, _gpu: usize) -> usize {
        self.prefetch
    }
    fn max_request(&self) -> u64 {
        self.max_request
    }
    fn recorded(&self) -> bool {
        self.recorded
    }
    fn not_before_ns(&self, _gpu: usize, _epoch: u64, step: u64) -> Option<u64> {
        self.not_before.as_ref().map(|f| f(step))
    }
    fn untaken_batches(&self, _gpu: usize, epoch: u64) -> u64 {
        if epoch + 1 == self.epochs {
            self.untaken
        } else {
            0
        }
    }
}

struct Run {
    stats: RankRun,
    io: Vec<Io>,
    ev: Vec<Ev>,
}

fn run_with(
    program: &FakeProgram,
    gpus: usize,
    barrier: bool,
    latency: impl Fn(&Submitted) -> u64 + 'static,
    size: impl Fn(u32) -> u64 + 'static,
) -> Run {
    let cluster = Cluster::alone();
    let log = Rc::new(RefCell::new(Vec::new()));
    let backend = FakeIo {
        clock: program.clock.clone(),
        buf_len: buffer_len(program) as u64,
        latency: Box::new(latency),
        size: Box::new(size),
        fds: HashMap::new(),
        next_fd: 100,
        seq: 0,
        pending: Vec::new(),
        log: log.clone(),
    };
    let options = EngineOptions { odirect: false, barrier, progress: false, realtime: false, psync: false };
    let ids: Vec<u64> = (0..gpus as u64).collect();
    let engine = Engine::with_backend(program, &ids, 0, &cluster, options, 1, backend).unwrap();
    let stats = engine.run().unwrap();
    let io = log.borrow().clone();
    Run { stats, io, ev: program.events() }
}

fn big(_: u32) -> u64 {
    u64::MAX
}

fn compute_starts(ev: &[Ev], gpu: usize) -> Vec<(u64, u64)> {
    ev.iter()
        .filter_map(|e| match *e {
            Ev::Compute { t, gpu: g, step, .. } if g == gpu => Some((step, t)),
            _ => None,
        })
        .collect()
}

#[test]
fn prefetch_window_is_never_exceeded_and_is_filled() {
    // 2 workers, prefetch 3: window 2 × ceil(3/2) = 4 batches started but not consumed.
    // Reads are fast and compute slow, so the loader runs ahead as far as it may.
    let clock = Rc::new(Cell::new(0));
    let mut p = FakeProgram::new(&clock);
    (p.threads, p.prefetch, p.steps, p.compute_ns) = (2, 3, 12, 20 * MS);
    let r = run_with(&p, 1, false, |_| MS, big);
    let mut started = 0u64;
    let mut consumed = 0u64;
    let mut most = 0u64;
    for e in &r.ev {
        match e {
            Ev::Batch { step, .. } => {
                assert_eq!(*step, started, "batches start in step order");
                started += 1;
            }
            Ev::Compute { .. } => consumed += 1,
        }
        most = most.max(started - consumed);
    }
    assert_eq!((started, consumed), (12, 12));
    assert_eq!(most, 4, "the window of 4 batches is reached and never passed");
    // One read per worker in flight: the queue depth is the worker count.
    assert_eq!(r.stats.gpus[0].max_outstanding_reads, 2);
}

#[test]
fn a_step_starts_only_when_all_its_reads_are_complete() {
    // Latencies vary by read so a batch's reads complete out of order and across batches.
    let clock = Rc::new(Cell::new(0));
    let mut p = FakeProgram::new(&clock);
    (p.threads, p.prefetch, p.steps, p.compute_ns) = (3, 3, 10, 2 * MS);
    let r = run_with(&p, 1, false, |s| (1 + (s.seq * 7 + s.file as u64) % 9) * MS, big);
    let mut at_limit = 0;
    for (step, t) in compute_starts(&r.ev, 0) {
        let done: Vec<u64> =
            r.io.iter()
                .filter_map(|e| match *e {
                    Io::Done { t, file, .. } if batch_of(file) == (0, 0, step) => Some(t),
                    _ => None,
                })
                .collect();
        assert_eq!(done.len(), 3, "step {step}: every read of its batch completed once");
        let last = *done.iter().max().unwrap();
        assert!(last <= t, "step {step} started at {t} before its last read completed at {last}");
        at_limit += (last == t) as u32;
    }
    // The loader is the bottleneck: most steps start the moment their last read completes.
    assert!(at_limit >= 5, "only {at_limit} steps started on their last completion");
}

#[test]
fn a_paced_batch_does_not_start_before_its_time() {
    // Recorded mode: batch s may start 30 ms × s after the epoch began; reads take 1 ms.
    let clock = Rc::new(Cell::new(0));
    let mut p = FakeProgram::new(&clock);
    (p.recorded, p.threads, p.prefetch, p.steps, p.compute_ns) = (true, 2, 4, 6, MS);
    p.not_before = Some(Box::new(|s| 30 * MS * s));
    let r = run_with(&p, 1, false, |_| MS, big);
    let starts: Vec<(u64, u64)> =
        r.ev.iter()
            .filter_map(|e| match *e {
                Ev::Batch { t, step, .. } => Some((step, t)),
                _ => None,
            })
            .collect();
    assert_eq!(starts.len(), 6);
    for &(step, t) in &starts {
        // The timer fires at the paced time exactly on a virtual clock.
        assert_eq!(t, 30 * MS * step, "batch {step} started at {t}");
    }
    for e in &r.io {
        if let Io::Submit { t, file, .. } = *e {
            let step = batch_of(file).2;
            assert!(t >= 30 * MS * step, "a read of batch {step} was issued at {t}");
        }
    }
}

#[test]
fn compute_is_slept_once_per_step() {
    let clock = Rc::new(Cell::new(0));
    let mut p = FakeProgram::new(&clock);
    (p.epochs, p.steps, p.compute_ns) = (2, 5, 7 * MS);
    let r = run_with(&p, 2, false, |_| MS, big);
    for g in 0..2 {
        let starts = compute_starts(&r.ev, g);
        assert_eq!(starts.len(), 10, "gpu {g}: one compute per step of 2 epochs × 5");
        let gs = &r.stats.gpus[g];
        assert_eq!(gs.steps, 10);
        // The virtual clock wakes at the deadline: compute time is exactly steps × 7 ms.
        assert!((gs.compute_s - 10.0 * 0.007).abs() < 1e-9, "gpu {g}: compute {}", gs.compute_s);
        // Consecutive steps are at least one compute apart.
        for w in starts.windows(2) {
            assert!(w[1].1 >= w[0].1 + 7 * MS, "gpu {g}: {:?}", w);
        }
        assert_eq!(gs.epochs.len(), 2);
        assert_eq!(gs.samples, 30);
    }
    assert_eq!(r.stats.overshoot_us, vec![(0, 20)]);
}

#[test]
fn the_barrier_holds_every_gpu_until_all_reached_the_step() {
    // GPU 1's reads take 10× longer: it is the slow one.
    let clock = Rc::new(Cell::new(0));
    let mut p = FakeProgram::new(&clock);
    (p.threads, p.prefetch, p.steps, p.compute_ns) = (1, 1, 6, 2 * MS);
    let slow = |s: &Submitted| if batch_of(s.file).0 == 1 { 10 * MS } else { MS };
    let check = |r: &Run| -> bool {
        // Does every GPU's step k+1 start after every GPU's step k compute ended?
        let (a, b) = (compute_starts(&r.ev, 0), compute_starts(&r.ev, 1));
        (1..6).all(|k| {
            let ended = a[k - 1].1.max(b[k - 1].1) + 2 * MS;
            a[k].1 >= ended && b[k].1 >= ended
        })
    };
    let with = run_with(&p, 2, true, slow, big);
    assert!(check(&with), "a GPU passed the barrier early: {:?}", with.ev);
    assert!(with.stats.gpus[0].barrier_wait_s > 0.0);
    assert!(with.stats.gpus[1].barrier_wait_s < with.stats.gpus[0].barrier_wait_s);
    p.log.borrow_mut().clear();
    let without = run_with(&p, 2, false, slow, big);
    assert!(!check(&without), "without the barrier the fast GPU runs ahead");
    assert_eq!(without.stats.gpus[0].barrier_wait_s, 0.0);
}

#[test]
fn a_short_read_ends_the_request_and_a_full_one_goes_on() {
    // Each sample asks for 3 MiB in requests of at most 1 MiB; file 0 of each batch holds
    // only 1.5 MiB, the others the full 3 MiB.
    let clock = Rc::new(Cell::new(0));
    let mut p = FakeProgram::new(&clock);
    (p.steps, p.threads) = (2, 1);
    p.batch = Box::new(|g, e, s| Batch {
        samples: 2,
        reads: (0..2).map(|i| SampleRead::new(file_id(g, e, s, i), 0, 3 << 20)).collect(),
        streams: Vec::new(),
    });
    let r = run_with(&p, 1, false, |_| MS, |f| if f % 100 == 0 { 3 << 19 } else { 3 << 20 });
    let reads = |i: u32| -> Vec<(u64, u32)> {
        r.io.iter()
            .filter_map(|e| match *e {
                Io::Submit { file, offset, len, .. } if file % 100 == i && batch_of(file).2 == 0 => Some((offset, len)),
                _ => None,
            })
            .collect()
    };
    // numpy's rule: the read that came back short (0.5 MiB of 1 MiB) is the file's end.
    assert_eq!(reads(0), vec![(0, 1 << 20), (1 << 20, 1 << 20)]);
    assert_eq!(reads(1), vec![(0, 1 << 20), (1 << 20, 1 << 20), (2 << 20, 1 << 20)]);
    assert_eq!(r.stats.gpus[0].bytes, 2 * ((3 << 19) + (3 << 20)));
    assert_eq!(r.stats.gpus[0].steps, 2);
}

#[test]
fn a_streamed_file_closes_after_its_last_read() {
    // Recorded mode: reader 0 streams file A in three reads (the last one closes it),
    // reader 1 file B in two; the files stay open between reads, across batches.
    let clock = Rc::new(Cell::new(0));
    let mut p = FakeProgram::new(&clock);
    (p.recorded, p.threads, p.prefetch, p.steps, p.compute_ns) = (true, 2, 2, 3, MS);
    let (a, b) = (7u32, 8u32);
    p.batch = Box::new(move |_, _, s| {
        let read = |file, k: u64, close| SampleRead { close, ..SampleRead::new(file, k * 4096, 4096) };
        match s {
            0 => Batch { samples: 1, reads: vec![read(a, 0, false), read(b, 0, false)], streams: vec![0, 1] },
            1 => Batch { samples: 1, reads: vec![read(a, 1, false), read(b, 1, true)], streams: vec![0, 1] },
            _ => Batch { samples: 1, reads: vec![read(a, 2, true)], streams: vec![0] },
        }
    });
    let r = run_with(&p, 1, false, |s| if s.slot == 0 { 3 * MS } else { MS }, big);
    for f in [a, b] {
        let opens = r.io.iter().filter(|e| matches!(e, Io::Open { file, .. } if *file == f)).count();
        let closes: Vec<u64> =
            r.io.iter()
                .filter_map(|e| match *e {
                    Io::Close { t, file } if file == f => Some(t),
                    _ => None,
                })
                .collect();
        let done: Vec<u64> =
            r.io.iter()
                .filter_map(|e| match *e {
                    Io::Done { t, file, .. } if file == f => Some(t),
                    _ => None,
                })
                .collect();
        assert_eq!(opens, 1, "file {f} is opened once for all its reads");
        assert_eq!(closes.len(), 1, "file {f} is closed once");
        assert_eq!(closes[0], *done.last().unwrap(), "file {f} closes when its last read completes");
        // Every read of the file was issued by the same reader slot.
        let slots: std::collections::BTreeSet<usize> =
            r.io.iter()
                .filter_map(|e| match *e {
                    Io::Submit { slot, file, .. } if file == f => Some(slot),
                    _ => None,
                })
                .collect();
        assert_eq!(slots.len(), 1);
    }
    // B (reader 1, fast) closes before A's last read is even issued.
    let close_b = r.io.iter().position(|e| matches!(e, Io::Close { file, .. } if *file == b)).unwrap();
    let last_a = r.io.iter().rposition(|e| matches!(e, Io::Submit { file, .. } if *file == a)).unwrap();
    assert!(close_b < last_a);
}

#[test]
fn a_workload_sample_is_opened_and_closed_around_its_reads() {
    let clock = Rc::new(Cell::new(0));
    let mut p = FakeProgram::new(&clock);
    p.steps = 2;
    let r = run_with(&p, 1, false, |_| MS, big);
    let mut open = std::collections::BTreeSet::new();
    for e in &r.io {
        match *e {
            Io::Open { file, .. } => assert!(open.insert(file), "file {file} opened twice at once"),
            Io::Submit { file, .. } => assert!(open.contains(&file)),
            Io::Close { file, .. } => assert!(open.remove(&file)),
            Io::Done { .. } => {}
        }
    }
    assert!(open.is_empty(), "every sample's file is closed: {open:?}");
    assert_eq!(r.io.iter().filter(|e| matches!(e, Io::Open { .. })).count(), 6);
}

#[test]
fn a_readers_cpu_time_after_a_read_delays_its_next_read_and_its_batch() {
    // One reader, batches of two 4 KiB reads of 1 ms each, 5 ms of CPU after each read
    // (decoding what it read), 1 ms of compute, a window of one batch.
    let clock = Rc::new(Cell::new(0));
    let mut p = FakeProgram::new(&clock);
    (p.recorded, p.threads, p.prefetch, p.steps, p.compute_ns) = (true, 1, 1, 2, MS);
    p.batch = Box::new(move |_, _, s| {
        let read = |k: u64| SampleRead { think_ns: 5 * MS, ..SampleRead::new(7, (2 * s + k) * 4096, 4096) };
        Batch { samples: 2, reads: vec![read(0), read(1)], streams: vec![0, 0] }
    });
    let r = run_with(&p, 1, false, |_| MS, big);
    let submits: Vec<u64> =
        r.io.iter()
            .filter_map(|e| match *e {
                Io::Submit { t, .. } => Some(t),
                _ => None,
            })
            .collect();
    // Batch 0: read at 0, done at 1, CPU to 6, read at 6, done at 7, CPU to 12, when the
    // GPU takes it and batch 1 may start: its reads at 12 and 18.
    assert_eq!(submits, vec![0, 6 * MS, 12 * MS, 18 * MS]);
    assert_eq!(r.stats.gpus[0].steps, 2);
}

/// Submitted reads per batch (step) of epoch 0.
fn submits_per_step(io: &[Io]) -> BTreeMap<u64, usize> {
    let mut m = BTreeMap::new();
    for e in io {
        if let Io::Submit { file, .. } = *e {
            let (_, epoch, step) = batch_of(file);
            assert_eq!(epoch, 0, "a read of epoch {epoch}, after the last");
            *m.entry(step).or_insert(0) += 1;
        }
    }
    m
}

/// A recorded loader whose job stopped with 2 batches read ahead: they are read beside
/// the last steps, within the window, and never computed; the epoch (and AU) ends when
/// the last taken step's compute does, and their bytes count as read.
#[test]
fn untaken_batches_are_read_beside_the_last_steps_and_not_computed() {
    let clock = Rc::new(Cell::new(0));
    let mut p = FakeProgram::new(&clock);
    (p.recorded, p.threads, p.prefetch, p.steps, p.compute_ns, p.untaken) = (true, 2, 4, 6, 10 * MS, 2);
    // Batch s: 2 reads of 4 KiB by worker s mod 2.
    p.batch = Box::new(|g, e, s| Batch {
        samples: 2,
        reads: (0..2).map(|i| SampleRead::new(file_id(g, e, s, i), 0, 4096)).collect(),
        streams: vec![(s % 2) as u32; 2],
    });
    let r = run_with(&p, 1, false, |_| MS, big);
    let batches: Vec<u64> =
        r.ev.iter()
            .filter_map(|e| match *e {
                Ev::Batch { step, .. } => Some(step),
                _ => None,
            })
            .collect();
    assert_eq!(batches, (0..8).collect::<Vec<_>>(), "the 6 steps' batches, then the 2 untaken");
    let computes = compute_starts(&r.ev, 0);
    assert_eq!(computes.iter().map(|c| c.0).collect::<Vec<_>>(), (0..6).collect::<Vec<_>>());
    assert_eq!(submits_per_step(&r.io), (0..8).map(|s| (s, 2)).collect());
    // The untaken batches were read while the GPU computed its last steps (within 4 of
    // the one it took), not after.
    let last_compute_end = computes[5].1 + 10 * MS;
    assert!(r.io.iter().all(|e| !matches!(*e, Io::Done { t, .. } if t > last_compute_end)));
    let g = &r.stats.gpus[0];
    assert_eq!((g.steps, g.samples, g.bytes), (6, 12, 8 * 2 * 4096));
    assert_eq!(g.epochs[0].duration_s, last_compute_end as f64 / 1e9);
}

/// Reads slower than the compute: when the GPU's last step ends, a worker finishes the
/// untaken batch it has started (the job's workers finish the batch in hand when their
/// loader shuts down), and one it has not started is not read, nor is any batch of an
/// epoch after the last; the run ends when those reads have.
#[test]
fn at_the_end_a_worker_finishes_the_untaken_batch_it_started_and_no_other() {
    let clock = Rc::new(Cell::new(0));
    let mut p = FakeProgram::new(&clock);
    (p.recorded, p.threads, p.prefetch, p.steps, p.compute_ns, p.untaken) = (true, 2, 2, 2, MS, 2);
    // Batches 0 and 1 by workers 0 and 1; both untaken batches (2, 3) by worker 0.
    p.batch = Box::new(|g, e, s| Batch {
        samples: 1,
        reads: (0..3).map(|i| SampleRead::new(file_id(g, e, s, i), 0, 4096)).collect(),
        streams: vec![if s < 2 { s as u32 } else { 0 }; 3],
    });
    let r = run_with(&p, 1, false, |_| 10 * MS, big);
    // Batches 0 and 1 are read by 30 ms; batch 2 starts when step 0 is taken (30 ms),
    // batch 3 enters the window at 31 ms, behind batch 2 on worker 0; the last step
    // ends at 32 ms, batch 2's reads at 60 ms.
    let computes = compute_starts(&r.ev, 0);
    assert_eq!(computes, vec![(0, 30 * MS), (1, 31 * MS)]);
    assert_eq!(submits_per_step(&r.io), BTreeMap::from([(0, 3), (1, 3), (2, 3)]));
    let g = &r.stats.gpus[0];
    assert_eq!((g.steps, g.bytes), (2, 9 * 4096));
    assert_eq!(g.epochs[0].duration_s, 0.032);
    assert_eq!(r.stats.wall_s, 0.060);
}
