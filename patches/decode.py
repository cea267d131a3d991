"""The decode path (scheduler process): rounds, positions, queries, tree cap, admission.

* ``allocation.ALLOC_FOR_DECODE_FUNCS[cpu|cuda]``: before the default allocation, run a
  round for every request whose region is full, free its R tail slots and shorten its
  row (``kv_committed_len == kv_allocated_len == seq_len``, invariant I3).
* ``ForwardBatch.init_new`` AFTER: decode positions += delta (logical - physical).
* ``<backend>.forward_decode`` AROUND: record each layer's post-RoPE query in the ring.
* ``UnifiedRadixCache.checkpoint`` / ``RadixCache.checkpoint`` BEFORE: never publish a
  compacted part of a row to the tree (invariant I2).
* ``PrefillAdder._get_running_request_total_token_offset`` AROUND and
  ``schedule_policy.CLIP_MAX_NEW_TOKENS``: reserve what a request can still grow.
"""

from __future__ import annotations

import hashlib
import logging
import os
from typing import Any

import torch

from vase_sglang.config import PolicyConfig, PolicyConfigError
from vase_sglang.options import exported_config, request_config
from vase_sglang.runtime import RequestState

from . import metrics, state
from .hooks import AFTER, AROUND, BEFORE, hook

logger = logging.getLogger("vase_sglang.patches.decode")


# Test oracle: digest the prompt's K/V bytes when a region starts and after each round.
DEBUG_DIGEST = os.environ.get("VASE_SGLANG_DEBUG_DIGEST") == "1"


