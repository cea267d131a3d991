"""Server arguments: the ``--kv-*`` flags, ``sglang.Engine(kv_policy=...)`` and validation.

Hooks (main process):

* ``arg_utils.add_cli_args_from_dataclass`` AFTER: add the flags to SGLang's parser, so
  they show in ``--help`` and argparse checks ``--kv-policy`` choices.
* ``server_args.prepare_server_args`` AROUND: build the PolicyConfig from the flags,
  export it to the child processes, and turn off what an evicting policy cannot run with.
* ``validation_hook.check_server_args`` AFTER: reject unsupported combinations, reading
  the resolved values.
* ``Engine.server_args_class``: a factory that takes the same fields as keyword args.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from vase_sglang.config import PolicyConfig, PolicyConfigError
from vase_sglang.plugin import contract as sg
from vase_sglang.plugin.flags import ENGINE_KWARGS, add_cli_flags, server_settings
from vase_sglang.plugin.settings import ServerSettings, export_settings, imported_settings

from .backends import SUPPORTED_BACKENDS
from .entry import install_main
from .hooks import AFTER, AROUND, fail, hook, installs

logger = logging.getLogger("vase_sglang.patches.server_args")

SUPPORTED_KV_DTYPES = ("auto", "bfloat16", "bf16", "float16", "fp16", "float32")
# Query-ring rows are allocated per request slot; without a user value, cap the slots.
DEFAULT_MAX_RUNNING_REQUESTS = 128
POST_CAPTURE_KV_SIZING = "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING"


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
    """Field values of server args (every field is there: a renamed one raises), or of a
    dict of their keyword arguments (only what the user gave)."""
    return given.get if isinstance(given, dict) else lambda name: getattr(given, name)


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
    if not value("disable_prefill_cuda_graph") and value("cuda_graph_backend_prefill") is None:
        # SGLang captures prefills in breakable CUDA graphs by default on CUDA; the hook that
        # records a prefill's last R queries syncs with the host, so prefills run eagerly.
        # Decode graphs stay on.
        changes["disable_prefill_cuda_graph"] = True
    return changes


def _adjust_for_policy(server_args: Any, cfg: PolicyConfig) -> None:
    """Apply ``policy_overrides`` (what an evicting policy needs changed) before resolution seals the record."""
    for name, value in policy_overrides(server_args, cfg).items():
        setattr(server_args, name, value)


def settings_or_exit(flags: Mapping[str, Any], model_path: str | None) -> ServerSettings:
    """``flags.server_settings``; a bad flag stops the process, naming it."""
    try:
        return server_settings(flags, model_path)
    except PolicyConfigError as exc:
        fail(str(exc))


@hook("sglang.srt.server_args.prepare_server_args", AROUND)
def _prepare_server_args(original, argv: list[str], *args: Any, **kwargs: Any) -> Any:
    ns = _parse_flags(list(argv))
    server_args = original(argv, *args, **kwargs)
    settings = settings_or_exit(vars(ns), getattr(server_args, "model_path", None))
    export_settings(settings)
    install_main(settings)  # the parts the flags switch on (the flag parser is in already)
    cfg, seed, auto, telemetry = settings.config, settings.seed, settings.auto, settings.telemetry
    _adjust_for_policy(server_args, cfg)
    if cfg.evicts:
        logger.info("vase-sglang: KV policy %s, --kv-seed %s", cfg.to_dict(), "per request" if seed is None else seed)
        est = telemetry.estimator
        logger.info("vase-sglang: --kv-telemetry %s, --kv-stop-on-loop %s%s", "on" if telemetry.enabled else "off",
                    telemetry.stop_on_loop, f", kv_estimated_kl from {est.source} ({est.statistic}, "
                    f"{'per (policy, budget)' if est.per_config else 'model-wide'} mappings)" if est else "")
    if auto is not None:
        logger.info("vase-sglang: --kv-policy auto from %s: %s; at --kv-budget %d: %s", auto.source,
                    {b: c.get("label") or c["policy"] for b, c in sorted(auto.by_budget.items())} or "built-in",
                    cfg.budget, auto.choose(cfg.budget).reason)
    return server_args


@installs("sglang.srt.entrypoints.engine.Engine.server_args_class")
def _install_engine_factory() -> None:
    """``sglang.Engine(kv_policy=..., ...)``: the Engine builds its ServerArgs through the
    factory below, which takes the ``kv_*`` keyword arguments."""
    from sglang.srt.entrypoints.engine import Engine

    if getattr(Engine.server_args_class, "__name__", "") != "vase_server_args_factory":
        # staticmethod: Engine.__init__ calls it through self.
        Engine.server_args_class = staticmethod(engine_server_args(Engine.server_args_class))
    if getattr(Engine.server_args_class, "__name__", "") != "vase_server_args_factory":
        fail("could not install the kv_* keyword arguments on sglang.Engine.server_args_class")


def engine_server_args(server_args_class: type):
    """``Engine.server_args_class`` replacement: accepts the ``kv_*`` keyword arguments."""

    def factory(**kwargs: Any) -> Any:
        flags = {name: kwargs.pop(name, None) for name in ENGINE_KWARGS}
        settings = settings_or_exit(flags, kwargs.get("model_path"))
        server_args = server_args_class(**kwargs)
        export_settings(settings)
        install_main(settings)
        _adjust_for_policy(server_args, settings.config)
        return server_args

    factory.__wrapped__ = server_args_class  # type: ignore[attr-defined]  # verified like the registry's hooks
    factory.__name__ = "vase_server_args_factory"
    return factory


def unsupported_reasons(cfg: sg.ServerArgs, environ: Mapping[str, str] = os.environ) -> list[str]:
    """What a resolved server config (and the environment) has that the eviction path cannot run with."""
    reasons = []
    if cfg.speculative_algorithm:
        reasons.append(f"--speculative-algorithm {cfg.speculative_algorithm} (speculative decoding)")
    if cfg.pp_size > 1:
        reasons.append(f"--pp-size {cfg.pp_size} (pipeline parallelism)")
    if cfg.enable_mixed_chunk:
        reasons.append("--enable-mixed-chunk (mixed prefill/decode batches)")
    if cfg.page_size not in (None, 1):
        reasons.append(f"--page-size {cfg.page_size} (only 1 is supported)")
    if cfg.disaggregation_mode not in (None, "null"):
        reasons.append(f"--disaggregation-mode {cfg.disaggregation_mode}")
    if cfg.enable_hierarchical_cache:
        reasons.append("--enable-hierarchical-cache")
    if cfg.kv_cache_dtype not in SUPPORTED_KV_DTYPES:
        reasons.append(f"--kv-cache-dtype {cfg.kv_cache_dtype} (quantised KV)")
    for name in ("attention_backend", "decode_attention_backend"):
        backend = getattr(cfg, name)
        if backend is not None and backend not in SUPPORTED_BACKENDS:
            flag = "--" + name.replace("_", "-")
            reasons.append(f"{flag} {backend} (supported: {', '.join(SUPPORTED_BACKENDS)})")
    prefill_graph = cfg.cuda_graph_backend_prefill
    if prefill_graph is not None and str(getattr(prefill_graph, "value", prefill_graph)) != "disabled":
        reasons.append(f"--cuda-graph-backend-prefill {getattr(prefill_graph, 'value', prefill_graph)} "
                       "(the prefill query hook cannot be captured; decode CUDA graphs are supported)")
    if environ.get(POST_CAPTURE_KV_SIZING, "").strip().lower() in ("1", "true", "yes", "on"):
        # The pool's per-layer buffers are then backed after graph capture, not one allocation.
        reasons.append(f"{POST_CAPTURE_KV_SIZING}=1 (KV buffers sized after graph capture)")
    return reasons


@hook("sglang.srt.arg_groups.validation_hook.check_server_args", AFTER)
def _check_server_args(result: Any, server_args: Any, *args: Any, **kwargs: Any) -> None:
    cfg = imported_settings().config
    if not cfg.evicts:
        return
    from sglang.srt.arg_groups.model_override_base import resolving_view

    reasons = unsupported_reasons(resolving_view(server_args))
    if reasons:
        fail(f"--kv-policy {cfg.policy} cannot run with: " + "; ".join(reasons))
