"""A real PyTorch job that reads its samples from S3, recorded, modeled and replayed
against S3.

tests/realjob/job.py with `--format s3` runs under torchrun at 2 ranks (gloo all-reduce
per step, a sleep per step as the accelerator), 2 DataLoader workers per rank, each
worker reading samples from the test S3 server with boto3: even-numbered samples with one whole
`get_object`, odd-numbered ones in ranged GETs. `trainio record --layers file,object`
records it. Then:

- the object layer has one row per GET the job made, and their bytes are the bytes the
  job counted (its own log);
- the job model finds the 2 ranks as GPUs, each with its 2 workers, names the object
  store as the data source, and infers the compute per step within 5 % of the job's
  measured sleep;
- `trainio replay --trace --storage-root BUCKET --generate` lays the job's objects out in
  another bucket of the same server and replays them at 2 GPUs: MiB/s within 5 % and AU
  within 2 points of the job's own figures, the same GETs (whole and ranged) as the
  job's, and request latency percentiles; at 4 GPUs it reads twice the bytes;
- a bucket that does not exist is refused with one line, exit 2, before any work.

In the first test the job is compute-bound (600 ms per step against a few ms of GETs and
handoff per batch), so its AU and throughput are set by its compute; the replay runs
`--realtime` so that its compute sleeps end on time on the shared host. What the two runs
spend per step outside the compute differs by a few ms (the model keeps a collective's own
time, not a rank's wait for a late peer, and counts the rank's Python around the sleep as
compute): under 1 % of the step here.

In the second the same job is storage-bound: the server passes its response bodies at
STORAGE_MIB_S (trainio-s3server's `--egress-mib-s`, one link shared by every connection)
and the compute is STORAGE_COMPUTE_MS per step, so each step waits for its GETs. Both
tests need the server to send without Nagle's algorithm (tests/s3server sets TCP_NODELAY):
with it on, boto3 loses a delayed ACK (~40 ms) on about a third of its GETs where the
replay's client (TCP_QUICKACK) loses none, and the job reads slower than its replay for a
reason in its own kernel, not in the store (docs/measurements.md, *S3 GET latency*).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import polars as pl
import pytest
from s3_helpers import S3Server, put_random_objects, replay_env, run_job

from trainio_analysis.trace import scan_trace
from trainio_testlib import ROOT, TRAINIO, trainio, wait_no_trainio_programs

pytestmark = [pytest.mark.root]

JOB = ROOT / "tests" / "realjob" / "job.py"
TORCHRUN = ROOT / ".venv" / "bin" / "torchrun"
MIB = 1 << 20
RANKS, WORKERS, BATCH, STEPS = 2, 2, 4, 16
SAMPLE = 256 << 10
PART = 96 << 10  # odd samples: ranged GETs of 96, 96 and 64 KiB
COMPUTE_MS = 600.0
# The storage-bound case (its test's doc): the server's rate, the compute per step, steps.
STORAGE_MIB_S, STORAGE_COMPUTE_MS, STORAGE_STEPS = 4.0, 100.0, 24
DATA_BUCKET, PREFIX, REPLAY_BUCKET = "train", "samples", "replay"


def _put_samples(s3: S3Server, n: int) -> None:
    put_random_objects(s3, DATA_BUCKET, PREFIX, n, SAMPLE)


def _record_job(
    tmp: Path, s3: S3Server, compute_ms: float = COMPUTE_MS, *, record: bool = True, name: str = "job"
) -> tuple[Path, dict]:
    """Runs the job under `trainio record` (or, with record=False, as it is); returns the
    trace and the job's own figures."""
    trace, out = tmp / f"{name}-trace", tmp / f"{name}.json"
    recorder = [str(TRAINIO), "record", "--layers", "file,object", "-o", str(trace), "--"] if record else []
    cmd = [
        *recorder,
        str(TORCHRUN),
        "--standalone",
        f"--nproc-per-node={RANKS}",
        str(JOB),
        "--data",
        f"{DATA_BUCKET}/{PREFIX}",
        "--format",
        "s3",
        "--s3-part",
        str(PART),
        "--batch-size",
        str(BATCH),
        "--num-workers",
        str(WORKERS),
        "--compute-ms",
        str(compute_ms),
        "--out",
        str(out),
    ]
    env = {**os.environ, **s3.env(), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    run_job(cmd, env)
    if record:
        assert wait_no_trainio_programs() == []
    return trace, json.loads(out.read_text())


def _replay(s3: S3Server, trace: Path, gpus: int, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = replay_env(s3)
    return trainio(
        "replay",
        "--trace",
        trace,
        "--gpus",
        gpus,
        "--data-dir",
        out.parent / "unused",
        "--json",
        out,
        "-q",
        *extra,
        env=env,
        timeout=300,
    )


def _steady_mib_s(r: dict) -> float:
    """The replay's MiB/s over steps 2..n, as job.py measures its own."""
    b = t = 0.0
    for e in r["per_epoch"]:
        b += e["bytes_read"] * (r["steps"] - 1) / r["steps"]
        t += e["duration_s"] - e["first_step_s_max"]
    return b / MIB / t


def test_a_job_reading_s3_is_modeled_and_replayed_against_s3(tmp_path: Path, s3_server: S3Server) -> None:
    n = RANKS * BATCH * STEPS
    s3_server.bucket(DATA_BUCKET)
    s3_server.bucket(REPLAY_BUCKET)
    _put_samples(s3_server, n)
    trace, job = _record_job(tmp_path, s3_server)
    assert job["world_size"] == RANKS and job["steps"] == RANKS * STEPS
    assert job["bytes_read"] == n * SAMPLE

    # One object row per GET the job made: a whole GET per even sample, 3 ranged per odd.
    rows = scan_trace(trace).filter(pl.col("layer") == "object").collect()
    gets = rows.filter((pl.col("op") == "get") & pl.col("file").str.starts_with(f"{DATA_BUCKET}/{PREFIX}/"))
    whole, ranged = gets.filter(pl.col("offset").is_null()), gets.filter(pl.col("offset").is_not_null())
    assert len(whole) == n // 2 and len(ranged) == 3 * (n // 2), (len(whole), len(ranged))
    assert gets["file"].n_unique() == n
    assert (gets["http_status"].is_in([200, 206])).all() and (gets["error"] == 0).all()
    assert gets["bytes"].sum() == pytest.approx(job["bytes_read"], rel=0.01)
    assert sorted(set(ranged["bytes"])) == [SAMPLE - 2 * PART, PART]

    # The job model: 2 GPUs of a rank and its 2 workers, reading from the object store.
    a = trainio("analyze", trace, "--json")
    assert a.returncode == 0, a.stderr
    model = json.loads(a.stdout)["job_model"]
    port = s3_server.endpoint.rsplit(":", 1)[1]
    assert model["data_dev"] == f"s3://127.0.0.1:{port}/{DATA_BUCKET}"
    store = model["object_store"]
    assert store["endpoint"] == f"127.0.0.1:{port}" and store["bucket"] == DATA_BUCKET
    assert store["requests"] == len(gets) and store["bytes"] == gets["bytes"].sum()
    assert model["incomplete"] is None
    gpus = model["gpus"]
    assert len(gpus) == RANKS, [g["members"] for g in gpus]
    assert sorted(g["bytes"] for g in gpus) == [n * SAMPLE // RANKS] * RANKS
    for g, rank in zip(gpus, sorted(job["ranks"], key=lambda r: r["rank"])):
        assert g["workers"] == WORKERS and g["step_signal"] == "handoff", g["members"]
        assert STEPS <= len(g["steps"]) <= STEPS + WORKERS, len(g["steps"])
        assert g["bytes_per_step"] == pytest.approx(BATCH * SAMPLE, rel=0.05)
        slept_ms = rank["compute_s"] / (rank["steps"] - 1) * 1e3
        assert g["compute_s"] * 1e3 == pytest.approx(slept_ms, rel=0.05), (g["compute_s"], slept_ms)
    text = trainio("analyze", trace)
    assert f"data from object store s3://127.0.0.1:{port}/{DATA_BUCKET}" in text.stdout, text.stdout

    # A bucket that is not there: one line, exit 2, nothing put or written.
    bad = _replay(s3_server, trace, RANKS, tmp_path / "bad.json", "--storage-root", "nosuchbucket", "--generate")
    assert bad.returncode == 2, bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "nosuchbucket" in bad.stderr, bad.stderr
    assert not (tmp_path / "bad.json").exists() and not (tmp_path / "unused").exists()

    # replay --trace at the recorded GPU count, against S3.
    out = tmp_path / "r2.json"
    r = _replay(s3_server, trace, RANKS, out, "--storage-root", REPLAY_BUCKET, "--generate", "--realtime")
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    keys = sorted(
        p.relative_to(s3_server.root / REPLAY_BUCKET).as_posix()
        for p in (s3_server.root / REPLAY_BUCKET).rglob("*.bin")
    )
    assert keys == sorted(f"trace/c00000/{f}" for f in gets["file"].unique()), keys[:3]
    o = rep["object"]
    assert rep["bytes_read"] == o["bytes_read"] == job["bytes_read"]
    assert o["get_requests"] == len(gets) and o["ranged_get_requests"] == len(ranged), o
    lat = o["get_latency"]
    assert 0 < lat["p50_ms"] <= lat["p90_ms"] <= lat["p99_ms"] <= lat["max_ms"], lat
    assert rep["settings"]["storage"]["uri"] == f"s3://{REPLAY_BUCKET}"
    assert _steady_mib_s(rep) == pytest.approx(job["mib_per_s"], rel=0.05), (_steady_mib_s(rep), job["mib_per_s"])
    assert abs(rep["au_percent"] - 100 * job["au"]) <= 2.0, (rep["au_percent"], job["au"])

    # Twice the GPUs: each copy of the objects read once, twice the bytes.
    out4 = tmp_path / "r4.json"
    r = _replay(s3_server, trace, 2 * RANKS, out4, "--storage-root", REPLAY_BUCKET, "--generate")
    assert r.returncode == 0, r.stderr
    rep4 = json.loads(out4.read_text())
    assert rep4["bytes_read"] == rep4["object"]["bytes_read"] == 2 * job["bytes_read"]
    assert rep4["object"]["get_requests"] == 2 * len(gets)
    assert not (tmp_path / "unused").exists(), "nothing is written under --data-dir"


@pytest.mark.slow
def test_a_storage_bound_s3_job_is_replayed_at_its_own_rate_and_au(tmp_path: Path, s3_server_with) -> None:
    """The same job made storage-bound: the server passes STORAGE_MIB_S of response bodies,
    all connections together, and the compute is short, so the job waits for its GETs.
    Recorded, then run again unrecorded (how much the job's own figures vary from run to
    run, which widens the margins), then replayed at its GPU count against the same
    server: MiB/s within 5 % and AU within 2 points of the recorded run's, plus that spread."""
    s3 = s3_server_with(egress_mib_s=STORAGE_MIB_S)
    n = RANKS * BATCH * STORAGE_STEPS
    s3.bucket(DATA_BUCKET)
    s3.bucket(REPLAY_BUCKET)
    _put_samples(s3, n)
    trace, job = _record_job(tmp_path, s3, STORAGE_COMPUTE_MS)
    _, again = _record_job(tmp_path, s3, STORAGE_COMPUTE_MS, record=False, name="again")
    assert job["bytes_read"] == again["bytes_read"] == n * SAMPLE

    out = tmp_path / "r2.json"
    r = _replay(s3, trace, RANKS, out, "--storage-root", REPLAY_BUCKET, "--generate", "--realtime")
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    assert rep["bytes_read"] == rep["object"]["bytes_read"] == job["bytes_read"]
    mib, au = _steady_mib_s(rep), rep["au_percent"]
    detail = (
        f"job {job['mib_per_s']:.2f} MiB/s AU {100 * job['au']:.1f} % (again {again['mib_per_s']:.2f} MiB/s"
        f" AU {100 * again['au']:.1f} %), replay {mib:.2f} MiB/s AU {au:.1f} %; GET p50"
        f" {rep['object']['get_latency']['p50_ms']:.1f} ms"
    )
    print(detail)
    # Storage-bound: the ranks wait for their batches longer than they compute, and the
    # server's rate bounds what they read. (Steps 2..n also count what a rank's workers
    # fetched during step 1, up to a batch each: hence the upper bound's allowance.)
    over = 1 + WORKERS / (STORAGE_STEPS - 1)
    for k in (job, again):
        assert sum(x["io_wait_s"] for x in k["ranks"]) > sum(x["compute_s"] for x in k["ranks"]), detail
        assert 0.5 * STORAGE_MIB_S < k["mib_per_s"] <= over * STORAGE_MIB_S, detail
    spread_mib = abs(again["mib_per_s"] / job["mib_per_s"] - 1)
    spread_au = abs(100 * again["au"] - 100 * job["au"])
    assert abs(mib / job["mib_per_s"] - 1) <= 0.05 + spread_mib, detail
    assert abs(au - 100 * job["au"]) <= 2.0 + spread_au, detail
