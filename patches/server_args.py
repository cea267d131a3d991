"""Server arguments: the ``--kv-*`` flags, ``sglang.Engine(kv_policy=...)`` and validation.

Hooks (main process):

* ``arg_utils.add_cli_args_from_dataclass`` AFTER: add the flags to SGLang's parser, so
  they show in ``--help`` and argparse checks ``--kv-policy`` choices.
* ``server_args.prepare_server_args`` AROUND: build the PolicyConfig from the flags,
  export it to the child processes, and turn off what v1 cannot run with.
* ``validation_hook.check_server_args`` AFTER: reject unsupported combinations, reading
  the resolved values.
* ``Engine.server_args_class``: a factory that takes the same fields as keyword args.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from typing import Any

from vase_sglang.config import PolicyConfig, PolicyConfigError
from vase_sglang.options import add_cli_flags, config_from_flags, export_config, exported_config, seed_from_flag

from .hooks import AFTER, AROUND, fail, hook

logger = logging.getLogger("vase_sglang.patches.server_args")

SUPPORTED_BACKENDS = ("torch_native", "triton", "flashinfer")
SUPPORTED_KV_DTYPES = ("auto", "bfloat16", "bf16", "float16", "fp16", "float32")
# Query-ring rows are allocated per request slot; without a user value, cap the slots.
DEFAULT_MAX_RUNNING_REQUESTS = 128
ENGINE_KWARGS = ("kv_policy", "kv_budget", "kv_recent", "kv_seed", "kv_policy_config")


@hook("sglang.srt.arg_groups.arg_utils.add_cli_args_from_dataclass", AFTER)
def _add_flags(result: Any, parser: argparse.ArgumentParser, cls: type, *args: Any, **kwargs: Any) -> None:
    if getattr(cls, "__name__", "") == "ServerArgs" and kwargs.get("fields") is None:
        if not any(a.dest == "kv_policy" for a in parser._actions):
            add_cli_flags(parser)


def _parse_flags(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(add_help=False)
    add_cli_flags(parser)
    ns, _ = parser.parse_known_args(argv)
    return ns


BACKEND_FIELDS = ("attention_backend", "decode_attention_backend", "prefill_attention_backend")


def default_attention_backend(device: str | None, cuda_available: bool, has_flashinfer: bool) -> str | None:
    """The backend to run with when the user named none; None leaves SGLang's choice.

    SGLang's own default is fa3 on Hopper and trtllm_mha on Blackwell for MHA models,
    which the eviction path does not hook: pick flashinfer where it imports, else triton
    (and torch_native on CPU), instead of refusing to start.
    """
    device = device or ("cuda" if cuda_available else "cpu")
    if device == "cpu":
        return "torch_native"
    if device == "cuda":
        return "flashinfer" if has_flashinfer else "triton"
    return None


def _reader(given: Any) -> Callable[[str], Any]:
    """Field values of server args, or of a dict of their keyword arguments."""
    return given.get if isinstance(given, dict) else lambda name: getattr(given, name, None)


def choose_attention_backend(given: Any, cfg: PolicyConfig) -> str | None:
    """For an evicting policy with no backend flag in ``given`` (server args, or a dict of
    keyword arguments): the backend to set, logged; None when the user chose one."""
    value = _reader(given)
    if not cfg.evicts or any(value(name) for name in BACKEND_FIELDS):
        return None
    import importlib.util

    import torch

    backend = default_attention_backend(value("device"), torch.cuda.is_available(),
                                        importlib.util.find_spec("flashinfer") is not None)
    if backend is not None:
        logger.info("vase-sglang: --kv-policy %s runs with --attention-backend %s (none was given; SGLang's "
                    "default may be one the eviction path does not support)", cfg.policy, backend)
    return backend


def policy_overrides(given: Any, cfg: PolicyConfig) -> dict[str, Any]:
    """The server fields an evicting policy needs changed, given the user's values (server
    args, or a dict of their keyword arguments, as ``sgl.Runtime`` takes them)."""
    if not cfg.evicts:
        return {}
    value = _reader(given)
    changes: dict[str, Any] = {}
    backend = choose_attention_backend(given, cfg)
    if backend is not None:
        changes["attention_backend"] = backend
    if not value("disable_overlap_schedule"):
        # Rounds move KV data in the scheduler; the overlapped forward would still read it.
        changes["disable_overlap_schedule"] = True
        logger.info("vase-sglang: --kv-policy %s turns off the overlap scheduler", cfg.policy)
    if value("max_running_requests") is None:
        changes["max_running_requests"] = DEFAULT_MAX_RUNNING_REQUESTS
    return changes


def _adjust_for_policy(server_args: Any, cfg: PolicyConfig) -> None:
    """Input changes v1 needs, made before resolution seals the record."""
    for name, value in policy_overrides(server_args, cfg).items():
        setattr(server_args, name, value)


def options_or_exit(policy: str | None, budget: Any, recent: Any, seed: Any,
                    policy_config: Any) -> tuple[PolicyConfig, int | None]:
    """The server's policy and --kv-seed from flag values; a bad one stops the process."""
    try:
        return config_from_flags(policy or "none", budget, recent, policy_config), seed_from_flag(seed)
    except PolicyConfigError as exc:
        fail(str(exc))
        raise  # unreachable


