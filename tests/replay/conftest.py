"""Fixtures for the replayer's end-to-end tests: they drive the real binary through
bin/trainio, on tmpfs, and (as root) on a throttled loop device."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from trainio_testlib import mounted_loop_fs


@pytest.fixture
def tmpfs_dir():
    """A directory on tmpfs (/dev/shm), removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="trainio-replay-test-", dir="/dev/shm"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def loop_fs():
    """An ext4 file system on a loop device over a file in /dev/shm, mounted under a temp
    dir. Yields (device, "MAJ:MIN", mount point). Everything is undone even on failure."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    with mounted_loop_fs(768) as fs:
        yield fs


@pytest.fixture
def blkio_cgroup():
    """A cgroup-v1 blkio group; yields its directory, removed afterwards."""
    base = Path("/sys/fs/cgroup/blkio")
    if os.geteuid() != 0 or not (base / "cgroup.procs").exists():
        pytest.skip("needs root and cgroup-v1 blkio at /sys/fs/cgroup/blkio")
    cg = base / f"trainio-test-{os.getpid()}-{time.monotonic_ns()}"
    cg.mkdir()
    try:
        yield cg
    finally:
        # Anything still inside goes back to the root group so the directory can go.
        for _ in range(50):
            try:
                for pid in (cg / "cgroup.procs").read_text().split():
                    try:
                        (base / "cgroup.procs").write_text(pid)
                    except OSError:
                        pass
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.1)


