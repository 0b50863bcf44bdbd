"""Replay and sweep across hosts: ranks started by mpirun over ssh on hosts that are network
namespaces of this machine, each with its own address, host name and sshd (testbed.py),
reading a file system every host sees at the same path."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from testbed import TestBed, need_testbed_tools, netns_pids

from trainio_testlib import PROGRESS_ENV, TRAINIO, run, wait_for_steps

pytestmark = [pytest.mark.root]

WORKLOAD = """model:
  name: hosts
dataset:
  num_files_train: 1
  num_samples_per_file: 1
  record_length_bytes: {record}
reader:
  batch_size: {batch}
  read_threads: 2
train:
  epochs: 1
  computation_time: {compute}
metric:
  au: 0.9
"""

# Processes of ours that may not outlive a job, on any host.
JOB_PROCESSES = {"trainio-replay", "orted", "mpirun"}


def workload(path: Path, *, record=4096, batch=1, compute=0.1) -> Path:
    path.write_text(WORKLOAD.format(record=record, batch=batch, compute=compute))
    return path


def mem_total_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal in /proc/meminfo")


def datagen(wl: Path, data: Path, gpus: int, steps: int) -> None:
    p = run(
        [
            str(TRAINIO),
            "datagen",
            "--workload",
            str(wl),
            "--data-dir",
            str(data),
            "--gpus",
            str(gpus),
            "--steps",
            str(steps),
        ],
        timeout=120,
    )
    assert p.returncode == 0, p.stderr


def left_on_hosts(bed: TestBed, hosts=None) -> dict[str, list[tuple[int, str]]]:
    """Job processes still running on each host (sshd's own are the test bed's)."""
    return {h: [pc for pc in bed.processes(h) if pc[1] in JOB_PROCESSES] for h in (hosts or [*bed.names, "head"])}


def wait_nothing_left(bed: TestBed, timeout: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        left = {h: p for h, p in left_on_hosts(bed).items() if p}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def test_testbed_hosts_are_separate_and_all_undone_on_failure(tmp_path):
    """Each host answers ssh with its own name and address and sees the shared file system;
    a failure inside the test bed still removes namespaces, sshds, mount and loop device."""
    need_testbed_tools()
    with pytest.raises(RuntimeError, match="the test failed here"):
        with TestBed(tmp_path / "bed", 2) as bed:
            ssh = ["ssh", "-F", bed.tmp / "ssh_config"]
            for h in bed.names:
                out = bed.head([*ssh, h, "hostname; ip -4 -o addr show dev eth0"]).stdout
                assert out.splitlines()[0] == h
                assert f"inet {bed.ip[h]}/24" in out
            # Shared storage: written on h1, read on h2 at the same path.
            bed.head([*ssh, "h1", f"echo from-h1 > {bed.shared}/probe"])
            assert bed.head([*ssh, "h2", f"cat {bed.shared}/probe"]).stdout == "from-h1\n"
            # The machine's own /etc/hosts and host name are untouched.
            assert "h1" not in Path("/etc/hosts").read_text().split()
            assert os.uname().nodename not in bed.names
            namespaces = list(bed.namespaces)
            sshd_pids = [p.pid for p in bed.sshd.values()]
            mnt, dev = bed.shared, bed.shared_dev
            assert all(netns_pids(bed.ns(h)) for h in bed.names)
            raise RuntimeError("the test failed here")
    listed = run(["ip", "netns", "list"]).stdout
    assert not [ns for ns in namespaces if ns in listed], listed
    for pid in sshd_pids:
        assert not Path(f"/proc/{pid}").exists(), f"sshd {pid} survives the test bed"
    assert str(mnt) not in Path("/proc/self/mountinfo").read_text()
    assert not mnt.exists()
    backing = run(["losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE"]).stdout
    assert not [line for line in backing.splitlines() if line.split()[0] == dev and "trainio-test" in line], backing


def test_replay_288_gpus_over_3_hosts(bed3, tmp_path):
    """288 simulated GPUs over 3 hosts × 2 ranks: hosts, RAM counted once per host, and the
    per-host figures are each host's share of the job."""
    data = bed3.shared / "r288"
    wl = workload(tmp_path / "wl.yaml", compute=0.1)
    steps = 5
    datagen(wl, data, 288, steps)
    out = tmp_path / "r.json"
    cmd = bed3.mpirun(
        {"h1": 2, "h2": 2, "h3": 2},
        [TRAINIO, "replay", "--workload", wl, "--data-dir", data, "--gpus", 288, "--steps", steps, "--json", out],
    )
    p = run(cmd, timeout=120, env=bed3.mpi_env())
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert (r["gpus"], r["ranks"], r["hosts"], r["hostnames"]) == (288, 6, 3, ["h1", "h2", "h3"])
    # Every host has this machine's RAM; counted once per host, not per rank.
    assert r["client_ram_bytes"] == 3 * mem_total_bytes()
    # mpirun places ranks by slot: 0,1 on h1, 2,3 on h2, 4,5 on h3; 48 GPUs per rank.
    for g in r["per_gpu"]:
        assert g["rank"] == g["gpu"] // 48 and g["host"] == f"h{g['rank'] // 2 + 1}", g
    # The barrier crosses hosts: every GPU ran every step.
    assert {g["steps"] for g in r["per_gpu"]} == {steps}
    ph = r["per_host"]
    assert [h["host"] for h in ph] == ["h1", "h2", "h3"]
    for i, h in enumerate(ph):
        mine = [g for g in r["per_gpu"] if g["host"] == h["host"]]
        assert h["ranks"] == [2 * i, 2 * i + 1] and h["gpus"] == 96 == len(mine)
        assert h["bytes_read"] == sum(g["bytes_read"] for g in mine) == 96 * steps * 4096
        assert h["samples"] == sum(g["samples"] for g in mine)
        assert h["gpu_steps"] == 96 * steps
        assert h["au_percent"] == pytest.approx(sum(g["au_percent"] for g in mine) / 96)
        assert h["mem_total_bytes"] == mem_total_bytes()
        assert h["cpu_s"] > 0 and h["cpu_us_per_gpu_step"] > 0
        assert h["sleep_overshoot_us_p99"] >= h["sleep_overshoot_us_p50"]
    assert sum(h["bytes_read"] for h in ph) == r["bytes_read"]
    assert sum(h["throughput_mib_s"] for h in ph) == pytest.approx(r["throughput_mib_s"])
    assert sum(h["cpu_s"] for h in ph) == pytest.approx(r["cpu_s"])
    assert "host h2  96 GPUs on 2 ranks" in p.stdout
    assert not wait_nothing_left(bed3)


