"""Helpers of the interop tests (trainio export / import against the real tools)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from trainio_analysis.trace import scan_trace
from trainio_testlib import trainio


def ok(*args, timeout: float = 300, **kw) -> str:
    p = trainio(*args, timeout=timeout, **kw)
    assert p.returncode == 0, f"trainio {' '.join(map(str, args))} exited {p.returncode}:\n{p.stderr[-3000:]}"
    return p.stdout


def analyze_json(trace: Path, *sel: str) -> dict:
    return json.loads(ok("analyze", trace, *sel, "--json"))


def block_requests(trace: Path, dev: str) -> pl.DataFrame:
    """The data requests (read/write) of one device, a request completed in parts summed
    into one, in issue order."""
    df = (
        scan_trace(trace)
        .filter((pl.col("layer") == "block") & (pl.col("dev") == dev) & pl.col("op").is_in(["read", "write"]))
        .collect()
    )
    return (
        df.group_by(["op", "issue_ns", "queue_depth", "pid", "tid"])
        .agg(pl.col("offset").min(), pl.col("bytes").sum(), pl.col("complete_ns").max())
        .sort("issue_ns")
    )


def fio_job(dev: str, *extra: str) -> list[str]:
    """A bursty job, shaped like training steps: 32 random reads and writes (70/30) of three
    sizes at QD 4, then 100 ms without I/O; 640 requests."""
    return [
        "fio",
        "--name=job",
        f"--filename={dev}",
        "--rw=randrw",
        "--rwmixread=70",
        "--bssplit=4k/40:64k/30:256k/30",
        "--ioengine=libaio",
        "--direct=1",
        "--iodepth=4",
        "--thinktime=100ms",
        "--thinktime_blocks=32",
        "--number_ios=640",
        "--randrepeat=0",
        "--output-format=terse",
        *extra,
    ]
