"""The object layer (schema 1.8) against a real S3 server and a real S3 client: boto3
puts, gets (whole and ranged), heads and misses objects on the test S3 server under `trainio record
--layers file,object`, and the recorded requests are compared with what boto3 did, as
the client itself logged it: count, methods, keys, Range offsets and lengths, bytes,
statuses, latency, and the endpoint's queue depth under 8 concurrent GETs."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import polars as pl
import pytest
from s3_helpers import VIRTUAL_DOMAIN, S3Server

from trainio_analysis.trace import SCHEMA_MINOR, read_metadata, scan_trace
from trainio_testlib import TRAINIO, trainio, wait_no_trainio_programs

pytestmark = [pytest.mark.root]

# The client logs each request it makes as boto3 returned it: (op, key, offset,
# length asked, body bytes, status).
CLIENT = r"""
import json, os, sys, threading
from concurrent.futures import ThreadPoolExecutor
import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

endpoint, log_path, concurrent = sys.argv[1], sys.argv[2], int(sys.argv[3])
s3 = boto3.client(
    "s3",
    endpoint_url=endpoint,
    region_name="us-east-1",
    config=Config(
        s3={"addressing_style": "path"},
        retries={"max_attempts": 1},
        max_pool_connections=16,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    ),
)
log = []
sizes = {"bkt/small.bin": 65_536, "bkt/dir/big.bin": 3 << 20, "bkt/odd name.bin": 1000}
for key, size in sizes.items():
    body = os.urandom(size)
    r = s3.put_object(Bucket="bkt", Key=key.split("/", 1)[1], Body=body)
    log.append(("put", key, None, size, size, r["ResponseMetadata"]["HTTPStatusCode"]))

def get(key, rng=None):
    kw = {"Range": rng} if rng else {}
    r = s3.get_object(Bucket="bkt", Key=key.split("/", 1)[1], **kw)
    data = r["Body"].read()
    return r["ResponseMetadata"]["HTTPStatusCode"], len(data)

status, n = get("bkt/dir/big.bin")
log.append(("get", "bkt/dir/big.bin", None, 3 << 20, n, status))
status, n = get("bkt/dir/big.bin", "bytes=1000-100999")
log.append(("get", "bkt/dir/big.bin", 1000, 100_000, n, status))
status, n = get("bkt/small.bin", "bytes=4096-")
log.append(("get", "bkt/small.bin", 4096, 65_536 - 4096, n, status))
status, n = get("bkt/odd name.bin")
log.append(("get", "bkt/odd name.bin", None, 1000, n, status))
r = s3.head_object(Bucket="bkt", Key="small.bin")
log.append(("head", "bkt/small.bin", None, 65_536, 0, r["ResponseMetadata"]["HTTPStatusCode"]))
try:
    s3.get_object(Bucket="bkt", Key="missing.bin")
    sys.exit("a missing key was found")
except ClientError as e:
    log.append(("get", "bkt/missing.bin", None, None, None, e.response["ResponseMetadata"]["HTTPStatusCode"]))

# Concurrent whole-object GETs from a pool of threads, released together.
barrier = threading.Barrier(concurrent)
def one(i):
    barrier.wait()
    return get("bkt/dir/big.bin")
with ThreadPoolExecutor(concurrent) as pool:
    for status, n in pool.map(one, range(concurrent)):
        log.append(("get", "bkt/dir/big.bin", None, 3 << 20, n, status))
