"""Recording a multi-host job as one job: `mpirun -npernode 1 trainio record --per-host`
starts a recorder on every host of the test bed (testbed.py), each writing its own trace
into SET/HOSTNAME; analyze and replay --trace read the set as one job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from trainio_analysis.trace import read_metadata
from trainio_testlib import TRAINIO, majmin, run

pytestmark = [pytest.mark.root]

MIB = 1 << 20
# One "rank" per host reading its own local disk with O_DIRECT: STEPS[host] steps of four
# 1 MiB reads, 200 ms of "compute" after each (far above the gap a read delayed by a
# loaded host leaves inside a step, which the model must not take for a step's end). Its
# step count comes from its host name, so each host's bytes are its own.
STEPS = {"h1": 6, "h2": 10}
READER = """import mmap, os, socket, sys, time
steps = {steps}[socket.gethostname()]
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT)
buf = mmap.mmap(-1, 1 << 20)
for s in range(steps):
    for i in range(4):
        assert os.preadv(fd, [buf], (s * 4 + i) << 20) == 1 << 20
    time.sleep(0.2)
"""


def reads_done(dev: str) -> tuple[int, int]:
    """(reads completed, bytes read) by a block device since it appeared: fields 1 and 3
    (sectors) of /sys/block/NAME/stat."""
    f = Path(f"/sys/block/{Path(dev).name}/stat").read_text().split()
    return int(f[0]), int(f[2]) * 512


def missed(trace: Path) -> int:
    """Completions the recorder counted but could not trace (docs/design/recorder.md: the kernel
    did not hand them to BPF, or they were in flight when recording stopped)."""
    lost = read_metadata(trace)["lost_events"]
    assert not {k: n for k, n in lost.items() if n and not k.startswith("block_rq_complete:")}, lost
    return lost.get("block_rq_complete:unseen", 0) + lost.get("block_rq_complete:in_flight_at_end", 0)


def test_record_a_2_host_job_as_one_job(bed3, tmp_path):
    """Each host's recorder keeps only its own disk's requests: per-host bytes equal that
    disk's /sys/block/*/stat delta, the job's their sum; the set's job model has both
    hosts' GPUs, and replay --trace of the set replays both."""
    disk, devs = bed3.local_disks(["h1", "h2"])
    reader = tmp_path / "reader.py"
    reader.write_text(READER.format(steps=STEPS))
    job = bed3.shared / "recorded-job"
    before = {h: reads_done(d) for h, d in devs.items()}
    cmd = bed3.mpirun(
        {"h1": 1, "h2": 1},
        [TRAINIO, "record", "--per-host", "-o", job, "--dev", disk, "-q", "--", "python3", reader, disk],
    )
    p = run(cmd, timeout=120, env=bed3.mpi_env())
    assert p.returncode == 0, p.stderr[-3000:]
    after = {h: reads_done(d) for h, d in devs.items()}
    requests = {h: after[h][0] - before[h][0] for h in devs}
    delta = {h: after[h][1] - before[h][1] for h in devs}
    # Each disk read its own host's steps and nothing else.
    assert delta == {h: STEPS[h] * 4 * MIB for h in STEPS}, delta
    assert sorted(x.name for x in job.iterdir()) == ["h1", "h2"]
    lost = {h: missed(job / h) for h in devs}

    p = run([TRAINIO, "analyze", job, "--json"], timeout=120)
    assert p.returncode == 0, p.stderr
    a = json.loads(p.stdout)
    assert a["selection"]["layer"] == "block"
    per_host = {h["host"]: h for h in a["per_host"]}
    assert sorted(per_host) == ["h1", "h2"]
    for h, d in devs.items():
        # Every request the disk completed is in its host's trace, or counted as missed;
        # with none missed, the host's bytes are the disk's to the byte.
        assert per_host[h]["events"] + lost[h] == requests[h], (h, per_host[h], lost, requests)
        if lost[h] == 0:
            assert per_host[h]["bytes_read"] == delta[h], (h, per_host[h])
        else:  # a request here is at most 1 MiB
            assert delta[h] - lost[h] * MIB <= per_host[h]["bytes_read"] < delta[h], (h, per_host[h], lost)
        assert per_host[h]["devices"] == [majmin(d)]
        assert per_host[h]["gpus"] == 1
    # The job's bytes are the hosts' sum: the two disks' deltas, less what was missed.
    assert a["bytes_read"] == per_host["h1"]["bytes_read"] + per_host["h2"]["bytes_read"]
    if not any(lost.values()):
        assert a["bytes_read"] == delta["h1"] + delta["h2"]
    # In the job, a device is HOST/MAJ:MIN: two hosts' disks are two devices.
    assert sorted(a["groups"]) == sorted(f"{h}/{majmin(d)}" for h, d in devs.items())
    # One clock: both hosts' recordings lie inside the job's span.
    for h in per_host.values():
        assert 0 <= h["start_s"] < h["end_s"] <= a["duration_s"] + 1e-9
    model = a["job_model"]
    assert [g["host"] for g in model["gpus"]] == ["h1", "h2"]
    assert [len(g["steps"]) for g in model["gpus"]] == [STEPS["h1"], STEPS["h2"]]
    assert model["hosts"] == ["h1", "h2"]

    out = tmp_path / "replay.json"
    data = bed3.shared / "replayed-job"
    cmd = bed3.mpirun(
        {"h1": 1, "h2": 1},
        [TRAINIO, "replay", "--trace", job, "--data-dir", data, "--generate", "--gpus", 2, "--json", out],
    )
    p = run(cmd, timeout=120, env=bed3.mpi_env())
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert [t["host"] for t in r["settings"]["templates"]] == ["h1", "h2"]
    assert {g["gpu"]: g["bytes_read"] for g in r["per_gpu"]} == {0: delta["h1"], 1: delta["h2"]}
    assert r["hosts"] == 2


