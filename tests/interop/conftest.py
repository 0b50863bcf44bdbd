"""Fixtures of the interop tests; helpers are in interop_helpers.py."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[0]))
sys.path.insert(0, str(HERE.parents[1] / "analysis"))
sys.path.insert(0, str(HERE))
