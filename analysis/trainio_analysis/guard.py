"""Guards every command shares: an output never replaces or lands inside one of the
command's own inputs, and an input file is a regular file read up to a bound.

Each check raises :class:`TrainioError` with one line that names the path and the option.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from trainio_analysis.errors import TrainioError

# The most bytes an import reads from one input (after decompression): its rows are held
# in memory until the trace is written.
MAX_INPUT_BYTES = 8 << 30


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def refuse_inputs(output: str | os.PathLike[str], option: str, inputs: Iterable[str | os.PathLike[str]]) -> None:
    """Refuses `output` when it is one of `inputs` (the same (st_dev, st_ino): named
    directly, through a symbolic link or a hard link) or lies inside one that is a
    directory (a trace's segments)."""
    out = Path(output)
    try:
        out_st: os.stat_result | None = os.stat(out)
    except OSError:
        out_st = None
    try:
        where = out.resolve()
    except (OSError, RuntimeError):
        where = None
    for given in inputs:
        src = Path(given)
        try:
            src_st = os.stat(src)
        except OSError:
            continue  # a missing input is the reader's error to report
        if out_st is not None and _same_file(out_st, src_st):
            msg = f"{option} {out}: is the input {src} (the same file): the output would replace it"
            raise TrainioError(msg)
        if not stat.S_ISDIR(src_st.st_mode):
            continue
        if where is not None and where.is_relative_to(src.resolve()):
            msg = f"{option} {out}: is inside the input {src}: the output would overwrite it"
            raise TrainioError(msg)
        if out_st is not None and stat.S_ISREG(out_st.st_mode) and out_st.st_nlink > 1:
            # a hard link to one of the directory's files (a trace's segments: a few)
            for root, _dirs, names in os.walk(src):
                for name in names:
                    try:
                        same = _same_file(out_st, os.stat(Path(root) / name))
                    except OSError:
                        continue
                    if same:
                        twin = Path(root) / name
                        msg = f"{option} {out}: is {twin} of the input {src} (a hard link): the output would replace it"
                        raise TrainioError(msg)


def input_file(path: str | os.PathLike[str], option: str) -> Path:
    """`path` when it is a regular file; otherwise one line saying what it is instead."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        msg = f"{option} {p}: no such file"
        raise TrainioError(msg) from None
    except OSError as exc:
        msg = f"{option} {p}: cannot read ({exc.strerror})"
        raise TrainioError(msg) from None
    if stat.S_ISDIR(st.st_mode):
        msg = f"{option} {p}: is a directory: give a file"
        raise TrainioError(msg)
    if not stat.S_ISREG(st.st_mode):
        msg = f"{option} {p}: not a regular file (a device or a FIFO): give a file"
        raise TrainioError(msg)
    return p


def capped_lines(lines: Iterable[str], path: str | os.PathLike[str], option: str) -> Iterator[str]:
    """The lines of an input, refused once they pass MAX_INPUT_BYTES (a compressed file
    that expands without end included)."""
    seen = 0
    for line in lines:
        seen += len(line)
        if seen > MAX_INPUT_BYTES:
            msg = f"{option} {path}: more than {MAX_INPUT_BYTES >> 30} GiB of text, trainio's bound for an import"
            raise TrainioError(msg)
        yield line
