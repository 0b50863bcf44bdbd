"""Opening a segment: its file held open (retention may remove it meanwhile), its footer
read, and its schema version and columns checked, all without reading a row."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from trainio_analysis.errors import TraceError
from trainio_analysis.trace import footer
from trainio_analysis.trace.schema import (
    COLUMNS,
    KNOWN_SCHEMA_VERSIONS,
    META_PREFIX,
    OPTIONAL_COLUMNS,
    SEGMENT_GLOB,
    STRING_COLUMNS,
)


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


def _raw_metadata(pf: pq.ParquetFile | pq.FileMetaData) -> dict[str, str]:
    """The ``trainio.`` key-value metadata of a segment (an opened file or its footer)."""
    md = pf.metadata if isinstance(pf, pq.ParquetFile) else pf
    kv = md.metadata or {}
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


def open_segment_files(files: Sequence[Path], reuse: Segment | None = None) -> list[Segment]:
    """The segments of ``files`` (one trace's, in name order) opened and checked, each file
    held open; a segment other than the last that is gone was removed by the recorder's
    retention since it was listed (SCHEMA.md) and is left out. ``reuse``: a segment of
    these files opened already (a set member's last), taken as it is."""
    segments = []
    for f in files:
        if reuse is not None and f == reuse.path:
            segments.append(reuse)
            continue
        try:
            held: _Held | None = _Held(os.open(f, os.O_RDONLY | os.O_CLOEXEC))
        except FileNotFoundError:
            if f != files[-1]:
                continue
            held = None
        except OSError:
            held = None  # _open_segment says why
        pf = _open_segment(held.path if held is not None else f, f)
        minor = _check_segment(f, pf)
        md = pf.metadata
        groups = tuple(md.row_group(i).num_rows for i in range(md.num_row_groups))
        segments.append(Segment(f, md.num_rows, groups, md, pf.schema_arrow, minor, held=held))
    return segments
