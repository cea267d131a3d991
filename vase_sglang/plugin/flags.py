"""The server's ``--kv-*`` flags: their definitions (shown in ``--help``) and the
server's settings built from their values (``server_settings``), validated once in the
main process.

Errors are ``PolicyConfigError`` whose text names the flag as the user typed it. The
result reaches SGLang's other processes through ``settings``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from ..config import POLICY_NAMES, PolicyConfig, PolicyConfigError
from ..registry import REGISTRY
from .auto import BUILTIN, AutoTable, fingerprint_of_path, load_calibration, load_estimator
from .options import AUTO, checked_seed
from .settings import ServerSettings
from .telemetry import SWITCH, TelemetryOptions

# The flags as keyword arguments (``sglang.Engine(kv_policy=...)``, ``sgl.Runtime``) and as
# the ``vars()`` of the parsed command line.
ENGINE_KWARGS = ("kv_policy", "kv_budget", "kv_recent", "kv_seed", "kv_policy_config", "kv_calibration",
                 "kv_telemetry", "kv_stop_on_loop", "kv_guards")

FLAG_FOR_FIELD = {
    "policy": "--kv-policy",
    "budget": "--kv-budget",
    "recent": "--kv-recent",
    "seed": "--kv-seed",
    "kv_calibration": "--kv-calibration",
    "kv_telemetry": "--kv-telemetry",
    "kv_guards": "--kv-guards",
}


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
    group.add_argument("--kv-guards", default="on", choices=SWITCH,
                       help="on (default): vase-sglang's HTTP hardening (docs/reliability.md): malformed request "
                            "bodies, token ids outside the vocabulary, unknown parser names and bad Ollama requests "
                            "get an HTTP 400 instead of a 500 or a dead scheduler, and a SIGTERM drain is bounded. "
                            "off: SGLang's own handling; with --kv-policy none as well, the plugin installs nothing "
                            "but its flag parser")
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
        values = PolicyConfig.parse_fields(policy_config) if policy_config is not None else {}
        for name, value in (("budget", budget), ("recent", recent)):
            if value is not None:
                if name in values:
                    raise PolicyConfigError(name, value,
                                            f"given both as {FLAG_FOR_FIELD[name]} and in --kv-policy-config")
                values[name] = value
        for name in ("policy", "seed"):
            if name in values:
                raise PolicyConfigError(name, values[name],
                                        f"set it with {FLAG_FOR_FIELD[name]}, not in --kv-policy-config")
        return PolicyConfig.from_dict({**values, "policy": policy})
    except PolicyConfigError as exc:
        raise _flagged(exc) from None


def seed_from_flag(seed: Any) -> int | None:
    """``--kv-seed``: None (per-request seeds) or an integer in [0, 2**63)."""
    if seed is None:
        return None
    try:
        return checked_seed("seed", seed)
    except PolicyConfigError as exc:
        raise _flagged(exc) from None


def server_settings(flags: Mapping[str, Any], model_path: str | None = None) -> ServerSettings:
    """The server's settings from its ``kv_*`` flag values (keyed as ``ENGINE_KWARGS``;
    None or absent: not given): its config and ``auto`` table (``server_config``), its
    ``--kv-seed``, telemetry and ``--kv-guards``."""
    cfg, auto = server_config(flags, model_path)
    seed = seed_from_flag(flags.get("kv_seed"))
    telemetry = telemetry_options(cfg, flags.get("kv_telemetry"), flags.get("kv_stop_on_loop"),
                                  flags.get("kv_calibration"), auto=auto is not None)
    return ServerSettings(cfg, seed, auto, telemetry, guards_enabled(flags.get("kv_guards")))


def server_config(flags: Mapping[str, Any], model_path: str | None = None) -> tuple[PolicyConfig, AutoTable | None]:
    """The server's PolicyConfig and, with ``--kv-policy auto``, its table.

    Each config field comes from its flag, else from ``--kv-policy-config`` (a field given
    both ways is refused), else the default; ``--kv-recent`` alone may also come from the
    ``--kv-calibration`` file, which refuses another R. With ``--kv-policy auto`` the
    server's own config is ``auto``'s choice at ``--kv-budget``.
    """
    policy = flags.get("kv_policy") or "none"
    calibration = flags.get("kv_calibration")
    table = _calibration(policy, calibration, model_path)
    recent = flags.get("kv_recent")
    if table is not None:
        recent = _calibrated_recent(table, recent, str(calibration))
    auto = (table or BUILTIN) if policy == AUTO else None
    cfg = config_from_flags(BUILTIN.choose(0).policy if auto is not None else policy, flags.get("kv_budget"),
                            recent, flags.get("kv_policy_config"))
    if auto is not None:
        cfg = cfg.replace(**auto.choose(cfg.budget).changes)
    return cfg, auto


def _calibration(policy: str, calibration: str | None, model_path: str | None) -> AutoTable | None:
    """The ``--kv-calibration`` file's table, checked against the model (None: no file)."""
    if calibration is None:
        return None
    if policy == "none":
        raise PolicyConfigError("kv_calibration", calibration,
                                "estimates what eviction costs: start with an evicting --kv-policy")
    # load_calibration's errors already name --kv-calibration
    return load_calibration(calibration, _fingerprint(calibration, model_path))


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


def guards_enabled(value: str | None) -> bool:
    """``--kv-guards`` (None: not given, on)."""
    if value not in (None, *SWITCH):
        raise _flagged(PolicyConfigError("kv_guards", value, f"must be one of {', '.join(SWITCH)}"))
    return value != "off"


def telemetry_options(cfg: PolicyConfig, telemetry: str | None = None, stop_on_loop: Any = None,
                      calibration: str | None = None, auto: bool = False) -> TelemetryOptions:
    """``--kv-telemetry``, ``--kv-stop-on-loop`` and the KL mappings of ``--kv-calibration``
    (already checked against the model by ``server_settings``). Without ``auto`` the mappings
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
