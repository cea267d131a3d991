"""KV eviction policies: one small class per method, each with one ``score`` function.

A policy looks at a batch of full regions (``budget + recent`` positions per request,
layer and KV head) and returns, per (request, layer, KV head), the ``budget`` positions
to keep, in the order they are to be stored:

    sinks (positions 0..sinks-1)
    -> reserved slots (VaSE only: top ``n_large`` by the value statistic, descending)
    -> the fill (sampled in draw order, or top-k by descending score)
    -> the ``recent`` newest positions, in slot order.

A stateful policy (H2O, G-KV) also returns, per candidate, the score it carries to the
next round; the engine moves those scores with the kept tokens (``ops.carry_scores``) and
hands them back as ``Regions.state`` at the next round. Each class's flags (reads queries,
draws noise, keeps state) come from its entry in ``vase_sglang.registry``.

The order matters: the next round's smoothing sees neighbours in storage order
(docs/algorithm.md, "The round"). Nothing here knows about SGLang; the math lives in
``vase_sglang.kernels`` (Triton, with a torch reference beside each kernel).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from .config import PolicyConfig
from .kernels import ops
from .registry import spec

_MASK64 = (1 << 64) - 1


def mix_seed(*parts: int) -> int:
    """Deterministic 63-bit seed from integers (splitmix64 finaliser over each part)."""
    h = 0x9E3779B97F4A7C15
    for p in parts:
        h = (h ^ (int(p) & _MASK64)) & _MASK64
        h = (h + 0x9E3779B97F4A7C15) & _MASK64
        h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _MASK64
        h ^= h >> 31
    return h & ((1 << 63) - 1)


# Stream tags keep the noise of different uses independent for the same seed.
_NOISE_STREAM = 1
_SKETCH_STREAM = 2


@dataclass
class Regions:
    """A batch of full regions, addressed the way SGLang stores KV.

    ``k_buf``/``v_buf``: ``[n_layers, n_slots, kv_heads, head_dim]`` token-indexed buffers.
    ``slots``: ``[n_req, budget + recent]`` slot of each region position, oldest first.
    ``queries``: ``[n_req, n_layers, q_heads, recent, head_dim]`` post-RoPE queries of the
    recent window (only policies with ``needs_queries``); with ``query_rows`` (``[n_req]``),
    ``queries`` is a whole ring and request i's queries are its row ``query_rows[i]``, read
    in place by the kernels instead of copied.
    ``seeds``/``rounds``: per request, the policy seed and the index of this round.
    ``newest``: ``[n_req]`` index along the R axis of each request's newest query (the
    server's ring is circular); None: the last one.
    ``state``: ``[n_req, n_layers, H, C]`` fp32 score each candidate carried from the last
    round (stateful policies; zeros for positions no round has scored yet); None: no round
    has run in this region.
    """

    k_buf: torch.Tensor
    v_buf: torch.Tensor
    slots: torch.Tensor
    seeds: Sequence[int]
    rounds: Sequence[int]
    queries: torch.Tensor | None = None
    query_rows: torch.Tensor | None = None
    # Global index of the first local KV head and the model's KV head count, on a
    # tensor-parallel rank that holds a slice of the heads (None: all heads are local).
    head_offset: int = 0
    total_heads: int | None = None
    newest: torch.Tensor | None = None
    state: torch.Tensor | None = None

    @property
    def n_req(self) -> int:
        return self.slots.shape[0]

    @property
    def n_layers(self) -> int:
        return self.k_buf.shape[0]

    @property
    def n_heads(self) -> int:
        return self.k_buf.shape[2]

    @property
    def device(self) -> torch.device:
        return self.k_buf.device

    def candidates(self, recent: int) -> torch.Tensor:
        return self.slots[:, : self.n_candidates(recent)]

    def newest_queries(self) -> torch.Tensor:
        """``[n_req, n_layers, Hq, 1, D]``: each request's newest window query (a copy)."""
        if self.queries is None:
            raise ValueError("no window queries")
        rows = (self.query_rows.long() if self.query_rows is not None
                else torch.arange(self.n_req, device=self.queries.device))
        newest = (self.newest.long().to(rows.device) if self.newest is not None
                  else torch.full_like(rows, self.queries.shape[3] - 1))
        return self.queries[rows, :, :, newest].unsqueeze(3)  # advanced indices first: [n_req, L, Hq, D]

    def n_candidates(self, recent: int) -> int:
        """Positions a round chooses from: all but the ``recent`` newest. A region holds
        budget + recent positions, or more once, after a re-prefill (see VaseScheduler)."""
        return self.slots.shape[1] - recent

    @classmethod
    def from_dense(
        cls,
        keys: torch.Tensor,
        values: torch.Tensor,
        queries: torch.Tensor | None = None,
        seeds: Sequence[int] | None = None,
        rounds: Sequence[int] | None = None,
        shuffle_slots: torch.Generator | None = None,
    ) -> Regions:
        """Pack dense ``[n_req, n_layers, H, L, D]`` K/V into a token-indexed buffer.

        Slot 0 stays unused (SGLang's padding slot). With ``shuffle_slots``, regions get
        scattered, non-contiguous slots, like rows of ``req_to_token``.
        """
        n_req, n_layers, n_heads, length, d = keys.shape
        n_slots = n_req * length + 1
        order = (
            torch.randperm(n_req * length, generator=shuffle_slots)
            if shuffle_slots is not None
            else torch.arange(n_req * length)
        )
        slots = (order + 1).reshape(n_req, length).to(keys.device)
        k_buf = torch.zeros((n_layers, n_slots, n_heads, d), dtype=keys.dtype, device=keys.device)
        v_buf = torch.zeros_like(k_buf)
        k_buf[:, slots] = keys.permute(1, 0, 3, 2, 4)
        v_buf[:, slots] = values.permute(1, 0, 3, 2, 4)
        return cls(
            k_buf=k_buf,
            v_buf=v_buf,
            slots=slots,
            queries=queries,
            seeds=list(seeds) if seeds is not None else [0] * n_req,
            rounds=list(rounds) if rounds is not None else [0] * n_req,
        )


