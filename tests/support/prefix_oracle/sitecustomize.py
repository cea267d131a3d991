"""Test oracle for the end-to-end servers, never shipped: loaded into every process of a
test server that has this folder on its PYTHONPATH and ``VASE_TEST_DIGEST_FILE`` set.

In the scheduler it digests the prompt's K/V bytes (all layers, K and V) when a
request's region starts and after each of its rounds, and appends one JSON line per
digest to the file: ``{"rid", "event": "start" | "round", "digest"}``. A test then
checks that the tree-owned prefix never changed (``tests/support/e2e.py``'s
``prefix_digests``). It wraps two ``VaseScheduler`` methods from outside, so the plugin
carries no test code.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

DIGEST_FILE = os.environ.get("VASE_TEST_DIGEST_FILE")


def _digest(sched: Any, row: int, region_start: int) -> str:
    import torch

    slots = sched.req_to_token_pool.req_to_token[row, :region_start].long()
    h = hashlib.sha256()
    for buf in (sched.engine.k_buf, sched.engine.v_buf):
        h.update(buf[:, slots].contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def _write(rid: str, event: str, digest: str) -> None:
    assert DIGEST_FILE is not None
    with open(DIGEST_FILE, "a") as f:
        f.write(json.dumps({"rid": rid, "event": event, "digest": digest}) + "\n")


def _install() -> None:
    from vase_sglang.plugin.scheduler import VaseScheduler

    begin_region, before_decode_alloc = VaseScheduler.begin_region, VaseScheduler.before_decode_alloc

    def _begin_region(self: VaseScheduler, req: Any) -> Any:
        old = self.requests.get(req.rid)
        where = (old.row, old.generation) if old is not None else None
        rec = begin_region(self, req)
        if (rec.row, rec.generation) != where:
            _write(req.rid, "start", _digest(self, rec.row, rec.region_start))
        return rec

    def _before_decode_alloc(self: VaseScheduler, batch: Any) -> None:
        rounds = [self.record(req).rounds for req in batch.reqs]
        before_decode_alloc(self, batch)
        for req, before in zip(batch.reqs, rounds, strict=True):
            rec = self.record(req)
            if rec.rounds > before:
                _write(req.rid, "round", _digest(self, rec.row, rec.region_start))

    VaseScheduler.begin_region = _begin_region  # type: ignore[method-assign]
    VaseScheduler.before_decode_alloc = _before_decode_alloc  # type: ignore[method-assign]


if DIGEST_FILE:
    _install()  # plugin/scheduler.py imports torch and the kernels, not SGLang
