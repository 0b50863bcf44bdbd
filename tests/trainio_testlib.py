"""Helpers shared by every suite (imported by tests/conftest.py and the tests): the entry
point, loop devices, BPF program checks. Named uniquely: every suite has a conftest."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
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


def trainio_programs() -> list[str]:
    """Names of loaded BPF programs that belong to trainio."""
    out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=True)
    return [p.get("name", "") for p in json.loads(out.stdout or "[]") if p.get("name", "").startswith(BPF_PREFIX)]


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
