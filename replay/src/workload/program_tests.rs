//! Unit tests of program.rs: batches over the shards, and each format's reads as its real
//! reader makes them (h5py, pyarrow, numpy, TFRecord streams, the indexed readers, DALI).

use super::*;
use std::path::Path;

#[test]
fn batches_cover_the_shard_once() {
    let y = "dataset:\n  num_files_train: 12\n  num_samples_per_file: 2\n  record_length_bytes: 8192\nreader:\n  batch_size: 3\n  sample_shuffle: seed\ntrain:\n  computation_time: 0.1\n";
    let w = Workload::from_yaml(y, "t").unwrap();
    let layout = Layout::from_workload(&w, 2, 0, Path::new("/d"));
    let p = WorkloadProgram::new(&w, layout, 2, &[1], 1 << 20, 0, false, TF_BUFFER);
    assert_eq!(p.steps_per_epoch, 4, "6 files × 2 samples / batch 3");
    let mut seen = Vec::new();
    for s in 0..4 {
        for r in p.batch(0, 0, s).reads {
            assert_eq!(r.file % 2, 1, "GPU 1 of 2 reads odd files only");
            seen.push((r.file, r.offset));
        }
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 12);
}

#[test]
fn preprocess_time_is_slept_after_each_sample() {
    // npz (several reads a sample, the first on a new open), 3 samples a batch: one
    // sleep per sample, on its last read; none on TFRecord (DLIO's tf.data reader).
    let y = |fmt: &str, stdev: f64| {
        format!("dataset:\n  format: {fmt}\n  num_files_train: 6\n  num_samples_per_file: 2\n  record_length_bytes: 300000\nreader:\n  batch_size: 3\n  preprocess_time: 0.004\n  preprocess_time_stdev: {stdev}\ntrain:\n  computation_time: 0.1\n")
    };
    let program = |fmt: &str, stdev: f64| {
        let w = Workload::from_yaml(&y(fmt, stdev), "t").unwrap();
        let layout = Layout::from_workload(&w, 1, 0, Path::new("/d"));
        WorkloadProgram::new(&w, layout, 1, &[0], 64 << 10, 0, false, TF_BUFFER)
    };
    let p = program("npz", 0.0);
    let b = p.batch(0, 0, 1);
    assert!(b.reads.len() > 3, "several reads a sample");
    let thinks: Vec<(bool, u64)> = b.reads.iter().map(|r| (r.chain, r.think_ns)).collect();
    for (i, &(_, t)) in thinks.iter().enumerate() {
        let ends_sample = thinks.get(i + 1).is_none_or(|&(chain, _)| !chain);
        assert_eq!(t, if ends_sample { 4_000_000 } else { 0 }, "read {i} of {thinks:?}");
    }
    assert_eq!(thinks.iter().filter(|t| t.1 > 0).count(), 3);
    // A spread: draws differ, are never negative, and average near the mean.
    let p = program("npz", 0.002);
    let draws: Vec<u64> =
        (0..200).flat_map(|s| p.batch(0, 0, s % 4).reads).map(|r| r.think_ns).filter(|&t| t > 0).collect();
    let mean = draws.iter().sum::<u64>() as f64 / draws.len() as f64;
    assert!((mean - 4e6).abs() < 0.4e6, "{mean}");
    assert!(draws.iter().any(|&t| t != draws[0]));
    let p = program("tfrecord", 0.0);
    assert!(p.batch(0, 0, 0).reads.iter().all(|r| r.think_ns == 0));
    // JPEG: PIL decodes as it reads, so each read of a sample carries its share.
    let p = program("jpeg", 0.0);
    let b = p.batch(0, 0, 0);
    let n = b.reads.len() as u64;
    assert!(n > 3 && b.reads.iter().all(|r| r.think_ns == 3 * 4_000_000 / n), "{:?}", b.reads);
}

