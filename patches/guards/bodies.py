"""Input guards (main process), for every server the plugin loads into with ``--kv-guards on``, evicting or not.

* ``GenerateReqInput.normalize_batch_and_arguments`` and the same on ``EmbeddingReqInput``
  (``/encode``, ``/classify``, ``/v1/embeddings``, ``/v1/classify``) AROUND: the native
  bodies are plain dataclasses, so a wrong type or shape (``"sampling_params": []``, a
  string temperature, an unknown sampling field) surfaces, in SGLang alone, as an IndexError or
  TypeError and an HTTP 500. Check ``sampling_params`` against SamplingParams' own field
  types (msgspec, which SGLang already uses for them) and turn any error of the
  normalisation, which only reads the body, into a ValueError: HTTP 400 with the path.
  Stop regexes must compile, ``top_k`` fit the int32 the scheduler packs it in, and ``n``
  be at most 1,024 (SGLang copies the request n times at once). After the normalisation,
  per-prompt fields must match the prompts (``rid``, a ``sampling_params`` list, every
  per-prompt list long enough for the batch), every per-prompt scalar field its type in
  GenerateReqInput's own hints, and ``positional_embed_overrides`` be null over HTTP.
* ``TokenizerManager._validate_one_request`` BEFORE: reject, with a ValueError (HTTP 400
  naming the field), a request that would otherwise crash the scheduler and with it the
  whole server: token ids outside the vocabulary (an ``IndexError`` in the embedding on
  CPU, a device-side assert on a GPU), in the prompt or in ``token_ids_logprob``, an empty
  prompt, a ``logprob_start_len`` below -1 (an assertion in the scheduler's log-prob
  bookkeeping), and a ``top_logprobs_num`` above the vocabulary size (a top-k in the
  scheduler; the OpenAI ``logprobs`` / ``top_logprobs`` become it). SGLang's own check that runs
  next rejects a prompt plus ``max_new_tokens`` beyond the context length.

* ``fastapi.dependencies.utils.request_body_to_args`` AROUND: an exception other than a
  validation error while a body is validated against its model (SGLang's OpenAI models
  run "before" validators that assume the field types) becomes a validation error, which
  SGLang answers with HTTP 400; so does a ``/vertex_generate`` ``parameters`` key that
  ``GenerateReqInput`` does not take (the handler passes them as keyword arguments).

Both the native ``/generate`` and the OpenAI endpoints reach these checks, the prompt
check after tokenization, once per request of a batch. ``tests/support/fuzz_fields.py`` derives
the fuzz that found most of them from SGLang's own request types. The request bodies'
attributes read here are declared in ``contract.py`` (``ReqInput``, ``GenerateReqInput``,
``VertexGenerateReqInput``, ``SamplingParamsFilledBySGLang``), the classes called or
tested against in ``manifest.py``.
"""

from __future__ import annotations

import functools
import typing
from typing import Any, Literal, Optional, Union, cast

from vase_sglang.plugin import contract as sg

from ..hooks import AROUND, BEFORE, hook

# Parallel samples per prompt: SGLang expands a request into n copies before anything else
# looks at it, so n = 2**31 exhausted the machine's memory (the kernel killed the server).
# OpenAI's API allows 128; 1024 leaves room for RL rollouts through the Engine.
MAX_PARALLEL_SAMPLES = 1024
# SamplingParams fields the scheduler packs into int32 tensors: a larger value raised an
# overflow error there and the whole server exited.
INT32_SAMPLING_FIELDS = ("top_k",)
# SamplingParams fields filled by SGLang itself, not by a client.
INTERNAL_SAMPLING_FIELDS = tuple(sg.members(sg.SamplingParamsFilledBySGLang))


