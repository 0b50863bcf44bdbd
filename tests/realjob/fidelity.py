"""The real job, its trace's job model, and its replay, side by side.

run_scenario() records the real PyTorch job (job.py through harness.run_job) on a
throttled or unthrottled loop device, asks `trainio analyze --json` for the job model,
replays the trace with `trainio replay --trace` at the recorded GPU count on the same
storage under the same throttle (and, when asked, at twice the GPUs), and returns every
figure: what the job says about itself, what the model infers, what the replay measures.
tests/realjob/test_model_replay.py asserts on them; tests/bench/bench_realjob.py prints
them as a table (`make bench-realjob`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import tempfile
from pathlib import Path

from harness import device_of, drop_caches, run_job, throttled_cgroup

from trainio_testlib import TRAINIO

MiB = 1 << 20


@dataclasses.dataclass
class Scenario:
    name: str
    regime: str  # compute-bound | storage-bound
    workers: int
    fmt: str  # npz | raw
    sample_bytes: int
    throttle_mib: int | None
    ranks: int = 2
    batch: int = 4
    compute_ms: float = 50.0
    steps: int = 40
    odirect: bool = False
    realtime: bool = False
    double: bool = False  # also replay at 2x the GPUs

    @property
    def files(self) -> int:
        return self.ranks * self.batch * (self.steps + 2)


def _replay(
    trace: Path, data_dir: Path, gpus: int, sc: Scenario, majmin: str, out: Path, record: Path | None = None
) -> dict:
    cmd = [
        str(TRAINIO),
        "replay",
        "--trace",
        str(trace),
        "--data-dir",
        str(data_dir),
        "--gpus",
        str(gpus),
        "--json",
        str(out),
        "-q",
    ]
    if sc.odirect:
        cmd.append("--odirect")
    if sc.realtime:
        cmd.append("--realtime")
    gen = [str(TRAINIO), "datagen", "--trace", str(trace), "--data-dir", str(data_dir), "--gpus", str(gpus), "--force"]
    g = subprocess.run(gen, capture_output=True, text=True, timeout=300)
    if g.returncode != 0:
        raise RuntimeError(f"datagen failed ({g.returncode}): {g.stderr[-3000:]}")
    drop_caches(data_dir)
    bps = sc.throttle_mib * MiB if sc.throttle_mib else None
    if record is not None:
        # the device's side of the replay (block layer only), to set against the job's
        cmd = [str(TRAINIO), "record", "--layers", "block", "--dev", majmin, "-o", str(record), "--", *cmd]
    with throttled_cgroup(majmin, bps) as th:
        p = subprocess.run(th.wrap(cmd), capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"replay failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-3000:]}")
    r = json.loads(out.read_text())
    r["_stderr"] = p.stderr
    return r


def _steady_mib_s(r: dict) -> float:
    """The replay's MiB/s over steps 2..n of each epoch, as job.py measures its own."""
    total_b, total_t = 0.0, 0.0
    for e in r["per_epoch"]:
        steps = r["steps"]
        frac = (steps - 1) / steps if steps > 1 else 1.0
        total_b += e["bytes_read"] * frac
        total_t += e["duration_s"] - e["first_step_s_max"]
    return total_b / MiB / total_t if total_t > 0 else 0.0


