"""A purpose line atop every file: each Rust source of each crate opens with a ``//!`` module
doc (after any ``#![...]`` crate attributes), each analysis module with a docstring. And the
job model stays in modules of one concern each, none a room to split; every source file
(Rust, the analysis package's Python, the BPF programs' C) stays under 800 lines and every
function under 150 (tests aside)."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from trainio_testlib import ROOT

CRATES = ("tracer", "schema", "model", "analysis/native", "replay")
# model/src: the modules its lib.rs names as its parts, each under this many lines
MODEL_MAX_LINES = 600
# Every source: no file over FILE_MAX_LINES, no function over FN_MAX_LINES, tests aside (a
# `*_tests.rs` file, a `#[cfg(test)]` module); each exception named with its reason
FILE_MAX_LINES = 800
FN_MAX_LINES = 150
LONG_FILES: dict[str, str] = {}
LONG_FUNCTIONS: dict[str, str] = {}


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


def blank_literals(code: str) -> str:
    """`code` with its comments, strings and character literals blanked (newlines kept), so
    that the braces left are the code's own."""
    out, i, n = [], 0, len(code)
    while i < n:
        c = code[i]
        if code.startswith("//", i):
            j = code.find("\n", i)
            i = n if j < 0 else j
        elif code.startswith("/*", i):
            j = code.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * code.count("\n", i, j))
            i = j
        elif m := re.match(r'b?r(#*)"', code[i:]):
            j = code.find('"' + m.group(1), i + m.end())
            j = n if j < 0 else j + 1 + len(m.group(1))
            out.append('""' + "\n" * code.count("\n", i, j))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and code[j] != '"':
                j += 2 if code[j] == "\\" else 1
            out.append('""' + "\n" * code.count("\n", i, j))
            i = j + 1
        elif m := re.match(r"'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^'\\\n])'", code[i:]):
            out.append("''")  # a character literal; a lifetime ('a) is left as code
            i += m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def rust_functions(text: str) -> list[tuple[str, int]]:
    """(name, lines) of every `fn` with a body, up to the file's `#[cfg(test)]` module."""
    code = blank_literals(text.split("#[cfg(test)]")[0])
    found = []
    for m in re.finditer(r"\bfn\s+(\w+)", code):
        i, nest = m.end(), 0  # past the signature: to its body's `{`, or a `;` (no body)
        while i < len(code) and not (nest == 0 and code[i] in "{;"):
            nest += {"(": 1, "[": 1, ")": -1, "]": -1}.get(code[i], 0)
            i += 1
        if i == len(code) or code[i] == ";":
            continue
        depth, i = 1, i + 1
        while depth and i < len(code):
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
        start = code.count("\n", 0, m.start())
        found.append((m.group(1), code.count("\n", 0, i) - start + 1))
    return found


def test_rust_functions_counts_lines_past_strings_and_comments() -> None:
    text = (
        "fn a() {\n"
        '    let s = "}}}";\n'
        "    let c = '{';\n"
        '    let q = \'"\'; let r = r#"}"#; /* } */\n'
        "    // }\n"
        "}\n"
        "pub trait T { fn decl(&self) -> [u8; 4]; }\n"
        "fn b<'x>(v: &'x str, w: [u8; 2]) -> &'x str {\n"
        "    v\n"
        "}\n"
        "#[cfg(test)]\nmod tests { fn long() {\n\n\n} }\n"
    )
    assert rust_functions(text) == [("a", 6), ("b", 3)]


def rust_sources(crate: str) -> list[Path]:
    """The crate's Rust files, tests aside (`*_tests.rs`, and a `tests.rs` that the crate
    declares only under `#[cfg(test)]`)."""
    return sorted(
        p
        for p in (ROOT / crate / "src").rglob("*.rs")
        if not p.stem.endswith("_tests") and not (p.stem == "tests" and declared_for_tests_only(p))
    )


def declared_for_tests_only(p: Path) -> bool:
    """Whether the module file `p` is declared by its parent only under `#[cfg(test)]`."""
    parent = p.parent.with_suffix(".rs") if p.parent.name != "src" else None
    candidates = [parent] if parent else [p.parent / "lib.rs", p.parent / "main.rs"]
    decl = re.compile(rf"#\[cfg\(test\)\]\s*(?:pub(?:\([\w:]+\))?\s+)?mod\s+{p.stem}\s*;")
    return any(c.is_file() and decl.search(c.read_text()) for c in candidates)


def python_functions(text: str) -> list[tuple[str, int]]:
    """(name, lines) of every function and method, nested ones too, from its `def` line."""
    return [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None
    ]


