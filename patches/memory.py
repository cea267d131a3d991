"""KV pool and policy memory (scheduler process).

* ``MHATokenToKVPool._create_buffers_normal`` AROUND: carve every layer's fused K/V
  buffer out of one allocation, so the kernels see ``[layers, slots, heads, dim]`` as a
  strided view and one launch covers all layers. Per-layer shapes and strides are
  exactly those SGLang makes.
* ``KVCacheConfigurator._profile_available_bytes`` AROUND: subtract the query ring and
  the temporaries of one batched round from the bytes the KV pool may use, before the
  pool is sized.
* ``ModelRunner._init_post_memory_pool_components`` AFTER: build the VaseScheduler
  over the pools, check the model, compile the kernels (warm-up) and print the policy
  memory. This runs before SGLang captures its CUDA graphs, so the captured decode
  step already contains the query-recording hook.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from typing import Any

import torch

from vase_sglang import scheduler
from vase_sglang.kernels import ops
from vase_sglang.options import captures_queries, exported_auto, exported_config, exported_seed
from vase_sglang.policies import RoundShape
from vase_sglang.scheduler import (
    MAX_ROUND_BATCH,
    VaseScheduler,
    query_ring_bytes_per_request,
    round_workspace_bytes,
    stacked_view,
)
from vase_sglang.sharding import head_shard

from .hooks import AFTER, AROUND, fail, hook

logger = logging.getLogger("vase_sglang.patches.memory")


@hook("sglang.srt.mem_cache.memory_pool.MHATokenToKVPool._create_buffers_normal", AROUND)
def _one_allocation(original, pool: Any, *args: Any, **kwargs: Any) -> None:
    if not exported_config().evicts or pool.use_hnd or pool.kv_cache_layout != "nhd":
        return original(pool, *args, **kwargs)
    k_shape, v_shape = pool._kv_buffer_shapes()
    if k_shape != v_shape:
        return original(pool, *args, **kwargs)
    from sglang.srt.mem_cache import memory_pool as mp

    rows = k_shape[0]
    padded = mp.ceil_align(rows, pool.page_size)
    custom = torch.cuda.use_mem_pool(pool.custom_mem_pool) if pool.enable_custom_mem_pool else nullcontext()
    with pool.memory_saver_adapter.region(mp.GPU_MEMORY_TYPE_KV_CACHE), custom:
        # Same per-layer (2, padded, H, D) block as SGLang, layers now evenly spaced.
        fused = torch.zeros((pool.layer_num, 2, padded, *k_shape[1:]), dtype=pool.store_dtype, device=pool.device)
    pool.k_buffer = [fused[layer, 0, :rows] for layer in range(pool.layer_num)]
    pool.v_buffer = [fused[layer, 1, :rows] for layer in range(pool.layer_num)]


def ring_bytes_per_request(model_config: Any, tp_size: int, itemsize: int) -> int:
    cfg = exported_config()
    heads = model_config.num_attention_heads // max(1, tp_size)
    return query_ring_bytes_per_request(cfg, model_config.num_hidden_layers, heads, model_config.head_dim, itemsize,
                                        exported_auto())


def round_shape(model_config: Any, tp_size: int, n_req: int, itemsize: int) -> RoundShape:
    """A round's geometry on one TP rank, from the model config (before the pool exists)."""
    total_kv = model_config.get_total_num_kv_heads()
    kv_heads = max(1, total_kv // max(1, tp_size))
    return RoundShape(n_req=n_req, n_layers=model_config.num_hidden_layers,
                      q_heads=model_config.num_attention_heads // max(1, tp_size), kv_heads=kv_heads,
                      head_dim=model_config.head_dim, itemsize=itemsize, total_kv_heads=total_kv)


@hook("sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._profile_available_bytes", AROUND)
def _reserve_policy_memory(original, configurator: Any, *args: Any, **kwargs: Any) -> int:
    available = original(configurator, *args, **kwargs)
    cfg = exported_config()
    if not cfg.evicts:
        return available
    from sglang.srt.runtime_context import get_context

    server_args = get_context().server_args
    rows = (server_args.max_running_requests or 0) + 1
    # The ring and a round's scratch take the KV pool's dtype, not the model's: an fp32
    # --kv-cache-dtype under a bf16 model doubles them.
    itemsize = configurator.kv_cache_dtype.itemsize
    ring = rows * ring_bytes_per_request(configurator.model_config, server_args.tp_size, itemsize)
    workspace = round_workspace_bytes(cfg, round_shape(configurator.model_config, server_args.tp_size, rows, itemsize),
                                      exported_auto())
    logger.info("vase-sglang: reserving %.1f MiB for the query ring and %.1f MiB for round temporaries "
                "(up to %d regions per launch) before the KV pool is sized", ring / 2**20, workspace / 2**20,
                MAX_ROUND_BATCH)
    return max(0, available - ring - workspace)


def _check_model(model_runner: Any) -> None:
    mc = model_runner.model_config
    hf = mc.hf_text_config
    problems = []
    if getattr(mc, "attention_arch", None) is not None and "MLA" in str(mc.attention_arch):
        problems.append("MLA attention")
    if getattr(hf, "sliding_window", None) and getattr(hf, "use_sliding_window", True):
        problems.append(f"sliding-window attention (window {hf.sliding_window})")
    rope = getattr(hf, "rope_scaling", None) or getattr(hf, "rope_parameters", None) or {}
    if isinstance(rope, dict) and ("mrope_section" in rope or rope.get("type") == "mrope"):
        problems.append("M-RoPE positions")
    if getattr(hf, "alibi", False) or "alibi" in str(getattr(hf, "position_embedding_type", "")):
        problems.append("ALiBi positions")
    if problems:
        fail(f"--kv-policy {exported_config().policy} cannot serve {mc.model_path}: " + ", ".join(problems))


@hook("sglang.srt.model_executor.model_runner.ModelRunner._init_post_memory_pool_components", AFTER)
def _build_runtime(result: Any, model_runner: Any, *args: Any, **kwargs: Any) -> None:
    cfg = exported_config()
    if not cfg.evicts:
        return
    _check_model(model_runner)
    pool = model_runner.token_to_kv_pool
    try:
        k_buf = stacked_view(pool.k_buffer)
        v_buf = stacked_view(pool.v_buffer)
    except (AttributeError, RuntimeError) as exc:
        fail(f"--kv-policy {cfg.policy} needs an NHD MHA KV pool ({type(pool).__name__}: {exc})")
    kv_heads, head_dim = k_buf.shape[2], k_buf.shape[3]
    mc = model_runner.model_config
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    try:
        shard = head_shard(mc.num_attention_heads, mc.get_total_num_kv_heads(), parallel.attn_tp_size,
                           parallel.attn_tp_rank)
    except ValueError as exc:
        fail(f"--kv-policy {cfg.policy}: {exc}")
    if shard.kv_heads != kv_heads:
        fail(f"--kv-policy {cfg.policy}: the KV pool holds {kv_heads} heads per layer, the sharding gives "
             f"{shard.kv_heads} (attention TP {parallel.attn_tp_size})")
    q_heads = shard.q_heads
    rows = model_runner.req_to_token_pool.size + 1
    auto = exported_auto()
    scheduler.install(VaseScheduler(cfg, exported_seed(), k_buf, v_buf, model_runner.req_to_token_pool, q_heads,
                                    capture_queries=captures_queries(cfg, auto), auto=auto,
                                    head_offset=shard.kv_head_offset,
                                    total_kv_heads=shard.total_kv_heads,
                                    # Each KV head's replicas and every TP rank run the same rounds:
                                    # count them once, on the first attention-TP rank.
                                    count_totals=parallel.attn_tp_rank == 0))
    sched = scheduler.current()
    assert sched is not None
    if ops.resolve_backend(k_buf.device) == "triton":
        sched.warm_up()  # compile now, not in the middle of a decode step
    per_request = query_ring_bytes_per_request(cfg, k_buf.shape[0], q_heads, head_dim, k_buf.element_size(), auto)
    shape = RoundShape(n_req=rows, n_layers=k_buf.shape[0], q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim,
                       itemsize=k_buf.element_size(), total_kv_heads=shard.total_kv_heads)
    workspace = round_workspace_bytes(cfg, shape, auto)
    logger.info(
        "vase-sglang: policy %s, budget %d + recent %d slots per request, layer and KV head; "
        "query ring %d bytes per request x %d request slots = %.1f MiB, round temporaries %.1f MiB "
        "(both counted before the KV pool was sized); KV pool %d tokens, %d layers x %d KV heads x %d dims",
        cfg.policy, cfg.budget, cfg.recent, per_request, rows, per_request * rows / 2**20, workspace / 2**20,
        model_runner.max_total_num_tokens, k_buf.shape[0], kv_heads, head_dim,
    )
