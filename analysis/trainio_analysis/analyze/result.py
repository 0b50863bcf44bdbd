"""Results: the analysis's JSON object, assembled from what the pass summed.

:func:`result` turns the plan (:mod:`trainio_analysis.analyze.plan`) and the pass's
:class:`Totals` into the object ``trainio analyze --json`` prints (docs/analysis.md,
*analyze --json*); the helpers here (histogram fractions and distances, bursts, the
latency CDF, the recording's description, the job model) are its parts.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from trainio_analysis import kernels
from trainio_analysis import trace as tr
from trainio_analysis.analyze.decode import Chunk, ProcessTotals
from trainio_analysis.analyze.plan import Plan
from trainio_analysis.analyze.qd_sweep import GroupState
from trainio_analysis.analyze.sketch import QuantileSketch, pow2_label
from trainio_analysis.errors import TraceError

MIB = float(1 << 20)

QD_DEFINITIONS = {
    "qd_hist_issue": "per-issue: fraction of requests that saw k in flight (incl. itself) "
    "when issued, from the kernel-recorded queue_depth column",
    "qd_hist_issue_computed": "per-issue, recomputed from issue_ns/complete_ns intervals",
    "qd_hist_time": "time-weighted: fraction of the trace's wall time with k in flight; its mean is iostat aqu-sz",
    "qd_hist_time_busy": "time-weighted over busy time only (k >= 1)",
}


@dataclass
class Totals:
    """What the pass summed over the row groups: the counts and data span (``acc``),
    the latency sketch, size buckets, the timelines (bytes read and written, and the
    integral of the requests in flight, per bin), the kernel's queue-depth histogram
    and the sweep's state per group, the sweep's state of the selection as a whole,
    and the file layer's per-process tallies and names."""

    acc: Chunk
    latency: QuantileSketch
    size_counts: np.ndarray
    tl_read: np.ndarray
    tl_write: np.ndarray
    tl_inflight: np.ndarray
    kernel_qd: dict[int, np.ndarray]
    groups: dict[int, GroupState]
    union_state: GroupState
    procs: ProcessTotals
    comms: dict[int, str]


