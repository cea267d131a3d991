"""A stand-in ``sgl_kernel`` for serving SGLang 0.5.23 on a GPU without the real wheel.

The real ``sglang-kernel`` is hundreds of MB and built for torch 2.14; the device tool's H200 has
torch 2.11 and no network. On the dense Llama/Qwen3 path with the triton attention
backend, pytorch sampling and ``SGLANG_FORCE_FUSED_OP_BACKEND=torch``, SGLang imports
names from here but never calls them. Every unknown name is a callable that raises
naming the op (``_stub.py``); ``scalar_type`` and ``allreduce`` are deliberately absent,
so SGLang's ``try/except ImportError`` fallbacks for them engage.
"""

from ._stub import module_getattr

__version__ = "0.0.0+vase-gpu-e2e-stub"
VASE_STAND_IN = True

__getattr__ = module_getattr(__name__, frozenset({"scalar_type", "allreduce"}))
