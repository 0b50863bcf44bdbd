//! Job results: per-rank runs combined on rank 0 into the figures a storage engineer
//! compares against DLIO / MLPerf Storage. The formulas are documented in docs/replay.md;
//! every byte figure says MiB (2^20) or MB (10^6).

use crate::engine::{GpuStats, RankRun};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};

/// What one rank sends to rank 0 after its run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankReport {
    pub rank: usize,
    pub hostname: String,
    pub mem_total_bytes: u64,
    /// CPU time (user + system) the rank's process spent during the run.
    pub cpu_s: f64,
    /// The scheduler's account of the rank's threads: did the client limit the run?
    #[serde(default)]
    pub client: crate::engine::client::ClientCpu,
    pub run: RankRun,
}

/// Settings echoed into the results so a JSON file explains itself.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    pub mode: String,
    pub source: String,
    pub name: String,
    pub data_dir: String,
    pub batch_size: u64,
    pub read_threads: u64,
    pub prefetch_size: u64,
    pub transfer_size: u64,
    pub computation_time: String,
    pub computation_time_mean_s: f64,
    pub steps_per_epoch: u64,
    pub epochs: u64,
    pub barrier: bool,
    pub odirect: bool,
    pub drop_caches: bool,
    pub realtime: bool,
    pub io_engine: String,
    pub nominal_sample_bytes: f64,
    pub dataset_files: u64,
    pub dataset_bytes: u64,
    /// `--param KEY=VALUE` overrides applied to the workload file.
    pub params: Vec<String>,
    /// Workload mode: how the samples are read: the format's reader and the loader
    /// (program.rs, docs/replay.md *Formats*).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reader: Option<serde_json::Value>,
    /// Trace mode: the recorded processes used as templates.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub templates: Option<Vec<serde_json::Value>>,
    /// Trace mode: simulated GPUs per recorded GPU (--gpus-per-process).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpus_per_process: Option<u32>,
    /// Trace mode: the factor on the recorded compute (--compute-scale; 1 without it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compute_scale: Option<f64>,
    /// The throughput one simulated GPU needs, MiB/s. Workload mode: record × batch /
    /// mean computation time. Trace mode: the median over the templates replayed of bytes
    /// per step / compute per step (after the what-ifs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub required_mib_s_per_gpu: Option<f64>,
    /// Trace mode: --map-path's OLD=NEW pairs when the replay read the job's own files
    /// in place (empty: the files laid out under --data-dir).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub map_path: Option<Vec<String>>,
}

pub use crate::histogram::percentile;