#[test]
fn parquet_readers_keep_files_open_and_their_last_row_groups() {
    // 2 files of 8 rows in row groups of 2, batch 4, 2 workers: worker 0 reads batches
    // 0 and 2 (rows 0-3 of file 0, then of file 1), worker 1 batches 1 and 3.
    let y = "dataset:\n  format: parquet\n  num_files_train: 2\n  num_samples_per_file: 8\n  parquet:\n    row_group_size: 2\n    row_group_cache_size: 1\n    columns:\n      - {name: a, dtype: float32, size: 1024}\n      - {name: b, dtype: float32, size: 4096, read: false}\n      - {name: c, dtype: float32, size: 1024}\nreader:\n  batch_size: 4\n  read_threads: 2\ntrain:\n  computation_time: 0.1\n";
    let w = Workload::from_yaml(y, "t").unwrap();
    assert_eq!(w.record_length, 6144.0 * 4.0, "a row's bytes when the file gives none");
    let layout = Layout::from_workload(&w, 1, 0, Path::new("/d"));
    let pq = layout.parquet.clone().unwrap();
    let p = WorkloadProgram::new(&w, layout, 1, &[0], 1 << 20, 0, false, TF_BUFFER);
    assert_eq!(p.reader_json("parquet", "pytorch")["model"], "pyarrow-row-group");
    let reads = |step| -> Vec<(u32, u64, u64, bool, bool)> {
        p.batch(0, 0, step).reads.iter().map(|r| (r.file, r.offset, r.len, r.advise, r.chain)).collect()
    };
    // Row groups 0 and 1 of file 0: the footer, then each row group's two ranges (b,
    // unread, lies between a and c), WILLNEED first; all on one open.
    let mut want = vec![];
    for (o, n) in pq.footer_reads() {
        want.push((0, o, n, false, !want.is_empty()));
    }
    for rg in [0, 1] {
        let ranges = pq.row_group_reads(rg);
        assert_eq!(ranges.len(), 2);
        for advise in [true, false] {
            for &(o, n) in &ranges {
                want.push((0, o, n, advise, true));
            }
        }
    }
    assert_eq!(reads(0), want);
    // Worker 1 reads file 0's other rows: its own reader, so the footer again.
    assert_eq!(reads(1)[0], want[0]);
    // Worker 0 again, file 1; then a new epoch forgets what the readers held.
    let file1 = reads(2);
    assert_eq!((file1.len(), file1[0].0), (want.len(), 1));
    assert_eq!(p.batch(0, 1, 0).reads.len(), want.len());
}

#[test]
fn hdf5_samples_are_h5pys_reads_on_one_open() {
    let y = "dataset:\n  format: hdf5\n  num_files_train: 2\n  num_samples_per_file: 4\n  record_length_bytes: 262144\nreader:\n  batch_size: 2\n  read_threads: 1\ntrain:\n  computation_time: 0.1\n";
    let w = Workload::from_yaml(y, "t").unwrap();
    let layout = Layout::from_workload(&w, 1, 0, Path::new("/d"));
    assert_eq!(layout.files[0].size, 2048 + 4 * 262144 + 32);
    let p = WorkloadProgram::new(&w, layout, 1, &[0], 1 << 20, 0, false, TF_BUFFER);
    assert_eq!(p.max_request(), 262144, "a row in one request");
    assert_eq!(p.reader_json("hdf5", "pytorch")["model"], "h5py-row");
    let b = p.batch(0, 0, 1);
    let got: Vec<(u32, u64, u64, bool)> = b.reads.iter().map(|r| (r.file, r.offset, r.len, r.chain)).collect();
    let mut want = Vec::new();
    for k in [2u64, 3] {
        for (i, (o, n)) in crate::formats::hdf5::plan(4, 262144, 0, k).into_iter().enumerate() {
            want.push((0, o, n, i > 0));
        }
    }
    assert_eq!(got, want, "samples 2 and 3 of file 0, each on its own open");
    assert_eq!(want[4], (0, 2048 + 2 * 262144, 262144, true));
}

#[test]
fn chunked_hdf5_reads_the_index_then_the_whole_chunk_in_one_request() {
    let y = "dataset:\n  format: hdf5\n  num_files_train: 2\n  num_samples_per_file: 4\n  record_length_bytes: 262144\n  chunk_dims: [2, 512, 512]\nreader:\n  batch_size: 2\n  read_threads: 1\ntrain:\n  computation_time: 0.1\n";
    let w = Workload::from_yaml(y, "t").unwrap();
    let layout = Layout::from_workload(&w, 1, 0, Path::new("/d"));
    assert_eq!(layout.format, Format::Hdf5(2));
    let p = WorkloadProgram::new(&w, layout, 1, &[0], 1 << 20, 0, false, TF_BUFFER);
    assert_eq!(p.max_request(), 2 * 262144, "a chunk in one request");
    let b = p.batch(0, 0, 1);
    let got: Vec<(u64, u64)> = b.reads.iter().map(|r| (r.offset, r.len)).collect();
    // Samples 2 and 3: both in chunk 1, each open reading the index and the chunk.
    let one = [(0, 8), (0, 48), (48, 512), (179, 512), (447, 28), (475, 34), (2048 + 2 * 262144, 2 * 262144)];
    assert_eq!(got, [one, one].concat());
}

