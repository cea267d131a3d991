"""The eviction path's tensors in one scheduler process, and the rounds over them.

``RoundEngine`` holds the KV pool as ``[layers, slots, KV heads, dim]`` views, the query
ring, the score state and each row's position offset, and runs one batched round: the
policy chooses what each region keeps, the kernels compact K and V (and a stateful
policy's scores) into the region's first B places. It knows rows of ``req_to_token`` and
slot indices, never SGLang's requests: the adapter (``scheduler.VaseScheduler``, which
holds one) owns those.

Layouts, one row per row of ``req_to_token``:

* query ring ``[rows, layers, Hq, R, D]``: the query of column ``col`` at ring slot
  ``col % R``; decode steps and prefills write it, so the newest R columns are present
  (B is a multiple of R, so a round's shortening of the row keeps the mapping);
* score state ``[rows, layers, KV heads, B + R]`` fp32: the score each region position
  carries to the next round, for the stateful policies; it moves with the tokens;
* position offset ``[rows]``: logical - physical position of the row's next token, read
  by the forward pass without a host sync (CUDA-graph safe).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch

from ..config import PolicyConfig
from ..kernels import ops
from ..policies import Policy, Regions, Selection, carried_scores, make_policy
from .planning import select_block_limit

logger = logging.getLogger("vase_sglang.plugin.engine")


def stacked_view(layers: Sequence[torch.Tensor]) -> torch.Tensor:
    """``[n_layers, ...]`` view over per-layer buffers that live in one allocation.

    Raises if the layers are not evenly spaced in one storage: then there is no view,
    and a copy would make the in-place compaction write to the wrong memory.
    """
    first = layers[0]
    if len(layers) == 1:
        return first[None]
    base = first.untyped_storage().data_ptr()
    step = layers[1].data_ptr() - first.data_ptr()
    for i, t in enumerate(layers):
        if (
            t.shape != first.shape
            or t.stride() != first.stride()
            or t.dtype != first.dtype
            or t.untyped_storage().data_ptr() != base
            or t.data_ptr() - first.data_ptr() != i * step
        ):
            raise RuntimeError("KV layers are not evenly spaced views of one allocation; cannot build a stacked view")
    if step % first.element_size():
        raise RuntimeError("KV layer spacing is not a whole number of elements")
    return torch.as_strided(first, (len(layers), *first.shape), (step // first.element_size(), *first.stride()),
                            first.storage_offset())


class RoundEngine:
    """Buffers and rounds of one scheduler process (one TP rank)."""

    def __init__(self, server_cfg: PolicyConfig, k_buf: torch.Tensor, v_buf: torch.Tensor, n_rows: int,
                 q_heads: int, capture_queries: bool, keep_state: bool = False, backend: str | None = None,
                 head_offset: int = 0, total_kv_heads: int | None = None, max_select_block: int | None = None):
        self.server_cfg = server_cfg
        self.k_buf, self.v_buf = k_buf, v_buf  # [n_layers, n_slots, kv_heads, head_dim]
        self.n_layers, _, self.kv_heads, self.head_dim = k_buf.shape
        self.q_heads = q_heads
        self.device = k_buf.device
        self.backend = backend
        # On a TP rank: the global index of the local KV heads (TP-invariant noise).
        self.head_offset, self.total_kv_heads = head_offset, total_kv_heads
        # Widest selection the kernels run (planning.select_block_limit); wider ones run the torch twin.
        self.max_select_block = select_block_limit(server_cfg) if max_select_block is None else max_select_block
        # [rows, layers, Hq, R, D]: a round's queries are then one gather by row.
        self.query_ring = (
            torch.zeros((n_rows, self.n_layers, q_heads, server_cfg.recent, self.head_dim), dtype=k_buf.dtype,
                        device=self.device)
            if capture_queries
            else None
        )
        self.score_state = (
            torch.zeros((n_rows, self.n_layers, self.kv_heads, server_cfg.region_size), dtype=torch.float32,
                        device=self.device)
            if keep_state
            else None
        )
        self.position_offset_by_row = torch.zeros(n_rows, dtype=torch.int64, device=self.device)
        self._policies: dict[PolicyConfig, Policy] = {}

    def policy(self, cfg: PolicyConfig) -> Policy:
        """The policy object of ``cfg``, built once (the seed is per request, not per config)."""
        if cfg not in self._policies:
            self._policies[cfg] = make_policy(cfg, backend=self.backend, max_select_block=self.max_select_block)
        return self._policies[cfg]

    @property
    def policy_cache_size(self) -> int:
        return len(self._policies)

    def reset_row(self, row: int) -> None:
        """A region starts on ``row``: positions are physical again and no round has scored
        its tokens yet. The ring is not cleared: the prefill just wrote its last R queries
        there, and any older slot is overwritten before the region can fill (B >= 2R)."""
        self.position_offset_by_row[row] = 0
        if self.score_state is not None:
            self.score_state[row] = 0

    # ---- rounds (eager, outside CUDA graphs) --------------------------------------------
    def select_and_compact(self, policy: Policy, slots: torch.Tensor, rows: torch.Tensor, seeds: list[int],
                           rounds: list[int], measure: bool = False, newest: torch.Tensor | None = None) -> Selection:
        """Choose what each region (a row of ``slots``) keeps and move it, and a stateful
        policy's scores, to the region's first B places. The kernels read each request's
        queries in place from its ring row: no copy."""
        ring = self.query_ring if policy.needs_queries or measure else None
        regions = Regions(self.k_buf, self.v_buf, slots, seeds=seeds, rounds=rounds, queries=ring,
                          query_rows=rows if ring is not None else None, head_offset=self.head_offset,
                          total_heads=self.total_kv_heads, newest=newest, state=self._carried(policy, slots, rows))
        selection = policy.selection(regions, measure=measure)
        ops.compact(self.k_buf, self.v_buf, slots, selection.keep, backend=self.backend)
        if selection.carry is not None:
            assert self.score_state is not None
            ops.carry_scores(self.score_state, rows, selection.carry, selection.keep, backend=self.backend)
        return selection

    def _carried(self, policy: Policy, slots: torch.Tensor, rows: torch.Tensor) -> torch.Tensor | None:
        """``[n_req, layers, KV heads, C]``: the scores a stateful policy's candidates carry."""
        if not policy.stateful:
            return None
        if self.score_state is None:
            raise RuntimeError(f"vase-sglang: policy {policy.name} keeps scores across rounds, and this server "
                               "allocated no score state (start it with a stateful --kv-policy)")
        return carried_scores(self.score_state, rows, slots.shape[1] - policy.config.recent)

    def rows_without_queries(self, rows: torch.Tensor) -> int:
        """How many of ``rows`` hold no query at all: an unhooked attention backend leaves
        every layer empty, so the first layer and head tell. Rounds synchronize anyway."""
        assert self.query_ring is not None
        return int((self.query_ring[rows, 0, 0].flatten(1).abs().amax(dim=1) == 0).sum())

    def compile_variants(self, configs: Sequence[PolicyConfig], measure: bool) -> None:
        """One round per config on the padding slot 0 and ring row 0, which no request owns,
        so that Triton compiles at start-up instead of in the middle of a decode step."""
        t0 = time.perf_counter()
        rows = torch.zeros(1, dtype=torch.int64, device=self.device)
        for cfg in configs:
            policy = make_policy(cfg, backend=self.backend, max_select_block=self.max_select_block)
            slots = torch.zeros((1, cfg.region_size), dtype=torch.int64, device=self.device)
            self.select_and_compact(policy, slots, rows, [0], [0], measure)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        logger.info("vase-sglang: kernels warmed up for %d policy/budget variants in %.1f s", len(configs),
                    time.perf_counter() - t0)

    # ---- forward pass (no host syncs: safe inside a CUDA graph) -------------------------
    def logical_positions(self, positions: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Decode positions + each row's offset: RoPE sees logical positions, the cache
        physical columns."""
        return positions + self.position_offset_by_row[rows.long()].to(positions.dtype)

    def record_queries(self, layer_id: int, rows: torch.Tensor, seq_lens: torch.Tensor, q: torch.Tensor) -> None:
        """Store each row's decode query at ring slot ``column % R``.

        ``seq_lens`` are physical lengths including the token being decoded.
        """
        if self.query_ring is None:
            return
        rows = rows.long()
        pos = (seq_lens.long() - 1).remainder(self.server_cfg.recent)
        self.query_ring[rows, layer_id, :, pos] = (
            q.reshape(rows.shape[0], self.q_heads, self.head_dim).to(self.query_ring.dtype))

    def record_extend_queries(self, layer_id: int, rows: torch.Tensor, seq_lens: torch.Tensor,
                              extend_lens: torch.Tensor, q: torch.Tensor) -> None:
        """Store the last R queries of each request in a prefill batch (``q`` holds the
        extend tokens of every request, concatenated) at ring slot ``column % R``.
        Prefills are never captured in a CUDA graph, so the selection may sync."""
        if self.query_ring is None or q.shape[0] == 0:
            return
        recent = self.server_cfg.recent
        rows, seq_lens, extend_lens = rows.long(), seq_lens.long(), extend_lens.long().to(rows.device)
        n_tok = q.shape[0]
        owner = torch.repeat_interleave(torch.arange(rows.shape[0], device=rows.device), extend_lens,
                                        output_size=n_tok)
        first = torch.cumsum(extend_lens, 0) - extend_lens
        col = seq_lens[owner] - extend_lens[owner] + torch.arange(n_tok, device=rows.device) - first[owner]
        last = (col >= seq_lens[owner] - recent).nonzero().squeeze(1)
        self.query_ring[rows[owner[last]], layer_id, :, col[last].remainder(recent)] = (
            q[last].reshape(-1, self.q_heads, self.head_dim).to(self.query_ring.dtype))

    def buffer_bytes(self) -> dict[str, int]:
        """What the ring and the score state hold, for ``GET /kv_policy``."""
        return {name: int(t.numel() * t.element_size()) if t is not None else 0
                for name, t in (("query_ring_bytes", self.query_ring), ("score_state_bytes", self.score_state))}
