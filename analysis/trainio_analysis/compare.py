"""Fidelity of one trace against another: how well a replay reproduces a recorded job.

Scores (B against reference A, same layer and selection):

- ``throughput_rel_error``: (B - A) / A of the MiB/s over the active span, first data
  request to last (signed; 0 is perfect). The recording windows also hold start-up
  (mpirun, the replay's checks) that a replay does not reproduce;
  ``throughput_window_rel_error`` is the same over the whole recordings.
- ``qd_w1_issue`` / ``qd_w1_time``: Wasserstein-1 distance between the per-issue and the
  time-weighted queue-depth histograms, in queue-depth units (0 is identical; 1 means
  on average one request deeper or shallower).
- ``size_w1_log2``: W1 of the request-size distributions over power-of-two buckets, in
  octaves (1.0 = every request twice or half the size).
- ``latency_p50_ratio`` / ``latency_p99_ratio``: B / A (1 is perfect).
- ``writes``: the write bursts of both (file layer, the job model's ``writes``): bytes,
  bursts, MiB/s while writing, and (B - A) / A of the bytes and of the MiB/s.
"""

from __future__ import annotations

import math
import os
from typing import Any

from trainio_analysis import trace as tr
from trainio_analysis.analyze import analyze, load_trace
from trainio_analysis.analyze.result import job_model, w1_distance


def _ratio(b: float | None, a: float | None) -> float | None:
    if a is None or b is None or not math.isfinite(a) or not math.isfinite(b) or a == 0:
        return None
    return b / a


def _octaves(size_hist: dict[str, float]) -> dict[str, float]:
    """Re-key a size histogram by octave index (0 bytes -> 0, [1,2) -> 1, ...)."""
    out: dict[str, float] = {}
    for k, v in size_hist.items():
        n = int(k)
        out[str(0 if n == 0 else n.bit_length())] = v
    return out


def scores(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Fidelity scores from two :func:`analyze` results."""
    ta, tb = a["throughput_active_mib_s"], b["throughput_active_mib_s"]
    rel = (tb - ta) / ta if ta else None
    wa, wb = a["throughput_mib_s"]["mean"], b["throughput_mib_s"]["mean"]
    return {
        "throughput_mib_s": {"a": ta, "b": tb},
        "throughput_rel_error": rel,
        "throughput_abs_rel_error": abs(rel) if rel is not None else None,
        "throughput_window_mib_s": {"a": wa, "b": wb},
        "throughput_window_rel_error": (wb - wa) / wa if wa else None,
        "iops_rel_error": (b["iops"] - a["iops"]) / a["iops"] if a["iops"] else None,
        "qd_w1_issue": w1_distance(a["qd_hist_issue"], b["qd_hist_issue"]),
        "qd_w1_issue_computed": w1_distance(a["qd_hist_issue_computed"], b["qd_hist_issue_computed"]),
        "qd_w1_time": w1_distance(a["qd_hist_time"], b["qd_hist_time"]),
        "qd_w1_time_busy": w1_distance(a["qd_hist_time_busy"], b["qd_hist_time_busy"]),
        "qd_mean_time": {"a": a["qd_mean_time"], "b": b["qd_mean_time"]},
        "size_w1_log2": w1_distance(_octaves(a["size_hist"]), _octaves(b["size_hist"])),
        "latency_p50_ratio": _ratio(b["latency_us"]["p50"], a["latency_us"]["p50"]),
        "latency_p99_ratio": _ratio(b["latency_us"]["p99"], a["latency_us"]["p99"]),
        "idle_fraction": {"a": a["idle_fraction"], "b": b["idle_fraction"]},
        "bytes_read": {"a": a["bytes_read"], "b": b["bytes_read"]},
    }


def _rel(b: float | None, a: float | None) -> float | None:
    r = _ratio(b, a)
    return None if r is None else r - 1.0


def write_scores(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any] | None:
    """B's write bursts against A's, from the job models' ``writes``; None when either
    trace has no file layer."""
    if a is None or b is None:
        return None
    keys = ("count", "bytes", "syncs", "duration_s", "mib_s", "interval_s")
    return {
        **{k: {"a": a[k], "b": b[k]} for k in keys},
        "bytes_rel_error": _rel(b["bytes"], a["bytes"]),
        "mib_s_rel_error": _rel(b["mib_s"], a["mib_s"]),
    }


def _writes(trace: tr.Trace, analysis: dict[str, Any]) -> dict[str, Any] | None:
    """The write bursts of the trace's job model: the one its analysis built from the
    rows it decoded (a trace with file rows), read apart only where the analysis built
    none."""
    if "file" not in (trace.meta.get("layers") or []):
        return None
    m = analysis["job_model"] if "job_model" in analysis else job_model(trace)
    return None if m is None else m["writes"]


def compare(
    a: str | os.PathLike[str],
    b: str | os.PathLike[str],
    *,
    layer: str | None = None,
    dev: str | None = None,
    pid: int | None = None,
    bin_s: float | None = None,
    burst_gap_ms: float = 10.0,
) -> dict[str, Any]:
    """Analyze both traces with the same options and score B against A.

    When no layer is given, B is analyzed at the layer chosen for A.
    """
    ta = load_trace(a)
    ra = analyze(ta, layer=layer, dev=dev, pid=pid, bin_s=bin_s, burst_gap_ms=burst_gap_ms)
    layer = layer or ra["selection"]["layer"]
    tb = load_trace(b)
    rb = analyze(tb, layer=layer, dev=dev, pid=pid, bin_s=bin_s, burst_gap_ms=burst_gap_ms)
    writes = write_scores(_writes(ta, ra), _writes(tb, rb))
    return {"a": str(a), "b": str(b), "layer": layer, **scores(ra, rb), "writes": writes}


def format_compare(r: dict[str, Any]) -> str:
    def f(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    tp = r["throughput_mib_s"]
    w = r.get("writes")
    write_lines = []
    if w and (w["bytes"]["a"] or w["bytes"]["b"]):
        write_lines.append(
            f"  writes            A {w['bytes']['a'] / 2**20:.2f} MiB in {w['count']['a']} burst(s) at "
            f"{f(w['mib_s']['a'], '.1f')} MiB/s  B {w['bytes']['b'] / 2**20:.2f} MiB in "
            f"{w['count']['b']} burst(s) at {f(w['mib_s']['b'], '.1f')} MiB/s  rel. error bytes "
            f"{f(w['bytes_rel_error'], '+.1%')}, MiB/s {f(w['mib_s_rel_error'], '+.1%')}"
        )
    return "\n".join(
        [
            f"compare A={r['a']}  B={r['b']}  (layer {r['layer']})",
            f"  throughput        A {tp['a']:.1f} MiB/s  B {tp['b']:.1f} MiB/s  "
            f"rel. error {f(r['throughput_rel_error'], '+.1%')}  (active span; "
            f"whole recording {f(r['throughput_window_rel_error'], '+.1%')})",
            f"  QD W1 per-issue   {f(r['qd_w1_issue'], '.3f')}  (computed {f(r['qd_w1_issue_computed'], '.3f')})",
            f"  QD W1 time        {f(r['qd_w1_time'], '.3f')}  (busy-only {f(r['qd_w1_time_busy'], '.3f')})",
            f"  size W1           {f(r['size_w1_log2'], '.3f')} octaves",
            f"  latency B/A       p50 {f(r['latency_p50_ratio'], '.2f')}  p99 {f(r['latency_p99_ratio'], '.2f')}",
            *write_lines,
        ]
    )
