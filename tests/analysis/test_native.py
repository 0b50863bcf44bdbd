"""The native kernels (analysis/native, built by `make`) give exactly the numpy path's results.

Kernel by kernel against the numpy code each one replaces, and end to end: the whole
`analyze` result of random traces with many segments and row groups, both paths.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainio_analysis import kernels
from trainio_analysis.analyze import analyze
from trainio_analysis.analyze.qd_sweep import ChunkSummary, _sort_keys, event_keys, merge_sorted, summarize
from trainio_analysis.trace import write_trace

NATIVE = kernels._module  # the built module, whatever TRAINIO_ANALYSIS_NATIVE says


def test_native_module_is_built_and_selected_by_default() -> None:
    # `make` builds it; a missing module would silently fall back to the numpy path
    assert kernels.available(), "trainio_analysis._native is not built: run make"
    with kernels.use_native(True):
        assert kernels.path() == "native"
    with kernels.use_native(False):
        assert kernels.path() == "numpy" and kernels.native() is None


def _numpy_keys(issue: np.ndarray, complete: np.ndarray, offset: int) -> np.ndarray:
    keys = event_keys(issue, complete, offset)
    _sort_keys(keys)
    return keys


requests = st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 300)), min_size=1, max_size=400)


@settings(max_examples=200, deadline=None)
@given(requests, st.sampled_from(["shuffled", "completion", "issue", "reversed"]))
def test_sorted_event_keys_equal_numpy(reqs, order) -> None:
    issue = np.array([r[0] for r in reqs], np.int64) + 1_000_000
    complete = issue + np.array([r[1] for r in reqs], np.int64)
    if order == "completion":  # what the tracer writes: the adaptive sort's fast case
        idx = np.argsort(complete, kind="stable")
    elif order == "issue":
        idx = np.argsort(issue, kind="stable")
    elif order == "reversed":  # far from sorted: the general sort takes over
        idx = np.argsort(-complete, kind="stable")
    else:
        idx = np.arange(issue.size)
    issue, complete = issue[idx], complete[idx]
    offset = int(issue.min()) - 7
    got = NATIVE.event_keys_sorted(issue, complete, offset)
    want = _numpy_keys(issue, complete, offset)
    assert got.dtype == np.int64
    assert np.array_equal(got, want)
    dup = bool(np.any((want[1:] == want[:-1]) & ((want[:-1] & 3) == 1)))
    assert NATIVE.equal_issue_neighbours(got) == dup


def test_sorted_event_keys_of_many_disordered_rows() -> None:
    # far more inversions than the insertion sort's budget: the fallback sort's result
    rng = np.random.default_rng(3)
    issue = rng.integers(0, 1 << 40, 200_000)
    complete = issue + rng.integers(0, 1 << 20, issue.size)
    got = NATIVE.event_keys_sorted(issue, complete, 0)
    assert np.array_equal(got, _numpy_keys(issue, complete, 0))


def _summary_fields(s) -> list:
    return [
        s.t_first,
        s.t_last,
        s.q_min,
        s.q_last,
        s.level_counts.tolist(),
        s.time_hist.tolist(),
        s.ends.tolist(),
        s.starts.tolist(),
    ]


@settings(max_examples=200, deadline=None)
@given(requests, st.integers(0, 100), st.integers(0, 400))
def test_summarize_equals_numpy(reqs, cut_pct, split_at) -> None:
    """Any slice of a sweep (its count may dip below its start), and the merge of two."""
    issue = np.array([r[0] for r in reqs], np.int64)
    complete = issue + np.array([r[1] for r in reqs], np.int64)
    keys = _numpy_keys(issue, complete, 0)
    keys = keys[keys.size * cut_pct // 100 :]  # a slice that starts mid-sweep
    if keys.size == 0:
        return
    with kernels.use_native(False):
        want = _summary_fields(summarize(keys))
    got = _summary_fields(ChunkSummary(*NATIVE.summarize(keys)))
    assert got == want
    assert [type(x) for x in got[:4]] == [int] * 4
    # two sorted runs merged inside the kernel
    cut = min(split_at, keys.size)
    a, b = keys[::2].copy(), keys[1::2].copy()
    if cut % 2:
        a, b = keys[:cut].copy(), keys[cut:].copy()
    merged = _summary_fields(ChunkSummary(*NATIVE.summarize(a, b)))
    with kernels.use_native(False):
        assert merged == _summary_fields(summarize(merge_sorted(a, [b])))


def _same(a, b) -> bool:
    """Exact equality of two JSON results (NaN equal to NaN)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _both_paths(path: Path, **kw) -> tuple[dict, dict]:
    with kernels.use_native(True):
        fast = analyze(path, **kw)
    with kernels.use_native(False):
        ref = analyze(path, **kw)
    return fast, ref


BLOCK_OPS = ["read", "read", "write", "flush", "discard"]

