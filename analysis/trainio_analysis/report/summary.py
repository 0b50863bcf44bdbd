"""The report's tables: the summary panel (one column per trace: its job model, or a
replay's own results) and the object layer's streams."""

from __future__ import annotations

import html
from typing import Any

from trainio_analysis.report.figures import _bytes_label, _seconds
from trainio_analysis.report.gpus import _job_models


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


def _object_streams(results: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """(trace · endpoint, summary) of every endpoint of the traces' object layers."""
    out = []
    for name, r in results:
        for endpoint, e in ((r.get("object_requests") or {}).get("endpoints") or {}).items():
            out.append((f"{name} · {endpoint}" if len(results) > 1 else endpoint, e))
    return out


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
