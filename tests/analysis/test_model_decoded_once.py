"""The job model is built from the rows the analyzer read (#34): the native extension opens
no trace file. analyze, compare and report open each segment by its path once (when the
trace is opened, which holds the file; every read after goes through that descriptor),
counted by strace in a child process, on the sample traces and a trace set of two hosts.
With the extension reading the trace itself, each segment's path was opened again by it."""

from __future__ import annotations

import collections
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainio_analysis import kernels

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "traces"
ONE, EIGHT = TRACES / "unet3d-demo-1gpu", TRACES / "unet3d-demo-8gpu"

# The command, run in the child; it prints the GPUs of each job model it built, so a model
# that was not built (an extension that returned nothing) cannot pass for one that opened
# nothing.
CHILD = """
import sys
from trainio_analysis.analyze import analyze
from trainio_analysis.compare import compare
from trainio_analysis.report import write_report

command, out, *traces = sys.argv[1:]
if command == "analyze":
    print(analyze(traces[0])["job_model"]["steps"])
elif command == "compare":
    r = compare(traces[0], traces[1])
    print(r["writes"]["count"]["a"] is not None, r["writes"]["count"]["b"] is not None)
elif command == "report":
    write_report(traces, out)
    print(open(out).read().count("Per GPU"))
"""

_OPEN = re.compile(r'^\d+\s+(?:open|openat|openat2)\((?:[A-Z_]+|\d+), "([^"]+)"')


def _opens(tmp_path: Path, command: str, *traces: Path) -> tuple[collections.Counter[str], str]:
    """Each trace segment's path and how many times the command opened it (by that path:
    reads through a held descriptor open /proc/self/fd/N), and what the child printed."""
    if shutil.which("strace") is None:
        pytest.fail("strace is missing: scripts/install-deps.sh installs it")
    log = tmp_path / f"{command}.strace"
    child = subprocess.run(
        [
            *("strace", "-f", "-qq", "--seccomp-bpf", "-e", "trace=open,openat,openat2", "-o", str(log)),
            *(sys.executable, "-c", CHILD, command, str(tmp_path / "report.html"), *map(str, traces)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(ROOT / "analysis"), "PATH": "/usr/bin:/bin"},
    )
    assert child.returncode == 0, child.stderr[-3000:]
    segments = {str(p) for t in traces for p in t.rglob("seg-*.parquet")}
    counts: collections.Counter[str] = collections.Counter({s: 0 for s in segments})
    for line in log.read_text().splitlines():
        m = _OPEN.match(line)
        if m and m.group(1) in segments:
            counts[m.group(1)] += 1
    return counts, child.stdout


def test_the_extension_is_built() -> None:
    # without it there is no job model, and the counts below would show nothing
    assert kernels.available()


def test_analyze_opens_each_segment_once_and_builds_the_model(tmp_path) -> None:
    counts, out = _opens(tmp_path, "analyze", EIGHT)
    assert set(counts.values()) == {1}, counts
    assert int(out) == 40, out  # the demo's steps (model/tests/golden)


def test_analyze_of_a_set_opens_each_member_segment_once(tmp_path, two_hosts) -> None:
    counts, out = _opens(tmp_path, "analyze", two_hosts)
    assert len(counts) == 2 and set(counts.values()) == {1}, counts
    assert int(out) == 80, out  # h1's steps and h2's


def test_compare_opens_each_segment_once_and_models_both(tmp_path) -> None:
    counts, out = _opens(tmp_path, "compare", ONE, EIGHT)
    assert len(counts) == 2 and set(counts.values()) == {1}, counts
    assert out.split() == ["True", "True"], out


def test_report_opens_each_segment_once_and_shows_the_gpus(tmp_path) -> None:
    counts, out = _opens(tmp_path, "report", ONE, EIGHT)
    assert len(counts) == 2 and set(counts.values()) == {1}, counts
    assert int(out) >= 1, out


@pytest.mark.parametrize("trace", [ONE, EIGHT], ids=lambda p: p.name)
def test_the_model_of_the_analyzers_rows_is_the_model_of_the_files(trace) -> None:
    """The two entry points of crate trainio-model agree: from the rows the analyzer hands
    over, the model is the golden copy that `cargo test -p trainio-model` holds the model
    read from the files to (model/tests/golden)."""
    from trainio_analysis.analyze.result import job_model

    golden = json.loads((ROOT / "model" / "tests" / "golden" / f"{trace.name}.json").read_text())
    assert job_model(trace) == golden


def test_rows_of_any_width_the_schema_allows_model_the_same(tmp_path) -> None:
    """A trace rewritten by pyarrow with plain strings and 64-bit integers (as a tool
    that filters a trace may leave it) hands over the same rows: the same model."""
    from trainio_analysis.analyze.result import job_model

    seg = EIGHT / "seg-000000.parquet"
    table = pq.read_table(seg)
    plain = pa.table(
        {
            n: c.cast(pa.large_string() if pa.types.is_dictionary(c.type) else pa.int64())
            for n, c in zip(table.column_names, table.columns, strict=True)
        }
    ).replace_schema_metadata(pq.read_metadata(seg).metadata)
    (tmp_path / "t").mkdir()
    pq.write_table(plain, tmp_path / "t" / seg.name, row_group_size=1000)
    assert pq.ParquetFile(tmp_path / "t" / seg.name).metadata.num_row_groups > 1
    golden = json.loads((ROOT / "model" / "tests" / "golden" / f"{EIGHT.name}.json").read_text())
    assert job_model(tmp_path / "t") == golden
