"""Fixtures for the multi-host tests: a test bed of hosts on one machine (testbed.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from testbed import TestBed, need_testbed_tools


@pytest.fixture(scope="module")
def bed3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestBed]:
    """Hosts h1, h2, h3 with a shared 256 MiB ext4 file system (`bed3.shared`)."""
    need_testbed_tools()
    with TestBed(tmp_path_factory.mktemp("bed3"), 3) as bed:
        yield bed
