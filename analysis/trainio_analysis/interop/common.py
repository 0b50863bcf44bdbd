"""What ``trainio export`` and ``trainio import`` share: the output directory they write
into, the error they raise on bad input, and per-request queue depths for the traces they
import (docs/interop.md).

Output. Everything is written inside ``-o DIR``, never beside it: DIR must be absent or
empty, each file is written under a temporary name inside DIR and renamed into place
when complete (trace segments as ``*.partial``, as every trainio writer does), and a
failure removes what was written (and DIR when it was created here).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from trainio_analysis.analyze.qd_sweep import event_keys
from trainio_analysis.errors import TrainioError


class InputError(TrainioError):
    """A file to import or export cannot be used; the message starts with its path."""


@contextmanager
def output_directory(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield DIR (created if absent) for writing; on an exception, remove what was
    written into it, and DIR itself when it did not exist before."""
    out = Path(path)
    created = False
    if out.exists():
        if not out.is_dir():
            msg = f"{out}: exists and is not a directory"
            raise InputError(msg)
        if any(out.iterdir()):
            msg = f"{out}: output directory is not empty"
            raise InputError(msg)
    else:
        try:
            out.mkdir(parents=True)
        except OSError as exc:
            msg = f"{out}: cannot create the output directory ({exc.strerror})"
            raise InputError(msg) from None
        created = True
    try:
        yield out
    except BaseException:
        if created:
            shutil.rmtree(out, ignore_errors=True)
        else:
            for child in out.iterdir():
                if child.is_dir():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
        raise


def write_text_atomically(path: Path, text: str) -> None:
    """``path`` appears complete or not at all (a ``.tmp`` sibling renamed)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        msg = f"{path}: cannot write ({exc.strerror})"
        raise InputError(msg) from None


def per_issue_queue_depth(issue: np.ndarray, complete: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Requests in flight in the same ``group`` (device, process) at each request's issue,
    itself included: the schema's ``queue_depth``, computed from the intervals with the
    analyzer's conventions (a completion at the instant of an issue counts before it,
    except a zero-latency request's own; trainio_analysis.analyze.qd_sweep).

    >>> per_issue_queue_depth(np.array([0, 5, 10]), np.array([10, 20, 30]), np.zeros(3, int)).tolist()
    [1, 2, 2]
    """
    n = issue.size
    out = np.zeros(n, np.uint32)
    if n == 0:
        return out
    issue = np.asarray(issue, np.int64)
    complete = np.asarray(complete, np.int64)
    _, gid = np.unique(np.asarray(group), return_inverse=True)
    for g in range(int(gid.max()) + 1):
        rows = np.flatnonzero(gid == g)
        base = int(issue[rows].min())
        keys = event_keys(issue[rows], complete[rows], base)
        order = np.argsort(keys, kind="stable")
        m = rows.size
        step = np.where(order < m, 1, -1)
        level = np.cumsum(step)
        at_issue = order < m
        out[rows[order[at_issue]]] = level[at_issue]
    return out
