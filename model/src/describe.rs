//! The model as `analyze` and `replay` show it: its JSON and its printed lines.

use crate::job::JobModel;

/// The model as JSON (without the per-read lists).
pub fn to_json(m: &JobModel) -> String {
    serde_json::to_string(m).expect("the model serializes")
}

/// One line per GPU and the job's figures, as `analyze` and `replay` print them.
pub fn describe(m: &JobModel) -> Vec<String> {
    let mut out = Vec::new();
    let f = |x: Option<f64>, scale: f64, unit: &str| {
        x.map(|v| format!("{:.1} {unit}", v * scale)).unwrap_or_else(|| "-".into())
    };
    let source = match &m.object_store {
        Some(o) => format!(
            "data from object store s3://{}/{} ({} GETs, {:.2} MiB)",
            o.endpoint,
            o.bucket,
            o.requests,
            o.bytes as f64 / (1u64 << 20) as f64
        ),
        None => format!("data device {}", m.data_dev.as_deref().unwrap_or("?")),
    };
    out.push(format!("job model: {} GPU(s) found ({}); {source}", m.gpus.len(), m.grouping));
    for g in &m.gpus {
        let workers: Vec<String> = g.members.iter().filter(|x| x.role == "worker").map(|x| x.pid.to_string()).collect();
        out.push(format!(
            "  GPU {}{}: rank pid {} ({}){}; {} steps ({}), compute {}/step{}, {:.2} MiB/step, {:.1} samples/step, needs {}",
            g.index,
            g.host.as_deref().map(|h| format!(" on {h}")).unwrap_or_default(),
            g.rank_pid,
            g.comm,
            if workers.is_empty() { String::new() } else { format!(" + {} worker(s) {}", workers.len(), workers.join(",")) },
            g.steps_taken,
            match g.steps.len() - g.steps_taken.min(g.steps.len()) {
                0 => g.step_signal.to_string(),
                n => format!("{}; and {n} batch(es) read ahead, never taken", g.step_signal),
            },
            f(g.compute_s, 1e3, "ms"),
            if g.compute_signal == "collective" {
                format!(" + collective {:.1} ms", g.sync_s * 1e3)
            } else {
                String::new()
            },
            g.bytes_per_step / (1u64 << 20) as f64,
            g.samples_per_step,
            f(g.required_mib_s, 1.0, "MiB/s"),
        ));
        if let (Some(per), Some(share)) = (g.worker_cpu_s_per_sample, g.worker_cpu_share) {
            out.push(format!(
                "    worker CPU per sample {:.2} ms ({:.0}% of a worker's time on a batch, the rest in its reads)",
                per * 1e3,
                share * 100.0
            ));
        }
        if !g.write_bursts.is_empty() {
            let at: Vec<String> = g
                .write_bursts
                .iter()
                .map(|b| b.after_step.map(|k| k.to_string()).unwrap_or_else(|| "start".into()))
                .collect();
            out.push(format!(
                "    writes: {} burst(s) after steps {}, {:.2} MiB, {} sync(s)",
                g.write_bursts.len(),
                at.join(","),
                g.write_bursts.iter().map(|b| b.bytes).sum::<u64>() as f64 / (1u64 << 20) as f64,
                g.write_bursts.iter().map(|b| b.syncs).sum::<u64>(),
            ));
        }
    }
    for l in &m.left_out {
        out.push(format!(
            "  left out: pid {} ({}), {:.2} MiB: {}",
            l.pid,
            l.comm,
            l.bytes as f64 / (1u64 << 20) as f64,
            l.why
        ));
    }
    if let Some(msg) = &m.incomplete {
        out.push(format!("  INCOMPLETE: {msg}"));
    }
    for w in &m.warnings {
        out.push(format!("  note: {w}"));
    }
    out
}
