"""make bench-file: what the file layer costs a process that reads with syscalls.

A training job's data loader reads its files with read()/pread() (PyTorch, DLIO's
readers), and every such syscall of a traced process runs the file layer's entry and exit
probes. The bench isolates that cost: fio's psync engine reads 4 KiB at random offsets
from a page-cached file in /dev/shm (one pread64 per I/O, no device in the way, so the
syscall itself is as cheap as it gets and the probes' share is at its largest), untraced
and under `trainio record` (default layers) in ABBA-ordered pairs (BENCH_FILE_PAIRS of
BENCH_FILE_RUNTIME s; BENCH_RECORDER=PATH measures another build's trainio-record).
Then the same workload under a bpftrace program that prints each
pread64 (the Darshan/dftracer-style per-call record, done with classic syscall
tracepoints), and one that only counts them.

Per row: IOPS, the ratio with a 95% interval (bootstrap over pairs), the time added to each
read (1/traced - 1/untraced), the entry and exit probes' kernel time per syscall (sampled
BPF statistics), the recorder's CPU per row, bytes per row on disk and lost events. No
target: the issue sets none for the file layer; the numbers are the result.

Then the same for a process that reads through mmap (numpy over a page-cached file on ext4
over a loop device, every page touched, mapped again for each pass): page faults per
second (its own minor-fault count) untraced and under `trainio record --layers file`,
paired the same way, with the fault probes' kernel time per run. Each fault is a
fault-around of 16 pages (a `map_pages` row); a fault on a page not cached would add a
`fault` row, but here every page is cached, so the cost is the one a job pays once its
data is in the page cache. BENCH_FILE_ONLY=mmap runs only this part.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import polars as pl
from bench_tracer import bpftraced_run, fio_result, interval

from trainio_analysis.trace import read_metadata, scan_trace
from trainio_testlib import TRAINIO, mounted_loop_fs

PAIRS = int(os.environ.get("BENCH_FILE_PAIRS", "6"))
RUNTIME = float(os.environ.get("BENCH_FILE_RUNTIME", "5"))
FILE_MIB = 256
# Another build's trainio-record to measure instead of ./bin/trainio record (A/B).
RECORD = [os.environ["BENCH_RECORDER"]] if os.environ.get("BENCH_RECORDER") else [str(TRAINIO), "record"]

BPFTRACE_PRINT = r"""
tracepoint:syscalls:sys_enter_pread64 /comm == "fio"/ {
  @fd[tid] = args->fd; @off[tid] = args->pos; @t[tid] = nsecs;
}
tracepoint:syscalls:sys_exit_pread64 /@t[tid]/ {
  printf("%d %d %lld %lld %llu\n", pid, @fd[tid], @off[tid], args->ret, nsecs - @t[tid]);
  delete(@fd[tid]); delete(@off[tid]); delete(@t[tid]);
}
"""

BPFTRACE_COUNT = r"""
tracepoint:syscalls:sys_enter_pread64 /comm == "fio"/ { @enter = count(); }
tracepoint:syscalls:sys_exit_pread64 /comm == "fio"/ { @exit = count(); }
"""


def fio_cmd(path: Path) -> list[str]:
    return [
        "fio",
        "--name=file",
        f"--filename={path}",
        "--ioengine=psync",
        "--rw=randread",
        "--bs=4k",
        f"--size={FILE_MIB}M",
        "--invalidate=0",
        "--norandommap",
        "--randrepeat=0",
        "--time_based",
        f"--runtime={RUNTIME:g}",
        "--output-format=json",
    ]


def untraced(path: Path) -> float:
    out = subprocess.run(fio_cmd(path), capture_output=True, text=True, check=True)
    return fio_result(out.stdout)[0]


def traced(path: Path, work: Path) -> dict:
    trace = work / f"trace-{time.monotonic_ns()}"
    out = subprocess.run(
        [*RECORD, "-q", "-o", str(trace), "--", *fio_cmd(path)], capture_output=True, text=True, check=True
    )
    iops = fio_result(out.stdout)[0]
    meta = read_metadata(trace)
    reads = (
        scan_trace(trace)
        .filter((pl.col("layer") == "file") & (pl.col("op") == "read") & (pl.col("file") == str(path)))
        .select(pl.len())
        .collect()
        .item()
    )
    rows = sum(meta["events"].values())
    size = sum(p.stat().st_size for p in trace.glob("seg-*.parquet"))
    stats = meta["bpf_stats"]
    shutil.rmtree(trace)
    # Sampled: the runs timed of each program, so per-run times add up per syscall.
    bpf = sum(v["ns_per_run"] for k, v in stats.items() if k in ("tio_pread_enter", "tio_pread_exit"))
    cpu = meta["recorder_cpu_ns"]
    return {
        "iops": iops,
        "reads": reads,
        "rows": rows,
        "lost": sum(meta["lost_events"].values()),
        "bytes_per_row": size / max(rows, 1),
        "bpf_ns": bpf,
        "user_ns": (cpu["drain"] + cpu["encoder"]) / max(rows, 1),
    }


# Touches every page of argv[1] through a fresh read-only mapping per pass for argv[2]
# seconds; prints its minor faults per second and pages per second.
MAPPED_READER = r"""
import mmap, os, resource, sys, time
import numpy as np
path, runtime = sys.argv[1], float(sys.argv[2])
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
t0 = time.monotonic()
pages = 0
while time.monotonic() - t0 < runtime:
    m = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    np.frombuffer(m, np.uint8)[::4096].sum()
    m.close()
    pages += size // 4096