#[test]
fn tfrecord_is_an_interleave_of_streams() {
    let y = "dataset:\n  format: tfrecord\n  num_files_train: 4\n  num_samples_per_file: 4\n  record_length_bytes: 100000\nreader:\n  data_loader: tensorflow\n  batch_size: 2\n  read_threads: 2\ntrain:\n  computation_time: 0.1\n";
    let w = Workload::from_yaml(y, "t").unwrap();
    let layout = Layout::from_workload(&w, 1, 0, Path::new("/d"));
    let size = layout.files[0].size;
    assert_eq!(size, 4 * (102400 + 16));
    let p = WorkloadProgram::new(&w, layout, 1, &[0], 1 << 20, 0, false, TF_BUFFER);
    assert!(p.recorded(), "streams go to their slot's reader");
    assert_eq!(p.steps_per_epoch, 8);
    let batches: Vec<Batch> = (0..8).map(|s| p.batch(0, 0, s)).collect();
    assert!(batches.iter().all(|b| b.samples == 2));
    // The first batch: one record of each slot's first file, so the first read of both.
    let first: Vec<(u32, u64, u32)> =
        batches[0].reads.iter().zip(&batches[0].streams).map(|(r, &s)| (r.file, r.offset, s)).collect();
    assert_eq!(first, [(0, 0, 0), (1, 0, 1)]);
    // Every file read once, whole, in TF's order, by one slot (files 0, 2 by slot 0),
    // and closed by its last read only.
    let plan = formats::tfrecord_plan(size, TF_BUFFER);
    for f in 0..4u32 {
        let reads: Vec<(SampleRead, u32)> = batches
            .iter()
            .flat_map(|b| b.reads.iter().copied().zip(b.streams.iter().copied()))
            .filter(|(r, _)| r.file == f)
            .collect();
        let got: Vec<(u64, u64)> = reads.iter().map(|(r, _)| (r.offset, r.len)).collect();
        assert_eq!(got, plan, "file {f}");
        assert!(reads.iter().all(|&(_, s)| s == f % 2), "file {f} stays on its slot");
        let closes: Vec<bool> = reads.iter().map(|(r, _)| r.close).collect();
        assert_eq!(closes.iter().filter(|&&c| c).count(), 1);
        assert!(*closes.last().unwrap());
    }
}

#[test]
fn npz_samples_are_numpy_loads_chained_on_one_open() {
    let y = "dataset:\n  format: npz\n  num_files_train: 2\n  num_samples_per_file: 1\n  record_length_bytes: 3145828\nreader:\n  batch_size: 1\n  read_threads: 1\ntrain:\n  computation_time: 0.1\n";
    let w = Workload::from_yaml(y, "t").unwrap();
    let layout = Layout::from_workload(&w, 1, 0, Path::new("/d"));
    let shape = formats::shape(Format::Npz, 1, layout.files[0].sample);
    let p = WorkloadProgram::new(&w, layout, 1, &[0], 1 << 20, 0, false, TF_BUFFER);
    let b = p.batch(0, 0, 1);
    let want = formats::npz_plan(&shape, 4096);
    assert_eq!(b.reads.iter().map(|r| (r.offset, r.len)).collect::<Vec<_>>(), want);
    assert!(b.reads.iter().all(|r| r.file == 1));
    assert!(!b.reads[0].chain && b.reads[1..].iter().all(|r| r.chain), "one open per sample");
    assert!(p.max_request() >= 1 << 18);
    // Under O_DIRECT numpy cannot read: the sample's bytes in transfer-size requests.
    let w2 = Workload::from_yaml(y, "t").unwrap();
    let layout = Layout::from_workload(&w2, 1, 0, Path::new("/d"));
    let p = WorkloadProgram::new(&w2, layout, 1, &[0], 1 << 20, 0, true, TF_BUFFER);
    let b = p.batch(0, 0, 0);
    assert_eq!(b.reads.len(), 4);
    assert_eq!((b.reads[0].offset, b.reads[0].len), (shape.data, 1 << 20));
}

