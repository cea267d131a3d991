"""User-facing options: the ``--kv-*`` server flags and the per-request fields.

Pure Python; the SGLang glue calls these. Errors are ``PolicyConfigError`` whose text
names the flag (or request field) as the user typed it.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
from typing import Any, Mapping

from .config import POLICY_NAMES, PolicyConfig, PolicyConfigError
from .policies import POLICIES

# The environment carries the server's policy to every SGLang process (scheduler,
# detokenizer, DP controller) and survives ``sglang.Engine(**kwargs)``.
ENV_CONFIG = "VASE_SGLANG_CONFIG"

FLAG_FOR_FIELD = {
    "policy": "--kv-policy",
    "budget": "--kv-budget",
    "recent": "--kv-recent",
    "seed": "--kv-seed",
}
# Per-request fields in sampling_params.custom_params.
REQUEST_FIELDS = {
    "kv_policy": "policy",
    "kv_budget": "budget",
    "kv_seed": "seed",
    "kv_n_large": "n_large",
}


def add_cli_flags(parser: argparse.ArgumentParser) -> None:
    """Add the ``--kv-*`` flags (shown in ``--help``) to an argparse parser."""
    group = parser.add_argument_group(
        "vase-sglang KV eviction",
        "Per-request decode-time KV eviction (VaSE and baselines). Prompts and shared "
        "prefixes stay in the radix tree; each request's generated tokens live in a fixed "
        "region of budget + recent slots per layer and KV head.",
    )
    group.add_argument("--kv-policy", default="none", choices=POLICY_NAMES,
                       help="KV eviction policy for generated tokens (default: none, stock SGLang)")
    group.add_argument("--kv-budget", type=int, default=None,
                       help="tokens kept per request, layer and KV head after each round (default 4096)")
    group.add_argument("--kv-recent", type=int, default=None,
                       help="recent window R: always kept, and the round interval; the budget must be a "
                            "multiple of it (default 64)")
    group.add_argument("--kv-seed", type=int, default=None, help="seed of the stochastic policies (default 0)")
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
    seed: int | None = None,
    policy_config: str | Mapping[str, Any] | None = None,
) -> PolicyConfig:
    """Build the server's PolicyConfig from flag values (``None`` = not given)."""
    try:
        return _config_from_flags(policy, budget, recent, seed, policy_config)
    except PolicyConfigError as exc:
        raise _flagged(exc) from None


def _config_from_flags(
    policy: str,
    budget: int | None,
    recent: int | None,
    seed: int | None,
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
    for name, value in (("budget", budget), ("recent", recent), ("seed", seed)):
        if value is not None:
            if name in values:
                raise PolicyConfigError(name, value, f"given both as {FLAG_FOR_FIELD[name]} and in --kv-policy-config")
            values[name] = value
    if "policy" in values:
        raise PolicyConfigError("policy", values["policy"], "set it with --kv-policy, not in --kv-policy-config")
    values["policy"] = policy
    return PolicyConfig.from_dict(values)


def export_config(cfg: PolicyConfig) -> None:
    os.environ[ENV_CONFIG] = json.dumps(cfg.to_dict(), sort_keys=True)


def exported_config() -> PolicyConfig:
    """The server's config in any SGLang process (``none`` when nothing was exported).

    Called per request; parsed once per distinct value of the variable.
    """
    return _parse_exported(os.environ.get(ENV_CONFIG))


@functools.lru_cache(maxsize=4)
def _parse_exported(text: str | None) -> PolicyConfig:
    return PolicyConfig(policy="none") if not text else PolicyConfig.from_json(text)


def request_config(server: PolicyConfig, custom_params: Mapping[str, Any] | None) -> PolicyConfig:
    """The config one request runs with: the server's, changed by its ``custom_params``.

    Raises ``PolicyConfigError`` (an HTTP 400 for the client) for a bad field.
    """
    if not custom_params:
        return server
    if not isinstance(custom_params, Mapping):
        raise PolicyConfigError("custom_params", custom_params, "must be a JSON object")
    changes: dict[str, Any] = {}
    for key, value in custom_params.items():
        if key == "kv_recent":
            raise PolicyConfigError("kv_recent", value, f"cannot be set per request; the server runs with --kv-recent {server.recent}")
        if key in REQUEST_FIELDS:
            changes[REQUEST_FIELDS[key]] = value
    if not changes:
        return server
    policy = changes.get("policy", server.policy)
    if policy not in POLICY_NAMES:
        raise PolicyConfigError("kv_policy", policy, f"must be one of {', '.join(POLICY_NAMES)}")
    if policy != "none" and not server.evicts:
        raise PolicyConfigError("kv_policy", policy, "the server runs with --kv-policy none; start it with an evicting policy")
    budget = changes.get("budget", server.budget)
    if isinstance(budget, int) and not isinstance(budget, bool) and budget > server.budget:
        raise PolicyConfigError("kv_budget", budget, f"must be <= the server's --kv-budget {server.budget}")
    try:
        cfg = server.replace(**changes)
    except PolicyConfigError as exc:
        field = next((k for k, v in REQUEST_FIELDS.items() if v == exc.field_name), exc.field_name)
        raise PolicyConfigError(field, exc.value, exc.allowed) from None
    if POLICIES[cfg.policy].needs_queries and not POLICIES[server.policy].needs_queries:
        raise PolicyConfigError("kv_policy", policy, f"needs attention queries, which the server's --kv-policy "
                                f"{server.policy} does not capture; use one of vase-dkv, curdkv, streamingllm, random, none")
    return cfg
