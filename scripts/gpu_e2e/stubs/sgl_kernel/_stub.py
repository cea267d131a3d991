"""What every module of the stand-in ``sgl_kernel`` answers for a name it does not define.

A PEP 562 module ``__getattr__``: a callable that raises ``NotImplementedError`` naming the
op, so ``from sgl_kernel import x`` succeeds at import time and only a call fails, loudly.
Dunders (``__path__``, ``__file__``, ...) and the names a module declares absent raise
``AttributeError``, so ``hasattr`` probes and ``try: from sgl_kernel import x except
ImportError`` fallbacks in SGLang take their non-sgl_kernel branch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def unavailable(qualname: str) -> Callable[..., Any]:
    def op(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"{qualname} was called, but this sgl_kernel is vase-sglang's stand-in for the GPU end-to-end kit "
            "(scripts/gpu_e2e): run with --attention-backend triton --sampling-backend pytorch and "
            "SGLANG_FORCE_FUSED_OP_BACKEND=torch, or install the real sglang-kernel"
        )

    op.__name__ = op.__qualname__ = qualname.rsplit(".", 1)[-1]
    return op


def module_getattr(module_name: str, absent: frozenset[str] = frozenset()) -> Callable[[str], Any]:
    def __getattr__(name: str) -> Any:
        if name.startswith("__") or name in absent:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        return unavailable(f"{module_name}.{name}")

    return __getattr__
