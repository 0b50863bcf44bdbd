"""Trace mode: recorded processes become templates for simulated GPUs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from replay_helpers import ROOT, TRAINIO, load_json, run_trainio, write_workload

sys.path.insert(0, str(ROOT / "analysis"))
from trainio_analysis.trace import write_trace

KIB = 1 << 10
MS = 1_000_000


def file_read(pid, path, offset, size, issue_ms, dur_ms, qd, fd=5, tid=None, dev="0:27"):
    return {
        "layer": "file",
        "op": "read",
        "issue_ns": int(issue_ms * MS),
        "complete_ns": int((issue_ms + dur_ms) * MS),
        "insert_ns": None,
        "dev": dev,
        "offset": offset,
        "bytes": size,
        "bytes_requested": size,
        "queue_depth": qd,
        "pid": pid,
        "tid": pid if tid is None else tid,
        "comm": f"loader{pid}",
        "fd": fd,
        "file": path,
        "error": 0,
        "flags": 0,
    }


def majmin_of(path):
    st = os.stat(path)
    return f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"


def synthetic_rows():
    """pid 100: 3 bursts of 4 concurrent 256 KiB reads (4 threads) over 2 files, one
    every 52.5 ms; pid 200: 3 bursts of 2 sequential 128 KiB reads of one file (one
    thread), one every 32 ms; pid 300: one 100-byte read (below 1 % of the largest
    reader: left out)."""
    rows = []
    t = 1000.0
    for step in range(3):
        for k in range(4):
            f = f"/data/a{k % 2}.npz"
            rows.append(
                file_read(100, f, (step * 2 + k // 2) * 256 * KIB, 256 * KIB, t + 0.1 * k, 2.0, k + 1, tid=1000 + k)
            )
        t += 2.5 + 50.0
    t = 1000.0
    for step in range(3):
        for k in range(2):
            rows.append(file_read(200, "/data/b.tfrecord", (step * 2 + k) * 128 * KIB, 128 * KIB, t + k, 0.9, 1))
        t += 2.0 + 30.0
    rows.append(file_read(300, "/usr/lib/python3/x.py", 0, 100, 1000.0, 0.01, 1))
    # Rows of other layers and ops must be ignored.
    rows.append({**file_read(100, "/data/a0.npz", None, 0, 999.0, 0.01, 0), "op": "open", "offset": None})
    rows.append({**file_read(100, None, 0, 4096, 1001.0, 0.2, 1), "layer": "block", "file": None, "fd": None})
    return rows


def test_trace_replay_remaps_files_and_keeps_structure(tmpfs_dir):
    trace = tmpfs_dir / "trace"
    write_trace(trace, synthetic_rows())
    out = tmpfs_dir / "r.json"
    data = tmpfs_dir / "data"
    run_trainio("replay", "--trace", trace, "--data-dir", data, "--generate", "--gpus", 3, "--json", out)
    r = load_json(out)
    s = r["settings"]
    assert s["mode"] == "trace" and r["gpus"] == 3
    assert [t["pid"] for t in s["templates"]] == [100, 200]
    assert [t["readers"] for t in s["templates"]] == [4, 1]
    assert r["steps"] == 3
    # Round-robin: GPUs 0 and 2 replay pid 100 (3 MiB), GPU 1 pid 200 (768 KiB).
    per_gpu = {g["gpu"]: g for g in r["per_gpu"]}
    assert per_gpu[0]["bytes_read"] == per_gpu[2]["bytes_read"] == 3 * 4 * 256 * KIB
    assert per_gpu[1]["bytes_read"] == 3 * 2 * 128 * KIB
    # The recorded concurrency is replayed: pid 100 had 4 reads in flight, pid 200 one.
    assert [per_gpu[g]["max_outstanding_reads"] for g in range(3)] == [4, 1, 4]
    assert r["bytes_read"] == 2 * 3 * 4 * 256 * KIB + 3 * 2 * 128 * KIB
    # The job's 3 files once for GPUs 0 and 1 (the recorded count), sized to the largest
    # byte read; GPU 2 replays pid 100 on a second copy of its 2 files.
    copies = sorted(p.name for p in (data / "trace").iterdir())
    assert copies == ["c00000", "c00001"]
    assert sorted(p.name for p in (data / "trace" / "c00000").iterdir()) == ["f00000.dat", "f00001.dat", "f00002.dat"]
    assert sorted(p.name for p in (data / "trace" / "c00001").iterdir()) == ["f00000.dat", "f00001.dat"]
    assert (data / "trace" / "c00000" / "f00002.dat").stat().st_size == 6 * 128 * KIB
    # The job model. pid 100's four loader threads read ahead of its main thread: a step
    # is a burst they read, and its compute the recorded step period (52.5 ms; the last
    # burst takes the median). pid 200 reads every batch on its main thread, then
    # computes: its compute is the idle gap after each burst (30.1 ms), and the replay
    # reads each burst when the GPU asks for it, so the 32 ms period comes back from the
    # replayed reads.
    assert [t["compute_s"] for t in s["templates"]] == [
        pytest.approx(0.0525, abs=1e-3),
        pytest.approx(0.0301, abs=1e-4),
    ]
    # The replay slept it per step: a sleep ends late, never early (a loaded host can add
    # milliseconds; the inferred figure above is the exact one).
    assert 3 * 0.0525 - 0.003 <= per_gpu[0]["compute_s"] <= 3 * 0.0525 + 0.02
    assert 3 * 0.0301 - 1e-4 <= per_gpu[1]["compute_s"] <= 3 * 0.0301 + 0.02
    assert [(t["synchronous"], t["paced"]) for t in s["templates"]] == [(False, True), (True, False)]


def test_trace_computation_time_override(tmpfs_dir):
    trace = tmpfs_dir / "trace"
    write_trace(trace, synthetic_rows())
    out = tmpfs_dir / "r.json"
    run_trainio(
        "replay",
        "--trace",
        trace,
        "--data-dir",
        tmpfs_dir / "d",
        "--generate",
        "--gpus",
        2,
        "--computation-time",
        0.01,
        "--json",
        out,
    )
    r = load_json(out)
    assert all(g["compute_s"] == pytest.approx(0.03, rel=0.2) for g in r["per_gpu"])


def test_trace_without_file_layer_is_one_line_exit_2(tmpfs_dir):
    trace = tmpfs_dir / "blockonly"
    rows = [r for r in synthetic_rows() if r["layer"] == "block"]
    write_trace(trace, rows)
    p = run_trainio("replay", "--trace", trace, "--data-dir", tmpfs_dir / "d", check=False)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and str(trace) in lines[0] and "file-layer" in lines[0], p.stderr


LOADER = textwrap.dedent(
    """
    import os, sys, threading, time
    d = sys.argv[1]
    paths = [os.path.join(d, f"s{i}.bin") for i in range(16)]
    for p in paths:
        with open(p, "wb") as f:
            f.write(os.urandom(1024 * 1024))
    def read(p):
        fd = os.open(p, os.O_RDONLY)
        os.pread(fd, 1024 * 1024, 0)
        os.close(fd)
    for step in range(4):
        ts = [threading.Thread(target=read, args=(p,)) for p in paths[step * 4:(step + 1) * 4]]
        [t.start() for t in ts]
        [t.join() for t in ts]
        # compute: long against the threads' start-up delays on a loaded 2-core host (up
        # to ~20 ms), so the gaps between steps stand out from those inside one
        time.sleep(0.2)
    """
)


@pytest.mark.root
@pytest.mark.slow
def test_recorded_trace_replays_end_to_end(tmpfs_dir):
    if not (ROOT / "target" / "release" / "trainio-record").exists():
        pytest.fail("the recorder is missing: run make")
    script = tmpfs_dir / "loader.py"
    script.write_text(LOADER)
    src = tmpfs_dir / "src"
    src.mkdir()
    trace = tmpfs_dir / "trace"
    subprocess.run(
        [
            str(TRAINIO),
            "record",
            "--output",
            str(trace),
            "--layers",
            "file",
            "--",
            sys.executable,
            str(script),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    out = tmpfs_dir / "r.json"
    run_trainio("replay", "--trace", trace, "--data-dir", tmpfs_dir / "data", "--generate", "--gpus", 2, "--json", out)
    r = load_json(out)
    t = r["settings"]["templates"][0]
    assert t["comm"].startswith("python")
    # Reads of /dev/shm, the device most bytes came from: the 4 loader bursts, and the
    # interpreter reading the script (a burst of its own, or the first loader burst's
    # start, as the gap after it falls). Its module reads (another device) are left out.
    assert t["dev"] == majmin_of(src)
    assert t["steps"] in (4, 5) and 16 << 20 <= t["bytes"] < (16 << 20) + 64 * 1024
    assert t["paced"], "loader threads read ahead of the main thread"
    assert t["readers"] >= 2  # four threads read at once
    assert r["gpus"] == 2 and r["steps"] == t["steps"]
    assert min(g["bytes_read"] for g in r["per_gpu"]) == t["bytes"]
    shutil.rmtree(trace, ignore_errors=True)


@pytest.mark.root
@pytest.mark.slow
def test_record_traces_the_replay_and_the_trace_replays(tmpfs_dir):
    """--record with the psync engine: the replay's own reads land in the file layer of
    a trace, which replays in turn with the same bytes."""
    if not (ROOT / "target" / "release" / "trainio-record").exists():
        pytest.fail("the recorder is missing: run make")
    wl = write_workload(tmpfs_dir / "wl.yaml", files=32, record=256 * KIB, batch=4, threads=3, compute=0.03)
    trace = tmpfs_dir / "trace"
    out1 = tmpfs_dir / "r1.json"
    run_trainio(
        "replay",
        "--workload",
        wl,
        "--data-dir",
        tmpfs_dir / "d1",
        "--generate",
        "--io-engine",
        "psync",
        "--record",
        trace,
        "--json",
        out1,
        timeout=120,
    )
    assert list(trace.glob("seg-*.parquet"))
    out2 = tmpfs_dir / "r2.json"
    run_trainio("replay", "--trace", trace, "--data-dir", tmpfs_dir / "d2", "--generate", "--json", out2)
    r1, r2 = load_json(out1), load_json(out2)
    t = r2["settings"]["templates"][0]
    assert t["comm"] == "trainio-replay"
    # Each reader thread of the psync engine is one reader of the template.
    assert t["readers"] == 3
    assert r2["max_outstanding_reads_per_gpu"] <= 3
    assert t["bytes"] >= r1["bytes_read"]  # every byte the first replay read was recorded
    assert r2["bytes_read"] == t["bytes"]
