//! The model on rows shaped as the recorder writes them for a PyTorch job: ranks under a
//! launcher, DataLoader workers handing batches over a pipe, or ranks reading themselves.
#![allow(clippy::too_many_arguments)] // row builders take a row's fields positionally
use super::*;
use std::sync::Arc;
use trainio_schema::{Layer, OwnedRow};

const MS: i64 = 1_000_000;
const MIB: u64 = 1 << 20;

pub(crate) fn row(layer: Layer, op: &str, pid: u32, tid: u32, comm: &str, issue: i64, complete: i64) -> OwnedRow {
    OwnedRow {
        layer,
        op: Arc::from(op),
        issue_ns: issue,
        complete_ns: complete,
        insert_ns: None,
        dev: None,
        offset: None,
        bytes: 0,
        bytes_requested: 0,
        queue_depth: 0,
        pid,
        tid,
        comm: Arc::from(comm),
        fd: None,
        file: None,
        error: 0,
        flags: 0,
        rpc: None,
        ppid: None,
        object: None,
    }
}

fn proc_row(op: &str, pid: u32, ppid: u32, comm: &str, t: i64) -> OwnedRow {
    OwnedRow { ppid: Some(ppid), ..row(Layer::Proc, op, pid, pid, comm, t, t) }
}

fn file_read(pid: u32, comm: &str, file: &str, offset: i64, len: i64, issue: i64, dur: i64) -> OwnedRow {
    OwnedRow {
        dev: Some(Arc::from("7:3")),
        offset: Some(offset),
        bytes: len,
        bytes_requested: len,
        queue_depth: 1,
        fd: Some(5),
        file: Some(Arc::from(file)),
        ..row(Layer::File, "read", pid, pid, comm, issue, issue + dur)
    }
}

fn file_open(pid: u32, comm: &str, file: &str, t: i64) -> OwnedRow {
    OwnedRow {
        dev: Some(Arc::from("7:3")),
        fd: Some(5),
        file: Some(Arc::from(file)),
        ..row(Layer::File, "open", pid, pid, comm, t, t + 20_000)
    }
}

fn ipc(op: &str, pid: u32, tid: u32, comm: &str, pipe: &str, issue: i64, complete: i64, bytes: i64) -> OwnedRow {
    OwnedRow { file: Some(Arc::from(pipe)), fd: Some(9), bytes, ..row(Layer::Ipc, op, pid, tid, comm, issue, complete) }
}

/// One rank with `workers` DataLoader workers: each batch is `batch` samples of 1 MiB,
/// read in `read_ms` by the worker; the rank computes `compute_ms` per step. Workers read
/// ahead up to 2 batches each; `read_ms` > compute × workers makes the job storage-bound.
/// Returns the rows and the rank's pid.
fn rank_with_workers(
    input: &mut Input,
    rank: u32,
    launcher: u32,
    workers: u32,
    batch: u32,
    read_ms: i64,
    compute_ms: i64,
    steps: u32,
) {
    rank_with_workers_ext(input, rank, launcher, workers, batch, read_ms, compute_ms, steps, None, 0);
}

/// A step's all-reduce after the compute: a runloop thread of the rank sends on the
/// collective's socket when the compute ends; the rank asks for its next batch `sync_ns`
/// later plus `peer_wait(k)` waiting for a slower rank.
struct Collective {
    sync_ns: i64,
    peer_wait: fn(usize) -> i64,
}

fn rank_with_workers_ext(
    input: &mut Input,
    rank: u32,
    launcher: u32,
    workers: u32,
    batch: u32,
    read_ms: i64,
    compute_ms: i64,
    steps: u32,
    collective: Option<&Collective>,
    decode_ms: i64,
) {
    let t0 = 1_000 * MS;
    input.proc_rows.push(proc_row("fork", rank, launcher, "python", t0));
    let pipe = format!("pipe:[{}]", 9000 + rank);
    let wpids: Vec<u32> = (0..workers).map(|w| rank * 10 + w + 1).collect();
    for &w in &wpids {
        input.proc_rows.push(proc_row("fork", w, rank, "python", t0 + MS));
        input
            .proc_rows
            .push(OwnedRow { comm: Arc::from(WORKER_COMM), ..proc_row("comm", w, rank, WORKER_COMM, t0 + 2 * MS) });
    }
    // Simulate PyTorch's loop: batch k goes to worker k mod W; a worker starts batch k
    // when it is at most 2W ahead of the rank and its previous batch is done.
    let n = steps as usize;
    let w = workers as usize;
    let mut worker_free = vec![t0 + 5 * MS; w];
    let mut ready = vec![0i64; n];
    let mut consumed = vec![0i64; n]; // when the rank took batch k (end of its pipe read)
    let mut rank_t = t0 + 5 * MS; // when the rank asks for the next batch
    let index_pipe = |wi: usize| format!("pipe:[{}]", 7000 + rank as usize * 10 + wi);
    // The first 2W batch indices go out when the iterator starts.
    for k in 0..(2 * w).min(n) {
        let at = t0 + 4 * MS + k as i64 * 10_000;
        input.ipc.push(ipc("write", rank, rank, "python", &index_pipe(k % w), at, at + 3_000, 40));
    }
    for k in 0..n {
        let wi = k % w;
        let allowed = if k >= 2 * w { consumed[k - 2 * w] } else { t0 + 5 * MS };
        let start = worker_free[wi].max(allowed);
        let mut t = start;
        input.ipc.push(ipc("read", wpids[wi], wpids[wi], WORKER_COMM, &index_pipe(wi), t, t + 5_000, 40));
        t += 10_000;
        for s in 0..batch {
            let f = format!("/data/r{rank}/s{k:04}_{s}.npz");
            input.file.push(file_open(wpids[wi], WORKER_COMM, &f, t));
            t += MS / 10;
            let per = read_ms * MS / batch as i64;
            input.file.push(file_read(wpids[wi], WORKER_COMM, &f, 0, MIB as i64, t, per));
            t += per + MS / 10;
            if s == 0 {
                t += decode_ms * MS; // the worker's CPU after its first read of the batch
            }
        }
        // The handoff: the worker's feeder thread writes header and payload.
        input.ipc.push(ipc("write", wpids[wi], wpids[wi] + 1000, "QueueFeederThread", &pipe, t, t + 20_000, 4));
        input.ipc.push(ipc(
            "write",
            wpids[wi],
            wpids[wi] + 1000,
            "QueueFeederThread",
            &pipe,
            t + 30_000,
            t + 50_000,
            300,
        ));
        ready[k] = t + 50_000;
        worker_free[wi] = t + 60_000;
        // The rank polls (blocking if the batch is not there yet), then reads it.
        let poll_end = rank_t.max(ready[k]) + 10_000;
        input.ipc.push(ipc("wait", rank, rank, "python", &pipe, rank_t, poll_end, 1));
        input.ipc.push(ipc("read", rank, rank, "python", &pipe, poll_end + 5_000, poll_end + 10_000, 4));
        input.ipc.push(ipc("read", rank, rank, "python", &pipe, poll_end + 12_000, poll_end + 20_000, 300));
        consumed[k] = poll_end + 20_000;
        // Having taken batch k, the rank sends batch k+2W's index to its worker.
        if k + 2 * w < n {
            input.ipc.push(ipc(
                "write",
                rank,
                rank,
                "python",
                &index_pipe(k % w),
                consumed[k] + 5_000,
                consumed[k] + 8_000,
                40,
            ));
        }
        rank_t = consumed[k] + compute_ms * MS;
        if let Some(c) = collective {
            // Unpickling the batch: torch's shared-memory handles arrive over a new socket
            // per batch (a send of the rank's main thread, not the collective's).
            let sharer = format!("socket:[{}]", 600_000 + rank as usize * 1000 + k);
            input.ipc.push(ipc("write", rank, rank, "python", &sharer, consumed[k] + 1_000, consumed[k] + 2_000, 20));
            let end = consumed[k] + 8_000 + compute_ms * MS;
            let socket = format!("socket:[{}]", 500_000 + rank);
            input.ipc.push(ipc("write", rank, rank + 50_000, "pt_gloo_runloop", &socket, end, end + 2_000, 48));
            rank_t = end + c.sync_ns + (c.peer_wait)(k);
        }
    }
}

/// A rank that reads its own samples (num_workers=0), then computes.
fn rank_alone(input: &mut Input, rank: u32, launcher: u32, batch: u32, read_ms: i64, compute_ms: i64, steps: u32) {
    let t0 = 1_000 * MS;
    input.proc_rows.push(proc_row("fork", rank, launcher, "python", t0));
    let mut t = t0 + 5 * MS;
    for k in 0..steps {
        for s in 0..batch {
            let f = format!("/data/r{rank}/s{k:04}_{s}.bin");
            input.file.push(file_open(rank, "python", &f, t));
            t += MS / 5;
            let per = read_ms * MS / batch as i64;
            input.file.push(file_read(rank, "python", &f, 0, MIB as i64, t, per));
            t += per + MS / 5;
        }
        // compute, plus 0-3 ms waiting for the other rank at the all-reduce
        t += compute_ms * MS + (k as i64 % 4) * MS;
    }
}

