//! `trainio sweep`: the most simulated GPUs the storage keeps at AU ≥ threshold
//! (MLPerf's "supported accelerators"). Doubles the GPU count from --start-gpus until a run
//! fails or --max-gpus is reached, then bisects between the last pass and the first fail.
//! Every rank runs the same sequence; rank 0's verdict is broadcast so all agree.

use crate::cli::SweepArgs;
use crate::cluster::Cluster;
use crate::replay::Job;
use anyhow::{Context, Result};
use serde_json::json;

struct Point {
    gpus: u64,
    pass: bool,
    summary: serde_json::Value,
}

/// Where the curve goes: --json, else `trainio-sweep.json` in --data-dir (next to the
/// data, in the directory the user gave; never the working directory).
pub fn curve_path(args: &SweepArgs) -> std::path::PathBuf {
    args.json.clone().unwrap_or_else(|| args.run.source.data_dir.join("trainio-sweep.json"))
}

pub fn sweep(args: &SweepArgs, cluster: &Cluster) -> Result<()> {
    let json_path = curve_path(args);
    // Checked before any work; the default's directory is made by datagen when absent.
    if cluster.is_root() && (args.json.is_some() || args.run.source.data_dir.is_dir()) {
        crate::output::check(&json_path, "--json")?;
        crate::check_not_input(&json_path, &args.run.source)?;
    }
    let (job, start) = Job::for_sweep(args, cluster.size)?;
    let _lock = crate::lock::acquire_for_job(cluster, &job.data_dir, job.generate)?;
    let mut curve: Vec<Point> = Vec::new();
    let mut trial = |n: u64| -> Result<bool> {
        let summary = job.run(cluster, n)?;
        let verdict = cluster.broadcast(match &summary {
            Some(s) => serde_json::to_vec(s)?,
            None => Vec::new(),
        });
        let s: serde_json::Value = serde_json::from_slice(&verdict).context("decoding rank 0's results")?;
        let pass = s["pass"].as_bool().unwrap_or(false);
        if cluster.is_root() {
            eprintln!(
                "trainio sweep: {n:>6} GPUs  AU {:6.2}%  {:10.1} MiB/s  {}",
                s["au_percent"].as_f64().unwrap_or(0.0),
                s["throughput_mib_s"].as_f64().unwrap_or(0.0),
                if pass { "pass" } else { "FAIL" }
            );
        }
        curve.push(Point { gpus: n, pass, summary: s });
        Ok(pass)
    };
    let (good, bad) = search(start, args.max_gpus, &mut trial)?;
    if !cluster.is_root() {
        return Ok(());
    }
    curve.sort_by_key(|p| p.gpus);
    let threshold = curve.first().and_then(|p| p.summary["threshold_percent"].as_f64()).unwrap_or(0.0);
    println!("trainio sweep: {} (threshold {threshold:.0}% AU)", job.workload.name);
    // Workload mode: what one simulated accelerator needs (trace mode's is in each run).
    let accelerator = crate::mlperf::edition::accelerator_of(job.source.path());
    let workload_mode = job.source.recorded().is_none();
    let need = workload_mode.then(|| crate::mlperf::datasize::need_bytes_per_s(&job.workload)).flatten();
    if let Some(line) = workload_mode.then(|| crate::mlperf::datasize::need_line(&job.workload, accelerator)).flatten()
    {
        println!("{line}");
    }
    println!("{:>8} {:>9} {:>9} {:>12} {:>12}  verdict", "GPUs", "AU %", "min AU %", "MiB/s", "samples/s");
    for p in &curve {
        let f = |k: &str| p.summary[k].as_f64().unwrap_or(0.0);
        println!(
            "{:>8} {:>9.2} {:>9.2} {:>12.1} {:>12.1}  {}",
            p.gpus,
            f("au_percent"),
            f("au_min_percent"),
            f("throughput_mib_s"),
            f("samples_per_s"),
            if p.pass { "pass" } else { "FAIL" }
        );
    }
    if good == 0 {
        println!("supported simulated GPUs: none (even {start} GPUs fall below the threshold)");
    } else if bad.is_none() {
        println!("supported simulated GPUs: at least {good} (--max-gpus reached)");
    } else {
        println!("supported simulated GPUs: {good}");
    }
    let out = json!({
        "workload": job.workload.name,
        "threshold_percent": threshold,
        "supported_gpus": good,
        "accelerator": accelerator,
        "per_gpu_need_mib_s": need.map(|b| b / (1u64 << 20) as f64),
        "limited_by_max_gpus": bad.is_none(),
        "curve": curve.iter().map(|p| json!({
            "gpus": p.gpus,
            "au_percent": p.summary["au_percent"],
            "au_min_percent": p.summary["au_min_percent"],
            "throughput_mib_s": p.summary["throughput_mib_s"],
            "samples_per_s": p.summary["samples_per_s"],
            "sleep_overshoot_us_p99": p.summary["sleep_overshoot_us_p99"],
            "pass": p.pass,
        })).collect::<Vec<_>>(),
        "runs": curve.iter().map(|p| &p.summary).collect::<Vec<_>>(),
    });
    crate::output::save_json(&json_path, &out)?;
    println!("curve saved to {}", json_path.display());
    Ok(())
}

