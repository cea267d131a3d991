"""What the scheduler reports: a request's counters and policy choice (its ``kv_*``
meta_info fields) and the server's bounded totals (``GET /kv_policy``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .stats import LogHistogram

if TYPE_CHECKING:
    from . import contract as sg


@dataclass(frozen=True)
class RequestCounters:
    """A request's eviction so far, as its meta_info reports it (``kv_<field>``)."""

    region_len: int  # physical KV length of the region, as of the last decode step
    evicted_tokens: int  # per (layer, KV head)
    eviction_rounds: int
    reprefilled_tokens: str  # generated tokens re-prefilled after each retraction, comma-separated

    @classmethod
    def before_first_decode(cls, req: sg.Req) -> RequestCounters:
        """Before a region starts (or with ``--kv-policy none``): every generated token but
        the one being sampled is in the cache, nothing evicted."""
        return cls(max(0, len(req.output_ids) - 1), 0, 0, "")


@dataclass(frozen=True)
class PolicyChoice:
    """The policy a request runs and why, as its meta_info reports it (``kv_<field>``)."""

    policy: str
    policy_reason: str


@dataclass
class Totals:
    """Server-lifetime totals, bounded in size however long the server runs."""

    rounds: int = 0  # request-rounds
    tokens_evicted: int = 0
    # Request-rounds of a query-reading policy whose ring held no query at all: the decode
    # path of some attention backend was not hooked, so attention scored nothing.
    rounds_without_queries: int = 0
    round_latency: LogHistogram = field(default_factory=LogHistogram)  # one per batched round
    # Host seconds in the telemetry's own work: measuring rounds, the loop detector, the reports.
    telemetry_seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        """The round totals of ``GET /kv_policy``."""
        lat = self.round_latency

        def ms(x: float | None) -> float | None:
            return round(1e3 * x, 3) if x is not None else None

        return {
            "eviction_rounds": self.rounds,
            "tokens_evicted": self.tokens_evicted,
            "rounds_without_queries": self.rounds_without_queries,
            "batched_rounds": lat.count,
            "round_latency_ms_p50": ms(lat.quantile(0.5)),
            "round_latency_ms_p99": ms(lat.quantile(0.99)),
            "round_latency_ms_max": ms(lat.max) if lat.count else None,
            # All rounds together, so a benchmark can state their share of the decode time.
            "round_seconds_total": round(lat.total, 4),
        }
