"""The analyzer on traces the real recorder takes of real fio runs on a loop device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainio_testlib import trainio

pytestmark = [pytest.mark.root, pytest.mark.slow]


def fio(dev: str, iodepth: int, io_size: str) -> list[str]:
    return [
        "fio",
        "--name=a",
        f"--filename={dev}",
        "--direct=1",
        "--rw=randread",
        "--bs=4k",
        "--ioengine=io_uring",
        f"--iodepth={iodepth}",
        f"--io_size={io_size}",
        "--size=128M",
        "--norandommap",
        "--output=/dev/null",
    ]


def analyze(trace: Path) -> dict:
    res = trainio("analyze", trace, "--layer", "block", "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def time_in_queue_ms(dev: str) -> int:
    """Weighted time in queue (ms) from /sys/block/DEV/stat: what iostat's aqu-sz is made of."""
    return int(Path(f"/sys/block/{Path(dev).name}/stat").read_text().split()[10])


def test_iodepth_1_is_all_qd_1(tmp_path: Path, loop_dev: str) -> None:
    res = trainio("record", "-o", tmp_path / "t", "--layers", "block", "--dev", loop_dev, "--", *fio(loop_dev, 1, "8M"))
    assert res.returncode == 0, res.stderr
    a = analyze(tmp_path / "t")
    # The kernel now and then delivers no block_rq_complete to BPF for a request (bpftrace's
    # classic tracepoint misses the same ones; issue #35 item 1): the trace counts each as
    # `block_rq_complete:unseen` and has no row for it. Every request is a row or counted.
    unseen = a["lost_events"]["by_probe"].get("block_rq_complete:unseen", 0)
    assert a["events"] + unseen == 2048, (a["events"], a["lost_events"])
    assert unseen <= 3, a["lost_events"]  # 0-3 in 6 recordings (issue #35)
    assert {int(k): v for k, v in a["qd_hist_issue_computed"].items()} == {1: 1.0}
    # A missed completion does not stay in the kernel-side in-flight count: the disk's own
    # count bounds it (bpf/block.bpf.c, depth_at_issue), but for the request issued as the
    # completion wakes fio, before it leaves the disk's count.
    assert 1 - a["qd_hist_issue"].get("1", 0) <= unseen / a["events"] + 1e-9, (a["qd_hist_issue"], unseen)


def test_16_outstanding_time_weighted_qd_matches_iostat(tmp_path: Path, loop_dev: str) -> None:
    """16 requests outstanding, as 16 synchronous readers rather than iodepth=16 in one job:
    iostat's counter runs from request allocation, and an asynchronous submitter holds a
    batch in its plug before issue (4-7% of the time here, measured with io_uring and
    libaio), which the trace's issue-to-complete queue depth rightly does not count."""
    before = time_in_queue_ms(loop_dev)
    res = trainio(
        "record",
        "-o",
        tmp_path / "t",
        "--layers",
        "block",
        "--dev",
        loop_dev,
        "--",
        "fio",
        "--name=a",
        f"--filename={loop_dev}",
        "--direct=1",
        "--rw=randread",
        "--bs=4k",
        "--ioengine=psync",
        "--numjobs=16",
        "--io_size=16M",
        "--size=128M",
        "--norandommap",
        "--group_reporting",
        "--output=/dev/null",
    )
    after = time_in_queue_ms(loop_dev)
    assert res.returncode == 0, res.stderr
    a = analyze(tmp_path / "t")
    assert a["qd_max"] <= 16
    # iostat: aqu-sz = d(time_in_queue) / d(wall). Over the same window (the trace's span)
    # the analyzer's mean time-weighted QD must agree within 10%.
    window_ms = a["duration_s"] * 1000
    iostat_aqu = (after - before) / window_ms
    assert iostat_aqu > 1, "fio kept requests queued"
    print(f"aqu-sz: analyzer {a['qd_mean_time']:.3f}, iostat counters {iostat_aqu:.3f}")
    assert a["qd_mean_time"] == pytest.approx(iostat_aqu, rel=0.10), (a["qd_mean_time"], iostat_aqu)