fn launcher_reads(input: &mut Input, pid: u32) {
    input.proc_rows.push(proc_row("start", pid, 1, "torchrun", 900 * MS));
    input.file.push(file_read(pid, "torchrun", "/data/config.yaml", 0, 4096, 950 * MS, MS));
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs()
}

#[test]
fn two_ranks_with_two_workers_each_are_two_gpus_compute_bound() {
    let mut input = Input::default();
    launcher_reads(&mut input, 100);
    rank_with_workers(&mut input, 200, 100, 2, 4, 20, 50, 40);
    rank_with_workers(&mut input, 300, 100, 2, 4, 20, 50, 40);
    let m = infer(&input, &Options::default()).unwrap();
    assert_eq!(m.gpus.len(), 2, "{:#?}", describe(&m));
    for g in &m.gpus {
        assert_eq!(g.workers, 2);
        assert_eq!(g.readers, 2);
        assert_eq!(g.step_signal, "handoff");
        assert_eq!(g.steps.len(), 40);
        assert_eq!(g.samples_per_step, 4.0);
        assert_eq!(g.bytes_per_step, 4.0 * MIB as f64);
        let c = g.compute_s.unwrap();
        assert!(close(c, 0.050, 0.01), "compute {c}");
        assert!(close(g.required_mib_s.unwrap(), 80.0, 0.01));
        assert!(!g.synchronous);
        assert_eq!(g.prefetch_batches, 4);
        assert!(g.members.iter().filter(|x| x.role == "worker").all(|x| x.why.contains("pt_data_worker")));
        // batch k comes from worker k mod 2
        assert!(g.steps.iter().enumerate().all(|(k, s)| s.reads.iter().all(|r| r.reader == (k % 2) as u32)));
        assert!(g.au_recorded.unwrap() > 0.95, "{:?}", g.au_recorded);
        // poll start to index write, less the poll: the rank's 25 µs of taking a batch
        assert!((g.handoff_s - 25e-6).abs() < 1e-6, "{}", g.handoff_s);
    }
    assert_eq!(m.left_out.len(), 1, "the launcher's config read");
    assert_eq!(m.left_out[0].pid, 100);
}

/// A job that stops at a step count while its workers have read ahead: the sampler has
/// 42 batches, the workers read and hand off all of them, the rank takes 40 and stops.
/// The last 2 are kept with their reads but not taken: no compute, not in the per-step
/// figures. One payload is read in two reads (a message larger than the pipe's buffer),
/// and still counts as one batch taken.
#[test]
fn batches_read_ahead_that_the_rank_never_took_are_kept_but_not_taken() {
    let mut input = Input::default();
    rank_with_workers(&mut input, 200, 100, 2, 4, 20, 50, 42);
    let pipe = "pipe:[9200]";
    let mut on_pipe: Vec<usize> = (0..input.ipc.len())
        .filter(|&i| input.ipc[i].pid == 200 && input.ipc[i].file.as_deref() == Some(pipe))
        .collect();
    on_pipe.sort_by_key(|&i| input.ipc[i].issue_ns);
    assert_eq!(on_pipe.len(), 42 * 3, "a poll, a header and a payload per batch");
    // The rank's gets of batches 40 and 41 never happen.
    let gone: std::collections::HashSet<usize> = on_pipe[40 * 3..].iter().copied().collect();
    let mut kept: Vec<OwnedRow> =
        input.ipc.iter().enumerate().filter(|(i, _)| !gone.contains(i)).map(|(_, r)| r.clone()).collect();
    // Batch 5's payload in two reads.
    let p = kept.iter().position(|r| r.pid == 200 && r.issue_ns == input.ipc[on_pipe[5 * 3 + 2]].issue_ns).unwrap();
    let whole = kept[p].clone();
    kept[p].bytes = 150;
    kept.insert(
        p + 1,
        OwnedRow { issue_ns: whole.complete_ns + 1_000, complete_ns: whole.complete_ns + 2_000, bytes: 150, ..whole },
    );
    input.ipc = kept;
    let m = infer(&input, &Options::default()).unwrap();
    let g = &m.gpus[0];
    assert_eq!(g.steps.len(), 42, "{}", describe(&m).join("\n"));
    assert_eq!(g.steps_taken, 40);
    assert!(g.steps[..40].iter().all(|s| s.taken) && g.steps[40..].iter().all(|s| !s.taken));
    assert_eq!(g.taken().len(), 40);
    assert_eq!((g.bytes, g.untaken_bytes), (42 * 4 * MIB, 2 * 4 * MIB));
    assert_eq!((g.samples, g.bytes_per_step), (160, 4.0 * MIB as f64));
    assert!(g.steps[39..].iter().all(|s| s.interval_s.is_none()), "no compute after the last batch taken");
    assert_eq!(m.steps, 40);
    assert!(g.au_recorded.unwrap() > 0.95, "{:?}", g.au_recorded);
    // The same job taking every batch has all of them taken.
    let mut whole = Input::default();
    rank_with_workers(&mut whole, 200, 100, 2, 4, 20, 50, 42);
    let m = infer(&whole, &Options::default()).unwrap();
    assert_eq!((m.gpus[0].steps_taken, m.gpus[0].untaken_bytes, m.steps), (42, 0, 42));
}

#[test]
fn storage_bound_waits_are_not_compute() {
    let mut input = Input::default();
    // 2 workers each taking 300 ms a batch: a batch every 150 ms for a 50 ms compute.
    rank_with_workers(&mut input, 200, 100, 2, 4, 300, 50, 30);
    let m = infer(&input, &Options::default()).unwrap();
    let g = &m.gpus[0];
    let c = g.compute_s.unwrap();
    assert!(close(c, 0.050, 0.01), "compute {c}");
    let p50 = g.interval_p50_s.unwrap();
    assert!(close(p50, 0.050, 0.02), "interval p50 {p50}");
    let au = g.au_recorded.unwrap();
    assert!(au < 0.45 && au > 0.25, "AU {au} for 50 ms of every ~150 ms");
    assert!(g.wait_s > 2.0, "the rank waited ~100 ms a step: {}", g.wait_s);
}

/// A worker's feeder thread (which writes its batches to the pipe) falls behind its main
/// thread on a busy host: batches 3 and 10 of worker 1 are written only 0.5 ms before
/// the batch after them, whose reads are done by then. The worker's gets of its batch
/// indices still bound each batch: every step is one batch of 4 samples.
#[test]
fn a_feeder_thread_late_by_a_batch_neither_merges_nor_moves_batches() {
    let mut input = Input::default();
    rank_with_workers(&mut input, 200, 100, 2, 4, 20, 50, 40);
    let worker = 2001;
    let mut writes: Vec<usize> =
        (0..input.ipc.len()).filter(|&i| input.ipc[i].pid == worker && input.ipc[i].tid == worker + 1000).collect();
    writes.sort_by_key(|&i| input.ipc[i].issue_ns);
    assert_eq!(writes.len(), 2 * 20, "a header and a payload per batch");
    for late in [3, 10] {
        let next = input.ipc[writes[2 * (late + 1)]].issue_ns;
        for (k, &i) in writes[2 * late..2 * late + 2].iter().enumerate() {
            let at = next - 500_000 + k as i64 * 30_000;
            input.ipc[i].issue_ns = at;
            input.ipc[i].complete_ns = at + 20_000;
        }
    }
    let m = infer(&input, &Options::default()).unwrap();
    let g = &m.gpus[0];
    assert_eq!(g.steps.len(), 40, "{}", describe(&m).join("\n"));
    for (k, s) in g.steps.iter().enumerate() {
        assert_eq!((s.samples, s.bytes), (4, 4 * MIB), "step {k}");
        assert!(s.reads.iter().all(|r| r.reader == (k % 2) as u32), "step {k}");
    }
    // The late batch (worker 2001 is the first forked: its batch s is step 2s) was
    // handed off after the worker had read its next one.
    let (late, next) = (&g.steps[2 * 3], &g.steps[2 * 4]);
    assert!(late.ready_ns > next.first_read_ns, "{late:?}");
}

#[test]
fn handoff_alone_groups_workers_without_their_names() {
    let mut input = Input::default();
    rank_with_workers(&mut input, 200, 100, 3, 2, 20, 50, 12);
    input.proc_rows.retain(|r| &*r.op != "comm");
    for r in input.file.iter_mut() {
        r.comm = Arc::from("python");
    }
    let m = infer(&input, &Options::default()).unwrap();
    assert_eq!(m.gpus.len(), 1);
    assert_eq!(m.gpus[0].workers, 3);
    assert!(m.gpus[0].members[1].why.contains("hands off"));
}

#[test]
fn ranks_reading_themselves_are_split_at_the_compute_gaps() {
    let mut input = Input::default();
    launcher_reads(&mut input, 100);
    rank_alone(&mut input, 200, 100, 4, 8, 50, 30);
    rank_alone(&mut input, 300, 100, 4, 40, 50, 30);
    let m = infer(&input, &Options::default()).unwrap();
    assert_eq!(m.gpus.len(), 2);
    for g in &m.gpus {
        assert_eq!(g.step_signal, "bursts");
        assert!(g.synchronous);
        assert_eq!(g.steps.len(), 30, "{}", describe(&m).join("\n"));
        assert_eq!(g.samples_per_step, 4.0);
        let c = g.compute_s.unwrap();
        // intervals are 50-53 ms plus 0.2 ms before the first open: p25 ~50.9 ms
        assert!(close(c, 0.051, 0.02), "compute {c}");
        // 0.2 ms before and after each of 4 reads, but not after the last: 1.4 ms of the
        // loader's own time per batch
        assert!((g.handoff_s - 1.4e-3).abs() < 1e-6, "{}", g.handoff_s);
    }
}

