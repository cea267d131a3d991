"""Per-request options: the ``kv_*`` fields of a request's ``custom_params``, validated
once in the tokenizer process into one ``RequestOptions`` and carried to the scheduler in
one field of the same ``custom_params`` (``OPTIONS_KEY``).

``request_options`` is the one place where a request's settings meet the server's; the
order, field by field, is in docs/request-options.md (request > ``auto`` > server flags >
``--kv-policy-config``). Pure Python. Errors are ``PolicyConfigError`` whose text names the
field as the client sent it (an HTTP 400). The server's own flags are in ``flags``.

Adding a per-request option: a field of ``RequestOptions``, its parser in
``_OPTION_PARSERS`` (both here), the code that reads ``record.options.<field>``, and its
row in docs/request-options.md.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..config import POLICY_NAMES, PolicyConfig, PolicyConfigError
from ..policies import mix_seed
from ..registry import QUERY_FREE, REGISTRY
from .auto import BUILTIN, AutoTable
from .planning import captures_queries
from .settings import ServerSettings

AUTO = "auto"  # --kv-policy / kv_policy value: the calibration's choice for the budget
# Per-request fields that change the request's PolicyConfig, and the config field each sets.
CONFIG_FIELDS = {
    "kv_policy": "policy",
    "kv_budget": "budget",
    "kv_n_large": "n_large",
}
# The tokenizer process writes the validated options under this key; the scheduler reads
# them instead of validating a second time. A client's own copy is dropped before validation.
OPTIONS_KEY = "__vase_options__"
_SEED_STREAM = 3  # mix_seed tag of seeds derived from a request's sampling seed
_MAX_SEED = 2**63 - 1


@dataclass(frozen=True)
class RequestOptions:
    """What one request evicts with, as validated in the tokenizer process."""

    cfg: PolicyConfig
    seed: int | None = None  # the request's kv_seed; None: the server's --kv-seed, else its own (``eviction_seed``)
    reason: str = ""  # why it runs its policy (its meta_info kv_policy_reason)
    stop_on_loop: bool | None = None  # the request's kv_stop_on_loop; None: the server's --kv-stop-on-loop

    def to_wire(self) -> dict[str, Any]:
        """The JSON-safe form carried in ``custom_params[OPTIONS_KEY]``."""
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}, "cfg": self.cfg.to_dict()}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> RequestOptions:
        return cls(**{**data, "cfg": _config_from_json(json.dumps(data["cfg"], sort_keys=True))})


def checked_seed(field: str, seed: Any) -> int:
    """A seed (``kv_seed``, ``--kv-seed``): an integer in [0, 2**63)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _MAX_SEED:
        raise PolicyConfigError(field, seed, "must be an integer in [0, 2**63 - 1]")
    return seed


def _checked_stop_on_loop(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise PolicyConfigError(field, value, "must be true or false")
    return value


# Per-request fields that are options of their own (not PolicyConfig fields): the
# RequestOptions field each sets, and its check.
_OPTION_PARSERS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "kv_seed": ("seed", checked_seed),
    "kv_stop_on_loop": ("stop_on_loop", _checked_stop_on_loop),
}
REQUEST_KEYS = (*CONFIG_FIELDS, *_OPTION_PARSERS)
# Fields only an evicting server can honour, with what to say otherwise.
_NEEDS_EVICTION = {"kv_stop_on_loop": ", which detects no loops"}


def server_reason(cfg: PolicyConfig, auto: AutoTable | None) -> str:
    """Why a request without ``kv_*`` fields runs the server's policy."""
    return auto.choose(cfg.budget).reason if auto is not None else f"server --kv-policy {cfg.policy}"


def _needs_evicting_server(field: str, value: Any, server: PolicyConfig, what: str = "") -> None:
    if not server.evicts:
        raise PolicyConfigError(field, value, f"the server runs with --kv-policy none{what}; start it with an "
                                "evicting policy")


def request_options(settings: ServerSettings, custom_params: Mapping[str, Any] | None) -> RequestOptions:
    """The options one request runs with: the server's, changed by its ``custom_params``.

    Precedence (docs/request-options.md): a request's ``kv_*`` field wins; then, for the
    policy, ``auto``'s choice for the request's budget (on an ``auto`` server when the
    request names no ``kv_policy``, or on any evicting server for ``kv_policy: "auto"``);
    then the server's flags, which already won over ``--kv-policy-config`` at start-up.
    ``auto``'s choice also sets ``outlier_factor``, which no request field sets.

    Raises ``PolicyConfigError`` (an HTTP 400 for the client) for a bad or unknown
    ``kv_*`` field. Other keys are left alone: custom logit processors read them.
    """
    server, auto = settings.config, settings.auto
    if not custom_params:
        return RequestOptions(server, reason=server_reason(server, auto))
    if not isinstance(custom_params, Mapping):
        raise PolicyConfigError("custom_params", custom_params, "must be a JSON object")
    changes, own = _request_fields(server, custom_params)
    reason = "request kv_policy" if "policy" in changes else server_reason(server, auto)
    if changes.get("policy") == AUTO or (auto is not None and "policy" not in changes and changes):
        reason = _apply_auto(server, changes, auto)
    return RequestOptions(_request_config(settings, changes), reason=reason, **own)


