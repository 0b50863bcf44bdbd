//! Running checkpoints: MLPerf Storage's checkpoint-only workloads (write N checkpoints,
//! then read M back) and the checkpoints a training workload takes between steps.
//!
//! Every simulated GPU is one DLIO rank (checkpoint::Plan); an MPI rank writes the
//! shards of its own simulated GPUs, one thread each, all MPI ranks at once. A
//! checkpoint starts at a barrier of every rank and ends when the slowest rank's last
//! fsync returns: its duration is the largest rank duration, and its throughput the
//! planned bytes over that duration (MLPerf's rule: the longest time across GPUs).

use crate::checkpoint::{self, CheckpointSpec, Plan};
use crate::cluster::Cluster;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

const GB: f64 = 1e9;
const GIB: f64 = (1u64 << 30) as f64;

/// One rank's part of one checkpoint write or read.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CheckpointIo {
    /// `write` or `read`.
    pub phase: String,
    /// 1-based, per phase.
    pub index: u64,
    pub epoch: u64,
    pub step: u64,
    /// From the start barrier to this rank's last write (with fsync) or read.
    pub duration_s: f64,
    /// From the start barrier to the end barrier: the time the job stood still.
    pub stall_s: f64,
    pub bytes: u64,
    pub files: u64,
}

/// The checkpoints of this rank's simulated GPUs.
pub struct Checkpointer {
    pub spec: CheckpointSpec,
    pub plan: Plan,
    pub root: PathBuf,
    /// Global indices (DLIO ranks) of this MPI rank's simulated GPUs.
    pub local: Vec<u64>,
    pub transfer: u64,
    pub odirect: bool,
    /// Object storage: the shards are objects (s3_writes.rs), not files under `root`.
    pub s3: Option<crate::object::s3_writes::S3Target>,
}

impl Checkpointer {
    /// Writes checkpoint (`epoch`, `step`) from every rank at once; the write `index`
    /// (1-based) is recorded.
    pub fn write(&self, cluster: &Cluster, index: u64, epoch: u64, step: u64) -> Result<CheckpointIo> {
        if let Some(t) = &self.s3 {
            let (bucket, prefix) = crate::object::s3_writes::checkpoint_prefix(t, &self.spec.folder, epoch, step);
            return self.timed(cluster, "write", index, epoch, step, |_| {
                crate::object::s3_writes::write_shards(t, &self.plan, &self.local, &bucket, &prefix)
            });
        }
        self.timed(cluster, "write", index, epoch, step, |dir| {
            checkpoint::write_shards(&self.plan, &self.local, &self.root, dir, self.transfer, self.spec.fsync)
        })
    }

    /// Reads checkpoint (`epoch`, `step`) back on every rank at once.
    pub fn read(&self, cluster: &Cluster, index: u64, epoch: u64, step: u64) -> Result<CheckpointIo> {
        if let Some(t) = &self.s3 {
            let (bucket, prefix) = crate::object::s3_writes::checkpoint_prefix(t, &self.spec.folder, epoch, step);
            return self.timed(cluster, "read", index, epoch, step, |_| {
                crate::object::s3_writes::read_shards(t, &self.plan, &self.local, &bucket, &prefix)
            });
        }
        self.timed(cluster, "read", index, epoch, step, |dir| {
            checkpoint::read_shards(&self.plan, &self.local, &self.root, dir, self.transfer, self.odirect)
        })
    }

    /// Runs `io` on checkpoint (`epoch`, `step`)'s directory between two barriers of all
    /// ranks, timed from the first.
    fn timed(
        &self,
        cluster: &Cluster,
        phase: &str,
        index: u64,
        epoch: u64,
        step: u64,
        io: impl FnOnce(&std::path::Path) -> Result<checkpoint::RankIo>,
    ) -> Result<CheckpointIo> {
        let dir = checkpoint::checkpoint_dir(&self.root, &self.spec, epoch, step);
        cluster.barrier()?;
        let t0 = Instant::now();
        let io = io(&dir);
        let duration_s = t0.elapsed().as_secs_f64();
        // Every rank learns whether any failed, so that all stop at this step together
        // (a rank that returned alone would leave the others at the next barrier).
        let mine = io.as_ref().err().map(|e| format!("rank {}: {e:#}", cluster.rank)).unwrap_or_default();
        let first = cluster.gather(mine.into_bytes()).and_then(|all| all.into_iter().find(|m| !m.is_empty()));
        let failed = String::from_utf8_lossy(&cluster.broadcast(first.unwrap_or_default())).into_owned();
        if !failed.is_empty() {
            cluster.barrier()?;
            // A checkpoint half written is no checkpoint: its directory goes (the
            // earlier, whole ones stay).
            let removed = if phase == "write" && cluster.is_root() {
                match std::fs::remove_dir_all(&dir) {
                    Ok(()) => ", its files removed".to_string(),
                    Err(e) => format!(", its files left ({e})"),
                }
            } else {
                String::new()
            };
            anyhow::bail!(crate::errors::CheckpointFailed(format!(
                "checkpoint {index} {phase} (epoch {epoch}, step {step}) in {} failed{removed}: {failed}",
                dir.display()
            )));
        }
        let io = io?;
        cluster.barrier()?;
        Ok(CheckpointIo {
            phase: phase.into(),
            index,
            epoch,
            step,
            duration_s,
            stall_s: t0.elapsed().as_secs_f64(),
            bytes: io.bytes,
            files: io.files,
        })
    }

