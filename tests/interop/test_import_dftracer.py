"""`trainio import --dftracer`: the real dftracer (PyPI package, its LD_PRELOAD POSIX
tracer) records a Python reader of real files while `trainio record --layers file`
records the same run; the imported trace and trainio's own agree on every read."""

from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path

import polars as pl
import pytest
from interop_helpers import analyze_json, ok

from trainio_analysis.trace import read_metadata, scan_trace
from trainio_testlib import require_root, trainio

READER = r"""
import os, sys
data = sys.argv[1]
for name in sorted(os.listdir(data)):
    path = os.path.join(data, name)
    fd = os.open(path, os.O_RDONLY)          # pread64 at explicit offsets
    offset = 0
    while chunk := os.pread(fd, 65536, offset):
        offset += len(chunk)
    os.close(fd)
    with open(path, "rb") as f:              # buffered read(): offsets are file positions
        while f.read(100_000):
            pass
        f.seek(os.path.getsize(path) // 3)   # lseek, then read from there
        f.read(12345)
"""


def dftracer_preload() -> Path:
    try:
        import dftracer
    except ImportError:
        pytest.fail(
            "the dftracer package is not installed: scripts/install-deps.sh installs tests/interop/requirements.txt"
        )
    lib = Path(dftracer.__file__).parent / "lib64" / "libdftracer_preload.so"
    assert lib.is_file(), f"{lib}: dftracer's preload library is missing"
    return lib


def file_reads(trace: Path, data: Path) -> dict[str, pl.DataFrame]:
    """Reads of each file under ``data``: offset, bytes, bytes asked, in issue order."""
    df = (
        scan_trace(trace)
        .filter(
            (pl.col("layer") == "file") & (pl.col("op") == "read") & pl.col("file").str.starts_with(str(data) + "/")
        )
        .sort("issue_ns")
        .collect()
    )
    return {f: g.select("offset", "bytes", "bytes_requested") for (f,), g in df.group_by(["file"], maintain_order=True)}


@pytest.mark.root
@pytest.mark.slow
def test_imported_dftracer_trace_agrees_with_trainio_record(tmp_path: Path) -> None:
    require_root("BPF")
    preload = dftracer_preload()
    data = tmp_path / "data"
    data.mkdir()
    for name, size in (("a.bin", (1 << 20) + 123), ("b.bin", 300 << 10), ("c.bin", 65536 + 7)):
        (data / name).write_bytes(os.urandom(size))
    (tmp_path / "reader.py").write_text(READER)
    env = {
        "DFTRACER_ENABLE": "1",
        "DFTRACER_INC_METADATA": "1",
        "DFTRACER_INIT": "PRELOAD",
        "DFTRACER_LOG_FILE": str(tmp_path / "dft" / "trace"),
        "DFTRACER_DATA_DIR": str(data),
        "LD_PRELOAD": str(preload),
    }
    (tmp_path / "dft").mkdir()
    ok(
        "record",
        "-q",
        "--layers",
        "file",
        "-o",
        tmp_path / "recorded",
        "--",
        "env",
        *(f"{k}={v}" for k, v in env.items()),
        sys.executable,
        tmp_path / "reader.py",
        data,
    )
    pfw = sorted((tmp_path / "dft").glob("trace-*.pfw*"))
    assert len(pfw) == 1, pfw
    with gzip.open(pfw[0], "rt") if pfw[0].name.endswith(".gz") else open(pfw[0]) as f:
        assert any(json.loads(line).get("cat") == "POSIX" for line in f if line.strip())

    ok("import", "--dftracer", pfw[0], "-o", tmp_path / "imported")
    meta = read_metadata(tmp_path / "imported")
    assert meta["source"]["format"] == "dftracer" and meta["source"]["files"] == [str(pfw[0].resolve())]
    assert meta["layers"] == ["file"] and set(meta["events"]) == {"file"}

    recorded, imported = file_reads(tmp_path / "recorded", data), file_reads(tmp_path / "imported", data)
    assert sorted(imported) == sorted(recorded) == sorted(str(p) for p in data.iterdir())
    for path, mine in recorded.items():
        theirs = imported[path]
        size = Path(path).stat().st_size
        # every read, in order, at the same offset, with the same size asked and returned
        assert theirs.to_dicts() == mine.to_dicts(), path
        # both passes read the whole file, then Python's buffer refills after the seek
        assert 2 * size + 12345 <= mine["bytes"].sum() <= 2 * size + 12345 + 2 * os.stat(path).st_blksize
        assert mine["offset"].null_count() == 0

    # the analyzer, the report and the replayer take the imported trace
    r = analyze_json(tmp_path / "imported")
    assert r["selection"]["layer"] == "file"
    assert r["reads"] == sum(len(v) for v in recorded.values())
    assert r["bytes_read"] == sum(int(v["bytes"].sum()) for v in recorded.values())
    ok("report", tmp_path / "imported", "-o", tmp_path / "report.html")
    assert (tmp_path / "report.html").stat().st_size > 0
    ok(
        "replay",
        "--trace",
        tmp_path / "imported",
        "--data-dir",
        tmp_path / "replay-data",
        "--generate",
        "--gpus",
        1,
        "--json",
        tmp_path / "replay.json",
    )
    replay = json.loads((tmp_path / "replay.json").read_text())
    assert replay["gpus"] == 1 and replay["settings"]["mode"] == "trace"
    print(
        f"\ndftracer import: {r['reads']} reads, {r['bytes_read']} bytes over {len(recorded)} files "
        f"agree with trainio record read by read"
    )


