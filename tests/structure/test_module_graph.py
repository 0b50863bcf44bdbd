"""No module cycle: within each Rust crate (``crate::x`` references between its src/*.rs
modules) and within the analysis package (``trainio_analysis.x`` imports, at module level
or inside functions), a module never depends on itself through others."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from trainio_testlib import ROOT

CRATES = ("tracer", "schema", "model", "analysis/native", "replay")


def rust_graph(src: Path) -> dict[str, set[str]]:
    """Module -> the crate's modules it names (comments left out)."""
    mods = {p.stem for p in src.glob("*.rs")}
    graph = {}
    for p in src.glob("*.rs"):
        code = re.sub(r"//[^\n]*", "", p.read_text())
        graph[p.stem] = {m for m in re.findall(r"\bcrate::(\w+)", code) if m in mods and m != p.stem}
    return graph


def python_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    mods = {p.stem for p in package.glob("*.py")}
    graph = {}
    for p in package.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                parts = node.module.split(".")
                if parts[0] == package.name:
                    if len(parts) > 1:
                        deps.add(parts[1])
                    else:
                        deps |= {a.name for a in node.names}
            elif isinstance(node, ast.Import):
                for a in node.names:
                    parts = a.name.split(".")
                    if parts[0] == package.name and len(parts) > 1:
                        deps.add(parts[1])
        graph[p.stem] = (deps & mods) - {p.stem}
    return graph


def cycles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """Every elementary cycle, each as the sorted tuple of its modules."""
    found = set()

    def walk(node: str, path: list[str]) -> None:
        for nxt in graph.get(node, ()):
            if nxt == path[0]:
                found.add(tuple(sorted(path)))
            elif nxt not in path and nxt > path[0]:  # each cycle once, from its least module
                walk(nxt, [*path, nxt])

    for start in graph:
        walk(start, [start])
    return found


def test_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}}
    assert cycles(graph) == {("a", "b", "c"), ("e", "f")}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == set()


def test_rust_graph_reads_crate_paths(tmp_path: Path) -> None:
    (tmp_path / "a.rs").write_text("use crate::b::X;\n// crate::c is only named in a comment\n")
    (tmp_path / "b.rs").write_text("fn f() { crate::a::g(); crate::missing::h(); }\n")
    (tmp_path / "c.rs").write_text("")
    assert rust_graph(tmp_path) == {"a": {"b"}, "b": {"a"}, "c": set()}


@pytest.mark.parametrize("crate", CRATES)
def test_rust_crate_has_no_module_cycle(crate: str) -> None:
    graph = rust_graph(ROOT / crate / "src")
    assert len(graph) >= 1
    assert cycles(graph) == set()


def test_analysis_package_has_no_module_cycle() -> None:
    graph = python_graph(ROOT / "analysis/trainio_analysis")
    assert "analyze" in graph and "trace" in graph["analyze"]
    assert cycles(graph) == set()
