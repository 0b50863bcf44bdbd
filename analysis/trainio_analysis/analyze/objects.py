"""The object layer's requests (schema 1.8) characterized per endpoint, as ``analyze``
characterizes a device: requests, sizes, latency and time to first byte, and the
requests outstanding, per request (at each issue) and over time.

An object layer has one row per HTTP request, thousands where the file layer has
millions of syscalls, so its rows are read whole (polars) and summarized exactly with
numpy, apart from the streaming pass that the storage layers need.

Example
-------
>>> object_requests("traces/s3-job")["endpoints"]["127.0.0.1:9000"]["requests"]  # doctest: +SKIP
17
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import polars as pl

from trainio_analysis import trace as tr
from trainio_analysis.analyze.sketch import pow2_label

MIB = 1 << 20
#: The CDF's probabilities (as analyze's latency_cdf_us: every percent, then finer).
CDF_POINTS = [i / 100 for i in range(1, 100)] + [0.99 + i / 1000 for i in range(1, 10)] + [0.999, 0.9999, 1.0]
TIMELINE_BINS = 200
_COLUMNS = (
    "op",
    "issue_ns",
    "complete_ns",
    "first_byte_ns",
    "bytes",
    "bytes_requested",
    "queue_depth",
    "endpoint",
    "http_status",
    "error",
)


def _percentiles_us(ns: np.ndarray) -> dict[str, float]:
    if ns.size == 0:
        return {k: float("nan") for k in ("p50", "p90", "p99", "p999", "max", "mean")}
    q = np.quantile(ns, [0.5, 0.9, 0.99, 0.999])
    return {
        "p50": float(q[0]) / 1e3,
        "p90": float(q[1]) / 1e3,
        "p99": float(q[2]) / 1e3,
        "p999": float(q[3]) / 1e3,
        "max": float(ns.max()) / 1e3,
        "mean": float(ns.mean()) / 1e3,
    }


def _size_counts(nbytes: np.ndarray) -> dict[str, int]:
    """Requests by body size, in power-of-two buckets labelled by their lower bound
    (0, 1, 2, 4, ... bytes), as analyze's size_counts."""
    buckets = np.where(nbytes > 0, np.floor(np.log2(np.maximum(nbytes, 1))).astype(np.int64) + 1, 0)
    values, counts = np.unique(buckets, return_counts=True)
    return {str(pow2_label(int(b))): int(n) for b, n in zip(values, counts, strict=True)}


def _outstanding(issue: np.ndarray, complete: np.ndarray, t0: int, t1: int) -> dict[str, Any]:
    """Requests outstanding over [t0, t1): the fraction of time with k outstanding
    (time-weighted), its mean, and the mean per timeline bin."""
    span = max(t1 - t0, 1)
    times = np.concatenate((issue, complete))
    steps = np.concatenate((np.ones(issue.size, np.int64), -np.ones(complete.size, np.int64)))
    # at one instant, completions before issues: a request that ends as the next starts
    # does not overlap it
    order = np.lexsort((steps, times))
    times, level = times[order], np.cumsum(steps[order])
    edges = np.concatenate(([t0], np.clip(times, t0, t1), [t1]))
    levels = np.concatenate(([0], level))
    widths = np.diff(edges)
    hist = np.bincount(levels, weights=widths, minlength=1) if levels.size else np.zeros(1)
    nbins = TIMELINE_BINS
    bin_ns = -(-span // nbins)
    bounds = t0 + bin_ns * np.arange(nbins + 1)
    # time-weighted mean per bin: integral of the level over the bin / bin width
    area = np.concatenate(([0.0], np.cumsum(widths * levels)))
    at = np.interp(bounds, edges, area)
    return {
        "qd_hist_time": {str(k): float(w) / span for k, w in enumerate(hist) if w > 0},
        "qd_mean_time": float((hist * np.arange(hist.size)).sum()) / span,
        "timeline": {
            "bin_s": bin_ns / 1e9,
            "t_s": [round(i * bin_ns / 1e9, 9) for i in range(nbins)],
            "qd_mean": (np.diff(at) / bin_ns).tolist(),
        },
    }


def _summary(df: pl.DataFrame, t0: int, t1: int) -> dict[str, Any]:
    issue = df["issue_ns"].to_numpy()
    complete = df["complete_ns"].to_numpy()
    latency = complete - issue
    first = df["first_byte_ns"]
    ttfb = (first - df["issue_ns"]).drop_nulls().to_numpy()
    sends = df["op"].is_in(["put", "post"]).to_numpy()
    moved = df["bytes"].to_numpy()
    qd = df["queue_depth"].to_numpy().astype(np.int64)
    qd_counts = np.bincount(qd) if qd.size else np.zeros(1, np.int64)
    whole = (df["error"] == 0).to_numpy()
    lat_sorted = np.sort(latency)
    out: dict[str, Any] = {
        "requests": df.height,
        "incomplete": int((~whole).sum()),
        "by_op": {op: int(n) for op, n in sorted(df["op"].value_counts().iter_rows())},
        "by_status": {
            str(s) if s is not None else "none": int(n)
            for s, n in sorted(df["http_status"].value_counts().iter_rows(), key=lambda x: (x[0] is None, x[0] or 0))
        },
        "bytes_read": int(moved[~sends].sum()),
        "bytes_written": int(moved[sends].sum()),
        "size_counts": _size_counts(moved),
        "latency_us": _percentiles_us(latency),
        "ttfb_us": _percentiles_us(ttfb),
        "latency_cdf_us": {
            "p": CDF_POINTS if latency.size else [],
            "us": [float(np.quantile(lat_sorted, p)) / 1e3 for p in CDF_POINTS] if latency.size else [],
        },
        "qd_hist_issue": {str(k): float(n) / qd.size for k, n in enumerate(qd_counts) if n},
        "qd_mean_issue": float(qd.mean()) if qd.size else 0.0,
        "qd_max": int(qd.max()) if qd.size else 0,
    }
    out.update(_outstanding(issue, complete, t0, t1))
    duration_s = (t1 - t0) / 1e9
    out["throughput_mib_s"] = (out["bytes_read"] + out["bytes_written"]) / MIB / duration_s if duration_s > 0 else 0.0
    return out


def object_requests(trace: str | os.PathLike[str] | tr.Trace) -> dict[str, Any] | None:
    """The object layer of a trace (a path, or the trace opened) summarized per endpoint;
    None when it has no object rows (a trace before 1.8, or recorded without
    ``--layers ...,object``)."""
    df = (
        tr.Trace.of(trace)
        .scan()
        .filter(pl.col("layer") == "object")
        .select(_COLUMNS)
        .with_columns(pl.col("op", "endpoint").cast(pl.String))
        .collect()
    )
    if df.height == 0:
        return None
    t0, t1 = int(df["issue_ns"].min()), int(df["complete_ns"].max())
    endpoints = {
        str(name): _summary(part.sort("issue_ns"), t0, t1)
        for (name,), part in sorted(df.group_by("endpoint"), key=lambda g: str(g[0][0]))
    }
    return {
        "requests": df.height,
        "start_ns": t0,
        "end_ns": t1,
        "duration_s": (t1 - t0) / 1e9,
        "endpoints": endpoints,
    }