    /// Whether a training job checkpoints after 1-based `step` of 1-based `epoch`
    /// (DLIO's main loop: every `steps_between_checkpoints` steps of an epoch when set,
    /// else after epoch `checkpoint_after_epoch` and every `epochs_between_checkpoints`
    /// epochs after it).
    pub fn due(&self, epoch: u64, step: u64, steps_per_epoch: u64) -> bool {
        due(&self.spec, epoch, step, steps_per_epoch)
    }
}

/// How many checkpoints a training run of `epochs` epochs of `steps_per_epoch` steps
/// writes: the (epoch, step) pairs `due` says yes to, counted without visiting them.
pub fn writes_in(spec: &CheckpointSpec, epochs: u64, steps_per_epoch: u64) -> u64 {
    if steps_per_epoch == 0 {
        return 0;
    }
    match spec.steps_between_checkpoints {
        Some(k) => epochs.saturating_mul(steps_per_epoch / k),
        None if epochs < spec.checkpoint_after_epoch => 0,
        None => (epochs - spec.checkpoint_after_epoch) / spec.epochs_between_checkpoints + 1,
    }
}

pub fn due(spec: &CheckpointSpec, epoch: u64, step: u64, steps_per_epoch: u64) -> bool {
    match spec.steps_between_checkpoints {
        Some(k) => step.is_multiple_of(k),
        None => {
            step == steps_per_epoch
                && epoch >= spec.checkpoint_after_epoch
                && (epoch - spec.checkpoint_after_epoch).is_multiple_of(spec.epochs_between_checkpoints)
        }
    }
}

/// The plan as JSON: what a run writes, without writing it.
pub fn plan_json(spec: &CheckpointSpec, plan: &Plan) -> serde_json::Value {
    let total = plan.total_bytes();
    let full = if plan.subset {
        let mut whole = spec.clone();
        whole.subset = false;
        whole.data = None;
        Plan::new(&whole, plan.world).map(|p| p.total_bytes()).unwrap_or(0)
    } else {
        total
    };
    let per_gpu: Vec<u64> = (0..plan.ranks).map(|r| plan.rank_bytes(r)).collect();
    json!({
        "model": spec.model_name,
        "mode": if plan.subset { "subset" } else { "default" },
        "world": plan.world,
        "tensor": spec.tensor,
        "pipeline": spec.pipeline,
        "data_parallel": plan.data_parallel,
        "zero_stage": spec.zero_stage,
        "parameters": plan.parameters,
        "model_datatype": spec.model_datatype,
        "optimizer_datatype": spec.optimizer_datatype,
        "planned_bytes": total,
        "planned_gb": total as f64 / GB,
        "planned_gib": total as f64 / GIB,
        "model_bytes": plan.bytes_of("model"),
        "optimizer_bytes": plan.bytes_of("optimizer"),
        "full_checkpoint_bytes": full,
        "full_checkpoint_gib": full as f64 / GIB,
        "files": plan.file_count(),
        "bytes_per_gpu": per_gpu,
        "bytes_per_gpu_max": per_gpu.iter().copied().max().unwrap_or(0),
        "writing_gpus": per_gpu.iter().filter(|&&b| b > 0).count(),
        "folder": spec.folder,
        "fsync": spec.fsync,
        "num_checkpoints_write": spec.num_checkpoints_write,
        "num_checkpoints_read": spec.num_checkpoints_read,
        "time_between_checkpoints_s": spec.time_between_checkpoints_s,
        // MLPerf Storage v3.0's Table 2 row for the model (by hidden size), when it has one.
        "edition_table": crate::mlperf::edition::checkpoint_match(spec.hidden_size, plan.world, full).map(|(row, matches, reason)| json!({
            "edition": crate::mlperf::edition::EDITION,
            "model": row.model,
            "processes": row.processes,
            "size_gb": row.size_gb,
            "matches": matches,
            "reason": reason,
        })),
    })
}

