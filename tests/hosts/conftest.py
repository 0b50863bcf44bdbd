"""Fixtures for the multi-host tests: a test bed of hosts on one machine (testbed.py)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from testbed import TestBed


def need_testbed_tools() -> None:
    if os.geteuid() != 0:
        pytest.fail("the multi-host tests need root (network namespaces, loop devices)")
    missing = [t for t in ("ip", "unshare", "nsenter", "mpirun", "ssh", "ssh-keygen", "/usr/sbin/sshd")
               if not shutil.which(t)]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: run scripts/install-deps.sh (openssh-server, openmpi-bin)")


@pytest.fixture(scope="module")
def bed3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestBed]:
    """Hosts h1, h2, h3 with a shared 256 MiB ext4 file system (`bed3.shared`)."""
    need_testbed_tools()
    with TestBed(tmp_path_factory.mktemp("bed3"), 3) as bed:
        yield bed
