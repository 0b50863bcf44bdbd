"""Reading a trace or a trace set: its segments opened and checked from their footers, its
metadata, its rows lazily (polars) or one checked row group at a time, and the row
groups' statistics."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute
import pyarrow.parquet as pq

from trainio_analysis.errors import TraceError
from trainio_analysis.trace.check import check_rows, known_rows
from trainio_analysis.trace.schema import (
    COLUMN_TYPES,
    COLUMNS,
    DICT32,
    INT_META_KEYS,
    JSON_META_DEFAULTS,
    META_PREFIX,
    OPTIONAL_COLUMNS,
    SCHEMA,
    SEGMENT_GLOB,
    STRING_COLUMNS,
    TIME_COLUMNS,
)
from trainio_analysis.trace.segments import (
    Segment,
    _check_segment,
    _open_segment,
    _raw_metadata,
    first_line,
    list_segments,
    open_segment_files,
)
from trainio_analysis.trace.sets import Member, _set_metadata, open_set, trace_set_members


def open_trace(path: str | os.PathLike[str]) -> list[Segment]:
    """Validate a trace (or a trace set) from its footers and describe its segments.

    The segments of a set are its members' in member order, each carrying the member's
    host and clock shift, which :func:`read_row_group` and the row-group statistics apply.

    Raises
    ------
    TraceError
        not a trace, not Parquet, unknown schema version, a missing column, or no rows.
    """
    found = open_set(path)
    if found is None:
        return _open_plain(path)
    return _on_set_clocks(found, [_open_plain(m.path, last) for m, last in found])


def _open_plain(path: str | os.PathLike[str], last: Segment | None = None) -> list[Segment]:
    """The segments of a trace that is not a set (``last``: its last, opened already)."""
    files = list_segments(path)
    if not files:
        msg = f"{path}: empty trace (no {SEGMENT_GLOB} segments)"
        raise TraceError(msg)
    segments = open_segment_files(files, last)
    if sum(s.rows for s in segments) == 0:
        msg = f"{path}: empty trace (no rows)"
        raise TraceError(msg)
    return segments


def _on_set_clocks(found: Sequence[tuple[Member, Segment]], parts: Sequence[list[Segment]]) -> list[Segment]:
    """A set's segments: each member's, in member order, with its host and clock shift."""
    return [
        replace(s, shift_ns=m.shift_ns, host=m.host) for (m, _), segs in zip(found, parts, strict=True) for s in segs
    ]


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
    return _metadata(last, _raw_metadata(pf))


def _metadata(last: Path, raw: dict[str, str]) -> dict[str, Any]:
    """:func:`read_metadata` of the raw key-value metadata of a trace's ``last`` segment."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        short = key[len(META_PREFIX) :]
        if short in INT_META_KEYS:
            try:
                out[short] = int(value)
            except ValueError:
                out[short] = value
        elif short in JSON_META_DEFAULTS:
            try:
                out[short] = json.loads(value)
            except json.JSONDecodeError:
                msg = f"{last}: metadata trainio.{short} is not JSON: {value[:60]!r}"
                raise TraceError(msg) from None
        else:
            out[short] = value
    return out


def scan_trace(path: str | os.PathLike[str]) -> pl.LazyFrame:
    """All rows of a trace as a lazy frame (segments concatenated in name order).

    String columns come back as ``pl.String``; ``layer``/``op`` comparisons push down
    into the Parquet reader, so ``scan_trace(t).filter(pl.col("layer") == "block")``
    reads only what it needs. The footers are checked (:func:`open_trace`), the rows
    are not: :func:`read_rows` and :func:`read_row_group` check them as SCHEMA.md's
    *Readers* section says, and are what the analyzer reads through.
    """
    found = open_set(path)
    if found is None:
        return _scan_plain(_open_plain(path))
    return _scan_set([m for m, _ in found], [_open_plain(m.path, last) for m, last in found])


def _scan_plain(segments: Sequence[Segment]) -> pl.LazyFrame:
    """A trace's rows (not a set's), string columns as ``pl.String``."""
    return scan_segments(segments).with_columns(pl.col(sorted(STRING_COLUMNS)).cast(pl.String))


def _scan_set(members: Sequence[Member], parts: Sequence[Sequence[Segment]]) -> pl.LazyFrame:
    """A set's rows as read_row_group reads them: one clock, devices as HOST/MAJ:MIN."""
    return pl.concat(
        [
            _scan_plain(segs).with_columns(
                *(pl.col(c) + m.shift_ns for c in TIME_COLUMNS),
                pl.concat_str(pl.lit(f"{m.host}/"), pl.col("dev")).alias("dev"),
            )
            for m, segs in zip(members, parts, strict=True)
        ],
        how="vertical",
    )


