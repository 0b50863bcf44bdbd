"""``trainio slice``: a time window, or one job's processes (by pid or by cgroup), cut out
of a long trace into a new trace (traces/SCHEMA.md, ``trainio.window``).

A recorder that stays on (``trainio record --retain-mb``) writes days of a node's I/O;
what one looks at is a job's hour. The slice is a trace like any other, so analyze,
report, compare, export and replay read it unchanged, and slices of every node's trace
over the same wall-clock window make a trace set. It is its own command rather than an
option of analyze or report because its output is a trace to keep, copy off the node and
hand to every command, not a view.

A window's bounds are seconds from the trace's start, or wall-clock times (ISO 8601 with
a zone, e.g. ``2026-11-26T18:00:00Z``), which each host's ``trainio.clock_offset_ns``
puts on its own clock: the same bounds cut the same moments out of every node's trace.
Rows are kept when they overlap the window (complete at or after its start, issued
before its end). Row groups whose statistics lie outside the window are not decoded.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from trainio_analysis import trace as tr
from trainio_analysis.interop.common import InputError, output_directory

#: Columns a slice reads and writes: every column of the schema.
_COLUMNS = [name for name, _, _ in tr.COLUMNS]


def parse_time(text: str, option: str) -> float | dt.datetime:
    """A bound as given: seconds from the trace's start (a float) or a wall-clock time."""
    try:
        return float(text) if _is_number(text) else _wall_clock(text)
    except ValueError:
        msg = f"{option} {text!r}: neither seconds from the trace's start nor an ISO 8601 time with a zone"
        raise InputError(msg) from None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _wall_clock(text: str) -> dt.datetime:
    when = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    if when.tzinfo is None:
        msg = "no zone"
        raise ValueError(msg)
    return when


def _bound(value: float | dt.datetime | None, start_ns: int, clock_offset_ns: int) -> int | None:
    """A bound in the trace's CLOCK_MONOTONIC ns."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        wall_ns = int(round(value.timestamp() * 1e6)) * 1000
        return wall_ns - clock_offset_ns
    return start_ns + int(round(value * 1e9))


def _process_tree(segments: Sequence[tr.Segment]) -> tuple[dict[int, int], dict[int, str] | None]:
    """From the proc rows: each process's parent (its first ``ppid``), and each one's
    cgroup as its latest cgroup row (schema 1.9) gives it; None when the trace has no
    cgroup rows."""
    parent: dict[int, int] = {}
    latest: dict[int, tuple[int, str]] = {}
    seen = False
    for seg, index, table in tr.iter_row_groups(segments, ["layer", "op", "issue_ns", "pid", "ppid", "file"]):
        if tr.row_group_constant(seg, index, "layer") not in (None, "proc"):
            continue
        rows = table.filter(pc.equal(table["layer"].cast(pa.string()), "proc"))
        cols = [rows[c].to_pylist() for c in ("pid", "ppid")]
        ops = rows["op"].cast(pa.string()).to_pylist()
        files = rows["file"].cast(pa.string()).to_pylist()
        for pid, ppid, op, path, t in zip(*cols, ops, files, rows["issue_ns"].to_pylist(), strict=True):
            if ppid is not None:
                parent.setdefault(pid, ppid)
            if op == "cgroup" and path is not None:
                seen = True
                if pid not in latest or t >= latest[pid][0]:
                    latest[pid] = (t, path)
    return parent, ({pid: path for pid, (_, path) in latest.items()} if seen else None)


def _descendants(parent: dict[int, int], pids: Iterable[int]) -> set[int]:
    """``pids`` and every process the trace's proc rows show them forking, transitively."""
    keep = set(pids)
    changed = True
    while changed:
        changed = False
        for child, par in parent.items():
            if par in keep and child not in keep:
                keep.add(child)
                changed = True
    return keep


def _cgroup_candidates(path: str) -> list[str]:
    """The forms a cgroup given by the user can take in a trace's cgroup rows: as given,
    and for a path under /sys/fs/cgroup, relative to the v2 mount or to a v1 hierarchy's
    (``/sys/fs/cgroup/blkio/job`` is ``/job`` in blkio's hierarchy)."""
    p = "/" + path.strip().strip("/")
    mount = "/sys/fs/cgroup"
    if p != mount and not p.startswith(mount + "/"):
        return [p]
    rest = p[len(mount) :] or "/"
    out = [rest]
    parts = rest.strip("/").split("/", 1)
    if parts[0]:
        out.append("/" + (parts[1] if len(parts) > 1 else ""))
    return out


def _in_cgroups(
    parent: dict[int, int], cgroup_of: dict[int, str] | None, cgroups: Sequence[str], source: Path
) -> set[int]:
    """The processes in one of ``cgroups`` or beneath one: by their latest cgroup row, or
    (a process gone before the recorder read its cgroup) their nearest ancestor's."""
    if cgroup_of is None:
        msg = (
            f"{source}: no cgroup rows (a trace before schema 1.9, or recorded without the file layer): "
            "--cgroup cannot tell its processes"
        )
        raise InputError(msg)
    wanted = [c for g in cgroups for c in _cgroup_candidates(g)]

    def under(path: str) -> bool:
        return any(path == w or w == "/" or path.startswith(w + "/") for w in wanted)

    def cgroup(pid: int) -> str | None:
        for _ in range(64):  # a fork chain deeper than this is not a job's
            if pid in cgroup_of:
                return cgroup_of[pid]
            if pid not in parent:
                return None
            pid = parent[pid]
        return None

    return {pid for pid in set(parent) | set(cgroup_of) if (c := cgroup(pid)) is not None and under(c)}


