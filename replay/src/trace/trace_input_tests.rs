//! Unit tests of trace_input.rs: templates from a recorded trace, the placement of the
//! job's files, objects' keys, and the setup a rank did before its first batch.

use super::*;
use std::time::Duration;
use trainio_schema::{BatchBuilder, Layer, Row, SegmentLimits, TraceWriter};

const MS: i64 = 1_000_000;

#[allow(clippy::too_many_arguments)]
fn read<'a>(
    pid: u32,
    tid: u32,
    comm: &'a str,
    dev: &'a str,
    file: &'a str,
    offset: i64,
    issue: i64,
    dur: i64,
) -> Row<'a> {
    Row {
        layer: Layer::File,
        op: "read",
        issue_ns: issue,
        complete_ns: issue + dur,
        insert_ns: None,
        dev: Some(dev),
        offset: Some(offset),
        bytes: 4096,
        bytes_requested: 4096,
        queue_depth: 1,
        pid,
        tid,
        comm,
        fd: Some(3),
        file: Some(file),
        error: 0,
        flags: 0,
        ppid: None,
    }
}

fn write_trace(rows: &[Row]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "trainio-trace-input-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut b = BatchBuilder::new();
    for r in rows {
        b.push(r);
    }
    let mut w = TraceWriter::new(&dir, SegmentLimits { max_bytes: 1 << 30, max_age: Duration::from_secs(3600) });
    w.open().unwrap();
    w.write(&b.finish()).unwrap();
    w.close_segment(&[("trainio.schema_version".into(), "1".into())]).unwrap();
    dir
}

fn template(files: &[&str]) -> Template {
    Template {
        host: None,
        pid: 1,
        comm: "t".into(),
        files: files.iter().map(|f| (f.to_string(), 8192)).collect(),
        steps: vec![TemplateStep {
            reads: (0..files.len() as u32).map(|j| SampleRead::new(j, 0, 5000)).collect(),
            streams: vec![0; files.len()],
            samples: 1,
            compute_s: 0.0,
            start_ns: 0,
        }],
        taken: 1,
        concurrency: 1,
        workers: 0,
        synchronous: true,
        paced: false,
        prefetch: 1,
        bytes: 0,
        compute_s: 0.0,
        handoff_s: 0.0,
        sync_s: 0.0,
        dev: None,
        write_bursts: BTreeMap::new(),
        write_files: Vec::new(),
        required_mib_s: None,
        setup: Vec::new(),
        setup_lead_s: 0.0,
    }
}

