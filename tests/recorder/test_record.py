"""`trainio record` against real kernel events: loop devices over /dev/shm, real BPF."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

# trainio_testlib puts analysis/ on the path: it goes first.
from trainio_testlib import TRAINIO, block_stat, loop_device, majmin, run, start_recording, trainio

# isort: split
from trainio_analysis.trace import SCHEMA_MINOR, read_metadata, scan_trace

MiB = 1 << 20

pytestmark = [pytest.mark.root]


def rows(trace: Path, **eq) -> pl.DataFrame:
    lf = scan_trace(trace)
    for col, val in eq.items():
        lf = lf.filter(pl.col(col) == val)
    return lf.collect()


def _missed_completions(trace: Path) -> int:
    """Block completions the recorder counted as not seen (docs/design/recorder.md)."""
    lost = read_metadata(trace)["lost_events"]
    return sum(
        n for k, n in lost.items() if k.startswith("block_rq_complete:") and k != "block_rq_complete:ringbuf_full"
    )


def _assert_nothing_lost_but_missed_completions(err: str) -> None:
    """'lost events: 0', or only block completions the kernel did not hand to BPF, counted."""
    if "lost events: 0" in err:
        return
    listed = re.findall(r"^    (\S+): (\d+)$", err, flags=re.M)
    assert listed and all(
        k.startswith("block_rq_complete:") and k != "block_rq_complete:ringbuf_full" for k, _ in listed
    ), err


def fio(dev: str, *extra: str, runtime: float | None = None, size: str = "128M") -> list[str]:
    cmd = [
        "fio",
        "--name=t",
        f"--filename={dev}",
        "--direct=1",
        "--rw=randread",
        "--bs=4k",
        f"--size={size}",
        "--randrepeat=1",
        "--norandommap",
        "--output-format=json",
        *extra,
    ]
    if runtime:
        cmd += ["--time_based", f"--runtime={runtime}"]
    return cmd


def record_until_recording(*args: object) -> subprocess.Popen[str]:
    """`trainio record ARGS`, returned once it says "recording" (its probes are attached and
    its target traced): the moment a test may let the traced work begin."""
    p = subprocess.Popen([str(TRAINIO), "record", *map(str, args)], stderr=subprocess.PIPE, text=True)
    assert p.stderr is not None
    for line in p.stderr:
        if line.startswith("trainio record: recording "):
            return p
    p.wait(timeout=30)
    raise AssertionError(f"recorder exited {p.returncode} before recording")


def finish(p: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    """The recorder's exit status and the rest of its stderr."""
    _, err = p.communicate(timeout=timeout)
    return p.returncode, err


def test_dd_direct_read_is_recorded_exactly(tmp_path: Path, loop_dev: str) -> None:
    out = tmp_path / "trace"
    res = trainio(
        "record", "-o", out, "--", "dd", f"if={loop_dev}", "of=/dev/null", "bs=1M", "count=64", "iflag=direct"
    )
    assert res.returncode == 0, res.stderr
    dev = majmin(loop_dev)

    block = rows(out, layer="block", dev=dev, op="read").sort("offset")
    assert block["bytes"].sum() == 64 * MiB
    # Offsets cover [0, 64 MiB) exactly once: each request starts where the last ended.
    starts = block["offset"].to_list()
    ends = (block["offset"] + block["bytes"]).to_list()
    assert starts[0] == 0 and ends[-1] == 64 * MiB
    assert starts[1:] == ends[:-1]
    assert ((block["complete_ns"] - block["issue_ns"]) > 0).all()
    assert (block["queue_depth"] >= 1).all()

    reads = rows(out, layer="file", op="read", comm="dd", file=loop_dev).sort("issue_ns")
    assert reads.height == 64
    assert (reads["bytes"] == MiB).all() and (reads["bytes_requested"] == MiB).all()
    assert reads["offset"].to_list() == [i * MiB for i in range(64)]
    assert (reads["dev"] == dev).all()
    assert (reads["flags"] & os.O_DIRECT != 0).all()

    # The summary names the device and the byte count.
    assert dev in res.stderr and "64.00" in res.stderr and "lost events: 0" in res.stderr
    meta = read_metadata(out)
    assert meta["schema_version"] == 1 or meta["schema_version"] == "1"
    assert sum(meta["lost_events"].values()) == 0
    assert meta["target"]["command"][0] == "dd"
    loop = next(d for d in meta["devices"] if d["dev"] == dev)
    assert loop["name"] == Path(loop_dev).name and loop["backing_file"].startswith("/dev/shm/")
    stats = meta["bpf_stats"]
    assert stats["tio_rq_issue"]["run_cnt"] >= 64 and stats["tio_rq_issue"]["run_time_ns"] > 0
    # The recorder's own CPU while recording: each thread's, so neither can exceed the
    # recording's wall time (process or machine CPU could).
    cpu = meta["recorder_cpu_ns"]
    assert 0 < cpu["drain"] <= meta["end_ns"] - meta["start_ns"] + 10_000_000
    assert 0 < cpu["encoder"] <= meta["end_ns"] - meta["start_ns"] + 10_000_000
    assert "recorder CPU: drain" in res.stderr


