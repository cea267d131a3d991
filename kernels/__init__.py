"""Tensor-only kernels for KV eviction (installed as ``vase_sglang.kernels``).

Each op has a Triton kernel (``value_stat``, ``window_attention``, ``cur``, ``select``,
``compact``) and a torch reference (``reference``); ``ops`` dispatches between them.
Nothing here knows about SGLang.
"""

from . import ops, reference

__all__ = ["ops", "reference"]
