//! The features of a workload file that the replay does not model, each named in one
//! line before a run (docs/replay.md, *Inputs*): a key trainio does not read that can
//! change what the job does, and values of keys it reads that it cannot honour.

use crate::workload::{typo_warnings, Workload, KNOWN_KEYS, QUIET_KEYS};
use serde_yaml::Value;

/// Formats whose files the replay lays out and reads as their readers do; any other is
/// opaque bytes read whole.
const LAID_OUT: &[&str] =
    &["npz", "npy", "tfrecord", "hdf5", "indexed_binary", "mmap_indexed_binary", "parquet", "jpeg"];
/// Loaders whose concurrency the replay models (PyTorch's worker processes, TF's
/// interleave, DALI's parallel external source).
const LOADERS: &[&str] = &["pytorch", "tensorflow", "dali"];

/// Keys whose value decides whether the replay models them (checked below).
const VALUE_CHECKED: &[&str] = &["reader.dont_use_mmap", "dataset.chunk_dims"];

/// What the replay does instead of an unread key.
fn why(dotted: &str) -> &'static str {
    match dotted {
        "reader.computation_threads" => {
            "TensorFlow's preprocessing threads are not modeled: each reader sleeps its own preprocess_time"
        }
        "dataset.num_dset_per_record" => "an hdf5 file holds one dataset, records_0, and a sample is one row of it",
        _ => "trainio does not read this key",
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "null".into(),
        Value::Mapping(_) | Value::Sequence(_) => "{…}".into(),
        other => serde_yaml::to_string(other).unwrap_or_default().trim().to_string(),
    }
}

fn truthy(v: &Value) -> bool {
    match v {
        Value::Bool(b) => *b,
        Value::String(s) => matches!(s.to_ascii_lowercase().as_str(), "true" | "yes" | "1"),
        Value::Number(n) => n.as_f64().is_some_and(|x| x != 0.0),
        _ => false,
    }
}

/// Whether `dotted` is a key trainio reads, or a section holding keys it reads
/// (`model.parallelism`).
fn known(dotted: &str) -> bool {
    KNOWN_KEYS.iter().any(|k| *k == dotted || k.starts_with(&format!("{dotted}.")))
}