json.dump(log, open(log_path, "w"))
"""


def _record_client(tmp_path: Path, s3: S3Server, concurrent: int) -> tuple[Path, list[list]]:
    s3.bucket("bkt")
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    log, out = tmp_path / "client.json", tmp_path / "trace"
    env = {**s3.env(), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    rec = trainio(
        "record",
        "--layers",
        "file,object",
        "-o",
        out,
        "--",
        sys.executable,
        script,
        s3.endpoint,
        log,
        str(concurrent),
        env=env,
        timeout=240,
    )
    assert rec.returncode == 0, rec.stderr[-3000:]
    assert wait_no_trainio_programs() == []
    return out, json.loads(log.read_text())


def test_boto3_requests_are_recorded_as_the_client_made_them(tmp_path: Path, s3_server: S3Server) -> None:
    concurrent = 8
    out, log = _record_client(tmp_path, s3_server, concurrent)
    meta = read_metadata(out)
    assert meta["schema_minor"] == SCHEMA_MINOR
    assert "object" in meta["layers"]
    assert all(v == 0 for v in meta["lost_events"].values()), meta["lost_events"]
    rows = scan_trace(out).filter(pl.col("layer") == "object").sort("issue_ns").collect()
    port = s3_server.endpoint.rsplit(":", 1)[1]
    assert set(rows["endpoint"]) == {f"127.0.0.1:{port}"}

    # One row per request boto3 made, no more: the same multiset of what each asked and got.
    def key(op, file, offset, requested, moved, status):
        return (op, file, offset, requested, moved, status)

    got = sorted(
        (key(*r) for r in rows.select("op", "file", "offset", "bytes_requested", "bytes", "http_status").iter_rows()),
        key=repr,
    )
    missing = next(r for r in rows.iter_rows(named=True) if r["file"] == "bkt/missing.bin")
    want = sorted(
        (
            key(op, file, offset, requested, moved, status)
            if file != "bkt/missing.bin"
            # The 404's body is S3's XML error document: its bytes are the response's own.
            else key(op, file, offset, missing["bytes_requested"], missing["bytes_requested"], status)
            for op, file, offset, requested, moved, status in log
        ),
        key=repr,
    )
    assert got == want
    assert missing["http_status"] == 404 and missing["bytes"] > 0
    assert (rows["error"] == 0).all(), rows.filter(pl.col("error") != 0)
    assert rows["pid"].n_unique() == 1

    # Latency: first byte after the issue, completion not before the first byte.
    ttfb = rows["first_byte_ns"] - rows["issue_ns"]
    assert (ttfb > 0).all()
    assert (rows["complete_ns"] >= rows["first_byte_ns"]).all()
    assert (rows["complete_ns"] > rows["issue_ns"]).all()

    # The sequential requests see only themselves outstanding; the pool's overlap.
    seq = rows.head(len(log) - concurrent)
    assert (seq["queue_depth"] == 1).all(), seq.select("op", "file", "queue_depth")
    pooled = rows.tail(concurrent)
    assert pooled["queue_depth"].max() > 1, pooled.select("issue_ns", "complete_ns", "queue_depth")
    # The depth at each issue is what the rows' own intervals say.
    issue, done = pooled["issue_ns"].to_list(), pooled["complete_ns"].to_list()
    for i, t in enumerate(issue):
        expect = 1 + sum(1 for j in range(len(issue)) if j != i and issue[j] < t < done[j])
        assert pooled["queue_depth"][i] == expect
    # The requests share keep-alive connections: fewer sockets than requests.
    assert rows["fd"].n_unique() <= concurrent + 1 < len(rows)

    # analyze and report show them per endpoint.
    res = trainio("analyze", out, "--json")
    assert res.returncode == 0, res.stderr
    ep = json.loads(res.stdout)["object_requests"]["endpoints"][f"127.0.0.1:{port}"]
    assert ep["requests"] == len(rows) and ep["incomplete"] == 0
    assert ep["by_status"] == {"200": len(rows) - 3, "206": 2, "404": 1}
    assert ep["qd_max"] == rows["queue_depth"].max() > 1
    assert ep["bytes_written"] == sum(r[4] for r in log if r[0] == "put")
    assert ep["latency_us"]["max"] == (rows["complete_ns"] - rows["issue_ns"]).max() / 1e3
    assert max(ep["timeline"]["qd_mean"]) > 1
    res = trainio("analyze", out)
    assert res.returncode == 0, res.stderr
    assert f"object       {len(rows)} HTTP requests" in res.stdout
    assert f"127.0.0.1:{port}" in res.stdout and "status 200 14, 206 2, 404 1" in res.stdout
    html = tmp_path / "report.html"
    res = trainio("report", out, "-o", html)
    assert res.returncode == 0, res.stderr
    text = html.read_text()
    assert "Object requests (HTTP, per endpoint)" in text and 'id="object-outstanding"' in text


def test_object_without_file_is_refused(tmp_path: Path) -> None:
    r = trainio("record", "--layers", "block,object", "-o", tmp_path / "t", "--", "true")
    assert r.returncode == 2
    assert "object" in r.stderr and "file" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "t").exists()


def test_the_replays_own_s3_reads_are_recorded_as_it_counted_them(tmp_path: Path, s3_server: S3Server) -> None:
    """trainio replay of MLPerf's s3torchconnector unet3d file (ranged 8 MiB GETs, a
    sample's parts at once) recorded: its GETs of the dataset are the replay's own count."""
    from test_s3 import MPI_ENV, run, scaled, workload

    bucket, files, record, gpus = "mlp-s3torch", 4, 12 * (1 << 20), 2
    s3_server.bucket(bucket)
    over = scaled(s3_server, files, record)
    wl = "unet3d_h100_s3torch"
    run(
        s3_server,
        "datagen",
        "--workload",
        workload(f"{wl}_datagen.yaml"),
        "--data-dir",
        tmp_path / "u",
        "--gpus",
        gpus,
        *over,
    )
    out, res = tmp_path / "trace", tmp_path / "r.json"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_ENDPOINT"))},
        **MPI_ENV,
        **s3_server.env(),
    }
    rec = trainio(
        "record",
        "--layers",
        "file,object",
        "-o",
        out,
        "--",
        TRAINIO,
        "replay",
        "--workload",
        workload(f"{wl}.yaml"),
        "--data-dir",
        tmp_path / "u",
        "--gpus",
        gpus,
        "--epochs",
        1,
        "--computation-time",
        "0.01",
        "--json",
        res,
        "-q",
        *over,
        env=env,
        timeout=300,
    )
    assert rec.returncode == 0, rec.stderr[-3000:]
    o = json.loads(res.read_text())["object"]
    rows = scan_trace(out).filter(pl.col("layer") == "object").collect()
    data = rows.filter((pl.col("op") == "get") & pl.col("file").str.starts_with(f"{bucket}/test-run/unet3d/train/"))
    # each of the 4 objects is 12 MiB + the npz header: 2 parts of 8 MiB
    assert o["get_requests"] == 2 * files, o
    assert data.height == o["get_requests"] and data["offset"].is_not_null().sum() == o["ranged_get_requests"]
    assert data["bytes"].sum() == o["bytes_read"]
    assert (data["http_status"] == 206).all() and (data["error"] == 0).all()
    assert (data["bytes"] == data["bytes_requested"]).all()
    assert data["queue_depth"].max() >= 2, "the replay fetches a sample's parts at once"


# A virtual-hosted client: the bucket in the Host (BUCKET.s3.trainio.test:PORT), the key
# alone in the path. Names under the test domain resolve to 127.0.0.1 in this process only.
VIRTUAL_CLIENT = r"""
import json, os, socket, sys
import boto3
from botocore.config import Config

