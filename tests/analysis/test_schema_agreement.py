"""The trace schema has two statements: schema/src/lib.rs (``arrow_schema()``,
``Layer::ops``, the version), which the Python reader takes through the native module
(``trace.COLUMNS``, ``trace.OPS``, ``trace.SCHEMA_MINOR``), and traces/SCHEMA.md's tables
and title. They must be equal: a column, op or version changed in one only fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

from analysis_helpers import schema_md_columns, schema_md_ops

from trainio_analysis import trace as tr

SCHEMA_MD = Path(__file__).resolve().parents[2] / "traces" / "SCHEMA.md"


def _python_columns() -> list[tuple[str, str, bool]]:
    return [(name, str(typ), nullable) for name, typ, nullable in tr.COLUMNS]


def test_schema_md_column_table_equals_the_python_readers() -> None:
    assert schema_md_columns() == _python_columns()


def test_layers_and_ops_agree_in_the_schema_crate_and_schema_md() -> None:
    python = {layer: list(ops) for layer, ops in tr.OPS.items()}
    assert schema_md_ops() == python


def test_the_version_is_one_in_the_schema_crate_and_schema_md() -> None:
    title = SCHEMA_MD.read_text().splitlines()[0]
    assert re.fullmatch(rf".* schema version {tr.SCHEMA_VERSION}\.{tr.SCHEMA_MINOR}", title), title
    accepts = re.search(r"Readers accept 1\.0–1\.(\d+) traces", SCHEMA_MD.read_text())
    assert accepts and int(accepts.group(1)) == tr.SCHEMA_MINOR
