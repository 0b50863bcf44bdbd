//! The job model: what a training job is, inferred from its trace. One implementation,
//! used by `trainio replay --trace` (Rust) and `trainio analyze` (through the analyzer's
//! native extension), so both say the same thing about a trace.
//!
//! From the trace's `file`, `proc` and `ipc` layers (traces/SCHEMA.md) it finds:
//!
//! 1. **Which processes are one GPU.** A rank and its DataLoader worker processes are one
//!    simulated GPU. A process that reads data is a *worker* of its parent when it names
//!    itself `pt_data_worker` (PyTorch's workers do) or hands what it read to its parent
//!    through a pipe or socket (a write on an inode the parent reads or polls). Every
//!    other process that reads data is a rank. Groups that read under 1 % of the largest
//!    group's bytes (a launcher, an interpreter loading modules) are left out.
//! 2. **Steps.** With workers, a step is one batch: a worker's data reads between two of
//!    its writes to the parent's pipe (the handoff of a batch is such a write). Without
//!    workers (the rank reads its samples itself), a step is a burst of reads: bursts are
//!    separated by gaps longer than every gap inside a batch (the largest jump in the
//!    sorted gaps, or `--burst-gap-ms`).
//! 3. **Compute time per step.** The time the rank spends outside getting its data: with
//!    workers, from the end of one batch's read off the pipe to the start of the next
//!    get (its poll on the pipe, or the read itself), so waiting for a late batch is not
//!    counted; without workers, the gap between bursts. The GPU's compute time is the
//!    10th percentile of these intervals: an interval can only be longer than the compute
//!    (a collective waiting for a slower rank, the end of an epoch), rarely shorter.
//! 4. **Throughput one GPU needs**: bytes per step / compute time per step.
//! 5. **Whether the file layer saw the data**: the block-layer bytes each traced process
//!    caused against its file-layer reads. Reads through mmap (its page faults, schema
//!    1.6: mapped.rs) count as reads; io_uring reads are file-layer rows only when
//!    recorded with `--io-uring`, and traces before 1.6 have no mapped reads. A trace
//!    whose file layer lacks most of the data is marked incomplete, and replay refuses it
//!    unless told otherwise.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use trainio_schema::{trace_set_members, OwnedRow};

mod describe;
mod input;
mod job;
pub mod mapped;
pub mod shards;
mod stats;
mod trace_set;
pub mod whatif;
pub mod writes;

pub use describe::{describe, to_json};
pub use input::{load_input, Input};
pub use job::{Coverage, GpuModel, JobModel, LeftOut, Member, Read, Step};
pub use trace_set::combine;

use input::{is_data_read, rows_of, ByPid, NS_PER_S};
use stats::{busy_ns, quantile};

/// The name PyTorch's DataLoader workers give themselves.
pub const WORKER_COMM: &str = "pt_data_worker";
/// Writes of one worker this close together are one message (header and payload).
const MESSAGE_MERGE_NS: i64 = 2_000_000;
/// A rank's reads of its data pipe this close together belong to one get.
const GET_MERGE_NS: i64 = 1_000_000;
/// Gaps shorter than this are inside a batch whatever the distribution says.
const MIN_STEP_GAP_NS: i64 = 500_000;
/// The largest gap jump must be at least this ratio to separate batches from their insides.
const MIN_GAP_RATIO: f64 = 3.0;
/// Default step gap when the gaps show no clear jump.
pub const DEFAULT_BURST_GAP_MS: f64 = 10.0;
/// Quantile of a GPU's step intervals taken as its compute time.
const COMPUTE_QUANTILE: f64 = 0.10;
/// A trace is incomplete when more than this share of its traced processes' block reads
/// has no file-layer read behind it (and that is at least INCOMPLETE_MIN_BYTES).
const INCOMPLETE_SHARE: f64 = 0.5;
const INCOMPLETE_MIN_BYTES: u64 = 16 << 20;
/// Groups reading less than this share of the largest group's bytes are not GPUs.
const MINOR_GROUP_SHARE: f64 = 0.01;

/// How processes are grouped into GPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Grouping {
    /// Ranks and their workers, found from the trace (module comment).
    #[default]
    Auto,
    /// Every process that reads is its own GPU.
    Process,
    /// These pids are the ranks; every other reader belongs to its nearest listed ancestor.
    Ranks(Vec<u32>),
}

