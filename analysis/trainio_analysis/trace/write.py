"""Writing a trace as the tracer does (``*.partial`` then rename): rows conformed to the
schema and checked, segments closed with their metadata."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute
import pyarrow.parquet as pq

from trainio_analysis.errors import TraceError
from trainio_analysis.trace.schema import (
    COLUMNS,
    JSON_META_DEFAULTS,
    LAYERS,
    META_PREFIX,
    OPS,
    OPTIONAL_COLUMNS,
    SCHEMA,
    SCHEMA_MINOR,
    SCHEMA_VERSION,
    STRING_COLUMNS,
    WRITTEN_END,
)

# Columns a caller of write_trace may omit, and how they are filled.
_NULL_DEFAULT = ("insert_ns", "dev", "offset", "fd", "file", *OPTIONAL_COLUMNS)


_ZERO_DEFAULT = ("error", "flags")


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
