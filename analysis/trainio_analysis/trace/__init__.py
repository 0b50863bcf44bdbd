"""The Python reader and writer of the trainio trace format (traces/SCHEMA.md, version 1.9).

This is the only Python module that knows column names, Arrow types and metadata keys;
everything else imports the names from here. A trace is a directory of
``seg-NNNNNN.parquet`` segments (``*.partial`` files are ignored) or a single Parquet file.

Design: validation reads only Parquet footers, so opening a 100 GB trace costs
milliseconds; data is read lazily (:func:`scan_trace`) or one row group at a time
(:func:`iter_row_groups`), never materialized whole.

Example
-------
>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp()) / "t"
>>> write_trace(d, [{"layer": "block", "op": "read", "issue_ns": 0, "complete_ns": 10,
...                  "dev": "7:0", "bytes": 4096, "queue_depth": 1, "pid": 1}])
[PosixPath('.../seg-000000.parquet')]
>>> scan_trace(d).select("bytes").collect()["bytes"].to_list()
[4096]
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute
import pyarrow.parquet as pq

from trainio_analysis import footer
from trainio_analysis.errors import TraceError

SCHEMA_VERSION = 1
#: ``trainio.schema_minor`` written; any minor of a known version is read (absent = 0).
SCHEMA_MINOR = 9
KNOWN_SCHEMA_VERSIONS = frozenset({1})
META_PREFIX = "trainio."
SEGMENT_GLOB = "seg-*.parquet"

DICT8 = pa.dictionary(pa.int8(), pa.string())
DICT16 = pa.dictionary(pa.int16(), pa.string())
DICT32 = pa.dictionary(pa.int32(), pa.string())

#: (column, Arrow type, nullable) in the order SCHEMA.md lists them.
COLUMNS: tuple[tuple[str, pa.DataType, bool], ...] = (
    ("layer", DICT8, False),
    ("op", DICT8, False),
    ("issue_ns", pa.int64(), False),
    ("complete_ns", pa.int64(), False),
    ("insert_ns", pa.int64(), True),
    ("dev", DICT16, True),
    ("offset", pa.int64(), True),
    ("bytes", pa.int64(), False),
    ("bytes_requested", pa.int64(), False),
    ("queue_depth", pa.uint32(), False),
    ("pid", pa.uint32(), False),
    ("tid", pa.uint32(), False),
    ("comm", DICT32, False),
    ("fd", pa.int32(), True),
    ("file", DICT32, True),
    ("error", pa.int32(), False),
    ("flags", pa.uint32(), False),
    # 1.1: the RPC that carried an nfs request
    ("rpc_xid", pa.uint32(), True),
    ("rpc_backlog_ns", pa.int64(), True),
    ("rpc_rtt_ns", pa.int64(), True),
    ("rpc_execute_ns", pa.int64(), True),
    ("rpc_retrans", pa.uint32(), True),
    # 1.3: the parent's tgid of a proc row's process
    ("ppid", pa.uint32(), True),
    # 1.8: an object-layer row's server, response status and first response byte
    ("endpoint", DICT16, True),
    ("http_status", pa.uint32(), True),
    ("first_byte_ns", pa.int64(), True),
)
#: Columns added by minor versions: a trace written before them lacks them, and readers
#: see them as all-null columns.
OPTIONAL_COLUMNS = (
    "rpc_xid",
    "rpc_backlog_ns",
    "rpc_rtt_ns",
    "rpc_execute_ns",
    "rpc_retrans",
    "ppid",
    "endpoint",
    "http_status",
    "first_byte_ns",
)
SCHEMA = pa.schema([pa.field(n, t, nullable=null) for n, t, null in COLUMNS])
COLUMN_TYPES = {n: t for n, t, _ in COLUMNS}
_NULLABLE = {n: null for n, _, null in COLUMNS}
#: (min, max) of each integer column's SCHEMA.md type: a value outside is refused
_INT_RANGE = {
    n: (int(np.iinfo(t.to_pandas_dtype()).min), int(np.iinfo(t.to_pandas_dtype()).max))
    for n, t, _ in COLUMNS
    if pa.types.is_integer(t)
}
STRING_COLUMNS = frozenset(n for n, t, _ in COLUMNS if pa.types.is_dictionary(t))

LAYERS = ("block", "file", "nfs", "proc", "ipc", "object")
#: The layers whose rows are storage I/O, the ones an analysis characterizes; proc
#: (process lifecycle) and ipc (pipes, sockets) rows describe the job's structure.
STORAGE_LAYERS = ("block", "file", "nfs")
OPS = {
    "block": ("read", "write", "flush", "discard", "write_zeroes", "other"),
    "file": (
        "read",
        "write",
        "open",
        "close",
        "fsync",
        "fdatasync",
        "sync_file_range",
        "fault",
        "map_pages",
        "mmap",
        "madvise",
    ),
    "nfs": ("read", "write", "commit"),
    "proc": ("start", "fork", "exec", "comm", "exit", "cgroup"),
    "ipc": ("read", "write", "wait"),
    "object": ("get", "put", "head", "post", "delete", "other"),
}
#: Ops whose rows are counted in a layer's queue depth (SCHEMA.md, `queue_depth`).
QD_OPS = {
    "block": OPS["block"],
    "file": ("read", "write"),
    "nfs": ("read", "write"),
    "proc": (),
    "ipc": (),
    "object": OPS["object"],
}
#: Ops whose bytes are data transfers (throughput, sizes).
DATA_OPS = ("read", "write")

#: Metadata keys whose values are JSON, with the default the writer fills in.
JSON_META_DEFAULTS: dict[str, Any] = {
    "layers": None,  # filled from the rows
    "skipped_probes": {},
    "target": {"all": True},
    "devices": [],
    "lost_events": {},
    "bpf_stats": {},
    "events": None,  # filled from the rows
    "nfs_mounts": [],
    "recorder_cpu_ns": {},  # 1.2: only trainio record fills it in
    "source": {},  # 1.4: only trainio import fills it in
    "retention": {},  # 1.7: only a recording with --retain-mb/--retain-s fills it in
    "window": {},  # 1.7: only trainio slice fills it in
    "end": {},  # 1.9: whether the recording ended (recording_complete)
}
#: ``trainio.end`` of a trace this module writes whole (import, slice of a complete trace)
WRITTEN_END = {"complete": True, "reason": "written"}
INT_META_KEYS = ("clock_offset_ns", "start_ns", "end_ns", "segment", "schema_version", "schema_minor")

# Columns a caller of write_trace may omit, and how they are filled.
_NULL_DEFAULT = ("insert_ns", "dev", "offset", "fd", "file", *OPTIONAL_COLUMNS)
_ZERO_DEFAULT = ("error", "flags")


class _Held:
    """An open descriptor of a segment file. A recording with retention removes its oldest
    segments while readers read them (SCHEMA.md, *Retention*): through ``/proc/self/fd``
    a segment listed when the trace was opened stays readable until the reader is done."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.path = Path(f"/proc/self/fd/{fd}")

    def __del__(self) -> None:
        os.close(self.fd)


