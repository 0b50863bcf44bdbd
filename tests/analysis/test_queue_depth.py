"""Queue depth: exact values on hand-built traces, and a property test against a naive sweep."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from analysis_helpers import US, block, fread
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from qd_reference import naive_qd

from trainio_analysis.analyze import analyze
from trainio_analysis.analyze.qd_sweep import QueueDepthSweep
from trainio_analysis.errors import SelectionError
from trainio_analysis.trace import write_trace


def test_two_requests_overlapping_half_their_time(trace_dir: Path) -> None:
    # A [0, 20) us and B [10, 30) us: each overlaps the other for half its life
    write_trace(trace_dir, [block(0, 20, qd=1), block(10, 30, qd=2)])
    r = analyze(trace_dir)
    assert r["qd_hist_issue"] == {"1": 0.5, "2": 0.5}
    assert r["qd_hist_issue_computed"] == {"1": 0.5, "2": 0.5}
    # by hand: [0,10) 1, [10,20) 2, [20,30) 1 of a 30 us window
    assert r["qd_hist_time"] == pytest.approx({"1": 2 / 3, "2": 1 / 3})
    assert r["qd_mean_time"] == pytest.approx(4 / 3)
    assert r["utilization"] == pytest.approx(1.0)
    assert r["idle_fraction"] == 0.0
    assert r["qd_issue_agreement"]["w1"] == 0.0
    assert r["qd_max"] == 2


def test_time_weighted_with_idle_and_nesting(trace_dir: Path) -> None:
    # A [0,40) holds B [10,20) inside it; C [60,100) alone after 20 us idle
    write_trace(trace_dir, [block(10, 20, qd=2), block(0, 40, qd=1), block(60, 100, qd=1)])
    r = analyze(trace_dir)
    assert r["qd_hist_issue_computed"] == pytest.approx({"1": 2 / 3, "2": 1 / 3})
    # [0,10) 1, [10,20) 2, [20,40) 1, [40,60) 0, [60,100) 1 -> 0: 20, 1: 70, 2: 10 of 100
    assert r["qd_hist_time"] == pytest.approx({"0": 0.2, "1": 0.7, "2": 0.1})
    assert r["qd_hist_time_busy"] == pytest.approx({"1": 7 / 8, "2": 1 / 8})
    assert r["qd_mean_time"] == pytest.approx(0.9)  # aqu-sz: 90 request-us / 100 us
    assert r["qd_mean_time_busy"] == pytest.approx(1.125)
    assert r["utilization"] == pytest.approx(0.8)
    assert r["idle_fraction"] == pytest.approx(0.2)


def test_back_to_back_requests_are_queue_depth_one(trace_dir: Path) -> None:
    # the second is issued in the very nanosecond the first completes
    write_trace(trace_dir, [block(0, 10, qd=1), block(10, 20, qd=1), block(20, 30, qd=1)])
    r = analyze(trace_dir)
    assert r["qd_hist_issue_computed"] == {"1": 1.0}
    assert r["qd_hist_time"] == {"1": 1.0}


def test_zero_latency_request_counts_itself(trace_dir: Path) -> None:
    write_trace(trace_dir, [block(0, 0, qd=1), block(5, 10, qd=1), block(7, 7, qd=2)])
    r = analyze(trace_dir)
    assert r["qd_hist_issue_computed"] == pytest.approx({"1": 2 / 3, "2": 1 / 3})


def test_devices_are_separate_queues(trace_dir: Path) -> None:
    # the same intervals on two disks: per device QD 1, never 2
    rows = [block(0, 20, qd=1, dev="8:0"), block(10, 30, qd=1, dev="8:16")]
    write_trace(trace_dir, rows)
    r = analyze(trace_dir)
    assert r["qd_hist_issue_computed"] == {"1": 1.0}
    assert set(r["groups"]) == {"8:0", "8:16"}
    assert r["groups"]["8:0"]["qd_hist_time"] == pytest.approx({"0": 1 / 3, "1": 2 / 3})
    assert r["groups"]["8:16"]["qd_hist_time"] == pytest.approx({"0": 1 / 3, "1": 2 / 3})
    # pooled time-weighted: mean over the two devices
    assert r["qd_hist_time"] == pytest.approx({"0": 1 / 3, "1": 2 / 3})
    # idle: nothing in flight on either device never happens in [0, 30)
    assert r["idle_fraction"] == 0.0
    only = analyze(trace_dir, dev="8:16")
    assert only["events"] == 1 and set(only["groups"]) == {"8:16"}


def test_dev_selected_by_name_from_metadata(trace_dir: Path) -> None:
    rows = [
        block(0, 20, qd=1, dev="259:0"),
        block(0, 20, qd=1, dev="259:1"),
        block(5, 20, qd=2, dev="259:1"),
    ]
    write_trace(trace_dir, rows, {"devices": [{"dev": "259:1", "name": "nvme1n1"}]})
    r = analyze(trace_dir, dev="/dev/nvme1n1")
    assert r["events"] == 2 and r["qd_hist_issue_computed"] == {"1": 0.5, "2": 0.5}
    with pytest.raises(SelectionError, match="no device 'sda'"):
        analyze(trace_dir, dev="sda")


def test_kernel_and_computed_disagreement_is_reported(trace_dir: Path) -> None:
    # the kernel missed the request in flight at the start: it recorded 1 where 2 was true
    write_trace(trace_dir, [block(0, 20, qd=1), block(10, 30, qd=1)])
    r = analyze(trace_dir)
    assert r["qd_hist_issue"] == {"1": 1.0}
    assert r["qd_hist_issue_computed"] == {"1": 0.5, "2": 0.5}
    assert r["qd_issue_agreement"]["w1"] == pytest.approx(0.5)
    assert r["qd_issue_agreement"]["max_abs_diff"] == pytest.approx(0.5)


def test_file_layer_queue_depth_is_per_process_and_ignores_open(trace_dir: Path) -> None:
    rows = [
        fread(0, 20, pid=1),
        fread(10, 30, pid=1, qd=2),  # process 1 overlaps itself
        fread(0, 30, pid=2),  # process 2 overlaps process 1 but is its own queue
        {
            "layer": "file",
            "op": "open",
            "issue_ns": 5 * US,
            "complete_ns": 25 * US,
            "bytes": 0,
            "queue_depth": 0,
            "pid": 1,
            "file": "/data/f0",
        },
    ]
    write_trace(trace_dir, rows)
    r = analyze(trace_dir, layer="file")
    assert r["events"] == 4 and r["reads"] == 3
    assert r["qd_hist_issue"] == pytest.approx({"1": 2 / 3, "2": 1 / 3})
    assert r["qd_hist_issue_computed"] == r["qd_hist_issue"]
    assert r["groups"]["1"]["qd_hist_time"] == pytest.approx({"1": 2 / 3, "2": 1 / 3})
    assert r["groups"]["2"]["qd_hist_time"] == {"1": 1.0}


def test_sweep_carries_in_flight_requests_across_row_groups(trace_dir: Path) -> None:
    # one row per row group, rows in completion order: every boundary cuts a live request
    rows = sorted((block(i * 10, i * 10 + 25, qd=1) for i in range(20)), key=lambda r: r["complete_ns"])
    write_trace(trace_dir, rows, row_group_rows=1, rows_per_segment=3)
    r = analyze(trace_dir)
    hist, per_time = naive_qd([x["issue_ns"] for x in rows], [x["complete_ns"] for x in rows], (0, 215 * US))
    assert r["qd_hist_issue_computed"] == pytest.approx({str(k): v / 20 for k, v in hist.items()})
    assert r["qd_hist_time"] == pytest.approx({str(k): v / (215 * US) for k, v in per_time.items()})


# ------------------------------------------------------------------ property tests

requests = st.lists(
    st.tuples(st.integers(0, 60), st.integers(0, 25), st.sampled_from(["8:0", "8:16"])),
    min_size=1,
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(requests, st.integers(1, 6), st.randoms(use_true_random=False))
def test_streaming_sweep_equals_naive_reference(reqs, n_chunks, rnd) -> None:
    """Any chunking and row order, with the watermark the analyzer would compute."""
    reqs = list(reqs)
    rnd.shuffle(reqs)
    issue = np.array([r[0] for r in reqs], np.int64)
    complete = issue + np.array([r[1] for r in reqs], np.int64)
    end = int(complete.max()) + 3
    sweep = QueueDepthSweep(window_end=end, burst_gap=4)
    chunks = np.array_split(np.arange(len(reqs)), n_chunks)
    mins = [int(issue[c].min()) if c.size else None for c in chunks]
    for k, c in enumerate(chunks):
        later = [m for m in mins[k + 1 :] if m is not None]
        sweep.feed(np.zeros(c.size, np.int64), issue[c], complete[c], min(later) if later else None)
    state = sweep.finish()[0]
    want_issue, want_time = naive_qd(issue.tolist(), complete.tolist(), (0, end))
    got_issue = {k: int(v) for k, v in enumerate(state.hist_issue) if v}
    got_time = {k: int(v) for k, v in enumerate(state.hist_time) if v}
    assert got_issue == want_issue
    assert got_time == want_time


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests, st.integers(1, 8), st.randoms(use_true_random=False))
def test_analyze_histograms_equal_naive_reference(tmp_path_factory, reqs, group_rows, rnd) -> None:
    """End to end through the writer, Parquet row groups and statistics, per device."""
    reqs = list(reqs)
    rnd.shuffle(reqs)
    # distinct kernel depths: rows sharing issue_ns and queue_depth would be one request
    # completed in parts (SCHEMA.md), which these independent requests are not
    rows = [block(i, i + lat, qd=n + 1, dev=dev) for n, (i, lat, dev) in enumerate(reqs)]
    d = tmp_path_factory.mktemp("prop") / "t"
    write_trace(d, rows, row_group_rows=group_rows, rows_per_segment=2 * group_rows + 1)
    r = analyze(d)
    t0 = min(x["issue_ns"] for x in rows)
    t1 = max(x["complete_ns"] for x in rows)
    pooled: dict[int, int] = {}
    for dev, got in r["groups"].items():
        mine = [x for x in rows if x["dev"] == dev]
        want_issue, want_time = naive_qd([x["issue_ns"] for x in mine], [x["complete_ns"] for x in mine], (t0, t1))
        for k, v in want_issue.items():
            pooled[k] = pooled.get(k, 0) + v
        n = len(mine)
        assert got["qd_hist_issue_computed"] == pytest.approx({str(k): v / n for k, v in want_issue.items()})
        if t1 > t0:
            assert got["qd_hist_time"] == pytest.approx({str(k): v / (t1 - t0) for k, v in want_time.items()})
    assert r["qd_hist_issue_computed"] == pytest.approx({str(k): v / len(rows) for k, v in pooled.items()})
    # idle: nothing in flight on any device (the union of all requests)
    _, union_time = naive_qd([x["issue_ns"] for x in rows], [x["complete_ns"] for x in rows], (t0, t1))
    if t1 > t0:
        assert r["idle_fraction"] == pytest.approx(union_time.get(0, 0) / (t1 - t0))


def test_tail_exchange_reports_only_failures_a_chunk_depends_on() -> None:
    from trainio_analysis.analyze.qd_sweep import TailExchange

    ex = TailExchange([10, 20, 30, None])
    ex.publish(0, {0: np.array([4 * 12, 4 * 25], np.int64)})
    ex.fail(2)  # a later chunk failed: chunk 1 does not depend on it
    assert {g: [a.tolist() for a in v] for g, v in ex.take(1).items()} == {0: [[48]]}
    ex.publish(1, {})
    with pytest.raises(RuntimeError, match="chunk 2 failed"):
        ex.take(3)


def test_request_completed_in_parts_counts_once(trace_dir: Path) -> None:
    # SCHEMA.md: one row per partial completion, all with the request's issue_ns and
    # queue_depth. A [0, 40) completes 4 KiB at 20 and 4 KiB at 40; B [10, 30) overlaps it.
    rows = [block(0, 20, qd=1), block(10, 30, qd=2), block(0, 40, qd=1)]
    write_trace(trace_dir, rows)
    r = analyze(trace_dir)
    assert r["events"] == 3 and r["reads"] == 2
    assert r["qd_hist_issue"] == {"1": 0.5, "2": 0.5}
    assert r["qd_hist_issue_computed"] == {"1": 0.5, "2": 0.5}
    # [0,10) 1, [10,30) 2, [30,40) 1
    assert r["qd_hist_time"] == pytest.approx({"1": 0.5, "2": 0.5})
    assert r["size_counts"] == {"4096": 1, "8192": 1}
    assert r["latency_us"]["max"] == pytest.approx(40.0)
    # two different requests issued in the same nanosecond are not merged
    write_trace(trace_dir.parent / "same-ns", [block(0, 20, qd=1), block(0, 30, qd=2)])
    same = analyze(trace_dir.parent / "same-ns")
    assert same["reads"] == 2 and same["qd_hist_issue_computed"] == {"1": 0.5, "2": 0.5}


def test_row_groups_of_another_layer_pass_carried_requests_on(trace_dir: Path) -> None:
    # block requests overlap across row groups that hold only file rows
    blocks = [block(i * 10, i * 10 + 35, qd=i + 1) for i in range(6)]
    files = [fread(i * 10 + 3, i * 10 + 4, pid=9) for i in range(6)]
    rows = [r for pair in zip(blocks, files, strict=True) for r in pair]
    write_trace(trace_dir, rows, row_group_rows=1, rows_per_segment=4)
    r = analyze(trace_dir, layer="block")
    t0, t1 = 0, 85 * US
    want_issue, want_time = naive_qd([b["issue_ns"] for b in blocks], [b["complete_ns"] for b in blocks], (t0, t1))
    assert r["qd_hist_issue_computed"] == pytest.approx({str(k): v / 6 for k, v in want_issue.items()})
    assert r["qd_hist_time"] == pytest.approx({str(k): v / (t1 - t0) for k, v in want_time.items()})
