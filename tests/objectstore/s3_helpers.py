"""The S3 server the tests talk to, and a small S3 client of the tests' own (SigV4 with
hashlib/hmac over urllib), so what trainio put is listed by code that shares nothing
with trainio's Rust client."""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import hmac
import os
import signal
import ssl
import subprocess
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"

# The base domain of conftest's s3_virtual_server: no resolver knows it, a client maps it
# to 127.0.0.1. (Here, not in conftest.py: `from conftest import` takes whichever suite's
# conftest was imported first.)
VIRTUAL_DOMAIN = "s3.trainio.test"


@dataclasses.dataclass
class S3Server:
    endpoint: str
    root: Path
    access_key: str
    secret_key: str
    # An https endpoint's CA certificate (PEM), which clients are given as AWS_CA_BUNDLE.
    ca: Path | None = None
    last_headers: dict[str, str] = dataclasses.field(default_factory=dict)

    def bucket(self, name: str) -> str:
        """Creates bucket `name` (the server keeps a bucket as a directory of its root)."""
        (self.root / name).mkdir()
        return name

    def env(self, **extra: str) -> dict[str, str]:
        """The environment MLPerf's object mode reads: endpoint and keys."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            **({"AWS_CA_BUNDLE": str(self.ca)} if self.ca else {}),
            **extra,
        }

    def request(self, method: str, path: str, query: dict[str, str] | None = None, *, secret: str | None = None):
        """A signed request; returns (status, body)."""
        query = query or {}
        host = urllib.parse.urlsplit(self.endpoint).netloc
        now = datetime.datetime.now(datetime.UTC)
        amz, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        qs = "&".join(
            f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
            for k, v in sorted(query.items())
        )
        payload = hashlib.sha256(b"").hexdigest()
        signed = "host;x-amz-content-sha256;x-amz-date"
        headers = f"host:{host}\nx-amz-content-sha256:{payload}\nx-amz-date:{amz}\n"
        canonical = f"{method}\n{urllib.parse.quote(path)}\n{qs}\n{headers}\n{signed}\n{payload}"
        scope = f"{day}/us-east-1/s3/aws4_request"
        to_sign = f"AWS4-HMAC-SHA256\n{amz}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        key = ("AWS4" + (secret or self.secret_key)).encode()
        for part in (day, "us-east-1", "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        sig = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        auth = f"AWS4-HMAC-SHA256 Credential={self.access_key}/{scope}, SignedHeaders={signed}, Signature={sig}"
        req = urllib.request.Request(
            f"{self.endpoint}{urllib.parse.quote(path)}" + (f"?{qs}" if qs else ""),
            method=method,
            headers={"x-amz-date": amz, "x-amz-content-sha256": payload, "authorization": auth},
        )
        try:
            tls = ssl.create_default_context(cafile=str(self.ca)) if self.ca else None
            with urllib.request.urlopen(req, timeout=30, context=tls) as r:
                self.last_headers = dict(r.headers)
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def etag(self, bucket: str, key: str) -> str:
        """The object's ETag (HeadObject): a multipart upload's ends in -PARTS."""
        status, _ = self.request("HEAD", f"/{bucket}/{key}")
        assert status == 200, status
        return {k.lower(): v for k, v in self.last_headers.items()}["etag"].strip('"')

    def list(self, bucket: str, prefix: str = "") -> dict[str, int]:
        """Every object under `prefix`: key -> size, through ListObjectsV2."""
        out: dict[str, int] = {}
        token = None
        while True:
            q = {"list-type": "2", "prefix": prefix}
            if token:
                q["continuation-token"] = token
            status, body = self.request("GET", f"/{bucket}", q)
            assert status == 200, (status, body[:300])
            tree = ET.fromstring(body)
            for c in tree.iter(f"{NS}Contents"):
                out[c.findtext(f"{NS}Key")] = int(c.findtext(f"{NS}Size"))
            token = tree.findtext(f"{NS}NextContinuationToken")
            if tree.findtext(f"{NS}IsTruncated") != "true" or not token:
                return out

    def files_on_disk(self, bucket: str) -> dict[str, int]:
        """The server's own directory: key -> bytes, as the server stored them."""
        base = self.root / bucket
        return {str(p.relative_to(base)): p.stat().st_size for p in base.rglob("*") if p.is_file()}


def _openssl(*args: str | Path) -> None:
    r = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, f"openssl {args[0]}: {r.stderr[-500:]}"


def make_ca_and_cert(d: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA (P-256, one day) and a server certificate it signs for IP 127.0.0.1,
    as rustls and OpenSSL verify them (v3, subjectAltName, CA:TRUE on the CA only).
    Returns (ca.pem, server.pem, server.key)."""
    ca, ca_key, cert, key, csr = (d / n for n in ("ca.pem", "ca.key", "server.pem", "server.key", "server.csr"))
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        ca_key,
        "-out",
        ca,
        "-days",
        "1",
        "-subj",
        "/CN=trainio test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    _openssl("req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1")
    ext = d / "server.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        csr,
        "-CA",
        ca,
        "-CAkey",
        ca_key,
        "-CAcreateserial",
        "-out",
        cert,
        "-days",
        "1",
        "-extfile",
        ext,
    )
    return ca, cert, key


def put_random_objects(s3: S3Server, bucket: str, prefix: str, n: int, size: int) -> None:
    """Puts n objects of `size` random bytes, `prefix/s00000.bin` on, with boto3 (path-style,
    no checksums: as the jobs of the tests read them)."""
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3",
        endpoint_url=s3.endpoint,
        region_name="us-east-1",
        aws_access_key_id=s3.access_key,
        aws_secret_access_key=s3.secret_key,
        config=Config(
            s3={"addressing_style": "path"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )
    for i in range(n):
        client.put_object(Bucket=bucket, Key=f"{prefix}/s{i:05d}.bin", Body=os.urandom(size))


def run_job(cmd: list[str], env: dict[str, str], timeout: float = 150) -> None:
    """Runs a job (or `trainio record` of one) in a session of its own and asserts it
    ended with 0; on a timeout SIGINT goes first (the recorder stops its command), then
    SIGKILL to whatever is left."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    stderr = ""
    try:
        _, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert proc.returncode == 0, stderr[-4000:]


def replay_env(s3: S3Server) -> dict[str, str]:
    """The environment of a replay against `s3`: the caller's, without its own endpoint
    and credentials, with s3's and mpirun's leave to run as root."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_ENDPOINT"))}
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", **s3.env()})
    return env
