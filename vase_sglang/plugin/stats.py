"""Bounded statistics of positive values: a fixed-size log-spaced histogram.

A server runs for weeks and may run millions of eviction rounds and requests, so round
latencies, signals and KL estimates cannot be kept one per observation. ``LogHistogram``
holds a fixed number of counters (memory does not grow with the number of observations)
and answers quantiles to within one bucket: buckets grow by ``GROWTH`` (5 %), so a
reported quantile is at most that far from the exact one. Values at or below
``MIN_VALUE`` share the first bucket, values above ``MAX_VALUE`` the last.
"""

from __future__ import annotations

import math

MIN_VALUE = 1e-6
MAX_VALUE = 1e3
GROWTH = 1.05


class LogHistogram:
    """Counts of values in log-spaced buckets between MIN_VALUE and MAX_VALUE (latencies in
    seconds, signals, KL)."""

    def __init__(self) -> None:
        self._log_growth = math.log(GROWTH)
        n = int(math.ceil(math.log(MAX_VALUE / MIN_VALUE) / self._log_growth)) + 1
        # Bucket i holds (MIN * GROWTH**(i-1), MIN * GROWTH**i]; bucket 0 everything <= MIN.
        self._counts = [0] * (n + 1)
        self.count = 0
        self.total = 0.0
        self.max = 0.0

    def _bucket(self, value: float) -> int:
        if value <= MIN_VALUE:
            return 0
        i = int(math.ceil(math.log(value / MIN_VALUE) / self._log_growth))
        return min(i, len(self._counts) - 1)

    def _upper(self, bucket: int) -> float:
        return MIN_VALUE * GROWTH**bucket

    def observe(self, value: float) -> None:
        value = max(0.0, float(value))
        self._counts[self._bucket(value)] += 1
        self.count += 1
        self.total += value
        self.max = max(self.max, value)

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (0 < q <= 1): the upper edge of its bucket, capped at the max seen."""
        if not 0 < q <= 1:
            raise ValueError(f"quantile must be in (0, 1], got {q}")
        if not self.count:
            return None
        rank = math.ceil(q * self.count)
        seen = 0
        for i, c in enumerate(self._counts):
            seen += c
            if seen >= rank:
                return min(self._upper(i), self.max)
        return self.max  # unreachable: the counts sum to count

    def __len__(self) -> int:
        return len(self._counts)
