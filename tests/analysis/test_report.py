"""report: one self-contained HTML file, written atomically, whose plots all render."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from analysis_helpers import block, fread, run_cli

from trainio_analysis.report import PLOT_IDS
from trainio_analysis.trace import write_trace

CHROMIUM = "/usr/bin/chromium"


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


def _plot_sections(dom: str) -> dict[str, str]:
    """The rendered DOM of each plot div, cut at the next plot's id."""
    starts = {div_id: dom.index(f'id="{div_id}"') for div_id in PLOT_IDS}
    order = sorted(starts, key=starts.get)
    sections = {}
    for k, div_id in enumerate(order):
        end = starts[order[k + 1]] if k + 1 < len(order) else len(dom)
        sections[div_id] = dom[starts[div_id] : end]
    return sections


def _bar_heights(section: str) -> list[float]:
    # plotly draws a bar as M x,y0 V y1 H x2 V y0 Z: its height is |y0 - y1|
    return [
        abs(float(y0) - float(y1))
        for y0, y1 in re.findall(
            r'<g class="point"><path d="M[-\d.e]+,([-\d.e]+)V([-\d.e]+)H', section
        )
    ]


@pytest.mark.slow
def test_every_plot_renders_with_data_in_headless_chromium(tmp_path: Path) -> None:
    assert Path(CHROMIUM).exists(), "Debian's chromium is needed (scripts/install-deps.sh)"
    one, eight = _job(tmp_path / "gpu1", 1), _job(tmp_path / "gpu4", 4)
    out = tmp_path / "report.html"
    assert run_cli("report", str(one), str(eight), "-o", str(out), "--bin-s", "0.1").returncode == 0
    base = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=15000",
    ]
    dom = subprocess.run(
        [*base, "--dump-dom", out.as_uri()], capture_output=True, text=True, timeout=180, check=True
    ).stdout
    sections = _plot_sections(dom)
    for div_id, section in sections.items():
        assert 'class="main-svg"' in section, f"{div_id}: no svg rendered"
        traces = re.findall(r'class="trace (bars|scatter)', section)
        assert len(traces) == 2, f"{div_id}: {len(traces)} traces, want one per trace file"
        if traces[0] == "scatter":
            lines = re.findall(r'class="js-line" d="(M[^"]*)"', section)
            assert sum(1 for d in lines if d.count("L") >= 10) == 2, f"{div_id}: empty lines"
        else:
            heights = _bar_heights(section)
            assert sum(h > 1 for h in heights) >= 2, f"{div_id}: no visible bars"
    # the 4-GPU job's per-issue QD reaches 4 on the block layer: its bars are on the x axis
    assert ">4<" in sections["qd-issue"]
    shot = tmp_path / "report.png"
    subprocess.run(
        [*base, "--window-size=1300,4200", f"--screenshot={shot}", out.as_uri()],
        capture_output=True,
        timeout=180,
        check=True,
    )
    assert shot.stat().st_size > 50_000  # a blank page is a few KiB
    keep = Path(__file__).resolve().parents[2] / "results" / "test-report.png"
    keep.parent.mkdir(exist_ok=True)
    shutil.copy(shot, keep)  # for a person to look at


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
