"""README's quick start runs as it is written, without root, on a built checkout: each
command line of its block, run with no capabilities at all (as an unprivileged user when
the venv's interpreter is reachable by one, else as uid 0 with an empty capability
bounding set, which is what root brings to these commands), exits 0 and says what the
README says it does."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from trainio_testlib import ROOT

NOBODY = 65534


def quickstart_lines() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start without root", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def unprivileged(argv: list[str]) -> list[str]:
    """argv run with no capability: as nobody when nobody can run the venv's python."""
    if os.geteuid() != 0:
        return argv
    python = ROOT / ".venv" / "bin" / "python"  # the path bin/trainio checks with `[ -x ]` and runs
    probe = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "test", "-x", str(python)],
        capture_output=True,
        check=False,
    )
    if probe.returncode == 0:
        return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--no-new-privs", *argv]
    return ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs", *argv]


def test_quickstart_is_the_documented_commands() -> None:
    cmds = [shlex.split(line)[1] for line in quickstart_lines()]
    assert cmds == ["analyze", "analyze", "compare", "report", "datasize"], cmds
    for line in quickstart_lines():
        assert line.startswith("bin/trainio "), line
        for arg in shlex.split(line):
            if arg.startswith(("traces/", "configs/")):
                assert (ROOT / arg).exists(), arg


def test_the_runner_has_no_capabilities() -> None:
    status = subprocess.run(
        unprivileged(["cat", "/proc/self/status"]), capture_output=True, text=True, check=True
    ).stdout
    assert re.search(r"^CapEff:\s+0+$", status, re.M), status
    assert re.search(r"^CapBnd:\s+0+$", status, re.M) or f"Uid:\t{NOBODY}" in status


def test_quickstart_runs_without_root(tmp_path: Path) -> None:
    if shutil.which("setpriv") is None and os.geteuid() == 0:
        pytest.fail("setpriv (util-linux) is needed to drop root")
    os.chmod(tmp_path, 0o777)
    outputs = {}
    for line in quickstart_lines():
        argv = [tmp_path / "report.html" if a == "/tmp/report.html" else a for a in shlex.split(line)]
        r = subprocess.run(
            unprivileged([str(ROOT / a) if a == "bin/trainio" else str(a) for a in argv]),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert r.returncode == 0, f"{line}: exit {r.returncode}: {r.stderr}"
        outputs.setdefault(shlex.split(line)[1], []).append(r.stdout)
    human, as_json = outputs["analyze"]
    assert "QD per-issue (kernel)" in human and "lost events  none" in human, human
    assert '"job_model"' in as_json
    assert "QD W1 per-issue" in outputs["compare"][0]
    report = (tmp_path / "report.html").read_text()
    assert len(report) > 100_000 and "unet3d-demo-8gpu" in report
    # 500 steps x 8 GPUs x batch 7 (unet3d_h100.yaml), 1 sample per file, beats 5 x 128 GiB
    assert "num_files_train: 28000 (set by the 500-step rule)" in outputs["datasize"][0]
