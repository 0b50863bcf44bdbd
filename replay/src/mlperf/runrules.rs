//! MLPerf Storage's run rules where a replay can check them (docs/replay.md, *Runs and run rules*):
//! `--runs N` runs of one workload combined into the mean and spread of AU and
//! throughput, and the rules checked against the runs' results: the dataset size
//! (≥ 5 × the clients' RAM and ≥ 500 steps per epoch, computed by `datasize`), the
//! workload's AU threshold, the cache rule (reads reach storage), the number of runs, and
//! the category of MLPerf Storage v3.0 the run falls in (CLOSED, OPEN or whatif; edition.rs).

use crate::mlperf::datasize;
use crate::mlperf::edition::Category;
use crate::workload::Workload;
use serde::Serialize;
use serde_json::{json, Value};

/// MLPerf's number of runs behind one result (Submission guidelines, *benchmark result*).
pub const MLPERF_RUNS: usize = 5;

/// One rule, checked: its name, the verdict and why, with the figures.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Rule {
    pub name: &'static str,
    pub pass: bool,
    pub reason: String,
    /// The `category` rule only: "CLOSED", "OPEN" or "whatif".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<&'static str>,
}

/// Mean, min, max and sample standard deviation (n − 1; 0 for one value).
pub fn spread(values: &[f64]) -> Value {
    let n = values.len().max(1) as f64;
    let mean = values.iter().sum::<f64>() / n;
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let stdev = if values.len() > 1 {
        (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (values.len() - 1) as f64).sqrt()
    } else {
        0.0
    };
    json!({ "mean": mean, "min": if min.is_finite() { min } else { 0.0 }, "max": if max.is_finite() { max } else { 0.0 }, "stdev": stdev })
}

fn num(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or(0.0)
}

fn uint(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or(0)
}

/// The rules for the results of one or more runs of the same job (`runs`, each a
/// single-run results object). `workload` is None in trace mode (no dataset-size rule:
/// the dataset is the trace's files); `threshold_from` says where the AU threshold came
/// from (`metric.au`, `--threshold`); `category` is the run's v3.0 category (workload mode),
/// checked last: it passes for CLOSED and OPEN, and fails for whatif (no submission).
pub fn check(
    workload: Option<&Workload>,
    runs: &[Value],
    threshold_from: &str,
    category: Option<&Category>,
) -> Vec<Rule> {
    let first = &runs[0];
    let s = &first["settings"];
    let (gpus, hosts, ram) = (uint(first, "gpus"), uint(first, "hosts"), uint(first, "client_ram_bytes"));
    let (files, bytes, steps) = (uint(s, "dataset_files"), uint(s, "dataset_bytes"), uint(s, "steps_per_epoch"));
    let mut rules = Vec::new();
    if let Some(w) = workload {
        let rule = datasize::sizing(w, gpus, hosts, ram);
        let pass = files >= rule.num_files_train && steps >= datasize::MIN_STEPS;
        rules.push(Rule {
            name: "dataset_size",
            pass,
            reason: format!(
                "the run reads {files} files ({}) and runs {steps} steps per epoch; for {gpus} GPUs and {} client RAM ({hosts} host(s)) MLPerf needs num_files_train ≥ {} (by 5 × RAM {}, by 500 steps {}) and ≥ {} steps per epoch",
                datasize::human_bytes(bytes as f64),
                datasize::gib(ram as f64),
                rule.num_files_train,
                rule.files_by_ram,
                rule.files_by_steps,
                datasize::MIN_STEPS
            ),
            verdict: None,
        });
    }
    let threshold = num(first, "threshold_percent");
    let model = first["settings"]["name"].as_str().unwrap_or("the workload");
    let au: Vec<f64> = runs.iter().map(|r| num(r, "au_percent")).collect();
    let low = au.iter().copied().fold(f64::INFINITY, f64::min);
    let failed = au.iter().filter(|&&a| a < threshold).count();
    let reason = if runs.len() == 1 {
        format!(
            "AU {:.2}% {} the threshold {threshold:.0}% for {model} ({threshold_from})",
            au[0],
            if failed == 0 { "≥" } else { "<" }
        )
    } else {
        format!(
            "AU of each run against the threshold {threshold:.0}% for {model} ({threshold_from}): {} of {} runs below it; lowest {low:.2}%, mean {:.2}%",
            failed,
            runs.len(),
            au.iter().sum::<f64>() / au.len() as f64
        )
    };
    rules.push(Rule { name: "au_threshold", pass: failed == 0, reason, verdict: None });
    let (odirect, dropped) = (s["odirect"].as_bool() == Some(true), s["drop_caches"].as_bool() == Some(true));
    let limit = datasize::RAM_FACTOR as f64 * ram as f64;
    let dataset = |cmp: &str| {
        format!(
            "the dataset the run reads ({}) is {cmp} 5 × the RAM of the {hosts} client host(s) (5 × {} = {})",
            datasize::gib(bytes as f64),
            datasize::gib(ram as f64),
            datasize::gib(limit)
        )
    };
    let (pass, reason) = if odirect {
        (true, "every sample is read with O_DIRECT (--odirect or reader.odirect): no page cache".to_string())
    } else if dropped {
        (true, "the page cache is dropped before each run (--drop-caches)".to_string())
    } else if bytes as f64 >= limit {
        (true, dataset("≥"))
    } else {
        (
            false,
            format!(
                "{} and neither --odirect nor --drop-caches is set: reads may come from the page cache",
                dataset("<")
            ),
        )
    };
    rules.push(Rule { name: "cache", pass, reason, verdict: None });
    rules.push(Rule {
        name: "runs",
        pass: runs.len() >= MLPERF_RUNS,
        reason: format!(
            "{} run(s) of the same dataset; MLPerf's result is the mean of {MLPERF_RUNS} consecutive runs (--runs {MLPERF_RUNS})",
            runs.len()
        ),
        verdict: None,
    });
    if let Some(c) = category {
        rules.push(Rule {
            name: "category",
            pass: c.verdict != "whatif",
            reason: c.reason.clone(),
            verdict: Some(c.verdict),
        });
    }
    rules
}

