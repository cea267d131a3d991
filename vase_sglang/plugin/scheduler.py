"""The eviction adapter of one scheduler process: the request table, the round engine,
and what the hooks in ``patches/`` ask of them.

``VaseScheduler`` holds a ``requests.RequestTable`` (one record per request, the only
request state in the process) and a ``engine.RoundEngine`` (the KV views, query ring,
score state and position offsets, and one batched round over them: tensors only). The
SGLang attributes it reads and writes are declared in ``contract.py`` (checked against
the pinned SGLang).

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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from ..config import PolicyConfig
from ..telemetry import Loop
from . import metrics
from .engine import RoundEngine
from .options import carried_options, eviction_seed
from .planning import MAX_ROUND_BATCH, captures_queries, keeps_state, warmup_configs
from .report import PolicyChoice, RequestCounters, Totals
from .requests import RequestRecord, RequestTable
from .settings import ServerSettings
from .telemetry import FleetTelemetry, RequestTelemetry, TelemetryReport

if TYPE_CHECKING:  # the SGLang attributes read here, checked against the pinned SGLang
    from . import contract as sg

logger = logging.getLogger("vase_sglang.plugin.scheduler")


class DueRound(NamedTuple):
    """A region that is full at this decode step: the request's place in the batch, the
    request, its record and the region's slots."""

    position: int  # in the batch
    req: sg.Req
    record: RequestRecord
    slots: torch.Tensor


