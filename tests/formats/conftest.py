"""The formats suites' file system: ext4 on a 256 MiB loop device, one per test module."""

from __future__ import annotations

import pytest

from trainio_testlib import mounted_loop_fs, require_root


@pytest.fixture(scope="module")
def fs():
    require_root("loop device, BPF")
    with mounted_loop_fs(256, quiet=True) as fs:
        yield fs
