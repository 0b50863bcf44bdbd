//! Whether the file layer saw the data (the model's part 5): the block-layer bytes each
//! traced process caused against its file-layer reads. Reads through mmap (their page
//! faults, mapped.rs) count as reads; io_uring reads are file-layer rows only when
//! recorded with `--io-uring`. A trace whose file layer lacks most of the GPUs' data is
//! marked incomplete, and replay refuses it unless told otherwise.

use std::collections::{HashMap, HashSet};

use trainio_schema::OwnedRow;

use crate::evidence::JobEvidence;
use crate::grouping::Processes;
use crate::input::{rows_of, NS_PER_S};
use crate::job::{Coverage, GpuModel};

/// A trace is incomplete when more than this share of its traced processes' block reads
/// has no file-layer read behind it (and that is at least INCOMPLETE_MIN_BYTES).
const INCOMPLETE_SHARE: f64 = 0.5;
const INCOMPLETE_MIN_BYTES: u64 = 16 << 20;

/// Per traced process with block reads: its block bytes against its file-layer bytes,
/// sorted by block bytes; and the reason the trace is incomplete, if it is.
pub(crate) fn coverage(
    job: &JobEvidence,
    procs: &Processes,
    gpus: &[GpuModel],
    warnings: &mut Vec<String>,
) -> (Vec<Coverage>, Option<String>) {
    let (input, ix) = (job.input, job.ix);
    let dev_blocks = job.data.dev_blocks(input);
    let block_reads = dev_blocks.unwrap_or(&input.block_reads);
    let counted_read = |r: &OwnedRow| &*r.op == "read" && r.bytes > 0 && (dev_blocks.is_none() || job.data.on_dev(r));
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
            comm: procs.comm_of(pid, "?"),
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
            cur = procs.ppid(cur)?;
        }
        None
    };
    for g in gpus {
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
    if !input.has_block && !job.data.rows.is_empty() {
        warnings.push(
            "no block layer in the trace: cannot check that the file layer saw every read (mmap, io_uring)".into(),
        );
    }
    (coverage, incomplete)
}
