"""Human-readable summary of an :func:`~trainio_analysis.analyze.analyze` result."""

from __future__ import annotations

import math
from typing import Any

from trainio_analysis.trace import STORAGE_LAYERS


def _hist_line(hist: dict[str, float], limit: int = 6) -> str:
    """Quantiles of an integer histogram, then its most frequent values."""
    if not hist:
        return "-"
    items = sorted((int(k), v) for k, v in hist.items())
    total = sum(v for _, v in items) or 1.0
    marks = []
    for q in (0.5, 0.9, 0.99):
        acc = 0.0
        for k, v in items:
            acc += v / total
            if acc >= q - 1e-12:
                marks.append(f"p{round(q * 100)} {k}")
                break
    top = sorted(items, key=lambda kv: -kv[1])[:limit]
    common = "  ".join(f"{k}:{v * 100:.1f}%" for k, v in sorted(top))
    return f"{', '.join(marks)}, max {items[-1][0]} | {common}"


def _size(n: float) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n:.0f} B"


def _opt(v: Any, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def format_summary(r: dict[str, Any]) -> str:
    sel = r["selection"]
    where = [f"layer {sel['layer']}"]
    if sel["dev"]:
        where.append(f"dev {sel['dev']}")
    if sel["pid"] is not None:
        where.append(f"pid {sel['pid']}")
    tp = r["throughput_mib_s"]
    lat = r["latency_us"]
    b = r["bursts"]
    agree = r["qd_issue_agreement"]
    lost = r["lost_events"]
    others = [k for k in r["layers_present"] if k != sel["layer"] and k in STORAGE_LAYERS]
    lines = [
        f"trace {r['trace']}  ({', '.join(where)}; {sel['groups']} {sel['grouped_by']}"
        f"{'s' if sel['groups'] != 1 else ''})"
        + (f"  [also recorded: {', '.join(others)}: use --layer]" if others else ""),
        f"  events       {r['events']:,}  ({r['reads']:,} reads, {r['writes']:,} writes) over {r['duration_s']:.3f} s",
        f"  bytes        read {_size(r['bytes_read'])}, written {_size(r['bytes_written'])}",
        f"  throughput   mean {tp['mean']:.1f} MiB/s (read {tp['read_mean']:.1f}, write "
        f"{tp['write_mean']:.1f}), peak {tp['peak']:.1f} MiB/s per {tp['bin_s']:g} s bin",
        f"  IOPS         {r['iops']:.0f}  mean size {_size(r['mean_size_bytes'])}",
        f"  latency us   p50 {_opt(lat['p50'], '.1f')}  p90 {_opt(lat['p90'], '.1f')}  "
        f"p99 {_opt(lat['p99'], '.1f')}  p99.9 {_opt(lat['p999'], '.1f')}  "
        f"max {_opt(lat['max'], '.1f')}",
        f"  QD per-issue (kernel)    {_hist_line(r['qd_hist_issue'])}",
        f"  QD per-issue (computed)  {_hist_line(r['qd_hist_issue_computed'])}"
        f"   agreement W1 {_opt(agree['w1'], '.3f')}",
        f"  QD time-weighted         {_hist_line(r['qd_hist_time'])}",
        f"  QD mean (aqu-sz) {r['qd_mean_time']:.2f}, busy-only {r['qd_mean_time_busy']:.2f}, "
        f"utilization {r['utilization'] * 100:.1f}%, idle {r['idle_fraction'] * 100:.1f}%",
        f"  sizes        {_hist_line(r['size_hist'])}",
        f"  bursts       {b['count']} (gap >= {b['gap_threshold_ms']:g} ms): mean "
        f"{_size(b['mean_bytes'])}, {b['mean_duration_s'] * 1e3:.2f} ms long, "
        f"{b['mean_gap_s'] * 1e3:.2f} ms apart",
    ]
    rec = r.get("recording") or {}
    if rec.get("complete") is False and not r.get("per_host"):
        lines.insert(
            1,
            "  INCOMPLETE   the recording was cut off (recorder killed, host lost, or still recording): "
            "its rows end early",
        )
    lines.extend(_host_lines(r.get("per_host")))
    steps = r.get("steps")
    if steps and steps["compute_time_s"] is not None:
        lines.append(
            f"  steps        {steps['steps']} over {steps['gpus']} GPU(s): compute "
            f"{steps['compute_time_s'] * 1e3:.1f} ms/step, "
            f"{_size(steps['bytes_per_step'])}/step -> needs "
            f"{_opt(steps['required_mib_s_per_gpu'], '.1f')} MiB/s per GPU"
        )
    lines.extend(_write_lines(r.get("write_bursts")))
    lines.extend(_object_lines(r.get("object_requests")))
    lines.extend(_model_lines(r.get("job_model")))
    for p in r.get("processes", [])[:20]:
        lines.append(
            f"  pid {p['pid']:>7} {p['comm'] or '?'!s:<15} {p['reads']:>9,} reads "
            f"{_size(p['bytes']):>10} {p['files']:>6} files  mean {_size(p['mean_read_size'])}"
            f"  conc {p['concurrency']['mean_time']:.2f}"
            + (
                f"  compute {p['compute_time_s'] * 1e3:.1f} ms, {_opt(p['required_mib_s_per_gpu'], '.1f')} MiB/s/GPU"
                if p["compute_time_s"] is not None
                else ""
            )
        )
    lines.append(
        "  lost events  none (trace complete)"
        if lost["complete"]
        else f"  lost events  {lost['total']:,} INCOMPLETE TRACE: {lost['by_probe']}"
    )
    return "\n".join(lines)


def _object_lines(obj: dict | None) -> list[str]:
    """The object layer's HTTP requests, one line per endpoint (analyze's object_requests)."""
    if not obj:
        return []
    out = [f"  object       {obj['requests']:,} HTTP requests over {obj['duration_s']:.3f} s:"]
    for name, e in obj["endpoints"].items():
        lat, ttfb = e["latency_us"], e["ttfb_us"]
        out.append(
            f"    {name:<21} {e['requests']:,} ({', '.join(f'{k} {v}' for k, v in e['by_op'].items())}; "
            f"status {', '.join(f'{k} {v}' for k, v in e['by_status'].items())}), read {_size(e['bytes_read'])}, "
            f"written {_size(e['bytes_written'])}, first byte p50 {_opt(ttfb['p50'], '.0f')} us, "
            f"latency p50 {_opt(lat['p50'], '.0f')} p99 {_opt(lat['p99'], '.0f')} us, outstanding mean "
            f"{e['qd_mean_time']:.2f} max {e['qd_max']}"
            + (f", {e['incomplete']} incomplete" if e["incomplete"] else "")
        )
    return out


def _host_lines(hosts: list[dict] | None) -> list[str]:
    """A trace set's hosts: each one's share of the job, on the job's clock."""
    if not hosts:
        return []
    out = [f"  hosts        {len(hosts)}: the figures above are the job's; each host's:"]
    for h in hosts:
        head = f"    {h['host']:<12} {h['gpus']} GPU(s)"
        if h.get("complete") is False:
            head += " INCOMPLETE (its recording was cut off: recorder killed or host lost)"
        if not h["events"]:
            out.append(f"{head}, nothing selected")
            continue
        out.append(
            f"{head}, {h['events']:,} events, read {_size(h['bytes_read'])}, written {_size(h['bytes_written'])}, "
            f"mean {h['throughput_mib_s']['mean']:.1f} MiB/s, {h['start_s']:.3f}-{h['end_s']:.3f} s"
            + (f", devices {', '.join(h['devices'])}" if h["devices"] else "")
            + (f", LOST {h['lost_events']:,} events" if h["lost_events"] else "")
        )
    return out


def _write_lines(w: dict | None) -> list[str]:
    """The job's write bursts (file layer: checkpoints, logs), apart from its reads."""
    if not w or not w["count"]:
        return []
    line = (
        f"  write bursts {w['count']} (gap >= {w['gap_ms']:g} ms): {_size(w['bytes'])}, mean "
        f"{_size(w['mean_bytes'])} in {w['mean_duration_s'] * 1e3:.1f} ms, "
        f"{_opt(w['mib_s'], '.1f')} MiB/s while writing, {w['syncs']} sync(s)"
    )
    if w["interval_s"] is not None:
        line += f", every {w['interval_s']:.2f} s"
    return [line]


def _model_lines(m: dict | None) -> list[str]:
    """The job model: one line per GPU, what was left out, and why a trace is incomplete."""
    if not m:
        return []
    o = m.get("object_store")
    source = (
        f"data from object store s3://{o['endpoint']}/{o['bucket']}"
        f" ({o['requests']} GETs, {o['bytes'] / 2**20:.2f} MiB)"
        if o
        else f"data device {m['data_dev'] or '?'}"
    )
    out = [f"  job model    {len(m['gpus'])} GPU(s): {m['grouping']}; {source}"]
    for g in m["gpus"]:
        workers = [str(x["pid"]) for x in g["members"] if x["role"] == "worker"]
        c = g["compute_s"]
        out.append(
            f"    GPU {g['index']}"
            + (f" on {g['host']}" if g.get("host") else "")
            + f": pid {g['rank_pid']} {g['comm']}"
            + (f" + {len(workers)} worker(s) {','.join(workers)}" if workers else "")
            + f"; {len(g['steps'])} steps ({g['step_signal']}), "
            + (f"compute {c * 1e3:.1f} ms/step, " if c is not None else "")
            + f"{_size(g['bytes_per_step'])}/step, {g['samples_per_step']:.1f} samples/step"
            + (f", needs {g['required_mib_s']:.1f} MiB/s" if g["required_mib_s"] is not None else "")
            + (f", AU {g['au_recorded'] * 100:.1f}%" if g["au_recorded"] is not None else "")
        )
        bursts = g.get("write_bursts") or []
        if bursts:
            at = ",".join("start" if b["after_step"] is None else str(b["after_step"]) for b in bursts)
            out.append(
                f"      writes: {len(bursts)} burst(s) after steps {at}, "
                f"{_size(sum(b['bytes'] for b in bursts))}, {sum(b['syncs'] for b in bursts)} sync(s)"
            )
    for x in m["left_out"]:
        on = f" on {x['host']}" if x.get("host") else ""
        out.append(f"    left out: pid {x['pid']}{on} {x['comm']} {_size(x['bytes'])}: {x['why']}")
    if m["incomplete"]:
        out.append(f"  INCOMPLETE   {m['incomplete']}")
    for w in m["warnings"]:
        out.append(f"  note         {w}")
    return out
