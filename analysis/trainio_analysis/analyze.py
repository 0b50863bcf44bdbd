"""Characterize one layer of a trace: throughput, queue depth, sizes, latency, bursts.

One streaming pass over the row groups does everything that grows with the trace
(counting, the throughput timeline, size and latency distributions, the queue-depth
sweep of :mod:`trainio_analysis.sweep`); a thread pool decodes and pre-sorts the next
row groups while the main thread sweeps the current one, so both cores work and at most
``2 * workers`` row groups are in memory. The small per-process table of the file layer
is a polars streaming group-by.

Example
-------
>>> result = analyze("traces/sample")  # doctest: +SKIP
>>> result["qd_hist_issue"]  # doctest: +SKIP
{'1': 0.5, '2': 0.5}
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from trainio_analysis import kernels
from trainio_analysis import trace as tr
from trainio_analysis.errors import SelectionError, TraceError
from trainio_analysis.sketch import (
    N_BUCKETS,
    QuantileSketch,
    log_bucket,
    pow2_bucket,
    pow2_label,
)
from trainio_analysis.sweep import (
    CODE_ISSUE,
    GroupState,
    QueueDepthSweep,
    TailExchange,
    sweep_slices,
)

MIB = float(1 << 20)
LAYER_PREFERENCE = ("block", "nfs", "file")  # lowest layer first: what the storage sees
DEFAULT_BURST_GAP_MS = 10.0
MAX_TIMELINE_BINS = 10_000_000
# automatic bin: the pass counts in power-of-ten bins (at most this many over the
# window), then sums them into the smallest 1/2/5 x 10^k bin that leaves at most
# AUTO_BINS bins over the active span
AUTO_FINE_BINS = 20_000
AUTO_BINS = 300

QD_DEFINITIONS = {
    "qd_hist_issue": "per-issue: fraction of requests that saw k in flight (incl. itself) "
    "when issued, from the kernel-recorded queue_depth column",
    "qd_hist_issue_computed": "per-issue, recomputed from issue_ns/complete_ns intervals",
    "qd_hist_time": "time-weighted: fraction of the trace's wall time with k in flight; its mean is iostat aqu-sz",
    "qd_hist_time_busy": "time-weighted over busy time only (k >= 1)",
}


@dataclass(frozen=True)
class Selection:
    """Which rows to analyze; ``layer`` None means the lowest layer present."""

    layer: str | None = None
    dev: str | None = None
    pid: int | None = None


@dataclass
class _Chunk:
    """What one row group contributes (computed in a worker thread)."""

    events: int = 0
    reads: int = 0
    writes: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    latency: np.ndarray | None = None
    latency_buckets: np.ndarray | None = None
    latency_stats: tuple[int, int, int, int] | None = None  # count, min, max, sum (native)
    size_counts: np.ndarray | None = None
    tl_read: np.ndarray | None = None
    tl_write: np.ndarray | None = None
    tl_inflight: np.ndarray | None = None  # ns x requests in flight, per bin
    kernel_qd: dict[int, np.ndarray] = field(default_factory=dict)
    gid: np.ndarray | None = None
    issue: np.ndarray | None = None
    complete: np.ndarray | None = None
    summaries: list[dict[int, Any]] = field(default_factory=list)
    processes: _ProcessChunk | None = None
    # first issue and last completion of the data transfers (None: none in the chunk)
    data_first_ns: int | None = None
    data_last_ns: int | None = None


@dataclass
class _ProcessChunk:
    """File layer, one row group: per process (group id) counters."""

    reads: np.ndarray | None = None
    bytes: np.ndarray | None = None
    qd: np.ndarray | None = None  # [group, queue depth] counts at reads
    file_pairs: list[np.ndarray] = field(default_factory=list)  # (group << 32) | file id


def _codes(column: pa.ChunkedArray, lookup: dict[str, int], default: int = -1) -> np.ndarray:
    """Map each row's string to lookup[value] (default when absent or null)."""
    parts = []
    for chunk in column.chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = chunk.dictionary_encode()
        values = chunk.dictionary.to_pylist()
        lut = np.array([lookup.get(v, default) for v in values] + [default], dtype=np.int64)
        idx = chunk.indices.fill_null(len(values)).to_numpy(zero_copy_only=False)
        parts.append(lut[idx.astype(np.int64)])
    if not parts:
        return np.zeros(0, np.int64)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _np(column: pa.ChunkedArray) -> np.ndarray:
    return column.to_numpy()


