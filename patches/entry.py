"""The plugin entry point: ``register`` (group ``sglang.srt.plugins``, name ``vase``).

SGLang calls ``register()`` in every process it starts. Each process applies the
manifest entries of its role (``manifest.py``'s ``process``), because resolving a target
imports its module, and of the parts its settings switch on (``part``):

* the main process installs the ``--kv-*`` flag parser at once, and the rest once the
  flags are read (``main_parts``, called from ``server_args.py``): the HTTP hardening
  (``guards/``) with ``--kv-guards on``, the argument, request and reporting hooks unless
  ``--kv-policy none --kv-guards off``, where SGLang serves untouched;
* a scheduler gets the decode, memory and tree hooks, only when the server's policy
  evicts;
* with ``SGLANG_USE_CPU_ENGINE=1``, whatever the policy, the processes it names get the
  fixes of SGLang's CPU engine (``cpu_engine.py``; the data-parallel controller gets
  nothing else).

``hooks.install`` checks every target against its entry before it is patched and
verifies every hook after; either failing stops the process.
"""

from __future__ import annotations

import logging
import sys
import types

from vase_sglang.plugin.cpu_mode import cpu_engine_requested
from vase_sglang.plugin.settings import ServerSettings, imported_settings

from . import hooks
from .manifest import CPU_ENGINE, EVICTION, FLAGS, GUARDS, role_functions

logger = logging.getLogger("vase_sglang.patches")


def process_role() -> str:
    """Which SGLang process is loading the plugin, from the function that called load_plugins.

    The functions SGLang's child processes run, each calling load_plugins() itself, are the
    manifest's ``role`` entries (checked offline by name, and that they still call it); the
    innermost one on the stack gives the role. "main" is the process that runs the
    tokenizer manager and HTTP server: the launch_server / Engine process, or the child
    that ``sgl.Runtime`` spawns to run launch_server (not named MainProcess, but it serves
    requests all the same).
    """
    roles = role_functions()
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        role = roles.get(frame.f_code.co_name)
        if role is not None:
            return role
        frame = frame.f_back
    return "main"


def cpu_engine_parts() -> tuple[str, ...]:
    """The CPU engine's fixes (``patches/cpu_engine.py``) where ``SGLANG_USE_CPU_ENGINE=1``,
    whatever the policy: they fix SGLang's engine on a CPU host, not eviction."""
    return (CPU_ENGINE,) if cpu_engine_requested() else ()


def main_parts(settings: ServerSettings) -> tuple[str, ...]:
    """The parts the main process installs once the flags are read: the flag parser; the
    HTTP hardening with ``--kv-guards on``; the rest unless ``--kv-policy none
    --kv-guards off``."""
    guards = (GUARDS,) if settings.guards else ()
    eviction = (EVICTION,) if settings.config.evicts or settings.guards else ()
    return (FLAGS, *guards, *eviction)


def install_main(settings: ServerSettings) -> tuple[str, ...]:
    """Install the main process's parts for ``settings``; returns them."""
    parts = main_parts(settings)
    hooks.install("main", parts)
    if parts == (FLAGS,):
        logger.info("vase-sglang: --kv-policy none --kv-guards off: SGLang serves untouched "
                    "(the plugin installed only its --kv-* flag parser)")
    else:
        logger.info("vase-sglang: main process hooks: %s", ", ".join(parts))
    return parts


def register() -> None:
    role = process_role()
    if role == "main":
        if "sglang.srt.entrypoints.http_server" in sys.modules:
            # sgl.Runtime's server process: its parent read the flags, and this process is
            # already past the hook that adds the route, so add it now.
            if EVICTION in install_main(imported_settings()):
                from .io import add_kv_policy_route

                add_kv_policy_route()
        else:
            hooks.install("main", (FLAGS,))  # the rest once the flags are read: server_args.py
    elif role == "scheduler":
        parts = (*cpu_engine_parts(), *((EVICTION,) if imported_settings().config.evicts else ()))
        if parts:
            hooks.install("scheduler", parts)
    elif role == "controller" and cpu_engine_parts():
        hooks.install("controller", cpu_engine_parts())
