"""Request bodies for the guard fuzz, derived from SGLang's own request types.

Every field a client can send is read from SGLang 0.5.23 itself: ``GenerateReqInput``'s
dataclass hints (and ``SamplingParams``' for ``sampling_params``) for ``/generate``, the
pydantic models of the OpenAI endpoints, and, for every other POST route of SGLang's
HTTP app, the request type its handler declares. A field or route added upstream is
fuzzed without a change here; a new route must be placed in ``SERVING`` or ``OPERATOR``.

Each field's values come from its type (hypothesis strategies built from the hint), from
known-bad classes for that type (huge and negative numbers, malformed grammars, unknown
adapters, image URLs and embeddings a text model cannot take, out-of-vocabulary ids), and
from arbitrary JSON (the wrong type). A body is a valid one with one to three fields set
this way, so each fuzzed value reaches the code that reads it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal, Union

from hypothesis import strategies as st

from vase_sglang.plugin.options import OPTIONS_KEY
from vase_sglang.registry import POLICY_NAMES

VOCAB = 600  # above the tiny test model's vocabulary (about 500 BPE tokens): ids hit both sides
PROMPT_IDS = [5, 6, 7, 8, 9, 10]
DEPTH = 3  # nesting of models inside models before values become arbitrary JSON

BAD_INTS = (-1, -2, -(2**31), 2**31, 2**63, 10**12, -(10**12))
BAD_FLOATS = (-1.0, 1e30, -1e30, 1e-30)
BAD_STRINGS = (
    "", "(", "[a-", "{", '{"type": "object", "properties": 5}', "root ::= (", "no-such-adapter",
    "data:image/png;base64,AAAA", "http://127.0.0.1:9/x.png", "x" * 300, "\x00", "../../etc/passwd",
)

json_leaf = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
             | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12))
json_any = st.recursive(json_leaf, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c,
                                                                                             max_size=4),
                        max_leaves=8)
# Embeddings of the wrong shape for any model: ragged, empty, and a few rows of 3.
bad_embeddings = st.lists(st.lists(st.floats(-2, 2, allow_nan=False), max_size=3), max_size=3)


def _ints(name: str) -> st.SearchStrategy[int]:
    if "id" in name or "token" in name:  # token ids (and ports, ranks): both sides of the vocabulary
        return st.integers(-3, VOCAB + 3) | st.sampled_from(BAD_INTS)
    return st.integers(-3, 8) | st.sampled_from(BAD_INTS)


def for_hint(hint: Any, name: str = "", depth: int = 0) -> st.SearchStrategy[Any]:
    """Values of the type ``hint`` as JSON, with the bad values of that type."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Annotated:
        return for_hint(args[0], name, depth)
    if hint is Any or depth > DEPTH:
        return json_any
    if hint is type(None):
        return st.none()
    if origin is Union:
        return st.one_of(*(for_hint(a, name, depth) for a in args))
    if origin is Literal:
        return st.sampled_from(args) | st.text(max_size=6)
    if hint is bool:
        return st.booleans()
    if hint is int:
        return _ints(name)
    if hint is float:
        return st.floats(-2, 3, allow_nan=False) | st.sampled_from(BAD_FLOATS)
    if hint in (str, bytes):
        return st.text(max_size=12) | st.sampled_from(BAD_STRINGS)
    if origin in (list, tuple, set) or hint in (list, tuple):
        return st.lists(for_hint(args[0] if args else Any, name, depth + 1), max_size=4)
    if origin is dict or hint is dict:
        value = args[1] if len(args) == 2 else Any
        return st.dictionaries(st.text(max_size=8), for_hint(value, name, depth + 1), max_size=3)
    if isinstance(hint, type):
        fields = type_fields(hint)
        if fields:
            return st.fixed_dictionaries({}, optional={k: for_hint(v, k, depth + 1) for k, v in fields.items()})
    return json_any


def fuzzed(hint: Any, name: str) -> st.SearchStrategy[Any]:
    """A field's values: of its type (bad values of that type included), or any JSON."""
    typed = for_hint(hint, name)
    if "embeds" in name:
        typed = typed | bad_embeddings
    return typed | json_any


