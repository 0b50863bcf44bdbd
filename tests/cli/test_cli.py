"""One command line: every command answers --help and --version as `trainio COMMAND`, and
on a fresh clone (nothing built, no .venv) `trainio --version` and the analysis commands'
help work. docs/cli.md is the contract."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from trainio_testlib import ROOT, TRAINIO

ANALYSIS = ("analyze", "report", "compare", "export", "import", "slice")
COMPILED = ("record", "replay", "datagen", "sweep")
VERSION = re.search(
    r'^\[workspace\.package\][^\[]*?^version\s*=\s*"([^"]+)"', (ROOT / "Cargo.toml").read_text(), re.M | re.S
).group(1)


def run(trainio: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(trainio), *args], capture_output=True, text=True, timeout=60, env=env)


def usage_line(help_text: str) -> str:
    return next(line for line in help_text.splitlines() if line.startswith("Usage:"))


@pytest.fixture(scope="module")
def fresh_clone(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A clone of this checkout's HEAD (what a newcomer gets: no target/, no .venv, no
    native extension) and an environment whose python3 is not a venv's and in which
    importing polars, pyarrow, numpy or plotly fails, so help that needs them fails."""
    tmp = tmp_path_factory.mktemp("cli")
    clone = tmp / "trainio"
    subprocess.run(
        ["git", "clone", "-q", "--depth", "1", f"file://{ROOT}", str(clone)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    assert not (clone / ".venv").exists() and not (clone / "target").exists()
    assert not (clone / "analysis" / "trainio_analysis" / "_native.so").exists()
    poison = tmp / "poison"
    poison.mkdir()
    for mod in ("polars", "pyarrow", "numpy", "plotly"):
        (poison / f"{mod}.py").write_text(f"raise ImportError('{mod} imported by --help')\n")
    path = [d for d in os.environ["PATH"].split(":") if d and ".venv" not in d]
    env = {**os.environ, "PATH": ":".join(path), "PYTHONPATH": str(poison)}
    env.pop("VIRTUAL_ENV", None)
    python3 = shutil.which("python3", path=env["PATH"])
    assert python3 and ".venv" not in python3, "a python3 outside the venv is needed"
    return clone / "bin" / "trainio", env


def test_fresh_clone_answers_version_and_help_before_a_build(fresh_clone) -> None:
    trainio, env = fresh_clone
    r = run(trainio, "--version", env=env)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"trainio {VERSION}\n", "")
    r = run(trainio, "--help", env=env)
    assert r.returncode == 0 and r.stdout.startswith("Usage: trainio COMMAND")
    for cmd in (*ANALYSIS, *COMPILED):
        assert re.search(rf"^  {cmd} ", r.stdout, re.M), f"{cmd} missing from trainio --help"
    for cmd in ANALYSIS:
        h = run(trainio, cmd, "--help", env=env)
        assert h.returncode == 0, f"{cmd} --help: {h.stderr}"
        assert usage_line(h.stdout).startswith(f"Usage: trainio {cmd} "), h.stdout
        assert "\nOptions:\n" in h.stdout and "--version" in h.stdout
        v = run(trainio, cmd, "--version", env=env)
        assert (v.returncode, v.stdout) == (0, f"trainio {cmd} {VERSION}\n"), v.stderr


def test_fresh_clone_commands_that_need_a_build_say_so(fresh_clone) -> None:
    """A compiled command before `make`, or an analysis command asked to run: one line naming
    what is missing and `make`, exit 2."""
    trainio, env = fresh_clone
    for args in (("record", "--help"), ("replay", "--version"), ("sweep", "--help"), ("analyze", "t")):
        r = run(trainio, *args, env=env)
        assert r.returncode == 2 and r.stdout == "", (args, r)
        assert r.stderr.count("\n") == 1 and f"trainio {args[0]}: " in r.stderr and "run 'make'" in r.stderr, r.stderr
    r = run(trainio, "bogus", env=env)
    assert r.returncode == 2 and "unknown command 'bogus'" in r.stderr


@pytest.mark.parametrize("cmd", (*ANALYSIS, *COMPILED))
def test_every_built_command_is_trainio_command(cmd: str) -> None:
    """After `make`: each command's help names it `trainio COMMAND` and its --version says
    `trainio COMMAND VERSION`, the one version of Cargo.toml."""
    h = run(TRAINIO, cmd, "--help")
    assert h.returncode == 0, h.stderr
    assert usage_line(h.stdout).startswith(f"Usage: trainio {cmd} "), h.stdout
    assert "Options:" in h.stdout and "-V, --version" in h.stdout
    v = run(TRAINIO, cmd, "--version")
    assert (v.returncode, v.stdout) == (0, f"trainio {cmd} {VERSION}\n"), v.stderr


def test_output_and_json_options_mean_what_docs_cli_says() -> None:
    """-o is the made thing's path wherever it exists; --json is a flag where the object goes
    to stdout and takes a FILE in replay and sweep (docs/cli.md)."""
    helps = {cmd: run(TRAINIO, cmd, "--help").stdout for cmd in (*ANALYSIS, *COMPILED)}
    for cmd in ("record", "report", "export", "import", "slice"):
        assert re.search(r"-o( \S+)?, --output", helps[cmd]), cmd
    for cmd in ("analyze", "compare", "replay", "datagen", "sweep"):
        assert "--output" not in helps[cmd], cmd
    for cmd in ("analyze", "compare", "export", "import", "slice"):
        assert re.search(r"^\s+--json\s+print", helps[cmd], re.M), cmd
    for cmd in ("replay", "sweep"):
        assert "--json <FILE>" in helps[cmd], cmd
    doc = (ROOT / "docs" / "cli.md").read_text()
    for cmd in (*ANALYSIS, *COMPILED):
        assert f"`{cmd}`" in doc, f"docs/cli.md does not mention {cmd}"
