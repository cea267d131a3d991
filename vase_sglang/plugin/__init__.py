"""What runs inside SGLang's processes; ``register`` is the plugin entry point (group
``sglang.srt.plugins``, name ``vase``).

SGLang calls ``register()`` in every process it starts. Each process applies the
manifest entries of its role (``patches/manifest.py``'s ``process``), because resolving
a target imports its module: the main process gets the argument, HTTP and tokenizer
hooks; a scheduler gets the decode, memory and tree hooks, and only when the exported
policy evicts (with ``--kv-policy none`` SGLang runs untouched). ``hooks.install`` checks
every target against its entry before it is patched and verifies every hook after;
either failing stops the process.
"""

from __future__ import annotations

import sys
import types


def _role() -> str:
    """Which SGLang process is loading the plugin, from the function that called load_plugins.

    The functions SGLang's child processes run, each calling load_plugins() itself, are the
    manifest's ``role`` entries (checked offline by name, and that they still call it); the
    innermost one on the stack gives the role. "main" is the process that runs the
    tokenizer manager and HTTP server: the launch_server / Engine process, or the child
    that ``sgl.Runtime`` spawns to run launch_server (not named MainProcess, but it serves
    requests all the same).
    """
    from vase_sglang.patches.manifest import role_functions

    roles = role_functions()
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        role = roles.get(frame.f_code.co_name)
        if role is not None:
            return role
        frame = frame.f_back
    return "main"


def register() -> None:
    from vase_sglang.patches import hooks
    from vase_sglang.plugin.handoff import exported_config

    role = _role()
    if role == "main":
        hooks.install("main")
        if "sglang.srt.entrypoints.http_server" in sys.modules:
            # Already inside launch_server (sgl.Runtime's server process), past the hook
            # that adds the route: add it now.
            from vase_sglang.patches.io import add_kv_policy_route

            add_kv_policy_route()
    elif role == "scheduler" and exported_config().evicts:
        hooks.install("scheduler")