@dataclass(frozen=True)
class Segment:
    """One finished segment: its path, row count and row-group sizes."""

    path: Path
    rows: int
    row_groups: tuple[int, ...]
    footer: pq.FileMetaData | None = None
    arrow_schema: pa.Schema | None = None
    #: ``trainio.schema_minor`` of the segment (0 when absent)
    minor: int = 0
    #: In a trace set: ns added to the segment's times to put them on the set's clock
    shift_ns: int = 0
    #: In a trace set: the member's host, which prefixes its devices (``HOST/MAJ:MIN``)
    host: str | None = None
    #: The file held open since the trace was opened (None: opened by ``path``)
    held: _Held | None = field(default=None, compare=False, repr=False)

    @property
    def source(self) -> Path:
        """What to open to read the segment: its held descriptor, else its path."""
        return self.held.path if self.held is not None else self.path

    def column_stats(self, index: int, column: str) -> Any:
        """Parquet statistics of ``column`` in row group ``index`` (None if absent)."""
        if self.footer is None or self.arrow_schema is None:
            pf = _open_segment(self.source, self.path)
            footer, schema = pf.metadata, pf.schema_arrow
        else:
            footer, schema = self.footer, self.arrow_schema
        # the Arrow field index equals the Parquet leaf index in this flat schema
        return footer.row_group(index).column(schema.get_field_index(column)).statistics


# --------------------------------------------------------------------------- reading