#[test]
fn indexed_binary_reads_the_indexes_once_per_worker_then_one_read_per_sample() {
    let y = "dataset:\n  format: indexed_binary\n  num_files_train: 4\n  num_samples_per_file: 4\n  record_length_bytes: 100000\nreader:\n  batch_size: 2\n  read_threads: 2\ntrain:\n  computation_time: 0.1\n";
    let w = Workload::from_yaml(y, "t").unwrap();
    let layout = Layout::from_workload(&w, 2, 0, Path::new("/d"));
    let sample = layout.files[0].sample;
    assert_eq!(layout.on_disk(1).iter().map(|(_, s)| *s).collect::<Vec<_>>(), [4 * sample, 32, 32]);
    let p = WorkloadProgram::new(&w, layout, 2, &[1], 1 << 20, 0, false, TF_BUFFER);
    // GPU 1 of 2: files 1 and 3; per worker's first batch, both index files of both.
    let reads = |e, s| p.batch(0, e, s).reads.iter().map(|r| (p.path(r.file), r.offset, r.len)).collect::<Vec<_>>();
    let idx: Vec<_> =
        ["1.indexed_binary.off.idx", "1.indexed_binary.sz.idx", "3.indexed_binary.off.idx", "3.indexed_binary.sz.idx"]
            .iter()
            .map(|n| (PathBuf::from(format!("/d/train/file_00000{n}")), 0, 4096))
            .collect();
    let data = |f: u64, k: u64| (PathBuf::from(format!("/d/train/file_00000{f}.indexed_binary")), k * sample, sample);
    assert_eq!(reads(0, 0), [idx.clone(), vec![data(1, 0), data(1, 1)]].concat());
    assert_eq!(reads(0, 1), [idx, vec![data(1, 2), data(1, 3)]].concat());
    assert_eq!(reads(0, 2), [data(3, 0), data(3, 1)]);
    assert_eq!(reads(1, 0), [data(1, 0), data(1, 1)], "persistent workers: no index reads after epoch 0");
    assert!(p.max_request() >= sample);
    assert_eq!(p.reader_json("indexed_binary", "pytorch")["model"], "dlio-indexed-binary");
}

#[test]
fn dali_splits_each_batch_among_its_workers() {
    // pool.py's _distribute: 7 samples over 3 workers are 3, 2, 2; 2 over 4 are 1, 1.
    let split = |n, w| (0..n).map(|j| dali_worker(j, n, w)).collect::<Vec<_>>();
    assert_eq!(split(7, 3), [0, 0, 0, 1, 1, 2, 2]);
    assert_eq!(split(6, 3), [0, 0, 1, 1, 2, 2]);
    assert_eq!(split(2, 4), [0, 1]);
    assert_eq!(split(4, 1), [0, 0, 0, 0]);
    let y = "dataset:\n  format: indexed_binary\n  num_files_train: 2\n  num_samples_per_file: 4\n  record_length_bytes: 8192\nreader:\n  data_loader: dali\n  batch_size: 4\n  read_threads: 2\n  prefetch_size: 3\ntrain:\n  epochs: 2\n  computation_time: 0.1\n";
    let w = Workload::from_yaml(y, "t").unwrap();
    let layout = Layout::from_workload(&w, 1, 0, Path::new("/d"));
    let p = WorkloadProgram::new(&w, layout, 1, &[0], 1 << 20, 0, false, TF_BUFFER);
    assert!(p.recorded(), "a batch is spread over the workers by Batch::streams");
    for epoch in 0..2 {
        let b = p.batch(0, epoch, 0);
        // the index files of both files, once per epoch, by the GPU's process (stream 0)
        assert_eq!(b.reads.len(), 4 + 4);
        assert!(b.reads[..4].iter().all(|r| r.close && p.path(r.file).to_string_lossy().ends_with(".idx")));
        assert_eq!(b.streams, [0, 0, 0, 0, 0, 0, 1, 1]);
        // each sample read on an open of its own, closed after it
        let data: Vec<_> = b.reads[4..].iter().map(|r| (p.path(r.file), r.offset, r.close)).collect();
        let f0 = PathBuf::from("/d/train/file_000000.indexed_binary");
        assert_eq!(data, (0..4).map(|k| (f0.clone(), k * 8192, true)).collect::<Vec<_>>());
        let ids: std::collections::HashSet<u32> = b.reads[4..].iter().map(|r| r.file).collect();
        assert_eq!(ids.len(), 4);
    }
    assert_eq!(p.batch(0, 0, 1).reads.len(), 4, "no index reads after the first batch");
}
