"""Command line: ``python -m trainio_analysis analyze|report|compare|export|import|slice ...``.

Every expected failure (bad trace, empty selection, unwritable output) is one line on
stderr naming the file and the problem, exit status 2. A closed stdout pipe is not an
error.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

from trainio_analysis.errors import TrainioError


def one_line(text: str) -> str:
    """A message as one printable line: a name read from a corrupt file may hold line
    breaks or control characters, which are escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    msg = f"not JSON serializable: {type(obj).__name__}"
    raise TypeError(msg)


def _clean(obj: Any) -> Any:
    """NaN/inf are not JSON: turn them into null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    return obj


def dumps(obj: Any) -> str:
    return json.dumps(_clean(obj), default=_json_default, allow_nan=False)


def version() -> str:
    """trainio's one version, the Cargo workspace's (Cargo.toml, [workspace.package]), which
    the compiled commands carry too; "unknown" outside a checkout."""
    try:
        text = (Path(__file__).resolve().parents[2] / "Cargo.toml").read_text()
    except OSError:
        return "unknown"
    m = re.search(r'^\[workspace\.package\][^\[]*?^version\s*=\s*"([^"]+)"', text, re.M | re.S)
    return m.group(1) if m else "unknown"


class _HelpFormatter(argparse.HelpFormatter):
    """Help laid out as the compiled commands' (clap) is: "Usage:", "Arguments:", "Options:"."""

    _HEADINGS = {"positional arguments": "Arguments", "options": "Options", "optional arguments": "Options"}

    def add_usage(self, usage: str | None, actions: Any, groups: Any, prefix: str | None = None) -> None:
        super().add_usage(usage, actions, groups, "Usage: " if prefix is None else prefix)

    def start_section(self, heading: str | None) -> None:
        super().start_section(self._HEADINGS.get(heading, heading) if heading else heading)


# The longest gap (--burst-gap-ms, --step-gap-ms): about 11.6 days, in ns well inside int64.
MAX_GAP_MS = 1e9


def _gap_ms(text: str) -> float:
    """A gap in milliseconds: a finite number above 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of milliseconds") from None
    if not (0 < v <= MAX_GAP_MS):
        msg = f"'{text}': must be a number of milliseconds above 0 and at most {MAX_GAP_MS:g}"
        raise argparse.ArgumentTypeError(msg)
    return v


# The bounds of --bin-s: a bin is a whole number of nanoseconds, and its width in ns
# must fit the trace's int64 times.
MIN_BIN_S = 1e-9
MAX_BIN_S = 1e6


def _bin_s(text: str) -> float:
    """A timeline bin width in seconds: finite, from 1 ns to 1e6 s."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of seconds") from None
    if not (MIN_BIN_S <= v <= MAX_BIN_S):
        raise argparse.ArgumentTypeError(f"'{text}': must be from {MIN_BIN_S:g} s (1 ns) to {MAX_BIN_S:g} s")
    return v


def _add_selection(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--layer",
        choices=("block", "file", "nfs"),
        help="layer to analyze (default: the lowest present: block, nfs, file)",
    )
    p.add_argument("--dev", help="only this device: MAJ:MIN or its name (e.g. nvme0n1)")
    p.add_argument("--pid", type=int, help="only this process (tgid)")
    p.add_argument(
        "--bin-s",
        type=_bin_s,
        default=None,
        metavar="S",
        help="timeline bin width in seconds (default: automatic, 100-300 bins over the trace's active span)",
    )
    p.add_argument(
        "--burst-gap-ms",
        type=_gap_ms,
        default=10.0,
        metavar="MS",
        help="idle gaps at least this long separate bursts (default 10)",
    )


