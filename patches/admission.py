"""Scheduler-process hooks of admission: an evicting request needs prompt + B + R slots,
whatever its ``max_new_tokens``.

* ``schedule_policy.CLIP_MAX_NEW_TOKENS``: new requests reserve prompt + min(max_new_tokens, B + R).
* ``PrefillAdder._get_running_request_total_token_offset`` AROUND: a running request grows
  by at most what its region has left.
* ``Scheduler.init_req_max_new_tokens`` AROUND: only the context length bounds an evicting
  request's output.
* ``BaseTokenToKVPoolAllocator.max_new_tokens_for_memory`` AROUND: a long generation is not
  cut to the pool size when its region fits.

Why: ``patches/manifest.py``. What: ``vase_sglang/plugin/scheduler.py``.
"""

from __future__ import annotations

from typing import Any

from vase_sglang.plugin import contract as sg
from vase_sglang.plugin.settings import imported_settings

from . import runtime
from .hooks import AROUND, fail, hook, installs


@hook("sglang.srt.managers.schedule_policy.PrefillAdder._get_running_request_total_token_offset", AROUND)
def _running_offset(original, adder: Any, req: sg.Req, *args: Any, **kwargs: Any) -> float:
    sched = runtime.adapter()
    bound = sched.growth_bound(req) if sched is not None else None
    return original(adder, req, *args, **kwargs) if bound is None else bound


@hook("sglang.srt.managers.scheduler.Scheduler.init_req_max_new_tokens", AROUND)
def _init_req_max_new_tokens(original, sglang_scheduler: sg.Scheduler, req: sg.Req, *args: Any, **kwargs: Any) -> Any:
    sched = runtime.adapter()
    if sched is None:
        return original(sglang_scheduler, req, *args, **kwargs)
    with sched.admitting(req) as region:
        if region is None:
            return original(sglang_scheduler, req, *args, **kwargs)
        # SGLang bounds prompt + output by min(context, pool); an evicting request's output
        # does not live in the pool, so only the context length (RoPE positions) bounds it.
        saved = sglang_scheduler.max_req_len
        sglang_scheduler.max_req_len = max(saved, sglang_scheduler.model_config.context_len - 1)
        try:
            return original(sglang_scheduler, req, *args, **kwargs)
        finally:
            sglang_scheduler.max_req_len = saved


@hook("sglang.srt.mem_cache.allocator.base.BaseTokenToKVPoolAllocator.max_new_tokens_for_memory", AROUND)
def _memory_bound(original, allocator: Any, input_tokens: int, max_new_tokens: int, *args: Any, **kwargs: Any):
    """An evicting request needs prompt + B + R slots, not prompt + max_new_tokens:
    don't cut a long generation to the pool size when its region fits."""
    sched = runtime.adapter()
    region = sched.admitting_region if sched is not None else None
    if region is None:
        return original(allocator, input_tokens, max_new_tokens, *args, **kwargs)
    needed = min(max_new_tokens, region)
    fits = original(allocator, input_tokens, needed, *args, **kwargs)
    return max_new_tokens if fits == needed else fits


@installs("sglang.srt.managers.schedule_policy.CLIP_MAX_NEW_TOKENS")
def _install_admission_clip() -> None:
    """New requests reserve prompt + min(max_new_tokens, B + R)."""
    from sglang.srt.managers import schedule_policy

    clip = imported_settings().config.region_size
    schedule_policy.CLIP_MAX_NEW_TOKENS = clip
    if schedule_policy.CLIP_MAX_NEW_TOKENS != clip:
        fail("sglang.srt.managers.schedule_policy.CLIP_MAX_NEW_TOKENS could not be set")
