"""Small helpers shared by the Triton kernels (tensor facts only, no SGLang)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton

# Every compiled variant launched in this process: (kernel, constexpr values, tensor dtypes).
# Triton compiles one binary per such key (ints that vary between rounds, including strides
# that follow the region's length, are marked do_not_specialize), so
# a key first seen while serving is a JIT compile in the middle of a decode step; the
# start-up warm-up (``VaseScheduler.warm_up`` in plugin/scheduler.py) launches every key
# serving can need.
LAUNCHED: set[tuple[Any, ...]] = set()

# Called as ``hook(kernel, args, constexprs)`` before every launch, with the constexprs a
# GPU launch would pass (see ``launch``): the offline compile check
# (``vase_sglang.compile_check``) records the variants the warm-up launches this way.
LAUNCH_HOOKS: list[Callable[[Any, tuple[Any, ...], dict[str, Any]], None]] = []
GPU = torch.device("cuda")
# Set by the offline compile check's record phase, which needs the launches' arguments
# only: the hooks see every launch and no kernel runs (its outputs stay uninitialized).
RECORD_ONLY = False


def pow2(n: int, minimum: int = 16) -> int:
    """Block size covering ``n``; at least 16 so ``tl.dot`` accepts it on GPUs."""
    return max(minimum, triton.next_power_of_2(max(1, int(n))))


def dot_precision(dtype: torch.dtype, device: torch.device) -> str:
    """``tl.dot`` input precision: tensor cores (TF32) for fp32 data on a GPU. bf16/fp16
    operands go to tensor cores whatever this says; accumulation is always fp32. The
    interpreter (CPU) computes in fp32 and takes only ``ieee``."""
    return "tf32" if device.type == "cuda" and dtype == torch.float32 else "ieee"


def dot_in_fp32(device: torch.device) -> bool:
    """Whether ``tl.dot`` operands are widened to fp32 first: only in the interpreter,
    whose bf16/fp16 dot returns garbage (triton 3.8); on a GPU they stay in the pool's
    dtype so the dot runs on tensor cores."""
    return device.type != "cuda"


def dot_options(dtype: torch.dtype, device: torch.device) -> dict[str, Any]:
    """The constexprs of a kernel with ``tl.dot`` that depend on where it runs."""
    return {"DOT_PRECISION": dot_precision(dtype, device), "DOT_FP32": dot_in_fp32(device)}


def launch(kernel: Any, grid: tuple[int, ...], *args: Any, gpu: dict[str, Any] | None = None,
           **constexprs: Any) -> None:
    """Launch ``kernel`` and record the variant it compiles to (see ``LAUNCHED``).

    ``gpu``: the values a GPU launch gives the device-dependent constexprs (``dot_options``
    on a CUDA device); the launch hooks see those, so a check running the interpreter
    records the variants a GPU server compiles.
    """
    dtypes = tuple(str(a.dtype) for a in args if isinstance(a, torch.Tensor))
    name = getattr(kernel, "__name__", None) or getattr(getattr(kernel, "fn", None), "__name__", repr(kernel))
    LAUNCHED.add((name, tuple(sorted(constexprs.items())), dtypes))
    for hook in LAUNCH_HOOKS:
        hook(kernel, args, {**constexprs, **(gpu or {})})
    if not RECORD_ONLY:
        kernel[grid](*args, **constexprs)


def check_layout(k_buf: torch.Tensor, slots: torch.Tensor) -> None:
    if k_buf.dim() != 4:
        raise ValueError(f"KV buffer must be [n_layers, n_slots, kv_heads, head_dim], got {tuple(k_buf.shape)}")
    if slots.dim() != 2:
        raise ValueError(f"slots must be [n_req, L], got {tuple(slots.shape)}")
    if slots.device != k_buf.device:
        raise ValueError(f"slots on {slots.device} but KV buffer on {k_buf.device}")
