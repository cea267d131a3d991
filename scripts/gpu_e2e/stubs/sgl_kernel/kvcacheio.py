"""``sgl_kernel.kvcacheio`` stand-in (HiCache transfer ops; imported, never called without HiCache)."""

from ._stub import module_getattr

__getattr__ = module_getattr(__name__)
