"""The package's one exception family.

Every error that the command line turns into "one line on stderr, exit 2" derives from
:class:`TrainioError`; anything else escaping is a bug.
"""

from __future__ import annotations


class TrainioError(Exception):
    """Base of every error trainio_analysis raises on purpose."""


class TraceError(TrainioError):
    """A trace cannot be read: not Parquet, unknown schema version, missing column, empty.

    The message always starts with the path of the offending file or directory.
    """


class SelectionError(TrainioError):
    """The trace is fine but the requested selection (--layer/--dev/--pid) matches nothing."""
