"""Helpers for the analyzer tests: hand-built trace rows and the real command line."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

US = 1_000  # ns per microsecond: hand-built traces are written in microseconds


def block(
    issue_us: float,
    complete_us: float,
    *,
    qd: int,
    dev: str = "7:0",
    nbytes: int = 4096,
    op: str = "read",
    pid: int = 1,
) -> dict:
    return {
        "layer": "block",
        "op": op,
        "issue_ns": int(issue_us * US),
        "complete_ns": int(complete_us * US),
        "dev": dev,
        "bytes": nbytes,
        "queue_depth": qd,
        "pid": pid,
        "offset": 0,
    }


def fread(
    issue_us: float,
    complete_us: float,
    *,
    pid: int,
    qd: int = 1,
    nbytes: int = 1 << 20,
    file: str = "/data/f0",
    comm: str = "loader",
) -> dict:
    return {
        "layer": "file",
        "op": "read",
        "issue_ns": int(issue_us * US),
        "complete_ns": int(complete_us * US),
        "bytes": nbytes,
        "queue_depth": qd,
        "pid": pid,
        "tid": pid,
        "comm": comm,
        "file": file,
        "fd": 3,
        "offset": 0,
    }


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the real entry point, bin/trainio."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        [str(ROOT / "bin/trainio"), *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=300,
    )
