"""`trainio export --fio`: real fio replays the export of a recorded fio job onto a second
loop device, recorded too; the replay's block trace is the original's."""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from interop_helpers import analyze_json, block_requests, fio_job, ok

from trainio_testlib import loop_device, majmin, require_root, trainio


@pytest.mark.root
@pytest.mark.slow
def test_fio_replays_the_export_with_the_same_requests_and_throughput(tmp_path: Path) -> None:
    require_root("loop devices, BPF")
    with loop_device(256) as original_dev, loop_device(256) as replay_dev:
        ok(
            "record",
            "-q",
            "--layers",
            "block",
            "--dev",
            original_dev,
            "-o",
            tmp_path / "original",
            "--",
            *fio_job(original_dev),
        )
        out = ok("export", "--fio", tmp_path / "original", "-o", tmp_path / "fio")
        logs = sorted((tmp_path / "fio").glob("*.iolog"))
        assert len(logs) == 1, out  # one fio process issued every request
        lines = logs[0].read_text().splitlines()
        assert lines[0] == "fio version 3 iolog"
        ok(
            "record",
            "-q",
            "--layers",
            "block",
            "--dev",
            replay_dev,
            "-o",
            tmp_path / "replay",
            "--",
            "fio",
            f"--replay_redirect={replay_dev}",
            "--output-format=terse",
            "replay.fio",
            cwd=tmp_path / "fio",
        )

        a_mm, b_mm = majmin(original_dev), majmin(replay_dev)
        a, b = block_requests(tmp_path / "original", a_mm), block_requests(tmp_path / "replay", b_mm)
        # exactly the same requests: count, bytes, sizes, and where they went
        assert b.height == a.height == 640
        assert collections.Counter(zip(b["op"], b["offset"], b["bytes"], strict=True)) == collections.Counter(
            zip(a["op"], a["offset"], a["bytes"], strict=True)
        )
        ra, rb = analyze_json(tmp_path / "original", "--dev", a_mm), analyze_json(tmp_path / "replay", "--dev", b_mm)
        for key in ("reads", "writes", "bytes_read", "bytes_written", "size_counts"):
            assert rb[key] == ra[key], key
        # the recorded timing: throughput from first issue to last completion within 5 %
        ratio = rb["throughput_active_mib_s"] / ra["throughput_active_mib_s"]
        print(
            f"\nfio replay of the export: {a.height} requests, throughput original "
            f"{ra['throughput_active_mib_s']:.2f} MiB/s over {ra['active_s']:.3f} s, replay "
            f"{rb['throughput_active_mib_s']:.2f} MiB/s over {rb['active_s']:.3f} s: x{ratio:.3f}; "
            f"QD mean per issue {ra['qd_mean_issue']:.2f} / {rb['qd_mean_issue']:.2f}"
        )
        assert ratio == pytest.approx(1.0, abs=0.05)


def test_export_refuses_bad_input_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    not_a_trace = tmp_path / "notes.txt"
    not_a_trace.write_text("hello\n")
    p = trainio("export", "--fio", not_a_trace, "-o", tmp_path / "out")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert str(not_a_trace) in p.stderr
    assert not (tmp_path / "out").exists()
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep").write_text("x")
    from trainio_analysis.trace import write_trace

    write_trace(
        tmp_path / "t",
        [
            {
                "layer": "block",
                "op": "read",
                "issue_ns": 0,
                "complete_ns": 10,
                "dev": "7:0",
                "offset": 0,
                "bytes": 4096,
                "queue_depth": 1,
                "pid": 1,
            }
        ],
    )
    p = trainio("export", "--fio", tmp_path / "t", "-o", busy)
    assert p.returncode == 2 and "not empty" in p.stderr and str(busy) in p.stderr
    assert sorted(x.name for x in busy.iterdir()) == ["keep"]
    p = trainio("export", "--fio", tmp_path / "t", "-o", tmp_path / "f", "--layer", "file")
    assert p.returncode == 2 and "no file-layer requests" in p.stderr
    assert not (tmp_path / "f").exists()


