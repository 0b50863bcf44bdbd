"""A real PyTorch job that reads its samples from S3 and saves its checkpoints to S3,
recorded, and its PUTs replayed.

tests/realjob/job.py (one rank, 2 DataLoader workers reading samples with boto3's
`get_object`) saves a checkpoint every 4 steps to the same server with boto3: the
training state (`torch.save`, 7 MiB) with `upload_fileobj`, a multipart upload of 5 MiB
parts two at a time, and a small meta object with one `put_object`. `trainio record
--layers file,object` records it. Then:

- the object layer holds the job's PUTs: one row per part and per PutObject, with the
  bytes the job put (±1 %), and a create and a complete per upload;
- the job model has the rank's checkpoints as write bursts after steps 4, 8 and 12;
- `trainio replay --trace --storage-root BUCKET` puts them again into another bucket,
  each under its GPU copy's folder (`trace/c00000/ckpt/rank0-step4.pt`): the same
  objects and bytes (±1 %) with the same part counts, which the server's directory holds
  afterwards, and the results' `writes` and `object` sections count them; at 2 GPUs each
  copy puts its own;
- without --storage-root the same objects are written as files under --data-dir.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl
import pytest
from s3_helpers import S3Server, put_random_objects, replay_env, run_job

from trainio_analysis.trace import scan_trace
from trainio_testlib import ROOT, TRAINIO, trainio, wait_no_trainio_programs

pytestmark = [pytest.mark.root]

JOB = ROOT / "tests" / "realjob" / "job.py"
PYTHON = ROOT / ".venv" / "bin" / "python"
MIB = 1 << 20
WORKERS, BATCH, STEPS, EVERY = 2, 4, 12, 4
SAMPLE = 64 << 10
STATE_MIB = 7.0  # torch.save of 7 MiB: a multipart upload of a 5 MiB part and the rest
DATA_BUCKET, PREFIX, CKPT, REPLAY_BUCKET = "train", "samples", "ckpt", "replay"


def _put_samples(s3: S3Server, n: int) -> None:
    put_random_objects(s3, DATA_BUCKET, PREFIX, n, SAMPLE)


def _record_job(tmp: Path, s3: S3Server) -> tuple[Path, dict]:
    trace, out = tmp / "trace", tmp / "job.json"
    cmd = [
        str(TRAINIO),
        "record",
        "--layers",
        "file,object",
        "-o",
        str(trace),
        "--",
        str(PYTHON),
        str(JOB),
        "--data",
        f"{DATA_BUCKET}/{PREFIX}",
        "--format",
        "s3",
        "--batch-size",
        str(BATCH),
        "--num-workers",
        str(WORKERS),
        "--steps",
        str(STEPS),
        "--compute-ms",
        "100",
        "--checkpoint-every",
        str(EVERY),
        "--checkpoint-s3",
        f"{DATA_BUCKET}/{CKPT}",
        "--checkpoint-mib",
        str(STATE_MIB),
        "--out",
        str(out),
    ]
    env = {**os.environ, **s3.env(), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    run_job(cmd, env)
    assert wait_no_trainio_programs() == []
    return trace, json.loads(out.read_text())


def _replay(s3: S3Server, trace: Path, gpus: int, data_dir: Path, out: Path, *extra: str) -> dict:
    env = replay_env(s3)
    r = trainio(
        "replay",
        "--trace",
        trace,
        "--gpus",
        gpus,
        "--data-dir",
        data_dir,
        "--generate",
        "--json",
        out,
        "-q",
        *extra,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text())


def test_a_jobs_checkpoints_to_s3_are_recorded_and_put_again(tmp_path: Path, s3_server: S3Server) -> None:
    n = BATCH * STEPS + BATCH * WORKERS * 2  # the workers prefetch past the last step
    s3_server.bucket(DATA_BUCKET)
    s3_server.bucket(REPLAY_BUCKET)
    _put_samples(s3_server, n)
    trace, job = _record_job(tmp_path, s3_server)
    saved = job["ranks"][0]["checkpoints"]
    assert [c["step"] for c in saved] == [4, 8, 12], saved
    objects = {o["key"]: o for c in saved for o in c["objects"]}
    big = {k: o for k, o in objects.items() if o["parts"]}
    assert len(objects) == 6 and len(big) == 3, objects
    assert all(o["parts"] == 2 for o in big.values()), "7 MiB in 5 MiB parts"
    put_bytes = sum(o["bytes"] for o in objects.values())

    # The object layer: a row per part and PutObject, a create and a complete per upload.
    rows = scan_trace(trace).filter(pl.col("layer") == "object").collect()
    mine = rows.filter(pl.col("file").str.starts_with(f"{DATA_BUCKET}/{CKPT}/") & (pl.col("http_status") == 200))
    puts, posts = mine.filter(pl.col("op") == "put"), mine.filter(pl.col("op") == "post")
    assert len(puts) == 3 * (2 + 1), puts.select("file", "bytes")
    assert len(posts) == 2 * 3, posts.select("file", "bytes")
    assert posts.filter(pl.col("bytes") == 0)["file"].sort().to_list() == sorted(big), "CreateMultipartUpload"
    assert puts["bytes"].sum() == pytest.approx(put_bytes, rel=0.01)
    assert (puts.group_by("file").agg(pl.col("bytes").sum()).sort("file")["bytes"].to_list()) == [
        objects[k]["bytes"] for k in sorted(objects)
    ]

    # The job model: the checkpoints are the GPU's write bursts after steps 4, 8 and 12.
    a = trainio("analyze", trace, "--json")
    assert a.returncode == 0, a.stderr
    model = json.loads(a.stdout)["job_model"]
    assert model["data_dev"].endswith(f"/{DATA_BUCKET}"), model["data_dev"]
    (g,) = model["gpus"]
    bursts = g["write_bursts"]
    assert [b["after_step"] for b in bursts] == [4, 8, 12], bursts
    per_step = {c["step"]: c["bytes"] for c in saved}
    assert [b["bytes"] for b in bursts] == [per_step[s] for s in (4, 8, 12)]
    assert [(b["writes"], b["files"]) for b in bursts] == [(3, 2)] * 3, "2 parts and a PutObject, 2 objects"

    # replay --trace at the recorded GPU count, against S3.
    data = tmp_path / "unused"
    rep = _replay(s3_server, trace, 1, data, tmp_path / "r1.json", "--storage-root", REPLAY_BUCKET)
    w = rep["writes"]
    assert w["bursts"] == 3 and w["files"] == 6, w
    assert w["bytes"] == pytest.approx(put_bytes, rel=0.01), (w["bytes"], put_bytes)
    assert w["by_step"] == {f"1:{s}": per_step[s] for s in (4, 8, 12)}
    assert w["duration_s"] > 0
    # The requests: --generate's PUTs of the samples, and the checkpoints' parts and PUTs.
    samples = s3_server.list(REPLAY_BUCKET, f"trace/c00000/{DATA_BUCKET}/{PREFIX}/")
    o = rep["object"]
    assert o["multipart_uploads"] == 3 and o["put_requests"] == len(samples) + 3 * (2 + 1), o
    assert o["bytes_written"] == sum(samples.values()) + w["bytes"], o
    # Each under the copy's folder and the recorded bucket/key, as the copy's samples are.
    listed = s3_server.list(REPLAY_BUCKET, f"trace/c00000/{DATA_BUCKET}/{CKPT}/")
    want = {f"trace/c00000/{k}": obj["bytes"] for k, obj in objects.items()}
    assert listed == want, (listed, want)
    on_disk = s3_server.files_on_disk(REPLAY_BUCKET)
    assert {k: on_disk.get(k) for k in want} == want, "the server's directory holds them"
    for k, obj in objects.items():
        etag = s3_server.etag(REPLAY_BUCKET, f"trace/c00000/{k}")
        assert etag.endswith("-2") if obj["parts"] else "-" not in etag, (k, etag)
    assert not data.exists(), "nothing is written under --data-dir"

    # Twice the GPUs: the second copy puts its own.
    rep = _replay(s3_server, trace, 2, data, tmp_path / "r2.json", "--storage-root", REPLAY_BUCKET)
    assert rep["writes"]["bytes"] == 2 * w["bytes"] and rep["object"]["multipart_uploads"] == 6
    listed = s3_server.list(REPLAY_BUCKET, f"trace/c00001/{DATA_BUCKET}/{CKPT}/")
    assert listed == {k.replace("c00000", "c00001"): s for k, s in want.items()}

    # Without an object store: the objects as files under --data-dir.
    files = tmp_path / "files"
    rep = _replay(s3_server, trace, 1, files, tmp_path / "f1.json")
    assert rep["writes"]["bytes"] == w["bytes"] and rep["writes"]["files"] == 6
    written = {
        p.relative_to(files).as_posix(): p.stat().st_size
        for p in (files / "trace" / "c00000" / DATA_BUCKET / CKPT).rglob("*")
        if p.is_file()
    }
    assert written == want, written
    assert rep.get("object") is None