/// One line per feature of the workload file (`root`, as read, with the overrides
/// applied to `w`) that the replay does not model.
pub fn notes(root: &Value, w: &Workload) -> Vec<String> {
    let mut out = Vec::new();
    let Some(top) = root.as_mapping() else { return out };
    let warned: Vec<String> =
        typo_warnings(root).iter().filter_map(|t| t.split(':').next().map(str::to_string)).collect();
    // Keys trainio does not read, outside those known not to change the I/O.
    let mut stack: Vec<(String, &Value)> = Vec::new();
    for (k, v) in top {
        let Some(k) = k.as_str() else { continue };
        match v {
            Value::Mapping(_) => stack.push((k.to_string(), v)),
            // `framework` is the loader when reader.data_loader is absent; `model` a name.
            _ if matches!(k, "framework" | "model") => {}
            _ => out.push(format!("{k}: {}: {}", scalar(v), why(k))),
        }
    }
    while let Some((prefix, body)) = stack.pop() {
        for (k, v) in body.as_mapping().into_iter().flatten() {
            let Some(k) = k.as_str() else { continue };
            let dotted = format!("{prefix}.{k}");
            if KNOWN_KEYS.contains(&dotted.as_str()) {
                // Read whole, a mapping too (`train.computation_time: {mean, stdev}`).
            } else if known(&dotted) && v.is_mapping() {
                stack.push((dotted, v));
            } else if !known(&dotted)
                && !QUIET_KEYS.contains(&dotted.as_str())
                && !VALUE_CHECKED.contains(&dotted.as_str())
                && !warned.contains(&dotted)
            {
                out.push(format!("{dotted}: {}: {}", scalar(v), why(&dotted)));
            }
        }
    }
    out.sort();
    // Keys read or quiet whose value asks for what the replay does not do.
    let get = |section: &str, key: &str| root.get(section).and_then(|s| s.get(key));
    // Parquet's codec is written and read (parquet_files.rs); other formats' is not.
    if let Some(c) = get("dataset", "compression")
        .filter(|c| !matches!(scalar(c).as_str(), "none" | "null" | ""))
        .filter(|_| w.parquet.is_none())
    {
        out.push(format!("dataset.compression: {}: files are written and read uncompressed", scalar(c)));
    }
    if get("workflow", "evaluation").is_some_and(truthy) {
        out.push("workflow.evaluation: true: the evaluation passes (reads of the eval files) are not run".into());
    }
    if let Some(t) = get("train", "total_training_steps").filter(|t| t.as_u64().is_some_and(|n| n > 0)) {
        out.push(format!(
            "train.total_training_steps: {}: not applied: give --steps to cap the steps per epoch",
            scalar(t)
        ));
    }
    if let Some(c) =
        get("dataset", "chunk_dims").filter(|_| w.format.eq_ignore_ascii_case("hdf5") && w.hdf5_chunk_rows() == 0)
    {
        out.push(format!(
            "dataset.chunk_dims: {}: records_0 is written and read contiguous: chunks of whole samples are modeled (chunk_dims[0] samples, at most num_samples_per_file and {} chunks a file, the other dims covering record_length_bytes)",
            serde_json::to_string(c).unwrap_or_else(|_| scalar(c)),
            crate::formats::hdf5::CHUNKS_MAX
        ));
    }
    // Object-storage keys of a file run on local files (storage_type: local_fs): the
    // library, protocol and bucket it names are not used (the older layouts keep them
    // under reader:).
    if w.object_store.is_none() {
        for (section, key) in [
            ("storage", "storage_library"),
            ("storage", "protocol"),
            ("reader", "storage_library"),
            ("reader", "storage_options"),
            ("reader", "storage_root"),
            ("reader", "protocol"),
        ] {
            if let Some(v) = get(section, key) {
                out.push(format!("{section}.{key}: {}: not used: the run reads local files", scalar(v)));
            }
        }
    }
    if w.preprocess_time > 0.0 || w.preprocess_time_stdev > 0.0 {
        let f = w.format.to_ascii_lowercase();
        if f == "tfrecord" {
            out.push(format!(
                "reader.preprocess_time: {}: not slept: DLIO's TFRecord reader (tf.data) does not call preprocess",
                w.preprocess_time
            ));
        } else if f == "mmap_indexed_binary" {
            out.push(format!(
                "reader.preprocess_time: {}: not slept: samples read through mappings have no read to sleep after",
                w.preprocess_time
            ));
        }
    }
    if w.main_process_reads {
        out.push("reader.read_threads: 0: the main process's reads (a DataLoader without workers) are replayed by one reader that reads ahead of the compute (prefetch), as read_threads: 1 does".into());
    }
    if get("reader", "dont_use_mmap").is_some_and(|v| !truthy(v)) {
        out.push("reader.dont_use_mmap: false: reads through mmap are not modeled (the replay issues reads)".into());
    }
    if w.train {
        let format = w.format.to_ascii_lowercase();
        if !format.is_empty() && !LAID_OUT.contains(&format.as_str()) {
            out.push(format!(
                "dataset.format: {}: files are opaque bytes, each sample read whole, not laid out and read as the {} reader does",
                w.format, w.format
            ));
        }
        let loader = w.data_loader.to_ascii_lowercase();
        if !LOADERS.contains(&loader.as_str()) {
            out.push(format!(
                "reader.data_loader: {}: read as PyTorch's worker processes read ({}'s own pipeline is not modeled)",
                w.data_loader, w.data_loader
            ));
        }
    }
    out
}

