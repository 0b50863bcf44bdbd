"""Progress of datagen and replay (issue #34 item 7): a bar on a terminal, drawn while the
work runs; without a terminal one line every TRAINIO_PROGRESS_S seconds; nothing with -q."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from replay_helpers import MPI_ENV, TRAINIO, run_trainio, write_workload

from trainio_testlib import under_a_terminal

STEPS = 40


def _workload(tmp_path: Path) -> Path:
    # 40 steps of 50 ms compute: about 2 s of replay, long enough for several draws.
    return write_workload(tmp_path / "w.yaml", files=64, record=1 << 20, batch=1, threads=1, compute=0.05)


def test_a_terminal_shows_a_bar_that_moves_while_the_replay_runs(tmp_path: Path) -> None:
    wl, data = _workload(tmp_path), tmp_path / "d"
    env = {**os.environ, **MPI_ENV, "TERM": "xterm-256color"}
    rc, got, ended = under_a_terminal([TRAINIO, "datagen", "--workload", wl, "--data-dir", data], env)
    assert rc == 0, b"".join(c for _, c in got)
    # Each draw: "datagen <bar> K MiB/64.00 MiB ...", several with distinct K before it ended.
    early = b"".join(c for t, c in got if t < ended).decode(errors="replace")
    done = sorted({float(k) for k in re.findall(r"datagen \S+ ([\d.]+) MiB/64\.00 MiB", early)})
    assert len(done) >= 3 and done[0] < 32, (done, early[-2000:])
    rc, got, ended = under_a_terminal([TRAINIO, "replay", "--workload", wl, "--data-dir", data, "--steps", STEPS], env)
    text = b"".join(c for _, c in got).decode(errors="replace")
    assert rc == 0, text
    # Each draw of the bar: "replay <bar> step K/40 ...". Draws seen before the process
    # ended, with distinct K, are updates while it ran (not one summary at the end).
    early = b"".join(c for t, c in got if t < ended).decode(errors="replace")
    steps = sorted({int(k) for k in re.findall(rf"step (\d+)/{STEPS}", early)})
    assert len(steps) >= 3 and steps[0] < STEPS // 2, (steps, text[-2000:])
    assert "AU so far" in early, text[-2000:]


def test_without_a_terminal_a_line_comes_every_interval_and_q_silences_it(tmp_path: Path) -> None:
    wl, data = _workload(tmp_path), tmp_path / "d"
    env = {**os.environ, **MPI_ENV, "TRAINIO_PROGRESS_S": "0.01"}
    gen = run_trainio("datagen", "--workload", wl, "--data-dir", data, env=env)
    # Each written MiB advances the count; lines are at least 10 ms apart.
    lines = [ln for ln in gen.stderr.splitlines() if ln.startswith("datagen: ")]
    shape = r"datagen: [\d.]+ \S+/64\.0 MiB \(\d+%\), [\d.]+ \S+/s, eta "
    assert lines and all(re.match(shape, ln) for ln in lines), gen.stderr

    env["TRAINIO_PROGRESS_S"] = "0.3"
    p = subprocess.Popen(
        [str(TRAINIO), "replay", "--workload", str(wl), "--data-dir", str(data), "--steps", str(STEPS)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert p.stderr is not None
    seen = []
    for line in p.stderr:
        if line.startswith("replay: step "):
            seen.append((p.poll() is None, line.strip()))
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0, out
    # About 2 s of steps at one line per 0.3 s: several lines, printed while it ran.
    assert len(seen) >= 3 and all(running for running, _ in seen), seen
    shape = rf"replay: step (\d+)/{STEPS} \(\d+%\), [\d.]+ steps/s, eta \S+ s"
    done = [int(re.match(shape, ln).group(1)) for _, ln in seen]
    assert done == sorted(done) and done[0] < done[-1] < STEPS, seen
    au = [float(m.group(1)) for _, ln in seen if (m := re.search(r"AU so far ([\d.]+)%", ln))]
    assert au and all(0 < a <= 100 for a in au), seen

    quiet = run_trainio("replay", "--workload", wl, "--data-dir", data, "--steps", 8, "-q", env=env)
    assert not re.search(r"^(replay|datagen): ", quiet.stderr, re.M), quiet.stderr


def test_a_bad_interval_is_one_line_before_any_work(tmp_path: Path) -> None:
    wl, data = _workload(tmp_path), tmp_path / "d"
    for bad in ("0", "-1", "nan", "soon"):
        p = run_trainio("datagen", "--workload", wl, "--data-dir", data, check=False, env={"TRAINIO_PROGRESS_S": bad})
        assert p.returncode == 2, p.stderr
        assert p.stderr.count("\n") == 1 and f"TRAINIO_PROGRESS_S={bad}" in p.stderr, p.stderr
        assert not data.exists(), "datagen wrote before it checked its input"
    # -q needs no interval: the variable is not read.
    ok = run_trainio("datagen", "--workload", wl, "--data-dir", data, "-q", env={"TRAINIO_PROGRESS_S": "0"})
    assert ok.returncode == 0
