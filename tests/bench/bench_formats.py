"""Format and loader faithfulness (#21 item 3): per format × loader, the real reader and
trainio's emulation of it read the same generated files on a loop device, each recorded
with `trainio record`, and the table compares them: block-layer request sizes (mean and
largest), per-issue queue depth (mean), throughput over the active span, and
`trainio compare`'s request-size W1 (octaves, block and file layer) and per-issue QD W1.

Set-up: ext4 on a loop device over /dev/shm (4 KiB blocks, no lazy init, noatime), one
simulated GPU, 32 files of 1 MiB (npz, npy), 32 files of 8 × 128 KiB samples (TFRecord
records, indexed_binary and mmap_indexed_binary samples), 32 hdf5 files of 4 rows of 256
KiB or of 64 rows of 16 KiB (read through h5py's sieve), 32 parquet files of 64 rows in
row groups of 8 (formats_testlib.parquet_workload; with and without column selection, a
batch a file), 32 JPEG images of 322957 bytes (retinanet's record length), batch 2 (hdf5
also a batch a file: `b4`, `b64`), `--threads` readers, the device's reads capped by a cgroup at
`--mibs` (300 MiB/s: storage-bound, so the device and not the readers' CPU on a busy host
sets the pace; 0 for no cap); the page cache of the dataset is dropped (fadvise) before
each side. Real readers: tests/formats/real_reader.py (numpy.load or h5py in worker
processes; pyarrow's ParquetFile as DLIO's parquet reader drives it; PIL as DLIO's image
reader, its time outside its reads per image (from its recording) given to the replay
as `reader.preprocess_time`; TensorFlow's TFRecord reads written in Python, TensorFlow not being installed)
and tests/formats/indexed_reader.py (DLIO's two indexed_binary readers in PyTorch's
worker processes or DALI's, DALI's scheduling written out). The replay runs with
`--io-engine psync`. Targets: size W1 <= 0.5 octave, QD W1 <= 1.

    sudo .venv/bin/python tests/bench/bench_formats.py [--threads 2 4] [--mibs 300] [--formats npz ...]
"""

from __future__ import annotations

import argparse
import fcntl
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "formats"))
from formats_testlib import (  # noqa: E402
    PARQUET_SELECTED,
    analyze,
    compare,
    drop_cache,
    parquet_workload,
    reader_cpu_per_sample,
    record_emulation,
    record_real,
    trainio,
    write_workload,
)

from trainio_testlib import mounted_loop_fs, throttled_cgroup  # noqa: E402

LOCK = "/tmp/trainio-bench.lock"
# (format, loader, samples per file, sample bytes, batch); hdf5 with a batch a file (one
# worker reads it) and with batch 2 (two workers read one file's rows at once)
CASES = [
    ("npz", "pytorch", 1, 1 << 20, 2),
    ("npy", "pytorch", 1, 1 << 20, 2),
    ("tfrecord", "tensorflow", 8, 128 << 10, 2),
    ("hdf5", "pytorch", 4, 256 << 10, 4),
    ("hdf5", "pytorch", 4, 256 << 10, 2),
    ("hdf5", "pytorch", 64, 16 << 10, 64),
    ("hdf5", "pytorch", 64, 16 << 10, 2),
    ("indexed_binary", "pytorch", 8, 128 << 10, 2),
    ("mmap_indexed_binary", "pytorch", 8, 128 << 10, 2),
    ("indexed_binary", "dali", 8, 128 << 10, 2),
    # parquet_workload: 64 rows of 36 KiB a file, row groups of 8, a batch a file; the
    # middle column read or not (`record` 1: with column selection)
    ("parquet", "pytorch", 64, 1, 64),
    ("parquet", "pytorch", 64, 0, 64),
    # retinanet's record length
    ("jpeg", "pytorch", 1, 322957, 2),
]


def sizes_and_qd(a: dict) -> tuple[float, int, float]:
    """Mean and largest request (KiB) and mean per-issue QD of an analyze result."""
    sizes = {int(k): v for k, v in a["size_hist"].items()}
    n = sum(sizes.values())
    mean = sum(k * v for k, v in sizes.items()) / n / 1024
    qd = {int(k): v for k, v in a["qd_hist_issue"].items()}
    return mean, max(sizes) // 1024, sum(k * v for k, v in qd.items()) / sum(qd.values())