/// Prints the notes of the workload file at `path` on standard error (rank 0 only).
pub fn print(path: &std::path::Path, w: &Workload) {
    if std::env::var("OMPI_COMM_WORLD_RANK").is_ok_and(|r| r != "0") {
        return;
    }
    let Ok(root) = crate::workload::read_workload_text(path).map(|t| serde_yaml::from_str::<Value>(&t)) else { return };
    let Ok(root) = root else { return };
    for n in notes(&root, w) {
        eprintln!("trainio: not modeled: {}: {n}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notes_of(yaml: &str) -> Vec<String> {
        let root: Value = serde_yaml::from_str(yaml).unwrap();
        notes(&root, &Workload::from_yaml(yaml, "t").unwrap())
    }

    const BASE: &str = "dataset:\n  num_files_train: 4\n  record_length_bytes: 4096\n  format: npz\nreader:\n  batch_size: 1\n  data_loader: pytorch\ntrain:\n  computation_time: 0.1\n";

    #[test]
    fn nothing_for_what_is_modeled() {
        assert_eq!(notes_of(BASE), Vec::<String>::new());
        let dist = BASE.replace("computation_time: 0.1", "computation_time:\n    mean: 0.1\n    stdev: 0.01");
        assert_eq!(notes_of(&dist), Vec::<String>::new());
        let quiet = BASE.replace("  batch_size: 1\n", "  batch_size: 1\n  shuffle_size: 1024\n  dont_use_mmap: True\n");
        assert_eq!(notes_of(&quiet), Vec::<String>::new());
        for format in ["indexed_binary", "mmap_indexed_binary"] {
            let y = BASE.replace("format: npz", &format!("format: {format}")).replace("pytorch", "dali");
            assert_eq!(notes_of(&y), Vec::<String>::new(), "{format} under dali");
        }
    }

    #[test]
    fn preprocess_time_is_named_where_dlio_does_not_sleep_it() {
        let y = BASE.replace("  batch_size: 1\n", "  batch_size: 1\n  preprocess_time: 0.01\n");
        assert_eq!(notes_of(&y), Vec::<String>::new(), "slept after each npz sample");
        let n = notes_of(&y.replace("format: npz", "format: tfrecord").replace("pytorch", "tensorflow"));
        assert_eq!(n.len(), 1, "{n:?}");
        assert!(n[0].starts_with("reader.preprocess_time: 0.01: not slept"), "{n:?}");
    }

    #[test]
    fn one_line_per_feature() {
        let y = BASE
            .replace("  batch_size: 1\n", "  batch_size: 1\n  computation_threads: 8\n  preprocess_time: 0.01\n")
            .replace("format: npz", "format: png")
            .replace("data_loader: pytorch", "data_loader: native_dali")
            + "workflow:\n  evaluation: True\n";
        let n = notes_of(&y);
        assert_eq!(n.len(), 4, "{n:#?}");
        for key in [
            "reader.computation_threads: 8:",
            "workflow.evaluation: true:",
            "dataset.format: png:",
            "reader.data_loader: native_dali:",
        ] {
            assert_eq!(n.iter().filter(|l| l.starts_with(key)).count(), 1, "{key} in {n:#?}");
        }
    }

    #[test]
    fn hdf5_says_what_it_writes_instead() {
        let y = BASE.replace("format: npz", "format: hdf5").replace(
            "  record_length_bytes: 4096\n",
            "  record_length_bytes: 4096\n  chunk_dims: [1, 32, 64]\n  num_dset_per_record: 2\n",
        );
        let n = notes_of(&y);
        assert_eq!(n.len(), 2, "{n:#?}");
        assert!(n[0].starts_with("dataset.num_dset_per_record: 2: an hdf5 file holds one dataset"), "{n:#?}");
        assert!(n[1].starts_with("dataset.chunk_dims: [1,32,64]: records_0 is written and read contiguous"), "{n:#?}");
    }

    #[test]
    fn hdf5_chunks_of_whole_samples_are_modeled() {
        let y = BASE.replace("format: npz", "format: hdf5").replace(
            "  record_length_bytes: 4096\n",
            "  record_length_bytes: 4096\n  num_samples_per_file: 8\n  chunk_dims: [2, 64, 64]\n",
        );
        assert_eq!(notes_of(&y), Vec::<String>::new());
        assert_eq!(Workload::from_yaml(&y, "t").unwrap().hdf5_chunk_rows(), 2);
        // More rows per chunk than the file holds (h5py refuses), and more than CHUNKS_MAX chunks.
        for (spf, c0) in [(8, 9), (400, 2)] {
            let z = y
                .replace("num_samples_per_file: 8", &format!("num_samples_per_file: {spf}"))
                .replace("[2,", &format!("[{c0},"));
            assert_eq!(notes_of(&z).len(), 1, "{z}");
        }
    }

    #[test]
    fn a_typo_is_warned_once_not_twice() {
        let y = BASE.replace("  batch_size: 1\n", "  batch_size: 1\n  read_thread: 4\n");
        assert_eq!(notes_of(&y), Vec::<String>::new());
    }
}
