"""The trace schema has three statements: the Rust writer's Arrow schema
(``trainio_schema::arrow_schema()``, with ``Layer::ops`` and the version), the Python
reader's (``trace.COLUMNS``, ``trace.OPS``, ``trace.SCHEMA_MINOR``) and traces/SCHEMA.md's
tables and title. They must be equal: a column, op or version changed on one side only
fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

from analysis_helpers import schema_md_columns, schema_md_ops

from trainio_analysis import kernels
from trainio_analysis import trace as tr

SCHEMA_MD = Path(__file__).resolve().parents[2] / "traces" / "SCHEMA.md"


def _python_columns() -> list[tuple[str, str, bool]]:
    return [(name, str(typ), nullable) for name, typ, nullable in tr.COLUMNS]


def _rust() -> object:
    assert kernels.available(), "the native extension is not built: run make"
    return kernels._module


def test_rust_writer_schema_equals_the_python_readers() -> None:
    assert _rust().schema_columns() == _python_columns()


def test_schema_md_column_table_equals_the_python_readers() -> None:
    assert schema_md_columns() == _python_columns()


def test_layers_and_ops_agree_in_rust_python_and_schema_md() -> None:
    rust = {layer: ops for layer, ops in _rust().layer_ops()}
    python = {layer: list(ops) for layer, ops in tr.OPS.items()}
    assert rust == python
    assert schema_md_ops() == python
    assert list(python) == list(tr.LAYERS)


def test_the_version_is_one_in_rust_python_and_schema_md() -> None:
    assert _rust().schema_version() == (tr.SCHEMA_VERSION, tr.SCHEMA_MINOR)
    title = SCHEMA_MD.read_text().splitlines()[0]
    assert re.fullmatch(rf".* schema version {tr.SCHEMA_VERSION}\.{tr.SCHEMA_MINOR}", title), title
    accepts = re.search(r"Readers accept 1\.0–1\.(\d+) traces", SCHEMA_MD.read_text())
    assert accepts and int(accepts.group(1)) == tr.SCHEMA_MINOR