def carried_scores(state: torch.Tensor, rows: torch.Tensor, n_cand: int) -> torch.Tensor:
    """``[n_req, layers, H, n_cand]``: the scores the candidates of rows ``rows`` of a score
    state ``[n_rows, layers, H, W]`` carry into a round (``Regions.state``). After a
    re-prefill a region may hold more candidates than the state has places; those were
    reset to 0 when the region restarted, so they read 0."""
    width = min(n_cand, state.shape[-1])
    out = state.new_zeros((rows.shape[0], *state.shape[1:3], n_cand))
    out[..., :width] = state[rows.long(), :, :, :width]
    return out


@dataclass
class Scores:
    """What a policy's ``score`` returns: ``[n_req, n_layers, H, C]`` float32 tensors.

    ``attention``: the window attention the score was built from (``ops.window_attention_probs``
    at temperature 1), when it was; the telemetry reuses it instead of computing it again.
    """

    fill: torch.Tensor
    reserve: torch.Tensor | None = None
    attention: torch.Tensor | None = None
    # Stateful policies: the score each candidate carries to the next round if it is kept.
    carry: torch.Tensor | None = None


@dataclass
class Selection:
    """One round's decision: ``keep`` ``[n_req, n_layers, H, budget]`` region positions in
    storage order, and, when measured, ``evicted_attention`` ``[n_req, n_layers, H]``: the
    share of the window queries' attention over the candidates that falls on the candidates
    not kept (docs/telemetry.md)."""

    keep: torch.Tensor
    evicted_attention: torch.Tensor | None = None
    # Host seconds spent measuring (the telemetry's own cost; on a GPU the launches only).
    measure_seconds: float = 0.0
    # Stateful policies: ``[n_req, n_layers, H, C]`` score each candidate carries to the
    # next round; the engine moves it with ``keep`` (``ops.carry_scores``).
    carry: torch.Tensor | None = None


@dataclass(frozen=True)
class RoundShape:
    """What sizes a batched round's temporaries: ``n_req`` regions of one config."""

    n_req: int
    n_layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    itemsize: int  # bytes per KV element
    total_kv_heads: int | None = None  # the model's, on a TP rank holding a slice

    def score_map_bytes(self, cfg: PolicyConfig) -> int:
        """One fp32 value per (request, layer, KV head, candidate)."""
        return 4 * self.n_req * self.n_layers * self.kv_heads * cfg.budget