def _request_fields(server: PolicyConfig, custom_params: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The config fields a request changes, and its own options; unknown ``kv_*`` keys refused."""
    changes: dict[str, Any] = {}
    own: dict[str, Any] = {}
    for key, value in custom_params.items():
        if key == OPTIONS_KEY:
            continue
        if key == "kv_recent":
            raise PolicyConfigError("kv_recent", value,
                                    f"cannot be set per request; the server runs with --kv-recent {server.recent}")
        if key in _OPTION_PARSERS:
            name, parse = _OPTION_PARSERS[key]
            own[name] = parse(key, value)
            if key in _NEEDS_EVICTION:
                _needs_evicting_server(key, value, server, _NEEDS_EVICTION[key])
        elif key in CONFIG_FIELDS:
            changes[CONFIG_FIELDS[key]] = value
        elif isinstance(key, str) and key.startswith("kv_"):
            close = difflib.get_close_matches(key, REQUEST_KEYS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise PolicyConfigError(key, value, f"unknown request field; {hint}fields: {', '.join(REQUEST_KEYS)}")
    return changes, own


def _request_config(settings: ServerSettings, changes: dict[str, Any]) -> PolicyConfig:
    """The server's config with a request's changes, each checked against the server."""
    server = settings.config
    if not changes:
        return server
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
        field = next((k for k, v in CONFIG_FIELDS.items() if v == exc.field_name), exc.field_name)
        raise PolicyConfigError(field, exc.value, exc.allowed) from None
    if REGISTRY[cfg.policy].reads_queries and not captures_queries(server, settings.auto, settings.telemetry.enabled):
        raise PolicyConfigError("kv_policy", policy, f"needs attention queries, which the server's --kv-policy "
                                f"{server.policy} does not capture with --kv-telemetry off; "
                                f"use one of {', '.join(QUERY_FREE)}")
    return cfg


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


def carry(custom_params: dict[str, Any], options: RequestOptions) -> None:
    """Record the validated options in the request's ``custom_params`` for the scheduler."""
    custom_params[OPTIONS_KEY] = options.to_wire()


@functools.lru_cache(maxsize=256)
def _config_from_json(text: str) -> PolicyConfig:
    return PolicyConfig.from_json(text)


def carried_options(settings: ServerSettings, custom_params: Mapping[str, Any] | None, rid: str) -> RequestOptions:
    """The scheduler's view of a request: the options the tokenizer process validated, or
    the server's when the request has no ``kv_*`` field.

    ``kv_*`` fields without the carried options mean a request reached the scheduler
    without passing ``SamplingParams.verify``: that is a bug in the glue, so it raises
    rather than run the request with a policy it did not ask for.
    """
    custom = custom_params if isinstance(custom_params, Mapping) else {}
    carried = custom.get(OPTIONS_KEY)
    if carried is not None:
        options = RequestOptions.from_wire(carried)
        return options if options.reason else dataclasses.replace(
            options, reason=server_reason(settings.config, settings.auto))
    unvalidated = sorted(k for k in custom if isinstance(k, str) and k.startswith("kv_"))
    if unvalidated:
        raise RuntimeError(f"request {rid}: custom_params fields {unvalidated} reached the scheduler without "
                           "validation (SamplingParams.verify was not hooked)")
    return RequestOptions(settings.config, reason=server_reason(settings.config, settings.auto))


def eviction_seed(options: RequestOptions, settings: ServerSettings, rid: str, sampling_seed: int | None) -> int:
    """The seed of a request's eviction noise: its ``kv_seed``, else the server's
    ``--kv-seed``, else its own (``identity_seed``)."""
    if options.seed is not None:
        return options.seed
    return settings.seed if settings.seed is not None else identity_seed(rid, sampling_seed)


def identity_seed(rid: str, sampling_seed: int | None = None) -> int:
    """A request's own eviction seed: from its sampling seed when given (so a seeded
    request is reproducible), else from its id (so concurrent requests draw independent noise)."""
    if sampling_seed is not None:
        return mix_seed(sampling_seed, _SEED_STREAM)
    return int.from_bytes(hashlib.blake2b(str(rid).encode(), digest_size=8).digest(), "little") & _MAX_SEED