def test_sweep_over_2_hosts(bed3, tmp_path):
    """`trainio sweep` under mpirun over 2 hosts: every trial runs on both hosts' ranks."""
    data = bed3.shared / "sweep"
    wl = workload(tmp_path / "wl.yaml", compute=0.1)
    curve = tmp_path / "curve.json"
    cmd = bed3.mpirun(
        {"h1": 2, "h2": 2},
        [
            TRAINIO,
            "sweep",
            "--workload",
            wl,
            "--data-dir",
            data,
            "--generate",
            "--steps",
            4,
            "--start-gpus",
            4,
            "--max-gpus",
            16,
            "--threshold",
            75,
            "--json",
            curve,
        ],
    )
    p = run(cmd, timeout=120, env=bed3.mpi_env())
    assert p.returncode == 0, p.stderr[-3000:]
    s = json.loads(curve.read_text())
    assert [pt["gpus"] for pt in s["curve"]] == [4, 8, 16]
    assert s["supported_gpus"] == 16 and s["limited_by_max_gpus"] is True
    for run_ in s["runs"]:
        assert (run_["ranks"], run_["hosts"], run_["hostnames"]) == (4, 2, ["h1", "h2"])
        assert [h["gpus"] for h in run_["per_host"]] == [run_["gpus"] // 2] * 2
        assert {g["steps"] for g in run_["per_gpu"]} == {4}
    assert "supported simulated GPUs: at least 16" in p.stdout
    assert not wait_nothing_left(bed3)


def ranks_on(bed: TestBed, host: str) -> dict[int, int]:
    """MPI rank -> pid of the trainio ranks running on `host`."""
    out = {}
    for pid, name in bed.processes(host):
        if name != "trainio-replay":
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for kv in env:
            if kv.startswith(b"OMPI_COMM_WORLD_RANK="):
                out[int(kv.split(b"=")[1])] = pid
    return out


def test_rank_killed_on_host2_ends_the_job_everywhere(bed3, tmp_path):
    """SIGKILL to one rank on h2 mid-run: mpirun ends the job on every host within seconds,
    exits non-zero naming the rank and the host, and no job process is left anywhere."""
    data = bed3.shared / "kill"
    wl = workload(tmp_path / "wl.yaml", compute=0.5)
    datagen(wl, data, 12, 60)
    cmd = bed3.mpirun(
        {"h1": 2, "h2": 2, "h3": 2},
        ["-x", "TRAINIO_PROGRESS_S", TRAINIO, "replay", "--workload", wl, "--data-dir", data, "--gpus", 12]
        + ["--steps", 60],
    )
    env = {**bed3.mpi_env(), **PROGRESS_ENV}
    job = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while len(ranks := ranks_on(bed3, "h2")) < 2 or any(len(ranks_on(bed3, h)) < 2 for h in ("h1", "h3")):
            assert job.poll() is None, job.communicate()
            assert time.monotonic() < deadline, "the ranks did not all start"
            time.sleep(0.1)
        before = wait_for_steps(job)
        rank, pid = min(ranks.items())
        os.kill(pid, 9)
        killed = time.monotonic()
        _, err = job.communicate(timeout=30)
        err = "".join(before) + err
        took = time.monotonic() - killed
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode != 0
    assert took < 10, f"the job took {took:.1f} s to end after the kill"
    assert re.search(rf"process rank {rank} with PID {pid} on node h2 exited on signal 9", err), err
    assert not wait_nothing_left(bed3)


def test_rank_failing_on_host2_names_rank_and_host(bed3, tmp_path):
    """h2 lacks the data path (an empty directory is mounted over it, on h2 only, as on a node
    where the shared file system is not mounted): its ranks fail with `rank R on h2 failed:
    CAUSE`, the job ends on every host, exit non-zero, nothing left."""
    data = bed3.shared / "fail"
    wl = workload(tmp_path / "wl.yaml", compute=0.05)
    datagen(wl, data, 6, 5)
    empty = tmp_path / "empty"
    empty.mkdir()
    bed3.on_host("h2", ["mount", "--bind", empty, data])
    try:
        assert any(data.iterdir())  # the machine still sees the data
        assert bed3.on_host("h2", ["ls", "-A", data]).stdout == ""
        cmd = bed3.mpirun(
            {"h1": 2, "h2": 2, "h3": 2},
            [TRAINIO, "replay", "--workload", wl, "--data-dir", data, "--gpus", 6, "--steps", 5],
        )
        t0 = time.monotonic()
        p = run(cmd, timeout=60, env=bed3.mpi_env())
        took = time.monotonic() - t0
    finally:
        bed3.on_host("h2", ["umount", data])
    assert p.returncode != 0
    failed = re.findall(r"trainio replay: rank (\d+) on (\S+) failed: (.*)", p.stderr)
    assert failed, p.stderr
    assert {(int(r), h) for r, h, _ in failed} <= {(2, "h2"), (3, "h2")}, failed
    assert all(str(data) in cause for _, _, cause in failed), failed
    assert took < 30, f"{took:.1f} s"
    assert not wait_nothing_left(bed3)


def test_the_step_barrier_crosses_hosts(bed3, tmp_path):
    """h2 computes 0.3 s a step, h1 0.05 s (the workload path holds a different file on h2,
    mounted there only): with the barrier h1's GPUs wait for h2's at every step; with
    --no-barrier they do not wait at all."""
    data = bed3.shared / "barrier"
    wl = workload(tmp_path / "wl.yaml", compute=0.05)
    slow = workload(tmp_path / "slow.yaml", compute=0.3)
    steps = 5
    datagen(wl, data, 4, steps)
    bed3.on_host("h2", ["mount", "--bind", slow, wl])
    results = {}
    try:
        for mode, extra in (("barrier", []), ("no-barrier", ["--no-barrier"])):
            out = tmp_path / f"{mode}.json"
            cmd = bed3.mpirun(
                {"h1": 2, "h2": 2},
                [
                    TRAINIO,
                    "replay",
                    "--workload",
                    wl,
                    "--data-dir",
                    data,
                    "--gpus",
                    4,
                    "--steps",
                    steps,
                    "--json",
                    out,
                    *extra,
                ],
            )
            p = run(cmd, timeout=60, env=bed3.mpi_env())
            assert p.returncode == 0, p.stderr[-3000:]
            results[mode] = {h["host"]: h for h in json.loads(out.read_text())["per_host"]}
            results[mode]["gpus"] = json.loads(out.read_text())["per_gpu"]
    finally:
        bed3.on_host("h2", ["umount", wl])
    wait = {mode: {g["host"]: g["barrier_wait_s"] for g in r["gpus"]} for mode, r in results.items()}
    # h1 waits (0.3 - 0.05) s at each of the 5 steps' barriers; h2 hardly at all.
    assert wait["barrier"]["h1"] > 0.8 * steps * 0.25, wait
    assert wait["barrier"]["h2"] < 0.2 * wait["barrier"]["h1"], wait
    assert results["barrier"]["h1"]["au_percent"] < 40 < results["barrier"]["h2"]["au_percent"]
    assert wait["no-barrier"] == {"h1": 0.0, "h2": 0.0}, wait
    assert results["no-barrier"]["h1"]["au_percent"] > 80
    assert not wait_nothing_left(bed3)
