"""Per-request options: the ``kv_*`` fields of a request's ``custom_params``, validated
once in the tokenizer process and read back by the scheduler.

Pure Python. Errors are ``PolicyConfigError`` whose text names the field as the client
sent it (an HTTP 400). The server's own flags are in ``flags``.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..config import POLICY_NAMES, PolicyConfig, PolicyConfigError
from ..policies import mix_seed
from ..registry import QUERY_FREE, REGISTRY
from .auto import BUILTIN, AutoTable
from .handoff import exported_telemetry
from .planning import captures_queries

AUTO = "auto"  # --kv-policy / kv_policy value: the calibration's choice for the budget
# Per-request fields in sampling_params.custom_params, and the PolicyConfig field each sets.
REQUEST_FIELDS = {
    "kv_policy": "policy",
    "kv_budget": "budget",
    "kv_n_large": "n_large",
}
STOP_ON_LOOP_KEY = "kv_stop_on_loop"  # per request: end the request when its output loops
REQUEST_KEYS = (*REQUEST_FIELDS, "kv_seed", STOP_ON_LOOP_KEY)
# The tokenizer process writes the validated options under this key; the scheduler reads
# them instead of validating a second time.
VALIDATED_KEY = "__vase_validated__"
_SEED_STREAM = 3  # mix_seed tag of seeds derived from a request's sampling seed
_MAX_SEED = 2**63 - 1


@dataclass(frozen=True)
class RequestOptions:
    """What one request evicts with: the policy config, the seed of its noise, and why
    that policy (reported in its meta_info)."""

    cfg: PolicyConfig
    seed: int
    reason: str = ""
    stop_on_loop: bool | None = None  # the request's kv_stop_on_loop; None: the server's --kv-stop-on-loop


class ValidatedRequest(NamedTuple):
    """A request's validated fields: its config, its explicit ``kv_seed`` (None when not
    given) and why it runs its policy."""

    cfg: PolicyConfig
    seed: int | None
    reason: str


def checked_seed(field: str, seed: Any) -> int:
    """A seed (``kv_seed``, ``--kv-seed``): an integer in [0, 2**63)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _MAX_SEED:
        raise PolicyConfigError(field, seed, "must be an integer in [0, 2**63 - 1]")
    return seed


def server_reason(cfg: PolicyConfig, auto: AutoTable | None) -> str:
    """Why a request without ``kv_*`` fields runs the server's policy."""
    return auto.choose(cfg.budget).reason if auto is not None else f"server --kv-policy {cfg.policy}"


def _needs_evicting_server(field: str, value: Any, server: PolicyConfig, what: str = "") -> None:
    if not server.evicts:
        raise PolicyConfigError(field, value, f"the server runs with --kv-policy none{what}; start it with an "
                                "evicting policy")


def validate_request(server: PolicyConfig, custom_params: Mapping[str, Any] | None,
                     auto: AutoTable | None = None) -> ValidatedRequest:
    """The config one request runs with (the server's, changed by its ``custom_params``),
    its explicit ``kv_seed`` and why it runs that policy.

    On an ``auto`` server (``auto`` given), a request without ``kv_policy`` (or with
    ``kv_policy: "auto"``) runs the table's choice for its budget; ``kv_policy: "auto"``
    on another evicting server runs the built-in choice.

    Raises ``PolicyConfigError`` (an HTTP 400 for the client) for a bad or unknown
    ``kv_*`` field. Other keys are left alone: custom logit processors read them.
    """
    if not custom_params:
        return ValidatedRequest(server, None, server_reason(server, auto))
    if not isinstance(custom_params, Mapping):
        raise PolicyConfigError("custom_params", custom_params, "must be a JSON object")
    changes, seed = _request_changes(server, custom_params)
    if not changes:
        return ValidatedRequest(server, seed, server_reason(server, auto))
    reason = "request kv_policy" if "policy" in changes else server_reason(server, auto)
    if changes.get("policy") == AUTO or (auto is not None and "policy" not in changes):
        reason = _apply_auto(server, changes, auto)
    policy = changes.get("policy", server.policy)
    if policy not in POLICY_NAMES:
        raise PolicyConfigError("kv_policy", policy, f"must be one of {', '.join(POLICY_NAMES)}")
    if policy != "none":
        _needs_evicting_server("kv_policy", policy, server)
    budget = changes.get("budget", server.budget)
    if isinstance(budget, int) and not isinstance(budget, bool) and budget > server.budget:
        raise PolicyConfigError("kv_budget", budget, f"must be <= the server's --kv-budget {server.budget}")
    try:
        cfg = server.replace(**changes)
    except PolicyConfigError as exc:
        field = next((k for k, v in REQUEST_FIELDS.items() if v == exc.field_name), exc.field_name)
        raise PolicyConfigError(field, exc.value, exc.allowed) from None
    if REGISTRY[cfg.policy].reads_queries and not captures_queries(server, auto, exported_telemetry().enabled):
        raise PolicyConfigError("kv_policy", policy, f"needs attention queries, which the server's --kv-policy "
                                f"{server.policy} does not capture with --kv-telemetry off; "
                                f"use one of {', '.join(QUERY_FREE)}")
    return ValidatedRequest(cfg, seed, reason)


