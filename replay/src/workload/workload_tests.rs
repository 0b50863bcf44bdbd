//! Unit tests of workload.rs: v1.0 and v2.0 keys, distributions, refusals that name the
//! key, and the shipped configs' published numbers.

use super::*;

const V2: &str = "model:\n  name: unet3d\nframework: pytorch\ndataset:\n  format: npz\n  num_files_train: 168\n  num_samples_per_file: 1\n  record_length_bytes: 146600628\n  record_length_bytes_stdev: 68341808\n  record_length_bytes_resize: 2097152\nreader:\n  data_loader: pytorch\n  batch_size: 7\n  read_threads: 4\n  file_shuffle: seed\ntrain:\n  epochs: 5\n  computation_time: 0.636\nmetric:\n  au: 0.90\n";

#[test]
fn v2_keys() {
    let w = Workload::from_yaml(V2, "x").unwrap();
    assert_eq!(w.name, "unet3d");
    assert_eq!(w.record_length, 146600628.0);
    assert_eq!(w.record_length_stdev, 68341808.0);
    assert_eq!(w.batch_size, 7);
    assert_eq!(w.prefetch_size, 2);
    assert_eq!(w.computation_time, ComputeTime::Fixed(0.636));
    assert_eq!(w.file_shuffle, Shuffle::Seed);
    assert!((w.au_threshold_percent - 90.0).abs() < 1e-9);
}

#[test]
fn values_that_would_size_the_dataset_wrongly_are_refused() {
    for (from, to, says) in [
        ("record_length_bytes: 146600628", "record_length_bytes: 1e30", "beyond 1 TiB"),
        ("record_length_bytes: 146600628", "record_length_bytes: .nan", "finite"),
        ("record_length_bytes: 146600628", "record_length_bytes: nan", "finite"),
        ("computation_time: 0.636", "computation_time: .inf", "finite"),
        ("num_files_train: 168", "num_files_train: 1e20", "too large"),
        ("num_files_train: 168", "num_files_train: 1000000000000", "beyond 1 EiB"),
    ] {
        assert!(V2.contains(from), "{from}");
        let e = Workload::from_yaml(&V2.replace(from, to), "x").unwrap_err();
        let e = format!("{e:#}");
        assert!(e.contains(says), "{to}: {e}");
    }
}

#[test]
fn typos_are_named_and_object_storage_is_refused() {
    let y: Value = serde_yaml::from_str(&V2.replace("batch_size: 7", "batch_sise: 7")).unwrap();
    assert_eq!(typo_warnings(&y), ["reader.batch_sise: not a key trainio reads; did you mean reader.batch_size?"]);
    let clean: Value = serde_yaml::from_str(V2).unwrap();
    assert!(typo_warnings(&clean).is_empty(), "{:?}", typo_warnings(&clean));
    let s3 = format!("{V2}storage:\n  storage_type: s3\n");
    let e = format!("{:#}", Workload::from_yaml(&s3, "x").unwrap_err());
    assert!(e.contains("storage.storage_root: missing"), "{e}");
    let bucket = format!("{s3}  storage_root: mlp-bucket/run\n  storage_library: minio\n");
    let store = Workload::from_yaml(&bucket, "x").unwrap().object_store.unwrap();
    assert_eq!((store.bucket.as_str(), store.prefix.as_str()), ("mlp-bucket", "run"));
    let gcs = format!("{V2}storage:\n  storage_type: gcs\n");
    let e = format!("{:#}", Workload::from_yaml(&gcs, "x").unwrap_err());
    assert!(e.contains("storage.storage_type: gcs") && e.contains("local_fs"), "{e}");
    let url = V2.replace("format: npz", "format: npz\n  data_folder: s3://bucket");
    assert!(Workload::from_yaml(&url, "x").is_err());
    let local = Workload::from_yaml_with(&s3, "x", &["storage.storage_type=local_fs".into()]);
    assert!(local.is_ok(), "{local:?}");
}

#[test]
fn v1_keys_and_string_model() {
    let y = V2.replace("record_length_bytes", "record_length").replace("model:\n  name: unet3d", "model: unet3d");
    let w = Workload::from_yaml(&y, "x").unwrap();
    assert_eq!(w.name, "unet3d");
    assert_eq!(w.record_length, 146600628.0);
    assert_eq!(w.record_length_stdev, 68341808.0);
}

