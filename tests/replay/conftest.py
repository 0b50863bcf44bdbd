"""Fixtures for the replayer's end-to-end tests: they drive the real binary through
bin/trainio, on tmpfs, and (as root) on a loop device throttled by a cgroup (v2 or v1)."""

from __future__ import annotations

import contextlib

import pytest

from trainio_testlib import mounted_loop_fs, require_root, throttled_cgroup


@pytest.fixture
def loop_fs():
    """An ext4 file system on a loop device over a file in /dev/shm, mounted under a temp
    dir. Yields (device, "MAJ:MIN", mount point). Everything is undone even on failure."""
    require_root("loop device, mount")
    with mounted_loop_fs(768) as fs:
        yield fs


@pytest.fixture
def throttle():
    """throttle(majmin, rbps, wbps=None) -> Throttle: a new cgroup whose reads (and writes, with
    wbps) of device `majmin` are capped, in bytes/s: cgroup v2 io.max where the v2 hierarchy
    has the io controller, else v1 blkio (trainio_testlib.throttled_cgroup). A machine with
    neither is an error, not a skip. Whatever is inside is killed and the group removed
    afterwards."""
    require_root("cgroups")
    with contextlib.ExitStack() as stack:
        yield lambda majmin, rbps, wbps=None: stack.enter_context(throttled_cgroup(majmin, rbps, wbps=wbps))