def _device_p50_us(trace: Path, majmin: str) -> float | None:
    """The median latency of the device's block reads in a trace (analyze's latency_us)."""
    a = subprocess.run(
        [str(TRAINIO), "analyze", str(trace), "--layer", "block", "--dev", majmin, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if a.returncode != 0:
        raise RuntimeError(f"analyze failed: {a.stderr}")
    return (json.loads(a.stdout).get("latency_us") or {}).get("p50")


def block_reads(trace: Path, majmin: str) -> dict:
    """The block-layer reads of one device in a trace: their bytes, and the MiB/s over the
    span in which the middle 98 % of those bytes completed (from the completion that
    takes the bytes past 1 % to the one that takes them past 99 %), so that start-up and
    the last stragglers weigh on neither run."""
    import numpy as np
    import polars as pl

    from trainio_analysis.trace import scan_trace

    df = (
        scan_trace(trace)
        .filter((pl.col("layer") == "block") & (pl.col("op") == "read") & (pl.col("dev") == majmin))
        .select("complete_ns", "bytes")
        .sort("complete_ns")
        .collect()
    )
    total = int(df["bytes"].sum()) if df.height else 0
    if total == 0:
        return {"bytes": 0, "mib_s": None}
    done = np.cumsum(df["bytes"].to_numpy())
    at = df["complete_ns"].to_numpy()
    lo = int(np.searchsorted(done, 0.01 * total))
    hi = int(np.searchsorted(done, 0.99 * total))
    span = (at[hi] - at[lo]) / 1e9
    return {"bytes": total, "mib_s": (done[hi] - done[lo]) / MiB / span if span > 0 else None}


def compare_blocks(a: Path, b: Path, majmin: str) -> dict:
    """`trainio compare --json` of two traces' block layer on one device (b against a)."""
    p = subprocess.run(
        [str(TRAINIO), "compare", "--json", "--layer", "block", "--dev", majmin, str(a), str(b)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if p.returncode != 0:
        raise RuntimeError(f"compare failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout)


MAPPED_PROGRAMS = ("filemap_fault", "filemap_map_pages", "mmap_enter", "mmap_exit", "madvise_enter", "madvise_exit")


def mapped_layer(trace: Path, job_wall_s: float) -> dict:
    """What the file layer's mapped reads (fault, map_pages, mmap, madvise) cost in a
    recording: the kernel's BPF statistics of their programs (trace metadata
    `bpf_stats`), their rows, and the job's wall time to set them against."""
    import polars as pl

    from trainio_analysis.trace import read_metadata, scan_trace

    stats = read_metadata(trace)["bpf_stats"]
    mine = {k: v for k, v in stats.items() if k.removeprefix("tio_") in MAPPED_PROGRAMS}
    rows = scan_trace(trace).filter(pl.col("op").is_in(["fault", "map_pages"])).select(pl.len()).collect().item()
    return {
        "runs": sum(v["run_cnt"] for v in mine.values()),
        "ns": sum(v["run_time_ns"] for v in mine.values()),
        "ns_per_run": {k.removeprefix("tio_"): v["ns_per_run"] for k, v in mine.items() if v["run_cnt"]},
        "rows": rows,
        "job_wall_s": job_wall_s,
    }


def run_scenario(
    sc: Scenario, mnt: Path, *, record_replay: bool = False, reference: bool = False, keep: Path | None = None
) -> dict:
    """Runs one scenario on the file system mounted at `mnt` (data set in mnt/<sc.name>).
    With `record_replay`, the replay at the recorded GPU count runs under `trainio record`
    (block layer, the data's device) and the result has both runs' median block-read
    latency on that device: whether the storage served the two alike, and both runs'
    block reads there (block_reads) with the replay's scored against the job's
    (compare_blocks). With `reference` (and `record_replay`), the job runs a second time
    after the replay and `job_b` has its figures and its block reads against the first
    run's: the spread between two runs of the job itself. With `keep`, the
    traces and JSON outputs go to that directory (created) and stay there, the job's own
    figures among them (job.json: its per-step waits and step ends, CLOCK_MONOTONIC as the
    traces' times, to set against the traces)."""
    data = mnt / sc.name
    majmin = device_of(data)
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    with contextlib.nullcontext(str(keep)) if keep else tempfile.TemporaryDirectory(prefix="trainio-fidelity-") as tmp:
        tmp = Path(tmp)
        trace = tmp / "trace"

        def record_job(out: Path) -> dict:
            return run_job(
                data,
                ranks=sc.ranks,
                workers=sc.workers,
                batch=sc.batch,
                compute_ms=sc.compute_ms,
                fmt=sc.fmt,
                odirect=sc.odirect,
                throttle_bps=sc.throttle_mib * MiB if sc.throttle_mib else None,
                record_dir=out,
                steps=sc.steps,
                realtime=sc.realtime,
            ).job

        job = record_job(trace)
        (tmp / "job.json").write_text(json.dumps(job))
        mapped = mapped_layer(trace, job["wall_s"])
        a = subprocess.run(
            [str(TRAINIO), "analyze", str(trace), "--layer", "file", "--json"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if a.returncode != 0:
            raise RuntimeError(f"analyze failed: {a.stderr}")
        analysis = json.loads(a.stdout)
        (tmp / "analysis.json").write_text(a.stdout)
        model = analysis["job_model"]
        replay_dir = mnt / f"{sc.name}-replay"
        rep = _replay(
            trace,
            replay_dir,
            sc.ranks,
            sc,
            majmin,
            tmp / "replay.json",
            tmp / "replay-trace" if record_replay else None,
        )
        dev_p50 = (
            (_device_p50_us(trace, majmin), _device_p50_us(tmp / "replay-trace", majmin)) if record_replay else None
        )
        blocks = None
        if record_replay:
            blocks = {
                "job": block_reads(trace, majmin),
                "replay": block_reads(tmp / "replay-trace", majmin),
                "compare": compare_blocks(trace, tmp / "replay-trace", majmin),
            }
        rep2 = None
        if sc.double:
            rep2 = _replay(trace, replay_dir, 2 * sc.ranks, sc, majmin, tmp / "replay2.json")
        subprocess.run(["rm", "-rf", str(replay_dir)], check=True)
        job_b = None
        if reference:
            # The job again, after its replay: how far two runs of the job itself are apart
            # on this host, the spread a replay's errors are held to beyond the target.
            job_b = record_job(tmp / "trace-b")
            job_b["blocks"] = block_reads(tmp / "trace-b", majmin)
            job_b["compare"] = compare_blocks(trace, tmp / "trace-b", majmin)
            job_b["device_p50_us"] = _device_p50_us(tmp / "trace-b", majmin)
    record = job["record_bytes"]
    want_req = record * sc.batch / (sc.compute_ms / 1000) / MiB
    gpus = model["gpus"]
    return {
        "scenario": sc,
        "job": job,
        "model": model,
        "analysis_steps": analysis["steps"],
        "replay": rep,
        "replay2": rep2,
        "gpus_found": len(gpus),
        "compute_ms": [g["compute_s"] * 1e3 if g["compute_s"] is not None else None for g in gpus],
        "required_mib_s": [g["required_mib_s"] for g in gpus],
        "required_true_mib_s": want_req,
        "job_mib_s": job["mib_per_s"],
        "job_au_percent": job["au"] * 100,
        # the model's view of the recording: DLIO's AU over the recorded steps with the
        # inferred compute (what the trace says the job's AU was)
        "model_au_percent": 100 * sum(g["au_recorded"] or 0 for g in gpus) / max(len(gpus), 1),
        "replay_mib_s": _steady_mib_s(rep),
        "replay_au_percent": rep["au_percent"],
        "replay_bytes": rep["bytes_read"],
        "replay2_bytes": rep2["bytes_read"] if rep2 else None,
        "recorded_bytes": sum(g["bytes"] for g in gpus),
        # median block-read latency on the data's device, job and replay (record_replay)
        "device_p50_us": dev_p50,
        # record_replay: the device's block reads in the job and in the replay
        # (block_reads) and the replay's block layer scored against the job's
        "blocks": blocks,
        # the mapped-read programs' cost in the job's recording (mapped_layer)
        "mapped_layer": mapped,
        # reference: the second run of the job (its JSON, its blocks, scored against the
        # first, its median block-read latency on the data's device)
        "job_b": job_b,
    }
