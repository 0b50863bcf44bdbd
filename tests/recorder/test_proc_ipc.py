"""The proc and ipc layers (schema 1.3) against real kernel events: a rank that forks two
data-loader workers, which rename themselves, read a file, and hand a batch over a pipe
that the rank polls and reads, as PyTorch's DataLoader does."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

# trainio_testlib puts analysis/ on the path: it goes first.
from trainio_testlib import TRAINIO, mounted_loop_fs

# isort: split
from trainio_analysis.trace import SCHEMA_MINOR, read_metadata, scan_trace

pytestmark = [pytest.mark.root]

# The rank: argv = go fd (the workers' release, written by the test), data file.
RANK = r"""
import ctypes, json, os, select, sys, threading

go, path = int(sys.argv[1]), sys.argv[2]
libc = ctypes.CDLL(None, use_errno=True)
r, w = os.pipe()
workers = []
for i in range(2):
    pid = os.fork()
    if pid == 0:
        os.close(r)
        libc.prctl(15, b"pt_data_worker", 0, 0, 0)  # PR_SET_NAME, as DataLoader workers
        fd = os.open(path, os.O_RDONLY)
        os.pread(fd, 65536, i * 65536)
        os.close(fd)
        os.read(go, 1)  # released by the test once the rank waits in poll
        os.write(w, b"batch%d" % i)
        os._exit(0)
    workers.append(pid)
os.close(w)
os.close(go)

# A thread blocked in read() on a pipe while the main thread reads the file: the file
# layer's concurrency counts the file reads only.
br, bw = os.pipe()
blocked = threading.Thread(target=os.read, args=(br, 1))
blocked.start()
while not open(f"/proc/self/task/{blocked.native_id}/syscall").read().startswith("0 "):
    pass
fd = os.open(path, os.O_RDONLY)
for k in range(4):
    os.pread(fd, 4096, k * 4096)
os.close(fd)
os.write(bw, b"x")
blocked.join()

print(json.dumps({"pid": os.getpid(), "workers": workers, "pipe": os.fstat(r).st_ino,
                  "fd": r, "blocked_tid": blocked.native_id}), flush=True)
p = select.poll()
p.register(r, select.POLLIN)
got = b""
while len(got) < 12:
    p.poll()
    got += os.read(r, 100)
for pid in workers:
    assert os.waitpid(pid, 0)[1] == 0