pub fn summarize(reports: &[RankReport], settings: &Settings, threshold_percent: f64) -> serde_json::Value {
    let gpus: Vec<&GpuStats> = reports.iter().flat_map(|r| r.run.gpus.iter()).collect();
    let n = gpus.len().max(1) as f64;
    let hosts: BTreeSet<&str> = reports.iter().map(|r| r.hostname.as_str()).collect();
    let wall_s = reports.iter().map(|r| r.run.wall_s).fold(0.0, f64::max).max(1e-9);
    let bytes: u64 = gpus.iter().map(|g| g.bytes).sum();
    let samples: u64 = gpus.iter().map(|g| g.samples).sum();
    let steps: u64 = gpus.iter().map(|g| g.steps).max().unwrap_or(0);
    let gpu_steps: u64 = gpus.iter().map(|g| g.steps).sum();
    let au: Vec<f64> = gpus.iter().map(|g| g.au * 100.0).collect();
    let au_mean = au.iter().sum::<f64>() / n;
    let au_min = au.iter().copied().fold(f64::INFINITY, f64::min);
    let au_min = if au_min.is_finite() { au_min } else { 0.0 };
    let hist = overshoot_hist(reports.iter());
    let cpu_s: f64 = reports.iter().map(|r| r.cpu_s).sum();
    // Total client RAM: each host counted once.
    let mut ram_by_host = BTreeMap::new();
    for r in reports {
        ram_by_host.insert(r.hostname.as_str(), r.mem_total_bytes);
    }
    let ram_bytes: u64 = ram_by_host.values().sum();
    let host_of: BTreeMap<usize, &str> = reports.iter().map(|r| (r.rank, r.hostname.as_str())).collect();
    let per_host = per_host(reports, wall_s);

    let epochs = gpus.iter().map(|g| g.epochs.len()).max().unwrap_or(0);
    let per_epoch: Vec<serde_json::Value> = (0..epochs)
        .map(|e| {
            let es: Vec<_> = gpus.iter().filter_map(|g| g.epochs.get(e)).collect();
            let duration = es.iter().map(|x| x.duration_s).fold(0.0, f64::max).max(1e-9);
            let b: u64 = es.iter().map(|x| x.bytes).sum();
            let s: u64 = es.iter().map(|x| x.samples).sum();
            json!({
                "epoch": e + 1,
                "duration_s": duration,
                "au_percent": es.iter().map(|x| x.au * 100.0).sum::<f64>() / es.len().max(1) as f64,
                "au_min_percent": es.iter().map(|x| x.au * 100.0).fold(f64::INFINITY, f64::min),
                "samples": s,
                "bytes_read": b,
                "samples_per_s": s as f64 / duration,
                "throughput_mib_s": b as f64 / duration / 1048576.0,
                "first_step_s_max": es.iter().map(|x| x.first_step_s).fold(0.0, f64::max),
                "checkpoint_s": es.iter().map(|x| x.checkpoint_s).fold(0.0, f64::max),
            })
        })
        .collect();

    let mean = |f: &dyn Fn(&GpuStats) -> f64| gpus.iter().map(|g| f(g)).sum::<f64>() / n;
    json!({
        "tool": "trainio replay",
        "version": env!("CARGO_PKG_VERSION"),
        "gpus": gpus.len(),
        "ranks": reports.len(),
        "hosts": hosts.len(),
        "hostnames": hosts,
        "au_percent": au_mean,
        "au_min_percent": au_min,
        "au_max_percent": au.iter().copied().fold(0.0, f64::max),
        "au_per_gpu": au,
        "threshold_percent": threshold_percent,
        "pass": au_mean >= threshold_percent,
        "samples": samples,
        "samples_per_s": samples as f64 / wall_s,
        "bytes_read": bytes,
        "throughput_mib_s": bytes as f64 / wall_s / 1048576.0,
        "throughput_mb_s": bytes as f64 / wall_s / 1e6,
        "nominal_throughput_mib_s": samples as f64 / wall_s * settings.nominal_sample_bytes / 1048576.0,
        "wall_s": wall_s,
        "steps": steps,
        "gpu_steps": gpu_steps,
        "epochs": epochs,
        "per_epoch": per_epoch,
        "compute_s_mean": mean(&|g| g.compute_s),
        "io_wait_s_mean": mean(&|g| g.io_wait_s),
        "barrier_wait_s_mean": mean(&|g| g.barrier_wait_s),
        "sleep_overshoot_us_p50": percentile(&hist, 0.50),
        "sleep_overshoot_us_p99": percentile(&hist, 0.99),
        "sleep_overshoot_us_max": hist.keys().last().copied().unwrap_or(0),
        "max_outstanding_reads_per_gpu": gpus.iter().map(|g| g.max_outstanding_reads).max().unwrap_or(0),
        "cpu_s": cpu_s,
        "cpu_us_per_gpu_step": if gpu_steps > 0 { cpu_s * 1e6 / gpu_steps as f64 } else { 0.0 },
        "client_ram_bytes": ram_bytes,
        "client": crate::engine::client::summary(
            &reports.iter().map(|r| (r.rank, r.hostname.as_str(), r.run.wall_s, &r.client)).collect::<Vec<_>>()
        ),
        "per_host": per_host,
        "settings": settings,
        "per_gpu": gpus.iter().map(|g| json!({
            "gpu": g.gpu, "rank": g.rank, "host": host_of.get(&g.rank).copied().unwrap_or(""),
            "au_percent": g.au * 100.0, "steps": g.steps,
            "samples": g.samples, "bytes_read": g.bytes, "compute_s": g.compute_s,
            "io_wait_s": g.io_wait_s, "barrier_wait_s": g.barrier_wait_s,
            "max_outstanding_reads": g.max_outstanding_reads,
        })).collect::<Vec<_>>(),
    })
}

