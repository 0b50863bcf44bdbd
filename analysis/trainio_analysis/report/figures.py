"""The report's plots, one plotly figure per question: the timeline, queue depth per issue and
time-weighted, sizes, latency, idle gaps, per GPU (gpus.py), a sweep's AU curve and the
object layer's requests."""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from trainio_analysis.report.gpus import _gpus

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
