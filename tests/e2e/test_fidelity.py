"""Issue #6: a trace replayed at the recorded GPU count on the same storage reproduces
the original: throughput within ±5 %, AU within ±2 points, per-issue block-layer queue
depth histogram within W1 1.0.

Real everything: a loop device over /dev/shm with ext4, an emulated training at 4 GPUs
(one MPI rank per GPU, psync reads, O_DIRECT) recorded with bin/trainio record, its
trace replayed at 4 GPUs with --record, scored by `trainio compare --json`."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from trainio_testlib import fidelity_run

GPUS = 4


@pytest.fixture
def work():
    d = Path(tempfile.mkdtemp(prefix="trainio-fidelity-"))
    try:
        yield d / "run"
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.root
@pytest.mark.slow
def test_replay_at_the_recorded_gpu_count_reproduces_the_original(work):
    if os.geteuid() != 0:
        pytest.fail("needs root (loop device, BPF)")
    r = fidelity_run(GPUS, work)
    orig, rep, cmp_ = r["original"], r["replay"], r["compare"]
    # The experiment is what it claims: the trace had one template per recorded GPU, the
    # replay read every recorded byte, and there were enough requests to score.
    templates = rep["settings"]["templates"]
    assert len(templates) == GPUS and rep["gpus"] == GPUS
    assert rep["bytes_read"] == orig["bytes_read"]
    assert cmp_["layer"] == "block"
    blocks = cmp_["bytes_read"]
    # A block completion the kernel did not hand to the probe (docs/design/recorder.md) is counted
    # by the recorder; a trace that counts none must hold every byte read.
    missing = {
        k: sum(n for p, n in m["lost_events"].items() if p.startswith("block_rq_complete:"))
        for k, m in r["meta"].items()
    }
    if not any(missing.values()):
        assert blocks["a"] == blocks["b"] == orig["bytes_read"], f"the block layer saw other reads: {r['meta']}"
    else:
        assert max(blocks["a"], blocks["b"]) <= orig["bytes_read"], r["meta"]
        print(f"completions the traces lack, as they say: {missing}")
    assert orig["gpu_steps"] * 4 >= 300  # reads of 1 MiB: a few hundred requests at least
    detail = f"\ncompare: {cmp_}\nAU {orig['au_percent']:.2f} vs {rep['au_percent']:.2f}"
    assert abs(cmp_["throughput_rel_error"]) <= 0.05, detail
    assert abs(rep["au_percent"] - orig["au_percent"]) <= 2.0, detail
    assert cmp_["qd_w1_issue"] <= 1.0, detail
    # The replay's read syscalls are the recorded ones, size for size. Block requests may
    # split differently (the replay reads its own copies, laid out in other extents).
    assert r["compare_file"]["size_w1_log2"] <= 0.01, r["compare_file"]
    assert cmp_["size_w1_log2"] <= 1.0, detail
