"""docs/reference/ is what scripts/gen-reference.py makes from the commands' own parsers: a
regeneration must change nothing (after a change to a command's options, `make reference`),
and every long option each command's --help lists is on its page."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainio_testlib import ROOT, TRAINIO

REFERENCE = ROOT / "docs" / "reference"
COMMANDS = (
    "record",
    "analyze",
    "report",
    "compare",
    "export",
    "import",
    "slice",
    "replay",
    "datagen",
    "sweep",
    "datasize",
)


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("reference")
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen-reference.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    return out


def test_reference_is_what_the_parsers_say(regenerated: Path) -> None:
    made = sorted(p.name for p in regenerated.iterdir())
    assert made == sorted([*(f"{c}.md" for c in COMMANDS), "README.md"])
    kept = sorted(p.name for p in REFERENCE.glob("*.md"))
    assert kept == made, "docs/reference/ holds other pages than the generator makes: run `make reference`"
    stale = [n for n in made if (regenerated / n).read_text() != (REFERENCE / n).read_text()]
    assert not stale, f"docs/reference/{stale} differ from the parsers: run `make reference`"


def _long_options(help_text: str) -> set[str]:
    """Every long option an option line of --help names (lines that start with -x or --x)."""
    out = set()
    for line in help_text.splitlines():
        m = re.match(r"^\s+(-\w( \S+)?,\s+)?(--[\w-]+)", line)
        if m:
            out.add(m.group(3))
    return out


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_long_option_has_its_entry(cmd: str) -> None:
    """Read from --help independently of the generator, so an option the generator fails to
    parse is caught here too; each has its own heading on the command's page."""
    h = subprocess.run([str(TRAINIO), cmd, "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert h.returncode == 0, h.stderr
    longs = _long_options(h.stdout)
    assert {"--help", "--version"} <= longs and len(longs) >= 4, longs
    page = (REFERENCE / f"{cmd}.md").read_text()
    headings = re.findall(r"^### `(.*)`$", page, re.M)
    documented = {o for hd in headings for o in re.findall(r"--[\w-]+", hd.split("<")[0])}
    assert longs - documented == set(), f"docs/reference/{cmd}.md lacks {sorted(longs - documented)}"
    assert documented - longs == set(), f"docs/reference/{cmd}.md documents {sorted(documented - longs)}"


def test_hand_written_parts_survive_regeneration(regenerated: Path) -> None:
    """Each command's examples and notes (scripts/reference/CMD.md) are on its page."""
    for cmd in COMMANDS:
        hand = (ROOT / "scripts" / "reference" / f"{cmd}.md").read_text()
        page = (regenerated / f"{cmd}.md").read_text()
        assert "## Examples" in page, cmd
        examples = re.findall(r"^trainio .*$|^mpirun .*$", hand, re.M)
        assert 1 <= len(examples) <= 4, (cmd, examples)
        for line in examples:
            assert line in page, (cmd, line)


def _runnable_examples() -> list[tuple[str, str]]:
    """(command, line) of each hand-written example that needs neither root nor files
    outside the checkout: analysis commands and datasize on traces/ and configs/."""
    out = []
    for cmd in ("analyze", "report", "compare", "export", "datasize"):
        for line in re.findall(r"^trainio .*$", (ROOT / "scripts" / "reference" / f"{cmd}.md").read_text(), re.M):
            args = line.split("|")[0].split()[2:]
            if all(not re.fullmatch(r"[A-Z]+", a) and "*" not in a for a in args):
                out.append((cmd, line))
    return out


def test_examples_on_the_sample_traces_run(tmp_path: Path) -> None:
    """Every example on the sample traces runs as written (its output redirected into a
    temporary directory), so a renamed option or a wrong value in an example fails here."""
    examples = _runnable_examples()
    assert {c for c, _ in examples} == {"analyze", "report", "compare", "export", "datasize"}, examples
    for n, (cmd, line) in enumerate(examples):
        args = line.split("|")[0].split()[1:]
        (tmp_path / f"out{n}").mkdir()
        for i, a in enumerate(args[:-1]):
            if a in ("-o", "--output") or (cmd == "datasize" and a == "--json"):
                args[i + 1] = str(tmp_path / f"out{n}" / Path(args[i + 1]).name)
        r = subprocess.run([str(TRAINIO), *args], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
        assert r.returncode == 0, f"{line}: {r.stderr}"
        assert r.stdout or any((tmp_path / f"out{n}").iterdir()), line