impl Grouping {
    /// `auto`, `process`, or a comma-separated list of rank pids.
    pub fn parse(s: &str) -> Result<Grouping, String> {
        match s {
            "auto" => Ok(Grouping::Auto),
            "process" => Ok(Grouping::Process),
            _ => s
                .split(',')
                .map(|p| {
                    p.trim().parse::<u32>().map_err(|_| {
                        format!("--gpu-grouping: `{s}` is not auto, process, or a list of rank pids (e.g. 4242,4243)")
                    })
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Grouping::Ranks),
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Options {
    pub grouping: Grouping,
    /// Step gap for bursts; None: found from the gaps.
    pub burst_gap_ms: Option<f64>,
    /// The data device (`MAJ:MIN`); None: the one most file-layer bytes were read from.
    pub dev: Option<String>,
    /// What-if: accelerators each recorded GPU (process) drives (whatif.rs); None: 1.
    pub gpus_per_process: Option<u32>,
    /// What-if: factor on the compute per step (whatif.rs); None: as recorded.
    pub compute_scale: Option<f64>,
}

/// The job model of a trace, or of a trace set (the per-host traces of one job, see
/// [`combine`]).
pub fn infer_trace(trace: &Path, opts: &Options) -> Result<JobModel, String> {
    infer_trace_as_recorded(trace, opts).and_then(|m| whatif::apply(m, opts))
}

fn infer_trace_as_recorded(trace: &Path, opts: &Options) -> Result<JobModel, String> {
    if let Some(members) = trace_set_members(trace).map_err(|e| e.to_string())? {
        let mut parts = Vec::with_capacity(members.len());
        for m in members {
            let input = load_input(&m.path)?;
            let model = infer(&input, opts).map_err(|e| format!("{}: {e}", m.path.display()))?;
            parts.push((m.host, m.shift_ns, model));
        }
        return Ok(combine(parts));
    }
    let input = load_input(trace)?;
    infer(&input, opts).map_err(|e| format!("{}: {e}", trace.display()))
}

#[derive(Default)]
struct Proc {
    ppid: Option<u32>,
    comm: Option<String>,
    worker_name: bool,
}

/// The step gap: the geometric middle of the largest jump between sorted gaps (at least
/// MIN_GAP_RATIO, above MIN_STEP_GAP_NS), else the default.
pub fn step_gap_ns(gaps: &[i64]) -> (i64, bool) {
    let mut g: Vec<i64> = gaps.iter().copied().filter(|&x| x > 0).collect();
    g.sort_unstable();
    let mut best: Option<(f64, i64)> = None;
    for w in g.windows(2) {
        if w[1] < MIN_STEP_GAP_NS {
            continue;
        }
        let lo = w[0].max(1) as f64;
        let ratio = w[1] as f64 / lo;
        if ratio >= MIN_GAP_RATIO && best.is_none_or(|(r, _)| ratio > r) {
            best = Some((ratio, ((lo * w[1] as f64).sqrt() as i64).max(MIN_STEP_GAP_NS)));
        }
    }
    match best {
        Some((_, t)) => (t, true),
        None => ((DEFAULT_BURST_GAP_MS * 1e6) as i64, false),
    }
}

/// Where the GPUs' data comes from, and whether the workers said so: the device the
/// DataLoader workers read most from, when they read a fair share of the bytes (an
/// interpreter's imports happen in the ranks and the launcher, the samples in the
/// workers; their reads through mmap count); else the device of the most bytes read,
/// through syscalls or mmap.
fn data_device(reads: &[&OwnedRow], is_worker: &dyn Fn(u32) -> bool) -> (Option<String>, bool) {
    fn argmax(m: HashMap<&str, u64>) -> Option<String> {
        m.into_iter()
            .filter(|(_, b)| *b > 0)
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(a.0)))
            .map(|(d, _)| d.to_string())
    }
    let mut by_file: HashMap<&str, u64> = HashMap::new();
    let mut by_worker: HashMap<&str, u64> = HashMap::new();
    for r in reads {
        let Some(d) = r.dev.as_deref() else { continue };
        *by_file.entry(d).or_default() += r.bytes as u64;
        if is_worker(r.pid) {
            *by_worker.entry(d).or_default() += r.bytes as u64;
        }
    }
    // Workers that read a sliver (a shell's command substitution handing a line to its
    // parent, reading a configuration file) do not say where the data is.
    let total: u64 = by_file.values().sum();
    by_worker.retain(|_, b| *b as f64 >= WORKER_DEV_SHARE * total as f64);
    match argmax(by_worker) {
        Some(d) => (Some(d), true),
        None => (argmax(by_file), false),
    }
}

/// Workers decide the data device when they read at least this share of all bytes read.
const WORKER_DEV_SHARE: f64 = 0.05;

struct Files {
    index: HashMap<String, u32>,
    list: Vec<(String, u64)>,
}

impl Files {
    fn new() -> Self {
        Files { index: HashMap::new(), list: Vec::new() }
    }
    fn add(&mut self, r: &OwnedRow) -> Read {
        let name = match (&r.file, r.fd) {
            (Some(f), _) => f.to_string(),
            (None, fd) => format!("<pid {} fd {}>", r.pid, fd.unwrap_or(-1)),
        };
        let next = self.list.len() as u32;
        let fi = *self.index.entry(name.clone()).or_insert(next);
        if fi == next {
            self.list.push((name, 0));
        }
        let offset = r.offset.unwrap_or(0).max(0) as u64;
        let len = r.bytes as u64;
        let e = &mut self.list[fi as usize].1;
        *e = (*e).max(offset + len);
        Read { file: fi, offset, len, reader: 0, mapped: mapped::is_mapped_read(r) }
    }
}

/// Infers the job model from rows (`load_input`).
pub fn infer(input: &Input, opts: &Options) -> Result<JobModel, String> {
    // Reads through mmap are data reads like read syscalls (mapped.rs).
    let mapped_reads = mapped::reads(&input.file, &input.proc_rows);
    let with_mapped;
    let input = if mapped_reads.is_empty() {
        input
    } else {
        with_mapped = Input {
            file: input.file.iter().cloned().chain(mapped_reads).collect(),
            proc_rows: input.proc_rows.clone(),
            ipc: input.ipc.clone(),
            block_reads: input.block_reads.clone(),
            block_dev_reads: input.block_dev_reads.clone(),
            has_block: input.has_block,
        };
        &with_mapped
    };
    let mut warnings = Vec::new();
    // Processes: parents, names, worker names.
    let mut procs: HashMap<u32, Proc> = HashMap::new();
    let mut proc_rows: Vec<&OwnedRow> = input.proc_rows.iter().collect();
    proc_rows.sort_by_key(|r| r.issue_ns);
    for r in &proc_rows {
        let p = procs.entry(r.pid).or_default();
        if let Some(pp) = r.ppid {
            if pp != r.pid {
                p.ppid = Some(pp);
            }
        }
        if r.tid == r.pid || matches!(&*r.op, "start" | "fork" | "exec") {
            p.comm = Some(r.comm.to_string());
        }
        if &*r.comm == WORKER_COMM {
            p.worker_name = true;
        }
    }
    for r in input.file.iter().chain(input.ipc.iter()) {
        let p = procs.entry(r.pid).or_default();
        if &*r.comm == WORKER_COMM {
            p.worker_name = true;
        }
        if p.comm.is_none() && r.tid == r.pid {
            p.comm = Some(r.comm.to_string());
        }
    }
    let comm_of = |pid: u32, fallback: &str| -> String {
        procs.get(&pid).and_then(|p| p.comm.clone()).unwrap_or_else(|| fallback.to_string())
    };

    // Handoff edges: pipes and sockets written by one process and read or polled by another.
    let mut writers: HashMap<&str, HashSet<u32>> = HashMap::new();
    let mut readers: HashMap<&str, HashSet<u32>> = HashMap::new();
    for r in &input.ipc {
        let Some(f) = r.file.as_deref() else { continue };
        match &*r.op {
            "write" if r.bytes > 0 => {
                writers.entry(f).or_default().insert(r.pid);
            }
            "read" if r.bytes > 0 => {
                readers.entry(f).or_default().insert(r.pid);
            }
            "wait" => {
                readers.entry(f).or_default().insert(r.pid);
            }
            _ => {}
        }
    }
    let hands_off = |from: u32, to: u32| -> bool {
        writers.iter().any(|(f, w)| w.contains(&from) && readers.get(f).is_some_and(|r| r.contains(&to)))
    };
    let is_worker = |pid: u32| -> bool {
        procs.get(&pid).is_some_and(|p| p.worker_name || p.ppid.is_some_and(|pp| hands_off(pid, pp)))
    };

    // The data device.
    let reads: Vec<&OwnedRow> = input.file.iter().filter(|r| is_data_read(r)).collect();
    let (data_dev, by_workers) = match &opts.dev {
        Some(d) => (Some(d.clone()), false),
        None => data_device(&reads, &is_worker),
    };
    let on_dev = |r: &OwnedRow| data_dev.is_none() || r.dev.is_none() || r.dev.as_deref() == data_dev.as_deref();
    let data_reads: Vec<&OwnedRow> = reads.into_iter().filter(|r| on_dev(r)).collect();
    // When the workers named the data device and the trace names its block layer (a
    // file system on a whole disk), only that device's block reads are compared with the
    // file layer: a rank paging in its libraries from the root disk while its workers
    // read the data says nothing of whether the file layer saw the data's reads.
    let dev_blocks = data_dev.as_deref().filter(|_| by_workers).and_then(|d| input.block_dev_reads.get(d));
    let block_reads = dev_blocks.unwrap_or(&input.block_reads);
    let counted_read = |r: &OwnedRow| &*r.op == "read" && r.bytes > 0 && (dev_blocks.is_none() || on_dev(r));
    let mut reader_bytes: BTreeMap<u32, u64> = BTreeMap::new();
    let mut reader_comm: HashMap<u32, String> = HashMap::new();
    for r in &data_reads {
        *reader_bytes.entry(r.pid).or_default() += r.bytes as u64;
        reader_comm.entry(r.pid).or_insert_with(|| r.comm.to_string());
    }

    // Groups: rank pid -> (members, why).
    let has_proc = !input.proc_rows.is_empty();
    let mut worker_of: HashMap<u32, (u32, String)> = HashMap::new();
    let mut left_out: Vec<LeftOut> = Vec::new();
    let grouping_desc;
    match &opts.grouping {
        Grouping::Process => {
            grouping_desc = "per process (--gpu-grouping process)".to_string();
        }
        Grouping::Ranks(ranks) => {
            grouping_desc =
                format!("ranks given: {}", ranks.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(","));
            let set: HashSet<u32> = ranks.iter().copied().collect();
            for &pid in reader_bytes.keys() {
                let mut cur = pid;
                let mut found = None;
                for _ in 0..64 {
                    if set.contains(&cur) {
                        found = Some(cur);
                        break;
                    }
                    match procs.get(&cur).and_then(|p| p.ppid) {
                        Some(pp) => cur = pp,
                        None => break,
                    }
                }
                match found {
                    Some(r) if r == pid => {}
                    Some(r) => {
                        worker_of.insert(pid, (r, format!("descends from rank {r}")));
                    }
                    None => left_out.push(LeftOut {
                        host: None,
                        pid,
                        comm: comm_of(pid, &reader_comm[&pid]),
                        bytes: reader_bytes[&pid],
                        why: "not a listed rank nor a descendant of one".into(),
                    }),
                }
            }
        }
        Grouping::Auto => {
            grouping_desc = if has_proc {
                "ranks and their DataLoader workers (process tree, worker names, batch handoff)".to_string()
            } else {
                warnings.push("no proc layer in the trace (schema < 1.3 or recorded without the file layer): every process that reads is its own GPU".into());
                "per process (the trace has no proc layer)".to_string()
            };
            for &pid in reader_bytes.keys() {
                let Some(parent) = procs.get(&pid).and_then(|p| p.ppid) else { continue };
                let named = procs.get(&pid).is_some_and(|p| p.worker_name);
                let handoff = hands_off(pid, parent);
                if named || handoff {
                    let why = match (named, handoff) {
                        (true, true) => "named pt_data_worker, hands off to its parent",
                        (true, false) => "named pt_data_worker",
                        _ => "hands off to its parent",
                    };
                    worker_of.insert(pid, (parent, why.to_string()));
                }
            }
            // A worker's parent that is itself a worker: follow up to the rank.
            let snapshot = worker_of.clone();
            for (_, (rank, _)) in worker_of.iter_mut() {
                for _ in 0..8 {
                    match snapshot.get(rank) {
                        Some((up, _)) => *rank = *up,
                        None => break,
                    }
                }
            }
        }
    }
    let left: HashSet<u32> = left_out.iter().map(|l| l.pid).collect();
    let mut groups: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for &pid in reader_bytes.keys() {
        if left.contains(&pid) {
            continue;
        }
        match worker_of.get(&pid) {
            Some((rank, _)) => groups.entry(*rank).or_default().push(pid),
            None => {
                groups.entry(pid).or_default();
            }
        }
    }
    // A group that is no GPU: each of its reading processes listed, with the reason.
    let leave_out_group = |left_out: &mut Vec<LeftOut>, rank: u32, ws: &[u32], why: &str| {
        for pid in std::iter::once(rank).chain(ws.iter().copied()) {
            if let Some(&b) = reader_bytes.get(&pid) {
                left_out.push(LeftOut {
                    host: None,
                    pid,
                    comm: comm_of(pid, &reader_comm[&pid]),
                    bytes: b,
                    why: why.to_string(),
                });
            }
        }
    };
    if opts.grouping == Grouping::Auto {
        // A launcher is never a GPU: a process that started another group's rank
        // (torchrun's agent, mpirun, a shell) runs the ranks, it does not read for them.
        // A rank's own children that read for it are its workers, grouped above.
        let ranks: Vec<u32> = groups.keys().copied().collect();
        let ancestor_of = |a: u32, pid: u32| -> bool {
            let mut cur = pid;
            for _ in 0..64 {
                match procs.get(&cur).and_then(|p| p.ppid) {
                    Some(pp) if pp == a => return true,
                    Some(pp) if pp != cur => cur = pp,
                    _ => return false,
                }
            }
            false
        };
        for &a in &ranks {
            let started: Vec<u32> = ranks.iter().copied().filter(|&r| r != a && ancestor_of(a, r)).collect();
            if started.is_empty() {
                continue;
            }
            let why = format!(
                "started the ranks {}: a launcher, not a GPU",
                started.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ")
            );
            let ws = groups.remove(&a).unwrap_or_default();
            leave_out_group(&mut left_out, a, &ws, &why);
        }
    }
    let group_bytes = |rank: u32, ws: &[u32]| -> u64 {
        reader_bytes.get(&rank).copied().unwrap_or(0) + ws.iter().map(|w| reader_bytes[w]).sum::<u64>()
    };
    let largest = groups.iter().map(|(r, ws)| group_bytes(*r, ws)).max().unwrap_or(0);
    let ix = ByPid::new(input, &data_reads, block_reads);
    let job_bursts = writes::bursts(&input.file.iter().collect::<Vec<_>>(), &mut Vec::new());
    let job_writes: Vec<(i64, i64)> = job_bursts.iter().map(|b| (b.start_ns, b.end_ns)).collect();
    let mut gpus = Vec::new();
    for (rank, ws) in &groups {
        let bytes = group_bytes(*rank, ws);
        if (bytes as f64) < MINOR_GROUP_SHARE * largest as f64 {
            let why = format!(
                "its group reads {:.2}% of the largest GPU's bytes: not a GPU",
                100.0 * bytes as f64 / largest.max(1) as f64
            );
            leave_out_group(&mut left_out, *rank, ws, &why);
            continue;
        }
        let mut ws = ws.clone();
        let first_read: HashMap<u32, i64> =
            data_reads.iter().filter(|r| ws.contains(&r.pid)).fold(HashMap::new(), |mut m, r| {
                let e = m.entry(r.pid).or_insert(i64::MAX);
                *e = (*e).min(r.issue_ns);
                m
            });
        ws.sort_by_key(|w| (first_read.get(w).copied().unwrap_or(i64::MAX), *w));
        let mut members = vec![Member {
            pid: *rank,
            comm: comm_of(*rank, reader_comm.get(rank).map(String::as_str).unwrap_or("?")),
            role: "rank",
            why: String::new(),
            bytes: reader_bytes.get(rank).copied().unwrap_or(0),
        }];
        for w in &ws {
            members.push(Member {
                pid: *w,
                comm: comm_of(*w, &reader_comm[w]),
                role: "worker",
                why: worker_of.get(w).map(|x| x.1.clone()).unwrap_or_default(),
                bytes: reader_bytes[w],
            });
        }
        let mut gpu = build_gpu(gpus.len(), *rank, &ws, members, input, &ix, opts, &on_dev, &job_writes, &mut warnings);
        // The rank's own writes: they stand between its steps (a checkpoint). Its workers
        // write beside the GPU, not between its steps; they count in the job's bursts.
        // Only writes on the data's device are the GPU's: a results file or a log on
        // another file system is no load on the storage the replay tests.
        let (own, elsewhere): (Vec<&OwnedRow>, Vec<&OwnedRow>) =
            rows_of(&ix.file, *rank).iter().copied().filter(|r| writes::is_write_row(r)).partition(|r| on_dev(r));
        if !elsewhere.is_empty() {
            let bytes: u64 = elsewhere.iter().filter(|r| &*r.op == "write").map(|r| r.bytes as u64).sum();
            let mut devs: Vec<&str> = elsewhere.iter().filter_map(|r| r.dev.as_deref()).collect();
            devs.sort_unstable();
            devs.dedup();
            warnings.push(format!(
                "GPU {} (pid {rank}): {} writes and syncs ({bytes} bytes) on other devices than the data's ({}) are not the GPU's: {}",
                gpus.len(),
                elsewhere.len(),
                data_dev.as_deref().unwrap_or("?"),
                devs.join(", ")
            ));
        }
        gpu.write_bursts = writes::bursts(&own, &mut gpu.write_files);
        let ready: Vec<i64> = gpu.steps.iter().map(|s| s.ready_ns).collect();
        writes::place(&mut gpu.write_bursts, &ready);
        gpus.push(gpu);
    }
    // Coverage: the block reads each GPU's processes caused from their first data read
    // on, against their read syscalls in the same time. Reads through mmap or io_uring
    // reach the block layer but not the file layer. Earlier block reads (an interpreter
    // faulting in its libraries at import) and other processes' are only noted.
    let traced: HashSet<u32> =
        input.file.iter().chain(input.proc_rows.iter()).chain(input.ipc.iter()).map(|r| r.pid).collect();
    let mut block_by_pid: HashMap<u32, u64> = HashMap::new();
    for (&(pid, _), &b) in block_reads {
        *block_by_pid.entry(pid).or_default() += b;
    }
    let mut file_by_pid: HashMap<u32, u64> = HashMap::new();
    for r in input.file.iter().filter(|r| counted_read(r)) {
        *file_by_pid.entry(r.pid).or_default() += r.bytes as u64;
    }
    let mut coverage: Vec<Coverage> = block_by_pid
        .iter()
        .filter(|(pid, b)| traced.contains(pid) && **b > 0)
        .map(|(&pid, &b)| Coverage {
            host: None,
            pid,
            comm: comm_of(pid, "?"),
            block_read_bytes: b,
            file_read_bytes: file_by_pid.get(&pid).copied().unwrap_or(0),
            in_gpu: false,
            block_read_bytes_training: 0,
            file_read_bytes_training: 0,
        })
        .collect();
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    // A GPU's processes: its rank, its workers, and whatever else descends from the rank
    // (a child that reads for it through io_uring, say).
    let rank_of_gpu: HashMap<u32, usize> = gpus.iter().map(|g| (g.rank_pid, g.index)).collect();
    let descends_from = |pid: u32| -> Option<usize> {
        let mut cur = pid;
        for _ in 0..64 {
            if let Some(&g) = rank_of_gpu.get(&cur) {
                return Some(g);
            }
            cur = procs.get(&cur).and_then(|p| p.ppid)?;
        }
        None
    };
    for g in &gpus {
        let mut members: Vec<u32> = g.members.iter().map(|m| m.pid).collect();
        let start = members.iter().flat_map(|&p| rows_of(&ix.data, p)).map(|r| r.issue_ns).min().unwrap_or(i64::MAX);
        members.extend(coverage.iter().map(|c| c.pid).filter(|&p| descends_from(p) == Some(g.index)));
        let sec0 = start.div_euclid(NS_PER_S);
        for c in coverage.iter_mut().filter(|c| members.contains(&c.pid)) {
            c.in_gpu = true;
            c.block_read_bytes_training =
                ix.block.get(&c.pid).into_iter().flatten().filter(|(sec, _)| *sec >= sec0).map(|(_, b)| *b).sum();
            c.file_read_bytes_training = rows_of(&ix.file, c.pid)
                .iter()
                .filter(|r| counted_read(r) && r.issue_ns >= sec0 * NS_PER_S)
                .map(|r| r.bytes as u64)
                .sum();
        }
    }
    coverage.sort_by(|a, b| b.block_read_bytes.cmp(&a.block_read_bytes).then(a.pid.cmp(&b.pid)));
    let unseen = |c: &Coverage| c.block_read_bytes_training.saturating_sub(c.file_read_bytes_training);
    let gpu_block: u64 = coverage.iter().filter(|c| c.in_gpu).map(|c| c.block_read_bytes_training).sum();
    let gpu_unseen: u64 = coverage.iter().filter(|c| c.in_gpu).map(unseen).sum();
    let incomplete = if input.has_block
        && gpu_unseen >= INCOMPLETE_MIN_BYTES
        && gpu_unseen as f64 > INCOMPLETE_SHARE * gpu_block as f64
    {
        let top = coverage.iter().filter(|c| c.in_gpu).max_by_key(|c| unseen(c)).expect("a GPU process has the bytes");
        Some(format!(
            "while they trained, the GPUs' processes read {:.1} MiB through read syscalls but caused {:.1} MiB of block reads: pid {} ({}) caused {:.1} MiB of block reads with {:.1} MiB of read syscalls, so it likely reads through mmap or io_uring, which the file layer does not see (io_uring: record with --io-uring)",
            mib(gpu_block - gpu_unseen.min(gpu_block)),
            mib(gpu_block),
            top.pid,
            top.comm,
            mib(top.block_read_bytes_training),
            mib(top.file_read_bytes_training),
        ))
    } else {
        None
    };
    let incomplete = incomplete.or_else(|| {
        // No GPU at all, yet the traced processes read from storage: none of it was a
        // read syscall.
        let other: u64 = coverage.iter().map(|c| c.block_read_bytes.saturating_sub(c.file_read_bytes)).sum();
        (gpus.is_empty() && input.has_block && other >= INCOMPLETE_MIN_BYTES).then(|| {
            format!(
                "the traced processes caused {:.1} MiB of block reads but the file layer holds no data read: they likely read through mmap or io_uring, which the file layer does not see (io_uring: record with --io-uring)",
                mib(other)
            )
        })
    });
    for c in coverage.iter().filter(|c| !c.in_gpu) {
        let u = c.block_read_bytes.saturating_sub(c.file_read_bytes);
        if u >= INCOMPLETE_MIN_BYTES {
            warnings.push(format!(
                "pid {} ({}) caused {:.1} MiB of block reads beyond its read syscalls (mmap'd libraries, io_uring); it is part of no GPU and is not replayed",
                c.pid, c.comm, mib(u)
            ));
        }
    }
    if !input.has_block && !data_reads.is_empty() {
        warnings.push(
            "no block layer in the trace: cannot check that the file layer saw every read (mmap, io_uring)".into(),
        );
    }
    left_out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.pid.cmp(&b.pid)));