def _slice_one(
    trace: tr.Trace,
    output: Path,
    *,
    start: float | dt.datetime | None,
    end: float | dt.datetime | None,
    pids: Sequence[int] | None,
    cgroups: Sequence[str] | None = None,
    origin_ns: int | None = None,
) -> dict[str, Any]:
    """Slice one trace (not a set). ``origin_ns``: the moment seconds count from, on this
    trace's clock (a set's member: the set's start), else the trace's start."""
    source = Path(trace.path)
    segments, meta = trace.segments, trace.meta
    start_ns = meta.get("start_ns") if isinstance(meta.get("start_ns"), int) else 0
    offset = meta.get("clock_offset_ns") if isinstance(meta.get("clock_offset_ns"), int) else 0
    origin = start_ns if origin_ns is None else origin_ns
    lo = _bound(start, origin, offset)
    hi = _bound(end, origin, offset)
    if lo is not None and hi is not None and hi <= lo:
        msg = f"{source}: the window ends before it starts (--from and --to)"
        raise InputError(msg)
    keep_pids = None
    if pids or cgroups:
        parent, cgroup_of = _process_tree(segments)
        keep = _descendants(parent, pids or ())
        if cgroups:
            keep |= _in_cgroups(parent, cgroup_of, cgroups, source)
        keep_pids = sorted(keep)

    source_rows = kept = 0
    with output_directory(output) as out:
        dropped = ("events", "segment", "schema_minor", "schema_version", "retention")
        window_meta = {k: v for k, v in meta.items() if k not in dropped}
        end_ns = meta.get("end_ns") if isinstance(meta.get("end_ns"), int) else None
        window_meta["start_ns"] = max(lo, start_ns) if lo is not None else start_ns
        window_meta["end_ns"] = min(hi, end_ns) if hi is not None and end_ns is not None else (hi or end_ns or 0)
        window = {
            "source": str(Path(source).resolve()),
            "start_ns": window_meta["start_ns"],
            "end_ns": window_meta["end_ns"],
            "pids": keep_pids,
            "cgroups": list(cgroups) if cgroups else None,
        }
        with tr.TraceWriter(out, {**window_meta, "window": window}) as writer:
            for seg in segments:
                for index in range(len(seg.row_groups)):
                    source_rows += seg.row_groups[index]
                    first = tr.row_group_min(seg, index, "issue_ns")
                    last = tr.row_group_max(seg, index, "complete_ns")
                    if (hi is not None and first is not None and first >= hi) or (
                        lo is not None and last is not None and last < lo
                    ):
                        continue
                    table = tr.read_row_group(seg, index, _COLUMNS)
                    mask = None
                    if lo is not None:
                        mask = pc.greater_equal(table["complete_ns"], lo)
                    if hi is not None:
                        m = pc.less(table["issue_ns"], hi)
                        mask = m if mask is None else pc.and_(mask, m)
                    if keep_pids is not None:
                        m = pc.is_in(table["pid"], value_set=pa.array(keep_pids, pa.uint32()))
                        mask = m if mask is None else pc.and_(mask, m)
                    if mask is not None:
                        table = table.filter(mask)
                    if table.num_rows:
                        kept += table.num_rows
                        writer.write(table)
            # The counts go into the last segment's metadata, which readers take.
            window.update(source_rows=source_rows, rows=kept)
            writer.user_meta["window"] = window
        if kept == 0:
            who = " of these processes" if pids else ""
            who = f" of the processes in cgroup {', '.join(cgroups)}" if cgroups else who
            msg = f"{source}: no rows in the window{who}"
            raise InputError(msg)
    return {
        "source": str(source),
        "output": str(output),
        "start_ns": window["start_ns"],
        "end_ns": window["end_ns"],
        "pids": keep_pids,
        "source_rows": source_rows,
        "rows": kept,
    }


def slice_trace(
    source: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    start: float | dt.datetime | None = None,
    end: float | dt.datetime | None = None,
    pids: Sequence[int] | None = None,
    cgroups: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Cut ``[start, end)`` (and/or the processes ``pids``, those in ``cgroups`` or
    beneath them, and their descendants) out of the trace or trace set ``source`` into
    ``output`` (absent or empty).

    A set is sliced member by member into ``output/MEMBER``, a set again.

    Example
    -------
    >>> slice_trace("node1", "job", start=120.0, end=180.0)  # doctest: +SKIP
    """
    if start is None and end is None and not pids and not cgroups:
        msg = "give a window (--from, --to) or processes (--pid, --cgroup)"
        raise InputError(msg)
    trace = tr.Trace.open(source)
    if trace.members is None:
        return _slice_one(trace, Path(output), start=start, end=end, pids=pids, cgroups=cgroups)
    set_start = trace.meta.get("start_ns")
    with output_directory(output) as out:
        parts = [
            _slice_one(
                member,
                out / m.path.name,
                start=start,
                end=end,
                pids=pids,
                cgroups=cgroups,
                origin_ns=set_start - m.shift_ns if isinstance(set_start, int) else None,
            )
            for m, member in zip(trace.members, trace.member_traces, strict=True)
        ]
    return {"source": str(source), "output": str(output), "members": parts, "rows": sum(p["rows"] for p in parts)}


def format_slice(result: dict[str, Any]) -> str:
    """One line per trace written."""
    parts = result.get("members", [result])
    lines = []
    for p in parts:
        span = (p["end_ns"] - p["start_ns"]) / 1e9
        who = f", processes {','.join(map(str, p['pids']))}" if p["pids"] else ""
        lines.append(f"wrote {p['output']}: {p['rows']} of {p['source_rows']} rows, {span:.3f} s{who}")
    return "\n".join(lines)
