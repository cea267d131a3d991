"""``--kv-policy auto``: the policy a request runs, chosen by its budget from a calibration.

A calibration (``python -m vase_sglang.calibrate``) recommends, per measured budget, the
policy that kept the model closest to its full cache. A request with budget B runs the
recommendation of the largest calibrated budget <= B: the nearest regime measured with no
more room than the request has. A budget below every calibrated one takes the smallest's.
Without a calibration file, ``auto`` serves ``BUILTIN_POLICY`` at every budget.

Pure Python: the server glue (``options``, ``patches``) and the calibration tool use it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import POLICY_NAMES, PolicyConfigError
from ..telemetry import KLEstimator

CALIBRATION_KIND = "vase-sglang-calibration"
CALIBRATION_VERSION = 1
# The paper's method. No calibration measures the user's model, so nothing better is known.
BUILTIN_POLICY = "vase"
# PolicyConfig fields a recommendation may set besides the policy.
CHOICE_FIELDS = ("policy", "outlier_factor")
# Config fields that decide the attention a calibration measured: the fingerprint's input.
FINGERPRINT_FIELDS = ("model_type", "architectures", "hidden_size", "intermediate_size", "num_hidden_layers",
                      "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "rope_theta",
                      "rope_parameters", "rope_scaling", "tie_word_embeddings")


def model_fingerprint(config: Mapping[str, Any]) -> str:
    """A short hash of a model's HF config (``config.json`` as a dict), by ``FINGERPRINT_FIELDS``."""
    picked = {k: config.get(k) for k in FINGERPRINT_FIELDS}
    return hashlib.sha256(json.dumps(picked, sort_keys=True, default=str).encode()).hexdigest()[:16]


def fingerprint_of_path(model_path: str) -> str:
    """The fingerprint of a local model folder's ``config.json`` (or an HF id's, via transformers)."""
    path = Path(model_path) / "config.json"
    if path.is_file():
        return model_fingerprint(json.loads(path.read_text()))
    from transformers import AutoConfig

    return model_fingerprint(AutoConfig.from_pretrained(model_path).to_dict())


@dataclass(frozen=True)
class Choice:
    """What a request runs under ``auto``: PolicyConfig changes, and why, in words."""

    changes: dict[str, Any]
    reason: str

    @property
    def policy(self) -> str:
        return str(self.changes["policy"])


@dataclass(frozen=True)
class AutoTable:
    """Budget -> recommended PolicyConfig changes, from one calibration (or the built-in)."""

    by_budget: dict[int, dict[str, Any]]
    source: str  # the calibration file, or "built-in"
    recent: int | None = None  # the R the calibration measured with (None: built-in)
    fingerprint: str | None = None

    def choose(self, budget: int) -> Choice:
        if not self.by_budget:
            return Choice({"policy": BUILTIN_POLICY, "outlier_factor": None},
                          f"auto: built-in choice {BUILTIN_POLICY} (no --kv-calibration given)")
        at_or_below = [b for b in self.by_budget if b <= budget]
        calibrated = max(at_or_below) if at_or_below else min(self.by_budget)
        changes = {"outlier_factor": None, **self.by_budget[calibrated]}
        label = changes.pop("label", None) or changes["policy"]
        where = (f"nearest calibrated budget <= {budget}" if at_or_below
                 else f"smallest calibrated budget; {budget} is below it")
        return Choice(changes, f"auto: {Path(self.source).name} recommends {label} at B={calibrated} ({where})")

    def policies(self) -> list[dict[str, Any]]:
        """Every choice this table can make (for memory sizing and query capture)."""
        if not self.by_budget:
            return [{"policy": BUILTIN_POLICY, "outlier_factor": None}]
        return [{k: v for k, v in c.items() if k in CHOICE_FIELDS} for c in self.by_budget.values()]

    def to_dict(self) -> dict[str, Any]:
        return {"by_budget": {str(b): c for b, c in sorted(self.by_budget.items())}, "source": self.source,
                "recent": self.recent, "fingerprint": self.fingerprint}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AutoTable:
        return cls({int(b): dict(c) for b, c in data["by_budget"].items()}, data["source"], data.get("recent"),
                   data.get("fingerprint"))


BUILTIN = AutoTable({}, "built-in")


def _bad(path: str, why: str) -> PolicyConfigError:
    err = PolicyConfigError("kv_calibration", path, why)
    err.args = (f"invalid --kv-calibration {path!r}: {why}",)
    return err


def _read(path: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise _bad(path, f"cannot read it ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise _bad(path, f"not JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(data, dict) or data.get("kind") != CALIBRATION_KIND:
        raise _bad(path, "not a calibration file (write one with `python -m vase_sglang.calibrate`)")
    if data.get("version") != CALIBRATION_VERSION:
        raise _bad(path, f"calibration version {data.get('version')!r}; this server reads {CALIBRATION_VERSION}")
    return data


def load_estimator(path: str) -> KLEstimator | None:
    """The signal -> KL mappings of a calibration file (None: it was written before
    ``calibrate`` measured the signal)."""
    section = (_read(path).get("telemetry") or {}).get("estimator")
    if not section:
        return None
    try:
        est = KLEstimator.from_dict(section)
    except (KeyError, TypeError, ValueError) as exc:
        raise _bad(path, f"its telemetry mapping is malformed ({type(exc).__name__}: {exc})") from None
    return KLEstimator(est.statistic, est.model, est.per_config, est.labels, str(path))


def load_calibration(path: str, model_fingerprint: str | None = None) -> AutoTable:
    """The table of a calibration file; a clear ``PolicyConfigError`` for a wrong one.

    With ``model_fingerprint``, a calibration measured on another model is refused.
    """
    data = _read(path)
    rec = data.get("recommendation") or {}
    if not rec:
        raise _bad(path, "it recommends nothing (the calibration has not finished a budget)")
    table: dict[int, dict[str, Any]] = {}
    for budget, choice in rec.items():
        if not isinstance(choice, dict) or choice.get("policy") not in POLICY_NAMES or choice["policy"] == "none":
            raise _bad(path, f"budget {budget}: {choice!r} is not an evicting policy")
        table[int(budget)] = {k: v for k, v in choice.items() if k in (*CHOICE_FIELDS, "label")}
    made_for = (data.get("model") or {}).get("fingerprint")
    if model_fingerprint is not None and made_for != model_fingerprint:
        name = (data.get("model") or {}).get("path", "?")
        raise _bad(path, f"it was measured on another model ({name}, config fingerprint {made_for}; this server's "
                         f"model has {model_fingerprint}); calibrate this model first")
    return AutoTable(table, str(path), (data.get("setup") or {}).get("recent"), made_for)