def test_iolog_timing_is_microseconds_from_the_first_request(tmp_path: Path) -> None:
    from trainio_analysis.trace import write_trace

    rows = [
        {
            "layer": "block",
            "op": op,
            "issue_ns": t,
            "complete_ns": t + 50_000,
            "dev": "7:0",
            "offset": off,
            "bytes": n,
            "queue_depth": 1,
            "pid": pid,
            "comm": "job",
        }
        for op, t, off, n, pid in [
            ("read", 5_000_000_000, 4096, 4096, 10),
            ("write", 5_000_250_700, 0, 8192, 10),
            ("read", 5_001_000_000, 1 << 20, 65536, 11),
        ]
    ]
    rows.append(
        {
            "layer": "block",
            "op": "flush",
            "issue_ns": 5_002_000_000,
            "complete_ns": 5_002_000_100,
            "dev": "7:0",
            "bytes": 0,
            "queue_depth": 1,
            "pid": 10,
            "comm": "job",
        }
    )
    write_trace(tmp_path / "t", rows, {"devices": [{"dev": "7:0", "name": "loop0"}]})
    ok("export", "--fio", tmp_path / "t", "-o", tmp_path / "x")
    log10 = (tmp_path / "x" / "pid-10-job.iolog").read_text().splitlines()
    log11 = (tmp_path / "x" / "pid-11-job.iolog").read_text().splitlines()
    assert log10[:3] == ["fio version 3 iolog", "1 /dev/loop0 add", "1 /dev/loop0 open"]
    assert log10[3:6] == ["1 /dev/loop0 read 4096 4096", "251 /dev/loop0 write 0 8192", "2001 /dev/loop0 sync 0 0"]
    # the second process counts from the same origin
    assert log11[3] == "1001 /dev/loop0 read 1048576 65536"
    job = (tmp_path / "x" / "replay.fio").read_text()
    assert "read_iolog=pid-10-job.iolog" in job and "read_iolog=pid-11-job.iolog" in job
    assert sorted(p.name for p in (tmp_path / "x").iterdir()) == ["pid-10-job.iolog", "pid-11-job.iolog", "replay.fio"]


