"""Input guards (main process), for every server the plugin loads into, evicting or not.

* ``GenerateReqInput.normalize_batch_and_arguments`` AROUND: the native ``/generate``
  body is a plain dataclass, so a wrong type or shape (``"sampling_params": []``, a
  string temperature, an unknown sampling field) used to surface as an IndexError or
  TypeError and an HTTP 500. Check ``sampling_params`` against SamplingParams' own field
  types (msgspec, which SGLang already uses for them) and turn any error of the
  normalisation, which only reads the body, into a ValueError: HTTP 400 with the path.
  After it, per-prompt fields must match the prompts (``rid``, a ``sampling_params`` list).
* ``TokenizerManager._validate_one_request`` BEFORE: reject, with a ValueError (HTTP 400
  naming the field), a request that would otherwise crash the scheduler and with it the
  whole server: token ids outside the vocabulary (an ``IndexError`` in the embedding on
  CPU, a device-side assert on a GPU), in the prompt or in ``token_ids_logprob``, an empty
  prompt, a ``logprob_start_len`` below -1 (an assertion in the scheduler's log-prob
  bookkeeping), and a ``top_logprobs_num`` above the vocabulary size (a top-k in the
  scheduler; the OpenAI ``logprobs`` / ``top_logprobs`` become it). SGLang's own check that runs
  next rejects a prompt plus ``max_new_tokens`` beyond the context length.

Both the native ``/generate`` and the OpenAI endpoints reach this check after
tokenization, once per request of a batch.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

from .hooks import AROUND, BEFORE, hook

# SamplingParams fields filled by SGLang itself, not by a client.
INTERNAL_SAMPLING_FIELDS = ("stop_strs", "stop_regex_strs", "stop_str_max_len", "stop_regex_max_len",
                            "is_normalized", "ebnf_full_assistant")


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


@hook("sglang.srt.managers.io_struct.GenerateReqInput.normalize_batch_and_arguments", AROUND)
def _normalize_or_400(original, obj: Any, *args: Any, **kwargs: Any) -> Any:
    check_sampling_params(getattr(obj, "sampling_params", None))
    given = getattr(obj, "sampling_params", None)
    given_len = len(given) if isinstance(given, list) else None
    try:
        result = original(obj, *args, **kwargs)
    except (IndexError, KeyError, TypeError, AttributeError) as exc:
        # The normalisation only reads the body: its failures are malformed input.
        raise ValueError(f"malformed request body: {type(exc).__name__}: {exc}") from exc
    check_batch_shapes(obj, given_len)
    return result


def check_batch_shapes(obj: Any, sampling_params_given: int | None) -> None:
    """Raise ValueError for per-prompt fields whose shape does not match the prompts, which
    SGLang's normalisation lets through to fail later with an HTTP 500: a list ``rid`` for
    one prompt, and a ``sampling_params`` list whose length is not the number of prompts."""
    if getattr(obj, "is_single", True):
        if obj.rid is not None and not isinstance(obj.rid, str):
            raise ValueError(f"rid: one prompt takes one string id, got {type(obj.rid).__name__}")
        if sampling_params_given is not None:
            raise ValueError("sampling_params: a list for one prompt; send one object")
        return
    prompts = obj.batch_size
    if sampling_params_given is not None and sampling_params_given != prompts:
        raise ValueError(f"sampling_params: {sampling_params_given} objects for {prompts} prompts; "
                         "send one object for all of them, or one per prompt")
    if isinstance(obj.rid, list) and any(not isinstance(r, str) for r in obj.rid):
        raise ValueError("rid: expected a list of strings, one per prompt")


def check_prompt_ids(input_ids: Any, vocab_size: int, field: str = "input_ids") -> None:
    """Raise ValueError naming ``field`` if the prompt is empty or holds an id outside
    ``[0, vocab_size)`` (or anything that is not an integer)."""
    if input_ids is None:
        return
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
def _guard_prompt(manager: Any, obj: Any, input_ids: Any, *args: Any, **kwargs: Any) -> None:
    from sglang.srt.managers.io_struct import GenerateReqInput

    if not isinstance(obj, GenerateReqInput):
        return None
    check_logprob_start(getattr(obj, "logprob_start_len", None))
    vocab = manager.model_config.vocab_size
    check_top_logprobs(getattr(obj, "top_logprobs_num", None), vocab)
    check_prompt_ids(getattr(obj, "token_ids_logprob", None) or None, vocab, "token_ids_logprob")
    if getattr(obj, "input_embeds", None) is not None:
        return None
    field = "input_ids" if getattr(obj, "input_ids", None) is not None else "text"
    check_prompt_ids(input_ids, vocab, field)
    return None