/// The sleep-overshoot histograms of `reports`, merged (µs → count).
fn overshoot_hist<'a>(reports: impl Iterator<Item = &'a RankReport>) -> BTreeMap<u64, u64> {
    let mut hist = BTreeMap::new();
    for r in reports {
        for &(us, c) in &r.run.overshoot_us {
            *hist.entry(us).or_insert(0) += c;
        }
    }
    hist
}

/// One entry per distinct host name, in name order: its ranks' share of the job (the
/// figures of the whole job, restricted to the GPUs and processes of that host).
fn per_host(reports: &[RankReport], wall_s: f64) -> Vec<serde_json::Value> {
    let mut by_host: BTreeMap<&str, Vec<&RankReport>> = BTreeMap::new();
    for r in reports {
        by_host.entry(r.hostname.as_str()).or_default().push(r);
    }
    by_host
        .into_iter()
        .map(|(host, rs)| {
            let gpus: Vec<&GpuStats> = rs.iter().flat_map(|r| r.run.gpus.iter()).collect();
            let bytes: u64 = gpus.iter().map(|g| g.bytes).sum();
            let samples: u64 = gpus.iter().map(|g| g.samples).sum();
            let gpu_steps: u64 = gpus.iter().map(|g| g.steps).sum();
            let au: Vec<f64> = gpus.iter().map(|g| g.au * 100.0).collect();
            let au_min = au.iter().copied().fold(f64::INFINITY, f64::min);
            let cpu_s: f64 = rs.iter().map(|r| r.cpu_s).sum();
            let hist = overshoot_hist(rs.iter().copied());
            json!({
                "host": host,
                "ranks": rs.iter().map(|r| r.rank).collect::<Vec<_>>(),
                "gpus": gpus.len(),
                "mem_total_bytes": rs[0].mem_total_bytes,
                "au_percent": au.iter().sum::<f64>() / au.len().max(1) as f64,
                "au_min_percent": if au_min.is_finite() { au_min } else { 0.0 },
                "samples": samples,
                "bytes_read": bytes,
                "throughput_mib_s": bytes as f64 / wall_s / 1048576.0,
                "gpu_steps": gpu_steps,
                "wall_s": rs.iter().map(|r| r.run.wall_s).fold(0.0, f64::max),
                "sleep_overshoot_us_p50": percentile(&hist, 0.50),
                "sleep_overshoot_us_p99": percentile(&hist, 0.99),
                "cpu_s": cpu_s,
                "cpu_us_per_gpu_step": if gpu_steps > 0 { cpu_s * 1e6 / gpu_steps as f64 } else { 0.0 },
            })
        })
        .collect()
}

