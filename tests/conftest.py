"""Fixtures shared by every suite: loop devices, and the check that no trainio BPF program
outlives a root test. Helpers live in trainio_testlib.py."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainio_testlib import loop_device, require_root, wait_no_trainio_programs


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked root fails before it starts when the tests do not run as root (the
    one root policy: never a skip; trainio_testlib.require_root)."""
    if item.get_closest_marker("root"):
        require_root("marked root: BPF, loop devices, mounts, cgroups or namespaces")


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
    require_root("loop devices, BPF")
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
