"""Characterize one layer of a trace: throughput, queue depth, sizes, latency, bursts.

One streaming pass over the row groups does everything that grows with the trace
(counting, the throughput timeline, size and latency distributions, the queue-depth
sweep of :mod:`trainio_analysis.analyze.qd_sweep`); a thread pool decodes and pre-sorts the next
row groups while the main thread sweeps the current one, so both cores work and at most
``2 * workers`` row groups are in memory. The small per-process table of the file layer
is a polars streaming group-by.

The pass has three parts, one module each: the plan (which row groups and columns are
read, the window and bins: :mod:`~trainio_analysis.analyze.plan`), the decoding of one
row group into its contribution (:mod:`~trainio_analysis.analyze.decode`, on the worker
threads) and the assembly of the result (:mod:`~trainio_analysis.analyze.result`); this
module runs the pass that joins them.

Example
-------
>>> result = analyze("traces/sample")  # doctest: +SKIP
>>> result["qd_hist_issue"]  # doctest: +SKIP
{'1': 0.5, '2': 0.5}
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from trainio_analysis import kernels
from trainio_analysis import trace as tr
from trainio_analysis.analyze.decode import Chunk, Decoder, ProcessTotals
from trainio_analysis.analyze.objects import object_requests
from trainio_analysis.analyze.plan import Plan, Selection
from trainio_analysis.analyze.qd_sweep import GroupState, QueueDepthSweep, TailExchange
from trainio_analysis.analyze.result import Totals, push_model_rows, result
from trainio_analysis.analyze.sketch import QuantileSketch
from trainio_analysis.errors import SelectionError, TraceError

DEFAULT_BURST_GAP_MS = 10.0
# automatic bin: the pass sums its fine bins into the smallest 1/2/5 x 10^k bin that
# leaves at most AUTO_BINS bins over the active span
AUTO_BINS = 300


class _Analyzer:
    """The streaming pass: the plan's row groups decoded on worker threads, summed and
    swept in order on the main thread."""

    def __init__(
        self,
        trace: tr.Trace,
        sel: Selection,
        bin_s: float | None,
        burst_gap_ms: float,
        workers: int,
        with_model: bool = True,
        step_gap_ms: float | None = None,
    ) -> None:
        self.workers = max(1, workers)
        self.plan = Plan(trace, sel, bin_s, self.workers)
        self.burst_gap_ns = int(round(burst_gap_ms * 1e6))
        self.burst_gap_ms = burst_gap_ms
        self.with_model = with_model
        self.step_gap_ms = step_gap_ms
        # the job model fed from this pass's decoding: the trace's rows, or a set's
        # members' rows each on its own clock (one ModelRows per member, pushed by the pass)
        nat = kernels.module()
        self.model_rows: Any = None
        if with_model and "file" in self.plan.layers_present and nat is not None:
            if trace.members is None:
                self.model_rows = nat.ModelRows(str(trace.path))
            else:
                self.model_rows = [nat.ModelRows(str(m.path)) for m in trace.members]
        self.decoder = Decoder(self.plan, model_rows=self.model_rows is not None and trace.members is None)
        #: a trace set's members, each with its own analysis of the selection (None when
        #: nothing of it is on that host), run in the set's pass (:meth:`with_hosts`)
        self.hosts: list[tuple[tr.Member, _Analyzer | None]] | None = None
        #: after the pass: each member's result, None where it had no analysis
        self.host_results: list[dict[str, Any] | None] = []

    def with_hosts(self) -> _Analyzer:
        """A trace set's analysis, with each member analyzed alone in the same pass (the
        set's layer, the selection's device when it is on that host, its pid)."""
        trace, sel = self.plan.trace, self.plan.sel
        self.hosts = []
        for m, member in zip(trace.members or (), trace.member_traces, strict=True):
            host_analyzer = None
            dev = sel.dev
            if dev is not None and "/" in dev:
                host, _, dev = dev.partition("/")
                if host != m.host:
                    self.hosts.append((m, None))
                    continue
            try:
                host_sel = Selection(layer=self.plan.layer, dev=dev, pid=sel.pid)
                host_analyzer = _Analyzer(member, host_sel, None, self.burst_gap_ms, self.workers, with_model=False)
            except SelectionError:
                pass  # nothing of the selection on this host
            self.hosts.append((m, host_analyzer))
        return self

    def run(self) -> dict[str, Any]:
        return _run_pass([self])[0]

    def start(self) -> None:
        """The pass's state: the sweeps and what the chunks are summed into."""
        plan = self.plan
        self.sweep = QueueDepthSweep(window_end=plan.window, burst_gap=self.burst_gap_ns)
        self.channels = [(self.sweep, TailExchange(plan.watermarks), False)]
        self.union = None
        if len(plan.group_names) > 1:
            self.union = QueueDepthSweep(window_end=plan.window, burst_gap=self.burst_gap_ns)
            self.channels.append((self.union, TailExchange(plan.watermarks), True))
        self.acc = Chunk(latency=None)
        self.latency = QuantileSketch()
        self.size_counts = np.zeros(65, np.int64)
        self.tl_read = np.zeros(plan.nbins, np.float64)
        self.tl_write = np.zeros(plan.nbins, np.float64)
        self.tl_inflight = np.zeros(plan.nbins, np.float64)
        self.kernel_qd: dict[int, np.ndarray] = {}
        self.procs = ProcessTotals(len(plan.group_names))

    def add(self, c: Chunk, k: int) -> None:
        """Main thread: chunk ``k`` (in order) summed and swept."""
        acc = self.acc
        if c.model_rows is not None:
            push_model_rows(self.model_rows, c.model_rows)
            c.model_rows = None
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
                self.latency.add_counted(*c.latency_stats, c.latency_buckets, c.latency)
                self.decoder.latency_raw = self.latency.exact
            else:
                self.latency.add(c.latency, buckets=c.latency_buckets)
            self.size_counts += c.size_counts
            if c.tl_read is not None:
                self.tl_read += c.tl_read
            if c.tl_write is not None:
                self.tl_write += c.tl_write
        if c.tl_inflight is not None:
            self.tl_inflight += c.tl_inflight
            for g, h in c.kernel_qd.items():
                prev = self.kernel_qd.get(g, np.zeros(0, np.int64))
                if prev.size < h.size:
                    prev = np.concatenate((prev, np.zeros(h.size - prev.size, np.int64)))
                prev[: h.size] += h
                self.kernel_qd[g] = prev
        if c.processes is not None:
            self.procs.add(c.processes)
        for (ch_sweep, exchange, _), summaries in zip(self.channels, c.summaries, strict=True):
            for g, summary in summaries.items():
                ch_sweep.apply(g, summary)
            exchange.release(k)

    def finish(self) -> dict[str, Any]:
        """The result, once every chunk is added."""
        plan, acc = self.plan, self.acc
        groups = self.sweep.finish()
        union_state: GroupState | None = None
        if self.union is not None:
            union_state = self.union.finish().get(0)
        elif groups:
            union_state = groups[0]
        if union_state is None:  # selected rows, none counted in a queue (only open/close)
            union_state = GroupState(hist_time=np.array([float(plan.window)]))
        tl_read, tl_write, tl_inflight = self.tl_read, self.tl_write, self.tl_inflight
        if plan.bin_auto:
            tl_read, tl_write, tl_inflight = self._coarsen(acc, tl_read, tl_write, tl_inflight)
        totals = Totals(
            acc,
            self.latency,
            self.size_counts,
            tl_read,
            tl_write,
            tl_inflight,
            self.kernel_qd,
            groups,
            union_state,
            self.procs,
            self.decoder.comms,
        )
        return result(
            plan,
            totals,
            burst_gap_ms=self.burst_gap_ms,
            with_model=self.with_model,
            step_gap_ms=self.step_gap_ms,
            model_rows=self.model_rows,
        )

    def _coarsen(self, acc: Chunk, *timelines: np.ndarray) -> list[np.ndarray]:
        """Sum the fine bins into the smallest 1/2/5 x 10^k multiple of them that leaves
        at most AUTO_BINS bins over the active span (the window when nothing moved)."""
        plan = self.plan
        span = plan.window
        if acc.data_first_ns is not None and acc.data_last_ns is not None:
            span = max(acc.data_last_ns - acc.data_first_ns, 1)
        fine = plan.bin_ns
        factor = 1
        steps = (1, 2, 5)
        k = 0
        while span / (fine * factor) > AUTO_BINS:
            k += 1
            factor = steps[k % 3] * 10 ** (k // 3)
        if factor == 1:
            return list(timelines)
        plan.bin_ns = fine * factor
        plan.bin_s = plan.bin_ns / 1e9
        nbins = plan.nbins
        plan.nbins = -(-nbins // factor)
        out = []
        for tl in timelines:
            padded = np.zeros(plan.nbins * factor, np.float64)
            padded[:nbins] = tl
            out.append(padded.reshape(plan.nbins, factor).sum(axis=1))
        return out


def _run_pass(analyzers: list[_Analyzer]) -> list[dict[str, Any]]:
    """One pass over the trace's row groups for one or more analyses of it (their plans
    list the same units): each row group is read once, on a worker thread, and every
    analysis decodes its rows from that read; the chunks are added in order. In a trace
    set the same read also feeds each member's own analysis (``hosts``, the member's rows
    on its own clock) and each member's job-model rows."""
    first = analyzers[0]
    units = [(str(u[0].path), u[1]) for u in first.plan.units]
    assert all([(str(u[0].path), u[1]) for u in a.plan.units] == units for a in analyzers)
    workers = first.workers
    is_set = first.plan.trace.members is not None
    consumers = _consumers(analyzers, units)
    # a set's job models (one per analysis that builds one), each a ModelRows per member
    models = [a.model_rows for a in analyzers if is_set and a.model_rows is not None]
    member_of = _member_of(first.plan) if is_set else []
    for a in analyzers:
        a.start()
        for _, h in a.hosts or ():
            if h is not None:
                h.start()
    shared = len(analyzers) > 1 or is_set

    def work(k: int) -> tuple[list[Chunk], pa.Table | None]:
        chunks: list[Chunk] = []
        try:
            table = own = None
            if shared:
                seg, index = first.plan.units[k][:2]
                if is_set:
                    own, table = tr.read_member_row_group(seg, index, tr.segment_columns(seg))
                else:
                    table = tr.read_row_group(seg, index, tr.segment_columns(seg))
            for a, ka, on_own_clock in consumers[k]:
                chunks.append(a.decoder.task(ka, a.channels, own if on_own_clock else table))
            rows = tr.model_rows(own) if models and own is not None else None
        except BaseException:
            for a, ka, _ in consumers[k][len(chunks) :]:  # release whoever waits for this chunk
                for _, exchange, _ in a.channels:
                    exchange.fail(ka)
            raise
        return chunks, rows

    pool = ThreadPoolExecutor(max_workers=workers)
    inflight: deque[Future[tuple[list[Chunk], pa.Table | None]]] = deque()
    todo = iter(range(len(units)))
    try:
        for _ in range(2 * workers):
            k = next(todo, None)
            if k is not None:
                inflight.append(pool.submit(work, k))
        k_done = 0
        while inflight:
            chunks, rows = inflight.popleft().result()
            nxt = next(todo, None)
            if nxt is not None:
                inflight.append(pool.submit(work, nxt))
            for (a, ka, _), c in zip(consumers[k_done], chunks, strict=True):
                a.add(c, ka)
            for per_member in models if rows is not None else ():
                push_model_rows(per_member[member_of[k_done]], rows)
            k_done += 1
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    for a in analyzers:
        a.host_results = [None if h is None else h.finish() for _, h in a.hosts or ()]
    return [a.finish() for a in analyzers]


def _consumers(analyzers: list[_Analyzer], units: list[tuple[str, int]]) -> list[list[tuple[_Analyzer, int, bool]]]:
    """Per unit of the pass, who decodes it: (analysis, the unit's index in its plan, whether
    it takes the member's own rows). A set member's units are, in order, the set's units of
    that member (the set's segments are its members', member after member)."""
    out: list[list[tuple[_Analyzer, int, bool]]] = [[(a, k, False) for a in analyzers] for k in range(len(units))]
    for a in analyzers:
        for m, h in a.hosts or ():
            if h is None:
                continue
            own = [(str(u[0].path), u[1]) for u in h.plan.units]
            own_set = set(own)
            mine = [k for k, u in enumerate(units) if u in own_set]
            assert [units[k] for k in mine] == own, m.host
            for kh, k in enumerate(mine):
                out[k].append((h, kh, True))
    return out


def _member_of(plan: Plan) -> list[int]:
    """Per unit of a trace set's plan, the index of the member it belongs to."""
    index = {m.host: j for j, m in enumerate(plan.trace.members or ())}
    return [index[u[0].host] for u in plan.units]


def _per_host(analyzer: _Analyzer, job: dict[str, Any]) -> list[dict[str, Any]]:
    """Each host's figures in a trace set's analysis: its member's own analysis from the
    set's pass (:meth:`_Analyzer.with_hosts`), placed on the job's clock; its GPUs are the
    job model's GPUs on that host."""
    gpus: dict[str, int] = {}
    for g in (job.get("job_model") or {}).get("gpus", []):
        gpus[g.get("host")] = gpus.get(g.get("host"), 0) + 1
    out = []
    for (m, _), r in zip(analyzer.hosts or (), analyzer.host_results, strict=True):
        entry: dict[str, Any] = {
            "host": m.host,
            "path": str(m.path),
            "clock_offset_ns": m.clock_offset_ns,
            "shift_ns": m.shift_ns,
            "gpus": gpus.get(m.host, 0),
            "complete": m.complete,
        }
        if r is None:
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


def load_trace(path: str | os.PathLike[str] | tr.Trace) -> tr.Trace:
    """The trace at ``path`` opened once (:class:`~trainio_analysis.trace.Trace`), for a
    command to pass to :func:`analyze` and the rest; a Trace is returned as it is."""
    with _unreadable(path.path if isinstance(path, tr.Trace) else path):
        return tr.Trace.of(path)


@contextmanager
def _unreadable(path: str | os.PathLike[str]) -> Iterator[None]:
    """Every read goes through the trace package, which names the file; this is the net."""
    try:
        yield
    except (pa.ArrowException, pl.exceptions.PolarsError) as exc:
        msg = f"{path}: unreadable ({tr.first_line(exc)})"
        raise TraceError(msg) from None


def analyze(
    path: str | os.PathLike[str] | tr.Trace,
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
    path
        The trace's path, or the trace opened already (:func:`load_trace`): a command
        that reads a trace more than once opens it once.
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
        Infer the job model (``job_model``, ``steps``, each process's GPU); a caller
        that uses none of them (report at another layer than the file layer) skips
        building it.
    """
    return analyze_with_file_layer(
        path,
        layer=layer,
        dev=dev,
        pid=pid,
        bin_s=bin_s,
        burst_gap_ms=burst_gap_ms,
        workers=workers,
        with_model=with_model,
        step_gap_ms=step_gap_ms,
        file_layer=False,
    )[0]


def analyze_with_file_layer(
    path: str | os.PathLike[str] | tr.Trace,
    *,
    layer: str | None = None,
    dev: str | None = None,
    pid: int | None = None,
    bin_s: float | None = None,
    burst_gap_ms: float = DEFAULT_BURST_GAP_MS,
    workers: int = 2,
    with_model: bool = True,
    step_gap_ms: float | None = None,
    file_layer: bool = True,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """:func:`analyze` of ``layer`` and, in the same pass over the trace (each row group
    read once), of its file layer with the job model, as a report shows them.

    The second result is None unless ``file_layer``, or when the trace has no file layer
    or none of its file rows is selected (``dev``, ``pid``).
    """
    sel = Selection(layer=layer, dev=dev, pid=pid)
    file_sel = Selection(layer="file", dev=dev, pid=pid)
    trace = load_trace(path)
    with _unreadable(trace.path):
        analyzers = [_Analyzer(trace, sel, bin_s, burst_gap_ms, workers, with_model, step_gap_ms)]
        if file_layer and "file" in analyzers[0].plan.layers_present:
            try:
                analyzers.append(_Analyzer(trace, file_sel, bin_s, burst_gap_ms, workers))
            except SelectionError:
                pass  # no file row selected: no file-layer analysis
        if trace.members is not None:
            for a in analyzers:
                a.with_hosts()
        results = _run_pass(analyzers)
        out = [_complete(a, r) for a, r in zip(analyzers, results, strict=True)]
    return out[0], (out[1] if len(out) > 1 else None)


def _complete(analyzer: _Analyzer, out: dict[str, Any]) -> dict[str, Any]:
    """A pass's result with what it does not compute: each host's figures in a trace set,
    the object requests of a trace with an object layer."""
    trace = analyzer.plan.trace
    if trace.members is not None:
        out["per_host"] = _per_host(analyzer, out)
    elif "object" in out["layers_present"]:
        out["object_requests"] = object_requests(trace)
    return out