"""

# poll and ppoll, as /proc/PID/syscall numbers them.
POLL_SYSCALLS = {"x86_64": {"7", "271"}, "aarch64": {"73"}}


def _in_poll(pid: int) -> bool:
    try:
        nr = Path(f"/proc/{pid}/syscall").read_text().split()[0]
    except (OSError, IndexError):
        return False
    return nr in POLL_SYSCALLS.get(platform.machine(), {"7", "271", "73"})


def test_workers_fork_rename_and_hand_batches_over_a_polled_pipe(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    out = tmp_path / "trace"
    with mounted_loop_fs(64) as (_dev, majmin, mnt):
        data = mnt / "data.bin"
        data.write_bytes(os.urandom(1 << 18))
        go_r, go_w = os.pipe()
        rec = subprocess.Popen(
            [
                str(TRAINIO),
                "record",
                "--layers",
                "file",
                "-o",
                str(out),
                "--",
                sys.executable,
                str(script),
                str(go_r),
                str(data),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            pass_fds=(go_r,),
        )
        os.close(go_r)
        try:
            info = json.loads(rec.stdout.readline())
            rank = info["pid"]
            # The rank is in poll() on the data pipe, the workers blocked on `go`: the
            # wait row must span from before this moment to after the release.
            while not _in_poll(rank):
                pass
            seen_in_poll = time.monotonic_ns()
            released = time.monotonic_ns()
            os.write(go_w, b"gg")
        finally:
            os.close(go_w)
            _, err = rec.communicate(timeout=60)
        assert rec.returncode == 0, err

    df = scan_trace(out).collect()
    proc = df.filter(pl.col("layer") == "proc")
    ipc = df.filter(pl.col("layer") == "ipc")
    file = df.filter(pl.col("layer") == "file")
    workers = info["workers"]
    pipe = f"pipe:[{info['pipe']}]"

    def one(frame: pl.DataFrame, **eq) -> dict:
        for k, v in eq.items():
            frame = frame.filter(pl.col(k) == v)
        assert frame.height == 1, (eq, frame)
        return frame.row(0, named=True)

    # proc: the rank's start (its parent is the recorder) and exec, then the workers.
    start = one(proc, op="start", pid=rank)
    assert start["ppid"] == rec.pid and start["tid"] == rank
    assert str(script) in start["file"] and start["bytes"] == 0 and start["fd"] is None
    assert one(proc, op="exec", pid=rank)["ppid"] == rec.pid
    # exec renames the process too: that is the exec row, not a comm row.
    assert proc.filter((pl.col("op") == "comm") & (pl.col("tid") == rank)).height == 0
    for w in workers:
        fork = one(proc, op="fork", pid=w)
        assert (fork["tid"], fork["ppid"]) == (w, rank)
        comm = one(proc, op="comm", pid=w)
        assert (comm["comm"], comm["ppid"], comm["tid"]) == ("pt_data_worker", rank, w)
        assert comm["issue_ns"] > fork["issue_ns"]
        exit_ = one(proc, op="exit", pid=w)
        assert (exit_["error"], exit_["ppid"], exit_["comm"]) == (0, rank, "pt_data_worker")
    rank_exit = one(proc, op="exit", pid=rank)
    assert (rank_exit["error"], rank_exit["ppid"]) == (0, rec.pid)
    assert (proc["issue_ns"] == proc["complete_ns"]).all()
    assert proc["ppid"].null_count() == 0
    assert df.filter(pl.col("layer") != "proc")["ppid"].null_count() == df.height - proc.height, (
        "ppid is null on every other layer"
    )

    # ipc: the workers' batches written to the pipe that the rank polls and reads.
    batch = ipc.filter(pl.col("file") == pipe)
    writes = batch.filter(pl.col("op") == "write")
    assert sorted(writes["pid"].to_list()) == sorted(workers)
    assert (writes["comm"] == "pt_data_worker").all() and (writes["bytes"] == 6).all()
    assert (writes["issue_ns"] >= released).all()
    reads = batch.filter((pl.col("op") == "read") & (pl.col("pid") == rank))
    assert reads["bytes"].sum() == 12 and (reads["bytes_requested"] == 100).all()
    assert (reads["fd"] == info["fd"]).all()
    waits = batch.filter((pl.col("op") == "wait") & (pl.col("pid") == rank))
    assert (waits["fd"] == info["fd"]).all() and (waits["bytes_requested"] == 1).all()
    long_wait = waits.filter((pl.col("issue_ns") <= seen_in_poll) & (pl.col("complete_ns") >= released))
    assert long_wait.height == 1, waits
    assert long_wait["bytes"][0] == 1 and long_wait["error"][0] == 0
    assert long_wait["complete_ns"][0] <= reads["issue_ns"].min()
    assert (batch["dev"].is_not_null()).all() and (batch["offset"].is_null()).all()
    assert (ipc["queue_depth"] == 0).all()

    # file: only regular files and block devices; the rank's pipe reads and the blocked
    # thread's do not count in its read concurrency.
    io = file.filter(pl.col("op").is_in(["read", "write", "close"]))
    assert not io["file"].str.contains(r"^(pipe|socket|anon_inode):").any()
    data_reads = io.filter((pl.col("file") == str(data)) & (pl.col("op") == "read"))
    assert sorted(set(data_reads["pid"].to_list())) == sorted([rank, *workers])
    assert (data_reads["dev"] == majmin).all()
    rank_reads = data_reads.filter(pl.col("pid") == rank)
    assert rank_reads.height == 4 and (rank_reads["queue_depth"] == 1).all()
    blocked = one(ipc, op="read", tid=info["blocked_tid"])
    assert blocked["issue_ns"] < rank_reads["issue_ns"].min()
    assert blocked["complete_ns"] > rank_reads["complete_ns"].max()

    meta = read_metadata(out)
    assert meta["schema_minor"] == SCHEMA_MINOR
    assert {"file", "proc", "ipc"} <= set(meta["layers"])
    assert meta["events"]["proc"] == proc.height and meta["events"]["ipc"] == ipc.height
    assert sum(meta["lost_events"].values()) == 0
    summary = {
        line.split()[0]: line.split()
        for line in err.splitlines()
        if line.startswith("  proc ") or line.startswith("  ipc ")
    }
    assert summary["proc"][1:] == ["-", str(proc.height), "-", "-"], err
    assert "ipc" in summary, err


# Vectored writes to a file, and a socket's sends and receives through each syscall
# (schema 1.5): a collective's transport (gloo: writev out, recvfrom in) and a checkpoint
# writer's writev are rows like write() and read().
VECTORED = r"""
import json, os, socket, sys