    let computes: Vec<f64> = gpus.iter().filter_map(|g| g.compute_s).collect();
    let compute_s = quantile(&computes, 0.5);
    let bps: Vec<f64> = gpus.iter().filter(|g| !g.steps.is_empty()).map(|g| g.bytes_per_step).collect();
    let bytes_per_step = quantile(&bps, 0.5);
    let reqs: Vec<f64> = gpus.iter().filter_map(|g| g.required_mib_s).collect();
    let steps = gpus.iter().map(|g| g.steps.len() as u64).sum();
    Ok(JobModel {
        data_dev,
        grouping: grouping_desc,
        gpus,
        left_out,
        compute_s,
        bytes_per_step,
        required_mib_s_per_gpu: quantile(&reqs, 0.5),
        steps,
        coverage,
        incomplete,
        warnings,
        writes: writes::summarize(job_bursts),
        hosts: Vec::new(),
    })
}

/// Counts the opens of data files per (pid, time window): the samples of a batch, one
/// `__getitem__` opening one file.
fn opens_between(opens: &[(u32, i64)], pids: &[u32], from: i64, to: i64) -> u32 {
    opens.iter().filter(|(p, t)| pids.contains(p) && *t > from && *t <= to).count() as u32
}

#[allow(clippy::too_many_arguments)]
fn build_gpu(
    index: usize,
    rank: u32,
    workers: &[u32],
    members: Vec<Member>,
    input: &Input,
    ix: &ByPid,
    opts: &Options,
    on_dev: &dyn Fn(&OwnedRow) -> bool,
    job_writes: &[(i64, i64)],
    warnings: &mut Vec<String>,
) -> GpuModel {
    let comm = members[0].comm.clone();
    let mut files = Files::new();
    // The data files: those the GPU's processes read from the data device. Opens and
    // closes count only on them (an open row carries no device).
    let mut pids: Vec<u32> = vec![rank];
    pids.extend_from_slice(workers);
    let data_paths: HashSet<&str> =
        pids.iter().flat_map(|&p| rows_of(&ix.data, p)).filter_map(|r| r.file.as_deref()).collect();
    let is_data_file = |r: &OwnedRow| r.file.as_deref().is_some_and(|f| data_paths.contains(f));
    let opens: Vec<(u32, i64)> = pids
        .iter()
        .flat_map(|&p| rows_of(&ix.file, p))
        .filter(|r| &*r.op == "open" && r.error == 0 && is_data_file(r))
        .map(|r| (r.pid, r.issue_ns))
        .collect();
    // The worker pipe(s): written by this GPU's workers, read by its rank.
    let mut data_pipes: HashSet<&str> = HashSet::new();
    let mut index_pipes: HashSet<&str> = HashSet::new();
    if !workers.is_empty() {
        let mut w_of: HashSet<&str> = HashSet::new();
        let mut r_of: HashSet<&str> = HashSet::new();
        let mut rank_w: HashSet<&str> = HashSet::new();
        let mut worker_r: HashSet<&str> = HashSet::new();
        for r in pids.iter().flat_map(|&p| rows_of(&ix.ipc, p)) {
            let Some(f) = r.file.as_deref() else { continue };
            match &*r.op {
                "write" if r.bytes > 0 && workers.contains(&r.pid) => {
                    w_of.insert(f);
                }
                "write" if r.bytes > 0 && r.pid == rank => {
                    rank_w.insert(f);
                }
                "read" if r.bytes > 0 && r.pid == rank => {
                    r_of.insert(f);
                }
                "read" if r.bytes > 0 && workers.contains(&r.pid) => {
                    worker_r.insert(f);
                }
                _ => {}
            }
        }
        data_pipes = w_of.intersection(&r_of).copied().collect();
        // The workers' index queues: written by the rank, read by a worker (one batch
        // index per batch the rank takes).
        index_pipes = rank_w.intersection(&worker_r).copied().collect();
    }
    let mut steps: Vec<Step> = Vec::new();
    let mut unfinished_bytes = 0u64;
    let step_signal;
    let readers;
    let synchronous;
    let mut intervals_override: Option<Vec<f64>> = None;
    // Per step: (from, anchor, to): the GPU has its batch from `from` (its main thread's
    // last syscall up to `anchor` starts the compute) until it asks for the next at `to`.
    let mut windows: Vec<(i64, i64, i64)> = Vec::new();
    // Reader threads: how many batches the loader was seen to read ahead (at least 2).
    let mut read_ahead = 2usize;
    let handoff_s: f64;
    if !data_pipes.is_empty() {
        step_signal = "handoff";
        synchronous = false;
        // Workers in the order they were started: PyTorch's worker ids. Batch b goes to
        // worker b mod W, so a worker's s-th batch is batch s*W + w.
        let fork_at: HashMap<u32, i64> =
            input.proc_rows.iter().filter(|r| &*r.op == "fork").map(|r| (r.pid, r.issue_ns)).collect();
        let mut order: Vec<usize> = (0..workers.len()).collect();
        order.sort_by_key(|&i| (fork_at.get(&workers[i]).copied().unwrap_or(i64::MAX), i));
        // Messages: each worker's writes on the pipe, merged when back to back.
        let mut per_worker_msgs: Vec<Vec<i64>> = vec![Vec::new(); workers.len()];
        for (wi, &w) in workers.iter().enumerate() {
            let mut ws: Vec<&OwnedRow> = rows_of(&ix.ipc, w)
                .iter()
                .copied()
                .filter(|r| {
                    &*r.op == "write" && r.bytes > 0 && r.file.as_deref().is_some_and(|f| data_pipes.contains(f))
                })
                .collect();
            ws.sort_by_key(|r| r.issue_ns);
            let mut last_end = i64::MIN;
            for r in ws {
                if last_end != i64::MIN && r.issue_ns - last_end < MESSAGE_MERGE_NS {
                    last_end = r.complete_ns;
                    continue;
                }
                per_worker_msgs[wi].push(r.issue_ns);
                last_end = r.complete_ns;
            }
        }
        // A worker's batch: its data reads since its previous message.
        let mut per_worker: Vec<Vec<&OwnedRow>> = workers.iter().map(|&w| rows_of(&ix.data, w).to_vec()).collect();
        for v in &mut per_worker {
            v.sort_by_key(|r| (r.issue_ns, r.complete_ns));
        }
        let nw = workers.len();
        let mut batches: Vec<(usize, Step)> = Vec::new();
        for (rank_of_worker, &wi) in order.iter().enumerate() {
            let list = &per_worker[wi];
            let mut cursor = 0usize;
            let mut prev = i64::MIN;
            let mut seq = 0usize;
            for &at in &per_worker_msgs[wi] {
                let mut reads = Vec::new();
                let mut first = i64::MAX;
                while cursor < list.len() && list[cursor].complete_ns <= at {
                    let r = list[cursor];
                    let mut rd = files.add(r);
                    rd.reader = rank_of_worker as u32;
                    first = first.min(r.issue_ns);
                    reads.push(rd);
                    cursor += 1;
                }
                let samples = opens_between(&opens, &[workers[wi]], prev, at);
                prev = at;
                if reads.is_empty() {
                    continue; // a message that carried no batch (a status, the end)
                }
                let bytes = reads.iter().map(|r| r.len).sum();
                let samples = if samples > 0 { samples } else { distinct_files(&reads) };
                let io = busy_ns(&list[cursor - reads.len()..cursor]);
                // Page faults are instants in the trace: a batch read through mmap has no
                // measured I/O time to tell its CPU time from.
                let faulted = reads.iter().any(|r| r.mapped);
                batches.push((
                    seq * nw + rank_of_worker,
                    Step {
                        reads,
                        bytes,
                        samples,
                        first_read_ns: first,
                        ready_ns: at,
                        interval_s: None,
                        wait_s: 0.0,
                        period_s: None,
                        worker_cpu_s: (!faulted).then(|| ((at - first) - io).max(0) as f64 / 1e9),
                    },
                ));
                seq += 1;
            }
            unfinished_bytes += list[cursor..].iter().map(|r| r.bytes as u64).sum::<u64>();
        }
        batches.sort_by_key(|(b, s)| (*b, s.ready_ns));
        steps = batches.into_iter().map(|(_, s)| s).collect();
        readers = nw;
        // The rank's own data reads (a rank that also reads) are not replayed: say so.
        let own: u64 = rows_of(&ix.data, rank).iter().map(|r| r.bytes as u64).sum();
        if own > 0 {
            warnings.push(format!(
                "GPU {index} (pid {rank}): the rank's own {:.1} MiB of data reads are left out of its steps (its workers read the batches)",
                own as f64 / (1u64 << 20) as f64
            ));
        }
        // The rank's time outside getting data. It takes a batch, then writes the next
        // batch index to a worker's index queue: one write per step. From there to its
        // next poll or read of the worker pipe (or to the next index write, when the
        // batch came from the batches it already holds) it computes.
        let mut pipe_events: Vec<(i64, i64, bool)> = rows_of(&ix.ipc, rank)
            .iter()
            .filter(|r| {
                r.file.as_deref().is_some_and(|f| data_pipes.contains(f))
                    && (&*r.op == "wait" || (&*r.op == "read" && r.bytes > 0))
            })
            .map(|r| (r.issue_ns, r.complete_ns, &*r.op == "wait"))
            .collect();
        pipe_events.sort_unstable();
        let first_get = pipe_events.first().map(|e| e.0).unwrap_or(i64::MAX);
        let mut marks: Vec<i64> = rows_of(&ix.ipc, rank)
            .iter()
            .filter(|r| &*r.op == "write" && r.bytes > 0 && r.file.as_deref().is_some_and(|f| index_pipes.contains(f)))
            .map(|r| r.issue_ns)
            .filter(|&t| t > first_get)
            .collect();
        marks.sort_unstable();
        // Index writes back to back (the loader's shutdown, one per worker) are one mark.
        marks.dedup_by(|b, a| *b - *a < GET_MERGE_NS);
        let mut computes = Vec::new();
        let mut waits = Vec::new();
        let mut costs = Vec::new();
        let mut prev_t = i64::MIN;
        for w in marks.windows(2) {
            let (t, next) = (w[0], w[1]);
            let k = pipe_events.partition_point(|e| e.0 <= t);
            let end = match pipe_events.get(k) {
                Some(e) if e.0 < next => e.0,
                _ => next,
            };
            // The get this index write followed: the handoff the compute starts after.
            let got = match k.checked_sub(1).map(|i| pipe_events[i].0) {
                Some(g) if g > prev_t => g,
                _ => t,
            };
            prev_t = t;
            windows.push((got, t, end));
            computes.push((end - t) as f64 / 1e9);
            let waited: i64 =
                pipe_events[k..].iter().take_while(|e| e.0 < next).filter(|e| e.2).map(|e| e.1 - e.0).sum();
            waits.push(waited as f64 / 1e9);
            if end < next {
                costs.push(((next - end) - waited).max(0) as f64 / 1e9);
            }
        }
        // The median step that got a batch off the pipe: a step served from batches the
        // rank already held costs nothing here, its batch's unpickling was paid when it
        // was read; the windows at the loader's end hold several steps.
        handoff_s = quantile(&costs, 0.5).unwrap_or(0.0);
        if computes.is_empty() {
            warnings.push(format!(
                "GPU {index} (pid {rank}): no batch index written to its workers after the first batch: compute time unknown"
            ));
        }
        for (k, step) in steps.iter_mut().enumerate() {
            step.interval_s = computes.get(k).copied();
            step.wait_s = waits.get(k).copied().unwrap_or(0.0);
        }
        intervals_override = Some(computes);
    } else {
        step_signal = "bursts";
        if !workers.is_empty() {
            warnings.push(format!(
                "GPU {index} (pid {rank}): its workers' batch handoff is not in the trace (no ipc layer): steps are bursts of reads, which merge or split batches when workers read ahead"
            ));
        }
        // Activity on data files of the group: reads, opens, closes.
        let mut act: Vec<&OwnedRow> = pids
            .iter()
            .flat_map(|&p| rows_of(&ix.file, p))
            .copied()
            .filter(|r| is_data_read(r) && on_dev(r) || matches!(&*r.op, "open" | "close") && is_data_file(r))
            .collect();
        act.sort_by_key(|r| (r.issue_ns, r.complete_ns));
        // A gap in which the rank wrote a burst (a checkpoint saved between two steps)
        // separates steps whatever its length. Gaps in which any process of the job
        // wrote are left out of the gaps that set the step gap: a checkpoint's pause, or
        // a rank waiting at a collective for another rank's checkpoint, would otherwise
        // look like the gap between batches, and the compute gaps like gaps inside one.
        let write_spans: Vec<(i64, i64)> =
            writes::bursts(rows_of(&ix.file, rank), &mut Vec::new()).iter().map(|b| (b.start_ns, b.end_ns)).collect();
        let wrote_in = |from: i64, to: i64| write_spans.iter().any(|&(s, e)| s < to && e > from);
        let job_wrote_in = |from: i64, to: i64| job_writes.iter().any(|&(s, e)| s < to && e > from);
        let mut gaps = Vec::new();
        let mut busy = i64::MIN;
        for r in &act {
            if busy != i64::MIN && r.issue_ns > busy && !wrote_in(busy, r.issue_ns) && !job_wrote_in(busy, r.issue_ns) {
                gaps.push(r.issue_ns - busy);
            }
            busy = busy.max(r.complete_ns);
        }
        let gap_ns = match opts.burst_gap_ms {
            Some(ms) => (ms * 1e6) as i64,
            None => {
                let (g, found) = step_gap_ns(&gaps);
                if !found && gaps.len() > 1 {
                    warnings.push(format!(
                        "GPU {index} (pid {rank}): no clear gap between batches; steps split at {DEFAULT_BURST_GAP_MS} ms idle gaps"
                    ));
                }
                g
            }
        };
        let mut tids: HashMap<u32, u32> = HashMap::new();
        let mut busy = i64::MIN;
        let mut cur: Option<Step> = None;
        // Per read of the current burst, and per finished burst: (issue, complete) ns.
        let mut cur_times: Vec<(i64, i64)> = Vec::new();
        let mut step_times: Vec<Vec<(i64, i64)>> = Vec::new();
        let mut open_count = 0u32;
        // Per burst: time inside read syscalls (their union), to tell I/O from the
        // loader's own CPU time in the burst.
        let mut io_ns = 0i64;
        let mut io_end = i64::MIN;
        let mut cpu: Vec<f64> = Vec::new();
        let close_burst = |s: &Step, io: i64, cpu: &mut Vec<f64>| {
            if !s.reads.is_empty() {
                cpu.push(((s.ready_ns - s.first_read_ns) - io).max(0) as f64 / 1e9);
            }
        };
        for r in &act {
            if busy != i64::MIN && (r.issue_ns - busy >= gap_ns || r.issue_ns > busy && wrote_in(busy, r.issue_ns)) {
                if let Some(mut s) = cur.take() {
                    s.interval_s = Some((r.issue_ns - busy) as f64 / 1e9);
                    close_burst(&s, io_ns, &mut cpu);
                    if finish_burst(&mut s, open_count, &mut steps) {
                        step_times.push(std::mem::take(&mut cur_times));
                    }
                    cur_times.clear();
                }
                open_count = 0;
                io_ns = 0;
                io_end = i64::MIN;
            }
            if &*r.op == "read" {
                let from = r.issue_ns.max(io_end);
                if r.complete_ns > from {
                    io_ns += r.complete_ns - from;
                }
                io_end = io_end.max(r.complete_ns);
            }
            busy = busy.max(r.complete_ns);
            let s = cur.get_or_insert_with(|| Step {
                reads: Vec::new(),
                bytes: 0,
                samples: 0,
                first_read_ns: r.issue_ns,
                ready_ns: r.complete_ns,
                interval_s: None,
                wait_s: 0.0,
                period_s: None,
                worker_cpu_s: None,
            });
            s.ready_ns = s.ready_ns.max(r.complete_ns);
            match &*r.op {
                "open" if r.error == 0 => open_count += 1,
                "read" if is_data_read(r) => {
                    let next = tids.len() as u32;
                    let stream = *tids.entry(r.tid).or_insert(next);
                    let mut rd = files.add(r);
                    rd.reader = stream;
                    s.reads.push(rd);
                    s.bytes += rd.len;
                    cur_times.push((r.issue_ns, r.complete_ns));
                }
                _ => {}
            }
        }
        if let Some(mut s) = cur.take() {
            close_burst(&s, io_ns, &mut cpu);
            if finish_burst(&mut s, open_count, &mut steps) {
                step_times.push(std::mem::take(&mut cur_times));
            }
        }
        let mut handoff = if cpu.is_empty() { 0.0 } else { cpu.iter().sum::<f64>() / cpu.len() as f64 };
        for s in &mut steps {
            s.wait_s = (s.ready_ns - s.first_read_ns).max(0) as f64 / 1e9;
        }
        readers = tids.len().max(1);
        // The thread that computes is the process's main thread: if it read every batch
        // itself, the job read, then computed. Otherwise other threads read ahead.
        let inline = pids.iter().flat_map(|&p| rows_of(&ix.data, p)).all(|r| r.tid == r.pid);
        synchronous = workers.is_empty() && inline;
        if synchronous {
            for w in steps.windows(2) {
                if w[0].interval_s.is_some() {
                    windows.push((w[0].ready_ns, w[0].ready_ns, w[1].first_read_ns));
                }
            }
        }
        if !synchronous {
            let starts: Vec<i64> = steps.iter().map(|s| s.first_read_ns).collect();
            let periods: Vec<f64> = starts.windows(2).map(|w| (w[1] - w[0]) as f64 / 1e9).collect();
            let median = quantile(&periods, 0.5);
            for (k, st) in steps.iter_mut().enumerate() {
                st.period_s = periods.get(k).copied().or(median);
            }
            let (regrouped, split, joined, deepest) = regroup_bursts(std::mem::take(&mut steps), &step_times);
            steps = regrouped;
            // A fill of k batches read back to back: the replay's loader may read as far ahead
            // (each batch still starts no earlier than its recorded time).
            read_ahead = read_ahead.max(deepest);
            if split > 0 {
                warnings.push(format!(
                    "GPU {index} (pid {rank}): {split} burst(s) held several whole batches read back to back (the loader filling its prefetch queue): each split into its batches"
                ));
            }
            if joined > 0 {
                warnings.push(format!(
                    "GPU {index} (pid {rank}): {joined} batch(es) spread over several bursts (a read stalled past the step gap): each joined into one step"
                ));
            }
            intervals_override = Some(steps.iter().filter_map(|s| s.period_s).collect());
            handoff = 0.0;
        }
        handoff_s = handoff;
    }
    // Streamed tar shards: a step's samples from the members its reads completed.
    let (shards, unreadable) = shards::recount(&mut steps, &files.list);
    if shards > 0 {
        warnings.push(format!(
            "GPU {index} (pid {rank}): samples per step counted from the members of {shards} tar shard(s) its steps streamed"
        ));
    }
    if !unreadable.is_empty() {
        warnings.push(format!(
            "GPU {index} (pid {rank}): {} tar shard(s) cannot be read here (e.g. {}): their samples per step are counted from opens",
            unreadable.len(),
            unreadable[0]
        ));
    }
    for f in &mut files.list {
        f.1 = f.1.max(1).div_ceil(4096) * 4096;
    }
    let intervals: Vec<f64> = match intervals_override {
        Some(v) => v,
        None => steps.iter().filter_map(|s| s.interval_s).collect(),
    };
    let paced = step_signal == "bursts" && !synchronous;
    let excluded: HashSet<&str> = data_pipes.union(&index_pipes).copied().collect();
    let split = collective_split(&windows, rank, rows_of(&ix.ipc, rank), rows_of(&ix.file, rank), &excluded);
    // A step period is the compute when loader threads keep ahead; a gap or a time to
    // the next get can only be longer than the compute (COMPUTE_QUANTILE); the time to a
    // collective's first send is the compute itself (collective_split).
    let (compute_s, sync_s, compute_signal) = match &split {
        Some((computes, syncs)) => {
            (quantile(computes, 0.5), quantile(syncs, COMPUTE_QUANTILE).unwrap_or(0.0), "collective")
        }
        None => (
            quantile(&intervals, if paced { 0.5 } else { COMPUTE_QUANTILE }),
            0.0,
            if paced {
                "period"
            } else if step_signal == "handoff" {
                "next_get"
            } else {
                "gap"
            },
        ),
    };
    let bytes: u64 = steps.iter().map(|s| s.bytes).sum();
    let samples: u64 = steps.iter().map(|s| s.samples as u64).sum();
    let n = steps.len().max(1) as f64;
    let per_sample: Vec<f64> =
        steps.iter().filter(|s| s.samples > 0).filter_map(|s| Some(s.worker_cpu_s? / s.samples as f64)).collect();
    let cpu_share: Vec<f64> = steps
        .iter()
        .filter(|s| s.ready_ns > s.first_read_ns)
        .filter_map(|s| Some(s.worker_cpu_s? / ((s.ready_ns - s.first_read_ns) as f64 / 1e9)))
        .collect();
    let bytes_per_step = bytes as f64 / n;
    let required_mib_s = compute_s.filter(|&c| c > 0.0).map(|c| bytes_per_step / c / (1u64 << 20) as f64);
    let (au_recorded, mib_s_recorded) = match (steps.first(), steps.last(), compute_s) {
        (Some(a), Some(b), Some(c)) if steps.len() >= 2 => {
            let span = (b.ready_ns - a.ready_ns) as f64 / 1e9 + c;
            let whole = (b.ready_ns - a.first_read_ns) as f64 / 1e9 + c;
            (
                (span > 0.0).then(|| ((steps.len() - 1) as f64 * c / span).min(1.0)),
                (whole > 0.0).then(|| bytes as f64 / whole / (1u64 << 20) as f64),
            )
        }
        _ => (None, None),
    };
    GpuModel {
        index,
        host: None,
        rank_pid: rank,
        comm,
        workers: workers.len(),
        members,
        readers,
        synchronous,
        paced,
        prefetch_batches: if !workers.is_empty() && step_signal == "handoff" {
            2 * workers.len()
        } else if paced {
            read_ahead
        } else {
            1
        },
        step_signal,
        files: files.list,
        bytes,
        samples,
        compute_s,
        interval_p50_s: quantile(&intervals, 0.5),
        interval_p90_s: quantile(&intervals, 0.9),
        wait_s: steps.iter().map(|s| s.wait_s).sum(),
        handoff_s,
        compute_signal,
        sync_s,
        bytes_per_step,
        samples_per_step: samples as f64 / n,
        required_mib_s,
        au_recorded,
        mib_s_recorded,
        worker_cpu_s_per_sample: quantile(&per_sample, 0.5),
        worker_cpu_share: quantile(&cpu_share, 0.5),
        unfinished_bytes,
        steps,
        write_bursts: Vec::new(),
        write_files: Vec::new(),
    }
}