def result(
    plan: Plan,
    totals: Totals,
    *,
    burst_gap_ms: float,
    with_model: bool = True,
    step_gap_ms: float | None = None,
    model_rows: Any = None,
) -> dict[str, Any]:
    """The JSON-ready result of the analysis (docs/analysis.md, *analyze --json*);
    ``model_rows``: the trace's rows the pass pushed for the job model (see
    :func:`job_model`), None to read them for it."""
    acc, latency, size_counts = totals.acc, totals.latency, totals.size_counts
    tl_read, tl_write, kernel_qd = totals.tl_read, totals.tl_write, totals.kernel_qd
    groups, union_state = totals.groups, totals.union_state
    duration_ns = max(plan.window, 1)
    duration_s = plan.window / 1e9
    total_kernel = _sum_hists(kernel_qd.values())
    total_issue = _sum_hists(g.hist_issue for g in groups.values())
    total_time = _sum_hists((g.hist_time for g in groups.values()), dtype=np.float64)
    n_groups = max(len(groups), 1)
    busy_ns = float(total_time[1:].sum())
    hist_k = _fractions(total_kernel)
    hist_c = _fractions(total_issue)
    data_bytes = acc.bytes_read + acc.bytes_written
    timeline_total = (tl_read + tl_write) / MIB / plan.bin_s
    active_s = (
        (acc.data_last_ns - acc.data_first_ns) / 1e9
        if acc.data_first_ns is not None and acc.data_last_ns is not None
        else 0.0
    )
    out: dict[str, Any] = {
        "trace": str(plan.path),
        "schema_version": tr.SCHEMA_VERSION,
        "selection": {
            "layer": plan.layer,
            "dev": plan.sel.dev,
            "pid": plan.sel.pid,
            "grouped_by": plan.group_col,
            "groups": len(plan.group_names),
        },
        "layers_present": plan.layers_present,
        "events": acc.events,
        "reads": acc.reads,
        "writes": acc.writes,
        "bytes_read": acc.bytes_read,
        "bytes_written": acc.bytes_written,
        "start_ns": plan.t0,
        "end_ns": plan.t1,
        "duration_s": duration_s,
        "throughput_mib_s": {
            "mean": data_bytes / MIB / duration_s if duration_s > 0 else 0.0,
            "read_mean": acc.bytes_read / MIB / duration_s if duration_s > 0 else 0.0,
            "write_mean": acc.bytes_written / MIB / duration_s if duration_s > 0 else 0.0,
            "peak": float(timeline_total.max()) if timeline_total.size else 0.0,
            "bin_s": plan.bin_s,
            "bin_auto": plan.bin_auto,
            "timeline": {
                "t_s": [round(i * plan.bin_s, 9) for i in range(plan.nbins)],
                "read": (tl_read / MIB / plan.bin_s).tolist(),
                "write": (tl_write / MIB / plan.bin_s).tolist(),
                "qd_mean": (totals.tl_inflight / plan.bin_ns / n_groups).tolist(),
            },
        },
        "active_s": active_s,
        "throughput_active_mib_s": data_bytes / MIB / active_s if active_s > 0 else 0.0,
        "iops": (acc.reads + acc.writes) / duration_s if duration_s > 0 else 0.0,
        "read_iops": acc.reads / duration_s if duration_s > 0 else 0.0,
        "write_iops": acc.writes / duration_s if duration_s > 0 else 0.0,
        "qd_definitions": QD_DEFINITIONS,
        "qd_hist_issue": hist_k,
        "qd_hist_issue_computed": hist_c,
        "qd_issue_agreement": {
            "w1": w1_distance(hist_k, hist_c),
            "max_abs_diff": max_abs_diff(hist_k, hist_c),
            "mean_kernel": hist_mean(hist_k),
            "mean_computed": hist_mean(hist_c),
        },
        "qd_mean_issue": hist_mean(hist_k),
        "qd_max": max((int(k) for k in hist_c), default=0),
        "qd_hist_time": _fractions(total_time, total=duration_ns * n_groups),
        "qd_hist_time_busy": _fractions(total_time[1:], offset=1),
        "qd_mean_time": _weighted_mean(total_time) / (duration_ns * n_groups),
        "qd_mean_time_busy": _weighted_mean(total_time) / busy_ns if busy_ns else 0.0,
        "utilization": busy_ns / (duration_ns * n_groups),
        "latency_us": {
            "p50": latency.quantile(0.5) / 1e3,
            "p90": latency.quantile(0.9) / 1e3,
            "p99": latency.quantile(0.99) / 1e3,
            "p999": latency.quantile(0.999) / 1e3,
            "max": latency.max / 1e3 if latency.count else float("nan"),
            "mean": latency.sum / latency.count / 1e3 if latency.count else float("nan"),
            "exact": latency.exact,
        },
        "latency_hist_us": _pow2_hist_us(latency),
        "latency_cdf_us": _cdf(latency),
        "size_hist": {
            str(pow2_label(b)): float(n) / max(int(size_counts.sum()), 1) for b, n in enumerate(size_counts) if n
        },
        "size_counts": {str(pow2_label(b)): int(n) for b, n in enumerate(size_counts) if n},
        "mean_size_bytes": data_bytes / (acc.reads + acc.writes) if acc.reads + acc.writes else 0.0,
        "idle_fraction": float(union_state.hist_time[0]) / duration_ns,
        "bursts": _bursts(union_state, burst_gap_ms, data_bytes),
        "idle_gap_hist_us": _pow2_hist_us(union_state.idle_gaps),
        "lost_events": _lost(plan.meta),
        "recording": recording(plan.meta, plan.path),
    }
    per_group = {}
    for gid, state in sorted(groups.items()):
        name = plan.group_names[gid]
        busy = state.busy_ns
        per_group[name] = {
            "qd_hist_issue": _fractions(kernel_qd.get(gid, np.zeros(0, np.int64))),
            "qd_hist_issue_computed": _fractions(state.hist_issue),
            "qd_hist_time": _fractions(state.hist_time, total=duration_ns),
            "qd_mean_time": _weighted_mean(state.hist_time) / duration_ns,
            "qd_mean_time_busy": _weighted_mean(state.hist_time) / busy if busy else 0.0,
            "utilization": busy / duration_ns,
            "bursts": _bursts(state, burst_gap_ms, None),
        }
    out["groups"] = per_group
    if with_model and "file" in plan.layers_present:
        out["job_model"] = job_model(plan.trace, step_gap_ms=step_gap_ms, rows=model_rows)
        if out["job_model"] is not None:
            out["write_bursts"] = out["job_model"]["writes"]
    if plan.layer == "file":
        out["steps"] = _steps(out.get("job_model"))
        out["processes"] = _processes(plan, totals, groups, out.get("job_model"))
    return out


