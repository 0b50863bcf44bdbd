"""The object layer over HTTPS: boto3 talks to the test S3 server through stunnel (a real TLS
terminator, a CA made by the fixture) under `trainio record --layers file,object`. The
requests are read from the plaintext of OpenSSL's SSL_read/SSL_write (uprobes on the
libssl Python's ssl module loads) and compared with what boto3 itself logged: one row
per request, the same keys, ranges, bytes and statuses; the sockets' ciphertext stays in
ipc rows and is not counted as object bytes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from s3_helpers import S3Server
from test_object_layer import CLIENT

from trainio_analysis.trace import read_metadata, scan_trace
from trainio_testlib import TRAINIO, trainio, wait_no_trainio_programs

pytestmark = [pytest.mark.root]


def test_boto3_over_https_is_recorded_from_the_tls_plaintext(tmp_path: Path, s3_tls_server: S3Server) -> None:
    s3, concurrent = s3_tls_server, 4
    s3.bucket("bkt")
    script, log_path, out = tmp_path / "client.py", tmp_path / "client.json", tmp_path / "trace"
    script.write_text(CLIENT)
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
        log_path,
        str(concurrent),
        env=env,
        timeout=240,
    )
    assert rec.returncode == 0, rec.stderr[-3000:]
    assert wait_no_trainio_programs() == []
    log = json.loads(log_path.read_text())
    meta = read_metadata(out)
    assert not any(k.startswith("tls") for k in meta.get("skipped_probes", {})), meta.get("skipped_probes")
    assert all(v == 0 for v in meta["lost_events"].values()), meta["lost_events"]

    trace = scan_trace(out)
    rows = trace.filter(pl.col("layer") == "object").sort("issue_ns").collect()
    port = s3.endpoint.rsplit(":", 1)[1]
    assert set(rows["endpoint"]) == {f"127.0.0.1:{port}"}

    # One row per request boto3 made, each with what it asked for and got.
    got = sorted(rows.select("op", "file", "offset", "bytes_requested", "bytes", "http_status").iter_rows(), key=repr)
    missing = rows.filter(pl.col("file") == "bkt/missing.bin").row(0, named=True)
    want = sorted(
        (
            (op, f, off, req, moved, st)
            if f != "bkt/missing.bin"
            else (op, f, off, missing["bytes_requested"], missing["bytes_requested"], st)
            for op, f, off, req, moved, st in log
        ),
        key=repr,
    )
    assert got == want
    assert (rows["error"] == 0).all(), rows.filter(pl.col("error") != 0)

    # The object bytes are what the job fetched and sent (exactly; the issue asks ±1%).
    fetched = sum(r[4] for r in log if r[0] == "get" and r[4] is not None)
    assert rows.filter(pl.col("op") == "get")["bytes"].sum() == fetched + missing["bytes"]
    assert rows.filter(pl.col("op") == "put")["bytes"].sum() == sum(r[4] for r in log if r[0] == "put")

    # Times: the first byte after the issue, completion not before it.
    assert ((rows["first_byte_ns"] - rows["issue_ns"]) > 0).all()
    assert (rows["complete_ns"] >= rows["first_byte_ns"]).all()
    # The pool's requests overlap on the endpoint.
    assert rows.tail(concurrent)["queue_depth"].max() > 1

    # The TLS connections are the sockets the ipc rows show carrying the ciphertext: more
    # bytes than the plaintext (records, handshakes), and never parsed as requests.
    fds = set(rows["fd"])
    sock = (
        trace.filter((pl.col("layer") == "ipc") & pl.col("file").str.starts_with("socket:") & pl.col("fd").is_in(fds))
        .filter(pl.col("pid") == rows["pid"][0])
        .collect()
    )
    received = sock.filter(pl.col("op") == "read")["bytes"].sum()
    assert received > rows.filter(pl.col("op") != "put")["bytes"].sum()
    assert sock.filter(pl.col("op") == "write")["bytes"].sum() > rows.filter(pl.col("op") == "put")["bytes"].sum()


# A thread blocked in SSL_read (nothing was asked, so nothing comes) when its process ends:
# the map dumped while it waits, then the process gone with the thread still in the call.
STUCK = """
import json, os, socket, ssl, subprocess, sys, threading, time
host, port, ca, dump = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
ctx = ssl.create_default_context(cafile=ca)
conn = ctx.wrap_socket(socket.create_connection((host, port)), server_hostname=host)
tid = []
def reader():
    tid.append(threading.get_native_id())
    conn.recv(1)