#[test]
fn distributions() {
    let y = V2.replace("computation_time: 0.636", "computation_time:\n    mean: 0.5\n    stdev: 0.1");
    assert_eq!(Workload::from_yaml(&y, "x").unwrap().computation_time, ComputeTime::Normal { mean: 0.5, stdev: 0.1 });
    let y = V2.replace("computation_time: 0.636", "computation_time:\n    type: uniform\n    min: 0.1\n    max: 0.3");
    let ct = Workload::from_yaml(&y, "x").unwrap().computation_time;
    assert_eq!(ct, ComputeTime::Uniform { min: 0.1, max: 0.3 });
    let mut rng = rand::thread_rng();
    for _ in 0..100 {
        let s = ct.sample(&mut rng);
        assert!((0.1..0.3).contains(&s));
    }
    let y = V2.replace("computation_time: 0.636", "computation_time: 0.2\n  computation_time_stdev: 0.01");
    assert_eq!(Workload::from_yaml(&y, "x").unwrap().computation_time, ComputeTime::Normal { mean: 0.2, stdev: 0.01 });
}

/// configs/ must carry MLPerf Storage's published numbers (REFERENCE.md §2).
#[test]
fn shipped_configs_have_the_published_numbers() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
    let load = |n: &str| Workload::from_file_with(&dir.join(n), &[]).unwrap();
    for (gpu, ct) in [("a100", 0.636), ("h100", 0.323)] {
        let w = load(&format!("unet3d_{gpu}.yaml"));
        assert_eq!((w.record_length, w.record_length_stdev), (146_600_628.0, 68_341_808.0));
        assert_eq!((w.num_files_train, w.num_samples_per_file, w.batch_size, w.read_threads), (168, 1, 7, 4));
        assert_eq!((w.computation_time.clone(), w.epochs, w.au_threshold_percent), (ComputeTime::Fixed(ct), 5, 90.0));
    }
    for (gpu, ct) in [("a100", 0.435), ("h100", 0.224)] {
        let w = load(&format!("resnet50_{gpu}.yaml"));
        assert_eq!(w.record_length, 114_660.07);
        assert_eq!((w.num_files_train, w.num_samples_per_file, w.batch_size, w.read_threads), (1024, 1251, 400, 8));
        assert_eq!((w.computation_time.clone(), w.au_threshold_percent), (ComputeTime::Fixed(ct), 90.0));
    }
    for (gpu, ct) in [("a100", 0.00551), ("h100", 0.00350)] {
        let w = load(&format!("cosmoflow_{gpu}.yaml"));
        assert_eq!((w.record_length, w.record_length_stdev), (2_828_486.0, 71_311.0));
        assert_eq!((w.num_files_train, w.num_samples_per_file, w.batch_size, w.read_threads), (524_288, 1, 1, 4));
        assert_eq!(w.computation_time, ComputeTime::Fixed(ct));
        assert!((w.au_threshold_percent - 70.0).abs() < 1e-9);
    }
    for demo in ["demo-unet3d.yaml", "demo-resnet50.yaml", "demo-cosmoflow.yaml"] {
        load(demo);
    }
}

#[test]
fn errors_name_the_key() {
    let y = V2.replace("batch_size: 7", "batch_size: seven");
    let e = format!("{:#}", Workload::from_yaml(&y, "x").unwrap_err());
    assert!(e.contains("reader.batch_size"), "{e}");
    let e = format!("{:#}", Workload::from_yaml("dataset: {}\n", "x").unwrap_err());
    assert!(e.contains("reader"), "{e}");
    assert!(Workload::from_yaml("a: [", "x").is_err());
}

/// Trace mode's stand-in is the workload the YAML it was once written as reads to: the
/// same settings, on files or on a bucket.
#[test]
fn trace_stand_in_is_the_workload_of_its_yaml() {
    for name in ["unet3d-demo-1gpu", "seg-000000.parquet", "a b: c"] {
        let yaml = format!(
            "model: {{name: {}}}\ndataset: {{record_length_bytes: 1}}\nreader: {{prefetch_size: 2}}\ntrain: {{}}\n",
            serde_json::to_string(&format!("trace {name}")).unwrap()
        );
        assert_eq!(Workload::trace_stand_in(name, None), Workload::from_yaml(&yaml, "trace").unwrap(), "{name}");
        for root in ["bkt", "bkt/some/prefix", "s3://bkt/p/"] {
            let storage = format!(
                "storage: {{storage_type: s3, storage_library: s3dlio, storage_root: {}}}\n",
                serde_json::to_string(root).unwrap()
            );
            let parsed = Workload::from_yaml(&(yaml.clone() + &storage), "trace").unwrap();
            let store = parsed.object_store.clone();
            assert!(store.is_some(), "{root}");
            assert_eq!(Workload::trace_stand_in(name, store), parsed, "{name} {root}");
        }
    }
}
