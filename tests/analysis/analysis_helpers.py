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


def schema_md_columns() -> list[tuple[str, str, bool]]:
    """traces/SCHEMA.md's column table: (column, Arrow type as pyarrow prints it, nullable)."""
    import re

    import pyarrow as pa

    def arrow(md_type: str) -> str:
        m = re.fullmatch(r"dictionary<(\w+), utf8>", md_type)
        if m:
            return str(pa.dictionary(getattr(pa, m.group(1))(), pa.string()))
        return str(getattr(pa, md_type)())

    text = (ROOT / "traces/SCHEMA.md").read_text()
    table = text.split("## Columns", 1)[1].split("\n\n", 2)[1]
    out = []
    for line in table.splitlines()[2:]:  # after the header and its rule
        cells = [c.strip() for c in line.strip("|").split("|")]
        out.append((cells[0].strip("`"), arrow(cells[1]), {"yes": True, "no": False}[cells[2]]))
    return out


def schema_md_ops() -> dict[str, list[str]]:
    """traces/SCHEMA.md's ops table: layer → its ops, in order."""
    import re

    text = (ROOT / "traces/SCHEMA.md").read_text()
    table = text.split("### ops", 1)[1].split("\n\n", 2)[1]
    out = {}
    for line in table.splitlines()[2:]:
        layer, ops = (c.strip() for c in line.strip("|").split("|"))
        # the ops are the backquoted words outside parentheses (those name syscalls and fields)
        out[layer] = re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", ops))
    return out