def test_dftracer_1_lines_with_fname_and_position_tracking(tmp_path: Path) -> None:
    """dftracer 1 wrote fname and size in args and wrapped its lines in a JSON array."""
    events = [
        {"name": "open64", "cat": "POSIX", "pid": 7, "tid": 8, "ts": 100, "dur": 2, "args": {"fname": "/d/x"}},
        {
            "name": "read",
            "cat": "POSIX",
            "pid": 7,
            "tid": 8,
            "ts": 110,
            "dur": 5,
            "args": {"fname": "/d/x", "size": 4096},
        },
        {
            "name": "read",
            "cat": "POSIX",
            "pid": 7,
            "tid": 8,
            "ts": 120,
            "dur": 5,
            "args": {"fname": "/d/x", "size": 100},
        },
        {
            "name": "lseek64",
            "cat": "POSIX",
            "pid": 7,
            "tid": 8,
            "ts": 130,
            "dur": 1,
            "args": {"fname": "/d/x", "ret": 10},
        },
        {
            "name": "read",
            "cat": "POSIX",
            "pid": 7,
            "tid": 8,
            "ts": 140,
            "dur": 5,
            "args": {"fname": "/d/x", "size": 50},
        },
        {
            "name": "pread64",
            "cat": "POSIX",
            "pid": 7,
            "tid": 9,
            "ts": 142,
            "dur": 10,
            "args": {"fname": "/d/x", "size": 8, "offset": 999},
        },
        {"name": "close", "cat": "POSIX", "pid": 7, "tid": 8, "ts": 160, "dur": 1, "args": {"fname": "/d/x"}},
    ]
    src = tmp_path / "t.pfw"
    src.write_text("[\n" + "\n".join(json.dumps(e) for e in events) + "\n")
    ok("import", "--dftracer", src, "-o", tmp_path / "t")
    df = scan_trace(tmp_path / "t").sort("issue_ns").collect()
    reads = df.filter(pl.col("op") == "read")
    assert reads["offset"].to_list() == [0, 4096, 10, 999]
    assert reads["bytes"].to_list() == [4096, 100, 50, 8]
    assert reads["issue_ns"].to_list() == [110_000, 120_000, 140_000, 142_000]
    assert reads["complete_ns"].to_list() == [115_000, 125_000, 145_000, 152_000]
    # the pread of another thread overlaps the third read: two in flight in the process
    assert reads["queue_depth"].to_list() == [1, 1, 1, 2]
    assert df["op"].to_list() == ["open", "read", "read", "read", "read", "close"]


def test_import_refuses_bad_input_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pfw"
    bad.write_text('{"name": "read", "cat": "POSIX"\n')
    for args in (["--dftracer", bad], ["--dftracer", tmp_path / "missing.pfw.gz"], ["--blktrace", bad]):
        p = trainio("import", *args, "-o", tmp_path / "out")
        assert p.returncode == 2, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1 and str(args[1]) in p.stderr, p.stderr
        assert not (tmp_path / "out").exists()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["bad.pfw"]
