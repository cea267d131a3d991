"""Triton kernels: window-attention importance of each candidate (SnapKV / R-KV / VaSE-AttnV).

Three launches, each batched over requests x layers x heads:

1. ``_window_lse``: per (request, layer, q head), the log-sum-exp of each window query's
   logits over all candidates (online softmax over candidate blocks).
2. ``_window_probs``: per candidate block, ``exp(logit - lse)`` averaged over the R queries.
3. ``_pool_group``: average pool along the slot axis (zero "same" padding, as kvpress's
   SnapKV) and mean over the GQA group of each KV head.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._common import check_layout, pow2


@triton.jit
def _load_q(q_ptr, rl, hq, n_layers, R, D, s_qn, s_ql, s_qh, s_qr, s_qd, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    r = (rl // n_layers).to(tl.int64)
    layer = (rl % n_layers).to(tl.int64)
    hq = hq.to(tl.int64)
    offs_r = tl.arange(0, BLOCK_R).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D).to(tl.int64)
    ptrs = q_ptr + r * s_qn + layer * s_ql + hq * s_qh + offs_r[:, None] * s_qr + offs_d[None, :] * s_qd
    mask = (offs_r[:, None] < R) & (offs_d[None, :] < D)
    return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _logits(q, k_ptr, slots_ptr, rl, h_kv, offs_c, n_layers, C, D, scale,
            s_kl, s_ks, s_kh, s_kd, s_sr, s_sc, BLOCK_D: tl.constexpr):
    r = (rl // n_layers).to(tl.int64)
    layer = (rl % n_layers).to(tl.int64)
    h_kv = h_kv.to(tl.int64)
    offs_c = offs_c.to(tl.int64)
    mask_c = offs_c < C
    offs_d = tl.arange(0, BLOCK_D).to(tl.int64)
    slot = tl.load(slots_ptr + r * s_sr + offs_c * s_sc, mask=mask_c, other=0).to(tl.int64)
    kp = k_ptr + layer * s_kl + slot[:, None] * s_ks + h_kv * s_kh + offs_d[None, :] * s_kd
    k = tl.load(kp, mask=mask_c[:, None] & (offs_d[None, :] < D), other=0.0).to(tl.float32)
    logits = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
    return tl.where(mask_c[None, :], logits, float("-inf"))


@triton.jit
def _window_lse(
    q_ptr, k_ptr, slots_ptr, lse_ptr,
    n_layers, R, C, D, group, scale,
    s_qn, s_ql, s_qh, s_qr, s_qd,
    s_kl, s_ks, s_kh, s_kd,
    s_sr, s_sc,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr,
):
    rl = tl.program_id(0).to(tl.int64)
    hq = tl.program_id(1).to(tl.int64)
    n_hq = tl.num_programs(1)
    q = _load_q(q_ptr, rl, hq, n_layers, R, D, s_qn, s_ql, s_qh, s_qr, s_qd, BLOCK_R, BLOCK_D)
    m = tl.full((BLOCK_R,), float("-inf"), tl.float32)
    denom = tl.zeros((BLOCK_R,), tl.float32)  # running softmax denominator
    for c0 in range(0, C, BLOCK_C):
        offs_c = c0 + tl.arange(0, BLOCK_C)
        logits = _logits(q, k_ptr, slots_ptr, rl, hq // group, offs_c, n_layers, C, D, scale,
                         s_kl, s_ks, s_kh, s_kd, s_sr, s_sc, BLOCK_D)
        m_new = tl.maximum(m, tl.max(logits, axis=1))
        denom = denom * tl.exp(m - m_new) + tl.sum(tl.exp(logits - m_new[:, None]), axis=1)
        m = m_new
    offs_r = tl.arange(0, BLOCK_R).to(tl.int64)
    tl.store(lse_ptr + (rl * n_hq + hq) * R + offs_r, m + tl.log(denom), mask=offs_r < R)


@triton.jit
def _window_probs(
    q_ptr, k_ptr, slots_ptr, lse_ptr, out_ptr,
    n_layers, R, C, D, group, scale,
    s_qn, s_ql, s_qh, s_qr, s_qd,
    s_kl, s_ks, s_kh, s_kd,
    s_sr, s_sc,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr,
):
    rl = tl.program_id(0).to(tl.int64)
    hq = tl.program_id(1).to(tl.int64)
    cb = tl.program_id(2).to(tl.int64)
    n_hq = tl.num_programs(1)
    q = _load_q(q_ptr, rl, hq, n_layers, R, D, s_qn, s_ql, s_qh, s_qr, s_qd, BLOCK_R, BLOCK_D)
    offs_r = tl.arange(0, BLOCK_R).to(tl.int64)
    lse = tl.load(lse_ptr + (rl * n_hq + hq) * R + offs_r, mask=offs_r < R, other=0.0)
    offs_c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    logits = _logits(q, k_ptr, slots_ptr, rl, hq // group, offs_c, n_layers, C, D, scale,
                     s_kl, s_ks, s_kh, s_kd, s_sr, s_sc, BLOCK_D)
    p = tl.where((offs_r < R)[:, None], tl.exp(logits - lse[:, None]), 0.0)
    tl.store(out_ptr + (rl * n_hq + hq) * C + offs_c, tl.sum(p, axis=0) / R, mask=offs_c < C)


@triton.jit
def _pool_group(
    probs_ptr, out_ptr, C, group,
    KERNEL: tl.constexpr, BLOCK_C: tl.constexpr,
):
    rl = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    cb = tl.program_id(2).to(tl.int64)
    n_hkv = tl.num_programs(1)
    offs_c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    acc = tl.zeros((BLOCK_C,), tl.float32)
    for g in range(0, group):
        base = probs_ptr + (rl * n_hkv * group + h * group + g) * C
        for off in tl.static_range(KERNEL):
            idx = offs_c + (off - KERNEL // 2)
            acc += tl.load(base + idx, mask=(idx >= 0) & (idx < C), other=0.0)
    tl.store(out_ptr + (rl * n_hkv + h) * C + offs_c, acc / (KERNEL * group), mask=offs_c < C)


def window_attention_score(
    queries: torch.Tensor,
    k_buf: torch.Tensor,
    slots: torch.Tensor,
    temperature: float = 1.0,
    smoothing_kernel: int = 5,
) -> torch.Tensor:
    check_layout(k_buf, slots)
    n_req, n_layers, hq, r, d = queries.shape
    hkv = k_buf.shape[2]
    if hq % hkv != 0:
        raise ValueError(f"{hq} query heads is not a multiple of {hkv} KV heads")
    c = slots.shape[1]
    dev = k_buf.device
    lse = torch.empty((n_req * n_layers, hq, r), dtype=torch.float32, device=dev)
    probs = torch.empty((n_req, n_layers, hq, c), dtype=torch.float32, device=dev)
    out = torch.empty((n_req, n_layers, hkv, c), dtype=torch.float32, device=dev)
    scale = 1.0 / (math.sqrt(d) * temperature)
    block_c, block_r, block_d = 64, pow2(r), pow2(d)
    common = (n_layers, r, c, d, hq // hkv, scale, *queries.stride(), *k_buf.stride(), *slots.stride())
    _window_lse[(n_req * n_layers, hq)](queries, k_buf, slots, lse, *common,
                                        BLOCK_R=block_r, BLOCK_C=block_c, BLOCK_D=block_d)
    _window_probs[(n_req * n_layers, hq, triton.cdiv(c, block_c))](queries, k_buf, slots, lse, probs, *common,
                                                                  BLOCK_R=block_r, BLOCK_C=block_c, BLOCK_D=block_d)
    _pool_group[(n_req * n_layers, hkv, triton.cdiv(c, block_c))](probs, out, c, hq // hkv,
                                                                 KERNEL=smoothing_kernel, BLOCK_C=block_c)
    return out
