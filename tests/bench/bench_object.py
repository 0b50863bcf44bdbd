"""make bench-object: what the object layer costs a process that talks HTTP.

A client issues GETs of a 64 KiB body over one keep-alive connection (Python's
http.client, as urllib3 and so boto3 use it) to a local HTTP server started outside the
recording, for BENCH_OBJECT_RUNTIME s per run: untraced, under `trainio record --layers
file` (the socket syscalls are ipc rows) and under `--layers file,object` (they are also
parsed into object requests), in BENCH_OBJECT_PAIRS rounds of the three in rotated order.
The same over HTTPS (Python's ssl on both ends, a throwaway CA): untraced (`tls-none`) and
under `--layers file,object` (`tls-object`: the requests are read from the plaintext of
OpenSSL's SSL_read_ex/SSL_write_ex, through uprobes), in the same rotation.

Per setting: requests per second (median over rounds) and its ratio to untraced, the
socket probes' kernel time per run (sampled BPF statistics: the exits of sendto and
recvfrom, where the object layer's work is), the recorder's CPU per row, and the object
rows written per request (1.0: every request recorded). Over HTTPS the probes are the
uprobes' programs; the uprobe's own trap (the breakpoint, and the return address swap of
the uretprobe) is not in BPF statistics: it shows in requests per second only.

Then the replay's S3 client against boto3 on two servers: the tests' S3 server as the
tests start it (tests/s3server: TCP_NODELAY on every connection), and the same with
`--nagle` (Nagle's algorithm on, as s3s-fs's own binary leaves it), each over a directory
under /var/tmp. GET latency of the same 16 objects of 256 KiB (npz, put by `trainio
datagen` from the minio unet3d workload), back to back (no compute between requests) and
paced (BENCH_OBJECT_PACE_S between them: `--computation-time` for the replay at batch
size 1, a sleep for boto3), in BENCH_OBJECT_PAIRS rounds of the eight in rotated order.
Per setting: the median over rounds of each run's p50 and p90, and the range of the
p50s. BENCH_OBJECT_PARTS picks what runs: `layer`, `latency` or both.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "objectstore"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "analysis"))
import polars as pl
from s3_helpers import make_ca_and_cert

from trainio_analysis.trace import read_metadata, scan_trace
from trainio_testlib import ROOT, TRAINIO

PAIRS = int(os.environ.get("BENCH_OBJECT_PAIRS", "3"))
PARTS = os.environ.get("BENCH_OBJECT_PARTS", "layer,latency").split(",")
PACE_S = float(os.environ.get("BENCH_OBJECT_PACE_S", "0.3"))
RUNTIME = float(os.environ.get("BENCH_OBJECT_RUNTIME", "25"))
BODY = os.urandom(64 << 10)
PROBES = (
    "tio_sendto_exit",
    "tio_recvfrom_exit",
    "tio_sendto_enter",
    "tio_recvfrom_enter",
    "tio_ssl_write_ex_enter",
    "tio_ssl_read_ex_enter",
    "tio_ssl_return",
)

CLIENT = r"""
import http.client, ssl, sys, time
port, runtime, ca = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
if ca:
    tls = ssl.create_default_context(cafile=ca)
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=tls)
else:
    conn = http.client.HTTPConnection("127.0.0.1", port)
n, end = 0, time.monotonic() + runtime
while time.monotonic() < end:
    conn.request("GET", "/bkt/key-%d" % (n % 100), headers={"Range": "bytes=0-65535"})
    r = conn.getresponse()
    r.read()
    n += 1
