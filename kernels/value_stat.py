"""Triton kernel: per-slot value statistic (range, l2, variance, absmax) over head_dim."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_layout, launch, pow2

STAT_IDS = {"range": 0, "l2": 1, "variance": 2, "absmax": 3}


@triton.jit(do_not_specialize=["C", "n_layers", "s_sr"])
def _value_stat_kernel(
    v_ptr, slots_ptr, out_ptr,
    C, D, n_layers,
    s_vl, s_vs, s_vh, s_vd,
    s_sr, s_sc,
    STAT: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # One program: (request x layer, kv head, block of candidates).
    rl = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    cb = tl.program_id(2).to(tl.int64)
    r = rl // n_layers
    layer = rl % n_layers
    n_heads = tl.num_programs(1)
    offs_c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    offs_d = tl.arange(0, BLOCK_D).to(tl.int64)
    mask_c = offs_c < C
    mask_d = offs_d < D
    slot = tl.load(slots_ptr + r * s_sr + offs_c * s_sc, mask=mask_c, other=0).to(tl.int64)
    ptrs = v_ptr + layer * s_vl + slot[:, None] * s_vs + h * s_vh + offs_d[None, :] * s_vd
    m2 = mask_c[:, None] & mask_d[None, :]
    v = tl.load(ptrs, mask=m2, other=0.0).to(tl.float32)
    if STAT == 0:
        hi = tl.max(tl.where(m2, v, float("-inf")), axis=1)
        lo = tl.min(tl.where(m2, v, float("inf")), axis=1)
        res = hi - lo
    elif STAT == 1:
        res = tl.sqrt(tl.sum(v * v, axis=1))
    elif STAT == 2:
        mean = tl.sum(v, axis=1) / D
        dev = tl.where(m2, v - mean[:, None], 0.0)
        res = tl.sum(dev * dev, axis=1) / D
    else:
        res = tl.max(tl.abs(v), axis=1)
    out_off = (rl * n_heads + h) * C + offs_c
    tl.store(out_ptr + out_off, res, mask=mask_c)


def value_stat(v_buf: torch.Tensor, slots: torch.Tensor, stat: str) -> torch.Tensor:
    check_layout(v_buf, slots)
    if stat not in STAT_IDS:
        raise ValueError(f"unknown value statistic {stat!r}")
    n_layers, _, n_heads, d = v_buf.shape
    n_req, c = slots.shape
    out = torch.empty((n_req, n_layers, n_heads, c), dtype=torch.float32, device=v_buf.device)
    block_c = 64
    if n_req == 0:
        return out
    launch(_value_stat_kernel, (n_req * n_layers, n_heads, triton.cdiv(c, block_c)),
           v_buf, slots, out, c, d, n_layers, *v_buf.stride(), *slots.stride(),
           STAT=STAT_IDS[stat], BLOCK_C=block_c, BLOCK_D=pow2(d))
    return out