/// Combines every rank's records of the same checkpoint: duration = the slowest rank.
pub fn combine(per_rank: &[Vec<CheckpointIo>], phase: &str) -> Vec<serde_json::Value> {
    let mut keys: Vec<u64> = per_rank.iter().flatten().filter(|c| c.phase == phase).map(|c| c.index).collect();
    keys.sort_unstable();
    keys.dedup();
    keys.iter()
        .map(|&i| {
            let all: Vec<&CheckpointIo> =
                per_rank.iter().flatten().filter(|c| c.phase == phase && c.index == i).collect();
            let duration = all.iter().map(|c| c.duration_s).fold(0.0, f64::max).max(1e-9);
            let stall = all.iter().map(|c| c.stall_s).fold(0.0, f64::max);
            let bytes: u64 = all.iter().map(|c| c.bytes).sum();
            json!({
                "index": i,
                "epoch": all[0].epoch,
                "step": all[0].step,
                "duration_s": duration,
                "stall_s": stall,
                "bytes": bytes,
                "files": all.iter().map(|c| c.files).sum::<u64>(),
                "throughput_gb_s": bytes as f64 / duration / GB,
                "throughput_gib_s": bytes as f64 / duration / GIB,
                "throughput_mib_s": bytes as f64 / duration / (1u64 << 20) as f64,
                "rank_duration_s_min": all.iter().map(|c| c.duration_s).fold(f64::INFINITY, f64::min),
            })
        })
        .collect()
}

fn mean(v: &[serde_json::Value], key: &str) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.iter().map(|x| x[key].as_f64().unwrap_or(0.0)).sum::<f64>() / v.len() as f64
}

/// Adds `writes`, `reads` and their means to a plan's JSON.
pub fn with_ios(mut plan: serde_json::Value, per_rank: &[Vec<CheckpointIo>]) -> serde_json::Value {
    let writes = combine(per_rank, "write");
    let reads = combine(per_rank, "read");
    let sum = |v: &[serde_json::Value], k: &str| v.iter().map(|x| x[k].as_u64().unwrap_or(0)).sum::<u64>();
    let m = plan.as_object_mut().expect("plan is an object");
    m.insert("bytes_written".into(), json!(sum(&writes, "bytes")));
    m.insert("bytes_read".into(), json!(sum(&reads, "bytes")));
    m.insert("write_duration_s_mean".into(), json!(mean(&writes, "duration_s")));
    m.insert("write_throughput_gb_s_mean".into(), json!(mean(&writes, "throughput_gb_s")));
    m.insert("write_throughput_gib_s_mean".into(), json!(mean(&writes, "throughput_gib_s")));
    m.insert("read_duration_s_mean".into(), json!(mean(&reads, "duration_s")));
    m.insert("read_throughput_gb_s_mean".into(), json!(mean(&reads, "throughput_gb_s")));
    m.insert("read_throughput_gib_s_mean".into(), json!(mean(&reads, "throughput_gib_s")));
    m.insert("writes".into(), json!(writes));
    m.insert("reads".into(), json!(reads));
    plan
}

