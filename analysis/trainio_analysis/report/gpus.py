"""The per-GPU figure: a job model's GPUs (a rank and its workers), or a replay's simulated
GPUs from its own results, else per process, else per device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

from trainio_analysis.model import JobModel, parse_job_model


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
