"""Replay fidelity (issue #6): record an emulated training at 1, 4 and 8 GPUs on a loop
device, replay each trace at its recorded GPU count on the same device, and print how
well the replay reproduces the original.

Per GPU count (see trainio_testlib.fidelity_run): ext4 on a loop device over /dev/shm
(no lazy init, noatime), 1 MiB samples, batch 4, read_threads 4, 0.05 s compute, 24
steps; the original runs one MPI rank per GPU with psync O_DIRECT reads (both runs
--realtime, so other load on the host disturbs neither) under
`trainio record`; the replay of its trace runs with --record. Scores from
`trainio compare --json` (block layer of the loop device unless noted):

- throughput: replay / original over the active span (first request to last);
- AU: the original's and the replay's (DLIO's formula), and the difference in points;
- QD W1: Wasserstein-1 of the per-issue and time-weighted queue-depth histograms;
- size W1: request sizes, in octaves (0 = the same sizes), block and file layer.

Targets: throughput within ±5 %, AU within ±2 points, per-issue QD W1 <= 1.0. Takes the
benchmark lock (/tmp/trainio-bench.lock) so no other benchmark runs meanwhile.

    sudo .venv/bin/python tests/bench/bench_fidelity.py [--gpus 1 4 8] [--steps 24]
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from trainio_testlib import fidelity_run  # noqa: E402

LOCK = "/tmp/trainio-bench.lock"
TARGET_TPUT = 0.05
TARGET_AU_POINTS = 2.0
TARGET_W1 = 1.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--steps", type=int, default=24)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench-fidelity: needs root (loop devices, BPF)", file=sys.stderr)
        return 2
    rows = []
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for n in args.gpus:
            work = Path(tempfile.mkdtemp(prefix="trainio-bench-fidelity-"))
            try:
                r = fidelity_run(n, work / "run", steps=args.steps)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            c, cf = r["compare"], r["compare_file"]
            au_o, au_r = r["original"]["au_percent"], r["replay"]["au_percent"]
            ok = (
                abs(c["throughput_rel_error"]) <= TARGET_TPUT
                and abs(au_r - au_o) <= TARGET_AU_POINTS
                and c["qd_w1_issue"] <= TARGET_W1
            )
            rows.append((n, c, cf, au_o, au_r, ok, r["original"]["gpu_steps"]))
            print(f"  {n} GPUs done", file=sys.stderr)
    print(
        "replay fidelity: trace replayed at its recorded GPU count on the same loop device "
        f"(1 MiB O_DIRECT reads, batch 4, 4 readers, 0.05 s compute, {args.steps} steps)"
    )
    print(
        f"targets: throughput ±{TARGET_TPUT:.0%}, AU ±{TARGET_AU_POINTS:g} points, per-issue QD W1 <= {TARGET_W1:g}\n"
    )
    head = (
        f"{'GPUs':>4} {'blk reqs':>8} {'MiB/s orig':>10} {'replay/orig':>11} {'AU orig':>8} {'AU replay':>9} "
        f"{'ΔAU':>6} {'QD W1 issue':>11} {'QD W1 time':>10} {'size W1 blk':>11} {'size W1 file':>12}  ok"
    )
    print(head)
    print("-" * len(head))
    all_ok = True
    for n, c, cf, au_o, au_r, ok, _ in rows:
        all_ok &= ok
        reqs = round(c["bytes_read"]["a"] / (1 << 20))
        print(
            f"{n:>4} {reqs:>8} {c['throughput_mib_s']['a']:>10.1f} {1 + c['throughput_rel_error']:>11.3f} "
            f"{au_o:>7.2f}% {au_r:>8.2f}% {au_r - au_o:>+6.2f} {c['qd_w1_issue']:>11.3f} {c['qd_w1_time']:>10.3f} "
            f"{c['size_w1_log2']:>11.3f} {cf['size_w1_log2']:>12.3f}  {'yes' if ok else 'NO'}"
        )
    print("\n(blk reqs: MiB read by the original = 1 MiB requests; throughput over the active span)")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
