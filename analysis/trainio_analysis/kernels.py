"""The analyzer's compiled loops (``_native``, built by ``make`` from analysis/native/).

Each native function returns exactly what the numpy code it replaces returns (that
code stays, as the reference the tests compare against, and as the fallback when the
extension was not built). ``TRAINIO_ANALYSIS_NATIVE=0`` or :func:`use_native` selects
the numpy path.

Example
-------
>>> with use_native(False):
...     native() is None
True
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

try:
    from trainio_analysis import _native as _module
except ImportError:  # not built: `make` builds it
    _module = None

_enabled = os.environ.get("TRAINIO_ANALYSIS_NATIVE", "1") != "0"


def native() -> ModuleType | None:
    """The native module when it is built and selected, else None (use numpy)."""
    return _module if _enabled else None


def module() -> ModuleType | None:
    """The native module when it is built, whichever path is selected: for what has no
    numpy path (the job model)."""
    return _module


def available() -> bool:
    """Whether the native module was built."""
    return _module is not None


def path() -> str:
    """Which path the analyzer takes: ``native`` or ``numpy``."""
    return "native" if native() is not None else "numpy"


@contextmanager
def use_native(enabled: bool) -> Iterator[None]:
    """Select the native (True) or numpy (False) path inside the block."""
    global _enabled
    before = _enabled
    _enabled = enabled
    try:
        yield
    finally:
        _enabled = before