#[test]
fn per_process_and_explicit_ranks_override_the_grouping() {
    let mut input = Input::default();
    rank_with_workers(&mut input, 200, 100, 2, 4, 20, 50, 10);
    let m = infer(&input, &Options { grouping: Grouping::Process, ..Default::default() }).unwrap();
    assert_eq!(m.gpus.len(), 2, "each worker alone (the rank reads nothing)");
    let m = infer(&input, &Options { grouping: Grouping::Ranks(vec![200]), ..Default::default() }).unwrap();
    assert_eq!(m.gpus.len(), 1);
    assert_eq!(m.gpus[0].workers, 2);
    assert_eq!(Grouping::parse("200,300").unwrap(), Grouping::Ranks(vec![200, 300]));
    assert!(Grouping::parse("ranks").is_err());
}

#[test]
fn without_proc_rows_every_reader_is_a_gpu_and_a_note_says_so() {
    let mut input = Input::default();
    rank_alone(&mut input, 200, 100, 4, 8, 50, 10);
    input.proc_rows.clear();
    let m = infer(&input, &Options::default()).unwrap();
    assert_eq!(m.gpus.len(), 1);
    assert!(m.warnings.iter().any(|w| w.contains("no proc layer")));
}

#[test]
fn block_reads_the_file_layer_did_not_see_make_the_trace_incomplete() {
    let mut input = Input { has_block: true, ..Input::default() };
    // an io_uring reader: 1 GiB at the block layer, 34 KiB of library reads as syscalls
    input.proc_rows.push(proc_row("start", 500, 1, "trainio-replay", 0));
    input.file.push(OwnedRow {
        dev: Some(Arc::from("254:1")),
        ..file_read(500, "trainio-replay", "/lib/libc.so", 0, 34 << 10, MS, MS)
    });
    input.add_block_read(500, 2_000 * MS, 1 << 30);
    input.add_block_read(77, 2_000 * MS, 5 << 30); // another process on the host: not traced
    let m = infer(&input, &Options::default()).unwrap();
    let msg = m.incomplete.expect("incomplete");
    assert!(msg.contains("pid 500") && msg.contains("mmap or io_uring"), "{msg}");
    assert_eq!(m.coverage.len(), 1, "only traced processes count");
    // fio forks its job: the child reads through io_uring, the parent only its libraries
    let mut input = Input { has_block: true, ..Input::default() };
    input.proc_rows.push(proc_row("start", 600, 1, "fio", 0));
    input.proc_rows.push(proc_row("fork", 601, 600, "fio", 2 * MS));
    input.file.push(OwnedRow {
        dev: Some(Arc::from("254:0")),
        ..file_read(600, "fio", "/lib/libaio.so", 0, 60 << 10, MS, MS)
    });
    input.add_block_read(601, 3 * MS, 64 * MIB);
    let m = infer(&input, &Options::default()).unwrap();
    let msg = m.incomplete.expect("the child's reads are the GPU's");
    assert!(msg.contains("pid 601"), "{msg}");
    // buffered reads the file layer saw are complete
    let mut input = Input { has_block: true, ..Input::default() };
    rank_alone(&mut input, 200, 100, 4, 8, 50, 10);
    input.add_block_read(200, 1_100 * MS, 40 * MIB);
    // a launcher that faulted in its libraries through mmap: noted, not incomplete
    input.proc_rows.push(proc_row("start", 100, 1, "torchrun", 0));
    input.add_block_read(100, 500 * MS, 600 * MIB);
    // the rank's own imports, before its first data read
    input.add_block_read(200, 200 * MS, 300 * MIB);
    let m = infer(&input, &Options::default()).unwrap();
    assert!(m.incomplete.is_none(), "{:?}", m.incomplete);
    assert!(m.warnings.iter().any(|w| w.contains("pid 100") && w.contains("no GPU")), "{:?}", m.warnings);
}

#[test]
fn the_step_gap_is_the_largest_jump() {
    let gaps = [200_000, 300_000, 250_000, 51 * MS, 50 * MS, 400_000, 52 * MS];
    let (g, found) = step_gap_ns(&gaps);
    assert!(found);
    assert!(g > 400_000 && g < 50 * MS, "{g}");
    let (g, found) = step_gap_ns(&[MS, MS, MS]);
    assert!(!found);
    assert_eq!(g, 10 * MS);
}

fn file_write(pid: u32, file: &str, op: &str, offset: i64, len: i64, issue: i64, dur: i64) -> OwnedRow {
    OwnedRow {
        dev: Some(Arc::from("7:3")),
        offset: (op == "write").then_some(offset),
        bytes: if op == "write" { len } else { 0 },
        bytes_requested: len,
        fd: Some(7),
        file: Some(Arc::from(file)),
        ..row(Layer::File, op, pid, pid, "python", issue, issue + dur)
    }
}

#[test]
fn write_bursts_are_placed_after_the_steps_taken_before_them() {
    let mut input = Input::default();
    launcher_reads(&mut input, 100);
    rank_alone(&mut input, 200, 100, 4, 8, 50, 30);
    let m = infer(&input, &Options::default()).unwrap();
    let ready: Vec<i64> = m.gpus[0].steps.iter().map(|s| s.ready_ns).collect();
    // A module cache written before training, a checkpoint of two files after steps 10
    // and 20 (each 3 × 1 MiB written back to back, then fsync per file), and a log line by
    // the launcher, which is no GPU.
    input.file.push(file_write(200, "/app/__pycache__/m.pyc", "write", 0, 5000, 990 * MS, MS / 10));
    for (n, &after) in [10usize, 20].iter().enumerate() {
        let mut t = ready[after - 1] + 2 * MS;
        for f in ["model.pt", "optim.pt"] {
            let path = format!("/ckpt/{n}/{f}");
            for k in 0..3 {
                input.file.push(file_write(200, &path, "write", k * MIB as i64, MIB as i64, t, MS));
                t += MS + MS / 10;
            }
            input.file.push(file_write(200, &path, "fsync", 0, 0, t, 3 * MS));
            t += 3 * MS + MS / 10;
        }
    }
    input.file.push(file_write(100, "/logs/run.txt", "write", 0, 80, ready[25], MS / 10));
    // The rank's results file on another file system (the root's, 254:0), after the last
    // step: no load on the data's storage, so not the GPU's, and a warning says so.
    let end = ready[29] + 5 * MS;
    input.file.push(OwnedRow {
        dev: Some(Arc::from("254:0")),
        ..file_write(200, "/tmp/results.json", "write", 0, 3248, end, MS / 10)
    });
    input.file.push(OwnedRow {
        dev: Some(Arc::from("254:0")),
        ..file_write(200, "/tmp/results.json", "fsync", 0, 0, end + MS, MS)
    });
    let m = infer(&input, &Options::default()).unwrap();
    assert!(
        m.warnings.iter().any(|w| w.contains("2 writes and syncs (3248 bytes) on other devices than the data's (7:3)")
            && w.ends_with("254:0")),
        "{:?}",
        m.warnings
    );
    let g = &m.gpus[0];
    assert_eq!(g.steps.len(), 30, "writes do not change the steps");
    let placed: Vec<(Option<u64>, u64, u64, u32)> =
        g.write_bursts.iter().map(|b| (b.after_step, b.bytes, b.syncs, b.files)).collect();
    assert_eq!(placed, vec![(None, 5000, 0, 1), (Some(10), 6 * MIB, 2, 2), (Some(20), 6 * MIB, 2, 2)]);
    let ops = &g.write_bursts[1].ops;
    assert_eq!(ops.len(), 8);
    assert_eq!(ops[3].sync, Some("fsync"));
    assert_eq!((ops[4].offset, ops[4].len, ops[4].sync), (0, MIB, None));
    // A copy of each checkpoint file needs its 3 MiB.
    let sizes: Vec<u64> = g.write_files.iter().filter(|(p, _)| p.starts_with("/ckpt/")).map(|f| f.1).collect();
    assert_eq!(sizes, vec![3 * MIB; 4]);
    // The job: every process's bursts, the launcher's log among them.
    let w = &m.writes;
    assert_eq!(w.count, 5);
    assert_eq!(w.bytes, 12 * MIB + 5000 + 80 + 3248);
    assert_eq!(w.syncs, 5);
    let ck = &w.bursts[1];
    assert!((ck.duration_s - ((ck.end_ns - ck.start_ns) as f64 / 1e9)).abs() < 1e-12);
    assert!(close(ck.mib_s, 6.0 / ck.duration_s, 1e-9));
    let starts: Vec<i64> = w.bursts.iter().map(|b| b.start_ns).collect();
    let interval = (starts[4] - starts[0]) as f64 / 4e9;
    assert!(close(w.interval_s.unwrap(), interval, 1e-9));
    assert!(
        describe(&m).iter().any(|l| l.contains("writes: 3 burst(s) after steps start,10,20")),
        "{:?}",
        describe(&m)
    );
}

