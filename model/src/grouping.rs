//! Which processes are one GPU (the model's part 1): the trace's processes and the
//! pipes they hand data through (`Processes`), where the GPUs' data comes from
//! (`DataReads`), and the groups of a rank and its workers that are GPUs (`group`), with
//! the launchers and the groups that read a sliver left out.

use std::collections::{BTreeMap, HashMap, HashSet};

use trainio_schema::OwnedRow;

use crate::input::{is_data_read, Input};
use crate::job::LeftOut;
use crate::options::{Grouping, Options};

/// The name PyTorch's DataLoader workers give themselves.
pub const WORKER_COMM: &str = "pt_data_worker";
/// Workers decide the data device when they read at least this share of all bytes read.
const WORKER_DEV_SHARE: f64 = 0.05;
/// Groups reading less than this share of the largest group's bytes are not GPUs.
const MINOR_GROUP_SHARE: f64 = 0.01;

#[derive(Default)]
struct Proc {
    ppid: Option<u32>,
    comm: Option<String>,
    worker_name: bool,
}

/// The trace's processes (parents, names, worker names) and the handoff edges between
/// them: pipes and sockets written by one process and read or polled by another.
pub(crate) struct Processes<'a> {
    procs: HashMap<u32, Proc>,
    writers: HashMap<&'a str, HashSet<u32>>,
    readers: HashMap<&'a str, HashSet<u32>>,
}

impl<'a> Processes<'a> {
    pub fn new(input: &'a Input) -> Self {
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
        Processes { procs, writers, readers }
    }

    /// The process's name, else `fallback`.
    pub fn comm_of(&self, pid: u32, fallback: &str) -> String {
        self.procs.get(&pid).and_then(|p| p.comm.clone()).unwrap_or_else(|| fallback.to_string())
    }

    pub fn ppid(&self, pid: u32) -> Option<u32> {
        self.procs.get(&pid).and_then(|p| p.ppid)
    }

    fn worker_name(&self, pid: u32) -> bool {
        self.procs.get(&pid).is_some_and(|p| p.worker_name)
    }

    /// `from` writes a pipe or socket that `to` reads or polls.
    fn hands_off(&self, from: u32, to: u32) -> bool {
        self.writers.iter().any(|(f, w)| w.contains(&from) && self.readers.get(f).is_some_and(|r| r.contains(&to)))
    }

    fn is_worker(&self, pid: u32) -> bool {
        self.procs.get(&pid).is_some_and(|p| p.worker_name || p.ppid.is_some_and(|pp| self.hands_off(pid, pp)))
    }
}

/// The data device and the reads on it, with the bytes and name of each reading process.
pub(crate) struct DataReads<'a> {
    /// `MAJ:MIN`; None when no read names a device.
    pub dev: Option<String>,
    /// The workers' reads named the device (`data_device`).
    pub by_workers: bool,
    /// Data reads (`is_data_read`) on the device.
    pub rows: Vec<&'a OwnedRow>,
    pub bytes: BTreeMap<u32, u64>,
    pub comm: HashMap<u32, String>,
}

impl<'a> DataReads<'a> {
    pub fn new(input: &'a Input, opts: &Options, procs: &Processes) -> Self {
        let reads: Vec<&OwnedRow> = input.file.iter().filter(|r| is_data_read(r)).collect();
        let (dev, by_workers) = match &opts.dev {
            Some(d) => (Some(d.clone()), false),
            None => data_device(&reads, &|pid| procs.is_worker(pid)),
        };
        let mut data = DataReads { dev, by_workers, rows: Vec::new(), bytes: BTreeMap::new(), comm: HashMap::new() };
        data.rows = reads.into_iter().filter(|r| data.on_dev(r)).collect();
        for r in &data.rows {
            *data.bytes.entry(r.pid).or_default() += r.bytes as u64;
            data.comm.entry(r.pid).or_insert_with(|| r.comm.to_string());
        }
        data
    }

    /// The row is on the data device, or one of them names no device.
    pub fn on_dev(&self, r: &OwnedRow) -> bool {
        self.dev.is_none() || r.dev.is_none() || r.dev.as_deref() == self.dev.as_deref()
    }

    /// When the workers named the data device and the trace names its block layer (a
    /// file system on a whole disk), only that device's block reads are compared with
    /// the file layer: a rank paging in its libraries from the root disk while its
    /// workers read the data says nothing of whether the file layer saw the data's reads.
    pub fn dev_blocks<'i>(&self, input: &'i Input) -> Option<&'i HashMap<(u32, i64), u64>> {
        self.dev.as_deref().filter(|_| self.by_workers).and_then(|d| input.block_dev_reads.get(d))
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

/// The GPUs found, and the reading processes that are not one.
pub(crate) struct Groups {
    /// How the GPUs were found (`JobModel::grouping`).
    pub desc: String,
    /// Each GPU's rank and its workers, by rank pid.
    pub gpus: BTreeMap<u32, Vec<u32>>,
    /// A worker's rank, and why it is a worker.
    pub worker_of: HashMap<u32, (u32, String)>,
    pub left_out: Vec<LeftOut>,
}

/// Groups the reading processes into GPUs as `opts.grouping` says.
pub(crate) fn group(
    input: &Input,
    opts: &Options,
    procs: &Processes,
    data: &DataReads,
    warnings: &mut Vec<String>,
) -> Groups {
    let (reader_bytes, reader_comm) = (&data.bytes, &data.comm);
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
                    match procs.ppid(cur) {
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
                        comm: procs.comm_of(pid, &reader_comm[&pid]),
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
            worker_of = auto_workers(procs, reader_bytes);
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
                    comm: procs.comm_of(pid, &reader_comm[&pid]),
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
                match procs.ppid(cur) {
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
    // A group that reads a sliver of the largest group's bytes (a launcher reading its
    // configuration, an interpreter loading modules) is no GPU either.
    let group_bytes = |rank: u32, ws: &[u32]| -> u64 {
        reader_bytes.get(&rank).copied().unwrap_or(0) + ws.iter().map(|w| reader_bytes[w]).sum::<u64>()
    };
    let largest = groups.iter().map(|(r, ws)| group_bytes(*r, ws)).max().unwrap_or(0);
    let mut gpus = BTreeMap::new();
    for (rank, ws) in groups {
        let bytes = group_bytes(rank, &ws);
        if (bytes as f64) < MINOR_GROUP_SHARE * largest as f64 {
            let why = format!(
                "its group reads {:.2}% of the largest GPU's bytes: not a GPU",
                100.0 * bytes as f64 / largest.max(1) as f64
            );
            leave_out_group(&mut left_out, rank, &ws, &why);
        } else {
            gpus.insert(rank, ws);
        }
    }
    Groups { desc: grouping_desc, gpus, worker_of, left_out }
}

/// Each reading process that is a worker of its parent (named `pt_data_worker`, or
/// handing off to it), with the rank it reads for and why it is a worker.
fn auto_workers(procs: &Processes, reader_bytes: &BTreeMap<u32, u64>) -> HashMap<u32, (u32, String)> {
    let mut worker_of: HashMap<u32, (u32, String)> = HashMap::new();
    for &pid in reader_bytes.keys() {
        let Some(parent) = procs.ppid(pid) else { continue };
        let named = procs.worker_name(pid);
        let handoff = procs.hands_off(pid, parent);
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
    worker_of
}
