"""A replay whose own CPU, not the storage, set its pace says so: each rank measures its
threads' time on a CPU and waiting for one (the kernel's schedstat), and the results name
the ranks whose client limited the run (docs/replay.md, *Results*, `client`)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from replay_helpers import load_json, run_trainio, write_workload


def test_a_compute_bound_replay_is_not_client_limited(tmpfs_dir: Path) -> None:
    """One GPU computing 0.2 s per step on data in memory: its loop sleeps through the run."""
    wl = write_workload(tmpfs_dir / "w.yaml", files=10, record=4096, batch=1, threads=1, compute=0.2)
    out = tmpfs_dir / "r.json"
    p = run_trainio("replay", "--workload", wl, "--data-dir", tmpfs_dir / "d", "--generate", "--json", out)
    r = load_json(out)
    c = r["client"]
    assert c["measured"] is True, c
    assert c["limited"] is False and c["limited_ranks"] == [], c
    (rank,) = c["per_rank"]
    # the loop slept through 10 × 0.2 s of compute: busy a small share of the run
    assert rank["loop_busy_percent"] < 50, rank
    assert 0 < rank["loop_cpu_s"] < r["wall_s"], rank
    assert "CLIENT-LIMITED" not in p.stdout
    assert r["au_percent"] > 90, r["au_percent"]


def test_a_replay_starved_of_cpu_says_the_client_limited_it(tmpfs_dir: Path) -> None:
    """32 simulated GPUs of 1 ms steps on tmpfs, the replay and a busy loop pinned to one
    CPU: the loop never waits on storage or on a compute timer, so the results say the
    client limited the run, and which rank."""
    taskset = shutil.which("taskset")
    if taskset is None:
        pytest.fail("taskset is missing (util-linux)")
    cpu = str(sorted(os.sched_getaffinity(0))[0])
    wl = write_workload(tmpfs_dir / "w.yaml", files=2048, record=4096, batch=4, threads=2, compute=0.001)
    data = tmpfs_dir / "d"
    run_trainio("datagen", "--workload", wl, "--data-dir", data, "-q")
    spin = subprocess.Popen([taskset, "-c", cpu, "sh", "-c", "while :; do :; done"])
    try:
        out = tmpfs_dir / "r.json"
        p = run_trainio(
            "replay",
            "--workload",
            wl,
            "--data-dir",
            data,
            "--gpus",
            32,
            "--json",
            out,
            prefix=(taskset, "-c", cpu),
        )
    finally:
        spin.kill()
        spin.wait()
    r = load_json(out)
    c = r["client"]
    assert c["measured"] is True and c["limited"] is True, c
    (limited,) = c["limited_ranks"]
    assert limited["rank"] == 0 and limited["host"] == r["hostnames"][0], limited
    assert "of the run" in limited["reason"], limited
    (rank,) = c["per_rank"]
    assert rank["limited"] is True
    # the loop waited a good share of the run for the CPU the busy loop holds
    assert rank["loop_runq_wait_s"] > 0.1 * r["wall_s"], rank
    assert rank["loop_busy_percent"] > 10, rank
    assert "CLIENT-LIMITED: rank 0" in p.stdout, p.stdout