def list_segments(path: str | os.PathLike[str]) -> list[Path]:
    """Finished segment files of a trace, in name order (a single file is its own list)."""
    p = Path(path)
    if p.is_dir():
        return sorted(p.glob(SEGMENT_GLOB))
    if p.is_file():
        return [p]
    msg = f"{p}: no such trace (neither a directory nor a file)"
    raise TraceError(msg)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (a library's may run to several)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _open_segment(path: Path, name: Path | None = None) -> pq.ParquetFile:
    """Open ``path`` (``name``: the segment's path, for messages, when ``path`` is its
    held descriptor)."""
    name = path if name is None else name
    try:
        # pyarrow aborts the process on some corrupt footers: check them first
        wrong = footer.check_file(path)
        if wrong is not None:
            msg = f"{name}: not a readable Parquet file ({wrong})"
            raise TraceError(msg)
        pf = pq.ParquetFile(path)
        pf.schema_arrow  # noqa: B018 (decodes the footer's Arrow schema: fail here, not later)
    except (pa.ArrowException, OSError, ValueError) as exc:
        msg = f"{name}: not a readable Parquet file ({first_line(exc)})"
        raise TraceError(msg) from None
    return pf


def _raw_metadata(pf: pq.ParquetFile) -> dict[str, str]:
    kv = pf.metadata.metadata or {}
    return {
        k.decode("utf-8", "replace"): v.decode("utf-8", "replace")
        for k, v in kv.items()
        if k.startswith(META_PREFIX.encode())
    }


def _is_string_type(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _type_ok(name: str, got: pa.DataType) -> bool:
    """SCHEMA.md: any dictionary key width or plain UTF-8 for the string columns, any
    integer width for the integer columns."""
    if name in STRING_COLUMNS:
        return _is_string_type(got) or (pa.types.is_dictionary(got) and _is_string_type(got.value_type))
    return pa.types.is_integer(got)


def _segment_minor(path: Path, meta: Mapping[str, str]) -> int:
    raw = meta.get(META_PREFIX + "schema_minor")
    if raw is None:
        return 0
    try:
        minor = int(raw)
    except ValueError:
        minor = -1
    if minor < 0:
        msg = f"{path}: trainio.schema_minor {raw[:20]!r} is not a version number"
        raise TraceError(msg)
    return minor


def _check_segment(path: Path, pf: pq.ParquetFile) -> int:
    """Checks a segment's footer against SCHEMA.md; returns its schema minor."""
    meta = _raw_metadata(pf)
    version = meta.get(META_PREFIX + "schema_version")
    if version is None:
        msg = f"{path}: not a trainio trace (no trainio.schema_version metadata)"
        raise TraceError(msg)
    try:
        known = int(version) in KNOWN_SCHEMA_VERSIONS
    except ValueError:
        known = False
    if not known:
        msg = (
            f"{path}: unknown trainio.schema_version {version[:20]!r} "
            f"(this reader knows {sorted(KNOWN_SCHEMA_VERSIONS)})"
        )
        raise TraceError(msg)
    minor = _segment_minor(path, meta)
    schema = pf.schema_arrow
    missing = [n for n, _, _ in COLUMNS if n not in schema.names and n not in OPTIONAL_COLUMNS]
    if missing:
        msg = f"{path}: missing column(s) {', '.join(missing)}"
        raise TraceError(msg)
    for name, want, _ in COLUMNS:
        if name not in schema.names:
            continue
        got = schema.field(name).type
        if not _type_ok(name, got):
            kind = "UTF-8 strings" if name in STRING_COLUMNS else "an integer type"
            msg = f"{path}: column {name} has type {got}, expected {kind} (written as {want})"
            raise TraceError(msg)
    return minor


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
    first_version: tuple[Path, str] | None = None
    for d in sorted(dirs):
        files = sorted(d.glob(SEGMENT_GLOB))
        if not files:
            msg = f"{p}: {d} is not a trace (no {SEGMENT_GLOB}): a trace set holds only per-host traces"
            raise TraceError(msg)
        pf = _open_segment(files[-1])
        _check_segment(files[-1], pf)
        raw = _raw_metadata(pf)
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
    base = members[0].clock_offset_ns
    return [Member(m.host, m.path, m.clock_offset_ns, m.clock_offset_ns - base, m.complete) for m in members]


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


def open_trace(path: str | os.PathLike[str]) -> list[Segment]:
    """Validate a trace (or a trace set) from its footers and describe its segments.

    The segments of a set are its members' in member order, each carrying the member's
    host and clock shift, which :func:`read_row_group` and the row-group statistics apply.

    Raises
    ------
    TraceError
        not a trace, not Parquet, unknown schema version, a missing column, or no rows.
    """
    members = trace_set_members(path)
    if members is not None:
        out = []
        for m in members:
            out += [replace(s, shift_ns=m.shift_ns, host=m.host) for s in open_trace(m.path)]
        return out
    files = list_segments(path)
    if not files:
        msg = f"{path}: empty trace (no {SEGMENT_GLOB} segments)"
        raise TraceError(msg)
    segments = []
    for f in files:
        try:
            held: _Held | None = _Held(os.open(f, os.O_RDONLY | os.O_CLOEXEC))
        except FileNotFoundError:
            if f != files[-1]:
                continue  # removed by the recorder's retention since it was listed (SCHEMA.md)
            held = None
        except OSError:
            held = None  # _open_segment says why
        pf = _open_segment(held.path if held is not None else f, f)
        minor = _check_segment(f, pf)
        md = pf.metadata
        groups = tuple(md.row_group(i).num_rows for i in range(md.num_row_groups))
        segments.append(Segment(f, md.num_rows, groups, md, pf.schema_arrow, minor, held=held))
    if sum(s.rows for s in segments) == 0:
        msg = f"{path}: empty trace (no rows)"
        raise TraceError(msg)
    return segments


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Key-value metadata of the trace, from its last segment, prefix stripped.

    JSON values are decoded and integer values converted. A trace set's metadata is its
    members' as one job (:func:`_set_metadata`).
    """
    members = trace_set_members(path)
    if members is not None:
        return _set_metadata(members, [read_metadata(m.path) for m in members])
    files = list_segments(path)
    if not files:
        msg = f"{path}: empty trace (no {SEGMENT_GLOB} segments)"
        raise TraceError(msg)
    last = files[-1]
    pf = _open_segment(last)
    _check_segment(last, pf)
    out: dict[str, Any] = {}
    for key, raw in _raw_metadata(pf).items():
        short = key[len(META_PREFIX) :]
        if short in INT_META_KEYS:
            try:
                out[short] = int(raw)
            except ValueError:
                out[short] = raw
        elif short in JSON_META_DEFAULTS:
            try:
                out[short] = json.loads(raw)
            except json.JSONDecodeError:
                msg = f"{last}: metadata trainio.{short} is not JSON: {raw[:60]!r}"
                raise TraceError(msg) from None
        else:
            out[short] = raw
    return out


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


def scan_trace(path: str | os.PathLike[str]) -> pl.LazyFrame:
    """All rows of a trace as a lazy frame (segments concatenated in name order).

    String columns come back as ``pl.String``; ``layer``/``op`` comparisons push down
    into the Parquet reader, so ``scan_trace(t).filter(pl.col("layer") == "block")``
    reads only what it needs. The footers are checked (:func:`open_trace`), the rows
    are not: :func:`read_rows` and :func:`read_row_group` check them as SCHEMA.md's
    *Readers* section says, and are what the analyzer reads through.
    """
    members = trace_set_members(path)
    if members is not None:
        # as read_row_group reads a set: one clock, devices as HOST/MAJ:MIN
        return pl.concat(
            [
                scan_trace(m.path).with_columns(
                    *(pl.col(c) + m.shift_ns for c in TIME_COLUMNS),
                    pl.concat_str(pl.lit(f"{m.host}/"), pl.col("dev")).alias("dev"),
                )
                for m in members
            ],
            how="vertical",
        )
    lf = scan_segments(open_trace(path))
    return lf.with_columns(pl.col(sorted(STRING_COLUMNS)).cast(pl.String))


def _with_optional_columns(lf: pl.LazyFrame, names: Iterable[str]) -> pl.LazyFrame:
    """Adds the OPTIONAL_COLUMNS a segment lacks as nulls, in schema order."""
    absent = [c for c in OPTIONAL_COLUMNS if c not in names]
    if not absent:
        return lf
    lf = lf.with_columns(
        pl.lit(None, dtype=pl.from_arrow(pa.array([], COLUMN_TYPES[c])).dtype).alias(c) for c in absent
    )
    return lf.select([n for n, _, _ in COLUMNS])


def scan_segments(segments: Sequence[Segment]) -> pl.LazyFrame:
    """Lazy frame over already validated segments, string columns left categorical
    (cheaper to filter and group on than strings). Columns of later minor versions that
    a segment lacks read as null, so old and new traces look the same."""
    names = [
        tuple(s.arrow_schema.names)
        if s.arrow_schema is not None
        else tuple(_open_segment(s.source, s.path).schema_arrow.names)
        for s in segments
    ]
    if len(set(names)) <= 1:
        # by path: the lazy frame outlives the segments and their held descriptors
        lf = pl.scan_parquet([str(s.path) for s in segments])
        return _with_optional_columns(lf, names[0] if names else ())
    return pl.concat(
        [_with_optional_columns(pl.scan_parquet(str(s.path)), n) for s, n in zip(segments, names, strict=True)],
        how="vertical",
    )


def iter_row_groups(segments: Sequence[Segment], columns: Sequence[str]) -> Iterator[tuple[Segment, int, pa.Table]]:
    """Yield (segment, row-group index, table of ``columns``) one row group at a time."""
    for seg in segments:
        for i in range(len(seg.row_groups)):
            yield seg, i, read_row_group(seg, i, columns)


def read_row_group(
    segment: Segment,
    index: int,
    columns: Sequence[str],
    *,
    layer: str | None = None,
    op: str | None = None,
) -> pa.Table:
    """One row group of a segment, only ``columns``, checked (:func:`check_rows`) and with
    the integer columns in their SCHEMA.md types whatever width the writer used."""
    try:
        # one thread: callers read several row groups in parallel themselves
        pf = (
            pq.ParquetFile(segment.source, metadata=segment.footer)
            if segment.footer is not None
            else _open_segment(segment.source, segment.path)
        )
        table = pf.read_row_group(index, columns=list(columns), use_threads=False)
    except (pa.ArrowException, OSError, ValueError) as exc:
        msg = f"{segment.path}: row group {index} unreadable ({first_line(exc)})"
        raise TraceError(msg) from None
    table = check_rows(segment, index, table, layer=layer, op=op)
    return _on_set_clock(segment, table) if segment.host is not None else table


#: Columns that hold times on the trace's clock, moved by a set member's shift.
TIME_COLUMNS = ("issue_ns", "complete_ns", "insert_ns")


def _host_dev(host: str, dev: Any) -> Any:
    return None if dev is None else f"{host}/{dev}"


def _on_set_clock(segment: Segment, table: pa.Table) -> pa.Table:
    """A set member's rows as the set reads them: times on the set's clock, devices as
    ``HOST/MAJ:MIN`` (two hosts' 259:0 are two devices)."""
    host = segment.host
    for name in table.column_names:
        if name in TIME_COLUMNS and segment.shift_ns:
            col = pa.compute.add(table[name], pa.scalar(segment.shift_ns, pa.int64()))
        elif name == "dev":
            chunks = []
            for ch in table[name].chunks:
                if not pa.types.is_dictionary(ch.type):
                    ch = ch.dictionary_encode()
                values = pa.array([_host_dev(host, v) for v in ch.dictionary.to_pylist()], pa.string())
                chunks.append(pa.DictionaryArray.from_arrays(ch.indices.cast(pa.int32()), values))
            col = pa.chunked_array(chunks, pa.dictionary(pa.int32(), pa.string())) if chunks else table[name]
        else:
            continue
        table = table.set_column(table.schema.get_field_index(name), name, col)
    return table


def check_constants(segment: Segment, index: int, layer: str, op: str | None) -> None:
    """:func:`check_rows` for a row group whose statistics show one layer (and op) in it,
    for a caller that skips reading it."""
    check_rows(segment, index, pa.table({"issue_ns": pa.array([0], pa.int64())}), layer=layer, op=op)


def _where(segment: Segment, index: int, row: int | None = None) -> str:
    at = f"{segment.path}: row group {index}"
    return at if row is None else f"{at}, row {row}"


def _first_true(mask: Any) -> int:
    if isinstance(mask, (pa.Array, pa.ChunkedArray)):
        mask = mask.to_numpy(zero_copy_only=False)
    return int(np.argmax(mask))


def check_rows(
    segment: Segment, index: int, table: pa.Table, *, layer: str | None = None, op: str | None = None
) -> pa.Table:
    """Checks one row group's rows against SCHEMA.md; returns it with the integer columns
    in their SCHEMA.md types.

    Refused, with a TraceError naming the file, row group and row: a null in a column
    that is never null, an integer that does not fit its column's type,
    ``complete_ns < issue_ns``, and a layer or op that is not in SCHEMA.md's tables in
    a segment of a schema minor this reader knows (in a later one, :func:`known_rows`
    tells which rows to skip). ``layer``, ``op``: the column's value when the caller
    knows it from the row group's statistics and did not read the column.
    """
    cols = []
    for name in table.column_names:
        col = table.column(name)
        want = COLUMN_TYPES.get(name)
        if want is None:
            cols.append(col)
            continue
        if col.null_count and not _NULLABLE[name]:
            row = _first_true(col.is_null())
            msg = f"{_where(segment, index, row)}: null in column {name}, which is never null"
            raise TraceError(msg)
        if name in STRING_COLUMNS:
            # pyarrow does not check decoded dictionary indices or UTF-8: a corrupt page
            # can hold an index past its dictionary
            try:
                for chunk in col.chunks:
                    chunk.validate(full=True)
            except pa.ArrowInvalid as exc:
                msg = f"{_where(segment, index)}: column {name} corrupt ({first_line(exc)})"
                raise TraceError(msg) from None
        elif col.type != want:
            try:
                col = col.cast(want)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                lo, hi = _INT_RANGE[name]
                bad = pa.compute.or_(pa.compute.less(col, lo), pa.compute.greater(col, hi))
                row = _first_true(pa.compute.fill_null(bad, False))
                msg = (
                    f"{_where(segment, index, row)}: column {name} value {col[row].as_py()} "
                    f"does not fit its type {want}"
                )
                raise TraceError(msg) from None
        cols.append(col)
    table = pa.table(cols, names=table.column_names)
    if "issue_ns" in table.column_names and "complete_ns" in table.column_names:
        issue = table.column("issue_ns").to_numpy()
        complete = table.column("complete_ns").to_numpy()
        early = complete < issue
        if early.any():
            row = _first_true(early)
            msg = f"{_where(segment, index, row)}: complete_ns {complete[row]} < issue_ns {issue[row]}"
            raise TraceError(msg)
    if "layer" in table.column_names or layer is not None:
        _check_layers_ops(segment, index, table, layer, op)
    return table


def dictionary_codes(column: pa.ChunkedArray) -> tuple[np.ndarray, list[Any]]:
    """(code per row, its values) of a string column; the last value is None, the code
    of a null."""
    if column.num_chunks == 0:
        return np.zeros(0, np.int64), [None]
    array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    if not pa.types.is_dictionary(array.type):
        array = array.dictionary_encode()
    values = [*array.dictionary.to_pylist(), None]
    codes = array.indices.fill_null(len(values) - 1).to_numpy(zero_copy_only=False)
    return codes.astype(np.int64), values


def _check_layers_ops(segment: Segment, index: int, table: pa.Table, layer: str | None, op: str | None) -> None:
    names = table.column_names
    n = table.num_rows
    if n and "layer" not in names and "op" not in names:
        # one row stands for all: the op too when known, else only the layer is checked
        known = {"layer": pa.array([layer])} | ({} if op is None else {"op": pa.array([op])})
        table = pa.table(known)
        names, n = table.column_names, 1
        layer = op = None
    if "layer" in names:
        lcode, lvalues = dictionary_codes(table.column("layer"))
    else:
        lcode, lvalues = np.zeros(n, np.int64), [layer]
    if "op" in names:
        ocode, ovalues = dictionary_codes(table.column("op"))
    elif op is not None:
        ocode, ovalues = np.zeros(n, np.int64), [op]
    else:
        ocode, ovalues = None, [None]
    width = len(ovalues)
    pairs = lcode * width + (ocode if ocode is not None else 0)
    # which (layer, op) pairs occur: the dictionaries are small, so count codes
    seen = np.flatnonzero(np.bincount(pairs, minlength=1)) if n else np.zeros(0, np.int64)
    for pair in seen.tolist():
        lv = lvalues[pair // width]
        ov = ovalues[pair % width]
        if lv in OPS and (ocode is None or ov in OPS[lv]):
            continue
        if segment.minor > SCHEMA_MINOR:
            continue  # a later minor may add layers and ops: known_rows skips them
        row = _first_true(pairs == pair)
        what = f"layer {lv!r}" if lv not in OPS else f"op {ov!r} of layer {lv!r}"
        msg = (
            f"{_where(segment, index, row)}: unknown {what} in a schema 1.{segment.minor} "
            f"segment (SCHEMA.md lists the layers and ops)"
        )
        raise TraceError(msg)


def known_rows(table: pa.Table) -> pa.Array | None:
    """Which rows have a layer and op of SCHEMA.md's tables (None: all of them).

    Only a segment of a later schema minor than this reader's may hold others
    (:func:`check_rows` refuses them in any other); readers skip those rows.
    """
    layer = table["layer"].cast(pa.string())
    op = table["op"].cast(pa.string())
    known = None
    for lv, ops in OPS.items():
        m = pa.compute.and_(pa.compute.equal(layer, lv), pa.compute.is_in(op, pa.array(ops)))
        known = m if known is None else pa.compute.or_(known, m)
    if known is None or pa.compute.all(known).as_py() is not False:
        return None
    return known


def read_rows(path: str | os.PathLike[str]) -> pa.Table:
    """Every row of a trace in :data:`SCHEMA`, checked as the analyzer checks what it reads.

    Rows of layers or ops that a later schema minor added are left out; columns a
    segment lacks (an earlier minor) are null. For traces that fit in memory (tests,
    small tools); the analyzer streams row groups instead.
    """
    parts = []
    for seg in open_trace(path):
        names = (seg.arrow_schema or SCHEMA).names
        present = [n for n, _, _ in COLUMNS if n in names]
        for i in range(len(seg.row_groups)):
            t = read_row_group(seg, i, present)
            keep = known_rows(t)
            if keep is not None:
                t = t.filter(keep)
            cols = []
            for name, typ, _ in COLUMNS:
                if name not in t.column_names:
                    cols.append(pa.nulls(t.num_rows, typ))
                elif name in STRING_COLUMNS:
                    cols.append(t.column(name).cast(pa.string()).dictionary_encode().cast(typ))
                else:
                    cols.append(t.column(name))
            parts.append(pa.table(cols, schema=SCHEMA))
    return pa.concat_tables(parts) if parts else SCHEMA.empty_table()


def row_group_constant(segment: Segment, index: int, column: str) -> str | int | None:
    """The value of a column when the statistics show it is the same in every row of the
    row group (and never null), else None."""
    stats = segment.column_stats(index, column)
    try:
        if stats is None or not stats.has_min_max or stats.null_count != 0 or stats.min != stats.max:
            return None
        # a writer may truncate long string bounds: only exact ones prove a constant
        if not (getattr(stats, "is_min_value_exact", True) and getattr(stats, "is_max_value_exact", True)):
            return None
        value = stats.min
        value = value.decode() if isinstance(value, bytes) else value
        if segment.host is not None and column == "dev":
            return _host_dev(segment.host, value)
        if column in TIME_COLUMNS:
            return value + segment.shift_ns
        return value
    except (UnicodeDecodeError, ValueError, pa.ArrowException):
        # bounds that do not decode prove nothing: the rows themselves are read instead
        return None


def _row_group_stat(segment: Segment, index: int, column: str, which: str) -> int | None:
    stats = segment.column_stats(index, column)
    if stats is None or not stats.has_min_max:
        return None
    return int(getattr(stats, which)) + (segment.shift_ns if column in TIME_COLUMNS else 0)


def row_group_min(segment: Segment, index: int, column: str) -> int | None:
    """The Parquet statistics' minimum of ``column`` in one row group, if recorded."""
    return _row_group_stat(segment, index, column, "min")


def row_group_max(segment: Segment, index: int, column: str) -> int | None:
    """The Parquet statistics' maximum of ``column`` in one row group, if recorded."""
    return _row_group_stat(segment, index, column, "max")


# --------------------------------------------------------------------------- writing


def _to_table(rows: Any) -> pa.Table:
    if isinstance(rows, pa.Table):
        return rows
    if isinstance(rows, pl.DataFrame):
        return rows.to_arrow()
    if isinstance(rows, Mapping):
        return pa.table(dict(rows))
    rows = list(rows)
    if not rows:
        return SCHEMA.empty_table()
    # Union of keys over all rows: from_pylist would take the first row's keys only.
    keys = list(dict.fromkeys(k for row in rows for k in row))
    return pa.table({k: [row.get(k) for row in rows] for k in keys})


def conform(rows: Any) -> pa.Table:
    """Turn rows (list of dicts, column dict, polars or Arrow table) into SCHEMA exactly.

    Optional columns may be omitted: nullable ones become null, ``error``/``flags`` 0,
    ``bytes_requested`` = ``bytes``, ``tid`` = ``pid``, ``comm`` = ``"?"``.
    """
    table = _to_table(rows)
    n = table.num_rows
    have = set(table.column_names)
    cols: list[pa.Array | pa.ChunkedArray] = []
    for name, typ, _ in COLUMNS:
        if name in have:
            col = table.column(name)
        elif name in _NULL_DEFAULT:
            col = pa.nulls(n, pa.string() if name in STRING_COLUMNS else typ)
        elif name in _ZERO_DEFAULT:
            col = pa.array([0] * n, typ) if n < 4096 else pa.repeat(0, n).cast(typ)
        elif name == "bytes_requested" and "bytes" in have:
            col = table.column("bytes")
        elif name == "tid" and "pid" in have:
            col = table.column("pid")
        elif name == "comm":
            col = pa.repeat("?", n) if n else pa.array([], pa.string())
        else:
            msg = f"write_trace: required column {name} missing"
            raise TraceError(msg)
        if name in ("comm", "tid", "bytes_requested") and col.null_count:
            fill = {"comm": "?"}.get(name)
            if fill is None:
                fill_col = table.column("pid" if name == "tid" else "bytes")
                col = pa.chunked_array([pa.compute.coalesce(col, fill_col.cast(col.type))])
            else:
                col = pa.compute.fill_null(col.cast(pa.string()), fill)
        try:
            if name in STRING_COLUMNS:
                if not pa.types.is_dictionary(col.type):
                    col = col.cast(pa.string()).dictionary_encode()
                col = col.cast(typ)
            else:
                col = col.cast(typ)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            msg = f"write_trace: column {name} cannot be stored as {typ}: {exc}"
            raise TraceError(msg) from None
        if col.null_count and name not in _NULL_DEFAULT:
            msg = f"write_trace: column {name} must not contain nulls"
            raise TraceError(msg)
        cols.append(col)
    out = pa.table(cols, schema=SCHEMA)
    _check_rows(out)
    return out


def _check_rows(table: pa.Table) -> None:
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return
    if not pc.all(pc.greater_equal(table["complete_ns"], table["issue_ns"])).as_py():
        msg = "write_trace: complete_ns < issue_ns in some row"
        raise TraceError(msg)
    layers = set(pc.unique(table["layer"].cast(pa.string())).to_pylist())
    if not layers <= set(LAYERS):
        msg = f"write_trace: unknown layer(s) {sorted(layers - set(LAYERS))}"
        raise TraceError(msg)
    pairs = table.select(["layer", "op"]).group_by(["layer", "op"]).aggregate([])
    for layer, op in zip(pairs["layer"].to_pylist(), pairs["op"].to_pylist(), strict=True):
        if op not in OPS[layer]:
            msg = f"write_trace: op {op!r} is not a {layer} op"
            raise TraceError(msg)


def _meta_strings(metadata: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    for key, value in metadata.items():
        full = key if key.startswith(META_PREFIX) else META_PREFIX + key
        out[full] = value if isinstance(value, str) else json.dumps(value)
    return out


class TraceWriter:
    """Writes a trace segment by segment, as the tracer does: ``*.partial`` then rename.

    Parameters
    ----------
    directory
        The trace directory (created).
    metadata
        Key-value metadata, keys with or without the ``trainio.`` prefix; non-string
        values are JSON-encoded. Missing keys get neutral defaults; ``segment``,
        ``events``, ``layers``, ``start_ns``/``end_ns`` are maintained by the writer
        unless given.
    rows_per_segment, row_group_rows
        Segment and row-group sizes.

    Example
    -------
    >>> import tempfile
    >>> with TraceWriter(tempfile.mkdtemp()) as w:
    ...     w.write([{"layer": "file", "op": "read", "issue_ns": 5, "complete_ns": 9,
    ...               "bytes": 1, "queue_depth": 1, "pid": 7}])
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        metadata: Mapping[str, Any] | None = None,
        *,
        rows_per_segment: int = 4 << 20,
        row_group_rows: int = 1 << 20,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.user_meta = dict(metadata or {})
        self.rows_per_segment = rows_per_segment
        self.row_group_rows = row_group_rows
        self.paths: list[Path] = []
        self._writer: pq.ParquetWriter | None = None
        self._partial: Path | None = None
        self._seg_rows = 0
        self._events: dict[str, int] = {}
        self._start: int | None = None
        self._end: int | None = None

    def _given(self, key: str) -> bool:
        return key in self.user_meta or META_PREFIX + key in self.user_meta

    def _metadata(self) -> dict[str, str]:
        meta: dict[str, Any] = {
            "tracer_version": "trainio_analysis",
            "hostname": socket.gethostname(),
            "kernel_release": os.uname().release,
            "clock_offset_ns": 0,
            "start_ns": self._start if self._start is not None else 0,
            "end_ns": self._end if self._end is not None else 0,
        }
        for key, default in JSON_META_DEFAULTS.items():
            if default is not None:
                meta[key] = default
        meta["end"] = WRITTEN_END
        meta["layers"] = sorted(self._events)
        meta["events"] = dict(sorted(self._events.items()))
        meta.update({k.removeprefix(META_PREFIX): v for k, v in self.user_meta.items()})
        meta["schema_version"] = str(SCHEMA_VERSION)
        meta["schema_minor"] = str(SCHEMA_MINOR)
        meta["segment"] = str(len(self.paths))
        return _meta_strings(meta)

    def write(self, rows: Any) -> None:
        """Append rows (anything :func:`conform` accepts)."""
        table = conform(rows)
        offset = 0
        while offset < table.num_rows:
            if self._writer is None:
                self._open()
            take = min(table.num_rows - offset, self.rows_per_segment - self._seg_rows)
            piece = table.slice(offset, take)
            self._count(piece)
            assert self._writer is not None
            self._writer.write_table(piece, row_group_size=self.row_group_rows)
            self._seg_rows += take
            offset += take
            if self._seg_rows >= self.rows_per_segment:
                self._close_segment()

    def _count(self, piece: pa.Table) -> None:
        """Cumulative counters, so each segment's metadata is as of its closing."""
        lo = pa.compute.min(piece["issue_ns"]).as_py()
        hi = pa.compute.max(piece["complete_ns"]).as_py()
        self._start = lo if self._start is None else min(self._start, lo)
        self._end = hi if self._end is None else max(self._end, hi)
        for item in piece["layer"].cast(pa.string()).value_counts().to_pylist():
            self._events[item["values"]] = self._events.get(item["values"], 0) + item["counts"]

    def _open(self) -> None:
        name = f"seg-{len(self.paths):06d}.parquet"
        self._partial = self.directory / (name + ".partial")
        # Encodings are the writer's choice, not part of the format: integers delta-packed
        # (timestamps and counters change little from row to row; this reads ~3x faster
        # and is smaller than dictionary/plain), strings dictionary-encoded.
        self._writer = pq.ParquetWriter(
            self._partial,
            SCHEMA,
            compression="zstd",
            write_statistics=True,
            use_dictionary=sorted(STRING_COLUMNS),
            column_encoding={n: "DELTA_BINARY_PACKED" for n, _, _ in COLUMNS if n not in STRING_COLUMNS},
        )
        self._seg_rows = 0

    def _close_segment(self) -> None:
        assert self._writer is not None and self._partial is not None
        self._writer.add_key_value_metadata(self._metadata())
        self._writer.close()
        final = self._partial.with_suffix("")  # drop ".partial"
        self._partial.rename(final)
        self.paths.append(final)
        self._writer = None
        self._partial = None

    def close(self) -> list[Path]:
        """Close the open segment (an empty trace still gets one empty segment)."""
        if self._writer is None and not self.paths:
            self._open()
        if self._writer is not None:
            self._close_segment()
        return self.paths

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.close()
        else:  # nothing half-written: drop the open segment
            self.abort()

    def abort(self) -> None:
        """Discard the open segment (finished segments stay)."""
        if self._writer is not None:
            self._writer.close()
            assert self._partial is not None
            self._partial.unlink(missing_ok=True)
            self._writer = None
            self._partial = None


def write_trace(
    directory: str | os.PathLike[str],
    rows: Any | Iterable[Any],
    metadata: Mapping[str, Any] | None = None,
    *,
    rows_per_segment: int = 4 << 20,
    row_group_rows: int = 1 << 20,
) -> list[Path]:
    """Write rows as a trace directory; returns the segment paths.

    ``rows`` is a list of row dicts, a dict of columns, a polars or Arrow table, or an
    iterator of such chunks (a generator: each item is written as it comes, so a trace
    larger than memory can be produced).
    """
    with TraceWriter(directory, metadata, rows_per_segment=rows_per_segment, row_group_rows=row_group_rows) as writer:
        if isinstance(rows, Iterator):
            for chunk in rows:
                writer.write(chunk)
        else:
            writer.write(rows)
    return writer.paths
