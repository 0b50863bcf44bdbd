"""The object layer (schema 1.8) in the Python reader and in analyze: rows written with
the Python writer read back with their endpoint, status and first byte, and analyze's
object_requests summarizes them per endpoint with known answers."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from trainio_analysis import trace as tr
from trainio_analysis.analyze import analyze
from trainio_analysis.analyze.objects import object_requests

MS = 1_000_000
A, B = "10.0.0.1:9000", "10.0.0.2:9000"


def _obj(op, issue, complete, first, nbytes, qd, endpoint, status=200, error=0, offset=None):
    return {
        "layer": "object",
        "op": op,
        "issue_ns": issue,
        "complete_ns": complete,
        "first_byte_ns": first,
        "bytes": nbytes,
        "bytes_requested": nbytes,
        "queue_depth": qd,
        "pid": 7,
        "tid": 7,
        "comm": "python",
        "fd": 5,
        "file": "bkt/k",
        "offset": offset,
        "endpoint": endpoint,
        "http_status": status,
        "error": error,
    }


ROWS = [
    # endpoint A: two overlapping GETs (depth 1 then 2), then a PUT alone
    _obj("get", 0, 10 * MS, 2 * MS, 4096, 1, A),
    _obj("get", 5 * MS, 20 * MS, 6 * MS, 1 << 20, 2, A, status=206, offset=100),
    _obj("put", 30 * MS, 40 * MS, 39 * MS, 1000, 1, A),
    # endpoint B: one 404 and one request cut short
    _obj("get", 0, 40 * MS, 1 * MS, 300, 1, B, status=404),
    _obj("get", 10 * MS, 30 * MS, None, 0, 2, B, status=None, error=-61),
    # a file row: not an object request
    {**_obj("read", 0, 1, None, 1, 1, None, status=None), "layer": "file", "offset": 0},
]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    out = tmp_path / "t"
    tr.write_trace(out, ROWS)
    return out


def test_object_rows_read_back_with_their_columns(trace: Path) -> None:
    assert tr.read_metadata(trace)["schema_minor"] == tr.SCHEMA_MINOR
    df = tr.scan_trace(trace).filter(pl.col("layer") == "object").collect()
    assert df["endpoint"].to_list() == [A, A, A, B, B]
    assert df["http_status"].to_list() == [200, 206, 200, 404, None]
    assert df["first_byte_ns"].to_list() == [2 * MS, 6 * MS, 39 * MS, 1 * MS, None]
    files = tr.scan_trace(trace).filter(pl.col("layer") == "file").collect()
    assert files["endpoint"].to_list() == [None]


def test_a_trace_before_1_8_has_no_object_requests(tmp_path: Path) -> None:
    out = tmp_path / "old"
    tr.write_trace(out, ROWS[-1:])
    assert object_requests(out) is None
    assert "object_requests" not in analyze(out, layer="file", with_model=False)


def test_object_requests_per_endpoint(trace: Path) -> None:
    r = object_requests(trace)
    assert r is not None
    assert (r["requests"], r["start_ns"], r["end_ns"]) == (5, 0, 40 * MS)
    a, b = r["endpoints"][A], r["endpoints"][B]
    assert (a["requests"], a["incomplete"], a["by_op"]) == (3, 0, {"get": 2, "put": 1})
    assert a["by_status"] == {"200": 2, "206": 1}
    assert (a["bytes_read"], a["bytes_written"]) == (4096 + (1 << 20), 1000)
    assert a["size_counts"] == {"512": 1, "4096": 1, str(1 << 20): 1}
    assert a["latency_us"]["max"] == 15_000 and a["latency_us"]["mean"] == pytest.approx(35_000 / 3)
    assert a["ttfb_us"]["max"] == 9_000 and a["ttfb_us"]["p50"] == 2_000
    assert a["qd_hist_issue"] == pytest.approx({"1": 2 / 3, "2": 1 / 3})
    # outstanding over the 40 ms: 1 for 5 ms, 2 for 5 ms, 1 for 10 ms, 0 for 10 ms, 1 for 10 ms
    assert a["qd_hist_time"] == pytest.approx({"0": 0.25, "1": 0.625, "2": 0.125})
    assert a["qd_mean_time"] == pytest.approx((25 + 2 * 5) / 40)
    tl = a["timeline"]
    assert len(tl["qd_mean"]) == len(tl["t_s"]) == 200
    assert sum(tl["qd_mean"]) * tl["bin_s"] * 1e9 == pytest.approx(35 * MS, rel=1e-9)
    assert a["latency_cdf_us"]["us"][-1] == 15_000
    assert (b["incomplete"], b["by_status"]) == (1, {"404": 1, "none": 1})
    assert b["ttfb_us"]["max"] == 1_000  # the cut request has no first byte
    assert b["qd_max"] == 2


def test_analyze_carries_the_object_requests(trace: Path) -> None:
    out = analyze(trace, layer="file", with_model=False)
    assert out["object_requests"] == object_requests(trace)
