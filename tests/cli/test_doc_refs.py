"""Every prose reference to a section of a page, `docs/replay.md, *Formats*` in a code comment,
an error message or a page (or `[replay.md](replay.md), *Dataset size*` in a page), names a
page of the checkout and a heading or a bold paragraph lead of that page, so a section that
moves cannot leave its old references behind."""

from __future__ import annotations

import re
from pathlib import Path

from trainio_testlib import ROOT

SOURCE_DIRS = ("analysis/trainio_analysis", "bpf", "model", "replay", "schema", "tracer", "scripts", "tests", "docs")
SUFFIXES = {".rs", ".py", ".md", ".sh", ".c", ".h", ".yaml", ".toml"}
# A repository path to a page, then `, *Section*` or ` (*Section*` or `: *Section*`.
PATH_REF = re.compile(r"((?:docs|traces)/[\w./-]+\.md)(?:,|:| \()?\s*(?://!|///|#)?\s*\*([^*\n]+)\*")
# A Markdown link to a page, then the same.
LINK_REF = re.compile(r"\]\(([\w./-]+\.md)\)(?:,|:| \()?\s*\*([^*\n]+)\*")


def _files() -> list[Path]:
    out = [ROOT / "README.md", ROOT / "configs" / "README.md", ROOT / "traces" / "README.md"]
    for d in SOURCE_DIRS:
        out += [p for p in (ROOT / d).rglob("*") if p.suffix in SUFFIXES and p.is_file() and "target" not in p.parts]
    # scripts/reference/ holds notes that docs/reference/ renders, where their links are
    # checked; this file's own examples are not references.
    skip = (ROOT / "scripts" / "reference", Path(__file__).resolve().parent / Path(__file__).name)
    return [p for p in out if p.exists() and p != skip[1] and not p.is_relative_to(skip[0])]


def _sections(page: Path) -> list[str]:
    """The page's headings and the leads of its bold paragraphs and bullets, lower case."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    heads = re.findall(r"^#{1,6} +(.+?) *#*$", text, re.M)
    leads = re.findall(r"^(?:- |\| )?\*\*([^*\n]+)\*\*", text, re.M)
    return [re.sub(r"[`*]", "", s).strip().lower() for s in heads + leads]


def refs(path: Path, text: str) -> list[tuple[Path, str]]:
    """The (page, section) pairs `text` of file `path` refers to."""
    out = [(ROOT / page, section) for page, section in PATH_REF.findall(text)]
    if path.suffix == ".md":
        out += [((path.parent / page).resolve(), section) for page, section in LINK_REF.findall(text)]
    return out


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name


def broken(path: Path, text: str) -> list[str]:
    """The references of `text` (in file `path`) whose page or section does not exist."""
    bad = []
    for page, section in refs(path, text):
        want = re.sub(r"[`*]", "", section).strip().lower().rstrip(".")
        if not page.exists():
            bad.append(f"{_name(page)}: no such page")
        elif not any(want in s for s in _sections(page)):
            bad.append(f"{_name(page)}, *{section}*: no such heading or bold lead")
    return bad


def test_section_references_name_a_section_of_their_page() -> None:
    found, bad = 0, []
    for path in _files():
        text = path.read_text(errors="replace")
        found += len(refs(path, text))
        bad += [f"{path.relative_to(ROOT)}: {b}" for b in broken(path, text)]
    assert found > 40, f"only {found} section references found: the patterns no longer match the house style"
    assert not bad, "\n".join(bad)


def test_the_checker_sees_a_moved_section(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("# Page\n\n## Formats\n\n**The collective.** text\n")
    assert broken(page, "[p](p.md), *Formats*; [p](p.md) (*The collective*)") == []
    assert broken(page, "[p](p.md), *Checkpoints*") == ["p.md, *Checkpoints*: no such heading or bold lead"]
    assert broken(ROOT / "x.rs", "// (docs/no-such-page.md, *Formats*)") == ["docs/no-such-page.md: no such page"]
