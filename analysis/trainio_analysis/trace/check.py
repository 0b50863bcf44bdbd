"""The checks of rows as they are read (SCHEMA.md, *Readers*): nulls where a column is never
null, integers that do not fit, ``complete_ns < issue_ns``, unknown layers and ops."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute

from trainio_analysis.errors import TraceError
from trainio_analysis.trace.schema import _INT_RANGE, _NULLABLE, COLUMN_TYPES, OPS, SCHEMA_MINOR, STRING_COLUMNS
from trainio_analysis.trace.segments import Segment, first_line


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
