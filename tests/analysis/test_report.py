"""report: one self-contained HTML file, written atomically (rendering in Chromium:
test_report_render.py)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from analysis_helpers import block, fread, run_cli

from trainio_analysis.report import PLOT_IDS
from trainio_analysis.trace import write_trace
from trainio_testlib import require_root


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
        require_root("mknod of a device node")
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


def test_a_replays_recording_is_shown_by_the_replays_results(tmp_path: Path, tmpfs_dir: Path) -> None:
    """A trace that `replay --record` wrote holds replay.json: the report's column for it
    gives the replay's GPUs, AU, steps and bytes per GPU from those results, never a job
    model inferred from the replay's own I/O (here: 1 reading process, not 4 GPUs)."""
    root = Path(__file__).resolve().parents[2]
    wl = tmpfs_dir / "w.yaml"
    wl.write_text(
        "model:\n  name: t\ndataset:\n  num_files_train: 16\n  record_length_bytes: 65536\n"
        "reader:\n  batch_size: 1\n  read_threads: 1\ntrain:\n  epochs: 1\n  computation_time: 0.01\n"
    )
    results = tmpfs_dir / "r.json"
    ran = subprocess.run(
        [str(root / "bin" / "trainio"), "replay", "-q", "--workload", str(wl), "--data-dir", str(tmpfs_dir / "d")]
        + ["--generate", "--gpus", "4", "--json", str(results)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    replay = json.loads(results.read_text())
    original = _job(tmp_path / "original", 2)
    recording = _job(tmp_path / "replay-4", 1)
    (recording / "replay.json").write_text(results.read_text())
    out = tmp_path / "r.html"
    res = run_cli("report", str(original), str(recording), "-o", str(out))
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    summary = text[text.index('<div id="summary">') :]
    summary = summary[: summary.index("</div>")]
    gpus_row = summary[summary.index("<td>GPUs found</td>") :].split("</tr>")[0]
    assert "<td>2</td>" in gpus_row and "4 simulated (the replay&#x27;s results)" in gpus_row, gpus_row
    assert f"{replay['au_percent']:.2f} % (min {replay['au_min_percent']:.2f} %)" in summary
    assert f"{replay['steps']} per GPU, {replay['gpu_steps']} in all" in summary
    assert "replay rank" in text  # the per-GPU figure draws the replay's simulated GPUs
    # results that are not a replay's: one line, exit 2, naming the file
    (recording / "replay.json").write_text('{"tool": "something else"}')
    bad = run_cli("report", str(original), str(recording), "-o", str(tmp_path / "b.html"))
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert str(recording / "replay.json") in bad.stderr
    assert not (tmp_path / "b.html").exists()