domain, port, log_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
resolve = socket.getaddrinfo
def getaddrinfo(host, *args, **kw):
    return resolve("127.0.0.1" if str(host).endswith("." + domain) else host, *args, **kw)
socket.getaddrinfo = getaddrinfo
s3 = boto3.client(
    "s3",
    endpoint_url=f"http://{domain}:{port}",
    region_name="us-east-1",
    config=Config(
        s3={"addressing_style": "virtual"},
        retries={"max_attempts": 1},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    ),
)
log = []
s3.put_object(Bucket="vbkt", Key="dir/a.bin", Body=os.urandom(200_000))
log.append(("put", "vbkt/dir/a.bin", None, 200_000))
r = s3.get_object(Bucket="vbkt", Key="dir/a.bin")
log.append(("get", "vbkt/dir/a.bin", None, len(r["Body"].read())))
r = s3.get_object(Bucket="vbkt", Key="dir/a.bin", Range="bytes=1000-50999")
log.append(("get", "vbkt/dir/a.bin", 1000, len(r["Body"].read())))
keys = [o["Key"] for o in s3.list_objects_v2(Bucket="vbkt")["Contents"]]
assert keys == ["dir/a.bin"], keys
log.append(("get", "vbkt", None, None))
json.dump(log, open(log_path, "w"))
"""


def test_virtual_hosted_requests_name_the_bucket_from_the_host(tmp_path: Path, s3_virtual_server: S3Server) -> None:
    s3 = s3_virtual_server
    s3.bucket("vbkt")
    port = s3.endpoint.rsplit(":", 1)[1]
    script, log, out = tmp_path / "client.py", tmp_path / "client.json", tmp_path / "trace"
    script.write_text(VIRTUAL_CLIENT)
    env = {**s3.env(), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    env.pop("AWS_ENDPOINT_URL")
    rec = trainio(
        "record", "--layers", "file,object", "-o", out, "--", sys.executable, script, VIRTUAL_DOMAIN, port, log, env=env
    )
    assert rec.returncode == 0, rec.stderr[-3000:]
    assert wait_no_trainio_programs() == []
    # The server stored the object in the bucket the Host named.
    assert s3.files_on_disk("vbkt") == {"dir/a.bin": 200_000}
    rows = scan_trace(out).filter(pl.col("layer") == "object").sort("issue_ns").collect()
    want = json.loads(log.read_text())
    got = rows.select("op", "file", "offset", "bytes").rows()
    assert [tuple(r[:3]) for r in got] == [tuple(w[:3]) for w in want], got
    assert [r[3] for r in got[:3]] == [w[3] for w in want[:3]]
    assert rows["http_status"].to_list() == [200, 200, 206, 200]
    assert set(rows["endpoint"]) == {f"127.0.0.1:{port}"}
