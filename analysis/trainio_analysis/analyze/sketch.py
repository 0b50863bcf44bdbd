"""Bounded-memory distributions: quantiles of latencies/gaps and power-of-two size buckets.

:class:`QuantileSketch` keeps raw values while there are at most ``exact_limit`` of
them, so small traces (and tests) get exact numpy percentiles; past that it folds them
into a log-bucketed histogram (128 buckets per power of two, so a reported quantile is
within 0.4 % of the true one) whose size does not grow with the trace.
"""

from __future__ import annotations

import numpy as np

SUB_BITS = 7
SUB = 1 << SUB_BITS
N_BUCKETS = 64 * SUB + 1  # bucket 0 holds the value 0


def log_bucket(values: np.ndarray) -> np.ndarray:
    """Bucket index of non-negative integers: 0 for 0, else octave*SUB + sub-bucket + 1.

    Read straight from the float64 bits: exponent and the top SUB_BITS of the mantissa
    (0.0 has all bits 0 and lands below bucket 1: clipped to 0).
    """
    bits = values.astype(np.float64).view(np.int64)
    bits >>= 52 - SUB_BITS
    bits -= (1023 << SUB_BITS) - 1
    np.maximum(bits, 0, out=bits)
    return bits


def bucket_bounds(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[low, high) of log buckets (both 0 for bucket 0)."""
    i = idx - 1
    octave = i // SUB
    sub = i % SUB
    low = np.ldexp(1.0 + sub / SUB, octave)
    high = np.ldexp(1.0 + (sub + 1) / SUB, octave)
    zero = idx == 0
    return np.where(zero, 0.0, low), np.where(zero, 0.0, high)


class QuantileSketch:
    """Quantiles of a stream of non-negative integers in bounded memory.

    Example
    -------
    >>> s = QuantileSketch()
    >>> s.add(np.array([10, 20, 30, 40]))
    >>> s.quantile(0.5), s.max, s.count
    (25.0, 40, 4)
    """

    def __init__(self, *, exact_limit: int = 1 << 20) -> None:
        self.exact_limit = exact_limit
        self._raw: list[np.ndarray] = []
        self._raw_n = 0
        self._hist: np.ndarray | None = None
        self.count = 0
        self.max = 0
        self.min = 0
        self.sum = 0.0

    def add(self, values: np.ndarray, *, buckets: np.ndarray | None = None) -> None:
        """Add values; ``buckets`` (their log-bucket counts) saves the work when folded."""
        if values.size == 0:
            return
        values = np.asarray(values, dtype=np.int64)
        lo, hi = int(values.min()), int(values.max())
        self._add(int(values.size), lo, hi, float(values.sum(dtype=np.float64)), buckets, values)

    def add_counted(
        self,
        count: int,
        lo: int,
        hi: int,
        total: int | float,
        buckets: np.ndarray,
        values: np.ndarray | None,
    ) -> None:
        """Add values already summarized: their count, min, max, sum and log-bucket counts.

        ``values`` (the values themselves) may be None only once :attr:`exact` is False.
        """
        if count == 0:
            return
        if self._hist is None and values is None:
            msg = "QuantileSketch.add_counted: an exact sketch needs the values"
            raise ValueError(msg)
        self._add(int(count), int(lo), int(hi), float(total), buckets, values)

    def _add(
        self,
        count: int,
        lo: int,
        hi: int,
        total: float,
        buckets: np.ndarray | None,
        values: np.ndarray | None,
    ) -> None:
        self.min = lo if self.count == 0 else min(self.min, lo)
        self.max = hi if self.count == 0 else max(self.max, hi)
        self.count += count
        self.sum += total
        if self._hist is None:
            assert values is not None
            self._raw.append(np.array(values, dtype=np.int64))  # a copy: callers reuse theirs
            self._raw_n += count
            if self._raw_n > self.exact_limit:
                self._hist = np.zeros(N_BUCKETS, dtype=np.int64)
                for chunk in self._raw:
                    self._fold(chunk)
                self._raw = []
        elif buckets is not None:
            self._hist += buckets
        else:
            assert values is not None
            self._fold(values)

    def _fold(self, values: np.ndarray) -> None:
        assert self._hist is not None
        self._hist += np.bincount(log_bucket(values), minlength=N_BUCKETS)

    @property
    def exact(self) -> bool:
        return self._hist is None

    def quantile(self, q: float) -> float:
        """The q-quantile (numpy 'linear' when exact, bucket midpoint otherwise)."""
        if self.count == 0:
            return float("nan")
        if self._hist is None:
            return float(np.quantile(np.concatenate(self._raw), q))
        cum = np.cumsum(self._hist)
        rank = q * (self.count - 1)
        idx = int(np.searchsorted(cum, rank, side="right"))
        low, high = bucket_bounds(np.array([idx]))
        mid = (low[0] + high[0]) / 2.0
        return float(min(max(mid, self.min), self.max))

    def histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """(bucket lower bounds, counts) of the non-empty log buckets."""
        if self._hist is None:
            hist = np.bincount(
                log_bucket(np.concatenate(self._raw)) if self._raw else np.zeros(0, np.int64),
                minlength=N_BUCKETS,
            )
        else:
            hist = self._hist
        idx = np.flatnonzero(hist)
        low, _ = bucket_bounds(idx)
        return low, hist[idx]


def pow2_bucket(nbytes: np.ndarray) -> np.ndarray:
    """Power-of-two bucket: 0 for 0 bytes, else k+1 where 2**k <= bytes < 2**(k+1)."""
    bits = nbytes.astype(np.float64).view(np.int64)
    bits >>= 52
    bits -= 1022
    np.maximum(bits, 0, out=bits)
    return bits


def pow2_label(bucket: int) -> int:
    """Lower bound in bytes of a :func:`pow2_bucket` bucket."""
    return 0 if bucket == 0 else 1 << (int(bucket) - 1)
