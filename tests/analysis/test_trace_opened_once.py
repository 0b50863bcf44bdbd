"""Each command opens its trace once (#34): analyze, report, compare, export and slice read
every segment's footer a single time and pass the opened trace along, on the sample
traces and on a trace set of two hosts."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from trainio_analysis.analyze import analyze
from trainio_analysis.compare import compare
from trainio_analysis.interop.export_fio import export_fio
from trainio_analysis.report import write_report
from trainio_analysis.slice import slice_trace
from trainio_analysis.trace import (
    Trace,
    open_trace,
    read,
    read_metadata,
    scan_trace,
    segments,
    sets,
    trace_set_members,
)

TRACES = Path(__file__).resolve().parents[2] / "traces"
ONE, EIGHT = TRACES / "unet3d-demo-1gpu", TRACES / "unet3d-demo-8gpu"


@pytest.fixture
def opens(monkeypatch: pytest.MonkeyPatch) -> Iterator[collections.Counter[str]]:
    """How many times each segment file was opened and its footer checked: the trace
    package's one function that does it, wherever it is called from."""
    counts: collections.Counter[str] = collections.Counter()
    real = segments._open_segment

    def counting(path: Path, name: Path | None = None) -> pq.ParquetFile:
        counts[str(name if name is not None else path)] += 1
        return real(path, name)

    for module in (segments, read, sets):
        if hasattr(module, "_open_segment"):
            monkeypatch.setattr(module, "_open_segment", counting)
    yield counts


def _segments(*traces: Path) -> set[str]:
    return {str(p) for t in traces for p in sorted(t.rglob("seg-*.parquet"))}


def _commands(out: Path, set_dir: Path) -> dict[str, tuple[Callable[[], object], set[str]]]:
    """Each command, and the segments it reads."""
    return {
        "analyze": (lambda: analyze(ONE), _segments(ONE)),
        "analyze a set": (lambda: analyze(set_dir), _segments(set_dir)),
        "report": (lambda: write_report([str(ONE), str(EIGHT)], out / "r.html"), _segments(ONE, EIGHT)),
        "report a set": (lambda: write_report([str(set_dir)], out / "s.html"), _segments(set_dir)),
        "compare": (lambda: compare(ONE, EIGHT), _segments(ONE, EIGHT)),
        "compare a set": (lambda: compare(set_dir, set_dir / "h1"), _segments(set_dir)),
        "export": (lambda: export_fio(str(EIGHT), out / "e", layer="file", by="gpu"), _segments(EIGHT)),
        "slice": (lambda: slice_trace(ONE, out / "s", start=1.0), _segments(ONE)),
        "slice a set": (lambda: slice_trace(set_dir, out / "ss", start=0.5), _segments(set_dir)),
    }


@pytest.mark.parametrize(
    "command",
    ["analyze", "analyze a set", "report", "report a set", "compare", "export", "slice", "slice a set"],
)
def test_a_command_opens_each_segment_once(command, opens, two_hosts, tmp_path) -> None:
    run, expected = _commands(tmp_path, two_hosts)[command]
    run()
    assert set(opens) == expected
    assert {p: n for p, n in opens.items() if n != 1} == {}


def test_compare_a_set_with_its_own_member_opens_that_member_twice(opens, two_hosts, tmp_path) -> None:
    """A and B are two traces even when B is a part of A: each is opened once."""
    run, expected = _commands(tmp_path, two_hosts)["compare a set"]
    run()
    h1 = _segments(two_hosts / "h1")
    assert set(opens) == expected
    assert {p: n for p, n in opens.items()} == {p: 2 if p in h1 else 1 for p in expected}


@pytest.mark.parametrize("which", ["one", "set"])
def test_the_opened_trace_holds_what_the_path_readers_give(which, two_hosts) -> None:
    """Trace.open's segments, metadata, members and rows are open_trace's, read_metadata's,
    trace_set_members' and scan_trace's of the same path."""
    path = ONE if which == "one" else two_hosts
    t = Trace.open(path)
    assert t.path == path
    assert [(s.path, s.rows, s.row_groups, s.shift_ns, s.host) for s in t.segments] == [
        (s.path, s.rows, s.row_groups, s.shift_ns, s.host) for s in open_trace(path)
    ]
    assert t.meta == read_metadata(path)
    assert t.members == (None if which == "one" else tuple(trace_set_members(path)))
    assert t.scan().collect().equals(scan_trace(path).collect())
    if which == "set":
        assert [m.meta for m in t.member_traces] == [read_metadata(m.path) for m in t.members]
        assert t.meta["hostname"] == "h1,h2" and len(t.segments) == 2
        assert [s.host for s in t.segments] == ["h1", "h2"] and t.segments[1].shift_ns == 3 * 10**9