/// A collective's sends in a GPU's compute windows (a data-parallel job's all-reduce
/// after each step's compute, when its transport is a socket the trace sees: gloo's TCP
/// pairs, NCCL's socket transport). A socket is the collective's when the rank's threads
/// send on it in at least half the windows (and 2); the pipes of the handoff are not.
/// In a window (from, anchor, to) the compute starts at the end of the main thread's
/// last syscall in [from, anchor] (anchor when there is none: the batch was in hand) and
/// ends at the first send on a collective socket after it; from that send to `to` is the
/// collective, with any wait for a slower rank. Returns (computes, syncs) of the windows
/// that have a send, or None when no socket is the collective's or fewer than half the
/// windows have a send.
fn collective_split(
    windows: &[(i64, i64, i64)],
    rank: u32,
    ipc: &[&OwnedRow],
    file: &[&OwnedRow],
    excluded: &HashSet<&str>,
) -> Option<(Vec<f64>, Vec<f64>)> {
    if windows.len() < 2 {
        return None;
    }
    let mut sends: Vec<(i64, &str)> = ipc
        .iter()
        .filter(|r| &*r.op == "write" && r.bytes > 0)
        .filter_map(|r| {
            r.file.as_deref().filter(|f| f.starts_with("socket:") && !excluded.contains(f)).map(|f| (r.issue_ns, f))
        })
        .collect();
    sends.sort_unstable();
    let in_window = |from: i64, to: i64| {
        let lo = sends.partition_point(|s| s.0 <= from);
        let hi = sends.partition_point(|s| s.0 < to);
        &sends[lo..hi.max(lo)]
    };
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for &(from, _, to) in windows {
        let mut here: Vec<&str> = in_window(from, to).iter().map(|s| s.1).collect();
        here.sort_unstable();
        here.dedup();
        for f in here {
            *seen.entry(f).or_default() += 1;
        }
    }
    let need = windows.len().div_ceil(2).max(2);
    let collective: HashSet<&str> = seen.into_iter().filter(|&(_, n)| n >= need).map(|(f, _)| f).collect();
    if collective.is_empty() {
        return None;
    }
    let mut main: Vec<i64> =
        ipc.iter().chain(file.iter()).filter(|r| r.pid == rank && r.tid == rank).map(|r| r.complete_ns).collect();
    main.sort_unstable();
    let mut computes = Vec::new();
    let mut syncs = Vec::new();
    for &(from, anchor, to) in windows {
        let last = main.partition_point(|&t| t <= anchor);
        let start = match last.checked_sub(1).map(|i| main[i]) {
            Some(t) if t >= from => t,
            _ => anchor,
        };
        let Some(&(c, _)) = in_window(start, to).iter().find(|s| collective.contains(s.1)) else { continue };
        computes.push((c - start) as f64 / 1e9);
        syncs.push((to - c) as f64 / 1e9);
    }
    (computes.len() >= need).then_some((computes, syncs))
}

