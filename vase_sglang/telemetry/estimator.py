"""From a request's evicted-attention statistic to an estimate of its KL to the full cache.

``python -m vase_sglang.calibrate`` measures, on the user's model, each teacher-forced
request's signal (one of ``signal.STATISTICS``) beside its KL(full || policy) per token,
and fits monotone (isotonic) mappings: one per calibrated (policy, budget) and one over
every point (``model``). A mapping is its knots; between knots it interpolates linearly,
outside them it holds the end values. The server applies ``KLEstimator.mapping_for`` to
each request: its (policy, budget)'s mapping when that pair was calibrated and the
calibration chose per-pair mappings, else the model-wide one.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .signal import STATISTICS


@dataclass(frozen=True)
class KLMapping:
    """A non-decreasing piecewise-linear map from a signal statistic to KL (nats/token)."""

    x: tuple[float, ...]
    y: tuple[float, ...]
    label: str  # what it was fitted on, e.g. "snapkv B=64" or "model-wide"
    points: int  # requests it was fitted on

    def __post_init__(self) -> None:
        if not self.x or len(self.x) != len(self.y):
            raise ValueError("a mapping needs as many knots as values, at least one")
        if any(b < a for a, b in zip(self.x, self.x[1:], strict=False)) or \
                any(b < a for a, b in zip(self.y, self.y[1:], strict=False)):
            raise ValueError("a mapping's knots and values must be non-decreasing")

    def __call__(self, signal: float) -> float:
        x, y = self.x, self.y
        if signal <= x[0]:
            return y[0]
        if signal >= x[-1]:
            return y[-1]
        i = bisect.bisect_right(x, signal)
        x0, x1, y0, y1 = x[i - 1], x[i], y[i - 1], y[i]
        return y0 if x1 == x0 else y0 + (y1 - y0) * (signal - x0) / (x1 - x0)

    def to_dict(self) -> dict[str, Any]:
        return {"x": list(self.x), "y": list(self.y), "label": self.label, "points": self.points}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KLMapping:
        return cls(tuple(float(v) for v in data["x"]), tuple(float(v) for v in data["y"]), str(data["label"]),
                   int(data["points"]))


def fit_isotonic(signal: Sequence[float], kl: Sequence[float], label: str) -> KLMapping:
    """The least-squares non-decreasing fit of ``kl`` on ``signal`` (scipy), as knots: each
    distinct signal value (its requests' KL averaged, weighted by their number) with its
    fitted KL."""
    import numpy as np
    from scipy.optimize import isotonic_regression

    xs, ys = np.asarray(signal, dtype=np.float64), np.asarray(kl, dtype=np.float64)
    keep = np.isfinite(xs) & np.isfinite(ys)
    xs, ys = xs[keep], ys[keep]
    if not len(xs):
        raise ValueError(f"{label}: no finite (signal, KL) point to fit")
    knots, index, counts = np.unique(xs, return_inverse=True, return_counts=True)
    means = np.bincount(index, weights=ys) / counts
    fitted = isotonic_regression(means, weights=counts.astype(np.float64)).x
    return KLMapping(tuple(knots.tolist()), tuple(fitted.tolist()), label, int(len(xs)))


@dataclass(frozen=True)
class KLEstimator:
    """Every mapping of one calibration, and which the server uses."""

    statistic: str  # the signal statistic the mappings take
    model: KLMapping
    # (policy label, budget) -> mapping; empty when the model-wide mapping predicted as well
    per_config: dict[tuple[str, int], KLMapping] = field(default_factory=dict)
    # policy label -> PolicyConfig changes (as calibrate's candidates: vase-outliers is vase + outlier_factor)
    labels: dict[str, dict[str, Any]] = field(default_factory=dict)
    source: str = ""

    def __post_init__(self) -> None:
        if self.statistic not in STATISTICS:
            raise ValueError(f"unknown statistic {self.statistic!r}; one of {', '.join(STATISTICS)}")

    def label_of(self, changes: Mapping[str, Any]) -> str | None:
        """The calibrated label whose config changes a request's (policy, outlier_factor) match."""
        for label, wanted in self.labels.items():
            if all(changes.get(k) == v for k, v in wanted.items()) and \
                    changes.get("outlier_factor") == wanted.get("outlier_factor"):
                return label
        return None

    def mapping_for(self, policy: str, outlier_factor: float | None, budget: int) -> KLMapping:
        label = self.label_of({"policy": policy, "outlier_factor": outlier_factor})
        if label is not None and (label, budget) in self.per_config:
            return self.per_config[label, budget]
        return self.model

    def to_dict(self) -> dict[str, Any]:
        return {"statistic": self.statistic, "model": self.model.to_dict(),
                "per_config": [{"policy": k[0], "budget": k[1], "mapping": m.to_dict()}
                               for k, m in self.per_config.items()],
                "labels": self.labels, "source": self.source}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KLEstimator:
        per = {(str(d["policy"]), int(d["budget"])): KLMapping.from_dict(d["mapping"])
               for d in data.get("per_config", [])}
        return cls(str(data["statistic"]), KLMapping.from_dict(data["model"]), per,
                   {str(k): dict(v) for k, v in (data.get("labels") or {}).items()}, str(data.get("source", "")))
