"""`trainio slice` (traces/SCHEMA.md, `trainio.window`) on traces written here: which rows a
window and a process selection keep, wall-clock bounds across the hosts of a set, and bad
input (one line, exit 2, nothing written)."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import polars as pl

from trainio_analysis import trace as tr
from trainio_analysis.trace import read_metadata, scan_trace, write_trace
from trainio_testlib import trainio

MS = 1_000_000
S = 1_000_000_000


def read(issue_ns: int, latency_ns: int = MS, pid: int = 1, dev: str = "7:0") -> dict:
    return {
        "layer": "block",
        "op": "read",
        "issue_ns": issue_ns,
        "complete_ns": issue_ns + latency_ns,
        "dev": dev,
        "offset": 0,
        "bytes": 4096,
        "bytes_requested": 4096,
        "queue_depth": 1,
        "pid": pid,
        "comm": f"p{pid}",
    }


def proc(op: str, pid: int, ppid: int, t: int) -> dict:
    return {
        "layer": "proc",
        "op": op,
        "issue_ns": t,
        "complete_ns": t,
        "bytes": 0,
        "queue_depth": 0,
        "pid": pid,
        "ppid": ppid,
        "comm": f"p{pid}",
    }


def ok(*args: object) -> dict:
    res = trainio("slice", *map(str, args), "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_a_window_keeps_the_rows_that_overlap_it_and_says_so(tmp_path: Path) -> None:
    src = tmp_path / "src"
    # One read every 10 ms for 10 s from t = 100 s, each 1 ms long; a 50 ms one at 102.995 s
    # that straddles the window's start.
    rows = [read(100 * S + i * 10 * MS) for i in range(1000)] + [read(102 * S + 995 * MS, 50 * MS)]
    write_trace(src, rows, {"start_ns": 100 * S, "end_ns": 110 * S, "clock_offset_ns": 5 * S}, rows_per_segment=300)
    assert len(list(src.glob("seg-*.parquet"))) == 4
    out = tmp_path / "w"
    got = ok(src, "-o", out, "--from", 3, "--to", 5.5)
    # 103.000 .. 105.490 issue times (250 rows), and the straddler, which completes after 103.
    assert got["rows"] == 251 and got["source_rows"] == 1001
    meta = read_metadata(out)
    assert (meta["start_ns"], meta["end_ns"]) == (103 * S, 105 * S + 500 * MS)
    assert meta["window"] == {
        "source": str(src.resolve()),
        "start_ns": 103 * S,
        "end_ns": 105 * S + 500 * MS,
        "pids": None,
        "cgroups": None,
        "source_rows": 1001,
        "rows": 251,
    }
    assert meta["schema_minor"] == tr.SCHEMA_MINOR and meta["clock_offset_ns"] == 5 * S
    kept = scan_trace(out).collect().sort("issue_ns")
    assert kept["issue_ns"].min() == 102 * S + 995 * MS
    assert kept.filter(pl.col("complete_ns") < 103 * S).is_empty()
    assert kept.filter(pl.col("issue_ns") >= 105 * S + 500 * MS).is_empty()
    # Every command reads it: analyze spans the window.
    a = trainio("analyze", "--json", out)
    assert a.returncode == 0, a.stderr
    assert json.loads(a.stdout)["reads"] == 251
    assert abs(json.loads(a.stdout)["duration_s"] - 2.505) < 1e-6


def test_a_wall_clock_window_cuts_the_same_moments_out_of_every_host(tmp_path: Path) -> None:
    # h2's monotonic clock is 7 s behind h1's: its clock offset is 7 s larger.
    job = tmp_path / "job"
    for host, mono, offset in (("h1", 100 * S, 1_000 * S), ("h2", 93 * S, 1_007 * S)):
        write_trace(
            job / host,
            [read(mono + i * 100 * MS) for i in range(100)],
            {"hostname": host, "clock_offset_ns": offset, "start_ns": mono},
        )
    start = dt.datetime.fromtimestamp(1_102.0, dt.UTC).isoformat().replace("+00:00", "Z")
    end = dt.datetime.fromtimestamp(1_104.0, dt.UTC).isoformat()
    got = ok(job, "-o", tmp_path / "cut", "--from", start, "--to", end)
    assert [m["rows"] for m in got["members"]] == [20, 20]
    for host, mono in (("h1", 100 * S), ("h2", 93 * S)):
        rows = scan_trace(tmp_path / "cut" / host).collect()["issue_ns"]
        assert (rows.min(), rows.max()) == (mono + 2 * S, mono + 3 * S + 900 * MS)
    # The cut is a set again: analyze reads both hosts as one job, over the 2 s window.
    a = json.loads(trainio("analyze", "--json", tmp_path / "cut").stdout)
    assert a["reads"] == 40 and abs(a["duration_s"] - 2.0) < 0.01
    # Seconds count from the set's start (h1's 100 s = h2's 93 s): the same rows.
    again = ok(job, "-o", tmp_path / "cut2", "--from", 2, "--to", 4)
    assert [m["rows"] for m in again["members"]] == [20, 20]


def test_a_process_selection_keeps_its_descendants(tmp_path: Path) -> None:
    src = tmp_path / "src"
    rows = [
        proc("start", 10, 1, 1 * S),
        proc("fork", 11, 10, 2 * S),
        proc("fork", 12, 11, 3 * S),
        proc("fork", 20, 1, 3 * S),
    ]
    rows += [read(4 * S + i * MS, pid=pid) for i, pid in enumerate([10, 11, 12, 20, 20, 1])]
    write_trace(src, rows)
    got = ok(src, "-o", tmp_path / "job", "--pid", 11)
    assert got["pids"] == [11, 12]
    kept = scan_trace(tmp_path / "job").collect()
    assert sorted(set(kept["pid"].to_list())) == [11, 12]
    assert kept.filter(pl.col("layer") == "block").height == 2
    both = ok(src, "-o", tmp_path / "both", "--pid", 10, "--pid", 20, "--to", 5)
    assert both["pids"] == [10, 11, 12, 20] and both["rows"] == 4 + 5


def test_a_cgroup_selection_keeps_its_processes_and_their_descendants(tmp_path: Path) -> None:
    """cgroup rows (schema 1.9) name each process's cgroup; --cgroup keeps the processes in
    it or beneath it (the latest row of a process that moved counts; a process without a
    row is in its parent's), and given under /sys/fs/cgroup (the v2 mount or a v1
    hierarchy) it names the same cgroup."""

    def cgroup(pid: int, path: str, t: int) -> dict:
        return {**proc("cgroup", pid, 1, t), "file": path}

    src = tmp_path / "src"
    rows = [
        proc("start", 10, 1, 1 * S),
        cgroup(10, "/system.slice/sshd.service", 1 * S),
        proc("fork", 11, 10, 2 * S),
        cgroup(11, "/system.slice/sshd.service", 2 * S),
        # moved into the pod's cgroup, then executed the entrypoint
        proc("exec", 11, 10, 2 * S + MS),
        cgroup(11, "/kubepods.slice/pod1/c1", 2 * S + MS),
        proc("fork", 12, 11, 3 * S),
        proc("fork", 20, 1, 3 * S),
        cgroup(20, "/kubepods.slice/pod10", 3 * S),
    ]
    rows += [read(4 * S + i * MS, pid=pid) for i, pid in enumerate([10, 11, 12, 20, 20, 1])]
    write_trace(src, rows)
    for i, given in enumerate(
        ("/kubepods.slice/pod1", "/sys/fs/cgroup/kubepods.slice/pod1/", "/sys/fs/cgroup/blkio/kubepods.slice/pod1")
    ):
        got = ok(src, "-o", tmp_path / f"pod{i}", "--cgroup", given)
        assert got["pids"] == [11, 12], (given, got)
        assert read_metadata(tmp_path / f"pod{i}")["window"]["cgroups"] == [given]
    both = ok(src, "-o", tmp_path / "both", "--cgroup", "/kubepods.slice", "--pid", 10)
    assert both["pids"] == [10, 11, 12, 20]
    # 11 moved out of sshd's cgroup (its latest row counts), and took 12 with it
    assert ok(src, "-o", tmp_path / "sshd", "--cgroup", "/system.slice")["pids"] == [10]
    # pod10 is not beneath pod1, though its name starts the same
    assert ok(src, "-o", tmp_path / "pod10", "--cgroup", "/kubepods.slice/pod10")["pids"] == [20]
    # a trace without cgroup rows: one line naming why, exit 2, nothing written
    old = tmp_path / "old"
    write_trace(old, [r for r in rows if r["op"] != "cgroup"])
    res = trainio("slice", str(old), "-o", str(tmp_path / "x"), "--cgroup", "/kubepods.slice")
    assert res.returncode == 2 and "no cgroup rows" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_trace(src, [read(100 * S + i * MS) for i in range(10)], {"start_ns": 100 * S})
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep").write_text("x")
    cases = [
        ((src, "-o", tmp_path / "a"), "give a window"),
        ((src, "-o", tmp_path / "b", "--from", "yesterday"), "--from 'yesterday'"),
        ((src, "-o", tmp_path / "c", "--from", "2026-11-26T18:00:00"), "with a zone"),
        ((src, "-o", tmp_path / "d", "--from", 5, "--to", 4), "ends before it starts"),
        ((src, "-o", tmp_path / "e", "--from", 50), "no rows in the window"),
        ((src, "-o", full, "--from", 0), "not empty"),
        ((tmp_path / "nope", "-o", tmp_path / "f", "--from", 0), "no such trace"),
        ((src, "-o", src / "inside", "--from", 0), "-o"),
    ]
    for args, words in cases:
        res = trainio("slice", *map(str, args))
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and words in lines[0], (args, res.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full", "src"]
    assert os.listdir(full) == ["keep"]
