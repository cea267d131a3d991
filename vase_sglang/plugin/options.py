"""User-facing options: the ``--kv-*`` server flags and the per-request fields.

Pure Python; the SGLang glue calls these. Errors are ``PolicyConfigError`` whose text
names the flag (or request field) as the user typed it.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..config import POLICY_NAMES, PolicyConfig, PolicyConfigError
from ..policies import POLICIES, mix_seed
from ..registry import EVICTING, QUERY_FREE, REGISTRY
from .auto import BUILTIN, AutoTable, fingerprint_of_path, load_calibration, load_estimator
from .telemetry import SWITCH, TelemetryOptions

# The environment carries the server's policy to every SGLang process (scheduler,
# detokenizer, DP controller) and survives ``sglang.Engine(**kwargs)``.
ENV_CONFIG = "VASE_SGLANG_CONFIG"

FLAG_FOR_FIELD = {
    "policy": "--kv-policy",
    "budget": "--kv-budget",
    "recent": "--kv-recent",
    "seed": "--kv-seed",
    "kv_calibration": "--kv-calibration",
    "kv_telemetry": "--kv-telemetry",
}
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


def add_cli_flags(parser: argparse.ArgumentParser) -> None:
    """Add the ``--kv-*`` flags (shown in ``--help``) to an argparse parser."""
    group = parser.add_argument_group(
        "vase-sglang KV eviction",
        "Per-request decode-time KV eviction (VaSE and baselines). Prompts and shared "
        "prefixes stay in the radix tree; each request's generated tokens live in a fixed "
        "region of budget + recent slots per layer and KV head.",
    )
    group.add_argument("--kv-policy", default="none", choices=(*POLICY_NAMES, AUTO),
                       help="KV eviction policy for generated tokens (default: none, stock SGLang): "
                            + "; ".join(f"{s.name}: {s.summary}" for s in REGISTRY.values())
                            + "; auto: the policy --kv-calibration recommends for each request's budget")
    group.add_argument("--kv-calibration", default=None, metavar="FILE",
                       help="a calibration.json from `python -m vase_sglang.calibrate` on this model: each request "
                            "then reports kv_estimated_kl, and --kv-policy auto serves its recommendations (without "
                            f"it, auto serves {BUILTIN.choose(0).policy} at every budget)")
    group.add_argument("--kv-budget", type=int, default=None,
                       help="tokens kept per request, layer and KV head after each round (default 4096)")
    group.add_argument("--kv-recent", type=int, default=None,
                       help="recent window R: always kept, and the round interval; the budget must be a "
                            "multiple of it (default 64)")
    group.add_argument("--kv-seed", type=int, default=None,
                       help="one seed for the eviction noise of every request (reproducible runs); default: "
                            "each request draws its own, from its sampling_seed when given, else from its id. "
                            "A request's kv_seed overrides both")
    group.add_argument("--kv-telemetry", default="on", choices=SWITCH,
                       help="on (default): each request reports the attention its evicted tokens carried and "
                            "whether its output loops (meta_info, /kv_policy, /metrics); every evicting policy then "
                            "records the window queries. off: no signal, no loop detection")
    group.add_argument("--kv-stop-on-loop", action="store_true",
                       help="end a request whose output falls into a repetition loop (finish_reason type stop, "
                            "kv_loop true); a request's kv_stop_on_loop overrides it")
    group.add_argument("--kv-policy-config", default=None, metavar="JSON",
                       help="other policy fields as JSON, e.g. '{\"n_large\": 512, \"value_stat\": \"l2\"}'; "
                            f"fields: {', '.join(PolicyConfig.field_names())}")


def _flagged(exc: PolicyConfigError) -> PolicyConfigError:
    """Re-word an error with the flag the user would change."""
    field = exc.field_name
    name = FLAG_FOR_FIELD.get(field) or (
        "--kv-policy-config" if field == "kv_policy_config" else f"--kv-policy-config field {field!r}"
    )
    err = PolicyConfigError(field, exc.value, exc.allowed)
    err.args = (f"invalid {name} {exc.value!r}: {exc.allowed}",)
    return err


def config_from_flags(
    policy: str = "none",
    budget: int | None = None,
    recent: int | None = None,
    policy_config: str | Mapping[str, Any] | None = None,
) -> PolicyConfig:
    """Build the server's PolicyConfig from flag values (``None`` = not given)."""
    try:
        return _config_from_flags(policy, budget, recent, policy_config)
    except PolicyConfigError as exc:
        raise _flagged(exc) from None


def seed_from_flag(seed: Any) -> int | None:
    """``--kv-seed``: None (per-request seeds) or an integer in [0, 2**63)."""
    if seed is None:
        return None
    return _checked_seed("seed", seed, flag="--kv-seed")


