"""Benchmark `trainio analyze --json` on a trace of >= 100 M block events.

The trace is synthesized (bursty training-like block I/O on one NVMe: prefetch bursts at
queue depth up to 32, idle gaps while the "GPU" computes, rows in completion order as the
tracer writes them) and written through the project's writer, then cached under
results/bench/ so a second run only times the analysis. The analysis runs as a child
process: wall time, and peak RSS from getrusage(RUSAGE_CHILDREN).

Targets: >= 20 M events/s and peak RSS < 2 GiB on the 2-core machine.

    .venv/bin/python tests/bench/bench_analysis.py [--events N] [--trace DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "analysis"))

from trainio_analysis.trace import write_trace  # noqa: E402
from trainio_analysis import kernels  # noqa: E402

GENERATOR_VERSION = "3"  # bump when the generator or the writer's encodings change
CHUNK = 2_000_000
TARGET_EVENTS_S = 20e6
TARGET_RSS = 2 << 30


def _dict(values: list[str], codes: np.ndarray) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int8()), pa.array(values))


def chunks(events: int, seed: int = 7) -> Iterator[pa.Table]:
    """Bursty closed-loop reads: each step issues ~BURST requests at QD <= 32, then idles."""
    rng = np.random.default_rng(seed)
    t = 1_000_000_000_000  # a plausible CLOCK_MONOTONIC
    made = 0
    while made < events:
        n = min(CHUNK, events - made)
        # inter-issue gaps: ~2 us inside a burst; every ~2000 requests a 5-50 ms compute gap
        gaps = rng.exponential(2_000.0, n).astype(np.int64) + 200
        step_end = rng.random(n) < 1 / 2000
        gaps[step_end] += rng.integers(5_000_000, 50_000_000, int(step_end.sum()))
        issue = t + np.cumsum(gaps)
        t = int(issue[-1])
        latency = (rng.lognormal(np.log(60_000), 0.5, n)).astype(np.int64) + 5_000
        complete = issue + latency
        order = np.argsort(complete, kind="stable")  # the tracer drains in completion order
        issue, complete, latency = issue[order], complete[order], latency[order]
        # kernel QD at issue: issued so far minus completed before (within this chunk,
        # which is what a counter restarted per chunk would see: good enough for a bench)
        si = np.sort(issue)
        sc = np.sort(complete)
        qd_sorted = np.arange(1, n + 1) - np.searchsorted(sc, si, side="right")
        rank = np.searchsorted(si, issue, side="left")
        qd = np.maximum(qd_sorted[rank], 1).astype(np.uint32)
        sizes = np.where(rng.random(n) < 0.8, 131072, 4096).astype(np.int64)
        offset = rng.integers(0, 1 << 28, n).astype(np.int64) * 4096
        zeros8 = np.zeros(n, np.int8)
        pid = np.full(n, 4242, np.uint32)
        yield pa.table(
            {
                "layer": _dict(["block"], zeros8),
                "op": _dict(["read"], zeros8),
                "issue_ns": issue,
                "complete_ns": complete,
                "insert_ns": pa.nulls(n, pa.int64()),
                "dev": _dict(["259:0"], zeros8),
                "offset": offset,
                "bytes": sizes,
                "bytes_requested": sizes,
                "queue_depth": qd,
                "pid": pid,
                "tid": pid,
                "comm": pa.DictionaryArray.from_arrays(
                    pa.array(np.zeros(n, np.int32)), pa.array(["pt_data_worker"])
                ),
                "fd": pa.nulls(n, pa.int32()),
                "file": pa.nulls(n, pa.string()),
                "error": np.zeros(n, np.int32),
                "flags": np.zeros(n, np.uint32),
            }
        )
        made += n


def build_trace(path: Path, events: int) -> float:
    stamp = path / "BENCH_STAMP"
    want = f"{GENERATOR_VERSION} {events}"
    if stamp.exists() and stamp.read_text() == want:
        return 0.0
    shutil.rmtree(path, ignore_errors=True)
    start = time.perf_counter()
    write_trace(
        path,
        chunks(events),
        {"devices": [{"dev": "259:0", "name": "nvme0n1"}]},
        rows_per_segment=8 << 20,
        row_group_rows=1 << 20,
    )
    stamp.write_text(want)
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000_000)
    ap.add_argument("--trace", type=Path, default=ROOT / "results/bench/analysis-trace")
    args = ap.parse_args()
    build_s = build_trace(args.trace, args.events)
    size = sum(f.stat().st_size for f in args.trace.glob("seg-*.parquet"))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "analysis"))
    cmd = [sys.executable, "-m", "trainio_analysis", "analyze", str(args.trace), "--json"]
    load_before = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        return 1
    result = json.loads(proc.stdout)
    rss = after.ru_maxrss * 1024  # KiB on Linux; max over children, the analyzer is the biggest
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rate = result["events"] / wall
    rows = [
        ("events", f"{result['events']:,}"),
        (
            "trace on disk",
            f"{size / 2**30:.2f} GiB in {len(list(args.trace.glob('seg-*.parquet')))} segments",
        ),
        ("trace build (s)", f"{build_s:.1f}" if build_s else "cached"),
        ("kernels", kernels.path() + ("" if kernels.available() else " (native not built: make)")),
        ("analyze wall (s)", f"{wall:.2f}"),
        (
            "analyze CPU (s)",
            f"{cpu:.2f}  ({cpu / result['events'] * 1e9:.0f} ns/event; "
            f"{result['events'] / cpu / 1e6:.1f} M events per CPU-second)",
        ),
        (
            "load average before",
            f"{load_before:.2f} on {os.cpu_count()} cores (other work competes for the cores)",
        ),
        (
            "events/s",
            f"{rate / 1e6:.1f} M  (target >= {TARGET_EVENTS_S / 1e6:.0f} M: "
            f"{'PASS' if rate >= TARGET_EVENTS_S else 'FAIL'})",
        ),
        (
            "peak RSS",
            f"{rss / 2**20:.0f} MiB  (target < {TARGET_RSS >> 20} MiB: "
            f"{'PASS' if rss < TARGET_RSS else 'FAIL'})",
        ),
        ("qd_mean_time (aqu-sz)", f"{result['qd_mean_time']:.2f}"),
        ("QD agreement W1", f"{result['qd_issue_agreement']['w1']:.4f}"),
        ("throughput mean MiB/s", f"{result['throughput_mib_s']['mean']:.1f}"),
    ]
    width = max(len(k) for k, _ in rows)
    print(f"{'bench-analysis':<{width}}  value")
    print(f"{'-' * width}  {'-' * 40}")
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    # targets are reported, not enforced: a shared machine's load moves the wall time
    return 0


if __name__ == "__main__":
    sys.exit(main())
