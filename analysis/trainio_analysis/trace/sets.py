"""Trace sets (SCHEMA.md, *Trace sets*): a directory of per-host traces read as one job,
its members checked against each other and put on one clock, and their metadata merged."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainio_analysis.errors import TraceError
from trainio_analysis.trace.schema import META_PREFIX, SEGMENT_GLOB
from trainio_analysis.trace.segments import Segment, _raw_metadata, open_segment_files


@dataclass(frozen=True)
class Member:
    """One host's trace in a trace set."""

    host: str
    path: Path
    #: ``trainio.clock_offset_ns`` (wall clock - CLOCK_MONOTONIC; 0 when absent)
    clock_offset_ns: int
    #: added to the member's times to put them on the set's clock (the first member's)
    shift_ns: int
    #: whether the member's recording ended (:func:`recording_complete`); False: its
    #: recorder was killed or its host lost, so its rows stop early; None before 1.9
    complete: bool | None = None


def recording_complete(meta: dict[str, Any]) -> bool | None:
    """Whether the trace with this metadata (:func:`read_metadata`'s) ended as its writer
    meant it to (SCHEMA.md, *The end of a recording*): False for a 1.9+ trace whose last
    segment does not say ``"complete": true`` (its recorder was killed, its host went
    down, or it is still recording), None for a trace before 1.9, which cannot say. The
    Rust reader's ``recording_complete`` answers the same."""
    minor = meta.get("schema_minor", 0)
    if not isinstance(minor, int) or minor < 9:
        return None
    end = meta.get("end")
    return isinstance(end, dict) and end.get("complete") is True


def trace_set_members(path: str | os.PathLike[str]) -> list[Member] | None:
    """The members of a trace set in name order, or None when ``path`` is not a set.

    A trace set (traces/SCHEMA.md, *Trace sets*) is a directory without segments of its
    own whose subdirectories are traces, one per host, read as one job. A set whose
    members disagree is refused: a subdirectory that is not a trace, two members from the
    same host, members of different schema versions. The Rust reader
    (``schema/src/set.rs``) accepts and refuses the same.
    """
    found = open_set(path)
    return None if found is None else [m for m, _ in found]


def open_set(path: str | os.PathLike[str]) -> list[tuple[Member, Segment]] | None:
    """:func:`trace_set_members`, each member with its last segment, opened and checked
    (held open, for the reader of the set to take rather than open it again)."""
    p = Path(path)
    if not p.is_dir():
        return None
    dirs = []
    for entry in p.iterdir():
        if entry.name.startswith("seg-") and entry.name.endswith(".parquet"):
            return None  # a trace of its own
        if entry.is_dir():
            dirs.append(entry)
    if not dirs:
        return None
    members: list[Member] = []
    lasts: list[Segment] = []
    first_version: tuple[Path, str] | None = None
    for d in sorted(dirs):
        files = sorted(d.glob(SEGMENT_GLOB))
        if not files:
            msg = f"{p}: {d} is not a trace (no {SEGMENT_GLOB}): a trace set holds only per-host traces"
            raise TraceError(msg)
        (last,) = open_segment_files(files[-1:])
        raw = _raw_metadata(last.footer)
        host = raw.get(META_PREFIX + "hostname", "").strip()
        if not host:
            msg = f"{d}: no trainio.hostname: a member of a trace set must name its host"
            raise TraceError(msg)
        major = raw.get(META_PREFIX + "schema_version", "?").strip()
        version = f"{major}.{raw.get(META_PREFIX + 'schema_minor', '0').strip()}"
        if first_version is None:
            first_version = (d, version)
        elif first_version[1] != version:
            msg = (
                f"{p}: members of different schema versions: {first_version[0]} is {first_version[1]}, "
                f"{d} is {version} (record every host with the same trainio)"
            )
            raise TraceError(msg)
        for m in members:
            if m.host == host:
                msg = f"{p}: {m.path} and {d} were both recorded on host {host}: one trace per host"
                raise TraceError(msg)
        offset_raw = raw.get(META_PREFIX + "clock_offset_ns", "0").strip()
        try:
            offset = int(offset_raw)
        except ValueError:
            msg = f"{d}: trainio.clock_offset_ns {offset_raw[:24]!r} is not an integer"
            raise TraceError(msg) from None
        members.append(Member(host, d, offset, 0, _raw_complete(raw)))
        lasts.append(last)
    base = members[0].clock_offset_ns
    return [
        (Member(m.host, m.path, m.clock_offset_ns, m.clock_offset_ns - base, m.complete), last)
        for m, last in zip(members, lasts, strict=True)
    ]


def _raw_complete(raw: dict[str, str]) -> bool | None:
    """:func:`recording_complete` of a segment's raw key-value metadata."""
    try:
        minor = int(raw.get(META_PREFIX + "schema_minor", "0").strip())
    except ValueError:
        minor = 0
    try:
        end = json.loads(raw.get(META_PREFIX + "end", "{}"))
    except json.JSONDecodeError:
        end = {}
    return recording_complete({"schema_minor": minor, "end": end})


def _set_metadata(members: Sequence[Member], metas: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A trace set's metadata: the first member's, with the job's span on the set's clock
    (earliest start, latest end), every member's devices (``dev`` as ``HOST/MAJ:MIN``),
    layers, events and lost events summed, and ``hosts``: each member's host, path and
    clock offset."""
    out = dict(metas[0])
    starts = [
        m["start_ns"] + h.shift_ns for h, m in zip(members, metas, strict=True) if isinstance(m.get("start_ns"), int)
    ]
    ends = [m["end_ns"] + h.shift_ns for h, m in zip(members, metas, strict=True) if isinstance(m.get("end_ns"), int)]
    if starts:
        out["start_ns"] = min(starts)
    if ends:
        out["end_ns"] = max(ends)
    out["hostname"] = ",".join(h.host for h in members)
    devices, layers, events, lost = [], [], {}, {}
    for h, m in zip(members, metas, strict=True):
        for d in m.get("devices") or []:
            if isinstance(d, dict):
                devices.append({**d, "dev": f"{h.host}/{d['dev']}" if d.get("dev") else d.get("dev"), "host": h.host})
        for layer in m.get("layers") or []:
            if layer not in layers:
                layers.append(layer)
        for key, target in (("events", events), ("lost_events", lost)):
            for k, v in (m.get(key) or {}).items() if isinstance(m.get(key), dict) else ():
                if isinstance(v, int):
                    target[k] = target.get(k, 0) + v
    out.update(devices=devices, layers=layers, events=events, lost_events=lost)
    out["hosts"] = [
        {
            "host": h.host,
            "path": str(h.path),
            "clock_offset_ns": h.clock_offset_ns,
            "shift_ns": h.shift_ns,
            "complete": h.complete,
        }
        for h in members
    ]
    cut = [h.host for h in members if h.complete is False]
    if cut:
        # the set ended only if every member did
        out["end"] = {"complete": False, "reason": "members cut off: " + ", ".join(cut)}
    return out
