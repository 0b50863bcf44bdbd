"""Issue #6: a trace replayed at the recorded GPU count on the same storage reproduces
the original: throughput within ±5 %, AU within ±2 points, per-issue block-layer queue
depth histogram within W1 1.0.

Real everything: a loop device over /dev/shm with ext4, an emulated training at 4 GPUs
(one MPI rank per GPU, psync reads or io_uring requests, O_DIRECT) recorded with bin/trainio record, its
trace replayed at 4 GPUs with --record, scored by `trainio compare --json`.

Two runs of the same job on this 2-core host do not give the same scores: between two
recordings of the original, the per-issue QD W1 was 0.28-0.71 and the throughput 0.7-4.4 %
apart (6 runs with other builds on the host), and a fresh machine's run once scored the
replay at W1 1.71. So the original is recorded twice, around the replay, and each score
is the replay's against the nearer of the two, held to the target plus the two originals'
own distance measured in the same run: a replay that is as faithful as a third run of
the job passes however loaded the host is, one that is not fails.

``TRAINIO_FIDELITY_KEEP=DIR`` keeps each run's traces and JSON files in DIR (one directory
per test and run) for a look afterwards."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from trainio_testlib import fidelity_run, require_root

GPUS = 4
#: Per-issue QD W1 held per I/O engine: the issue's target (1) for both. io_uring
#: requests are stamped at their submission, and a rank's first can wait milliseconds
#: before the device sees it; the model times them by their block-layer arrivals
#: (model/src/async_reads.rs), so the replay staggers the GPUs' prefetch fills as the job
#: did. The replay against the nearer original scored 0.10-0.88 in 12 runs (the two
#: originals 0.19-0.84 apart; docs/measurements.md).
QD_W1 = {"psync": 1.0, "io_uring": 1.0}


@pytest.fixture
def work(request):
    d = Path(tempfile.mkdtemp(prefix="trainio-fidelity-"))
    try:
        yield d / "run"
    finally:
        keep = os.environ.get("TRAINIO_FIDELITY_KEEP")
        if keep and (d / "run").exists():
            name = f"{request.node.name}-{time.strftime('%Y%m%dT%H%M%S')}".replace("[", "-").replace("]", "")
            shutil.copytree(d / "run", Path(keep) / name)
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("io_engine", ["psync", "io_uring"])
def test_replay_at_the_recorded_gpu_count_reproduces_the_original(work, io_engine):
    """psync: each rank's 4 reader threads in read syscalls. io_uring: each rank's one
    thread keeps up to 4 requests in flight while it computes, recorded with
    `--io-uring`; the model sees the overlapping requests of one thread, counts its
    streams and paces by its step period (model/src/async_reads.rs)."""
    require_root("loop device, BPF")
    r = fidelity_run(GPUS, work, reference=True, io_engine=io_engine)
    orig, rep, cmp_ = r["original"], r["replay"], r["compare"]
    # The experiment is what it claims: the trace had one template per recorded GPU, the
    # replay read every recorded byte, and there were enough requests to score.
    templates = rep["settings"]["templates"]
    assert len(templates) == GPUS and rep["gpus"] == GPUS
    assert all(t["readers"] == 4 and not t["synchronous"] for t in templates), templates
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
    ref, cmp_b, orig_b = r["compare_reference"], r["compare_b"], r["original_b"]
    detail = (
        f"\ncompare: {cmp_}\nagainst the second original: {cmp_b}\nthe two originals: {ref}"
        f"\nAU {orig['au_percent']:.2f} / {orig_b['au_percent']:.2f} vs {rep['au_percent']:.2f}"
    )

    print(
        f"\n{io_engine}: qd_w1_issue replay {cmp_['qd_w1_issue']:.3f} / {cmp_b['qd_w1_issue']:.3f}"
        f" (originals {ref['qd_w1_issue']:.3f} apart); throughput {cmp_['throughput_rel_error']:+.4f}"
        f" / {cmp_b['throughput_rel_error']:+.4f} (originals {ref['throughput_rel_error']:+.4f})"
    )

    def nearer(score) -> float:
        return min(abs(score(cmp_)), abs(score(cmp_b)))

    spread_tput = abs(ref["throughput_rel_error"])
    spread_au = abs(orig_b["au_percent"] - orig["au_percent"])
    assert nearer(lambda c: c["throughput_rel_error"]) <= 0.05 + spread_tput, detail
    au = min(abs(rep["au_percent"] - orig["au_percent"]), abs(rep["au_percent"] - orig_b["au_percent"]))
    assert au <= 2.0 + spread_au, detail
    assert nearer(lambda c: c["qd_w1_issue"]) <= QD_W1[io_engine] + ref["qd_w1_issue"], detail
    # The replay's read syscalls are the recorded ones, size for size. Block requests may
    # split differently (the replay reads its own copies, laid out in other extents).
    assert r["compare_file"]["size_w1_log2"] <= 0.01, r["compare_file"]
    assert cmp_["size_w1_log2"] <= 1.0, detail
