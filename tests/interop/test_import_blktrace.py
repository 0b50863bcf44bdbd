"""`trainio import --blktrace`: the kernel's blktrace records the same fio job as
`trainio record`; the imported block layer has the same requests and queue depths.

blktrace(8) reads the kernel's per-CPU relay files in debugfs, which a kernel in
lockdown refuses ("Lockdown: blktrace: debugfs access is restricted"). The same
kernel events (kernel/trace/blktrace.c) are also written through tracefs by the blk
tracer, which the `blk_classic` option prints in blkparse's format: that is what this
test records, so it runs under lockdown too. docs/interop.md gives both recipes.
"""

from __future__ import annotations

import collections
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from interop_helpers import block_requests, fio_job, ok

from trainio_analysis.trace import read_metadata, scan_trace
from trainio_testlib import loop_device, majmin, require_root

TRACEFS = Path("/sys/kernel/tracing")


@contextlib.contextmanager
def kernel_blktrace(dev: str, out: Path) -> Iterator[None]:
    """Record the kernel's blktrace events of ``dev`` (blk tracer, blkparse format) into
    ``out``; the tracer, its option and the device's switch are put back afterwards."""
    if not (TRACEFS / "current_tracer").exists():
        pytest.fail(f"{TRACEFS} is not mounted: the blk tracer needs tracefs")
    enable = Path("/sys/block") / Path(dev).name / "trace" / "enable"
    saved = {f: (TRACEFS / f).read_text().strip() for f in ("current_tracer", "tracing_on")}
    if "blk" not in (TRACEFS / "available_tracers").read_text().split():
        pytest.fail("the kernel has no blk tracer (CONFIG_BLK_DEV_IO_TRACE)")
    try:
        (TRACEFS / "tracing_on").write_text("0")
        (TRACEFS / "current_tracer").write_text("blk")
        (TRACEFS / "trace_options").write_text("blk_classic")
        (TRACEFS / "trace").write_text("")
        enable.write_text("1")
        (TRACEFS / "tracing_on").write_text("1")
        yield
        (TRACEFS / "tracing_on").write_text("0")
        out.write_text((TRACEFS / "trace").read_text())
    finally:
        enable.write_text("0")
        (TRACEFS / "trace_options").write_text("noblk_classic")
        (TRACEFS / "current_tracer").write_text(saved["current_tracer"])
        (TRACEFS / "tracing_on").write_text(saved["tracing_on"])


@pytest.mark.root
@pytest.mark.slow
def test_imported_blktrace_has_trainios_requests_and_queue_depths(tmp_path: Path) -> None:
    require_root("loop devices, BPF, tracefs")
    with loop_device(256) as dev:
        with kernel_blktrace(dev, tmp_path / "blkparse.txt"):
            ok(
                "record",
                "-q",
                "--layers",
                "block",
                "--dev",
                dev,
                "-o",
                tmp_path / "recorded",
                "--",
                *fio_job(dev, "--iodepth=8"),
            )
        ok("import", "--blktrace", tmp_path / "blkparse.txt", "-o", tmp_path / "imported")
        mm = majmin(dev)
    meta = read_metadata(tmp_path / "imported")
    assert meta["source"]["format"] == "blktrace" and meta["layers"] == ["block"]
    assert meta["lost_events"] == {"blktrace:completion_unseen": 0, "blktrace:dispatch_unseen": 0}

    recorded, imported = block_requests(tmp_path / "recorded", mm), block_requests(tmp_path / "imported", mm)
    assert imported.height == recorded.height == 640
    # the same requests: op, device offset, size
    assert collections.Counter(
        zip(imported["op"], imported["offset"], imported["bytes"], strict=True)
    ) == collections.Counter(zip(recorded["op"], recorded["offset"], recorded["bytes"], strict=True))
    # and in the same order of issue
    assert imported["offset"].to_list() == recorded["offset"].to_list()

    scores = json.loads(
        ok("compare", tmp_path / "recorded", tmp_path / "imported", "--layer", "block", "--dev", mm, "--json")
    )
    print(
        f"\nblktrace import: {imported.height} requests; QD W1 per issue {scores['qd_w1_issue']:.3f}, "
        f"time-weighted {scores['qd_w1_time']:.3f}, busy-time {scores['qd_w1_time_busy']:.3f}; "
        f"QD per issue max {int(recorded['queue_depth'].max())} / {int(imported['queue_depth'].max())}"
    )
    assert scores["qd_w1_issue"] <= 0.5
    assert scores["qd_w1_time_busy"] <= 0.5
    assert int(imported["queue_depth"].max()) > 1  # the job kept several in flight


def test_blkparse_lines_with_and_without_sequence_numbers(tmp_path: Path) -> None:
    """blkparse's default output and the blk tracer's blk_classic output are both read;
    a flush, a request inserted into the scheduler, a requeued one, and blkparse's summary."""
    text = """\
  8,0    1        1     0.000001000  4242  I  WS 2048 + 16 [job]
  8,0    1        2     0.000002000  4242  D  WS 2048 + 16 [job]
  8,0    0        3     0.000003000  4242  D   R 100 + 8 [job]
  8,0    0        4     0.000010000     0  C   R 100 + 8 [0]
  8,0    1        5     0.000012000     0  C  WS 2048 + 16 [0]
  8,0    1        6     0.000020000   77  D  FN [kworker/1:1H]
  8,0    1        7     0.000030000     0  C  FN [0]
  8,0    0        8     0.000040000  4242  D   R 500 + 8 [job]
  8,0    0        9     0.000041000  4242  R   R 500 + 8 [0]
  8,0    0       10     0.000050000  4242  D   R 500 + 8 [job]
  8,0    0       11     0.000060000     0  C   R 500 + 8 [0]
CPU0 (8,0):
 Reads Queued:           0,        0KiB\t Writes Queued:           1,        8KiB
Total (8,0):
"""
    (tmp_path / "a.txt").write_text(text)
    classic = "\n".join(" ".join(f for i, f in enumerate(line.split()) if i != 2) for line in text.splitlines()[:11])
    (tmp_path / "b.txt").write_text("# tracer: blk\n#\n" + classic + "\n")
    for name in ("a", "b"):
        ok("import", "--blktrace", tmp_path / f"{name}.txt", "-o", tmp_path / name)
        df = scan_trace(tmp_path / name).sort("issue_ns").collect()
        assert df["op"].to_list() == ["write", "read", "flush", "read"]
        assert df["offset"].to_list() == [2048 * 512, 100 * 512, None, 500 * 512]
        assert df["bytes"].to_list() == [16 * 512, 8 * 512, 0, 8 * 512]
        assert df["issue_ns"].to_list() == [2000, 3000, 20000, 50000]
        assert df["complete_ns"].to_list() == [12000, 10000, 30000, 60000]
        assert df["insert_ns"].to_list() == [1000, None, None, None]
        # the read is issued while the write is in flight
        assert df["queue_depth"].to_list() == [1, 2, 1, 1]
        assert df["comm"].to_list() == ["job", "job", "kworker/1:1H", "job"]
        assert read_metadata(tmp_path / name)["lost_events"] == {
            "blktrace:completion_unseen": 0,
            "blktrace:dispatch_unseen": 0,
        }
        assert df.filter(pl.col("op") == "flush")["pid"].to_list() == [77]
