//! MLPerf Storage's dataset-size rule (`trainio datasize`, and the check datagen and
//! replay print before they start), computed as mlcommons/storage's `mlpstorage training
//! datasize` computes it (`calculate_training_data_size`, mlpstorage/rules/utils.py;
//! mlpstorage/rules.py in older trees):
//!
//! ```text
//! file_bytes     = num_samples_per_file × record_length_bytes
//! files_by_ram   = (5 × total client RAM) // file_bytes
//! files_by_steps = (500 × accelerators × batch_size) // num_samples_per_file
//! num_files_train = max(files_by_ram, files_by_steps);  bytes = num_files_train × file_bytes
//! ```
//!
//! `//` is Python's floor division: on whole numbers when `record_length_bytes` is one
//! (unet3d, cosmoflow), on floats when it is not (resnet50's 114660.07), as there.

use crate::workload::Workload;
use serde::Serialize;

/// MLPerf's minimum ratio of dataset size to total client RAM.
pub const RAM_FACTOR: u64 = 5;
/// MLPerf's minimum steps per epoch.
pub const MIN_STEPS: u64 = 500;
/// Where the formula comes from (docs/replay.md, *Dataset size*).
pub const SOURCE: &str = "mlcommons/storage mlpstorage/rules/utils.py calculate_training_data_size";

/// The rule's numbers for one workload, accelerator count and client RAM.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Sizing {
    pub gpus: u64,
    pub hosts: u64,
    pub client_ram_bytes: u64,
    pub record_length_bytes: f64,
    pub num_samples_per_file: u64,
    pub batch_size: u64,
    pub file_bytes: f64,
    pub files_by_ram: u64,
    pub files_by_steps: u64,
    pub num_files_train: u64,
    pub dataset_bytes: u64,
    pub steps_per_epoch: u64,
    /// "ram" or "steps": which of the two minimums sets num_files_train.
    pub decided_by: &'static str,
    pub formula: &'static str,
}

/// Python's `a // b` on two positive floats (CPython's float_floor_div): the quotient
/// of `a - fmod(a, b)` by `b`, floored, and rounded to the nearer whole number when the
/// division left it more than half away.
fn py_floordiv(a: f64, b: f64) -> f64 {
    let rem = a % b; // Rust's % on f64 is C's fmod.
    let div = (a - rem) / b;
    let mut floor = div.floor();
    if div - floor > 0.5 {
        floor += 1.0;
    }
    floor
}

/// The rule for `gpus` simulated accelerators and `client_ram_bytes` of RAM over all
/// client hosts, from the workload's (already overridden) keys.
pub fn sizing(w: &Workload, gpus: u64, hosts: u64, client_ram_bytes: u64) -> Sizing {
    let spf = w.num_samples_per_file;
    let record = w.rule_record_length;
    let ram5 = RAM_FACTOR as u128 * client_ram_bytes as u128;
    let files_by_steps = (MIN_STEPS as u128 * gpus as u128 * w.batch_size as u128 / spf as u128) as u64;
    let whole = record.fract() == 0.0 && record < (1u64 << 53) as f64;
    let (file_bytes, files_by_ram, required_ram_wins) = if whole {
        let fb = spf as u128 * record as u128;
        let by_ram = (ram5 / fb) as u64;
        (fb as f64, by_ram, by_ram >= files_by_steps)
    } else {
        let fb = spf as f64 * record;
        let by_ram = py_floordiv(ram5 as f64, fb);
        (fb, by_ram as u64, by_ram >= files_by_steps as f64)
    };
    let num_files_train = files_by_ram.max(files_by_steps);
    let dataset_bytes = if whole {
        (num_files_train as u128 * file_bytes as u128).min(u64::MAX as u128) as u64
    } else {
        (num_files_train as f64 * file_bytes) as u64
    };
    let steps_per_epoch = (num_files_train as u128 * spf as u128 / (w.batch_size as u128 * gpus.max(1) as u128)) as u64;
    Sizing {
        gpus,
        hosts,
        client_ram_bytes,
        record_length_bytes: record,
        num_samples_per_file: spf,
        batch_size: w.batch_size,
        file_bytes,
        files_by_ram,
        files_by_steps,
        num_files_train,
        dataset_bytes,
        steps_per_epoch,
        decided_by: if required_ram_wins && files_by_ram > files_by_steps { "ram" } else { "steps" },
        formula: SOURCE,
    }
}

/// Bytes per second one simulated accelerator reads at 100% AU: record × batch / the
/// mean computation time per step. None without compute time.
pub fn need_bytes_per_s(w: &Workload) -> Option<f64> {
    let compute = w.computation_time.mean();
    (compute > 0.0).then(|| w.record_length * w.batch_size as f64 / compute)
}

/// One line: what one simulated accelerator of this workload needs, and from what.
pub fn need_line(w: &Workload, accelerator: Option<&str>) -> Option<String> {
    let mib = need_bytes_per_s(w)? / (1u64 << 20) as f64;
    let who = accelerator.map_or("simulated GPU".to_string(), |a| format!("simulated {a}"));
    Some(format!(
        "one {who} needs {mib:.1} MiB/s at 100% AU, {:.1} MiB/s at its {:.0}% threshold (record {} B × batch {} / computation_time {} s)",
        mib * w.au_threshold_percent / 100.0,
        w.au_threshold_percent,
        w.record_length,
        w.batch_size,
        w.computation_time.mean()
    ))
}