def test_file_layer_export_replays_the_reads_under_a_directory_with_real_fio(tmp_path: Path) -> None:
    from trainio_analysis.trace import write_trace

    data = tmp_path / "data"
    data.mkdir()
    for name in ("a", "b"):
        (data / name).write_bytes(os.urandom(1 << 20))
    rows = [
        {
            "layer": "file",
            "op": op,
            "issue_ns": 1_000_000 * i,
            "complete_ns": 1_000_000 * i + 5000,
            "offset": off,
            "bytes": n,
            "bytes_requested": asked,
            "queue_depth": 1,
            "pid": 5,
            "comm": "reader",
            "file": f,
        }
        for i, (op, f, off, n, asked) in enumerate(
            [
                ("read", str(data / "a"), 0, 65536, 65536),
                ("read", str(data / "b"), 4096, 131072, 131072),
                ("write", str(data / "a"), 0, 4096, 4096),  # would overwrite the dataset
                ("read", "/etc/hostname", 0, 10, 4096),  # not under the directory
                ("read", str(data / "a"), 1 << 20, 0, 65536),  # at the end: nothing read
                ("read", str(data / "a"), 65536, 65536, 65536),
            ]
        )
    ]
    write_trace(tmp_path / "t", rows)
    ok("export", "--fio", tmp_path / "t", "--layer", "file", "--under", data, "-o", tmp_path / "x")
    lines = (tmp_path / "x" / "pid-5-reader.iolog").read_text().splitlines()
    assert [line.split(" ", 1)[1] for line in lines[5:8]] == [
        f"{data / 'a'} read 0 65536",
        f"{data / 'b'} read 4096 131072",
        f"{data / 'a'} read 65536 65536",
    ]
    assert len(lines) == 8  # header, 2 add, 2 open, 3 reads
    # what fio says it queued (its I/O debug log) is the exported reads
    res = subprocess.run(
        ["fio", "--debug=io", "replay.fio"], cwd=tmp_path / "x", capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    queued = [
        (m["file"], "read", str(int(m["off"], 16)), str(int(m["len"], 16)))
        for m in re.finditer(
            r"queue: io_u \S+ off=0x(?P<off>[0-9a-f]+),len=0x(?P<len>[0-9a-f]+),"
            r"ddir=0,file=(?P<file>\S+)",
            res.stdout,
        )
    ]
    assert queued == [tuple(line.split()[1:]) for line in lines[5:]]


def test_by_gpu_puts_a_rank_and_its_workers_in_one_iolog(tmp_path: Path) -> None:
    """Two ranks (pids 4100 and 4200) under a launcher (4000); 4100 has a DataLoader worker
    (4101, renamed pt_data_worker). The job model makes them two GPUs; the block requests
    of a kworker (pid 99) belong to none."""
    from trainio_analysis.trace import write_trace

    def proc(op, t, pid, ppid, comm):
        return {
            "layer": "proc",
            "op": op,
            "issue_ns": t,
            "complete_ns": t,
            "bytes": 0,
            "queue_depth": 0,
            "pid": pid,
            "ppid": ppid,
            "comm": comm,
        }

    rows = [
        proc("start", 0, 4000, 1, "launcher"),
        proc("fork", 10, 4100, 4000, "python"),
        proc("fork", 20, 4200, 4000, "python"),
        proc("fork", 30, 4101, 4100, "python"),
        proc("comm", 40, 4101, 4100, "pt_data_worker"),
    ]
    t = 1_000_000
    for step in range(6):
        for pid, comm in ((4101, "pt_data_worker"), (4100, "python"), (4200, "python")):
            off = (step * 3 + pid % 7) << 20
            rows.append(
                {
                    "layer": "file",
                    "op": "read",
                    "issue_ns": t,
                    "complete_ns": t + 400_000,
                    "bytes": 1 << 20,
                    "offset": off,
                    "queue_depth": 1,
                    "pid": pid,
                    "comm": comm,
                    "file": f"/d/{pid}",
                    "fd": 3,
                    "dev": "7:0",
                }
            )
            rows.append(
                {
                    "layer": "block",
                    "op": "read",
                    "issue_ns": t + 1000,
                    "complete_ns": t + 300_000,
                    "bytes": 1 << 20,
                    "offset": off + (64 << 20),
                    "queue_depth": 1,
                    "pid": pid,
                    "comm": comm,
                    "dev": "7:0",
                }
            )
            t += 500_000
        rows.append(
            {
                "layer": "block",
                "op": "write",
                "issue_ns": t,
                "complete_ns": t + 50_000,
                "bytes": 4096,
                "offset": 8192,
                "queue_depth": 1,
                "pid": 99,
                "comm": "kworker/0:1",
                "dev": "7:0",
            }
        )
        t += 50_000_000
    write_trace(tmp_path / "t", rows, {"devices": [{"dev": "7:0", "name": "loop0"}]})
    summary = json.loads(ok("export", "--fio", tmp_path / "t", "--by", "gpu", "-o", tmp_path / "x", "--json"))
    by_pids = {tuple(job["pids"]): job for job in summary["jobs"]}
    assert sorted(by_pids) == [(4100, 4101), (4200,)]
    assert summary["left_out_requests"] == 6  # the kworker's writes
    for pids, job in by_pids.items():
        log = (tmp_path / "x" / job["iolog"]).read_text().splitlines()
        offsets = [int(line.split()[3]) for line in log if " read " in line]
        want = sorted(((s * 3 + p % 7) << 20) + (64 << 20) for s in range(6) for p in pids)
        assert sorted(offsets) == want
        assert job["requests"] == 6 * len(pids)
