"""From the trace of a real PyTorch job to the right job model and a faithful replay.

Each scenario records job.py (2 ranks under torchrun, gloo all-reduce per step, batch 4,
50 ms compute per step (100 ms compute-bound), DataLoader with 0 or 2 worker processes) on ext4 over a loop
device, compute-bound (no throttle) or storage-bound (reads throttled by a cgroup), then:
(the compute-bound rank without workers is in make bench-realjob, not here: inside this
suite its job runs 84-89 % AU where alone it runs 95-96 %. The device is what slows: the
loop device over memory is served by a kernel worker that competes for the CPU with the
job's processes, so the same 256 KiB block reads take longer under the job than under its
replay, e.g. a median of 471 us against 136 us in one run on this host. make
bench-realjob prints both runs' median block-read latency next to the errors)

- the job model (`trainio analyze --json`, the same code `replay --trace` uses) finds
  exactly the ranks as GPUs, each rank's workers inside its GPU, the compute time per step
  within 5 % of the configured time, and the throughput one GPU needs within 10 % of
  record size x batch / compute;
- `trainio replay --trace` at the recorded GPU count, on the same device under the same
  throttle, reads every GPU's whole data at the job's throughput (within 10 %) and AU
  (compute-bound within 2 points plus the spread between two runs of the job;
  storage-bound within 3 of the job's AU scaled by the two runs' throughputs, and 6 of the
  job's own: see the assertions); at twice the GPUs, twice the bytes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fidelity import MiB, Scenario, run_scenario
from harness import dataset_fs

from trainio_testlib import require_root

SCENARIOS = [
    # 100 ms of compute: the loader's 4 MiB a step then takes well under half a step even
    # while other work holds a core (at 50 ms such a run read late: AU 89.9 where 94-95
    # is usual), so the run stays compute-bound.
    Scenario("compute-w2", "compute-bound", 2, "npz", MiB, None, compute_ms=100.0, realtime=True),
    Scenario("storage-w2", "storage-bound", 2, "npz", MiB, 100, double=True),
    Scenario("storage-w0", "storage-bound", 0, "npz", MiB, 60),
    Scenario("storage-w2-odirect", "storage-bound", 2, "raw", MiB, 100, odirect=True),
]


@pytest.fixture(scope="module")
def fs():
    require_root("loop devices, cgroups, BPF")
    sets = {sc.name: (sc.files, sc.sample_bytes, sc.fmt) for sc in SCENARIOS}
    # room for each replay's copies: the recorded bytes at twice the GPUs
    slack = max(3 * sc.files * (sc.sample_bytes + 8192) // MiB for sc in SCENARIOS) + 64
    with dataset_fs(sets, slack_mb=slack) as (_dev, _mm, mnt):
        yield mnt


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("sc", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_model_and_replay_of_a_real_job(fs, sc: Scenario) -> None:
    # compute-bound, the job runs a second time after its replay: the spread between two
    # runs of the job itself widens the AU margin (storage-bound, the throughputs do)
    r = run_scenario(sc, fs, reference=sc.regime == "compute-bound")
    model, job = r["model"], r["job"]
    print(
        f"\n{sc.name}: job AU {r['job_au_percent']:.1f}% {r['job_mib_s']:.1f} MiB/s"
        + (f" (again {100 * r['job_b']['au']:.1f}%)" if r["job_b"] else "")
        + "; "
        f"model compute {r['compute_ms']} ms, needs {r['required_mib_s']} MiB/s "
        f"(true {r['required_true_mib_s']:.1f}); replay AU {r['replay_au_percent']:.1f}% "
        f"{r['replay_mib_s']:.1f} MiB/s"
    )
    assert model["incomplete"] is None
    # GPUs found = ranks, exactly; each with its workers.
    assert r["gpus_found"] == sc.ranks, model
    for g in model["gpus"]:
        assert g["workers"] == sc.workers, g["members"]
        assert g["step_signal"] == ("handoff" if sc.workers else "bursts")
        # the batches the ranks took, and those their workers read ahead before the job
        # stopped (up to 2 per worker)
        assert sc.steps <= len(g["steps"]) <= sc.steps + 2 * sc.workers, len(g["steps"])
        assert g["samples_per_step"] == pytest.approx(sc.batch, rel=0.05)
        # The ranks' gloo all-reduce after each step: its sends end the compute.
        assert g["compute_signal"] == "collective", g
        assert 0 < g["sync_s"] < 0.01, g["sync_s"]
    # The compute the job measured around its sleep (oversleep included), per step: the
    # reference, measured in the same run, held to the target (5 %). The nominal
    # sleep is only a floor: the job runs without SCHED_FIFO, and a busy host oversleeps
    # it by more than 5 %. A rank that loads its batch itself (no workers) decodes it
    # between its last read and its collective, in the model's compute: 3.2 % over the
    # sleep in one quiet run (51.8 ms for 50.2 slept).
    for c in r["compute_ms"]:
        assert c >= 0.95 * sc.compute_ms, c
    slept_ms = 1e3 * sum(k["compute_s"] for k in job["ranks"]) / sum(k["steps"] - 1 for k in job["ranks"])
    for c in r["compute_ms"]:
        assert c == pytest.approx(slept_ms, rel=0.05), (c, slept_ms)
    for req in r["required_mib_s"]:
        assert req == pytest.approx(r["required_true_mib_s"], rel=0.10)
    # The replay reads every GPU's whole data, at the job's pace.
    assert r["replay_bytes"] == r["recorded_bytes"]
    # One run of the job under a 100 MiB/s cap reads 93-102 MiB/s: the test allows 10 %
    # (make bench-realjob prints the errors against the 5 % target).
    assert r["replay_mib_s"] == pytest.approx(r["job_mib_s"], rel=0.10)
    # AU: the job's own figure counts its per-step loop (~0.3 ms of 50) as lost time,
    # the model as compute (a trace cannot tell them apart; the all-reduce it can, by its
    # sends), so the replay's AU sits up to ~1 point above the job's. And one run of the job moves by
    # a few points from the next: storage-bound, AU follows the throughput the device
    # gave that run (a run of the job can read 4-5 % below the 100 MiB/s cap while its
    # replay reads at the cap, and AU moves with it). So the replay's AU is checked against the
    # job's scaled by the two runs' throughputs (within 3 points: the bias and noise),
    # and against the job's own within 6 (make bench-realjob prints the errors against
    # the 2-point target).
    scaled = r["job_au_percent"] * r["replay_mib_s"] / r["job_mib_s"]
    if sc.regime == "storage-bound":
        assert abs(r["replay_au_percent"] - scaled) <= 3.0, (r["replay_au_percent"], scaled)
    if sc.regime == "storage-bound":
        assert abs(r["replay_au_percent"] - r["job_au_percent"]) <= 6.0
    else:
        spread_au = abs(100 * r["job_b"]["au"] - r["job_au_percent"])
        assert abs(r["replay_au_percent"] - r["job_au_percent"]) <= 2.0 + spread_au, (
            r["replay_au_percent"],
            r["job_au_percent"],
            100 * r["job_b"]["au"],
        )
    if sc.double:
        assert r["replay2_bytes"] == 2 * r["replay_bytes"]
    assert job["world_size"] == sc.ranks