threading.Thread(target=reader, daemon=True).start()
time.sleep(1.0)
# This recorder's map (other recorders may be running): the tls_calls held by the
# recorder, our parent shell's parent.
with open(f"/proc/{os.getppid()}/stat") as f:
    recorder = int(f.read().rsplit(")", 1)[1].split()[1])
held = set()
for fd in os.listdir(f"/proc/{recorder}/fdinfo"):
    with open(f"/proc/{recorder}/fdinfo/{fd}") as f:
        held |= {int(l.split()[1]) for l in f if l.startswith("map_id:")}
maps = json.loads(subprocess.run(["bpftool", "-j", "map", "show"], capture_output=True, text=True).stdout)
(mid,) = [m["id"] for m in maps if m.get("name") == "tls_calls" and m["id"] in held]
during = subprocess.run(["bpftool", "-j", "map", "dump", "id", str(mid)], capture_output=True, text=True)
with open(dump, "w") as f:
    json.dump({"pid": os.getpid(), "tid": tid[0], "map": mid, "during": during.stdout}, f)
with open(dump + ".id", "w") as f:
    f.write(str(mid))
os._exit(0)
"""


def _keys(dump: str) -> list[int]:
    """The u64 keys of a `bpftool -j map dump` (hex bytes in host order, or numbers). An
    entry removed while the map was dumped (a call that returned meanwhile) comes as an
    error without a key, and is passed over."""
    out = []
    for e in json.loads(dump):
        if "key" not in e:
            continue
        k = e["key"]
        out.append(int.from_bytes(bytes(int(b, 16) for b in k), sys.byteorder) if isinstance(k, list) else int(k))
    return out


def test_a_thread_that_dies_inside_an_ssl_call_leaves_no_state(tmp_path: Path, s3_tls_server: S3Server) -> None:
    """A loader worker killed while it waits in SSL_read never returns from it: the
    recorder's per-thread SSL call state (the tls_calls map) must go with the thread, or a
    recorder left on for weeks fills the map and stops seeing HTTPS requests."""
    s3 = s3_tls_server
    host, port = s3.endpoint.removeprefix("https://").rsplit(":", 1)
    script, dump, after = tmp_path / "stuck.py", tmp_path / "during.json", tmp_path / "after.json"
    script.write_text(STUCK)
    shell = f"{sys.executable} {script} {host} {port} {s3.ca} {dump}; bpftool -j map dump id $(cat {dump}.id) > {after}"
    rec = trainio("record", "--layers", "file,object", "-o", tmp_path / "trace", "--", "sh", "-c", shell, timeout=120)
    assert rec.returncode == 0, rec.stderr[-3000:]
    seen = json.loads(dump.read_text())
    key = (seen["pid"] << 32) | seen["tid"]
    during = _keys(seen["during"])
    assert key in during, (key, seen["during"])  # the thread was in SSL_read, and the probe knew it
    left = _keys(after.read_text())
    assert key not in left, (key, left)


# Puts then gets N objects over HTTPS with boto3; with a "go" file, waits for it first (so
# a recorder can attach to this running process) and says "ready" by creating ready.
OWN_LIBSSL = """
import os, sys, time
import boto3
from botocore.config import Config
endpoint, n, ready, go = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
s3.list_buckets()  # the TLS connection (and libssl) in use before any recorder attaches
if go != "-":
    open(ready, "w").close()
    while not os.path.exists(go):
        time.sleep(0.05)
