"""Per-request eviction state and rounds over token-indexed KV pools.

This is the bridge between the pure policies and a serving engine. It knows tensors,
rows and columns, not SGLang: the hooks in ``vase_sglang.patches`` feed it.

Memory model (one request, one row of ``req_to_token``)::

    columns [0, lo)            prompt / shared prefix: tree-owned, never written here
    columns [lo, lo + B + R)   the request's region of generated tokens

When the region is full (B + R), one round keeps B positions per (layer, KV head),
moves them into columns [lo, lo + B) and the caller frees the R tail slots. The row's
slot indices never change; only the data inside the slots moves. RoPE positions stay
logical: ``delta`` (logical - physical) grows by R per round.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from .config import PolicyConfig
from .kernels import ops
from .policies import POLICIES, Policy, Regions, make_policy

logger = logging.getLogger("vase_sglang.runtime")


@dataclass
class RequestState:
    """What the runtime tracks per request (kept on the engine's request object)."""

    cfg: PolicyConfig
    row: int
    generation: int
    lo: int
    rounds: int = 0  # rounds over the request's life: part of each round's seed
    compacted: bool = False  # region data moved since ``lo`` was set
    evicted: int = 0  # tokens evicted per (layer, KV head)
    delta: int = 0  # logical position - physical column
    region_len: int = 0  # physical KV length of the generated region, after this step's allocation
    prefix_digests: list[str] = field(default_factory=list)  # debug oracle only

    @property
    def evicts(self) -> bool:
        return self.cfg.evicts

    def region_length(self, cache_len: int) -> int:
        return cache_len - self.lo

    def due(self, cache_len: int) -> bool:
        return self.cfg.evicts and self.region_length(cache_len) >= self.cfg.region_size


@dataclass
class Totals:
    rounds: int = 0
    tokens_evicted: int = 0
    requests_evicted: int = 0
    round_seconds: list[float] = field(default_factory=list)


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


class EvictionRuntime:
    """Owns the query ring, per-row state tensors and the policy objects."""

    def __init__(
        self,
        server_cfg: PolicyConfig,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        n_rows: int,
        q_heads: int,
        capture_queries: bool,
        backend: str | None = None,
    ):
        self.server_cfg = server_cfg
        self.k_buf, self.v_buf = k_buf, v_buf  # [n_layers, n_slots, kv_heads, head_dim]
        n_layers, _, self.kv_heads, self.head_dim = k_buf.shape
        self.n_layers, self.q_heads = n_layers, q_heads
        device = k_buf.device
        self.device = device
        self.backend = backend
        recent = server_cfg.recent
        # [rows, layers, Hq, R, D]: regions.queries is then one gather by row.
        self.qbuf = (
            torch.zeros((n_rows, n_layers, q_heads, recent, self.head_dim), dtype=k_buf.dtype, device=device)
            if capture_queries
            else None
        )
        self.lo_by_row = torch.zeros(n_rows, dtype=torch.int64, device=device)
        self.delta_by_row = torch.zeros(n_rows, dtype=torch.int64, device=device)
        self._policies: dict[PolicyConfig, Policy] = {}
        self.totals = Totals()

    # ---- memory ---------------------------------------------------------------------
    @staticmethod
    def query_ring_bytes_per_request(cfg: PolicyConfig, n_layers: int, q_heads: int, head_dim: int,
                                     dtype_bytes: int) -> int:
        if not POLICIES[cfg.policy].needs_queries:
            return 0
        return n_layers * q_heads * cfg.recent * head_dim * dtype_bytes

    # ---- lifecycle ------------------------------------------------------------------
    def begin(self, state: RequestState) -> None:
        """A request starts (or restarts, after a re-prefill) its region at ``state.lo``."""
        self.lo_by_row[state.row] = state.lo
        self.delta_by_row[state.row] = state.delta
        if self.qbuf is not None:
            self.qbuf[state.row].zero_()

    def policy(self, cfg: PolicyConfig) -> Policy:
        if cfg not in self._policies:
            self._policies[cfg] = make_policy(cfg, backend=self.backend)
        return self._policies[cfg]

    # ---- queries --------------------------------------------------------------------
    def record_queries(self, layer_id: int, rows: torch.Tensor, seq_lens: torch.Tensor, q: torch.Tensor) -> None:
        """Store each row's decode query at ring slot ``(column - lo) % R``.

        ``seq_lens`` are physical lengths including the token being decoded. Static
        shapes and no host syncs, so it is safe inside a CUDA graph.
        """
        if self.qbuf is None:
            return
        rows = rows.long()
        pos = (seq_lens.long() - 1 - self.lo_by_row[rows]).remainder(self.server_cfg.recent)
        self.qbuf[rows, layer_id, :, pos] = q.reshape(rows.shape[0], self.q_heads, self.head_dim).to(self.qbuf.dtype)

    # ---- rounds ---------------------------------------------------------------------
    def run_rounds(self, items: Sequence[tuple[RequestState, torch.Tensor]]) -> None:
        """One round for each ``(state, region_slots)``; ``region_slots`` is ``[B + R]``.

        Afterwards each region's first B slots hold the kept tokens; the caller frees the
        last R slots and shortens the row.
        """
        if not items:
            return
        t0 = time.perf_counter()
        groups: dict[PolicyConfig, list[tuple[RequestState, torch.Tensor]]] = {}
        for state, slots in items:
            groups.setdefault(state.cfg, []).append((state, slots))
        for cfg, group in groups.items():
            policy = self.policy(cfg)
            slots = torch.stack([s.long() for _, s in group])
            rows = torch.tensor([st.row for st, _ in group], device=self.device)
            queries = self.qbuf[rows] if (policy.needs_queries and self.qbuf is not None) else None
            regions = Regions(self.k_buf, self.v_buf, slots, seeds=[st.cfg.seed for st, _ in group],
                              rounds=[st.rounds for st, _ in group], queries=queries)
            keep = policy.select(regions)
            ops.compact(self.k_buf, self.v_buf, slots, keep, backend=self.backend)
            for st, _ in group:
                st.rounds += 1
                st.compacted = True
                st.evicted += cfg.recent
                st.delta += cfg.recent
                self.delta_by_row[st.row] += cfg.recent
                self.totals.rounds += 1
                self.totals.tokens_evicted += cfg.recent
        if self.device.type == "cuda":
            torch.cuda.current_stream().synchronize()  # honest round latency; rounds are rare
        self.totals.round_seconds.append(time.perf_counter() - t0)
