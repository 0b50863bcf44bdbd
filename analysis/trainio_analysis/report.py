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
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from trainio_analysis.analyze import analyze
from trainio_analysis.errors import SelectionError, TrainioError

PLOT_IDS = (
    "throughput",
    "qd-issue",
    "qd-time",
    "qd-time-busy",
    "sizes",
    "latency",
    "gaps",
    "processes",
)


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


def _bars(
    results: list[tuple[str, dict[str, Any]]],
    key: str,
    *,
    title: str,
    xaxis: str,
    yaxis: str,
    fmt: Any = str,
    sub: str | None = None,
) -> go.Figure:
    fig = go.Figure()
    all_keys = sorted({int(k) for _, r in results for k in (r[sub][key] if sub else r[key])})
    for name, r in results:
        hist = r[sub][key] if sub else r[key]
        total = sum(hist.values()) or 1
        fig.add_trace(
            go.Bar(
                name=name,
                x=[fmt(k) for k in all_keys],
                y=[hist.get(str(k), 0) / total for k in all_keys],
            )
        )
    fig.update_layout(
        barmode="group",
        title=title,
        xaxis_title=xaxis,
        yaxis_title=yaxis,
        xaxis_type="category",
        yaxis_tickformat=".0%",
    )
    return fig


def _figures(
    results: list[tuple[str, dict[str, Any]]], files: list[tuple[str, dict[str, Any] | None]]
) -> dict[str, go.Figure]:
    figs: dict[str, go.Figure] = {}
    tl = go.Figure()
    for name, r in results:
        t = r["throughput_mib_s"]["timeline"]
        total = [a + b for a, b in zip(t["read"], t["write"], strict=True)]
        # markers too when there are few bins, so a short trace is not an invisible dot
        mode = "lines+markers" if len(total) <= 60 else "lines"
        tl.add_trace(go.Scatter(name=f"{name}", x=t["t_s"], y=total, mode=mode))
    tl.update_layout(
        title=f"Throughput (read + write) per {results[0][1]['throughput_mib_s']['bin_s']:g} s bin",
        xaxis_title="time since trace start (s)",
        yaxis_title="MiB/s (2^20 B/s)",
    )
    figs["throughput"] = tl
    figs["qd-issue"] = _bars(
        results,
        "qd_hist_issue",
        title="Queue depth per issue (fraction of requests that saw k in flight, incl. itself)",
        xaxis="queue depth k",
        yaxis="requests",
    )
    figs["qd-time"] = _bars(
        results,
        "qd_hist_time",
        title="Queue depth time-weighted (fraction of wall time with k in flight; mean = aqu-sz)",
        xaxis="queue depth k",
        yaxis="time",
    )
    figs["qd-time-busy"] = _bars(
        results,
        "qd_hist_time_busy",
        title="Queue depth time-weighted, busy time only (k >= 1)",
        xaxis="queue depth k",
        yaxis="busy time",
    )
    figs["sizes"] = _bars(
        results,
        "size_hist",
        title="Request sizes (power-of-two buckets)",
        xaxis="size ≥",
        yaxis="requests",
        fmt=_bytes_label,
    )
    figs["latency"] = _bars(
        results,
        "latency_hist_us",
        title="Latency (issue to completion)",
        xaxis="latency ≥",
        yaxis="requests",
        fmt=_us_label,
    )
    figs["gaps"] = _bars(
        results,
        "idle_gap_hist_us",
        title="Idle gaps between busy periods",
        xaxis="gap ≥",
        yaxis="gaps",
        fmt=_us_label,
    )
    proc = go.Figure()
    for name, fr in files:
        if fr is None:
            continue
        procs = fr.get("processes", [])
        proc.add_trace(
            go.Bar(
                name=name,
                x=[f"{p['pid']} {p['comm'] or ''}".strip() for p in procs],
                y=[p["bytes"] / 2**20 for p in procs],
                customdata=[[p["reads"], p["files"], p["concurrency"]["mean_time"]] for p in procs],
                hovertemplate="%{y:.1f} MiB, %{customdata[0]} reads, %{customdata[1]} files, "
                "concurrency %{customdata[2]:.2f}<extra></extra>",
            )
        )
    if proc.data:
        proc.update_layout(
            barmode="group",
            title="Per-process read streams (file layer)",
            xaxis_title="process",
            yaxis_title="MiB read",
            xaxis_type="category",
        )
    else:  # no file layer recorded: the selected layer's streams, per device
        for name, r in results:
            groups = r["groups"]
            proc.add_trace(
                go.Bar(name=name, x=list(groups), y=[g["utilization"] for g in groups.values()])
            )
        proc.update_layout(
            barmode="group",
            xaxis_type="category",
            yaxis_tickformat=".0%",
            title=f"Per-{results[0][1]['selection']['grouped_by']} streams: "
            "utilization (no file layer recorded)",
            yaxis_title="busy time",
        )
    figs["processes"] = proc
    return figs


