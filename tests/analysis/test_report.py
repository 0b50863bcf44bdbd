"""report: one self-contained HTML file, written atomically (rendering in Chromium:
test_report_render.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from analysis_helpers import block, fread, run_cli

from trainio_analysis.report import PLOT_IDS
from trainio_analysis.trace import write_trace


def _job(path: Path, gpus: int) -> Path:
    """A small training-like job over 3 s: per step, each GPU's loader reads 4 x 1 MiB."""
    rows = []
    t = 0.0
    for step in range(12):
        for g in range(gpus):
            for k in range(4):
                start = t + k * 1000
                rows.append(fread(start, start + 900, pid=100 + g, file=f"/d/{step}_{g}_{k}"))
                rows.append(block(start + 10, start + 890, qd=g + 1, nbytes=1 << 20))
        t += 250_000
    write_trace(path, rows)
    return path


def test_report_is_self_contained_and_written_atomically(tmp_path: Path) -> None:
    a = _job(tmp_path / "gpu1", 1)
    out = tmp_path / "report.html"
    res = run_cli("report", str(a), "-o", str(out))
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    assert "<script src=" not in text  # plotly.js inlined: works offline
    assert "Plotly.newPlot" in text
    for div_id in PLOT_IDS:
        assert f'id="{div_id}"' in text
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    # a failing report leaves the previous file untouched and no temporary behind
    before = out.read_bytes()
    bad = run_cli("report", str(a), str(tmp_path / "nope"), "-o", str(out))
    assert bad.returncode == 2 and "nope" in bad.stderr
    assert out.read_bytes() == before
    unwritable = run_cli("report", str(a), "-o", str(tmp_path / "no-dir" / "r.html"))
    assert unwritable.returncode == 2 and len(unwritable.stderr.strip().splitlines()) == 1
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_block_only_traces_get_per_device_streams(tmp_path: Path) -> None:
    t = tmp_path / "blk"
    write_trace(t, [block(0, 20, qd=1, dev="8:0"), block(5, 30, qd=1, dev="8:16")])
    out = tmp_path / "r.html"
    assert run_cli("report", str(t), "-o", str(out)).returncode == 0
    text = out.read_text()
    assert "Per-dev streams: utilization (no file layer recorded)" in text
    assert '"x":["8:0","8:16"]' in text.replace(" ", "")


@pytest.mark.parametrize("kind", ["devnull", "symlink", "directory", "missing_dir"])
def test_report_refuses_outputs_it_would_replace(tmp_path: Path, kind: str) -> None:
    """-o must name a regular file or a new name in an existing directory: the report is
    renamed into place, which would replace a device node or a link with a file."""
    a = _job(tmp_path / "gpu1", 1)
    target = tmp_path / "target.html"
    target.write_text("keep me")
    if kind == "devnull":
        # a device node of our own, like /dev/null (char 1:3): never the real one, which
        # a report writer with the bug would replace with a file
        if os.geteuid() != 0:
            pytest.skip("mknod of a device node needs root")
        os.mknod(tmp_path / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    out = {
        "devnull": tmp_path / "null",
        "symlink": tmp_path / "link.html",
        "directory": tmp_path,
        "missing_dir": tmp_path / "nowhere" / "report.html",
    }[kind]
    if kind == "symlink":
        out.symlink_to(target)
    before = out.lstat() if out.exists() or out.is_symlink() else None
    res = run_cli("report", str(a), "-o", str(out))
    assert res.returncode == 2, (res.returncode, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and str(out) in lines[0], res.stderr
    if before is not None:
        after = out.lstat()
        assert (after.st_mode, after.st_ino, after.st_rdev) == (before.st_mode, before.st_ino, before.st_rdev)
    assert target.read_text() == "keep me"
    assert not list(tmp_path.glob(".*.tmp")), "no temporary file left"
    assert not (tmp_path / "nowhere").exists()
