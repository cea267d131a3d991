"""Scheduler-process hook of the radix tree: the tree never takes a compacted region.

* ``UnifiedRadixCache.checkpoint`` / ``RadixCache.checkpoint`` BEFORE: the columns the tree
  may take are capped by ``VaseScheduler.checkpoint_limit`` (a compacted region's columns
  hold other positions' KV; a retracted request's re-prefilled history would become a
  prefix no round can evict).

Why: ``patches/manifest.py``. What: ``vase_sglang/plugin/scheduler.py``.
"""

from __future__ import annotations

from typing import Any

from vase_sglang.plugin import contract as sg

from . import runtime
from .hooks import BEFORE, hook


def _cap_checkpoint(tree: Any, req: sg.Req, *args: Any, up_to: int, **kwargs: Any):
    sched = runtime.adapter()
    limit = sched.checkpoint_limit(req, up_to) if sched is not None else None
    return None if limit is None else ((tree, req, *args), {**kwargs, "up_to": limit})


hook("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.checkpoint", BEFORE)(_cap_checkpoint)
hook("sglang.srt.mem_cache.radix_cache.RadixCache.checkpoint", BEFORE)(_cap_checkpoint)