def prefix_digest(req_to_token: torch.Tensor, row: int, lo: int) -> str:
    rt = state.runtime
    slots = req_to_token[row, :lo].long()
    h = hashlib.sha256()
    for buf in (rt.k_buf, rt.v_buf):
        h.update(buf[:, slots].contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def request_state(req: Any) -> RequestState | None:
    return getattr(req, "_vase", None)


def request_cfg(req: Any) -> PolicyConfig:
    """The config this request runs with, computed once (on arrival) and kept on it."""
    cfg = getattr(req, "_vase_cfg", None)
    if cfg is None:
        server = exported_config()
        try:
            cfg = request_config(server, req.sampling_params.custom_params)
        except PolicyConfigError:  # validated with a 400 in the tokenizer manager already
            cfg = server.replace(policy="none")
        req._vase_cfg = cfg
    return cfg


def _ensure_state(req: Any) -> RequestState:
    """The request's state for its current row; a new region after a (re-)prefill."""
    rt = state.runtime
    row = int(req.kv.req_pool_idx)
    generation = int(state.req_to_token_pool.req_generation[row])
    st = request_state(req)
    if st is not None and st.row == row and st.generation == generation:
        return st
    new = RequestState(cfg=request_cfg(req), row=row, generation=generation, lo=int(req.kv.kv_committed_len))
    if st is not None:  # re-prefilled after a retraction: counters go on, positions are physical again
        new.rounds, new.evicted = st.rounds, st.evicted
    req._vase = new
    rt.begin(new)
    if DEBUG_DIGEST:
        new.prefix_digests = [prefix_digest(state.req_to_token_pool.req_to_token, row, new.lo)]
    return new


def _run_due_rounds(batch: Any) -> None:
    rt = state.runtime
    req_to_token = batch.req_to_token_pool.req_to_token
    due = []
    for i, req in enumerate(batch.reqs):
        st = _ensure_state(req)
        if st.due(req.kv.kv_committed_len):
            due.append((i, req, st))
    if not due:
        return
    items = [(st, req_to_token[st.row, st.lo : st.lo + st.cfg.region_size]) for _, _, st in due]
    rt.run_rounds(items)
    metrics.observe_rounds(len(due), sum(st.cfg.recent for _, _, st in due), rt.totals.round_seconds[-1])
    if DEBUG_DIGEST:
        for _, _, st in due:
            st.prefix_digests.append(prefix_digest(req_to_token, st.row, st.lo))
    allocator = batch.token_to_kv_pool_allocator
    seq_lens = batch.seq_lens.clone()
    seq_lens_cpu = batch.seq_lens_cpu.clone()
    orig = batch.orig_seq_lens.clone() if batch.orig_seq_lens is not None else None
    for i, req, st in due:
        new_len = st.lo + st.cfg.budget
        tail = req_to_token[st.row, new_len : st.lo + st.cfg.region_size].to(torch.int64)
        allocator.free(tail)
        req.kv.kv_committed_len = new_len
        req.kv.kv_allocated_len = new_len
        seq_lens[i] = new_len
        seq_lens_cpu[i] = new_len
        if orig is not None:
            orig[i] = new_len
    # New tensors, as prepare_for_decode does: nothing else holds the old ones by then.
    batch.seq_lens, batch.seq_lens_cpu, batch.orig_seq_lens = seq_lens, seq_lens_cpu, orig
    batch.seq_lens_sum = None


def vase_alloc_for_decode(batch: Any, token_per_req: int) -> torch.Tensor:
    from sglang.srt.mem_cache import allocation

    if state.runtime is not None:
        _run_due_rounds(batch)
    out = allocation.alloc_for_decode_default(batch, token_per_req)
    if state.runtime is not None:
        states = []
        for req in batch.reqs:
            st = request_state(req)
            if st is not None:
                st.region_len = req.kv.kv_committed_len - st.lo
                states.append(st)
        metrics.observe_step(states)
    return out


def install_alloc_hook() -> list[str]:
    """Put our decode allocator in SGLang's registry; returns the keys it was set for."""
    from sglang.srt.mem_cache import allocation

    keys = ["cpu", "cuda"]
    for key in keys:
        allocation.ALLOC_FOR_DECODE_FUNCS[key] = vase_alloc_for_decode
    return keys


@hook("sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new", AFTER)
def _logical_positions(ret: Any, *args: Any, **kwargs: Any) -> None:
    rt = state.runtime
    if rt is None or ret.positions is None or not ret.forward_mode.is_decode():
        return
    delta = rt.delta_by_row[ret.req_pool_indices.long()]
    ret.positions = ret.positions + delta.to(ret.positions.dtype)


def _capture_queries(original, backend: Any, q: torch.Tensor, k: Any, v: Any, layer: Any, forward_batch: Any,
                     *args: Any, **kwargs: Any) -> Any:
    rt = state.runtime
    if rt is not None and rt.qbuf is not None:
        rt.record_queries(layer.layer_id, forward_batch.req_pool_indices, forward_batch.seq_lens, q)
    return original(backend, q, k, v, layer, forward_batch, *args, **kwargs)


BACKEND_TARGETS = {
    "torch_native": "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_decode",
    "triton": "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.forward_decode",
    "flashinfer": "sglang.srt.layers.attention.flashinfer_backend.FlashInferAttnBackend.forward_decode",
}


def backend_hooks() -> list[tuple[str, Any]]:
    """Query-capture hooks: torch_native always, GPU backends only where CUDA exists."""
    names = ["torch_native"] + (["triton", "flashinfer"] if torch.cuda.is_available() else [])
    return [(BACKEND_TARGETS[n], _capture_queries) for n in names]


def _cap_checkpoint(tree: Any, req: Any, *args: Any, up_to: int, **kwargs: Any):
    st = request_state(req)
    if st is not None and st.compacted and up_to > st.lo:
        # Columns past lo hold compacted KV: another token's data at each position.
        return (tree, req, *args), {**kwargs, "up_to": st.lo}
    return None


hook("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.checkpoint", BEFORE)(_cap_checkpoint)
hook("sglang.srt.mem_cache.radix_cache.RadixCache.checkpoint", BEFORE)(_cap_checkpoint)


@hook("sglang.srt.managers.schedule_policy.PrefillAdder._get_running_request_total_token_offset", AROUND)
def _running_offset(original, adder: Any, req: Any, *args: Any, **kwargs: Any) -> float:
    st = request_state(req)
    if st is None or not st.evicts:
        return original(adder, req, *args, **kwargs)
    # The region never holds more than B + R: what is left to grow is bounded by that.
    remaining = req.sampling_params.max_new_tokens - len(req.output_ids)
    room = st.cfg.region_size - st.region_length(req.kv.kv_committed_len)
    return max(0, min(remaining, room))


# Region size of the request whose max_new_tokens SGLang is clipping right now (None: not evicting).
_clip_region: int | None = None


@hook("sglang.srt.managers.scheduler.Scheduler.init_req_max_new_tokens", AROUND)
def _init_req_max_new_tokens(original, scheduler: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
    global _clip_region
    cfg = request_cfg(req)
    _clip_region = cfg.region_size if cfg.evicts else None
    if _clip_region is None:
        return original(scheduler, req, *args, **kwargs)
    # SGLang bounds prompt + output by min(context, pool); an evicting request's output
    # does not live in the pool, so only the context length (RoPE positions) bounds it.
    saved = scheduler.max_req_len
    scheduler.max_req_len = max(saved, scheduler.model_config.context_len - 1)
    try:
        return original(scheduler, req, *args, **kwargs)
    finally:
        scheduler.max_req_len = saved
        _clip_region = None


@hook("sglang.srt.mem_cache.allocator.base.BaseTokenToKVPoolAllocator.max_new_tokens_for_memory", AROUND)
def _memory_bound(original, allocator: Any, input_tokens: int, max_new_tokens: int, *args: Any, **kwargs: Any):
    """An evicting request needs prompt + B + R slots, not prompt + max_new_tokens:
    don't cut a long generation to the pool size when its region fits."""
    region = _clip_region
    if region is None:
        return original(allocator, input_tokens, max_new_tokens, *args, **kwargs)
    needed = min(max_new_tokens, region)
    fits = original(allocator, input_tokens, needed, *args, **kwargs)
    return max_new_tokens if fits == needed else fits


def set_admission_clip() -> int:
    """New requests reserve prompt + min(max_new_tokens, B + R)."""
    from sglang.srt.managers import schedule_policy

    cfg = exported_config()
    schedule_policy.CLIP_MAX_NEW_TOKENS = cfg.region_size
    return cfg.region_size
