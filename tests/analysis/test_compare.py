"""compare: the fidelity scores a replay is judged by."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from analysis_helpers import block, run_cli

from trainio_analysis.compare import compare
from trainio_analysis.trace import write_trace


def _qd1(n: int, size: int = 4096, lat: int = 10) -> list[dict]:
    """n back-to-back requests at QD 1."""
    return [block(i * lat, (i + 1) * lat, qd=1, nbytes=size) for i in range(n)]


def _qd2(n: int, size: int = 4096, lat: int = 20) -> list[dict]:
    """n requests, two always in flight (pairs issued together)."""
    rows = []
    for i in range(n // 2):
        rows += [
            block(i * lat, (i + 1) * lat, qd=1, nbytes=size),
            block(i * lat, (i + 1) * lat, qd=2, nbytes=size),
        ]
    return rows


def test_identical_traces_score_perfectly(tmp_path: Path) -> None:
    write_trace(tmp_path / "a", _qd1(10))
    write_trace(tmp_path / "b", _qd1(10))
    r = compare(tmp_path / "a", tmp_path / "b")
    assert r["throughput_rel_error"] == 0.0
    assert r["qd_w1_issue"] == 0.0 and r["qd_w1_time"] == 0.0
    assert r["size_w1_log2"] == 0.0
    assert r["latency_p50_ratio"] == 1.0 and r["latency_p99_ratio"] == 1.0


def test_scores_of_a_known_difference(tmp_path: Path) -> None:
    # A: QD 1, 4 KiB, 10 us each, 100 us total. B: QD 2, 8 KiB, 20 us, same duration.
    write_trace(tmp_path / "a", _qd1(10))
    write_trace(tmp_path / "b", _qd2(10, size=8192))
    r = compare(tmp_path / "a", tmp_path / "b")
    # A moves 40 KiB in 100 us, B 80 KiB in 100 us
    assert r["throughput_rel_error"] == pytest.approx(1.0)
    # per issue A {1: 1}, B {1: .5, 2: .5}: W1 0.5; time A {1: 1}, B {2: 1}: W1 1
    assert r["qd_w1_issue"] == pytest.approx(0.5)
    assert r["qd_w1_time"] == pytest.approx(1.0)
    assert r["size_w1_log2"] == pytest.approx(1.0)  # every request one octave bigger
    assert r["latency_p50_ratio"] == pytest.approx(2.0)
    assert r["latency_p99_ratio"] == pytest.approx(2.0)


def test_cli_compare_json_and_text(tmp_path: Path) -> None:
    write_trace(tmp_path / "a", _qd1(10))
    write_trace(tmp_path / "b", _qd2(10))
    res = run_cli("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json")
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    assert r["qd_w1_issue"] == pytest.approx(0.5)
    text = run_cli("compare", str(tmp_path / "a"), str(tmp_path / "b"))
    assert "QD W1 per-issue   0.500" in text.stdout
    bad = run_cli("compare", str(tmp_path / "a"), str(tmp_path / "nope"))
    assert bad.returncode == 2 and str(tmp_path / "nope") in bad.stderr


def test_throughput_is_scored_over_the_active_span(tmp_path: Path) -> None:
    # Same requests (QD 1, 10 x 10 us from t = 2 ms) in both; A's recording window is
    # exactly the requests, B's started 1 ms before its first request (a process start-up
    # a replay does not reproduce). The active-span throughput agrees, the window's not.
    rows = [block(2000 + i * 10, 2000 + (i + 1) * 10, qd=1) for i in range(10)]
    write_trace(tmp_path / "a", rows, {"start_ns": 2_000_000, "end_ns": 2_100_000})
    write_trace(tmp_path / "b", rows, {"start_ns": 1_000_000, "end_ns": 2_100_000})
    r = compare(tmp_path / "a", tmp_path / "b")
    assert r["throughput_rel_error"] == pytest.approx(0.0, abs=1e-9)
    assert r["throughput_mib_s"]["a"] == pytest.approx(10 * 4096 / 2**20 / 100e-6)
    # A's window is 100 us, B's 1.1 ms: 11 times longer for the same bytes.
    assert r["throughput_window_rel_error"] == pytest.approx(100 / 1100 - 1, rel=1e-6)