path = sys.argv[1]
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.writev(fd, [b"a" * 1000, b"b" * 3096])               # writev: 4096 at 0
os.pwritev(fd, [b"e" * 512], -1, os.RWF_DSYNC)          # pwritev2 at the position: 512 at 4096
os.pwritev(fd, [b"c" * 4096, b"d" * 4096], 8192)        # pwritev: 8192 at 8192
os.close(fd)
a, b = socket.socketpair()
a.send(b"x" * 48)                                       # sendto(fd, buf, 48, 0, NULL, 0)
got = b.recv(100)                                       # recvfrom(fd, buf, 100, 0, NULL, NULL)
a.sendmsg([b"y" * 20, b"z" * 12])                       # sendmsg: 32 bytes in 2 iovecs
data, *_ = b.recvmsg(64)                                # recvmsg: 32 of 64
print(json.dumps({"a": os.fstat(a.fileno()).st_ino, "b": os.fstat(b.fileno()).st_ino,
                  "got": len(got), "msg": len(data)}), flush=True)
"""


def test_vectored_writes_and_socket_sends_and_receives_are_recorded(tmp_path: Path) -> None:
    script = tmp_path / "vectored.py"
    script.write_text(VECTORED)
    out = tmp_path / "trace"
    with mounted_loop_fs(64) as (_dev, majmin, mnt):
        target = mnt / "ckpt.bin"
        p = subprocess.run(
            [
                str(TRAINIO),
                "record",
                "--layers",
                "file",
                "-o",
                str(out),
                "--",
                sys.executable,
                str(script),
                str(target),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 0, p.stderr
        size = target.stat().st_size
    info = json.loads(p.stdout.splitlines()[0])
    assert (info["got"], info["msg"]) == (48, 32)
    df = scan_trace(out).collect()
    writes = df.filter((pl.col("layer") == "file") & (pl.col("op") == "write") & (pl.col("file") == str(target)))
    got = sorted(zip(writes["offset"].to_list(), writes["bytes"].to_list(), writes["bytes_requested"].to_list()))
    assert got == [(0, 4096, 4096), (4096, 512, 512), (8192, 8192, 8192)], writes
    assert size == 16384
    assert (writes["dev"] == majmin).all()
    sock = df.filter((pl.col("layer") == "ipc") & pl.col("file").str.starts_with("socket:"))
    a, b = f"socket:[{info['a']}]", f"socket:[{info['b']}]"
    sends = sock.filter(pl.col("op") == "write")
    assert sorted(zip(sends["file"], sends["bytes"], sends["bytes_requested"])) == [(a, 32, 32), (a, 48, 48)], sends
    recvs = sock.filter(pl.col("op") == "read")
    assert sorted(zip(recvs["file"], recvs["bytes"], recvs["bytes_requested"])) == [(b, 32, 64), (b, 48, 100)], recvs
    # Socket syscalls are ipc rows only, and not counted in the read concurrency.
    assert not df.filter(pl.col("layer") == "file")["file"].str.starts_with("socket:").any()
    assert read_metadata(out)["schema_minor"] == SCHEMA_MINOR
