"""``trainio export --fio TRACE -o DIR``: one fio iolog (version 3) per process of a trace,
or per GPU of its job model (``--by gpu``: a rank and its DataLoader workers, the
analyzer's job model from the file, proc and ipc layers), with the recorded timing, and
a job file that replays them all (docs/interop.md).

The block layer is exported by default: its requests are what the device saw, one fio
I/O each with ``direct=1``, so ``fio --replay_redirect=DEV`` puts the same requests on
another device. The file layer (``--layer file``) gives the read syscalls' file offsets
and sizes on the recorded paths instead, for replay through a file system where those
files exist (``--under DIR``: only the files under DIR, e.g. the dataset). Its writes
are left out: replayed on the recorded paths they would overwrite the job's files.

Timing. fio's version 3 iolog stamps each line with microseconds since the start of the
job and waits the difference to the previous line before issuing, without waiting for
earlier I/O to complete (up to ``iodepth`` in flight): an open-loop replay. Every log
counts from the same origin, the first exported request of the trace, so processes that
ran together replay together. Lines start at 1 µs, not 0: fio computes no delay after a
line stamped 0.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from trainio_analysis.interop.common import InputError, output_directory, write_text_atomically
from trainio_analysis.trace import STRING_COLUMNS, Trace, trace_set_members

IOLOG_HEADER = "fio version 3 iolog"
#: trainio op -> fio iolog action, per layer; other ops have no fio equivalent.
FIO_ACTIONS = {
    "block": {"read": "read", "write": "write", "discard": "trim", "flush": "sync"},
    "file": {"read": "read"},
}
# fio reads file names with sscanf("%256s"): no blanks, at most 256 bytes.
_FIO_NAME = re.compile(r"^\S{1,256}$")


def _device_names(meta: dict[str, Any]) -> dict[str, str]:
    return {d["dev"]: d.get("name") or "" for d in meta.get("devices", []) if d.get("dev")}


#: The columns export reads of a layer's rows.
_COLUMNS = ["op", "issue_ns", "complete_ns", "dev", "offset", "bytes", "queue_depth", "pid", "tid", "comm", "file"]


def _layer_rows(trace: Trace, layer: str) -> pl.DataFrame:
    """Every row of ``layer``, all ops, the columns export uses: read once for the
    requests and the ops left out."""
    return trace.scan().filter(pl.col("layer") == layer).select(_COLUMNS).collect()


def _layer_rows_and_gpus(trace: Trace, layer: str) -> tuple[pl.DataFrame, dict[int, int] | None]:
    """:func:`_layer_rows` and the GPU of each pid in the trace's job model (the
    analyzer's, from the file, proc and ipc layers), from one read of the trace: each row
    group is decoded once, its rows pushed into the job model (as the analyzer's pass
    does) and its ``layer`` rows kept. No GPUs (None) without a file layer."""
    from trainio_analysis import kernels
    from trainio_analysis.analyze.plan import layers_present
    from trainio_analysis.analyze.result import job_model, push_model_rows

    if "file" not in layers_present(trace):
        return _layer_rows(trace, layer), None
    nat = kernels.module()
    model = nat.ModelRows(str(trace.path)) if nat is not None else None
    parts = []
    for batch in trace.row_batches():
        rows = pa.Table.from_batches([batch])
        if model is not None:
            push_model_rows(model, rows)
        parts.append(pl.from_arrow(rows.filter(pc.equal(rows["layer"], layer)).select(_COLUMNS)))
    strings = sorted(c for c in _COLUMNS if c in STRING_COLUMNS)
    df = pl.concat(parts, how="vertical").with_columns(pl.col(strings).cast(pl.String))
    return df, _gpus(job_model(trace, rows=model) if model is not None else None)


def _requests(rows: pl.DataFrame, layer: str, dev: str | None, pid: int | None, under: str | None) -> pl.DataFrame:
    lf = rows.lazy().filter(pl.col("op").is_in(list(FIO_ACTIONS[layer])))
    if under is not None:
        lf = lf.filter(pl.col("file").str.starts_with(under.rstrip("/") + "/"))
    if dev is not None:
        lf = lf.filter(pl.col("dev") == dev)
    if pid is not None:
        lf = lf.filter(pl.col("pid") == pid)
    df = lf.collect()
    if layer == "block":
        # A request that completed in parts is several rows with its issue_ns: one I/O.
        df = df.group_by(["dev", "op", "issue_ns", "pid", "tid", "queue_depth"], maintain_order=True).agg(
            pl.col("offset").min(),
            pl.col("bytes").sum(),
            pl.col("complete_ns").max(),
            pl.col("comm").first(),
            pl.col("file").first(),
        )
        df = df.with_columns(pl.col("offset").fill_null(0))
    else:
        # what the file system returned, where it was read; a read at the end of a file
        # (0 bytes) has nothing to replay
        df = df.filter(pl.col("offset").is_not_null() & (pl.col("bytes") > 0))
    return df.sort(["issue_ns", "tid"], maintain_order=True)


def _target(layer: str, row_dev: str | None, row_file: str | None, devices: dict[str, str]) -> str:
    if layer == "file":
        return row_file or ""
    name = devices.get(row_dev or "")
    return f"/dev/{name}" if name else f"/dev/block/{row_dev}"


def export_fio(
    trace: str,
    output: str | os.PathLike[str],
    *,
    layer: str = "block",
    dev: str | None = None,
    pid: int | None = None,
    under: str | None = None,
    by: str = "process",
) -> dict[str, Any]:
    """Write DIR/pid-PID-COMM.iolog per process and DIR/replay.fio; returns a summary
    ``{"layer", "origin_ns", "jobs": [{"iolog", "pid", "comm", "requests", "bytes",
    "iodepth", "targets"}], "skipped_ops": {op: rows}}``."""
    if trace_set_members(trace) is not None:
        # an iolog replays one host's requests on one host
        msg = f"{trace}: a trace set (one trace per host): export one host's trace, {Path(trace) / 'HOST'}"
        raise InputError(msg)
    opened = Trace.open(trace)
    meta = opened.meta
    devices = _device_names(meta)
    if dev is not None and dev not in devices.values() and ":" not in dev:
        msg = f"{trace}: no device {dev!r} in trainio.devices"
        raise InputError(msg)
    dev_id = next((k for k, v in devices.items() if v == dev), dev)
    if under is not None and layer != "file":
        msg = f"{trace}: --under selects files: it needs --layer file"
        raise InputError(msg)
    rows, gpu_of = _layer_rows_and_gpus(opened, layer) if by == "gpu" else (_layer_rows(opened, layer), None)
    df = _requests(rows, layer, dev_id, pid, under)
    if df.is_empty():
        given = [
            f"--dev {dev}" if dev else "",
            f"--pid {pid}" if pid is not None else "",
            f"--under {under}" if under else "",
        ]
        selection = " ".join(g for g in given if g)
        msg = f"{trace}: no {layer}-layer requests to export" + (f" match {selection}" if selection else "")
        raise InputError(msg)
    skipped = rows.filter(~pl.col("op").is_in(list(FIO_ACTIONS[layer]))).group_by("op", maintain_order=True).len()
    del rows
    left_out = 0
    if by == "gpu":
        if gpu_of is None:
            msg = f"{trace}: --by gpu needs the file layer, where the job model comes from"
            raise InputError(msg)
        grouped = df.with_columns(
            pl.col("pid").replace_strict(gpu_of, default=None, return_dtype=pl.Int64).alias("job")
        )
        left_out = int(grouped["job"].null_count())
        df = grouped.filter(pl.col("job").is_not_null())
        if df.is_empty():
            msg = f"{trace}: no {layer}-layer request of a GPU's processes to export"
            raise InputError(msg)
    else:
        df = df.with_columns(pl.col("pid").cast(pl.Int64).alias("job"))
    origin = int(df["issue_ns"].min())
    jobs = []
    with output_directory(output) as out:
        for (job,), rows in df.sort("job", maintain_order=True).group_by(["job"], maintain_order=True):
            comm = re.sub(r"[^A-Za-z0-9_.-]", "_", rows["comm"][0] or "?")
            name = f"gpu-{job}" if by == "gpu" else f"pid-{job}-{comm}"
            targets: list[str] = []
            body: list[str] = []
            for op, t, d, f, off, nbytes in zip(
                rows["op"], rows["issue_ns"], rows["dev"], rows["file"], rows["offset"], rows["bytes"], strict=True
            ):
                target = _target(layer, d, f, devices)
                if not _FIO_NAME.match(target):
                    msg = f"{trace}: file name {target!r} cannot be written to an fio iolog (blank or over 256 bytes)"
                    raise InputError(msg)
                if target not in targets:
                    targets.append(target)
                stamp = (t - origin) // 1000 + 1
                body.append(f"{stamp} {target} {FIO_ACTIONS[layer][op]} {off} {nbytes}")
            head = [IOLOG_HEADER]
            head += [f"1 {t} add" for t in targets] + [f"1 {t} open" for t in targets]
            # No close lines: fio closes a file when it reaches the line, and an I/O
            # still in flight on it goes missing from its counts; at the end of the job
            # it reaps the I/O, then closes.
            write_text_atomically(out / f"{name}.iolog", "\n".join(head + body) + "\n")
            jobs.append(
                {
                    "iolog": f"{name}.iolog",
                    "gpu" if by == "gpu" else "pid": int(job),
                    "pids": sorted(set(rows["pid"].to_list())),
                    "comm": rows["comm"][0],
                    "requests": rows.height,
                    "bytes": int(rows["bytes"].sum()),
                    # in flight at once never exceeded the recorded depth; twice leaves room
                    # for a target slower than the original before the replay closes the loop
                    "iodepth": max(1, 2 * int(rows["queue_depth"].max())),
                    "targets": targets,
                }
            )
        write_text_atomically(out / "replay.fio", _job_file(trace, layer, jobs))
    return {
        "layer": layer,
        "by": by,
        "left_out_requests": left_out,
        "origin_ns": origin,
        "jobs": jobs,
        "skipped_ops": dict(zip(skipped["op"].to_list(), skipped["len"].to_list(), strict=True)),
    }


def _gpus(model: dict[str, Any] | None) -> dict[int, int]:
    return {int(m["pid"]): int(g["index"]) for g in (model or {}).get("gpus", []) for m in g["members"]}


def _job_file(trace: str, layer: str, jobs: list[dict[str, Any]]) -> str:
    lines = [
        f"# trainio export --fio of {Path(trace).resolve()} ({layer} layer): one job per process or GPU.",
        "# Run from this directory: fio replay.fio; add replay_redirect=DEVICE under [global]",
        "# (or pass --replay_redirect=DEVICE) to send every request to DEVICE.",
        "[global]",
        "ioengine=libaio",
        f"direct={1 if layer == 'block' else 0}",
        "thread",
        "",
    ]
    for job in jobs:
        lines += [
            f"[{job['iolog'].removesuffix('.iolog')}]",
            f"read_iolog={job['iolog']}",
            f"iodepth={job['iodepth']}",
            "",
        ]
    return "\n".join(lines)


def _names(targets: list[str], shown: int = 3) -> str:
    more = f" and {len(targets) - shown} more" if len(targets) > shown else ""
    return ", ".join(targets[:shown]) + more


def format_export(summary: dict[str, Any], output: str) -> str:
    lines = [
        f"trainio export: {len(summary['jobs'])} fio iolog(s) of the {summary['layer']} layer in {output}, "
        f"one per {summary['by']}"
    ]
    for job in summary["jobs"]:
        lines.append(
            f"  {job['iolog']}: {job['requests']} requests, {job['bytes'] / 2**20:.2f} MiB, "
            f"iodepth {job['iodepth']}, {_names(job['targets'])}"
        )
    if summary["left_out_requests"]:
        lines.append(f"  not exported: {summary['left_out_requests']} requests of processes in no GPU")
    if summary["skipped_ops"]:
        skipped = ", ".join(f"{op} {n}" for op, n in sorted(summary["skipped_ops"].items()))
        lines.append(f"  not exported (no fio action): {skipped}")
    if summary["layer"] == "block":
        lines.append(f"  replay: cd {output} && fio replay.fio --replay_redirect=DEVICE")
    else:
        lines.append(f"  replay: cd {output} && fio replay.fio (reads the recorded files)")
    return "\n".join(lines)
