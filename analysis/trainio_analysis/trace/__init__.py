"""The Python reader and writer of the trainio trace format (traces/SCHEMA.md, version 1.9).

This is the only Python package that knows column names, Arrow types and metadata keys;
everything else imports the names from here. A trace is a directory of
``seg-NNNNNN.parquet`` segments (``*.partial`` files are ignored) or a single Parquet file.

Its parts: ``schema`` (the columns, layers, ops and metadata keys), ``segments`` (a
segment opened and its footer checked), ``sets`` (trace sets), ``check`` (rows checked as
they are read), ``read`` and ``write``. Import the names from the package.

A command opens its trace once, as a :class:`Trace` (segments, metadata, set members),
and passes that along.

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

from trainio_analysis.trace.check import (
    check_constants,
    check_rows,
    dictionary_codes,
    known_rows,
)
from trainio_analysis.trace.read import (
    ROWS_SCHEMA,
    Trace,
    iter_row_groups,
    model_rows,
    open_trace,
    read_member_row_group,
    read_metadata,
    read_row_group,
    read_rows,
    row_group_constant,
    row_group_max,
    row_group_min,
    scan_segments,
    scan_trace,
    segment_columns,
)
from trainio_analysis.trace.schema import (
    COLUMN_TYPES,
    COLUMNS,
    DATA_OPS,
    DICT8,
    DICT16,
    DICT32,
    INT_META_KEYS,
    JSON_META_DEFAULTS,
    KNOWN_SCHEMA_VERSIONS,
    LAYERS,
    META_PREFIX,
    OPS,
    OPTIONAL_COLUMNS,
    QD_OPS,
    SCHEMA,
    SCHEMA_MINOR,
    SCHEMA_VERSION,
    SEGMENT_GLOB,
    STORAGE_LAYERS,
    STRING_COLUMNS,
    TIME_COLUMNS,
    WRITTEN_END,
)
from trainio_analysis.trace.segments import (
    Segment,
    first_line,
    list_segments,
)
from trainio_analysis.trace.sets import (
    Member,
    recording_complete,
    trace_set_members,
)
from trainio_analysis.trace.write import (
    TraceWriter,
    conform,
    write_trace,
)

__all__ = [
    "SCHEMA_VERSION",
    "SCHEMA_MINOR",
    "KNOWN_SCHEMA_VERSIONS",
    "META_PREFIX",
    "SEGMENT_GLOB",
    "DICT8",
    "DICT16",
    "DICT32",
    "COLUMNS",
    "OPTIONAL_COLUMNS",
    "SCHEMA",
    "COLUMN_TYPES",
    "STRING_COLUMNS",
    "LAYERS",
    "STORAGE_LAYERS",
    "OPS",
    "QD_OPS",
    "DATA_OPS",
    "JSON_META_DEFAULTS",
    "WRITTEN_END",
    "INT_META_KEYS",
    "TIME_COLUMNS",
    "Segment",
    "list_segments",
    "first_line",
    "Member",
    "recording_complete",
    "trace_set_members",
    "check_constants",
    "check_rows",
    "dictionary_codes",
    "known_rows",
    "Trace",
    "ROWS_SCHEMA",
    "open_trace",
    "read_metadata",
    "scan_trace",
    "scan_segments",
    "segment_columns",
    "model_rows",
    "iter_row_groups",
    "read_member_row_group",
    "read_row_group",
    "read_rows",
    "row_group_constant",
    "row_group_min",
    "row_group_max",
    "conform",
    "TraceWriter",
    "write_trace",
]
