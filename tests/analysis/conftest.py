"""Fixtures of the analyzer tests; helpers are in analysis_helpers.py (importable by name,
unlike a conftest, which every suite has)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "analysis"))
sys.path.insert(0, str(HERE))


@pytest.fixture
def trace_dir(tmp_path: Path) -> Path:
    return tmp_path / "trace"
