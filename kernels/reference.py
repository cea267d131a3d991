"""Pure-torch reference of every kernel: the readable specification.

Layout shared by all ops (the layout of SGLang's ``MHATokenToKVPool``):

* ``k_buf``, ``v_buf``: ``[n_layers, n_slots, kv_heads, head_dim]`` token-indexed buffers
  (any strides; a stacked view over per-layer buffers is fine).
* ``slots``: ``[n_req, L]`` integer slot index of each position of a request's region,
  like a row of SGLang's ``req_to_token``. The first ``C`` positions are the candidates.
* Scores are returned as float32 ``[n_req, n_layers, kv_heads, C]``.

The Triton kernels in this package must reproduce these functions: exactly for
indices and gathers, within a stated tolerance for scores.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def gather_region(buf: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``[n_layers, S, H, D]`` x ``[n_req, C]`` -> ``[n_req, n_layers, H, C, D]``."""
    rows = buf[:, slots.long()]  # [n_layers, n_req, C, H, D]
    return rows.permute(1, 0, 3, 2, 4)


def value_stat(v_buf: torch.Tensor, slots: torch.Tensor, stat: str) -> torch.Tensor:
    """Per-slot magnitude of each candidate value vector, over the head_dim channels."""
    v = gather_region(v_buf, slots).float()
    if stat == "range":
        return v.amax(-1) - v.amin(-1)
    if stat == "l2":
        return v.norm(dim=-1)
    if stat == "variance":
        # Population variance: the statistic is a magnitude, not an estimator.
        return v.var(dim=-1, unbiased=False)
    if stat == "absmax":
        return v.abs().amax(-1)
    raise ValueError(f"unknown value statistic {stat!r}")


