"""make bench-object: what the object layer costs a process that talks HTTP.

A client issues GETs of a 64 KiB body over one keep-alive connection (Python's
http.client, as urllib3 and so boto3 use it) to a local HTTP server started outside the
recording, for BENCH_OBJECT_RUNTIME s per run: untraced, under `trainio record --layers
file` (the socket syscalls are ipc rows) and under `--layers file,object` (they are also
parsed into object requests), in BENCH_OBJECT_PAIRS rounds of the three in rotated order.

Per setting: requests per second (median over rounds) and its ratio to untraced, the
socket probes' kernel time per run (sampled BPF statistics: the exits of sendto and
recvfrom, where the object layer's work is), the recorder's CPU per row, and the object
rows written per request (1.0: every request recorded).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "analysis"))
import polars as pl

from trainio_analysis.trace import read_metadata, scan_trace
from trainio_testlib import TRAINIO

PAIRS = int(os.environ.get("BENCH_OBJECT_PAIRS", "3"))
RUNTIME = float(os.environ.get("BENCH_OBJECT_RUNTIME", "25"))
BODY = os.urandom(64 << 10)
PROBES = ("tio_sendto_exit", "tio_recvfrom_exit", "tio_sendto_enter", "tio_recvfrom_enter")

CLIENT = r"""
import http.client, sys, time
port, runtime = int(sys.argv[1]), float(sys.argv[2])
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


def run(setting: str, port: int, tmp: Path, k: int) -> dict:
    client = [sys.executable, "-c", CLIENT, str(port), str(RUNTIME)]
    if setting == "untraced":
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


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    settings = ["untraced", "file", "object"]
    results: dict[str, list[dict]] = {s: [] for s in settings}
    with tempfile.TemporaryDirectory(prefix="bench-object-", dir="/dev/shm") as d:
        for k in range(PAIRS):
            for s in settings[k % 3 :] + settings[: k % 3]:
                results[s].append(run(s, port, Path(d), k))
    server.shutdown()
    base = statistics.median(r["rps"] for r in results["untraced"])
    print(f"GET 64 KiB over keep-alive, {PAIRS} rounds of {RUNTIME:g} s; requests/s (median) and probe ns per run")
    summary = {}
    for s in settings:
        rs = results[s]
        rps = statistics.median(r["rps"] for r in rs)
        line = f"{s:9s} {rps:9.0f} req/s  {rps / base:6.3f} of untraced"
        entry = {"rps": rps, "ratio": rps / base}
        if s != "untraced":
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