/// A rank whose loader threads (not processes, no handoff in the trace) read ahead: per
/// epoch, a first burst of `fill` whole batches read back to back (the prefetch queue
/// filling), then one batch per `compute_ms` as the GPU frees a slot; `batch` samples of
/// 1 MiB, each read by one of 4 threads in 2 ms, 4 at a time, 0.1 ms apart.
fn rank_with_reader_threads(
    input: &mut Input,
    rank: u32,
    fill: u32,
    batch: u32,
    compute_ms: i64,
    epochs: u32,
    per_epoch: u32,
) {
    input.proc_rows.push(proc_row("fork", rank, 100, "python", 1_000 * MS));
    let mut t = 1_010 * MS;
    let mut sample = 0u32;
    let mut burst = |input: &mut Input, at: i64, batches: u32| {
        for i in 0..batches * batch {
            let f = format!("/data/r{rank}/s{sample:05}.bin");
            sample += 1;
            let (tid, slot) = (rank * 100 + i % 4, (i / 4) as i64);
            let issue = at + slot * 2_200_000 + (i % 4) as i64 * 10_000;
            input.file.push(OwnedRow { tid, ..file_open(rank, "python", &f, issue - 50_000) });
            input.file.push(OwnedRow { tid, ..file_read(rank, "python", &f, 0, MIB as i64, issue, 2 * MS - 20_000) });
        }
    };
    for _ in 0..epochs {
        burst(input, t, fill);
        // The GPU takes the first batch when the fill ends, then one per compute time;
        // each batch taken frees a slot that the loader refills at once.
        let filled = t + (fill * batch).div_ceil(4) as i64 * 2_200_000;
        for k in 0..per_epoch - fill {
            burst(input, filled + (k as i64 + 1) * compute_ms * MS, 1);
        }
        t = filled + (per_epoch as i64 + 4) * compute_ms * MS;
    }
}

#[test]
fn a_burst_of_whole_batches_read_ahead_is_split_into_its_steps() {
    let mut input = Input::default();
    rank_with_reader_threads(&mut input, 200, 5, 4, 50, 2, 20);
    let m = infer(&input, &Options::default()).unwrap();
    let g = &m.gpus[0];
    assert!(g.paced && !g.synchronous, "{}", describe(&m).join("\n"));
    assert_eq!(g.steps.len(), 40, "{}", describe(&m).join("\n"));
    assert!(g.steps.iter().all(|s| s.samples == 4 && s.bytes == 4 * MIB), "every step one batch");
    // Each step's reads are its own 4 samples' files, in the order they were read.
    let mut seen: Vec<u32> = Vec::new();
    for s in &g.steps {
        let mut files: Vec<u32> = s.reads.iter().map(|r| r.file).collect();
        files.sort_unstable();
        files.dedup();
        assert_eq!(files.len(), 4);
        assert!(files.iter().all(|f| !seen.contains(f)));
        seen.extend(files);
    }
    let c = g.compute_s.unwrap();
    assert!(close(c, 0.050, 0.01), "compute {c}");
    assert!(close(g.required_mib_s.unwrap(), 80.0, 0.01), "{:?}", g.required_mib_s);
    // The fill's period is shared by its 5 batches: the recorded pace is kept.
    let span: f64 = g.steps.iter().filter_map(|s| s.period_s).sum();
    let starts = (g.steps.last().unwrap().first_read_ns - g.steps[0].first_read_ns) as f64 / 1e9;
    assert!(close(span - g.steps.last().unwrap().period_s.unwrap(), starts, 1e-6), "{span} vs {starts}");
    assert!(m.warnings.iter().any(|w| w.contains("2 burst(s) held several whole batches")), "{:?}", m.warnings);
    // The loader read 5 batches ahead at each epoch's start: the replay's may too.
    assert_eq!(g.prefetch_batches, 5);
}

#[test]
fn a_burst_that_is_not_whole_batches_stays_one_step() {
    let mut input = Input::default();
    rank_with_reader_threads(&mut input, 200, 1, 4, 50, 1, 12);
    // One extra 2-sample read-ahead joins the 4th burst: 6 samples, not whole batches.
    let at = input.file.iter().filter(|r| &*r.op == "read").nth(12).unwrap().issue_ns;
    for i in 0..2 {
        let f = format!("/data/r200/extra{i}.bin");
        input.file.push(OwnedRow { tid: 20_000 + i, ..file_open(200, "python", &f, at + 3 * MS) });
        input.file.push(OwnedRow {
            tid: 20_000 + i,
            ..file_read(200, "python", &f, 0, MIB as i64, at + 3 * MS + 50_000, MS)
        });
    }
    let m = infer(&input, &Options::default()).unwrap();
    let g = &m.gpus[0];
    assert_eq!(g.steps.len(), 12, "{}", describe(&m).join("\n"));
    assert_eq!(g.steps.iter().filter(|s| s.samples == 6).count(), 1);
    assert!(!m.warnings.iter().any(|w| w.contains("whole batches")), "{:?}", m.warnings);
}

#[test]
fn a_batch_split_by_a_stalled_read_is_joined_into_one_step() {
    let mut input = Input::default();
    rank_with_reader_threads(&mut input, 200, 3, 4, 50, 1, 20);
    // In the 10th single-batch burst, the last sample's read starts 20 ms late and takes
    // 5 ms: its burst ends before it, past the step gap, and it is a burst of its own.
    let reads: Vec<usize> = input.file.iter().enumerate().filter(|(_, r)| &*r.op == "read").map(|(i, _)| i).collect();
    let late = reads[4 * (3 + 9) + 3];
    input.file[late].issue_ns += 20 * MS;
    input.file[late].complete_ns = input.file[late].issue_ns + 5 * MS;
    let m = infer(&input, &Options::default()).unwrap();
    let g = &m.gpus[0];
    assert_eq!(g.steps.len(), 20, "{}", describe(&m).join("\n"));
    assert!(g.steps.iter().all(|s| s.bytes == 4 * MIB), "every step one batch");
    assert!(m.warnings.iter().any(|w| w.contains("1 batch(es) spread over several bursts")), "{:?}", m.warnings);
    let c = g.compute_s.unwrap();
    assert!(close(c, 0.050, 0.01), "compute {c}");
}

#[test]
fn a_fill_cut_by_a_stall_is_split_into_its_batches() {
    let mut input = Input::default();
    rank_with_reader_threads(&mut input, 200, 5, 4, 50, 2, 20);
    // In each epoch's fill (5 batches, 20 samples read 4 at a time), the last 5 samples
    // are read 20 ms late: the fill is two bursts of 15 and 5 files, neither whole batches.
    let reads: Vec<usize> = input.file.iter().enumerate().filter(|(_, r)| &*r.op == "read").map(|(i, _)| i).collect();
    let epoch = reads.len() / 2;
    for first in [0, epoch] {
        let from = input.file[reads[first + 15]].issue_ns;
        let to = input.file[reads[first + 19]].complete_ns;
        for r in input.file.iter_mut().filter(|r| r.issue_ns >= from && r.issue_ns <= to) {
            r.issue_ns += 20 * MS;
            r.complete_ns += 20 * MS;
        }
    }
    let m = infer(&input, &Options::default()).unwrap();
    let g = &m.gpus[0];
    assert_eq!(g.steps.len(), 40, "{}", describe(&m).join("\n"));
    assert!(g.steps.iter().all(|s| s.samples == 4 && s.bytes == 4 * MIB), "every step one batch");
    assert!(m.warnings.iter().any(|w| w.contains("held several whole batches")), "{:?}", m.warnings);
    assert!(close(g.required_mib_s.unwrap(), 80.0, 0.02), "{:?}", g.required_mib_s);
}

#[test]
fn a_few_long_gaps_at_a_jobs_start_end_and_epochs_are_not_the_step_gap() {
    // From a recording on a busy host: reads inside a batch µs apart, a loader running
    // behind now and then (3 to 15 ms between batches), the compute gaps 41 to 54 ms, and
    // the job's start, end and second epoch 249 to 307 ms. The jump from 15 to 41 ms is
    // under MIN_GAP_RATIO; the one below the three long gaps is above it.
    let mut gaps: Vec<i64> = (0..300).map(|i| 40_000 + (i % 18) * 50_000).collect();
    gaps.extend([2_140_000, 3_100_000, 5_720_000, 8_840_000, 10_070_000, 12_940_000, 14_540_000]);
    gaps.extend((0..36).map(|i| 41_020_000 + i * 350_000));
    gaps.extend([249_000_000, 249_500_000, 307_000_000]);
    let (g, found) = step_gap_ns(&gaps);
    assert!(found);
    assert!(g > 14_540_000 && g < 41_020_000, "{g}");
    // With few gaps in all (a short job), the largest jump is the step gap as before.
    let (g, found) = step_gap_ns(&[200_000, 300_000, 51 * MS, 50 * MS, 52 * MS]);
    assert!(found && g > 300_000 && g < 50 * MS, "{g}");
}