@hook("sglang.srt.server_args.prepare_server_args", AROUND)
def _prepare_server_args(original, argv: list[str], *args: Any, **kwargs: Any) -> Any:
    ns = _parse_flags(list(argv))
    cfg, seed = options_or_exit(ns.kv_policy, ns.kv_budget, ns.kv_recent, ns.kv_seed, ns.kv_policy_config)
    server_args = original(argv, *args, **kwargs)
    export_config(cfg, seed)
    _adjust_for_policy(server_args, cfg)
    if cfg.evicts:
        logger.info("vase-sglang: KV policy %s, --kv-seed %s", cfg.to_dict(), "per request" if seed is None else seed)
    return server_args


def engine_server_args(server_args_class: type):
    """``Engine.server_args_class`` replacement: accepts the ``kv_*`` keyword arguments."""

    def factory(**kwargs: Any) -> Any:
        flags = {name: kwargs.pop(name, None) for name in ENGINE_KWARGS}
        cfg, seed = options_or_exit(flags["kv_policy"], flags["kv_budget"], flags["kv_recent"], flags["kv_seed"],
                                    flags["kv_policy_config"])
        server_args = server_args_class(**kwargs)
        export_config(cfg, seed)
        _adjust_for_policy(server_args, cfg)
        return server_args

    factory.__wrapped__ = server_args_class  # type: ignore[attr-defined]  # verified like the registry's hooks
    factory.__name__ = "vase_server_args_factory"
    return factory


def unsupported_reasons(cfg: Any) -> list[str]:
    """What a resolved server config has that the eviction path cannot run with."""
    reasons = []
    if getattr(cfg, "speculative_algorithm", None):
        reasons.append(f"--speculative-algorithm {cfg.speculative_algorithm} (speculative decoding)")
    if getattr(cfg, "pp_size", 1) > 1:
        reasons.append(f"--pp-size {cfg.pp_size} (pipeline parallelism)")
    if getattr(cfg, "enable_mixed_chunk", False):
        reasons.append("--enable-mixed-chunk (mixed prefill/decode batches)")
    if getattr(cfg, "page_size", 1) not in (None, 1):
        reasons.append(f"--page-size {cfg.page_size} (only 1 is supported)")
    if getattr(cfg, "disaggregation_mode", "null") not in (None, "null"):
        reasons.append(f"--disaggregation-mode {cfg.disaggregation_mode}")
    if getattr(cfg, "enable_hierarchical_cache", False):
        reasons.append("--enable-hierarchical-cache")
    if getattr(cfg, "kv_cache_dtype", "auto") not in SUPPORTED_KV_DTYPES:
        reasons.append(f"--kv-cache-dtype {cfg.kv_cache_dtype} (quantised KV)")
    for name in ("attention_backend", "decode_attention_backend"):
        backend = getattr(cfg, name, None)
        if backend is not None and backend not in SUPPORTED_BACKENDS:
            flag = "--" + name.replace("_", "-")
            reasons.append(f"{flag} {backend} (supported: {', '.join(SUPPORTED_BACKENDS)})")
    return reasons


@hook("sglang.srt.arg_groups.validation_hook.check_server_args", AFTER)
def _check_server_args(result: Any, server_args: Any, *args: Any, **kwargs: Any) -> None:
    cfg = exported_config()
    if not cfg.evicts:
        return
    from sglang.srt.arg_groups.model_override_base import resolving_view

    reasons = unsupported_reasons(resolving_view(server_args))
    if reasons:
        fail(f"--kv-policy {cfg.policy} cannot run with: " + "; ".join(reasons))
