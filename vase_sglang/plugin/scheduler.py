"""The eviction adapter: the one owner of per-request eviction state in a scheduler process.

The hooks in ``vase_sglang.patches`` are one short call each into ``VaseScheduler``; no
other module holds request state. The SGLang attributes it reads and writes are declared
in ``patches/contract.py`` (checked against the pinned SGLang). Below it: ``engine``
(the buffers and the rounds over them, tensors only), ``planning`` (what a request can
reach and what it costs), ``request`` (one request's state) and the policies.

One request owns one row of ``req_to_token``: columns before ``region_start`` hold the
prompt or shared prefix (tree-owned, never written here), the next B + R columns its
region of generated tokens. A full region runs a round: B positions per (layer, KV head)
are kept in the region's first B columns, the R tail slots are freed, the row is
shortened and its position offset grows by R, so RoPE positions stay logical. A compacted
region is never published to the tree. After a retraction the region restarts after the
prompt and holds the whole re-prefilled history; its first round runs at once. The whole
model: ``docs/memory-model.md``.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from ..config import PolicyConfig
from ..telemetry import Loop
from . import metrics
from .auto import AutoTable
from .engine import RoundEngine
from .options import RequestOptions, resolve_request
from .planning import MAX_ROUND_BATCH, select_block_limit, warmup_configs
from .report import PolicyChoice, RequestCounters, Totals
from .request import RequestState
from .telemetry import FleetTelemetry, RequestTelemetry, TelemetryOptions, TelemetryReport

if TYPE_CHECKING:  # the SGLang attributes read here, checked against the pinned SGLang
    from ..patches import contract as sg

logger = logging.getLogger("vase_sglang.plugin.scheduler")


class VaseScheduler(RoundEngine):
    """Admission, rounds, positions, queries and the tree cap for one scheduler process:
    the request side, over the buffers and rounds of ``RoundEngine``."""

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
        super().__init__(server_cfg, k_buf, v_buf, req_to_token_pool.size + 1, q_heads, capture_queries,
                         keep_state=keep_state, backend=backend, head_offset=head_offset,
                         total_kv_heads=total_kv_heads, max_select_block=select_block_limit(server_cfg))
        self.auto = auto
        self.server_seed = server_seed
        self.req_to_token_pool = req_to_token_pool
        self.telemetry = telemetry or TelemetryOptions()
        self.fleet = FleetTelemetry()
        self._token_chars: dict[int, int] = {}  # decoded length of each token: the loop detectors share it
        # On a TP rank: whether this rank reports to the Prometheus counters (one rank per request).
        self.count_totals = count_totals
        self._requests: weakref.WeakKeyDictionary[Any, RequestState] = weakref.WeakKeyDictionary()
        self._admitting_region: int | None = None
        self.totals = Totals()

    @property
    def measures(self) -> bool:
        """Rounds measure what they evict: telemetry on and a query ring to read."""
        return self.telemetry.enabled and self.query_ring is not None

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
        """The request's state for its current row; a new region after a (re-)prefill, with
        physical positions again (the re-prefill recomputed every token at its own position)."""
        st = self.state(req)
        row = int(req.kv.req_pool_idx)
        generation = int(self.req_to_token_pool.req_generation[row])
        if not st.holds(row, generation):
            st.start_region(req, row, generation)
            self.reset_row(row)
        return st

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
        selection = self.select_and_compact(policy, slots, rows, [st.options.seed for st, _, _ in group],
                                            [st.rounds for st, _, _ in group], measure, newest)
        removed = slots.shape[1] - cfg.budget  # R, or G + R - B after a re-prefill
        for st, _, _ in group:
            st.after_round(removed)
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

    def _check_queries(self, rows: torch.Tensor) -> None:
        empty = self.rows_without_queries(rows)
        if empty:
            if not self.totals.rounds_without_queries:
                logger.warning("vase-sglang: %d request(s) reached an eviction round with an empty query ring: "
                               "the attention backend's decode path records no queries", empty)
            self.totals.rounds_without_queries += empty

    def _shrink_rows(self, batch: sg.ScheduleBatch, due: list[tuple[int, sg.Req, RequestState]]) -> None:
        """Free each round's tail slots and shorten its row: the bookkeeping of SGLang's
        ``ScheduleBatch.prepare_for_decode`` and ``alloc_for_decode_default`` (manifest kinds
        ``mirror`` and ``call``, sources pinned: re-read both when test_manifest reports a
        changed source), for shorter rows."""
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

    # ---- start-up ---------------------------------------------------------------------
    def warm_up(self) -> int:
        """Compile every kernel variant a request can reach (``planning.warmup_configs``)
        at start-up; returns the configs run."""
        configs = warmup_configs(self.server_cfg, self.auto, self.measures)
        self.compile_variants(configs, self.measures)
        return len(configs)

    # ---- radix tree -------------------------------------------------------------------
    def checkpoint_limit(self, req: sg.Req, up_to: int) -> int | None:
        """The tree may take columns up to this (None: as asked). The columns of a compacted
        region hold another token's KV than their position's, so the tree stops at the
        region's start. A retracted request's re-prefilled history is exact, but in the tree it would be a
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
        return st.counters() if st is not None else RequestCounters.before_first_decode(req)

    # ---- telemetry ------------------------------------------------------------------
    def after_tokens(self, req: sg.Req, new_tokens: int) -> Loop | None:
        """The request's new output tokens (after every step, prefill or decode): the loop
        to stop it at, if it just looped and stops on loops (None otherwise). A request
        that finished here may have just been re-prefilled: that is counted too."""
        st = self.state(req)
        if req.finished() and req.kv.req_pool_idx is not None:
            row = int(req.kv.req_pool_idx)
            st.note_final_reprefill(req, row, int(self.req_to_token_pool.req_generation[row]))
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

    def summary(self) -> dict[str, Any]:
        """Live totals for ``GET /kv_policy``."""
        return {
            **self.totals.summary(),
            **self.buffer_bytes(),
            "policy_cache_entries": self.policy_cache_size,
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
