"""Input guards for SGLang's other client routes (main process), for every server the
plugin loads into with ``--kv-guards on``. ``bodies.py`` checks the request bodies that reach the scheduler; the
hooks here cover handlers that let a client's mistake through as an HTTP 500 (found by
``tests/support/fuzz_fields.py``'s fuzz of every client route):

* ``OpenAIServingDetokenize._handle_non_streaming_request`` BEFORE (``/detokenize``,
  ``/v1/detokenize``): token ids outside the vocabulary are a ValueError (HTTP 400); the
  tokenizer's decode failed on them inside the handler, which answered 500.
* ``FunctionCallParser.__init__`` and ``ReasoningParser.__init__`` AROUND
  (``/parse_function_call``, ``/separate_reasoning``): an unknown or missing parser name
  raises a ``BadRequest``, which is still a ValueError for callers that catch one and an
  HTTP 400 where the handler does not catch it.
* ``OllamaServing.handle_chat`` / ``handle_generate`` AROUND (``/api/chat``,
  ``/api/generate``): a ValueError from the request (a bad option, a prompt beyond the
  context) becomes a ``BadRequest``; for a stream, the first chunk is awaited before the
  response starts, so such an error is an HTTP 400 rather than a stream cut short.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Iterator
from typing import Any

from fastapi import HTTPException

from ..hooks import AROUND, BEFORE, hook
from .bodies import check_prompt_ids


class BadRequest(HTTPException, ValueError):
    """A client's mistake: FastAPI answers it with HTTP 400 and its message, and code that
    catches ValueError (SGLang's convention for bad input) still does."""

    def __init__(self, message: str) -> None:
        super().__init__(status_code=400, detail=message)

    def __str__(self) -> str:
        return str(self.detail)


@hook("sglang.srt.entrypoints.openai.serving_tokenize.OpenAIServingDetokenize._handle_non_streaming_request",
      BEFORE)
def _detokenize_ids_in_vocab(serving: Any, adapted_request: Any, request: Any, *args: Any, **kwargs: Any) -> None:
    tokens = getattr(request, "tokens", None)
    if not isinstance(tokens, list) or not tokens:
        return None  # the handler answers these itself
    vocab = serving.tokenizer_manager.model_config.vocab_size
    rows = tokens if isinstance(tokens[0], list) else [tokens]
    for i, row in enumerate(rows):
        if row:  # an empty row decodes to ""
            check_prompt_ids(row, vocab, f"tokens[{i}]" if rows is tokens else "tokens")
    return None


@contextlib.contextmanager
def _value_error_as_bad_request() -> Iterator[None]:
    """Re-raise a ValueError (SGLang's bad input) as a ``BadRequest``, so a handler that lets
    it through answers HTTP 400, not 500."""
    try:
        yield
    except BadRequest:
        raise
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc


@hook("sglang.srt.function_call.function_call_parser.FunctionCallParser.__init__", AROUND)
@hook("sglang.srt.parser.reasoning_parser.ReasoningParser.__init__", AROUND)
def _parser_or_400(original: Any, *args: Any, **kwargs: Any) -> Any:
    with _value_error_as_bad_request():
        return original(*args, **kwargs)


@hook("sglang.srt.entrypoints.ollama.serving.OllamaServing.handle_chat", AROUND)
@hook("sglang.srt.entrypoints.ollama.serving.OllamaServing.handle_generate", AROUND)
async def _ollama_or_400(original: Any, *args: Any, **kwargs: Any) -> Any:
    from fastapi.responses import StreamingResponse

    with _value_error_as_bad_request():
        response = await original(*args, **kwargs)
        if isinstance(response, StreamingResponse):
            response.body_iterator = await _started(response.body_iterator)
    return response


async def _started(body: AsyncIterable[Any]) -> AsyncIterator[Any]:
    """``body`` with its first item already produced: the request is validated (and any
    error raised here) before the HTTP status goes out."""
    chunks = body.__aiter__()
    try:
        first = await chunks.__anext__()
    except StopAsyncIteration:
        first = None

    async def replay() -> AsyncIterator[Any]:
        if first is None:
            return
        yield first
        async for chunk in chunks:
            yield chunk

    return replay()
