"""Reads through memory mappings (schema 1.6) against real kernel events: numpy.memmap and
pyarrow.memory_map of a file on ext4 over a loop device, read after its pages were dropped
from the page cache, by a traced process and by one that is not."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

# trainio_testlib puts analysis/ on the path: it goes first.
from trainio_testlib import mounted_loop_fs, start_recording

# isort: split
from trainio_analysis.trace import SCHEMA_MINOR, read_metadata, scan_trace

pytestmark = [pytest.mark.root]

PAGE = 4096
MiB = 1 << 20
FILE_MIB = 64
PROT_READ, MAP_SHARED, MADV_WILLNEED = 1, 0x01, 3

# Touches one byte of each page given, in that order, through np.memmap; waits for the
# file `go` first when it is given (argv: path, go or "-", page indexes).
TOUCH = r"""
import os, sys, time
import numpy as np
path, go, pages = sys.argv[1], sys.argv[2], [int(p) for p in sys.argv[3:]]
while go != "-" and not os.path.exists(go):
    time.sleep(0.01)
m = np.memmap(path, dtype=np.uint8, mode="r")
total = 0
for p in pages:
    total += int(m[p * 4096])
print(total)
"""


def _drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def _read_ahead_bytes(dev: str) -> int:
    return int(Path(f"/sys/block/{Path(dev).name}/queue/read_ahead_kb").read_text()) * 1024


def _assert_no_file_event_lost(trace: Path) -> None:
    """Nothing lost but block completions the kernel did not hand to BPF (counted)."""
    lost = {k: n for k, n in read_metadata(trace)["lost_events"].items() if n}
    assert all(k.startswith("block_rq_complete:") and k != "block_rq_complete:ringbuf_full" for k in lost), lost


def _record(out: Path, *cmd: str) -> subprocess.Popen[str]:
    """`trainio record --layers block,file -o OUT -- CMD`, returned once it records."""
    return start_recording("--layers", "block,file", "-o", str(out), "--", *cmd)


def test_page_faults_of_a_memmap_are_the_pages_touched_and_only_the_traced_processes(tmp_path: Path) -> None:
    with mounted_loop_fs(256) as (dev, majmin, mnt):
        path = mnt / "data.bin"
        path.write_bytes(os.urandom(FILE_MIB * MiB))
        # Pages 4 MiB apart: each one's read-around (read_ahead_kb around it) and
        # fault-around (64 KiB) reach no other touched page, so each touch is a fault
        # that filemap_fault serves; the untraced process touches pages 2 MiB away.
        stride = 4 * MiB
        assert _read_ahead_bytes(dev) < stride // 2
        rng = random.Random(7)
        traced = [i * (stride // PAGE) + rng.randrange(16) for i in range(FILE_MIB * MiB // stride)]
        rng.shuffle(traced)
        untraced = [p + (stride // 2) // PAGE for p in traced[:6]]
        _drop_caches()

        go = tmp_path / "go"
        out = tmp_path / "trace"
        rec = _record(out, sys.executable, "-c", TOUCH, str(path), str(go), *map(str, traced))
        other = subprocess.Popen(
            [sys.executable, "-c", TOUCH, str(path), "-", *map(str, untraced)], stderr=subprocess.PIPE, text=True
        )
        _, other_err = other.communicate(timeout=60)
        assert other.returncode == 0, other_err
        go.touch()
        _, err = rec.communicate(timeout=120)
        assert rec.returncode == 0, err
        _assert_no_file_event_lost(out)

        rows = scan_trace(out).filter(pl.col("layer") == "file").collect()
        ours = rows.filter(pl.col("file") == str(path))
        # The untraced process left no row at all, and no fault row is at its pages.
        assert rows.filter(pl.col("pid") == other.pid).height == 0
        faults = ours.filter(pl.col("op") == "fault").sort("issue_ns")
        assert faults.height == len(traced), faults
        assert faults["offset"].to_list() == [p * PAGE for p in traced]
        assert faults["pid"].n_unique() == 1 and faults["tid"].n_unique() == 1
        assert (faults["bytes"] == PAGE).all() and (faults["bytes_requested"] == PAGE).all()
        assert (faults["dev"] == majmin).all() and faults["fd"].null_count() == faults.height
        assert (faults["issue_ns"] == faults["complete_ns"]).all() and (faults["queue_depth"] == 0).all()
        assert not set(ours["offset"].drop_nulls().to_list()) & {p * PAGE for p in untraced}
        pid = faults["pid"][0]
        assert set(ours["pid"].to_list()) == {pid}

        # Every touched page lies in a fault row's page or a fault-around range of the
        # process (here, as no touched page is in another's folio); fault-around found
        # none of them cached.
        around = ours.filter(pl.col("op") == "map_pages")
        for p in traced:
            assert any(o <= p * PAGE < o + n for o, n in zip(around["offset"], around["bytes_requested"])), p
        assert (around["bytes_requested"] <= 64 * 1024).all()

        # The mmap itself: offset 0, the file's length, PROT_READ and MAP_SHARED, its fd.
        maps = ours.filter(pl.col("op") == "mmap")
        assert maps.height == 1, maps
        m = maps.row(0, named=True)
        assert (m["offset"], m["bytes_requested"], m["bytes"], m["error"]) == (0, FILE_MIB * MiB, 0, 0)
        assert m["flags"] & 0xFF == PROT_READ and (m["flags"] >> 8) & 0xF == MAP_SHARED
        opened = ours.filter(pl.col("op") == "open")
        assert opened.height == 1 and m["fd"] == opened["fd"][0]
        assert m["complete_ns"] < faults["issue_ns"][0]

        # A mapped read is no read syscall, and the block layer saw the faults' reads.
        assert ours.filter(pl.col("op") == "read").height == 0
        block = scan_trace(out).filter((pl.col("layer") == "block") & (pl.col("dev") == majmin)).collect()
        assert block.filter(pl.col("op") == "read")["bytes"].sum() >= len(traced) * PAGE
        assert read_metadata(out)["schema_minor"] == SCHEMA_MINOR


PYARROW_READ = r"""
import sys
import pyarrow as pa
path, ranges = sys.argv[1], [tuple(map(int, r.split(":"))) for r in sys.argv[2:]]
src = pa.memory_map(path)
for offset, n in ranges:
    src.seek(offset)
    assert len(bytes(src.read_buffer(n))) == n  # a zero-copy slice of the mapping, then read
