"""report: the sizing report of a 1-GPU and a 15-GPU recording of the same job side by
side, rendered in headless Chromium: every plot drawn with its axis titles, the summary's
answer, nothing fetched from the network, a screenshot that is not blank. Once on traces
built row by row (every figure known), once on real recordings (trainio record of the
emulated training at 1 and 15 MPI ranks on a loop device)."""

from __future__ import annotations

import html
import json
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from analysis_helpers import block, fread, run_cli

from trainio_analysis.report import PLOT_IDS
from trainio_analysis.trace import write_trace
from trainio_testlib import require_root

CHROMIUM = "/usr/bin/chromium"


def _sized_job(path: Path, gpus: int) -> Path:
    """The same training job at 1 or 15 GPUs over ~1.6 s: 36 steps 44 ms apart, each GPU's
    loader reads 4 x 1 MiB per step (file layer) that the disk serves at a queue depth
    growing with the GPUs (block layer); a launcher (bash) reads a 4 KiB script first."""
    rows = [fread(1_000, 1_050, pid=50, nbytes=4096, file="/job/run.sh", comm="bash")]
    t0 = 100_000
    for step in range(36):
        t = t0 + step * 44_000
        for g in range(gpus):
            for k in range(4):
                start = t + g * 150 + k * 40
                rows.append(
                    fread(start, start + 900 + 60 * gpus, pid=100 + g, file=f"/data/{step}_{g}_{k}", comm="python")
                )
                jitter = 37 * ((step * 7 + k * 3 + g) % 11)  # latencies spread, as a disk's
                rows.append(
                    block(start + 10, start + 880 + 60 * gpus + jitter, qd=min(4 * g + k + 1, 60), nbytes=1 << 20)
                )
    meta = {
        "start_ns": 1,
        "end_ns": 2_000_000_000,
        "hostname": "gpu-node-3",
        "kernel_release": "6.1.0-28-amd64",
        "clock_offset_ns": 1_763_900_000_000_000_000,
        "target": {"command": ["torchrun", f"--nproc-per-node={gpus}", "train.py"]},
        "devices": [
            {
                "dev": "7:0",
                "name": "loop0",
                "size_bytes": 1 << 30,
                "mounts": [{"mount_point": "/data", "fstype": "ext4"}],
            }
        ],
    }
    write_trace(path, rows, meta)
    return path


def _sweep(path: Path) -> Path:
    """A trainio sweep --json file (docs/replay.md, Sweep): 12 GPUs supported."""
    curve = [
        {"gpus": g, "au_percent": au, "au_min_percent": au - 1, "pass": au >= 90}
        for g, au in ((1, 99.9), (2, 99.8), (4, 99.5), (8, 97.0), (16, 71.0), (12, 91.0), (14, 84.0), (13, 89.0))
    ]
    path.write_text(
        json.dumps(
            {
                "workload": "unet3d",
                "threshold_percent": 90.0,
                "supported_gpus": 12,
                "limited_by_max_gpus": False,
                "accelerator": "b200",
                "per_gpu_need_mib_s": 6041.14,
                "curve": curve,
                "runs": [],
            }
        )
    )
    return path


def _plot_sections(dom: str, ids: list[str]) -> dict[str, str]:
    """The rendered DOM of each plot div, cut at the next plot's id."""
    starts = {div_id: dom.index(f'id="{div_id}"') for div_id in ids}
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
        for y0, y1 in re.findall(r'<g class="point"><path d="M[-\d.e]+,([-\d.e]+)V([-\d.e]+)H', section)
    ]


def _axis_titles(section: str) -> set[str]:
    return {html.unescape(t) for t in re.findall(r'class="[xy]\d*title"[^>]*>([^<]*)<', section)}


