"""Triton kernel: choose the kept candidates of each (request, layer, KV head) row.

Order of the output (the same as ``reference.select``): sinks, then the reserved top
``n_large`` by ``reserve_key`` (or a per-row ``reserve_count`` of them), then ``n_fill`` (plus
the reserved slots a row left) by ``fill_key / noise`` (sampling without replacement when
``noise`` is Exp(1), i.e. Gumbel-top-k), each by descending key.

One program per row sorts the whole row once per stage. Each key is packed into an int64
as (order-preserving float bits << 32 | ~position), so a single integer sort gives a
descending order with ties broken towards the lower position, exactly like a stable
descending ``torch.sort``.

``BLOCK`` (the row, padded to a power of two) is the only compile-time constant that
depends on the number of candidates. A server compiles the blocks its budgets reach at
start-up and passes the largest as ``max_block``: a wider row (the first round after a
re-prefill of a long history) runs the torch twin on the same device instead of compiling
a new variant in the middle of a decode step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import reference
from ._common import launch


@triton.jit
def _orderable(x):
    # Float32 bits as an int32 whose signed order matches the float order (no NaNs).
    x = tl.where(x == 0.0, 0.0, x)  # -0.0 and +0.0 must tie, as in torch.sort
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _pack(key32, offs, eligible):
    k = tl.where(eligible, key32, -2147483648).to(tl.int64)
    return (k << 32) | (0x7FFFFFFF - offs).to(tl.int64)


@triton.jit
def _unpack_pos(packed):
    return (0x7FFFFFFF - (packed & 0x7FFFFFFF)).to(tl.int64)


@triton.jit(do_not_specialize=["C", "n_sink", "n_large", "n_fill", "n_out"])
def _select_kernel(
    fill_ptr, reserve_ptr, noise_ptr, count_ptr, out_ptr,
    C, n_sink, n_large, n_fill, n_out,
    HAS_RESERVE: tl.constexpr, HAS_NOISE: tl.constexpr, HAS_COUNT: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    valid = offs < C
    eligible = valid & (offs >= n_sink)
    out_row = out_ptr + row * n_out
    tl.store(out_row + offs, offs.to(tl.int64), mask=offs < n_sink)
    # The reserved slots this row takes; the fill takes the ones it leaves.
    n_res = n_large
    if HAS_COUNT:
        n_res = tl.load(count_ptr + row).to(tl.int64)
    if HAS_RESERVE:
        res = tl.load(reserve_ptr + row * C + offs, mask=valid, other=0.0).to(tl.float32)
        packed = _pack(_orderable(res), offs, eligible)
        ranked = tl.sort(packed, descending=True)
        tl.store(out_row + n_sink + offs, _unpack_pos(ranked), mask=offs < n_res)
        # The n_res-th packed key is a threshold: packed keys are unique.
        threshold = tl.max(tl.where(offs == n_res - 1, ranked, -9223372036854775807), axis=0)
        eligible = eligible & ~((packed >= threshold) & (n_res > 0))
    key = tl.load(fill_ptr + row * C + offs, mask=valid, other=0.0).to(tl.float32)
    if HAS_NOISE:
        key = key / tl.load(noise_ptr + row * C + offs, mask=valid, other=1.0).to(tl.float32)
    ranked = tl.sort(_pack(_orderable(key), offs, eligible), descending=True)
    tl.store(out_row + n_sink + n_res + offs, _unpack_pos(ranked), mask=offs < n_fill + n_large - n_res)


def warps(block: int) -> int:
    """Warps per row: a thread holds ``block / (32 * warps)`` int64 keys through two sorts,
    so the warps grow with the block (at 4 warps, BLOCK = 4,096 needs 255 registers and
    spills on sm_80; at 16 it needs 128 and does not)."""
    return min(32, max(4, block // 256))


def select(
    fill_key: torch.Tensor,
    n_sink: int,
    n_large: int,
    n_fill: int,
    reserve_key: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
    reserve_count: torch.Tensor | None = None,
    max_block: int | None = None,
) -> torch.Tensor:
    c = fill_key.shape[-1]
    block = triton.next_power_of_2(c)
    if max_block is not None and block > max_block:
        return reference.select(fill_key, n_sink, n_large, n_fill, reserve_key, noise, reserve_count)
    if n_sink + n_large + n_fill > c:
        raise ValueError(f"cannot keep {n_sink + n_large + n_fill} of {c} candidates")
    if n_large > 0 and reserve_key is None:
        raise ValueError("n_large > 0 needs a reserve_key")
    lead = fill_key.shape[:-1]
    rows = fill_key.reshape(-1, c).contiguous()
    n_out = n_sink + n_large + n_fill
    out = torch.empty((rows.shape[0], n_out), dtype=torch.int64, device=fill_key.device)
    reserve = reserve_key.reshape(-1, c).contiguous() if (n_large > 0 and reserve_key is not None) else rows
    noise_rows = noise.reshape(-1, c).contiguous() if noise is not None else rows
    counts, has_count = out, False  # ``out`` stands in for the pointer when rows have no counts
    if n_large > 0 and reserve_count is not None:
        counts, has_count = reserve_count.reshape(-1).to(torch.int64).contiguous(), True
    if rows.shape[0] > 0:
        launch(_select_kernel, (rows.shape[0],), rows, reserve, noise_rows, counts, out, c, n_sink, n_large, n_fill,
               n_out, HAS_RESERVE=n_large > 0, HAS_NOISE=noise is not None, HAS_COUNT=has_count,
               BLOCK=block, num_warps=warps(block))
    return out.reshape(*lead, n_out)
