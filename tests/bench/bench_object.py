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
"""

from __future__ import annotations

import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "objectstore"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "analysis"))
import polars as pl
from s3_helpers import make_ca_and_cert

from trainio_analysis.trace import read_metadata, scan_trace
from trainio_testlib import TRAINIO

PAIRS = int(os.environ.get("BENCH_OBJECT_PAIRS", "3"))
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


def main() -> None:
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