rows_strategy = st.lists(
    st.tuples(
        st.integers(0, 4_000),  # issue, us
        st.integers(0, 900),  # latency, us (0: zero-latency requests)
        st.sampled_from(["8:0", "8:16", "259:0"]),
        st.sampled_from(BLOCK_OPS),
        st.sampled_from([0, 512, 4096, 131072, 1 << 20]),
        st.integers(1, 3),  # pid
    ),
    min_size=1,
    max_size=120,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows_strategy,
    st.integers(1, 9),
    st.booleans(),
    st.booleans(),
    st.sampled_from([None, "8:16"]),
    st.randoms(use_true_random=False),
)
def test_analyze_native_equals_numpy_on_random_block_traces(
    tmp_path_factory, rows, group_rows, one_device, by_completion, dev, rnd
) -> None:
    """Many segments and row groups, mixed ops and devices, completed-in-parts requests."""
    out = []
    for n, (i, lat, d, op, nbytes, pid) in enumerate(rows):
        row = {
            "layer": "block",
            "op": op,
            "issue_ns": i * 1000,
            "complete_ns": (i + lat) * 1000,
            "dev": "8:16" if one_device else d,
            "bytes": nbytes,
            "queue_depth": n + 1,
            "pid": pid,
        }
        out.append(row)
        if rnd.random() < 0.1:  # a request that completed in parts: same issue and depth
            out.append(dict(row, complete_ns=row["complete_ns"] + 5000, bytes=4096))
    if by_completion:
        out.sort(key=lambda r: r["complete_ns"])
    else:
        rnd.shuffle(out)
    d = tmp_path_factory.mktemp("native") / "t"
    write_trace(d, out, row_group_rows=group_rows, rows_per_segment=3 * group_rows + 1)
    if dev is not None and not any(r["dev"] == dev for r in out):
        dev = None
    fast, ref = _both_paths(d, dev=dev, bin_s=0.0005)
    assert _same(fast, ref), json.dumps([fast, ref], default=str)[:4000]
    fast, ref = _both_paths(d, pid=2) if any(r["pid"] == 2 for r in out) else (fast, ref)
    assert _same(fast, ref)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3_000),
            st.integers(0, 500),
            st.integers(1, 4),  # pid
            st.sampled_from(["read", "read", "write", "open", "close"]),
            st.sampled_from(["/d/a", "/d/b", "/d/c"]),
        ),
        min_size=1,
        max_size=80,
    ),
    st.integers(1, 7),
)
def test_analyze_native_equals_numpy_on_random_file_traces(tmp_path_factory, rows, group_rows):
    out = [
        {
            "layer": "file",
            "op": op,
            "issue_ns": i * 1000,
            "complete_ns": (i + lat) * 1000,
            "bytes": 0 if op in ("open", "close") else 65536,
            "queue_depth": n % 5 + 1,
            "pid": pid,
            "tid": pid,
            "comm": f"w{pid}",
            "file": f,
        }
        for n, (i, lat, pid, op, f) in enumerate(rows)
    ]
    out.sort(key=lambda r: r["complete_ns"])
    d = tmp_path_factory.mktemp("native-file") / "t"
    write_trace(d, out, row_group_rows=group_rows, rows_per_segment=2 * group_rows + 1)
    fast, ref = _both_paths(d, bin_s=0.001)
    assert _same(fast, ref)


def test_analyze_native_equals_numpy_past_the_exact_latency_limit(tmp_path: Path) -> None:
    """1.3 M requests: the latency sketch folds into its histogram part way through,
    after which the native path stops returning latencies."""
    rng = np.random.default_rng(11)
    n = 1_300_000
    issue = 10**12 + np.cumsum(rng.exponential(3000, n).astype(np.int64) + 100)
    complete = issue + rng.lognormal(np.log(50_000), 0.7, n).astype(np.int64)
    order = np.argsort(complete, kind="stable")
    sizes = np.where(rng.random(n) < 0.7, 131072, 4096).astype(np.int64)
    write_trace(
        tmp_path / "t",
        {
            "layer": np.full(n, "block"),
            "op": np.where(rng.random(n) < 0.8, "read", "write")[order],
            "issue_ns": issue[order],
            "complete_ns": complete[order],
            "dev": np.full(n, "259:0"),
            "bytes": sizes,
            "queue_depth": np.ones(n, np.uint32),
            "pid": np.full(n, 7, np.uint32),
        },
        row_group_rows=1 << 18,
        rows_per_segment=1 << 19,
    )
    fast, ref = _both_paths(tmp_path / "t")
    assert fast["latency_us"]["exact"] is False
    assert _same(fast, ref)


def test_count_rows_rejects_bad_input() -> None:
    a = np.arange(4, dtype=np.int64)
    with pytest.raises(ValueError, match="length"):
        NATIVE.count_rows(a, a[:3], a, None, None, 0, [0], [True], None, 0, 1, 8, True)
    with pytest.raises(ValueError, match="op code"):
        NATIVE.count_rows(a, a, a, None, a, 0, [0], [True], None, 0, 1, 8, True)
    with pytest.raises(ValueError, match="outside the timeline"):
        NATIVE.count_rows(a, a, a, None, None, 0, [0], [True], None, 0, 1, 2, True)
