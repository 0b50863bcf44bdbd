"""The recorder's progress (issue #34 item 7): a status line redrawn while it records on a
terminal no traced command shares; otherwise one line every TRAINIO_PROGRESS_S seconds,
with the events counted so far; nothing with -q; a bad interval refused before anything."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainio_testlib import TRAINIO, under_a_terminal

pytestmark = [pytest.mark.root]

LINE = re.compile(
    r"record: (\d+) s, (\d+) events \([\d.]+ ?[kM]?/s\), read [\d.]+ MiB, wrote [\d.]+ MiB, \d+ segments?, lost \d+"
)

# Reads a 1 MiB file 20 times, 0.1 s apart (about 2 s), then leaves a marker: the
# progress lines read before the marker came while the traced job ran.
READER = """
import sys, time
data, marker = sys.argv[1], sys.argv[2]
for _ in range(20):
    with open(data, "rb") as f:
        f.read()
    time.sleep(0.1)
open(marker, "w").close()
"""


def test_lines_come_while_the_command_runs_and_count_its_events(tmp_path: Path) -> None:
    data, marker = tmp_path / "data", tmp_path / "done"
    data.write_bytes(os.urandom(1 << 20))
    script = tmp_path / "reader.py"
    script.write_text(READER)
    env = {**os.environ, "TRAINIO_PROGRESS_S": "0.2"}
    cmd = [TRAINIO, "record", "--layers", "file", "-o", tmp_path / "t", "--", sys.executable, script, data, marker]
    with subprocess.Popen([str(c) for c in cmd], stderr=subprocess.PIPE, text=True, env=env) as p:
        assert p.stderr is not None
        before: list[str] = []
        rest = ""
        for line in p.stderr:
            if marker.exists():
                rest = line
                break
            before.append(line)
        rest += p.stderr.read()
        assert p.wait(timeout=60) == 0, "".join(before) + rest
    lines = [m for m in map(LINE.match, before) if m]
    assert len(lines) >= 3, "".join(before)
    events = [int(m.group(2)) for m in lines]
    assert events == sorted(events) and events[-1] > events[0], events
    assert "trainio record: trace " in rest, rest


def test_q_silences_the_lines(tmp_path: Path) -> None:
    env = {**os.environ, "TRAINIO_PROGRESS_S": "0.1"}
    cmd = [TRAINIO, "record", "-q", "--layers", "file", "-o", tmp_path / "t", "--", "sleep", "1"]
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    assert not re.search(r"^record: ", p.stderr, re.M), p.stderr


def test_a_terminal_shows_a_status_line_redrawn_in_place(tmp_path: Path) -> None:
    """No command: the recorder alone writes to the terminal, so its line is redrawn (a
    carriage return, no newline) about every second, and cleared before the summary."""
    cmd = [TRAINIO, "record", "--layers", "file", "--duration", "3.5", "-o", tmp_path / "t"]
    rc, got, ended = under_a_terminal(cmd, {**os.environ, "TERM": "xterm-256color"})
    text = b"".join(c for _, c in got).decode(errors="replace")
    assert rc == 0, text
    early = b"".join(c for t, c in got if t < ended - 0.3).decode(errors="replace")
    draws = re.findall(r"\r(record: (\d+) s, \d+ events[^\r\n]*)", early)
    assert len({s for _, s in draws}) >= 2, text
    assert not any("\n" in d for d, _ in draws)
    summary = text.index("trainio record: trace ")
    assert text[:summary].rstrip(" ").endswith("\r"), repr(text[max(0, summary - 200) : summary])


@pytest.mark.parametrize("value", ["0", "-1", "nan", "soon"])
def test_a_bad_interval_is_refused_before_anything(tmp_path: Path, value: str) -> None:
    out = tmp_path / "t"
    env = {**os.environ, "TRAINIO_PROGRESS_S": value}
    started = time.monotonic()
    p = subprocess.run(
        [str(TRAINIO), "record", "-o", str(out), "--", "true"], capture_output=True, text=True, env=env, timeout=60
    )
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and f"TRAINIO_PROGRESS_S={value}" in p.stderr, p.stderr
    assert not out.exists() and time.monotonic() - started < 30
