"""Every attribute of an SGLang object that vase-sglang reads, writes, overrides or names,
as typed Protocols.

``patches/manifest.py`` lists the module-level names we hook, set, call, mirror or find
on the stack; this module lists the data and methods we touch on SGLang's objects (request,
batch, pools, forward batch, configs, server args, request bodies, the HTTP server's
state, the output streamer we subclass, the hook registry). The hooks and
``VaseScheduler`` take these Protocols as types, so mypy refuses an attribute that is not
declared here; ``tests/unit/test_manifest.py`` checks every declaration against the
pinned SGLang (``check_all``), so a renamed attribute fails by name instead of reading a
``getattr`` default, overriding nothing, or raising inside a decode step.

An attribute counts as defined by the SGLang class when it is a field or annotation of
the class (or a base), a class attribute, method or property, or assigned as
``self.<name>`` in a method of the class or a base.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import pkgutil
import textwrap
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any, ClassVar, Protocol

import torch

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
    # Request-body keys patches/guards/bodies.py checks beyond their declared types.
    n: int
    top_k: int
    stop_regex: str | list[str] | None


class SamplingParamsFilledBySGLang(Protocol):
    """SamplingParams fields SGLang fills itself: patches/guards/bodies.py refuses them in a
    request body (its INTERNAL_SAMPLING_FIELDS are these names)."""

    stop_strs: Any
    stop_regex_strs: Any
    stop_str_max_len: Any
    stop_regex_max_len: Any
    is_normalized: Any
    ebnf_full_assistant: Any


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


class RuntimeContext(Protocol):
    server_args: ServerArgs


class SchedulerOutputStreamer(Protocol):
    """What patches/io.py's subclass overrides: a rename upstream would leave it unused."""

    has_additional_customized_info: bool

    def build_additional_customized_info(self, reqs: list[Any]) -> dict[str, list[Any]]: ...


class GetInternalStateReqOutput(Protocol):
    internal_state: dict[str, Any]


# ---- data-parallel controller process -------------------------------------------------------


class DataParallelController(Protocol):
    """What patches/cpu_engine.py's event loop uses, as SGLang's loop does."""

    soft_watchdog: Any  # sglang.srt.utils.watchdog.Watchdog: feed()
    recv_from_tokenizer: Any  # a zmq PULL socket

    def _request_dispatcher(self, recv_req: Any) -> Any: ...


# ---- main process ---------------------------------------------------------------------------


class TokenizerManager(Protocol):
    model_config: ModelConfig
    rid_to_state: dict[str, Any]
    gracefully_exit: bool

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None: ...

    async def get_internal_state(self) -> list[dict[str, Any]]: ...


class GlobalState(Protocol):
    """The HTTP server's state (``http_server.get_global_state()``)."""

    tokenizer_manager: TokenizerManager


class ReqInput(Protocol):
    """What patches/guards/bodies.py reads on both request bodies, GenerateReqInput and
    EmbeddingReqInput (``is_single`` and ``batch_size`` once normalised)."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]  # dataclasses.fields() reads each field
    text: Any
    input_ids: Any
    input_embeds: Any
    image_data: Any
    sampling_params: Any
    rid: Any
    positional_embed_overrides: Any
    is_single: bool
    batch_size: int

    def __getitem__(self, i: int) -> Any: ...  # one prompt of a batch, as the tokenizer manager splits it


class GenerateReqInput(ReqInput, Protocol):
    """What patches/guards/bodies.py reads only on GenerateReqInput (``/generate`` and the OpenAI routes)."""

    session_params: dict[str, Any] | None
    bootstrap_room: Any
    logprob_start_len: int | None
    top_logprobs_num: int | None
    token_ids_logprob: Any


class VertexGenerateReqInput(Protocol):
    parameters: dict[str, Any] | None


class HookRegistry(Protocol):
    """SGLang's hook registry, used through its class: patches/hooks.py registers, applies,
    and reads ``_patched`` to verify that each hook took."""

    _patched: set[str]

    def register(self, target: str, hook: Callable[..., Any], hook_type: Any = ...) -> None: ...

    def apply_hooks(self) -> None: ...


class HookType(Protocol):
    BEFORE: Any
    AFTER: Any
    AROUND: Any
    REPLACE: Any


# Each Protocol and the SGLang class it describes.
CONTRACTS: tuple[tuple[type, str], ...] = (
    (ReqKvInfo, "sglang.srt.managers.schedule_batch.ReqKvInfo"),
    (SamplingParams, "sglang.srt.sampling.sampling_params.SamplingParams"),
    (SamplingParamsFilledBySGLang, "sglang.srt.sampling.sampling_params.SamplingParams"),
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
    (RuntimeContext, "sglang.srt.runtime_context.RuntimeContext"),
    (SchedulerOutputStreamer, "sglang.srt.managers.scheduler_components.output_streamer.SchedulerOutputStreamer"),
    (GetInternalStateReqOutput, "sglang.srt.managers.io_struct.GetInternalStateReqOutput"),
    (DataParallelController, "sglang.srt.managers.data_parallel_controller.DataParallelController"),
    (TokenizerManager, "sglang.srt.managers.tokenizer_manager.TokenizerManager"),
    (GlobalState, "sglang.srt.entrypoints.http_server._GlobalState"),
    (ReqInput, "sglang.srt.managers.io_struct.GenerateReqInput"),
    (ReqInput, "sglang.srt.managers.io_struct.EmbeddingReqInput"),
    (GenerateReqInput, "sglang.srt.managers.io_struct.GenerateReqInput"),
    (VertexGenerateReqInput, "sglang.srt.managers.io_struct.VertexGenerateReqInput"),
    (HookRegistry, "sglang.srt.plugins.hook_registry.HookRegistry"),
    (HookType, "sglang.srt.plugins.hook_registry.HookType"),
)


def _protocol_machinery() -> frozenset[str]:
    class Bare(Protocol):
        pass

    return frozenset(vars(Bare))  # what typing puts in every Protocol's namespace


_PROTOCOL_MACHINERY = _protocol_machinery()


def members(protocol: type) -> list[str]:
    """The attributes and methods a Protocol declares itself (not those of the Protocols it
    extends), in declaration order."""
    names = list(protocol.__dict__.get("__annotations__", {}))
    names += [n for n, v in protocol.__dict__.items() if callable(v) and n not in _PROTOCOL_MACHINERY]
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
        # Both are descriptors, not containers, on msgspec's own base classes.
        annotations = getattr(klass, "__annotations__", {})
        if name in klass.__dict__ or (isinstance(annotations, dict) and name in annotations):
            return True
        struct_fields = getattr(klass, "__struct_fields__", ())  # msgspec
        if isinstance(struct_fields, tuple) and name in struct_fields:
            return True
        if name in _assigned_on_self(klass):
            return True
    return False


def check(protocol: type, path: str) -> list[str]:
    """One line per declared attribute the SGLang class at ``path`` does not define."""
    try:
        cls = pkgutil.resolve_name(path)
    except Exception as exc:  # noqa: BLE001 - any import or lookup failure breaks the contract
        return [f"{path}: cannot be resolved ({type(exc).__name__}: {exc})"]
    return [f"{path}.{name}: not defined by SGLang (declared in vase_sglang/plugin/contract.py {protocol.__name__})"
            for name in members(protocol) if not defines(cls, name)]


def check_all() -> list[str]:
    """Problems with every contract, one line each; empty when all hold."""
    return [line for protocol, path in CONTRACTS for line in check(protocol, path)]
