"""The trace format's contract on the Python side (traces/SCHEMA.md): the schema version, the
columns and their Arrow types, the layers and their ops, and the metadata keys."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa

try:
    from trainio_analysis import _native
except ImportError as exc:  # the schema is the Rust crate's: `make` builds the extension
    msg = "trainio_analysis._native is not built (it holds the trace schema): run make"
    raise ImportError(msg) from exc

# The version, columns, layers and ops are schema/src/lib.rs's (the Rust writer and
# reader), through the native module: one statement of the format in the repository.

#: ``trainio.schema_version`` and ``trainio.schema_minor`` written; any minor of a known
#: version is read (absent = 0).
SCHEMA_VERSION, SCHEMA_MINOR = _native.schema_version()


KNOWN_SCHEMA_VERSIONS = frozenset({SCHEMA_VERSION})


#: (what every metadata key starts with, [(key without it, how its value is written:
#: ``text``, ``int`` or ``json``, the JSON a writer writes when not told)])
_META_PREFIX, _META_KEYS = _native.metadata_keys()


META_PREFIX: str = _META_PREFIX


SEGMENT_GLOB = "seg-*.parquet"


DICT8 = pa.dictionary(pa.int8(), pa.string())


DICT16 = pa.dictionary(pa.int16(), pa.string())


DICT32 = pa.dictionary(pa.int32(), pa.string())


#: The Arrow types this reader handles, by the name pyarrow prints (the native module's).
_ARROW_TYPES = {
    str(t): t
    for t in (
        *(pa.int8(), pa.int16(), pa.int32(), pa.int64()),
        *(pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()),
        *(pa.string(), DICT8, DICT16, DICT32),
    )
}


def _arrow_type(column: str, name: str) -> pa.DataType:
    """The Arrow type the Rust schema gives ``column`` (a type unknown here is a build of
    the extension newer than this package)."""
    try:
        return _ARROW_TYPES[name]
    except KeyError:
        msg = f"trace schema: column {column} has type {name}, which this reader does not know"
        raise ImportError(msg) from None


#: (column, Arrow type, nullable) in the order SCHEMA.md lists them.
COLUMNS: tuple[tuple[str, pa.DataType, bool], ...] = tuple(
    (name, _arrow_type(name, typ), nullable) for name, typ, nullable in _native.schema_columns()
)


#: Columns added by minor versions: a trace written before them lacks them, and readers
#: see them as all-null columns.
OPTIONAL_COLUMNS: tuple[str, ...] = tuple(_native.optional_columns())


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


#: The layers (SCHEMA.md, *layer*) and the ops a row of each may have (*op*).
OPS: dict[str, tuple[str, ...]] = {layer: tuple(ops) for layer, ops in _native.layer_ops()}


LAYERS = tuple(OPS)


#: The layers whose rows are storage I/O, the ones an analysis characterizes; proc
#: (process lifecycle) and ipc (pipes, sockets) rows describe the job's structure.
STORAGE_LAYERS: tuple[str, ...] = tuple(_native.storage_layers())


#: Ops whose rows are counted in a layer's queue depth (SCHEMA.md, `queue_depth`).
QD_OPS: dict[str, tuple[str, ...]] = {layer: tuple(ops) for layer, ops in _native.qd_ops()}


#: Ops whose bytes are data transfers (throughput, sizes).
DATA_OPS: tuple[str, ...] = tuple(_native.data_ops())


#: Metadata keys whose values are JSON, with the value the writer fills in when not told
#: (``layers`` and ``events``: from the rows).
JSON_META_DEFAULTS: dict[str, Any] = {k: json.loads(d) for k, kind, d in _META_KEYS if kind == "json"}


#: ``trainio.end`` of a trace this module writes whole (import, slice of a complete trace)
WRITTEN_END = {"complete": True, "reason": "written"}


#: Metadata keys whose values are integers.
INT_META_KEYS: tuple[str, ...] = tuple(k for k, kind, _ in _META_KEYS if kind == "int")


#: Columns that hold times on the trace's clock, moved by a set member's shift.
TIME_COLUMNS = ("issue_ns", "complete_ns", "insert_ns")
