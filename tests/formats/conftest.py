"""The formats suites' file system: ext4 on a 256 MiB loop device, one per test module."""

from __future__ import annotations

import os

import pytest

from trainio_testlib import mounted_loop_fs


@pytest.fixture(scope="module")
def fs():
    if os.geteuid() != 0:
        pytest.fail("needs root (loop device, BPF)")
    with mounted_loop_fs(256, quiet=True) as fs:
        yield fs