#[test]
fn a_trace_sets_model_is_every_hosts_gpus_on_one_clock() {
    // h1: one rank; h2: the same pid (another kernel), a slower reader, its clock 7 s
    // behind h1's (shift +7 s onto the set's clock).
    let (mut a, mut b) = (Input::default(), Input::default());
    launcher_reads(&mut a, 100);
    rank_alone(&mut a, 200, 100, 4, 8, 50, 10);
    launcher_reads(&mut b, 100);
    rank_alone(&mut b, 200, 100, 4, 40, 50, 12);
    let (ma, mb) = (infer(&a, &Options::default()).unwrap(), infer(&b, &Options::default()).unwrap());
    let first_b = mb.gpus[0].steps[0].first_read_ns;
    let m = combine(vec![("h1".into(), 0, ma.clone()), ("h2".into(), 7_000 * MS, mb.clone())]);
    assert_eq!(m.hosts, ["h1", "h2"]);
    let gpus: Vec<_> = m.gpus.iter().map(|g| (g.index, g.host.as_deref(), g.rank_pid, g.steps.len())).collect();
    assert_eq!(gpus, [(0, Some("h1"), 200, 10), (1, Some("h2"), 200, 12)]);
    assert_eq!(m.steps, 22);
    assert_eq!(m.gpus[1].steps[0].first_read_ns, first_b + 7_000 * MS);
    assert_eq!(m.gpus[0].steps[0].first_read_ns, ma.gpus[0].steps[0].first_read_ns);
    // the job's figures over both hosts' GPUs: the median of two is their mean
    let need = (ma.gpus[0].required_mib_s.unwrap() + mb.gpus[0].required_mib_s.unwrap()) / 2.0;
    assert!(close(m.required_mib_s_per_gpu.unwrap(), need, 1e-9));
    assert!(m.left_out.iter().all(|l| l.host.is_some()));
    assert!(describe(&m)[2].starts_with("  GPU 1 on h2: rank pid 200"), "{:?}", describe(&m));
}

#[test]
fn a_collectives_first_send_ends_the_compute() {
    // Every step: 50 ms of compute, then an all-reduce of 0.4 ms that waits 0-3 ms for
    // the other rank. The time to the next get holds all of it (its 10th percentile is
    // 50.4 ms); the first send on the collective's socket ends the compute.
    let coll = Collective { sync_ns: 400_000, peer_wait: |k| (k as i64 % 4) * MS };
    let mut input = Input::default();
    rank_with_workers_ext(&mut input, 200, 100, 2, 4, 20, 50, 40, Some(&coll), 0);
    let m = infer(&input, &Options::default()).unwrap();
    let g = &m.gpus[0];
    assert_eq!(g.step_signal, "handoff");
    assert_eq!(g.compute_signal, "collective", "{}", describe(&m).join("\n"));
    let c = g.compute_s.unwrap();
    assert!(close(c, 0.050, 0.001), "compute {c}");
    assert!(close(g.sync_s, 0.0004, 0.05), "sync {}", g.sync_s);
    // The same job with the collective's sends not in the trace (a transport the trace
    // does not see): compute from the next get, which holds the all-reduce.
    input.ipc.retain(|r| !r.file.as_deref().is_some_and(|f| f.starts_with("socket:[5")));
    let m = infer(&input, &Options::default()).unwrap();
    let g = &m.gpus[0];
    assert_eq!(g.compute_signal, "next_get");
    assert!(g.compute_s.unwrap() > 0.0504, "compute {:?}", g.compute_s);
    assert_eq!(g.sync_s, 0.0);
}

#[test]
fn sends_on_sockets_that_are_not_every_steps_are_no_collective() {
    // The per-batch sockets of the handoff are each sent on once: no collective.
    let mut input = Input::default();
    let coll = Collective { sync_ns: 400_000, peer_wait: |_| 0 };
    rank_with_workers_ext(&mut input, 200, 100, 2, 4, 20, 50, 40, Some(&coll), 0);
    // The collective's sends in 10 of the 40 steps only.
    let mut seen = 0;
    input.ipc.retain(|r| {
        if !r.file.as_deref().is_some_and(|f| f.starts_with("socket:[5")) {
            return true;
        }
        seen += 1;
        seen % 4 == 0
    });
    let m = infer(&input, &Options::default()).unwrap();
    assert_eq!(m.gpus[0].compute_signal, "next_get");
}

#[test]
fn an_inline_loaders_compute_ends_at_the_collective() {
    // A rank reading its own batch (no workers), then 50 ms of compute, then a 0.3 ms
    // all-reduce that waits 0-3 ms for the other rank.
    let mut input = Input::default();
    let (rank, t0) = (200u32, 1_000 * MS);
    input.proc_rows.push(proc_row("fork", rank, 100, "python", t0));
    let mut t = t0 + 5 * MS;
    for k in 0..30i64 {
        for s in 0..4 {
            let f = format!("/data/s{k:04}_{s}.bin");
            input.file.push(file_open(rank, "python", &f, t));
            t += MS / 5;
            input.file.push(file_read(rank, "python", &f, 0, MIB as i64, t, 2 * MS));
            t += 2 * MS + MS / 5;
        }
        t += 50 * MS;
        input.ipc.push(ipc("write", rank, rank + 7, "pt_gloo_runloop", "socket:[4242]", t, t + 2_000, 48));
        t += 300_000 + (k % 4) * MS;
    }
    let m = infer(&input, &Options::default()).unwrap();
    let g = &m.gpus[0];
    assert!(g.synchronous);
    assert_eq!(g.compute_signal, "collective");
    // the burst ends with its last read; 0.2 ms of the loader's own time follows it
    let c = g.compute_s.unwrap();
    assert!(close(c, 0.0502, 0.001), "compute {c}");
    assert!(close(g.sync_s, 0.0003, 0.05), "sync {}", g.sync_s);
}

/// A process's imports: `files` reads of 256 KiB on the root disk (`254:0`) at start-up.
fn imports(input: &mut Input, pid: u32, comm: &str, files: u32, t0: i64) {
    for i in 0..files {
        let f = format!("/usr/lib/python3/m{i}.pyc");
        let r = file_read(pid, comm, &f, 0, 256 << 10, t0 + i as i64 * MS / 10, MS / 20);
        input.file.push(OwnedRow { dev: Some(Arc::from("254:0")), ..r });
    }
}

#[test]
fn a_launcher_that_reads_more_than_a_rank_is_no_gpu() {
    // torchrun's agent (pid 100) imports as much as a rank reads, on the data's device
    // too (its own files there), and started both ranks: a launcher, not a GPU.
    let mut input = Input::default();
    input.proc_rows.push(proc_row("start", 100, 1, "pt_elastic", 900 * MS));
    for i in 0..200 {
        let f = format!("/data/agent/{i}.py");
        input.file.push(file_read(100, "pt_elastic", &f, 0, MIB as i64, 901 * MS + i * 10_000, 5_000));
    }
    rank_with_workers(&mut input, 200, 100, 2, 4, 20, 50, 20);
    rank_with_workers(&mut input, 300, 100, 2, 4, 20, 50, 20);
    let m = infer(&input, &Options::default()).unwrap();
    assert_eq!(m.gpus.iter().map(|g| g.rank_pid).collect::<Vec<_>>(), vec![200, 300], "{:#?}", describe(&m));
    let agent = m.left_out.iter().find(|l| l.pid == 100).expect("the agent is left out");
    assert!(agent.why.contains("launcher") && agent.why.contains("200, 300"), "{}", agent.why);
}

#[test]
fn the_data_device_is_where_the_workers_read_not_where_imports_are() {
    // Each rank imports 120 MiB from the root disk, more than the 80 MiB of samples its
    // workers read from 7:3: the data is the workers'.
    let mut input = Input::default();
    for rank in [200, 300] {
        imports(&mut input, rank, "python", 480, 950 * MS);
        rank_with_workers(&mut input, rank, 100, 2, 4, 20, 50, 20);
    }
    let m = infer(&input, &Options::default()).unwrap();
    assert_eq!(m.data_dev.as_deref(), Some("7:3"), "{:#?}", describe(&m));
    assert_eq!(m.gpus.len(), 2);
    assert!(m.gpus.iter().all(|g| g.steps.len() == 20 && g.samples_per_step == 4.0));
}

#[test]
fn a_workers_time_outside_its_reads_is_its_cpu_per_sample() {
    // rank_with_workers: per batch of 4, the worker reads 4 x 5 ms and spends 0.1 ms
    // before and after each open between its reads, 0.7 ms from its first read to the
    // handoff outside the reads: 0.175 ms per sample, 0.7 / 20.7 of the batch's time.
    let mut input = Input::default();
    rank_with_workers(&mut input, 200, 100, 2, 4, 20, 50, 20);
    let m = infer(&input, &Options::default()).unwrap();
    let g = &m.gpus[0];
    let per = g.worker_cpu_s_per_sample.unwrap();
    assert!(close(per, 0.175e-3, 0.01), "{per}");
    assert!(close(g.worker_cpu_share.unwrap(), 0.7 / 20.7, 0.01), "{:?}", g.worker_cpu_share);
    assert!(describe(&m).iter().any(|l| l.contains("worker CPU per sample 0.17 ms")), "{:#?}", describe(&m));
    // Without workers there is no worker time.
    let mut input = Input::default();
    rank_alone(&mut input, 200, 100, 4, 20, 50, 10);
    let m = infer(&input, &Options::default()).unwrap();
    assert_eq!(m.gpus[0].worker_cpu_s_per_sample, None);
}

