"""`trainio replay --trace` of a trace set opens each member's segments once (#34): the
last segment, whose metadata names the member's host and clock, is held open and its rows
read through that descriptor. Counted with strace on a set of two hosts (the two sample
traces); the replay reads the set's job model, then refuses --plan-only (a trace has no
checkpoint plan), so nothing is replayed and no data is laid out."""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from replay_helpers import ROOT, TRAINIO

_OPEN = re.compile(r'^\d+\s+(?:open|openat|openat2)\((?:[A-Z_]+|\d+), "([^"]+)"')


@pytest.fixture
def two_hosts(tmp_path: Path) -> Path:
    """The 1-GPU demo recorded on h1 and the 8-GPU demo on h2, 3 s apart."""
    job = tmp_path / "job"
    for host, src, offset in (("h1", "unet3d-demo-1gpu", 10**12), ("h2", "unet3d-demo-8gpu", 10**12 + 3 * 10**9)):
        (job / host).mkdir(parents=True)
        seg = ROOT / "traces" / src / "seg-000000.parquet"
        meta = dict(pq.read_metadata(seg).metadata)
        meta.update({b"trainio.hostname": host.encode(), b"trainio.clock_offset_ns": str(offset).encode()})
        pq.write_table(pq.read_table(seg).replace_schema_metadata(meta), job / host / seg.name)
    return job


def test_replay_of_a_set_opens_each_member_segment_once(tmp_path, two_hosts) -> None:
    if shutil.which("strace") is None:
        pytest.fail("strace is missing: scripts/install-deps.sh installs it")
    log = tmp_path / "replay.strace"
    child = subprocess.run(
        [
            *("strace", "-f", "-qq", "--seccomp-bpf", "-e", "trace=open,openat,openat2", "-o", str(log)),
            *(str(TRAINIO), "replay", "--trace", str(two_hosts), "--data-dir", str(tmp_path / "data"), "--plan-only"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    # the model was read (the refusal comes after it), and nothing was laid out
    assert child.returncode == 2, child.stderr
    assert "--plan-only plans checkpoints" in child.stderr, child.stderr
    assert not (tmp_path / "data").exists()
    segments = {str(p) for p in two_hosts.rglob("seg-*.parquet")}
    opens = collections.Counter({s: 0 for s in segments})
    for line in log.read_text().splitlines():
        m = _OPEN.match(line)
        if m and m.group(1) in segments:
            opens[m.group(1)] += 1
    assert len(opens) == 2 and set(opens.values()) == {1}, opens
