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
    for buf in (sched.k_buf, sched.v_buf):
        h.update(buf[:, slots].contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def _write(rid: str, event: str, digest: str) -> None:
    assert DIGEST_FILE is not None
    with open(DIGEST_FILE, "a") as f:
        f.write(json.dumps({"rid": rid, "event": event, "digest": digest}) + "\n")


def _install() -> None:
    from vase_sglang.plugin.scheduler import VaseScheduler

    begin_region, before_decode_alloc = VaseScheduler._begin_region, VaseScheduler.before_decode_alloc

    def _begin_region(self: VaseScheduler, req: Any) -> Any:
        old = self._requests.get(req)
        where = (old.row, old.generation) if old is not None else None
        st = begin_region(self, req)
        if (st.row, st.generation) != where:
            _write(req.rid, "start", _digest(self, st.row, st.region_start))
        return st

    def _before_decode_alloc(self: VaseScheduler, batch: Any) -> None:
        rounds = [self.state(req).rounds for req in batch.reqs]
        before_decode_alloc(self, batch)
        for req, before in zip(batch.reqs, rounds, strict=True):
            st = self.state(req)
            if st.rounds > before:
                _write(req.rid, "round", _digest(self, st.row, st.region_start))

    VaseScheduler._begin_region = _begin_region  # type: ignore[method-assign]
    VaseScheduler.before_decode_alloc = _before_decode_alloc  # type: ignore[method-assign]


if DIGEST_FILE:
    import vase_sglang.plugin as _plugin

    _register = _plugin.register

    def _register_with_oracle() -> None:
        _register()
        _install()

    # SGLang loads the entry point ``vase_sglang.plugin:register`` after this runs.
    _plugin.register = _register_with_oracle
