"""Queue depth from issue/complete intervals: a vectorized sweep that streams.

Each request contributes two events, +1 at ``issue_ns`` and -1 at ``complete_ns``. Both
are encoded in one int64 *event key* so that one numpy sort orders them exactly as the
sweep needs::

    key = 4 * t + code      code 0: completion of a request with latency > 0
                                 1: issue
                                 2: completion of a zero-latency request

At equal timestamps a completion therefore counts before an issue (back-to-back
requests are QD 1, not 2), while a zero-latency request still counts itself. After
sorting, ``cumsum(+1/-1)`` is the number in flight after each event: its values at
issues are the per-issue queue depths, and weighting each value by the time to the next
event gives the time-weighted histogram.

Streaming. The trace is fed one row group at a time, rows not sorted. With each chunk
the caller passes a *watermark* W: a lower bound of every ``issue_ns`` still to come
(the suffix minimum of the Parquet row-group statistics). Events before W can no longer
be preceded by anything, so they are swept and dropped; later ones wait in a small
sorted buffer (:meth:`QueueDepthSweep.feed`, sequential) or are handed to the row group
that owns them (:class:`TailExchange`, the analyzer's worker threads). Memory is bounded
by the trace's disorder, not its length: a trace in near-completion order (as the tracer
writes) carries a few thousand events from one row group to the next.

Parallel. The expensive part of a slice (sort, cumulative sum, histograms) does not
need to know how many requests were in flight when the slice starts: :func:`summarize`
computes it relative to an unknown carry c (levels shifted by the slice's minimum), in a
worker thread; :meth:`QueueDepthSweep.apply` then adds the shifted histograms in trace
order, which is cheap. Busy periods can only start or end where the count reaches 0,
i.e. at the slice's minimum when c equals minus that minimum: the worker records those
candidates and ``apply`` keeps them only then.

Groups (a device, a process) are swept independently: a small group id is put in the
key's high bits, so one sort still serves all groups.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field

import numpy as np

from trainio_analysis import kernels
from trainio_analysis.analyze.sketch import QuantileSketch

CODE_COMPLETE = 0
CODE_ISSUE = 1
CODE_COMPLETE_ZERO = 2
_LITTLE = sys.byteorder == "little"


def event_keys(issue: np.ndarray, complete: np.ndarray, offset: int = 0) -> np.ndarray:
    """Unsorted event keys of requests; times are ``issue - offset`` etc. (non-negative)."""
    n = issue.size
    keys = np.empty(2 * n, np.int64)
    np.multiply(issue, 4, out=keys[:n])
    keys[:n] += CODE_ISSUE - 4 * offset
    np.multiply(complete, 4, out=keys[n:])
    keys[n:] -= 4 * offset
    zero = complete == issue
    if zero.any():
        keys[n:][zero] += CODE_COMPLETE_ZERO
    return keys


def _sort_keys(keys: np.ndarray) -> None:
    """Sort non-negative int64 keys in place: as uint64 (same order), which numpy sorts
    about 1.5x faster here than int64."""
    keys.view(np.uint64).sort()


def sorted_event_keys(issue: np.ndarray, complete: np.ndarray, offset: int = 0) -> np.ndarray:
    """:func:`event_keys` of one group's requests, sorted."""
    nat = kernels.native()
    if nat is not None:
        return nat.event_keys_sorted(
            np.ascontiguousarray(issue, np.int64), np.ascontiguousarray(complete, np.int64), offset
        )
    keys = event_keys(issue, complete, offset)
    _sort_keys(keys)
    return keys


def merge_sorted(big: np.ndarray, pieces: list[np.ndarray]) -> np.ndarray:
    """Merge a few small sorted arrays into a big sorted one with one copy of it."""
    if not pieces:
        return big
    small = np.sort(np.concatenate(pieces)) if len(pieces) > 1 else pieces[0]
    if big.size == 0:
        return small
    return np.insert(big, np.searchsorted(big, small, side="right"), small)


def _shifted(hist: np.ndarray, shift: int, dtype: type) -> np.ndarray:
    if shift == 0:
        return hist.astype(dtype, copy=False)
    out = np.zeros(hist.size + shift, dtype)
    out[shift:] = hist
    return out


