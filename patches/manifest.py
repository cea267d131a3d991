"""Every SGLang name vase-sglang hooks, assigns, calls, mirrors or finds on the stack, listed
once, with the contract we rely on.

Kinds: ``before``, ``after``, ``around`` and ``replace`` go through SGLang's
``HookRegistry``; ``set`` assigns an attribute or registry entry; ``call`` is a function,
class or object the plugin uses directly (calls, instantiates, subclasses, tests against,
adds a route to); ``mirror`` is upstream logic our own code repeats, neither hooked nor
called, so its source is pinned; ``role`` is the function an SGLang child process runs,
which calls ``load_plugins()``: ``patches/entry.py`` tells which process
loads the plugin by finding that function's name on the stack. The attributes the plugin
reads or writes on SGLang's objects are declared in ``contract.py``, not here.

The hook decorator only accepts targets listed here (with the same kind), the plugin
checks each target of its process against its entry at start-up (every kind but ``role``,
which is read before), and ``tests/unit/test_manifest.py`` checks all of them offline
against the pinned SGLang, so a version bump that renames a target or changes a signature
fails with the target's name instead of serving wrong results.

``params`` is the full parameter list of the target as SGLang 0.5.23 defines it: the
hooks read arguments by these names and positions. ``source_sha256`` pins the upstream
source of a target whose logic we re-implement or mirror rather than call, or whose
internals our code relies on (see ``why``): when it changes upstream, our copy must be
re-read. ``used_in`` names the file that uses a target no hook is registered for (kinds
``call``, ``mirror``, ``role``); a hooked target's file is its hook's module.

``python -m vase_sglang.patches.docgen`` prints the tables of ``docs/hooks.md`` from this
list and ``vase_sglang/plugin/contract.py``; ``--write docs/hooks.md`` rewrites them there.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import pkgutil
import textwrap
from dataclasses import dataclass
from typing import Any

from .backends import BACKEND_CLASSES

SGLANG_VERSION = "0.5.23"

BEFORE, AFTER, AROUND, REPLACE = "before", "after", "around", "replace"
SET = "set"  # an attribute or registry entry we assign (no HookRegistry)
CALL = "call"  # a function, class or object we use directly: call, instantiate, subclass, isinstance
MIRROR = "mirror"  # upstream logic our own code repeats: not hooked, not called; source pinned
ROLE = "role"  # the function a child process runs (it calls load_plugins()): names the process's role
KINDS = (BEFORE, AFTER, AROUND, REPLACE, SET, CALL, MIRROR, ROLE)
HOOKED = (BEFORE, AFTER, AROUND, REPLACE)  # applied through SGLang's HookRegistry
APPLIED = (*HOOKED, SET)  # each owns one function in patches/: a hook or an installer

# "main": the HTTP server and tokenizer process; "scheduler"; "controller": the data-parallel
# controller (only the CPU engine's fixes apply there); "other": an SGLang child the plugin
# leaves untouched (the detokenizer), named only by role entries.
PROCESSES = ("main", "scheduler", "controller", "other")

# The parts of the plugin, installed separately (``patches/entry.py``'s ``main_parts``): "flags"
# (the --kv-* flag parser) at once in the main process; "guards" (the HTTP hardening,
# patches/guards/) with --kv-guards on; "eviction" (everything else) unless --kv-policy none
# and --kv-guards off, where the plugin steps aside and SGLang serves untouched.
# "cpu_engine" (patches/cpu_engine.py: fixes of SGLang's CPU engine, not of eviction) in
# every process it names whenever SGLANG_USE_CPU_ENGINE=1, whatever the policy.
FLAGS, EVICTION, GUARDS, CPU_ENGINE = "flags", "eviction", "guards", "cpu_engine"
PARTS = (FLAGS, EVICTION, GUARDS, CPU_ENGINE)


# The parameters of each backend's forward_decode and forward_extend.
_ATTENTION = ("self", "q", "k", "v", "layer", "forward_batch", "save_kv_cache")
BACKEND_PARAMS = {"torch_native": _ATTENTION, "triton": (*_ATTENTION, "sinks", "score_mod", "aux_tensors"),
                  "flashinfer": _ATTENTION}

# The OpenAI serving classes (under sglang.srt.entrypoints.openai), their response builder,
# their stream and the route they serve; patches/openai_meta.py hooks both of each.
OPENAI_ROUTES = (
    ("serving_chat.OpenAIServingChat", "_build_chat_response", "_generate_chat_stream", "/v1/chat/completions"),
    ("serving_completions.OpenAIServingCompletion", "_build_completion_response", "_generate_completion_stream",
     "/v1/completions"),
)


@dataclass(frozen=True)
class Target:
    target: str
    kind: str
    process: str  # one of PROCESSES: where the target is applied or used; for ROLE, the role it gives
    why: str
    params: tuple[str, ...] | None = None  # None: not checked as a function (see ``expect``)
    expect: str | None = None  # for targets that are not functions: "class", "int", "dict" or "object"
    source_sha256: str | None = None
    needs: str | None = None  # applied only where this package is installed
    used_in: str | None = None  # for CALL, MIRROR and ROLE: the file (from the repository root) that uses it
    part: str = "eviction"  # one of PARTS: which switch installs it


MANIFEST: tuple[Target, ...] = (
    # ---- main process: flags, validation, HTTP -------------------------------------------
    Target("sglang.srt.arg_groups.arg_utils.add_cli_args_from_dataclass", AFTER, "main",
           "add the --kv-* flags to SGLang's parser (shown in --help, choices checked by argparse)",
           ("parser", "cls", "fields"), part=FLAGS),
    Target("sglang.srt.server_args.prepare_server_args", AROUND, "main",
           "build the PolicyConfig from the flags, export it to the children, turn off the overlap scheduler",
           ("argv",), part=FLAGS),
    Target("sglang.srt.arg_groups.validation_hook.check_server_args", AFTER, "main",
           "reject server options the eviction path cannot run with, on the resolved values",
           ("server_args",)),
    Target("sglang.srt.sampling.sampling_params.SamplingParams.verify", AFTER, "main",
           "validate custom_params kv_* fields once (ValueError -> HTTP 400) and stamp the result",
           ("self", "vocab_size")),
    Target("sglang.srt.managers.io_struct.GenerateReqInput.normalize_batch_and_arguments", AROUND, "main",
           "type-check sampling_params and answer a malformed /generate body with HTTP 400, not 500",
           ("self",), part=GUARDS),
    Target("sglang.srt.managers.io_struct.EmbeddingReqInput.normalize_batch_and_arguments", AROUND, "main",
           "the same checks for /encode, /classify, /v1/embeddings and /v1/classify (a rid list that does not "
           "match the prompts was an HTTP 500)", ("self",), part=GUARDS),
    Target("sglang.srt.entrypoints.openai.serving_tokenize.OpenAIServingDetokenize._handle_non_streaming_request",
           BEFORE, "main", "token ids outside the vocabulary are the client's error (HTTP 400), not a failed decode "
           "(500)", ("self", "adapted_request", "request", "raw_request"), part=GUARDS),
    Target("sglang.srt.function_call.function_call_parser.FunctionCallParser.__init__", AROUND, "main",
           "an unknown tool_call_parser on /parse_function_call is an HTTP 400 (the handler lets the ValueError "
           "through as a 500)", ("self", "tools", "tool_call_parser", "tokenizer", "tool_choice", "prefix",
                                 "constrained"), part=GUARDS),
    Target("sglang.srt.parser.reasoning_parser.ReasoningParser.__init__", AROUND, "main",
           "an unknown reasoning_parser on /separate_reasoning is an HTTP 400, not a 500",
           ("self", "model_type", "stream_reasoning", "force_reasoning", "request", "tokenizer",
            "tool_call_parser_active", "prefix"), part=GUARDS),
    Target("sglang.srt.entrypoints.ollama.serving.OllamaServing.handle_chat", AROUND, "main",
           "a bad Ollama request is an HTTP 400 before the stream starts (it was a 500, or a stream cut short)",
           ("self", "request", "raw_request"), part=GUARDS),
    Target("sglang.srt.entrypoints.ollama.serving.OllamaServing.handle_generate", AROUND, "main",
           "the same for /api/generate", ("self", "request", "raw_request"), part=GUARDS),
    Target("fastapi.dependencies.utils.request_body_to_args", AROUND, "main",
           "an exception in SGLang's own pydantic validators of an OpenAI body (e.g. a list response_format) "
           "is the client's malformed input, and so is a /vertex_generate parameter that GenerateReqInput does "
           "not take: HTTP 400, not 500",
           ("body_fields", "received_body", "embed_body_fields"), part=GUARDS),
    Target("sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request", BEFORE, "main",
           "reject out-of-vocabulary token ids and empty prompts with HTTP 400 before they crash the scheduler",
           ("self", "obj", "input_ids"), part=GUARDS),
    Target("sglang.srt.managers.tokenizer_manager.TokenizerManager.sigterm_watchdog", AROUND, "main",
           "bound the drain after SIGTERM: abort what still runs after VASE_SGLANG_DRAIN_TIMEOUT, then SGLang's "
           "own clean shutdown", ("self",), part=GUARDS),
    Target("sglang.srt.managers.tokenizer_manager.TokenizerManager.update_request_meta_info", AROUND, "main",
           "our meta_info values are scalars, not per-token lists; a request's last kv_* fields are kept for its "
           "OpenAI stream's final chunk", ("self", "meta_info", "state", "customized_info", "index", "finish_reason")),
    Target("sglang.srt.entrypoints.http_server.launch_server", BEFORE, "main",
           "add GET /kv_policy to the app",
           ("server_args", "init_tokenizer_manager_func", "run_scheduler_process_func",
            "run_detokenizer_process_func", "execute_warmup_func", "launch_callback")),
    # The two OpenAI routes, each hooked the same way: the response builder and the stream.
    *(Target(f"sglang.srt.entrypoints.openai.{serving}.{method}", AROUND, "main", f"{why} {route}: {what}", params)
      for serving, builder, stream, route in OPENAI_ROUTES
      for method, why, what, params in (
          (builder, "non-streaming", "the choices' kv_* fields in the response's metadata.kv",
           ("self", "request", "ret", "created")),
          (stream, "streaming", "a last chunk before [DONE] with metadata.kv",
           ("self", "adapted_request", "request", "raw_request")))),
    Target("sglang.srt.entrypoints.engine.Engine.server_args_class", SET, "main",
           "sglang.Engine(kv_policy=...): a factory that takes the kv_* keyword arguments",
           expect="class", part=FLAGS),
    Target("sglang.srt.arg_groups.model_override_base.resolving_view", CALL, "main",
           "the resolved view of the server args that check_server_args' hook checks", ("server_args",),
           used_in="patches/server_args.py"),
    Target("sglang.srt.managers.io_struct.SessionParams", CALL, "main",
           "a /generate body's session_params must build one (an unknown key was an HTTP 500)", expect="class",
           used_in="patches/guards/bodies.py", part=GUARDS),
    Target("sglang.srt.managers.embed_types.PositionalEmbeds", CALL, "main",
           "the only value positional_embed_overrides may hold (Python callers only; null over HTTP)",
           expect="class", used_in="patches/guards/bodies.py", part=GUARDS),
    Target("sglang.srt.entrypoints.http_server.get_global_state", CALL, "main",
           "GET /kv_policy reaches the tokenizer manager through it (live totals of every scheduler)", (),
           used_in="patches/io.py"),
    Target("sglang.srt.entrypoints.http_server.app", CALL, "main",
           "SGLang's FastAPI app: GET /kv_policy is added to it", expect="object", used_in="patches/io.py"),
    # ---- scheduler: memory -----------------------------------------------------------------
    Target("sglang.srt.mem_cache.memory_pool.MHATokenToKVPool._create_buffers_normal", AROUND, "scheduler",
           "carve every layer's K/V out of one allocation so the kernels see [layers, slots, heads, dim]; "
           "re-implements the allocation (same shapes and strides), so its source is pinned",
           ("self",),
           source_sha256="979426bbd40e8a889f1007dd27b1a68774451252f952efddb627bea9a8f421ab"),
    Target("sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._profile_available_bytes", AROUND,
           "scheduler", "subtract the policy memory (plugin/planning.py's policy_memory: the query ring, the score "
           "state of the policies that remember attention, and the round workspace of one batched round) from the "
           "bytes the KV pool may use", ("self", "pre_model_load_memory")),
    Target("sglang.srt.model_executor.model_runner.ModelRunner._init_post_memory_pool_components", AFTER,
           "scheduler", "build the VaseScheduler over the pools and check the model", ("self",)),
    Target("sglang.srt.runtime_context.get_parallel", CALL, "scheduler",
           "attn_tp_size / attn_tp_rank: which query and KV heads this rank holds", (),
           used_in="patches/memory.py"),
    Target("sglang.srt.runtime_context.get_context", CALL, "scheduler",
           "the server args (tp_size, max_running_requests) the policy memory is sized for", (),
           used_in="patches/memory.py"),
    Target("sglang.srt.mem_cache.memory_pool.ceil_align", CALL, "scheduler",
           "the one allocation pads each layer's rows to a page, as SGLang's own allocation does", ("x", "y"),
           used_in="patches/memory.py"),
    Target("sglang.srt.mem_cache.memory_pool.GPU_MEMORY_TYPE_KV_CACHE", CALL, "scheduler",
           "the memory-saver region the one allocation is made in, as SGLang's own", expect="object",
           used_in="patches/memory.py"),
    # ---- scheduler: decode step ------------------------------------------------------------
    Target("sglang.srt.mem_cache.allocation.ALLOC_FOR_DECODE_FUNCS", SET, "scheduler",
           "our decode allocator for 'cpu' and 'cuda': rounds run before the step's allocation", expect="dict"),
    Target("sglang.srt.mem_cache.allocation.alloc_for_decode_default", CALL, "scheduler",
           "the default decode allocation, called after the rounds; it writes the step's token at batch.seq_lens and "
           "adds 1 to kv_committed_len / kv_allocated_len, which VaseScheduler.shrink_rows sets to the shortened "
           "row before it, so its source is pinned", ("batch", "token_per_req"),
           source_sha256="6d1d0b8ad6c7fd94a51fbbf2a379cfc48e098fe5035a714770e6954888131644",
           used_in="patches/decode.py"),
    Target("sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_decode", MIRROR, "scheduler",
           "VaseScheduler.shrink_rows repeats its seq-lens bookkeeping for the rows a round shortened: seq_lens, "
           "seq_lens_cpu and orig_seq_lens replaced by new tensors, seq_lens_sum reset to None (the kv lengths half "
           "is alloc_for_decode_default's)", ("self",),
           source_sha256="1690ff7deee18f0f8a4477dfe65f155714065e998da4d31a3e046bd1757d1ae2",
           used_in="vase_sglang/plugin/scheduler.py"),
    Target("sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new", AFTER, "scheduler",
           "decode positions += delta: RoPE positions stay logical",
           ("cls", "batch", "model_runner", "capture_hidden_mode", "return_hidden_states_before_norm",
            "extend_position_info", "spec_mrope_positions", "kv_loc_plan", "write_cols")),
    # Query capture on each attention backend of backends.py: its decode and its extend.
    *(Target(f"{cls}.{method}", AROUND, "scheduler", why, BACKEND_PARAMS[name],
             needs="flashinfer" if name == "flashinfer" else None)
      for method, why in (("forward_decode", "record each layer's post-RoPE decode query in the ring"),
                          ("forward_extend", "record the last R post-RoPE queries of each prefill: a re-prefilled "
                                             "region's first round runs at once"))
      for name, cls in BACKEND_CLASSES.items()),
    # ---- scheduler: radix tree -------------------------------------------------------------
    Target("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.checkpoint", BEFORE, "scheduler",
           "never publish a compacted region (its columns hold other positions' KV) to the tree",
           ("self", "req", "up_to", "kwargs")),
    Target("sglang.srt.mem_cache.radix_cache.RadixCache.checkpoint", BEFORE, "scheduler",
           "never publish a compacted region (its columns hold other positions' KV) to the tree",
           ("self", "req", "up_to")),
    # ---- scheduler: admission --------------------------------------------------------------
    Target("sglang.srt.managers.schedule_policy.CLIP_MAX_NEW_TOKENS", SET, "scheduler",
           "new requests reserve prompt + min(max_new_tokens, B + R)", expect="int"),
    Target("sglang.srt.managers.schedule_policy.PrefillAdder._get_running_request_total_token_offset", AROUND,
           "scheduler", "a running evicting request can grow by at most what its region has left; "
           "replaces SGLang's estimate for those requests, so its source is pinned", ("self", "req"),
           source_sha256="64fd33f1c3fee43bd659c89c36274155636d11725fa896aac1fc58c3483c5275"),
    Target("sglang.srt.managers.scheduler.Scheduler.init_req_max_new_tokens", AROUND, "scheduler",
           "an evicting request's output does not live in the pool: only the context length bounds it",
           ("self", "req")),
    Target("sglang.srt.mem_cache.allocator.base.BaseTokenToKVPoolAllocator.max_new_tokens_for_memory", AROUND,
           "scheduler", "an evicting request needs prompt + B + R slots, not prompt + max_new_tokens",
           ("self", "input_tokens", "max_new_tokens", "token_capacity", "sliding_window_size", "chunk_size")),
    # ---- scheduler: telemetry --------------------------------------------------------------
    Target("sglang.srt.managers.schedule_batch.Req.update_finish_state", AFTER, "scheduler",
           "feed each step's accepted tokens to the request's loop detector; end a looping request that stops "
           "on loops; count a re-prefill whose first token finished the request (no decode step follows it)",
           ("self", "new_accepted_len")),
    Target("sglang.srt.managers.schedule_batch.BaseFinishReason", CALL, "scheduler",
           "the base class of FINISH_LOOP, the finish reason of a request ended by kv_stop_on_loop",
           expect="class", used_in="patches/loops.py"),
    # ---- scheduler: output -----------------------------------------------------------------
    Target("sglang.srt.managers.scheduler.Scheduler.get_output_streamer_class", REPLACE, "scheduler",
           "send patches/io.py's META_KEYS with every output: the request's counters (RequestCounters: region "
           "length, evicted tokens, rounds, re-prefilled tokens), its policy and the reason (PolicyChoice), with "
           "--kv-telemetry on the telemetry signals (evicted attention, loop) and with --kv-calibration the KL "
           "estimate; count a finished request's telemetry once (a subclass of SGLang's streamer, not a copy)",
           ("self",)),
    Target("sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController"
           ".get_internal_state", AFTER, "scheduler", "live totals for GET /kv_policy", ("self", "recv_req")),
    # ---- the CPU engine's fixes (SGLANG_USE_CPU_ENGINE=1, any policy) -------------------
    Target("sglang.srt.managers.data_parallel_controller.DataParallelController.event_loop", REPLACE, "controller",
           "SGLang's loop polls the tokenizer socket without blocking, so an idle --dp-size controller keeps a core "
           "busy (half of a 2-core host's engine); ours waits on the socket with zmq poll and then drains it the "
           "same way", ("self",), source_sha256="bc008a8481258e792dbb9c0d91d1883d89a30452472f233e1de5f0b9225b4051",
           part=CPU_ENGINE),
    Target("sglang.srt.distributed.parallel_state.init_model_parallel_group", BEFORE, "scheduler",
           "SGLang turns PyNccl on for every model-parallel group but on NPU/XPU, and PyNccl needs CUDA: --tp-size N "
           "failed on the CPU engine; no PyNccl, custom, MSCCL++ or symmetric-memory all-reduce, so collectives go "
           "through torch.distributed over gloo", ("group_ranks", "local_rank", "backend", "use_pynccl",
                                                   "use_custom_allreduce", "use_message_queue_broadcaster",
                                                   "group_name", "use_mscclpp", "use_torch_symm_mem_allreduce",
                                                   "recovered_rank", "rank_offset", "max_world_size"),
           part=CPU_ENGINE),
    # ---- process roles: read by patches/entry.py before any hook is installed ----------
    Target("sglang.srt.managers.scheduler.run_scheduler_process", ROLE, "scheduler",
           "a scheduler (TP/PP rank) child runs it: the process applies the scheduler entries when the policy evicts",
           used_in="patches/entry.py"),
    Target("sglang.srt.managers.detokenizer_manager.run_detokenizer_process", ROLE, "other",
           "the detokenizer child runs it: nothing is applied there", used_in="patches/entry.py"),
    Target("sglang.srt.managers.data_parallel_controller.run_data_parallel_controller_process", ROLE,
           "controller", "the data-parallel controller child runs it (its schedulers are found by their own entry): "
           "only the CPU engine's fixes are applied there", used_in="patches/entry.py"),
)

BY_TARGET: dict[str, Target] = {t.target: t for t in MANIFEST}


class ContractError(Exception):
    """A target no longer matches its manifest entry. The message starts with the target."""


def resolve(target: str) -> Any:
    """The object at a dotted ``module.attr[.attr]`` path, unwrapping class/static methods."""
    module_path, _, attr = target.rpartition(".")
    owner = pkgutil.resolve_name(module_path)
    # The class's own __dict__ keeps classmethod/staticmethod objects; getattr covers
    # inherited attributes and raises AttributeError for a missing one.
    raw = owner.__dict__[attr] if attr in getattr(owner, "__dict__", {}) else getattr(owner, attr)
    return getattr(raw, "__func__", raw)


def _unwrapped(obj: Any) -> Any:
    # Our own hooks wrap the target (functools.wraps sets __wrapped__): check SGLang's function.
    while hasattr(obj, "__wrapped__"):
        obj = obj.__wrapped__
    return obj


def source_digest(obj: Any) -> str:
    return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()


def calls(obj: Any, name: str) -> bool:
    """Whether the source of function ``obj`` calls ``name(...)`` or ``<something>.name(...)`` itself."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(obj)))
    return any(isinstance(node, ast.Call) and name in (getattr(node.func, "id", None), getattr(node.func, "attr", None))
               for node in ast.walk(tree))


