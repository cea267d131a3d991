"""Prometheus metrics (scheduler process), exposed on SGLang's ``/metrics`` with
``--enable-metrics``. Created lazily: ``prometheus_client`` must not be imported before
SGLang has set up its multiprocess directory.

The telemetry series carry the labels ``policy`` and ``budget`` (of the request: per-request
``kv_policy`` / ``kv_budget`` and ``auto`` make several per server). ``METRIC_NAMES`` lists
every series; ``monitoring/grafana/vase-sglang.json`` charts them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config import PolicyConfig
    from .telemetry import TelemetryReport

# Shares (0..1): fine steps where rounds at small budgets land (0.1-0.6), so quantiles interpolate closely.
SIGNAL_BUCKETS = (0.001, 0.003, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5,
                  0.6, 0.7, 0.8, 0.9, 1.0)
# nats per token: SmolLM2 at B = 64-256 measured 0.02-0.4, the bundled model at B = 64 about 1-3.5.
KL_BUCKETS = (1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0)
LABELS = ("policy", "budget")
METRIC_NAMES = ("vase:eviction_rounds_total", "vase:evicted_tokens_total", "vase:round_latency_seconds",
                "vase:region_occupancy_ratio", "vase:reserved_region_slots", "vase:used_region_slots",
                "vase:round_evicted_attention", "vase:request_evicted_attention", "vase:request_estimated_kl",
                "vase:requests_finished_total", "vase:loops_total", "vase:loop_stops_total")

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
            "round_signal": Histogram("vase:round_evicted_attention",
                                      "Per request and round: share of the window queries' attention on the "
                                      "evicted tokens (mean over layers and KV heads)", LABELS,
                                      buckets=SIGNAL_BUCKETS),
            "request_signal": Histogram("vase:request_evicted_attention",
                                        "Per finished request that evicted: its mean evicted attention over rounds",
                                        LABELS, buckets=SIGNAL_BUCKETS),
            "request_kl": Histogram("vase:request_estimated_kl",
                                    "Per finished request that evicted, with --kv-calibration: estimated KL(full || "
                                    "served) per token, nats", LABELS, buckets=KL_BUCKETS),
            "finished": Counter("vase:requests_finished_total", "Finished requests on an evicting server", LABELS),
            "loops": Counter("vase:loops_total", "Finished requests whose output fell into a repetition loop", LABELS),
            "loop_stops": Counter("vase:loop_stops_total", "Requests ended by kv_stop_on_loop / --kv-stop-on-loop",
                                  LABELS),
        }
    return _metrics


def _labels(cfg: PolicyConfig) -> dict[str, str]:
    return {"policy": cfg.policy, "budget": str(cfg.budget) if cfg.evicts else "full"}


def observe_round_signals(cfg: PolicyConfig, signals: Sequence[float]) -> None:
    m = _get()
    if m is not None:
        hist = m["round_signal"].labels(**_labels(cfg))
        for s in signals:
            hist.observe(s)


def observe_request(cfg: PolicyConfig, report: TelemetryReport, stopped: bool) -> None:
    """A finished request's telemetry (once per request)."""
    m = _get()
    if m is None:
        return
    labels = _labels(cfg)
    m["finished"].labels(**labels).inc()
    # Created at 0 with the first finished request, so a loop rate reads 0, not "no data".
    loops, stops = m["loops"].labels(**labels), m["loop_stops"].labels(**labels)
    if report.evicted_attention is not None:
        m["request_signal"].labels(**labels).observe(report.evicted_attention)
        if report.estimated_kl is not None:
            m["request_kl"].labels(**labels).observe(report.estimated_kl)
    if report.loop:
        loops.inc()
    if stopped:
        stops.inc()


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
