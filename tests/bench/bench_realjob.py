"""The job model and replay of a real PyTorch job, as a table (`make bench-realjob`).

Each row records tests/realjob/job.py (torchrun, 2 ranks, gloo all-reduce per step, batch
4, 50 ms compute per step; DataLoader with 0 or 2 worker processes; npz through numpy's
zip reader or raw files, buffered or O_DIRECT; WebDataset shards, JPEGs decoded by PIL,
a HuggingFace dataset through mmap) on ext4 over a loop device, compute-bound
(no throttle) or storage-bound (reads capped by a cgroup), then infers the job model from
the trace (`trainio analyze --json`) and replays it at the recorded GPU count on the same
device under the same cap (`trainio replay --trace`). Columns: GPUs found; compute per
step, configured and inferred; the throughput one GPU needs, true (record size x batch /
compute) and inferred; the job's and the replay's throughput (MiB/s over steps 2..n) and
AU (DLIO's formula; between them the model's AU of the recording: DLIO's formula over the
recorded steps with the inferred compute), and the replay's errors against the job; and
the median block-read latency on the data's device in the job's recording and the
replay's (recorded too): where they differ, the storage served the two runs unalike (a
loop device over memory is served by a kernel worker that competes with the job for the
CPU), and the replay's errors say so rather than how faithful it is.
Targets (issue #18): GPUs = ranks, compute within
5 %, need within 10 %, throughput within 5 %, AU within 2 points.

    sudo .venv/bin/python tests/bench/bench_realjob.py [--runs N] [--steps N] [--only NAME...]
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "realjob"))
from fidelity import MiB, Scenario, run_scenario  # noqa: E402
from harness import dataset_fs  # noqa: E402

LOCK = "/tmp/trainio-bench.lock"

SCENARIOS = [
    Scenario("compute-w2-npz", "compute-bound", 2, "npz", MiB, None, realtime=True),
    Scenario("compute-w0-raw", "compute-bound", 0, "raw", 256 << 10, None, realtime=True),
    Scenario("storage-w2-npz", "storage-bound", 2, "npz", MiB, 100, double=True),
    Scenario("storage-w0-npz", "storage-bound", 0, "npz", MiB, 60),
    Scenario("storage-w2-odirect", "storage-bound", 2, "raw", MiB, 100, odirect=True),
    # the loaders people run (job.py's module doc): WebDataset shards, JPEGs decoded by
    # PIL through torchvision's ImageFolder, a HuggingFace dataset read through mmap
    Scenario("storage-w2-wds", "storage-bound", 2, "wds", 256 << 10, 30),
    Scenario("compute-w2-jpeg", "compute-bound", 2, "jpeg", 256 << 10, None, realtime=True),
    Scenario("storage-w2-jpeg", "storage-bound", 2, "jpeg", 256 << 10, 30),
    Scenario("storage-w2-arrow", "storage-bound", 2, "arrow", 256 << 10, 30),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1, help="runs per scenario (default 1)")
    ap.add_argument("--steps", type=int, default=80, help="steps per rank (default 80)")
    ap.add_argument("--only", nargs="*", help="scenario names")
    args = ap.parse_args()
    scs = [dataclasses.replace(s, steps=args.steps) for s in SCENARIOS if not args.only or s.name in args.only]
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        sets = {sc.name: (sc.files, sc.sample_bytes, sc.fmt) for sc in scs}
        slack = max(3 * sc.files * (sc.sample_bytes + 8192) // MiB for sc in scs) + 64
        rows = []
        with dataset_fs(sets, slack_mb=slack) as (_dev, _mm, mnt):
            for sc in scs:
                for _ in range(args.runs):
                    rows.append(run_scenario(sc, mnt, record_replay=True))
    head = (
        f"{'scenario':<20} {'regime':<13} {'GPUs':>4} {'compute ms':>16} {'need MiB/s':>16} "
        f"{'MiB/s job/replay':>18} {'err':>6} {'AU % job/model/replay':>22} {'err':>6} {'dev p50 us':>13}  x2 bytes"
    )
    print(head)
    print("-" * len(head))
    errs_t, errs_au = [], []
    for r in rows:
        sc = r["scenario"]
        comp = statistics.mean(c for c in r["compute_ms"] if c is not None)
        need = statistics.mean(x for x in r["required_mib_s"] if x is not None)
        et = r["replay_mib_s"] / r["job_mib_s"] - 1
        ea = r["replay_au_percent"] - r["job_au_percent"]
        errs_t.append(abs(et))
        errs_au.append(abs(ea))
        dp = r["device_p50_us"]
        dev = f"{dp[0]:>6.0f}/{dp[1]:<6.0f}" if dp and None not in dp else f"{'-':>13}"
        x2 = "" if r["replay2_bytes"] is None else f"{r['replay2_bytes'] / r['replay_bytes']:.3f}x"
        print(
            f"{sc.name:<20} {sc.regime:<13} {r['gpus_found']:>2}/{sc.ranks} "
            f"{sc.compute_ms:>6.1f}/{comp:>6.1f} ({comp / sc.compute_ms - 1:+.1%}) "
            f"{r['required_true_mib_s']:>6.1f}/{need:>6.1f} "
            f"{r['job_mib_s']:>8.1f}/{r['replay_mib_s']:>8.1f} {et:>+6.1%} "
            f"{r['job_au_percent']:>6.1f}/{r['model_au_percent']:>6.1f}/{r['replay_au_percent']:>6.1f}"
            f" {ea:>+6.1f} {dev}  {x2}"
        )
    print(
        f"\nworst |throughput error| {max(errs_t):.1%} (target 5%), worst |AU error| "
        f"{max(errs_au):.1f} points (target 2)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
