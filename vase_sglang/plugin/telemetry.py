"""Eviction telemetry inside the server: per request what its rounds took away, the KL
estimate, repetition loops; per server the totals ``/kv_policy`` reports.

Pure Python over ``vase_sglang.telemetry`` (no SGLang, no torch): ``VaseScheduler`` owns
one ``RequestTelemetry`` per request and one ``FleetTelemetry``; the hooks in
``patches/`` feed them tokens and read the reports. docs/telemetry.md says what each
number means and how well it predicts the damage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import PolicyConfig
from ..telemetry import EvictedAttention, KLEstimator, Loop, LoopDetector
from .stats import LogHistogram

SWITCH = ("on", "off")  # --kv-telemetry


@dataclass(frozen=True)
class TelemetryOptions:
    """The server's telemetry settings: ``--kv-telemetry``, ``--kv-stop-on-loop`` and the
    KL mappings of ``--kv-calibration`` (None: only the raw signal is reported)."""

    enabled: bool = True
    stop_on_loop: bool = False
    estimator: KLEstimator | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "stop_on_loop": self.stop_on_loop,
                "estimator": self.estimator.to_dict() if self.estimator is not None else None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> TelemetryOptions:
        if not data:
            return cls()
        est = data.get("estimator")
        return cls(bool(data.get("enabled", True)), bool(data.get("stop_on_loop", False)),
                   KLEstimator.from_dict(est) if est else None)


@dataclass(frozen=True)
class TelemetryReport:
    """What a request's eviction cost so far, as its meta_info reports it (``kv_<field>``)."""

    evicted_attention: float | None  # mean over rounds of the round signal (None: no round yet)
    evicted_attention_max: float | None  # the worst round
    loop: bool  # a repetition loop was found in the output
    loop_start: int  # 0-based output token where its first copy starts (-1: none)
    # Only with a calibration (``ESTIMATE_FIELDS``):
    estimated_kl: float | None = None  # estimated KL(full || served) per token, nats
    kl_mapping: str = ""  # which mapping gave it, on which statistic


SIGNAL_FIELDS = ("evicted_attention", "evicted_attention_max", "loop", "loop_start")
ESTIMATE_FIELDS = ("estimated_kl", "kl_mapping")


class RequestTelemetry:
    """One request's telemetry: its rounds' signal and its output's loop detector."""

    def __init__(self, text_of: Callable[[Sequence[int]], str] | None, stop_on_loop: bool, detect_loops: bool,
                 token_chars: dict[int, int] | None = None):
        self.signal = EvictedAttention()
        self.detector = LoopDetector(text_of, token_chars=token_chars) if detect_loops else None
        self.stop_on_loop = stop_on_loop
        self.stopped = False  # ended by kv_stop_on_loop
        self.observed = False  # counted in the fleet totals (once, when it finished)

    def on_round(self, signal: float, generated: int) -> None:
        self.signal.add(signal, generated)

    def on_tokens(self, tokens: Sequence[int]) -> Loop | None:
        """New output tokens; the loop the first time one is found."""
        return self.detector.feed(tokens) if self.detector is not None else None

    @property
    def loop(self) -> Loop | None:
        return self.detector.loop if self.detector is not None else None

    def report(self, generated: int, cfg: PolicyConfig, estimator: KLEstimator | None) -> TelemetryReport:
        s = self.signal
        loop = self.loop
        estimated, mapping = None, ""
        if estimator is not None:
            estimated, mapping = estimate(s, generated, cfg, estimator)
        return TelemetryReport(s.statistic("mean", generated), s.statistic("max", generated), loop is not None,
                               loop.start if loop is not None else -1, estimated, mapping)