#[test]
fn a_workers_time_is_kept_after_the_read_it_follows() {
    // Per batch of 4 reads of 5 ms: 30 ms of decoding after the first read (a JPEG
    // loader importing PIL's plugins), then the other three back to back, 0.2 ms apart
    // (an open between), and 0.1 ms from the last read to the handoff.
    let mut input = Input::default();
    rank_with_workers_ext(&mut input, 200, 100, 2, 4, 20, 50, 20, None, 30);
    let m = infer(&input, &Options::default()).unwrap();
    let g = &m.gpus[0];
    assert_eq!(g.steps.len(), 20, "{}", describe(&m).join("\n"));
    for (k, s) in g.steps.iter().enumerate() {
        let after: Vec<u64> = s.reads.iter().map(|r| r.cpu_after_ns).collect();
        assert_eq!(after, [30_200_000, 200_000, 200_000, 100_000], "step {k}");
        let cpu = s.worker_cpu_s.unwrap();
        assert!((after.iter().sum::<u64>() as f64 - cpu * 1e9).abs() < 2.0, "step {k}: {after:?} against {cpu}");
    }
}

fn mapped(op: &str, pid: u32, file: &str, dev: &str, offset: i64, len: i64, t: i64) -> OwnedRow {
    OwnedRow {
        dev: Some(Arc::from(dev)),
        offset: Some(offset),
        bytes: len,
        bytes_requested: len,
        file: Some(Arc::from(file)),
        ..row(Layer::File, op, pid, pid, "python", t, t)
    }
}

fn mmap_row(pid: u32, file: &str, dev: &str, len: i64, prot: u32, t: i64) -> OwnedRow {
    OwnedRow { bytes: 0, fd: Some(7), flags: prot | 0x100, ..mapped("mmap", pid, file, dev, 0, len, t) }
}

/// A rank that reads its samples from one Arrow file through mmap (HF datasets), each
/// 1 MiB sample as a fault and the fault-arounds that map its 16-page windows (each
/// window's first page faulted too, as a fault-around that found nothing cached is
/// followed by the fault), after faulting in a shared library it mapped executable.
fn rank_reading_through_mmap(input: &mut Input, rank: u32, steps: u32, batch: u32) {
    let (data, lib) = ("/data/train/data-00000.arrow", "/usr/lib/libarrow.so");
    input.proc_rows.push(proc_row("fork", rank, 100, "python", 900 * MS));
    input.file.push(mmap_row(rank, lib, "254:0", 64 * MIB as i64, 1 | 4, 910 * MS));
    for p in 0..2048 {
        input.file.push(mapped("map_pages", rank, lib, "254:0", p * 16 * 4096, 16 * 4096, 920 * MS + p * 10_000));
    }
    input.file.push(mmap_row(rank, data, "7:3", 1 << 30, 1, 990 * MS));
    let mut t = 1_000 * MS;
    for k in 0..steps {
        for s in 0..batch {
            let base = ((k * batch + s) as i64) << 20;
            for w in 0..16 {
                let at = base + w * 16 * 4096;
                input.file.push(mapped("map_pages", rank, data, "7:3", at, 16 * 4096, t));
                input.file.push(mapped("fault", rank, data, "7:3", at, 4096, t + 1_000));
                // a second fault-around over half of this window and half of the next
                input.file.push(mapped("map_pages", rank, data, "7:3", at + 8 * 4096, 16 * 4096, t + 100_000));
                t += MS / 4;
            }
        }
        input.add_block_read(rank, t, batch as u64 * MIB);
        t += 50 * MS;
    }
}

#[test]
fn reads_through_mmap_are_the_gpus_data_reads() {
    let mut input = Input { has_block: true, ..Input::default() };
    rank_reading_through_mmap(&mut input, 200, 30, 4);
    let m = infer(&input, &Options::default()).unwrap();
    assert!(m.incomplete.is_none(), "{:?}", m.incomplete);
    assert_eq!(m.data_dev.as_deref(), Some("7:3"), "the data device, not the library's");
    assert_eq!(m.gpus.len(), 1, "{}", describe(&m).join("\n"));
    let g = &m.gpus[0];
    assert_eq!(g.steps.len(), 30, "{}", describe(&m).join("\n"));
    // each page once, however many fault-arounds and faults cover it; the last window's
    // second fault-around reaches half a window into the next (unread) sample
    assert_eq!(g.bytes, 120 * MIB + 8 * 4096);
    assert!(close(g.bytes_per_step, 4.0 * MIB as f64, 0.01), "{}", g.bytes_per_step);
    assert_eq!(g.files.iter().map(|(f, _)| f.as_str()).collect::<Vec<_>>(), ["/data/train/data-00000.arrow"]);
    let c = g.compute_s.unwrap();
    assert!(close(c, 0.050, 0.02), "compute {c}");
    let cov = m.coverage.iter().find(|c| c.pid == 200).unwrap();
    assert_eq!(cov.file_read_bytes, g.bytes);

    // The same trace without its mapped reads (a trace before schema 1.6): incomplete.
    input.file.retain(|r| !mapped::is_mapped(r));
    let m = infer(&input, &Options::default()).unwrap();
    let why = m.incomplete.expect("without them the file layer holds no data read");
    assert!(why.contains("120.0 MiB of block reads"), "{why}");
}

/// Workers reading shuffled rows of two Arrow files through the rank's mapping (HF
/// `datasets`): no open per sample, so a batch's samples are its runs of pages, not the
/// files it touched (4 samples in at most 2 files). A sample's rows may leave a gap (a
/// large folio mapped by one fault), and a worker reads each file's header first.
#[test]
fn shuffled_rows_read_through_a_mapping_are_counted_as_samples() {
    let mut input = Input { has_block: true, ..Input::default() };
    rank_with_workers(&mut input, 200, 100, 2, 4, 20, 50, 20);
    let files = ["/data/train/data-00000.arrow", "/data/train/data-00001.arrow"];
    for f in files {
        input.file.push(mmap_row(200, f, "7:3", 64 * MIB as i64, 1, 990 * MS));
    }
    input.file.retain(|r| &*r.op != "open");
    let (mut extra, mut headers) = (Vec::new(), std::collections::HashSet::new());
    let (half, folio) = (MIB as i64 / 2, 65536);
    let mut row = 0i64;
    for r in input.file.iter_mut().filter(|r| &*r.op == "read") {
        // rows 0, 7, 14, ... of 80 (1 MiB each, after the 1 MiB header), split over the
        // two files: a batch's rows are never adjacent
        row = (row + 7) % 80;
        let (file, at) = (files[(row % 2) as usize], (row / 2 + 1) << 20);
        let (pid, t) = (r.pid, r.issue_ns);
        *r = OwnedRow { fd: None, queue_depth: 0, ..mapped("map_pages", pid, file, "7:3", at, half, t) };
        extra.push(mapped("map_pages", pid, file, "7:3", at + half + folio, half - folio, t + 1_000));
        if headers.insert((pid, file)) {
            extra.push(mapped("map_pages", pid, file, "7:3", 0, folio, t - 1_000));
        }
    }
    input.file.append(&mut extra);
    input.add_block_read(200, 2_000 * MS, 80 * MIB);
    let m = infer(&input, &Options::default()).unwrap();
    let g = &m.gpus[0];
    assert_eq!(g.steps.len(), 20, "{}", describe(&m).join("\n"));
    assert!(g.steps.iter().all(|s| s.reads.iter().all(|r| r.mapped)));
    // page faults are instants: no worker time to place after them
    assert!(g.steps.iter().all(|s| s.worker_cpu_s.is_none() && s.reads.iter().all(|r| r.cpu_after_ns == 0)));
    assert_eq!(g.samples_per_step, 4.0, "{}", describe(&m).join("\n"));
    // each sample less its folio's 64 KiB, and each worker's two headers
    assert_eq!(g.bytes, 80 * (MIB - folio as u64) + 2 * 2 * folio as u64);
}

#[test]
fn a_new_mapping_of_a_file_counts_its_pages_again() {
    let f = "/data/x.npy";
    let rows = vec![
        mmap_row(5, f, "7:3", 1 << 20, 1, 0),
        mapped("map_pages", 5, f, "7:3", 0, 16 * 4096, MS),
        mapped("map_pages", 5, f, "7:3", 0, 16 * 4096, 2 * MS),
        // another process's mapping of the same pages is its own
        mapped("fault", 6, f, "7:3", 4096, 4096, 2 * MS),
        mmap_row(5, f, "7:3", 1 << 20, 1, 3 * MS),
        mapped("fault", 5, f, "7:3", 4096, 4096, 4 * MS),
    ];
    let reads = mapped::reads(&rows, &[]);
    let got: Vec<_> = reads.iter().map(|r| (r.pid, r.offset.unwrap(), r.bytes, r.issue_ns)).collect();
    assert_eq!(got, [(5, 0, 16 * 4096, MS), (6, 4096, 4096, 2 * MS), (5, 4096, 4096, 4 * MS)]);
    assert!(reads.iter().all(|r| &*r.op == "read" && r.fd.is_none() && mapped::is_mapped_read(r)));
}