def window_attention_probs(
    queries: torch.Tensor,
    k_buf: torch.Tensor,
    slots: torch.Tensor,
    temperature: float = 1.0,
    query_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """The attention of the last R queries over the candidates, per KV head.

    ``queries``: ``[n_req, n_layers, Hq, R, D]`` post-RoPE queries of the recent window;
    with ``query_rows``, ``queries`` is the whole ring and request i reads row ``query_rows[i]``.
    For each query head: logits ``q.k / (sqrt(D) T)`` over the candidates only, softmax
    over the candidates, mean over the R queries; then mean over the GQA group of each KV
    head. ``[n_req, n_layers, Hkv, C]``; each row sums to 1.
    """
    if query_rows is not None:
        queries = queries[query_rows]
    n_req, n_layers, hq, r, d = queries.shape
    k = gather_region(k_buf, slots).float()  # [n_req, n_layers, Hkv, C, D]
    hkv = k.shape[2]
    q = queries.float().reshape(n_req, n_layers, hkv, hq // hkv, r, d)
    logits = torch.einsum("nlhgrd,nlhcd->nlhgrc", q, k) / (math.sqrt(d) * temperature)
    return logits.softmax(dim=-1).mean(dim=-2).mean(dim=3)


def smooth(probs: torch.Tensor, smoothing_kernel: int = 5) -> torch.Tensor:
    """1-D average pool along the candidates (stride 1, zero "same" padding, as kvpress)."""
    if smoothing_kernel <= 1:
        return probs
    flat = probs.reshape(-1, 1, probs.shape[-1])
    flat = F.avg_pool1d(flat, kernel_size=smoothing_kernel, stride=1, padding=smoothing_kernel // 2)
    return flat.reshape(probs.shape)


def window_attention_score(
    queries: torch.Tensor,
    k_buf: torch.Tensor,
    slots: torch.Tensor,
    temperature: float = 1.0,
    smoothing_kernel: int = 5,
    query_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """SnapKV-style importance of each candidate for the last R queries: the window
    attention (``window_attention_probs``), smoothed (``smooth``). Pooling is linear, so
    this equals pooling each query head and then averaging over the group."""
    return smooth(window_attention_probs(queries, k_buf, slots, temperature, query_rows), smoothing_kernel)


def evicted_mass(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The attention a round takes away: ``probs [..., C]`` over the candidates, ``keep
    [..., K]`` the region positions kept (those >= C are the recent window, no candidate)
    -> ``[...]``: the row's mass minus the mass on the kept candidates."""
    c = probs.shape[-1]
    is_candidate = keep < c
    kept = probs.float().gather(-1, keep.long().clamp_max(c - 1)).masked_fill(~is_candidate, 0.0)
    return (probs.float().sum(-1) - kept.sum(-1)).clamp_min(0.0)


def cur_score(k_buf: torch.Tensor, v_buf: torch.Tensor, slots: torch.Tensor, sketch: torch.Tensor) -> torch.Tensor:
    """Approximate CUR leverage (CurDKV): ``||k G||^2 * ||v G||^2``, normalised to sum 1 per head.

    ``sketch``: ``[n_req, n_layers, D, r]``, shared by the KV heads of a layer.
    """
    k = gather_region(k_buf, slots).float()
    v = gather_region(v_buf, slots).float()
    g = sketch.float()[:, :, None]  # [n_req, n_layers, 1, D, r]
    kg = (k @ g).square().sum(-1)
    vg = (v @ g).square().sum(-1)
    s = kg * vg
    return s / s.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)


def key_redundancy(k_buf: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """R-KV redundancy: softmax over candidates of the mean cosine similarity to the others.

    Holds one fp32 ``[n_req, n_layers, H, C, D]`` map (plus, for a bf16/fp16 pool, the
    gathered keys while they are widened), counted in ``RKV.workspace_bytes``.
    """
    c = slots.shape[1]
    # Gathered head-major, [n_layers, H, n_req, C, D]: a fresh contiguous copy, so the keys
    # are normalised in place and the batched mat-vec below runs on a view, without a copy.
    kn = k_buf.transpose(1, 2)[:, :, slots.long()].float()
    norm = kn.norm(dim=-1, keepdim=True)
    denom = norm + 1e-8
    kn.div_(denom)
    # Row i of the [C, C] similarity matrix with its diagonal zeroed sums to
    # kn_i . sum_j kn_j - |kn_i|^2: O(C D) work and memory instead of O(C^2) (at
    # B = 4096 the matrix alone would be 64 MiB per layer and KV head). |kn_i| is
    # |k_i| / (|k_i| + eps), taken from the norms so that no [C, D] map is squared.
    total = kn.sum(dim=-2, keepdim=True)  # [n_layers, H, n_req, 1, D]
    sim_sum = (kn @ total.transpose(-1, -2)).squeeze(-1)
    del kn, total
    sim_sum.sub_(norm.squeeze(-1).div_(denom.squeeze(-1)).square_())
    return sim_sum.div_(c).permute(2, 0, 1, 3).softmax(dim=-1)


def outlier_count(reserve_key: torch.Tensor, n_sink: int, factor: float, cap: int) -> torch.Tensor:
    """Per row of ``[..., C]`` value statistics: how many non-sink candidates are outliers,
    i.e. have a statistic of at least ``factor`` times the row's non-sink median (and above
    zero), at most ``cap``. ``[...]`` int64: the reserved slots a row actually needs."""
    stat = reserve_key[..., n_sink:].float()
    median = stat.median(dim=-1, keepdim=True).values
    outliers = (stat >= factor * median) & (stat > 0)
    return outliers.sum(dim=-1).clamp_max(cap)


def select(
    fill_key: torch.Tensor,
    n_sink: int,
    n_large: int,
    n_fill: int,
    reserve_key: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
    reserve_count: torch.Tensor | None = None,
) -> torch.Tensor:
    """Choose candidate positions per row of ``[..., C]`` keys.

    Output ``[..., n_sink + n_large + n_fill]`` int64, in this order:

    1. the sinks, positions ``0 .. n_sink-1``;
    2. the ``n_large`` non-sink positions with the largest ``reserve_key``, by descending key
       (with ``reserve_count``, ``[...]`` int64 in ``[0, n_large]``: only that many per row);
    3. the rest of the row, ``n_fill`` (plus the reserved slots a row did not use) of the
       remaining positions, by descending ``fill_key`` (``fill_key / noise`` when ``noise``
       is given).

    With ``noise`` drawn i.i.d. Exp(1), step 3 is sampling without replacement in
    proportion to ``fill_key``, in draw order: ``argmax w/E = argmax log w - log E`` and
    ``-log E`` is Gumbel(0, 1), so this is Gumbel-top-k.

    Ties are broken towards the lower position. Keys must be finite.
    """
    c = fill_key.shape[-1]
    if n_sink + n_large + n_fill > c:
        raise ValueError(f"cannot keep {n_sink + n_large + n_fill} of {c} candidates")
    pos = torch.arange(c, device=fill_key.device)
    eligible = (pos >= n_sink).expand(fill_key.shape).clone()
    parts = [pos[:n_sink].expand(*fill_key.shape[:-1], n_sink)]
    reserved = None
    if n_large > 0:
        if reserve_key is None:
            raise ValueError("n_large > 0 needs a reserve_key")
        masked = reserve_key.float().masked_fill(~eligible, float("-inf"))
        reserved = torch.sort(masked, dim=-1, descending=True, stable=True).indices[..., :n_large]
        taken = None if reserve_count is None else torch.arange(n_large, device=pos.device) < reserve_count[..., None]
        eligible.scatter_(-1, reserved, False if taken is None else ~taken)
    key = fill_key.float()
    if noise is not None:
        key = key / noise.float()
    key = key.masked_fill(~eligible, float("-inf"))
    fill = torch.sort(key, dim=-1, descending=True, stable=True).indices[..., : n_fill + n_large]
    if reserved is None or reserve_count is None:
        parts += ([] if reserved is None else [reserved]) + [fill[..., :n_fill]]
        return torch.cat(parts, dim=-1)
    # A row's first reserve_count slots come from the reservation, the rest from the fill.
    j = torch.arange(n_large + n_fill, device=pos.device)
    count = reserve_count[..., None]
    from_fill = fill.gather(-1, (j - count).clamp_min(0).expand(fill.shape))
    from_reserve = torch.cat([reserved, fill[..., :n_fill]], dim=-1)  # only j < count is read
    parts.append(torch.where(j < count, from_reserve, from_fill))
    return torch.cat(parts, dim=-1)


def compact(k_buf: torch.Tensor, v_buf: torch.Tensor, slots: torch.Tensor, keep: torch.Tensor) -> None:
    """Compact each request's region in place, per (layer, KV head).

    ``keep``: ``[n_req, n_layers, H, B]`` region positions to keep, in the order they are
    to be stored. Afterwards, for every (request r, layer l, head h, j < B)::

        buf[l, slots[r, j], h] == old buf[l, slots[r, keep[r, l, h, j]], h]

    The region's slots themselves never change; only the data inside them moves.
    """
    n_req, n_layers, n_heads, b = keep.shape
    src_slot = torch.gather(slots.long()[:, None, None, :].expand(n_req, n_layers, n_heads, -1), -1, keep.long())
    dst_slot = slots.long()[:, None, None, :b].expand(n_req, n_layers, n_heads, b)
    layer = torch.arange(n_layers, device=keep.device)[None, :, None, None].expand_as(src_slot)
    head = torch.arange(n_heads, device=keep.device)[None, None, :, None].expand_as(src_slot)
    for buf in (k_buf, v_buf):
        moved = buf[layer, src_slot, head]  # advanced indexing copies: every read precedes the writes
        buf[layer, dst_slot, head] = moved


def carry_scores(state: torch.Tensor, rows: torch.Tensor, carry: torch.Tensor, keep: torch.Tensor) -> None:
    """Move a stateful policy's scores with the tokens a round keeps, in place.

    ``state``: ``[n_rows, n_layers, H, W]`` fp32, one score per region position of each
    request's row; ``rows``: ``[n_req]`` each request's row; ``carry``: ``[n_req, n_layers,
    H, C]`` the round's score of each candidate; ``keep``: ``[n_req, n_layers, H, B]`` as
    ``compact`` takes it (B <= W). Afterwards, for every (request r, layer l, head h)::

        state[rows[r], l, h, j] == carry[r, l, h, keep[r, l, h, j]]   for j < B, keep < C
        state[rows[r], l, h, j] == 0                                    otherwise

    A kept recent position, which no round has scored yet, starts at 0, and so does every
    position from B on, which the next tokens fill.
    """
    n_req, n_layers, n_heads, b = keep.shape
    c = carry.shape[-1]
    k = keep.long()
    moved = torch.where(k < c, carry.gather(-1, k.clamp_max(c - 1)), 0.0)
    out = torch.zeros((n_req, n_layers, n_heads, state.shape[-1]), dtype=state.dtype, device=state.device)
    out[..., :b] = moved
    state[rows.long()] = out
