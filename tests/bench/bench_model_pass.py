"""Benchmark `trainio analyze --json` with its job model on a long training trace.

The trace is the 8-GPU sample (traces/unet3d-demo-8gpu: a PyTorch job's file and block
layers) repeated ``--copies`` times one after another, each copy's times moved past the
last, written through the project's writer (the recorder's encodings, 1 Mi-row row
groups) and cached under results/bench/. The analysis and its job model both need every
row group: the bench times the whole command as a child process (wall, user and system
CPU, peak RSS from getrusage(RUSAGE_CHILDREN)) with the load average before it.

``--arm NAME=DIR`` times the analyzer package under DIR (a checkout's ``analysis``
directory) instead of this one's; arms alternate, ``--rounds`` times each, and must give
the same analysis.

    .venv/bin/python tests/bench/bench_model_pass.py [--copies N] [--rounds N] [--arm NAME=DIR ...]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "analysis"))

from trainio_analysis.trace import read_metadata, write_trace  # noqa: E402

SAMPLE = ROOT / "traces" / "unet3d-demo-8gpu"
TIME_COLUMNS = ("issue_ns", "complete_ns", "insert_ns")
GENERATOR_VERSION = "1"  # bump when the copies or the writer change


def copies(n: int) -> Iterator[pa.Table]:
    """The sample ``n`` times, each copy 1 s after the one before ends."""
    table = pq.read_table(SAMPLE / "seg-000000.parquet")
    first = pc.min(table["issue_ns"]).as_py()
    span = pc.max(table["complete_ns"]).as_py() - first + 1_000_000_000
    for k in range(n):
        out = table
        for name in TIME_COLUMNS:
            i = out.schema.get_field_index(name)
            out = out.set_column(i, name, pc.add(out[name], pa.scalar(k * span, pa.int64())))
        yield out


def build_trace(path: Path, n: int) -> None:
    stamp = path / "BENCH_STAMP"
    want = f"{GENERATOR_VERSION} {n}"
    if stamp.exists() and stamp.read_text() == want:
        return
    shutil.rmtree(path, ignore_errors=True)
    meta = read_metadata(SAMPLE)
    keep = {k: meta[k] for k in ("devices", "hostname", "kernel") if k in meta}
    write_trace(path, copies(n), keep, rows_per_segment=8 << 20, row_group_rows=1 << 20)
    stamp.write_text(want)


def time_analyze(trace: Path, analysis: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(analysis))
    cmd = [sys.executable, "-m", "trainio_analysis", "analyze", str(trace), "--json"]
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, timeout=900)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"bench-model-pass: {trace}: {proc.stderr.strip()}")
    return {
        "digest": hashlib.sha256(proc.stdout.encode()).hexdigest(),
        "wall": wall,
        "user": after.ru_utime - before.ru_utime,
        "sys": after.ru_stime - before.ru_stime,
        "rss": after.ru_maxrss * 1024,  # KiB on Linux; max over children so far
        "load": load,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=2750, help="copies of the sample (5,447 rows each)")
    ap.add_argument("--trace", type=Path, default=None, help="where to cache the trace")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--arm", action="append", default=[], help="NAME=DIR: the analysis package under DIR")
    args = ap.parse_args()
    trace = args.trace or ROOT / "results" / "bench" / f"model-pass-{args.copies}"
    build_trace(trace, args.copies)
    rows = sum(pq.ParquetFile(p).metadata.num_rows for p in trace.glob("seg-*.parquet"))
    arms = [tuple(a.split("=", 1)) for a in args.arm] or [("this", str(ROOT / "analysis"))]
    print(f"trace {trace}: {rows:,} rows, {args.copies} copies of {SAMPLE.name}")
    digests = set()
    for r in range(args.rounds):
        for name, analysis in arms:
            t = time_analyze(trace, Path(analysis))
            digests.add(t["digest"])
            print(
                f"round {r + 1} {name}: wall {t['wall']:.1f} s, user {t['user']:.1f} s, sys {t['sys']:.1f} s, "
                f"peak RSS {t['rss'] / 2**20:.0f} MiB (load average {t['load']:.1f} before)"
            )
    if len(digests) != 1:
        print("bench-model-pass: the arms' analyses differ")
        return 1
    print("every run gave the same analysis")
    return 0


if __name__ == "__main__":
    sys.exit(main())