class VaseScheduler:
    """Admission, rounds, positions, queries and the tree cap for one scheduler process."""

    def __init__(self, settings: ServerSettings, engine: RoundEngine, req_to_token_pool: sg.ReqToTokenPool,
                 count_totals: bool = True):
        self.settings = settings
        self.engine = engine
        self.req_to_token_pool = req_to_token_pool
        self.requests = RequestTable()
        self.fleet = FleetTelemetry()
        self.totals = Totals()
        self._token_chars: dict[int, int] = {}  # decoded length of each token: the loop detectors share it
        # On a TP rank: whether this rank reports to the Prometheus counters (one rank per request).
        self.count_totals = count_totals
        self._admitting_region: int | None = None

    @property
    def measures(self) -> bool:
        """Rounds measure what they evict: telemetry on and a query ring to read."""
        return self.settings.telemetry.enabled and self.engine.query_ring is not None

    # ---- the request table ------------------------------------------------------------
    def record(self, req: sg.Req) -> RequestRecord:
        """The request's record, made from its carried options on first sight."""
        return self.requests.record(req, self._new_record)

    def _new_record(self, req: sg.Req) -> RequestRecord:
        params = req.sampling_params
        options = carried_options(self.settings, params.custom_params, req.rid)
        seed = eviction_seed(options, self.settings, req.rid, params.sampling_seed)
        return RequestRecord(req.rid, options, seed, self._request_telemetry(req, options.stop_on_loop))

    def _request_telemetry(self, req: sg.Req, stop_on_loop: bool | None) -> RequestTelemetry:
        options = self.settings.telemetry
        stop = options.stop_on_loop if stop_on_loop is None else stop_on_loop
        tokenizer = req.tokenizer
        text_of = (lambda ids: tokenizer.decode(list(ids))) if tokenizer is not None else None
        return RequestTelemetry(text_of, stop_on_loop=stop, detect_loops=options.enabled or stop,
                                token_chars=self._token_chars if tokenizer is not None else None)

    # ---- admission --------------------------------------------------------------------
    @contextmanager
    def admitting(self, req: sg.Req) -> Iterator[int | None]:
        """While SGLang sizes ``req``'s max_new_tokens: its region size, None if it does not evict."""
        cfg = self.record(req).cfg
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
        rec = self.requests.started(req)
        if rec is None or not rec.cfg.evicts:
            return None
        # The region never holds more than B + R: what is left to grow is bounded by that.
        remaining = req.sampling_params.max_new_tokens - len(req.output_ids)
        room = rec.cfg.region_size - (req.kv.kv_committed_len - rec.region_start)
        return max(0, min(remaining, room))

    # ---- decode step: due -> run -> shrink --------------------------------------------
    def before_decode_alloc(self, batch: sg.ScheduleBatch) -> None:
        """Start regions of newly prefilled requests; run a round for each full region,
        free its R tail slots and shorten its row (committed == allocated == seq_len)."""
        due = self.due_rounds(batch)
        if due:
            self.run_rounds(due)
            self.shrink_rows(batch, due)

    def after_decode_alloc(self, batch: sg.ScheduleBatch) -> None:
        records = []
        for req in batch.reqs:
            rec = self.requests.started(req)
            if rec is not None:
                rec.region_len = req.kv.kv_committed_len - rec.region_start
                records.append(rec)
        if self.count_totals:
            metrics.observe_step([(rec.cfg.region_size, rec.region_len) for rec in records if rec.cfg.evicts])

    def due_rounds(self, batch: sg.ScheduleBatch) -> list[DueRound]:
        """The batch's full regions, after starting the region of each request that was
        just (re-)prefilled."""
        req_to_token = self.req_to_token_pool.req_to_token
        due = []
        for i, req in enumerate(batch.reqs):
            rec = self.begin_region(req)
            end = int(req.kv.kv_committed_len)
            if rec.round_due(end):
                due.append(DueRound(i, req, rec, req_to_token[rec.row, rec.region_start : end]))
        return due

    def begin_region(self, req: sg.Req) -> RequestRecord:
        """The request's record for its current row; a new region after a (re-)prefill, with
        physical positions again (the re-prefill recomputed every token at its own position)."""
        rec = self.record(req)
        row = int(req.kv.req_pool_idx)
        generation = int(self.req_to_token_pool.req_generation[row])
        if not rec.holds(row, generation):
            rec.start_region(req, row, generation)
            self.engine.reset_row(row)
        return rec

    def run_rounds(self, due: Sequence[DueRound]) -> None:
        """One round for each due region; afterwards each region's first B slots hold the
        kept tokens, oldest first."""
        t0 = time.perf_counter()
        groups: dict[tuple[PolicyConfig, int], list[DueRound]] = {}
        for item in due:  # one launch per config and region length
            groups.setdefault((item.record.cfg, item.slots.shape[0]), []).append(item)
        for (cfg, _), members in groups.items():
            for i in range(0, len(members), MAX_ROUND_BATCH):
                self._round(cfg, members[i : i + MAX_ROUND_BATCH])
        if self.engine.device.type == "cuda":
            torch.cuda.current_stream().synchronize()  # honest round latency; rounds are rare
        seconds = time.perf_counter() - t0
        tokens = sum(item.slots.shape[0] - item.record.cfg.budget for item in due)
        self.totals.rounds += len(due)
        self.totals.tokens_evicted += tokens
        self.totals.round_latency.observe(seconds)
        if self.count_totals:
            metrics.observe_rounds(len(due), tokens, seconds)

    def _round(self, cfg: PolicyConfig, group: Sequence[DueRound]) -> None:
        """One batched round of regions that share ``cfg`` (at most MAX_ROUND_BATCH)."""
        if _capturing():
            raise RuntimeError("vase-sglang: an eviction round ran inside CUDA-graph capture; rounds move KV "
                               "data and must run eagerly, before the step's allocation")
        engine = self.engine
        policy = engine.policy(cfg)
        records = [item.record for item in group]
        slots = torch.stack([item.slots.long() for item in group])
        rows = torch.tensor([rec.row for rec in records], device=engine.device)
        measure = self.measures
        if (policy.needs_queries or measure) and engine.query_ring is not None:
            self._check_queries(rows)
        # Ring position of each request's newest query: its last column modulo R.
        recent = self.settings.config.recent
        newest = torch.tensor([(item.record.region_start + item.slots.shape[0] - 1) % recent for item in group],
                              device=engine.device)
        selection = engine.select_and_compact(policy, slots, rows, [rec.seed for rec in records],
                                              [rec.rounds for rec in records], measure, newest)
        removed = slots.shape[1] - cfg.budget  # R, or G + R - B after a re-prefill
        for rec in records:
            rec.after_round(removed)
            engine.position_offset_by_row[rec.row] += removed
        if selection.evicted_attention is not None:
            t0 = time.perf_counter()
            # Mean over layers and KV heads: one host copy per batched round (rounds sync anyway).
            signals = selection.evicted_attention.mean(dim=(1, 2)).tolist()
            for item, signal in zip(group, signals, strict=True):
                item.record.telemetry.on_round(signal, len(item.req.output_ids))
            if self.count_totals:
                metrics.observe_round_signals(cfg, signals)
            self.totals.telemetry_seconds += selection.measure_seconds + time.perf_counter() - t0

    def _check_queries(self, rows: torch.Tensor) -> None:
        empty = self.engine.rows_without_queries(rows)
        if empty:
            if not self.totals.rounds_without_queries:
                logger.warning("vase-sglang: %d request(s) reached an eviction round with an empty query ring: "
                               "the attention backend's decode path records no queries", empty)
            self.totals.rounds_without_queries += empty

    def shrink_rows(self, batch: sg.ScheduleBatch, due: Sequence[DueRound]) -> None:
        """Free each round's tail slots and shorten its row: the bookkeeping of SGLang's
        ``ScheduleBatch.prepare_for_decode`` and ``alloc_for_decode_default`` (manifest kinds
        ``mirror`` and ``call``, sources pinned: re-read both when test_manifest reports a
        changed source), for shorter rows."""
        req_to_token = self.req_to_token_pool.req_to_token
        seq_lens = batch.seq_lens.clone()
        seq_lens_cpu = batch.seq_lens_cpu.clone()
        orig = batch.orig_seq_lens.clone() if batch.orig_seq_lens is not None else None
        for i, req, rec, _ in due:
            new_len = rec.region_start + rec.cfg.budget
            tail = req_to_token[rec.row, new_len : int(req.kv.kv_committed_len)].to(torch.int64)
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
        configs = warmup_configs(self.settings.config, self.settings.auto, self.measures)
        self.engine.compile_variants(configs, self.measures)
        return len(configs)

    # ---- radix tree -------------------------------------------------------------------
    def checkpoint_limit(self, req: sg.Req, up_to: int) -> int | None:
        """The tree may take columns up to this (None: as asked). The columns of a compacted
        region hold another token's KV than their position's, so the tree stops at the
        region's start. A retracted request's re-prefilled history is exact, but in the tree
        it would be a protected prefix that no round can evict: the tree takes its prompt only."""
        if req.retraction_count and self.record(req).cfg.evicts:
            prompt = len(req.origin_input_ids)
            if up_to > prompt:
                return prompt
        rec = self.requests.started(req)
        if rec is not None and rec.compacted and up_to > rec.region_start:
            return rec.region_start
        return None

    # ---- reporting --------------------------------------------------------------------
    def counters(self, req: sg.Req) -> RequestCounters:
        """The request's eviction so far, for its meta_info."""
        rec = self.requests.started(req)
        return rec.counters() if rec is not None else RequestCounters.before_first_decode(req)

    def after_tokens(self, req: sg.Req, new_tokens: int) -> Loop | None:
        """The request's new output tokens (after every step, prefill or decode): the loop
        to stop it at, if it just looped and stops on loops (None otherwise). A request
        that finished here may have just been re-prefilled: that is counted too."""
        rec = self.record(req)
        if req.finished() and req.kv.req_pool_idx is not None:
            row = int(req.kv.req_pool_idx)
            rec.note_final_reprefill(req, row, int(self.req_to_token_pool.req_generation[row]))
        tel = rec.telemetry
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
        rec = self.record(req)
        report = rec.telemetry.report(len(req.output_ids), rec.cfg, self.settings.telemetry.estimator)
        if req.finished() and not rec.telemetry.observed and self.count_totals:
            rec.telemetry.observed = True
            self.fleet.observe(rec.cfg, report, rec.telemetry.stopped)
            metrics.observe_request(rec.cfg, report, rec.telemetry.stopped)
        self.totals.telemetry_seconds += time.perf_counter() - t0
        return report

    def policy_choice(self, req: sg.Req) -> PolicyChoice:
        """The policy the request runs and why, for its meta_info."""
        options = self.record(req).options
        return PolicyChoice(options.cfg.policy, options.reason)

    def summary(self) -> dict[str, Any]:
        """Live totals for ``GET /kv_policy``."""
        telemetry = self.settings.telemetry
        return {
            **self.totals.summary(),
            **self.engine.buffer_bytes(),
            "policy_cache_entries": self.engine.policy_cache_size,
            # False on the other ranks of an attention-TP group: they run the same rounds.
            "counted_in_totals": self.count_totals,
            "tracked_requests": len(self.requests),
            "telemetry": {"enabled": telemetry.enabled, "measures_rounds": self.measures,
                          # The telemetry's own host work, so a benchmark can state its share of the wall time.
                          "seconds_total": round(self.totals.telemetry_seconds, 4),
                          "stop_on_loop": telemetry.stop_on_loop,
                          "kl_estimator": telemetry.estimator.source if telemetry.estimator else None,
                          "by_config": self.fleet.summary()},
        }


def build_engine(settings: ServerSettings, k_buf: torch.Tensor, v_buf: torch.Tensor, n_rows: int, q_heads: int,
                 backend: str | None = None, head_offset: int = 0,
                 total_kv_heads: int | None = None) -> RoundEngine:
    """The round engine a server with ``settings`` needs: a query ring when a reachable
    policy or the telemetry reads queries, a score state when a reachable policy is stateful."""
    cfg, auto, telemetry = settings.config, settings.auto, settings.telemetry.enabled
    return RoundEngine(cfg, k_buf, v_buf, n_rows, q_heads, captures_queries(cfg, auto, telemetry),
                       keep_state=keeps_state(cfg, auto, telemetry), backend=backend, head_offset=head_offset,
                       total_kv_heads=total_kv_heads)


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