@dataclass(frozen=True)
class Trace:
    """A trace or a trace set opened once, for a command to pass along instead of its path:
    its segments (footers checked, files held open, row-group statistics at hand), its
    metadata and, for a set, its members and each member as a trace of its own.

    Example
    -------
    >>> t = Trace.open("traces/unet3d-demo-1gpu")  # doctest: +SKIP
    >>> t.meta["hostname"], len(t.segments)  # doctest: +SKIP
    """

    #: the path as given (messages name it so)
    path: str | os.PathLike[str]
    #: as :func:`open_trace` gives them: a set's on the set's clock
    segments: tuple[Segment, ...]
    #: as :func:`read_metadata` gives it
    meta: dict[str, Any]
    #: a set's members (None: not a set) and each one's trace
    members: tuple[Member, ...] | None = None
    member_traces: tuple[Trace, ...] = ()

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Trace:
        """Open and check the trace at ``path`` (raises what :func:`open_trace` and
        :func:`read_metadata` raise)."""
        found = open_set(path)
        if found is None:
            segments = _open_plain(path)
            return cls(path, tuple(segments), _metadata(segments[-1].path, _raw_metadata(segments[-1].footer)))
        parts = [_open_plain(m.path, last) for m, last in found]
        members = tuple(m for m, _ in found)
        traces = tuple(
            cls(m.path, tuple(segs), _metadata(segs[-1].path, _raw_metadata(segs[-1].footer)))
            for m, segs in zip(members, parts, strict=True)
        )
        meta = _set_metadata(members, [t.meta for t in traces])
        return cls(path, tuple(_on_set_clocks(found, parts)), meta, members, traces)

    @classmethod
    def of(cls, trace: str | os.PathLike[str] | Trace) -> Trace:
        """``trace`` when it is opened already, else the trace at that path opened."""
        return trace if isinstance(trace, Trace) else cls.open(trace)

    def scan(self) -> pl.LazyFrame:
        """:func:`scan_trace` of this trace."""
        if self.members is None:
            return _scan_plain(self.segments)
        return _scan_set(self.members, [t.segments for t in self.member_traces])

    def row_batches(self) -> Iterator[pa.RecordBatch]:
        """Every row of the trace in :data:`ROWS_SCHEMA`, one row group at a time, read
        through the held files and checked as :func:`read_row_group` checks them; rows of
        layers or ops that a later schema minor added are left out. A trace set's rows are
        its members' (``member_traces``), each on its own clock: take them one member at a
        time. For a reader in another language: the job model reads these batches through
        the Arrow C stream interface (``pa.RecordBatchReader.from_batches``)."""
        if self.members is not None:
            msg = f"{self.path}: a trace set's rows are read one member at a time"
            raise ValueError(msg)
        for seg in self.segments:
            for i in range(len(seg.row_groups)):
                yield from model_rows(read_row_group(seg, i, segment_columns(seg))).to_batches()


#: The rows :meth:`Trace.row_batches` hands over: every column, the string columns
#: dictionary-encoded with 32-bit indices whatever the writer used (one schema for every
#: segment), the integer columns in their SCHEMA.md types.
ROWS_SCHEMA = pa.schema([pa.field(n, DICT32 if n in STRING_COLUMNS else t, nullable=null) for n, t, null in COLUMNS])


def segment_columns(segment: Segment) -> list[str]:
    """The schema's columns a segment has (an earlier minor lacks some), in schema order:
    what :meth:`Trace.row_batches` reads of each row group."""
    names = (segment.arrow_schema or SCHEMA).names
    return [n for n, _, _ in COLUMNS if n in names]


def model_rows(table: pa.Table) -> pa.Table:
    """A row group read with :func:`segment_columns` (and checked, as
    :func:`read_row_group` does) as the job model takes it: in :data:`ROWS_SCHEMA`,
    without the rows of layers or ops that a later schema minor added."""
    keep = known_rows(table)
    if keep is not None:
        table = table.filter(keep)
    cols = [_as_rows_type(table, name, typ) for name, typ in zip(ROWS_SCHEMA.names, ROWS_SCHEMA.types, strict=True)]
    return pa.table(cols, schema=ROWS_SCHEMA)


def _as_rows_type(table: pa.Table, name: str, typ: pa.DataType) -> pa.ChunkedArray:
    """Column ``name`` of a checked row group in its :data:`ROWS_SCHEMA` type (nulls when
    the segment lacks it)."""
    if name not in table.column_names:
        return pa.chunked_array([pa.nulls(table.num_rows, typ)], typ)
    col = table.column(name)
    if col.type == typ:
        return col
    if name in STRING_COLUMNS and not pa.types.is_dictionary(col.type):
        # plain strings (any of Arrow's three): dictionary-encoded, as a writer of ours does
        col = pa.compute.dictionary_encode(col.cast(pa.string()))
    elif name in STRING_COLUMNS and col.type.value_type != pa.string():
        col = col.cast(pa.dictionary(col.type.index_type, pa.string()))
    return col.cast(typ)


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


def read_member_row_group(segment: Segment, index: int, columns: Sequence[str]) -> tuple[pa.Table, pa.Table]:
    """A trace set's row group (``segment`` of the set, :attr:`Trace.segments`) read once,
    as its member reads it (its own clock and devices, as :meth:`Trace.row_batches` of the
    member) and as the set reads it (:func:`read_row_group`)."""
    own = read_row_group(replace(segment, shift_ns=0, host=None), index, columns)
    return own, _on_set_clock(segment, own)


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


def read_rows(path: str | os.PathLike[str]) -> pa.Table:
    """Every row of a trace in :data:`SCHEMA`, checked as the analyzer checks what it reads.

    Rows of layers or ops that a later schema minor added are left out; columns a
    segment lacks (an earlier minor) are null. For traces that fit in memory (tests,
    small tools); the analyzer streams row groups instead.
    """
    parts = []
    for t in _known_row_groups(open_trace(path)):
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


def _known_row_groups(segments: Iterable[Segment]) -> Iterator[pa.Table]:
    """Each row group of `segments` in turn, every column its segment has, checked, without
    the rows of layers or ops that a later schema minor added."""
    for seg in segments:
        present = segment_columns(seg)
        for i in range(len(seg.row_groups)):
            t = read_row_group(seg, i, present)
            keep = known_rows(t)
            yield t if keep is None else t.filter(keep)


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