/// A rank's setup is done on the GPU's own copy before the run, the recorded lead
/// then passes; a setup whose file is not there fails naming it.
#[test]
fn prepare_does_the_setup_then_waits_the_lead() {
    let root = std::env::temp_dir().join(format!("trainio-prepare-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let mut t = template(&["/d/a"]);
    t.files[0].1 = 65536;
    t.setup = vec![
        SampleRead::new(0, 0, 4096),
        SampleRead { mapped: true, ..SampleRead::new(0, 8192, 8192) },
        SampleRead { advise: true, ..SampleRead::new(0, 0, 1 << 20) },
    ];
    t.setup_lead_s = 0.2;
    let opts = || TraceOptions { epochs: 1, max_steps: 0, compute_override: None, prefetch_override: None };
    let p = Placement::new(std::slice::from_ref(&t), 1, &root, None);
    let file = root.join(&p.layout.files[0].rel);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let program = TraceProgram::new(vec![t.clone()], p, &root, 1, &[0], opts());
    let err = program.prepare().unwrap_err();
    assert!(format!("{err:#}").contains("f00000.dat"), "{err:#}");
    std::fs::write(&file, vec![7u8; 65536]).unwrap();
    let start = std::time::Instant::now();
    program.prepare().unwrap();
    assert!(start.elapsed() >= Duration::from_millis(200), "{:?}", start.elapsed());
    std::fs::remove_dir_all(&root).unwrap();
}

/// Files shared by templates are laid out once per copy; GPUs beyond the templates
/// get a copy holding only their templates' files; in place, one set of mapped files.
#[test]
fn placement_shares_the_jobs_files() {
    let t = vec![template(&["/d/a", "/d/b"]), template(&["/d/b", "/d/c"])];
    let root = Path::new("/r");
    let p = Placement::new(&t, 2, root, None);
    assert_eq!(p.layout.files.len(), 3, "a, b, c once");
    assert_eq!(p.file(0, 1), p.file(1, 0), "both GPUs read b from one file");
    assert_eq!(p.layout.files[0].rel, PathBuf::from("trace/c00000/f00000.dat"));
    assert_eq!(p.layout.files[0].size, 8192);
    let p1 = Placement::new(&t, 1, root, None);
    assert_eq!(p1.layout.files.len(), 2, "one GPU: template 0's files only");
    let p3 = Placement::new(&t, 3, root, None);
    assert_eq!(p3.layout.files.len(), 5, "GPU 2 replays template 0 on a second copy of a and b");
    assert_eq!(p3.files_of(2), vec![3, 4]);
    assert_eq!(p3.layout.files[4].rel, PathBuf::from("trace/c00001/f00001.dat"));
    assert!(p3.files_of(0).iter().all(|f| !p3.files_of(2).contains(f)), "copies share no file");
    let map = PathMap::parse(&["/d=/m/x".into()]).unwrap();
    let pi = Placement::new(&t, 4, root, Some(&map));
    assert!(pi.in_place());
    assert_eq!(pi.layout.files.len(), 3);
    assert_eq!(pi.layout.root, PathBuf::from("/m/x"));
    assert_eq!(pi.layout.path(pi.file(3, 1) as usize), PathBuf::from("/m/x/c"));
    assert_eq!(pi.files_of(2), pi.files_of(0), "GPUs beyond the recorded count reread the files");
    assert_eq!(pi.layout.files[0].size, 5000, "in place: the largest byte read, not rounded");
    let nested = PathMap::parse(&["/d=/m".into(), "/d/b=/n".into()]).unwrap();
    assert_eq!(nested.map("/d/b"), Some(PathBuf::from("/n")), "the longest prefix wins");
    assert_eq!(nested.map("/dd/b"), None, "whole components only");
    assert!(PathMap::parse(&["d=/m".into()]).is_err());
}

/// A job's objects keep their recorded keys under each copy's folder; a key that is
/// not a plain relative path gets a file's name.
#[test]
fn objects_keep_their_keys() {
    let mut t = template(&["train/a/s0.bin", "train/../x", "train/b"]);
    t.dev = Some("s3://127.0.0.1:9000/train".into());
    assert!(t.objects());
    let p = Placement::new(&[t.clone()], 2, Path::new("/r"), None);
    let rel: Vec<PathBuf> = p.layout.files.iter().map(|f| f.rel.clone()).collect();
    assert_eq!(rel[0], PathBuf::from("trace/c00000/train/a/s0.bin"));
    assert_eq!(rel[1], PathBuf::from("trace/c00000/f00001.dat"));
    assert_eq!(rel[3], PathBuf::from("trace/c00001/train/a/s0.bin"), "the second GPU's copy");
    t.dev = Some("259:0".into());
    assert!(!t.objects());
    let p = Placement::new(&[t], 1, Path::new("/r"), None);
    assert_eq!(p.layout.files[0].rel, PathBuf::from("trace/c00000/f00000.dat"));
}

/// Two loader threads of one process on the data device, its main thread reading a
/// library on another device. Bursts at 0 and 50 ms (each 4 ms long: gaps 46 ms).
#[test]
fn streams_periods_and_the_data_device() {
    let t0 = 1_000 * MS;
    let rows = vec![
        read(10, 10, "train", "254:0", "/lib/libc.so", 0, t0 - 5 * MS, MS / 10),
        read(10, 11, "worker", "7:1", "/d/a", 0, t0, 2 * MS),
        read(10, 12, "worker", "7:1", "/d/b", 0, t0 + MS / 10, 2 * MS),
        read(10, 11, "worker", "7:1", "/d/a", 4096, t0 + 2 * MS, 2 * MS),
        read(10, 12, "worker", "7:1", "/d/b", 4096, t0 + 50 * MS, 4 * MS),
    ];
    let dir = write_trace(&rows);
    let opts = Options { burst_gap_ms: Some(10.0), ..Default::default() };
    let (t, model) = load_templates(&dir, &opts, false).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(t.len(), 1);
    assert!(model.warnings.iter().any(|w| w.contains("no proc layer")));
    let t = &t[0];
    assert_eq!(t.dev.as_deref(), Some("7:1"), "the device most bytes came from");
    assert_eq!(t.comm, "train", "named by its main thread");
    assert_eq!(t.files.len(), 2, "the library read on 254:0 is left out");
    assert_eq!(t.concurrency, 2, "two threads read");
    assert!(!t.synchronous && t.paced, "loader threads, not the main thread, read");
    assert_eq!(t.steps.len(), 2);
    // tid 11 is reader 0 (first to read), tid 12 reader 1; order kept.
    assert_eq!(t.steps[0].streams, vec![0, 1, 0]);
    assert_eq!(t.steps[1].streams, vec![1]);
    // Threads that read ahead: the step period (burst start to burst start), not the
    // 46 ms idle gap; the last step gets the median period.
    assert!((t.steps[0].compute_s - 0.050).abs() < 1e-9, "{}", t.steps[0].compute_s);
    assert!((t.steps[1].compute_s - 0.050).abs() < 1e-9);
    assert_eq!(t.steps[0].start_ns, 0);
    assert_eq!(t.steps[1].start_ns, 50 * MS as u64);
}

/// The objects a template's rank put are written after their step by each simulated GPU
/// to its copy's folder under the recorded bucket/key; without an object store as files,
/// each PUT's and part's bytes at their place in the object, the upload's create and
/// complete having no bytes to write. A file write keeps its GPU's own directory.
#[test]
fn objects_put_go_to_the_copys_folder() {
    use trainio_model::writes::{ObjectWrite, WriteOp};
    let op = |file, offset, len, object| WriteOp { file, offset, len, sync: None, object };
    let mut t = template(&["bkt/data/s0.bin"]);
    t.write_files = vec!["bkt/ckpt/model.pt".into(), "bkt/ckpt/meta".into(), "/logs/x".into(), "../up".into()];
    t.write_bursts.insert(
        1,
        vec![
            op(0, 0, 0, Some(ObjectWrite::Create { parts: 2, parallel: 2 })),
            op(0, 0, 5 << 20, Some(ObjectWrite::Part { number: 1 })),
            op(0, 5 << 20, 100, Some(ObjectWrite::Part { number: 2 })),
            op(0, 0, 0, Some(ObjectWrite::Complete)),
            op(1, 0, 300, Some(ObjectWrite::Put)),
            op(2, 4096, 10, None),
            op(3, 0, 7, Some(ObjectWrite::Put)),
        ],
    );
    let templates = vec![t.clone(), template(&["bkt/data/s1.bin"])];
    let root = Path::new("/r");
    let p = Placement::new(&templates, 3, root, None);
    let opts = TraceOptions { epochs: 1, max_steps: 0, compute_override: None, prefetch_override: None };
    let program = TraceProgram::new(templates, p, root, 3, &[0, 1, 2], opts);
    assert!(program.writes_after(0, 0, 2).is_empty(), "only after the step it followed");
    assert!(program.writes_after(1, 0, 1).is_empty(), "template 1 put nothing");
    for (gpu, copy) in [(0, "trace/c00000"), (2, "trace/c00001")] {
        let calls = program.writes_after(gpu, 0, 1);
        let got: Vec<(String, u64, u64)> =
            calls.iter().map(|c| (c.path.display().to_string(), c.offset, c.len)).collect();
        let g = gpu as u64;
        let want = [
            (format!("/r/{copy}/bkt/ckpt/model.pt"), 0, 5 << 20),
            (format!("/r/{copy}/bkt/ckpt/model.pt"), 5 << 20, 100),
            (format!("/r/{copy}/bkt/ckpt/meta"), 0, 300),
            (format!("/r/trace/gpu{g:05}/w00002.dat"), 4096, 10),
            (format!("/r/trace/gpu{g:05}/w00003.dat"), 0, 7), // a key that is no plain path
        ];
        assert_eq!(got, want);
        assert!(calls.iter().all(|c| c.object.is_none() && c.sync.is_none()), "files, without a store");
    }
}

/// A row of the proc or ipc layer, from `read`'s.
fn other<'a>(
    layer: Layer,
    op: &'a str,
    pid: u32,
    comm: &'a str,
    file: Option<&'a str>,
    at: i64,
    bytes: i64,
) -> Row<'a> {
    let mut r = read(pid, pid, comm, "0:0", "", 0, at, 10_000);
    r.layer = layer;
    r.op = op;
    r.dev = None;
    r.offset = None;
    r.bytes = bytes;
    r.bytes_requested = bytes;
    r.file = file;
    r.fd = file.map(|_| 9);
    r
}

