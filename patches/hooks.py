"""Register SGLang hooks on named targets and verify that each one took effect.

Each manifest entry owns one function: the patch modules register a hook with ``@hook``
(BEFORE, AFTER, AROUND, REPLACE) or an installer with ``@installs`` (SET), and refuse a
target that is not listed with that kind. ``install(process)`` is the one loop that
applies them, over the manifest entries of that process. Before a hook is applied its
target is checked against its entry (it exists, same parameters, same pinned source);
so are the process's ``call`` and ``mirror`` entries, which own no function here.
SGLang's ``HookRegistry.apply_hooks`` only logs a failed patch, and ``load_plugins``
only logs an exception raised by a plugin. A plugin that half-applied would serve wrong
results silently, so every hook is checked after it is applied and any failure stops
the process with ``SystemExit`` (which neither swallows).
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from vase_sglang.plugin import contract as sg

from . import manifest

logger = logging.getLogger("vase_sglang.patches")

_types: sg.HookType = HookType
BEFORE, AFTER, AROUND, REPLACE = _types.BEFORE, _types.AFTER, _types.AROUND, _types.REPLACE
# SGLang's registry, through the attributes vase_sglang/plugin/contract.py declares (its _patched too).
_registry: sg.HookRegistry = HookRegistry


# Each manifest target's hook function, or for a SET target its installer (a function of
# no arguments that makes the assignment and checks it took); filled by importing the
# patch modules, whose decorators register here.
_registered: dict[str, Callable[..., Any]] = {}
_KIND_NAMES = {BEFORE: manifest.BEFORE, AFTER: manifest.AFTER, AROUND: manifest.AROUND, REPLACE: manifest.REPLACE}
_REGISTRY_KINDS = {name: kind for kind, name in _KIND_NAMES.items()}


def _register(target: str, fn: Callable[..., Any]) -> None:
    if _registered.get(target, fn) is not fn:
        raise ValueError(f"{target} has two hooks: {_registered[target].__qualname__} and {fn.__qualname__}")
    _registered[target] = fn


def hook(target: str, kind: HookType) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: ``fn`` is the ``kind`` hook on the dotted ``target`` (listed in the manifest)."""
    name = _KIND_NAMES[kind]
    manifest_entry_or_refuse(target, name)

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        _register(target, fn)
        return fn

    return deco


def installs(target: str) -> Callable[[Callable[[], None]], Callable[[], None]]:
    """Decorator: ``fn()`` assigns the SET ``target`` (listed in the manifest) and checks
    that the assignment took, calling ``fail`` if not."""
    manifest_entry_or_refuse(target, manifest.SET)

    def deco(fn: Callable[[], None]) -> Callable[[], None]:
        _register(target, fn)
        return fn

    return deco


def manifest_entry_or_refuse(target: str, kind: str) -> manifest.Target:
    entry = manifest.BY_TARGET.get(target)
    if entry is None or entry.kind != kind:
        raise ValueError(f"hook target {target} ({kind}) is not in patches/manifest.py with that kind")
    return entry


def fail(message: str) -> NoReturn:
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


def import_patch_modules() -> None:
    """Import every module of ``vase_sglang.patches``: their decorators register the hooks."""
    import vase_sglang.patches as package

    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{info.name}")


def entries_for(process: str, parts: tuple[str, ...] = manifest.PARTS) -> list[manifest.Target]:
    """The manifest entries this process applies or checks for ``parts``: its own, where
    their package is installed. Role entries are not among them: ``plugin/__init__.py``
    reads them to choose the process, before anything is installed."""
    return [e for e in manifest.MANIFEST
            if e.process == process and e.part in parts and e.kind != manifest.ROLE and manifest.available(e)]


# (process, part) pairs already installed here: the main process installs its flag parser
# first and the other parts once the flags are read.
_installed: set[tuple[str, str]] = set()


def registered_targets() -> set[str]:
    """The targets a hook (or installer) is registered for."""
    return set(_registered)


def registered_function(target: str) -> Callable[..., Any]:
    """The hook (or installer) registered for ``target``; KeyError if none."""
    return _registered[target]


def install(process: str, parts: tuple[str, ...] = manifest.PARTS) -> int:
    """Apply every manifest entry of ``process`` ("main", "scheduler" or "controller") in ``parts`` not
    installed yet: check each target against its entry, register and apply the hooks,
    verify that each took effect, then run the installers of the SET targets. Exits the
    process on any failure. Returns the number of hooks and installers applied."""
    import_patch_modules()
    parts = tuple(p for p in parts if (process, p) not in _installed)
    if not parts:
        return 0
    _installed.update((process, p) for p in parts)
    entries = entries_for(process, parts)
    missing = [e.target for e in entries if e.kind in manifest.APPLIED and e.target not in _registered]
    if missing:
        fail(f"no hook registered for manifest target(s) {', '.join(missing)}")
    for e in entries:
        check_contract(e.target)
    hooks = [e for e in entries if e.kind in _REGISTRY_KINDS]
    for e in hooks:
        _registry.register(e.target, _registered[e.target], _REGISTRY_KINDS[e.kind])
    _registry.apply_hooks()
    for e in hooks:
        current = manifest.resolve(e.target)
        if e.target not in _registry._patched or not hasattr(current, "__wrapped__"):
            fail(f"hook on {e.target} did not take effect (see the log above); "
                 f"vase-sglang needs sglang=={manifest.SGLANG_VERSION}")
    installers = [e for e in entries if e.kind == manifest.SET]
    for e in installers:
        _registered[e.target]()
    logger.info("vase-sglang: %d hooks and %d installers applied and verified (%s process, %s)", len(hooks),
                len(installers), process, ", ".join(parts))
    return len(hooks) + len(installers)
