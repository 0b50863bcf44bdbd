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
sorted buffer. Memory is bounded by the trace's disorder, not its length: a trace in
near-completion order (as the tracer writes) keeps a buffer of a few thousand events.

Groups (a device, a process) are swept independently: a small group id is put in the
key's high bits, so one sort still serves all groups.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trainio_analysis.sketch import QuantileSketch

CODE_COMPLETE = 0
CODE_ISSUE = 1
CODE_COMPLETE_ZERO = 2


def event_keys(issue: np.ndarray, complete: np.ndarray) -> np.ndarray:
    """Unsorted event keys of requests (times relative to a base, non-negative)."""
    code_c = np.where(complete == issue, CODE_COMPLETE_ZERO, CODE_COMPLETE)
    return np.concatenate((issue * 4 + CODE_ISSUE, complete * 4 + code_c))


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
class GroupState:
    """Running state and results of one group's sweep (times relative to the base)."""

    hist_issue: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    hist_time: np.ndarray = field(default_factory=lambda: np.zeros(1, np.float64))
    carry: int = 0  # requests in flight after the last swept event
    last_t: int = 0  # time of the last swept event (starts at the window start)
    last_end: int | None = None  # when the last busy period ended
    pending: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # bursts: busy periods merged across idle gaps shorter than the threshold
    burst_starts: list[int] = field(default_factory=list)
    burst_ends: list[int] = field(default_factory=list)
    burst_gaps: list[int] = field(default_factory=list)  # idle gap before each burst but the first
    idle_gaps: QuantileSketch = field(default_factory=QuantileSketch)
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
            per_group = self._split(gid, issue, complete)
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

    def _split(
        self, gid: np.ndarray, issue: np.ndarray, complete: np.ndarray
    ) -> dict[int, np.ndarray]:
        """Sorted event keys of each group in the chunk."""
        if gid.size == 0:
            return {}
        lo, hi = int(gid.min()), int(gid.max())
        if lo == hi:
            keys = event_keys(issue, complete)
            keys.sort()
            return {lo: keys}
        if hi < (1 << self.group_bits):
            g2 = np.concatenate((gid, gid)).astype(np.int64) << self.key_bits
            keys = event_keys(issue, complete) | g2
            keys.sort()
            mask = (1 << self.key_bits) - 1
            present = np.unique(gid)
            bounds = np.searchsorted(keys, present.astype(np.int64) << self.key_bits)
            ends = np.append(bounds[1:], keys.size)
            return {
                int(g): keys[b:e] & mask for g, b, e in zip(present, bounds, ends, strict=True)
            }
        out = {}
        for g in np.unique(gid):
            sel = gid == g
            keys = event_keys(issue[sel], complete[sel])
            keys.sort()
            out[int(g)] = keys
        return out

    # ------------------------------------------------------------------ sweeping

    def _sweep(self, state: GroupState, keys: np.ndarray) -> None:
        t = keys >> 2
        is_issue = (keys & 3) == CODE_ISSUE
        step = is_issue.view(np.int8) * np.int8(2) - np.int8(1)
        q = np.cumsum(step, dtype=np.int32)  # in flight after each event
        if state.carry:
            q += state.carry
        carry_out = int(q[-1])
        level_counts = np.bincount(q)
        state.hist_issue = _grow_add(
            state.hist_issue, _issues_per_level(level_counts, state.carry, carry_out)
        )
        # time-weighted: [last_t, t0) at carry, then [t_i, t_i+1) at q_i
        state.hist_time = _grow_add(state.hist_time, np.bincount(q[:-1], weights=np.diff(t)))
        state.hist_time = _grow_add(
            state.hist_time,
            np.bincount([state.carry], weights=[float(t[0] - state.last_t)]),
        )
        # an issue that brings the count to 1 starts a busy period; reaching 0 ends one
        starts = t[is_issue & (q == 1)]
        ends = t[q == 0]
        self._bursts(state, starts, ends)
        state.carry = carry_out
        state.last_t = int(t[-1])

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
            state.burst_ends.extend(closing.tolist())
            state.burst_gaps.extend(gaps[split & known].tolist())
            state.burst_starts.extend(new_starts.tolist())
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
            state.hist_time = _grow_add(
                state.hist_time, np.bincount([state.carry], weights=[float(tail)])
            )
            state.last_t = max(state.last_t, self.window_end)
            if len(state.burst_ends) < len(state.burst_starts) and state.last_end is not None:
                state.burst_ends.append(state.last_end)
        self.finished = True
        return self.groups
