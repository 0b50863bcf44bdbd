"""Every relative link in README.md and docs/**/*.md names a file of the checkout, and a
link's #anchor into a Markdown page names one of that page's headings (GitHub's slugs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainio_testlib import ROOT

PAGES = sorted([ROOT / "README.md", ROOT / "traces" / "README.md", *(ROOT / "docs").rglob("*.md")])
LINK = re.compile(r"(?<!\!)\[[^\]\n]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The page without fenced code blocks and inline code, where brackets are not links."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "``", text)


def slugs(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as
    hyphens, a repeated heading numbered -1, -2, ..."""
    out: set[str] = set()
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    for m in re.finditer(r"^#{1,6} +(.+?) *#*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n, base = 0, slug
        while slug in out:
            n += 1
            slug = f"{base}-{n}"
        out.add(slug)
    return out


def links(page: Path) -> list[str]:
    return [t for t in LINK.findall(_prose(page.read_text())) if not re.match(r"^[a-z]+:", t)]


def test_pages_are_found() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    assert {"README.md", "docs/guide.md", "docs/measurements.md", "docs/reference/replay.md"} <= names
    assert sum(len(links(p)) for p in PAGES) > 50


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in slugs(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_readme_is_short_and_links_every_command_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    for page in (ROOT / "docs" / "reference").glob("*.md"):
        assert f"docs/reference/{page.name}" in readme, page.name


def test_the_checker_sees_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("# A page\n\n[ok](p.md#a-page) [bad](q.md) `[code](x.md)`\n\n```\n[fenced](y.md)\n```\n")
    assert links(page) == ["p.md#a-page", "q.md"]
    assert slugs(page) == {"a-page"}
