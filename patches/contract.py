"""Every attribute of an SGLang object that vase-sglang reads or writes, as typed Protocols.

``manifest.py`` lists the functions we hook, set or call; this module lists the data we
touch on SGLang's objects (request, batch, pools, forward batch, configs, server args).
The hooks and ``VaseScheduler`` take these Protocols as parameter types, so mypy refuses
an attribute that is not declared here; ``tests/unit/test_manifest.py`` checks every
declaration against the pinned SGLang (``check_all``), so a renamed attribute fails by
name instead of reading a ``getattr`` default or raising inside a decode step.

An attribute counts as defined by the SGLang class when it is a field or annotation of
the class (or a base), a class attribute, method or property, or assigned as
``self.<name>`` in a method of the class or a base.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Sequence
from functools import cache
from typing import Any, Protocol

import torch

from . import manifest

# ---- scheduler process: requests and batches ---------------------------------------------


class ReqKvInfo(Protocol):
    req_pool_idx: int  # the request's row of req_to_token (None only while it has none)
    kv_committed_len: int
    kv_allocated_len: int
    cache_protected_len: int  # leading columns owned by the radix tree


class SamplingParams(Protocol):
    max_new_tokens: int
    custom_params: dict[str, Any] | None
    sampling_seed: int | None


class Req(Protocol):
    rid: str
    kv: ReqKvInfo
    origin_input_ids: Sequence[int]  # array('q') or list
    output_ids: Sequence[int]
    sampling_params: SamplingParams
    retraction_count: int
    tokenizer: Any  # the scheduler's tokenizer (None with --skip-tokenizer-init)
    finished_reason: Any  # a BaseFinishReason once finished
    finished_len: int | None  # output tokens the request keeps when it finishes

    def finished(self) -> bool: ...


class TokenToKVPoolAllocator(Protocol):
    def free(self, free_index: torch.Tensor) -> None: ...


class ScheduleBatch(Protocol):
    reqs: list[Req]
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    orig_seq_lens: torch.Tensor | None
    seq_lens_sum: int | None
    token_to_kv_pool_allocator: TokenToKVPoolAllocator


class ReqToTokenPool(Protocol):
    size: int
    req_to_token: torch.Tensor  # [rows, columns] of slot indices
    req_generation: torch.Tensor  # per row: how many times it was allocated


class ForwardMode(Protocol):
    def is_decode(self) -> bool: ...


class ForwardBatch(Protocol):
    forward_mode: ForwardMode
    positions: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    extend_seq_lens: torch.Tensor | None


class AttentionLayer(Protocol):
    layer_id: int


# ---- scheduler process: model, pools, start-up ---------------------------------------------


class ModelConfig(Protocol):
    model_path: str
    context_len: int
    num_attention_heads: int
    num_hidden_layers: int
    head_dim: int
    vocab_size: int
    hf_text_config: Any
    attention_arch: Any

    def get_total_num_kv_heads(self) -> int: ...


class Scheduler(Protocol):
    max_req_len: int
    model_config: ModelConfig


class MHATokenToKVPool(Protocol):
    layer_num: int
    page_size: int
    device: str
    store_dtype: torch.dtype
    use_hnd: bool
    kv_cache_layout: str
    enable_custom_mem_pool: bool
    custom_mem_pool: Any
    memory_saver_adapter: Any
    k_buffer: list[torch.Tensor]
    v_buffer: list[torch.Tensor]

    def _kv_buffer_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]: ...


class KVCacheConfigurator(Protocol):
    model_config: ModelConfig
    kv_cache_dtype: torch.dtype


class ModelRunner(Protocol):
    model_config: ModelConfig
    token_to_kv_pool: MHATokenToKVPool
    req_to_token_pool: ReqToTokenPool
    max_total_num_tokens: int


class ParallelContext(Protocol):
    attn_tp_size: int
    attn_tp_rank: int


class ServerArgs(Protocol):
    model_path: str
    device: str | None
    tp_size: int
    pp_size: int
    page_size: int | None
    max_running_requests: int | None
    attention_backend: str | None
    decode_attention_backend: str | None
    prefill_attention_backend: str | None
    kv_cache_dtype: str
    speculative_algorithm: str | None
    enable_mixed_chunk: bool
    disaggregation_mode: str
    enable_hierarchical_cache: bool
    disable_overlap_schedule: bool
    disable_prefill_cuda_graph: bool
    cuda_graph_backend_prefill: Any


# ---- main process ---------------------------------------------------------------------------


class TokenizerManager(Protocol):
    model_config: ModelConfig
    rid_to_state: dict[str, Any]
    gracefully_exit: bool

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None: ...


# Each Protocol and the SGLang class it describes.
CONTRACTS: tuple[tuple[type, str], ...] = (
    (ReqKvInfo, "sglang.srt.managers.schedule_batch.ReqKvInfo"),
    (SamplingParams, "sglang.srt.sampling.sampling_params.SamplingParams"),
    (Req, "sglang.srt.managers.schedule_batch.Req"),
    (TokenToKVPoolAllocator, "sglang.srt.mem_cache.allocator.base.BaseTokenToKVPoolAllocator"),
    (ScheduleBatch, "sglang.srt.managers.schedule_batch.ScheduleBatch"),
    (ReqToTokenPool, "sglang.srt.mem_cache.memory_pool.ReqToTokenPool"),
    (ForwardMode, "sglang.srt.model_executor.forward_batch_info.ForwardMode"),
    (ForwardBatch, "sglang.srt.model_executor.forward_batch_info.ForwardBatch"),
    (AttentionLayer, "sglang.srt.layers.radix_attention.RadixAttention"),
    (ModelConfig, "sglang.srt.configs.model_config.ModelConfig"),
    (Scheduler, "sglang.srt.managers.scheduler.Scheduler"),
    (MHATokenToKVPool, "sglang.srt.mem_cache.memory_pool.MHATokenToKVPool"),
    (KVCacheConfigurator, "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator"),
    (ModelRunner, "sglang.srt.model_executor.model_runner.ModelRunner"),
    (ParallelContext, "sglang.srt.runtime_context.ParallelContext"),
    (ServerArgs, "sglang.srt.server_args.ServerArgs"),
    (TokenizerManager, "sglang.srt.managers.tokenizer_manager.TokenizerManager"),
)


def members(protocol: type) -> list[str]:
    """The attributes and methods a Protocol declares, in declaration order."""
    names = list(protocol.__dict__.get("__annotations__", {}))
    names += [n for n, v in protocol.__dict__.items() if callable(v) and not n.startswith("__")]
    return names


@cache
def _assigned_on_self(cls: type) -> frozenset[str]:
    """Names a class's own methods assign as ``self.<name>`` (annotated or not)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return frozenset()
    names = set()
    for node in ast.walk(tree):
        targets: list[ast.expr] = list(node.targets) if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
        while targets:
            t = targets.pop()
            if isinstance(t, (ast.Tuple, ast.List)):  # self.a, self.b = ...
                targets.extend(t.elts)
            elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                names.add(t.attr)  # not self.a.b = ..., which assigns b on another object
    return frozenset(names)


def defines(cls: type, name: str) -> bool:
    """Whether instances of ``cls`` have ``name``, by the rules in the module docstring."""
    for klass in inspect.getmro(cls):
        if klass is object:
            continue
        if name in klass.__dict__ or name in getattr(klass, "__annotations__", {}):
            return True
        if name in getattr(klass, "__struct_fields__", ()):  # msgspec
            return True
        if name in _assigned_on_self(klass):
            return True
    return False


def check(protocol: type, path: str) -> list[str]:
    """One line per declared attribute the SGLang class at ``path`` does not define."""
    try:
        cls = manifest.resolve(path)
    except Exception as exc:  # noqa: BLE001 - any import or lookup failure breaks the contract
        return [f"{path}: cannot be resolved ({type(exc).__name__}: {exc})"]
    return [f"{path}.{name}: not defined by SGLang (declared in patches/contract.py {protocol.__name__})"
            for name in members(protocol) if not defines(cls, name)]


def check_all() -> list[str]:
    """Problems with every contract, one line each; empty when all hold."""
    return [line for protocol, path in CONTRACTS for line in check(protocol, path)]
