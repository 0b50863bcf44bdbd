"""The trace format's contract on the Python side (traces/SCHEMA.md): the schema version, the
columns and their Arrow types, the layers and their ops, and the metadata keys."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

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


#: Columns that hold times on the trace's clock, moved by a set member's shift.
TIME_COLUMNS = ("issue_ns", "complete_ns", "insert_ns")