def _grow_add(acc: np.ndarray, add: np.ndarray) -> np.ndarray:
    if add.size > acc.size:
        acc = np.concatenate((acc, np.zeros(add.size - acc.size, dtype=acc.dtype)))
    acc[: add.size] += add
    return acc


def _issues_per_level(level_counts: np.ndarray, carry_in: int, carry_out: int) -> np.ndarray:
    """Issues that raised the count to k, from how many events left the count at k.

    Counting ``q[is_issue]`` needs a gather over every event; this needs one bincount.
    With up(k) the issues that moved k-1 -> k and down(k) the completions k -> k-1,
    events that left the count at k are E(k) = up(k) + down(k+1), and over the chunk
    up(k) - down(k) = d(k) is +1 for carry_in < k <= carry_out, -1 for
    carry_out < k <= carry_in, else 0. Hence up(k) = E(k) - up(k+1) + d(k+1), solved
    from the top level down.
    """
    top = max(level_counts.size, carry_in + 2, carry_out + 2)
    counts = np.zeros(top + 1, np.int64)
    counts[: level_counts.size] = level_counts
    up = np.zeros(top + 1, np.int64)
    lo, hi = min(carry_in, carry_out), max(carry_in, carry_out)
    sign = 1 if carry_out > carry_in else -1
    nxt = 0
    for k in range(top - 1, 0, -1):
        d_next = sign if lo < k + 1 <= hi else 0
        nxt = int(counts[k]) - nxt + d_next
        up[k] = nxt
    return up[:top]


@dataclass
class ChunkSummary:
    """One group's sorted, ready slice of events, swept relative to an unknown carry."""

    t_first: int
    t_last: int
    q_min: int  # lowest running count reached (relative to carry 0)
    q_last: int  # running count after the last event (relative to carry 0)
    level_counts: np.ndarray  # events that left the count at q_min + k
    time_hist: np.ndarray  # ns spent at q_min + k between the slice's first and last event
    ends: np.ndarray  # times the count reached q_min: busy ends if that is 0
    starts: np.ndarray  # issues that raised it to q_min + 1: busy starts if q_min is 0


def summarize(keys: np.ndarray) -> ChunkSummary | None:
    """Sweep a sorted slice of event keys (None when empty); see the module docstring."""
    if keys.size == 0:
        return None
    keys = np.ascontiguousarray(keys)
    nat = kernels.native()
    if nat is not None:
        return ChunkSummary(*nat.summarize(keys))
    t = keys >> 2
    # the code is in the lowest byte (little-endian): a strided byte view, no int64 temp
    low = keys.view(np.uint8)[:: keys.itemsize] if _LITTLE else (keys & 3).astype(np.uint8)
    is_issue = (low & np.uint8(3)) == CODE_ISSUE
    step = is_issue.view(np.int8) * np.int8(2)
    step -= np.int8(1)
    q = np.cumsum(step, dtype=np.intp)  # intp: bincount would convert anything else
    q_min = int(q.min())
    q_last = int(q[-1])
    if q_min:
        q -= q_min
    dt = np.empty(t.size - 1, np.float64)  # bincount wants float weights: cast once
    np.subtract(t[1:], t[:-1], out=dt, casting="unsafe")
    return ChunkSummary(
        t_first=int(t[0]),
        t_last=int(t[-1]),
        q_min=q_min,
        q_last=q_last,
        level_counts=np.bincount(q),
        time_hist=np.bincount(q[:-1], weights=dt),
        ends=t[q == 0],
        starts=t[is_issue & (q == 1)],
    )


class Int64Series:
    """An append-only int64 sequence stored as numpy chunks (compact, unlike a list)."""

    def __init__(self) -> None:
        self._parts: list[np.ndarray] = []
        self._n = 0

    def extend(self, values: np.ndarray) -> None:
        if values.size:
            self._parts.append(np.asarray(values, np.int64))
            self._n += int(values.size)

    def append(self, value: int) -> None:
        self.extend(np.array([value], np.int64))

    def __len__(self) -> int:
        return self._n

    def array(self) -> np.ndarray:
        if len(self._parts) != 1:
            self._parts = [np.concatenate(self._parts) if self._parts else np.zeros(0, np.int64)]
        return self._parts[0]