def _checked_seed(field: str, seed: Any, flag: str | None = None) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _MAX_SEED:
        err = PolicyConfigError(field, seed, "must be an integer in [0, 2**63 - 1]")
        raise (_flagged(err) if flag else err)
    return seed


def _config_from_flags(
    policy: str,
    budget: int | None,
    recent: int | None,
    policy_config: str | Mapping[str, Any] | None,
) -> PolicyConfig:
    values: dict[str, Any] = {}
    if policy_config is not None:
        if isinstance(policy_config, str):
            try:
                parsed = json.loads(policy_config)
            except json.JSONDecodeError as exc:
                raise PolicyConfigError("kv_policy_config", policy_config,
                                        f"must be valid JSON ({exc.msg} at char {exc.pos})") from None
        else:
            parsed = dict(policy_config)
        if not isinstance(parsed, dict):
            raise PolicyConfigError("kv_policy_config", policy_config, "must be a JSON object")
        values.update(parsed)
    for name, value in (("budget", budget), ("recent", recent)):
        if value is not None:
            if name in values:
                raise PolicyConfigError(name, value, f"given both as {FLAG_FOR_FIELD[name]} and in --kv-policy-config")
            values[name] = value
    for name in ("policy", "seed"):
        if name in values:
            raise PolicyConfigError(name, values[name],
                                    f"set it with {FLAG_FOR_FIELD[name]}, not in --kv-policy-config")
    values["policy"] = policy
    return PolicyConfig.from_dict(values)


def auto_config(budget: int | None, recent: int | None, policy_config: str | Mapping[str, Any] | None,
                calibration: str | None, model_path: str | None) -> tuple[PolicyConfig, AutoTable]:
    """``--kv-policy auto``: the server's config (the choice at its budget) and the table.

    A calibration measured on another model, or with another ``--kv-recent``, is refused;
    without ``--kv-recent`` the calibration's R is used.
    """
    if calibration is None:
        table = BUILTIN
    else:
        fingerprint = _fingerprint(calibration, model_path)
        table = load_calibration(calibration, fingerprint)  # its errors already name --kv-calibration
        recent = _calibrated_recent(table, recent, calibration)
    base = config_from_flags(BUILTIN.choose(0).policy, budget, recent, policy_config)
    return base.replace(**table.choose(base.budget).changes), table


def server_options(policy: str | None, budget: Any = None, recent: Any = None, seed: Any = None,
                   policy_config: Any = None, calibration: str | None = None,
                   model_path: str | None = None) -> tuple[PolicyConfig, int | None, AutoTable | None]:
    """The server's config, ``--kv-seed`` and ``auto`` table from its flag values."""
    if policy == AUTO:
        cfg, table = auto_config(budget, recent, policy_config, calibration, model_path)
        return cfg, seed_from_flag(seed), table
    if calibration is not None:
        if (policy or "none") == "none":
            raise PolicyConfigError("kv_calibration", calibration,
                                    "estimates what eviction costs: start with an evicting --kv-policy")
        recent = _calibrated_recent(load_calibration(calibration, _fingerprint(calibration, model_path)), recent,
                                    calibration)
    return config_from_flags(policy or "none", budget, recent, policy_config), seed_from_flag(seed), None


def _fingerprint(calibration: str, model_path: str | None) -> str | None:
    try:
        return fingerprint_of_path(model_path) if model_path else None
    except (OSError, ValueError) as exc:
        raise PolicyConfigError("kv_calibration", calibration,
                                f"cannot read the model's config to check it ({exc})") from None


def _calibrated_recent(table: AutoTable, recent: Any, calibration: str) -> Any:
    """--kv-recent: the calibration's R when not given; a different one is refused (the
    signal and the policies' choices depend on R)."""
    if recent is None and table.recent is not None:
        return table.recent
    if table.recent is not None and recent != table.recent:
        raise PolicyConfigError("kv_calibration", calibration, f"it was measured with recent {table.recent}; "
                                f"start with --kv-recent {table.recent} or calibrate with --recent {recent}")
    return recent


