//! The model of a trace set (the per-host traces of one job): every host's GPUs on the
//! set's clock, the job's figures over all of them.

use crate::job::{Coverage, JobModel, LeftOut, ObjectSource};
use crate::stats::quantile;
use crate::writes;

/// One job's model from its hosts' models: (host, shift onto the set's clock, model). The
/// GPUs are every host's, numbered in host order, their times moved onto the set's clock;
/// the job's figures are computed over them as [`infer`] computes one host's.
pub fn combine(parts: Vec<(String, i64, JobModel)>) -> JobModel {
    let mut gpus = Vec::new();
    let mut left_out = Vec::new();
    let mut coverage = Vec::new();
    let mut warnings = Vec::new();
    let mut incomplete = Vec::new();
    let mut bursts = Vec::new();
    let mut hosts = Vec::new();
    let mut devs: Vec<String> = Vec::new();
    let mut grouping = String::new();
    let mut stores: Vec<ObjectSource> = Vec::new();
    for (host, shift, m) in parts {
        if let Some(o) = m.object_store {
            match stores.iter_mut().find(|s| s.endpoint == o.endpoint && s.bucket == o.bucket) {
                Some(s) => {
                    s.requests += o.requests;
                    s.bytes += o.bytes;
                }
                None => stores.push(o),
            }
        }
        if grouping.is_empty() {
            grouping = m.grouping.clone();
        }
        if let Some(d) = &m.data_dev {
            if !devs.contains(d) {
                devs.push(d.clone());
            }
        }
        for mut g in m.gpus {
            g.index = gpus.len();
            g.host = Some(host.clone());
            for s in &mut g.steps {
                s.first_read_ns += shift;
                s.ready_ns += shift;
            }
            for b in &mut g.write_bursts {
                b.start_ns += shift;
                b.end_ns += shift;
            }
            gpus.push(g);
        }
        left_out.extend(m.left_out.into_iter().map(|l| LeftOut { host: Some(host.clone()), ..l }));
        coverage.extend(m.coverage.into_iter().map(|c| Coverage { host: Some(host.clone()), ..c }));
        warnings.extend(m.warnings.into_iter().map(|w| format!("{host}: {w}")));
        incomplete.extend(m.incomplete.map(|w| format!("{host}: {w}")));
        bursts.extend(m.writes.bursts.into_iter().map(|mut b| {
            b.start_ns += shift;
            b.end_ns += shift;
            b
        }));
        hosts.push(host);
    }
    bursts.sort_by_key(|b| (b.start_ns, b.end_ns));
    let computes: Vec<f64> = gpus.iter().filter_map(|g| g.compute_s).collect();
    let bps: Vec<f64> = gpus.iter().filter(|g| !g.steps.is_empty()).map(|g| g.bytes_per_step).collect();
    let reqs: Vec<f64> = gpus.iter().filter_map(|g| g.required_mib_s).collect();
    JobModel {
        // one device when every host read the same MAJ:MIN (shared storage seen alike)
        data_dev: (devs.len() == 1).then(|| devs[0].clone()),
        // one object store when every host read from the same one
        object_store: (devs.len() == 1 && stores.len() == 1).then(|| stores.remove(0)),
        grouping: format!("{grouping}; {} hosts", hosts.len()),
        compute_s: quantile(&computes, 0.5),
        bytes_per_step: quantile(&bps, 0.5),
        required_mib_s_per_gpu: quantile(&reqs, 0.5),
        steps: gpus.iter().map(|g| g.steps_taken as u64).sum(),
        gpus,
        left_out,
        coverage,
        incomplete: (!incomplete.is_empty()).then(|| incomplete.join("; ")),
        warnings,
        writes: writes::summarize(bursts),
        hosts,
    }
}
