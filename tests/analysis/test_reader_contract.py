"""One table of traces, run through both readers: SCHEMA.md's *Readers* contract.

Each case is read by the Python reader (``trace.read_rows``), by the Rust reader
(``trainio-trace-rows``, the reader of ``trainio replay --trace``), and analyzed by
``trainio analyze``. Both readers must return the same rows or both refuse the trace with
one line naming the file (and the row group and row where the case says), and analyze
must exit 0 or 2 accordingly.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from analysis_helpers import ROOT, block, fread, run_cli

from trainio_analysis import trace as tr
from trainio_analysis.errors import TraceError

RUST_READER = ROOT / "target/release/trainio-trace-rows"


def _base() -> pa.Table:
    return tr.conform([block(0, 20, qd=1), block(10, 30, qd=2), fread(5, 9, pid=7, file="/d/a"), block(40, 50, qd=1)])


def _with(table: pa.Table, name: str, values: list | pa.Array, typ: pa.DataType | None = None) -> pa.Table:
    col = values if isinstance(values, pa.Array) else pa.array(values, typ or table.schema.field(name).type)
    return table.set_column(table.schema.get_field_index(name), name, col)


def _cast(table: pa.Table, name: str, typ: pa.DataType) -> pa.Table:
    return _with(table, name, table[name].combine_chunks().cast(typ))


def _write(path: Path, table: pa.Table, *, minor: str | None = "3", version: str = "1", **kw: object) -> None:
    meta = {"trainio.schema_version": version}
    if minor is not None:
        meta["trainio.schema_minor"] = minor
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.replace_schema_metadata(meta), path, **kw)


def _seg(d: Path) -> Path:
    return d / "seg-000000.parquet"


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[Path], None]
    #: rows both readers return, or None: both refuse
    rows: int | None
    #: what the refusal's one line says besides the file (e.g. "row group 0, row 2")
    says: tuple[str, ...] = ()


def _layer_gpu(minor: str) -> Callable[[Path], None]:
    def make(d: Path) -> None:
        t = _base()
        _write(_seg(d), _with(t, "layer", pa.array(["block", "gpu", "file", "block"]).dictionary_encode()), minor=minor)

    return make


def _object_row() -> pa.Table:
    """The base with its second row an object request (schema 1.8) and its columns."""
    t = _with(_base(), "layer", pa.array(["block", "object", "file", "block"]).dictionary_encode())
    t = _with(t, "op", pa.array(["read", "get", "read", "read"]).dictionary_encode())
    t = _with(t, "endpoint", pa.array([None, "127.0.0.1:9000", None, None]).dictionary_encode())
    t = _with(t, "http_status", [None, 206, None, None])
    return _with(t, "first_byte_ns", [None, 12_000, None, None])


CASES = [
    Case("the recorder's types", lambda d: _write(_seg(d), _base()), 4),
    Case("int64 queue_depth", lambda d: _write(_seg(d), _cast(_base(), "queue_depth", pa.int64())), 4),
    Case(
        "every integer int64, every string plain",
        lambda d: _write(
            _seg(d),
            pa.table(
                [
                    c.cast(pa.string()) if pa.types.is_dictionary(c.type) else c.cast(pa.int64())
                    for c in _base().columns
                ],
                names=_base().column_names,
            ),
        ),
        4,
    ),
    Case(
        "narrow and unsigned widths",
        lambda d: _write(
            _seg(d), _cast(_cast(_cast(_base(), "pid", pa.uint64()), "error", pa.int8()), "bytes", pa.uint32())
        ),
        4,
    ),
    Case(
        "int64 queue_depth holding -1",
        lambda d: _write(_seg(d), _with(_base(), "queue_depth", [1, -1, 1, 1], pa.int64())),
        None,
        ("row group 0, row 1", "queue_depth"),
    ),
    Case(
        "uint64 pid above 2^32",
        lambda d: _write(_seg(d), _with(_base(), "pid", [1, 1, 1, 1 << 40], pa.uint64())),
        None,
        ("row group 0, row 3", "pid"),
    ),
    Case(
        "complete_ns < issue_ns",
        lambda d: _write(_seg(d), _with(_base(), "complete_ns", [20_000, 30_000, 9_000, 39_999])),
        None,
        ("row group 0, row 3", "complete_ns"),
    ),
    Case(
        "the fault in the second row group",
        lambda d: _write(_seg(d), _with(_base(), "complete_ns", [20_000, 30_000, 9_000, 39_999]), row_group_size=2),
        None,
        ("row group 1, row 1", "complete_ns"),
    ),
    Case("unknown layer, schema 1.3", _layer_gpu("3"), None, ("row group 0, row 1", "unknown layer", "gpu")),
    Case("unknown layer, schema 1.0", _layer_gpu(None), None, ("row group 0, row 1", "unknown layer", "gpu")),
    Case(f"unknown layer, a later minor (1.{tr.SCHEMA_MINOR + 1})", _layer_gpu(str(tr.SCHEMA_MINOR + 1)), 3),
    Case(
        "unknown op of a known layer",
        lambda d: _write(_seg(d), _with(_base(), "op", pa.array(["read", "trim", "read", "read"]).dictionary_encode())),
        None,
        ("row group 0, row 1", "unknown op", "trim"),
    ),
    *(
        Case(
            f"file-layer {op} row, schema 1.6",
            lambda d, op=op: _write(
                _seg(d), _with(_base(), "op", pa.array(["read", "read", op, "read"]).dictionary_encode()), minor="6"
            ),
            4,
        )
        for op in ("fault", "map_pages", "mmap", "madvise")
    ),
    Case(
        "a block row of the file layer's op fault",
        lambda d: _write(
            _seg(d), _with(_base(), "op", pa.array(["read", "fault", "read", "read"]).dictionary_encode()), minor="6"
        ),
        None,
        ("row group 0, row 1", "unknown op", "fault"),
    ),
    Case("an object-layer GET, schema 1.8", lambda d: _write(_seg(d), _object_row(), minor="8"), 4),
    Case(
        "a stray notes.parquet beside the segments",
        lambda d: (_write(_seg(d), _base()), pq.write_table(pa.table({"note": ["hello"]}), d / "notes.parquet")),
        4,
    ),
    Case(
        "only notes.parquet",
        lambda d: (d.mkdir(parents=True), pq.write_table(pa.table({"note": ["hello"]}), d / "notes.parquet")),
        None,
        ("empty trace",),
    ),
    Case(
        "a null in queue_depth",
        lambda d: _write(_seg(d), _with(_base(), "queue_depth", [1, None, 1, 1])),
        None,
        ("row group 0, row 1", "null in column queue_depth"),
    ),
    Case(
        "issue_ns as double",
        lambda d: _write(_seg(d), _cast(_base(), "issue_ns", pa.float64())),
        None,
        ("column issue_ns has type",),
    ),
    Case(
        "no pid column",
        lambda d: _write(_seg(d), _base().drop_columns(["pid"])),
        None,
        ("missing column(s) pid",),
    ),
    Case(
        "schema version 2",
        lambda d: _write(_seg(d), _base(), version="2"),
        None,
        ("unknown trainio.schema_version",),
    ),
    Case(
        "a 1.0 trace: no rpc_* or ppid columns",
        lambda d: _write(_seg(d), _base().drop_columns([*tr.OPTIONAL_COLUMNS]), minor=None),
        4,
    ),
    Case(
        "a column SCHEMA.md does not list",
        lambda d: _write(_seg(d), _base().append_column("gpu_id", pa.array([0, 1, 2, 3]))),
        4,
    ),
]


def python_read(trace: Path) -> tuple[list[dict] | None, str]:
    try:
        return tr.read_rows(trace).to_pylist(), ""
    except TraceError as exc:
        return None, str(exc)


def rust_read(trace: Path) -> tuple[list[dict] | None, str]:
    p = subprocess.run([str(RUST_READER), str(trace)], capture_output=True, text=True, timeout=60, check=False)
    if p.returncode == 0:
        return [json.loads(line) for line in p.stdout.splitlines()], ""
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.splitlines()) == 1, p.stderr
    return None, p.stderr.removeprefix("trainio-trace-rows: ").strip()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_both_readers_read_or_refuse_alike(case: Case, tmp_path: Path) -> None:
    assert RUST_READER.exists(), f"{RUST_READER} is missing: run make"
    trace = tmp_path / "trace"
    case.make(trace)
    py_rows, py_error = python_read(trace)
    rs_rows, rs_error = rust_read(trace)
    analyzed = run_cli("analyze", str(trace), "--json")
    if case.rows is None:
        assert py_rows is None and rs_rows is None, (py_error, rs_error)
        for who, message in (("python", py_error), ("rust", rs_error), ("analyze", analyzed.stderr.strip())):
            assert str(trace) in message, (who, message)
            for fragment in case.says:
                assert fragment in message, (who, fragment, message)
        assert analyzed.returncode == 2, analyzed.stderr
        assert len(analyzed.stderr.splitlines()) == 1, analyzed.stderr
    else:
        assert py_rows is not None, py_error
        assert rs_rows is not None, rs_error
        assert len(py_rows) == case.rows
        assert py_rows == rs_rows
        assert analyzed.returncode == 0, analyzed.stderr


CODECS = ["none", "snappy", "gzip", "brotli", "lz4", "zstd"]


@pytest.mark.parametrize("codec", CODECS)
def test_every_standard_codec_reads_the_same_rows_in_both_readers(codec: str, tmp_path: Path) -> None:
    """pyarrow writes the same trace (a real recording) with each codec."""
    sample = tr.list_segments(ROOT / "traces/unet3d-demo-8gpu")[0]
    pf = pq.ParquetFile(sample)
    trace = tmp_path / codec
    trace.mkdir()
    pq.write_table(pf.read().replace_schema_metadata(pf.metadata.metadata), _seg(trace), compression=codec)
    written = pq.ParquetFile(_seg(trace)).metadata.row_group(0).column(2).compression
    # pyarrow writes lz4 as LZ4_RAW, which its metadata calls LZ4
    assert written == {"none": "UNCOMPRESSED"}.get(codec, codec.upper())
    py_rows, py_error = python_read(trace)
    rs_rows, rs_error = rust_read(trace)
    assert py_rows is not None, py_error
    assert rs_rows is not None, rs_error
    assert py_rows == rs_rows
    assert py_rows == python_read(sample.parent)[0]
    assert len(py_rows) == pf.metadata.num_rows


def test_analyze_refuses_a_queue_depth_no_device_holds_in_one_line(tmp_path: Path) -> None:
    """A block row at QD 2^31 (a flipped bit in a fuzzed segment) is readable, but the
    analysis counts queue depths in arrays as long as the deepest: it is refused, named,
    rather than allocating 16 GiB and running for minutes."""
    trace = tmp_path / "trace"
    _write(_seg(trace), _with(_base(), "queue_depth", [1, 1 << 31, 1, 1]))
    analyzed = run_cli("analyze", str(trace), "--json")
    assert analyzed.returncode == 2, analyzed.stderr
    (line,) = analyzed.stderr.splitlines()
    assert str(trace) in line and f"queue_depth {1 << 31}" in line and "row group 0" in line, line
