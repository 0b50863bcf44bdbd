"""`make demo` (scripts/demo.sh) as README's first command runs it: on a loop device throttled
to stand for a 200 MiB/s drive, its sweep must find what the bandwidth says. One GPU of the
demo workload needs 4 × 1 MiB per 0.05 s step = 80 MiB/s, so the drive feeds 2 GPUs
(160 MiB/s) and AU falls below 90% at 3 (240 MiB/s wanted, at most 200 / 240 = 83% plus
the few batches prefetched before the first step, which AU leaves out)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainio_testlib import ROOT, require_root

DEMO = ROOT / "scripts" / "demo.sh"

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _leftovers(pid: int) -> list[str]:
    """What the demo of shell `pid` creates outside its output: cgroup, backing file, loop."""
    names = [f"/sys/fs/cgroup/{sub}/trainio-demo-{pid}" for sub in ("blkio", "unified", ".")]
    names.append(f"/dev/shm/trainio-demo-{pid}.img")
    left = [n for n in names if os.path.exists(n)]
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    left += [line for line in loops.splitlines() if f"trainio-demo-{pid}.img" in line]
    return left


def test_demo_names_the_gpu_count_where_au_falls_below_90(tmp_path: Path) -> None:
    require_root("loop device, cgroup, BPF")
    out = tmp_path / "demo"
    p = subprocess.Popen(
        [str(DEMO)],
        env={**os.environ, "TRAINIO_DEMO_OUT": str(out)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        log, _ = p.communicate(timeout=300)
    finally:
        p.kill()
        p.wait()
    assert p.returncode == 0, log[-3000:]
    assert _leftovers(p.pid) == []

    original = json.loads((out / "original-replay.json").read_text())
    assert (original["gpus"], original["steps"]) == (2, 40), "tens of steps, recorded"
    assert original["au_percent"] >= 90, original["au_percent"]
    # The job model of that recording: its steps are the 40 batches (the loader's read-ahead
    # at each epoch's start is split into its batches), and one GPU needs 4 MiB per 50 ms
    # (4 npz files of 1 MiB and numpy's 256 bytes of headers each).
    model = json.loads((out / "original-file-analysis.json").read_text())["job_model"]
    assert [len(g["steps"]) for g in model["gpus"]] == [40, 40], model["warnings"]
    for g in model["gpus"]:
        assert g["bytes_per_step"] == 4 * ((1 << 20) + 256), g
        assert g["required_mib_s"] == pytest.approx(80, rel=0.05), g
    sweep = json.loads((out / "sweep.json").read_text())
    curve = {pt["gpus"]: pt for pt in sweep["curve"]}
    assert sweep["supported_gpus"] == 2 and not sweep["limited_by_max_gpus"], curve
    assert not curve[3]["pass"] and curve[3]["au_percent"] < 90, curve[3]
    # The drive is the limit: 4 GPUs want 320 MiB/s and get the throttle's 200.
    assert curve[4]["throughput_mib_s"] == pytest.approx(200, rel=0.10), curve[4]
    summary = log[log.index("== summary") :]
    assert "AU falls below 90% at 3 GPUs: the 200 MiB/s drive keeps 2 GPU(s) >= 90% busy" in summary, summary
    assert (out / "report.html").stat().st_size > 0
    report = (out / "report.html").read_text()
    assert "GPUs supported" in report, "the report carries the sweep's answer"
    # The replay's recording carries the replay's results, and the report shows the
    # replay by them (its GPUs and AU), not by a job model of the replay's own I/O.
    (replay_json,) = out.glob("replay-*.json")
    replay = json.loads(replay_json.read_text())
    recorded = out / replay_json.stem / "replay.json"
    assert json.loads(recorded.read_text()) == replay
    assert f"{replay['gpus']} simulated (the replay&#x27;s results)" in report
    assert f"{replay['au_percent']:.2f} % (min {replay['au_min_percent']:.2f} %)" in report


def test_demo_refuses_a_bad_drive_bandwidth(tmp_path: Path) -> None:
    require_root("loop device, cgroup, BPF")
    out = tmp_path / "demo"
    r = subprocess.run(
        [str(DEMO)],
        env={**os.environ, "TRAINIO_DEMO_OUT": str(out), "TRAINIO_DEMO_DRIVE_MIBS": "fast"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "TRAINIO_DEMO_DRIVE_MIBS=fast" in r.stderr, r.stderr
    assert not out.exists()