def _generate_input(obj: sg.ReqInput) -> sg.GenerateReqInput | None:
    """``obj`` if it is a GenerateReqInput, whose own fields (``sg.GenerateReqInput``) an
    EmbeddingReqInput lacks; else None."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    return cast(sg.GenerateReqInput, obj) if isinstance(obj, GenerateReqInput) else None


@functools.cache
def _sampling_body_type() -> Any:
    """SamplingParams' API fields as a keyword struct: same types, each also null (SGLang
    reads null as "the default"), unknown fields refused."""
    import msgspec
    from sglang.srt.sampling.sampling_params import SamplingParams

    fields = [f for f in msgspec.structs.fields(SamplingParams) if f.name not in INTERNAL_SAMPLING_FIELDS]
    # custom_params: any JSON values, as SGLang itself passes them on (its declared type
    # is narrower than what it accepts); the kv_* keys in it are checked by options.py.
    types = {f.name: (dict if f.name == "custom_params" else f.type) for f in fields}
    return msgspec.defstruct("SamplingParamsBody", [(f.name, Optional[types[f.name]], None)  # noqa: UP045
                                                    for f in fields],
                             kw_only=True, forbid_unknown_fields=True)


def check_sampling_params(value: Any, field: str = "sampling_params") -> None:
    """Raise ValueError naming the field if ``value`` is not a sampling-parameter object
    (or a non-empty list of them) with the types SGLang declares."""
    import msgspec

    if value is None:
        return
    items = value if isinstance(value, list) else [value]
    if isinstance(value, list) and not value:
        raise ValueError(f"{field}: an empty list; send an object, or one object per prompt")
    for i, item in enumerate(items):
        where = f"{field}[{i}]" if isinstance(value, list) else field
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected an object of sampling parameters, got {type(item).__name__}")
        try:
            msgspec.convert(item, _sampling_body_type())
        except msgspec.ValidationError as exc:
            raise ValueError(f"{where}: {str(exc).replace('$.', where + '.')}") from None
        check_stop_regex(item.get("stop_regex"), f"{where}.stop_regex")
        samples = item.get("n")
        if isinstance(samples, int) and samples > MAX_PARALLEL_SAMPLES:
            raise ValueError(f"{where}.n = {samples}: at most {MAX_PARALLEL_SAMPLES} samples per prompt")
        for name in INT32_SAMPLING_FIELDS:
            value = item.get(name)
            if isinstance(value, int) and not -(2**31) <= value < 2**31:
                raise ValueError(f"{where}.{name} = {value}: out of range (at most {2**31 - 1}; -1 disables it)")


def check_stop_regex(value: Any, field: str = "stop_regex") -> None:
    """Raise ValueError naming the field unless every stop regex compiles: SGLang compiles
    them with ``re`` while it tokenizes the request, where ``re.error`` was an HTTP 500."""
    import re

    for i, pattern in enumerate(value if isinstance(value, list) else [value]):
        if not isinstance(pattern, str):
            continue  # None, or a wrong type that the msgspec check above names
        try:
            re.compile(pattern)
        except (re.error, RecursionError, OverflowError) as exc:
            where = f"{field}[{i}]" if isinstance(value, list) else field
            raise ValueError(f"{where}: not a regular expression ({exc})") from None


ONE_PROMPT_SAMPLING_PARAMS = "sampling_params: a list for one prompt; send one object"
# Per-prompt fields checked as the client sent them (check_batch_shapes), not by the generic
# check_request_fields: the normalisation rewrites rid, one generated id per sample.
CHECKED_AS_SENT = ("rid",)


@hook("sglang.srt.managers.io_struct.GenerateReqInput.normalize_batch_and_arguments", AROUND)
@hook("sglang.srt.managers.io_struct.EmbeddingReqInput.normalize_batch_and_arguments", AROUND)
def _normalize_or_400(original, obj: sg.ReqInput, *args: Any, **kwargs: Any) -> Any:
    check_sampling_params(obj.sampling_params)
    given = obj.sampling_params
    given_len = len(given) if isinstance(given, list) else None
    # Read before the normalisation, which fills rid with one generated id per sample (n).
    given_rid = obj.rid
    if given_len is not None and _one_prompt(obj):
        # Checked before the normalisation too: the embedding body's indexes the list by name
        # (a TypeError) first, and a list holding n > 1 turns one prompt into a batch.
        raise ValueError(ONE_PROMPT_SAMPLING_PARAMS)
    try:
        result = original(obj, *args, **kwargs)
    except (IndexError, KeyError, TypeError, AttributeError, AssertionError) as exc:
        # The normalisation only reads the body: its failures are malformed input (the
        # embedding body asserts that a batch's rid is a list).
        raise ValueError(f"malformed request body: {type(exc).__name__}: {exc}") from exc
    check_batch_shapes(obj, given_len, given_rid)
    check_request_fields(obj)
    check_positional_embeds(obj)
    generate = _generate_input(obj)
    check_session_params(generate.session_params if generate is not None else None)
    check_batch_items(obj)
    return result


def _one_prompt(obj: sg.ReqInput) -> bool:
    """Whether the body holds one prompt, read before SGLang normalises it: a text string,
    or a flat list of token ids."""
    text, ids = obj.text, obj.input_ids
    if isinstance(text, str):
        return True
    return text is None and isinstance(ids, list) and bool(ids) and not isinstance(ids[0], list)


def check_batch_shapes(obj: sg.ReqInput, sampling_params_given: int | None, rid_given: Any) -> None:
    """Raise ValueError for per-prompt fields whose shape does not match the prompts, which
    SGLang's normalisation lets through to fail later with an HTTP 500: a list ``rid`` for
    one prompt or of the wrong length, and a ``sampling_params`` list whose length is not
    the number of prompts. ``obj`` is normalised; the other two are what the client sent
    (a normalised rid holds one id per sample, prompts x n)."""
    if rid_given is not None and not isinstance(rid_given, (str, list)):
        raise ValueError(f"rid: expected a string, or a list of strings one per prompt; got {type(rid_given).__name__}")
    if obj.is_single:
        if isinstance(rid_given, list):
            raise ValueError("rid: one prompt takes one string id, got a list")
        if sampling_params_given is not None:  # a prompt form only the normalisation recognises
            raise ValueError(ONE_PROMPT_SAMPLING_PARAMS)
        return
    prompts = obj.batch_size
    if sampling_params_given is not None and sampling_params_given != prompts:
        raise ValueError(f"sampling_params: {sampling_params_given} objects for {prompts} prompts; "
                         "send one object for all of them, or one per prompt")
    if not isinstance(rid_given, list):
        return  # None or one string: SGLang generates or suffixes one id per sample
    if any(not isinstance(r, str) for r in rid_given):
        raise ValueError("rid: expected a list of strings, one per prompt")
    if len(rid_given) != prompts:  # the embedding body's normalisation lets it by
        raise ValueError(f"rid: {len(rid_given)} ids for {prompts} prompts; send one per prompt")


@hook("fastapi.dependencies.utils.request_body_to_args", AROUND)
async def _body_validation_or_400(original, body_fields: Any, received_body: Any, *args: Any,
                                  **kwargs: Any) -> Any:
    # SGLang's OpenAI models run "before" validators that assume the field types (e.g.
    # response_format.get()); pydantic turns only their ValueErrors into validation
    # errors, so a wrong type surfaced as an AttributeError and an HTTP 500. Validating a
    # client's body only reads it: report the failure as a validation error (HTTP 400).
    try:
        values, errors = await original(body_fields, received_body, *args, **kwargs)
    except (AttributeError, TypeError, KeyError, IndexError) as exc:
        return {}, [{"type": "value_error", "loc": ("body",), "input": None,
                     "msg": f"malformed request body: {type(exc).__name__}: {exc}"}]
    problem = None if errors else vertex_parameters_problem(values)
    if problem:
        return {}, [{"type": "value_error", "loc": ("body", "parameters"), "input": None, "msg": problem}]
    return values, errors


# What /vertex_generate passes to GenerateReqInput itself, taken from the instances.
VERTEX_INPUTS = ("text", "input_ids", "input_embeds", "image_data")


def vertex_parameters_problem(values: dict[str, Any]) -> str | None:
    """What is wrong with a validated /vertex_generate body's ``parameters``, or None. The
    handler passes them as keyword arguments to ``GenerateReqInput`` beside the inputs it
    takes from the instances, so a key that is not a field of it, or one of those inputs,
    was a TypeError and an HTTP 500."""
    import dataclasses

    from sglang.srt.managers.io_struct import GenerateReqInput, VertexGenerateReqInput

    for value in values.values():
        if not isinstance(value, VertexGenerateReqInput):
            continue
        body: sg.VertexGenerateReqInput = value
        if not isinstance(body.parameters, dict):
            continue
        fields = {f.name for f in dataclasses.fields(GenerateReqInput)}
        for key in body.parameters:
            if key in VERTEX_INPUTS:
                return f"parameters.{key}: the inputs come from the instances"
            if key not in fields:
                return f"parameters.{key}: not a generation parameter (the fields of /generate's body)"
    return None


def check_session_params(value: Any) -> None:
    """Raise ValueError unless ``session_params`` is null or an object SGLang's SessionParams
    accepts (same msgspec check SGLang's own types use): the tokenizer manager builds
    ``SessionParams(**value)``, where an unknown key was a TypeError and an HTTP 500."""
    import msgspec
    from sglang.srt.managers.io_struct import SessionParams

    if value is None:
        return
    if not isinstance(value, dict):
        raise ValueError(f"session_params: expected an object, got {type(value).__name__}")
    try:
        SessionParams(**value)
    except (TypeError, ValueError, msgspec.ValidationError) as exc:
        raise ValueError(f"session_params: {exc}") from None


def check_positional_embeds(obj: sg.ReqInput) -> None:
    """Raise ValueError unless ``positional_embed_overrides`` is what SGLang's scheduler
    reads: None, a PositionalEmbeds, or a list of them (or None) per prompt. Only Python
    callers can build one (it holds tensors; SGLang types the field ``Any`` for that
    reason), so any JSON value but null is refused; the scheduler called ``.reconstruct()``
    on a float from ``[null, 7e16]`` and the whole server exited."""
    from sglang.srt.managers.embed_types import PositionalEmbeds

    value = obj.positional_embed_overrides
    if value is None or isinstance(value, PositionalEmbeds):
        return
    batch = not obj.is_single  # a list is one entry per prompt, only in a batch
    if batch and isinstance(value, list) and all(item is None or isinstance(item, PositionalEmbeds) for item in value):
        return
    raise ValueError("positional_embed_overrides: only the Python Engine API can pass PositionalEmbeds objects; "
                     "over HTTP send null")


def check_batch_items(obj: sg.ReqInput) -> None:
    """Raise ValueError when a normalised batch cannot be split into its prompts as SGLang's
    tokenizer manager splits it (``obj[i]`` for each id in ``rid``, and ``bootstrap_room[i]``):
    a per-prompt list shorter than the batch (``"audio_data": []`` with two prompts) raised
    an IndexError there, an HTTP 500."""
    import dataclasses

    if obj.is_single or not isinstance(obj.rid, list):
        return
    n = len(obj.rid)
    generate = _generate_input(obj)
    rooms = generate.bootstrap_room if generate is not None else None
    if isinstance(rooms, list) and rooms and len(rooms) < n:
        raise ValueError(f"bootstrap_room: {len(rooms)} values for {n} prompts; send one per prompt")
    try:
        for i in range(n):
            obj[i]
    except (IndexError, KeyError, TypeError) as exc:
        # Named only on failure: this runs for every batch request.
        short = [f.name for f in dataclasses.fields(obj)
                 if isinstance(getattr(obj, f.name), list) and len(getattr(obj, f.name)) < n]
        raise ValueError(f"{', '.join(short) or 'a per-prompt field'}: fewer values than the {n} prompts "
                         f"({type(exc).__name__}: {exc}); send one value per prompt") from None


# The scalar types a field's value is checked against; other types (dicts, nested lists,
# classes) are left to SGLang and to the specific checks in this module.
_SCALARS = (bool, int, float, str, type(None))


def _is_scalar_hint(hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return True
    if origin is Union:
        return all(_is_scalar_hint(arg) for arg in typing.get_args(hint))
    return hint in _SCALARS


def _matches(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of the scalar ``hint`` (JSON's view: an int is a float, a bool is
    neither)."""
    origin = typing.get_origin(hint)
    if origin is Union:
        return any(_matches(value, arg) for arg in typing.get_args(hint))
    if origin is Literal:
        return any(type(value) is type(choice) and value == choice for choice in typing.get_args(hint))
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    return value is None


def _describe(hint: Any) -> str:
    if isinstance(hint, type):
        return "null" if hint is type(None) else hint.__name__
    return str(hint).replace("typing.", "").replace("NoneType", "null")


@functools.cache
def _request_field_forms(request_type: Any) -> dict[str, tuple[Any, Any]]:
    """The fields of a request dataclass (GenerateReqInput, EmbeddingReqInput) that hold one
    scalar per prompt, derived from its type hints: name -> (the type for one prompt, the
    type of a batch list's items or None when the field has no list form).
    ``Union[List[X], X]`` is such a field with a batch form, ``Optional[int]`` one without;
    fields of other types are not listed."""
    import dataclasses

    hints = typing.get_type_hints(request_type)
    forms: dict[str, tuple[Any, Any]] = {}
    for f in dataclasses.fields(request_type):
        hint = hints[f.name]
        if _is_scalar_hint(hint):
            forms[f.name] = (hint, None)
            continue
        if typing.get_origin(hint) is not Union:
            continue
        args = typing.get_args(hint)
        scalars = [a for a in args if _is_scalar_hint(a)]
        items = [typing.get_args(a)[0] for a in args if typing.get_origin(a) is list]
        if any(a is not type(None) for a in scalars) and len(items) == 1 and _is_scalar_hint(items[0]):
            forms[f.name] = (Union[tuple(scalars)], items[0])  # noqa: UP007 (a Union built at run time)
    return forms


def check_request_fields(obj: sg.ReqInput) -> None:
    """Raise ValueError naming the field when a per-prompt scalar field of a normalised
    GenerateReqInput or EmbeddingReqInput has the wrong type or form: a list for one prompt, or a value outside
    its declared type. SGLang reads such fields deep in the scheduler, where a wrong type
    raises and the whole server exits (a list ``lora_id`` or ``return_hidden_states`` for
    one prompt did). The fields and types come from SGLang's own hints, so a field added
    upstream is checked without a change here."""
    single = obj.is_single
    for name, (scalar, item) in _request_field_forms(obj.__class__).items():
        if name in CHECKED_AS_SENT:
            continue
        value = getattr(obj, name, None)
        if value is None or _matches(value, scalar):
            continue
        if isinstance(value, list) and item is not None and not single:
            bad = [i for i, v in enumerate(value) if not _matches(v, item)]
            if not bad:
                continue
            raise ValueError(f"{name}[{bad[0]}] = {value[bad[0]]!r:.80}: expected {_describe(item)}")
        if isinstance(value, list) and item is not None:
            raise ValueError(f"{name}: a list for one prompt; send one value of {_describe(scalar)}")
        raise ValueError(f"{name} = {value!r:.80}: expected {_describe(scalar)}"
                         + (" or a list of them, one per prompt" if item is not None else ""))


def check_prompt_ids(input_ids: Any, vocab_size: int, field: str = "input_ids") -> None:
    """Raise ValueError naming ``field`` if the prompt is empty or holds an id outside
    ``[0, vocab_size)`` (or anything that is not an integer)."""
    if input_ids is None:
        return
    if not isinstance(input_ids, list):  # e.g. one id per prompt, when text and input_ids disagree on the batch
        raise ValueError(f"{field}: expected a list of token ids, got {type(input_ids).__name__}")
    if len(input_ids) == 0:
        raise ValueError(f"{field}: the prompt is empty; send at least one token")
    for i, token in enumerate(input_ids):
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
            raise ValueError(f"{field}[{i}] = {token!r} is not a token id of this model: "
                             f"ids are integers in [0, {vocab_size})")


def check_top_logprobs(value: Any, vocab_size: int, field: str = "top_logprobs_num") -> None:
    """Raise ValueError unless ``value`` is None or an integer in [0, vocab_size]: a larger
    count fails a top-k over the vocabulary in the scheduler and the whole server exits."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= vocab_size:
        raise ValueError(f"{field} = {value!r}: must be an integer in [0, {vocab_size}] (the vocabulary size); "
                         "the OpenAI endpoints take it from logprobs / top_logprobs")


def check_logprob_start(value: Any, field: str = "logprob_start_len") -> None:
    """Raise ValueError unless ``value`` is None, -1 (SGLang's default) or a position >= 0:
    with a lower value and ``return_logprob``, SGLang's scheduler fails an assertion on the
    number of input log-probs and the whole server exits."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise ValueError(f"{field} = {value!r}: must be -1 (the default) or a prompt position >= 0")


@hook("sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request", BEFORE)
def _guard_prompt(manager: sg.TokenizerManager, obj: sg.ReqInput, input_ids: Any, *args: Any, **kwargs: Any) -> None:
    generate = _generate_input(obj)
    if generate is None:
        return None
    check_logprob_start(generate.logprob_start_len)
    vocab = manager.model_config.vocab_size
    check_top_logprobs(generate.top_logprobs_num, vocab)
    check_prompt_ids(generate.token_ids_logprob or None, vocab, "token_ids_logprob")
    if generate.input_embeds is not None:
        return None
    field = "input_ids" if generate.input_ids is not None else "text"
    check_prompt_ids(input_ids, vocab, field)
    return None