"""


def test_pyarrow_memory_map_reads_are_madvise_rows_of_each_range(tmp_path: Path) -> None:
    # pyarrow asks MADV_WILLNEED of each buffer a memory-mapped file hands out (from the
    # buffer's page), which starts its readahead inside madvise: that is what a replay
    # must repeat, so each is a row with the file offset of the range.
    with mounted_loop_fs(128) as (dev, majmin, mnt):
        path = mnt / "table.arrow"
        path.write_bytes(os.urandom(16 * MiB))
        _drop_caches()
        ranges = [(5 * PAGE + 100, 10_000), (9 * MiB + 7, 300_000), (MiB, PAGE)]
        out = tmp_path / "trace"
        rec = _record(out, sys.executable, "-c", PYARROW_READ, str(path), *(f"{o}:{n}" for o, n in ranges))
        _, err = rec.communicate(timeout=120)
        assert rec.returncode == 0, err
        _assert_no_file_event_lost(out)
        ours = scan_trace(out).filter((pl.col("layer") == "file") & (pl.col("file") == str(path))).collect()
        adv = ours.filter(pl.col("op") == "madvise").sort("issue_ns")
        got = list(zip(adv["offset"], adv["bytes_requested"], adv["flags"], adv["error"]))
        assert got == [(o // PAGE * PAGE, o % PAGE + n, MADV_WILLNEED, 0) for o, n in ranges]
        assert adv["fd"].null_count() == adv.height and (adv["dev"] == majmin).all()
        # Its pages then came through faults and fault-arounds of the same process.
        touched = ours.filter(pl.col("op").is_in(["fault", "map_pages"]))
        assert touched.height >= 1 and set(touched["pid"].to_list()) == set(adv["pid"].to_list())