def test_a_recorder_killed_on_one_host_leaves_a_set_that_analyzes_with_that_member_cut_off(bed3, tmp_path):
    """h2's recorder is SIGKILLed once it has finished a segment, while its job still
    reads; h1's records to the end. The set still analyzes and reports: h1 is complete,
    h2 is named cut off (schema 1.9's trainio.end), and so is the job."""
    disk, _devs = bed3.local_disks(["h1", "h2"])
    reader = tmp_path / "reader.py"
    # h1 reads for 0.3 s; h2 for 6 s, long after its recorder is killed.
    reader.write_text(
        "import mmap, os, socket, sys, time\n"
        "end = time.monotonic() + {'h1': 0.3, 'h2': 6.0}[socket.gethostname()]\n"
        "fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT)\n"
        "buf = mmap.mmap(-1, 1 << 20)\n"
        "i = 0\n"
        "while time.monotonic() < end:\n"
        "    os.preadv(fd, [buf], (i % 32) << 20)\n"
        "    i += 1\n"
        "    time.sleep(0.01)\n"
    )
    job = bed3.shared / "cut-job"
    cmd = bed3.mpirun(
        {"h1": 1, "h2": 1},
        [
            TRAINIO,
            "record",
            "--per-host",
            "-o",
            job,
            "--dev",
            disk,
            "-q",
            "--segment-s",
            "0.3",
            "--",
            "python3",
            reader,
            disk,
        ],
    )
    p = subprocess.Popen(
        [str(c) for c in cmd], env=bed3.mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while not list((job / "h2").glob("seg-*.parquet")):
            assert p.poll() is None and time.monotonic() < deadline, "h2 finished no segment"
            time.sleep(0.05)
        recorders = [pid for pid, name in bed3.processes("h2") if name == "trainio-record"]
        assert len(recorders) == 1, bed3.processes("h2")
        os.kill(recorders[0], signal.SIGKILL)
        p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert sorted(x.name for x in job.iterdir()) == ["h1", "h2"]

    a = run([TRAINIO, "analyze", job, "--json"], timeout=120)
    assert a.returncode == 0, a.stderr
    r = json.loads(a.stdout)
    per_host = {h["host"]: h for h in r["per_host"]}
    assert per_host["h1"]["complete"] is True and per_host["h2"]["complete"] is False, per_host
    assert per_host["h2"]["events"] > 0  # its finished segments still read
    assert r["recording"]["complete"] is False and "h2" in r["recording"]["end_reason"], r["recording"]
    text = run([TRAINIO, "analyze", job], timeout=120)
    assert text.returncode == 0, text.stderr
    cut = [line for line in text.stdout.splitlines() if "INCOMPLETE" in line]
    assert len(cut) == 1 and cut[0].split()[0] == "h2", text.stdout
    html = tmp_path / "report.html"
    rep = run([TRAINIO, "report", job, "-o", html], timeout=180)
    assert rep.returncode == 0, rep.stderr
    assert "NO: cut off (members cut off: h2)" in html.read_text()
    # Each member alone: h1 says why it ended, h2 that it did not.
    h1 = json.loads(run([TRAINIO, "analyze", job / "h1", "--json"], timeout=120).stdout)["recording"]
    assert h1["complete"] is True and h1["end_reason"] == "command exited", h1


def test_per_host_output_that_holds_a_trace_is_bad_input(tmp_path):
    """--per-host -o SET where SET is a trace itself: one line, exit 2, nothing written."""
    t = tmp_path / "t"
    t.mkdir()
    (t / "seg-000000.parquet").write_bytes(b"")
    p = run([TRAINIO, "record", "--per-host", "-o", t, "--", "true"])
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip() == (
        f"trainio record: --output {t}: holds a trace of its own, so it cannot be a set of per-host traces"
    )
    assert [x.name for x in t.iterdir()] == ["seg-000000.parquet"]