def run_case(
    mnt: Path,
    majmin: str,
    work: Path,
    fmt: str,
    loader: str,
    spf: int,
    record: int,
    batch: int,
    threads: int,
    mibs: int,
):
    name = f"{fmt}-{loader}-{record}-{batch}-{threads}"
    data = mnt / name
    extra: tuple = ()
    if fmt == "parquet":
        wl = parquet_workload(work / f"{name}.yaml", files=32, select=bool(record))
        wl.write_text(wl.read_text().replace("read_threads: 2", f"read_threads: {threads}"))
        extra = PARQUET_SELECTED if record else ()
    else:
        wl = write_workload(
            work / f"{name}.yaml",
            fmt=fmt,
            loader=loader,
            files=32,
            spf=spf,
            record=record,
            batch=batch,
            threads=threads,
        )
    trainio("datagen", "--workload", wl, "--data-dir", data, "--gpus", 1, "-q")
    real, emu = work / f"{name}-real", work / f"{name}-emu"
    with throttled_cgroup(majmin, mibs << 20 if mibs else None) as th:
        drop_cache(data)
        record_real(real, fmt, data, spf=spf, batch=batch, threads=threads, wrap=th.wrap, loader=loader, extra=extra)
        if fmt == "jpeg":
            # PIL's decoding, as DLIO's preprocess_time: the real reader's time outside its
            # reads per image, from its recording
            decode = reader_cpu_per_sample(real, majmin)
            wl.write_text(wl.read_text().replace("train:\n", f"  preprocess_time: {decode:.6f}\ntrain:\n", 1))
        drop_cache(data)
        record_emulation(emu, wl, data, wrap=th.wrap)
    block, file_layer = compare(real, emu, majmin, "block"), compare(real, emu, majmin, "file")
    ra, rb = sizes_and_qd(analyze(real, majmin)), sizes_and_qd(analyze(emu, majmin))
    detail = {"hdf5": f" {record >> 10}K rows b{batch}", "parquet": " columns read" if record else " all columns"}
    return {
        "case": f"{fmt}{detail.get(fmt, '')} × {loader} ({threads} readers)",
        "size_kib": (ra[0], rb[0]),
        "max_kib": (ra[1], rb[1]),
        "qd": (ra[2], rb[2]),
        "mib_s": (block["throughput_mib_s"]["a"], block["throughput_mib_s"]["b"]),
        "size_w1": block["size_w1_log2"],
        "size_w1_file": file_layer["size_w1_log2"],
        "qd_w1": block["qd_w1_issue"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[2, 4])
    ap.add_argument(
        "--mibs", type=int, default=300, help="cap the device's reads at this many MiB/s (default 300; 0: no cap)"
    )
    ap.add_argument(
        "--formats", nargs="+", choices=sorted({c[0] for c in CASES}), help="only these formats (default: all)"
    )
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_formats: needs root (loop device, BPF)")
    rows = []
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with (
            tempfile.TemporaryDirectory(prefix="trainio-bench-formats-") as tmp,
            mounted_loop_fs(768, quiet=True) as fs,
        ):
            _, majmin, mnt = fs
            for threads in args.threads:
                for fmt, loader, spf, record, batch in CASES:
                    if args.formats and fmt not in args.formats:
                        continue
                    rows.append(run_case(mnt, majmin, Path(tmp), fmt, loader, spf, record, batch, threads, args.mibs))
    head = (
        f"{'format × loader':41} {'req KiB real/emu':>17} {'max KiB':>11} {'QD real/emu':>12} "
        f"{'MiB/s real/emu':>15} {'size W1 blk/file':>17} {'QD W1':>6}"
    )
    print(head)
    print("-" * len(head))
    ok = True
    for r in rows:
        print(
            f"{r['case']:41} {r['size_kib'][0]:8.1f}/{r['size_kib'][1]:<8.1f} "
            f"{r['max_kib'][0]:5d}/{r['max_kib'][1]:<5d} {r['qd'][0]:5.2f}/{r['qd'][1]:<6.2f} "
            f"{r['mib_s'][0]:7.0f}/{r['mib_s'][1]:<7.0f} "
            f"{r['size_w1']:8.3f}/{r['size_w1_file']:<8.3f} {r['qd_w1']:6.2f}"
        )
        ok &= r["size_w1"] <= 0.5 and r["qd_w1"] <= 1.0
    print(f"targets (size W1 <= 0.5 octave, QD W1 <= 1): {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
