"""KV pool and policy memory (scheduler process).

* ``MHATokenToKVPool._create_buffers_normal`` AROUND: carve every layer's fused K/V
  buffer out of one allocation, so the kernels see ``[layers, slots, heads, dim]`` as a
  strided view and one launch covers all layers. Per-layer shapes and strides are
  exactly those SGLang makes.
* ``KVCacheConfigurator._profile_available_bytes`` AROUND: subtract the policy memory
  (``plugin/planning.py``'s ``policy_memory``: the query ring, the score state of the
  stateful policies and the temporaries of one batched round) from the bytes the KV pool
  may use, before the pool is sized.
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

from vase_sglang.kernels import ops
from vase_sglang.plugin import contract as sg
from vase_sglang.plugin.engine import stacked_view
from vase_sglang.plugin.planning import MAX_ROUND_BATCH, policy_memory
from vase_sglang.plugin.scheduler import VaseScheduler, build_engine
from vase_sglang.plugin.settings import imported_settings
from vase_sglang.sharding import HeadShard, head_shard

from . import runtime
from .hooks import AFTER, AROUND, fail, hook

logger = logging.getLogger("vase_sglang.patches.memory")


@hook("sglang.srt.mem_cache.memory_pool.MHATokenToKVPool._create_buffers_normal", AROUND)
def _one_allocation(original, pool: sg.MHATokenToKVPool, *args: Any, **kwargs: Any) -> None:
    if not imported_settings().config.evicts or pool.use_hnd or pool.kv_cache_layout != "nhd":
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


def _shard(model_config: sg.ModelConfig, tp_size: int, tp_rank: int, policy: str) -> HeadShard:
    """The heads one attention-TP rank holds; a model they cannot be split for stops the process."""
    try:
        return head_shard(model_config.num_attention_heads, model_config.get_total_num_kv_heads(), tp_size, tp_rank)
    except ValueError as exc:
        fail(f"--kv-policy {policy}: {exc}")


@hook("sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._profile_available_bytes", AROUND)
def _reserve_policy_memory(original, configurator: sg.KVCacheConfigurator, *args: Any, **kwargs: Any) -> int:
    available = original(configurator, *args, **kwargs)
    settings = imported_settings()
    cfg = settings.config
    if not cfg.evicts:
        return available
    from sglang.srt.runtime_context import get_context

    server_args: sg.ServerArgs = get_context().server_args
    mc = configurator.model_config
    # The ring and a round's scratch take the KV pool's dtype, not the model's: an fp32
    # --kv-cache-dtype under a bf16 model doubles them. Every rank holds as many heads.
    memory = policy_memory(cfg, _shard(mc, server_args.tp_size, 0, cfg.policy), mc.num_hidden_layers, mc.head_dim,
                           configurator.kv_cache_dtype.itemsize, (server_args.max_running_requests or 0) + 1,
                           settings.auto, settings.telemetry.enabled)
    logger.info("vase-sglang: reserving %.1f MiB for the query ring, %.1f MiB for the score state and %.1f MiB "
                "for round temporaries (up to %d regions per launch) before the KV pool is sized",
                memory.ring_bytes / 2**20, memory.state_bytes / 2**20, memory.workspace_bytes / 2**20,
                MAX_ROUND_BATCH)
    return max(0, available - memory.total_bytes)


def _check_model(model_runner: sg.ModelRunner, policy: str) -> None:
    mc = model_runner.model_config
    hf = mc.hf_text_config
    problems = []
    # AttentionArch is an IntEnum: str() of a member is its number on Python 3.11+.
    if getattr(mc.attention_arch, "name", None) == "MLA":
        problems.append("MLA attention")
    if getattr(hf, "sliding_window", None) and getattr(hf, "use_sliding_window", True):
        problems.append(f"sliding-window attention (window {hf.sliding_window})")
    rope = getattr(hf, "rope_scaling", None) or getattr(hf, "rope_parameters", None) or {}
    if isinstance(rope, dict) and ("mrope_section" in rope or rope.get("type") == "mrope"):
        problems.append("M-RoPE positions")
    if getattr(hf, "alibi", False) or "alibi" in str(getattr(hf, "position_embedding_type", "")):
        problems.append("ALiBi positions")
    if problems:
        fail(f"--kv-policy {policy} cannot serve {mc.model_path}: " + ", ".join(problems))


@hook("sglang.srt.model_executor.model_runner.ModelRunner._init_post_memory_pool_components", AFTER)
def _build_runtime(result: Any, model_runner: sg.ModelRunner, *args: Any, **kwargs: Any) -> None:
    settings = imported_settings()
    cfg = settings.config
    if not cfg.evicts:
        return
    _check_model(model_runner, cfg.policy)
    pool = model_runner.token_to_kv_pool
    try:
        k_buf = stacked_view(pool.k_buffer)
        v_buf = stacked_view(pool.v_buffer)
    except (AttributeError, RuntimeError) as exc:
        fail(f"--kv-policy {cfg.policy} needs an NHD MHA KV pool ({type(pool).__name__}: {exc})")
    kv_heads, head_dim = k_buf.shape[2], k_buf.shape[3]
    mc = model_runner.model_config
    from sglang.srt.runtime_context import get_parallel

    parallel: sg.ParallelContext = get_parallel()
    shard = _shard(mc, parallel.attn_tp_size, parallel.attn_tp_rank, cfg.policy)
    if shard.kv_heads != kv_heads:
        fail(f"--kv-policy {cfg.policy}: the KV pool holds {kv_heads} heads per layer, the sharding gives "
             f"{shard.kv_heads} (attention TP {parallel.attn_tp_size})")
    rows = model_runner.req_to_token_pool.size + 1
    engine = build_engine(settings, k_buf, v_buf, rows, shard.q_heads, head_offset=shard.kv_head_offset,
                          total_kv_heads=shard.total_kv_heads)
    # Each KV head's replicas and every TP rank run the same rounds: count them once, on
    # the first attention-TP rank.
    adapter = VaseScheduler(settings, engine, model_runner.req_to_token_pool,
                            count_totals=parallel.attn_tp_rank == 0)
    runtime.install(adapter)
    if ops.resolve_backend(k_buf.device) == "triton":
        adapter.warm_up()  # compile now, not in the middle of a decode step
    memory = policy_memory(cfg, shard, k_buf.shape[0], head_dim, k_buf.element_size(), rows, settings.auto,
                           settings.telemetry.enabled)
    logger.info(
        "vase-sglang: policy %s, budget %d + recent %d slots per request, layer and KV head; "
        "query ring %d bytes per request x %d request slots = %.1f MiB, score state %d bytes per request = "
        "%.1f MiB, round temporaries %.1f MiB (all counted before the KV pool was sized); KV pool %d tokens, "
        "%d layers x %d KV heads x %d dims",
        cfg.policy, cfg.budget, cfg.recent, memory.ring_bytes_per_request, memory.request_slots,
        memory.ring_bytes / 2**20, memory.state_bytes_per_request, memory.state_bytes / 2**20,
        memory.workspace_bytes / 2**20,
        model_runner.max_total_num_tokens, k_buf.shape[0], kv_heads, head_dim,
    )
