"""make bench-soak: what a recorder that stays on costs over hours (issue #33).

fio reads at the block bench's rate (4 KiB random O_DIRECT reads, io_uring, iodepth 32,
on a loop device over /dev/shm: make bench-tracer's 4 KiB pattern) for SOAK_S seconds
(default 3600), recorded as a node service records: block layer, retention
(SOAK_SEGMENT_MB 8, SOAK_RETAIN_MB 64), live metrics on. Every SOAK_EVERY_S seconds
(default 60, at most a tenth of the run) it prints, over that interval: requests per
second (the device's own count, /sys/block/NAME/stat), the recorder's resident memory, its
CPU per event (user + system time of the whole process from /proc/PID/stat, over the
device's requests), the segments and MiB kept, what retention removed so far, and the lost
events (the metrics endpoint's trainio_lost_events_total). Memory and CPU per event
should stay flat while segments come and go. Needs root.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# trainio_testlib puts analysis/ on the path: it goes first.
from trainio_testlib import TRAINIO, loop_device

# isort: split
from trainio_analysis.trace import read_metadata

SOAK_S = float(os.environ.get("SOAK_S", "3600"))
EVERY_S = min(float(os.environ.get("SOAK_EVERY_S", "60")), max(SOAK_S / 10, 1.0))
SEGMENT_MB = int(os.environ.get("SOAK_SEGMENT_MB", "8"))
RETAIN_MB = int(os.environ.get("SOAK_RETAIN_MB", "64"))
TICK = os.sysconf("SC_CLK_TCK")


def reads_completed(name: str) -> int:
    return int(Path(f"/sys/block/{name}/stat").read_text().split()[0])


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def rss_mib(pid: int) -> float:
    m = re.search(r"^VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    return int(m.group(1)) / 1024 if m else float("nan")


def lost_events(url: str) -> int:
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return sum(int(float(v)) for v in re.findall(r"^trainio_lost_events_total\{[^}]*\} (\S+)$", text, re.M))


def kept(out: Path) -> tuple[int, float]:
    segs = []
    for f in out.glob("seg-*.parquet"):
        try:
            segs.append(f.stat().st_size)
        except FileNotFoundError:
            pass  # removed by retention meanwhile
    return len(segs), sum(segs) / (1 << 20)


def main() -> int:
    if os.geteuid() != 0:
        print("bench-soak needs root (BPF, loop devices)", file=sys.stderr)
        return 2
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"trainio-soak-{os.getpid()}"
    out = work / "trace"
    print(
        f"soak: {SOAK_S:.0f} s of 4 KiB randread io_uring QD32, --segment-mb {SEGMENT_MB} "
        f"--retain-mb {RETAIN_MB}, metrics on; every {EVERY_S:.0f} s"
    )
    with loop_device(1024) as dev:
        name = Path(dev).name
        rec = subprocess.Popen(
            [
                str(TRAINIO),
                "record",
                "-o",
                str(out),
                "--layers",
                "block",
                "--dev",
                dev,
                "--segment-mb",
                str(SEGMENT_MB),
                "--retain-mb",
                str(RETAIN_MB),
                "--metrics-addr",
                "127.0.0.1:0",
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        fio = None
        try:
            assert rec.stderr is not None
            url = None
            for line in rec.stderr:
                m = re.search(r"serving metrics at (http://\S+)", line)
                url = m.group(1) if m else url
                if line.startswith("trainio record: recording "):
                    break
            assert url, "the recorder announced no metrics address"
            # The recorder's own pid (bin/trainio execs it).
            pid = rec.pid
            fio = subprocess.Popen(
                [
                    "fio",
                    "--name=soak",
                    f"--filename={dev}",
                    "--direct=1",
                    "--ioengine=io_uring",
                    "--rw=randread",
                    "--bs=4k",
                    "--iodepth=32",
                    "--norandommap",
                    "--randrepeat=0",
                    "--time_based",
                    f"--runtime={SOAK_S}",
                ],
                stdout=subprocess.DEVNULL,
            )
            start = time.monotonic()
            last = (start, reads_completed(name), process_cpu_s(pid))
            first_rss = rss_mib(pid)
            print(f"{'t_s':>7} {'req/s':>9} {'RSS MiB':>8} {'CPU ns/ev':>10} {'segs':>5} {'kept MiB':>9} {'lost':>6}")
            rows = []
            while fio.poll() is None:
                time.sleep(max(0.0, last[0] + EVERY_S - time.monotonic()))
                now, reqs, cpu = time.monotonic(), reads_completed(name), process_cpu_s(pid)
                events = reqs - last[1]
                per_event = (cpu - last[2]) * 1e9 / events if events else float("nan")
                segs, mib = kept(out)
                row = (now - start, events / (now - last[0]), rss_mib(pid), per_event, segs, mib, lost_events(url))
                # An interval in which fio ended is printed (marked *) but not summarized:
                # the recorder's idle polling over few events is no per-event cost.
                whole = fio.poll() is None
                if whole:
                    rows.append(row)
                print(
                    f"{row[0]:7.0f} {row[1]:9.0f} {row[2]:8.1f} {row[3]:10.0f} {row[4]:5d} {row[5]:9.1f} {row[6]:6d}"
                    + ("" if whole else " *")
                )
                last = (now, reqs, cpu)
            rec.send_signal(signal.SIGINT)
            _, err = rec.communicate(timeout=120)
        finally:
            for p in (fio, rec):
                if p is not None and p.poll() is None:
                    p.kill()
                    p.wait()
        r = read_metadata(out).get("retention", {})
        full = [x for x in rows if x[0] > EVERY_S * 1.5] or rows
        cpu = [x[3] for x in full]
        print(
            f"summary: RSS {first_rss:.1f} MiB at the start, {rows[0][2]:.1f} after {rows[0][0]:.0f} s, "
            f"{rows[-1][2]:.1f} at the end (max {max(x[2] for x in rows):.1f}); CPU per event "
            f"{min(cpu):.0f}-{max(cpu):.0f} ns (mean {sum(cpu) / len(cpu):.0f}); segments kept "
            f"{min(x[4] for x in full)}-{max(x[4] for x in full)}, removed {r.get('dropped_segments', 0)} "
            f"({r.get('dropped_rows', 0)} rows); lost events {rows[-1][6]}"
        )
        print("recorder summary:\n" + "\n".join("  " + ln for ln in err.strip().splitlines()))
    subprocess.run(["rm", "-rf", str(work)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