/// The human summary printed by rank 0.
pub fn human(j: &serde_json::Value) -> String {
    let f = |k: &str| j[k].as_f64().unwrap_or(0.0);
    let s = &j["settings"];
    let mut out = String::new();
    out += &format!(
        "trainio replay: {} ({}), {} simulated GPUs on {} ranks, {} hosts\n",
        s["name"].as_str().unwrap_or(""),
        s["mode"].as_str().unwrap_or(""),
        j["gpus"],
        j["ranks"],
        j["hosts"]
    );
    out += &format!(
        "  AU          {:.2}% mean (min {:.2}%), threshold {:.0}%: {}\n",
        f("au_percent"),
        f("au_min_percent"),
        f("threshold_percent"),
        if j["pass"].as_bool() == Some(true) { "PASS" } else { "FAIL" }
    );
    out += &format!(
        "  throughput  {:.1} MiB/s read ({:.1} MB/s), {:.1} samples/s, {} steps × {} epochs in {:.2} s\n",
        f("throughput_mib_s"),
        f("throughput_mb_s"),
        f("samples_per_s"),
        s["steps_per_epoch"],
        j["epochs"],
        f("wall_s")
    );
    if let (Some(need), Some("workload")) = (s["required_mib_s_per_gpu"].as_f64(), s["mode"].as_str()) {
        out += &format!(
            "  need        {need:.1} MiB/s per simulated GPU at 100% AU (record × batch / computation_time: {} B × {} / {} s)\n",
            s["nominal_sample_bytes"], s["batch_size"], s["computation_time_mean_s"]
        );
    } else if let Some(need) = s["required_mib_s_per_gpu"].as_f64() {
        out += &format!(
            "  need        {need:.1} MiB/s per simulated GPU (job model: bytes per step / compute per step{}{})\n",
            match s["compute_scale"].as_f64() {
                Some(f) if f != 1.0 => format!(", compute × {f}"),
                _ => String::new(),
            },
            match s["gpus_per_process"].as_u64() {
                Some(n) if n > 1 => format!(", {n} GPUs per recorded process"),
                _ => String::new(),
            }
        );
    }
    out += &format!(
        "  per GPU     compute {:.2} s, waiting for data {:.2} s, at the barrier {:.2} s (means)\n",
        f("compute_s_mean"),
        f("io_wait_s_mean"),
        f("barrier_wait_s_mean")
    );
    out += &format!(
        "  sleep overshoot p50 {} µs, p99 {} µs; CPU {:.1} µs per simulated GPU-step\n",
        j["sleep_overshoot_us_p50"],
        j["sleep_overshoot_us_p99"],
        f("cpu_us_per_gpu_step")
    );
    if let Some(why) = j["stopped"].as_str() {
        out += &format!("  STOPPED     after {} steps: {why}\n", j["steps"]);
    }
    out += &crate::engine::client::human(&j["client"]);
    if let Some(hosts) = j["per_host"].as_array().filter(|h| h.len() > 1) {
        for h in hosts {
            let g = |k: &str| h[k].as_f64().unwrap_or(0.0);
            out += &format!(
                "  host {}  {} GPUs on {} ranks: AU {:.2}% (min {:.2}%), {:.1} MiB/s, overshoot p99 {} µs, CPU {:.1} µs per GPU-step\n",
                h["host"].as_str().unwrap_or(""),
                h["gpus"],
                h["ranks"].as_array().map_or(0, |r| r.len()),
                g("au_percent"),
                g("au_min_percent"),
                g("throughput_mib_s"),
                h["sleep_overshoot_us_p99"],
                g("cpu_us_per_gpu_step")
            );
        }
    }
    if j["object"].is_object() {
        out += &crate::object::s3_client::human(&j["object"]);
    }
    if j["checkpoint"].is_object() {
        out += &crate::checkpoint::checkpointing::human(&j["checkpoint"]);
    }
    if j["writes"].is_object() {
        out += &crate::trace::trace_writes::human(&j["writes"]);
    }
    if let Some(epochs) = j["per_epoch"].as_array() {
        if epochs.len() > 1 {
            for e in epochs {
                out += &format!(
                    "  epoch {:<3}   AU {:.2}%, {:.1} MiB/s, {:.2} s\n",
                    e["epoch"],
                    e["au_percent"].as_f64().unwrap_or(0.0),
                    e["throughput_mib_s"].as_f64().unwrap_or(0.0),
                    e["duration_s"].as_f64().unwrap_or(0.0)
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let mut h = BTreeMap::new();
        h.insert(10, 98);
        h.insert(500, 1);
        h.insert(900, 1);
        assert_eq!(percentile(&h, 0.5), 10);
        assert_eq!(percentile(&h, 0.99), 500);
        assert_eq!(percentile(&h, 1.0), 900);
        assert_eq!(percentile(&BTreeMap::new(), 0.99), 0);
    }
}
