"""A purpose line atop every file: each Rust source of each crate opens with a ``//!`` module
doc (after any ``#![...]`` crate attributes), each analysis module with a docstring. And the
job model stays in modules of one concern each, none a room to split."""

from __future__ import annotations

import ast

import pytest

from trainio_testlib import ROOT

CRATES = ("tracer", "schema", "model", "analysis/native", "replay")
# model/src: the modules its lib.rs names as its parts, each under this many lines
MODEL_MAX_LINES = 600


def rust_purpose(text: str) -> bool:
    """The first line that is not blank nor a crate attribute is a `//!` doc line."""
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith("#!["):
            continue
        return s.startswith("//!")
    return False


def test_rust_purpose_reads_the_first_line_after_attributes() -> None:
    assert rust_purpose('#![recursion_limit = "256"]\n//! The replayer.\n')
    assert not rust_purpose("use std::fs;\n//! too late\n")
    assert not rust_purpose("// a plain comment\n")
    assert not rust_purpose("")


@pytest.mark.parametrize("crate", CRATES)
def test_every_rust_file_has_a_purpose_line(crate: str) -> None:
    files = sorted((ROOT / crate / "src").rglob("*.rs"))
    assert files
    assert [str(p.relative_to(ROOT)) for p in files if not rust_purpose(p.read_text())] == []


def test_every_analysis_module_has_a_docstring() -> None:
    modules = sorted((ROOT / "analysis/trainio_analysis").glob("*.py"))
    missing = [
        p.name
        for p in modules
        if p.read_text().strip()  # an empty __init__.py says nothing
        and not ast.get_docstring(ast.parse(p.read_text()))
    ]
    assert modules and missing == []


def test_model_modules_are_small_and_named_by_lib() -> None:
    src = ROOT / "model/src"
    lib = (src / "lib.rs").read_text()
    modules = sorted(p.stem for p in src.glob("*.rs") if p.stem not in ("lib", "tests"))
    assert len(modules) >= 10
    big = {
        p.name: n
        for p in src.glob("*.rs")
        if p.stem != "tests" and (n := len(p.read_text().splitlines())) > MODEL_MAX_LINES
    }
    assert big == {}
    # every module is declared (a file lib.rs does not name is not compiled)
    assert [m for m in modules if f"mod {m};" not in lib] == []