@dataclass
class GroupState:
    """Running state and results of one group's sweep (times relative to the base)."""

    hist_issue: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    hist_time: np.ndarray = field(default_factory=lambda: np.zeros(1, np.float64))
    carry: int = 0  # requests in flight after the last swept event
    last_t: int = 0  # time of the last swept event (starts at the window start)
    last_end: int | None = None  # when the last busy period ended
    pending: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # bursts: busy periods merged across idle gaps shorter than the threshold
    burst_starts: Int64Series = field(default_factory=Int64Series)
    burst_ends: Int64Series = field(default_factory=Int64Series)
    burst_gaps: Int64Series = field(default_factory=Int64Series)  # idle gap before each burst but the first
    # only its histogram is reported: a small exact part keeps many groups cheap
    idle_gaps: QuantileSketch = field(default_factory=lambda: QuantileSketch(exact_limit=4096))
    busy_periods: int = 0

    @property
    def busy_ns(self) -> float:
        return float(self.hist_time[1:].sum())


class QueueDepthSweep:
    """Streaming per-group sweep; see the module docstring.

    Parameters
    ----------
    window_end
        End of the time window (relative), so the idle tail after the last completion
        counts in ``hist_time[0]``. The window starts at 0.
    burst_gap
        Idle gaps of at least this many ns separate bursts.
    key_bits
        Bits the time part of a key needs (``(4 * window_end).bit_length()``).

    Example
    -------
    >>> s = QueueDepthSweep(window_end=30, burst_gap=5)
    >>> s.feed(np.array([0, 0]), np.array([0, 10]), np.array([20, 30]), None)
    >>> s.groups[0].hist_issue.tolist(), s.groups[0].hist_time.tolist()
    ([0, 1, 1], [0.0, 20.0, 10.0])
    """

    def __init__(self, *, window_end: int, burst_gap: int) -> None:
        self.window_end = int(window_end)
        self.burst_gap = int(burst_gap)
        self.key_bits = max(2, (4 * self.window_end + 3).bit_length())
        self.group_bits = 62 - self.key_bits
        self.groups: dict[int, GroupState] = {}
        self.finished = False

    def group(self, gid: int) -> GroupState:
        state = self.groups.get(gid)
        if state is None:
            state = self.groups[gid] = GroupState()
        return state

    # ------------------------------------------------------------------ feeding

    def feed(
        self,
        gid: np.ndarray,
        issue: np.ndarray,
        complete: np.ndarray,
        watermark: int | None,
        *,
        presorted: np.ndarray | None = None,
    ) -> None:
        """Add a chunk of requests; sweep everything before ``watermark`` (None: all).

        ``presorted``: the chunk's sorted :func:`event_keys` when all rows are one group
        (lets a worker thread do the sort).
        """
        if presorted is not None and gid.size:
            per_group = {int(gid[0]): presorted}
        else:
            per_group = self.split(gid, issue, complete)
        for g, keys in per_group.items():
            state = self.group(g)
            if state.pending.size:
                # two sorted runs: the stable sort (timsort) merges them in linear time
                keys = np.sort(np.concatenate((state.pending, keys)), kind="stable")
            state.pending = keys
        self.advance(watermark)

    def advance(self, watermark: int | None) -> None:
        """Sweep what is buffered before ``watermark`` (None: everything)."""
        for state in self.groups.values():
            if watermark is None:
                ready, state.pending = state.pending, state.pending[:0]
            else:
                cut = int(np.searchsorted(state.pending, 4 * watermark, side="left"))
                ready, state.pending = state.pending[:cut], state.pending[cut:]
            if ready.size:
                self._sweep(state, ready)

    def split(self, gid: np.ndarray, issue: np.ndarray, complete: np.ndarray, offset: int = 0) -> dict[int, np.ndarray]:
        """Sorted event keys of each group in the chunk (times minus ``offset``)."""
        if gid.size == 0:
            return {}
        if gid.strides == (0,):  # a broadcast: one group, no need to scan it
            lo = hi = int(gid[0])
        else:
            lo, hi = int(gid.min()), int(gid.max())
        if lo == hi:
            return {lo: sorted_event_keys(issue, complete, offset)}
        present = np.flatnonzero(np.bincount(gid)) if lo >= 0 else np.unique(gid)
        if kernels.native() is not None and present.size <= 16:
            # a few groups: one selection pass each, then the native sort of each
            out = {}
            for g in present:
                sel = gid == g
                out[int(g)] = sorted_event_keys(issue[sel], complete[sel], offset)
            return out
        if hi < (1 << self.group_bits):
            g2 = np.concatenate((gid, gid)).astype(np.int64) << self.key_bits
            keys = event_keys(issue, complete, offset) | g2
            _sort_keys(keys)
            mask = (1 << self.key_bits) - 1
            present = np.flatnonzero(np.bincount(gid))  # ids are small: cheaper than unique
            bounds = np.searchsorted(keys, present.astype(np.int64) << self.key_bits)
            ends = np.append(bounds[1:], keys.size)
            return {int(g): keys[b:e] & mask for g, b, e in zip(present, bounds, ends, strict=True)}
        out = {}
        for g in np.unique(gid):
            sel = gid == g
            out[int(g)] = sorted_event_keys(issue[sel], complete[sel], offset)
        return out

    # ------------------------------------------------------------------ sweeping

    def _sweep(self, state: GroupState, keys: np.ndarray) -> None:
        summary = summarize(keys)
        if summary is not None:
            self._apply(state, summary)

    def apply(self, gid: int, summary: ChunkSummary | None) -> None:
        """Add one group's next slice (slices must come in time order)."""
        if summary is not None:
            self._apply(self.group(gid), summary)

    def _apply(self, state: GroupState, s: ChunkSummary) -> None:
        carry = state.carry
        shift = carry + s.q_min  # true count at the slice's lowest point
        if shift < 0:
            msg = "queue-depth sweep: slices applied out of order"
            raise AssertionError(msg)
        carry_out = carry + s.q_last
        levels = _shifted(s.level_counts, shift, np.int64)
        state.hist_issue = _grow_add(state.hist_issue, _issues_per_level(levels, carry, carry_out))
        state.hist_time = _grow_add(state.hist_time, _shifted(s.time_hist, shift, np.float64))
        # [last_t, t_first) at the carried count
        gap = np.zeros(carry + 1, np.float64)
        gap[carry] = float(s.t_first - state.last_t)
        state.hist_time = _grow_add(state.hist_time, gap)
        if shift == 0:
            self._bursts(state, s.starts, s.ends)
        state.carry = carry_out
        state.last_t = s.t_last

    def _bursts(self, state: GroupState, starts: np.ndarray, ends: np.ndarray) -> None:
        """Turn busy-period boundaries into idle gaps and bursts."""
        if starts.size:
            # busy periods alternate with idle ones: the end before start k is ends[k-1]
            # when idle on entry (the previous one from the state), else ends[k]
            if state.carry == 0:
                prev = np.concatenate(([-1 if state.last_end is None else state.last_end], ends))
            else:
                prev = ends
            prev = prev[: starts.size]
            gaps = starts - prev
            known = prev >= 0
            if state.last_end is None and state.carry == 0:
                known[0] = False
            state.idle_gaps.add(gaps[known])
            split = ~known | (gaps >= self.burst_gap)
            new_starts = starts[split]
            closing = prev[split & known]
            state.burst_ends.extend(closing)
            state.burst_gaps.extend(gaps[split & known])
            state.burst_starts.extend(new_starts)
            state.busy_periods += int(starts.size)
        if ends.size:
            state.last_end = int(ends[-1])

    # ------------------------------------------------------------------ finishing

    def finish(self) -> dict[int, GroupState]:
        """Close the window: idle tail into ``hist_time[0]``, last burst closed."""
        if self.finished:
            return self.groups
        self.advance(None)
        for state in self.groups.values():
            tail = max(self.window_end - state.last_t, 0)
            state.hist_time = _grow_add(state.hist_time, np.bincount([state.carry], weights=[float(tail)]))
            state.last_t = max(state.last_t, self.window_end)
            if len(state.burst_ends) < len(state.burst_starts) and state.last_end is not None:
                state.burst_ends.append(state.last_end)
        self.finished = True
        return self.groups


