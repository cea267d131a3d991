"""The eviction adapter: the one owner of per-request eviction state in a scheduler process.

The hooks in ``vase_sglang.patches`` are one short call each into ``VaseScheduler``; no
other module holds request state. The SGLang attributes it reads and writes are declared
in ``patches/contract.py`` (checked against the pinned SGLang); the policies below it
know tensors only.

Memory model (one request, one row of ``req_to_token``)::

    columns [0, start)            prompt / shared prefix: tree-owned, never written here
    columns [start, start + B + R)  the request's region of generated tokens (start: region_start)

When the region is full (B + R), one round keeps B positions per (layer, KV head),
moves them into columns [start, start + B) and frees the R tail slots. The row's slot
indices never change; only the data inside the slots moves, so after a round a column
of the region no longer holds the token of its position (the region is *compacted*, and
the tree must never take it). RoPE positions stay logical: the row's *position offset*
(logical - physical position) grows by R per round.

After a retraction SGLang re-prefills prompt + every generated token. The region then
restarts at the end of the prompt (or of the tree-owned prefix, if longer) and holds the
whole re-prefilled history, G tokens; the tree is never given more than the prompt of a
retracted request. The prefill recorded its last R queries in the ring, so when G >= B + R
a round runs at the first decode step and brings the region back to B (choosing among
G - R candidates, more than the usual B).

The query ring (``query_ring``, one row per ``req_to_token`` row) holds the query of
column ``col`` at slot ``col % R``: decode steps and prefills write there, and the newest
R columns are always the ones present (B is a multiple of R, so a round's shortening of
the row keeps the mapping).

What it holds:

* the server's policy and one policy object per distinct ``PolicyConfig`` (the seed is
  per request, not part of the config, so the cache stays small);
* the KV buffers as ``[layers, slots, heads, dim]`` views and the query ring;
* per request, weakly keyed by SGLang's ``Req`` so that a finished request's state goes
  with it: its options (config + seed) and its region;
* per row of ``req_to_token``: the position offset as a device tensor
  (``position_offset_by_row``), which the forward pass reads without a host sync
  (CUDA-graph safe); everything else lives in the request's ``RequestState``;
* bounded totals (a fixed-size latency histogram).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..config import PolicyConfig
from ..kernels import ops
from ..policies import Policy, Regions, RoundShape, Selection, carried_scores, make_policy
from ..sharding import HeadShard
from ..telemetry import Loop
from . import metrics
from .auto import AutoTable
from .options import RequestOptions, captures_queries, keeps_state, reachable_policies, resolve_request
from .stats import LogHistogram
from .telemetry import FleetTelemetry, RequestTelemetry, TelemetryOptions, TelemetryReport

if TYPE_CHECKING:  # the SGLang attributes read here, checked against the pinned SGLang
    from ..patches import contract as sg

logger = logging.getLogger("vase_sglang.plugin.scheduler")

# Test oracle: digest the prompt's K/V bytes when a region starts and after each round.
DEBUG_DIGEST = os.environ.get("VASE_SGLANG_DEBUG_DIGEST") == "1"
# Regions per kernel launch: bounds a round's temporaries (reserved before the pool is
# sized) whatever the number of requests whose regions fill in the same step.
MAX_ROUND_BATCH = 32


@dataclass
class RequestState:
    """One request's eviction state; its region fields restart after a re-prefill."""

    options: RequestOptions
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
    prefix_digests: list[str] = field(default_factory=list)  # debug oracle only

    @property
    def cfg(self) -> PolicyConfig:
        return self.options.cfg

    @property
    def started(self) -> bool:
        return self.row >= 0

    def round_due(self, cache_len: int) -> bool:
        """A round is due when the region holds B + R tokens (or more, after a re-prefill)."""
        return self.cfg.evicts and cache_len - self.region_start >= self.cfg.region_size


@dataclass(frozen=True)
class RequestCounters:
    """A request's eviction so far, as its meta_info reports it (``kv_<field>``)."""

    region_len: int  # physical KV length of the region, as of the last decode step
    evicted_tokens: int  # per (layer, KV head)
    eviction_rounds: int
    reprefilled_tokens: str  # generated tokens re-prefilled after each retraction, comma-separated

    @classmethod
    def before_first_decode(cls, req: sg.Req) -> RequestCounters:
        """Before a region starts (or with ``--kv-policy none``): every generated token but
        the one being sampled is in the cache, nothing evicted."""
        return cls(max(0, len(req.output_ids) - 1), 0, 0, "")


