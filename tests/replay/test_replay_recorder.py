"""Which recorder `replay --record` runs (docs/replay.md, *--record*): the program
TRAINIO_RECORD names, else trainio-record next to the replay's executable, else on PATH;
a TRAINIO_RECORD that is not an executable file is refused in one line, exit 2, before
any work."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from replay_helpers import MPI_ENV, REPLAY_BIN, TRAINIO, write_workload

# A recorder that records nothing: it makes its output directory (as trainio-record
# does), notes its arguments, says the line the replay waits for, and notes the SIGINT
# that stops it.
STAND_IN = """#!/bin/bash
mkdir -p "$2"
printf '%s\\n' "$@" > "$STAND_IN_LOG.args"
trap 'echo stopped > "$STAND_IN_LOG.stopped"; exit 0' INT
echo "trainio record: recording block into $2" >&2
while :; do sleep 0.05; done
"""


def _replay(tmpfs_dir: Path, record_env: str, *, log: Path | None = None) -> subprocess.Popen[str]:
    wl = write_workload(tmpfs_dir / "wl.yaml", files=4, record=64 << 10, batch=2, compute=0.01)
    env = {**os.environ, **MPI_ENV, "TRAINIO_RECORD": record_env}
    if log is not None:
        env["STAND_IN_LOG"] = str(log)
    cmd = [TRAINIO, "replay", "--workload", wl, "--data-dir", tmpfs_dir / "d", "--gpus", "1"]
    cmd += ["--generate", "--record", tmpfs_dir / "rec"]
    return subprocess.Popen(list(map(str, cmd)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_the_recorder_trainio_record_names_is_run_and_stopped(tmpfs_dir: Path) -> None:
    assert REPLAY_BIN.exists(), "run 'make' first"
    stand_in = tmpfs_dir / "my recorder"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    log = tmpfs_dir / "log"
    p = _replay(tmpfs_dir, str(stand_in), log=log)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    # bin/trainio execs the replay: the pid it was given is the replay's own
    assert log.with_suffix(".args").read_text().split("\n")[:4] == [
        "--output",
        str(tmpfs_dir / "rec"),
        "--pid",
        str(p.pid),
    ]
    assert log.with_suffix(".stopped").read_text() == "stopped\n"
    # the replay's results, saved into the trace it recorded of itself
    saved = json.loads((tmpfs_dir / "rec" / "replay.json").read_text())
    assert saved["tool"] == "trainio replay" and saved["gpus"] == 1 and saved["steps"] == 2, saved
    assert f"recorded the replay's I/O into {tmpfs_dir / 'rec'}" in err
    assert "AU" in out


def test_a_trainio_record_that_is_not_a_program_is_refused(tmpfs_dir: Path) -> None:
    plain = tmpfs_dir / "plain"
    plain.write_text("not a program\n")
    for bad in (plain, tmpfs_dir / "absent"):
        p = _replay(tmpfs_dir, str(bad))
        out, err = p.communicate(timeout=120)
        assert p.returncode == 2, err
        assert err.strip().splitlines() == [f"trainio replay: --record: TRAINIO_RECORD={bad}: not an executable file"]
        assert not (tmpfs_dir / "rec").exists()
        assert not (tmpfs_dir / "d").exists(), "the dataset was generated before the refusal"