print(n / runtime)
"""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(206)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *_: object) -> None:
        pass


def run(setting: str, ports: dict[str, int], ca: Path, tmp: Path, k: int) -> dict:
    tls = setting.startswith("tls")
    client = [sys.executable, "-c", CLIENT, str(ports["tls" if tls else "plain"]), str(RUNTIME), str(ca) if tls else ""]
    if setting in ("untraced", "tls-none"):
        out = subprocess.run(client, capture_output=True, text=True, check=True)
        return {"rps": float(out.stdout)}
    trace = tmp / f"{setting}-{k}"
    layers = "file" if setting == "file" else "file,object"
    rec = subprocess.run(
        [str(TRAINIO), "record", "--layers", layers, "-o", str(trace), "--", *client],
        capture_output=True,
        text=True,
        check=True,
    )
    rps = float(rec.stdout.strip().splitlines()[-1])
    meta = read_metadata(trace)
    stats = meta["bpf_stats"]
    rows = scan_trace(trace).group_by("layer").len().collect()
    counts = dict(zip(rows["layer"].cast(pl.String), rows["len"], strict=True))
    cpu = meta["recorder_cpu_ns"]
    total_rows = sum(counts.values())
    return {
        "rps": rps,
        "ns": {p: stats[p]["ns_per_run"] for p in PROBES if p in stats and stats[p]["run_cnt"]},
        "object_per_request": counts.get("object", 0) / (rps * RUNTIME),
        "cpu_ns_per_row": (cpu["drain"] + cpu["encoder"]) / max(total_rows, 1),
    }


def serve(server: ThreadingHTTPServer) -> int:
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]


BOTO3 = r"""
import boto3, json, sys, time
from botocore.config import Config
ep, access, secret, bucket, prefix, passes, pace = sys.argv[1:8]
c = boto3.client("s3", endpoint_url=ep, region_name="us-east-1", aws_access_key_id=access,
    aws_secret_access_key=secret, config=Config(s3={"addressing_style": "path"},
    request_checksum_calculation="when_required", response_checksum_validation="when_required"))
keys = sorted(o["Key"] for o in c.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"])
ms = []
for _ in range(int(passes)):
    for k in keys:
        time.sleep(float(pace))
        t = time.perf_counter()
        c.get_object(Bucket=bucket, Key=k)["Body"].read()
        ms.append((time.perf_counter() - t) * 1e3)
print(json.dumps(ms))
"""


def latency() -> None:
    """GET latency of the replay's client and of boto3, side by side, on the test server as
    the tests start it (TCP_NODELAY) and on the same server with Nagle's algorithm left on."""
    from conftest import s3_server_on

    files, passes = 16, 2
    bucket = "mlp-minio"
    data = ROOT / "tests" / "objectstore" / "data"
    got: dict[str, list[tuple[float, float]]] = {}
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="bench-object-s3-", dir="/var/tmp") as d:
        runs = {}
        for server in ("nodelay", "nagle"):
            s3 = stack.enter_context(s3_server_on(nagle=server == "nagle"))
            s3.bucket(bucket)
            env = {**os.environ, **s3.env(), "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
            env.pop("AWS_ENDPOINT_URL")
            over = [
                f"++workload.storage.storage_options.endpoint_url={s3.endpoint}",
                f"++workload.dataset.num_files_train={files}",
                "++workload.dataset.record_length_bytes=262144",
                "++workload.dataset.record_length_bytes_stdev=0",
                "++workload.reader.batch_size=1",
                "++workload.reader.read_threads=1",
            ]
            common = ["--data-dir", str(Path(d) / "unused"), "--gpus", "1", *over]
            gen = data / "unet3d_h100_minio_datagen.yaml"
            subprocess.run([str(TRAINIO), "datagen", "--workload", str(gen), *common], env=env, check=True)

            def replay(pace: float, env=env, common=common) -> tuple[float, float]:
                out = Path(d) / "r.json"
                cmd = [str(TRAINIO), "replay", "--workload", str(data / "unet3d_h100_minio.yaml"), *common]
                cmd += ["--epochs", str(passes), "--computation-time", str(pace), "--json", str(out), "-q"]
                subprocess.run(cmd, env=env, check=True, capture_output=True)
                lat = json.loads(out.read_text())["object"]["get_latency"]
                return lat["p50_ms"], lat["p90_ms"]

            def boto3(pace: float, env=env, s3=s3) -> tuple[float, float]:
                cmd = [sys.executable, "-c", BOTO3, s3.endpoint, s3.access_key, s3.secret_key, bucket]
                cmd += ["test-run/unet3d/train/", str(passes), str(pace)]
                ms = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True).stdout)
                return statistics.median(ms), statistics.quantiles(ms, n=10)[-1]

            runs[f"{server:8s} replay back-to-back"] = lambda replay=replay: replay(0.0)
            runs[f"{server:8s} boto3 back-to-back"] = lambda boto3=boto3: boto3(0.0)
            runs[f"{server:8s} replay paced {PACE_S:g} s"] = lambda replay=replay: replay(PACE_S)
            runs[f"{server:8s} boto3 paced {PACE_S:g} s"] = lambda boto3=boto3: boto3(PACE_S)
        names = list(runs)
        got = {n: [] for n in names}
        for k in range(PAIRS):
            at = k * 3 % len(names)
            for n in names[at:] + names[:at]:
                got[n].append(runs[n]())
                time.sleep(0.5)
    print(
        f"GET of 256 KiB objects on the test S3 server (nodelay: as the tests start it; nagle: with "
        f"Nagle's algorithm on, as s3s-fs's own binary), {files * passes} per run, {PAIRS} runs each; ms"
    )
    print(f"{'server   client, setting':34s} {'p50 (median)':>12s} {'p50 range':>14s} {'p90 (median)':>12s}")
    summary = {}
    for n in names:
        p50 = [a for a, _ in got[n]]
        p90 = statistics.median(b for _, b in got[n])
        print(f"{n:34s} {statistics.median(p50):12.2f} {min(p50):6.2f}-{max(p50):<7.2f} {p90:12.2f}")
        summary[" ".join(n.split())] = {"p50_ms": p50, "p90_ms": [b for _, b in got[n]]}
    print(json.dumps(summary))


