"""The OpenAI routes carry each request's ``kv_*`` meta_info fields (main process).

SGLang's OpenAI responses have no place for plugin fields except the response-level
``metadata`` dict. Non-streaming ``/v1/chat/completions`` and ``/v1/completions`` get
``metadata.kv``: one dict of ``kv_*`` fields per choice, in choice order. A streaming
response gets one more chunk before ``data: [DONE]``, with no choices and the same
``metadata.kv`` (as SGLang's own usage and ``sglext`` chunks carry response-level data).
The stream reads the fields from ``runtime.finished``, which the meta_info hook
(``io.py``, through ``remember``) feeds with every request's last output; it is bounded and
each entry is taken once.

* ``OpenAIServingChat._build_chat_response`` / ``OpenAIServingCompletion._build_completion_response``
  AROUND: add ``metadata.kv``.
* ``OpenAIServingChat._generate_chat_stream`` / ``OpenAIServingCompletion._generate_completion_stream``
  AROUND: the final chunk.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from . import runtime
from .hooks import AROUND, hook

DONE = "data: [DONE]\n\n"


def kv_fields(meta_info: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in meta_info.items() if k.startswith("kv_")}


def remember(meta_info: dict[str, Any]) -> None:
    """A request's last meta_info: keep its ``kv_*`` fields for its stream's final chunk."""
    rid = meta_info.get("id")
    fields = kv_fields(meta_info)
    if not isinstance(rid, str) or not fields:
        return
    runtime.finished.remember(rid, fields)


def take(rids: Any) -> list[dict[str, Any]]:
    """The fields of each request id (one rid, or a list: one per choice), removed."""
    ids = [rids] if isinstance(rids, str) else list(rids or [])
    return [runtime.finished.take(r) for r in ids if isinstance(r, str)]


def _with_kv(response: Any, ret: Sequence[dict[str, Any]]) -> Any:
    fields = [kv_fields(item.get("meta_info") or {}) for item in ret]
    if any(fields) and hasattr(response, "metadata"):  # not a pre-serialized ORJSONResponse
        response.metadata = {**(response.metadata or {}), "kv": fields}
        for item in ret:
            runtime.finished.take(str((item.get("meta_info") or {}).get("id")))
    return response


@hook("sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._build_chat_response", AROUND)
def _chat_response(original, serving: Any, request: Any, ret: list, *args: Any, **kwargs: Any) -> Any:
    return _with_kv(original(serving, request, ret, *args, **kwargs), ret)


@hook("sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion._build_completion_response", AROUND)
def _completion_response(original, serving: Any, request: Any, ret: list, *args: Any, **kwargs: Any) -> Any:
    return _with_kv(original(serving, request, ret, *args, **kwargs), ret)


def _final_chunk(adapted_request: Any, request: Any, kind: str) -> str | None:
    fields = take(getattr(adapted_request, "rid", None))
    if not any(fields):
        return None
    rid = getattr(adapted_request, "rid", None)
    first = rid if isinstance(rid, str) else (rid[0] if rid else "")
    chunk: dict[str, Any] = {"id": first, "object": kind, "created": int(time.time()),
                             "model": getattr(request, "model", ""), "choices": [], "metadata": {"kv": fields}}
    return f"data: {json.dumps(chunk)}\n\n"


async def _stream(original, serving: Any, adapted_request: Any, request: Any, raw_request: Any, kind: str,
                  *args: Any, **kwargs: Any) -> AsyncIterator[str]:
    async for chunk in original(serving, adapted_request, request, raw_request, *args, **kwargs):
        if chunk == DONE:
            extra = _final_chunk(adapted_request, request, kind)
            if extra is not None:
                yield extra
        yield chunk


@hook("sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._generate_chat_stream", AROUND)
def _chat_stream(original, serving: Any, adapted_request: Any, request: Any, raw_request: Any, *args: Any,
                 **kwargs: Any) -> AsyncIterator[str]:
    return _stream(original, serving, adapted_request, request, raw_request, "chat.completion.chunk", *args,
                   **kwargs)


@hook("sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion._generate_completion_stream", AROUND)
def _completion_stream(original, serving: Any, adapted_request: Any, request: Any, raw_request: Any, *args: Any,
                       **kwargs: Any) -> AsyncIterator[str]:
    return _stream(original, serving, adapted_request, request, raw_request, "text_completion", *args, **kwargs)
