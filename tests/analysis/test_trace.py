"""The Python reader/writer keeps to traces/SCHEMA.md and refuses what is not a trace."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from analysis_helpers import block, fread, schema_md_columns

from trainio_analysis import trace as tr
from trainio_analysis.errors import TraceError, TrainioError

# the column table of traces/SCHEMA.md (test_schema_agreement.py checks the readers against it)
SCHEMA_MD_TYPES = {name: typ for name, typ, _ in schema_md_columns()}
RPC_COLUMNS = ["rpc_xid", "rpc_backlog_ns", "rpc_rtt_ns", "rpc_execute_ns", "rpc_retrans"]
NULLABLE = {name for name, _, nullable in schema_md_columns() if nullable}
SAMPLES = Path(__file__).resolve().parents[2] / "traces"


def _rows() -> list[dict]:
    return [block(0, 20, qd=1), block(10, 30, qd=2), fread(5, 9, pid=7, file="/d/a")]


def test_segments_have_exact_schema_types_and_zstd(trace_dir: Path) -> None:
    paths = tr.write_trace(trace_dir, _rows())
    assert [p.name for p in paths] == ["seg-000000.parquet"]
    pf = pq.ParquetFile(paths[0])
    schema = pf.schema_arrow
    assert schema.names == list(SCHEMA_MD_TYPES)
    for name, typ in SCHEMA_MD_TYPES.items():
        assert str(schema.field(name).type) == typ, name
        assert schema.field(name).nullable == (name in NULLABLE), name
    md = pf.metadata
    codecs = {md.row_group(0).column(i).compression for i in range(md.num_columns)}
    assert codecs == {"ZSTD"}


def test_metadata_keys_values_and_last_segment_wins(trace_dir: Path) -> None:
    rows = [block(i * 10, i * 10 + 5, qd=1) for i in range(5)]
    tr.write_trace(
        trace_dir,
        rows,
        {"lost_events": {"block_rq_issue": 3}, "hostname": "h1"},
        rows_per_segment=2,
    )
    segs = tr.list_segments(trace_dir)
    assert [s.name for s in segs] == [f"seg-00000{i}.parquet" for i in range(3)]
    first = {
        k.decode(): v.decode()
        for k, v in pq.ParquetFile(segs[0]).metadata.metadata.items()
        if k.startswith(b"trainio.")
    }
    assert first["trainio.schema_version"] == "1"
    assert first["trainio.schema_minor"] == str(tr.SCHEMA_MINOR)
    assert first["trainio.segment"] == "0"
    assert json.loads(first["trainio.events"]) == {"block": 2}  # cumulative as of closing
    for key in (
        "tracer_version",
        "hostname",
        "kernel_release",
        "clock_offset_ns",
        "start_ns",
        "end_ns",
        "layers",
        "skipped_probes",
        "target",
        "devices",
        "lost_events",
        "bpf_stats",
        "events",
    ):
        assert f"trainio.{key}" in first, key
    meta = tr.read_metadata(trace_dir)
    assert meta["segment"] == 2
    assert meta["events"] == {"block": 5}
    assert meta["layers"] == ["block"]
    assert meta["lost_events"] == {"block_rq_issue": 3}
    assert meta["hostname"] == "h1"
    assert meta["start_ns"] == 0
    assert meta["end_ns"] == 45_000


def test_scan_concatenates_segments_in_name_order_and_ignores_partial(trace_dir: Path) -> None:
    rows = [block(i, i + 1, qd=1, nbytes=i + 1) for i in range(7)]
    tr.write_trace(trace_dir, rows, rows_per_segment=3)
    (trace_dir / "seg-000003.parquet.partial").write_bytes(b"half a segment")
    df = tr.scan_trace(trace_dir).collect()
    assert df["bytes"].to_list() == [1, 2, 3, 4, 5, 6, 7]
    assert df.schema["layer"] == pl.String
    assert df["dev"].to_list() == ["7:0"] * 7


def test_single_parquet_file_is_a_one_segment_trace(trace_dir: Path) -> None:
    tr.write_trace(trace_dir, _rows())
    single = trace_dir / "seg-000000.parquet"
    assert tr.scan_trace(single).collect().height == 3


def test_writer_fills_optional_columns_and_rejects_bad_rows(trace_dir: Path) -> None:
    tr.write_trace(
        trace_dir,
        [
            {
                "layer": "file",
                "op": "open",
                "issue_ns": 1,
                "complete_ns": 2,
                "bytes": 0,
                "queue_depth": 0,
                "pid": 9,
            }
        ],
    )
    row = tr.scan_trace(trace_dir).collect().row(0, named=True)
    assert row["tid"] == 9 and row["comm"] == "?" and row["error"] == 0 and row["flags"] == 0
    assert row["bytes_requested"] == 0 and row["file"] is None and row["offset"] is None
    with pytest.raises(TraceError, match="complete_ns < issue_ns"):
        tr.write_trace(trace_dir / "x", [block(10, 5, qd=1)])
    with pytest.raises(TraceError, match="not a block op"):
        tr.write_trace(trace_dir / "y", [{**block(0, 1, qd=1), "op": "open"}])
    with pytest.raises(TraceError, match="queue_depth missing"):
        tr.write_trace(trace_dir / "z", [{k: v for k, v in block(0, 1, qd=1).items() if k != "queue_depth"}])
    # a failed write leaves nothing behind, not even a .partial
    assert not list((trace_dir / "z").glob("*"))


def _nfs_read(xid: int | None) -> dict:
    row = {
        "layer": "nfs",
        "op": "read",
        "issue_ns": 0,
        "complete_ns": 900_000,
        "dev": "0:30",
        "offset": 0,
        "bytes": 65536,
        "queue_depth": 1,
        "pid": 3,
    }
    if xid is not None:
        row |= {
            "rpc_xid": xid,
            "rpc_backlog_ns": 1000,
            "rpc_rtt_ns": 500_000,
            "rpc_execute_ns": 800_000,
            "rpc_retrans": 0,
        }
    return row


def test_rpc_columns_round_trip_and_default_to_null(trace_dir: Path) -> None:
    tr.write_trace(trace_dir, [_nfs_read(0x1234ABCD), _nfs_read(None), block(0, 5, qd=1)])
    df = tr.scan_trace(trace_dir).collect()
    assert df["rpc_xid"].to_list() == [0x1234ABCD, None, None]
    assert df["rpc_rtt_ns"].to_list() == [500_000, None, None]
    assert df["rpc_retrans"].dtype == pl.UInt32


def test_a_1_0_trace_without_rpc_columns_reads_with_them_null(trace_dir: Path) -> None:
    """1.0 segments (no rpc_* columns, no schema_minor) are read, alone or mixed with 1.1."""
    old = tr.conform([block(0, 5, qd=1), fread(1, 3, pid=7, file="/d/a")]).drop_columns([*RPC_COLUMNS, "ppid"])
    trace_dir.mkdir()
    _write_table(trace_dir / "seg-000000.parquet", old)
    df = tr.scan_trace(trace_dir).collect()
    assert df.columns == list(SCHEMA_MD_TYPES)
    assert df.height == 2 and df["rpc_xid"].null_count() == 2
    assert df.schema["rpc_execute_ns"] == pl.Int64
    assert "schema_minor" not in tr.read_metadata(trace_dir)
    # a later 1.1 segment in the same directory
    tr.write_trace(trace_dir / "new", [_nfs_read(7)])
    (trace_dir / "new" / "seg-000000.parquet").rename(trace_dir / "seg-000001.parquet")
    df = tr.scan_trace(trace_dir).collect()
    assert df["rpc_xid"].to_list() == [None, None, 7]
    assert tr.read_metadata(trace_dir)["schema_minor"] == tr.SCHEMA_MINOR


#: The proc and ipc rows of schema/testdata/python-1.3.parquet (written by
#: write_trace; the Rust reader's test reads the same file and expects the same).
PROC_IPC_ROWS = [
    {
        "layer": "proc",
        "op": "start",
        "issue_ns": 100,
        "complete_ns": 100,
        "bytes": 0,
        "queue_depth": 0,
        "pid": 4100,
        "ppid": 4000,
        "comm": "python",
        "file": "python train.py",
    },
    {
        "layer": "proc",
        "op": "fork",
        "issue_ns": 200,
        "complete_ns": 200,
        "bytes": 0,
        "queue_depth": 0,
        "pid": 4101,
        "ppid": 4100,
        "comm": "python",
    },
    {
        "layer": "proc",
        "op": "comm",
        "issue_ns": 300,
        "complete_ns": 300,
        "bytes": 0,
        "queue_depth": 0,
        "pid": 4101,
        "ppid": 4100,
        "comm": "pt_data_worker",
    },
    {
        "layer": "ipc",
        "op": "write",
        "issue_ns": 400,
        "complete_ns": 450,
        "bytes": 64,
        "bytes_requested": 64,
        "queue_depth": 0,
        "pid": 4101,
        "comm": "pt_data_worker",
        "fd": 9,
        "dev": "0:15",
        "file": "pipe:[777]",
    },
    {
        "layer": "ipc",
        "op": "wait",
        "issue_ns": 350,
        "complete_ns": 452,
        "bytes": 1,
        "bytes_requested": 1,
        "queue_depth": 0,
        "pid": 4100,
        "comm": "python",
        "fd": 8,
        "dev": "0:15",
        "file": "pipe:[777]",
    },
    {
        "layer": "proc",
        "op": "exit",
        "issue_ns": 500,
        "complete_ns": 500,
        "bytes": 0,
        "queue_depth": 0,
        "pid": 4101,
        "ppid": 4100,
        "comm": "pt_data_worker",
    },
    fread(600, 700, pid=4100, file="/d/a"),
]


def test_a_1_3_trace_has_proc_and_ipc_rows_and_ppid(trace_dir: Path) -> None:
    tr.write_trace(trace_dir, PROC_IPC_ROWS)
    df = tr.scan_trace(trace_dir).collect()
    assert df.schema["ppid"] == pl.UInt32
    assert df["ppid"].to_list() == [4000, 4100, 4100, None, None, 4100, None]
    assert df["layer"].to_list() == ["proc"] * 3 + ["ipc"] * 2 + ["proc", "file"]
    assert df.filter(pl.col("layer") == "ipc")["file"].to_list() == ["pipe:[777]"] * 2
    meta = tr.read_metadata(trace_dir)
    assert meta["schema_minor"] == tr.SCHEMA_MINOR
    assert meta["events"] == {"file": 1, "ipc": 2, "proc": 4}
    with pytest.raises(TraceError, match="not a proc op"):
        tr.write_trace(trace_dir / "bad", [{**PROC_IPC_ROWS[0], "op": "read"}])


def test_the_python_written_1_3_sample_matches_its_rows(tmp_path: Path) -> None:
    """schema/testdata/python-1.3.parquet holds PROC_IPC_ROWS as write_trace writes them
    (the Rust reader's test reads it too): regenerate it from these rows if they change."""
    sample = Path(__file__).resolve().parents[2] / "schema" / "testdata" / "python-1.3.parquet"
    tr.write_trace(tmp_path / "t", PROC_IPC_ROWS)
    assert tr.scan_trace(sample).collect().equals(tr.scan_trace(tmp_path / "t").collect())
    assert tr.read_metadata(sample)["schema_minor"] == 3


def test_a_1_2_trace_without_ppid_reads_it_as_null(trace_dir: Path) -> None:
    old = tr.conform([block(0, 5, qd=1), fread(1, 3, pid=7, file="/d/a")]).drop_columns(["ppid"])
    trace_dir.mkdir()
    table = old.replace_schema_metadata({"trainio.schema_version": "1", "trainio.schema_minor": "2"})
    pq.write_table(table, trace_dir / "seg-000000.parquet")
    df = tr.scan_trace(trace_dir).collect()
    assert df.columns == list(SCHEMA_MD_TYPES)
    assert df["ppid"].to_list() == [None, None] and df.schema["ppid"] == pl.UInt32
    assert tr.read_metadata(trace_dir)["schema_minor"] == 2


def test_the_recorded_sample_traces_predate_1_1_and_still_read() -> None:
    for sample in sorted(SAMPLES.glob("unet3d-demo-*")):
        seg = tr.list_segments(sample)[0]
        assert "rpc_xid" not in pq.ParquetFile(seg).schema_arrow.names
        df = tr.scan_trace(sample).select(RPC_COLUMNS + ["bytes"]).collect()
        assert df.height > 0 and df["rpc_xid"].null_count() == df.height, sample


def test_rpc_column_of_a_wrong_type_is_refused(tmp_path: Path) -> None:
    good = tr.conform([_nfs_read(1)])
    bad = good.set_column(
        good.schema.get_field_index("rpc_rtt_ns"), "rpc_rtt_ns", good["rpc_rtt_ns"].cast(pa.float64())
    )
    _write_table(tmp_path / "seg-000000.parquet", bad)
    with pytest.raises(TraceError, match="rpc_rtt_ns has type double"):
        tr.scan_trace(tmp_path)


def test_writer_accepts_polars_and_chunk_iterators(trace_dir: Path) -> None:
    df = pl.DataFrame(_rows()[:2])
    tr.write_trace(trace_dir, iter([df, df]))
    assert tr.scan_trace(trace_dir).collect().height == 4


def _write_table(path: Path, table: pa.Table, version: str | None = "1") -> None:
    meta = {} if version is None else {"trainio.schema_version": version}
    pq.write_table(table.replace_schema_metadata(meta), path)


def test_errors_name_the_file(tmp_path: Path) -> None:
    good = tr.conform(_rows())
    cases = {
        "notparquet": (lambda p: p.write_text("hello"), "not a readable Parquet file"),
        "version": (lambda p: _write_table(p, good, "2"), "unknown trainio.schema_version '2'"),
        "noversion": (lambda p: _write_table(p, good, None), "not a trainio trace"),
        "missing": (
            lambda p: _write_table(p, good.drop_columns(["queue_depth"])),
            "missing column\\(s\\) queue_depth",
        ),
        "wrongtype": (
            lambda p: _write_table(p, good.set_column(2, "issue_ns", good["issue_ns"].cast(pa.float64()))),
            "issue_ns has type double",
        ),
        "empty": (lambda p: _write_table(p, good.slice(0, 0)), "empty trace"),
    }
    for name, (make, message) in cases.items():
        d = tmp_path / name
        d.mkdir()
        seg = d / "seg-000000.parquet"
        make(seg)
        with pytest.raises(TraceError, match=message) as info:
            tr.scan_trace(d)
        assert str(info.value).startswith(str(d)), name
        assert isinstance(info.value, TrainioError)
    with pytest.raises(TraceError, match="no seg-"):
        tr.open_trace(tmp_path / "empty-dir-" if (tmp_path / "empty-dir-").mkdir() is None else "")
    with pytest.raises(TraceError, match="no such trace"):
        tr.open_trace(tmp_path / "absent")