def _processes(
    plan: Plan, totals: Totals, groups: dict[int, GroupState], model: dict[str, Any] | None
) -> list[dict[str, Any]]:
    gpu_of: dict[int, dict[str, Any]] = {}
    for gpu in (model or {}).get("gpus", []):
        for m in gpu["members"]:
            gpu_of[m["pid"]] = gpu
    procs = totals.procs
    files = procs.files_per_group()
    out = []
    for gid, name in enumerate(plan.group_names):
        reads = int(procs.reads[gid])
        nbytes = int(procs.bytes[gid])
        qd = procs.qd[gid] if gid < procs.qd.shape[0] else np.zeros(0, np.int64)
        levels = np.flatnonzero(qd)
        state = groups.get(gid)
        entry = {
            "pid": int(name),
            "comm": totals.comms.get(gid),
            "reads": reads,
            "bytes": nbytes,
            "files": int(files[gid]) if gid < files.size else 0,
            "mean_read_size": nbytes / reads if reads else 0.0,
            "concurrency": {
                "mean_issue": float((levels * qd[levels]).sum() / qd.sum()) if qd.sum() else 0.0,
                "max": int(levels[-1]) if levels.size else 0,
                "mean_time": (_weighted_mean(state.hist_time) / max(plan.window, 1) if state else 0.0),
            },
        }
        gpu = gpu_of.get(int(name))
        entry["gpu"] = gpu["index"] if gpu else None
        entry["compute_time_s"] = gpu["compute_s"] if gpu else None
        entry["required_mib_s_per_gpu"] = gpu["required_mib_s"] if gpu else None
        out.append(entry)
    return out


def _sum_hists(hists: Any, dtype: Any = np.int64) -> np.ndarray:
    total = np.zeros(0, dtype)
    for h in hists:
        if h.size > total.size:
            total = np.concatenate((total, np.zeros(h.size - total.size, dtype)))
        total[: h.size] += h
    return total


def _fractions(hist: np.ndarray, *, total: float | None = None, offset: int = 0) -> dict[str, float]:
    denom = float(hist.sum()) if total is None else float(total)
    if denom <= 0:
        return {}
    return {str(k + offset): float(v) / denom for k, v in enumerate(hist) if v}


def _weighted_mean(hist: np.ndarray) -> float:
    return float((np.arange(hist.size) * hist).sum())


def hist_mean(hist: dict[str, float]) -> float:
    """Mean of a {k: fraction} histogram."""
    return float(sum(int(k) * v for k, v in hist.items()))


def w1_distance(a: dict[str, float], b: dict[str, float]) -> float:
    """Wasserstein-1 (earth mover's) distance of two {k: fraction} histograms on the integers.

    W1 = sum over k of |CDF_a(k) - CDF_b(k)|, in units of k (queue-depth steps).
    """
    if not a or not b:
        return float("nan") if (a or b) else 0.0
    top = max(int(k) for k in [*a, *b])
    pa_ = np.zeros(top + 1)
    pb_ = np.zeros(top + 1)
    for k, v in a.items():
        pa_[int(k)] = v
    for k, v in b.items():
        pb_[int(k)] = v
    pa_ /= pa_.sum()
    pb_ /= pb_.sum()
    return float(np.abs(np.cumsum(pa_) - np.cumsum(pb_)).sum())


def max_abs_diff(a: dict[str, float], b: dict[str, float]) -> float:
    keys = set(a) | set(b)
    return max((abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys), default=0.0)


