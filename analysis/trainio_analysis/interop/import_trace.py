"""``trainio import``: a dftracer or blktrace trace into a trainio trace (docs/interop.md).

dftracer (``--dftracer FILE.pfw[.gz]...``) becomes the **file** layer: its POSIX events
(open, read, pread, write, pwrite, lseek, close and their 64-bit names) are the same
calls the file layer records as syscalls. dftracer 2 names files by hash (``fhash``, with
an ``FH`` line that gives the path) and stores results as ``ret``/``count``; dftracer 1
writes ``fname`` and ``size``; both are read. Plain ``read``/``write`` carry no offset:
it is the file position, kept per (process, file) from open (0), lseek (its result) and
each read or write (advanced by its result), as the file layer reads it at entry.
dftracer records no file descriptor, so two descriptors of one file open at once in one
process share that position. Times are dftracer's ``ts``/``dur`` (microseconds of the
wall clock) in ns; ``trainio.clock_offset_ns`` is 0. ``queue_depth`` is computed per
process from the intervals.

blktrace (``--blktrace``) becomes the **block** layer: each request from its dispatch to
the driver (``D``; after a requeue ``R``, the next ``D``) to its completion (``C``), with
the scheduler insertion (``I``) as ``insert_ns`` when it was seen; ``queue_depth`` is computed per device from the D/C
intervals. Input is blkparse's default text output, or blktrace's binary files, which
are handed to ``blkparse``. Times are blkparse's, seconds since the trace started.

Layers the source cannot know (proc, ipc, the other storage layers) are absent, and
``trainio.source`` says where the trace came from.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
from collections import defaultdict, deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from trainio_analysis.errors import TrainioError
from trainio_analysis.guard import capped_lines, input_file
from trainio_analysis.interop.common import InputError, output_directory, per_issue_queue_depth
from trainio_analysis.trace import write_trace

# --------------------------------------------------------------------------- dftracer

_OPEN = {"open", "open64", "openat", "openat64", "creat", "creat64", "__open_2", "__openat_2"}
_READ = {"read", "read64"}
_PREAD = {"pread", "pread64", "__pread_chk", "__pread64_chk"}
_WRITE = {"write", "write64"}
_PWRITE = {"pwrite", "pwrite64"}
_SEEK = {"lseek", "lseek64"}
_CLOSE = {"close"}
O_APPEND = 0o2000


def _json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(capped_lines(f, path, "--dftracer"), 1):
                line = line.strip().rstrip(",")
                if not line or line in ("[", "]"):
                    continue  # dftracer 1 wraps its lines in a JSON array
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    msg = f"{path}:{lineno}: not a JSON event: {line[:60]!r}"
                    raise InputError(msg) from None
                if isinstance(event, dict):
                    yield lineno, event
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        msg = f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})"
        raise InputError(msg) from None


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def import_dftracer(files: Sequence[str | os.PathLike[str]], output: str | os.PathLike[str]) -> dict[str, Any]:
    """Write the POSIX events of dftracer trace files as the file layer of a trace in
    ``output``; returns a summary ``{"source", "rows", "ops", "files", "ignored"}``."""
    paths = [Path(p) for p in files]
    for p in paths:
        input_file(p, "--dftracer")
    cols: dict[str, list[Any]] = defaultdict(list)
    ignored: dict[str, int] = defaultdict(int)
    names: dict[str, str] = {}  # fhash -> path (dftracer 2)
    commands: dict[int, list[str]] = {}
    cmd_names: dict[str, str] = {}  # cmd_hash -> "argv;joined"
    position: dict[tuple[int, str], int] = {}
    version = None
    hostname = "?"
    events = 0
    for path in paths:
        for _lineno, ev in _json_lines(path):
            args = ev.get("args") or {}
            name = ev.get("name")
            if name == "FH" and "value" in args:
                names[str(args["value"])] = str(args.get("name"))
                continue
            if name == "HH" and "name" in args:
                hostname = str(args["name"])
                continue
            if name == "SH" and "value" in args:
                cmd_names[str(args["value"])] = str(args.get("name"))
                continue
            if name == "start" and ev.get("cat") == "dftracer":
                version = args.get("version", version)
                cmd = cmd_names.get(str(args.get("cmd_hash")))
                if cmd and _int(ev.get("pid")) is not None:
                    commands[int(ev["pid"])] = cmd.split(";")
                continue
            if ev.get("cat") != "POSIX":
                continue
            events += 1
            fname = args.get("fname")
            if fname is None and "fhash" in args:
                fname = names.get(str(args["fhash"]))
            pid, tid = _int(ev.get("pid")), _int(ev.get("tid"))
            ts, dur = _int(ev.get("ts")), _int(ev.get("dur"))
            if fname is None or pid is None or ts is None:
                ignored[f"{name} (no file, pid or ts)"] += 1
                continue
            tid = pid if tid is None else tid
            dur = max(dur or 0, 0)
            ret = _int(args.get("ret"))
            count = _int(args.get("count"))
            size = _int(args.get("size"))
            key = (pid, fname)
            if name in _OPEN:
                op, offset, nbytes, asked = "open", None, 0, 0
                flags = _int(args.get("flags")) or 0
                position[key] = 0
                if flags & O_APPEND:
                    position.pop(key)  # the end of a file we do not know
            elif name in _READ | _PREAD | _WRITE | _PWRITE:
                op = "read" if name in _READ | _PREAD else "write"
                done = ret if ret is not None else size
                nbytes = max(done or 0, 0)
                asked = count if count is not None else (size if size is not None else nbytes)
                if name in _PREAD | _PWRITE:
                    offset = _int(args.get("offset"))
                else:
                    offset = position.get(key)
                    if offset is not None and nbytes:
                        position[key] = offset + nbytes
                flags = 0
            elif name in _SEEK:
                if ret is not None and ret >= 0:
                    position[key] = ret
                continue
            elif name in _CLOSE:
                op, offset, nbytes, asked, flags = "close", None, 0, 0, 0
                position.pop(key, None)
            else:
                ignored[name] += 1
                continue
            cols["op"].append(op)
            cols["issue_ns"].append(ts * 1000)
            cols["complete_ns"].append((ts + dur) * 1000)
            cols["offset"].append(offset)
            cols["bytes"].append(nbytes)
            cols["bytes_requested"].append(max(asked, 0))
            cols["pid"].append(pid)
            cols["tid"].append(tid)
            cols["file"].append(fname)
            cols["error"].append(ret if ret is not None and ret < 0 else 0)
            cols["flags"].append(flags)
    if not cols["op"]:
        msg = (
            f"{paths[0]}: no POSIX open/read/write/close events "
            "(dftracer run without DFTRACER_INC_METADATA=1, or not a dftracer trace)"
        )
        raise InputError(msg)
    table = _finish(cols, layer="file", comm_of=lambda pid: _comm(commands.get(pid)))
    source = {
        "format": "dftracer",
        "files": [str(p.resolve()) for p in paths],
        "dftracer_version": version,
        "posix_events": events,
        "ignored_events": dict(ignored),
        "commands": {str(k): v for k, v in commands.items()},
    }
    meta = {
        "tracer_version": f"dftracer {version}" if version is not None else "dftracer",
        "hostname": hostname,
        "source": source,
        "target": {"command": next(iter(commands.values()))} if len(commands) == 1 else {"all": True},
    }
    return _write(table, output, meta, source)


def _comm(cmd: list[str] | None) -> str:
    if not cmd:
        return "?"
    first = os.path.basename(cmd[0])
    return first[:15] or "?"


# --------------------------------------------------------------------------- blktrace

# blkparse's default line: "%D %2c %8s %5T.%9t %5p %2a %3d " then the action's fields;
# the kernel's blk tracer with the blk_classic option writes the same without the
# sequence number ("%D %2c %5T.%9t %5p %2a %3d ...").
_BLK_LINE = re.compile(
    r"^\s*(\d+),(\d+)\s+(\d+)\s+(?:(\d+)\s+)?(\d+)\.(\d{9})\s+(\d+)\s+([A-Za-z]{1,2})\s+(\S+)\s*(.*)$"
)
_SECTORS = re.compile(r"^(\d+)\s+\+\s+(\d+)\s*(?:\[(.*)\])?")
_BLK_MAGIC = 0x65617400  # BLK_IO_TRACE_MAGIC, low byte = version


def _is_blktrace_binary(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return len(head) == 4 and (int.from_bytes(head, "little") & ~0xFF) == _BLK_MAGIC


def _blkparse_text(path: Path) -> Iterator[str]:
    """Lines of blkparse output: the file itself, or blkparse run on binary input."""
    base = None
    if path.is_file() and _is_blktrace_binary(path):
        m = re.match(r"^(.*)\.blktrace\.\d+$", path.name)
        base = path.parent / (m.group(1) if m else path.name)
    elif not path.exists() and list(path.parent.glob(path.name + ".blktrace.*")):
        base = path
    if base is None:
        input_file(path, "--blktrace")
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                yield from capped_lines(f, path, "--blktrace")
        except OSError as exc:
            msg = f"{path}: cannot read ({exc.strerror})"
            raise InputError(msg) from None
        return
    if shutil.which("blkparse") is None:
        msg = f"{path}: blktrace binary input needs blkparse (Debian package blktrace)"
        raise InputError(msg)
    proc = subprocess.Popen(
        ["blkparse", "-q", "-i", base.name, "-D", str(base.parent), "-o", "-"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        yield from capped_lines(proc.stdout, path, "--blktrace")
    except TrainioError:
        proc.kill()
        proc.communicate()
        raise
    _, err = proc.communicate()
    if proc.returncode != 0:
        first = (err.strip().splitlines() or ["no message"])[0]
        msg = f"{path}: blkparse failed ({first})"
        raise InputError(msg)


def _block_op(rwbs: str, nbytes: int) -> str:
    if "D" in rwbs:
        return "discard"
    if "Z" in rwbs:
        return "write_zeroes"
    if "W" in rwbs:
        return "write"
    if "R" in rwbs:
        return "read"
    if "F" in rwbs and nbytes == 0:
        return "flush"
    return "other"


def import_blktrace(source: str | os.PathLike[str], output: str | os.PathLike[str]) -> dict[str, Any]:
    """Write blktrace's dispatched and completed requests as the block layer of a trace
    in ``output``; returns a summary ``{"source", "rows", "ops", ...}``."""
    path = Path(source)
    # in flight: (dev, sector, sectors) -> FIFO of [issue_ns, insert_ns, pid, comm, rwbs]
    dispatched: dict[tuple[str, int, int], deque[list[Any]]] = defaultdict(deque)
    inserted: dict[tuple[str, int, int], deque[int]] = defaultdict(deque)
    flushes: dict[str, deque[list[Any]]] = defaultdict(deque)
    cols: dict[str, list[Any]] = defaultdict(list)
    lines = parsed = unmatched = 0
    devs: set[str] = set()

    def emit(dev: str, start: list[Any], complete_ns: int, sector: int | None, nbytes: int, error: int) -> None:
        issue_ns, insert_ns, pid, comm, rwbs = start
        cols["op"].append(_block_op(rwbs, nbytes))
        cols["issue_ns"].append(issue_ns)
        cols["complete_ns"].append(max(complete_ns, issue_ns))
        cols["insert_ns"].append(insert_ns)
        cols["dev"].append(dev)
        cols["offset"].append(None if sector is None else sector * 512)
        cols["bytes"].append(nbytes)
        cols["pid"].append(pid)
        cols["comm"].append(comm)
        cols["error"].append(error)

    for line in _blkparse_text(path):
        lines += 1
        m = _BLK_LINE.match(line)
        if not m:
            continue
        parsed += 1
        maj, mnr, _cpu, _seq, sec, nsec, pid, action, rwbs, rest = m.groups()
        dev = f"{maj}:{mnr}"
        t = int(sec) * 1_000_000_000 + int(nsec)
        s = _SECTORS.match(rest)
        if action not in ("I", "D", "R", "C"):
            continue
        devs.add(dev)
        if s is None:
            # a request without sectors: a flush (blkparse prints "[comm]" or "[error]")
            tail = rest.strip().strip("[]")
            if action == "D":
                flushes[dev].append([t, None, int(pid), tail or "?", rwbs])
            elif action == "C" and flushes[dev]:
                emit(dev, flushes[dev].popleft(), t, None, 0, -abs(_int(tail) or 0))
            continue
        sector, count, bracket = int(s.group(1)), int(s.group(2)), s.group(3) or ""
        key = (dev, sector, count)
        if action == "I":
            inserted[key].append(t)
        elif action == "D":
            insert_ns = inserted[key].popleft() if inserted[key] else None
            dispatched[key].append([t, insert_ns, int(pid), bracket or "?", rwbs])
        elif action == "R":
            # requeued by the driver: its next D is its issue
            if dispatched[key]:
                requeued = dispatched[key].pop()
                if requeued[1] is not None:
                    inserted[key].appendleft(requeued[1])
        elif dispatched[key]:
            emit(dev, dispatched[key].popleft(), t, sector, count * 512, -abs(_int(bracket) or 0))
        else:
            unmatched += 1  # completed, but dispatched before the trace started
    if not cols["op"]:
        msg = f"{path}: no dispatched and completed requests (D and C lines of blkparse output)"
        raise InputError(msg)
    in_flight = sum(len(q) for q in dispatched.values()) + sum(len(q) for q in flushes.values())
    cols["tid"] = cols["pid"]
    table = _finish(cols, layer="block")
    source = {
        "format": "blktrace",
        "files": [str(path.resolve())],
        "lines": lines,
        "events": parsed,
        "completed_unseen_dispatch": unmatched,
        "dispatched_never_completed": in_flight,
    }
    meta = {
        "tracer_version": "blktrace",
        "source": source,
        "devices": [{"dev": d, "name": _dev_name(d)} for d in sorted(devs)],
        "lost_events": {"blktrace:completion_unseen": in_flight, "blktrace:dispatch_unseen": unmatched},
    }
    return _write(table, output, meta, source)


def _dev_name(dev: str) -> str:
    """The name this host gives MAJ:MIN, when it has the device ('' otherwise)."""
    try:
        return Path(f"/sys/dev/block/{dev}").resolve().name
    except OSError:
        return ""


# --------------------------------------------------------------------------- shared


def _finish(cols: dict[str, list[Any]], *, layer: str, comm_of: Any = None) -> pa.Table:
    """Rows in issue order with the computed queue depth."""
    issue = np.asarray(cols["issue_ns"], np.int64)
    complete = np.asarray(cols["complete_ns"], np.int64)
    order = np.argsort(issue, kind="stable")
    data = {k: [v[i] for i in order] if isinstance(v, list) else v for k, v in cols.items()}
    issue, complete = issue[order], complete[order]
    ops = np.asarray(data["op"])
    counted = np.isin(ops, ["read", "write"]) if layer == "file" else np.ones(ops.size, bool)
    group = np.asarray(data["dev"] if layer == "block" else data["pid"])
    qd = np.zeros(ops.size, np.uint32)
    qd[counted] = per_issue_queue_depth(issue[counted], complete[counted], group[counted])
    data["queue_depth"] = qd
    data["layer"] = [layer] * ops.size
    if comm_of is not None:
        data["comm"] = [comm_of(p) for p in data["pid"]]
    data["issue_ns"], data["complete_ns"] = issue, complete
    return pa.table({k: pa.array(v) if not isinstance(v, np.ndarray) else v for k, v in data.items()})


def _write(
    table: pa.Table, output: str | os.PathLike[str], meta: dict[str, Any], source: dict[str, Any]
) -> dict[str, Any]:
    meta = {**meta, "hostname": meta.get("hostname", "?"), "kernel_release": meta.get("kernel_release", "?")}
    with output_directory(output) as out:
        write_trace(out, table, meta)
    ops = table.group_by("op").aggregate([("op", "count")]).to_pylist()
    return {
        "source": source,
        "rows": table.num_rows,
        "ops": {r["op"]: r["op_count"] for r in ops},
        "bytes_read": int(pa.compute.sum(table.filter(pa.compute.equal(table["op"], "read"))["bytes"]).as_py() or 0),
    }


def format_import(summary: dict[str, Any], output: str) -> str:
    src = summary["source"]
    ops = ", ".join(f"{op} {n}" for op, n in sorted(summary["ops"].items()))
    lines = [
        f"trainio import: {src['format']} {', '.join(src['files'])} -> {output}",
        f"  {summary['rows']} rows: {ops}; {summary['bytes_read'] / 2**20:.2f} MiB read",
    ]
    if src.get("ignored_events"):
        lines.append("  ignored: " + ", ".join(f"{k} {v}" for k, v in sorted(src["ignored_events"].items())))
    for key in ("completed_unseen_dispatch", "dispatched_never_completed"):
        if src.get(key):
            lines.append(f"  {key.replace('_', ' ')}: {src[key]}")
    return "\n".join(lines)
