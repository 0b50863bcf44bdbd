"""One self-contained HTML report of one or more traces (plotly.js inlined, works offline).

Several traces are drawn side by side in every plot (e.g. the same training job with 1
and with 8 GPUs), so a storage engineer sees how the queue-depth distribution moves.
The file is written to a temporary name in the same directory and renamed, so a reader
never sees half a report.
"""

from __future__ import annotations

import html
import json
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from trainio_analysis.analyze import analyze
from trainio_analysis.errors import SelectionError, TrainioError
from trainio_analysis.model import JobModel, parse_job_model

PLOT_IDS = (
    "timeline",
    "qd-issue",
    "qd-time",
    "qd-time-busy",
    "sizes",
    "latency-cdf",
    "gaps",
    "gpus",
)
SWEEP_ID = "sweep"
#: drawn when a trace has object-layer requests (schema 1.8)
OBJECT_PLOT_IDS = ("object-latency-cdf", "object-outstanding", "object-qd-issue", "object-sizes")
# points per trace in a time plot: more bins than this are averaged into wider ones for
# drawing only (the figures and analyze --json keep every bin)
MAX_PLOT_POINTS = 2000


def _label(path: str, others: list[str]) -> str:
    name = Path(path).name or path
    return name if [Path(o).name for o in others].count(name) == 1 else path


