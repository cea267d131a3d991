"""Register SGLang hooks on named targets and verify that each one took effect.

SGLang's ``HookRegistry.apply_hooks`` only logs a failed patch, and ``load_plugins``
only logs an exception raised by a plugin. A plugin that half-applied would serve
wrong results silently, so every hook registered here is checked after it is applied
and any failure stops the process with ``SystemExit`` (which neither swallows).
"""

from __future__ import annotations

import logging
import pkgutil
import sys
from dataclasses import dataclass
from typing import Any, Callable

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

logger = logging.getLogger("vase_sglang.patches")

BEFORE, AFTER, AROUND, REPLACE = HookType.BEFORE, HookType.AFTER, HookType.AROUND, HookType.REPLACE


@dataclass
class Hook:
    target: str
    fn: Callable[..., Any]
    kind: HookType


_pending: list[Hook] = []


def hook(target: str, kind: HookType) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: queue ``fn`` as a ``kind`` hook on the dotted ``target``."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        _pending.append(Hook(target, fn, kind))
        return fn

    return deco


def fail(message: str) -> None:
    """Stop the process loudly; SGLang's plugin loader would swallow an Exception."""
    print(f"vase-sglang: {message}", file=sys.stderr, flush=True)
    logger.critical(message)
    raise SystemExit(f"vase-sglang: {message}")


def _resolved(target: str) -> Any:
    module_path, _, attr = target.rpartition(".")
    owner = pkgutil.resolve_name(module_path)
    raw = getattr(owner, "__dict__", {}).get(attr, getattr(owner, attr, None))
    return getattr(raw, "__func__", raw)  # classmethod / staticmethod


def apply(hooks: list[Hook]) -> None:
    """Register, apply and verify ``hooks``; exit if any did not take."""
    for h in hooks:
        HookRegistry.register(h.target, h.fn, h.kind)
    HookRegistry.apply_hooks()
    for h in hooks:
        try:
            current = _resolved(h.target)
        except Exception as exc:  # noqa: BLE001 - any import failure is fatal here
            fail(f"hook target {h.target} cannot be resolved ({type(exc).__name__}: {exc}); "
                 "vase-sglang needs sglang==0.5.23")
        if h.target not in HookRegistry._patched or not hasattr(current, "__wrapped__"):
            fail(f"hook on {h.target} did not take effect (see the log above); vase-sglang needs sglang==0.5.23")
    logger.info("vase-sglang: %d hooks applied and verified", len(hooks))


def take(prefix_filter: Callable[[Hook], bool] | None = None) -> list[Hook]:
    """The hooks queued so far (by importing patch modules), optionally filtered."""
    return [h for h in _pending if prefix_filter is None or prefix_filter(h)]
