"""Triton kernel: the window attention a round takes away (the eviction telemetry's signal).

Per (request, layer, KV head) row: the share of the window queries' attention over the
candidates (``window_attention_probs``) that falls on the candidates the round does not keep.
Computed as the row's total minus the mass on the kept positions, so that nothing has to
build the complement of the kept set; kept positions >= C are the recent window, which is
not a candidate. One program per row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import launch

BLOCK = 256


@triton.jit(do_not_specialize=["C", "K"])
def _evicted_mass_kernel(probs_ptr, keep_ptr, out_ptr, C, K, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK).to(tl.int64)
    total = tl.zeros((BLOCK,), tl.float32)
    for c0 in range(0, C, BLOCK):
        idx = c0 + offs
        total += tl.load(probs_ptr + row * C + idx, mask=idx < C, other=0.0)
    kept = tl.zeros((BLOCK,), tl.float32)
    for k0 in range(0, K, BLOCK):
        j = k0 + offs
        pos = tl.load(keep_ptr + row * K + j, mask=j < K, other=C).to(tl.int64)
        kept += tl.load(probs_ptr + row * C + pos, mask=(j < K) & (pos < C) & (pos >= 0), other=0.0)
    tl.store(out_ptr + row, tl.maximum(tl.sum(total, axis=0) - tl.sum(kept, axis=0), 0.0))


def evicted_mass(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``probs [..., C]`` (fp32), ``keep [..., K]`` region positions kept -> ``[...]`` fp32."""
    if probs.shape[:-1] != keep.shape[:-1]:
        raise ValueError(f"probs {tuple(probs.shape)} and keep {tuple(keep.shape)} disagree on the leading dims")
    c, k = probs.shape[-1], keep.shape[-1]
    probs = probs.float().contiguous()
    keep = keep.contiguous()
    out = torch.empty(probs.shape[:-1], dtype=torch.float32, device=probs.device)
    if out.numel():
        launch(_evicted_mass_kernel, (out.numel(),), probs, keep, out, c, k, BLOCK=BLOCK)
    return out
