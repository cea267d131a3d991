"""Triton kernels: window-attention importance of each candidate (SnapKV / R-KV / VaSE-AttnV).

Three launches, each batched over requests x layers x KV heads. The R window queries of
every query head of one GQA group are stacked into one ``[group * R, D]`` matrix, read in
tiles of up to ``MAX_BLOCK_M`` rows, so each K tile serves a whole group's rows (not one
query head's) and is multiplied on tensor cores (bf16/fp16 operands, or TF32 for fp32
data, fp32 accumulation):

1. ``_window_lse``: the log-sum-exp of each stacked query row's logits over all
   candidates (online softmax over candidate blocks), one program per row tile.
2. ``_window_probs``: per candidate block, ``exp(logit - lse)`` summed over the stacked
   rows and divided by R * group: the window attention, averaged over the queries and the
   query heads of the group (``window_attention_probs``, also read by the eviction
   telemetry, ``evicted_mass.py``).
3. ``_pool``: average pool along the slot axis (zero "same" padding, as kvpress's
   SnapKV): the score (``window_attention_score``). Pooling is linear, so pooling the
   group mean equals the mean of the pooled heads.

The queries are read in place from the ring (``query_rows`` picks each request's row),
so a round makes no copy of them.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._common import GPU, check_layout, dot_options, launch, pow2

# Ints that change with the request (budget, window, and the slots row stride, which is the
# region's length: B + R, or longer after a re-prefill): runtime values, never a recompile.
_RUNTIME_INTS = ["R", "C", "group", "n_layers", "s_sr"]


@triton.jit
def _load_group_q(q_ptr, qrow_ptr, rl, h_kv, m0, n_layers, R, D, group,
                  s_qn, s_ql, s_qh, s_qr, s_qd, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    # Rows m0 .. m0 + BLOCK_M of the stacked matrix; row m is window query m % R of query
    # head h_kv * group + m // R.
    r = (rl // n_layers).to(tl.int64)
    layer = (rl % n_layers).to(tl.int64)
    qrow = tl.load(qrow_ptr + r).to(tl.int64)
    offs_m = m0 + tl.arange(0, BLOCK_M).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D).to(tl.int64)
    hq = h_kv.to(tl.int64) * group + offs_m // R
    ptrs = (q_ptr + qrow * s_qn + layer * s_ql + hq[:, None] * s_qh + (offs_m % R)[:, None] * s_qr
            + offs_d[None, :] * s_qd)
    mask = (offs_m[:, None] < R * group) & (offs_d[None, :] < D)
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _load_k(k_ptr, slots_ptr, rl, h_kv, offs_c, n_layers, C, D,
            s_kl, s_ks, s_kh, s_kd, s_sr, s_sc, BLOCK_D: tl.constexpr):
    # The keys of candidates offs_c: [BLOCK_C, BLOCK_D], zeros past C.
    r = (rl // n_layers).to(tl.int64)
    layer = (rl % n_layers).to(tl.int64)
    offs_c = offs_c.to(tl.int64)
    mask_c = offs_c < C
    offs_d = tl.arange(0, BLOCK_D).to(tl.int64)
    slot = tl.load(slots_ptr + r * s_sr + offs_c * s_sc, mask=mask_c, other=0).to(tl.int64)
    kp = k_ptr + layer * s_kl + slot[:, None] * s_ks + h_kv.to(tl.int64) * s_kh + offs_d[None, :] * s_kd
    return tl.load(kp, mask=mask_c[:, None] & (offs_d[None, :] < D), other=0.0)


@triton.jit
def _logits(q, k, offs_c, C, scale, DOT_PRECISION: tl.constexpr, DOT_FP32: tl.constexpr):
    # Operands in the pool's dtype (tensor cores), accumulation in fp32.
    if DOT_FP32:
        q = q.to(tl.float32)
        k = k.to(tl.float32)
    logits = tl.dot(q.to(k.dtype), tl.trans(k), input_precision=DOT_PRECISION) * scale
    return tl.where((offs_c < C)[None, :], logits, float("-inf"))


@triton.jit(do_not_specialize=_RUNTIME_INTS)
def _window_lse(
    q_ptr, qrow_ptr, k_ptr, slots_ptr, lse_ptr,
    n_layers, R, C, D, group, scale,
    s_qn, s_ql, s_qh, s_qr, s_qd,
    s_kl, s_ks, s_kh, s_kd,
    s_sr, s_sc,
    BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    # One program: (request x layer, KV head, tile of BLOCK_M stacked rows).
    rl = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    m0 = tl.program_id(2).to(tl.int64) * BLOCK_M
    n_hkv = tl.num_programs(1)
    q = _load_group_q(q_ptr, qrow_ptr, rl, h, m0, n_layers, R, D, group, s_qn, s_ql, s_qh, s_qr, s_qd, BLOCK_M,
                      BLOCK_D)
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    denom = tl.zeros((BLOCK_M,), tl.float32)  # running softmax denominator
    for c0 in range(0, C, BLOCK_C):
        offs_c = c0 + tl.arange(0, BLOCK_C)
        k = _load_k(k_ptr, slots_ptr, rl, h, offs_c, n_layers, C, D, s_kl, s_ks, s_kh, s_kd, s_sr, s_sc, BLOCK_D)
        logits = _logits(q, k, offs_c, C, scale, DOT_PRECISION, DOT_FP32)
        m_new = tl.maximum(m, tl.max(logits, axis=1))
        denom = denom * tl.exp(m - m_new) + tl.sum(tl.exp(logits - m_new[:, None]), axis=1)
        m = m_new
    rows = R * group
    offs_m = m0 + tl.arange(0, BLOCK_M).to(tl.int64)
    tl.store(lse_ptr + (rl * n_hkv + h) * rows + offs_m, m + tl.log(denom), mask=offs_m < rows)


@triton.jit(do_not_specialize=_RUNTIME_INTS)
def _window_probs(
    q_ptr, qrow_ptr, k_ptr, slots_ptr, lse_ptr, out_ptr,
    n_layers, R, C, D, group, scale,
    s_qn, s_ql, s_qh, s_qr, s_qd,
    s_kl, s_ks, s_kh, s_kd,
    s_sr, s_sc,
    BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    # One program: (request x layer, KV head, block of candidates), over every stacked row.
    rl = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    cb = tl.program_id(2).to(tl.int64)
    n_hkv = tl.num_programs(1)
    rows = R * group
    offs_c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    k = _load_k(k_ptr, slots_ptr, rl, h, offs_c, n_layers, C, D, s_kl, s_ks, s_kh, s_kd, s_sr, s_sc, BLOCK_D)
    acc = tl.zeros((BLOCK_C,), tl.float32)
    for m0 in range(0, rows, BLOCK_M):
        q = _load_group_q(q_ptr, qrow_ptr, rl, h, m0, n_layers, R, D, group, s_qn, s_ql, s_qh, s_qr, s_qd, BLOCK_M,
                          BLOCK_D)
        offs_m = m0 + tl.arange(0, BLOCK_M).to(tl.int64)
        lse = tl.load(lse_ptr + (rl * n_hkv + h) * rows + offs_m, mask=offs_m < rows, other=0.0)
        logits = _logits(q, k, offs_c, C, scale, DOT_PRECISION, DOT_FP32)
        acc += tl.sum(tl.where((offs_m < rows)[:, None], tl.exp(logits - lse[:, None]), 0.0), axis=0)
    tl.store(out_ptr + (rl * n_hkv + h) * C + offs_c, acc / rows, mask=offs_c < C)


@triton.jit(do_not_specialize=["C"])
def _pool(
    probs_ptr, out_ptr, C,
    KERNEL: tl.constexpr, BLOCK_C: tl.constexpr,
):
    rl = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    cb = tl.program_id(2).to(tl.int64)
    n_hkv = tl.num_programs(1)
    offs_c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    acc = tl.zeros((BLOCK_C,), tl.float32)
    base = probs_ptr + (rl * n_hkv + h) * C
    for off in tl.static_range(KERNEL):
        idx = offs_c + (off - KERNEL // 2)
        acc += tl.load(base + idx, mask=(idx >= 0) & (idx < C), other=0.0)
    tl.store(out_ptr + (rl * n_hkv + h) * C + offs_c, acc / KERNEL, mask=offs_c < C)


# Stacked query rows per tile. group x R rows in one tile overflow shared memory (an fp32
# pool at 512 rows needs 278,656 bytes on sm_90, above its 232,448-byte limit), and any
# --kv-recent and GQA group must fit: the rows are tiled, at most 64 at a time, and rows
# wider than 512 bytes (head_dim 256 in fp32) take half tiles. The offline compile check
# (``python -m vase_sglang.compile_check``) measures every tile against each architecture.
MAX_BLOCK_M = 64
WIDE_ROW_BYTES = 512
# The widest head the compile check covers (Gemma-2's 256): wider K tiles are not
# known to fit, so they are refused when the warm-up first launches the kernels.
MAX_HEAD_DIM = 256


def blocks(group: int, recent: int, head_dim: int = 128, itemsize: int = 2) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_C): a tile of the ``group * recent`` stacked rows, and a candidate
    tile that keeps the ``[BLOCK_M, BLOCK_C]`` fp32 logits tile at most 8K elements."""
    wide = pow2(head_dim) * itemsize > WIDE_ROW_BYTES
    block_m = min(pow2(group * recent), MAX_BLOCK_M // 2 if wide else MAX_BLOCK_M)
    return block_m, 32 if wide else max(16, min(64, 8192 // block_m))


def workspace_bytes(n_req: int, n_layers: int, q_heads: int, kv_heads: int, recent: int, candidates: int) -> int:
    """fp32 temporaries of one call: lse per stacked row, the window attention and the pooled score."""
    return 4 * n_req * n_layers * (q_heads * recent + 2 * kv_heads * candidates)


def window_attention_probs(
    queries: torch.Tensor,
    k_buf: torch.Tensor,
    slots: torch.Tensor,
    temperature: float = 1.0,
    query_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[n_req, n_layers, Hkv, C]``: the window queries' softmax over the candidates, averaged
    over the R queries and the query heads of each KV head's group (rows sum to 1)."""
    check_layout(k_buf, slots)
    _, n_layers, hq, r, d = queries.shape
    n_req, c = slots.shape
    hkv = k_buf.shape[2]
    if hq % hkv != 0:
        raise ValueError(f"{hq} query heads is not a multiple of {hkv} KV heads")
    dev = k_buf.device
    rows = query_rows if query_rows is not None else torch.arange(n_req, device=dev)
    if rows.shape != (n_req,):
        raise ValueError(f"query_rows must be [{n_req}], got {tuple(rows.shape)}")
    if d > MAX_HEAD_DIM:
        raise ValueError(f"head_dim {d} is above {MAX_HEAD_DIM}, the widest the window-attention kernels are "
                         "compiled and checked for (python -m vase_sglang.compile_check); "
                         "use VASE_KERNEL_BACKEND=torch")
    group = hq // hkv
    probs = torch.empty((n_req, n_layers, hkv, c), dtype=torch.float32, device=dev)
    if n_req == 0:
        return probs
    lse = torch.empty((n_req * n_layers, hkv, group * r), dtype=torch.float32, device=dev)
    scale = 1.0 / (math.sqrt(d) * temperature)
    block_m, block_c = blocks(group, r, d, k_buf.element_size())
    blk = dict(BLOCK_M=block_m, BLOCK_C=block_c, BLOCK_D=pow2(d), **dot_options(k_buf.dtype, dev))
    gpu = dot_options(k_buf.dtype, GPU)
    common = (n_layers, r, c, d, group, scale, *queries.stride(), *k_buf.stride(), *slots.stride())
    launch(_window_lse, (n_req * n_layers, hkv, triton.cdiv(group * r, block_m)), queries, rows, k_buf, slots, lse,
           *common, gpu=gpu, **blk)
    # maxnreg: sm_100's ptxas otherwise caps a probs program at 168 registers and spills
    # (64 bf16 rows of head_dim 128); with the cap lifted it takes 184 and spills nothing.
    launch(_window_probs, (n_req * n_layers, hkv, triton.cdiv(c, block_c)), queries, rows, k_buf, slots, lse, probs,
           *common, gpu=gpu, maxnreg=255, **blk)
    return probs


def smooth(probs: torch.Tensor, smoothing_kernel: int = 5) -> torch.Tensor:
    """Average pool of ``[n_req, n_layers, Hkv, C]`` along C (zero "same" padding)."""
    n_req, n_layers, hkv, c = probs.shape
    out = torch.empty_like(probs)
    if probs.numel() == 0:
        return out
    block_c = blocks(1, 1)[1]
    launch(_pool, (n_req * n_layers, hkv, triton.cdiv(c, block_c)), probs.contiguous(), out, c,
           KERNEL=smoothing_kernel, BLOCK_C=block_c)
    return out


def window_attention_score(
    queries: torch.Tensor,
    k_buf: torch.Tensor,
    slots: torch.Tensor,
    temperature: float = 1.0,
    smoothing_kernel: int = 5,
    query_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """The smoothed window attention of each candidate (SnapKV's score)."""
    return smooth(window_attention_probs(queries, k_buf, slots, temperature, query_rows), smoothing_kernel)