/// Lines of the human summary for a checkpoint object (plan, with runs when present).
pub fn human(c: &serde_json::Value) -> String {
    let f = |k: &str| c[k].as_f64().unwrap_or(0.0);
    let mut out = format!(
        "  checkpoint  {} mode, TP×PP×DP {}×{}×{} (ZeRO {}), {} parameters: {:.2} GB = {:.2} GiB ({:.2} GiB model, {:.2} GiB optimizer) in {} files from {} of {} GPUs, at most {:.3} GiB per GPU\n",
        c["mode"].as_str().unwrap_or(""),
        c["tensor"],
        c["pipeline"],
        c["data_parallel"],
        c["zero_stage"],
        c["parameters"],
        f("planned_gb"),
        f("planned_gib"),
        c["model_bytes"].as_f64().unwrap_or(0.0) / GIB,
        c["optimizer_bytes"].as_f64().unwrap_or(0.0) / GIB,
        c["files"],
        c["writing_gpus"],
        c["bytes_per_gpu"].as_array().map(|a| a.len()).unwrap_or(0),
        c["bytes_per_gpu_max"].as_f64().unwrap_or(0.0) / GIB,
    );
    if let Some(per_gpu) = c["bytes_per_gpu"].as_array() {
        // Distinct per-GPU sizes with how many GPUs write each, largest first.
        let mut counts = std::collections::BTreeMap::new();
        for b in per_gpu.iter().filter_map(|b| b.as_u64()) {
            *counts.entry(std::cmp::Reverse(b)).or_insert(0u64) += 1;
        }
        let groups: Vec<String> = counts
            .iter()
            .take(6)
            .map(|(std::cmp::Reverse(b), n)| format!("{:.3} GiB × {n}", *b as f64 / GIB))
            .collect();
        let more = if counts.len() > 6 { format!(", {} other sizes", counts.len() - 6) } else { String::new() };
        out += &format!("              per GPU {}{more}\n", groups.join(", "));
    }
    if let Some(reason) = c["edition_table"]["reason"].as_str() {
        out += &format!("              {reason}\n");
    }
    if c["mode"] == "subset" {
        out += &format!(
            "              subset of a {:.2} GiB checkpoint of {} GPUs\n",
            f("full_checkpoint_gib"),
            c["world"]
        );
    }
    for (phase, key) in [("write", "writes"), ("read", "reads")] {
        if let Some(list) = c[key].as_array() {
            for x in list {
                out += &format!(
                    "  {phase:<5} {}  {:.3} s, {:.3} GB/s = {:.3} GiB/s ({:.1} MiB/s), {:.3} GiB (epoch {}, step {})\n",
                    x["index"],
                    x["duration_s"].as_f64().unwrap_or(0.0),
                    x["throughput_gb_s"].as_f64().unwrap_or(0.0),
                    x["throughput_gib_s"].as_f64().unwrap_or(0.0),
                    x["throughput_mib_s"].as_f64().unwrap_or(0.0),
                    x["bytes"].as_f64().unwrap_or(0.0) / GIB,
                    x["epoch"],
                    x["step"],
                );
            }
        }
    }
    out
}

/// MLPerf Storage's checkpoint-only workload: `num_checkpoints_write` checkpoints, each
/// after `time_between_checkpoints` of emulated compute, then the first
/// `num_checkpoints_read` read back after their pages are dropped from the cache.
/// Rank 0 gets the results.
pub fn run_checkpoint_only(
    ckpt: &Checkpointer,
    cluster: &Cluster,
    settings: serde_json::Value,
    progress: bool,
) -> Result<Option<serde_json::Value>> {
    let spec = &ckpt.spec;
    let mut ios = Vec::new();
    let t_start = Instant::now();
    let pause = std::time::Duration::from_secs_f64(spec.time_between_checkpoints_s);
    for i in 1..=spec.num_checkpoints_write {
        std::thread::sleep(pause);
        let io = ckpt.write(cluster, i, 1, i)?;
        if progress && cluster.is_root() {
            eprintln!(
                "trainio replay: checkpoint write {i}/{}: {:.2} s on rank 0",
                spec.num_checkpoints_write, io.duration_s
            );
        }
        ios.push(io);
    }
    if spec.num_checkpoints_read > 0 {
        // MLPerf's "clear the cache" between write and read, for these files only.
        for i in 1..=spec.num_checkpoints_read {
            if let Some(t) = &ckpt.s3 {
                let (bucket, prefix) = crate::object::s3_writes::checkpoint_prefix(t, &spec.folder, 1, i);
                crate::object::s3_writes::check_shards(t, &ckpt.plan, &ckpt.local, &bucket, &prefix)?;
                continue;
            }
            let dir = checkpoint::checkpoint_dir(&ckpt.root, spec, 1, i);
            checkpoint::settle_shards(&ckpt.plan, &ckpt.local, &ckpt.root, &dir)?;
        }
    }
    for i in 1..=spec.num_checkpoints_read {
        std::thread::sleep(pause);
        let io = ckpt.read(cluster, i, 1, i)?;
        if progress && cluster.is_root() {
            eprintln!(
                "trainio replay: checkpoint read {i}/{}: {:.2} s on rank 0",
                spec.num_checkpoints_read, io.duration_s
            );
        }
        ios.push(io);
    }
    let wall_s = t_start.elapsed().as_secs_f64();
    let log = ckpt.s3.as_ref().map(|t| t.log.lock().unwrap().to_wire());
    let mine = serde_json::to_vec(&(cluster.hostname.clone(), wall_s, ios, log))?;
    let Some(all) = cluster.gather(mine) else { return Ok(None) };
    let reports: Vec<(String, f64, Vec<CheckpointIo>, Option<serde_json::Value>)> =
        all.iter().map(|b| serde_json::from_slice(b)).collect::<Result<_, _>>().context("decoding rank results")?;
    let hosts: std::collections::BTreeSet<&str> = reports.iter().map(|r| r.0.as_str()).collect();
    let per_rank: Vec<Vec<CheckpointIo>> = reports.iter().map(|r| r.2.clone()).collect();
    let object = crate::object::s3_writes::combine_logs(reports.iter().filter_map(|r| r.3.as_ref()));
    let mut out = json!({
        "tool": "trainio replay",
        "version": env!("CARGO_PKG_VERSION"),
        "gpus": ckpt.plan.ranks,
        "ranks": reports.len(),
        "hosts": hosts.len(),
        "hostnames": hosts,
        "wall_s": reports.iter().map(|r| r.1).fold(0.0, f64::max),
        "checkpoint": with_ios(plan_json(spec, &ckpt.plan), &per_rank),
        "settings": settings,
    });
    if let Some(o) = object {
        out["object"] = o;
    }
    Ok(Some(out))
}

