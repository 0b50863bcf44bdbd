"""The analyzer's parts on their own: the plan (which row groups and which of their
columns are read, the window, bins, watermarks and groups) and the assembly of the
result from the pass's totals."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from analysis_helpers import US, block, fread

from trainio_analysis.analyze.decode import Chunk, Decoder, ProcessTotals
from trainio_analysis.analyze.plan import Plan, Selection
from trainio_analysis.analyze.qd_sweep import GroupState
from trainio_analysis.analyze.result import MIB, Totals, result
from trainio_analysis.analyze.sketch import QuantileSketch
from trainio_analysis.errors import SelectionError
from trainio_analysis.trace import write_trace

BASE = ["issue_ns", "complete_ns", "bytes", "queue_depth"]


def _units(plan: Plan) -> list[tuple[str, int, int, int]]:
    return [(seg.path.name, index, lo, hi) for seg, index, lo, hi in plan.units]


# ---------------------------------------------------------------------- plan


def test_units_window_and_watermarks_come_from_the_row_groups(trace_dir: Path) -> None:
    # row groups of 2 rows, segments of 4: out of order, so the watermarks (the least
    # issue of every later row group) are not the next group's own least issue
    rows = [
        block(50, 60, qd=1),
        block(70, 90, qd=1),
        block(30, 40, qd=1),
        block(31, 95, qd=2),
        block(10, 20, qd=1),
        block(12, 41, qd=2),
        block(80, 100, qd=1),
    ]
    write_trace(trace_dir, rows, {"start_ns": 5 * US, "end_ns": 120 * US}, rows_per_segment=4, row_group_rows=2)
    plan = Plan(trace_dir, Selection(), None)
    assert _units(plan) == [
        ("seg-000000.parquet", 0, 50 * US, 90 * US),
        ("seg-000000.parquet", 1, 30 * US, 95 * US),
        ("seg-000001.parquet", 0, 10 * US, 41 * US),
        ("seg-000001.parquet", 1, 80 * US, 100 * US),
    ]
    assert (plan.t0, plan.t1, plan.window) == (5 * US, 120 * US, 115 * US)
    # relative to t0: unit 0 waits for unit 2's 10 us, not unit 1's 30 us
    assert plan.watermarks == [5 * US, 5 * US, 75 * US, None]
    # automatic bins: 1 us fine bins (the pass widens them at its end)
    assert (plan.bin_auto, plan.bin_ns, plan.nbins) == (True, 1000, 116)
    assert plan.layer == "block" and plan.group_col == "dev" and plan.group_names == ["7:0"]


def test_the_window_is_the_rows_when_the_metadata_says_less(trace_dir: Path) -> None:
    write_trace(trace_dir, [block(10, 20, qd=1), block(15, 30, qd=2)], {"start_ns": 12 * US, "end_ns": 25 * US})
    plan = Plan(trace_dir, Selection(), 0.000_004)
    assert (plan.t0, plan.t1) == (10 * US, 30 * US)
    assert (plan.bin_auto, plan.bin_ns, plan.nbins) == (False, 4000, 6)


@pytest.mark.parametrize("bin_s", [0.0, -1.0, math.nan, math.inf, 1e-12, 1e10])
def test_a_bin_outside_1ns_to_1e6s_is_refused(trace_dir: Path, bin_s: float) -> None:
    write_trace(trace_dir, [block(10, 20, qd=1)])
    with pytest.raises(SelectionError, match=r"^--bin-s \S+: must be from 1e-09 s \(1 ns\) to 1e\+06 s$"):
        Plan(trace_dir, Selection(), bin_s)


def test_too_many_bins_are_refused_from_the_statistics(trace_dir: Path) -> None:
    write_trace(trace_dir, [block(0, 20_000_000, qd=1)])  # 20 s
    with pytest.raises(SelectionError, match=r"--bin-s 1e-06 gives 20000001 bins over 20 s .*raise it"):
        Plan(trace_dir, Selection(), 1e-6)


def _layered(trace_dir: Path) -> None:
    """Row group 0: block reads of 7:0; 1: block of 7:1 and a write; 2: file reads of two
    processes; 3: a block write and a file read."""
    rows = [
        block(0, 10, qd=1, dev="7:0"),
        block(1, 11, qd=2, dev="7:0"),
        block(2, 12, qd=1, dev="7:1"),
        block(3, 13, qd=1, dev="7:1", op="write"),
        fread(4, 14, pid=20),
        {**fread(5, 15, pid=10), "dev": "7:0"},
        block(6, 16, qd=1, dev="7:0", op="write"),
        fread(7, 17, pid=30),
    ]
    write_trace(trace_dir, rows, row_group_rows=2)


def test_columns_read_per_row_group_for_the_block_layer(trace_dir: Path) -> None:
    _layered(trace_dir)
    plan = Plan(trace_dir, Selection(), None)
    assert plan.layer == "block" and plan.group_names == ["7:0", "7:1"]
    consts = [plan.constants(seg, i) for seg, i, _, _ in plan.units]
    assert consts == [
        {"layer": "block", "op": "read", "dev": "7:0"},
        {"layer": "block", "dev": "7:1"},
        {"layer": "file", "op": "read"},
        {},
    ]
    assert [plan.rules_out(c) for c in consts] == [False, False, True, False]
    assert plan.columns(consts[0]) == BASE
    assert plan.columns(consts[1]) == [*BASE, "op"]
    assert plan.columns(consts[3]) == [*BASE, "layer", "op", "dev"]


def test_a_device_selection_rules_out_the_other_devices_row_groups(trace_dir: Path) -> None:
    _layered(trace_dir)
    plan = Plan(trace_dir, Selection(dev="7:1"), None)
    assert plan.dev == "7:1" and plan.group_names == ["7:1"]
    consts = [plan.constants(seg, i) for seg, i, _, _ in plan.units]
    assert [plan.rules_out(c) for c in consts] == [True, False, True, False]
    assert plan.columns(consts[3]) == [*BASE, "layer", "op", "dev"]


def test_columns_read_per_row_group_for_the_file_layer(trace_dir: Path) -> None:
    _layered(trace_dir)
    plan = Plan(trace_dir, Selection(layer="file"), None)
    # processes from the rows (row group 3 is mixed), numbered in pid order
    assert plan.group_col == "pid" and plan.group_names == ["10", "20", "30"]
    assert plan.pid_lookup.tolist() == [10, 20, 30]
    consts = [plan.constants(seg, i) for seg, i, _, _ in plan.units]
    assert [plan.rules_out(c) for c in consts] == [True, True, False, False]
    assert plan.columns(consts[2]) == [*BASE, "pid", "file"]
    assert plan.columns(consts[3]) == [*BASE, "layer", "op", "pid", "file"]
    # a device selection on the file layer reads the dev column too
    plan = Plan(trace_dir, Selection(layer="file", dev="7:0", pid=10), None)
    assert plan.group_names == ["10"]
    assert plan.columns(consts[3]) == [*BASE, "layer", "op", "dev", "pid", "file"]


def test_a_pid_selection_on_the_block_layer_reads_pids(trace_dir: Path) -> None:
    write_trace(trace_dir, [block(0, 10, qd=1, pid=5), block(1, 11, qd=2, pid=6)])
    plan = Plan(trace_dir, Selection(pid=6), None)
    assert plan.group_names == ["7:0"]
    assert plan.columns(plan.constants(*plan.units[0][:2])) == [*BASE, "pid"]


def test_groups_from_statistics_alone(trace_dir: Path) -> None:
    # every row group holds one layer and one device: the statistics name the groups
    rows = [block(0, 10, qd=1, dev="8:16"), block(1, 11, qd=1, dev="8:16"), block(2, 12, qd=1, dev="8:0")]
    write_trace(trace_dir, rows, row_group_rows=2)
    plan = Plan(trace_dir, Selection(), None)
    assert plan._groups_from_stats() == ["8:0", "8:16"]
    assert plan.group_names == ["8:0", "8:16"] and plan.dev_lookup == {"8:0": 0, "8:16": 1}
    assert plan.null_group == -1


@pytest.mark.parametrize(
    ("sel", "says"),
    [
        (Selection(layer="nfs"), "no nfs events (layers present: block 8)"),
        (Selection(dev="9:9"), "no events match --layer block --dev 9:9"),
        (Selection(layer="file", pid=99), "no events match --layer file --pid 99"),
        (Selection(dev="sdz"), "no device 'sdz' in trainio.devices (give MAJ:MIN)"),
    ],
)
def test_a_selection_that_matches_nothing_is_refused(trace_dir: Path, sel: Selection, says: str) -> None:
    write_trace(trace_dir, [*[block(i, i + 1, qd=1) for i in range(8)], fread(0, 1, pid=3)])
    plan_says = f"{trace_dir}: {says}".replace("block 8)", "block 8, file 1)")
    with pytest.raises(SelectionError) as e:
        Plan(trace_dir, sel, None)
    assert str(e.value) == plan_says


# ---------------------------------------------------------------------- result


def _state(hist_time: list[float], hist_issue: list[int]) -> GroupState:
    return GroupState(hist_issue=np.array(hist_issue, np.int64), hist_time=np.array(hist_time, np.float64))


def _totals(plan: Plan, **kw: object) -> Totals:
    n = plan.nbins
    latency = QuantileSketch()
    latency.add(np.array([1_000, 3_000, 2_000], np.int64))
    fields = {
        "acc": Chunk(
            events=4,
            reads=2,
            writes=1,
            bytes_read=3 << 20,
            bytes_written=1 << 20,
            data_first_ns=plan.t0,
            data_last_ns=plan.t0,
        ),
        "latency": latency,
        "size_counts": np.bincount([22, 21, 21], minlength=65),  # 2 MiB, 1 MiB, 1 MiB (pow2_bucket)
        "tl_read": np.zeros(n),
        "tl_write": np.zeros(n),
        "tl_inflight": np.zeros(n),
        "kernel_qd": {},
        "groups": {},
        "union_state": GroupState(hist_time=np.array([float(plan.window)])),
        "procs": ProcessTotals(len(plan.group_names)),
        "comms": {},
    }
    fields.update(kw)
    return Totals(**fields)  # type: ignore[arg-type]


def test_result_sums_and_rates(trace_dir: Path) -> None:
    # window 0..2 s, 1 s bins
    write_trace(trace_dir, [block(0, 1, qd=1), block(1_999_000, 2_000_000, qd=1)], {"start_ns": 1})
    plan = Plan(trace_dir, Selection(), 1.0)
    assert (plan.t0, plan.window, plan.nbins) == (0, 2_000_000_000, 3)
    tl_read = np.array([2 * MIB, MIB, 0.0])
    tl_write = np.array([0.0, MIB, 0.0])
    # 1.5 requests in flight on average over bin 0, 0.5 over bin 1
    tl_inflight = np.array([1.5e9, 0.5e9, 0.0])
    acc = Chunk(
        events=4,
        reads=2,
        writes=1,
        bytes_read=3 << 20,
        bytes_written=1 << 20,
        data_first_ns=500_000_000,
        data_last_ns=1_500_000_000,
    )
    t = _totals(plan, acc=acc, tl_read=tl_read, tl_write=tl_write, tl_inflight=tl_inflight)
    r = result(plan, t, burst_gap_ms=10.0, with_model=False)
    assert r["trace"] == str(trace_dir)
    assert r["selection"] == {"layer": "block", "dev": None, "pid": None, "grouped_by": "dev", "groups": 1}
    assert (r["events"], r["reads"], r["writes"]) == (4, 2, 1)
    assert (r["start_ns"], r["end_ns"], r["duration_s"]) == (0, 2_000_000_000, 2.0)
    tp = r["throughput_mib_s"]
    assert tp["mean"] == 2.0 and tp["read_mean"] == 1.5 and tp["write_mean"] == 0.5
    assert tp["timeline"]["t_s"] == [0.0, 1.0, 2.0]
    assert tp["timeline"]["read"] == [2.0, 1.0, 0.0] and tp["timeline"]["write"] == [0.0, 1.0, 0.0]
    assert tp["timeline"]["qd_mean"] == [1.5, 0.5, 0.0]
    assert tp["peak"] == 2.0 and tp["bin_s"] == 1.0 and tp["bin_auto"] is False
    assert r["active_s"] == 1.0 and r["throughput_active_mib_s"] == 4.0
    assert (r["iops"], r["read_iops"], r["write_iops"]) == (1.5, 1.0, 0.5)
    assert r["size_counts"] == {"1048576": 2, "2097152": 1}
    assert r["size_hist"] == pytest.approx({"1048576": 2 / 3, "2097152": 1 / 3})
    assert r["mean_size_bytes"] == 4 * MIB / 3
    assert r["latency_us"]["p50"] == 2.0 and r["latency_us"]["max"] == 3.0 and r["latency_us"]["mean"] == 2.0
    assert r["latency_cdf_us"]["us"][0] == 1.0 and r["latency_cdf_us"]["us"][-1] == 3.0
    assert r["idle_fraction"] == 1.0 and r["utilization"] == 0.0
    assert "job_model" not in r and "processes" not in r


def test_result_queue_depth_per_group_and_pooled(trace_dir: Path) -> None:
    write_trace(trace_dir, [block(0, 1, qd=1, dev="7:0"), block(0, 100, qd=1, dev="7:1")], {"start_ns": 1})
    plan = Plan(trace_dir, Selection(), None)
    w = float(plan.window)
    assert plan.group_names == ["7:0", "7:1"] and w == 100 * US
    # 7:0 busy a quarter of the window at depth 1, 7:1 busy half of it at depth 2
    groups = {0: _state([0.75 * w, 0.25 * w], [0, 4]), 1: _state([0.5 * w, 0.0, 0.5 * w], [0, 0, 4])}
    union = GroupState(hist_time=np.array([0.5 * w, 0.25 * w, 0.25 * w]))
    kernel_qd = {0: np.array([0, 3, 1]), 1: np.array([0, 0, 4])}
    tl_inflight = np.zeros(plan.nbins)
    tl_inflight[0] = 3 * plan.bin_ns  # 3 requests in flight over the first bin, 2 devices
    t = _totals(plan, groups=groups, union_state=union, kernel_qd=kernel_qd, tl_inflight=tl_inflight)
    r = result(plan, t, burst_gap_ms=10.0, with_model=False)
    assert r["throughput_mib_s"]["timeline"]["qd_mean"][:2] == [1.5, 0.0]  # per device
    # per issue: the kernel's histograms pooled (3 at 1, 5 at 2), and the sweep's (4 and 4)
    assert r["qd_hist_issue"] == {"1": 3 / 8, "2": 5 / 8}
    assert r["qd_hist_issue_computed"] == {"1": 0.5, "2": 0.5}
    assert r["qd_issue_agreement"]["w1"] == pytest.approx(1 / 8)
    assert r["qd_mean_issue"] == pytest.approx(13 / 8) and r["qd_max"] == 2
    # time-weighted: the mean of the two devices' histograms
    assert r["qd_hist_time"] == pytest.approx({"0": 0.625, "1": 0.125, "2": 0.25})
    assert r["qd_mean_time"] == pytest.approx((0.25 + 1.0) / 2)
    assert r["qd_hist_time_busy"] == pytest.approx({"1": 1 / 3, "2": 2 / 3})
    assert r["utilization"] == pytest.approx(0.375)
    assert r["idle_fraction"] == 0.5  # nothing in flight on either device
    assert list(r["groups"]) == ["7:0", "7:1"]
    g1 = r["groups"]["7:1"]
    assert g1["qd_hist_issue"] == {"2": 1.0} and g1["qd_hist_time"] == {"0": 0.5, "2": 0.5}
    assert g1["qd_mean_time"] == 1.0 and g1["qd_mean_time_busy"] == 2.0 and g1["utilization"] == 0.5


def test_result_processes_of_the_file_layer(trace_dir: Path) -> None:
    write_trace(trace_dir, [fread(0, 10, pid=7, comm="loader"), fread(5, 30, pid=9, comm="worker")])
    plan = Plan(trace_dir, Selection(layer="file"), None)
    assert plan.group_names == ["7", "9"]
    procs = ProcessTotals(2)
    procs.reads[:] = [3, 1]
    procs.bytes[:] = [3 << 20, 1 << 20]
    procs.qd = np.array([[0, 2, 1], [0, 1, 0]])
    procs.file_pairs = np.array([(0 << 32) | 0, (0 << 32) | 1, (1 << 32) | 1])
    groups = {0: _state([0.5 * plan.window, 0.5 * plan.window], [0, 3])}
    t = _totals(plan, procs=procs, comms={0: "loader", 1: "worker"}, groups=groups)
    r = result(plan, t, burst_gap_ms=10.0, with_model=False)
    assert r["steps"]["steps"] == 0 and r["steps"]["gpus"] == 0
    p7, p9 = r["processes"]
    assert (p7["pid"], p7["comm"], p7["reads"], p7["bytes"], p7["files"]) == (7, "loader", 3, 3 * MIB, 2)
    assert p7["mean_read_size"] == MIB
    assert p7["concurrency"] == {"mean_issue": pytest.approx(4 / 3), "max": 2, "mean_time": 0.5}
    assert (p9["pid"], p9["comm"], p9["files"], p9["concurrency"]["max"]) == (9, "worker", 1, 1)
    assert p9["concurrency"]["mean_time"] == 0.0  # no sweep state for it
    assert p7["gpu"] is None and p7["required_mib_s_per_gpu"] is None


def test_a_process_is_named_by_its_first_row_whatever_order_row_groups_decode_in(trace_dir: Path) -> None:
    # pid 7's first rows carry its main thread's name, later ones a worker thread's (the
    # comm of a row is its thread's): row groups decode in parallel, in any order.
    rows = [fread(i, i + 1, pid=7, comm="train.py" if i < 2 else "loader-thread") for i in range(6)]
    write_trace(trace_dir, rows, row_group_rows=2)
    plan = Plan(trace_dir, Selection(layer="file"), None)
    assert len(plan.units) == 3
    for order in ([0, 1, 2], [2, 1, 0], [1, 2, 0]):
        d = Decoder(plan)
        for k in order:
            d.prepare(plan.units[k])
        assert d.comms == {0: "train.py"}, order
