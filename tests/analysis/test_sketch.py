"""Bounded-memory distributions: exact while small, within 0.4 % once folded."""

from __future__ import annotations

import numpy as np
import pytest

from trainio_analysis.analyze.sketch import QuantileSketch, bucket_bounds, log_bucket, pow2_bucket


def test_folded_quantiles_are_within_the_bucket_precision() -> None:
    rng = np.random.default_rng(3)
    values = rng.lognormal(np.log(80_000), 1.0, 200_000).astype(np.int64)
    sketch = QuantileSketch(exact_limit=1000)
    for chunk in np.array_split(values, 7):
        sketch.add(chunk)
    assert not sketch.exact
    for q in (0.5, 0.9, 0.99, 0.999):
        assert sketch.quantile(q) == pytest.approx(np.quantile(values, q), rel=0.004)
    assert sketch.max == values.max() and sketch.count == values.size
    assert sketch.sum == pytest.approx(values.sum())


def test_exact_while_small() -> None:
    sketch = QuantileSketch(exact_limit=10)
    sketch.add(np.array([5, 1, 9]))
    assert sketch.exact and sketch.quantile(0.5) == 5.0


def test_bucket_edges() -> None:
    v = np.array([0, 1, 2, 3, 4095, 4096, 4097, 8191, 8192, (1 << 40) + 5])
    assert pow2_bucket(v).tolist() == [0, 1, 2, 2, 12, 13, 13, 13, 14, 41]
    low, high = bucket_bounds(log_bucket(v))
    assert np.all((low <= v) & ((v < high) | (v == 0)))
    assert np.all((high - low) <= np.maximum(low, 1) / 128)