/// The figures whose spread over the runs is reported (`summary`).
pub const SPREAD_KEYS: &[&str] = &["au_percent", "throughput_mib_s", "throughput_mb_s", "samples_per_s", "wall_s"];

/// The results of `runs` (N ≥ 2) as one object: the job's identity, the means at the top,
/// `summary` (mean, min, max, stdev of each of SPREAD_KEYS), `runs[]` (each run's full
/// results, `run` numbered from 1) and `rules[]`.
pub fn combine(runs: Vec<Value>, rules: &[Rule]) -> Value {
    let first = runs[0].clone();
    let mut summary = serde_json::Map::new();
    for key in SPREAD_KEYS {
        let values: Vec<f64> = runs.iter().map(|r| num(r, key)).collect();
        summary.insert((*key).to_string(), spread(&values));
    }
    let mean = |key: &str| summary[key]["mean"].clone();
    let pass = runs.iter().all(|r| r["pass"].as_bool() == Some(true));
    let numbered: Vec<Value> = runs
        .into_iter()
        .enumerate()
        .map(|(i, mut r)| {
            r["run"] = json!(i + 1);
            r
        })
        .collect();
    json!({
        "tool": "trainio replay",
        "version": env!("CARGO_PKG_VERSION"),
        "run_count": numbered.len(),
        "gpus": first["gpus"],
        "ranks": first["ranks"],
        "hosts": first["hosts"],
        "hostnames": first["hostnames"],
        "client_ram_bytes": first["client_ram_bytes"],
        "threshold_percent": first["threshold_percent"],
        "pass": pass,
        "au_percent": mean("au_percent"),
        "throughput_mib_s": mean("throughput_mib_s"),
        "throughput_mb_s": mean("throughput_mb_s"),
        "samples_per_s": mean("samples_per_s"),
        "summary": summary,
        "settings": first["settings"],
        "runs": numbered,
        "rules": rules,
    })
}