for i in range(n):
    s3.put_object(Bucket="own", Key=f"k{i}", Body=os.urandom(4096))
    assert len(s3.get_object(Bucket="own", Key=f"k{i}")["Body"].read()) == 4096
"""


def _libssl_copy(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of the system's libssl.so.3 in a directory of its own, and the environment
    that makes Python load it instead (as a conda environment's libssl is loaded)."""
    import ctypes.util

    name = ctypes.util.find_library("ssl")
    system = next((Path(d) / name for d in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64")
                   if name and (Path(d) / name).exists()), None)  # fmt: skip
    assert system is not None, f"no system libssl found ({name})"
    own = tmp_path / "own-lib"
    own.mkdir()
    shutil.copy2(system.resolve(), own / "libssl.so.3")
    return own / "libssl.so.3", {"LD_LIBRARY_PATH": str(own)}


def _https_rows(trace: Path) -> int:
    return scan_trace(trace).filter(pl.col("layer") == "object").select(pl.len()).collect().item()


def test_a_libssl_of_the_jobs_own_is_probed_when_named_or_mapped(tmp_path: Path, s3_tls_server: S3Server) -> None:
    """A job that loads its own libssl (a conda environment's): the system's is probed and
    sees nothing; `--tls-lib` names the job's, and `--pid` finds it in the running
    target's maps; either way every request is recorded (a put and a get per object)."""
    s3, n = s3_tls_server, 5
    s3.bucket("own")
    lib, lib_env = _libssl_copy(tmp_path)
    script = tmp_path / "own.py"
    script.write_text(OWN_LIBSSL)
    env = {**s3.env(), **lib_env, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    args = [sys.executable, script, s3.endpoint, str(n), "-", "-"]

    def record(name: str, *opts: object) -> Path:
        out = tmp_path / name
        rec = trainio("record", "--layers", "file,object", *opts, "-o", out, "--", *args, env=env, timeout=240)
        assert rec.returncode == 0, rec.stderr[-3000:]
        return out

    assert _https_rows(record("unnamed")) == 0, "the job's own libssl is not the system's"
    assert _https_rows(record("named", "--tls-lib", lib)) >= 2 * n

    ready, go = tmp_path / "ready", tmp_path / "go"
    job = subprocess.Popen([str(a) for a in [sys.executable, script, s3.endpoint, n, ready, go]], env=env)
    rec: subprocess.Popen[str] | None = None
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert job.poll() is None and time.monotonic() < deadline, "the job did not get ready"
            time.sleep(0.05)
        out = tmp_path / "pid"
        rec = subprocess.Popen(
            [str(TRAINIO), "record", "--layers", "file,object", "--pid", str(job.pid), "-o", str(out)],
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert rec.stderr is not None
        for line in rec.stderr:
            if line.startswith("trainio record: recording "):
                break
        go.touch()
        assert job.wait(timeout=120) == 0
        _, err = rec.communicate(timeout=60)
        assert rec.returncode == 0, err
    finally:
        for p in (job, rec):  # the recorder too, should the test fail while it runs
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert _https_rows(out) >= 2 * n


def test_tls_lib_is_checked_before_anything(tmp_path: Path) -> None:
    out = tmp_path / "t"
    for opts, words in [
        (["--layers", "file,object", "--tls-lib", tmp_path / "missing.so"], "--tls-lib"),
        (["--layers", "file", "--tls-lib", "/bin/true"], "object layer"),
        (["--layers", "file,object", "--tls-lib", tmp_path], "not a file"),
    ]:
        r = trainio("record", *opts, "-o", out, "--", "true", timeout=60)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and words in r.stderr, (opts, r.stderr)
        assert not out.exists()
