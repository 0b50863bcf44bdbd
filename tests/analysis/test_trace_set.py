"""Trace sets (traces/SCHEMA.md, *Trace sets*): per-host traces of one job in one directory,
read as one job by the Python analyzer and the Rust model alike; a set whose members
disagree is bad input for both."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from trainio_analysis.trace import read_rows, scan_trace, write_trace
from trainio_testlib import trainio

MS = 1_000_000
KIB = 1024
S = 1_000_000_000


def block_read(issue_ns: int, size: int, dev: str = "7:0") -> dict:
    return {
        "layer": "block",
        "op": "read",
        "issue_ns": issue_ns,
        "complete_ns": issue_ns + MS,
        "dev": dev,
        "offset": 0,
        "bytes": size,
        "bytes_requested": size,
        "queue_depth": 1,
        "pid": 1,
        "comm": "kworker",
    }


def file_read(pid: int, path: str, offset: int, issue_ns: int) -> dict:
    return {
        **block_read(issue_ns, 256 * KIB, "0:27"),
        "layer": "file",
        "offset": offset,
        "pid": pid,
        "tid": pid,
        "comm": f"rank{pid}",
        "fd": 5,
        "file": path,
    }


def member(d: Path, host: str, offset_ns: int, rows: list[dict]) -> None:
    write_trace(d, rows, {"hostname": host, "clock_offset_ns": offset_ns})


def two_hosts(root: Path) -> Path:
    """h1 and h2 read at the same wall-clock instants (10 ms apart, 5 reads each), but
    h2's CLOCK_MONOTONIC is 7 s behind h1's: its clock offset is 7 s larger."""
    job = root / "job"
    t1, t2 = 100 * S, 93 * S
    member(job / "h1", "h1", 1_000 * S, [block_read(t1 + i * 10 * MS, 64 * KIB) for i in range(5)])
    member(job / "h2", "h2", 1_007 * S, [block_read(t2 + i * 10 * MS, 128 * KIB) for i in range(5)])
    return job


def analyze_json(*args) -> dict:
    p = trainio("analyze", *map(str, args), "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_set_is_one_job_on_one_clock(tmp_path):
    job = two_hosts(tmp_path)
    a = analyze_json(job)
    # Aligned by the clock offsets: both hosts' reads fall in the same 41 ms, not 7 s apart.
    assert a["duration_s"] == pytest.approx(0.041, abs=1e-6)
    assert a["bytes_read"] == 5 * 64 * KIB + 5 * 128 * KIB
    assert sorted(a["groups"]) == ["h1/7:0", "h2/7:0"]  # same MAJ:MIN, two hosts' disks
    ph = {h["host"]: h for h in a["per_host"]}
    assert ph["h1"]["bytes_read"] == 5 * 64 * KIB and ph["h2"]["bytes_read"] == 5 * 128 * KIB
    assert ph["h2"]["shift_ns"] == 7 * S and ph["h1"]["shift_ns"] == 0
    assert ph["h1"]["start_s"] == ph["h2"]["start_s"] == 0
    assert ph["h1"]["devices"] == ph["h2"]["devices"] == ["7:0"]
    assert a["recording"]["host"] == "h1,h2"
    # --dev names one host's disk
    only = analyze_json(job, "--dev", "h2/7:0")
    assert only["bytes_read"] == 5 * 128 * KIB
    assert [h["events"] for h in only["per_host"]] == [0, 5]
    # The readers that return rows see the same: scan_trace and read_rows.
    for rows in (scan_trace(job).collect(), pl.from_arrow(read_rows(job))):
        assert sorted(rows["dev"].unique().to_list()) == ["h1/7:0", "h2/7:0"]
        assert rows["issue_ns"].min() == 100 * S and rows["issue_ns"].max() == 100 * S + 40 * MS
    # One member alone is still a plain trace.
    assert "per_host" not in analyze_json(job / "h1")
    # compare and report take the set as one trace too: the job against one of its hosts.
    p = trainio("compare", job, job / "h1", "--json")
    assert p.returncode == 0, p.stderr
    c = json.loads(p.stdout)
    assert c["throughput_mib_s"]["a"] == pytest.approx(3 * c["throughput_mib_s"]["b"], rel=1e-6)
    p = trainio("report", job, job / "h2", "-o", tmp_path / "r.html")
    assert p.returncode == 0, p.stderr
    assert "h1,h2" in (tmp_path / "r.html").read_text()


def rank_rows(pid: int, t0: int) -> list[dict]:
    """A rank that reads 2 × 256 KiB a step itself, then computes 30 ms, for 4 steps."""
    rows, t = [], t0
    for step in range(4):
        for k in range(2):
            rows.append(file_read(pid, "/data/x.bin", (step * 2 + k) * 256 * KIB, t + k * 2 * MS))
        t += 34 * MS
    return rows


def test_set_model_and_replay_have_every_hosts_gpus(tmp_path):
    job = tmp_path / "job"
    member(job / "a", "h1", 0, rank_rows(100, 10 * S))
    member(job / "b", "h2", 0, rank_rows(100, 10 * S))  # the same pid on another host
    a = analyze_json(job, "--layer", "file")
    gpus = a["job_model"]["gpus"]
    assert [(g["host"], g["rank_pid"], len(g["steps"])) for g in gpus] == [("h1", 100, 4), ("h2", 100, 4)]
    assert [h["gpus"] for h in a["per_host"]] == [1, 1]
    out = tmp_path / "r.json"
    data = tmp_path / "data"
    p = trainio("replay", "--trace", str(job), "--data-dir", str(data), "--generate", "--gpus", "2", "--json", str(out))
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    assert [t["host"] for t in r["settings"]["templates"]] == ["h1", "h2"]
    assert [g["bytes_read"] for g in r["per_gpu"]] == [8 * 256 * KIB] * 2


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("same-host", "were both recorded on host h1: one trace per host"),
        ("minor", "members of different schema versions"),
        ("not-a-trace", "is not a trace (no seg-*.parquet): a trace set holds only per-host traces"),
    ],
)
def test_a_set_whose_members_disagree_is_bad_input(tmp_path, case, message):
    job = tmp_path / "job"
    member(job / "a", "h1", 0, [block_read(S, 4096)])
    if case == "same-host":
        member(job / "b", "h1", 0, [block_read(S, 4096)])
    elif case == "minor":
        member(job / "b", "h2", 0, [block_read(S, 4096)])
        # as a trainio of schema 1.3 wrote it (the rows are valid 1.3 rows)
        (seg,) = (job / "b").glob("seg-*.parquet")
        kv = {**pq.read_metadata(seg).metadata, b"trainio.schema_minor": b"3"}
        pq.write_table(pq.read_table(seg).replace_schema_metadata(kv), seg)
    else:
        (job / "b").mkdir()
    for argv in (
        ["analyze", str(job)],
        ["report", str(job), "-o", str(tmp_path / "r.html")],
        ["compare", str(job), str(job / "a")],
        ["replay", "--trace", str(job), "--data-dir", str(tmp_path / "d"), "--gpus", "1"],
    ):
        p = trainio(*argv)
        assert p.returncode == 2, (argv, p.stderr)
        assert message in p.stderr and len(p.stderr.strip().splitlines()) == 1, (argv, p.stderr)
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "d").exists()


def test_a_cut_off_member_is_named_and_the_set_still_analyzes(tmp_path):
    """A member whose last segment does not say it ended (schema 1.9's trainio.end, as a
    recorder killed mid-recording leaves it) is complete False, per host and for the
    job; a member written whole is complete True; a trace before 1.9 cannot say (None)."""
    job = two_hosts(tmp_path)
    (seg,) = (job / "h2").glob("seg-*.parquet")
    kv = {**pq.read_metadata(seg).metadata, b"trainio.end": b'{"complete": false, "reason": "recording"}'}
    pq.write_table(pq.read_table(seg).replace_schema_metadata(kv), seg)
    r = analyze_json(job)
    assert {h["host"]: h["complete"] for h in r["per_host"]} == {"h1": True, "h2": False}
    assert r["recording"]["complete"] is False and r["recording"]["end_reason"] == "members cut off: h2"
    assert r["bytes_read"] == 5 * 64 * KIB + 5 * 128 * KIB  # h2's rows are still read
    h1 = analyze_json(job / "h1")["recording"]
    assert h1["complete"] is True and h1["end_reason"] == "written", h1
    # as a trainio of schema 1.8 wrote h1: no trainio.end, and nothing to say
    (seg,) = (job / "h1").glob("seg-*.parquet")
    meta = {k: v for k, v in pq.read_metadata(seg).metadata.items() if k != b"trainio.end"}
    pq.write_table(pq.read_table(seg).replace_schema_metadata({**meta, b"trainio.schema_minor": b"8"}), seg)
    (seg,) = (job / "h2").glob("seg-*.parquet")
    kv = {**pq.read_metadata(seg).metadata, b"trainio.schema_minor": b"8"}
    pq.write_table(pq.read_table(seg).replace_schema_metadata(kv), seg)
    r = analyze_json(job)
    assert {h["host"]: h["complete"] for h in r["per_host"]} == {"h1": None, "h2": None}
    assert r["recording"]["complete"] is None