def estimate(signal: EvictedAttention, generated: int, cfg: PolicyConfig,
             estimator: KLEstimator) -> tuple[float, str]:
    """The KL estimate of a request and the mapping that gave it (0 without a round: the
    request computed exactly what the full cache computes)."""
    if not cfg.evicts or not signal.rounds:
        return 0.0, "no eviction round: the full cache's output"
    value = signal.statistic(estimator.statistic, generated)
    assert value is not None  # rounds > 0
    mapping = estimator.mapping_for(cfg.policy, cfg.outlier_factor, cfg.budget)
    where = Path(estimator.source).name if estimator.source else "calibration"
    return mapping(value), f"{where}: {mapping.label} isotonic ({mapping.points} requests) at " \
                           f"{estimator.statistic} {value:.4g}"


@dataclass
class ConfigTotals:
    """Finished requests of one (policy, budget) since the server started (bounded size)."""

    requests: int = 0
    evicted: int = 0  # requests with at least one round
    signal_sum: float = 0.0
    signal: LogHistogram = field(default_factory=LogHistogram)
    estimated: int = 0
    kl_sum: float = 0.0
    kl: LogHistogram = field(default_factory=LogHistogram)
    loops: int = 0
    loop_stops: int = 0

    def summary(self) -> dict[str, Any]:
        def q(h: LogHistogram, p: float) -> float | None:
            v = h.quantile(p)
            return None if v is None else round(v, 6)

        out: dict[str, Any] = {"requests": self.requests, "requests_evicted": self.evicted,
                               "loops": self.loops, "loop_stops": self.loop_stops,
                               "evicted_attention_sum": round(self.signal_sum, 6),
                               "evicted_attention_mean": round(self.signal_sum / self.evicted, 6) if self.evicted
                               else None,
                               "evicted_attention_p50": q(self.signal, 0.5),
                               "evicted_attention_p90": q(self.signal, 0.9),
                               "evicted_attention_p99": q(self.signal, 0.99)}
        if self.estimated:
            out.update({"estimated": self.estimated, "estimated_kl_sum": round(self.kl_sum, 6),
                        "estimated_kl_mean": round(self.kl_sum / self.estimated, 6),
                        "estimated_kl_p50": q(self.kl, 0.5), "estimated_kl_p90": q(self.kl, 0.9),
                        "estimated_kl_p99": q(self.kl, 0.99)})
        return out


class FleetTelemetry:
    """Totals per (policy, budget) over the requests this scheduler finished."""

    def __init__(self) -> None:
        self.by_config: dict[tuple[str, int], ConfigTotals] = {}

    def observe(self, cfg: PolicyConfig, report: TelemetryReport, stopped: bool) -> None:
        t = self.by_config.setdefault((cfg.policy, cfg.budget if cfg.evicts else 0), ConfigTotals())
        t.requests += 1
        if report.evicted_attention is not None:
            t.evicted += 1
            t.signal_sum += report.evicted_attention
            t.signal.observe(report.evicted_attention)
        if report.estimated_kl is not None and report.evicted_attention is not None:
            t.estimated += 1
            t.kl_sum += report.estimated_kl
            t.kl.observe(report.estimated_kl)
        t.loops += report.loop
        t.loop_stops += stopped

    def summary(self) -> dict[str, Any]:
        return {f"{policy} B={budget}" if budget else policy: t.summary()
                for (policy, budget), t in sorted(self.by_config.items())}


MERGED_SUMS = ("requests", "requests_evicted", "loops", "loop_stops", "evicted_attention_sum", "estimated",
               "estimated_kl_sum")


def merge(per_rank: Sequence[Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Several schedulers' ``FleetTelemetry.summary()`` as one: counts and sums added, means
    recomputed (quantiles stay per scheduler)."""
    out: dict[str, dict[str, Any]] = {}
    for rank in per_rank:
        for key, row in rank.items():
            acc = out.setdefault(key, {k: 0 for k in MERGED_SUMS})
            for k in MERGED_SUMS:
                acc[k] += row.get(k) or 0
    for acc in out.values():
        acc["evicted_attention_mean"] = acc["evicted_attention_sum"] / acc["requests_evicted"] \
            if acc["requests_evicted"] else None
        acc["estimated_kl_mean"] = acc["estimated_kl_sum"] / acc["estimated"] if acc["estimated"] else None
        acc["loop_rate"] = acc["loops"] / acc["requests"] if acc["requests"] else None
    return out