def _png_rows(path: Path) -> tuple[int, int, int]:
    """Width, height and the number of distinct pixel rows of a PNG (8-bit RGB/RGBA,
    as Chromium writes): a blank page has one."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height, depth, color = struct.unpack(">IIBB", data[16:26])
    assert depth == 8 and color in (2, 6), (depth, color)
    bpp = 3 if color == 2 else 4
    pos, idat = 8, b""
    while pos < len(data):
        n = struct.unpack(">I", data[pos : pos + 4])[0]
        if data[pos + 4 : pos + 8] == b"IDAT":
            idat += data[pos + 8 : pos + 8 + n]
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = width * bpp
    seen, prev = set(), bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        if f == 2:  # the filters Chromium uses most: undo them to compare real pixels
            line = bytearray((x + p) & 255 for x, p in zip(line, prev, strict=True))
        elif f != 0:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b = prev[i]
                c = prev[i - bpp] if i >= bpp else 0
                if f == 1:
                    line[i] = (line[i] + a) & 255
                elif f == 3:
                    line[i] = (line[i] + (a + b) // 2) & 255
                else:
                    pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                    line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        seen.add(bytes(line))
        prev = line
    return width, height, len(seen)


@pytest.mark.slow
def test_sizing_report_of_1_and_15_gpus_renders_in_headless_chromium(tmp_path: Path) -> None:
    assert Path(CHROMIUM).exists(), "Debian's chromium is needed (scripts/install-deps.sh)"
    one, fifteen = _sized_job(tmp_path / "gpus-1", 1), _sized_job(tmp_path / "gpus-15", 15)
    out = tmp_path / "report.html"
    res = run_cli("report", str(one), str(fifteen), "-o", str(out), "--sweep", str(_sweep(tmp_path / "sweep.json")))
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    # self-contained: no script, stylesheet, frame, image or style resource from anywhere
    assert not re.search(r"<script[^>]*\ssrc=|<link\b|<iframe|<img\b", text, re.I)
    assert not re.search(r"@import|url\(\s*['\"]?(https?:)?//", text, re.I)
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
    # nor did the scripts add one while drawing
    assert not re.search(r"<script[^>]*\ssrc=|<link\b|<iframe|<img\b", dom, re.I)
    assert not re.search(r"url\(\s*['\"]?(https?:)?//", dom, re.I)
    sections = _plot_sections(dom, ["sweep", *PLOT_IDS])
    want_titles = {
        "sweep": {"simulated GPUs", "AU (%)"},
        "timeline": {"time since trace start (s)", "MiB/s", "queue depth"},
        "qd-issue": {"queue depth k", "requests"},
        "qd-time": {"queue depth k", "fraction of wall time"},
        "qd-time-busy": {"queue depth k", "fraction of busy time"},
        "sizes": {"request size ≥", "requests"},
        "latency-cdf": {"latency (µs, log scale)", "fraction of requests ≤ x"},
        "gaps": {"idle gap ≥", "gaps"},
        "gpus": {"GPU (job model)", "MiB read"},
    }
    for div_id, section in sections.items():
        assert 'class="main-svg"' in section, f"{div_id}: no svg rendered"
        assert want_titles[div_id] <= _axis_titles(section), (div_id, _axis_titles(section))
        if div_id in ("timeline", "latency-cdf", "sweep"):
            lines = re.findall(r'class="js-line" d="(M[^"]*)"', section)
            assert sum(1 for d in lines if len(re.findall("[LHV]", d)) >= 5) >= 2, f"{div_id}: empty lines"
        else:
            kinds = re.findall(r'class="trace (bars|scatter)', section)
            assert len(kinds) == 2, f"{div_id}: {len(kinds)} traces, want one per trace"
            assert sum(h > 1 for h in _bar_heights(section)) >= 2, f"{div_id}: no visible bars"
    # per trace a throughput row and a queue-depth row, on one time axis (4 y axes, 1 x title)
    tl = sections["timeline"]
    for name in ("gpus-1", "gpus-15"):
        assert f"{name}: throughput per" in tl and f"{name}: queue depth" in tl
    assert len(re.findall(r'class="y\d*title"', tl)) == 4
    assert len(re.findall(r'class="x\d*title"', tl)) == 1
    # the all-time QD plot says how much of the time k = 0 took instead of drawing it
    assert re.search(r"k = 0, nothing in flight: gpus-1 \d+\.\d%, gpus-15 \d+\.\d%", sections["qd-time"])
    ticks = re.findall(r'class="xtick"><text[^>]*>([^<]*)<', sections["qd-time"])
    assert ticks and "0" not in ticks and "1" in ticks, ticks
    # per GPU: 1 and 15 GPUs, the launcher (bash) left out; p50/p99/p99.9 marks drawn
    assert ">GPU 14<" in sections["gpus"] and "bash" not in sections["gpus"]
    assert len(re.findall(r">p99\.9 ", sections["latency-cdf"])) == 2
    summary = dom[dom.index('id="summary"') : dom.index('id="sweep"')]
    assert "12 GPUs supported" in summary
    # the need of one accelerator (sweep's per_gpu_need_mib_s), and of the 12 supported
    assert "one simulated b200 needs 6041.1 MiB/s at 100% AU, 12 of them 72493.7 MiB/s" in summary
    for want in (
        "gpu-node-3",
        "6.1.0-28-amd64",
        "torchrun --nproc-per-node=15 train.py",
        "loop0 (7:0, 1 GiB) on /data (ext4)",
        "2025-11-23T12:13:20Z",
    ):
        assert want in summary, want
    assert re.search(r"GPUs found</td><td>1</td><td>15</td>", summary)
    assert re.search(r"bytes per step</td><td>4 MiB</td><td>4 MiB</td>", summary)
    assert re.search(r"left out</td><td>50 bash</td><td>50 bash</td>", summary)
    shot = tmp_path / "report.png"
    subprocess.run(
        [*base, "--window-size=1400,6400", f"--screenshot={shot}", out.as_uri()],
        capture_output=True,
        timeout=180,
        check=True,
    )
    width, height, distinct = _png_rows(shot)
    assert (width, height) == (1400, 6400)
    assert distinct > 1000, f"the screenshot is (nearly) blank: {distinct} distinct rows"
    keep = Path(__file__).resolve().parents[2] / "results" / "test-report.png"
    keep.parent.mkdir(exist_ok=True)
    shutil.copy(shot, keep)  # for a person to look at


@pytest.mark.root
@pytest.mark.slow
def test_report_of_recorded_1_and_15_gpu_trainings(tmp_path: Path) -> None:
    """The same emulated training recorded with `trainio record` at 1 and at 15 GPUs (one
    MPI rank per GPU, psync reads on ext4 over a loop device), reported side by side: the
    job model finds 1 and 15 GPUs with the same bytes per step, mpirun is left out of the
    per-GPU view, and every plot is drawn with its axis titles."""
    import os

    from trainio_testlib import FIDELITY_WORKLOAD, MPI_ROOT_ENV, TRAINIO, mounted_loop_fs, run

    require_root("loop device, BPF")
    wl = tmp_path / "wl.yaml"
    wl.write_text(FIDELITY_WORKLOAD.format(record=256 << 10, batch=2, threads=2, compute=0.02))
    env = {**os.environ, **MPI_ROOT_ENV}
    steps = 6
    traces = []
    with mounted_loop_fs(15 * steps * 2 // 4 + 128) as (dev, _mm, mnt):
        data = mnt / "data"
        p = run([str(TRAINIO), "datagen", "-q", "--workload", str(wl), "--data-dir", str(data), "--gpus", "15",
                 "--steps", str(steps)], timeout=300, env=env)  # fmt: skip
        assert p.returncode == 0, p.stderr
        for gpus in (1, 15):
            t = tmp_path / f"gpus-{gpus}"
            p = run(
                [str(TRAINIO), "record", "-q", "-o", str(t), "--dev", dev, "--",
                 "mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(gpus),
                 str(TRAINIO), "replay", "-q", "--workload", str(wl), "--data-dir", str(data), "--gpus", str(gpus),
                 "--steps", str(steps), "--odirect", "--io-engine", "psync"],
                timeout=600,
                env=env,
            )  # fmt: skip
            assert p.returncode == 0, p.stderr[-3000:]
            traces.append(t)
    out = tmp_path / "report.html"
    res = run_cli("report", *map(str, traces), "--layer", "file", "-o", str(out))
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    assert not re.search(r"<script[^>]*\ssrc=|<link\b|<iframe|<img\b", text, re.I)
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=15000"]  # fmt: skip
    dom = subprocess.run(
        [*base, "--dump-dom", out.as_uri()], capture_output=True, text=True, timeout=180, check=True
    ).stdout
    sections = _plot_sections(dom, list(PLOT_IDS))
    for div_id, section in sections.items():
        assert 'class="main-svg"' in section, f"{div_id}: no svg rendered"
        assert _axis_titles(section), f"{div_id}: no axis titles"
    summary = dom[dom.index('id="summary"') : dom.index(f'id="{PLOT_IDS[0]}"')]
    assert re.search(r"GPUs found</td><td>1</td><td>15</td>", summary), summary
    # A batch of 2 x 256 KiB per step at both counts: the model's steps are bursts of the
    # reader threads' reads, and a burst of several whole batches read ahead is split.
    per_step = re.search(r"bytes per step</td><td>([\d.]+) KiB</td><td>([\d.]+) KiB</td>", summary)
    assert per_step and all(float(v) == 512 for v in per_step.groups()), summary
    assert ">GPU 14<" in sections["gpus"] and "mpirun" not in sections["gpus"]
    shot = tmp_path / "recorded.png"
    subprocess.run([*base, "--window-size=1400,6400", f"--screenshot={shot}", out.as_uri()],
                   capture_output=True, timeout=180, check=True)  # fmt: skip
    assert _png_rows(shot)[2] > 1000, "the screenshot is (nearly) blank"


def test_bad_sweep_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    a = _sized_job(tmp_path / "gpus-1", 1)
    out = tmp_path / "r.html"
    bad = tmp_path / "sweep.json"
    for content in ("{not json", json.dumps({"curve": []}), json.dumps({"supported_gpus": 3})):
        bad.write_text(content)
        res = run_cli("report", str(a), "-o", str(out), "--sweep", str(bad))
        assert res.returncode == 2, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and str(bad) in res.stderr
        assert not out.exists() and not list(tmp_path.glob(".*.tmp"))
    res = run_cli("report", str(a), "-o", str(out), "--sweep", str(tmp_path / "absent.json"))
    assert res.returncode == 2 and "absent.json" in res.stderr and not out.exists()
