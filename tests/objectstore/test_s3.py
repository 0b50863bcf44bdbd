"""Replay, datagen and checkpoints on S3, against a real S3 server (tests/s3server, conftest.py):
MLPerf Storage v3.0's object-mode workload files, scaled down by overrides."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from s3_helpers import S3Server

from trainio_testlib import ROOT, trainio

# MLPerf Storage v3.0's object-mode files, copied as published (shared/dlio-configs/
# mlperf-storage-v3, RULES.md §6): checked against the shared copy when it is there.
DATA = Path(__file__).resolve().parent / "data"
SHARED = ROOT.parent / "shared" / "dlio-configs" / "mlperf-storage-v3"
# OpenMPI refuses root without these; harmless otherwise.
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
MIB = 1 << 20


def run(server: S3Server, *args: str, env: dict[str, str] | None = None, check: bool = True):
    full = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_ENDPOINT"))}
    full.update(MPI_ENV)
    full.update(server.env() if env is None else env)
    p = trainio(*map(str, args), env=full, timeout=300)
    if check:
        assert p.returncode == 0, f"trainio {' '.join(map(str, args))} exited {p.returncode}:\n{p.stderr}"
    return p


def workload(name: str) -> Path:
    path = DATA / name
    original = SHARED / name
    if original.exists():
        assert original.read_bytes() == path.read_bytes(), f"{path} differs from {original}"
    return path


def scaled(server: S3Server, files: int, record: int) -> list[str]:
    """Overrides that shrink a v3.0 unet3d object workload and point it at the test server
    (the files name a lab endpoint over https with secure: false)."""
    return [
        f"++workload.storage.storage_options.endpoint_url={server.endpoint}",
        f"++workload.dataset.num_files_train={files}",
        f"++workload.dataset.record_length_bytes={record}",
        "++workload.dataset.record_length_bytes_stdev=0",
        "++workload.reader.batch_size=2",
    ]


def test_the_server_checks_signatures(s3_server: S3Server) -> None:
    bucket = s3_server.bucket("probe")
    assert s3_server.list(bucket) == {}
    status, body = s3_server.request("GET", f"/{bucket}", {"list-type": "2"}, secret="not-the-secret")
    assert status == 403, (status, body[:200])
    status, _ = s3_server.request("HEAD", "/no-such-bucket")
    assert status == 404


@pytest.mark.parametrize(
    ("library", "datagen_file", "train_file", "bucket"),
    [
        ("minio", "unet3d_h100_minio_datagen.yaml", "unet3d_h100_minio.yaml", "mlp-minio"),
        ("s3torchconnector", "unet3d_h100_s3torch_datagen.yaml", "unet3d_h100_s3torch.yaml", "mlp-s3torch"),
    ],
)
def test_datagen_puts_every_object_and_replay_reads_them_as_the_library_does(
    s3_server: S3Server, tmp_path: Path, library: str, datagen_file: str, train_file: str, bucket: str
) -> None:
    s3_server.bucket(bucket)
    files, record, gpus, epochs = 8, 12 * MIB, 2, 2
    over = scaled(s3_server, files, record)
    p = run(
        s3_server,
        "datagen",
        "--workload",
        workload(datagen_file),
        "--data-dir",
        tmp_path / "unused",
        "--gpus",
        gpus,
        *over,
    )
    assert f"{files} objects" in p.stderr and f"s3://{bucket}/test-run/unet3d" in p.stderr, p.stderr
    listed = s3_server.list(bucket, "test-run/unet3d/train/")
    assert len(listed) == files, listed
    sizes = list(listed.values())
    assert all(record < s < record + 4096 + 1024 for s in sizes), sizes  # an npz of one 12 MiB sample
    # Objects above the library's multipart threshold went up in parts (an S3 multipart
    # ETag ends in -<parts>): minio-py's 5 MiB parts, the CRT's 8 MiB.
    part = 5 * MIB if library == "minio" else 8 * MIB
    for key, size in listed.items():
        etag = s3_server.etag(bucket, key)
        assert etag.endswith(f"-{-(-size // part)}"), (key, etag)
    assert s3_server.files_on_disk(bucket) == listed, "the listing is what the server stored"
    assert not (tmp_path / "unused").exists(), "object storage writes nothing under --data-dir"

    out = tmp_path / "r.json"
    run(
        s3_server,
        "replay",
        "--workload",
        workload(train_file),
        "--data-dir",
        tmp_path / "unused",
        "--gpus",
        gpus,
        "--epochs",
        epochs,
        "--computation-time",
        "0.01",
        "--json",
        out,
        "-q",
        *over,
    )
    j = json.loads(out.read_text())
    o = j["object"]
    total = sum(sizes)
    # unet3d: one sample per object, each GPU's shard of 4 objects read whole every epoch.
    assert o["bytes_read"] == total * epochs, (o, total)
    if library == "minio":
        assert o["get_requests"] == files * epochs and o["ranged_get_requests"] == 0, o
    else:
        parts = sum(-(-s // (8 * MIB)) for s in sizes)
        assert o["get_requests"] == o["ranged_get_requests"] == parts * epochs, o
        assert o["max_outstanding_requests"] >= 2, "the CRT fetches a sample's parts at once"
    assert o["put_requests"] == 0 and o["bytes_written"] == 0
    lat = o["get_latency"]
    assert 0 < lat["p50_ms"] <= lat["p90_ms"] <= lat["p99_ms"] <= lat["max_ms"], lat
    assert 0 < j["au_percent"] <= 100 and len(j["au_per_gpu"]) == gpus
    st = j["settings"]["storage"]
    assert (
        st["library"] == library
        and st["uri"] == f"s3://{bucket}/test-run/unet3d"
        and st["endpoint"] == s3_server.endpoint
    )


def test_a_checkpoint_to_s3_writes_the_planned_bytes_and_reads_them_back(s3_server: S3Server, tmp_path: Path) -> None:
    s3_server.bucket("chckpt-test1")
    out = tmp_path / "c.json"
    small = {
        "model.num_layers": 2,
        "model.transformer.hidden_size": 512,
        "model.transformer.ffn_hidden_size": 1024,
        "model.transformer.vocab_size": 4096,
        "checkpoint.num_checkpoints_write": 1,
        "checkpoint.num_checkpoints_read": 1,
        "checkpoint.time_between_checkpoints": 0,
        "storage.storage_options.endpoint_url": s3_server.endpoint,
    }
    params = [a for k, v in small.items() for a in ("--param", f"{k}={v}")]
    run(
        s3_server,
        "replay",
        "--workload",
        workload("llama3_8b_checkpoint_minio.yaml"),
        "--data-dir",
        tmp_path / "unused",
        "--gpus",
        8,
        "--json",
        out,
        "-q",
        *params,
    )
    j = json.loads(out.read_text())
    c = j["checkpoint"]
    planned = c["planned_bytes"]
    listed = s3_server.list("chckpt-test1", "minio/llama3-8b/global_epoch1_step1/")
    assert len(listed) == c["files"] == 16, listed  # model and optimizer state of 8 ranks
    assert sum(listed.values()) == planned
    assert c["writes"][0]["bytes"] == c["reads"][0]["bytes"] == planned
    o = j["object"]
    assert o["bytes_written"] == o["bytes_read"] == planned, o
    # minio-py: each shard above 5 MiB is a multipart upload; the rest single PUTs.
    big = [s for s in listed.values() if s > 5 * MIB]
    assert all(
        s3_server.etag("chckpt-test1", k).endswith(f"-{-(-s // (5 * MIB))}") for k, s in listed.items() if s > 5 * MIB
    )
    assert o["multipart_uploads"] == len(big) > 0, o
    assert o["put_requests"] == sum(-(-s // (5 * MIB)) for s in big) + (len(listed) - len(big)), o
    assert j["settings"]["storage"]["uri"] == "s3://chckpt-test1"


def _refused(server: S3Server, tmp_path: Path, env: dict[str, str], *extra: str) -> str:
    p = run(
        server,
        "replay",
        "--workload",
        workload("unet3d_h100_minio.yaml"),
        "--data-dir",
        tmp_path / "d",
        "--gpus",
        1,
        "--generate",
        *scaled(server, 4, 1 * MIB)[1:],
        *extra,
        env=env,
        check=False,
    )
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, (p.returncode, p.stderr)
    assert not (tmp_path / "d").exists()
    return lines[0]


def test_bad_endpoint_bucket_or_credentials_are_one_line_before_any_work(s3_server: S3Server, tmp_path: Path) -> None:
    s3_server.bucket("mlp-minio")
    env = s3_server.env()
    # The file's own endpoint (https, secure: false) is a lab address: the environment's is
    # used only when the file gives none, so these runs point the file at the test server.
    at = f"++workload.storage.storage_options.endpoint_url={s3_server.endpoint}"
    closed = f"http://127.0.0.1:{_closed_port()}"
    line = _refused(s3_server, tmp_path, env, f"++workload.storage.storage_options.endpoint_url={closed}")
    assert f"S3 endpoint {closed}: cannot connect" in line, line
    line = _refused(s3_server, tmp_path, {**env, "AWS_SECRET_ACCESS_KEY": "wrong"}, at)
    assert "credentials" in line and "refused for bucket mlp-minio" in line, line
    line = _refused(s3_server, tmp_path, {k: v for k, v in env.items() if k != "AWS_SECRET_ACCESS_KEY"}, at)
    assert "no S3 credentials" in line and "AWS_SECRET_ACCESS_KEY" in line, line
    line = _refused(s3_server, tmp_path, env, at, "++workload.storage.storage_root=no-such-bucket")
    assert "s3://no-such-bucket: no such bucket" in line, line
    line = _refused(
        s3_server,
        tmp_path,
        env,
        "++workload.storage.storage_options.endpoint_url=https://127.0.0.1:1",
        "++workload.storage.storage_options.secure=true",
    )
    assert "S3 endpoint https://127.0.0.1:1: cannot connect" in line, line
    assert s3_server.list("mlp-minio") == {}, "nothing was written"


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_s3dlio_files_take_the_endpoint_and_keys_from_the_environment(s3_server: S3Server, tmp_path: Path) -> None:
    """MLPerf's test_unet3d_*_s3.yaml: s3dlio, bucket/prefix as storage_root, empty keys and
    endpoint in the file (so the environment's), and the train file's keys under reader:."""
    s3_server.bucket("pr1-test-bucket")
    files, gpus = 6, 2
    over = [f"++workload.dataset.num_files_train={files}", "++workload.dataset.record_length_bytes=1048576"]
    run(
        s3_server,
        "datagen",
        "--workload",
        workload("test_unet3d_datagen_s3.yaml"),
        "--data-dir",
        tmp_path / "u",
        "--gpus",
        gpus,
        *over,
    )
    listed = s3_server.list("pr1-test-bucket", "unet3d/train/")
    assert len(listed) == files, listed
    # s3dlio puts objects up to 32 MiB in one request: no multipart ETag.
    assert all("-" not in s3_server.etag("pr1-test-bucket", k) for k in listed)
    out = tmp_path / "r.json"
    run(
        s3_server,
        "replay",
        "--workload",
        workload("test_unet3d_train_s3.yaml"),
        "--data-dir",
        tmp_path / "u",
        "--gpus",
        gpus,
        "--json",
        out,
        "-q",
        *over,
    )
    j = json.loads(out.read_text())
    # batch 2 over 3 objects per GPU: one step per GPU, 2 objects each, one whole-object GET each.
    assert j["object"]["get_requests"] == gpus * 2 and j["object"]["ranged_get_requests"] == 0, j["object"]
    # Whole objects (the file keeps a 1 MiB size spread): 4 of the 6 listed sizes.
    sizes = sorted(listed.values())
    assert sum(sizes[:4]) <= j["object"]["bytes_read"] == j["bytes_read"] <= sum(sizes[-4:])
    assert (
        j["settings"]["storage"]["library"] == "s3dlio" and j["settings"]["storage"]["endpoint"] == s3_server.endpoint
    )