def _bytes_label(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def _us_label(us: int) -> str:
    if us >= 1_000_000:
        return f"{us / 1e6:.3g} s"
    if us >= 1000:
        return f"{us / 1e3:.3g} ms"
    return f"{us} µs"


def _seconds(s: float | None) -> str:
    if s is None:
        return "–"
    if s >= 1:
        return f"{s:.3g} s"
    return f"{s * 1e3:.3g} ms"


def _bars(
    results: list[tuple[str, dict[str, Any]]],
    key: str,
    *,
    title: str,
    xaxis: str,
    yaxis: str,
    fmt: Any = str,
    skip: set[str] | None = None,
    total: bool = True,
) -> go.Figure:
    fig = go.Figure()
    skip = skip or set()
    all_keys = sorted({int(k) for _, r in results for k in r[key] if k not in skip})
    for name, r in results:
        hist = r[key]
        denom = (sum(hist.values()) or 1) if total else 1
        fig.add_trace(
            go.Bar(
                name=name,
                x=[fmt(k) for k in all_keys],
                y=[hist.get(str(k), 0) / denom for k in all_keys],
            )
        )
    fig.update_layout(
        barmode="group",
        title=title,
        xaxis_title=xaxis,
        yaxis_title=yaxis,
        xaxis_type="category",
        yaxis_tickformat=".1%",
    )
    return fig


def decimate(t: list[float], *series: list[float], limit: int = MAX_PLOT_POINTS) -> tuple[Any, ...]:
    """Average runs of consecutive bins into at most ``limit`` wider bins (for drawing:
    a mean over a wider bin is still MiB/s and mean queue depth); returns the bin starts,
    the series and the factor (1: untouched)."""
    n = len(t)
    if n <= limit:
        return (t, *series, 1)
    factor = -(-n // limit)
    m = -(-n // factor)
    out = []
    for values in series:
        a = np.zeros(m * factor)
        a[:n] = values
        sums = a.reshape(m, factor).sum(axis=1)
        counts = np.full(m, factor, float)
        counts[-1] = n - (m - 1) * factor
        out.append((sums / counts).tolist())
    return (t[::factor], *out, factor)


def _timeline(results: list[tuple[str, dict[str, Any]]]) -> go.Figure:
    """Per trace two rows on one time axis: read and write MiB/s, and mean queue depth."""
    n = len(results)
    titles = []
    for name, r in results:
        b = r["throughput_mib_s"]["bin_s"]
        titles += [f"{name}: throughput per {_seconds(b)} bin", f"{name}: queue depth (mean per bin)"]
    fig = make_subplots(
        rows=2 * n,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06 / max(n, 1),
        subplot_titles=titles,
    )
    for i, (name, r) in enumerate(results):
        tp = r["throughput_mib_s"]
        tl = tp["timeline"]
        t, rd, wr, qd, factor = decimate(tl["t_s"], tl["read"], tl["write"], tl["qd_mean"])
        if factor > 1:
            fig.layout.annotations[2 * i].text += f" (drawn at {_seconds(tp['bin_s'] * factor)})"
        mode = "lines+markers" if len(t) <= 60 else "lines"
        row = 2 * i + 1
        fig.add_trace(
            go.Scatter(
                name=f"{name} read", x=t, y=rd, mode=mode, line_shape="hv", legendgroup=name, line_color="#1f77b4"
            ),
            row=row,
            col=1,
        )
        if any(wr):
            fig.add_trace(
                go.Scatter(
                    name=f"{name} write", x=t, y=wr, mode=mode, line_shape="hv", legendgroup=name, line_color="#d62728"
                ),
                row=row,
                col=1,
            )
        fig.add_trace(
            go.Scatter(
                name=f"{name} queue depth",
                x=t,
                y=qd,
                mode=mode,
                line_shape="hv",
                legendgroup=name,
                line_color="#2ca02c",
                fill="tozeroy",
            ),
            row=row + 1,
            col=1,
        )
        fig.update_yaxes(title_text="MiB/s", row=row, col=1, rangemode="tozero")
        fig.update_yaxes(title_text="queue depth", row=row + 1, col=1, rangemode="tozero")
    fig.update_xaxes(title_text="time since trace start (s)", row=2 * n, col=1)
    fig.update_layout(title="Throughput (reads and writes apart) and queue depth over time", height=260 * 2 * n + 120)
    return fig


def _latency_cdf(results: list[tuple[str, dict[str, Any]]]) -> go.Figure:
    fig = go.Figure()
    colors = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")
    for i, (name, r) in enumerate(results):
        cdf = r["latency_cdf_us"]
        color = colors[i % len(colors)]
        fig.add_trace(go.Scatter(name=name, x=cdf["us"], y=cdf["p"], mode="lines", line_color=color))
        lat = r["latency_us"]
        marks = [
            (k, label)
            for k, label in (("p50", "p50"), ("p99", "p99"), ("p999", "p99.9"))
            if lat.get(k) is not None and lat[k] == lat[k]
        ]
        fig.add_trace(
            go.Scatter(
                name=f"{name} p50 / p99 / p99.9",
                x=[lat[k] for k, _ in marks],
                y=[{"p50": 0.5, "p99": 0.99, "p999": 0.999}[k] for k, _ in marks],
                text=[f"{label} {_us_label(int(lat[k])) if lat[k] >= 1 else f'{lat[k]:.2f} µs'}" for k, label in marks],
                mode="markers+text",
                textposition="middle left",
                marker={"size": 9, "color": color, "symbol": "diamond"},
                showlegend=False,
            )
        )
    fig.update_layout(
        title="Latency CDF (issue to completion) with p50, p99, p99.9",
        xaxis_title="latency (µs, log scale)",
        yaxis_title="fraction of requests ≤ x",
        xaxis_type="log",
        yaxis_tickformat=".0%",
    )
    return fig


@dataclass(frozen=True)
class _GpuBar:
    """One bar of the per-GPU figure: a job model's GPU or a replay's simulated GPU."""

    index: int
    bytes: int
    rank_pid: int
    comm: str
    processes: int
    compute_s: float
    required_mib_s: float


def _model_bars(m: JobModel) -> list[_GpuBar]:
    """The job model's GPUs: a rank and its workers, with their compute and need."""
    return [
        _GpuBar(
            index=g.index,
            bytes=g.bytes,
            rank_pid=g.rank_pid,
            comm=g.comm,
            processes=len(g.members),
            compute_s=g.compute_s or 0,
            required_mib_s=g.required_mib_s or 0,
        )
        for g in m.gpus
    ]


def _replay_bars(r: dict[str, Any]) -> list[_GpuBar]:
    """A replay's simulated GPUs, from its results: the bytes each read and its compute
    per step."""
    bars = []
    for g in r.get("per_gpu", []):
        steps = g.get("steps") or 0
        compute = g["compute_s"] / steps if steps else 0
        bars.append(
            _GpuBar(
                index=g["gpu"],
                bytes=g["bytes_read"],
                rank_pid=g["rank"],
                comm="replay rank",
                processes=1,
                compute_s=compute,
                required_mib_s=g["bytes_read"] / steps / compute / 2**20 if steps and compute else 0,
            )
        )
    return bars


def _job_models(files: list[tuple[str, dict[str, Any] | None]]) -> list[JobModel | None]:
    """The typed job model of each file-layer analysis (None: no file layer, or no model)."""
    out: list[JobModel | None] = []
    for name, fr in files:
        raw = (fr or {}).get("job_model")
        out.append(None if raw is None else parse_job_model(raw, source=name))
    return out


def _gpus(
    results: list[tuple[str, dict[str, Any]]],
    files: list[tuple[str, dict[str, Any] | None]],
    replays: list[dict[str, Any] | None],
) -> go.Figure:
    """Per GPU of the job model (a rank and its workers; launchers left out) or of a
    replay's results, else per process, else per device."""
    fig = go.Figure()
    bars = [
        (name, _replay_bars(rp) if rp is not None else _model_bars(m) if m is not None else [])
        for (name, _), m, rp in zip(files, _job_models(files), replays, strict=True)
    ]
    if any(gpus for _, gpus in bars):
        for name, gpus in bars:
            if not gpus:
                continue
            fig.add_trace(
                go.Bar(
                    name=name,
                    x=[f"GPU {g.index}" for g in gpus],
                    y=[g.bytes / 2**20 for g in gpus],
                    customdata=[[g.rank_pid, g.comm, g.processes, g.compute_s, g.required_mib_s] for g in gpus],
                    hovertemplate="%{y:.1f} MiB, rank %{customdata[0]} %{customdata[1]}, "
                    "%{customdata[2]} processes, compute %{customdata[3]:.3f} s/step, "
                    "needs %{customdata[4]:.1f} MiB/s<extra></extra>",
                )
            )
        fig.update_layout(
            barmode="group",
            title="Per GPU (rank + its DataLoader workers; launcher processes left out): data read",
            xaxis_title="GPU (job model)",
            yaxis_title="MiB read",
            xaxis_type="category",
        )
        return fig
    if any(fr and fr.get("processes") for _, fr in files):
        for name, fr in files:
            if fr is None:
                continue
            procs = [p for p in fr.get("processes", []) if p["bytes"]]
            fig.add_trace(
                go.Bar(
                    name=name,
                    x=[f"{p['pid']} {p['comm'] or ''}".strip() for p in procs],
                    y=[p["bytes"] / 2**20 for p in procs],
                )
            )
        fig.update_layout(
            barmode="group",
            title="Per process read streams (no job model: the analyzer's native extension is not built)",
            xaxis_title="process",
            yaxis_title="MiB read",
            xaxis_type="category",
        )
        return fig
    for name, r in results:
        groups = r["groups"]
        fig.add_trace(go.Bar(name=name, x=list(groups), y=[g["utilization"] for g in groups.values()]))
    fig.update_layout(
        barmode="group",
        xaxis_type="category",
        yaxis_tickformat=".0%",
        title=f"Per-{results[0][1]['selection']['grouped_by']} streams: utilization (no file layer recorded)",
        xaxis_title=results[0][1]["selection"]["grouped_by"],
        yaxis_title="busy time",
    )
    return fig


def _sweep_need(sw: dict[str, Any]) -> str:
    """What one simulated accelerator of a workload sweep needs (record × batch / compute
    time, `per_gpu_need_mib_s`), and the supported count's total; empty without it."""
    need = sw.get("per_gpu_need_mib_s")
    if not isinstance(need, int | float) or isinstance(need, bool):
        return ""
    who = f"simulated {sw['accelerator']}" if isinstance(sw.get("accelerator"), str) else "simulated GPU"
    total = need * int(sw["supported_gpus"])
    return html.escape(
        f"; one {who} needs {need:.1f} MiB/s at 100% AU, {int(sw['supported_gpus'])} of them {total:.1f} MiB/s"
    )


def _sweep_figure(sweeps: list[tuple[str, dict[str, Any]]]) -> go.Figure:
    fig = go.Figure()
    threshold = None
    for name, sw in sweeps:
        curve = sorted(sw["curve"], key=lambda c: c["gpus"])
        threshold = sw.get("threshold_percent", threshold)
        fig.add_trace(
            go.Scatter(
                name=f"{name}: AU (supported {sw['supported_gpus']})",
                x=[c["gpus"] for c in curve],
                y=[c["au_percent"] for c in curve],
                mode="lines+markers",
                marker={"symbol": ["circle" if c.get("pass") else "x" for c in curve], "size": 9},
            )
        )
        if all("au_min_percent" in c for c in curve):
            fig.add_trace(
                go.Scatter(
                    name=f"{name}: slowest GPU's AU",
                    x=[c["gpus"] for c in curve],
                    y=[c["au_min_percent"] for c in curve],
                    mode="lines",
                    line_dash="dot",
                )
            )
    if threshold is not None:
        fig.add_hline(y=threshold, line_dash="dash", annotation_text=f"threshold {threshold:g} %")
    fig.update_layout(
        title="Sweep: accelerator utilization (AU) vs simulated GPUs",
        xaxis_title="simulated GPUs",
        yaxis_title="AU (%)",
        xaxis_type="log",
    )
    return fig


def _object_streams(results: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """(trace · endpoint, summary) of every endpoint of the traces' object layers."""
    out = []
    for name, r in results:
        for endpoint, e in ((r.get("object_requests") or {}).get("endpoints") or {}).items():
            out.append((f"{name} · {endpoint}" if len(results) > 1 else endpoint, e))
    return out


def _object_figures(streams: list[tuple[str, dict[str, Any]]]) -> dict[str, go.Figure]:
    """The object layer's requests per endpoint, drawn as the storage layer's are."""
    figs = {}
    cdf = _latency_cdf(streams)
    cdf.update_layout(title="Object requests: latency CDF (request sent to last body byte) with p50, p99, p99.9")
    figs["object-latency-cdf"] = cdf
    fig = go.Figure()
    for name, e in streams:
        tl = e["timeline"]
        fig.add_trace(go.Scatter(name=name, x=tl["t_s"], y=tl["qd_mean"], mode="lines", line_shape="hv"))
    fig.update_layout(
        title="Object requests outstanding per endpoint over time (time-weighted mean per bin)",
        xaxis_title="seconds since the first request",
        yaxis_title="requests outstanding",
    )
    figs["object-outstanding"] = fig
    figs["object-qd-issue"] = _bars(
        streams,
        "qd_hist_issue",
        title="Object requests outstanding at each issue (the endpoint's queue depth, incl. itself)",
        xaxis="requests outstanding k",
        yaxis="requests",
    )
    figs["object-sizes"] = _bars(
        streams,
        "size_counts",
        title="Object request sizes: body bytes moved (power-of-two buckets)",
        xaxis="body size ≥",
        yaxis="requests",
        fmt=_bytes_label,
    )
    return figs


def _object_table(streams: list[tuple[str, dict[str, Any]]]) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{e['requests']}</td><td>{e['incomplete']}</td>"
        f"<td>{html.escape(', '.join(f'{k} {v}' for k, v in e['by_op'].items()))}</td>"
        f"<td>{html.escape(', '.join(f'{k} {v}' for k, v in e['by_status'].items()))}</td>"
        f"<td>{e['bytes_read'] / 2**20:.1f}</td><td>{e['bytes_written'] / 2**20:.1f}</td>"
        f"<td>{e['ttfb_us']['p50']:.0f}</td><td>{e['latency_us']['p50']:.0f}</td>"
        f"<td>{e['latency_us']['p99']:.0f}</td><td>{e['qd_mean_time']:.2f}</td><td>{e['qd_max']}</td></tr>"
        for name, e in streams
    )
    return (
        "<h2>Object requests (HTTP, per endpoint)</h2><table><tr><th>endpoint</th><th>requests</th>"
        "<th>incomplete</th><th>methods</th><th>statuses</th><th>MiB read</th><th>MiB written</th>"
        "<th>first byte p50 µs</th><th>latency p50 µs</th><th>latency p99 µs</th>"
        f"<th>outstanding (time mean)</th><th>outstanding max</th></tr>{rows}</table>"
    )


def _figures(
    results: list[tuple[str, dict[str, Any]]],
    files: list[tuple[str, dict[str, Any] | None]],
    sweeps: list[tuple[str, dict[str, Any]]],
    replays: list[dict[str, Any] | None],
) -> dict[str, go.Figure]:
    figs: dict[str, go.Figure] = {"timeline": _timeline(results)}
    figs["qd-issue"] = _bars(
        results,
        "qd_hist_issue",
        title="Queue depth per issue (fraction of requests that saw k in flight, incl. itself)",
        xaxis="queue depth k",
        yaxis="requests",
    )
    idle = ", ".join(f"{name} {r['qd_hist_time'].get('0', 0.0):.1%}" for name, r in results)
    figs["qd-time"] = _bars(
        results,
        "qd_hist_time",
        skip={"0"},
        total=False,
        title=f"Queue depth time-weighted, k ≥ 1 (k = 0, nothing in flight: {idle} of the time, not drawn)",
        xaxis="queue depth k",
        yaxis="fraction of wall time",
    )
    figs["qd-time-busy"] = _bars(
        results,
        "qd_hist_time_busy",
        title="Queue depth time-weighted, busy time only (k ≥ 1)",
        xaxis="queue depth k",
        yaxis="fraction of busy time",
    )
    figs["sizes"] = _bars(
        results,
        "size_hist",
        title="Request sizes (power-of-two buckets)",
        xaxis="request size ≥",
        yaxis="requests",
        fmt=_bytes_label,
    )
    figs["latency-cdf"] = _latency_cdf(results)
    figs["gaps"] = _bars(
        results,
        "idle_gap_hist_us",
        title="Idle gaps between busy periods",
        xaxis="idle gap ≥",
        yaxis="gaps",
        fmt=_us_label,
    )
    figs["gpus"] = _gpus(results, files, replays)
    if sweeps:
        figs[SWEEP_ID] = _sweep_figure(sweeps)
    return figs


def _summary(
    results: list[tuple[str, dict[str, Any]]],
    files: list[tuple[str, dict[str, Any] | None]],
    sweeps: list[tuple[str, dict[str, Any]]],
    replays: list[dict[str, Any] | None],
) -> str:
    """The summary panel: one column per trace. A job's recording shows its job model; a
    replay's own recording shows the replay's results (GPUs, AU, steps, bytes per GPU)."""

    models = _job_models(files)

    def job(k: int, what: str) -> str:
        """One figure of the job a trace holds: the replay's results, else its job model."""
        rp = replays[k]
        m = models[k]
        if rp is not None and "per_gpu" not in rp and rp.get("runs"):
            rp = rp["runs"][-1]  # `--runs N`: the last run, the one recorded last
        if rp is not None:
            s = rp.get("settings") or {}
            gpu_steps = rp.get("gpu_steps") or 0
            return {
                "gpus": f"{rp.get('gpus', 0)} simulated (the replay's results)",
                "compute": _seconds(s.get("computation_time_mean_s")),
                "bytes_step": _bytes_label(int(rp.get("bytes_read", 0) / gpu_steps)) if gpu_steps else "–",
                "need": mib_s(s.get("required_mib_s_per_gpu")),
                "left_out": "– (a replay)",
                "au": f"{rp['au_percent']:.2f} % (min {rp['au_min_percent']:.2f} %), "
                f"{'PASS' if rp.get('pass') else 'FAIL'} at {rp.get('threshold_percent', 90):g} %"
                if "au_percent" in rp
                else "–",
                "steps": f"{rp.get('steps', 0)} per GPU, {gpu_steps} in all" if "steps" in rp else "–",
                "bytes_gpu": _bytes_label(int(rp.get("bytes_read", 0) / max(1, rp.get("gpus", 1)))),
            }[what]
        if m is None:
            return "–"
        gpus = m.gpus
        return {
            "gpus": str(len(gpus)),
            "compute": _seconds(m.compute_s),
            "bytes_step": _bytes_label(int(m.bytes_per_step)) if m.bytes_per_step else "–",
            "need": mib_s(m.required_mib_s_per_gpu),
            "left_out": ", ".join(f"{p.pid} {p.comm}".strip() for p in m.left_out) or "none",
            "au": "– (a job's I/O does not hold its AU)",
            "steps": f"{m.steps} per GPU" if m.steps else "–",
            "bytes_gpu": _bytes_label(int(sum(g.bytes for g in gpus) / len(gpus))) if gpus else "–",
        }[what]

    def devices(r: dict[str, Any]) -> str:
        used = set(r["groups"]) if r["selection"]["grouped_by"] == "dev" else set()
        out = []
        for d in r["recording"]["devices"]:
            if used and d["dev"] not in used:
                continue
            size = f", {_bytes_label(d['size_bytes'])}" if d.get("size_bytes") else ""
            mounts = f" on {', '.join(d['mounts'])}" if d.get("mounts") else ""
            out.append(f"{d['name']} ({d['dev']}{size}){mounts}")
        return "; ".join(out) or "–"

    def mib_s(v: float | None) -> str:
        return "–" if v is None else f"{v:.1f} MiB/s"

    def ended(rec: dict[str, Any]) -> str:
        if rec.get("complete") is None:
            return "– (a trace before schema 1.9 does not say)"
        if rec["complete"]:
            return f"yes ({rec.get('end_reason') or '–'})"
        why = rec.get("end_reason")
        if why in (None, "recording"):
            why = "recorder killed, host lost, or still recording"
        return f"NO: cut off ({why}): its rows end early"

    rows: list[tuple[str, Any]] = [
        ("host", lambda k, r: r["recording"]["host"] or "–"),
        ("kernel", lambda k, r: r["recording"]["kernel"] or "–"),
        ("command", lambda k, r: r["recording"]["command"] or "–"),
        ("started (UTC)", lambda k, r: r["recording"]["started_utc"] or "–"),
        ("duration", lambda k, r: f"{r['duration_s']:.3f} s (active {r['active_s']:.3f} s)"),
        ("recording ended", lambda k, r: ended(r["recording"])),
        ("devices", lambda k, r: devices(r)),
        ("GPUs found", lambda k, r: job(k, "gpus")),
        ("AU", lambda k, r: job(k, "au")),
        ("steps", lambda k, r: job(k, "steps")),
        ("compute per step", lambda k, r: job(k, "compute")),
        ("bytes per step", lambda k, r: job(k, "bytes_step")),
        ("bytes per GPU", lambda k, r: job(k, "bytes_gpu")),
        ("MiB/s needed per GPU", lambda k, r: job(k, "need")),
        ("launcher processes left out", lambda k, r: job(k, "left_out")),
        ("layer", lambda k, r: r["selection"]["layer"]),
        ("events", lambda k, r: f"{r['events']:,}"),
        (
            "mean throughput",
            lambda k, r: (
                f"{r['throughput_mib_s']['mean']:.1f} MiB/s "
                f"(active {r['throughput_active_mib_s']:.1f}, peak {r['throughput_mib_s']['peak']:.1f})"
            ),
        ),
        ("IOPS", lambda k, r: f"{r['iops']:.0f}"),
        ("QD mean per issue / max", lambda k, r: f"{r['qd_mean_issue']:.2f} / {r['qd_max']}"),
        ("QD mean time (aqu-sz)", lambda k, r: f"{r['qd_mean_time']:.2f}"),
        ("utilization / idle", lambda k, r: f"{r['utilization']:.1%} / {r['idle_fraction']:.1%}"),
        (
            "latency p50 / p99 / p99.9",
            lambda k, r: (
                " / ".join(
                    "–"
                    if r["latency_us"][p] is None or r["latency_us"][p] != r["latency_us"][p]
                    else f"{r['latency_us'][p]:.1f}"
                    for p in ("p50", "p99", "p999")
                )
                + " µs"
            ),
        ),
        ("bursts", lambda k, r: f"{r['bursts']['count']} (mean gap {r['bursts']['mean_gap_s'] * 1e3:.1f} ms)"),
        ("lost events", lambda k, r: f"{r['lost_events']['total']:,}"),
    ]
    head = "".join(f"<th>{html.escape(n)}</th>" for n, _ in results)
    body = "".join(
        f"<tr><td>{html.escape(label)}</td>"
        + "".join(f"<td>{html.escape(str(fn(k, r)))}</td>" for k, (_, r) in enumerate(results))
        + "</tr>"
        for label, fn in rows
    )
    sweep_lines = "".join(
        f'<p class="answer">Sweep {html.escape(name)} ({html.escape(str(sw.get("workload", "")))}): '
        f"<b>{int(sw['supported_gpus'])} GPUs supported</b> at AU ≥ {sw.get('threshold_percent', 90):g} %"
        + (" (the sweep stopped at its --max-gpus)" if sw.get("limited_by_max_gpus") else "")
        + _sweep_need(sw)
        + "</p>"
        for name, sw in sweeps
    )
    return f'<div id="summary">{sweep_lines}<table><tr><th></th>{head}</tr>{body}</table></div>'


def render(
    results: list[tuple[str, dict[str, Any]]],
    files: list[tuple[str, dict[str, Any] | None]],
    sweeps: list[tuple[str, dict[str, Any]]] | None = None,
    replays: list[dict[str, Any] | None] | None = None,
) -> str:
    """The report's HTML text. `replays[k]`: the results of the replay trace k recorded
    (its `replay.json`), or None for a recording of a job."""
    sweeps = sweeps or []
    replays = replays or [None] * len(results)
    figs = _figures(results, files, sweeps, replays)
    streams = _object_streams(results)
    if streams:
        figs.update(_object_figures(streams))
    divs = []
    ids = ([SWEEP_ID] if sweeps else []) + list(PLOT_IDS) + (list(OBJECT_PLOT_IDS) if streams else [])
    for div_id in ids:
        fig = figs[div_id]
        fig.update_layout(template="plotly_white", margin={"t": 70})
        if div_id != "timeline":
            fig.update_layout(height=420)
        divs.append(
            fig.to_html(
                full_html=False,
                include_plotlyjs=False,
                div_id=div_id,
                config={"displaylogo": False},
            )
        )
    names = ", ".join(html.escape(n) for n, _ in results)
    raw = html.escape(json.dumps({n: r["selection"] for n, r in results}))
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>trainio report: {names}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1400px}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}
td:first-child{{text-align:left}}.answer{{font-size:1.3em}}</style>
<script type="text/javascript">{get_plotlyjs()}</script>
</head><body>
<h1>trainio report</h1>
<p>Traces: {names}. MiB = 2<sup>20</sup> bytes. Queue depth per issue comes from the
kernel-recorded counter; time-weighted from the issue/complete intervals. GPUs, compute
and bytes per step come from the job model of the file layer (docs/analysis.md); for a
replay's own recording, from the replay's results.</p>
{_summary(results, files, sweeps, replays)}
{_object_table(streams) if streams else ""}
{"".join(divs)}
<p data-selection="{raw}">generated by trainio_analysis</p>
</body></html>
"""


def read_sweep(path: str) -> tuple[str, dict[str, Any]]:
    """A ``trainio sweep --json`` file: its name and content; refused (one line naming
    it) when it is not one."""
    try:
        with open(path, encoding="utf-8") as f:
            sw = json.load(f)
    except OSError as exc:
        msg = f"--sweep {path}: cannot read ({exc.strerror})"
        raise TrainioError(msg) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        msg = f"--sweep {path}: not JSON ({exc})"
        raise TrainioError(msg) from None
    ok = (
        isinstance(sw, dict)
        and isinstance(sw.get("supported_gpus"), int)
        and isinstance(sw.get("curve"), list)
        and sw["curve"]
        and all(
            isinstance(c, dict) and isinstance(c.get("gpus"), int) and isinstance(c.get("au_percent"), (int, float))
            for c in sw["curve"]
        )
    )
    if not ok:
        msg = (
            f"--sweep {path}: not a trainio sweep --json file (needs supported_gpus and a curve of gpus and au_percent)"
        )
        raise TrainioError(msg)
    return Path(path).name, sw


def replay_results(trace: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The results of the replay a trace recorded (`replay.json` in the trace directory,
    which `trainio replay --record` writes; traces/SCHEMA.md), or None for a job's trace."""
    path = Path(trace) / "replay.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        msg = f"{path}: not a replay's results ({exc})"
        raise TrainioError(msg) from None
    if not isinstance(data, dict) or data.get("tool") != "trainio replay":
        msg = f'{path}: not a replay\'s results (no "tool": "trainio replay")'
        raise TrainioError(msg)
    return data


def write_report(
    traces: list[str],
    output: str | os.PathLike[str],
    *,
    layer: str | None = None,
    dev: str | None = None,
    pid: int | None = None,
    bin_s: float | None = None,
    burst_gap_ms: float = 10.0,
    sweeps: list[str] | None = None,
) -> Path:
    """Analyze each trace and write the HTML report atomically; returns its path.

    `output` must be a regular file or a new name in an existing directory: a device, a
    directory, a FIFO or a symbolic link is refused before any trace is read (the
    report is renamed into place, which would replace the node or the link itself).
    `sweeps`: ``trainio sweep --json`` files, drawn as AU vs GPUs with GPUs supported."""
    _check_output(Path(output))
    sweep_data = [read_sweep(p) for p in sweeps or []]
    opts = {"dev": dev, "pid": pid, "bin_s": bin_s, "burst_gap_ms": burst_gap_ms}
    results = []
    files = []
    replays = []
    for t in traces:
        name = _label(t, traces)
        r = analyze(t, layer=layer, with_model=False, **opts)
        layer = layer or r["selection"]["layer"]  # the same layer for every trace
        results.append((name, r))
        replay = replay_results(t)
        replays.append(replay)
        if replay is not None:
            # a replay's recording: shown by the replay's results, not by a job model
            # inferred from its own I/O
            files.append((name, None))
        elif "file" in r["layers_present"]:
            try:
                # the file layer with the job model: GPUs, compute and bytes per step
                files.append((name, analyze(t, layer="file", **opts)))
            except SelectionError:
                files.append((name, None))
        else:
            files.append((name, None))
    text = render(results, files, sweep_data, replays)
    out = Path(output)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent if str(out.parent) else ".")
    except OSError as exc:
        msg = f"{out}: cannot write ({exc.strerror})"
        raise TrainioError(msg) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        _check_output(out)  # again: it may have changed while the traces were read
        os.replace(tmp, out)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        msg = f"{out}: cannot write ({exc.strerror})"
        raise TrainioError(msg) from None
    except TrainioError:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def _check_output(out: Path) -> None:
    """Refuses an output path that is not a regular file or a new name in an existing
    directory (one line, naming it)."""
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        parent = out.parent if str(out.parent) else Path(".")
        if not parent.is_dir():
            msg = f"{out}: directory {parent} does not exist"
            raise TrainioError(msg) from None
        return
    except OSError as exc:
        msg = f"{out}: cannot write ({exc.strerror})"
        raise TrainioError(msg) from None
    if stat.S_ISLNK(st.st_mode):
        msg = f"{out}: is a symbolic link; give the path of a regular file"
        raise TrainioError(msg)
    if not stat.S_ISREG(st.st_mode):
        msg = f"{out}: not a regular file (a device, directory or FIFO); give a file path"
        raise TrainioError(msg)