def type_fields(cls: type) -> dict[str, Any]:
    """The JSON keys of a request type and their hints: a pydantic model's fields (by alias),
    a dataclass's, or a msgspec struct's; empty for anything else."""
    fields = getattr(cls, "model_fields", None)
    if isinstance(fields, dict):
        return {(f.alias or n): f.annotation for n, f in fields.items()}
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # hints naming types that are not importable here
        hints = dict(getattr(cls, "__annotations__", {}))
    if dataclasses.is_dataclass(cls):
        return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls) if f.init}
    struct_fields = getattr(cls, "__struct_fields__", None)
    if struct_fields:
        return {n: hints.get(n, Any) for n in struct_fields}
    return {}


@functools.cache
def sampling_fields() -> dict[str, Any]:
    import msgspec
    from sglang.srt.sampling.sampling_params import SamplingParams

    from vase_sglang.patches.guards.bodies import INTERNAL_SAMPLING_FIELDS

    return {f.name: f.type for f in msgspec.structs.fields(SamplingParams) if f.name not in INTERNAL_SAMPLING_FIELDS}


@functools.cache
def generate_fields() -> dict[str, Any]:
    """Every field of ``GenerateReqInput``, SGLang's ``/generate`` body."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    return type_fields(GenerateReqInput)


# The plugin's own per-request fields, inside custom_params: valid, invalid and misspelt.
kv_fields = st.fixed_dictionaries({}, optional={
    "kv_policy": st.sampled_from([*POLICY_NAMES, "auto", "bogus"]) | json_any,
    "kv_budget": st.sampled_from([0, 8, 16, 24, 32, 40, 64, -8]) | json_any,
    "kv_n_large": st.integers(-2, 40) | json_any,
    "kv_seed": st.integers(-2, 2**64) | json_any,
    "kv_recent": st.integers(-1, 16) | json_any,
    "kv_budjet": json_any,
    OPTIONS_KEY: json_any,  # a client's forged copy of the carried options: dropped
})


def field_strategies(fields: dict[str, Any]) -> dict[str, st.SearchStrategy[Any]]:
    out = {name: fuzzed(hint, name) for name, hint in fields.items()}
    if "custom_params" in out:
        out["custom_params"] = kv_fields | out["custom_params"]
    if "sampling_params" in out:  # Dict[str, Any] in the hints; SamplingParams' fields in fact
        params = {k: fuzzed(v, k) for k, v in sampling_fields().items()}
        params["custom_params"] = kv_fields | params["custom_params"]
        # Mostly a few tokens, so that bodies SGLang accepts stay quick to serve.
        max_new = st.integers(1, 8) | params.pop("max_new_tokens")
        one = st.fixed_dictionaries({"max_new_tokens": max_new}, optional=params)
        out["sampling_params"] = one | st.lists(one, max_size=4) | json_any
    return out


def bodies(base: st.SearchStrategy[dict], fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict]:
    """A valid ``base`` body with one to three of ``fields`` set to fuzzed values."""
    names = sorted(fields)

    @st.composite
    def build(draw: Callable[..., Any]) -> dict:
        body = dict(draw(base))
        for name in draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True)):
            body[name] = draw(fields[name])
        return body

    return build()


SMALL = {"max_new_tokens": 4}
# One prompt and a batch of two, as text and as ids: list-valued fields then meet both forms.
GENERATE_BASES: st.SearchStrategy[dict] = st.sampled_from([
    {"text": "Hello there", "sampling_params": SMALL},
    {"text": ["Hello", "Good day"], "sampling_params": SMALL},
    {"input_ids": PROMPT_IDS, "sampling_params": SMALL},
    {"input_ids": [PROMPT_IDS, PROMPT_IDS[:3]], "sampling_params": SMALL},
])
MESSAGES = [{"role": "user", "content": "Hello"}]
# Valid bodies for the routes whose handlers generate text; other routes start from {}.
BASES: dict[str, dict] = {
    "/v1/completions": {"model": "m", "prompt": "Hello", "max_tokens": 4},
    "/v1/chat/completions": {"model": "m", "messages": MESSAGES, "max_tokens": 4},
    "/invocations": {"model": "m", "messages": MESSAGES, "max_tokens": 4},
    "/v1/responses": {"model": "m", "input": "Hello", "max_output_tokens": 4},
    "/v1/messages": {"model": "m", "messages": MESSAGES, "max_tokens": 4},
    "/api/chat": {"model": "m", "messages": MESSAGES, "options": {"num_predict": 4}},
    "/api/generate": {"model": "m", "prompt": "Hello", "options": {"num_predict": 4}},
    "/v1/embeddings": {"model": "m", "input": "Hello"},
    "/encode": {"text": "Hello"},
    "/classify": {"text": "Hello"},
    "/v1/classify": {"model": "m", "input": "Hello"},
    "/tokenize": {"model": "m", "prompt": "Hello"},
    "/v1/tokenize": {"model": "m", "prompt": "Hello"},
    "/detokenize": {"model": "m", "tokens": PROMPT_IDS},
    "/v1/detokenize": {"model": "m", "tokens": PROMPT_IDS},
    "/v1/score": {"model": "m", "query": "Hello", "items": ["a", "b"]},
    "/v1/rerank": {"query": "Hello", "documents": ["a", "b"]},
}

# POST routes an operator calls, not a client: they change the server by design (weights,
# memory, profiling, logging, pausing, adapters, aborting others' requests), take no JSON
# body (an upload, a path parameter), or fan out to other hosts. Not fuzzed.
OPERATOR = frozenset({
    "/set_internal_state", "/flush_cache", "/add_external_corpus", "/remove_external_corpus",
    "/hicache/storage-backend/clear",
    "/start_profile", "/stop_profile", "/set_trace_level", "/freeze_gc",
    "/start_expert_distribution_record", "/stop_expert_distribution_record", "/dump_expert_distribution_record",
    "/update_weights_from_disk", "/init_weights_send_group_for_remote_instance",
    "/send_weights_to_remote_instance", "/init_weights_update_group", "/destroy_weights_update_group",
    "/update_weights_from_tensor", "/begin_weight_update", "/end_weight_update",
    "/update_weights_from_distributed", "/update_weights_from_ipc", "/update_weight_version",
    "/get_weights_by_name", "/release_memory_occupation", "/resume_memory_occupation", "/weights_checker",
    "/slow_down", "/pd_role_switch", "/load_lora_adapter", "/load_lora_adapter_from_tensors",
    "/unload_lora_adapter", "/configure_logging", "/abort_request", "/pause_generation",
    "/continue_generation", "/v1/audio/transcriptions", "/v1/responses/{response_id}/cancel",
})
# The routes of the dedicated tests: /generate and the two OpenAI endpoints users call most.
MAIN = ("/generate", "/v1/completions", "/v1/chat/completions")


def _request_type(endpoint: Callable[..., Any]) -> Any:
    """The body type a route handler declares: its first parameter that is not the raw request."""
    for param in inspect.signature(endpoint).parameters.values():
        hint = param.annotation
        if typing.get_origin(hint) is Annotated:
            hint = typing.get_args(hint)[0]
        if isinstance(hint, str) or getattr(hint, "__name__", "") in ("Request", "UploadFile"):
            continue
        return hint
    return None


@functools.cache
def post_routes() -> dict[str, Any]:
    """Every POST route of SGLang's HTTP app and the request type its handler declares."""
    from sglang.srt.entrypoints.http_server import app

    routes = {}
    for route in app.routes:
        if "POST" in (getattr(route, "methods", None) or ()):
            routes[route.path] = _request_type(route.endpoint)
    return routes


def serving_routes() -> dict[str, Any]:
    """The POST routes a client calls (all but ``OPERATOR``) and their request types."""
    return {path: kind for path, kind in post_routes().items() if path not in OPERATOR}


def route_bodies(path: str, request_type: Any) -> st.SearchStrategy[dict]:
    """Fuzzed bodies for any serving route, from its request type."""
    if path == "/generate":
        return bodies(GENERATE_BASES, field_strategies(generate_fields()))
    fields = type_fields(request_type) if isinstance(request_type, type) else {}
    if not fields:  # an untyped handler: any JSON object
        return st.dictionaries(st.text(max_size=8), json_any, max_size=4)
    return bodies(st.just(BASES.get(path, {})), field_strategies(fields))
