//! What-ifs on a job model: the same recorded job seen with several accelerators per
//! process, or with faster (or slower) accelerators. Applied after inference
//! (`infer_trace`), so `trainio replay --trace` and the model's printout agree.
//!
//! - **Accelerators per process** (`Options::gpus_per_process` N): a process that drives
//!   N accelerators (JAX's one process per host, torch DataParallel) splits every batch
//!   it reads among them. Each recorded GPU becomes N GPUs with the same number of steps;
//!   accelerator j of N gets, of each step, the j-th of N contiguous runs of its reads
//!   (by count: `reads[j·R/N .. (j+1)·R/N]`) and the j-th share of its samples
//!   (`(j+1)·S/N − j·S/N`), its bytes those of its reads. The compute per step is the
//!   process's (the accelerators compute at once), so bytes per step and the throughput
//!   need are per accelerator, about 1/N of the process's. Each accelerator keeps the
//!   readers that read its share; the process's write bursts stay with accelerator 0.
//! - **Compute scale** (`Options::compute_scale` F > 0): each step's compute (its
//!   interval and period) and the GPU's compute per step are multiplied by F, so every
//!   step keeps its share of the spread; the throughput need becomes bytes per step /
//!   (F × compute). What was measured in the recording (AU, MiB/s, waits) stays as
//!   recorded.

use crate::job::{GpuModel, JobModel, Step};
use crate::options::Options;
use crate::stats::quantile;

/// The model with the what-ifs of `opts` applied (none: unchanged).
pub fn apply(mut m: JobModel, opts: &Options) -> Result<JobModel, String> {
    let n = opts.gpus_per_process.unwrap_or(1);
    if n == 0 {
        return Err("--gpus-per-process must be at least 1".into());
    }
    if let Some(f) = opts.compute_scale {
        if !(f > 0.0 && f.is_finite()) {
            return Err(format!("--compute-scale must be a number > 0, got {f}"));
        }
    }
    if n > 1 {
        m.gpus = m.gpus.into_iter().flat_map(|g| split_gpu(g, n)).collect();
        for (i, g) in m.gpus.iter_mut().enumerate() {
            g.index = i;
        }
        m.warnings.push(format!(
            "what-if: each recorded process drives {n} GPUs (--gpus-per-process): its batches are split among them"
        ));
    }
    if let Some(f) = opts.compute_scale.filter(|&f| f != 1.0) {
        for g in &mut m.gpus {
            scale_gpu(g, f);
        }
        m.compute_s = m.compute_s.map(|c| c * f);
        m.warnings.push(format!("what-if: compute per step × {f} (--compute-scale)"));
    }
    if n > 1 || opts.compute_scale.is_some() {
        let bps: Vec<f64> = m.gpus.iter().filter(|g| !g.steps.is_empty()).map(|g| g.bytes_per_step).collect();
        let reqs: Vec<f64> = m.gpus.iter().filter_map(|g| g.required_mib_s).collect();
        m.bytes_per_step = quantile(&bps, 0.5);
        m.required_mib_s_per_gpu = quantile(&reqs, 0.5);
        m.steps = m.gpus.iter().map(|g| g.steps_taken as u64).sum();
    }
    Ok(m)
}

fn need(bytes_per_step: f64, compute_s: Option<f64>) -> Option<f64> {
    compute_s.filter(|&c| c > 0.0).map(|c| bytes_per_step / c / (1u64 << 20) as f64)
}

/// The N accelerators of one process (module comment).
pub fn split_gpu(g: GpuModel, n: u32) -> Vec<GpuModel> {
    let n = n as usize;
    (0..n)
        .map(|j| {
            let steps: Vec<Step> = g
                .steps
                .iter()
                .map(|s| {
                    let r = s.reads.len();
                    let reads = s.reads[j * r / n..(j + 1) * r / n].to_vec();
                    let total = s.samples as usize;
                    Step {
                        bytes: reads.iter().map(|x| x.len).sum(),
                        samples: ((j + 1) * total / n - j * total / n) as u32,
                        // the worker's time on this share of the batch
                        worker_cpu_s: s.worker_cpu_s.map(|c| c * reads.len() as f64 / r.max(1) as f64),
                        reads,
                        ..s.clone()
                    }
                })
                .collect();
            let bytes: u64 = steps.iter().map(|s| s.bytes).sum();
            let taken = &steps[..g.steps_taken.min(steps.len())];
            let taken_bytes: u64 = taken.iter().map(|s| s.bytes).sum();
            let samples: u64 = taken.iter().map(|s| s.samples as u64).sum();
            let k = taken.len().max(1) as f64;
            let bytes_per_step = taken_bytes as f64 / k;
            let mut readers: Vec<u32> = steps.iter().flat_map(|s| s.reads.iter().map(|r| r.reader)).collect();
            readers.sort_unstable();
            readers.dedup();
            GpuModel {
                untaken_bytes: bytes - taken_bytes,
                steps,
                bytes,
                samples,
                bytes_per_step,
                samples_per_step: samples as f64 / k,
                required_mib_s: need(bytes_per_step, g.compute_s),
                readers: g.readers.min(readers.len().max(1)),
                mib_s_recorded: g.mib_s_recorded.map(|v| v / n as f64),
                unfinished_bytes: g.unfinished_bytes / n as u64,
                write_bursts: if j == 0 { g.write_bursts.clone() } else { Vec::new() },
                setup: if j == 0 { g.setup.clone() } else { Vec::new() },
                ..g.clone()
            }
        })
        .collect()
}

