"""Physics checks on a device with a known bandwidth: a loop device throttled to 50 MiB/s
by a cgroup (v2 io.max, or v1 blkio where v1 has it), read with O_DIRECT. The accelerator model must land where
the bandwidth says: AU ≈ compute / (bytes per step / bandwidth)."""

from __future__ import annotations

import pytest
from replay_helpers import in_cgroup, load_json, run_trainio, write_workload

MIB = 1 << 20
BPS = 50 * MIB

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_throttled_device_au_and_throughput_match_the_bandwidth(tmp_path, loop_fs, throttle):
    _dev, majmin, mnt = loop_fs
    # 4 MiB per step (batch 4 × 1 MiB), 0.05 s compute, 50 MiB/s: a step needs 0.08 s of I/O.
    wl = write_workload(tmp_path / "wl.yaml", files=240, record=MIB, batch=4, threads=4, compute=0.05)
    run_trainio("datagen", "--workload", wl, "--data-dir", mnt / "data")
    th = throttle(majmin, BPS)
    out = tmp_path / "r.json"
    run_trainio(
        "replay",
        "--workload",
        wl,
        "--data-dir",
        mnt / "data",
        "--odirect",
        "--json",
        out,
        prefix=in_cgroup(th.path),
        timeout=120,
    )
    r = load_json(out)
    predicted_au = 100 * 0.05 / (4 * MIB / BPS)  # 62.5 %
    assert r["steps"] == 60
    assert abs(r["au_percent"] - predicted_au) <= 5.0, (r["au_percent"], predicted_au)
    assert r["throughput_mib_s"] == pytest.approx(50.0, rel=0.10)
    assert r["pass"] is False  # 62.5 % < 90 %
    assert r["max_outstanding_reads_per_gpu"] == 4  # read_threads, the queue depth a job makes


def test_sweep_finds_what_the_bandwidth_supports(tmp_path, loop_fs, throttle):
    """Each GPU needs 1 MiB per 0.1 s = 10 MiB/s at 100 % AU. N GPUs on 50 MiB/s read
    20 MiB each in 0.4·N s while computing 19 × 0.1 s after the first step, so
    AU ≈ 1.9 / (0.4·N − first step): 7 GPUs ≈ 71-76 %, 8 GPUs ≈ 62-66 %; threshold 70 %."""
    _dev, majmin, mnt = loop_fs
    wl = write_workload(tmp_path / "wl.yaml", files=8, record=MIB, batch=1, threads=2, compute=0.1, au=0.70)
    th = throttle(majmin, BPS)
    curve = tmp_path / "curve.json"
    p = run_trainio(
        "sweep",
        "--workload",
        wl,
        "--data-dir",
        mnt / "data",
        "--generate",
        "--odirect",
        "--steps",
        20,
        "--max-gpus",
        16,
        "--json",
        curve,
        prefix=in_cgroup(th.path),
        timeout=600,
    )
    s = load_json(curve)
    assert s["supported_gpus"] == 7, p.stdout
    gpus = [pt["gpus"] for pt in s["curve"]]
    assert gpus == [1, 2, 4, 6, 7, 8]  # doubling to the first fail, then bisection
    tput = {pt["gpus"]: pt["throughput_mib_s"] for pt in s["curve"]}
    assert tput[8] == pytest.approx(50.0, rel=0.10)
    assert all(pt["pass"] == (pt["gpus"] <= s["supported_gpus"]) for pt in s["curve"])
    assert "supported simulated GPUs" in p.stdout