def telemetry_options(cfg: PolicyConfig, telemetry: str | None = None, stop_on_loop: Any = None,
                      calibration: str | None = None, auto: bool = False) -> TelemetryOptions:
    """``--kv-telemetry``, ``--kv-stop-on-loop`` and the KL mappings of ``--kv-calibration``
    (already checked against the model by ``server_options``). Without ``auto`` the mappings
    are the file's only use, so a file that has none is refused."""
    if telemetry not in (None, *SWITCH):
        raise _flagged(PolicyConfigError("kv_telemetry", telemetry, f"must be one of {', '.join(SWITCH)}"))
    if stop_on_loop not in (None, True, False):
        raise PolicyConfigError("kv_stop_on_loop", stop_on_loop, "must be true or false")
    enabled = telemetry != "off"
    estimator = load_estimator(calibration) if calibration is not None and cfg.evicts else None
    if calibration is not None and estimator is None and not auto:
        raise PolicyConfigError("kv_calibration", calibration, "it holds no telemetry mapping (written by a "
                                "calibrate that did not measure the signal); run `python -m vase_sglang.calibrate` "
                                "again")
    if estimator is not None and not enabled:
        raise PolicyConfigError("kv_calibration", calibration, "its KL mappings need --kv-telemetry on")
    return TelemetryOptions(enabled, bool(stop_on_loop), estimator)


def server_reason(cfg: PolicyConfig, auto: AutoTable | None) -> str:
    """Why a request without ``kv_*`` fields runs the server's policy."""
    return auto.choose(cfg.budget).reason if auto is not None else f"server --kv-policy {cfg.policy}"


def export_config(cfg: PolicyConfig, seed: int | None = None, auto: AutoTable | None = None,
                  telemetry: TelemetryOptions | None = None) -> None:
    """Hand the server's policy, ``--kv-seed``, ``auto`` table and telemetry settings to
    every SGLang process it starts."""
    os.environ[ENV_CONFIG] = json.dumps({"config": cfg.to_dict(), "seed": seed,
                                         "auto": auto.to_dict() if auto is not None else None,
                                         "telemetry": (telemetry or TelemetryOptions()).to_dict()}, sort_keys=True)


def exported_config() -> PolicyConfig:
    """The server's config in any SGLang process (``none`` when nothing was exported).

    Called per request; parsed once per distinct value of the variable.
    """
    return _parse_exported(os.environ.get(ENV_CONFIG))[0]


def exported_seed() -> int | None:
    """The server's ``--kv-seed`` (None: each request draws its own)."""
    return _parse_exported(os.environ.get(ENV_CONFIG))[1]


def exported_auto() -> AutoTable | None:
    """The server's ``--kv-policy auto`` table (None when it runs one policy)."""
    return _parse_exported(os.environ.get(ENV_CONFIG))[2]


def exported_telemetry() -> TelemetryOptions:
    """The server's telemetry settings (``--kv-telemetry``, ``--kv-stop-on-loop``, KL mappings)."""
    return _parse_exported(os.environ.get(ENV_CONFIG))[3]


@functools.lru_cache(maxsize=4)
def _parse_exported(text: str | None) -> tuple[PolicyConfig, int | None, AutoTable | None, TelemetryOptions]:
    if not text:
        return PolicyConfig(policy="none"), None, None, TelemetryOptions()
    data = json.loads(text)
    auto = AutoTable.from_dict(data["auto"]) if data.get("auto") else None
    return (PolicyConfig.from_dict(data["config"]), data["seed"], auto,
            TelemetryOptions.from_dict(data.get("telemetry")))


def validate_request(server: PolicyConfig, custom_params: Mapping[str, Any] | None,
                     auto: AutoTable | None = None) -> tuple[PolicyConfig, int | None]:
    """The config one request runs with (the server's, changed by its ``custom_params``)
    and its explicit ``kv_seed`` (None when not given).

    On an ``auto`` server (``auto`` given), a request without ``kv_policy`` (or with
    ``kv_policy: "auto"``) runs the table's choice for its budget; ``kv_policy: "auto"``
    on another evicting server runs the built-in choice.

    Raises ``PolicyConfigError`` (an HTTP 400 for the client) for a bad or unknown
    ``kv_*`` field. Other keys are left alone: custom logit processors read them.
    """
    return validate_with_reason(server, custom_params, auto)[:2]


