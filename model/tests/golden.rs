//! The job model of each sample trace in traces/ against its golden copy in tests/golden/:
//! the JSON `trainio analyze --json` carries and the lines `analyze` and `replay` print.
//! A change to the model's output shows here as a diff; when the change is meant,
//! `TRAINIO_BLESS=1 cargo test -p trainio-model --test golden` rewrites the copies.

use std::path::{Path, PathBuf};

use trainio_model::{describe, infer_trace, to_json, Options};

fn samples() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("traces/ is readable")
        .map(|e| e.expect("a traces/ entry").path())
        .filter(|p| p.join("seg-000000.parquet").is_file())
        .collect();
    dirs.sort();
    dirs
}

fn check(golden: &Path, actual: &str) -> Option<String> {
    if std::env::var_os("TRAINIO_BLESS").is_some() {
        std::fs::write(golden, actual).expect("golden copy written");
        return None;
    }
    let expected = std::fs::read_to_string(golden)
        .unwrap_or_else(|e| panic!("{}: {e} (TRAINIO_BLESS=1 writes it)", golden.display()));
    (expected != actual).then(|| format!("{} differs from the model's output", golden.display()))
}

#[test]
fn sample_traces_model_as_their_golden_copies() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let samples = samples();
    assert!(samples.len() >= 2, "sample traces in traces/: {samples:?}");
    let mut diffs = Vec::new();
    for trace in &samples {
        let name = trace.file_name().unwrap().to_string_lossy().into_owned();
        let model = infer_trace(trace, &Options::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!model.gpus.is_empty() && model.steps > 0, "{name}: the sample holds a job");
        diffs.extend(check(&dir.join(format!("{name}.json")), &(to_json(&model) + "\n")));
        diffs.extend(check(&dir.join(format!("{name}.txt")), &(describe(&model).join("\n") + "\n")));
    }
    assert!(diffs.is_empty(), "{}", diffs.join("\n"));
}