/// A byte count: digits, optionally followed by K, M, G, T or P (powers of 1024, with
/// or without `iB`/`B`).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: u64 = num.parse().map_err(|_| "expected a number of bytes, e.g. 68719476736 or 64G".to_string())?;
    let shift = match unit.trim().to_ascii_uppercase().trim_end_matches("IB").trim_end_matches('B') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        "P" => 50,
        _ => return Err(format!("unknown unit '{unit}' (use K, M, G, T, P: powers of 1024)")),
    };
    n.checked_mul(1u64 << shift).filter(|&b| b > 0).ok_or_else(|| "must be between 1 byte and 16 EiB".to_string())
}

pub fn gib(bytes: f64) -> String {
    format!("{:.1} GiB", bytes / (1u64 << 30) as f64)
}

/// Bytes in the largest binary unit that keeps the number ≥ 1.
pub fn human_bytes(bytes: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

/// The human output of `trainio datasize`.
pub fn human(name: &str, s: &Sizing, ram_from: &str) -> String {
    let mut out = String::new();
    out += &format!(
        "trainio datasize: {name}, {} simulated GPUs, {} client host(s), {} B RAM in all ({}, {ram_from})\n",
        s.gpus,
        s.hosts,
        s.client_ram_bytes,
        gib(s.client_ram_bytes as f64)
    );
    out += &format!(
        "  by RAM:   {RAM_FACTOR} × {} B // {} B per file ({} samples × {} B) = {} files\n",
        s.client_ram_bytes, s.file_bytes, s.num_samples_per_file, s.record_length_bytes, s.files_by_ram
    );
    out += &format!(
        "  by steps: {MIN_STEPS} steps × {} GPUs × batch {} // {} samples per file = {} files\n",
        s.gpus, s.batch_size, s.num_samples_per_file, s.files_by_steps
    );
    out += &format!(
        "num_files_train: {} (set by the {} rule)\n",
        s.num_files_train,
        if s.decided_by == "ram" { "5 × RAM" } else { "500-step" }
    );
    out += &format!("bytes: {} ({})\n", s.dataset_bytes, human_bytes(s.dataset_bytes as f64));
    out += &format!(
        "steps per epoch: {} ({} files × {} samples // (batch {} × {} GPUs))\n",
        s.steps_per_epoch, s.num_files_train, s.num_samples_per_file, s.batch_size, s.gpus
    );
    out += &format!("use: --param dataset.num_files_train={}\n", s.num_files_train);
    out += &format!("formula: {}\n", s.formula);
    out
}

/// The one line datagen and replay print before they start: the rule's minimum for this
/// run against the dataset the run uses.
pub fn check_line(s: &Sizing, files: u64, bytes: u64, steps_per_epoch: u64) -> String {
    let meets = files >= s.num_files_train;
    format!(
        "MLPerf dataset size for {} GPUs and {} client RAM ({} host(s)): num_files_train ≥ {} ({}, {} steps per epoch); this dataset: {} files, {}, {} steps per epoch: {}",
        s.gpus,
        gib(s.client_ram_bytes as f64),
        s.hosts,
        s.num_files_train,
        human_bytes(s.dataset_bytes as f64),
        s.steps_per_epoch,
        files,
        human_bytes(bytes as f64),
        steps_per_epoch,
        if meets { "meets the rule" } else { "below the rule (AU may measure the page cache, not storage)" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(record: &str, spf: u64, batch: u64) -> Workload {
        let y = format!(
            "dataset:\n  num_files_train: 1\n  num_samples_per_file: {spf}\n  record_length_bytes: {record}\nreader:\n  batch_size: {batch}\ntrain:\n  computation_time: 0.1\n"
        );
        Workload::from_yaml(&y, "t").unwrap()
    }

    #[test]
    fn python_floor_division() {
        assert_eq!(py_floordiv(7.0, 2.0), 3.0);
        assert_eq!(py_floordiv(1.0, 0.1), 9.0); // Python: 1.0 // 0.1 == 9.0
        assert_eq!(py_floordiv(6.0, 3.0), 2.0);
    }

    #[test]
    fn unet3d_by_hand() {
        // 8 GPUs, 1 host of 64 GiB: 5 × 68719476736 = 343597383680;
        // // 146600628 = 2343 files; steps: 500 × 8 × 7 = 28000 files.
        let s = sizing(&w("146600628", 1, 7), 8, 1, 64 << 30);
        assert_eq!((s.files_by_ram, s.files_by_steps), (2343, 28000));
        assert_eq!(s.num_files_train, 28000);
        assert_eq!(s.dataset_bytes, 28000 * 146600628);
        assert_eq!(s.steps_per_epoch, 500);
        assert_eq!(s.decided_by, "steps");
    }

    #[test]
    fn resnet50_float_record() {
        // file = 1251 × 114660.07 = 143439747.57 B; 1 GPU, 512 GiB:
        // 5 × 549755813888 = 2748779069440 // 143439747.57 = 19163 (Python: 19163.0).
        let s = sizing(&w("114660.07", 1251, 400), 1, 1, 512 << 30);
        assert_eq!(s.files_by_ram, 19163);
        assert_eq!(s.files_by_steps, 159); // 200000 // 1251
        assert_eq!(s.num_files_train, 19163);
        assert_eq!(s.decided_by, "ram");
        assert_eq!(s.dataset_bytes, 2748735882683); // int(19163.0 * 143439747.57000002)
    }
}