def test_exit_code_of_the_command_is_propagated(tmp_path: Path) -> None:
    res = trainio("record", "--layers", "file", "-o", tmp_path / "t", "--", "sh", "-c", "exit 7")
    assert res.returncode == 7, res.stderr
    assert list((tmp_path / "t").glob("seg-*.parquet")), "a trace is written even without I/O"


@pytest.mark.slow
def test_nfs_layer_is_skipped_where_the_kernel_has_no_nfs_client(tmp_path: Path) -> None:
    """The default layers include nfs: a kernel without the nfs module records the rest,
    says why nfs was skipped, and writes schema 1.1 with the rpc_* columns all null."""
    if Path("/sys/kernel/tracing/events/nfs").exists() or Path("/sys/kernel/debug/tracing/events/nfs").exists():
        pytest.skip("this kernel has an NFS client: the skip path cannot be shown here")
    out = tmp_path / "t"
    res = trainio("record", "-o", out, "--", "dd", "if=/dev/zero", f"of={tmp_path / 'f'}", "bs=64k", "count=4")
    assert res.returncode == 0, res.stderr
    assert "skipping nfs" in res.stderr
    meta = read_metadata(out)
    assert "nfs" in meta["skipped_probes"] and "nfs" not in meta["layers"]
    assert meta["schema_minor"] == SCHEMA_MINOR and meta["nfs_mounts"] == []
    df = scan_trace(out).collect()
    writes = df.filter((pl.col("layer") == "file") & (pl.col("op") == "write"))
    assert writes["bytes"].sum() == 4 * 65536
    for col in ("rpc_xid", "rpc_backlog_ns", "rpc_rtt_ns", "rpc_execute_ns", "rpc_retrans"):
        assert df[col].null_count() == df.height, col


def test_fio_iodepth_1_is_queue_depth_1(tmp_path: Path, loop_dev: str) -> None:
    out = tmp_path / "qd1"
    res = trainio(
        "record", "-o", out, "--dev", loop_dev, "--", *fio(loop_dev, "--ioengine=psync", "--iodepth=1", "--io_size=16M")
    )
    assert res.returncode == 0, res.stderr
    block = rows(out, layer="block", op="read")
    # A completion the kernel did not hand to the probe is counted, not lost, and does not
    # stay in the kernel-side depth (docs/design/recorder.md).
    missed = _missed_completions(out)
    assert block.height + missed >= 4096, (block.height, res.stderr)
    assert block["dev"].unique().to_list() == [majmin(loop_dev)], "--dev filters other devices out"
    assert block["queue_depth"].min() == 1, missed
    # at most the request issued as the missed completion woke fio (design/recorder.md)
    assert (block["queue_depth"] > 1).sum() <= missed, (block["queue_depth"].value_counts(), missed)


@pytest.mark.slow
def test_fio_iodepth_16_stays_within_16_and_mostly_above_1(tmp_path: Path, loop_dev: str) -> None:
    out = tmp_path / "qd16"
    res = trainio(
        "record",
        "-o",
        out,
        "--dev",
        majmin(loop_dev),
        "--",
        *fio(loop_dev, "--ioengine=io_uring", "--iodepth=16", "--io_size=64M"),
    )
    assert res.returncode == 0, res.stderr
    qd = rows(out, layer="block", op="read")["queue_depth"]
    # 64 MiB of 4 KiB reads: 16384 requests, of which 0.71-0.95 meet another in flight
    # (the low end with both CPUs busy elsewhere).
    counts = qd.value_counts().sort("queue_depth")
    # A completion the kernel does not hand to the probe is counted instead, and does not
    # stay in the in-flight count (docs/design/recorder.md).
    missed = _missed_completions(out)
    assert qd.len() + missed >= 16384, (qd.len(), res.stderr)
    assert (qd > 16).sum() <= 16 * missed, (counts, missed)
    assert (qd > 1).mean() > 0.5, counts


