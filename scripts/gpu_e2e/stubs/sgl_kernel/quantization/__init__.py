"""``sgl_kernel.quantization`` stand-in (imported by quantisation layers, never called for a bf16 model)."""

from .._stub import module_getattr

__getattr__ = module_getattr(__name__)