def _command(sub: Any, name: str, **kw: Any) -> argparse.ArgumentParser:
    """The parser of `trainio NAME`, with the same --version as every other command."""
    p = sub.add_parser(name, formatter_class=_HelpFormatter, **kw)
    p.add_argument(
        "-V", "--version", action="version", version=f"trainio {name} {version()}", help="print the version and exit"
    )
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainio",
        description="Characterize and compare trainio storage traces.",
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("-V", "--version", action="version", version=f"trainio {version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    a = _command(sub, "analyze", help="characterize a trace")
    a.add_argument("trace", help="trace directory (or one .parquet file)")
    _add_selection(a)
    a.add_argument(
        "--step-gap-ms",
        type=_gap_ms,
        metavar="MS",
        help="job model: gap between the batches of a rank that reads them itself (default: found from the gaps)",
    )
    a.add_argument("--json", action="store_true", help="print one JSON object")

    r = _command(sub, "report", help="self-contained HTML report of one or more traces")
    r.add_argument("traces", nargs="+", help="trace directories, shown side by side")
    r.add_argument("-o", "--output", required=True, metavar="FILE", help="HTML file to write")
    _add_selection(r)
    r.add_argument(
        "--sweep",
        action="append",
        metavar="SWEEP.json",
        help="a trainio sweep --json file: draw its AU vs GPUs curve and GPUs supported (repeatable)",
    )

    c = _command(sub, "compare", help="fidelity scores of trace B against trace A")
    c.add_argument("a", help="reference trace (e.g. the recorded job)")
    c.add_argument("b", help="candidate trace (e.g. its replay)")
    _add_selection(c)
    c.add_argument("--json", action="store_true", help="print one JSON object")

    e = _command(sub, "export", help="write a trace in another tool's format")
    e.add_argument(
        "--fio", metavar="TRACE", required=True, help="trace to export as fio iologs (version 3), one per process"
    )
    e.add_argument("-o", "--output", required=True, metavar="DIR", help="directory to write (absent or empty)")
    e.add_argument(
        "--layer",
        choices=("block", "file"),
        default="block",
        help="block: device offsets, for replay_redirect onto a device (default); "
        "file: file offsets on the recorded paths",
    )
    e.add_argument("--dev", help="only this device: MAJ:MIN or its name")
    e.add_argument("--pid", type=int, help="only this process (tgid)")
    e.add_argument("--under", metavar="DIR", help="file layer: only the files under DIR (e.g. the dataset)")
    e.add_argument(
        "--by",
        choices=("process", "gpu"),
        default="process",
        help="one iolog per process (default) or per GPU of the job model (needs the file layer)",
    )
    e.add_argument("--json", action="store_true", help="print the summary as one JSON object")

    i = _command(sub, "import", help="turn another tool's trace into a trainio trace")
    src = i.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--dftracer",
        metavar="FILE",
        nargs="+",
        help="dftracer trace(s) (.pfw or .pfw.gz, JSON lines) into the file layer",
    )
    src.add_argument(
        "--blktrace",
        metavar="FILE",
        help="blkparse text output, or blktrace's binary (NAME.blktrace.N or NAME), into the block layer",
    )
    i.add_argument("-o", "--output", required=True, metavar="DIR", help="trace directory to write (absent or empty)")
    i.add_argument("--json", action="store_true", help="print the summary as one JSON object")

    s = _command(sub, "slice", help="cut a time window or a job's processes out of a trace into a new trace")
    s.add_argument("trace", help="trace directory, one .parquet file, or a trace set (sliced member by member)")
    s.add_argument("-o", "--output", required=True, metavar="DIR", help="trace directory to write (absent or empty)")
    s.add_argument(
        "--from",
        dest="start",
        metavar="TIME",
        help="window start: seconds from the trace's start (e.g. 120), or a wall-clock time with a zone "
        "(e.g. 2026-11-26T18:00:00Z); default: the trace's start",
    )
    s.add_argument(
        "--to", dest="end", metavar="TIME", help="window end (exclusive), as --from; default: the trace's end"
    )
    s.add_argument(
        "--pid",
        type=int,
        action="append",
        help="keep only this process's rows and its descendants' (from the proc layer's forks); repeatable",
    )
    s.add_argument(
        "--cgroup",
        action="append",
        metavar="PATH",
        help="keep only the rows of the processes in this cgroup or beneath it, and their descendants' "
        "(from the proc layer's cgroup rows, schema 1.9): a path as /proc/PID/cgroup and the metrics' "
        "cgroup label give it (/kubepods.slice/pod1), or under /sys/fs/cgroup; repeatable, and with "
        "--pid keeps either",
    )
    s.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    return parser


