"""analyze --json: the timeline's bins (automatic and --bin-s), mean queue depth per bin,
the latency CDF and the recording's summary, on traces whose answers are known by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest
from analysis_helpers import block, run_cli

from trainio_analysis.analyze import analyze
from trainio_analysis.trace import write_trace


def test_mean_queue_depth_per_bin_is_the_overlap_of_requests_with_the_bin(trace_dir) -> None:
    # bins of 1 ms: two requests in flight over [0.5, 2.5) ms and [1, 1.2) ms (QD 1 then 2),
    # one over [3.9, 4.1) ms across a bin edge
    t0 = 1_000_000  # us: the recording starts at 1 s
    rows = [
        block(t0 + 500, t0 + 2500, qd=1),
        block(t0 + 1000, t0 + 1200, qd=2),
        block(t0 + 3900, t0 + 4100, qd=1),
    ]
    write_trace(trace_dir, rows, {"start_ns": t0 * 1000, "end_ns": t0 * 1000 + 5_000_000})
    r = analyze(trace_dir, bin_s=0.001)
    tl = r["throughput_mib_s"]["timeline"]
    assert tl["t_s"][:6] == [0.0, 0.001, 0.002, 0.003, 0.004, 0.005]
    # bin 0: 0.5 ms of one request; bin 1: 1 ms + 0.2 ms; bin 2: 0.5 ms; bin 3: 0.1; bin 4: 0.1
    assert tl["qd_mean"] == pytest.approx([0.5, 1.2, 0.5, 0.1, 0.1, 0.0])
    # over the window, the bins' mean is the time-weighted mean (iostat aqu-sz)
    assert sum(tl["qd_mean"]) * 0.001 / r["duration_s"] == pytest.approx(r["qd_mean_time"])
    assert r["throughput_mib_s"]["bin_auto"] is False


def test_automatic_bin_fits_the_active_span_not_the_window(trace_dir) -> None:
    # 36 bursts 44 ms apart over ~1.6 s of activity, inside a 10 s recording
    rows = []
    for b in range(36):
        t = 2_000_000 + b * 44_000
        rows += [block(t + k * 100, t + k * 100 + 900, qd=k + 1, nbytes=1 << 17) for k in range(8)]
    write_trace(trace_dir, rows, {"start_ns": 1, "end_ns": 10_000_000_000})
    r = analyze(trace_dir)
    tp = r["throughput_mib_s"]
    assert tp["bin_auto"] is True
    assert tp["bin_s"] * 1e9 == pytest.approx(round(tp["bin_s"] * 1e9))
    over_active = r["active_s"] / tp["bin_s"]
    assert 100 <= over_active <= 300, (tp["bin_s"], over_active)
    # a bin is a 1/2/5 x 10^k: here 10 ms would leave 154 bins, 5 ms 308
    assert tp["bin_s"] == pytest.approx(0.01)
    tl = tp["timeline"]
    assert len(tl["t_s"]) == len(tl["read"]) == len(tl["qd_mean"]) == 1000
    # no byte lost or doubled by summing the fine bins
    assert sum(tl["read"]) * tp["bin_s"] == pytest.approx(36 * 8 * (1 << 17) / 2**20)
    assert sum(tl["qd_mean"]) * tp["bin_s"] / r["duration_s"] == pytest.approx(r["qd_mean_time"])
    # the bursts 44 ms apart are apart in the timeline: 36 runs of busy bins (a burst of
    # 1.6 ms may straddle two), separated by idle ones
    busy = np.array(tl["qd_mean"]) > 0
    runs = np.flatnonzero(busy[1:] & ~busy[:-1])
    assert runs.size + int(busy[0]) == 36


def test_latency_cdf_and_recording(trace_dir) -> None:
    rows = [block(k * 1000, k * 1000 + 10 * (k + 1), qd=1) for k in range(100)]
    meta = {
        "start_ns": 0,
        "end_ns": 1_000_000_000,
        "hostname": "node7",
        "kernel_release": "6.1.0-test",
        "clock_offset_ns": 1_700_000_000_000_000_000,
        "target": {"command": ["python", "train.py", "--gpus", "8"]},
        "devices": [
            {
                "dev": "259:0",
                "name": "nvme0n1",
                "size_bytes": 1 << 40,
                "mounts": [{"mount_point": "/data", "fstype": "xfs"}],
            },
            {"dev": "0:21", "name": "proc", "mounts": [{"mount_point": "/proc", "fstype": "proc"}]},
        ],
    }
    write_trace(trace_dir, rows, meta)
    res = run_cli("analyze", str(trace_dir), "--json")
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    cdf = r["latency_cdf_us"]
    assert len(cdf["p"]) == len(cdf["us"]) and cdf["p"][0] == 0 and cdf["p"][-1] > 0.9998
    assert cdf["us"] == sorted(cdf["us"])
    assert cdf["us"][0] == pytest.approx(10) and cdf["us"][-1] == pytest.approx(1000)
    assert cdf["us"][cdf["p"].index(0.5)] == pytest.approx(r["latency_us"]["p50"])
    rec = r["recording"]
    assert rec["host"] == "node7" and rec["kernel"] == "6.1.0-test"
    assert rec["command"] == "python train.py --gpus 8"
    assert rec["started_utc"] == "2023-11-14T22:13:20Z"
    assert rec["duration_s"] == pytest.approx(1.0)
    assert [d["name"] for d in rec["devices"]] == ["nvme0n1"]
    assert rec["devices"][0]["mounts"] == ["/data (xfs)"]


def test_bad_bin_is_refused(trace_dir) -> None:
    write_trace(trace_dir, [block(0, 10, qd=1)])
    for bad in ("0", "-1", "nan"):
        res = run_cli("analyze", str(trace_dir), "--bin-s", bad)
        assert res.returncode == 2 and "--bin-s" in res.stderr, (bad, res.stderr)
