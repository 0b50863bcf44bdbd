//! MLPerf Storage v3.0, the edition submissions are made to now: its training models and
//! accelerators, the AU threshold of each model, the keys a CLOSED or OPEN run may change,
//! and its checkpoint table (docs/replay.md, *Runs and run rules*; docs/design/replay.md, *The checkpoint formula*). The facts come from mlcommons/storage: mlpstorage_py/rules/editions.yaml (the
//! workloads, the checker's thresholds, Table 2's checkpoint sizes), mlpstorage_py/config.py
//! (accelerators, checkpoint models) and Rules.md §3.6.2 (the keys CLOSED and OPEN may change).

use std::path::Path;

pub const EDITION: &str = "MLPerf Storage v3.0";

/// The accelerator types the edition's tool knows.
pub const ACCELERATORS: &[&str] = &["b200", "mi355", "h100", "a100"];
/// Accelerators CLOSED and OPEN accept; the others run as whatif only.
pub const SUBMITTABLE_ACCELERATORS: &[&str] = &["b200", "mi355"];
/// Training models of CLOSED and OPEN; the tool's whatif mode runs every model.
pub const SUBMITTABLE_MODELS: &[&str] = &["unet3d", "retinanet"];

/// The edition's minimum mean AU of a training model, percent (editions.yaml's checker).
pub fn au_threshold_percent(model: &str) -> Option<f64> {
    match model {
        "unet3d" => Some(90.0),
        "retinanet" => Some(85.0),
        _ => None,
    }
}

/// Workload keys a CLOSED run may set (Rules.md §3.6.2).
pub const CLOSED_KEYS: &[&str] = &[
    "dataset.num_files_train",
    "dataset.num_subfolders_train",
    "dataset.data_folder",
    "reader.read_threads",
    "reader.computation_threads",
    "reader.transfer_size",
    "reader.odirect",
    "reader.prefetch_size",
    "checkpoint.checkpoint_folder",
    "storage.storage_type",
    "storage.storage_root",
];

/// Keys OPEN may set on top of CLOSED's.
pub const OPEN_KEYS: &[&str] = &["framework", "dataset.format", "dataset.num_samples_per_file", "reader.data_loader"];

/// The accelerator a workload file is for, from its name as the edition's templates are
/// named (`<model>_<accelerator>.yaml`, e.g. unet3d_b200.yaml, dlrm_parquet_h100.yaml).
pub fn accelerator_of(path: &Path) -> Option<&'static str> {
    let stem = path.file_stem()?.to_str()?.to_ascii_lowercase();
    stem.split('_').filter_map(|part| ACCELERATORS.iter().find(|a| **a == part).copied()).next_back()
}

/// Which of the edition's categories a run of a training workload falls in.
#[derive(Debug, Clone, PartialEq)]
pub struct Category {
    /// "CLOSED", "OPEN" or "whatif".
    pub verdict: &'static str,
    pub reason: String,
}

/// The category of a run of `model` on `accelerator` (None: the file's name does not say)
/// with the workload keys `changed` set by overrides or options (dotted keys; options that
/// are no workload key, such as --steps, by their flag).
pub fn category(model: &str, accelerator: Option<&str>, changed: &[String]) -> Category {
    let whatif = |why: String| Category { verdict: "whatif", reason: format!("whatif: {why}") };
    if !SUBMITTABLE_MODELS.contains(&model) {
        return whatif(format!(
            "{model} is not a training workload of {EDITION} (CLOSED and OPEN: {})",
            SUBMITTABLE_MODELS.join(", ")
        ));
    }
    match accelerator {
        None => {
            return whatif(format!(
                "the workload file's name does not name an accelerator ({model}_<accelerator>.yaml, one of {})",
                ACCELERATORS.join(", ")
            ))
        }
        Some(a) if !SUBMITTABLE_ACCELERATORS.contains(&a) => {
            return whatif(format!(
                "{a} is whatif-only in {EDITION} (CLOSED and OPEN: {})",
                SUBMITTABLE_ACCELERATORS.join(", ")
            ))
        }
        Some(_) => {}
    }
    let accelerator = accelerator.unwrap_or_default();
    let mut keys: Vec<&str> = changed.iter().map(String::as_str).collect();
    keys.sort_unstable();
    keys.dedup();
    let beyond = |allowed: &dyn Fn(&str) -> bool| keys.iter().copied().filter(|k| !allowed(k)).collect::<Vec<_>>();
    let not_closed = beyond(&|k| CLOSED_KEYS.contains(&k));
    let not_open = beyond(&|k| CLOSED_KEYS.contains(&k) || OPEN_KEYS.contains(&k));
    if !not_open.is_empty() {
        return whatif(format!(
            "{model} on {accelerator} with {} changed, which neither CLOSED nor OPEN may change",
            not_open.join(", ")
        ));
    }
    if !not_closed.is_empty() {
        return Category {
            verdict: "OPEN",
            reason: format!(
                "OPEN: {model} on {accelerator} with {} changed, which only OPEN may change",
                not_closed.join(", ")
            ),
        };
    }
    let what = if keys.is_empty() { "as published".to_string() } else { format!("with {} changed", keys.join(", ")) };
    Category {
        verdict: "CLOSED",
        reason: format!("CLOSED: {model} on {accelerator} {what}, all of which CLOSED may change"),
    }
}