@dataclass(frozen=True)
class PolicyChoice:
    """The policy a request runs and why, as its meta_info reports it (``kv_<field>``)."""

    policy: str
    policy_reason: str


@dataclass
class Totals:
    """Server-lifetime totals, bounded in size however long the server runs."""

    rounds: int = 0  # request-rounds
    tokens_evicted: int = 0
    # Request-rounds of a query-reading policy whose ring held no query at all: the decode
    # path of some attention backend was not hooked, so attention scored nothing.
    rounds_without_queries: int = 0
    round_latency: LogHistogram = field(default_factory=LogHistogram)  # one per batched round
    # Host seconds in the telemetry's own work: measuring rounds, the loop detector, the reports.
    telemetry_seconds: float = 0.0


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


def query_ring_bytes_per_request(cfg: PolicyConfig, n_layers: int, q_heads: int, head_dim: int,
                                 dtype_bytes: int, auto: AutoTable | None = None, measure: bool = False) -> int:
    """Bytes of query ring one request slot needs (0 when no reachable policy reads queries
    and the telemetry does not measure)."""
    if not captures_queries(cfg, auto, measure):
        return 0
    return n_layers * q_heads * cfg.recent * head_dim * dtype_bytes


def score_state_bytes_per_request(cfg: PolicyConfig, n_layers: int, kv_heads: int, auto: AutoTable | None = None,
                                  measure: bool = False) -> int:
    """Bytes of score state one request slot needs: one fp32 per (layer, KV head, region
    position) when a policy a request may run is stateful, else 0."""
    if not keeps_state(cfg, auto, measure):
        return 0
    return 4 * n_layers * kv_heads * cfg.region_size


@dataclass(frozen=True)
class PolicyMemory:
    """What the eviction path allocates beside the KV pool on one TP rank: the query ring
    and the score state (one row each per request slot) and the temporaries of one
    batched round."""

    ring_bytes_per_request: int
    request_slots: int
    workspace_bytes: int
    state_bytes_per_request: int = 0

    @property
    def ring_bytes(self) -> int:
        return self.ring_bytes_per_request * self.request_slots

    @property
    def state_bytes(self) -> int:
        return self.state_bytes_per_request * self.request_slots

    @property
    def total_bytes(self) -> int:
        return self.ring_bytes + self.state_bytes + self.workspace_bytes


def policy_memory(server_cfg: PolicyConfig, shard: HeadShard, n_layers: int, head_dim: int, itemsize: int,
                  request_slots: int, auto: AutoTable | None = None, measure: bool = False) -> PolicyMemory:
    """The one sizing of the ring, the score state and the round workspace, for a rank holding ``shard``'s
    heads (the reservation before the pool exists and the start-up report both use it);
    ``measure``: the telemetry measures every round."""
    ring = query_ring_bytes_per_request(server_cfg, n_layers, shard.q_heads, head_dim, itemsize, auto, measure)
    shape = RoundShape(n_req=request_slots, n_layers=n_layers, q_heads=shard.q_heads, kv_heads=shard.kv_heads,
                       head_dim=head_dim, itemsize=itemsize, total_kv_heads=shard.total_kv_heads)
    state = score_state_bytes_per_request(server_cfg, n_layers, shard.kv_heads, auto, measure)
    return PolicyMemory(ring, request_slots, round_workspace_bytes(server_cfg, shape, auto, measure), state)


def policies_for(server_cfg: PolicyConfig, auto: AutoTable | None = None, measure: bool = False) -> list[str]:
    """Evicting policies a request may pick on this server (``kv_policy`` per request):
    the ones that read queries only when the server captures them."""
    return reachable_policies(server_cfg, auto, measure)


def reachable_configs(server_cfg: PolicyConfig, auto: AutoTable | None = None,
                      measure: bool = False) -> list[PolicyConfig]:
    """Configs a request may run at the server's budget: every policy it may pick, and
    ``auto``'s choices (which may also set ``outlier_factor``)."""
    out = [server_cfg.replace(policy=name) for name in policies_for(server_cfg, auto, measure)]
    if auto is not None:
        out += [server_cfg.replace(**c) for c in auto.policies()]
    return out


