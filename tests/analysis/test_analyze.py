"""analyze: every JSON field on small traces whose answers are known by hand, and the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from analysis_helpers import US, block, fread, run_cli

from trainio_analysis.analyze import analyze
from trainio_analysis.analyze.result import w1_distance
from trainio_analysis.trace import write_trace

MIB = 1 << 20


def _dlio_like(steps: int = 10, reads_per_step: int = 4, compute_us: int = 100_000, pid: int = 100) -> list[dict]:
    """Each step: reads_per_step sequential 1 MiB reads of 1 ms, then compute_us of silence."""
    rows = []
    t = 0
    for s in range(steps):
        for k in range(reads_per_step):
            rows.append(fread(t, t + 1000, pid=pid, file=f"/data/img_{s}_{k}.npz"))
            t += 1000
        t += compute_us
    return rows


def test_counts_bytes_duration_throughput_iops(trace_dir: Path) -> None:
    rows = [
        block(0, 100, qd=1, nbytes=MIB),
        block(200, 300, qd=1, nbytes=MIB),
        block(1_500_000, 1_999_000, qd=1, nbytes=2 * MIB, op="write"),
        {**block(2_000_000, 2_000_000, qd=1, nbytes=0, op="flush"), "offset": None},
    ]
    write_trace(trace_dir, rows)
    r = analyze(trace_dir, bin_s=0.5)
    assert r["events"] == 4 and r["reads"] == 2 and r["writes"] == 1
    assert r["bytes_read"] == 2 * MIB and r["bytes_written"] == 2 * MIB
    assert r["duration_s"] == pytest.approx(2.0)
    tp = r["throughput_mib_s"]
    assert tp["mean"] == pytest.approx(4 / 2.0)
    assert tp["read_mean"] == pytest.approx(1.0) and tp["write_mean"] == pytest.approx(1.0)
    # bytes land in the bin of their completion: 2 MiB read in [0, .5), 2 MiB write in [1.5, 2)
    assert tp["timeline"]["t_s"] == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert tp["timeline"]["read"] == pytest.approx([4.0, 0, 0, 0, 0])
    assert tp["timeline"]["write"] == pytest.approx([0, 0, 0, 4.0, 0])
    assert tp["peak"] == pytest.approx(4.0)
    assert r["iops"] == pytest.approx(3 / 2.0)
    # the flush counts in the block queue depth but not in sizes or latency
    assert sum(json.loads(json.dumps(r["size_counts"])).values()) == 3
    assert r["qd_hist_issue_computed"] == {"1": 1.0}


def test_latency_percentiles_and_sizes_are_exact_on_small_traces(trace_dir: Path) -> None:
    lat_us = [10, 20, 30, 40, 50, 60, 70, 80, 90, 1000]
    sizes = [4096, 4096, 4096, 4096, 8192, 8191, 131072, 131072, 0, 1]
    rows = [
        block(i * 2000, i * 2000 + lat, qd=1, nbytes=n) for i, (lat, n) in enumerate(zip(lat_us, sizes, strict=True))
    ]
    write_trace(trace_dir, rows)
    r = analyze(trace_dir)
    lat = r["latency_us"]
    assert lat["exact"] is True
    assert lat["p50"] == pytest.approx(55.0)  # numpy linear interpolation
    assert lat["p90"] == pytest.approx(90 + 0.1 * 910)
    assert lat["max"] == pytest.approx(1000.0)
    assert lat["mean"] == pytest.approx(sum(lat_us) / 10)
    assert r["size_hist"] == pytest.approx({"0": 0.1, "1": 0.1, "4096": 0.5, "8192": 0.1, "131072": 0.2})
    assert r["size_counts"]["4096"] == 5  # 8191 is in [4096, 8192)
    assert sum(r["latency_hist_us"].values()) == 10
    assert r["latency_hist_us"]["512"] == 1  # 1000 us is in [512, 1024)


def test_bursts_idle_and_threshold(trace_dir: Path) -> None:
    # busy [0,10) [12,20) | 30 us idle | [50,60) | 5 us | [65,70): window 70 us
    rows = [block(0, 10, qd=1), block(12, 20, qd=1), block(50, 60, qd=1), block(65, 70, qd=1)]
    write_trace(trace_dir, rows)
    r = analyze(trace_dir, burst_gap_ms=0.004)  # gaps >= 4 us split bursts
    assert r["idle_fraction"] == pytest.approx((2 + 30 + 5) / 70)
    b = r["bursts"]
    assert b["count"] == 3 and b["busy_periods"] == 4
    assert b["mean_gap_s"] == pytest.approx((30 + 5) / 2 * 1e-6)
    assert b["mean_duration_s"] == pytest.approx((20 + 10 + 5) / 3 * 1e-6)
    assert b["mean_bytes"] == pytest.approx(4 * 4096 / 3)
    coarse = analyze(trace_dir, burst_gap_ms=0.010)["bursts"]
    assert coarse["count"] == 2 and coarse["mean_gap_s"] == pytest.approx(30e-6)
    assert sum(r["idle_gap_hist_us"].values()) == 3  # 2, 30 and 5 us


def test_compute_time_inferred_from_gaps_between_read_bursts(trace_dir: Path) -> None:
    write_trace(trace_dir, _dlio_like())
    r = analyze(trace_dir)
    assert r["selection"]["layer"] == "file"
    steps = r["steps"]
    assert steps["steps"] == 10
    assert steps["compute_time_s"] == pytest.approx(0.1)
    assert steps["bytes_per_step"] == pytest.approx(4 * MIB)
    assert steps["required_mib_s_per_gpu"] == pytest.approx(40.0)
    (proc,) = r["processes"]
    assert proc["pid"] == 100 and proc["comm"] == "loader"
    assert proc["reads"] == 40 and proc["bytes"] == 40 * MIB and proc["files"] == 40
    assert proc["mean_read_size"] == pytest.approx(MIB)
    assert proc["compute_time_s"] == pytest.approx(0.1)
    assert proc["required_mib_s_per_gpu"] == pytest.approx(40.0)
    assert proc["concurrency"]["mean_issue"] == 1.0 and proc["concurrency"]["max"] == 1
    busy = 40 * 1000 / (40 * 1000 + 9 * 100_000)
    assert proc["concurrency"]["mean_time"] == pytest.approx(busy)


def test_per_process_table_for_several_readers(trace_dir: Path) -> None:
    rows = _dlio_like(steps=3, pid=1) + _dlio_like(steps=3, reads_per_step=2, pid=2)
    rows.append(fread(0, 5, pid=2, nbytes=10, file="/data/img_0_0.npz"))
    rows = [{**r, "comm": "trainer"} if r["pid"] == 2 else r for r in rows]
    # a process that only writes (a checkpoint), to a file whose path is unknown
    rows.append({**fread(10, 20, pid=3, nbytes=4096, comm="ckpt"), "op": "write", "file": None})
    write_trace(trace_dir, rows, row_group_rows=7)
    r = analyze(trace_dir, layer="file")
    procs = {p["pid"]: p for p in r["processes"]}
    assert procs[1]["reads"] == 12 and procs[2]["reads"] == 7
    assert procs[2]["files"] == 6  # img_0_0 read twice
    assert procs[2]["bytes"] == 6 * MIB + 10
    assert procs[2]["concurrency"]["max"] == 1
    assert procs[1]["comm"] == "loader" and procs[2]["comm"] == "trainer"
    assert procs[3]["reads"] == 0 and procs[3]["files"] == 0 and procs[3]["bytes"] == 0
    assert procs[3]["comm"] == "ckpt" and procs[3]["compute_time_s"] is None
    only = analyze(trace_dir, pid=2)
    assert only["events"] == 7 and [p["pid"] for p in only["processes"]] == [2]


def test_layer_choice_and_lost_events(trace_dir: Path) -> None:
    rows = [block(0, 10, qd=1), fread(0, 20, pid=5)]
    write_trace(trace_dir, rows, {"lost_events": {"block_rq_complete": 7, "sys_exit_read": 0}})
    r = analyze(trace_dir)
    assert r["selection"]["layer"] == "block"  # the lowest layer present by default
    assert r["layers_present"] == {"block": 1, "file": 1}
    assert r["lost_events"] == {
        "total": 7,
        "complete": False,
        "by_probe": {"block_rq_complete": 7, "sys_exit_read": 0},
    }
    assert analyze(trace_dir, layer="file")["events"] == 1


def test_w1_distance_definition() -> None:
    assert w1_distance({"1": 1.0}, {"3": 1.0}) == pytest.approx(2.0)
    assert w1_distance({"1": 0.5, "2": 0.5}, {"1": 1.0}) == pytest.approx(0.5)
    assert w1_distance({"0": 0.25, "4": 0.75}, {"0": 0.25, "4": 0.75}) == 0.0


# ------------------------------------------------------------------ command line


def test_cli_json_has_the_documented_keys(trace_dir: Path) -> None:
    write_trace(trace_dir, _dlio_like(steps=3))
    res = run_cli("analyze", str(trace_dir), "--json", "--bin-s", "0.1")
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)  # strict JSON: no NaN
    for key in (
        "events",
        "bytes_read",
        "bytes_written",
        "duration_s",
        "throughput_mib_s",
        "iops",
        "qd_hist_issue",
        "qd_hist_issue_computed",
        "qd_issue_agreement",
        "qd_hist_time",
        "qd_hist_time_busy",
        "qd_mean_time",
        "utilization",
        "latency_us",
        "size_hist",
        "idle_fraction",
        "bursts",
        "lost_events",
        "processes",
        "steps",
    ):
        assert key in r, key
    assert set(r["latency_us"]) >= {"p50", "p90", "p99", "p999", "max"}
    assert r["throughput_mib_s"]["bin_s"] == 0.1
    assert all(math.isfinite(v) for v in r["qd_hist_time"].values())


def test_cli_human_summary(trace_dir: Path) -> None:
    write_trace(trace_dir, [block(0, 20, qd=1), block(10, 30, qd=2)])
    res = run_cli("analyze", str(trace_dir))
    assert res.returncode == 0, res.stderr
    assert "QD per-issue (kernel)    p50 1, p90 2, p99 2, max 2 | 1:50.0%  2:50.0%" in res.stdout
    assert "aqu-sz) 1.33" in res.stdout


@pytest.mark.parametrize("case", ["not-parquet", "missing", "empty-dir", "no-match", "version"])
def test_cli_bad_input_is_one_line_exit_2(tmp_path: Path, case: str) -> None:
    d = tmp_path / "t"
    args = ["analyze", str(d)]
    if case == "not-parquet":
        d.mkdir()
        (d / "seg-000000.parquet").write_text("not parquet")
    elif case == "empty-dir":
        d.mkdir()
    elif case == "no-match":
        write_trace(d, [block(0, 1, qd=1)])
        args += ["--pid", "4242"]
    elif case == "version":
        import pyarrow.parquet as pq

        from trainio_analysis.trace import conform

        d.mkdir()
        t = conform([block(0, 1, qd=1)])
        pq.write_table(t.replace_schema_metadata({"trainio.schema_version": "99"}), d / "seg-000000.parquet")
    res = run_cli(*args)
    assert res.returncode == 2
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert str(d) in lines[0]
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("option", ["--burst-gap-ms", "--step-gap-ms"])
@pytest.mark.parametrize("value", ["inf", "nan", "-1", "0", "ten"])
def test_cli_a_gap_that_is_not_a_positive_finite_number_is_refused(trace_dir: Path, option: str, value: str) -> None:
    """argparse's usage and one error line naming the option and the value, exit 2, no
    traceback (`--burst-gap-ms inf` overflowed an integer conversion; -1 and nan ran)."""
    write_trace(trace_dir, [block(0, 20, qd=1), block(10, 30, qd=2)])
    res = run_cli("analyze", str(trace_dir), option, value)
    assert res.returncode == 2 and res.stdout == "", res.stderr
    errors = [line for line in res.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and option in errors[0] and value in errors[0], res.stderr
    assert "Traceback" not in res.stderr


def test_cli_corrupt_row_group_is_one_line_exit_2(trace_dir: Path) -> None:
    import pyarrow.parquet as pq

    rows = [block(i * 10, i * 10 + 25, qd=1, nbytes=4096 + i) for i in range(400)]
    write_trace(trace_dir, rows, row_group_rows=50)
    seg = trace_dir / "seg-000000.parquet"
    meta = pq.ParquetFile(seg).metadata
    col = meta.row_group(3).column(meta.schema.names.index("complete_ns"))
    data = bytearray(seg.read_bytes())
    start = col.data_page_offset
    data[start : start + col.total_compressed_size] = b"\x17" * col.total_compressed_size
    seg.write_bytes(bytes(data))
    res = run_cli("analyze", str(trace_dir), "--json")
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{seg}: row group 3 unreadable" in lines[0], res.stderr


def _checkpointing(scale: float = 1.0) -> list[dict]:
    """_dlio_like's loader, saving a checkpoint after steps 4 and 8: two files of 2 MiB
    each, written in 1 MiB writes back to back (each `scale` × 2 ms), then fsync (5 ms)."""
    rows = _dlio_like()
    ends = sorted(r["complete_ns"] for r in rows)
    for k, step in enumerate((4, 8)):
        t = ends[4 * step - 1] // US + 1000
        for f in ("model", "optim"):
            path = f"/ckpt/{k}/{f}.pt"
            for i in range(2):
                rows.append({**fread(t, t + 2000 * scale, pid=100, file=path), "op": "write", "offset": i * MIB})
                t += 2000 * scale + 50
            rows.append(
                {**fread(t, t + 5000, pid=100, file=path, nbytes=0), "op": "fsync", "offset": None, "queue_depth": 0}
            )
            t += 5050
    return rows


def test_write_bursts_apart_from_reads_human_json_and_compare(trace_dir: Path, tmp_path: Path) -> None:
    write_trace(trace_dir, _checkpointing())
    res = run_cli("analyze", str(trace_dir), "--json")
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    w = r["write_bursts"]
    assert (w["count"], w["bytes"], w["syncs"]) == (2, 8 * MIB, 4)
    # each burst: 4 writes of 2 ms and 2 fsyncs of 5 ms, 50 us apart
    one = (4 * 2000 + 2 * 5000 + 5 * 50) / 1e6
    assert w["mean_duration_s"] == pytest.approx(one)
    assert w["mib_s"] == pytest.approx(4 / one)
    assert w["interval_s"] == pytest.approx((w["bursts"][1]["start_ns"] - w["bursts"][0]["start_ns"]) / 1e9)
    assert [b["after_step"] for b in r["job_model"]["gpus"][0]["write_bursts"]] == [4, 8]
    # the reads are what they were without the writes
    assert r["steps"]["steps"] == 10 and r["bytes_read"] == 40 * MIB
    human = run_cli("analyze", str(trace_dir))
    assert human.returncode == 0, human.stderr
    assert "write bursts 2 (gap >= 100 ms): 8.0 MiB, mean 4.0 MiB" in human.stdout
    assert "writes: 2 burst(s) after steps 4,8, 8.0 MiB, 4 sync(s)" in human.stdout
    # Writes twice as slow: the same bytes at half the MiB/s while writing, bursts longer.
    slow = tmp_path / "slow"
    write_trace(slow, _checkpointing(scale=2.0))
    c = json.loads(run_cli("compare", str(trace_dir), str(slow), "--json").stdout)["writes"]
    assert c["bytes_rel_error"] == 0
    slow_one = (4 * 4000 + 2 * 5000 + 5 * 50) / 1e6
    assert c["mib_s_rel_error"] == pytest.approx(one / slow_one - 1)
