"""The request table of a scheduler process: one ``RequestRecord`` per request, found by
its request id, the only place request state lives there.

A record holds the request's options (validated once in the tokenizer process), the seed
of its eviction noise, its region (row, start, length), its counters and its telemetry. A
region starts after each (re-)prefill, rounds shorten it, the report reads it. A record
leaves the table when SGLang drops its ``Req``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config import PolicyConfig
from .options import RequestOptions
from .report import RequestCounters
from .telemetry import RequestTelemetry

if TYPE_CHECKING:  # the SGLang attributes read here, checked against the pinned SGLang
    from . import contract as sg


@dataclass(eq=False)
class RequestRecord:
    """One request's eviction state; its region fields restart after a re-prefill."""

    rid: str
    options: RequestOptions
    seed: int  # of the request's eviction noise (options.eviction_seed)
    telemetry: RequestTelemetry
    row: int = -1  # row of req_to_token; -1 until the first decode step
    generation: int = -1  # the row's allocation count when this region started
    region_start: int = 0  # first column of the region
    rounds: int = 0  # rounds over the request's life: part of each round's seed
    compacted: bool = False  # region data moved since the region started
    evicted: int = 0  # tokens evicted per (layer, KV head)
    region_len: int = 0  # physical KV length of the region, after this step's allocation
    # Generated tokens re-prefilled into each region started after a retraction (one entry
    # per retraction of this request: bounded by SGLang's retraction count).
    reprefilled: list[int] = field(default_factory=list)

    @property
    def cfg(self) -> PolicyConfig:
        return self.options.cfg

    @property
    def started(self) -> bool:
        return self.row >= 0

    def round_due(self, cache_len: int) -> bool:
        """A round is due when the region holds B + R tokens (or more, after a re-prefill)."""
        return self.cfg.evicts and cache_len - self.region_start >= self.cfg.region_size

    def holds(self, row: int, generation: int) -> bool:
        """The current region lives in this allocation of ``row``."""
        return (self.row, self.generation) == (row, generation)

    def start_region(self, req: sg.Req, row: int, generation: int) -> None:
        """First decode, or re-prefilled after a retraction: rounds and evicted go on, the
        region restarts after the prompt (or the tree-owned prefix, if longer)."""
        self.region_start = self._count_reprefill(req)
        self.row, self.generation = row, generation
        self.compacted, self.region_len = False, int(req.kv.kv_committed_len) - self.region_start

    def note_final_reprefill(self, req: sg.Req, row: int, generation: int) -> None:
        """A re-prefill whose first token finishes the request has no decode step, so no
        region starts for it: its re-prefilled tokens are counted here, while the request
        still holds its row, so that the report (``kv_reprefilled_tokens``) names every
        re-prefill."""
        if self.started and not self.holds(row, generation):
            self._count_reprefill(req)
            self.row, self.generation = row, generation  # counted once

    def _count_reprefill(self, req: sg.Req) -> int:
        """The first column of a region starting now; generated tokens before it came back
        with a re-prefill, and are counted in the request's report."""
        committed = int(req.kv.kv_committed_len)
        start = min(committed, max(len(req.origin_input_ids), int(req.kv.cache_protected_len or 0)))
        if committed > start:
            self.reprefilled.append(committed - start)
        return start

    def after_round(self, removed: int) -> None:
        """A round removed ``removed`` tokens per (layer, KV head) from the region."""
        self.rounds += 1
        self.compacted = True
        self.evicted += removed

    def counters(self) -> RequestCounters:
        """The request's eviction so far, for its meta_info."""
        return RequestCounters(self.region_len, self.evicted, self.rounds, ",".join(map(str, self.reprefilled)))


class RequestTable:
    """The scheduler process's records by request id. A record is made on a request's
    first sight and dropped when SGLang drops the ``Req`` (weakly tied to it), so a
    finished or aborted request leaves nothing behind. A client may reuse a finished
    request's id while SGLang still holds the old ``Req``: each ``Req`` keeps a record of
    its own, and ``get`` gives the newest."""

    def __init__(self) -> None:
        self._records: dict[str, list[tuple[weakref.ref[Any], RequestRecord]]] = {}

    def get(self, rid: str) -> RequestRecord | None:
        entries = self._records.get(rid)
        return entries[-1][1] if entries else None

    def _find(self, req: sg.Req) -> RequestRecord | None:
        return next((rec for ref, rec in self._records.get(req.rid, ()) if ref() is req), None)

    def record(self, req: sg.Req, make: Callable[[sg.Req], RequestRecord]) -> RequestRecord:
        """``req``'s record, made by ``make`` on first sight."""
        rec = self._find(req)
        if rec is None:
            rec = make(req)
            self._records.setdefault(req.rid, []).append((weakref.ref(req), rec))
            weakref.finalize(req, self._drop, req.rid, rec)
        return rec

    def started(self, req: sg.Req) -> RequestRecord | None:
        """``req``'s record once its region has started (its first decode step), else None."""
        rec = self._find(req)
        return rec if rec is not None and rec.started else None

    def _drop(self, rid: str, rec: RequestRecord) -> None:
        entries = [e for e in self._records.get(rid, ()) if e[1] is not rec]
        if entries:
            self._records[rid] = entries
        else:
            self._records.pop(rid, None)

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._records.values())
