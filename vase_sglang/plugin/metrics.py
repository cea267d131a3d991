"""Prometheus metrics (scheduler process), exposed on SGLang's ``/metrics`` with
``--enable-metrics``. Created lazily: ``prometheus_client`` must not be imported before
SGLang has set up its multiprocess directory.
"""

from __future__ import annotations

import os
from typing import Any

_metrics: dict[str, Any] | None = None


def enabled() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def _get() -> dict[str, Any] | None:
    global _metrics
    if _metrics is None and enabled():
        from prometheus_client import Counter, Gauge, Histogram

        _metrics = {
            "rounds": Counter("vase:eviction_rounds_total", "KV eviction rounds (one per request per round)"),
            "evicted": Counter("vase:evicted_tokens_total",
                               "Tokens evicted per (layer, KV head), summed over requests"),
            "latency": Histogram("vase:round_latency_seconds", "Wall time of one batched eviction step",
                                 buckets=(1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0)),
            "occupancy": Histogram("vase:region_occupancy_ratio",
                                   "Generated-region length / (budget + recent), per request per step",
                                   buckets=(0.1, 0.25, 0.5, 0.75, 0.8, 0.9, 0.95, 1.0)),
            "reserved": Gauge("vase:reserved_region_slots",
                              "Region slots reserved by running evicting requests (B + R each)",
                              multiprocess_mode="livesum"),
            "used": Gauge("vase:used_region_slots", "Region slots holding KV for running evicting requests",
                          multiprocess_mode="livesum"),
        }
    return _metrics


def observe_rounds(n_requests: int, tokens: int, seconds: float) -> None:
    m = _get()
    if m is not None and n_requests:
        m["rounds"].inc(n_requests)
        m["evicted"].inc(tokens)
        m["latency"].observe(seconds)


def observe_step(regions: list[tuple[int, int]]) -> None:
    """One decode step: ``(region size B + R, region length)`` of each running evicting request."""
    m = _get()
    if m is None:
        return
    reserved = used = 0
    for size, length in regions:
        reserved += size
        used += length
        m["occupancy"].observe(length / size)
    m["reserved"].set(reserved)
    m["used"].set(used)