class TailExchange:
    """Hands chunk k's worker the events that earlier chunks left for it.

    Chunk k sweeps the events before its watermark W_k; the rest (its *tail*) belong to
    later chunks: chunk m takes the keys in [4 W_(m-1), 4 W_m) of every earlier tail, so
    the tails are partitioned. A worker publishes its tail before it takes, so it only
    ever waits for workers of earlier chunks, which never wait for it.
    """

    def __init__(self, watermarks: list[int | None]) -> None:
        self.watermarks = watermarks
        self._tails: dict[int, dict[int, np.ndarray]] = {}
        self._published = [threading.Event() for _ in watermarks]
        self._lock = threading.Lock()
        self._failed: set[int] = set()

    def bound(self, k: int) -> int | None:
        """Keys below this are chunk k's to sweep (None: all)."""
        w = self.watermarks[k]
        return None if w is None else 4 * w

    def split_own(
        self, k: int, per_group: dict[int, np.ndarray]
    ) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
        """(ready, tail) parts of chunk k's own sorted keys."""
        hi = self.bound(k)
        ready, tail = {}, {}
        for g, keys in per_group.items():
            cut = keys.size if hi is None else int(np.searchsorted(keys, hi, side="left"))
            ready[g] = keys[:cut]
            if cut < keys.size:
                tail[g] = keys[cut:]
        return ready, tail

    def publish(self, k: int, tail: dict[int, np.ndarray]) -> None:
        with self._lock:
            self._tails[k] = tail
        self._published[k].set()

    def fail(self, k: int) -> None:
        """Chunk k's worker failed: release whoever waits for it."""
        self._failed.add(k)
        self._published[k].set()

    def take(self, k: int) -> dict[int, list[np.ndarray]]:
        """The pieces of earlier chunks' tails that chunk k must sweep, per group."""
        lo = self.bound(k - 1) if k > 0 else None
        hi = self.bound(k)
        out: dict[int, list[np.ndarray]] = {}
        for j in range(k):
            self._published[j].wait()
            if j in self._failed:  # its own error reaches the caller first, in order
                msg = f"chunk {j} failed"
                raise RuntimeError(msg)
            with self._lock:
                tail = self._tails.get(j)
            if not tail:
                continue
            for g, keys in tail.items():
                a = 0 if lo is None else int(np.searchsorted(keys, lo, side="left"))
                b = keys.size if hi is None else int(np.searchsorted(keys, hi, side="left"))
                if b > a:
                    out.setdefault(g, []).append(keys[a:b])
        return out

    def release(self, k: int) -> None:
        """After chunk k is applied: forget tails that are entirely handed out."""
        hi = self.bound(k)
        with self._lock:
            for j in [j for j in self._tails if j <= k]:
                tail = self._tails[j]
                if hi is None or all(keys[-1] < hi for keys in tail.values()):
                    self._tails[j] = {}


def sweep_slices(exchange: TailExchange, k: int, per_group: dict[int, np.ndarray]) -> dict[int, ChunkSummary | None]:
    """Worker side of chunk k: publish its tail, take what earlier chunks left, summarize."""
    ready, tail = exchange.split_own(k, per_group)
    exchange.publish(k, tail)
    earlier = exchange.take(k)
    out: dict[int, ChunkSummary | None] = {}
    nat = kernels.native()
    for g in sorted(set(ready) | set(earlier)):
        own = ready.get(g, np.zeros(0, np.int64))
        pieces = earlier.get(g, [])
        if nat is not None and own.size + sum(p.size for p in pieces):
            # merged and swept in one native call
            small = merge_sorted(np.zeros(0, np.int64), pieces)
            keys, more = np.ascontiguousarray(own), np.ascontiguousarray(small)
            out[g] = ChunkSummary(*nat.summarize(keys, more))
        else:
            out[g] = summarize(merge_sorted(own, pieces))
    return out