def _bursts(state: GroupState, gap_ms: float, nbytes: float | None) -> dict[str, Any]:
    """Burst statistics; every request lies in exactly one burst, so the mean bytes per
    burst is the selection's bytes over the burst count."""
    starts = state.burst_starts.array()
    ends = state.burst_ends.array()[: starts.size]
    n = int(min(starts.size, ends.size))
    gaps = state.burst_gaps.array().astype(np.float64)
    out: dict[str, Any] = {
        "gap_threshold_ms": gap_ms,
        "count": n,
        "mean_duration_s": float((ends[:n] - starts[:n]).mean()) / 1e9 if n else 0.0,
        "mean_gap_s": float(gaps.mean()) / 1e9 if gaps.size else 0.0,
        "median_gap_s": float(np.median(gaps)) / 1e9 if gaps.size else 0.0,
        "busy_periods": state.busy_periods,
    }
    if nbytes is not None:
        out["mean_bytes"] = nbytes / n if n else 0.0
    return out


def push_model_rows(model_rows: Any, rows: pa.Table) -> None:
    """One row group's rows into a ``_native.ModelRows``, in the trace's order; a row the
    model refuses raises TraceError with its one-line message."""
    try:
        model_rows.push(rows)
    except ValueError as e:
        raise TraceError(str(e)) from None


def job_model(
    trace: str | os.PathLike[str] | tr.Trace,
    *,
    grouping: str = "auto",
    step_gap_ms: float | None = None,
    gpus_per_process: int | None = None,
    compute_scale: float | None = None,
    rows: Any = None,
) -> dict[str, Any] | None:
    """The job model of a trace: the GPUs (a rank and its DataLoader workers), their
    steps, compute time per step and the throughput one GPU needs. ``gpus_per_process``
    and ``compute_scale`` are the what-ifs of ``trainio replay --trace``'s
    ``--gpus-per-process`` and ``--compute-scale`` (docs/replay.md).

    Computed by the native extension from crate ``trainio-model``, the same code that
    ``trainio replay --trace`` replays from (docs/analysis.md, *Job model*), on the rows
    read here (:meth:`~trainio_analysis.trace.Trace.row_batches`, a set's one member at
    a time): the extension opens no file. ``rows``: the trace's rows pushed already into a
    ``_native.ModelRows`` by a pass that decoded them (the analyzer's), not read again
    here; for a trace set, one per member in member order. None when the extension is
    not built.
    """
    mod = kernels.module()
    if mod is None or not hasattr(mod, "job_model"):
        return None
    trace = tr.Trace.of(trace)
    failed: list[Exception] = []

    def member_rows(t: tr.Trace) -> pa.RecordBatchReader:
        def batches() -> Iterator[pa.RecordBatch]:
            try:
                yield from t.row_batches()
            except Exception as exc:  # the extension sees a failed stream; raised again below
                failed.append(exc)
                raise

        return pa.RecordBatchReader.from_batches(tr.ROWS_SCHEMA, batches())

    if trace.members is None:
        parts = [(str(trace.path), None, member_rows(trace) if rows is None else rows)]
    else:
        pushed = rows if rows is not None else [None] * len(trace.members)
        parts = [
            (str(m.path), (m.host, m.shift_ns), member_rows(t) if r is None else r)
            for m, t, r in zip(trace.members, trace.member_traces, pushed, strict=True)
        ]
    try:
        return json.loads(mod.job_model(parts, grouping, step_gap_ms, gpus_per_process, compute_scale))
    except ValueError as e:
        if failed:
            raise failed[0] from None
        raise TraceError(str(e)) from None


def _steps(model: dict[str, Any] | None) -> dict[str, Any]:
    """The job's steps and needs, from the job model (``job_model``): steps summed over
    GPUs, the median GPU's compute time, bytes per step and MiB/s per GPU."""
    if not model:
        return {
            "steps": 0,
            "gpus": 0,
            "compute_time_s": None,
            "bytes_per_step": None,
            "required_mib_s_per_gpu": None,
        }
    return {
        "steps": model["steps"],
        "gpus": len(model["gpus"]),
        "compute_time_s": model["compute_s"],
        "bytes_per_step": model["bytes_per_step"],
        "required_mib_s_per_gpu": model["required_mib_s_per_gpu"],
    }


