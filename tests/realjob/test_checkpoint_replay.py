"""A real job that reads its data and saves checkpoints mid-training, recorded and replayed.

job.py at 2 ranks (torchrun, gloo all-reduce per step, inline DataLoader, 1 MiB samples, 50 ms compute)
saves a checkpoint every 4 steps: torch.save of 32 MiB per rank, then fsync, on ext4 over
a loop device, its writes capped at 64 MiB/s by a cgroup (the fsync's writeback, so that
the device and not the page cache sets the checkpoint's pace; the replay under the same
cap). `trainio replay --trace` (psync reads, so its own recording has them at
the file layer) replays it at the recorded GPU count and records itself. Then:

- the job's trace holds every checkpoint at the file layer, each rank's bytes exactly,
  placed after the step it followed, with its fsync;
- the replay's trace has the write bursts of the same bytes (within 1 %) after the same
  bytes read (within 1 %: the same steps; the step index inferred from the replay's own
  trace within one), with fsyncs, and every file it wrote lies under --data-dir;
- `trainio compare` reports the replay's write bytes within 5 % of the job's, and its
  MiB/s while writing within 5 % plus the job's own spread (a second run of it).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import dataset_fs, device_of, drop_caches, run_job, throttled_cgroup

from trainio_testlib import TRAINIO, require_root

# isort: split
import polars as pl

from trainio_analysis.trace import scan_trace

MiB = 1 << 20
RANKS, BATCH, STEPS, EVERY, CKPT_MIB = 2, 4, 26, 4, 32
WRITE_CAP = 64 * MiB  # bytes/s: the job's and the replay's writes to the device
SAMPLE = MiB
SYNCS = ("fsync", "fdatasync", "sync_file_range")


def trainio_json(*args: str) -> dict:
    p = subprocess.run([str(TRAINIO), *args, "--json"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def placed_bytes(model: dict) -> dict[int, int]:
    """Step -> bytes the GPUs wrote after it (bursts inside the training)."""
    out: dict[int, int] = defaultdict(int)
    for g in model["gpus"]:
        for b in g["write_bursts"]:
            if b["after_step"] is not None:
                out[b["after_step"]] += b["bytes"]
    return dict(out)


def checkpoint_marks(trace: Path, model: dict) -> list[tuple[int, int, int]]:
    """The checkpoints in a trace, in time order: (step the model places it after, bytes
    of data read on the data device before it began, bytes written). A checkpoint is the
    GPUs' write bursts after a step that overlap in time (the ranks save at once), of at
    least 1 MiB (the job's last step also carries a few KiB of small writes: its own files
    and the replay's outputs)."""
    bursts = sorted(
        (b for g in model["gpus"] for b in g["write_bursts"] if b["after_step"] is not None),
        key=lambda b: b["start_ns"],
    )
    groups: list[list[dict]] = []
    for b in bursts:
        if groups and b["start_ns"] <= max(x["end_ns"] for x in groups[-1]):
            groups[-1].append(b)
        else:
            groups.append([b])
    reads = (
        scan_trace(trace)
        .filter((pl.col("layer") == "file") & (pl.col("op") == "read") & (pl.col("dev") == model["data_dev"]))
        .select("complete_ns", "bytes")
        .collect()
    )
    out = []
    for group in groups:
        wrote = sum(b["bytes"] for b in group)
        if wrote < MiB:
            continue
        start = min(b["start_ns"] for b in group)
        step = min(b["after_step"] for b in group)
        out.append((step, int(reads.filter(pl.col("complete_ns") <= start)["bytes"].sum()), wrote))
    return out


@pytest.mark.root
@pytest.mark.slow
def test_checkpoints_of_a_real_job_are_replayed_after_their_steps(tmp_path: Path) -> None:
    require_root("loop devices, cgroups, BPF")
    n_files = RANKS * BATCH * (STEPS + 2)
    checkpoints = STEPS // EVERY
    slack = 2 * (n_files * SAMPLE + checkpoints * RANKS * CKPT_MIB * MiB) // MiB + 96
    with dataset_fs({"data": (n_files, SAMPLE, "npz")}, slack_mb=slack) as (_dev, _mm, mnt):
        trace, replay_trace = tmp_path / "job", tmp_path / "replay"
        ckdir = mnt / "checkpoints"

        def recorded_job(record_dir: Path):
            return run_job(
                mnt / "data",
                ranks=RANKS,
                workers=0,
                batch=BATCH,
                compute_ms=50,
                fmt="npz",
                record_dir=record_dir,
                steps=STEPS,
                throttle_wbps=WRITE_CAP,
                extra=(
                    *("--checkpoint-every", str(EVERY), "--checkpoint-dir", str(ckdir)),
                    *("--checkpoint-mib", str(CKPT_MIB)),
                ),
            )

        run = recorded_job(trace)
        saves = [c for r in run.job["ranks"] for c in r["checkpoints"]]
        steps = [EVERY * (k + 1) for k in range(checkpoints)]
        assert sorted({c["step"] for c in saves}) == steps and len(saves) == checkpoints * RANKS
        saved: dict[int, int] = defaultdict(int)
        for c in saves:
            saved[c["step"]] += c["bytes"]

        # The job's trace: each checkpoint's bytes exactly, after its step, with fsync.
        a = trainio_json("analyze", str(trace), "--layer", "file")
        model = a["job_model"]
        assert len(model["gpus"]) == RANKS, model
        got = placed_bytes(model)
        for step, nbytes in saved.items():
            assert got.get(step) == nbytes, (step, got, saved)
        for g in model["gpus"]:
            for b in g["write_bursts"]:
                if b["after_step"] in saved:
                    assert b["syncs"] >= 1, b
        assert a["write_bursts"]["bytes"] >= sum(saved.values())

        # The replay, recorded, at the recorded GPU count on the same file system.
        data_dir = mnt / "replay"
        gen = subprocess.run(
            [str(TRAINIO), "datagen", "--trace", str(trace), "--data-dir", str(data_dir), "--gpus", str(RANKS)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert gen.returncode == 0, gen.stderr
        drop_caches(data_dir)
        cmd = [
            str(TRAINIO),
            "replay",
            "--trace",
            str(trace),
            "--data-dir",
            str(data_dir),
            "--gpus",
            str(RANKS),
            "--io-engine",
            "psync",
            "--record",
            str(replay_trace),
            "--json",
            str(tmp_path / "replay.json"),
            "-q",
        ]
        with throttled_cgroup(device_of(data_dir), None, wbps=WRITE_CAP) as th:
            rep = subprocess.run(th.wrap(cmd), capture_output=True, text=True, timeout=600)
        assert rep.returncode == 0, rep.stderr
        result = json.loads((tmp_path / "replay.json").read_text())
        assert result["writes"]["bytes"] == sum(
            b["bytes"] for g in model["gpus"] for b in g["write_bursts"] if b["after_step"] is not None
        )

        b = trainio_json("analyze", str(replay_trace), "--layer", "file")
        replayed = placed_bytes(b["job_model"])
        print(f"\njob writes after steps {dict(got)}; replay {replayed}")
        # Each checkpoint comes after the same data was read: the bytes read before it are
        # the job's, checkpoint for checkpoint, and it writes the job's bytes. The step it
        # follows in the replay's trace is inferred from that trace's gaps, which a loaded
        # host can split once: within one step of the job's.
        job_ck, rep_ck = checkpoint_marks(trace, model), checkpoint_marks(replay_trace, b["job_model"])
        print(f"checkpoints (step, bytes read before, bytes written): job {job_ck}; replay {rep_ck}")
        assert len(rep_ck) == len(job_ck) == len(saved), (job_ck, rep_ck)
        for (js, jread, jwrote), (rs, rread, rwrote) in zip(job_ck, rep_ck):
            assert rread == pytest.approx(jread, rel=0.01), (job_ck, rep_ck)
            assert rwrote == pytest.approx(jwrote, rel=0.01), (job_ck, rep_ck)
            assert abs(rs - js) <= 1, (job_ck, rep_ck)

        rows = scan_trace(replay_trace).filter(pl.col("layer") == "file").collect()
        writes = rows.filter((pl.col("op") == "write") & (pl.col("bytes") > 0) | pl.col("op").is_in(SYNCS))
        # Besides --data-dir, only the results file the replay was told to write (--json,
        # through a temporary file beside it that is renamed into place).
        results = re.compile(re.escape(str(tmp_path)) + r"/(replay\.json|\.replay\.json\.tmp-\d+)$")
        outside = [
            f
            for f in writes["file"].unique().to_list()
            if not str(f).startswith(f"{data_dir}/") and not results.match(str(f))
        ]
        assert outside == [], f"the replay wrote outside --data-dir: {outside}"
        assert rows.filter(pl.col("op") == "fsync").height >= len(saves)
        job_rows = scan_trace(trace).filter((pl.col("layer") == "file") & (pl.col("op") == "fsync")).collect()
        assert job_rows["file"].str.starts_with(str(ckdir)).sum() == len(saves)

        c = trainio_json("compare", str(trace), str(replay_trace), "--layer", "file")
        w = c["writes"]
        print(
            f"compare writes: bytes A {w['bytes']['a']} B {w['bytes']['b']} "
            f"({w['bytes_rel_error']:+.3%}); MiB/s A {w['mib_s']['a']:.1f} B {w['mib_s']['b']:.1f} "
            f"({w['mib_s_rel_error']:+.2%})"
        )
        assert abs(w["bytes_rel_error"]) <= 0.05
        # The job's own spread, from a second run of it: its MiB/s while writing moves
        # with the page cache's writeback (57.6-61.3 MiB/s under the 64 MiB/s cap).
        again = tmp_path / "again"
        recorded_job(again)
        spread = abs(trainio_json("compare", str(trace), str(again), "--layer", "file")["writes"]["mib_s_rel_error"])
        print(f"the job again: MiB/s while writing {spread:.2%} from its first run")
        assert abs(w["mib_s_rel_error"]) <= 0.05 + spread
