"""Benchmark the replayer on this machine.

1. Scale: 288 simulated GPUs in one rank (tiny 4 KiB samples on tmpfs, batch 4,
   read_threads 4, 0.05 s compute, barrier on): CPU time per simulated GPU-step and sleep
   overshoot p50/p99, with and without --realtime (SCHED_FIFO event loop; the default
   run shares the CPUs with whatever else the host runs). Target: overshoot p99 < 1 ms.
2. Against fio: the same pattern, 16 readers each with one 1 MiB O_DIRECT read in flight,
   on ext4 on a loop device over a file in /dev/shm. The replayer reads 1 MiB files
   (open, read, close per sample, as a data loader does); fio reads 1 MiB blocks of one
   file with io_uring at iodepth 16, with and without --fixedbufs (the replayer
   registers its buffers too). Runs alternate, medians of three; the faster fio is the
   reference. Target: the replayer reaches >= 95 % of fio's throughput.

3. Two hosts: the scale run of part 1 with its GPUs over 2 hosts × 1 rank (network
   namespace hosts started over ssh by mpirun, tests/hosts/testbed.py), per host: CPU per
   GPU-step and overshoot p50/p99, beside part 1's one-host figures. The hosts share this
   machine's 2 CPUs, so the two ranks compete for them as one rank with all GPUs does not.

Parts 2 and 3 need root (losetup, mount, namespaces); they are skipped otherwise.

    .venv/bin/python tests/bench/bench_replay.py [--gpus 288] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRAINIO = ROOT / "bin" / "trainio"
sys.path.insert(0, str(ROOT / "tests"))
from trainio_testlib import mounted_loop_fs  # noqa: E402

MIB = 1 << 20
TARGET_OVERSHOOT_P99_US = 1000
TARGET_FIO_RATIO = 0.95


def workload(path: Path, *, files: int, record: int, batch: int, threads: int, compute: float) -> Path:
    path.write_text(
        f"""model:
  name: bench
dataset:
  num_files_train: {files}
  record_length_bytes: {record}
reader:
  batch_size: {batch}
  read_threads: {threads}
train:
  epochs: 1
  computation_time: {compute}
