"""Scheduler-process hooks of the decode path: each is one call into the VaseScheduler.

* ``allocation.ALLOC_FOR_DECODE_FUNCS[cpu|cuda]``: rounds before the step's allocation.
* ``ForwardBatch.init_new`` AFTER: logical decode positions.
* ``<backend>.forward_decode`` AROUND: record each layer's post-RoPE query.
* ``<backend>.forward_extend`` AROUND: record the last R post-RoPE queries of a prefill.
* ``UnifiedRadixCache.checkpoint`` / ``RadixCache.checkpoint`` BEFORE: the tree cap.
* ``PrefillAdder._get_running_request_total_token_offset`` AROUND,
  ``Scheduler.init_req_max_new_tokens`` AROUND,
  ``BaseTokenToKVPoolAllocator.max_new_tokens_for_memory`` AROUND and
  ``schedule_policy.CLIP_MAX_NEW_TOKENS``: admission by region size.

Why each exists: ``patches/manifest.py``. What each does: ``vase_sglang/plugin/scheduler.py``.
"""

from __future__ import annotations

from typing import Any

import torch

from vase_sglang.plugin import scheduler
from vase_sglang.plugin.handoff import exported_config

from . import contract as sg
from .backends import BACKEND_CLASSES
from .hooks import AFTER, AROUND, BEFORE, fail, hook, installs


def vase_alloc_for_decode(batch: sg.ScheduleBatch, token_per_req: int) -> torch.Tensor:
    from sglang.srt.mem_cache import allocation

    sched = scheduler.current()
    if sched is not None:
        sched.before_decode_alloc(batch)
    out = allocation.alloc_for_decode_default(batch, token_per_req)
    if sched is not None:
        sched.after_decode_alloc(batch)
    return out


@installs("sglang.srt.mem_cache.allocation.ALLOC_FOR_DECODE_FUNCS")
def _install_decode_allocator() -> None:
    """Our decode allocator in SGLang's registry, for the CPU and the CUDA path."""
    from sglang.srt.mem_cache import allocation

    for key in ("cpu", "cuda"):
        allocation.ALLOC_FOR_DECODE_FUNCS[key] = vase_alloc_for_decode
        if allocation.ALLOC_FOR_DECODE_FUNCS[key] is not vase_alloc_for_decode:
            fail(f"sglang.srt.mem_cache.allocation.ALLOC_FOR_DECODE_FUNCS[{key!r}] did not take the VaSE allocator")


@hook("sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new", AFTER)
def _logical_positions(ret: sg.ForwardBatch, *args: Any, **kwargs: Any) -> None:
    sched = scheduler.current()
    if sched is not None and ret.positions is not None and ret.forward_mode.is_decode():
        ret.positions = sched.logical_positions(ret.positions, ret.req_pool_indices)


def _capture_queries(original, backend: Any, q: torch.Tensor, k: Any, v: Any, layer: sg.AttentionLayer,
                     forward_batch: sg.ForwardBatch, *args: Any, **kwargs: Any) -> Any:
    sched = scheduler.current()
    if sched is not None:
        sched.record_queries(layer.layer_id, forward_batch.req_pool_indices, forward_batch.seq_lens, q)
    return original(backend, q, k, v, layer, forward_batch, *args, **kwargs)


def _capture_extend_queries(original, backend: Any, q: torch.Tensor, k: Any, v: Any, layer: sg.AttentionLayer,
                            forward_batch: sg.ForwardBatch, *args: Any, **kwargs: Any) -> Any:
    sched = scheduler.current()
    if sched is not None and forward_batch.extend_seq_lens is not None:
        sched.record_extend_queries(layer.layer_id, forward_batch.req_pool_indices, forward_batch.seq_lens,
                                    forward_batch.extend_seq_lens, q)
    return original(backend, q, k, v, layer, forward_batch, *args, **kwargs)


# Query capture on every supported backend, whatever the device: SGLang's triton backend
# also runs on CPU (under TRITON_INTERPRET=1), and a backend without the hook would score
# an all-zero query ring (flashinfer's entries apply only where it is installed). Decode
# steps record their query; prefills record their last R (a re-prefill after a retraction
# then has a full ring for the round that follows it at once).
for _cls in BACKEND_CLASSES.values():
    hook(f"{_cls}.forward_decode", AROUND)(_capture_queries)
    hook(f"{_cls}.forward_extend", AROUND)(_capture_extend_queries)


def _cap_checkpoint(tree: Any, req: sg.Req, *args: Any, up_to: int, **kwargs: Any):
    sched = scheduler.current()
    limit = sched.checkpoint_limit(req, up_to) if sched is not None else None
    return None if limit is None else ((tree, req, *args), {**kwargs, "up_to": limit})


hook("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.checkpoint", BEFORE)(_cap_checkpoint)
hook("sglang.srt.mem_cache.radix_cache.RadixCache.checkpoint", BEFORE)(_cap_checkpoint)


@hook("sglang.srt.managers.schedule_policy.PrefillAdder._get_running_request_total_token_offset", AROUND)
def _running_offset(original, adder: Any, req: sg.Req, *args: Any, **kwargs: Any) -> float:
    sched = scheduler.current()
    bound = sched.growth_bound(req) if sched is not None else None
    return original(adder, req, *args, **kwargs) if bound is None else bound


@hook("sglang.srt.managers.scheduler.Scheduler.init_req_max_new_tokens", AROUND)
def _init_req_max_new_tokens(original, sglang_scheduler: sg.Scheduler, req: sg.Req, *args: Any, **kwargs: Any) -> Any:
    sched = scheduler.current()
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
    sched = scheduler.current()
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

    clip = exported_config().region_size
    schedule_policy.CLIP_MAX_NEW_TOKENS = clip
    if schedule_policy.CLIP_MAX_NEW_TOKENS != clip:
        fail("sglang.srt.managers.schedule_policy.CLIP_MAX_NEW_TOKENS could not be set")