class _Analyzer:
    def __init__(
        self,
        path: str | os.PathLike[str],
        sel: Selection,
        bin_s: float | None,
        burst_gap_ms: float,
        workers: int,
        with_model: bool = True,
        step_gap_ms: float | None = None,
    ) -> None:
        self.path = Path(path)
        self.with_model = with_model
        self.step_gap_ms = step_gap_ms
        self.segments = tr.open_trace(path)
        self.meta = tr.read_metadata(path)
        self.bin_auto = bin_s is None
        if bin_s is not None:
            self.bin_ns = int(round(bin_s * 1e9)) if math.isfinite(bin_s) else 0
            if self.bin_ns <= 0:
                msg = "--bin-s must be positive"
                raise SelectionError(msg)
            self.bin_s = bin_s
        self.burst_gap_ns = int(round(burst_gap_ms * 1e6))
        self.burst_gap_ms = burst_gap_ms
        self.workers = max(1, workers)
        self.layers_present = self._layers_present()
        self.layer = self._choose_layer(sel.layer)
        self.sel = sel
        self.group_col = "pid" if self.layer == "file" else "dev"
        self._plan()
        self._find_groups()
        self._lock = threading.Lock()
        self._file_ids: dict[str, int] = {}
        self._comms: dict[int, str] = {}
        # whether the latency sketch still keeps raw values (native path: only then does
        # a chunk return its latencies); it only ever turns False
        self._latency_raw = True

    # ------------------------------------------------------------------ planning

    def _layers_present(self) -> dict[str, int]:
        events = self.meta.get("events")
        if isinstance(events, dict) and events:
            if not all(isinstance(v, int) and v >= 0 for v in events.values()):
                msg = f"{self.segments[-1].path}: metadata trainio.events is not a count per layer"
                raise TraceError(msg)
            return {str(k): v for k, v in events.items() if v > 0}
        counts: dict[str, int] = {}
        for seg in self.segments:
            for i in range(len(seg.row_groups)):
                codes, values = tr.dictionary_codes(tr.read_row_group(seg, i, ["layer"])["layer"])
                for code, n in enumerate(np.bincount(codes, minlength=len(values)).tolist()):
                    if n and values[code] is not None:
                        counts[values[code]] = counts.get(values[code], 0) + n
        return counts

    def _choose_layer(self, layer: str | None) -> str:
        if layer is not None:
            if layer not in tr.STORAGE_LAYERS:
                msg = f"unknown layer {layer!r} (one of {', '.join(tr.STORAGE_LAYERS)})"
                raise SelectionError(msg)
            if layer not in self.layers_present:
                msg = f"{self.path}: no {layer} events (layers present: {self._present()})"
                raise SelectionError(msg)
            return layer
        for candidate in LAYER_PREFERENCE:
            if candidate in self.layers_present:
                return candidate
        msg = f"{self.path}: empty trace (no events in any layer)"
        raise TraceError(msg)

    def _present(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(self.layers_present.items())) or "none"

    def _plan(self) -> None:
        """Row-group order, watermarks and the time window, from footers when possible."""
        units = []
        for seg in self.segments:
            for i in range(len(seg.row_groups)):
                if seg.row_groups[i] == 0:
                    continue
                lo = tr.row_group_min(seg, i, "issue_ns")
                hi = tr.row_group_max(seg, i, "complete_ns")
                if lo is None or hi is None:
                    t = tr.read_row_group(seg, i, ["issue_ns", "complete_ns"])
                    lo, hi = int(_np(t["issue_ns"]).min()), int(_np(t["complete_ns"]).max())
                units.append((seg, i, lo, hi))
        self.units = units
        mins = [u[2] for u in units]
        suffix = [0] * len(units)
        running: int | None = None
        for k in range(len(units) - 1, -1, -1):
            suffix[k] = running  # type: ignore[call-overload]
            running = mins[k] if running is None else min(running, mins[k])
        first_issue = min(mins)
        last_complete = max(u[3] for u in units)
        start = self.meta.get("start_ns")
        end = self.meta.get("end_ns")
        self.t0 = min(first_issue, start) if isinstance(start, int) and start > 0 else first_issue
        self.t1 = max(last_complete, end) if isinstance(end, int) else last_complete
        self.watermarks = [None if w is None else w - self.t0 for w in suffix]
        self.window = self.t1 - self.t0
        if self.bin_auto:
            # fine power-of-ten bins (>= 1 us), summed into the final bin after the pass
            self.bin_ns = 1000
            while self.window // self.bin_ns + 1 > AUTO_FINE_BINS:
                self.bin_ns *= 10
            self.bin_s = self.bin_ns / 1e9
        nbins = self.window // self.bin_ns + 1
        if nbins > MAX_TIMELINE_BINS:
            msg = (
                f"{self.path}: --bin-s {self.bin_s} gives {nbins} bins over "
                f"{self.window / 1e9:.0f} s (from the row groups' statistics): raise it"
            )
            raise SelectionError(msg)
        self.nbins = int(nbins)

    def _groups_from_stats(self) -> list[Any] | None:
        """The selection's groups when row-group statistics prove them (else None)."""
        if self.sel.pid is not None and self.group_col == "dev":
            return None
        dev = self._dev_filter_value()
        found = set()
        for seg, i, _, _ in self.units:
            layer = tr.row_group_constant(seg, i, "layer")
            if layer is None:
                return None
            if layer != self.layer:
                continue
            if dev is not None and self.group_col != "dev":
                return None
            value = tr.row_group_constant(seg, i, self.group_col)
            if value is None:
                return None
            if (dev is not None and value != dev) or (self.sel.pid is not None and value != self.sel.pid):
                continue
            found.add(value)
        return sorted(found)

    def _find_groups(self) -> None:
        """The selection's devices or processes, so group ids are stable from the start."""
        keys = self._groups_from_stats()
        if keys is None:
            keys = self._groups_from_rows()
        if not keys:
            what = [f"--layer {self.layer}"]
            if self.sel.dev is not None:
                what.append(f"--dev {self.sel.dev}")
            if self.sel.pid is not None:
                what.append(f"--pid {self.sel.pid}")
            msg = f"{self.path}: no events match {' '.join(what)}"
            raise SelectionError(msg)
        self.group_names = ["?" if k is None else str(k) for k in keys]
        if self.group_col == "dev":
            self.dev_lookup = {k: i for i, k in enumerate(keys) if k is not None}
            self.null_group = keys.index(None) if None in keys else -1
        else:
            self.pid_lookup = np.array(keys, dtype=np.int64)

    def _groups_from_rows(self) -> list[Any]:
        """The selection's groups (sorted, None for a null device) from the rows: the
        layer and group columns of every row group, read through trace.py (which checks
        them) on the worker threads."""
        dev = self._dev_filter_value()
        cols = ["layer", self.group_col]
        if dev is not None and self.group_col != "dev":
            cols.append("dev")
        if self.sel.pid is not None and self.group_col != "pid":
            cols.append("pid")

        def groups_of(unit: tuple[tr.Segment, int, int, int]) -> set[Any]:
            seg, index, _, _ = unit
            t = tr.read_row_group(seg, index, cols)
            mask = _codes(t["layer"], {self.layer: 1}, 0) == 1
            if dev is not None:
                mask &= _codes(t["dev"], {dev: 1}, 0) == 1
            if self.sel.pid is not None:
                mask &= _np(t["pid"]) == self.sel.pid
            if not mask.any():
                return set()
            if self.group_col == "pid":
                return set(np.unique(_np(t["pid"])[mask]).tolist())
            codes, values = tr.dictionary_codes(t["dev"])
            return {values[i] for i in np.flatnonzero(np.bincount(codes[mask]))}

        found: set[Any] = set()
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            for part in pool.map(groups_of, self.units):
                found |= part
        return sorted(found, key=lambda k: (k is not None, k))  # a null device first

    def _dev_filter_value(self) -> str | None:
        dev = self.sel.dev
        if dev is None or ":" in dev:
            return dev
        name = dev.removeprefix("/dev/")
        for d in self.meta.get("devices") or []:
            if isinstance(d, dict) and d.get("name") == name and d.get("dev"):
                return str(d["dev"])
        msg = f"{self.path}: no device {dev!r} in trainio.devices (give MAJ:MIN)"
        raise SelectionError(msg)

    # ------------------------------------------------------------------ per chunk

    def _constants(self, seg: tr.Segment, index: int) -> dict[str, str]:
        """String columns holding one value in this row group (from its statistics)."""
        out = {}
        for col in ("layer", "op", "dev"):
            value = tr.row_group_constant(seg, index, col)
            if value is not None:
                out[col] = value
        return out

    def _prepare(self, unit: tuple[tr.Segment, int, int, int], *, merge_partials: bool = False) -> _Chunk:
        """Read one row group and count what does not need order; keep what the sweep needs.

        ``merge_partials``: fold the rows of a block request that completed in parts (same
        device, ``issue_ns`` and ``queue_depth``) into one request (see :func:`_merge_partials`).
        """
        seg, index, lo, hi = unit
        const = self._constants(seg, index)
        dev = self._dev_filter_value()
        c = _Chunk()
        if "layer" in const:
            tr.check_constants(seg, index, const["layer"], const.get("op"))
        if const.get("layer", self.layer) != self.layer or (dev is not None and const.get("dev", dev) != dev):
            return c  # the statistics say no row of this group is selected
        cols = ["issue_ns", "complete_ns", "bytes", "queue_depth"]
        cols += [k for k in ("layer", "op") if k not in const]
        if (self.group_col == "dev" or dev is not None) and "dev" not in const:
            cols.append("dev")
        if self.group_col == "pid" or self.sel.pid is not None:
            cols.append("pid")
        if self.layer == "file":
            cols.append("file")
        t = tr.read_row_group(seg, index, cols, layer=const.get("layer"), op=const.get("op"))
        n = t.num_rows
        _check_statistics(seg, index, t, lo, hi)
        ops = tr.OPS[self.layer]
        op_lookup = {op: i for i, op in enumerate(ops)}
        mask: np.ndarray | None = None  # None: every row is selected
        if "layer" not in const:
            mask = _codes(t["layer"], {self.layer: 1}, 0) == 1
        if dev is not None and "dev" not in const:
            m = _codes(t["dev"], {dev: 1}, 0) == 1
            mask = m if mask is None else mask & m
        if self.sel.pid is not None:
            m = _np(t["pid"]) == self.sel.pid
            mask = m if mask is None else mask & m
        if mask is not None:
            if mask.all():
                mask = None
            elif not mask.any():
                return c

        def pick(a: np.ndarray, m: np.ndarray | None) -> np.ndarray:
            return a if m is None else a[m]

        c.events = n if mask is None else int(mask.sum())
        issue = pick(_np(t["issue_ns"]), mask)  # absolute: keys and bins subtract t0
        complete = pick(_np(t["complete_ns"]), mask)
        nbytes = pick(_np(t["bytes"]), mask)
        kqd_all = pick(_np(t["queue_depth"]), mask)
        if "op" in const:
            op_code = None
            only_op = const["op"]
        else:
            op_code = pick(_codes(t["op"], op_lookup, len(ops)), mask)
            only_op = None
        if self.group_col == "dev":
            if "dev" in const:
                # a zero-stride view: one device, no per-row array needed
                gid = np.broadcast_to(np.int64(self.dev_lookup.get(const["dev"], self.null_group)), (c.events,))
            else:
                gid = pick(_codes(t["dev"], self.dev_lookup, self.null_group), mask)
        else:
            gid = np.searchsorted(self.pid_lookup, pick(_np(t["pid"]), mask).astype(np.int64))
        if merge_partials:
            merged = _merge_partials(issue, complete, nbytes, kqd_all, op_code, gid)
            if merged is not None:
                issue, complete, nbytes, kqd_all, op_code, gid = merged
                mask = None  # the arrays are the selected requests already
        n_requests = issue.size

        # data transfers: throughput, sizes, latency (None: every row, empty: no row)
        def op_mask(op: str) -> np.ndarray | None:
            if op_code is None:
                return None if only_op == op else np.zeros(n_requests, bool)
            return op_code == op_lookup[op]

        nat = kernels.native()
        # one device in the whole row group (a zero-stride gid): the native pass also
        # counts the kernel's queue depths
        native_qd = nat is not None and gid.strides == (0,)
        if nat is not None:
            qd_counts = self._count_native(
                nat, c, issue, complete, nbytes, kqd_all if native_qd else None, op_code, only_op, ops
            )
            if qd_counts is not None:
                c.kernel_qd = {int(gid[0]): qd_counts}
            is_read = op_mask("read") if self.layer == "file" else None
        else:
            is_read, is_write = op_mask("read"), op_mask("write")
            if is_read is None or is_write is None:
                data = None
            else:
                data = is_read | is_write
                if data.all():
                    data = None
            c.reads = n_requests if is_read is None else int(is_read.sum())
            c.writes = n_requests if is_write is None else int(is_write.sum())
            tbin = complete - self.t0
            tbin //= self.bin_ns
            c.bytes_read = c.bytes_written = 0
            c.tl_read = c.tl_write = None
            for kind, m in (("read", is_read), ("write", is_write)):
                if m is not None and not m.any():
                    continue
                b = pick(nbytes, m)
                tl = np.bincount(pick(tbin, m), weights=b, minlength=self.nbins)
                if kind == "read":
                    c.bytes_read, c.tl_read = int(b.sum()), tl
                else:
                    c.bytes_written, c.tl_write = int(b.sum()), tl
            c.latency = pick(complete, data) - pick(issue, data)
            c.latency_buckets = np.bincount(log_bucket(c.latency), minlength=N_BUCKETS)
            c.size_counts = np.bincount(pow2_bucket(pick(nbytes, data)), minlength=65)
        # the active span (compare.py): first issue and last completion of a transfer
        rd, wr = op_mask("read"), op_mask("write")
        span = None if rd is None or wr is None else rd | wr
        first = pick(issue, span)
        if first.size:
            c.data_first_ns = int(first.min())
            c.data_last_ns = int(pick(complete, span).max())
        # queue depth: rows the layer's counter counts
        counted: np.ndarray | None = None
        if op_code is not None:
            qd_ops = [op_lookup[op] for op in tr.QD_OPS[self.layer]]
            if len(qd_ops) < len(ops):
                counted = np.isin(op_code, qd_ops)
        elif only_op not in tr.QD_OPS[self.layer]:
            counted = np.zeros(n_requests, bool)
        kqd = pick(kqd_all, counted)
        g = pick(gid, counted)
        if g.size:
            single = native_qd or int(g.min()) == int(g.max())
            if native_qd:
                pass  # counted by the native pass
            elif single:
                c.kernel_qd = {int(g[0]): np.bincount(kqd)}
            else:
                width = int(kqd.max()) + 1
                flat = np.bincount(g * width + kqd.astype(np.int64), minlength=(int(g.max()) + 1) * width)
                grid = flat.reshape(-1, width)
                c.kernel_qd = {int(k): grid[k] for k in np.flatnonzero(grid.sum(axis=1))}
            c.gid, c.issue, c.complete = g, pick(issue, counted), pick(complete, counted)
        if self.layer == "file":
            c.processes = self._process_stats(seg, index, t, mask, gid, is_read, nbytes, kqd_all)
        return c

    def _count_native(
        self,
        nat: Any,
        c: _Chunk,
        issue: np.ndarray,
        complete: np.ndarray,
        nbytes: np.ndarray,
        kqd: np.ndarray | None,
        op_code: np.ndarray | None,
        only_op: str | None,
        ops: tuple[str, ...],
    ) -> np.ndarray | None:
        """The counting above in one compiled pass (kernels.py); ``kqd`` given: also the
        kernel queue-depth histogram of the (single) group."""
        names = (*ops, None)  # op code len(ops): not one of the layer's ops
        kind = [0 if op == "read" else 1 if op == "write" else 2 for op in names]
        counted = [op in tr.QD_OPS[self.layer] for op in names]
        only = names.index(only_op) if only_op in ops else len(ops)
        r = nat.count_rows(
            np.ascontiguousarray(issue, np.int64),
            np.ascontiguousarray(complete, np.int64),
            np.ascontiguousarray(nbytes, np.int64),
            None,
            None if op_code is None else np.ascontiguousarray(op_code, np.int64),
            only,
            kind,
            counted,
            None if kqd is None else np.ascontiguousarray(kqd, np.uint32),
            self.t0,
            self.bin_ns,
            self.nbins,
            self._latency_raw,
        )
        c.reads, c.writes = r["reads"], r["writes"]
        c.bytes_read, c.bytes_written = r["bytes_read"], r["bytes_written"]
        c.tl_read, c.tl_write = r["tl_read"], r["tl_write"]
        c.latency = r["latency"]
        c.latency_buckets = r["latency_buckets"]
        c.latency_stats = (r["latency_count"], r["latency_min"], r["latency_max"], r["latency_sum"])
        c.size_counts = r["size_counts"]
        return r["kernel_qd"]

    def _process_stats(
        self,
        seg: tr.Segment,
        index: int,
        t: pa.Table,
        mask: np.ndarray | None,
        gid: np.ndarray,
        is_read: np.ndarray | None,
        nbytes: np.ndarray,
        kqd: np.ndarray,
    ) -> _ProcessChunk:
        """File layer: per process reads, bytes, distinct files, QD at reads, names."""
        n_groups = len(self.group_names)
        g = gid if is_read is None else gid[is_read]
        p = _ProcessChunk()
        p.reads = np.bincount(g, minlength=n_groups)
        b = nbytes if is_read is None else nbytes[is_read]
        p.bytes = np.rint(np.bincount(g, weights=b, minlength=n_groups)).astype(np.int64)
        q = (kqd if is_read is None else kqd[is_read]).astype(np.int64)
        if q.size:
            width = int(q.max()) + 1
            p.qd = np.bincount(g * width + q, minlength=n_groups * width).reshape(-1, width)
        # distinct (process, file) pairs, files numbered globally by path
        for chunk_codes, names in self._file_codes(t["file"], mask, is_read):
            lut = self._global_file_ids(names)
            ok = chunk_codes >= 0
            gg, local = (g, chunk_codes) if ok.all() else (g[ok], chunk_codes[ok])
            width = max(len(names), 1)
            if n_groups * width <= 4 * max(gg.size, 1 << 16):
                seen = np.flatnonzero(np.bincount(gg * width + local, minlength=n_groups * width))
                pairs = (seen // width << 32) | lut[seen % width]
            else:
                pairs = np.unique((gg.astype(np.int64) << 32) | lut[local])
            p.file_pairs.append(pairs)
        # names: the comm of the first row of each process not named yet
        present = np.flatnonzero(np.bincount(gid, minlength=n_groups))
        with self._lock:
            unnamed = [int(k) for k in present if int(k) not in self._comms]
        if unnamed:
            cols = tr.read_row_group(seg, index, ["comm"])["comm"]
            comms = cols if mask is None else cols.filter(pa.array(mask))
            first = np.full(n_groups, -1, np.int64)
            first[gid[::-1]] = np.arange(gid.size - 1, -1, -1)  # the last write wins
            with self._lock:
                for k in unnamed:
                    if first[k] >= 0:
                        self._comms.setdefault(k, comms[int(first[k])].as_py())
        return p

    def _file_codes(
        self, column: pa.ChunkedArray, mask: np.ndarray | None, is_read: np.ndarray | None
    ) -> list[tuple[np.ndarray, list[str]]]:
        """Dictionary codes of the selected read rows (-1 for null) and the dictionary."""
        if column.num_chunks == 0:
            return []
        array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
        if not pa.types.is_dictionary(array.type):
            array = array.dictionary_encode()
        codes = array.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        if mask is not None:
            codes = codes[mask]
        if is_read is not None:
            codes = codes[is_read]
        return [(codes, array.dictionary.to_pylist())]

    def _global_file_ids(self, names: list[str]) -> np.ndarray:
        with self._lock:
            ids = self._file_ids
            return np.array([ids.setdefault(name, len(ids)) for name in names], np.int64)

    # ------------------------------------------------------------------ main loop

    def _task(self, k: int, channels: list[tuple[QueueDepthSweep, TailExchange, bool]]) -> _Chunk:
        """Worker: decode and count one row group, then sweep its ready events."""
        try:
            c = self._prepare(self.units[k])
        except BaseException:
            for _, exchange, _ in channels:
                exchange.fail(k)
            raise
        split: list[dict[int, np.ndarray]] = []
        for sweep, _, union in channels:
            if c.gid is None or c.gid.size == 0:
                split.append({})
                continue
            gid = np.zeros(c.gid.size, np.int64) if union else c.gid
            split.append(sweep.split(gid, c.issue, c.complete, self.t0))
            if self.layer == "block" and not union and _equal_neighbours(split[0]):
                # rare: a request that completed in parts, or two events in the same ns
                c = self._prepare(self.units[k], merge_partials=True)
                split[0] = sweep.split(c.gid, c.issue, c.complete, self.t0)
        for (_, exchange, _), per_group in zip(channels, split, strict=True):
            c.summaries.append(sweep_slices(exchange, k, per_group))
        if c.issue is not None and c.issue.size:
            c.tl_inflight = self._inflight_bins(c.issue, c.complete)
        c.gid = c.issue = c.complete = None  # swept: free them before the main thread runs
        return c

    def _inflight_bins(self, issue: np.ndarray, complete: np.ndarray) -> np.ndarray:
        """Per timeline bin, the integral over the bin of the requests in flight (ns):
        each request adds its overlap with the bin. Order-free, so each row group adds its
        own: an event at t in bin b (from b*W to (b+1)*W after t0) adds (b+1)*W - t to
        bin b and W to every bin after it; an issue adds, a completion subtracts."""
        w = self.bin_ns
        out = np.zeros(self.nbins, np.float64)
        for times, sign in ((issue, 1.0), (complete, -1.0)):
            rel = times - self.t0
            b = rel // w
            out += sign * np.bincount(b, weights=(b + 1) * w - rel, minlength=self.nbins)
            counts = np.bincount(b, minlength=self.nbins)
            before = np.cumsum(counts[:-1])  # events in bins below b = 1, 2, ...
            out[1:] += sign * w * before.astype(np.float64)
        return out

    def run(self) -> dict[str, Any]:
        n_groups = len(self.group_names)
        sweep = QueueDepthSweep(window_end=self.window, burst_gap=self.burst_gap_ns)
        channels = [(sweep, TailExchange(self.watermarks), False)]
        union = None
        if n_groups > 1:
            union = QueueDepthSweep(window_end=self.window, burst_gap=self.burst_gap_ns)
            channels.append((union, TailExchange(self.watermarks), True))
        acc = _Chunk(latency=None)
        latency = QuantileSketch()
        size_counts = np.zeros(65, np.int64)
        tl_read = np.zeros(self.nbins, np.float64)
        tl_write = np.zeros(self.nbins, np.float64)
        tl_inflight = np.zeros(self.nbins, np.float64)
        kernel_qd: dict[int, np.ndarray] = {}
        procs = _ProcessTotals(len(self.group_names))
        pool = ThreadPoolExecutor(max_workers=self.workers)
        inflight: deque[Future[_Chunk]] = deque()
        todo = iter(range(len(self.units)))
        try:
            for _ in range(2 * self.workers):
                k = next(todo, None)
                if k is not None:
                    inflight.append(pool.submit(self._task, k, channels))
            k_done = 0
            while inflight:
                c = inflight.popleft().result()
                nxt = next(todo, None)
                if nxt is not None:
                    inflight.append(pool.submit(self._task, nxt, channels))
                if c.events:
                    acc.events += c.events
                    acc.reads += c.reads
                    acc.writes += c.writes
                    acc.bytes_read += c.bytes_read
                    acc.bytes_written += c.bytes_written
                    if c.data_first_ns is not None:
                        acc.data_first_ns = min(c.data_first_ns, acc.data_first_ns or c.data_first_ns)
                        acc.data_last_ns = max(c.data_last_ns or 0, acc.data_last_ns or 0)
                    if c.latency_stats is not None:
                        latency.add_counted(*c.latency_stats, c.latency_buckets, c.latency)
                        self._latency_raw = latency.exact
                    else:
                        latency.add(c.latency, buckets=c.latency_buckets)
                    size_counts += c.size_counts
                    if c.tl_read is not None:
                        tl_read += c.tl_read
                    if c.tl_write is not None:
                        tl_write += c.tl_write
                if c.tl_inflight is not None:
                    tl_inflight += c.tl_inflight
                    for g, h in c.kernel_qd.items():
                        prev = kernel_qd.get(g, np.zeros(0, np.int64))
                        if prev.size < h.size:
                            prev = np.concatenate((prev, np.zeros(h.size - prev.size, np.int64)))
                        prev[: h.size] += h
                        kernel_qd[g] = prev
                if c.processes is not None:
                    procs.add(c.processes)
                for (ch_sweep, exchange, _), summaries in zip(channels, c.summaries, strict=True):
                    for g, summary in summaries.items():
                        ch_sweep.apply(g, summary)
                    exchange.release(k_done)
                k_done += 1
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        groups = sweep.finish()
        union_state: GroupState | None = None
        if union is not None:
            union_state = union.finish().get(0)
        elif groups:
            union_state = groups[0]
        if union_state is None:  # selected rows, none counted in a queue (only open/close)
            union_state = GroupState(hist_time=np.array([float(self.window)]))
        self._procs = procs
        if self.bin_auto:
            tl_read, tl_write, tl_inflight = self._coarsen(acc, tl_read, tl_write, tl_inflight)
        self._tl_inflight = tl_inflight
        return self._result(acc, latency, size_counts, tl_read, tl_write, kernel_qd, groups, union_state)

    def _coarsen(self, acc: _Chunk, *timelines: np.ndarray) -> list[np.ndarray]:
        """Sum the fine bins into the smallest 1/2/5 x 10^k multiple of them that leaves
        at most AUTO_BINS bins over the active span (the window when nothing moved)."""
        span = self.window
        if acc.data_first_ns is not None and acc.data_last_ns is not None:
            span = max(acc.data_last_ns - acc.data_first_ns, 1)
        fine = self.bin_ns
        factor = 1
        steps = (1, 2, 5)
        k = 0
        while span / (fine * factor) > AUTO_BINS:
            k += 1
            factor = steps[k % 3] * 10 ** (k // 3)
        if factor == 1:
            return list(timelines)
        self.bin_ns = fine * factor
        self.bin_s = self.bin_ns / 1e9
        nbins = self.nbins
        self.nbins = -(-nbins // factor)
        out = []
        for tl in timelines:
            padded = np.zeros(self.nbins * factor, np.float64)
            padded[:nbins] = tl
            out.append(padded.reshape(self.nbins, factor).sum(axis=1))
        return out

    # ------------------------------------------------------------------ results

    def _result(
        self,
        acc: _Chunk,
        latency: QuantileSketch,
        size_counts: np.ndarray,
        tl_read: np.ndarray,
        tl_write: np.ndarray,
        kernel_qd: dict[int, np.ndarray],
        groups: dict[int, GroupState],
        union_state: GroupState,
    ) -> dict[str, Any]:
        duration_ns = max(self.window, 1)
        duration_s = self.window / 1e9
        total_kernel = _sum_hists(kernel_qd.values())
        total_issue = _sum_hists(g.hist_issue for g in groups.values())
        total_time = _sum_hists((g.hist_time for g in groups.values()), dtype=np.float64)
        n_groups = max(len(groups), 1)
        busy_ns = float(total_time[1:].sum())
        hist_k = _fractions(total_kernel)
        hist_c = _fractions(total_issue)
        data_bytes = acc.bytes_read + acc.bytes_written
        timeline_total = (tl_read + tl_write) / MIB / self.bin_s
        active_s = (
            (acc.data_last_ns - acc.data_first_ns) / 1e9
            if acc.data_first_ns is not None and acc.data_last_ns is not None
            else 0.0
        )
        out: dict[str, Any] = {
            "trace": str(self.path),
            "schema_version": tr.SCHEMA_VERSION,
            "selection": {
                "layer": self.layer,
                "dev": self.sel.dev,
                "pid": self.sel.pid,
                "grouped_by": self.group_col,
                "groups": len(self.group_names),
            },
            "layers_present": self.layers_present,
            "events": acc.events,
            "reads": acc.reads,
            "writes": acc.writes,
            "bytes_read": acc.bytes_read,
            "bytes_written": acc.bytes_written,
            "start_ns": self.t0,
            "end_ns": self.t1,
            "duration_s": duration_s,
            "throughput_mib_s": {
                "mean": data_bytes / MIB / duration_s if duration_s > 0 else 0.0,
                "read_mean": acc.bytes_read / MIB / duration_s if duration_s > 0 else 0.0,
                "write_mean": acc.bytes_written / MIB / duration_s if duration_s > 0 else 0.0,
                "peak": float(timeline_total.max()) if timeline_total.size else 0.0,
                "bin_s": self.bin_s,
                "bin_auto": self.bin_auto,
                "timeline": {
                    "t_s": [round(i * self.bin_s, 9) for i in range(self.nbins)],
                    "read": (tl_read / MIB / self.bin_s).tolist(),
                    "write": (tl_write / MIB / self.bin_s).tolist(),
                    "qd_mean": (self._tl_inflight / self.bin_ns / n_groups).tolist(),
                },
            },
            "active_s": active_s,
            "throughput_active_mib_s": data_bytes / MIB / active_s if active_s > 0 else 0.0,
            "iops": (acc.reads + acc.writes) / duration_s if duration_s > 0 else 0.0,
            "read_iops": acc.reads / duration_s if duration_s > 0 else 0.0,
            "write_iops": acc.writes / duration_s if duration_s > 0 else 0.0,
            "qd_definitions": QD_DEFINITIONS,
            "qd_hist_issue": hist_k,
            "qd_hist_issue_computed": hist_c,
            "qd_issue_agreement": {
                "w1": w1_distance(hist_k, hist_c),
                "max_abs_diff": max_abs_diff(hist_k, hist_c),
                "mean_kernel": hist_mean(hist_k),
                "mean_computed": hist_mean(hist_c),
            },
            "qd_mean_issue": hist_mean(hist_k),
            "qd_max": max((int(k) for k in hist_c), default=0),
            "qd_hist_time": _fractions(total_time, total=duration_ns * n_groups),
            "qd_hist_time_busy": _fractions(total_time[1:], offset=1),
            "qd_mean_time": _weighted_mean(total_time) / (duration_ns * n_groups),
            "qd_mean_time_busy": _weighted_mean(total_time) / busy_ns if busy_ns else 0.0,
            "utilization": busy_ns / (duration_ns * n_groups),
            "latency_us": {
                "p50": latency.quantile(0.5) / 1e3,
                "p90": latency.quantile(0.9) / 1e3,
                "p99": latency.quantile(0.99) / 1e3,
                "p999": latency.quantile(0.999) / 1e3,
                "max": latency.max / 1e3 if latency.count else float("nan"),
                "mean": latency.sum / latency.count / 1e3 if latency.count else float("nan"),
                "exact": latency.exact,
            },
            "latency_hist_us": _pow2_hist_us(latency),
            "latency_cdf_us": _cdf(latency),
            "size_hist": {
                str(pow2_label(b)): float(n) / max(int(size_counts.sum()), 1) for b, n in enumerate(size_counts) if n
            },
            "size_counts": {str(pow2_label(b)): int(n) for b, n in enumerate(size_counts) if n},
            "mean_size_bytes": data_bytes / (acc.reads + acc.writes) if acc.reads + acc.writes else 0.0,
            "idle_fraction": float(union_state.hist_time[0]) / duration_ns,
            "bursts": _bursts(union_state, self.burst_gap_ms, data_bytes),
            "idle_gap_hist_us": _pow2_hist_us(union_state.idle_gaps),
            "lost_events": _lost(self.meta),
            "recording": recording(self.meta, self.path),
        }
        per_group = {}
        for gid, state in sorted(groups.items()):
            name = self.group_names[gid]
            busy = state.busy_ns
            per_group[name] = {
                "qd_hist_issue": _fractions(kernel_qd.get(gid, np.zeros(0, np.int64))),
                "qd_hist_issue_computed": _fractions(state.hist_issue),
                "qd_hist_time": _fractions(state.hist_time, total=duration_ns),
                "qd_mean_time": _weighted_mean(state.hist_time) / duration_ns,
                "qd_mean_time_busy": _weighted_mean(state.hist_time) / busy if busy else 0.0,
                "utilization": busy / duration_ns,
                "bursts": _bursts(state, self.burst_gap_ms, None),
            }
        out["groups"] = per_group
        if self.with_model and "file" in self.layers_present:
            out["job_model"] = job_model(self.path, step_gap_ms=self.step_gap_ms)
            if out["job_model"] is not None:
                out["write_bursts"] = out["job_model"]["writes"]
        if self.layer == "file":
            out["steps"] = _steps(out.get("job_model"))
            out["processes"] = self._processes(groups, out.get("job_model"))
        return out

    def _processes(self, groups: dict[int, GroupState], model: dict[str, Any] | None) -> list[dict[str, Any]]:
        gpu_of: dict[int, dict[str, Any]] = {}
        for gpu in (model or {}).get("gpus", []):
            for m in gpu["members"]:
                gpu_of[m["pid"]] = gpu
        procs = self._procs
        files = procs.files_per_group()
        out = []
        for gid, name in enumerate(self.group_names):
            reads = int(procs.reads[gid])
            nbytes = int(procs.bytes[gid])
            qd = procs.qd[gid] if gid < procs.qd.shape[0] else np.zeros(0, np.int64)
            levels = np.flatnonzero(qd)
            state = groups.get(gid)
            entry = {
                "pid": int(name),
                "comm": self._comms.get(gid),
                "reads": reads,
                "bytes": nbytes,
                "files": int(files[gid]) if gid < files.size else 0,
                "mean_read_size": nbytes / reads if reads else 0.0,
                "concurrency": {
                    "mean_issue": float((levels * qd[levels]).sum() / qd.sum()) if qd.sum() else 0.0,
                    "max": int(levels[-1]) if levels.size else 0,
                    "mean_time": (_weighted_mean(state.hist_time) / max(self.window, 1) if state else 0.0),
                },
            }
            gpu = gpu_of.get(int(name))
            entry["gpu"] = gpu["index"] if gpu else None
            entry["compute_time_s"] = gpu["compute_s"] if gpu else None
            entry["required_mib_s_per_gpu"] = gpu["required_mib_s"] if gpu else None
            out.append(entry)
        return out


class _ProcessTotals:
    """File layer: per-process counters summed over row groups (main thread)."""

    def __init__(self, n_groups: int) -> None:
        self.reads = np.zeros(n_groups, np.int64)
        self.bytes = np.zeros(n_groups, np.int64)
        self.qd = np.zeros((n_groups, 0), np.int64)
        self.file_pairs = np.zeros(0, np.int64)

    def add(self, p: _ProcessChunk) -> None:
        if p.reads is not None:
            self.reads += p.reads
            self.bytes += p.bytes
        if p.qd is not None:
            width = max(self.qd.shape[1], p.qd.shape[1])
            grown = np.zeros((self.qd.shape[0], width), np.int64)
            grown[:, : self.qd.shape[1]] += self.qd
            grown[: p.qd.shape[0], : p.qd.shape[1]] += p.qd
            self.qd = grown
        if p.file_pairs:
            # distinct pairs so far: memory grows with files x processes, not with rows
            self.file_pairs = np.union1d(self.file_pairs, np.concatenate(p.file_pairs))

    def files_per_group(self) -> np.ndarray:
        return np.bincount(self.file_pairs >> 32, minlength=self.reads.size)


# ---------------------------------------------------------------------- helpers


def _check_statistics(seg: tr.Segment, index: int, t: pa.Table, lo: int, hi: int) -> None:
    """The plan (window, watermarks) comes from the row groups' statistics: rows outside
    them would break the streaming sweep's order, so a row group that contradicts its
    statistics is refused."""
    if t.num_rows == 0:
        return
    first = int(pa.compute.min(t["issue_ns"]).as_py())
    last = int(pa.compute.max(t["complete_ns"]).as_py())
    if first < lo or last > hi:
        msg = (
            f"{seg.path}: row group {index}: rows span issue_ns {first} to complete_ns {last}, "
            f"outside the statistics' {lo} to {hi} (corrupt file)"
        )
        raise TraceError(msg)


def _equal_neighbours(per_group: dict[int, np.ndarray]) -> bool:
    """Whether two issues of one group share a nanosecond (sorted keys repeat)."""
    nat = kernels.native()
    if nat is not None:
        return any(nat.equal_issue_neighbours(np.ascontiguousarray(k)) for k in per_group.values())
    for keys in per_group.values():
        same = np.flatnonzero(keys[1:] == keys[:-1])  # usually empty or a few completions
        if same.size and np.any((keys[same] & 3) == CODE_ISSUE):
            return True
    return False


def _merge_partials(
    issue: np.ndarray,
    complete: np.ndarray,
    nbytes: np.ndarray,
    kqd: np.ndarray,
    op_code: np.ndarray | None,
    gid: np.ndarray,
) -> tuple[np.ndarray, ...] | None:
    """Fold the rows of block requests that completed in parts into one request each.

    SCHEMA.md: such a request yields one row per partial completion, all with the
    request's ``issue_ns`` and ``queue_depth``; two different requests on one device
    never share both (the kernel counter moved between their issues). The request is in
    flight until its last part completes and moved the parts' bytes. None: no such rows.
    """
    order = np.lexsort((kqd, issue, gid))
    i, g, q = issue[order], np.asarray(gid)[order], kqd[order]
    new = np.ones(i.size, bool)
    new[1:] = (i[1:] != i[:-1]) | (g[1:] != g[:-1]) | (q[1:] != q[:-1])
    if new.all():
        return None
    starts = np.flatnonzero(new)
    return (
        i[starts],
        np.maximum.reduceat(complete[order], starts),
        np.add.reduceat(nbytes[order], starts),
        q[starts],
        None if op_code is None else op_code[order][starts],
        g[starts],
    )


def _sum_hists(hists: Any, dtype: Any = np.int64) -> np.ndarray:
    total = np.zeros(0, dtype)
    for h in hists:
        if h.size > total.size:
            total = np.concatenate((total, np.zeros(h.size - total.size, dtype)))
        total[: h.size] += h
    return total


def _fractions(hist: np.ndarray, *, total: float | None = None, offset: int = 0) -> dict[str, float]:
    denom = float(hist.sum()) if total is None else float(total)
    if denom <= 0:
        return {}
    return {str(k + offset): float(v) / denom for k, v in enumerate(hist) if v}


def _weighted_mean(hist: np.ndarray) -> float:
    return float((np.arange(hist.size) * hist).sum())


def hist_mean(hist: dict[str, float]) -> float:
    """Mean of a {k: fraction} histogram."""
    return float(sum(int(k) * v for k, v in hist.items()))


def w1_distance(a: dict[str, float], b: dict[str, float]) -> float:
    """Wasserstein-1 (earth mover's) distance of two {k: fraction} histograms on the integers.

    W1 = sum over k of |CDF_a(k) - CDF_b(k)|, in units of k (queue-depth steps).
    """
    if not a or not b:
        return float("nan") if (a or b) else 0.0
    top = max(int(k) for k in [*a, *b])
    pa_ = np.zeros(top + 1)
    pb_ = np.zeros(top + 1)
    for k, v in a.items():
        pa_[int(k)] = v
    for k, v in b.items():
        pb_[int(k)] = v
    pa_ /= pa_.sum()
    pb_ /= pb_.sum()
    return float(np.abs(np.cumsum(pa_) - np.cumsum(pb_)).sum())


def max_abs_diff(a: dict[str, float], b: dict[str, float]) -> float:
    keys = set(a) | set(b)
    return max((abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys), default=0.0)


def _bursts(state: GroupState, gap_ms: float, nbytes: float | None) -> dict[str, Any]:
    """Burst statistics; every request lies in exactly one burst, so the mean bytes per
    burst is the selection's bytes over the burst count."""
    starts = state.burst_starts.array()
    ends = state.burst_ends.array()[: starts.size]
    n = int(min(starts.size, ends.size))
    gaps = state.burst_gaps.array().astype(np.float64)
    out: dict[str, Any] = {
        "gap_threshold_ms": gap_ms,
        "count": n,
        "mean_duration_s": float((ends[:n] - starts[:n]).mean()) / 1e9 if n else 0.0,
        "mean_gap_s": float(gaps.mean()) / 1e9 if gaps.size else 0.0,
        "median_gap_s": float(np.median(gaps)) / 1e9 if gaps.size else 0.0,
        "busy_periods": state.busy_periods,
    }
    if nbytes is not None:
        out["mean_bytes"] = nbytes / n if n else 0.0
    return out


def job_model(
    path: str | os.PathLike[str], *, grouping: str = "auto", step_gap_ms: float | None = None
) -> dict[str, Any] | None:
    """The job model of a trace: the GPUs (a rank and its DataLoader workers), their
    steps, compute time per step and the throughput one GPU needs.

    Computed by the native extension from crate ``trainio-model``, the same code that
    ``trainio replay --trace`` replays from (docs/analysis.md, *Job model*). None when
    the extension is not built.
    """
    mod = kernels._module
    if mod is None or not hasattr(mod, "job_model"):
        return None
    try:
        return json.loads(mod.job_model(str(path), grouping, step_gap_ms))
    except ValueError as e:
        raise TraceError(str(e)) from None


def _steps(model: dict[str, Any] | None) -> dict[str, Any]:
    """The job's steps and needs, from the job model (``job_model``): steps summed over
    GPUs, the median GPU's compute time, bytes per step and MiB/s per GPU."""
    if not model:
        return {
            "steps": 0,
            "gpus": 0,
            "compute_time_s": None,
            "bytes_per_step": None,
            "required_mib_s_per_gpu": None,
        }
    return {
        "steps": model["steps"],
        "gpus": len(model["gpus"]),
        "compute_time_s": model["compute_s"],
        "bytes_per_step": model["bytes_per_step"],
        "required_mib_s_per_gpu": model["required_mib_s_per_gpu"],
    }


def _pow2_hist_us(sketch: QuantileSketch) -> dict[str, int]:
    low, counts = sketch.histogram()
    out: dict[str, int] = {}
    for lo, n in zip(low, counts, strict=True):
        us = lo / 1e3
        key = "0" if us < 1 else str(1 << int(math.floor(math.log2(us))))
        out[key] = out.get(key, 0) + int(n)
    return out


CDF_POINTS = (
    [i / 100 for i in range(100)]
    + [round(0.99 + i / 1000, 4) for i in range(1, 10)]
    + [round(0.999 + i / 10_000, 4) for i in range(1, 10)]
    + [1.0]
)


def _cdf(sketch: QuantileSketch) -> dict[str, list[float]]:
    """The latency distribution as quantiles on a fixed grid of probabilities (every
    percent, then every 0.1 % above 99 % and every 0.01 % above 99.9 %): a CDF to draw
    that stays ~120 points whatever the trace's size."""
    if not sketch.count:
        return {"p": [], "us": []}
    return {"p": CDF_POINTS, "us": [sketch.quantile(p) / 1e3 for p in CDF_POINTS]}


def recording(meta: dict[str, Any], path: str | os.PathLike[str]) -> dict[str, Any]:
    """Where and when the trace was recorded, from its metadata (traces/SCHEMA.md):
    host, kernel, command (or other target), start time (UTC), duration, devices."""
    import datetime as dt

    start, end, offset = meta.get("start_ns"), meta.get("end_ns"), meta.get("clock_offset_ns")
    started = None
    if isinstance(start, int) and isinstance(offset, int) and start + offset > 0:
        started = (
            dt.datetime.fromtimestamp((start + offset) / 1e9, dt.UTC)
            .isoformat(timespec="seconds")
            .replace("+00:00", "Z")
        )
    target = meta.get("target") if isinstance(meta.get("target"), dict) else {}
    command = None
    if isinstance(target.get("command"), list):
        command = " ".join(str(a) for a in target["command"])
    elif "pid" in target:
        command = f"--pid {target['pid']}"
    elif "cgroup" in target:
        command = f"--cgroup {target['cgroup']}"
    elif target.get("all"):
        command = "all processes"
    events = meta.get("events") if isinstance(meta.get("events"), dict) else {}
    devices = []
    for d in meta.get("devices") or []:
        if not isinstance(d, dict):
            continue
        # the block devices and NFS mounts of the recording: a pseudo file system
        # (proc, sysfs, tmpfs: no size, no source) is only there for its mounts
        if not d.get("size_bytes") and not str(d.get("name", "")).count(":"):
            continue
        devices.append(
            {
                "dev": d.get("dev"),
                "name": d.get("name"),
                "size_bytes": d.get("size_bytes"),
                "mounts": [
                    f"{m.get('mount_point')} ({m.get('fstype')})" for m in d.get("mounts") or [] if isinstance(m, dict)
                ],
            }
        )
    source = meta.get("source") if isinstance(meta.get("source"), dict) else {}
    return {
        "host": meta.get("hostname"),
        "kernel": meta.get("kernel_release"),
        "command": command,
        "started_utc": started,
        "duration_s": (end - start) / 1e9 if isinstance(start, int) and isinstance(end, int) and end >= start else None,
        "devices": devices,
        "layers": meta.get("layers") if isinstance(meta.get("layers"), list) else sorted(events),
        "tracer_version": meta.get("tracer_version"),
        "source": source.get("format"),
    }


def _lost(meta: dict[str, Any]) -> dict[str, Any]:
    lost = meta.get("lost_events") or {}
    by_probe = {str(k): int(v) for k, v in lost.items()} if isinstance(lost, dict) else {}
    total = sum(by_probe.values())
    return {"total": total, "by_probe": by_probe, "complete": total == 0}


def _per_host(
    members: list[tr.Member], job: dict[str, Any], sel: Selection, burst_gap_ms: float, workers: int
) -> list[dict[str, Any]]:
    """Each host's figures in a trace set's analysis: its member analyzed alone (the
    job's layer, the selection's device when it is on that host, its pid), placed on the
    job's clock; its GPUs are the job model's GPUs on that host."""
    gpus: dict[str, int] = {}
    for g in (job.get("job_model") or {}).get("gpus", []):
        gpus[g.get("host")] = gpus.get(g.get("host"), 0) + 1
    out = []
    for m in members:
        entry: dict[str, Any] = {
            "host": m.host,
            "path": str(m.path),
            "clock_offset_ns": m.clock_offset_ns,
            "shift_ns": m.shift_ns,
            "gpus": gpus.get(m.host, 0),
        }
        dev = sel.dev
        if dev is not None and "/" in dev:
            host, _, dev = dev.partition("/")
            if host != m.host:
                out.append({**entry, "events": 0})
                continue
        try:
            r = _Analyzer(
                m.path,
                Selection(layer=job["selection"]["layer"], dev=dev, pid=sel.pid),
                None,
                burst_gap_ms,
                workers,
                with_model=False,
            ).run()
        except SelectionError:
            out.append({**entry, "events": 0})  # nothing of the selection on this host
            continue
        tp = r["throughput_mib_s"]
        entry.update(
            {
                "events": r["events"],
                "reads": r["reads"],
                "writes": r["writes"],
                "bytes_read": r["bytes_read"],
                "bytes_written": r["bytes_written"],
                # on the job's clock: seconds after the job's start
                "start_s": (r["start_ns"] + m.shift_ns - job["start_ns"]) / 1e9,
                "end_s": (r["end_ns"] + m.shift_ns - job["start_ns"]) / 1e9,
                "duration_s": r["duration_s"],
                "throughput_mib_s": {k: tp[k] for k in ("mean", "read_mean", "write_mean", "peak")},
                "iops": r["iops"],
                "qd_mean_time": r["qd_mean_time"],
                "latency_us": r["latency_us"],
                "devices": sorted(r["groups"]) if r["selection"]["grouped_by"] == "dev" else [],
                "lost_events": r["lost_events"]["total"],
            }
        )
        out.append(entry)
    return out


def analyze(
    path: str | os.PathLike[str],
    *,
    layer: str | None = None,
    dev: str | None = None,
    pid: int | None = None,
    bin_s: float | None = None,
    burst_gap_ms: float = DEFAULT_BURST_GAP_MS,
    workers: int = 2,
    step_gap_ms: float | None = None,
    with_model: bool = True,
) -> dict[str, Any]:
    """Analyze one layer of a trace; returns the JSON-ready result.

    Parameters
    ----------
    layer
        ``block``, ``file`` or ``nfs``; default the lowest layer present.
    dev, pid
        Keep only this device (``MAJ:MIN`` or its name) or process.
    bin_s
        Timeline bin width in seconds; None: automatic (100-300 bins over the active
        span, a 1/2/5 x 10^k multiple of 1 us).
    burst_gap_ms
        Idle gaps at least this long separate bursts.
    workers
        Threads decoding row groups ahead of the sweep.
    step_gap_ms
        The job model's gap between the batches of a rank that reads them itself; None:
        found from the gaps.
    with_model
        Infer the job model (``job_model``, ``steps``, each process's GPU); callers that
        use none of them (report, compare) skip reading the trace once more for it.
    """
    sel = Selection(layer=layer, dev=dev, pid=pid)
    try:
        out = _Analyzer(path, sel, bin_s, burst_gap_ms, workers, with_model, step_gap_ms).run()
        members = tr.trace_set_members(path)
        if members is not None:
            out["per_host"] = _per_host(members, out, sel, burst_gap_ms, workers)
        return out
    except (pa.ArrowException, pl.exceptions.PolarsError) as exc:
        # every read goes through trace.py, which names the file; this is the net
        msg = f"{path}: unreadable ({tr.first_line(exc)})"
        raise TraceError(msg) from None
