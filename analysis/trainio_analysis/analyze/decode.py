"""Decoding: one row group into what it contributes to the analysis.

A :class:`Decoder` runs on the worker threads: it reads the columns the plan
(:mod:`trainio_analysis.analyze.plan`) names for a row group, selects its rows, counts
what does not need order (requests, bytes, the throughput timeline, sizes, latencies, the
kernel's queue depths, per-process tallies of the file layer) and keeps the selected
requests' times for the queue-depth sweep (:mod:`trainio_analysis.analyze.qd_sweep`), which it
then runs on the events that are ready. The result is a :class:`Chunk`.

When the job model is wanted (``model_rows``), each row group is read once with every
column and that one table serves both: the analysis takes its columns from it, and the
chunk carries the rows as the model takes them (:func:`trainio_analysis.trace.model_rows`),
which the pass pushes into the model in row-group order. Row groups of other layers,
which the analysis skips, are read for the model only.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from trainio_analysis import kernels
from trainio_analysis import trace as tr
from trainio_analysis.analyze.plan import Plan, Unit, column_codes, column_numpy
from trainio_analysis.analyze.qd_sweep import CODE_ISSUE, QueueDepthSweep, TailExchange, sweep_slices
from trainio_analysis.analyze.sketch import N_BUCKETS, log_bucket, pow2_bucket
from trainio_analysis.errors import TraceError

#: More requests in flight than any device or process holds (the histograms of queue
#: depths are counted in arrays as long as the deepest): a corrupt value, refused.
MAX_QUEUE_DEPTH = 1 << 20


@dataclass
class Chunk:
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
    processes: ProcessChunk | None = None
    # first issue and last completion of the data transfers (None: none in the chunk)
    data_first_ns: int | None = None
    data_last_ns: int | None = None
    # the row group's rows for the job model (ROWS_SCHEMA; None: no model wanted)
    model_rows: pa.Table | None = None


@dataclass
class ProcessChunk:
    """File layer, one row group: per process (group id) counters."""

    reads: np.ndarray | None = None
    bytes: np.ndarray | None = None
    qd: np.ndarray | None = None  # [group, queue depth] counts at reads
    file_pairs: list[np.ndarray] = field(default_factory=list)  # (group << 32) | file id


class ProcessTotals:
    """File layer: per-process counters summed over row groups (main thread)."""

    def __init__(self, n_groups: int) -> None:
        self.reads = np.zeros(n_groups, np.int64)
        self.bytes = np.zeros(n_groups, np.int64)
        self.qd = np.zeros((n_groups, 0), np.int64)
        self.file_pairs = np.zeros(0, np.int64)

    def add(self, p: ProcessChunk) -> None:
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


class Decoder:
    """Decodes the plan's row groups (thread-safe: the file ids and process names it
    collects are shared under a lock)."""

    def __init__(self, plan: Plan, *, model_rows: bool = False) -> None:
        self.plan = plan
        #: read every column of every row group, and hand its rows to the job model
        self.model_rows = model_rows
        self._lock = threading.Lock()
        self._file_ids: dict[str, int] = {}
        #: group id -> the comm of its first row in the trace (segment path, row group)
        self.comms: dict[int, str] = {}
        self._comm_at: dict[int, tuple[str, int]] = {}
        # whether the latency sketch still keeps raw values (native path: only then does
        # a chunk return its latencies); it only ever turns False
        self.latency_raw = True

    def task(
        self, k: int, channels: list[tuple[QueueDepthSweep, TailExchange, bool]], table: pa.Table | None = None
    ) -> Chunk:
        """Worker: decode and count one row group, then sweep its ready events. ``table``:
        the row group read already with every column (by a pass of several analyses)."""
        unit = self.plan.units[k]
        try:
            if self.model_rows and table is None:
                seg, index = unit[0], unit[1]
                table = tr.read_row_group(seg, index, tr.segment_columns(seg))
            c = self.prepare(unit, table=table)
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
            split.append(sweep.split(gid, c.issue, c.complete, self.plan.t0))
            if self.plan.layer == "block" and not union and equal_neighbours(split[0]):
                # rare: a request that completed in parts, or two events in the same ns
                c = self.prepare(unit, merge_partials=True, table=table)
                split[0] = sweep.split(c.gid, c.issue, c.complete, self.plan.t0)
        for (_, exchange, _), per_group in zip(channels, split, strict=True):
            c.summaries.append(sweep_slices(exchange, k, per_group))
        if c.issue is not None and c.issue.size:
            c.tl_inflight = self._inflight_bins(c.issue, c.complete)
        c.gid = c.issue = c.complete = None  # swept: free them before the main thread runs
        if self.model_rows and table is not None:
            c.model_rows = tr.model_rows(table)
        return c

    def _inflight_bins(self, issue: np.ndarray, complete: np.ndarray) -> np.ndarray:
        """Per timeline bin, the integral over the bin of the requests in flight (ns):
        each request adds its overlap with the bin. Order-free, so each row group adds its
        own: an event at t in bin b (from b*W to (b+1)*W after t0) adds (b+1)*W - t to
        bin b and W to every bin after it; an issue adds, a completion subtracts."""
        w = self.plan.bin_ns
        out = np.zeros(self.plan.nbins, np.float64)
        for times, sign in ((issue, 1.0), (complete, -1.0)):
            rel = times - self.plan.t0
            b = rel // w
            out += sign * np.bincount(b, weights=(b + 1) * w - rel, minlength=self.plan.nbins)
            counts = np.bincount(b, minlength=self.plan.nbins)
            before = np.cumsum(counts[:-1])  # events in bins below b = 1, 2, ...
            out[1:] += sign * w * before.astype(np.float64)
        return out

    def prepare(self, unit: Unit, *, merge_partials: bool = False, table: pa.Table | None = None) -> Chunk:
        """Read one row group and count what does not need order; keep what the sweep needs.

        ``merge_partials``: fold the rows of a block request that completed in parts (same
        device, ``issue_ns`` and ``queue_depth``) into one request (see :func:`_merge_partials`).
        ``table``: the row group read already with every column (it is not read again).
        """
        seg, index, lo, hi = unit
        plan = self.plan
        const = plan.constants(seg, index)
        dev = plan.dev
        c = Chunk()
        if "layer" in const:
            tr.check_constants(seg, index, const["layer"], const.get("op"))
        if plan.rules_out(const):
            return c  # the statistics say no row of this group is selected
        if table is not None:
            t = table
        else:
            cols = plan.columns(const)
            t = tr.read_row_group(seg, index, cols, layer=const.get("layer"), op=const.get("op"))
        n = t.num_rows
        check_statistics(seg, index, t, lo, hi)
        ops = tr.OPS[self.plan.layer]
        op_lookup = {op: i for i, op in enumerate(ops)}
        mask: np.ndarray | None = None  # None: every row is selected
        if "layer" not in const:
            mask = column_codes(t["layer"], {self.plan.layer: 1}, 0) == 1
        if dev is not None and "dev" not in const:
            m = column_codes(t["dev"], {dev: 1}, 0) == 1
            mask = m if mask is None else mask & m
        if self.plan.sel.pid is not None:
            m = column_numpy(t["pid"]) == self.plan.sel.pid
            mask = m if mask is None else mask & m
        if mask is not None:
            if mask.all():
                mask = None
            elif not mask.any():
                return c

        def pick(a: np.ndarray, m: np.ndarray | None) -> np.ndarray:
            return a if m is None else a[m]

        c.events = n if mask is None else int(mask.sum())
        issue = pick(column_numpy(t["issue_ns"]), mask)  # absolute: keys and bins subtract t0
        complete = pick(column_numpy(t["complete_ns"]), mask)
        nbytes = pick(column_numpy(t["bytes"]), mask)
        kqd_all = pick(column_numpy(t["queue_depth"]), mask)
        _check_queue_depths(seg, index, kqd_all)
        if "op" in const:
            op_code = None
            only_op = const["op"]
        else:
            op_code = pick(column_codes(t["op"], op_lookup, len(ops)), mask)
            only_op = None
        if self.plan.group_col == "dev":
            if "dev" in const:
                # a zero-stride view: one device, no per-row array needed
                gid = np.broadcast_to(
                    np.int64(self.plan.dev_lookup.get(const["dev"], self.plan.null_group)), (c.events,)
                )
            else:
                gid = pick(column_codes(t["dev"], self.plan.dev_lookup, self.plan.null_group), mask)
        else:
            gid = np.searchsorted(self.plan.pid_lookup, pick(column_numpy(t["pid"]), mask).astype(np.int64))
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
            is_read = op_mask("read") if self.plan.layer == "file" else None
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
            tbin = complete - self.plan.t0
            tbin //= self.plan.bin_ns
            c.bytes_read = c.bytes_written = 0
            c.tl_read = c.tl_write = None
            for kind, m in (("read", is_read), ("write", is_write)):
                if m is not None and not m.any():
                    continue
                b = pick(nbytes, m)
                tl = np.bincount(pick(tbin, m), weights=b, minlength=self.plan.nbins)
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
            qd_ops = [op_lookup[op] for op in tr.QD_OPS[self.plan.layer]]
            if len(qd_ops) < len(ops):
                counted = np.isin(op_code, qd_ops)
        elif only_op not in tr.QD_OPS[self.plan.layer]:
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
        if self.plan.layer == "file":
            c.processes = self._process_stats(seg, index, t, mask, gid, is_read, nbytes, kqd_all)
        return c

    def _count_native(
        self,
        nat: Any,
        c: Chunk,
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
        counted = [op in tr.QD_OPS[self.plan.layer] for op in names]
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
            self.plan.t0,
            self.plan.bin_ns,
            self.plan.nbins,
            self.latency_raw,
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
    ) -> ProcessChunk:
        """File layer: per process reads, bytes, distinct files, QD at reads, names."""
        n_groups = len(self.plan.group_names)
        g = gid if is_read is None else gid[is_read]
        p = ProcessChunk()
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
        # names: the comm of each process's first row in the trace. Row groups decode in
        # parallel, so a process named from a later row group is named again from an
        # earlier one (the name then does not depend on which thread finished first).
        present = np.flatnonzero(np.bincount(gid, minlength=n_groups))
        here = (str(seg.path), index)
        with self._lock:
            unnamed = [int(k) for k in present if self._comm_at.get(int(k), here) >= here]
        if unnamed:
            cols = t["comm"] if "comm" in t.column_names else tr.read_row_group(seg, index, ["comm"])["comm"]
            comms = cols if mask is None else cols.filter(pa.array(mask))
            first = np.full(n_groups, -1, np.int64)
            first[gid[::-1]] = np.arange(gid.size - 1, -1, -1)  # the last write wins
            with self._lock:
                for k in unnamed:
                    if first[k] >= 0 and self._comm_at.get(k, here) >= here:
                        self.comms[k] = comms[int(first[k])].as_py()
                        self._comm_at[k] = here
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


def check_statistics(seg: tr.Segment, index: int, t: pa.Table, lo: int, hi: int) -> None:
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


def equal_neighbours(per_group: dict[int, np.ndarray]) -> bool:
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


def _check_queue_depths(seg: tr.Segment, index: int, qd: np.ndarray) -> None:
    """Refuses a row group whose queue_depth holds more than MAX_QUEUE_DEPTH, in one line."""
    if qd.size and int(qd.max()) > MAX_QUEUE_DEPTH:
        row = int(np.argmax(qd > MAX_QUEUE_DEPTH))
        msg = (
            f"{seg.path}: row group {index}: queue_depth {int(qd[row])} is more requests in flight "
            f"than a device or process holds (at most {MAX_QUEUE_DEPTH}; corrupt file)"
        )
        raise TraceError(msg)