#[test]
fn a_program_run_by_another_name_is_code_not_data() {
    // pid 5 runs /env/bin/python, a symlink to /env/bin/python3.11: the kernel maps the
    // real file at the exec, and the trace names the mapping by it. pid 6, its worker,
    // forked without an exec, faults on the data file pid 5 mapped before the fork; pid 5
    // maps and reads a second data file itself.
    let (prog, data, more) = ("/env/bin/python3.11", "/data/a.arrow", "/data/b.arrow");
    let mut exec = proc_row("exec", 5, 1, "python", MS);
    exec.file = Some(Arc::from("/env/bin/python"));
    let rows = vec![
        mapped("map_pages", 5, prog, "7:3", 0, 16 * 4096, 2 * MS),
        mmap_row(5, data, "7:3", 1 << 20, 1, 3 * MS),
        mapped("fault", 6, prog, "7:3", 0, 4096, 4 * MS),
        mapped("fault", 6, data, "7:3", 0, 4096, 5 * MS),
        mmap_row(5, more, "7:3", 1 << 20, 1, 6 * MS),
        mapped("map_pages", 5, more, "7:3", 0, 8 * 4096, 7 * MS),
        mapped("fault", 5, prog, "7:3", 16 * 4096, 4096, 8 * MS),
    ];
    let got: Vec<_> = mapped::reads(&rows, &[exec.clone()]).iter().map(|r| (r.pid, r.file.clone().unwrap())).collect();
    // pid 6's fault on the program is counted: a forked process's mappings are its
    // parent's, and only an exec the trace saw says which are the kernel's
    let want: Vec<(u32, Arc<str>)> = vec![(6, prog.into()), (6, data.into()), (5, more.into())];
    assert_eq!(got, want);
    // Without the exec (it came before the recording), the program's pages are counted.
    assert_eq!(mapped::reads(&rows, &[]).len(), 5);
    // A program that maps its own file again reads it as data from then on.
    let mut again = rows.clone();
    again.push(mmap_row(5, prog, "7:3", 1 << 20, 1, 9 * MS));
    again.push(mapped("fault", 5, prog, "7:3", 32 * 4096, 4096, 10 * MS));
    assert_eq!(mapped::reads(&again, &[exec]).len(), 4);
}

#[test]
fn libraries_paged_in_from_another_disk_do_not_make_the_trace_incomplete() {
    // The ranks page in 200 MiB of their libraries from the root disk while they train
    // (block reads on 254:0, no read syscall behind them); their workers' samples on 7:3
    // are all read syscalls. Only the data device's block layer says whether the file
    // layer saw the data.
    let mut input = Input { has_block: true, ..Input::default() };
    for rank in [200, 300] {
        rank_with_workers(&mut input, rank, 100, 2, 4, 20, 50, 20);
        input.add_block_dev_read(Some("254:0"), rank, 1_500 * MS, 200 * MIB);
        for w in [rank * 10 + 1, rank * 10 + 2] {
            input.add_block_dev_read(Some("7:3"), w, 1_500 * MS, 40 * MIB);
        }
    }
    let m = infer(&input, &Options::default()).unwrap();
    assert_eq!(m.data_dev.as_deref(), Some("7:3"));
    assert!(m.incomplete.is_none(), "{:?}", m.incomplete);
    // The same reads on the data's device are reads the file layer did not see.
    for rank in [200, 300] {
        input.add_block_dev_read(Some("7:3"), rank, 1_500 * MS, 200 * MIB);
    }
    let m = infer(&input, &Options::default()).unwrap();
    assert!(m.incomplete.is_some());
}

/// The same job with its workers' samples fetched as objects (boto3's get_object) instead
/// of read from files: the same GPUs, steps, samples, bytes and compute, its data source
/// the store, though the ranks also read a module file from a disk.
#[test]
fn a_job_reading_objects_models_as_the_same_job_reading_files() {
    let mut files = Input::default();
    launcher_reads(&mut files, 100);
    rank_with_workers(&mut files, 200, 100, 2, 4, 20, 50, 40);
    rank_with_workers(&mut files, 300, 100, 2, 4, 20, 50, 40);
    let by_files = infer(&files, &Options::default()).unwrap();

    let mut objects = as_objects(&files);
    for rank in [200, 300] {
        objects.file.push(file_read(rank, "python", "/usr/lib/python3/torch.py", 0, 65536, 1_001 * MS, MS));
    }
    let m = infer(&objects, &Options::default()).unwrap();
    assert_eq!(m.data_dev.as_deref(), Some("s3://10.0.0.5:9000/bkt"));
    let store = m.object_store.as_ref().expect("the store is the data source");
    assert_eq!((store.endpoint.as_str(), store.bucket.as_str()), ("10.0.0.5:9000", "bkt"));
    assert_eq!((store.requests, store.bytes), (2 * 40 * 4, 2 * 40 * 4 * MIB));
    assert!(describe(&m)[0].contains("data from object store s3://10.0.0.5:9000/bkt (320 GETs, 320.00 MiB)"));
    assert_eq!(m.gpus.len(), 2, "{:#?}", describe(&m));
    for (g, f) in m.gpus.iter().zip(&by_files.gpus) {
        assert_eq!((g.rank_pid, g.workers, g.step_signal), (f.rank_pid, 2, "handoff"));
        assert_eq!(g.steps.len(), 40);
        assert_eq!(g.samples_per_step, 4.0, "one object per sample");
        assert_eq!(g.bytes_per_step, f.bytes_per_step);
        assert_eq!(g.compute_s, f.compute_s);
        assert!(g.files.iter().all(|(p, _)| p.starts_with("bkt/data/")), "the rank's module is not data");
        assert!(g.steps.iter().all(|s| s.reads.iter().all(|r| r.offset == 0 && r.len == MIB && !r.mapped)));
    }
    assert!(by_files.object_store.is_none(), "a job reading files has none");
}

/// pyarrow's loading, as HF `datasets` does it in the rank before its workers start: a
/// read of the file's head and WILLNEED advice of ranges (traces/SCHEMA.md, `madvise`).
fn madvise(pid: u32, file: &str, offset: i64, len: i64, advice: u32, t: i64) -> OwnedRow {
    OwnedRow { bytes: 0, flags: advice, ..mapped("madvise", pid, file, "7:3", offset, len, t) }
}

#[test]
fn a_ranks_own_reads_before_its_workers_first_batch_are_its_setup() {
    let mut input = Input::default();
    rank_with_workers(&mut input, 200, 100, 2, 4, 20, 50, 10);
    let (read, other) = ("/data/r200/s0003_1.npz", "/data/unread.arrow");
    input.file.push(file_read(200, "python", read, 0, 4096, 950 * MS, MS));
    input.file.push(madvise(200, read, 8192, MIB as i64, 3, 960 * MS));
    input.file.push(madvise(200, read, 0, MIB as i64, 1, 961 * MS)); // MADV_RANDOM: no readahead
    input.file.push(madvise(200, other, 0, MIB as i64, 3, 962 * MS)); // a file no batch reads
                                                                      // after the first batch: a read of the rank's own, not its setup
    input.file.push(file_read(200, "python", read, 4096, 4096, 1_500 * MS, MS));
    let m = infer(&input, &Options::default()).unwrap();
    assert_eq!(m.gpus.len(), 1, "{}", describe(&m).join("\n"));
    let g = &m.gpus[0];
    assert_eq!(g.steps.len(), 10);
    assert_eq!(g.bytes, 40 * MIB, "the setup is not in the steps' bytes");
    let file = g.files.iter().position(|(f, _)| f == read).expect("the file the rank read") as u32;
    let want = [
        SetupRead {
            read: Read { file, offset: 0, len: 4096, reader: 0, mapped: false, cpu_after_ns: 0 },
            advise: false,
        },
        SetupRead {
            read: Read { file, offset: 8192, len: MIB, reader: 0, mapped: false, cpu_after_ns: 0 },
            advise: true,
        },
    ];
    assert_eq!(g.setup, want);
    // from the setup's first read (950 ms) to the workers' first (1005.11 ms)
    assert!(close(g.setup_lead_s, 0.05511, 1e-6), "{}", g.setup_lead_s);
    assert!(g.files.iter().all(|(f, _)| f != other), "{:?}", g.files);
}

/// An object request as the recorder writes it: `op` (`put`, `post`, `delete`) to
/// `file` (`bucket/key`) on `endpoint`, `bytes` of body, answered with `status`.
fn object_request(pid: u32, tid: u32, op: &str, file: &str, bytes: i64, issue: i64, dur: i64) -> OwnedRow {
    OwnedRow {
        file: Some(Arc::from(file)),
        fd: Some(11),
        bytes,
        bytes_requested: bytes,
        object: Some(trainio_schema::ObjectFields {
            endpoint: Arc::from("10.0.0.5:9000"),
            http_status: Some(200),
            first_byte_ns: Some(issue + dur / 2),
        }),
        ..row(Layer::Object, op, pid, tid, "python", issue, issue + dur)
    }
}

