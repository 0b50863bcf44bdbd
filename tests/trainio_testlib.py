"""Helpers shared by every suite (imported by tests/conftest.py and the tests): the entry
point, loop devices, BPF program checks. Named uniquely: every suite has a conftest."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
TRAINIO = ROOT / "bin" / "trainio"
sys.path.insert(0, str(ROOT / "analysis"))

# Every BPF program of ours is named tio_* (bpf/*.bpf.c).
BPF_PREFIX = "tio_"


# Every process a test session starts inherits this marker, so the leftover check can tell
# our programs from those of another trainio run on the same machine.
SESSION_MARK = "TRAINIO_TEST_SESSION"
os.environ.setdefault(SESSION_MARK, f"{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _prog_owners() -> dict[int, set[int]]:
    """prog_id -> pids holding an fd on it (a program fd, or a link fd naming the program)."""
    owners: dict[int, set[int]] = {}
    for fdinfo in Path("/proc").glob("[0-9]*/fdinfo/*"):
        try:
            text = fdinfo.read_text()
        except OSError:
            continue
        m = re.search(r"^prog_id:\s*(\d+)", text, re.M)
        if m:
            owners.setdefault(int(m.group(1)), set()).add(int(fdinfo.parts[2]))
    return owners


def _ours(pid: int) -> bool:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"{SESSION_MARK}={os.environ[SESSION_MARK]}".encode() in env


def trainio_programs(*, all_sessions: bool = False) -> list[str]:
    """Names of loaded BPF programs that belong to trainio and to this test session: held by
    a process of this session, or by nobody (a pinned or leaked attachment). Programs held
    by another session's processes are left out unless all_sessions."""
    out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=True)
    progs = [p for p in json.loads(out.stdout or "[]") if p.get("name", "").startswith(BPF_PREFIX)]
    if all_sessions or not progs:
        return [p["name"] for p in progs]
    owners = _prog_owners()
    return [p["name"] for p in progs
            if not owners.get(p["id"]) or any(_ours(pid) for pid in owners[p["id"]])]


def wait_no_trainio_programs(timeout: float = 5.0) -> list[str]:
    """Programs are freed after their last fd closes (RCU-deferred): wait a little."""
    deadline = time.monotonic() + timeout
    left = trainio_programs()
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = trainio_programs()
    return left


def run(cmd: list[str], *, timeout: float = 300, check: bool = False, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=check, **kw)


def trainio(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess[str]:
    """Runs the real entry point, bin/trainio."""
    return run([str(TRAINIO), *map(str, args)], timeout=timeout, **kw)


@contextlib.contextmanager
def loop_device(size_mb: int = 256, *, direct_io: bool = True, fill: bool = False) -> Iterator[str]:
    """A loop device over a file in /dev/shm; detached and removed even on failure."""
    backing = Path("/dev/shm") / f"trainio-test-{uuid.uuid4().hex[:8]}.img"
    dev = None
    try:
        with open(backing, "wb") as f:
            if fill:
                chunk = os.urandom(1 << 20)
                for _ in range(size_mb):
                    f.write(chunk)
            else:
                f.truncate(size_mb << 20)
        cmd = ["losetup", "--find", "--show"]
        if direct_io:
            cmd.append("--direct-io=on")
        dev = run([*cmd, str(backing)], check=True).stdout.strip()
        yield dev
    finally:
        if dev:
            run(["losetup", "-d", dev])
        backing.unlink(missing_ok=True)


@contextlib.contextmanager
def mounted_loop_fs(size_mb: int) -> Iterator[tuple[str, str, Path]]:
    """ext4 on a loop_device() mounted under a temp dir. Yields (device, "MAJ:MIN", mount
    point); unmounted, detached and removed even on failure."""
    mnt = Path(tempfile.mkdtemp(prefix="trainio-mnt-"))
    try:
        with loop_device(size_mb) as dev:
            run(["mkfs.ext4", "-q", "-F", dev], check=True)
            run(["mount", dev, str(mnt)], check=True)
            try:
                yield dev, majmin(dev), mnt
            finally:
                run(["umount", str(mnt)])
    finally:
        shutil.rmtree(mnt, ignore_errors=True)


def majmin(dev: str) -> str:
    """`MAJ:MIN` of a block device node, as traces spell `dev`."""
    st = os.stat(dev)
    return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
