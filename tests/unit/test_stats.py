"""The bounded log histogram behind /kv_policy's round latency quantiles."""

from __future__ import annotations

import random

import pytest

from vase_sglang.plugin.stats import GROWTH, LogHistogram


def test_quantiles_are_within_one_bucket_of_the_exact_ones() -> None:
    rng = random.Random(0)
    xs = [rng.lognormvariate(-5, 1.5) for _ in range(20_000)]
    h = LogHistogram()
    for x in xs:
        h.observe(x)
    xs.sort()
    for q in (0.5, 0.9, 0.99):
        exact = xs[int(q * len(xs)) - 1]
        assert exact <= h.quantile(q) <= exact * GROWTH * 1.0001, q
    assert h.quantile(1.0) == h.max == xs[-1]
    assert h.count == len(xs) and h.total == pytest.approx(sum(xs))


def test_size_is_fixed() -> None:
    h = LogHistogram()
    n = len(h)
    for i in range(50_000):
        h.observe(1e-7 * (1.3**(i % 120)))  # below the first bucket up to far above the last
    assert len(h) == n and h.count == 50_000


def test_empty_and_bad_quantiles() -> None:
    h = LogHistogram()
    assert h.quantile(0.5) is None
    with pytest.raises(ValueError):
        h.quantile(0)
