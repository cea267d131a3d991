"""Small helpers shared by the Triton kernels (tensor facts only, no SGLang)."""

from __future__ import annotations

import torch
import triton


def pow2(n: int, minimum: int = 16) -> int:
    """Block size covering ``n``; at least 16 so ``tl.dot`` accepts it on GPUs."""
    return max(minimum, triton.next_power_of_2(max(1, int(n))))


def check_layout(k_buf: torch.Tensor, slots: torch.Tensor) -> None:
    if k_buf.dim() != 4:
        raise ValueError(f"KV buffer must be [n_layers, n_slots, kv_heads, head_dim], got {tuple(k_buf.shape)}")
    if slots.dim() != 2:
        raise ValueError(f"slots must be [n_req, L], got {tuple(slots.shape)}")
    if slots.device != k_buf.device:
        raise ValueError(f"slots on {slots.device} but KV buffer on {k_buf.device}")
