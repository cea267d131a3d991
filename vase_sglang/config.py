"""Policy configuration: one object, validated once.

Every error names the field, the value that was given and what is allowed, so that a
bad ``--kv-*`` flag or ``custom_params`` field can be reported to the user verbatim.

Budget semantics (see docs/algorithm.md, "The round"): a request's generated tokens live in a
region of ``budget + recent`` slots per (layer, KV head). When it is full, one round
keeps ``budget - recent`` of the ``budget`` candidates plus the ``recent`` newest
tokens, so the region returns to exactly ``budget`` slots.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .registry import POLICY_NAMES

VALUE_STATS: tuple[str, ...] = ("range", "l2", "variance", "absmax")

DEFAULT_BUDGET = 4096
DEFAULT_RECENT = 64


class PolicyConfigError(ValueError):
    """A policy configuration value is invalid. The message is meant for end users."""

    def __init__(self, field_name: str, value: Any, allowed: str):
        self.field_name = field_name
        self.value = value
        self.allowed = allowed
        super().__init__(f"invalid {field_name}={value!r}: {allowed}")


def _require_int(name: str, value: Any, minimum: int) -> None:
    # bool is an int subclass; `budget=True` is a typo, not a budget.
    if not isinstance(value, int) or isinstance(value, bool):
        raise PolicyConfigError(name, value, f"must be an integer >= {minimum}")
    if value < minimum:
        raise PolicyConfigError(name, value, f"must be an integer >= {minimum}")


def _require_float(name: str, value: Any, *, positive: bool, upper: float | None = None) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise PolicyConfigError(name, value, "must be a number")
    if value != value or value in (float("inf"), float("-inf")):
        raise PolicyConfigError(name, value, "must be a finite number")
    if positive and value <= 0:
        raise PolicyConfigError(name, value, "must be > 0")
    if upper is not None and not (0 <= value <= upper):
        raise PolicyConfigError(name, value, f"must be in [0, {upper}]")


@dataclass(frozen=True, eq=False)
class PolicyConfig:
    """Everything a KV eviction policy needs to know. Construct it once; it validates itself."""

    policy: str = "vase"
    budget: int = DEFAULT_BUDGET
    recent: int = DEFAULT_RECENT
    sinks: int = 4
    # None means the paper's default, budget // 4. Sinks are not counted in n_large.
    n_large: int | None = None
    # None: reserve n_large slots whatever the values hold (the paper). A number k > 1:
    # reserve, up to n_large, only the candidates whose value statistic is at least k times
    # the median of their (layer, KV head)'s candidates; the fill takes the slots left over.
    outlier_factor: float | None = None
    value_stat: str = "range"
    temperature: float = 1.0
    smoothing_kernel: int = 5
    sketch_rank: int = 20
    # Weight of the attention score against key redundancy (R-KV; G-KV's mix_lambda).
    rkv_lambda: float = 0.5
    # G-KV: the global score decays by this factor at every round before the max with the
    # round's local score (the paper's alpha).
    gkv_decay: float = 0.8
    # No seed here: the seed of the noise is per request (``Regions.seeds``), so that
    # requests that differ only in their seed share one policy object and one round batch.
    # Resolved value of n_large, filled in by __post_init__.
    _n_large: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.policy not in POLICY_NAMES:
            raise PolicyConfigError("policy", self.policy, f"must be one of {', '.join(POLICY_NAMES)}")
        _require_int("recent", self.recent, 1)
        _require_int("sinks", self.sinks, 0)
        min_budget = self.sinks + self.recent + 1
        _require_int("budget", self.budget, min_budget)
        if self.budget % self.recent != 0:
            raise PolicyConfigError(
                "budget",
                self.budget,
                f"must be a multiple of recent={self.recent} "
                f"(e.g. {max(2, -(-self.budget // self.recent)) * self.recent})",
            )
        n_large = self.budget // 4 if self.n_large is None else self.n_large
        max_large = self.budget - self.recent - self.sinks
        if (
            not isinstance(n_large, int)
            or isinstance(n_large, bool)
            or n_large < 0
            or n_large > max_large
        ):
            raise PolicyConfigError(
                "n_large",
                n_large,
                f"must be an integer in [0, budget - recent - sinks = {max_large}]",
            )
        object.__setattr__(self, "_n_large", n_large)
        if self.outlier_factor is not None:
            _require_float("outlier_factor", self.outlier_factor, positive=True)
            if self.outlier_factor <= 1:
                raise PolicyConfigError("outlier_factor", self.outlier_factor,
                                        "must be a number > 1 (times the median), or null for a fixed reservation")
        if self.value_stat not in VALUE_STATS:
            raise PolicyConfigError("value_stat", self.value_stat, f"must be one of {', '.join(VALUE_STATS)}")
        _require_float("temperature", self.temperature, positive=True)
        _require_int("smoothing_kernel", self.smoothing_kernel, 1)
        if self.smoothing_kernel % 2 == 0:
            raise PolicyConfigError("smoothing_kernel", self.smoothing_kernel, "must be odd (1 disables smoothing)")
        _require_int("sketch_rank", self.sketch_rank, 1)
        _require_float("rkv_lambda", self.rkv_lambda, positive=False, upper=1.0)
        _require_float("gkv_decay", self.gkv_decay, positive=False, upper=1.0)

    # ---- derived sizes -------------------------------------------------------------
    @property
    def large(self) -> int:
        """Resolved number of value-reserved slots (sinks excluded)."""
        return self._n_large

    @property
    def region_size(self) -> int:
        """Slots per (layer, KV head) when a round fires: budget + recent."""
        return self.budget + self.recent

    @property
    def keep_candidates(self) -> int:
        """Candidates kept per round; the recent window follows them."""
        return self.budget - self.recent

    @property
    def evicts(self) -> bool:
        return self.policy != "none"

    # Equal when the resolved settings are equal (n_large=None and n_large=B/4 are the same).
    def __eq__(self, other: object) -> bool:
        return isinstance(other, PolicyConfig) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.to_dict().items())))

    # ---- (de)serialisation ---------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        out["n_large"] = self.large
        return out

    def replace(self, **changes: Any) -> PolicyConfig:
        """A copy with some fields changed, validated again.

        Changing the budget without naming n_large re-derives n_large = budget // 4.
        """
        base = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        if "budget" in changes and "n_large" not in changes:
            base["n_large"] = None
        base.update(changes)
        return PolicyConfig(**base)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls) if f.init)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], base: PolicyConfig | None = None) -> PolicyConfig:
        """Build from a mapping (e.g. ``--kv-policy-config`` JSON), rejecting unknown keys."""
        if not isinstance(values, Mapping):
            raise PolicyConfigError("kv_policy_config", values, "must be a JSON object")
        allowed = cls.field_names()
        unknown = sorted(set(values) - set(allowed))
        if unknown:
            raise PolicyConfigError(unknown[0], values[unknown[0]],
                                    f"unknown field; allowed fields: {', '.join(allowed)}")
        if base is None:
            return cls(**dict(values))
        return base.replace(**dict(values))

    @staticmethod
    def parse_fields(source: str | Mapping[str, Any]) -> dict[str, Any]:
        """The fields of a JSON object given as text or already parsed, with the errors of
        ``--kv-policy-config`` (which names it)."""
        parsed: Any = source
        if isinstance(source, str):
            try:
                parsed = json.loads(source)
            except json.JSONDecodeError as exc:
                raise PolicyConfigError("kv_policy_config", source,
                                        f"must be valid JSON ({exc.msg} at char {exc.pos})") from None
        if not isinstance(parsed, Mapping):
            raise PolicyConfigError("kv_policy_config", source, "must be a JSON object")
        return dict(parsed)

    @classmethod
    def from_json(cls, text: str, base: PolicyConfig | None = None) -> PolicyConfig:
        return cls.from_dict(cls.parse_fields(text), base)