/// `files`' reads of samples (`/data/r...`) as GETs of objects in bucket `bkt` on
/// 10.0.0.5:9000, their opens dropped; every other row kept.
fn as_objects(files: &Input) -> Input {
    let mut objects = Input { proc_rows: files.proc_rows.clone(), ipc: files.ipc.clone(), ..Input::default() };
    for r in &files.file {
        let sample = r.file.as_deref().is_some_and(|f| f.starts_with("/data/r"));
        match (&*r.op, sample) {
            ("read", true) => objects.object.push(OwnedRow {
                layer: Layer::Object,
                op: Arc::from("get"),
                dev: None,
                offset: None,
                file: Some(Arc::from(format!("bkt{}", r.file.as_deref().unwrap()))),
                object: Some(trainio_schema::ObjectFields {
                    endpoint: Arc::from("10.0.0.5:9000"),
                    http_status: Some(200),
                    first_byte_ns: Some(r.issue_ns + 1_000),
                }),
                ..r.clone()
            }),
            ("open", true) => {}
            _ => objects.file.push(r.clone()),
        }
    }
    objects
}

/// A rank reading objects through its workers saves a checkpoint to the same store after
/// steps 10 and 20, as boto3 does: a small PutObject, then a multipart upload of 5 + 5 +
/// 2 MiB (the short tail part sent second) by two transfer threads, two parts at a time.
/// The workers hand batches off ahead of the rank, which takes each off the pipe when it
/// asks: the PUTs follow the batches taken, not those handed off.
/// The PUTs are a write burst of the GPU placed after those steps, with the parts'
/// sizes, numbers, offsets and concurrency; an aborted upload, a PUT to another store and
/// a worker's PUT are not the GPU's.
#[test]
fn objects_a_rank_puts_are_write_bursts_after_their_step() {
    let mut files = Input::default();
    launcher_reads(&mut files, 100);
    rank_with_workers(&mut files, 200, 100, 2, 4, 20, 50, 30);
    let mut input = as_objects(&files);
    let ready: Vec<i64> =
        infer(&input, &Options::default()).unwrap().gpus[0].steps.iter().map(|s| s.ready_ns).collect();
    // When the rank took each batch: the end of its read of the batch's payload.
    let mut taken: Vec<i64> = input
        .ipc
        .iter()
        .filter(|r| r.pid == 200 && &*r.op == "read" && r.bytes == 300 && r.file.as_deref() == Some("pipe:[9200]"))
        .map(|r| r.complete_ns)
        .collect();
    taken.sort_unstable();
    assert!(taken[9] > ready[11], "the workers are batches ahead of the rank");
    let (small, big) = (300 * 1024, "bkt/ckpt/model.pt");
    for (n, after) in [10usize, 20].into_iter().enumerate() {
        let t = taken[after - 1] + 2 * MS;
        let ob = |op, file: &str, bytes, at, dur| object_request(200, 200, op, file, bytes, at, dur);
        input.object.push(ob("put", &format!("bkt/ckpt/meta{n}.json"), small, t, MS));
        input.object.push(ob("post", big, 0, t + 2 * MS, MS)); // CreateMultipartUpload
        let part = |tid, bytes, at| object_request(200, tid, "put", big, bytes, at, 8 * MS);
        // parts 1 and 3 (the tail) at once, then part 2 once the first has ended
        input.object.push(part(201, 5 * MIB as i64, t + 4 * MS));
        input.object.push(part(202, 2 * MIB as i64, t + 4 * MS + 100_000));
        input.object.push(part(201, 5 * MIB as i64, t + 12 * MS));
        // CompleteMultipartUpload; the second's answer chunked, which the recorder does not follow
        input.object.push(OwnedRow { error: if n == 1 { -61 } else { 0 }, ..ob("post", big, 180, t + 21 * MS, MS) });
    }
    // An upload aborted after one part, a PUT to another store, a worker's PUT: none a write.
    let t = ready[25];
    input.object.push(object_request(200, 200, "post", "bkt/ckpt/aborted.pt", 0, t, MS));
    input.object.push(object_request(200, 201, "put", "bkt/ckpt/aborted.pt", 5 * MIB as i64, t + 2 * MS, MS));
    input.object.push(object_request(200, 200, "delete", "bkt/ckpt/aborted.pt", 0, t + 4 * MS, MS));
    let mut elsewhere = object_request(200, 200, "put", "logs/run.txt", 4096, t + 6 * MS, MS);
    elsewhere.object.as_mut().unwrap().endpoint = Arc::from("10.0.0.9:443");
    input.object.push(elsewhere);
    input.object.push(object_request(2001, 2001, "put", "bkt/cache/w.bin", 999, t, MS));
    // A failed PUT (403) writes nothing.
    let mut refused = object_request(200, 200, "put", "bkt/ckpt/denied.pt", 1000, ready[27], MS);
    refused.object.as_mut().unwrap().http_status = Some(403);
    input.object.push(refused);

    let m = infer(&input, &Options::default()).unwrap();
    assert_eq!(m.data_dev.as_deref(), Some("s3://10.0.0.5:9000/bkt"));
    let g = &m.gpus[0];
    assert_eq!((g.rank_pid, g.steps.len()), (200, 30), "the PUTs do not change the steps");
    let placed: Vec<(Option<u64>, u64, u64, u32)> =
        g.write_bursts.iter().map(|b| (b.after_step, b.bytes, b.writes, b.files)).collect();
    let each = small as u64 + 12 * MIB;
    assert_eq!(placed, vec![(Some(10), each, 4, 2), (Some(20), each, 4, 2)]);
    let name = |o: &writes::WriteOp| g.write_files[o.file as usize].0.as_str();
    let ops: Vec<(&str, u64, u64, Option<writes::ObjectWrite>)> =
        g.write_bursts[1].ops.iter().map(|o| (name(o), o.offset, o.len, o.object)).collect();
    use writes::ObjectWrite::*;
    assert_eq!(
        ops,
        vec![
            ("bkt/ckpt/meta1.json", 0, small as u64, Some(Put)),
            (big, 0, 0, Some(Create { parts: 3, parallel: 2 })),
            (big, 0, 5 * MIB, Some(Part { number: 1 })),
            (big, 10 * MIB, 2 * MIB, Some(Part { number: 3 })),
            (big, 5 * MIB, 5 * MIB, Some(Part { number: 2 })),
            (big, 0, 0, Some(Complete)),
        ]
    );
    // A copy of the object needs its 12 MiB; the aborted one is no object of the GPU.
    assert!(g.write_files.contains(&(big.to_string(), 12 * MIB)), "{:?}", g.write_files);
    assert!(g.write_files.iter().all(|(p, _)| !p.contains("aborted") && !p.contains("denied")));
    let warned = |s: &str| m.warnings.iter().any(|w| w.contains(s));
    assert!(warned("1 PUTs (4096 bytes) to other stores than the data's (s3://10.0.0.5:9000/bkt)"), "{:?}", m.warnings);
    assert!(warned("1 multipart upload(s) not completed in the trace"), "{:?}", m.warnings);
    // The job's bursts: the GPU's two, and the worker's PUT; the other store's PUT too
    // (every traced process's writes, wherever they go).
    assert_eq!(m.writes.bytes, 2 * each + 999 + 4096);
    // A job reading files has no object store: its rank's PUTs are not the GPU's.
    let on_files = Input { object: input.object.iter().filter(|r| r.op.as_ref() != "get").cloned().collect(), ..files };
    let m = infer(&on_files, &Options::default()).unwrap();
    assert!(m.gpus[0].write_bursts.is_empty());
    assert!(m.warnings.iter().any(|w| w.contains("to other stores than the data's (7:3)")), "{:?}", m.warnings);
}

#[test]
fn a_batch_kept_out_of_order_is_no_step_before_a_checkpoint() {
    // A rank's takes off its workers' pipe (ms) in a recorded job of 100 ms steps that saved
    // a checkpoint after steps 4, 8 and 12. Its second call took three batches at once
    // (the next two had come off the pipe first), and returned the two it kept from its
    // third and fifth calls without reading: 12 takes, 10 calls that read.
    let took: Vec<i64> =
        [1718.1, 1823.1, 1824.3, 1824.8, 2031.4, 2342.0, 2444.2, 2546.2, 2862.3, 2964.1, 3065.9, 3169.5]
            .iter()
            .map(|ms| (ms * 1e6) as i64)
            .collect();
    let calls = crate::handoff::Calls::new(&took, 100 * MS);
    let at = |ms: f64| calls.by((ms * 1e6) as i64);
    assert_eq!([at(2163.0), at(2791.3), at(3294.1)], [4, 8, 12]);
    assert_eq!([at(1000.0), at(1718.1), at(1900.0), at(2031.4)], [0, 1, 2, 4]);
    // Every take a call of its own when the compute is not known, or takes are a step apart.
    let apart = crate::handoff::Calls::new(&took, 0);
    assert_eq!([apart.by((2163.0 * 1e6) as i64), apart.by((3294.1 * 1e6) as i64)], [5, 12]);
    let spaced: Vec<i64> = (1..=12).map(|k| k * 103 * MS).collect();
    let spaced_calls = crate::handoff::Calls::new(&spaced, 100 * MS);
    assert!((0..40).all(|i| {
        let t = i * 37 * MS;
        spaced_calls.by(t) == spaced.iter().filter(|&&s| s <= t).count() as u64
    }));
}
