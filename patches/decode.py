"""Scheduler-process hooks of the decode path, into the process's ``VaseScheduler`` (``runtime``).

* ``allocation.ALLOC_FOR_DECODE_FUNCS[cpu|cuda]``: rounds before the step's allocation.
* ``ForwardBatch.init_new`` AFTER: logical decode positions.
* ``<backend>.forward_decode`` AROUND: record each layer's post-RoPE query.
* ``<backend>.forward_extend`` AROUND: record the last R post-RoPE queries of a prefill.

The radix-tree cap is in ``tree.py``, admission by region size in ``admission.py``.

Why each exists: ``patches/manifest.py``. What each does: ``vase_sglang/plugin/scheduler.py``.
"""

from __future__ import annotations

from typing import Any

import torch

from vase_sglang.plugin import contract as sg

from . import runtime
from .backends import BACKEND_CLASSES
from .hooks import AFTER, AROUND, fail, hook, installs


def vase_alloc_for_decode(batch: sg.ScheduleBatch, token_per_req: int) -> torch.Tensor:
    from sglang.srt.mem_cache import allocation

    sched = runtime.adapter()
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
    sched = runtime.adapter()
    if sched is not None and ret.positions is not None and ret.forward_mode.is_decode():
        ret.positions = sched.engine.logical_positions(ret.positions, ret.req_pool_indices)


def _capture_queries(original, backend: Any, q: torch.Tensor, k: Any, v: Any, layer: sg.AttentionLayer,
                     forward_batch: sg.ForwardBatch, *args: Any, **kwargs: Any) -> Any:
    sched = runtime.adapter()
    if sched is not None:
        sched.engine.record_queries(layer.layer_id, forward_batch.req_pool_indices, forward_batch.seq_lens, q)
    return original(backend, q, k, v, layer, forward_batch, *args, **kwargs)


def _capture_extend_queries(original, backend: Any, q: torch.Tensor, k: Any, v: Any, layer: sg.AttentionLayer,
                            forward_batch: sg.ForwardBatch, *args: Any, **kwargs: Any) -> Any:
    sched = runtime.adapter()
    if sched is not None and forward_batch.extend_seq_lens is not None:
        sched.engine.record_extend_queries(layer.layer_id, forward_batch.req_pool_indices, forward_batch.seq_lens,
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
