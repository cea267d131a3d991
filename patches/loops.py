"""Repetition loops on the output tokens (scheduler process).

* ``Req.update_finish_state`` AFTER: SGLang calls it once per request per step with the
  tokens just accepted. They go to the request's loop detector (``VaseScheduler.after_tokens``);
  when the request stops on loops (``kv_stop_on_loop`` / ``--kv-stop-on-loop``) and just
  looped, it finishes here with ``FINISH_LOOP``: the OpenAI ``finish_reason`` is ``stop``
  (OpenAI knows no other reason for a model-side stop) and the native one carries ``kv_loop``.
  A request that finishes at a re-prefill's first token is counted as re-prefilled there
  (``kv_reprefilled_tokens``): no decode step follows to start its region.
"""

from __future__ import annotations

import functools
from typing import Any

from vase_sglang.plugin import contract as sg
from vase_sglang.telemetry import Loop

from . import runtime
from .hooks import AFTER, hook


@functools.cache
def _finish_loop_class() -> type:
    from sglang.srt.managers.schedule_batch import BaseFinishReason

    class FINISH_LOOP(BaseFinishReason):  # noqa: N801 - SGLang's naming of finish reasons
        def __init__(self, loop: Loop):
            super().__init__()
            self.loop = loop

        def to_json(self) -> dict[str, Any]:
            # "matched" None: the detokenizer trims nothing; the text shows the loop.
            return {"type": "stop", "matched": None,
                    "kv_loop": {"start": self.loop.start, "phrase_tokens": self.loop.phrase_tokens,
                                "phrase_chars": self.loop.phrase_chars, "detected_at": self.loop.detected_at}}

    return FINISH_LOOP


def finish_loop(loop: Loop) -> Any:
    return _finish_loop_class()(loop)


@hook("sglang.srt.managers.schedule_batch.Req.update_finish_state", AFTER)
def _after_tokens(result: Any, req: sg.Req, new_accepted_len: int = 1, *args: Any, **kwargs: Any) -> None:
    sched = runtime.adapter()
    if sched is None:
        return
    loop = sched.after_tokens(req, new_accepted_len)
    if loop is not None and not req.finished():
        req.finished_reason = finish_loop(loop)
        req.finished_len = len(req.output_ids)
