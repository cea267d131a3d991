"""``sgl.Runtime(kv_policy=...)``: the ``kv_*`` keyword arguments for SGLang's frontend runtime.

``sgl.Runtime`` builds ``ServerArgs`` in the user's process before any SGLang plugin is
loaded there, so the plugin cannot add the arguments the way it does for
``launch_server`` and ``sgl.Engine``. ``vase_sglang_frontend.pth`` (run at interpreter
start-up) adds a one-shot post-import hook: when ``sglang.lang.backend.runtime_endpoint``
is first imported, ``Runtime.__init__`` is wrapped so that it takes the ``kv_*`` keyword
arguments (``plugin.flags.ENGINE_KWARGS``), validates them (a
``PolicyConfigError``, i.e. ``ValueError``, for a bad one), exports the policy to the
server it spawns, and applies the same server defaults as the flags (overlap scheduler
off, ``max_running_requests`` 128). The server process then loads the plugin as usual.

Nothing heavy (no torch, no sglang) is imported until a ``Runtime`` is constructed.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from typing import Any

TARGET_MODULE = "sglang.lang.backend.runtime_endpoint"


def runtime_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take the ``kv_*`` arguments out of ``kwargs``, export the policy, return the rest."""
    from vase_sglang.plugin.flags import ENGINE_KWARGS, server_settings
    from vase_sglang.plugin.settings import export_settings

    from .server_args import policy_overrides

    flags = {name: kwargs.pop(name, None) for name in ENGINE_KWARGS}
    settings = server_settings(flags, kwargs.get("model_path"))
    export_settings(settings)  # the spawned server and its schedulers inherit the environment
    # What the flags path does to ServerArgs, given here before Runtime builds them.
    return kwargs | policy_overrides(kwargs, settings.config)


def patch_runtime(runtime_cls: type) -> None:
    original = runtime_cls.__init__  # type: ignore[misc]  # the class's own, wrapped below
    if getattr(original, "__vase_runtime__", False):
        return

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **runtime_kwargs(kwargs))

    __init__.__vase_runtime__ = True  # type: ignore[attr-defined]
    runtime_cls.__init__ = __init__  # type: ignore[misc]


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: lends the real spec a loader that patches Runtime after exec."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != TARGET_MODULE:
            return None
        sys.meta_path.remove(self)  # one shot
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            patch_runtime(module.Runtime)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def install() -> bool:
    """Arrange for ``Runtime`` to take the ``kv_*`` arguments; True when it is or will be."""
    module = sys.modules.get(TARGET_MODULE)
    if module is not None:
        patch_runtime(module.Runtime)
        return True
    if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportFinder())
    return True
