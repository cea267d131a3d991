"""Register SGLang hooks on named targets and verify that each one took effect.

Every target must be listed in ``manifest.MANIFEST`` with the same kind; before a hook
is applied its target is checked against that entry (it exists, same parameters, same
pinned source). SGLang's ``HookRegistry.apply_hooks`` only logs a failed patch, and
``load_plugins`` only logs an exception raised by a plugin. A plugin that half-applied
would serve wrong results silently, so every hook registered here is checked after it
is applied and any failure stops the process with ``SystemExit`` (which neither swallows).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from . import manifest

logger = logging.getLogger("vase_sglang.patches")

BEFORE, AFTER, AROUND, REPLACE = HookType.BEFORE, HookType.AFTER, HookType.AROUND, HookType.REPLACE


@dataclass
class Hook:
    target: str
    fn: Callable[..., Any]
    kind: HookType


_pending: list[Hook] = []


_KIND_NAMES = {BEFORE: manifest.BEFORE, AFTER: manifest.AFTER, AROUND: manifest.AROUND, REPLACE: manifest.REPLACE}


def hook(target: str, kind: HookType) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: queue ``fn`` as a ``kind`` hook on the dotted ``target`` (listed in the manifest)."""
    entry = manifest.BY_TARGET.get(target)
    if entry is None or entry.kind != _KIND_NAMES[kind]:
        raise ValueError(f"hook target {target} ({_KIND_NAMES[kind]}) is not in patches/manifest.py with that kind")

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        _pending.append(Hook(target, fn, kind))
        return fn

    return deco


def fail(message: str) -> None:
    """Stop the process loudly; SGLang's plugin loader would swallow an Exception."""
    print(f"vase-sglang: {message}", file=sys.stderr, flush=True)
    logger.critical(message)
    raise SystemExit(f"vase-sglang: {message}")


def check_contract(target: str) -> None:
    """Stop the process if ``target`` no longer matches its manifest entry."""
    try:
        manifest.check(manifest.BY_TARGET[target])
    except manifest.ContractError as exc:
        fail(f"{exc}; vase-sglang needs sglang=={manifest.SGLANG_VERSION}")


def apply(hooks: list[Hook]) -> None:
    """Check, register, apply and verify ``hooks``; exit if any did not take."""
    for h in hooks:
        check_contract(h.target)
    for h in hooks:
        HookRegistry.register(h.target, h.fn, h.kind)
    HookRegistry.apply_hooks()
    for h in hooks:
        current = manifest.resolve(h.target)
        if h.target not in HookRegistry._patched or not hasattr(current, "__wrapped__"):
            fail(f"hook on {h.target} did not take effect (see the log above); "
                 f"vase-sglang needs sglang=={manifest.SGLANG_VERSION}")
    logger.info("vase-sglang: %d hooks applied and verified", len(hooks))


def take(prefix_filter: Callable[[Hook], bool] | None = None) -> list[Hook]:
    """The hooks queued so far (by importing patch modules), optionally filtered."""
    return [h for h in _pending if prefix_filter is None or prefix_filter(h)]
