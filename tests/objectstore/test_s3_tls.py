"""The replay's S3 client over HTTPS: datagen and replay of MLPerf's minio unet3d files
against the test S3 server behind stunnel (conftest.py, a CA made for the test, given as
AWS_CA_BUNDLE), and a CA bundle that is bad or does not sign the server's certificate
refused in one line, exit 2, before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

from s3_helpers import S3Server
from test_s3 import MIB, _refused, run, scaled, workload

SECURE = "++workload.storage.storage_options.secure=true"


def test_datagen_and_replay_over_https(s3_tls_server: S3Server, tmp_path: Path) -> None:
    s3, bucket = s3_tls_server, "mlp-minio"
    s3.bucket(bucket)
    files, record, gpus = 4, 6 * MIB, 2
    over = [*scaled(s3, files, record), SECURE]
    p = run(
        s3,
        "datagen",
        "--workload",
        workload("unet3d_h100_minio_datagen.yaml"),
        "--data-dir",
        tmp_path / "u",
        "--gpus",
        gpus,
        *over,
    )
    assert f"{files} objects" in p.stderr, p.stderr
    listed = s3.list(bucket, "test-run/unet3d/train/")
    assert len(listed) == files and s3.files_on_disk(bucket) == listed, listed
    out = tmp_path / "r.json"
    run(
        s3,
        "replay",
        "--workload",
        workload("unet3d_h100_minio.yaml"),
        "--data-dir",
        tmp_path / "u",
        "--gpus",
        gpus,
        "--epochs",
        1,
        "--computation-time",
        "0.01",
        "--json",
        out,
        "-q",
        *over,
    )
    j = json.loads(out.read_text())
    o = j["object"]
    assert o["bytes_read"] == sum(listed.values()) and o["get_requests"] == files, o
    assert j["settings"]["storage"]["endpoint"] == s3.endpoint
    assert 0 < j["au_percent"] <= 100


def test_a_bad_or_foreign_ca_is_one_line_before_any_work(s3_tls_server: S3Server, tmp_path: Path) -> None:
    s3 = s3_tls_server
    s3.bucket("mlp-minio")
    at = f"++workload.storage.storage_options.endpoint_url={s3.endpoint}"
    not_pem = tmp_path / "not-a-ca.pem"
    not_pem.write_text("this is not a certificate\n")
    line = _refused(s3, tmp_path, s3.env(AWS_CA_BUNDLE=str(not_pem)), at, SECURE)
    assert f"AWS_CA_BUNDLE={not_pem}: no CA certificate" in line, line
    # The system's roots (no AWS_CA_BUNDLE) do not sign the test's certificate: the
    # handshake fails before the first request.
    env = {k: v for k, v in s3.env().items() if k != "AWS_CA_BUNDLE"}
    line = _refused(s3, tmp_path, env, at, SECURE)
    assert f"S3 endpoint {s3.endpoint}: TLS handshake" in line and "certificate" in line.lower(), line
    assert s3.list("mlp-minio") == {}, "nothing was written"