fn distinct_files(reads: &[Read]) -> u32 {
    reads.iter().map(|r| r.file).collect::<HashSet<_>>().len() as u32
}

/// Pushes a finished burst onto `steps`; false for a burst without data reads.
fn finish_burst(s: &mut Step, opens: u32, steps: &mut Vec<Step>) -> bool {
    if s.reads.is_empty() {
        return false; // opens and closes only: no data read
    }
    s.samples = if opens > 0 { opens } else { distinct_files(&s.reads) };
    steps.push(std::mem::replace(
        s,
        Step {
            reads: Vec::new(),
            bytes: 0,
            samples: 0,
            first_read_ns: 0,
            ready_ns: 0,
            interval_s: None,
            wait_s: 0.0,
            period_s: None,
            worker_cpu_s: None,
        },
    ));
    true
}

/// Loader threads that read ahead fill their prefetch queue at an epoch's start (and catch
/// up after a stall) with several batches read back to back: one burst that holds k whole
/// batches. A burst that read k (≥ 2) times as many files as the modal burst's B is split
/// into k steps of B files each (in the order of their first read), each starting at its
/// first read; the burst's recorded period is shared evenly between them, so the replay
/// keeps the recorded pace and the step period stays the compute time. Files, not opens,
/// count here: a thread reading ahead opens its next sample in one burst and reads it in
/// the next. Conversely, consecutive bursts that together read B files (a batch whose last
/// read stalled past the step gap) are one step. Returns the steps, how many bursts were
/// split, how many steps were joined from several bursts, and the most batches one burst
/// held.
/// `times`: per step, the (issue, complete) ns of each of its reads.
fn regroup_bursts(steps: Vec<Step>, times: &[Vec<(i64, i64)>]) -> (Vec<Step>, usize, usize, usize) {
    // A step's files in the order of their first read (a burst of a storage-bound loader
    // can hold every file of the run: no quadratic search).
    let files_of = |s: &Step| {
        let mut seen: HashSet<u32> = HashSet::new();
        s.reads.iter().map(|r| r.file).filter(|&f| seen.insert(f)).collect::<Vec<u32>>()
    };
    let mut counts: HashMap<usize, usize> = HashMap::new();
    for s in &steps {
        *counts.entry(files_of(s).len()).or_default() += 1;
    }
    // The modal batch: the most common count of files read (the smaller on a tie), at least 2,
    // seen in at least half the bursts and at least 3 times.
    let Some((batch, seen)) = counts.iter().map(|(&b, &n)| (b, n)).max_by_key(|&(b, n)| (n, std::cmp::Reverse(b)))
    else {
        return (steps, 0, 0, 1);
    };
    if batch < 2 || seen < 3 || seen * 2 < steps.len() || times.len() != steps.len() {
        return (steps, 0, 0, 1);
    }
    let mut out = Vec::with_capacity(steps.len());
    let (mut split, mut joined, mut deepest) = (0, 0, 1);
    for (s, t) in steps.into_iter().zip(times) {
        let order = files_of(&s);
        let k = order.len() / batch;
        if k < 2 || order.len() % batch != 0 || t.len() != s.reads.len() {
            out.push(s);
            continue;
        }
        split += 1;
        deepest = deepest.max(k);
        // Samples: one per file when the burst counted one per file, else shared evenly.
        let samples = |i: usize| {
            if s.samples as usize == order.len() {
                batch as u32
            } else {
                s.samples / k as u32 + u32::from(i < s.samples as usize % k)
            }
        };
        let mut parts: Vec<Step> = (0..k)
            .map(|i| Step {
                reads: Vec::new(),
                bytes: 0,
                samples: samples(i),
                first_read_ns: i64::MAX,
                ready_ns: i64::MIN,
                interval_s: None,
                wait_s: 0.0,
                period_s: s.period_s.map(|p| p / k as f64),
                worker_cpu_s: None,
            })
            .collect();
        let position: HashMap<u32, usize> = order.iter().enumerate().map(|(i, &f)| (f, i)).collect();
        for (r, &(issue, done)) in s.reads.iter().zip(t) {
            let part = &mut parts[position[&r.file] / batch];
            part.reads.push(*r);
            part.bytes += r.len;
            part.first_read_ns = part.first_read_ns.min(issue);
            part.ready_ns = part.ready_ns.max(done);
        }
        // The first batch starts with the burst (its opens included).
        parts[0].first_read_ns = parts[0].first_read_ns.min(s.first_read_ns);
        for i in 0..parts.len() {
            parts[i].wait_s = (parts[i].ready_ns - parts[i].first_read_ns).max(0) as f64 / 1e9;
            parts[i].interval_s = match parts.get(i + 1) {
                Some(next) => Some((next.first_read_ns - parts[i].ready_ns).max(0) as f64 / 1e9),
                None => s.interval_s,
            };
        }
        out.extend(parts);
    }
    // A batch split by a stalled read: consecutive bursts of fewer files than B whose files
    // together are B make one step.
    let mut steps = Vec::with_capacity(out.len());
    let mut i = 0;
    while i < out.len() {
        let mut files: HashSet<u32> = files_of(&out[i]).into_iter().collect();
        let mut j = i + 1;
        while files.len() < batch && j < out.len() {
            let mut union = files.clone();
            union.extend(files_of(&out[j]));
            if union.len() > batch {
                break;
            }
            files = union;
            j += 1;
        }
        if j > i + 1 && files.len() == batch {
            let mut s = out[i].clone();
            for next in &out[i + 1..j] {
                s.reads.extend_from_slice(&next.reads);
                s.bytes += next.bytes;
                s.samples += next.samples;
                s.ready_ns = s.ready_ns.max(next.ready_ns);
                s.interval_s = next.interval_s;
                s.period_s = match (s.period_s, next.period_s) {
                    (Some(a), Some(b)) => Some(a + b),
                    (a, b) => a.or(b),
                };
            }
            s.wait_s = (s.ready_ns - s.first_read_ns).max(0) as f64 / 1e9;
            steps.push(s);
            joined += 1;
            i = j;
        } else {
            steps.push(out[i].clone());
            i += 1;
        }
    }
    (steps, split, joined, deepest)
}

#[cfg(test)]
mod tests;