def round_workspace_bytes(server_cfg: PolicyConfig, shape: RoundShape, auto: AutoTable | None = None,
                          measure: bool = False) -> int:
    """Peak temporaries of one batched round of ``min(shape.n_req, MAX_ROUND_BATCH)``
    regions, for the most demanding config a request may reach (at the server's budget,
    the largest a request may ask for), measured by the telemetry or not."""
    shape = RoundShape(**{**shape.__dict__, "n_req": min(shape.n_req, MAX_ROUND_BATCH)})
    return max((make_policy(c).workspace_bytes(shape, measure) for c in reachable_configs(server_cfg, auto, measure)),
               default=0)


def warmup_configs(server_cfg: PolicyConfig, auto: AutoTable | None = None,
                   measure: bool = False) -> list[PolicyConfig]:
    """One config per kernel variant a request can reach: every policy it may pick, with
    and without the value reservation, at one budget per power-of-two block of candidates
    (the only budget-dependent compile-time constant; the budget itself is a runtime value)."""
    budgets: dict[int, int] = {}
    for b in range(2 * server_cfg.recent, server_cfg.budget + 1, server_cfg.recent):
        budgets.setdefault(1 << (b - 1).bit_length(), b)
    out = []
    for reachable in reachable_configs(server_cfg, auto, measure):
        for b in budgets.values():
            cfg = reachable.replace(budget=b)
            if cfg not in out:
                out.append(cfg)
            if cfg.large and cfg.replace(n_large=0) not in out:
                out.append(cfg.replace(n_large=0))
    return out