/// The human summary of a checkpoint-only run or plan.
pub fn human_summary(j: &serde_json::Value) -> String {
    let s = &j["settings"];
    let mut out = format!(
        "trainio replay: {} (checkpoint{}), {} simulated GPUs on {} ranks, {} hosts\n",
        s["name"].as_str().unwrap_or(""),
        if j["plan_only"] == true { ", plan only: nothing written" } else { "" },
        j["gpus"],
        j["ranks"],
        j["hosts"]
    );
    out += &human(&j["checkpoint"]);
    if j["object"].is_object() {
        out += &crate::object::s3_client::human(&j["object"]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(extra: &str) -> CheckpointSpec {
        let y = format!("model:\n  name: m\n  model_size_bytes: 4096\ncheckpoint:\n  checkpoint_folder: ck\n{extra}");
        let root: serde_yaml::Value = serde_yaml::from_str(&y).unwrap();
        CheckpointSpec::from_root(&root, "m").unwrap()
    }

    /// DLIO's main loop: the epoch rule (after epoch A, then every E epochs, at the
    /// epoch's end) unless steps_between_checkpoints is set (every S steps of an epoch).
    #[test]
    fn due_follows_dlio_main_loop() {
        let s = spec("  checkpoint_after_epoch: 5\n  epochs_between_checkpoints: 2\n");
        let epochs: Vec<u64> = (1..=10).filter(|&e| due(&s, e, 7, 7)).collect();
        assert_eq!(epochs, vec![5, 7, 9]);
        assert!(!due(&s, 5, 6, 7), "only at the epoch's last step");
        let s = spec("  steps_between_checkpoints: 3\n  checkpoint_after_epoch: 5\n");
        let steps: Vec<u64> = (1..=10).filter(|&st| due(&s, 1, st, 10)).collect();
        assert_eq!(steps, vec![3, 6, 9], "the step rule replaces the epoch rule");
        let s = spec("");
        assert!((1..=3).all(|e| due(&s, e, 4, 4)), "DLIO's defaults: after every epoch");
    }

    /// writes_in counts what due says yes to over a whole run, for both rules.
    #[test]
    fn writes_in_counts_the_due_checkpoints() {
        let rules = [
            "",
            "  checkpoint_after_epoch: 3\n",
            "  checkpoint_after_epoch: 2\n  epochs_between_checkpoints: 3\n",
            "  steps_between_checkpoints: 1\n",
            "  steps_between_checkpoints: 4\n",
        ];
        for rule in rules {
            let s = spec(rule);
            for epochs in 0..8 {
                for spe in 0..11 {
                    let seen = (1..=epochs)
                        .flat_map(|e| (1..=spe).map(move |st| (e, st)))
                        .filter(|&(e, st)| due(&s, e, st, spe));
                    assert_eq!(writes_in(&s, epochs, spe), seen.count() as u64, "{rule:?} {epochs} epochs of {spe}");
                }
            }
        }
        assert_eq!(writes_in(&spec("  steps_between_checkpoints: 1\n"), u64::MAX, 2), u64::MAX, "saturates");
    }

    /// The unet3d files' model (not a transformer, ZeRO 0): GPU 0 alone writes model_size bytes.
    #[test]
    fn a_cnn_model_is_written_by_the_first_gpu() {
        let plan = Plan::new(&spec(""), 4).unwrap();
        assert_eq!((0..4).map(|r| plan.rank_bytes(r)).collect::<Vec<_>>(), vec![4096, 0, 0, 0]);
        assert_eq!(plan.files[0][0].name, "model_states-0.pt");
    }
}
