"""Triton kernel: approximate CUR leverage score ``||k G||^2 * ||v G||^2`` (CurDKV / VaSE-DKV)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import GPU, check_layout, dot_options, launch, pow2


@triton.jit(do_not_specialize=["C", "n_layers", "s_sr"])
def _cur_kernel(
    k_ptr, v_ptr, slots_ptr, g_ptr, out_ptr,
    C, D, RANK, n_layers,
    s_kl, s_ks, s_kh, s_kd,
    s_vl, s_vs, s_vh, s_vd,
    s_sr, s_sc,
    s_gn, s_gl, s_gd, s_gk,
    BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DC: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_FP32: tl.constexpr,
):
    rl = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    cb = tl.program_id(2).to(tl.int64)
    n_heads = tl.num_programs(1)
    r = rl // n_layers
    layer = rl % n_layers
    offs_c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    offs_k = tl.arange(0, BLOCK_K).to(tl.int64)
    mask_c = offs_c < C
    slot = tl.load(slots_ptr + r * s_sr + offs_c * s_sc, mask=mask_c, other=0).to(tl.int64)
    kg = tl.zeros((BLOCK_C, BLOCK_K), tl.float32)
    vg = tl.zeros((BLOCK_C, BLOCK_K), tl.float32)
    # head_dim in chunks of at most 128, in a loop that is not unrolled, two stages deep:
    # whole 256-wide K and V tiles spilled on sm_80 (255 registers), an unrolled loop
    # spilled too, and a deeper pipeline overflowed sm_90's shared memory in fp32.
    for d0 in range(0, BLOCK_D, BLOCK_DC):
        offs_d = d0 + tl.arange(0, BLOCK_DC).to(tl.int64)
        mask_cd = mask_c[:, None] & (offs_d[None, :] < D)
        g = tl.load(g_ptr + r * s_gn + layer * s_gl + offs_d[:, None] * s_gd + offs_k[None, :] * s_gk,
                    mask=(offs_d[:, None] < D) & (offs_k[None, :] < RANK), other=0.0)
        k = tl.load(k_ptr + layer * s_kl + slot[:, None] * s_ks + h * s_kh + offs_d[None, :] * s_kd,
                    mask=mask_cd, other=0.0)
        v = tl.load(v_ptr + layer * s_vl + slot[:, None] * s_vs + h * s_vh + offs_d[None, :] * s_vd,
                    mask=mask_cd, other=0.0)
        # Operands in the pool's dtype (the Gaussian sketch rounded to it), fp32 accumulation.
        if DOT_FP32:
            k = k.to(tl.float32)
        g = g.to(k.dtype)
        kg += tl.dot(k, g, input_precision=DOT_PRECISION)
        vg += tl.dot(v.to(k.dtype), g, input_precision=DOT_PRECISION)
    s = tl.sum(kg * kg, axis=1) * tl.sum(vg * vg, axis=1)
    tl.store(out_ptr + (rl * n_heads + h) * C + offs_c, s, mask=mask_c)


def cur_score(k_buf: torch.Tensor, v_buf: torch.Tensor, slots: torch.Tensor, sketch: torch.Tensor) -> torch.Tensor:
    check_layout(k_buf, slots)
    n_layers, _, n_heads, d = k_buf.shape
    n_req, c = slots.shape
    rank = sketch.shape[-1]
    out = torch.empty((n_req, n_layers, n_heads, c), dtype=torch.float32, device=k_buf.device)
    block_c = 64
    if n_req == 0:
        return out
    launch(_cur_kernel, (n_req * n_layers, n_heads, triton.cdiv(c, block_c)),
           k_buf, v_buf, slots, sketch, out, c, d, rank, n_layers,
           *k_buf.stride(), *v_buf.stride(), *slots.stride(), *sketch.stride(),
           BLOCK_C=block_c, BLOCK_D=pow2(d), BLOCK_DC=min(pow2(d), 128), BLOCK_K=pow2(rank),
           gpu=dot_options(k_buf.dtype, GPU), num_stages=2,
           **dot_options(k_buf.dtype, k_buf.device))
    # Normalising is one reduction over a small tensor; torch does it as well as a kernel.
    return out / out.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