def check(entry: Target) -> None:
    """Raise ContractError if ``entry.target`` is missing or no longer has the expected shape."""
    try:
        obj = _unwrapped(resolve(entry.target))
    except Exception as exc:  # noqa: BLE001 - any import or lookup failure breaks the contract
        raise ContractError(f"{entry.target}: cannot be resolved ({type(exc).__name__}: {exc})") from None
    if entry.expect is not None:
        ok = {"class": isinstance(obj, type) or callable(obj), "int": isinstance(obj, int),
              "dict": isinstance(obj, dict), "object": obj is not None}[entry.expect]
        if not ok:
            raise ContractError(f"{entry.target}: expected a {entry.expect}, found {type(obj).__name__}")
        return
    if entry.kind == ROLE:
        # patches/entry.py matches the code name of each frame on the stack of load_plugins().
        name = entry.target.rpartition(".")[2]
        if getattr(getattr(obj, "__code__", None), "co_name", None) != name:
            raise ContractError(f"{entry.target}: not a function whose code is named {name}; patches/entry.py "
                                "finds the process's role by that name on the stack")
        if not calls(obj, "load_plugins"):
            raise ContractError(f"{entry.target}: no longer calls load_plugins() itself; patches/entry.py "
                                "would not find it on the stack and would take the process for the main one")
    if entry.params is not None:
        try:
            params = tuple(inspect.signature(obj).parameters)
        except (TypeError, ValueError) as exc:
            raise ContractError(f"{entry.target}: no signature ({exc})") from None
        if params != entry.params:
            raise ContractError(f"{entry.target}: parameters are {params}, the hooks expect {entry.params}")
    if entry.source_sha256 is not None:
        digest = source_digest(obj)
        if digest != entry.source_sha256:
            ours = entry.used_in or "our re-implementation"
            raise ContractError(f"{entry.target}: upstream source changed (sha256 {digest[:12]}..., pinned "
                                f"{entry.source_sha256[:12]}...); re-read it against {ours} (see its why), "
                                "then re-pin the new sha256")


def role_functions() -> dict[str, str]:
    """The function names SGLang's child processes run (the ROLE entries), each with the role it gives."""
    return {e.target.rpartition(".")[2]: e.process for e in MANIFEST if e.kind == ROLE}


def available(entry: Target) -> bool:
    """Whether the package the entry needs (if any) is installed, so it is patched here."""
    import importlib.util

    return entry.needs is None or importlib.util.find_spec(entry.needs) is not None


def check_all(process: str | None = None) -> list[str]:
    """Problems with every entry (of one process), one line each; empty when all hold."""
    problems = []
    for entry in MANIFEST:
        if process is not None and entry.process != process:
            continue
        if not available(entry):
            continue
        try:
            check(entry)
        except ContractError as exc:
            problems.append(str(exc))
    return problems
