"""Bounded latency statistics: a fixed-size log-spaced histogram.

A server runs for weeks and may run millions of eviction rounds, so round latencies
cannot be kept one per round. ``LatencyHistogram`` holds a fixed number of counters
(memory does not grow with the number of observations) and answers quantiles to within
one bucket: buckets grow by ``GROWTH`` (about 4.9 %), so a reported quantile is at most
that far from the exact one.
"""

from __future__ import annotations

import math

MIN_SECONDS = 1e-6
MAX_SECONDS = 1e3
GROWTH = 1.05


class LatencyHistogram:
    """Counts of latencies in log-spaced buckets between MIN_SECONDS and MAX_SECONDS."""

    def __init__(self) -> None:
        self._log_growth = math.log(GROWTH)
        n = int(math.ceil(math.log(MAX_SECONDS / MIN_SECONDS) / self._log_growth)) + 1
        # Bucket i holds (MIN * GROWTH**(i-1), MIN * GROWTH**i]; bucket 0 everything <= MIN.
        self._counts = [0] * (n + 1)
        self.count = 0
        self.total_seconds = 0.0
        self.max_seconds = 0.0

    def _bucket(self, seconds: float) -> int:
        if seconds <= MIN_SECONDS:
            return 0
        i = int(math.ceil(math.log(seconds / MIN_SECONDS) / self._log_growth))
        return min(i, len(self._counts) - 1)

    def _upper(self, bucket: int) -> float:
        return MIN_SECONDS * GROWTH**bucket

    def observe(self, seconds: float) -> None:
        seconds = max(0.0, float(seconds))
        self._counts[self._bucket(seconds)] += 1
        self.count += 1
        self.total_seconds += seconds
        self.max_seconds = max(self.max_seconds, seconds)

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
                return min(self._upper(i), self.max_seconds)
        return self.max_seconds  # unreachable: the counts sum to count

    def __len__(self) -> int:
        return len(self._counts)