class Policy:
    """Base class: subclasses set ``name`` and implement ``score``; their flags come from
    the registry entry of that name."""

    name: ClassVar[str]
    needs_queries: ClassVar[bool] = False
    draws_noise: ClassVar[bool] = False
    stateful: ClassVar[bool] = False
    evicts: ClassVar[bool] = True
    # fp32 [n_req, layers, KV heads, C] maps alive at once while scoring (the Triton path).
    score_maps: ClassVar[int] = 0

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        entry = spec(cls.name)
        cls.needs_queries, cls.draws_noise = entry.reads_queries, entry.draws_noise
        cls.stateful, cls.evicts = entry.stateful, entry.evicts

    def __init__(self, config: PolicyConfig, backend: str | None = None, max_select_block: int | None = None):
        """``max_select_block``: the widest selection block the server compiled at start-up
        (``ops.select``); a wider round selects with the torch twin instead of compiling."""
        self.config = config
        self.backend = backend
        self.max_select_block = max_select_block

    # -- to implement ---------------------------------------------------------------
    def score(self, regions: Regions) -> Scores:
        raise NotImplementedError

    def workspace_bytes(self, shape: RoundShape, measure: bool = False) -> int:
        """Peak bytes of device temporaries of one round over ``shape.n_req`` regions, on
        the Triton path: scores, noise, the selection and the compaction scratch, and with
        ``measure`` the telemetry's window attention. The server reserves this before it
        sizes the KV pool."""
        from .kernels import compact, window_attention

        cfg = self.config
        if not self.evicts:
            return 0
        one_map = shape.score_map_bytes(cfg)
        total = 8 * shape.n_req * (cfg.region_size + 1)  # slots and ring rows, int64
        total += 4 * one_map  # kept positions and the recent window appended: int64 twice
        total += compact.workspace_bytes(shape.n_req, shape.n_layers, shape.kv_heads, cfg.budget, shape.head_dim,
                                         shape.itemsize)
        total += self.score_maps * one_map
        if self.draws_noise:  # drawn per global head, sliced, then stacked
            total += one_map * (1 + (shape.total_kv_heads or shape.kv_heads) // shape.kv_heads)
        if self.needs_queries or measure:
            total += window_attention.workspace_bytes(shape.n_req, shape.n_layers, shape.q_heads, shape.kv_heads,
                                                      cfg.recent, cfg.budget)
        if measure:
            total += 4 * shape.n_req * shape.n_layers * shape.kv_heads  # the evicted mass per head
        if self.stateful:  # the carried state read in, and the score carried out
            total += 2 * 4 * shape.n_req * shape.n_layers * shape.kv_heads * cfg.region_size
        return total

    # -- shared machinery -----------------------------------------------------------
    def _generator(self, device: torch.device, *parts: int) -> torch.Generator:
        return torch.Generator(device=device).manual_seed(mix_seed(*parts))

    def noise(self, regions: Regions, shape: torch.Size) -> torch.Tensor:
        """Exp(1) noise, independent per (request, round, layer, KV head, candidate).

        Drawn for every KV head of the model and sliced to the local ones, so that a head's
        noise, and so the eviction decision, is the same whatever the TP size.
        """
        n_layers, heads, n_cand = shape[1:]
        total = regions.total_heads or heads
        lo = regions.head_offset
        per_req = []
        for seed, rnd in zip(regions.seeds, regions.rounds, strict=True):
            g = self._generator(regions.device, seed, rnd, _NOISE_STREAM)
            e = torch.empty((n_layers, total, n_cand), dtype=torch.float32, device=regions.device)
            e.exponential_(generator=g)
            per_req.append(e[:, lo : lo + heads].clamp_min(torch.finfo(torch.float32).tiny))
        return torch.stack(per_req)

    def _check(self, regions: Regions, measure: bool = False) -> None:
        cfg = self.config
        if regions.slots.shape[1] < cfg.region_size:
            raise ValueError(
                f"{self.name}: region has {regions.slots.shape[1]} positions, "
                f"expected at least budget + recent = {cfg.region_size}"
            )
        if self.needs_queries or measure:
            q = regions.queries
            if q is None:
                raise ValueError(f"{self.name} needs the window queries" + (" to measure" if measure else ""))
            rows = regions.query_rows
            n_q = rows.shape[0] if rows is not None else q.shape[0]
            if n_q != regions.n_req or q.shape[1] != regions.n_layers or q.shape[3] != cfg.recent:
                raise ValueError(f"{self.name}: queries must be [n_req, n_layers, Hq, recent={cfg.recent}, D], "
                                 f"got {tuple(q.shape)}" + (f" with {n_q} query rows" if rows is not None else ""))

    def select(self, regions: Regions) -> torch.Tensor:
        """``[n_req, n_layers, H, budget]`` region positions to keep, in storage order."""
        return self.selection(regions).keep

    def selection(self, regions: Regions, measure: bool = False) -> Selection:
        """What to keep, and with ``measure`` what the round takes away (needs the window
        queries, whatever the policy scores with)."""
        self._check(regions, measure)
        keep, scores = self._keep(regions)
        carry = scores.carry if scores is not None else None
        if not measure:
            return Selection(keep, carry=carry)
        t0 = time.perf_counter()
        attention = scores.attention if scores is not None else None
        if attention is None:
            attention = self.window_probs(regions, temperature=1.0)
        evicted = ops.evicted_mass(attention, keep, backend=self.backend)
        return Selection(keep, evicted, time.perf_counter() - t0, carry=carry)

    def _keep(self, regions: Regions) -> tuple[torch.Tensor, Scores | None]:
        """The kept positions, and the scores they were chosen by (None for index-only policies)."""
        cfg = self.config
        scores = self.score(regions)
        n_large = cfg.large if scores.reserve is not None else 0
        n_fill = cfg.keep_candidates - cfg.sinks - n_large
        noise = self.noise(regions, scores.fill.shape) if self.draws_noise else None
        counts = None
        if n_large and scores.reserve is not None and cfg.outlier_factor is not None:  # only the outliers
            counts = ops.outlier_count(scores.reserve, cfg.sinks, cfg.outlier_factor, n_large, backend=self.backend)
        kept = ops.select(scores.fill, cfg.sinks, n_large, n_fill, scores.reserve, noise, counts,
                          backend=self.backend, max_block=self.max_select_block)
        return torch.cat([kept, self._recent(regions)], dim=-1), scores

    def _recent(self, regions: Regions) -> torch.Tensor:
        c = regions.n_candidates(self.config.recent)
        recent = torch.arange(c, c + self.config.recent, device=regions.device)
        return recent.expand(regions.n_req, regions.n_layers, regions.n_heads, -1)

    def window_probs(self, regions: Regions, temperature: float) -> torch.Tensor:
        """The window queries' attention over the candidates, ``[n_req, n_layers, H, C]``."""
        if regions.queries is None:
            raise ValueError(f"{self.name} needs the window queries")
        return ops.window_attention_probs(regions.queries, regions.k_buf, regions.candidates(self.config.recent),
                                          temperature, query_rows=regions.query_rows, backend=self.backend)

    def window_attention(self, regions: Regions) -> tuple[torch.Tensor, torch.Tensor | None]:
        """SnapKV's smoothed score, and the window attention at temperature 1 when the score
        was built from it (the telemetry's input; None at another temperature)."""
        cfg = self.config
        probs = self.window_probs(regions, cfg.temperature)
        score = ops.smooth(probs, cfg.smoothing_kernel, backend=self.backend)
        return score, probs if cfg.temperature == 1.0 else None


class VaSEAttnV(Policy):
    """VaSE-AttnV: reserve top-``n_large`` by value range, sample the rest by window attention."""

    name = "vase"
    score_maps = 1  # the value statistic (window attention is counted by needs_queries)

    def workspace_bytes(self, shape: RoundShape, measure: bool = False) -> int:
        cfg = self.config
        # With outlier_factor, the median's sorted copy of the statistic: fp32 values and int64 indices.
        median = 3 * shape.score_map_bytes(cfg) if cfg.outlier_factor is not None and cfg.large else 0
        return super().workspace_bytes(shape, measure) + median

    def score(self, regions: Regions) -> Scores:
        reserve = ops.value_stat(regions.v_buf, regions.candidates(self.config.recent), self.config.value_stat,
                                 backend=self.backend)
        score, attention = self.window_attention(regions)
        return Scores(fill=score, reserve=reserve, attention=attention)


class SnapKV(Policy):
    """SnapKV at decode time: deterministic top-k of the smoothed window attention."""

    name = "snapkv"

    def score(self, regions: Regions) -> Scores:
        score, attention = self.window_attention(regions)
        return Scores(fill=score, attention=attention)


class RKV(Policy):
    """R-KV: ``lambda * attention - (1 - lambda) * key redundancy``, deterministic top-k."""

    name = "rkv"
    # Redundancy runs on torch: the gathered keys, widened to fp32 and normalised in place
    # (head_dim maps, plus the pool-dtype gather while it is widened unless the pool is
    # fp32; counted in workspace_bytes), then three score maps.
    score_maps = 3

    def workspace_bytes(self, shape: RoundShape, measure: bool = False) -> int:
        gathered = 0 if shape.itemsize == 4 else shape.itemsize  # bytes per element beside the fp32 copy
        keys = shape.head_dim * shape.score_map_bytes(self.config) * (4 + gathered) // 4
        return super().workspace_bytes(shape, measure) + keys

    def score(self, regions: Regions) -> Scores:
        lam = self.config.rkv_lambda
        red = ops.key_redundancy(regions.k_buf, regions.candidates(self.config.recent), backend=self.backend)
        score, attention = self.window_attention(regions)
        return Scores(fill=lam * score - (1.0 - lam) * red, attention=attention)


class CurDKV(Policy):
    """CurDKV: CUR leverage ``||kG||^2 ||vG||^2`` with a sketch fixed per request and layer."""

    name = "curdkv"
    resample_sketch: ClassVar[bool] = False
    score_maps = 2  # the leverage and its normalised copy

    def workspace_bytes(self, shape: RoundShape, measure: bool = False) -> int:
        sketch = 4 * shape.n_req * shape.n_layers * shape.head_dim * self.config.sketch_rank
        return super().workspace_bytes(shape, measure) + sketch

    def sketch(self, regions: Regions) -> torch.Tensor:
        d, rank = regions.k_buf.shape[-1], self.config.sketch_rank
        out = []
        for seed, rnd in zip(regions.seeds, regions.rounds, strict=True):
            parts = (seed, rnd, _SKETCH_STREAM) if self.resample_sketch else (seed, _SKETCH_STREAM)
            g = self._generator(regions.device, *parts)
            out.append(torch.randn((regions.n_layers, d, rank), generator=g, device=regions.device) / math.sqrt(rank))
        return torch.stack(out)

    def score(self, regions: Regions) -> Scores:
        cand = regions.candidates(self.config.recent)
        return Scores(fill=ops.cur_score(regions.k_buf, regions.v_buf, cand, self.sketch(regions),
                                         backend=self.backend))


class VaSEDKV(CurDKV):
    """VaSE-DKV: CurDKV with the Gaussian sketch resampled at every round."""

    name = "vase-dkv"
    resample_sketch = True


class RandomEviction(Policy):
    """Uniform sampling without replacement among the non-sink candidates."""

    name = "random"
    score_maps = 1

    def score(self, regions: Regions) -> Scores:
        c = regions.n_candidates(self.config.recent)
        return Scores(fill=torch.ones((regions.n_req, regions.n_layers, regions.n_heads, c), device=regions.device))


class StreamingLLM(Policy):
    """Sinks plus the newest tokens: keeps the last ``budget - sinks`` positions, in slot order."""

    name = "streamingllm"

    def _keep(self, regions: Regions) -> tuple[torch.Tensor, None]:
        cfg = self.config
        length = regions.slots.shape[1]
        keep = torch.cat([
            torch.arange(cfg.sinks, device=regions.device),
            torch.arange(length - (cfg.budget - cfg.sinks), length, device=regions.device),
        ])
        return keep.expand(regions.n_req, regions.n_layers, regions.n_heads, -1), None


class FullCache(Policy):
    """``none``: the full cache; never evicts."""

    name = "none"

    def selection(self, regions: Regions, measure: bool = False) -> Selection:
        raise RuntimeError("policy 'none' keeps the full cache and never selects")


class H2O(Policy):
    """H2O: heavy hitters by window attention accumulated since the token was written.

    Rounds run every R tokens and each reads the last R queries, so every decoded query's
    attention over the candidates is added exactly once (a token's first R queries, while
    it is in the recent window, are not: it is kept then anyway). Top-k of the sum, sinks
    and the recent window kept as usual."""

    name = "h2o"
    score_maps = 1  # the accumulated score (the window attention is counted by needs_queries)

    def score(self, regions: Regions) -> Scores:
        probs = self.window_probs(regions, temperature=1.0)
        total = probs if regions.state is None else probs + regions.state
        return Scores(fill=total, attention=probs, carry=total)


class GKV(Policy):
    """G-KV (arXiv 2512.00504): a global score, ``max(decay * carried, local)``, where the
    local score is the round's window attention divided by its largest value per (layer,
    KV head); the fill is ``lambda * global - (1 - lambda) * redundancy / max``, top-k.

    As the paper's code (microsoft/G-KV, ``smooth_method="max"``, alpha 0.8, mix_lambda
    0.5), except: the query heads of a GQA group are averaged (G-KV takes their max), the
    redundancy is R-KV's softmax of mean cosine similarity without G-KV's 0.5 threshold,
    and the sinks are kept (G-KV keeps none)."""

    name = "gkv"
    score_maps = 4  # local, global, redundancy, fill

    def workspace_bytes(self, shape: RoundShape, measure: bool = False) -> int:
        gathered = 0 if shape.itemsize == 4 else shape.itemsize  # as RKV: the keys widened to fp32
        keys = shape.head_dim * shape.score_map_bytes(self.config) * (4 + gathered) // 4
        return super().workspace_bytes(shape, measure) + keys

    def score(self, regions: Regions) -> Scores:
        cfg = self.config
        probs = self.window_probs(regions, temperature=1.0)
        local = probs / probs.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
        glob = local if regions.state is None else torch.maximum(regions.state * cfg.gkv_decay, local)
        red = ops.key_redundancy(regions.k_buf, regions.candidates(cfg.recent), backend=self.backend)
        red = red / red.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
        return Scores(fill=cfg.rkv_lambda * glob - (1.0 - cfg.rkv_lambda) * red, attention=probs, carry=glob)


class TOVA(Policy):
    """TOVA: top-k of the newest query's attention over the candidates, averaged over the
    query heads of each GQA group (TOVA evicts one token per step by the same score; here a
    round evicts R at once)."""

    name = "tova"
    score_maps = 1

    def workspace_bytes(self, shape: RoundShape, measure: bool = False) -> int:
        newest = shape.n_req * shape.n_layers * shape.q_heads * shape.head_dim * shape.itemsize
        return super().workspace_bytes(shape, measure) + newest

    def score(self, regions: Regions) -> Scores:
        probs = ops.window_attention_probs(regions.newest_queries(), regions.k_buf,
                                           regions.candidates(self.config.recent), 1.0, backend=self.backend)
        return Scores(fill=probs)


POLICIES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (FullCache, VaSEAttnV, VaSEDKV, SnapKV, RKV, CurDKV, StreamingLLM, RandomEviction, H2O, GKV, TOVA)
}


class EvictLargeValues(Policy):
    """Pilot control (paper §5.1, ``evict_large_range``): keep the smallest value ranges.

    Deterministic top-k of ``-statistic``, sinks and the recent window kept as usual. Not a
    serving policy: it exists to show what losing the large-value tokens costs.
    """

    name = "evict-large"
    score_maps = 2

    def score(self, regions: Regions) -> Scores:
        stat = ops.value_stat(regions.v_buf, regions.candidates(self.config.recent), self.config.value_stat,
                              backend=self.backend)
        return Scores(fill=-stat)


# Ablation-only policies, used by the fidelity sweep; the server accepts only POLICIES.
PILOT_POLICIES: dict[str, type[Policy]] = {EvictLargeValues.name: EvictLargeValues}


def make_policy(config: PolicyConfig, backend: str | None = None, max_select_block: int | None = None) -> Policy:
    return POLICIES[config.policy](config, backend=backend, max_select_block=max_select_block)