def validate_with_reason(server: PolicyConfig, custom_params: Mapping[str, Any] | None,
                         auto: AutoTable | None = None) -> tuple[PolicyConfig, int | None, str]:
    """``validate_request`` and why the request runs its policy."""
    if not custom_params:
        return server, None, server_reason(server, auto)
    if not isinstance(custom_params, Mapping):
        raise PolicyConfigError("custom_params", custom_params, "must be a JSON object")
    changes: dict[str, Any] = {}
    seed = None
    for key, value in custom_params.items():
        if key == VALIDATED_KEY:
            continue
        if key == "kv_recent":
            raise PolicyConfigError("kv_recent", value,
                                    f"cannot be set per request; the server runs with --kv-recent {server.recent}")
        if key == "kv_seed":
            seed = _checked_seed("kv_seed", value)
        elif key == STOP_ON_LOOP_KEY:
            stop_on_loop(custom_params, server)
        elif key in REQUEST_FIELDS:
            changes[REQUEST_FIELDS[key]] = value
        elif isinstance(key, str) and key.startswith("kv_"):
            close = difflib.get_close_matches(key, REQUEST_KEYS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise PolicyConfigError(key, value, f"unknown request field; {hint}fields: {', '.join(REQUEST_KEYS)}")
    if not changes:
        return server, seed, server_reason(server, auto)
    reason = "request kv_policy" if "policy" in changes else server_reason(server, auto)
    if changes.get("policy") == AUTO or (auto is not None and "policy" not in changes):
        budget = changes.get("budget", server.budget)
        if not isinstance(budget, int) or isinstance(budget, bool):
            raise PolicyConfigError("kv_budget", budget, "must be an integer")
        if changes.get("policy") == AUTO and not server.evicts:
            raise PolicyConfigError("kv_policy", AUTO,
                                    "the server runs with --kv-policy none; start it with an evicting policy")
        choice = (auto or BUILTIN).choose(budget)
        changes.update(choice.changes)
        reason = choice.reason
    policy = changes.get("policy", server.policy)
    if policy not in POLICY_NAMES:
        raise PolicyConfigError("kv_policy", policy, f"must be one of {', '.join(POLICY_NAMES)}")
    if policy != "none" and not server.evicts:
        raise PolicyConfigError("kv_policy", policy,
                                "the server runs with --kv-policy none; start it with an evicting policy")
    budget = changes.get("budget", server.budget)
    if isinstance(budget, int) and not isinstance(budget, bool) and budget > server.budget:
        raise PolicyConfigError("kv_budget", budget, f"must be <= the server's --kv-budget {server.budget}")
    try:
        cfg = server.replace(**changes)
    except PolicyConfigError as exc:
        field = next((k for k, v in REQUEST_FIELDS.items() if v == exc.field_name), exc.field_name)
        raise PolicyConfigError(field, exc.value, exc.allowed) from None
    telemetry = exported_telemetry().enabled
    if POLICIES[cfg.policy].needs_queries and not captures_queries(server, auto, telemetry):
        raise PolicyConfigError("kv_policy", policy, f"needs attention queries, which the server's --kv-policy "
                                f"{server.policy} does not capture with --kv-telemetry off; "
                                f"use one of {', '.join(QUERY_FREE)}")
    return cfg, seed, reason


def stop_on_loop(custom_params: Mapping[str, Any] | None, server: PolicyConfig) -> bool | None:
    """A request's ``kv_stop_on_loop`` (None when not given); only an evicting server detects loops."""
    if not isinstance(custom_params, Mapping) or STOP_ON_LOOP_KEY not in custom_params:
        return None
    value = custom_params[STOP_ON_LOOP_KEY]
    if not isinstance(value, bool):
        raise PolicyConfigError(STOP_ON_LOOP_KEY, value, "must be true or false")
    if not server.evicts:
        raise PolicyConfigError(STOP_ON_LOOP_KEY, value, "the server runs with --kv-policy none, which detects "
                                "no loops; start it with an evicting policy")
    return value


def captures_queries(server: PolicyConfig, auto: AutoTable | None = None, telemetry: bool = False) -> bool:
    """The server records queries: its policy reads them, ``auto`` may choose one that does,
    or the telemetry measures an evicting policy's rounds (it reads the window queries)."""
    if POLICIES[server.policy].needs_queries or (telemetry and server.evicts):
        return True
    return auto is not None and any(POLICIES[c["policy"]].needs_queries for c in auto.policies())


def reachable_policies(server: PolicyConfig, auto: AutoTable | None = None, telemetry: bool = False) -> list[str]:
    """Evicting policies a request may run on this server (its own ``kv_policy``, or
    ``auto``'s choice, which makes the server capture queries if it needs them): the ones
    that read queries only when the server captures them."""
    if not server.evicts:
        return []
    captures = captures_queries(server, auto, telemetry)
    return [name for name in EVICTING if captures or not POLICIES[name].needs_queries]


def keeps_state(server: PolicyConfig, auto: AutoTable | None = None, telemetry: bool = False) -> bool:
    """The server keeps a score state per request row: a policy a request may run carries
    scores across rounds (H2O, G-KV)."""
    return any(POLICIES[name].stateful for name in reachable_policies(server, auto, telemetry))


def request_config(server: PolicyConfig, custom_params: Mapping[str, Any] | None) -> PolicyConfig:
    """The config one request runs with; see ``validate_request``."""
    return validate_request(server, custom_params)[0]


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