/// The dotted key of each override (`KEY=VALUE`, as Workload::params holds them).
pub fn override_keys(params: &[String]) -> Vec<String> {
    params.iter().map(|p| p.split_once('=').map_or(p.as_str(), |(k, _)| k).to_string()).collect()
}

/// A Parquet row's bytes as the edition's dataset-size rule counts them when a workload
/// gives no `record_length_bytes` (mlpstorage_py/rules/utils.py): each column of
/// `dataset.parquet.columns` is `size` values (1 without it) of 8 bytes for float64 and
/// int64, 1 for uint8 and bool, and 4 for every other dtype (float16 and int8 among them,
/// whatever they take on disk). None without columns.
pub fn parquet_rule_record_length(dataset: &serde_yaml::Value) -> Option<f64> {
    let columns = dataset.get("parquet")?.get("columns")?.as_sequence()?;
    if columns.is_empty() {
        return None;
    }
    let mut bytes = 0.0;
    for c in columns {
        let dtype = c.get("dtype").and_then(serde_yaml::Value::as_str).unwrap_or("float32");
        let size = match c.get("size") {
            None => 1.0,
            Some(v) => crate::yaml_keys::to_f64(v)?.trunc(),
        };
        let width = match dtype {
            "float64" | "int64" => 8.0,
            "uint8" | "bool" => 1.0,
            _ => 4.0,
        };
        bytes += size * width;
    }
    Some(bytes)
}

/// One row of the edition's checkpoint table (Table 2, editions.yaml): the model as the
/// llama3 files name it, CLOSED's processes (TP × PP × DP) and the checkpoint's size in GB.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CheckpointRow {
    pub model: &'static str,
    pub hidden_size: u64,
    pub processes: u64,
    pub size_gb: f64,
}

/// Table 2 by hidden size (what tells the llama3 files apart). 1T's 18,000 GB is the
/// table's figure; the bytes DLIO's formula writes for it are 15,427 GiB (editions.yaml's
/// measured size), so its row is matched within 15 %.
pub const CHECKPOINTS: &[CheckpointRow] = &[
    CheckpointRow { model: "llama3-8b", hidden_size: 4096, processes: 8, size_gb: 105.0 },
    CheckpointRow { model: "llama3-70b", hidden_size: 8192, processes: 64, size_gb: 912.0 },
    CheckpointRow { model: "llama3-405b", hidden_size: 16384, processes: 512, size_gb: 5290.0 },
    CheckpointRow { model: "llama3-1t", hidden_size: 25872, processes: 1024, size_gb: 18000.0 },
];

