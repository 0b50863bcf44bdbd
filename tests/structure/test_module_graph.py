"""No module cycle: within each Rust crate (``crate::x::y`` references between the modules
of its src/ tree, each file one module) and within the analysis package and its subpackages
(``trainio_analysis.x`` and ``trainio_analysis.x.y`` imports, at module level or inside
functions), a module never depends on itself through others."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from trainio_testlib import ROOT

CRATES = ("tracer", "schema", "model", "analysis/native", "replay")


def rust_modules(src: Path) -> dict[str, Path]:
    """Module path ("formats::hdf5") -> its file, for every .rs file under src. A module's
    children sit in the directory of its name (formats.rs and formats/hdf5.rs)."""
    mods = {}
    for p in src.rglob("*.rs"):
        parts = p.relative_to(src).with_suffix("").parts
        if parts[-1] == "mod":
            parts = parts[:-1]
        mods["::".join(parts)] = p
    return mods


def rust_graph(src: Path) -> dict[str, set[str]]:
    """Module -> the crate's modules it names (comments left out): `crate::a::b` paths,
    each the longest module path it starts with, and a module's own children by name."""
    mods = rust_modules(src)
    graph = {}
    for name, p in mods.items():
        code = re.sub(r"//[^\n]*", "", p.read_text())
        deps = set()
        for path in re.findall(r"\bcrate((?:::\w+)+)", code):
            segs = path.split("::")[1:]
            prefixes = ("::".join(segs[:n]) for n in range(len(segs), 0, -1))
            deps |= {next((m for m in prefixes if m in mods), "")}
        prefix = "" if name in ("main", "lib") else name + "::"
        for child in (m for m in mods if m.startswith(prefix) and "::" not in m[len(prefix) :]):
            if re.search(rf"(?<![:\w]){child[len(prefix) :]}::", code):
                deps.add(child)
        graph[name] = deps - {name, ""}
    return graph


def python_modules(package: Path) -> dict[str, Path]:
    """Module name ("trace", "trace.read") -> its file, for every .py file in the package and
    its subpackages; a subpackage's ``__init__.py`` is the subpackage's module."""
    mods = {}
    for p in package.rglob("*.py"):
        parts = p.relative_to(package).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            mods[".".join(parts)] = p
    return mods


def python_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports: for ``trainio_analysis.a.b``, the longest
    of ``a.b`` and ``a`` that is a module, and for ``from trainio_analysis.a import c``, the
    module ``a.c`` when it is one."""
    mods = python_modules(package)

    def longest(parts: list[str]) -> str | None:
        return next((m for n in range(len(parts), 0, -1) if (m := ".".join(parts[:n])) in mods), None)

    graph = {}
    for name, p in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                parts = node.module.split(".")
                if parts[0] == package.name:
                    deps |= {longest([*parts[1:], a.name]) for a in node.names}
            elif isinstance(node, ast.Import):
                for a in node.names:
                    parts = a.name.split(".")
                    if parts[0] == package.name:
                        deps.add(longest(parts[1:]))
        graph[name] = deps - {name, None}
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


def test_rust_graph_reads_nested_modules(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d.rs").write_text("pub mod e;\npub mod f;\nuse e::Y;\n")
    (tmp_path / "d" / "e.rs").write_text("use crate::d::f::Z;\nfn g() { crate::d::h(); }\n")
    (tmp_path / "d" / "f.rs").write_text("use crate::c::W;\n")
    (tmp_path / "c.rs").write_text("fn k() { d::e::x(); crate::d::e::y(); }\n")
    graph = rust_graph(tmp_path)
    assert graph == {"d": {"d::e"}, "d::e": {"d::f", "d"}, "d::f": {"c"}, "c": {"d::e"}}
    assert cycles(graph) == {("d", "d::e"), ("c", "d::e", "d::f")}


@pytest.mark.parametrize("crate", CRATES)
def test_rust_crate_has_no_module_cycle(crate: str) -> None:
    graph = rust_graph(ROOT / crate / "src")
    assert len(graph) >= 1
    assert cycles(graph) == set()


def test_python_graph_reads_subpackages(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.sub import read\nfrom pkg import b\n")
    (package / "b.py").write_text("import pkg.sub.write\n")
    (package / "sub" / "__init__.py").write_text("from pkg.sub.read import x\nfrom pkg.sub.write import y\n")
    (package / "sub" / "read.py").write_text("def f():\n    from pkg.a import g\n")
    (package / "sub" / "write.py").write_text("from pkg.sub import helper\n")
    graph = python_graph(package)
    assert graph == {
        "a": {"sub.read", "b"},
        "b": {"sub.write"},
        "sub": {"sub.read", "sub.write"},
        "sub.read": {"a"},
        "sub.write": {"sub"},
    }
    assert cycles(graph) == {("a", "sub.read"), ("sub", "sub.write"), ("a", "b", "sub", "sub.read", "sub.write")}


def test_analysis_package_has_no_module_cycle() -> None:
    graph = python_graph(ROOT / "analysis/trainio_analysis")
    assert "analyze.run" in graph and "trace" in graph["analyze.run"] and "analyze.run" in graph["analyze"]
    assert {"trace.read", "trace.check"} <= graph["trace"] and "trace.check" in graph["trace.read"]
    assert cycles(graph) == set()


def group_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Module graph -> the graph of its groups (each module counted as its top-level
    module: ``formats::hdf5`` is in ``formats``), a group's edges to itself left out."""
    groups: dict[str, set[str]] = {}
    for name, deps in graph.items():
        group = name.split("::")[0]
        groups.setdefault(group, set()).update(d.split("::")[0] for d in deps)
    return {g: deps - {g} for g, deps in groups.items()}


def mutual(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Every pair of nodes that depend on each other, each pair sorted."""
    return {(a, b) for a in graph for b in graph[a] if a < b and a in graph.get(b, ())}


# replay's groups that still depend on each other, each with what each side uses of the
# other. A pair leaves the list when it is broken; a new pair fails the test.
REPLAY_GROUP_LOOPS = {
    ("checkpoint", "object"): "checkpointing writes through s3_writes; s3_writes names a CheckpointSpec",
    ("cluster", "errors"): "the cluster raises InputError; errors knows the watchdog's lost rank",
    ("dataset", "workload"): "a Layout is made from a Workload; workload's program and dlio_dataset read Layouts",
    ("engine", "trace"): "the engine runs trace_writes' bursts; trace_input's program is an engine Program",
    ("mlperf", "workload"): "datasize and runrules read a Workload; a Workload takes its AU from edition",
}


def test_group_graph_and_mutual_pairs() -> None:
    graph = {"a": {"a::x", "b"}, "a::x": {"b::y"}, "b": set(), "b::y": {"a"}, "c": {"b"}}
    assert group_graph(graph) == {"a": {"b"}, "b": {"a"}, "c": {"b"}}
    assert mutual(group_graph(graph)) == {("a", "b")}


def test_replay_groups_do_not_loop_beyond_the_named_pairs() -> None:
    groups = group_graph(rust_graph(ROOT / "replay/src"))
    # workload reads the Parquet and checkpoint sections of its YAML; neither reads a
    # Workload back (the YAML's typed reads are a module of their own, yaml_keys).
    assert "formats" in groups["workload"] and "workload" not in groups["formats"]
    assert "checkpoint" in groups["workload"] and "workload" not in groups["checkpoint"]
    assert mutual(groups) == set(REPLAY_GROUP_LOOPS)