def main() -> None:
    if "latency" in PARTS:
        latency()
    if "layer" not in PARTS:
        return
    settings = ["untraced", "file", "object", "tls-none", "tls-object"]
    results: dict[str, list[dict]] = {s: [] for s in settings}
    with tempfile.TemporaryDirectory(prefix="bench-object-", dir="/dev/shm") as d:
        ca, cert, key = make_ca_and_cert(Path(d))
        plain = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        tls = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(cert, key)
        tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
        ports = {"plain": serve(plain), "tls": serve(tls)}
        for k in range(PAIRS):
            n = k % len(settings)
            for s in settings[n:] + settings[:n]:
                results[s].append(run(s, ports, ca, Path(d), k))
        plain.shutdown()
        tls.shutdown()
    untraced = {s: statistics.median(r["rps"] for r in results[s]) for s in ("untraced", "tls-none")}
    print(
        f"GET 64 KiB over keep-alive (HTTP, HTTPS), {PAIRS} rounds of {RUNTIME:g} s;"
        " requests/s (median) and probe ns per run"
    )
    summary = {}
    for s in settings:
        rs = results[s]
        rps = statistics.median(r["rps"] for r in rs)
        base = untraced["tls-none" if s.startswith("tls") else "untraced"]
        line = f"{s:10s} {rps:9.0f} req/s  {rps / base:6.3f} of untraced"
        entry = {"rps": rps, "ratio": rps / base}
        if s not in untraced:
            ns = {
                p: statistics.median(r["ns"][p] for r in rs if p in r["ns"])
                for p in PROBES
                if any(p in r["ns"] for r in rs)
            }
            per_req = statistics.median(r["object_per_request"] for r in rs)
            cpu = statistics.median(r["cpu_ns_per_row"] for r in rs)
            line += "  " + "  ".join(f"{p.removeprefix('tio_')} {v:.0f} ns" for p, v in ns.items())
            line += f"  recorder {cpu:.0f} ns/row  object rows/request {per_req:.3f}"
            entry.update({"probe_ns": ns, "recorder_ns_per_row": cpu, "object_rows_per_request": per_req})
        print(line)
        summary[s] = entry
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