/// The table of the runs (one line each, then mean, min, max, stdev).
pub fn human_table(combined: &Value) -> String {
    let runs = combined["runs"].as_array().cloned().unwrap_or_default();
    let mut out = format!(
        "trainio replay: {} runs of {} ({} simulated GPUs), threshold {:.0}%\n",
        runs.len(),
        combined["settings"]["name"].as_str().unwrap_or(""),
        combined["gpus"],
        num(combined, "threshold_percent")
    );
    out += &format!(
        "  {:<6} {:>8} {:>10} {:>10} {:>12} {:>8}  {}\n",
        "run", "AU %", "MiB/s", "MB/s", "samples/s", "wall s", "AU"
    );
    for r in &runs {
        out += &format!(
            "  {:<6} {:>8.2} {:>10.1} {:>10.1} {:>12.1} {:>8.2}  {}\n",
            r["run"].to_string(),
            num(r, "au_percent"),
            num(r, "throughput_mib_s"),
            num(r, "throughput_mb_s"),
            num(r, "samples_per_s"),
            num(r, "wall_s"),
            if r["pass"].as_bool() == Some(true) { "PASS" } else { "FAIL" }
        );
    }
    let sum = &combined["summary"];
    for stat in ["mean", "min", "max", "stdev"] {
        let v = |k: &str| sum[k][stat].as_f64().unwrap_or(0.0);
        out += &format!(
            "  {:<6} {:>8.2} {:>10.1} {:>10.1} {:>12.1} {:>8.2}\n",
            stat,
            v("au_percent"),
            v("throughput_mib_s"),
            v("throughput_mb_s"),
            v("samples_per_s"),
            v("wall_s")
        );
    }
    out
}

