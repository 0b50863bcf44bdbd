"""No module cycle: within each Rust crate (``crate::x::y`` references between the modules
of its src/ tree, each file one module) and within the analysis package (``trainio_analysis.x`` imports, at module level
or inside functions), a module never depends on itself through others."""

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


def test_analysis_package_has_no_module_cycle() -> None:
    graph = python_graph(ROOT / "analysis/trainio_analysis")
    assert "analyze" in graph and "trace" in graph["analyze"]
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