"""
    )
    return path


def trainio(*args) -> subprocess.CompletedProcess:
    return subprocess.run([str(TRAINIO), *map(str, args)], check=True, capture_output=True, text=True)


def replay_json(*args) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        trainio("replay", *args, "--quiet", "--json", out.name)
        return json.loads(Path(out.name).read_text())


def bench_scale(gpus: int, steps: int) -> bool:
    work = Path(tempfile.mkdtemp(prefix="trainio-bench-replay-", dir="/dev/shm"))
    ok = True
    try:
        wl = workload(work / "tiny.yaml", files=1, record=4096, batch=4, threads=4, compute=0.05)
        trainio("datagen", "--workload", wl, "--data-dir", work / "data", "--gpus", gpus, "--steps", steps)
        print(
            f"scale: {gpus} simulated GPUs in one rank, 4 KiB samples on tmpfs, batch 4, "
            f"read_threads 4, 0.05 s compute, {steps} steps, barrier on"
        )
        modes = [("default", [])]
        if os.geteuid() == 0:
            modes.append(("--realtime", ["--realtime"]))
        for name, extra in modes:
            r = replay_json("--workload", wl, "--data-dir", work / "data", "--gpus", gpus, "--steps", steps, *extra)
            p99 = r["sleep_overshoot_us_p99"]
            verdict = "ok" if p99 < TARGET_OVERSHOOT_P99_US else "ABOVE TARGET"
            print(
                f"  {name:<11} AU {r['au_percent']:6.2f}%  CPU {r['cpu_us_per_gpu_step']:6.1f} µs per GPU-step  "
                f"overshoot p50 {r['sleep_overshoot_us_p50']} µs p99 {p99} µs ({verdict}, target < 1 ms)  "
                f"wall {r['wall_s']:.2f} s"
            )
            if extra:
                ok = ok and p99 < TARGET_OVERSHOOT_P99_US
        load = os.getloadavg()[0]
        print(f"  host load average during the bench: {load:.2f} on {os.cpu_count()} CPUs")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return ok


def bench_hosts(gpus: int, steps: int) -> None:
    if os.geteuid() != 0:
        print("two hosts: skipped (needs root for the namespace hosts)")
        return
    sys.path.insert(0, str(ROOT / "tests" / "hosts"))
    from testbed import TestBed

    # The data on tmpfs as in part 1: /dev/shm is the same file system on every namespace host.
    with (
        tempfile.TemporaryDirectory(prefix="trainio-bench-hosts-", dir="/dev/shm") as tmp,
        TestBed(Path(tmp) / "bed", 2, shared_mb=64) as bed,
    ):
        wl = workload(Path(tmp) / "tiny.yaml", files=1, record=4096, batch=4, threads=4, compute=0.05)
        data = Path(tmp) / "data"
        trainio("datagen", "--workload", wl, "--data-dir", data, "--gpus", gpus, "--steps", steps)
        out = Path(tmp) / "r.json"
        cmd = bed.mpirun(
            {"h1": 1, "h2": 1},
            [
                TRAINIO,
                "replay",
                "--quiet",
                "--workload",
                wl,
                "--data-dir",
                data,
                "--gpus",
                gpus,
                "--steps",
                steps,
                "--json",
                out,
            ],
        )
        subprocess.run(cmd, check=True, capture_output=True, text=True, env=bed.mpi_env())
        r = json.loads(out.read_text())
        print(f"two hosts: the same {gpus} GPUs over 2 hosts × 1 rank (namespace hosts, ranks started over ssh)")
        print(
            f"  job         AU {r['au_percent']:6.2f}%  CPU {r['cpu_us_per_gpu_step']:6.1f} µs per GPU-step  "
            f"overshoot p50 {r['sleep_overshoot_us_p50']} µs p99 {r['sleep_overshoot_us_p99']} µs  "
            f"barrier {r['barrier_wait_s_mean']:.2f} s per GPU  wall {r['wall_s']:.2f} s"
        )
        for h in r["per_host"]:
            print(
                f"  host {h['host']:<6} AU {h['au_percent']:6.2f}%  "
                f"CPU {h['cpu_us_per_gpu_step']:6.1f} µs per GPU-step  "
                f"overshoot p50 {h['sleep_overshoot_us_p50']} µs p99 {h['sleep_overshoot_us_p99']} µs"
            )


def sh(*cmd) -> str:
    return subprocess.run(list(map(str, cmd)), check=True, capture_output=True, text=True).stdout.strip()


def fio_mib_s(path: Path, size_mib: int, seconds: int, *extra: str) -> float:
    out = sh(
        "fio",
        "--name=replay-vs-fio",
        f"--filename={path}",
        f"--size={size_mib}M",
        "--rw=randread",
        "--bs=1M",
        "--direct=1",
        "--ioengine=io_uring",
        "--iodepth=16",
        f"--runtime={seconds}",
        "--time_based",
        "--output-format=json",
        *extra,
    )
    job = json.loads(out)["jobs"][0]["read"]
    return job["bw_bytes"] / MIB


def bench_fio(rounds: int) -> bool:
    if os.geteuid() != 0:
        print("vs fio: skipped (needs root for the loop device)")
        return True
    if not shutil.which("fio"):
        print("vs fio: skipped (fio is not installed: scripts/install-deps.sh)")
        return True
    files = 768
    with tempfile.TemporaryDirectory(prefix="trainio-bench-") as tmp, mounted_loop_fs(2048) as (dev, _, mnt):
        work = Path(tmp)
        wl = workload(work / "bench16.yaml", files=files, record=MIB, batch=1, threads=16, compute=0)
        trainio("datagen", "--workload", wl, "--data-dir", mnt / "data")
        fio_file = mnt / "fio.dat"
        sh(
            "fio",
            "--name=layout",
            f"--filename={fio_file}",
            f"--size={files}M",
            "--rw=write",
            "--bs=1M",
            "--direct=1",
            "--output-format=json",
        )
        print(f"vs fio: 16 readers × 1 MiB O_DIRECT reads, ext4 on {dev} (loop over /dev/shm, direct-io)")
        # The replayer registers its buffers with io_uring; fio does so with --fixedbufs.
        # Both fio variants run and the faster one is the reference.
        rep, fio, fio_fixed = [], [], []
        for _ in range(rounds):
            r = replay_json("--workload", wl, "--data-dir", mnt / "data", "--odirect", "--no-barrier", "--epochs", 6)
            rep.append(r["throughput_mib_s"])
            fio.append(fio_mib_s(fio_file, files, 4))
            fio_fixed.append(fio_mib_s(fio_file, files, 4, "--fixedbufs"))
        r_med = statistics.median(rep)
        f_med = max(statistics.median(fio), statistics.median(fio_fixed))
        ratio = r_med / f_med
        verdict = "ok" if ratio >= TARGET_FIO_RATIO else "BELOW TARGET"
        runs = lambda xs: ", ".join(f"{x:.0f}" for x in xs)  # noqa: E731
        print(f"  replayer          {r_med:8.1f} MiB/s (runs {runs(rep)})")
        print(f"  fio               {statistics.median(fio):8.1f} MiB/s (runs {runs(fio)})")
        print(f"  fio --fixedbufs   {statistics.median(fio_fixed):8.1f} MiB/s (runs {runs(fio_fixed)})")
        print(f"  ratio             {100 * ratio:6.1f}% of the faster fio ({verdict}, target >= 95%)")
        return ratio >= TARGET_FIO_RATIO


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=288)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if not (ROOT / "target" / "release" / "trainio-replay").exists():
        print("bench_replay: target/release/trainio-replay is missing: run 'make'", file=sys.stderr)
        return 2
    ok = bench_scale(args.gpus, args.steps)
    bench_hosts(args.gpus, args.steps)
    ok = bench_fio(args.rounds) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
