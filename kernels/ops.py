"""One entry point per kernel, dispatching to Triton or to the torch reference.

``backend="auto"`` uses Triton when the tensors live on a GPU and the torch reference
otherwise; the choice is logged once per process. ``VASE_KERNEL_BACKEND=torch|triton``
forces one (``triton`` on CPU tensors needs ``TRITON_INTERPRET=1``, which the tests use).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from . import reference

logger = logging.getLogger("vase_sglang.kernels")

BACKENDS = ("auto", "torch", "triton")
_announced: set[str] = set()


def _triton_usable_on(device: torch.device) -> bool:
    if device.type == "cuda":
        return True
    return os.environ.get("TRITON_INTERPRET") == "1"


def resolve_backend(device: torch.device, backend: str | None = None) -> str:
    choice = backend or os.environ.get("VASE_KERNEL_BACKEND", "auto")
    if choice not in BACKENDS:
        raise ValueError(f"invalid VASE_KERNEL_BACKEND={choice!r}: must be one of {', '.join(BACKENDS)}")
    if choice == "auto":
        choice = "triton" if device.type == "cuda" else "torch"
    if choice == "triton" and not _triton_usable_on(device):
        raise RuntimeError(f"Triton kernels cannot run on {device} tensors; "
                           "set TRITON_INTERPRET=1 or use the torch backend")
    key = f"{choice}@{device.type}"
    if key not in _announced:
        _announced.add(key)
        reason = "forced" if (backend or os.environ.get("VASE_KERNEL_BACKEND", "auto")) != "auto" else "auto"
        logger.info("VaSE kernels: using the %s backend for %s tensors (%s)", choice, device.type, reason)
    return choice


def _impl(name: str, device: torch.device, backend: str | None) -> Callable[..., Any]:
    if resolve_backend(device, backend) == "torch":
        return getattr(reference, name)
    # Imported lazily: the torch path must not pay for Triton's JIT set-up.
    from . import compact, cur, evicted_mass, select, value_stat, window_attention

    modules: dict[str, ModuleType] = {
        "value_stat": value_stat,
        "window_attention_score": window_attention,
        "window_attention_probs": window_attention,
        "smooth": window_attention,
        "evicted_mass": evicted_mass,
        "cur_score": cur,
        "select": select,
        "compact": compact,
        "carry_scores": compact,
    }
    if name not in modules:  # no Triton version: the torch op is already a few matmuls
        return getattr(reference, name)
    return getattr(modules[name], name)


def value_stat(v_buf: torch.Tensor, slots: torch.Tensor, stat: str, backend: str | None = None) -> torch.Tensor:
    return _impl("value_stat", v_buf.device, backend)(v_buf, slots, stat)


def window_attention_score(queries: torch.Tensor, k_buf: torch.Tensor, slots: torch.Tensor, *args: Any,
                           backend: str | None = None, **kwargs: Any) -> torch.Tensor:
    """SnapKV's importance of each candidate for the window queries: the other arguments
    (``temperature``, ``smoothing_kernel``, ``query_rows``) and their defaults are those of
    ``reference.window_attention_score`` and its Triton twin, passed through unchanged."""
    return _impl("window_attention_score", k_buf.device, backend)(queries, k_buf, slots, *args, **kwargs)


def window_attention_probs(queries: torch.Tensor, k_buf: torch.Tensor, slots: torch.Tensor, temperature: float = 1.0,
                           query_rows: torch.Tensor | None = None, backend: str | None = None) -> torch.Tensor:
    """The window queries' attention over the candidates, averaged over the R queries and
    each KV head's group: ``[n_req, n_layers, Hkv, C]``, rows summing to 1."""
    return _impl("window_attention_probs", k_buf.device, backend)(queries, k_buf, slots, temperature, query_rows)


def smooth(probs: torch.Tensor, smoothing_kernel: int = 5, backend: str | None = None) -> torch.Tensor:
    """Average pool along the candidates: window attention -> SnapKV's score."""
    return _impl("smooth", probs.device, backend)(probs, smoothing_kernel)


def evicted_mass(probs: torch.Tensor, keep: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """``[...]``: the mass of ``probs [..., C]`` on the candidates ``keep [..., K]`` does not keep."""
    return _impl("evicted_mass", probs.device, backend)(probs, keep)


def cur_score(k_buf: torch.Tensor, v_buf: torch.Tensor, slots: torch.Tensor, sketch: torch.Tensor,
              backend: str | None = None) -> torch.Tensor:
    return _impl("cur_score", k_buf.device, backend)(k_buf, v_buf, slots, sketch)


def key_redundancy(k_buf: torch.Tensor, slots: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    return _impl("key_redundancy", k_buf.device, backend)(k_buf, slots)


def select(fill_key: torch.Tensor, n_sink: int, n_large: int, n_fill: int,
           reserve_key: torch.Tensor | None = None, noise: torch.Tensor | None = None,
           reserve_count: torch.Tensor | None = None, backend: str | None = None,
           max_block: int | None = None) -> torch.Tensor:
    """``max_block``: the widest row block the Triton kernel may compile; wider rows run the
    torch twin (same result), so no round compiles a kernel mid-decode."""
    impl = _impl("select", fill_key.device, backend)
    if impl is reference.select:
        return impl(fill_key, n_sink, n_large, n_fill, reserve_key, noise, reserve_count)
    return impl(fill_key, n_sink, n_large, n_fill, reserve_key, noise, reserve_count, max_block=max_block)


def outlier_count(reserve_key: torch.Tensor, n_sink: int, factor: float, cap: int,
                  backend: str | None = None) -> torch.Tensor:
    return _impl("outlier_count", reserve_key.device, backend)(reserve_key, n_sink, factor, cap)


def compact(k_buf: torch.Tensor, v_buf: torch.Tensor, slots: torch.Tensor, keep: torch.Tensor,
            backend: str | None = None) -> None:
    _impl("compact", k_buf.device, backend)(k_buf, v_buf, slots, keep)


def carry_scores(state: torch.Tensor, rows: torch.Tensor, carry: torch.Tensor, keep: torch.Tensor,
                 backend: str | None = None) -> None:
    """Move a stateful policy's scores ``carry [n_req, layers, H, C]`` with ``keep`` into
    rows ``rows`` of ``state [n_rows, layers, H, W]`` (zeros where nothing was scored)."""
    _impl("carry_scores", state.device, backend)(state, rows, carry, keep)
