"""What the hooks of one process find without an argument: the scheduler process's
adapter, and the main process's finished-request fields.

SGLang calls a hook with its own objects only, so a hook needs one place to find the
state of its process:

* scheduler process: the ``VaseScheduler`` (its request table and round engine), set
  once by ``memory.py``'s build hook when the model runner has made the pools;
* main process: ``FinishedFields``, the ``kv_*`` fields of finished requests that the
  OpenAI streaming routes put in their last chunk (``openai_meta.py``), fed by the
  meta_info hook (``io.py``).

Nothing below the hooks looks either up: every function of ``vase_sglang.plugin`` is
handed what it needs.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from vase_sglang.plugin.scheduler import VaseScheduler

_adapter: VaseScheduler | None = None  # one scheduler (one TP rank) per process


def install(adapter: VaseScheduler) -> None:
    global _adapter
    _adapter = adapter


def adapter() -> VaseScheduler | None:
    """The process's adapter; None before the model runner built it, or with --kv-policy none."""
    return _adapter


class FinishedFields:
    """The ``kv_*`` meta_info fields of finished requests by request id, until their
    stream's final chunk takes them; bounded, oldest dropped first."""

    def __init__(self, limit: int = 4096):
        self.limit = limit
        self._fields: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def remember(self, rid: str, fields: dict[str, Any]) -> None:
        self._fields[rid] = fields
        self._fields.move_to_end(rid)
        while len(self._fields) > self.limit:
            self._fields.popitem(last=False)

    def take(self, rid: str) -> dict[str, Any]:
        """The request's fields, removed ({} when none are held)."""
        return self._fields.pop(rid, {})


finished = FinishedFields()  # main process
