//! CPU per row of the tracer's write path, without a kernel or a device: block rows shaped
//! like `make bench-tracer`'s (4 KiB random reads of a 1 GiB device, QD up to 32, one fio
//! thread, ~4 µs apart) are built into 4 Ki-row batches (as the drain does: FLUSH_ROWS in
//! tracer/src/events.rs) and encoded into Parquet segments (as the encoder thread does).
//! Prints ns per row for each stage and the bytes per row on disk.
//!
//!   cargo run --release -p trainio-schema --example encode_bench [ROWS [BATCH_ROWS]]
use std::time::{Duration, Instant};

use trainio_schema::{BatchBuilder, Layer, Row, RowKeys, SegmentLimits, TraceWriter};

fn main() {
    let rows: usize = std::env::args().nth(1).map(|s| s.parse().expect("ROWS is a number")).unwrap_or(2_000_000);
    let per_batch: usize =
        std::env::args().nth(2).map(|s| s.parse().expect("BATCH_ROWS is a number")).unwrap_or(4 * 1024);
    let dir = std::env::temp_dir().join(format!("trainio-encode-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut writer = TraceWriter::new(&dir, SegmentLimits { max_bytes: 256 << 20, max_age: Duration::from_secs(3600) });
    let mut batch = BatchBuilder::with_capacity(per_batch);
    // xorshift: the same pseudo-random offsets and queue depths on every run.
    let mut x: u64 = 0x9E3779B97F4A7C15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let comm = u128::from_ne_bytes(*b"fio\0\0\0\0\0\0\0\0\0\0\0\0\0");
    let (mut build, mut encode) = (Duration::ZERO, Duration::ZERO);
    let mut t = 1_000_000_000i64;
    let mut done = 0;
    while done < rows {
        let n = (rows - done).min(per_batch);
        let start = Instant::now();
        for _ in 0..n {
            let r = next();
            t += 3_000 + (r % 2_000) as i64;
            let qd = 1 + (r >> 20) as u32 % 32;
            batch.push_keyed(
                &Row {
                    layer: Layer::Block,
                    op: "read",
                    issue_ns: t - 100_000 - (r >> 40) as i64 % 50_000,
                    complete_ns: t,
                    insert_ns: None,
                    dev: Some("7:0"),
                    offset: Some(((r >> 8) % (1 << 18)) as i64 * 4096),
                    bytes: 4096,
                    bytes_requested: 4096,
                    queue_depth: qd,
                    pid: 4242,
                    tid: 4242,
                    comm: "fio",
                    fd: None,
                    file: None,
                    error: 0,
                    flags: 1 << 17,
                    ppid: None,
                },
                RowKeys { op: 0, dev: 7 << 20, comm },
            );
        }
        let b = batch.finish();
        let built = Instant::now();
        writer.write(&b).expect("write");
        encode += built.elapsed();
        build += built - start;
        done += n;
    }
    let start = Instant::now();
    writer.close_segment(&[]).expect("close");
    encode += start.elapsed();
    let bytes: u64 =
        writer.finished_segments().iter().map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)).sum();
    let per = |d: Duration| d.as_nanos() as f64 / rows as f64;
    println!(
        "rows {rows} in batches of {per_batch}: build {:.0} ns/row, encode {:.0} ns/row, {:.2} bytes/row on disk",
        per(build),
        per(encode),
        bytes as f64 / rows as f64
    );
    let _ = std::fs::remove_dir_all(&dir);
}