def test_python_functions_counts_from_def_to_last_line() -> None:
    text = (
        "@decorator\ndef a():\n    x = 1\n\n    return x\n\n\n"
        "class C:\n    def m(self):\n        def inner():\n            pass\n"
    )
    assert sorted(python_functions(text)) == [("a", 4), ("inner", 2), ("m", 3)]


def c_functions(text: str) -> list[tuple[str, int]]:
    """(name, lines) of every C function with a body: a `{` at file level right after the
    `)` of its parameters. A function a macro declares (`int BPF_PROG(name, ...)`) is named
    by the macro's first argument."""
    code = blank_literals(text)
    found, depth, i = [], 0, 0
    while i < len(code):
        c = code[i]
        if c == "}":
            depth -= 1
        elif c == "{":
            before = code[:i].rstrip()
            if depth == 0 and before.endswith(")"):
                close, nest = len(before) - 1, 0
                for j in range(close, -1, -1):  # the `(` that the `)` closes
                    nest += {")": 1, "(": -1}.get(code[j], 0)
                    if nest == 0:
                        break
                callee = re.search(r"(\w+)\s*$", code[:j])
                name = callee.group(1) if callee else "?"
                if name.isupper() or name.startswith("BPF_"):
                    first = re.match(r"\s*(\w+)", code[j + 1 : close])
                    name = first.group(1) if first else name
                start, body_depth, k = code.count("\n", 0, before.rfind("\n") + 1), 1, i + 1
                while body_depth and k < len(code):
                    body_depth += {"{": 1, "}": -1}.get(code[k], 0)
                    k += 1
                found.append((name, code.count("\n", 0, k) - start + 1))
                i = k
                continue
            depth += 1
        i += 1
    return found


def test_c_functions_finds_functions_and_macro_programs() -> None:
    text = (
        "struct s { int a; };\n"
        'static const char *msg = "{";\n'
        "static __always_inline int f(struct s *p)\n"
        "{\n"
        "    if (p) { return 1; } /* } */\n"
        "    return 0;\n"
        "}\n"
        'SEC("tp_btf/block_rq_issue")\n'
        "int BPF_PROG(tio_rq_issue, struct request *rq)\n"
        "{\n"
        "    return 0;\n"
        "}\n"
        "static int table[2] = { 1, 2 };\n"
    )
    assert c_functions(text) == [("f", 5), ("tio_rq_issue", 4)]


def sources() -> dict[str, tuple[Path, Callable[[str], list[tuple[str, int]]]]]:
    """Every source file (tests aside), relative to the repository, with its function finder."""
    out: dict[str, tuple[Path, Callable[[str], list[tuple[str, int]]]]] = {}
    for crate in CRATES:
        out |= {str(p.relative_to(ROOT)): (p, rust_functions) for p in rust_sources(crate)}
    for p in (ROOT / "analysis/trainio_analysis").rglob("*.py"):
        out[str(p.relative_to(ROOT))] = (p, python_functions)
    for p in [*(ROOT / "bpf").glob("*.c"), *(ROOT / "bpf").glob("*.h")]:
        out[str(p.relative_to(ROOT))] = (p, c_functions)
    return out


def test_sources_cover_every_language_and_directory() -> None:
    files = sources()
    for top in ("replay/", "tracer/", "schema/", "model/", "analysis/native/", "analysis/trainio_analysis/", "bpf/"):
        assert any(f.startswith(top) for f in files), top
    assert "analysis/trainio_analysis/trace/read.py" in files
    assert "bpf/block.bpf.c" in files and "bpf/trainio.h" in files
    assert not any(f.endswith("_tests.rs") for f in files)
    assert "model/src/tests.rs" not in files and "model/src/lib.rs" in files


def test_no_file_over_800_lines() -> None:
    long = {f: n for f, (p, _) in sources().items() if (n := len(p.read_text().splitlines())) > FILE_MAX_LINES}
    assert {f: n for f, n in long.items() if f not in LONG_FILES} == {}
    # an exception that no longer holds leaves the list
    assert [f for f in LONG_FILES if f not in long] == []


def test_no_function_over_150_lines() -> None:
    long = {
        f"{f}::{name}": n
        for f, (p, functions) in sources().items()
        for name, n in functions(p.read_text())
        if n > FN_MAX_LINES
    }
    assert {f: n for f, n in long.items() if f not in LONG_FUNCTIONS} == {}
    assert [f for f in LONG_FUNCTIONS if f not in long] == []