/// A DataLoader worker (JPEG decoding) that spends 200 ms after the first read of each
/// batch and reads the other two back to back: the replay's worker thinks after the read
/// the time followed, not a third of it after each.
#[test]
fn a_workers_think_time_follows_the_read_it_followed() {
    let (rank, worker, t0) = (100u32, 101u32, 1_000 * MS);
    let (index, data, w) = ("pipe:[7001]", "pipe:[9001]", "pt_data_worker");
    let mut rows = vec![
        Row { ppid: Some(1), ..other(Layer::Proc, "fork", rank, "python", None, t0, 0) },
        Row { ppid: Some(rank), ..other(Layer::Proc, "fork", worker, "python", None, t0 + MS, 0) },
        Row { ppid: Some(rank), ..other(Layer::Proc, "comm", worker, w, None, t0 + 2 * MS, 0) },
    ];
    // PyTorch's loop with one worker, prefetch 2: the rank sends indices 0 and 1, then
    // index k+2 once it has taken batch k, and computes 50 ms per batch.
    for k in 0..2 {
        rows.push(other(Layer::Ipc, "write", rank, "python", Some(index), t0 + 4 * MS + k * 20_000, 40));
    }
    let (mut t, mut rank_t, steps) = (t0 + 5 * MS, t0 + 5 * MS, 4i64);
    let mut taken = Vec::new();
    for k in 0..steps {
        if k >= 2 {
            t = t.max(taken[k as usize - 2]);
        }
        rows.push(other(Layer::Ipc, "read", worker, w, Some(index), t, 40));
        t += 20_000;
        for j in 0..3 {
            rows.push(read(worker, worker, w, "7:1", "/d/a", (3 * k + j) * 4096, t, MS));
            t += MS + MS / 10 + if j == 0 { 200 * MS } else { 0 };
        }
        t += 10 * MS;
        rows.push(other(Layer::Ipc, "write", worker, w, Some(data), t, 300));
        let ready = t + 10_000;
        t += 20_000;
        let got = rank_t.max(ready);
        rows.push(Row { complete_ns: got, ..other(Layer::Ipc, "wait", rank, "python", Some(data), rank_t, 1) });
        rows.push(other(Layer::Ipc, "read", rank, "python", Some(data), got + 5_000, 300));
        taken.push(got + 15_000);
        if k + 2 < steps {
            rows.push(other(Layer::Ipc, "write", rank, "python", Some(index), got + 20_000, 40));
        }
        rank_t = got + 15_000 + 50 * MS;
    }
    let dir = write_trace(&rows);
    let (t, model) = load_templates(&dir, &Options::default(), false).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let g = &model.gpus[0];
    assert_eq!((model.gpus.len(), g.workers, g.steps.len()), (1, 1, 4), "{:#?}", model.warnings);
    for (k, s) in t[0].steps.iter().enumerate() {
        let think: Vec<u64> = s.reads.iter().map(|r| r.think_ns).collect();
        assert_eq!(think, [200_100_000, 100_000, 10_100_000], "step {k}");
        let cpu = g.steps[k].worker_cpu_s.unwrap();
        assert!((think.iter().sum::<u64>() as f64 - cpu * 1e9).abs() < 2.0, "step {k}: {think:?} against {cpu}");
    }
}
