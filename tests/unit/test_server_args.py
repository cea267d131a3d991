"""Server-argument decisions that only a GPU would show, tested without one: the attention
backend an evicting server runs with when the user names none (on Hopper SGLang's own
default is fa3, which the eviction path does not hook), and the refusal of an explicit
unsupported backend."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from support import fakes

from vase_sglang.config import PolicyConfig
from vase_sglang.patches import server_args as sa

VASE = PolicyConfig(policy="vase", budget=128, recent=32)


_args = fakes.server_args


@pytest.mark.parametrize(("device", "cuda", "flashinfer", "expect"), [
    ("cuda", True, True, "flashinfer"),
    ("cuda", True, False, "triton"),
    (None, True, True, "flashinfer"),
    (None, False, False, "torch_native"),
    ("cpu", False, True, "torch_native"),
    ("npu", False, False, None),
])
def test_default_backend(device, cuda, flashinfer, expect) -> None:
    assert sa.default_attention_backend(device, cuda, flashinfer) == expect


def _simulate_hopper(monkeypatch: pytest.MonkeyPatch, flashinfer: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (object() if flashinfer else None) if name == "flashinfer" else real(name, *a))


@pytest.mark.parametrize("flashinfer", [True, False])
def test_no_backend_on_a_gpu_gets_a_supported_one(monkeypatch: pytest.MonkeyPatch, flashinfer: bool) -> None:
    """An unset backend is set to a supported one; left unset, SGLang resolves fa3 on Hopper and
    the check below exits."""
    _simulate_hopper(monkeypatch, flashinfer)
    args = _args()
    sa._adjust_for_policy(args, VASE)
    assert args.attention_backend == ("flashinfer" if flashinfer else "triton")
    assert sa.unsupported_reasons(args) == []
    # What SGLang would have picked on Hopper is refused, naming the alternatives.
    (reason,) = sa.unsupported_reasons(_args(attention_backend="fa3"))
    assert reason == "--attention-backend fa3 (supported: torch_native, triton, flashinfer)"


def test_a_named_backend_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    _simulate_hopper(monkeypatch, True)
    for given in ({"attention_backend": "triton"}, {"decode_attention_backend": "flashinfer"},
                  {"attention_backend": "fa3"}):
        args = _args(**given)
        sa._adjust_for_policy(args, VASE)
        assert {n: getattr(args, n) for n in given} == given
    stock = _args()
    sa._adjust_for_policy(stock, PolicyConfig(policy="none"))
    assert stock.attention_backend is None  # --kv-policy none: SGLang untouched


def test_frontend_runtime_kwargs_get_the_same_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from vase_sglang.patches.frontend import runtime_kwargs

    _simulate_hopper(monkeypatch, False)
    monkeypatch.delenv("VASE_SGLANG_CONFIG", raising=False)
    kwargs = runtime_kwargs({"model_path": "m", "kv_policy": "vase", "kv_budget": 128, "kv_recent": 32})
    assert kwargs["attention_backend"] == "triton" and kwargs["disable_overlap_schedule"] is True
    assert "kv_policy" not in kwargs
    assert runtime_kwargs({"model_path": "m", "kv_policy": "vase", "kv_budget": 128, "kv_recent": 32,
                           "attention_backend": "flashinfer"})["attention_backend"] == "flashinfer"


def test_prefill_graphs_are_off_and_an_explicit_one_is_refused() -> None:
    """On CUDA SGLang captures prefills in breakable graphs by default; the prefill query hook
    syncs with the host, so an evicting server runs prefills eagerly (decode graphs stay on)."""
    args = _args()
    sa._adjust_for_policy(args, VASE)
    assert args.disable_prefill_cuda_graph is True and sa.unsupported_reasons(args, environ={}) == []
    stock = _args()
    sa._adjust_for_policy(stock, PolicyConfig(policy="none"))
    assert stock.disable_prefill_cuda_graph is False
    for backend in ("breakable", "full"):
        explicit = _args(cuda_graph_backend_prefill=backend)
        sa._adjust_for_policy(explicit, VASE)
        assert explicit.disable_prefill_cuda_graph is False  # the user's choice is not overwritten...
        (reason,) = sa.unsupported_reasons(explicit, environ={})  # ...but refused, naming it
        assert reason.startswith(f"--cuda-graph-backend-prefill {backend} (the prefill query hook")
    assert sa.unsupported_reasons(_args(cuda_graph_backend_prefill="disabled"), environ={}) == []


def test_post_capture_kv_sizing_is_refused() -> None:
    for value, refused in (("1", True), ("true", True), ("0", False), ("", False)):
        reasons = sa.unsupported_reasons(_args(attention_backend="triton"), environ={sa.POST_CAPTURE_KV_SIZING: value})
        assert bool(reasons) is refused, (value, reasons)
