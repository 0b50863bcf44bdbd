"""Fixtures of the analyzer tests; helpers are in analysis_helpers.py (importable by name,
unlike a conftest, which every suite has)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "analysis"))
sys.path.insert(0, str(HERE))


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A set of two hosts: the 1-GPU demo on h1, the 8-GPU demo on h2, 3 s apart."""
    import pyarrow.parquet as pq

    traces = HERE.parents[1] / "traces"
    job = tmp_path_factory.mktemp("set") / "job"
    for host, src, offset in (("h1", "unet3d-demo-1gpu", 10**12), ("h2", "unet3d-demo-8gpu", 10**12 + 3 * 10**9)):
        (job / host).mkdir(parents=True)
        seg = traces / src / "seg-000000.parquet"
        meta = dict(pq.read_metadata(seg).metadata)
        meta.update({b"trainio.hostname": host.encode(), b"trainio.clock_offset_ns": str(offset).encode()})
        pq.write_table(pq.read_table(seg).replace_schema_metadata(meta), job / host / seg.name)
    return job


@pytest.fixture
def trace_dir(tmp_path: Path) -> Path:
    return tmp_path / "trace"
