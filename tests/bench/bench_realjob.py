"""The job model and replay of a real PyTorch job, as a table (`make bench-realjob`).

Each row records tests/realjob/job.py (torchrun, 2 ranks, gloo all-reduce per step, batch
4, 50 ms compute per step; DataLoader with 0 or 2 worker processes; npz through numpy's
zip reader or raw files, buffered or O_DIRECT; WebDataset shards, JPEGs decoded by PIL,
a HuggingFace dataset through mmap; these at SCHED_FIFO, as tests/realjob/test_loaders.py
runs them) on ext4 over a loop device, compute-bound
(no throttle) or storage-bound (reads capped by a cgroup), then infers the job model from
the trace (`trainio analyze --json`) and replays it at the recorded GPU count on the same
device under the same cap (`trainio replay --trace`, recorded at the block layer). Columns:
GPUs found; compute per step, configured and inferred; the throughput one GPU needs, true
(record size x batch / compute) and inferred; the job's and the replay's AU (DLIO's
formula) and its error; on the data's device, the block bytes each read and the MiB/s over
the span in which the middle 98 % of them completed, with the replay's errors; the
replay's per-issue block queue-depth W1 against the job's (`trainio compare`); the median
block-read latency in each (where they differ, the storage served the two runs unalike: a
loop device over memory is served by a kernel worker that competes with the job for the
CPU); and, for the scenarios replayed at twice the GPUs, the bytes read against the
recorded count's. Under the table, for each Arrow job (reads through mmap), what the file
layer's mapped-read programs cost in its recording (the kernel's BPF statistics).
Targets (issues #18, #30): GPUs = ranks, compute within 5 %, need within 10 %, block bytes
and MiB/s within 5 %, AU within 2 points, QD W1 within 1, 2x the bytes at 2x the GPUs.

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
    Scenario("storage-w2-wds", "storage-bound", 2, "wds", 256 << 10, 30, realtime=True, double=True),
    Scenario("compute-w2-jpeg", "compute-bound", 2, "jpeg", 256 << 10, None, realtime=True, double=True),
    Scenario("storage-w2-jpeg", "storage-bound", 2, "jpeg", 256 << 10, 30, realtime=True, double=True),
    Scenario("storage-w2-arrow", "storage-bound", 2, "arrow", 256 << 10, 30, realtime=True, double=True),
    Scenario("compute-w2-arrow", "compute-bound", 2, "arrow", 256 << 10, None, realtime=True, double=True),
    Scenario("compute-w2-wds", "compute-bound", 2, "wds", 256 << 10, None, realtime=True, double=True),
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
                    r = run_scenario(sc, mnt, record_replay=True)
                    r["mapped_cost"] = r["mapped_layer"] if sc.fmt == "arrow" else None
                    rows.append(r)
    head = (
        f"{'scenario':<20} {'regime':<13} {'GPUs':>4} {'compute ms':>16} {'need MiB/s':>13} "
        f"{'AU % job/replay':>15} {'err':>5} {'block MiB job/replay':>20} {'err':>6} "
        f"{'block MiB/s job/replay':>22} {'err':>6} {'QD W1':>5} {'dev p50 us':>13}  x2 bytes"
    )
    print(head)
    print("-" * len(head))
    errs_t, errs_au, errs_b, w1s = [], [], [], []
    mapped = []
    for r in rows:
        sc = r["scenario"]
        comp = statistics.mean(c for c in r["compute_ms"] if c is not None)
        need = statistics.mean(x for x in r["required_mib_s"] if x is not None)
        jb, rb = r["blocks"]["job"], r["blocks"]["replay"]
        w1 = r["blocks"]["compare"]["qd_w1_issue"]
        eb = rb["bytes"] / jb["bytes"] - 1
        et = rb["mib_s"] / jb["mib_s"] - 1
        ea = r["replay_au_percent"] - r["job_au_percent"]
        errs_t.append(abs(et))
        errs_au.append(abs(ea))
        errs_b.append(abs(eb))
        w1s.append(w1)
        dp = r["device_p50_us"]
        dev = f"{dp[0]:>6.0f}/{dp[1]:<6.0f}" if dp and None not in dp else f"{'-':>13}"
        x2 = "" if r["replay2_bytes"] is None else f"{r['replay2_bytes'] / r['replay_bytes']:.3f}x"
        print(
            f"{sc.name:<20} {sc.regime:<13} {r['gpus_found']:>2}/{sc.ranks} "
            f"{sc.compute_ms:>6.1f}/{comp:>6.1f} ({comp / sc.compute_ms - 1:+.1%}) "
            f"{r['required_true_mib_s']:>6.1f}/{need:>6.1f} "
            f"{r['job_au_percent']:>7.1f}/{r['replay_au_percent']:>7.1f} {ea:>+5.1f} "
            f"{jb['bytes'] / MiB:>10.1f}/{rb['bytes'] / MiB:>9.1f} {eb:>+6.1%} "
            f"{jb['mib_s']:>11.2f}/{rb['mib_s']:>10.2f} {et:>+6.1%} {w1:>5.2f} {dev}  {x2}"
        )
        if r["mapped_cost"]:
            mapped.append((sc.name, r["mapped_cost"]))
    print(
        f"\nworst |block bytes error| {max(errs_b):.1%}, |block MiB/s error| {max(errs_t):.1%} (targets 5%), "
        f"|AU error| {max(errs_au):.1f} points (target 2), QD W1 {max(w1s):.2f} (target 1)"
    )
    for name, c in mapped:
        print(
            f"mmap layer in {name}'s recording: {c['runs']:,} runs of its programs "
            f"({', '.join(f'{k} {v:.0f} ns' for k, v in c['ns_per_run'].items())} per run), "
            f"{c['ns'] / 1e6:.1f} ms of BPF time, {c['ns'] / 1e9 / c['job_wall_s']:.3%} of the job's wall "
            f"({c['rows']:,} fault/map_pages rows)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