/// The rules, one line each: `PASS`/`FAIL`, the name, the reason.
pub fn human_rules(rules: &[Rule]) -> String {
    let mut out = String::from("  MLPerf run rules:\n");
    for r in rules {
        out += &format!("    {} {:<13} {}\n", if r.pass { "PASS" } else { "FAIL" }, r.name, r.reason);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(au: f64, mib: f64, files: u64, bytes: u64, steps: u64, odirect: bool, drop: bool) -> Value {
        json!({
            "gpus": 2, "ranks": 1, "hosts": 1, "hostnames": ["h"], "client_ram_bytes": 1u64 << 30,
            "threshold_percent": 90.0, "pass": au >= 90.0, "au_percent": au, "throughput_mib_s": mib,
            "throughput_mb_s": mib * 1.048576, "samples_per_s": mib, "wall_s": 1.0,
            "settings": { "name": "w", "dataset_files": files, "dataset_bytes": bytes, "steps_per_epoch": steps,
                          "odirect": odirect, "drop_caches": drop },
        })
    }

    fn workload() -> Workload {
        let y = "dataset:\n  num_files_train: 1\n  num_samples_per_file: 1\n  record_length_bytes: 1048576\nreader:\n  batch_size: 4\ntrain:\n  computation_time: 0.1\n";
        Workload::from_yaml(y, "w").unwrap()
    }

    #[test]
    fn spread_by_hand() {
        let s = spread(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!((s["mean"].as_f64(), s["min"].as_f64(), s["max"].as_f64()), (Some(2.5), Some(1.0), Some(4.0)));
        // Σ(x − 2.5)² = 5, / 3.
        assert!((s["stdev"].as_f64().unwrap() - (5.0f64 / 3.0).sqrt()).abs() < 1e-12);
        assert_eq!(spread(&[7.0])["stdev"].as_f64(), Some(0.0));
    }

    #[test]
    fn dataset_size_rule_by_hand() {
        // 1 GiB of RAM, 1 MiB files: 5 × 1024 = 5120 files by RAM; 500 × 2 × 4 = 4000 by steps.
        let w = workload();
        let by = |files, steps| {
            check(Some(&w), &[run(95.0, 1.0, files, files << 20, steps, false, false)], "metric.au", None)
        };
        let r = &by(5120, 2560)[0];
        assert_eq!((r.name, r.pass), ("dataset_size", true));
        assert!(r.reason.contains("≥ 5120 (by 5 × RAM 5120, by 500 steps 4000)"), "{}", r.reason);
        assert!(!by(5119, 2559)[0].pass);
        assert!(!by(6000, 499)[0].pass, "--steps below 500 fails the rule");
        assert!(check(None, &[run(95.0, 1.0, 1, 1, 1, false, false)], "x", None)
            .iter()
            .all(|r| r.name != "dataset_size"));
    }

    #[test]
    fn au_cache_and_runs_rules() {
        let w = workload();
        let get = |rules: Vec<Rule>, name: &str| rules.into_iter().find(|r| r.name == name).unwrap();
        let small = |au, o, d| run(au, 1.0, 10, 10 << 20, 5, o, d);
        assert!(get(check(Some(&w), &[small(90.0, false, false)], "metric.au", None), "au_threshold").pass);
        let low = get(
            check(Some(&w), &[small(95.0, false, false), small(89.9, false, false)], "metric.au", None),
            "au_threshold",
        );
        assert!(!low.pass && low.reason.contains("1 of 2 runs below it; lowest 89.90%"), "{}", low.reason);
        assert!(!get(check(Some(&w), &[small(95.0, false, false)], "m", None), "cache").pass);
        assert!(get(check(Some(&w), &[small(95.0, true, false)], "m", None), "cache").pass);
        assert!(get(check(Some(&w), &[small(95.0, false, true)], "m", None), "cache").pass);
        // 5 × 1 GiB of reads with neither: the dataset outruns the page cache.
        assert!(get(check(Some(&w), &[run(95.0, 1.0, 5120, 5 << 30, 5, false, false)], "m", None), "cache").pass);
        assert!(!get(check(Some(&w), &[small(95.0, true, false)], "m", None), "runs").pass);
        assert!(get(check(Some(&w), &vec![small(95.0, true, false); 5], "m", None), "runs").pass);
    }

    #[test]
    fn threshold_names_the_model_and_category_is_last() {
        let w = workload();
        let mut r = run(86.0, 1.0, 10, 10 << 20, 5, true, false);
        r["threshold_percent"] = json!(85.0);
        r["settings"]["name"] = json!("retinanet");
        let closed = crate::mlperf::edition::category("retinanet", Some("b200"), &[]);
        let rules =
            check(Some(&w), std::slice::from_ref(&r), "MLPerf Storage v3.0's threshold for retinanet", Some(&closed));
        let au = rules.iter().find(|x| x.name == "au_threshold").unwrap();
        assert!(au.pass && au.reason.contains("threshold 85% for retinanet"), "{}", au.reason);
        let last = rules.last().unwrap();
        assert_eq!((last.name, last.pass, last.verdict), ("category", true, Some("CLOSED")));
        let j = serde_json::to_value(&rules).unwrap();
        assert_eq!(j[4]["verdict"], "CLOSED");
        assert!(j[0].get("verdict").is_none(), "only the category rule carries a verdict");
        let whatif = crate::mlperf::edition::category("retinanet", Some("b200"), &["train.computation_time".into()]);
        let rules = check(Some(&w), &[r], "m", Some(&whatif));
        let last = rules.last().unwrap();
        assert!(!last.pass && last.verdict == Some("whatif") && last.reason.contains("train.computation_time"));
    }

    #[test]
    fn combined_results() {
        let runs = vec![run(92.0, 100.0, 1, 1, 1, true, false), run(88.0, 80.0, 1, 1, 1, true, false)];
        let rules = check(None, &runs, "m", None);
        let c = combine(runs, &rules);
        assert_eq!(c["run_count"], 2);
        assert_eq!(c["au_percent"].as_f64(), Some(90.0));
        assert_eq!(c["summary"]["throughput_mib_s"]["min"].as_f64(), Some(80.0));
        assert_eq!(c["runs"][1]["run"], 2);
        assert_eq!(c["pass"], false, "one run below the threshold fails the set");
        assert_eq!(c["rules"].as_array().unwrap().len(), 3);
        let table = human_table(&c);
        assert!(table.contains("stdev") && table.lines().count() == 1 + 1 + 2 + 4, "{table}");
    }
}
