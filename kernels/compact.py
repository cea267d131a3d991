"""Triton kernels: per-head in-place compaction of each request's region.

Two launches per chunk of layers: gather the kept rows of every (request, layer, head)
into a scratch buffer, then scatter them back into the region's first B slots. The
scratch makes the in-place move safe whatever the kept order: a kept source may sit
anywhere in the region, including in slots that the move overwrites.

``carry_scores`` moves a stateful policy's per-position scores the same way, with the
same ``keep``: one launch, reading the round's scores (a separate tensor, so no scratch).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_layout, launch, pow2

# Scratch bytes per launch chunk; bounds the workspace whatever the batch size.
SCRATCH_BYTES = 256 << 20


@triton.jit(do_not_specialize=["B", "layer0", "s_sr", "s_kr", "s_kl", "s_kh"])
def _move_kernel(
    buf_ptr, slots_ptr, keep_ptr, scratch_ptr,
    B, D, n_heads, layer0,
    s_bl, s_bs, s_bh, s_bd,
    s_sr, s_sc,
    s_kr, s_kl, s_kh, s_kb,
    TO_SCRATCH: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # One program: (request, local layer x head, block of kept positions).
    r = tl.program_id(0).to(tl.int64)
    lh = tl.program_id(1).to(tl.int64)
    jb = tl.program_id(2).to(tl.int64)
    n_lh = tl.num_programs(1)
    local_layer = lh // n_heads
    h = lh % n_heads
    layer = layer0 + local_layer
    offs_j = jb * BLOCK_J + tl.arange(0, BLOCK_J)
    offs_d = tl.arange(0, BLOCK_D).to(tl.int64)
    mask_j = offs_j < B
    mask = mask_j[:, None] & (offs_d[None, :] < D)
    scratch = scratch_ptr + ((r * n_lh + lh) * B + offs_j[:, None]) * D + offs_d[None, :]
    if TO_SCRATCH:
        pos = tl.load(keep_ptr + r * s_kr + layer * s_kl + h * s_kh + offs_j * s_kb, mask=mask_j, other=0).to(tl.int64)
        slot = tl.load(slots_ptr + r * s_sr + pos * s_sc, mask=mask_j, other=0).to(tl.int64)
        src = buf_ptr + layer * s_bl + slot[:, None] * s_bs + h * s_bh + offs_d[None, :] * s_bd
        tl.store(scratch, tl.load(src, mask=mask), mask=mask)
    else:
        slot = tl.load(slots_ptr + r * s_sr + offs_j * s_sc, mask=mask_j, other=0).to(tl.int64)
        dst = buf_ptr + layer * s_bl + slot[:, None] * s_bs + h * s_bh + offs_d[None, :] * s_bd
        tl.store(dst, tl.load(scratch, mask=mask), mask=mask)


def workspace_bytes(n_req: int, n_layers: int, kv_heads: int, budget: int, head_dim: int, itemsize: int) -> int:
    """Scratch bytes of one call (bounded by SCRATCH_BYTES unless one layer needs more)."""
    per_layer = n_req * kv_heads * budget * head_dim * itemsize
    return per_layer * max(1, min(n_layers, SCRATCH_BYTES // max(1, per_layer)))


def compact(k_buf: torch.Tensor, v_buf: torch.Tensor, slots: torch.Tensor, keep: torch.Tensor) -> None:
    check_layout(k_buf, slots)
    n_req, n_layers, n_heads, b = keep.shape
    d = k_buf.shape[-1]
    if n_req == 0:
        return
    per_layer = n_req * n_heads * b * d * k_buf.element_size()
    chunk = max(1, min(n_layers, SCRATCH_BYTES // max(1, per_layer)))
    scratch = torch.empty((n_req, chunk * n_heads, b, d), dtype=k_buf.dtype, device=k_buf.device)
    block_j = 64
    for layer0 in range(0, n_layers, chunk):
        n = min(chunk, n_layers - layer0)
        grid = (n_req, n * n_heads, triton.cdiv(b, block_j))
        for buf in (k_buf, v_buf):
            for to_scratch in (True, False):
                launch(_move_kernel, grid, buf, slots, keep, scratch, b, d, n_heads, layer0,
                       *buf.stride(), *slots.stride(), *keep.stride(),
                       TO_SCRATCH=to_scratch, BLOCK_J=block_j, BLOCK_D=pow2(d))


@triton.jit(do_not_specialize=["B", "C", "W", "s_cr", "s_cl", "s_ch", "s_kr", "s_kl", "s_kh"])
def _carry_kernel(
    state_ptr, rows_ptr, carry_ptr, keep_ptr,
    B, C, W, n_heads,
    s_sr, s_sl, s_sh, s_sw,
    s_cr, s_cl, s_ch, s_cc,
    s_kr, s_kl, s_kh, s_kb,
    BLOCK_J: tl.constexpr,
):
    # One program: (request, layer x head, block of region positions).
    r = tl.program_id(0).to(tl.int64)
    lh = tl.program_id(1).to(tl.int64)
    jb = tl.program_id(2).to(tl.int64)
    layer = lh // n_heads
    h = lh % n_heads
    offs_j = jb * BLOCK_J + tl.arange(0, BLOCK_J).to(tl.int64)
    kept = offs_j < B
    pos = tl.load(keep_ptr + r * s_kr + layer * s_kl + h * s_kh + offs_j * s_kb, mask=kept, other=0).to(tl.int64)
    scored = kept & (pos < C)  # a kept recent position has no score yet
    val = tl.load(carry_ptr + r * s_cr + layer * s_cl + h * s_ch + pos * s_cc, mask=scored, other=0.0)
    row = tl.load(rows_ptr + r).to(tl.int64)
    tl.store(state_ptr + row * s_sr + layer * s_sl + h * s_sh + offs_j * s_sw, val, mask=offs_j < W)


def carry_scores(state: torch.Tensor, rows: torch.Tensor, carry: torch.Tensor, keep: torch.Tensor) -> None:
    n_req, n_layers, n_heads, b = keep.shape
    w, c = state.shape[-1], carry.shape[-1]
    if b > w:
        raise ValueError(f"keep holds {b} positions, the state only {w}")
    if n_req == 0:
        return
    block_j = 128
    grid = (n_req, n_layers * n_heads, triton.cdiv(w, block_j))
    launch(_carry_kernel, grid, state, rows, carry, keep, b, c, w, n_heads,
           *state.stride(), *carry.stride(), *keep.stride(), BLOCK_J=block_j)