def test_file_layer_offsets_sizes_and_relative_paths(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "sample.bin").write_bytes(os.urandom(64 * 1024))
    script = """
import os
fd = os.open("sample.bin", os.O_RDONLY)          # relative: resolved with the cwd
os.read(fd, 1000)                                 # offset 0 (file position)
os.read(fd, 3000)                                 # offset 1000
os.pread(fd, 4096, 8192)                          # offset 8192
os.readv(fd, [bytearray(100), bytearray(200)])    # offset 4000, 300 requested
os.preadv(fd, [bytearray(512)] * 3, 16384)        # offset 16384, 1536 requested
os.lseek(fd, 60000, 0)
os.read(fd, 10000)                                # offset 60000, 5536 returned at EOF
os.close(fd)
"""
    out = tmp_path / "t"
    res = trainio("record", "--layers", "file", "-o", out, "--", sys.executable, "-c", script, cwd=data)
    assert res.returncode == 0, res.stderr
    path = str(data / "sample.bin")
    reads = rows(out, layer="file", op="read", file=path).sort("issue_ns")
    got = list(zip(reads["offset"], reads["bytes_requested"], reads["bytes"]))
    assert got == [
        (0, 1000, 1000),
        (1000, 3000, 3000),
        (8192, 4096, 4096),
        (4000, 300, 300),
        (16384, 1536, 1536),
        (60000, 10000, 5536),
    ]
    assert (reads["queue_depth"] == 1).all()
    opens = rows(out, layer="file", op="open", file=path)
    closes = rows(out, layer="file", op="close", file=path)
    assert opens.height == 1 and closes.height == 1
    assert opens["fd"][0] == reads["fd"][0] == closes["fd"][0]