elapsed = time.monotonic() - t0
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
print(faults / elapsed, pages / elapsed)
"""


def mapped_untraced(path: Path) -> tuple[float, float]:
    out = subprocess.run(
        [sys.executable, "-c", MAPPED_READER, str(path), f"{RUNTIME:g}"], capture_output=True, text=True, check=True
    )
    faults, pages = map(float, out.stdout.split())
    return faults, pages


def mapped_traced(path: Path, work: Path) -> dict:
    trace = work / f"trace-{time.monotonic_ns()}"
    cmd = [sys.executable, "-c", MAPPED_READER, str(path), f"{RUNTIME:g}"]
    out = subprocess.run(
        [*RECORD, "-q", "--layers", "file", "-o", str(trace), "--", *cmd], capture_output=True, text=True, check=True
    )
    faults, _ = map(float, out.stdout.split())
    meta = read_metadata(trace)
    mapped = (
        scan_trace(trace)
        .filter((pl.col("file") == str(path)) & pl.col("op").is_in(["fault", "map_pages"]))
        .select(pl.len())
        .collect()
        .item()
    )
    stats = meta["bpf_stats"]
    shutil.rmtree(trace)
    return {
        "faults": faults,
        "rows": mapped,
        "lost": sum(meta["lost_events"].values()),
        "bpf_ns": stats.get("tio_filemap_map_pages", {}).get("ns_per_run", float("nan")),
    }


def mapped_reads(work: Path) -> None:
    with mounted_loop_fs(FILE_MIB + 64, quiet=True) as (_, _, mnt):
        data = mnt / "data.bin"
        with open(data, "wb") as f:
            f.writelines(os.urandom(1 << 20) for _ in range(FILE_MIB))
        mapped_untraced(data)  # the page cache warm, the file's pages all read once
        print(f"{data}: {FILE_MIB} MiB on ext4, in page cache; {PAIRS} pairs of {RUNTIME:g} s, mmap + touch every page")
        base: list[float] = []
        runs: list[dict] = []
        for i in range(PAIRS):
            if i % 2 == 0:
                base.append(mapped_untraced(data)[0])
                runs.append(mapped_traced(data, work))
            else:
                runs.append(mapped_traced(data, work))
                base.append(mapped_untraced(data)[0])
            print(
                f"  pair {i + 1}: untraced {base[-1]:,.0f} faults/s, traced {runs[-1]['faults']:,.0f} faults/s "
                f"({runs[-1]['faults'] / base[-1]:.1%}), {runs[-1]['rows']:,} fault/map_pages rows",
                flush=True,
            )
    b = statistics.mean(base)
    t = statistics.mean(r["faults"] for r in runs)
    lo, hi = interval(base, [r["faults"] for r in runs])
    print()
    print(
        f"{'mmap read, page cache':<30} {'faults/s':>10} {'ratio':>7} {'95% interval':>13} {'ns added/fault':>15} "
        f"{'BPF ns/fault':>13} {'lost':>5}"
    )
    print(f"{'untraced':<30} {b:>10,.0f}")
    print(
        f"{'trainio record --layers file':<30} {t:>10,.0f} {t / b:>6.1%} {lo:>6.1%}-{hi:<6.1%} "
        f"{1e9 / t - 1e9 / b:>15,.0f} {statistics.mean(r['bpf_ns'] for r in runs):>13,.0f} "
        f"{sum(r['lost'] for r in runs):>5}"
    )


def main() -> int:
    if os.geteuid() != 0:
        print("bench-file needs root (BPF)", file=sys.stderr)
        return 2
    if os.environ.get("BENCH_FILE_ONLY") == "mmap":
        with tempfile.TemporaryDirectory(prefix="trainio-bench-") as tmp:
            mapped_reads(Path(tmp))
        return 0
    with (
        tempfile.TemporaryDirectory(prefix="trainio-bench-file-", dir="/dev/shm") as shm,
        tempfile.TemporaryDirectory(prefix="trainio-bench-") as tmp,
    ):
        data = Path(shm) / "data.bin"
        with open(data, "wb") as f:
            f.writelines(os.urandom(1 << 20) for _ in range(FILE_MIB))
        work = Path(tmp)
        print(
            f"{data}: {FILE_MIB} MiB in page cache; {PAIRS} pairs of {RUNTIME:g} s, 4 KiB random pread64 (fio psync)",
            flush=True,
        )
        base: list[float] = []
        runs: list[dict] = []
        for i in range(PAIRS):
            if i % 2 == 0:
                base.append(untraced(data))
                runs.append(traced(data, work))
            else:
                runs.append(traced(data, work))
                base.append(untraced(data))
            print(
                f"  pair {i + 1}: untraced {base[-1]:,.0f} IOPS, traced {runs[-1]['iops']:,.0f} IOPS "
                f"({runs[-1]['iops'] / base[-1]:.1%}), {runs[-1]['reads']:,} read rows",
                flush=True,
            )
        bt_iops, bt_lines = bpftraced_run(BPFTRACE_PRINT, [], fio_cmd(data))
        print(f"  bpftrace per-call printf: {bt_iops:,.0f} IOPS, {bt_lines:,} lines", flush=True)
        count_iops, _ = bpftraced_run(BPFTRACE_COUNT, [], fio_cmd(data))
        print(f"  bpftrace counting only: {count_iops:,.0f} IOPS", flush=True)

    b = statistics.mean(base)
    t = statistics.mean(r["iops"] for r in runs)
    lo, hi = interval(base, [r["iops"] for r in runs])
    # Every traced read went through the probes: a missing row is a lost event.
    complete = all(r["reads"] >= 0.99 * r["iops"] * RUNTIME for r in runs)

    def added(iops: float) -> float:
        return 1e9 / iops - 1e9 / b

    print()
    print(
        f"{'4 KiB pread64, page cache':<30} {'IOPS':>10} {'ratio':>7} {'95% interval':>13} "
        f"{'ns added/read':>14} {'BPF ns/read':>12} {'user ns/row':>12} {'B/row':>6} {'lost':>5}"
    )
    print(f"{'untraced':<30} {b:>10,.0f}")
    print(
        f"{'trainio record':<30} {t:>10,.0f} {t / b:>6.1%} {lo:>6.1%}-{hi:<6.1%} {added(t):>14,.0f} "
        f"{statistics.mean(r['bpf_ns'] for r in runs):>12,.0f} "
        f"{statistics.mean(r['user_ns'] for r in runs):>12,.0f} "
        f"{statistics.mean(r['bytes_per_row'] for r in runs):>6.2f} {sum(r['lost'] for r in runs):>5}"
    )
    print(f"{'bpftrace, printf per call':<30} {bt_iops:>10,.0f} {bt_iops / b:>6.1%} {'':>13} {added(bt_iops):>14,.0f}")
    print(
        f"{'bpftrace, count() only':<30} {count_iops:>10,.0f} {count_iops / b:>6.1%} {'':>13} "
        f"{added(count_iops):>14,.0f}"
    )
    print("(every traced read recorded: " + ("yes)" if complete else "NO: rows missing)"))
    print()
    with tempfile.TemporaryDirectory(prefix="trainio-bench-") as tmp:
        mapped_reads(Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
