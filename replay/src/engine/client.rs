//! The client's own CPU: whether the replay, not the storage, set the pace of a run.
//! Each rank measures the scheduler's account of its threads (/proc/thread-self/schedstat:
//! time on a CPU, time runnable but waiting for one) over the run. The event loop is the
//! rank's critical path: every read is issued and every step ended there. When it was on
//! a CPU or waiting for one for most of the run, or its reads' threads waited for a CPU
//! for a tenth of it, the AU measured is this client's, not the storage's.
//! The rule and the fields are in docs/replay.md (*Results*, `client`).

use serde::{Deserialize, Serialize};
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};

/// The event loop busy (on a CPU or waiting for one) for at least this share of the run
/// limited it: it never waited on storage or on a compute timer.
pub const BUSY_LIMIT: f64 = 0.90;
/// A thread runnable but off a CPU for at least this share of the run was held back by
/// the client's CPU, not by storage.
pub const RUNQ_LIMIT: f64 = 0.10;

/// One thread's scheduler account, nanoseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sched {
    pub cpu_ns: u64,
    pub runq_ns: u64,
}

/// The calling thread's time on a CPU and runnable-but-waiting, from the kernel's
/// schedstat (None where the kernel does not keep it).
pub fn thread_sched() -> Option<Sched> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let mut it = text.split_whitespace().map(|v| v.parse::<u64>().ok());
    Some(Sched { cpu_ns: it.next()??, runq_ns: it.next()?? })
}

static IO_CPU_NS: AtomicU64 = AtomicU64::new(0);
static IO_RUNQ_NS: AtomicU64 = AtomicU64::new(0);
static IO_THREADS: AtomicU64 = AtomicU64::new(0);

/// A reader thread adds its account as it ends (the pool's threads end with the run).
pub fn add_io_thread() {
    if let Some(s) = thread_sched() {
        IO_CPU_NS.fetch_add(s.cpu_ns, Ordering::Relaxed);
        IO_RUNQ_NS.fetch_add(s.runq_ns, Ordering::Relaxed);
        IO_THREADS.fetch_add(1, Ordering::Relaxed);
    }
}

/// What one rank's threads did during its run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClientCpu {
    /// Whether the kernel gave the scheduler's account (schedstat).
    pub measured: bool,
    pub loop_cpu_s: f64,
    pub loop_runq_wait_s: f64,
    pub io_threads: u64,
    pub io_threads_cpu_s: f64,
    pub io_threads_runq_wait_s: f64,
}

/// Measures one rank's run: `start` before it, `finish` after (its reader threads ended).
pub struct Meter {
    start: Option<Sched>,
}

impl Meter {
    pub fn start() -> Meter {
        IO_CPU_NS.store(0, Ordering::Relaxed);
        IO_RUNQ_NS.store(0, Ordering::Relaxed);
        IO_THREADS.store(0, Ordering::Relaxed);
        Meter { start: thread_sched() }
    }

    pub fn finish(self) -> ClientCpu {
        let (Some(a), Some(b)) = (self.start, thread_sched()) else { return ClientCpu::default() };
        let s = |ns: u64| ns as f64 / 1e9;
        ClientCpu {
            measured: true,
            loop_cpu_s: s(b.cpu_ns.saturating_sub(a.cpu_ns)),
            loop_runq_wait_s: s(b.runq_ns.saturating_sub(a.runq_ns)),
            io_threads: IO_THREADS.load(Ordering::Relaxed),
            io_threads_cpu_s: s(IO_CPU_NS.load(Ordering::Relaxed)),
            io_threads_runq_wait_s: s(IO_RUNQ_NS.load(Ordering::Relaxed)),
        }
    }
}

/// Why a rank's client limited its run, or None.
pub fn limit_reason(c: &ClientCpu, wall_s: f64) -> Option<String> {
    if !c.measured || wall_s <= 0.0 {
        return None;
    }
    let busy = (c.loop_cpu_s + c.loop_runq_wait_s) / wall_s;
    let runq = c.loop_runq_wait_s / wall_s;
    let io_runq = if c.io_threads > 0 { c.io_threads_runq_wait_s / c.io_threads as f64 / wall_s } else { 0.0 };
    if busy >= BUSY_LIMIT {
        Some(format!(
            "its event loop was busy {:.0}% of the run (on a CPU {:.0}%, waiting for one {:.0}%)",
            busy * 100.0,
            c.loop_cpu_s / wall_s * 100.0,
            runq * 100.0
        ))
    } else if runq >= RUNQ_LIMIT {
        Some(format!("its event loop waited for a CPU {:.0}% of the run", runq * 100.0))
    } else if io_runq >= RUNQ_LIMIT {
        Some(format!(
            "its {} reader threads each waited for a CPU {:.0}% of the run (mean)",
            c.io_threads,
            io_runq * 100.0
        ))
    } else {
        None
    }
}

