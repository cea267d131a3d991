"""The SGLang plugin entry point (group ``sglang.srt.plugins``, name ``vase``).

SGLang calls ``register()`` in every process it starts. Hooks are registered per role,
because resolving a hook target imports its module: the main process gets the argument,
HTTP and tokenizer hooks; a scheduler gets the decode, memory and tree hooks, and only
when the exported policy evicts (with ``--kv-policy none`` SGLang runs untouched).
Every target is checked against ``patches/manifest.py`` before it is patched, and every
hook is verified after it is applied; either failing stops the process.
"""

from __future__ import annotations

import sys
import types
from typing import Any

# The functions SGLang's child processes run; each calls load_plugins() itself.
SCHEDULER_ENTRY = "run_scheduler_process"
OTHER_ENTRIES = ("run_detokenizer_process", "run_data_parallel_controller_process")


def _role() -> str:
    """Which SGLang process is loading the plugin, from the function that called load_plugins.

    "main" is the process that runs the tokenizer manager and HTTP server: the
    launch_server / Engine process, or the child that ``sgl.Runtime`` spawns to run
    launch_server (not named MainProcess, but it serves requests all the same).
    """
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_name
        if name == SCHEDULER_ENTRY:
            return "scheduler"
        if name in OTHER_ENTRIES:
            return "other"
        frame = frame.f_back
    return "main"


def _in_main(hook: Any) -> bool:
    """Whether a queued hook belongs to the main (HTTP / tokenizer) process: its manifest entry says."""
    from vase_sglang.patches import manifest

    return manifest.BY_TARGET[hook.target].process == "main"


def register() -> None:
    from vase_sglang.options import exported_config
    from vase_sglang.patches import hooks

    role = _role()
    if role == "main":
        from vase_sglang.patches import guards, io, lifecycle, routes, server_args  # noqa: F401 - importing queues the hooks

        hooks.apply(hooks.take(_in_main))
        _install_engine_factory()
        if "sglang.srt.entrypoints.http_server" in sys.modules:
            # Already inside launch_server (sgl.Runtime's server process), past the hook
            # that adds the route: add it now.
            from vase_sglang.patches.io import add_kv_policy_route

            add_kv_policy_route()
        return
    if role == "scheduler" and exported_config().evicts:
        from vase_sglang.patches import decode, io, memory  # noqa: F401

        queued = hooks.take(lambda h: not _in_main(h))
        queued += [hooks.Hook(t, fn, hooks.AROUND) for t, fn in decode.backend_hooks()]
        hooks.apply(queued)
        _install_scheduler_globals()


def _install_engine_factory() -> None:
    from sglang.srt.entrypoints.engine import Engine

    from vase_sglang.patches.hooks import check_contract, fail
    from vase_sglang.patches.server_args import engine_server_args

    check_contract("sglang.srt.entrypoints.engine.Engine.server_args_class")
    if getattr(Engine.server_args_class, "__name__", "") != "vase_server_args_factory":
        # staticmethod: Engine.__init__ calls it through self.
        Engine.server_args_class = staticmethod(engine_server_args(Engine.server_args_class))
    if getattr(Engine.server_args_class, "__name__", "") != "vase_server_args_factory":
        fail("could not install the kv_* keyword arguments on sglang.Engine.server_args_class")


def _install_scheduler_globals() -> None:
    from sglang.srt.managers import schedule_policy
    from sglang.srt.mem_cache import allocation

    from vase_sglang.patches.decode import install_alloc_hook, set_admission_clip, vase_alloc_for_decode
    from vase_sglang.patches.hooks import check_contract, fail

    for target in ("sglang.srt.mem_cache.allocation.ALLOC_FOR_DECODE_FUNCS",
                   "sglang.srt.mem_cache.allocation.alloc_for_decode_default",
                   "sglang.srt.managers.schedule_policy.CLIP_MAX_NEW_TOKENS"):
        check_contract(target)

    for key in install_alloc_hook():
        if allocation.ALLOC_FOR_DECODE_FUNCS[key] is not vase_alloc_for_decode:
            fail(f"sglang.srt.mem_cache.allocation.ALLOC_FOR_DECODE_FUNCS[{key!r}] did not take the VaSE allocator")
    clip = set_admission_clip()
    if schedule_policy.CLIP_MAX_NEW_TOKENS != clip:
        fail("sglang.srt.managers.schedule_policy.CLIP_MAX_NEW_TOKENS could not be set")