/// The most GPUs that pass, from `start` to `max`: doubling from `start` until a count
/// fails (or `max` passes), then bisection between the last pass and the first fail.
/// Returns (most that passed, 0 if even `start` failed; the least that failed, None if
/// `max` passed). Assumes passing is monotone in the GPU count: each count is tried once.
pub fn search(start: u64, max: u64, mut trial: impl FnMut(u64) -> Result<bool>) -> Result<(u64, Option<u64>)> {
    let (mut good, mut bad) = (0u64, None);
    let mut n = start;
    loop {
        if trial(n)? {
            good = n;
            if n >= max {
                break;
            }
            n = (n * 2).min(max);
        } else {
            bad = Some(n);
            break;
        }
    }
    if let Some(mut hi) = bad {
        let mut lo = good.max(start.saturating_sub(1));
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if trial(mid)? {
                lo = mid;
                good = mid;
            } else {
                hi = mid;
            }
        }
        bad = Some(hi);
    }
    Ok((good, bad))
}

#[cfg(test)]
mod tests {
    use super::search;

    /// Runs the search against storage that feeds `fed` GPUs; returns its answer and the
    /// counts tried, in order.
    fn run(start: u64, max: u64, fed: u64) -> ((u64, Option<u64>), Vec<u64>) {
        let mut tried = Vec::new();
        let out = search(start, max, |n| {
            tried.push(n);
            Ok(n <= fed)
        })
        .unwrap();
        (out, tried)
    }

    #[test]
    fn finds_the_most_gpus_fed_with_doubling_then_bisection() {
        let (out, tried) = run(1, 64, 7);
        assert_eq!(out, (7, Some(8)));
        assert_eq!(tried, vec![1, 2, 4, 8, 6, 7]);
        for fed in 1..=200u64 {
            for start in [1u64, 2, 3, 5, 16] {
                let max = 128;
                let ((good, bad), tried) = run(start, max, fed);
                let want = if fed < start { 0 } else { fed.min(max) };
                assert_eq!(good, want, "start {start} fed {fed}");
                assert_eq!(bad, (fed < max).then_some((fed + 1).max(start)), "start {start} fed {fed}");
                let mut once = tried.clone();
                once.sort_unstable();
                once.dedup();
                assert_eq!(once.len(), tried.len(), "a count tried twice: {tried:?}");
                assert!(tried.iter().all(|&n| n >= start && n <= max), "{tried:?}");
                // doubling and bisection: about 2·log2 of the answer's range, not linear
                assert!(tried.len() <= 2 * (64 - max.leading_zeros()) as usize + 1, "{tried:?}");
            }
        }
    }

    #[test]
    fn max_reached_or_start_failing() {
        assert_eq!(run(1, 10, 1000), ((10, None), vec![1, 2, 4, 8, 10]));
        assert_eq!(run(4, 64, 2), ((0, Some(4)), vec![4]));
    }

    #[test]
    fn a_failed_trial_is_an_error_not_a_verdict() {
        let err = search(1, 8, |n| if n == 4 { anyhow::bail!("rank 1 failed") } else { Ok(true) });
        assert!(err.is_err());
    }
}