/// The job's `client` entry from each rank's (rank, host, wall_s, account).
pub fn summary(ranks: &[(usize, &str, f64, &ClientCpu)]) -> serde_json::Value {
    let mut limited = Vec::new();
    let per_rank: Vec<_> = ranks
        .iter()
        .map(|&(rank, host, wall_s, c)| {
            let reason = limit_reason(c, wall_s);
            if let Some(r) = &reason {
                limited.push(json!({"rank": rank, "host": host, "reason": r}));
            }
            let share = |x: f64| if wall_s > 0.0 { x / wall_s * 100.0 } else { 0.0 };
            json!({
                "rank": rank,
                "host": host,
                "measured": c.measured,
                "loop_busy_percent": share(c.loop_cpu_s + c.loop_runq_wait_s),
                "loop_cpu_s": c.loop_cpu_s,
                "loop_runq_wait_s": c.loop_runq_wait_s,
                "io_threads": c.io_threads,
                "io_threads_cpu_s": c.io_threads_cpu_s,
                "io_threads_runq_wait_s": c.io_threads_runq_wait_s,
                "limited": reason.is_some(),
            })
        })
        .collect();
    let busy_max = per_rank.iter().filter_map(|r| r["loop_busy_percent"].as_f64()).fold(0.0, f64::max);
    json!({
        "limited": !limited.is_empty(),
        "measured": ranks.iter().all(|r| r.3.measured),
        "loop_busy_percent_max": busy_max,
        "limited_ranks": limited,
        "per_rank": per_rank,
    })
}

/// The summary's line when the client limited the run.
pub fn human(client: &serde_json::Value) -> String {
    let Some(first) = client["limited_ranks"].as_array().and_then(|l| l.first()) else { return String::new() };
    let n = client["limited_ranks"].as_array().map_or(0, |l| l.len());
    format!(
        "  CLIENT-LIMITED: rank {} ({}): {}{}; the AU measures this client's CPU, not the storage\n",
        first["rank"],
        first["host"].as_str().unwrap_or(""),
        first["reason"].as_str().unwrap_or(""),
        if n > 1 { format!(" ({n} ranks limited)") } else { String::new() }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu(loop_cpu: f64, loop_runq: f64, threads: u64, io_runq: f64) -> ClientCpu {
        ClientCpu {
            measured: true,
            loop_cpu_s: loop_cpu,
            loop_runq_wait_s: loop_runq,
            io_threads: threads,
            io_threads_cpu_s: 0.0,
            io_threads_runq_wait_s: io_runq,
        }
    }

    #[test]
    fn rules() {
        // Idle most of the run: waiting on storage or compute timers.
        assert_eq!(limit_reason(&cpu(1.0, 0.1, 4, 0.2), 10.0), None);
        // On a CPU 85% and waiting for one 6%: busy 91%.
        assert!(limit_reason(&cpu(8.5, 0.6, 0, 0.0), 10.0).unwrap().contains("busy 91%"));
        // Little CPU, but held off it for 12% of the run.
        assert!(limit_reason(&cpu(1.0, 1.2, 0, 0.0), 10.0).unwrap().contains("waited for a CPU 12%"));
        // 8 reader threads waiting 1.2 s each in 10 s.
        assert!(limit_reason(&cpu(1.0, 0.0, 8, 9.6), 10.0).unwrap().contains("8 reader threads"));
        // 8 reader threads waiting 0.5 s each: not limited.
        assert_eq!(limit_reason(&cpu(1.0, 0.0, 8, 4.0), 10.0), None);
        // Unmeasured: no verdict.
        assert_eq!(limit_reason(&ClientCpu::default(), 10.0), None);
    }

    #[test]
    fn schedstat_reads_this_thread() {
        let a = thread_sched().expect("schedstat");
        // Spin 50 ms of wall time: the account of a running thread is brought up to
        // date at the scheduler's ticks, several of which fall inside.
        let t0 = std::time::Instant::now();
        let mut x = 0u64;
        while t0.elapsed() < std::time::Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let b = thread_sched().unwrap();
        assert!(b.cpu_ns > a.cpu_ns, "{a:?} {b:?} {x}");
    }

    #[test]
    fn summary_names_limited_ranks() {
        let (a, b) = (cpu(9.5, 0.0, 0, 0.0), cpu(1.0, 0.0, 0, 0.0));
        let s = summary(&[(0, "h0", 10.0, &a), (1, "h1", 10.0, &b)]);
        assert_eq!(s["limited"], true);
        assert_eq!(s["limited_ranks"].as_array().unwrap().len(), 1);
        assert_eq!(s["limited_ranks"][0]["rank"], 0);
        assert!((s["loop_busy_percent_max"].as_f64().unwrap() - 95.0).abs() < 1e-9);
        assert!(human(&s).contains("CLIENT-LIMITED: rank 0 (h0)"));
        let s = summary(&[(1, "h1", 10.0, &b)]);
        assert_eq!(s["limited"], false);
        assert_eq!(human(&s), "");
    }
}