def _request_changes(server: PolicyConfig, custom_params: Mapping[str, Any]) -> tuple[dict[str, Any], int | None]:
    """The config fields a request changes and its ``kv_seed``; unknown ``kv_*`` keys refused."""
    changes: dict[str, Any] = {}
    seed = None
    for key, value in custom_params.items():
        if key == VALIDATED_KEY:
            continue
        if key == "kv_recent":
            raise PolicyConfigError("kv_recent", value,
                                    f"cannot be set per request; the server runs with --kv-recent {server.recent}")
        if key == "kv_seed":
            seed = checked_seed("kv_seed", value)
        elif key == STOP_ON_LOOP_KEY:
            stop_on_loop(custom_params, server)
        elif key in REQUEST_FIELDS:
            changes[REQUEST_FIELDS[key]] = value
        elif isinstance(key, str) and key.startswith("kv_"):
            close = difflib.get_close_matches(key, REQUEST_KEYS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise PolicyConfigError(key, value, f"unknown request field; {hint}fields: {', '.join(REQUEST_KEYS)}")
    return changes, seed


def _apply_auto(server: PolicyConfig, changes: dict[str, Any], auto: AutoTable | None) -> str:
    """Put ``auto``'s choice for the request's budget into ``changes``; returns its reason."""
    budget = changes.get("budget", server.budget)
    if not isinstance(budget, int) or isinstance(budget, bool):
        raise PolicyConfigError("kv_budget", budget, "must be an integer")
    if changes.get("policy") == AUTO:
        _needs_evicting_server("kv_policy", AUTO, server)
    choice = (auto or BUILTIN).choose(budget)
    changes.update(choice.changes)
    return choice.reason


def stop_on_loop(custom_params: Mapping[str, Any] | None, server: PolicyConfig) -> bool | None:
    """A request's ``kv_stop_on_loop`` (None when not given); only an evicting server detects loops."""
    if not isinstance(custom_params, Mapping) or STOP_ON_LOOP_KEY not in custom_params:
        return None
    value = custom_params[STOP_ON_LOOP_KEY]
    if not isinstance(value, bool):
        raise PolicyConfigError(STOP_ON_LOOP_KEY, value, "must be true or false")
    _needs_evicting_server(STOP_ON_LOOP_KEY, value, server, ", which detects no loops")
    return value


def stamp_validated(custom_params: dict[str, Any], cfg: PolicyConfig, seed: int | None, reason: str = "",
                    stop: bool | None = None) -> None:
    """Record the validated options in the request's ``custom_params`` for the scheduler."""
    custom_params[VALIDATED_KEY] = {"config": cfg.to_dict(), "seed": seed, "reason": reason, "stop_on_loop": stop}


def identity_seed(rid: str, sampling_seed: int | None = None) -> int:
    """A request's own eviction seed: from its sampling seed when given (so a seeded
    request is reproducible), else from its id (so concurrent requests draw independent noise)."""
    if sampling_seed is not None:
        return mix_seed(sampling_seed, _SEED_STREAM)
    return int.from_bytes(hashlib.blake2b(str(rid).encode(), digest_size=8).digest(), "little") & _MAX_SEED


@functools.lru_cache(maxsize=256)
def _stamped_config(text: str) -> PolicyConfig:
    return PolicyConfig.from_json(text)


def resolve_request(server: PolicyConfig, server_seed: int | None, custom_params: Mapping[str, Any] | None,
                    rid: str, sampling_seed: int | None = None, auto: AutoTable | None = None) -> RequestOptions:
    """The scheduler's view of a request: the options the tokenizer process validated.

    The seed is the request's ``kv_seed``, else the server's ``--kv-seed``, else
    ``identity_seed``. ``kv_*`` fields without the validation stamp mean a request
    reached the scheduler without passing ``SamplingParams.verify``: that is a bug in
    the glue, so it raises rather than run the request with a policy it did not ask for.
    """
    custom = custom_params if isinstance(custom_params, Mapping) else {}
    stamp = custom.get(VALIDATED_KEY)
    if stamp is None:
        unvalidated = sorted(k for k in custom if isinstance(k, str) and k.startswith("kv_"))
        if unvalidated:
            raise RuntimeError(f"request {rid}: custom_params fields {unvalidated} reached the scheduler without "
                               "validation (SamplingParams.verify was not hooked)")
        cfg, seed, reason, stop = server, None, server_reason(server, auto), None
    else:
        cfg, seed = _stamped_config(json.dumps(stamp["config"], sort_keys=True)), stamp["seed"]
        reason = stamp.get("reason") or server_reason(server, auto)
        stop = stamp.get("stop_on_loop")
    if seed is None:
        seed = server_seed if server_seed is not None else identity_seed(rid, sampling_seed)
    return RequestOptions(cfg, seed, reason, stop)
