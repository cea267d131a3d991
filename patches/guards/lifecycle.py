"""Shutdown (main process), for every server the plugin loads into with ``--kv-guards on``.

* ``TokenizerManager.sigterm_watchdog`` AROUND: on SIGTERM, SGLang stops taking requests
  and waits for the running ones to finish, however long that takes (a long reasoning
  generation: minutes), before it shuts the schedulers down. A container runtime kills
  the server after its grace period (30 s on Kubernetes), mid-release. Bound the drain:
  after ``VASE_SGLANG_DRAIN_TIMEOUT`` seconds (default 20) the requests still running are
  aborted (their clients get a response with finish reason ``abort``), and SGLang's own
  shutdown goes on: schedulers released and joined, no traceback, no orphan.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from vase_sglang.plugin import contract as sg

from ..hooks import AROUND, hook

logger = logging.getLogger("vase_sglang.patches.guards.lifecycle")

DRAIN_ENV = "VASE_SGLANG_DRAIN_TIMEOUT"
DEFAULT_DRAIN_SECONDS = 20.0


def drain_timeout() -> float:
    """Seconds to let running requests finish after SIGTERM (env ``VASE_SGLANG_DRAIN_TIMEOUT``)."""
    raw = os.environ.get(DRAIN_ENV)
    if raw is None:
        return DEFAULT_DRAIN_SECONDS
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{DRAIN_ENV}={raw!r}: expected a number of seconds") from None
    if value < 0:
        raise ValueError(f"{DRAIN_ENV}={raw!r}: must be >= 0")
    return value


async def _abort_after_drain(manager: sg.TokenizerManager, limit: float) -> None:
    while not getattr(manager, "gracefully_exit", False):
        await asyncio.sleep(0.5)
    await asyncio.sleep(limit)
    remaining = len(manager.rid_to_state)
    if remaining:
        logger.warning("vase-sglang: %d request(s) still running %.0f s after SIGTERM (%s): aborting them",
                       remaining, limit, DRAIN_ENV)
        manager.abort_request(abort_all=True)


@hook("sglang.srt.managers.tokenizer_manager.TokenizerManager.sigterm_watchdog", AROUND)
async def _bounded_drain(original, manager: Any, *args: Any, **kwargs: Any) -> Any:
    task = asyncio.get_running_loop().create_task(_abort_after_drain(manager, drain_timeout()))
    try:
        return await original(manager, *args, **kwargs)
    finally:
        task.cancel()
