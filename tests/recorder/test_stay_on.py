"""A recorder that stays on (issue #33), against real kernel events: retention keeps the
output bounded and readable while fio reads at QD 32, a window cut from what remains reads
with its span, and the live metrics a real HTTP GET scrapes match the trace's counts."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

# trainio_testlib puts analysis/ on the path: it goes first.
from trainio_testlib import TRAINIO, loop_device, majmin, throttled_cgroup, trainio

# isort: split
from test_record import finish, fio

from trainio_analysis.trace import read_metadata, scan_trace

MiB = 1 << 20
# The 64 MiB with 8 MiB segments, scaled to what 60 s of 4 KiB reads at QD 32 on a
# loop device write here (~1 MiB/s of trace at ~7 B per row): the same 8:1 ratio, and
# retention removes segments from the first quarter of the run on.
SEGMENT_MB, RETAIN_MB = 1, 8
RUN_S = 60

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _dir_bytes(d: Path) -> int:
    total = 0
    for f in list(d.iterdir()) if d.exists() else []:
        try:
            total += f.stat().st_size
        except FileNotFoundError:
            pass  # removed by retention between the listing and the stat
    return total


@pytest.fixture(scope="module")
def retained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """One 60 s recording with retention: the trace, the output's size sampled every
    0.2 s, every segment name seen, and two analyses run while it recorded."""
    out = tmp_path_factory.mktemp("retain") / "t"
    with loop_device(256) as dev:
        p = subprocess.Popen(
            [
                str(TRAINIO),
                "record",
                "-o",
                str(out),
                "--layers",
                "block",
                "--dev",
                dev,
                "--segment-mb",
                str(SEGMENT_MB),
                "--retain-mb",
                str(RETAIN_MB),
                "--",
                *fio(dev, "--ioengine=io_uring", "--iodepth=32", runtime=RUN_S),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        sizes: list[int] = []
        seen: set[str] = set()
        analyses: list[subprocess.CompletedProcess[str]] = []

        def analyze_mid_run() -> None:
            analyses.append(trainio("analyze", "--json", "--layer", "block", out))

        started = time.monotonic()
        threads = []
        try:
            while p.poll() is None:
                sizes.append(_dir_bytes(out))
                seen.update(f.name for f in out.glob("seg-*.parquet")) if out.exists() else None
                elapsed = time.monotonic() - started
                if len(threads) < 2 and elapsed > (25, 45)[len(threads)]:
                    t = threading.Thread(target=analyze_mid_run)
                    t.start()
                    threads.append(t)
                time.sleep(0.2)
            rc, err = finish(p)
            seen.update(f.name for f in out.glob("seg-*.parquet"))  # the last, closed at the end
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        for t in threads:
            t.join()
        yield {"out": out, "rc": rc, "err": err, "sizes": sizes, "seen": seen, "analyses": analyses}


def test_retention_bounds_the_output_and_says_what_it_removed(retained: dict) -> None:
    out = retained["out"]
    assert retained["rc"] == 0, retained["err"]
    limit = (RETAIN_MB + 2 * SEGMENT_MB) * MiB
    assert len(retained["sizes"]) > 100
    assert max(retained["sizes"]) <= limit, (max(retained["sizes"]), limit)
    meta = read_metadata(out)
    kept = sorted(f.name for f in out.glob("seg-*.parquet"))
    r = meta["retention"]
    assert r["max_bytes"] == RETAIN_MB * MiB and r["max_age_s"] is None
    # Segments were removed, the oldest first: what is left is the newest, numbered on.
    assert r["dropped_segments"] >= 4, r
    assert kept[0] == f"seg-{r['dropped_segments']:06d}.parquet", kept
    assert len(retained["seen"]) == r["dropped_segments"] + len(kept)
    # Every row written is either kept or counted as removed.
    rows = scan_trace(out).select(pl.len(), pl.col("issue_ns").min(), pl.col("complete_ns").max()).collect().row(0)
    assert rows[0] + r["dropped_rows"] == meta["events"]["block"], (rows, r, meta["events"])
    assert sum(f.stat().st_size for f in out.glob("seg-*.parquet")) <= RETAIN_MB * MiB + SEGMENT_MB * MiB
    # The kept trace starts where the newest removed segment ended.
    assert meta["start_ns"] == r["dropped_until_ns"] > r["recording_start_ns"]
    assert rows[2] > meta["start_ns"]


def test_analyze_reads_a_retained_trace_during_and_after_the_recording(retained: dict) -> None:
    out = retained["out"]
    assert len(retained["analyses"]) == 2
    for a in retained["analyses"]:
        assert a.returncode == 0, a.stderr
        assert json.loads(a.stdout)["reads"] > 10_000
    a = trainio("analyze", "--json", "--layer", "block", out)
    assert a.returncode == 0, a.stderr
    result = json.loads(a.stdout)
    span = scan_trace(out).select(pl.len(), pl.col("issue_ns").min(), pl.col("complete_ns").max())
    n, first, last = span.collect().row(0)
    assert result["reads"] == n
    # The span analyzed is what was kept, not the whole recording: from where the removed
    # part ended to the recording's end.
    meta = read_metadata(out)
    assert result["start_ns"] == min(first, meta["start_ns"])
    assert abs(result["duration_s"] - (max(last, meta["end_ns"]) - result["start_ns"]) / 1e9) < 0.001
    assert result["duration_s"] < RUN_S * 0.75, result["duration_s"]


def test_a_window_cut_from_the_retained_trace_reads_with_its_span(retained: dict, tmp_path: Path) -> None:
    out = retained["out"]
    meta = read_metadata(out)
    cut = tmp_path / "window"
    # Seconds 1 to 3 of what retention kept (a few seconds: the limit also holds the
    # recorder's 1 MiB reserve for the last segment).
    res = trainio("slice", out, "-o", cut, "--from", "1", "--to", "3", "--json")
    assert res.returncode == 0, res.stderr
    lo, hi = meta["start_ns"] + 1 * 10**9, meta["start_ns"] + 3 * 10**9
    overlap = (pl.col("complete_ns") >= lo) & (pl.col("issue_ns") < hi)
    want = scan_trace(out).filter(overlap).select(pl.len()).collect().item()
    assert want > 10_000
    assert json.loads(res.stdout)["rows"] == want
    w = read_metadata(cut)
    assert (w["start_ns"], w["end_ns"]) == (lo, hi)
    assert w["window"]["source"] == str(out.resolve()) and w["window"]["rows"] == want
    a = trainio("analyze", "--json", "--layer", "block", cut)
    assert a.returncode == 0, a.stderr
    result = json.loads(a.stdout)
    assert result["reads"] == want
    # Requests in flight at the window's edges stick out by their latency (µs to ms).
    assert abs(result["duration_s"] - 2.0) < 0.05, result["duration_s"]
    # The same window given in wall-clock time cuts the same rows.
    wall = (lo + meta["clock_offset_ns"]) / 1e9
    import datetime as dt

    iso = dt.datetime.fromtimestamp(wall, dt.UTC).isoformat()
    again = trainio("slice", out, "-o", tmp_path / "wall", "--from", iso, "--to", "3", "--json")
    assert again.returncode == 0, again.stderr
    assert abs(json.loads(again.stdout)["rows"] - want) <= want * 0.001


def _scrape(url: str) -> dict[tuple[str, str], float]:
    """name{labels} -> value of every sample in a real HTTP GET of the endpoint."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = reply.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            m = re.fullmatch(r"(\w+)(\{[^}]*\})? (\S+)", line)
            assert m, line
            out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out


