"""Fixtures shared by every suite: loop devices, and the check that no trainio BPF program
outlives a root test. Helpers live in trainio_testlib.py."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainio_testlib import loop_device, wait_no_trainio_programs


@pytest.fixture(autouse=True)
def _no_bpf_leftovers(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every root test: no trainio BPF program or link may remain loaded."""
    yield
    if request.node.get_closest_marker("root") and os.geteuid() == 0 and shutil.which("bpftool"):
        left = wait_no_trainio_programs()
        assert not left, f"trainio BPF programs still loaded after the test: {left}"


@pytest.fixture
def loop_dev() -> Iterator[str]:
    """A 256 MiB loop device (direct I/O to its backing file in /dev/shm)."""
    if os.geteuid() != 0:
        pytest.fail("this test needs root (loop devices, BPF): run it as root")
    with loop_device(256) as dev:
        yield dev


@pytest.fixture
def tmpfs_dir() -> Iterator[Path]:
    """A directory on tmpfs (/dev/shm), removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="trainio-test-", dir="/dev/shm"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