def _table(results: list[tuple[str, dict[str, Any]]]) -> str:
    rows = [
        ("layer", lambda r: r["selection"]["layer"]),
        ("events", lambda r: f"{r['events']:,}"),
        ("duration", lambda r: f"{r['duration_s']:.3f} s"),
        ("mean throughput", lambda r: f"{r['throughput_mib_s']['mean']:.1f} MiB/s"),
        ("IOPS", lambda r: f"{r['iops']:.0f}"),
        ("QD mean per issue", lambda r: f"{r['qd_mean_issue']:.2f}"),
        ("QD mean time (aqu-sz)", lambda r: f"{r['qd_mean_time']:.2f}"),
        ("utilization", lambda r: f"{r['utilization']:.1%}"),
        ("idle", lambda r: f"{r['idle_fraction']:.1%}"),
        (
            "latency p50 / p99",
            lambda r: f"{r['latency_us']['p50']:.1f} / {r['latency_us']['p99']:.1f} µs",
        ),
        (
            "bursts",
            lambda r: f"{r['bursts']['count']} (mean gap {r['bursts']['mean_gap_s'] * 1e3:.1f} ms)",
        ),
        ("lost events", lambda r: f"{r['lost_events']['total']:,}"),
    ]
    head = "".join(f"<th>{html.escape(n)}</th>" for n, _ in results)
    body = "".join(
        "<tr><td>"
        + html.escape(label)
        + "</td>"
        + "".join(f"<td>{html.escape(str(fn(r)))}</td>" for _, r in results)
        + "</tr>"
        for label, fn in rows
    )
    return f"<table><tr><th></th>{head}</tr>{body}</table>"


def render(
    results: list[tuple[str, dict[str, Any]]], files: list[tuple[str, dict[str, Any] | None]]
) -> str:
    """The report's HTML text."""
    figs = _figures(results, files)
    divs = []
    for div_id in PLOT_IDS:
        fig = figs[div_id]
        fig.update_layout(template="plotly_white", height=420, margin={"t": 60})
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
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}
td:first-child{{text-align:left}}</style>
<script type="text/javascript">{get_plotlyjs()}</script>
</head><body>
<h1>trainio report</h1>
<p>Traces: {names}. MiB = 2<sup>20</sup> bytes. Queue depth per issue comes from the
kernel-recorded counter; time-weighted from the issue/complete intervals.</p>
{_table(results)}
{"".join(divs)}
<p data-selection="{raw}">generated by trainio_analysis</p>
</body></html>
"""


def write_report(
    traces: list[str],
    output: str | os.PathLike[str],
    *,
    layer: str | None = None,
    dev: str | None = None,
    pid: int | None = None,
    bin_s: float | None = None,
    burst_gap_ms: float = 10.0,
) -> Path:
    """Analyze each trace and write the HTML report atomically; returns its path.

    `output` must be a regular file or a new name in an existing directory: a device, a
    directory, a FIFO or a symbolic link is refused before any trace is read (the
    report is renamed into place, which would replace the node or the link itself)."""
    _check_output(Path(output))
    opts = {"dev": dev, "pid": pid, "bin_s": bin_s, "burst_gap_ms": burst_gap_ms, "with_model": False}
    results = []
    files = []
    for t in traces:
        name = _label(t, traces)
        r = analyze(t, layer=layer, **opts)
        layer = layer or r["selection"]["layer"]  # the same layer for every trace
        results.append((name, r))
        if r["selection"]["layer"] == "file":
            files.append((name, r))
        elif "file" in r["layers_present"]:
            try:
                files.append((name, analyze(t, layer="file", **opts)))
            except SelectionError:
                files.append((name, None))
        else:
            files.append((name, None))
    text = render(results, files)
    out = Path(output)
    try:
        fd, tmp = tempfile.mkstemp(
            prefix=f".{out.name}.", suffix=".tmp", dir=out.parent if str(out.parent) else "."
        )
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