class VaseScheduler:
    """Admission, rounds, positions, queries and the tree cap for one scheduler process."""

    def __init__(
        self,
        server_cfg: PolicyConfig,
        server_seed: int | None,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        req_to_token_pool: sg.ReqToTokenPool,
        q_heads: int,
        capture_queries: bool,
        backend: str | None = None,
        auto: AutoTable | None = None,
        head_offset: int = 0,
        total_kv_heads: int | None = None,
        count_totals: bool = True,
        telemetry: TelemetryOptions | None = None,
        keep_state: bool = False,
    ):
        self.server_cfg = server_cfg
        self.auto = auto
        self.telemetry = telemetry or TelemetryOptions()
        self.fleet = FleetTelemetry()
        self._token_chars: dict[int, int] = {}  # decoded length of each token: the loop detectors share it
        # On a TP rank: the global index of the local KV heads (for TP-invariant noise),
        # and whether this rank reports to the Prometheus counters (one rank per request).
        self.head_offset, self.total_kv_heads, self.count_totals = head_offset, total_kv_heads, count_totals
        self.server_seed = server_seed
        self.k_buf, self.v_buf = k_buf, v_buf  # [n_layers, n_slots, kv_heads, head_dim]
        self.n_layers, _, self.kv_heads, self.head_dim = k_buf.shape
        self.q_heads = q_heads
        self.device = k_buf.device
        self.backend = backend
        # The widest selection block the warm-up compiles (the largest budget's); a round
        # over more candidates (the first after a long re-prefill) selects with the torch
        # twin instead of compiling a kernel in the middle of a decode step.
        self.max_select_block = 1 << (server_cfg.budget - 1).bit_length() if server_cfg.evicts else None
        self.req_to_token_pool = req_to_token_pool
        n_rows = req_to_token_pool.size + 1
        # [rows, layers, Hq, R, D]: a round's queries are then one gather by row.
        self.query_ring = (
            torch.zeros((n_rows, self.n_layers, q_heads, server_cfg.recent, self.head_dim), dtype=k_buf.dtype,
                        device=self.device)
            if capture_queries
            else None
        )
        # [rows, layers, KV heads, B + R] fp32: the score each region position carries to the
        # next round, for the stateful policies (H2O, G-KV); it moves with the tokens.
        self.score_state = (
            torch.zeros((n_rows, self.n_layers, self.kv_heads, server_cfg.region_size), dtype=torch.float32,
                        device=self.device)
            if keep_state
            else None
        )
        # Logical - physical position of each row's next token: the forward reads it.
        self.position_offset_by_row = torch.zeros(n_rows, dtype=torch.int64, device=self.device)
        self._policies: dict[PolicyConfig, Policy] = {}
        self._requests: weakref.WeakKeyDictionary[Any, RequestState] = weakref.WeakKeyDictionary()
        self._admitting_region: int | None = None
        self.totals = Totals()

    # ---- per-request state ------------------------------------------------------------
    def state(self, req: sg.Req) -> RequestState:
        """The request's state, created from its validated options on first sight."""
        st = self._requests.get(req)
        if st is None:
            params = req.sampling_params
            options = resolve_request(self.server_cfg, self.server_seed, params.custom_params, rid=req.rid,
                                      sampling_seed=params.sampling_seed, auto=self.auto)
            st = self._requests[req] = RequestState(options, self._request_telemetry(req, options))
        return st

    def _request_telemetry(self, req: sg.Req, options: RequestOptions) -> RequestTelemetry:
        stop = self.telemetry.stop_on_loop if options.stop_on_loop is None else options.stop_on_loop
        tokenizer = req.tokenizer
        text_of = (lambda ids: tokenizer.decode(list(ids))) if tokenizer is not None else None
        return RequestTelemetry(text_of, stop_on_loop=stop, detect_loops=self.telemetry.enabled or stop,
                                token_chars=self._token_chars if tokenizer is not None else None)

    def _started(self, req: sg.Req) -> RequestState | None:
        st = self._requests.get(req)
        return st if st is not None and st.started else None

    def policy(self, cfg: PolicyConfig) -> Policy:
        if cfg not in self._policies:
            self._policies[cfg] = make_policy(cfg, backend=self.backend, max_select_block=self.max_select_block)
        return self._policies[cfg]

    @property
    def policy_cache_size(self) -> int:
        return len(self._policies)

    # ---- admission --------------------------------------------------------------------
    @contextmanager
    def admitting(self, req: sg.Req) -> Iterator[int | None]:
        """While SGLang sizes ``req``'s max_new_tokens: its region size, None if it does not evict."""
        cfg = self.state(req).cfg
        self._admitting_region = cfg.region_size if cfg.evicts else None
        try:
            yield self._admitting_region
        finally:
            self._admitting_region = None

    @property
    def admitting_region(self) -> int | None:
        return self._admitting_region

    def growth_bound(self, req: sg.Req) -> int | None:
        """Slots a running request can still grow by; None: SGLang's own estimate applies."""
        st = self._started(req)
        if st is None or not st.cfg.evicts:
            return None
        # The region never holds more than B + R: what is left to grow is bounded by that.
        remaining = req.sampling_params.max_new_tokens - len(req.output_ids)
        room = st.cfg.region_size - (req.kv.kv_committed_len - st.region_start)
        return max(0, min(remaining, room))

    # ---- decode step ------------------------------------------------------------------
    def before_decode_alloc(self, batch: sg.ScheduleBatch) -> None:
        """Start regions of newly prefilled requests; run a round for each full region,
        free its R tail slots and shorten its row (committed == allocated == seq_len)."""
        due = []
        for i, req in enumerate(batch.reqs):
            st = self._begin_region(req)
            if st.round_due(req.kv.kv_committed_len):
                due.append((i, req, st))
        if not due:
            return
        req_to_token = self.req_to_token_pool.req_to_token
        self._run_rounds([(st, req_to_token[st.row, st.region_start : int(req.kv.kv_committed_len)],
                           len(req.output_ids)) for _, req, st in due])
        if DEBUG_DIGEST:
            for _, _, st in due:
                st.prefix_digests.append(self._prefix_digest(st.row, st.region_start))
        self._shrink_rows(batch, due)

    def after_decode_alloc(self, batch: sg.ScheduleBatch) -> None:
        states = []
        for req in batch.reqs:
            st = self._started(req)
            if st is not None:
                st.region_len = req.kv.kv_committed_len - st.region_start
                states.append(st)
        if self.count_totals:
            metrics.observe_step([(st.cfg.region_size, st.region_len) for st in states if st.cfg.evicts])

    def _begin_region(self, req: sg.Req) -> RequestState:
        """The request's state for its current row; a new region after a (re-)prefill."""
        st = self.state(req)
        row = int(req.kv.req_pool_idx)
        generation = int(self.req_to_token_pool.req_generation[row])
        if st.row == row and st.generation == generation:
            return st
        # First decode, or re-prefilled after a retraction: rounds and evicted go on, the
        # region restarts after the prompt (or the tree-owned prefix, if longer) and positions
        # are physical again (the re-prefill recomputed every token at its own position).
        start = self._count_reprefill(req, st)
        st.row, st.generation, st.region_start = row, generation, start
        st.compacted, st.region_len = False, int(req.kv.kv_committed_len) - start
        self.position_offset_by_row[row] = 0
        if self.score_state is not None:  # no round has scored this region's tokens yet
            self.score_state[row] = 0
        # The ring is not cleared: the prefill just wrote its last R queries there, and any
        # older slot is overwritten before the region can fill (B >= 2R decode steps).
        if DEBUG_DIGEST:
            st.prefix_digests = [self._prefix_digest(row, st.region_start)]
        return st

    @staticmethod
    def _count_reprefill(req: sg.Req, st: RequestState) -> int:
        """The first column of a region starting now (after the prompt, or after the
        tree-owned prefix if that is longer); generated tokens before it came back with a
        re-prefill, and are counted in the request's report."""
        committed = int(req.kv.kv_committed_len)
        start = min(committed, max(len(req.origin_input_ids), int(req.kv.cache_protected_len or 0)))
        if committed > start:
            st.reprefilled.append(committed - start)
        return start

    def _note_final_reprefill(self, req: sg.Req, st: RequestState) -> None:
        """A re-prefill whose first token finishes the request has no decode step, so no
        region starts for it: its re-prefilled tokens are counted here, while the request
        still holds its row, so that the report (``kv_reprefilled_tokens``) names every
        re-prefill."""
        if not st.started or req.kv.req_pool_idx is None:
            return
        row = int(req.kv.req_pool_idx)
        generation = int(self.req_to_token_pool.req_generation[row])
        if (st.row, st.generation) == (row, generation):
            return
        self._count_reprefill(req, st)
        st.row, st.generation = row, generation  # counted once

    def _run_rounds(self, items: Sequence[tuple[RequestState, torch.Tensor, int]]) -> None:
        """One round for each ``(state, region_slots, output tokens so far)``; afterwards each
        region's first B slots hold the kept tokens, oldest first."""
        t0 = time.perf_counter()
        groups: dict[tuple[PolicyConfig, int], list[tuple[RequestState, torch.Tensor, int]]] = {}
        for st, slots, generated in items:  # one launch per config and region length
            groups.setdefault((st.cfg, slots.shape[0]), []).append((st, slots, generated))
        for (cfg, _), members in groups.items():
            for i in range(0, len(members), MAX_ROUND_BATCH):
                self._round(cfg, members[i : i + MAX_ROUND_BATCH])
        if self.device.type == "cuda":
            torch.cuda.current_stream().synchronize()  # honest round latency; rounds are rare
        seconds = time.perf_counter() - t0
        tokens = sum(slots.shape[0] - st.cfg.budget for st, slots, _ in items)
        self.totals.rounds += len(items)
        self.totals.tokens_evicted += tokens
        self.totals.round_latency.observe(seconds)
        if self.count_totals:
            metrics.observe_rounds(len(items), tokens, seconds)

    def _round(self, cfg: PolicyConfig, group: Sequence[tuple[RequestState, torch.Tensor, int]]) -> None:
        """One batched round of regions that share ``cfg`` (at most MAX_ROUND_BATCH)."""
        if _capturing():
            raise RuntimeError("vase-sglang: an eviction round ran inside CUDA-graph capture; rounds move KV "
                               "data and must run eagerly, before the step's allocation")
        policy = self.policy(cfg)
        slots = torch.stack([s.long() for _, s, _ in group])
        rows = torch.tensor([st.row for st, _, _ in group], device=self.device)
        measure = self.measures
        if (policy.needs_queries or measure) and self.query_ring is not None:
            self._check_queries(rows)
        # Ring position of each request's newest query: its last column modulo R.
        newest = torch.tensor([(st.region_start + s.shape[0] - 1) % self.server_cfg.recent for st, s, _ in group],
                              device=self.device)
        selection = self._select_and_compact(policy, slots, rows, [st.options.seed for st, _, _ in group],
                                             [st.rounds for st, _, _ in group], measure, newest)
        removed = slots.shape[1] - cfg.budget  # R, or G + R - B after a re-prefill
        for st, _, _ in group:
            st.rounds += 1
            st.compacted = True
            st.evicted += removed
            self.position_offset_by_row[st.row] += removed
        if selection.evicted_attention is not None:
            t0 = time.perf_counter()
            # Mean over layers and KV heads: one host copy per batched round (rounds sync anyway).
            signals = selection.evicted_attention.mean(dim=(1, 2)).tolist()
            for (st, _, generated), signal in zip(group, signals, strict=True):
                st.telemetry.on_round(signal, generated)
            if self.count_totals:
                metrics.observe_round_signals(cfg, signals)
            self.totals.telemetry_seconds += selection.measure_seconds + time.perf_counter() - t0

    @property
    def measures(self) -> bool:
        """Rounds measure what they evict: telemetry on and a query ring to read."""
        return self.telemetry.enabled and self.query_ring is not None

    def _select_and_compact(self, policy: Policy, slots: torch.Tensor, rows: torch.Tensor, seeds: list[int],
                            rounds: list[int], measure: bool = False, newest: torch.Tensor | None = None) -> Selection:
        """Choose what each region keeps and move it, and a stateful policy's scores, to the
        region's first B places. The kernels read each request's queries in place from its
        ring row: no copy."""
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

    def _check_queries(self, rows: torch.Tensor) -> None:
        # An unhooked backend leaves every layer empty: the first layer and head tell.
        # Rounds synchronize anyway.
        assert self.query_ring is not None
        empty = int((self.query_ring[rows, 0, 0].flatten(1).abs().amax(dim=1) == 0).sum())
        if empty:
            if not self.totals.rounds_without_queries:
                logger.warning("vase-sglang: %d request(s) reached an eviction round with an empty query ring: "
                               "the attention backend's decode path records no queries", empty)
            self.totals.rounds_without_queries += empty

    def _shrink_rows(self, batch: sg.ScheduleBatch, due: list[tuple[int, sg.Req, RequestState]]) -> None:
        req_to_token = self.req_to_token_pool.req_to_token
        seq_lens = batch.seq_lens.clone()
        seq_lens_cpu = batch.seq_lens_cpu.clone()
        orig = batch.orig_seq_lens.clone() if batch.orig_seq_lens is not None else None
        for i, req, st in due:
            new_len = st.region_start + st.cfg.budget
            tail = req_to_token[st.row, new_len : int(req.kv.kv_committed_len)].to(torch.int64)
            batch.token_to_kv_pool_allocator.free(tail)
            req.kv.kv_committed_len = new_len
            req.kv.kv_allocated_len = new_len
            seq_lens[i] = new_len
            seq_lens_cpu[i] = new_len
            if orig is not None:
                orig[i] = new_len
        # New tensors, as prepare_for_decode does: nothing else holds the old ones by then.
        batch.seq_lens, batch.seq_lens_cpu, batch.orig_seq_lens = seq_lens, seq_lens_cpu, orig
        batch.seq_lens_sum = None

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

    # ---- start-up ---------------------------------------------------------------------
    def warm_up(self) -> int:
        """Run one round per kernel variant a request can reach (``warmup_configs``) on the
        padding slot 0 and ring row 0, which no request owns, so that Triton compiles at
        start-up instead of in the middle of a decode step. Returns the configs run."""
        configs = warmup_configs(self.server_cfg, self.auto, self.measures)
        t0 = time.perf_counter()
        rows = torch.zeros(1, dtype=torch.int64, device=self.device)
        for cfg in configs:
            policy = make_policy(cfg, backend=self.backend, max_select_block=self.max_select_block)
            slots = torch.zeros((1, cfg.region_size), dtype=torch.int64, device=self.device)
            self._select_and_compact(policy, slots, rows, [0], [0], self.measures)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        logger.info("vase-sglang: kernels warmed up for %d policy/budget variants in %.1f s", len(configs),
                    time.perf_counter() - t0)
        return len(configs)

    # ---- radix tree -------------------------------------------------------------------
    def checkpoint_limit(self, req: sg.Req, up_to: int) -> int | None:
        """The tree may take columns up to this (None: as asked). The columns of a compacted
        region hold another token's KV than their position's, so the tree stops at the
        region's start. A
        retracted request's re-prefilled history is exact, but in the tree it would be a
        protected prefix that no round can evict: the tree takes its prompt only."""
        if req.retraction_count and self.state(req).cfg.evicts:
            prompt = len(req.origin_input_ids)
            if up_to > prompt:
                return prompt
        st = self._started(req)
        if st is not None and st.compacted and up_to > st.region_start:
            return st.region_start
        return None

    # ---- reporting --------------------------------------------------------------------
    def counters(self, req: sg.Req) -> RequestCounters:
        """The request's eviction so far, for its meta_info."""
        st = self._started(req)
        if st is None:
            return RequestCounters.before_first_decode(req)
        return RequestCounters(st.region_len, st.evicted, st.rounds, ",".join(map(str, st.reprefilled)))

    # ---- telemetry ------------------------------------------------------------------
    def after_tokens(self, req: sg.Req, new_tokens: int) -> Loop | None:
        """The request's new output tokens (after every step, prefill or decode): the loop
        to stop it at, if it just looped and stops on loops (None otherwise). A request
        that finished here may have just been re-prefilled: that is counted too."""
        st = self.state(req)
        if req.finished():
            self._note_final_reprefill(req, st)
        tel = st.telemetry
        if tel.detector is None or tel.loop is not None or new_tokens <= 0:
            return None
        t0 = time.perf_counter()
        loop = tel.on_tokens(req.output_ids[-new_tokens:])
        self.totals.telemetry_seconds += time.perf_counter() - t0
        if loop is None or not tel.stop_on_loop:
            return None
        tel.stopped = True
        return loop

    def telemetry_report(self, req: sg.Req) -> TelemetryReport:
        """What eviction cost the request so far, for its meta_info; a finished request is
        counted in the totals once (``/kv_policy``, ``/metrics``)."""
        t0 = time.perf_counter()
        st = self.state(req)
        generated = len(req.output_ids)
        report = st.telemetry.report(generated, st.cfg, self.telemetry.estimator)
        if req.finished() and not st.telemetry.observed and self.count_totals:
            st.telemetry.observed = True
            self.fleet.observe(st.cfg, report, st.telemetry.stopped)
            metrics.observe_request(st.cfg, report, st.telemetry.stopped)
        self.totals.telemetry_seconds += time.perf_counter() - t0
        return report

    def policy_choice(self, req: sg.Req) -> PolicyChoice:
        """The policy the request runs and why, for its meta_info."""
        options = self.state(req).options
        return PolicyChoice(options.cfg.policy, options.reason)

    def digests(self, req: sg.Req) -> str:
        st = self._requests.get(req)
        return ",".join(st.prefix_digests) if st is not None else ""

    def summary(self) -> dict[str, Any]:
        """Live totals for ``GET /kv_policy``."""
        t = self.totals
        lat = t.round_latency

        def ms(x: float | None) -> float | None:
            return round(1e3 * x, 3) if x is not None else None

        return {
            "eviction_rounds": t.rounds,
            "tokens_evicted": t.tokens_evicted,
            "rounds_without_queries": t.rounds_without_queries,
            "batched_rounds": lat.count,
            "round_latency_ms_p50": ms(lat.quantile(0.5)),
            "round_latency_ms_p99": ms(lat.quantile(0.99)),
            "round_latency_ms_max": ms(lat.max) if lat.count else None,
            # All rounds together, so a benchmark can state their share of the decode time.
            "round_seconds_total": round(lat.total, 4),
            "query_ring_bytes": (int(self.query_ring.numel() * self.query_ring.element_size())
                                 if self.query_ring is not None else 0),
            "score_state_bytes": (int(self.score_state.numel() * self.score_state.element_size())
                                  if self.score_state is not None else 0),
            "policy_cache_entries": len(self._policies),
            # False on the other ranks of an attention-TP group: they run the same rounds.
            "counted_in_totals": self.count_totals,
            "tracked_requests": len(self._requests),
            "telemetry": {"enabled": self.telemetry.enabled, "measures_rounds": self.measures,
                          # The telemetry's own host work, so a benchmark can state its share of the wall time.
                          "seconds_total": round(self.totals.telemetry_seconds, 4),
                          "stop_on_loop": self.telemetry.stop_on_loop,
                          "kl_estimator": self.telemetry.estimator.source if self.telemetry.estimator else None,
                          "by_config": self.fleet.summary()},
        }

    def _prefix_digest(self, row: int, region_start: int) -> str:
        slots = self.req_to_token_pool.req_to_token[row, :region_start].long()
        h = hashlib.sha256()
        for buf in (self.k_buf, self.v_buf):
            h.update(buf[:, slots].contiguous().cpu().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()[:16]


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


# One scheduler (one TP rank) per process: the hooks reach the adapter through here.
_current: VaseScheduler | None = None


def install(scheduler: VaseScheduler) -> None:
    global _current
    _current = scheduler


def current() -> VaseScheduler | None:
    """The process's adapter; None before the model runner built it, or with --kv-policy none."""
    return _current
