"""A host lost in the middle of a 2-host replay: h2's cable is pulled (its port on the test
bed's switch goes down) while the replay's steps run. The ranks on h1 stop within the
watchdog's timeout (TRAINIO_PEER_TIMEOUT, replay/src/cluster/watchdog.rs), rank 0 saves the steps
they ran and names h2 in one line, the ranks cut off on h2 end by themselves, and mpirun
ends the job once its ssh session to h2 gives up (the ssh setting docs/hosts.md gives)."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator

import pytest
from test_hosts import datagen, left_on_hosts, ranks_on, workload
from testbed import TestBed, need_testbed_tools

from trainio_testlib import PROGRESS_ENV, TRAINIO, wait_for_steps

pytestmark = [pytest.mark.root]

PEER_TIMEOUT_S = 3
# mpirun's ssh sessions give up on a silent host after about 1 s × (5 + 1) (docs/hosts.md),
# later than the watchdog (PEER_TIMEOUT_S) and its results.
SSH_ALIVE = " -o ServerAliveInterval=1 -o ServerAliveCountMax=5"


@pytest.fixture(scope="module")
def bed2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestBed]:
    """Hosts h1 and h2 of their own: the test cuts h2 off for good."""
    need_testbed_tools()
    with TestBed(tmp_path_factory.mktemp("bed2"), 2) as bed:
        yield bed


def test_host_cut_mid_replay_ends_the_job_and_keeps_the_survivors_steps(bed2, tmp_path):
    steps, compute = 100, 0.2
    data = bed2.shared / "lost"
    wl = workload(tmp_path / "wl.yaml", compute=compute)
    datagen(wl, data, 4, steps)
    out = tmp_path / "r.json"
    env = bed2.mpi_env()
    env["OMPI_MCA_plm_rsh_agent"] += SSH_ALIVE
    env["TRAINIO_PEER_TIMEOUT"] = str(PEER_TIMEOUT_S)
    env.update(PROGRESS_ENV)
    cmd = bed2.mpirun(
        {"h1": 2, "h2": 2},
        [
            "-x",
            "TRAINIO_PEER_TIMEOUT",
            "-x",
            "TRAINIO_PROGRESS_S",
            TRAINIO,
            "replay",
            "--workload",
            wl,
            "--data-dir",
            data,
            "--gpus",
            4,
        ]
        + ["--steps", steps, "--json", out],
    )
    log = tmp_path / "mpirun.log"
    with open(log, "w") as f:
        job = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while len(ranks_on(bed2, "h1")) < 2 or len(ranks_on(bed2, "h2")) < 2:
            assert job.poll() is None, job.communicate()
            assert time.monotonic() < deadline, "the ranks did not all start"
            time.sleep(0.1)
        before = wait_for_steps(job, at_least=5)
        subprocess.run(["ip", "-n", bed2.switch, "link", "set", "v2", "down"], check=True)
        cut = time.monotonic()
        cut_wall = time.time()
        _, err = job.communicate(timeout=60)
        err = "".join(before) + err
        took = time.monotonic() - cut
        # The ranks cut off on h2 end by themselves: twice the timeout after they found
        # rank 0 silent.
        while ranks_on(bed2, "h2") and time.monotonic() - cut < 4 * PEER_TIMEOUT_S + 5:
            time.sleep(0.2)
        h2_left = ranks_on(bed2, "h2")
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    stdout = log.read_text()
    saved = out.stat().st_mtime - cut_wall if out.exists() else float("nan")
    print(f"results saved {saved:.1f} s and the job ended {took:.1f} s after the cut")
    assert took < 10, f"the job took {took:.1f} s to end after the cut: {err[-2000:]}"
    assert job.returncode != 0
    assert not h2_left, f"ranks left on h2: {h2_left}"
    assert not {h: p for h, p in left_on_hosts(bed2, ["h1", "head"]).items() if p}
    # One line names the host, its ranks and where the results went.
    named = [line for line in err.splitlines() if line.startswith("trainio replay: rank 0 on h1 failed:")]
    assert len(named) == 1, err[-3000:]
    assert f"host h2 (ranks 2, 3) silent for {PEER_TIMEOUT_S} s" in named[0], named
    assert f"the results of the steps run are in {out}" in named[0], named
    # The survivors' results: h1's GPUs, every step they ended before the cut.
    r = json.loads(out.read_text())
    assert r["lost"] == [{"rank": 2, "host": "h2"}, {"rank": 3, "host": "h2"}]
    assert re.match(rf"host h2 \(ranks 2, 3\) silent for {PEER_TIMEOUT_S} s .* at the step barrier", r["stopped"])
    assert r["hostnames"] == ["h1"]
    gpus = r["per_gpu"]
    assert [g["gpu"] for g in gpus] == [0, 1] and {g["host"] for g in gpus} == {"h1"}
    ran = {g["steps"] for g in gpus}
    assert len(ran) == 1, gpus  # lockstep under the barrier
    ran = ran.pop()
    # Cut once rank 0 had ended step 5; the last steps ended before h2 fell silent.
    assert 5 <= ran < steps, ran
    assert sum(g["bytes_read"] for g in gpus) >= 2 * ran * 4096
    assert "AU" in stdout or "au" in stdout.lower(), stdout[-2000:]