/// The table's row for a checkpoint model of `hidden_size`, and whether `planned_bytes`
/// over `world` processes matches it: the same processes, and the size within 1 % (the
/// table's GB are GiB; 15 % for 1T, whose table size is not the formula's).
pub fn checkpoint_match(hidden_size: u64, world: u64, planned_bytes: u64) -> Option<(CheckpointRow, bool, String)> {
    let row = *CHECKPOINTS.iter().find(|r| r.hidden_size == hidden_size)?;
    let gib = planned_bytes as f64 / (1u64 << 30) as f64;
    let tolerance = if row.model == "llama3-1t" { 0.15 } else { 0.01 };
    let size_ok = (gib - row.size_gb).abs() <= tolerance * row.size_gb;
    let full = world == row.processes;
    let reason = format!(
        "{EDITION} Table 2: {} writes {} GB over {} processes; this plan writes {gib:.1} GiB over {world}{}",
        row.model,
        row.size_gb,
        row.processes,
        match (full, size_ok) {
            (true, true) => ": matches".to_string(),
            (false, _) => format!(": a subset of the {} processes", row.processes),
            (true, false) => format!(": the size is not within {:.0} % of the table's", tolerance * 100.0),
        }
    );
    Some((row, full && size_ok, reason))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accelerators_from_file_names() {
        for (name, acc) in [
            ("configs/unet3d_b200.yaml", Some("b200")),
            ("retinanet_mi355.yaml", Some("mi355")),
            ("dlrm_parquet_h100.yaml", Some("h100")),
            ("unet3d_a100.yaml", Some("a100")),
            ("flux_datagen.yaml", None),
            ("demo-unet3d.yaml", None),
        ] {
            assert_eq!(accelerator_of(Path::new(name)), acc, "{name}");
        }
    }

    #[test]
    fn categories() {
        let keys = |k: &[&str]| k.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let c = category("retinanet", Some("b200"), &[]);
        assert_eq!(c.verdict, "CLOSED", "{}", c.reason);
        let c = category("unet3d", Some("mi355"), &keys(&["dataset.num_files_train", "reader.read_threads"]));
        assert_eq!(c.verdict, "CLOSED", "{}", c.reason);
        let c = category("unet3d", Some("b200"), &keys(&["dataset.format", "dataset.num_files_train"]));
        assert_eq!((c.verdict, c.reason.contains("dataset.format")), ("OPEN", true), "{}", c.reason);
        let c = category("unet3d", Some("b200"), &keys(&["train.computation_time", "dataset.format"]));
        assert_eq!(c.verdict, "whatif", "{}", c.reason);
        assert!(c.reason.contains("train.computation_time") && !c.reason.contains("dataset.format"), "{}", c.reason);
        assert_eq!(category("unet3d", Some("h100"), &[]).verdict, "whatif");
        assert_eq!(category("flux", Some("b200"), &[]).verdict, "whatif");
        assert_eq!(category("dlrm", Some("mi355"), &[]).verdict, "whatif");
        assert_eq!(category("unet3d", None, &[]).verdict, "whatif");
        assert_eq!(category("unet3d", Some("b200"), &keys(&["--steps"])).verdict, "whatif");
    }

    #[test]
    fn thresholds_and_overrides() {
        assert_eq!(au_threshold_percent("retinanet"), Some(85.0));
        assert_eq!(au_threshold_percent("unet3d"), Some(90.0));
        assert_eq!(au_threshold_percent("flux"), None);
        assert_eq!(override_keys(&["a.b=1".into(), "c.d=x=y".into()]), ["a.b", "c.d"]);
    }

    #[test]
    fn parquet_record_length_as_the_rule_counts_it() {
        let y = |t: &str| serde_yaml::from_str::<serde_yaml::Value>(t).unwrap();
        // flux's columns: 541,208 float32 values = its record_length, 2,164,832 B.
        let flux = y("parquet:\n  columns:\n    - {name: a, dtype: float32, size: 524328}\n    - {name: b, dtype: float32, size: 409}\n    - {name: c, dtype: float32, size: 8232}\n    - {name: d, dtype: float32, size: 8232}\n    - {name: e, dtype: float32, size: 7}\n");
        assert_eq!(parquet_rule_record_length(&flux), Some(2_164_832.0));
        // float16 and int8 count 4 bytes each, float64 8, bool 1, no size 1 value.
        let mixed = y("parquet:\n  columns:\n    - {dtype: float16}\n    - {dtype: int8}\n    - {dtype: float64, size: 2}\n    - {dtype: bool}\n");
        assert_eq!(parquet_rule_record_length(&mixed), Some(4.0 + 4.0 + 16.0 + 1.0));
        assert_eq!(parquet_rule_record_length(&y("format: npz\n")), None);
    }

    #[test]
    fn checkpoint_table() {
        let gib = 1u64 << 30;
        let (row, ok, reason) = checkpoint_match(4096, 8, 105 * gib).unwrap();
        assert_eq!((row.model, ok), ("llama3-8b", true), "{reason}");
        assert!(!checkpoint_match(4096, 8, 90 * gib).unwrap().1);
        assert!(!checkpoint_match(8192, 8, 912 * gib).unwrap().1, "8 of 64 processes is a subset");
        assert!(checkpoint_match(25872, 1024, 15_427 * gib).unwrap().1);
        assert!(checkpoint_match(512, 8, gib).is_none());
    }
}
