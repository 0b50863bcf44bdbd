"""Runs `trainio analyze` (``trainio_analysis.__main__.main``) on one trace after another in
one process, so a test can try hundreds of traces without paying the interpreter's and
the libraries' start-up each time (the fuzz test, test_reader_fuzz.py).

Each line on stdin is a JSON list of arguments after ``trainio``. For each, the command
runs with file descriptors 1 and 2 redirected to files (so what native code writes there
is caught too), and one JSON line goes to the original stdout: ``rc`` (the exit status
``python -m trainio_analysis`` would have: the return value of ``main``, or 1 with
``traceback`` set when an exception escapes it, as the interpreter would print it),
``stdout`` and ``stderr``. A hang or a crash of native code is the caller's to see: it
sets a time limit per line and watches this process.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "analysis"))

from trainio_analysis.__main__ import main


def run(argv: list[str], scratch: Path) -> dict[str, object]:
    out_path, err_path = scratch / "stdout", scratch / "stderr"
    saved = os.dup(1), os.dup(2)
    sys.stdout.flush()
    sys.stderr.flush()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        escaped = None
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse
            rc = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            rc = 1
            escaped = traceback.format_exc()
            sys.stderr.write(escaped)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
    for fd in saved:
        os.close(fd)
    return {
        "rc": rc,
        "traceback": escaped,
        "stdout": out_path.read_text(errors="replace"),
        "stderr": err_path.read_text(errors="replace"),
    }


def serve() -> None:
    report = os.fdopen(os.dup(1), "w")
    with tempfile.TemporaryDirectory() as tmp:
        for line in sys.stdin:
            result = run(json.loads(line), Path(tmp))
            report.write(json.dumps(result) + "\n")
            report.flush()


if __name__ == "__main__":
    serve()