def _pow2_hist_us(sketch: QuantileSketch) -> dict[str, int]:
    low, counts = sketch.histogram()
    out: dict[str, int] = {}
    for lo, n in zip(low, counts, strict=True):
        us = lo / 1e3
        key = "0" if us < 1 else str(1 << int(math.floor(math.log2(us))))
        out[key] = out.get(key, 0) + int(n)
    return out


CDF_POINTS = (
    [i / 100 for i in range(100)]
    + [round(0.99 + i / 1000, 4) for i in range(1, 10)]
    + [round(0.999 + i / 10_000, 4) for i in range(1, 10)]
    + [1.0]
)


def _cdf(sketch: QuantileSketch) -> dict[str, list[float]]:
    """The latency distribution as quantiles on a fixed grid of probabilities (every
    percent, then every 0.1 % above 99 % and every 0.01 % above 99.9 %): a CDF to draw
    that stays ~120 points whatever the trace's size."""
    if not sketch.count:
        return {"p": [], "us": []}
    return {"p": CDF_POINTS, "us": [sketch.quantile(p) / 1e3 for p in CDF_POINTS]}


def recording(meta: dict[str, Any], path: str | os.PathLike[str]) -> dict[str, Any]:
    """Where and when the trace was recorded, from its metadata (traces/SCHEMA.md):
    host, kernel, command (or other target), start time (UTC), duration, devices."""
    import datetime as dt

    start, end, offset = meta.get("start_ns"), meta.get("end_ns"), meta.get("clock_offset_ns")
    started = None
    if isinstance(start, int) and isinstance(offset, int) and start + offset > 0:
        started = (
            dt.datetime.fromtimestamp((start + offset) / 1e9, dt.UTC)
            .isoformat(timespec="seconds")
            .replace("+00:00", "Z")
        )
    target = meta.get("target") if isinstance(meta.get("target"), dict) else {}
    command = None
    if isinstance(target.get("command"), list):
        command = " ".join(str(a) for a in target["command"])
    elif "pid" in target:
        command = f"--pid {target['pid']}"
    elif "cgroup" in target:
        command = f"--cgroup {target['cgroup']}"
    elif target.get("all"):
        command = "all processes"
    events = meta.get("events") if isinstance(meta.get("events"), dict) else {}
    devices = []
    for d in meta.get("devices") or []:
        if not isinstance(d, dict):
            continue
        # the block devices and NFS mounts of the recording: a pseudo file system
        # (proc, sysfs, tmpfs: no size, no source) is only there for its mounts
        if not d.get("size_bytes") and not str(d.get("name", "")).count(":"):
            continue
        devices.append(
            {
                "dev": d.get("dev"),
                "name": d.get("name"),
                "size_bytes": d.get("size_bytes"),
                "mounts": [
                    f"{m.get('mount_point')} ({m.get('fstype')})" for m in d.get("mounts") or [] if isinstance(m, dict)
                ],
            }
        )
    source = meta.get("source") if isinstance(meta.get("source"), dict) else {}
    return {
        "host": meta.get("hostname"),
        "kernel": meta.get("kernel_release"),
        "command": command,
        "started_utc": started,
        "duration_s": (end - start) / 1e9 if isinstance(start, int) and isinstance(end, int) and end >= start else None,
        "devices": devices,
        "layers": meta.get("layers") if isinstance(meta.get("layers"), list) else sorted(events),
        "tracer_version": meta.get("tracer_version"),
        "source": source.get("format"),
        # 1.9: False when the recording was cut off (killed recorder, lost host)
        "complete": tr.recording_complete(meta),
        "end_reason": meta["end"].get("reason") if isinstance(meta.get("end"), dict) else None,
    }


def _lost(meta: dict[str, Any]) -> dict[str, Any]:
    lost = meta.get("lost_events") or {}
    by_probe = {str(k): int(v) for k, v in lost.items()} if isinstance(lost, dict) else {}
    total = sum(by_probe.values())
    return {"total": total, "by_probe": by_probe, "complete": total == 0}