def _selection(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "layer": args.layer,
        "dev": args.dev,
        "pid": args.pid,
        "bin_s": args.bin_s,
        "burst_gap_ms": args.burst_gap_ms,
    }


def _keep_freed_memory() -> None:
    """Let glibc reuse freed per-row-group arrays instead of unmapping them.

    Every row group allocates and frees arrays of a few MiB; above glibc's default mmap
    threshold each one is a fresh mapping whose pages fault in again (a third of the CPU
    time went to the kernel). Keeping them on the heap costs no more peak memory.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        libc.mallopt(m_mmap_threshold, 32 << 20)  # glibc's maximum on 64-bit
        libc.mallopt(m_trim_threshold, 1 << 30)
    except (OSError, AttributeError):
        pass  # not glibc: only slower


def _refuse_outputs_onto_inputs(args: argparse.Namespace) -> None:
    """-o never replaces, or lands inside, what the command reads (guard.py)."""
    from trainio_analysis.guard import refuse_inputs

    if args.command == "report":
        refuse_inputs(args.output, "-o", [*args.traces, *(args.sweep or [])])
    elif args.command == "export":
        refuse_inputs(args.output, "-o", [args.fio])
    elif args.command == "import":
        refuse_inputs(args.output, "-o", args.dftracer or [args.blktrace])
    elif args.command == "slice":
        refuse_inputs(args.output, "-o", [args.trace])


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _keep_freed_memory()
    try:
        _refuse_outputs_onto_inputs(args)
        if args.command == "analyze":
            from trainio_analysis.analyze import analyze
            from trainio_analysis.analyze.summary import format_summary

            result = analyze(args.trace, step_gap_ms=args.step_gap_ms, **_selection(args))
            print(dumps(result) if args.json else format_summary(result))
        elif args.command == "compare":
            from trainio_analysis.compare import compare, format_compare

            result = compare(args.a, args.b, **_selection(args))
            print(dumps(result) if args.json else format_compare(result))
        elif args.command == "export":
            from trainio_analysis.interop.export_fio import export_fio, format_export

            result = export_fio(
                args.fio, args.output, layer=args.layer, dev=args.dev, pid=args.pid, under=args.under, by=args.by
            )
            print(dumps(result) if args.json else format_export(result, args.output))
        elif args.command == "import":
            from trainio_analysis.interop.import_trace import format_import, import_blktrace, import_dftracer

            if args.dftracer:
                result = import_dftracer(args.dftracer, args.output)
            else:
                result = import_blktrace(args.blktrace, args.output)
            print(dumps(result) if args.json else format_import(result, args.output))
        elif args.command == "slice":
            from trainio_analysis.slice import format_slice, parse_time, slice_trace

            start = parse_time(args.start, "--from") if args.start is not None else None
            end = parse_time(args.end, "--to") if args.end is not None else None
            result = slice_trace(args.trace, args.output, start=start, end=end, pids=args.pid, cgroups=args.cgroup)
            print(dumps(result) if args.json else format_slice(result))
        else:
            from trainio_analysis.report import write_report

            path = write_report(args.traces, args.output, sweeps=args.sweep, **_selection(args))
            print(f"wrote {path}")
    except TrainioError as exc:
        print(f"trainio {args.command}: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away: not an error
        return 0
    return 0


def _interrupted(argv: list[str]) -> int:
    """SIGINT (Ctrl-C): one line, no traceback, exit 130 (128 + SIGINT) as a shell
    reports a command it interrupted. Every output is written atomically, so nothing
    half-written is left behind."""
    name = next((a for a in argv if not a.startswith("-")), "")
    print(f"trainio{' ' + name if name else ''}: interrupted", file=sys.stderr)
    return 130


def _exit_now(code: int) -> None:
    """Ends the process with `code` once the streams are flushed, past the interpreter's
    shutdown. CPython 3.11 remembers a KeyboardInterrupt raised inside code an extension
    module runs through PyRun_String while it is imported, even when this module catches
    it, and then kills itself with SIGINT after finalizing (exit -2, not 130). The
    unwinding that removes temporary outputs has run by the time this is called."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # closed or gone: nothing more can be said on it
    os._exit(code)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        _exit_now(_interrupted(sys.argv[1:]))