/// The GPU with its compute per step multiplied by `f` (module comment).
pub fn scale_gpu(g: &mut GpuModel, f: f64) {
    g.compute_s = g.compute_s.map(|c| c * f);
    g.interval_p50_s = g.interval_p50_s.map(|c| c * f);
    g.interval_p90_s = g.interval_p90_s.map(|c| c * f);
    for s in &mut g.steps {
        s.interval_s = s.interval_s.map(|c| c * f);
        s.period_s = s.period_s.map(|c| c * f);
    }
    g.required_mib_s = need(g.bytes_per_step, g.compute_s);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{writes, Read};

    const MIB: u64 = 1 << 20;

    /// A GPU of 3 steps; step k has 4 reads of 1 MiB by readers 0..4 (step 2 only 3),
    /// 8 samples, intervals 10, 20, 30 ms.
    fn gpu() -> GpuModel {
        let steps: Vec<Step> = (0..3)
            .map(|k| {
                let reads: Vec<Read> = (0..if k == 2 { 3 } else { 4 })
                    .map(|i| Read {
                        file: i,
                        offset: k as u64 * MIB,
                        len: MIB,
                        reader: i,
                        mapped: false,
                        cpu_after_ns: 0,
                    })
                    .collect();
                Step {
                    bytes: reads.len() as u64 * MIB,
                    reads,
                    samples: 8,
                    first_read_ns: k * 100,
                    ready_ns: k * 100 + 50,
                    interval_s: Some(0.01 * (k + 1) as f64),
                    wait_s: 0.001,
                    period_s: Some(0.01 * (k + 1) as f64),
                    worker_cpu_s: None,
                    taken: true,
                }
            })
            .collect();
        GpuModel {
            index: 0,
            host: None,
            rank_pid: 42,
            comm: "train".into(),
            members: Vec::new(),
            workers: 4,
            readers: 4,
            synchronous: false,
            paced: true,
            prefetch_batches: 8,
            step_signal: "handoff",
            files: (0..4).map(|i| (format!("/d/{i}"), 3 * MIB)).collect(),
            bytes: 11 * MIB,
            samples: 24,
            compute_s: Some(0.02),
            interval_p50_s: Some(0.02),
            interval_p90_s: Some(0.028),
            wait_s: 0.003,
            handoff_s: 0.0005,
            compute_signal: "next_get",
            sync_s: 0.0,
            bytes_per_step: 11.0 * MIB as f64 / 3.0,
            samples_per_step: 8.0,
            required_mib_s: Some(11.0 / 3.0 / 0.02),
            au_recorded: Some(0.9),
            mib_s_recorded: Some(100.0),
            worker_cpu_s_per_sample: None,
            worker_cpu_share: None,
            unfinished_bytes: 0,
            setup: Vec::new(),
            setup_lead_s: 0.0,
            steps_taken: steps.len(),
            untaken_bytes: 0,
            steps,
            write_bursts: vec![writes::WriteBurst {
                start_ns: 0,
                end_ns: 1,
                duration_s: 0.0,
                bytes: 1,
                writes: 1,
                syncs: 0,
                files: 1,
                mib_s: 0.0,
                after_step: Some(1),
                pids: vec![42],
                ops: Vec::new(),
            }],
            write_files: Vec::new(),
        }
    }

    fn model(gpus: Vec<GpuModel>) -> JobModel {
        JobModel {
            data_dev: None,
            object_store: None,
            grouping: "test".into(),
            compute_s: Some(0.02),
            bytes_per_step: None,
            required_mib_s_per_gpu: None,
            steps: 3,
            gpus,
            left_out: Vec::new(),
            coverage: Vec::new(),
            incomplete: None,
            warnings: Vec::new(),
            writes: writes::summarize(Vec::new()),
            hosts: Vec::new(),
        }
    }

    #[test]
    fn split_divides_reads_bytes_and_samples_and_keeps_steps() {
        let opts = Options { gpus_per_process: Some(2), ..Default::default() };
        let m = apply(model(vec![gpu(), gpu()]), &opts).unwrap();
        assert_eq!(m.gpus.len(), 4, "2 processes × 2 accelerators");
        assert_eq!(m.gpus.iter().map(|g| g.index).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
        let (a, b) = (&m.gpus[0], &m.gpus[1]);
        // Every accelerator has every step of its process.
        assert_eq!(a.steps.len(), 3);
        assert_eq!(b.steps.len(), 3);
        // Step 0: reads 0,1 and 2,3; step 2 (3 reads): read 0, then reads 1,2.
        assert_eq!(a.steps[0].reads.iter().map(|r| r.file).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(b.steps[0].reads.iter().map(|r| r.file).collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!(a.steps[2].reads.iter().map(|r| r.file).collect::<Vec<_>>(), vec![0]);
        assert_eq!(b.steps[2].reads.iter().map(|r| r.file).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(a.bytes, 5 * MIB);
        assert_eq!(b.bytes, 6 * MIB);
        assert_eq!(a.bytes + b.bytes, gpu().bytes, "no byte lost or doubled");
        assert_eq!(a.steps.iter().map(|s| s.samples).collect::<Vec<_>>(), vec![4, 4, 4]);
        assert_eq!(a.samples + b.samples, 24);
        // Compute per step is the process's; the need is per accelerator.
        assert_eq!(a.compute_s, Some(0.02));
        assert!((b.required_mib_s.unwrap() - 2.0 / 0.02).abs() < 1e-9, "{:?}", b.required_mib_s);
        assert_eq!(a.readers, 2, "readers 0 and 1 read accelerator 0's share");
        assert_eq!(a.write_bursts.len(), 1);
        assert!(b.write_bursts.is_empty(), "the process's writes are made once");
        assert_eq!(m.steps, 12);
        assert!(m.warnings.iter().any(|w| w.contains("--gpus-per-process")));
    }

    #[test]
    fn split_with_more_accelerators_than_reads_leaves_some_steps_empty() {
        let parts = split_gpu(gpu(), 8);
        assert_eq!(parts.len(), 8);
        assert_eq!(parts.iter().map(|g| g.bytes).sum::<u64>(), 11 * MIB);
        assert_eq!(parts.iter().map(|g| g.samples).sum::<u64>(), 24);
        assert!(parts.iter().all(|g| g.steps.iter().all(|s| s.samples == 1)));
        assert!(parts[0].steps[0].reads.is_empty(), "4 reads over 8: every second one has none");
    }

    #[test]
    fn compute_scale_scales_every_step_and_keeps_the_spread() {
        let opts = Options { compute_scale: Some(0.5), ..Default::default() };
        let m = apply(model(vec![gpu()]), &opts).unwrap();
        let g = &m.gpus[0];
        let before: Vec<f64> = gpu().steps.iter().map(|s| s.period_s.unwrap()).collect();
        let after: Vec<f64> = g.steps.iter().map(|s| s.period_s.unwrap()).collect();
        for (x, y) in before.iter().zip(&after) {
            assert!((y - 0.5 * x).abs() < 1e-12, "{x} → {y}");
        }
        // The spread relative to the mean is the same.
        let cv = |v: &[f64]| {
            let mean = v.iter().sum::<f64>() / v.len() as f64;
            (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64).sqrt() / mean
        };
        assert!((cv(&before) - cv(&after)).abs() < 1e-12);
        assert!(after[2] > after[0], "steps keep their order of lengths");
        assert_eq!(g.steps[1].interval_s, Some(0.01));
        assert_eq!(g.compute_s, Some(0.01));
        assert_eq!(m.compute_s, Some(0.01));
        // Need doubles: same bytes per step in half the compute.
        assert!((g.required_mib_s.unwrap() - 2.0 * gpu().required_mib_s.unwrap()).abs() < 1e-9);
        assert_eq!(m.required_mib_s_per_gpu, g.required_mib_s);
        assert_eq!(g.au_recorded, Some(0.9), "what was recorded stays recorded");
        assert_eq!(g.bytes, 11 * MIB);
    }

    #[test]
    fn bad_values_are_refused() {
        for f in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let opts = Options { compute_scale: Some(f), ..Default::default() };
            assert!(apply(model(vec![gpu()]), &opts).unwrap_err().contains("--compute-scale"));
        }
        let opts = Options { gpus_per_process: Some(0), ..Default::default() };
        assert!(apply(model(vec![gpu()]), &opts).unwrap_err().contains("--gpus-per-process"));
        let m = apply(model(vec![gpu()]), &Options::default()).unwrap();
        assert_eq!(m.gpus.len(), 1);
        assert_eq!(m.gpus[0].compute_s, Some(0.02));
        assert!(m.warnings.is_empty());
    }
}