def test_file_layer_pairs_each_threads_syscalls_with_its_own_entry(tmp_path: Path) -> None:
    # Four threads of one process read their own quarter of a file at once, with pread
    # and with read() on their own fd (file position): a syscall's exit must meet its own
    # thread's entry, never another thread's, and the process's read concurrency is at
    # most the four threads.
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(4 * MiB))
    script = f"""
import os, threading
start = threading.Barrier(4)
def reader(k):
    fd = os.open({str(data)!r}, os.O_RDONLY)
    start.wait()
    base = k * {MiB}
    for i in range(32):
        os.pread(fd, 16384, base + i * 16384)      # the first half of the quarter
    os.lseek(fd, base + {MiB // 2}, 0)
    for i in range(32):
        os.read(fd, 16384)                         # the second half, by file position
    os.close(fd)
threads = [threading.Thread(target=reader, args=(k,)) for k in range(4)]
for t in threads: t.start()
for t in threads: t.join()
"""
    out = tmp_path / "t"
    res = trainio("record", "--layers", "file", "-o", out, "--", sys.executable, "-c", script)
    assert res.returncode == 0, res.stderr
    reads = rows(out, layer="file", op="read", file=str(data)).sort("issue_ns")
    assert reads.height == 4 * 64
    assert (reads["bytes"] == 16384).all() and (reads["bytes_requested"] == 16384).all()
    quarters = set()
    for (tid,), g in reads.group_by(["tid"]):
        offs = g.sort("issue_ns")["offset"].to_list()
        base = offs[0]
        assert base % MiB == 0, f"thread {tid} starts mid-quarter: {offs[:3]}"
        assert offs == [base + i * 16384 for i in range(64)], f"thread {tid}'s offsets are another's"
        assert g["fd"].n_unique() == 1
        quarters.add(base // MiB)
    assert quarters == {0, 1, 2, 3}, "one thread per quarter"
    assert reads["pid"].n_unique() == 1 and reads["tid"].n_unique() == 4
    assert reads["queue_depth"].min() >= 1 and reads["queue_depth"].max() <= 4


@pytest.mark.slow
def test_pid_mode_follows_children_forked_after_attach(tmp_path: Path) -> None:
    victim = tmp_path / "v.bin"
    victim.write_bytes(b"x" * 8192)
    # The child forks cat only when told to, once the recorder says it is recording.
    proc = subprocess.Popen(["sh", "-c", f"read go; cat {victim} > /dev/null"], stdin=subprocess.PIPE, text=True)
    rec = None
    try:
        rec = record_until_recording("--layers", "file", "-o", tmp_path / "t", "--pid", proc.pid)
        proc.communicate("go\n", timeout=30)
        rc, err = finish(rec)
        assert rc == 0, err
    finally:
        for p in (proc, rec):
            if p:
                p.kill()
                p.wait()
    reads = rows(tmp_path / "t", layer="file", op="read", file=str(victim))
    assert reads["comm"].unique().to_list() == ["cat"]
    assert reads["bytes"].sum() == 8192
    assert reads["pid"][0] != proc.pid, "cat is a child forked after the recorder attached"


@pytest.mark.slow
def test_pid_mode_traces_workers_forked_before_attach(tmp_path: Path) -> None:
    # A data loader's shape: the main process forked its worker before the recorder came;
    # the worker reads after it. The worker must be traced, the main process's read too.
    victim = tmp_path / "v.bin"
    victim.write_bytes(b"y" * 12288)
    # Both read only once the main process is told to (a line on its stdin, sent when the
    # recorder says it is recording), the worker when the main process writes to their pipe.
    script = f"""
import os, sys
r, w = os.pipe()
worker = os.fork()
if worker == 0:
    os.close(w)
    os.read(r, 1)
    with open({str(victim)!r}, "rb", buffering=0) as f:
        f.read()
    os._exit(0)
os.close(r)
print(worker, flush=True)
sys.stdin.readline()
os.write(w, b"g")
with open({str(victim)!r}, "rb", buffering=0) as f:
    f.read(4096)
os.waitpid(worker, 0)
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    rec = None
    try:
        assert proc.stdout is not None and proc.stdin is not None
        worker = int(proc.stdout.readline())
        rec = record_until_recording("--layers", "file", "-o", tmp_path / "t", "--pid", proc.pid)
        proc.stdin.write("go\n")
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
        rc, err = finish(rec)
        assert rc == 0, err
    finally:
        for p in (proc, rec):
            if p:
                p.kill()
                p.wait()
        proc.stdout.close()  # type: ignore[union-attr]
    reads = rows(tmp_path / "t", layer="file", op="read", file=str(victim))
    by_pid = dict(reads.group_by("pid").agg(pl.col("bytes").sum()).iter_rows())
    assert by_pid.get(worker) == 12288, f"the worker forked before attach: {by_pid}"
    assert by_pid.get(proc.pid) == 4096, by_pid


@pytest.mark.slow
def test_sigkill_leaves_readable_segments_and_no_programs(tmp_path: Path, loop_dev: str) -> None:
    out = tmp_path / "killed"
    tracer = subprocess.Popen(
        [
            str(TRAINIO),
            "record",
            "-o",
            str(out),
            "--segment-s",
            "0.3",
            "--dev",
            loop_dev,
            "--",
            *fio(loop_dev, "--ioengine=psync", runtime=30),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while len(list(out.glob("seg-*.parquet"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        os.kill(tracer.pid, signal.SIGKILL)
        tracer.wait()
    finally:
        os.killpg(tracer.pid, signal.SIGKILL)  # the orphaned fio
    done = sorted(out.glob("seg-*.parquet"))
    assert len(done) >= 2
    total = 0
    for i, seg in enumerate(done):
        md = pq.read_metadata(seg).metadata
        assert md[b"trainio.schema_version"] == b"1"
        assert int(md[b"trainio.segment"]) == i
        table = pq.read_table(seg)
        total += table.num_rows
        # Metadata as of the segment's closing: it covers every row written up to it.
        assert int(md[b"trainio.end_ns"]) >= pc.max(table["complete_ns"]).as_py(), seg.name
        assert sum(json.loads(md[b"trainio.events"]).values()) >= total, seg.name
    assert total > 0
    assert scan_trace(out).select(pl.len()).collect().item() == total, "readers skip the .partial"


@pytest.mark.slow
def test_tiny_ring_buffer_reports_lost_events(tmp_path: Path, loop_dev: str) -> None:
    out = tmp_path / "lossy"
    res = trainio(
        "record",
        "-o",
        out,
        "--ringbuf-mb",
        "0.004",
        "--dev",
        loop_dev,
        "--",
        *fio(loop_dev, "--ioengine=io_uring", "--iodepth=32", runtime=2),
    )
    assert res.returncode == 0, res.stderr
    lost = read_metadata(out)["lost_events"]
    assert lost["block_rq_complete:ringbuf_full"] > 0
    assert "EVENTS LOST" in res.stderr and "raise --ringbuf-mb" in res.stderr


def _one_line_exit_2(res: subprocess.CompletedProcess[str], *words: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    out = tmp_path / "o"
    _one_line_exit_2(trainio("record", "-o", out, "--dev", "nosuchdisk0", "--", "true"), "nosuchdisk0")
    _one_line_exit_2(trainio("record", "-o", out, "--", "no-such-command-xyz"), "no-such-command-xyz")
    # a file that is not executable, named by path: refused before anything is written
    _one_line_exit_2(trainio("record", "-o", out, "--", "/etc/passwd"), "/etc/passwd", "not an executable")
    _one_line_exit_2(trainio("record", "-o", out, "--layers", "block,tape", "--", "true"), "tape")
    _one_line_exit_2(trainio("record", "-o", out, "--pid", "999999999"), "999999999")
    assert not out.exists(), "nothing is written on bad input"
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("precious")
    _one_line_exit_2(trainio("record", "-o", full, "--", "true"), str(full), "not empty")
    assert [p.name for p in full.iterdir()] == ["keep.txt"]
    nobody = run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            str(TRAINIO),
            "record",
            "-o",
            str(tmp_path / "n"),
            "--",
            "true",
        ]
    )
    _one_line_exit_2(nobody, "root")


@pytest.mark.slow
def test_cgroup_mode_traces_only_the_cgroup_subtree_and_stops_at_duration(tmp_path: Path) -> None:
    unified = Path("/sys/fs/cgroup/unified")
    base = unified if (unified / "cgroup.procs").exists() else Path("/sys/fs/cgroup")
    cg = base / f"trainio-test-{os.getpid()}"
    # A cgroup below the target (a pod's container under kubepods.slice) is traced too.
    child = cg / "pod"
    inside, below, outside = tmp_path / "in.bin", tmp_path / "below.bin", tmp_path / "out.bin"
    inside.write_bytes(b"i" * 4096)
    below.write_bytes(b"b" * 4096)
    outside.write_bytes(b"o" * 4096)
    cg.mkdir()
    child.mkdir()
    proc = nested = other = rec = None
    try:
        # Both read when told to, once the recorder says it is recording.
        proc = subprocess.Popen(
            ["sh", "-c", f"echo $$ > {cg}/cgroup.procs; read go; cat {inside} > /dev/null"],
            stdin=subprocess.PIPE,
            text=True,
        )
        nested = subprocess.Popen(
            ["sh", "-c", f"echo $$ > {child}/cgroup.procs; read go; cat {below} > /dev/null"],
            stdin=subprocess.PIPE,
            text=True,
        )
        other = subprocess.Popen(["sh", "-c", f"read go; cat {outside} > /dev/null"], stdin=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 10
        for sh, where in ((proc, cg), (nested, child)):
            while str(sh.pid) not in (where / "cgroup.procs").read_text().split():
                assert time.monotonic() < deadline and sh.poll() is None, "the shell did not join the cgroup"
                time.sleep(0.01)  # the shell joins the cgroup first thing
        t0 = time.monotonic()
        rec = record_until_recording("--layers", "file", "-o", tmp_path / "t", "--cgroup", cg, "--duration", "3")
        proc.communicate("go\n", timeout=30)
        nested.communicate("go\n", timeout=30)
        other.communicate("go\n", timeout=30)
        rc, err = finish(rec)
        elapsed = time.monotonic() - t0
        assert rc == 0, err
        assert 3 <= elapsed < 15
        files = set(rows(tmp_path / "t", layer="file", op="read")["file"].to_list())
        assert str(inside) in files and str(below) in files and str(outside) not in files
        assert read_metadata(tmp_path / "t")["target"] == {"cgroup": str(cg)}
        # Both shells were there at the start: each has a start row.
        started = set(rows(tmp_path / "t", layer="proc", op="start")["pid"].to_list())
        assert {proc.pid, nested.pid} <= started
    finally:
        for p in (proc, nested, other, rec):
            if p:
                p.kill()
                p.wait()
        child.rmdir()
        cg.rmdir()


@pytest.mark.slow
def test_sigterm_is_forwarded_and_the_trace_is_closed(tmp_path: Path) -> None:
    out = tmp_path / "t"
    tracer = record_until_recording("-o", out, "--", "sleep", "30")  # its handlers are in place
    try:
        tracer.send_signal(signal.SIGTERM)
        _, err = tracer.communicate(timeout=30)
    finally:
        tracer.kill()
    assert tracer.returncode == 128 + signal.SIGTERM, err
    assert not list(out.glob("*.partial")) and list(out.glob("seg-*.parquet"))
    _assert_nothing_lost_but_missed_completions(err)


@pytest.mark.parametrize("one_slot", [False, True], ids=["tables", "one-slot-tables"])
def test_device_filter_and_request_tables(tmp_path: Path, one_slot: bool) -> None:
    """Two selected devices and one not: the selected ones are recorded exactly, the other
    not at all. With one-slot tables (a test setting), one of the two devices and nearly
    every in-flight request live in the kernel's hash-map fallbacks instead, which must
    give the same rows."""
    from trainio_testlib import loop_device

    out = tmp_path / "t"
    env = {**os.environ, **({"TRAINIO_TEST_ONE_SLOT_TABLES": "1"} if one_slot else {})}
    with loop_device(64) as a, loop_device(64) as b, loop_device(64) as c:
        script = (
            f"fio --name=a --filename={a} --direct=1 --rw=randread --bs=4k --size=16M "
            f"--ioengine=io_uring --iodepth=16 --output-format=terse >/dev/null & "
            f"dd if={b} of=/dev/null bs=1M count=8 iflag=direct status=none & "
            f"dd if={c} of=/dev/null bs=1M count=8 iflag=direct status=none & wait"
        )
        res = trainio(
            "record", "-o", out, "--layers", "block", "--dev", a, "--dev", majmin(b), "--", "sh", "-c", script, env=env
        )
        assert res.returncode == 0, res.stderr
        block = rows(out, layer="block", op="read")
        per_dev = {d: g for (d,), g in block.group_by("dev")}
        assert set(per_dev) == {majmin(a), majmin(b)}, f"{majmin(c)} was not selected"
    fio_rows, dd_rows = per_dev[majmin(a)], per_dev[majmin(b)]
    # fio's random map reads every 4 KiB block of the 16 MiB exactly once.
    assert fio_rows["bytes"].sum() == 16 * MiB
    assert fio_rows["offset"].n_unique() == fio_rows.height
    assert 1 < fio_rows["queue_depth"].max() <= 16
    assert dd_rows["bytes"].sum() == 8 * MiB
    assert dd_rows["queue_depth"].max() <= 2  # one 1 MiB read in flight, split in two requests
    assert (fio_rows["complete_ns"] > fio_rows["issue_ns"]).all()
    assert sum(read_metadata(out)["lost_events"].values()) == 0
    # The analyzer skips decoding layer/op/dev in a row group whose statistics show one
    # value: the tracer must keep those statistics.
    for seg in out.glob("seg-*.parquet"):
        md = pq.ParquetFile(seg).metadata
        for rg in range(md.num_row_groups):
            names = [md.schema.column(i).name for i in range(md.num_columns)]
            for col in ("layer", "op", "dev"):
                st = md.row_group(rg).column(names.index(col)).statistics
                assert st is not None and st.has_min_max, (seg, rg, col)


def test_batched_completions_of_a_quiet_cpu_are_written_while_recording(tmp_path: Path, loop_dev: str) -> None:
    """Block completions are gathered per CPU and written a batch at a time (block.bpf.c).
    A CPU that goes quiet after a few requests must not hold them until the recording
    ends: the recorder writes batches older than 50 ms, so the rows of five reads reach a
    finished segment while the command is still sleeping."""
    out = tmp_path / "t"
    script = f"dd if={loop_dev} of=/dev/null bs=4k count=5 iflag=direct status=none; sleep 8"
    tracer = subprocess.Popen(
        [
            str(TRAINIO),
            "record",
            "-o",
            str(out),
            "--layers",
            "block",
            "--dev",
            loop_dev,
            "--segment-s",
            "0.2",
            "--",
            "sh",
            "-c",
            script,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        written, deadline = 0, time.monotonic() + 5
        while written < 5 and time.monotonic() < deadline:
            time.sleep(0.1)
            written = sum(
                pl.read_parquet(seg).filter(pl.col("layer") == "block").height for seg in out.glob("seg-*.parquet")
            )
        assert tracer.poll() is None, "the command was still running"
        assert written == 5, f"{written} of 5 block rows in finished segments after 5 s"
    finally:
        tracer.terminate()
        _, err = tracer.communicate(timeout=30)
    _assert_nothing_lost_but_missed_completions(err)


@pytest.mark.parametrize("final", ["flush-program", "map-read"])
def test_batches_still_held_at_the_end_are_written(tmp_path: Path, loop_dev: str, final: str) -> None:
    """With the batch age raised to an hour (a test setting), completions leave their
    per-CPU batch only at the end: through the flush program run on each CPU, or (for a
    CPU it cannot run on; forced here by a test setting) read from the map. Every request
    must arrive either way."""
    out = tmp_path / "t"
    env = {
        **os.environ,
        "TRAINIO_TEST_BATCH_AGE_MS": "3600000",
        **({"TRAINIO_TEST_SKIP_FINAL_FLUSH": "1"} if final == "map-read" else {}),
    }
    res = trainio(
        "record",
        "-o",
        out,
        "--layers",
        "block",
        "--dev",
        loop_dev,
        "--",
        "dd",
        f"if={loop_dev}",
        "of=/dev/null",
        "bs=4k",
        "count=45",
        "iflag=direct",
        env=env,
    )
    assert res.returncode == 0, res.stderr
    block = rows(out, layer="block", op="read").sort("offset")
    # Only full batches (32) leave before the end: at least 13 of the 45 were held.
    assert block["offset"].to_list() == [i * 4096 for i in range(45)]
    assert (block["bytes"] == 4096).all()
    assert (block["complete_ns"] > block["issue_ns"]).all()


def _sys_stat(dev: str) -> tuple[int, int]:
    """(requests completed, bytes) read and written, from /sys/block/NAME/stat."""
    f = block_stat(dev)
    return f[0] + f[4], (f[2] + f[6]) * 512


def _max_overlap(starts: list[int], ends: list[int]) -> int:
    """The most [start, end) intervals open at once."""
    edges = sorted([(t, 1) for t in starts] + [(t, -1) for t in ends], key=lambda e: (e[0], e[1]))
    depth = best = 0
    for _, d in edges:
        depth += d
        best = max(best, depth)
    return best


def test_two_recorders_account_for_every_request_the_device_counts(tmp_path: Path) -> None:
    """20 runs, each with two recorders of one device at once while it serves three kinds of
    load (16 synchronous 4 KiB readers, direct 1 MiB reads, buffered reads with readahead).
    Every request the device's own counters add up over the recording is in each trace, or
    is counted by the recorder as a completion it did not see (block_rq_complete:unseen,
    or still marked in flight at the end): never missing silently. A request whose
    completion is missed must not stay in flight either: 16 readers never meet a queue
    deeper than 16."""
    failures = []
    missed = 0
    with loop_device(64, fill=True) as dev:
        loads = [
            [
                "fio",
                "--name=q",
                f"--filename={dev}",
                "--direct=1",
                "--rw=randread",
                "--bs=4k",
                "--ioengine=psync",
                "--numjobs=16",
                "--io_size=8M",
                "--size=64M",
                "--norandommap",
                "--output=/dev/stdout",
            ],
            ["dd", f"if={dev}", "bs=1M", "count=48", "iflag=direct", "of=/dev/zero", "status=none"],
            ["dd", f"if={dev}", "bs=4M", "count=12", "of=/dev/zero", "status=none"],
        ]
        for run_no in range(20):
            Path("/proc/sys/vm/drop_caches").write_text("1")
            traces = [tmp_path / f"r{run_no}-{k}" for k in (0, 1)]
            recorders = [
                start_recording("-o", str(t), "--layers", "block", "--dev", dev, "--", "sleep", "600") for t in traces
            ]
            try:
                before = _sys_stat(dev)
                for load in loads:
                    run(load, check=True)
                after = _sys_stat(dev)
            finally:
                for p in recorders:
                    p.send_signal(signal.SIGINT)
                errs = [p.communicate(timeout=60)[1] for p in recorders]
            device = after[0] - before[0]
            for t, err in zip(traces, errs):
                b = rows(t, layer="block")
                lost = read_metadata(t)["lost_events"]
                missed_keys = {"block_rq_complete:unseen", "block_rq_complete:in_flight_at_end"}
                assert not any(n for k, n in lost.items() if k not in missed_keys), (lost, err[-2000:])
                unseen = lost.get("block_rq_complete:unseen", 0)
                in_flight = lost.get("block_rq_complete:in_flight_at_end", 0)
                missed += unseen + in_flight
                if b.height + unseen + in_flight != device:
                    failures.append(
                        f"run {run_no}: {t.name} has {b.height} requests, "
                        f"{unseen} unseen, {in_flight} in flight; device {device}"
                    )
                if not unseen and not in_flight and int(b["bytes"].sum()) != after[1] - before[1]:
                    failures.append(
                        f"run {run_no}: {t.name} bytes {int(b['bytes'].sum())}, device {after[1] - before[1]}"
                    )
                small = b.filter(pl.col("bytes") == 4096)
                # A missed completion does not stay in the kernel-side in-flight count (but
                # for a request issued as it wakes its reader), and the trace's own intervals
                # never overlap more than 16 deep.
                qd = small["queue_depth"].max()
                if qd > 16 + unseen:
                    failures.append(
                        f"run {run_no}: {t.name} has queue depth {qd} among 16 readers with {unseen} unseen completions"
                    )
                overlap = _max_overlap(small["issue_ns"].to_list(), small["complete_ns"].to_list())
                if overlap > 16:
                    failures.append(f"run {run_no}: {t.name} has {overlap} requests overlapping")
    print(f"completions the recorders reported unseen over 40 traces: {missed}")
    assert not failures, failures


def test_a_second_signal_stops_recording_a_command_that_ignores_signals(tmp_path: Path) -> None:
    """The first SIGINT goes to the command; one that ignores it keeps running, and the
    second SIGINT ends the recording: the trace is written, the recorder exits 130 and
    names the command still running (which it leaves alone)."""
    out = tmp_path / "t"
    tracer = subprocess.Popen(
        [
            str(TRAINIO),
            "record",
            "-o",
            str(out),
            "--layers",
            "file",
            "--",
            "bash",
            "-c",
            "trap '' INT TERM; echo ready; exec sleep 120 >/dev/null 2>&1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    left = None
    try:
        assert tracer.stdout is not None and tracer.stdout.readline().strip() == "ready"
        tracer.send_signal(signal.SIGINT)
        with pytest.raises(subprocess.TimeoutExpired):
            tracer.wait(timeout=1.0)  # the command ignored it: still recording
        tracer.send_signal(signal.SIGINT)
        _, err = tracer.communicate(timeout=30)
        m = re.search(r"the command \(pid (\d+)\) is still running", err)
        assert m, err
        left = int(m.group(1))
        assert Path(f"/proc/{left}/cmdline").read_bytes().split(b"\0")[0] == b"sleep"
    finally:
        tracer.kill()
        if left:
            os.kill(left, signal.SIGKILL)
    assert tracer.returncode == 128 + signal.SIGINT, err
    assert not list(out.glob("*.partial")) and list(out.glob("seg-*.parquet"))
    assert rows(out, layer="proc").filter(pl.col("op") == "exec").height >= 1


def test_output_on_a_read_only_mount_is_bad_input(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    run(["mount", "-t", "tmpfs", "-o", "ro,size=1M", "none", str(ro)], check=True)
    try:
        res = trainio("record", "-o", str(ro / "t"), "--", "true")
    finally:
        if run(["umount", str(ro)]).returncode != 0:
            run(["umount", "-l", str(ro)])
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "not writable" in lines[0] and str(ro) in lines[0], res.stderr


def test_a_full_disk_keeps_finished_segments_and_counts_what_it_lost(tmp_path: Path, loop_dev: str) -> None:
    """The trace's file system fills up while recording: the command runs to its end
    (exit 0), the segments finished before stay readable, no .partial is left, and every
    request the device served is either a row or counted as lost to the failed writes
    (in the last segment's metadata and in the summary)."""
    small = tmp_path / "small"
    small.mkdir()
    # Room for a few seconds of segments (~0.7 MB/s here), then full: segments finish
    # before the disk fills even when the encoder lags on a loaded host (MAX_LAG, 3 s).
    run(["mount", "-t", "tmpfs", "-o", "size=4m", "none", str(small)], check=True)
    try:
        before = _sys_stat(loop_dev)
        res = trainio(
            "record",
            "-o",
            str(small / "t"),
            "--layers",
            "block",
            "--dev",
            loop_dev,
            "--segment-s",
            "0.2",
            "--",
            *fio(loop_dev, "--ioengine=psync", "--numjobs=4", runtime=10, size="64M"),
        )
        after = _sys_stat(loop_dev)
        assert res.returncode == 0, res.stderr
        assert "No space left on device" in res.stderr and "finished segments are intact" in res.stderr
        t = small / "t"
        assert not list(t.glob("*.partial")), list(t.iterdir())
        lost = read_metadata(t)["lost_events"]
        assert lost["segment_write_failed"] > 0, lost
        b = rows(t, layer="block")
        assert b.height > 0
        accounted = (
            b.height
            + lost["segment_write_failed"]
            + lost.get("block_rq_complete:unseen", 0)
            + lost.get("block_rq_complete:in_flight_at_end", 0)
        )
        assert accounted == after[0] - before[0], (b.height, lost, after[0] - before[0])
        a = trainio("analyze", "--json", str(t))
        assert a.returncode == 0, a.stderr
        assert json.loads(a.stdout)["lost_events"]["total"] >= lost["segment_write_failed"]
    finally:
        if run(["umount", str(small)]).returncode != 0:
            run(["umount", "-l", str(small)])


def test_file_layer_records_the_syncs_of_a_write(tmp_path: Path) -> None:
    # A checkpoint's writes end with fsync, fdatasync or sync_file_range: each is a row of
    # its own op on the file, after the write it makes durable, with its range when it has
    # one; a sync of a pipe is not a storage row.
    path = tmp_path / "ckpt.bin"
    script = f"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open({str(path)!r}, os.O_WRONLY | os.O_CREAT, 0o644)
os.write(fd, b"x" * 65536)
os.fsync(fd)
os.fdatasync(fd)
assert libc.sync_file_range(fd, ctypes.c_longlong(4096), ctypes.c_longlong(8192), 2) == 0
os.close(fd)
r, w = os.pipe()
try:
    os.fsync(w)
except OSError:
    pass
"""
    out = tmp_path / "t"
    res = trainio("record", "--layers", "file", "-o", out, "--", sys.executable, "-c", script)
    assert res.returncode == 0, res.stderr
    ops = rows(out, layer="file", file=str(path)).sort("issue_ns")
    got = list(zip(ops["op"], ops["offset"], ops["bytes"], ops["bytes_requested"], ops["queue_depth"]))
    assert got == [
        ("open", None, 0, 0, 0),
        ("write", 0, 65536, 65536, 1),
        ("fsync", None, 0, 0, 0),
        ("fdatasync", None, 0, 0, 0),
        ("sync_file_range", 4096, 0, 8192, 0),
        ("close", None, 0, 0, 0),
    ]
    assert (ops["error"] == 0).all() and ops["fd"].n_unique() == 1
    syncs = scan_trace(out).filter(pl.col("op").is_in(["fsync", "fdatasync", "sync_file_range"])).collect()
    assert syncs.height == 3, syncs
    assert read_metadata(out)["schema_minor"] == SCHEMA_MINOR