def _device_reads(dev_path: str) -> int:
    """Reads the device has completed (its own count, /sys/block/NAME/stat)."""
    return int(Path(f"/sys/block/{Path(dev_path).name}/stat").read_text().split()[0])


def _caught_up(url: str, key: tuple[str, str], want: int, timeout: float = 30) -> None:
    """Returns once the scraped `key` counts `want` requests, less the 0.1% a missed
    completion may take (block_rq_complete:unseen): the recorder has drained them into its
    metrics, and the trace has them too."""
    deadline = time.monotonic() + timeout
    got = None
    while time.monotonic() < deadline:
        got = _scrape(url).get(key, 0.0)
        if got >= want * 0.999:
            return
        time.sleep(0.1)
    raise AssertionError(f"{key}: {got} of the device's {want} requests after {timeout} s")


def test_scraped_metrics_match_the_trace(tmp_path: Path, loop_dev: str) -> None:
    out = tmp_path / "t"
    dev = majmin(loop_dev)
    p = subprocess.Popen(
        [str(TRAINIO), "record", "-o", str(out), "--layers", "block", "--dev", loop_dev]
        + ["--metrics-addr", "127.0.0.1:0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stderr is not None
        url = None
        for line in p.stderr:
            m = re.search(r"serving metrics at (http://\S+)", line)
            url = m.group(1) if m else url
            if line.startswith("trainio record: recording "):
                break
        assert url, "no metrics address announced"
        # Two bursts of 4 KiB reads at QD 32, each followed by a quiet second and a
        # scrape: every row of a burst has then reached the metrics (and the trace). fio
        # runs in a cgroup of its own (no cap), whose series count its requests.
        scrapes = []
        base = _device_reads(loop_dev)
        with throttled_cgroup(dev, None) as job:
            for size in ("48M", "32M"):
                cmd = job.wrap(fio(loop_dev, "--ioengine=io_uring", "--iodepth=32", f"--io_size={size}"))
                run = subprocess.run(cmd, capture_output=True)
                assert run.returncode == 0, run.stderr
                want = _device_reads(loop_dev) - base
                _caught_up(url, ("trainio_requests_total", f'{{layer="block",dev="{dev}",op="read"}}'), want)
                at = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
                scrapes.append((at, _scrape(url)))
    finally:
        p.send_signal(signal.SIGINT)
        rc, err = finish(p)
    assert rc == 0, err

    trace = scan_trace(out).filter((pl.col("layer") == "block") & (pl.col("dev") == dev) & (pl.col("op") == "read"))
    labels = f'{{layer="block",dev="{dev}",op="read"}}'
    hist = f'{{layer="block",dev="{dev}"'
    since = 0
    prev: dict = {}
    for at, m in scrapes:
        window = trace.filter((pl.col("issue_ns") >= since) & (pl.col("issue_ns") < at))
        n, nbytes = window.select(pl.len(), pl.col("bytes").sum()).collect().row(0)
        assert n > 5000
        got = m[("trainio_requests_total", labels)] - prev.get(("trainio_requests_total", labels), 0)
        got_bytes = m[("trainio_bytes_total", labels)] - prev.get(("trainio_bytes_total", labels), 0)
        assert abs(got - n) <= 0.01 * n, (got, n)
        assert abs(got_bytes - nbytes) <= 0.01 * nbytes, (got_bytes, nbytes)
        # fio keeps at most 32 in flight: every read is in the le="32" bucket, some above 16.
        count = m[("trainio_queue_depth_count", hist + "}")]
        assert m[("trainio_queue_depth_bucket", hist + ',le="32"}')] == count
        assert m[("trainio_queue_depth_bucket", hist + ',le="16"}')] < count
        since, prev = at, m
    # The job's cgroup: every read fio issued, and no other process's.
    fio_reads = trace.filter(pl.col("comm").cast(pl.Utf8).str.starts_with("fio") & (pl.col("issue_ns") < at))
    n_fio = fio_reads.select(pl.len()).collect().item()
    mine = [
        v
        for (name, labels), v in scrapes[-1][1].items()
        if name == "trainio_cgroup_requests_total"
        and f'/{job.path.name}"' in labels
        and 'layer="block"' in labels
        and 'op="read"' in labels
    ]
    assert len(mine) == 1 and abs(mine[0] - n_fio) <= 0.01 * n_fio, (mine, n_fio)
    # The latency percentiles agree with the trace's to the histogram's resolution (2x).
    lat = trace.filter(pl.col("issue_ns") < scrapes[-1][0]).select((pl.col("complete_ns") - pl.col("issue_ns")) / 1e9)
    p50 = lat.collect().to_series().quantile(0.5)
    got = scrapes[-1][1][("trainio_latency_quantile_seconds", hist + ',quantile="0.5"}')]
    assert p50 / 2 <= got <= p50 * 2, (got, p50)


def test_bad_retention_and_metrics_address_are_one_line_exit_2(tmp_path: Path) -> None:
    import socket

    out = tmp_path / "o"
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        cases = [
            (("--segment-mb", "8", "--retain-mb", "4"), "--retain-mb 4 is below --segment-mb 8"),
            (("--metrics-addr", "localhost"), "--metrics-addr"),
            (("--metrics-addr", f"127.0.0.1:{busy.getsockname()[1]}"), "cannot listen"),
        ]
        for args, words in cases:
            res = trainio("record", "-o", out, *args, "--", "true")
            lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
            assert res.returncode == 2 and len(lines) == 1 and words in lines[0], (args, res.stderr)
    finally:
        busy.close()
    assert not out.exists(), "nothing is written on bad input"


def test_a_jobs_cgroup_is_recorded_and_slice_keeps_its_processes(tmp_path: Path) -> None:
    """Two jobs of one recording, each put into a cgroup of its own the way a container
    runtime does (join the cgroup, then exec): each process has a cgroup row (schema 1.9)
    naming its cgroup, and `slice --cgroup` keeps one job's reads and none of the other's,
    whether the cgroup is given as the rows name it or under /sys/fs/cgroup."""
    files = {}
    for name in ("a", "b"):
        files[name] = tmp_path / f"{name}.bin"
        files[name].write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    out = tmp_path / "t"
    # majmin of nothing: the groups only keep track of their processes (no cap)
    with throttled_cgroup("1:3", None) as ga, throttled_cgroup("1:3", None) as gb:
        reader = "import sys; f = open(sys.argv[1], 'rb'); [f.read(65536) for _ in range(16)]"
        driver = (
            "import subprocess, sys\n"
            f"for cmd in ({ga.wrap(['python3', '-c', reader, files['a']])!r}, "
            f"{gb.wrap(['python3', '-c', reader, files['b']])!r}):\n"
            "    subprocess.run(cmd, check=True)\n"
        )
        rec = trainio("record", "-o", str(out), "--layers", "file", "-q", "--", "python3", "-c", driver)
        assert rec.returncode == 0, rec.stderr
    proc = scan_trace(out).filter((pl.col("layer") == "proc") & (pl.col("op") == "cgroup")).collect()
    reads = scan_trace(out).filter((pl.col("layer") == "file") & (pl.col("op") == "read")).collect()
    by_file = {name: reads.filter(pl.col("file") == str(f)) for name, f in files.items()}
    for name, group in (("a", ga), ("b", gb)):
        pids = set(by_file[name]["pid"].to_list())
        assert len(pids) == 1 and by_file[name]["bytes"].sum() == MiB, (name, by_file[name])
        # the reader's last cgroup row names its group
        (pid,) = pids
        rows = proc.filter(pl.col("pid") == pid).sort("issue_ns")
        assert rows.height >= 1 and rows["file"][-1].endswith("/" + group.path.name), (name, rows)
    # only the two readers entered the groups: the driver and its shells' forks did not
    names = ("/" + ga.path.name, "/" + gb.path.name)
    entered = proc.filter(pl.col("file").str.ends_with(names[0]) | pl.col("file").str.ends_with(names[1]))
    readers = {p for name in ("a", "b") for p in by_file[name]["pid"].to_list()}
    assert set(entered["pid"].to_list()) == readers, (entered, readers)
    a_row = proc.filter(pl.col("file").str.ends_with("/" + ga.path.name))["file"][0]
    for i, given in enumerate((a_row, str(ga.path))):
        cut = tmp_path / f"cut{i}"
        s = trainio("slice", str(out), "-o", str(cut), "--cgroup", given, "--json")
        assert s.returncode == 0, s.stderr
        kept = scan_trace(cut).filter((pl.col("layer") == "file") & (pl.col("op") == "read")).collect()
        assert kept.filter(pl.col("file") == str(files["b"])).height == 0, "job b's reads kept"
        assert kept.filter(pl.col("file") == str(files["a"]))["bytes"].sum() == MiB
        assert read_metadata(cut)["window"]["cgroups"] == [given]
    # a cgroup that held none of its processes: nothing to keep, one line, exit 2
    nothing = trainio("slice", str(cut), "-o", str(tmp_path / "none"), "--cgroup", "/no-such-group")
    assert nothing.returncode == 2 and "no rows" in nothing.stderr, nothing.stderr
